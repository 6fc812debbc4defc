//! Batched publishing: messages sent one at a time by the caller are
//! gathered into `Publish` calls of up to `max_batch` messages, with up to
//! `max_in_flight` calls outstanding. Each message's future resolves when
//! its batch is durable.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Client, ClientError, ErrorKind, Result, pb};

/// Batching settings.
#[derive(Debug, Clone, Copy)]
pub struct PublisherConfig {
    /// Most messages per `Publish` call (1 to 1000).
    pub max_batch: usize,
    /// Most `Publish` calls outstanding.
    pub max_in_flight: usize,
    /// How long to wait for more messages before sending a batch that is
    /// not full; zero sends at once what is queued.
    pub linger: Duration,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            max_batch: 100,
            max_in_flight: 4,
            linger: Duration::ZERO,
        }
    }
}

type Pending = (
    pb::PublishMessage,
    oneshot::Sender<Result<pb::PublishResult>>,
);

/// A batching publisher for one queue; see [`Client::publisher`].
#[derive(Debug)]
pub struct Publisher {
    tx: mpsc::Sender<Pending>,
    task: tokio::task::JoinHandle<()>,
}

impl Publisher {
    pub(super) fn start(client: Client, queue: String, config: PublisherConfig) -> Publisher {
        let max_batch = config.max_batch.clamp(1, 1000);
        let (tx, rx) = mpsc::channel(max_batch * config.max_in_flight.max(1) * 2);
        let task = tokio::spawn(run(client, queue, config, max_batch, rx));
        Publisher { tx, task }
    }

    /// Queues a message; the returned receiver resolves when it is durable.
    pub async fn enqueue(
        &self,
        m: pb::PublishMessage,
    ) -> Result<oneshot::Receiver<Result<pb::PublishResult>>> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send((m, done))
            .await
            .map_err(|_| ClientError::new(ErrorKind::Closed, "publisher closed"))?;
        Ok(rx)
    }

    /// Publishes one message and waits until it is durable.
    pub async fn send(&self, m: pb::PublishMessage) -> Result<pb::PublishResult> {
        let rx = self.enqueue(m).await?;
        rx.await
            .map_err(|_| ClientError::new(ErrorKind::Closed, "publisher closed"))?
    }

    /// Sends what is queued, waits for every outstanding call, and stops.
    pub async fn close(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

async fn run(
    client: Client,
    queue: String,
    config: PublisherConfig,
    max_batch: usize,
    mut rx: mpsc::Receiver<Pending>,
) {
    let slots = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut calls = tokio::task::JoinSet::new();
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        if !config.linger.is_zero() {
            let until = tokio::time::Instant::now() + config.linger;
            while batch.len() < max_batch {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(p)) => batch.push(p),
                    _ => break,
                }
            }
        }
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let client = client.clone();
        let queue = queue.clone();
        calls.spawn(async move {
            let (msgs, dones): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            match client.publish(&queue, msgs).await {
                Ok(results) => {
                    for (done, r) in dones.into_iter().zip(results) {
                        let _ = done.send(Ok(r));
                    }
                }
                Err(e) => {
                    for done in dones {
                        let _ = done.send(Err(ClientError::new(e.kind(), e.to_string())));
                    }
                }
            }
            drop(permit);
        });
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}
