//! The database (sled) the store applies to and reads ([`Database`]):
//! opening it, its format value, and the handle of the current one, which
//! a rewrite replaces (see `rewrite`).
//!
//! Its lock, a `RwLock` outside the ranked order, is held only to clone
//! the handle, or by a rewrite to replace it, with no other lock held.

use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::fsutil;
use crate::storage::error::{Result, StorageError};
use crate::storage::keys::{Key, SysKey};

/// The database the store reads and applies to, and its directory.
struct Current {
    db: sled::Db,
    path: PathBuf,
}

/// The current database (see the module doc).
pub(super) struct Database {
    /// Replaced only by a rewrite (see `rewrite`), by the applier thread,
    /// the only one that writes the database.
    current: RwLock<Current>,
    /// Size of the database's files after the last rewrite: the next one
    /// waits until they have grown well past it.
    rewritten_bytes: AtomicU64,
}

impl Database {
    /// `db`, opened on `path`, as the current database.
    pub(super) fn new(db: sled::Db, path: PathBuf) -> Database {
        Database {
            current: RwLock::new(Current { db, path }),
            rewritten_bytes: AtomicU64::new(0),
        }
    }

    /// The current database (a handle: cheap to clone).
    pub(super) fn handle(&self) -> sled::Db {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .db
            .clone()
    }

    /// The current database's directory.
    pub(super) fn path(&self) -> PathBuf {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .path
            .clone()
    }

    /// sled's error `e` on the current database.
    pub(super) fn error(&self, e: sled::Error) -> StorageError {
        StorageError::db(&self.path())(e)
    }

    /// Makes `db`, opened on `path`, the current database (a rewrite's
    /// switch).
    pub(super) fn switch(&self, db: sled::Db, path: PathBuf) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Current { db, path };
    }

    /// Notes the size of the database's files after a rewrite.
    pub(super) fn rewritten(&self, size: u64) {
        self.rewritten_bytes.store(size, Ordering::Relaxed);
    }

    /// Size of the database's files after the last rewrite (0 before
    /// any).
    pub(super) fn rewritten_bytes(&self) -> u64 {
        self.rewritten_bytes.load(Ordering::Relaxed)
    }
}

/// Opens sled on `db_dir` as the store does. sled panics on some damage
/// instead of returning an error: that is turned into an error naming the
/// directory.
pub(crate) fn open_db(db_dir: &Path, cache_bytes: u64) -> Result<sled::Db> {
    let open = || {
        std::panic::catch_unwind(|| {
            sled::Config::new()
                .path(db_dir)
                .flush_every_ms(None)
                .cache_capacity(cache_bytes)
                .mode(sled::Mode::HighThroughput)
                .open()
        })
    };
    let mut opened = open();
    // sled's file lock outlives the last handle for as long as its
    // background threads finish writes they were given; within one process
    // (the data directory's own lock keeps other processes out) a reopen
    // right after a close can find it still held for a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Ok(Err(sled::Error::Io(e))) = &opened {
        if e.kind() != std::io::ErrorKind::Other
            || !e.to_string().contains("could not acquire lock")
            || Instant::now() >= deadline
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        opened = open();
    }
    match opened {
        Ok(r) => r.map_err(StorageError::db(db_dir)),
        Err(panic) => Err(StorageError::corrupt(
            db_dir.display().to_string(),
            format!(
                "the database cannot be read (it is damaged: {})",
                panic_text(panic.as_ref())
            ),
        )),
    }
}

/// The message of a caught panic.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

/// Reads a system value of `db` (on `path`).
pub(crate) fn read_sys(db: &sled::Db, key: SysKey, path: &Path) -> Result<Option<u64>> {
    let v = db
        .get(Key::Sys(key).encode())
        .map_err(StorageError::db(path))?;
    match v {
        None => Ok(None),
        Some(iv) => Ok(Some(u64::from_be_bytes(iv.as_ref().try_into().map_err(
            |_| {
                StorageError::corrupt(
                    format!("{} system key {key:?}", path.display()),
                    "not 8 bytes",
                )
            },
        )?))),
    }
}

/// Checks the database's format version; a new directory's database gets
/// it. An existing directory whose database lacks it lost its database
/// (deleted, truncated, or replaced by an empty one): refused, rather than
/// started empty.
pub(super) fn check_format(db: &sled::Db, path: &Path, fresh: bool) -> Result<()> {
    let supported = fsutil::FORMAT_VERSION;
    match read_sys(db, SysKey::FormatVersion, path)? {
        Some(v) if v == u64::from(supported) => Ok(()),
        Some(v) => Err(StorageError::FormatVersion {
            path: path.to_path_buf(),
            found: v.to_string(),
            supported,
        }),
        None if !fresh => Err(StorageError::corrupt(
            path.display().to_string(),
            "the database is empty or lost its records, but FORMAT says this directory holds data: refusing to start empty",
        )),
        None => {
            db.insert(
                Key::Sys(SysKey::FormatVersion).encode(),
                &u64::from(supported).to_be_bytes(),
            )
            .map_err(StorageError::db(path))?;
            Ok(())
        }
    }
}
