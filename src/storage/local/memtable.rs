//! The memtable, as data: every submitted change, durable or not,
//! readable at once, until the applier has put it into the database. One
//! generation is active (submissions go into it); the applier freezes it,
//! and reads look in the frozen one next, then in the database.
//!
//! It holds no lock of its own: it lives inside the submission state
//! (`submit::Submission`, under `STATE`), which every access goes through.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use super::payloads;
use super::wal::Mutation;

/// A memtable slot: the latest value of a key (`None`: deleted), the lsn
/// of the record that wrote it, whether the key did not exist before this
/// generation of the memtable, whether the put applies only if the key
/// exists then (a payload relocation), and whether `value` is no longer
/// the payload itself but its place in the log ([`payloads::Loc`]): the
/// log writer keeps the most recent durable payloads whole (up to
/// [`StoreOptions::recent_payload_bytes`](super::StoreOptions::recent_payload_bytes),
/// for consumers close behind) and swaps older ones for their places, so
/// their memory goes back long before the applier has taken the
/// generation; reads of them take the body from the log, as they do once
/// the database holds the place.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) value: Option<Bytes>,
    pub(super) lsn: u64,
    pub(super) fresh: bool,
    pub(super) if_exists: bool,
    pub(super) placed: bool,
}

/// Keyed by encoded keys, which the store itself mostly makes (message
/// positions); hashed with foldhash, seeded per table: every submitted
/// change is hashed here, and with SipHash, inserting into this table
/// (hashing, growing) was about 7 % of the server's CPU samples during
/// batched publishing.
pub(super) type Table = HashMap<Bytes, Slot, foldhash::fast::RandomState>;

/// The active generation and the frozen one.
#[derive(Default)]
pub(super) struct Memtable {
    /// Submitted changes not yet frozen for application.
    active: Table,
    active_bytes: usize,
    /// A delete was submitted since the freeze (the applier looks for
    /// puts it overtook only then, see [`Memtable::overtaken`]).
    active_deletes: bool,
    /// Changes being applied to sled; still read until they are.
    frozen: Option<Arc<Table>>,
    /// `active_bytes` of the frozen generation when it was frozen.
    frozen_bytes: usize,
}

impl Memtable {
    /// Adds the changes of transaction `lsn` to the active generation;
    /// returns the bytes they count for (see `Submission::unapplied`).
    pub(super) fn add(&mut self, muts: &[Mutation], lsn: u64) -> usize {
        let mut added = 0;
        for m in muts {
            added += m.key.len() + m.value.as_ref().map_or(0, Bytes::len) + 48;
            self.active_deletes |= m.value.is_none();
            match self.active.entry(m.key.clone()) {
                // Created and deleted within one generation: the database
                // never needs to hear of it.
                Entry::Occupied(slot) if slot.get().fresh && m.value.is_none() => {
                    slot.remove();
                }
                // A relocation of a payload deleted in this generation.
                Entry::Occupied(slot) if m.if_exists && slot.get().value.is_none() => {}
                Entry::Occupied(mut slot) => {
                    let slot = slot.get_mut();
                    slot.value = m.value.clone();
                    slot.lsn = lsn;
                    slot.placed = false;
                }
                Entry::Vacant(place) => {
                    place.insert(Slot {
                        value: m.value.clone(),
                        lsn,
                        fresh: m.fresh,
                        if_exists: m.if_exists,
                        placed: false,
                    });
                }
            }
        }
        self.active_bytes += added;
        added
    }

    /// The bytes the active generation counts for.
    pub(super) fn active_bytes(&self) -> usize {
        self.active_bytes
    }

    /// The latest submitted value of a key, if the memtable holds one
    /// (active generation first, then the frozen one): the value (`None`:
    /// deleted) and whether it is a payload's place in the log.
    pub(super) fn lookup(&self, k: &[u8]) -> Option<(Option<Bytes>, bool)> {
        self.active
            .get(k)
            .or_else(|| self.frozen.as_ref().and_then(|f| f.get(k)))
            .map(|slot| (slot.value.clone(), slot.placed))
    }

