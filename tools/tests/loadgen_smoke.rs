//! loadgen's Letterbox workloads against a real server (in this process,
//! on loopback), with small counts: each new workload and option runs once
//! and its result line is checked.

use std::path::Path;
use std::sync::Arc;

use letterbox::clock::SystemClock;
use letterbox::server::{Server, ServerConfig};
use serde_json::Value;

struct Running {
    grpc: String,
    metrics: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new(
        dir.path().join("data"),
        "127.0.0.1:0".parse().expect("addr"),
    );
    config.store.segment_size = 8 << 20;
    config.store.min_free_bytes = 0;
    config.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let server = Server::start(config, Arc::new(SystemClock))
        .await
        .expect("start");
    let grpc = format!("http://{}", server.local_addr());
    let metrics = format!("http://{}/metrics", server.metrics_addr().expect("metrics"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .serve(async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
    });
    Running {
        grpc,
        metrics,
        stop: Some(tx),
        task: Some(task),
        _dir: dir,
    }
}

impl Running {
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("server task");
        }
    }

    /// Runs `loadgen run --target letterbox ARGS` and returns its result line.
    async fn run(&self, out: &std::path::Path, args: &[&str]) -> Value {
        let before = std::fs::read_to_string(out)
            .unwrap_or_default()
            .lines()
            .count();
        let mut argv = vec![
            "loadgen",
            "run",
            "--target",
            "letterbox",
            "--letterbox-url",
            &self.grpc,
            "--letterbox-metrics-url",
            &self.metrics,
            "--max-secs",
            "60",
            "--out",
            out.to_str().expect("utf-8 path"),
        ];
        argv.extend_from_slice(args);
        letterbox_tools::loadgen::run_cli(&argv)
            .await
            .unwrap_or_else(|e| panic!("loadgen {args:?}: {e:#}"));
        let text = std::fs::read_to_string(out).expect("results");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), before + 1, "one result line for {args:?}");
        serde_json::from_str(lines[before]).expect("json line")
    }
}

