//! [`PgBackend`]: the [`Backend`] over PostgreSQL, one shard of the key
//! space per backend, on the state of [`super::state`] (its module doc has
//! the lease, the fence, unknown outcomes, the schema and chunks).
//!
//! ## How it works
//!
//! * **Its own runtime.** The trait's methods are synchronous and may be
//!   called from a task of another tokio runtime, so the backend runs its
//!   connections and tasks on a single-threaded runtime of its own, on a
//!   thread of its own; a call hands its work over and waits for the
//!   answer on a plain channel (blocking its thread, as a read of the
//!   local backend blocks on sled). It never enters the caller's runtime.
//! * **Ownership.** [`PgBackend::open`] takes the shard's lease under the
//!   node name of its options, or refuses, naming the node that holds it,
//!   its epoch and how long its lease still runs ([`PgError::Held`]). A
//!   task renews the lease every third of its time to live, on the reading
//!   connection (replaced when it fails, as it is when a read finds it
//!   lost).
//! * **Submitting** gives a transaction the next lsn (from the shard's
//!   commit marker + 1 at open) and puts its changes into an in-memory
//!   overlay (key → the latest value or deletion, with its lsn), where
//!   [`Backend::get`], [`Backend::get_many`] and [`Backend::scan`] see
//!   them at once, in front of what PostgreSQL holds; `get_many` reads the
//!   keys that neither the overlay nor the recent values hold in one
//!   query; a scan merges the two in key order and reads further rows from
//!   PostgreSQL where deletions of the overlay hide some, so that a short
//!   page still means the end of the range.
//! * **Group commits, one batch in flight.** A committer task takes the
//!   transactions queued since its last batch (whole transactions; it
//!   starts a new batch where one would pass `max_batch_bytes`, but never
//!   splits one) and commits them as one fenced PostgreSQL transaction
//!   with the lsn of the last as the commit marker. Then it answers each
//!   and drops the overlay's entries no newer than that lsn.
//! * **An unknown outcome** (`COMMIT` failed) is settled on a new
//!   connection by the commit marker ([`PgState::resolve`]): committed, the
//!   batch is answered; not committed, the same batch is sent once more on
//!   the new connection, before anything newer.
//! * **Reads** that find the reading connection lost (PostgreSQL restarted
//!   or failing over) replace it and are tried again until the lease as it
//!   stood at the loss runs out, and then stop the backend: a read never
//!   fails for a lost connection while the backend goes on, so the engine,
//!   which may change its state in memory around a read, never goes on
//!   from a read it could not make.
//! * **Fail-stop.** The backend stops for good, every queued and later
//!   transaction answered with the reason and [`Backend::failure`] set to
//!   it, when a commit is refused by the fence (another node took the
//!   shard: the reason names both epochs), when a statement fails (a lost
//!   connection included), when an unknown outcome cannot be settled or
//!   its retry fails, when a read cannot be made while the lease runs, and
//!   when the lease could not be renewed before it ran out. Nothing else
//!   is retried: the engine's contract is fail-stop, and the process
//!   recovers by starting again (and taking the lease again).
//! * **Chunks**: values longer than `chunk_size` are stored in pieces by
//!   [`PgState::commit`] and put back together by its reads.
//! * **Closing** stops taking transactions, commits what is queued,
//!   releases the lease (a standby can take the shard at once) and stops
//!   the runtime's thread.
//!
//! A put "only if the key exists" (the local log's relocation of a payload,
//! which the engine never sends to this backend today) is decided when it
//! is submitted, against the overlay and then PostgreSQL. The values that
//! the local backend keeps in memory only under a negative control's fault
//! are not kept here.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::ops::Bound;
#[cfg(test)]
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot, watch};

use super::state::{self as pg, Fence, Outcome, PgError, PgState};
use crate::storage::backend::{Answer, Commit, CommitError};
use crate::storage::keys::{TAG_META, TAG_PAYLOAD};
use crate::storage::stats::PgStoreMetrics;
use crate::storage::{Backend, Result, StorageError, Txn};

