//! Connections: caps on how many are open at once, and deadlines for what
//! a connection must send, so that clients that connect and say nothing,
//! or trickle their requests a byte at a time, can neither use up the
//! process's file descriptors (the storage needs some of them to
//! checkpoint, and a checkpoint that fails stops the server) nor lock the
//! other clients out.
//!
//! The caps, checked as a connection is accepted (one over a cap is
//! accepted and closed at once: its client sees the connection reset, and
//! the listen backlog never fills with them):
//! - the listeners together (gRPC, the Anypoint REST facade, the console,
//!   metrics) hold at most `max_connections`: by default all but a reserve
//!   of the open files the process may have (the soft limit is raised to
//!   the hard one at start);
//! - one peer address holds at most `max_connections_per_address` of
//!   them, over all listeners (a quarter of the cap by default);
//! - each listener keeps `listener_reserve` of them that the others cannot
//!   take (by default half the cap, in equal parts); the rest is shared.
//!
//! The deadlines:
//! - a new connection must have made its first request (HTTP/2: opened
//!   its first stream; with TLS, after its handshake) within the handshake
//!   timeout, however many bytes it sends meanwhile;
//! - on the HTTP listeners every request head must arrive whole within the
//!   header timeout (hyper's, see `super::http`);
//! - an HTTP/1 connection that sends nothing for the idle timeout is
//!   closed; so is a gRPC connection with no call open for it (its client
//!   reconnects when it calls again). The calls open on each gRPC
//!   connection are counted by the gRPC front end's layer, which finds
//!   the connection by its peer address ([`Gate::calls_of`]); a long poll
//!   or a subscription keeps its connection busy for as long as it runs.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Limits on connections and requests (message sizes, batch sizes and
/// name lengths are the engine's, see `BrokerOptions` and `validate`).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most concurrent HTTP/2 streams (calls) per connection.
    pub max_concurrent_streams: u32,
    /// Most calls one connection has served at once; more wait.
    pub concurrency_per_connection: usize,
    /// Longest time a unary call may take, long polls included (a client's
    /// shorter `grpc-timeout` wins). Streams are not cut.
    pub request_timeout: Duration,
    /// Most connections open at once, over all listeners; `None`: all but
    /// a reserve of the open files the process may have (its soft limit
    /// is raised to the hard one at start).
    pub max_connections: Option<usize>,
    /// Most connections open at once from one peer address, over all
    /// listeners; `None`: a quarter of [`Limits::max_connections`].
    pub max_connections_per_address: Option<usize>,
    /// Connections each listener (gRPC, REST, console, metrics) keeps for
    /// itself, which the others cannot take; `None`: half of
    /// [`Limits::max_connections`], in equal parts.
    pub listener_reserve: Option<usize>,
    /// How long a new connection may take to make its first request (an
    /// HTTP/1 request, or the first stream of an HTTP/2 connection: a
    /// gRPC call), TLS handshake included, whatever it sends meanwhile.
    pub handshake_timeout: Duration,
    /// How long an HTTP/1 request head (REST, console, metrics) may take
    /// to arrive whole after the previous answer; a keep-alive connection
    /// waiting for its next request is closed then too.
    pub header_timeout: Duration,
    /// After this long with no call open, a gRPC connection is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrent_streams: 1024,
            concurrency_per_connection: 1024,
            request_timeout: Duration::from_secs(60),
            max_connections: None,
            max_connections_per_address: None,
            listener_reserve: None,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

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

/// The caps in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Connections over all listeners.
    pub(crate) max: usize,
    /// Connections from one peer address, over all listeners.
    pub(crate) per_address: usize,
    /// Connections each listener keeps for itself.
    pub(crate) reserve: usize,
}

