//! The proto as a public contract: a Python client generated from it runs
//! the core flow against this build's server, `buf lint` (every element
//! documented) and `buf format` are clean, and the client examples of
//! examples/clients/ in Python and TypeScript run their consume loop
//! against it, over TLS with a bearer token. The scripts install what they
//! need (grpcio-tools from PyPI, buf and grpc-js from npm) under target/;
//! where that cannot be had they skip (`skip_or_run`). The Prometheus
//! metrics move with the queues (and the calls, the consumers, the
//! process and the disk), serve over TLS with a token when asked, the
//! Grafana dashboard reads only metrics a server exports, and the server
//! process runs without transparent huge pages.

use std::process::Command;
use std::time::Duration;

use letterbox::pb;

/// Set to 1 by .ci/run: a script that skips fails its test instead.
const REQUIRE: &str = "LETTERBOX_REQUIRE_ECOSYSTEM";

/// Runs `bash SCRIPT ARGS` from the repository root, with `LETTERBOX_BIN`
/// set to this build's server and the environment `env`, and returns its
/// standard output and error. A script that cannot have what it needs
/// (python3, npm, a package registry that answers) exits with 77 and says
/// why on a `skipped: ` line (tests/common.sh); then this prints `SKIP:
/// TEST: WHY` and returns `None`, unless LETTERBOX_REQUIRE_ECOSYSTEM=1,
/// under which it fails. Any other non-zero exit fails.
pub(crate) fn skip_or_run(
    test: &str,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<String> {
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("LETTERBOX_BIN", env!("CARGO_BIN_EXE_letterbox"))
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = format!("{}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    if out.status.code() == Some(77) {
        let why = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("skipped: "))
            .unwrap_or("no reason given");
        assert!(
            std::env::var(REQUIRE).as_deref() != Ok("1"),
            "{test} skipped ({why}), but {REQUIRE}=1 requires it to run:\n{text}"
        );
        // Straight to the process's standard error, which the test
        // harness does not capture (eprintln! would be shown only on
        // failure).
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: {test}: {why} (it runs where the registry answers; \
             .ci/run sets {REQUIRE}=1, under which a skip fails)"
        );
        return None;
    }
    assert!(out.status.success(), "{script} {args:?} failed:\n{text}");
    Some(text)
}

#[test]
fn a_generated_python_client_runs_the_core_flow() {
    let Some(text) = skip_or_run(
        "a_generated_python_client_runs_the_core_flow",
        "tests/python/run.sh",
        &[],
        &[],
    ) else {
        return;
    };
    assert!(
        text.contains("PASS: core flow against a real server"),
        "{text}"
    );
}

#[test]
fn the_proto_passes_buf_lint_and_format() {
    let Some(text) = skip_or_run(
        "the_proto_passes_buf_lint_and_format",
        "tests/buf/run.sh",
        &[],
        &[],
    ) else {
        return;
    };
    assert!(
        text.contains("lint: ok") && text.contains("format: ok"),
        "{text}"
    );
}

