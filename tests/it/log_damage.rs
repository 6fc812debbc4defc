//! Damage anywhere in the log written since the last checkpoint: a start
//! refuses it, naming the file and the offsets, and `letterbox verify`
//! reports the same, instead of serving less than was acknowledged
//! (RELIABILITY.md, "Where the log may end").

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

/// A server that applies and checkpoints nothing on its own while a test
/// runs: everything acknowledged lives in the log alone.
async fn unapplied() -> TestServer {
    TestServer::start_with(&["--checkpoint-interval", "1h", "--apply-interval", "1h"]).await
}

/// The data directory's log segments, oldest first.
fn segments(data: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segs.sort();
    segs
}

/// (offset, length) of each frame of the segment at `path`, from the start.
fn frames(path: &Path) -> Vec<(usize, usize)> {
    let data = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 24 <= data.len() {
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
        let end = pos + 24 + len;
        if len == 0 || end > data.len() {
            break;
        }
        let crc = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap());
        let lsn = u64::from_le_bytes(data[pos + 8..pos + 16].try_into().unwrap());
        if crc32fast::hash(&data[pos + 8..end]) != crc
            || out.last().is_some_and(|&(_, _, l)| lsn <= l)
        {
            break;
        }
        out.push((pos, end - pos, lsn));
        pos = end;
    }
    out.into_iter().map(|(o, l, _)| (o, l)).collect()
}

/// The start's refusal, after `damage` to the stopped server's log.
fn refusal(s: &TestServer) -> String {
    let log = s.data_dir().with_file_name("refused.log");
    match spawn(&s.data_dir(), &log, &[]) {
        Ok((mut child, _)) => {
            let _ = child.kill();
            panic!("the damaged log was not refused")
        }
        Err(e) => e,
    }
}

/// `letterbox verify` on the directory: (exit code, output).
fn verify(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_letterbox"))
        .arg("verify")
        .arg("--data-dir")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Both the start and `verify` refuse, naming `file`.
fn both_refuse(s: &TestServer, file: &Path, also: &str) {
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let err = refusal(s);
    assert!(
        err.contains("cannot start") && err.contains(&name) && err.contains(also),
        "{err}"
    );
    let (code, out) = verify(&s.data_dir());
    assert_ne!(code, 0, "{out}");
    assert!(out.contains(&name) && out.contains(also), "{out}");
}

async fn publish_one_by_one(s: &TestServer, n: usize) {
    let mut c = s.clients().await;
    c.create("q", config()).await;
    for i in 0..n {
        c.publish("q", &[&format!("message {i:03}")]).await;
    }
}

#[tokio::test]
async fn a_zeroed_page_in_the_middle_of_the_log_is_refused() {
    let mut s = unapplied().await;
    publish_one_by_one(&s, 100).await;
    s.kill();
    let seg = segments(&s.data_dir()).remove(0);
    assert!(frames(&seg).len() > 100, "the publishes are in {seg:?}");
    // One 4 KiB page zeroed, as `dd bs=4096 seek=1 count=1 conv=notrunc`.
    let mut data = std::fs::read(&seg).unwrap();
    data[4096..8192].fill(0);
    std::fs::write(&seg, &data).unwrap();
    both_refuse(&s, &seg, "offset");
}

#[tokio::test]
async fn two_damaged_records_in_a_row_are_refused() {
    let mut s = unapplied().await;
    publish_one_by_one(&s, 100).await;
    s.kill();
    let seg = segments(&s.data_dir()).remove(0);
    let f = frames(&seg);
    let mut data = std::fs::read(&seg).unwrap();
    for &(offset, len) in &f[50..52] {
        data[offset + len - 3] ^= 0x55;
    }
    std::fs::write(&seg, &data).unwrap();
    both_refuse(&s, &seg, "later write");
}

/// A server whose log has just moved into a second segment: (the
/// server, killed; the newest segment with records).
async fn switched() -> (TestServer, PathBuf) {
    let mut s = unapplied().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let body = "x".repeat(100 << 10);
    let mut i = 0;
    // Test segments are 1 MiB: about ten of these fill one.
    loop {
        c.publish("q", &[&body]).await;
        i += 1;
        let with_records: Vec<PathBuf> = segments(&s.data_dir())
            .into_iter()
            .filter(|p| !frames(p).is_empty())
            .collect();
        if with_records.len() >= 2 {
            s.kill();
            return (s, with_records[with_records.len() - 1].clone());
        }
        assert!(i < 100, "the log never moved to a new segment");
    }
}

#[tokio::test]
async fn the_segment_the_log_just_moved_into_cannot_be_truncated_unnoticed() {
    let (s, newest) = switched().await;
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    both_refuse(&s, &newest, "truncated");
    // Cut to nothing at all.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(0)
        .unwrap();
    both_refuse(&s, &newest, "truncated");
}

#[tokio::test]
async fn the_segment_the_log_just_moved_into_cannot_be_zeroed_unnoticed() {
    let (s, newest) = switched().await;
    let len = usize::try_from(std::fs::metadata(&newest).unwrap().len()).unwrap();
    std::fs::write(&newest, vec![0u8; len]).unwrap();
    both_refuse(&s, &newest, "first record");
}

#[tokio::test]
async fn the_first_segment_zeroed_soon_after_a_start_is_refused() {
    let mut s = unapplied().await;
    publish_one_by_one(&s, 5).await;
    s.kill();
    let seg = segments(&s.data_dir()).remove(0);
    let len = usize::try_from(std::fs::metadata(&seg).unwrap().len()).unwrap();
    std::fs::write(&seg, vec![0u8; len]).unwrap();
    both_refuse(&s, &seg, "first record");
}

#[tokio::test]
async fn zeros_after_the_last_record_cost_nothing() {
    // The bytes after the log's last record are not records: changing
    // them is the one thing a start cannot tell from a torn write, and it
    // loses nothing acknowledged.
    let mut s = unapplied().await;
    publish_one_by_one(&s, 30).await;
    s.kill();
    let seg = segments(&s.data_dir()).remove(0);
    let f = frames(&seg);
    let (last, len) = f[f.len() - 1];
    let mut data = std::fs::read(&seg).unwrap();
    data[last + len..].fill(0xAB);
    std::fs::write(&seg, &data).unwrap();
    s.restart().await;
    let mut c = s.clients().await;
    assert_eq!(c.stats("q").await.ready, 30);
}
