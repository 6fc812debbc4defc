//! FIFO queues over gRPC: order under failure and kill -9, dedup across
//! restarts, fairness, poison handling, group admin (SPEC §1, §3, §4).

use std::collections::HashMap;
use std::time::Duration;

use letterbox::pb;
use tonic::Code;

use crate::harness::*;

fn fifo(extra: pb::QueueConfig) -> pb::QueueConfig {
    pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        ..extra
    }
}

fn grouped(group: &str, body: &str) -> pb::PublishMessage {
    pb::PublishMessage {
        group_id: group.into(),
        ..msg(body)
    }
}

async fn publish_all(
    c: &mut Clients,
    q: &str,
    msgs: Vec<pb::PublishMessage>,
) -> Vec<pb::PublishResult> {
    c.msg
        .publish(pb::PublishRequest {
            queue: q.into(),
            messages: msgs,
            ..Default::default()
        })
        .await
        .expect("publish")
        .into_inner()
        .results
}

/// Receives, acks every other time and nacks otherwise, across a kill -9,
/// and checks that each group's messages come out in order with nothing
/// skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_and_dedup_survive_kill_9() {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create(
        "f",
        fifo(pb::QueueConfig {
            // Long enough that the lease held across the kill is still
            // running after the restart on a slow machine; the drain
            // below waits it out.
            ack_timeout_ms: Some(5000),
            ..config()
        }),
    )
    .await;
    let mut msgs = Vec::new();
    for i in 0..30 {
        for g in ["a", "b", "c"] {
            msgs.push(pb::PublishMessage {
                dedup_id: format!("{g}{i}"),
                ..grouped(g, &format!("{g}-{i}"))
            });
        }
    }
    publish_all(&mut c, "f", msgs).await;
    // Consume part of it, leaving leases open and nacks behind.
    let mut acked: HashMap<String, Vec<u32>> = HashMap::new();
    let record = |acked: &mut HashMap<String, Vec<u32>>, body: &str| {
        let (g, n) = body.split_once('-').unwrap();
        acked
            .entry(g.to_string())
            .or_default()
            .push(n.parse().unwrap());
    };
    for round in 0..6 {
        for d in c.receive("f", 4).await {
            if round % 2 == 0 && d.delivery_count == 1 {
                c.nack(&d.ack_token, "first try fails").await;
            } else if ok(&c.ack(&[&d.ack_token]).await[0]) {
                record(&mut acked, &body(&d));
            }
        }
    }
    // Leave one group leased, then kill.
    let held = c.receive("f", 2).await;
    assert!(!held.is_empty());
    s.kill();
    s.restart().await;
    let mut c = s.clients().await;
    // Dedup ids are remembered across the crash.
    let dup = publish_all(
        &mut c,
        "f",
        vec![pb::PublishMessage {
            dedup_id: "a0".into(),
            ..grouped("a", "again")
        }],
    )
    .await;
    assert!(dup[0].duplicate);
    // The held lease survives: its group stays blocked until it runs out.
    let held_group = held[0].group_id.clone();
    let now_got = c.receive("f", 100).await;
    assert!(
        now_got.iter().all(|d| d.group_id != held_group),
        "group {held_group} is still leased"
    );
    // Nacking a batch in order: the first of each group fails and
    // releases the rest of its group (SPEC §3), whose nacks then answer
    // RELEASED.
    let mut first_of_group = std::collections::HashSet::new();
    for d in &now_got {
        let r = c.nack(&d.ack_token, "").await;
        if first_of_group.insert(d.group_id.clone()) {
            assert!(ok(&r), "{r:?}");
        } else {
            assert_eq!(r.status, pb::SettleStatus::Released as i32, "{r:?}");
        }
    }
    // Drain everything (the held group comes back once its lease runs
    // out) and check the order per group.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while acked.values().map(Vec::len).sum::<usize>() < 90 {
        assert!(
            std::time::Instant::now() < deadline,
            "not drained within 60 s: {acked:?}"
        );
        let got = c
            .receive_with(pb::ReceiveRequest {
                queue: "f".into(),
                max_messages: 10,
                wait_ms: 700,
                ..Default::default()
            })
            .await;
        for d in got {
            assert!(ok(&c.ack(&[&d.ack_token]).await[0]));
            record(&mut acked, &body(&d));
        }
    }
    for g in ["a", "b", "c"] {
        let seen = &acked[g];
        assert_eq!(
            seen,
            &(0..30).collect::<Vec<u32>>(),
            "group {g} out of order or incomplete"
        );
    }
    assert_eq!(c.stats("f").await.total, 0);
}

