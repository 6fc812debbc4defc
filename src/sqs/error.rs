//! SQS's errors, as SQS shapes them.
//!
//! Each error has the name of its shape in the API model (the JSON
//! protocol's `__type`, `com.amazonaws.sqs#QueueDoesNotExist`), the code
//! the query protocol used for it (`AWS.SimpleQueueService.NonExistentQueue`:
//! the XML answer's `Code`, and the `x-amzn-query-error` header a JSON
//! client asks for with `x-amzn-query-mode: true`), an HTTP status, and
//! whether the sender is at fault. Messages follow AWS's wording where
//! clients or tests compare them.

use crate::queue::QueueError;
use crate::queue::error::Exhausted;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SqsError {
    /// The shape's name, or for errors outside the model its code.
    pub(crate) shape: &'static str,
    /// The query protocol's code.
    pub(crate) code: &'static str,
    /// The HTTP status.
    pub(crate) status: u16,
    /// True for the sender's fault (`Sender`), false for the server's
    /// (`Receiver`).
    pub(crate) sender: bool,
    /// What was wrong.
    pub(crate) message: String,
}

impl SqsError {
    fn new(shape: &'static str, code: &'static str, status: u16, message: String) -> SqsError {
        SqsError {
            shape,
            code,
            status,
            sender: status < 500,
            message,
        }
    }

    /// `QueueDoesNotExist`.
    pub(crate) fn no_queue() -> SqsError {
        SqsError::new(
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            400,
            "The specified queue does not exist.".into(),
        )
    }

    /// `InvalidParameterValue` (outside the model).
    pub(crate) fn invalid(message: impl Into<String>) -> SqsError {
        SqsError::new(
            "InvalidParameterValue",
            "InvalidParameterValue",
            400,
            message.into(),
        )
    }

    /// `InvalidParameterValue` in AWS's words for a value out of range.
    pub(crate) fn bad_value(param: &str, value: impl std::fmt::Display, reason: &str) -> SqsError {
        SqsError::invalid(format!(
            "Value {value} for parameter {param} is invalid. Reason: {reason}"
        ))
    }

    /// `InvalidMessageContents`: a body with characters SQS does not take.
    pub(crate) fn new_invalid_contents() -> SqsError {
        SqsError::new(
            "InvalidMessageContents",
            "InvalidMessageContents",
            400,
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to \
             #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF"
                .into(),
        )
    }

    /// `MissingParameter` (outside the model).
    pub(crate) fn missing(param: &str) -> SqsError {
        SqsError::new(
            "MissingParameter",
            "MissingParameter",
            400,
            format!("The request must contain the parameter {param}."),
        )
    }

    /// `InvalidAttributeName`.
    pub(crate) fn attribute_name(name: &str) -> SqsError {
        SqsError::new(
            "InvalidAttributeName",
            "InvalidAttributeName",
            400,
            format!("Unknown Attribute {name}."),
        )
    }

    /// `InvalidAttributeValue`.
    pub(crate) fn attribute_value(message: impl Into<String>) -> SqsError {
        SqsError::new(
            "InvalidAttributeValue",
            "InvalidAttributeValue",
            400,
            message.into(),
        )
    }

    /// `QueueNameExists`.
    pub(crate) fn queue_exists(message: impl Into<String>) -> SqsError {
        SqsError::new("QueueNameExists", "QueueAlreadyExists", 400, message.into())
    }

    /// `ReceiptHandleIsInvalid`.
    pub(crate) fn receipt_handle(message: impl Into<String>) -> SqsError {
        SqsError::new(
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
            400,
            message.into(),
        )
    }

    /// `MessageNotInflight`.
    pub(crate) fn not_inflight() -> SqsError {
        SqsError::new(
            "MessageNotInflight",
            "AWS.SimpleQueueService.MessageNotInflight",
            400,
            "The message referred to isn't in flight.".into(),
        )
    }

    /// `EmptyBatchRequest`; `entry` is the entry shape's name.
    pub(crate) fn empty_batch(entry: &str) -> SqsError {
        SqsError::new(
            "EmptyBatchRequest",
            "AWS.SimpleQueueService.EmptyBatchRequest",
            400,
            format!("There should be at least one {entry} in the request."),
        )
    }

    /// `TooManyEntriesInBatchRequest`.
    pub(crate) fn too_many_entries(n: usize) -> SqsError {
        SqsError::new(
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            400,
            format!("Maximum number of entries per request are 10. You have sent {n}."),
        )
    }

    /// `BatchEntryIdsNotDistinct`.
    pub(crate) fn ids_not_distinct(id: &str) -> SqsError {
        SqsError::new(
            "BatchEntryIdsNotDistinct",
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            400,
            format!("Id {id} repeated."),
        )
    }

    /// `InvalidBatchEntryId`.
    pub(crate) fn batch_entry_id() -> SqsError {
        SqsError::new(
            "InvalidBatchEntryId",
            "AWS.SimpleQueueService.InvalidBatchEntryId",
            400,
            "A batch entry id can only contain alphanumeric characters, hyphens and underscores. \
             It can be at most 80 letters long."
                .into(),
        )
    }