/// How a [`PgBackend`] runs.
#[derive(Debug, Clone)]
pub struct PgBackendOptions {
    /// The shard of the database's key space this backend owns.
    pub shard: i32,
    /// This node's name in the lease. A node that starts again under the
    /// same name takes its own lease back at once; two backends running
    /// at the same time must have different names (the default, the host
    /// name and the process id, is unique but not stable across restarts).
    pub node: String,
    /// How long the lease runs without renewal; renewed every third.
    pub lease_ttl: Duration,
    /// A batch stops growing before it passes this many bytes of keys and
    /// values (a transaction larger than it is a batch of its own).
    pub max_batch_bytes: usize,
    /// Values longer than this are stored in chunks of this size.
    pub chunk_size: usize,
    /// Most bytes of recently committed message bodies and message records
    /// kept in memory, so that consumers close behind the publishers read
    /// them, and a lease or an ack the record it changes, without a round
    /// trip to PostgreSQL (0: none).
    pub recent_bytes: usize,
}

impl Default for PgBackendOptions {
    fn default() -> Self {
        PgBackendOptions {
            shard: 0,
            node: default_node(),
            lease_ttl: Duration::from_secs(10),
            max_batch_bytes: 4 << 20,
            chunk_size: pg::DEFAULT_CHUNK_SIZE,
            recent_bytes: 64 << 20,
        }
    }
}

/// The host name and the process id.
fn default_node() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "letterbox".into());
    format!("{host}/{}", std::process::id())
}

/// Absolute changes: a put with its value, a deletion without.
type Changes = Vec<(Bytes, Option<Bytes>)>;

/// A transaction waiting for the committer.
struct Queued {
    lsn: u64,
    /// When it was submitted.
    submitted: Instant,
    changes: Changes,
    bytes: usize,
    done: Answer,
}

/// What submitters, readers and the committer share.
struct Front {
    /// Changes not yet known to be committed: key → (value or deletion,
    /// lsn of the latest change).
    overlay: BTreeMap<Bytes, (Option<Bytes>, u64)>,
    next_lsn: u64,
    queue: VecDeque<Queued>,
    /// Set on close or failure: no more submissions.
    closed: Option<String>,
    /// Set on failure.
    failed: Option<String>,
    /// Message bodies and records committed lately and not changed since.
    recent: Recent,
}

/// Recently committed message bodies and records: what PostgreSQL holds
/// for their keys, kept while they fit in the budget, the oldest evicted
/// first. A key leaves as soon as a transaction changes it (the overlay
/// then answers for it).
#[derive(Default)]
struct Recent {
    /// Each body with the number of the `keep` that put it here.
    values: HashMap<Bytes, (Bytes, u64)>,
    /// Keys by insertion, oldest first, with the number of their `keep`
    /// (an entry whose key was forgotten or kept again since is stale).
    order: VecDeque<(Bytes, u64)>,
    bytes: usize,
    budget: usize,
    kept: u64,
}

impl Recent {
    fn get(&self, key: &[u8]) -> Option<&Bytes> {
        self.values.get(key).map(|(v, _)| v)
    }

    fn forget(&mut self, key: &[u8]) {
        if let Some((v, _)) = self.values.remove(key) {
            self.bytes -= key.len() + v.len();
        }
    }

    fn keep(&mut self, key: Bytes, value: Bytes) {
        let size = key.len() + value.len();
        if size > self.budget {
            return;
        }
        self.forget(&key);
        self.kept += 1;
        self.bytes += size;
        self.order.push_back((key.clone(), self.kept));
        self.values.insert(key, (value, self.kept));
        while self.bytes > self.budget {
            let Some((old, n)) = self.order.pop_front() else {
                break;
            };
            if self.is_current(&old, n) {
                self.forget(&old);
            }
        }
        // Stale entries (keys forgotten or kept again since) are dropped
        // when they outnumber the live ones, never by evicting live values
        // for them: the stale entries of values acknowledged lately sit
        // behind older live ones.
        if self.order.len() > 2 * self.values.len() + 16 {
            let values = &self.values;
            self.order
                .retain(|(k, n)| values.get(k).is_some_and(|(_, m)| m == n));
        }
    }

