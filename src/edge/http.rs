//! The HTTP listeners (the Anypoint REST facade, the web console,
//! metrics): connections accepted under the gate (`super::conns`), TLS
//! handshakes run concurrently, and each connection served by hyper with a
//! deadline for every request head that trickling cannot extend
//! (`header_read_timeout`: from the end of the previous answer, or for the
//! first request the handshake deadline from the moment of connecting).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tonic::codegen::Service;

use super::conns::{Calls, Conn, Door, Gate};

/// The peer address of an HTTP connection, for handlers
/// (`ConnectInfo<Peer>`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) SocketAddr);

/// An HTTP listener under the gate, plain or TLS.
///
/// With TLS, a task accepts connections under the gate and runs each
/// handshake on a task of its own (bounded by the handshake timeout), so
/// that a slow or silent client never holds up the others; finished
/// handshakes are handed to [`GatedListener::accept`]. The connection is
/// counted by the gate from the moment it is accepted.
pub(crate) struct GatedListener {
    /// The deadline of each request head.
    header: Duration,
    /// What a gRPC call made here is answered.
    not_grpc: NotGrpc,
    accepting: Accepting,
}

/// What an HTTP listener answers a gRPC call (a client pointed at the
/// wrong port): a gRPC status, `UNIMPLEMENTED`, saying which listener
/// this is and where gRPC is, so that the client shows words instead of
/// failing to decode a web page.
#[derive(Debug, Clone)]
pub(crate) struct NotGrpc {
    /// The status message, percent-encoded as `grpc-message` wants it.
    message: Arc<str>,
}

impl NotGrpc {
    /// For the listener named `listener` (`console`, `REST`, ...) of a
    /// server whose gRPC is at `grpc_url`.
    pub(crate) fn new(listener: &str, grpc_url: &str) -> NotGrpc {
        let text = format!(
            "this is Letterbox's {listener} listener (HTTP), not its gRPC one: gRPC is at {grpc_url}"
        );
        // gRPC's rule: bytes outside 0x20..=0x7E, and '%', as %XX.
        let mut message = String::with_capacity(text.len());
        for b in text.bytes() {
            if (0x20..=0x7e).contains(&b) && b != b'%' {
                message.push(char::from(b));
            } else {
                message.push_str(&format!("%{b:02X}"));
            }
        }
        NotGrpc {
            message: message.into(),
        }
    }

    /// The answer to a request that is a gRPC call (its content type is
    /// `application/grpc...`), else `None`.
    fn answer<B>(&self, req: &axum::http::Request<B>) -> Option<axum::response::Response> {
        let grpc = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !grpc {
            return None;
        }
        let mut resp = axum::response::Response::new(axum::body::Body::empty());
        let headers = resp.headers_mut();
        headers.insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/grpc"),
        );
        // 12: UNIMPLEMENTED, what a gRPC server answers a method it lacks.
        headers.insert("grpc-status", axum::http::HeaderValue::from_static("12"));
        if let Ok(v) = axum::http::HeaderValue::from_str(&self.message) {
            headers.insert("grpc-message", v);
        }
        Some(resp)
    }
}

enum Accepting {
    Plain {
        listener: TcpListener,
        gate: Arc<Gate>,
        door: Door,
    },
    Tls {
        ready: tokio::sync::mpsc::Receiver<(HttpConn, SocketAddr)>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl GatedListener {
    /// The plain listener `door` on `listener`.
    pub(crate) fn new(
        listener: TcpListener,
        gate: Arc<Gate>,
        door: Door,
        not_grpc: NotGrpc,
    ) -> GatedListener {
        GatedListener {
            header: gate.header_timeout(),
            not_grpc,
            accepting: Accepting::Plain {
                listener,
                gate,
                door,
            },
        }
    }

    /// A listener whose connections are TLS, with `acceptor`'s settings.
    pub(crate) fn tls(
        listener: TcpListener,
        gate: Arc<Gate>,
        door: Door,
        acceptor: tokio_rustls::TlsAcceptor,
        not_grpc: NotGrpc,
    ) -> GatedListener {
        let header = gate.header_timeout();
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let task = tokio::spawn(tls_handshakes(listener, gate, door, acceptor, tx));
        GatedListener {
            header,
            not_grpc,
            accepting: Accepting::Tls { ready, task },
        }
    }

    /// The next connection (past its TLS handshake, with TLS).
    async fn accept(&mut self) -> (HttpConn, SocketAddr) {
        match &mut self.accepting {
            Accepting::Plain {
                listener,
                gate,
                door,
            } => {
                let (conn, peer) = gate.accept(*door, listener).await;
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
    door: Door,
    acceptor: tokio_rustls::TlsAcceptor,
    tx: tokio::sync::mpsc::Sender<(HttpConn, SocketAddr)>,
) {
    let mut handshakes = tokio::task::JoinSet::new();
    let limit = gate.handshake_timeout();
    loop {
        tokio::select! {
            (conn, peer) = gate.accept(door, &listener) => {
                let acceptor = acceptor.clone();
                let tx = tx.clone();
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

/// Serves `app` on `listener` until `shutdown` resolves, then finishes
/// the requests in flight: each connection is closed once its answer is
/// sent. Handlers find the client's address as `ConnectInfo<Peer>`.
///
/// Each connection is served by hyper (HTTP/1, or HTTP/2 with prior
/// knowledge); an HTTP/1 request head must arrive whole within the header
/// timeout (a keep-alive connection waiting for its next request is
/// closed then too). A connection becomes a client's with its first
/// request, which tells its [`Conn`] to drop the handshake deadline. A
/// gRPC call made here is answered with a status that names this listener
/// and where gRPC is ([`NotGrpc`]).
pub(crate) async fn serve(
    mut listener: GatedListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let connections = tokio_util::task::TaskTracker::new();
    let stop = tokio_util::sync::CancellationToken::new();
    let header = listener.header;
    let not_grpc = listener.not_grpc.clone();
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            c = listener.accept() => c,
            () = &mut shutdown => break,
        };
        let calls = io.calls();
        let app = app.clone();
        let not_grpc = not_grpc.clone();
        let service = hyper::service::service_fn(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                calls.arrived();
                if let Some(answer) = not_grpc.answer(&req) {
                    return futures_util::future::Either::Left(std::future::ready(Ok(answer)));
                }
                req.extensions_mut().insert(ConnectInfo(Peer(peer)));
                futures_util::future::Either::Right(app.clone().call(req))
            },
        );
        let stop = stop.clone();
        connections.spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header);
            builder.http2().timer(TokioTimer::new());
            let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
            let served = tokio::select! {
                r = conn.as_mut() => r,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(peer = %peer, error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    stop.cancel();
    connections.close();
    connections.wait().await;
}

/// An HTTP connection: plain or TLS, over an accepted [`Conn`].
pub(crate) enum HttpConn {
    Plain(Conn),
    Tls(Box<tokio_rustls::server::TlsStream<Conn>>),
}

impl HttpConn {
    /// The requests of the connection.
    fn calls(&self) -> Arc<Calls> {
        match self {
            HttpConn::Plain(c) => c.calls(),
            HttpConn::Tls(c) => c.get_ref().0.calls(),
        }
    }
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
