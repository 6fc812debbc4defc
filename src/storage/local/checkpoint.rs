//! Checkpoints and the `CHECKPOINT` record (`Checkpoints`).
//!
//! A checkpoint makes the database durable up to the applied lsn (sled
//! flushed, every file of the database and its directories fsynced),
//! records that lsn and where the log goes on in `CHECKPOINT`, and then
//! retires the log segments whose records are all applied and to which
//! no payload pointer refers (kept for reuse, see `wal::Pool`); segments
//! kept only for a few old payloads are compacted (`payloads::compact`).
//! The log writer adds each segment it moves into to `CHECKPOINT` before
//! it answers any record written there (`Checkpoints::enter`), so a
//! start refuses such a segment truncated, zeroed or replaced however soon
//! after the switch that happens.
//!
//! Its locks: `RECORDED` (what `CHECKPOINT` holds now) and, under it,
//! `SEGMENTS` (the log segments written since start). Holding `SEGMENTS`,
//! a checkpoint sorts the segments it passed with the payload counts
//! (`Payloads::sort_out`: `LIVE`).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{Shared, fsutil, payloads, rewrite, wal};
use crate::faults::{self, Fault};
use crate::storage::error::{Result, StorageError};
use crate::storage::rank::{Rank, RankedMutex};
use fsutil::CHECKPOINT_FILE;

/// The first line of `CHECKPOINT`.
const CHECKPOINT_HEADER: &str = "letterbox checkpoint";

/// What `CHECKPOINT` holds and the segments it is about (see the module
/// doc).
pub(super) struct Checkpoints {
    dir: PathBuf,
    /// The segment the log began in at this start (before its first
    /// record, it is where the log goes on).
    start_segment: u64,
    /// What `CHECKPOINT` holds now (the applier's to write, and the log
    /// writer's to add the segments it moves into).
    recorded: RankedMutex<Checkpoint>,
    /// (segment number, lsn of its first record) of the segments written
    /// since start, oldest first.
    segments: RankedMutex<Vec<(u64, u64)>>,
}

impl Checkpoints {
    /// The checkpoints of a store in `dir` whose log began in segment
    /// `start_segment` at this start, `CHECKPOINT` holding `recorded`.
    pub(super) fn new(dir: &Path, start_segment: u64, recorded: Checkpoint) -> Checkpoints {
        Checkpoints {
            dir: dir.to_path_buf(),
            start_segment,
            recorded: RankedMutex::new(Rank::RECORDED, "recorded", recorded),
            segments: RankedMutex::default_with(Rank::SEGMENTS, "segments"),
        }
    }

    /// Notes the segments a write of the log has just put its first
    /// durable records in (`entered`), and adds them to `CHECKPOINT`'s
    /// list before any of those records is answered (negative control
    /// [`Fault::NoSegmentNotes`]: not at all). Called by the log writer,
    /// holding `LOG`.
    pub(super) fn enter(&self, entered: &[LoggedSegment]) -> Result<()> {
        if entered.is_empty() {
            return Ok(());
        }
        // Noted once durable: a checkpoint lists the segment with this
        // first lsn, which a start then requires.
        self.segments
            .lock()
            .extend(entered.iter().filter_map(|e| Some((e.number, e.first?))));
        if faults::on(Fault::NoSegmentNotes) {
            return Ok(());
        }
        self.note_segments(entered)
    }

    /// Adds segments the log writer has just put its first durable records
    /// in to `CHECKPOINT`'s list (the applied lsn and log position
    /// unchanged).
    fn note_segments(&self, entered: &[LoggedSegment]) -> Result<()> {
        let mut recorded = self.recorded.lock();
        let mut next = recorded.clone();
        for e in entered {
            match next.sizes.iter_mut().find(|s| s.number == e.number) {
                // Listed by the last checkpoint (or the start) without a
                // record in it yet.
                Some(listed) => *listed = *e,
                None => next.sizes.push(*e),
            }
        }
        if next == *recorded {
            return Ok(()); // a checkpoint has listed them already
        }
        write(&self.dir, &next)?;
        *recorded = next;
        Ok(())
    }

