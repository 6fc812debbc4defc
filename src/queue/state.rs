//! The in-memory indexes of the engine, rebuilt from the store at start.
//!
//! Per queue: every message's hot fields ([`Entry`], keyed by position),
//! the ready order (standard queues) or the message groups (FIFO queues),
//! the expiry order and the client-chosen ids. Across queues: one timer
//! set of lease deadlines and delayed visibility instants.
//!
//! Every change of a message's state goes through one of the transition
//! methods of [`QueueState`] (`add`, `remove`, `lease`, `release`,
//! `make_visible`, `set_deadline`, `set_epoch`, `set_parked`), which keep
//! all indexes and counts in step, and so do the changes of a queue's
//! counters, client ids, FIFO groups and dedup entries (`counters_mut`,
//! `set_client_id`, `forget_client_id`, `group`, `remember_dedup`,
//! `forget_dedup`). Each records what it changes in the operation's
//! [`Undo`] first (`undo.rs`), so that a failed operation leaves the
//! indexes as they were. Only the load at start builds them unrecorded.
//!
//! Cost per queued message (64-bit): the entry map (an [`Entry`] is 24
//! bytes, kept in chunks of 64 positions with under a byte besides when
//! positions are dense: `entries.rs`), the ready set (a compressed bitmap
//! of positions: a fraction of a byte per message when positions are
//! dense, two bytes when sparse) and the expiry order (the same bitmap's
//! cost when expiry rises with position, as with one TTL per queue; else
//! 16 bytes with B-tree overhead: `expiry.rs`); plus the id for
//! client-chosen ids, and the payload number of a message moved into the
//! queue (dead-lettered, redriven).
//! `tools`' `index-memory` counts it (tools/README.md).

use std::collections::{BTreeSet, HashMap};

use roaring::RoaringTreemap;
use tokio::sync::watch;

use super::entries::EntryMap;
use super::expiry::ExpiryOrder;
use super::model::QueueCounters;
use super::model::{QueueConfig, QueueKind};
use super::undo::Undo;

/// A message's hot fields, packed into 24 bytes (the entry map holds one
/// per queued message): the two instants as 48-bit milliseconds (up to
/// the year 10889; later ones are kept as that), the FIFO group index split
/// over their top 16 bits, the state in the top 2 bits of the body size
/// (sizes are far below 2^30: at most 256 MiB).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Delayed: when it becomes visible; leased: the lease deadline (low 48
    /// bits). The group index's low 16 bits (high 16).
    due_group: u64,
    /// When its time to live runs out (low 48 bits). The group index's
    /// high 16 bits (high 16).
    expires_group: u64,
    /// Leases granted at this position (the current lease's epoch).
    epoch: u32,
    /// Body size (low 30 bits); the state (high 2).
    size_state: u32,
}

/// The latest instant an entry holds, in milliseconds.
const TIME_MAX: u64 = (1 << 48) - 1;
/// The largest body size an entry holds.
const SIZE_MAX: u32 = (1 << 30) - 1;

impl Entry {
    /// An entry: `state`; `due`, when it becomes visible (delayed) or its
    /// lease deadline (leased); `expires_at`, when its time to live runs
    /// out; `epoch`, leases granted so far; `size`, the body's; `group`,
    /// its FIFO group index (0 for standard queues).
    pub(crate) fn new(
        state: EntryState,
        due: u64,
        expires_at: u64,
        epoch: u32,
        size: u32,
        group: u32,
    ) -> Entry {
        let mut e = Entry {
            due_group: u64::from(group & 0xffff) << 48,
            expires_group: (u64::from(group >> 16) << 48) | expires_at.min(TIME_MAX),
            epoch,
            size_state: size.min(SIZE_MAX),
        };
        e.set_due(due);
        e.set_state(state);
        e
    }

    /// Ready, delayed or leased.
    pub(crate) fn state(&self) -> EntryState {
        match self.size_state >> 30 {
            0 => EntryState::Ready,
            1 => EntryState::Delayed,
            _ => EntryState::Leased,
        }
    }

    pub(crate) fn set_state(&mut self, state: EntryState) {
        let bits = match state {
            EntryState::Ready => 0,
            EntryState::Delayed => 1,
            EntryState::Leased => 2,
        };
        self.size_state = (self.size_state & SIZE_MAX) | (bits << 30);
    }

    /// Delayed: when it becomes visible. Leased: the lease deadline.
    pub(crate) fn due(&self) -> u64 {
        self.due_group & TIME_MAX
    }

