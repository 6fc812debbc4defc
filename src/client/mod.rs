//! The Rust client of Letterbox: [`Client`] for every call, [`Publisher`]
//! for batched publishing, [`Subscription`] for the push stream, and
//! [`Subscriber`] with the prefetch and polling strategies, ack modes, a
//! circuit breaker, and FIFO order kept with several handlers at once.
//!
//! This module depends on the generated protobuf types (`crate::pb`) and
//! nothing else of the server.
//!
//! ```no_run
//! use letterbox::client::{Client, pb};
//!
//! # async fn demo() -> Result<(), letterbox::client::ClientError> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! client.create_queue("jobs", pb::QueueConfig::default()).await?;
//! client.publish("jobs", vec![Client::message("hello")]).await?;
//! for d in client.receive("jobs", 10, std::time::Duration::from_secs(1)).await? {
//!     println!("{}", String::from_utf8_lossy(&d.body));
//!     client.ack(vec![d.ack_token]).await?;
//! }
//! # Ok(())
//! # }
//! ```

mod ack_mode;
mod admin;
mod circuit;
mod error;
mod fifo;
mod publisher;
mod stream;
mod subscriber;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use crate::pb;
use crate::pb::admin_service_client::AdminServiceClient;
use crate::pb::messaging_service_client::MessagingServiceClient;
use tonic_health::pb::health_client::HealthClient;

/// The status code of a failed call, as [`ErrorKind::Rpc`] carries it.
pub use tonic::Code;

pub use ack_mode::{AckMode, HandlerError, Message};
pub use circuit::{CircuitBreaker, CircuitConfig, CircuitState};
pub use error::{ClientError, ErrorKind, Result, code_name};
pub use publisher::{Publisher, PublisherConfig};
pub use stream::{Settler, Subscription};
pub use subscriber::{
    Schedule, Strategy, Subscriber, SubscriberConfig, SubscriberHandle, SubscriberStats,
};

/// How the client retries calls that fail with UNAVAILABLE.
///
/// A call that may be retried keeps its request for the next attempt, so
/// each attempt but the last possible one sends a copy; a call that cannot
/// be (one attempt, or a publish without message ids) sends the request
/// as given.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Wait before the first retry; doubled each time.
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// Credentials the client presents on every call.
#[derive(Clone)]
pub enum Credentials {
    /// A bearer token.
    Token(String),
    /// A client id and secret.
    ClientSecret {
        /// The client id.
        id: String,
        /// The secret.
        secret: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Token(..)"),
            Credentials::ClientSecret { id, .. } => write!(f, "ClientSecret({id:?}, ..)"),
        }
    }
}

impl Credentials {
    fn header(&self) -> Result<MetadataValue<Ascii>> {
        use base64::Engine as _;
        let text = match self {
            Credentials::Token(t) => format!("Bearer {t}"),
            Credentials::ClientSecret { id, secret } => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"))
            ),
        };
        text.parse().map_err(|_| {
            ClientError::new(
                ErrorKind::InvalidArgument,
                "credentials must be printable ASCII",
            )
        })
    }
}

