//! Message actions: send (one, batch), receive, delete (one, batch),
//! change visibility (one, batch).
//!
//! Receipt handles are the engine's ack tokens. SQS lets a handle of an
//! earlier receive (or one whose visibility ran out) delete its message
//! and change its current visibility; so does this endpoint
//! (`Broker::delete_leased`, `Broker::current_lease_of`), unlike
//! Letterbox's own `Ack` and `ExtendLease`, which refuse a lease that is
//! over. A visibility of 0 (per receive, per queue, or a change) ends the
//! lease at once: the message counts as received and is visible again.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::auth::Action;
use crate::queue::annotations::Deleted;
use crate::queue::model::{Delivery, Nack, NewMessage, ReceiveOptions, SECOND, Settled};

use super::attributes;
use super::error::SqsError;
use super::message_attrs::{self as ma, Attrs};
use super::{Call, Sqs, integer, required, string, strings};

/// Most entries of a batch, and messages of a receive.
const MAX_BATCH: usize = 10;
/// Most bytes of all the messages of a `SendMessageBatch`.
const MAX_BATCH_BYTES: usize = 1_048_576;
/// How long a `ReceiveRequestAttemptId` is remembered.
const ATTEMPT_WINDOW: u64 = 5 * 60 * SECOND;

/// The FIFO receives of the last five minutes by `(queue,
/// ReceiveRequestAttemptId)`: a retry with the same id gets the same
/// messages and receipt handles while their receive is current. Kept in
/// memory: after a restart a retry is a new receive.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    seen: Mutex<HashMap<(String, String), Attempt>>,
}

/// A receive with an attempt id: when, its messages, their handles.
type Attempt = (u64, Vec<Value>, Vec<String>);

/// One entry of a batch request, checked.
fn batch_entries<'a>(input: &'a Value, entry: &str) -> Result<Vec<&'a Value>, SqsError> {
    let entries: Vec<&Value> = input
        .get("Entries")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if entries.is_empty() {
        return Err(SqsError::empty_batch(entry));
    }
    if entries.len() > MAX_BATCH {
        return Err(SqsError::too_many_entries(entries.len()));
    }
    let mut seen: Vec<&str> = Vec::new();
    for e in &entries {
        let id = string(e, "Id").unwrap_or_default();
        let ok = !id.is_empty()
            && id.len() <= 80
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            return Err(SqsError::batch_entry_id());
        }
        seen.push(id);
    }
    // The first id seen twice, in the order of the second sightings.
    for (i, id) in seen.iter().enumerate() {
        if seen[..i].contains(id) {
            return Err(SqsError::ids_not_distinct(id));
        }
    }
    Ok(entries)
}

fn failed(id: &str, e: &SqsError) -> Value {
    json!({"Id": id, "SenderFault": e.sender, "Code": e.code, "Message": e.message})
}

