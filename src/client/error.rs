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
        ClientError::new(ErrorKind::Transport, format!("transport: {}", chain(&e)))
    }
}

impl ClientError {
    /// A failure to reach or talk to the server at `endpoint`, said in
    /// words that name the address and the likely cause (connection
    /// refused, a name that does not resolve, an untrusted certificate,
    /// TLS on one side only, a refused client certificate).
    pub(crate) fn transport(
        endpoint: &str,
        err: &(dyn std::error::Error + 'static),
    ) -> ClientError {
        ClientError::new(ErrorKind::Transport, explain_transport(endpoint, err))
    }

    /// An error from a call: a status that carries a transport failure is
    /// explained as [`ClientError::transport`]; any other is the server's
    /// answer.
    pub(crate) fn from_call(endpoint: &str, s: tonic::Status) -> ClientError {
        let transport = std::error::Error::source(&s)
            .filter(|e| e.is::<tonic::transport::Error>() || e.is::<std::io::Error>());
        match transport {
            Some(e) => ClientError {
                kind: ErrorKind::Transport,
                message: explain_transport(endpoint, e),
                status: None,
            },
            None => s.into(),
        }
    }
}

/// Every message of an error's chain, joined by ": ", repeats left out.
/// An `io::Error` wrapping another error is looked through (its own
/// `source` skips the wrapped error).
fn chain(top: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(top);
    while let Some(e) = cur {
        let text = e.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    parts.join(": ")
}

/// True if some error of the chain is an `io::Error` of this kind.
fn has_io_kind(top: &(dyn std::error::Error + 'static), kind: std::io::ErrorKind) -> bool {
    let mut cur = Some(top);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == kind {
                return true;
            }
            if let Some(inner) = io.get_ref() {
                cur = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
        }
        cur = e.source();
    }
    false
}

/// `HOST:PORT` of an endpoint URL.
fn authority(endpoint: &str) -> &str {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// The words for a transport failure (see [`ClientError::transport`]).
fn explain_transport(endpoint: &str, err: &(dyn std::error::Error + 'static)) -> String {
    use std::io::ErrorKind as Io;
    let addr = authority(endpoint);
    let tls = endpoint.starts_with("https://");
    let detail = chain(err);
    let low = detail.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| low.contains(w));
    if has_io_kind(err, Io::ConnectionRefused) {
        return format!(
            "connection refused at {addr}: no server is listening there (is it running, on that address?)"
        );
    }
    if has(&[
        "dns error",
        "failed to lookup address",
        "name or service not known",
    ]) {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        return format!("cannot resolve the host name {host:?} of {endpoint} ({detail})");
    }
    if has(&["invalid peer certificate"]) {
        return format!(
            "the certificate of the server at {addr} is not trusted ({detail}); give --ca-cert with the CA that signed it, and use the host name the certificate names"
        );
    }
    if tls
        && has(&[
            "corrupt message",
            "invalidcontenttype",
            "invalid content type",
        ])
    {
        return format!("the server at {addr} does not speak TLS: use http://{addr} ({detail})");
    }
    if tls && has(&["received fatal alert"]) {
        return format!(
            "the server at {addr} refused the TLS connection, most likely the client certificate (missing, or not signed by a CA it trusts): give --client-cert and --client-key ({detail})"
        );
    }
    let closed = has_io_kind(err, Io::ConnectionReset)
        || has_io_kind(err, Io::BrokenPipe)
        || has_io_kind(err, Io::UnexpectedEof)
        || has(&[
            "connection closed",
            "connection reset",
            "broken pipe",
            "frame with invalid size",
            "protocol error",
            "unexpected eof",
        ]);
    if tls && closed {
        // TLS 1.3: a server refusing the client certificate sends an alert
        // and closes; the client may see the close before the alert.
        return format!(
            "the server at {addr} closed the TLS connection before answering, most likely refusing the client certificate (missing, or not signed by a CA it trusts): give --client-cert and --client-key ({detail})"
        );
    }
    if has_io_kind(err, Io::TimedOut) || has(&["timed out", "deadline has elapsed"]) {
        return format!("no answer from {addr} in time: is the address reachable? ({detail})");
    }
    if closed {
        return format!(
            "the server at {addr} closed the connection before answering: if it serves TLS, use https://{addr} (with --ca-cert) ({detail})"
        );
    }
    format!("cannot talk to the server at {addr}: {detail}")
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
