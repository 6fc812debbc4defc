//! Engine rules against a real store on a temporary directory, with a
//! manual clock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::model::*;
use super::*;
use crate::clock::ManualClock;
use crate::storage::{Store, StoreOptions};

const T0: u64 = 1_700_000_000_000;

struct Env {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    broker: Option<Broker>,
}

fn store_opts() -> StoreOptions {
    StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

fn open(dir: &Path, clock: &Arc<ManualClock>) -> Broker {
    let (store, _) = Store::open(dir, store_opts()).expect("store opens");
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

    /// Closes and reopens the engine on the same directory.
    fn restart(&mut self) {
        if let Some(b) = self.broker.take() {
            b.close().expect("close");
        }
        self.broker = Some(open(self.dir.path(), &self.clock));
    }

    /// Stops like a crash (no final apply or checkpoint) and reopens.
    fn crash(&mut self) {
        if let Some(b) = self.broker.take() {
            b.store.crash();
        }
        self.broker = Some(open(self.dir.path(), &self.clock));
    }

    async fn advance(&self, ms: u64) {
        self.clock.advance(ms);
        self.b().run_timers().await.expect("timers");
    }

    async fn create(&self, name: &str, input: QueueConfigInput) {
        self.b().create_queue(name, &input).await.expect("create");
    }

    async fn publish(&self, q: &str, bodies: &[&str]) -> Vec<String> {
        let msgs = bodies
            .iter()
            .map(|b| NewMessage {
                body: Bytes::copy_from_slice(b.as_bytes()),
                ..NewMessage::default()
            })
            .collect();
        self.b()
            .publish(q, msgs)
            .await
            .expect("publish")
            .into_iter()
            .map(|p| p.message_id)
            .collect()
    }

    async fn receive(&self, q: &str, n: u32) -> Vec<Delivery> {
        self.b()
            .receive(
                q,
                ReceiveOptions {
                    max_messages: n,
                    ..ReceiveOptions::default()
                },
            )
            .await
            .expect("receive")
    }

    async fn ack(&self, d: &Delivery) -> Settled {
        let t = d.ack_token.clone().expect("token");
        self.b().ack(&[t]).await.expect("ack").remove(0)
    }

    async fn nack(&self, d: &Delivery, reason: &str) -> Settled {
        let n = Nack {
            token: d.ack_token.clone().expect("token"),
            delay: None,
            reason: reason.into(),
            dead_letter: false,
        };
        self.b().nack(&[n]).await.expect("nack").remove(0)
    }

    fn stats(&self, q: &str) -> QueueStats {
        self.b().stats(q).expect("stats")
    }
}

fn body(d: &Delivery) -> &str {
    std::str::from_utf8(&d.body).expect("utf8")
}

fn with_dlq(dlq: &str, max: u32) -> QueueConfigInput {
    QueueConfigInput {
        dead_letter: Some(DeadLetterInput::new(dlq, max)),
        ack_timeout: Some(10 * SECOND),
        ..QueueConfigInput::default()
    }
}

#[tokio::test]
async fn publish_receive_ack_then_the_message_is_gone() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["a", "b"]).await;
    let got = env.receive("q", 10).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(got[0].delivery_count, 1);
    assert_eq!(got[0].first_delivered_at, T0);
    assert_eq!(got[0].lease_deadline, T0 + 2 * MINUTE);
    let s = env.stats("q");
    assert_eq!((s.ready, s.in_flight, s.total), (0, 2, 2));
    assert_eq!(env.ack(&got[0]).await, Settled::Ok { deadline: 0 });
    assert!(
        matches!(env.ack(&got[0]).await, Settled::LeaseExpired(_)),
        "double ack fails"
    );
    let s = env.stats("q");
    assert_eq!(
        (s.in_flight, s.total, s.counters.acked, s.counters.published),
        (1, 1, 1, 2)
    );
    assert!(
        env.receive("q", 10).await.is_empty(),
        "leased messages are not redelivered"
    );
}

#[tokio::test]
async fn nack_redelivers_with_history_until_the_dlq() {
    let env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 3)).await;
    let ids = env.publish("q", &["poison"]).await;
    for attempt in 1..=3u32 {
        let d = env.receive("q", 1).await.remove(0);
        assert_eq!(d.delivery_count, attempt);
        assert_eq!(d.attempts.len(), usize::try_from(attempt - 1).unwrap());
        env.nack(&d, &format!("fail {attempt}")).await;
    }
    assert!(env.receive("q", 1).await.is_empty());
    let q = env.stats("q");
    assert_eq!(
        (q.total, q.counters.nacked, q.counters.dead_lettered),
        (0, 3, 1)
    );
    env.advance(5).await;
    let d = env.receive("dlq", 1).await.remove(0);
    assert_eq!(d.message_id, ids[0], "the id survives the move");
    assert_eq!(d.delivery_count, 1, "the count starts again in the DLQ");
    assert_eq!(d.dead_letters.len(), 1);
    let rec = &d.dead_letters[0];
    assert_eq!(rec.source_queue, "q");
    assert_eq!(rec.reason, DeadLetterReason::MaxDeliveries);
    assert_eq!(rec.delivery_count, 3);
    assert_eq!(rec.last_nack_reason, "fail 3");
    assert_eq!(env.stats("dlq").counters.dead_letters_received, 1);
}

#[tokio::test]
async fn lease_expiry_counts_as_a_failed_attempt_and_fences_the_old_token() {
    let env = Env::new();
    env.create(
        "q",
        QueueConfigInput {
            ack_timeout: Some(5 * SECOND),
            ..Default::default()
        },
    )
    .await;
    env.publish("q", &["m"]).await;
    let first = env.receive("q", 1).await.remove(0);
    env.advance(5 * SECOND).await;
    let second = env.receive("q", 1).await.remove(0);
    assert_eq!(second.delivery_count, 2);
    assert_eq!(second.attempts[0].outcome, AttemptOutcome::LeaseExpired);
    assert!(
        matches!(env.ack(&first).await, Settled::LeaseExpired(_)),
        "late ack is fenced"
    );
    assert_eq!(env.stats("q").in_flight, 1, "the late ack changed nothing");
    assert_eq!(env.ack(&second).await, Settled::Ok { deadline: 0 });
}

