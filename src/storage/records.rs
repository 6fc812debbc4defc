//! Persisted values: storage's own versioned types, encoded as one version
//! byte followed by bincode. They are a compatibility boundary: a field is
//! never removed or reordered within a version; a change of layout takes a
//! new version byte and a decoder for the old one ([`Record`]).
//!
//! Versions: every record is at version 1 but [`MetaRecord`], at version 2
//! (the failed attempts counted apart from the deliveries, in the message
//! and in each of its dead-letter records); a version 1 message record
//! still reads, converted as [`MetaRecordV1`] says.
//!
//! The queue engine converts its model to and from these types; nothing
//! outside `storage/` derives serde for persistence.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::error::{Result, StorageError};

/// A persisted type: the version byte this build writes it with, and how
/// the older versions it still reads are decoded.
pub trait Record: Serialize + DeserializeOwned {
    /// The version byte this build writes.
    const VERSION: u8 = 1;

    /// Decodes the bincode of an older version `version` of the record;
    /// `None` when this build does not read that version.
    fn decode_old(version: u8, bytes: &[u8]) -> Option<bincode::Result<Self>> {
        let _ = (version, bytes);
        None
    }
}

/// A queue's configuration as stored (durations in milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueRecord {
    /// Internal queue number, never reused.
    pub qid: u32,
    /// Creation time, ms since the epoch.
    pub created_at: u64,
    /// 1 = standard, 2 = FIFO.
    pub kind: u8,
    /// Message time to live.
    pub message_ttl: u64,
    /// Default lease length.
    pub ack_timeout: u64,
    /// Delay before a new message is visible.
    pub delivery_delay: u64,
    /// Dead letter queue name and max deliveries.
    pub dead_letter: Option<(String, u32)>,
    /// Retry backoff: initial, max, multiplier.
    pub retry_backoff: Option<(u64, u64, f64)>,
    /// Move expired messages to the DLQ.
    pub dead_letter_on_expiry: bool,
    /// Length limit.
    pub max_length: Option<u64>,
    /// Ceiling of one lease, extensions included.
    pub max_lease_total: u64,
    /// FIFO dedup window.
    pub dedup_window: u64,
    /// 1 = dead letter and continue, 2 = park group.
    pub on_poison: u8,
    /// FIFO content-based dedup.
    pub content_based_dedup: bool,
}

/// A queue's counters, absolute values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersRecord {
    /// Messages published into the queue.
    pub published: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Failed attempts.
    pub nacked: u64,
    /// Messages expired.
    pub expired: u64,
    /// Messages moved out to the DLQ.
    pub dead_lettered: u64,
    /// Messages moved in from source queues.
    pub dead_letters_received: u64,
    /// Messages deleted by purges.
    pub purged: u64,
    /// Messages moved out by redrives.
    pub redriven: u64,
    /// Messages moved in by redrives.
    pub redrive_received: u64,
}

/// The current lease of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Fencing epoch: the lease count at the grant.
    pub epoch: u32,
    /// When the lease runs out, ms since the epoch.
    pub deadline: u64,
    /// When the lease was granted.
    pub started: u64,
}

/// One failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// When it ended.
    pub at: u64,
    /// 1 nacked, 2 lease expired, 3 rejected, 4 stream closed, 5 released
    /// (FIFO: an earlier message of its group failed first).
    pub outcome: u8,
    /// The nack reason.
    pub reason: String,
}

/// One move to a dead letter queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterRec {
    /// The queue the message left.
    pub source_queue: String,
    /// 1 max deliveries, 2 rejected, 3 expired, 4 skipped, 5 corrupted
    /// (its stored body was found damaged).
    pub reason: u8,
    /// Deliveries in the source queue at the move.
    pub delivery_count: u32,
    /// Failed attempts in the source queue at the move (since its parked
    /// group was last released, if it was).
    pub failed_attempts: u32,
    /// Last nack reason.
    pub last_nack_reason: String,
    /// When.
    pub at: u64,
    /// Operator note.
    pub note: String,
}

