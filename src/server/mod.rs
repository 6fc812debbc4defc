//! The gRPC server: tonic lives here (and in `client/`).
//!
//! [`Server::start`] opens the data directory (recovery included), builds
//! the engine, binds the listener and starts the sweeper;
//! [`Server::serve`] answers calls until the shutdown future resolves or
//! the storage fails, then drains in-flight calls, stops the sweeper and
//! closes the store (apply and checkpoint).

mod access;
pub(crate) mod audit;
mod calls;
pub(crate) mod conns;
pub(crate) mod consumers;
pub(crate) mod convert;
pub(crate) mod http;
mod metrics;
mod publish_stream;
pub(crate) mod redrive;
mod service;
pub(crate) mod status;
mod subscribe;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::anypoint::AnypointOptions;
use crate::auth::Authenticator;
use crate::clock::Clock;
use crate::pb::admin_service_server::AdminServiceServer;
use crate::pb::messaging_service_server::MessagingServiceServer;
use crate::queue::{Broker, BrokerOptions, QueueError};
use crate::storage::{OpenReport, StorageError, StoreOptions};

pub use service::Service;

/// Everything the server needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The data directory.
    pub data_dir: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Storage tunables.
    pub store: StoreOptions,
    /// Engine tunables.
    pub broker: BrokerOptions,
    /// Largest request the server decodes.
    pub max_request_bytes: usize,
    /// How long a graceful shutdown waits for calls in flight (and for
    /// clients to close their connections) before closing them.
    pub shutdown_grace: Duration,
    /// Who may do what (authentication off by default).
    pub auth: Arc<Authenticator>,
    /// TLS for the gRPC listener (and with the same certificate, without
    /// client certificates, for the REST and metrics listeners), off when
    /// `None`.
    pub tls: Option<TlsConfig>,
    /// Connection and request limits.
    pub limits: Limits,
    /// Address of the Prometheus endpoint (`/metrics`), off when `None`.
    /// With [`ServerConfig::tls`], it serves HTTPS with the same
    /// certificate.
    pub metrics_listen: Option<SocketAddr>,
    /// A bearer token `/metrics` requires (`Authorization: Bearer
    /// TOKEN`), none when `None`.
    pub metrics_token: Option<String>,
    /// Address of the Anypoint MQ REST facade, if it is on.
    pub anypoint_listen: Option<SocketAddr>,
    /// Address of the web console, if it is on.
    pub console_listen: Option<ConsoleAt>,
    /// Address of the SQS endpoint, if it is on.
    pub sqs_listen: Option<ConsoleAt>,
    /// Settings of the SQS endpoint.
    pub sqs: crate::sqs::SqsOptions,
    /// Time between two samples of the console's plots.
    pub console_sample_every: Duration,
    /// Settings of the Anypoint MQ REST facade.
    pub anypoint: AnypointOptions,
    /// State kept in PostgreSQL instead of [`ServerConfig::data_dir`],
    /// when `Some`.
    pub remote: Option<RemoteStore>,
}

/// Where a node of a highly available pair keeps its state, and how it
/// holds the queues (`serve --store`).
#[derive(Clone)]
pub struct RemoteStore {
    /// The `postgres://` URL (it may hold a password).
    pub url: String,
    /// This node's name in the ownership lease.
    pub node: String,
    /// How long the lease lasts without renewal.
    pub lease_ttl: Duration,
    /// Wait for the lease instead of refusing to start while another node
    /// holds it.
    pub standby: bool,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("url", &crate::storage::pg::describe(&self.url))
            .field("node", &self.node)
            .field("lease_ttl", &self.lease_ttl)
            .field("standby", &self.standby)
            .finish()
    }
}

/// Where the web console (or the SQS endpoint) listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleAt {
    /// This address, or the server does not start.
    Exactly(SocketAddr),
    /// This address, or any free port on its IP if it is taken (the
    /// default: a second server on the same machine still starts).
    Preferred(SocketAddr),
}

