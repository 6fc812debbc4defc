//! Publish, receive, ack, nack, extend over gRPC (SPEC §2, §3, §7).

use std::time::{Duration, Instant};

use letterbox::pb;
use tonic::Code;

use crate::harness::*;

#[tokio::test]
async fn the_core_flow_counts_exactly() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let ids = c.publish("q", &["one", "two", "three"]).await;
    assert_eq!(ids.len(), 3);
    assert!(
        ids[0] < ids[1] && ids[1] < ids[2],
        "server ids are time-ordered"
    );
    let got = c.receive("q", 2).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["one", "two"]);
    assert_eq!(got[0].delivery_count, 1);
    assert_eq!(got[0].queue, "q");
    assert!(got[0].lease_deadline_unix_ms > got[0].first_delivered_at_unix_ms);
    let st = c.stats("q").await;
    assert_eq!(
        (st.ready, st.in_flight, st.total, st.published),
        (1, 2, 3, 3)
    );
    let r = c.ack(&[&got[0].ack_token, &got[0].ack_token]).await;
    assert!(ok(&r[0]));
    assert_eq!(
        r[1].status,
        pb::SettleStatus::LeaseExpired as i32,
        "second ack of one token fails"
    );
    assert_eq!(r[1].code, Code::FailedPrecondition as i32);
    assert!(r[1].error.contains(&got[0].ack_token));
    let n = c.nack(&got[1].ack_token, "temporary outage").await;
    assert!(ok(&n));
    let again = c.receive("q", 10).await;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["two", "three"]);
    assert_eq!(again[0].delivery_count, 2);
    assert_eq!(again[0].attempts.len(), 1);
    assert_eq!(again[0].attempts[0].reason, "temporary outage");
    assert_eq!(
        again[0].attempts[0].outcome,
        pb::AttemptOutcome::Nacked as i32
    );
    let st = c.stats("q").await;
    assert_eq!((st.acked, st.nacked, st.in_flight, st.ready), (1, 1, 2, 0));
}

#[tokio::test]
async fn a_bad_message_rejects_the_whole_batch() {
    let s = TestServer::start_with(&["--max-message-size", "1KiB"]).await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let publish = |messages: Vec<pb::PublishMessage>| pb::PublishRequest {
        queue: "q".into(),
        messages,
        ..Default::default()
    };
    let big = pb::PublishMessage {
        body: vec![0u8; 1025].into(),
        ..Default::default()
    };
    let cases: Vec<(Vec<pb::PublishMessage>, Code, &str)> = vec![
        (
            vec![msg("ok"), big],
            Code::ResourceExhausted,
            "messages[1].body",
        ),
        (vec![], Code::InvalidArgument, "messages"),
        (
            (0..1001).map(|_| msg("x")).collect(),
            Code::InvalidArgument,
            "1000",
        ),
        (
            vec![
                msg("ok"),
                pb::PublishMessage {
                    ttl_ms: Some(500),
                    ..msg("x")
                },
            ],
            Code::InvalidArgument,
            "messages[1].ttl_ms",
        ),
        (
            vec![pb::PublishMessage {
                delay_ms: Some(900_001),
                ..msg("x")
            }],
            Code::InvalidArgument,
            "messages[0].delay_ms",
        ),
        (
            vec![pb::PublishMessage {
                message_id: "x".repeat(257),
                ..msg("x")
            }],
            Code::InvalidArgument,
            "messages[0].message_id",
        ),
        (
            vec![pb::PublishMessage {
                properties: (0..65).map(|i| (format!("k{i}"), "v".into())).collect(),
                ..msg("x")
            }],
            Code::InvalidArgument,
            "messages[0].properties",
        ),
        (
            vec![pb::PublishMessage {
                properties: [(String::new(), "v".into())].into(),
                ..msg("x")
            }],
            Code::InvalidArgument,
            "messages[0].properties",
        ),
        (
            vec![pb::PublishMessage {
                group_id: "g".into(),
                ..msg("x")
            }],
            Code::InvalidArgument,
            "messages[0].group_id",
        ),
    ];
    for (messages, code, needle) in cases {
        assert_status(c.msg.publish(publish(messages)).await, code, needle);
    }
    let r = c
        .msg
        .publish(pb::PublishRequest {
            queue: "nope".into(),
            messages: vec![msg("x")],
            ..Default::default()
        })
        .await;
    assert_status(r, Code::NotFound, "nope");
    assert_eq!(c.stats("q").await.total, 0, "nothing was stored");
}

