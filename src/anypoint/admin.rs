//! The Admin API subset a developer needs locally, and the real-time
//! queue Stats call.
//!
//! Admin: `/mq/admin/api/v1/organizations/{org}/environments/{env}/
//! regions/{region}/...` (any ids): list destinations; create or replace
//! (idempotent `PUT`), read, change (`PATCH`, v1 and v2) and delete
//! queues; purge; exchanges; bindings and their routing rules (string
//! equality, the one kind of filter Letterbox bindings have; those
//! handlers are in `bindings`). Stats:
//! `/mq/stats/api/v1/.../regions/{region}/queues?destinationIds=a,b`.
//!
//! Every other operation of the Admin and Stats specifications is
//! answered **501 Not Implemented**, as those specifications document for
//! an operation a broker lacks, with a body naming the operation
//! ([`NOT_IMPLEMENTED`]): deleting an organization's or environment's
//! data, MQ client apps, regions, fallback queues, and the historical and
//! usage statistics. (A 404 would read as "no such queue".)
//!
//! Queues and exchanges share one namespace in Anypoint MQ
//! (destinations); the facade refuses to create one under the name of the
//! other. Errors are `{"message": ...}`, as in the Admin specification.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, get, on, patch, put};
use serde_json::{Map, Value, json};

use super::bindings;
use super::error::ApiError;
use super::message::{integer, kind};
use super::{Api, body_bytes, json_body, json_response, param, query};
use crate::auth::Action;
use crate::queue::QueueError;
use crate::queue::exchange::ExchangeInfo;
use crate::queue::model::{
    DeadLetterInput, QueueConfig, QueueConfigInput, QueueInfo, QueueKind, QueueRemovals,
};
use crate::queue::validate::limits;

const ADMIN: &str = "/mq/admin/api/v1/organizations/{org}/environments/{env}/regions/{region}";
const ADMIN_V2: &str = "/mq/admin/api/v2/organizations/{org}/environments/{env}/regions/{region}";
const STATS: &str = "/mq/stats/api/v1/organizations/{org}/environments/{env}/regions/{region}";

pub(super) fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route(&format!("{ADMIN}/destinations"), get(list_destinations))
        .route(
            &format!("{ADMIN}/destinations/queues/{{queue}}"),
            put(put_queue)
                .get(get_queue)
                .patch(patch_queue_v1)
                .delete(delete_queue),
        )
        .route(
            &format!("{ADMIN_V2}/destinations/queues/{{queue}}"),
            patch(patch_queue_v2),
        )
        .route(
            &format!("{ADMIN}/destinations/queues/{{queue}}/messages"),
            axum::routing::delete(purge_queue),
        )
        .route(
            &format!("{ADMIN}/destinations/exchanges/{{exchange}}"),
            put(bindings::put_exchange)
                .get(bindings::get_exchange)
                .patch(bindings::get_exchange_patch)
                .delete(bindings::delete_exchange),
        )
        .route(
            &format!("{ADMIN}/bindings/exchanges/{{exchange}}"),
            get(bindings::exchange_bindings),
        )
        .route(
            &format!("{ADMIN}/bindings/queues/{{queue}}"),
            get(bindings::queue_bindings),
        )
        .route(
            &format!("{ADMIN}/bindings/exchanges/{{exchange}}/queues/{{queue}}"),
            put(bindings::put_binding)
                .get(bindings::get_binding)
                .delete(bindings::delete_binding),
        )
        .route(
            &format!("{ADMIN}/bindings/exchanges/{{exchange}}/queues/{{queue}}/rules/routing"),
            put(bindings::put_rules).delete(bindings::delete_rules),
        )
        .route(&format!("{STATS}/queues"), get(queue_stats))
        .merge(not_implemented_routes())
}

/// An operation of the Admin or Stats specification that Letterbox does
/// not implement.
struct Missing {
    method: Method,
    /// The route (under the listener's root).
    route: &'static str,
    /// The operation as its specification names it: method and path.
    operation: &'static str,
    /// Why Letterbox has no such operation.
    why: &'static str,
}

