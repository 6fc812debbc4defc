//! All or nothing (the module docs, `undo.rs`): an operation that fails
//! after it changed the indexes leaves them exactly as they were.
//!
//! Each case makes the read of one message's record fail
//! (`faults::fail_reads`) in the middle of an operation: a batch ack, a
//! nack, a dead-letter move, a redrive step, a sweep of run-out leases, a
//! skip of a parked group's head. The operation fails; afterwards the
//! queues' indexes are what they were before it (described in full), their
//! figures and counters equal a recount from the store, a crash and
//! restart changes nothing, and the same operation without the fault
//! succeeds. A property test runs random transitions of the indexes and
//! puts them back.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::model::*;
use super::redrive::RedriveSpec;
use super::state::{Entry, EntryState, QueueState};
use super::*;
use crate::clock::ManualClock;
use crate::faults::{self, FailingRead};
use crate::storage::records::{self, CountersRecord};
use crate::storage::{Key, OwnedKey, Paged, Store, StoreOptions};

const T0: u64 = 1_700_000_000_000;

struct Env {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    broker: Option<Broker>,
}

fn open(dir: &Path, clock: &Arc<ManualClock>) -> Broker {
    let opts = StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let (store, _) = Store::open(dir, opts).expect("store opens");
    Broker::open(store, clock.clone(), BrokerOptions::default()).expect("broker opens")
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(T0));
        let broker = Some(open(dir.path(), &clock));
        Env { dir, clock, broker }
    }

    fn b(&self) -> &Broker {
        self.broker.as_ref().expect("open")
    }

    /// Stops like a crash (no final apply or checkpoint) and reopens.
    fn crash(&mut self) {
        if let Some(b) = self.broker.take() {
            b.store.crash();
        }
        self.broker = Some(open(self.dir.path(), &self.clock));
    }

    async fn create(&self, name: &str, input: QueueConfigInput) {
        self.b().create_queue(name, &input).await.expect("create");
    }

    /// Publishes messages whose ids are `ids` (client-chosen), each its
    /// own body, in `group` (FIFO) if given.
    async fn publish(&self, q: &str, ids: &[&str], group: Option<&str>) {
        let msgs = ids
            .iter()
            .map(|id| NewMessage {
                message_id: Some(id.to_string()),
                body: Bytes::copy_from_slice(id.as_bytes()),
                group_id: group.map(str::to_string),
                ..NewMessage::default()
            })
            .collect();
        self.b().publish(q, msgs).await.expect("publish");
    }

    async fn receive(&self, q: &str, n: u32) -> Vec<Delivery> {
        let opts = ReceiveOptions {
            max_messages: n,
            ..ReceiveOptions::default()
        };
        self.b().receive(q, opts).await.expect("receive")
    }

    /// Makes the reads of message `id`'s record in `queue` fail.
    fn fail_read_of(&self, queue: &str, id: &str) -> FailingRead {
        let qid = self.b().lock().qid(queue).expect("queue");
        let page = self.b().browse(queue, 1000, "").expect("browse");
        let pos = page
            .messages
            .iter()
            .find(|m| m.message_id == id)
            .map(|m| m.position)
            .expect("the message is in the queue");
        faults::fail_reads(Key::Meta(qid, pos).encode().to_vec())
    }

    /// The indexes of these queues, in full.
    fn indexes(&self, queues: &[&str]) -> String {
        let st = self.b().lock();
        let mut out = format!("next_pos {} reserved {}\n", st.next_pos, st.pos_reserved);
        for name in queues {
            let qid = st.qid(name).expect("queue");
            out.push_str(&describe(&st, qid));
        }
        out
    }

    /// What a client sees of these queues: each one's figures and its
    /// messages with their state and both counts.
    fn seen(&self, queues: &[&str]) -> String {
        let mut out = String::new();
        for name in queues {
            let s = self.b().stats(name).expect("stats");
            out.push_str(&format!("{name}: {s:?}\n"));
            for m in self.b().browse(name, 1000, "").expect("browse").messages {
                out.push_str(&format!(
                    "  {} {:?} deliveries {} failed {} lease {}\n",
                    m.message_id, m.state, m.delivery_count, m.failed_attempts, m.lease_deadline
                ));
            }
        }
        out
    }

    /// A queue's figures and counters against a recount of what the
    /// store holds.
    fn recount(&self, queue: &str) {
        let b = self.b();
        let qid = b.lock().qid(queue).expect("queue");
        let now = self.clock.now_ms();
        let (mut total, mut leased, mut delayed) = (0u64, 0u64, 0u64);
        for item in persist::scan(&Paged::new(b.store().backend(), 256)) {
            let (key, m) = item.expect("a stored record");
            if !matches!(key, OwnedKey::Meta(q, _) if q == qid) {
                continue;
            }
            total += 1;
            if m.current_lease().is_some() {
                leased += 1;
            } else if m.visible_at() > now {
                delayed += 1;
            }
        }
        let stored: CountersRecord = match b.store().get(&Key::Counters(qid)).expect("read") {
            Some(bytes) => records::decode(&"counters", &bytes).expect("decodes"),
            None => CountersRecord::default(),
        };
        let s = b.stats(queue).expect("stats");
        assert_eq!(
            (s.total, s.in_flight, s.delayed, s.counters),
            (total, leased, delayed, QueueCounters::from(&stored)),
            "{queue}: the figures in memory against the store's"
        );
    }

    /// After a failed operation: the indexes are `before`, the figures
    /// equal a recount of the store, and a crash and restart shows the
    /// same.
    fn check_unchanged(&mut self, queues: &[&str], before: &str) {
        assert_eq!(self.indexes(queues), before, "the indexes went back");
        for q in queues {
            self.recount(q);
        }
        let seen = self.seen(queues);
        self.crash();
        assert_eq!(self.seen(queues), seen, "a restart changes nothing");
    }
}

