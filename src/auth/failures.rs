//! Failed credential checks counted per key (an address for the console's
//! logins; an address and a client id for client secrets): a key whose
//! last `max` failures all fell within `window` is refused without a check
//! until the oldest of them is that old. A success forgets the key's
//! failures. The keys remembered are bounded: past the bound, those with no
//! failure within the window go first, then the longest quiet.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

/// Recent failures by key, times in milliseconds of the caller's clock.
#[derive(Debug)]
pub(crate) struct Failures<K> {
    max: usize,
    window: u64,
    tracked: usize,
    failed: Mutex<HashMap<K, VecDeque<u64>>>,
}

impl<K: Eq + Hash + Clone> Failures<K> {
    /// `max` failures within `window` ms close a key; at most `tracked`
    /// keys are remembered.
    pub(crate) fn new(max: usize, window: u64, tracked: usize) -> Self {
        Failures {
            max,
            window,
            tracked,
            failed: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, VecDeque<u64>>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long (ms) `key` must wait before its next check, or `None` when
    /// it may be checked now.
    pub(crate) fn wait(&self, key: &K, now: u64) -> Option<u64> {
        let mut failed = self.lock();
        let times = failed.get_mut(key)?;
        times.retain(|t| now < t.saturating_add(self.window));
        if times.is_empty() {
            failed.remove(key);
            return None;
        }
        (times.len() >= self.max).then(|| times[0].saturating_add(self.window) - now)
    }

    /// Counts a failure of `key`.
    pub(crate) fn failed(&self, key: K, now: u64) {
        let mut failed = self.lock();
        if !failed.contains_key(&key) && failed.len() >= self.tracked {
            failed.retain(|_, ts| {
                ts.back()
                    .is_some_and(|t| now < t.saturating_add(self.window))
            });
            if failed.len() >= self.tracked
                && let Some(quiet) = failed
                    .iter()
                    .min_by_key(|(_, ts)| ts.back().copied())
                    .map(|(k, _)| k.clone())
            {
                failed.remove(&quiet);
            }
        }
        let times = failed.entry(key).or_default();
        times.push_back(now);
        while times.len() > self.max {
            times.pop_front();
        }
    }

    /// Forgets `key`'s failures (it passed a check).
    pub(crate) fn succeeded(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Whether `key` has failures remembered.
    #[cfg(test)]
    pub(crate) fn remembers(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }

    /// How many keys are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}
