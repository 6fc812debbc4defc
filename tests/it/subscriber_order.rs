//! The subscriber keeps FIFO order with concurrency (SPEC §3 FIFO, §9):
//! with `max_concurrency` above one, the messages of one group run one
//! after another in publish order while other groups run in parallel,
//! with either strategy and every ack mode; a failed message runs again
//! before any later message of its group, and what its failure released
//! never runs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use letterbox::client::{
    AckMode, Client, HandlerError, Message, Schedule, Strategy, Subscriber, SubscriberConfig, pb,
};

use crate::harness::*;

/// Groups per run; the first is the queue's default group (no group id).
const GROUPS: usize = 4;
/// Messages per group.
const PER_GROUP: u32 = 15;

/// What the handler saw.
#[derive(Default)]
struct Log {
    groups: Mutex<HashMap<String, GroupLog>>,
    /// Every break of the rules, in words.
    violations: Mutex<Vec<String>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
    /// State of the handler's random sleeps.
    rng: AtomicU64,
}

#[derive(Default)]
struct GroupLog {
    running: bool,
    /// The message the group must run next: every one before it succeeded.
    next: u32,
    /// Messages that failed once already (each fails once at most).
    failed: HashSet<u32>,
    /// Handler runs, in order.
    runs: Vec<u32>,
}

impl Log {
    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// 0 to 10 ms, from a fixed-seed xorshift shared by the handlers.
    fn pause(&self) -> Duration {
        let mut x = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x2545_F491_4F6C_DD1D);
        x ^= x >> 33;
        x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        x ^= x >> 33;
        Duration::from_millis(x % 11)
    }

    fn done(&self) -> bool {
        let groups = self.groups.lock().unwrap();
        groups.len() == GROUPS && groups.values().all(|g| g.next == PER_GROUP)
    }
}

/// The group and number of a message whose body is `GROUP/N`.
fn parse(m: &Message) -> (String, u32) {
    let body = String::from_utf8_lossy(m.body()).into_owned();
    let (group, n) = body.split_once('/').unwrap();
    (group.to_string(), n.parse().unwrap())
}

/// The handler: checks that no other message of the group runs and that
/// this one is the group's next, sleeps a random while, and fails the
/// messages `n % fail_every == 1` the first time they run (settling
/// itself in MANUAL mode).
async fn handle(
    log: Arc<Log>,
    m: Message,
    mode: AckMode,
    fail_every: u32,
) -> Result<(), HandlerError> {
    let (group, n) = parse(&m);
    let fail = {
        let mut groups = log.groups.lock().unwrap();
        let g = groups.entry(group.clone()).or_default();
        if g.running {
            log.violation(format!(
                "group {group:?}: {n} started while another of the group ran"
            ));
        }
        if n != g.next {
            log.violation(format!(
                "group {group:?}: {n} ran while {} was next",
                g.next
            ));
        }
        g.running = true;
        g.runs.push(n);
        fail_every > 0 && n % fail_every == 1 && g.failed.insert(n)
    };
    let now = log.running.fetch_add(1, Ordering::SeqCst) + 1;
    log.most_running.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(log.pause()).await;
    if mode == AckMode::Manual {
        let settled = if fail {
            m.nack("planned failure").await
        } else {
            m.ack().await
        };
        if let Err(e) = settled {
            log.violation(format!("group {group:?}: settling {n}: {e}"));
        }
    }
    log.running.fetch_sub(1, Ordering::SeqCst);
    let mut groups = log.groups.lock().unwrap();
    let g = groups.entry(group).or_default();
    g.running = false;
    if fail {
        return Err(HandlerError::any(format!("{n} fails once")));
    }
    g.next = n + 1;
    Ok(())
}

fn fifo() -> pb::QueueConfig {
    pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        ..config()
    }
}