#[tokio::test]
async fn an_ack_after_the_deadline_fails_even_before_the_sweep() {
    let env = Env::new();
    env.create(
        "q",
        QueueConfigInput {
            ack_timeout: Some(SECOND),
            ..Default::default()
        },
    )
    .await;
    env.publish("q", &["m"]).await;
    let d = env.receive("q", 1).await.remove(0);
    env.clock.advance(SECOND);
    assert!(matches!(env.ack(&d).await, Settled::LeaseExpired(_)));
}

#[tokio::test]
async fn extend_is_capped_by_max_lease_total() {
    let env = Env::new();
    let cfg = QueueConfigInput {
        ack_timeout: Some(10 * SECOND),
        max_lease_total: Some(30 * SECOND),
        ..Default::default()
    };
    env.create("q", cfg).await;
    env.publish("q", &["m"]).await;
    let d = env.receive("q", 1).await.remove(0);
    let t = d.ack_token.clone().expect("token");
    env.advance(8 * SECOND).await;
    let r = env
        .b()
        .extend(&[(t.clone(), 10 * SECOND)])
        .await
        .expect("extend");
    assert_eq!(
        r[0],
        Settled::Ok {
            deadline: T0 + 18 * SECOND
        }
    );
    env.advance(9 * SECOND).await;
    let r = env
        .b()
        .extend(&[(t.clone(), 60 * SECOND)])
        .await
        .expect("extend");
    assert_eq!(
        r[0],
        Settled::Ok {
            deadline: T0 + 30 * SECOND
        },
        "capped"
    );
    env.advance(13 * SECOND).await;
    let r = env.b().extend(&[(t, 10 * SECOND)]).await.expect("extend");
    assert!(matches!(r[0], Settled::LeaseExpired(_)));
}

#[tokio::test]
async fn retry_backoff_and_nack_delay_hold_messages_back() {
    let env = Env::new();
    let cfg = QueueConfigInput {
        retry_backoff: Some(RetryBackoff {
            initial: SECOND,
            max: 4 * SECOND,
            multiplier: 2.0,
        }),
        ..Default::default()
    };
    env.create("q", cfg).await;
    env.publish("q", &["m"]).await;
    for wait in [SECOND, 2 * SECOND, 4 * SECOND, 4 * SECOND] {
        let d = env.receive("q", 1).await.remove(0);
        env.nack(&d, "").await;
        assert_eq!(env.stats("q").delayed, 1);
        env.advance(wait - 1).await;
        assert!(env.receive("q", 1).await.is_empty(), "visible too early");
        env.advance(1).await;
    }
    let d = env.receive("q", 1).await.remove(0);
    let n = Nack {
        token: d.ack_token.clone().expect("token"),
        delay: Some(0),
        reason: String::new(),
        dead_letter: false,
    };
    env.b().nack(&[n]).await.expect("nack");
    assert_eq!(
        env.receive("q", 1).await.len(),
        1,
        "an explicit delay overrides the backoff"
    );
}

#[tokio::test]
async fn delays_and_ttl() {
    let env = Env::new();
    let cfg = QueueConfigInput {
        delivery_delay: Some(2 * SECOND),
        message_ttl: Some(MINUTE),
        ..Default::default()
    };
    env.create("q", cfg).await;
    env.publish("q", &["late"]).await;
    let own = NewMessage {
        body: Bytes::from_static(b"now"),
        delay: Some(0),
        ttl: Some(5 * SECOND),
        ..Default::default()
    };
    env.b().publish("q", vec![own]).await.expect("publish");
    let got = env.receive("q", 10).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["now"]);
    env.nack(&got[0], "").await;
    env.advance(2 * SECOND).await;
    assert_eq!(env.stats("q").ready, 2);
    env.advance(3 * SECOND).await;
    let s = env.stats("q");
    assert_eq!((s.total, s.counters.expired), (1, 1), "own ttl ran out");
    env.clock.advance(MINUTE);
    assert!(
        env.receive("q", 10).await.is_empty(),
        "never delivered after its ttl"
    );
    assert_eq!(env.stats("q").counters.expired, 2);
}

#[tokio::test]
async fn expired_messages_go_to_the_dlq_when_asked() {
    let env = Env::new();
    env.create(
        "dlq",
        QueueConfigInput {
            message_ttl: Some(10 * MINUTE),
            ..Default::default()
        },
    )
    .await;
    let cfg = QueueConfigInput {
        dead_letter_on_expiry: Some(true),
        message_ttl: Some(MINUTE),
        ..with_dlq("dlq", 5)
    };
    env.create("q", cfg).await;
    env.publish("q", &["m"]).await;
    env.advance(MINUTE).await;
    let b = env.b().browse("dlq", 10, "").expect("browse");
    assert_eq!(b.messages.len(), 1);
    let m = &b.messages[0];
    assert_eq!(m.dead_letters[0].reason, DeadLetterReason::Expired);
    assert_eq!(m.enqueued_at, T0 + MINUTE);
    assert_eq!(
        m.expires_at,
        T0 + MINUTE + 10 * MINUTE,
        "DLQ ttl counts from the move"
    );
}

#[tokio::test]
async fn reject_moves_to_the_dlq_at_once_and_needs_one() {
    let env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 10)).await;
    env.create("plain", QueueConfigInput::default()).await;
    env.publish("q", &["bad"]).await;
    env.publish("plain", &["bad"]).await;
    let d = env.receive("q", 1).await.remove(0);
    let n = Nack {
        token: d.ack_token.clone().expect("token"),
        delay: None,
        reason: "invalid".into(),
        dead_letter: true,
    };
    env.b().nack(&[n]).await.expect("reject");
    let m = env
        .b()
        .browse("dlq", 1, "")
        .expect("browse")
        .messages
        .remove(0);
    assert_eq!(m.dead_letters[0].reason, DeadLetterReason::Rejected);
    assert_eq!(m.dead_letters[0].last_nack_reason, "invalid");

    let d = env.receive("plain", 1).await.remove(0);
    let n = Nack {
        token: d.ack_token.clone().expect("token"),
        delay: None,
        reason: String::new(),
        dead_letter: true,
    };
    let err = env.b().nack(&[n]).await.expect_err("no dlq");
    assert!(matches!(err, QueueError::FailedPrecondition(_)), "{err}");
    assert_eq!(env.stats("plain").counters.nacked, 0, "nothing changed");
    assert_eq!(
        env.ack(&d).await,
        Settled::Ok { deadline: 0 },
        "the lease is intact"
    );
}