/// TLS settings of the gRPC listener (PEM contents).
#[derive(Clone)]
pub struct TlsConfig {
    /// The server's certificate chain.
    pub cert_pem: Vec<u8>,
    /// The server's private key.
    pub key_pem: Vec<u8>,
    /// CA certificates that sign client certificates; with it, clients
    /// may present certificates (mTLS).
    pub client_ca_pem: Option<Vec<u8>>,
    /// Refuse connections without a valid client certificate.
    pub require_client_cert: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("client_ca", &self.client_ca_pem.is_some())
            .field("require_client_cert", &self.require_client_cert)
            .finish_non_exhaustive()
    }
}

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

impl ServerConfig {
    /// Defaults: `./letterbox-data`, `127.0.0.1:50051`.
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> ServerConfig {
        let broker = BrokerOptions::default();
        ServerConfig {
            data_dir,
            listen,
            store: StoreOptions::default(),
            max_request_bytes: broker.max_message_size + (4 << 20),
            shutdown_grace: Duration::from_secs(10),
            auth: Arc::new(Authenticator::disabled()),
            tls: None,
            limits: Limits::default(),
            metrics_listen: None,
            metrics_token: None,
            anypoint_listen: None,
            console_listen: None,
            sqs_listen: None,
            sqs: crate::sqs::SqsOptions::default(),
            console_sample_every: Duration::from_secs(5),
            remote: None,
            anypoint: AnypointOptions {
                max_body_bytes: 10 * broker.max_message_size + (4 << 20),
                ..AnypointOptions::default()
            },
            broker,
        }
    }
}

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data directory (or the PostgreSQL store) could not be opened
    /// or recovered.
    #[error("cannot open the store: {0}")]
    Open(#[from] StorageError),
    /// The engine could not rebuild its state.
    #[error("cannot load the queues: {0}")]
    Load(#[from] QueueError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate or key could not be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The connection limits do not fit together.
    #[error("connection limits: {0}")]
    Limits(String),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The storage stopped after an I/O error (fail-stop).
    #[error("storage failed, the server stopped: {0}")]
    StorageFailed(String),
    /// A start-up step on a blocking thread panicked or was cancelled.
    #[error("{what} stopped: {why}")]
    Aborted {
        /// The step.
        what: &'static str,
        /// The panic's message, or why the step was cancelled.
        why: String,
    },
}

/// What a blocking start-up step that did not return left behind: its
/// panic's message, or why it was cancelled.
fn join_failure(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        let p = e.into_panic();
        p.downcast_ref::<&str>()
            .map(|s| format!("panicked: {s}"))
            .or_else(|| p.downcast_ref::<String>().map(|s| format!("panicked: {s}")))
            .unwrap_or_else(|| "panicked".into())
    } else {
        e.to_string()
    }
}

/// Names reported by `grpc.health.v1.Health`: the server as a whole ("")
/// and each service. All are SERVING from the first answer, which comes
/// only after recovery, until shutdown begins.
const SERVICE_NAMES: [&str; 3] = [
    "",
    "letterbox.v1.AdminService",
    "letterbox.v1.MessagingService",
];

fn tls_config(tls: &TlsConfig) -> ServerTlsConfig {
    let mut c = ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
    if let Some(ca) = &tls.client_ca_pem {
        c = c
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!tls.require_client_cert);
    }
    c
}

/// TLS for the HTTP listeners (REST, metrics): the server's certificate,
/// HTTP/1.1, no client certificates.
fn http_tls(tls: &TlsConfig) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ServerError::Tls(format!("the certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem)
        .map_err(|e| ServerError::Tls(format!("the private key: {e}")))?;
    let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ServerError::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| ServerError::Tls(e.to_string()))?;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(c)))
}

