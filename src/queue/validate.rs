//! Validation of names, configurations and messages. Every check runs
//! before anything is changed, and every failure names the field (as the
//! API spells it) and the value.

use super::error::{Exhausted, QueueError, Result};
use super::model::{
    DAY, DeadLetterPolicy, HOUR, MINUTE, NewMessage, PoisonPolicy, QueueConfig, QueueConfigInput,
    QueueKind, QueueRemovals, SECOND,
};

/// Bounds of the configuration fields (SPEC §1).
pub mod limits {
    use super::{DAY, HOUR, MINUTE, SECOND};
    /// Message TTL bounds and default.
    pub const TTL: (u64, u64, u64) = (MINUTE, 14 * DAY, 7 * DAY);
    /// Ack timeout bounds and default.
    pub const ACK_TIMEOUT: (u64, u64, u64) = (SECOND, 12 * HOUR, 2 * MINUTE);
    /// Largest delivery delay (queue and message) and retry backoff.
    pub const MAX_DELAY: u64 = 15 * MINUTE;
    /// Max deliveries bounds and default.
    pub const MAX_DELIVERIES: (u32, u32, u32) = (1, 1000, 10);
    /// Largest lease total, and its default.
    pub const MAX_LEASE_TOTAL: u64 = 12 * HOUR;
    /// Dedup window bounds and default.
    pub const DEDUP_WINDOW: (u64, u64, u64) = (0, 24 * HOUR, 5 * MINUTE);
    /// Smallest own message TTL.
    pub const MIN_MESSAGE_TTL: u64 = SECOND;
    /// Messages per publish, tokens per settle call.
    pub const MAX_BATCH: usize = 1000;
    /// Longest message id.
    pub const MAX_MESSAGE_ID: usize = 256;
    /// Most properties per message.
    pub const MAX_PROPERTIES: usize = 64;
    /// Largest total size of a message's properties.
    pub const MAX_PROPERTIES_BYTES: usize = 64 * 1024;
    /// Longest group or dedup id.
    pub const MAX_GROUP_ID: usize = 128;
    /// Longest nack reason or operator note.
    pub const MAX_REASON: usize = 1024;
    /// Longest long-poll wait.
    pub const MAX_WAIT: u64 = 20 * SECOND;
    /// Most messages per receive or browse page.
    pub const MAX_RECEIVE: u32 = 1000;
}