#[tokio::test]
async fn a_huge_group_does_not_delay_a_small_one() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("f", fifo(config())).await;
    for chunk in 0..5 {
        let msgs = (0..1000)
            .map(|i| grouped("big", &format!("big-{}", chunk * 1000 + i)))
            .collect();
        publish_all(&mut c, "f", msgs).await;
    }
    publish_all(&mut c, "f", vec![grouped("small", "small-0")]).await;
    let first = c.receive("f", 10).await;
    assert!(first.iter().all(|d| d.group_id == "big"));
    let second = c.receive("f", 10).await;
    assert_eq!(
        second.iter().map(body).collect::<Vec<_>>(),
        ["small-0"],
        "the small group is served at once"
    );
    let groups = c
        .admin
        .list_groups(pb::ListGroupsRequest {
            queue: "f".into(),
            ..Default::default()
        })
        .await
        .expect("groups")
        .into_inner()
        .groups;
    let big = groups.iter().find(|g| g.group_id == "big").expect("big");
    assert_eq!(
        (big.backlog, big.in_flight, big.state),
        (5000, 10, pb::GroupState::Leased as i32)
    );
}

#[tokio::test]
async fn parked_groups_are_visible_and_released_or_skipped_by_an_operator() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("fdlq", fifo(config())).await;
    c.create(
        "f",
        fifo(pb::QueueConfig {
            on_poison: pb::PoisonPolicy::ParkGroup as i32,
            ..with_dlq("fdlq", 2)
        }),
    )
    .await;
    publish_all(
        &mut c,
        "f",
        vec![
            grouped("g", "poison"),
            grouped("g", "next"),
            grouped("h", "other"),
        ],
    )
    .await;
    // One message per receive: nack g's head each time it comes, ack the rest.
    let mut g_failures = 0;
    while g_failures < 2 {
        let d = c.receive("f", 1).await.remove(0);
        if d.group_id == "g" {
            assert_eq!(
                body(&d),
                "poison",
                "g's head comes back before anything after it"
            );
            c.nack(&d.ack_token, "cannot parse").await;
            g_failures += 1;
        } else {
            c.ack(&[&d.ack_token]).await;
        }
    }
    assert!(c.receive("f", 10).await.is_empty(), "g is parked");
    let parked = c
        .admin
        .list_groups(pb::ListGroupsRequest {
            queue: "f".into(),
            state: pb::GroupState::Parked as i32,
            ..Default::default()
        })
        .await
        .expect("groups")
        .into_inner()
        .groups;
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (
            parked[0].group_id.as_str(),
            parked[0].backlog,
            parked[0].head_delivery_count,
            parked[0].head_failed_attempts
        ),
        ("g", 2, 2, 2)
    );
    assert!(
        parked[0].reason.contains("PARK_GROUP"),
        "{}",
        parked[0].reason
    );
    let st = c.stats("f").await;
    assert_eq!((st.parked, st.ready), (2, 0));
    // Skip the head to the DLQ with a note: the group goes on.
    let skipped = c
        .admin
        .skip_head(pb::SkipHeadRequest {
            queue: "f".into(),
            group_id: "g".into(),
            note: "INC-7".into(),
        })
        .await
        .expect("skip")
        .into_inner();
    let d = c.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "next");
    let dl = c.browse("fdlq").await.remove(0);
    assert_eq!(dl.message_id, skipped.message_id);
    assert_eq!(
        dl.dead_letters[0].reason,
        pb::DeadLetterReason::Skipped as i32
    );
    assert_eq!(dl.dead_letters[0].note, "INC-7");
    assert_eq!(dl.group_id, "g");
    let r = c
        .admin
        .release_group(pb::ReleaseGroupRequest {
            queue: "f".into(),
            group_id: "g".into(),
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "not parked");
    let r = c
        .admin
        .release_group(pb::ReleaseGroupRequest {
            queue: "f".into(),
            group_id: "zz".into(),
        })
        .await;
    assert_status(r, Code::NotFound, "zz");
}