/// Binds an optional HTTP listener: exactly its address, or (preferred)
/// that address or any free port on its IP, serving without it if
/// neither can be had.
async fn bind_at(
    at: Option<ConsoleAt>,
    what: &str,
) -> Result<Option<(TcpListener, SocketAddr)>, ServerError> {
    Ok(match at {
        Some(ConsoleAt::Exactly(at)) => {
            let bind = |source| ServerError::Bind { addr: at, source };
            let l = TcpListener::bind(at).await.map_err(bind)?;
            let a = l.local_addr().map_err(bind)?;
            Some((l, a))
        }
        Some(ConsoleAt::Preferred(at)) => {
            let any = SocketAddr::new(at.ip(), 0);
            let l = match TcpListener::bind(at).await {
                Ok(l) => Ok(l),
                Err(_) => TcpListener::bind(any).await,
            };
            match l.and_then(|l| l.local_addr().map(|a| (l, a))) {
                Ok(x) => Some(x),
                Err(e) => {
                    tracing::warn!(addr = %at, error = %e, "{what} could not listen; serving without it");
                    None
                }
            }
        }
        None => None,
    })
}

/// A started server.
pub struct Server {
    broker: Arc<Broker>,
    listener: TcpListener,
    addr: SocketAddr,
    metrics: Option<(TcpListener, SocketAddr)>,
    anypoint: Option<(TcpListener, SocketAddr)>,
    console: Option<(TcpListener, SocketAddr)>,
    sqs: Option<(TcpListener, SocketAddr)>,
    config: ServerConfig,
    report: OpenReport,
    /// The connection caps in force.
    caps: conns::Caps,
    /// The listeners that share them.
    doors: Vec<conns::Door>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

/// Opens the data directory and recovers (the local store).
async fn open_local(
    config: &ServerConfig,
    clock: Arc<dyn Clock>,
) -> Result<(Broker, OpenReport), ServerError> {
    let dir = config.data_dir.clone();
    let db_dir = crate::storage::fsutil::current_database(&dir).unwrap_or_else(|_| dir.join("db"));
    let store_opts = config.store.clone();
    let broker_opts = config.broker.clone();
    // Opening replays the log and scans the database: blocking work.
    let (broker, report) = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let (broker, mut report) = Broker::start(&dir, store_opts, clock, broker_opts)?;
        // Recovery is the whole of it: the store's replay and the
        // engine's indexes rebuilt from the database.
        report.elapsed = started.elapsed();
        Ok::<_, ServerError>((broker, report))
    })
    .await
    .map_err(|e| {
        // sled panics on some damage instead of returning an error.
        ServerError::Open(StorageError::Corrupt {
            what: db_dir.display().to_string(),
            reason: format!(
                "reading it failed ({}): the database is damaged (see letterbox verify)",
                join_failure(e)
            ),
        })
    })??;
    Ok((broker, report))
}