/// TLS settings of the connection (PEM contents). The endpoint must be
/// `https://`.
#[derive(Clone, Default)]
pub struct TlsSettings {
    /// CA certificates to trust for the server's certificate (the system's
    /// roots are not used).
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (mTLS).
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to check the server's certificate against, when not the
    /// endpoint's host.
    pub domain: Option<String>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca_pem.is_some())
            .field("identity", &self.identity_pem.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

/// Adds the `authorization` header to every call.
#[derive(Clone, Debug)]
pub struct AuthHeader(Option<MetadataValue<Ascii>>);

impl Interceptor for AuthHeader {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// The transport under the generated clients.
pub(crate) type Transport = InterceptedService<Channel, AuthHeader>;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server address, e.g. `http://127.0.0.1:50051`; or several,
    /// separated by commas (`http://a:50051,http://b:50051`): the nodes of
    /// a highly available pair, tried in order (see [`Client`]).
    pub endpoint: String,
    /// Limit for establishing the connection.
    pub connect_timeout: Duration,
    /// Limit for one unary call (a long poll gets its wait on top).
    pub request_timeout: Duration,
    /// Retries on UNAVAILABLE (each one on the next server when there are
    /// several).
    pub retry: RetryPolicy,
    /// Credentials for a server with authentication on.
    pub credentials: Option<Credentials>,
    /// TLS, for an `https://` endpoint.
    pub tls: Option<TlsSettings>,
}

impl ClientConfig {
    /// The server addresses of [`ClientConfig::endpoint`], in order.
    pub fn endpoints(&self) -> Vec<&str> {
        endpoints(&self.endpoint)
    }

    /// Defaults for an endpoint: 5 s to connect, 30 s per call, 5 attempts.
    pub fn new(endpoint: impl Into<String>) -> ClientConfig {
        ClientConfig {
            endpoint: endpoint.into(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            credentials: None,
            tls: None,
        }
    }
}

/// A connection to a Letterbox server. Cheap to clone; clones share the
/// connection (HTTP/2 multiplexes calls).
///
/// Retries: calls that fail with UNAVAILABLE or are cut by the connection
/// (server restarting) are retried with exponential backoff — except a publish with
/// messages that have no client-chosen id, which could be stored twice;
/// give messages ids (see [`Client::message_with_id`]) to make publishes
/// safe to retry.
///
/// Failover: given several servers (a node that owns the queues and a
/// standby waiting to take over), the client connects to the first that
/// answers and stays with it; a call that fails with UNAVAILABLE or a
/// broken connection moves every clone of the client to the next server
/// and, when it is safe to repeat, is retried there. A standby answers
/// UNAVAILABLE until it has taken over, so the client settles on whichever
/// node serves.
#[derive(Clone, Debug)]
pub struct Client {
    nodes: Arc<[Node]>,
    /// The node calls go to.
    active: Arc<AtomicUsize>,
    config: Arc<ClientConfig>,
}

/// One server of the client's list, with its own connection.
#[derive(Clone, Debug)]
struct Node {
    endpoint: String,
    admin: AdminServiceClient<Transport>,
    msg: MessagingServiceClient<Transport>,
    health: HealthClient<Transport>,
}

impl Client {
    /// Connects with default settings.
    pub async fn connect(endpoint: impl Into<String>) -> Result<Client> {
        Client::with_config(ClientConfig::new(endpoint)).await
    }

    /// Connects with the given settings: to the first server that answers
    /// (the others connect when a failover needs them).
    pub async fn with_config(config: ClientConfig) -> Result<Client> {
        check_endpoint(&config.endpoint)?;
        let auth = AuthHeader(
            config
                .credentials
                .as_ref()
                .map(Credentials::header)
                .transpose()?,
        );
        let endpoints: Vec<Endpoint> = config
            .endpoints()
            .into_iter()
            .map(|e| endpoint(&config, e))
            .collect::<Result<_>>()?;
        let mut attempt = 1;
        let (first, channel) = 'connect: loop {
            let mut last = None;
            for (i, e) in endpoints.iter().enumerate() {
                match e.connect().await {
                    Ok(c) => break 'connect (i, c),
                    Err(err) => {
                        tracing::debug!(error = %err, endpoint = %e.uri(), attempt, "connect failed");
                        last = Some((i, err));
                    }
                }
            }
            let Some((i, err)) = last else {
                return Err(ClientError::new(
                    ErrorKind::InvalidArgument,
                    "no server address given",
                ));
            };
            if attempt >= config.retry.max_attempts {
                return Err(ClientError::transport(config.endpoints()[i], &err));
            }
            tokio::time::sleep(backoff(&config.retry, attempt)).await;
            attempt += 1;
        };
        let limit = 256 << 20;
        let nodes: Vec<Node> = endpoints
            .iter()
            .zip(config.endpoints())
            .enumerate()
            .map(|(i, (e, name))| {
                let channel = if i == first {
                    channel.clone()
                } else {
                    e.connect_lazy()
                };
                Node {
                    endpoint: name.to_string(),
                    admin: AdminServiceClient::with_interceptor(channel.clone(), auth.clone())
                        .max_decoding_message_size(limit),
                    msg: MessagingServiceClient::with_interceptor(channel.clone(), auth.clone())
                        .max_decoding_message_size(limit),
                    health: HealthClient::with_interceptor(channel, auth.clone()),
                }
            })
            .collect();
        Ok(Client {
            nodes: nodes.into(),
            active: Arc::new(AtomicUsize::new(first)),
            config: Arc::new(config),
        })
    }

    /// The server calls go to now (one of [`ClientConfig::endpoints`]).
    pub fn endpoint(&self) -> &str {
        &self.node().endpoint
    }

    fn node(&self) -> &Node {
        &self.nodes[self.active.load(Ordering::Acquire) % self.nodes.len()]
    }

    /// Whether the server in use serves `service` ("" for the server as
    /// a whole, or `letterbox.v1.MessagingService`,
    /// `letterbox.v1.AdminService`), as its `grpc.health.v1.Health/Check`
    /// answers: `true` for SERVING; `false` for NOT_SERVING (a server
    /// shutting down) or a status it does not know. A service the server
    /// does not have is an error (`NotFound`).
    pub async fn serving(&self, service: &str) -> Result<bool> {
        use tonic_health::pb::HealthCheckRequest;
        use tonic_health::pb::health_check_response::ServingStatus;
        let answer = self
            .node()
            .health
            .clone()
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await?
            .into_inner();
        Ok(answer.status == ServingStatus::Serving as i32)
    }

    /// The admin stub of the server in use.
    fn admin(&self) -> AdminServiceClient<Transport> {
        self.node().admin.clone()
    }

    /// The messaging stub of the server in use.
    fn msg(&self) -> MessagingServiceClient<Transport> {
        self.node().msg.clone()
    }

    /// A call to node `from` failed as if the server were gone: the next
    /// server takes over for every clone (once, however many calls saw the
    /// same failure).
    fn fail_over(&self, from: usize) {
        let n = self.nodes.len();
        if n > 1 {
            let next = (from + 1) % n;
            if self
                .active
                .compare_exchange(from, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                tracing::info!(
                    from = %self.nodes[from].endpoint,
                    to = %self.nodes[next].endpoint,
                    "server unavailable; failing over"
                );
            }
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// A message with a body and nothing else.
    pub fn message(body: impl Into<Vec<u8>>) -> pb::PublishMessage {
        pb::PublishMessage {
            body: body.into().into(),
            ..Default::default()
        }
    }

    /// A message with a client-chosen id (publishing it again is an
    /// idempotent repeat).
    pub fn message_with_id(id: impl Into<String>, body: impl Into<Vec<u8>>) -> pb::PublishMessage {
        pb::PublishMessage {
            message_id: id.into(),
            ..Client::message(body)
        }
    }

    /// Runs a call with the request timeout and retries on UNAVAILABLE
    /// (failing over to the next server first, when there are several).
    async fn call<T, F, Fut>(&self, retry: bool, extra: Duration, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_with(retry, extra, (), |()| f()).await
    }

    /// [`Client::call`] with the request handed to `f`: an attempt that
    /// may be followed by another gets a copy of it, the last possible
    /// attempt the request itself. So a call that is not retried (`retry`
    /// false, or a policy of one attempt) copies nothing.
    async fn call_with<R, T, F, Fut>(&self, retry: bool, extra: Duration, req: R, f: F) -> Result<T>
    where
        R: Clone,
        F: Fn(R) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut attempt = 1;
        while retry && attempt < self.config.retry.max_attempts {
            let at = self.active.load(Ordering::Acquire) % self.nodes.len();
            let s = match self.attempt(at, extra, f(req.clone())).await {
                Ok(r) => return Ok(r),
                Err(s) => s,
            };
            if !retryable(&s) {
                return Err(ClientError::from_call(&self.nodes[at].endpoint, s));
            }
            tracing::debug!(status = %s.message(), attempt, "server unavailable; retrying");
            // The next server of a list is tried at once; a wait comes once
            // the list has been gone round.
            let wrapped = self.active.load(Ordering::Acquire) % self.nodes.len() <= at;
            if wrapped {
                tokio::time::sleep(backoff(&self.config.retry, attempt)).await;
            }
            attempt += 1;
        }
        let at = self.active.load(Ordering::Acquire) % self.nodes.len();
        self.attempt(at, extra, f(req))
            .await
            .map_err(|s| ClientError::from_call(&self.nodes[at].endpoint, s))
    }

    /// One attempt of a call to node `at`, within the request timeout
    /// (plus `extra`); a failure as if the server were gone moves the
    /// client to the next server.
    async fn attempt<T>(
        &self,
        at: usize,
        extra: Duration,
        call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> std::result::Result<T, tonic::Status> {
        let limit = self.config.request_timeout + extra;
        let outcome = match tokio::time::timeout(limit, call).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {} ms",
                limit.as_millis()
            ))),
        };
        outcome.map(tonic::Response::into_inner).inspect_err(|s| {
            if retryable(s) {
                self.fail_over(at);
            }
        })
    }

    // ---- messaging --------------------------------------------------------

    /// Publishes a batch of messages (all or nothing). Retried on
    /// UNAVAILABLE only when every message has a client-chosen id.
    pub async fn publish(
        &self,
        queue: &str,
        messages: Vec<pb::PublishMessage>,
    ) -> Result<Vec<pb::PublishResult>> {
        let retry = messages.iter().all(|m| !m.message_id.is_empty());
        let req = pb::PublishRequest {
            queue: queue.into(),
            messages,
            exchange: String::new(),
        };
        let r = self
            .call_with(retry, Duration::ZERO, req, |req| {
                let mut c = self.msg();
                async move { c.publish(req).await }
            })
            .await?;
        Ok(r.results)
    }

    /// Publishes through an exchange: each message into every bound queue
    /// whose filter matches, atomically. Retried on UNAVAILABLE only when
    /// every message has a client-chosen id.
    pub async fn publish_to_exchange(
        &self,
        exchange: &str,
        messages: Vec<pb::PublishMessage>,
    ) -> Result<Vec<pb::PublishResult>> {
        let retry = messages.iter().all(|m| !m.message_id.is_empty());
        let req = pb::PublishRequest {
            queue: String::new(),
            messages,
            exchange: exchange.into(),
        };
        let r = self
            .call_with(retry, Duration::ZERO, req, |req| {
                let mut c = self.msg();
                async move { c.publish(req).await }
            })
            .await?;
        Ok(r.results)
    }

    /// A batching publisher for one queue.
    pub fn publisher(&self, queue: &str, config: PublisherConfig) -> Publisher {
        Publisher::start(self.clone(), queue.to_string(), config)
    }

    /// Leases up to `max` messages, waiting up to `wait` for the first.
    pub async fn receive(
        &self,
        queue: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<pb::Delivery>> {
        self.receive_with(pb::ReceiveRequest {
            queue: queue.into(),
            max_messages: max,
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            ..Default::default()
        })
        .await
    }

    /// Receives with every option of the request. With `ack_tokens`, a
    /// receive that fails after the acks took effect is an error like any
    /// other here (their outcomes are lost to the caller): use
    /// [`Client::receive_response`] to read them.
    pub async fn receive_with(&self, req: pb::ReceiveRequest) -> Result<Vec<pb::Delivery>> {
        let r = self.receive_response(req).await?;
        if r.receive_code != 0 {
            return Err(ClientError::new(
                ErrorKind::Rpc(Code::from(r.receive_code)),
                r.receive_error,
            ));
        }
        Ok(r.deliveries)
    }

    /// [`Client::receive_with`] returning the whole answer: with
    /// `ack_tokens` in the request (acks riding on the receive), the
    /// deliveries and `ack_results`, one per token in request order. The
    /// acks' outcomes are there even when the receive failed after they
    /// took effect: `receive_code` is then not 0 and `receive_error` says
    /// why.
    pub async fn receive_response(&self, req: pb::ReceiveRequest) -> Result<pb::ReceiveResponse> {
        let extra = Duration::from_millis(req.wait_ms);
        self.call_with(true, extra, req, |req| {
            let mut c = self.msg();
            async move { c.receive(req).await }
        })
        .await
    }

    /// Acknowledges deliveries; one result per token.
    pub async fn ack(&self, tokens: Vec<String>) -> Result<Vec<pb::SettleResult>> {
        let req = pb::AckRequest { ack_tokens: tokens };
        let r = self
            .call_with(true, Duration::ZERO, req, |req| {
                let mut c = self.msg();
                async move { c.ack(req).await }
            })
            .await?;
        Ok(r.results)
    }

    /// Rejects deliveries; one result per item.
    pub async fn nack(&self, items: Vec<pb::NackItem>) -> Result<Vec<pb::SettleResult>> {
        Ok(self.nack_releasing(items).await?.0)
    }

    /// [`Client::nack`] that also returns the FIFO deliveries the nacks
    /// released: later messages of a failed message's group that were
    /// leased with it, which must not be acked (SPEC §3).
    pub async fn nack_releasing(
        &self,
        items: Vec<pb::NackItem>,
    ) -> Result<(Vec<pb::SettleResult>, Vec<pb::ReleasedDelivery>)> {
        let req = pb::NackRequest { items };
        let r = self
            .call_with(true, Duration::ZERO, req, |req| {
                let mut c = self.msg();
                async move { c.nack(req).await }
            })
            .await?;
        Ok((r.results, r.released))
    }

    /// Extends leases; one result (with the new deadline) per item.
    pub async fn extend(&self, items: Vec<pb::ExtendItem>) -> Result<Vec<pb::SettleResult>> {
        let req = pb::ExtendLeaseRequest { items };
        let r = self
            .call_with(true, Duration::ZERO, req, |req| {
                let mut c = self.msg();
                async move { c.extend_lease(req).await }
            })
            .await?;
        Ok(r.results)
    }

    /// Opens a push subscription holding at most `credit` unsettled
    /// deliveries. Not retried here; a server that is gone moves the
    /// client to the next one for the next attempt.
    pub async fn subscribe(
        &self,
        queue: &str,
        credit: u32,
        ack_timeout: Option<Duration>,
    ) -> Result<Subscription> {
        let at = self.active.load(Ordering::Acquire) % self.nodes.len();
        let opened = Subscription::open(self.msg(), queue, credit, ack_timeout).await;
        if let Err(e) = &opened
            && e.is_retryable()
        {
            // The next subscribe (a subscriber's reconnect) goes to the
            // next server.
            self.fail_over(at);
        }
        opened
    }
}

