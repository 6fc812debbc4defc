//! `letterbox verify`: the offline check of a data directory.

use std::path::Path;
use std::process::Command;

use letterbox::pb;
use letterbox::queue::model::QueueKind;
use letterbox::queue::verify::{VerifyOptions, verify};
use letterbox::storage::records::{GroupRecord, MetaRecord, PayloadRecord, QueueRecord};
use letterbox::storage::{Store, StoreOptions, Txn};

use crate::harness::*;

fn run_verify(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_letterbox"))
        .arg("verify")
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("run verify");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn a_sound_directory_passes_and_a_running_server_is_not_disturbed() {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("dlq", config()).await;
    c.create("q", with_dlq("dlq", 1)).await;
    c.create(
        "f",
        pb::QueueConfig {
            kind: pb::QueueKind::Fifo as i32,
            ..config()
        },
    )
    .await;
    c.publish("q", &["a", "b", "c", "d"]).await;
    c.msg
        .publish(pb::PublishRequest {
            queue: "f".into(),
            messages: vec![pb::PublishMessage {
                body: "x".into(),
                group_id: "g".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let got = c.receive("q", 3).await;
    c.ack(&[&got[0].ack_token]).await;
    c.nack(&got[1].ack_token, "to the DLQ").await;
    // got[2] stays leased.
    let (code, out) = run_verify(&s.data_dir());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("in use by another letterbox process"), "{out}");
    s.kill();
    // After a kill (log records not yet in the database) and after a
    // clean stop.
    let (code, out) = run_verify(&s.data_dir());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok: no damage"), "{out}");
    assert!(out.contains("messages"), "{out}");
    s.restart().await;
    assert!(s.stop().await.success());
    let (code, out) = run_verify(&s.data_dir());
    assert_eq!(code, 0, "{out}");
    // verify modified nothing: the server starts and has everything.
    s.restart().await;
    let mut c = s.clients().await;
    assert_eq!(c.stats("q").await.total, 2);
    assert_eq!(c.stats("dlq").await.total, 1);
}

#[tokio::test]
async fn damaged_log_records_and_payloads_are_reported() {
    let mut s = TestServer::start_with(&["--checkpoint-interval", "1h"]).await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    for i in 0..20 {
        c.publish("q", &[&format!("message number {i}")]).await;
    }
    assert!(s.stop().await.success());
    // Damage the body of the first message in the log.
    let wal = s.data_dir().join("wal");
    let mut segs: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segs.sort();
    let mut found = false;
    for seg in &segs {
        let mut data = std::fs::read(seg).unwrap();
        if let Some(at) = data.windows(16).position(|w| w == b"message number 0") {
            data[at + 8] ^= 0x20;
            std::fs::write(seg, &data).unwrap();
            found = true;
            break;
        }
    }
    assert!(found, "the body is in the log");
    let (code, out) = run_verify(&s.data_dir());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("checksum"), "{out}");
    assert!(out.contains("payload"), "{out}");
}

#[tokio::test]
async fn inconsistent_records_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let opts = StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let (store, _) = Store::open(&data, opts.clone()).unwrap();
    let meta = |pid: u64, size: u32| MetaRecord {
        pid,
        message_id: format!("m{pid}"),
        client_id: false,
        enqueued_at: 1,
        expires_at: u64::MAX,
        visible_at: 0,
        delivery_count: 1,
        failed_attempts: 2,
        lease: None,
        first_delivered_at: 0,
        attempts: Vec::new(),
        dead_letters: Vec::new(),
        group: None,
        size,
        own_ttl: false,
    };
    let mut txn = Txn::new();
    txn.put_queue(
        "q",
        &QueueRecord {
            qid: 7,
            created_at: 0,
            kind: QueueKind::Standard.code(),
            message_ttl: 60_000,
            ack_timeout: 1000,
            delivery_delay: 0,
            dead_letter: Some(("gone".into(), 3)),
            retry_backoff: None,
            dead_letter_on_expiry: false,
            max_length: None,
            max_lease_total: 60_000,
            dedup_window: 0,
            on_poison: 1,
            content_based_dedup: false,
        },
    );
    // A message with its payload (and a group, on a standard queue); a
    // message without one; a payload without a message; no counters; a
    // DLQ that does not exist; a group record of the standard queue.
    txn.put_meta(
        7,
        1,
        &MetaRecord {
            group: Some("g".into()),
            ..meta(1, 3)
        },
    );
    txn.put_group(
        7,
        "g",
        &GroupRecord {
            parked_at: 1,
            reason: "test".into(),
        },
    );
    txn.put_payload(
        1,
        letterbox::storage::encode_payload(&PayloadRecord::new(0, Vec::new(), "abc".into())),
    );
    txn.put_meta(7, 2, &meta(2, 3));
    txn.put_payload(
        3,
        letterbox::storage::encode_payload(&PayloadRecord::new(0, Vec::new(), "xyz".into())),
    );
    store.submit(txn).wait().await.unwrap();
    store.close().unwrap();
    // Other tests of this process spawn servers: a child between its fork
    // and its exec holds a copy of every open descriptor, the lock file's
    // included, for a moment.
    let mut tries = 0;
    let report = loop {
        match verify(&data, &VerifyOptions::default()) {
            Err(letterbox::storage::StorageError::Locked { .. }) if tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => break r.unwrap(),
        }
    };
    let text = report.problems.join("\n");
    assert!(text.contains("payload 2 is missing"), "{text}");
    assert!(
        text.contains("2 failed attempts but only 1 deliveries"),
        "{text}"
    );
    assert!(text.contains("1 payload(s) belong to no message"), "{text}");
    assert!(
        text.contains("holds 2 messages, but its counters say 0"),
        "{text}"
    );
    assert!(text.contains("\"gone\" does not exist"), "{text}");
    assert!(
        text.contains("message m1 (7/1): has a group but its queue is not FIFO"),
        "{text}"
    );
    assert!(
        text.contains("group \"g\" stored for the standard queue \"q\""),
        "{text}"
    );
    assert!(!report.is_sound());
    // The same through the command.
    let (code, out) = run_verify(&data);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("problem(s) found"), "{out}");
}

#[tokio::test]
async fn a_directory_that_is_not_a_data_directory_cannot_be_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let (code, out) = run_verify(dir.path());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("FORMAT"), "{out}");
    assert!(!dir.path().join("LOCK").exists(), "nothing created");
}

