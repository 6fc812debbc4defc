//! The Broker API: publish, consume, ack, nack, lock TTL, authorize.
//!
//! Paths are under `/api/v1/organizations/{org}/environments/{env}/
//! destinations/{destination}/messages`, for any org and env. A
//! destination is a queue or an exchange (publishing to an exchange routes
//! through its bindings); consuming and settling are on queues.
//!
//! Locks are the engine's ack tokens. A settle call names the message and
//! destination besides the lock; they must be the lock's (the engine says
//! which message and queue a current lease is on), so that a caller
//! allowed to consume one queue cannot settle another queue's messages.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{patch, post, put};
use futures_util::StreamExt;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::message::{self, META_PROPERTY, Visibility};
use super::{Api, ENV_ID, LockTtlUnit, ORG_ID, body_bytes, json_body, json_response, param, query};
use crate::auth::{Action, Credentials};
use crate::queue::QueueError;
use crate::queue::model::{
    DeadLetterReason, Destination, LeaseEnd, Nack, NewMessage, Published, ReceiveOptions, Settled,
};
use crate::queue::validate::{self, limits};

const BASE: &str = "/api/v1/organizations/{org}/environments/{env}/destinations/{dest}";

/// Most messages per batch publish and per consume (the specification's).
const MAX_BATCH: usize = 10;

pub(super) fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/api/v1/authorize", post(authorize))
        .route("/mq/admin/api/v1/authorize", post(authorize))
        .route(
            &format!("{BASE}/messages"),
            put(publish_batch)
                .get(consume)
                .head(no_head)
                .delete(ack_batch),
        )
        // A static segment: a message whose id is `locks` is published and
        // acknowledged through the batch calls.
        .route(
            &format!("{BASE}/messages/locks"),
            patch(extend_batch).delete(nack_batch),
        )
        .route(
            &format!("{BASE}/messages/{{id}}"),
            put(publish_one).delete(ack_one),
        )
        .route(
            &format!("{BASE}/messages/{{id}}/locks/{{lock}}"),
            patch(extend_one).delete(nack_one),
        )
}

/// `HEAD .../messages`: refused. Served as a GET (axum's default) it would
/// lock messages and return none of them.
async fn no_head() -> Response {
    let mut r = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "HEAD is not an operation of .../messages: a consume is a GET",
    )
    .into_response();
    r.headers_mut().insert(
        header::ALLOW,
        header::HeaderValue::from_static("GET,PUT,DELETE"),
    );
    r
}

/// Path parameters, or a 400 naming what is wrong with them.
fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(t)| t)
        .map_err(|r| ApiError::bad(format!("bad path: {}", r.body_text())))
}

type Dest = (String, String, String);
type One = (String, String, String, String);
type Lock = (String, String, String, String, String);

// ---- authorize -------------------------------------------------------------

/// `POST /api/v1/authorize`: client credentials (form fields, or a JSON
/// object) for an access token.
async fn authorize(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body)?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    let fields: Vec<(String, String)> = if is_json {
        match json_body(&body)? {
            Value::Object(m) => m
                .into_iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k, s.to_string())))
                .collect(),
            other => {
                return Err(ApiError::bad(format!(
                    "the request body must be an object, not {}",
                    message::kind(&other)
                )));
            }
        }
    } else {
        form_urlencoded::parse(&body).into_owned().collect()
    };
    let get = |k: &str| {
        fields
            .iter()
            .rev()
            .find(|(n, v)| n == k && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let (Some(id), Some(secret)) = (get("client_id"), get("client_secret")) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "client_id and client_secret are required (form fields, with grant_type=client_credentials)",
        ));
    };
    match get("grant_type") {
        Some(g) if g == "client_credentials" => {}
        Some(g) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                format!("grant_type {g:?} is not supported: use client_credentials"),
            ));
        }
        None => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "grant_type=client_credentials is required",
            ));
        }
    }
    // argon2 is slow on purpose: a secret not verified lately is checked
    // on the blocking pool, off the async workers.
    let principal = api
        .auth
        .authenticate_async(
            Credentials::ClientSecret {
                id: &id,
                secret: &secret,
            },
            None,
            super::call_peer().map(|p| p.ip()),
        )
        .await
        .map_err(|e| {
            super::audit_who(&format!("client id {id}"), |who| {
                crate::edge::audit::refused(who, "authenticate", "-", &e.to_string());
            });
            ApiError::from_auth(e)
        })?;
    let token = api.tokens.issue(&id, principal, api.now());
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "access_token": token,
            "simple_client": {"envId": ENV_ID, "orgId": ORG_ID},
            "token_type": "bearer",
        }),
    ))
}

