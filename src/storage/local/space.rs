//! Free space on the data directory's file system ([`Space`]): the
//! minimum under which publishes are refused, and the hard floor under
//! which every write is. No lock: what the last look found is kept in
//! atomics.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{LocalBackend, fsutil, wal};
use crate::storage::Store;
use crate::storage::error::{Result, StorageError};

/// What the last look at free space found.
#[derive(Debug)]
pub(super) struct Space {
    dir: PathBuf,
    /// The publish minimum (`StoreOptions::min_free_bytes`).
    min_free: u64,
    /// The log's segment size.
    segment_size: u64,
    space_ok: AtomicBool,
    /// False while free space is below the hard floor (a quarter of the
    /// minimum): then acks, nacks and receives are refused too.
    floor_ok: AtomicBool,
    /// `log_bytes` when free space was last checked from the publish path.
    space_checked_bytes: AtomicU64,
    /// Free bytes on the data directory's file system at the last check
    /// (`u64::MAX` until one succeeded).
    free_bytes: AtomicU64,
}

impl Space {
    /// The free space of `dir`'s file system, for a publish minimum of
    /// `min_free` bytes and log segments of `segment_size`; not looked at
    /// yet.
    pub(super) fn new(dir: &Path, min_free: u64, segment_size: u64) -> Space {
        Space {
            dir: dir.to_path_buf(),
            min_free,
            segment_size,
            space_ok: AtomicBool::new(true),
            floor_ok: AtomicBool::new(true),
            space_checked_bytes: AtomicU64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
        }
    }

    /// See [`LocalBackend::has_space`]; `written` is the log's bytes
    /// written so far.
    pub(super) fn has_space(&self, written: u64, pool: &wal::Pool) -> bool {
        let checked = self.space_checked_bytes.load(Ordering::Relaxed);
        if written.saturating_sub(checked) >= SPACE_CHECK_BYTES
            && self
                .space_checked_bytes
                .compare_exchange(checked, written, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.refresh(pool);
        }
        self.space_ok.load(Ordering::Relaxed)
    }

    /// See [`LocalBackend::above_floor`] (after a look at free space as
    /// [`Space::has_space`] makes).
    pub(super) fn above_floor(&self) -> bool {
        self.floor_ok.load(Ordering::Relaxed)
    }

    /// See [`LocalBackend::free_bytes`].
    pub(super) fn free_bytes(&self) -> Option<u64> {
        let f = self.free_bytes.load(Ordering::Relaxed);
        (f != u64::MAX).then_some(f)
    }
}

/// Log bytes written between two checks of free space made on the publish
/// path (see [`Store::has_space`]).
pub(super) const SPACE_CHECK_BYTES: u64 = 1 << 20;

/// The free space below which every write is refused: a quarter of the
/// minimum that publishes need (0 when that is 0).
pub(super) fn hard_floor(min_free: u64) -> u64 {
    min_free / 4
}

impl Space {
    /// Looks at free space again; `pool` says whether the log's next
    /// segment takes new space.
    pub(super) fn refresh(&self, pool: &wal::Pool) {
        let free = fsutil::free_bytes(&self.dir).ok();
        if let Some(f) = free {
            self.free_bytes.store(f, Ordering::Relaxed);
        }
        let min = self.min_free;
        // The log's next segment takes its size from the free space when
        // it is prepared (unless a retired one is reused): it counts
        // against the minimum, or publishes would run the disk down to
        // the minimum less a segment.
        let next_segment = if min == 0 || pool.spare_count() > 0 {
            0
        } else {
            self.segment_size
        };
        let ok = free.is_none_or(|f| f >= min.saturating_add(next_segment));
        let floor = hard_floor(min);
        let floor_ok = free.is_none_or(|f| f >= floor);
        if self.floor_ok.swap(floor_ok, Ordering::Relaxed) != floor_ok {
            if floor_ok {
                tracing::info!(dir = %self.dir.display(), "free disk space is back above the hard floor; acks and receives resume");
            } else {
                tracing::error!(dir = %self.dir.display(), floor, "free disk space is below the hard floor; acks, nacks and receives are refused too");
            }
        }
        if self.space_ok.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                tracing::info!(dir = %self.dir.display(), "free disk space is back above the minimum; publishes resume");
            } else {
                tracing::warn!(dir = %self.dir.display(), min_free = self.min_free, "free disk space is below the minimum; publishes are refused");
            }
        }
    }
}

/// Room the log's settings leave for messages on a file system, judged at
/// start (see [`check_fit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fit {
    /// Room for at least [`ROOM_SEGMENTS`] segments of messages.
    Fine,
    /// The settings fit the file system, but leave it little room for
    /// messages at the moment: a warning.
    Tight(String),
    /// The file system can never hold the reserve the settings keep:
    /// publishes would always be refused.
    Impossible(String),
}

/// Segments' worth of messages below which the room left is tight.
const ROOM_SEGMENTS: u64 = 4;
const MIB: u64 = 1 << 20;

