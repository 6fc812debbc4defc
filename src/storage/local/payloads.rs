//! Payloads live in the log.
//!
//! A message body is written once: in the log record of its publish. What
//! the database keeps under `Payload(pid)` is a 21-byte pointer to that
//! value in its log segment (segment number, file offset, length), not a
//! second copy. So a log segment whose records are all applied is retired
//! only when no pointer refers to it any more ([`Live`] counts pointers per
//! segment, rebuilt at open from the database). A segment kept only for a
//! few old payloads is compacted: its live payloads are logged again (as
//! conditional puts, so a payload deleted meanwhile is not brought back),
//! which moves their pointers to the current segment and lets the old one
//! go.
//!
//! A pointed-to value is the encoded payload record, with its own CRC of
//! the body, checked on every read like an inline one.
//!
//! [`Payloads`] owns the pointer counts (`LIVE`) and the segment files
//! open for reads (`FILES`, in [`Files`]); it calls nothing holding them.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{Shared, wal};
use crate::storage::Txn;
use crate::storage::error::{Result, StorageError};
use crate::storage::keys;
use crate::storage::rank::{Rank, RankedMutex};

/// First byte of a pointer value (record values start with their version,
/// 1).
const POINTER: u8 = 0xFE;
/// Length of a pointer value.
const POINTER_LEN: usize = 21;

/// Where a value sits in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Segment number.
    pub seg: u64,
    /// Offset of the value in the segment file.
    pub off: u64,
    /// Length of the value.
    pub len: u32,
}

impl Loc {
    /// The pointer value stored in the database.
    pub(crate) fn encode(self) -> [u8; POINTER_LEN] {
        let mut b = [0u8; POINTER_LEN];
        b[0] = POINTER;
        b[1..9].copy_from_slice(&self.seg.to_be_bytes());
        b[9..17].copy_from_slice(&self.off.to_be_bytes());
        b[17..21].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes a stored value; `None` when it is not a pointer (an inline
    /// value).
    pub(crate) fn decode(v: &[u8]) -> Option<Loc> {
        if v.len() != POINTER_LEN || v[0] != POINTER {
            return None;
        }
        Some(Loc {
            seg: u64::from_be_bytes(v[1..9].try_into().ok()?),
            off: u64::from_be_bytes(v[9..17].try_into().ok()?),
            len: u32::from_be_bytes(v[17..21].try_into().ok()?),
        })
    }
}

/// True for keys whose values are kept in the log (payloads).
pub(crate) fn located(key: &[u8]) -> bool {
    key.first() == Some(&keys::TAG_PAYLOAD)
}

/// Pointer counts per segment, and the segments kept only for them.
#[derive(Debug, Default)]
pub(crate) struct Live {
    /// Live pointers per segment.
    pub counts: HashMap<u64, u64>,
    /// Segments whose records are all applied, kept for their payloads.
    pub pinned: BTreeSet<u64>,
    /// Most pointers a segment ever had (its payloads when placed).
    pub totals: HashMap<u64, u64>,
    /// The segment being compacted, and the lsn of its last relocation.
    pub compacting: Option<(u64, u64)>,
}

impl Live {
    pub(crate) fn add(&mut self, seg: u64) {
        let c = self.counts.entry(seg).or_default();
        *c += 1;
        let t = self.totals.entry(seg).or_default();
        *t = (*t).max(*c);
    }

    pub(crate) fn remove(&mut self, seg: u64) {
        if let Some(c) = self.counts.get_mut(&seg) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                self.counts.remove(&seg);
                self.totals.remove(&seg);
            }
        }
    }

    pub(crate) fn count(&self, seg: u64) -> u64 {
        self.counts.get(&seg).copied().unwrap_or(0)
    }

    /// The pinned segment most worth compacting: fewer than half of its
    /// payloads are still live (the lowest share first). Only when more
    /// than `keep` segments are pinned and no compaction is under way.
    pub(crate) fn to_compact(&self, keep: usize) -> Option<u64> {
        if self.compacting.is_some() || self.pinned.len() <= keep {
            return None;
        }
        self.pinned
            .iter()
            .filter_map(|&seg| {
                let live = self.count(seg);
                let total = self.totals.get(&seg).copied().unwrap_or(live).max(1);
                (live * 2 < total).then_some((live * 1000 / total, seg))
            })
            .min()
            .map(|(_, seg)| seg)
    }
}

/// Payload pointers per segment and the files read through them (see
/// the module doc).
#[derive(Debug)]
pub(super) struct Payloads {
    /// Payload pointers per segment; pinned segments.
    live: RankedMutex<Live>,
    /// Segment files open for payload reads.
    files: Files,
}

impl Payloads {
    /// The payloads of a store whose recovery counted `live` in the
    /// segments of `wal_dir`.
    pub(super) fn new(live: Live, wal_dir: &Path) -> Payloads {
        Payloads {
            live: RankedMutex::new(Rank::LIVE, "live", live),
            files: Files::new(wal_dir),
        }
    }

    /// Reads the value a pointer refers to.
    pub(super) fn read(&self, loc: Loc) -> Result<Bytes> {
        self.files.read(loc)
    }

    /// Counts the pointers a generation put into the database (`added`,
    /// one segment per pointer) and took out of it (`removed`).
    pub(super) fn count(&self, added: Vec<u64>, removed: Vec<u64>) {
        let mut live = self.live.lock();
        for seg in added {
            live.add(seg);
        }
        for seg in removed {
            live.remove(seg);
        }
    }