/// Runs examples/clients/LANG through tests/clients/run.sh against a server
/// with TLS and one principal with a bearer token: the example's consume
/// loop (nack into the DLQ, the dead-letter record, redrive, ack) with the
/// credentials it is documented to take.
async fn client_example(lang: &str) {
    use letterbox::auth::hex_sha256;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

    const TOKEN: &str = "example-token-5f1d0c8e2a";
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Names of their own: OpenSSL and BoringSSL take a certificate whose
    // issuer is its subject for self-signed.
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Letterbox example CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let mut server_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let ca_pem = write("ca.pem", &ca.pem());
    let cert = write("server.pem", &server_cert.pem());
    let key = write("server.key", &server_key.serialize_pem());
    let config = write(
        "letterbox.toml",
        &format!(
            "[[principals]]\nname = \"payments\"\ntoken_sha256 = [\"{}\"]\n\
             admin = [\"example.*\"]\npublish = [\"example.*\"]\nconsume = [\"example.*\"]\n",
            hex_sha256(TOKEN.as_bytes())
        ),
    );
    let server = crate::harness::TestServer::start_with(&[
        "--config",
        &config,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ])
    .await;
    let addr = format!("localhost:{}", server.addr.port());
    let test = format!("the_{lang}_client_example_runs_its_consume_loop");
    let env = [
        ("LETTERBOX_ADDR", addr.as_str()),
        ("LETTERBOX_TOKEN", TOKEN),
        ("LETTERBOX_CA_CERT", ca_pem.as_str()),
    ];
    let ran =
        tokio::task::block_in_place(|| skip_or_run(&test, "tests/clients/run.sh", &[lang], &env));
    let Some(text) = ran else { return };
    assert!(
        text.contains(&format!(
            "PASS: the {lang} client example against a real server"
        )),
        "{text}\n--- server log ---\n{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_example_runs_its_consume_loop() {
    client_example("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_client_example_runs_its_consume_loop() {
    client_example("node").await;
}

/// GET over plain HTTP/1.1; returns the status line and the body.
pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of one sample line (`name{labels} value`), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A server in this process with its metrics endpoint on: its gRPC and
/// metrics addresses, the sender that stops it, its task and directory.
struct WithMetrics {
    addr: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
    anypoint: Option<std::net::SocketAddr>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), letterbox::server::ServerError>>,
    _dir: tempfile::TempDir,
}

async fn with_metrics(change: impl FnOnce(&mut letterbox::server::ServerConfig)) -> WithMetrics {
    use letterbox::clock::SystemClock;
    use letterbox::server::{Server, ServerConfig};

    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path().join("data"), "127.0.0.1:0".parse().unwrap());
    config.store.min_free_bytes = 0;
    config.store.segment_size = 1 << 20;
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    change(&mut config);
    let server = Server::start(config, std::sync::Arc::new(SystemClock))
        .await
        .unwrap();
    let addr = server.local_addr();
    let metrics = server.metrics_addr().unwrap();
    let anypoint = server.anypoint_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    WithMetrics {
        addr,
        metrics,
        anypoint,
        stop,
        task,
        _dir: dir,
    }
}