#[tokio::test]
async fn fifo_rules_on_kinds_and_delays() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("std-dlq", config()).await;
    let r = c
        .admin
        .create_queue(pb::CreateQueueRequest {
            name: "f".into(),
            config: Some(fifo(with_dlq("std-dlq", 3))),
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "same kind");
    c.create(
        "f",
        fifo(pb::QueueConfig {
            delivery_delay_ms: Some(1000),
            ..config()
        }),
    )
    .await;
    let r = c
        .msg
        .publish(pb::PublishRequest {
            queue: "f".into(),
            messages: vec![pb::PublishMessage {
                delay_ms: Some(10),
                ..grouped("g", "x")
            }],
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "messages[0].delay_ms");
    publish_all(&mut c, "f", vec![grouped("g", "later")]).await;
    assert!(
        c.receive("f", 1).await.is_empty(),
        "the queue's delivery delay applies"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let got = c
        .receive_with(pb::ReceiveRequest {
            queue: "f".into(),
            max_messages: 1,
            wait_ms: 2000,
            ..Default::default()
        })
        .await;
    assert_eq!(got.len(), 1);
    let r = c
        .admin
        .list_groups(pb::ListGroupsRequest {
            queue: "std-dlq".into(),
            ..Default::default()
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "FIFO queues only");
}

#[tokio::test]
async fn an_ack_riding_on_a_receive_frees_its_group_for_that_receive() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("f", fifo(config())).await;
    publish_all(
        &mut c,
        "f",
        vec![
            grouped("g", "g-0"),
            grouped("g", "g-1"),
            grouped("g", "g-2"),
        ],
    )
    .await;
    // A group's next message waits while one of it is leased.
    let mut token = c.receive("f", 1).await.remove(0).ack_token;
    assert!(c.receive("f", 10).await.is_empty());
    for want in ["g-1", "g-2"] {
        let r = c
            .msg
            .receive(pb::ReceiveRequest {
                queue: "f".into(),
                max_messages: 1,
                ack_tokens: vec![token],
                ..Default::default()
            })
            .await
            .expect("receive with an ack")
            .into_inner();
        assert!(ok(&r.ack_results[0]), "{r:?}");
        assert_eq!(r.deliveries.iter().map(body).collect::<Vec<_>>(), [want]);
        token = r.deliveries[0].ack_token.clone();
    }
}

async fn fifo_queue_with(c: &mut Clients, name: &str, ack_timeout_ms: u64) {
    c.create(
        name,
        fifo(pb::QueueConfig {
            ack_timeout_ms: Some(ack_timeout_ms),
            ..config()
        }),
    )
    .await;
}

/// SPEC §3: one receive leases two messages of a group; the first is
/// nacked, so the second is released with it: its ack answers
/// FAILED_PRECONDITION naming the first, and the group restarts at the
/// first, the second following it with its count unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_releases_the_rest_of_a_received_batch_of_its_group() {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    fifo_queue_with(&mut c, "f", 60_000).await;
    publish_all(&mut c, "f", vec![grouped("g", "m1"), grouped("g", "m2")]).await;
    let got = c.receive("f", 10).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["m1", "m2"]);
    let r = c
        .msg
        .nack(pb::NackRequest {
            items: vec![pb::NackItem {
                ack_token: got[0].ack_token.clone(),
                reason: "m1 failed".into(),
                ..Default::default()
            }],
        })
        .await
        .expect("nack")
        .into_inner();
    assert!(ok(&r.results[0]));
    assert_eq!(r.released.len(), 1);
    assert_eq!(r.released[0].ack_token, got[1].ack_token);
    assert_eq!(r.released[0].message_id, got[1].message_id);
    assert_eq!(r.released[0].released_by, got[0].message_id);
    let a = c.ack(&[&got[1].ack_token]).await.remove(0);
    assert_eq!(a.status, pb::SettleStatus::Released as i32);
    assert_eq!(a.code, Code::FailedPrecondition as i32);
    assert!(a.error.contains(&got[0].message_id), "{}", a.error);
    // Across kill -9 the release holds.
    s.kill();
    s.restart().await;
    let mut c = s.clients().await;
    let a = c.ack(&[&got[1].ack_token]).await.remove(0);
    assert_eq!(a.status, pb::SettleStatus::Released as i32);
    let again = c.receive("f", 10).await;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["m1", "m2"]);
    // Both were delivered twice (the count never goes back, SPEC §3); only
    // m1 failed.
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
    assert_eq!(
        again[1].attempts[0].outcome,
        pb::AttemptOutcome::Released as i32
    );
    let acks = c.ack(&[&again[0].ack_token, &again[1].ack_token]).await;
    assert!(acks.iter().all(ok), "{acks:?}");
}