    /// Writes `CHECKPOINT` for a database durable up to `applied`: where
    /// the log goes on, and the segments from there on.
    fn record(&self, applied: u64) -> Result<()> {
        // Held while `CHECKPOINT` is rewritten: the log writer adds the
        // segments it moves into under the same lock (`note_segments`), so
        // neither undoes the other's line.
        let mut recorded = self.recorded.lock();
        // Where the log goes on: the last segment whose first record is at
        // or before the one after `applied` (the segments before it are
        // retired below), or the one the log began in at this start.
        let (log, written) = {
            let segments = self.segments.lock();
            let log = segments
                .iter()
                .rev()
                .find(|&&(_, first)| first <= applied + 1)
                .copied()
                .unwrap_or((self.start_segment, applied + 1));
            // The segments with durable records from there on (the writer
            // notes a segment once its first record is durable).
            let written: Vec<(u64, Option<u64>)> = segments
                .iter()
                .filter(|&&(n, _)| n >= log.0)
                .map(|&(n, first)| (n, (!faults::on(Fault::NoSegmentNotes)).then_some(first)))
                .collect();
            (log, written)
        };
        let mut listed = Vec::with_capacity(written.len() + 1);
        if written.first().is_none_or(|&(n, _)| n != log.0) {
            // The segment the log goes on in holds no record yet.
            listed.push((log.0, None));
        }
        listed.extend(written);
        let next = Checkpoint {
            applied,
            log: Some(log),
            sizes: segment_sizes(&self.dir.join("wal"), listed)?,
        };
        write(&self.dir, &next)?;
        *recorded = next;
        Ok(())
    }

    /// The segments whose records are all applied up to `applied`, sorted
    /// with the payload counts of `payloads` into those kept for their
    /// payloads and those retired (returned).
    fn passed(&self, applied: u64, payloads: &payloads::Payloads) -> Vec<u64> {
        let mut segments = self.segments.lock();
        // Segment i holds lsns below the first lsn of segment i+1: once
        // those are applied it goes, unless payloads still point into it.
        let mut passed = Vec::new();
        while segments.len() >= 2 && segments[1].1 <= applied + 1 {
            passed.push(segments.remove(0).0);
        }
        payloads.sort_out(passed, applied)
    }
}

/// Makes the database durable up to the applied lsn, then deletes log
/// segments that hold nothing newer (see the module doc). The applier's.
pub(super) fn checkpoint(shared: &Shared) -> Result<()> {
    let applied = shared.applier.applied_lsn();
    shared.db.handle().flush().map_err(|e| shared.db.error(e))?;
    fsutil::sync_tree(&shared.db.path())?;
    let cps = &shared.checkpoints;
    cps.record(applied)?;
    let retire = cps.passed(applied, &shared.payloads);
    let wal_dir = shared.dir.join("wal");
    for seg in &retire {
        shared.payloads.close(*seg);
        shared.pool.retire(&wal::segment_path(&wal_dir, *seg))?;
    }
    if !retire.is_empty() {
        fsutil::sync_dir(&wal_dir)?;
    }
    shared.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
    rewrite::maybe_rewrite(shared)?;
    payloads::compact(shared)
}

/// The given log segments as `CHECKPOINT` lists them: (number, lsn of
/// the first record if one is durable there), with their sizes. Segments
/// only appear whole (renamed into place once full size) and only grow.
pub(super) fn segment_sizes(
    wal_dir: &Path,
    numbers: impl IntoIterator<Item = (u64, Option<u64>)>,
) -> Result<Vec<LoggedSegment>> {
    let mut out = Vec::new();
    for (number, first) in numbers {
        let path = wal::segment_path(wal_dir, number);
        let m = std::fs::metadata(&path).map_err(|e| StorageError::io("stat", &path, e))?;
        out.push(LoggedSegment {
            number,
            size: m.len(),
            first,
        });
    }
    Ok(out)
}

