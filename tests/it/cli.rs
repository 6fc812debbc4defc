//! The command-line client end to end, `--json` output parsed.

use std::process::{Command, Output};

use serde_json::Value;

use crate::harness::*;

fn run(s: &TestServer, args: &[&str]) -> Output {
    letterbox()
        .env("LETTERBOX_SERVER", format!("http://{}", s.addr))
        .args(args)
        .output()
        .expect("run letterbox")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
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
    // The list shows each queue's depth.
    let list = json(&run(&s, &["queue", "list", "--json"]));
    assert_eq!(list[0]["name"], "orders");
    assert_eq!(list[0]["stats"]["total"], 1200, "{list}");
    assert_eq!(list[1]["stats"]["total"], 1, "{list}");
    let table = String::from_utf8_lossy(&run(&s, &["queue", "list"]).stdout).into_owned();
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        &header[..5],
        ["NAME", "KIND", "READY", "IN FLIGHT", "TOTAL"],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("orders.dlq"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..5],
        ["orders.dlq", "STANDARD", "1", "0", "1"],
        "{table}"
    );

    // A redrive back into orders, counted on both sides, as the console
    // counts it.
    assert!(run(&s, &["dlq", "redrive", "orders.dlq"]).status.success());
    let out = json(&run(&s, &["queue", "stats", "orders.dlq", "--json"]));
    assert_eq!(out["redriven"], 1, "{out}");
    let st = json(&run(&s, &["queue", "stats", "orders", "--json"]));
    assert_eq!(st["redrive_received"], 1, "{st}");
    let text = String::from_utf8_lossy(&run(&s, &["queue", "stats", "orders"]).stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("redriven in") && l.ends_with(" 1")),
        "{text}"
    );

    let purged = json(&run(&s, &["queue", "purge", "orders", "--json"]));
    assert_eq!(purged["messages_deleted"], 1201);

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
    let unreachable = letterbox()
        .args(["queue", "list", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(3));
}

#[tokio::test]
async fn connection_errors_name_the_address_and_the_cause() {
    let err = |args: &[&str]| {
        let out = letterbox().args(args).output().unwrap();
        let text = stderr(&out);
        // Words, never Rust debug text.
        assert!(!text.contains("Os {") && !text.contains("kind:"), "{text}");
        (out.status.code(), text)
    };
    let (code, text) = err(&["queue", "list", "--server", "http://127.0.0.1:1"]);
    assert_eq!(code, Some(3));
    assert!(text.contains("connection refused at 127.0.0.1:1"), "{text}");
    let (code, text) = err(&["queue", "list", "--server", "127.0.0.1:50051"]);
    assert_eq!(code, Some(2));
    assert!(
        text.contains("has no scheme: write http://127.0.0.1:50051"),
        "{text}"
    );
    let (code, text) = err(&["queue", "list", "--server", "http://no-such-host.invalid:5"]);
    assert_eq!(code, Some(3));
    assert!(
        text.contains("cannot resolve the host name \"no-such-host.invalid\""),
        "{text}"
    );

    // A TLS server that wants client certificates.
    let dir = tempfile::tempdir().unwrap();
    let pki = crate::security::pki();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let ca = write("ca.pem", &pki.ca_pem);
    let cert = write("server.pem", &pki.server_cert);
    let key = write("server.key", &pki.server_key);
    let client_cert = write("client.pem", &pki.client_cert);
    let client_key = write("client.key", &pki.client_key);
    let s = TestServer::start_with(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
        "--tls-require-client-cert",
    ])
    .await;
    let https = format!("https://localhost:{}", s.addr.port());
    let http = format!("http://{}", s.addr);
    let (code, text) = err(&["queue", "list", "--server", &http]);
    assert_eq!(code, Some(3));
    assert!(
        text.contains("closed the connection before answering: if it serves TLS, use https://"),
        "{text}"
    );
    let (code, text) = err(&["queue", "list", "--server", &https]);
    assert_eq!(code, Some(3));
    assert!(text.contains("is not trusted"), "{text}");
    assert!(text.contains("--ca-cert"), "{text}");
    let (code, text) = err(&["queue", "list", "--server", &https, "--ca-cert", &ca]);
    assert_eq!(code, Some(3));
    assert!(text.contains("client certificate"), "{text}");
    assert!(text.contains("--client-cert"), "{text}");
    let ok = letterbox()
        .args(["queue", "list", "--server", &https, "--ca-cert", &ca])
        .args(["--client-cert", &client_cert, "--client-key", &client_key])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", stderr(&ok));

    // A plain-text server asked for TLS.
    let plain = TestServer::start().await;
    let (code, text) = err(&[
        "queue",
        "list",
        "--server",
        &format!("https://localhost:{}", plain.addr.port()),
        "--ca-cert",
        &ca,
    ]);
    assert_eq!(code, Some(3));
    assert!(text.contains("does not speak TLS: use http://"), "{text}");
}

