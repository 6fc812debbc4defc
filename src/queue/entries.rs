//! A queue's entry map: its messages' [`Entry`]s by position.
//!
//! Positions are handed out in rising order, so a queue's messages sit on
//! dense runs of positions. The map keeps them in chunks of 64 positions:
//! a B-tree from `position / 64` to a chunk, which holds a bitmask of the
//! positions present and their entries, packed in position order in a
//! vector. A full chunk costs its 64 entries (24 bytes each) and under a
//! byte per entry besides; a B-tree of positions costs 8 bytes of key per
//! entry and node slack on top (33 bytes per entry when built in bulk,
//! about 50 when appended one by one). A chunk thinned out by
//! acknowledgements gives back its vector's spare room as it empties, and
//! goes when its last entry does.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use super::state::Entry;

/// Positions per chunk, as a shift.
const SHIFT: u32 = 6;
/// The offset of a position in its chunk.
const MASK: u64 = (1 << SHIFT) - 1;

/// Entries by position.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct EntryMap {
    chunks: BTreeMap<u64, Chunk>,
    len: usize,
}

/// The entries of 64 consecutive positions.
#[derive(Debug, Default, Clone, PartialEq)]
struct Chunk {
    /// Bit `i`: position `64 * key + i` is present.
    present: u64,
    /// The present positions' entries, in position order.
    entries: Vec<Entry>,
}

impl Chunk {
    fn has(&self, off: u32) -> bool {
        self.present >> off & 1 == 1
    }

    /// Where the entry of offset `off` is (or goes) in `entries`.
    fn slot(&self, off: u32) -> usize {
        (self.present & ((1u64 << off) - 1)).count_ones() as usize
    }

    /// `(position, entry)` of each present position, ascending.
    fn iter(&self, key: u64) -> impl Iterator<Item = (u64, &Entry)> + '_ {
        let mut bits = self.present;
        self.entries.iter().map(move |e| {
            let off = bits.trailing_zeros();
            bits &= bits - 1;
            ((key << SHIFT) | u64::from(off), e)
        })
    }
}

fn split(pos: u64) -> (u64, u32) {
    (pos >> SHIFT, (pos & MASK) as u32)
}

impl EntryMap {
    pub(crate) fn new() -> EntryMap {
        EntryMap::default()
    }

    /// How many entries it holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn get(&self, pos: u64) -> Option<&Entry> {
        let (key, off) = split(pos);
        let c = self.chunks.get(&key)?;
        c.has(off).then(|| &c.entries[c.slot(off)])
    }

    pub(crate) fn get_mut(&mut self, pos: u64) -> Option<&mut Entry> {
        let (key, off) = split(pos);
        let c = self.chunks.get_mut(&key)?;
        if !c.has(off) {
            return None;
        }
        let slot = c.slot(off);
        Some(&mut c.entries[slot])
    }

    pub(crate) fn contains(&self, pos: u64) -> bool {
        self.get(pos).is_some()
    }

    /// Sets the entry at `pos`, returning the one it replaces.
    pub(crate) fn insert(&mut self, pos: u64, e: Entry) -> Option<Entry> {
        let (key, off) = split(pos);
        let c = self.chunks.entry(key).or_default();
        let slot = c.slot(off);
        if c.has(off) {
            return Some(std::mem::replace(&mut c.entries[slot], e));
        }
        c.entries.insert(slot, e);
        c.present |= 1 << off;
        self.len += 1;
        None
    }

    /// Takes the entry at `pos` out.
    pub(crate) fn remove(&mut self, pos: u64) -> Option<Entry> {
        let (key, off) = split(pos);
        let c = self.chunks.get_mut(&key)?;
        if !c.has(off) {
            return None;
        }
        let e = c.entries.remove(c.slot(off));
        c.present &= !(1 << off);
        self.len -= 1;
        if c.present == 0 {
            self.chunks.remove(&key);
        } else if c.entries.len() * 4 <= c.entries.capacity() {
            // A quarter used: half of it given back, so a chunk that
            // empties does not reallocate at every removal.
            c.entries.shrink_to(c.entries.len() * 2);
        }
        Some(e)
    }

    /// The lowest position held.
    pub(crate) fn first_pos(&self) -> Option<u64> {
        let (&key, c) = self.chunks.first_key_value()?;
        Some((key << SHIFT) | u64::from(c.present.trailing_zeros()))
    }

    /// `(position, entry)` of every entry, ascending.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Entry)> + '_ {
        self.range(..)
    }

    /// `(position, entry)` of the entries whose position is in `range`,
    /// ascending.
    pub(crate) fn range(
        &self,
        range: impl RangeBounds<u64>,
    ) -> impl Iterator<Item = (u64, &Entry)> + '_ {
        let lo = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let hi = match range.end_bound() {
            Bound::Included(&e) => Some(e),
            Bound::Excluded(&e) => e.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        let (lo, hi) = match (lo, hi) {
            (Some(lo), Some(hi)) if lo <= hi => (lo, hi),
            // Empty: a range of chunks that holds none.
            _ => (1, 0),
        };
        let chunks = if lo <= hi {
            Some(self.chunks.range(lo >> SHIFT..=hi >> SHIFT))
        } else {
            None
        };
        chunks
            .into_iter()
            .flatten()
            .flat_map(|(&key, c)| c.iter(key))
            .skip_while(move |&(p, _)| p < lo)
            .take_while(move |&(p, _)| p <= hi)
    }
}

