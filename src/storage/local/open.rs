//! Opening the store: the data directory checked, the log replayed into
//! the database, payload pointers counted, and the log writer and the
//! applier started (recovery).
//!
//! ## The data directory
//!
//! ```text
//! letterbox-data/        mode 0700
//!   FORMAT               "letterbox data directory\nformat 1\n"
//!   CHECKPOINT           "letterbox checkpoint\napplied N\nlog S F\n
//!                        sizes S:BYTES[:FIRST] ...\n": the lsn the last
//!                        checkpoint made durable in the database, the
//!                        segment S the log goes on in (its first record is
//!                        lsn F; absent between a start's replay and its new
//!                        segment), and every segment from S on with its
//!                        size and, once a record in it is durable, its
//!                        first lsn
//!   LOCK                 flock'd by the running server
//!   wal/NNNN….wal        log segments (20-digit numbers)
//!   wal/spare-NNNN….seg  retired segments kept for reuse
//!   db/                  sled, until the first rewrite
//!   db-N/                sled, after the N-th rewrite (see `rewrite`)
//!   DATABASE             "letterbox database\ncurrent db-N\n" (absent: db/)
//! ```
//!
//! A start writes `FORMAT` first and `CHECKPOINT` last, before it opens
//! the log or answers any call. So a directory with `FORMAT` but no
//! `CHECKPOINT`, no `DATABASE` and no log segment is a very first start cut
//! short (sled's files may be empty or cut short): it holds nothing
//! acknowledged, and is initialized again with a warning (a leftover
//! `FORMAT.tmp` does not make it foreign). A start also removes any other
//! `db`/`db-N` directory than the current one (a rewrite cut short before
//! or after its commit point).
//!
//! Everything else a start cannot trust stops it with a message naming the
//! file, and nothing is modified: a missing `FORMAT` in a non-empty
//! directory, an unknown format, a lock held by another process; a
//! database that is missing, unreadable (sled's panics on some damage are
//! caught) or older than the last checkpoint once the log is replayed into
//! it; a payload pointer past the end of its segment; and a log that does
//! not go on where `CHECKPOINT` says (`wal::check_continuity`) or holds an
//! intact record of a later write after the place its records stop
//! (`wal::replay`). Damage the log can repair is repaired; anything else is
//! refused rather than served as less data.
//!
//! ## Recovery
//!
//! Open sled (which reads its own page-table snapshot and its log since:
//! sled 0.34 writes that snapshot only when it opens, so the first start
//! after a burst of writes is the slow one); replay the log records newer
//! than the applied lsn into it (payload puts become pointers); checkpoint.
//! Then two full scans run at once: the payload pointers counted per
//! segment on the opening thread, and the engine's load on a thread of its
//! own (`letterbox-load`, through `Reader`), the opening thread then
//! reading the message records backwards until it meets the load's scan
//! so that the pages it still needs are in sled's cache (`warm_metas`).
//! Nothing is submitted before both end; then the segments no pointer
//! refers to are retired, the log starts in a fresh segment, and the log
//! writer and the applier start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use super::checkpoint::{self, Checkpoints, segment_sizes};
use super::db::{self, Database, open_db, read_sys};
use super::log::LogWriter;
use super::payloads::Payloads;
use super::space::{self, Space};
use super::submit::Submission;
use super::{LocalBackend, OpenReport, Shared, StoreOptions, apply, fsutil, log, payloads, wal};
use crate::faults::{self, Fault};
use crate::storage::error::{Result, StorageError};
use crate::storage::keys::{self, Key, OwnedKey, SysKey};
use crate::storage::rank::{Rank, RankedMutex};
use crate::storage::{LoadSource, Space as KeySpace, Store, StoreMetrics, records};

/// The database as the log's replay left it, read while a store opens
/// ([`Store::open_with`]) or before its first submission.
///
/// Recovery reads sled directly, not through [`Backend`](crate::storage::Backend):
/// the replay, the payload pointer count, and the engine's load through
/// this reader (a [`LoadSource`](crate::storage::LoadSource), read while the store
/// counts its payload pointers). A backend of another kind feeds that load
/// with [`Backend::scan`](crate::storage::Backend::scan) pages instead
/// ([`Paged`](crate::storage::Paged)).
pub struct Reader {
    db: sled::Db,
    path: PathBuf,
    /// A recent key a scan reached (see [`warm_metas`]).
    reached: RankedMutex<Vec<u8>>,
}