    /// Freezes the active generation for the applier; the next one starts
    /// empty. When the active generation holds nothing (everything in it
    /// was created and deleted in between), nothing is frozen, and the
    /// bytes it counted for are given back instead (`Err`).
    pub(super) fn freeze(&mut self) -> std::result::Result<Arc<Table>, usize> {
        if self.active.is_empty() {
            return Err(std::mem::take(&mut self.active_bytes));
        }
        // The next generation starts at this one's size rather than
        // growing (and rehashing) its way there again; a quiet generation
        // shrinks it back at the next apply.
        let next = Table::with_capacity_and_hasher(self.active.len(), Default::default());
        let frozen = Arc::new(std::mem::replace(&mut self.active, next));
        self.active_deletes = false;
        self.frozen_bytes = std::mem::take(&mut self.active_bytes);
        self.frozen = Some(Arc::clone(&frozen));
        Ok(frozen)
    }

    /// Marks the deletes of `keys` (key, lsn of the delete) as deleting
    /// keys created in this generation, if they are still the keys' latest
    /// change: the puts they overtook never reached the database.
    pub(super) fn mark_fresh(&mut self, keys: &[(&Bytes, u64)]) {
        for &(k, lsn) in keys {
            if let Some(a) = self.active.get_mut(k)
                && a.value.is_none()
                && a.lsn == lsn
            {
                a.fresh = true;
            }
        }
    }

    /// Lets the frozen generation go once it is applied; returns its
    /// bytes.
    pub(super) fn unfreeze(&mut self) -> usize {
        self.frozen = None;
        std::mem::take(&mut self.frozen_bytes)
    }

    /// The memtable's changes to keys from `start` (inclusive) to `end`
    /// (exclusive), in key order: the active generation's over the frozen
    /// one's; the value (`None`: deleted) and whether it is a payload's
    /// place in the log. Every slot is looked at (the memtable is hashed):
    /// for scans, which are rare (a start, a takeover, tests), not for the
    /// paths of a message.
    pub(super) fn changes_in(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> BTreeMap<Bytes, (Option<Bytes>, bool)> {
        let inside = |k: &Bytes| k.as_ref() >= start && end.is_none_or(|e| k.as_ref() < e);
        let mut over = BTreeMap::new();
        for table in self.frozen.as_deref().into_iter().chain([&self.active]) {
            for (k, slot) in table.iter().filter(|(k, _)| inside(k)) {
                over.insert(k.clone(), (slot.value.clone(), slot.placed));
            }
        }
        over
    }

    /// Replaces each payload of `places` (key, lsn, place) that is still
    /// the active generation's latest value of its key by its place in the
    /// log, and returns the bodies it took out (to be dropped outside the
    /// lock). A key written again, deleted or frozen since keeps its slot
    /// as it is: a frozen generation is shared with the applier and goes
    /// whole soon anyway.
    pub(super) fn swap_for_places(&mut self, places: &[(Bytes, u64, payloads::Loc)]) -> Vec<Bytes> {
        let mut bodies = Vec::with_capacity(places.len());
        for (key, lsn, loc) in places {
            if let Some(slot) = self.active.get_mut(key)
                && slot.lsn == *lsn
                && !slot.placed
                && let Some(body) = slot.value.take()
            {
                slot.value = Some(Bytes::copy_from_slice(&loc.encode()));
                slot.placed = true;
                bodies.push(body);
            }
        }
        bodies
    }

    /// For each entry of a chunk of the frozen generation, the lsn of the
    /// delete that overtook it, if any: a put whose key's latest change,
    /// in the active generation, is a delete that is already durable
    /// (`durable`: the durable lsn, read before). Such a put need not
    /// reach the database (a backlog acked or its queue deleted while the
    /// applier works through it): readers see the delete above the
    /// database, and a crash before that delete is applied replays it, as
    /// it is newer than anything this generation records as applied. A
    /// delete not yet durable could still be lost to a crash, and the put
    /// with it, so it overtakes nothing.
    pub(super) fn overtaken(&self, chunk: &[(&Bytes, &Slot)], durable: u64) -> Vec<Option<u64>> {
        if !self.active_deletes {
            return vec![None; chunk.len()];
        }
        chunk
            .iter()
            .map(|&(k, slot)| {
                slot.value.as_ref()?;
                self.active
                    .get(k)
                    .filter(|a| a.value.is_none() && a.lsn <= durable)
                    .map(|a| a.lsn)
            })
            .collect()
    }

    /// Tests: the active generation's slot of a key.
    #[cfg(test)]
    pub(super) fn active_slot(&self, k: &[u8]) -> Option<Slot> {
        self.active.get(k).cloned()
    }

    /// Tests: the number of keys in the active generation.
    #[cfg(test)]
    pub(super) fn active_len(&self) -> usize {
        self.active.len()
    }
}
