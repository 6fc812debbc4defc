//! The local backend's counters, each written by the part that counts
//! it, and its figures ([`StoreStats`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{LocalBackend, lock};
use crate::storage::{Store, StoreStats};

/// The store's counters, each written by the part that counts it.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) log_syncs: AtomicU64,
    pub(super) caller_commits: AtomicU64,
    pub(super) records: AtomicU64,
    pub(super) log_bytes: AtomicU64,
    pub(super) checkpoints: AtomicU64,
    pub(super) sync_micros: AtomicU64,
    pub(super) relocated: AtomicU64,
    pub(super) overtaken: AtomicU64,
    pub(super) rewrites: AtomicU64,
    pub(super) room_waits: AtomicU64,
}

impl LocalBackend {
    /// Figures since open.
    pub fn stats(&self) -> StoreStats {
        let i = &self.inner;
        StoreStats {
            log_syncs: i.counters.log_syncs.load(Ordering::Relaxed),
            caller_commits: i.counters.caller_commits.load(Ordering::Relaxed),
            records: i.counters.records.load(Ordering::Relaxed),
            log_bytes: i.counters.log_bytes.load(Ordering::Relaxed),
            checkpoints: i.counters.checkpoints.load(Ordering::Relaxed),
            durable_lsn: *lock(&i.durable),
            applied_lsn: i.applied.load(Ordering::Relaxed),
            sync_micros: i.counters.sync_micros.load(Ordering::Relaxed),
            pinned_segments: lock(&i.live).pinned.len() as u64,
            relocated: i.counters.relocated.load(Ordering::Relaxed),
            overtaken: i.counters.overtaken.load(Ordering::Relaxed),
            rewrites: i.counters.rewrites.load(Ordering::Relaxed),
            unapplied_bytes: i.unapplied.load(Ordering::Relaxed) as u64,
            room_waits: i.counters.room_waits.load(Ordering::Relaxed),
        }
    }
}

impl Store {
    /// Figures since open.
    pub fn stats(&self) -> StoreStats {
        self.backend.stats()
    }
}
