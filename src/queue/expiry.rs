//! A queue's expiry order: its messages by (expiry time, position).
//!
//! Most queues give every message the same time to live, so a message
//! published later also expires later: the expiry order is the position
//! order. Such messages are kept as positions in a compressed bitmap (a
//! fraction of a byte each when positions are dense), their expiry times
//! read from the entry map when needed; only the messages that break the
//! order (a shorter per-message TTL, a clock set back) go into a B-tree of
//! (expiry, position) pairs (16 bytes each with B-tree overhead).
//!
//! Invariant: for positions `p < q` both in `rising`, the expiry of `p` is
//! at most that of `q`. A message joins `rising` only when its position is
//! above, and its expiry at least, those of the last one that joined, so
//! walking `rising` in position order walks it in expiry order.

use std::collections::BTreeSet;

use roaring::RoaringTreemap;

use super::entries::EntryMap;

/// (expires_at, pos) of every message of a queue.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ExpiryOrder {
    /// Positions whose expiry rises with them.
    rising: RoaringTreemap,
    /// Position and expiry of the last message that joined `rising`: at
    /// least those of every message still in it.
    last: (u64, u64),
    /// (expires_at, pos) of the others.
    rest: BTreeSet<(u64, u64)>,
}

impl ExpiryOrder {
    /// Whether a message keeps `rising` in expiry order: its position
    /// above, and its expiry at least, those of the last one that joined.
    fn rises(&self, expires_at: u64, pos: u64) -> bool {
        let (last_pos, last_at) = self.last;
        self.rising.is_empty() || (pos > last_pos && expires_at >= last_at)
    }

    /// Adds a message.
    pub(crate) fn insert(&mut self, expires_at: u64, pos: u64) {
        if self.rises(expires_at, pos) {
            self.rising.insert(pos);
            self.last = (pos, expires_at);
        } else {
            self.rest.insert((expires_at, pos));
        }
    }

    /// Removes a message added with the same expiry and position.
    pub(crate) fn remove(&mut self, expires_at: u64, pos: u64) {
        if !self.rising.remove(pos) {
            self.rest.remove(&(expires_at, pos));
        }
    }

    /// Whether a message is in the rising half.
    pub(crate) fn is_rising(&self, pos: u64) -> bool {
        self.rising.contains(pos)
    }

    /// The position and expiry of the last message that joined the rising
    /// half.
    pub(crate) fn last(&self) -> (u64, u64) {
        self.last
    }

    /// Sets what [`ExpiryOrder::last`] says (putting back the order of a
    /// failed operation, `undo.rs`).
    pub(crate) fn set_last(&mut self, last: (u64, u64)) {
        self.last = last;
    }

    /// Puts a message back in the half it was in (a failed operation's
    /// slot, `undo.rs`, with [`ExpiryOrder::set_last`] as it was).
    pub(crate) fn put_back(&mut self, expires_at: u64, pos: u64, rising: bool) {
        if rising {
            self.rising.insert(pos);
        } else {
            self.rest.insert((expires_at, pos));
        }
    }

    /// The order of the given messages, `(expires_at, pos)` in position
    /// order (the rebuild at start): the same as inserting them one by one,
    /// with the B-tree built in bulk.
    pub(crate) fn from_position_order(items: impl Iterator<Item = (u64, u64)>) -> ExpiryOrder {
        let mut order = ExpiryOrder::default();
        let mut rest = Vec::new();
        for (at, pos) in items {
            if order.rises(at, pos) {
                // Above every position in the bitmap: appended.
                if !order.rising.push(pos) {
                    order.rising.insert(pos);
                }
                order.last = (pos, at);
            } else {
                rest.push((at, pos));
            }
        }
        rest.sort_unstable();
        order.rest = rest.into_iter().collect();
        order
    }

    /// How many messages it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.rising.len() + self.rest.len() as u64
    }

    /// Whether it holds none.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.rising.is_empty() && self.rest.is_empty()
    }

    /// `(expires_at, pos)` in ascending order; the expiry of a message in
    /// `rising` is read from `msgs` (a position missing there sorts as
    /// expiring now, so the caller, which looks it up, skips it).
    pub(crate) fn iter<'a>(&'a self, msgs: &'a EntryMap) -> impl Iterator<Item = (u64, u64)> + 'a {
        let mut rising = self
            .rising
            .iter()
            .map(move |pos| (msgs.get(pos).map_or(0, |e| e.expires_at()), pos))
            .peekable();
        let mut rest = self.rest.iter().copied().peekable();
        std::iter::from_fn(move || match (rising.peek(), rest.peek()) {
            (Some(a), Some(b)) if b < a => rest.next(),
            (Some(_), _) => rising.next(),
            (None, _) => rest.next(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::state::{Entry, EntryState};
    use proptest::prelude::*;

    fn entry(expires_at: u64) -> Entry {
        Entry::new(EntryState::Ready, 0, expires_at, 0, 1, 0)
    }

    #[test]
    fn messages_expiring_in_position_order_take_no_pair_each() {
        let mut order = ExpiryOrder::default();
        for pos in 1..=10_000u64 {
            order.insert(1_000 + pos / 10, pos);
        }
        assert_eq!(order.len(), 10_000);
        assert!(order.rest.is_empty(), "all in the bitmap");
        // A shorter TTL breaks the order: that one goes to the B-tree.
        order.insert(5, 10_001);
        assert_eq!(order.rest.len(), 1);
    }

    proptest! {
        /// Whatever the expiry times, adding, removing and rebuilding give
        /// the order a B-tree of (expiry, position) pairs gives.
        #[test]
        fn it_orders_as_a_set_of_pairs(
            ats in proptest::collection::vec(0u64..50, 1..200),
            removals in proptest::collection::vec(any::<proptest::sample::Index>(), 0..100),
        ) {
            let mut msgs = EntryMap::new();
            let mut order = ExpiryOrder::default();
            let mut pairs = BTreeSet::new();
            for (i, &at) in ats.iter().enumerate() {
                let pos = i as u64 * 2 + 1;
                msgs.insert(pos, entry(at));
                order.insert(at, pos);
                pairs.insert((at, pos));
            }
            for ix in removals {
                let pos = ix.index(ats.len()) as u64 * 2 + 1;
                if let Some(e) = msgs.remove(pos) {
                    order.remove(e.expires_at(), pos);
                    pairs.remove(&(e.expires_at(), pos));
                }
                // Later messages join after removals too.
                let next = msgs.iter().last().map_or(1, |(p, _)| p + 2) + 1_000;
                let at = pos % 50;
                msgs.insert(next, entry(at));
                order.insert(at, next);
                pairs.insert((at, next));
            }
            let got: Vec<_> = order.iter(&msgs).collect();
            let want: Vec<_> = pairs.iter().copied().collect();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(order.len(), pairs.len() as u64);
            let rebuilt = ExpiryOrder::from_position_order(
                msgs.iter().map(|(p, e)| (e.expires_at(), p)),
            );
            prop_assert_eq!(rebuilt.iter(&msgs).collect::<Vec<_>>(), want);
        }
    }
}
