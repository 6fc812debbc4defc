//! Figures of the store: counters since open, and the distributions of
//! the commit path for the metrics endpoint.

/// Figures of the store since it was opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    /// `fdatasync` calls on the log (one per group commit).
    pub log_syncs: u64,
    /// Group commits made by the caller waiting for them, alone (its
    /// transaction, with at most one queued just before it), instead of
    /// the log writer thread (see [`Commit::wait`](super::Commit::wait)).
    pub caller_commits: u64,
    /// Log records (transactions) made durable.
    pub records: u64,
    /// Bytes written to the log.
    pub log_bytes: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Highest durable lsn.
    pub durable_lsn: u64,
    /// Highest lsn applied to the database.
    pub applied_lsn: u64,
    /// Total microseconds spent in log write + fdatasync.
    pub sync_micros: u64,
    /// Log segments kept only for the payloads they hold.
    pub pinned_segments: u64,
    /// Payloads compacted (moved to a newer segment).
    pub relocated: u64,
    /// Writes the applier left out of the database because a later delete
    /// of the same key was already durable (the applier's `overtaken`).
    pub overtaken: u64,
    /// Database rewrites (space given back to the file system).
    pub rewrites: u64,
    /// Bytes of submitted changes not yet applied to the database.
    pub unapplied_bytes: u64,
    /// Times [`LocalBackend::room`](super::LocalBackend::room) had to wait for the database to catch up.
    pub room_waits: u64,
}

/// Distributions of the commit path, for the metrics endpoint.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    /// Seconds from a transaction's submission to its durability.
    pub commit_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Seconds of each group commit's write and `fdatasync`.
    pub sync_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Transactions made durable by each `fdatasync`.
    pub batch_records: prometheus_client::metrics::histogram::Histogram,
    /// Seconds of each application of a memtable generation to the
    /// database.
    pub apply_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl StoreMetrics {
    pub(crate) fn new() -> StoreMetrics {
        use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
        StoreMetrics {
            // 50 µs to about 3.3 s.
            commit_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 17)),
            sync_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 17)),
            // 1 to 4096.
            batch_records: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            // 1 ms to about 65 s.
            apply_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 17)),
        }
    }
}

/// Distributions of the PostgreSQL backend's commit path, for the
/// metrics endpoint.
#[derive(Debug, Clone)]
pub struct PgStoreMetrics {
    /// Seconds from a transaction's submission to its commit in
    /// PostgreSQL.
    pub commit_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Seconds of each batch's PostgreSQL transaction, from `BEGIN` to
    /// the answer of its `COMMIT`.
    pub transaction_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Transactions committed by each PostgreSQL transaction.
    pub batch_records: prometheus_client::metrics::histogram::Histogram,
}

impl PgStoreMetrics {
    pub(crate) fn new() -> PgStoreMetrics {
        use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
        PgStoreMetrics {
            // 100 µs to about 6.6 s.
            commit_seconds: Histogram::new(exponential_buckets(100e-6, 2.0, 17)),
            transaction_seconds: Histogram::new(exponential_buckets(100e-6, 2.0, 17)),
            // 1 to 4096.
            batch_records: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
        }
    }
}
