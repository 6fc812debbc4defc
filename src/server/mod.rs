//! The composition root: the one module that knows every part of the
//! process and puts them together.
//!
//! [`Server::start`] opens the store (recovery included; with
//! [`ServerConfig::remote`], the queues' lease in PostgreSQL, waited for
//! as a standby), builds the engine, and binds the listener of every
//! front end that is on. [`Server::serve`] starts them side by side over
//! the one engine, each handed what the front ends share
//! (`crate::edge::Shared`: the engine, the grants, the connection caps,
//! the consumers):
//!
//! - gRPC (`crate::grpc`), always;
//! - the Anypoint MQ REST facade (`crate::anypoint`), the web console
//!   (`crate::console`) and the SQS endpoint (`crate::sqs`), started in
//!   `start_http_front_ends`;
//! - the metrics endpoint (`crate::metrics`);
//!
//! with the engine's sweeper. It owns the shutdown: once the shutdown
//! future resolves or the storage fails, the engine begins shutting down
//! and every front end stops accepting and finishes what is in flight
//! within the grace period; then subscription sessions give back what
//! they hold, the sweeper stops, metrics last, and the store is closed
//! (apply and checkpoint).
//!
//! Nothing below imports this module: a front end knows the engine and
//! `crate::edge`, never another front end or the root.

mod config;
pub mod notify;
mod open;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::clock::Clock;
use crate::edge::Shared;
use crate::edge::conns::{self, Caps, Door, Doors, Gate, Protocol};
use crate::queue::Broker;
use crate::storage::OpenReport;

pub use crate::edge::conns::Limits;
pub use crate::edge::tls::TlsConfig;
pub use config::{ConsoleAt, RemoteStore, ServerConfig, ServerError};

/// A listener bound for a front end, with its place under the caps.
struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
    door: Door,
}

/// The listeners of the front ends that are on.
struct Listeners {
    grpc: Bound,
    metrics: Option<Bound>,
    http: HttpListeners,
}

/// The listeners of the HTTP front ends started in
/// `start_http_front_ends`.
struct HttpListeners {
    anypoint: Option<Bound>,
    console: Option<Bound>,
    sqs: Option<Bound>,
}

/// A front end with a listener of its own. A new front end is one more
/// variant: the compiler then asks for its name, its start lines
/// (`src/main.rs`) and its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    /// gRPC, always on.
    Grpc,
    /// The Anypoint MQ REST facade.
    Anypoint,
    /// The Prometheus endpoint.
    Metrics,
    /// The web console.
    Console,
    /// The SQS endpoint.
    Sqs,
}

impl FrontEnd {
    /// Its name, as the logs and the connection caps name its listener.
    pub fn name(self) -> &'static str {
        match self {
            FrontEnd::Grpc => "gRPC",
            FrontEnd::Anypoint => "REST",
            FrontEnd::Metrics => "metrics",
            FrontEnd::Console => "console",
            FrontEnd::Sqs => "SQS",
        }
    }

    /// What it serves, in words.
    pub fn what(self) -> &'static str {
        match self {
            FrontEnd::Grpc => "gRPC",
            FrontEnd::Anypoint => "the Anypoint MQ REST API",
            FrontEnd::Metrics => "metrics",
            FrontEnd::Console => "the web console",
            FrontEnd::Sqs => "the SQS endpoint",
        }
    }
}

/// Whether a listener asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Not asked for.
    Off,
    /// Asked for, and a connection without one is served
    /// (`--tls-client-ca`).
    Optional,
    /// A connection without a valid one is refused
    /// (`--tls-require-client-cert`).
    Required,
}

impl ClientCerts {
    /// `off`, `optional` or `required`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientCerts::Off => "off",
            ClientCerts::Optional => "optional",
            ClientCerts::Required => "required",
        }
    }
}