// ---- publish ---------------------------------------------------------------

impl Api {
    /// Publishes into a queue, or through an exchange of that name.
    async fn publish(
        &self,
        dest: &str,
        mut msgs: Vec<NewMessage>,
    ) -> Result<Vec<Published>, ApiError> {
        // Queues and exchanges share one namespace of destinations: the
        // queue of that name, else the exchange.
        let (to, fifo) = match self.broker.get_queue(dest) {
            Ok(q) => (Destination::Queue(q.name), q.config.kind.is_fifo()),
            Err(QueueError::NotFound { .. }) => (Destination::Exchange(dest.to_string()), false),
            Err(e) => return Err(ApiError::from_queue(e)),
        };
        if !fifo {
            msgs.iter_mut().for_each(message::ungroup);
        }
        // Letterbox's own property (META_PROPERTY) can push a message over
        // the property limits; if the engine refuses that message's
        // properties, the answer explains it. Computed before the messages
        // move into the engine; None for nearly all messages.
        let overflow: Vec<Option<ApiError>> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| meta_overflow(i, m))
            .collect();
        let from_queue = |e: QueueError| match e {
            QueueError::InvalidArgument { ref field, .. } => overflow
                .iter()
                .enumerate()
                .find(|(i, o)| o.is_some() && *field == format!("messages[{i}].properties"))
                .and_then(|(_, o)| o.clone())
                .unwrap_or_else(|| ApiError::from_queue(e)),
            other => ApiError::from_queue(other),
        };
        self.broker
            .publish_to(&to, msgs)
            .await
            .map_err(|e| match e {
                QueueError::NotFound {
                    kind: "exchange", ..
                } => ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("Destination not found: {dest}"),
                ),
                other => from_queue(other),
            })
    }
}

/// The error for a message whose properties are within the limits as the
/// client sent them and over them with [`META_PROPERTY`], which Letterbox
/// added: it names that property, which the client never saw.
fn meta_overflow(i: usize, m: &NewMessage) -> Option<ApiError> {
    let (_, meta) = m.properties.iter().find(|(k, _)| k == META_PROPERTY)?;
    let why = format!(
        "Letterbox adds the property {META_PROPERTY} to a message to keep what a text property cannot \
         (the types of non-string property values, headers.deliveryDelay, and headers.messageGroupId \
         sent to a standard destination)"
    );
    let count = m.properties.len();
    let max = limits::MAX_PROPERTIES;
    if count > max && count - 1 <= max {
        return Some(ApiError::bad(format!(
            "messages[{i}].properties: {} properties plus {META_PROPERTY} make {count}, and at most \
             {max} are allowed: {why}, so send at most {} properties with it",
            count - 1,
            max - 1
        )));
    }
    let total: usize = m.properties.iter().map(|(k, v)| k.len() + v.len()).sum();
    let own = META_PROPERTY.len() + meta.len();
    let max = limits::MAX_PROPERTIES_BYTES;
    if total > max && total - own <= max {
        return Some(ApiError::bad(format!(
            "messages[{i}].properties: {} bytes of properties plus {own} of {META_PROPERTY} make \
             {total}, and at most {max} bytes are allowed: {why}",
            total - own
        )));
    }
    None
}

fn published(p: &Published) -> Value {
    let text = if p.duplicate {
        format!(
            "duplicate of message {:?}, which the destination already has (or, on a FIFO queue, had within its dedup window): not stored again",
            p.message_id
        )
    } else if p.routed_to.is_empty() {
        "published".to_string()
    } else {
        format!("published, routed to {}", p.routed_to.join(", "))
    };
    json!({"messageId": p.message_id, "status": "successful", "statusMessage": text})
}

/// The 413 answer of a publish: every message failed (a batch is all or
/// nothing), the reason on each.
fn too_large(ids: &[String], why: &str, status: StatusCode, batch: bool) -> Response {
    let item = |id: &String| json!({"messageId": id, "status": "failure", "statusMessage": why});
    if batch {
        json_response(status, &Value::Array(ids.iter().map(item).collect()))
    } else {
        json_response(status, &item(&ids[0]))
    }
}

