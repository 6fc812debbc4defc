//! SQS targets: Letterbox's SQS endpoint (`letterbox-sqs`, `--sqs-url`)
//! and moto's server (`moto-sqs`, `--moto-url`), spoken to as current
//! SDKs speak: AWS JSON 1.0 over HTTP/1.1 keep-alive connections, each
//! request signed (SigV4, region `us-east-1`, the key `loadgen`, which
//! neither server checks without principals; moto routes requests to
//! its SQS by the signature's scope).
//!
//! - Publishing: one `SendMessage` per message, `--window` of them at a
//!   time; with `--batch N` one `SendMessageBatch` of up to 10 entries per
//!   call (SQS's limit), `window / batch` calls at a time.
//! - Consuming: `ReceiveMessage` long polls (1 s) of up to 10 messages
//!   each, as many polling loops as it takes to keep `--prefetch`
//!   messages unsettled; an ack is a `DeleteMessage` (`--ack sync`: waited
//!   for) or goes into a `DeleteMessageBatch` of up to 10 handles
//!   (`--ack async`); a nack makes the message visible again
//!   (`ChangeMessageVisibility` 0).
//! - Bodies: SQS bodies are text, so the payload's 16 binary bytes (send
//!   time and sequence number) travel as 32 hex digits, the rest as it is
//!   (ASCII): a 1 KiB payload is a 1,040-byte body.

use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use super::target::{
    AckFuture, AckMode, Caps, Consumer, ConsumerSpec, DeadLetterWatch, Delivery, Publisher,
    PublisherSpec, QueueSpec, Settle, Target,
};

/// The credentials requests are signed with.
const SIGNER: letterbox::sqs::Signer<'static> = letterbox::sqs::Signer {
    access_key: "loadgen",
    secret: "loadgen",
    region: "us-east-1",
};

/// SQS's most entries per batch and messages per receive.
const MAX_BATCH: usize = 10;
/// Long-poll wait of each `ReceiveMessage`, seconds.
const RECEIVE_WAIT_S: u64 = 1;
/// `DeleteMessageBatch` calls of one consumer in flight at a time.
const DELETES_IN_FLIGHT: usize = 8;

type Http = Client<HttpConnector, Full<Bytes>>;

/// One SQS endpoint.
#[derive(Clone)]
struct Endpoint {
    http: Http,
    /// `http://HOST:PORT`, no trailing slash.
    url: Arc<str>,
}

impl Endpoint {
    fn new(url: &str) -> Endpoint {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Endpoint {
            http: Client::builder(TokioExecutor::new()).build(connector),
            url: url.trim_end_matches('/').into(),
        }
    }

    /// One action; the output object, or an error naming SQS's.
    async fn call(&self, action: &str, input: Value) -> Result<Value> {
        let uri: hyper::Uri = format!("{}/", self.url).parse()?;
        let body = Bytes::from(input.to_string());
        let mut headers = hyper::HeaderMap::new();
        headers.insert(
            "host",
            uri.authority()
                .map(|a| a.as_str())
                .unwrap_or_default()
                .parse()?,
        );
        headers.insert("content-type", "application/x-amz-json-1.0".parse()?);
        headers.insert("x-amz-target", format!("AmazonSQS.{action}").parse()?);
        let now_ms = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )?;
        letterbox::sqs::sign(
            SIGNER,
            &hyper::Method::POST,
            &uri,
            &mut headers,
            &body,
            now_ms,
        );
        let mut req = Request::post(uri);
        for (k, v) in &headers {
            req = req.header(k, v);
        }
        let req = req.body(Full::new(body))?;
        let resp = self
            .http
            .request(req)
            .await
            .with_context(|| format!("{action} to {}", self.url))?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        let v: Value = if body.is_empty() {
            json!({})
        } else {
            serde_json::from_slice(&body)
                .with_context(|| format!("{action}: {}", String::from_utf8_lossy(&body)))?
        };
        if !status.is_success() {
            bail!(
                "{action}: {status} {} {}",
                v["__type"].as_str().unwrap_or_default(),
                v["message"]
                    .as_str()
                    .or_else(|| v["Message"].as_str())
                    .unwrap_or_default()
            );
        }
        Ok(v)
    }

    async fn queue_url(&self, name: &str) -> Result<String> {
        let v = self.call("GetQueueUrl", json!({"QueueName": name})).await?;
        v["QueueUrl"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("GetQueueUrl: no QueueUrl in {v}"))
    }
}

