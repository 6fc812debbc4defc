//! Exchanges: routing with filters, the FIFO rule, atomic fan-out across
//! kill -9 (SPEC §5).

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use letterbox::client::{Client, pb};
use tonic::Code;

use crate::harness::*;

async fn client(s: &TestServer) -> Client {
    Client::connect(format!("http://{}", s.addr)).await.unwrap()
}

fn with_props(body: &str, props: &[(&str, &str)]) -> pb::PublishMessage {
    pb::PublishMessage {
        properties: props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Client::message(body)
    }
}

async fn bodies(c: &Client, q: &str) -> Vec<String> {
    let page = c.browse(q, 1000, "").await.unwrap();
    page.messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}

#[tokio::test]
async fn messages_go_to_every_queue_whose_filter_matches() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    for q in ["all", "eu", "eu-big"] {
        c.create_queue(q, pb::QueueConfig::default()).await.unwrap();
    }
    c.create_exchange("orders").await.unwrap();
    c.bind("orders", "all", vec![]).await.unwrap();
    c.bind("orders", "eu", vec![("region".into(), "eu".into())])
        .await
        .unwrap();
    let x = c
        .bind(
            "orders",
            "eu-big",
            vec![
                ("region".into(), "eu".into()),
                ("size".into(), "big".into()),
            ],
        )
        .await
        .unwrap();
    assert_eq!(x.bindings.len(), 3);
    let r = c
        .publish_to_exchange(
            "orders",
            vec![
                with_props("us-small", &[("region", "us")]),
                with_props("eu-small", &[("region", "eu"), ("size", "small")]),
                with_props("eu-big", &[("region", "eu"), ("size", "big")]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(r[0].routed_to, ["all"]);
    assert_eq!(r[1].routed_to, ["all", "eu"]);
    assert_eq!(r[2].routed_to, ["all", "eu", "eu-big"]);
    assert_eq!(bodies(&c, "all").await, ["us-small", "eu-small", "eu-big"]);
    assert_eq!(bodies(&c, "eu").await, ["eu-small", "eu-big"]);
    assert_eq!(bodies(&c, "eu-big").await, ["eu-big"]);
    // The copies share the message id.
    for q in ["all", "eu", "eu-big"] {
        let ids: BTreeSet<String> = c
            .browse(q, 100, "")
            .await
            .unwrap()
            .messages
            .into_iter()
            .map(|m| m.message_id)
            .collect();
        assert!(ids.contains(&r[2].message_id), "{q}");
    }
    // Nothing matches: accepted, routed nowhere.
    c.unbind("orders", "all").await.unwrap();
    let r = c
        .publish_to_exchange("orders", vec![with_props("nobody", &[("region", "apac")])])
        .await
        .unwrap();
    assert!(r[0].routed_to.is_empty() && !r[0].duplicate);
    // Deleting a queue removes its bindings.
    c.delete_queue("eu", false).await.unwrap();
    let x = c.get_exchange("orders").await.unwrap();
    assert_eq!(
        x.bindings
            .iter()
            .map(|b| b.queue.as_str())
            .collect::<Vec<_>>(),
        ["eu-big"]
    );
}

#[tokio::test]
async fn exchange_rules_and_errors() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    c.create_queue(
        "f",
        pb::QueueConfig {
            kind: pb::QueueKind::Fifo as i32,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    c.create_queue(
        "small",
        pb::QueueConfig {
            max_length: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    c.create_queue("other", pb::QueueConfig::default())
        .await
        .unwrap();
    c.create_exchange("x").await.unwrap();
    let err = c.bind("x", "f", vec![]).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert!(err.to_string().contains("FIFO"));
    assert_eq!(
        c.bind("nope", "other", vec![]).await.unwrap_err().code(),
        Some(Code::NotFound)
    );
    assert_eq!(
        c.bind("x", "nope", vec![]).await.unwrap_err().code(),
        Some(Code::NotFound)
    );
    assert_eq!(
        c.unbind("x", "other").await.unwrap_err().code(),
        Some(Code::NotFound)
    );
    c.bind("x", "small", vec![]).await.unwrap();
    c.bind("x", "other", vec![]).await.unwrap();
    // One bound queue is too small for the batch: nothing is stored anywhere.
    let err = c
        .publish_to_exchange("x", vec![Client::message("a"), Client::message("b")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::ResourceExhausted), "{err}");
    assert!(err.to_string().contains("\"small\""));
    assert_eq!(c.stats("other").await.unwrap().total, 0);
    let r = c
        .publish_to_exchange("missing", vec![Client::message("a")])
        .await
        .unwrap_err();
    assert_eq!(r.code(), Some(Code::NotFound));
    let mut raw = s.clients().await;
    let both = raw
        .msg
        .publish(pb::PublishRequest {
            queue: "other".into(),
            exchange: "x".into(),
            messages: vec![msg("a")],
        })
        .await;
    assert_status(both, Code::InvalidArgument, "exactly one");
    let created_again = c.create_exchange("x").await.unwrap();
    assert_eq!(
        created_again.bindings.len(),
        2,
        "creating again changes nothing"
    );
    c.delete_exchange("x").await.unwrap();
    assert_eq!(
        c.get_exchange("x").await.unwrap_err().code(),
        Some(Code::NotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_is_atomic_across_kill_9() {
    let mut s = TestServer::start().await;
    let c = client(&s).await;
    let queues = ["a", "b", "c"];
    c.create_exchange("x").await.unwrap();
    for q in queues {
        c.create_queue(q, pb::QueueConfig::default()).await.unwrap();
        c.bind("x", q, vec![]).await.unwrap();
    }
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for p in 0..3 {
        let c = c.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0.. {
                let ids: Vec<String> = (0..5).map(|i| format!("p{p}-{n}-{i}")).collect();
                let msgs = ids
                    .iter()
                    .map(|id| Client::message_with_id(id.clone(), id.clone()))
                    .collect();
                match c.publish_to_exchange("x", msgs).await {
                    Ok(_) => acked.lock().unwrap().extend(ids),
                    Err(_) => return,
                }
            }
        }));
    }
    // Killed under load: once more than 50 fan-outs are acknowledged
    // (however slow the machine), while the producers go on.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() <= 50 {
        assert!(std::time::Instant::now() < deadline, "no load within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.kill();
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    s.restart().await;
    let c = client(&s).await;
    let mut sets = Vec::new();
    for q in queues {
        let mut ids = HashSet::new();
        let mut token = String::new();
        loop {
            let page = c.browse(q, 1000, &token).await.unwrap();
            ids.extend(page.messages.into_iter().map(|m| m.message_id));
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        sets.push(ids);
    }
    assert_eq!(sets[0], sets[1], "a and b hold the same messages");
    assert_eq!(sets[1], sets[2], "b and c hold the same messages");
    let acked = acked.lock().unwrap();
    assert!(acked.len() > 50, "the load was real");
    let lost: Vec<&String> = acked.iter().filter(|id| !sets[0].contains(*id)).collect();
    assert!(lost.is_empty(), "acknowledged fan-outs lost: {lost:?}");
}