/// True for the characters SQS takes in a body (XML's).
fn valid_char(c: char) -> bool {
    matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// What a queue needs to know to take messages.
struct Target {
    name: String,
    fifo: bool,
    content_dedup: bool,
    group_scope: bool,
    max_size: u64,
}

/// A message to send, checked, and what its answer says.
struct Outgoing {
    msg: NewMessage,
    md5_body: String,
    md5_attrs: Option<String>,
    md5_system: Option<String>,
}

impl Sqs {
    fn target(&self, name: &str) -> Result<Target, SqsError> {
        let info = self.broker.get_queue(name).map_err(SqsError::from_queue)?;
        let ann = self
            .broker
            .annotations(name)
            .map_err(SqsError::from_queue)?;
        Ok(Target {
            name: name.to_string(),
            fifo: info.config.kind.is_fifo(),
            content_dedup: info.config.content_based_dedup,
            group_scope: attributes::annotated(&ann, "DeduplicationScope") == Some("messageGroup"),
            max_size: attributes::max_message_size(&ann),
        })
    }

    /// The `SenderId` of the caller's messages.
    fn sender(&self, call: &Call) -> String {
        if call.principal.name().is_empty() || !self.auth.is_enabled() {
            self.opts.account_id.clone()
        } else {
            call.principal.name().to_string()
        }
    }

    /// Reads and checks one message of a send. Errors of the request as a
    /// whole (a FIFO message without its group or deduplication id) are
    /// `Err(Ok(e))`; errors of this message alone `Err(Err(e))`.
    fn outgoing(
        &self,
        call: &Call,
        t: &Target,
        v: &Value,
    ) -> Result<Outgoing, Result<SqsError, SqsError>> {
        let body = required(v, "MessageBody").map_err(Err)?;
        if body.is_empty() {
            return Err(Err(SqsError::missing("MessageBody")));
        }
        if !body.chars().all(valid_char) {
            return Err(Err(SqsError::new_invalid_contents()));
        }
        let attrs = ma::parse(v.get("MessageAttributes"), false).map_err(Err)?;
        let system = ma::parse(v.get("MessageSystemAttributes"), true).map_err(Err)?;
        let size = body.len() + attrs.iter().map(|(k, a)| k.len() + a.size()).sum::<usize>();
        if u64::try_from(size).unwrap_or(u64::MAX) > t.max_size {
            return Err(Err(SqsError::invalid(format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {} bytes.",
                t.max_size
            ))));
        }
        let delay = integer(v, "DelaySeconds").map_err(Err)?;
        if let Some(d) = delay
            && !(0..=900).contains(&d)
        {
            return Err(Err(SqsError::bad_value(
                "DelaySeconds",
                d,
                "DelaySeconds must be >= 0 and <= 900.",
            )));
        }
        let group = string(v, "MessageGroupId").map(str::to_string);
        let mut dedup = string(v, "MessageDeduplicationId").map(str::to_string);
        for (param, value) in [
            ("MessageGroupId", &group),
            ("MessageDeduplicationId", &dedup),
        ] {
            if let Some(x) = value
                && (x.is_empty() || x.len() > 128 || !x.chars().all(|c| c.is_ascii_graphic()))
            {
                return Err(Err(SqsError::bad_value(
                    param,
                    x,
                    "It can only contain alphanumeric characters and punctuation, 1 to 128 long.",
                )));
            }
        }
        let mut props = Vec::new();
        ma::to_properties(&attrs, &mut props);
        props.push((ma::SENDER.to_string(), self.sender(call)));
        if let Some(trace) = system.get("AWSTraceHeader").and_then(|a| a.string.clone()) {
            props.push((ma::TRACE.to_string(), trace));
        }
        let mut msg = NewMessage {
            body: Bytes::copy_from_slice(body.as_bytes()),
            ..NewMessage::default()
        };
        if t.fifo {
            if delay.is_some_and(|d| d != 0) {
                return Err(Err(SqsError::bad_value(
                    "DelaySeconds",
                    delay.unwrap_or_default(),
                    "The request include parameter that is not valid for this queue type.",
                )));
            }
            let Some(g) = group else {
                return Err(Ok(SqsError::missing("MessageGroupId")));
            };
            if dedup.is_none() {
                if !t.content_dedup {
                    return Err(Ok(SqsError::invalid(
                        "The queue should either have ContentBasedDeduplication enabled or \
                         MessageDeduplicationId provided explicitly",
                    )));
                }
                dedup = Some(hex(&Sha256::digest(body.as_bytes())));
            }
            let d = dedup.unwrap_or_default();
            props.push((ma::DEDUP.to_string(), d.clone()));
            msg.dedup_id = Some(if t.group_scope {
                hex(&Sha256::digest(format!("{g}\u{1f}{d}").as_bytes()))
            } else {
                d
            });
            msg.group_id = Some(g);
        } else {
            // Standard queues keep these for the receiver (SQS's fair
            // queues take a group id); they order and dedup nothing here.
            if let Some(g) = group {
                props.push((ma::GROUP.to_string(), g));
            }
            if let Some(d) = dedup {
                props.push((ma::DEDUP.to_string(), d));
            }
            msg.delay = delay.map(|d| u64::try_from(d).unwrap_or(0) * SECOND);
        }
        msg.properties = props;
        Ok(Outgoing {
            md5_body: ma::md5_of_body(body.as_bytes()),
            md5_attrs: ma::md5_of_attributes(&attrs),
            md5_system: ma::md5_of_attributes(&system),
            msg,
        })
    }

    pub(crate) async fn send_message(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Publish, &name)?;
        let t = self.target(&name)?;
        let o = self
            .outgoing(call, &t, input)
            .map_err(|e| e.unwrap_or_else(|e| e))?;
        let published = self
            .broker
            .publish(&t.name, vec![o.msg])
            .await
            .map_err(SqsError::from_queue)?;
        let id = published
            .first()
            .map(|p| p.message_id.clone())
            .unwrap_or_default();
        let mut out = Map::new();
        out.insert("MD5OfMessageBody".into(), o.md5_body.into());
        if let Some(m) = o.md5_attrs {
            out.insert("MD5OfMessageAttributes".into(), m.into());
        }
        if let Some(m) = o.md5_system {
            out.insert("MD5OfMessageSystemAttributes".into(), m.into());
        }
        if t.fifo
            && let Some(s) = ma::sequence_number(&id)
        {
            out.insert("SequenceNumber".into(), s.into());
        }
        out.insert("MessageId".into(), id.into());
        Ok(Value::Object(out))
    }

    pub(crate) async fn send_message_batch(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Publish, &name)?;
        let entries = batch_entries(input, "SendMessageBatchRequestEntry")?;
        let total: usize = entries
            .iter()
            .map(|e| string(e, "MessageBody").map_or(0, str::len))
            .sum();
        if total > MAX_BATCH_BYTES {
            return Err(SqsError::batch_too_long(MAX_BATCH_BYTES, total));
        }
        let t = self.target(&name)?;
        let mut ok: Vec<(String, Outgoing)> = Vec::new();
        let mut failures = Vec::new();
        for e in entries {
            let id = string(e, "Id").unwrap_or_default().to_string();
            match self.outgoing(call, &t, e) {
                Ok(o) => ok.push((id, o)),
                Err(Ok(whole)) => return Err(whole),
                Err(Err(one)) => failures.push(failed(&id, &one)),
            }
        }
        let mut successful = Vec::new();
        if !ok.is_empty() {
            let msgs = ok.iter().map(|(_, o)| o.msg.clone()).collect();
            let published = self
                .broker
                .publish(&t.name, msgs)
                .await
                .map_err(SqsError::from_queue)?;
            for ((id, o), p) in ok.into_iter().zip(published) {
                let mut m = Map::new();
                m.insert("Id".into(), id.into());
                m.insert("MD5OfMessageBody".into(), o.md5_body.into());
                if let Some(x) = o.md5_attrs {
                    m.insert("MD5OfMessageAttributes".into(), x.into());
                }
                if let Some(x) = o.md5_system {
                    m.insert("MD5OfMessageSystemAttributes".into(), x.into());
                }
                if t.fifo
                    && let Some(s) = ma::sequence_number(&p.message_id)
                {
                    m.insert("SequenceNumber".into(), s.into());
                }
                m.insert("MessageId".into(), p.message_id.into());
                successful.push(Value::Object(m));
            }
        }
        Ok(json!({"Successful": successful, "Failed": failures}))
    }

    pub(crate) async fn receive_message(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Consume, &name)?;
        let max = match integer(input, "MaxNumberOfMessages")? {
            None => 1,
            Some(n) if (1..=10).contains(&n) => u32::try_from(n).unwrap_or(1),
            Some(n) => {
                return Err(SqsError::bad_value(
                    "MaxNumberOfMessages",
                    n,
                    "Must be between 1 and 10, if provided.",
                ));
            }
        };
        let ann = self
            .broker
            .annotations(&name)
            .map_err(SqsError::from_queue)?;
        let wait = match integer(input, "WaitTimeSeconds")? {
            None => attributes::default_wait(&ann),
            Some(n) if (0..=20).contains(&n) => u64::try_from(n).unwrap_or(0),
            Some(n) => {
                return Err(SqsError::bad_value(
                    "WaitTimeSeconds",
                    n,
                    "Must be >= 0 and <= 20, if provided.",
                ));
            }
        };
        let visibility = match integer(input, "VisibilityTimeout")? {
            None if attributes::visibility_zero(&ann) => Some(0),
            None => None,
            Some(n) if (0..=43_200).contains(&n) => Some(u64::try_from(n).unwrap_or(0) * SECOND),
            Some(n) => {
                return Err(SqsError::bad_value(
                    "VisibilityTimeout",
                    n,
                    "Must be >= 0 and <= 43200, if provided.",
                ));
            }
        };
        let mut system = strings(input, "AttributeNames");
        system.extend(strings(input, "MessageSystemAttributeNames"));
        let wanted = strings(input, "MessageAttributeNames");
        let attempt = string(input, "ReceiveRequestAttemptId").map(str::to_string);
        let now = self.now();
        if let Some(a) = &attempt
            && let Some(again) = self.retry(&name, a, now)
        {
            return Ok(json!({"Messages": again}));
        }
        let got = self
            .broker
            .receive(
                &name,
                ReceiveOptions {
                    max_messages: max,
                    wait: wait * SECOND,
                    ack_timeout: visibility,
                    auto_ack: false,
                    max_per_group: 0,
                },
            )
            .await
            .map_err(SqsError::from_queue)?;
        if got.is_empty() {
            return Ok(json!({}));
        }
        let messages: Vec<Value> = got
            .iter()
            .map(|d| self.message(call, d, &system, &wanted))
            .collect();
        if let Some(a) = attempt {
            let tokens = got.iter().filter_map(|d| d.ack_token.clone()).collect();
            let mut seen = self.attempts.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|_, (at, _, _)| now < *at + ATTEMPT_WINDOW);
            seen.insert((name, a), (now, messages.clone(), tokens));
        }
        Ok(json!({"Messages": messages}))
    }

    /// The messages of an earlier receive with the same attempt id, when
    /// all its receipt handles are still current.
    fn retry(&self, queue: &str, attempt: &str, now: u64) -> Option<Vec<Value>> {
        let seen = self.attempts.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (at, messages, tokens) = seen.get(&(queue.to_string(), attempt.to_string()))?;
        if now >= at + ATTEMPT_WINDOW {
            return None;
        }
        let current = tokens.iter().all(|t| {
            self.broker
                .lease_holder("ReceiptHandle", t)
                .is_ok_and(|h| h.is_some())
        });
        current.then(|| messages.clone())
    }

    /// One received message as SQS shapes it.
    fn message(&self, call: &Call, d: &Delivery, system: &[String], wanted: &[String]) -> Value {
        let all = system.iter().any(|s| s == "All");
        let want = |n: &str| all || system.iter().any(|s| s == n);
        let mut attrs = Map::new();
        let props = &d.properties;
        let mut put = |n: &str, v: Option<String>| {
            if want(n)
                && let Some(v) = v
            {
                attrs.insert(n.to_string(), v.into());
            }
        };
        put(
            "SenderId",
            Some(
                ma::reserved(props, ma::SENDER)
                    .map_or_else(|| self.opts.account_id.clone(), str::to_string),
            ),
        );
        put("SentTimestamp", Some(d.published_at.to_string()));
        put(
            "ApproximateReceiveCount",
            Some(d.delivery_count.to_string()),
        );
        put(
            "ApproximateFirstReceiveTimestamp",
            Some(d.first_delivered_at.to_string()),
        );
        let group = d
            .group_id
            .clone()
            .or_else(|| ma::reserved(props, ma::GROUP).map(str::to_string));
        let fifo = d.group_id.is_some();
        put("MessageGroupId", group);
        put(
            "MessageDeduplicationId",
            ma::reserved(props, ma::DEDUP).map(str::to_string),
        );
        put(
            "SequenceNumber",
            fifo.then(|| ma::sequence_number(&d.message_id)).flatten(),
        );
        put(
            "AWSTraceHeader",
            ma::reserved(props, ma::TRACE).map(str::to_string),
        );
        // The source of a message that entered this queue as a dead
        // letter (not one redriven out of a dead letter queue since).
        let source = d
            .dead_letters
            .last()
            .filter(|dl| dl.at >= d.enqueued_at)
            .map(|dl| self.arn(call, &dl.source_queue));
        put("DeadLetterQueueSourceArn", source);
        let body = match std::str::from_utf8(&d.body) {
            Ok(s) => s.to_string(),
            Err(_) => String::from_utf8_lossy(&d.body).into_owned(),
        };
        let mut m = Map::new();
        m.insert("MessageId".into(), d.message_id.clone().into());
        m.insert(
            "ReceiptHandle".into(),
            d.ack_token.clone().unwrap_or_default().into(),
        );
        m.insert("MD5OfBody".into(), ma::md5_of_body(body.as_bytes()).into());
        m.insert("Body".into(), body.into());
        if !attrs.is_empty() {
            m.insert("Attributes".into(), Value::Object(attrs));
        }
        let chosen: Attrs = ma::from_properties(props)
            .into_iter()
            .filter(|(k, _)| attribute_wanted(wanted, k))
            .collect();
        if let Some(md5) = ma::md5_of_attributes(&chosen) {
            m.insert("MD5OfMessageAttributes".into(), md5.into());
            m.insert(
                "MessageAttributes".into(),
                Value::Object(
                    chosen
                        .iter()
                        .map(|(k, a)| (k.clone(), a.to_json()))
                        .collect(),
                ),
            );
        }
        Value::Object(m)
    }

    pub(crate) async fn delete_message(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Consume, &name)?;
        let handle = required(input, "ReceiptHandle")?;
        if crate::queue::token::AckToken::parse("ReceiptHandle", handle).is_err() {
            return Err(SqsError::receipt_handle(
                "The input receipt handle is invalid.",
            ));
        }
        let out = self
            .broker
            .delete_leased(&name, &[handle.to_string()])
            .await
            .map_err(SqsError::from_queue)?;
        match out.first() {
            Some(Deleted::OtherQueue) => Err(SqsError::receipt_handle(format!(
                "The input receipt handle \"{handle}\" is not a valid receipt handle for queue {name}."
            ))),
            _ => Ok(json!({})),
        }
    }

    pub(crate) async fn delete_message_batch(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Consume, &name)?;
        let entries = batch_entries(input, "DeleteMessageBatchRequestEntry")?;
        let mut handles = Vec::new();
        let mut results: Vec<Result<String, Value>> = Vec::new();
        for e in entries {
            let id = string(e, "Id").unwrap_or_default().to_string();
            let h = string(e, "ReceiptHandle").unwrap_or_default();
            if crate::queue::token::AckToken::parse("ReceiptHandle", h).is_ok() {
                handles.push(h.to_string());
                results.push(Ok(id));
            } else {
                let err = SqsError::receipt_handle(format!(
                    "The input receipt handle \"{h}\" is not a valid receipt handle."
                ));
                results.push(Err(failed(&id, &err)));
            }
        }
        let deleted = if handles.is_empty() {
            Vec::new()
        } else {
            self.broker
                .delete_leased(&name, &handles)
                .await
                .map_err(SqsError::from_queue)?
        };
        let mut outcomes = deleted.into_iter().zip(handles);
        let mut successful = Vec::new();
        let mut failures = Vec::new();
        for r in results {
            match r {
                Ok(id) => match outcomes.next() {
                    Some((Deleted::OtherQueue, h)) => failures.push(failed(
                        &id,
                        &SqsError::receipt_handle(format!(
                            "The input receipt handle \"{h}\" is not a valid receipt handle for queue {name}."
                        )),
                    )),
                    _ => successful.push(json!({"Id": id})),
                },
                Err(f) => failures.push(f),
            }
        }
        Ok(json!({"Successful": successful, "Failed": failures}))
    }

    /// Sets the visibility of the message a handle was a receive of:
    /// `secs` from now, or visible at once for 0.
    async fn change_visibility(&self, name: &str, handle: &str, secs: i64) -> Result<(), SqsError> {
        if !(0..=43_200).contains(&secs) {
            return Err(SqsError::bad_value(
                "VisibilityTimeout",
                secs,
                "Must be >= 0 and <= 43200, if provided.",
            ));
        }
        if crate::queue::token::AckToken::parse("ReceiptHandle", handle).is_err() {
            return Err(SqsError::receipt_handle(
                "The input receipt handle is invalid.",
            ));
        }
        let current = self
            .broker
            .current_lease_of(name, handle)
            .map_err(|_| SqsError::receipt_handle("The input receipt handle is invalid."))?;
        let Some(token) = current else {
            return Err(SqsError::not_inflight());
        };
        let settled = if secs == 0 {
            self.broker
                .nack(&[Nack {
                    token,
                    delay: Some(0),
                    reason: "visibility set to 0 over SQS".into(),
                    dead_letter: false,
                }])
                .await
        } else {
            let ms = u64::try_from(secs).unwrap_or(0) * SECOND;
            self.broker.extend(&[(token, ms)]).await
        }
        .map_err(SqsError::from_queue)?;
        match settled.first() {
            Some(Settled::Ok { .. }) => Ok(()),
            _ => Err(SqsError::not_inflight()),
        }
    }

    pub(crate) async fn change_message_visibility(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Consume, &name)?;
        let handle = required(input, "ReceiptHandle")?;
        let secs = integer(input, "VisibilityTimeout")?
            .ok_or_else(|| SqsError::missing("VisibilityTimeout"))?;
        self.change_visibility(&name, handle, secs).await?;
        Ok(json!({}))
    }

    pub(crate) async fn change_message_visibility_batch(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Consume, &name)?;
        let entries = batch_entries(input, "ChangeMessageVisibilityBatchRequestEntry")?;
        let mut successful = Vec::new();
        let mut failures = Vec::new();
        for e in entries {
            let id = string(e, "Id").unwrap_or_default();
            let handle = string(e, "ReceiptHandle").unwrap_or_default();
            let r = match integer(e, "VisibilityTimeout") {
                Ok(secs) => {
                    self.change_visibility(&name, handle, secs.unwrap_or(0))
                        .await
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => successful.push(json!({"Id": id})),
                Err(err) => failures.push(failed(id, &err)),
            }
        }
        Ok(json!({"Successful": successful, "Failed": failures}))
    }
}