    /// Whether the entry `(key, n)` of `order` is the key's current one.
    fn is_current(&self, key: &[u8], n: u64) -> bool {
        self.values.get(key).is_some_and(|(_, m)| *m == n)
    }
}

struct Shared {
    front: Mutex<Front>,
    /// Wakes the committer.
    wake: Notify,
    failure: watch::Sender<Option<String>>,
    fence: Mutex<Fence>,
    /// The connection for reads and lease renewals.
    reader: Mutex<Arc<PgState>>,
    handle: Handle,
    url: String,
    opts: PgBackendOptions,
    metrics: PgStoreMetrics,
    #[cfg(test)]
    renewal_paused: AtomicBool,
}

/// The runtime and its tasks, until [`Backend::close`].
struct Running {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
    committer: tokio::task::JoinHandle<()>,
    renewer: tokio::task::JoinHandle<()>,
}

/// The PostgreSQL backend (see the module doc).
pub struct PgBackend {
    shared: Arc<Shared>,
    running: Mutex<Option<Running>>,
    /// What the first [`Backend::close`] returned.
    closed: Mutex<Option<std::result::Result<(), String>>>,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("target", &pg::describe(&self.shared.url))
            .field("shard", &self.shared.opts.shard)
            .field("node", &self.shared.opts.node)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `fut` on the backend's runtime and waits for its output on this
/// thread; `None` if the runtime has stopped.
fn run<T: Send + 'static>(
    handle: &Handle,
    fut: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().ok()
}

fn stopped() -> StorageError {
    StorageError::Stopped {
        reason: "the PostgreSQL backend is closed".into(),
    }
}

/// Most rows read from PostgreSQL at once by one page of a scan (a few
/// in tests, so that pages of the contract's scans read in several).
const MAX_READ: usize = if cfg!(test) { 3 } else { 4096 };

