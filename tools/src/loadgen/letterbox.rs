//! loadgen target Letterbox, over its gRPC API (`letterbox.v1`).
//!
//! Two ways to the server. The project's client library
//! ([`letterbox::client::Client`], retries off: a failed call is reported,
//! as on a raw stub) does the queue set-up, stats and redrive, the batched
//! `Publish` calls and the `Receive` consumer's calls: per call it adds
//! only a timer for its request timeout (with one attempt allowed, the
//! request is sent as given, not copied), and those rows measure the same
//! through it as through raw stubs
//! (docs/benchmarks/2026-12-07/loadgen-client-ab). Raw tonic stubs stay
//! where the row measures the wire shape itself: one unary `Publish` per
//! message (a row put beside tonic-floor, i.e. the cost of a bare tonic
//! call, which a client layer would blur), and the streams (`PublishStream`
//! publishers, the `Subscribe` consumer): the client library has no
//! `PublishStream`, and its `Subscription` would change the subscribe
//! rows (deliveries handed over by a reader task of its own; a lock and a
//! sender clone per settle).
//!
//! Durability acknowledgement = the `Publish` response: the server answers
//! only once the batch is fdatasynced (group commit across concurrent
//! calls). Each publisher, each consumer and the admin side use their own
//! connection (a `Client` or a tonic `Channel`), i.e. one HTTP/2
//! connection each; concurrent calls are multiplexed on it.
//!
//! - Publishing: one message per request on a `PublishStream`, answered in
//!   order once durable, as AMQP publisher confirms work (the default);
//!   with `LOADGEN_LETTERBOX_PUBLISH=unary`, one unary `Publish` with one
//!   message per `publish()` call, spawned so that the workload's window
//!   keeps that many calls in flight. With `--batch N` (publish-durable only) a
//!   background task sends whatever is queued, up to N messages per
//!   `Publish`, with up to `window / N` (at least 1) calls in flight.
//! - Consuming: a background task long-polls `Receive` (wait 1 s) and feeds a
//!   channel. At most `prefetch` deliveries are unsettled at a time, like
//!   AMQP `basic.qos`; a new `Receive` is sent once half of them are settled
//!   (prefetch 1: one `Receive` per message, after the previous message was
//!   settled).
//! - Acks: `sync` = one unary `Ack` per delivery, awaited; `async` = the
//!   tokens settled since the last `Receive` ride on the next one
//!   (`ack_tokens`, up to 1000; such a `Receive` does not wait for
//!   messages, and its `ack_results` are checked), and those left when the
//!   consumer closes go in one `Ack` call. Nacks: `sync` = one unary `Nack`
//!   each, awaited, without delay; `async` = a background task nacks
//!   everything queued (up to 1000 per call), one call at a time.
//! - Subscribing (`--consumer subscribe`): one `Subscribe` stream opened
//!   with credit = prefetch; the server pushes deliveries while fewer than
//!   that are unsettled. Acks and nacks go on the same stream: `sync` = one
//!   `StreamAck` per delivery, its result awaited; `async` = everything
//!   queued (up to 1000 tokens) per `StreamAck`, one request at a time,
//!   each result checked.
//! - Dead letters: the main queue has a dead letter policy to `<name>.dlq`
//!   with `max_deliveries` = the delivery limit; the watch counts the DLQ's
//!   messages. `Settle::dead_letter` is a nack with `dead_letter` set;
//!   `redrive` runs the admin `Redrive` stream (no rate limit) back to the
//!   source queue.
//! - FIFO (`QueueSpec::fifo`): both queues are FIFO; each message names its
//!   group. Ordered batched publishing uses one `PublishStream` (requests
//!   are stored in the order they are sent), up to `batch` messages per
//!   request.
//! - Message sizes: a batched request carries at most [`MAX_CALL_BYTES`]
//!   of bodies (the server takes up to max-message-size + 4 MiB per
//!   request), so 1 MiB messages work with any `--batch`.
//! - Log counters: with a metrics URL, `log_counters` reads
//!   `letterbox_log_{syncs,written_bytes,records}_total` from the server's
//!   Prometheus endpoint.

// Request literals end in `..Default::default()` even where every field is
// set today: `letterbox.v1` grows by adding fields, and loadgen must keep
// compiling when it does.
#![allow(clippy::needless_update)]

