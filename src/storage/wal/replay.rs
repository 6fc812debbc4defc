//! Reading the log back: a segment's frames, the continuity check of a
//! start, and replay.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::Mutation;
use super::frame::{HEADER, RawFrame, decode_txn, frame_len_hint, parse_frame};
use super::segment::{list_segments, segment_path};
use crate::storage::error::{Result, StorageError};

/// Bytes read at a time by [`read_frames`].
pub(super) const READ_STEP: usize = 1 << 20;

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
pub(super) fn applied_whole(path: &Path, next: &Path, after: u64) -> Result<bool> {
    let (Some(first), Some(following)) = (first_frame(path)?, first_frame(next)?) else {
        return Ok(false);
    };
    Ok(first.lsn < following.lsn && following.lsn <= after.saturating_add(1))
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