    /// `BatchRequestTooLong`.
    pub(crate) fn batch_too_long(max: usize, sent: usize) -> SqsError {
        SqsError::new(
            "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong",
            400,
            format!(
                "Batch requests cannot be longer than {max} bytes. You have sent {sent} bytes."
            ),
        )
    }

    /// `PurgeQueueInProgress`.
    pub(crate) fn purge_in_progress(queue: &str) -> SqsError {
        SqsError::new(
            "PurgeQueueInProgress",
            "AWS.SimpleQueueService.PurgeQueueInProgress",
            400,
            format!("Only one PurgeQueue operation on {queue} is allowed every 60 seconds."),
        )
    }

    /// `OverLimit` (403).
    pub(crate) fn over_limit(message: impl Into<String>) -> SqsError {
        SqsError::new("OverLimit", "OverLimit", 403, message.into())
    }

    /// `ResourceNotFoundException` (404, as SQS answers it).
    pub(crate) fn resource_not_found(message: impl Into<String>) -> SqsError {
        SqsError::new(
            "ResourceNotFoundException",
            "ResourceNotFoundException",
            404,
            message.into(),
        )
    }

    /// `InvalidAction`: no such action (outside the model).
    pub(crate) fn invalid_action(action: &str) -> SqsError {
        SqsError::new(
            "InvalidAction",
            "InvalidAction",
            400,
            format!(
                "The action or operation requested is invalid: {action:?} is not an action of Amazon SQS (API version 2012-11-05)."
            ),
        )
    }

    /// `MalformedQueryString` / `SerializationException`: a request that
    /// does not parse.
    pub(crate) fn malformed(message: impl Into<String>) -> SqsError {
        SqsError::new(
            "SerializationException",
            "MalformedQueryString",
            400,
            message.into(),
        )
    }

    /// A refusal of the caller's credentials or signature (403): `code` is
    /// AWS's (`InvalidClientTokenId`, `SignatureDoesNotMatch`,
    /// `IncompleteSignature`, `MissingAuthenticationToken`,
    /// `RequestExpired`, `AccessDenied`).
    pub(crate) fn auth(code: &'static str, message: impl Into<String>) -> SqsError {
        SqsError::new(code, code, 403, message.into())
    }

    /// [`SqsError::auth`] with another status (`IncompleteSignature` and
    /// `RequestExpired` are 400s).
    pub(crate) fn auth_status(
        code: &'static str,
        status: u16,
        message: impl Into<String>,
    ) -> SqsError {
        SqsError::new(code, code, status, message.into())
    }

    /// `RequestThrottled` (403, as SQS answers it).
    pub(crate) fn throttled(message: impl Into<String>) -> SqsError {
        SqsError::new("RequestThrottled", "RequestThrottled", 403, message.into())
    }

    /// `InternalError` (500).
    pub(crate) fn internal(message: impl Into<String>) -> SqsError {
        SqsError::new("InternalError", "InternalError", 500, message.into())
    }

    /// `ServiceUnavailable` (503).
    pub(crate) fn unavailable(message: impl Into<String>) -> SqsError {
        SqsError::new(
            "ServiceUnavailable",
            "ServiceUnavailable",
            503,
            message.into(),
        )
    }

    /// An engine error.
    pub(crate) fn from_queue(e: QueueError) -> SqsError {
        SqsError::from_queue_ref(&e)
    }

    /// An engine error, borrowed.
    pub(crate) fn from_queue_ref(e: &QueueError) -> SqsError {
        let text = e.to_string();
        match e {
            QueueError::NotFound { kind: "queue", .. } => SqsError::no_queue(),
            QueueError::NotFound { .. }
            | QueueError::InvalidArgument { .. }
            | QueueError::FailedPrecondition(_) => SqsError::invalid(text),
            QueueError::AlreadyExists { .. } => SqsError::queue_exists(text),
            QueueError::ResourceExhausted { kind, .. } => match kind {
                Exhausted::MessageTooLarge => SqsError::invalid(text),
                Exhausted::QueueFull => SqsError::over_limit(text),
                Exhausted::DiskLow | Exhausted::DiskFloor => SqsError::throttled(text),
            },
            QueueError::Unavailable(_) => SqsError::unavailable(text),
            QueueError::DataLoss(_) | QueueError::Storage(_) => SqsError::internal(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_the_query_codes_clients_compare() {
        let e = SqsError::no_queue();
        assert_eq!(e.shape, "QueueDoesNotExist");
        assert_eq!(e.code, "AWS.SimpleQueueService.NonExistentQueue");
        assert!(e.sender);
        assert_eq!(
            SqsError::empty_batch("DeleteMessageBatchRequestEntry").message,
            "There should be at least one DeleteMessageBatchRequestEntry in the request."
        );
        assert_eq!(SqsError::over_limit("x").status, 403);
        assert!(!SqsError::internal("x").sender);
    }
}
