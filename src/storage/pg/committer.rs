//! What the backend's calls and its tasks share ([`Shared`]: `FRONT`,
//! `FENCE`, `READER`), and the tasks on the backend's runtime: the
//! committer (one fenced batch in flight, unknown outcomes settled by the
//! commit marker) and the lease renewal (see the module doc of
//! `backend`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::AtomicBool;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};

use super::PgBackendOptions;
use super::recent::Recent;
use super::state::{Fence, Outcome, PgError, PgState};
use crate::storage::StorageError;
use crate::storage::backend::{Answer, CommitError};
use crate::storage::keys::{TAG_META, TAG_PAYLOAD};
use crate::storage::rank::RankedMutex;
use crate::storage::stats::PgStoreMetrics;

/// Absolute changes: a put with its value, a deletion without.
pub(super) type Changes = Vec<(Bytes, Option<Bytes>)>;

/// A transaction waiting for the committer.
pub(super) struct Queued {
    pub(super) lsn: u64,
    /// When it was submitted.
    pub(super) submitted: Instant,
    pub(super) changes: Changes,
    pub(super) bytes: usize,
    pub(super) done: Answer,
}

/// What submitters, readers and the committer share.
pub(super) struct Front {
    /// Changes not yet known to be committed: key → (value or deletion,
    /// lsn of the latest change).
    pub(super) overlay: BTreeMap<Bytes, (Option<Bytes>, u64)>,
    pub(super) next_lsn: u64,
    pub(super) queue: VecDeque<Queued>,
    /// Set on close or failure: no more submissions.
    pub(super) closed: Option<String>,
    /// Set on failure.
    pub(super) failed: Option<String>,
    /// Message bodies and records committed lately and not changed since.
    pub(super) recent: Recent,
}

/// What the backend's calls and its tasks share.
pub(super) struct Shared {
    pub(super) front: RankedMutex<Front>,
    /// Wakes the committer.
    pub(super) wake: Notify,
    pub(super) failure: watch::Sender<Option<String>>,
    pub(super) fence: RankedMutex<Fence>,
    /// The connection for reads and lease renewals.
    pub(super) reader: RankedMutex<Arc<PgState>>,
    pub(super) handle: Handle,
    pub(super) url: String,
    pub(super) opts: PgBackendOptions,
    pub(super) metrics: PgStoreMetrics,
    #[cfg(test)]
    pub(super) renewal_paused: AtomicBool,
}

impl Shared {
    pub(super) fn reader(&self) -> Arc<PgState> {
        Arc::clone(&self.reader.lock())
    }