/// Publishes `GROUPS` × `PER_GROUP` messages round the groups into a new
/// FIFO queue, runs a subscriber with `config` until every message
/// succeeded, and checks the order. Returns the handler runs that failed.
async fn run(c: &Client, config: SubscriberConfig, fail_every: u32) -> u64 {
    let queue = config.queue.clone();
    c.create_queue(&queue, fifo()).await.unwrap();
    let mut msgs = Vec::new();
    for n in 0..PER_GROUP {
        for g in 0..GROUPS {
            let group = if g == 0 {
                String::new()
            } else {
                format!("g{g}")
            };
            msgs.push(pb::PublishMessage {
                group_id: group.clone(),
                ..Client::message(format!("{group}/{n}"))
            });
        }
    }
    c.publish(&queue, msgs).await.unwrap();
    let log = Arc::new(Log::default());
    let mode = config.ack_mode;
    let handler_log = log.clone();
    let sub = Subscriber::start(c.clone(), config, move |m| {
        handle(handler_log.clone(), m, mode, fail_every)
    })
    .await
    .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    // Until every message succeeded, or the first break of the rules.
    while !(log.done() && c.stats(&queue).await.unwrap().total == 0)
        && log.violations.lock().unwrap().is_empty()
    {
        assert!(Instant::now() < until, "{queue}: not done in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = sub.stats();
    sub.stop().await.unwrap();
    let violations = log.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{queue} ({mode:?}): {violations:#?}");
    for (group, g) in log.groups.lock().unwrap().iter() {
        let mut want = Vec::new();
        for n in 0..PER_GROUP {
            want.push(n);
            if fail_every > 0 && n % fail_every == 1 {
                want.push(n);
            }
        }
        assert_eq!(g.runs, want, "{queue}: group {group:?} ran in this order");
    }
    assert!(
        log.most_running.load(Ordering::SeqCst) >= 2,
        "{queue}: groups never ran in parallel ({stats:?})"
    );
    stats.failed
}

fn polling(queue: &str, backpressure: bool) -> SubscriberConfig {
    SubscriberConfig {
        strategy: Strategy::Polling {
            schedule: Schedule::Every(Duration::from_millis(10)),
            fetch_size: 10,
            backpressure,
        },
        ..SubscriberConfig::prefetch(queue, 1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_runs_a_group_in_order_and_groups_in_parallel() {
    let s = TestServer::start().await;
    let c = Client::connect(format!("http://{}", s.addr)).await.unwrap();
    for (queue, mode, fail_every) in [
        ("auto", AckMode::Auto, 4),
        ("manual", AckMode::Manual, 5),
        ("immediate", AckMode::Immediate, 0),
    ] {
        let config = SubscriberConfig {
            ack_mode: mode,
            max_concurrency: 4,
            ..SubscriberConfig::prefetch(queue, 16)
        };
        let failed = run(&c, config, fail_every).await;
        if mode == AckMode::Auto {
            assert!(failed > 0, "{queue}: no handler run failed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_runs_a_group_in_order_and_groups_in_parallel() {
    let s = TestServer::start().await;
    let c = Client::connect(format!("http://{}", s.addr)).await.unwrap();
    for (queue, mode, fail_every, backpressure) in [
        ("auto", AckMode::Auto, 4, false),
        ("manual", AckMode::Manual, 5, true),
        ("immediate", AckMode::Immediate, 0, false),
    ] {
        let config = SubscriberConfig {
            ack_mode: mode,
            max_concurrency: 4,
            ..polling(queue, backpressure)
        };
        run(&c, config, fail_every).await;
    }
}

/// A standard queue has no groups: its messages run side by side up to
/// `max_concurrency`, with either strategy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_queue_runs_up_to_max_concurrency_at_once() {
    let s = TestServer::start().await;
    let c = Client::connect(format!("http://{}", s.addr)).await.unwrap();
    for strategy in [
        SubscriberConfig::prefetch("std-prefetch", 8),
        polling("std-polling", false),
    ] {
        let queue = strategy.queue.clone();
        c.create_queue(&queue, config()).await.unwrap();
        let msgs = (0..8).map(|i| Client::message(format!("m{i}"))).collect();
        c.publish(&queue, msgs).await.unwrap();
        let config = SubscriberConfig {
            max_concurrency: 4,
            ..strategy
        };
        let sub = Subscriber::start(c.clone(), config, |_m| async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok(())
        })
        .await
        .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while c.stats(&queue).await.unwrap().total > 0 {
            assert!(Instant::now() < until, "{queue}: not drained");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stats = sub.stats();
        sub.stop().await.unwrap();
        assert_eq!(stats.max_in_flight, 4, "{queue}: {stats:?}");
    }
}

/// A MANUAL handler that returns without settling a FIFO message keeps
/// its group waiting until the lease runs out: the later messages the
/// server released then are skipped, and the group goes on from the
/// message that came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_left_unsettled_holds_its_group_until_its_lease_ends() {
    let s = TestServer::start().await;
    let c = Client::connect(format!("http://{}", s.addr)).await.unwrap();
    for strategy in [
        SubscriberConfig::prefetch("unsettled-prefetch", 3),
        polling("unsettled-polling", false),
    ] {
        let queue = strategy.queue.clone();
        let queue_config = pb::QueueConfig {
            ack_timeout_ms: Some(1000),
            ..fifo()
        };
        c.create_queue(&queue, queue_config).await.unwrap();
        let msgs = (1..=3)
            .map(|i| pb::PublishMessage {
                group_id: "g".into(),
                ..Client::message(format!("m{i}"))
            })
            .collect();
        c.publish(&queue, msgs).await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let (seen2, refused2) = (seen.clone(), refused.clone());
        let config = SubscriberConfig {
            ack_mode: AckMode::Manual,
            max_concurrency: 2,
            ..strategy
        };
        let sub = Subscriber::start(c.clone(), config, move |m| {
            let (seen, refused) = (seen2.clone(), refused2.clone());
            async move {
                let body = String::from_utf8_lossy(m.body()).into_owned();
                let first = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(body.clone());
                    seen.len() == 1
                };
                if !first && let Err(e) = m.ack().await {
                    refused.lock().unwrap().push(format!("{body}: {e}"));
                }
                Ok(())
            }
        })
        .await
        .unwrap();
        let until = Instant::now() + Duration::from_secs(15);
        while c.stats(&queue).await.unwrap().total > 0 {
            assert!(Instant::now() < until, "{queue}: not drained");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stats = sub.stats();
        sub.stop().await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["m1", "m1", "m2", "m3"], "{queue}");
        assert!(refused.lock().unwrap().is_empty(), "{queue}: {refused:?}");
        assert!(stats.released >= 1, "{queue}: {stats:?}");
    }
}
