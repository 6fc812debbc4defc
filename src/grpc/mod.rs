//! The gRPC front end (tonic): the two services as thin handlers
//! (`service`, with the stream sessions `subscribe`, `publish_stream` and
//! `redrive`), credentials and grants (`access`), protobuf ⇄ model
//! (`convert`), engine errors → status codes (`status`), and the layer
//! that counts and times the calls (`calls`). [`serve`] starts it: the
//! services with health and reflection, on the listener the composition
//! root (`crate::server`) bound.

mod access;
mod calls;
pub(crate) mod convert;
mod publish_stream;
mod redrive;
mod service;
mod status;
mod subscribe;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic_health::ServingStatus;

use crate::edge::Shared;
use crate::edge::conns::{self, Door, Limits};
use crate::edge::tls::TlsConfig;
use crate::pb::admin_service_server::AdminServiceServer;
use crate::pb::messaging_service_server::MessagingServiceServer;

pub(crate) use calls::RpcStats;
pub(crate) use service::Service;

/// A failure of the gRPC transport (tonic's).
pub(crate) type TransportError = tonic::transport::Error;

/// How the gRPC front end serves.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// TLS, off when `None`.
    pub(crate) tls: Option<TlsConfig>,
    /// Streams and calls per connection, the unary calls' deadline.
    pub(crate) limits: Limits,
    /// Largest request decoded.
    pub(crate) max_request_bytes: usize,
}

/// Why the gRPC front end could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    /// The TLS settings could not be used.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The reflection service could not be built.
    #[error("reflection: {0}")]
    Reflection(String),
}

/// The gRPC front end being served.
pub(crate) struct Serving {
    /// Ends once the front end has stopped: after the stop, once the calls
    /// and connections in flight have ended.
    pub(crate) done: Pin<Box<dyn Future<Output = Result<(), TransportError>> + Send>>,
    /// The subscription sessions, to close and wait for after the calls
    /// (they give back the deliveries they hold).
    pub(crate) sessions: TaskTracker,
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

/// Health, reported SERVING for every name until `stop` is cancelled,
/// NOT_SERVING from then on (health checkers stop sending new work while
/// calls drain); resolves once it says so.
async fn health(
    stop: CancellationToken,
) -> (
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (reporter, service) = tonic_health::server::health_reporter();
    for name in SERVICE_NAMES {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let stopping = async move {
        stop.cancelled().await;
        for name in SERVICE_NAMES {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    };
    (service, stopping)
}

/// Serves gRPC on `listener`, the gate's `door`, over `shared`'s engine,
/// counting the calls in `rpc`, until `stop` is cancelled; then health
/// says NOT_SERVING, new connections are refused and the calls in flight
/// finish ([`Serving::done`]).
pub(crate) async fn serve(
    listener: TcpListener,
    door: Door,
    opts: &Options,
    shared: &Shared,
    rpc: Arc<RpcStats>,
    stop: CancellationToken,
) -> Result<Serving, StartError> {
    let gate = Arc::clone(&shared.gate);
    if opts.tls.is_some() {
        gate.set_tls();
    }
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
        .map_err(|e| StartError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| StartError::Reflection(e.to_string()))?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &opts.tls {
        builder = builder.tls_config(tls_config(tls))?;
    }
    let sessions = TaskTracker::new();
    let service = Service::new(
        Arc::clone(&shared.broker),
        sessions.clone(),
        Arc::clone(&shared.auth),
        Arc::clone(&shared.consumers),
    );
    let (health_service, stopping) = health(stop).await;
    let limit = opts.max_request_bytes;
    let limits = &opts.limits;
    let incoming = Box::pin(conns::incoming(listener, Arc::clone(&gate), door));
    let done = builder
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
        .layer(calls::CallsLayer::new(gate, rpc, limits.request_timeout))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .max_concurrent_streams(limits.max_concurrent_streams)
        .concurrency_limit_per_connection(limits.concurrency_per_connection)
        .timeout(limits.request_timeout)
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
        .serve_with_incoming_shutdown(incoming, stopping);
    Ok(Serving {
        done: Box::pin(done),
        sessions,
    })
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod publish_stream_tests;
