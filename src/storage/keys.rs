//! The whole key space of the sled tree, defined here and nowhere else.
//!
//! Every key starts with one tag byte naming its keyspace; integers are
//! big-endian so that sled's byte order is numeric order.
//!
//! | tag | key | value |
//! |---|---|---|
//! | `0x01` | `Sys(SysKey)`: tag, one byte | `u64` big-endian |
//! | `0x02` | `Queue(name)`: tag, name bytes | [`QueueRecord`](super::records::QueueRecord) |
//! | `0x03` | `Counters(qid)`: tag, `u32` | [`CountersRecord`](super::records::CountersRecord) |
//! | `0x04` | `Meta(qid, pos)`: tag, `u32`, `u64` | [`MetaRecord`](super::records::MetaRecord) |
//! | `0x05` | `Payload(pid)`: tag, `u64` | [`PayloadRecord`](super::records::PayloadRecord) |
//! | `0x06` | `Dedup(qid, key)`: tag, `u32`, key bytes | [`DedupRecord`](super::records::DedupRecord) |
//! | `0x07` | `Group(qid, group)`: tag, `u32`, group bytes | [`GroupRecord`](super::records::GroupRecord) |
//! | `0x08` | `Exchange(name)`: tag, name bytes | [`ExchangeRecord`](super::records::ExchangeRecord) |
//! | `0x09` | `Annotations(qid)`: tag, `u32` | [`AnnotationsRecord`](super::records::AnnotationsRecord) |
//!
//! `qid` is a queue's internal number (never reused), `pos` a message's
//! position (a global counter, so that positions order messages by the
//! time they entered their queue), `pid` the position at which a message
//! was first published, which names its payload for life: moving a message
//! between queues gives it a new `pos` and keeps its `pid`.

use bytes::{BufMut, Bytes, BytesMut};

/// Single-value system keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SysKey {
    /// The data format version of the database.
    FormatVersion = 1,
    /// The last log record applied to the database.
    AppliedLsn = 2,
    /// Positions below this value may have been handed out.
    PosReserved = 3,
    /// The next queue number to hand out.
    NextQid = 4,
}

/// A key of the sled tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key<'a> {
    /// A system value.
    Sys(SysKey),
    /// A queue's configuration, by name.
    Queue(&'a str),
    /// A queue's counters.
    Counters(u32),
    /// A message's state in a queue.
    Meta(u32, u64),
    /// A message's payload.
    Payload(u64),
    /// A FIFO dedup entry or a client message id, per queue.
    Dedup(u32, &'a [u8]),
    /// A FIFO group's stored state (parked groups).
    Group(u32, &'a str),
    /// An exchange and its bindings, by name.
    Exchange(&'a str),
    /// A queue's annotations (string pairs a front end keeps with it).
    Annotations(u32),
}

pub(crate) const TAG_SYS: u8 = 0x01;
pub(crate) const TAG_QUEUE: u8 = 0x02;
pub(crate) const TAG_COUNTERS: u8 = 0x03;
pub(crate) const TAG_META: u8 = 0x04;
pub(crate) const TAG_PAYLOAD: u8 = 0x05;
pub(crate) const TAG_DEDUP: u8 = 0x06;
pub(crate) const TAG_GROUP: u8 = 0x07;
pub(crate) const TAG_EXCHANGE: u8 = 0x08;
pub(crate) const TAG_ANNOTATIONS: u8 = 0x09;

/// The keyspaces, for prefix scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// All queue configurations.
    Queues,
    /// All counters.
    Counters,
    /// All message states (of every queue).
    Metas,
    /// Message states of one queue.
    MetasOf(u32),
    /// All dedup entries.
    Dedups,
    /// All stored group states.
    Groups,
    /// All exchanges.
    Exchanges,
    /// All queues' annotations.
    Annotations,
}

impl Space {
    /// The byte prefix shared by every key of the space.
    pub fn prefix(self) -> Vec<u8> {
        match self {
            Space::Queues => vec![TAG_QUEUE],
            Space::Counters => vec![TAG_COUNTERS],
            Space::Metas => vec![TAG_META],
            Space::MetasOf(qid) => {
                let mut v = vec![TAG_META];
                v.extend_from_slice(&qid.to_be_bytes());
                v
            }
            Space::Dedups => vec![TAG_DEDUP],
            Space::Groups => vec![TAG_GROUP],
            Space::Exchanges => vec![TAG_EXCHANGE],
            Space::Annotations => vec![TAG_ANNOTATIONS],
        }
    }
}

impl Key<'_> {
    /// The key's bytes.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(16);
        match self {
            Key::Sys(k) => {
                b.put_u8(TAG_SYS);
                b.put_u8(*k as u8);
            }
            Key::Queue(name) => {
                b.put_u8(TAG_QUEUE);
                b.put_slice(name.as_bytes());
            }
            Key::Counters(qid) => {
                b.put_u8(TAG_COUNTERS);
                b.put_u32(*qid);
            }
            Key::Meta(qid, pos) => {
                b.put_u8(TAG_META);
                b.put_u32(*qid);
                b.put_u64(*pos);
            }
            Key::Payload(pid) => {
                b.put_u8(TAG_PAYLOAD);
                b.put_u64(*pid);
            }
            Key::Dedup(qid, k) => {
                b.put_u8(TAG_DEDUP);
                b.put_u32(*qid);
                b.put_slice(k);
            }
            Key::Group(qid, g) => {
                b.put_u8(TAG_GROUP);
                b.put_u32(*qid);
                b.put_slice(g.as_bytes());
            }
            Key::Exchange(name) => {
                b.put_u8(TAG_EXCHANGE);
                b.put_slice(name.as_bytes());
            }
            Key::Annotations(qid) => {
                b.put_u8(TAG_ANNOTATIONS);
                b.put_u32(*qid);
            }
        }
        b.freeze()
    }
}