/// The addresses of a comma-separated list, trimmed, in order.
fn endpoints(list: &str) -> Vec<&str> {
    list.split(',').map(str::trim).collect()
}

/// The connection settings of one server address.
fn endpoint(config: &ClientConfig, address: &str) -> Result<Endpoint> {
    let mut endpoint = Endpoint::from_shared(address.to_string())
        .map_err(|e| {
            ClientError::new(
                ErrorKind::InvalidArgument,
                format!("endpoint {address:?}: {e}"),
            )
        })?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true);
    if let Some(tls) = &config.tls {
        let mut t = ClientTlsConfig::new();
        if let Some(ca) = &tls.ca_pem {
            t = t.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &tls.identity_pem {
            t = t.identity(Identity::from_pem(cert, key));
        }
        if let Some(d) = &tls.domain {
            t = t.domain_name(d.clone());
        }
        endpoint = endpoint
            .tls_config(t)
            .map_err(|e| ClientError::transport(address, &e))?;
    }
    Ok(endpoint)
}

/// Checks that an endpoint is a URL with the `http` or `https` scheme (a
/// bare `HOST:PORT` is the commonest slip), naming what to write instead;
/// or a comma-separated list of such URLs.
pub fn check_endpoint(endpoint: &str) -> Result<()> {
    let list = endpoints(endpoint);
    if list.len() > 1 {
        for e in list {
            if e.is_empty() {
                return Err(ClientError::new(
                    ErrorKind::InvalidArgument,
                    format!("server addresses {endpoint:?}: an empty address between commas"),
                ));
            }
            check_endpoint(e)?;
        }
        return Ok(());
    }
    match endpoint.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(()),
        Some((scheme, _)) => Err(ClientError::new(
            ErrorKind::InvalidArgument,
            format!(
                "server address {endpoint:?}: scheme {scheme:?} is not http or https (plain text: http://HOST:PORT; TLS: https://HOST:PORT)"
            ),
        )),
        None => Err(ClientError::new(
            ErrorKind::InvalidArgument,
            format!(
                "server address {endpoint:?} has no scheme: write http://{endpoint} (or https://{endpoint} for a TLS server)"
            ),
        )),
    }
}

