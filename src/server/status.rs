//! The one mapping from engine errors to gRPC statuses. The match is
//! exhaustive with no catch-all arm, so a new error cannot ship unmapped.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::queue::QueueError;
use crate::storage::StorageError;

/// Converts an engine error to the status a client sees. Field errors
/// carry a `BadRequest` field violation naming the field.
pub(crate) fn to_status(e: QueueError) -> Status {
    let message = e.to_string();
    match e {
        QueueError::InvalidArgument { field, reason, .. } => Status::with_error_details(
            Code::InvalidArgument,
            message,
            ErrorDetails::with_bad_request_violation(field, reason),
        ),
        QueueError::NotFound { .. } => Status::not_found(message),
        QueueError::AlreadyExists { .. } => Status::already_exists(message),
        QueueError::FailedPrecondition(_) => Status::failed_precondition(message),
        QueueError::ResourceExhausted(_) => Status::resource_exhausted(message),
        QueueError::Unavailable(_) => Status::unavailable(message),
        QueueError::DataLoss(_) => Status::data_loss(message),
        QueueError::Storage(s) => storage_status(&s, message),
    }
}

fn storage_status(e: &StorageError, message: String) -> Status {
    if e.is_disk_full() {
        return Status::resource_exhausted(format!("disk full: {message}"));
    }
    match e {
        StorageError::Stopped { .. } => Status::unavailable(message),
        StorageError::Corrupt { .. } => Status::data_loss(message),
        StorageError::Io { .. }
        | StorageError::Db { .. }
        | StorageError::FormatVersion { .. }
        | StorageError::NotDataDir { .. }
        | StorageError::Locked { .. } => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_errors_name_the_field() {
        let s = to_status(QueueError::invalid("messages[2].ttl_ms", 5, "too short"));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("messages[2].ttl_ms"));
        let details = s.get_error_details();
        let br = details.bad_request().expect("bad request details");
        assert_eq!(br.field_violations[0].field, "messages[2].ttl_ms");
    }

    #[test]
    fn stopped_storage_is_unavailable() {
        let s = to_status(QueueError::Storage(StorageError::Stopped {
            reason: "x".into(),
        }));
        assert_eq!(s.code(), Code::Unavailable);
    }
}