/// A listener the server serves on, with its TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listening {
    /// Which front end.
    pub front_end: FrontEnd,
    /// The bound address.
    pub addr: SocketAddr,
    /// Whether it serves TLS.
    pub tls: bool,
    /// Whether it asks for client certificates.
    pub client_certs: ClientCerts,
}

impl Listening {
    /// The URL a client uses (`https://` with TLS): the gRPC endpoint,
    /// the REST API's base, the metrics page, the console's first page,
    /// the SQS endpoint's base.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let base = format!("{scheme}://{}", self.addr);
        match self.front_end {
            FrontEnd::Grpc => base,
            FrontEnd::Anypoint => format!("{base}/api/v1"),
            FrontEnd::Metrics => format!("{base}/metrics"),
            FrontEnd::Console | FrontEnd::Sqs => format!("{base}/"),
        }
    }
}

/// Where gRPC is, as the other listeners tell a client that calls them by
/// mistake: its URL, with the host left to the reader when it listens on
/// every address.
fn grpc_url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        format!(
            "{scheme}://HOST:{} (port {} of this host)",
            addr.port(),
            addr.port()
        )
    } else {
        format!("{scheme}://{addr}")
    }
}

/// A started server.
pub struct Server {
    broker: Arc<Broker>,
    listeners: Listeners,
    config: ServerConfig,
    report: OpenReport,
    /// The connection caps in force.
    caps: Caps,
    /// The listeners that share them.
    doors: Doors,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.listeners.grpc.addr)
            .finish()
    }
}

/// Binds `at`.
async fn bind(at: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_err = |source| ServerError::Bind { addr: at, source };
    let l = TcpListener::bind(at).await.map_err(bind_err)?;
    let bound = l.local_addr().map_err(bind_err)?;
    Ok((l, bound))
}

/// Binds an optional listener (`what`, set by `flag`, in the warning) where it may
/// listen: exactly there, or (preferred) there or any free port on its
/// IP, else not at all (a warning).
async fn bind_at(
    at: Option<ConsoleAt>,
    what: &str,
    flag: &str,
) -> Result<Option<(TcpListener, SocketAddr)>, ServerError> {
    match at {
        Some(ConsoleAt::Exactly(at)) => bind(at).await.map(Some),
        Some(ConsoleAt::Preferred(at)) => {
            let any = SocketAddr::new(at.ip(), 0);
            let l = match TcpListener::bind(at).await {
                Ok(l) => Ok(l),
                Err(_) => TcpListener::bind(any).await,
            };
            match l.and_then(|l| l.local_addr().map(|a| (l, a))) {
                Ok(x) => Ok(Some(x)),
                Err(e) => {
                    tracing::warn!(addr = %at, error = %e, "{what} could not listen there nor on another port of its address; serving without it (give {flag} ADDR, or off)");
                    Ok(None)
                }
            }
        }
        None => Ok(None),
    }
}

/// Binds the listener of every front end that is on, each a door under
/// the caps (gRPC first).
async fn listen(config: &ServerConfig, doors: &mut Doors) -> Result<Listeners, ServerError> {
    let grpc = bind(config.listen).await?;
    let anypoint = match config.anypoint_listen {
        Some(at) => Some(bind(at).await?),
        None => None,
    };
    let metrics = match config.metrics_listen {
        Some(at) => Some(bind(at).await?),
        None => None,
    };
    let console = bind_at(config.console_listen, "the console", "--console-listen").await?;
    let sqs = bind_at(config.sqs_listen, "the SQS endpoint", "--sqs-listen").await?;
    let mut door = |(listener, addr): (TcpListener, SocketAddr), name, protocol| Bound {
        listener,
        addr,
        door: doors.add(name, protocol),
    };
    let grpc = door(grpc, FrontEnd::Grpc.name(), Protocol::Grpc);
    let http = HttpListeners {
        anypoint: anypoint.map(|l| door(l, FrontEnd::Anypoint.name(), Protocol::Http)),
        console: console.map(|l| door(l, FrontEnd::Console.name(), Protocol::Http)),
        sqs: sqs.map(|l| door(l, FrontEnd::Sqs.name(), Protocol::Http)),
    };
    let metrics = metrics.map(|l| door(l, FrontEnd::Metrics.name(), Protocol::Http));
    Ok(Listeners {
        grpc,
        metrics,
        http,
    })
}