/// The log segments of a data directory, in order.
fn wal_segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segs.sort();
    segs
}

/// The segment `CHECKPOINT`'s `log` line names (where the log goes on),
/// and its path.
fn checkpoint_log_segment(dir: &Path) -> (u64, std::path::PathBuf) {
    let text = std::fs::read_to_string(dir.join("CHECKPOINT")).unwrap();
    let number: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("log "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    (number, dir.join("wal").join(format!("{number:020}.wal")))
}

/// Overwrites a file with zeros, keeping its size.
fn zero_file(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    std::fs::write(path, vec![0u8; usize::try_from(len).unwrap()]).unwrap();
}

/// A server killed with 400 acknowledged publishes of 1 KiB spread over
/// several 64 KiB log segments, with a checkpoint taken part way.
async fn killed_with_segments() -> (TestServer, Vec<String>) {
    let mut s = TestServer::start_with(&[
        "--wal-segment-size",
        "64KiB",
        "--checkpoint-interval",
        "1h",
        "--checkpoint-bytes",
        "128KiB",
    ])
    .await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let body = "x".repeat(1000);
    let mut ids = Vec::new();
    for _ in 0..400 {
        ids.extend(c.publish("q", &[body.as_str()]).await);
    }
    s.kill();
    (s, ids)
}

/// Starting refuses naming `needle`; verify reports it too, and the
/// directory is left as it was.
fn assert_refused(s: &TestServer, needle: &str) {
    let log = s.data_dir().with_file_name("refused.log");
    let err = spawn(&s.data_dir(), &log, &[]).expect_err("the start is refused");
    assert!(err.contains(needle), "start: {err}");
    let (code, out) = run_verify(&s.data_dir());
    assert_eq!(code, 1, "verify: {out}");
    assert!(out.contains(needle), "verify: {out}");
}

#[tokio::test]
async fn a_deleted_log_is_refused_not_started_empty() {
    let (s, _) = killed_with_segments().await;
    for seg in wal_segments(&s.data_dir()) {
        std::fs::remove_file(seg).unwrap();
    }
    assert_refused(&s, "is missing");
}

#[tokio::test]
async fn a_segment_missing_between_two_is_refused() {
    let (s, _) = killed_with_segments().await;
    let segs = wal_segments(&s.data_dir());
    assert!(segs.len() >= 4, "{segs:?}");
    let victim = &segs[segs.len() - 3];
    std::fs::remove_file(victim).unwrap();
    let name = victim.file_name().unwrap().to_string_lossy().into_owned();
    assert_refused(&s, &name);
}

#[tokio::test]
async fn a_zeroed_segment_is_refused() {
    let (s, _) = killed_with_segments().await;
    // The segment the last checkpoint says the log goes on in (it held
    // records then): zero it whole.
    let (_, first) = checkpoint_log_segment(&s.data_dir());
    zero_file(&first);
    let name = first.file_name().unwrap().to_string_lossy().into_owned();
    assert_refused(&s, &name);
}

/// A segment kept only for the message bodies that point into it, zeroed:
/// verify reports the bodies; a start serves the other messages and sets
/// the damaged ones aside instead of delivering them.
#[tokio::test]
async fn a_zeroed_segment_of_bodies_is_reported() {
    let (mut s, ids) = killed_with_segments().await;
    // A start keeps the segments that bodies point into (pinned) and
    // begins the log in a new one after them.
    s.restart().await;
    assert!(s.stop().await.success());
    let (number, _) = checkpoint_log_segment(&s.data_dir());
    let segs = wal_segments(&s.data_dir());
    let pinned = segs
        .iter()
        .find(|p| {
            let n: u64 = p.file_stem().unwrap().to_str().unwrap().parse().unwrap();
            n < number
        })
        .expect("a segment before the log's, kept for its bodies")
        .clone();
    zero_file(&pinned);
    let (code, out) = run_verify(&s.data_dir());
    assert_eq!(code, 1, "verify: {out}");
    s.restart().await;
    let mut c = s.clients().await;
    let got = c.receive("q", 1000).await;
    assert!(!got.is_empty() && got.len() < ids.len(), "{}", got.len());
    let st = c.stats("q").await;
    assert_eq!(st.in_flight, got.len() as u64);
    assert_eq!(
        st.total - st.in_flight,
        (ids.len() - got.len()) as u64,
        "the damaged ones are set aside, not lost"
    );
}

#[tokio::test]
async fn a_truncated_segment_is_refused() {
    let (s, _) = killed_with_segments().await;
    // The last segment `CHECKPOINT` lists with its size (the log moved
    // into it before the checkpoint, or was noted since).
    let text = std::fs::read_to_string(s.data_dir().join("CHECKPOINT")).unwrap();
    let number: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sizes "))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|p| p.split_once(':'))
        .unwrap()
        .0
        .parse()
        .unwrap();
    let current = s.data_dir().join("wal").join(format!("{number:020}.wal"));
    let len = std::fs::metadata(&current).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&current)
        .unwrap();
    f.set_len(len / 2).unwrap();
    let name = current.file_name().unwrap().to_string_lossy().into_owned();
    assert_refused(&s, &name);
}