/// A publish request's body: whole, or (`Err`) its first `limit` bytes
/// when it is longer. The rest of a longer body is read and dropped, up
/// to `limit` bytes more, so that a client still sending gets the answer
/// instead of a reset connection.
async fn publish_body(body: Body, limit: usize) -> Result<Result<Bytes, Bytes>, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut over = false;
    let mut dropped = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad(format!("the request body could not be read: {e}")))?;
        if over {
            dropped += chunk.len();
            if dropped > limit {
                break;
            }
            continue;
        }
        let room = limit - buf.len();
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            over = true;
            dropped = chunk.len() - room;
        } else {
            buf.extend_from_slice(&chunk);
        }
    }
    Ok(if over {
        Err(Bytes::from(buf))
    } else {
        Ok(Bytes::from(buf))
    })
}

/// Why a publish request over the body limit was refused.
fn over_limit(limit: usize) -> String {
    format!(
        "the request body is more than {limit} bytes, the most a publish takes (ten messages of the \
         largest size a message may have, with room for the JSON around them): nothing was published"
    )
}

/// `PUT .../messages/{id}`: publish one message (201).
async fn publish_one(
    State(api): State<Arc<Api>>,
    p: Result<Path<One>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (_, _, dest, id) = path(p)?;
    api.allowed(&headers, Action::Publish, &dest)?;
    let limit = api.opts.max_body_bytes;
    let body = match publish_body(body, limit).await? {
        Ok(b) => b,
        Err(_) => {
            let status = StatusCode::PAYLOAD_TOO_LARGE;
            return Ok(too_large(&[id], &over_limit(limit), status, false));
        }
    };
    let v = json_body(&body)?;
    let m = message::new_message(&v, "", Some(&id))?;
    match api.publish(&dest, vec![m]).await {
        Ok(r) => Ok(json_response(StatusCode::CREATED, &published(&r[0]))),
        Err(e) if e.status == StatusCode::PAYLOAD_TOO_LARGE => {
            Ok(too_large(&[id], &e.message, e.status, false))
        }
        Err(e) => Err(e),
    }
}

/// `PUT .../messages`: publish 1 to 10 messages, all or nothing, with a
/// status per message.
async fn publish_batch(
    State(api): State<Arc<Api>>,
    p: Result<Path<Dest>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (_, _, dest) = path(p)?;
    api.allowed(&headers, Action::Publish, &dest)?;
    let limit = api.opts.max_body_bytes;
    let body = match publish_body(body, limit).await? {
        Ok(b) => b,
        Err(prefix) => {
            // Not read whole: the messages whose ids were read are named,
            // each with the reason (as for a message over the size limit).
            let mut ids = message::batch_ids(&prefix);
            let why = if ids.is_empty() {
                ids.push(String::new());
                format!(
                    "{}; no headers.messageId was found in its first {limit} bytes",
                    over_limit(limit)
                )
            } else {
                format!(
                    "{} (a batch is published all or nothing)",
                    over_limit(limit)
                )
            };
            return Ok(too_large(&ids, &why, StatusCode::PAYLOAD_TOO_LARGE, true));
        }
    };
    let v = json_body(&body)?;
    let Value::Array(items) = v else {
        return Err(ApiError::bad(format!(
            "a batch publish takes a JSON array of 1 to {MAX_BATCH} messages, not {}",
            message::kind(&v)
        )));
    };
    if items.is_empty() || items.len() > MAX_BATCH {
        return Err(ApiError::bad(format!(
            "a batch holds 1 to {MAX_BATCH} messages, not {}",
            items.len()
        )));
    }
    let msgs = items
        .iter()
        .enumerate()
        .map(|(i, v)| message::new_message(v, &format!("messages[{i}]."), None))
        .collect::<Result<Vec<_>, _>>()?;
    let ids: Vec<String> = msgs
        .iter()
        .map(|m| m.message_id.clone().unwrap_or_default())
        .collect();
    match api.publish(&dest, msgs).await {
        Ok(r) => Ok(json_response(
            StatusCode::OK,
            &Value::Array(r.iter().map(published).collect()),
        )),
        Err(e) if e.status == StatusCode::PAYLOAD_TOO_LARGE => Ok(too_large(
            &ids,
            &format!("{} (a batch is published all or nothing)", e.message),
            e.status,
            true,
        )),
        Err(e) => Err(e),
    }
}

