//! Model-based property test: random sequences of publish, receive, ack,
//! nack, extend, clock moves, restarts and crashes, applied to the real
//! engine (on a real store) and to a small reference model; every answer
//! and the figures after every step must agree.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::model::*;
use super::*;
use crate::clock::ManualClock;
use crate::storage::{Store, StoreOptions};

const T0: u64 = 1_700_000_000_000;
const ACK_TIMEOUT: u64 = 10_000;
const MAX_LEASE_TOTAL: u64 = 30_000;
const MAX_DELIVERIES: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Publish(u8),
    Receive { dlq: bool, max: u8 },
    Ack(usize),
    Nack(usize),
    Extend(usize, u64),
    Advance(u64),
    Restart,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..4).prop_map(Op::Publish),
        6 => (any::<bool>(), 1u8..5).prop_map(|(dlq, max)| Op::Receive { dlq, max }),
        4 => any::<usize>().prop_map(Op::Ack),
        4 => any::<usize>().prop_map(Op::Nack),
        2 => (any::<usize>(), 1_000u64..20_000).prop_map(|(i, t)| Op::Extend(i, t)),
        4 => (0u64..15_000).prop_map(Op::Advance),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
    ]
}

/// The reference model.
#[derive(Debug, Clone, PartialEq)]
enum MState {
    Ready,
    Leased {
        epoch: u32,
        deadline: u64,
        started: u64,
    },
}

#[derive(Debug, Clone)]
struct MMsg {
    body: String,
    /// Position order within its queue.
    order: u64,
    in_dlq: bool,
    count: u32,
    leases: u32,
    state: MState,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    next_order: u64,
    next_body: u64,
    msgs: Vec<Option<MMsg>>,
}

impl Model {
    fn ordered(&self, dlq: bool) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.msgs.len())
            .filter(|&i| self.msgs[i].as_ref().is_some_and(|m| m.in_dlq == dlq))
            .collect();
        v.sort_by_key(|&i| self.msgs[i].as_ref().map_or(0, |m| m.order));
        v
    }

    fn publish(&mut self, n: u8) -> Vec<String> {
        (0..n)
            .map(|_| {
                let body = format!("m{}", self.next_body);
                self.next_body += 1;
                self.next_order += 1;
                self.msgs.push(Some(MMsg {
                    body: body.clone(),
                    order: self.next_order,
                    in_dlq: false,
                    count: 0,
                    leases: 0,
                    state: MState::Ready,
                }));
                body
            })
            .collect()
    }

    fn receive(&mut self, dlq: bool, max: u8) -> Vec<(usize, String, u32)> {
        let now = self.now;
        let mut out = Vec::new();
        for i in self.ordered(dlq) {
            if out.len() == usize::from(max) {
                break;
            }
            let Some(m) = self.msgs[i].as_mut() else {
                continue;
            };
            if m.state != MState::Ready {
                continue;
            }
            m.count += 1;
            m.leases += 1;
            m.state = MState::Leased {
                epoch: m.leases,
                deadline: now + ACK_TIMEOUT,
                started: now,
            };
            out.push((i, m.body.clone(), m.count));
        }
        out
    }

    /// A token names a message, its position (order) and a lease epoch:
    /// after a move to the DLQ, epochs start again at a new position.
    fn valid(&self, token: (usize, u64, u32)) -> bool {
        matches!(
            self.msgs[token.0].as_ref().map(|m| (m.order, &m.state)),
            Some((order, MState::Leased { epoch, deadline, .. }))
                if order == token.1 && *epoch == token.2 && *deadline > self.now
        )
    }

    /// A lease ends without an ack: to the DLQ (source queue, deliveries
    /// exhausted) or ready again.
    fn fail(&mut self, i: usize) {
        self.next_order += 1;
        let order = self.next_order;
        if let Some(m) = self.msgs[i].as_mut() {
            m.state = MState::Ready;
            if !m.in_dlq && m.count >= MAX_DELIVERIES {
                m.in_dlq = true;
                m.count = 0;
                m.leases = 0;
                m.order = order;
            }
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        let now = self.now;
        // Expire in (deadline, queue, position) order, as the engine does.
        let mut due: Vec<(u64, bool, u64, usize)> = self
            .msgs
            .iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                Some(m) => match m.state {
                    MState::Leased { deadline, .. } if deadline <= now => {
                        Some((deadline, m.in_dlq, m.order, i))
                    }
                    _ => None,
                },
                None => None,
            })
            .collect();
        due.sort();
        for (_, _, _, i) in due {
            self.fail(i);
        }
    }

    fn stats(&self, dlq: bool) -> (u64, u64, u64) {
        let mut ready = 0;
        let mut leased = 0;
        for m in self.msgs.iter().flatten().filter(|m| m.in_dlq == dlq) {
            match m.state {
                MState::Ready => ready += 1,
                MState::Leased { .. } => leased += 1,
            }
        }
        (ready, leased, ready + leased)
    }
}

