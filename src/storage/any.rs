//! The backend the server chooses at start: [`AnyBackend`], one variant
//! per kind of [`Backend`], so that the engine holds one store type
//! (`Store<AnyBackend>`) whatever the choice, with static dispatch (a
//! `match`, no virtual call) and no layer above generic over it.
//!
//! What only some backends can do is explicit here, on
//! `Store<AnyBackend>`: the wait for room ahead of an apply queue
//! (`Store::room`), the place the state lives ([`Store::location`]),
//! the commit-path figures ([`Store::metrics`], [`Store::stats`]), the
//! free-space floors ([`Store::has_space`], [`Store::above_floor`]), and
//! the reader that overlaps the engine's load with a local start
//! ([`AnyBackend::local`]).

use std::fmt;
use std::path::PathBuf;

use bytes::Bytes;
use tokio::sync::watch;

use super::{
    Backend, Commit, LocalBackend, PgBackend, PgStoreMetrics, Result, Store, StoreMetrics,
    StoreStats, Txn,
};

/// A backend chosen at start (see the module doc).
///
/// Adding a kind of backend is one variant here and one arm in each
/// `match` of this file (the compiler lists them: every `match` on
/// `AnyBackend` is exhaustive, none has a catch-all arm), plus a `From`
/// conversion for its store. A backend without an apply queue, local
/// disk or commit-path figures answers those capabilities with the
/// defaults documented on each method (no wait, `None`, `true`).
#[derive(Debug)]
pub enum AnyBackend {
    /// The write-ahead log in front of sled, in a data directory.
    Local(LocalBackend),
    /// One shard in PostgreSQL, under an ownership lease.
    Pg(PgBackend),
}

impl AnyBackend {
    /// The local backend, if it is the one.
    pub fn local(&self) -> Option<&LocalBackend> {
        match self {
            AnyBackend::Local(b) => Some(b),
            AnyBackend::Pg(_) => None,
        }
    }

    /// Where the state lives.
    pub fn location(&self) -> Location {
        match self {
            AnyBackend::Local(b) => Location::Dir(b.dir().to_path_buf()),
            AnyBackend::Pg(b) => Location::Database(b.target()),
        }
    }
}

impl Backend for AnyBackend {
    fn submit(&self, txn: Txn) -> Commit {
        match self {
            AnyBackend::Local(b) => b.submit(txn),
            AnyBackend::Pg(b) => b.submit(txn),
        }
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        match self {
            AnyBackend::Local(b) => b.get(key),
            AnyBackend::Pg(b) => b.get(key),
        }
    }

    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        match self {
            AnyBackend::Local(b) => b.get_many(keys),
            AnyBackend::Pg(b) => b.get_many(keys),
        }
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        match self {
            AnyBackend::Local(b) => b.scan(start, end, limit),
            AnyBackend::Pg(b) => b.scan(start, end, limit),
        }
    }

    fn failure(&self) -> watch::Receiver<Option<String>> {
        match self {
            AnyBackend::Local(b) => b.failure(),
            AnyBackend::Pg(b) => b.failure(),
        }
    }

    fn close(&self) -> Result<()> {
        match self {
            AnyBackend::Local(b) => b.close(),
            AnyBackend::Pg(b) => b.close(),
        }
    }
}

/// Where a store's state lives, for messages and the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A data directory (the local backend).
    Dir(PathBuf),
    /// A database, by its address without any password.
    Database(String),
}

impl Location {
    /// What the place is, in words ("data directory", "database").
    pub fn kind(&self) -> &'static str {
        match self {
            Location::Dir(_) => "data directory",
            Location::Database(_) => "database",
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Dir(p) => write!(f, "{}", p.display()),
            Location::Database(url) => f.write_str(url),
        }
    }
}

impl From<Store<LocalBackend>> for Store<AnyBackend> {
    fn from(store: Store<LocalBackend>) -> Store<AnyBackend> {
        Store::with_backend(AnyBackend::Local(store.into_backend()))
    }
}

impl From<Store<PgBackend>> for Store<AnyBackend> {
    fn from(store: Store<PgBackend>) -> Store<AnyBackend> {
        Store::with_backend(AnyBackend::Pg(store.into_backend()))
    }
}

impl From<PgBackend> for Store<AnyBackend> {
    fn from(backend: PgBackend) -> Store<AnyBackend> {
        Store::with_backend(AnyBackend::Pg(backend))
    }
}

impl Store<AnyBackend> {
    /// Where the state lives (a data directory, a database).
    pub fn location(&self) -> Location {
        self.backend().location()
    }

    /// Waits while the backend's apply queue is over its bound (see
    /// [`LocalBackend::room`]); returns at once for a backend without
    /// one.
    pub async fn room(&self) {
        match self.backend() {
            AnyBackend::Local(b) => b.room().await,
            AnyBackend::Pg(_) => {}
        }
    }

    /// Distributions of the commit path since open, where the backend
    /// keeps them (the local one does).
    pub fn metrics(&self) -> Option<&StoreMetrics> {
        match self.backend() {
            AnyBackend::Local(b) => Some(b.metrics()),
            AnyBackend::Pg(_) => None,
        }
    }

    /// Distributions of the PostgreSQL backend's commit path since open
    /// (`None` on the local one).
    pub fn pg_metrics(&self) -> Option<&PgStoreMetrics> {
        match self.backend() {
            AnyBackend::Local(_) => None,
            AnyBackend::Pg(b) => Some(b.metrics()),
        }
    }

    /// Figures since open, where the backend keeps them (the local one
    /// does).
    pub fn stats(&self) -> Option<StoreStats> {
        match self.backend() {
            AnyBackend::Local(b) => Some(b.stats()),
            AnyBackend::Pg(_) => None,
        }
    }

    /// False while free space on the local disk is below the publish
    /// minimum (see [`LocalBackend::has_space`]); always true for a
    /// backend that keeps no state on the local disk.
    pub fn has_space(&self) -> bool {
        match self.backend() {
            AnyBackend::Local(b) => b.has_space(),
            AnyBackend::Pg(_) => true,
        }
    }

    /// False while free space on the local disk is below the hard floor
    /// (see [`LocalBackend::above_floor`]); always true for a backend
    /// that keeps no state on the local disk.
    pub fn above_floor(&self) -> bool {
        match self.backend() {
            AnyBackend::Local(b) => b.above_floor(),
            AnyBackend::Pg(_) => true,
        }
    }

    /// Free bytes on the local disk as last measured (see
    /// [`LocalBackend::free_bytes`]); `None` if not measured or not
    /// relevant to the backend.
    pub fn free_bytes(&self) -> Option<u64> {
        match self.backend() {
            AnyBackend::Local(b) => b.free_bytes(),
            AnyBackend::Pg(_) => None,
        }
    }

    /// The configured minimum of free local bytes under which publishes
    /// are refused; `None` for a backend that keeps no state on the local
    /// disk.
    pub fn min_free_bytes(&self) -> Option<u64> {
        match self.backend() {
            AnyBackend::Local(b) => Some(b.min_free_bytes()),
            AnyBackend::Pg(_) => None,
        }
    }

    /// Tests: stops like a crash (see [`Store::crash`] of the local
    /// store).
    #[cfg(test)]
    pub(crate) fn crash(self) {
        match self.into_backend() {
            AnyBackend::Local(b) => Store::with_backend(b).crash(),
            AnyBackend::Pg(b) => drop(b),
        }
    }
}
