//! The one mapping from engine errors to gRPC statuses. The match is
//! exhaustive with no catch-all arm, so a new error cannot ship unmapped.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::queue::QueueError;
use crate::storage::StorageError;

/// The `domain` of the `ErrorInfo` details this server attaches.
pub(crate) const ERROR_DOMAIN: &str = "letterbox";

/// The `ErrorInfo` reason of `ALREADY_EXISTS` for a queue created again
/// with another configuration; its metadata `differ` lists the values
/// that differ, as the API names them (`message_ttl_ms,dead_letter`).
pub(crate) const CONFIGURATION_DIFFERS: &str = "CONFIGURATION_DIFFERS";

/// Converts an engine error to the status a client sees. Field errors
/// carry a `BadRequest` field violation naming the field; a limit hit
/// carries an `ErrorInfo` whose `reason` names the limit
/// ([`crate::queue::Exhausted::reason`]: `MESSAGE_TOO_LARGE`, `QUEUE_FULL`,
/// `DISK_LOW`, `DISK_FLOOR`), and a queue that exists with another
/// configuration one whose reason is [`CONFIGURATION_DIFFERS`], so that a
/// client need not read the message.
pub(crate) fn to_status(e: QueueError) -> Status {
    let message = e.to_string();
    match e {
        QueueError::InvalidArgument { field, reason, .. } => Status::with_error_details(
            Code::InvalidArgument,
            message,
            ErrorDetails::with_bad_request_violation(field, reason),
        ),
        QueueError::NotFound { .. } => Status::not_found(message),
        QueueError::AlreadyExists { differ, .. } if differ.is_empty() => {
            Status::already_exists(message)
        }
        QueueError::AlreadyExists { differ, .. } => Status::with_error_details(
            Code::AlreadyExists,
            message,
            ErrorDetails::with_error_info(
                CONFIGURATION_DIFFERS,
                ERROR_DOMAIN,
                HashMap::from([("differ".to_string(), differ.join(","))]),
            ),
        ),
        QueueError::FailedPrecondition(_) => Status::failed_precondition(message),
        QueueError::ResourceExhausted { kind, .. } => Status::with_error_details(
            Code::ResourceExhausted,
            message,
            ErrorDetails::with_error_info(kind.reason(), ERROR_DOMAIN, HashMap::new()),
        ),
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
        | StorageError::Locked { .. }
        | StorageError::TooSmall { .. }
        | StorageError::Pg(_) => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Exhausted;

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
    fn limits_name_their_kind() {
        for kind in Exhausted::ALL {
            let s = to_status(kind.error("the detail"));
            assert_eq!(s.code(), Code::ResourceExhausted);
            assert_eq!(s.message(), "the detail", "the message is the engine's");
            let details = s.get_error_details();
            let info = details.error_info().expect("error info details");
            assert_eq!(info.reason, kind.reason());
            assert_eq!(info.domain, ERROR_DOMAIN);
        }
    }

    #[test]
    fn a_queue_that_exists_otherwise_lists_what_differs() {
        let s = to_status(QueueError::AlreadyExists {
            kind: "queue",
            name: "q".into(),
            detail: "with a different configuration: ...".into(),
            differ: vec!["message_ttl_ms", "dead_letter"],
        });
        assert_eq!(s.code(), Code::AlreadyExists);
        let details = s.get_error_details();
        let info = details.error_info().expect("error info details");
        assert_eq!(info.reason, CONFIGURATION_DIFFERS);
        assert_eq!(info.metadata["differ"], "message_ttl_ms,dead_letter");
    }

    #[test]
    fn stopped_storage_is_unavailable() {
        let s = to_status(QueueError::Storage(StorageError::Stopped {
            reason: "x".into(),
        }));
        assert_eq!(s.code(), Code::Unavailable);
    }
}