/// Records, outside the database, the lsn up to which the database was
/// made durable by a checkpoint (written to a temporary file, fsynced,
/// renamed, directory fsynced). A start whose database comes back older
/// than this (damaged or truncated, with the log that fed it retired) is
/// refused instead of serving less than was acknowledged.
pub fn write(dir: &Path, cp: &Checkpoint) -> Result<()> {
    let mut log = cp
        .log
        .map(|(segment, first)| format!("log {segment} {first}\n"))
        .unwrap_or_default();
    if !cp.sizes.is_empty() {
        let sizes: Vec<String> = cp.sizes.iter().map(LoggedSegment::to_string).collect();
        log.push_str(&format!("sizes {}\n", sizes.join(" ")));
    }
    fsutil::replace_file(
        dir,
        CHECKPOINT_FILE,
        &format!("{CHECKPOINT_HEADER}\napplied {}\n{log}", cp.applied),
    )
}

/// What a checkpoint recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// Every change up to this lsn is durable in the database.
    pub applied: u64,
    /// Where the log goes on: the segment that holds the record after
    /// `applied` (or will hold it), as (its number, the lsn of its first
    /// record). The log is written into consecutive segments from there.
    /// Absent when a start had not yet begun its log, and in checkpoints
    /// of earlier builds.
    pub log: Option<(u64, u64)>,
    /// Every log segment from that one on: its number, its size (none may
    /// be shorter at the next start) and, once a record in it was durable,
    /// the lsn of its first record (which must still be there). The log
    /// writer adds a segment here before it acknowledges any record
    /// written into it.
    pub sizes: Vec<LoggedSegment>,
}

/// A log segment as `CHECKPOINT` lists it: `number:size` or
/// `number:size:first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedSegment {
    /// The segment's number.
    pub number: u64,
    /// Its size in bytes: segments are created full size and only grow.
    pub size: u64,
    /// The lsn of its first record, once that record was durable: noted
    /// before any record in the segment was acknowledged.
    pub first: Option<u64>,
}

impl std::fmt::Display for LoggedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.first {
            Some(first) => write!(f, "{}:{}:{first}", self.number, self.size),
            None => write!(f, "{}:{}", self.number, self.size),
        }
    }
}

impl std::str::FromStr for LoggedSegment {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<LoggedSegment, ()> {
        let mut it = s.split(':').map(str::parse::<u64>);
        let (Some(Ok(number)), Some(Ok(size))) = (it.next(), it.next()) else {
            return Err(());
        };
        let first = match it.next() {
            None => None,
            Some(Ok(first)) => Some(first),
            Some(Err(_)) => return Err(()),
        };
        if it.next().is_some() {
            return Err(());
        }
        Ok(LoggedSegment {
            number,
            size,
            first,
        })
    }
}

/// The last checkpoint (applied lsn 0 and no log position when none was
/// recorded).
pub fn read(dir: &Path) -> Result<Checkpoint> {
    let path = dir.join(CHECKPOINT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
        Err(e) => return Err(StorageError::io("read", &path, e)),
    };
    let malformed =
        || StorageError::corrupt(path.display().to_string(), "malformed checkpoint record");
    let mut lines = text.lines();
    let applied = (lines.next() == Some(CHECKPOINT_HEADER))
        .then(|| lines.next())
        .flatten()
        .and_then(|l| l.strip_prefix("applied "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .ok_or_else(malformed)?;
    let log = match lines.next() {
        None => None,
        Some(l) => {
            let mut f = l
                .strip_prefix("log ")
                .ok_or_else(malformed)?
                .split_whitespace()
                .map(str::parse::<u64>);
            match (f.next(), f.next(), f.next()) {
                (Some(Ok(segment)), Some(Ok(first)), None) => Some((segment, first)),
                _ => return Err(malformed()),
            }
        }
    };
    let mut sizes = Vec::new();
    if let Some(l) = lines.next() {
        for pair in l
            .strip_prefix("sizes ")
            .ok_or_else(malformed)?
            .split_whitespace()
        {
            sizes.push(pair.parse::<LoggedSegment>().map_err(|()| malformed())?);
        }
    }
    Ok(Checkpoint {
        applied,
        log,
        sizes,
    })
}