impl Server {
    /// Opens the data directory (or, with [`ServerConfig::remote`], takes
    /// the queues' lease in PostgreSQL, waiting for it as a standby),
    /// recovers, and binds the listeners.
    pub async fn start(config: ServerConfig, clock: Arc<dyn Clock>) -> Result<Server, ServerError> {
        let (broker, report) = match config.remote.clone() {
            Some(remote) => open::open_remote(remote, clock, config.broker.clone()).await?,
            None => open::open_local(&config, clock).await?,
        };
        let mut doors = Doors::default();
        let listeners = listen(&config, &mut doors).await?;
        let open_files = conns::raise_open_files();
        let caps =
            conns::caps(&config.limits, open_files, doors.len()).map_err(ServerError::Limits)?;
        tracing::info!(
            max_connections = caps.max,
            per_address = caps.per_address,
            listener_reserve = caps.reserve,
            listeners = doors.len(),
            open_files = open_files.unwrap_or(0),
            "connections capped"
        );
        Ok(Server {
            broker: Arc::new(broker),
            listeners,
            config,
            report,
            caps,
            doors,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listeners.grpc.addr
    }

    /// The bound address of the Anypoint MQ REST facade, if it is on.
    pub fn anypoint_addr(&self) -> Option<SocketAddr> {
        self.listeners.http.anypoint.as_ref().map(|b| b.addr)
    }

    /// The bound address of the web console, if it is on.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.listeners.http.console.as_ref().map(|b| b.addr)
    }

    /// The bound address of the SQS endpoint, if it is on.
    pub fn sqs_addr(&self) -> Option<SocketAddr> {
        self.listeners.http.sqs.as_ref().map(|b| b.addr)
    }

    /// The bound address of the metrics endpoint, if it is on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.listeners.metrics.as_ref().map(|b| b.addr)
    }

    /// Every listener, gRPC first, then in the order of their start
    /// lines (`src/launch.rs`), each with its TLS settings: gRPC asks for
    /// client certificates with `--tls-client-ca`; the HTTP listeners
    /// serve the same certificate without asking for one.
    pub fn listening(&self) -> Vec<Listening> {
        let tls = self.config.tls.as_ref();
        let grpc_certs = match tls {
            Some(t) if t.require_client_cert => ClientCerts::Required,
            Some(t) if t.client_ca_pem.is_some() => ClientCerts::Optional,
            _ => ClientCerts::Off,
        };
        let http = |front_end, addr| Listening {
            front_end,
            addr,
            tls: tls.is_some(),
            client_certs: ClientCerts::Off,
        };
        let mut all = vec![Listening {
            front_end: FrontEnd::Grpc,
            addr: self.local_addr(),
            tls: tls.is_some(),
            client_certs: grpc_certs,
        }];
        all.extend(self.anypoint_addr().map(|a| http(FrontEnd::Anypoint, a)));
        all.extend(self.metrics_addr().map(|a| http(FrontEnd::Metrics, a)));
        all.extend(self.console_addr().map(|a| http(FrontEnd::Console, a)));
        all.extend(self.sqs_addr().map(|a| http(FrontEnd::Sqs, a)));
        all
    }

