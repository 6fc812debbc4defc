//! The sweeper: lease expiry, delayed visibility, TTL expiry and dedup
//! reclamation, driven by the clock.
//!
//! [`Broker::run_timers`] does everything due at the clock's current time;
//! [`Broker::sweep`] runs it in a loop. Tests with a manual clock call
//! `run_timers` directly after moving the clock.

use std::sync::Arc;
use std::time::Duration;

use crate::storage::Key;

use super::error::Result;
use super::model::AttemptOutcome;
use super::state::EntryState;
use super::{Broker, Change, State, durable};

/// Most due items handled per transaction.
const BATCH: usize = 4096;

impl Broker {
    /// Handles every lease deadline, delay and expiry that is due now.
    /// Returns how many items were handled.
    pub async fn run_timers(&self) -> Result<usize> {
        let mut handled = 0usize;
        loop {
            let (n, commit) = {
                let mut st = self.lock();
                let now = self.now();
                self.decide(&mut st, |st, change| {
                    Ok(self.due_timers(st, now, change)? + self.due_expiries(st, now, change)?)
                })?
            };
            durable(commit).await?;
            handled += n;
            if n < BATCH {
                return Ok(handled);
            }
        }
    }

    pub(super) fn due_timers(
        &self,
        st: &mut State,
        now: u64,
        change: &mut Change,
    ) -> Result<usize> {
        let mut n = 0;
        while n < BATCH {
            let Some(&(due, qid, pos)) = st.timers.first() else {
                break;
            };
            if due > now {
                break;
            }
            n += 1;
            let state = st
                .queues
                .get(&qid)
                .and_then(|q| q.msgs.get(pos))
                .map(|e| e.state());
            match state {
                Some(EntryState::Leased) => {
                    self.end_lease(
                        st,
                        qid,
                        pos,
                        now,
                        AttemptOutcome::LeaseExpired,
                        "",
                        None,
                        change,
                    )?;
                }
                Some(EntryState::Delayed) => {
                    let State {
                        queues,
                        timers,
                        undo,
                        ..
                    } = &mut *st;
                    if let Some(q) = queues.get_mut(&qid) {
                        q.make_visible(pos, timers, undo);
                    }
                    change.wake(qid);
                }
                // A stale timer (cannot happen: transitions remove theirs).
                _ => {
                    st.timers.remove(&(due, qid, pos));
                    st.undo.timer((due, qid, pos));
                }
            }
        }
        Ok(n)
    }

    fn due_expiries(&self, st: &mut State, now: u64, change: &mut Change) -> Result<usize> {
        let mut due = Vec::new();
        let mut dedup = Vec::new();
        for (&qid, q) in &st.queues {
            // Leased messages expire when their lease ends, not here.
            for (at, pos) in q.expiry.iter(&q.msgs) {
                if at > now || due.len() >= BATCH {
                    break;
                }
                if q.msgs
                    .get(pos)
                    .is_some_and(|e| e.state() != EntryState::Leased)
                {
                    due.push((qid, pos));
                }
            }
            if let Some(f) = &q.fifo {
                for (at, key) in &f.dedup_expiry {
                    if *at > now || dedup.len() >= BATCH {
                        break;
                    }
                    dedup.push((qid, *at, key.clone()));
                }
            }
        }
        let n = due.len() + dedup.len();
        for (qid, pos) in due {
            self.expire(st, qid, pos, now, change)?;
        }
        for (qid, at, key) in dedup {
            let State { queues, undo, .. } = &mut *st;
            if let Some(q) = queues.get_mut(&qid)
                && q.forget_dedup(at, &key, undo)
            {
                change.txn.delete(Key::Dedup(qid, &key));
            }
        }
        Ok(n)
    }

    /// Runs the sweeper until `stop` resolves.
    pub async fn sweep(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        let interval = self.opts.sweep_interval;
        tokio::pin!(stop);
        loop {
            if let Err(e) = self.run_timers().await {
                tracing::error!(error = %e, "sweeper failed");
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(interval.max(Duration::from_millis(1))) => {}
            }
        }
    }
}
