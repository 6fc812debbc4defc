//! Free space on the data directory's file system: the minimum under
//! which publishes are refused, and the hard floor under which every
//! write is.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Inner, LocalBackend, Store, fsutil};

/// What the last look at free space found.
#[derive(Debug)]
pub(super) struct Space {
    pub(super) space_ok: AtomicBool,
    /// False while free space is below the hard floor (a quarter of the
    /// minimum): then acks, nacks and receives are refused too.
    pub(super) floor_ok: AtomicBool,
    /// `log_bytes` when free space was last checked from the publish path.
    pub(super) space_checked_bytes: AtomicU64,
    /// Free bytes on the data directory's file system at the last check
    /// (`u64::MAX` until one succeeded).
    pub(super) free_bytes: AtomicU64,
}

impl Space {
    pub(super) fn new() -> Space {
        Space {
            space_ok: AtomicBool::new(true),
            floor_ok: AtomicBool::new(true),
            space_checked_bytes: AtomicU64::new(0),
            free_bytes: AtomicU64::new(u64::MAX),
        }
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

impl Inner {
    pub(super) fn refresh_space(&self) {
        let free = fsutil::free_bytes(&self.dir).ok();
        if let Some(f) = free {
            self.space.free_bytes.store(f, Ordering::Relaxed);
        }
        let min = self.opts.min_free_bytes;
        // The log's next segment takes its size from the free space when
        // it is prepared (unless a retired one is reused): it counts
        // against the minimum, or publishes would run the disk down to
        // the minimum less a segment.
        let next_segment = if min == 0 || self.pool.spare_count() > 0 {
            0
        } else {
            self.opts.segment_size
        };
        let ok = free.is_none_or(|f| f >= min.saturating_add(next_segment));
        let floor = hard_floor(min);
        let floor_ok = free.is_none_or(|f| f >= floor);
        if self.space.floor_ok.swap(floor_ok, Ordering::Relaxed) != floor_ok {
            if floor_ok {
                tracing::info!(dir = %self.dir.display(), "free disk space is back above the hard floor; acks and receives resume");
            } else {
                tracing::error!(dir = %self.dir.display(), floor, "free disk space is below the hard floor; acks, nacks and receives are refused too");
            }
        }
        if self.space.space_ok.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                tracing::info!(dir = %self.dir.display(), "free disk space is back above the minimum; publishes resume");
            } else {
                tracing::warn!(dir = %self.dir.display(), min_free = self.opts.min_free_bytes, "free disk space is below the minimum; publishes are refused");
            }
        }
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
        self.inner.space.floor_ok.load(Ordering::Relaxed)
    }

    /// False while free space on the data directory's file system is below
    /// the configured minimum plus the size of the log segment it will
    /// prepare next (none when a retired one can be reused): the engine
    /// then refuses publishes.
    /// Checked again at once after every MiB of log
    /// written, not only by the applier's periodic check: a fast publisher
    /// must not run through the headroom between two periodic checks.
    pub fn has_space(&self) -> bool {
        let written = self.inner.counters.log_bytes.load(Ordering::Relaxed);
        let checked = self.inner.space.space_checked_bytes.load(Ordering::Relaxed);
        if written.saturating_sub(checked) >= SPACE_CHECK_BYTES
            && self
                .inner
                .space
                .space_checked_bytes
                .compare_exchange(checked, written, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.inner.refresh_space();
        }
        self.inner.space.space_ok.load(Ordering::Relaxed)
    }

    /// Free bytes on the data directory's file system as last measured
    /// for the publish floor (by the applier every 500 ms and after every
    /// MiB of log written); `None` if it could not be measured.
    pub fn free_bytes(&self) -> Option<u64> {
        let f = self.inner.space.free_bytes.load(Ordering::Relaxed);
        (f != u64::MAX).then_some(f)
    }

    /// The configured minimum of free bytes under which publishes are
    /// refused.
    pub fn min_free_bytes(&self) -> u64 {
        self.inner.opts.min_free_bytes
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
