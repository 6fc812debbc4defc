//! The local backend: our write-ahead log in front of sled, with the
//! memtable, in one data directory.
//!
//! ## Durability contract (the local backend)
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
//!   (the log writer swaps their bodies for their places; see `Slot`).
//! * A checkpoint flushes sled, fsyncs every file of the database and its
//!   directories (sled's flush syncs its data file only: not its blob
//!   files, nor the directory after a snapshot's rename), and then
//!   retires log segments whose records are all applied and to which no
//!   payload pointer refers (kept for reuse, see `wal::Pool`); segments kept
//!   only for a few old payloads are compacted.
//! * When the database's files are mostly free space (a deep queue
//!   drained), a checkpoint rewrites it into a new directory and makes that
//!   one current (see `rewrite`), giving the space back.
//! * Opening replays log records newer than the applied lsn into sled (a
//!   record is a set of absolute puts and deletes, so replay is
//!   idempotent), checkpoints, and starts a fresh log segment.
//! * An I/O error while logging, applying or checkpointing stops the store
//!   for good (fail-stop): the failed transaction and every later one get
//!   an error, nothing is retried, and [`Store::failure`] reports it so the
//!   process can exit and recover from disk.
//!
//! ## Lock order
//!
//! Every mutex of the store is a `rank::RankedMutex`: a thread takes a
//! lock only while every lock it holds has a lower rank. Debug builds
//! check it on every `lock()` (a thread-local list of the ranks held; a
//! violation panics naming both locks); release builds take plain mutexes.
//! From lowest to highest (`rank::Rank`):
//!
//! 1. `LOG` (`LogState`, the log writer's end): held for a whole group
//!    commit, by the log writer thread or a caller committing alone.
//!    Under it: `STATE` (the quiet test, swapping bodies for places),
//!    `PLACED`, `DURABLE`, and in `wal::Writer` `SEGMENTS` and `SPARE`.
//! 2. `STATE` (`State`: the memtable, the next lsn, the transactions
//!    waiting for the log, `closed`), with the condition variables
//!    `commit_cv` (the log writer waits on it) and `apply_cv` (the
//!    applier). Under it: `VOLATILE`. The one exception to the order: the
//!    log writer, holding `STATE`, *tries* `LOG` (a `try_lock`, which
//!    cannot deadlock; taken, `LOG` then counts as held and `STATE` is let
//!    go before the batch is written).
//! 3. `VOLATILE` (values kept in memory only, a negative control's).
//! 4. `PLACED` (where the log writer put each payload).
//! 5. `DURABLE` (the durable lsn), with `durable_cv`. Under it: `LIVE`
//!    (the figures of [`Store::stats`]).
//! 6. `RECORDED` (what `CHECKPOINT` holds). Under it: `SEGMENTS`.
//! 7. `SEGMENTS` (the log segments written since start, shared with
//!    `wal::Writer`). Under it: `LIVE` (a checkpoint's retirement).
//! 8. `SPARE` (`wal::Preallocator`'s prepared segment), with its
//!    condition variable.
//! 9. `LIVE` (payload pointer counts per segment, pinned segments).
//! 10. `POOL` (`wal::Pool`'s retired segments), `FILES` (segment files
//!     open for payload reads), `REACHED` (a start's scan), `HOOK`
//!     (tests) and `THREADS` (joined on close): taken with nothing of the
//!     store's held below them.
//!
//! The database handle (`Inner::db`, a `RwLock`) is held only to clone the
//! handle, or by a rewrite to replace it, with no other lock held.

mod apply;
pub mod fsutil;
mod log;
mod memtable;
mod open;
pub(crate) mod payloads;
mod rewrite;
mod space;
mod stats;
pub mod wal;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use log::{LogState, Placed};
use memtable::State;
pub use open::Reader;
pub(crate) use open::{open_db, read_sys, replay_into};

use super::backend::{Commit, CommitError, Committer};
use super::{Backend, Key, OwnedKey, Result, StorageError, Store, StoreMetrics, SysKey, Txn};
use super::{keys, records};
use crate::faults::{self, Fault};
use crate::storage::rank::{RankedCondvar, RankedGuard, RankedMutex};

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
    /// are swapped for their places in the log (see `Slot`).
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