#[tokio::test]
async fn max_length_client_ids_and_auto_ack() {
    let env = Env::new();
    env.create(
        "q",
        QueueConfigInput {
            max_length: Some(2),
            ..Default::default()
        },
    )
    .await;
    let m = |id: &str| NewMessage {
        message_id: Some(id.into()),
        body: Bytes::from_static(b"x"),
        ..Default::default()
    };
    let r = env
        .b()
        .publish("q", vec![m("a"), m("a"), m("b")])
        .await
        .expect("publish");
    assert_eq!(
        r.iter().map(|p| p.duplicate).collect::<Vec<_>>(),
        [false, true, false]
    );
    let r = env.b().publish("q", vec![m("a")]).await.expect("repeat");
    assert!(
        r[0].duplicate,
        "an id already in the queue is not stored twice"
    );
    let err = env.b().publish("q", vec![m("c")]).await.expect_err("full");
    assert!(
        matches!(
            err,
            QueueError::ResourceExhausted {
                kind: crate::queue::Exhausted::QueueFull,
                ..
            }
        ),
        "{err}"
    );
    let got = env
        .b()
        .receive(
            "q",
            ReceiveOptions {
                max_messages: 10,
                auto_ack: true,
                ..Default::default()
            },
        )
        .await
        .expect("receive");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|d| d.ack_token.is_none()));
    let s = env.stats("q");
    assert_eq!((s.total, s.counters.acked), (0, 2));
    let r = env.b().publish("q", vec![m("a")]).await.expect("again");
    assert!(
        !r[0].duplicate,
        "consumed ids may be published again on standard queues"
    );
}

#[tokio::test]
async fn queue_admin_rules() {
    let env = Env::new();
    let b = env.b();
    let (_, created) = b
        .create_queue("dlq", &QueueConfigInput::default())
        .await
        .expect("create");
    assert!(created);
    let (_, created) = b
        .create_queue("dlq", &QueueConfigInput::default())
        .await
        .expect("idempotent");
    assert!(!created);
    let other = QueueConfigInput {
        ack_timeout: Some(5 * SECOND),
        ..Default::default()
    };
    match b.create_queue("dlq", &other).await {
        Err(e @ QueueError::AlreadyExists { .. }) => {
            // The values that differ, as the API names and writes them.
            let text = e.to_string();
            assert!(
                text.ends_with(
                    "with a different configuration: ack_timeout_ms 120000 (requested 5000)"
                ),
                "{text}"
            );
            let QueueError::AlreadyExists { differ, .. } = e else {
                unreachable!()
            };
            assert_eq!(differ, ["ack_timeout_ms"]);
        }
        other => panic!("expected ALREADY_EXISTS, got {other:?}"),
    }
    assert!(matches!(
        b.create_queue("q", &with_dlq("nope", 3)).await,
        Err(QueueError::NotFound { .. })
    ));
    assert!(matches!(
        b.create_queue("q", &with_dlq("q", 3)).await,
        Err(QueueError::InvalidArgument { .. })
    ));
    let fifo = QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ..Default::default()
    };
    b.create_queue("f", &fifo).await.expect("fifo");
    assert!(matches!(
        b.create_queue("q", &with_dlq("f", 3)).await,
        Err(QueueError::FailedPrecondition(_))
    ));
    b.create_queue("q", &with_dlq("dlq", 3))
        .await
        .expect("create with dlq");
    assert_eq!(b.get_queue("dlq").expect("get").dead_letter_sources, ["q"]);
    // dlq -> q would loop back.
    let loop_back = QueueConfigInput {
        dead_letter: Some(DeadLetterInput::new("q", 3)),
        ..Default::default()
    };
    let err = b
        .update_queue("dlq", &loop_back, QueueRemovals::default())
        .await
        .expect_err("loop");
    assert!(err.to_string().contains("loop"), "{err}");
    assert!(matches!(
        b.delete_queue("dlq", false).await,
        Err(QueueError::FailedPrecondition(_))
    ));
    env.publish("dlq", &["x"]).await;
    assert_eq!(b.delete_queue("dlq", true).await.expect("forced"), 1);
    assert_eq!(
        b.get_queue("q").expect("get").config.dead_letter,
        None,
        "detached"
    );
    let (page, next) = b.list_queues("", 1, None).expect("list");
    assert_eq!(page[0].name, "f");
    let (page, next) = b.list_queues("", 1, next.as_deref()).expect("list");
    assert_eq!(page[0].name, "q");
    assert_eq!(next, None);
}

#[tokio::test]
async fn purge_and_browse_do_not_count_deliveries() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["a", "b", "c"]).await;
    let page = env.b().browse("q", 2, "").expect("browse");
    assert_eq!(page.messages.len(), 2);
    let rest = env
        .b()
        .browse("q", 2, page.next.as_deref().expect("more"))
        .expect("browse");
    assert_eq!(rest.messages.len(), 1);
    assert_eq!(rest.next, None);
    assert!(page.messages.iter().all(|m| m.delivery_count == 0));
    let d = env.receive("q", 1).await.remove(0);
    assert_eq!(d.delivery_count, 1, "browsing did not count");
    assert_eq!(env.b().purge_queue("q").await.expect("purge"), 3);
    let s = env.stats("q");
    assert_eq!((s.total, s.counters.purged, s.in_flight), (0, 3, 0));
    assert!(matches!(env.ack(&d).await, Settled::LeaseExpired(_)));
}

