//! An Amazon SQS compatible endpoint over the engine, so that code, tests
//! and tools written for SQS (every AWS SDK, the AWS CLI, frameworks on
//! SQS) run against Letterbox by pointing `endpoint_url` at it.
//!
//! One HTTP/1.1 listener (`--sqs-listen`, on by default on loopback port
//! 9324 beside a loopback gRPC listener) serves both wire protocols
//! (`protocol.rs`: AWS JSON 1.0 and the query protocol) and every action
//! of the API (`queues.rs`: queues, attributes, tags, permissions;
//! `messages.rs`: send, receive, delete, visibility; `tasks.rs`: message
//! move tasks, the engine's redrive kept durably). Handlers are thin
//! like the gRPC ones: decode, authorize, call [`Broker`], encode.
//!
//! - A queue created over SQS is an ordinary Letterbox queue; SQS
//!   attributes map onto its configuration, and those the engine has no
//!   setting for are kept in its annotations (`attributes.rs`).
//! - Message attributes are properties, their types kept
//!   (`message_attrs.rs`, which also computes AWS's MD5 digests).
//! - Receipt handles are the engine's ack tokens. A handle whose
//!   visibility ran out, or of an earlier receive, still deletes its
//!   message and still changes the visibility of its current receive, as
//!   SQS does (`Broker::delete_leased`, `Broker::current_lease_of`).
//! - Queue URLs are `http://HOST:PORT/ACCOUNT/NAME`, resolved by the last
//!   part of their path whatever the host (a bare name works too); ARNs
//!   are `arn:aws:sqs:REGION:ACCOUNT:NAME`, the account from
//!   `--sqs-account-id`.
//! - Each region has its own queues (`regions.rs`): a request's region is
//!   its signature's (`--sqs-region` for unsigned ones, whose queues keep
//!   their plain names; another region's queue `NAME` is the Letterbox
//!   queue `REGION.NAME`).

mod attributes;
mod error;
mod message_attrs;
mod messages;
mod protocol;
mod queues;
mod regions;
mod sigv4;
pub(crate) mod tasks;

pub use sigv4::{Signer, sign};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::response::Response;
use serde_json::Value;

use crate::auth::{Action, Authenticator, Principal};
use crate::edge::audit;
use crate::edge::http::{GatedListener, Peer};
use crate::queue::Broker;

use error::SqsError;

/// The port the endpoint listens on by default (ElasticMQ's).
pub const DEFAULT_PORT: u16 = 9324;

/// Settings of the endpoint.
#[derive(Debug, Clone)]
pub struct SqsOptions {
    /// The account id in queue URLs and ARNs.
    pub account_id: String,
    /// The region of ARNs when a request is not signed.
    pub region: String,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// The listener serves HTTPS (queue URLs say `https`).
    pub tls: bool,
}

impl Default for SqsOptions {
    fn default() -> Self {
        SqsOptions {
            account_id: "000000000000".into(),
            region: "us-east-1".into(),
            max_body_bytes: 8 << 20,
            tls: false,
        }
    }
}

/// What every handler works with.
pub(crate) struct Sqs {
    broker: Arc<Broker>,
    auth: Arc<Authenticator>,
    opts: SqsOptions,
    /// Each region its own queues.
    regions: regions::Regions,
    /// When each queue was last purged (SQS allows one purge a minute).
    purges: Mutex<std::collections::HashMap<String, u64>>,
    /// `ReceiveRequestAttemptId`s of FIFO receives, for their retries.
    attempts: messages::Attempts,
}

impl std::fmt::Debug for Sqs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqs").field("opts", &self.opts).finish()
    }
}

/// One call being served.
pub(crate) struct Call {
    /// The `Host` the client used (queue URLs are built on it).
    host: String,
    /// The region of the request's signature, or the default.
    region: String,
    /// Who calls.
    principal: Arc<Principal>,
    /// From where.
    peer: Option<SocketAddr>,
    /// The action.
    action: String,
}

