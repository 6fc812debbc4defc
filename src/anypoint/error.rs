//! Errors of the REST facade and their HTTP form: the Broker API answers
//! `{"status":"failure","statusMessage":...}`, the Admin and Stats APIs
//! `{"message":...}`, as in their specifications. The mapping from engine
//! errors is one exhaustive match.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::json_response;
use crate::auth::AuthError;
use crate::edge::status::http_status;
use crate::queue::QueueError;

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// The Broker API.
    Broker,
    /// The Admin and Stats APIs.
    Admin,
}

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) api: Api,
    /// Seconds for a `Retry-After` header (429 of a throttled secret).
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    /// A Broker API error.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            api: Api::Broker,
            retry_after: None,
        }
    }

    /// 400 with a message.
    pub(crate) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// The same error in the Admin API's shape.
    pub(crate) fn admin(mut self) -> ApiError {
        self.api = Api::Admin;
        self
    }

    /// An engine error, in the caller's field names; a missing queue or
    /// exchange is the Broker API's "Destination not found".
    pub(crate) fn from_queue(e: QueueError) -> ApiError {
        let message = match &e {
            QueueError::InvalidArgument {
                field,
                value,
                reason,
            } => format!("invalid {} {value:?}: {reason}", rest_field(field)),
            QueueError::NotFound { kind, name } if matches!(*kind, "queue" | "exchange") => {
                format!("Destination not found: {name} (no {kind} of that name)")
            }
            other => other.to_string(),
        };
        ApiError::new(http_status(&e), message)
    }

    /// An authentication or authorization failure.
    pub(crate) fn from_auth(e: AuthError) -> ApiError {
        let (status, retry_after) = match e {
            AuthError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, None),
            AuthError::Throttled {
                retry_after_secs, ..
            } => (StatusCode::TOO_MANY_REQUESTS, Some(retry_after_secs)),
            AuthError::PermissionDenied { .. } => (StatusCode::FORBIDDEN, None),
        };
        ApiError {
            retry_after,
            ..ApiError::new(status, e.to_string())
        }
    }
}

/// The REST name of an engine request field, so that errors speak the
/// caller's vocabulary (`messages[2].ttl_ms` → `messages[2].headers.ttl`).
pub(crate) fn rest_field(field: &str) -> String {
    const NAMES: &[(&str, &str)] = &[
        ("ttl_ms", "headers.ttl"),
        ("delay_ms", "headers.deliveryDelay"),
        ("group_id", "headers.messageGroupId"),
        ("message_id", "headers.messageId"),
        ("ack_timeout_ms", "lockTtl"),
        ("wait_ms", "pollingTime"),
        ("max_messages", "batchSize"),
        ("config.message_ttl_ms", "defaultTtl"),
        ("config.ack_timeout_ms", "defaultLockTtl"),
        ("config.delivery_delay_ms", "defaultDeliveryDelay"),
        ("config.dead_letter.queue", "deadLetterQueueId"),
        ("config.dead_letter.max_deliveries", "maxDeliveries"),
        ("config.kind", "fifo"),
        ("binding.filter", "routingRules"),
        ("name", "destinationId"),
    ];
    let (prefix, last) = match field.rsplit_once("].") {
        Some((p, l)) => (Some(p), l),
        None => (None, field),
    };
    let name = NAMES
        .iter()
        .find(|(engine, _)| *engine == last)
        .map_or(last, |(_, rest)| rest);
    match prefix {
        Some(p) => format!("{p}].{name}"),
        None => name.to_string(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.api {
            Api::Broker => json!({"status": "failure", "statusMessage": self.message}),
            Api::Admin => json!({"message": self.message}),
        };
        let mut r = json_response(self.status, &body);
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Exhausted;

    #[test]
    fn engine_fields_are_renamed() {
        assert_eq!(rest_field("messages[2].ttl_ms"), "messages[2].headers.ttl");
        assert_eq!(rest_field("ack_timeout_ms"), "lockTtl");
        assert_eq!(rest_field("config.ack_timeout_ms"), "defaultLockTtl");
        assert_eq!(rest_field("something_else"), "something_else");
        let e = ApiError::from_queue(QueueError::invalid("messages[0].delay_ms", 5, "no"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains("messages[0].headers.deliveryDelay"),
            "{}",
            e.message
        );
        let e = ApiError::from_queue(QueueError::no_queue("orders"));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(e.message.starts_with("Destination not found: orders"));
    }

    #[test]
    fn limits_are_told_apart_by_kind_not_text() {
        // The same text for every kind: the status follows the kind.
        let status = |kind: Exhausted| http_status(&kind.error("over a limit"));
        assert_eq!(
            status(Exhausted::MessageTooLarge),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        for kind in [
            Exhausted::QueueFull,
            Exhausted::DiskLow,
            Exhausted::DiskFloor,
        ] {
            assert_eq!(status(kind), StatusCode::TOO_MANY_REQUESTS, "{kind}");
        }
        let e = ApiError::from_queue(
            Exhausted::MessageTooLarge
                .error("messages[0].body is 11 bytes, more than the limit of 10 bytes"),
        );
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            e.message,
            "messages[0].body is 11 bytes, more than the limit of 10 bytes"
        );
    }
}
