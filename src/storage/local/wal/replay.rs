//! Reading the log back: a segment's frames, the continuity check of a
//! start, and replay.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::Mutation;
use super::frame::{HEADER, RawFrame, decode_txn, frame_len_hint, parse_frame};
use super::segment::{list_segments, segment_path};
use crate::faults::{self, Fault};
use crate::storage::error::{Result, StorageError};
use crate::storage::local::LoggedSegment;

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
/// `sizes` lists the segments from that one on as `CHECKPOINT` last
/// recorded them: segments are created full size (zero-filled under a
/// temporary name, then renamed) and never shrink, so one that is shorter
/// now was truncated (a torn write never shortens a file); and a segment
/// listed with the lsn of its first record had that record durable before
/// any record in it was acknowledged, so that record must still be its
/// first.
pub fn check_continuity(
    dir: &Path,
    applied: u64,
    log: (u64, u64),
    sizes: &[LoggedSegment],
) -> Result<()> {
    let (segment, first) = log;
    let present = list_segments(dir)?;
    for listed in sizes {
        let (number, size) = (listed.number, listed.size);
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
                    "this log segment is {now} bytes, but it was {size} when the log last recorded it: it was truncated"
                ),
            ));
        }
        if let Some(want) = listed.first {
            check_first(&path, want)?;
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
        check_first(&path, first)?;
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

/// Refuses unless the first intact frame of the segment at `path` is
/// record `want`, which was durable there before any record of the
/// segment was acknowledged.
fn check_first(path: &Path, want: u64) -> Result<()> {
    match first_frame(path)? {
        Some(f) if f.lsn == want => Ok(()),
        Some(f) => Err(StorageError::corrupt(
            path.display().to_string(),
            format!(
                "its first record is lsn {}, but the log recorded lsn {want} there: the segment was replaced",
                f.lsn
            ),
        )),
        None => Err(StorageError::corrupt(
            path.display().to_string(),
            format!(
                "its first record (lsn {want}, durable before any record in this segment was acknowledged) is gone: the segment was zeroed or damaged"
            ),
        )),
    }
}

/// Reads every record with `lsn > after`, in order, and hands its mutations
/// to `apply`. Records at or below `after` are in the database already and
/// are skipped; segments holding only such records (deleted after a
/// checkpoint, but the deletion not yet durable) are passed over.
///
/// Where the records stop (a zero or damaged frame, an older record of a
/// reused segment, a segment that does not go on), the log ends only if
/// that can be a torn write: no intact record of a *later* write may exist
/// anywhere after it, in the rest of that segment or in any later one
/// (`later_write`). Otherwise the records before that later one were
/// durable and are damaged, and replay refuses, naming both places.
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
    // Where the records read so far stop: (index in `segments`, offset).
    let mut stop: Option<(usize, usize)> = None;
    // The lsn of the last record read, in the database already or not.
    let mut last_read: Option<u64> = None;
    for (i, &number) in segments.iter().enumerate() {
        let path = segment_path(dir, number);
        if stop.is_none()
            && expected.is_none()
            && let Some(&next) = segments.get(i + 1)
            && applied_whole(&path, &segment_path(dir, next), after)?
        {
            continue;
        }
        let data = read_frames(&path)?;
        let mut pos = 0usize;
        while let Some(f) = parse_frame(&data, pos) {
            if f.lsn <= after && expected.is_none() {
                pos += f.len; // in the database already
                last_read = Some(f.lsn);
                continue;
            }
            let want = expected.unwrap_or(after + 1);
            if f.lsn < want && expected.is_some() {
                // A record from the segment's earlier life (reused
                // segment): the end of this segment's data.
                break;
            }
            if f.lsn != want {
                let at = match stop {
                    Some((s, o)) if pos == 0 => format!(
                        "after offset {o} of {}",
                        segment_path(dir, segments[s]).display()
                    ),
                    _ => format!("at offset {pos}"),
                };
                return Err(StorageError::corrupt(
                    path.display().to_string(),
                    format!(
                        "log has a gap: lsn {want} expected {at}, lsn {} found at offset {pos} of this segment: the records between were durable and are damaged",
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
            last_read = Some(f.lsn);
            pos += f.len;
        }
        if pos == 0 && stop.is_some() {
            // This segment does not go on from the one before: the log
            // ended there.
            break;
        }
        stop = Some((i, pos));
    }
    // Negative control: the first stop taken as the end, unchecked.
    if let Some((i, pos)) = stop.filter(|_| !faults::on(Fault::NoLaterWriteScan)) {
        let next = last_read.map_or(after + 1, |l| l + 1);
        let end_rule = End {
            after,
            torn: (next > after).then_some(next),
        };
        if let Some(later) = later_write(dir, &segments[i..], pos as u64, end_rule)? {
            let path = segment_path(dir, segments[i]);
            return Err(StorageError::corrupt(
                path.display().to_string(),
                format!(
                    "log damaged at offset {pos}: lsn {next} was expected there, but an intact record of a later write (lsn {}) follows at offset {} of {}: the records between were durable; restore the file",
                    later.lsn,
                    later.offset,
                    later.path.display()
                ),
            ));
        }
    }
    Ok(end)
}

/// What may follow the place where the log's records stop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct End {
    /// Records up to this lsn are in the database already: they may
    /// follow (a damaged record among them costs nothing).
    pub(crate) after: u64,
    /// The records stop where this lsn, not yet in the database, was
    /// expected: the write that held it may have been torn by a crash, so
    /// its other records may follow. `None` when the records stop among
    /// those in the database: every record after `after` that follows in
    /// the same segment was durable then.
    pub(crate) torn: Option<u64>,
}

impl End {
    /// Whether an intact frame with these lsns after the stop means that
    /// durable records were lost there.
    fn refuses(self, lsn: u64, batch_first: u64) -> bool {
        lsn > self.after && self.torn.is_none_or(|b| batch_first > b)
    }
}

/// An intact record found after the log's end.
#[derive(Debug)]
pub(crate) struct Later {
    /// The segment holding it.
    pub(crate) path: PathBuf,
    /// Its offset there.
    pub(crate) offset: u64,
    /// Its lsn.
    pub(crate) lsn: u64,
}

/// Bytes the scan of [`later_write`] reads at a time.
const SCAN_STEP: usize = 1 << 20;

/// Looks through `segments` (paths' numbers, in order), from offset `from`
/// of the first, for an intact frame that `end` says cannot follow the
/// log's end ([`End::refuses`]): one of a write after the one that held
/// the record expected at the end (the frames of that write may follow it
/// intact after a torn write; a reused segment's older records carry
/// lower lsns). Every offset is tried, since a damaged frame's length
/// cannot be trusted to find the next one: runs of zeros are passed eight
/// bytes at a time and intact frames that may follow whole, so the cost
/// is about one read of the bytes (docs/limits.md gives the figures).
pub(crate) fn later_write(
    dir: &Path,
    segments: &[u64],
    from: u64,
    end: End,
) -> Result<Option<Later>> {
    // In the segments after the stop's own, records of a write torn by an
    // earlier crash may be left over (a reused segment), with lsns above
    // what the database holds but from a write that started no later than
    // the log's records now go: only a later write is refused there.
    let beyond = End {
        after: end.after,
        torn: Some(end.torn.unwrap_or(end.after + 1)),
    };
    for (k, &number) in segments.iter().enumerate() {
        let path = segment_path(dir, number);
        let (start, rule) = if k == 0 { (from, end) } else { (0, beyond) };
        if let Some((offset, lsn)) = scan_segment(&path, start, rule)? {
            return Ok(Some(Later { path, offset, lsn }));
        }
    }
    Ok(None)
}

/// A window of a file's bytes, read as needed.
struct Window {
    file: std::fs::File,
    size: u64,
    base: u64,
    buf: Vec<u8>,
}

impl Window {
    /// Makes `[at, at + n)` (cut at the end of the file) readable through
    /// [`Window::get`]; false if `at` is at or past the end.
    fn ensure(&mut self, path: &Path, at: u64, n: usize) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        if at >= self.size {
            return Ok(false);
        }
        let want_end = at.saturating_add(n as u64).min(self.size);
        if at >= self.base && want_end <= self.base + self.buf.len() as u64 {
            return Ok(true);
        }
        let len = usize::try_from((want_end - at).max(SCAN_STEP as u64).min(self.size - at))
            .unwrap_or(SCAN_STEP);
        self.buf.resize(len, 0);
        self.file
            .read_exact_at(&mut self.buf, at)
            .map_err(|e| StorageError::io("read", path, e))?;
        self.base = at;
        Ok(true)
    }

    /// Bytes `[at, at + n)`, if the window holds them.
    fn get(&self, at: u64, n: usize) -> Option<&[u8]> {
        let from = usize::try_from(at.checked_sub(self.base)?).ok()?;
        self.buf.get(from..from.checked_add(n)?)
    }
}

/// The first intact frame at or after `start` in the segment at `path`
/// that `end` refuses (see [`later_write`]): its offset and lsn.
fn scan_segment(path: &Path, start: u64, end: End) -> Result<Option<(u64, u64)>> {
    let file = std::fs::File::open(path).map_err(|e| StorageError::io("open", path, e))?;
    let size = file
        .metadata()
        .map_err(|e| StorageError::io("stat", path, e))?
        .len();
    let mut w = Window {
        file,
        size,
        base: 0,
        buf: Vec::new(),
    };
    let mut at = start;
    while w.ensure(path, at, HEADER)? {
        let Some(header) = w.get(at, HEADER) else {
            break; // fewer than a header's bytes left
        };
        let word = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or([0; 8]));
        let len = u64::from(u32::from_le_bytes(
            header[0..4].try_into().unwrap_or([0; 4]),
        ));
        if len == 0 {
            at += zeros_from(&w, at);
            continue;
        }
        let (lsn, batch_first) = (word(8), word(16));
        let total = HEADER as u64 + len;
        if at + total <= size
            && plausible(&w, at, len, lsn, batch_first, end.after)
            && intact(&mut w, path, at, total)?
        {
            if end.refuses(lsn, batch_first) {
                return Ok(Some((at, lsn)));
            }
            at += total; // a record that may follow, whole
            continue;
        }
        at += 1;
    }
    Ok(None)
}

/// Whether the header at `at` (payload length `len`, `lsn`,
/// `batch_first`) could be a frame's, before its checksum is worth
/// computing: lsns in range and in order, and a transaction count that
/// its length can hold. Bytes inside other frames rarely pass, so the
/// checksums computed are about those of the real frames.
fn plausible(w: &Window, at: u64, len: u64, lsn: u64, batch_first: u64, after: u64) -> bool {
    let count = w
        .get(at + HEADER as u64, 4)
        .map(|b| u64::from(u32::from_le_bytes(b.try_into().unwrap_or([0xff; 4]))));
    len >= 4
        && batch_first <= lsn
        && lsn - batch_first < 1 << 24
        && lsn < after.saturating_add(1 << 40)
        && count.is_some_and(|c| c.saturating_mul(3) <= len - 4)
}

/// How far the bytes from `at` can be passed over as holding no frame
/// start: a frame starting within the first four of eight zero bytes has a
/// zero length. At least 1.
fn zeros_from(w: &Window, at: u64) -> u64 {
    let mut n = 0u64;
    while let Some(b) = w.get(at + n, 8) {
        if b != [0u8; 8] {
            break;
        }
        n += 8;
    }
    // Eight zeros at `at + n - 8` rule out frames starting up to
    // `at + n - 4`.
    n.saturating_sub(3).max(1)
}

/// Whether the `total` bytes at `at` are a frame whose checksum holds.
fn intact(w: &mut Window, path: &Path, at: u64, total: u64) -> Result<bool> {
    let Ok(n) = usize::try_from(total) else {
        return Ok(false);
    };
    if !w.ensure(path, at, n)? {
        return Ok(false);
    }
    let Some(bytes) = w.get(at, n) else {
        return Ok(false);
    };
    let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or([0; 4]));
    Ok(crc32fast::hash(&bytes[8..]) == crc)
}
