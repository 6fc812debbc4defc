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

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

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

/// The cap and the handshake deadline, shared by the server's listeners.
#[derive(Debug)]
pub(crate) struct Gate {
    permits: Arc<Semaphore>,
    handshake: Duration,
    max: usize,
    refused: AtomicU64,
}

impl Gate {
    pub(crate) fn new(max: usize, handshake: Duration) -> Arc<Gate> {
        Arc::new(Gate {
            permits: Arc::new(Semaphore::new(max)),
            handshake,
            max,
            refused: AtomicU64::new(0),
        })
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
    pub(crate) async fn accept(&self, listener: &TcpListener) -> (Conn, SocketAddr) {
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
            return (Conn::new(tcp, permit, self.handshake, peer), peer);
        }
    }
}

/// The gRPC listener's connections, for tonic.
pub(crate) fn incoming(
    listener: TcpListener,
    gate: Arc<Gate>,
) -> impl futures_util::Stream<Item = io::Result<Conn>> + Send + 'static {
    futures_util::stream::unfold((listener, gate), |(listener, gate)| async move {
        let (conn, _) = gate.accept(&listener).await;
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

impl axum::serve::Listener for GatedListener {
    type Io = Conn;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl Future<Output = (Conn, SocketAddr)> + Send {
        self.gate.accept(&self.listener)
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
            this.received += buf.filled().len() - before;
            if this.received >= HANDSHAKE_BYTES {
                this.deadline = None;
            }
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
        r
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
