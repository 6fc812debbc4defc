//! `tonic-floor` driven by `loadgen --target tonic-floor`, both as the
//! binaries a user runs: the unary publisher (over two connections) and
//! the stream publisher each get every answer; a workload that needs a
//! consumer is refused.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The floor server on a free port, killed when dropped.
struct Floor {
    child: Child,
    url: String,
}

impl Floor {
    fn start() -> Floor {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tonic-floor"))
            .args(["--listen", "127.0.0.1:0", "--threads", "1"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tonic-floor");
        let mut line = String::new();
        BufReader::new(child.stderr.take().expect("stderr"))
            .read_line(&mut line)
            .expect("read its first line");
        let addr = line
            .trim()
            .strip_prefix("tonic-floor listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Floor {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// `loadgen run --target tonic-floor ARGS` with `LOADGEN_LETTERBOX_*`
    /// set from `env`; its exit status and its result line, if any.
    fn loadgen(&self, env: &[(&str, &str)], args: &[&str]) -> (bool, Option<Value>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("r.jsonl");
        let status = Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args([
                "run",
                "--target",
                "tonic-floor",
                "--letterbox-url",
                &self.url,
            ])
            .args(["--max-secs", "60", "--out", out.to_str().expect("utf-8")])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run loadgen");
        let line = std::fs::read_to_string(&out)
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
            .map(|l| serde_json::from_str(&l).expect("json line"));
        (status.success(), line)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn loadgen_publishes_to_the_floor_unary_and_over_a_stream() {
    let floor = Floor::start();
    let publish = [
        "--workload",
        "publish-durable",
        "--count",
        "300",
        "--window",
        "16",
    ];
    for (mode, conns) in [("unary", "2"), ("stream", "1")] {
        let (ok, r) = floor.loadgen(
            &[
                ("LOADGEN_LETTERBOX_PUBLISH", mode),
                ("LOADGEN_LETTERBOX_CONNECTIONS", conns),
            ],
            &publish,
        );
        let r = r.unwrap_or_else(|| panic!("{mode}: no result line"));
        assert!(ok, "{mode}: {r}");
        assert_eq!(r["target"], "tonic-floor", "{r}");
        assert_eq!(r["completed"], 300, "{mode}: {r}");
        assert_eq!(r["timed_out"], false, "{mode}: {r}");
    }
    let (ok, _) = floor.loadgen(&[], &["--workload", "consume-ack", "--count", "10"]);
    assert!(!ok, "the floor has no consumers");
    let (ok, _) = floor.loadgen(
        &[
            ("LOADGEN_LETTERBOX_PUBLISH", "unary"),
            ("LOADGEN_LETTERBOX_CONNECTIONS", "0"),
        ],
        &publish,
    );
    assert!(!ok, "0 connections is refused");
}