const NO_CLIENTS: &str = "Letterbox has no MQ client apps to manage: with authentication off any client id and secret are accepted, with it on client apps are the principals of its configuration file";
const ONE_REGION: &str =
    "Letterbox is one local server: there are no regions to list (any region id is accepted)";
const NO_HISTORY: &str = "Letterbox keeps no statistics history: the real-time figures are at GET .../regions/{regionId}/queues?destinationIds=...";
const NO_USAGE: &str =
    "Letterbox does not meter usage (API requests, billable units) per organization or environment";
const NO_ACCOUNTS: &str = "Letterbox has no organizations or environments to delete: any ids are accepted, and they name nothing";

/// The operations of the Admin and Stats specifications (every path and
/// method of `anypoint-mq-admin.yaml` and `anypoint-mq-stats.yaml`) that
/// Letterbox does not implement, each answered 501. The implemented ones
/// are the routes of [`routes`] and the Admin `POST /v1/authorize`.
const NOT_IMPLEMENTED: &[Missing] = &[
    Missing {
        method: Method::DELETE,
        route: "/mq/admin/api/v1/organizations/{org}",
        operation: "DELETE /v1/organizations/{organizationId}",
        why: NO_ACCOUNTS,
    },
    Missing {
        method: Method::DELETE,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}",
        operation: "DELETE /v1/organizations/{organizationId}/environments/{environmentId}",
        why: NO_ACCOUNTS,
    },
    Missing {
        method: Method::GET,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/clients",
        operation: "GET /v1/organizations/{organizationId}/environments/{environmentId}/clients",
        why: NO_CLIENTS,
    },
    Missing {
        method: Method::PUT,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/clients",
        operation: "PUT /v1/organizations/{organizationId}/environments/{environmentId}/clients",
        why: NO_CLIENTS,
    },
    Missing {
        method: Method::POST,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/clients/{client}",
        operation: "POST /v1/organizations/{organizationId}/environments/{environmentId}/clients/{clientId}",
        why: NO_CLIENTS,
    },
    Missing {
        method: Method::DELETE,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/clients/{client}",
        operation: "DELETE /v1/organizations/{organizationId}/environments/{environmentId}/clients/{clientId}",
        why: NO_CLIENTS,
    },
    Missing {
        method: Method::GET,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/regions",
        operation: "GET /v1/organizations/{organizationId}/environments/{environmentId}/regions",
        why: ONE_REGION,
    },
    Missing {
        method: Method::GET,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/regions/{region}",
        operation: "GET /v1/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}",
        why: ONE_REGION,
    },
    Missing {
        method: Method::PUT,
        route: "/mq/admin/api/v1/organizations/{org}/environments/{env}/regions/{region}/destinations/queues/{queue}/fallback",
        operation: "PUT /v1/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}/destinations/queues/{queueId}/fallback",
        why: "cross-region failover (fallback queues) has no meaning on one local server",
    },
    Missing {
        method: Method::GET,
        route: "/mq/stats/api/v1/organizations/{org}",
        operation: "GET /organizations/{organizationId}",
        why: NO_USAGE,
    },
    Missing {
        method: Method::GET,
        route: "/mq/stats/api/v1/organizations/{org}/environments/{env}",
        operation: "GET /organizations/{organizationId}/environments/{environmentId}",
        why: NO_USAGE,
    },
    Missing {
        method: Method::GET,
        route: "/mq/stats/api/v1/organizations/{org}/environments/{env}/regions/{region}/queues/{queue}",
        operation: "GET /organizations/{organizationId}/environments/{environmentId}/regions/{regionId}/queues/{queueId}",
        why: NO_HISTORY,
    },
    Missing {
        method: Method::GET,
        route: "/mq/stats/api/v1/organizations/{org}/environments/{env}/regions/{region}/exchanges/{exchange}",
        operation: "GET /organizations/{organizationId}/environments/{environmentId}/regions/{regionId}/exchanges/{exchangeId}",
        why: NO_HISTORY,
    },
];