/// The database the store reads and applies to, and its directory.
struct Database {
    db: sled::Db,
    path: PathBuf,
}

/// The store's shared state, by the part that owns it (see the module
/// doc's lock order for the mutexes).
struct Inner {
    dir: PathBuf,
    opts: StoreOptions,

    // The database (`open`, `apply`, `rewrite`).
    /// Replaced only by a rewrite (see `rewrite`), by the applier thread,
    /// the only one that writes the database.
    db: RwLock<Database>,
    /// Size of the database's files after the last rewrite: the next one
    /// waits until they have grown well past it.
    rewritten_bytes: AtomicU64,

    // The memtable and the queue for the log (`memtable`, `commit`).
    state: RankedMutex<State>,
    /// `active_bytes` + `frozen_bytes`, read without the state lock.
    unapplied: AtomicUsize,
    /// Memtable generations frozen so far (the log writer's list of
    /// recent payloads only concerns the active one).
    generations: AtomicU64,
    /// Negative control ([`Fault::NoDeliveryCount`]): values kept in
    /// memory only. Always empty without that fault.
    volatile: RankedMutex<HashMap<Bytes, Bytes>>,

    // The log writer and group commit (`commit`).
    /// Wakes the log writer when `pending` gets work, or when a caller
    /// that committed alone leaves work behind.
    commit_cv: RankedCondvar,
    log: RankedMutex<LogState>,
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
    durable: RankedMutex<u64>,
    durable_cv: RankedCondvar,
    /// Where the log writer put each payload value: key → (lsn, place).
    placed: RankedMutex<Placed>,
    /// (segment number, lsn of its first record) of the segments written
    /// since start, shared with the log's writer.
    segments: Arc<RankedMutex<Vec<(u64, u64)>>>,

    // The applier and checkpoints (`apply`).
    /// Wakes the applier (memtable full, close, a publisher waiting for
    /// room).
    apply_cv: RankedCondvar,
    /// Told when the applier has applied a generation (room for
    /// publishers) or the store stopped.
    room: tokio::sync::Notify,
    applied: AtomicU64,
    /// The segment the log began in at this start (before its first
    /// record, it is where the log goes on).
    start_segment: u64,
    /// What `CHECKPOINT` holds now (the applier's to write).
    recorded: RankedMutex<fsutil::Checkpoint>,
    pool: Arc<wal::Pool>,
    /// Payload pointers per segment; pinned segments.
    live: RankedMutex<payloads::Live>,
    /// Segment files open for payload reads.
    files: payloads::Files,
    /// Set to stop without a final apply and checkpoint (a simulated
    /// crash, for tests).
    abandon: AtomicBool,
    /// Tests: run by the applier once a frozen generation is durable,
    /// before it takes the payload places (see [`Store::hold_applier`]).
    #[cfg(test)]
    after_freeze: RankedMutex<Option<Box<dyn FnMut() + Send>>>,

    // Failure, free space, figures (`space`, `stats`).
    failure: watch::Sender<Option<String>>,
    space: space::Space,
    counters: stats::Counters,
    metrics: StoreMetrics,
}

