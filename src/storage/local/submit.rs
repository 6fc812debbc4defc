//! Submission: the lsn order, the memtable, the transactions waiting for
//! the log, and the wake-ups of the two threads ([`Submission`]).
//!
//! Its locks: `STATE` (the memtable, the next lsn, the queue for the log,
//! `closed`; with the condition variables on which the log writer and the
//! applier wait) and, under it, `VOLATILE` (a negative control's values).
//! The one call it makes holding `STATE` is the log writer's try of
//! `LOG` ([`Submission::log_batch`]), which cannot deadlock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Notify, oneshot};

use super::memtable::{Memtable, Slot, Table};
use super::payloads;
use super::wal::Mutation;
use crate::faults::{self, Fault};
use crate::storage::Txn;
use crate::storage::backend::{Answer, Commit, CommitError};
use crate::storage::rank::{Rank, RankedCondvar, RankedMutex};

/// A transaction waiting for the log.
pub(super) struct Pending {
    pub(super) lsn: u64,
    pub(super) submitted: Instant,
    pub(super) muts: Vec<Mutation>,
    pub(super) done: Answer,
    /// Submitted after a quiet commit, without waking the log writer.
    pub(super) unannounced: bool,
}

/// What `STATE` guards.
struct State {
    memtable: Memtable,
    next_lsn: u64,
    /// Transactions waiting for the log writer, in lsn order.
    pending: Vec<Pending>,
    /// Set on close or failure: no more submissions.
    closed: Option<CommitError>,
}

/// Most transactions a caller commits on its own thread: its own and one
/// submitted just before it without waking the log writer (a
/// subscription's ack and the lease that its credit let go).
pub(super) const ALONE_MAX: usize = 2;

/// The submission side of the local store (see the module doc).
pub(super) struct Submission {
    state: RankedMutex<State>,
    /// Wakes the log writer when `pending` gets work, or when a caller
    /// that committed alone leaves work behind.
    commit_cv: RankedCondvar,
    /// Wakes the applier (memtable full, close, a publisher waiting for
    /// room).
    apply_cv: RankedCondvar,
    /// Told when the applier has applied a generation (room for
    /// publishers) or the store stopped.
    room: Notify,
    /// Bytes of the active and the frozen generations, read without
    /// `STATE`.
    unapplied: AtomicUsize,
    /// Memtable generations frozen so far (the log writer's list of
    /// recent payloads only concerns the active one).
    generations: AtomicU64,
    /// The last group commit held one transaction (or only transactions
    /// submitted after a quiet commit) and none arrived while it was
    /// written: callers come one at a time. Otherwise they arrive
    /// together, and the log writer should keep grouping them.
    quiet: AtomicBool,
    /// The log writer thread is waiting to be woken (tests wait for it
    /// before they count commits made by callers: a log writer still
    /// awake takes whatever is queued).
    #[cfg(test)]
    writer_waiting: AtomicBool,
    /// Negative control ([`Fault::NoDeliveryCount`]): values kept in
    /// memory only. Always empty without that fault.
    volatile: RankedMutex<HashMap<Bytes, Bytes>>,
    /// Apply early once the active generation holds this many bytes.
    apply_bytes: usize,
    /// Publishers wait for room above this many unapplied bytes.
    max_unapplied_bytes: usize,
}

impl Submission {
    /// Submission going on after lsn `last_lsn`.
    pub(super) fn new(last_lsn: u64, apply_bytes: usize, max_unapplied_bytes: usize) -> Submission {
        Submission {
            state: RankedMutex::new(
                Rank::STATE,
                "state",
                State {
                    memtable: Memtable::default(),
                    next_lsn: last_lsn + 1,
                    pending: Vec::new(),
                    closed: None,
                },
            ),
            commit_cv: RankedCondvar::new(),
            apply_cv: RankedCondvar::new(),
            room: Notify::new(),
            unapplied: AtomicUsize::new(0),
            generations: AtomicU64::new(0),
            quiet: AtomicBool::new(false),
            #[cfg(test)]
            writer_waiting: AtomicBool::new(false),
            volatile: RankedMutex::default_with(Rank::VOLATILE, "volatile"),
            apply_bytes,
            max_unapplied_bytes,
        }
    }