#[tokio::test]
async fn bad_settle_and_receive_requests_change_nothing() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    c.publish("q", &["m"]).await;
    let d = c.receive("q", 1).await.remove(0);
    let r = c
        .msg
        .ack(pb::AckRequest {
            ack_tokens: vec![d.ack_token.clone(), "garbage".into()],
        })
        .await;
    assert_status(r, Code::InvalidArgument, "ack_tokens[1]");
    assert_status(
        c.msg.ack(pb::AckRequest { ack_tokens: vec![] }).await,
        Code::InvalidArgument,
        "ack_tokens",
    );
    let r = c
        .msg
        .nack(pb::NackRequest {
            items: vec![pb::NackItem {
                ack_token: d.ack_token.clone(),
                dead_letter: true,
                ..Default::default()
            }],
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "no dead letter queue");
    let r = c
        .msg
        .nack(pb::NackRequest {
            items: vec![pb::NackItem {
                ack_token: d.ack_token.clone(),
                reason: "x".repeat(1025),
                ..Default::default()
            }],
        })
        .await;
    assert_status(r, Code::InvalidArgument, "items[0].reason");
    let r = c
        .msg
        .extend_lease(pb::ExtendLeaseRequest {
            items: vec![pb::ExtendItem {
                ack_token: d.ack_token.clone(),
                timeout_ms: 10,
            }],
        })
        .await;
    assert_status(r, Code::InvalidArgument, "items[0].timeout_ms");
    let bad_receives = [
        (
            pb::ReceiveRequest {
                queue: "q".into(),
                max_messages: 1001,
                ..Default::default()
            },
            Code::InvalidArgument,
            "max_messages",
        ),
        (
            pb::ReceiveRequest {
                queue: "q".into(),
                wait_ms: 20_001,
                ..Default::default()
            },
            Code::InvalidArgument,
            "wait_ms",
        ),
        (
            pb::ReceiveRequest {
                queue: "q".into(),
                ack_timeout_ms: Some(5),
                ..Default::default()
            },
            Code::InvalidArgument,
            "ack_timeout_ms",
        ),
        (
            pb::ReceiveRequest {
                queue: "none".into(),
                ..Default::default()
            },
            Code::NotFound,
            "none",
        ),
    ];
    for (req, code, needle) in bad_receives {
        assert_status(c.msg.receive(req).await, code, needle);
    }
    let st = c.stats("q").await;
    assert_eq!(
        (st.in_flight, st.acked, st.nacked),
        (1, 0, 0),
        "nothing changed"
    );
    assert!(ok(&c.ack(&[&d.ack_token]).await[0]), "the lease is intact");
}

