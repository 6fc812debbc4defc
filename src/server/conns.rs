//! Connections: one cap on how many are open at once across the server's
//! listeners (gRPC, the Anypoint REST facade, metrics), and a deadline for
//! a new connection's first bytes (the HTTP/2 client preface, a TLS
//! ClientHello or an HTTP/1 request line), so that sockets that connect
//! and say nothing cannot use up the process's file descriptors: the
//! storage needs some of them to checkpoint, and a checkpoint that fails
//! stops the server.
//!
//! At start the server raises its soft limit of open files to the hard
//! limit, and by default lets connections take all but a reserve of it
//! (`max_connections`). A connection over the cap is accepted and closed
//! at once (the client sees the connection reset), so that the listen
//! backlog never fills with them.
//!
//! An HTTP/1 connection (REST, metrics) that sends nothing for the idle
//! timeout is closed; so is a gRPC connection with no call open for it
//! (its client reconnects when it calls again). The calls open on each
//! connection are counted by [`CallsLayer`], which finds the connection by
//! its peer address; a long poll or a subscription keeps its connection
//! busy for as long as it runs.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::codegen::{Body as HttpBody, Bytes, Service, http};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use super::metrics::{RpcStats, code_name};

/// Bytes a new connection must send within the handshake deadline: the
/// HTTP/2 client preface is 24 bytes; a TLS ClientHello and an HTTP/1
/// request line are longer.
const HANDSHAKE_BYTES: usize = 24;

/// File descriptors kept for the storage, logs and the rest when the cap
/// is derived from the limit of open files: at least this many, or a
/// quarter of the limit.
const FD_RESERVE: u64 = 256;
/// Largest cap derived from the limit of open files.
const MAX_DERIVED: u64 = 10_000;

/// Raises the soft limit of open files to the hard limit and returns it
/// (`None` when it cannot be read).
pub(crate) fn raise_open_files() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let r = getrlimit(Resource::Nofile);
    if r.maximum != r.current
        && setrlimit(
            Resource::Nofile,
            Rlimit {
                current: r.maximum,
                maximum: r.maximum,
            },
        )
        .is_err()
    {
        return r.current;
    }
    r.maximum.or(r.current)
}

/// The cap on open connections derived from the limit of open files:
/// all but a reserve (a quarter, at least 256) for the storage, at most
/// 10,000, at least 16.
pub(crate) fn derived_cap(open_files: Option<u64>) -> usize {
    let limit = open_files.unwrap_or(1024);
    let cap = limit
        .saturating_sub(FD_RESERVE.max(limit / 4))
        .clamp(16, MAX_DERIVED);
    usize::try_from(cap).unwrap_or(16)
}

/// The cap, the handshake deadline and the idle timeout, shared by the
/// server's listeners.
#[derive(Debug)]
pub(crate) struct Gate {
    permits: Arc<Semaphore>,
    handshake: Duration,
    /// After this long with no call open, a gRPC connection is closed.
    idle: Duration,
    max: usize,
    refused: AtomicU64,
    /// The gRPC connections open, by peer address, with their calls.
    conns: Mutex<HashMap<SocketAddr, Arc<Calls>>>,
    /// The gRPC listener serves TLS: a connection closed before its first
    /// call is logged (at debug) as a failed handshake, with its peer.
    tls: std::sync::atomic::AtomicBool,
}

/// What a connection is doing, as its calls begin and end.
#[derive(Debug)]
pub(crate) struct Calls {
    open: AtomicUsize,
    /// Calls ever begun on the connection.
    seen: AtomicU64,
    /// When the last call began or ended.
    last: Mutex<Instant>,
}

