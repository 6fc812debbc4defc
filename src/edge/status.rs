//! The HTTP status of an engine error, for every HTTP front end (the
//! Anypoint REST facade, the console): one exhaustive match.

use axum::http::StatusCode;

use crate::queue::{Exhausted, QueueError};
use crate::storage::StorageError;

/// The HTTP status of an engine error. A message over the size limit is
/// 413, as the Anypoint MQ API answers it; the other limits are 429.
pub(crate) fn http_status(e: &QueueError) -> StatusCode {
    match e {
        QueueError::InvalidArgument { .. } | QueueError::FailedPrecondition(_) => {
            StatusCode::BAD_REQUEST
        }
        QueueError::NotFound { .. } => StatusCode::NOT_FOUND,
        QueueError::AlreadyExists { .. } => StatusCode::CONFLICT,
        QueueError::ResourceExhausted { kind, .. } => match kind {
            Exhausted::MessageTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Exhausted::QueueFull | Exhausted::DiskLow | Exhausted::DiskFloor => {
                StatusCode::TOO_MANY_REQUESTS
            }
        },
        QueueError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        QueueError::DataLoss(_) => StatusCode::INTERNAL_SERVER_ERROR,
        QueueError::Storage(s) => storage_status(s),
    }
}

fn storage_status(e: &StorageError) -> StatusCode {
    if e.is_disk_full() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    match e {
        StorageError::Stopped { .. } => StatusCode::SERVICE_UNAVAILABLE,
        StorageError::Corrupt { .. }
        | StorageError::Io { .. }
        | StorageError::Db { .. }
        | StorageError::FormatVersion { .. }
        | StorageError::NotDataDir { .. }
        | StorageError::Locked { .. }
        | StorageError::TooSmall { .. }
        | StorageError::Pg(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
