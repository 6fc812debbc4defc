//! Reading every record of the replayed copy: each key and value must
//! decode, each payload must be where its pointer says and match its
//! checksum. What was read is kept for the relations' checks, storage's
//! and the queue's.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::VerifyReport;
use crate::storage::error::{Result, StorageError};
use crate::storage::keys::{
    OwnedKey, TAG_ANNOTATIONS, TAG_COUNTERS, TAG_DEDUP, TAG_EXCHANGE, TAG_GROUP, TAG_META,
    TAG_PAYLOAD, TAG_QUEUE, TAG_SYS,
};
use crate::storage::local::{payloads, wal};
use crate::storage::records::{
    self, CountersRecord, DedupRecord, ExchangeRecord, GroupRecord, MetaRecord, PayloadRecord,
    QueueRecord,
};

/// The records read, as the relations' checks need them.
#[derive(Default)]
pub(crate) struct Records {
    /// Queues by name.
    pub(crate) queues: BTreeMap<String, QueueRecord>,
    /// Counters by queue number.
    pub(crate) counters: HashMap<u32, CountersRecord>,
    /// Messages: queue number, position, record.
    pub(crate) metas: Vec<(u32, u64, MetaRecord)>,
    /// Body size of each payload that decoded, by payload number.
    pub(crate) payload_sizes: HashMap<u64, usize>,
    /// FIFO groups: queue number, group id.
    pub(crate) groups: Vec<(u32, String)>,
    /// The queue number of each dedup entry.
    pub(crate) dedups: Vec<u32>,
    /// System values by their key's byte.
    pub(crate) sys: HashMap<u8, u64>,
    /// Bytes of every payload body.
    pub(crate) payload_bytes: u64,
    /// Payloads kept in the log (pointers rather than values).
    pub(crate) pointers: usize,
}

/// Where payload pointers lead: the log's segments, their sizes, and the
/// segments opened so far.
struct Segments<'a> {
    wal_dir: &'a Path,
    sizes: &'a HashMap<u64, u64>,
    files: HashMap<u64, File>,
}

/// Reads every record of `db` (`db_dir` names it in errors); payload
/// pointers lead into the segments of `wal_dir`, of the sizes given.
pub(super) fn read_all(
    db: &sled::Db,
    db_dir: &Path,
    wal_dir: &Path,
    seg_sizes: &HashMap<u64, u64>,
    r: &mut VerifyReport,
) -> Result<Records> {
    let mut recs = Records::default();
    let mut segs = Segments {
        wal_dir,
        sizes: seg_sizes,
        files: HashMap::new(),
    };
    for item in db.iter() {
        let (k, v) = item.map_err(|e| StorageError::Db {
            path: db_dir.to_path_buf(),
            source: e,
        })?;
        let what = || format!("key {:02x?}", &k[..k.len().min(24)]);
        match k.first().copied() {
            Some(TAG_SYS) => {
                if k.len() != 2 || v.len() != 8 {
                    r.problem(format!("{}: malformed system value", what()));
                    continue;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&v);
                recs.sys.insert(k[1], u64::from_be_bytes(b));
            }
            Some(TAG_PAYLOAD) => {
                if k.len() != 9 {
                    r.problem(format!("{}: malformed payload key", what()));
                    continue;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&k[1..9]);
                read_payload(u64::from_be_bytes(b), &v, &mut segs, &mut recs, r)?;
            }
            Some(
                TAG_QUEUE | TAG_COUNTERS | TAG_META | TAG_DEDUP | TAG_GROUP | TAG_EXCHANGE
                | TAG_ANNOTATIONS,
            ) => {
                let Some(key) = OwnedKey::decode(&k) else {
                    r.problem(format!("{}: malformed key", what()));
                    continue;
                };
                if let Err(e) = read_engine_record(key, &v, &mut recs, &what) {
                    r.problem(e);
                }
            }
            _ => r.problem(format!("{}: unknown key space", what())),
        }
    }
    Ok(recs)
}