/// The caps of `limits` with `listeners` listeners on, the ones not set
/// derived: the cap from the limit of open files (see [`derived_cap`]),
/// a quarter of it per address, half of it kept by the listeners in equal
/// parts. An error names the setting that does not fit.
pub(crate) fn caps(
    limits: &Limits,
    open_files: Option<u64>,
    listeners: usize,
) -> Result<Caps, String> {
    let max = limits
        .max_connections
        .unwrap_or_else(|| derived_cap(open_files));
    let n = listeners.max(1);
    let per_address = limits.max_connections_per_address.unwrap_or(max / 4).max(1);
    let reserve = match limits.listener_reserve {
        Some(r) if r.saturating_mul(n) > max => {
            return Err(format!(
                "--listener-reserve {r}: the {n} listeners would keep {} connections, more than the {max} of --max-connections (at most {} each fits)",
                r.saturating_mul(n),
                max / n
            ));
        }
        Some(r) => r,
        None => max / (2 * n),
    };
    Ok(Caps {
        max,
        per_address,
        reserve,
    })
}

/// How a listener's open connections are watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// gRPC: a connection is registered so that its calls are counted (by
    /// the gRPC front end's layer, see [`Gate::calls_of`]), and is idle
    /// while none is open.
    Grpc,
    /// HTTP served by `super::http::serve`: a connection is idle while it
    /// sends nothing.
    Http,
}

/// A listener that shares the caps: its place among them, its name in
/// the logs, and how its connections are watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Door {
    index: usize,
    name: &'static str,
    protocol: Protocol,
}

impl Door {
    /// Its name in the logs (`gRPC`, `REST`, `console`, `metrics`).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}

/// The listeners that share the caps, as they are added.
#[derive(Debug, Default)]
pub(crate) struct Doors(Vec<Door>);

impl Doors {
    /// A listener named `name` (in the logs) speaking `protocol`.
    pub(crate) fn add(&mut self, name: &'static str, protocol: Protocol) -> Door {
        let door = Door {
            index: self.0.len(),
            name,
            protocol,
        };
        self.0.push(door);
        door
    }