/// Every index of a queue, in a fixed order: entries, payload numbers,
/// ready set, expiry order, client ids, counts, counters, its timers, and
/// for a FIFO queue its groups, rotation, numbering and dedup entries.
pub(super) fn describe(st: &State, qid: u32) -> String {
    let Some(q) = st.queues.get(&qid) else {
        return format!("queue {qid}: none\n");
    };
    let mut out = format!("queue {} ({qid})\n", q.name);
    for (pos, e) in q.msgs.range(..) {
        out.push_str(&format!(
            "  {pos}: {e:?} pid {} rising {}\n",
            q.pids.get(&pos).copied().unwrap_or(pos),
            q.expiry.is_rising(pos)
        ));
    }
    out.push_str(&format!(
        "  ready {:?}\n",
        q.ready.iter().collect::<Vec<_>>()
    ));
    out.push_str(&format!(
        "  expiry {:?} last {:?}\n",
        q.expiry.iter(&q.msgs).collect::<Vec<_>>(),
        q.expiry.last()
    ));
    let mut ids: Vec<_> = q.client_ids.iter().collect();
    ids.sort();
    out.push_str(&format!("  client ids {ids:?}\n"));
    out.push_str(&format!(
        "  leased {} delayed {} {:?}\n",
        q.leased, q.delayed, q.counters
    ));
    let timers: Vec<_> = st.timers.iter().filter(|t| t.1 == qid).collect();
    out.push_str(&format!("  timers {timers:?}\n"));
    if let Some(f) = &q.fifo {
        let mut groups: Vec<_> = f.groups.iter().collect();
        groups.sort_by_key(|(i, _)| **i);
        for (i, g) in groups {
            out.push_str(&format!(
                "  group {i} {:?} {:?} leased {} parked {:?} key {:?}\n",
                g.id, g.msgs, g.leased, g.parked, g.ready_key
            ));
        }
        let mut gids: Vec<_> = f.ids.iter().collect();
        gids.sort();
        let mut dedup: Vec<_> = f.dedup.iter().collect();
        dedup.sort();
        out.push_str(&format!(
            "  ids {gids:?} rotation {:?} next {} {}\n  dedup {dedup:?} {:?}\n",
            f.ready, f.next_index, f.next_ready, f.dedup_expiry
        ));
    }
    out
}

fn token(d: &Delivery) -> String {
    d.ack_token.clone().expect("token")
}

fn nack(d: &Delivery) -> Nack {
    Nack {
        token: token(d),
        delay: None,
        reason: "no".into(),
        dead_letter: false,
    }
}

fn with_dlq(dlq: &str, max: u32) -> QueueConfigInput {
    QueueConfigInput {
        dead_letter: Some(DeadLetterInput::new(dlq, max)),
        ack_timeout: Some(10 * SECOND),
        ..QueueConfigInput::default()
    }
}

