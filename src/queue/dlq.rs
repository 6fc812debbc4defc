//! The end of a lease without an ack, dead-letter moves and expiry.
//!
//! A move to the dead letter queue is one transaction: the message's
//! record leaves the source queue and a new record (with the dead-letter
//! history appended) enters the DLQ, sharing the same payload. At every
//! instant the message is in exactly one queue, before and after a crash.

use crate::faults::{self, Fault};
use crate::storage::Key;
use crate::storage::records::GroupRecord;

use super::delivery::forget_client_id;
use super::error::{QueueError, Result};
use super::message::Message;
use super::model::{
    AttemptOutcome, DeadLetterReason, LeaseEnd, PoisonPolicy, QueueCounters, Released,
};
use super::state::{Entry, EntryState};
use super::token::AckToken;
use super::{Broker, Change, State, persist};

impl Broker {
    /// Ends a lease that was not acked (nack, reject, lease expiry, stream
    /// close): records the attempt, then dead-letters, expires, parks or
    /// makes the message ready again (after its delay); says which.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn end_lease(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        now: u64,
        outcome: AttemptOutcome,
        reason: &str,
        delay: Option<u64>,
        change: &mut Change,
    ) -> Result<LeaseEnd> {
        let mut meta = self.meta(qid, pos)?;
        meta.fail(now, outcome, reason)?;
        // Negative control: the followers left leased.
        if !faults::on(Fault::NoFifoRelease) {
            self.release_followers(st, qid, pos, &meta, now, change)?;
        }
        let State { queues, undo, .. } = &mut *st;
        let q = queues
            .get_mut(&qid)
            .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
        q.counters_mut(undo).nacked += 1;
        change.touch(qid);
        let config = q.config.clone();
        let moved = |reason, failed_attempts| LeaseEnd::DeadLettered {
            queue: config
                .dead_letter
                .as_ref()
                .map(|d| d.queue.clone())
                .unwrap_or_default(),
            reason,
            failed_attempts,
        };
        if outcome == AttemptOutcome::Rejected {
            let end = moved(DeadLetterReason::Rejected, meta.failed_attempts());
            self.dead_letter(
                st,
                qid,
                pos,
                meta,
                DeadLetterReason::Rejected,
                "",
                now,
                change,
            )?;
            return Ok(end);
        }
        if meta.expires_at() <= now {
            let end = if config.dead_letter_on_expiry && config.dead_letter.is_some() {
                moved(DeadLetterReason::Expired, meta.failed_attempts())
            } else {
                LeaseEnd::Expired
            };
            self.expire_with(st, qid, pos, meta, now, change)?;
            return Ok(end);
        }
        if let Some(dl) = &config.dead_letter
            && meta.failed_attempts() >= dl.max_deliveries
        {
            if config.on_poison == PoisonPolicy::ParkGroup && config.kind.is_fifo() {
                self.park(st, qid, pos, meta, now, change)?;
                return Ok(LeaseEnd::Parked);
            }
            let end = moved(DeadLetterReason::MaxDeliveries, meta.failed_attempts());
            self.dead_letter(
                st,
                qid,
                pos,
                meta,
                DeadLetterReason::MaxDeliveries,
                "",
                now,
                change,
            )?;
            return Ok(end);
        }
        let backoff = config
            .retry_backoff
            .map(|b| b.delay(meta.failed_attempts()))
            .unwrap_or(0);
        meta.visible_from(now + delay.unwrap_or(backoff))?;
        persist::put(&mut change.txn, qid, pos, &meta);
        let State {
            queues,
            timers,
            undo,
            ..
        } = st;
        if let Some(q) = queues.get_mut(&qid) {
            q.release(pos, meta.visible_at(), now, timers, undo);
        }
        change.wake(qid);
        Ok(LeaseEnd::Requeued)
    }

    /// FIFO (SPEC §3): the lease of `failed` (at `pos`) ends without an
    /// ack, so every later message of its group still leased is released
    /// with it, in the same transaction: its lease ends (the token is
    /// fenced), its delivery stays counted but is no failed attempt, the
    /// attempt history records the release naming `failed`, and it is
    /// ready again behind `failed`, where the group
    /// restarts. Without this a consumer could ack a later message while
    /// the earlier one waits for its redelivery, and order within the
    /// group would be lost. Only the group's leased messages are visited.
    fn release_followers(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        failed: &Message,
        now: u64,
        change: &mut Change,
    ) -> Result<()> {
        let q = st.queue(qid)?;
        let Some(f) = &q.fifo else { return Ok(()) };
        let Some(gidx) = q.msgs.get(pos).map(|e| e.group()) else {
            return Ok(());
        };
        let Some(g) = f.groups.get(&gidx) else {
            return Ok(());
        };
        // `pos` itself is still leased and counted in `g.leased`.
        let mut left = g.leased.saturating_sub(1);
        let mut later = Vec::new();
        for &p in g.msgs.range(pos + 1..) {
            if left == 0 {
                break;
            }
            if let Some(e) = q.msgs.get(p)
                && e.state() == EntryState::Leased
            {
                later.push((p, e.epoch()));
                left -= 1;
            }
        }
        if later.is_empty() {
            return Ok(());
        }
        let group = failed.group().unwrap_or("");
        let why = format!(
            "released: the earlier message {} of group {group:?} failed first",
            failed.id()
        );
        // Every release is decided before anything changes.
        let mut released = Vec::with_capacity(later.len());
        for (p, epoch) in later {
            let mut meta = self.meta(qid, p)?;
            meta.release(now, &why)?;
            released.push((p, epoch, meta));
        }
        for (p, epoch, meta) in released {
            persist::put(&mut change.txn, qid, p, &meta);
            change.released.push(Released {
                ack_token: AckToken { qid, pos: p, epoch }.to_string(),
                message_id: meta.id().to_string(),
                because_of: failed.id().to_string(),
            });
            let State {
                queues,
                timers,
                undo,
                ..
            } = &mut *st;
            if let Some(q) = queues.get_mut(&qid) {
                q.release(p, now, now, timers, undo);
            }
        }
        change.wake(qid);
        Ok(())
    }

    /// Moves a message to its queue's dead letter queue, atomically.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dead_letter(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        mut meta: Message,
        reason: DeadLetterReason,
        note: &str,
        now: u64,
        change: &mut Change,
    ) -> Result<()> {
        let q = st.queue(qid)?;
        let source = q.name.clone();
        let dl = q.config.dead_letter.clone().ok_or_else(|| {
            QueueError::FailedPrecondition(format!("queue {source:?} has no dead letter queue"))
        })?;
        let dlq_qid = st.qid(&dl.queue).map_err(|_| {
            QueueError::FailedPrecondition(format!(
                "dead letter queue {:?} of queue {source:?} does not exist",
                dl.queue
            ))
        })?;
        meta.dead_letter(source, reason, note, now);
        // A new life in the DLQ, visible at once.
        let moves = Moving {
            from: qid,
            pos,
            to: dlq_qid,
            delay: Some(0),
            out: |c| &mut c.dead_lettered,
            into: |c| &mut c.dead_letters_received,
        };
        let Some((new_pos, meta)) = move_message(st, &moves, meta, now, change)? else {
            return Ok(());
        };
        if faults::on(Fault::DlqTwoSteps) {
            // Negative control: a copy first (record and body, the body
            // under the new position's payload number, so that the copy is
            // deliverable however the original ends), durable, then the
            // removal in a later transaction. Memory keeps the shared body:
            // without a crash the copy's body is only left over.
            let mut copy = crate::storage::Txn::new();
            if let Some(body) = self.store.get_payload(meta.pid())? {
                copy.put_payload(new_pos, crate::storage::encode_payload(&body));
            }
            persist::put_new(&mut copy, dlq_qid, new_pos, &meta.clone().with_pid(new_pos));
            self.store.submit(copy).wait_blocking();
            std::thread::sleep(std::time::Duration::from_millis(100));
            change.txn.delete(Key::Meta(qid, pos));
        } else {
            change.txn.delete(Key::Meta(qid, pos));
            persist::put_new(&mut change.txn, dlq_qid, new_pos, &meta);
        }
        change.wake(qid);
        change.wake(dlq_qid);
        Ok(())
    }

    /// Expires a message whose time to live ran out. Its record is read
    /// as `change` leaves it: the same sweep may have just released it
    /// (SPEC §3), ending its lease.
    pub(crate) fn expire(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        now: u64,
        change: &mut Change,
    ) -> Result<()> {
        let Some(meta) = self.meta_in(change, qid, pos)? else {
            return Ok(());
        };
        self.expire_with(st, qid, pos, meta, now, change)
    }

    /// Expires a message: to the DLQ with `dead_letter_on_expiry`, else
    /// deleted.
    pub(crate) fn expire_with(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        meta: Message,
        now: u64,
        change: &mut Change,
    ) -> Result<()> {
        let State { queues, undo, .. } = &mut *st;
        let q = queues
            .get_mut(&qid)
            .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
        q.counters_mut(undo).expired += 1;
        change.touch(qid);
        if q.config.dead_letter_on_expiry && q.config.dead_letter.is_some() {
            return self.dead_letter(
                st,
                qid,
                pos,
                meta,
                DeadLetterReason::Expired,
                "",
                now,
                change,
            );
        }
        let State {
            queues,
            timers,
            undo,
            ..
        } = st;
        if let Some(q) = queues.get_mut(&qid)
            && let Some((_, pid)) = q.remove(pos, timers, undo)
        {
            forget_client_id(q, &meta, undo);
            change.txn.delete(Key::Meta(qid, pos));
            change.txn.delete(Key::Payload(pid));
        }
        change.wake(qid);
        Ok(())
    }

    /// Parks a FIFO group whose head exhausted its deliveries: the head
    /// stays, visible, and the group holds until an operator acts.
    fn park(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        mut meta: Message,
        now: u64,
        change: &mut Change,
    ) -> Result<()> {
        let State {
            queues,
            timers,
            undo,
            ..
        } = st;
        let q = queues
            .get_mut(&qid)
            .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
        meta.visible_from(now)?;
        persist::put(&mut change.txn, qid, pos, &meta);
        let Some(gidx) = q.msgs.get(pos).map(|e| e.group()) else {
            return Ok(());
        };
        let reason = format!(
            "head message {} failed {} (on_poison = PARK_GROUP)",
            meta.id(),
            crate::units::count_of(u64::from(meta.failed_attempts()), "attempt", "attempts")
        );
        let group = meta.group().unwrap_or_default().to_string();
        change.txn.put_group(
            qid,
            &group,
            &GroupRecord {
                parked_at: now,
                reason: reason.clone(),
            },
        );
        // Parked first, so that releasing the lease does not make the
        // group ready.
        q.set_parked(gidx, Some((now, reason)), undo);
        q.release(pos, now, now, timers, undo);
        tracing::warn!(queue = %q.name, group = %group, message_id = %meta.id(), "FIFO group parked");
        Ok(())
    }
}

