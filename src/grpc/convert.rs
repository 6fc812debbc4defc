//! Conversions between the protobuf types and the engine's model. Request
//! conversions name the field of every bad value.

use std::collections::HashMap;

use crate::pb;
use crate::queue::QueueError;
use crate::queue::exchange::ExchangeInfo;
use crate::queue::model::{
    Attempt, AttemptOutcome, BrowsedMessage, DeadLetter, DeadLetterInput, DeadLetterReason,
    Delivery, GroupInfo, GroupState, MessageState, NewMessage, PoisonPolicy, Published,
    QueueConfig, QueueConfigInput, QueueInfo, QueueKind, QueueStats, Released, RetryBackoff,
    Settled,
};
use crate::queue::redrive::RedriveSpec;

type Result<T> = std::result::Result<T, QueueError>;

fn kind_from(field: &str, v: i32) -> Result<Option<QueueKind>> {
    match pb::QueueKind::try_from(v) {
        Ok(pb::QueueKind::Unspecified) => Ok(None),
        Ok(pb::QueueKind::Standard) => Ok(Some(QueueKind::Standard)),
        Ok(pb::QueueKind::Fifo) => Ok(Some(QueueKind::Fifo)),
        Err(_) => Err(QueueError::invalid(field, v, "is not a QueueKind")),
    }
}

fn poison_from(field: &str, v: i32) -> Result<Option<PoisonPolicy>> {
    match pb::PoisonPolicy::try_from(v) {
        Ok(pb::PoisonPolicy::Unspecified) => Ok(None),
        Ok(pb::PoisonPolicy::DeadLetterAndContinue) => {
            Ok(Some(PoisonPolicy::DeadLetterAndContinue))
        }
        Ok(pb::PoisonPolicy::ParkGroup) => Ok(Some(PoisonPolicy::ParkGroup)),
        Err(_) => Err(QueueError::invalid(field, v, "is not a PoisonPolicy")),
    }
}

/// A requested configuration (create or update).
pub(crate) fn config_input(c: Option<pb::QueueConfig>) -> Result<QueueConfigInput> {
    let Some(c) = c else {
        return Ok(QueueConfigInput::default());
    };
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
    Ok(QueueConfigInput {
        kind: kind_from("config.kind", kind)?,
        message_ttl: message_ttl_ms,
        ack_timeout: ack_timeout_ms,
        delivery_delay: delivery_delay_ms,
        dead_letter: dead_letter.map(|d| DeadLetterInput::new(d.queue, d.max_deliveries)),
        retry_backoff: retry_backoff.map(|b| RetryBackoff {
            initial: b.initial_ms,
            max: b.max_ms,
            multiplier: b.multiplier,
        }),
        dead_letter_on_expiry,
        max_length,
        max_lease_total: max_lease_total_ms,
        dedup_window: dedup_window_ms,
        on_poison: poison_from("config.on_poison", on_poison)?,
        content_based_dedup,
    })
}

/// A configuration in force, every field set, but for a standard queue
/// the FIFO-only ones (unset, as in the definitions document): what is
/// read back can be sent again as a request.
pub(crate) fn config_pb(c: &QueueConfig) -> pb::QueueConfig {
    let QueueConfig {
        kind,
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
    } = c;
    let fifo = kind.is_fifo();
    pb::QueueConfig {
        kind: match kind {
            QueueKind::Standard => pb::QueueKind::Standard,
            QueueKind::Fifo => pb::QueueKind::Fifo,
        } as i32,
        message_ttl_ms: Some(*message_ttl),
        ack_timeout_ms: Some(*ack_timeout),
        delivery_delay_ms: Some(*delivery_delay),
        dead_letter: dead_letter.as_ref().map(|d| pb::DeadLetterPolicy {
            queue: d.queue.clone(),
            max_deliveries: d.max_deliveries,
        }),
        retry_backoff: retry_backoff.map(|b| pb::RetryBackoff {
            initial_ms: b.initial,
            max_ms: b.max,
            multiplier: b.multiplier,
        }),
        dead_letter_on_expiry: Some(*dead_letter_on_expiry),
        max_length: *max_length,
        max_lease_total_ms: Some(*max_lease_total),
        dedup_window_ms: fifo.then_some(*dedup_window),
        on_poison: match on_poison {
            _ if !fifo => pb::PoisonPolicy::Unspecified,
            PoisonPolicy::DeadLetterAndContinue => pb::PoisonPolicy::DeadLetterAndContinue,
            PoisonPolicy::ParkGroup => pb::PoisonPolicy::ParkGroup,
        } as i32,
        content_based_dedup: fifo.then_some(*content_based_dedup),
    }
}

