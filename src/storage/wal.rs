//! The write-ahead log: append-only segment files of framed records.
//!
//! ## Record frame
//!
//! ```text
//! offset  size  field
//! 0       4     len          payload length, u32 little-endian, > 0
//! 4       4     crc          CRC-32 of bytes 8 .. 24+len
//! 8       8     lsn          log sequence number, u64 LE, +1 per record
//! 16      8     batch_first  lsn of the first record of the same write
//! 24      len   payload      one transaction (see `encode_txn`)
//! ```
//!
//! A transaction payload is `count: u32` followed by `count` mutations,
//! each `klen: u16, key, tag: u8` (0 delete, 1 put) and, for a put,
//! `vlen: u32, value`. All integers little-endian.
//!
//! ## Segments
//!
//! Segments are `wal/<number>.wal`, numbered upwards, and are filled with
//! zeros and fsynced (file and directory) by a preallocation thread before
//! the writer uses them, so that appending to them later is an overwrite of
//! allocated blocks: `fdatasync` then has no metadata to commit. A record
//! never spans two segments.
//!
//! ## Reading back
//!
//! Replay reads segments in order; within a segment it reads frames until
//! one is zero or fails its CRC (the rest of the segment is unused, or the
//! tail of a write torn by a crash). The log ends at the first segment that
//! holds no frame. Damage is told apart from a torn tail: if an intact frame
//! of a *later* write (its `batch_first` is past the broken frame) follows
//! a broken one, or a segment does not continue the previous one's lsns,
//! durable data was damaged and replay refuses to go on rather than drop
//! acknowledged records.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};

use super::error::{Result, StorageError};
use super::fsutil;
use super::rank::{Rank, RankedCondvar, RankedMutex};
use crate::faults::{self, Fault};

/// Size of a frame header.
pub const HEADER: usize = 24;

/// One change to the materialised state: a put or a delete of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// The key bytes (see `keys.rs`).
    pub key: Bytes,
    /// The new value, `None` to delete.
    pub value: Option<Bytes>,
    /// The key never existed before this put (a new position or payload
    /// number). Not logged: it only lets the memtable drop a put and a
    /// later delete of the same key that meet before reaching the
    /// database.
    pub fresh: bool,
    /// Put only if the key exists when the change is applied (moving a
    /// payload to a newer log segment; logged as tag 2).
    pub if_exists: bool,
}

impl Mutation {
    /// A put.
    pub fn put(key: Bytes, value: Bytes) -> Mutation {
        Mutation {
            key,
            value: Some(value),
            fresh: false,
            if_exists: false,
        }
    }

    /// A delete.
    pub fn delete(key: Bytes) -> Mutation {
        Mutation {
            key,
            value: None,
            fresh: false,
            if_exists: false,
        }
    }
}

/// Appends the encoding of one transaction to `out`; returns, for each
/// value whose key satisfies `locate`, (mutation index, offset of the value
/// from the start of `out`).
pub fn encode_txn_locating(
    muts: &[Mutation],
    out: &mut Vec<u8>,
    locate: impl Fn(&[u8]) -> bool,
) -> Vec<(usize, usize)> {
    let mut located = Vec::new();
    out.extend_from_slice(&u32::try_from(muts.len()).unwrap_or(u32::MAX).to_le_bytes());
    for (i, m) in muts.iter().enumerate() {
        let klen = u16::try_from(m.key.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&klen.to_le_bytes());
        out.extend_from_slice(&m.key[..usize::from(klen)]);
        match &m.value {
            None => out.push(0),
            Some(v) => {
                out.push(if m.if_exists { 2 } else { 1 });
                out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
                if locate(&m.key) {
                    located.push((i, out.len()));
                }
                out.extend_from_slice(v);
            }
        }
    }
    located
}

/// Appends the encoding of one transaction to `out`.
pub fn encode_txn(muts: &[Mutation], out: &mut Vec<u8>) {
    encode_txn_locating(muts, out, |_| false);
}

/// Size of the encoding of one transaction.
pub fn encoded_len(muts: &[Mutation]) -> usize {
    4 + muts
        .iter()
        .map(|m| 3 + m.key.len() + m.value.as_ref().map_or(0, |v| 4 + v.len()))
        .sum::<usize>()
}

/// Decodes a transaction payload; the mutations share `payload`'s memory.
pub fn decode_txn(payload: &Bytes) -> std::result::Result<Vec<Mutation>, String> {
    let mut buf = payload.clone();
    let need = |buf: &Bytes, n: usize| {
        if buf.remaining() < n {
            Err(format!(
                "transaction truncated: {} bytes left, {n} needed",
                buf.remaining()
            ))
        } else {
            Ok(())
        }
    };
    need(&buf, 4)?;
    let count = buf.get_u32_le();
    let mut muts = Vec::with_capacity(usize::try_from(count.min(1 << 16)).unwrap_or(0));
    for _ in 0..count {
        need(&buf, 2)?;
        let klen = usize::from(buf.get_u16_le());
        need(&buf, klen + 1)?;
        let key = buf.split_to(klen);
        let tag = buf.get_u8();
        let value = match tag {
            0 => None,
            1 | 2 => {
                need(&buf, 4)?;
                let vlen = usize::try_from(buf.get_u32_le()).map_err(|e| e.to_string())?;
                need(&buf, vlen)?;
                Some(buf.split_to(vlen))
            }
            t => return Err(format!("unknown mutation tag {t}")),
        };
        muts.push(Mutation {
            key,
            value,
            fresh: false,
            if_exists: tag == 2,
        });
    }
    if buf.has_remaining() {
        return Err(format!("{} stray bytes after transaction", buf.remaining()));
    }
    Ok(muts)
}

