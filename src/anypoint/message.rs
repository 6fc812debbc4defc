//! The message JSON of the Broker API and the engine's messages.
//!
//! A published message is `{"headers": {...}, "properties": {...}, "body":
//! "..."}`. `headers.messageId` is the client's id (the engine keeps it as
//! the message id), `messageGroupId` the FIFO group, `deliveryDelay` and
//! `ttl` milliseconds (numbers, or strings of digits as consumers receive
//! them). Properties pass through unchanged: a string stays a string;
//! any other JSON value (a number, mostly) is stored as its JSON text and
//! named in the reserved property [`META_PROPERTY`], which also keeps the
//! publish's `deliveryDelay`, so that consumers get back what was sent.
//!
//! A delivered message carries the headers as strings: `messageId`,
//! `lockId` (the engine's ack token), `created` (publish time, RFC 1123),
//! `deliveryCount`, `ttl` (its time to live in this queue, ms) and, when
//! known, `messageGroupId` and `deliveryDelay`. The body is the UTF-8
//! text; a body that is not UTF-8 (published over gRPC) is sent in
//! base64 with the header `payloadEncoding: base64`.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::queue::model::{Delivery, NewMessage};

/// The reserved property that records which properties were not strings
/// (`json`: their names) and the publish's `deliveryDelay`.
pub(crate) const META_PROPERTY: &str = "anypoint.meta";

/// Bodies above this size are hidden by `payloadVisibility=conditional`.
const CONDITIONAL_LIMIT: usize = 1 << 20;

/// The `payloadVisibility` of a consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Visibility {
    /// Always show the body.
    Full,
    /// Never show it.
    None,
    /// Hide bodies larger than 1 MiB.
    Conditional,
}

/// How a JSON value is called in errors.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A non-negative integer: a JSON number or a string of digits (headers
/// come back as strings, and clients pass them on).
pub(crate) fn integer(field: &str, v: &Value) -> Result<u64, ApiError> {
    let parsed = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        ApiError::bad(format!(
            "{field} must be a non-negative integer, not {v} ({})",
            kind(v)
        ))
    })
}

fn optional_string(field: &str, v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::bad(format!(
            "{field} must be a string, not {}",
            kind(other)
        ))),
    }
}

/// A message of a publish request. `at` prefixes field names in errors
/// (`messages[2].`, or empty); `path_id` is the id in the path of a
/// single publish (it wins over a `headers.messageId`).
pub(crate) fn new_message(
    v: &Value,
    at: &str,
    path_id: Option<&str>,
) -> Result<NewMessage, ApiError> {
    let Value::Object(obj) = v else {
        return Err(ApiError::bad(format!(
            "{}a message must be a JSON object with headers, properties and body, not {}",
            if at.is_empty() {
                String::new()
            } else {
                format!("{at}: ")
            },
            kind(v)
        )));
    };
    let empty = Map::new();
    let headers = match obj.get("headers") {
        None => &empty,
        Some(Value::Object(h)) => h,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "{at}headers must be an object, not {}",
                kind(other)
            )));
        }
    };
    let header_id = optional_string(&format!("{at}headers.messageId"), headers.get("messageId"))?;
    // The path names the message of a single publish.
    let message_id = match (header_id, path_id) {
        (_, Some(p)) => p.to_string(),
        (Some(h), None) => h,
        (None, None) => {
            return Err(ApiError::bad(format!(
                "{at}headers.messageId is required: Anypoint MQ clients choose their message ids"
            )));
        }
    };
    let group_id = optional_string(
        &format!("{at}headers.messageGroupId"),
        headers.get("messageGroupId"),
    )?;
    let millis = |name: &str| -> Result<Option<u64>, ApiError> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => integer(&format!("{at}headers.{name}"), v).map(Some),
        }
    };
    let delay = millis("deliveryDelay")?;
    let ttl = millis("ttl")?;
    let mut properties = Vec::new();
    let mut typed = Vec::new();
    match obj.get("properties") {
        None => {}
        Some(Value::Object(props)) => {
            for (k, v) in props {
                if k == META_PROPERTY {
                    return Err(ApiError::bad(format!(
                        "{at}properties.{k} is reserved: Letterbox uses it to keep property types"
                    )));
                }
                match v {
                    Value::String(s) => properties.push((k.clone(), s.clone())),
                    other => {
                        properties.push((k.clone(), other.to_string()));
                        typed.push(Value::String(k.clone()));
                    }
                }
            }
        }
        Some(other) => {
            return Err(ApiError::bad(format!(
                "{at}properties must be an object, not {}",
                kind(other)
            )));
        }
    }
    if !typed.is_empty() || delay.is_some() {
        let mut meta = Map::new();
        if !typed.is_empty() {
            meta.insert("json".into(), Value::Array(typed));
        }
        if let Some(d) = delay {
            meta.insert("deliveryDelay".into(), Value::from(d));
        }
        properties.push((META_PROPERTY.to_string(), Value::Object(meta).to_string()));
    }
    let body = match obj.get("body") {
        Some(Value::String(s)) => Bytes::from(s.clone().into_bytes()),
        None => {
            return Err(ApiError::bad(format!("{at}body is required (a string)")));
        }
        Some(other) => {
            return Err(ApiError::bad(format!(
                "{at}body must be a string, not {}",
                kind(other)
            )));
        }
    };
    Ok(NewMessage {
        message_id: Some(message_id),
        body,
        properties,
        ttl,
        delay,
        group_id,
        dedup_id: None,
    })
}