impl Calls {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_since(&self) -> Option<Instant> {
        (self.open.load(Ordering::SeqCst) == 0)
            .then(|| *self.last.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Gate {
    pub(crate) fn new(max: usize, handshake: Duration, idle: Duration) -> Arc<Gate> {
        Arc::new(Gate {
            permits: Arc::new(Semaphore::new(max)),
            handshake,
            idle,
            max,
            refused: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            tls: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Tells the gate that the gRPC listener serves TLS.
    pub(crate) fn set_tls(&self) {
        self.tls.store(true, Ordering::Relaxed);
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<Calls>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.max.saturating_sub(self.permits.available_permits())
    }

    /// Connections closed at once because the cap was reached.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The next connection that fits under the cap. Errors of `accept`
    /// itself (out of file descriptors, a connection reset before it was
    /// accepted) are logged and waited out, never returned: a listener
    /// must go on.
    pub(crate) async fn accept(self: &Arc<Self>, listener: &TcpListener) -> (Conn, SocketAddr) {
        self.accept_with(listener, false).await
    }

    /// [`Gate::accept`] for gRPC: the connection is registered so that its
    /// calls are counted, and closed after the idle timeout without one.
    async fn accept_grpc(self: &Arc<Self>, listener: &TcpListener) -> (Conn, SocketAddr) {
        self.accept_with(listener, true).await
    }

    async fn accept_with(
        self: &Arc<Self>,
        listener: &TcpListener,
        grpc: bool,
    ) -> (Conn, SocketAddr) {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                let n = self.refused.fetch_add(1, Ordering::Relaxed);
                if n.is_power_of_two() || n == 0 {
                    tracing::warn!(peer = %peer, max = self.max, refused = n + 1,
                        "connection refused: the server holds --max-connections connections");
                }
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let mut conn = Conn::new(tcp, permit, self.handshake, peer);
            if !grpc {
                conn.quiet = Some((self.idle, Box::pin(tokio::time::sleep(self.idle))));
            } else {
                let calls = Arc::new(Calls {
                    open: AtomicUsize::new(0),
                    seen: AtomicU64::new(0),
                    last: Mutex::new(Instant::now()),
                });
                self.conns().insert(peer, Arc::clone(&calls));
                conn.idle = Some(Idle {
                    calls,
                    after: self.idle,
                    gate: Arc::clone(self),
                    timer: Box::pin(tokio::time::sleep(self.idle)),
                });
            }
            return (conn, peer);
        }
    }
}

/// The gRPC listener's connections, for tonic.
pub(crate) fn incoming(
    listener: TcpListener,
    gate: Arc<Gate>,
) -> impl futures_util::Stream<Item = io::Result<Conn>> + Send + 'static {
    futures_util::stream::unfold((listener, gate), |(listener, gate)| async move {
        let (conn, _) = gate.accept_grpc(&listener).await;
        Some((Ok(conn), (listener, gate)))
    })
}

/// A listener for axum under the gate, plain or TLS.
///
/// With TLS, a task accepts connections under the gate and runs each
/// handshake on a task of its own (bounded by the handshake timeout), so
/// that a slow or silent client never holds up the others; finished
/// handshakes are handed to [`accept`](axum::serve::Listener::accept).
/// The connection is counted by the gate from the moment it is accepted.
pub(crate) struct GatedListener {
    local: io::Result<SocketAddr>,
    accepting: Accepting,
}

enum Accepting {
    Plain {
        listener: TcpListener,
        gate: Arc<Gate>,
    },
    Tls {
        ready: tokio::sync::mpsc::Receiver<(HttpConn, SocketAddr)>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl GatedListener {
    pub(crate) fn new(listener: TcpListener, gate: Arc<Gate>) -> GatedListener {
        GatedListener {
            local: listener.local_addr(),
            accepting: Accepting::Plain { listener, gate },
        }
    }

    /// A listener whose connections are TLS, with `acceptor`'s settings.
    pub(crate) fn tls(
        listener: TcpListener,
        gate: Arc<Gate>,
        acceptor: tokio_rustls::TlsAcceptor,
    ) -> GatedListener {
        let local = listener.local_addr();
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let task = tokio::spawn(tls_handshakes(listener, gate, acceptor, tx));
        GatedListener {
            local,
            accepting: Accepting::Tls { ready, task },
        }
    }
}

impl Drop for GatedListener {
    fn drop(&mut self) {
        if let Accepting::Tls { task, .. } = &self.accepting {
            // Handshakes still running end with it.
            task.abort();
        }
    }
}

/// Accepts under the gate and runs the TLS handshakes concurrently, each
/// within the handshake timeout; sends the finished ones to `tx`.
async fn tls_handshakes(
    listener: TcpListener,
    gate: Arc<Gate>,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: tokio::sync::mpsc::Sender<(HttpConn, SocketAddr)>,
) {
    let mut handshakes = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            (conn, peer) = gate.accept(&listener) => {
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let limit = gate.handshake;
                handshakes.spawn(async move {
                    match tokio::time::timeout(limit, acceptor.accept(conn)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((HttpConn::Tls(Box::new(tls)), peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => {
                            tracing::debug!(peer = %peer, "TLS handshake not finished within the handshake timeout");
                        }
                    }
                });
            }
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            () = tx.closed() => return,
        }
    }
}

/// The peer address of an HTTP connection, for handlers
/// (`ConnectInfo<Peer>`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, GatedListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, GatedListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

impl axum::serve::Listener for GatedListener {
    type Io = HttpConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (HttpConn, SocketAddr) {
        match &mut self.accepting {
            Accepting::Plain { listener, gate } => {
                let (conn, peer) = gate.accept(listener).await;
                (HttpConn::Plain(conn), peer)
            }
            Accepting::Tls { ready, .. } => match ready.recv().await {
                Some(c) => c,
                // The accepting task ended (it never does on its own
                // while this listener lives): accept nothing more.
                None => std::future::pending().await,
            },
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }
}

/// An HTTP connection: plain or TLS, over an accepted [`Conn`].
pub(crate) enum HttpConn {
    Plain(Conn),
    Tls(Box<tokio_rustls::server::TlsStream<Conn>>),
}

impl AsyncRead for HttpConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            HttpConn::Plain(c) => Pin::new(c).poll_read(cx, buf),
            HttpConn::Tls(c) => Pin::new(c.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for HttpConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            HttpConn::Plain(c) => Pin::new(c).poll_write(cx, buf),
            HttpConn::Tls(c) => Pin::new(c.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            HttpConn::Plain(c) => Pin::new(c).poll_write_vectored(cx, bufs),
            HttpConn::Tls(c) => Pin::new(c.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            HttpConn::Plain(c) => c.is_write_vectored(),
            HttpConn::Tls(c) => c.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            HttpConn::Plain(c) => Pin::new(c).poll_flush(cx),
            HttpConn::Tls(c) => Pin::new(c.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            HttpConn::Plain(c) => Pin::new(c).poll_shutdown(cx),
            HttpConn::Tls(c) => Pin::new(c.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An accepted connection: holds its place under the cap until it is
/// closed, and fails its reads once the handshake deadline passes with
/// fewer than [`HANDSHAKE_BYTES`] received.
pub(crate) struct Conn {
    tcp: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Until the first bytes have arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    received: usize,
    peer: SocketAddr,
    /// gRPC: its calls, watched for idleness.
    idle: Option<Idle>,
    /// HTTP/1: closed after this long without a byte received.
    quiet: Option<(Duration, Pin<Box<Sleep>>)>,
}

/// The idle watch of a gRPC connection.
struct Idle {
    calls: Arc<Calls>,
    after: Duration,
    gate: Arc<Gate>,
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    fn new(
        tcp: TcpStream,
        permit: OwnedSemaphorePermit,
        handshake: Duration,
        peer: SocketAddr,
    ) -> Conn {
        Conn {
            tcp,
            _permit: permit,
            deadline: Some(Box::pin(tokio::time::sleep(handshake))),
            received: 0,
            peer,
            idle: None,
            quiet: None,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(i) = &self.idle {
            if i.gate.tls.load(Ordering::Relaxed) && i.calls.seen.load(Ordering::Relaxed) == 0 {
                tracing::debug!(peer = %self.peer, received = self.received,
                    "TLS connection closed before its first call: the TLS handshake failed (see the tls accept error above) or the client left");
            }
            let mut conns = i.gate.conns();
            if conns
                .get(&self.peer)
                .is_some_and(|c| Arc::ptr_eq(c, &i.calls))
            {
                conns.remove(&self.peer);
            }
        }
    }
}

impl Idle {
    /// True once the connection has had no call open for `after`; else
    /// arms the timer for the earliest moment it could be.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = match self.calls.idle_since() {
                Some(since) if since + self.after <= Instant::now() => return true,
                Some(since) => since + self.after,
                None => Instant::now() + self.after,
            };
            self.timer.as_mut().reset(due);
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let r = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let n = buf.filled().len() - before;
            this.received += n;
            if this.received >= HANDSHAKE_BYTES {
                this.deadline = None;
            }
            if n > 0
                && let Some((after, timer)) = this.quiet.as_mut()
            {
                timer.as_mut().reset(Instant::now() + *after);
            }
        }
        if r.is_pending()
            && let Some((_, timer)) = this.quiet.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            tracing::debug!(peer = %this.peer, "closing a connection that sent nothing for the idle timeout");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection sent nothing for the idle timeout",
            )));
        }
        if r.is_pending()
            && let Some(d) = this.deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            tracing::debug!(peer = %this.peer, received = this.received,
                "closing a connection that did not finish its handshake in time");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection did not finish its handshake in time",
            )));
        }
        if r.is_pending()
            && let Some(idle) = this.idle.as_mut()
            && idle.expired(cx)
        {
            tracing::debug!(peer = %this.peer, "closing a connection idle for the idle timeout");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection was idle for the idle timeout",
            )));
        }
        r
    }
}

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
            c.open.fetch_add(1, Ordering::SeqCst);
            c.seen.fetch_add(1, Ordering::Relaxed);
            c.touch();
        }
        Open(calls)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.touch();
            c.open.fetch_sub(1, Ordering::SeqCst);
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
        let calls = peer.and_then(|p| self.gate.conns().get(&p).cloned());
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

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_cap_keeps_a_reserve_of_descriptors() {
        assert_eq!(derived_cap(Some(1024)), 768);
        assert_eq!(derived_cap(Some(4096)), 3072);
        assert_eq!(derived_cap(Some(1 << 20)), 10_000);
        assert_eq!(derived_cap(Some(100)), 16);
        assert_eq!(derived_cap(None), 768);
    }

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
}