/// Appends one framed record to `out`; returns (mutation index, offset of
/// the value from the start of the frame) for each value whose key
/// satisfies `locate`.
pub fn frame(
    lsn: u64,
    batch_first: u64,
    muts: &[Mutation],
    out: &mut Vec<u8>,
    locate: impl Fn(&[u8]) -> bool,
) -> Vec<(usize, usize)> {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    let located = encode_txn_locating(muts, out, locate)
        .into_iter()
        .map(|(i, off)| (i, off - start))
        .collect();
    let len = u32::try_from(out.len() - start - HEADER).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&lsn.to_le_bytes());
    out[start + 16..start + 24].copy_from_slice(&batch_first.to_le_bytes());
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    located
}

/// A frame read back from a segment.
struct RawFrame {
    lsn: u64,
    batch_first: u64,
    payload: Bytes,
    len: usize,
}

/// Parses the frame at `pos`; `None` if it is zero, truncated or damaged.
fn parse_frame(data: &Bytes, pos: usize) -> Option<RawFrame> {
    let header = data.get(pos..pos + HEADER)?;
    let len = usize::try_from(u32::from_le_bytes(header[0..4].try_into().ok()?)).ok()?;
    if len == 0 {
        return None;
    }
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    let end = pos.checked_add(HEADER)?.checked_add(len)?;
    let body = data.get(pos + 8..end)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    Some(RawFrame {
        lsn: u64::from_le_bytes(header[8..16].try_into().ok()?),
        batch_first: u64::from_le_bytes(header[16..24].try_into().ok()?),
        payload: data.slice(pos + HEADER..end),
        len: HEADER + len,
    })
}

/// Bytes read at a time by [`read_frames`].
const READ_STEP: usize = 1 << 20;

/// Reads the part of the segment file at `path` that holds its frames:
/// from the start, following each frame's length field, up to the first
/// zero length, a length that runs past the end of the file, or a frame
/// whose lsn is not above the one before it (a reused segment's older
/// records follow its current ones), that frame and the one after it
/// included. A segment is zeros or old records beyond its last frame, and
/// reading those was most of the work (and of the memory) of replaying a
/// segment still being written. Every check the replay makes on the bytes
/// (a frame's checksum, its lsn against the one before, the frame after a
/// damaged one) looks only at bytes this reads, so the answers are those
/// the whole file would give.
pub(crate) fn read_frames(path: &Path) -> Result<Bytes> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| StorageError::io("open", path, e))?;
    let size = file
        .metadata()
        .map_err(|e| StorageError::io("stat", path, e))?
        .len();
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    // Capacity only: pages the reads do not reach are never touched.
    let mut data: Vec<u8> = Vec::with_capacity(size);
    let mut fill = |data: &mut Vec<u8>, want: usize| -> Result<()> {
        while data.len() < want.min(size) {
            let step = (want - data.len()).max(READ_STEP) as u64;
            let n = (&mut file)
                .take(step)
                .read_to_end(data)
                .map_err(|e| StorageError::io("read", path, e))?;
            if n == 0 {
                break;
            }
        }
        Ok(())
    };
    let mut pos = 0usize;
    let mut last_lsn: Option<u64> = None;
    // An older frame was met: the frame after it is the last one read.
    let mut older_met = false;
    loop {
        fill(&mut data, pos.saturating_add(HEADER))?;
        let Some(len) = frame_len_hint(&data, pos) else {
            break;
        };
        let Some(next) = pos.checked_add(len).filter(|&n| n <= size) else {
            break;
        };
        let lsn = data
            .get(pos + 8..pos + 16)
            .and_then(|h| h.try_into().ok())
            .map(u64::from_le_bytes);
        let older = matches!((last_lsn, lsn), (Some(l), Some(n)) if n <= l);
        last_lsn = lsn.or(last_lsn);
        fill(&mut data, next)?;
        pos = next;
        if older_met {
            break;
        }
        older_met = older;
    }
    Ok(Bytes::from(data))
}

/// The first intact frame of the segment at `path`, read alone.
fn first_frame(path: &Path) -> Result<Option<RawFrame>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| StorageError::io("open", path, e))?;
    let mut header = [0u8; HEADER];
    match file.read_exact_at(&mut header, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(StorageError::io("read", path, e)),
    }
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let size = file
        .metadata()
        .map_err(|e| StorageError::io("stat", path, e))?
        .len();
    if len == 0 || (HEADER + len) as u64 > size {
        return Ok(None);
    }
    let mut buf = vec![0u8; HEADER + len];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| StorageError::io("read", path, e))?;
    Ok(parse_frame(&Bytes::from(buf), 0))
}

