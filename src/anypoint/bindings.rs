//! The Admin API's exchanges and bindings (with their routing rules: string
//! equality, the one kind of filter Letterbox bindings have), routed by
//! `admin`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Map, Value, json};

use super::admin::{
    Answer, Named, Pair, admin_err, count_param, exchange_json, listing, no_content, object_body,
};
use super::error::ApiError;
use super::message::kind;
use super::{Api, json_response, param, query};

// ---- exchanges -------------------------------------------------------------

/// `PUT .../destinations/exchanges/{exchange}`: create (idempotent).
pub(super) async fn put_exchange(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let name = api.administered(p, &headers)?;
    let b = object_body(body)?;
    if let Some(v) = b.get("encrypted")
        && !v.is_boolean()
    {
        return Err(
            ApiError::bad(format!("encrypted must be true or false, not {}", kind(v))).into(),
        );
    }
    if api.broker.get_queue(&name).is_ok() {
        return Err(ApiError::bad(format!(
            "a queue named {name} exists: queues and exchanges share one namespace of destinations"
        ))
        .into());
    }
    let (_, created) = api.broker.create_exchange(&name).await.map_err(admin_err)?;
    if created {
        api.audit("exchange.create", &name, "");
    }
    Ok(json_response(StatusCode::OK, &exchange_json(&name)))
}

pub(super) async fn get_exchange(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let name = api.administered(p, &headers)?;
    api.broker.get_exchange(&name).map_err(admin_err)?;
    Ok(json_response(StatusCode::OK, &exchange_json(&name)))
}

/// `PATCH` of an exchange: its only field, `encrypted`, has no effect, so
/// this answers the exchange as it is.
pub(super) async fn get_exchange_patch(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    object_body(body)?;
    get_exchange(State(api), p, headers).await
}

pub(super) async fn delete_exchange(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let name = api.administered(p, &headers)?;
    api.broker.delete_exchange(&name).await.map_err(admin_err)?;
    api.audit("exchange.delete", &name, "");
    Ok(no_content())
}

// ---- bindings --------------------------------------------------------------

fn rules_json(filter: &[(String, String)]) -> Value {
    Value::Array(
        filter
            .iter()
            .map(|(k, v)| {
                json!({"propertyName": k, "propertyType": "STRING", "matcherType": "EQ", "value": v})
            })
            .collect(),
    )
}

fn binding_json(exchange: &str, queue: &str, filter: Option<&[(String, String)]>) -> Value {
    let mut m = Map::new();
    m.insert("exchangeId".into(), exchange.into());
    m.insert("queueId".into(), queue.into());
    if let Some(f) = filter
        && !f.is_empty()
    {
        m.insert("routingRules".into(), rules_json(f));
    }
    Value::Object(m)
}

/// `inclusion` of a binding read: `all` shows routing rules, `minimal`
/// (the default) does not.
fn with_rules(params: &[(String, String)]) -> Result<bool, ApiError> {
    match param(params, "inclusion") {
        None | Some("minimal") => Ok(false),
        Some("all") => Ok(true),
        Some(other) => Err(ApiError::bad(format!(
            "inclusion {other:?} must be all or minimal"
        ))),
    }
}

/// A page of a listing, by `offset` and `limit` (20).
fn page<T>(items: Vec<T>, params: &[(String, String)]) -> Result<Vec<T>, ApiError> {
    let offset = count_param(params, "offset", 0)?;
    let limit = count_param(params, "limit", 20)?;
    Ok(items.into_iter().skip(offset).take(limit).collect())
}

/// `GET .../bindings/exchanges/{exchange}`: the queues bound to it.
pub(super) async fn exchange_bindings(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    let name = api.administered(p, &headers)?;
    let params = query(q.as_deref());
    let rules = with_rules(&params)?;
    let x = api.broker.get_exchange(&name).map_err(admin_err)?;
    let all: Vec<Value> = x
        .bindings
        .iter()
        .filter(|(q, _)| q.starts_with(param(&params, "startsWith").unwrap_or("")))
        .map(|(q, f)| binding_json(&name, q, rules.then_some(f.as_slice())))
        .collect();
    Ok(listing(page(all, &params)?))
}

/// `GET .../bindings/queues/{queue}`: the exchanges bound to it.
pub(super) async fn queue_bindings(
    State(api): State<Arc<Api>>,
    p: Result<Path<Named>, PathRejection>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    let name = api.administered(p, &headers)?;
    let params = query(q.as_deref());
    let rules = with_rules(&params)?;
    api.broker.get_queue(&name).map_err(admin_err)?;
    let prefix = param(&params, "startsWith").unwrap_or("");
    let all: Vec<Value> = api
        .all_exchanges()?
        .iter()
        .filter(|x| x.name.starts_with(prefix))
        .filter_map(|x| {
            x.bindings
                .iter()
                .find(|(q, _)| *q == name)
                .map(|(q, f)| binding_json(&x.name, q, rules.then_some(f.as_slice())))
        })
        .collect();
    Ok(listing(page(all, &params)?))
}

