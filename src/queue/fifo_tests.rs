//! Property test of FIFO groups: several consumers interleave receives,
//! acks, nacks and lease expiries (and the engine restarts); a checker
//! verifies after every receive that no group is leased to two holders at
//! once and that every delivered message's predecessors in its group are
//! gone (acked or dead-lettered) or delivered just before it in the same
//! receive.
//!
//! Each consumer settles what it holds in the order it received it, and
//! goes on acking the rest of a batch after a nack, as a naive consumer
//! does. A model predicts which of its tokens the engine released (a
//! failure of an earlier message of the group, SPEC §3) and how many
//! failed attempts each message had; the checker verifies every settle
//! outcome against it, both counts of every delivery (its deliveries, a
//! release included, and its failed attempts, a release not included),
//! that the messages of each group are acknowledged in publish order
//! (minus the dead-lettered ones), and that only messages that failed
//! `max_deliveries` times reach the DLQ.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::model::*;
use super::*;
use crate::clock::ManualClock;
use crate::storage::{Store, StoreOptions};

const T0: u64 = 1_700_000_000_000;
const ACK_TIMEOUT: u64 = 5_000;
const GROUPS: u8 = 4;
const CONSUMERS: u8 = 4;

#[derive(Debug, Clone)]
enum Op {
    Publish { group: u8, n: u8 },
    Receive { consumer: u8, max: u8 },
    Ack { consumer: u8 },
    Nack { consumer: u8 },
    Advance(u64),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..GROUPS, 1u8..4).prop_map(|(group, n)| Op::Publish { group, n }),
        6 => (0..CONSUMERS, 1u8..4).prop_map(|(consumer, max)| Op::Receive { consumer, max }),
        5 => (0..CONSUMERS).prop_map(|consumer| Op::Ack { consumer }),
        3 => (0..CONSUMERS).prop_map(|consumer| Op::Nack { consumer }),
        2 => (0u64..8_000).prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

/// A delivery a consumer holds.
#[derive(Debug, Clone)]
struct Held {
    token: String,
    group: u8,
    seq: u64,
    deadline: u64,
    /// Predicted released by the failure of an earlier message.
    released: bool,
}

/// The model's side of a failure of `(group, seq)`: one more failed
/// attempt for it, and every later message of its group still held (by
/// anyone) is released.
fn fail(held: &mut [Vec<Held>], failures: &mut HashMap<(u8, u64), u32>, group: u8, seq: u64) {
    *failures.entry((group, seq)).or_default() += 1;
    for h in held.iter_mut().flatten() {
        if h.group == group && h.seq > seq {
            h.released = true;
        }
    }
}

