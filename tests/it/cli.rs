//! The command-line client end to end, `--json` output parsed.

use std::process::{Command, Output};

use serde_json::Value;

use crate::harness::*;

fn run(s: &TestServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_letterbox"))
        .args(["--server", &format!("http://{}", s.addr)])
        .args(args)
        .output()
        .expect("run letterbox")
}

#[track_caller]
fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drives_a_dead_letter_flow() {
    let s = TestServer::start().await;
    json(&run(&s, &["queue", "create", "orders.dlq", "--json"]));
    let q = json(&run(
        &s,
        &[
            "queue",
            "create",
            "orders",
            "--dlq",
            "orders.dlq",
            "--max-deliveries",
            "2",
            "--ack-timeout",
            "30s",
            "--ttl",
            "1h",
            "--json",
        ],
    ));
    assert_eq!(q["config"]["dead_letter"]["queue"], "orders.dlq");
    assert_eq!(q["config"]["ack_timeout_ms"], 30_000);
    assert_eq!(q["config"]["message_ttl_ms"], 3_600_000);

    let p = json(&run(
        &s,
        &[
            "publish",
            "orders",
            "first",
            "second",
            "-p",
            "customer=acme",
            "--json",
        ],
    ));
    assert_eq!(p["published"], 2);
    let lines = "a\nb\nc\n".repeat(400);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &lines).unwrap();
    let p = json(&run(
        &s,
        &[
            "publish",
            "orders",
            "--file",
            file.path().to_str().unwrap(),
            "--batch",
            "250",
            "--json",
        ],
    ));
    assert_eq!(p["published"], 1200);

    let out = run(&s, &["consume", "orders", "--count", "1", "--json"]);
    assert!(out.status.success());
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["body"], "first");
    assert_eq!(first["properties"]["customer"], "acme");
    assert_eq!(first["delivery_count"], 1);

    for _ in 0..2 {
        let out = run(
            &s,
            &[
                "consume", "orders", "--count", "1", "--nack", "--reason", "tax down", "--json",
            ],
        );
        let d: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(d["body"], "second");
    }
    let dlq = json(&run(&s, &["browse", "orders.dlq", "--json"]));
    assert_eq!(dlq[0]["body"], "second");
    assert_eq!(dlq[0]["dead_letters"][0]["reason"], "MAX_DELIVERIES");
    assert_eq!(dlq[0]["dead_letters"][0]["last_nack_reason"], "tax down");

    let st = json(&run(&s, &["queue", "stats", "orders", "--json"]));
    assert_eq!(
        (
            st["acked"].as_u64(),
            st["dead_lettered"].as_u64(),
            st["total"].as_u64()
        ),
        (Some(1), Some(1), Some(1200))
    );
    let purged = json(&run(&s, &["queue", "purge", "orders", "--json"]));
    assert_eq!(purged["messages_deleted"], 1200);

    let list = json(&run(&s, &["queue", "list", "--json"]));
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders", "orders.dlq"]);

    let human = run(&s, &["queue", "stats", "orders"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("purged"),
        "tables by default"
    );
}

#[tokio::test]
async fn cli_exit_codes_say_what_went_wrong() {
    let s = TestServer::start().await;
    let missing = run(&s, &["queue", "get", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NOT_FOUND"));
    let bad = run(&s, &["queue", "create", "bad name"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("INVALID_ARGUMENT"));
    let usage = run(&s, &["publish", "q"]);
    assert_eq!(usage.status.code(), Some(2));
    let unreachable = Command::new(env!("CARGO_BIN_EXE_letterbox"))
        .args(["--server", "http://127.0.0.1:1", "queue", "list"])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(3));
}