impl Sqs {
    fn now(&self) -> u64 {
        self.broker.clock().now_ms()
    }

    /// The Letterbox queue of the queue `name` of the call's region.
    fn engine(&self, call: &Call, name: &str) -> String {
        self.regions.engine(&call.region, name)
    }

    /// The URL of a Letterbox queue for this call.
    fn url(&self, call: &Call, engine: &str) -> String {
        let scheme = if self.opts.tls { "https" } else { "http" };
        let (_, name) = self.regions.split(&call.region, engine);
        format!("{scheme}://{}/{}/{name}", call.host, self.opts.account_id)
    }

    /// The ARN of a Letterbox queue for this call.
    fn arn(&self, call: &Call, engine: &str) -> String {
        let (region, name) = self.regions.split(&call.region, engine);
        attributes::arn(region, &self.opts.account_id, name)
    }

    /// The Letterbox queue an ARN names (`None`: not an SQS ARN).
    fn arn_queue(&self, arn: &str) -> Option<String> {
        attributes::arn_parts(arn).map(|(region, name)| self.regions.engine(region, name))
    }

    /// Checks a grant; a refusal is audited.
    fn allow(&self, call: &Call, action: Action, name: &str) -> Result<(), SqsError> {
        call.principal.check(action, name).map_err(|e| {
            audit::refused(self.who(call), action.name(), name, &e.to_string());
            SqsError::auth("AccessDenied", e.to_string())
        })
    }

    fn who<'a>(&self, call: &'a Call) -> audit::Who<'a> {
        audit::Who {
            principal: call.principal.name(),
            peer: call.peer,
        }
    }

    /// Records a destructive act in the audit log.
    fn audit(&self, call: &Call, name: &str, detail: &str) {
        audit::done(self.who(call), &call.action, name, detail);
    }
}

/// The queue name of a `QueueUrl` (the last part of its path, whatever
/// the host; a bare name is a name).
pub(crate) fn queue_name(url: &str) -> Result<String, SqsError> {
    let url = url.trim();
    let path = match url.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, p)| p),
        None => url,
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    match path.trim_end_matches('/').rsplit('/').next() {
        Some(name) if !name.is_empty() => Ok(name.to_string()),
        _ => Err(SqsError::no_queue()),
    }
}

/// A request id, as SQS gives one with every answer: a UUID-shaped
/// 128 bits, a random prefix taken once per process and a counter (unique
/// within the process, and unlikely to repeat across processes), cheap
/// enough for every request.
fn request_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let (t, _) = crate::auth::new_token();
        u64::from_str_radix(t.get(..16).unwrap_or("0"), 16).unwrap_or(0)
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let h = format!("{prefix:016x}{n:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The region of a request's SigV4 credential scope, if it is signed.
fn signed_region(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    let scope = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split("Credential=").nth(1))
        .map(str::to_string)
        .or_else(|| {
            query.and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "X-Amz-Credential")
                    .map(|(_, v)| v.into_owned())
            })
        })?;
    // AKID/DATE/REGION/sqs/aws4_request
    scope
        .split('/')
        .nth(2)
        .map(str::to_string)
        .filter(|r| !r.is_empty())
}

async fn handle(State(sqs): State<Arc<Sqs>>, req: axum::extract::Request) -> Response {
    let rid = request_id();
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map(|c| c.0.0);
    let (parts, body) = req.into_parts();
    let wire = protocol::wire(&parts.headers);
    let body = axum::body::to_bytes(body, sqs.opts.max_body_bytes).await;
    match serve_call(&sqs, &parts.method, &parts.uri, &parts.headers, peer, body).await {
        Ok((action, out)) => protocol::ok(wire, &action, &rid, &out),
        Err(e) => {
            tracing::debug!(code = e.code, message = %e.message, "sqs: refused");
            protocol::error(wire, &rid, &e)
        }
    }
}