/// A kill -9 with such a batch leased: after the restart the first
/// lease runs out, which releases the second, so the second cannot be
/// acked ahead of the first's redelivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_a_lapsed_batch_cannot_be_acked_out_of_order() {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    fifo_queue_with(&mut c, "f", 1_000).await;
    publish_all(&mut c, "f", vec![grouped("g", "m1"), grouped("g", "m2")]).await;
    let got = c.receive("f", 10).await;
    assert_eq!(got.len(), 2);
    s.kill();
    s.restart().await;
    let mut c = s.clients().await;
    // Waits (up to the 1 s lease) for m1 to come back.
    let again = c
        .receive_with(pb::ReceiveRequest {
            queue: "f".into(),
            max_messages: 10,
            wait_ms: 5_000,
            ..Default::default()
        })
        .await;
    assert_eq!(again.iter().map(body).collect::<Vec<_>>(), ["m1", "m2"]);
    let late = c.ack(&[&got[1].ack_token]).await.remove(0);
    assert_eq!(late.status, pb::SettleStatus::Released as i32, "{late:?}");
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
}

/// The same over Subscribe with a credit of 3: three messages of a group
/// are pushed together; a nack of the first on the stream releases the
/// other two (listed in the answer, their credit freed), whose acks are
/// refused; the three come again in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_on_a_subscription_releases_the_rest_of_the_group() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    fifo_queue_with(&mut c, "f", 60_000).await;
    publish_all(
        &mut c,
        "f",
        vec![grouped("g", "m1"), grouped("g", "m2"), grouped("g", "m3")],
    )
    .await;
    let client = letterbox::client::Client::connect(format!("http://{}", s.addr))
        .await
        .expect("client");
    let mut sub = client.subscribe("f", 3, None).await.expect("subscribe");
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(sub.next().await.expect("delivery").expect("ok"));
    }
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["m1", "m2", "m3"]);
    let settler = sub.settler();
    let (r, released) = settler
        .nack_releasing(vec![pb::NackItem {
            ack_token: got[0].ack_token.clone(),
            ..Default::default()
        }])
        .await
        .expect("nack");
    assert!(ok(&r[0]));
    let ids: Vec<&str> = released.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(
        ids,
        [got[1].message_id.as_str(), got[2].message_id.as_str()]
    );
    let acks = settler
        .ack(vec![got[1].ack_token.clone(), got[2].ack_token.clone()])
        .await
        .expect("ack");
    assert!(
        acks.iter()
            .all(|a| a.status == pb::SettleStatus::Released as i32),
        "{acks:?}"
    );
    // The freed credit brings the group again, from m1.
    let mut again = Vec::new();
    while again.len() < 3 {
        again.push(sub.next().await.expect("delivery").expect("ok"));
    }
    assert_eq!(
        again.iter().map(body).collect::<Vec<_>>(),
        ["m1", "m2", "m3"]
    );
    let counts: Vec<(u32, u32)> = again
        .iter()
        .map(|d| (d.delivery_count, d.failed_attempts))
        .collect();
    assert_eq!(counts, [(2, 1), (2, 0), (2, 0)]);
    let tokens = again.iter().map(|d| d.ack_token.clone()).collect();
    assert!(settler.ack(tokens).await.expect("ack").iter().all(ok));
    sub.close().await;
}

/// `max_per_group` caps the messages of one group per receive, and per
/// subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_per_group_caps_one_group_per_receive() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    fifo_queue_with(&mut c, "f", 60_000).await;
    let msgs = ["g1", "g2", "g3", "h1", "h2", "h3"]
        .iter()
        .map(|b| grouped(&b[..1], b))
        .collect();
    publish_all(&mut c, "f", msgs).await;
    let got = c
        .receive_with(pb::ReceiveRequest {
            queue: "f".into(),
            max_messages: 10,
            max_per_group: 1,
            ..Default::default()
        })
        .await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["g1", "h1"]);
    let tokens: Vec<&str> = got.iter().map(|d| d.ack_token.as_str()).collect();
    assert!(c.ack(&tokens).await.iter().all(ok));
    // On a stream: credit 10 but one per group.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SubscribeRequest {
        kind: Some(pb::subscribe_request::Kind::Open(pb::SubscribeOpen {
            queue: "f".into(),
            credit: 10,
            max_per_group: 1,
            ..Default::default()
        })),
    })
    .await
    .expect("open");
    let mut inbound = c
        .msg
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("subscribe")
        .into_inner();
    let mut pushed = Vec::new();
    while pushed.len() < 2 {
        let m = inbound.message().await.expect("stream").expect("message");
        if let Some(pb::subscribe_response::Kind::Deliveries(b)) = m.kind {
            pushed.extend(b.deliveries.into_iter().map(|d| body(&d)));
        }
    }
    pushed.sort();
    assert_eq!(
        pushed,
        ["g2", "h2"],
        "one of each group, not g3 and h3 with them"
    );
    // Nothing more while both groups are leased.
    let more = tokio::time::timeout(Duration::from_millis(300), inbound.message()).await;
    assert!(more.is_err(), "pushed more than one per group: {more:?}");
    drop(tx);
}
