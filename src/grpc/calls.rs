//! The calls of the gRPC connections: [`CallsLayer`] counts the calls
//! open on each connection (a connection becomes a client's with its
//! first call, and is idle with none open: see `crate::edge::conns`),
//! and counts and times every call by method and status code
//! ([`RpcStats`], which the metrics endpoint serves).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tonic::codegen::{Body as HttpBody, Bytes, Service, http};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::edge::conns::{Calls, Gate};

/// Counts the calls open on each gRPC connection (see [`Gate`]), and
/// counts and times every call by method and status code (see
/// [`RpcStats`]).
#[derive(Debug, Clone)]
pub(crate) struct CallsLayer {
    gate: Arc<Gate>,
    rpc: Arc<RpcStats>,
    /// The server's deadline for unary calls.
    timeout: Duration,
}

impl CallsLayer {
    pub(crate) fn new(gate: Arc<Gate>, rpc: Arc<RpcStats>, timeout: Duration) -> CallsLayer {
        CallsLayer { gate, rpc, timeout }
    }
}

impl<S> tower_layer::Layer<S> for CallsLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            gate: Arc::clone(&self.gate),
            rpc: Arc::clone(&self.rpc),
            timeout: self.timeout,
        }
    }
}

/// A service whose calls hold their connection busy until their response
/// body ends (a stream's, when the stream does), and are counted and
/// timed when it does.
#[derive(Debug, Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    gate: Arc<Gate>,
    rpc: Arc<RpcStats>,
    timeout: Duration,
}

/// One call open on a connection; ends when dropped.
pub(crate) struct Open(Option<Arc<Calls>>);

impl Open {
    fn begin(calls: Option<Arc<Calls>>) -> Open {
        if let Some(c) = &calls {
            c.begin();
        }
        Open(calls)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.end();
        }
    }
}

/// The count and time of one call, recorded once: when its response's
/// trailers (or its trailers-only headers) have been sent, or when it is
/// dropped before that. A call dropped before its answer counts as
/// DEADLINE_EXCEEDED past its deadline and CANCELLED otherwise (the
/// client went away); one dropped in the middle of its response (a
/// stream the client closed) counts as CANCELLED.
struct Outcome {
    rpc: Arc<RpcStats>,
    method: &'static str,
    started: std::time::Instant,
    /// Until the response headers: when the call's time runs out.
    deadline: Option<std::time::Instant>,
    /// The status, once known.
    code: Option<&'static str>,
    recorded: bool,
}

impl Outcome {
    fn record(&mut self, code: &'static str) {
        if !self.recorded {
            self.recorded = true;
            self.rpc.record(self.method, code, self.started.elapsed());
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        let code = match (self.code, self.deadline) {
            (Some(c), _) => c,
            (None, Some(d)) if std::time::Instant::now() >= d => "DEADLINE_EXCEEDED",
            (None, _) => "CANCELLED",
        };
        self.record(code);
    }
}

/// The client's `grpc-timeout` header, if any and valid.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl<S, B, Req> Service<http::Request<Req>> for Counted<S>
where
    S: Service<http::Request<Req>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<OpenBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Req>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .or_else(|| {
                req.extensions()
                    .get::<TlsConnectInfo<TcpConnectInfo>>()
                    .and_then(|i| i.get_ref().remote_addr())
            });
        let calls = peer.and_then(|p| self.gate.calls_of(p));
        let open = Open::begin(calls);
        let started = std::time::Instant::now();
        // The deadline tonic enforces outside this layer began a moment
        // before this call: a few milliseconds of slack tell a timeout
        // from a client leaving just before it.
        let limit = grpc_timeout(req.headers())
            .map_or(self.timeout, |t| t.min(self.timeout))
            .saturating_sub(Duration::from_millis(5));
        let mut outcome = Outcome {
            rpc: Arc::clone(&self.rpc),
            method: RpcStats::method(req.uri().path()),
            started,
            deadline: started.checked_add(limit),
            code: None,
            recorded: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await;
            outcome.deadline = None;
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    outcome.record("UNKNOWN");
                    return Err(e);
                }
            };
            // A trailers-only response (most errors) carries its status in
            // its headers.
            outcome.code = resp
                .headers()
                .get("grpc-status")
                .map(|v| code_name(v.as_bytes()));
            Ok(resp.map(|body| OpenBody {
                body: Box::pin(body),
                _open: open,
                outcome,
            }))
        })
    }
}

/// A response body that keeps its call counted as open until it ends,
/// and records the call's status from its trailers.
pub(crate) struct OpenBody<B> {
    body: Pin<Box<B>>,
    _open: Open,
    outcome: Outcome,
}