/// True when every record of the segment at `path` is at or below `after`
/// (in the database already), judged from two first frames without
/// reading the segment: the one of `path`, and the one of the segment that
/// follows it, `next`. Frames are only ever appended to the current
/// segment and lsns only go up, so an intact frame in a later segment with
/// an lsn above `path`'s first was written once `path` was finished: every
/// lsn of `path` is below it. (That frame may be left from the file's
/// earlier life, if it was reused and not yet overwritten; the argument
/// holds all the same.)
fn applied_whole(path: &Path, next: &Path, after: u64) -> Result<bool> {
    let (Some(first), Some(following)) = (first_frame(path)?, first_frame(next)?) else {
        return Ok(false);
    };
    Ok(first.lsn < following.lsn && following.lsn <= after.saturating_add(1))
}

/// The transactions of every intact frame of a segment's data, from the
/// start until the first frame that is zero or damaged.
pub fn frames(data: &Bytes) -> impl Iterator<Item = Vec<Mutation>> + '_ {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let f = parse_frame(data, pos)?;
        pos += f.len;
        decode_txn(&f.payload).ok()
    })
}

/// The lsns of a segment's records: its intact frames from the start, as
/// long as their lsns go up (older records of a reused segment follow).
pub fn frame_lsns(data: &Bytes) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    let mut pos = 0usize;
    while let Some(f) = parse_frame(data, pos) {
        if out.last().is_some_and(|&l| f.lsn <= l) {
            break;
        }
        out.push(f.lsn);
        pos += f.len;
    }
    out
}

/// Length field of the frame at `pos`, if its header is readable.
fn frame_len_hint(data: &[u8], pos: usize) -> Option<usize> {
    let header = data.get(pos..pos + 4)?;
    let len = usize::try_from(u32::from_le_bytes(header.try_into().ok()?)).ok()?;
    (len > 0).then_some(HEADER + len)
}

/// The path of segment `number`.
pub fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:020}.wal"))
}

/// Segment numbers present in `dir`, ascending.
pub fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| StorageError::io("read directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read directory", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(num) = name
            .strip_suffix(".wal")
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push(num);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// What replay found.
#[derive(Debug, Default)]
pub struct ReplayEnd {
    /// The last lsn read (or `after` if none was newer).
    pub last_lsn: u64,
    /// Records replayed.
    pub replayed: u64,
    /// Highest segment number seen.
    pub last_segment: u64,
}

/// Checks that the log still goes on where the last checkpoint says it
/// does: `log` is (segment number, lsn of its first record) of the segment
/// that held (or was to hold) the record after `applied`. That segment
/// must exist; if its first record was at or below `applied` (it held
/// records when the checkpoint was taken, durable since), that record must
/// still be there; and from it on, the segments must be consecutive (the
/// log is written into consecutive segments, and only segments before it
/// are ever retired). A missing, zeroed or replaced segment there would
/// otherwise end the log early and quietly drop acknowledged changes; this
/// names the file instead.
///
/// `sizes` are the sizes the segments from that one on had at the
/// checkpoint: segments are created full size (zero-filled under a
/// temporary name, then renamed) and never shrink, so one that is shorter
/// now was truncated (a torn write never shortens a file).
pub fn check_continuity(
    dir: &Path,
    applied: u64,
    log: (u64, u64),
    sizes: &[(u64, u64)],
) -> Result<()> {
    let (segment, first) = log;
    let present = list_segments(dir)?;
    for &(number, size) in sizes {
        let path = segment_path(dir, number);
        let now = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "this log segment is missing, but it was part of the log at the last checkpoint (lsn {applied})"
                    ),
                ));
            }
            Err(e) => return Err(StorageError::io("stat", &path, e)),
        };
        if now < size {
            return Err(StorageError::corrupt(
                path.display().to_string(),
                format!(
                    "this log segment is {now} bytes, but it was {size} at the last checkpoint: it was truncated"
                ),
            ));
        }
    }
    let path = segment_path(dir, segment);
    if !present.contains(&segment) {
        return Err(StorageError::corrupt(
            path.display().to_string(),
            format!(
                "this log segment is missing, but the last checkpoint (lsn {applied}) says the log goes on in it: acknowledged changes after lsn {applied} would be lost; restore the file"
            ),
        ));
    }
    // A record after `first` in the next segment means the log filled this
    // one: its first record was durable then.
    let moved_on = || -> Result<bool> {
        let next = segment_path(dir, segment + 1);
        Ok(next.exists() && first_frame(&next)?.is_some_and(|f| f.lsn > first))
    };
    if first <= applied || moved_on()? {
        match first_frame(&path)? {
            Some(f) if f.lsn == first => {}
            Some(f) => {
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "its first record is lsn {}, but the last checkpoint recorded lsn {first} there: the segment was replaced",
                        f.lsn
                    ),
                ));
            }
            None => {
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "its first record (lsn {first}, durable since the last checkpoint at lsn {applied}, later records following it) is gone: the segment was zeroed or damaged"
                    ),
                ));
            }
        }
    }
    let from: Vec<u64> = present.into_iter().filter(|&n| n >= segment).collect();
    for w in from.windows(2) {
        if w[1] != w[0] + 1 {
            return Err(StorageError::corrupt(
                segment_path(dir, w[0] + 1).display().to_string(),
                format!(
                    "this log segment is missing between {} and {}: the log is written into consecutive segments",
                    segment_path(dir, w[0]).display(),
                    segment_path(dir, w[1]).display()
                ),
            ));
        }
    }
    Ok(())
}