use super::scrape::MetricsUrl;
use super::target::{
    AckFuture, AckMode, Caps, Consumer, ConsumerMode, ConsumerSpec, DeadLetterWatch, Delivery,
    LogCounters, Publisher, PublisherSpec, QueueSpec, RedriveOutcome, Settle, Target,
};
use anyhow::{Context as _, Result, anyhow, bail};
use async_trait::async_trait;
use bytes::Bytes;
use letterbox::client::{Client, ClientConfig, ErrorKind};
use letterbox::pb::messaging_service_client::MessagingServiceClient;
use letterbox::pb::subscribe_request::Kind as SubOut;
use letterbox::pb::subscribe_response::Kind as SubIn;
use letterbox::pb::{
    DeadLetterPolicy, NackItem, PublishMessage, PublishRequest, PublishStreamRequest, QueueConfig,
    QueueKind, ReceiveRequest, RedriveRequest, SettleResult, SettleStatus, StreamAck, StreamNack,
    StreamSettled, SubscribeOpen, SubscribeRequest,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message the clients accept.
const MAX_DECODING: usize = 64 << 20;
/// Most messages, tokens or items in one request (the API's limit).
const MAX_PER_CALL: usize = 1000;
/// Lease length of the main queue's deliveries.
const ACK_TIMEOUT_MS: u64 = 60_000;
/// Long-poll wait of each `Receive`.
const RECEIVE_WAIT_MS: u64 = 1000;
/// Most body bytes loadgen puts in one batched request.
pub const MAX_CALL_BYTES: usize = 4 << 20;

type Messaging = MessagingServiceClient<Channel>;

/// Opens one HTTP/2 connection to the server.
async fn channel(url: &str) -> Result<Channel> {
    Endpoint::from_shared(url.to_string())
        .with_context(|| format!("bad Letterbox URL {url:?}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to Letterbox at {url}"))
}

async fn messaging(url: &str) -> Result<Messaging> {
    Ok(MessagingServiceClient::new(channel(url).await?).max_decoding_message_size(MAX_DECODING))
}

/// Opens a [`Client`] on a connection of its own, with retries off:
/// loadgen reports a failed call, as it does on a raw stub, rather than
/// riding it out (and a call that cannot be retried sends its request
/// without a copy).
async fn client(url: &str) -> Result<Client> {
    let mut config = ClientConfig::new(url);
    config.retry.max_attempts = 1;
    Client::with_config(config)
        .await
        .with_context(|| format!("connecting to Letterbox at {url}"))
}

fn dlq(q: &QueueSpec) -> String {
    format!("{}.dlq", q.name)
}

/// Fails unless every settle result is OK.
fn check_settled(what: &str, expected: usize, results: &[SettleResult]) -> Result<()> {
    if results.len() != expected {
        bail!("{what}: {} results for {expected} tokens", results.len());
    }
    let failed: Vec<&SettleResult> = results
        .iter()
        .filter(|r| r.status() != SettleStatus::Ok)
        .collect();
    if let Some(first) = failed.first() {
        bail!(
            "{what}: {} of {expected} not settled, e.g. {:?}: {}",
            failed.len(),
            first.status(),
            first.error
        );
    }
    Ok(())
}

pub struct LetterboxTarget {
    url: String,
    admin: Client,
    metrics: Option<MetricsUrl>,
}

impl LetterboxTarget {
    /// Connects the admin client (and so checks that the server answers);
    /// with `metrics_url`, also reads the metrics endpoint once.
    pub async fn connect(url: &str, metrics_url: Option<&str>) -> Result<Self> {
        let admin = client(url).await?;
        let metrics = metrics_url.map(MetricsUrl::parse).transpose()?;
        if let Some(m) = &metrics {
            m.log_counters().await?;
        }
        Ok(LetterboxTarget {
            url: url.to_string(),
            admin,
            metrics,
        })
    }

    async fn delete_if_exists(&self, name: &str) -> Result<()> {
        match self.admin.delete_queue(name, true).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Rpc(Code::NotFound) => Ok(()),
            Err(e) => Err(anyhow!("DeleteQueue {name}: {e}")),
        }
    }

    async fn create(&self, name: String, config: QueueConfig) -> Result<()> {
        self.admin
            .create_queue(&name, config)
            .await
            .map_err(|e| anyhow!("CreateQueue {name}: {e}"))?;
        Ok(())
    }

    async fn total(admin: &Client, name: &str) -> Result<u64> {
        let stats = admin
            .stats(name)
            .await
            .map_err(|e| anyhow!("GetQueueStats {name}: {e}"))?;
        Ok(stats.total)
    }
}

#[async_trait]
impl Target for LetterboxTarget {
    fn name(&self) -> &str {
        "letterbox"
    }

    fn caps(&self) -> Caps {
        Caps {
            sync_ack: true,
            delivery_limit: true,
            publish_batch: true,
            subscribe: true,
            get: false,
            fifo: true,
            redrive: true,
        }
    }

    fn describe(&self) -> String {
        "letterbox, fdatasync before every acknowledgement (group commit)".into()
    }

