//! FIFO group administration: list groups, skip a head, release a parked
//! group.
//!
//! Complexity of delivery (see `state.rs`): ready groups sit in a rotation
//! (a B-tree keyed by the order in which they became ready); a receive
//! takes the first group in O(log G) and its consecutive head messages in
//! O(k log n). A group's backlog never enters the choice, so a group with
//! a million messages costs a group with one nothing.

use crate::storage::Key;

use super::error::{QueueError, Result};
use super::model::{DeadLetterReason, GroupInfo, GroupState};
use super::state::{EntryState, QueueState};
use super::{Broker, Change, State, durable, persist, validate};

impl Broker {
    /// Lists a FIFO queue's groups in id order, after `after`, optionally
    /// only those in one state.
    pub fn list_groups(
        &self,
        queue: &str,
        page_size: u32,
        after: Option<&str>,
        only: Option<GroupState>,
    ) -> Result<(Vec<GroupInfo>, Option<String>)> {
        let size = validate::page_size("page_size", page_size)?;
        let now = self.now();
        let (qid, rows, more) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let q = st.queue(qid)?;
            let f = fifo_of(q)?;
            let mut ids: Vec<(&String, &u32)> = f
                .ids
                .iter()
                .filter(|(id, _)| after.is_none_or(|a| id.as_str() > a))
                .collect();
            ids.sort();
            let mut rows = Vec::new();
            let mut more = false;
            for (id, gidx) in ids {
                let Some(g) = f.groups.get(gidx) else {
                    continue;
                };
                let head = g.msgs.first().copied();
                let head_state = head
                    .and_then(|p| q.msgs.get(p))
                    .map(|e| (e.state(), e.due()));
                let (state, reason) = match (&g.parked, head_state) {
                    (Some((_, why)), _) => (GroupState::Parked, why.clone()),
                    _ if g.leased > 0 => (
                        GroupState::Leased,
                        format!("{} message(s) leased", g.leased),
                    ),
                    (None, Some((EntryState::Delayed, due))) => (
                        GroupState::Delayed,
                        format!("head visible at {due} (unix ms)"),
                    ),
                    _ => (GroupState::Ready, String::new()),
                };
                if only.is_some_and(|s| s != state) {
                    continue;
                }
                if rows.len() == size {
                    more = true;
                    break;
                }
                rows.push((
                    id.clone(),
                    head,
                    g.msgs.len() as u64,
                    u64::from(g.leased),
                    state,
                    reason,
                ));
            }
            (qid, rows, more)
        };
        let mut out = Vec::with_capacity(rows.len());
        for (group_id, head, backlog, in_flight, state, reason) in rows {
            let meta = match head {
                Some(pos) => persist::get(&self.store, qid, pos)?,
                None => None,
            };
            out.push(GroupInfo {
                group_id,
                backlog,
                in_flight,
                oldest_age: meta
                    .as_ref()
                    .map_or(0, |m| now.saturating_sub(m.enqueued_at())),
                state,
                reason,
                head_message_id: meta
                    .as_ref()
                    .map(|m| m.id().to_string())
                    .unwrap_or_default(),
                head_delivery_count: meta.as_ref().map_or(0, |m| m.delivery_count()),
                head_failed_attempts: meta.as_ref().map_or(0, |m| m.failed_attempts()),
            });
        }
        let next = if more {
            out.last().map(|g| g.group_id.clone())
        } else {
            None
        };
        Ok((out, next))
    }

    /// Moves a FIFO group's head to the dead letter queue (reason
    /// SKIPPED, with the operator's note) and lets the group go on; a
    /// parked group is released. Returns the skipped message's id.
    pub async fn skip_head(&self, queue: &str, group: &str, note: &str) -> Result<String> {
        validate::reason("note", note)?;
        let now = self.now();
        let (id, commit) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let q = st.queue(qid)?;
            if q.config.dead_letter.is_none() {
                return Err(QueueError::FailedPrecondition(format!(
                    "queue {queue:?} has no dead letter queue to skip a message to"
                )));
            }
            let (gidx, pos) = head_of(q, group)?;
            let Some(pos) = pos else {
                return Err(QueueError::FailedPrecondition(format!(
                    "group {group:?} of queue {queue:?} has no message to skip"
                )));
            };
            if q.msgs
                .get(pos)
                .is_some_and(|e| e.state() == EntryState::Leased)
            {
                return Err(QueueError::FailedPrecondition(format!(
                    "the head of group {group:?} is leased by a consumer; wait for its lease to end"
                )));
            }
            self.decide(&mut st, |st, change| {
                unpark(st, qid, gidx, group, change)?;
                let meta = self.meta(qid, pos)?;
                let id = meta.id().to_string();
                self.dead_letter(
                    st,
                    qid,
                    pos,
                    meta,
                    DeadLetterReason::Skipped,
                    note,
                    now,
                    change,
                )?;
                Ok(id)
            })?
        };
        durable(commit).await?;
        Ok(id)
    }

    /// Releases a parked FIFO group: its head is deliverable again with no
    /// failed attempts counted (its deliveries stay counted). Returns the
    /// head's id.
    pub async fn release_group(&self, queue: &str, group: &str) -> Result<String> {
        let (id, commit) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let q = st.queue(qid)?;
            let (gidx, pos) = head_of(q, group)?;
            let parked = q
                .fifo
                .as_ref()
                .and_then(|f| f.groups.get(&gidx))
                .is_some_and(|g| g.parked.is_some());
            if !parked {
                return Err(QueueError::FailedPrecondition(format!(
                    "group {group:?} of queue {queue:?} is not parked"
                )));
            }
            self.decide(&mut st, |st, change| {
                let mut id = String::new();
                if let Some(pos) = pos {
                    let mut meta = self.meta(qid, pos)?;
                    meta.reset_failures();
                    id = meta.id().to_string();
                    persist::put(&mut change.txn, qid, pos, &meta);
                }
                unpark(st, qid, gidx, group, change)?;
                change.wake(qid);
                Ok(id)
            })?
        };
        durable(commit).await?;
        Ok(id)
    }
}

fn fifo_of(q: &QueueState) -> Result<&super::state::Fifo> {
    q.fifo.as_ref().ok_or_else(|| {
        QueueError::FailedPrecondition(format!(
            "queue {:?} is a STANDARD queue; message groups exist in FIFO queues only",
            q.name
        ))
    })
}

/// A group's index and head position, or NOT_FOUND.
fn head_of(q: &QueueState, group: &str) -> Result<(u32, Option<u64>)> {
    let f = fifo_of(q)?;
    let gidx = *f.ids.get(group).ok_or_else(|| QueueError::NotFound {
        kind: "group",
        name: group.to_string(),
    })?;
    let head = f.groups.get(&gidx).and_then(|g| g.msgs.first().copied());
    Ok((gidx, head))
}

fn unpark(st: &mut State, qid: u32, gidx: u32, group: &str, change: &mut Change) -> Result<()> {
    let State { queues, undo, .. } = st;
    let q = queues
        .get_mut(&qid)
        .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
    let parked = q
        .fifo
        .as_ref()
        .and_then(|f| f.groups.get(&gidx))
        .is_some_and(|g| g.parked.is_some());
    if parked {
        q.set_parked(gidx, None, undo);
        change.txn.delete(Key::Group(qid, group));
        change.wake(qid);
    }
    Ok(())
}
