//! The storage boundary: what the queue engine needs from the place its
//! state becomes durable, and nothing else.
//!
//! A [`Backend`] takes transactions of absolute puts and deletes over the
//! key space of [`super::keys`], applies each atomically and in submission
//! order, and says when each is durable (a [`Commit`]); it reads one key
//! and scans a key range, both as of the latest *submitted* transaction
//! (the engine reads what it has just decided, durable or not), and reads
//! several keys at once (in one round trip where a backend has them); it reports
//! a fail-stop error on its failure watch; and it closes.
//!
//! [`Store`](super::Store) is the engine's typed front over a backend.
//! The engine holds a `Store<AnyBackend>`: [`AnyBackend`](super::AnyBackend)
//! has one variant per kind of backend, chosen at start, and makes explicit
//! what only some backends can do (waiting for room ahead of an apply
//! queue, free-space floors, commit-path figures). Two backends exist:
//!
//! * [`LocalBackend`](super::LocalBackend): the write-ahead log in front of
//!   sled, with its memtable, in one data directory (the module doc of
//!   `storage` has its durability contract). The server runs on it by
//!   default.
//! * [`PgBackend`](super::PgBackend): one shard of the key space in
//!   PostgreSQL ([`super::pg`]: fenced batch commits under an ownership
//!   lease, a commit marker), with an in-memory overlay of the changes not
//!   yet committed in front of it (`serve --store postgres://...`). It
//!   keeps the same contract (the tests run the same suite against both).
//!
//! The engine loads its state at start from a
//! [`LoadSource`](super::LoadSource): the local database read directly
//! ([`Reader`](super::Reader), overlapping the store's own scan), or any
//! backend read in key order in pages of [`Backend::scan`]
//! ([`Paged`](super::Paged)).
//!
//! ## Limits a backend may have
//!
//! The boundary is shaped so that a backend with per-transaction limits
//! (FoundationDB: 5 s and 10 MB per transaction, 100 kB per value) fits
//! it: values over the backend's own limit are chunked inside the backend
//! (the engine never sees chunks; the PostgreSQL backend does so above
//! its chunk size, 64 KiB by default); a backend groups whole transactions
//! into batches and may start a new batch where a byte bound is reached,
//! but never splits one transaction; and a scan returns at most `limit`
//! entries, so the caller pages through a large range in many short
//! reads. What it does not cover yet: a single transaction larger than a
//! backend's transaction limit (a 10 MB body) would have to be written
//! ahead of its transaction in pieces of its own.

use bytes::Bytes;
use tokio::sync::watch;

use super::{Commit, Result, Txn};

/// Durable state behind the engine (see the module doc).
pub trait Backend: Send + Sync + 'static {
    /// Takes one transaction: applied atomically, after every transaction
    /// submitted before it; readable at once by [`Backend::get`] and
    /// [`Backend::scan`]; durable when the returned [`Commit`] resolves
    /// (with an error once the backend has stopped).
    fn submit(&self, txn: Txn) -> Commit;

    /// A key's value as of the latest submitted transaction.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>>;

    /// The values of `keys`, in their order (`None` where a key has
    /// none), each as [`Backend::get`] reads it. A backend whose reads are
    /// round trips reads the keys it does not hold in memory together (the
    /// PostgreSQL backend: one query); by default, one [`Backend::get`]
    /// after another.
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// Up to `limit` entries with keys from `start` (inclusive) to `end`
    /// (exclusive; `None`: to the end of the key space), in key order, as
    /// of the latest submitted transaction. Fewer than `limit` means the
    /// range holds no more: the next page starts just after the last key
    /// returned (see [`scan_all`]).
    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>>;

    /// Turns `Some(reason)` once the backend has stopped for good
    /// (fail-stop): every later transaction gets an error.
    fn failure(&self) -> watch::Receiver<Option<String>>;

    /// Stops taking transactions, makes every one submitted durable (or
    /// answers it with the error that stopped the backend), and lets its
    /// resources go. Returns the failure that stopped it, if any. Later
    /// calls do nothing more.
    fn close(&self) -> Result<()>;
}

/// The smallest byte string above every string starting with `prefix`,
/// `None` if there is none (all bytes 0xff, or empty).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Every entry whose key starts with `prefix`, in key order, read in
/// pages of `page` entries (at least one; see [`pages`](super::pages),
/// which reads them lazily).
pub fn scan_all<B: Backend + ?Sized>(
    backend: &B,
    prefix: &[u8],
    page: usize,
) -> Result<Vec<(Bytes, Bytes)>> {
    super::pages(backend, prefix, page).collect()
}