/// Checks a queue (or exchange) name: `^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$`.
pub fn name(field: &str, name: &str) -> Result<()> {
    let bad = |reason: &str| Err(QueueError::invalid(field, name, reason));
    let Some(first) = name.chars().next() else {
        return bad("must not be empty");
    };
    if name.len() > 255 {
        return bad("is longer than 255 characters");
    }
    if !first.is_ascii_alphanumeric() {
        return bad("must start with a letter or a digit");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return bad(&format!(
            "contains {c:?}; only letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

fn range(field: &str, v: u64, lo: u64, hi: u64) -> Result<()> {
    if v < lo || v > hi {
        return Err(QueueError::invalid(
            field,
            v,
            format!("must be between {lo} and {hi}"),
        ));
    }
    Ok(())
}

/// The configuration of a queue of that kind created with no value
/// given: the one list of the defaults (SPEC §1), which every interface
/// takes from here.
pub fn default_config(kind: QueueKind) -> QueueConfig {
    QueueConfig {
        kind,
        message_ttl: limits::TTL.2,
        ack_timeout: limits::ACK_TIMEOUT.2,
        delivery_delay: 0,
        dead_letter: None,
        retry_backoff: None,
        dead_letter_on_expiry: false,
        max_length: None,
        max_lease_total: limits::MAX_LEASE_TOTAL,
        dedup_window: limits::DEDUP_WINDOW.2,
        on_poison: PoisonPolicy::default(),
        content_based_dedup: false,
    }
}

/// Builds a new queue's configuration from a request, with defaults.
pub fn new_config(input: &QueueConfigInput) -> Result<QueueConfig> {
    let kind = input.kind.unwrap_or_default();
    fifo_only(kind, input)?;
    let cfg = overlay(default_config(kind), input, QueueRemovals::default());
    check_config(&cfg)?;
    Ok(cfg)
}

/// Applies an update request to a configuration.
pub fn updated_config(
    current: &QueueConfig,
    input: &QueueConfigInput,
    removals: QueueRemovals,
) -> Result<QueueConfig> {
    if let Some(kind) = input.kind
        && kind != current.kind
    {
        return Err(QueueError::invalid(
            "config.kind",
            kind,
            format!("the kind of a queue never changes (it is {})", current.kind),
        ));
    }
    fifo_only(current.kind, input)?;
    let cfg = overlay(current.clone(), input, removals);
    check_config(&cfg)?;
    Ok(cfg)
}

/// The values a request sets, over `cfg`, then the removals: the one
/// place where a request's fields meet the configuration's (a field
/// added to [`QueueConfigInput`] does not compile until it is handled
/// here). The kind is decided by the callers.
fn overlay(mut cfg: QueueConfig, input: &QueueConfigInput, removals: QueueRemovals) -> QueueConfig {
    let QueueConfigInput {
        kind: _,
        message_ttl,
        ack_timeout,
        delivery_delay,
        dead_letter,
        retry_backoff,
        dead_letter_on_expiry,
        max_length,
        max_lease_total,
        dedup_window,
        on_poison,
        content_based_dedup,
    } = input;
    let QueueRemovals {
        dead_letter: remove_dead_letter,
        retry_backoff: remove_retry_backoff,
        max_length: remove_max_length,
    } = removals;
    fn set<T: Clone>(slot: &mut T, v: &Option<T>) {
        if let Some(v) = v {
            *slot = v.clone();
        }
    }
    set(&mut cfg.message_ttl, message_ttl);
    set(&mut cfg.ack_timeout, ack_timeout);
    set(&mut cfg.delivery_delay, delivery_delay);
    set(&mut cfg.dead_letter_on_expiry, dead_letter_on_expiry);
    set(&mut cfg.max_lease_total, max_lease_total);
    set(&mut cfg.dedup_window, dedup_window);
    set(&mut cfg.on_poison, on_poison);
    set(&mut cfg.content_based_dedup, content_based_dedup);
    if let Some(dl) = dead_letter {
        cfg.dead_letter = Some(DeadLetterPolicy {
            queue: dl.queue.clone(),
            max_deliveries: dl
                .max_deliveries
                .filter(|n| *n != 0)
                .unwrap_or(limits::MAX_DELIVERIES.2),
        });
    }
    if retry_backoff.is_some() {
        cfg.retry_backoff = *retry_backoff;
    }
    if max_length.is_some() {
        cfg.max_length = *max_length;
    }
    if remove_dead_letter {
        cfg.dead_letter = None;
    }
    if remove_retry_backoff {
        cfg.retry_backoff = None;
    }
    if remove_max_length {
        cfg.max_length = None;
    }
    cfg
}

fn fifo_only(kind: QueueKind, input: &QueueConfigInput) -> Result<()> {
    if kind == QueueKind::Fifo {
        return Ok(());
    }
    let reason = "applies to FIFO queues only";
    if let Some(v) = input.dedup_window {
        return Err(QueueError::invalid("config.dedup_window_ms", v, reason));
    }
    if let Some(p) = input.on_poison
        && p != PoisonPolicy::DeadLetterAndContinue
    {
        return Err(QueueError::invalid("config.on_poison", p.name(), reason));
    }
    if input.content_based_dedup == Some(true) {
        return Err(QueueError::invalid(
            "config.content_based_dedup",
            true,
            reason,
        ));
    }
    Ok(())
}

/// Range checks of a complete configuration (the DLQ's existence and kind
/// are checked by the broker, which knows the other queues).
pub fn check_config(cfg: &QueueConfig) -> Result<()> {
    range(
        "config.message_ttl_ms",
        cfg.message_ttl,
        limits::TTL.0,
        limits::TTL.1,
    )?;
    range(
        "config.ack_timeout_ms",
        cfg.ack_timeout,
        limits::ACK_TIMEOUT.0,
        limits::ACK_TIMEOUT.1,
    )?;
    range(
        "config.delivery_delay_ms",
        cfg.delivery_delay,
        0,
        limits::MAX_DELAY,
    )?;
    if let Some(dl) = &cfg.dead_letter {
        name("config.dead_letter.queue", &dl.queue)?;
        let (lo, hi, _) = limits::MAX_DELIVERIES;
        if dl.max_deliveries < lo || dl.max_deliveries > hi {
            return Err(QueueError::invalid(
                "config.dead_letter.max_deliveries",
                dl.max_deliveries,
                format!("must be between {lo} and {hi}"),
            ));
        }
    }
    if let Some(b) = &cfg.retry_backoff {
        range(
            "config.retry_backoff.initial_ms",
            b.initial,
            1,
            limits::MAX_DELAY,
        )?;
        range(
            "config.retry_backoff.max_ms",
            b.max,
            b.initial,
            limits::MAX_DELAY,
        )?;
        if !(b.multiplier.is_finite() && (1.0..=100.0).contains(&b.multiplier)) {
            return Err(QueueError::invalid(
                "config.retry_backoff.multiplier",
                b.multiplier,
                "must be between 1.0 and 100.0",
            ));
        }
    }
    if cfg.dead_letter_on_expiry && cfg.dead_letter.is_none() {
        return Err(QueueError::invalid(
            "config.dead_letter_on_expiry",
            true,
            "needs a dead letter queue (config.dead_letter)",
        ));
    }
    if let Some(n) = cfg.max_length {
        range("config.max_length", n, 1, u64::MAX)?;
    }
    range(
        "config.max_lease_total_ms",
        cfg.max_lease_total,
        cfg.ack_timeout,
        limits::MAX_LEASE_TOTAL,
    )?;
    range(
        "config.dedup_window_ms",
        cfg.dedup_window,
        limits::DEDUP_WINDOW.0,
        limits::DEDUP_WINDOW.1,
    )?;
    Ok(())
}

/// Checks a lease length given in a request (receive override, extension).
pub fn lease_length(field: &str, v: u64, max_lease_total: u64) -> Result<()> {
    range(field, v, limits::ACK_TIMEOUT.0, limits::ACK_TIMEOUT.1)?;
    if v > max_lease_total {
        return Err(QueueError::invalid(
            field,
            v,
            format!("exceeds the queue's max_lease_total_ms of {max_lease_total}"),
        ));
    }
    Ok(())
}

/// Checks the size of a batch of settle items or messages.
pub fn batch(field: &str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(QueueError::invalid(
            field,
            "[]",
            "must hold at least one item",
        ));
    }
    if len > limits::MAX_BATCH {
        return Err(QueueError::invalid(
            field,
            format!("{len} items"),
            format!("must hold at most {} items", limits::MAX_BATCH),
        ));
    }
    Ok(())
}

/// Checks a binding filter: non-empty property names, at most 64 pairs.
pub fn filter(field: &str, pairs: &[(String, String)]) -> Result<()> {
    if pairs.len() > limits::MAX_PROPERTIES {
        return Err(QueueError::invalid(
            field,
            format!("{} entries", pairs.len()),
            format!("at most {} entries are allowed", limits::MAX_PROPERTIES),
        ));
    }
    if pairs.iter().any(|(k, _)| k.is_empty()) {
        return Err(QueueError::invalid(
            field,
            "\"\"",
            "property names must not be empty",
        ));
    }
    Ok(())
}

/// Checks a page size: 0 means 100, at most 1000.
pub fn page_size(field: &str, v: u32) -> Result<usize> {
    match v {
        0 => Ok(100),
        1..=limits::MAX_RECEIVE => Ok(usize::try_from(v).unwrap_or(100)),
        _ => Err(QueueError::invalid(
            field,
            v,
            format!("must be at most {}", limits::MAX_RECEIVE),
        )),
    }
}

/// Checks a free-text reason or note.
pub fn reason(field: &str, text: &str) -> Result<()> {
    if text.len() > limits::MAX_REASON {
        return Err(QueueError::invalid(
            field,
            text,
            format!("is longer than {} bytes", limits::MAX_REASON),
        ));
    }
    Ok(())
}

/// Checks one message of a publish against the limits that do not depend
/// on a queue (`i` is its index in the batch).
pub fn message(i: usize, m: &NewMessage, max_body: usize) -> Result<()> {
    let f = |name: &str| format!("messages[{i}].{name}");
    if let Some(id) = &m.message_id {
        if id.is_empty() || id.chars().count() > limits::MAX_MESSAGE_ID {
            return Err(QueueError::invalid(
                f("message_id"),
                id,
                format!("must be 1 to {} characters", limits::MAX_MESSAGE_ID),
            ));
        }
        if id.chars().any(char::is_control) {
            return Err(QueueError::invalid(
                f("message_id"),
                id.escape_debug(),
                "contains control characters",
            ));
        }
    }
    if m.body.len() > max_body {
        return Err(Exhausted::MessageTooLarge.error(format!(
            "messages[{i}].body is {} bytes, more than the limit of {max_body} bytes",
            m.body.len()
        )));
    }
    if m.properties.len() > limits::MAX_PROPERTIES {
        return Err(QueueError::invalid(
            f("properties"),
            format!("{} entries", m.properties.len()),
            format!("at most {} entries are allowed", limits::MAX_PROPERTIES),
        ));
    }
    let mut total = 0usize;
    for (k, v) in &m.properties {
        if k.is_empty() {
            return Err(QueueError::invalid(
                f("properties"),
                "\"\"",
                "property names must not be empty",
            ));
        }
        total += k.len() + v.len();
    }
    if total > limits::MAX_PROPERTIES_BYTES {
        return Err(QueueError::invalid(
            f("properties"),
            format!("{total} bytes"),
            format!(
                "must be at most {} bytes together",
                limits::MAX_PROPERTIES_BYTES
            ),
        ));
    }
    if let Some(d) = m.delay {
        range(&f("delay_ms"), d, 0, limits::MAX_DELAY)?;
    }
    for (field, v) in [("group_id", &m.group_id), ("dedup_id", &m.dedup_id)] {
        if let Some(v) = v
            && (v.is_empty() || v.len() > limits::MAX_GROUP_ID || v.chars().any(char::is_control))
        {
            return Err(QueueError::invalid(
                f(field),
                v.escape_debug(),
                format!(
                    "must be 1 to {} bytes without control characters",
                    limits::MAX_GROUP_ID
                ),
            ));
        }
    }
    Ok(())
}

/// Checks one message against its queue's configuration.
pub fn message_for_queue(i: usize, m: &NewMessage, cfg: &QueueConfig) -> Result<()> {
    let f = |name: &str| format!("messages[{i}].{name}");
    if let Some(ttl) = m.ttl {
        range(&f("ttl_ms"), ttl, limits::MIN_MESSAGE_TTL, cfg.message_ttl)?;
    }
    if cfg.kind == QueueKind::Fifo {
        if let Some(d) = m.delay {
            return Err(QueueError::invalid(
                f("delay_ms"),
                d,
                "per-message delays are not allowed on FIFO queues; use the queue's delivery_delay_ms",
            ));
        }
    } else {
        if let Some(g) = &m.group_id {
            return Err(QueueError::invalid(
                f("group_id"),
                g,
                "applies to FIFO queues only",
            ));
        }
        if let Some(d) = &m.dedup_id {
            return Err(QueueError::invalid(
                f("dedup_id"),
                d,
                "applies to FIFO queues only",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_name(n: &str, ok: bool) {
        assert_eq!(name("name", n).is_ok(), ok, "{n:?}");
    }

    #[test]
    fn names() {
        check_name("orders", true);
        check_name("Orders.dlq_2-x", true);
        check_name("9", true);
        check_name(&"a".repeat(255), true);
        check_name(&"a".repeat(256), false);
        check_name("", false);
        check_name(".hidden", false);
        check_name("a b", false);
        check_name("a/b", false);
        check_name("café", false);
    }

    #[test]
    fn a_body_over_the_limit_is_message_too_large() {
        let m = NewMessage {
            body: bytes::Bytes::from_static(b"0123456789x"),
            ..NewMessage::default()
        };
        let e = message(3, &m, 10).expect_err("over the limit");
        assert_eq!(e.exhausted_kind(), Some(Exhausted::MessageTooLarge), "{e}");
        assert_eq!(
            e.to_string(),
            "messages[3].body is 11 bytes, more than the limit of 10 bytes"
        );
        assert!(!e.is_retryable(), "it will never fit");
        message(3, &m, 11).expect("at the limit");
    }

    #[test]
    fn defaults_and_ranges() {
        let cfg = new_config(&QueueConfigInput::default()).expect("defaults are valid");
        assert_eq!(cfg.message_ttl, 7 * DAY);
        assert_eq!(cfg.ack_timeout, 2 * MINUTE);
        assert_eq!(cfg.max_lease_total, 12 * HOUR);
        let bad = QueueConfigInput {
            ack_timeout: Some(999),
            ..QueueConfigInput::default()
        };
        let err = new_config(&bad).expect_err("too short").to_string();
        assert!(
            err.contains("config.ack_timeout_ms") && err.contains("999"),
            "{err}"
        );
        let bad = QueueConfigInput {
            dead_letter_on_expiry: Some(true),
            ..QueueConfigInput::default()
        };
        assert!(new_config(&bad).is_err());
        let bad = QueueConfigInput {
            dedup_window: Some(SECOND),
            ..QueueConfigInput::default()
        };
        let err = new_config(&bad).expect_err("fifo only").to_string();
        assert!(err.contains("FIFO"), "{err}");
    }

    #[test]
    fn updates_keep_unset_fields_and_never_change_kind() {
        let cfg = new_config(&QueueConfigInput::default()).expect("valid");
        let up = QueueConfigInput {
            ack_timeout: Some(5 * SECOND),
            ..QueueConfigInput::default()
        };
        let new = updated_config(&cfg, &up, QueueRemovals::default()).expect("valid");
        assert_eq!(new.ack_timeout, 5 * SECOND);
        assert_eq!(new.message_ttl, cfg.message_ttl);
        let up = QueueConfigInput {
            kind: Some(QueueKind::Fifo),
            ..QueueConfigInput::default()
        };
        assert!(updated_config(&cfg, &up, QueueRemovals::default()).is_err());
    }
}
