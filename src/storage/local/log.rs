//! Committing: the lsn order, the log writer thread and its group
//! commits, and the commits callers alone make themselves.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::memtable::State;
use super::{Inner, Txn, lock, payloads, wal};
use crate::faults::{self, Fault};
use crate::storage::backend::{Answer, Commit, CommitError, Committer};
use crate::storage::rank::{RankedGuard, RankedMutex};
use wal::Mutation;

/// Where the log writer put each payload value: key → (lsn, place). One
/// insert per published message, by the log writer; hashed like the
/// memtable.
pub(super) type Placed = HashMap<Bytes, (u64, payloads::Loc), foldhash::fast::RandomState>;

pub(super) struct Pending {
    pub(super) lsn: u64,
    pub(super) submitted: Instant,
    pub(super) muts: Vec<Mutation>,
    pub(super) done: Answer,
    /// Submitted after a quiet commit, without waking the log writer.
    pub(super) unannounced: bool,
}

/// The writing end of the log and what is kept from one group commit to
/// the next. Whoever holds it writes: the log writer thread, or a caller
/// committing its own transaction ([`Inner::commit_alone`]). Pending
/// transactions are taken from [`State::pending`] only while holding it,
/// so batches reach the log in lsn order.
pub(super) struct LogState {
    pub(super) writer: wal::Writer,
    pub(super) frames: Vec<u8>,
    pub(super) bounds: Vec<(usize, u64)>,
    /// Durable payloads of the active memtable still whole as far as the
    /// log writer knows, oldest first, and their bytes (an overestimate:
    /// some were deleted or written again since, which their turn finds
    /// out). Emptied when the applier freezes the memtable: a frozen
    /// generation keeps its bodies until it is applied.
    pub(super) recent: VecDeque<(Bytes, u64, payloads::Loc)>,
    pub(super) recent_bytes: usize,
    /// The memtable generation `recent` belongs to.
    pub(super) generation: u64,
    /// A write failed (with this error): nothing more is written.
    pub(super) stopped: Option<CommitError>,
}

impl Inner {
    /// See [`Store::submit`].
    /// `waited`: the caller will wait for the commit (or drop it) through
    /// a [`Commit`] that can reach the store, so the log writer need not be
    /// woken yet when callers come one at a time ([`Inner::quiet`]).
    pub(super) fn submit(&self, txn: Txn, waited: bool) -> Commit {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.state);
        if let Some(why) = &st.closed {
            return Commit::refused(Arc::clone(why));
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        let added = st.add(&txn.muts, lsn);
        if faults::on(Fault::NoDeliveryCount) {
            let mut v = lock(&self.volatile);
            for m in &txn.muts {
                v.remove(&m.key);
            }
            v.extend(txn.volatile);
        }
        self.unapplied.fetch_add(added, Ordering::Relaxed);
        let full = st.active_bytes > self.opts.apply_bytes;
        let unannounced = waited && self.quiet.load(Ordering::Relaxed);
        st.pending.push(Pending {
            lsn,
            submitted: Instant::now(),
            muts: txn.muts,
            done: tx,
            unannounced,
        });
        if st.pending.len() == 1 && !unannounced {
            self.commit_cv.notify_one();
        }
        drop(st);
        if full {
            self.apply_cv.notify_one();
        }
        Commit::pending(lsn, rx, unannounced)
    }

    /// Waits until everything up to `lsn` is durable; false on failure.
    pub(super) fn wait_durable(&self, lsn: u64) -> bool {
        self.announce(lsn);
        let mut d = lock(&self.durable);
        while *d < lsn {
            if self.failed() {
                return false;
            }
            d = self.durable_cv.wait_timeout(d, Duration::from_millis(100));
        }
        true
    }
}

/// The local backend's part in the commits its callers wait for: a
/// caller alone commits its own transaction.
impl Committer for Inner {
    fn start(&self, lsn: u64) {
        self.announce(lsn);
    }

    fn alone(&self, lsn: u64) -> bool {
        Inner::alone(self, lsn)
    }

    fn commit_alone(&self, lsn: u64) {
        Inner::commit_alone(self, lsn);
    }

    fn wait_durable(&self, lsn: u64) -> bool {
        Inner::wait_durable(self, lsn)
    }
}