#[tokio::test]
async fn a_batch_ack_whose_second_record_does_not_read_changes_nothing() {
    let mut env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    // Client-chosen ids: an ack reads each record to forget its id.
    env.publish("q", &["a", "b", "c"], None).await;
    let got = env.receive("q", 3).await;
    let tokens: Vec<String> = got.iter().map(token).collect();
    let before = env.indexes(&["q"]);
    let failing = env.fail_read_of("q", "b");
    let e = env
        .b()
        .ack(&tokens)
        .await
        .expect_err("a record did not read");
    assert!(e.to_string().contains("injected read failure"), "{e}");
    assert_eq!(failing.hits(), 1);
    drop(failing);
    env.check_unchanged(&["q"], &before);
    // The tokens are still good: the same acks now succeed.
    let r = env.b().ack(&tokens).await.expect("ack");
    assert!(r.iter().all(|s| matches!(s, Settled::Ok { .. })), "{r:?}");
    assert_eq!(env.b().stats("q").expect("stats").total, 0);
}

#[tokio::test]
async fn a_nack_whose_second_record_does_not_read_changes_nothing() {
    let mut env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["a", "b"], None).await;
    let got = env.receive("q", 2).await;
    let items: Vec<Nack> = got.iter().map(nack).collect();
    let before = env.indexes(&["q"]);
    let failing = env.fail_read_of("q", "b");
    env.b()
        .nack(&items)
        .await
        .expect_err("a record did not read");
    assert_eq!(failing.hits(), 1);
    drop(failing);
    env.check_unchanged(&["q"], &before);
    let r = env.b().nack(&items).await.expect("nack");
    assert!(r.iter().all(|s| matches!(s, Settled::Ok { .. })), "{r:?}");
    let s = env.b().stats("q").expect("stats");
    assert_eq!((s.ready, s.counters.nacked), (2, 2));
}

#[tokio::test]
async fn a_dead_letter_move_undone_by_a_failed_read_leaves_both_queues() {
    let mut env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 1)).await;
    env.publish("q", &["a", "b"], None).await;
    let got = env.receive("q", 2).await;
    // a's nack moves it to the DLQ (max 1), then b's record does not read.
    let items: Vec<Nack> = got.iter().map(nack).collect();
    let before = env.indexes(&["q", "dlq"]);
    let failing = env.fail_read_of("q", "b");
    env.b()
        .nack(&items)
        .await
        .expect_err("a record did not read");
    assert_eq!(failing.hits(), 1);
    drop(failing);
    env.check_unchanged(&["q", "dlq"], &before);
    env.b().nack(&items).await.expect("nack");
    let (q, dlq) = (
        env.b().stats("q").expect("stats"),
        env.b().stats("dlq").expect("stats"),
    );
    assert_eq!((q.total, q.counters.dead_lettered, dlq.total), (0, 2, 2));
    env.recount("q");
    env.recount("dlq");
}

#[tokio::test]
async fn a_redrive_step_undone_by_a_failed_read_moves_nothing() {
    let mut env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 1)).await;
    env.publish("q", &["a", "b", "c"], None).await;
    let got = env.receive("q", 3).await;
    let items: Vec<Nack> = got.iter().map(nack).collect();
    env.b().nack(&items).await.expect("nack");
    let spec = RedriveSpec {
        dlq: "dlq".into(),
        ..RedriveSpec::default()
    };
    let end = env.b().start_redrive(&spec).expect("start");
    let before = env.indexes(&["q", "dlq"]);
    // a moves back, then b's record does not read.
    let failing = env.fail_read_of("dlq", "b");
    env.b()
        .redrive_step(&spec, 0, end, 512, u64::MAX)
        .await
        .expect_err("a record did not read");
    assert_eq!(failing.hits(), 1);
    drop(failing);
    env.check_unchanged(&["q", "dlq"], &before);
    let end = env.b().start_redrive(&spec).expect("start");
    let step = env
        .b()
        .redrive_step(&spec, 0, end, 512, u64::MAX)
        .await
        .expect("redrive");
    assert_eq!(step.moved, 3);
    env.recount("q");
    env.recount("dlq");
}

#[tokio::test]
async fn a_sweep_undone_by_a_failed_read_ends_no_lease() {
    let mut env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["a", "b", "c"], None).await;
    env.receive("q", 3).await;
    // Past the leases (the default ack timeout, 2 minutes); the sweep ends
    // a's lease, then b's record does not read.
    env.clock.advance(3 * MINUTE);
    let before = env.indexes(&["q"]);
    let failing = env.fail_read_of("q", "b");
    env.b()
        .run_timers()
        .await
        .expect_err("a record did not read");
    assert_eq!(failing.hits(), 1);
    drop(failing);
    env.check_unchanged(&["q"], &before);
    env.b().run_timers().await.expect("sweep");
    let s = env.b().stats("q").expect("stats");
    assert_eq!((s.ready, s.in_flight, s.counters.nacked), (3, 0, 3));
}