fn check(r: &Value, completed: u64) {
    assert_eq!(r["completed"], completed, "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    let ex = &r["extra"];
    assert!(ex["fsyncs_per_s"].as_f64().is_some(), "fsyncs/s in {r}");
    assert!(
        ex["log_syncs"].as_u64().unwrap_or(0) > 0,
        "fsyncs counted in {r}"
    );
    assert!(
        ex["log_bytes_per_msg"].as_f64().unwrap_or(0.0) > 0.0,
        "log bytes per message in {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_workloads_and_options_run_against_letterbox() {
    let s = start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("r.jsonl");
    a_get_row_is_skipped(&s, &out).await;
    consumers(&s, &out).await;
    fifo_rows(&s, &out).await;
    redrive_row(&s, &out).await;
    sizes(&s, &out).await;
    report_rows(&out);
    s.stop().await;
}

/// `--consumer get` (RabbitMQ only) writes no result line for Letterbox.
async fn a_get_row_is_skipped(s: &Running, out: &Path) {
    // `--consumer get` is RabbitMQ's `basic.get`: Letterbox is skipped,
    // with no result line.
    let lines = || {
        std::fs::read_to_string(out)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = lines();
    letterbox_tools::loadgen::run_cli([
        "loadgen",
        "run",
        "--target",
        "letterbox",
        "--letterbox-url",
        &s.grpc,
        "--workload",
        "consume-ack",
        "--consumer",
        "get",
        "--prefetch",
        "1",
        "--count",
        "10",
        "--out",
        out.to_str().expect("utf-8 path"),
    ])
    .await
    .expect("a skipped run");
    assert_eq!(lines(), before, "no result for a skipped run");
}

/// Subscribe and Receive consumers with async and sync acks, and an
/// end-to-end row numbered from `--first-rep`.
async fn consumers(s: &Running, out: &Path) {
    // Subscribe consumers, async and sync acks, next to a Receive row.
    for (ack, count) in [("async", "400"), ("sync", "100")] {
        let r = s
            .run(
                out,
                &[
                    "--workload",
                    "consume-ack",
                    "--consumer",
                    "subscribe",
                    "--ack",
                    ack,
                    "--prefetch",
                    "64",
                    "--count",
                    count,
                    "--queue",
                    "sub",
                ],
            )
            .await;
        check(&r, count.parse().unwrap());
        assert_eq!(
            r["variant"],
            format!("prefetch=64,ack={ack},consumer=subscribe"),
            "{r}"
        );
        assert_eq!(r["extra"]["queue_depth_after"], 0, "{r}");
    }
    // Receive with async acks: they ride on the next Receive, and those
    // left when the drain ends are sent on their own.
    for prefetch in ["1", "64"] {
        let r = s
            .run(
                out,
                &[
                    "--workload",
                    "consume-ack",
                    "--prefetch",
                    prefetch,
                    "--count",
                    "300",
                    "--queue",
                    "riding",
                ],
            )
            .await;
        check(&r, 300);
        assert_eq!(r["extra"]["queue_depth_after"], 0, "every ack arrived: {r}");
    }
    let r = s
        .run(
            out,
            &[
                "--workload",
                "end-to-end",
                "--consumer",
                "subscribe",
                "--count",
                "300",
                "--queue",
                "e2e",
                // as bench.sh runs a row's third repetition on its own
                "--first-rep",
                "3",
            ],
        )
        .await;
    check(&r, 300);
    assert!(r["latency"]["p50_ms"].as_f64().is_some(), "{r}");
    assert_eq!(r["rep"], 3, "numbered from --first-rep: {r}");
}

/// FIFO with concurrent consumers, pull and push.
async fn fifo_rows(s: &Running, out: &Path) {
    // FIFO with concurrent consumers, pull and push: order is checked.
    for mode in ["receive", "subscribe"] {
        let r = s
            .run(
                out,
                &[
                    "--workload",
                    "fifo",
                    "--groups",
                    "30",
                    "--per-group",
                    "7",
                    "--consumers",
                    "3",
                    "--prefetch",
                    "8",
                    "--consumer",
                    mode,
                    "--queue",
                    "fifo",
                ],
            )
            .await;
        check(&r, 210);
        assert_eq!(r["requested"], 210, "{r}");
        assert_eq!(r["extra"]["order_checked"], true, "{r}");
        assert_eq!(r["extra"]["queue_depth_after"], 0, "{r}");
        assert!(
            r["extra"]["publish_msgs_per_s"].as_f64().unwrap_or(0.0) > 0.0,
            "{r}"
        );
    }
}

/// Redrive of dead-lettered messages.
async fn redrive_row(s: &Running, out: &Path) {
    // Redrive of dead-lettered messages.
    let r = s
        .run(
            out,
            &["--workload", "redrive", "--count", "500", "--queue", "rd"],
        )
        .await;
    check(&r, 500);
    assert_eq!(r["extra"]["queue_depth_after"], 500, "{r}");
    assert!(
        r["extra"]["dead_letter_msgs_per_s"].as_f64().is_some(),
        "{r}"
    );
}

/// Message sizes from 100 B to 1 MiB.
async fn sizes(s: &Running, out: &Path) {
    // Message sizes from 100 B to 1 MiB, batched publishes included.
    let r = s
        .run(
            out,
            &[
                "--workload",
                "publish-durable",
                "--size",
                "100",
                "--count",
                "200",
                "--queue",
                "small",
            ],
        )
        .await;
    check(&r, 200);
    assert_eq!(r["variant"], "window=64,size=100", "{r}");
    let mib = "1048576";
    let r = s
        .run(
            out,
            &[
                "--workload",
                "publish-durable",
                "--size",
                mib,
                "--count",
                "24",
                "--window",
                "24",
                "--batch",
                "12",
                "--queue",
                "big",
            ],
        )
        .await;
    check(&r, 24);
    assert!(
        r["extra"]["log_bytes_per_msg"].as_f64().unwrap() >= 1_048_576.0,
        "a 1 MiB body is written once: {r}"
    );
    for mode in ["receive", "subscribe"] {
        let r = s
            .run(
                out,
                &[
                    "--workload",
                    "consume-ack",
                    "--size",
                    mib,
                    "--count",
                    "12",
                    "--consumer",
                    mode,
                    "--queue",
                    "big",
                ],
            )
            .await;
        check(&r, 12);
    }
    let r = s
        .run(
            out,
            &[
                "--workload",
                "fifo",
                "--size",
                mib,
                "--groups",
                "3",
                "--per-group",
                "3",
                "--consumers",
                "2",
                "--queue",
                "bigfifo",
            ],
        )
        .await;
    check(&r, 9);
}

/// The report of all the rows above.
fn report_rows(out: &Path) {
    // The report shows the new rows.
    let md = letterbox_tools::loadgen::report::report(&[out.to_string_lossy().into_owned()], None)
        .expect("report");
    assert!(
        md.contains("consume-ack prefetch=64,ack=async,consumer=subscribe"),
        "{md}"
    );
    assert!(
        md.contains("fifo groups=30,per_group=7,consumers=3"),
        "{md}"
    );
    assert!(md.contains("redrive rate=unlimited"), "{md}");
    assert!(md.contains("fsync/s"), "{md}");
}

/// The error of `loadgen run --target letterbox --workload publish-durable
/// FLAG VALUE`, which must be refused before any call.
async fn refused(flag: &str, value: &str) -> String {
    letterbox_tools::loadgen::run_cli([
        "loadgen",
        "run",
        "--target",
        "letterbox",
        "--workload",
        "publish-durable",
        flag,
        value,
    ])
    .await
    .unwrap_err()
    .to_string()
}

#[tokio::test]
async fn a_bad_size_is_refused_by_name() {
    let e = refused("--size", "8").await;
    assert!(e.contains("8 bytes is out of range"), "{e}");
}

#[tokio::test]
async fn a_first_repetition_of_zero_is_refused() {
    let e = refused("--first-rep", "0").await;
    assert!(e.contains("--first-rep"), "{e}");
}

/// `letterbox-sqs`: loadgen over Letterbox's SQS endpoint, one message a
/// call and batched, receives of one with each delete waited for and of
/// ten with the deletes batched; every message published is received and
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqs_target_publishes_receives_and_deletes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ServerConfig::new(
        dir.path().join("data"),
        "127.0.0.1:0".parse().expect("addr"),
    );
    config.store.segment_size = 8 << 20;
    config.store.min_free_bytes = 0;
    config.sqs_listen = Some(letterbox::server::ConsoleAt::Exactly(
        "127.0.0.1:0".parse().expect("addr"),
    ));
    let server = Server::start(config, Arc::new(SystemClock))
        .await
        .expect("start");
    let sqs = format!("http://{}", server.sqs_addr().expect("the SQS endpoint"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .serve(async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
    });
    let out = dir.path().join("r.jsonl");
    let runs = [
        [
            "--workload",
            "publish-durable",
            "--window",
            "4",
            "--count",
            "40",
        ]
        .as_slice(),
        &[
            "--workload",
            "publish-durable",
            "--window",
            "20",
            "--batch",
            "10",
            "--count",
            "95",
        ],
        &[
            "--workload",
            "consume-ack",
            "--prefetch",
            "1",
            "--ack",
            "sync",
            "--count",
            "30",
        ],
        &[
            "--workload",
            "consume-ack",
            "--prefetch",
            "25",
            "--ack",
            "async",
            "--count",
            "120",
        ],
    ];
    for (lines, args) in runs.into_iter().enumerate() {
        let mut argv = vec![
            "loadgen",
            "run",
            "--target",
            "letterbox-sqs",
            "--sqs-url",
            &sqs,
            "--max-secs",
            "60",
            "--out",
            out.to_str().expect("utf-8 path"),
        ];
        argv.extend_from_slice(args);
        letterbox_tools::loadgen::run_cli(&argv)
            .await
            .unwrap_or_else(|e| panic!("loadgen {args:?}: {e:#}"));
        let text = std::fs::read_to_string(&out).expect("results");
        let all: Vec<&str> = text.lines().collect();
        assert_eq!(all.len(), lines + 1, "{args:?}");
        let r: Value = serde_json::from_str(all[lines]).expect("json");
        let want: u64 = args[args.len() - 1].parse().expect("count");
        assert_eq!(r["completed"], want, "{r}");
        assert_eq!(r["timed_out"], false, "{r}");
        assert_eq!(r["target"], "letterbox-sqs");
        if args[1] == "consume-ack" {
            assert_eq!(r["extra"]["queue_depth_after"], 0, "none left visible: {r}");
        }
    }
    let _ = tx.send(());
    task.await.expect("server task");
}
