//! Publishing: all-or-nothing batches, idempotent client ids, FIFO dedup.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::storage::encode_payload;
use crate::storage::records::{DedupRecord, PayloadRecord};

use super::error::{Exhausted, QueueError, Result};
use super::message::{Message, Publication};
use super::model::{Destination, NewMessage, Published, QueueKind};
use super::state::{Entry, EntryState, QueueState};
use super::{Broker, Change, State, durable, persist, validate};

/// Why a message of a batch is not stored.
pub(crate) enum Dup {
    /// Stored already under this id.
    Stored(String),
    /// A duplicate of the batch's message at this index.
    Earlier(usize),
}

/// A publish decided and logged, waiting to be durable.
#[derive(Debug)]
pub struct Publishing {
    results: Vec<Published>,
    commit: Option<crate::storage::Commit>,
}

impl Publishing {
    pub(crate) fn new(
        results: Vec<Published>,
        commit: Option<crate::storage::Commit>,
    ) -> Publishing {
        Publishing { results, commit }
    }

    /// Waits until the publish is durable; then its results are final.
    pub async fn done(self) -> Result<Vec<Published>> {
        durable(self.commit).await?;
        Ok(self.results)
    }
}

impl Broker {
    /// Publishes a batch of messages into a queue, all or nothing; answers
    /// once the batch is durable.
    pub async fn publish(&self, queue: &str, msgs: Vec<NewMessage>) -> Result<Vec<Published>> {
        self.publish_room().await;
        self.begin_publish(queue, msgs)?.done().await
    }

    /// Publishes a batch into a queue or through an exchange: [`Broker::publish`]
    /// or [`Broker::publish_to_exchange`].
    pub async fn publish_to(
        &self,
        to: &Destination,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Published>> {
        self.publish_room().await;
        self.begin_publish_to(to, msgs)?.done().await
    }

    /// The deciding half of [`Broker::publish_to`].
    pub fn begin_publish_to(&self, to: &Destination, msgs: Vec<NewMessage>) -> Result<Publishing> {
        match to {
            Destination::Queue(q) => self.begin_publish(q, msgs),
            Destination::Exchange(x) => self.begin_publish_to_exchange(x, msgs),
        }
    }

    /// Waits while the backend's apply queue is too far behind to take
    /// more messages (the local one's database behind its log, see
    /// [`crate::storage::LocalBackend::room`]); every publish path
    /// calls it before [`Broker::begin_publish`].
    pub async fn publish_room(&self) {
        self.store.room().await;
    }

    /// The deciding half of [`Broker::publish`]: validates, stores and logs
    /// the batch (so publishes begun one after the other are stored in that
    /// order) and returns without waiting for durability.
    pub fn begin_publish(&self, queue: &str, msgs: Vec<NewMessage>) -> Result<Publishing> {
        self.admit_batch(&msgs)?;
        let now = self.now();
        // Encoding copies bodies: do it before taking the lock.
        let payloads = encode_all(&msgs, now);
        let (results, commit) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let q = st.queue(qid)?;
            let keys: Vec<Vec<Vec<u8>>> = if q.fifo.is_some() && q.config.dedup_window > 0 {
                msgs.iter()
                    .map(|m| dedup_keys(m, q.config.content_based_dedup))
                    .collect()
            } else {
                vec![Vec::new(); msgs.len()]
            };
            let at: Vec<usize> = (0..msgs.len()).collect();
            let dups = self.admit(q, &msgs, &at, &keys, now, None)?;
            let new_count = dups.iter().filter(|d| d.is_none()).count() as u64;
            self.decide(&mut st, |st, change| {
                let mut results: Vec<Published> = Vec::with_capacity(msgs.len());
                for (i, (m, payload)) in msgs.iter().zip(payloads).enumerate() {
                    let first = match &dups[i] {
                        Some(Dup::Stored(id)) => Some(id.clone()),
                        Some(Dup::Earlier(j)) => results.get(*j).map(|r| r.message_id.clone()),
                        None => None,
                    };
                    if let Some(message_id) = first {
                        results.push(Published {
                            message_id,
                            duplicate: true,
                            routed_to: Vec::new(),
                        });
                        continue;
                    }
                    let id = match &m.message_id {
                        Some(id) => (id.clone(), true),
                        None => (new_message_id(now, st.next_pos), false),
                    };
                    store_new(st, qid, m, id.clone(), payload, &keys[i], now, change)?;
                    results.push(Published {
                        message_id: id.0,
                        duplicate: false,
                        routed_to: Vec::new(),
                    });
                }
                let State { queues, undo, .. } = st;
                if let Some(q) = queues.get_mut(&qid) {
                    q.counters_mut(undo).published += new_count;
                }
                change.touch(qid);
                change.wake(qid);
                Ok(results)
            })?
        };
        Ok(Publishing::new(results, commit))
    }