#[tokio::test]
async fn long_poll_returns_as_soon_as_a_message_is_ready() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let mut waiter = c.clone();
    let started = Instant::now();
    let task = tokio::spawn(async move {
        waiter
            .receive_with(pb::ReceiveRequest {
                queue: "q".into(),
                max_messages: 5,
                wait_ms: 15_000,
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.publish("q", &["wake up"]).await;
    let got = task.await.expect("task");
    assert_eq!(got.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let none = c
        .receive_with(pb::ReceiveRequest {
            queue: "q".into(),
            wait_ms: 300,
            ..Default::default()
        })
        .await;
    assert!(none.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(290));
}

#[tokio::test]
async fn a_lease_that_runs_out_is_a_failed_attempt_and_fences_its_token() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create(
        "q",
        pb::QueueConfig {
            ack_timeout_ms: Some(1000),
            ..config()
        },
    )
    .await;
    c.publish("q", &["slow"]).await;
    let first = c.receive("q", 1).await.remove(0);
    let second = c
        .receive_with(pb::ReceiveRequest {
            queue: "q".into(),
            max_messages: 1,
            wait_ms: 5000,
            ..Default::default()
        })
        .await
        .remove(0);
    assert_eq!(second.delivery_count, 2);
    assert_eq!(
        second.attempts[0].outcome,
        pb::AttemptOutcome::LeaseExpired as i32
    );
    let late = c.ack(&[&first.ack_token]).await;
    assert_eq!(
        late[0].status,
        pb::SettleStatus::LeaseExpired as i32,
        "the late ack is refused"
    );
    let ext = c
        .msg
        .extend_lease(pb::ExtendLeaseRequest {
            items: vec![pb::ExtendItem {
                ack_token: second.ack_token.clone(),
                timeout_ms: 60_000,
            }],
        })
        .await
        .expect("extend")
        .into_inner()
        .results
        .remove(0);
    assert!(ok(&ext));
    assert!(ext.lease_deadline_unix_ms >= second.lease_deadline_unix_ms + 50_000);
    assert!(ok(&c.ack(&[&second.ack_token]).await[0]));
    assert_eq!(c.stats("q").await.total, 0);
}

#[tokio::test]
async fn client_ids_auto_ack_max_length_purge_and_browse() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create(
        "q",
        pb::QueueConfig {
            max_length: Some(3),
            ..config()
        },
    )
    .await;
    let with_id = |id: &str| pb::PublishMessage {
        message_id: id.into(),
        ..msg(id)
    };
    let r = c
        .msg
        .publish(pb::PublishRequest {
            queue: "q".into(),
            messages: vec![with_id("a"), with_id("b"), with_id("a")],
            ..Default::default()
        })
        .await
        .expect("publish")
        .into_inner()
        .results;
    assert_eq!(
        r.iter()
            .map(|p| (p.message_id.as_str(), p.duplicate))
            .collect::<Vec<_>>(),
        [("a", false), ("b", false), ("a", true)]
    );
    let r = c
        .msg
        .publish(pb::PublishRequest {
            queue: "q".into(),
            messages: vec![with_id("c"), with_id("d")],
            ..Default::default()
        })
        .await;
    assert_status(r, Code::ResourceExhausted, "max_length");
    let browsed = c.browse("q").await;
    assert_eq!(browsed.len(), 2);
    assert!(
        browsed
            .iter()
            .all(|m| m.delivery_count == 0 && m.state == pb::MessageState::Ready as i32)
    );
    let got = c
        .receive_with(pb::ReceiveRequest {
            queue: "q".into(),
            max_messages: 1,
            auto_ack: true,
            ..Default::default()
        })
        .await;
    assert_eq!((got[0].ack_token.as_str(), got[0].delivery_count), ("", 1));
    let st = c.stats("q").await;
    assert_eq!((st.total, st.acked), (1, 1));
    let purged = c
        .admin
        .purge_queue(pb::PurgeQueueRequest { name: "q".into() })
        .await
        .expect("purge")
        .into_inner();
    assert_eq!(purged.messages_deleted, 1);
    assert_eq!(c.stats("q").await.purged, 1);
}

#[tokio::test]
async fn the_dead_letter_walkthrough() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("invoices.dlq", config()).await;
    c.create("invoices", with_dlq("invoices.dlq", 3)).await;
    let id = c.publish("invoices", &["order 42"]).await.remove(0);
    for attempt in 1..=3 {
        let d = c.receive("invoices", 1).await.remove(0);
        assert_eq!(d.delivery_count, attempt);
        c.nack(&d.ack_token, "tax service down").await;
    }
    assert!(c.receive("invoices", 1).await.is_empty());
    let browsed = c.browse("invoices.dlq").await;
    assert_eq!(browsed.len(), 1);
    let m = &browsed[0];
    assert_eq!(m.message_id, id);
    assert_eq!(m.delivery_count, 0);
    let rec = &m.dead_letters[0];
    assert_eq!(rec.source_queue, "invoices");
    assert_eq!(rec.reason, pb::DeadLetterReason::MaxDeliveries as i32);
    assert_eq!(
        (rec.delivery_count, rec.last_nack_reason.as_str()),
        (3, "tax service down")
    );
    let d = c.receive("invoices.dlq", 1).await.remove(0);
    assert_eq!(body(&d), "order 42");
    assert!(ok(&c.ack(&[&d.ack_token]).await[0]));
    let src = c.stats("invoices").await;
    let dlq = c.stats("invoices.dlq").await;
    assert_eq!(
        (
            src.dead_lettered,
            src.nacked,
            dlq.dead_letters_received,
            dlq.acked
        ),
        (1, 3, 1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_stores_in_order_and_answers_each_publish() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let (tx, mut answers) = c.publish_stream(256).await;
    for seq in 1..=100u64 {
        let queue = if seq == 50 { "missing" } else { "q" };
        let publish = pb::PublishRequest {
            queue: queue.into(),
            messages: vec![msg(&format!("m{seq}"))],
            ..Default::default()
        };
        tx.send(pb::PublishStreamRequest {
            sequence: seq,
            publish: Some(publish),
        })
        .await
        .unwrap();
    }
    drop(tx);
    let mut seen = Vec::new();
    while let Some(a) = answers.message().await.expect("answer") {
        if a.sequence == 50 {
            assert_eq!(a.code, Code::NotFound as i32);
            assert!(a.error.contains("missing") && a.results.is_empty());
        } else {
            assert_eq!((a.code, a.results.len()), (0, 1), "{a:?}");
        }
        seen.push(a.sequence);
    }
    assert_eq!(
        seen,
        (1..=100).collect::<Vec<_>>(),
        "answered in order, the stream went on"
    );
    let got = c.receive("q", 1000).await;
    let expect: Vec<String> = (1..=100)
        .filter(|n| *n != 50)
        .map(|n| format!("m{n}"))
        .collect();
    assert_eq!(
        got.iter().map(body).collect::<Vec<_>>(),
        expect,
        "stored in the order sent"
    );
}

/// Publishers faster than the database wait for it (`--max-unapplied`)
/// instead of piling changes up in memory: with a 1 MiB bound and an
/// applier that would otherwise sleep for an hour, every publish (unary
/// and streamed) still completes, because a waiting publisher wakes the
/// applier; nothing is lost, in order, across a kill -9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_wait_for_the_database_and_lose_nothing() {
    let mut s =
        TestServer::start_with(&["--max-unapplied", "1MiB", "--apply-interval", "1h"]).await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let text = |n: usize| format!("{n:06}{}", "x".repeat(1018));
    let batch = move |from: usize| -> Vec<pb::PublishMessage> {
        (from..from + 100).map(|n| msg(&text(n))).collect()
    };
    // 2.4 MB through unary publishes: more than twice the bound.
    for b in 0..24 {
        let req = pb::PublishRequest {
            queue: "q".into(),
            messages: batch(b * 100),
            ..Default::default()
        };
        let r = tokio::time::timeout(Duration::from_secs(20), c.msg.publish(req))
            .await
            .unwrap_or_else(|_| panic!("publish {b} waited for good"))
            .expect("publish");
        assert_eq!(r.into_inner().results.len(), 100);
    }
    // And 1 MB more through a publish stream.
    let (tx, mut answers) = c.publish_stream(16).await;
    let sender = tokio::spawn(async move {
        for (seq, from) in (2400..3400).step_by(100).enumerate() {
            let publish = pb::PublishRequest {
                queue: "q".into(),
                messages: batch(from),
                ..Default::default()
            };
            tx.send(pb::PublishStreamRequest {
                sequence: seq as u64,
                publish: Some(publish),
            })
            .await
            .unwrap();
        }
    });
    let mut answered = 0;
    while let Some(a) = tokio::time::timeout(Duration::from_secs(20), answers.message())
        .await
        .expect("a streamed publish waited for good")
        .expect("answer")
    {
        assert_eq!((a.code, a.results.len()), (0, 100), "{a:?}");
        answered += 1;
    }
    sender.await.unwrap();
    assert_eq!(answered, 10);

    s.kill();
    s.restart().await;
    let mut c = s.clients().await;
    let mut got = Vec::new();
    while got.len() < 3400 {
        let d = c.receive("q", 1000).await;
        assert!(!d.is_empty(), "only {} of 3400 came back", got.len());
        got.extend(d.iter().map(|d| body(d)[..6].to_string()));
    }
    let want: Vec<String> = (0..3400).map(|n| format!("{n:06}")).collect();
    assert_eq!(got, want, "every message, in order, after kill -9");
}

/// A receive that acknowledges earlier deliveries (`ack_tokens`).
async fn receive_acking(
    c: &mut Clients,
    queue: &str,
    acks: &[&str],
) -> Result<pb::ReceiveResponse, tonic::Status> {
    c.msg
        .receive(pb::ReceiveRequest {
            queue: queue.into(),
            max_messages: 1,
            ack_tokens: acks.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Acks riding on a Receive that took effect are reported even when the
/// receive after them fails: here the queue received from is deleted
/// while the call waits. The call answers OK with the acks' results and
/// the receive's failure (`receive_code`, `receive_error`), instead of a
/// NOT_FOUND that leaves the consumer not knowing whether its acks took.
#[tokio::test]
async fn acks_riding_on_a_receive_are_reported_when_the_receive_fails_after_them() {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("jobs", config()).await;
    c.create("inbox", config()).await;
    c.publish("jobs", &["job"]).await;
    let d = c.receive("jobs", 1).await.remove(0);
    let mut waiting = c.msg.clone();
    let token = d.ack_token.clone();
    let call = tokio::spawn(async move {
        waiting
            .receive(pb::ReceiveRequest {
                queue: "inbox".into(),
                wait_ms: 10_000,
                ack_tokens: vec![token],
                ..Default::default()
            })
            .await
            .map(tonic::Response::into_inner)
    });
    // The ack is made before the receive waits on the empty queue.
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.stats("jobs").await.acked == 0 {
        assert!(Instant::now() < deadline, "the riding ack was never made");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.admin
        .delete_queue(pb::DeleteQueueRequest {
            name: "inbox".into(),
            force: false,
        })
        .await
        .expect("delete");
    let r = call
        .await
        .expect("task")
        .expect("the acks took effect: the call answers OK");
    assert_eq!(r.ack_results.len(), 1);
    assert!(ok(&r.ack_results[0]), "{r:?}");
    assert_eq!(r.receive_code, Code::NotFound as i32, "{r:?}");
    assert!(r.receive_error.contains("inbox"), "{r:?}");
    assert!(r.deliveries.is_empty());
    // The ack held: after kill -9 the job is gone for good.
    s.kill();
    s.restart().await;
    let mut c = s.clients().await;
    let st = c.stats("jobs").await;
    assert_eq!((st.acked, st.total), (1, 0), "{st:?}");
}

#[tokio::test]
async fn acks_ride_on_a_receive_and_survive_kill_9() {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    c.create("other", config()).await;
    c.publish("q", &["a", "b", "c"]).await;
    c.publish("other", &["x"]).await;
    let a = c.receive("q", 1).await.remove(0);
    let x = c.receive("other", 1).await.remove(0);

    // Bad input changes nothing: a malformed token, an unknown queue, a
    // bad receive option.
    let r = receive_acking(&mut c, "q", &[&a.ack_token, "garbage"]).await;
    assert_status(r, Code::InvalidArgument, "ack_tokens[1]");
    let r = receive_acking(&mut c, "missing", &[&a.ack_token]).await;
    assert_status(r, Code::NotFound, "missing");
    let r = c
        .msg
        .receive(pb::ReceiveRequest {
            queue: "q".into(),
            max_messages: 5000,
            ack_tokens: vec![a.ack_token.clone()],
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "max_messages");
    let st = c.stats("q").await;
    assert_eq!((st.acked, st.in_flight, st.ready), (0, 1, 2), "{st:?}");

    // Acks of this queue and of another one, and a repeated one: each has
    // its outcome, in order, beside the next delivery.
    let r = receive_acking(&mut c, "q", &[&a.ack_token, &x.ack_token, &a.ack_token])
        .await
        .expect("receive with acks");
    let outcomes: Vec<bool> = r.ack_results.iter().map(ok).collect();
    assert_eq!(outcomes, [true, true, false]);
    assert_eq!(r.ack_results[1].ack_token, x.ack_token);
    assert!(r.ack_results[2].error.contains("lease expired"), "{r:?}");
    assert_eq!(r.deliveries.iter().map(body).collect::<Vec<_>>(), ["b"]);
    let b = r.deliveries[0].clone();
    let r = receive_acking(&mut c, "q", &[&b.ack_token])
        .await
        .expect("receive with acks");
    assert!(ok(&r.ack_results[0]));
    let c_msg = r.deliveries[0].clone();
    assert_eq!(body(&c_msg), "c");
    // The last ack, with nothing left to deliver: durable before it answers.
    let r = receive_acking(&mut c, "q", &[&c_msg.ack_token])
        .await
        .expect("receive with acks");
    assert!(ok(&r.ack_results[0]) && r.deliveries.is_empty(), "{r:?}");

    s.kill();
    s.restart().await;
    let mut c = s.clients().await;
    let st = c.stats("q").await;
    assert_eq!((st.acked, st.in_flight, st.ready), (3, 0, 0), "{st:?}");
    let st = c.stats("other").await;
    assert_eq!((st.acked, st.in_flight, st.ready), (1, 0, 0), "{st:?}");
}