/// The routes of [`NOT_IMPLEMENTED`]: after authentication (as every
/// call), 501 with `{"message", "operation"}`.
fn not_implemented_routes() -> Router<Arc<Api>> {
    let mut by_route: Vec<(&str, MethodRouter<Arc<Api>>)> = Vec::new();
    for m in NOT_IMPLEMENTED {
        let handler = move |State(api): State<Arc<Api>>, headers: HeaderMap| async move {
            not_implemented(&api, &headers, m)
        };
        let filter = MethodFilter::try_from(m.method.clone()).unwrap_or(MethodFilter::GET);
        match by_route.iter_mut().find(|(r, _)| *r == m.route) {
            Some((_, mr)) => *mr = std::mem::take(mr).on(filter, handler),
            None => by_route.push((m.route, on(filter, handler))),
        }
    }
    by_route
        .into_iter()
        .fold(Router::new(), |r, (route, mr)| r.route(route, mr))
}

fn not_implemented(api: &Api, headers: &HeaderMap, m: &Missing) -> Response {
    if let Err(e) = api.caller(headers) {
        return e.admin().into_response();
    }
    json_response(
        StatusCode::NOT_IMPLEMENTED,
        &json!({
            "message": format!("{} is not implemented by Letterbox: {}", m.operation, m.why),
            "operation": m.operation,
        }),
    )
}

type Region = (String, String, String);
pub(super) type Named = (String, String, String, String);
pub(super) type Pair = (String, String, String, String, String);

/// An error answered in the Admin API's shape (`{"message": ...}`). The
/// Admin and Stats handlers return it, so that `?` on an [`ApiError`]
/// answers that way.
pub(super) struct AdminError(pub(super) ApiError);

impl From<ApiError> for AdminError {
    fn from(e: ApiError) -> Self {
        AdminError(e)
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        self.0.admin().into_response()
    }
}

/// What an Admin or Stats handler answers.
pub(super) type Answer = Result<Response, AdminError>;

pub(super) fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|r| ApiError::bad(format!("bad path: {}", r.body_text())))
}

impl Api {
    /// The destination an Admin path names, which the caller may
    /// administer.
    pub(super) fn administered(
        &self,
        p: Result<Path<Named>, PathRejection>,
        headers: &HeaderMap,
    ) -> Result<String, ApiError> {
        let (_, _, _, name) = path(p)?;
        self.allowed(headers, Action::Admin, &name)?;
        Ok(name)
    }

    /// The exchange and queue of a binding path; the caller may administer
    /// both ends of the binding.
    pub(super) fn administered_binding(
        &self,
        p: Result<Path<Pair>, PathRejection>,
        headers: &HeaderMap,
    ) -> Result<(String, String), ApiError> {
        let (_, _, _, exchange, queue) = path(p)?;
        let caller = self.caller(headers)?;
        self.check(&caller, Action::Admin, &exchange)?;
        self.check(&caller, Action::Admin, &queue)?;
        Ok((exchange, queue))
    }
}

/// An engine error in the Admin API's words (`queue not found: q`).
pub(super) fn admin_err(e: QueueError) -> ApiError {
    match e {
        QueueError::NotFound { kind, name } => {
            ApiError::new(StatusCode::NOT_FOUND, format!("{kind} not found: {name}"))
        }
        other => ApiError::from_queue(other),
    }
}

pub(super) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// The answer of a listing: its items, or 204 when there are none.
pub(super) fn listing(items: Vec<Value>) -> Response {
    if items.is_empty() {
        return no_content();
    }
    json_response(StatusCode::OK, &Value::Array(items))
}

/// A JSON object body; an empty body is an empty object.
pub(super) fn object_body(
    b: Result<Bytes, BytesRejection>,
) -> Result<Map<String, Value>, ApiError> {
    let b = body_bytes(b)?;
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match json_body(&b)? {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad(format!(
            "the request body must be a JSON object, not {}",
            kind(&other)
        ))),
    }
}