/// A message's state in one queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaRecord {
    /// The payload's number.
    pub pid: u64,
    /// The message id.
    pub message_id: String,
    /// True when the client chose the id.
    pub client_id: bool,
    /// When the message entered this queue.
    pub enqueued_at: u64,
    /// When its time to live runs out.
    pub expires_at: u64,
    /// Not deliverable before this instant.
    pub visible_at: u64,
    /// Deliveries in this queue so far (leases and auto-ack takes, a FIFO
    /// release included; one taken back before it was handed out is not
    /// one). Never lowered otherwise. The current lease's epoch.
    pub delivery_count: u32,
    /// Failed attempts in this queue (nacks, lease expiries, streams
    /// closed with the lease), reset to 0 when an operator releases the
    /// message's parked FIFO group.
    pub failed_attempts: u32,
    /// The current lease, if leased.
    pub lease: Option<LeaseRecord>,
    /// First delivery in this queue, 0 if never.
    pub first_delivered_at: u64,
    /// Recent failed attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// Moves to dead letter queues, oldest first.
    pub dead_letters: Vec<DeadLetterRec>,
    /// FIFO group, `None` for the default group and standard queues.
    pub group: Option<String>,
    /// Body size in bytes.
    pub size: u32,
    /// True when the message was published with its own time to live.
    pub own_ttl: bool,
}

/// [`DeadLetterRec`] as version 1 of [`MetaRecord`] stored it: one count,
/// which was the failed attempts (deliveries a FIFO release took back, or
/// an operator's release reset, were not in it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterRecV1 {
    /// The queue the message left.
    pub source_queue: String,
    /// The reason's code.
    pub reason: u8,
    /// The count at the move.
    pub delivery_count: u32,
    /// Last nack reason.
    pub last_nack_reason: String,
    /// When.
    pub at: u64,
    /// Operator note.
    pub note: String,
}

impl From<DeadLetterRecV1> for DeadLetterRec {
    /// The one count was the failed attempts at the move; the deliveries
    /// are not known apart from it (a release or an operator's reset
    /// lowered it), so it stands for both.
    fn from(r: DeadLetterRecV1) -> Self {
        DeadLetterRec {
            source_queue: r.source_queue,
            reason: r.reason,
            delivery_count: r.delivery_count,
            failed_attempts: r.delivery_count,
            last_nack_reason: r.last_nack_reason,
            at: r.at,
            note: r.note,
        }
    }
}

/// [`MetaRecord`] as version 1 stored it: `delivery_count` was lowered by
/// a FIFO release and reset by an operator's release of a parked group,
/// and `leases` counted every lease granted (and taken back) like the
/// deliveries of version 2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaRecordV1 {
    /// The payload's number.
    pub pid: u64,
    /// The message id.
    pub message_id: String,
    /// True when the client chose the id.
    pub client_id: bool,
    /// When the message entered this queue.
    pub enqueued_at: u64,
    /// When its time to live runs out.
    pub expires_at: u64,
    /// Not deliverable before this instant.
    pub visible_at: u64,
    /// Leases since it entered the queue (or its group was released),
    /// minus FIFO releases.
    pub delivery_count: u32,
    /// Leases granted at this position; the current lease's epoch.
    pub leases: u32,
    /// The current lease, if leased.
    pub lease: Option<LeaseRecord>,
    /// First delivery in this queue, 0 if never.
    pub first_delivered_at: u64,
    /// Recent attempts, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// Moves to dead letter queues, oldest first.
    pub dead_letters: Vec<DeadLetterRecV1>,
    /// FIFO group.
    pub group: Option<String>,
    /// Body size in bytes.
    pub size: u32,
    /// Published with its own time to live.
    pub own_ttl: bool,
}

impl From<MetaRecordV1> for MetaRecord {
    /// The deliveries are the leases granted, which version 1 counted
    /// exactly (a release and an operator's reset left them); the failed
    /// attempts are version 1's count without the current lease, which it
    /// included: every lease that ended without a release was a failure
    /// since the last reset.
    fn from(r: MetaRecordV1) -> Self {
        let leased = u32::from(r.lease.is_some());
        MetaRecord {
            pid: r.pid,
            message_id: r.message_id,
            client_id: r.client_id,
            enqueued_at: r.enqueued_at,
            expires_at: r.expires_at,
            visible_at: r.visible_at,
            delivery_count: r.leases,
            failed_attempts: r.delivery_count.saturating_sub(leased),
            lease: r.lease,
            first_delivered_at: r.first_delivered_at,
            attempts: r.attempts,
            dead_letters: r
                .dead_letters
                .into_iter()
                .map(DeadLetterRec::from)
                .collect(),
            group: r.group,
            size: r.size,
            own_ttl: r.own_ttl,
        }
    }
}

/// A message's immutable content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadRecord {
    /// When it was first published.
    pub published_at: u64,
    /// Application properties, sorted by key.
    pub properties: Vec<(String, String)>,
    /// CRC-32 of the body, checked on every read.
    pub body_crc: u32,
    /// The body.
    pub body: Bytes,
}

/// A FIFO dedup entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    /// Id of the message first stored under this dedup key.
    pub message_id: String,
    /// When the entry may be forgotten.
    pub expires_at: u64,
}

