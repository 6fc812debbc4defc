//! Rebuilding the in-memory indexes from the store at start.
//!
//! The load reads a [`LoadSource`]: the local database as the log's replay
//! left it (`storage::Reader`, on a thread of its own while the local
//! store counts its payload pointers), or any backend in key order, in
//! pages of `Backend::scan` (`storage::Paged`). Both give the same state.
//!
//! Leases are kept with their deadlines; one that ran out while the server
//! was down is expired by the first sweep, counting as a failed attempt.
//! Messages of queues that no longer exist (a delete cut short by a crash)
//! are deleted.

use crate::storage::records::{
    AnnotationsRecord, CountersRecord, DedupRecord, ExchangeRecord, GroupRecord, QueueRecord,
};
use crate::storage::{Key, LoadSource, OwnedKey, Space, SysKey, Txn};

use super::State;
use super::error::Result;
use super::persist;
use super::state::{Entry, EntryState, QueueState};

/// One queue's entries gathered at start: its number, and for each
/// message its position, its entry and its payload number.
type QueueBatch = (u32, Vec<(u64, Entry, u64)>);

/// The indexes, and the deletions of records left by queues deleted
/// before the last stop (to submit once the store runs).
pub(crate) fn load<S: LoadSource>(store: &S, now: u64) -> Result<(State, Txn)> {
    let mut st = State::default();
    for item in store.scan::<QueueRecord>(Space::Queues) {
        let (key, rec) = item?;
        let OwnedKey::Queue(name) = key else { continue };
        let config = persist::queue_config(&name, &rec)?;
        if let Some(dl) = &config.dead_letter {
            st.dlq_sources
                .entry(dl.queue.clone())
                .or_default()
                .insert(name.clone());
        }
        st.names.insert(name.clone(), rec.qid);
        st.next_qid = st.next_qid.max(rec.qid + 1);
        st.queues.insert(
            rec.qid,
            QueueState::new(rec.qid, name, config, rec.created_at),
        );
    }
    for item in store.scan::<CountersRecord>(Space::Counters) {
        let (key, rec) = item?;
        if let OwnedKey::Counters(qid) = key
            && let Some(q) = st.queues.get_mut(&qid)
        {
            q.counters = (&rec).into();
        }
    }
    for item in store.scan::<ExchangeRecord>(Space::Exchanges) {
        let (key, rec) = item?;
        if let OwnedKey::Exchange(name) = key {
            let x = super::exchange::ExchangeState {
                created_at: rec.created_at,
                bindings: rec.bindings.into_iter().collect(),
            };
            st.exchanges.insert(name, x);
        }
    }
    let mut cleanup = Txn::new();
    for item in store.scan::<AnnotationsRecord>(Space::Annotations) {
        let (key, rec) = item?;
        let OwnedKey::Annotations(qid) = key else {
            continue;
        };
        match st.queues.get_mut(&qid) {
            Some(q) => q.annotations = rec.pairs,
            None => cleanup.delete(Key::Annotations(qid)),
        }
    }
    for item in store.scan::<GroupRecord>(Space::Groups) {
        let (key, rec) = item?;
        let OwnedKey::Group(qid, group) = key else {
            continue;
        };
        match st.queues.get_mut(&qid).and_then(|q| q.fifo.as_mut()) {
            Some(f) => {
                let gidx = f.group_index(&group);
                if let Some(g) = f.groups.get_mut(&gidx) {
                    g.parked = Some((rec.parked_at, rec.reason));
                }
            }
            None => cleanup.delete(Key::Group(qid, &group)),
        }
    }
    let mut max_pos = 0u64;
    // The entries of one queue (keys come in queue, then position order),
    // added together once the scan leaves the queue.
    let mut batch: Option<QueueBatch> = None;
    let flush = |st: &mut State, batch: &mut Option<QueueBatch>| {
        if let Some((qid, entries)) = batch.take()
            && let Some(q) = st.queues.get_mut(&qid)
        {
            q.add_all(entries, &mut st.timers);
        }
    };
    for item in persist::scan(store) {
        let (key, meta) = item?;
        let OwnedKey::Meta(qid, pos) = key else {
            continue;
        };
        max_pos = max_pos.max(pos);
        let Some(q) = st.queues.get_mut(&qid) else {
            cleanup.delete(Key::Meta(qid, pos));
            cleanup.delete(Key::Payload(meta.pid()));
            continue;
        };
        let (state, due) = match meta.current_lease() {
            Some(l) => (EntryState::Leased, l.deadline),
            None if meta.visible_at() > now => (EntryState::Delayed, meta.visible_at()),
            None => (EntryState::Ready, 0),
        };
        let group = match &mut q.fifo {
            Some(f) => f.group_index(meta.group().unwrap_or("")),
            None => 0,
        };
        if meta.client_id() {
            q.client_ids.insert(meta.id().to_string(), pos);
        }
        let entry = Entry::new(
            state,
            due,
            meta.expires_at(),
            meta.delivery_count(),
            meta.size(),
            group,
        );
        if batch.as_ref().is_some_and(|(b, _)| *b != qid) {
            flush(&mut st, &mut batch);
        }
        batch
            .get_or_insert_with(|| (qid, Vec::new()))
            .1
            .push((pos, entry, meta.pid()));
    }
    flush(&mut st, &mut batch);
    for item in store.scan::<DedupRecord>(Space::Dedups) {
        let (key, rec) = item?;
        let OwnedKey::Dedup(qid, k) = key else {
            continue;
        };
        match st.queues.get_mut(&qid).and_then(|q| q.fifo.as_mut()) {
            Some(f) if rec.expires_at > now => {
                f.dedup_expiry.insert((rec.expires_at, k.clone()));
                f.dedup.insert(k, (rec.message_id, rec.expires_at));
            }
            _ => cleanup.delete(Key::Dedup(qid, &k)),
        }
    }
    // Parked groups that lost all their messages are still listed (an
    // operator releases them); groups created above for messages are
    // refreshed by `add`.
    let reserved = store.get_sys(SysKey::PosReserved)?.unwrap_or(0);
    st.next_pos = reserved.max(max_pos + 1).max(1);
    // Force a fresh reservation on the first allocation.
    st.pos_reserved = st.next_pos;
    let next_qid = store.get_sys(SysKey::NextQid)?.unwrap_or(0);
    st.next_qid = st
        .next_qid
        .max(u32::try_from(next_qid).unwrap_or(u32::MAX))
        .max(1);
    Ok((st, cleanup))
}
