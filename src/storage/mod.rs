//! Durable storage: our write-ahead log in front of sled.
//!
//! The only module that names `sled`. It makes no policy decision and
//! reads no clock: it stores what the queue engine tells it to, in the
//! order it is told, and says when each change is durable.
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

mod error;
pub mod fsutil;
pub mod keys;
mod payloads;
mod rank;
pub mod records;
mod rewrite;
pub mod verify;
pub mod wal;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{oneshot, watch};

pub use error::{Result, StorageError};
pub use keys::{Key, OwnedKey, Space, SysKey};
use records::{
    CountersRecord, DedupRecord, ExchangeRecord, GroupRecord, MetaRecord, PayloadRecord,
    QueueRecord,
};
pub use wal::Mutation;

use crate::faults::{self, Fault};
use rank::{Rank, RankedCondvar, RankedGuard, RankedMutex};

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
    /// above it [`Store::room`] waits (publishers slow down to the pace
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

/// Figures of the store since it was opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    /// `fdatasync` calls on the log (one per group commit).
    pub log_syncs: u64,
    /// Group commits made by the caller waiting for them, alone (its
    /// transaction, with at most one queued just before it), instead of
    /// the log writer thread (see [`Commit::wait`]).
    pub caller_commits: u64,
    /// Log records (transactions) made durable.
    pub records: u64,
    /// Bytes written to the log.
    pub log_bytes: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Highest durable lsn.
    pub durable_lsn: u64,
    /// Highest lsn applied to the database.
    pub applied_lsn: u64,
    /// Total microseconds spent in log write + fdatasync.
    pub sync_micros: u64,
    /// Log segments kept only for the payloads they hold.
    pub pinned_segments: u64,
    /// Payloads compacted (moved to a newer segment).
    pub relocated: u64,
    /// Writes the applier left out of the database because a later delete
    /// of the same key was already durable (the applier's `overtaken`).
    pub overtaken: u64,
    /// Database rewrites (space given back to the file system).
    pub rewrites: u64,
    /// Bytes of submitted changes not yet applied to the database.
    pub unapplied_bytes: u64,
    /// Times [`Store::room`] had to wait for the database to catch up.
    pub room_waits: u64,
}

/// A transaction under construction: puts and deletes applied atomically.
#[derive(Debug, Default)]
pub struct Txn {
    muts: Vec<Mutation>,
    /// Negative control ([`Fault::NoDeliveryCount`]): puts kept in memory
    /// only. Always empty without that fault.
    volatile: Vec<(Bytes, Bytes)>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        if faults::on(Fault::NoDeliveryCount) && !self.volatile.is_empty() {
            return false;
        }
        self.muts.is_empty()
    }

    /// Negative control ([`Fault::NoDeliveryCount`]): a message's state
    /// kept in memory only (never logged), until a later transaction
    /// writes or deletes the key. Called only under that fault.
    pub(crate) fn put_meta_unlogged(&mut self, qid: u32, pos: u64, rec: &MetaRecord) {
        self.volatile
            .push((Key::Meta(qid, pos).encode(), records::encode(rec)));
    }

    fn put(&mut self, key: Key<'_>, value: Bytes) {
        self.muts.push(Mutation {
            key: key.encode(),
            value: Some(value),
            fresh: false,
            if_exists: false,
        });
    }

    /// A put of a key that never existed before (see [`Mutation::fresh`]).
    fn put_fresh(&mut self, key: Key<'_>, value: Bytes) {
        self.muts.push(Mutation {
            key: key.encode(),
            value: Some(value),
            fresh: true,
            if_exists: false,
        });
    }

    fn put_record<T: Serialize>(&mut self, key: Key<'_>, value: &T) {
        self.put(key, records::encode(value));
    }

    /// A message's state as this transaction, not yet submitted, leaves
    /// it: `Some(None)` if it deletes the message, `None` if it does not
    /// touch it (the store then holds the current state).
    pub fn pending_meta(&self, qid: u32, pos: u64) -> Result<Option<Option<MetaRecord>>> {
        let key = Key::Meta(qid, pos).encode();
        let Some(m) = self.muts.iter().rev().find(|m| m.key == key) else {
            return Ok(None);
        };
        match &m.value {
            None => Ok(Some(None)),
            Some(bytes) => {
                records::decode(&format_args!("message {qid}/{pos}"), bytes).map(|r| Some(Some(r)))
            }
        }
    }

    /// Deletes a key.
    pub fn delete(&mut self, key: Key<'_>) {
        self.muts.push(Mutation::delete(key.encode()));
    }

    /// Stores a system value.
    pub fn put_sys(&mut self, key: SysKey, value: u64) {
        self.put(Key::Sys(key), Bytes::copy_from_slice(&value.to_be_bytes()));
    }

    /// Stores a queue's configuration.
    pub fn put_queue(&mut self, name: &str, rec: &QueueRecord) {
        self.put_record(Key::Queue(name), rec);
    }

    /// Stores a queue's counters.
    pub fn put_counters(&mut self, qid: u32, rec: &CountersRecord) {
        self.put_record(Key::Counters(qid), rec);
    }

    /// Stores a message's state.
    pub fn put_meta(&mut self, qid: u32, pos: u64, rec: &MetaRecord) {
        self.put_record(Key::Meta(qid, pos), rec);
    }

    /// Stores the state of a message at a position never used before.
    pub fn put_new_meta(&mut self, qid: u32, pos: u64, rec: &MetaRecord) {
        self.put_fresh(Key::Meta(qid, pos), records::encode(rec));
    }

    /// Stores a new payload, already encoded with [`encode_payload`]
    /// (payload numbers are never reused).
    pub fn put_payload(&mut self, pid: u64, encoded: Bytes) {
        self.put_fresh(Key::Payload(pid), encoded);
    }

    /// Logs a payload again, to be stored only if it still exists when
    /// applied (compaction).
    fn relocate(&mut self, key: Bytes, value: Bytes) {
        self.muts.push(Mutation {
            key,
            value: Some(value),
            fresh: false,
            if_exists: true,
        });
    }

    /// Stores a dedup entry.
    pub fn put_dedup(&mut self, qid: u32, key: &[u8], rec: &DedupRecord) {
        self.put_record(Key::Dedup(qid, key), rec);
    }

    /// Stores an exchange.
    pub fn put_exchange(&mut self, name: &str, rec: &ExchangeRecord) {
        self.put_record(Key::Exchange(name), rec);
    }

    /// Stores a group's state.
    pub fn put_group(&mut self, qid: u32, group: &str, rec: &GroupRecord) {
        self.put_record(Key::Group(qid, group), rec);
    }
}

/// Encodes a payload (outside any lock; it can be large).
pub fn encode_payload(rec: &PayloadRecord) -> Bytes {
    records::encode(rec)
}

/// Size in bytes of the log record of a transaction.
pub fn txn_log_size(txn: &Txn) -> usize {
    wal::HEADER + wal::encoded_len(&txn.muts)
}

/// A submitted transaction; [`Commit::wait`] resolves when it is durable.
#[derive(Debug)]
pub struct Commit {
    lsn: u64,
    rx: std::result::Result<oneshot::Receiver<std::result::Result<(), String>>, String>,
    /// The store, for [`Commit::wait`] to commit the transaction itself.
    store: Weak<Inner>,
    /// The log writer was not woken for it: waiting for it (or dropping
    /// it) must either commit it or wake the log writer.
    unannounced: bool,
}

impl Commit {
    /// The transaction's log sequence number.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// Has the transaction written without waiting for [`Commit::wait`]:
    /// for a caller with work to do first (reading the payloads of the
    /// messages it leased), which the write then overlaps.
    pub fn start(&mut self) {
        if self.unannounced {
            self.unannounced = false;
            if let Some(inner) = self.store.upgrade() {
                inner.announce(self.lsn);
            }
        }
    }

    /// Waits until the transaction is durable. When it is the last one
    /// waiting for the log (with at most one before it, see `alone_in`) and
    /// callers have been coming one at a time, the caller writes and syncs
    /// them itself instead of handing them to the log writer thread and
    /// being woken by it (on tokio's multi-thread runtime with two workers
    /// or more: it blocks its worker meanwhile).
    pub async fn wait(mut self) -> Result<()> {
        let rx = std::mem::replace(&mut self.rx, Err(String::new()));
        if self.unannounced {
            if let Some(inner) = self.store.upgrade() {
                if inner.alone(self.lsn) {
                    // Calls already received get their turn first (tokio
                    // polls for I/O before resuming a task that yielded):
                    // if they submit, this one is no longer alone.
                    tokio::task::yield_now().await;
                    inner.commit_alone(self.lsn);
                }
                inner.announce(self.lsn);
            }
            self.unannounced = false;
        }
        match rx {
            Ok(rx) => match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(reason)) => Err(StorageError::Stopped { reason }),
                Err(_) => Err(StorageError::Stopped {
                    reason: "the log writer stopped".into(),
                }),
            },
            Err(reason) => Err(StorageError::Stopped { reason }),
        }
    }
}

