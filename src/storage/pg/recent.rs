//! Recently committed message bodies and message records, kept in memory
//! ([`Recent`]), so that a delivery close behind its publish, and the
//! lease or ack that changes a record, read them without a round trip.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// Recently committed message bodies and records: what PostgreSQL holds
/// for their keys, kept while they fit in the budget, the oldest evicted
/// first. A key leaves as soon as a transaction changes it (the overlay
/// then answers for it).
#[derive(Default)]
pub(super) struct Recent {
    /// Each body with the number of the `keep` that put it here.
    values: HashMap<Bytes, (Bytes, u64)>,
    /// Keys by insertion, oldest first, with the number of their `keep`
    /// (an entry whose key was forgotten or kept again since is stale).
    order: VecDeque<(Bytes, u64)>,
    bytes: usize,
    budget: usize,
    kept: u64,
}

impl Recent {
    /// An empty set of at most `budget` bytes of keys and values.
    pub(super) fn new(budget: usize) -> Recent {
        Recent {
            budget,
            ..Recent::default()
        }
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<&Bytes> {
        self.values.get(key).map(|(v, _)| v)
    }

    pub(super) fn forget(&mut self, key: &[u8]) {
        if let Some((v, _)) = self.values.remove(key) {
            self.bytes -= key.len() + v.len();
        }
    }

    pub(super) fn keep(&mut self, key: Bytes, value: Bytes) {
        let size = key.len() + value.len();
        if size > self.budget {
            return;
        }
        self.forget(&key);
        self.kept += 1;
        self.bytes += size;
        self.order.push_back((key.clone(), self.kept));
        self.values.insert(key, (value, self.kept));
        while self.bytes > self.budget {
            let Some((old, n)) = self.order.pop_front() else {
                break;
            };
            if self.is_current(&old, n) {
                self.forget(&old);
            }
        }
        // Stale entries (keys forgotten or kept again since) are dropped
        // when they outnumber the live ones, never by evicting live values
        // for them: the stale entries of values acknowledged lately sit
        // behind older live ones.
        if self.order.len() > 2 * self.values.len() + 16 {
            let values = &self.values;
            self.order
                .retain(|(k, n)| values.get(k).is_some_and(|(_, m)| m == n));
        }
    }

    /// Whether the entry `(key, n)` of `order` is the key's current one.
    fn is_current(&self, key: &[u8], n: u64) -> bool {
        self.values.get(key).is_some_and(|(_, m)| *m == n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::keys::{TAG_META, TAG_PAYLOAD};

    #[test]
    fn recent_bodies_stay_within_their_budget_oldest_out_first() {
        let k = |i: u8| Bytes::from(vec![TAG_PAYLOAD, i]);
        let v = |n: usize| Bytes::from(vec![0u8; n]);
        let mut r = Recent {
            budget: 30,
            ..Recent::default()
        };
        r.keep(k(1), v(8));
        r.keep(k(2), v(8));
        r.keep(k(3), v(8));
        assert_eq!(r.bytes, 30);
        // A fourth pushes the oldest out.
        r.keep(k(4), v(8));
        assert!(!r.values.contains_key(&k(1)));
        assert_eq!(r.bytes, 30);
        // Forgotten (changed): its bytes are given back; kept again, it is
        // the newest.
        r.forget(&k(2));
        assert_eq!(r.bytes, 20);
        r.keep(k(2), v(8));
        r.keep(k(5), v(8));
        assert!(!r.values.contains_key(&k(3)));
        assert!(r.values.contains_key(&k(2)));
        // Larger than the whole budget: not kept, nothing evicted for it.
        r.keep(k(6), v(40));
        assert!(!r.values.contains_key(&k(6)));
        assert_eq!(r.bytes, 30);
        assert_eq!(r.values.len(), 3);
    }

    #[test]
    fn forgotten_values_do_not_push_live_ones_out() {
        // As a consumer acknowledges behind a publisher: values kept in
        // order, each one kept again (its lease), then forgotten (its ack).
        let k = |i: u32| Bytes::from([&[TAG_META][..], &i.to_be_bytes()].concat());
        let mut r = Recent {
            budget: 1 << 20,
            ..Recent::default()
        };
        for i in 0..1000 {
            r.keep(k(i), Bytes::from_static(b"record"));
        }
        for i in 0..900 {
            r.keep(k(i), Bytes::from_static(b"leased"));
            r.forget(&k(i));
        }
        // Within the budget, every value not forgotten is still there.
        for i in 900..1000 {
            assert!(r.values.contains_key(&k(i)), "value {i} evicted");
        }
        assert_eq!(r.values.len(), 100);
        // And the order's stale entries stay bounded.
        assert!(
            r.order.len() <= 2 * r.values.len() + 18,
            "{}",
            r.order.len()
        );
    }
}