#[tokio::test]
async fn long_poll_wakes_on_publish() {
    let env = Arc::new(Env::new());
    env.create("q", QueueConfigInput::default()).await;
    let e = Arc::clone(&env);
    let waiter = tokio::spawn(async move {
        e.b()
            .receive(
                "q",
                ReceiveOptions {
                    max_messages: 1,
                    wait: 10_000,
                    ..Default::default()
                },
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    env.publish("q", &["hello"]).await;
    let got = waiter.await.expect("task").expect("receive");
    assert_eq!(got.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(2));
}

async fn state_survives(crash: bool) {
    let mut env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 2)).await;
    env.publish("q", &["a", "b", "c", "d"]).await;
    let got = env.receive("q", 3).await;
    env.ack(&got[0]).await;
    env.nack(&got[1], "why").await;
    let d = env.receive("q", 1).await.remove(0);
    assert_eq!(body(&d), "b");
    env.nack(&d, "again").await; // second failure: to the DLQ
    let before = (env.stats("q"), env.stats("dlq"));
    if crash {
        env.crash()
    } else {
        env.restart()
    }
    assert_eq!((env.stats("q"), env.stats("dlq")), before);
    // The live lease of "c" keeps its deadline and its token works.
    assert_eq!(env.ack(&got[2]).await, Settled::Ok { deadline: 0 });
    let rest = env.receive("q", 10).await;
    assert_eq!(rest.iter().map(body).collect::<Vec<_>>(), ["d"]);
    let dl = env.receive("dlq", 10).await;
    assert_eq!(dl.iter().map(body).collect::<Vec<_>>(), ["b"]);
    assert_eq!(dl[0].dead_letters[0].last_nack_reason, "again");
    // New messages never reuse positions or ids.
    let ids = env.publish("q", &["e"]).await;
    assert!(!got.iter().any(|d| d.message_id == ids[0]));
}

#[tokio::test]
async fn state_survives_a_restart() {
    state_survives(false).await;
}

#[tokio::test]
async fn state_survives_a_crash() {
    state_survives(true).await;
}

#[tokio::test]
async fn a_lease_that_ran_out_while_down_expires_on_start_and_counts() {
    let mut env = Env::new();
    env.create(
        "q",
        QueueConfigInput {
            ack_timeout: Some(SECOND),
            ..Default::default()
        },
    )
    .await;
    env.publish("q", &["m"]).await;
    env.receive("q", 1).await;
    env.restart();
    env.advance(2 * SECOND).await;
    let d = env.receive("q", 1).await.remove(0);
    assert_eq!(d.delivery_count, 2);
    assert_eq!(d.attempts[0].outcome, AttemptOutcome::LeaseExpired);
}

// ---- FIFO -------------------------------------------------------------

fn fifo(extra: QueueConfigInput) -> QueueConfigInput {
    QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ack_timeout: Some(10 * SECOND),
        ..extra
    }
}

async fn publish_group(env: &Env, q: &str, group: &str, bodies: &[&str]) {
    let msgs = bodies
        .iter()
        .map(|b| NewMessage {
            body: Bytes::copy_from_slice(b.as_bytes()),
            group_id: (!group.is_empty()).then(|| group.to_string()),
            ..Default::default()
        })
        .collect();
    env.b().publish(q, msgs).await.expect("publish");
}

#[tokio::test]
async fn fifo_groups_are_leased_to_one_consumer_at_a_time_in_order() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "a", &["a1", "a2", "a3"]).await;
    publish_group(&env, "f", "b", &["b1"]).await;
    let first = env.receive("f", 2).await;
    assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["a1", "a2"]);
    let second = env.receive("f", 10).await;
    assert_eq!(
        second.iter().map(body).collect::<Vec<_>>(),
        ["b1"],
        "group a is leased"
    );
    env.nack(&first[0], "").await;
    // a1 failed, so a2, leased with it, was released: its ack settles
    // nothing (SPEC §3).
    assert!(matches!(env.ack(&first[1]).await, Settled::Released(_)));
    // a1 went back to the head, and a2 follows it again.
    let again = env.receive("f", 10).await;
    assert_eq!(
        again.iter().map(body).collect::<Vec<_>>(),
        ["a1", "a2", "a3"]
    );
    // Both were delivered twice; only a1 failed (SPEC §3: a release is a
    // delivery, not a failed attempt).
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!(
        (again[1].delivery_count, again[1].failed_attempts),
        (2, 0),
        "a release counts as a delivery, not as a failure"
    );
    assert_eq!((again[2].delivery_count, again[2].failed_attempts), (1, 0));
}

/// Receives from `q` and returns the bodies.
async fn bodies(env: &Env, q: &str, n: u32) -> (Vec<Delivery>, Vec<String>) {
    let got = env.receive(q, n).await;
    let b = got.iter().map(|d| body(d).to_string()).collect();
    (got, b)
}

#[tokio::test]
async fn fifo_a_nack_releases_the_later_messages_of_its_group_leased_with_it() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    publish_group(&env, "f", "h", &["h1"]).await;
    let (got, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2", "m3", "h1"]);
    // Acking a later one while an earlier one is still leased is allowed
    // (a consumer acking as it goes is not what the rule refuses) ...
    let (got2, _) = {
        // ... but here m1 fails first.
        let n = Nack {
            token: got[1].ack_token.clone().expect("token"),
            delay: None,
            reason: "m2 broke".into(),
            dead_letter: false,
        };
        let (r, released) = env.b().nack_releasing(&[n]).await.expect("nack");
        assert_eq!(r, [Settled::Ok { deadline: 0 }]);
        // m3 is released with m2; m1 (earlier) and h1 (another group) not.
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].message_id, got[2].message_id);
        assert_eq!(released[0].because_of, got[1].message_id);
        assert_eq!(Some(&released[0].ack_token), got[2].ack_token.as_ref());
        (got.clone(), ())
    };
    let Settled::Released(why) = env.ack(&got2[2]).await else {
        panic!("m3's ack must say it was released");
    };
    assert!(why.contains(&got[1].message_id), "{why}");
    assert!(
        why.contains(got[2].ack_token.as_deref().expect("token")),
        "{why}"
    );
    // m1 is still leased and can be acked; h1 too.
    assert_eq!(env.ack(&got[0]).await, Settled::Ok { deadline: 0 });
    assert_eq!(env.ack(&got[3]).await, Settled::Ok { deadline: 0 });
    // An extend or a nack of the released token is refused the same way.
    let r = env
        .b()
        .extend(&[(got[2].ack_token.clone().expect("token"), 10 * SECOND)])
        .await
        .expect("extend");
    assert!(matches!(r[0], Settled::Released(_)));
    assert!(matches!(env.nack(&got[2], "").await, Settled::Released(_)));
    // The group restarts at m2, then m3; m3's release is in its history,
    // counted as a delivery but not as a failure.
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2", "m3"]);
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!(again[0].attempts[0].reason, "m2 broke");
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
    assert_eq!(again[1].attempts.len(), 1);
    assert_eq!(again[1].attempts[0].outcome, AttemptOutcome::Released);
    assert!(again[1].attempts[0].reason.contains(&got[1].message_id));
    let st = env.stats("f");
    assert_eq!(st.counters.nacked, 1, "only m2's failure counts");
    // The old token of m3 still names the release after m3 was leased
    // again.
    assert!(matches!(env.ack(&got[2]).await, Settled::Released(_)));
    assert_eq!(env.ack(&again[0]).await, Settled::Ok { deadline: 0 });
    assert_eq!(env.ack(&again[1]).await, Settled::Ok { deadline: 0 });
}