    /// A new connection, tried until `deadline` (once at least).
    pub(super) async fn connect(&self, deadline: Instant) -> std::result::Result<PgState, PgError> {
        loop {
            match PgState::connect(&self.url, self.opts.shard).await {
                Ok(mut s) => {
                    s.set_chunk_size(self.opts.chunk_size);
                    return Ok(s);
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "PostgreSQL: connecting again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Stops the backend for good (see the module doc).
    pub(super) fn fail(&self, reason: &str) {
        let queued = {
            let mut front = self.front.lock();
            if front.failed.is_some() {
                return;
            }
            front.failed = Some(reason.to_string());
            front.closed = Some(reason.to_string());
            std::mem::take(&mut front.queue)
        };
        tracing::error!(reason, "PostgreSQL backend stopped");
        refuse(queued, reason);
        self.failure.send_replace(Some(reason.to_string()));
        self.wake.notify_one();
    }

    /// Answers a committed batch and drops its changes from the overlay
    /// unless a later transaction changed the key again.
    fn done(&self, batch: VecDeque<Queued>) {
        let Some(last) = batch.back().map(|q| q.lsn) else {
            return;
        };
        {
            let mut front = self.front.lock();
            for q in &batch {
                for (k, _) in &q.changes {
                    if front.overlay.get(k).is_some_and(|(_, lsn)| *lsn <= last)
                        && let Some((Some(v), _)) = front.overlay.remove(k)
                        && kept_when_committed(k)
                    {
                        front.recent.keep(k.clone(), v);
                    }
                }
            }
        }
        for q in batch {
            self.metrics
                .commit_seconds
                .observe(q.submitted.elapsed().as_secs_f64());
            let _ = q.done.send(Ok(()));
        }
    }
}

/// Whether a committed value of `key` is kept among the recent values:
/// message bodies and message records (read by a delivery and its lease
/// close behind the transaction that wrote them).
fn kept_when_committed(key: &[u8]) -> bool {
    matches!(key.first(), Some(&(TAG_PAYLOAD | TAG_META)))
}

fn refuse(batch: impl IntoIterator<Item = Queued>, reason: &str) {
    let why = stopped_for(reason);
    for q in batch {
        let _ = q.done.send(Err(Arc::clone(&why)));
    }
}

/// Why transactions are refused once the backend stopped for `reason`.
pub(super) fn stopped_for(reason: &str) -> CommitError {
    Arc::new(StorageError::Stopped {
        reason: reason.to_string(),
    })
}

/// The committer task (see the module doc).
pub(super) async fn committer(shared: Arc<Shared>, mut writer: PgState) {
    loop {
        let batch = loop {
            {
                let mut front = shared.front.lock();
                if !front.queue.is_empty() {
                    break take_batch(&mut front.queue, shared.opts.max_batch_bytes);
                }
                if front.closed.is_some() {
                    return;
                }
            }
            shared.wake.notified().await;
        };
        let started = Instant::now();
        match commit_batch(&shared, &mut writer, &batch).await {
            Ok(()) => {
                let m = &shared.metrics;
                m.transaction_seconds
                    .observe(started.elapsed().as_secs_f64());
                m.batch_records.observe(batch.len() as f64);
                shared.done(batch);
            }
            Err(reason) => {
                shared.fail(&reason);
                refuse(batch, &reason);
                return;
            }
        }
    }
}

/// The oldest queued transactions, whole, up to `max` bytes (one at least).
fn take_batch(queue: &mut VecDeque<Queued>, max: usize) -> VecDeque<Queued> {
    let mut batch = VecDeque::new();
    let mut bytes = 0usize;
    while let Some(q) = queue.front() {
        if !batch.is_empty() && bytes.saturating_add(q.bytes) > max {
            break;
        }
        bytes = bytes.saturating_add(q.bytes);
        batch.extend(queue.pop_front());
    }
    batch
}

/// Commits one batch; the reason to stop if it cannot be.
async fn commit_batch(
    shared: &Shared,
    writer: &mut PgState,
    batch: &VecDeque<Queued>,
) -> std::result::Result<(), String> {
    let Some(last) = batch.back().map(|q| q.lsn) else {
        return Ok(());
    };
    let changes: Changes = batch
        .iter()
        .flat_map(|q| q.changes.iter().cloned())
        .collect();
    let fence = *shared.fence.lock();
    let detail = match writer.commit(&fence, &changes, last).await {
        Ok(()) => return Ok(()),
        Err(PgError::Unknown { detail, .. }) => detail,
        Err(e) => return Err(format!("commit up to lsn {last}: {e}")),
    };
    tracing::warn!(lsn = last, %detail, "PostgreSQL: commit outcome unknown, settling it");
    let unsettled = |e: PgError| {
        format!(
            "the outcome of the commit up to lsn {last} is unknown ({detail}) and could not be settled: {e}"
        )
    };
    let deadline = fence.valid_until;
    let mut fresh = shared.connect(deadline).await.map_err(unsettled)?;
    let outcome = fresh.resolve(last).await.map_err(unsettled)?;
    *writer = fresh;
    match outcome {
        Outcome::Committed => Ok(()),
        Outcome::NotCommitted => writer.commit(&fence, &changes, last).await.map_err(|e| {
            format!("commit up to lsn {last}, sent again after its first outcome was unknown ({detail}): {e}")
        }),
    }
}

/// The lease renewal task (see the module doc).
pub(super) async fn renewer(shared: Arc<Shared>) {
    let ttl = shared.opts.lease_ttl;
    let period = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        if shared.front.lock().failed.is_some() {
            return;
        }
        #[cfg(test)]
        if shared.renewal_paused.load(Ordering::Relaxed) {
            continue;
        }
        let fence = *shared.fence.lock();
        let reader = shared.reader();
        let why = match tokio::time::timeout(period, reader.renew(&fence, ttl)).await {
            Ok(Ok(renewed)) => {
                *shared.fence.lock() = renewed;
                continue;
            }
            Ok(Err(e @ PgError::Fenced { .. })) => {
                shared.fail(&format!("lease renewal: {e}"));
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", period.as_millis()),
        };
        if Instant::now() >= fence.valid_until {
            shared.fail(&format!(
                "shard {}: the lease of epoch {} ran out unrenewed ({why}): another node may own the shard now",
                shared.opts.shard, fence.epoch
            ));
            return;
        }
        tracing::warn!(%why, "PostgreSQL: lease renewal failed, trying a new connection");
        if let Ok(Ok(s)) = tokio::time::timeout(period, shared.connect(Instant::now())).await {
            *shared.reader.lock() = Arc::new(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    fn queued(lsn: u64, bytes: usize) -> Queued {
        Queued {
            lsn,
            submitted: Instant::now(),
            changes: Vec::new(),
            bytes,
            done: oneshot::channel().0,
        }
    }

    fn lsns(batch: &VecDeque<Queued>) -> Vec<u64> {
        batch.iter().map(|q| q.lsn).collect()
    }

    #[test]
    fn batches_take_whole_transactions_up_to_the_byte_bound() {
        let mut queue: VecDeque<Queued> = [(1, 10), (2, 30), (3, 100), (4, 5), (5, 5), (6, 45)]
            .into_iter()
            .map(|(lsn, bytes)| queued(lsn, bytes))
            .collect();
        // 10 + 30 fit in 50; 100 is over the bound alone, a batch of its
        // own; 5 + 5 + 45 would pass it.
        assert_eq!(lsns(&take_batch(&mut queue, 50)), vec![1, 2]);
        assert_eq!(lsns(&take_batch(&mut queue, 50)), vec![3]);
        assert_eq!(lsns(&take_batch(&mut queue, 50)), vec![4, 5]);
        assert_eq!(lsns(&take_batch(&mut queue, 50)), vec![6]);
        assert!(take_batch(&mut queue, 50).is_empty());
    }
}