impl Drop for Commit {
    /// A commit not waited for (or whose wait was cancelled) is the log
    /// writer's to make.
    fn drop(&mut self) {
        if self.unannounced
            && let Some(inner) = self.store.upgrade()
        {
            inner.announce(self.lsn);
        }
    }
}

/// A memtable slot: the latest value of a key (`None`: deleted), the lsn
/// of the record that wrote it, whether the key did not exist before this
/// generation of the memtable, whether the put applies only if the key
/// exists then (a payload relocation), and whether `value` is no longer
/// the payload itself but its place in the log ([`payloads::Loc`]): the
/// log writer keeps the most recent durable payloads whole (up to
/// [`StoreOptions::recent_payload_bytes`], for consumers close behind) and
/// swaps older ones for their places, so their memory goes back long
/// before the applier has taken the generation; reads of them take the
/// body from the log, as they do once the database holds the place.
#[derive(Debug, Clone)]
struct Slot {
    value: Option<Bytes>,
    lsn: u64,
    fresh: bool,
    if_exists: bool,
    placed: bool,
}

/// Keyed by encoded keys, which the store itself mostly makes (message
/// positions); hashed with foldhash, seeded per table: every submitted
/// change is hashed here, and with SipHash, inserting into this table
/// (hashing, growing) was about 7 % of the server's CPU samples during
/// batched publishing.
type Memtable = HashMap<Bytes, Slot, foldhash::fast::RandomState>;

/// Where the log writer put each payload value: key → (lsn, place). One
/// insert per published message, by the log writer; hashed like the
/// memtable.
type Placed = HashMap<Bytes, (u64, payloads::Loc), foldhash::fast::RandomState>;

struct Pending {
    lsn: u64,
    submitted: Instant,
    muts: Vec<Mutation>,
    done: oneshot::Sender<std::result::Result<(), String>>,
    /// Submitted after a quiet commit, without waking the log writer.
    unannounced: bool,
}

/// The writing end of the log and what is kept from one group commit to
/// the next. Whoever holds it writes: the log writer thread, or a caller
/// committing its own transaction ([`Inner::commit_alone`]). Pending
/// transactions are taken from [`State::pending`] only while holding it,
/// so batches reach the log in lsn order.
struct LogState {
    writer: wal::Writer,
    frames: Vec<u8>,
    bounds: Vec<(usize, u64)>,
    /// Durable payloads of the active memtable still whole as far as the
    /// log writer knows, oldest first, and their bytes (an overestimate:
    /// some were deleted or written again since, which their turn finds
    /// out). Emptied when the applier freezes the memtable: a frozen
    /// generation keeps its bodies until it is applied.
    recent: VecDeque<(Bytes, u64, payloads::Loc)>,
    recent_bytes: usize,
    /// The memtable generation `recent` belongs to.
    generation: u64,
    /// A write failed: nothing more is written.
    stopped: bool,
}

struct State {
    next_lsn: u64,
    /// Submitted changes not yet frozen for application.
    active: Memtable,
    active_bytes: usize,
    /// A delete was submitted since the freeze (the applier looks for
    /// puts it overtook only then, see [`overtaken`]).
    active_deletes: bool,
    /// Changes being applied to sled; still read until they are.
    frozen: Option<Arc<Memtable>>,
    /// `active_bytes` of the frozen memtable when it was frozen.
    frozen_bytes: usize,
    /// Transactions waiting for the log writer.
    pending: Vec<Pending>,
    /// Set on close or failure: no more submissions.
    closed: Option<String>,
}

/// The database the store reads and applies to, and its directory.
struct Database {
    db: sled::Db,
    path: PathBuf,
}

struct Inner {
    dir: PathBuf,
    /// Replaced only by a rewrite (see `rewrite`), by the applier thread,
    /// the only one that writes the database.
    db: RwLock<Database>,
    /// Size of the database's files after the last rewrite: the next one
    /// waits until they have grown well past it.
    rewritten_bytes: AtomicU64,
    rewrites: AtomicU64,
    opts: StoreOptions,
    state: RankedMutex<State>,
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
    /// Wakes the applier (memtable full, close, a publisher waiting for
    /// room).
    apply_cv: RankedCondvar,
    /// `active_bytes` + `frozen_bytes`, read without the state lock.
    unapplied: AtomicUsize,
    /// Told when the applier has applied a generation (room for
    /// publishers) or the store stopped.
    room: tokio::sync::Notify,
    room_waits: AtomicU64,
    durable: RankedMutex<u64>,
    durable_cv: RankedCondvar,
    failure: watch::Sender<Option<String>>,
    space_ok: AtomicBool,
    /// False while free space is below the hard floor (a quarter of the
    /// minimum): then acks, nacks and receives are refused too.
    floor_ok: AtomicBool,
    /// `log_bytes` when free space was last checked from the publish path.
    space_checked_bytes: AtomicU64,
    /// Free bytes on the data directory's file system at the last check
    /// (`u64::MAX` until one succeeded).
    free_bytes: AtomicU64,
    /// Set to stop without a final apply and checkpoint (a simulated
    /// crash, for tests).
    abandon: AtomicBool,
    log_syncs: AtomicU64,
    caller_commits: AtomicU64,
    records: AtomicU64,
    log_bytes: AtomicU64,
    checkpoints: AtomicU64,
    applied: AtomicU64,
    /// Memtable generations frozen so far (the log writer's list of
    /// recent payloads only concerns the active one).
    generations: AtomicU64,
    sync_micros: AtomicU64,
    segments: Arc<RankedMutex<Vec<(u64, u64)>>>,
    /// The segment the log began in at this start (before its first
    /// record, it is where the log goes on).
    start_segment: u64,
    /// What `CHECKPOINT` holds now (the applier's to write).
    recorded: RankedMutex<fsutil::Checkpoint>,
    pool: Arc<wal::Pool>,
    /// Where the log writer put each payload value: key → (lsn, place).
    placed: RankedMutex<Placed>,
    /// Payload pointers per segment; pinned segments.
    live: RankedMutex<payloads::Live>,
    /// Segment files open for payload reads.
    files: payloads::Files,
    relocated: AtomicU64,
    overtaken: AtomicU64,
    metrics: StoreMetrics,
    /// Negative control ([`Fault::NoDeliveryCount`]): values kept in
    /// memory only. Always empty without that fault.
    volatile: RankedMutex<HashMap<Bytes, Bytes>>,
    /// Tests: run by the applier once a frozen generation is durable,
    /// before it takes the payload places (see [`Store::hold_applier`]).
    #[cfg(test)]
    after_freeze: RankedMutex<Option<Box<dyn FnMut() + Send>>>,
}

/// Distributions of the commit path, for the metrics endpoint.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    /// Seconds from a transaction's submission to its durability.
    pub commit_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Seconds of each group commit's write and `fdatasync`.
    pub sync_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Transactions made durable by each `fdatasync`.
    pub batch_records: prometheus_client::metrics::histogram::Histogram,
    /// Seconds of each application of a memtable generation to the
    /// database.
    pub apply_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl StoreMetrics {
    fn new() -> StoreMetrics {
        use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
        StoreMetrics {
            // 50 µs to about 3.3 s.
            commit_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 17)),
            sync_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 17)),
            // 1 to 4096.
            batch_records: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            // 1 ms to about 65 s.
            apply_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 17)),
        }
    }
}