/// An ack refused because another call ended its lease (here a nack
/// that released it) is answered only once that call's change is
/// durable: a crash could otherwise undo the release the answer reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_refused_by_another_calls_change_waits_until_that_is_durable() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    let (got, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    env.b()
        .store()
        .backend()
        .local()
        .expect("local store")
        .hold_log(held_tx, release_rx);
    held_rx.recv().expect("log held");
    // The nack is decided and logged, not durable.
    let mut nack = std::pin::pin!(env.nack(&got[0], "m1 broke"));
    let early = tokio::time::timeout(Duration::from_millis(100), &mut nack).await;
    assert!(early.is_err(), "a nack answered before it was durable");
    // m2's ack finds m2 released by it: no answer while the nack may
    // still be lost.
    let mut ack = std::pin::pin!(env.ack(&got[1]));
    let early = tokio::time::timeout(Duration::from_millis(300), &mut ack).await;
    assert!(
        early.is_err(),
        "RELEASED answered before the release was durable: {early:?}"
    );
    release_tx.send(()).expect("release");
    assert_eq!(nack.await, Settled::Ok { deadline: 0 });
    assert!(matches!(ack.await, Settled::Released(_)));
}

#[tokio::test]
async fn fifo_a_lease_that_runs_out_releases_the_rest_of_its_group_as_no_failure() {
    let mut env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    env.create("f", fifo(with_dlq("fdlq", 2))).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    // Twice: both leased, both run out. m1 fails each time; m2 is released
    // each time, so it never reaches max_deliveries, though its
    // deliveries rise like m1's.
    for round in 1..=2 {
        let (got, b) = bodies(&env, "f", 10).await;
        assert_eq!(b, ["m1", "m2"], "round {round}");
        assert_eq!(
            (got[0].delivery_count, got[0].failed_attempts),
            (round, round - 1)
        );
        assert_eq!((got[1].delivery_count, got[1].failed_attempts), (round, 0));
        // A restart with the leases outstanding changes nothing.
        env.crash();
        env.advance(11 * SECOND).await;
        assert!(matches!(env.ack(&got[1]).await, Settled::Released(_)));
    }
    // m1 went to the DLQ after its second failure; the group goes on
    // with m2, which was never a failed attempt.
    let (got, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2"]);
    assert_eq!((got[0].delivery_count, got[0].failed_attempts), (3, 0));
    assert_eq!(
        got[0]
            .attempts
            .iter()
            .map(|a| a.outcome)
            .collect::<Vec<_>>(),
        [AttemptOutcome::Released, AttemptOutcome::Released]
    );
    let (dl, b) = bodies(&env, "fdlq", 10).await;
    assert_eq!(b, ["m1"]);
    assert_eq!(dl[0].dead_letters[0].delivery_count, 2);
    assert_eq!(dl[0].dead_letters[0].failed_attempts, 2);
}

#[tokio::test]
async fn fifo_a_reject_releases_and_the_group_goes_on_with_the_next() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    env.create("f", fifo(with_dlq("fdlq", 5))).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let got = env.receive("f", 10).await;
    let n = Nack {
        token: got[0].ack_token.clone().expect("token"),
        delay: None,
        reason: "invalid".into(),
        dead_letter: true,
    };
    let (_, released) = env.b().nack_releasing(&[n]).await.expect("reject");
    assert_eq!(released.len(), 2);
    assert!(matches!(env.ack(&got[1]).await, Settled::Released(_)));
    let (_, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2", "m3"]);
}

#[tokio::test]
async fn fifo_the_release_survives_a_crash() {
    let mut env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    let got = env.receive("f", 10).await;
    env.nack(&got[0], "").await;
    env.crash();
    assert!(matches!(env.ack(&got[1]).await, Settled::Released(_)));
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
}

#[tokio::test]
async fn fifo_returned_leases_release_in_order() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let got = env.receive("f", 10).await;
    // A closed stream returns its deliveries in any order: the earliest
    // counts as the failed attempt, the later ones are released.
    let tokens: Vec<String> = got
        .iter()
        .rev()
        .map(|d| d.ack_token.clone().expect("t"))
        .collect();
    assert_eq!(env.b().return_leases(&tokens).await.expect("return"), 1);
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2", "m3"]);
    let counts: Vec<(u32, u32)> = again
        .iter()
        .map(|d| (d.delivery_count, d.failed_attempts))
        .collect();
    assert_eq!(counts, [(2, 1), (2, 0), (2, 0)]);
    assert_eq!(again[0].attempts[0].outcome, AttemptOutcome::StreamClosed);
}

#[tokio::test]
async fn fifo_max_per_group_caps_one_group_in_a_receive() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["g1", "g2", "g3"]).await;
    publish_group(&env, "f", "h", &["h1", "h2"]).await;
    let opts = ReceiveOptions {
        max_messages: 10,
        max_per_group: 1,
        ..ReceiveOptions::default()
    };
    let got = env.b().receive("f", opts).await.expect("receive");
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["g1", "h1"]);
    for d in &got {
        env.ack(d).await;
    }
    let opts = ReceiveOptions {
        max_per_group: 2,
        ..opts
    };
    let got = env.b().receive("f", opts).await.expect("receive");
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["g2", "g3", "h2"]);
}

#[tokio::test]
async fn fifo_rotation_is_fair_to_small_groups() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    let big: Vec<String> = (0..200).map(|i| format!("big{i}")).collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    publish_group(&env, "f", "big", &big).await;
    publish_group(&env, "f", "small", &["s1"]).await;
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "big0");
    env.ack(&d).await;
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(
        body(&d),
        "s1",
        "the small group is served before the big one's next message"
    );
}

#[tokio::test]
async fn fifo_poison_dead_letters_and_continues() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    env.create("f", fifo(with_dlq("fdlq", 2))).await;
    publish_group(&env, "f", "g", &["p", "next"]).await;
    for _ in 0..2 {
        let d = env.receive("f", 1).await.remove(0);
        assert_eq!(body(&d), "p");
        env.nack(&d, "boom").await;
    }
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "next");
    let dl = env.receive("fdlq", 1).await.remove(0);
    assert_eq!(
        (body(&dl), dl.group_id.as_deref()),
        ("p", Some("g")),
        "group kept in the DLQ"
    );
}

