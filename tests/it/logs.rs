//! The server's logs as an operator reads them: plain text when they go
//! to a file or a pipe, warnings that name their cause and the fix.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::TestServer;

#[tokio::test]
async fn logs_to_a_file_carry_no_colour_codes() {
    let server = TestServer::start().await;
    let log = server.log();
    assert!(log.contains("serving gRPC"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in a log file:\n{log}"
    );
}

/// `letterbox serve --store URL` with whatever else, standard error to a
/// file; the command and the file.
fn serve_store(url: &str, extra: &[&str]) -> (Command, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_letterbox"));
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        url,
        "--node-name",
        "n",
    ])
    .arg("--data-dir")
    .arg(dir.path().join("data"))
    .args(extra)
    .env("LETTERBOX_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    (c, dir)
}

#[test]
fn an_unreachable_postgresql_is_named_with_its_cause() {
    for (url, cause) in [
        (
            "postgres://letterbox@127.0.0.1:1/letterbox",
            "connection refused at 127.0.0.1:1: no PostgreSQL listens there",
        ),
        (
            "postgres://letterbox@no-such-host.invalid/letterbox",
            "the host name \"no-such-host.invalid\" does not resolve (DNS)",
        ),
    ] {
        let (mut c, _dir) = serve_store(url, &[]);
        let out = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("cannot reach PostgreSQL at"), "{stderr}");
        assert!(stderr.contains(cause), "{url}: {stderr}");
    }
}

/// A standby that cannot reach PostgreSQL says why as it waits.
#[test]
fn a_standby_names_why_postgresql_is_unreachable() {
    let (mut c, dir) = serve_store(
        "postgres://letterbox@127.0.0.1:1/letterbox",
        &["--standby", "--lease-ttl", "1s"],
    );
    let log = dir.path().join("server.log");
    let mut child = c
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("standby: cannot reach PostgreSQL") || Instant::now() > until {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.contains("standby: cannot reach PostgreSQL (connection refused at 127.0.0.1:1: no PostgreSQL listens there (is it running, on that port?)); trying again in"),
        "{text}"
    );
}
