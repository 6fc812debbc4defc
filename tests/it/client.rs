//! The client library and the Subscribe stream against a real server:
//! strategies, ack modes, lease extension, backpressure, the circuit
//! breaker, flow control, streams that break (SPEC §3 Subscribe, §9).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use letterbox::client::{
    AckMode, CircuitBreaker, CircuitConfig, CircuitState, Client, HandlerError, PublisherConfig,
    Schedule, Strategy, Subscriber, SubscriberConfig, pb,
};

use crate::harness::*;

async fn client(s: &TestServer) -> Client {
    Client::connect(format!("http://{}", s.addr)).await.unwrap()
}

async fn queue(c: &Client, name: &str, config: pb::QueueConfig) {
    c.create_queue(name, config).await.unwrap();
}

async fn publish_n(c: &Client, q: &str, prefix: &str, n: usize) {
    let msgs = (0..n)
        .map(|i| Client::message(format!("{prefix}-{i}")))
        .collect();
    c.publish(q, msgs).await.unwrap();
}

/// Polls `cond` until it holds (at most `secs` seconds).
async fn eventually<F, Fut>(secs: u64, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_auto_acks_successes_and_nacks_failures_with_the_error_text() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "dlq", config()).await;
    queue(&c, "q", with_dlq("dlq", 2)).await;
    publish_n(&c, "q", "ok", 10).await;
    publish_n(&c, "q", "bad", 2).await;
    let config = SubscriberConfig {
        max_concurrency: 3,
        ..SubscriberConfig::prefetch("q", 8)
    };
    let sub = Subscriber::start(c.clone(), config, |m| async move {
        let body = String::from_utf8_lossy(m.body()).into_owned();
        if body.starts_with("bad") {
            return Err(HandlerError::new(
                "ORDER:INVALID",
                format!("cannot handle {body}"),
            ));
        }
        Ok(())
    })
    .await
    .unwrap();
    eventually(10, "queue drained", || async {
        c.stats("q").await.unwrap().total == 0
    })
    .await;
    let st = c.stats("q").await.unwrap();
    assert_eq!((st.acked, st.nacked, st.dead_lettered), (10, 4, 2));
    let dlq = c.browse("dlq", 10, "").await.unwrap().messages;
    let mut reasons: Vec<String> = dlq
        .iter()
        .map(|m| m.dead_letters[0].last_nack_reason.clone())
        .collect();
    reasons.sort();
    assert_eq!(reasons, ["cannot handle bad-0", "cannot handle bad-1"]);
    sub.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_mode_leaves_settling_to_the_handler() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 6).await;
    let seen = Arc::new(AtomicU64::new(0));
    let seen2 = seen.clone();
    let config = SubscriberConfig {
        ack_mode: AckMode::Manual,
        ..SubscriberConfig::polling("q", Duration::from_millis(20))
    };
    let sub = Subscriber::start(c.clone(), config, move |m| {
        let seen = seen2.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            let n: u32 = String::from_utf8_lossy(m.body())[2..].parse().unwrap();
            if n.is_multiple_of(2) {
                m.ack().await.unwrap();
                assert!(m.ack().await.is_err(), "a second ack is refused");
            } else if m.delivery_count() == 1 {
                m.nack("odd ones twice").await.unwrap();
            } else {
                m.ack().await.unwrap();
            }
            // Returning Err in MANUAL mode does not settle anything.
            Err(HandlerError::any("ignored in manual mode"))
        }
    })
    .await
    .unwrap();
    eventually(10, "all settled", || async {
        c.stats("q").await.unwrap().total == 0
    })
    .await;
    sub.stop().await.unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 9);
    let st = c.stats("q").await.unwrap();
    assert_eq!((st.acked, st.nacked), (6, 3));
}