/// A FIFO group's persisted state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// When the group was parked.
    pub parked_at: u64,
    /// Why.
    pub reason: String,
}

/// An exchange and its bindings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExchangeRecord {
    /// Creation time.
    pub created_at: u64,
    /// (queue name, filter as sorted property pairs), by queue name.
    pub bindings: Vec<(String, Vec<(String, String)>)>,
}

/// A queue's annotations: string pairs that a front end keeps with the
/// queue (the SQS endpoint's attributes, tags and move tasks), sorted by
/// name. The engine stores them and never reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnnotationsRecord {
    /// (name, value), sorted by name, names unique.
    pub pairs: Vec<(String, String)>,
}

impl Record for QueueRecord {}
impl Record for CountersRecord {}
impl Record for LeaseRecord {}
impl Record for PayloadRecord {}
impl Record for DedupRecord {}
impl Record for GroupRecord {}
impl Record for ExchangeRecord {}
impl Record for AnnotationsRecord {}

impl Record for MetaRecord {
    const VERSION: u8 = 2;

    fn decode_old(version: u8, bytes: &[u8]) -> Option<bincode::Result<Self>> {
        match version {
            1 => Some(bincode::deserialize::<MetaRecordV1>(bytes).map(MetaRecord::from)),
            _ => None,
        }
    }
}

/// Encodes a record: its version byte, then bincode.
pub fn encode<T: Record>(value: &T) -> Bytes {
    let size = bincode::serialized_size(value).unwrap_or(0);
    let mut out = BytesMut::with_capacity(1 + usize::try_from(size).unwrap_or(0)).writer();
    out.get_mut().put_u8(T::VERSION);
    // Serializing plain structs into memory cannot fail.
    if let Err(e) = bincode::serialize_into(&mut out, value) {
        tracing::error!("record encoding failed: {e}");
    }
    out.into_inner().freeze()
}

/// Shows a value's `Debug` form as the `what` of [`decode`], formatted
/// only if an error needs it.
pub struct Lazy<'a, T: std::fmt::Debug>(pub &'a T);