// ---- consume ---------------------------------------------------------------

/// An integer query parameter within `lo..=hi`.
fn int_param(
    params: &[(String, String)],
    name: &str,
    lo: u64,
    hi: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(text) = param(params, name) else {
        return Ok(None);
    };
    match text.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(Some(v)),
        _ => Err(ApiError::bad(format!(
            "{name} {text:?} must be an integer from {lo} to {hi}"
        ))),
    }
}

/// A lock length in milliseconds as the engine takes it: below one second
/// it is raised to one second (the shortest lease); above 12 hours (the
/// longest) it is refused.
fn lock_ms(field: &str, ms: u64) -> Result<u64, ApiError> {
    let (min, max, _) = limits::ACK_TIMEOUT;
    if ms > max {
        return Err(ApiError::bad(format!(
            "{field} {ms} ms is more than {max} ms (12 hours), the longest lock Letterbox grants"
        )));
    }
    Ok(ms.max(min))
}

/// A queue name that is not a queue: an exchange (400) or nothing (404).
fn not_a_queue(api: &Api, dest: &str, what: &str) -> ApiError {
    if api.broker.get_exchange(dest).is_ok() {
        ApiError::bad(format!(
            "destination {dest} is an exchange: {what} on the queues bound to it"
        ))
    } else {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Destination not found: {dest}"),
        )
    }
}

/// `GET .../messages`: lock and return up to `batchSize` messages, waiting
/// up to `pollingTime` for the first; 204 when none is ready.
async fn consume(
    State(api): State<Arc<Api>>,
    p: Result<Path<Dest>, PathRejection>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (_, _, dest) = path(p)?;
    api.allowed(&headers, Action::Consume, &dest)?;
    let params = query(q.as_deref());
    let wait = int_param(&params, "pollingTime", 0, limits::MAX_WAIT)?.unwrap_or(10_000);
    let batch = int_param(&params, "batchSize", 1, MAX_BATCH as u64)?.unwrap_or(1);
    // The specification allows locks up to 24 hours, the rest of the
    // Anypoint MQ documentation (and the engine) 12: longer ones are
    // granted for 12 hours, so that clients that ask for more work as they
    // do against Anypoint MQ.
    let (min_lock, max_lock, _) = limits::ACK_TIMEOUT;
    let ack_timeout = match int_param(&params, "lockTtl", 0, 86_400_000)? {
        None | Some(0) => None,
        Some(ms) => Some(ms.clamp(min_lock, max_lock)),
    };
    let visibility = match param(&params, "payloadVisibility") {
        None | Some("full") => Visibility::Full,
        Some("none") => Visibility::None,
        Some("conditional") => Visibility::Conditional,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "payloadVisibility {other:?} must be full, none or conditional"
            )));
        }
    };
    let opts = ReceiveOptions {
        max_messages: u32::try_from(batch).unwrap_or(1),
        wait,
        ack_timeout,
        auto_ack: false,
        max_per_group: 0,
    };
    let got = match api.broker.receive(&dest, opts).await {
        Err(QueueError::NotFound { kind: "queue", .. }) => {
            return Err(not_a_queue(&api, &dest, "messages are consumed"));
        }
        r => r.map_err(ApiError::from_queue)?,
    };
    if let Some(peer) = super::call_peer() {
        api.consumers
            .received(&dest, peer, std::time::Instant::now());
    }
    if got.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let out: Vec<Value> = got
        .into_iter()
        .map(|d| message::delivery(d, visibility))
        .collect();
    Ok(json_response(StatusCode::OK, &Value::Array(out)))
}

// ---- ack, nack, lock TTL -------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Ack,
    Nack,
    Extend,
}

/// One lock to settle; `ttl_ms`: the new lock length of an extension.
struct Item {
    message_id: String,
    lock_id: String,
    ttl_ms: u64,
}

/// The outcome of one item: a success text, or an error; for a nack
/// that settled, what became of the message.
struct Outcome {
    message_id: String,
    lock_id: String,
    result: Result<String, ApiError>,
    end: Option<LeaseEnd>,
}

fn expired(lock: &str) -> ApiError {
    ApiError::bad(format!("LockId: {lock} provided is expired"))
}