impl FromIterator<(u64, Entry)> for EntryMap {
    /// Built chunk by chunk while the positions rise (the rebuild at
    /// start), each chunk's vector sized to its entries; entry by entry
    /// otherwise.
    fn from_iter<I: IntoIterator<Item = (u64, Entry)>>(iter: I) -> EntryMap {
        let mut iter = iter.into_iter();
        let mut built: Vec<(u64, Chunk)> = Vec::new();
        let mut len = 0;
        let mut last: Option<u64> = None;
        let mut rest = None;
        for (pos, e) in iter.by_ref() {
            if last.is_some_and(|l| pos <= l) {
                rest = Some((pos, e));
                break;
            }
            last = Some(pos);
            let (key, off) = split(pos);
            match built.last_mut() {
                Some((k, c)) if *k == key => {
                    c.present |= 1 << off;
                    c.entries.push(e);
                }
                prev => {
                    if let Some((_, c)) = prev {
                        c.entries.shrink_to_fit();
                    }
                    let mut entries = Vec::with_capacity(1 << SHIFT);
                    entries.push(e);
                    built.push((
                        key,
                        Chunk {
                            present: 1 << off,
                            entries,
                        },
                    ));
                }
            }
            len += 1;
        }
        if let Some((_, c)) = built.last_mut() {
            c.entries.shrink_to_fit();
        }
        let mut map = EntryMap {
            chunks: built.into_iter().collect(),
            len,
        };
        for (pos, e) in rest.into_iter().chain(iter) {
            map.insert(pos, e);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::state::EntryState;
    use proptest::prelude::*;

    fn entry(n: u64) -> Entry {
        let epoch = u32::try_from(n).expect("small test positions");
        Entry::new(EntryState::Ready, n, n * 3, epoch, 1, 0)
    }

    #[test]
    fn a_full_chunk_costs_little_more_than_its_entries() {
        let map: EntryMap = (0..6_400u64).map(|p| (p, entry(p))).collect();
        assert_eq!(map.len(), 6_400);
        assert_eq!(map.chunks.len(), 100);
        assert!(map.chunks.values().all(|c| c.entries.capacity() == 64));
        let mut one_by_one = EntryMap::new();
        for p in 0..6_400u64 {
            one_by_one.insert(p, entry(p));
        }
        assert!(
            one_by_one
                .chunks
                .values()
                .all(|c| c.entries.capacity() == 64)
        );
        assert_eq!(one_by_one, map);
    }

    #[test]
    fn a_thinned_chunk_gives_its_room_back_and_an_empty_one_goes() {
        let mut map: EntryMap = (0..64u64).map(|p| (p, entry(p))).collect();
        for p in 0..60u64 {
            assert_eq!(map.remove(p), Some(entry(p)));
        }
        assert!(map.chunks[&0].entries.capacity() <= 16);
        assert_eq!(map.first_pos(), Some(60));
        for p in 60..64u64 {
            map.remove(p);
        }
        assert!(map.chunks.is_empty() && map.is_empty());
        assert_eq!(map.first_pos(), None);
    }

    #[test]
    fn empty_and_extreme_ranges_hold_nothing_they_should_not() {
        let map: EntryMap = [0, 1, 63, 64, u64::MAX - 1, u64::MAX]
            .into_iter()
            .map(|p| (p, entry(p % 1000)))
            .collect();
        let keys = |r: Vec<(u64, &Entry)>| r.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
        assert_eq!(keys(map.range(..0).collect()), Vec::<u64>::new());
        assert_eq!(keys(map.range(5..5).collect()), Vec::<u64>::new());
        assert_eq!(
            keys(
                map.range((Bound::Excluded(u64::MAX), Bound::Unbounded))
                    .collect()
            ),
            Vec::<u64>::new()
        );
        assert_eq!(keys(map.range(1..=64).collect()), vec![1, 63, 64]);
        assert_eq!(
            keys(map.range(u64::MAX - 1..).collect()),
            vec![u64::MAX - 1, u64::MAX]
        );
        assert_eq!(map.iter().count(), 6);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        Range(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Positions over a few chunks, so chunks fill, thin and empty.
        prop_oneof![
            3 => (0u64..300, 0u64..1000).prop_map(|(p, n)| Op::Insert(p, n)),
            2 => (0u64..300).prop_map(Op::Remove),
            1 => (0u64..300, 0u64..300).prop_map(|(a, b)| Op::Range(a, b)),
        ]
    }

    proptest! {
        /// Whatever is inserted and removed, it answers as a B-tree map of
        /// positions does.
        #[test]
        fn it_answers_as_a_btree_map(
            initial in proptest::collection::btree_set(0u64..300, 0..200),
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            let mut model: BTreeMap<u64, Entry> =
                initial.iter().map(|&p| (p, entry(p))).collect();
            let mut map: EntryMap = model.iter().map(|(&p, &e)| (p, e)).collect();
            for op in ops {
                match op {
                    Op::Insert(p, n) => {
                        prop_assert_eq!(map.insert(p, entry(n)), model.insert(p, entry(n)));
                    }
                    Op::Remove(p) => prop_assert_eq!(map.remove(p), model.remove(&p)),
                    Op::Range(a, b) => {
                        let got: Vec<_> = map.range(a..b).map(|(p, e)| (p, *e)).collect();
                        let want: Vec<_> = if a <= b {
                            model.range(a..b).map(|(&p, &e)| (p, e)).collect()
                        } else {
                            Vec::new()
                        };
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(map.len(), model.len());
            }
            for p in 0..300u64 {
                prop_assert_eq!(map.get(p), model.get(&p));
                prop_assert_eq!(map.contains(p), model.contains_key(&p));
            }
            if let Some(e) = map.get_mut(7) {
                e.set_epoch(99);
                model.get_mut(&7).expect("both hold it").set_epoch(99);
            }
            let got: Vec<_> = map.iter().map(|(p, e)| (p, *e)).collect();
            let want: Vec<_> = model.iter().map(|(&p, &e)| (p, e)).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(map.first_pos(), model.keys().next().copied());
            // Out of order input builds the same map.
            let shuffled: EntryMap = model.iter().rev().map(|(&p, &e)| (p, e)).collect();
            prop_assert_eq!(shuffled.iter().map(|(p, e)| (p, *e)).collect::<Vec<_>>(),
                map.iter().map(|(p, e)| (p, *e)).collect::<Vec<_>>());
        }
    }
}