#[tokio::test]
async fn a_skip_undone_by_a_failed_read_leaves_its_group_parked() {
    let mut env = Env::new();
    let fifo = |extra: QueueConfigInput| QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ..extra
    };
    env.create("dlq", fifo(QueueConfigInput::default())).await;
    env.create(
        "f",
        fifo(QueueConfigInput {
            on_poison: Some(PoisonPolicy::ParkGroup),
            ..with_dlq("dlq", 1)
        }),
    )
    .await;
    env.publish("f", &["p", "q"], Some("g")).await;
    let d = env.receive("f", 1).await.remove(0);
    env.b().nack(&[nack(&d)]).await.expect("nack");
    assert_eq!(env.b().stats("f").expect("stats").parked, 2);
    let before = env.indexes(&["f", "dlq"]);
    // The skip unparks the group, then the head's record does not read.
    let failing = env.fail_read_of("f", "p");
    env.b()
        .skip_head("f", "g", "")
        .await
        .expect_err("a record did not read");
    assert!(failing.hits() >= 1);
    drop(failing);
    env.check_unchanged(&["f", "dlq"], &before);
    assert_eq!(env.b().stats("f").expect("stats").parked, 2);
    assert_eq!(env.b().skip_head("f", "g", "").await.expect("skip"), "p");
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(d.message_id, "q");
}

/// Acks riding on a receive whose pick then fails: the acks took effect
/// and are reported with the pick's error; the pick changed nothing.
#[tokio::test]
async fn a_pick_that_fails_after_the_riding_acks_reports_them() {
    let mut env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["a", "b"], None).await;
    let a = env.receive("q", 1).await.remove(0);
    let failing = env.fail_read_of("q", "b");
    let opts = ReceiveOptions {
        max_messages: 1,
        ..ReceiveOptions::default()
    };
    let r = env
        .b()
        .receive_acking("q", opts, &[token(&a)])
        .await
        .expect("the acks took effect");
    assert_eq!(failing.hits(), 1);
    drop(failing);
    assert_eq!(r.acks, [Settled::Ok { deadline: 0 }]);
    let e = r.received.expect_err("the pick failed");
    assert!(e.to_string().contains("injected read failure"), "{e}");
    // a is acked, b was not leased; so after a crash.
    env.recount("q");
    let seen = env.seen(&["q"]);
    assert!(seen.contains("b Ready deliveries 0"), "{seen}");
    assert!(!seen.contains(" a "), "{seen}");
    env.crash();
    assert_eq!(env.seen(&["q"]), seen);
    let s = env.b().stats("q").expect("stats");
    assert_eq!((s.total, s.ready, s.counters.acked), (1, 1, 1));
}

// ---- the undo of the transitions themselves ----------------------------

/// One transition of a queue's indexes, with its arguments.
#[derive(Debug, Clone)]
enum Op {
    Add {
        pos: u8,
        group: u8,
        state: u8,
        expires: u16,
    },
    Remove(u8),
    Lease {
        pos: u8,
        deadline: u16,
    },
    Release {
        pos: u8,
        visible: u16,
    },
    Visible(u8),
    Deadline {
        pos: u8,
        deadline: u16,
    },
    Epoch {
        pos: u8,
        epoch: u8,
    },
    Park {
        group: u8,
        on: bool,
    },
    ClientId {
        id: u8,
        pos: Option<u8>,
    },
    Dedup {
        key: u8,
        until: Option<u16>,
    },
    Count,
    Position,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, 0u8..4, 0u8..3, any::<u16>())
            .prop_map(|(pos, group, state, expires)| Op::Add { pos, group, state, expires }),
        3 => (0u8..24).prop_map(Op::Remove),
        2 => (0u8..24, any::<u16>()).prop_map(|(pos, deadline)| Op::Lease { pos, deadline }),
        2 => (0u8..24, any::<u16>()).prop_map(|(pos, visible)| Op::Release { pos, visible }),
        1 => (0u8..24).prop_map(Op::Visible),
        1 => (0u8..24, any::<u16>()).prop_map(|(pos, deadline)| Op::Deadline { pos, deadline }),
        1 => (0u8..24, any::<u8>()).prop_map(|(pos, epoch)| Op::Epoch { pos, epoch }),
        1 => (0u8..4, any::<bool>()).prop_map(|(group, on)| Op::Park { group, on }),
        1 => (0u8..6, proptest::option::of(0u8..24)).prop_map(|(id, pos)| Op::ClientId { id, pos }),
        1 => (0u8..6, proptest::option::of(any::<u16>())).prop_map(|(key, until)| Op::Dedup { key, until }),
        1 => Just(Op::Count),
        1 => Just(Op::Position),
    ]
}

