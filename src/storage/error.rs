//! Storage errors. All of them are fail-stop for the operation that met
//! them: nothing is retried, and after a log or checkpoint I/O error the
//! store refuses every further write (see [`StorageError::Stopped`]).

use std::path::PathBuf;

/// An error of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The embedded database failed.
    #[error("database {path}: {source}")]
    Db {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        #[source]
        source: sled::Error,
    },
    /// Stored bytes do not decode, or fail their checksum.
    #[error("corrupt data in {what}: {reason}")]
    Corrupt {
        /// Which file or key.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The data directory has a format this build does not know.
    #[error("{path}: data format {found} is not supported (this build reads format {supported})")]
    FormatVersion {
        /// The format file.
        path: PathBuf,
        /// The version found there.
        found: String,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The directory is not a Letterbox data directory.
    #[error("{path}: not a Letterbox data directory ({reason})")]
    NotDataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Another process holds the data directory.
    #[error("{path}: data directory is in use by another letterbox process")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The data directory's file system can never hold the reserve the
    /// log's settings keep from messages.
    #[error("{path}: the file system is too small for these settings: {detail}")]
    TooSmall {
        /// The data directory.
        path: PathBuf,
        /// The sizes, and settings that fit.
        detail: String,
    },
    /// PostgreSQL failed or refused (the PostgreSQL backend; see
    /// [`super::pg`]).
    #[error(transparent)]
    Pg(#[from] super::pg::PgError),
    /// The store stopped after an earlier I/O error (fail-stop) or is
    /// shutting down; nothing more is written.
    #[error("storage stopped: {reason}")]
    Stopped {
        /// The error that stopped it, or "shutting down".
        reason: String,
    },
}

impl StorageError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Maps sled's errors on the database in `path`: `.map_err(StorageError::db(path))`.
    pub(crate) fn db(path: &std::path::Path) -> impl Fn(sled::Error) -> Self + Copy + '_ {
        move |source| StorageError::Db {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        StorageError::Corrupt {
            what: what.into(),
            reason: reason.to_string(),
        }
    }

    /// What the waiter of a transaction refused for `cause` gets:
    /// [`StorageError::Stopped`] naming the cause (a `Stopped` cause as
    /// it is).
    pub(crate) fn stopped_by(cause: &StorageError) -> StorageError {
        StorageError::Stopped {
            reason: match cause {
                StorageError::Stopped { reason } => reason.clone(),
                other => other.to_string(),
            },
        }
    }

    /// True when stored bytes were found damaged (they do not decode, or
    /// fail their checksum): the data is bad, not the disk's access to it.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StorageError::Corrupt { .. })
    }

    /// True when the error means the disk ran out of space.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StorageError::Io { source, .. } => {
                source.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
            }
            _ => false,
        }
    }
}

/// Result of storage calls.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;
