//! Undoing an operation's changes to the in-memory indexes.
//!
//! An operation changes the indexes as it decides (a later step reads what
//! an earlier one did: a nack's release fences the next token of the same
//! call, an ack frees the FIFO group the same receive then leases) and
//! builds its transaction beside them. When a step fails after others
//! changed memory (a record that does not read, a transition the stored
//! state refuses), the transaction is dropped, so memory must go back too:
//! otherwise memory and the store disagree until the next start.
//!
//! So every change to the indexes is recorded in the state's [`Undo`] by
//! the transition that makes it, before it makes it: a message slot's
//! entry and payload number, its client id, a FIFO group's numbering,
//! parking and place in the rotation, a dedup entry, a queue's counters,
//! the next position. The transitions of `QueueState` take the journal as
//! an argument, so none can change a slot unrecorded. `Broker::decide`
//! clears it when an operation starts, and on failure `State::roll_back`
//! puts everything recorded back exactly as it was, in place (an entry's
//! place in the expiry order included), before the lock is released.
//!
//! The catalogue (queues, their configurations, exchanges) is not
//! recorded: its operations check everything before their first change and
//! have no step that can fail after it.

use std::collections::HashSet;

use super::State;
use super::model::QueueCounters;
use super::state::{Entry, Group, QueueState};

/// A message slot before a change: its entry, payload number and whether
/// its expiry was in the rising half of the expiry order; `None` when the
/// position was free.
type SlotBefore = Option<(Entry, u64, bool)>;

/// A FIFO group before the operation first changed it: its id, parking
/// and key in the ready rotation; `None` when the operation created it.
type GroupBefore = Option<(String, Option<(u64, String)>, Option<u64>)>;

/// A dedup entry before a change: its message id and end of window;
/// `None` when the key was not remembered.
type DedupBefore = Option<(String, u64)>;

/// A queue's own figures before the operation first changed them.
#[derive(Debug, Clone)]
struct QueueBefore {
    qid: u32,
    counters: QueueCounters,
    /// The last position (and its expiry) that joined the rising half of
    /// the expiry order.
    expiry_last: (u64, u64),
    /// FIFO: the last group index and ready key handed out.
    numbering: Option<(u32, u64)>,
}

/// What the current operation changed in the indexes (module docs).
#[derive(Debug, Default)]
pub(crate) struct Undo {
    /// (queue, position, before) of every change of a slot, oldest first.
    slots: Vec<(u32, u64, SlotBefore)>,
    queues: Vec<QueueBefore>,
    /// (queue, group index, before), once per group.
    groups: Vec<(u32, u32, GroupBefore)>,
    groups_seen: HashSet<(u32, u32)>,
    /// (queue, id, position before) of every change of a client id.
    client_ids: Vec<(u32, String, Option<u64>)>,
    /// (queue, key, entry before) of every change of a dedup entry.
    dedup: Vec<(u32, Vec<u8>, DedupBefore)>,
    /// Timers removed without their slot changing (stale ones).
    timers: Vec<(u64, u32, u64)>,
    /// The next position and the end of the reserved block, before the
    /// first position was handed out.
    positions: Option<(u64, u64)>,
}

impl Undo {
    /// Forgets everything recorded: an operation starts, or its change was
    /// submitted.
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.queues.clear();
        self.groups.clear();
        self.groups_seen.clear();
        self.client_ids.clear();
        self.dedup.clear();
        self.timers.clear();
        self.positions = None;
    }

    /// Records a queue's own figures, the first time it changes.
    pub(crate) fn queue(&mut self, q: &QueueState) {
        if self.queues.iter().any(|b| b.qid == q.qid) {
            return;
        }
        self.queues.push(QueueBefore {
            qid: q.qid,
            counters: q.counters,
            expiry_last: q.expiry.last(),
            numbering: q.fifo.as_ref().map(|f| (f.next_index, f.next_ready)),
        });
    }

    /// Records a slot (and its queue, and its FIFO group) before it
    /// changes.
    pub(crate) fn slot(&mut self, q: &QueueState, pos: u64) {
        self.queue(q);
        let before = q.msgs.get(pos).map(|e| {
            let pid = q.pids.get(&pos).copied().unwrap_or(pos);
            (*e, pid, q.expiry.is_rising(pos))
        });
        if let Some((e, _, _)) = before {
            self.group(q, e.group());
        }
        self.slots.push((q.qid, pos, before));
    }

    /// Records a FIFO group (and its queue), the first time it changes;
    /// nothing for a standard queue.
    pub(crate) fn group(&mut self, q: &QueueState, gidx: u32) {
        let Some(f) = &q.fifo else { return };
        if !self.groups_seen.insert((q.qid, gidx)) {
            return;
        }
        self.queue(q);
        let before = f
            .groups
            .get(&gidx)
            .map(|g| (g.id.clone(), g.parked.clone(), g.ready_key));
        self.groups.push((q.qid, gidx, before));
    }

    /// Records a client id before it changes.
    pub(crate) fn client_id(&mut self, q: &QueueState, id: &str) {
        self.client_ids
            .push((q.qid, id.to_string(), q.client_ids.get(id).copied()));
    }

    /// Records a dedup entry before it changes.
    pub(crate) fn dedup(&mut self, q: &QueueState, key: &[u8]) {
        let before = q.fifo.as_ref().and_then(|f| f.dedup.get(key).cloned());
        self.dedup.push((q.qid, key.to_vec(), before));
    }

    /// Records a stale timer being removed.
    pub(crate) fn timer(&mut self, t: (u64, u32, u64)) {
        self.timers.push(t);
    }

    /// Records the position counters before the first is handed out.
    pub(crate) fn positions(&mut self, next_pos: u64, pos_reserved: u64) {
        if self.positions.is_none() {
            self.positions = Some((next_pos, pos_reserved));
        }
    }
}

