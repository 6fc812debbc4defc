//! Redrive: selections, dry runs, limits, rates, FIFO order, and a redrive
//! cut by kill -9 then run again (SPEC §4).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use letterbox::client::{Client, pb};

use crate::harness::*;

async fn client(s: &TestServer) -> Client {
    Client::connect(format!("http://{}", s.addr)).await.unwrap()
}

/// Receives everything from `q` and nacks it to its DLQ (reject).
async fn reject_all(c: &Client, q: &str, reason: &str) -> usize {
    let mut n = 0;
    loop {
        let got = c.receive(q, 1000, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return n;
        }
        n += got.len();
        let items = got
            .into_iter()
            .map(|d| pb::NackItem {
                ack_token: d.ack_token,
                dead_letter: true,
                reason: reason.into(),
                delay_ms: None,
            })
            .collect();
        c.nack(items).await.unwrap();
    }
}

async fn redrive(c: &Client, req: pb::RedriveRequest) -> pb::RedriveResponse {
    let mut stream = c.redrive(req).await.unwrap();
    let mut last = pb::RedriveResponse::default();
    while let Some(p) = stream.message().await.unwrap() {
        last = p;
    }
    assert!(last.done);
    last
}

fn req(dlq: &str) -> pb::RedriveRequest {
    pb::RedriveRequest {
        queue: dlq.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn selections_dry_run_limit_and_target() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    c.create_queue("dlq", pb::QueueConfig::default())
        .await
        .unwrap();
    for q in ["a", "b"] {
        c.create_queue(q, with_dlq("dlq", 1)).await.unwrap();
    }
    c.create_queue("elsewhere", pb::QueueConfig::default())
        .await
        .unwrap();
    let ids_a: Vec<String> = c
        .publish(
            "a",
            (0..4).map(|i| Client::message(format!("a{i}"))).collect(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    c.publish(
        "b",
        (0..3).map(|i| Client::message(format!("b{i}"))).collect(),
    )
    .await
    .unwrap();
    reject_all(&c, "a", "bad a").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t_mid = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .try_into()
        .unwrap();
    let t_mid: u64 = t_mid;
    tokio::time::sleep(Duration::from_millis(20)).await;
    // b's messages fail by exhausting their one delivery (lease nacked).
    for d in c.receive("b", 10, Duration::ZERO).await.unwrap() {
        c.nack(vec![pb::NackItem {
            ack_token: d.ack_token,
            reason: "boom".into(),
            ..Default::default()
        }])
        .await
        .unwrap();
    }
    assert_eq!(c.stats("dlq").await.unwrap().total, 7);

    // Dry run: counts, moves nothing.
    let p = redrive(
        &c,
        pb::RedriveRequest {
            dry_run: true,
            ..req("dlq")
        },
    )
    .await;
    assert_eq!((p.scanned, p.matched, p.moved), (7, 7, 0));
    assert_eq!(c.stats("dlq").await.unwrap().total, 7);

    // By reason and source.
    let p = redrive(
        &c,
        pb::RedriveRequest {
            reasons: vec![pb::DeadLetterReason::MaxDeliveries as i32],
            dry_run: true,
            ..req("dlq")
        },
    )
    .await;
    assert_eq!(p.matched, 3);
    let p = redrive(
        &c,
        pb::RedriveRequest {
            source_queue: "a".into(),
            dry_run: true,
            ..req("dlq")
        },
    )
    .await;
    assert_eq!(p.matched, 4);
    // By time: only b's, dead-lettered after t_mid.
    let p = redrive(
        &c,
        pb::RedriveRequest {
            since_unix_ms: t_mid,
            dry_run: true,
            ..req("dlq")
        },
    )
    .await;
    assert_eq!(p.matched, 3);
    // By ids, to a named target.
    let p = redrive(
        &c,
        pb::RedriveRequest {
            message_ids: vec![ids_a[1].clone()],
            target: "elsewhere".into(),
            ..req("dlq")
        },
    )
    .await;
    assert_eq!(p.moved, 1);
    let moved = c.receive("elsewhere", 10, Duration::ZERO).await.unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0].message_id, ids_a[1]);
    assert_eq!(moved[0].delivery_count, 1, "the count starts again");
    assert_eq!(
        moved[0].dead_letters[0].last_nack_reason, "bad a",
        "the history stays"
    );
    // With a limit, back to the sources.
    let p = redrive(
        &c,
        pb::RedriveRequest {
            limit: 2,
            source_queue: "a".into(),
            ..req("dlq")
        },
    )
    .await;
    assert_eq!(p.moved, 2);
    let p = redrive(&c, req("dlq")).await;
    assert_eq!(p.moved, 4, "the rest: one of a's, three of b's");
    assert_eq!(c.stats("a").await.unwrap().total, 3);
    assert_eq!(c.stats("b").await.unwrap().total, 3);
    let dlq = c.stats("dlq").await.unwrap();
    assert_eq!((dlq.total, dlq.redriven), (0, 7));
    assert_eq!(c.stats("a").await.unwrap().redrive_received, 3);
    // A target of another kind is refused.
    c.create_queue(
        "fifo",
        pb::QueueConfig {
            kind: pb::QueueKind::Fifo as i32,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let err = c
        .redrive(pb::RedriveRequest {
            target: "fifo".into(),
            ..req("dlq")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition));
}

#[tokio::test]
async fn the_rate_limit_paces_the_moves() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    c.create_queue("dlq", pb::QueueConfig::default())
        .await
        .unwrap();
    c.create_queue("src", with_dlq("dlq", 5)).await.unwrap();
    c.publish(
        "src",
        (0..60).map(|i| Client::message(format!("m{i}"))).collect(),
    )
    .await
    .unwrap();
    reject_all(&c, "src", "x").await;
    let started = Instant::now();
    let p = redrive(
        &c,
        pb::RedriveRequest {
            rate_per_second: 100,
            ..req("dlq")
        },
    )
    .await;
    assert_eq!(p.moved, 60);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "60 moves at 100/s took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn fifo_messages_keep_their_group_and_order() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    let fifo = |extra: pb::QueueConfig| pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        ..extra
    };
    c.create_queue("fdlq", fifo(pb::QueueConfig::default()))
        .await
        .unwrap();
    c.create_queue("f", fifo(with_dlq("fdlq", 1)))
        .await
        .unwrap();
    let msgs = (0..5)
        .map(|i| pb::PublishMessage {
            group_id: "g".into(),
            ..Client::message(format!("g{i}"))
        })
        .collect();
    c.publish("f", msgs).await.unwrap();
    // Fail each head in turn: they reach the DLQ in order.
    for _ in 0..5 {
        let d = c.receive("f", 1, Duration::ZERO).await.unwrap().remove(0);
        c.nack(vec![pb::NackItem {
            ack_token: d.ack_token,
            ..Default::default()
        }])
        .await
        .unwrap();
    }
    redrive(&c, req("fdlq")).await;
    let mut seen = Vec::new();
    while let Some(d) = c.receive("f", 1, Duration::ZERO).await.unwrap().pop() {
        assert_eq!(d.group_id, "g");
        seen.push(String::from_utf8_lossy(&d.body).into_owned());
        c.ack(vec![d.ack_token]).await.unwrap();
    }
    assert_eq!(seen, ["g0", "g1", "g2", "g3", "g4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_cut_by_kill_9_is_run_again_and_moves_each_message_once() {
    let mut s = TestServer::start().await;
    let c = client(&s).await;
    c.create_queue("dlq", pb::QueueConfig::default())
        .await
        .unwrap();
    c.create_queue("src", with_dlq("dlq", 5)).await.unwrap();
    for chunk in 0..10 {
        let msgs = (0..1000)
            .map(|i| Client::message_with_id(format!("m{}", chunk * 1000 + i), "x"))
            .collect();
        c.publish("src", msgs).await.unwrap();
    }
    assert_eq!(reject_all(&c, "src", "x").await, 10_000);
    // Slow enough to be cut in the middle.
    let mut stream = c
        .redrive(pb::RedriveRequest {
            rate_per_second: 3000,
            ..req("dlq")
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let partial = stream.message().await.ok().flatten();
    s.kill();
    s.restart().await;
    let c = client(&s).await;
    let mid = (
        c.stats("src").await.unwrap().total,
        c.stats("dlq").await.unwrap().total,
    );
    assert!(
        mid.0 > 0 && mid.1 > 0,
        "cut in the middle: {mid:?} (progress {partial:?})"
    );
    assert_eq!(mid.0 + mid.1, 10_000, "every message in exactly one queue");
    let p = redrive(&c, req("dlq")).await;
    assert_eq!(p.moved, mid.1);
    let mut counts: HashMap<String, u32> = HashMap::new();
    let mut token = String::new();
    loop {
        let page = c.browse("src", 1000, &token).await.unwrap();
        for m in page.messages {
            *counts.entry(m.message_id).or_default() += 1;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(counts.len(), 10_000, "every message is back");
    assert!(counts.values().all(|n| *n == 1), "none twice");
    assert_eq!(c.stats("dlq").await.unwrap().total, 0);
}