    /// How many there are.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Its address holds its cap.
    Address,
    /// Its listener's reserve and the shared connections are taken.
    Full,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The caps, the deadlines and the connections open, shared by the
/// server's listeners.
#[derive(Debug)]
pub(crate) struct Gate {
    caps: Caps,
    /// The connections beyond the listeners' reserves.
    shared: Arc<Semaphore>,
    /// Each listener's reserve, by its [`Door`]'s index.
    reserves: Vec<Arc<Semaphore>>,
    /// Connections open, by peer address.
    addresses: Mutex<HashMap<IpAddr, usize>>,
    open: AtomicUsize,
    refused: AtomicU64,
    handshake: Duration,
    header: Duration,
    /// After this long with no call open, a gRPC connection is closed.
    idle: Duration,
    /// The gRPC connections open, by peer address, with their calls.
    conns: Mutex<HashMap<SocketAddr, Arc<Calls>>>,
    /// The gRPC listener serves TLS: a connection closed before its first
    /// call is logged (at debug) as a failed handshake, with its peer.
    tls: AtomicBool,
}

/// What a connection is doing, as its requests (gRPC: calls) begin and
/// end.
#[derive(Debug)]
pub(crate) struct Calls {
    open: AtomicUsize,
    /// Requests ever begun on the connection.
    seen: AtomicU64,
    /// When the last call began or ended.
    last: Mutex<Instant>,
}

impl Calls {
    fn new() -> Calls {
        Calls {
            open: AtomicUsize::new(0),
            seen: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        *lock(&self.last) = Instant::now();
    }

    /// A request has arrived (its head, or its HTTP/2 stream).
    pub(crate) fn arrived(&self) {
        self.seen.fetch_add(1, Ordering::Relaxed);
    }

    /// A gRPC call begins: the connection is busy until [`Calls::end`].
    pub(crate) fn begin(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.arrived();
        self.touch();
    }

    /// A gRPC call ends.
    pub(crate) fn end(&self) {
        self.touch();
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    fn idle_since(&self) -> Option<Instant> {
        (self.open.load(Ordering::SeqCst) == 0).then(|| *lock(&self.last))
    }
}

impl Gate {
    /// A gate with `caps` for the listeners `doors`, and the deadlines of
    /// `limits`.
    pub(crate) fn new(caps: Caps, limits: &Limits, doors: &Doors) -> Arc<Gate> {
        let reserves: Vec<Arc<Semaphore>> = (0..doors.len())
            .map(|_| Arc::new(Semaphore::new(caps.reserve)))
            .collect();
        let kept = reserves.len() * caps.reserve;
        Arc::new(Gate {
            caps,
            shared: Arc::new(Semaphore::new(caps.max.saturating_sub(kept))),
            reserves,
            addresses: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            handshake: limits.handshake_timeout,
            header: limits.header_timeout,
            idle: limits.idle_timeout,
            conns: Mutex::new(HashMap::new()),
            tls: AtomicBool::new(false),
        })
    }

    /// Tells the gate that the gRPC listener serves TLS.
    pub(crate) fn set_tls(&self) {
        self.tls.store(true, Ordering::Relaxed);
    }

    /// The handshake deadline.
    pub(crate) fn handshake_timeout(&self) -> Duration {
        self.handshake
    }

    /// The deadline of an HTTP request head.
    pub(crate) fn header_timeout(&self) -> Duration {
        self.header
    }

    /// The calls of the gRPC connection from `peer`, if it is open.
    pub(crate) fn calls_of(&self, peer: SocketAddr) -> Option<Arc<Calls>> {
        lock(&self.conns).get(&peer).cloned()
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Connections closed at once because a cap was reached.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A place for a connection from `peer` on `door`, if the caps allow
    /// one: its listener's reserve first, then the shared connections.
    fn admit(self: &Arc<Self>, door: Door, peer: SocketAddr) -> Result<Slot, Refusal> {
        let ip = peer.ip().to_canonical();
        let mut addresses = lock(&self.addresses);
        let held = addresses.get(&ip).copied().unwrap_or(0);
        if held >= self.caps.per_address {
            return Err(Refusal::Address);
        }
        let permit = self
            .reserves
            .get(door.index)
            .and_then(|r| Arc::clone(r).try_acquire_owned().ok())
            .or_else(|| Arc::clone(&self.shared).try_acquire_owned().ok())
            .ok_or(Refusal::Full)?;
        addresses.insert(ip, held + 1);
        drop(addresses);
        self.open.fetch_add(1, Ordering::SeqCst);
        Ok(Slot {
            gate: Arc::clone(self),
            ip,
            _permit: permit,
        })
    }

    fn refuse(&self, door: Door, peer: SocketAddr, why: Refusal) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed);
        if !(n.is_power_of_two() || n == 0) {
            return;
        }
        match why {
            Refusal::Address => tracing::warn!(
                peer = %peer, listener = door.name, max = self.caps.per_address, refused = n + 1,
                "connection refused: its address holds --max-connections-per-address connections"
            ),
            Refusal::Full => tracing::warn!(
                peer = %peer, listener = door.name, max = self.caps.max, reserve = self.caps.reserve, refused = n + 1,
                "connection refused: the listener holds all the connections it may (--max-connections, less the --listener-reserve the other listeners keep)"
            ),
        }
    }

    /// The next connection on `door` that fits under the caps. Errors of
    /// `accept` itself (out of file descriptors, a connection reset
    /// before it was accepted) are logged and waited out, never returned:
    /// a listener must go on. A gRPC connection is registered so that its
    /// calls are counted, and closed after the idle timeout without one.
    pub(crate) async fn accept(
        self: &Arc<Self>,
        door: Door,
        listener: &TcpListener,
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
            let slot = match self.admit(door, peer) {
                Ok(s) => s,
                Err(why) => {
                    self.refuse(door, peer, why);
                    drop(tcp);
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let calls = Arc::new(Calls::new());
            let mut conn = Conn {
                tcp,
                slot,
                calls: Arc::clone(&calls),
                deadline: Some(Box::pin(tokio::time::sleep(self.handshake))),
                received: 0,
                peer,
                idle: None,
                quiet: None,
            };
            if door.protocol == Protocol::Grpc {
                lock(&self.conns).insert(peer, calls);
                conn.idle = Some(Idle {
                    after: self.idle,
                    timer: Box::pin(tokio::time::sleep(self.idle)),
                });
            } else {
                conn.quiet = Some((self.idle, Box::pin(tokio::time::sleep(self.idle))));
            }
            return (conn, peer);
        }
    }
}

/// The connections of the gRPC listener `door`, for tonic.
pub(crate) fn incoming(
    listener: TcpListener,
    gate: Arc<Gate>,
    door: Door,
) -> impl futures_util::Stream<Item = io::Result<Conn>> + Send + 'static {
    futures_util::stream::unfold((listener, gate), move |(listener, gate)| async move {
        let (conn, _) = gate.accept(door, &listener).await;
        Some((Ok(conn), (listener, gate)))
    })
}

/// A connection's place under the caps, given back when it is dropped.
#[derive(Debug)]
struct Slot {
    gate: Arc<Gate>,
    ip: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.open.fetch_sub(1, Ordering::SeqCst);
        let mut addresses = lock(&self.gate.addresses);
        if let Some(n) = addresses.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                addresses.remove(&self.ip);
            }
        }
    }
}