    async fn reset(&self, q: &QueueSpec) -> Result<()> {
        // The main queue first: it may name the DLQ as its dead letter queue.
        self.delete_if_exists(&q.name).await?;
        self.delete_if_exists(&dlq(q)).await?;
        let kind = if q.fifo {
            QueueKind::Fifo
        } else {
            QueueKind::Standard
        } as i32;
        self.create(
            dlq(q),
            QueueConfig {
                kind,
                ..Default::default()
            },
        )
        .await?;
        self.create(
            q.name.clone(),
            QueueConfig {
                kind,
                ack_timeout_ms: Some(ACK_TIMEOUT_MS),
                dead_letter: q.delivery_limit.map(|limit| DeadLetterPolicy {
                    queue: dlq(q),
                    max_deliveries: limit,
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
    }

    async fn publisher(&self, q: &QueueSpec, p: &PublisherSpec) -> Result<Box<dyn Publisher>> {
        publisher(&self.url, q, p).await
    }

    async fn consumer(&self, q: &QueueSpec, c: &ConsumerSpec) -> Result<Box<dyn Consumer>> {
        match c.mode {
            ConsumerMode::Receive => Ok(Box::new(LetterboxConsumer::start(
                client(&self.url).await?,
                q.name.clone(),
                c,
            ))),
            ConsumerMode::Subscribe => Ok(Box::new(
                SubscribeConsumer::open(messaging(&self.url).await?, q.name.clone(), c).await?,
            )),
            ConsumerMode::Get => bail!("letterbox: --consumer get is RabbitMQ's basic.get"),
        }
    }

    async fn dead_letter_watch(&self, q: &QueueSpec) -> Result<Box<dyn DeadLetterWatch>> {
        let name = dlq(q);
        let base = Self::total(&self.admin, &name).await?;
        Ok(Box::new(DlqWatch {
            admin: self.admin.clone(),
            dlq: name,
            base,
        }))
    }

    async fn depth(&self, q: &QueueSpec) -> Result<Option<u64>> {
        Ok(Some(Self::total(&self.admin, &q.name).await?))
    }

    async fn cleanup(&self, q: &QueueSpec) -> Result<()> {
        self.delete_if_exists(&q.name).await?;
        self.delete_if_exists(&dlq(q)).await
    }

    async fn redrive(&self, q: &QueueSpec) -> Result<RedriveOutcome> {
        let name = dlq(q);
        let mut stream = self
            .admin
            .redrive(RedriveRequest {
                queue: name.clone(),
                rate_per_second: 0,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("Redrive {name}: {e}"))?;
        let mut out = RedriveOutcome::default();
        loop {
            match stream.message().await {
                Ok(Some(p)) => {
                    out = RedriveOutcome {
                        moved: p.moved,
                        skipped: p.skipped,
                        scanned: p.scanned,
                    };
                    if p.done {
                        return Ok(out);
                    }
                }
                Ok(None) => bail!("Redrive {name}: the stream ended before `done` ({out:?})"),
                Err(s) => bail!("Redrive {name}: {s}"),
            }
        }
    }

    async fn log_counters(&self) -> Result<Option<LogCounters>> {
        match &self.metrics {
            Some(m) => Ok(Some(m.log_counters().await?)),
            None => Ok(None),
        }
    }
}

/// The floor: `tonic-floor`, a bare tonic server of the same API with
/// empty handlers, driven by the same publishers as [`LetterboxTarget`]
/// (so every Letterbox row can be put as a share of what tonic itself
/// allows). It stores nothing: no queues to make, no depth, no consumers.
pub struct FloorTarget {
    url: String,
}

impl FloorTarget {
    /// Checks that the server answers (one connection, closed again).
    pub async fn connect(url: &str) -> Result<Self> {
        channel(url).await?;
        Ok(FloorTarget {
            url: url.to_string(),
        })
    }
}

#[async_trait]
impl Target for FloorTarget {
    fn name(&self) -> &str {
        "tonic-floor"
    }

    fn caps(&self) -> Caps {
        Caps {
            publish_batch: true,
            ..Caps::default()
        }
    }

    fn describe(&self) -> String {
        "tonic-floor: bare tonic server, empty handlers, nothing stored".into()
    }

    async fn reset(&self, _: &QueueSpec) -> Result<()> {
        Ok(())
    }

    async fn publisher(&self, q: &QueueSpec, p: &PublisherSpec) -> Result<Box<dyn Publisher>> {
        publisher(&self.url, q, p).await
    }

    async fn consumer(&self, _: &QueueSpec, _: &ConsumerSpec) -> Result<Box<dyn Consumer>> {
        bail!("tonic-floor: publish workloads only")
    }

    async fn dead_letter_watch(&self, _: &QueueSpec) -> Result<Box<dyn DeadLetterWatch>> {
        bail!("tonic-floor: publish workloads only")
    }

    async fn depth(&self, _: &QueueSpec) -> Result<Option<u64>> {
        Ok(None)
    }

    async fn cleanup(&self, _: &QueueSpec) -> Result<()> {
        Ok(())
    }
}

/// The publisher of a run (`--batch`, `LOADGEN_LETTERBOX_PUBLISH`), on
/// connections of its own.
async fn publisher(url: &str, q: &QueueSpec, p: &PublisherSpec) -> Result<Box<dyn Publisher>> {
    if p.batch > 1 && p.ordered {
        let batch = (p.batch as usize).min(MAX_PER_CALL);
        Ok(Box::new(
            OrderedBatchPublisher::open(messaging(url).await?, q.name.clone(), batch).await?,
        ))
    } else if p.batch > 1 {
        let batch = (p.batch as usize).min(MAX_PER_CALL);
        let in_flight = (p.window as usize / batch).max(1);
        Ok(Box::new(BatchPublisher::start(
            client(url).await?,
            q.name.clone(),
            batch,
            in_flight,
        )))
    } else if std::env::var("LOADGEN_LETTERBOX_PUBLISH").as_deref() == Ok("unary") {
        let mut clients = vec![messaging(url).await?];
        for _ in 1..connections()? {
            clients.push(messaging(url).await?);
        }
        Ok(Box::new(SinglePublisher {
            clients,
            next: 0,
            queue: q.name.clone(),
        }))
    } else {
        Ok(Box::new(
            StreamPublisher::open(messaging(url).await?, q.name.clone()).await?,
        ))
    }
}

/// `LOADGEN_LETTERBOX_CONNECTIONS`: HTTP/2 connections the unary
/// publisher spreads its calls over, round robin (default 1).
fn connections() -> Result<usize> {
    match std::env::var("LOADGEN_LETTERBOX_CONNECTIONS") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => bail!("LOADGEN_LETTERBOX_CONNECTIONS={v:?}: a count from 1 to 256"),
        },
        Err(_) => Ok(1),
    }
}

fn message(body: Bytes) -> PublishMessage {
    PublishMessage {
        body,
        ..Default::default()
    }
}

fn grouped(body: Bytes, group_id: String) -> PublishMessage {
    PublishMessage {
        body,
        group_id,
        ..Default::default()
    }
}

/// Checks a `Publish` answer for `n` messages.
async fn publish_call(
    client: &mut Messaging,
    queue: String,
    messages: Vec<PublishMessage>,
) -> Result<()> {
    let n = messages.len();
    let r = client
        .publish(PublishRequest {
            queue,
            messages,
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow!("Publish ({n} messages): {s}"))?;
    let got = r.get_ref().results.len();
    if got != n {
        bail!("Publish: {got} results for {n} messages");
    }
    Ok(())
}

/// One `Publish` through the client library, checked as [`publish_call`]
/// checks a raw one.
async fn publish_batch(client: &Client, queue: &str, messages: Vec<PublishMessage>) -> Result<()> {
    let n = messages.len();
    let results = client
        .publish(queue, messages)
        .await
        .map_err(|e| anyhow!("Publish ({n} messages): {e}"))?;
    if results.len() != n {
        bail!("Publish: {} results for {n} messages", results.len());
    }
    Ok(())
}

/// One unary `Publish` with one message per `publish()`.
struct SinglePublisher {
    /// One client per connection, used in turn.
    clients: Vec<Messaging>,
    next: usize,
    queue: String,
}

#[async_trait]
impl Publisher for SinglePublisher {
    async fn publish(&mut self, payload: Bytes) -> Result<AckFuture> {
        let mut client = self.clients[self.next % self.clients.len()].clone();
        self.next = self.next.wrapping_add(1);
        let queue = self.queue.clone();
        // Spawned, so the call goes out now, whatever order the workload
        // awaits the acks in.
        let call =
            tokio::spawn(
                async move { publish_call(&mut client, queue, vec![message(payload)]).await },
            );
        Ok(Box::pin(async move { call.await? }))
    }

    async fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// One message per request on a `PublishStream`, answered in order once
/// durable: the publisher-confirm model of AMQP (the default; set
/// `LOADGEN_LETTERBOX_PUBLISH=unary` for one unary `Publish` per message).
struct StreamPublisher {
    tx: Option<mpsc::Sender<PublishStreamRequest>>,
    waiting: Arc<std::sync::Mutex<std::collections::VecDeque<oneshot::Sender<Result<()>>>>>,
    next: u64,
    queue: String,
    reader: JoinHandle<()>,
}

impl StreamPublisher {
    async fn open(mut client: Messaging, queue: String) -> Result<Self> {
        let (tx, rx) = mpsc::channel(1024);
        let mut inbound = client
            .publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|s| anyhow!("PublishStream: {s}"))?
            .into_inner();
        let waiting: Arc<
            std::sync::Mutex<std::collections::VecDeque<oneshot::Sender<Result<()>>>>,
        > = Arc::default();
        let w = waiting.clone();
        let reader = tokio::spawn(async move {
            loop {
                let next = inbound.message().await;
                let done = w.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                match next {
                    Ok(Some(r)) => {
                        if let Some(done) = done {
                            let _ = done.send(if r.code == 0 {
                                Ok(())
                            } else {
                                Err(anyhow!(
                                    "Publish (stream {}): code {} {}",
                                    r.sequence,
                                    r.code,
                                    r.error
                                ))
                            });
                        }
                    }
                    Ok(None) => return,
                    Err(s) => {
                        if let Some(done) = done {
                            let _ = done.send(Err(anyhow!("PublishStream: {s}")));
                        }
                        return;
                    }
                }
            }
        });
        Ok(StreamPublisher {
            tx: Some(tx),
            waiting,
            next: 1,
            queue,
            reader,
        })
    }
}

#[async_trait]
impl Publisher for StreamPublisher {
    async fn publish(&mut self, payload: Bytes) -> Result<AckFuture> {
        self.send(message(payload)).await
    }

    async fn publish_grouped(&mut self, payload: Bytes, group: String) -> Result<AckFuture> {
        self.send(grouped(payload, group)).await
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        self.tx.take();
        let _ = (&mut self.reader).await;
        Ok(())
    }
}

impl StreamPublisher {
    async fn send(&mut self, msg: PublishMessage) -> Result<AckFuture> {
        let (done, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(done);
        let sequence = self.next;
        self.next += 1;
        let req = PublishStreamRequest {
            sequence,
            publish: Some(PublishRequest {
                queue: self.queue.clone(),
                messages: vec![msg],
                ..Default::default()
            }),
        };
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| anyhow!("publisher closed"))?;
        tx.send(req)
            .await
            .map_err(|_| anyhow!("PublishStream closed"))?;
        Ok(Box::pin(async move {
            rx.await.map_err(|_| anyhow!("PublishStream closed"))?
        }))
    }
}

type BatchAck = oneshot::Sender<Result<(), Arc<str>>>;

/// Batching publisher: a background task sends what is queued, up to
/// `batch` messages per `Publish`, with up to `in_flight` calls at a time.
struct BatchPublisher {
    tx: Option<mpsc::UnboundedSender<(Bytes, BatchAck)>>,
    task: JoinHandle<()>,
}

impl BatchPublisher {
    fn start(client: Client, queue: String, batch: usize, in_flight: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(Self::run(client, queue.into(), rx, batch, in_flight));
        BatchPublisher { tx: Some(tx), task }
    }

    async fn run(
        client: Client,
        queue: Arc<str>,
        mut rx: mpsc::UnboundedReceiver<(Bytes, BatchAck)>,
        batch: usize,
        in_flight: usize,
    ) {
        let slots = Arc::new(Semaphore::new(in_flight));
        let mut calls = JoinSet::new();
        loop {
            // Take a call slot first: while none is free, messages pile up
            // and the next call carries up to `batch` of them.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            let Some(first) = rx.recv().await else {
                break;
            };
            let mut bytes = first.0.len();
            let mut items = Vec::with_capacity(batch);
            items.push(first);
            while items.len() < batch && bytes < MAX_CALL_BYTES {
                match rx.try_recv() {
                    Ok(item) => {
                        bytes += item.0.len();
                        items.push(item);
                    }
                    Err(_) => break,
                }
            }
            let client = client.clone();
            let queue = queue.clone();
            calls.spawn(async move {
                let (messages, acks): (Vec<PublishMessage>, Vec<BatchAck>) =
                    items.into_iter().map(|(b, a)| (message(b), a)).unzip();
                let r = publish_batch(&client, &queue, messages)
                    .await
                    .map_err(|e| Arc::<str>::from(format!("{e:#}")));
                drop(slot);
                for ack in acks {
                    let _ = ack.send(r.clone());
                }
            });
            while calls.try_join_next().is_some() {}
        }
        while calls.join_next().await.is_some() {}
    }
}

/// Hands `item` to a batching publisher's task (`tx`, `None` once
/// closed); the future resolves with the result of the call that carried
/// it. `task` names the task in errors.
fn queue_for_batch<T>(
    tx: Option<&mpsc::UnboundedSender<(T, BatchAck)>>,
    item: T,
    task: &'static str,
) -> Result<AckFuture> {
    let (ack, acked) = oneshot::channel();
    tx.ok_or_else(|| anyhow!("publisher closed"))?
        .send((item, ack))
        .map_err(|_| anyhow!("{task} task stopped"))?;
    Ok(Box::pin(async move {
        acked
            .await
            .map_err(|_| anyhow!("{task} task stopped"))?
            .map_err(|e| anyhow!("{e}"))
    }))
}

#[async_trait]
impl Publisher for BatchPublisher {
    async fn publish(&mut self, payload: Bytes) -> Result<AckFuture> {
        queue_for_batch(self.tx.as_ref(), payload, "batch publisher")
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        self.tx = None; // the task sends what is queued, then ends
        (&mut self.task).await?;
        Ok(())
    }
}

enum AckCmd {
    Token(String),
    /// Nack this token (as AMQP's basic.nack: not waited for); `true`:
    /// dead-letter it now.
    Nack(String, bool),
    /// Answer once every token queued before it was acked.
    Flush(oneshot::Sender<Result<()>>),
}

fn nack_item(ack_token: String, dead_letter: bool) -> NackItem {
    NackItem {
        ack_token,
        dead_letter,
        ..Default::default()
    }
}

/// How a delivery is settled.
#[derive(Clone, Copy)]
enum Verdict {
    Ack,
    /// Nack; `true`: dead-letter it now.
    Nack(bool),
}

impl Verdict {
    /// Hands the settle of `token` to a consumer's ack task (async ack
    /// mode): not waited for.
    fn queue(self, acker: &mpsc::UnboundedSender<AckCmd>, token: String) -> Result<()> {
        let cmd = match self {
            Verdict::Ack => AckCmd::Token(token),
            Verdict::Nack(dead_letter) => AckCmd::Nack(token, dead_letter),
        };
        acker.send(cmd).map_err(|_| anyhow!("ack task stopped"))
    }
}

/// A delivery of either consumer, settled by [`Verdict`]; its [`Settle`]
/// follows.
#[async_trait]
trait SettleBy: Send {
    /// In async ack mode, hands the settle to the consumer's ack task;
    /// else settles with one call (or stream request), awaited.
    async fn settle(self: Box<Self>, verdict: Verdict) -> Result<()>;
}

#[async_trait]
impl<T: SettleBy> Settle for T {
    async fn ack(self: Box<Self>) -> Result<()> {
        self.settle(Verdict::Ack).await
    }

    async fn nack(self: Box<Self>) -> Result<()> {
        self.settle(Verdict::Nack(false)).await
    }

    async fn dead_letter(self: Box<Self>) -> Result<()> {
        self.settle(Verdict::Nack(true)).await
    }
}

/// Where [`settle_loop`] sends its batches: unary `Ack` / `Nack` calls
/// ([`Client`]), or `StreamAck` / `StreamNack` requests on a
/// subscription ([`SubCtx`]).
trait SettleBatch: Send {
    /// Acks `tokens`; fails unless each is settled.
    fn ack_batch(&mut self, tokens: Vec<String>) -> impl Future<Output = Result<()>> + Send;
    /// Nacks `items`; fails unless each is settled.
    fn nack_batch(&mut self, items: Vec<NackItem>) -> impl Future<Output = Result<()>> + Send;
}

impl SettleBatch for Client {
    async fn ack_batch(&mut self, tokens: Vec<String>) -> Result<()> {
        let n = tokens.len();
        match self.ack(tokens).await {
            Ok(results) => check_settled("Ack", n, &results),
            Err(e) => Err(anyhow!("Ack ({n} tokens): {e}")),
        }
    }

    async fn nack_batch(&mut self, items: Vec<NackItem>) -> Result<()> {
        let n = items.len();
        match self.nack(items).await {
            Ok(results) => check_settled("Nack", n, &results),
            Err(e) => Err(anyhow!("Nack ({n} tokens): {e}")),
        }
    }
}

/// Async settles: everything queued (up to 1000 tokens) per ack (and nack)
/// batch, one batch at a time: while one waits for its result, the next
/// tokens pile up and go together. Failures are reported at the next
/// flush.
async fn settle_loop(mut to: impl SettleBatch, mut rx: mpsc::UnboundedReceiver<AckCmd>) {
    let mut failure: Option<String> = None;
    while let Some(cmd) = rx.recv().await {
        let mut tokens = Vec::new();
        let mut nacks = Vec::new();
        let mut flush = None;
        match cmd {
            AckCmd::Token(t) => tokens.push(t),
            AckCmd::Nack(t, dl) => nacks.push(nack_item(t, dl)),
            AckCmd::Flush(f) => flush = Some(f),
        }
        while flush.is_none() && tokens.len() < MAX_PER_CALL && nacks.len() < MAX_PER_CALL {
            match rx.try_recv() {
                Ok(AckCmd::Token(t)) => tokens.push(t),
                Ok(AckCmd::Nack(t, dl)) => nacks.push(nack_item(t, dl)),
                Ok(AckCmd::Flush(f)) => flush = Some(f),
                Err(_) => break,
            }
        }
        if !tokens.is_empty()
            && let Err(e) = to.ack_batch(tokens).await
        {
            failure.get_or_insert_with(|| format!("{e:#}"));
        }
        if !nacks.is_empty()
            && let Err(e) = to.nack_batch(nacks).await
        {
            failure.get_or_insert_with(|| format!("{e:#}"));
        }
        if let Some(f) = flush {
            let _ = f.send(match &failure {
                Some(e) => Err(anyhow!("async settles failed: {e}")),
                None => Ok(()),
            });
        }
    }
}

/// The async ack task of a consumer, and its queue.
type Acker = (mpsc::UnboundedSender<AckCmd>, JoinHandle<()>);

/// Stops a consumer's ack task (if it has one) once everything queued
/// before is settled; fails if any of its settles failed.
async fn stop_acker(acker: Option<Acker>) -> Result<()> {
    let Some((tx, task)) = acker else {
        return Ok(());
    };
    let (done, flushed) = oneshot::channel();
    tx.send(AckCmd::Flush(done))
        .map_err(|_| anyhow!("ack task stopped"))?;
    let r = flushed.await.map_err(|_| anyhow!("ack task stopped"));
    task.abort();
    r?
}

/// Acks of a [`LetterboxConsumer`] in async ack mode, waiting to ride on
/// its next `Receive` (`ack_tokens`).
type Riding = Arc<std::sync::Mutex<Vec<String>>>;

struct LetterboxConsumer {
    rx: mpsc::Receiver<Result<Delivery>>,
    receiver: JoinHandle<()>,
    /// Tells the receive task to end (after the call in progress if acks
    /// ride on it).
    closing: watch::Sender<bool>,
    acker: Option<Acker>,
    riding: Option<(Riding, Client)>,
}

impl LetterboxConsumer {
    fn start(client: Client, queue: String, c: &ConsumerSpec) -> Self {
        let prefetch = c.prefetch.max(1) as usize;
        let acker = (c.ack == AckMode::Async).then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            (tx, tokio::spawn(settle_loop(client.clone(), rx)))
        });
        let riding: Option<Riding> = (c.ack == AckMode::Async).then(Riding::default);
        let (tx, rx) = mpsc::channel(prefetch);
        let ctx = SettleCtx {
            client: client.clone(),
            acker: acker.as_ref().map(|(tx, _)| tx.clone()),
            riding: riding.clone(),
        };
        let (closing, closed) = watch::channel(false);
        let receiver = tokio::spawn(Self::receive_loop(
            client.clone(),
            queue,
            prefetch,
            tx,
            ctx,
            closed,
        ));
        LetterboxConsumer {
            rx,
            receiver,
            closing,
            acker,
            riding: riding.map(|r| (r, client)),
        }
    }

    /// Receives while there is credit. In async ack mode the acks settled
    /// since the last call ride on the next one (one call and one
    /// `fdatasync` per turn instead of an `Ack` call beside each
    /// `Receive`); such a call does not wait for messages (`wait_ms` 0), so
    /// that acks are not held up by an empty queue, and is not cut short by
    /// [`Consumer::close`].
    async fn receive_loop(
        client: Client,
        queue: String,
        prefetch: usize,
        tx: mpsc::Sender<Result<Delivery>>,
        ctx: SettleCtx,
        mut closed: watch::Receiver<bool>,
    ) {
        // One credit per unsettled delivery.
        let credits = Arc::new(Semaphore::new(prefetch));
        let per_call = prefetch.min(MAX_PER_CALL);
        let refill = (prefetch / 2).clamp(1, per_call);
        loop {
            let Some(mut permits) = take_credits(&credits, refill, per_call, &mut closed).await
            else {
                return;
            };
            let acks = riding_acks(&ctx);
            let n_acks = acks.len();
            let req = ReceiveRequest {
                queue: queue.clone(),
                max_messages: permits.num_permits() as u32,
                wait_ms: if n_acks > 0 { 0 } else { RECEIVE_WAIT_MS },
                ack_tokens: acks,
                ..Default::default()
            };
            let deliveries = match receive(&client, req, n_acks, &mut closed).await {
                Some(Ok(deliveries)) => deliveries,
                Some(Err(e)) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                None => return,
            };
            if !hand_out(deliveries, &mut permits, &ctx, &tx).await {
                return;
            }
            // unused credits (fewer deliveries than asked) return here
        }
    }
}

/// Waits until `refill` credits are free, then takes as many more as are
/// free, up to `per_call` in all; `None` once the consumer closes.
async fn take_credits(
    credits: &Arc<Semaphore>,
    refill: usize,
    per_call: usize,
    closed: &mut watch::Receiver<bool>,
) -> Option<OwnedSemaphorePermit> {
    // Wait until half the window is free, then ask for all of it.
    let acquired = tokio::select! {
        p = credits.clone().acquire_many_owned(refill as u32) => p,
        _ = closed.changed() => return None,
    };
    let mut permits = acquired.ok()?;
    let more = credits.available_permits().min(per_call - refill);
    if more > 0
        && let Ok(p) = credits.clone().try_acquire_many_owned(more as u32)
    {
        permits.merge(p);
    }
    Some(permits)
}

/// The acks waiting to ride on the next `Receive` (async ack mode), at
/// most a call's worth.
fn riding_acks(ctx: &SettleCtx) -> Vec<String> {
    match &ctx.riding {
        Some(r) => {
            let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
            let n = r.len().min(MAX_PER_CALL);
            r.drain(..n).collect()
        }
        None => Vec::new(),
    }
}

/// One `Receive` carrying `n_acks` acks: its deliveries, once the acks
/// are checked. `None` when the consumer closes during a wait (a call
/// with acks is not cut short).
async fn receive(
    client: &Client,
    req: ReceiveRequest,
    n_acks: usize,
    closed: &mut watch::Receiver<bool>,
) -> Option<Result<Vec<letterbox::pb::Delivery>>> {
    let queue = req.queue.clone();
    let answer = if n_acks > 0 {
        client.receive_response(req).await
    } else {
        tokio::select! {
            r = client.receive_response(req) => r,
            _ = closed.changed() => return None,
        }
    };
    Some(match answer {
        Ok(r) => check_settled("Ack riding on Receive", n_acks, &r.ack_results).and_then(|()| {
            if r.receive_code == 0 {
                Ok(r.deliveries)
            } else {
                Err(anyhow!(
                    "Receive {queue} after its acks took effect: {}",
                    r.receive_error
                ))
            }
        }),
        Err(e) => Err(anyhow!("Receive {queue}: {e}")),
    })
}

/// Hands the deliveries to the consumer, each with one of `permits` as
/// its credit; false when the receive loop must end (more deliveries than
/// credits, or the consumer closed).
async fn hand_out(
    deliveries: Vec<letterbox::pb::Delivery>,
    permits: &mut OwnedSemaphorePermit,
    ctx: &SettleCtx,
    tx: &mpsc::Sender<Result<Delivery>>,
) -> bool {
    for d in deliveries {
        let Some(credit) = permits.split(1) else {
            let _ = tx
                .send(Err(anyhow!("Receive returned more than max_messages")))
                .await;
            return false;
        };
        let delivery = Delivery {
            payload: d.body,
            delivery_count: Some(u64::from(d.delivery_count)),
            settle: Box::new(LetterboxSettle {
                token: d.ack_token,
                ctx: ctx.clone(),
                _credit: credit,
            }),
        };
        if tx.send(Ok(delivery)).await.is_err() {
            return false; // consumer closed
        }
    }
    true
}

#[async_trait]
impl Consumer for LetterboxConsumer {
    async fn next(&mut self) -> Result<Delivery> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| anyhow!("Letterbox receive task ended"))?
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        let _ = self.closing.send(true);
        (&mut self.receiver).await?;
        if let Some((riding, mut client)) = self.riding.take() {
            let left: Vec<String> =
                std::mem::take(&mut *riding.lock().unwrap_or_else(|e| e.into_inner()));
            for chunk in left.chunks(MAX_PER_CALL) {
                client.ack_batch(chunk.to_vec()).await?;
            }
        }
        stop_acker(self.acker.take()).await
    }
}