/// A decoded key, owning its variable parts (for scans).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedKey {
    /// See [`Key::Queue`].
    Queue(String),
    /// See [`Key::Counters`].
    Counters(u32),
    /// See [`Key::Meta`].
    Meta(u32, u64),
    /// See [`Key::Dedup`].
    Dedup(u32, Vec<u8>),
    /// See [`Key::Group`].
    Group(u32, String),
    /// See [`Key::Exchange`].
    Exchange(String),
    /// See [`Key::Annotations`].
    Annotations(u32),
    /// Any other key.
    Other,
}

impl OwnedKey {
    /// Decodes key bytes; `None` when they are malformed.
    pub fn decode(bytes: &[u8]) -> Option<OwnedKey> {
        let (&tag, rest) = bytes.split_first()?;
        Some(match tag {
            TAG_QUEUE => OwnedKey::Queue(String::from_utf8(rest.to_vec()).ok()?),
            TAG_COUNTERS => OwnedKey::Counters(u32::from_be_bytes(rest.try_into().ok()?)),
            TAG_META => {
                if rest.len() != 12 {
                    return None;
                }
                let (q, p) = rest.split_at(4);
                OwnedKey::Meta(
                    u32::from_be_bytes(q.try_into().ok()?),
                    u64::from_be_bytes(p.try_into().ok()?),
                )
            }
            TAG_DEDUP => {
                let (q, k) = rest.split_at_checked(4)?;
                OwnedKey::Dedup(u32::from_be_bytes(q.try_into().ok()?), k.to_vec())
            }
            TAG_GROUP => {
                let (q, g) = rest.split_at_checked(4)?;
                OwnedKey::Group(
                    u32::from_be_bytes(q.try_into().ok()?),
                    String::from_utf8(g.to_vec()).ok()?,
                )
            }
            TAG_EXCHANGE => OwnedKey::Exchange(String::from_utf8(rest.to_vec()).ok()?),
            TAG_ANNOTATIONS => OwnedKey::Annotations(u32::from_be_bytes(rest.try_into().ok()?)),
            _ => OwnedKey::Other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_keys_sort_by_queue_then_position() {
        let a = Key::Meta(1, 255).encode();
        let b = Key::Meta(1, 256).encode();
        let c = Key::Meta(2, 0).encode();
        assert!(a < b && b < c);
        assert!(a.starts_with(&Space::MetasOf(1).prefix()));
        assert_eq!(OwnedKey::decode(&b), Some(OwnedKey::Meta(1, 256)));
    }

    #[test]
    fn malformed_keys_do_not_decode() {
        assert_eq!(OwnedKey::decode(&[]), None);
        assert_eq!(OwnedKey::decode(&[TAG_META, 1, 2]), None);
        assert_eq!(OwnedKey::decode(&[TAG_COUNTERS, 1]), None);
        assert_eq!(OwnedKey::decode(&[0xee, 1]), Some(OwnedKey::Other));
    }

    #[test]
    fn variable_keys_round_trip() {
        let q = Key::Queue("orders.dlq").encode();
        assert_eq!(
            OwnedKey::decode(&q),
            Some(OwnedKey::Queue("orders.dlq".into()))
        );
        let d = Key::Dedup(7, b"abc").encode();
        assert_eq!(
            OwnedKey::decode(&d),
            Some(OwnedKey::Dedup(7, b"abc".to_vec()))
        );
        let g = Key::Group(7, "g-1").encode();
        assert_eq!(OwnedKey::decode(&g), Some(OwnedKey::Group(7, "g-1".into())));
        let a = Key::Annotations(7).encode();
        assert!(a.starts_with(&Space::Annotations.prefix()));
        assert_eq!(OwnedKey::decode(&a), Some(OwnedKey::Annotations(7)));
    }
}