impl Reader {
    /// Iterates the keys of one space with decoded values.
    pub fn scan<T: records::Record>(
        &self,
        space: KeySpace,
    ) -> impl Iterator<Item = Result<(OwnedKey, T)>> + '_ {
        let mut n = 0u32;
        self.db.scan_prefix(space.prefix()).map(move |item| {
            let (k, v) = item.map_err(StorageError::db(&self.path))?;
            n = n.wrapping_add(1);
            if n.is_multiple_of(WARM_STEP) {
                let mut reached = self.reached.lock();
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

impl LoadSource for Reader {
    fn scan<T: records::Record>(
        &self,
        space: KeySpace,
    ) -> impl Iterator<Item = Result<(OwnedKey, T)>> + '_ {
        Reader::scan(self, space)
    }

    fn get_sys(&self, key: SysKey) -> Result<Option<u64>> {
        Reader::get_sys(self, key)
    }
}

/// Items between two looks at the other thread's progress.
pub(super) const WARM_STEP: u32 = 256;

/// Reads the message records backwards from the last, until it meets the
/// key the forward scan of `reader` reached: the pages that scan is going
/// to need come into sled's cache from this thread (a page read from the
/// file and decoded is most of a scan's cost).
pub(super) fn warm_metas(reader: &Reader) {
    let mut n = 0u32;
    for item in reader.db.scan_prefix([keys::TAG_META]).rev() {
        let Ok((k, _)) = item else { return };
        n = n.wrapping_add(1);
        if n.is_multiple_of(WARM_STEP) && reader.reached.lock().as_slice() >= k.as_ref() {
            return;
        }
    }
}

/// Live payload pointers per log segment, and the furthest byte a pointer
/// reaches in each.
pub(super) fn count_payloads(
    db: &sled::Db,
    db_dir: &Path,
) -> Result<(payloads::Live, HashMap<u64, u64>)> {
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
        space::check_fit(dir, opts.segment_size, opts.min_free_bytes)?;
        let (db, db_dir) = prepare_dir(dir, opts.cache_bytes)?;
        let wal_dir = dir.join("wal");
        let (applied, end) = recover(dir, &db, &db_dir)?;
        // Count payload pointers (segments without any are retired, the
        // others kept, pinned, for their payloads) while `load` reads.
        let ((mut live, reach), loaded) = count_while_loading(dir, &db, &db_dir, load)?;
        // Totals start at what is live now: a share of it must go before a
        // segment is worth compacting.
        let pool = Arc::new(wal::Pool::open(&wal_dir, opts.segment_size)?);
        sort_segments(&wal_dir, &pool, &mut live, &reach)?;
        let (writer, recorded) = start_log(dir, &wal_dir, &pool, &end)?;
        let replayed = end.replayed;
        let recovered = Recovered {
            db,
            db_dir,
            end,
            writer,
            recorded,
            pool,
            live,
        };
        let shared = Arc::new(running(dir, opts, recovered));
        shared.space.refresh(&shared.pool);
        let threads = start_threads(&shared)?;
        let report = OpenReport {
            applied_lsn: applied,
            replayed,
            elapsed: started.elapsed(),
        };
        Ok((
            Store::with_backend(LocalBackend {
                shared,
                threads: RankedMutex::new(Rank::THREADS, "threads", threads),
                _lock: dir_lock,
            }),
            report,
            loaded,
        ))
    }

    /// See [`LocalBackend::reader`].
    pub fn reader(&self) -> Reader {
        self.backend().reader()
    }
}

impl LocalBackend {
    /// Read access to the database, for [`Store::open`]'s callers that
    /// rebuild from it (it reads the database, not the memtable: only
    /// valid before the first submission).
    pub fn reader(&self) -> Reader {
        Reader {
            db: self.shared.db.handle(),
            path: self.shared.db.path(),
            reached: RankedMutex::default_with(Rank::REACHED, "reached"),
        }
    }
}

/// Checks the data directory (its format, a first start cut short, a
/// database lost, databases left by an interrupted rewrite), creates the
/// log's directory, and opens the database, checking its format.
fn prepare_dir(dir: &Path, cache_bytes: u64) -> Result<(sled::Db, PathBuf)> {
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
            std::fs::remove_dir_all(&db_dir).map_err(|e| StorageError::io("remove", &db_dir, e))?;
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
    let db = open_db(&db_dir, cache_bytes)?;
    // The entries of `wal/` and `db/` (created by sled) in the data
    // directory must be durable before anything in them counts.
    fsutil::sync_dir(dir)?;
    db::check_format(&db, &db_dir, fresh)?;
    Ok((db, db_dir))
}

/// Replays the log into the database (after checking it goes on where the
/// last checkpoint says) and makes the result durable; returns the lsn the
/// database had applied before, and where the log ends.
fn recover(dir: &Path, db: &sled::Db, db_dir: &Path) -> Result<(u64, wal::ReplayEnd)> {
    let wal_dir = dir.join("wal");
    let dbe = StorageError::db(db_dir);
    let applied = read_sys(db, SysKey::AppliedLsn, db_dir)?.unwrap_or(0);
    let checkpoint = checkpoint::read(dir)?;
    // Negative control: the check skipped.
    if !faults::on(Fault::NoLogContinuity)
        && let Some(log) = checkpoint.log
    {
        wal::check_continuity(&wal_dir, checkpoint.applied, log, &checkpoint.sizes)?;
    }
    let (end, batch) = replay_into(db, &wal_dir, applied, db_dir)?;
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
    fsutil::sync_tree(db_dir)?;
    // No log position yet: the segments replayed are retired below and
    // the log starts again in a new one, named once it exists.
    checkpoint::write(
        dir,
        &checkpoint::Checkpoint {
            applied: end.last_lsn,
            ..checkpoint::Checkpoint::default()
        },
    )?;
    Ok((applied, end))
}

/// Live payload pointers per log segment, and the furthest byte a pointer
/// reaches in each.
type Pointers = (payloads::Live, HashMap<u64, u64>);

/// Payload pointers per segment and their reach (see [`count_payloads`]),
/// counted while `load` reads the database on a thread of its own.
fn count_while_loading<T, F>(
    dir: &Path,
    db: &sled::Db,
    db_dir: &Path,
    load: F,
) -> Result<(Pointers, T)>
where
    T: Send,
    F: FnOnce(&Reader) -> T + Send,
{
    let reader = Reader {
        db: db.clone(),
        path: db_dir.to_path_buf(),
        reached: RankedMutex::default_with(Rank::REACHED, "reached"),
    };
    let (counted, loaded) = std::thread::scope(|s| {
        let loading = std::thread::Builder::new()
            .name("letterbox-load".into())
            .spawn_scoped(s, || load(&reader))
            .map_err(|e| StorageError::io("spawn a thread", dir, e))?;
        let counted = count_payloads(db, db_dir);
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
    Ok((counted?, loaded))
}

/// Checks that every segment payloads point into is there and long
/// enough; pins those, and retires the others (all their records are in
/// the database now).
fn sort_segments(
    wal_dir: &Path,
    pool: &wal::Pool,
    live: &mut payloads::Live,
    reach: &HashMap<u64, u64>,
) -> Result<()> {
    let present = wal::list_segments(wal_dir)?;
    for seg in live.counts.keys() {
        let path = wal::segment_path(wal_dir, *seg);
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
            pool.retire(&wal::segment_path(wal_dir, number))?;
        }
    }
    fsutil::sync_dir(wal_dir)?;
    Ok(())
}

/// Starts the log in a new segment and records it in `CHECKPOINT`.
fn start_log(
    dir: &Path,
    wal_dir: &Path,
    pool: &Arc<wal::Pool>,
    end: &wal::ReplayEnd,
) -> Result<(wal::Writer, checkpoint::Checkpoint)> {
    let writer = wal::Writer::start(Arc::clone(pool), end.last_segment)?;
    let start_segment = writer.current_number();
    // The new segment exists (created, directory fsynced): from now on
    // a start checks that the log goes on there.
    let recorded = checkpoint::Checkpoint {
        applied: end.last_lsn,
        log: Some((start_segment, end.last_lsn + 1)),
        sizes: segment_sizes(wal_dir, [(start_segment, None)])?,
    };
    checkpoint::write(dir, &recorded)?;
    Ok((writer, recorded))
}

/// What recovery leaves for the running store.
struct Recovered {
    db: sled::Db,
    db_dir: PathBuf,
    end: wal::ReplayEnd,
    writer: wal::Writer,
    recorded: checkpoint::Checkpoint,
    pool: Arc<wal::Pool>,
    live: payloads::Live,
}

/// The parts of a running store that recovery left as `r`.
fn running(dir: &Path, opts: StoreOptions, r: Recovered) -> Shared {
    let Recovered {
        db,
        db_dir,
        end,
        writer,
        recorded,
        pool,
        live,
    } = r;
    let start_segment = writer.current_number();
    let (failure, _) = watch::channel(None);
    Shared {
        dir: dir.to_path_buf(),
        db: Database::new(db, db_dir),
        submission: Submission::new(end.last_lsn, opts.apply_bytes, opts.max_unapplied_bytes),
        log: LogWriter::new(writer, end.last_lsn, opts.recent_payload_bytes),
        applier: apply::Applier::new(end.last_lsn),
        checkpoints: Checkpoints::new(dir, start_segment, recorded),
        payloads: Payloads::new(live, &dir.join("wal")),
        pool,
        space: Space::new(dir, opts.min_free_bytes, opts.segment_size),
        failure,
        counters: super::stats::Counters::default(),
        metrics: StoreMetrics::new(),
        opts,
    }
}

/// Starts the log writer and the applier.
fn start_threads(shared: &Arc<Shared>) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::new();
    let s = Arc::clone(shared);
    threads.push(spawn("letterbox-log", move || log::run(&s))?);
    let s = Arc::clone(shared);
    threads.push(spawn("letterbox-apply", move || apply::run(&s))?);
    Ok(threads)
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