/// A payload as an SQS body (see the module's doc).
fn body_of(payload: &[u8]) -> String {
    let (head, rest) = payload.split_at(payload.len().min(16));
    let mut s: String = head.iter().map(|b| format!("{b:02x}")).collect();
    s.push_str(&String::from_utf8_lossy(rest));
    s
}

/// The payload of an SQS body made by [`body_of`].
fn payload_of(body: &str) -> Bytes {
    let head_len = body.len().min(32);
    let mut out: Vec<u8> = (0..head_len / 2)
        .filter_map(|i| u8::from_str_radix(body.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    out.extend_from_slice(body.get(head_len..).unwrap_or_default().as_bytes());
    Bytes::from(out)
}

/// Letterbox's SQS endpoint, or moto's server.
pub struct SqsTarget {
    name: &'static str,
    ep: Endpoint,
}

impl SqsTarget {
    /// The target `name` at `url` (no connection is opened yet).
    pub fn new(name: &'static str, url: &str) -> SqsTarget {
        SqsTarget {
            name,
            ep: Endpoint::new(url),
        }
    }
}

#[async_trait]
impl Target for SqsTarget {
    fn name(&self) -> &str {
        self.name
    }

    fn caps(&self) -> Caps {
        Caps {
            sync_ack: true,
            publish_batch: true,
            ..Caps::default()
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} at {}: AWS JSON 1.0 over HTTP/1.1; SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch)",
            self.name, self.ep.url
        )
    }

    async fn reset(&self, q: &QueueSpec) -> Result<()> {
        if q.fifo || q.delivery_limit.is_some() {
            bail!(
                "{}: standard queues without a dead letter queue only",
                self.name
            );
        }
        if let Ok(url) = self.ep.queue_url(&q.name).await {
            self.ep
                .call("DeleteQueue", json!({"QueueUrl": url}))
                .await?;
        }
        self.ep
            .call("CreateQueue", json!({"QueueName": q.name}))
            .await?;
        Ok(())
    }

    async fn publisher(&self, q: &QueueSpec, p: &PublisherSpec) -> Result<Box<dyn Publisher>> {
        let url = self.ep.queue_url(&q.name).await?;
        if p.batch > 1 {
            let batch = (p.batch as usize).min(MAX_BATCH);
            let in_flight = (p.window as usize / batch).max(1);
            Ok(Box::new(BatchPublisher::start(
                self.ep.clone(),
                url,
                batch,
                in_flight,
            )))
        } else {
            Ok(Box::new(SinglePublisher {
                ep: self.ep.clone(),
                url: url.into(),
            }))
        }
    }

    async fn consumer(&self, q: &QueueSpec, c: &ConsumerSpec) -> Result<Box<dyn Consumer>> {
        let url = self.ep.queue_url(&q.name).await?;
        Ok(Box::new(SqsConsumer::start(
            self.ep.clone(),
            url,
            c.prefetch,
            c.ack,
        )))
    }

    async fn dead_letter_watch(&self, _: &QueueSpec) -> Result<Box<dyn DeadLetterWatch>> {
        bail!("{}: no dead letter workloads", self.name)
    }

    async fn depth(&self, q: &QueueSpec) -> Result<Option<u64>> {
        let url = self.ep.queue_url(&q.name).await?;
        let v = self
            .ep
            .call(
                "GetQueueAttributes",
                json!({"QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages"]}),
            )
            .await?;
        Ok(v["Attributes"]["ApproximateNumberOfMessages"]
            .as_str()
            .and_then(|n| n.parse().ok()))
    }

    async fn cleanup(&self, q: &QueueSpec) -> Result<()> {
        if let Ok(url) = self.ep.queue_url(&q.name).await {
            self.ep
                .call("DeleteQueue", json!({"QueueUrl": url}))
                .await?;
        }
        Ok(())
    }
}

/// One `SendMessage` per message, each on a task of its own.
struct SinglePublisher {
    ep: Endpoint,
    url: Arc<str>,
}

