//! Client errors: a kind the caller can match on, with the gRPC status as
//! the source when there is one.

use tonic::Code;

/// What kind of failure a [`ClientError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The server answered with this status code.
    Rpc(Code),
    /// The connection could not be made or broke.
    Transport,
    /// The subscriber's circuit breaker is open.
    CircuitOpen,
    /// The delivery's lease is gone (expired, settled elsewhere).
    LeaseLost,
    /// A stream or subscriber was closed.
    Closed,
    /// A bad argument given to the client itself (e.g. a cron expression).
    InvalidArgument,
}

/// An error of the client library.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    kind: ErrorKind,
    message: String,
    #[source]
    status: Option<tonic::Status>,
}

impl ClientError {
    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ClientError {
        ClientError {
            kind,
            message: message.into(),
            status: None,
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The gRPC status code, for errors the server answered.
    pub fn code(&self) -> Option<Code> {
        match self.kind {
            ErrorKind::Rpc(c) => Some(c),
            _ => None,
        }
    }

    /// The server's status, if any.
    pub fn status(&self) -> Option<&tonic::Status> {
        self.status.as_ref()
    }

    /// True when retrying later may succeed (server unavailable or
    /// overloaded, connection trouble).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Transport | ErrorKind::Rpc(Code::Unavailable)
        )
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError {
            kind: ErrorKind::Rpc(s.code()),
            message: format!("{}: {}", code_name(s.code()), s.message()),
            status: Some(s),
        }
    }
}

impl From<tonic::transport::Error> for ClientError {
    fn from(e: tonic::transport::Error) -> Self {
        ClientError::new(ErrorKind::Transport, format!("transport: {e}"))
    }
}

/// The canonical upper-case name of a status code.
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Result of client calls.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