#[tokio::test]
async fn prometheus_metrics_move_with_the_queues() {
    let WithMetrics {
        addr,
        metrics,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(|_| {}).await;

    let mut c = crate::harness::connect(addr).await;
    c.create("jobs-dlq", crate::harness::config()).await;
    c.create("jobs", crate::harness::with_dlq("jobs-dlq", 1))
        .await;
    let (status, before) = http_get(metrics, "/metrics/per-queue").await;
    assert!(status.contains("200"), "{status}");
    assert_eq!(
        sample(&before, "letterbox_queue_ready{queue=\"jobs\"}"),
        Some(0.0)
    );
    assert!(before.trim_end().ends_with("# EOF"), "OpenMetrics text");

    c.publish("jobs", &["a", "b", "c"]).await;
    let got = c.receive("jobs", 1).await;
    c.nack(&got[0].ack_token, "broken").await;
    let (_, per_queue) = http_get(metrics, "/metrics/per-queue").await;
    let q = |series: &str| {
        sample(&per_queue, series).unwrap_or_else(|| panic!("{series} missing:\n{per_queue}"))
    };
    assert_eq!(q("letterbox_queue_ready{queue=\"jobs\"}"), 2.0);
    assert_eq!(q("letterbox_queue_published_total{queue=\"jobs\"}"), 3.0);
    assert_eq!(q("letterbox_queue_nacked_total{queue=\"jobs\"}"), 1.0);
    assert_eq!(
        q("letterbox_queue_dead_lettered_total{queue=\"jobs\"}"),
        1.0
    );
    assert_eq!(q("letterbox_queue_ready{queue=\"jobs-dlq\"}"), 1.0);
    assert_eq!(
        q("letterbox_queue_dead_letter_depth{queue=\"jobs\",dead_letter_queue=\"jobs-dlq\"}"),
        1.0
    );
    // Only the queues' figures there: the rest is /metrics's.
    assert!(
        !per_queue.contains("letterbox_commit_seconds"),
        "{per_queue}"
    );

    // /metrics: the same figures over all queues, no label per queue.
    let (_, after) = http_get(metrics, "/metrics").await;
    assert!(
        !after.contains("queue=\""),
        "per-queue series in /metrics:\n{after}"
    );
    let v = |series: &str| {
        sample(&after, series).unwrap_or_else(|| panic!("{series} missing:\n{after}"))
    };
    assert_eq!(v("letterbox_queues"), 2.0);
    assert_eq!(v("letterbox_queues_ready"), 3.0);
    assert_eq!(v("letterbox_queues_messages"), 3.0);
    assert_eq!(v("letterbox_queues_published_total"), 3.0);
    assert_eq!(v("letterbox_queues_nacked_total"), 1.0);
    assert_eq!(v("letterbox_queues_dead_lettered_total"), 1.0);
    assert_eq!(v("letterbox_queues_dead_letter_messages"), 1.0);
    assert_eq!(v("letterbox_queues_consumers{kind=\"receive\"}"), 1.0);
    assert!(v("letterbox_queues_oldest_ready_age_seconds") >= 0.0);
    let build = format!(
        "letterbox_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(after.contains(&build), "{after}");
    assert!(after.contains("# TYPE letterbox_build info"), "{after}");
    assert!(v("letterbox_commit_seconds_count") >= 4.0);
    assert!(v("letterbox_log_syncs_total") >= 1.0);
    assert!(v("letterbox_log_sync_batch_records_count") >= 1.0);
    assert!(v("letterbox_recovery_seconds") >= 0.0);
    assert_eq!(v("letterbox_publish_waits_total"), 0.0);
    assert_eq!(v("letterbox_corrupt_records_found_total"), 0.0);
    assert!(v("letterbox_log_unapplied_bytes") >= 0.0);
    assert!(v("letterbox_apply_seconds_count") >= 0.0);
    assert_eq!(v("letterbox_storage_failed"), 0.0);
    let (missing, _) = http_get(metrics, "/nothing").await;
    assert!(missing.contains("404"), "{missing}");

    drop(c);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// `/metrics` keeps its size whatever the number of queues (the queues'
/// figures summed); `/metrics/per-queue` grows with them; with
/// `--metrics-per-queue` `/metrics` carries both.
#[tokio::test]
async fn the_default_scrape_does_not_grow_with_the_queues() {
    let WithMetrics {
        addr,
        metrics,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(|_| {}).await;
    let mut c = crate::harness::connect(addr).await;
    c.create("q0", crate::harness::config()).await;
    // Figures that move on their own (times, the process's) aside.
    let steady = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("letterbox_queue"))
            .map(|l| l.split(' ').next().unwrap_or(l).len())
            .sum::<usize>()
    };
    let (_, one) = http_get(metrics, "/metrics").await;
    let (_, one_each) = http_get(metrics, "/metrics/per-queue").await;
    for i in 1..200 {
        c.create(&format!("queue-number-{i:03}"), crate::harness::config())
            .await;
    }
    let (_, many) = http_get(metrics, "/metrics").await;
    let (_, many_each) = http_get(metrics, "/metrics/per-queue").await;
    assert_eq!(steady(&one), steady(&many), "/metrics grew:\n{many}");
    assert!(
        many.len() < one.len() + 200,
        "{} then {} bytes",
        one.len(),
        many.len()
    );
    assert!(
        many_each.len() > 50 * one_each.len(),
        "{} then {} bytes",
        one_each.len(),
        many_each.len()
    );
    assert_eq!(sample(&many, "letterbox_queues"), Some(200.0));
    drop(c);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();

    let WithMetrics {
        addr,
        metrics,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(|c| c.metrics_per_queue = true).await;
    let mut c = crate::harness::connect(addr).await;
    c.create("q0", crate::harness::config()).await;
    let (_, both) = http_get(metrics, "/metrics").await;
    assert_eq!(
        sample(&both, "letterbox_queue_ready{queue=\"q0\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&both, "letterbox_queues_ready"), Some(0.0));
    drop(c);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A gRPC connection with no call open for `idle_timeout` is closed (the
/// client's channel reconnects on its next call); a long poll keeps its
/// connection open past it. Seen through `letterbox_connections_open`.
#[tokio::test]
async fn idle_grpc_connections_are_closed_and_busy_ones_kept() {
    let WithMetrics {
        addr,
        metrics,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(|c| c.limits.idle_timeout = Duration::from_millis(400)).await;
    // The scrape's own connection counts one.
    let open = || async {
        let (_, text) = http_get(metrics, "/metrics").await;
        sample(&text, "letterbox_connections_open").unwrap()
    };
    let mut c = crate::harness::connect(addr).await;
    c.create("q", crate::harness::config()).await;
    assert_eq!(open().await, 2.0);
    // A long poll of 1.5 s keeps its connection past the idle timeout.
    let mut poller = c.clone();
    let poll = tokio::spawn(async move {
        poller
            .msg
            .receive(pb::ReceiveRequest {
                queue: "q".into(),
                max_messages: 1,
                wait_ms: 1500,
                ..Default::default()
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(open().await, 2.0, "busy with the long poll");
    assert!(poll.await.unwrap().is_ok());
    // Idle past the timeout: closed.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(open().await, 1.0, "closed once idle");
    // The client's next call reconnects.
    c.publish("q", &["again"]).await;
    assert_eq!(c.stats("q").await.total, 1);
    // An HTTP/1 keep-alive connection that sends nothing more is closed
    // after the idle timeout too.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
        s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {metrics}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let ended = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the idle keep-alive connection was closed");
    }
    drop(c);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// The server turns transparent huge pages off for its process
/// (`THP_enabled: 0` in `/proc/<pid>/status`, Linux 5.0 and later), as it
/// must for its allocator's arenas not to be backed and zeroed 2 MiB at a
/// time (docs/benchmarks/2026-12-01/NOTES.md, "Transparent huge pages off").
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_server_runs_without_transparent_huge_pages() {
    let s = crate::harness::TestServer::start().await;
    let pid = s.pid().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .unwrap_or_else(|| panic!("no THP_enabled in /proc/{pid}/status:\n{status}"));
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}

/// Scrapes until `check` holds on the text (at most 2 s); returns the last
/// text.
async fn scrape_until(
    metrics: std::net::SocketAddr,
    check: impl Fn(&str) -> bool,
) -> (bool, String) {
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (_, text) = http_get(metrics, "/metrics").await;
        if check(&text) {
            return (true, text);
        }
        if tokio::time::Instant::now() >= until {
            return (false, text);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const PUBLISH: &str = "letterbox.v1.MessagingService/Publish";

/// The metrics operators alert on: the age of the oldest ready message,
/// the consumers of each queue, every gRPC call by method and status with
/// its duration, the process's figures and the data directory's free
/// space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_metrics_follow_ages_consumers_calls_and_the_process() {
    let WithMetrics {
        addr,
        metrics,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(|c| {
        c.store.min_free_bytes = 1000;
        // Each queue's figures in /metrics too (--metrics-per-queue).
        c.metrics_per_queue = true;
    })
    .await;
    let mut c = crate::harness::connect(addr).await;
    c.create("ages", crate::harness::config()).await;
    c.create("idle", crate::harness::config()).await;
    c.publish("ages", &["a", "b", "c"]).await;
    let (_, text) = http_get(metrics, "/metrics").await;
    let v = |text: &str, series: &str| {
        sample(text, series).unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    let age = "letterbox_queue_oldest_ready_age_seconds{queue=\"ages\"}";
    assert!(v(&text, age) < 1.0, "just published");
    assert_eq!(
        v(
            &text,
            "letterbox_queue_oldest_ready_age_seconds{queue=\"idle\"}"
        ),
        0.0
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, text) = http_get(metrics, "/metrics").await;
    assert!(v(&text, age) >= 1.0, "{}", v(&text, age));
    // Leased, they are no longer ready.
    assert_eq!(c.receive("ages", 10).await.len(), 3);
    let (_, text) = http_get(metrics, "/metrics").await;
    assert_eq!(v(&text, age), 0.0, "none ready");
    assert_eq!(
        v(
            &text,
            "letterbox_queue_consumers{queue=\"ages\",kind=\"receive\"}"
        ),
        1.0
    );
    assert_eq!(
        v(
            &text,
            "letterbox_queue_consumers{queue=\"idle\",kind=\"receive\"}"
        ),
        0.0
    );

    // A Subscribe stream counts while it is open.
    let subscribers = "letterbox_queue_consumers{queue=\"idle\",kind=\"subscribe\"}";
    assert_eq!(v(&text, subscribers), 0.0);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SubscribeRequest {
        kind: Some(pb::subscribe_request::Kind::Open(pb::SubscribeOpen {
            queue: "idle".into(),
            credit: 1,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let opened = tokio::time::Instant::now();
    let stream = c
        .msg
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    let (open, text) = scrape_until(metrics, |t| sample(t, subscribers) == Some(1.0)).await;
    assert!(open, "one subscriber:\n{text}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stream);
    drop(tx);
    let subscribe_count = "letterbox_grpc_request_duration_seconds_count{method=\"letterbox.v1.MessagingService/Subscribe\"}";
    let (closed, text) = scrape_until(metrics, |t| {
        sample(t, subscribers) == Some(0.0) && sample(t, subscribe_count) == Some(1.0)
    })
    .await;
    assert!(closed, "the stream closed and was counted:\n{text}");
    // A stream's duration is its life.
    let lived = opened.elapsed().as_secs_f64();
    let sum = v(
        &text,
        "letterbox_grpc_request_duration_seconds_sum{method=\"letterbox.v1.MessagingService/Subscribe\"}",
    );
    assert!(sum >= 0.2 && sum <= lived, "{sum} of {lived}");

    // Calls by method and status code.
    let missing = c
        .admin
        .get_queue(pb::GetQueueRequest {
            name: "no-such-queue".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let (_, text) = http_get(metrics, "/metrics").await;
    assert_eq!(
        v(
            &text,
            &format!("letterbox_grpc_requests_total{{method=\"{PUBLISH}\",code=\"OK\"}}")
        ),
        1.0
    );
    assert_eq!(
        v(
            &text,
            "letterbox_grpc_requests_total{method=\"letterbox.v1.AdminService/GetQueue\",code=\"NOT_FOUND\"}"
        ),
        1.0
    );
    assert_eq!(
        v(
            &text,
            "letterbox_grpc_requests_total{method=\"letterbox.v1.AdminService/CreateQueue\",code=\"OK\"}"
        ),
        2.0
    );
    assert_eq!(
        v(
            &text,
            &format!("letterbox_grpc_request_duration_seconds_count{{method=\"{PUBLISH}\"}}")
        ),
        1.0
    );
    assert!(
        v(
            &text,
            &format!("letterbox_grpc_request_duration_seconds_sum{{method=\"{PUBLISH}\"}}")
        ) > 0.0
    );
    assert!(
        !text.contains("no-such-queue"),
        "a missing queue shows in no series"
    );

    // The process and the disk.
    assert!(v(&text, "process_cpu_seconds_total") > 0.0);
    assert!(v(&text, "process_resident_memory_bytes") > 1e6);
    assert!(v(&text, "process_virtual_memory_bytes") >= v(&text, "process_resident_memory_bytes"));
    let fds = v(&text, "process_open_fds");
    assert!(fds >= 3.0, "{fds}");
    assert!(v(&text, "process_max_fds") >= fds);
    assert!(v(&text, "process_threads") >= 2.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = v(&text, "process_start_time_seconds");
    assert!(
        started <= now + 1.0 && started > now - 86_400.0,
        "{started} vs {now}"
    );
    assert!(v(&text, "letterbox_disk_free_bytes") > 0.0);
    assert_eq!(v(&text, "letterbox_disk_min_free_bytes"), 1000.0);

    drop(c);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// An HTTPS request with the test CA; the status line and the body.
async fn https_request(
    at: std::net::SocketAddr,
    ca_pem: &str,
    request: &str,
) -> std::io::Result<(String, String)> {
    let (head, body) = https_exchange(at, ca_pem, request).await?;
    Ok((head.lines().next().unwrap_or_default().to_string(), body))
}

/// An HTTPS request with the test CA; the answer's head (status line and
/// headers) and body.
pub(crate) async fn https_exchange(
    at: std::net::SocketAddr,
    ca_pem: &str,
    request: &str,
) -> std::io::Result<(String, String)> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(at).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = connector.connect(name, tcp).await?;
    s.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    // The server may close without a TLS close_notify.
    let _ = s.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Ok((head.to_string(), body.to_string()))
}

fn get_metrics(token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
}

/// With TLS on, the metrics endpoint and the REST facade serve HTTPS with
/// the server's certificate (a silent client does not hold up the
/// handshakes of others), and a metrics token is required when set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_serves_tls_and_requires_its_token() {
    const TOKEN: &str = "scrape-token-7c1e";
    let pki = crate::security::pki();
    let (cert, key) = (pki.server_cert.clone(), pki.server_key.clone());
    let WithMetrics {
        metrics,
        anypoint,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(move |c| {
        c.tls = Some(letterbox::server::TlsConfig {
            cert_pem: cert.into_bytes(),
            key_pem: key.into_bytes(),
            client_ca_pem: None,
            require_client_cert: false,
        });
        c.metrics_token = Some(TOKEN.into());
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.limits.handshake_timeout = Duration::from_secs(30);
    })
    .await;
    // A client that connects and says nothing does not hold up the
    // handshakes of others until its own handshake times out.
    let silent = tokio::net::TcpStream::connect(metrics).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(5),
        https_request(metrics, &pki.ca_pem, &get_metrics(None)),
    )
    .await
    .expect("answered while another handshake waits")
    .unwrap();
    assert!(status.contains("401"), "{status}");
    assert!(!body.contains("letterbox_"), "{body}");
    let (status, _) = https_request(metrics, &pki.ca_pem, &get_metrics(Some("wrong-token")))
        .await
        .unwrap();
    assert!(status.contains("401"), "{status}");
    let (status, body) = https_request(metrics, &pki.ca_pem, &get_metrics(Some(TOKEN)))
        .await
        .unwrap();
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("letterbox_connections_open"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    // Plain HTTP gets no answer from a TLS listener.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
        s.write_all(get_metrics(Some(TOKEN)).as_bytes())
            .await
            .unwrap();
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut raw)).await;
        assert!(
            !String::from_utf8_lossy(&raw).contains("letterbox_"),
            "no metrics over plain HTTP"
        );
    }
    // The REST facade too.
    let rest = anypoint.unwrap();
    let (status, _) = https_request(
        rest,
        &pki.ca_pem,
        "GET /api/v1/organizations/o/environments/e/destinations/q/messages HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    drop(silent);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// The metric names a PromQL expression reads (`letterbox_*`,
/// `process_*`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for ch in expr.chars().chain(std::iter::once(' ')) {
        if ch.is_ascii_alphanumeric() || ch == '_' || ch == ':' {
            word.push(ch);
        } else {
            if word.starts_with("letterbox_") || word.starts_with("process_") {
                out.push(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    out
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// docs/grafana/letterbox.json is a Grafana dashboard whose queries read
/// only metrics that a running server exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_reads_only_exported_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/letterbox.json");
    let text = std::fs::read_to_string(path).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 30));
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));
    let vars = dash["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no ${name} variable"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    let queue = var("queue");
    assert_eq!(queue["type"], "query");
    let q = &queue["query"];
    let q = q["query"].as_str().or(q.as_str()).unwrap();
    assert_eq!(q, "label_values(letterbox_queue_ready, queue)");
    let panels = dash["panels"].as_array().unwrap();
    let mut exprs = Vec::new();
    for p in panels {
        if p["type"] == "row" {
            continue;
        }
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{p}"));
        assert!(!targets.is_empty(), "{p}");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{p}");
        assert!(p["gridPos"]["w"].as_u64().is_some(), "{p}");
        collect_exprs(p, &mut exprs);
    }
    let names: std::collections::BTreeSet<String> =
        exprs.iter().flat_map(|e| metric_names(e)).collect();
    for wanted in [
        "letterbox_queues_ready",
        "letterbox_queues_oldest_ready_age_seconds",
        "letterbox_queues_published_total",
        "letterbox_queues_dead_letter_messages",
        "letterbox_queue_ready",
        "letterbox_queue_oldest_ready_age_seconds",
        "letterbox_commit_seconds_bucket",
        "letterbox_grpc_requests_total",
        "process_resident_memory_bytes",
        "letterbox_disk_free_bytes",
    ] {
        assert!(names.contains(wanted), "the dashboard shows {wanted}");
    }

    // A server with some of everything to show.
    let WithMetrics {
        addr,
        metrics,
        stop,
        task,
        _dir,
        ..
    } = with_metrics(|_| {}).await;
    let mut c = crate::harness::connect(addr).await;
    c.create("jobs-dlq", crate::harness::config()).await;
    c.create("jobs", crate::harness::with_dlq("jobs-dlq", 1))
        .await;
    c.publish("jobs", &["a"]).await;
    let got = c.receive("jobs", 1).await;
    c.nack(&got[0].ack_token, "broken").await;
    let (_, totals) = http_get(metrics, "/metrics").await;
    let (_, per_queue) = http_get(metrics, "/metrics/per-queue").await;
    let scrape = format!("{totals}{per_queue}");
    let exported: std::collections::BTreeSet<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let unknown: Vec<&String> = names
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard reads metrics the server does not export: {unknown:?}"
    );
    drop(c);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}