#[tokio::test]
async fn fifo_park_skip_and_release() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    let cfg = fifo(QueueConfigInput {
        on_poison: Some(PoisonPolicy::ParkGroup),
        ..with_dlq("fdlq", 1)
    });
    env.create("f", cfg).await;
    publish_group(&env, "f", "g", &["p", "q", "r"]).await;
    let d = env.receive("f", 1).await.remove(0);
    env.nack(&d, "boom").await;
    assert!(env.receive("f", 10).await.is_empty(), "the group is parked");
    let (groups, _) = env.b().list_groups("f", 10, None, None).expect("groups");
    assert_eq!(groups[0].state, GroupState::Parked);
    assert_eq!(groups[0].backlog, 3);
    assert_eq!(env.stats("f").parked, 3);
    let (groups, _) = env.b().list_groups("f", 10, None, None).expect("groups");
    assert_eq!(
        (
            groups[0].head_delivery_count,
            groups[0].head_failed_attempts
        ),
        (1, 1)
    );
    let id = env.b().release_group("f", "g").await.expect("release");
    assert_eq!(id, d.message_id);
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(
        (body(&d), d.delivery_count, d.failed_attempts),
        ("p", 2, 0),
        "the release resets the failed attempts, not the deliveries"
    );
    env.nack(&d, "boom again").await;
    assert!(env.receive("f", 10).await.is_empty(), "parked again");
    let skipped = env
        .b()
        .skip_head("f", "g", "bad data, ticket 42")
        .await
        .expect("skip");
    assert_eq!(skipped, d.message_id);
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "q");
    let m = env
        .b()
        .browse("fdlq", 1, "")
        .expect("browse")
        .messages
        .remove(0);
    assert_eq!(m.dead_letters[0].reason, DeadLetterReason::Skipped);
    assert_eq!(m.dead_letters[0].note, "bad data, ticket 42");
}

#[tokio::test]
async fn fifo_dedup_window_survives_a_crash_and_expires() {
    let mut env = Env::new();
    env.create(
        "f",
        fifo(QueueConfigInput {
            dedup_window: Some(MINUTE),
            ..Default::default()
        }),
    )
    .await;
    let m = |d: &str| NewMessage {
        body: Bytes::from_static(b"x"),
        dedup_id: Some(d.into()),
        ..Default::default()
    };
    let first = env
        .b()
        .publish("f", vec![m("k"), m("k")])
        .await
        .expect("publish");
    assert!(!first[0].duplicate && first[1].duplicate);
    assert_eq!(first[1].message_id, first[0].message_id);
    let d = env.receive("f", 1).await.remove(0);
    env.ack(&d).await;
    env.crash();
    let again = env.b().publish("f", vec![m("k")]).await.expect("publish");
    assert!(again[0].duplicate, "consumed, but still within the window");
    assert_eq!(again[0].message_id, first[0].message_id);
    env.advance(MINUTE).await;
    let later = env.b().publish("f", vec![m("k")]).await.expect("publish");
    assert!(!later[0].duplicate, "the window ran out");
}

#[tokio::test]
async fn fifo_refuses_per_message_delays_and_standard_refuses_groups() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    env.create("s", QueueConfigInput::default()).await;
    let delayed = NewMessage {
        body: Bytes::from_static(b"x"),
        delay: Some(5),
        ..Default::default()
    };
    let err = env
        .b()
        .publish("f", vec![delayed])
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("messages[0].delay_ms"), "{err}");
    let grouped = NewMessage {
        body: Bytes::from_static(b"x"),
        group_id: Some("g".into()),
        ..Default::default()
    };
    let err = env
        .b()
        .publish("s", vec![grouped])
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("messages[0].group_id"), "{err}");
    assert_eq!(env.stats("f").total + env.stats("s").total, 0);
}

#[tokio::test]
async fn fifo_dedups_client_message_ids_over_the_window_even_after_consumption() {
    let mut env = Env::new();
    // The default window: 5 minutes, Anypoint MQ's FIFO dedup rule.
    env.create("f", fifo(QueueConfigInput::default())).await;
    let m = |id: &str, body: &'static str| NewMessage {
        message_id: Some(id.into()),
        body: Bytes::from_static(body.as_bytes()),
        group_id: Some("g".into()),
        ..Default::default()
    };
    let first = env
        .b()
        .publish("f", vec![m("order-1", "first"), m("order-1", "again")])
        .await
        .expect("publish");
    assert!(!first[0].duplicate && first[1].duplicate);
    let d = env.receive("f", 10).await;
    assert_eq!(d.len(), 1, "the repeat in the batch was not stored");
    assert_eq!(body(&d[0]), "first");
    env.ack(&d[0]).await;
    assert_eq!(env.stats("f").total, 0);
    env.crash();
    env.advance(4 * MINUTE).await;
    let again = env
        .b()
        .publish("f", vec![m("order-1", "late repeat")])
        .await
        .expect("publish");
    assert!(
        again[0].duplicate,
        "consumed, crashed, but still within 5 minutes"
    );
    assert_eq!(again[0].message_id, "order-1");
    assert_eq!(env.stats("f").total, 0, "nothing stored");
    env.advance(MINUTE).await;
    let later = env
        .b()
        .publish("f", vec![m("order-1", "new")])
        .await
        .expect("publish");
    assert!(!later[0].duplicate, "the window ran out");
    assert_eq!(body(&env.receive("f", 1).await[0]), "new");
}

#[tokio::test]
async fn lease_holder_names_the_queue_and_message_of_a_current_lease_only() {
    let env = Env::new();
    env.create(
        "q",
        QueueConfigInput {
            ack_timeout: Some(10 * SECOND),
            message_ttl: Some(HOUR),
            ..Default::default()
        },
    )
    .await;
    env.b()
        .publish(
            "q",
            vec![NewMessage {
                message_id: Some("m-1".into()),
                body: Bytes::from_static(b"x"),
                ..Default::default()
            }],
        )
        .await
        .expect("publish");
    env.clock.advance(5);
    let d = env.receive("q", 1).await.remove(0);
    assert_eq!((d.enqueued_at, d.expires_at), (T0, T0 + HOUR));
    let token = d.ack_token.clone().expect("token");
    let held = env
        .b()
        .lease_holder("lockId", &token)
        .expect("well formed")
        .expect("current");
    assert_eq!(
        held,
        LeasedMessage {
            queue: "q".into(),
            message_id: "m-1".into(),
            deadline: T0 + 5 + 10 * SECOND,
        }
    );
    let err = env
        .b()
        .lease_holder("lockId", "not-a-token")
        .expect_err("malformed")
        .to_string();
    assert!(
        err.contains("lockId") && err.contains("not-a-token"),
        "{err}"
    );
    // A lease that ran out (before any sweep) is no longer held.
    env.clock.advance(10 * SECOND);
    assert_eq!(env.b().lease_holder("lockId", &token).expect("ok"), None);
    env.advance(0).await;
    let d = env.receive("q", 1).await.remove(0);
    let token2 = d.ack_token.clone().expect("token");
    assert!(
        env.b()
            .lease_holder("lockId", &token2)
            .expect("ok")
            .is_some()
    );
    env.ack(&d).await;
    assert_eq!(env.b().lease_holder("lockId", &token2).expect("ok"), None);
}