/// The durable store of one data directory.
pub struct Store {
    inner: Arc<Inner>,
    threads: RankedMutex<Vec<std::thread::JoinHandle<()>>>,
    _lock: fsutil::DirLock,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

/// The database as the log's replay left it, read while a store opens
/// ([`Store::open_with`]) or before its first submission.
pub struct Reader {
    db: sled::Db,
    path: PathBuf,
    /// A recent key a scan reached (see [`warm_metas`]).
    reached: RankedMutex<Vec<u8>>,
}

impl Reader {
    /// Iterates the keys of one space with decoded values.
    pub fn scan<T: serde::de::DeserializeOwned>(
        &self,
        space: Space,
    ) -> impl Iterator<Item = Result<(OwnedKey, T)>> + '_ {
        let mut n = 0u32;
        self.db.scan_prefix(space.prefix()).map(move |item| {
            let (k, v) = item.map_err(StorageError::db(&self.path))?;
            n = n.wrapping_add(1);
            if n.is_multiple_of(WARM_STEP) {
                let mut reached = lock(&self.reached);
                reached.clear();
                reached.extend_from_slice(&k);
            }
            let key = OwnedKey::decode(&k)
                .ok_or_else(|| StorageError::corrupt(format!("key {k:?}"), "malformed key"))?;
            let value = records::decode(&records::Lazy(&key), &v)?;
            Ok((key, value))
        })
    }

    /// Reads a system value.
    pub fn get_sys(&self, key: SysKey) -> Result<Option<u64>> {
        read_sys(&self.db, key, &self.path)
    }
}

/// Items between two looks at the other thread's progress.
const WARM_STEP: u32 = 256;

/// Reads the message records backwards from the last, until it meets the
/// key the forward scan of `reader` reached: the pages that scan is going
/// to need come into sled's cache from this thread (a page read from the
/// file and decoded is most of a scan's cost).
fn warm_metas(reader: &Reader) {
    let mut n = 0u32;
    for item in reader.db.scan_prefix([keys::TAG_META]).rev() {
        let Ok((k, _)) = item else { return };
        n = n.wrapping_add(1);
        if n.is_multiple_of(WARM_STEP) && lock(&reader.reached).as_slice() >= k.as_ref() {
            return;
        }
    }
}

/// Live payload pointers per log segment, and the furthest byte a pointer
/// reaches in each.
fn count_payloads(db: &sled::Db, db_dir: &Path) -> Result<(payloads::Live, HashMap<u64, u64>)> {
    let mut live = payloads::Live::default();
    let mut reach: HashMap<u64, u64> = HashMap::new();
    for item in db.scan_prefix([keys::TAG_PAYLOAD]) {
        let (_, v) = item.map_err(StorageError::db(db_dir))?;
        if let Some(loc) = payloads::Loc::decode(&v) {
            live.add(loc.seg);
            let end = reach.entry(loc.seg).or_default();
            *end = (*end).max(loc.off + u64::from(loc.len));
        }
    }
    Ok((live, reach))
}

/// Takes a ranked mutex (see [`RankedMutex::lock`]).
fn lock<T>(m: &RankedMutex<T>) -> RankedGuard<'_, T> {
    m.lock()
}

impl Store {
    /// Opens (or creates) the data directory: takes its lock, checks its
    /// format, replays the log into the database, checkpoints, and starts
    /// the log writer and the applier.
    pub fn open(dir: &Path, opts: StoreOptions) -> Result<(Store, OpenReport)> {
        let (store, report, ()) = Store::open_with(dir, opts, |_| ())?;
        Ok((store, report))
    }

