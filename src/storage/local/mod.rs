//! The local backend ([`LocalBackend`]): our write-ahead log in front of
//! sled, with the memtable, in one data directory.
//!
//! ## Durability contract
//!
//! * [`Store::submit`] takes one transaction (a list of puts and deletes)
//!   and gives it the next log sequence number (lsn). Transactions are
//!   logged in submission order. The returned [`Commit`] resolves once the
//!   transaction's log record, and every record before it, is written and
//!   `fdatasync`'d. Concurrent submissions share one write and one
//!   `fdatasync` (group commit, by the log writer thread); a caller whose
//!   transaction is the only one queued (or the second of two), when
//!   callers come one at a time, writes it itself while it waits
//!   ([`Commit::wait`]).
//! * [`Store::get`] sees every submitted transaction at once, durable or
//!   not (the memtable), so the engine can read what it has just decided.
//!   Callers that hand data to a client wait for their own commit first.
//! * The database (sled) is written only with durable transactions, in
//!   frozen generations, each applied as one atomic sled batch together
//!   with the lsn of its last record (`SysKey::AppliedLsn`). sled is never
//!   ahead of the durable log.
//! * Message bodies are written once, in the log: the database keeps a
//!   pointer to each payload's place in its log segment (see `payloads`),
//!   and so does the memtable for durable payloads beyond the most recent
//!   (the log writer swaps their bodies for their places; see
//!   `memtable::Slot`).
//! * A checkpoint flushes sled, fsyncs every file of the database and its
//!   directories (sled's flush syncs its data file only: not its blob
//!   files, nor the directory after a snapshot's rename), and then
//!   retires log segments whose records are all applied and to which no
//!   payload pointer refers (kept for reuse, see `wal::Pool`); segments
//!   kept only for a few old payloads are compacted (see `checkpoint`).
//!   The log writer lists a segment it moves into in `CHECKPOINT` before
//!   it answers any record written there.
//! * When the database's files are mostly free space (a deep queue
//!   drained), a checkpoint rewrites it into a new directory and makes that
//!   one current (see `rewrite`), giving the space back.
//! * Opening replays log records newer than the applied lsn into sled (a
//!   record is a set of absolute puts and deletes, so replay is
//!   idempotent), checkpoints, and starts a fresh log segment (see
//!   `open`).
//! * An I/O error while logging, applying or checkpointing stops the store
//!   for good (fail-stop): the failed transaction and every later one get
//!   an error, nothing is retried, and [`Store::failure`] reports it so the
//!   process can exit and recover from disk.
//!
//! ## Parts
//!
//! A running store is a set of parts (`Shared`), each the owner of its
//! state and its locks as private fields: a part takes only its own
//! locks, and reaches another part's state only by calling it.
//!
//! * `submit::Submission`: the lsn order, the memtable (`memtable`, plain
//!   data inside it), the transactions waiting for the log, the wake-ups
//!   of the two threads.
//! * `log::LogWriter`: the log writer thread's group commits and the
//!   commits callers alone make, the durable lsn, where each payload went
//!   (writing through `wal::Writer`).
//! * `apply::Applier`: the applier thread, which puts durable generations
//!   into the database.
//! * `checkpoint::Checkpoints`: checkpoints, the `CHECKPOINT` record and
//!   the log segments written since start.
//! * `payloads::Payloads`: pointer counts per segment, the segment files
//!   payloads are read from, compaction.
//! * `db::Database`: the current sled database (replaced by a `rewrite`).
//! * `space::Space`: free space on the data directory's file system.
//! * `wal`: the log's files; `wal::Pool` (retired segments kept for
//!   reuse) and `wal::Preallocator` (the next segment, prepared ahead).
//!
//! `open` recovers and starts a store, `read` reads it; `stats` has its
//! figures.
//!
//! ## Lock order
//!
//! Every mutex of the store is a `rank::RankedMutex`: a thread takes a
//! lock only while every lock it holds has a lower rank. Debug builds
//! check it on every `lock()` (a thread-local list of the ranks held; a
//! violation panics naming both locks); release builds take plain mutexes.
//! From lowest to highest (the `Rank` constants below), with the part
//! that owns each, and what is taken under it (by calls to other parts,
//! each documented where it is made):
//!
//! 1. `LOG` (`LogWriter`): the log's writing end, held for a whole group
//!    commit, by the log writer thread or a caller committing alone.
//!    Under it: `STATE` (`Submission::take_alone`, `note_group`,
//!    `swap_for_places`), `SEGMENTS` and then `RECORDED`
//!    (`Checkpoints::enter`), `SPARE` (`wal::Writer` moving to the next
//!    segment), and its own `PLACED` and `DURABLE`.
//! 2. `STATE` (`Submission`), with the condition variables on which the
//!    log writer and the applier wait. Under it: its own `VOLATILE`. The
//!    one exception to the order: the log writer, holding `STATE`, *tries*
//!    `LOG` (`Submission::log_batch`; a `try_lock` cannot deadlock;
//!    taken, `LOG` then counts as held and `STATE` is let go before the
//!    batch is written).
//! 3. `VOLATILE` (`Submission`): values kept in memory only, a negative
//!    control's.
//! 4. `PLACED` (`LogWriter`): where the log writer put each payload.
//! 5. `DURABLE` (`LogWriter`): the durable lsn, with its condition
//!    variable.
//! 6. `RECORDED` (`Checkpoints`): what `CHECKPOINT` holds. Under it: its
//!    own `SEGMENTS`.
//! 7. `SEGMENTS` (`Checkpoints`): the log segments written since start.
//!    Under it: `LIVE` (`Payloads::sort_out`, a checkpoint's retirement).
//! 8. `SPARE` (`wal::Preallocator`): the prepared segment, with its
//!    condition variable.
//! 9. `LIVE` (`Payloads`): payload pointer counts per segment, pinned
//!    segments.
//! 10. `POOL` (`wal::Pool`: retired segments), `FILES` (`Payloads`:
//!     segment files open for payload reads), `REACHED` (`open::Reader`: a
//!     start's scan), `HOOK` (`Applier`, tests) and `THREADS`
//!     (`LocalBackend`: joined on close): taken with nothing of the
//!     store's held below them.
//!
//! The database handle (`db::Database`, a `RwLock`) is held only to clone
//! the handle, or by a rewrite to replace it, with no other lock held.