impl<T: std::fmt::Debug> std::fmt::Display for Lazy<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Decodes a record written by [`encode`], by this build or (an older
/// version [`Record::decode_old`] reads) an earlier one; `what` names it
/// in errors.
pub fn decode<T: Record>(what: &dyn std::fmt::Display, bytes: &[u8]) -> Result<T> {
    let undecodable = |e: bincode::Error| {
        StorageError::corrupt(what.to_string(), format!("undecodable record: {e}"))
    };
    match bytes.split_first() {
        Some((&v, rest)) if v == T::VERSION => bincode::deserialize(rest).map_err(undecodable),
        Some((&v, rest)) => match T::decode_old(v, rest) {
            Some(decoded) => decoded.map_err(undecodable),
            None => Err(StorageError::corrupt(
                what.to_string(),
                format!("unknown record version {v}"),
            )),
        },
        None => Err(StorageError::corrupt(what.to_string(), "empty record")),
    }
}

impl PayloadRecord {
    /// Builds a payload, computing the body checksum.
    pub fn new(published_at: u64, properties: Vec<(String, String)>, body: Bytes) -> Self {
        PayloadRecord {
            published_at,
            properties,
            body_crc: crc32fast::hash(&body),
            body,
        }
    }

    /// Fails when the body does not match its checksum.
    pub fn verify(&self, what: &dyn std::fmt::Display) -> Result<()> {
        let crc = crc32fast::hash(&self.body);
        if crc == self.body_crc {
            Ok(())
        } else {
            Err(StorageError::corrupt(
                what.to_string(),
                format!(
                    "body checksum {crc:08x} differs from stored {:08x}",
                    self.body_crc
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_damage() {
        let p = PayloadRecord::new(
            5,
            vec![("k".into(), "v".into())],
            Bytes::from_static(b"hello"),
        );
        let bytes = encode(&p);
        let back: PayloadRecord = decode(&"p", &bytes).expect("decodes");
        assert_eq!(back, p);
        back.verify(&"p").expect("checksum holds");

        let mut damaged = back.clone();
        damaged.body = Bytes::from_static(b"hellO");
        assert!(damaged.verify(&"p").is_err());

        assert!(decode::<PayloadRecord>(&"p", &[]).is_err());
        assert!(decode::<PayloadRecord>(&"p", &[9, 1, 2]).is_err());
        assert!(decode::<PayloadRecord>(&"p", &bytes[..bytes.len() - 2]).is_err());
    }

    /// The stored bytes of a queue's configuration are a format: existing
    /// data directories hold them. These are the bytes of version 1.
    #[test]
    fn a_queue_record_is_stored_as_it_always_was() {
        let r = QueueRecord {
            qid: 3,
            created_at: 1_700_000_000_000,
            kind: 2,
            message_ttl: 172_800_000,
            ack_timeout: 90_000,
            delivery_delay: 5_000,
            dead_letter: Some(("dlq".into(), 7)),
            retry_backoff: Some((2_000, 180_000, 3.0)),
            dead_letter_on_expiry: true,
            max_length: Some(12_345),
            max_lease_total: 21_600_000,
            dedup_window: 600_000,
            on_poison: 2,
            content_based_dedup: true,
        };
        let bytes = encode(&r);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN_QUEUE_RECORD);
        assert_eq!(decode::<QueueRecord>(&"q", &bytes).expect("decodes"), r);
    }

    /// A message record as version 1 stored it (these bytes, written by
    /// the build before the counts were kept apart): a FIFO message that
    /// entered its queue as a dead letter (moved after 2 failures), was
    /// then leased five times in it (nacked, released by an earlier
    /// message's failure, nacked, run out) and is leased now. Version 1
    /// counted 4 (the release taken off, the current lease in) and 5
    /// leases.
    const GOLDEN_META_RECORD_V1: &str = "012a0000000000000003000000000000006d2d37010068e5cf8b010000c08feecf8b0100000068e5cf8b0100000400000005000000010500000090c7e6cf8b0100006052e6cf8b010000108fe5cf8b010000040000000000000020b6e5cf8b0100000104000000000000006275737930dde5cf8b010000051a0000000000000072656c65617365643a206d2d36206661696c65642066697273744004e6cf8b010000010000000000000000502be6cf8b010000020000000000000000010000000000000006000000000000006f72646572730102000000090000000000000062616420696e707574f040e5cf8b0100000000000000000000010100000000000000670b00000000";

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// An existing data directory holds version 1 message records: each
    /// reads back with its deliveries (the leases version 1 counted
    /// exactly) and its failed attempts (version 1's count without the
    /// current lease), and its dead-letter records with their one count
    /// in both. Written again, it is version 2 and reads back the same.
    #[test]
    fn a_version_1_message_record_reads_back_with_both_counts() {
        let bytes = unhex(GOLDEN_META_RECORD_V1);
        let m: MetaRecord = decode(&"m", &bytes).expect("a version 1 record decodes");
        assert_eq!(
            (m.pid, m.message_id.as_str(), m.client_id),
            (42, "m-7", true)
        );
        assert_eq!((m.delivery_count, m.failed_attempts), (5, 3));
        assert_eq!(
            m.lease,
            Some(LeaseRecord {
                epoch: 5,
                deadline: 1_700_000_090_000,
                started: 1_700_000_060_000
            })
        );
        assert_eq!(
            m.attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
            [1, 5, 1, 2]
        );
        assert_eq!(
            m.dead_letters,
            [DeadLetterRec {
                source_queue: "orders".into(),
                reason: 1,
                delivery_count: 2,
                failed_attempts: 2,
                last_nack_reason: "bad input".into(),
                at: 1_699_999_990_000,
                note: String::new(),
            }]
        );
        assert_eq!(
            (m.group.as_deref(), m.size, m.own_ttl),
            (Some("g"), 11, false)
        );
        assert_eq!(m.first_delivered_at, 1_700_000_010_000);
        // Not leased: every lease it counted ended, released ones aside.
        let mut not_leased = unhex(GOLDEN_META_RECORD_V1);
        let at = 1 + 8 + 8 + 3 + 1 + 24 + 8;
        // The lease's tag and its 20 bytes go; the count stays 4.
        not_leased.drain(at..at + 21);
        not_leased.insert(at, 0);
        let m2: MetaRecord = decode(&"m", &not_leased).expect("decodes");
        assert_eq!(
            (m2.delivery_count, m2.failed_attempts, m2.lease),
            (5, 4, None)
        );
        // Written again: version 2, the same record.
        let again = encode(&m);
        assert_eq!(again[0], 2);
        assert_eq!(decode::<MetaRecord>(&"m", &again).expect("decodes"), m);
        // A version this build does not know is refused, naming it.
        let mut future = again.to_vec();
        future[0] = 3;
        let e = decode::<MetaRecord>(&"m", &future).expect_err("unknown version");
        assert!(e.to_string().contains("unknown record version 3"), "{e}");
    }

    const GOLDEN_QUEUE_RECORD: &str = "01030000000068e5cf8b0100000200b84c0a00000000905f0100000000008813000000000000010300000000000000646c710700000001d00700000000000020bf0200000000000000000000000840010139300000000000000097490100000000c0270900000000000201";
}
