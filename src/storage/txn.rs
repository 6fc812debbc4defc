//! Building transactions: the puts and deletes of typed keys the engine
//! hands to [`Store::submit`](super::Store::submit), applied atomically.

use bytes::Bytes;

use super::error::Result;
use super::keys::{Key, SysKey};
use super::records::{
    self, AnnotationsRecord, CountersRecord, DedupRecord, ExchangeRecord, GroupRecord, MetaRecord,
    PayloadRecord, QueueRecord,
};
use crate::faults::{self, Fault};

/// A transaction under construction: puts and deletes applied atomically.
#[derive(Debug, Default)]
pub struct Txn {
    pub(super) muts: Vec<Mutation>,
    /// Negative control ([`Fault::NoDeliveryCount`]): puts kept in memory
    /// only. Always empty without that fault.
    pub(super) volatile: Vec<(Bytes, Bytes)>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        if faults::on(Fault::NoDeliveryCount) && !self.volatile.is_empty() {
            return false;
        }
        self.muts.is_empty()
    }

    /// Negative control ([`Fault::NoDeliveryCount`]): a message's state
    /// kept in memory only (never logged), until a later transaction
    /// writes or deletes the key. Called only under that fault.
    pub(crate) fn put_meta_unlogged(&mut self, qid: u32, pos: u64, rec: &MetaRecord) {
        self.volatile
            .push((Key::Meta(qid, pos).encode(), records::encode(rec)));
    }

    pub(super) fn put(&mut self, key: Key<'_>, value: Bytes) {
        self.muts.push(Mutation {
            key: key.encode(),
            value: Some(value),
            fresh: false,
            if_exists: false,
        });
    }

    /// A put of a key that never existed before (see [`Mutation::fresh`]).
    pub(super) fn put_fresh(&mut self, key: Key<'_>, value: Bytes) {
        self.muts.push(Mutation {
            key: key.encode(),
            value: Some(value),
            fresh: true,
            if_exists: false,
        });
    }

    pub(super) fn put_record<T: records::Record>(&mut self, key: Key<'_>, value: &T) {
        self.put(key, records::encode(value));
    }

    /// A message's state as this transaction, not yet submitted, leaves
    /// it: `Some(None)` if it deletes the message, `None` if it does not
    /// touch it (the store then holds the current state).
    pub fn pending_meta(&self, qid: u32, pos: u64) -> Result<Option<Option<MetaRecord>>> {
        let key = Key::Meta(qid, pos).encode();
        let Some(m) = self.muts.iter().rev().find(|m| m.key == key) else {
            return Ok(None);
        };
        match &m.value {
            None => Ok(Some(None)),
            Some(bytes) => {
                records::decode(&format_args!("message {qid}/{pos}"), bytes).map(|r| Some(Some(r)))
            }
        }
    }

    /// Deletes a key.
    pub fn delete(&mut self, key: Key<'_>) {
        self.muts.push(Mutation::delete(key.encode()));
    }

    /// Stores a system value.
    pub fn put_sys(&mut self, key: SysKey, value: u64) {
        self.put(Key::Sys(key), Bytes::copy_from_slice(&value.to_be_bytes()));
    }

    /// Stores a queue's configuration.
    pub fn put_queue(&mut self, name: &str, rec: &QueueRecord) {
        self.put_record(Key::Queue(name), rec);
    }

    /// Stores a queue's counters.
    pub fn put_counters(&mut self, qid: u32, rec: &CountersRecord) {
        self.put_record(Key::Counters(qid), rec);
    }

    /// Stores a message's state.
    pub fn put_meta(&mut self, qid: u32, pos: u64, rec: &MetaRecord) {
        self.put_record(Key::Meta(qid, pos), rec);
    }

    /// Stores the state of a message at a position never used before.
    pub fn put_new_meta(&mut self, qid: u32, pos: u64, rec: &MetaRecord) {
        self.put_fresh(Key::Meta(qid, pos), records::encode(rec));
    }

    /// Stores a new payload, already encoded with [`encode_payload`]
    /// (payload numbers are never reused).
    pub fn put_payload(&mut self, pid: u64, encoded: Bytes) {
        self.put_fresh(Key::Payload(pid), encoded);
    }

    /// Logs a payload again, to be stored only if it still exists when
    /// applied (compaction).
    pub(super) fn relocate(&mut self, key: Bytes, value: Bytes) {
        self.muts.push(Mutation {
            key,
            value: Some(value),
            fresh: false,
            if_exists: true,
        });
    }

    /// Stores a dedup entry.
    pub fn put_dedup(&mut self, qid: u32, key: &[u8], rec: &DedupRecord) {
        self.put_record(Key::Dedup(qid, key), rec);
    }

    /// Stores an exchange.
    pub fn put_exchange(&mut self, name: &str, rec: &ExchangeRecord) {
        self.put_record(Key::Exchange(name), rec);
    }

    /// Stores a group's state.
    pub fn put_group(&mut self, qid: u32, group: &str, rec: &GroupRecord) {
        self.put_record(Key::Group(qid, group), rec);
    }

    /// Writes a queue's annotations.
    pub fn put_annotations(&mut self, qid: u32, rec: &AnnotationsRecord) {
        self.put_record(Key::Annotations(qid), rec);
    }
}

/// Encodes a payload (outside any lock; it can be large).
pub fn encode_payload(rec: &PayloadRecord) -> Bytes {
    records::encode(rec)
}

/// One change to the materialised state: a put or a delete of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// The key bytes (see `keys.rs`).
    pub key: Bytes,
    /// The new value, `None` to delete.
    pub value: Option<Bytes>,
    /// The key never existed before this put (a new position or payload
    /// number). Not logged: it only lets the memtable drop a put and a
    /// later delete of the same key that meet before reaching the
    /// database.
    pub fresh: bool,
    /// Put only if the key exists when the change is applied (moving a
    /// payload to a newer log segment; the local log writes it as tag 2).
    pub if_exists: bool,
}

impl Mutation {
    /// A put.
    pub fn put(key: Bytes, value: Bytes) -> Mutation {
        Mutation {
            key,
            value: Some(value),
            fresh: false,
            if_exists: false,
        }
    }

    /// A delete.
    pub fn delete(key: Bytes) -> Mutation {
        Mutation {
            key,
            value: None,
            fresh: false,
            if_exists: false,
        }
    }
}