/// Reads every record with `lsn > after`, in order, and hands its mutations
/// to `apply`. Records at or below `after` are in the database already and
/// are skipped; segments holding only such records (deleted after a
/// checkpoint, but the deletion not yet durable) are passed over.
pub fn replay(
    dir: &Path,
    after: u64,
    mut apply: impl FnMut(u64, Vec<Mutation>, u64, &Bytes) -> Result<()>,
) -> Result<ReplayEnd> {
    let segments = list_segments(dir)?;
    let mut end = ReplayEnd {
        last_lsn: after,
        last_segment: segments.last().copied().unwrap_or(0),
        ..ReplayEnd::default()
    };
    // The lsn the next record must carry, once records newer than `after`
    // have been met.
    let mut expected: Option<u64> = None;
    let mut ended_at: Option<(PathBuf, u64)> = None;
    for (i, &number) in segments.iter().enumerate() {
        let path = segment_path(dir, number);
        if ended_at.is_none()
            && expected.is_none()
            && let Some(&next) = segments.get(i + 1)
            && applied_whole(&path, &segment_path(dir, next), after)?
        {
            continue;
        }
        let data = read_frames(&path)?;
        if let Some((end_path, broken_lsn)) = &ended_at {
            // The log ended in an earlier segment: this one must be unused.
            if let Some(f) = parse_frame(&data, 0)
                && f.batch_first > *broken_lsn
            {
                return Err(StorageError::corrupt(
                    end_path.display().to_string(),
                    format!(
                        "log damaged before lsn {broken_lsn}: {} holds later records",
                        path.display()
                    ),
                ));
            }
            continue;
        }
        let mut pos = 0usize;
        loop {
            let Some(f) = parse_frame(&data, pos) else {
                // The rest of this segment is unused or torn.
                let broken = expected.unwrap_or(after + 1);
                check_torn_tail(&data, pos, broken, &path)?;
                if pos == 0 && expected.is_some() {
                    // An unused segment: the log ends here.
                    ended_at = Some((path.clone(), broken));
                }
                break;
            };
            if f.lsn <= after && expected.is_none() {
                pos += f.len; // in the database already
                continue;
            }
            let want = expected.unwrap_or(after + 1);
            if f.lsn < want && expected.is_some() {
                // A record from the segment's earlier life (reused
                // segment): the end of this segment's data.
                if pos == 0 {
                    ended_at = Some((path.clone(), want));
                }
                break;
            }
            if f.lsn != want {
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "log has a gap: lsn {want} expected, lsn {} found at offset {pos}",
                        f.lsn
                    ),
                ));
            }
            expected = Some(f.lsn + 1);
            let muts = decode_txn(&f.payload).map_err(|e| {
                StorageError::corrupt(path.display().to_string(), format!("lsn {}: {e}", f.lsn))
            })?;
            apply(f.lsn, muts, number, &data)?;
            end.replayed += 1;
            end.last_lsn = f.lsn;
            pos += f.len;
        }
    }
    Ok(end)
}

/// After the log's end at `pos`: refuses if an intact frame of a later
/// write follows the broken one (durable data was damaged).
fn check_torn_tail(data: &Bytes, pos: usize, broken_lsn: u64, path: &Path) -> Result<()> {
    let Some(len) = frame_len_hint(data, pos) else {
        return Ok(());
    };
    if let Some(next) = parse_frame(data, pos + len)
        && next.batch_first > broken_lsn
        && broken_lsn != 0
    {
        return Err(StorageError::corrupt(
            path.display().to_string(),
            format!("record lsn {broken_lsn} is damaged but later records follow it"),
        ));
    }
    Ok(())
}

/// A segment ready to be written.
pub struct Segment {
    /// Its number.
    pub number: u64,
    /// The open file.
    pub file: File,
    /// Its path.
    pub path: PathBuf,
    /// Its size.
    pub size: u64,
}

/// Most retired segments kept for reuse.
const MAX_SPARES: usize = 2;

/// Segments retired after a checkpoint and kept for reuse, so that the
/// log is written into blocks that are already allocated (an overwrite,
/// which `fdatasync` makes durable without a metadata commit) and new
/// segments rarely need zero-filling. A reused segment still holds old
/// records; their lsns are below every new one, so replay reads them as
/// the end of the segment's data.
pub struct Pool {
    dir: PathBuf,
    size: u64,
    spares: RankedMutex<Vec<PathBuf>>,
    next_spare: std::sync::atomic::AtomicU64,
}