    /// [`Store::open`], running `load` on the database once the log is
    /// replayed into it, on a thread of its own while the store counts its
    /// payload pointers (the two full scans of a start overlap), and
    /// returning what it returned. `load` sees the database as the replay
    /// left it; nothing is submitted before it returns.
    pub fn open_with<T, F>(
        dir: &Path,
        opts: StoreOptions,
        load: F,
    ) -> Result<(Store, OpenReport, T)>
    where
        T: Send,
        F: FnOnce(&Reader) -> T + Send,
    {
        let started = Instant::now();
        fsutil::create_private_dir(dir)?;
        let dir_lock = fsutil::lock_dir(dir)?;
        let mut fresh = fsutil::check_or_init_format(dir)?;
        let db_dir = fsutil::current_database(dir)?;
        let wal_dir = dir.join("wal");
        if !fresh && fsutil::first_start_unfinished(dir, &wal_dir)? {
            // What a database directory holds then was never made durable
            // as a whole (sled's files can be empty or cut short): it goes,
            // and the start proceeds as the first one.
            tracing::warn!(
                path = %dir.display(),
                "the first start of this data directory was cut short before it finished: initializing it again (nothing in it was ever acknowledged)"
            );
            if db_dir.exists() {
                std::fs::remove_dir_all(&db_dir)
                    .map_err(|e| StorageError::io("remove", &db_dir, e))?;
                fsutil::sync_dir(dir)?;
            }
            fresh = true;
        }
        if !fresh && !db_dir.join("db").exists() {
            return Err(StorageError::corrupt(
                db_dir.display().to_string(),
                "the database is missing, but FORMAT says this directory holds data: refusing to start empty",
            ));
        }
        // A rewrite that a crash interrupted: the database it was writing
        // never became current, or the one it replaced was not deleted yet.
        let stale = fsutil::stale_databases(dir, &db_dir)?;
        for old in &stale {
            tracing::info!(path = %old.display(), "removing a database left by an interrupted rewrite");
            std::fs::remove_dir_all(old).map_err(|e| StorageError::io("remove", old, e))?;
        }
        if !stale.is_empty() {
            fsutil::sync_dir(dir)?;
        }
        fsutil::create_private_dir(&wal_dir)?;
        let db = open_db(&db_dir, opts.cache_bytes)?;
        let dbe = StorageError::db(&db_dir);
        // The entries of `wal/` and `db/` (created by sled) in the data
        // directory must be durable before anything in them counts.
        fsutil::sync_dir(dir)?;
        check_db_format(&db, &db_dir, fresh)?;
        let applied = read_sys(&db, SysKey::AppliedLsn, &db_dir)?.unwrap_or(0);
        let checkpoint = fsutil::read_checkpoint(dir)?;
        // Negative control: the check skipped.
        if !faults::on(Fault::NoLogContinuity)
            && let Some(log) = checkpoint.log
        {
            wal::check_continuity(&wal_dir, checkpoint.applied, log, &checkpoint.sizes)?;
        }
        let (end, batch) = replay_into(&db, &wal_dir, applied, &db_dir)?;
        let checkpointed = checkpoint.applied;
        if end.last_lsn < checkpointed {
            return Err(StorageError::corrupt(
                db_dir.display().to_string(),
                format!(
                    "the database holds changes up to lsn {applied} and the log continues it to lsn {}, but a checkpoint made lsn {checkpointed} durable: the database is damaged or truncated",
                    end.last_lsn
                ),
            ));
        }
        db.apply_batch(batch).map_err(dbe)?;
        // Make the database durable before the log that fed it goes.
        db.flush().map_err(dbe)?;
        fsutil::sync_tree(&db_dir)?;
        // No log position yet: the segments replayed are retired below and
        // the log starts again in a new one, named once it exists.
        fsutil::write_checkpoint(
            dir,
            &fsutil::Checkpoint {
                applied: end.last_lsn,
                ..fsutil::Checkpoint::default()
            },
        )?;
        // Count payload pointers (segments without any are retired, the
        // others kept, pinned, for their payloads) while `load` reads.
        let reader = Reader {
            db: db.clone(),
            path: db_dir.clone(),
            reached: RankedMutex::default_with(Rank::REACHED, "reached"),
        };
        let (counted, loaded) = std::thread::scope(|s| {
            let loading = std::thread::Builder::new()
                .name("letterbox-load".into())
                .spawn_scoped(s, || load(&reader))
                .map_err(|e| StorageError::io("spawn a thread", dir, e))?;
            let counted = count_payloads(&db, &db_dir);
            if counted.is_ok() {
                warm_metas(&reader);
            }
            let loaded = match loading.join() {
                Ok(r) => r,
                // sled panics on some damage: the caller reports it.
                Err(p) => std::panic::resume_unwind(p),
            };
            Ok::<_, StorageError>((counted, loaded))
        })?;
        let (mut live, reach) = counted?;
        // Totals start at what is live now: a share of it must go before a
        // segment is worth compacting.
        let pool = Arc::new(wal::Pool::open(&wal_dir, opts.segment_size)?);
        let present = wal::list_segments(&wal_dir)?;
        for seg in live.counts.keys() {
            let path = wal::segment_path(&wal_dir, *seg);
            if !present.contains(seg) {
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "{} payload(s) point into this log segment, which is missing",
                        live.count(*seg)
                    ),
                ));
            }
            let size = std::fs::metadata(&path)
                .map_err(|e| StorageError::io("stat", &path, e))?
                .len();
            let need = reach.get(seg).copied().unwrap_or(0);
            if size < need {
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "payloads point up to byte {need} of this log segment, which has only {size}: it was truncated"
                    ),
                ));
            }
        }
        for number in present {
            if live.count(number) > 0 {
                live.pinned.insert(number);
            } else {
                pool.retire(&wal::segment_path(&wal_dir, number))?;
            }
        }
        fsutil::sync_dir(&wal_dir)?;
        let writer = wal::Writer::start(Arc::clone(&pool), end.last_segment)?;
        let start_segment = writer.current_number();
        // The new segment exists (created, directory fsynced): from now on
        // a start checks that the log goes on there.
        let recorded = fsutil::Checkpoint {
            applied: end.last_lsn,
            log: Some((start_segment, end.last_lsn + 1)),
            sizes: segment_sizes(&wal_dir, [start_segment])?,
        };
        fsutil::write_checkpoint(dir, &recorded)?;

        let written = Arc::clone(&writer.written);
        let (failure, _) = watch::channel(None);
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            db: RwLock::new(Database { db, path: db_dir }),
            rewritten_bytes: AtomicU64::new(0),
            rewrites: AtomicU64::new(0),
            opts,
            state: RankedMutex::new(
                Rank::STATE,
                "state",
                State {
                    next_lsn: end.last_lsn + 1,
                    active: Memtable::default(),
                    active_bytes: 0,
                    active_deletes: false,
                    frozen: None,
                    frozen_bytes: 0,
                    pending: Vec::new(),
                    closed: None,
                },
            ),
            commit_cv: RankedCondvar::new(),
            quiet: AtomicBool::new(false),
            #[cfg(test)]
            writer_waiting: AtomicBool::new(false),
            log: RankedMutex::new(
                Rank::LOG,
                "log",
                LogState {
                    writer,
                    frames: Vec::with_capacity(1 << 20),
                    bounds: Vec::new(),
                    recent: VecDeque::new(),
                    recent_bytes: 0,
                    generation: 0,
                    stopped: false,
                },
            ),
            apply_cv: RankedCondvar::new(),
            unapplied: AtomicUsize::new(0),
            room: tokio::sync::Notify::new(),
            room_waits: AtomicU64::new(0),
            durable: RankedMutex::new(Rank::DURABLE, "durable", end.last_lsn),
            durable_cv: RankedCondvar::new(),
            failure,
            space_ok: AtomicBool::new(true),
            floor_ok: AtomicBool::new(true),
            space_checked_bytes: AtomicU64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
            abandon: AtomicBool::new(false),
            log_syncs: AtomicU64::new(0),
            caller_commits: AtomicU64::new(0),
            records: AtomicU64::new(0),
            log_bytes: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            applied: AtomicU64::new(end.last_lsn),
            generations: AtomicU64::new(0),
            sync_micros: AtomicU64::new(0),
            segments: written,
            start_segment,
            recorded: RankedMutex::new(Rank::RECORDED, "recorded", recorded),
            pool,
            placed: RankedMutex::default_with(Rank::PLACED, "placed"),
            live: RankedMutex::new(Rank::LIVE, "live", live),
            files: payloads::Files::new(&wal_dir),
            relocated: AtomicU64::new(0),
            overtaken: AtomicU64::new(0),
            metrics: StoreMetrics::new(),
            volatile: RankedMutex::default_with(Rank::VOLATILE, "volatile"),
            #[cfg(test)]
            after_freeze: RankedMutex::default_with(Rank::HOOK, "after_freeze"),
        });
        inner.refresh_space();
        let mut threads = Vec::new();
        let i = Arc::clone(&inner);
        threads.push(spawn("letterbox-log", move || log_writer(&i))?);
        let i = Arc::clone(&inner);
        threads.push(spawn("letterbox-apply", move || applier(&i))?);
        let report = OpenReport {
            applied_lsn: applied,
            replayed: end.replayed,
            elapsed: started.elapsed(),
        };
        Ok((
            Store {
                inner,
                threads: RankedMutex::new(Rank::THREADS, "threads", threads),
                _lock: dir_lock,
            },
            report,
            loaded,
        ))
    }

    /// Read access to the database, for [`Store::open`]'s callers that
    /// rebuild from it (it reads the database, not the memtable: only
    /// valid before the first submission).
    pub fn reader(&self) -> Reader {
        Reader {
            db: self.inner.db(),
            path: self.inner.db_path(),
            reached: RankedMutex::default_with(Rank::REACHED, "reached"),
        }
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

    /// Negative controls ([`Fault::DlqTwoSteps`],
    /// [`Fault::ExchangeTwoSteps`]): blocks until `lsn` is durable. Called
    /// only under those faults.
    pub(crate) fn wait_durable_blocking(&self, lsn: u64) -> bool {
        self.inner.wait_durable(lsn)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Logs a transaction (see the module's durability contract).
    pub fn submit(&self, txn: Txn) -> Commit {
        let mut commit = self.inner.submit(txn, true);
        commit.store = Arc::downgrade(&self.inner);
        commit
    }

    /// Reads a key as of the latest submitted transaction.
    pub fn get(&self, key: &Key<'_>) -> Result<Option<Bytes>> {
        let k = key.encode();
        if faults::on(Fault::NoDeliveryCount)
            && let Some(v) = lock(&self.inner.volatile).get(&k)
        {
            return Ok(Some(v.clone()));
        }
        let slot = {
            let st = lock(&self.inner.state);
            st.active
                .get(&k)
                .or_else(|| st.frozen.as_ref().and_then(|f| f.get(&k)))
                .map(|slot| (slot.value.clone(), slot.placed))
        };
        match slot {
            Some((Some(v), true)) => {
                let loc = payloads::Loc::decode(&v).ok_or_else(|| {
                    StorageError::corrupt(
                        self.inner.dir.display().to_string(),
                        "a payload's place in the log does not decode",
                    )
                })?;
                return self.inner.files.read(loc).map(Some);
            }
            Some((v, _)) => return Ok(v),
            None => {}
        }
        let v = self
            .inner
            .db()
            .get(&k)
            .map_err(|e| self.inner.db_error(e))?;
        match v {
            None => Ok(None),
            Some(iv) => match payloads::Loc::decode(&iv).filter(|_| payloads::located(&k)) {
                Some(loc) => self.inner.files.read(loc).map(Some),
                None => Ok(Some(Bytes::copy_from_slice(&iv))),
            },
        }
    }

    /// Reads and decodes a message's payload, checking its checksum.
    pub fn get_payload(&self, pid: u64) -> Result<Option<PayloadRecord>> {
        let what = format_args!("payload {pid}");
        match self.get(&Key::Payload(pid))? {
            None => Ok(None),
            Some(bytes) => {
                let rec: PayloadRecord = records::decode(&what, &bytes)?;
                rec.verify(&what)?;
                Ok(Some(rec))
            }
        }
    }

    /// Reads and decodes a message's state.
    pub fn get_meta(&self, qid: u32, pos: u64) -> Result<Option<MetaRecord>> {
        match self.get(&Key::Meta(qid, pos))? {
            None => Ok(None),
            Some(bytes) => records::decode(&format_args!("message {qid}/{pos}"), &bytes).map(Some),
        }
    }

    /// Reads a system value.
    pub fn get_sys(&self, key: SysKey) -> Result<Option<u64>> {
        match self.get(&Key::Sys(key))? {
            None => Ok(None),
            Some(b) => Ok(Some(u64::from_be_bytes(b.as_ref().try_into().map_err(
                |_| StorageError::corrupt(format!("system key {key:?}"), "not 8 bytes"),
            )?))),
        }
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
                i.room_waits.fetch_add(1, Ordering::Relaxed);
            }
            i.apply_cv.notify_one();
            notified.await;
        }
    }

    /// False while free space is below the hard floor, a quarter of the
    /// configured minimum: the engine then refuses acks, nacks, extensions
    /// and receives as well, so that the disk never fills under the
    /// server (a full disk is fail-stop). Checked as often as
    /// [`Store::has_space`].
    pub fn above_floor(&self) -> bool {
        let _ = self.has_space();
        self.inner.floor_ok.load(Ordering::Relaxed)
    }

    /// False while free space on the data directory's file system is below
    /// the configured minimum plus the size of the log segment it will
    /// prepare next (none when a retired one can be reused): the engine
    /// then refuses publishes.
    /// Checked again at once after every MiB of log
    /// written, not only by the applier's periodic check: a fast publisher
    /// must not run through the headroom between two periodic checks.
    pub fn has_space(&self) -> bool {
        let written = self.inner.log_bytes.load(Ordering::Relaxed);
        let checked = self.inner.space_checked_bytes.load(Ordering::Relaxed);
        if written.saturating_sub(checked) >= SPACE_CHECK_BYTES
            && self
                .inner
                .space_checked_bytes
                .compare_exchange(checked, written, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.inner.refresh_space();
        }
        self.inner.space_ok.load(Ordering::Relaxed)
    }

    /// Watches for a fail-stop error: the value turns `Some(reason)` once
    /// the store has stopped.
    pub fn failure(&self) -> watch::Receiver<Option<String>> {
        self.inner.failure.subscribe()
    }

    /// Distributions of the commit path since open.
    pub fn metrics(&self) -> &StoreMetrics {
        &self.inner.metrics
    }

    /// Free bytes on the data directory's file system as last measured
    /// for the publish floor (by the applier every 500 ms and after every
    /// MiB of log written); `None` if it could not be measured.
    pub fn free_bytes(&self) -> Option<u64> {
        let f = self.inner.free_bytes.load(Ordering::Relaxed);
        (f != u64::MAX).then_some(f)
    }

    /// The configured minimum of free bytes under which publishes are
    /// refused.
    pub fn min_free_bytes(&self) -> u64 {
        self.inner.opts.min_free_bytes
    }

    /// Figures since open.
    pub fn stats(&self) -> StoreStats {
        let i = &self.inner;
        StoreStats {
            log_syncs: i.log_syncs.load(Ordering::Relaxed),
            caller_commits: i.caller_commits.load(Ordering::Relaxed),
            records: i.records.load(Ordering::Relaxed),
            log_bytes: i.log_bytes.load(Ordering::Relaxed),
            checkpoints: i.checkpoints.load(Ordering::Relaxed),
            durable_lsn: *lock(&i.durable),
            applied_lsn: i.applied.load(Ordering::Relaxed),
            sync_micros: i.sync_micros.load(Ordering::Relaxed),
            pinned_segments: lock(&i.live).pinned.len() as u64,
            relocated: i.relocated.load(Ordering::Relaxed),
            overtaken: i.overtaken.load(Ordering::Relaxed),
            rewrites: i.rewrites.load(Ordering::Relaxed),
            unapplied_bytes: i.unapplied.load(Ordering::Relaxed) as u64,
            room_waits: i.room_waits.load(Ordering::Relaxed),
        }
    }

    /// Stops taking transactions, waits for the log writer to make every
    /// submitted one durable, applies them, checkpoints and releases the
    /// directory. Returns the failure that stopped the store, if any.
    pub fn close(self) -> Result<()> {
        {
            let mut st = lock(&self.inner.state);
            if st.closed.is_none() {
                st.closed = Some("store closed".into());
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

impl Store {
    /// Stops like a crash: the log writer finishes what was submitted, but
    /// nothing more is applied to the database and no checkpoint runs.
    #[cfg(test)]
    pub(crate) fn crash(self) {
        self.inner.abandon.store(true, Ordering::Relaxed);
        drop(self);
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let mut st = lock(&self.inner.state);
        if st.closed.is_none() {
            st.closed = Some("store dropped".into());
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

/// Opens sled on `db_dir` as the store does. sled panics on some damage
/// instead of returning an error: that is turned into an error naming the
/// directory.
pub(crate) fn open_db(db_dir: &Path, cache_bytes: u64) -> Result<sled::Db> {
    let open = || {
        std::panic::catch_unwind(|| {
            sled::Config::new()
                .path(db_dir)
                .flush_every_ms(None)
                .cache_capacity(cache_bytes)
                .mode(sled::Mode::HighThroughput)
                .open()
        })
    };
    let mut opened = open();
    // sled's file lock outlives the last handle for as long as its
    // background threads finish writes they were given; within one process
    // (the data directory's own lock keeps other processes out) a reopen
    // right after a close can find it still held for a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Ok(Err(sled::Error::Io(e))) = &opened {
        if e.kind() != std::io::ErrorKind::Other
            || !e.to_string().contains("could not acquire lock")
            || Instant::now() >= deadline
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        opened = open();
    }
    match opened {
        Ok(r) => r.map_err(StorageError::db(db_dir)),
        Err(panic) => Err(StorageError::corrupt(
            db_dir.display().to_string(),
            format!(
                "the database cannot be read (it is damaged: {})",
                panic_text(panic.as_ref())
            ),
        )),
    }
}

/// The message of a caught panic.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

/// Replays the log records newer than `applied` into `db` (payload puts
/// become pointers to their place in the log); returns where the log ends
/// and the last batch, not yet applied.
pub(crate) fn replay_into(
    db: &sled::Db,
    wal_dir: &Path,
    applied: u64,
    db_dir: &Path,
) -> Result<(wal::ReplayEnd, sled::Batch)> {
    let dbe = StorageError::db(db_dir);
    // Replay what the log has beyond the database. Payload values stay
    // in the log: the database gets pointers to them.
    let mut batch = sled::Batch::default();
    let mut in_batch = 0usize;
    // Keys changed by the batch being built (for conditional puts).
    let mut touched: HashMap<Bytes, bool> = HashMap::new();
    let end = wal::replay(wal_dir, applied, |lsn, muts, seg, data| {
        for m in muts {
            match m.value {
                Some(v) => {
                    if m.if_exists {
                        let exists = match touched.get(&m.key) {
                            Some(e) => *e,
                            None => db.contains_key(m.key.as_ref()).map_err(dbe)?,
                        };
                        if !exists {
                            continue;
                        }
                    }
                    if payloads::located(&m.key) {
                        let loc = payloads::loc_in(seg, data, &v);
                        batch.insert(m.key.as_ref(), &loc.encode()[..]);
                    } else {
                        batch.insert(m.key.as_ref(), v.as_ref());
                    }
                    touched.insert(m.key.clone(), true);
                }
                None => {
                    batch.remove(m.key.as_ref());
                    touched.insert(m.key.clone(), false);
                }
            }
            in_batch += 1;
        }
        if in_batch > 10_000 {
            touched.clear();
            batch.insert(
                Key::Sys(SysKey::AppliedLsn).encode().as_ref(),
                &lsn.to_be_bytes(),
            );
            db.apply_batch(std::mem::take(&mut batch)).map_err(dbe)?;
            in_batch = 0;
        }
        Ok(())
    })?;
    batch.insert(
        Key::Sys(SysKey::AppliedLsn).encode().as_ref(),
        &end.last_lsn.to_be_bytes(),
    );
    Ok((end, batch))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| StorageError::io("spawn thread", name, e))
}

fn read_sys(db: &sled::Db, key: SysKey, path: &Path) -> Result<Option<u64>> {
    let v = db
        .get(Key::Sys(key).encode())
        .map_err(StorageError::db(path))?;
    match v {
        None => Ok(None),
        Some(iv) => Ok(Some(u64::from_be_bytes(iv.as_ref().try_into().map_err(
            |_| {
                StorageError::corrupt(
                    format!("{} system key {key:?}", path.display()),
                    "not 8 bytes",
                )
            },
        )?))),
    }
}

/// Checks the database's format version; a new directory's database gets
/// it. An existing directory whose database lacks it lost its database
/// (deleted, truncated, or replaced by an empty one): refused, rather than
/// started empty.
fn check_db_format(db: &sled::Db, path: &Path, fresh: bool) -> Result<()> {
    let supported = fsutil::FORMAT_VERSION;
    match read_sys(db, SysKey::FormatVersion, path)? {
        Some(v) if v == u64::from(supported) => Ok(()),
        Some(v) => Err(StorageError::FormatVersion {
            path: path.to_path_buf(),
            found: v.to_string(),
            supported,
        }),
        None if !fresh => Err(StorageError::corrupt(
            path.display().to_string(),
            "the database is empty or lost its records, but FORMAT says this directory holds data: refusing to start empty",
        )),
        None => {
            db.insert(
                Key::Sys(SysKey::FormatVersion).encode(),
                &u64::from(supported).to_be_bytes(),
            )
            .map_err(StorageError::db(path))?;
            Ok(())
        }
    }
}

impl Inner {
    /// See [`Store::submit`].
    /// `waited`: the caller will wait for the commit (or drop it) through
    /// a [`Commit`] that can reach the store, so the log writer need not be
    /// woken yet when callers come one at a time ([`Inner::quiet`]).
    fn submit(&self, txn: Txn, waited: bool) -> Commit {
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.state);
        if let Some(reason) = &st.closed {
            return Commit {
                lsn: 0,
                rx: Err(reason.clone()),
                store: Weak::new(),
                unannounced: false,
            };
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        let mut added = 0;
        for m in &txn.muts {
            added += m.key.len() + m.value.as_ref().map_or(0, Bytes::len) + 48;
            st.active_deletes |= m.value.is_none();
            match st.active.entry(m.key.clone()) {
                // Created and deleted within one generation: the database
                // never needs to hear of it.
                Entry::Occupied(slot) if slot.get().fresh && m.value.is_none() => {
                    slot.remove();
                }
                // A relocation of a payload deleted in this generation.
                Entry::Occupied(slot) if m.if_exists && slot.get().value.is_none() => {}
                Entry::Occupied(mut slot) => {
                    let slot = slot.get_mut();
                    slot.value = m.value.clone();
                    slot.lsn = lsn;
                    slot.placed = false;
                }
                Entry::Vacant(place) => {
                    place.insert(Slot {
                        value: m.value.clone(),
                        lsn,
                        fresh: m.fresh,
                        if_exists: m.if_exists,
                        placed: false,
                    });
                }
            }
        }
        if faults::on(Fault::NoDeliveryCount) {
            let mut v = lock(&self.volatile);
            for m in &txn.muts {
                v.remove(&m.key);
            }
            v.extend(txn.volatile);
        }
        st.active_bytes += added;
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
        Commit {
            lsn,
            rx: Ok(rx),
            store: Weak::new(),
            unannounced,
        }
    }

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

    /// Stops the store for good after an I/O error.
    fn fail(&self, err: &StorageError) {
        let reason = err.to_string();
        tracing::error!(error = %reason, "storage failed; no further writes are accepted");
        let pending = {
            let mut st = lock(&self.state);
            st.closed = Some(reason.clone());
            std::mem::take(&mut st.pending)
        };
        for p in pending {
            let _ = p.done.send(Err(reason.clone()));
        }
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
    /// (publishers wait in [`Store::room`]).
    fn room_wanted(&self) -> bool {
        self.unapplied.load(Ordering::Relaxed) >= self.opts.max_unapplied_bytes
    }

    fn refresh_space(&self) {
        let free = fsutil::free_bytes(&self.dir).ok();
        if let Some(f) = free {
            self.free_bytes.store(f, Ordering::Relaxed);
        }
        let min = self.opts.min_free_bytes;
        // The log's next segment takes its size from the free space when
        // it is prepared (unless a retired one is reused): it counts
        // against the minimum, or publishes would run the disk down to
        // the minimum less a segment.
        let next_segment = if min == 0 || self.pool.spare_count() > 0 {
            0
        } else {
            self.opts.segment_size
        };
        let ok = free.is_none_or(|f| f >= min.saturating_add(next_segment));
        let floor = hard_floor(min);
        let floor_ok = free.is_none_or(|f| f >= floor);
        if self.floor_ok.swap(floor_ok, Ordering::Relaxed) != floor_ok {
            if floor_ok {
                tracing::info!(dir = %self.dir.display(), "free disk space is back above the hard floor; acks and receives resume");
            } else {
                tracing::error!(dir = %self.dir.display(), floor, "free disk space is below the hard floor; acks, nacks and receives are refused too");
            }
        }
        if self.space_ok.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                tracing::info!(dir = %self.dir.display(), "free disk space is back above the minimum; publishes resume");
            } else {
                tracing::warn!(dir = %self.dir.display(), min_free = self.opts.min_free_bytes, "free disk space is below the minimum; publishes are refused");
            }
        }
    }

    /// Waits until everything up to `lsn` is durable; false on failure.
    fn wait_durable(&self, lsn: u64) -> bool {
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

/// Replaces each payload of `places` (key, lsn, place) that is still the
/// active memtable's latest value of its key by its place in the log, and
/// returns the bodies it took out (to be dropped outside the lock). A key
/// written again, deleted or frozen since keeps its slot as it is: a frozen
/// generation is shared with the applier and goes whole soon anyway.
fn swap_for_places(inner: &Inner, places: &[(Bytes, u64, payloads::Loc)]) -> Vec<Bytes> {
    let mut bodies = Vec::with_capacity(places.len());
    if places.is_empty() {
        return bodies;
    }
    let mut st = lock(&inner.state);
    for (key, lsn, loc) in places {
        if let Some(slot) = st.active.get_mut(key)
            && slot.lsn == *lsn
            && !slot.placed
            && let Some(body) = slot.value.take()
        {
            slot.value = Some(Bytes::copy_from_slice(&loc.encode()));
            slot.placed = true;
            bodies.push(body);
        }
    }
    bodies
}

/// The log writer thread: takes every pending transaction, writes them in
/// one go, fdatasyncs, and answers them.
fn log_writer(inner: &Inner) {
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
fn try_lock<T>(m: &RankedMutex<T>) -> Option<RankedGuard<'_, T>> {
    m.try_lock()
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

/// Most transactions a caller commits on its own thread: its own and one
/// submitted just before it without waking the log writer (a
/// subscription's ack and the lease that its credit let go).
const ALONE_MAX: usize = 2;

/// Whether `lsn` is the last transaction waiting for the log, and those
/// before it (at most [`ALONE_MAX`] in all) were submitted after a quiet
/// commit too.
fn alone_in(st: &State, lsn: u64) -> bool {
    st.pending.len() <= ALONE_MAX
        && st.pending.last().is_some_and(|p| p.lsn == lsn)
        && st.pending.iter().all(|p| p.unannounced)
}

impl Inner {
    /// Whether [`Inner::commit_alone`] would commit `lsn` now.
    fn alone(&self, lsn: u64) -> bool {
        self.quiet.load(Ordering::Relaxed) && may_block_task() && alone_in(&lock(&self.state), lsn)
    }

    /// Wakes the log writer if `lsn` is not durable yet and transactions
    /// are waiting for it, some of which may not have woken it.
    fn announce(&self, lsn: u64) {
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
    fn commit_alone(&self, lsn: u64) {
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
            self.caller_commits.fetch_add(1, Ordering::Relaxed);
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
fn commit_batch(inner: &Inner, log: &mut LogState, batch: Vec<Pending>) -> bool {
    if log.stopped {
        let reason = inner
            .failure
            .borrow()
            .clone()
            .unwrap_or_else(|| "the log writer stopped".into());
        for p in batch {
            let _ = p.done.send(Err(reason.clone()));
        }
        return false;
    }
    let keep = inner.opts.recent_payload_bytes;
    let LogState {
        writer,
        frames,
        bounds,
        recent,
        recent_bytes,
        generation,
        stopped,
    } = log;
    frames.clear();
    bounds.clear();
    let first = batch[0].lsn;
    // (frame index, mutation index, value offset in the frame)
    let mut located = Vec::new();
    for (fi, p) in batch.iter().enumerate() {
        for (mi, off) in wal::frame(p.lsn, first, &p.muts, frames, payloads::located) {
            located.push((fi, mi, off));
        }
        bounds.push((frames.len(), p.lsn));
    }
    let t = Instant::now();
    let placed = match writer.write(frames, bounds) {
        Ok(placed) => placed,
        Err(e) => {
            let reason = e.to_string();
            for p in batch {
                let _ = p.done.send(Err(reason.clone()));
            }
            *stopped = true;
            inner.fail(&e);
            return false;
        }
    };
    let now = inner.generations.load(Ordering::Relaxed);
    if now != *generation {
        *generation = now;
        recent.clear();
        *recent_bytes = 0;
    }
    if !located.is_empty() {
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
            recent.push_back((m.key.clone(), p.lsn, loc));
            *recent_bytes += usize::try_from(loc.len).unwrap_or(usize::MAX);
        }
    }
    let last = batch[batch.len() - 1].lsn;
    inner.quiet.store(
        (batch.len() == 1 || batch.iter().all(|p| p.unannounced))
            && lock(&inner.state).pending.is_empty(),
        Ordering::Relaxed,
    );
    let synced = t.elapsed();
    inner.sync_micros.fetch_add(
        u64::try_from(synced.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    inner.metrics.sync_seconds.observe(synced.as_secs_f64());
    #[allow(clippy::cast_precision_loss)]
    inner.metrics.batch_records.observe(batch.len() as f64);
    inner.log_syncs.fetch_add(1, Ordering::Relaxed);
    inner
        .records
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    inner
        .log_bytes
        .fetch_add(frames.len() as u64, Ordering::Relaxed);
    *lock(&inner.durable) = last;
    inner.durable_cv.notify_all();
    // The oldest durable bodies beyond the most recent ones leave the
    // memtable for their places (see `Slot`); they are freed below,
    // outside the lock.
    let mut places = Vec::new();
    while *recent_bytes > keep {
        let Some(place) = recent.pop_front() else {
            break;
        };
        *recent_bytes =
            recent_bytes.saturating_sub(usize::try_from(place.2.len).unwrap_or(usize::MAX));
        places.push(place);
    }
    let swapped = swap_for_places(inner, &places);
    drop(places);
    for p in batch {
        inner
            .metrics
            .commit_seconds
            .observe(p.submitted.elapsed().as_secs_f64());
        let _ = p.done.send(Ok(()));
    }
    drop(swapped);
    if frames.capacity() > 64 << 20 {
        *frames = Vec::with_capacity(1 << 20);
    }
    true
}

/// The applier thread: freezes the memtable, waits for its records to be
/// durable, applies it to sled in one batch, and checkpoints now and then.
fn applier(inner: &Inner) {
    let mut last_checkpoint = Instant::now();
    let mut log_bytes_at_checkpoint = 0u64;
    let mut last_space_check = Instant::now();
    loop {
        let closing = {
            let st = lock(&inner.state);
            let st = inner
                .apply_cv
                .wait_timeout_while(st, inner.opts.apply_interval, |s| {
                    s.closed.is_none()
                        && s.active_bytes <= inner.opts.apply_bytes
                        && !inner.room_wanted()
                });
            st.closed.is_some()
        };
        if inner.failed() {
            return;
        }
        if closing && inner.abandon.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = apply_once(inner) {
            inner.fail(&e);
            return;
        }
        if closing && inner.abandon.load(Ordering::Relaxed) {
            return;
        }
        if closing {
            // The log writer drains before it exits; apply what it wrote.
            let next = lock(&inner.state).next_lsn;
            if !inner.wait_durable(next - 1) {
                return;
            }
            if let Err(e) = apply_once(inner).and_then(|()| checkpoint(inner)) {
                inner.fail(&e);
            }
            return;
        }
        if last_space_check.elapsed() >= Duration::from_millis(500) {
            if let Err(e) = note_segments(inner) {
                inner.fail(&e);
                return;
            }
            inner.refresh_space();
            last_space_check = Instant::now();
        }
        let log_bytes = inner.log_bytes.load(Ordering::Relaxed);
        if last_checkpoint.elapsed() >= inner.opts.checkpoint_interval
            || log_bytes - log_bytes_at_checkpoint >= inner.opts.checkpoint_bytes
        {
            if let Err(e) = checkpoint(inner) {
                inner.fail(&e);
                return;
            }
            last_checkpoint = Instant::now();
            log_bytes_at_checkpoint = log_bytes;
        }
    }
}

/// Log bytes written between two checks of free space made on the publish
/// path (see [`Store::has_space`]).
const SPACE_CHECK_BYTES: u64 = 1 << 20;

/// Most writes in one sled batch of the applier (see [`apply_once`]).
const APPLY_CHUNK: usize = 256;

/// Applies the memtable's current content to sled once it is durable.
fn apply_once(inner: &Inner) -> Result<()> {
    let (frozen, upto) = {
        let mut st = lock(&inner.state);
        if st.active.is_empty() {
            // Everything submitted since the last apply was created and
            // deleted in between: nothing to apply, and nothing held.
            let held = std::mem::take(&mut st.active_bytes);
            drop(st);
            if held > 0 {
                inner.unapplied.fetch_sub(held, Ordering::Relaxed);
                inner.room.notify_waiters();
            }
            return Ok(());
        }
        // The next generation starts at this one's size rather than
        // growing (and rehashing) its way there again; a quiet generation
        // shrinks it back at the next apply.
        let next = Memtable::with_capacity_and_hasher(st.active.len(), Default::default());
        let frozen = Arc::new(std::mem::replace(&mut st.active, next));
        st.active_deletes = false;
        inner.generations.fetch_add(1, Ordering::Relaxed);
        st.frozen_bytes = std::mem::take(&mut st.active_bytes);
        st.frozen = Some(Arc::clone(&frozen));
        (frozen, st.next_lsn - 1)
    };
    let started = Instant::now();
    if !inner.wait_durable(upto) {
        return Err(StorageError::Stopped {
            reason: "log writer failed".into(),
        });
    }
    #[cfg(test)]
    if let Some(hook) = lock(&inner.after_freeze).as_mut() {
        hook();
    }
    // Applied in chunks: sled's `apply_batch` holds a lock that stops
    // every read of the database until the whole batch is in, and the
    // engine reads under its own lock, so one large batch (a burst of
    // publishes) would stall every call for its whole length. A crash
    // between chunks leaves the applied lsn behind the chunks applied;
    // replay applies their records again, which changes nothing (replay is
    // idempotent).
    let mut batch = sled::Batch::default();
    // In key order: sled inserts neighbouring keys far cheaper than
    // scattered ones (fewer node splits and copies).
    let mut ordered: Vec<(&Bytes, &Slot)> = frozen.iter().collect();
    ordered.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let placed = {
        // Most of the map is this generation's: take it whole (the log
        // writer, which inserts into it after every write, is not held up
        // while it is sorted out) and put back the few places logged
        // since the freeze, unless the writer has placed that key again
        // meanwhile (later still).
        let mut mine = std::mem::take(&mut *lock(&inner.placed));
        let mut newer = Vec::new();
        mine.retain(|k, (lsn, loc)| {
            if *lsn <= upto {
                true
            } else {
                newer.push((k.clone(), (*lsn, *loc)));
                false
            }
        });
        if !newer.is_empty() {
            let mut map = lock(&inner.placed);
            for (k, place) in newer {
                map.entry(k).or_insert(place);
            }
        }
        mine
    };
    // Pointer counts change only once the batch is applied.
    let mut added: Vec<u64> = Vec::new();
    let mut removed: Vec<u64> = Vec::new();
    let db_err = |e| inner.db_error(e);
    let db = inner.db();
    // Fresh keys left out of the database, with the lsn of the delete
    // that overtook them (see `overtaken`).
    let mut unseen: Vec<(&Bytes, u64)> = Vec::new();
    let mut skipped = 0u64;
    // Per chunk: the delete that overtook each entry, if any.
    let mut gone: Vec<Option<u64>> = Vec::new();
    for (i, &(k, slot)) in ordered.iter().enumerate() {
        if i % APPLY_CHUNK == 0 {
            if i > 0 {
                db.apply_batch(std::mem::take(&mut batch))
                    .map_err(|e| inner.db_error(e))?;
            }
            gone = overtaken(inner, &ordered[i..ordered.len().min(i + APPLY_CHUNK)]);
        }
        if let Some(lsn) = gone.get(i % APPLY_CHUNK).copied().flatten() {
            skipped += 1;
            if slot.fresh {
                unseen.push((k, lsn));
            }
            continue;
        }
        let payload = payloads::located(k);
        // The payload pointer the database holds now, if any.
        let old = |k: &Bytes| -> Result<Option<payloads::Loc>> {
            Ok(db
                .get(k)
                .map_err(db_err)?
                .and_then(|v| payloads::Loc::decode(&v)))
        };
        match &slot.value {
            Some(v) => {
                if slot.if_exists && !db.contains_key(k).map_err(db_err)? {
                    continue;
                }
                // Where the log writer put this value, if it is a payload:
                // from its map, or the slot itself once swapped for it.
                let here = placed
                    .get(k)
                    .filter(|(lsn, _)| *lsn == slot.lsn)
                    .map(|(_, loc)| *loc)
                    .or_else(|| slot.placed.then(|| payloads::Loc::decode(v)).flatten());
                match (payload, here) {
                    (true, Some(loc)) => {
                        if !slot.fresh {
                            removed.extend(old(k)?.map(|l| l.seg));
                        }
                        batch.insert(k.as_ref(), &loc.encode()[..]);
                        added.push(loc.seg);
                    }
                    _ => {
                        if payload && !slot.fresh {
                            removed.extend(old(k)?.map(|l| l.seg));
                        }
                        batch.insert(k.as_ref(), v.as_ref());
                    }
                }
            }
            // A fresh key deleted is never in the database.
            None if slot.fresh => {}
            // A payload's pointer goes out of the batch: the removal
            // hands back the pointer it removed (whose segment loses a
            // reference), where reading it first would walk the tree
            // twice for every message acked. Keys are distinct within a
            // generation, so this order is as good as the batch's.
            None if payload => {
                let gone = db.remove(k.as_ref()).map_err(db_err)?;
                removed.extend(gone.and_then(|v| payloads::Loc::decode(&v)).map(|l| l.seg));
            }
            None => {
                batch.remove(k.as_ref());
            }
        }
    }
    batch.insert(
        Key::Sys(SysKey::AppliedLsn).encode().as_ref(),
        &upto.to_be_bytes(),
    );
    db.apply_batch(batch).map_err(|e| inner.db_error(e))?;
    {
        let mut live = lock(&inner.live);
        for seg in added {
            live.add(seg);
        }
        for seg in removed {
            live.remove(seg);
        }
    }
    {
        let mut st = lock(&inner.state);
        st.frozen = None;
        let bytes = std::mem::take(&mut st.frozen_bytes);
        inner.unapplied.fetch_sub(bytes, Ordering::Relaxed);
    }
    inner.applied.store(upto, Ordering::Relaxed);
    // A fresh key left out never reached the database, so the delete that
    // overtook it need not reach it either: it now deletes a key created
    // in its own generation (unless the key has changed again since).
    for part in unseen.chunks(APPLY_CHUNK) {
        let mut st = lock(&inner.state);
        for &(k, lsn) in part {
            if let Some(a) = st.active.get_mut(k)
                && a.value.is_none()
                && a.lsn == lsn
            {
                a.fresh = true;
            }
        }
    }
    inner.overtaken.fetch_add(skipped, Ordering::Relaxed);
    inner
        .metrics
        .apply_seconds
        .observe(started.elapsed().as_secs_f64());
    inner.room.notify_waiters();
    Ok(())
}

/// For each entry of a chunk of the frozen generation, the lsn of the
/// delete that overtook it, if any: a put whose key's latest change, in the
/// active memtable, is a delete that is already durable. Such a put need
/// not reach the database (a backlog acked or its queue deleted while the
/// applier works through it): readers see the delete above the database,
/// and a crash before that delete is applied replays it, as it is newer
/// than anything this generation records as applied. A delete not yet
/// durable could still be lost to a crash, and the put with it, so it
/// overtakes nothing.
fn overtaken(inner: &Inner, chunk: &[(&Bytes, &Slot)]) -> Vec<Option<u64>> {
    let durable = *lock(&inner.durable);
    let st = lock(&inner.state);
    if !st.active_deletes {
        return vec![None; chunk.len()];
    }
    chunk
        .iter()
        .map(|&(k, slot)| {
            slot.value.as_ref()?;
            st.active
                .get(k)
                .filter(|a| a.value.is_none() && a.lsn <= durable)
                .map(|a| a.lsn)
        })
        .collect()
}

/// Makes the database durable up to the applied lsn, then deletes log
/// segments that hold nothing newer.
fn checkpoint(inner: &Inner) -> Result<()> {
    let applied = inner.applied.load(Ordering::Relaxed);
    inner.db().flush().map_err(|e| inner.db_error(e))?;
    fsutil::sync_tree(&inner.db_path())?;
    // Where the log goes on: the last segment whose first record is at or
    // before the one after `applied` (the segments before it are retired
    // below), or the one the log began in at this start.
    let (log, written) = {
        let segments = lock(&inner.segments);
        let log = segments
            .iter()
            .rev()
            .find(|&&(_, first)| first <= applied + 1)
            .copied()
            .unwrap_or((inner.start_segment, applied + 1));
        // The segments written into from there on: their files are
        // durable (the writer uses a segment only once its creation is).
        let mut written: Vec<u64> = segments
            .iter()
            .map(|&(n, _)| n)
            .filter(|&n| n >= log.0)
            .collect();
        if written.is_empty() {
            written.push(log.0);
        }
        (log, written)
    };
    let wal_dir = inner.dir.join("wal");
    let recorded = fsutil::Checkpoint {
        applied,
        log: Some(log),
        sizes: segment_sizes(&wal_dir, written)?,
    };
    fsutil::write_checkpoint(&inner.dir, &recorded)?;
    *lock(&inner.recorded) = recorded;
    let mut retire = Vec::new();
    {
        let mut segments = lock(&inner.segments);
        let mut live = lock(&inner.live);
        // Segment i holds lsns below the first lsn of segment i+1: once
        // those are applied it goes, unless payloads still point into it.
        while segments.len() >= 2 && segments[1].1 <= applied + 1 {
            let (number, _) = segments.remove(0);
            if live.count(number) > 0 {
                live.pinned.insert(number);
            } else {
                retire.push(number);
            }
        }
        let emptied: Vec<u64> = live
            .pinned
            .iter()
            .copied()
            .filter(|s| live.count(*s) == 0)
            .collect();
        for seg in emptied {
            live.pinned.remove(&seg);
            retire.push(seg);
        }
        // A compaction whose relocations are applied is over (what is
        // still live there, if anything, is compacted again later).
        if let Some((seg, lsn)) = live.compacting
            && (lsn <= applied || !live.pinned.contains(&seg))
        {
            live.compacting = None;
        }
    }
    for seg in &retire {
        inner.files.close(*seg);
        inner.pool.retire(&wal::segment_path(&wal_dir, *seg))?;
    }
    if !retire.is_empty() {
        fsutil::sync_dir(&wal_dir)?;
    }
    inner.checkpoints.fetch_add(1, Ordering::Relaxed);
    rewrite::maybe_rewrite(inner)?;
    compact(inner)
}

/// Adds the segments the log moved into since `CHECKPOINT` was written to
/// its list of sizes (the applied lsn and log position unchanged), so that
/// a truncation of one of them is found at the next start without waiting
/// for the next checkpoint.
fn note_segments(inner: &Inner) -> Result<()> {
    let mut recorded = lock(&inner.recorded);
    let Some((from, _)) = recorded.log else {
        return Ok(());
    };
    let known: Vec<u64> = recorded.sizes.iter().map(|&(n, _)| n).collect();
    let new: Vec<u64> = lock(&inner.segments)
        .iter()
        .map(|&(n, _)| n)
        .filter(|&n| n >= from && !known.contains(&n))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let mut next = recorded.clone();
    next.sizes
        .extend(segment_sizes(&inner.dir.join("wal"), new)?);
    fsutil::write_checkpoint(&inner.dir, &next)?;
    *recorded = next;
    Ok(())
}

/// (number, size) of the given log segments. Segments only appear whole
/// (renamed into place once full size) and only grow.
fn segment_sizes(
    wal_dir: &Path,
    numbers: impl IntoIterator<Item = u64>,
) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for number in numbers {
        let path = wal::segment_path(wal_dir, number);
        let m = std::fs::metadata(&path).map_err(|e| StorageError::io("stat", &path, e))?;
        out.push((number, m.len()));
    }
    Ok(out)
}

/// The free space below which every write is refused: a quarter of the
/// minimum that publishes need (0 when that is 0).
fn hard_floor(min_free: u64) -> u64 {
    min_free / 4
}

/// Segments kept for their payloads before compaction starts.
const KEEP_PINNED: usize = 2;
/// Relocations per transaction.
const RELOCATE_BATCH: usize = 256;

/// Moves the live payloads of the pinned segment most worth it to the
/// current segment, so that it can be retired. The relocations are
/// conditional puts: a payload deleted meanwhile stays deleted.
fn compact(inner: &Inner) -> Result<()> {
    let Some(seg) = lock(&inner.live).to_compact(KEEP_PINNED) else {
        return Ok(());
    };
    let wal_dir = inner.dir.join("wal");
    let mut moved = 0u64;
    let mut txn = Txn::new();
    let mut last_lsn = 0u64;
    // Not waited for: the relocations are applied with everything else.
    let submit = |txn: Txn| -> u64 { inner.submit(txn, false).lsn() };
    for (key, value, loc) in payloads::payloads_in(&wal_dir, seg)? {
        let current = inner.db().get(&key).map_err(|e| inner.db_error(e))?;
        if current.and_then(|v| payloads::Loc::decode(&v)) != Some(loc) {
            continue; // deleted, or already somewhere else
        }
        txn.relocate(key, value);
        moved += 1;
        if txn.muts.len() >= RELOCATE_BATCH {
            last_lsn = submit(std::mem::take(&mut txn));
        }
    }
    if !txn.is_empty() {
        last_lsn = submit(txn);
    }
    inner.relocated.fetch_add(moved, Ordering::Relaxed);
    lock(&inner.live).compacting = Some((seg, last_lsn));
    tracing::debug!(segment = seg, moved, "compacting a log segment");
    Ok(())
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