    /// See [`Store::submit`](crate::storage::Store::submit).
    /// `waited`: the caller will wait for the commit (or drop it) through
    /// a [`Commit`] that can reach the store, so the log writer need not be
    /// woken yet when callers come one at a time ([`Submission::quiet`]).
    pub(super) fn submit(&self, txn: Txn, waited: bool) -> Commit {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        if let Some(why) = &st.closed {
            return Commit::refused(Arc::clone(why));
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        let added = st.memtable.add(&txn.muts, lsn);
        if faults::on(Fault::NoDeliveryCount) {
            let mut v = self.volatile.lock();
            for m in &txn.muts {
                v.remove(&m.key);
            }
            v.extend(txn.volatile);
        }
        self.unapplied.fetch_add(added, Ordering::Relaxed);
        let full = st.memtable.active_bytes() > self.apply_bytes;
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

    /// The lsn the next submission gets.
    pub(super) fn next_lsn(&self) -> u64 {
        self.state.lock().next_lsn
    }

    /// The log writer thread's wait: until transactions are pending and
    /// `take_log` gives the log, called holding `STATE` (a try of `LOG`,
    /// which cannot deadlock: see the lock order). Returns what it gave
    /// and every pending transaction (so batches reach the log in lsn
    /// order, taken only by whoever holds the log); `None` once the store
    /// is closed and nothing is pending.
    pub(super) fn log_batch<G>(
        &self,
        mut take_log: impl FnMut() -> Option<G>,
    ) -> Option<(G, Vec<Pending>)> {
        let mut st = self.state.lock();
        loop {
            if st.pending.is_empty() {
                if st.closed.is_some() {
                    return None; // closed and drained
                }
            } else if let Some(log) = take_log() {
                // A caller committing alone holds the log for its write
                // and wakes this thread if it leaves work behind.
                return Some((log, std::mem::take(&mut st.pending)));
            }
            #[cfg(test)]
            self.writer_waiting.store(true, Ordering::Relaxed);
            st = self.commit_cv.wait(st);
            #[cfg(test)]
            self.writer_waiting.store(false, Ordering::Relaxed);
        }
    }

    /// Whether a caller may commit `lsn` on its own thread now (see
    /// [`alone_in`]), callers having come one at a time.
    pub(super) fn alone(&self, lsn: u64) -> bool {
        self.quiet.load(Ordering::Relaxed) && may_block_task() && alone_in(&self.state.lock(), lsn)
    }

    /// The pending transactions, for a caller that holds the log and
    /// commits `lsn` alone, if it still may ([`alone_in`], quiet); none
    /// otherwise. Called holding `LOG`.
    pub(super) fn take_alone(&self, lsn: u64) -> Vec<Pending> {
        let mut st = self.state.lock();
        if alone_in(&st, lsn) && self.quiet.load(Ordering::Relaxed) {
            std::mem::take(&mut st.pending)
        } else {
            Vec::new()
        }
    }

    /// Notes a group commit just written: callers come one at a time if
    /// it was `alone` (one transaction, or only unannounced ones) and none
    /// arrived meanwhile. Called holding `LOG`.
    pub(super) fn note_group(&self, alone: bool) {
        self.quiet.store(
            alone && self.state.lock().pending.is_empty(),
            Ordering::Relaxed,
        );
    }

    /// Wakes the log writer if transactions are waiting for it (some may
    /// not have woken it).
    pub(super) fn wake_log_writer_if_pending(&self) {
        if !self.state.lock().pending.is_empty() {
            self.commit_cv.notify_one();
        }
    }

    /// Wakes the log writer.
    #[cfg(test)]
    pub(super) fn wake_log_writer(&self) {
        self.commit_cv.notify_one();
    }

    /// The memtable generation now (see `generations`).
    pub(super) fn generation(&self) -> u64 {
        self.generations.load(Ordering::Relaxed)
    }

    /// Swaps durable payloads of the active generation for their places
    /// in the log (see [`Memtable::swap_for_places`]); returns the bodies
    /// taken out, to be dropped outside the lock. Called holding `LOG`.
    pub(super) fn swap_for_places(&self, places: &[(Bytes, u64, payloads::Loc)]) -> Vec<Bytes> {
        if places.is_empty() {
            return Vec::new();
        }
        self.state.lock().memtable.swap_for_places(places)
    }

    /// The latest submitted value of `k`, if the memtable holds one (see
    /// [`Memtable::lookup`]).
    pub(super) fn lookup(&self, k: &[u8]) -> Option<(Option<Bytes>, bool)> {
        self.state.lock().memtable.lookup(k)
    }

    /// The memtable's changes in a key range (see
    /// [`Memtable::changes_in`]).
    pub(super) fn changes_in(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> BTreeMap<Bytes, (Option<Bytes>, bool)> {
        self.state.lock().memtable.changes_in(start, end)
    }

    /// A value kept in memory only ([`Fault::NoDeliveryCount`]).
    pub(super) fn volatile(&self, k: &[u8]) -> Option<Bytes> {
        self.volatile.lock().get(k).cloned()
    }

    /// Stops taking transactions for good (a failure), and returns those
    /// waiting for the log, to be refused.
    pub(super) fn stop(&self, why: CommitError) -> Vec<Pending> {
        let mut st = self.state.lock();
        st.closed = Some(why);
        std::mem::take(&mut st.pending)
    }

    /// Stops taking transactions (unless already stopped); those waiting
    /// for the log are still written.
    pub(super) fn close(&self, why: CommitError) {
        let mut st = self.state.lock();
        if st.closed.is_none() {
            st.closed = Some(why);
        }
    }

    /// Wakes both threads and every publisher waiting for room (a close or
    /// a failure).
    pub(super) fn wake_all(&self) {
        self.commit_cv.notify_all();
        self.apply_cv.notify_all();
        self.room.notify_waiters();
    }

    /// True while changes waiting for the database are over the bound
    /// (publishers wait in [`Submission::room`]).
    pub(super) fn room_wanted(&self) -> bool {
        self.unapplied.load(Ordering::Relaxed) >= self.max_unapplied_bytes
    }

    /// Bytes of changes not yet applied to the database.
    pub(super) fn unapplied_bytes(&self) -> usize {
        self.unapplied.load(Ordering::Relaxed)
    }

    /// See [`LocalBackend::room`](super::LocalBackend::room): `failed`
    /// says whether the store has stopped, `waits` counts the calls that
    /// had to wait.
    pub(super) async fn room(&self, failed: impl Fn() -> bool, waits: &AtomicU64) {
        if !self.room_wanted() {
            // The common case, without registering with the `Notify`.
            return;
        }
        let mut counted = false;
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.room_wanted() || failed() || self.state.lock().closed.is_some() {
                return;
            }
            if !counted {
                counted = true;
                waits.fetch_add(1, Ordering::Relaxed);
            }
            self.apply_cv.notify_one();
            notified.await;
        }
    }

    /// Tells publishers waiting for room to look again.
    pub(super) fn notify_room(&self) {
        self.room.notify_waiters();
    }

    /// The applier's wait: until the active generation is over
    /// `apply_bytes`, room is wanted, the store closes, or `interval` has
    /// passed. Returns whether the store is closing.
    pub(super) fn wait_for_apply(&self, interval: Duration) -> bool {
        let st = self.state.lock();
        let st = self.apply_cv.wait_timeout_while(st, interval, |s| {
            s.closed.is_none()
                && s.memtable.active_bytes() <= self.apply_bytes
                && !self.room_wanted()
        });
        st.closed.is_some()
    }

    /// Freezes the active generation for the applier; returns it and the
    /// lsn of the last transaction in it, or `None` when there is nothing
    /// to apply.
    pub(super) fn freeze(&self) -> Option<(Arc<Table>, u64)> {
        let mut st = self.state.lock();
        let frozen = match st.memtable.freeze() {
            Ok(frozen) => frozen,
            Err(held) => {
                // Everything submitted since the last apply was created and
                // deleted in between: nothing to apply, and nothing held.
                drop(st);
                if held > 0 {
                    self.unapplied.fetch_sub(held, Ordering::Relaxed);
                    self.room.notify_waiters();
                }
                return None;
            }
        };
        self.generations.fetch_add(1, Ordering::Relaxed);
        Some((frozen, st.next_lsn - 1))
    }

    /// For a chunk of the frozen generation, the deletes that overtook its
    /// puts (see [`Memtable::overtaken`]); `durable` is the durable lsn.
    pub(super) fn overtaken(&self, chunk: &[(&Bytes, &Slot)], durable: u64) -> Vec<Option<u64>> {
        self.state.lock().memtable.overtaken(chunk, durable)
    }

    /// Lets the frozen generation go once it is applied.
    pub(super) fn unfreeze(&self) {
        let mut st = self.state.lock();
        let bytes = st.memtable.unfreeze();
        self.unapplied.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// See [`Memtable::mark_fresh`].
    pub(super) fn mark_fresh(&self, keys: &[(&Bytes, u64)]) {
        self.state.lock().memtable.mark_fresh(keys);
    }

    /// Tests: whether callers were last seen coming one at a time.
    #[cfg(test)]
    pub(super) fn is_quiet(&self) -> bool {
        self.quiet.load(Ordering::Relaxed)
    }

    /// Tests: whether the log writer thread is asleep.
    #[cfg(test)]
    pub(super) fn writer_waiting(&self) -> bool {
        self.writer_waiting.load(Ordering::Relaxed)
    }

    /// Tests: the active generation's slot of a key.
    #[cfg(test)]
    pub(super) fn active_slot(&self, k: &[u8]) -> Option<Slot> {
        self.state.lock().memtable.active_slot(k)
    }

    /// Tests: the number of keys in the active generation.
    #[cfg(test)]
    pub(super) fn active_len(&self) -> usize {
        self.state.lock().memtable.active_len()
    }
}

/// Whether the running task may block its thread for one write and
/// `fdatasync`: on tokio's multi-thread runtime with another worker to go
/// on running tasks meanwhile.
fn may_block_task() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && h.metrics().num_workers() >= 2
    })
}

/// Whether `lsn` is the last transaction waiting for the log, and those
/// before it (at most [`ALONE_MAX`] in all) were submitted after a quiet
/// commit too.
fn alone_in(st: &State, lsn: u64) -> bool {
    st.pending.len() <= ALONE_MAX
        && st.pending.last().is_some_and(|p| p.lsn == lsn)
        && st.pending.iter().all(|p| p.unannounced)
}
