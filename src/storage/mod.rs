//! Durable storage: the engine's typed front ([`Store`]) over a
//! [`Backend`], and the backends.
//!
//! The engine uses [`Store`], a typed front over a [`Backend`] (the
//! boundary and its backend-neutral [`Commit`], see `backend`), as a
//! `Store<AnyBackend>`: the backend chosen at start ([`AnyBackend`], with
//! what only some backends can do made explicit), loaded at start from a
//! [`LoadSource`]. `Store` alone means `Store<LocalBackend>`.
//!
//! The only module that names `sled`. It makes no policy decision and
//! reads no clock: it stores what the queue engine tells it to, in the
//! order it is told, and says when each change is durable.
//!
//! ## Layout
//!
//! * This level is backend-neutral: `backend` (the trait, [`Commit`]),
//!   `any`, `load`, `txn`, `keys`, `records`, `error`, `stats`, `rank`
//!   (mutexes with a rank in their backend's lock order), and `verify`
//!   (the offline check of a data directory).
//! * `local`: [`LocalBackend`], our write-ahead log in front of sled, as
//!   parts that each own their state and locks (its module doc has the
//!   durability contract and the lock order, part by part).
//! * [`pg`]: [`PgBackend`], one shard in PostgreSQL (its module doc has
//!   its lock order).
//!
//! Each backend's lock order is checked at run time in debug builds
//! (`rank::RankedMutex`).

mod any;
pub mod backend;
mod error;
pub mod keys;
mod load;
mod local;
pub mod pg;
mod rank;
pub mod records;
mod stats;
mod txn;
pub mod verify;

use bytes::Bytes;
use tokio::sync::watch;

pub use any::{AnyBackend, Location};

pub use backend::{Backend, Commit, CommitError};
pub use error::{Result, StorageError};
pub use keys::{Key, OwnedKey, Space, SysKey};
pub use load::{LOAD_PAGE, LoadSource, Paged, Pages, pages};
pub use local::{LocalBackend, OpenReport, Reader, StoreOptions, txn_log_size};
pub use local::{checkpoint, fsutil, wal};
pub(crate) use local::{open_db, read_sys, replay_into};
pub use pg::{PgBackend, PgBackendOptions};
use records::{MetaRecord, PayloadRecord};
pub use stats::{PgStoreMetrics, StoreMetrics, StoreStats};
pub use txn::{Mutation, Txn, encode_payload};

use crate::faults;

/// The durable store the engine uses: typed reads and transactions over a
/// [`Backend`] (by default the local one, a data directory).
pub struct Store<B: Backend = LocalBackend> {
    backend: B,
}

impl<B: Backend + std::fmt::Debug> std::fmt::Debug for Store<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .finish()
    }
}

impl<B: Backend> Store<B> {
    /// A store over `backend`.
    pub fn with_backend(backend: B) -> Store<B> {
        Store { backend }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, the store given up.
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// Submits a transaction (see [`Backend::submit`] and, for the local
    /// backend, the module's durability contract).
    pub fn submit(&self, txn: Txn) -> Commit {
        self.backend.submit(txn)
    }

    /// Reads a key as of the latest submitted transaction.
    pub fn get(&self, key: &Key<'_>) -> Result<Option<Bytes>> {
        let key = key.encode();
        if faults::read_fails(&key) {
            // Engine tests only (`faults::fail_reads`).
            return Err(StorageError::io(
                "read",
                "(an injected fault)",
                std::io::Error::other("injected read failure"),
            ));
        }
        self.backend.get(&key)
    }

    /// Reads and decodes a message's payload, checking its checksum.
    pub fn get_payload(&self, pid: u64) -> Result<Option<PayloadRecord>> {
        decode_payload(pid, self.get(&Key::Payload(pid))?)
    }

    /// Reads the payloads of several messages together
    /// ([`Backend::get_many`]), each decoded and checked as
    /// [`Store::get_payload`] does, in the order of `pids`: the outer error
    /// is a read that failed, an inner one a payload that does not decode
    /// or whose checksum is wrong.
    pub fn get_payloads(&self, pids: &[u64]) -> Result<Vec<Result<Option<PayloadRecord>>>> {
        let keys: Vec<Bytes> = pids.iter().map(|&pid| Key::Payload(pid).encode()).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
        let values = self.backend.get_many(&refs)?;
        Ok(pids
            .iter()
            .zip(values)
            .map(|(&pid, v)| decode_payload(pid, v))
            .collect())
    }

    /// Reads and decodes a message's state.
    pub fn get_meta(&self, qid: u32, pos: u64) -> Result<Option<MetaRecord>> {
        match self.get(&Key::Meta(qid, pos))? {
            None => Ok(None),
            Some(bytes) => records::decode(&format_args!("message {qid}/{pos}"), &bytes).map(Some),
        }
    }

    /// Reads a system value.
    pub fn get_sys(&self, key: SysKey) -> Result<Option<u64>> {
        match self.get(&Key::Sys(key))? {
            None => Ok(None),
            Some(b) => Ok(Some(u64::from_be_bytes(b.as_ref().try_into().map_err(
                |_| StorageError::corrupt(format!("system key {key:?}"), "not 8 bytes"),
            )?))),
        }
    }

    /// Watches for a fail-stop error: the value turns `Some(reason)` once
    /// the store has stopped.
    pub fn failure(&self) -> watch::Receiver<Option<String>> {
        self.backend.failure()
    }

    /// Stops taking transactions, waits until every submitted one is
    /// durable and lets the backend go (the local one applies them,
    /// checkpoints and releases the directory). Returns the failure that
    /// stopped the store, if any.
    pub fn close(self) -> Result<()> {
        self.backend.close()
    }
}

/// A payload as read (see [`Store::get_payload`]): decoded, its checksum
/// checked.
fn decode_payload(pid: u64, value: Option<Bytes>) -> Result<Option<PayloadRecord>> {
    let what = format_args!("payload {pid}");
    match value {
        None => Ok(None),
        Some(bytes) => {
            let rec: PayloadRecord = records::decode(&what, &bytes)?;
            rec.verify(&what)?;
            Ok(Some(rec))
        }
    }
}

#[cfg(test)]
mod backend_tests;