/// Turns a message's group into a header kept in [`META_PROPERTY`] (and
/// returned to consumers): a standard queue (and so an exchange, which
/// only standard queues are bound to) has no groups, and Anypoint MQ
/// clients may send `messageGroupId` to any destination.
pub(crate) fn ungroup(m: &mut NewMessage) {
    let Some(group) = m.group_id.take() else {
        return;
    };
    let mut meta = match m.properties.iter().position(|(k, _)| k == META_PROPERTY) {
        Some(i) => {
            let (_, text) = m.properties.remove(i);
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(o)) => o,
                _ => Map::new(),
            }
        }
        None => Map::new(),
    };
    meta.insert("messageGroupId".into(), Value::String(group));
    m.properties
        .push((META_PROPERTY.to_string(), Value::Object(meta).to_string()));
}

/// An instant (ms since the epoch) in RFC 1123 form, as HTTP dates are:
/// `Sat, 01 Jan 2022 02:08:22 GMT`.
pub(crate) fn rfc1123(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
        .unwrap_or_default()
}

/// The reserved property's content, if it is ours.
struct Meta {
    json: Vec<String>,
    delivery_delay: Option<u64>,
    group: Option<String>,
}

fn meta(props: &[(String, String)]) -> Option<Meta> {
    let (_, text) = props.iter().find(|(k, _)| k == META_PROPERTY)?;
    let Value::Object(m) = serde_json::from_str::<Value>(text).ok()? else {
        return None;
    };
    let json = match m.get("json") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    Some(Meta {
        json,
        delivery_delay: m.get("deliveryDelay").and_then(Value::as_u64),
        group: m
            .get("messageGroupId")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// A delivered message.
pub(crate) fn delivery(d: Delivery, visibility: Visibility) -> Value {
    let meta = meta(&d.properties);
    let mut properties = Map::new();
    for (k, v) in d.properties {
        match &meta {
            Some(_) if k == META_PROPERTY => {}
            Some(m) if m.json.contains(&k) => {
                let value = serde_json::from_str(&v).unwrap_or(Value::String(v));
                properties.insert(k, value);
            }
            _ => {
                properties.insert(k, Value::String(v));
            }
        }
    }
    let mut headers = Map::new();
    headers.insert("messageId".into(), d.message_id.into());
    if let Some(t) = d.ack_token {
        headers.insert("lockId".into(), t.into());
    }
    headers.insert("created".into(), rfc1123(d.published_at).into());
    headers.insert("deliveryCount".into(), d.delivery_count.to_string().into());
    headers.insert(
        "ttl".into(),
        d.expires_at
            .saturating_sub(d.enqueued_at)
            .to_string()
            .into(),
    );
    if let Some(g) = d
        .group_id
        .or_else(|| meta.as_ref().and_then(|m| m.group.clone()))
    {
        headers.insert("messageGroupId".into(), g.into());
    }
    if let Some(delay) = meta.as_ref().and_then(|m| m.delivery_delay) {
        headers.insert("deliveryDelay".into(), delay.to_string().into());
    }
    let hidden = match visibility {
        Visibility::Full => false,
        Visibility::None => true,
        Visibility::Conditional => d.body.len() > CONDITIONAL_LIMIT,
    };
    let body = if hidden {
        headers.insert("payloadHidden".into(), "true".into());
        String::new()
    } else {
        match String::from_utf8(d.body.to_vec()) {
            Ok(text) => text,
            Err(_) => {
                headers.insert("payloadEncoding".into(), "base64".into());
                base64::engine::general_purpose::STANDARD.encode(&d.body)
            }
        }
    };
    let mut out = Map::new();
    out.insert("headers".into(), Value::Object(headers));
    out.insert("properties".into(), Value::Object(properties));
    out.insert("body".into(), Value::String(body));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A delivery from the queue `q`, published, enqueued and delivered
    /// once at time 0, without a lock (auto-ack) or a group.
    fn delivered(message_id: &str, body: Bytes, properties: Vec<(String, String)>) -> Delivery {
        Delivery {
            queue: "q".into(),
            message_id: message_id.into(),
            body,
            properties,
            ack_token: None,
            delivery_count: 1,
            published_at: 0,
            first_delivered_at: 0,
            enqueued_at: 0,
            expires_at: 0,
            lease_deadline: 0,
            group_id: None,
            dead_letters: Vec::new(),
            attempts: Vec::new(),
        }
    }

    #[test]
    fn properties_keep_their_json_types_and_headers_come_back_as_strings() {
        let m = new_message(
            &json!({
                "headers": {"messageId": "m-1", "deliveryDelay": "1500", "ttl": 60000},
                "properties": {"s": "text", "n": 1009, "f": 5.5, "b": true},
                "body": "héllo"
            }),
            "",
            None,
        )
        .expect("valid");
        assert_eq!(m.message_id.as_deref(), Some("m-1"));
        assert_eq!((m.delay, m.ttl), (Some(1500), Some(60000)));
        assert!(m.properties.contains(&("n".into(), "1009".into())));
        let mut props = m.properties.clone();
        props.sort();
        let d = Delivery {
            ack_token: Some("tok".into()),
            delivery_count: 2,
            published_at: 1_641_002_902_000,
            enqueued_at: 1_000,
            expires_at: 61_000,
            ..delivered("m-1", m.body.clone(), props)
        };
        let v = delivery(d, Visibility::Full);
        assert_eq!(
            v["properties"],
            json!({"s": "text", "n": 1009, "f": 5.5, "b": true})
        );
        assert_eq!(
            v["headers"],
            json!({
                "messageId": "m-1", "lockId": "tok", "created": "Sat, 01 Jan 2022 02:08:22 GMT",
                "deliveryCount": "2", "ttl": "60000", "deliveryDelay": "1500"
            })
        );
        assert_eq!(v["body"], "héllo");
    }

    #[test]
    fn bad_messages_name_the_field() {
        let cases = [
            (json!({"body": "x"}), "headers.messageId is required"),
            (
                json!({"headers": {"messageId": 5}, "body": "x"}),
                "headers.messageId must be a string",
            ),
            (json!({"headers": {"messageId": "a"}}), "body is required"),
            (
                json!({"headers": {"messageId": "a"}, "body": {}}),
                "body must be a string",
            ),
            (
                json!({"headers": {"messageId": "a", "deliveryDelay": -1}, "body": ""}),
                "headers.deliveryDelay must be a non-negative integer",
            ),
            (
                json!({"headers": {"messageId": "a"}, "properties": {"anypoint.meta": "x"}, "body": ""}),
                "is reserved",
            ),
            (json!([1]), "must be a JSON object"),
        ];
        for (v, needle) in cases {
            let e = new_message(&v, "messages[3].", None).expect_err("invalid");
            assert!(e.message.contains(needle), "{v}: {}", e.message);
        }
        let m = new_message(
            &json!({"headers": {"messageId": "a"}, "body": ""}),
            "",
            Some("b"),
        )
        .expect("valid");
        assert_eq!(
            m.message_id.as_deref(),
            Some("b"),
            "the path names the message"
        );
        let e = new_message(
            &json!({"headers": {"messageId": "a"}, "properties": null, "body": ""}),
            "",
            None,
        )
        .expect_err("null is not an object");
        assert!(
            e.message.contains("properties must be an object, not null"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_group_on_a_standard_destination_is_a_header() {
        let mut m = new_message(
            &json!({"headers": {"messageId": "a", "messageGroupId": "g", "deliveryDelay": 5}, "body": ""}),
            "",
            None,
        )
        .expect("valid");
        ungroup(&mut m);
        assert_eq!(m.group_id, None);
        let d = delivered("a", Bytes::new(), m.properties.clone());
        let v = delivery(d, Visibility::Full);
        assert_eq!(
            (
                &v["headers"]["messageGroupId"],
                &v["headers"]["deliveryDelay"]
            ),
            (&json!("g"), &json!("5"))
        );
        assert_eq!(v["properties"], json!({}));
    }

    #[test]
    fn hidden_and_binary_bodies() {
        let d = |body: &'static [u8]| Delivery {
            group_id: Some("g".into()),
            ..delivered(
                "m",
                Bytes::from_static(body),
                vec![(META_PROPERTY.into(), "not json".into())],
            )
        };
        let v = delivery(d(b"secret"), Visibility::None);
        assert_eq!(
            (v["body"].as_str(), v["headers"]["payloadHidden"].as_str()),
            (Some(""), Some("true"))
        );
        assert_eq!(
            v["properties"][META_PROPERTY], "not json",
            "not ours: passed through"
        );
        let v = delivery(d(b"\xff\x00"), Visibility::Conditional);
        assert_eq!(v["body"], "/wA=");
        assert_eq!(v["headers"]["payloadEncoding"], "base64");
        assert_eq!(v["headers"]["messageGroupId"], "g");
    }
}