/// Takes the queues' lease in PostgreSQL (as a standby: waits until the
/// owner's lease lapses) and rebuilds the engine's indexes from the
/// database.
async fn open_remote(
    remote: RemoteStore,
    clock: Arc<dyn Clock>,
    broker_opts: BrokerOptions,
) -> Result<(Broker, OpenReport), ServerError> {
    use crate::storage::pg::PgError;
    use crate::storage::{PgBackend, PgBackendOptions};
    let target = crate::storage::pg::describe(&remote.url);
    let poll = remote.lease_ttl / 3;
    let mut announced = false;
    let backend = loop {
        let r = remote.clone();
        let opened = tokio::task::spawn_blocking(move || {
            PgBackend::open(
                &r.url,
                PgBackendOptions {
                    node: r.node.clone(),
                    lease_ttl: r.lease_ttl,
                    ..PgBackendOptions::default()
                },
            )
        })
        .await
        .map_err(|e| ServerError::Aborted {
            what: "taking the PostgreSQL store's lease",
            why: join_failure(e),
        })?;
        match opened {
            Ok(b) => break b,
            Err(StorageError::Pg(PgError::Held { holder, .. })) if remote.standby => {
                if !announced {
                    tracing::info!(
                        store = %target,
                        owner = %holder.node,
                        epoch = holder.epoch,
                        lease_left_ms = u64::try_from(holder.remaining.as_millis()).unwrap_or(u64::MAX),
                        "standby: another node owns the queues; taking over once its lease lapses"
                    );
                    announced = true;
                }
                let wait = holder.remaining.clamp(Duration::from_millis(50), poll);
                tokio::time::sleep(wait).await;
            }
            Err(StorageError::Pg(
                e @ (PgError::Connect { .. } | PgError::Lost(_) | PgError::Db(_)),
            )) if remote.standby => {
                tracing::warn!(store = %target, error = %e, "standby: PostgreSQL not reachable; trying again");
                tokio::time::sleep(poll).await;
            }
            Err(e) => return Err(ServerError::Open(e)),
        }
    };
    tracing::info!(
        store = %target,
        node = %remote.node,
        epoch = backend.epoch(),
        "this node owns the queues; loading them"
    );
    let started = std::time::Instant::now();
    let broker = tokio::task::spawn_blocking(move || Broker::open(backend, clock, broker_opts))
        .await
        .map_err(|e| ServerError::Aborted {
            what: "loading the queues from PostgreSQL",
            why: join_failure(e),
        })??;
    Ok((
        broker,
        OpenReport {
            applied_lsn: 0,
            replayed: 0,
            elapsed: started.elapsed(),
        },
    ))
}

impl Server {
    /// Opens the data directory (or, with [`ServerConfig::remote`], takes
    /// the queues' lease in PostgreSQL, waiting for it as a standby),
    /// recovers, and binds the listener.
    pub async fn start(config: ServerConfig, clock: Arc<dyn Clock>) -> Result<Server, ServerError> {
        let (broker, report) = match config.remote.clone() {
            Some(remote) => open_remote(remote, clock, config.broker.clone()).await?,
            None => open_local(&config, clock).await?,
        };
        Server::listen(config, broker, report).await
    }

    async fn listen(
        config: ServerConfig,
        broker: Broker,
        report: OpenReport,
    ) -> Result<Server, ServerError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let anypoint = match config.anypoint_listen {
            Some(at) => {
                let bind = |source| ServerError::Bind { addr: at, source };
                let l = TcpListener::bind(at).await.map_err(bind)?;
                let a = l.local_addr().map_err(bind)?;
                Some((l, a))
            }
            None => None,
        };
        let metrics = match config.metrics_listen {
            Some(at) => {
                let bind_err = |source| ServerError::Bind { addr: at, source };
                let l = TcpListener::bind(at).await.map_err(bind_err)?;
                let bound = l.local_addr().map_err(bind_err)?;
                Some((l, bound))
            }
            None => None,
        };
        let console = bind_at(config.console_listen, "the console").await?;
        let sqs = bind_at(config.sqs_listen, "the SQS endpoint").await?;
        let open_files = conns::raise_open_files();
        let doors: Vec<conns::Door> = [
            Some(conns::Door::Grpc),
            anypoint.as_ref().map(|_| conns::Door::Rest),
            console.as_ref().map(|_| conns::Door::Console),
            metrics.as_ref().map(|_| conns::Door::Metrics),
            sqs.as_ref().map(|_| conns::Door::Sqs),
        ]
        .into_iter()
        .flatten()
        .collect();
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
            listener,
            addr,
            metrics,
            anypoint,
            console,
            sqs,
            config,
            report,
            caps,
            doors,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of the Anypoint MQ REST facade, if it is on.
    pub fn anypoint_addr(&self) -> Option<SocketAddr> {
        self.anypoint.as_ref().map(|(_, a)| *a)
    }

