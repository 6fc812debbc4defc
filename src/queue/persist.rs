//! Translation between the engine's model and the storage records.

use crate::storage::records::{AttemptRecord, DeadLetterRec, MetaRecord, QueueRecord};

use super::model::{
    Attempt, AttemptOutcome, DeadLetter, DeadLetterPolicy, DeadLetterReason, PoisonPolicy,
    QueueConfig, QueueKind, RetryBackoff,
};

/// Most attempts kept per message, and most dead-letter records.
pub(crate) const HISTORY_LIMIT: usize = 16;

pub(crate) fn queue_record(qid: u32, created_at: u64, c: &QueueConfig) -> QueueRecord {
    QueueRecord {
        qid,
        created_at,
        kind: c.kind.code(),
        message_ttl: c.message_ttl,
        ack_timeout: c.ack_timeout,
        delivery_delay: c.delivery_delay,
        dead_letter: c
            .dead_letter
            .as_ref()
            .map(|d| (d.queue.clone(), d.max_deliveries)),
        retry_backoff: c.retry_backoff.map(|b| (b.initial, b.max, b.multiplier)),
        dead_letter_on_expiry: c.dead_letter_on_expiry,
        max_length: c.max_length,
        max_lease_total: c.max_lease_total,
        dedup_window: c.dedup_window,
        on_poison: c.on_poison.code(),
        content_based_dedup: c.content_based_dedup,
    }
}

pub(crate) fn queue_config(r: &QueueRecord) -> QueueConfig {
    QueueConfig {
        kind: QueueKind::from_code(r.kind),
        message_ttl: r.message_ttl,
        ack_timeout: r.ack_timeout,
        delivery_delay: r.delivery_delay,
        dead_letter: r.dead_letter.as_ref().map(|(q, n)| DeadLetterPolicy {
            queue: q.clone(),
            max_deliveries: *n,
        }),
        retry_backoff: r
            .retry_backoff
            .map(|(initial, max, multiplier)| RetryBackoff {
                initial,
                max,
                multiplier,
            }),
        dead_letter_on_expiry: r.dead_letter_on_expiry,
        max_length: r.max_length,
        max_lease_total: r.max_lease_total,
        dedup_window: r.dedup_window,
        on_poison: PoisonPolicy::from_code(r.on_poison),
        content_based_dedup: r.content_based_dedup,
    }
}

pub(crate) fn outcome_code(o: AttemptOutcome) -> u8 {
    match o {
        AttemptOutcome::Nacked => 1,
        AttemptOutcome::LeaseExpired => 2,
        AttemptOutcome::Rejected => 3,
        AttemptOutcome::StreamClosed => 4,
        AttemptOutcome::Released => 5,
    }
}

fn outcome(code: u8) -> AttemptOutcome {
    match code {
        2 => AttemptOutcome::LeaseExpired,
        3 => AttemptOutcome::Rejected,
        4 => AttemptOutcome::StreamClosed,
        5 => AttemptOutcome::Released,
        _ => AttemptOutcome::Nacked,
    }
}

pub(crate) fn reason_code(r: DeadLetterReason) -> u8 {
    match r {
        DeadLetterReason::MaxDeliveries => 1,
        DeadLetterReason::Rejected => 2,
        DeadLetterReason::Expired => 3,
        DeadLetterReason::Skipped => 4,
        DeadLetterReason::Corrupted => 5,
    }
}

fn reason(code: u8) -> DeadLetterReason {
    match code {
        2 => DeadLetterReason::Rejected,
        3 => DeadLetterReason::Expired,
        4 => DeadLetterReason::Skipped,
        5 => DeadLetterReason::Corrupted,
        _ => DeadLetterReason::MaxDeliveries,
    }
}

pub(crate) fn attempts(m: &MetaRecord) -> Vec<Attempt> {
    m.attempts
        .iter()
        .map(|a| Attempt {
            at: a.at,
            outcome: outcome(a.outcome),
            reason: a.reason.clone(),
        })
        .collect()
}

pub(crate) fn dead_letters(m: &MetaRecord) -> Vec<DeadLetter> {
    m.dead_letters
        .iter()
        .map(|d| DeadLetter {
            source_queue: d.source_queue.clone(),
            reason: reason(d.reason),
            delivery_count: d.delivery_count,
            last_nack_reason: d.last_nack_reason.clone(),
            at: d.at,
            note: d.note.clone(),
        })
        .collect()
}

/// Appends a failed attempt, keeping the most recent ones.
pub(crate) fn push_attempt(m: &mut MetaRecord, at: u64, o: AttemptOutcome, reason: &str) {
    m.attempts.push(AttemptRecord {
        at,
        outcome: outcome_code(o),
        reason: reason.to_string(),
    });
    if m.attempts.len() > HISTORY_LIMIT {
        let extra = m.attempts.len() - HISTORY_LIMIT;
        m.attempts.drain(..extra);
    }
}

/// Appends a dead-letter record, keeping the most recent ones.
pub(crate) fn push_dead_letter(m: &mut MetaRecord, rec: DeadLetterRec) {
    m.dead_letters.push(rec);
    if m.dead_letters.len() > HISTORY_LIMIT {
        let extra = m.dead_letters.len() - HISTORY_LIMIT;
        m.dead_letters.drain(..extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::model::QueueConfigInput;
    use crate::queue::validate::new_config;

    #[test]
    fn queue_kinds_are_stored_as_their_codes_and_read_back() {
        // The stored numbers are a format: they never change.
        assert_eq!(QueueKind::Standard.code(), 1);
        assert_eq!(QueueKind::Fifo.code(), 2);
        for kind in [QueueKind::Standard, QueueKind::Fifo] {
            assert_eq!(QueueKind::from_code(kind.code()), kind);
            let config = new_config(&QueueConfigInput {
                kind: Some(kind),
                ..QueueConfigInput::default()
            })
            .expect("valid");
            let record = queue_record(7, 0, &config);
            assert_eq!(record.kind, kind.code());
            assert_eq!(queue_config(&record).kind, kind);
        }
        // Any other number reads as standard, as a start always took it.
        assert_eq!(QueueKind::from_code(0), QueueKind::Standard);
        assert_eq!(QueueKind::from_code(9), QueueKind::Standard);
    }
}
