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
//! `deliveryCount` (its deliveries in this queue, this one included: it
//! never goes down, a FIFO release included), `failedAttempts` (the
//! deliveries before this one that ended without an ack: what the queue's
//! `maxDeliveries` counts), `ttl` (its time to live in this queue, ms)
//! and, when known, `messageGroupId` and `deliveryDelay`. The body is the UTF-8
//! text; a body that is not UTF-8 (published over gRPC) is sent in
//! base64 with the header `payloadEncoding: base64`.
//!
//! A message that entered its queue by a move to it as a dead letter
//! queue also carries its dead-letter record (the last move, as gRPC's
//! `Browse` shows it) in the properties named by [`DeadLetterProps`]:
//! where it came from, why, after how many deliveries and failed
//! attempts, the last error a consumer gave and when.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::queue::model::{DeadLetter, DeadLetterReason, Delivery, NewMessage};

/// The reserved property that records which properties were not strings
/// (`json`: their names) and the publish's `deliveryDelay`.
pub(crate) const META_PROPERTY: &str = "anypoint.meta";

/// The properties of a delivered message that carry its dead-letter
/// record. They all start with [`DEAD_LETTER_PREFIX`].
pub(crate) struct DeadLetterProps;

impl DeadLetterProps {
    /// The queue the message left.
    pub(crate) const SOURCE: &str = "x-letterbox-dead-letter-source";
    /// Why it was moved: `MAX_DELIVERIES`, `REJECTED`, `EXPIRED`,
    /// `SKIPPED` or `CORRUPTED` (the names gRPC and the CLI use).
    pub(crate) const REASON: &str = "x-letterbox-dead-letter-reason";
    /// Its delivery count in that queue when it was moved.
    pub(crate) const DELIVERY_COUNT: &str = "x-letterbox-dead-letter-delivery-count";
    /// Its failed attempts in that queue when it was moved.
    pub(crate) const FAILED_ATTEMPTS: &str = "x-letterbox-dead-letter-failed-attempts";
    /// The last reason a consumer gave when it nacked it (absent when none
    /// did: the Anypoint nack carries no reason).
    pub(crate) const LAST_ERROR: &str = "x-letterbox-dead-letter-last-error";
    /// An operator's note (a skipped FIFO head, a damaged body), if any.
    pub(crate) const NOTE: &str = "x-letterbox-dead-letter-note";
    /// When it was moved (RFC 1123).
    pub(crate) const TIME: &str = "x-letterbox-dead-letter-time";
}

/// The prefix of the dead-letter properties.
pub(crate) const DEAD_LETTER_PREFIX: &str = "x-letterbox-dead-letter-";

/// A dead-letter reason's name.
pub(crate) fn reason_name(r: DeadLetterReason) -> &'static str {
    match r {
        DeadLetterReason::MaxDeliveries => "MAX_DELIVERIES",
        DeadLetterReason::Rejected => "REJECTED",
        DeadLetterReason::Expired => "EXPIRED",
        DeadLetterReason::Skipped => "SKIPPED",
        DeadLetterReason::Corrupted => "CORRUPTED",
    }
}

/// The dead-letter record of a delivery, when the message entered the
/// queue it was delivered from by that move (a move sets the time it
/// entered its new queue to the time of the move; a redrive back out of
/// the dead letter queue sets it later).
fn arrived_as_dead_letter(d: &Delivery) -> Option<&DeadLetter> {
    d.dead_letters.last().filter(|dl| dl.at >= d.enqueued_at)
}

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

/// One open container of a JSON text being scanned.
enum Frame {
    /// An array, at its `n`th element.
    Array(usize),
    /// An object: the key of the member being read (`None` while a key is
    /// expected, or when the key is not one looked for).
    Object(Option<Key>),
}

/// The keys [`batch_ids`] follows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Headers,
    MessageId,
    Other,
}