/// The log writer thread: takes every pending transaction, writes them in
/// one go, fdatasyncs, and answers them.
pub(super) fn log_writer(inner: &Inner) {
    loop {
        let (mut log, batch) = {
            let mut st = lock(&inner.state);
            loop {
                if st.pending.is_empty() {
                    if st.closed.is_some() {
                        return; // closed and drained
                    }
                } else if let Some(log) = try_lock(&inner.log) {
                    // Taken while holding the log: batches are written in
                    // lsn order. A caller committing alone holds the log
                    // for its write and wakes this thread if it leaves
                    // work behind.
                    break (log, std::mem::take(&mut st.pending));
                }
                #[cfg(test)]
                inner.writer_waiting.store(true, Ordering::Relaxed);
                st = inner.commit_cv.wait(st);
                #[cfg(test)]
                inner.writer_waiting.store(false, Ordering::Relaxed);
            }
        };
        if !commit_batch(inner, &mut log, batch) {
            return;
        }
    }
}

/// A mutex's guard if it is free (see [`RankedMutex::try_lock`]: exempt
/// from the lock order, as it does not wait).
pub(super) fn try_lock<T>(m: &RankedMutex<T>) -> Option<RankedGuard<'_, T>> {
    m.try_lock()
}

/// Whether the running task may block its thread for one write and
/// `fdatasync`: on tokio's multi-thread runtime with another worker to go
/// on running tasks meanwhile.
pub(super) fn may_block_task() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && h.metrics().num_workers() >= 2
    })
}

/// Most transactions a caller commits on its own thread: its own and one
/// submitted just before it without waking the log writer (a
/// subscription's ack and the lease that its credit let go).
pub(super) const ALONE_MAX: usize = 2;

/// Whether `lsn` is the last transaction waiting for the log, and those
/// before it (at most [`ALONE_MAX`] in all) were submitted after a quiet
/// commit too.
pub(super) fn alone_in(st: &State, lsn: u64) -> bool {
    st.pending.len() <= ALONE_MAX
        && st.pending.last().is_some_and(|p| p.lsn == lsn)
        && st.pending.iter().all(|p| p.unannounced)
}

impl Inner {
    /// Whether [`Inner::commit_alone`] would commit `lsn` now.
    pub(super) fn alone(&self, lsn: u64) -> bool {
        self.quiet.load(Ordering::Relaxed) && may_block_task() && alone_in(&lock(&self.state), lsn)
    }

    /// Wakes the log writer if `lsn` is not durable yet and transactions
    /// are waiting for it, some of which may not have woken it.
    pub(super) fn announce(&self, lsn: u64) {
        if *lock(&self.durable) >= lsn {
            return;
        }
        if !lock(&self.state).pending.is_empty() {
            self.commit_cv.notify_one();
        }
    }

    /// Commits transaction `lsn` on the caller's thread if it is alone
    /// ([`alone_in`]: the last one waiting for the log, with at most one
    /// before it, all queued after a quiet commit), nothing is being written
    /// and the last group commit was [quiet](Inner::quiet): a caller alone
    /// (one request at a time) then pays for the write and its `fdatasync`
    /// only, not also for waking the log writer thread and being woken by
    /// it. Otherwise callers are arriving together and the log writer's
    /// group commit takes it, as it would have: a commit of one on the side
    /// would take an `fdatasync` from the groups.
    ///
    /// Called by [`Commit::wait`] once [`Inner::alone`] said yes, after a
    /// yield: the test is made again here, under the log.
    pub(super) fn commit_alone(&self, lsn: u64) {
        let Some(mut log) = try_lock(&self.log) else {
            return;
        };
        let batch = {
            let mut st = lock(&self.state);
            if alone_in(&st, lsn) && self.quiet.load(Ordering::Relaxed) {
                std::mem::take(&mut st.pending)
            } else {
                Vec::new()
            }
        };
        if !batch.is_empty() && commit_batch(self, &mut log, batch) {
            self.counters.caller_commits.fetch_add(1, Ordering::Relaxed);
        }
        drop(log);
        // The log writer may have found the log taken and gone back to
        // sleep with work pending.
        if !lock(&self.state).pending.is_empty() {
            self.commit_cv.notify_one();
        }
    }
}