    /// What recovery found.
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// The engine.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Serves until `shutdown` resolves (graceful: in-flight calls finish,
    /// then the store is checkpointed and closed) or the storage fails
    /// (an error is returned and nothing more is answered OK).
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServerError> {
        let Server {
            broker,
            listeners,
            config,
            report,
            caps,
            doors,
        } = self;
        let http_tls = config.tls.as_ref().map(crate::edge::tls::http_acceptor);
        let shared = Shared {
            broker: Arc::clone(&broker),
            auth: Arc::clone(&config.auth),
            gate: Gate::new(caps, &config.limits, &doors),
            consumers: Arc::default(),
            http_tls: http_tls.transpose().map_err(ServerError::Tls)?,
            grpc_url: grpc_url(listeners.grpc.addr, config.tls.is_some()),
        };
        // Every front end begins stopping when `drain` is cancelled.
        let drain = CancellationToken::new();
        let rpc = crate::grpc::RpcStats::new();
        let grpc = start_grpc(listeners.grpc, &config, &shared, &rpc, &drain).await?;
        let sweeper = Task::spawn(CancellationToken::new(), |stop| {
            Arc::clone(&broker).sweep(stop)
        });
        let metrics = listeners
            .metrics
            .map(|b| start_metrics(b, &config, &report, &shared, &rpc));
        let http = start_http_front_ends(listeners.http, &config, &shared, &drain);
        let grace = config.shutdown_grace;
        let served = tokio::select! {
            r = grpc.done => r,
            () = stop_requested(shutdown, &broker, &drain, grace) => {
                tracing::warn!(grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX), "calls or connections still open after the grace period; closing them");
                Ok(())
            }
        };
        // Calls in flight finish within the grace period (the drain began
        // already unless gRPC stopped on its own).
        drain.cancel();
        for (what, task) in http {
            task.stop_within(grace, what).await;
        }
        // Subscription sessions return their unsettled deliveries before
        // the store closes.
        grpc.sessions.close();
        if tokio::time::timeout(grace, grpc.sessions.wait())
            .await
            .is_err()
        {
            tracing::warn!("subscriptions still closing after the grace period");
        }
        sweeper.stop().await;
        if let Some(t) = metrics {
            t.stop().await;
        }
        drop(shared);
        let failed = close(broker);
        served?;
        failed.map_or(Ok(()), |reason| Err(ServerError::StorageFailed(reason)))
    }
}

/// Starts the gRPC front end on its listener, counting its calls in
/// `rpc`, stopping once `drain` is cancelled.
async fn start_grpc(
    bound: Bound,
    config: &ServerConfig,
    shared: &Shared,
    rpc: &Arc<crate::grpc::RpcStats>,
    drain: &CancellationToken,
) -> Result<crate::grpc::Serving, ServerError> {
    let opts = crate::grpc::Options {
        tls: config.tls.clone(),
        limits: config.limits.clone(),
        max_request_bytes: config.max_request_bytes,
    };
    let rpc = Arc::clone(rpc);
    crate::grpc::serve(
        bound.listener,
        bound.door,
        &opts,
        shared,
        rpc,
        drain.clone(),
    )
    .await
    .map_err(|e| match e {
        crate::grpc::StartError::Transport(e) => ServerError::Transport(e),
        crate::grpc::StartError::Reflection(why) => {
            ServerError::StorageFailed(format!("reflection: {why}"))
        }
    })
}

/// Starts the metrics endpoint on its listener, serving what the front
/// ends count (`rpc`: the gRPC calls); it runs until stopped last.
fn start_metrics(
    bound: Bound,
    config: &ServerConfig,
    report: &OpenReport,
    shared: &Shared,
    rpc: &Arc<crate::grpc::RpcStats>,
) -> Task {
    let listener = shared.http_listener(bound.listener, bound.door);
    let opts = crate::metrics::Options {
        recovery: report.elapsed,
        replayed: report.replayed,
        token: config.metrics_token.clone(),
        per_queue: config.metrics_per_queue,
    };
    Task::spawn(CancellationToken::new(), |stop| {
        crate::metrics::serve(listener, shared, opts, |r| rpc.register(r), stop)
    })
}

