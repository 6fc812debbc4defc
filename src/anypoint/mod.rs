//! An Anypoint MQ compatible REST facade, so that scripts and REST clients
//! written for Anypoint MQ run against a local Letterbox (the way ElasticMQ
//! stands in for SQS). Off unless `--anypoint-listen` is given.
//!
//! It serves, on one HTTP/1.1 listener and for any organization,
//! environment and region ids:
//!
//! - the Broker API (`/api/v1/organizations/{org}/environments/{env}/...`):
//!   its ten operations, publish (one, batch), consume, ack (one, batch),
//!   nack (one, batch), lock TTL (one, batch) and `POST /api/v1/authorize`
//!   (`broker.rs`; message JSON in `message.rs`);
//! - the part of the Admin API a developer needs locally
//!   (`/mq/admin/api/v1/.../regions/{region}/...`: destinations, queues,
//!   purge, exchanges, bindings, string-equality routing rules) and the
//!   real-time queue Stats call (`/mq/stats/api/v1/...`), in `admin.rs`;
//!   every other operation of the Admin and Stats specifications answers
//!   501 Not Implemented, naming the operation.
//!
//! Handlers are thin, like the gRPC ones: parse, authenticate and
//! authorize, call [`Broker`], format. No rule of the engine is repeated
//! here; where the REST shape needs something the engine lacked (which
//! message and queue a lock is on), the engine has it for every caller
//! ([`Broker::lease_holder`]).
//!
//! Every call but `authorize` needs `Authorization: bearer <token>`; tokens
//! come from `authorize` (`tokens.rs`), which checks client ids and
//! secrets with [`Authenticator`] (any client id and secret when
//! authentication is off, the local-developer default).

mod admin;
mod bindings;
mod broker;
mod error;
mod message;
mod tokens;

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::auth::{Action, Authenticator, Credentials, Principal};
use crate::edge::audit;
use crate::edge::http::{GatedListener, Peer};
use crate::queue::Broker;
use crate::queue::model::HOUR;

/// Who makes the call being served: its peer address (set for every call)
/// and its principal (once authenticated), for the audit log.
#[derive(Debug, Default)]
struct CallInfo {
    peer: Option<SocketAddr>,
    principal: Option<Arc<Principal>>,
}

tokio::task_local! {
    static CALL: RefCell<CallInfo>;
}

/// Request bodies up to this size are read whole before the handler runs.
const READ_AHEAD: u64 = 64 << 10;

/// Runs a call with its [`CallInfo`] in scope. A small request body is
/// read whole first: a handler that does not read it (a GET sent with a
/// body, a 501, a 404) would otherwise leave hyper to find the body's
/// bytes unread after the answer, and it closes such a keep-alive
/// connection, so the client's next request on it fails.
async fn with_call_info(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let small = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > 0 && n <= READ_AHEAD);
    let req = if small {
        let (parts, body) = req.into_parts();
        match axum::body::to_bytes(body, usize::try_from(READ_AHEAD).unwrap_or(usize::MAX)).await {
            Ok(bytes) => axum::extract::Request::from_parts(parts, Body::from(bytes)),
            Err(e) => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body: {e}"),
                )
                .into_response();
            }
        }
    } else {
        req
    };
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map(|c| c.0.0);
    CALL.scope(
        RefCell::new(CallInfo {
            peer,
            principal: None,
        }),
        next.run(req),
    )
    .await
}

/// The peer address of the call being served.
fn call_peer() -> Option<SocketAddr> {
    CALL.try_with(|c| c.borrow().peer).ok().flatten()
}

/// The caller's audit identity: `principal` when given, else the one the
/// call authenticated as, else `presented`.
fn audit_who<R>(presented: &str, f: impl FnOnce(audit::Who<'_>) -> R) -> R {
    let info = CALL.try_with(|c| {
        let c = c.borrow();
        (c.peer, c.principal.clone())
    });
    let (peer, principal) = info.unwrap_or((None, None));
    let name = principal.as_ref().map_or(presented, |p| p.name());
    f(audit::Who {
        principal: name,
        peer,
    })
}
use error::ApiError;

/// The organization id `authorize` answers in `simple_client` (every id
/// is served alike).
pub const ORG_ID: &str = "local-org";
/// The environment id `authorize` answers in `simple_client`.
pub const ENV_ID: &str = "local-env";

/// The unit of the `ttl` of the lock-TTL `PATCH` calls. The Broker API's
/// specification says seconds, while every other duration of the API
/// (`lockTtl`, `defaultLockTtl`, `deliveryDelay`, `ttl`) is milliseconds
/// and its example value is `1000`; Letterbox reads milliseconds unless
/// told otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LockTtlUnit {
    /// Milliseconds, like the rest of the API.
    #[default]
    #[value(name = "ms")]
    Milliseconds,
    /// Seconds, as the specification's description of `ttl` says.
    #[value(name = "s")]
    Seconds,
}

/// Settings of the facade.
#[derive(Debug, Clone)]
pub struct AnypointOptions {
    /// The unit of the lock-TTL `PATCH` calls' `ttl`.
    pub lock_ttl_unit: LockTtlUnit,
    /// How long an access token lives after its last use (ms).
    pub token_lifetime: u64,
    /// Largest request body (a batch of ten messages of the largest size,
    /// plus room for the JSON around them).
    pub max_body_bytes: usize,
}

