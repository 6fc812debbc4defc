//! Mutexes with a rank, and the check of the lock order. Each backend
//! writes its own order, and defines the ranks of its mutexes, where its
//! mutexes are described (the module docs of `local` and `pg`).
//!
//! A [`RankedMutex`] is a `std::sync::Mutex` with a [`Rank`]. In debug
//! builds each thread keeps the ranks of the ranked mutexes it holds, and
//! [`RankedMutex::lock`] panics when the rank it takes is not above every
//! rank held: a lock taken out of order is found by the first test that
//! takes it, not by the deadlock it might one day cause. In release builds
//! the wrapper is a plain mutex (the bookkeeping is compiled out).
//!
//! [`RankedMutex::try_lock`] cannot deadlock (it does not wait), so it is
//! not checked against the order; what it takes is still recorded as held,
//! and locks taken under it are checked against it.
//!
//! A guard keeps its rank on the thread's list while a [`RankedCondvar`]
//! waits on it: the wait releases and takes back the same mutex, and the
//! thread takes nothing else meanwhile.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// A place in the lock order: a lock may be taken while holding only
/// locks of lower rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank(pub(crate) u8);

#[cfg(debug_assertions)]
mod held {
    use std::cell::RefCell;

    use super::Rank;

    thread_local! {
        /// Ranks of the ranked mutexes this thread holds, in the order
        /// taken.
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }

    /// Panics if `rank` is not above every rank the thread holds.
    pub(super) fn check(rank: Rank, name: &str) {
        HELD.with(|h| {
            if let Some(&top) = h.borrow().iter().max()
                && top >= rank
            {
                panic!(
                    "lock order violated: {name} (rank {}) taken while holding rank {} (held: {:?})",
                    rank.0,
                    top.0,
                    h.borrow().iter().map(|r| r.0).collect::<Vec<_>>()
                );
            }
        });
    }

    pub(super) fn push(rank: Rank) {
        HELD.with(|h| h.borrow_mut().push(rank));
    }

    /// Guards may go in any order: the latest entry of the rank goes.
    pub(super) fn pop(rank: Rank) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(at) = h.iter().rposition(|&r| r == rank) {
                h.remove(at);
            }
        });
    }

    /// Ranks held by this thread (tests).
    #[cfg(test)]
    pub(super) fn ranks() -> Vec<Rank> {
        HELD.with(|h| h.borrow().clone())
    }
}

/// One rank on the thread's list, taken off when dropped (after the mutex
/// guard beside it: fields drop in order). Empty in release builds.
#[derive(Debug)]
struct Held {
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl Held {
    #[cfg_attr(not(debug_assertions), allow(unused_variables))]
    fn new(rank: Rank) -> Held {
        #[cfg(debug_assertions)]
        held::push(rank);
        Held {
            #[cfg(debug_assertions)]
            rank,
        }
    }
}

#[cfg(debug_assertions)]
impl Drop for Held {
    fn drop(&mut self) {
        held::pop(self.rank);
    }
}

/// A mutex with a place in the lock order.
#[derive(Debug)]
pub(crate) struct RankedMutex<T> {
    mutex: Mutex<T>,
    rank: Rank,
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    name: &'static str,
}

/// The guard of a [`RankedMutex`].
#[derive(Debug)]
pub(crate) struct RankedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    _held: Held,
}

impl<T> RankedMutex<T> {
    /// A mutex of rank `rank`; `name` is for the panic of a violation.
    pub(crate) const fn new(rank: Rank, name: &'static str, value: T) -> RankedMutex<T> {
        RankedMutex {
            mutex: Mutex::new(value),
            rank,
            name,
        }
    }

    /// Takes the mutex (a poisoned one too: a thread panicked while
    /// holding it, and the data it guards is still consistent, every
    /// section being a few assignments). In debug builds, panics if the
    /// thread holds a lock of the same or a higher rank.
    pub(crate) fn lock(&self) -> RankedGuard<'_, T> {
        #[cfg(debug_assertions)]
        held::check(self.rank, self.name);
        let guard = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        RankedGuard {
            guard,
            _held: Held::new(self.rank),
        }
    }

    /// The mutex's guard if it is free (a poisoned one too), whatever the
    /// thread holds: a try cannot deadlock. Recorded as held.
    pub(crate) fn try_lock(&self) -> Option<RankedGuard<'_, T>> {
        let guard = match self.mutex.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(RankedGuard {
            guard,
            _held: Held::new(self.rank),
        })
    }
}

impl<T: Default> RankedMutex<T> {
    /// A mutex of rank `rank` holding `T::default()`.
    pub(crate) fn default_with(rank: Rank, name: &'static str) -> RankedMutex<T> {
        RankedMutex::new(rank, name, T::default())
    }
}