impl PgBackend {
    /// Connects to the database at `url`, creates or migrates the schema,
    /// takes the lease of `opts.shard` and starts committing. Refused with
    /// [`PgError::Held`] while another live node holds the lease.
    pub fn open(url: &str, opts: PgBackendOptions) -> Result<PgBackend> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PgError::Db(format!("cannot start a runtime: {e}")))?;
        let handle = rt.handle().clone();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("letterbox-pg".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .map_err(|e| PgError::Db(format!("cannot start a thread: {e}")))?;
        let started = run(&handle, start(url.to_string(), opts.clone()));
        let (writer, reader, fence, committed) = match started {
            Some(Ok(s)) => s,
            failed => {
                let _ = stop.send(());
                let _ = thread.join();
                return Err(match failed {
                    Some(Err(e)) => e.into(),
                    _ => stopped(),
                });
            }
        };
        tracing::info!(
            target = %reader.target(),
            shard = opts.shard,
            node = %opts.node,
            epoch = fence.epoch,
            committed,
            "PostgreSQL backend owns its shard"
        );
        let (failure, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            front: Mutex::new(Front {
                overlay: BTreeMap::new(),
                next_lsn: committed + 1,
                queue: VecDeque::new(),
                closed: None,
                failed: None,
                recent: Recent {
                    budget: opts.recent_bytes,
                    ..Recent::default()
                },
            }),
            wake: Notify::new(),
            failure,
            fence: Mutex::new(fence),
            reader: Mutex::new(Arc::new(reader)),
            handle: handle.clone(),
            url: url.to_string(),
            opts,
            metrics: PgStoreMetrics::new(),
            #[cfg(test)]
            renewal_paused: AtomicBool::new(false),
        });
        let committer = handle.spawn(committer(Arc::clone(&shared), writer));
        let renewer = handle.spawn(renewer(Arc::clone(&shared)));
        Ok(PgBackend {
            shared,
            running: Mutex::new(Some(Running {
                stop,
                thread,
                committer,
                renewer,
            })),
            closed: Mutex::new(None),
        })
    }

    /// Distributions of the commit path since open.
    pub fn metrics(&self) -> &PgStoreMetrics {
        &self.shared.metrics
    }

    /// The database, by its hosts and name (no password).
    pub fn target(&self) -> String {
        pg::describe(&self.shared.url)
    }

    /// This node's name in the lease.
    pub fn node(&self) -> &str {
        &self.shared.opts.node
    }

    /// The lease's epoch this backend writes under.
    pub fn epoch(&self) -> i64 {
        lock(&self.shared.fence).epoch
    }

    /// Stops renewing the lease (tests: a node that stalls).
    #[cfg(test)]
    pub(crate) fn pause_renewal(&self) {
        self.shared.renewal_paused.store(true, Ordering::Relaxed);
    }

    /// The session of the reading connection (tests: to cut it alone).
    #[cfg(test)]
    pub(crate) fn reader_pid(&self) -> i32 {
        let reader = self.shared.reader();
        run(
            &self.shared.handle,
            async move { reader.session_pid().await },
        )
        .expect("backend running")
        .expect("pg_backend_pid")
    }

    /// Rows of PostgreSQL from `start` to `end`, at most `limit`.
    fn read_range(
        &self,
        start: Vec<u8>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        let end = end.map(<[u8]>::to_vec);
        self.read(move |reader| {
            let (start, end) = (start.clone(), end.clone());
            async move { reader.scan_range(&start, end.as_deref(), limit).await }
        })
    }

    /// Whether `key` exists in PostgreSQL.
    fn read_exists(&self, key: &[u8]) -> Result<bool> {
        Ok(self.read_key(key)?.is_some())
    }

    /// The value of `key` in PostgreSQL.
    fn read_key(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let key = key.to_vec();
        self.read(move |reader| {
            let key = key.clone();
            async move { reader.get(&key).await }
        })
    }

    /// Runs `read` on the reading connection. When it finds that
    /// connection lost (PostgreSQL restarted or failing over), a new one
    /// replaces it and the read is tried again, until the lease as it stood
    /// at the loss runs out: the backend then stops (fail-stop), as it does
    /// when a commit cannot be made in that time. A read never fails for a
    /// lost connection while the backend goes on, so that the engine, which
    /// may have changed its state in memory around the read, never goes on
    /// from a read it could not make.
    fn read<T, F, Fut>(&self, read: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Arc<PgState>) -> Fut + Send + 'static,
        Fut: Future<Output = pg::Result<T>> + Send,
    {
        let shared = Arc::clone(&self.shared);
        run(&self.shared.handle, async move {
            let mut deadline: Option<Instant> = None;
            loop {
                let e = match read(shared.reader()).await {
                    Err(e) if e.is_connection() => e,
                    done => return done,
                };
                if let Some(reason) = lock(&shared.front).failed.clone() {
                    return Err(PgError::Db(reason));
                }
                let until = *deadline.get_or_insert_with(|| lock(&shared.fence).valid_until);
                let why = if Instant::now() >= until {
                    e.to_string()
                } else {
                    tracing::warn!(error = %e, "PostgreSQL: the reading connection was lost; connecting again");
                    match shared.connect(until).await {
                        Ok(fresh) => {
                            *lock(&shared.reader) = Arc::new(fresh);
                            continue;
                        }
                        Err(c) => format!("{e}; connecting again: {c}"),
                    }
                };
                let reason = format!(
                    "a read could not be made while the lease ran (the connection was lost: {why})"
                );
                shared.fail(&reason);
                return Err(PgError::Db(reason));
            }
        })
        .ok_or_else(stopped)?
        .map_err(StorageError::from)
    }

    /// The transaction's changes as absolute puts and deletes, with its
    /// puts "only if the key exists" decided (see the module doc), and the
    /// front locked with no submission since they were decided.
    fn absolute(&self, txn: Txn) -> Result<(Changes, MutexGuard<'_, Front>)> {
        let conditional = txn.muts.iter().any(|m| m.if_exists && m.value.is_some());
        if !conditional {
            let changes = txn.muts.into_iter().map(|m| (m.key, m.value)).collect();
            return Ok((changes, lock(&self.shared.front)));
        }
        loop {
            // Looked up in the overlay first; the keys it does not hold are
            // read from PostgreSQL with the front unlocked (the committer
            // needs it), and the answers hold if nothing was submitted
            // meanwhile: a key absent from the overlay has no change on its
            // way to PostgreSQL.
            let (mark, mut unknown) = {
                let front = lock(&self.shared.front);
                let unknown: Vec<Bytes> = txn
                    .muts
                    .iter()
                    .filter(|m| m.if_exists && !front.overlay.contains_key(&m.key))
                    .map(|m| m.key.clone())
                    .collect();
                (front.next_lsn, unknown)
            };
            unknown.dedup();
            let mut in_pg = std::collections::HashMap::new();
            for k in unknown {
                let exists = self.read_exists(&k)?;
                in_pg.insert(k, exists);
            }
            let front = lock(&self.shared.front);
            if front.next_lsn != mark {
                continue;
            }
            let mut changes: Changes = Vec::with_capacity(txn.muts.len());
            for m in &txn.muts {
                if m.if_exists && m.value.is_some() {
                    let earlier = changes.iter().rev().find(|(k, _)| *k == m.key);
                    let exists = match earlier {
                        Some((_, v)) => v.is_some(),
                        None => match front.overlay.get(&m.key) {
                            Some((v, _)) => v.is_some(),
                            None => in_pg.get(&m.key).copied().unwrap_or(false),
                        },
                    };
                    if !exists {
                        continue;
                    }
                }
                changes.push((m.key.clone(), m.value.clone()));
            }
            return Ok((changes, front));
        }
    }
}

