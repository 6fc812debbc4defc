//! The in-memory indexes of the engine, rebuilt from the store at start.
//!
//! Per queue: every message's hot fields ([`Entry`], keyed by position),
//! the ready order (standard queues) or the message groups (FIFO queues),
//! the expiry order and the client-chosen ids. Across queues: one timer
//! set of lease deadlines and delayed visibility instants.
//!
//! Every change of a message's state goes through one of the transition
//! methods of [`QueueState`] (`add`, `remove`, `lease`, `release`,
//! `make_visible`, `set_deadline`), which keep all indexes and counts in
//! step.
//!
//! Cost per queued message (64-bit): the entry map (an [`Entry`] is 32
//! bytes, its key 8, with B-tree overhead), the ready set (a compressed
//! bitmap of positions: a fraction of a byte per message when positions
//! are dense, two bytes when sparse) and the expiry set (16 bytes, with
//! B-tree overhead); plus the id for client-chosen ids, and the payload
//! number of a message moved into the queue (dead-lettered, redriven).
//! `tools`' `index-memory` counts it (tools/README.md).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use roaring::RoaringTreemap;
use tokio::sync::watch;

use super::model::{QueueConfig, QueueKind};

/// A message's hot fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Ready, delayed or leased.
    pub state: EntryState,
    /// Delayed: when it becomes visible. Leased: the lease deadline.
    pub due: u64,
    /// When its time to live runs out.
    pub expires_at: u64,
    /// Leases granted at this position (the current lease's epoch).
    pub epoch: u32,
    /// Body size.
    pub size: u32,
    /// FIFO group index (0 for standard queues).
    pub group: u32,
}

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryState {
    /// Visible and not leased.
    Ready,
    /// Not visible before `due`.
    Delayed,
    /// Leased until `due`.
    Leased,
}

/// Timers of all queues: (due, qid, pos) of every leased or delayed message.
pub(crate) type Timers = BTreeSet<(u64, u32, u64)>;

/// A queue's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub published: u64,
    pub acked: u64,
    pub nacked: u64,
    pub expired: u64,
    pub dead_lettered: u64,
    pub dead_letters_received: u64,
    pub purged: u64,
    pub redriven: u64,
    pub redrive_received: u64,
}

/// One FIFO message group.
#[derive(Debug, Default)]
pub(crate) struct Group {
    /// The group id ("" for the default group).
    pub id: String,
    /// Its messages, in order.
    pub msgs: BTreeSet<u64>,
    /// How many of them are leased.
    pub leased: u32,
    /// Parked since, and why.
    pub parked: Option<(u64, String)>,
    /// Its key in the ready rotation, when ready.
    pub ready_key: Option<u64>,
}

/// The message groups of a FIFO queue.
#[derive(Debug, Default)]
pub(crate) struct Fifo {
    pub groups: HashMap<u32, Group>,
    pub ids: HashMap<String, u32>,
    next_index: u32,
    /// Ready groups in rotation order: a group that becomes ready joins at
    /// the back, so one busy group cannot starve the others.
    pub ready: BTreeSet<(u64, u32)>,
    next_ready: u64,
    /// Dedup entries: key → (message id, expiry), and their expiry order.
    pub dedup: HashMap<Vec<u8>, (String, u64)>,
    pub dedup_expiry: BTreeSet<(u64, Vec<u8>)>,
}

impl Fifo {
    /// The index of a group, creating it if needed.
    pub(crate) fn group_index(&mut self, id: &str) -> u32 {
        if let Some(&i) = self.ids.get(id) {
            return i;
        }
        self.next_index += 1;
        let i = self.next_index;
        self.ids.insert(id.to_string(), i);
        self.groups.insert(
            i,
            Group {
                id: id.to_string(),
                ..Group::default()
            },
        );
        i
    }

    /// Recomputes whether a group is ready (not parked, nothing leased,
    /// head visible), moves it in or out of the rotation, and forgets it
    /// when it is empty and not parked.
    pub(crate) fn refresh(&mut self, gidx: u32, msgs: &BTreeMap<u64, Entry>) {
        let Some(g) = self.groups.get_mut(&gidx) else {
            return;
        };
        let head_ready = g
            .msgs
            .first()
            .and_then(|p| msgs.get(p))
            .is_some_and(|e| e.state == EntryState::Ready);
        let ready = g.parked.is_none() && g.leased == 0 && head_ready;
        match (ready, g.ready_key) {
            (true, None) => {
                self.next_ready += 1;
                g.ready_key = Some(self.next_ready);
                self.ready.insert((self.next_ready, gidx));
            }
            (false, Some(k)) => {
                g.ready_key = None;
                self.ready.remove(&(k, gidx));
            }
            _ => {}
        }
        if g.msgs.is_empty() && g.parked.is_none() && g.leased == 0 {
            let id = std::mem::take(&mut g.id);
            self.groups.remove(&gidx);
            self.ids.remove(&id);
        }
    }