/// How a file system of `total` bytes with `free` free fits log segments
/// of `segment` bytes and a publish minimum of `min_free` free bytes (0:
/// space is not checked, and nothing is judged). Publishes stop once
/// free space falls below the minimum plus the segment the log prepares
/// next; a start also creates a new segment. So the settings keep
/// `min_free + 2 * segment` from messages.
pub(super) fn fit(total: u64, free: u64, segment: u64, min_free: u64) -> Fit {
    if min_free == 0 {
        return Fit::Fine;
    }
    let reserve = min_free.saturating_add(segment.saturating_mul(2));
    let (fit_segment, fit_min) = fitting(total);
    let suggestion = format!(
        "settings that fit this file system: --wal-segment-size {}MiB --min-free-disk {}MiB (they keep {}MiB from messages)",
        fit_segment / MIB,
        fit_min / MIB,
        (fit_min + 2 * fit_segment) / MIB
    );
    let now = format!(
        "log segments of {}MiB and a minimum of {}MiB of free space keep {}MiB from messages",
        segment / MIB,
        min_free / MIB,
        reserve / MIB
    );
    if total < reserve.saturating_add(segment) {
        return Fit::Impossible(format!(
            "the file system is {}MiB in all: {now}, so publishes would be refused from the start or soon after; {suggestion}",
            total / MIB
        ));
    }
    let room = free.saturating_sub(reserve);
    if room < segment.saturating_mul(ROOM_SEGMENTS) {
        return Fit::Tight(format!(
            "{}MiB of {}MiB free: {now}, which leaves room for {}MiB of messages; {suggestion}, or free some space",
            free / MIB,
            total / MIB,
            room / MIB
        ));
    }
    Fit::Fine
}

/// A segment size and a publish minimum (powers of two) that leave most
/// of a file system of `total` bytes to messages: segments of a 32nd of it
/// (1 to 64 MiB), a minimum of a 16th (4 to 64 MiB).
fn fitting(total: u64) -> (u64, u64) {
    let pow2 = |n: u64| {
        if n == 0 {
            0
        } else {
            1u64 << (63 - n.leading_zeros())
        }
    };
    (
        pow2(total / 32).clamp(MIB, 64 * MIB),
        pow2(total / 16).clamp(4 * MIB, 64 * MIB),
    )
}

/// Judges, at start, how the file system holding `dir` fits the log's
/// settings ([`fit`]): refuses settings it can never hold, and warns when
/// they leave little room for messages.
pub(super) fn check_fit(dir: &Path, segment: u64, min_free: u64) -> Result<()> {
    if min_free == 0 {
        return Ok(());
    }
    let st = rustix::fs::statvfs(dir)
        .map_err(|e| StorageError::io("statvfs", dir, std::io::Error::from(e)))?;
    let total = st.f_blocks.saturating_mul(st.f_frsize);
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    match fit(total, free, segment, min_free) {
        Fit::Fine => Ok(()),
        Fit::Tight(why) => {
            tracing::warn!(dir = %dir.display(), "little room for messages: {why}");
            Ok(())
        }
        Fit::Impossible(detail) => Err(StorageError::TooSmall {
            path: dir.to_path_buf(),
            detail,
        }),
    }
}

impl LocalBackend {
    /// False while free space is below the hard floor, a quarter of the
    /// configured minimum: the engine then refuses acks, nacks, extensions
    /// and receives as well, so that the disk never fills under the
    /// server (a full disk is fail-stop). Checked as often as
    /// [`LocalBackend::has_space`].
    pub fn above_floor(&self) -> bool {
        let _ = self.has_space();
        self.shared.space.above_floor()
    }

    /// False while free space on the data directory's file system is below
    /// the configured minimum plus the size of the log segment it will
    /// prepare next (none when a retired one can be reused): the engine
    /// then refuses publishes.
    /// Checked again at once after every MiB of log
    /// written, not only by the applier's periodic check: a fast publisher
    /// must not run through the headroom between two periodic checks.
    pub fn has_space(&self) -> bool {
        let written = self.shared.counters.log_bytes.load(Ordering::Relaxed);
        self.shared.space.has_space(written, &self.shared.pool)
    }

    /// Free bytes on the data directory's file system as last measured
    /// for the publish floor (by the applier every 500 ms and after every
    /// MiB of log written); `None` if it could not be measured.
    pub fn free_bytes(&self) -> Option<u64> {
        self.shared.space.free_bytes()
    }

    /// The configured minimum of free bytes under which publishes are
    /// refused.
    pub fn min_free_bytes(&self) -> u64 {
        self.shared.opts.min_free_bytes
    }
}

impl Store {
    /// See [`LocalBackend::above_floor`].
    pub fn above_floor(&self) -> bool {
        self.backend.above_floor()
    }

    /// See [`LocalBackend::has_space`].
    pub fn has_space(&self) -> bool {
        self.backend.has_space()
    }

    /// See [`LocalBackend::free_bytes`].
    pub fn free_bytes(&self) -> Option<u64> {
        self.backend.free_bytes()
    }

    /// See [`LocalBackend::min_free_bytes`].
    pub fn min_free_bytes(&self) -> u64 {
        self.backend.min_free_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_judged_against_the_file_system() {
        // The default settings on a 200 MiB file system: refused, with
        // settings that fit.
        let Fit::Impossible(why) = fit(200 * MIB, 199 * MIB, 64 * MIB, 64 * MIB) else {
            panic!("a 200 MiB file system cannot keep 192 MiB and hold messages")
        };
        assert!(
            why.contains("--wal-segment-size 4MiB --min-free-disk 8MiB"),
            "{why}"
        );
        assert_eq!(fit(200 * MIB, 199 * MIB, 4 * MIB, 8 * MIB), Fit::Fine);
        // Room for fewer than four segments of messages: a warning.
        let Fit::Tight(why) = fit(10 << 30, 400 * MIB, 64 * MIB, 64 * MIB) else {
            panic!("tight")
        };
        assert!(why.contains("room for 208MiB"), "{why}");
        assert_eq!(fit(10 << 30, 8 << 30, 64 * MIB, 64 * MIB), Fit::Fine);
        // No minimum: space is not checked.
        assert_eq!(fit(MIB, 0, 64 * MIB, 0), Fit::Fine);
        assert_eq!(fitting(100 << 30), (64 * MIB, 64 * MIB));
        assert_eq!(fitting(10 * MIB), (MIB, 4 * MIB));
    }
}
