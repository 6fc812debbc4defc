//! Offline check of a data directory (`letterbox verify`).
//!
//! Nothing in the directory is modified: the check takes the directory's
//! lock (so no server runs on it meanwhile), copies the database to a
//! scratch directory, replays the log into the copy exactly as a start
//! would (which checks every log frame's CRC and the lsn sequence), and
//! then reads every record of the result:
//!
//! * every key and value decodes; system values are 8 bytes;
//! * every payload pointer points into an existing segment, within its
//!   size, at a record that decodes and whose body matches its CRC;
//! * every message has its queue and its payload, each payload belongs to
//!   exactly one message, the recorded body size is the payload's;
//! * leases are consistent (the lease's epoch is the lease count, the
//!   delivery count does not exceed it, a lease starts before it ends);
//! * groups are only on FIFO queues, dead letter queues exist and have the
//!   source's kind;
//! * each queue's counters agree with the messages it holds (what came in
//!   minus what went out, within what expiries explain);
//! * reserved positions and queue numbers are beyond every one in use.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::error::{Result, StorageError};
use super::keys::{
    OwnedKey, TAG_COUNTERS, TAG_DEDUP, TAG_EXCHANGE, TAG_GROUP, TAG_META, TAG_PAYLOAD, TAG_QUEUE,
    TAG_SYS,
};
use super::records::{
    self, CountersRecord, DedupRecord, ExchangeRecord, GroupRecord, MetaRecord, PayloadRecord,
    QueueRecord,
};
use super::{SysKey, fsutil, payloads, wal};
use crate::queue::model::QueueKind;

/// Options of a check.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Where to copy the database (default: the system's temporary
    /// directory). It needs as much free space as `db/` takes.
    pub scratch: Option<PathBuf>,
}

/// What a check found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Damage and inconsistencies; empty when the directory is sound.
    pub problems: Vec<String>,
    /// Figures about the directory, in order.
    pub figures: Vec<(String, String)>,
    /// Notes that are not problems (states a start repairs).
    pub notes: Vec<String>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_sound(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, p: impl Into<String>) {
        // Thousands of copies of one kind of damage say nothing more.
        if self.problems.len() < 1000 {
            self.problems.push(p.into());
        }
    }

    fn figure(&mut self, name: &str, value: impl ToString) {
        self.figures.push((name.to_string(), value.to_string()));
    }
}

/// A scratch copy, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<u64> {
    std::fs::create_dir_all(to).map_err(|e| StorageError::io("create directory", to, e))?;
    let mut bytes = 0;
    let entries =
        std::fs::read_dir(from).map_err(|e| StorageError::io("read directory", from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read directory", from, e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ty = entry
            .file_type()
            .map_err(|e| StorageError::io("stat", &src, e))?;
        if ty.is_dir() {
            bytes += copy_tree(&src, &dst)?;
        } else if ty.is_file() {
            bytes += std::fs::copy(&src, &dst).map_err(|e| StorageError::io("copy", &src, e))?;
        }
    }
    Ok(bytes)
}