    /// Sets `due` (a later instant than the year 10889 is kept as that).
    pub(crate) fn set_due(&mut self, due: u64) {
        self.due_group = (self.due_group & !TIME_MAX) | due.min(TIME_MAX);
    }

    /// When its time to live runs out.
    pub(crate) fn expires_at(&self) -> u64 {
        self.expires_group & TIME_MAX
    }

    /// Leases granted at this position (the current lease's epoch).
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    pub(crate) fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    /// Body size.
    pub(crate) fn size(&self) -> u32 {
        self.size_state & SIZE_MAX
    }

    /// FIFO group index (0 for standard queues).
    pub(crate) fn group(&self) -> u32 {
        // Both shifts leave 16 bits.
        #[allow(clippy::cast_possible_truncation)]
        let (high, low) = (
            (self.expires_group >> 48) as u32,
            (self.due_group >> 48) as u32,
        );
        (high << 16) | low
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("state", &self.state())
            .field("due", &self.due())
            .field("expires_at", &self.expires_at())
            .field("epoch", &self.epoch())
            .field("size", &self.size())
            .field("group", &self.group())
            .finish()
    }
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
    pub(super) next_index: u32,
    /// Ready groups in rotation order: a group that becomes ready joins at
    /// the back, so one busy group cannot starve the others.
    pub ready: BTreeSet<(u64, u32)>,
    pub(super) next_ready: u64,
    /// Dedup entries: key → (message id, expiry), and their expiry order.
    pub dedup: HashMap<Vec<u8>, (String, u64)>,
    pub dedup_expiry: BTreeSet<(u64, Vec<u8>)>,
}