impl Default for AnypointOptions {
    fn default() -> Self {
        AnypointOptions {
            lock_ttl_unit: LockTtlUnit::default(),
            token_lifetime: HOUR,
            max_body_bytes: 10 * (10 << 20) + (4 << 20),
        }
    }
}

/// What every handler works with.
#[derive(Debug)]
pub(crate) struct Api {
    broker: Arc<Broker>,
    auth: Arc<Authenticator>,
    tokens: tokens::Tokens,
    opts: AnypointOptions,
    /// Who consumes each queue (for the metrics).
    consumers: Arc<crate::edge::consumers::Consumers>,
}

impl Api {
    fn now(&self) -> u64 {
        self.broker.clock().now_ms()
    }

    /// The caller of a call, from its bearer token: one issued by
    /// `authorize`, or (with authentication on) one configured for a
    /// principal.
    fn caller(&self, headers: &HeaderMap) -> Result<Arc<Principal>, ApiError> {
        let refuse = |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, why);
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(refuse(
                "an access token is required: send `Authorization: bearer <token>`, with a token from POST /api/v1/authorize",
            ));
        };
        let text = value
            .to_str()
            .map_err(|_| refuse("the Authorization header is not ASCII text"))?;
        let token = match text.trim().split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => {
                return Err(refuse("the Authorization header must be `bearer <token>`"));
            }
        };
        let found = self.tokens.check(token, self.now()).or_else(|| {
            self.auth
                .is_enabled()
                .then(|| {
                    self.auth
                        .authenticate(Credentials::Bearer(token), None)
                        .ok()
                })
                .flatten()
        });
        if let Some(p) = found {
            let _ = CALL.try_with(|c| c.borrow_mut().principal = Some(Arc::clone(&p)));
            return Ok(p);
        }
        let why = "unknown or expired access token: authorize again (POST /api/v1/authorize)";
        audit_who("(bearer token)", |who| {
            audit::refused(who, "authenticate", "-", why);
        });
        Err(refuse(why))
    }

    /// Records a destructive act in the audit log, by the call's caller.
    pub(crate) fn audit(&self, action: &str, name: &str, detail: &str) {
        audit_who("-", |who| audit::done(who, action, name, detail));
    }

    /// Checks a grant; a refusal is recorded in the audit log.
    fn check(&self, p: &Principal, action: Action, name: &str) -> Result<(), ApiError> {
        p.check(action, name).map_err(|e| {
            audit_who("-", |who| {
                audit::refused(who, action.name(), name, &e.to_string());
            });
            ApiError::from_auth(e)
        })
    }

    /// The caller, allowed `action` on `name`.
    fn allowed(
        &self,
        headers: &HeaderMap,
        action: Action,
        name: &str,
    ) -> Result<Arc<Principal>, ApiError> {
        let p = self.caller(headers)?;
        self.check(&p, action, name)?;
        Ok(p)
    }
}

/// A JSON answer.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

/// The parameters of a query string (the last of repeated ones wins).
pub(crate) fn query(q: Option<&str>) -> Vec<(String, String)> {
    q.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// A query parameter.
pub(crate) fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A request body as received, or why it could not be read (too large).
pub(crate) fn body_bytes(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|r| ApiError::new(r.status(), r.body_text()))
}

/// A JSON request body.
pub(crate) fn json_body(b: &[u8]) -> Result<Value, ApiError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad("a JSON request body is required"));
    }
    serde_json::from_slice(b)
        .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))
}

async fn no_route(method: Method, uri: Uri) -> Response {
    tracing::debug!(%method, %uri, "anypoint: no such route");
    let e = ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such operation: {method} {}", uri.path()),
    );
    if uri.path().starts_with("/mq/") {
        e.admin().into_response()
    } else {
        e.into_response()
    }
}

async fn wrong_method(method: Method, uri: Uri) -> Response {
    let e = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not an operation of {}", uri.path()),
    );
    if uri.path().starts_with("/mq/") {
        e.admin().into_response()
    } else {
        e.into_response()
    }
}

/// The facade's routes over `broker`.
pub fn router(broker: Arc<Broker>, auth: Arc<Authenticator>, opts: AnypointOptions) -> Router {
    router_with(broker, auth, opts, Arc::default())
}

/// [`router`], counting the peers that consume in `consumers`.
fn router_with(
    broker: Arc<Broker>,
    auth: Arc<Authenticator>,
    opts: AnypointOptions,
    consumers: Arc<crate::edge::consumers::Consumers>,
) -> Router {
    let limit = opts.max_body_bytes;
    let api = Arc::new(Api {
        tokens: tokens::Tokens::new(opts.token_lifetime),
        broker,
        auth,
        opts,
        consumers,
    });
    broker::routes()
        .merge(admin::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(with_call_info))
        .with_state(api)
}

/// Serves the facade over `shared`'s engine on `listener` until
/// `shutdown` resolves, then finishes the calls in flight (long polls end
/// at once: the engine's shutdown wakes them and they answer 204).
pub(crate) fn serve(
    listener: GatedListener,
    shared: &crate::edge::Shared,
    opts: AnypointOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let app = router_with(
        Arc::clone(&shared.broker),
        Arc::clone(&shared.auth),
        opts,
        Arc::clone(&shared.consumers),
    );
    crate::edge::http::serve(listener, app, shutdown)
}
