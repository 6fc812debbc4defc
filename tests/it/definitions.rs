//! Definitions: export, import into a fresh server, identical export; bad
//! files change nothing; `serve --definitions` (SPEC §8).

use letterbox::client::{Client, pb};
use tonic::Code;

use crate::harness::*;

async fn client(s: &TestServer) -> Client {
    Client::connect(format!("http://{}", s.addr)).await.unwrap()
}

#[tokio::test]
async fn export_import_export_is_identical_and_import_is_idempotent() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    c.create_queue("orders.dlq", pb::QueueConfig::default())
        .await
        .unwrap();
    c.create_queue(
        "orders",
        pb::QueueConfig {
            ack_timeout_ms: Some(30_000),
            retry_backoff: Some(pb::RetryBackoff {
                initial_ms: 1000,
                max_ms: 60_000,
                multiplier: 2.0,
            }),
            max_length: Some(1000),
            ..with_dlq("orders.dlq", 5)
        },
    )
    .await
    .unwrap();
    let fifo = pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        ..Default::default()
    };
    c.create_queue("ledger.dlq", fifo.clone()).await.unwrap();
    c.create_queue(
        "ledger",
        pb::QueueConfig {
            on_poison: pb::PoisonPolicy::ParkGroup as i32,
            dedup_window_ms: Some(60_000),
            ..pb::QueueConfig {
                dead_letter: Some(pb::DeadLetterPolicy {
                    queue: "ledger.dlq".into(),
                    max_deliveries: 3,
                }),
                ..fifo
            }
        },
    )
    .await
    .unwrap();
    c.create_exchange("events").await.unwrap();
    c.bind("events", "orders", vec![("type".into(), "order".into())])
        .await
        .unwrap();
    let exported = c.export_definitions().await.unwrap();

    let fresh = TestServer::start().await;
    let fc = client(&fresh).await;
    let r = fc.import_definitions(&exported).await.unwrap();
    assert_eq!(
        (r.queues_created, r.exchanges_created, r.bindings_changed),
        (4, 1, 1)
    );
    assert_eq!(
        fc.export_definitions().await.unwrap(),
        exported,
        "the round trip is exact"
    );
    let again = fc.import_definitions(&exported).await.unwrap();
    assert_eq!(
        (
            again.queues_created,
            again.exchanges_created,
            again.bindings_changed
        ),
        (0, 0, 0)
    );
    let orders = fc.get_queue("orders").await.unwrap();
    assert_eq!(
        orders.config.unwrap().dead_letter.unwrap().max_deliveries,
        5
    );
    assert_eq!(
        fc.get_queue("orders.dlq")
            .await
            .unwrap()
            .dead_letter_sources,
        ["orders"]
    );
}

#[tokio::test]
async fn a_bad_file_is_refused_whole_naming_the_entry() {
    let s = TestServer::start().await;
    let c = client(&s).await;
    c.create_queue("existing", pb::QueueConfig::default())
        .await
        .unwrap();
    let cases = [
        (
            r#"{"queues": [{"name": "a"}, {"name": "b", "dead_letter": {"queue": "missing"}}]}"#,
            Code::InvalidArgument,
            "queues[1].dead_letter.queue",
        ),
        (
            r#"{"queues": [{"name": "a", "ack_timeout_ms": 5}]}"#,
            Code::InvalidArgument,
            "queues[0].ack_timeout_ms",
        ),
        (
            r#"{"queues": [{"name": "a", "kind": "LIFO"}]}"#,
            Code::InvalidArgument,
            "queues[0].kind",
        ),
        (
            r#"{"queues": [{"name": "a"}, {"name": "a"}]}"#,
            Code::InvalidArgument,
            "appears twice",
        ),
        (
            r#"{"queues": [{"name": "a", "colour": "blue"}]}"#,
            Code::InvalidArgument,
            "colour",
        ),
        (
            r#"{"queues": [{"name": "a"}], "bindings": [{"exchange": "x", "queue": "a"}]}"#,
            Code::InvalidArgument,
            "bindings[0].exchange",
        ),
        (
            r#"{"queues": [{"name": "f", "kind": "FIFO"}], "exchanges": [{"name": "x"}], "bindings": [{"exchange": "x", "queue": "f"}]}"#,
            Code::InvalidArgument,
            "FIFO",
        ),
        (
            r#"{"queues": [{"name": "existing", "ack_timeout_ms": 5000}]}"#,
            Code::AlreadyExists,
            "existing",
        ),
        (
            r#"{"queues": [{"name": "a", "dead_letter": {"queue": "b"}}, {"name": "b", "dead_letter": {"queue": "a"}}]}"#,
            Code::InvalidArgument,
            "loop",
        ),
        ("{not json", Code::InvalidArgument, "line 1"),
    ];
    for (doc, code, needle) in cases {
        let err = c.import_definitions(doc).await.unwrap_err();
        assert_eq!(err.code(), Some(code), "{doc}: {err}");
        assert!(err.to_string().contains(needle), "{doc}: {err}");
    }
    let names: Vec<String> = c
        .list_queues("")
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["existing"], "nothing was applied");
    assert!(c.list_exchanges().await.unwrap().is_empty());
}

#[tokio::test]
async fn serve_applies_a_definitions_file_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("defs.json");
    std::fs::write(&good, r#"{"queues": [{"name": "jobs.dlq"}, {"name": "jobs", "dead_letter": {"queue": "jobs.dlq", "max_deliveries": 3}}], "exchanges": [{"name": "x"}], "bindings": [{"exchange": "x", "queue": "jobs"}]}"#).unwrap();
    let arg = format!("--definitions={}", good.display());
    let s = TestServer::start_with(&[&arg]).await;
    let c = client(&s).await;
    assert_eq!(
        c.get_queue("jobs")
            .await
            .unwrap()
            .config
            .unwrap()
            .dead_letter
            .unwrap()
            .queue,
        "jobs.dlq"
    );
    assert_eq!(c.get_exchange("x").await.unwrap().bindings.len(), 1);

    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"queues": [{"name": "jobs", "dead_letter": {"queue": "nowhere"}}]}"#,
    )
    .unwrap();
    let data = dir.path().join("data2");
    let err = spawn(
        &data,
        &dir.path().join("log"),
        &[format!("--definitions={}", bad.display())],
    )
    .expect_err("refused");
    assert!(
        err.contains("queues[0].dead_letter.queue") && err.contains("exit status: 1"),
        "{err}"
    );
}