// ---- Damaged bodies ----------------------------------------------------

/// Replaces the stored payload of the message of `q` whose body is `body`
/// with one whose body fails its checksum (a byte flipped on disk).
async fn damage(env: &Env, q: &str, body_text: &str) {
    let b = env.b();
    let (qid, positions): (u32, Vec<u64>) = {
        let st = b.lock();
        let qid = st.qid(q).expect("queue");
        let positions = st.queues[&qid].msgs.iter().map(|(p, _)| p).collect();
        (qid, positions)
    };
    for pos in positions {
        let meta = b.meta(qid, pos).expect("meta");
        let Some(mut rec) = b.store.get_payload(meta.pid()).expect("payload") else {
            continue;
        };
        if rec.body.as_ref() != body_text.as_bytes() {
            continue;
        }
        let mut flipped = rec.body.to_vec();
        flipped[0] ^= 0x20;
        rec.body = Bytes::from(flipped);
        let mut txn = crate::storage::Txn::new();
        txn.put_payload(meta.pid(), crate::storage::encode_payload(&rec));
        let c = b.store.submit(txn);
        c.wait().await.expect("durable");
        return;
    }
    panic!("no message {body_text:?} in {q}");
}

#[tokio::test]
async fn a_damaged_body_goes_to_the_dlq_alone_and_uncounted() {
    let env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 3)).await;
    env.publish("q", &["m1", "m2", "m3", "m4", "m5"]).await;
    damage(&env, "q", "m3").await;
    let (got, b) = bodies(&env, "q", 10).await;
    assert_eq!(b, ["m1", "m2", "m4", "m5"], "the neighbours are delivered");
    assert!(got.iter().all(|d| d.delivery_count == 1));
    assert_eq!(env.b().corrupt_records_found(), 1);
    let dl = env.b().browse("dlq", 10, "").expect("browse").messages;
    assert_eq!(dl.len(), 1);
    let rec = &dl[0].dead_letters[0];
    assert_eq!(rec.reason, DeadLetterReason::Corrupted);
    assert_eq!(rec.delivery_count, 0, "the failed read was no delivery");
    assert!(rec.note.contains("checksum"), "{}", rec.note);
    assert!(dl[0].damaged.contains("checksum"), "browse marks it");
    assert!(dl[0].body.is_empty());
    let st = env.stats("q");
    assert_eq!((st.in_flight, st.counters.dead_lettered), (4, 1));
}

#[tokio::test]
async fn without_a_dlq_a_damaged_body_waits_and_browse_marks_it() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["m1", "m2", "m3"]).await;
    damage(&env, "q", "m2").await;
    // A receive of one message at a time is not starved by it.
    let (first, b) = bodies(&env, "q", 1).await;
    assert_eq!(b, ["m1"]);
    env.ack(&first[0]).await;
    let (third, b) = bodies(&env, "q", 1).await;
    assert_eq!(b, ["m3"]);
    let page = env.b().browse("q", 10, "").expect("browse").messages;
    assert_eq!(page.len(), 2);
    env.ack(&third[0]).await;
    let bad = page.iter().find(|m| !m.damaged.is_empty()).expect("marked");
    assert_eq!(bad.state, MessageState::Delayed);
    assert_eq!(bad.delivery_count, 0);
    assert_eq!(env.stats("q").delayed, 1);
    // An hour later it is tried again, and set aside again: never lost.
    env.advance(HOUR).await;
    assert!(env.receive("q", 10).await.is_empty());
    assert_eq!(env.stats("q").total, 1);
    assert!(env.b().corrupt_records_found() >= 2);
}

#[tokio::test]
async fn an_auto_ack_receive_never_deletes_a_damaged_body() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["m1", "m2", "m3"]).await;
    damage(&env, "q", "m2").await;
    let opts = ReceiveOptions {
        max_messages: 10,
        auto_ack: true,
        ..ReceiveOptions::default()
    };
    let got = env.b().receive("q", opts).await.expect("receive");
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["m1", "m3"]);
    let st = env.stats("q");
    assert_eq!((st.total, st.delayed, st.counters.acked), (1, 1, 2));
}

#[tokio::test]
async fn fifo_a_damaged_body_holds_its_group_back_and_nothing_is_counted() {
    let mut env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    publish_group(&env, "f", "h", &["h1"]).await;
    damage(&env, "f", "m2").await;
    let (got, b) = bodies(&env, "f", 10).await;
    // m3 is not delivered ahead of m2; group h is not held up.
    assert_eq!(b, ["m1", "h1"]);
    for d in &got {
        assert_eq!(env.ack(d).await, Settled::Ok { deadline: 0 });
    }
    env.crash();
    assert!(env.receive("f", 10).await.is_empty(), "m2 blocks its group");
    let page = env.b().browse("f", 10, "").expect("browse").messages;
    let counts: Vec<u32> = page.iter().map(|m| m.delivery_count).collect();
    assert_eq!(counts, [0, 0], "neither m2 nor m3 counted a delivery");
}

#[tokio::test]
async fn fifo_a_lease_run_out_releases_before_the_sweeper_comes() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    let got = env.receive("f", 10).await;
    // m2's lease is extended; m1's runs out, and the sweeper has not run.
    let t2 = got[1].ack_token.clone().expect("token");
    env.b().extend(&[(t2, 60 * SECOND)]).await.expect("extend");
    env.clock.advance(11 * SECOND);
    // The ack of m2 ends m1's lease first, which releases m2.
    let r = env.ack(&got[1]).await;
    assert!(matches!(r, Settled::Released(_)), "{r:?}");
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
}

