//! What the front ends share, and nothing of any one of them: the audit
//! log (`audit`), connection caps and deadlines over every listener
//! (`conns`), the HTTP listeners served with hyper (`http`), TLS settings
//! (`tls`), who consumes each queue (`consumers`), the HTTP status of
//! an engine error (`status`), and the SQS message move tasks a dead
//! letter queue keeps (`move_tasks`: the SQS endpoint runs them, the
//! console shows and stops them). [`Shared`] is what the composition root
//! (`crate::server`) hands each front end it starts.

pub(crate) mod audit;
pub(crate) mod conns;
pub(crate) mod consumers;
pub(crate) mod http;
pub(crate) mod move_tasks;
pub(crate) mod status;
pub(crate) mod tls;

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::auth::Authenticator;
use crate::queue::Broker;

/// What every front end is started with: the engine, who may do what,
/// the caps its connections count against, who consumes each queue, and
/// the TLS acceptor of the HTTP listeners (when TLS is on).
#[derive(Clone)]
pub(crate) struct Shared {
    /// The engine.
    pub(crate) broker: Arc<Broker>,
    /// Who may do what.
    pub(crate) auth: Arc<Authenticator>,
    /// The connection caps and deadlines of every listener.
    pub(crate) gate: Arc<conns::Gate>,
    /// Who consumes each queue (for the metrics).
    pub(crate) consumers: Arc<consumers::Consumers>,
    /// TLS for the HTTP listeners, when it is on.
    pub(crate) http_tls: Option<tokio_rustls::TlsAcceptor>,
    /// Where gRPC is served (`http://127.0.0.1:50051`), for what the HTTP
    /// listeners answer a gRPC call made to them.
    pub(crate) grpc_url: String,
}

impl Shared {
    /// The HTTP listener `door` on `listener`, under the gate, with TLS
    /// when it is on.
    pub(crate) fn http_listener(
        &self,
        listener: TcpListener,
        door: conns::Door,
    ) -> http::GatedListener {
        let gate = Arc::clone(&self.gate);
        let not_grpc = http::NotGrpc::new(door.name(), &self.grpc_url);
        match &self.http_tls {
            Some(acceptor) => {
                http::GatedListener::tls(listener, gate, door, acceptor.clone(), not_grpc)
            }
            None => http::GatedListener::new(listener, gate, door, not_grpc),
        }
    }
}