impl Pool {
    /// A pool for `dir`, picking up spares left by an earlier run.
    pub fn open(dir: &Path, size: u64) -> Result<Pool> {
        let mut spares = Vec::new();
        let mut next = 0u64;
        let entries =
            std::fs::read_dir(dir).map_err(|e| StorageError::io("read directory", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io("read directory", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(n) = name
                .strip_prefix("spare-")
                .and_then(|r| r.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                next = next.max(n + 1);
                spares.push(entry.path());
            } else if name.ends_with(".tmp") {
                // A zero-fill cut short by a crash.
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Pool {
            dir: dir.to_path_buf(),
            size,
            spares: RankedMutex::new(Rank::POOL, "pool", spares),
            next_spare: std::sync::atomic::AtomicU64::new(next),
        })
    }

    /// Retired segments ready to be reused (taking no new space).
    pub fn spare_count(&self) -> usize {
        self.spares.lock().len()
    }

    /// Retires a segment whose records are all applied: kept as a spare,
    /// or deleted when there are enough. The caller fsyncs the directory.
    pub fn retire(&self, path: &Path) -> Result<()> {
        let mut spares = self.spares.lock();
        if spares.len() >= MAX_SPARES {
            return std::fs::remove_file(path).map_err(|e| StorageError::io("remove", path, e));
        }
        let n = self
            .next_spare
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let spare = self.dir.join(format!("spare-{n:020}.seg"));
        std::fs::rename(path, &spare).map_err(|e| StorageError::io("rename", path, e))?;
        spares.push(spare);
        Ok(())
    }

    /// Segment `number`, from a spare if there is one (renamed, directory
    /// fsynced), else zero-filled.
    pub fn segment(&self, number: u64) -> Result<Segment> {
        let spare = self.spares.lock().pop();
        let Some(spare) = spare else {
            return preallocate(&self.dir, number, self.size);
        };
        let path = segment_path(&self.dir, number);
        std::fs::rename(&spare, &path).map_err(|e| StorageError::io("rename", &spare, e))?;
        fsutil::sync_dir(&self.dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| StorageError::io("open", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| StorageError::io("stat", &path, e))?
            .len();
        Ok(Segment {
            number,
            file,
            path,
            size,
        })
    }
}

/// Bytes of zeros a preallocation writes and flushes at a time. The log
/// writer's `fdatasync` calls wait behind whatever write-back is queued on
/// the same disk: a step of 4 MiB held them up 9-18 ms on the benchmark
/// machine; with 256 KiB steps most of those slow calls went
/// (docs/benchmarks/2026-11-30f/NOTES.md, "Preallocation in small steps").
const PREALLOC_STEP: usize = 256 << 10;

/// The zeros a preallocation writes: static, so that preparing a segment
/// takes no heap (a 256 KiB buffer alive for the seconds a segment takes
/// to prepare showed up in whatever heap figure was read meanwhile).
static ZEROS: [u8; PREALLOC_STEP] = [0; PREALLOC_STEP];

/// Creates segment `number` of `size` bytes filled with zeros and makes it
/// durable (file and directory).
pub fn preallocate(dir: &Path, number: u64, size: u64) -> Result<Segment> {
    let path = segment_path(dir, number);
    let tmp = dir.join(format!("{number:020}.tmp"));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| StorageError::io("create", &tmp, e))?;
    let mut left = size;
    while left > 0 {
        let n = usize::try_from(left).map_or(PREALLOC_STEP, |l| l.min(PREALLOC_STEP));
        if let Err(e) = file.write_all(&ZEROS[..n]) {
            let _ = std::fs::remove_file(&tmp);
            return Err(StorageError::io("preallocate", &tmp, e));
        }
        left -= n as u64;
        if let Err(e) = file.sync_data() {
            let _ = std::fs::remove_file(&tmp);
            return Err(StorageError::io("fsync", &tmp, e));
        }
    }
    if let Err(e) = file.sync_all() {
        let _ = std::fs::remove_file(&tmp);
        return Err(StorageError::io("fsync", &tmp, e));
    }
    std::fs::rename(&tmp, &path).map_err(|e| StorageError::io("rename", &path, e))?;
    fsutil::sync_dir(dir)?;
    Ok(Segment {
        number,
        file,
        path,
        size,
    })
}

/// Shared state between the writer and the preallocation thread.
struct Spare {
    ready: Option<Result<Segment>>,
    next_number: u64,
    stop: bool,
}

/// Keeps the next segment ready ahead of the writer.
pub struct Preallocator {
    shared: Arc<(RankedMutex<Spare>, RankedCondvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Preallocator {
    /// Starts the thread; the first segment it prepares is `first_number`.
    pub fn start(pool: Arc<Pool>, first_number: u64) -> Preallocator {
        let shared = Arc::new((
            RankedMutex::new(
                Rank::SPARE,
                "spare",
                Spare {
                    ready: None,
                    next_number: first_number,
                    stop: false,
                },
            ),
            RankedCondvar::new(),
        ));
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("letterbox-wal-prealloc".into())
            .spawn(move || preallocate_loop(&pool, &s))
            .ok();
        Preallocator { shared, thread }
    }

    /// Takes the prepared segment, waiting for it if needed.
    pub fn take(&self) -> Result<Segment> {
        let (lock, cv) = &*self.shared;
        let mut spare = lock.lock();
        loop {
            if let Some(seg) = spare.ready.take() {
                cv.notify_all();
                return seg;
            }
            if self.thread.is_none() {
                return Err(StorageError::Stopped {
                    reason: "no preallocation thread".into(),
                });
            }
            spare = cv.wait(spare);
        }
    }
}

impl Drop for Preallocator {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().stop = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn preallocate_loop(pool: &Pool, shared: &(RankedMutex<Spare>, RankedCondvar)) {
    let (lock, cv) = shared;
    loop {
        let number = {
            let mut spare = lock.lock();
            while spare.ready.is_some() && !spare.stop {
                spare = cv.wait(spare);
            }
            if spare.stop {
                return;
            }
            spare.next_number
        };
        let result = pool.segment(number);
        let mut spare = lock.lock();
        if spare.stop {
            return;
        }
        match &result {
            Ok(_) => spare.next_number += 1,
            Err(e) => tracing::warn!(error = %e, "cannot prepare the next log segment"),
        }
        let failed = result.is_err();
        spare.ready = Some(result);
        cv.notify_all();
        if failed {
            // Hand the error over (the writer fails if it needs a segment
            // now), then try again after a pause.
            drop(spare);
            std::thread::sleep(Duration::from_millis(200));
            let mut spare = lock.lock();
            if matches!(spare.ready, Some(Err(_))) {
                spare.ready = None;
            }
        }
    }
}

/// The segment being written.
pub struct Writer {
    current: Segment,
    offset: u64,
    /// Negative control ([`Fault::AckBeforeFsync`]): the last batch's
    /// fdatasync, left to the next one. Never set without that fault.
    unsynced: bool,
    prealloc: Preallocator,
    /// (segment number, lsn of its first record) of every segment written
    /// since start, oldest first.
    pub(crate) written: Arc<RankedMutex<Vec<(u64, u64)>>>,
}

impl Writer {
    /// Starts writing into a new segment numbered after `last_number`.
    pub fn start(pool: Arc<Pool>, last_number: u64) -> Result<Writer> {
        let current = pool.segment(last_number + 1)?;
        let prealloc = Preallocator::start(pool, last_number + 2);
        Ok(Writer {
            current,
            offset: 0,
            unsynced: false,
            prealloc,
            written: Arc::new(RankedMutex::new(Rank::SEGMENTS, "segments", Vec::new())),
        })
    }

    /// Writes framed records and makes them durable. `frames` holds whole
    /// frames back to back; `bounds` gives (end offset in `frames`, lsn) of
    /// each. Returns once everything is fdatasync'd. A record never spans
    /// segments, and a segment's records are durable before the next
    /// segment is written.
    pub fn write(&mut self, frames: &[u8], bounds: &[(usize, u64)]) -> Result<Vec<(u64, u64)>> {
        // Negative control: the batch before, answered long since, is
        // synced only now.
        if faults::on(Fault::AckBeforeFsync) && std::mem::take(&mut self.unsynced) {
            self.current
                .file
                .sync_data()
                .map_err(|e| StorageError::io("fdatasync", &self.current.path, e))?;
        }
        let mut start = 0usize;
        let mut i = 0usize;
        let mut placed = Vec::with_capacity(bounds.len());
        while i < bounds.len() {
            let room = self.current.size - self.offset;
            // Take as many whole frames as fit.
            let mut j = i;
            while j < bounds.len() && (bounds[j].0 - start) as u64 <= room {
                j += 1;
            }
            if j == i {
                // The next frame does not fit: move to a new segment (one
                // large enough for it).
                let need = (bounds[i].0 - start) as u64;
                self.switch(need)?;
                continue;
            }
            let end = bounds[j - 1].0;
            self.note_first_lsn(bounds[i].1);
            // Where each of these frames lands: (segment, file offset).
            let mut frame_start = start;
            for b in &bounds[i..j] {
                placed.push((
                    self.current.number,
                    self.offset + (frame_start - start) as u64,
                ));
                frame_start = b.0;
            }
            self.current
                .file
                .write_all_at(&frames[start..end], self.offset)
                .map_err(|e| StorageError::io("write", &self.current.path, e))?;
            // Negative control: the last fdatasync is left to the next
            // batch; this one is answered without it.
            if faults::on(Fault::AckBeforeFsync) && j == bounds.len() {
                self.unsynced = true;
            } else {
                self.current
                    .file
                    .sync_data()
                    .map_err(|e| StorageError::io("fdatasync", &self.current.path, e))?;
            }
            self.offset += (end - start) as u64;
            start = end;
            i = j;
        }
        Ok(placed)
    }

    fn note_first_lsn(&mut self, lsn: u64) {
        let mut written = self.written.lock();
        if written
            .last()
            .is_none_or(|&(n, _)| n != self.current.number)
        {
            written.push((self.current.number, lsn));
        }
    }

    fn switch(&mut self, need: u64) -> Result<()> {
        let mut next = self.prealloc.take()?;
        if need > next.size {
            // A record larger than a segment: grow this one to hold it.
            next.file
                .set_len(need)
                .and_then(|()| next.file.sync_all())
                .map_err(|e| StorageError::io("extend", &next.path, e))?;
            next.size = need;
        }
        self.current = next;
        self.offset = 0;
        Ok(())
    }

    /// Number of the segment being written.
    pub fn current_number(&self) -> u64 {
        self.current.number
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str) -> Mutation {
        Mutation {
            key: Bytes::copy_from_slice(k.as_bytes()),
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            fresh: false,
            if_exists: false,
        }
    }

    #[test]
    fn txn_codec_round_trips_and_rejects_garbage() {
        let muts = vec![put("a", "1"), Mutation::delete(Bytes::from_static(b"b"))];
        let mut out = Vec::new();
        encode_txn(&muts, &mut out);
        assert_eq!(out.len(), encoded_len(&muts));
        assert_eq!(
            decode_txn(&Bytes::from(out.clone())).expect("decodes"),
            muts
        );
        assert!(decode_txn(&Bytes::from(out[..out.len() - 1].to_vec())).is_err());
        let mut extra = out.clone();
        extra.push(7);
        assert!(decode_txn(&Bytes::from(extra)).is_err());
        assert!(decode_txn(&Bytes::from_static(&[1, 0, 0, 0, 1, 0, b'k', 9])).is_err());
    }

    fn write_records(dir: &Path, segment: u64, lsns: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let mut buf = Vec::new();
        let first = *lsns.start();
        for lsn in lsns {
            frame(
                lsn,
                first,
                &[put(&format!("k{lsn}"), "v")],
                &mut buf,
                |_| false,
            );
        }
        let mut data = buf.clone();
        data.resize(buf.len() + 4096, 0);
        std::fs::write(segment_path(dir, segment), &data).expect("write");
        buf
    }

    fn collect(dir: &Path, after: u64) -> Result<Vec<u64>> {
        let mut seen = Vec::new();
        replay(dir, after, |lsn, _, _, _| {
            seen.push(lsn);
            Ok(())
        })?;
        Ok(seen)
    }

    #[test]
    fn replay_reads_across_segments_and_skips_applied() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_records(dir.path(), 1, 1..=3);
        write_records(dir.path(), 2, 4..=6);
        assert_eq!(
            collect(dir.path(), 0).expect("replay"),
            vec![1, 2, 3, 4, 5, 6]
        );
        assert_eq!(collect(dir.path(), 4).expect("replay"), vec![5, 6]);
    }

    #[test]
    fn segments_wholly_applied_are_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let buf = write_records(dir.path(), 1, 1..=3);
        write_records(dir.path(), 2, 4..=6);
        write_records(dir.path(), 3, 7..=9);
        // Damage a record of segment 1 (not its first): had it been read,
        // later records following it would make this a refusal.
        let mut data = std::fs::read(segment_path(dir.path(), 1)).expect("read");
        data[buf.len() / 3 + HEADER + 2] ^= 0xff;
        std::fs::write(segment_path(dir.path(), 1), &data).expect("write");
        assert_eq!(
            collect(dir.path(), 3).expect("replay"),
            vec![4, 5, 6, 7, 8, 9]
        );
        assert_eq!(collect(dir.path(), 7).expect("replay"), vec![8, 9]);
        // Not wholly applied: read, and the damage refused.
        let err = collect(dir.path(), 2).expect_err("damage is detected");
        assert!(err.to_string().contains("lsn 3"), "{err}");
        // A following segment whose first frame is older (left from its
        // earlier life) says nothing: segment 2 is read.
        write_records(dir.path(), 3, 1..=2);
        assert!(
            applied_whole(
                &segment_path(dir.path(), 1),
                &segment_path(dir.path(), 2),
                3
            )
            .expect("judge")
        );
        assert!(
            !applied_whole(
                &segment_path(dir.path(), 2),
                &segment_path(dir.path(), 3),
                9
            )
            .expect("judge")
        );
    }

    #[test]
    fn torn_tail_ends_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let buf = write_records(dir.path(), 1, 1..=3);
        // Tear the last record: keep its header, zero half its body.
        let mut data = std::fs::read(segment_path(dir.path(), 1)).expect("read");
        let last_len = buf.len() / 3;
        for b in &mut data[buf.len() - last_len / 2..buf.len()] {
            *b = 0;
        }
        std::fs::write(segment_path(dir.path(), 1), &data).expect("write");
        assert_eq!(collect(dir.path(), 0).expect("replay"), vec![1, 2]);
    }

    #[test]
    fn damage_before_later_writes_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut buf = Vec::new();
        frame(1, 1, &[put("a", "1")], &mut buf, |_| false);
        let first_len = buf.len();
        frame(2, 2, &[put("b", "2")], &mut buf, |_| false);
        buf[HEADER + 3] ^= 0xff; // flip a payload byte of lsn 1
        std::fs::write(segment_path(dir.path(), 1), &buf).expect("write");
        let err = collect(dir.path(), 0).expect_err("damage is detected");
        assert!(err.to_string().contains("damaged"), "{err}");
        // The same damage inside one write (a torn batch) is only an end.
        let mut buf = Vec::new();
        frame(1, 1, &[put("a", "1")], &mut buf, |_| false);
        frame(2, 1, &[put("b", "2")], &mut buf, |_| false);
        buf[HEADER + 3] ^= 0xff;
        std::fs::write(segment_path(dir.path(), 1), &buf).expect("write");
        assert_eq!(collect(dir.path(), 0).expect("replay"), Vec::<u64>::new());
        assert!(first_len > HEADER);
    }

    #[test]
    fn writer_rolls_over_segments_and_replay_follows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(Pool::open(dir.path(), 256).expect("pool"));
        let mut w = Writer::start(pool, 0).expect("writer");
        let mut lsn = 1;
        for _ in 0..20 {
            let mut frames = Vec::new();
            let mut bounds = Vec::new();
            for _ in 0..3 {
                frame(
                    lsn,
                    lsn,
                    &[put(&format!("key{lsn}"), "value")],
                    &mut frames,
                    |_| false,
                );
                bounds.push((frames.len(), lsn));
                lsn += 1;
            }
            w.write(&frames, &bounds).expect("write");
        }
        // One record larger than a segment.
        let big = "x".repeat(1000);
        let mut frames = Vec::new();
        frame(lsn, lsn, &[put("big", &big)], &mut frames, |_| false);
        w.write(&frames, &[(frames.len(), lsn)]).expect("write big");
        assert!(w.current_number() > 2);
        drop(w);
        let seen = collect(dir.path(), 0).expect("replay");
        assert_eq!(seen, (1..=lsn).collect::<Vec<_>>());
    }

    /// Frames of `kib` KiB for `lsns` (all of one batch from `first`).
    fn big_frames(lsns: std::ops::RangeInclusive<u64>, first: u64, kib: usize) -> Vec<u8> {
        let value = "v".repeat(kib << 10);
        let mut buf = Vec::new();
        for lsn in lsns {
            frame(
                lsn,
                first,
                &[put(&format!("k{lsn}"), &value)],
                &mut buf,
                |_| false,
            );
        }
        buf
    }

    /// Writes `frames` as segment 1, zeros to 8 MiB after them.
    fn write_segment(dir: &Path, frames: &[u8]) {
        let mut data = frames.to_vec();
        data.resize(8 << 20, 0);
        std::fs::write(segment_path(dir, 1), &data).expect("write");
    }

    #[test]
    fn a_segment_is_read_only_as_far_as_its_frames() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = segment_path(dir.path(), 1);
        // Zeros after the frames are not read.
        let current = big_frames(11..=13, 11, 300);
        write_segment(dir.path(), &current);
        let read = read_frames(&path).expect("read");
        assert!(
            read.len() >= current.len() && read.len() < 4 << 20,
            "{}",
            read.len()
        );
        assert_eq!(collect(dir.path(), 10).expect("replay"), vec![11, 12, 13]);
        // Older records after them (a reused segment): the first of them
        // and the one after it are read, no more.
        let old = big_frames(1..=9, 1, 300);
        let one = old.len() / 9;
        let mut reused = current.clone();
        reused.extend_from_slice(&old);
        write_segment(dir.path(), &reused);
        let read = read_frames(&path).expect("read");
        assert!(read.len() >= current.len() + 2 * one, "{}", read.len());
        assert!(
            read.len() < current.len() + 2 * one + READ_STEP + HEADER,
            "{}",
            read.len()
        );
        assert_eq!(collect(dir.path(), 10).expect("replay"), vec![11, 12, 13]);
    }

