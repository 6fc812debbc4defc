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

pub(super) const T0: u64 = 1_700_000_000_000;

pub(super) struct Env {
    pub(super) dir: tempfile::TempDir,
    pub(super) clock: Arc<ManualClock>,
    pub(super) broker: Option<Broker>,
}

pub(super) fn store_opts() -> StoreOptions {
    StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

pub(super) fn open(dir: &Path, clock: &Arc<ManualClock>) -> Broker {
    let (store, _) = Store::open(dir, store_opts()).expect("store opens");
    Broker::open(store, clock.clone(), BrokerOptions::default()).expect("broker opens")
}

impl Env {
    pub(super) fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(T0));
        let broker = Some(open(dir.path(), &clock));
        Env { dir, clock, broker }
    }

    pub(super) fn b(&self) -> &Broker {
        self.broker.as_ref().expect("open")
    }

    /// Closes and reopens the engine on the same directory.
    pub(super) fn restart(&mut self) {
        if let Some(b) = self.broker.take() {
            b.close().expect("close");
        }
        self.broker = Some(open(self.dir.path(), &self.clock));
    }

    /// Stops like a crash (no final apply or checkpoint) and reopens.
    pub(super) fn crash(&mut self) {
        if let Some(b) = self.broker.take() {
            b.store.crash();
        }
        self.broker = Some(open(self.dir.path(), &self.clock));
    }

    pub(super) async fn advance(&self, ms: u64) {
        self.clock.advance(ms);
        self.b().run_timers().await.expect("timers");
    }

    pub(super) async fn create(&self, name: &str, input: QueueConfigInput) {
        self.b().create_queue(name, &input).await.expect("create");
    }

    pub(super) async fn publish(&self, q: &str, bodies: &[&str]) -> Vec<String> {
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

    pub(super) async fn receive(&self, q: &str, n: u32) -> Vec<Delivery> {
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

    pub(super) async fn ack(&self, d: &Delivery) -> Settled {
        let t = d.ack_token.clone().expect("token");
        self.b().ack(&[t]).await.expect("ack").remove(0)
    }

    pub(super) async fn nack(&self, d: &Delivery, reason: &str) -> Settled {
        let n = Nack {
            token: d.ack_token.clone().expect("token"),
            delay: None,
            reason: reason.into(),
            dead_letter: false,
        };
        self.b().nack(&[n]).await.expect("nack").remove(0)
    }

    pub(super) fn stats(&self, q: &str) -> QueueStats {
        self.b().stats(q).expect("stats")
    }
}

pub(super) fn body(d: &Delivery) -> &str {
    std::str::from_utf8(&d.body).expect("utf8")
}

pub(super) fn with_dlq(dlq: &str, max: u32) -> QueueConfigInput {
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

pub(super) fn fifo(extra: QueueConfigInput) -> QueueConfigInput {
    QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ack_timeout: Some(10 * SECOND),
        ..extra
    }
}

pub(super) async fn publish_group(env: &Env, q: &str, group: &str, bodies: &[&str]) {
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

/// Receives from `q` and returns the bodies.
pub(super) async fn bodies(env: &Env, q: &str, n: u32) -> (Vec<Delivery>, Vec<String>) {
    let got = env.receive(q, n).await;
    let b = got.iter().map(|d| body(d).to_string()).collect();
    (got, b)
}