#[async_trait]
impl Publisher for SinglePublisher {
    async fn publish(&mut self, payload: Bytes) -> Result<AckFuture> {
        let ep = self.ep.clone();
        let input = json!({"QueueUrl": &*self.url, "MessageBody": body_of(&payload)});
        let call = tokio::spawn(async move { ep.call("SendMessage", input).await.map(|_| ()) });
        Ok(Box::pin(async move { call.await? }))
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

type BatchAck = oneshot::Sender<Result<(), Arc<str>>>;

/// `SendMessageBatch` of up to `batch` entries, `in_flight` calls at a
/// time: a background task sends what is queued.
struct BatchPublisher {
    tx: Option<mpsc::UnboundedSender<(Bytes, BatchAck)>>,
    task: JoinHandle<()>,
}

impl BatchPublisher {
    fn start(ep: Endpoint, url: String, batch: usize, in_flight: usize) -> BatchPublisher {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Bytes, BatchAck)>();
        let url: Arc<str> = url.into();
        let task = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(in_flight));
            let mut calls = JoinSet::new();
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let Some(first) = rx.recv().await else {
                    break;
                };
                let mut items = vec![first];
                while items.len() < batch {
                    match rx.try_recv() {
                        Ok(item) => items.push(item),
                        Err(_) => break,
                    }
                }
                let ep = ep.clone();
                let url = url.clone();
                calls.spawn(async move {
                    let entries: Vec<Value> = items
                        .iter()
                        .enumerate()
                        .map(|(i, (p, _))| json!({"Id": i.to_string(), "MessageBody": body_of(p)}))
                        .collect();
                    let r = ep
                        .call(
                            "SendMessageBatch",
                            json!({"QueueUrl": &*url, "Entries": entries}),
                        )
                        .await
                        .and_then(|v| match v["Failed"].as_array() {
                            Some(f) if !f.is_empty() => bail!("SendMessageBatch failed: {f:?}"),
                            _ => Ok(()),
                        })
                        .map_err(|e| Arc::<str>::from(format!("{e:#}")));
                    drop(slot);
                    for (_, ack) in items {
                        let _ = ack.send(r.clone());
                    }
                });
                while calls.try_join_next().is_some() {}
            }
            while calls.join_next().await.is_some() {}
        });
        BatchPublisher { tx: Some(tx), task }
    }
}

#[async_trait]
impl Publisher for BatchPublisher {
    async fn publish(&mut self, payload: Bytes) -> Result<AckFuture> {
        let (ack, acked) = oneshot::channel();
        self.tx
            .as_ref()
            .ok_or_else(|| anyhow!("publisher closed"))?
            .send((payload, ack))
            .map_err(|_| anyhow!("batch publisher task stopped"))?;
        Ok(Box::pin(async move {
            acked
                .await
                .map_err(|_| anyhow!("batch publisher task stopped"))?
                .map_err(|e| anyhow!("{e}"))
        }))
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        self.tx = None;
        (&mut self.task).await?;
        Ok(())
    }
}

/// A receipt handle waiting for its `DeleteMessageBatch`, with the
/// unsettled slot it frees once deleted.
type Pending = (String, OwnedSemaphorePermit);

/// Polling loops feeding deliveries, and a deleter of handles.
struct SqsConsumer {
    rx: mpsc::UnboundedReceiver<Result<Delivery>>,
    loops: Vec<JoinHandle<()>>,
    deletes: Option<mpsc::UnboundedSender<Pending>>,
    deleter: JoinHandle<()>,
}

impl SqsConsumer {
    fn start(ep: Endpoint, url: String, prefetch: u32, ack: AckMode) -> SqsConsumer {
        let prefetch = prefetch.max(1) as usize;
        let unsettled = Arc::new(Semaphore::new(prefetch));
        let url: Arc<str> = url.into();
        let (tx, rx) = mpsc::unbounded_channel();
        let (deletes, pending) = mpsc::unbounded_channel::<Pending>();
        let deleter = tokio::spawn(delete_batches(ep.clone(), url.clone(), pending));
        let per_call = prefetch.min(MAX_BATCH);
        let loops = (0..prefetch.div_ceil(per_call))
            .map(|_| {
                tokio::spawn(poll(
                    ep.clone(),
                    url.clone(),
                    per_call,
                    unsettled.clone(),
                    tx.clone(),
                    (ack == AckMode::Async).then(|| deletes.clone()),
                ))
            })
            .collect();
        SqsConsumer {
            rx,
            loops,
            deletes: Some(deletes),
            deleter,
        }
    }
}

