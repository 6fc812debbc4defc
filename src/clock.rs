//! Time. Every time read of the queue engine goes through [`Clock`], so
//! tests can drive leases, delays and TTLs with a [`ManualClock`] instead
//! of sleeping.
//!
//! Two readings: [`Clock::now_ms`], the wall clock that instants stored
//! in the queues are measured on, and [`Clock::monotonic`], the clock the
//! engine's waits run on (a long poll's deadline, a redrive's pace),
//! which is never stored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// Wall-clock time (not a monotonic clock) because lease deadlines, delays
/// and expiry instants are persisted and must mean the same after a
/// restart.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Now on the monotonic clock of the runtime's timers, for deadlines
    /// and paces that are waited out with them (`tokio::time`), never
    /// stored. The same for every clock by default: a [`ManualClock`]
    /// moves the stored instants (leases, delays, TTLs), while a wait
    /// still takes its time on the timer that waits it out.
    fn monotonic(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
}

/// The system's real-time clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> ManualClock {
        ManualClock {
            now: AtomicU64::new(start_ms),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
