//! Who consumes each queue, for the metrics: the Subscribe streams open
//! now, and the peers whose Receive calls succeeded lately.
//!
//! A Receive costs one short lock and one hash map update (no allocation
//! once its peer is known); entries older than [`RECENT`] are dropped at
//! each scrape, and when a queue's map has doubled since it was last
//! pruned, so that the map stays bounded without scrapes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a peer counts as a consumer after its last Receive.
pub(crate) const RECENT: Duration = Duration::from_secs(60);

/// Fewest entries of a queue's map before it is pruned on insertion.
const PRUNE_FLOOR: usize = 256;

/// The consumers of every queue.
#[derive(Debug, Default)]
pub(crate) struct Consumers {
    subscribed: Mutex<HashMap<String, usize>>,
    receivers: Mutex<HashMap<String, Receivers>>,
}

/// The recent receivers of one queue.
#[derive(Debug)]
struct Receivers {
    last: HashMap<SocketAddr, Instant>,
    /// Prune on insertion once the map holds this many.
    prune_at: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Consumers {
    /// A Subscribe stream opened on `queue`; it counts until the guard is
    /// dropped.
    pub(crate) fn subscribed(self: &Arc<Self>, queue: &str) -> Subscribed {
        *lock(&self.subscribed).entry(queue.to_string()).or_default() += 1;
        Subscribed {
            consumers: Arc::clone(self),
            queue: queue.to_string(),
        }
    }

    /// `peer` received from `queue` at `now`.
    pub(crate) fn received(&self, queue: &str, peer: SocketAddr, now: Instant) {
        let mut all = lock(&self.receivers);
        if !all.contains_key(queue) {
            all.insert(
                queue.to_string(),
                Receivers {
                    last: HashMap::new(),
                    prune_at: PRUNE_FLOOR,
                },
            );
        }
        let Some(r) = all.get_mut(queue) else { return };
        r.last.insert(peer, now);
        if r.last.len() >= r.prune_at {
            r.last.retain(|_, at| now.duration_since(*at) < RECENT);
            r.prune_at = (2 * r.last.len()).max(PRUNE_FLOOR);
        }
    }

    /// Subscribe streams open and recent receivers, by queue; drops the
    /// receivers older than [`RECENT`].
    pub(crate) fn counts(&self, now: Instant) -> (HashMap<String, usize>, HashMap<String, usize>) {
        let subscribed = lock(&self.subscribed).clone();
        let mut all = lock(&self.receivers);
        all.retain(|_, r| {
            r.last
                .retain(|_, at| now.saturating_duration_since(*at) < RECENT);
            r.prune_at = (2 * r.last.len()).max(PRUNE_FLOOR);
            !r.last.is_empty()
        });
        let receiving = all.iter().map(|(q, r)| (q.clone(), r.last.len())).collect();
        (subscribed, receiving)
    }
}

/// One Subscribe stream open on a queue.
#[derive(Debug)]
pub(crate) struct Subscribed {
    consumers: Arc<Consumers>,
    queue: String,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        let mut s = lock(&self.consumers.subscribed);
        if let Some(n) = s.get_mut(&self.queue) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.remove(&self.queue);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn subscriptions_count_while_open() {
        let c = Arc::new(Consumers::default());
        let a = c.subscribed("jobs");
        let b = c.subscribed("jobs");
        assert_eq!(c.counts(Instant::now()).0.get("jobs"), Some(&2));
        drop(a);
        assert_eq!(c.counts(Instant::now()).0.get("jobs"), Some(&1));
        drop(b);
        assert_eq!(c.counts(Instant::now()).0.get("jobs"), None);
    }

    #[test]
    fn receivers_are_distinct_peers_of_the_last_minute() {
        let c = Consumers::default();
        let t0 = Instant::now();
        c.received("jobs", peer(1), t0);
        c.received("jobs", peer(1), t0);
        c.received("jobs", peer(2), t0);
        c.received("mail", peer(1), t0);
        let (_, r) = c.counts(t0);
        assert_eq!(r.get("jobs"), Some(&2));
        assert_eq!(r.get("mail"), Some(&1));
        c.received("jobs", peer(3), t0 + Duration::from_secs(30));
        let (_, r) = c.counts(t0 + RECENT + Duration::from_secs(1));
        assert_eq!(r.get("jobs"), Some(&1), "only the peer seen 30 s later");
        assert_eq!(r.get("mail"), None);
    }

    #[test]
    fn a_busy_queue_is_pruned_without_scrapes() {
        let c = Consumers::default();
        let t0 = Instant::now();
        for port in 0..200 {
            c.received("jobs", peer(port), t0);
        }
        let later = t0 + RECENT + Duration::from_secs(1);
        for port in 1000..1256 {
            c.received("jobs", peer(port), later);
        }
        let len = lock(&c.receivers).get("jobs").map(|r| r.last.len());
        assert!(len.is_some_and(|n| n <= PRUNE_FLOOR), "{len:?}");
    }
}