/// Applies one transition to queue 1 of `st`, recorded in `st.undo`, as
/// the engine would (a lease of a ready message, a release of a leased
/// one, ...); a transition the state does not allow is skipped.
fn apply(st: &mut State, op: &Op, now: u64) {
    let State {
        queues,
        timers,
        undo,
        next_pos,
        pos_reserved,
        ..
    } = st;
    let Some(q) = queues.get_mut(&1) else { return };
    let state_of = |q: &QueueState, pos: u8| q.msgs.get(u64::from(pos)).map(|e| e.state());
    match *op {
        Op::Add {
            pos,
            group,
            state,
            expires,
        } => {
            if state_of(q, pos).is_some() {
                return;
            }
            let gidx = q.group(&format!("g{group}"), undo);
            let (state, due) = match state {
                0 => (EntryState::Ready, 0),
                1 => (EntryState::Delayed, now + 100),
                _ => (EntryState::Leased, now + 200),
            };
            let e = Entry::new(state, due, now + u64::from(expires), 1, 10, gidx);
            let pid = u64::from(pos) + u64::from(group % 2) * 1_000;
            q.add(u64::from(pos), e, pid, timers, undo);
        }
        Op::Remove(pos) => {
            q.remove(u64::from(pos), timers, undo);
        }
        Op::Lease { pos, deadline } => {
            if state_of(q, pos) == Some(EntryState::Ready) {
                q.lease(u64::from(pos), now + u64::from(deadline), 2, timers, undo);
            }
        }
        Op::Release { pos, visible } => {
            q.release(
                u64::from(pos),
                now + u64::from(visible) % 3,
                now + 1,
                timers,
                undo,
            );
        }
        Op::Visible(pos) => q.make_visible(u64::from(pos), timers, undo),
        Op::Deadline { pos, deadline } => {
            q.set_deadline(u64::from(pos), now + u64::from(deadline), timers, undo);
        }
        Op::Epoch { pos, epoch } => q.set_epoch(u64::from(pos), u32::from(epoch), undo),
        Op::Park { group, on } => {
            let Some(&gidx) = q
                .fifo
                .as_ref()
                .and_then(|f| f.ids.get(&format!("g{group}")))
            else {
                return;
            };
            q.set_parked(gidx, on.then(|| (now, "parked".to_string())), undo);
        }
        Op::ClientId { id, pos } => match pos {
            Some(pos) => q.set_client_id(&format!("id{id}"), u64::from(pos), undo),
            None => q.forget_client_id(&format!("id{id}"), undo),
        },
        Op::Dedup { key, until } => {
            let key = [key];
            match until {
                Some(until) => q.remember_dedup(&key, "m", now + u64::from(until), undo),
                None => {
                    let at = q
                        .fifo
                        .as_ref()
                        .and_then(|f| f.dedup.get(&key[..]).map(|(_, until)| *until));
                    if let Some(at) = at {
                        q.forget_dedup(at, &key, undo);
                    }
                }
            }
        }
        Op::Count => {
            let c = q.counters_mut(undo);
            c.acked += 1;
            c.nacked += 2;
        }
        Op::Position => {
            undo.positions(*next_pos, *pos_reserved);
            *next_pos += 1;
            *pos_reserved += 7;
        }
    }
}

fn queue_of(kind: QueueKind) -> State {
    let config = validate::new_config(&QueueConfigInput {
        kind: Some(kind),
        ..QueueConfigInput::default()
    })
    .expect("config");
    let mut st = State::default();
    st.names.insert("q".into(), 1);
    st.queues
        .insert(1, QueueState::new(1, "q".into(), config, T0));
    st.next_pos = 100;
    st.pos_reserved = 200;
    st
}

proptest! {
    /// Whatever the transitions of one operation, on a standard or a FIFO
    /// queue that already holds messages: putting them back gives the
    /// indexes as they were, every one of them.
    #[test]
    fn every_transition_is_put_back_exactly(
        fifo in any::<bool>(),
        earlier in proptest::collection::vec(op(), 0..40),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let kind = if fifo { QueueKind::Fifo } else { QueueKind::Standard };
        let mut st = queue_of(kind);
        // What earlier operations left, submitted.
        for op in &earlier {
            apply(&mut st, op, T0);
        }
        st.undo.clear();
        let before = (describe(&st, 1), st.next_pos, st.pos_reserved);
        for op in &ops {
            apply(&mut st, op, T0 + 10);
        }
        st.roll_back();
        prop_assert_eq!((describe(&st, 1), st.next_pos, st.pos_reserved), before);
    }
}
