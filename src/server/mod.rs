//! The gRPC server: tonic lives here (and in `client/`).
//!
//! [`Server::start`] opens the data directory (recovery included), builds
//! the engine, binds the listener and starts the sweeper;
//! [`Server::serve`] answers calls until the shutdown future resolves or
//! the storage fails, then drains in-flight calls, stops the sweeper and
//! closes the store (apply and checkpoint).

mod convert;
mod publish_stream;
mod redrive;
mod service;
mod status;
mod subscribe;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::clock::Clock;
use crate::pb::admin_service_server::AdminServiceServer;
use crate::pb::messaging_service_server::MessagingServiceServer;
use crate::queue::{Broker, BrokerOptions, QueueError};
use crate::storage::{OpenReport, StorageError, Store, StoreOptions};

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
            broker,
        }
    }
}

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data directory could not be opened or recovered.
    #[error("cannot open the data directory: {0}")]
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
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The storage stopped after an I/O error (fail-stop).
    #[error("storage failed, the server stopped: {0}")]
    StorageFailed(String),
}

/// A started server.
pub struct Server {
    broker: Arc<Broker>,
    listener: TcpListener,
    addr: SocketAddr,
    config: ServerConfig,
    report: OpenReport,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Opens the data directory, recovers, and binds the listener.
    pub async fn start(config: ServerConfig, clock: Arc<dyn Clock>) -> Result<Server, ServerError> {
        let dir = config.data_dir.clone();
        let db_dir = dir.join("db");
        let store_opts = config.store.clone();
        let broker_opts = config.broker.clone();
        // Opening replays the log and scans the database: blocking work.
        let (broker, report) = tokio::task::spawn_blocking(move || {
            let (store, report) = Store::open(&dir, store_opts)?;
            let broker = Broker::open(store, clock, broker_opts)?;
            Ok::<_, ServerError>((broker, report))
        })
        .await
        .map_err(|e| {
            // sled panics on some damage instead of returning an error.
            let why = if e.is_panic() {
                let p = e.into_panic();
                p.downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into())
            } else {
                e.to_string()
            };
            ServerError::Open(StorageError::Corrupt {
                what: db_dir.display().to_string(),
                reason: format!(
                    "reading it failed ({why}): the database is damaged (see letterbox verify)"
                ),
            })
        })??;
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
        Ok(Server {
            broker: Arc::new(broker),
            listener,
            addr,
            config,
            report,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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
            config,
            ..
        } = self;
        let (stop_sweeper, sweeper_stopped) = tokio::sync::oneshot::channel::<()>();
        let sweeper = tokio::spawn(Arc::clone(&broker).sweep(async move {
            let _ = sweeper_stopped.await;
        }));
        let mut failure = broker.store().failure();
        let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
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
            let _ = drain_tx.send(());
            tokio::time::sleep(grace).await;
        };
        let sessions = tokio_util::task::TaskTracker::new();
        let service = Service::new(Arc::clone(&broker), sessions.clone());
        let limit = config.max_request_bytes;
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let serving = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
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
                let _ = drain_rx.await;
            });
        let served = tokio::select! {
            r = serving => r,
            () = deadline => {
                tracing::warn!(grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX), "calls or connections still open after the grace period; closing them");
                Ok(())
            }
        };
        // Subscription sessions return their unsettled deliveries before
        // the store closes.
        sessions.close();
        if tokio::time::timeout(grace, sessions.wait()).await.is_err() {
            tracing::warn!("subscriptions still closing after the grace period");
        }
        let _ = stop_sweeper.send(());
        let _ = sweeper.await;
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