impl Api {
    /// The filter of a binding, or 404.
    fn binding(&self, exchange: &str, queue: &str) -> Result<Vec<(String, String)>, ApiError> {
        let x = self.broker.get_exchange(exchange).map_err(admin_err)?;
        x.bindings
            .into_iter()
            .find(|(q, _)| q == queue)
            .map(|(_, f)| f)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("binding not found: {exchange} -> {queue}"),
                )
            })
    }

    /// Replaces the routing rules of an existing binding (404 when there
    /// is none).
    async fn set_rules(
        &self,
        exchange: &str,
        queue: &str,
        filter: Vec<(String, String)>,
    ) -> Result<(), ApiError> {
        self.binding(exchange, queue)?;
        self.broker
            .bind(exchange, queue, filter)
            .await
            .map_err(admin_err)?;
        self.audit(
            "exchange.bind",
            exchange,
            &format!("queue={queue} (routing rules)"),
        );
        Ok(())
    }
}

/// `PUT .../bindings/exchanges/{exchange}/queues/{queue}`: bind (an
/// existing binding keeps its routing rules).
pub(super) async fn put_binding(
    State(api): State<Arc<Api>>,
    p: Result<Path<Pair>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let (exchange, queue) = api.administered_binding(p, &headers)?;
    let filter = match api.binding(&exchange, &queue) {
        Ok(f) => f,
        Err(e) if e.status == StatusCode::NOT_FOUND => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    api.broker.get_queue(&queue).map_err(admin_err)?;
    api.broker
        .bind(&exchange, &queue, filter)
        .await
        .map_err(admin_err)?;
    api.audit("exchange.bind", &exchange, &format!("queue={queue}"));
    Ok(json_response(
        StatusCode::OK,
        &binding_json(&exchange, &queue, None),
    ))
}

pub(super) async fn get_binding(
    State(api): State<Arc<Api>>,
    p: Result<Path<Pair>, PathRejection>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Answer {
    let (exchange, queue) = api.administered_binding(p, &headers)?;
    let rules = with_rules(&query(q.as_deref()))?;
    let f = api.binding(&exchange, &queue)?;
    Ok(json_response(
        StatusCode::OK,
        &binding_json(&exchange, &queue, rules.then_some(f.as_slice())),
    ))
}

pub(super) async fn delete_binding(
    State(api): State<Arc<Api>>,
    p: Result<Path<Pair>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let (exchange, queue) = api.administered_binding(p, &headers)?;
    api.broker
        .unbind(&exchange, &queue)
        .await
        .map_err(admin_err)?;
    api.audit("exchange.unbind", &exchange, &format!("queue={queue}"));
    Ok(no_content())
}

/// The filter of a routing-rules body: at most one rule, and only string
/// equality (Letterbox bindings filter on equal property values); other
/// matchers are 501, as the Admin API answers what a broker does not
/// implement.
fn routing_filter(b: &Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    // The specification's example wraps the body in `value`.
    let b = match b.get("value") {
        Some(Value::Object(inner)) if !b.contains_key("routingRules") => inner,
        _ => b,
    };
    let rules = match b.get("routingRules") {
        Some(Value::Array(r)) => r,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "routingRules must be an array, not {}",
                kind(other)
            )));
        }
        None => return Err(ApiError::bad("routingRules is required")),
    };
    if rules.len() > 1 {
        return Err(ApiError::bad(format!(
            "routingRules holds {} rules: at most one routing rule is allowed per binding",
            rules.len()
        )));
    }
    let mut filter = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let field = |k: &str| -> Result<&str, ApiError> {
            r.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    ApiError::bad(format!("routingRules[{i}].{k} is required (a string)"))
                })
        };
        let name = field("propertyName")?;
        let ptype = field("propertyType")?;
        let matcher = field("matcherType")?;
        let value = r.get("value").unwrap_or(&Value::Null);
        match (ptype, matcher, value) {
            ("STRING", "EQ", Value::String(v)) if !v.is_empty() => {
                filter.push((name.to_string(), v.clone()));
            }
            ("STRING", "EQ", _) => {
                return Err(ApiError::bad(format!(
                    "routingRules[{i}].value must be a non-empty string for STRING EQ"
                )));
            }
            ("STRING", "PREFIX" | "ANY_OF" | "NONE_OF" | "EXISTS", _)
            | ("NUMERIC", "EQ" | "LT" | "LE" | "GT" | "GE" | "RANGE" | "NONE_OF" | "EXISTS", _) => {
                return Err(ApiError::new(
                    StatusCode::NOT_IMPLEMENTED,
                    format!(
                        "routing rule {ptype} {matcher} is not supported by Letterbox: bindings filter on string equality only (STRING EQ)"
                    ),
                ));
            }
            _ => {
                return Err(ApiError::bad(format!(
                    "routingRules[{i}]: {ptype} {matcher} is not a routing rule (propertyType STRING or NUMERIC, with a matcherType of that type)"
                )));
            }
        }
    }
    Ok(filter)
}

/// `PUT .../rules/routing`: replace the binding's routing rules (201).
pub(super) async fn put_rules(
    State(api): State<Arc<Api>>,
    p: Result<Path<Pair>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let (exchange, queue) = api.administered_binding(p, &headers)?;
    let filter = routing_filter(&object_body(body)?)?;
    api.set_rules(&exchange, &queue, filter.clone()).await?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"exchangeId": exchange, "queueId": queue, "routingRules": rules_json(&filter)}),
    ))
}

/// `DELETE .../rules/routing`: the binding routes every message again.
pub(super) async fn delete_rules(
    State(api): State<Arc<Api>>,
    p: Result<Path<Pair>, PathRejection>,
    headers: HeaderMap,
) -> Answer {
    let (exchange, queue) = api.administered_binding(p, &headers)?;
    api.set_rules(&exchange, &queue, Vec::new()).await?;
    Ok(no_content())
}