/// Connects the committing and the reading connections and takes the
/// lease; the shard's commit marker.
async fn start(
    url: String,
    opts: PgBackendOptions,
) -> std::result::Result<(PgState, PgState, Fence, u64), PgError> {
    let mut writer = PgState::connect(&url, opts.shard).await?;
    writer.set_chunk_size(opts.chunk_size);
    let reader = PgState::connect(&url, opts.shard).await?;
    let fence = match reader.acquire(&opts.node, opts.lease_ttl).await? {
        Ok(fence) => fence,
        Err(holder) => {
            return Err(PgError::Held {
                shard: opts.shard,
                holder,
            });
        }
    };
    // Read under the lease: no earlier owner commits after it.
    let committed = reader.committed_lsn().await?;
    Ok((writer, reader, fence, committed))
}

impl Shared {
    fn reader(&self) -> Arc<PgState> {
        Arc::clone(&lock(&self.reader))
    }

    /// A new connection, tried until `deadline` (once at least).
    async fn connect(&self, deadline: Instant) -> std::result::Result<PgState, PgError> {
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
    fn fail(&self, reason: &str) {
        let queued = {
            let mut front = lock(&self.front);
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
            let mut front = lock(&self.front);
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
fn stopped_for(reason: &str) -> CommitError {
    Arc::new(StorageError::Stopped {
        reason: reason.to_string(),
    })
}

/// The committer task (see the module doc).
async fn committer(shared: Arc<Shared>, mut writer: PgState) {
    loop {
        let batch = loop {
            {
                let mut front = lock(&shared.front);
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
    let fence = *lock(&shared.fence);
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
async fn renewer(shared: Arc<Shared>) {
    let ttl = shared.opts.lease_ttl;
    let period = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        if lock(&shared.front).failed.is_some() {
            return;
        }
        #[cfg(test)]
        if shared.renewal_paused.load(Ordering::Relaxed) {
            continue;
        }
        let fence = *lock(&shared.fence);
        let reader = shared.reader();
        let why = match tokio::time::timeout(period, reader.renew(&fence, ttl)).await {
            Ok(Ok(renewed)) => {
                *lock(&shared.fence) = renewed;
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
            *lock(&shared.reader) = Arc::new(s);
        }
    }
}

impl Backend for PgBackend {
    fn submit(&self, txn: Txn) -> Commit {
        let (changes, mut front) = match self.absolute(txn) {
            Ok(x) => x,
            Err(e) => return Commit::refused(Arc::new(e)),
        };
        if let Some(reason) = &front.closed {
            return Commit::refused(stopped_for(reason));
        }
        let lsn = front.next_lsn;
        front.next_lsn += 1;
        let mut bytes = 0usize;
        for (k, v) in &changes {
            bytes += k.len() + v.as_ref().map_or(0, Bytes::len);
            front.recent.forget(k);
            front.overlay.insert(k.clone(), (v.clone(), lsn));
        }
        let (done, rx) = oneshot::channel();
        front.queue.push_back(Queued {
            lsn,
            submitted: Instant::now(),
            changes,
            bytes,
            done,
        });
        drop(front);
        self.shared.wake.notify_one();
        Commit::pending(lsn, rx, false)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        {
            let front = lock(&self.shared.front);
            if let Some((v, _)) = front.overlay.get(key) {
                return Ok(v.clone());
            }
            if let Some(v) = front.recent.get(key) {
                return Ok(Some(v.clone()));
            }
        }
        self.read_key(key)
    }

    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        // Positions of the keys neither the overlay nor the recent values
        // hold, and those keys once each.
        let mut missing: Vec<usize> = Vec::new();
        let mut wanted: Vec<Vec<u8>> = Vec::new();
        {
            let front = lock(&self.shared.front);
            let mut seen: HashSet<&[u8]> = HashSet::new();
            for (i, key) in keys.iter().enumerate() {
                if let Some((v, _)) = front.overlay.get(*key) {
                    out[i].clone_from(v);
                } else if let Some(v) = front.recent.get(key) {
                    out[i] = Some(v.clone());
                } else {
                    missing.push(i);
                    if seen.insert(key) {
                        wanted.push(key.to_vec());
                    }
                }
            }
        }
        if wanted.is_empty() {
            return Ok(out);
        }
        let wanted = Arc::new(wanted);
        let rows = self.read(move |reader| {
            let wanted = Arc::clone(&wanted);
            async move {
                let mut rows = Vec::new();
                for part in wanted.chunks(MAX_READ) {
                    let part: Vec<&[u8]> = part.iter().map(Vec::as_slice).collect();
                    rows.extend(reader.get_many(&part).await?);
                }
                Ok::<_, PgError>(rows)
            }
        })?;
        let found: HashMap<Bytes, Bytes> = rows.into_iter().collect();
        for i in missing {
            out[i] = found.get(keys[i]).cloned();
        }
        Ok(out)
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        if limit == 0 || end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        // The overlay first: what PostgreSQL holds now is at least as new
        // for every key the overlay no longer holds.
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let overlay: Vec<(Bytes, Option<Bytes>)> = lock(&self.shared.front)
            .overlay
            .range::<[u8], _>((Bound::Included(start), upper))
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        let mut overlay = overlay.into_iter().peekable();
        let mut out: Vec<(Bytes, Bytes)> = Vec::new();
        let mut rows: VecDeque<(Bytes, Bytes)> = VecDeque::new();
        let mut from = start.to_vec();
        let mut more = true;
        while out.len() < limit {
            if rows.is_empty() && more {
                // Each entry of the overlay hides one row at most.
                let want = (limit - out.len())
                    .saturating_add(overlay.len())
                    .min(MAX_READ);
                let got = self.read_range(from.clone(), end, want)?;
                more = got.len() >= want;
                if let Some((k, _)) = got.last() {
                    from.clear();
                    from.extend_from_slice(k);
                    from.push(0);
                }
                rows.extend(got);
            }
            let pg_first = match (rows.front(), overlay.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((row, _)), Some((k, _))) => row < k,
            };
            if pg_first {
                out.extend(rows.pop_front());
            } else if let Some((k, v)) = overlay.next() {
                if rows.front().is_some_and(|(row, _)| *row == k) {
                    rows.pop_front();
                }
                if let Some(v) = v {
                    out.push((k, v));
                }
            }
        }
        Ok(out)
    }

    fn failure(&self) -> watch::Receiver<Option<String>> {
        self.shared.failure.subscribe()
    }

    fn close(&self) -> Result<()> {
        let mut closed = lock(&self.closed);
        if closed.is_none() {
            {
                let mut front = lock(&self.shared.front);
                if front.closed.is_none() {
                    front.closed = Some("the PostgreSQL backend is closed".into());
                }
            }
            self.shared.wake.notify_one();
            if let Some(running) = lock(&self.running).take() {
                let shared = Arc::clone(&self.shared);
                let committer = running.committer;
                let renewer = running.renewer;
                let _ = run(&self.shared.handle, async move {
                    let _ = committer.await;
                    renewer.abort();
                    let _ = renewer.await;
                    let failed = lock(&shared.front).failed.is_some();
                    if !failed {
                        let fence = *lock(&shared.fence);
                        if let Err(e) = shared.reader().release(&fence).await {
                            tracing::warn!(error = %e, "PostgreSQL: releasing the lease");
                        }
                    }
                });
                let _ = running.stop.send(());
                let _ = running.thread.join();
            }
            *closed = Some(match lock(&self.shared.front).failed.clone() {
                Some(reason) => Err(reason),
                None => Ok(()),
            });
        }
        match closed.clone() {
            Some(Err(reason)) => Err(StorageError::Stopped { reason }),
            _ => Ok(()),
        }
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
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
    fn recent_bodies_stay_within_their_budget_oldest_out_first() {
        let k = |i: u8| Bytes::from(vec![TAG_PAYLOAD, i]);
        let v = |n: usize| Bytes::from(vec![0u8; n]);
        let mut r = Recent {
            budget: 30,
            ..Recent::default()
        };
        r.keep(k(1), v(8));
        r.keep(k(2), v(8));
        r.keep(k(3), v(8));
        assert_eq!(r.bytes, 30);
        // A fourth pushes the oldest out.
        r.keep(k(4), v(8));
        assert!(!r.values.contains_key(&k(1)));
        assert_eq!(r.bytes, 30);
        // Forgotten (changed): its bytes are given back; kept again, it is
        // the newest.
        r.forget(&k(2));
        assert_eq!(r.bytes, 20);
        r.keep(k(2), v(8));
        r.keep(k(5), v(8));
        assert!(!r.values.contains_key(&k(3)));
        assert!(r.values.contains_key(&k(2)));
        // Larger than the whole budget: not kept, nothing evicted for it.
        r.keep(k(6), v(40));
        assert!(!r.values.contains_key(&k(6)));
        assert_eq!(r.bytes, 30);
        assert_eq!(r.values.len(), 3);
    }

    #[test]
    fn forgotten_values_do_not_push_live_ones_out() {
        // As a consumer acknowledges behind a publisher: values kept in
        // order, each one kept again (its lease), then forgotten (its ack).
        let k = |i: u32| Bytes::from([&[TAG_META][..], &i.to_be_bytes()].concat());
        let mut r = Recent {
            budget: 1 << 20,
            ..Recent::default()
        };
        for i in 0..1000 {
            r.keep(k(i), Bytes::from_static(b"record"));
        }
        for i in 0..900 {
            r.keep(k(i), Bytes::from_static(b"leased"));
            r.forget(&k(i));
        }
        // Within the budget, every value not forgotten is still there.
        for i in 900..1000 {
            assert!(r.values.contains_key(&k(i)), "value {i} evicted");
        }
        assert_eq!(r.values.len(), 100);
        // And the order's stale entries stay bounded.
        assert!(
            r.order.len() <= 2 * r.values.len() + 18,
            "{}",
            r.order.len()
        );
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