fn open(dir: &Path, clock: &Arc<ManualClock>) -> Broker {
    let opts = StoreOptions {
        segment_size: 256 << 10,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let (store, _) = Store::open(dir, opts).expect("store opens");
    Broker::open(store, clock.clone(), BrokerOptions::default()).expect("broker opens")
}

fn parse(body: &[u8]) -> (u8, u64) {
    let s = String::from_utf8_lossy(body);
    let (g, n) = s.split_once('-').expect("g-n");
    (g.parse().expect("group"), n.parse().expect("seq"))
}

async fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let mut broker = Some(open(dir.path(), &clock));
    let fifo = |extra: QueueConfigInput| QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ack_timeout: Some(ACK_TIMEOUT),
        ..extra
    };
    let b = broker.as_ref().expect("open");
    b.create_queue("fdlq", &fifo(QueueConfigInput::default()))
        .await
        .expect("dlq");
    let cfg = fifo(QueueConfigInput {
        dead_letter: Some(DeadLetterInput::new("fdlq", 3)),
        ..QueueConfigInput::default()
    });
    b.create_queue("f", &cfg).await.expect("queue");

    let mut next_seq = [0u64; GROUPS as usize];
    // (group, seq) of messages acked, and of messages published.
    let mut acked: BTreeSet<(u8, u64)> = BTreeSet::new();
    let mut published: BTreeMap<u8, u64> = BTreeMap::new();
    // Failed attempts per message, as the model counts them.
    let mut failures: HashMap<(u8, u64), u32> = HashMap::new();
    // Deliveries per message.
    let mut deliveries: HashMap<(u8, u64), u32> = HashMap::new();
    let dead_lettered = |b: &Broker| -> BTreeSet<(u8, u64)> {
        b.browse("fdlq", 1000, "")
            .expect("browse")
            .messages
            .iter()
            .map(|m| parse(&m.body))
            .collect()
    };
    let mut held: Vec<Vec<Held>> = vec![Vec::new(); CONSUMERS as usize];
    for op in ops {
        let b = broker.as_ref().expect("open");
        let now = clock.now_ms();
        match op {
            Op::Publish { group, n } => {
                let msgs = (0..n)
                    .map(|_| {
                        let seq = next_seq[group as usize];
                        next_seq[group as usize] += 1;
                        NewMessage {
                            body: Bytes::from(format!("{group}-{seq}")),
                            group_id: Some(format!("g{group}")),
                            ..NewMessage::default()
                        }
                    })
                    .collect();
                b.publish("f", msgs).await.expect("publish");
                published.insert(group, next_seq[group as usize]);
            }
            Op::Receive { consumer, max } => {
                let opts = ReceiveOptions {
                    max_messages: u32::from(max),
                    ..ReceiveOptions::default()
                };
                let got = b.receive("f", opts).await.expect("receive");
                let gone: BTreeSet<(u8, u64)> = b
                    .browse("fdlq", 1000, "")
                    .expect("browse")
                    .messages
                    .iter()
                    .map(|m| parse(&m.body))
                    .chain(acked.iter().copied())
                    .collect();
                let mut in_batch: BTreeSet<(u8, u64)> = BTreeSet::new();
                for d in &got {
                    let (g, seq) = parse(&d.body);
                    // Nobody holds a live lease of this group.
                    for (c, list) in held.iter().enumerate() {
                        for h in list {
                            prop_assert!(
                                !(h.group == g && h.deadline > now && !h.released),
                                "group {} delivered while consumer {} holds {}-{}",
                                g,
                                c,
                                h.group,
                                h.seq
                            );
                        }
                    }
                    // Every predecessor is gone or earlier in this batch.
                    for p in 0..seq {
                        prop_assert!(
                            gone.contains(&(g, p)) || in_batch.contains(&(g, p)),
                            "{}-{} delivered before {}-{} was acked or dead-lettered",
                            g,
                            seq,
                            g,
                            p
                        );
                    }
                    in_batch.insert((g, seq));
                    // Every delivery counts, a released one included; only
                    // failures count as failed attempts.
                    let n = deliveries.entry((g, seq)).or_default();
                    *n += 1;
                    prop_assert_eq!(d.delivery_count, *n, "{}-{} deliveries", g, seq);
                    prop_assert_eq!(
                        d.failed_attempts,
                        failures.get(&(g, seq)).copied().unwrap_or(0),
                        "{}-{} failed attempts",
                        g,
                        seq
                    );
                }
                for d in got {
                    let (group, seq) = parse(&d.body);
                    held[consumer as usize].push(Held {
                        token: d.ack_token.expect("token"),
                        group,
                        seq,
                        deadline: d.lease_deadline,
                        released: false,
                    });
                }
            }
            Op::Ack { consumer } | Op::Nack { consumer } => {
                // The consumer settles the first delivery it holds.
                let list = &mut held[consumer as usize];
                if list.is_empty() {
                    continue;
                }
                let h = list.remove(0);
                let live = h.deadline > now;
                let is_ack = matches!(op, Op::Ack { .. });
                let settled = if is_ack {
                    b.ack(&[h.token]).await.expect("ack").remove(0)
                } else {
                    let n = Nack {
                        token: h.token,
                        delay: None,
                        reason: String::new(),
                        dead_letter: false,
                    };
                    b.nack(&[n]).await.expect("nack").remove(0)
                };
                // A released token settles nothing and says so (once the
                // message has left the queue, acked after its redelivery
                // or dead-lettered, its record is gone and the token is
                // only known to be stale); a live lease is current
                // (nothing can re-lease it before it runs out or is
                // released) and settles.
                if h.released {
                    let gone = acked.contains(&(h.group, h.seq))
                        || dead_lettered(b).contains(&(h.group, h.seq));
                    prop_assert!(
                        matches!(settled, Settled::Released(_))
                            || (gone && matches!(settled, Settled::LeaseExpired(_))),
                        "{}-{}: a released token gave {:?}",
                        h.group,
                        h.seq,
                        settled
                    );
                    continue;
                }
                let ok = matches!(settled, Settled::Ok { .. });
                prop_assert_eq!(ok, live, "settling a lease that is live: {}", live);
                if !ok {
                    continue;
                }
                if is_ack {
                    // Acknowledged in publish order: every earlier message
                    // of the group was acked or dead-lettered before.
                    let dl = dead_lettered(b);
                    for p in 0..h.seq {
                        prop_assert!(
                            acked.contains(&(h.group, p)) || dl.contains(&(h.group, p)),
                            "{}-{} acked before {}-{} was acked or dead-lettered",
                            h.group,
                            h.seq,
                            h.group,
                            p
                        );
                    }
                    acked.insert((h.group, h.seq));
                } else {
                    fail(&mut held, &mut failures, h.group, h.seq);
                }
            }
            Op::Advance(ms) => {
                clock.advance(ms);
                b.run_timers().await.expect("timers");
                let now = clock.now_ms();
                // Of the leases that ran out, the earliest of each group
                // failed; it released the later ones.
                let mut ran_out: BTreeSet<(u8, u64)> = BTreeSet::new();
                for h in held.iter().flatten() {
                    if h.deadline <= now && !h.released {
                        ran_out.insert((h.group, h.seq));
                    }
                }
                let mut seen = BTreeSet::new();
                for (g, seq) in ran_out {
                    if seen.insert(g) {
                        fail(&mut held, &mut failures, g, seq);
                    }
                }
                for list in &mut held {
                    list.retain(|h| h.deadline > now);
                }
            }
            Op::Restart => {
                let b = broker.take().expect("open");
                b.close().expect("close");
                broker = Some(open(dir.path(), &clock));
            }
        }
    }
    // Only messages that failed max_deliveries times were dead-lettered,
    // with that count: releases did not count as failures, but as
    // deliveries.
    let b = broker.as_ref().expect("open");
    for m in b.browse("fdlq", 1000, "").expect("browse").messages {
        let (g, seq) = parse(&m.body);
        prop_assert_eq!(m.dead_letters[0].failed_attempts, 3);
        prop_assert_eq!(
            m.dead_letters[0].delivery_count,
            deliveries.get(&(g, seq)).copied().unwrap_or(0),
            "{}-{} deliveries",
            g,
            seq
        );
        prop_assert_eq!(failures.get(&(g, seq)).copied(), Some(3), "{}-{}", g, seq);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn fifo_groups_keep_order_and_exclusive_leases(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(run(ops))?;
    }
}