    /// Messages in parked groups that are neither leased nor delayed.
    pub(crate) fn parked_messages(&self, msgs: &BTreeMap<u64, Entry>) -> u64 {
        self.groups
            .values()
            .filter(|g| g.parked.is_some())
            .flat_map(|g| g.msgs.iter())
            .filter(|p| msgs.get(p).is_some_and(|e| e.state == EntryState::Ready))
            .count() as u64
    }
}

/// One queue's indexes.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub qid: u32,
    pub name: String,
    pub config: QueueConfig,
    pub created_at: u64,
    pub counters: Counters,
    /// Every message, by position.
    pub msgs: BTreeMap<u64, Entry>,
    /// Payload numbers of the messages whose payload number is not their
    /// position (moved into this queue), by position.
    pub pids: HashMap<u64, u64>,
    /// Standard queues: ready messages in position order.
    pub ready: RoaringTreemap,
    /// FIFO queues: the groups.
    pub fifo: Option<Fifo>,
    /// (expires_at, pos) of every message.
    pub expiry: BTreeSet<(u64, u64)>,
    /// Client-chosen message ids of the messages in the queue.
    pub client_ids: HashMap<String, u64>,
    pub leased: u64,
    pub delayed: u64,
    /// Bumped whenever a message may have become deliverable; long polls
    /// and subscriptions wait on it.
    pub wake: watch::Sender<u64>,
}

impl QueueState {
    pub(crate) fn new(qid: u32, name: String, config: QueueConfig, created_at: u64) -> QueueState {
        let fifo = (config.kind == QueueKind::Fifo).then(Fifo::default);
        QueueState {
            qid,
            name,
            config,
            created_at,
            counters: Counters::default(),
            msgs: BTreeMap::new(),
            pids: HashMap::new(),
            ready: RoaringTreemap::new(),
            fifo,
            expiry: BTreeSet::new(),
            client_ids: HashMap::new(),
            leased: 0,
            delayed: 0,
            wake: watch::channel(0).0,
        }
    }

