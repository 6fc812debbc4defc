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
            ack_timeout_ms: Some(1000),
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
    for d in &now_got {
        assert!(ok(&c.nack(&d.ack_token, "").await));
    }
    // Drain everything and check the order per group.
    let mut empty = 0;
    while empty < 3 {
        let got = c
            .receive_with(pb::ReceiveRequest {
                queue: "f".into(),
                max_messages: 10,
                wait_ms: 700,
                ..Default::default()
            })
            .await;
        if got.is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
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
            parked[0].head_delivery_count
        ),
        ("g", 2, 2)
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