impl Fifo {
    /// The index of a group, creating it if needed, unrecorded: the load
    /// at start (operations use [`QueueState::group`]).
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
    pub(crate) fn refresh(&mut self, gidx: u32, msgs: &EntryMap) {
        let Some(g) = self.groups.get_mut(&gidx) else {
            return;
        };
        let head_ready = g
            .msgs
            .first()
            .and_then(|&p| msgs.get(p))
            .is_some_and(|e| e.state() == EntryState::Ready);
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
    pub(crate) fn parked_messages(&self, msgs: &EntryMap) -> u64 {
        self.groups
            .values()
            .filter(|g| g.parked.is_some())
            .flat_map(|g| g.msgs.iter())
            .filter(|&&p| msgs.get(p).is_some_and(|e| e.state() == EntryState::Ready))
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
    pub counters: QueueCounters,
    /// Every message, by position.
    pub msgs: EntryMap,
    /// Payload numbers of the messages whose payload number is not their
    /// position (moved into this queue), by position.
    pub pids: HashMap<u64, u64>,
    /// Standard queues: ready messages in position order.
    pub ready: RoaringTreemap,
    /// FIFO queues: the groups.
    pub fifo: Option<Fifo>,
    /// (expires_at, pos) of every message.
    pub expiry: ExpiryOrder,
    /// Client-chosen message ids of the messages in the queue.
    pub client_ids: HashMap<String, u64>,
    pub leased: u64,
    pub delayed: u64,
    /// String pairs a front end keeps with the queue (the SQS endpoint's
    /// attributes), sorted by name; the engine never reads them.
    pub annotations: Vec<(String, String)>,
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
            counters: QueueCounters::default(),
            msgs: EntryMap::new(),
            pids: HashMap::new(),
            ready: RoaringTreemap::new(),
            fifo,
            expiry: ExpiryOrder::default(),
            client_ids: HashMap::new(),
            leased: 0,
            delayed: 0,
            annotations: Vec::new(),
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
    pub(crate) fn add(
        &mut self,
        pos: u64,
        e: Entry,
        pid: u64,
        timers: &mut Timers,
        undo: &mut Undo,
    ) {
        undo.slot(self, pos);
        undo.group(self, e.group());
        self.msgs.insert(pos, e);
        if pid != pos {
            self.pids.insert(pos, pid);
        }
        self.expiry.insert(e.expires_at(), pos);
        self.index_entry(pos, e, timers);
    }

    /// A slot put back as it was before a failed operation (`undo.rs`):
    /// [`QueueState::add`] unrecorded, its expiry in the half of the
    /// expiry order it was in.
    pub(super) fn put_back(
        &mut self,
        pos: u64,
        e: Entry,
        pid: u64,
        rising: bool,
        timers: &mut Timers,
    ) {
        self.msgs.insert(pos, e);
        if pid != pos {
            self.pids.insert(pos, pid);
        }
        self.expiry.put_back(e.expires_at(), pos, rising);
        self.index_entry(pos, e, timers);
    }

    /// Indexes a new entry: the ready set, its timer, its group.
    fn index_entry(&mut self, pos: u64, e: Entry, timers: &mut Timers) {
        match e.state() {
            EntryState::Ready => {
                if self.fifo.is_none() {
                    self.ready.insert(pos);
                }
            }
            EntryState::Delayed => {
                self.delayed += 1;
                timers.insert((e.due(), self.qid, pos));
            }
            EntryState::Leased => {
                self.leased += 1;
                timers.insert((e.due(), self.qid, pos));
            }
        }
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&e.group()) {
                g.msgs.insert(pos);
                if e.state() == EntryState::Leased {
                    g.leased += 1;
                }
            }
            self.refresh_group(e.group());
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
                self.msgs.insert(pos, e);
                if pid != pos {
                    self.pids.insert(pos, pid);
                }
                self.expiry.insert(e.expires_at(), pos);
                self.index_entry(pos, e, timers);
            }
            return;
        }
        self.expiry =
            ExpiryOrder::from_position_order(entries.iter().map(|(p, e, _)| (e.expires_at(), *p)));
        for &(pos, e, pid) in &entries {
            if pid != pos {
                self.pids.insert(pos, pid);
            }
            match e.state() {
                EntryState::Ready => {
                    // In position order, so appended; out of order, inserted.
                    if !self.ready.push(pos) {
                        self.ready.insert(pos);
                    }
                }
                EntryState::Delayed => {
                    self.delayed += 1;
                    timers.insert((e.due(), self.qid, pos));
                }
                EntryState::Leased => {
                    self.leased += 1;
                    timers.insert((e.due(), self.qid, pos));
                }
            }
        }
        self.msgs = entries.into_iter().map(|(p, e, _)| (p, e)).collect();
    }

    /// Removes a message, returning its entry and its payload number.
    pub(crate) fn remove(
        &mut self,
        pos: u64,
        timers: &mut Timers,
        undo: &mut Undo,
    ) -> Option<(Entry, u64)> {
        undo.slot(self, pos);
        self.remove_entry(pos, timers)
    }

    /// [`QueueState::remove`] unrecorded: a failed operation's slot taken
    /// out before it is put back (`undo.rs`).
    pub(super) fn remove_entry(&mut self, pos: u64, timers: &mut Timers) -> Option<(Entry, u64)> {
        let e = self.msgs.remove(pos)?;
        let pid = self.pids.remove(&pos).unwrap_or(pos);
        self.expiry.remove(e.expires_at(), pos);
        match e.state() {
            EntryState::Ready => {
                self.ready.remove(pos);
            }
            EntryState::Delayed => {
                self.delayed -= 1;
                timers.remove(&(e.due(), self.qid, pos));
            }
            EntryState::Leased => {
                self.leased -= 1;
                timers.remove(&(e.due(), self.qid, pos));
            }
        }
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&e.group()) {
                g.msgs.remove(&pos);
                if e.state() == EntryState::Leased {
                    g.leased -= 1;
                }
            }
            self.refresh_group(e.group());
        }
        Some((e, pid))
    }

    /// Leases a ready message until `deadline` with the given epoch.
    pub(crate) fn lease(
        &mut self,
        pos: u64,
        deadline: u64,
        epoch: u32,
        timers: &mut Timers,
        undo: &mut Undo,
    ) {
        undo.slot(self, pos);
        let Some(e) = self.msgs.get_mut(pos) else {
            return;
        };
        debug_assert_eq!(e.state(), EntryState::Ready);
        e.set_state(EntryState::Leased);
        e.set_due(deadline);
        e.set_epoch(epoch);
        let (gidx, due) = (e.group(), e.due());
        self.ready.remove(pos);
        self.leased += 1;
        timers.insert((due, self.qid, pos));
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&gidx) {
                g.leased += 1;
            }
            self.refresh_group(gidx);
        }
    }

    /// Ends a lease: the message is ready again, or delayed until
    /// `visible_at` if that is after `now`.
    pub(crate) fn release(
        &mut self,
        pos: u64,
        visible_at: u64,
        now: u64,
        timers: &mut Timers,
        undo: &mut Undo,
    ) {
        undo.slot(self, pos);
        let Some(e) = self.msgs.get_mut(pos) else {
            return;
        };
        if e.state() != EntryState::Leased {
            return;
        }
        timers.remove(&(e.due(), self.qid, pos));
        self.leased -= 1;
        let gidx = e.group();
        if visible_at > now {
            e.set_state(EntryState::Delayed);
            e.set_due(visible_at);
            self.delayed += 1;
            timers.insert((e.due(), self.qid, pos));
        } else {
            e.set_state(EntryState::Ready);
            e.set_due(0);
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
    pub(crate) fn make_visible(&mut self, pos: u64, timers: &mut Timers, undo: &mut Undo) {
        undo.slot(self, pos);
        let Some(e) = self.msgs.get_mut(pos) else {
            return;
        };
        if e.state() != EntryState::Delayed {
            return;
        }
        timers.remove(&(e.due(), self.qid, pos));
        e.set_state(EntryState::Ready);
        e.set_due(0);
        let gidx = e.group();
        self.delayed -= 1;
        if self.fifo.is_none() {
            self.ready.insert(pos);
        }
        self.refresh_group(gidx);
    }

    /// Moves a lease deadline.
    pub(crate) fn set_deadline(
        &mut self,
        pos: u64,
        deadline: u64,
        timers: &mut Timers,
        undo: &mut Undo,
    ) {
        undo.slot(self, pos);
        let Some(e) = self.msgs.get_mut(pos) else {
            return;
        };
        if e.state() != EntryState::Leased {
            return;
        }
        timers.remove(&(e.due(), self.qid, pos));
        e.set_due(deadline);
        timers.insert((e.due(), self.qid, pos));
    }

    /// Sets the epoch of a message's entry.
    pub(crate) fn set_epoch(&mut self, pos: u64, epoch: u32, undo: &mut Undo) {
        undo.slot(self, pos);
        if let Some(e) = self.msgs.get_mut(pos) {
            e.set_epoch(epoch);
        }
    }

    /// Parks or unparks a FIFO group (and refreshes its readiness).
    pub(crate) fn set_parked(&mut self, gidx: u32, parked: Option<(u64, String)>, undo: &mut Undo) {
        undo.group(self, gidx);
        if let Some(f) = &mut self.fifo {
            if let Some(g) = f.groups.get_mut(&gidx) {
                g.parked = parked;
            }
            f.refresh(gidx, &self.msgs);
        }
    }

    /// FIFO: the index of a group, creating it if needed; 0 for a
    /// standard queue.
    pub(crate) fn group(&mut self, id: &str, undo: &mut Undo) -> u32 {
        let Some(f) = &self.fifo else { return 0 };
        if let Some(&i) = f.ids.get(id) {
            return i;
        }
        undo.group(self, f.next_index + 1);
        self.fifo.as_mut().map_or(0, |f| f.group_index(id))
    }

    /// The queue's counters, to change.
    pub(crate) fn counters_mut(&mut self, undo: &mut Undo) -> &mut QueueCounters {
        undo.queue(self);
        &mut self.counters
    }

    /// Indexes a client-chosen message id at a position.
    pub(crate) fn set_client_id(&mut self, id: &str, pos: u64, undo: &mut Undo) {
        undo.client_id(self, id);
        self.client_ids.insert(id.to_string(), pos);
    }

    /// Forgets a client-chosen message id.
    pub(crate) fn forget_client_id(&mut self, id: &str, undo: &mut Undo) {
        if self.client_ids.contains_key(id) {
            undo.client_id(self, id);
            self.client_ids.remove(id);
        }
    }

    /// FIFO: remembers a dedup key for the message `id` until `until`.
    pub(crate) fn remember_dedup(&mut self, key: &[u8], id: &str, until: u64, undo: &mut Undo) {
        undo.dedup(self, key);
        if let Some(f) = &mut self.fifo {
            if let Some((_, old)) = f.dedup.insert(key.to_vec(), (id.to_string(), until)) {
                f.dedup_expiry.remove(&(old, key.to_vec()));
            }
            f.dedup_expiry.insert((until, key.to_vec()));
        }
    }

    /// FIFO: the dedup key `key` whose window ends at `at` runs out; true
    /// when its entry was forgotten (not remembered again since).
    pub(crate) fn forget_dedup(&mut self, at: u64, key: &[u8], undo: &mut Undo) -> bool {
        undo.dedup(self, key);
        let Some(f) = &mut self.fifo else {
            return false;
        };
        f.dedup_expiry.remove(&(at, key.to_vec()));
        if f.dedup.get(key).is_some_and(|(_, until)| *until == at) {
            f.dedup.remove(key);
            return true;
        }
        false
    }

    /// Messages deliverable now (FIFO: visible, unleased, not parked).
    pub(crate) fn ready_count(&self) -> u64 {
        match &self.fifo {
            None => self.ready.len(),
            Some(f) => (self.msgs.len() as u64)
                .saturating_sub(self.leased + self.delayed + f.parked_messages(&self.msgs)),
        }
    }

    /// The position of the oldest message deliverable now: standard, the
    /// first ready one; FIFO, the first of the heads of the groups that
    /// can deliver (not parked, nothing leased, head visible).
    pub(crate) fn oldest_ready_pos(&self) -> Option<u64> {
        match &self.fifo {
            None => self.ready.min(),
            Some(f) => f
                .ready
                .iter()
                .filter_map(|&(_, gidx)| f.groups.get(&gidx)?.msgs.first().copied())
                .min(),
        }
    }

    /// Up to `max` positions a receive may lease now, in delivery order,
    /// stopping when `budget` bytes are used (at least one is taken).
    /// Standard: ready messages by position. FIFO: from each ready group
    /// in rotation, its consecutive visible messages from the head, at
    /// most `per_group` of them (0: no cap).
    pub(crate) fn deliverable(
        &self,
        max: usize,
        mut budget: u64,
        per_message: u64,
        per_group: usize,
    ) -> Vec<u64> {
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
                    let size = self.msgs.get(pos).map_or(0, |e| e.size());
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
                    let cap = if per_group == 0 {
                        usize::MAX
                    } else {
                        per_group
                    };
                    for &pos in g.msgs.iter().take(cap) {
                        match self.msgs.get(pos) {
                            Some(e) if e.state() == EntryState::Ready => {
                                if !take(pos, e.size(), &mut out) {
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
                // Expiry not in position order: it must still come out sorted.
                let e = Entry::new(
                    state,
                    if state == EntryState::Ready {
                        0
                    } else {
                        10_000 - pos * 7
                    },
                    1_000_000 - (pos % 13) * 1000,
                    (pos % 3) as u32,
                    100,
                    (pos % 4) as u32,
                );
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
                one.add(pos, e, pid, &mut t1, &mut Undo::default());
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
        q.add(last.0, last.1, last.2, &mut t, &mut Undo::default());
        q.add_all(es, &mut t);
        assert_eq!(q.msgs.len(), 500);
        assert_eq!(q.expiry.len(), 500);
    }

    /// The entry map is most of the index memory per queued message
    /// (BENCHMARKS.md, "Scale"): an entry stays within 24 bytes.
    #[test]
    fn an_entry_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
    }

    #[test]
    fn an_entry_gives_back_every_field_it_was_given() {
        let states = [EntryState::Ready, EntryState::Delayed, EntryState::Leased];
        for (i, &state) in states.iter().enumerate() {
            for group in [0, 1, 0xffff, 0x1_0000, 0xdead_beef, u32::MAX] {
                let i = i as u64;
                let (due, expires_at) = (1_764_590_000_000 + i, TIME_MAX - i);
                let size = (256 << 20) - u32::try_from(i).expect("0 to 2");
                let mut e = Entry::new(state, due, expires_at, u32::MAX - 7, size, group);
                assert_eq!(
                    (e.state(), e.due(), e.expires_at()),
                    (state, due, expires_at)
                );
                assert_eq!(
                    (e.epoch(), e.size(), e.group()),
                    (u32::MAX - 7, size, group)
                );
                // Setting one field leaves the others as they were.
                e.set_state(EntryState::Ready);
                e.set_due(7);
                e.set_epoch(3);
                assert_eq!((e.state(), e.due(), e.epoch()), (EntryState::Ready, 7, 3));
                assert_eq!(
                    (e.expires_at(), e.size(), e.group()),
                    (expires_at, size, group)
                );
            }
        }
        // Instants past the year 10889 are kept as that, not wrapped.
        let e = Entry::new(EntryState::Leased, u64::MAX, u64::MAX, 0, 1, 9);
        assert_eq!(
            (e.due(), e.expires_at(), e.group()),
            (TIME_MAX, TIME_MAX, 9)
        );
        assert_eq!(e.state(), EntryState::Leased);
    }

    #[test]
    fn remove_gives_back_the_payload_number_and_forgets_it() {
        let mut q = queue(QueueKind::Standard);
        let mut t = Timers::new();
        q.add_all(entries(), &mut t);
        for (pos, _, pid) in entries() {
            let (_, got) = q
                .remove(pos, &mut t, &mut Undo::default())
                .expect("present");
            assert_eq!(got, pid, "position {pos}");
        }
        assert!(q.pids.is_empty() && q.msgs.is_empty() && q.ready.is_empty());
        assert!(q.expiry.is_empty() && t.is_empty());
    }
}