#[derive(Clone)]
struct SettleCtx {
    client: Client,
    /// Set in async ack mode: nacks go here.
    acker: Option<mpsc::UnboundedSender<AckCmd>>,
    /// Set in async ack mode of the `Receive` consumer: acks go here.
    riding: Option<Riding>,
}

struct LetterboxSettle {
    token: String,
    ctx: SettleCtx,
    /// Returns the consumer's credit when the delivery is settled.
    _credit: OwnedSemaphorePermit,
}

#[async_trait]
impl SettleBy for LetterboxSettle {
    async fn settle(self: Box<Self>, verdict: Verdict) -> Result<()> {
        let LetterboxSettle {
            token,
            ctx,
            _credit: credit,
        } = *self;
        if let (Verdict::Ack, Some(riding)) = (verdict, &ctx.riding) {
            // Rides on the next Receive, which this credit lets go.
            riding.lock().unwrap_or_else(|e| e.into_inner()).push(token);
            drop(credit);
            return Ok(());
        }
        if let Some(acker) = &ctx.acker {
            return verdict.queue(acker, token);
        }
        let (what, r) = match verdict {
            Verdict::Ack => ("Ack", ctx.client.ack(vec![token]).await),
            Verdict::Nack(dead_letter) => (
                "Nack",
                ctx.client.nack(vec![nack_item(token, dead_letter)]).await,
            ),
        };
        let results = r.map_err(|e| anyhow!("{what}: {e}"))?;
        drop(credit);
        check_settled(what, 1, &results)
    }
}

