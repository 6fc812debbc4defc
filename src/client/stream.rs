//! The push subscription: one bidirectional `Subscribe` stream, with the
//! deliveries the server pushes on one side and settle requests (ack,
//! nack, extend, credit) matched to their results on the other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{ClientError, ErrorKind, Result, pb};
use crate::pb::messaging_service_client::MessagingServiceClient;
use crate::pb::subscribe_request::Kind as Out;
use crate::pb::subscribe_response::Kind as In;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<pb::StreamSettled>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends settle requests on a subscription; cheap to clone.
#[derive(Clone, Debug)]
pub struct Settler {
    out: Arc<Mutex<Option<mpsc::Sender<pb::SubscribeRequest>>>>,
    pending: Pending,
    next_id: Arc<AtomicU64>,
}

impl Settler {
    async fn send(&self, kind: Out) -> Result<()> {
        let tx = lock(&self.out).clone();
        let Some(tx) = tx else {
            return Err(ClientError::new(ErrorKind::Closed, "subscription closed"));
        };
        tx.send(pb::SubscribeRequest { kind: Some(kind) })
            .await
            .map_err(|_| ClientError::new(ErrorKind::Closed, "subscription closed"))
    }

    async fn request(&self, make: impl FnOnce(u64) -> Out) -> Result<Vec<pb::SettleResult>> {
        Ok(self.request_full(make).await?.results)
    }

    async fn request_full(&self, make: impl FnOnce(u64) -> Out) -> Result<pb::StreamSettled> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (done, rx) = oneshot::channel();
        lock(&self.pending).insert(id, done);
        if let Err(e) = self.send(make(id)).await {
            lock(&self.pending).remove(&id);
            return Err(e);
        }
        let settled = rx.await.map_err(|_| {
            ClientError::new(ErrorKind::Closed, "subscription closed before the answer")
        })?;
        if settled.code != 0 {
            let code = Code::from_i32(settled.code);
            return Err(ClientError::new(
                ErrorKind::Rpc(code),
                format!("{}: {}", super::code_name(code), settled.error),
            ));
        }
        Ok(settled)
    }

    /// Acknowledges deliveries; one result per token.
    pub async fn ack(&self, tokens: Vec<String>) -> Result<Vec<pb::SettleResult>> {
        self.request(|request_id| {
            Out::Ack(pb::StreamAck {
                request_id,
                ack_tokens: tokens,
            })
        })
        .await
    }

    /// Rejects deliveries; one result per item.
    pub async fn nack(&self, items: Vec<pb::NackItem>) -> Result<Vec<pb::SettleResult>> {
        self.request(|request_id| Out::Nack(pb::StreamNack { request_id, items }))
            .await
    }

    /// [`Settler::nack`] that also returns the FIFO deliveries the nacks
    /// released: later messages of a failed message's group that were
    /// leased with it, which must not be acked (SPEC §3).
    pub async fn nack_releasing(
        &self,
        items: Vec<pb::NackItem>,
    ) -> Result<(Vec<pb::SettleResult>, Vec<pb::ReleasedDelivery>)> {
        let s = self
            .request_full(|request_id| Out::Nack(pb::StreamNack { request_id, items }))
            .await?;
        Ok((s.results, s.released))
    }

    /// Extends leases; one result (with the new deadline) per item.
    pub async fn extend(&self, items: Vec<pb::ExtendItem>) -> Result<Vec<pb::SettleResult>> {
        self.request(|request_id| Out::Extend(pb::StreamExtend { request_id, items }))
            .await
    }

    /// Sets the credit: the most unsettled deliveries held; 0 pauses.
    pub async fn set_credit(&self, credit: u32) -> Result<()> {
        self.send(Out::Credit(credit)).await
    }
}

/// An open push subscription; see [`super::Client::subscribe`].
#[derive(Debug)]
pub struct Subscription {
    deliveries: mpsc::UnboundedReceiver<Result<pb::Delivery>>,
    settler: Settler,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Ends the outbound stream and drops the inbound one: the server
        // sees the stream end and returns what is unsettled.
        lock(&self.settler.out).take();
        if let Some(r) = self.reader.take() {
            r.abort();
        }
    }
}

impl Subscription {
    pub(super) async fn open(
        mut client: MessagingServiceClient<super::Transport>,
        queue: &str,
        credit: u32,
        ack_timeout: Option<Duration>,
    ) -> Result<Subscription> {
        let (tx, rx) = mpsc::channel(64);
        let open = pb::SubscribeOpen {
            queue: queue.into(),
            credit,
            ack_timeout_ms: ack_timeout.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            max_per_group: 0,
        };
        tx.send(pb::SubscribeRequest {
            kind: Some(Out::Open(open)),
        })
        .await
        .map_err(|_| ClientError::new(ErrorKind::Closed, "subscription closed"))?;
        let mut inbound = client
            .subscribe(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let pending: Pending = Arc::default();
        // Unbounded: the server pushes no more deliveries than the credit
        // lets be unsettled, so the credit bounds this buffer. A bounded one
        // smaller than the credit would stall the reader behind deliveries
        // nobody takes while a settle result it has yet to read is awaited.
        let (dtx, drx) = mpsc::unbounded_channel();
        let p = Arc::clone(&pending);
        let reader = tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(resp)) => match resp.kind {
                        Some(In::Deliveries(batch)) => {
                            for d in batch.deliveries {
                                if dtx.send(Ok(d)).is_err() {
                                    return;
                                }
                            }
                        }
                        Some(In::Settled(s)) => {
                            if let Some(done) = lock(&p).remove(&s.request_id) {
                                let _ = done.send(s);
                            }
                        }
                        None => {}
                    },
                    Ok(None) => break,
                    Err(status) => {
                        let _ = dtx.send(Err(status.into()));
                        break;
                    }
                }
            }
            // Unanswered settle requests fail with Closed.
            lock(&p).clear();
        });
        Ok(Subscription {
            deliveries: drx,
            settler: Settler {
                out: Arc::new(Mutex::new(Some(tx))),
                pending,
                next_id: Arc::new(AtomicU64::new(1)),
            },
            reader: Some(reader),
        })
    }

    /// The next delivery; `None` once the stream ended.
    pub async fn next(&mut self) -> Option<Result<pb::Delivery>> {
        self.deliveries.recv().await
    }

    /// A handle to settle this subscription's deliveries.
    pub fn settler(&self) -> Settler {
        self.settler.clone()
    }

    /// Ends the stream: the server returns the deliveries still unsettled
    /// to the queue (each counting as an attempt).
    pub async fn close(mut self) {
        lock(&self.settler.out).take();
        if let Some(r) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
    }
}