/// A queue description.
pub(crate) fn queue_pb(q: QueueInfo) -> pb::Queue {
    pb::Queue {
        config: Some(config_pb(&q.config)),
        name: q.name,
        dead_letter_sources: q.dead_letter_sources,
        created_at_unix_ms: q.created_at,
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// A message to publish.
pub(crate) fn new_message(m: pb::PublishMessage) -> NewMessage {
    NewMessage {
        message_id: non_empty(m.message_id),
        body: m.body,
        properties: m.properties.into_iter().collect(),
        ttl: m.ttl_ms,
        delay: m.delay_ms,
        group_id: non_empty(m.group_id),
        dedup_id: non_empty(m.dedup_id),
    }
}

fn reason_pb(r: DeadLetterReason) -> pb::DeadLetterReason {
    match r {
        DeadLetterReason::MaxDeliveries => pb::DeadLetterReason::MaxDeliveries,
        DeadLetterReason::Rejected => pb::DeadLetterReason::Rejected,
        DeadLetterReason::Expired => pb::DeadLetterReason::Expired,
        DeadLetterReason::Skipped => pb::DeadLetterReason::Skipped,
        DeadLetterReason::Corrupted => pb::DeadLetterReason::Corrupted,
    }
}

fn dead_letters_pb(v: Vec<DeadLetter>) -> Vec<pb::DeadLetterRecord> {
    v.into_iter()
        .map(|d| pb::DeadLetterRecord {
            source_queue: d.source_queue,
            reason: reason_pb(d.reason) as i32,
            delivery_count: d.delivery_count,
            failed_attempts: d.failed_attempts,
            last_nack_reason: d.last_nack_reason,
            at_unix_ms: d.at,
            note: d.note,
        })
        .collect()
}

fn attempts_pb(v: Vec<Attempt>) -> Vec<pb::Attempt> {
    v.into_iter()
        .map(|a| pb::Attempt {
            at_unix_ms: a.at,
            outcome: match a.outcome {
                AttemptOutcome::Nacked => pb::AttemptOutcome::Nacked,
                AttemptOutcome::LeaseExpired => pb::AttemptOutcome::LeaseExpired,
                AttemptOutcome::Rejected => pb::AttemptOutcome::Rejected,
                AttemptOutcome::StreamClosed => pb::AttemptOutcome::StreamClosed,
                AttemptOutcome::Released => pb::AttemptOutcome::Released,
            } as i32,
            reason: a.reason,
        })
        .collect()
}

fn properties(v: Vec<(String, String)>) -> HashMap<String, String> {
    v.into_iter().collect()
}

/// A delivery.
pub(crate) fn delivery_pb(d: Delivery) -> pb::Delivery {
    pb::Delivery {
        message_id: d.message_id,
        body: d.body,
        properties: properties(d.properties),
        ack_token: d.ack_token.unwrap_or_default(),
        delivery_count: d.delivery_count,
        failed_attempts: d.failed_attempts,
        published_at_unix_ms: d.published_at,
        first_delivered_at_unix_ms: d.first_delivered_at,
        lease_deadline_unix_ms: d.lease_deadline,
        group_id: d.group_id.unwrap_or_default(),
        dead_letters: dead_letters_pb(d.dead_letters),
        attempts: attempts_pb(d.attempts),
        queue: d.queue,
    }
}

/// The outcome of settling one token.
pub(crate) fn settle_pb(token: String, s: Settled) -> pb::SettleResult {
    match s {
        Settled::Ok { deadline } => pb::SettleResult {
            ack_token: token,
            status: pb::SettleStatus::Ok as i32,
            code: tonic::Code::Ok as i32,
            error: String::new(),
            lease_deadline_unix_ms: deadline,
        },
        Settled::LeaseExpired(why) => pb::SettleResult {
            ack_token: token,
            status: pb::SettleStatus::LeaseExpired as i32,
            code: tonic::Code::FailedPrecondition as i32,
            error: why,
            lease_deadline_unix_ms: 0,
        },
        Settled::Released(why) => pb::SettleResult {
            ack_token: token,
            status: pb::SettleStatus::Released as i32,
            code: tonic::Code::FailedPrecondition as i32,
            error: why,
            lease_deadline_unix_ms: 0,
        },
    }
}

/// FIFO deliveries released by a nack.
pub(crate) fn released_pb(v: Vec<Released>) -> Vec<pb::ReleasedDelivery> {
    v.into_iter()
        .map(|r| pb::ReleasedDelivery {
            ack_token: r.ack_token,
            message_id: r.message_id,
            released_by: r.because_of,
        })
        .collect()
}

/// Queue figures.
pub(crate) fn stats_pb(s: QueueStats) -> pb::QueueStats {
    pb::QueueStats {
        ready: s.ready,
        in_flight: s.in_flight,
        delayed: s.delayed,
        total: s.total,
        oldest_message_age_ms: s.oldest_age,
        published: s.counters.published,
        acked: s.counters.acked,
        nacked: s.counters.nacked,
        expired: s.counters.expired,
        dead_lettered: s.counters.dead_lettered,
        dead_letters_received: s.counters.dead_letters_received,
        parked: s.parked,
        purged: s.counters.purged,
        redriven: s.counters.redriven,
        redrive_received: s.counters.redrive_received,
    }
}

/// A browsed message.
pub(crate) fn browsed_pb(m: BrowsedMessage) -> pb::BrowsedMessage {
    pb::BrowsedMessage {
        message_id: m.message_id,
        body: m.body,
        properties: properties(m.properties),
        state: match m.state {
            MessageState::Ready => pb::MessageState::Ready,
            MessageState::Delayed => pb::MessageState::Delayed,
            MessageState::Leased => pb::MessageState::Leased,
            MessageState::Blocked => pb::MessageState::Blocked,
            MessageState::Parked => pb::MessageState::Parked,
        } as i32,
        delivery_count: m.delivery_count,
        failed_attempts: m.failed_attempts,
        published_at_unix_ms: m.published_at,
        enqueued_at_unix_ms: m.enqueued_at,
        expires_at_unix_ms: m.expires_at,
        visible_at_unix_ms: m.visible_at,
        lease_deadline_unix_ms: m.lease_deadline,
        group_id: m.group_id.unwrap_or_default(),
        dead_letters: dead_letters_pb(m.dead_letters),
        attempts: attempts_pb(m.attempts),
        damaged: m.damaged,
    }
}

/// The outcome of one published message.
pub(crate) fn published_pb(p: Published) -> pb::PublishResult {
    pb::PublishResult {
        message_id: p.message_id,
        duplicate: p.duplicate,
        routed_to: p.routed_to,
    }
}

/// A dead-letter reason from a request.
pub(crate) fn reason_from(field: &str, v: i32) -> Result<DeadLetterReason> {
    match pb::DeadLetterReason::try_from(v) {
        Ok(pb::DeadLetterReason::MaxDeliveries) => Ok(DeadLetterReason::MaxDeliveries),
        Ok(pb::DeadLetterReason::Rejected) => Ok(DeadLetterReason::Rejected),
        Ok(pb::DeadLetterReason::Expired) => Ok(DeadLetterReason::Expired),
        Ok(pb::DeadLetterReason::Skipped) => Ok(DeadLetterReason::Skipped),
        Ok(pb::DeadLetterReason::Corrupted) => Ok(DeadLetterReason::Corrupted),
        Ok(pb::DeadLetterReason::Unspecified) | Err(_) => {
            Err(QueueError::invalid(field, v, "is not a DeadLetterReason"))
        }
    }
}

/// A redrive request.
pub(crate) fn redrive_spec(r: &pb::RedriveRequest) -> Result<RedriveSpec> {
    let reasons = r
        .reasons
        .iter()
        .enumerate()
        .map(|(i, v)| reason_from(&format!("reasons[{i}]"), *v))
        .collect::<Result<Vec<_>>>()?;
    Ok(RedriveSpec {
        dlq: r.queue.clone(),
        target: non_empty(r.target.clone()),
        message_ids: r.message_ids.clone(),
        source_queue: non_empty(r.source_queue.clone()),
        reasons,
        since: r.since_unix_ms,
        until: r.until_unix_ms,
        dry_run: r.dry_run,
    })
}

/// An exchange.
pub(crate) fn exchange_pb(x: ExchangeInfo) -> pb::Exchange {
    pb::Exchange {
        name: x.name,
        bindings: x
            .bindings
            .into_iter()
            .map(|(queue, filter)| pb::Binding {
                queue,
                filter: filter.into_iter().collect(),
            })
            .collect(),
        created_at_unix_ms: x.created_at,
    }
}

/// A group state filter from a request.
pub(crate) fn group_state_from(field: &str, v: i32) -> Result<Option<GroupState>> {
    match pb::GroupState::try_from(v) {
        Ok(pb::GroupState::Unspecified) => Ok(None),
        Ok(pb::GroupState::Ready) => Ok(Some(GroupState::Ready)),
        Ok(pb::GroupState::Leased) => Ok(Some(GroupState::Leased)),
        Ok(pb::GroupState::Delayed) => Ok(Some(GroupState::Delayed)),
        Ok(pb::GroupState::Parked) => Ok(Some(GroupState::Parked)),
        Err(_) => Err(QueueError::invalid(field, v, "is not a GroupState")),
    }
}

/// A FIFO group.
pub(crate) fn group_pb(g: GroupInfo) -> pb::GroupInfo {
    pb::GroupInfo {
        group_id: g.group_id,
        backlog: g.backlog,
        in_flight: g.in_flight,
        oldest_message_age_ms: g.oldest_age,
        state: match g.state {
            GroupState::Ready => pb::GroupState::Ready,
            GroupState::Leased => pb::GroupState::Leased,
            GroupState::Delayed => pb::GroupState::Delayed,
            GroupState::Parked => pb::GroupState::Parked,
        } as i32,
        reason: g.reason,
        head_message_id: g.head_message_id,
        head_delivery_count: g.head_delivery_count,
        head_failed_attempts: g.head_failed_attempts,
    }
}
