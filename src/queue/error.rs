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
        /// For a queue, the values of its configuration that differ, as
        /// the API names them (`message_ttl_ms`, `dead_letter`, ...).
        differ: Vec<&'static str>,
    },
    /// The system is not in a state that allows the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit or the disk is full; `kind` says which, so that an adapter
    /// need not read `detail` to choose its answer.
    #[error("{detail}")]
    ResourceExhausted {
        /// Which limit.
        kind: Exhausted,
        /// What happened, for people.
        detail: String,
    },
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

    /// Which limit was hit, when this is a [`QueueError::ResourceExhausted`].
    pub fn exhausted_kind(&self) -> Option<Exhausted> {
        match self {
            QueueError::ResourceExhausted { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// True when retrying the same call later may succeed (not for a
    /// message too large, which never will be taken).
    pub fn is_retryable(&self) -> bool {
        match self {
            QueueError::Unavailable(_) => true,
            QueueError::ResourceExhausted { kind, .. } => *kind != Exhausted::MessageTooLarge,
            _ => false,
        }
    }
}

/// Which limit a [`QueueError::ResourceExhausted`] hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exhausted {
    /// A message's body is over the largest message size: sending it again
    /// will never succeed.
    MessageTooLarge,
    /// A queue holds as many messages as its `max_length` allows.
    QueueFull,
    /// Free disk space is below the configured minimum: publishes are
    /// refused.
    DiskLow,
    /// Free disk space is below the hard floor (a quarter of the minimum):
    /// acks, nacks and receives are refused too.
    DiskFloor,
}

impl Exhausted {
    /// The error of hitting this limit, `detail` saying how.
    pub fn error(self, detail: impl Into<String>) -> QueueError {
        QueueError::ResourceExhausted {
            kind: self,
            detail: detail.into(),
        }
    }

    /// Every kind.
    pub const ALL: [Exhausted; 4] = [
        Exhausted::MessageTooLarge,
        Exhausted::QueueFull,
        Exhausted::DiskLow,
        Exhausted::DiskFloor,
    ];

    /// The kind's stable upper-case name, as error details carry it (the
    /// `reason` of a gRPC `ErrorInfo`).
    pub fn reason(self) -> &'static str {
        match self {
            Exhausted::MessageTooLarge => "MESSAGE_TOO_LARGE",
            Exhausted::QueueFull => "QUEUE_FULL",
            Exhausted::DiskLow => "DISK_LOW",
            Exhausted::DiskFloor => "DISK_FLOOR",
        }
    }
}

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

/// Result of queue operations.
pub type Result<T, E = QueueError> = std::result::Result<T, E>;