/// Whether a receive's `MessageAttributeNames` select `name`: `All`,
/// `.*`, `prefix.*` or the name itself.
fn attribute_wanted(wanted: &[String], name: &str) -> bool {
    wanted.iter().any(|w| {
        w == "All"
            || w == ".*"
            || w == name
            || w.strip_suffix(".*").is_some_and(|p| name.starts_with(p))
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_are_checked_as_sqs_checks_them() {
        let v =
            json!({"Entries": [{"Id": "id_1"}, {"Id": "id_2"}, {"Id": "id_2"}, {"Id": "id_1"}]});
        assert_eq!(
            batch_entries(&v, "X").unwrap_err().message,
            "Id id_2 repeated."
        );
        let v = json!({"Entries": []});
        assert_eq!(
            batch_entries(&v, "SendMessageBatchRequestEntry")
                .unwrap_err()
                .message,
            "There should be at least one SendMessageBatchRequestEntry in the request."
        );
        let v = json!({"Entries": [{"Id": ".!@"}]});
        assert_eq!(
            batch_entries(&v, "X").unwrap_err().shape,
            "InvalidBatchEntryId"
        );
        let many: Vec<Value> = (0..11).map(|i| json!({"Id": format!("id_{i}")})).collect();
        assert_eq!(
            batch_entries(&json!({"Entries": many}), "X")
                .unwrap_err()
                .message,
            "Maximum number of entries per request are 10. You have sent 11."
        );
    }

    #[test]
    fn attribute_names_select_by_name_prefix_or_all() {
        let w = vec!["Custom.*".to_string()];
        assert!(attribute_wanted(&w, "Custom1"));
        assert!(!attribute_wanted(&w, "Other"));
        assert!(attribute_wanted(&["All".into()], "x"));
        assert!(attribute_wanted(&[".*".into()], "x"));
        assert!(!attribute_wanted(&[], "x"));
    }

    #[test]
    fn bodies_take_xml_characters_only() {
        assert!("Héllo!😀\r\n\t".chars().all(valid_char));
        assert!(!valid_char('\u{0}'));
        assert!(!valid_char('\u{FFFE}'));
    }
}