impl<T> Deref for RankedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for RankedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A condition variable used with one [`RankedMutex`]. A wait releases
/// the mutex and takes it back before it returns; the rank stays on the
/// thread's list throughout (the thread takes nothing else meanwhile).
#[derive(Debug, Default)]
pub(crate) struct RankedCondvar(Condvar);

impl RankedCondvar {
    pub(crate) const fn new() -> RankedCondvar {
        RankedCondvar(Condvar::new())
    }

    /// Waits for a notification (or a spurious wake-up).
    pub(crate) fn wait<'a, T>(&self, g: RankedGuard<'a, T>) -> RankedGuard<'a, T> {
        let RankedGuard { guard, _held } = g;
        let guard = self.0.wait(guard).unwrap_or_else(|e| e.into_inner());
        RankedGuard { guard, _held }
    }

    /// Waits for a notification or `timeout`.
    pub(crate) fn wait_timeout<'a, T>(
        &self,
        g: RankedGuard<'a, T>,
        timeout: Duration,
    ) -> RankedGuard<'a, T> {
        let RankedGuard { guard, _held } = g;
        let guard = self
            .0
            .wait_timeout(guard, timeout)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
        RankedGuard { guard, _held }
    }

    /// Waits while `condition` holds, at most `timeout`.
    pub(crate) fn wait_timeout_while<'a, T>(
        &self,
        g: RankedGuard<'a, T>,
        timeout: Duration,
        condition: impl FnMut(&mut T) -> bool,
    ) -> RankedGuard<'a, T> {
        let RankedGuard { guard, _held } = g;
        let guard = self
            .0
            .wait_timeout_while(guard, timeout, condition)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
        RankedGuard { guard, _held }
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn pair() -> (RankedMutex<u32>, RankedMutex<u32>) {
        (
            RankedMutex::new(Rank(1), "low", 0),
            RankedMutex::new(Rank(2), "high", 0),
        )
    }

    #[test]
    fn locks_in_rank_order_are_allowed() {
        let (low, high) = pair();
        let a = low.lock();
        let b = high.lock();
        assert_eq!(*a + *b, 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order violated: low (rank 1) taken while holding rank 2")]
    fn a_lock_out_of_order_panics() {
        let (low, high) = pair();
        let _b = high.lock();
        let _a = low.lock();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order violated")]
    fn the_same_rank_twice_panics() {
        let a = RankedMutex::new(Rank(5), "a", 0);
        let b = RankedMutex::new(Rank(5), "b", 0);
        let _a = a.lock();
        let _b = b.lock();
    }

    #[test]
    fn a_try_lock_out_of_order_is_allowed_and_counts_as_held() {
        let (low, high) = pair();
        let b = high.lock();
        let a = low.try_lock().expect("free");
        drop(b);
        #[cfg(debug_assertions)]
        assert_eq!(held::ranks(), vec![Rank(1)]);
        // Taken under the try-locked one: checked against it.
        let again = high.lock();
        drop(again);
        drop(a);
        #[cfg(debug_assertions)]
        assert!(held::ranks().is_empty());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order violated")]
    fn a_lock_under_a_try_locked_higher_rank_panics() {
        let (low, high) = pair();
        let _b = high.try_lock().expect("free");
        let _a = low.lock();
    }

    #[test]
    fn guards_dropped_out_of_order_leave_the_right_ranks() {
        let (low, high) = pair();
        let a = low.lock();
        let b = high.lock();
        drop(a);
        #[cfg(debug_assertions)]
        assert_eq!(held::ranks(), vec![Rank(2)]);
        drop(b);
        #[cfg(debug_assertions)]
        assert!(held::ranks().is_empty());
        let _a = low.lock();
    }

    #[test]
    fn a_condvar_wait_keeps_the_rank_and_the_lock() {
        let m = Arc::new(RankedMutex::new(Rank(3), "m", false));
        let cv = Arc::new(RankedCondvar::new());
        let (m2, cv2) = (Arc::clone(&m), Arc::clone(&cv));
        let t = std::thread::spawn(move || {
            *m2.lock() = true;
            cv2.notify_all();
        });
        let mut g = m.lock();
        while !*g {
            g = cv.wait_timeout(g, Duration::from_millis(50));
            #[cfg(debug_assertions)]
            assert_eq!(held::ranks(), vec![Rank(3)]);
        }
        drop(g);
        t.join().expect("thread");
        #[cfg(debug_assertions)]
        assert!(held::ranks().is_empty());
        let g = cv.wait_timeout_while(m.lock(), Duration::from_millis(1), |v| !*v);
        assert!(*g);
    }

    #[test]
    fn a_poisoned_mutex_is_still_taken() {
        let m = Arc::new(RankedMutex::new(Rank(4), "m", 7));
        let m2 = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("poison it");
        })
        .join();
        assert_eq!(*m.lock(), 7);
        assert_eq!(*m.try_lock().expect("free"), 7);
    }
}