#[tokio::test]
async fn fifo_nacking_a_whole_batch_in_one_call_releases_the_rest() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let got = env.receive("f", 10).await;
    let items: Vec<Nack> = got
        .iter()
        .map(|d| Nack {
            token: d.ack_token.clone().expect("token"),
            delay: None,
            reason: "whole batch".into(),
            dead_letter: false,
        })
        .collect();
    let (r, released) = env.b().nack_releasing(&items).await.expect("nack");
    assert_eq!(r[0], Settled::Ok { deadline: 0 });
    assert!(matches!(r[1], Settled::Released(_)), "{:?}", r[1]);
    assert!(matches!(r[2], Settled::Released(_)), "{:?}", r[2]);
    assert_eq!(released.len(), 2);
    let (again, _) = bodies(&env, "f", 10).await;
    let counts: Vec<(u32, u32)> = again
        .iter()
        .map(|d| (d.delivery_count, d.failed_attempts))
        .collect();
    assert_eq!(counts, [(2, 1), (2, 0), (2, 0)]);
}

/// An ack riding on a Receive first ends the leases that ran out (a FIFO
/// release must not wait for the sweeper); when that moves a message into
/// the very queue being received from, the pick that follows must find
/// it stored, not fail with "indexed but not stored" and leave the move
/// in memory only.
#[tokio::test]
async fn an_ack_riding_on_receive_moves_due_messages_before_the_pick() {
    let mut env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("work", with_dlq("dlq", 1)).await;
    env.publish("work", &["first", "second"]).await;
    let leased = env.receive("work", 2).await;
    assert_eq!(leased.len(), 2);
    // Ack the second one while receiving from the DLQ, after the first
    // one's lease ran out and before the sweeper ran.
    env.clock.advance(11 * SECOND);
    let ack = leased[1].ack_token.clone().expect("token");
    let r = env
        .b()
        .receive_acking(
            "dlq",
            ReceiveOptions {
                max_messages: 10,
                ..ReceiveOptions::default()
            },
            &[ack],
        )
        .await
        .expect("receive with an ack");
    let (settled, got) = (r.acks, r.received.expect("the receive"));
    // The second one's lease also ran out, so the ack comes too late.
    assert!(
        matches!(settled[0], Settled::LeaseExpired(_)),
        "{settled:?}"
    );
    let bodies: Vec<&str> = got.iter().map(body).collect();
    assert_eq!(bodies, ["first", "second"]);
    // In the store too: after a crash the DLQ still holds them, leased.
    env.crash();
    let s = env.stats("dlq");
    assert_eq!(s.total, 2, "{s:?}");
    assert_eq!(env.stats("work").total, 0);
}

/// An ack that comes after its lease ran out, before the sweeper ended
/// it, ends it itself (`catch_up`) and answers LEASE_EXPIRED. When the
/// message's previous lease had been released (SPEC §3), that answer must
/// not be RELEASED naming the message that failed back then: the expiry
/// the ack's own call recorded is the lease's end, not the release before.
#[tokio::test]
async fn fifo_an_ack_after_the_deadline_answers_expired_though_the_lease_before_was_released() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let first = env.receive("f", 10).await;
    // m1 fails: m2 and m3, leased with it, are released.
    env.nack(&first[0], "").await;
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2", "m3"]);
    assert_eq!(env.ack(&again[0]).await, Settled::Ok { deadline: 0 });
    // m2's lease runs out (m3's too); the sweeper has not run.
    env.clock.advance(11 * SECOND);
    let r = env.ack(&again[1]).await;
    assert!(matches!(r, Settled::LeaseExpired(_)), "{r:?}");
    // m2's expiry released m3, and m3's ack names m2, not m1.
    let Settled::Released(why) = env.ack(&again[2]).await else {
        panic!("m3 was released with m2");
    };
    assert!(why.contains(&again[1].message_id), "{why}");
    // m2 failed once (the expiry); m3 was released by it, no failure.
    // Both were delivered three times.
    let (last, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2", "m3"]);
    assert_eq!((last[0].delivery_count, last[0].failed_attempts), (3, 1));
    assert_eq!((last[1].delivery_count, last[1].failed_attempts), (3, 0));
}

/// One sweep that ends a FIFO lease and then expires what it released:
/// the released message's record was written by the sweep's own change
/// (its lease gone, the release in its history, no failure counted), and
/// the move to the DLQ must carry that record, not the stored one.
#[tokio::test]
async fn fifo_a_message_released_and_expired_in_one_sweep_is_dead_lettered_as_no_failure() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    let cfg = QueueConfigInput {
        message_ttl: Some(MINUTE),
        dead_letter_on_expiry: Some(true),
        ..fifo(with_dlq("fdlq", 5))
    };
    env.create("f", cfg).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    env.advance(55 * SECOND).await;
    let got = env.receive("f", 10).await;
    assert_eq!(got.len(), 2);
    // Past both the leases (10 s) and the time to live (a minute), in one
    // sweep: m1's lease ends first and releases m2, then both expire.
    env.advance(11 * SECOND).await;
    let (dl, b) = bodies(&env, "fdlq", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    let counts: Vec<(u32, u32)> = dl
        .iter()
        .map(|d| {
            let r = &d.dead_letters[0];
            (r.delivery_count, r.failed_attempts)
        })
        .collect();
    assert_eq!(
        counts,
        [(1, 1), (1, 0)],
        "m2's release counted as a delivery, not as a failure"
    );
    assert!(
        dl[1].dead_letters[0].last_nack_reason.contains("released"),
        "{:?}",
        dl[1].dead_letters[0]
    );
}

#[tokio::test]
async fn the_oldest_ready_age_is_that_of_the_first_message_deliverable_now() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.create("f", fifo(QueueConfigInput::default())).await;
    let ages = |env: &Env| {
        env.b()
            .oldest_ready_ages()
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>()
    };
    assert_eq!(ages(&env)["q"], 0, "empty");
    env.publish("q", &["a"]).await;
    env.clock.advance(1000);
    env.publish("q", &["b"]).await;
    publish_group(&env, "f", "g1", &["g1a", "g1b"]).await;
    env.clock.advance(500);
    publish_group(&env, "f", "g2", &["g2a"]).await;
    env.clock.advance(250);
    let a = ages(&env);
    assert_eq!((a["q"], a["f"]), (1750, 750));
    // Leased, the first is no longer ready: the next one is.
    assert_eq!(env.receive("q", 1).await.len(), 1);
    // FIFO: g1 is leased, so only g2's head is deliverable.
    assert_eq!(body(&env.receive("f", 1).await[0]), "g1a");
    let a = ages(&env);
    assert_eq!((a["q"], a["f"]), (750, 250));
    assert_eq!(env.receive("q", 10).await.len(), 1);
    assert_eq!(env.receive("f", 10).await.len(), 1);
    let a = ages(&env);
    assert_eq!((a["q"], a["f"]), (0, 0), "nothing deliverable now");
}