// ---- queues ----------------------------------------------------------------

fn queue_json(q: &QueueInfo) -> Value {
    let c = &q.config;
    let mut m = Map::new();
    m.insert("type".into(), "queue".into());
    m.insert("queueId".into(), q.name.clone().into());
    m.insert("fifo".into(), c.kind.is_fifo().into());
    m.insert("encrypted".into(), false.into());
    m.insert("defaultTtl".into(), c.message_ttl.into());
    m.insert("defaultLockTtl".into(), c.ack_timeout.into());
    m.insert("defaultDeliveryDelay".into(), c.delivery_delay.into());
    m.insert("isFallback".into(), false.into());
    if let Some(dl) = &c.dead_letter {
        m.insert("deadLetterQueueId".into(), dl.queue.clone().into());
        m.insert("maxDeliveries".into(), dl.max_deliveries.into());
    }
    if !q.dead_letter_sources.is_empty() {
        m.insert(
            "deadLetterSources".into(),
            q.dead_letter_sources.clone().into(),
        );
    }
    Value::Object(m)
}

/// The queue fields of an Admin request body.
#[derive(Debug, Default)]
struct QueueBody {
    ttl: Option<u64>,
    lock_ttl: Option<u64>,
    delay: Option<u64>,
    fifo: Option<bool>,
    dlq: Option<String>,
    max_deliveries: Option<u32>,
}

fn queue_body(m: &Map<String, Value>, name: &str) -> Result<QueueBody, ApiError> {
    let num = |k: &str| -> Result<Option<u64>, ApiError> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => integer(k, v).map(Some),
        }
    };
    let flag = |k: &str| -> Result<Option<bool>, ApiError> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ApiError::bad(format!(
                "{k} must be true or false, not {}",
                kind(other)
            ))),
        }
    };
    match m.get("queueId") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) if id == name => {}
        Some(other) => {
            return Err(ApiError::bad(format!(
                "queueId {other} differs from the queue {name:?} of the path"
            )));
        }
    }
    if flag("isFallback")? == Some(true) {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "fallback queues (cross-region failover) are not supported by Letterbox",
        ));
    }
    // `encrypted` is accepted and has no effect: Letterbox does not
    // encrypt messages at rest, and says so (`"encrypted": false`).
    flag("encrypted")?;
    let dlq = match m.get("deadLetterQueueId") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "deadLetterQueueId must be a string, not {}",
                kind(other)
            )));
        }
    };
    let max_deliveries = match num("maxDeliveries")? {
        None => None,
        Some(n) => {
            let (lo, hi, _) = limits::MAX_DELIVERIES;
            match u32::try_from(n) {
                Ok(n) if (lo..=hi).contains(&n) => Some(n),
                _ => {
                    return Err(ApiError::bad(format!(
                        "maxDeliveries {n} must be between {lo} and {hi}"
                    )));
                }
            }
        }
    };
    Ok(QueueBody {
        ttl: num("defaultTtl")?,
        lock_ttl: num("defaultLockTtl")?,
        delay: num("defaultDeliveryDelay")?,
        fifo: flag("fifo")?,
        dlq,
        max_deliveries,
    })
}

fn kind_of(fifo: Option<bool>) -> Option<QueueKind> {
    fifo.map(|f| {
        if f {
            QueueKind::Fifo
        } else {
            QueueKind::Standard
        }
    })
}

impl Api {
    pub(super) fn refuse_exchange_name(&self, name: &str) -> Result<(), ApiError> {
        if self.broker.get_exchange(name).is_ok() {
            return Err(ApiError::bad(format!(
                "an exchange named {name} exists: queues and exchanges share one namespace of destinations"
            )));
        }
        Ok(())
    }
}