/// A move of one message between queues: the one primitive of a move to
/// a dead letter queue (a FIFO head skipped included) and of a redrive.
pub(crate) struct Moving {
    /// The queue it leaves.
    pub from: u32,
    /// Its position there.
    pub pos: u64,
    /// The queue it enters.
    pub to: u32,
    /// When it is visible there, after now: `None`, the target queue's
    /// delivery delay.
    pub delay: Option<u64>,
    /// The counter of `from` the move adds one to.
    pub out: fn(&mut QueueCounters) -> &mut u64,
    /// The counter of `to` the move adds one to.
    pub into: fn(&mut QueueCounters) -> &mut u64,
}

/// Moves a message (its record `meta`, dead-letter history already
/// appended) from one queue to another in memory: it leaves `from` and
/// starts a new life at a new position of `to`, sharing its payload: no
/// deliveries, no lease, no attempts, its time to live and delay counted
/// from now, its client id moved, its group kept only into a FIFO queue.
/// Counts the move and touches both queues. Returns the new position and
/// the record to store there, for the caller to write with the removal
/// of the old one; `None` (and nothing changed but a position spent) when
/// it is no longer in `from`.
pub(crate) fn move_message(
    st: &mut State,
    m: &Moving,
    mut meta: Message,
    now: u64,
    change: &mut Change,
) -> Result<Option<(u64, Message)>> {
    let new_pos = st.alloc_pos(&mut change.txn);
    let State {
        queues,
        timers,
        undo,
        ..
    } = st;
    let q = queues
        .get_mut(&m.from)
        .ok_or_else(|| QueueError::Unavailable(format!("queue number {} vanished", m.from)))?;
    let Some((old, pid)) = q.remove(m.pos, timers, undo) else {
        return Ok(None);
    };
    forget_client_id(q, &meta, undo);
    *(m.out)(q.counters_mut(undo)) += 1;
    let t = queues
        .get_mut(&m.to)
        .ok_or_else(|| QueueError::Unavailable(format!("queue number {} vanished", m.to)))?;
    meta.enter_queue(
        now,
        t.config.message_ttl,
        m.delay.unwrap_or(t.config.delivery_delay),
        t.config.kind.is_fifo(),
    );
    let group = t.group(meta.group().unwrap_or(""), undo);
    *(m.into)(t.counters_mut(undo)) += 1;
    if meta.client_id() {
        t.set_client_id(meta.id(), new_pos, undo);
    }
    let (state, due) = if meta.visible_at() > now {
        (EntryState::Delayed, meta.visible_at())
    } else {
        (EntryState::Ready, 0)
    };
    t.add(
        new_pos,
        Entry::new(state, due, meta.expires_at(), 0, old.size(), group),
        pid,
        timers,
        undo,
    );
    change.touch(m.from);
    change.touch(m.to);
    Ok(Some((new_pos, meta)))
}