    /// The bound address of the web console, if it is on.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console.as_ref().map(|(_, a)| *a)
    }

    /// The bound address of the SQS endpoint, if it is on.
    pub fn sqs_addr(&self) -> Option<SocketAddr> {
        self.sqs.as_ref().map(|(_, a)| *a)
    }

    /// The bound address of the metrics endpoint, if it is on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, a)| *a)
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
            listener,
            anypoint,
            console,
            sqs,
            config,
            metrics,
            report,
            caps,
            doors,
            ..
        } = self;
        let gate = conns::Gate::new(caps, &config.limits, &doors);
        if config.tls.is_some() {
            gate.set_tls();
        }
        let http_tls = config.tls.as_ref().map(http_tls).transpose()?;
        let http_listener = |l: TcpListener, door| match &http_tls {
            Some(acceptor) => {
                http::GatedListener::tls(l, Arc::clone(&gate), door, acceptor.clone())
            }
            None => http::GatedListener::new(l, Arc::clone(&gate), door),
        };
        let rpc = metrics::RpcStats::new();
        let sessions = tokio_util::task::TaskTracker::new();
        let service = Service::new(
            Arc::clone(&broker),
            sessions.clone(),
            Arc::clone(&config.auth),
        );
        let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics_task = metrics.map(|(l, _)| {
            let registry = metrics::registry(metrics::Sources {
                broker: Arc::clone(&broker),
                recovery: report.elapsed,
                replayed: report.replayed,
                gate: Arc::clone(&gate),
                consumers: Arc::clone(service.consumers()),
                rpc: Arc::clone(&rpc),
            });
            let l = http_listener(l, conns::Door::Metrics);
            let app = metrics::router(registry, config.metrics_token.as_deref());
            tokio::spawn(http::serve(l, app, async move {
                let _ = metrics_stopped.await;
            }))
        });
        let (stop_sweeper, sweeper_stopped) = tokio::sync::oneshot::channel::<()>();
        let sweeper = tokio::spawn(Arc::clone(&broker).sweep(async move {
            let _ = sweeper_stopped.await;
        }));
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in SERVICE_NAMES {
            health
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
        }
        let mut failure = broker.store().failure();
        let drain = tokio_util::sync::CancellationToken::new();
        let drain_tx = drain.clone();
        let b = Arc::clone(&broker);
        let grace = config.shutdown_grace;
        // Resolves when the server must stop now: the shutdown request (or
        // a storage failure) plus the grace period for calls in flight.
        let deadline = async move {
            tokio::select! {
                () = shutdown => tracing::info!("shutting down: finishing calls in flight"),
                _ = failure.wait_for(Option::is_some) => tracing::error!("storage failed: stopping"),
            }
            b.begin_shutdown();
            // Health checkers stop sending new work while calls drain.
            for name in SERVICE_NAMES {
                health
                    .set_service_status(name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
            drain_tx.cancel();
            tokio::time::sleep(grace).await;
        };
        // The Anypoint MQ REST facade, on the same engine, drained with
        // gRPC (its long polls end when the engine begins shutting down).
        let rest = anypoint.map(|(l, _)| {
            let app = crate::anypoint::router_with(
                Arc::clone(&broker),
                Arc::clone(&config.auth),
                config.anypoint.clone(),
                Arc::clone(service.consumers()),
            );
            let stop = drain.clone();
            let l = http_listener(l, conns::Door::Rest);
            (
                drain.clone(),
                tokio::spawn(crate::anypoint::serve(l, app, async move {
                    stop.cancelled().await
                })),
            )
        });
        // The SQS endpoint, drained with the REST facade.
        let sqs_task = sqs.map(|(l, _)| {
            let stop = drain.clone();
            let l = http_listener(l, conns::Door::Sqs);
            let opts = crate::sqs::SqsOptions {
                tls: config.tls.is_some(),
                ..config.sqs.clone()
            };
            let (broker, auth) = (Arc::clone(&broker), Arc::clone(&config.auth));
            tokio::spawn(crate::sqs::serve(l, broker, auth, opts, async move {
                stop.cancelled().await
            }))
        });
        // The web console, drained with the REST facade.
        let console_task = console.map(|(l, _)| {
            let stop = drain.clone();
            let l = http_listener(l, conns::Door::Console);
            let opts = crate::console::ConsoleOptions {
                tls: config.tls.is_some(),
                sample_every: config.console_sample_every,
            };
            let (broker, auth) = (Arc::clone(&broker), Arc::clone(&config.auth));
            tokio::spawn(crate::console::serve(l, broker, auth, opts, async move {
                stop.cancelled().await
            }))
        });
        let limit = config.max_request_bytes;
        let incoming = Box::pin(conns::incoming(listener, Arc::clone(&gate)));
        // Reflection in both versions: `v1`, and `v1alpha`, which most
        // grpcurl and grpcui builds in use still ask for. The health
        // service is described too.
        let reflection_builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(crate::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection = reflection_builder()
            .build_v1()
            .map_err(|e| ServerError::StorageFailed(format!("reflection: {e}")))?;
        let reflection_v1alpha = reflection_builder()
            .build_v1alpha()
            .map_err(|e| ServerError::StorageFailed(format!("reflection: {e}")))?;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &config.tls {
            builder = builder.tls_config(tls_config(tls))?;
        }
        let serving = builder
            // A span per call (at debug level: free unless enabled), with
            // the method, and the caller once known; handlers' events carry
            // it.
            .trace_fn(|req| {
                tracing::debug_span!(
                    "call",
                    method = %req.uri().path(),
                    principal = tracing::field::Empty
                )
            })
            .layer(calls::CallsLayer::new(
                Arc::clone(&gate),
                rpc,
                config.limits.request_timeout,
            ))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .max_concurrent_streams(config.limits.max_concurrent_streams)
            .concurrency_limit_per_connection(config.limits.concurrency_per_connection)
            .timeout(config.limits.request_timeout)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(
                AdminServiceServer::new(service.clone())
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(usize::MAX),
            )
            .add_service(
                MessagingServiceServer::new(service)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(usize::MAX),
            )
            .serve_with_incoming_shutdown(incoming, async move {
                drain.cancelled().await;
            });
        let served = tokio::select! {
            r = serving => r,
            () = deadline => {
                tracing::warn!(grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX), "calls or connections still open after the grace period; closing them");
                Ok(())
            }
        };
        if let Some((stop, mut rest)) = rest {
            // Calls in flight finish within the grace period (the drain
            // began already unless gRPC stopped on its own).
            stop.cancel();
            if tokio::time::timeout(grace, &mut rest).await.is_err() {
                tracing::warn!("anypoint calls still open after the grace period; closing them");
                rest.abort();
                let _ = rest.await;
            }
        }
        if let Some(mut t) = sqs_task
            && tokio::time::timeout(grace, &mut t).await.is_err()
        {
            tracing::warn!("SQS calls still open after the grace period; closing them");
            t.abort();
            let _ = t.await;
        }
        if let Some(mut console) = console_task
            && tokio::time::timeout(grace, &mut console).await.is_err()
        {
            tracing::warn!("console requests still open after the grace period; closing them");
            console.abort();
            let _ = console.await;
        }
        // Subscription sessions return their unsettled deliveries before
        // the store closes.
        sessions.close();
        if tokio::time::timeout(grace, sessions.wait()).await.is_err() {
            tracing::warn!("subscriptions still closing after the grace period");
        }
        let _ = stop_sweeper.send(());
        let _ = sweeper.await;
        let _ = stop_metrics.send(());
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        let failed = broker.store().failure().borrow().clone();
        match Arc::try_unwrap(broker) {
            Ok(b) => {
                if let Err(e) = b.close() {
                    tracing::error!(error = %e, "closing the store failed");
                }
            }
            Err(_) => tracing::warn!(
                "engine still in use at shutdown; the store closes when it is dropped"
            ),
        }
        served?;
        match failed {
            Some(reason) => Err(ServerError::StorageFailed(reason)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod publish_stream_tests;