mod apply;
pub mod checkpoint;
mod db;
pub mod fsutil;
mod log;
mod memtable;
mod open;
pub(crate) mod payloads;
mod read;
mod rewrite;
mod space;
mod stats;
mod submit;
pub mod wal;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

pub(crate) use checkpoint::LoggedSegment;
pub(crate) use db::{open_db, read_sys};
pub use open::Reader;
pub(crate) use open::replay_into;

use super::backend::{Commit, CommitError, Committer};
use super::rank::{Rank, RankedMutex};
use super::{Backend, Result, StorageError, Store, StoreMetrics, Txn};

impl Rank {
    /// The log writer's end (`LogWriter`): held for a whole group commit.
    const LOG: Rank = Rank(10);
    /// The submission state (`Submission`: the memtable, the queue for
    /// the log).
    const STATE: Rank = Rank(20);
    /// Values kept in memory only (a negative control's).
    const VOLATILE: Rank = Rank(30);
    /// Where the log writer put each payload (`log::Placed`).
    const PLACED: Rank = Rank(40);
    /// The log's durable lsn.
    const DURABLE: Rank = Rank(50);
    /// What `CHECKPOINT` holds now.
    const RECORDED: Rank = Rank(60);
    /// The log segments written since start (`Checkpoints`).
    const SEGMENTS: Rank = Rank(70);
    /// The segment preallocator's prepared segment (`wal::Preallocator`).
    const SPARE: Rank = Rank(80);
    /// Payload pointer counts per segment, pinned segments.
    const LIVE: Rank = Rank(90);
    /// Retired segments kept for reuse (`wal::Pool`).
    const POOL: Rank = Rank(100);
    /// Segment files open for payload reads (`Payloads`).
    const FILES: Rank = Rank(110);
    /// The key a start's scan reached (`Reader`).
    const REACHED: Rank = Rank(120);
    /// Tests: the applier's hook after a freeze.
    #[cfg(test)]
    const HOOK: Rank = Rank(130);
    /// The store's threads, joined on close.
    const THREADS: Rank = Rank(140);
}

