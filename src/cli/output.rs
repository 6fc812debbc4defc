//! Printing: aligned tables for people, JSON for scripts.

use serde_json::{Value, json};

use crate::client::pb;

/// Where results go.
pub(super) struct Out {
    pub json: bool,
}

impl Out {
    pub(super) fn new(json: bool) -> Out {
        Out { json }
    }

    /// Prints a JSON document (pretty).
    pub(super) fn doc(&self, v: &Value) {
        say!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }

    /// Prints one JSON object on one line.
    pub(super) fn line(&self, v: &Value) {
        say!("{}", serde_json::to_string(v).unwrap_or_default());
    }

    /// Prints rows under headers, columns aligned.
    pub(super) fn table(&self, headers: &[&str], rows: &[Vec<String>]) {
        let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
        for r in rows {
            for (i, cell) in r.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let fmt = |cells: Vec<String>| {
            let mut line = String::new();
            for (i, c) in cells.iter().enumerate() {
                let w = widths.get(i).copied().unwrap_or(0);
                if i + 1 == cells.len() {
                    line.push_str(c);
                } else {
                    line.push_str(&format!("{c:<w$}  "));
                }
            }
            line.trim_end().to_string()
        };
        say!("{}", fmt(headers.iter().map(|h| h.to_string()).collect()));
        for r in rows {
            say!("{}", fmt(r.clone()));
        }
    }

    /// Prints `key  value` pairs.
    pub(super) fn pairs(&self, pairs: &[(&str, String)]) {
        let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in pairs {
            say!("{k:<w$}  {v}");
        }
    }
}

/// An instant (ms since the epoch) as RFC 3339, or "-" for 0.
pub(super) fn time(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || ms.to_string(),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )
}

/// A duration in ms, shortly: `500ms`, `30s`, `2m`, `7d` (what the
/// duration flags accept).
pub(crate) fn dur(ms: u64) -> String {
    crate::units::Millis(std::time::Duration::from_millis(ms)).to_string()
}

pub(super) fn kind_name(k: i32) -> &'static str {
    match pb::QueueKind::try_from(k) {
        Ok(pb::QueueKind::Fifo) => "FIFO",
        _ => "STANDARD",
    }
}

fn enum_name<E: TryFrom<i32>>(v: i32, name: impl Fn(E) -> &'static str) -> String {
    E::try_from(v).map_or_else(|_| v.to_string(), |e| name(e).to_string())
}

pub(super) fn reason_name(v: i32) -> String {
    enum_name(v, |r: pb::DeadLetterReason| {
        r.as_str_name().trim_start_matches("DEAD_LETTER_REASON_")
    })
}

pub(super) fn outcome_name(v: i32) -> String {
    enum_name(v, |r: pb::AttemptOutcome| {
        r.as_str_name().trim_start_matches("ATTEMPT_OUTCOME_")
    })
}

pub(super) fn state_name(v: i32) -> String {
    enum_name(v, |r: pb::MessageState| {
        r.as_str_name().trim_start_matches("MESSAGE_STATE_")
    })
}

pub(super) fn group_state_name(v: i32) -> String {
    enum_name(v, |r: pb::GroupState| {
        r.as_str_name().trim_start_matches("GROUP_STATE_")
    })
}

/// A queue's configuration as `--json` prints it: every field of the
/// message, under the names of the definitions document.
pub(crate) fn config_json(c: &pb::QueueConfig) -> Value {
    let pb::QueueConfig {
        kind,
        message_ttl_ms,
        ack_timeout_ms,
        delivery_delay_ms,
        dead_letter,
        retry_backoff,
        dead_letter_on_expiry,
        max_length,
        max_lease_total_ms,
        dedup_window_ms,
        on_poison,
        content_based_dedup,
    } = c;
    json!({
        "kind": kind_name(*kind),
        "message_ttl_ms": message_ttl_ms,
        "ack_timeout_ms": ack_timeout_ms,
        "delivery_delay_ms": delivery_delay_ms,
        "dead_letter": dead_letter.as_ref().map(|d| json!({"queue": d.queue, "max_deliveries": d.max_deliveries})),
        "retry_backoff": retry_backoff.as_ref().map(|b| json!({"initial_ms": b.initial_ms, "max_ms": b.max_ms, "multiplier": b.multiplier})),
        "dead_letter_on_expiry": dead_letter_on_expiry,
        "max_length": max_length,
        "max_lease_total_ms": max_lease_total_ms,
        "dedup_window_ms": dedup_window_ms,
        "on_poison": (*on_poison != 0).then(|| enum_name(*on_poison, |p: pb::PoisonPolicy| p.as_str_name().trim_start_matches("POISON_POLICY_"))),
        "content_based_dedup": content_based_dedup,
    })
}