/// The request of a `PUT` (see [`put_queue`]).
fn put_request(b: QueueBody) -> Result<(QueueConfigInput, QueueRemovals), ApiError> {
    let dead_letter = match (b.dlq, b.max_deliveries) {
        // No maxDeliveries: the engine's default.
        (Some(q), n) => Some(DeadLetterInput {
            queue: q,
            max_deliveries: n,
        }),
        (None, Some(_)) => {
            return Err(ApiError::bad(
                "maxDeliveries needs deadLetterQueueId (the queue to move messages to)",
            ));
        }
        (None, None) => None,
    };
    // The fields of this API left out take the engine's defaults; the
    // others are Letterbox's own and stay as they are.
    let defaults = QueueConfig::default();
    let removals = QueueRemovals {
        dead_letter: dead_letter.is_none(),
        ..QueueRemovals::default()
    };
    let input = QueueConfigInput {
        kind: kind_of(b.fifo),
        message_ttl: Some(b.ttl.unwrap_or(defaults.message_ttl)),
        ack_timeout: Some(b.lock_ttl.unwrap_or(defaults.ack_timeout)),
        delivery_delay: Some(b.delay.unwrap_or(defaults.delivery_delay)),
        dead_letter,
        ..QueueConfigInput::default()
    };
    Ok((input, removals))
}

/// `PUT .../destinations/queues/{queue}`: create the queue, or make an
/// existing one's configuration exactly this (fields left out take their
/// defaults, and no `deadLetterQueueId` means no dead letter queue).
/// Idempotent.
async fn put_queue(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let name = api.administered(p, &headers)?;
    let b = queue_body(&object_body(body)?, &name)?;
    api.refuse_exchange_name(&name)?;
    let (input, removals) = put_request(b)?;
    let (q, action) = match api.broker.get_queue(&name) {
        Ok(_) => (
            api.broker.update_queue(&name, &input, removals).await,
            "queue.update",
        ),
        Err(QueueError::NotFound { .. }) => match api.broker.create_queue(&name, &input).await {
            Ok((q, _)) => (Ok(q), "queue.create"),
            // Created meanwhile by another call: replace.
            Err(QueueError::AlreadyExists { .. }) => (
                api.broker.update_queue(&name, &input, removals).await,
                "queue.update",
            ),
            Err(e) => (Err(e), "queue.create"),
        },
        Err(e) => (Err(e), "queue.update"),
    };
    let q = q.map_err(admin_err)?;
    api.audit(action, &name, "");
    Ok(json_response(StatusCode::OK, &queue_json(&q)))
}

async fn get_queue(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let name = api.administered(p, &headers)?;
    let q = api.broker.get_queue(&name).map_err(admin_err)?;
    Ok(json_response(StatusCode::OK, &queue_json(&q)))
}

/// `PATCH` v1: the given fields change; without `deadLetterQueueId` the
/// dead letter queue is removed (as the Admin API documents). v2: only
/// the given fields change.
async fn patch_queue(
    api: &Api,
    p: Result<Path<Named>, PathRejection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    v2: bool,
) -> Answer {
    let name = api.administered(p, headers)?;
    let b = queue_body(&object_body(body)?, &name)?;
    let current = api.broker.get_queue(&name).map_err(admin_err)?;
    let existing = current.config.dead_letter.as_ref();
    let (dead_letter, remove) = match (b.dlq, b.max_deliveries) {
        (Some(q), n) => (
            Some(DeadLetterInput {
                queue: q,
                // Neither given nor set: the engine's default.
                max_deliveries: n.or(existing.map(|d| d.max_deliveries)),
            }),
            false,
        ),
        (None, Some(n)) => match existing {
            Some(d) if v2 => (Some(DeadLetterInput::new(d.queue.clone(), n)), false),
            _ => {
                return Err(ApiError::bad(
                    "maxDeliveries needs deadLetterQueueId (the queue to move messages to)",
                )
                .into());
            }
        },
        (None, None) => (None, !v2),
    };
    let input = QueueConfigInput {
        kind: kind_of(b.fifo),
        message_ttl: b.ttl,
        ack_timeout: b.lock_ttl,
        delivery_delay: b.delay,
        dead_letter,
        ..QueueConfigInput::default()
    };
    let removals = QueueRemovals {
        dead_letter: remove,
        ..QueueRemovals::default()
    };
    let q = api
        .broker
        .update_queue(&name, &input, removals)
        .await
        .map_err(admin_err)?;
    api.audit("queue.update", &name, "");
    Ok(json_response(StatusCode::OK, &queue_json(&q)))
}

