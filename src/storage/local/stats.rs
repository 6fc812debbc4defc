//! The local backend's counters, each written by the part that counts
//! it, and its figures ([`StoreStats`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::LocalBackend;
use crate::storage::{Store, StoreStats};

/// The store's counters, each written by the part that counts it (no
/// lock: atomics).
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// The log writer's.
    pub(super) log_syncs: AtomicU64,
    pub(super) caller_commits: AtomicU64,
    pub(super) records: AtomicU64,
    pub(super) log_bytes: AtomicU64,
    pub(super) sync_micros: AtomicU64,
    /// The checkpoints' and compactions'.
    pub(super) checkpoints: AtomicU64,
    pub(super) relocated: AtomicU64,
    /// The applier's.
    pub(super) overtaken: AtomicU64,
    pub(super) rewrites: AtomicU64,
    /// The publishers'.
    pub(super) room_waits: AtomicU64,
}

impl LocalBackend {
    /// Figures since open.
    pub fn stats(&self) -> StoreStats {
        let s = &self.shared;
        let c = &s.counters;
        StoreStats {
            log_syncs: c.log_syncs.load(Ordering::Relaxed),
            caller_commits: c.caller_commits.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            log_bytes: c.log_bytes.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            durable_lsn: s.log.durable_lsn(),
            applied_lsn: s.applier.applied_lsn(),
            sync_micros: c.sync_micros.load(Ordering::Relaxed),
            pinned_segments: s.payloads.pinned() as u64,
            relocated: c.relocated.load(Ordering::Relaxed),
            overtaken: c.overtaken.load(Ordering::Relaxed),
            rewrites: c.rewrites.load(Ordering::Relaxed),
            unapplied_bytes: s.submission.unapplied_bytes() as u64,
            room_waits: c.room_waits.load(Ordering::Relaxed),
        }
    }
}

impl Store {
    /// Figures since open.
    pub fn stats(&self) -> StoreStats {
        self.backend().stats()
    }
}