/// The `headers.messageId` of the messages of a batch publish body (a
/// JSON array of messages), in order, read from the first bytes of a body
/// that was too large to be read whole: every id that is complete within
/// `prefix`, and none for a message whose id comes after it. A scan, not
/// a parse: it stops at the first byte that cannot continue a JSON text.
pub(crate) fn batch_ids(prefix: &[u8]) -> Vec<String> {
    let mut ids = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut expect_key = false;
    let mut i = 0;
    while i < prefix.len() {
        match prefix[i] {
            b' ' | b'\t' | b'\r' | b'\n' => {}
            b'[' => stack.push(Frame::Array(0)),
            b'{' => {
                stack.push(Frame::Object(None));
                expect_key = true;
            }
            b']' | b'}' => {
                stack.pop();
                expect_key = false;
            }
            b',' => match stack.last_mut() {
                Some(Frame::Array(n)) => *n += 1,
                Some(Frame::Object(key)) => {
                    *key = None;
                    expect_key = true;
                }
                None => return ids,
            },
            b':' => expect_key = false,
            b'"' => {
                let start = i;
                i += 1;
                while i < prefix.len() && prefix[i] != b'"' {
                    i += if prefix[i] == b'\\' { 2 } else { 1 };
                }
                let Some(text) = prefix.get(start..=i) else {
                    return ids;
                };
                let value = || serde_json::from_slice::<String>(text).ok();
                if expect_key {
                    if let Some(Frame::Object(key)) = stack.last_mut() {
                        *key = Some(match value().as_deref() {
                            Some("headers") => Key::Headers,
                            Some("messageId") => Key::MessageId,
                            _ => Key::Other,
                        });
                    }
                } else if let [
                    Frame::Array(_),
                    Frame::Object(Some(Key::Headers)),
                    Frame::Object(Some(Key::MessageId)),
                ] = stack.as_slice()
                    && let Some(id) = value()
                {
                    ids.push(id);
                }
            }
            // A number, true, false or null: nothing looked for.
            b'-' | b'0'..=b'9' | b'a'..=b'z' | b'.' | b'+' | b'E' => {}
            _ => return ids,
        }
        i += 1;
    }
    ids
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
pub(crate) fn delivery(mut d: Delivery, visibility: Visibility) -> Value {
    let meta = meta(&d.properties);
    let dead_letter = arrived_as_dead_letter(&d).cloned();
    let mut properties = Map::new();
    for (k, v) in std::mem::take(&mut d.properties) {
        if dead_letter.is_some() && k.starts_with(DEAD_LETTER_PREFIX) {
            // A copy published with the message (a client that moved it
            // back by hand): the record of this move replaces it.
            continue;
        }
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
    if let Some(dl) = dead_letter {
        let mut put = |k: &str, v: String| {
            properties.insert(k.to_string(), Value::String(v));
        };
        put(DeadLetterProps::SOURCE, dl.source_queue);
        put(DeadLetterProps::REASON, reason_name(dl.reason).to_string());
        put(
            DeadLetterProps::DELIVERY_COUNT,
            dl.delivery_count.to_string(),
        );
        put(
            DeadLetterProps::FAILED_ATTEMPTS,
            dl.failed_attempts.to_string(),
        );
        if !dl.last_nack_reason.is_empty() {
            put(DeadLetterProps::LAST_ERROR, dl.last_nack_reason);
        }
        if !dl.note.is_empty() {
            put(DeadLetterProps::NOTE, dl.note);
        }
        put(DeadLetterProps::TIME, rfc1123(dl.at));
    }
    let mut headers = Map::new();
    headers.insert("messageId".into(), d.message_id.into());
    if let Some(t) = d.ack_token {
        headers.insert("lockId".into(), t.into());
    }
    headers.insert("created".into(), rfc1123(d.published_at).into());
    headers.insert("deliveryCount".into(), d.delivery_count.to_string().into());
    headers.insert(
        "failedAttempts".into(),
        d.failed_attempts.to_string().into(),
    );
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
            failed_attempts: 0,
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
            delivery_count: 3,
            failed_attempts: 1,
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
                "deliveryCount": "3", "failedAttempts": "1", "ttl": "60000",
                "deliveryDelay": "1500"
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
    fn ids_are_read_from_the_start_of_a_batch() {
        let text = json!([
            {"headers": {"messageId": "a\"1", "ttl": 5}, "properties": {"messageId": "not it", "n": [1, {"x": null}]}, "body": "x"},
            {"body": "{\"headers\": {\"messageId\": \"inside a body\"}}", "headers": {"messageGroupId": "g", "messageId": "b"}},
            {"headers": {"messageId": "c"}, "body": "yyyyyyyyyyyyyyyyyyyy"},
        ])
        .to_string();
        assert_eq!(batch_ids(text.as_bytes()), ["a\"1", "b", "c"]);
        // Cut inside the third message's id, then just after it.
        let cut = text.find("\"c\"").unwrap() + 2;
        assert_eq!(batch_ids(&text.as_bytes()[..cut]), ["a\"1", "b"]);
        assert_eq!(batch_ids(&text.as_bytes()[..cut + 1]), ["a\"1", "b", "c"]);
        // The id after a body cut short is not reached.
        let late = json!([{"body": "zzzzzzzz", "headers": {"messageId": "late"}}]).to_string();
        assert!(batch_ids(&late.as_bytes()[..14]).is_empty());
        assert!(batch_ids(b"not json").is_empty());
        assert!(
            batch_ids(b"{\"headers\": {\"messageId\": \"x\"}}").is_empty(),
            "not a batch"
        );
    }

    #[test]
    fn a_message_that_came_as_a_dead_letter_carries_its_record() {
        let record = DeadLetter {
            source_queue: "orders".into(),
            reason: DeadLetterReason::MaxDeliveries,
            delivery_count: 4,
            failed_attempts: 3,
            last_nack_reason: "payment service down".into(),
            at: 5_000,
            note: String::new(),
        };
        let d = Delivery {
            queue: "orders-dlq".into(),
            enqueued_at: 5_000,
            dead_letters: vec![record.clone()],
            ..delivered(
                "m",
                Bytes::new(),
                vec![
                    ("a".into(), "b".into()),
                    (DeadLetterProps::NOTE.into(), "stale copy".into()),
                ],
            )
        };
        let v = delivery(d.clone(), Visibility::Full);
        assert_eq!(
            v["properties"],
            json!({
                "a": "b",
                "x-letterbox-dead-letter-source": "orders",
                "x-letterbox-dead-letter-reason": "MAX_DELIVERIES",
                "x-letterbox-dead-letter-delivery-count": "4",
                "x-letterbox-dead-letter-failed-attempts": "3",
                "x-letterbox-dead-letter-last-error": "payment service down",
                "x-letterbox-dead-letter-time": "Thu, 01 Jan 1970 00:00:05 GMT",
            })
        );
        // Redriven out of the DLQ later: the record is history, not shown,
        // and published properties pass through.
        let redriven = Delivery {
            queue: "orders".into(),
            enqueued_at: 9_000,
            ..d
        };
        let v = delivery(redriven, Visibility::Full);
        assert_eq!(
            v["properties"],
            json!({"a": "b", "x-letterbox-dead-letter-note": "stale copy"})
        );
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