impl Api {
    /// The error for a lock that is no longer current: released with an
    /// earlier message of its FIFO group that failed first (SPEC §3), or
    /// expired.
    fn released(&self, lock: &str) -> ApiError {
        match self.broker.released_lease("lockId", lock) {
            Ok(Some(reason)) => ApiError::bad(format!(
                "LockId: {lock} was {reason}; the group restarts at that message, so this lock settles nothing"
            )),
            _ => expired(lock),
        }
    }

    /// The lock length of an extension, in milliseconds, from the `ttl`
    /// field `field` of a request.
    fn extension_ms(&self, field: &str, ttl: &Value) -> Result<u64, ApiError> {
        let ttl = message::integer(field, ttl)?;
        let ms = match self.opts.lock_ttl_unit {
            LockTtlUnit::Milliseconds => Some(ttl),
            LockTtlUnit::Seconds => ttl.checked_mul(1_000),
        };
        match ms {
            Some(0) => Err(ApiError::bad(format!("{field} must be at least 1"))),
            Some(ms) => lock_ms(field, ms),
            None => Err(ApiError::bad(format!("{field} {ttl} s is out of range"))),
        }
    }

    /// Settles locks of messages in the queue `dest`: each lock must be a
    /// current lease of that queue and of the message the item names.
    async fn settle(&self, dest: &str, op: Op, items: Vec<Item>) -> Result<Vec<Outcome>, ApiError> {
        if !items.is_empty() {
            validate::batch("items", items.len()).map_err(ApiError::from_queue)?;
        }
        if let Err(e) = self.broker.get_queue(dest) {
            return Err(match e {
                QueueError::NotFound { .. } => not_a_queue(self, dest, "messages are settled"),
                other => ApiError::from_queue(other),
            });
        }
        let started = self.now();
        let mut outcomes = Vec::with_capacity(items.len());
        // (index of the outcome, token, extension ms)
        let mut todo: Vec<(usize, String, u64)> = Vec::new();
        for item in items {
            let result = match self.check_lock(dest, &item) {
                Ok(()) => {
                    todo.push((outcomes.len(), item.lock_id.clone(), item.ttl_ms));
                    Ok(String::new())
                }
                Err(e) => Err(e),
            };
            outcomes.push(Outcome {
                message_id: item.message_id,
                lock_id: item.lock_id,
                result,
                end: None,
            });
        }
        if todo.is_empty() {
            return Ok(outcomes);
        }
        let tokens: Vec<String> = todo.iter().map(|(_, t, _)| t.clone()).collect();
        let plain = |r: Vec<Settled>| r.into_iter().map(|s| (s, None)).collect::<Vec<_>>();
        let settled = match op {
            Op::Ack => self.broker.ack(&tokens).await.map(plain),
            Op::Nack => {
                let nacks: Vec<Nack> = tokens
                    .iter()
                    .map(|t| Nack {
                        token: t.clone(),
                        delay: None,
                        reason: String::new(),
                        dead_letter: false,
                    })
                    .collect();
                self.broker.nack_ends(&nacks).await.map(|(ends, _)| ends)
            }
            Op::Extend => {
                let items: Vec<(String, u64)> =
                    todo.iter().map(|(_, t, ms)| (t.clone(), *ms)).collect();
                self.broker.extend(&items).await.map(plain)
            }
        }
        .map_err(ApiError::from_queue)?;
        for ((i, token, ms), (s, end)) in todo.iter().zip(settled) {
            let Some(o) = outcomes.get_mut(*i) else {
                continue;
            };
            o.result = match s {
                Settled::Ok { deadline } => Ok(match op {
                    Op::Ack => "message acknowledged".to_string(),
                    Op::Nack => nacked(end.as_ref()),
                    Op::Extend if deadline < started + ms => format!(
                        "lock extended until {} (capped by the queue's max lease total)",
                        message::rfc1123(deadline)
                    ),
                    Op::Extend => format!("lock extended until {}", message::rfc1123(deadline)),
                }),
                Settled::LeaseExpired(_) => Err(expired(token)),
                Settled::Released(_) => Err(self.released(token)),
            };
            o.end = end;
        }
        Ok(outcomes)
    }