#[tokio::test]
async fn contexts_keep_the_server_and_credentials() {
    let s = TestServer::start().await;
    let home = tempfile::tempdir().unwrap();
    let ctx = |args: &[&str]| {
        letterbox()
            .env("LETTERBOX_CONFIG_HOME", home.path())
            .args(args)
            .output()
            .unwrap()
    };
    let addr = format!("http://{}", s.addr);
    // No context: the default address, where nothing listens here.
    let out = ctx(&["context", "ls"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no contexts"));
    let out = ctx(&[
        "context", "add", "local", "--server", &addr, "--token", "s3cret",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("selected"));
    let file = home.path().join("contexts/local.json");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The selected context's server is used (authentication is off: the
    // token is sent and ignored).
    let out = ctx(&["queue", "create", "via-context"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A second context, not selected; --context picks it; a flag wins.
    let out = ctx(&["context", "add", "dead", "--server", "http://127.0.0.1:1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        ctx(&["queue", "list", "--context", "dead"]).status.code(),
        Some(3)
    );
    let out = ctx(&[
        "queue",
        "list",
        "--context",
        "dead",
        "--server",
        &addr,
        "--json",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("via-context"));
    // ls marks the selected one; show masks secrets.
    let out = ctx(&["context", "ls"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("* local"), "{text}");
    assert!(text.contains("  dead"), "{text}");
    let out = ctx(&["context", "show", "local", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["token"], "********");
    assert_eq!(doc["server"], addr.as_str());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cret"));
    // use switches; rm of the selected one leaves none selected.
    assert!(ctx(&["context", "use", "dead"]).status.success());
    assert_eq!(ctx(&["queue", "list"]).status.code(), Some(3));
    assert!(ctx(&["context", "rm", "dead"]).status.success());
    let out = ctx(&["context", "use", "dead"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no context named \"dead\""),
        "{}",
        stderr(&out)
    );
    // Bad names and addresses are refused before anything is written.
    let out = ctx(&["context", "add", "../x", "--server", &addr]);
    assert_eq!(out.status.code(), Some(2));
    let out = ctx(&["context", "add", "x", "--server", "localhost:1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("has no scheme"), "{}", stderr(&out));
    assert!(!home.path().join("contexts/x.json").exists());
}

#[test]
fn serve_help_shows_server_flags_only_and_docs_are_generated() {
    let help = letterbox().args(["serve", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("--data-dir"), "{text}");
    for client_flag in [
        "--server ",
        "--token",
        "--ca-cert",
        "--client-id",
        "--context",
    ] {
        assert!(
            !text.contains(client_flag),
            "serve --help lists {client_flag}:\n{text}"
        );
    }
    let help = letterbox().args(["consume", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--ca-cert"));
    for shell in ["bash", "zsh", "fish"] {
        let out = letterbox().args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("letterbox") && script.contains("redrive"),
            "{shell}"
        );
    }
    let page = letterbox().arg("man").output().unwrap();
    let text = String::from_utf8_lossy(&page.stdout);
    assert!(text.contains(".TH letterbox 1"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let out = letterbox()
        .args(["man", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(dir.path().join("letterbox-dlq-redrive.1").exists());
}

#[tokio::test]
async fn nack_and_reject_without_a_dlq_stop_with_the_reason() {
    let s = TestServer::start().await;
    assert!(run(&s, &["queue", "create", "plain"]).status.success());
    assert!(run(&s, &["publish", "plain", "one"]).status.success());
    // --reject: refused before anything is leased.
    let out = run(&s, &["consume", "plain", "--reject"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("has no dead letter queue"),
        "{}",
        stderr(&out)
    );
    let stats = json(&run(&s, &["queue", "stats", "plain", "--json"]));
    assert_eq!(stats["ready"], 1, "{stats}");
    assert_eq!(stats["in_flight"], 0, "{stats}");
    // --nack: stops once the message was delivered --max-deliveries times.
    let out = run(
        &s,
        &[
            "consume",
            "plain",
            "--nack",
            "--max-deliveries",
            "3",
            "--wait",
            "200ms",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("was delivered 3 times and nacked each time"),
        "{text}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 3);
    // One message nacked three times: one message, three deliveries.
    assert!(
        text.contains("nacked 1 message(s) in 3 deliveries"),
        "{text}"
    );
    // --count still bounds it exactly.
    let out = run(
        &s,
        &[
            "consume", "plain", "--nack", "--count", "5", "--wait", "200ms",
        ],
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5);
}

/// `consume --max-per-group N` caps the messages of one FIFO group per
/// receive; a value out of range is a usage error naming the flag, and
/// leases nothing.
#[tokio::test]
async fn consume_caps_the_messages_of_one_group_per_receive() {
    let s = TestServer::start().await;
    assert!(
        run(&s, &["queue", "create", "orders", "--fifo"])
            .status
            .success()
    );
    for group in ["a", "b"] {
        let bodies: Vec<String> = (1..=3).map(|i| format!("{group}{i}")).collect();
        let mut args = vec!["publish", "orders", "--group", group];
        args.extend(bodies.iter().map(String::as_str));
        assert!(run(&s, &args).status.success());
    }
    for bad in ["0", "1001", "two"] {
        let out = run(&s, &["consume", "orders", "--max-per-group", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(
            text.contains("--max-per-group") && text.contains(bad),
            "{bad}: {text}"
        );
    }
    let stats = json(&run(&s, &["queue", "stats", "orders", "--json"]));
    assert_eq!(
        (stats["ready"].as_u64(), stats["in_flight"].as_u64()),
        (Some(6), Some(0))
    );
    let bodies = |out: &Output| -> Vec<String> {
        assert!(out.status.success(), "{}", stderr(out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["body"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    // One receive of 2: one message of each group.
    let out = run(
        &s,
        &[
            "consume",
            "orders",
            "--count",
            "2",
            "--max-per-group",
            "1",
            "--json",
        ],
    );
    assert_eq!(bodies(&out), ["a1", "b1"]);
    // Without the cap, a group's consecutive messages come together.
    let out = run(&s, &["consume", "orders", "--count", "2", "--json"]);
    assert_eq!(bodies(&out), ["a2", "a3"]);
}

#[tokio::test]
async fn durations_and_times_round_trip() {
    let s = TestServer::start().await;
    let created = run(
        &s,
        &[
            "queue",
            "create",
            "rt",
            "--ttl",
            "7d",
            "--ack-timeout",
            "1h30m",
            "--backoff",
            "1s,1m,2",
        ],
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let shown = String::from_utf8_lossy(&run(&s, &["queue", "get", "rt"]).stdout).into_owned();
    assert!(shown.contains("7d"), "{shown}");
    assert!(shown.contains("90m"), "{shown}");
    assert!(shown.contains("1s,1m,2"), "{shown}");
    // What it printed, it takes back.
    let again = run(
        &s,
        &[
            "queue",
            "update",
            "rt",
            "--ttl",
            "7d",
            "--ack-timeout",
            "90m",
            "--backoff",
            "1s,1m,2",
        ],
    );
    assert!(again.status.success(), "{}", stderr(&again));
    // Redrive windows: relative, RFC 3339, epoch ms; a bad one named.
    assert!(run(&s, &["queue", "create", "plain"]).status.success());
    assert!(run(&s, &["publish", "plain", "a", "b"]).status.success());
    for since in ["-1h", "2020-01-01T00:00:00Z", "1577836800000"] {
        let out = run(
            &s,
            &["dlq", "redrive", "plain", "--since", since, "--dry-run"],
        );
        assert!(out.status.success(), "{since}: {}", stderr(&out));
    }
    let out = run(&s, &["dlq", "redrive", "plain", "--since", "yesterday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("RFC 3339"), "{}", stderr(&out));
    // A queue that is no DLQ: the skip is explained.
    let out = run(&s, &["dlq", "redrive", "plain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2 never dead-lettered"), "{text}");
    assert!(
        text.contains("is not the dead letter queue of any queue"),
        "{text}"
    );
    let doc = json(&run(&s, &["dlq", "redrive", "plain", "--json"]));
    assert_eq!(doc["skipped_no_source"], 2, "{doc}");
    assert_eq!(doc["is_dead_letter_queue"], false, "{doc}");
}

/// The first `sh` block of a README section, and the `text` block after it.
fn readme_blocks(section: &str) -> (String, String) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find(section).expect("section");
    let rest = &readme[start..];
    let block = |fence: &str, from: usize| {
        let open = rest[from..].find(fence).expect(fence) + from + fence.len();
        let close = rest[open..].find("\n```").expect("closing fence") + open;
        (
            rest[open..close].trim_start_matches('\n').to_string(),
            close,
        )
    };
    let (sh, end) = block("```sh", 0);
    let (text, _) = block("```text", end);
    (sh, text)
}

/// Message ids (26 characters of Crockford base32) made alike.
fn without_ids(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            line.split("  ")
                .map(|cell| {
                    if cell.len() == 26 && cell.chars().all(|c| c.is_ascii_alphanumeric()) {
                        "<id>"
                    } else {
                        cell
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn the_readme_cli_walkthrough_runs_as_printed() {
    let s = TestServer::start().await;
    let (script, shown) = readme_blocks("## The letterbox command");
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_letterbox"),
        bin.path().join("letterbox"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let addr = format!("http://{}", s.addr);
    let out = tokio::task::spawn_blocking(move || {
        letterbox_free_command("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .env("PATH", path)
            .env("LETTERBOX_SERVER", addr)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    // Every line the README shows is what the commands print (ids aside).
    let printed = without_ids(&stdout);
    for line in without_ids(&shown).lines() {
        assert!(
            printed.contains(line),
            "README line not printed: {line:?}\n{stdout}"
        );
    }
    // And the redriven messages were consumed in the end.
    assert!(
        stderr(&out).contains("acked 2 message(s)"),
        "{}",
        stderr(&out)
    );
    let stats = json(&run(&s, &["queue", "stats", "orders", "--json"]));
    assert_eq!(stats["total"], 0, "{stats}");
}

/// A command with no profile of the user's own in the way.
fn letterbox_free_command(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env("LETTERBOX_CONFIG_HOME", "/nonexistent/letterbox-config")
        .env_remove("LETTERBOX_CONTEXT")
        .env_remove("LETTERBOX_TOKEN");
    c
}

/// Errors of the command line speak its language: the flag and its
/// units, never the API's field, its milliseconds or Rust debug text.
#[tokio::test]
async fn errors_name_the_flag_and_its_units() {
    let s = TestServer::start().await;
    let no_debug = |text: &str| {
        for debug in ["Some(", "None", "DeadLetterPolicy", "config.", "_ms"] {
            assert!(!text.contains(debug), "{debug:?} in: {text}");
        }
    };
    let out = run(&s, &["queue", "create", "orders", "--ttl", "10s"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim_end(),
        "letterbox: `--ttl` must be between 1m and 14d (got 10s)"
    );
    // Nothing was created.
    assert_eq!(run(&s, &["queue", "get", "orders"]).status.code(), Some(1));

    let out = run(&s, &["queue", "create", "orders", "--ack-timeout", "500ms"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`--ack-timeout` must be between 1s and 12h (got 500ms)"),
        "{}",
        stderr(&out)
    );
    assert!(run(&s, &["queue", "create", "orders.dlq"]).status.success());
    let created = run(
        &s,
        &[
            "queue",
            "create",
            "orders",
            "--dlq",
            "orders.dlq",
            "--max-deliveries",
            "5",
            "--ttl",
            "1h",
        ],
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let out = run(&s, &["queue", "update", "orders", "--backoff", "1m,1s,2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`--backoff MAX` must be between 1m and 15m (got 1m,1s,2)"),
        "{}",
        stderr(&out)
    );

    // Created again with other flags: which settings differ, as flags.
    let out = run(
        &s,
        &[
            "queue",
            "create",
            "orders",
            "--dlq",
            "orders.dlq",
            "--ttl",
            "2h",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    no_debug(&text);
    assert!(
        text.contains("queue \"orders\" already exists with other settings: the queue has --ttl 1h, this command --ttl 2h; the queue has --dlq orders.dlq --max-deliveries 5, this command --dlq orders.dlq"),
        "{text}"
    );
    let out = run(&s, &["queue", "create", "orders", "--fifo"]);
    let text = stderr(&out);
    no_debug(&text);
    assert!(
        text.contains("the queue has no --fifo, this command --fifo; the queue has --ttl 1h, this command no --ttl (the default)"),
        "{text}"
    );
    // The same flags again: a no-op.
    let again = run(
        &s,
        &[
            "queue",
            "create",
            "orders",
            "--dlq",
            "orders.dlq",
            "--max-deliveries",
            "5",
            "--ttl",
            "1h",
        ],
    );
    assert!(again.status.success(), "{}", stderr(&again));

    let out = run(&s, &["publish", "orders", "a", "--delay", "1h"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`--delay` must be between 0ms and 15m (got 1h)"),
        "{}",
        stderr(&out)
    );
    let out = run(&s, &["consume", "orders", "--ack-timeout", "100ms"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`--ack-timeout` must be between 1s and 12h (got 100ms)"),
        "{}",
        stderr(&out)
    );
}

/// `publish` without what to publish is told so before any connection is
/// tried: no server listens where it points, yet it is a usage error.
#[test]
fn publish_reports_usage_before_connecting() {
    let nowhere = ["--server", "http://127.0.0.1:1"];
    let out = letterbox().arg("publish").args(nowhere).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Usage: letterbox publish"),
        "{}",
        stderr(&out)
    );
    let out = letterbox()
        .args(["publish", "orders"])
        .args(nowhere)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to publish: give bodies, --file or --stdin"),
        "{}",
        stderr(&out)
    );
    // With something to publish, it does connect (and finds nobody).
    let out = letterbox()
        .args(["publish", "orders", "a"])
        .args(nowhere)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

/// Every client command's help lists the connection flags under their own
/// heading, after the command's own flags; they are taken before the
/// subcommand too, where a flag after it wins; the server's commands
/// refuse them.
#[tokio::test]
async fn connection_flags_have_their_heading_and_go_before_the_subcommand() {
    let commands: &[&[&str]] = &[
        &["queue", "create"],
        &["queue", "list"],
        &["queue", "stats"],
        &["publish"],
        &["consume"],
        &["browse"],
        &["group", "list"],
        &["exchange", "bind"],
        &["dlq", "redrive"],
        &["definitions", "export"],
    ];
    for cmd in commands {
        let out = letterbox().args(*cmd).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        let (own, connection) = help
            .split_once("\nConnection:\n")
            .unwrap_or_else(|| panic!("{cmd:?}: no Connection heading:\n{help}"));
        for flag in [
            "--server",
            "--context",
            "--token",
            "--ca-cert",
            "--client-cert",
            "--json",
        ] {
            assert!(
                connection.contains(flag),
                "{cmd:?}: {flag} not under Connection:\n{help}"
            );
            assert!(
                !own.contains(&format!("{flag} ")),
                "{cmd:?}: {flag} above the heading"
            );
        }
    }
    let top = letterbox().arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    assert!(
        top.contains("Connection (client commands; also after the subcommand):"),
        "{top}"
    );

    let s = TestServer::start().await;
    let home = tempfile::tempdir().unwrap();
    let ctx = |args: &[&str]| {
        letterbox()
            .env("LETTERBOX_CONFIG_HOME", home.path())
            .args(args)
            .output()
            .unwrap()
    };
    let addr = format!("http://{}", s.addr);
    assert!(
        ctx(&["context", "add", "dead", "--server", "http://127.0.0.1:1"])
            .status
            .success()
    );
    assert!(
        ctx(&["context", "add", "prod", "--server", &addr])
            .status
            .success()
    );
    assert!(
        ctx(&["queue", "create", "here"]).status.code() == Some(3),
        "dead is selected"
    );
    let out = ctx(&["--context", "prod", "queue", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(json(&out).as_array().unwrap().is_empty());
    let out = ctx(&["--context", "prod", "--json", "queue", "create", "here"]);
    assert_eq!(json(&out)["name"], "here");
    // After the subcommand wins over before it; before it wins over the
    // variables.
    let out = ctx(&[
        "--server",
        "http://127.0.0.1:1",
        "queue",
        "list",
        "--server",
        &addr,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = letterbox()
        .env("LETTERBOX_SERVER", "http://127.0.0.1:1")
        .args(["--server", &addr, "queue", "get", "here"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Not a flag of the server's commands.
    let out = letterbox()
        .args(["--server", &addr, "serve"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--server is a connection flag of the client commands"),
        "{}",
        stderr(&out)
    );
}

/// Every manual page has EXAMPLES, EXIT STATUS and SEE ALSO, and the pages
/// of commands that read or write files a FILES section.
#[test]
fn man_pages_have_examples_exit_status_files_and_see_also() {
    let dir = tempfile::tempdir().unwrap();
    let out = letterbox()
        .args(["man", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut pages = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let page = std::fs::read_to_string(&path).unwrap();
        for section in [".SH EXAMPLES", ".SH \"EXIT STATUS\"", ".SH \"SEE ALSO\""] {
            assert!(page.contains(section), "{name}: no {section}");
        }
        let local = ["letterbox-auth", "letterbox-completions", "letterbox-man"]
            .iter()
            .any(|p| name.starts_with(p));
        assert_eq!(page.contains(".SH FILES"), !local, "{name}: FILES");
        pages += 1;
    }
    assert!(pages > 30, "{pages} pages");
    let serve = std::fs::read_to_string(dir.path().join("letterbox-serve.1")).unwrap();
    assert!(serve.contains("/etc/letterbox/letterbox.toml"), "{serve}");
    assert!(
        serve.contains("the storage failed while running"),
        "{serve}"
    );
    let create = std::fs::read_to_string(dir.path().join("letterbox-queue-create.1")).unwrap();
    assert!(create.contains("\\fBletterbox\\-queue\\fR(1)"), "{create}");
    assert!(create.contains(".SH CONNECTION"), "{create}");
}