/// A payload's value: the record itself, or a pointer to it in the log.
fn read_payload(
    pid: u64,
    v: &[u8],
    segs: &mut Segments<'_>,
    recs: &mut Records,
    r: &mut VerifyReport,
) -> Result<()> {
    let name = format!("payload {pid}");
    let bytes = match payloads::Loc::decode(v) {
        Some(loc) => {
            recs.pointers += 1;
            match read_pointed(&name, loc, segs, r)? {
                Some(bytes) => bytes,
                None => return Ok(()),
            }
        }
        None => v.to_vec(),
    };
    match records::decode::<PayloadRecord>(&name, &bytes) {
        Ok(p) => {
            if let Err(e) = p.verify(&name) {
                r.problem(e.to_string());
            }
            recs.payload_bytes += p.body.len() as u64;
            recs.payload_sizes.insert(pid, p.body.len());
        }
        Err(e) => r.problem(e.to_string()),
    }
    Ok(())
}

/// The bytes a payload pointer leads to; `None` (with the problem
/// reported) when its segment is missing or too short.
fn read_pointed(
    name: &str,
    loc: payloads::Loc,
    segs: &mut Segments<'_>,
    r: &mut VerifyReport,
) -> Result<Option<Vec<u8>>> {
    let path = wal::segment_path(segs.wal_dir, loc.seg);
    let Some(size) = segs.sizes.get(&loc.seg) else {
        r.problem(format!(
            "{name} points into {}, which is missing",
            path.display()
        ));
        return Ok(None);
    };
    if loc.off + u64::from(loc.len) > *size {
        r.problem(format!(
            "{name} points to bytes {}..{} of {}, which has {size}",
            loc.off,
            loc.off + u64::from(loc.len),
            path.display()
        ));
        return Ok(None);
    }
    if let std::collections::hash_map::Entry::Vacant(e) = segs.files.entry(loc.seg) {
        e.insert(File::open(&path).map_err(|e| StorageError::io("open", &path, e))?);
    }
    let f = &segs.files[&loc.seg];
    let mut buf = vec![0u8; usize::try_from(loc.len).unwrap_or(0)];
    f.read_exact_at(&mut buf, loc.off)
        .map_err(|e| StorageError::io("read", &path, e))?;
    Ok(Some(buf))
}

/// One record of the engine's key spaces, decoded and kept.
fn read_engine_record(
    key: OwnedKey,
    v: &[u8],
    recs: &mut Records,
    what: &dyn Fn() -> String,
) -> std::result::Result<(), String> {
    let name = format!("{key:?}");
    let bad = |e: StorageError| e.to_string();
    match key {
        OwnedKey::Queue(q) => records::decode::<QueueRecord>(&name, v)
            .map(|rec| {
                recs.queues.insert(q, rec);
            })
            .map_err(bad),
        OwnedKey::Counters(qid) => records::decode::<CountersRecord>(&name, v)
            .map(|rec| {
                recs.counters.insert(qid, rec);
            })
            .map_err(bad),
        OwnedKey::Meta(qid, pos) => records::decode::<MetaRecord>(&name, v)
            .map(|rec| recs.metas.push((qid, pos, rec)))
            .map_err(bad),
        OwnedKey::Dedup(qid, _) => records::decode::<DedupRecord>(&name, v)
            .map(|_| recs.dedups.push(qid))
            .map_err(bad),
        OwnedKey::Group(qid, g) => records::decode::<GroupRecord>(&name, v)
            .map(|_| recs.groups.push((qid, g)))
            .map_err(bad),
        OwnedKey::Exchange(_) => records::decode::<ExchangeRecord>(&name, v)
            .map(|_| ())
            .map_err(bad),
        OwnedKey::Annotations(_) => records::decode::<records::AnnotationsRecord>(&name, v)
            .map(|_| ())
            .map_err(bad),
        OwnedKey::Other => Err(format!("{}: unknown key", what())),
    }
}