/// An accepted connection: holds its place under the caps until it is
/// closed, and fails its reads once the handshake deadline passes before
/// its first request.
pub(crate) struct Conn {
    tcp: TcpStream,
    slot: Slot,
    /// Its requests.
    calls: Arc<Calls>,
    /// Until the first request has arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    received: usize,
    peer: SocketAddr,
    /// gRPC: closed after the idle timeout with no call open.
    idle: Option<Idle>,
    /// HTTP: closed after this long without a byte received.
    quiet: Option<(Duration, Pin<Box<Sleep>>)>,
}

/// The idle watch of a gRPC connection.
struct Idle {
    after: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Conn {
    /// Its requests, for the server that answers them.
    pub(crate) fn calls(&self) -> Arc<Calls> {
        Arc::clone(&self.calls)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.idle.is_some() {
            let gate = &self.slot.gate;
            if gate.tls.load(Ordering::Relaxed) && self.calls.seen.load(Ordering::Relaxed) == 0 {
                tracing::debug!(peer = %self.peer, received = self.received,
                    "TLS connection closed before its first call: the TLS handshake failed (see the tls accept error above), the client left, or it made no call within the handshake timeout");
            }
            let mut conns = lock(&gate.conns);
            if conns
                .get(&self.peer)
                .is_some_and(|c| Arc::ptr_eq(c, &self.calls))
            {
                conns.remove(&self.peer);
            }
        }
    }
}

impl Idle {
    /// True once the connection has had no call open for `after`; else
    /// arms the timer for the earliest moment it could be.
    fn expired(&mut self, calls: &Calls, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = match calls.idle_since() {
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

fn timed_out(what: &'static str) -> Poll<io::Result<()>> {
    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
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
            if n > 0
                && let Some((after, timer)) = this.quiet.as_mut()
            {
                timer.as_mut().reset(Instant::now() + *after);
            }
        }
        if this.deadline.is_some() && this.calls.seen.load(Ordering::Relaxed) > 0 {
            this.deadline = None;
        }
        // Checked whatever the read gave: bytes trickled in never put it
        // off.
        if !matches!(r, Poll::Ready(Err(_)))
            && let Some(d) = this.deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            tracing::debug!(peer = %this.peer, received = this.received,
                "closing a connection that made no request within the handshake timeout");
            return timed_out("the connection made no request within the handshake timeout");
        }
        if r.is_pending()
            && let Some((_, timer)) = this.quiet.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            tracing::debug!(peer = %this.peer, "closing a connection that sent nothing for the idle timeout");
            return timed_out("the connection sent nothing for the idle timeout");
        }
        if r.is_pending()
            && let Some(idle) = this.idle.as_mut()
            && idle.expired(&this.calls, cx)
        {
            tracing::debug!(peer = %this.peer, "closing a connection idle for the idle timeout");
            return timed_out("the connection was idle for the idle timeout");
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

    #[test]
    fn unset_caps_are_derived_and_a_reserve_that_does_not_fit_is_refused() {
        let limits = Limits::default();
        // 1,024 open files, gRPC and the console.
        assert_eq!(
            caps(&limits, Some(1024), 2),
            Ok(Caps {
                max: 768,
                per_address: 192,
                reserve: 192,
            })
        );
        // Every listener on.
        assert_eq!(
            caps(&limits, Some(1 << 20), 4),
            Ok(Caps {
                max: 10_000,
                per_address: 2500,
                reserve: 1250,
            })
        );
        let set = Limits {
            max_connections: Some(10),
            max_connections_per_address: Some(3),
            listener_reserve: Some(5),
            ..Limits::default()
        };
        assert_eq!(
            caps(&set, None, 2),
            Ok(Caps {
                max: 10,
                per_address: 3,
                reserve: 5,
            })
        );
        let e = caps(&set, None, 3).unwrap_err();
        assert!(e.contains("--listener-reserve 5"), "{e}");
        assert!(e.contains("at most 3 each"), "{e}");
        // A tiny cap still lets every address in.
        let tiny = Limits {
            max_connections: Some(2),
            ..Limits::default()
        };
        assert_eq!(caps(&tiny, None, 1).map(|c| c.per_address), Ok(1));
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn an_address_and_a_listener_take_no_more_than_their_share() {
        let caps = Caps {
            max: 10,
            per_address: 4,
            reserve: 3,
        };
        // gRPC and REST keep 3 each; 4 are shared.
        let mut doors = Doors::default();
        let grpc = doors.add("gRPC", Protocol::Grpc);
        let rest = doors.add("REST", Protocol::Http);
        let gate = Gate::new(caps, &Limits::default(), &doors);
        let mut held = Vec::new();
        for port in 1..=4 {
            let peer = addr(&format!("10.0.0.1:{port}"));
            held.push(gate.admit(rest, peer).unwrap());
        }
        assert_eq!(
            gate.admit(rest, addr("10.0.0.1:5")).unwrap_err(),
            Refusal::Address
        );
        // The same address written as IPv4-mapped IPv6 is the same one.
        assert_eq!(
            gate.admit(grpc, addr("[::ffff:10.0.0.1]:6")).unwrap_err(),
            Refusal::Address
        );
        for port in 1..=3 {
            held.push(gate.admit(rest, addr(&format!("10.0.0.2:{port}"))).unwrap());
        }
        // REST holds its 3 and the 4 shared.
        assert_eq!(
            gate.admit(rest, addr("10.0.0.3:1")).unwrap_err(),
            Refusal::Full
        );
        assert_eq!(gate.open(), 7);
        // gRPC keeps its 3.
        for port in 1..=3 {
            held.push(gate.admit(grpc, addr(&format!("10.0.0.3:{port}"))).unwrap());
        }
        assert_eq!(
            gate.admit(grpc, addr("10.0.0.4:1")).unwrap_err(),
            Refusal::Full
        );
        assert_eq!(gate.open(), 10);
        // Closing gives the places back, the address's too.
        held.drain(..4);
        assert_eq!(gate.open(), 6);
        assert!(gate.admit(grpc, addr("10.0.0.1:7")).is_ok());
        assert!(
            lock(&gate.addresses)
                .get(&"10.0.0.1".parse::<IpAddr>().unwrap())
                .is_none()
        );
    }
}