    #[test]
    fn damage_is_judged_on_what_the_partial_read_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Frames larger than a read step, so that what is read is what
        // the frames' lengths lead to.
        let mut frames = big_frames(1..=1, 1, 1536);
        let first = frames.len();
        frames.extend(big_frames(2..=2, 2, 1536));
        frames.extend(big_frames(3..=3, 3, 1536));
        // Lsn 2's body damaged, lsn 3 written after it: refused.
        let mut damaged = frames.clone();
        damaged[first + HEADER + 100] ^= 0xff;
        write_segment(dir.path(), &damaged);
        let err = collect(dir.path(), 0).expect_err("damage is detected");
        assert!(err.to_string().contains("damaged"), "{err}");
        // Lsn 2's own lsn damaged (it no longer looks newer than lsn 1):
        // the frame after it is read all the same, and the damage refused.
        let mut damaged = frames.clone();
        damaged[first + 8..first + 16].copy_from_slice(&0u64.to_le_bytes());
        write_segment(dir.path(), &damaged);
        let err = collect(dir.path(), 0).expect_err("damage is detected");
        assert!(err.to_string().contains("damaged"), "{err}");
    }

    #[test]
    fn reused_segments_do_not_replay_their_old_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(Pool::open(dir.path(), 4096).expect("pool"));
        let mut w = Writer::start(Arc::clone(&pool), 0).expect("writer");
        let mut frames = Vec::new();
        let mut bounds = Vec::new();
        for lsn in 1..=10 {
            frame(
                lsn,
                1,
                &[put(&format!("k{lsn}"), "old")],
                &mut frames,
                |_| false,
            );
            bounds.push((frames.len(), lsn));
        }
        w.write(&frames, &bounds).expect("write");
        drop(w);
        // Everything applied: the segments are retired, then reused.
        for n in list_segments(dir.path()).expect("list") {
            pool.retire(&segment_path(dir.path(), n)).expect("retire");
        }
        let mut w = Writer::start(Arc::clone(&pool), 2).expect("writer");
        let mut frames = Vec::new();
        frame(11, 11, &[put("k11", "new")], &mut frames, |_| false);
        w.write(&frames, &[(frames.len(), 11)]).expect("write");
        drop(w);
        assert_eq!(collect(dir.path(), 10).expect("replay"), vec![11]);
    }
}