    /// Wakes waiting receivers.
    pub(crate) fn wake(&self) {
        self.wake.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn refresh_group(&mut self, gidx: u32) {
        if let Some(f) = &mut self.fifo {
            f.refresh(gidx, &self.msgs);
        }
    }

    /// Adds a message whose payload is number `pid`.
    pub(crate) fn add(&mut self, pos: u64, e: Entry, pid: u64, timers: &mut Timers) {
        self.msgs.insert(pos, e);
        if pid != pos {
            self.pids.insert(pos, pid);
        }
        self.expiry.insert((e.expires_at, pos));
        match e.state {
            EntryState::Ready => {
                if self.fifo.is_none() {
                    self.ready.insert(pos);
                }
            }
            EntryState::Delayed => {
                self.delayed += 1;
                timers.insert((e.due, self.qid, pos));
            }
            EntryState::Leased => {
                self.leased += 1;
                timers.insert((e.due, self.qid, pos));
            }
        }
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&e.group) {
                g.msgs.insert(pos);
                if e.state == EntryState::Leased {
                    g.leased += 1;
                }
            }
            self.refresh_group(e.group);
        }
    }

    /// [`QueueState::add`] for every entry of an empty standard queue, the
    /// entries in position order, each with its payload number (the
    /// rebuild at start): the big maps are built in bulk, which fills their
    /// nodes instead of leaving them half empty as appending one by one
    /// does.
    pub(crate) fn add_all(&mut self, entries: Vec<(u64, Entry, u64)>, timers: &mut Timers) {
        if self.fifo.is_some() || !self.msgs.is_empty() {
            for (pos, e, pid) in entries {
                self.add(pos, e, pid, timers);
            }
            return;
        }
        let mut expiry: Vec<(u64, u64)> =
            entries.iter().map(|(p, e, _)| (e.expires_at, *p)).collect();
        expiry.sort_unstable();
        self.expiry = expiry.into_iter().collect();
        for &(pos, e, pid) in &entries {
            if pid != pos {
                self.pids.insert(pos, pid);
            }
            match e.state {
                EntryState::Ready => {
                    // In position order, so appended; out of order, inserted.
                    if !self.ready.push(pos) {
                        self.ready.insert(pos);
                    }
                }
                EntryState::Delayed => {
                    self.delayed += 1;
                    timers.insert((e.due, self.qid, pos));
                }
                EntryState::Leased => {
                    self.leased += 1;
                    timers.insert((e.due, self.qid, pos));
                }
            }
        }
        self.msgs = entries.into_iter().map(|(p, e, _)| (p, e)).collect();
    }

    /// Removes a message, returning its entry and its payload number.
    pub(crate) fn remove(&mut self, pos: u64, timers: &mut Timers) -> Option<(Entry, u64)> {
        let e = self.msgs.remove(&pos)?;
        let pid = self.pids.remove(&pos).unwrap_or(pos);
        self.expiry.remove(&(e.expires_at, pos));
        match e.state {
            EntryState::Ready => {
                self.ready.remove(pos);
            }
            EntryState::Delayed => {
                self.delayed -= 1;
                timers.remove(&(e.due, self.qid, pos));
            }
            EntryState::Leased => {
                self.leased -= 1;
                timers.remove(&(e.due, self.qid, pos));
            }
        }
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&e.group) {
                g.msgs.remove(&pos);
                if e.state == EntryState::Leased {
                    g.leased -= 1;
                }
            }
            self.refresh_group(e.group);
        }
        Some((e, pid))
    }

    /// Leases a ready message until `deadline` with the given epoch.
    pub(crate) fn lease(&mut self, pos: u64, deadline: u64, epoch: u32, timers: &mut Timers) {
        let Some(e) = self.msgs.get_mut(&pos) else {
            return;
        };
        debug_assert_eq!(e.state, EntryState::Ready);
        e.state = EntryState::Leased;
        e.due = deadline;
        e.epoch = epoch;
        let gidx = e.group;
        self.ready.remove(pos);
        self.leased += 1;
        timers.insert((deadline, self.qid, pos));
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&gidx) {
                g.leased += 1;
            }
            self.refresh_group(gidx);
        }
    }

    /// Ends a lease: the message is ready again, or delayed until
    /// `visible_at` if that is after `now`.
    pub(crate) fn release(&mut self, pos: u64, visible_at: u64, now: u64, timers: &mut Timers) {
        let Some(e) = self.msgs.get_mut(&pos) else {
            return;
        };
        if e.state != EntryState::Leased {
            return;
        }
        timers.remove(&(e.due, self.qid, pos));
        self.leased -= 1;
        let gidx = e.group;
        if visible_at > now {
            e.state = EntryState::Delayed;
            e.due = visible_at;
            self.delayed += 1;
            timers.insert((visible_at, self.qid, pos));
        } else {
            e.state = EntryState::Ready;
            e.due = 0;
            if self.fifo.is_none() {
                self.ready.insert(pos);
            }
        }
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&gidx) {
                g.leased -= 1;
            }
            self.refresh_group(gidx);
        }
    }

    /// A delayed message becomes visible.
    pub(crate) fn make_visible(&mut self, pos: u64, timers: &mut Timers) {
        let Some(e) = self.msgs.get_mut(&pos) else {
            return;
        };
        if e.state != EntryState::Delayed {
            return;
        }
        timers.remove(&(e.due, self.qid, pos));
        e.state = EntryState::Ready;
        e.due = 0;
        let gidx = e.group;
        self.delayed -= 1;
        if self.fifo.is_none() {
            self.ready.insert(pos);
        }
        self.refresh_group(gidx);
    }

    /// Moves a lease deadline.
    pub(crate) fn set_deadline(&mut self, pos: u64, deadline: u64, timers: &mut Timers) {
        let Some(e) = self.msgs.get_mut(&pos) else {
            return;
        };
        if e.state != EntryState::Leased {
            return;
        }
        timers.remove(&(e.due, self.qid, pos));
        e.due = deadline;
        timers.insert((deadline, self.qid, pos));
    }

    /// Parks or unparks a FIFO group (and refreshes its readiness).
    pub(crate) fn set_parked(&mut self, gidx: u32, parked: Option<(u64, String)>) {
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&gidx) {
                g.parked = parked;
            }
            f.refresh(gidx, &self.msgs);
        }
    }

    /// Messages deliverable now (FIFO: visible, unleased, not parked).
    pub(crate) fn ready_count(&self) -> u64 {
        match &self.fifo {
            None => self.ready.len(),
            Some(f) => (self.msgs.len() as u64)
                .saturating_sub(self.leased + self.delayed + f.parked_messages(&self.msgs)),
        }
    }

    /// Up to `max` positions a receive may lease now, in delivery order,
    /// stopping when `budget` bytes are used (at least one is taken).
    /// Standard: ready messages by position. FIFO: from each ready group
    /// in rotation, its consecutive visible messages from the head.
    pub(crate) fn deliverable(&self, max: usize, mut budget: u64, per_message: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut take = |pos: u64, size: u32, out: &mut Vec<u64>| -> bool {
            let cost = u64::from(size) + per_message;
            if !out.is_empty() && cost > budget {
                return false;
            }
            budget = budget.saturating_sub(cost);
            out.push(pos);
            out.len() < max
        };
        match &self.fifo {
            None => {
                for pos in &self.ready {
                    let size = self.msgs.get(&pos).map_or(0, |e| e.size);
                    if !take(pos, size, &mut out) {
                        break;
                    }
                }
            }
            Some(f) => {
                'groups: for &(_, gidx) in &f.ready {
                    let Some(g) = f.groups.get(&gidx) else {
                        continue;
                    };
                    for &pos in &g.msgs {
                        match self.msgs.get(&pos) {
                            Some(e) if e.state == EntryState::Ready => {
                                if !take(pos, e.size, &mut out) {
                                    break 'groups;
                                }
                            }
                            _ => break,
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::model::QueueConfigInput;
    use crate::queue::validate::new_config;

    fn queue(kind: QueueKind) -> QueueState {
        let input = QueueConfigInput {
            kind: Some(kind),
            ..QueueConfigInput::default()
        };
        QueueState::new(7, "q".into(), new_config(&input).expect("config"), 0)
    }

    /// Entries at positions 3, 6, … 1500; every seventh was moved in (its
    /// payload number is not its position).
    fn entries() -> Vec<(u64, Entry, u64)> {
        (1..=500u64)
            .map(|pos| {
                let state = match pos % 5 {
                    0 => EntryState::Leased,
                    1 => EntryState::Delayed,
                    _ => EntryState::Ready,
                };
                let e = Entry {
                    state,
                    due: if state == EntryState::Ready {
                        0
                    } else {
                        10_000 - pos * 7
                    },
                    // Not in position order: expiry must still come out sorted.
                    expires_at: 1_000_000 - (pos % 13) * 1000,
                    epoch: (pos % 3) as u32,
                    size: 100,
                    group: (pos % 4) as u32,
                };
                let pid = if pos % 7 == 0 { pos } else { pos * 3 };
                (pos * 3, e, pid)
            })
            .collect()
    }

    #[test]
    fn add_all_builds_what_adding_one_by_one_builds() {
        for kind in [QueueKind::Standard, QueueKind::Fifo] {
            let (mut one, mut all) = (queue(kind), queue(kind));
            let (mut t1, mut t2) = (Timers::new(), Timers::new());
            if let (Some(f1), Some(f2)) = (&mut one.fifo, &mut all.fifo) {
                for g in ["a", "b", "c", "d"] {
                    f1.group_index(g);
                    f2.group_index(g);
                }
            }
            for (pos, e, pid) in entries() {
                one.add(pos, e, pid, &mut t1);
            }
            all.add_all(entries(), &mut t2);
            assert_eq!(one.msgs, all.msgs, "{kind:?}");
            assert_eq!(one.pids, all.pids, "{kind:?}");
            assert_eq!(all.pids.len(), 71, "{kind:?}");
            assert_eq!(one.ready, all.ready, "{kind:?}");
            assert_eq!(one.expiry, all.expiry, "{kind:?}");
            assert_eq!((one.delayed, one.leased), (all.delayed, all.leased));
            assert_eq!(t1, t2, "{kind:?}");
            assert_eq!(one.fifo.map(|f| f.ready), all.fifo.map(|f| f.ready));
        }
        // A queue that already holds messages takes the one-by-one path.
        let mut q = queue(QueueKind::Standard);
        let mut t = Timers::new();
        let mut es = entries();
        let last = es.pop().expect("entries");
        q.add(last.0, last.1, last.2, &mut t);
        q.add_all(es, &mut t);
        assert_eq!(q.msgs.len(), 500);
        assert_eq!(q.expiry.len(), 500);
    }

    /// The entry map is most of the index memory per queued message
    /// (BENCHMARKS.md, "Scale"): an entry stays within 32 bytes.
    #[test]
    fn an_entry_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 32);
    }

    #[test]
    fn remove_gives_back_the_payload_number_and_forgets_it() {
        let mut q = queue(QueueKind::Standard);
        let mut t = Timers::new();
        q.add_all(entries(), &mut t);
        for (pos, _, pid) in entries() {
            let (_, got) = q.remove(pos, &mut t).expect("present");
            assert_eq!(got, pid, "position {pos}");
        }
        assert!(q.pids.is_empty() && q.msgs.is_empty() && q.ready.is_empty());
        assert!(q.expiry.is_empty() && t.is_empty());
    }
}