    /// A lock must be a current lease on the named message of `dest`.
    fn check_lock(&self, dest: &str, item: &Item) -> Result<(), ApiError> {
        let lock = &item.lock_id;
        // Not one of the lock ids this broker issues: unknown to it, as
        // far as a client can tell (lock ids are opaque).
        let held = self
            .broker
            .lease_holder("lockId", lock)
            .map_err(|_| ApiError::bad(format!("LockId: {lock} is unknown or expired")))?;
        let Some(h) = held else {
            return Err(self.released(lock));
        };
        if h.queue != dest {
            return Err(ApiError::bad(format!(
                "LockId: {lock} is not a lock on destination {dest}"
            )));
        }
        if h.message_id != item.message_id {
            return Err(ApiError::bad(format!(
                "LockId: {lock} is not a lock of message {}",
                item.message_id
            )));
        }
        Ok(())
    }
}

/// The `statusMessage` of a nack that settled: what became of the
/// message.
fn nacked(end: Option<&LeaseEnd>) -> String {
    match end {
        None | Some(LeaseEnd::Requeued) => {
            "message released: available again for this or other consumers".to_string()
        }
        Some(LeaseEnd::DeadLettered {
            queue,
            reason,
            failed_attempts,
        }) => {
            let why = match reason {
                DeadLetterReason::MaxDeliveries => format!(
                    "it reached the queue's maxDeliveries ({})",
                    crate::units::count_of(
                        u64::from(*failed_attempts),
                        "failed attempt",
                        "failed attempts"
                    )
                ),
                DeadLetterReason::Expired => "its time to live had run out".to_string(),
                other => format!("reason {}", message::reason_name(*other)),
            };
            format!("message moved to the dead letter queue {queue}: {why}")
        }
        Some(LeaseEnd::Expired) => {
            "message released, but its time to live had run out: it was deleted".to_string()
        }
        Some(LeaseEnd::Parked) => "message released: it reached the queue's maxDeliveries and \
             holds its FIFO group until an operator skips or releases it (on_poison PARK_GROUP)"
            .to_string(),
    }
}

/// The answer fields of one settled item: `messageId`, `status`,
/// `statusMessage` and, for a nack that settled, `deadLettered` (whether
/// the message moved to a dead letter queue) and then
/// `deadLetterQueueId`.
fn outcome_fields(o: Outcome, with_lock: bool) -> Result<Map<String, Value>, ApiError> {
    let mut m = Map::new();
    m.insert("messageId".into(), o.message_id.into());
    if with_lock {
        m.insert("lockId".into(), o.lock_id.into());
    }
    let text = match o.result {
        Ok(t) => {
            m.insert("status".into(), "successful".into());
            t
        }
        Err(e) if !with_lock => return Err(e),
        Err(e) => {
            m.insert("status".into(), "failure".into());
            e.message
        }
    };
    m.insert("statusMessage".into(), text.into());
    if let Some(end) = o.end {
        let dlq = match end {
            LeaseEnd::DeadLettered { queue, .. } => Some(queue),
            _ => None,
        };
        m.insert("deadLettered".into(), dlq.is_some().into());
        if let Some(q) = dlq {
            m.insert("deadLetterQueueId".into(), q.into());
        }
    }
    Ok(m)
}

/// The answer of a single settle call.
fn single(mut outcomes: Vec<Outcome>) -> Result<Response, ApiError> {
    let o = outcomes
        .pop()
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no outcome"))?;
    Ok(json_response(
        StatusCode::OK,
        &Value::Object(outcome_fields(o, false)?),
    ))
}

/// The answer of a batch settle call: an array with a status per item.
fn batch(outcomes: Vec<Outcome>) -> Result<Response, ApiError> {
    let items = outcomes
        .into_iter()
        .map(|o| outcome_fields(o, true).map(Value::Object))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json_response(StatusCode::OK, &Value::Array(items)))
}

fn string_field(v: &Value, at: &str, name: &str) -> Result<String, ApiError> {
    match v.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        None => Err(ApiError::bad(format!("{at}{name} is required"))),
        Some(other) => Err(ApiError::bad(format!(
            "{at}{name} must be a string, not {}",
            message::kind(other)
        ))),
    }
}

impl Api {
    /// The lock length of an extension request's `ttl`.
    fn ttl_field(&self, v: &Value, at: &str) -> Result<u64, ApiError> {
        match v.get("ttl") {
            None => Err(ApiError::bad(format!("{at}ttl is required"))),
            Some(t) => self.extension_ms(&format!("{at}ttl"), t),
        }
    }