/// Tunables of the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Size of a log segment.
    pub segment_size: u64,
    /// How often durable changes are applied to the database.
    pub apply_interval: Duration,
    /// Apply early once the memtable holds this many bytes.
    pub apply_bytes: usize,
    /// Most bytes of durable changes not yet applied to the database:
    /// above it [`LocalBackend::room`] waits (publishers slow down to the pace
    /// of the database instead of piling changes up in memory).
    pub max_unapplied_bytes: usize,
    /// Most bytes of durable payloads the memtable keeps whole, the most
    /// recent ones (for consumers close behind the publishers); older ones
    /// are swapped for their places in the log (see `memtable::Slot`).
    pub recent_payload_bytes: usize,
    /// Longest time between checkpoints.
    pub checkpoint_interval: Duration,
    /// Checkpoint once this many log bytes were written since the last one.
    pub checkpoint_bytes: u64,
    /// sled's page cache size.
    pub cache_bytes: u64,
    /// Below this many free bytes on the data directory's file system,
    /// [`Store::has_space`] says no.
    pub min_free_bytes: u64,
    /// Rewrite the database once its files reach this size and are mostly
    /// free space (see `rewrite`); 0 never rewrites.
    pub rewrite_min_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            segment_size: 64 << 20,
            apply_interval: Duration::from_millis(500),
            apply_bytes: 64 << 20,
            max_unapplied_bytes: 256 << 20,
            recent_payload_bytes: 64 << 20,
            checkpoint_interval: Duration::from_secs(30),
            checkpoint_bytes: 128 << 20,
            cache_bytes: 256 << 20,
            min_free_bytes: 64 << 20,
            rewrite_min_bytes: 16 << 20,
        }
    }
}

/// What opening the store found and did.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    /// The lsn the database had applied before replay.
    pub applied_lsn: u64,
    /// Log records replayed into the database.
    pub replayed: u64,
    /// Time taken to open, replay and checkpoint.
    pub elapsed: Duration,
}

/// The parts of a running store (see the module doc), shared by the
/// backend and its two threads.
struct Shared {
    dir: PathBuf,
    opts: StoreOptions,
    db: db::Database,
    submission: submit::Submission,
    log: log::LogWriter,
    applier: apply::Applier,
    checkpoints: checkpoint::Checkpoints,
    payloads: payloads::Payloads,
    /// Retired log segments kept for reuse (shared with the log's
    /// writer).
    pool: Arc<wal::Pool>,
    space: space::Space,
    /// `Some(reason)` once the store has stopped for good.
    failure: watch::Sender<Option<String>>,
    counters: stats::Counters,
    metrics: StoreMetrics,
}

impl Shared {
    /// Stops the store for good after an I/O error: refuses every
    /// transaction waiting for the log and every later one, and wakes
    /// everything that waits.
    fn fail(&self, err: impl Into<CommitError>) {
        let err = err.into();
        let reason = err.to_string();
        tracing::error!(error = %reason, "storage failed; no further writes are accepted");
        let pending = self.submission.stop(Arc::clone(&err));
        log::refuse(pending, &err);
        self.failure.send_replace(Some(reason));
        self.submission.wake_all();
        self.log.wake_waiters();
    }

    fn failed(&self) -> bool {
        self.failure.borrow().is_some()
    }
}

/// The local backend's part in the commits its callers wait for: a
/// caller alone commits its own transaction (see `log::LogWriter`).
impl Committer for Shared {
    fn start(&self, lsn: u64) {
        self.log.announce(self, lsn);
    }

    fn alone(&self, lsn: u64) -> bool {
        self.submission.alone(lsn)
    }

    fn commit_alone(&self, lsn: u64) {
        self.log.commit_alone(self, lsn);
    }

    fn wait_durable(&self, lsn: u64) -> bool {
        self.log.wait_durable(self, lsn)
    }
}

/// The local backend: the log in front of sled, with the memtable, in one
/// data directory (the module doc has its durability contract). Opened by
/// [`Store::open`].
pub struct LocalBackend {
    shared: Arc<Shared>,
    threads: RankedMutex<Vec<std::thread::JoinHandle<()>>>,
    _lock: fsutil::DirLock,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("dir", &self.shared.dir)
            .finish()
    }
}

/// Size in bytes of the log record of a transaction.
pub fn txn_log_size(txn: &Txn) -> usize {
    wal::HEADER + wal::encoded_len(&txn.muts)
}

/// Why transactions are refused once the store is closed.
fn closed(reason: &str) -> CommitError {
    Arc::new(StorageError::Stopped {
        reason: reason.into(),
    })
}