struct DlqWatch {
    admin: Client,
    dlq: String,
    base: u64,
}

#[async_trait]
impl DeadLetterWatch for DlqWatch {
    async fn count(&mut self) -> Result<u64> {
        Ok(LetterboxTarget::total(&self.admin, &self.dlq)
            .await?
            .saturating_sub(self.base))
    }
}

/// Acks of an ordered batch request: one per message, in order.
type BatchAcks = Vec<BatchAck>;

/// Requests sent and not yet answered, and why the stream ended (if it did).
#[derive(Default)]
struct OrderedState {
    waiting: std::collections::VecDeque<BatchAcks>,
    ended: Option<Arc<str>>,
}

/// Ordered batching publisher (FIFO): one `PublishStream`; a task sends
/// what is queued, up to `batch` messages (and [`MAX_CALL_BYTES`]) per
/// request, in publish order; the server stores and answers requests in
/// the order they are sent.
struct OrderedBatchPublisher {
    tx: Option<mpsc::UnboundedSender<(PublishMessage, BatchAck)>>,
    task: JoinHandle<()>,
}

impl OrderedBatchPublisher {
    async fn open(mut client: Messaging, queue: String, batch: usize) -> Result<Self> {
        let (req_tx, req_rx) = mpsc::channel::<PublishStreamRequest>(64);
        let mut inbound = client
            .publish_stream(tokio_stream::wrappers::ReceiverStream::new(req_rx))
            .await
            .map_err(|s| anyhow!("PublishStream: {s}"))?
            .into_inner();
        let state: Arc<std::sync::Mutex<OrderedState>> = Arc::default();
        let st = state.clone();
        let reader = tokio::spawn(async move {
            let lock = || st.lock().unwrap_or_else(|e| e.into_inner());
            let why: Arc<str> = loop {
                match inbound.message().await {
                    Ok(Some(r)) => {
                        let Some(acks) = lock().waiting.pop_front() else {
                            break "PublishStream: an answer to no request".into();
                        };
                        let res = if r.code == 0 {
                            Ok(())
                        } else {
                            Err(Arc::<str>::from(format!(
                                "Publish (stream {}): code {} {}",
                                r.sequence, r.code, r.error
                            )))
                        };
                        for a in acks {
                            let _ = a.send(res.clone());
                        }
                    }
                    Ok(None) => break "PublishStream ended".into(),
                    Err(s) => break format!("PublishStream: {s}").into(),
                }
            };
            let mut g = lock();
            g.ended = Some(why.clone());
            for acks in g.waiting.drain(..) {
                for a in acks {
                    let _ = a.send(Err(why.clone()));
                }
            }
        });
        let (tx, mut rx) = mpsc::unbounded_channel::<(PublishMessage, BatchAck)>();
        let task = tokio::spawn(async move {
            let mut sequence = 0u64;
            while let Some(first) = rx.recv().await {
                let mut bytes = first.0.body.len();
                let mut items = vec![first];
                while items.len() < batch && bytes < MAX_CALL_BYTES {
                    match rx.try_recv() {
                        Ok(item) => {
                            bytes += item.0.body.len();
                            items.push(item);
                        }
                        Err(_) => break,
                    }
                }
                let (messages, acks): (Vec<PublishMessage>, BatchAcks) = items.into_iter().unzip();
                {
                    let mut g = state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(why) = &g.ended {
                        for a in acks {
                            let _ = a.send(Err(why.clone()));
                        }
                        continue;
                    }
                    g.waiting.push_back(acks);
                }
                sequence += 1;
                let req = PublishStreamRequest {
                    sequence,
                    publish: Some(PublishRequest {
                        queue: queue.clone(),
                        messages,
                        ..Default::default()
                    }),
                };
                if req_tx.send(req).await.is_err() {
                    break; // the reader ends the waiting acks
                }
            }
            drop(req_tx);
            let _ = reader.await;
        });
        Ok(OrderedBatchPublisher { tx: Some(tx), task })
    }