/// UNAVAILABLE, or a call cut by the connection (the server went away):
/// worth another attempt when the call is safe to repeat.
fn retryable(s: &tonic::Status) -> bool {
    s.code() == Code::Unavailable
        || std::error::Error::source(s).is_some_and(|e| e.is::<tonic::transport::Error>())
}

fn missing(what: &str) -> ClientError {
    ClientError::new(
        ErrorKind::Rpc(Code::Internal),
        format!("the server's answer has no {what}"),
    )
}

fn backoff(p: &RetryPolicy, attempt: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(16));
    p.initial_backoff.saturating_mul(factor).min(p.max_backoff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A request that counts how often it was copied.
    struct Counted(Arc<AtomicU32>);

    impl Clone for Counted {
        fn clone(&self) -> Self {
            self.0.fetch_add(1, Ordering::Relaxed);
            Counted(self.0.clone())
        }
    }

    /// A client of one server that is never connected to (the calls
    /// below do not use the connection).
    async fn client(max_attempts: u32) -> Client {
        let mut config = ClientConfig::new("http://127.0.0.1:9");
        config.retry = RetryPolicy {
            max_attempts,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        };
        let channel = endpoint(&config, "http://127.0.0.1:9")
            .unwrap()
            .connect_lazy();
        let auth = AuthHeader(None);
        Client {
            nodes: vec![Node {
                endpoint: config.endpoint.clone(),
                admin: AdminServiceClient::with_interceptor(channel.clone(), auth.clone()),
                msg: MessagingServiceClient::with_interceptor(channel.clone(), auth.clone()),
                health: HealthClient::with_interceptor(channel, auth),
            }]
            .into(),
            active: Arc::new(AtomicUsize::new(0)),
            config: Arc::new(config),
        }
    }

    /// Runs one call whose every attempt fails with UNAVAILABLE (or
    /// succeeds, with `ok`): (attempts, copies of the request).
    async fn run(max_attempts: u32, retry: bool, ok: bool) -> (u32, u32) {
        let c = client(max_attempts).await;
        let copies = Arc::new(AtomicU32::new(0));
        let attempts = AtomicU32::new(0);
        let r = c
            .call_with(
                retry,
                Duration::ZERO,
                Counted(copies.clone()),
                |_req: Counted| {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    async move {
                        if ok {
                            Ok(tonic::Response::new(()))
                        } else {
                            Err(tonic::Status::unavailable("down"))
                        }
                    }
                },
            )
            .await;
        assert_eq!(r.is_ok(), ok);
        (
            attempts.load(Ordering::Relaxed),
            copies.load(Ordering::Relaxed),
        )
    }

    #[tokio::test]
    async fn a_call_that_cannot_be_retried_sends_its_request_without_a_copy() {
        assert_eq!(run(1, true, true).await, (1, 0));
        assert_eq!(run(1, true, false).await, (1, 0));
        assert_eq!(run(5, false, true).await, (1, 0));
        assert_eq!(run(5, false, false).await, (1, 0));
    }

    #[tokio::test]
    async fn a_retried_call_copies_its_request_for_every_attempt_but_the_last() {
        // Kept for a retry that did not come.
        assert_eq!(run(5, true, true).await, (1, 1));
        assert_eq!(run(3, true, false).await, (3, 2));
    }
}