/// One polling loop: takes up to `per_call` unsettled slots, receives up
/// to that many messages, hands them out with their slots.
async fn poll(
    ep: Endpoint,
    url: Arc<str>,
    per_call: usize,
    unsettled: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Result<Delivery>>,
    deletes: Option<mpsc::UnboundedSender<Pending>>,
) {
    loop {
        let n = u32::try_from(per_call).unwrap_or(1);
        let Ok(mut slots) = unsettled.clone().acquire_many_owned(n).await else {
            return;
        };
        let got = ep
            .call(
                "ReceiveMessage",
                json!({"QueueUrl": &*url, "MaxNumberOfMessages": per_call, "WaitTimeSeconds": RECEIVE_WAIT_S}),
            )
            .await;
        let messages = match got {
            Ok(v) => v["Messages"].as_array().cloned().unwrap_or_default(),
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        for m in messages {
            let Some(slot) = slots.split(1) else { break };
            let handle = m["ReceiptHandle"].as_str().unwrap_or_default().to_string();
            let settle = SqsSettle {
                ep: ep.clone(),
                url: url.clone(),
                handle,
                slot,
                deletes: deletes.clone(),
            };
            let d = Delivery {
                payload: payload_of(m["Body"].as_str().unwrap_or_default()),
                delivery_count: None,
                settle: Box::new(settle),
            };
            if tx.send(Ok(d)).is_err() {
                return;
            }
        }
        // Slots not used go back (dropping `slots`).
    }
}

/// The deleter: receipt handles in `DeleteMessageBatch` calls of up to 10,
/// [`DELETES_IN_FLIGHT`] at a time.
async fn delete_batches(
    ep: Endpoint,
    url: Arc<str>,
    mut pending: mpsc::UnboundedReceiver<Pending>,
) {
    let slots = Arc::new(Semaphore::new(DELETES_IN_FLIGHT));
    let mut calls = JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let Some(first) = pending.recv().await else {
            break;
        };
        let mut items = vec![first];
        while items.len() < MAX_BATCH {
            match pending.try_recv() {
                Ok(i) => items.push(i),
                Err(_) => break,
            }
        }
        let ep = ep.clone();
        let url = url.clone();
        calls.spawn(async move {
            let entries: Vec<Value> = items
                .iter()
                .enumerate()
                .map(|(i, (h, _))| json!({"Id": i.to_string(), "ReceiptHandle": h}))
                .collect();
            if let Err(e) = ep
                .call(
                    "DeleteMessageBatch",
                    json!({"QueueUrl": &*url, "Entries": entries}),
                )
                .await
            {
                eprintln!("loadgen: DeleteMessageBatch: {e:#}");
            }
            drop(slot);
            drop(items);
        });
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

struct SqsSettle {
    ep: Endpoint,
    url: Arc<str>,
    handle: String,
    slot: OwnedSemaphorePermit,
    /// `Some`: acks go to the deleter (async acks).
    deletes: Option<mpsc::UnboundedSender<Pending>>,
}

#[async_trait]
impl Settle for SqsSettle {
    async fn ack(self: Box<Self>) -> Result<()> {
        let SqsSettle {
            ep,
            url,
            handle,
            slot,
            deletes,
        } = *self;
        match deletes {
            Some(tx) => {
                tx.send((handle, slot))
                    .map_err(|_| anyhow!("the deleter stopped"))?;
                Ok(())
            }
            None => {
                ep.call(
                    "DeleteMessage",
                    json!({"QueueUrl": &*url, "ReceiptHandle": handle}),
                )
                .await?;
                drop(slot);
                Ok(())
            }
        }
    }

    async fn nack(self: Box<Self>) -> Result<()> {
        self.ep
            .call(
                "ChangeMessageVisibility",
                json!({"QueueUrl": &*self.url, "ReceiptHandle": self.handle, "VisibilityTimeout": 0}),
            )
            .await?;
        Ok(())
    }
}

#[async_trait]
impl Consumer for SqsConsumer {
    async fn next(&mut self) -> Result<Delivery> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| anyhow!("the polling loops stopped"))?
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        for l in &self.loops {
            l.abort();
        }
        // Deliveries handed out but not settled give their handles back.
        self.rx.close();
        while self.rx.recv().await.is_some() {}
        self.deletes = None;
        // The pollers' senders go with their tasks; the deleter ends once
        // every sender is gone and what is queued is deleted.
        for l in std::mem::take(&mut self.loops) {
            let _ = l.await;
        }
        (&mut self.deleter).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_travel_as_text_and_come_back() {
        let p = crate::loadgen::stats::make_payload(42, 1024);
        let body = body_of(&p);
        assert_eq!(body.len(), 1040);
        assert!(body.is_ascii());
        assert_eq!(payload_of(&body), p);
        assert_eq!(
            crate::loadgen::stats::payload_seq(&payload_of(&body)),
            Some(42)
        );
    }
}