    fn send(&self, msg: PublishMessage) -> Result<AckFuture> {
        queue_for_batch(self.tx.as_ref(), msg, "ordered publisher")
    }
}

#[async_trait]
impl Publisher for OrderedBatchPublisher {
    async fn publish(&mut self, payload: Bytes) -> Result<AckFuture> {
        self.send(message(payload))
    }

    async fn publish_grouped(&mut self, payload: Bytes, group: String) -> Result<AckFuture> {
        self.send(grouped(payload, group))
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        self.tx = None; // the task sends what is queued, then ends
        (&mut self.task).await?;
        Ok(())
    }
}

type PendingSettles =
    Arc<std::sync::Mutex<std::collections::HashMap<u64, oneshot::Sender<StreamSettled>>>>;

/// The client side of one `Subscribe` stream, shared by its settles.
#[derive(Clone)]
struct SubCtx {
    out: mpsc::Sender<SubscribeRequest>,
    pending: PendingSettles,
    next_id: Arc<std::sync::atomic::AtomicU64>,
    /// Set in async ack mode.
    acker: Option<mpsc::UnboundedSender<AckCmd>>,
}

impl SubCtx {
    /// Sends a settle request; the receiver gets its result.
    async fn request(
        &self,
        make: impl FnOnce(u64) -> SubOut,
    ) -> Result<oneshot::Receiver<StreamSettled>> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (done, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, done);
        self.out
            .send(SubscribeRequest {
                kind: Some(make(id)),
            })
            .await
            .map_err(|_| anyhow!("Subscribe stream closed"))?;
        Ok(rx)
    }

    async fn ack(&self, tokens: Vec<String>) -> Result<oneshot::Receiver<StreamSettled>> {
        self.request(|request_id| {
            SubOut::Ack(StreamAck {
                request_id,
                ack_tokens: tokens,
            })
        })
        .await
    }

    async fn nack(&self, items: Vec<NackItem>) -> Result<oneshot::Receiver<StreamSettled>> {
        self.request(|request_id| SubOut::Nack(StreamNack { request_id, items }))
            .await
    }
}