async fn serve_call(
    sqs: &Sqs,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    body: Result<Bytes, axum::Error>,
) -> Result<(String, Value), SqsError> {
    let body = body.map_err(|e| {
        SqsError::invalid(format!(
            "the request body could not be read ({e}): at most {} bytes are taken",
            sqs.opts.max_body_bytes
        ))
    })?;
    if *method != Method::POST && *method != Method::GET {
        return Err(SqsError::invalid(format!(
            "{method} is not a method of SQS: send POST (or GET with the query protocol)"
        )));
    }
    let wire = protocol::wire(headers);
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| format!("localhost:{DEFAULT_PORT}"));
    let path = uri.path();
    let path_queue =
        (path.trim_matches('/').split('/').count() == 2).then(|| format!("http://{host}{path}"));
    let (principal, region) = sqs.caller(method, uri, headers, &body, peer)?;
    if !regions::valid(&region) {
        return Err(SqsError::invalid(format!(
            "The region {region:?} of the request's credential scope is not a region name: 1 to 64 letters, digits or '-'."
        )));
    }
    let req = protocol::decode(wire, headers, uri.query(), &body, path_queue)?;
    let call = Call {
        host,
        region,
        principal,
        peer,
        action: req.action.clone(),
    };
    let out = sqs.dispatch(&call, &req.action, &req.input).await?;
    Ok((req.action, out))
}

impl Sqs {
    /// The caller and the request's region. Without principals every
    /// request is served as the anonymous principal, whatever credentials
    /// it carries (as ElasticMQ and moto do), in the region of its
    /// signature's scope if it has one; with principals it must be signed
    /// with one's access key (`sigv4.rs`), and a refusal is audited.
    fn caller(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
        peer: Option<SocketAddr>,
    ) -> Result<(Arc<Principal>, String), SqsError> {
        if !self.auth.is_enabled() {
            let region =
                signed_region(headers, uri.query()).unwrap_or_else(|| self.opts.region.clone());
            return Ok((Principal::anonymous(), region));
        }
        match sigv4::verify(&self.auth, method, uri, headers, body, self.now()) {
            Ok(v) => Ok((v.principal, v.region)),
            Err(r) => {
                let presented = r
                    .access_key
                    .as_deref()
                    .map_or_else(|| "-".to_string(), |k| format!("access key {k}"));
                audit::refused(
                    audit::Who {
                        principal: &presented,
                        peer,
                    },
                    "authenticate",
                    "-",
                    &format!("{}: {}", r.error.code, r.short()),
                );
                Err(r.error)
            }
        }
    }

    async fn dispatch(&self, call: &Call, action: &str, input: &Value) -> Result<Value, SqsError> {
        match action {
            "CreateQueue" => self.create_queue(call, input).await,
            "GetQueueUrl" => self.get_queue_url(call, input),
            "ListQueues" => self.list_queues(call, input),
            "DeleteQueue" => self.delete_queue(call, input).await,
            "GetQueueAttributes" => self.get_queue_attributes(call, input).await,
            "SetQueueAttributes" => self.set_queue_attributes(call, input).await,
            "PurgeQueue" => self.purge_queue(call, input).await,
            "TagQueue" => self.tag_queue(call, input).await,
            "UntagQueue" => self.untag_queue(call, input).await,
            "ListQueueTags" => self.list_queue_tags(call, input),
            "ListDeadLetterSourceQueues" => self.list_dead_letter_source_queues(call, input),
            "AddPermission" => self.add_permission(call, input).await,
            "RemovePermission" => self.remove_permission(call, input).await,
            "SendMessage" => self.send_message(call, input).await,
            "SendMessageBatch" => self.send_message_batch(call, input).await,
            "ReceiveMessage" => self.receive_message(call, input).await,
            "DeleteMessage" => self.delete_message(call, input).await,
            "DeleteMessageBatch" => self.delete_message_batch(call, input).await,
            "ChangeMessageVisibility" => self.change_message_visibility(call, input).await,
            "ChangeMessageVisibilityBatch" => {
                self.change_message_visibility_batch(call, input).await
            }
            "StartMessageMoveTask" => self.start_message_move_task(call, input).await,
            "ListMessageMoveTasks" => self.list_message_move_tasks(call, input),
            "CancelMessageMoveTask" => self.cancel_message_move_task(call, input).await,
            other => Err(SqsError::invalid_action(other)),
        }
    }
}

