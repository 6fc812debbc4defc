//! `index-memory` end to end: fills a small queue, opens it again and
//! reports the heap per message of the store and of the engine's indexes.

use std::process::Command;

#[test]
fn index_memory_reports_the_store_and_the_engine_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_index-memory"))
        .args(["--messages", "3000", "--size", "100", "--batch", "500"])
        .arg("--dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("run index-memory");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "index-memory failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| 3000 |"))
        .unwrap_or_else(|| panic!("no row for 3000 messages in:\n{stdout}"));
    let per_msg: Vec<f64> = row
        .split('|')
        .filter_map(|c| c.trim().strip_suffix(" B/msg"))
        .map(|v| v.parse().expect("a number"))
        .collect();
    let [store, engine, both] = per_msg[..] else {
        panic!("expected three B/msg figures in {row:?}");
    };
    // Every queued message has at least its entry in the position map
    // (32 bytes, its key 8, and its share of the B-tree's nodes) in the engine,
    // and its records' keys in sled.
    assert!(engine >= 48.0, "engine {engine} B/msg in {row:?}");
    assert!(store > 0.0, "store {store} B/msg in {row:?}");
    assert!((store + engine - both).abs() < 0.2, "{row:?}");
}

#[test]
fn index_memory_refuses_to_wipe_a_foreign_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keep = dir.path().join("keep.txt");
    std::fs::write(&keep, "mine").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_index-memory"))
        .args(["--messages", "10"])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("run index-memory");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to wipe"), "{stderr}");
    assert!(keep.exists(), "the foreign file was removed");
}
