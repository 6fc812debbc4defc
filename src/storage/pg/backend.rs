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
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot, watch};

use super::committer::{Changes, Front, Queued, Shared, committer, renewer, stopped_for};
use super::recent::Recent;
use super::state::{self as pg, Fence, PgError, PgState};
use crate::storage::backend::Commit;
use crate::storage::rank::{Rank, RankedGuard, RankedMutex};
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
    running: RankedMutex<Option<Running>>,
    /// What the first [`Backend::close`] returned.
    closed: RankedMutex<Option<std::result::Result<(), String>>>,
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
            front: RankedMutex::new(
                Rank::FRONT,
                "front",
                Front {
                    overlay: BTreeMap::new(),
                    next_lsn: committed + 1,
                    queue: VecDeque::new(),
                    closed: None,
                    failed: None,
                    recent: Recent::new(opts.recent_bytes),
                },
            ),
            wake: Notify::new(),
            failure,
            fence: RankedMutex::new(Rank::FENCE, "fence", fence),
            reader: RankedMutex::new(Rank::READER, "reader", Arc::new(reader)),
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
            running: RankedMutex::new(
                Rank::RUNNING,
                "running",
                Some(Running {
                    stop,
                    thread,
                    committer,
                    renewer,
                }),
            ),
            closed: RankedMutex::new(Rank::CLOSED, "closed", None),
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
        self.shared.fence.lock().epoch
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
                if let Some(reason) = shared.front.lock().failed.clone() {
                    return Err(PgError::Db(reason));
                }
                let until = *deadline.get_or_insert_with(|| shared.fence.lock().valid_until);
                let why = if Instant::now() >= until {
                    e.to_string()
                } else {
                    tracing::warn!(error = %e, "PostgreSQL: the reading connection was lost; connecting again");
                    match shared.connect(until).await {
                        Ok(fresh) => {
                            *shared.reader.lock() = Arc::new(fresh);
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
    fn absolute(&self, txn: Txn) -> Result<(Changes, RankedGuard<'_, Front>)> {
        let conditional = txn.muts.iter().any(|m| m.if_exists && m.value.is_some());
        if !conditional {
            let changes = txn.muts.into_iter().map(|m| (m.key, m.value)).collect();
            return Ok((changes, self.shared.front.lock()));
        }
        loop {
            // Looked up in the overlay first; the keys it does not hold are
            // read from PostgreSQL with the front unlocked (the committer
            // needs it), and the answers hold if nothing was submitted
            // meanwhile: a key absent from the overlay has no change on its
            // way to PostgreSQL.
            let (mark, mut unknown) = {
                let front = self.shared.front.lock();
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
            let front = self.shared.front.lock();
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
            let front = self.shared.front.lock();
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
            let front = self.shared.front.lock();
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
        let overlay: Vec<(Bytes, Option<Bytes>)> = self
            .shared
            .front
            .lock()
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
        let mut closed = self.closed.lock();
        if closed.is_none() {
            {
                let mut front = self.shared.front.lock();
                if front.closed.is_none() {
                    front.closed = Some("the PostgreSQL backend is closed".into());
                }
            }
            self.shared.wake.notify_one();
            if let Some(running) = self.running.lock().take() {
                let shared = Arc::clone(&self.shared);
                let committer = running.committer;
                let renewer = running.renewer;
                let _ = run(&self.shared.handle, async move {
                    let _ = committer.await;
                    renewer.abort();
                    let _ = renewer.await;
                    let failed = shared.front.lock().failed.is_some();
                    if !failed {
                        let fence = *shared.fence.lock();
                        if let Err(e) = shared.reader().release(&fence).await {
                            tracing::warn!(error = %e, "PostgreSQL: releasing the lease");
                        }
                    }
                });
                let _ = running.stop.send(());
                let _ = running.thread.join();
            }
            *closed = Some(match self.shared.front.lock().failed.clone() {
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