struct Real {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    broker: Option<Broker>,
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

impl Real {
    fn b(&self) -> &Broker {
        self.broker.as_ref().expect("open")
    }
}

fn stats_of(b: &Broker, q: &str) -> (u64, u64, u64) {
    let s = b.stats(q).expect("stats");
    (s.ready, s.in_flight, s.total)
}

async fn run(ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let mut real = Real {
        broker: Some(open(dir.path(), &clock)),
        dir,
        clock,
    };
    let dlq_cfg = QueueConfigInput {
        ack_timeout: Some(ACK_TIMEOUT),
        max_lease_total: Some(MAX_LEASE_TOTAL),
        ..QueueConfigInput::default()
    };
    real.b().create_queue("dlq", &dlq_cfg).await.expect("dlq");
    let cfg = QueueConfigInput {
        dead_letter: Some(DeadLetterInput::new("dlq", MAX_DELIVERIES)),
        ..dlq_cfg
    };
    real.b().create_queue("q", &cfg).await.expect("q");
    let mut model = Model {
        now: T0,
        ..Model::default()
    };
    // Tokens handed out: (real token, model (msg index, epoch)).
    let mut tokens: Vec<(String, (usize, u64, u32))> = Vec::new();
    for op in ops {
        match op.clone() {
            Op::Publish(n) => {
                let bodies = model.publish(n);
                let msgs = bodies
                    .iter()
                    .map(|b| NewMessage {
                        body: Bytes::from(b.clone()),
                        ..NewMessage::default()
                    })
                    .collect();
                real.b().publish("q", msgs).await.expect("publish");
            }
            Op::Receive { dlq, max } => {
                let q = if dlq { "dlq" } else { "q" };
                let expect = model.receive(dlq, max);
                let opts = ReceiveOptions {
                    max_messages: u32::from(max),
                    ..ReceiveOptions::default()
                };
                let got = real.b().receive(q, opts).await.expect("receive");
                let got_view: Vec<(String, u32)> = got
                    .iter()
                    .map(|d| {
                        (
                            String::from_utf8_lossy(&d.body).into_owned(),
                            d.delivery_count,
                        )
                    })
                    .collect();
                let expect_view: Vec<(String, u32)> =
                    expect.iter().map(|(_, b, c)| (b.clone(), *c)).collect();
                prop_assert_eq!(&got_view, &expect_view, "receive from {}", q);
                for (d, (i, _, _)) in got.iter().zip(&expect) {
                    let (order, epoch) = model.msgs[*i]
                        .as_ref()
                        .map_or((0, 0), |m| (m.order, m.leases));
                    tokens.push((d.ack_token.clone().expect("token"), (*i, order, epoch)));
                }
            }
            Op::Ack(_) | Op::Nack(_) | Op::Extend(..) if tokens.is_empty() => {}
            Op::Ack(k) => {
                let (t, mt) = tokens[k % tokens.len()].clone();
                let valid = model.valid(mt);
                if valid {
                    model.msgs[mt.0] = None;
                }
                let r = real.b().ack(&[t]).await.expect("ack");
                prop_assert_eq!(matches!(r[0], Settled::Ok { .. }), valid, "ack");
            }
            Op::Nack(k) => {
                let (t, mt) = tokens[k % tokens.len()].clone();
                let valid = model.valid(mt);
                if valid {
                    model.fail(mt.0);
                }
                let n = Nack {
                    token: t,
                    delay: None,
                    reason: "model".into(),
                    dead_letter: false,
                };
                let r = real.b().nack(&[n]).await.expect("nack");
                prop_assert_eq!(matches!(r[0], Settled::Ok { .. }), valid, "nack");
            }
            Op::Extend(k, timeout) => {
                let (t, mt) = tokens[k % tokens.len()].clone();
                let valid = model.valid(mt);
                let mut expect_deadline = 0;
                if valid {
                    let now = model.now;
                    if let Some(m) = model.msgs[mt.0].as_mut()
                        && let MState::Leased {
                            deadline, started, ..
                        } = &mut m.state
                    {
                        *deadline = (now + timeout).min(*started + MAX_LEASE_TOTAL);
                        expect_deadline = *deadline;
                    }
                }
                let r = real.b().extend(&[(t, timeout)]).await.expect("extend");
                match &r[0] {
                    Settled::Ok { deadline } => {
                        prop_assert!(valid, "extend succeeded on a stale token");
                        prop_assert_eq!(*deadline, expect_deadline);
                    }
                    Settled::LeaseExpired(_) | Settled::Released(_) => {
                        prop_assert!(!valid, "extend failed on a live token")
                    }
                }
            }
            Op::Advance(ms) => {
                model.advance(ms);
                real.clock.advance(ms);
                real.b().run_timers().await.expect("timers");
            }
            Op::Restart | Op::Crash => {
                let b = real.broker.take().expect("open");
                if matches!(op, Op::Crash) {
                    b.store.crash();
                } else {
                    b.close().expect("close");
                }
                real.broker = Some(open(real.dir.path(), &real.clock));
            }
        }
        prop_assert_eq!(
            stats_of(real.b(), "q"),
            model.stats(false),
            "stats of q after {:?}",
            op
        );
        prop_assert_eq!(
            stats_of(real.b(), "dlq"),
            model.stats(true),
            "stats of dlq after {:?}",
            op
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_engine_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(run(ops))?;
    }
}
