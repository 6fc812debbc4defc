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

    /// The `ErrorInfo` detail of the server's status, if it has one: its
    /// `reason` (`QUEUE_FULL`, `CONFIGURATION_DIFFERS`, ...) and its
    /// metadata.
    pub fn error_info(&self) -> Option<(String, std::collections::HashMap<String, String>)> {
        use tonic_types::StatusExt as _;
        let info = self.status.as_ref()?.get_details_error_info()?;
        Some((info.reason, info.metadata))
    }

    /// The `BadRequest` field violations of the server's status: each
    /// field as the API names it (`config.message_ttl_ms`) and what is
    /// wrong with its value.
    pub fn field_violations(&self) -> Vec<(String, String)> {
        use tonic_types::StatusExt as _;
        self.status
            .as_ref()
            .and_then(|s| s.get_details_bad_request())
            .map(|b| {
                b.field_violations
                    .into_iter()
                    .map(|v| (v.field, v.description))
                    .collect()
            })
            .unwrap_or_default()
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
            None => match not_grpc(endpoint, &s) {
                Some(message) => ClientError {
                    kind: ErrorKind::Rpc(s.code()),
                    message,
                    status: Some(s),
                },
                None => s.into(),
            },
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
    if let Some(problem) = certificate_problem(err) {
        return refused_certificate(addr, &problem);
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
    // The server's TLS alert: found as rustls's error, or only in the
    // words of the error that carried it (an HTTP/2 connection error).
    let alert = match find_in_chain::<tokio_rustls::rustls::Error>(err) {
        Some(tokio_rustls::rustls::Error::AlertReceived(a)) => Some(format!("{a:?}")),
        _ => detail
            .split_once("received fatal alert: ")
            .map(|(_, rest)| {
                rest.split([':', ' ', ')'])
                    .next()
                    .unwrap_or(rest)
                    .to_string()
            }),
    };
    if let Some(alert) = alert {
        return match alert.as_str() {
            "NoApplicationProtocol" => format!(
                "the server at {addr} speaks TLS but not HTTP/2, so it is no gRPC listener (a Letterbox console, REST or metrics port?): give the address of the server's gRPC listener, its first start line `letterbox listening on ADDR`"
            ),
            "ProtocolVersion" | "InsufficientSecurity" => format!(
                "the server at {addr} refused the TLS connection: no TLS version or cipher suite in common"
            ),
            _ => format!(
                "the server at {addr} refused the TLS connection, most likely the client certificate (missing, or not signed by a CA it trusts): give --client-cert and --client-key"
            ),
        };
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

/// When the answer was not gRPC (an HTTP server answered a page, or an
/// error without a gRPC status), words that say so and where to look;
/// tonic's own words are of its decoding ("invalid compression flag").
fn not_grpc(endpoint: &str, s: &tonic::Status) -> Option<String> {
    let text = s.message();
    let http_status = text
        .split_once("HTTP status code ")
        .or_else(|| text.split_once("response with status: "))
        .map(|(_, rest)| rest.trim());
    let decoding = text.contains("invalid compression flag");
    let mapped = text.contains("grpc-status header missing");
    if !decoding && !mapped {
        return None;
    }
    let addr = authority(endpoint);
    let status = http_status.map_or_else(String::new, |h| format!(" (HTTP status {h})"));
    Some(format!(
        "the server at {addr} answered in plain HTTP{status}, not gRPC: is {addr} the gRPC listener? (a Letterbox server prints it first: `letterbox listening on ADDR`)"
    ))
}

/// The first error of a chain that is `T`, looking through `io::Error`s.
fn find_in_chain<'a, T: std::error::Error + 'static>(
    top: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cur = Some(top);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The server's certificate as the client refused it, if that is the
/// failure.
fn certificate_problem(
    err: &(dyn std::error::Error + 'static),
) -> Option<tokio_rustls::rustls::CertificateError> {
    match find_in_chain::<tokio_rustls::rustls::Error>(err)? {
        tokio_rustls::rustls::Error::InvalidCertificate(c) => Some(c.clone()),
        _ => None,
    }
}

/// A name as the certificate error presents it (`DnsName("localhost")`,
/// `IpAddress(127.0.0.1)`), as written.
fn presented_name(n: &str) -> &str {
    let inner = n
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or(n);
    inner.trim_matches('"')
}

/// What is wrong with the certificate of the server at `addr`, and what
/// to do, in words.
fn refused_certificate(addr: &str, problem: &tokio_rustls::rustls::CertificateError) -> String {
    use tokio_rustls::rustls::CertificateError as C;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let not_trusted = format!("the certificate of the server at {addr} is not trusted");
    let other = |what: &str| format!("{not_trusted}: {what}");
    match problem {
        C::UnknownIssuer => format!(
            "{not_trusted}: it is not signed by a CA the client trusts; give --ca-cert with the CA that signed it (`letterbox tls init` writes it as ca.pem)"
        ),
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            let named = match problem {
                C::NotValidForNameContext { presented, .. } if !presented.is_empty() => format!(
                    " (it names {})",
                    presented
                        .iter()
                        .map(|n| presented_name(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => String::new(),
            };
            format!(
                "{not_trusted}: it is not made out for {host:?}{named}; connect with a host name the certificate names, or give the server a certificate for {host:?} (`letterbox tls init DIR --name {host}`)"
            )
        }
        C::Expired | C::ExpiredContext { .. } => {
            other("it has expired; give the server a new certificate")
        }
        C::NotValidYet | C::NotValidYetContext { .. } => other(
            "it is not valid yet (its start date is in the future: check the clocks of both machines)",
        ),
        C::Revoked => other("it has been revoked"),
        C::BadSignature => {
            other("its signature does not verify (is --ca-cert the CA that signed it?)")
        }
        C::BadEncoding => other("it does not parse as an X.509 certificate"),
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => other(
            "it is not made out for a TLS server (extended key usage); give the server a server certificate",
        ),
        C::Other(o) if o.to_string().contains("CaUsedAsEndEntity") => other(
            "the server presents a CA certificate (basic constraints CA:TRUE) as its own, which TLS clients refuse; it needs a certificate signed by that CA (`letterbox tls init DIR --name HOST` makes both)",
        ),
        _ => other(
            "the certificate or its chain was refused; give --ca-cert with the CA that signed it, and use a host name the certificate names",
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_in_plain_http_is_said_so() {
        let page = tonic::Status::internal(
            "protocol error: received message with invalid compression flag: 60 (valid flags are 0 and 1) while receiving response with status: 403 Forbidden",
        );
        let e = ClientError::from_call("http://127.0.0.1:8025", page);
        assert_eq!(
            e.to_string(),
            "the server at 127.0.0.1:8025 answered in plain HTTP (HTTP status 403 Forbidden), not gRPC: is 127.0.0.1:8025 the gRPC listener? (a Letterbox server prints it first: `letterbox listening on ADDR`)"
        );
        let missing = tonic::Status::unimplemented(
            "grpc-status header missing, mapped from HTTP status code 404",
        );
        let e = ClientError::from_call("http://h:1", missing);
        assert!(
            e.to_string()
                .contains("answered in plain HTTP (HTTP status 404)"),
            "{e}"
        );
        // A TLS alert known only by the words of the error carrying it.
        let alert = |name: &str| {
            std::io::Error::other(format!("connection error: received fatal alert: {name}"))
        };
        let text = explain_transport("https://h:1", &alert("CertificateRequired"));
        assert!(
            text.contains("give --client-cert and --client-key"),
            "{text}"
        );
        assert!(!text.contains("CertificateRequired"), "{text}");
        let text = explain_transport("https://h:1", &alert("NoApplicationProtocol"));
        assert!(text.contains("it is no gRPC listener"), "{text}");
        // A server's own answer is left as it is.
        let e = ClientError::from_call(
            "http://h:1",
            tonic::Status::not_found("queue \"x\" not found"),
        );
        assert_eq!(e.to_string(), "NOT_FOUND: queue \"x\" not found");
    }
}