/// A string member of an input.
pub(crate) fn string<'a>(input: &'a Value, name: &str) -> Option<&'a str> {
    input.get(name).and_then(Value::as_str)
}

/// A required string member.
pub(crate) fn required<'a>(input: &'a Value, name: &str) -> Result<&'a str, SqsError> {
    string(input, name).ok_or_else(|| SqsError::missing(name))
}

/// An integer member: a JSON number, or (query protocol) digits.
pub(crate) fn integer(input: &Value, name: &str) -> Result<Option<i64>, SqsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| {
            SqsError::invalid(format!("Value {n} for parameter {name} is invalid."))
        }),
        Some(Value::String(s)) => {
            s.trim().parse::<i64>().map(Some).map_err(|_| {
                SqsError::invalid(format!("Value {s} for parameter {name} is invalid."))
            })
        }
        Some(other) => Err(SqsError::invalid(format!(
            "Value {other} for parameter {name} is invalid."
        ))),
    }
}

/// A list of strings member.
pub(crate) fn strings(input: &Value, name: &str) -> Vec<String> {
    input
        .get(name)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The endpoint's routes over `broker`.
pub fn router(broker: Arc<Broker>, auth: Arc<Authenticator>, opts: SqsOptions) -> Router {
    let limit = opts.max_body_bytes;
    let sqs = Arc::new(Sqs {
        broker,
        auth,
        regions: regions::Regions {
            default: opts.region.clone(),
        },
        opts,
        purges: Mutex::default(),
        attempts: messages::Attempts::default(),
    });
    let _ = limit;
    Router::new().fallback(handle).with_state(sqs)
}

/// Serves the endpoint on `listener` until `shutdown` resolves, then
/// finishes the calls in flight (long polls end at once: the engine's
/// shutdown wakes them and they answer with no messages).
pub(crate) fn serve(
    listener: GatedListener,
    shared: &crate::edge::Shared,
    opts: SqsOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let (broker, auth) = (Arc::clone(&shared.broker), Arc::clone(&shared.auth));
    async move {
        tasks::resume(&broker).await;
        let app = router(broker, auth, opts);
        crate::edge::http::serve(listener, app, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_urls_are_resolved_by_their_path() {
        for (url, name) in [
            ("http://localhost:9324/000000000000/orders", "orders"),
            (
                "https://sqs.us-east-1.amazonaws.com/123456789012/q.fifo",
                "q.fifo",
            ),
            (
                "https://queue.amazonaws.com/123456789012/unknown/",
                "unknown",
            ),
            ("orders", "orders"),
        ] {
            assert_eq!(queue_name(url).unwrap(), name, "{url}");
        }
        assert!(queue_name("http://whatever-incorrect-queue-address").is_err());
        assert!(queue_name("").is_err());
    }

    #[test]
    fn request_ids_are_uuid_shaped_and_differ() {
        let (a, b) = (request_id(), request_id());
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[test]
    fn the_region_comes_from_the_credential_scope() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=AKID/20260101/eu-west-2/sqs/aws4_request, SignedHeaders=host, Signature=x"
                .parse()
                .unwrap(),
        );
        assert_eq!(signed_region(&h, None).as_deref(), Some("eu-west-2"));
        assert_eq!(signed_region(&HeaderMap::new(), None), None);
        let q = "X-Amz-Credential=AKID%2F20260101%2Fap-south-1%2Fsqs%2Faws4_request";
        assert_eq!(
            signed_region(&HeaderMap::new(), Some(q)).as_deref(),
            Some("ap-south-1")
        );
    }
}
