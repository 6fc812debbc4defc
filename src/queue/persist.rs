//! Translation between the engine's model and the storage records: the
//! only code of the engine that names a message's stored record
//! (`MetaRecord`), mapping it to the engine's [`Message`] and back, field
//! by field, and reading and writing it through the store.

use crate::storage::records::LeaseRecord;
use crate::storage::records::{
    AttemptRecord, CountersRecord, DeadLetterRec, MetaRecord, QueueRecord,
};
use crate::storage::{AnyBackend, LoadSource, OwnedKey, Space, StorageError, Store, Txn};

use super::message::{Lease, Message, Stored};
use super::model::{
    Attempt, AttemptOutcome, DeadLetter, DeadLetterPolicy, DeadLetterReason, PoisonPolicy,
    QueueConfig, QueueCounters, QueueKind, RetryBackoff,
};

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

/// The configuration a stored queue record holds; a kind or poison
/// policy number no value has is damage, refused naming the queue.
pub(crate) fn queue_config(name: &str, r: &QueueRecord) -> Result<QueueConfig, StorageError> {
    let damaged = |field: &str, code: u8, known: &str| {
        StorageError::corrupt(
            format!("the record of queue {name:?}"),
            format!("{field} {code} is none of {known}"),
        )
    };
    let kind = QueueKind::from_code(r.kind)
        .ok_or_else(|| damaged("kind", r.kind, "1 (standard), 2 (FIFO)"))?;
    let on_poison = PoisonPolicy::from_code(r.on_poison).ok_or_else(|| {
        damaged(
            "on_poison",
            r.on_poison,
            "1 (DEAD_LETTER_AND_CONTINUE), 2 (PARK_GROUP)",
        )
    })?;
    Ok(QueueConfig {
        kind,
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
        on_poison,
        content_based_dedup: r.content_based_dedup,
    })
}

