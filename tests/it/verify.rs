//! `letterbox verify`: the offline check of a data directory.

use std::path::Path;
use std::process::Command;

use letterbox::pb;
use letterbox::storage::records::{MetaRecord, PayloadRecord, QueueRecord};
use letterbox::storage::verify::{VerifyOptions, verify};
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
        delivery_count: 2,
        leases: 1,
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
            kind: 1,
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
    // A message with its payload; a message without one; a payload
    // without a message; no counters; a DLQ that does not exist.
    txn.put_meta(7, 1, &meta(1, 3));
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
        text.contains("delivery count 2 above its 1 leases"),
        "{text}"
    );
    assert!(text.contains("1 payload(s) belong to no message"), "{text}");
    assert!(
        text.contains("holds 2 messages, but its counters say 0"),
        "{text}"
    );
    assert!(text.contains("\"gone\" does not exist"), "{text}");
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