/// The local backend: the log in front of sled, with the memtable, in one
/// data directory (the module doc has its durability contract). Opened by
/// [`Store::open`].
pub struct LocalBackend {
    inner: Arc<Inner>,
    threads: RankedMutex<Vec<std::thread::JoinHandle<()>>>,
    _lock: fsutil::DirLock,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBackend")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

/// Why transactions are refused once the store is closed.
fn closed(reason: &str) -> CommitError {
    Arc::new(StorageError::Stopped {
        reason: reason.into(),
    })
}

/// Takes a ranked mutex (see [`RankedMutex::lock`]).
fn lock<T>(m: &RankedMutex<T>) -> RankedGuard<'_, T> {
    m.lock()
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
        let inner = Arc::clone(&self.inner);
        std::thread::spawn(move || {
            let log = inner.log.lock();
            let _ = held.send(());
            let _ = release.recv();
            drop(log);
            // The log writer may have found the log taken and gone back to
            // sleep with work pending.
            inner.commit_cv.notify_one();
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
        *lock(&self.inner.after_freeze) = Some(Box::new(move || {
            if let Some((frozen, release)) = once.take() {
                let _ = frozen.send(());
                let _ = release.recv();
            }
        }));
    }

    /// Tests: applies what is durable now (see `apply::apply_once`).
    #[cfg(test)]
    pub(crate) fn apply_now(&self) -> Result<()> {
        apply::apply_once(&self.inner)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Waits while the changes not yet applied to the database are over
    /// `max_unapplied_bytes` (and wakes the applier). Publishers call it
    /// before they add messages, so a burst faster than the database can
    /// take is held up here rather than piled up in memory, where it
    /// would also lengthen a graceful stop and the replay after a crash.
    /// Returns at once once the store has stopped (the submit then fails).
    pub async fn room(&self) {
        let i = &self.inner;
        if !i.room_wanted() {
            // The common case, without registering with the `Notify`.
            return;
        }
        let mut counted = false;
        loop {
            let notified = i.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !i.room_wanted() || i.failed() || lock(&i.state).closed.is_some() {
                return;
            }
            if !counted {
                counted = true;
                i.counters.room_waits.fetch_add(1, Ordering::Relaxed);
            }
            i.apply_cv.notify_one();
            notified.await;
        }
    }

    /// Distributions of the commit path since open.
    pub fn metrics(&self) -> &StoreMetrics {
        &self.inner.metrics
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
        self.backend.hold_applier(frozen, release);
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.backend.dir()
    }

    /// Waits for room (see [`LocalBackend::room`]).
    pub async fn room(&self) {
        self.backend.room().await;
    }

    /// Distributions of the commit path since open.
    pub fn metrics(&self) -> &StoreMetrics {
        self.backend.metrics()
    }

    /// Stops like a crash: the log writer finishes what was submitted, but
    /// nothing more is applied to the database and no checkpoint runs.
    #[cfg(test)]
    pub(crate) fn crash(self) {
        self.backend.inner.abandon.store(true, Ordering::Relaxed);
        drop(self);
    }
}

impl Backend for LocalBackend {
    fn submit(&self, txn: Txn) -> Commit {
        let committer: Weak<dyn Committer> = Arc::downgrade(&self.inner) as Weak<Inner>;
        self.inner.submit(txn, true).with_committer(committer)
    }

    fn get(&self, k: &[u8]) -> Result<Option<Bytes>> {
        if faults::on(Fault::NoDeliveryCount)
            && let Some(v) = lock(&self.inner.volatile).get(k)
        {
            return Ok(Some(v.clone()));
        }
        let slot = lock(&self.inner.state).lookup(k);
        match slot {
            Some((Some(v), placed)) => return self.inner.mem_value(v, placed).map(Some),
            Some((None, _)) => return Ok(None),
            None => {}
        }
        let v = self.inner.db().get(k).map_err(|e| self.inner.db_error(e))?;
        match v {
            None => Ok(None),
            Some(iv) => self.inner.db_value(k, &iv).map(Some),
        }
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner.scan(start, end, limit)
    }

    fn failure(&self) -> watch::Receiver<Option<String>> {
        self.inner.failure.subscribe()
    }

    fn close(&self) -> Result<()> {
        {
            let mut st = lock(&self.inner.state);
            if st.closed.is_none() {
                st.closed = Some(closed("store closed"));
            }
        }
        self.inner.commit_cv.notify_all();
        self.inner.apply_cv.notify_all();
        self.inner.room.notify_waiters();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        match self.inner.failure.borrow().clone() {
            Some(reason) => Err(StorageError::Stopped { reason }),
            None => Ok(()),
        }
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        let mut st = lock(&self.inner.state);
        if st.closed.is_none() {
            st.closed = Some(closed("store dropped"));
        }
        drop(st);
        self.inner.commit_cv.notify_all();
        self.inner.apply_cv.notify_all();
        self.inner.room.notify_waiters();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        if self.inner.failed() {
            // Fail-stop: the disk is left as it is. Dropping sled would
            // flush it once more (and sled panics when that fails, e.g. on
            // a file system that turned read-only); the process exits and
            // the next start recovers from disk.
            std::mem::forget(Arc::clone(&self.inner));
        }
    }
}

impl Inner {
    /// The current database (a handle: cheap to clone).
    fn db(&self) -> sled::Db {
        self.db.read().unwrap_or_else(|e| e.into_inner()).db.clone()
    }

    /// The current database's directory.
    fn db_path(&self) -> PathBuf {
        self.db
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .path
            .clone()
    }

    fn db_error(&self, e: sled::Error) -> StorageError {
        StorageError::db(&self.db_path())(e)
    }

    /// A memtable value as read: the payload itself when the slot holds
    /// its place in the log (`placed`).
    fn mem_value(&self, v: Bytes, placed: bool) -> Result<Bytes> {
        if !placed {
            return Ok(v);
        }
        let loc = payloads::Loc::decode(&v).ok_or_else(|| {
            StorageError::corrupt(
                self.dir.display().to_string(),
                "a payload's place in the log does not decode",
            )
        })?;
        self.files.read(loc)
    }

    /// A database value of key `k` as read: the payload itself when the
    /// database holds its place in the log.
    fn db_value(&self, k: &[u8], iv: &[u8]) -> Result<Bytes> {
        match payloads::Loc::decode(iv).filter(|_| payloads::located(k)) {
            Some(loc) => self.files.read(loc),
            None => Ok(Bytes::copy_from_slice(iv)),
        }
    }

    /// See [`Backend::scan`]: the memtable's changes in the range merged
    /// over the database's entries.
    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        // The memtable first, then the database (as `get` reads them): a
        // generation the applier puts into the database meanwhile is read
        // from the memtable's copy.
        let over = memtable::changes_in(&lock(&self.state), start, end);
        let mut over = over.into_iter().peekable();
        let db = self.db();
        let items = match end {
            Some(end) => db.range::<&[u8], _>(start..end),
            None => db.range::<&[u8], _>(start..),
        };
        // Takes a memtable change: false once the page is full.
        let take = |out: &mut Vec<(Bytes, Bytes)>, k: Bytes, v: Option<Bytes>, placed: bool| {
            if let Some(v) = v {
                out.push((k, self.mem_value(v, placed)?));
            }
            Ok::<bool, StorageError>(out.len() < limit)
        };
        for item in items {
            let (k, iv) = item.map_err(|e| self.db_error(e))?;
            while let Some((mk, _)) = over.peek()
                && mk.as_ref() < k.as_ref()
            {
                if let Some((mk, (v, placed))) = over.next()
                    && !take(&mut out, mk, v, placed)?
                {
                    return Ok(out);
                }
            }
            if over.peek().is_some_and(|(mk, _)| mk.as_ref() == k.as_ref()) {
                if let Some((mk, (v, placed))) = over.next()
                    && !take(&mut out, mk, v, placed)?
                {
                    return Ok(out);
                }
                continue;
            }
            out.push((Bytes::copy_from_slice(&k), self.db_value(&k, &iv)?));
            if out.len() >= limit {
                return Ok(out);
            }
        }
        for (mk, (v, placed)) in over {
            if !take(&mut out, mk, v, placed)? {
                break;
            }
        }
        Ok(out)
    }

    /// Stops the store for good after an I/O error.
    fn fail(&self, err: impl Into<CommitError>) {
        let err = err.into();
        let reason = err.to_string();
        tracing::error!(error = %reason, "storage failed; no further writes are accepted");
        let pending = {
            let mut st = lock(&self.state);
            st.closed = Some(Arc::clone(&err));
            std::mem::take(&mut st.pending)
        };
        log::refuse(pending, &err);
        self.failure.send_replace(Some(reason));
        self.commit_cv.notify_all();
        self.apply_cv.notify_all();
        self.durable_cv.notify_all();
        self.room.notify_waiters();
    }

    fn failed(&self) -> bool {
        self.failure.borrow().is_some()
    }

    /// True while changes waiting for the database are over the bound
    /// (publishers wait in [`LocalBackend::room`]).
    fn room_wanted(&self) -> bool {
        self.unapplied.load(Ordering::Relaxed) >= self.opts.max_unapplied_bytes
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