async fn patch_queue_v1(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    patch_queue(&api, p, &headers, body, false).await
}

async fn patch_queue_v2(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    patch_queue(&api, p, &headers, body, true).await
}

/// `DELETE` of a queue. The dead letter queue of other queues is not
/// deleted (409): they are changed first.
async fn delete_queue(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let name = api.administered(p, &headers)?;
    match api.broker.delete_queue(&name, false).await {
        Ok(n) => {
            api.audit("queue.delete", &name, &format!("messages_deleted={n}"));
            Ok(no_content())
        }
        // The one precondition of a delete without force.
        Err(QueueError::FailedPrecondition(_)) => {
            let sources = api
                .broker
                .get_queue(&name)
                .map(|q| q.dead_letter_sources)
                .unwrap_or_default();
            Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "queue {name} is the dead letter queue of {}: give {} another deadLetterQueueId, \
                     or none (PUT or PATCH of the queue), before deleting it",
                    sources.join(", "),
                    if sources.len() == 1 { "it" } else { "them" }
                ),
            )
            .into())
        }
        Err(e) => Err(admin_err(e).into()),
    }
}

async fn purge_queue(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let name = api.administered(p, &headers)?;
    let n = api.broker.purge_queue(&name).await.map_err(admin_err)?;
    api.audit("queue.purge", &name, &format!("messages_deleted={n}"));
    Ok(no_content())
}

// ---- destinations ----------------------------------------------------------

/// Every item of an engine listing, page by page: `list` answers the page
/// after a name (the first page after `None`) and the name after it, if
/// there are more.
fn every<T>(
    mut list: impl FnMut(Option<&str>) -> Result<(Vec<T>, Option<String>), QueueError>,
) -> Result<Vec<T>, ApiError> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let (page, next) = list(after.as_deref()).map_err(admin_err)?;
        out.extend(page);
        match next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

impl Api {
    /// Every queue whose name starts with `prefix`, in name order.
    pub(super) fn all_queues(&self, prefix: &str) -> Result<Vec<QueueInfo>, ApiError> {
        every(|after| self.broker.list_queues(prefix, limits::MAX_RECEIVE, after))
    }

    /// Every exchange, in name order.
    pub(super) fn all_exchanges(&self) -> Result<Vec<ExchangeInfo>, ApiError> {
        every(|after| self.broker.list_exchanges(limits::MAX_RECEIVE, after))
    }
}

pub(super) fn exchange_json(name: &str) -> Value {
    json!({"type": "exchange", "exchangeId": name, "encrypted": false})
}