/// Checks the data directory `dir`. `Err` when it cannot be checked at all
/// (not a data directory, an unknown format, in use by a server, an I/O
/// error); otherwise the report says what is wrong, if anything.
pub fn verify(dir: &Path, opts: &VerifyOptions) -> Result<VerifyReport> {
    let mut r = VerifyReport::default();
    if !dir.is_dir() {
        return Err(StorageError::NotDataDir {
            path: dir.to_path_buf(),
            reason: "it is not a directory".into(),
        });
    }
    let _lock = fsutil::lock_dir_shared(dir)?;
    fsutil::check_format(dir)?;
    let db_dir = fsutil::current_database(dir)?;
    let wal_dir = dir.join("wal");
    if fsutil::first_start_unfinished(dir, &wal_dir)? {
        r.notes.push(
            "the first start of this directory was cut short before it finished: it holds nothing acknowledged, and the next start initializes it again".into(),
        );
        return Ok(r);
    }
    if !db_dir.join("db").exists() {
        r.problem(format!(
            "{}: the database is missing (the directory has a FORMAT file, so it held data)",
            db_dir.display()
        ));
        return Ok(r);
    }
    let stale = fsutil::stale_databases(dir, &db_dir)?;
    if !stale.is_empty() {
        r.figure(
            "databases left by an interrupted rewrite (removed at the next start)",
            stale.len(),
        );
    }
    let base = opts.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let scratch = Scratch(base.join(format!("letterbox-verify-{}-{nanos}", std::process::id())));
    let db_bytes = copy_tree(&db_dir, &scratch.0)?;
    r.figure("database bytes", db_bytes);
    let db = match super::open_db(&scratch.0, 64 << 20) {
        Ok(db) => db,
        Err(e) => {
            let why = match e {
                StorageError::Corrupt { reason, .. } => reason,
                StorageError::Db { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            r.problem(format!("{}: {why}", db_dir.display()));
            return Ok(r);
        }
    };
    let dbe = |e: sled::Error| StorageError::Db {
        path: db_dir.clone(),
        source: e,
    };
    match read_u64(&db, SysKey::FormatVersion, &db_dir)? {
        Some(v) if v == u64::from(fsutil::FORMAT_VERSION) => {}
        Some(v) => r.problem(format!(
            "{}: database format {v}, this build reads {}",
            db_dir.display(),
            fsutil::FORMAT_VERSION
        )),
        None => r.problem(format!(
            "{}: the database has no format version: it is empty or lost its records",
            db_dir.display()
        )),
    }
    let applied = read_u64(&db, SysKey::AppliedLsn, &db_dir)?.unwrap_or(0);
    r.figure("applied lsn", applied);

    // The log: every segment's frames, then the replay a start would do.
    let segments = if wal_dir.is_dir() {
        wal::list_segments(&wal_dir)?
    } else {
        r.problem(format!(
            "{}: the log directory is missing",
            wal_dir.display()
        ));
        Vec::new()
    };
    let mut seg_sizes: HashMap<u64, u64> = HashMap::new();
    let mut frames = 0usize;
    for &n in &segments {
        let path = wal::segment_path(&wal_dir, n);
        let data =
            Bytes::from(std::fs::read(&path).map_err(|e| StorageError::io("read", &path, e))?);
        seg_sizes.insert(n, data.len() as u64);
        frames += wal::frame_lsns(&data).len();
    }
    r.figure("log segments", segments.len());
    r.figure("log records in segments", frames);
    let checkpoint = fsutil::read_checkpoint(dir);
    if let Ok(cp) = &checkpoint
        && let Some(log) = cp.log
        && let Err(e) = wal::check_continuity(&wal_dir, cp.applied, log, &cp.sizes)
    {
        r.problem(format!("log: {e}"));
    }
    match super::replay_into(&db, &wal_dir, applied, &db_dir) {
        Ok((end, batch)) => {
            db.apply_batch(batch).map_err(dbe)?;
            r.figure("log records newer than the database", end.replayed);
            r.figure("last lsn", end.last_lsn);
            match checkpoint.as_ref().map(|c| c.applied) {
                Ok(cp) if cp > end.last_lsn => r.problem(format!(
                    "{}: holds changes up to lsn {} (with the log), but a checkpoint made lsn {cp} durable: the database is damaged or truncated",
                    db_dir.display(),
                    end.last_lsn
                )),
                Ok(cp) => r.figure("last checkpoint lsn", cp),
                Err(e) => r.problem(e.to_string()),
            }
        }
        Err(e) => r.problem(format!("log: {e}")),
    }

    // Every record.
    let mut queues: BTreeMap<String, QueueRecord> = BTreeMap::new();
    let mut counters: HashMap<u32, CountersRecord> = HashMap::new();
    let mut metas: Vec<(u32, u64, MetaRecord)> = Vec::new();
    let mut payload_sizes: HashMap<u64, usize> = HashMap::new();
    let mut groups: Vec<(u32, String)> = Vec::new();
    let mut dedups: Vec<u32> = Vec::new();
    let mut sys: HashMap<u8, u64> = HashMap::new();
    let mut payload_bytes = 0u64;
    let mut pointers = 0usize;
    let mut files: HashMap<u64, File> = HashMap::new();
    for item in db.iter() {
        let (k, v) = item.map_err(dbe)?;
        let what = || format!("key {:02x?}", &k[..k.len().min(24)]);
        match k.first().copied() {
            Some(TAG_SYS) => {
                if k.len() != 2 || v.len() != 8 {
                    r.problem(format!("{}: malformed system value", what()));
                    continue;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&v);
                sys.insert(k[1], u64::from_be_bytes(b));
            }
            Some(TAG_PAYLOAD) => {
                if k.len() != 9 {
                    r.problem(format!("{}: malformed payload key", what()));
                    continue;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&k[1..9]);
                let pid = u64::from_be_bytes(b);
                let name = format!("payload {pid}");
                let bytes = match payloads::Loc::decode(&v) {
                    Some(loc) => {
                        pointers += 1;
                        let path = wal::segment_path(&wal_dir, loc.seg);
                        let Some(size) = seg_sizes.get(&loc.seg) else {
                            r.problem(format!(
                                "{name} points into {}, which is missing",
                                path.display()
                            ));
                            continue;
                        };
                        if loc.off + u64::from(loc.len) > *size {
                            r.problem(format!(
                                "{name} points to bytes {}..{} of {}, which has {size}",
                                loc.off,
                                loc.off + u64::from(loc.len),
                                path.display()
                            ));
                            continue;
                        }
                        if let std::collections::hash_map::Entry::Vacant(e) = files.entry(loc.seg) {
                            e.insert(
                                File::open(&path)
                                    .map_err(|e| StorageError::io("open", &path, e))?,
                            );
                        }
                        let f = &files[&loc.seg];
                        let mut buf = vec![0u8; usize::try_from(loc.len).unwrap_or(0)];
                        f.read_exact_at(&mut buf, loc.off)
                            .map_err(|e| StorageError::io("read", &path, e))?;
                        buf
                    }
                    None => v.to_vec(),
                };
                match records::decode::<PayloadRecord>(&name, &bytes) {
                    Ok(p) => {
                        if let Err(e) = p.verify(&name) {
                            r.problem(e.to_string());
                        }
                        payload_bytes += p.body.len() as u64;
                        payload_sizes.insert(pid, p.body.len());
                    }
                    Err(e) => r.problem(e.to_string()),
                }
            }
            Some(TAG_QUEUE | TAG_COUNTERS | TAG_META | TAG_DEDUP | TAG_GROUP | TAG_EXCHANGE) => {
                let Some(key) = OwnedKey::decode(&k) else {
                    r.problem(format!("{}: malformed key", what()));
                    continue;
                };
                let name = format!("{key:?}");
                let bad = |e: StorageError| e.to_string();
                let res: std::result::Result<(), String> = match key {
                    OwnedKey::Queue(q) => records::decode::<QueueRecord>(&name, &v)
                        .map(|rec| {
                            queues.insert(q, rec);
                        })
                        .map_err(bad),
                    OwnedKey::Counters(qid) => records::decode::<CountersRecord>(&name, &v)
                        .map(|rec| {
                            counters.insert(qid, rec);
                        })
                        .map_err(bad),
                    OwnedKey::Meta(qid, pos) => records::decode::<MetaRecord>(&name, &v)
                        .map(|rec| metas.push((qid, pos, rec)))
                        .map_err(bad),
                    OwnedKey::Dedup(qid, _) => records::decode::<DedupRecord>(&name, &v)
                        .map(|_| dedups.push(qid))
                        .map_err(bad),
                    OwnedKey::Group(qid, g) => records::decode::<GroupRecord>(&name, &v)
                        .map(|_| groups.push((qid, g)))
                        .map_err(bad),
                    OwnedKey::Exchange(_) => records::decode::<ExchangeRecord>(&name, &v)
                        .map(|_| ())
                        .map_err(bad),
                    OwnedKey::Other => Err(format!("{}: unknown key", what())),
                };
                if let Err(e) = res {
                    r.problem(e);
                }
            }
            _ => r.problem(format!("{}: unknown key space", what())),
        }
    }
    r.figure("queues", queues.len());
    r.figure("messages", metas.len());
    r.figure("payloads", payload_sizes.len());
    r.figure("payloads kept in the log", pointers);
    r.figure("payload bytes", payload_bytes);

    check_relations(
        &mut r,
        &queues,
        &counters,
        &metas,
        &payload_sizes,
        &groups,
        &dedups,
        &sys,
    );
    Ok(r)
}

fn read_u64(db: &sled::Db, key: SysKey, path: &Path) -> Result<Option<u64>> {
    super::read_sys(db, key, path)
}

#[allow(clippy::too_many_arguments)]
fn check_relations(
    r: &mut VerifyReport,
    queues: &BTreeMap<String, QueueRecord>,
    counters: &HashMap<u32, CountersRecord>,
    metas: &[(u32, u64, MetaRecord)],
    payload_sizes: &HashMap<u64, usize>,
    groups: &[(u32, String)],
    dedups: &[u32],
    sys: &HashMap<u8, u64>,
) {
    let by_qid: HashMap<u32, (&String, &QueueRecord)> =
        queues.iter().map(|(n, q)| (q.qid, (n, q))).collect();
    if by_qid.len() != queues.len() {
        r.problem("two queues share an internal number".to_string());
    }
    for (name, q) in queues {
        if let Some((dlq, _)) = &q.dead_letter {
            match queues.get(dlq) {
                None => r.problem(format!(
                    "queue {name:?}: its dead letter queue {dlq:?} does not exist"
                )),
                Some(d) if d.kind != q.kind => r.problem(format!(
                    "queue {name:?}: its dead letter queue {dlq:?} is of another kind"
                )),
                Some(_) if dlq == name => {
                    r.problem(format!("queue {name:?} is its own dead letter queue"))
                }
                _ => {}
            }
        }
    }
    let mut live: HashMap<u32, u64> = HashMap::new();
    let mut owners: HashMap<u64, u32> = HashMap::new();
    let mut max_pos = 0u64;
    let mut orphans = 0usize;
    for (qid, pos, m) in metas {
        max_pos = max_pos.max(*pos);
        let what = format!("message {} ({qid}/{pos})", m.message_id);
        let Some((_, q)) = by_qid.get(qid) else {
            // A queue delete cut short: the next start deletes these.
            orphans += 1;
            continue;
        };
        *live.entry(*qid).or_default() += 1;
        match payload_sizes.get(&m.pid) {
            None => r.problem(format!("{what}: its payload {} is missing", m.pid)),
            Some(&size) if size != m.size as usize => r.problem(format!(
                "{what}: recorded size {} but its payload holds {size} bytes",
                m.size
            )),
            Some(_) => {}
        }
        *owners.entry(m.pid).or_default() += 1;
        if let Some(l) = &m.lease {
            if l.epoch != m.leases {
                r.problem(format!(
                    "{what}: lease epoch {} but {} leases granted",
                    l.epoch, m.leases
                ));
            }
            if l.started > l.deadline {
                r.problem(format!("{what}: lease ends before it starts"));
            }
        }
        if m.delivery_count > m.leases {
            r.problem(format!(
                "{what}: delivery count {} above its {} leases",
                m.delivery_count, m.leases
            ));
        }
        if m.group.is_some() && !QueueKind::from_code(q.kind).is_fifo() {
            r.problem(format!("{what}: has a group but its queue is not FIFO"));
        }
    }
    if orphans > 0 {
        r.notes.push(format!(
            "{orphans} message(s) of deleted queues (a delete cut short); the next start removes them"
        ));
    }
    for (pid, n) in &owners {
        if *n > 1 {
            r.problem(format!("payload {pid} belongs to {n} messages"));
        }
    }
    let unowned = payload_sizes
        .keys()
        .filter(|p| !owners.contains_key(p))
        .count();
    if unowned > 0 && orphans == 0 {
        r.problem(format!("{unowned} payload(s) belong to no message"));
    }
    for (qid, g) in groups {
        match by_qid.get(qid) {
            Some((_, q)) if QueueKind::from_code(q.kind).is_fifo() => {}
            Some((name, _)) => r.problem(format!(
                "group {g:?} stored for the standard queue {name:?}"
            )),
            None => r.notes.push(format!("group {g:?} of a deleted queue")),
        }
    }
    for qid in dedups {
        if !by_qid.contains_key(qid) {
            r.notes
                .push(format!("dedup entry of a deleted queue {qid}"));
        }
    }
    for (qid, (name, _)) in &by_qid {
        let c = counters.get(qid).copied().unwrap_or_default();
        let held = live.get(qid).copied().unwrap_or(0);
        let came = c.published + c.dead_letters_received + c.redrive_received;
        let went = c.acked + c.dead_lettered + c.purged + c.redriven;
        // An expiry either drops a message (counted only as expired) or
        // moves it to the DLQ (counted as expired and dead-lettered).
        let most = i128::from(came) - i128::from(went);
        let least = most - i128::from(c.expired);
        if i128::from(held) > most || i128::from(held) < least {
            r.problem(format!(
                "queue {name:?}: holds {held} messages, but its counters say {} (in {came}, out {went}, expired {})",
                if least == most {
                    most.to_string()
                } else {
                    format!("{least} to {most}")
                },
                c.expired
            ));
        }
    }
    if let Some(&reserved) = sys.get(&(SysKey::PosReserved as u8))
        && !metas.is_empty()
        && max_pos >= reserved
    {
        r.problem(format!(
            "position {max_pos} is in use but only positions below {reserved} were reserved"
        ));
    }
    if let Some(&next) = sys.get(&(SysKey::NextQid as u8)) {
        let max_qid = by_qid.keys().max().copied().unwrap_or(0);
        if !by_qid.is_empty() && u64::from(max_qid) >= next {
            r.problem(format!(
                "queue number {max_qid} is in use but the next one to hand out is {next}"
            ));
        }
    }
}