/// SPEC §3 in the subscriber: a FIFO message nacked by a MANUAL handler
/// releases the later messages of its group that came with it; they are
/// not handed to the handler (nor acked), and come again after it, so the
/// handler acks the group in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_mode_skips_what_a_fifo_nack_released() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    let fifo = pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        ..config()
    };
    queue(&c, "f", fifo).await;
    let msgs = (1..=3)
        .map(|i| pb::PublishMessage {
            group_id: "g".into(),
            ..Client::message(format!("m{i}"))
        })
        .collect();
    c.publish("f", msgs).await.unwrap();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (acked2, seen2) = (acked.clone(), seen.clone());
    let config = SubscriberConfig {
        ack_mode: AckMode::Manual,
        ..SubscriberConfig::prefetch("f", 3)
    };
    let sub = Subscriber::start(c.clone(), config, move |m| {
        let (acked, seen) = (acked2.clone(), seen2.clone());
        async move {
            let body = String::from_utf8_lossy(m.body()).into_owned();
            seen.lock()
                .unwrap()
                .push((body.clone(), m.delivery_count(), m.failed_attempts()));
            if body == "m1" && m.delivery_count() == 1 {
                m.nack("first try fails").await.unwrap();
            } else {
                m.ack().await.unwrap();
                acked.lock().unwrap().push(body);
            }
            Ok(())
        }
    })
    .await
    .unwrap();
    eventually(10, "all acked", || async {
        c.stats("f").await.unwrap().total == 0
    })
    .await;
    let stats = sub.stats();
    sub.stop().await.unwrap();
    assert_eq!(*acked.lock().unwrap(), ["m1", "m2", "m3"]);
    let seen = seen.lock().unwrap().clone();
    // m2 and m3 were delivered with m1 the first time, released, and
    // delivered again: their second delivery, and no failure.
    let want: Vec<(String, u32, u32)> = [("m1", 1, 0), ("m1", 2, 1), ("m2", 2, 0), ("m3", 2, 0)]
        .iter()
        .map(|(b, n, f)| (b.to_string(), *n, *f))
        .collect();
    assert_eq!(
        seen, want,
        "m2 and m3 of the first batch were never handled"
    );
    assert_eq!(stats.released, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_mode_is_at_most_once() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 5).await;
    for strategy in [
        SubscriberConfig::prefetch("q", 5),
        SubscriberConfig::polling("q", Duration::from_millis(20)),
    ] {
        let calls = Arc::new(AtomicU64::new(0));
        let calls2 = calls.clone();
        let config = SubscriberConfig {
            ack_mode: AckMode::Immediate,
            ..strategy
        };
        let sub = Subscriber::start(c.clone(), config, move |_m| {
            let calls = calls2.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::any("fails, but the message is gone already"))
            }
        })
        .await
        .unwrap();
        eventually(10, "handled", || async {
            c.stats("q").await.unwrap().total == 0
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        sub.stop().await.unwrap();
        let st = c.stats("q").await.unwrap();
        assert_eq!(st.nacked, 0, "nothing is ever nacked");
        assert!(calls.load(Ordering::SeqCst) <= 5);
        publish_n(&c, "q", "m", 5).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_keeps_its_message_in_prefetch_mode() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(
        &c,
        "q",
        pb::QueueConfig {
            ack_timeout_ms: Some(1000),
            ..config()
        },
    )
    .await;
    publish_n(&c, "q", "slow", 1).await;
    let counts = Arc::new(Mutex::new(Vec::new()));
    let counts2 = counts.clone();
    let sub = Subscriber::start(c.clone(), SubscriberConfig::prefetch("q", 4), move |m| {
        let counts = counts2.clone();
        async move {
            counts.lock().unwrap().push(m.delivery_count());
            tokio::time::sleep(Duration::from_millis(2500)).await;
            Ok(())
        }
    })
    .await
    .unwrap();
    eventually(10, "acked", || async {
        c.stats("q").await.unwrap().acked == 1
    })
    .await;
    let stats = sub.stats();
    sub.stop().await.unwrap();
    assert_eq!(*counts.lock().unwrap(), [1], "never redelivered");
    assert!(stats.extended >= 2, "{stats:?}");
    assert_eq!(c.stats("q").await.unwrap().nacked, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_with_backpressure_never_holds_more_than_max_concurrency() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 20).await;
    let config = SubscriberConfig {
        max_concurrency: 2,
        strategy: Strategy::Polling {
            schedule: Schedule::Every(Duration::from_millis(10)),
            fetch_size: 10,
            backpressure: true,
        },
        ..SubscriberConfig::prefetch("q", 1)
    };
    let sub = Subscriber::start(c.clone(), config, |_m| async move {
        tokio::time::sleep(Duration::from_millis(60)).await;
        Ok(())
    })
    .await
    .unwrap();
    let mut max_leased = 0;
    while c.stats("q").await.unwrap().total > 0 {
        max_leased = max_leased.max(c.stats("q").await.unwrap().in_flight);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = sub.stats();
    sub.stop().await.unwrap();
    assert!(max_leased <= 2, "the server saw {max_leased} leased");
    assert_eq!(stats.max_in_flight, 2, "{stats:?}");
    assert_eq!(stats.succeeded, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_schedule_polls() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 3).await;
    let config = SubscriberConfig {
        strategy: Strategy::Polling {
            schedule: Schedule::cron("* * * * * *").unwrap(),
            fetch_size: 1,
            backpressure: false,
        },
        ..SubscriberConfig::prefetch("q", 1)
    };
    let sub = Subscriber::start(c.clone(), config, |_m| async move { Ok(()) })
        .await
        .unwrap();
    eventually(6, "three polls, one message each", || async {
        c.stats("q").await.unwrap().acked == 3
    })
    .await;
    sub.stop().await.unwrap();
    assert!(Schedule::cron("not a cron").is_err());
}

/// Calls to the handler, with the time they started.
#[derive(Default)]
struct Calls(Mutex<Vec<Instant>>);

async fn circuit_run(strategy: SubscriberConfig) {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, &strategy.queue, config()).await;
    publish_n(&c, &strategy.queue, "m", 10).await;
    let up = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(Calls::default());
    let breaker = CircuitBreaker::new(
        "svc",
        CircuitConfig {
            error_types: vec!["SVC:DOWN".into()],
            errors_threshold: 3,
            trip_timeout: Duration::from_millis(500),
        },
    );
    let config = SubscriberConfig {
        circuit: Some(breaker.clone()),
        ..strategy
    };
    let q = config.queue.clone();
    let (up2, calls2) = (up.clone(), calls.clone());
    let sub = Subscriber::start(c.clone(), config, move |_m| {
        let (up, calls) = (up2.clone(), calls2.clone());
        async move {
            calls.0.lock().unwrap().push(Instant::now());
            if up.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(HandlerError::new("SVC:DOWN", "service unavailable"))
            }
        }
    })
    .await
    .unwrap();
    // Three failures trip it; the half-open probe fails and opens it again.
    eventually(10, "open twice", || async {
        breaker
            .history()
            .iter()
            .filter(|s| **s == CircuitState::Open)
            .count()
            == 2
    })
    .await;
    let n = calls.0.lock().unwrap().len();
    assert_eq!(n, 4, "3 failures + 1 failed probe");
    up.store(true, Ordering::SeqCst);
    eventually(10, "closed and drained", || async {
        c.stats(&q).await.unwrap().acked == 10
    })
    .await;
    let stats = sub.stats();
    sub.stop().await.unwrap();
    assert_eq!(
        breaker.history(),
        [
            CircuitState::Closed,
            CircuitState::Open,
            CircuitState::HalfOpen,
            CircuitState::Open,
            CircuitState::HalfOpen,
            CircuitState::Closed
        ]
    );
    let times = calls.0.lock().unwrap().clone();
    // While open, nothing was handled: the probe came a trip timeout after
    // the third failure, and the next probe a trip timeout after that.
    assert!(
        times[3] - times[2] >= Duration::from_millis(480),
        "{:?}",
        times[3] - times[2]
    );
    assert!(
        times[4] - times[3] >= Duration::from_millis(480),
        "{:?}",
        times[4] - times[3]
    );
    // Failed handler runs and messages given back unhandled while open
    // are the failed attempts the server counted.
    assert_eq!(stats.failed, 4);
    assert_eq!(
        c.stats(&q).await.unwrap().nacked,
        stats.failed + stats.returned,
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_circuit_breaker_opens_probes_and_closes_when_polling() {
    circuit_run(SubscriberConfig::polling("q", Duration::from_millis(20))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_circuit_breaker_opens_probes_and_closes_with_prefetch() {
    circuit_run(SubscriberConfig::prefetch("q", 5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_shared_by_name_stops_every_subscriber_on_it() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "a", config()).await;
    queue(&c, "b", config()).await;
    let cfg = CircuitConfig {
        error_types: vec![],
        errors_threshold: 2,
        trip_timeout: Duration::from_secs(30),
    };
    let shared = CircuitBreaker::shared("invoice-service", cfg.clone());
    let b_calls = Arc::new(AtomicU64::new(0));
    let b2 = b_calls.clone();
    let sa = Subscriber::start(
        c.clone(),
        SubscriberConfig {
            circuit: Some(CircuitBreaker::shared("invoice-service", cfg.clone())),
            ..SubscriberConfig::polling("a", Duration::from_millis(20))
        },
        |_m| async move { Err(HandlerError::any("down")) },
    )
    .await
    .unwrap();
    publish_n(&c, "a", "m", 2).await;
    eventually(10, "open", || async {
        shared.state() == CircuitState::Open
    })
    .await;
    let sb = Subscriber::start(
        c.clone(),
        SubscriberConfig {
            circuit: Some(CircuitBreaker::shared("invoice-service", cfg)),
            ..SubscriberConfig::polling("b", Duration::from_millis(20))
        },
        move |_m| {
            let b = b2.clone();
            async move {
                b.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        },
    )
    .await
    .unwrap();
    publish_n(&c, "b", "m", 3).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        b_calls.load(Ordering::SeqCst),
        0,
        "b shares the open circuit"
    );
    assert_eq!(
        c.stats("b").await.unwrap().in_flight,
        0,
        "b fetched nothing"
    );
    sa.stop().await.unwrap();
    sb.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_goes_away_returns_its_deliveries_at_once() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 5).await;
    let mut sub = c.subscribe("q", 5, None).await.unwrap();
    for _ in 0..5 {
        sub.next().await.unwrap().unwrap();
    }
    assert_eq!(c.stats("q").await.unwrap().in_flight, 5);
    drop(sub); // as if the process died: the stream breaks
    eventually(5, "returned", || async {
        c.stats("q").await.unwrap().ready == 5
    })
    .await;
    let again = c.receive("q", 5, Duration::ZERO).await.unwrap();
    assert_eq!(again.len(), 5);
    assert!(again.iter().all(|d| d.delivery_count == 2));
    assert_eq!(
        again[0].attempts[0].outcome,
        pb::AttemptOutcome::StreamClosed as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_bounds_what_the_server_pushes() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    let mut sub = c.subscribe("q", 3, None).await.unwrap();
    let settler = sub.settler();
    publish_n(&c, "q", "m", 10).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(sub.next().await.unwrap().unwrap());
    }
    let more = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(more.is_err(), "nothing beyond the credit");
    let r = settler.ack(vec![got[0].ack_token.clone()]).await.unwrap();
    assert_eq!(r[0].status, pb::SettleStatus::Ok as i32);
    let next = tokio::time::timeout(Duration::from_secs(2), sub.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&next.body), "m-3");
    settler.set_credit(10).await.unwrap();
    for _ in 0..6 {
        tokio::time::timeout(Duration::from_secs(2), sub.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    // A malformed token is refused as a whole, the stream stays open.
    let err = settler.ack(vec!["nonsense".into()]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument));
    let r = settler.ack(vec![got[1].ack_token.clone()]).await.unwrap();
    assert_eq!(r[0].status, pb::SettleStatus::Ok as i32);
    sub.close().await;
}

/// A credit larger than any buffer of the client's, each ack awaited
/// before the next delivery is taken: the ack's result comes back on the
/// stream behind deliveries pushed meanwhile, and the subscription must
/// read past them to hand it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaited_acks_under_a_large_credit_do_not_stall() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 150).await;
    let mut sub = c.subscribe("q", 100, None).await.unwrap();
    let settler = sub.settler();
    let mut bodies = Vec::new();
    for _ in 0..150 {
        let d = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("a delivery in time")
            .unwrap()
            .unwrap();
        bodies.push(String::from_utf8_lossy(&d.body).into_owned());
        let r = tokio::time::timeout(Duration::from_secs(10), settler.ack(vec![d.ack_token]))
            .await
            .unwrap_or_else(|_| panic!("no ack result after {} deliveries", bodies.len()))
            .unwrap();
        assert_eq!(r[0].status, pb::SettleStatus::Ok as i32);
    }
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 150, "each message once");
    let stats = c.stats("q").await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
    sub.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_one_queue_share_its_messages() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    let counts: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut subs = Vec::new();
    for n in &counts {
        let n = n.clone();
        let config = SubscriberConfig {
            max_concurrency: 4,
            ..SubscriberConfig::prefetch("q", 50)
        };
        subs.push(
            Subscriber::start(c.clone(), config, move |_m| {
                let n = n.clone();
                async move {
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok(())
                }
            })
            .await
            .unwrap(),
        );
    }
    let publisher = c.publisher("q", PublisherConfig::default());
    let mut pending = Vec::new();
    for i in 0..400 {
        pending.push(
            publisher
                .enqueue(Client::message(format!("m-{i}")))
                .await
                .unwrap(),
        );
    }
    for p in pending {
        p.await.unwrap().unwrap();
    }
    publisher.close().await;
    eventually(60, "all handled", || async {
        c.stats("q").await.unwrap().acked == 400
    })
    .await;
    for s in subs {
        s.stop().await.unwrap();
    }
    let (a, b) = (
        counts[0].load(Ordering::SeqCst),
        counts[1].load(Ordering::SeqCst),
    );
    assert_eq!(a + b, 400);
    assert!(a >= 80 && b >= 80, "shares {a} / {b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_retried_while_the_server_restarts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("--listen=127.0.0.1:{port}");
    let mut s = TestServer::start_with(&[&listen]).await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    s.kill();
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.restart().await;
        s
    });
    // Safe to retry: the message has an id.
    let r = c
        .publish("q", vec![Client::message_with_id("order-1", "x")])
        .await
        .unwrap();
    assert_eq!(r[0].message_id, "order-1");
    let _s = restart.await.unwrap();
    assert_eq!(c.stats("q").await.unwrap().total, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_riding_on_a_receive_come_back_with_their_results() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    queue(&c, "q", config()).await;
    publish_n(&c, "q", "m", 3).await;
    let first = c.receive("q", 2, Duration::ZERO).await.unwrap();
    assert_eq!(first.len(), 2);
    let (t0, t1) = (first[0].ack_token.clone(), first[1].ack_token.clone());
    // Settled already: its ride is refused, the other's is not.
    assert_eq!(
        c.ack(vec![t0.clone()]).await.unwrap()[0].status(),
        pb::SettleStatus::Ok
    );
    let r = c
        .receive_response(pb::ReceiveRequest {
            queue: "q".into(),
            max_messages: 10,
            ack_tokens: vec![t1, t0],
            ..Default::default()
        })
        .await
        .unwrap();
    let statuses: Vec<pb::SettleStatus> = r.ack_results.iter().map(|a| a.status()).collect();
    assert_eq!(statuses.len(), 2, "{r:?}");
    assert_eq!(statuses[0], pb::SettleStatus::Ok, "{r:?}");
    assert_ne!(statuses[1], pb::SettleStatus::Ok, "{r:?}");
    assert_eq!(r.deliveries.len(), 1, "{r:?}");
    let st = c.stats("q").await.unwrap();
    assert_eq!((st.acked, st.total), (2, 1));
}

/// A port nothing listens on.
fn dead_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Several servers: the client connects to the first that answers, and a
/// server that goes away moves it (and its clones) to the next, where a
/// call safe to repeat is retried.
#[tokio::test]
async fn client_fails_over_to_the_next_server() {
    let a = InProc::start().await;
    let b = InProc::start().await;
    let dead = dead_port();
    // The first address refuses connections: the second is used.
    let c = Client::connect(format!("http://{dead}, http://{}", a.addr))
        .await
        .unwrap();
    assert_eq!(c.endpoint(), format!("http://{}", a.addr));
    queue(&c, "q", config()).await;

    let list = format!("http://{},http://{}", a.addr, b.addr);
    let c = Client::connect(list.clone()).await.unwrap();
    let clone = c.clone();
    assert_eq!(c.endpoint(), format!("http://{}", a.addr));
    queue(
        &Client::connect(format!("http://{}", b.addr)).await.unwrap(),
        "q",
        config(),
    )
    .await;
    c.publish("q", vec![Client::message_with_id("m1", "on a")])
        .await
        .unwrap();
    a.stop().await;
    // Safe to repeat (it has an id): retried on the next server.
    let r = c
        .publish("q", vec![Client::message_with_id("m2", "on b")])
        .await
        .unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(c.endpoint(), format!("http://{}", b.addr));
    assert_eq!(clone.endpoint(), c.endpoint(), "clones fail over together");
    let got = clone
        .receive("q", 10, Duration::from_millis(200))
        .await
        .unwrap();
    let bodies: Vec<String> = got
        .iter()
        .map(|d| String::from_utf8_lossy(&d.body).into_owned())
        .collect();
    assert_eq!(bodies, ["on b"]);

    // Every address bad: the error names one of them.
    let e = Client::with_config({
        let mut cfg = letterbox::client::ClientConfig::new(format!("http://{dead}"));
        cfg.retry.max_attempts = 1;
        cfg
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains(&dead.port().to_string()), "{e}");
    // An empty entry in the list is refused before connecting.
    let e = Client::connect(format!("http://{},", b.addr))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("empty address"), "{e}");
}