impl<B: HttpBody<Data = Bytes>> HttpBody for OpenBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let r = self.body.as_mut().poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(status) = frame.trailers_ref().and_then(|t| t.get("grpc-status")) {
                    let code = code_name(status.as_bytes());
                    self.outcome.code = Some(code);
                    self.outcome.record(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.outcome.record("UNKNOWN"),
            Poll::Ready(None) => {
                let code = self.outcome.code.unwrap_or("UNKNOWN");
                self.outcome.record(code);
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The gRPC status names, by code (`grpc-status` values 0 to 16).
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The name of a `grpc-status` value ("UNKNOWN" for what is not one).
pub(crate) fn code_name(status: &[u8]) -> &'static str {
    std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .and_then(|i| CODE_NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

/// The paths (`/Service/Method`) of every method the server serves: ours,
/// health and reflection. Calls to any other path are counted under the
/// method `unknown`, so that callers cannot make up label values.
static METHODS: LazyLock<HashSet<String>> = LazyLock::new(|| {
    use prost::Message;
    let mut out = HashSet::new();
    for set in [
        crate::pb::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ] {
        let Ok(set) = prost_types::FileDescriptorSet::decode(set) else {
            continue;
        };
        for file in set.file {
            let package = file.package.unwrap_or_default();
            for service in file.service {
                let service_name = service.name.unwrap_or_default();
                for m in service.method {
                    let method = m.name.unwrap_or_default();
                    out.insert(format!("/{package}.{service_name}/{method}"));
                }
            }
        }
    }
    out
});

type MethodLabel = [(&'static str, &'static str); 1];
type CallLabels = [(&'static str, &'static str); 2];

fn call_duration() -> Histogram {
    // 0.5 ms to about 16 s; longer calls (streams) land in +Inf.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Counts and times the gRPC calls as they end.
#[derive(Debug)]
pub(crate) struct RpcStats {
    requests: Family<CallLabels, Counter>,
    duration: Family<MethodLabel, Histogram, fn() -> Histogram>,
}

impl RpcStats {
    pub(crate) fn new() -> Arc<RpcStats> {
        Arc::new(RpcStats {
            requests: Family::default(),
            duration: Family::new_with_constructor(call_duration),
        })
    }

    /// The method label of a request path: `Service/Method` for a method
    /// the server serves, else `unknown`.
    pub(crate) fn method(path: &str) -> &'static str {
        match METHODS.get(path) {
            Some(p) => &p[1..],
            None => "unknown",
        }
    }

    /// One call ended with `code` after `took`.
    pub(crate) fn record(&self, method: &'static str, code: &'static str, took: Duration) {
        self.requests
            .get_or_create(&[("method", method), ("code", code)])
            .inc();
        self.duration
            .get_or_create(&[("method", method)])
            .observe(took.as_secs_f64());
    }

    /// Registers the counts and times with the metrics endpoint's
    /// registry.
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "letterbox_grpc_requests",
            "gRPC calls ended, by method (Service/Method) and status code (OK, NOT_FOUND, ...); a call stopped before it answered counts as CANCELLED, or DEADLINE_EXCEEDED past its deadline",
            self.requests.clone(),
        );
        r.register(
            "letterbox_grpc_request_duration_seconds",
            "Time from a gRPC request to the end of its response (for a stream, the stream's whole life)",
            self.duration.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_deadline_is_read_from_grpc_timeout() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            h
        };
        assert_eq!(
            grpc_timeout(&with("250m")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(grpc_timeout(&with("2S")), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(&with("1H")), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(&with("7u")), Some(Duration::from_micros(7)));
        assert_eq!(grpc_timeout(&with("5x")), None);
        assert_eq!(grpc_timeout(&with("m")), None);
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn status_codes_have_their_names() {
        assert_eq!(code_name(b"0"), "OK");
        assert_eq!(code_name(b"5"), "NOT_FOUND");
        assert_eq!(code_name(b"16"), "UNAUTHENTICATED");
        assert_eq!(code_name(b"17"), "UNKNOWN");
        assert_eq!(code_name(b"x"), "UNKNOWN");
    }

    #[test]
    fn methods_are_the_served_ones_or_unknown() {
        assert_eq!(
            RpcStats::method("/letterbox.v1.MessagingService/Publish"),
            "letterbox.v1.MessagingService/Publish"
        );
        assert_eq!(
            RpcStats::method("/letterbox.v1.AdminService/GetQueue"),
            "letterbox.v1.AdminService/GetQueue"
        );
        assert_eq!(
            RpcStats::method("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
        assert_eq!(
            RpcStats::method("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        );
        assert_eq!(
            RpcStats::method("/letterbox.v1.MessagingService/Made-Up"),
            "unknown"
        );
        assert_eq!(RpcStats::method("/"), "unknown");
    }
}