pub(super) fn queue_json(q: &pb::Queue) -> Value {
    json!({
        "name": q.name,
        "config": q.config.as_ref().map(config_json),
        "dead_letter_sources": q.dead_letter_sources,
        "created_at": time(q.created_at_unix_ms),
    })
}

pub(super) fn stats_json(name: &str, s: &pb::QueueStats) -> Value {
    json!({
        "queue": name,
        "ready": s.ready, "in_flight": s.in_flight, "delayed": s.delayed, "parked": s.parked,
        "total": s.total, "oldest_message_age_ms": s.oldest_message_age_ms,
        "published": s.published, "acked": s.acked, "nacked": s.nacked, "expired": s.expired,
        "dead_lettered": s.dead_lettered, "dead_letters_received": s.dead_letters_received,
        "purged": s.purged, "redriven": s.redriven, "redrive_received": s.redrive_received,
    })
}

fn body_json(body: &[u8]) -> Value {
    match std::str::from_utf8(body) {
        Ok(s) => json!(s),
        Err(_) => {
            json!({ "bytes": body.len(), "hex": body.iter().map(|b| format!("{b:02x}")).collect::<String>() })
        }
    }
}

/// A body for a table cell: text (shortened), or its size when binary.
pub(super) fn body_cell(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(s) if s.chars().count() > 60 => s.chars().take(57).collect::<String>() + "...",
        Ok(s) => s.replace('\n', "\\n"),
        Err(_) => format!("<{} bytes>", body.len()),
    }
}

fn history_json(dead_letters: &[pb::DeadLetterRecord], attempts: &[pb::Attempt]) -> (Value, Value) {
    (
        dead_letters
            .iter()
            .map(|d| {
                json!({"source_queue": d.source_queue, "reason": reason_name(d.reason), "delivery_count": d.delivery_count,
                       "failed_attempts": d.failed_attempts, "last_nack_reason": d.last_nack_reason,
                       "at": time(d.at_unix_ms), "note": d.note})
            })
            .collect(),
        attempts
            .iter()
            .map(|a| json!({"at": time(a.at_unix_ms), "outcome": outcome_name(a.outcome), "reason": a.reason}))
            .collect(),
    )
}

pub(super) fn delivery_json(d: &pb::Delivery) -> Value {
    let (dl, at) = history_json(&d.dead_letters, &d.attempts);
    json!({
        "queue": d.queue, "message_id": d.message_id, "body": body_json(&d.body), "properties": d.properties,
        "delivery_count": d.delivery_count, "failed_attempts": d.failed_attempts, "group_id": d.group_id,
        "published_at": time(d.published_at_unix_ms), "first_delivered_at": time(d.first_delivered_at_unix_ms),
        "lease_deadline": time(d.lease_deadline_unix_ms), "dead_letters": dl, "attempts": at,
    })
}

pub(super) fn browsed_json(m: &pb::BrowsedMessage) -> Value {
    let (dl, at) = history_json(&m.dead_letters, &m.attempts);
    json!({
        "message_id": m.message_id, "body": body_json(&m.body), "properties": m.properties,
        "state": state_name(m.state), "delivery_count": m.delivery_count,
        "failed_attempts": m.failed_attempts, "group_id": m.group_id,
        "published_at": time(m.published_at_unix_ms), "enqueued_at": time(m.enqueued_at_unix_ms),
        "expires_at": time(m.expires_at_unix_ms), "dead_letters": dl, "attempts": at,
    })
}
