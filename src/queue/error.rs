//! Errors of the queue engine. Every variant but `Storage` means the call
//! had no effect: validation and precondition checks run before anything
//! is changed.

use crate::storage::StorageError;

/// An error of a queue operation.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A request field is malformed or out of range.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidArgument {
        /// The field, as named in the API.
        field: String,
        /// The offending value, as given (shortened if long).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A named thing does not exist.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// "queue", "exchange", "group".
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// Creating something that exists with a different definition.
    #[error("{kind} {name:?} already exists {detail}")]
    AlreadyExists {
        /// "queue", "exchange".
        kind: &'static str,
        /// Its name.
        name: String,
        /// How the existing one differs.
        detail: String,
    },
    /// The system is not in a state that allows the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit or the disk is full.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The server is shutting down or stopped after a storage failure.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Stored data is damaged.
    #[error("{0}")]
    DataLoss(String),
    /// The storage layer failed (fail-stop).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl QueueError {
    /// An invalid-argument error; long values are shortened.
    pub fn invalid(
        field: impl Into<String>,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        let mut value = value.to_string();
        if value.chars().count() > 120 {
            value = value.chars().take(117).collect::<String>() + "...";
        }
        QueueError::InvalidArgument {
            field: field.into(),
            value,
            reason: reason.into(),
        }
    }

    /// A queue that does not exist.
    pub fn no_queue(name: &str) -> Self {
        QueueError::NotFound {
            kind: "queue",
            name: name.to_string(),
        }
    }

    /// True when retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            QueueError::Unavailable(_) | QueueError::ResourceExhausted(_)
        )
    }
}

/// Result of queue operations.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;