impl LocalBackend {
    /// Tests: holds the log from a thread of its own, so that nothing
    /// submitted becomes durable, until `release` is sent to (or
    /// dropped); tells `held` once it holds it.
    #[cfg(test)]
    pub(crate) fn hold_log(
        &self,
        held: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    ) {
        let shared = Arc::clone(&self.shared);
        std::thread::spawn(move || {
            let log = shared.log.hold();
            let _ = held.send(());
            let _ = release.recv();
            drop(log);
            // The log writer may have found the log taken and gone back to
            // sleep with work pending.
            shared.submission.wake_log_writer();
        });
    }

    /// Tests: the next time the applier has frozen a generation and seen
    /// it durable, it tells `frozen` and then waits, with everything it
    /// froze still unapplied, until `release` is sent to (or dropped).
    #[cfg(test)]
    pub(crate) fn hold_applier(
        &self,
        frozen: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    ) {
        let mut once = Some((frozen, release));
        self.shared.applier.set_hook(Box::new(move || {
            if let Some((frozen, release)) = once.take() {
                let _ = frozen.send(());
                let _ = release.recv();
            }
        }));
    }

    /// Tests: applies what is durable now (see `apply::apply_once`).
    #[cfg(test)]
    pub(crate) fn apply_now(&self) -> Result<()> {
        apply::apply_once(&self.shared)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Waits while the changes not yet applied to the database are over
    /// `max_unapplied_bytes` (and wakes the applier). Publishers call it
    /// before they add messages, so a burst faster than the database can
    /// take is held up here rather than piled up in memory, where it
    /// would also lengthen a graceful stop and the replay after a crash.
    /// Returns at once once the store has stopped (the submit then fails).
    pub async fn room(&self) {
        let s = &self.shared;
        s.submission
            .room(|| s.failed(), &s.counters.room_waits)
            .await;
    }

    /// Distributions of the commit path since open.
    pub fn metrics(&self) -> &StoreMetrics {
        &self.shared.metrics
    }

    /// Stops taking transactions and waits for the threads: the log
    /// writer drains, the applier applies and checkpoints (`why`: the
    /// reason later submissions are given).
    fn stop(&self, why: &str) {
        self.shared.submission.close(closed(why));
        self.shared.submission.wake_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Store {
    /// Tests: see [`LocalBackend::hold_applier`].
    #[cfg(test)]
    pub(crate) fn hold_applier(
        &self,
        frozen: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
    ) {
        self.backend().hold_applier(frozen, release);
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.backend().dir()
    }

    /// Waits for room (see [`LocalBackend::room`]).
    pub async fn room(&self) {
        self.backend().room().await;
    }

    /// Distributions of the commit path since open.
    pub fn metrics(&self) -> &StoreMetrics {
        self.backend().metrics()
    }

    /// Stops like a crash: the log writer finishes what was submitted, but
    /// nothing more is applied to the database and no checkpoint runs.
    #[cfg(test)]
    pub(crate) fn crash(self) {
        self.backend().shared.applier.abandon();
        drop(self);
    }
}

impl Backend for LocalBackend {
    fn submit(&self, txn: Txn) -> Commit {
        let committer: Weak<dyn Committer> = Arc::downgrade(&self.shared) as Weak<Shared>;
        self.shared
            .submission
            .submit(txn, true)
            .with_committer(committer)
    }

    fn get(&self, k: &[u8]) -> Result<Option<Bytes>> {
        read::get(&self.shared, k)
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        read::scan(&self.shared, start, end, limit)
    }

    fn failure(&self) -> watch::Receiver<Option<String>> {
        self.shared.failure.subscribe()
    }

    fn close(&self) -> Result<()> {
        self.stop("store closed");
        match self.shared.failure.borrow().clone() {
            Some(reason) => Err(StorageError::Stopped { reason }),
            None => Ok(()),
        }
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        self.stop("store dropped");
        if self.shared.failed() {
            // Fail-stop: the disk is left as it is. Dropping sled would
            // flush it once more (and sled panics when that fails, e.g. on
            // a file system that turned read-only); the process exits and
            // the next start recovers from disk.
            std::mem::forget(Arc::clone(&self.shared));
        }
    }
}

#[cfg(test)]
mod apply_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