    /// Sorts the segments whose records are all applied up to `applied`
    /// (`passed`, oldest first) into those kept for their payloads
    /// (pinned) and those that go, with the pinned segments emptied since;
    /// ends a compaction whose relocations are applied. Returns the
    /// segments to retire. Called holding `SEGMENTS` (a checkpoint).
    pub(super) fn sort_out(&self, passed: Vec<u64>, applied: u64) -> Vec<u64> {
        let mut retire = Vec::new();
        let mut live = self.live.lock();
        for number in passed {
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
        retire
    }

    /// Forgets a segment's file (it is being retired).
    pub(super) fn close(&self, seg: u64) {
        self.files.close(seg);
    }

    /// Live payload pointers in all.
    pub(super) fn live(&self) -> u64 {
        self.live.lock().counts.values().sum()
    }

    /// Segments kept only for their payloads.
    pub(super) fn pinned(&self) -> usize {
        self.live.lock().pinned.len()
    }

    /// Tests: live pointers into segment `seg`.
    #[cfg(test)]
    pub(super) fn count_in(&self, seg: u64) -> u64 {
        self.live.lock().count(seg)
    }

    /// Tests: live pointers per segment.
    #[cfg(test)]
    pub(super) fn counts(&self) -> HashMap<u64, u64> {
        self.live.lock().counts.clone()
    }
}

/// Segments kept for their payloads before compaction starts.
pub(super) const KEEP_PINNED: usize = 2;
/// Relocations per transaction.
pub(super) const RELOCATE_BATCH: usize = 256;

/// Moves the live payloads of the pinned segment most worth it to the
/// current segment, so that it can be retired. The relocations are
/// conditional puts: a payload deleted meanwhile stays deleted.
pub(super) fn compact(shared: &Shared) -> Result<()> {
    let Some(seg) = shared.payloads.live.lock().to_compact(KEEP_PINNED) else {
        return Ok(());
    };
    let wal_dir = shared.dir.join("wal");
    let mut moved = 0u64;
    let mut txn = Txn::new();
    let mut last_lsn = 0u64;
    // Not waited for: the relocations are applied with everything else.
    let submit = |txn: Txn| -> u64 { shared.submission.submit(txn, false).lsn() };
    for (key, value, loc) in payloads_in(&wal_dir, seg)? {
        let current = shared
            .db
            .handle()
            .get(&key)
            .map_err(|e| shared.db.error(e))?;
        if current.and_then(|v| Loc::decode(&v)) != Some(loc) {
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
    shared
        .counters
        .relocated
        .fetch_add(moved, Ordering::Relaxed);
    shared.payloads.live.lock().compacting = Some((seg, last_lsn));
    tracing::debug!(segment = seg, moved, "compacting a log segment");
    Ok(())
}

/// Open segment files for reading payloads.
#[derive(Debug)]
struct Files {
    dir: PathBuf,
    open: RankedMutex<HashMap<u64, Arc<File>>>,
}

impl Files {
    fn new(dir: &Path) -> Files {
        Files {
            dir: dir.to_path_buf(),
            open: RankedMutex::default_with(Rank::FILES, "files"),
        }
    }

    fn file(&self, seg: u64) -> Result<Arc<File>> {
        let mut open = self.open.lock();
        if let Some(f) = open.get(&seg) {
            return Ok(Arc::clone(f));
        }
        let path = wal::segment_path(&self.dir, seg);
        let f = Arc::new(File::open(&path).map_err(|e| StorageError::io("open", &path, e))?);
        open.insert(seg, Arc::clone(&f));
        Ok(f)
    }

    /// Reads the value a pointer refers to.
    fn read(&self, loc: Loc) -> Result<Bytes> {
        let f = self.file(loc.seg)?;
        let mut buf = vec![0u8; usize::try_from(loc.len).unwrap_or(0)];
        f.read_exact_at(&mut buf, loc.off).map_err(|e| {
            StorageError::io("read payload", wal::segment_path(&self.dir, loc.seg), e)
        })?;
        Ok(Bytes::from(buf))
    }

    /// Forgets a segment's file (it is being retired).
    fn close(&self, seg: u64) {
        self.open.lock().remove(&seg);
    }
}

/// The payload values of a segment file, with their locations: every put
/// of a payload key found in its intact frames.
pub(crate) fn payloads_in(dir: &Path, seg: u64) -> Result<Vec<(Bytes, Bytes, Loc)>> {
    let path = wal::segment_path(dir, seg);
    let data = wal::read_frames(&path)?;
    let mut out = Vec::new();
    for muts in wal::frames(&data) {
        for m in muts {
            if let (true, Some(v)) = (located(&m.key), &m.value) {
                let off = (v.as_ptr() as usize).wrapping_sub(data.as_ptr() as usize);
                let loc = Loc {
                    seg,
                    off: u64::try_from(off).unwrap_or(u64::MAX),
                    len: u32::try_from(v.len()).unwrap_or(u32::MAX),
                };
                out.push((m.key.clone(), v.clone(), loc));
            }
        }
    }
    Ok(out)
}

/// The location of a value decoded from `data` (the whole segment file).
pub(crate) fn loc_in(seg: u64, data: &Bytes, value: &Bytes) -> Loc {
    let off = (value.as_ptr() as usize).wrapping_sub(data.as_ptr() as usize);
    Loc {
        seg,
        off: u64::try_from(off).unwrap_or(u64::MAX),
        len: u32::try_from(value.len()).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_round_trip_and_are_told_from_records() {
        let l = Loc {
            seg: 7,
            off: 1 << 33,
            len: 1024,
        };
        assert_eq!(Loc::decode(&l.encode()), Some(l));
        assert_eq!(Loc::decode(&[1, 2, 3]), None);
        let mut inline = vec![1u8];
        inline.extend_from_slice(&[0; 20]);
        assert_eq!(Loc::decode(&inline), None, "a version-1 record of 21 bytes");
    }
}