    /// The items of a batch settle body: `[{messageId, lockId[, ttl]},
    /// ...]`, every one well formed (else the request is refused).
    fn batch_items(&self, v: Value, with_ttl: bool) -> Result<Vec<Item>, ApiError> {
        let Value::Array(list) = v else {
            return Err(ApiError::bad(format!(
                "a batch takes a JSON array of {{messageId, lockId{}}} objects, not {}",
                if with_ttl { ", ttl" } else { "" },
                message::kind(&v)
            )));
        };
        list.iter()
            .enumerate()
            .map(|(i, v)| {
                let at = format!("[{i}].");
                if !v.is_object() {
                    return Err(ApiError::bad(format!(
                        "[{i}] must be an object, not {}",
                        message::kind(v)
                    )));
                }
                Ok(Item {
                    message_id: string_field(v, &at, "messageId")?,
                    lock_id: string_field(v, &at, "lockId")?,
                    ttl_ms: if with_ttl { self.ttl_field(v, &at)? } else { 0 },
                })
            })
            .collect()
    }
}

/// The JSON object body of a single settle call. When it is something
/// else, the error starts with `takes`, what the call takes.
fn settle_body(body: Result<Bytes, BytesRejection>, takes: &str) -> Result<Value, ApiError> {
    let v = json_body(&body_bytes(body)?)?;
    if !v.is_object() {
        return Err(ApiError::bad(format!("{takes}, not {}", message::kind(&v))));
    }
    Ok(v)
}

/// `DELETE .../messages/{id}` with `{"lockId": ...}`: acknowledge.
async fn ack_one(
    State(api): State<Arc<Api>>,
    p: Result<Path<One>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (_, _, dest, id) = path(p)?;
    api.allowed(&headers, Action::Consume, &dest)?;
    let v = settle_body(body, "an ack takes {\"lockId\": ...}")?;
    let item = Item {
        message_id: id,
        lock_id: string_field(&v, "", "lockId")?,
        ttl_ms: 0,
    };
    single(api.settle(&dest, Op::Ack, vec![item]).await?)
}

/// `DELETE .../messages/{id}/locks/{lock}`: release (nack) a lock.
async fn nack_one(
    State(api): State<Arc<Api>>,
    p: Result<Path<Lock>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, _, dest, id, lock) = path(p)?;
    api.allowed(&headers, Action::Consume, &dest)?;
    let item = Item {
        message_id: id,
        lock_id: lock,
        ttl_ms: 0,
    };
    single(api.settle(&dest, Op::Nack, vec![item]).await?)
}

/// `PATCH .../messages/{id}/locks/{lock}` with `{"ttl": n}`: set the lock
/// to expire `ttl` from now.
async fn extend_one(
    State(api): State<Arc<Api>>,
    p: Result<Path<Lock>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (_, _, dest, id, lock) = path(p)?;
    api.allowed(&headers, Action::Consume, &dest)?;
    let v = settle_body(body, "a lock TTL change takes {\"ttl\": n}")?;
    let item = Item {
        message_id: id,
        ttl_ms: api.ttl_field(&v, "")?,
        lock_id: lock,
    };
    single(api.settle(&dest, Op::Extend, vec![item]).await?)
}

/// A batch settle call: `op` on the items of the body (with a `ttl` each
/// for [`Op::Extend`]), answered with a status per item.
async fn settle_batch(
    api: &Api,
    p: Result<Path<Dest>, PathRejection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    op: Op,
) -> Result<Response, ApiError> {
    let (_, _, dest) = path(p)?;
    api.allowed(headers, Action::Consume, &dest)?;
    let items = api.batch_items(json_body(&body_bytes(body)?)?, op == Op::Extend)?;
    batch(api.settle(&dest, op, items).await?)
}

/// `DELETE .../messages` with `[{messageId, lockId}, ...]`: acknowledge a
/// batch.
async fn ack_batch(
    State(api): State<Arc<Api>>,
    p: Result<Path<Dest>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    settle_batch(&api, p, &headers, body, Op::Ack).await
}

/// `DELETE .../messages/locks` with `[{messageId, lockId}, ...]`: release
/// a batch of locks.
async fn nack_batch(
    State(api): State<Arc<Api>>,
    p: Result<Path<Dest>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    settle_batch(&api, p, &headers, body, Op::Nack).await
}

/// `PATCH .../messages/locks` with `[{messageId, lockId, ttl}, ...]`.
async fn extend_batch(
    State(api): State<Arc<Api>>,
    p: Result<Path<Dest>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    settle_batch(&api, p, &headers, body, Op::Extend).await
}