fn outcome_code(o: AttemptOutcome) -> u8 {
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

fn reason_code(r: DeadLetterReason) -> u8 {
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

/// A message as its stored record holds it. An attempt outcome or a
/// dead-letter reason of an unknown code reads as the first one (nacked,
/// max deliveries), as it always has.
pub(crate) fn message(r: MetaRecord) -> Message {
    Message::restore(Stored {
        pid: r.pid,
        id: r.message_id,
        client_id: r.client_id,
        enqueued_at: r.enqueued_at,
        expires_at: r.expires_at,
        visible_at: r.visible_at,
        delivery_count: r.delivery_count,
        failed_attempts: r.failed_attempts,
        lease: r.lease.map(|l| Lease {
            epoch: l.epoch,
            deadline: l.deadline,
            started: l.started,
        }),
        first_delivered_at: r.first_delivered_at,
        attempts: r
            .attempts
            .into_iter()
            .map(|a| Attempt {
                at: a.at,
                outcome: outcome(a.outcome),
                reason: a.reason,
            })
            .collect(),
        dead_letters: r
            .dead_letters
            .into_iter()
            .map(|d| DeadLetter {
                source_queue: d.source_queue,
                reason: reason(d.reason),
                delivery_count: d.delivery_count,
                failed_attempts: d.failed_attempts,
                last_nack_reason: d.last_nack_reason,
                at: d.at,
                note: d.note,
            })
            .collect(),
        group: r.group,
        size: r.size,
        own_ttl: r.own_ttl,
    })
}

/// The record that stores a message.
pub(crate) fn meta_record(m: &Message) -> MetaRecord {
    MetaRecord {
        pid: m.pid(),
        message_id: m.id().to_string(),
        client_id: m.client_id(),
        enqueued_at: m.enqueued_at(),
        expires_at: m.expires_at(),
        visible_at: m.visible_at(),
        delivery_count: m.delivery_count(),
        failed_attempts: m.failed_attempts(),
        lease: m.current_lease().map(|l| LeaseRecord {
            epoch: l.epoch,
            deadline: l.deadline,
            started: l.started,
        }),
        first_delivered_at: m.first_delivered_at(),
        attempts: m
            .attempts()
            .iter()
            .map(|a| AttemptRecord {
                at: a.at,
                outcome: outcome_code(a.outcome),
                reason: a.reason.clone(),
            })
            .collect(),
        dead_letters: m
            .dead_letters()
            .iter()
            .map(|d| DeadLetterRec {
                source_queue: d.source_queue.clone(),
                reason: reason_code(d.reason),
                delivery_count: d.delivery_count,
                failed_attempts: d.failed_attempts,
                last_nack_reason: d.last_nack_reason.clone(),
                at: d.at,
                note: d.note.clone(),
            })
            .collect(),
        group: m.group().map(str::to_string),
        size: m.size(),
        own_ttl: m.own_ttl(),
    }
}

/// A message's stored state (the memtable's, else the database's).
pub(crate) fn get(
    store: &Store<AnyBackend>,
    qid: u32,
    pos: u64,
) -> crate::storage::Result<Option<Message>> {
    Ok(store.get_meta(qid, pos)?.map(message))
}

/// A message's state as `txn`, not yet submitted, leaves it: `Some(None)`
/// if it deletes the message, `None` if it does not touch it.
pub(crate) fn pending(
    txn: &Txn,
    qid: u32,
    pos: u64,
) -> crate::storage::Result<Option<Option<Message>>> {
    Ok(txn.pending_meta(qid, pos)?.map(|m| m.map(message)))
}

/// Stores a message's state at its position.
pub(crate) fn put(txn: &mut Txn, qid: u32, pos: u64, m: &Message) {
    txn.put_meta(qid, pos, &meta_record(m));
}

/// Stores a message at a position never used before.
pub(crate) fn put_new(txn: &mut Txn, qid: u32, pos: u64, m: &Message) {
    txn.put_new_meta(qid, pos, &meta_record(m));
}

/// Negative control (`Fault::NoDeliveryCount`): a message's state kept in
/// memory only, never logged.
pub(crate) fn put_unlogged(txn: &mut Txn, qid: u32, pos: u64, m: &Message) {
    txn.put_meta_unlogged(qid, pos, &meta_record(m));
}

/// Every stored message, in key order (at start).
pub(crate) fn scan<S: LoadSource>(
    store: &S,
) -> impl Iterator<Item = crate::storage::Result<(OwnedKey, Message)>> + '_ {
    store
        .scan::<MetaRecord>(Space::Metas)
        .map(|item| item.map(|(key, rec)| (key, message(rec))))
}

impl From<&CountersRecord> for QueueCounters {
    fn from(r: &CountersRecord) -> QueueCounters {
        let CountersRecord {
            published,
            acked,
            nacked,
            expired,
            dead_lettered,
            dead_letters_received,
            purged,
            redriven,
            redrive_received,
        } = *r;
        QueueCounters {
            published,
            acked,
            nacked,
            expired,
            dead_lettered,
            dead_letters_received,
            purged,
            redriven,
            redrive_received,
        }
    }
}

impl From<&QueueCounters> for CountersRecord {
    fn from(c: &QueueCounters) -> CountersRecord {
        let QueueCounters {
            published,
            acked,
            nacked,
            expired,
            dead_lettered,
            dead_letters_received,
            purged,
            redriven,
            redrive_received,
        } = *c;
        CountersRecord {
            published,
            acked,
            nacked,
            expired,
            dead_lettered,
            dead_letters_received,
            purged,
            redriven,
            redrive_received,
        }
    }
}

#[cfg(test)]
mod message_tests {
    use super::*;
    use crate::storage::records;
    use proptest::prelude::*;

    fn attempt_record() -> impl Strategy<Value = AttemptRecord> {
        (any::<u64>(), 1u8..=5, ".{0,8}").prop_map(|(at, outcome, reason)| AttemptRecord {
            at,
            outcome,
            reason,
        })
    }

    fn dead_letter_record() -> impl Strategy<Value = DeadLetterRec> {
        (
            ".{0,8}",
            1u8..=5,
            (any::<u32>(), any::<u32>()),
            ".{0,8}",
            any::<u64>(),
            ".{0,8}",
        )
            .prop_map(
                |(
                    source_queue,
                    reason,
                    (delivery_count, failed_attempts),
                    last_nack_reason,
                    at,
                    note,
                )| {
                    DeadLetterRec {
                        source_queue,
                        reason,
                        delivery_count,
                        failed_attempts,
                        last_nack_reason,
                        at,
                        note,
                    }
                },
            )
    }

    /// Any record a build writes: every field free, the codes among the
    /// ones that exist.
    fn meta() -> impl Strategy<Value = MetaRecord> {
        (
            (
                any::<u64>(),
                ".{0,12}",
                any::<bool>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
            ),
            (
                proptest::option::of((any::<u32>(), any::<u64>(), any::<u64>())),
                any::<u64>(),
                proptest::collection::vec(attempt_record(), 0..18),
                proptest::collection::vec(dead_letter_record(), 0..18),
                proptest::option::of(".{0,8}"),
                any::<u32>(),
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    (pid, message_id, client_id, enqueued_at, expires_at, visible_at, dc, failed),
                    (lease, first, attempts, dead_letters, group, size, own_ttl),
                )| MetaRecord {
                    pid,
                    message_id,
                    client_id,
                    enqueued_at,
                    expires_at,
                    visible_at,
                    delivery_count: dc,
                    failed_attempts: failed,
                    lease: lease.map(|(epoch, deadline, started)| LeaseRecord {
                        epoch,
                        deadline,
                        started,
                    }),
                    first_delivered_at: first,
                    attempts,
                    dead_letters,
                    group,
                    size,
                    own_ttl,
                },
            )
    }

    proptest! {
        /// Every field of a stored record reaches the message and comes
        /// back: the record, and so its bytes, are the same.
        #[test]
        fn a_record_maps_to_a_message_and_back_unchanged(rec in meta()) {
            let m = message(rec.clone());
            prop_assert_eq!(m.pid(), rec.pid);
            prop_assert_eq!(m.id(), rec.message_id.as_str());
            prop_assert_eq!(m.delivery_count(), rec.delivery_count);
            prop_assert_eq!(m.failed_attempts(), rec.failed_attempts);
            prop_assert_eq!(m.attempts().len(), rec.attempts.len());
            prop_assert_eq!(m.dead_letters().len(), rec.dead_letters.len());
            let back = meta_record(&m);
            prop_assert_eq!(records::encode(&back), records::encode(&rec));
            prop_assert_eq!(&back, &rec);
            // And the message read back from those bytes is the same.
            let decoded: MetaRecord =
                records::decode(&"meta", &records::encode(&back)).expect("decodes");
            prop_assert_eq!(message(decoded), m);
        }
    }

    #[test]
    fn every_field_is_mapped_to_its_own_place() {
        let rec = MetaRecord {
            pid: 1,
            message_id: "id".to_string(),
            client_id: true,
            enqueued_at: 2,
            expires_at: 3,
            visible_at: 4,
            delivery_count: 5,
            failed_attempts: 6,
            lease: Some(LeaseRecord {
                epoch: 7,
                deadline: 8,
                started: 9,
            }),
            first_delivered_at: 10,
            attempts: vec![AttemptRecord {
                at: 11,
                outcome: 5,
                reason: "why".to_string(),
            }],
            dead_letters: vec![DeadLetterRec {
                source_queue: "src".to_string(),
                reason: 4,
                delivery_count: 12,
                failed_attempts: 15,
                last_nack_reason: "last".to_string(),
                at: 13,
                note: "note".to_string(),
            }],
            group: Some("g".to_string()),
            size: 14,
            own_ttl: true,
        };
        let m = message(rec.clone());
        assert_eq!(
            (
                m.pid(),
                m.id(),
                m.client_id(),
                m.enqueued_at(),
                m.expires_at()
            ),
            (1, "id", true, 2, 3)
        );
        assert_eq!(
            (m.visible_at(), m.delivery_count(), m.failed_attempts()),
            (4, 5, 6)
        );
        assert_eq!(
            m.current_lease(),
            Some(Lease {
                epoch: 7,
                deadline: 8,
                started: 9
            })
        );
        assert_eq!(m.first_delivered_at(), 10);
        assert_eq!(
            m.attempts(),
            &[Attempt {
                at: 11,
                outcome: AttemptOutcome::Released,
                reason: "why".to_string()
            }]
        );
        assert_eq!(
            m.dead_letters(),
            &[DeadLetter {
                source_queue: "src".to_string(),
                reason: DeadLetterReason::Skipped,
                delivery_count: 12,
                failed_attempts: 15,
                last_nack_reason: "last".to_string(),
                at: 13,
                note: "note".to_string(),
            }]
        );
        assert_eq!((m.group(), m.size(), m.own_ttl()), (Some("g"), 14, true));
        assert_eq!(meta_record(&m), rec);
    }

    #[test]
    fn outcome_and_reason_codes_are_a_format() {
        // The stored numbers never change.
        let outcomes = [
            (AttemptOutcome::Nacked, 1),
            (AttemptOutcome::LeaseExpired, 2),
            (AttemptOutcome::Rejected, 3),
            (AttemptOutcome::StreamClosed, 4),
            (AttemptOutcome::Released, 5),
        ];
        for (o, code) in outcomes {
            assert_eq!(outcome_code(o), code);
            assert_eq!(outcome(code), o);
        }
        let reasons = [
            (DeadLetterReason::MaxDeliveries, 1),
            (DeadLetterReason::Rejected, 2),
            (DeadLetterReason::Expired, 3),
            (DeadLetterReason::Skipped, 4),
            (DeadLetterReason::Corrupted, 5),
        ];
        for (r, code) in reasons {
            assert_eq!(reason_code(r), code);
            assert_eq!(reason(code), r);
        }
        // Unknown codes read as the first, as they always have.
        assert_eq!(outcome(0), AttemptOutcome::Nacked);
        assert_eq!(outcome(9), AttemptOutcome::Nacked);
        assert_eq!(reason(0), DeadLetterReason::MaxDeliveries);
        assert_eq!(reason(9), DeadLetterReason::MaxDeliveries);
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
            assert_eq!(QueueKind::from_code(kind.code()), Some(kind));
            let config = new_config(&QueueConfigInput {
                kind: Some(kind),
                ..QueueConfigInput::default()
            })
            .expect("valid");
            let record = queue_record(7, 0, &config);
            assert_eq!(record.kind, kind.code());
            assert_eq!(queue_config("q", &record).unwrap().kind, kind);
        }
        // Any other number is damage, refused naming the queue and the
        // number: never read as a standard queue.
        assert_eq!(QueueKind::from_code(0), None);
        assert_eq!(QueueKind::from_code(9), None);
        let config = new_config(&QueueConfigInput::default()).expect("valid");
        let mut record = queue_record(7, 0, &config);
        record.kind = 9;
        let e = queue_config("orders", &record).unwrap_err();
        assert!(e.is_corrupt(), "{e}");
        assert!(
            e.to_string().contains("\"orders\"") && e.to_string().contains("kind 9"),
            "{e}"
        );
        let mut record = queue_record(7, 0, &config);
        record.on_poison = 0;
        let e = queue_config("orders", &record).unwrap_err();
        assert!(e.to_string().contains("on_poison 0"), "{e}");
    }

    #[test]
    fn counters_map_to_their_record_and_back_field_by_field() {
        let c = QueueCounters {
            published: 1,
            acked: 2,
            nacked: 3,
            expired: 4,
            dead_lettered: 5,
            dead_letters_received: 6,
            purged: 7,
            redriven: 8,
            redrive_received: 9,
        };
        let r = CountersRecord::from(&c);
        assert_eq!(
            (r.published, r.acked, r.nacked, r.expired, r.dead_lettered),
            (1, 2, 3, 4, 5)
        );
        assert_eq!(
            (
                r.dead_letters_received,
                r.purged,
                r.redriven,
                r.redrive_received
            ),
            (6, 7, 8, 9)
        );
        assert_eq!(QueueCounters::from(&r), c);
    }
}
