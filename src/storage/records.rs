//! Persisted values: storage's own versioned types, encoded as one version
//! byte followed by bincode. They are a compatibility boundary: a field is
//! never removed or reordered within a version; a change of layout takes a
//! new version byte and a decoder for the old one.
//!
//! The queue engine converts its model to and from these types; nothing
//! outside `storage/` derives serde for persistence.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::error::{Result, StorageError};

/// Version byte of every record this build writes.
pub const RECORD_VERSION: u8 = 1;

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
    /// Delivery count at the move.
    pub delivery_count: u32,
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
    /// Deliveries in this queue so far (reset when an operator releases
    /// a parked FIFO group).
    pub delivery_count: u32,
    /// Leases granted at this position so far; never reset. The current
    /// lease's epoch.
    pub leases: u32,
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

/// Encodes a record: version byte, then bincode.
pub fn encode<T: Serialize>(value: &T) -> Bytes {
    let size = bincode::serialized_size(value).unwrap_or(0);
    let mut out = BytesMut::with_capacity(1 + usize::try_from(size).unwrap_or(0)).writer();
    out.get_mut().put_u8(RECORD_VERSION);
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

/// Decodes a record written by [`encode`]; `what` names it in errors.
pub fn decode<T: DeserializeOwned>(what: &dyn std::fmt::Display, bytes: &[u8]) -> Result<T> {
    match bytes.split_first() {
        Some((&RECORD_VERSION, rest)) => bincode::deserialize(rest).map_err(|e| {
            StorageError::corrupt(what.to_string(), format!("undecodable record: {e}"))
        }),
        Some((v, _)) => Err(StorageError::corrupt(
            what.to_string(),
            format!("unknown record version {v}"),
        )),
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

    const GOLDEN_QUEUE_RECORD: &str = "01030000000068e5cf8b0100000200b84c0a00000000905f0100000000008813000000000000010300000000000000646c710700000001d00700000000000020bf0200000000000000000000000840010139300000000000000097490100000000c0270900000000000201";
}