/// Fails unless a stream settle request was accepted and each item settled.
async fn stream_settled(what: &str, n: usize, rx: oneshot::Receiver<StreamSettled>) -> Result<()> {
    let s = rx
        .await
        .map_err(|_| anyhow!("{what}: the stream closed before the result"))?;
    if s.code != 0 {
        bail!("{what} ({n} tokens): refused, code {}: {}", s.code, s.error);
    }
    check_settled(what, n, &s.results)
}

/// Async settles on a subscription (as the unary acker, one request at a
/// time: the session settles a stream's requests one after another, each
/// after its own commit, so many small requests would cost a commit each).
impl SettleBatch for SubCtx {
    async fn ack_batch(&mut self, tokens: Vec<String>) -> Result<()> {
        let n = tokens.len();
        stream_settled("StreamAck", n, self.ack(tokens).await?).await
    }

    async fn nack_batch(&mut self, items: Vec<NackItem>) -> Result<()> {
        let n = items.len();
        stream_settled("StreamNack", n, self.nack(items).await?).await
    }
}

/// A push consumer: one `Subscribe` stream with credit = prefetch.
struct SubscribeConsumer {
    rx: mpsc::Receiver<Result<Delivery>>,
    reader: JoinHandle<()>,
    acker: Option<Acker>,
}