/// The ids of a comma-separated list (`destinationIds`).
fn id_list(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

pub(super) fn count_param(
    params: &[(String, String)],
    name: &str,
    default: usize,
) -> Result<usize, ApiError> {
    match param(params, name) {
        None => Ok(default),
        Some(t) => t
            .trim()
            .parse::<usize>()
            .map_err(|_| ApiError::bad(format!("{name} {t:?} must be a non-negative integer"))),
    }
}

/// `GET .../destinations`: queues and exchanges in name order, filtered by
/// `destinationType`, `startsWith` and `destinationIds`, paged by
/// `offset` and `limit` (20); 204 when none.
async fn list_destinations(
    State(api): State<Arc<Api>>,
    p: Result<Path<Region>, PathRejection>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    path(p)?;
    let caller = api.caller(&headers)?;
    let params = query(q.as_deref());
    let (queues, exchanges) = match param(&params, "destinationType") {
        None | Some("all") => (true, true),
        Some("queue") => (true, false),
        Some("exchange") => (false, true),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "destinationType {other:?} must be all, queue or exchange"
            ))
            .into());
        }
    };
    let minimal = match param(&params, "inclusion") {
        None | Some("all") => false,
        Some("minimal") => true,
        Some(other) => {
            return Err(
                ApiError::bad(format!("inclusion {other:?} must be all or minimal")).into(),
            );
        }
    };
    let prefix = param(&params, "startsWith").unwrap_or("");
    let ids: Option<Vec<&str>> = param(&params, "destinationIds").map(|s| id_list(s).collect());
    let offset = count_param(&params, "offset", 0)?;
    let limit = count_param(&params, "limit", 20)?;
    let mut all: Vec<(String, Value)> = Vec::new();
    if queues {
        for q in api.all_queues(prefix)? {
            let v = if minimal {
                json!({"type": "queue", "queueId": q.name})
            } else {
                queue_json(&q)
            };
            all.push((q.name, v));
        }
    }
    if exchanges {
        for x in api.all_exchanges()? {
            if x.name.starts_with(prefix) {
                all.push((x.name.clone(), exchange_json(&x.name)));
            }
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let page: Vec<Value> = all
        .into_iter()
        .filter(|(n, _)| caller.sees(n))
        .filter(|(n, _)| ids.as_ref().is_none_or(|ids| ids.contains(&n.as_str())))
        .skip(offset)
        .take(limit)
        .map(|(_, v)| v)
        .collect();
    Ok(listing(page))
}

// ---- stats -----------------------------------------------------------------

/// `GET /mq/stats/api/v1/.../queues?destinationIds=a,b`: each existing
/// queue's depth (`messages`, all of its messages) and in-flight count,
/// exact and current; 204 when none of them exists.
async fn queue_stats(
    State(api): State<Arc<Api>>,
    p: Result<Path<Region>, PathRejection>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    path(p)?;
    let caller = api.caller(&headers)?;
    let params = query(q.as_deref());
    let ids = param(&params, "destinationIds")
        .ok_or_else(|| ApiError::bad("destinationIds is required (comma-separated queue ids)"))?;
    let mut out = Vec::new();
    for id in id_list(ids) {
        api.check(&caller, Action::Admin, id)?;
        match api.broker.stats(id) {
            Ok(s) => out.push(json!({
                "destination": id,
                "messages": s.total,
                "inflightMessages": s.in_flight,
            })),
            Err(QueueError::NotFound { .. }) => {}
            Err(e) => return Err(admin_err(e).into()),
        }
    }
    Ok(listing(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::validate::{default_config, updated_config};

    /// The Admin API carries a subset of a queue's configuration: those
    /// values come back from a queue's JSON sent as a `PUT`, and the
    /// others take their defaults. A new field of `QueueConfig` must be
    /// placed in one group or the other below.
    #[test]
    fn a_queues_json_put_back_keeps_the_values_of_this_api() {
        for c in [
            crate::queue_config_tests::full(),
            crate::queue_config_tests::full_standard(),
        ] {
            let info = QueueInfo {
                name: "orders".into(),
                config: c.clone(),
                dead_letter_sources: vec!["upstream".into()],
                created_at: 5,
            };
            let Value::Object(json) = queue_json(&info) else {
                panic!("a queue's JSON is an object");
            };
            let body = queue_body(&json, "orders").expect("its own JSON is a valid body");
            let (input, removals) = put_request(body).expect("a valid request");
            let back = updated_config(&default_config(c.kind), &input, removals).expect("valid");
            let QueueConfig {
                kind,
                message_ttl,
                ack_timeout,
                delivery_delay,
                dead_letter,
                // Not in the Admin API: Letterbox's own.
                retry_backoff: _,
                dead_letter_on_expiry: _,
                max_length: _,
                max_lease_total: _,
                dedup_window: _,
                on_poison: _,
                content_based_dedup: _,
            } = c;
            let expected = QueueConfig {
                kind,
                message_ttl,
                ack_timeout,
                delivery_delay,
                dead_letter,
                ..default_config(kind)
            };
            assert_eq!(back, expected);
        }
    }
}