    /// Publish admission before the lock, the same into a queue and
    /// through an exchange: the batch's size and each message on its own.
    pub(crate) fn admit_batch(&self, msgs: &[NewMessage]) -> Result<()> {
        validate::batch("messages", msgs.len())?;
        for (i, m) in msgs.iter().enumerate() {
            validate::message(i, m, self.opts.max_message_size)?;
        }
        Ok(())
    }

    /// Publishes are refused while free disk space is below the minimum.
    pub(crate) fn admit_space(&self) -> Result<()> {
        if self.store.has_space() {
            return Ok(());
        }
        Err(Exhausted::DiskLow.error(format!(
            "disk full: free space in {} is below the configured minimum; publishes are refused until space is freed",
            self.store.location()
        )))
    }

    /// Publish admission into one queue, the same into a queue and through
    /// an exchange (`via`): each message fits the queue's configuration
    /// (`at[j]`, the index in the batch of `msgs[j]`, names a bad field),
    /// the disk has room, and the messages that are not duplicates fit
    /// under its `max_length`. Returns the duplicates (see
    /// [`find_duplicates`]; `keys` are the FIFO dedup keys).
    pub(crate) fn admit(
        &self,
        q: &QueueState,
        msgs: &[NewMessage],
        at: &[usize],
        keys: &[Vec<Vec<u8>>],
        now: u64,
        via: Option<&str>,
    ) -> Result<Vec<Option<Dup>>> {
        for (m, &i) in msgs.iter().zip(at) {
            validate::message_for_queue(i, m, &q.config)?;
        }
        self.admit_space()?;
        let dups = find_duplicates(q, msgs, keys, now);
        let new = dups.iter().filter(|d| d.is_none()).count() as u64;
        if let Some(max) = q.config.max_length {
            let len = q.msgs.len() as u64;
            if len + new > max {
                let via = via.map_or_else(String::new, |x| format!(" (bound to exchange {x:?})"));
                return Err(Exhausted::QueueFull.error(format!(
                    "queue {:?}{via} is full: it holds {len} of at most {max} messages (max_length) and the batch adds {new}",
                    q.name
                )));
            }
        }
        Ok(dups)
    }
}

/// Stores one new message under `id` (and whether the client chose it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_new(
    st: &mut State,
    qid: u32,
    m: &NewMessage,
    id: (String, bool),
    payload: Bytes,
    keys: &[Vec<u8>],
    now: u64,
    change: &mut Change,
) -> Result<()> {
    let pos = st.alloc_pos(&mut change.txn);
    let State {
        queues,
        timers,
        undo,
        ..
    } = st;
    let q = queues
        .get_mut(&qid)
        .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
    let (message_id, client_id) = id;
    let delay = m.delay.unwrap_or(q.config.delivery_delay);
    let visible_at = now + delay;
    let expires_at = now + m.ttl.unwrap_or(q.config.message_ttl);
    let size = u32::try_from(m.body.len()).unwrap_or(u32::MAX);
    let group = q.group(m.group_id.as_deref().unwrap_or(""), undo);
    let meta = Message::publish(Publication {
        pid: pos,
        id: message_id.clone(),
        client_id,
        size,
        group: m
            .group_id
            .clone()
            .filter(|_| q.config.kind == QueueKind::Fifo),
        now,
        visible_at,
        expires_at,
        own_ttl: m.ttl.is_some(),
    });
    change.txn.put_payload(pos, payload);
    persist::put_new(&mut change.txn, qid, pos, &meta);
    if client_id {
        q.set_client_id(&message_id, pos, undo);
    }
    if q.fifo.is_some() && q.config.dedup_window > 0 {
        let until = now + q.config.dedup_window;
        for k in keys {
            q.remember_dedup(k, &message_id, until, undo);
            change.txn.put_dedup(
                qid,
                k,
                &DedupRecord {
                    message_id: message_id.clone(),
                    expires_at: until,
                },
            );
        }
    }
    let (state, due) = if visible_at > now {
        (EntryState::Delayed, visible_at)
    } else {
        (EntryState::Ready, 0)
    };
    q.add(
        pos,
        Entry::new(state, due, expires_at, 0, size, group),
        pos,
        timers,
        undo,
    );
    Ok(())
}