impl SubscribeConsumer {
    async fn open(mut client: Messaging, queue: String, c: &ConsumerSpec) -> Result<Self> {
        let credit = c.prefetch.clamp(1, 10_000);
        let (out, out_rx) = mpsc::channel::<SubscribeRequest>(1024);
        out.send(SubscribeRequest {
            kind: Some(SubOut::Open(SubscribeOpen {
                queue: queue.clone(),
                credit,
                ..Default::default()
            })),
        })
        .await
        .map_err(|_| anyhow!("Subscribe: stream closed"))?;
        let mut inbound = client
            .subscribe(tokio_stream::wrappers::ReceiverStream::new(out_rx))
            .await
            .map_err(|s| anyhow!("Subscribe {queue}: {s}"))?
            .into_inner();
        let mut ctx = SubCtx {
            out,
            pending: Arc::default(),
            next_id: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            acker: None,
        };
        let acker = (c.ack == AckMode::Async).then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            (tx, tokio::spawn(settle_loop(ctx.clone(), rx)))
        });
        ctx.acker = acker.as_ref().map(|(tx, _)| tx.clone());
        // The server never has more than `credit` deliveries unsettled, and
        // every delivery in this channel is unsettled: it never fills, so
        // the reader always gets to the settle results.
        let (tx, rx) = mpsc::channel(credit as usize + 64);
        let reader = tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(resp)) => match resp.kind {
                        Some(SubIn::Deliveries(batch)) => {
                            for d in batch.deliveries {
                                let delivery = Delivery {
                                    payload: d.body,
                                    delivery_count: Some(u64::from(d.delivery_count)),
                                    settle: Box::new(SubscribeSettle {
                                        token: d.ack_token,
                                        ctx: ctx.clone(),
                                    }),
                                };
                                if tx.send(Ok(delivery)).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Some(SubIn::Settled(s)) => {
                            let done = ctx
                                .pending
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .remove(&s.request_id);
                            if let Some(done) = done {
                                let _ = done.send(s);
                            }
                        }
                        None => {}
                    },
                    Ok(None) => {
                        let _ = tx
                            .send(Err(anyhow!(
                                "Subscribe {queue}: the server ended the stream"
                            )))
                            .await;
                        return;
                    }
                    Err(s) => {
                        let _ = tx.send(Err(anyhow!("Subscribe {queue}: {s}"))).await;
                        return;
                    }
                }
            }
        });
        Ok(SubscribeConsumer { rx, reader, acker })
    }
}

#[async_trait]
impl Consumer for SubscribeConsumer {
    async fn next(&mut self) -> Result<Delivery> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| anyhow!("Letterbox subscription ended"))?
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        // The reader must run until the acker is done: it hands the acker
        // its settle results.
        let r = stop_acker(self.acker.take()).await;
        // Dropping the reader's and our senders ends the stream: the server
        // returns whatever is still unsettled.
        self.reader.abort();
        r
    }
}

struct SubscribeSettle {
    token: String,
    ctx: SubCtx,
}

#[async_trait]
impl SettleBy for SubscribeSettle {
    async fn settle(self: Box<Self>, verdict: Verdict) -> Result<()> {
        let SubscribeSettle { token, mut ctx } = *self;
        if let Some(acker) = &ctx.acker {
            return verdict.queue(acker, token);
        }
        match verdict {
            Verdict::Ack => ctx.ack_batch(vec![token]).await,
            Verdict::Nack(dead_letter) => ctx.nack_batch(vec![nack_item(token, dead_letter)]).await,
        }
    }
}
