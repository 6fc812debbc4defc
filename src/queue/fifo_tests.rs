//! Property test of FIFO groups: several consumers interleave receives,
//! acks, nacks and lease expiries (and the engine restarts); a checker
//! verifies after every receive that no group is leased to two holders at
//! once and that every delivered message's predecessors in its group are
//! gone (acked or dead-lettered) or delivered just before it in the same
//! receive.

use std::collections::{BTreeMap, BTreeSet};
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
    Ack { consumer: u8, k: usize },
    Nack { consumer: u8, k: usize },
    Advance(u64),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..GROUPS, 1u8..4).prop_map(|(group, n)| Op::Publish { group, n }),
        6 => (0..CONSUMERS, 1u8..4).prop_map(|(consumer, max)| Op::Receive { consumer, max }),
        5 => (0..CONSUMERS, any::<usize>()).prop_map(|(consumer, k)| Op::Ack { consumer, k }),
        3 => (0..CONSUMERS, any::<usize>()).prop_map(|(consumer, k)| Op::Nack { consumer, k }),
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
        dead_letter: Some(("fdlq".into(), 3)),
        ..QueueConfigInput::default()
    });
    b.create_queue("f", &cfg).await.expect("queue");

    let mut next_seq = [0u64; GROUPS as usize];
    // (group, seq) of messages acked, and of messages published.
    let mut acked: BTreeSet<(u8, u64)> = BTreeSet::new();
    let mut published: BTreeMap<u8, u64> = BTreeMap::new();
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
                                !(h.group == g && h.deadline > now),
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
                }
                for d in got {
                    let (group, seq) = parse(&d.body);
                    held[consumer as usize].push(Held {
                        token: d.ack_token.expect("token"),
                        group,
                        seq,
                        deadline: d.lease_deadline,
                    });
                }
            }
            Op::Ack { consumer, k } | Op::Nack { consumer, k } => {
                let list = &mut held[consumer as usize];
                if list.is_empty() {
                    continue;
                }
                let h = list.remove(k % list.len());
                let live = h.deadline > now;
                let settled = if matches!(op, Op::Ack { .. }) {
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
                let ok = matches!(settled, Settled::Ok { .. });
                if ok && matches!(op, Op::Ack { .. }) {
                    acked.insert((h.group, h.seq));
                }
                // A live lease is current (nothing can re-lease it before
                // it runs out): settling it must succeed; an expired one
                // must fail.
                prop_assert_eq!(ok, live, "settling a lease that is live: {}", live);
            }
            Op::Advance(ms) => {
                clock.advance(ms);
                b.run_timers().await.expect("timers");
                let now = clock.now_ms();
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