impl State {
    /// Puts the indexes back exactly as they were before the current
    /// operation's first change (module docs), and empties the journal.
    pub(crate) fn roll_back(&mut self) {
        let undo = std::mem::take(&mut self.undo);
        let State { queues, timers, .. } = self;
        // Every slot changed leaves; the groups are then put back, and the
        // slots are filled with what they held first.
        for &(qid, pos, _) in &undo.slots {
            if let Some(q) = queues.get_mut(&qid) {
                q.remove_entry(pos, timers);
            }
        }
        // Groups the operation created go first: a group it emptied (and
        // so forgot) may have been created again under another index.
        for (qid, gidx, before) in &undo.groups {
            if before.is_none()
                && let Some(f) = queues.get_mut(qid).and_then(|q| q.fifo.as_mut())
                && let Some(g) = f.groups.remove(gidx)
            {
                if let Some(k) = g.ready_key {
                    f.ready.remove(&(k, *gidx));
                }
                if f.ids.get(&g.id) == Some(gidx) {
                    f.ids.remove(&g.id);
                }
            }
        }
        for (qid, gidx, before) in &undo.groups {
            let Some((id, parked, _)) = before else {
                continue;
            };
            let Some(f) = queues.get_mut(qid).and_then(|q| q.fifo.as_mut()) else {
                continue;
            };
            let g = f.groups.entry(*gidx).or_insert_with(|| Group {
                id: id.clone(),
                ..Group::default()
            });
            g.parked = parked.clone();
            f.ids.insert(id.clone(), *gidx);
        }
        let mut filled = HashSet::with_capacity(undo.slots.len());
        for &(qid, pos, before) in &undo.slots {
            // The first record of a slot holds what it was.
            if !filled.insert((qid, pos)) {
                continue;
            }
            if let (Some((e, pid, rising)), Some(q)) = (before, queues.get_mut(&qid)) {
                q.put_back(pos, e, pid, rising, timers);
            }
        }
        for (qid, gidx, before) in &undo.groups {
            let Some((_, _, key)) = before else { continue };
            let Some(f) = queues.get_mut(qid).and_then(|q| q.fifo.as_mut()) else {
                continue;
            };
            let Some(g) = f.groups.get_mut(gidx) else {
                continue;
            };
            if let Some(k) = g.ready_key {
                f.ready.remove(&(k, *gidx));
            }
            g.ready_key = *key;
            if let Some(k) = key {
                f.ready.insert((*k, *gidx));
            }
        }
        for b in &undo.queues {
            if let Some(q) = queues.get_mut(&b.qid) {
                q.counters = b.counters;
                q.expiry.set_last(b.expiry_last);
                if let (Some(f), Some((index, ready))) = (&mut q.fifo, b.numbering) {
                    f.next_index = index;
                    f.next_ready = ready;
                }
            }
        }
        for (qid, id, before) in undo.client_ids.into_iter().rev() {
            if let Some(q) = queues.get_mut(&qid) {
                match before {
                    Some(pos) => q.client_ids.insert(id, pos),
                    None => q.client_ids.remove(&id),
                };
            }
        }
        for (qid, key, before) in undo.dedup.into_iter().rev() {
            let Some(f) = queues.get_mut(&qid).and_then(|q| q.fifo.as_mut()) else {
                continue;
            };
            if let Some((_, until)) = f.dedup.remove(&key) {
                f.dedup_expiry.remove(&(until, key.clone()));
            }
            if let Some((id, until)) = before {
                f.dedup_expiry.insert((until, key.clone()));
                f.dedup.insert(key, (id, until));
            }
        }
        timers.extend(undo.timers);
        if let Some((next, reserved)) = undo.positions {
            self.next_pos = next;
            self.pos_reserved = reserved;
        }
    }
}
