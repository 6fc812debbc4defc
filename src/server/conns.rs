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

/// A listener for axum under the gate.
pub(crate) struct GatedListener {
    listener: TcpListener,
    gate: Arc<Gate>,
}

impl GatedListener {
    pub(crate) fn new(listener: TcpListener, gate: Arc<Gate>) -> GatedListener {
        GatedListener { listener, gate }
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
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        self.gate.accept(&self.listener).await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
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

/// Counts the calls open on each gRPC connection (see [`Gate`]).
#[derive(Debug, Clone)]
pub(crate) struct CallsLayer {
    gate: Arc<Gate>,
}

impl CallsLayer {
    pub(crate) fn new(gate: Arc<Gate>) -> CallsLayer {
        CallsLayer { gate }
    }
}

impl<S> tower_layer::Layer<S> for CallsLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            gate: Arc::clone(&self.gate),
        }
    }
}

/// A service whose calls hold their connection busy until their response
/// body ends (a stream's, when the stream does).
#[derive(Debug, Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    gate: Arc<Gate>,
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
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| OpenBody {
                body: Box::pin(body),
                _open: open,
            }))
        })
    }
}

/// A response body that keeps its call counted as open until it ends.
pub(crate) struct OpenBody<B> {
    body: Pin<Box<B>>,
    _open: Open,
}

impl<B: HttpBody<Data = Bytes>> HttpBody for OpenBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        self.body.as_mut().poll_frame(cx)
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
}