/// Starts the HTTP front ends that are on (the REST facade, the console,
/// the SQS endpoint),
/// each on its listener over `shared`, stopping once `drain` is
/// cancelled; returns them, named for the shutdown's warnings, in the
/// order they are waited for. A new HTTP front end is started here.
fn start_http_front_ends(
    listeners: HttpListeners,
    config: &ServerConfig,
    shared: &Shared,
    drain: &CancellationToken,
) -> Vec<(&'static str, Task)> {
    let mut started = Vec::new();
    if let Some(b) = listeners.anypoint {
        // Its long polls end when the engine begins shutting down.
        let listener = shared.http_listener(b.listener, b.door);
        let opts = config.anypoint.clone();
        let task = Task::spawn(drain.child_token(), |stop| {
            crate::anypoint::serve(listener, shared, opts, stop)
        });
        started.push(("anypoint calls", task));
    }
    if let Some(b) = listeners.console {
        let listener = shared.http_listener(b.listener, b.door);
        let opts = crate::console::ConsoleOptions {
            tls: config.tls.is_some(),
            sample_every: config.console_sample_every,
        };
        let task = Task::spawn(drain.child_token(), |stop| {
            crate::console::serve(listener, shared, opts, stop)
        });
        started.push(("console requests", task));
    }
    if let Some(b) = listeners.sqs {
        // Its long polls end when the engine begins shutting down.
        let listener = shared.http_listener(b.listener, b.door);
        let opts = crate::sqs::SqsOptions {
            tls: config.tls.is_some(),
            ..config.sqs.clone()
        };
        let task = Task::spawn(drain.child_token(), |stop| {
            crate::sqs::serve(listener, shared, opts, stop)
        });
        started.push(("SQS calls", task));
    }
    started
}

/// Resolves when the server must stop now: once the shutdown request (or
/// a storage failure) has come, the engine begins shutting down (long
/// polls end), `drain` tells every front end to stop, and the grace
/// period for calls in flight has passed.
async fn stop_requested(
    shutdown: impl Future<Output = ()>,
    broker: &Broker,
    drain: &CancellationToken,
    grace: Duration,
) {
    let mut failure = broker.store().failure();
    tokio::select! {
        () = shutdown => tracing::info!("shutting down: finishing calls in flight"),
        _ = failure.wait_for(Option::is_some) => tracing::error!("storage failed: stopping"),
    }
    broker.begin_shutdown();
    drain.cancel();
    tokio::time::sleep(grace).await;
}

/// Closes the store (apply and checkpoint) once nothing else holds the
/// engine; returns the storage's failure, if it failed.
fn close(broker: Arc<Broker>) -> Option<String> {
    let failed = broker.store().failure().borrow().clone();
    match Arc::try_unwrap(broker) {
        Ok(b) => {
            if let Err(e) = b.close() {
                tracing::error!(error = %e, "closing the store failed");
            }
        }
        Err(_) => {
            tracing::warn!("engine still in use at shutdown; the store closes when it is dropped")
        }
    }
    failed
}

/// A task that runs until its token is cancelled.
struct Task {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Task {
    /// Spawns `run`, handing it the future that resolves once `stop` is
    /// cancelled.
    fn spawn<F>(
        stop: CancellationToken,
        run: impl FnOnce(WaitForCancellationFutureOwned) -> F,
    ) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(run(stop.clone().cancelled_owned()));
        Task { stop, handle }
    }

    /// Stops it and waits for it to end.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }

    /// Stops it and waits for it to end, at most `grace`; then aborts it
    /// (`what` is still open, says the warning).
    async fn stop_within(mut self, grace: Duration, what: &str) {
        self.stop.cancel();
        if tokio::time::timeout(grace, &mut self.handle).await.is_err() {
            tracing::warn!("{what} still open after the grace period; closing them");
            self.handle.abort();
            let _ = self.handle.await;
        }
    }
}
