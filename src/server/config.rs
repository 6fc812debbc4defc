//! What the server is started with ([`ServerConfig`]), and why it could
//! not start or stopped ([`ServerError`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::anypoint::AnypointOptions;
use crate::auth::Authenticator;
use crate::edge::conns::Limits;
use crate::edge::tls::TlsConfig;
use crate::queue::{BrokerOptions, QueueError};
use crate::storage::{StorageError, StoreOptions};

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
    /// Each queue's figures in `/metrics` too, not only at
    /// `/metrics/per-queue`.
    pub metrics_per_queue: bool,
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
            metrics_per_queue: false,
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
    /// PostgreSQL (`--store`) could not be reached or did not accept
    /// the session: the cause in words where it is known.
    #[error("cannot reach PostgreSQL at {target}: {cause} ({detail})")]
    PgUnreachable {
        /// The hosts tried (the URL without its password).
        target: String,
        /// The cause in words, and what to check.
        cause: String,
        /// PostgreSQL's or the connection's own words.
        detail: String,
    },
    /// Another node owns the queues and this one was not started as a
    /// standby.
    #[error(
        "another node, {owner:?} (epoch {epoch}), owns the queues in PostgreSQL at {target} \
         for another {left_ms} ms: start this node with --standby to wait and take over once \
         that lease lapses (both nodes of a pair run with --standby), or stop the other node"
    )]
    LeaseHeld {
        /// The hosts (the URL without its password).
        target: String,
        /// The owner's node name.
        owner: String,
        /// The owner's epoch.
        epoch: i64,
        /// What is left of its lease, in ms.
        left_ms: u64,
    },
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
    Transport(#[from] crate::grpc::TransportError),
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