/// Encodes every message's payload record.
pub(crate) fn encode_all(msgs: &[NewMessage], now: u64) -> Vec<Bytes> {
    msgs.iter()
        .map(|m| {
            let mut props = m.properties.clone();
            props.sort();
            encode_payload(&PayloadRecord::new(now, props, m.body.clone()))
        })
        .collect()
}

/// Marks each message that must not be stored: its client id is in the
/// queue, or (FIFO) one of its dedup keys is within the dedup window, or
/// an earlier message of the batch has the same id or key.
pub(crate) fn find_duplicates(
    q: &QueueState,
    msgs: &[NewMessage],
    keys: &[Vec<Vec<u8>>],
    now: u64,
) -> Vec<Option<Dup>> {
    let mut seen_ids: HashMap<&str, usize> = HashMap::new();
    let mut seen_keys: HashMap<&[u8], usize> = HashMap::new();
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let mut dup = None;
        if let Some(id) = &m.message_id {
            if let Some(&j) = seen_ids.get(id.as_str()) {
                dup = Some(Dup::Earlier(j));
            } else if q.client_ids.get(id).is_some_and(|p| q.msgs.contains(*p)) {
                dup = Some(Dup::Stored(id.clone()));
            }
        }
        if dup.is_none() {
            for k in &keys[i] {
                if let Some(&j) = seen_keys.get(k.as_slice()) {
                    dup = Some(Dup::Earlier(j));
                    break;
                }
                let known = q.fifo.as_ref().and_then(|f| f.dedup.get(k));
                if let Some((first, until)) = known
                    && *until > now
                {
                    dup = Some(Dup::Stored(first.clone()));
                    break;
                }
            }
        }
        if dup.is_none() {
            if let Some(cid) = &m.message_id {
                seen_ids.insert(cid.as_str(), i);
            }
            for k in &keys[i] {
                seen_keys.insert(k.as_slice(), i);
            }
        }
        out.push(dup);
    }
    out
}

/// The FIFO dedup keys of a message: its dedup id, its client id, and
/// with content-based dedup the SHA-256 of its body (when it has no dedup
/// id).
fn dedup_keys(m: &NewMessage, content_based: bool) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    if let Some(d) = &m.dedup_id {
        keys.push([b"d:".as_slice(), d.as_bytes()].concat());
    }
    if let Some(id) = &m.message_id {
        keys.push([b"m:".as_slice(), id.as_bytes()].concat());
    }
    if content_based && m.dedup_id.is_none() {
        let digest = Sha256::digest(&m.body);
        keys.push([b"c:".as_slice(), digest.as_slice()].concat());
    }
    keys
}

/// A server-assigned message id: 26 characters of Crockford base32 of
/// (48-bit time in ms, 64-bit position, 16 bits of per-process salt), so
/// ids sort by time and never repeat within a data directory.
pub(crate) fn new_message_id(now: u64, pos: u64) -> String {
    static SALT: OnceLock<u16> = OnceLock::new();
    let salt = *SALT.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(pos);
        u16::try_from(h.finish() & 0xffff).unwrap_or(0)
    });
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let v: u128 =
        (u128::from(now & ((1 << 48) - 1)) << 80) | (u128::from(pos) << 16) | u128::from(salt);
    let mut out = String::with_capacity(26);
    for i in (0..26).rev() {
        let digit = usize::try_from((v >> (5 * i)) & 31).unwrap_or(0);
        out.push(char::from(ALPHABET[digit]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ids_sort_by_time_then_position() {
        let a = new_message_id(1_000, 5);
        let b = new_message_id(1_000, 6);
        let c = new_message_id(1_001, 1);
        assert_eq!(a.len(), 26);
        assert!(a < b && b < c, "{a} {b} {c}");
    }
}