/// Writes one group of transactions to the log, makes it durable and
/// answers each; false once the log has failed (every caller told).
pub(super) fn commit_batch(inner: &Inner, log: &mut LogState, batch: Vec<Pending>) -> bool {
    if let Some(why) = &log.stopped {
        refuse(batch, why);
        return false;
    }
    let keep = inner.opts.recent_payload_bytes;
    let located = log.frame_batch(&batch);
    let t = Instant::now();
    let written = log
        .writer
        .write(&log.frames, &log.bounds)
        .and_then(|wrote| {
            // A segment's place in the log is durable before any record
            // in it is answered (negative control: not at all).
            if !faults::on(Fault::NoSegmentNotes) {
                super::apply::note_segments(inner, &wrote.entered)?;
            }
            Ok(wrote.placed)
        });
    let placed = match written {
        Ok(placed) => placed,
        Err(e) => {
            let why = Arc::new(e);
            refuse(batch, &why);
            log.stopped = Some(Arc::clone(&why));
            inner.fail(why);
            return false;
        }
    };
    log.note_places(inner, &batch, located, &placed);
    let last = batch[batch.len() - 1].lsn;
    inner.quiet.store(
        (batch.len() == 1 || batch.iter().all(|p| p.unannounced))
            && lock(&inner.state).pending.is_empty(),
        Ordering::Relaxed,
    );
    count_sync(inner, batch.len(), log.frames.len(), t.elapsed());
    *lock(&inner.durable) = last;
    inner.durable_cv.notify_all();
    // The oldest durable bodies beyond the most recent ones leave the
    // memtable for their places (see `Slot`); they are freed below,
    // outside the lock.
    let places = log.oldest_beyond(keep);
    let swapped = super::memtable::swap_for_places(inner, &places);
    drop(places);
    for p in batch {
        inner
            .metrics
            .commit_seconds
            .observe(p.submitted.elapsed().as_secs_f64());
        let _ = p.done.send(Ok(()));
    }
    drop(swapped);
    if log.frames.capacity() > 64 << 20 {
        log.frames = Vec::with_capacity(1 << 20);
    }
    true
}

/// Answers every transaction of `batch` with an error.
pub(super) fn refuse(batch: Vec<Pending>, why: &CommitError) {
    for p in batch {
        let _ = p.done.send(Err(Arc::clone(why)));
    }
}

/// The figures of one group commit: its write and `fdatasync` took
/// `synced`.
fn count_sync(inner: &Inner, records: usize, bytes: usize, synced: Duration) {
    inner.counters.sync_micros.fetch_add(
        u64::try_from(synced.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    inner.metrics.sync_seconds.observe(synced.as_secs_f64());
    #[allow(clippy::cast_precision_loss)]
    inner.metrics.batch_records.observe(records as f64);
    inner.counters.log_syncs.fetch_add(1, Ordering::Relaxed);
    inner
        .counters
        .records
        .fetch_add(records as u64, Ordering::Relaxed);
    inner
        .counters
        .log_bytes
        .fetch_add(bytes as u64, Ordering::Relaxed);
}

impl LogState {
    /// Frames the transactions of `batch` into `frames` (their ends and
    /// lsns in `bounds`); returns where each payload value is: (index in
    /// the batch, mutation index, value offset in its frame).
    fn frame_batch(&mut self, batch: &[Pending]) -> Vec<(usize, usize, usize)> {
        self.frames.clear();
        self.bounds.clear();
        let first = batch[0].lsn;
        let mut located = Vec::new();
        for (fi, p) in batch.iter().enumerate() {
            for (mi, off) in wal::frame(p.lsn, first, &p.muts, &mut self.frames, payloads::located)
            {
                located.push((fi, mi, off));
            }
            self.bounds.push((self.frames.len(), p.lsn));
        }
        located
    }

    /// Notes where the batch's payloads went (`placed`: segment and file
    /// offset of each frame), in the store's map for the applier and in
    /// the list of recent payloads of the active memtable generation.
    fn note_places(
        &mut self,
        inner: &Inner,
        batch: &[Pending],
        located: Vec<(usize, usize, usize)>,
        placed: &[(u64, u64)],
    ) {
        let now = inner.generations.load(Ordering::Relaxed);
        if now != self.generation {
            self.generation = now;
            self.recent.clear();
            self.recent_bytes = 0;
        }
        if located.is_empty() {
            return;
        }
        let mut map = lock(&inner.placed);
        for (fi, mi, off) in located {
            let (p, (seg, frame_off)) = (&batch[fi], placed[fi]);
            let m = &p.muts[mi];
            let len = m.value.as_ref().map_or(0, Bytes::len);
            let loc = payloads::Loc {
                seg,
                off: frame_off + off as u64,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            };
            map.insert(m.key.clone(), (p.lsn, loc));
            self.recent.push_back((m.key.clone(), p.lsn, loc));
            self.recent_bytes += usize::try_from(loc.len).unwrap_or(usize::MAX);
        }
    }

    /// Takes the oldest recent payloads off the list until what is left
    /// is at most `keep` bytes.
    fn oldest_beyond(&mut self, keep: usize) -> Vec<(Bytes, u64, payloads::Loc)> {
        let mut places = Vec::new();
        while self.recent_bytes > keep {
            let Some(place) = self.recent.pop_front() else {
                break;
            };
            self.recent_bytes = self
                .recent_bytes
                .saturating_sub(usize::try_from(place.2.len).unwrap_or(usize::MAX));
            places.push(place);
        }
        places
    }
}
