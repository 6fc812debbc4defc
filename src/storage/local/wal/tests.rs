use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::replay::{READ_STEP, applied_whole};
use super::*;
use crate::storage::error::Result;

fn put(k: &str, v: &str) -> Mutation {
    Mutation {
        key: Bytes::copy_from_slice(k.as_bytes()),
        value: Some(Bytes::copy_from_slice(v.as_bytes())),
        fresh: false,
        if_exists: false,
    }
}

#[test]
fn txn_codec_round_trips_and_rejects_garbage() {
    let muts = vec![put("a", "1"), Mutation::delete(Bytes::from_static(b"b"))];
    let mut out = Vec::new();
    encode_txn(&muts, &mut out);
    assert_eq!(out.len(), encoded_len(&muts));
    assert_eq!(
        decode_txn(&Bytes::from(out.clone())).expect("decodes"),
        muts
    );
    assert!(decode_txn(&Bytes::from(out[..out.len() - 1].to_vec())).is_err());
    let mut extra = out.clone();
    extra.push(7);
    assert!(decode_txn(&Bytes::from(extra)).is_err());
    assert!(decode_txn(&Bytes::from_static(&[1, 0, 0, 0, 1, 0, b'k', 9])).is_err());
}

fn write_records(dir: &Path, segment: u64, lsns: std::ops::RangeInclusive<u64>) -> Vec<u8> {
    let mut buf = Vec::new();
    let first = *lsns.start();
    for lsn in lsns {
        frame(
            lsn,
            first,
            &[put(&format!("k{lsn}"), "v")],
            &mut buf,
            |_| false,
        );
    }
    let mut data = buf.clone();
    data.resize(buf.len() + 4096, 0);
    std::fs::write(segment_path(dir, segment), &data).expect("write");
    buf
}

fn collect(dir: &Path, after: u64) -> Result<Vec<u64>> {
    let mut seen = Vec::new();
    replay(dir, after, |lsn, _, _, _| {
        seen.push(lsn);
        Ok(())
    })?;
    Ok(seen)
}

#[test]
fn replay_reads_across_segments_and_skips_applied() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_records(dir.path(), 1, 1..=3);
    write_records(dir.path(), 2, 4..=6);
    assert_eq!(
        collect(dir.path(), 0).expect("replay"),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert_eq!(collect(dir.path(), 4).expect("replay"), vec![5, 6]);
}

#[test]
fn segments_wholly_applied_are_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buf = write_records(dir.path(), 1, 1..=3);
    write_records(dir.path(), 2, 4..=6);
    write_records(dir.path(), 3, 7..=9);
    // Damage a record of segment 1 (not its first): had it been read,
    // later records following it would make this a refusal.
    let mut data = std::fs::read(segment_path(dir.path(), 1)).expect("read");
    data[buf.len() / 3 + HEADER + 2] ^= 0xff;
    std::fs::write(segment_path(dir.path(), 1), &data).expect("write");
    assert_eq!(
        collect(dir.path(), 3).expect("replay"),
        vec![4, 5, 6, 7, 8, 9]
    );
    assert_eq!(collect(dir.path(), 7).expect("replay"), vec![8, 9]);
    // Not wholly applied: read, and the damage refused.
    let err = collect(dir.path(), 2).expect_err("damage is detected");
    assert!(err.to_string().contains("lsn 3"), "{err}");
    // A following segment whose first frame is older (left from its
    // earlier life) says nothing: segment 2 is read.
    write_records(dir.path(), 3, 1..=2);
    assert!(
        applied_whole(
            &segment_path(dir.path(), 1),
            &segment_path(dir.path(), 2),
            3
        )
        .expect("judge")
    );
    assert!(
        !applied_whole(
            &segment_path(dir.path(), 2),
            &segment_path(dir.path(), 3),
            9
        )
        .expect("judge")
    );
}

#[test]
fn torn_tail_ends_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let buf = write_records(dir.path(), 1, 1..=3);
    // Tear the last record: keep its header, zero half its body.
    let mut data = std::fs::read(segment_path(dir.path(), 1)).expect("read");
    let last_len = buf.len() / 3;
    for b in &mut data[buf.len() - last_len / 2..buf.len()] {
        *b = 0;
    }
    std::fs::write(segment_path(dir.path(), 1), &data).expect("write");
    assert_eq!(collect(dir.path(), 0).expect("replay"), vec![1, 2]);
}

#[test]
fn damage_before_later_writes_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut buf = Vec::new();
    frame(1, 1, &[put("a", "1")], &mut buf, |_| false);
    let first_len = buf.len();
    frame(2, 2, &[put("b", "2")], &mut buf, |_| false);
    buf[HEADER + 3] ^= 0xff; // flip a payload byte of lsn 1
    std::fs::write(segment_path(dir.path(), 1), &buf).expect("write");
    let err = collect(dir.path(), 0).expect_err("damage is detected");
    assert!(err.to_string().contains("damaged"), "{err}");
    // The same damage inside one write (a torn batch) is only an end.
    let mut buf = Vec::new();
    frame(1, 1, &[put("a", "1")], &mut buf, |_| false);
    frame(2, 1, &[put("b", "2")], &mut buf, |_| false);
    buf[HEADER + 3] ^= 0xff;
    std::fs::write(segment_path(dir.path(), 1), &buf).expect("write");
    assert_eq!(collect(dir.path(), 0).expect("replay"), Vec::<u64>::new());
    assert!(first_len > HEADER);
}

#[test]
fn writer_rolls_over_segments_and_replay_follows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = Arc::new(Pool::open(dir.path(), 256).expect("pool"));
    let mut w = Writer::start(pool, 0).expect("writer");
    let mut lsn = 1;
    for _ in 0..20 {
        let mut frames = Vec::new();
        let mut bounds = Vec::new();
        for _ in 0..3 {
            frame(
                lsn,
                lsn,
                &[put(&format!("key{lsn}"), "value")],
                &mut frames,
                |_| false,
            );
            bounds.push((frames.len(), lsn));
            lsn += 1;
        }
        w.write(&frames, &bounds).expect("write");
    }
    // One record larger than a segment.
    let big = "x".repeat(1000);
    let mut frames = Vec::new();
    frame(lsn, lsn, &[put("big", &big)], &mut frames, |_| false);
    w.write(&frames, &[(frames.len(), lsn)]).expect("write big");
    assert!(w.current_number() > 2);
    drop(w);
    let seen = collect(dir.path(), 0).expect("replay");
    assert_eq!(seen, (1..=lsn).collect::<Vec<_>>());
}

/// Frames of `kib` KiB for `lsns` (all of one batch from `first`).
fn big_frames(lsns: std::ops::RangeInclusive<u64>, first: u64, kib: usize) -> Vec<u8> {
    let value = "v".repeat(kib << 10);
    let mut buf = Vec::new();
    for lsn in lsns {
        frame(
            lsn,
            first,
            &[put(&format!("k{lsn}"), &value)],
            &mut buf,
            |_| false,
        );
    }
    buf
}

/// Writes `frames` as segment 1, zeros to 8 MiB after them.
fn write_segment(dir: &Path, frames: &[u8]) {
    let mut data = frames.to_vec();
    data.resize(8 << 20, 0);
    std::fs::write(segment_path(dir, 1), &data).expect("write");
}

#[test]
fn a_segment_is_read_only_as_far_as_its_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = segment_path(dir.path(), 1);
    // Zeros after the frames are not read.
    let current = big_frames(11..=13, 11, 300);
    write_segment(dir.path(), &current);
    let read = read_frames(&path).expect("read");
    assert!(
        read.len() >= current.len() && read.len() < 4 << 20,
        "{}",
        read.len()
    );
    assert_eq!(collect(dir.path(), 10).expect("replay"), vec![11, 12, 13]);
    // Older records after them (a reused segment): the first of them
    // and the one after it are read, no more.
    let old = big_frames(1..=9, 1, 300);
    let one = old.len() / 9;
    let mut reused = current.clone();
    reused.extend_from_slice(&old);
    write_segment(dir.path(), &reused);
    let read = read_frames(&path).expect("read");
    assert!(read.len() >= current.len() + 2 * one, "{}", read.len());
    assert!(
        read.len() < current.len() + 2 * one + READ_STEP + HEADER,
        "{}",
        read.len()
    );
    assert_eq!(collect(dir.path(), 10).expect("replay"), vec![11, 12, 13]);
}

#[test]
fn damage_is_judged_on_what_the_partial_read_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Frames larger than a read step, so that what is read is what
    // the frames' lengths lead to.
    let mut frames = big_frames(1..=1, 1, 1536);
    let first = frames.len();
    frames.extend(big_frames(2..=2, 2, 1536));
    frames.extend(big_frames(3..=3, 3, 1536));
    // Lsn 2's body damaged, lsn 3 written after it: refused.
    let mut damaged = frames.clone();
    damaged[first + HEADER + 100] ^= 0xff;
    write_segment(dir.path(), &damaged);
    let err = collect(dir.path(), 0).expect_err("damage is detected");
    assert!(err.to_string().contains("damaged"), "{err}");
    // Lsn 2's own lsn damaged (it no longer looks newer than lsn 1):
    // the frame after it is read all the same, and the damage refused.
    let mut damaged = frames.clone();
    damaged[first + 8..first + 16].copy_from_slice(&0u64.to_le_bytes());
    write_segment(dir.path(), &damaged);
    let err = collect(dir.path(), 0).expect_err("damage is detected");
    assert!(err.to_string().contains("damaged"), "{err}");
}

#[test]
fn reused_segments_do_not_replay_their_old_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = Arc::new(Pool::open(dir.path(), 4096).expect("pool"));
    let mut w = Writer::start(Arc::clone(&pool), 0).expect("writer");
    let mut frames = Vec::new();
    let mut bounds = Vec::new();
    for lsn in 1..=10 {
        frame(
            lsn,
            1,
            &[put(&format!("k{lsn}"), "old")],
            &mut frames,
            |_| false,
        );
        bounds.push((frames.len(), lsn));
    }
    w.write(&frames, &bounds).expect("write");
    drop(w);
    // Everything applied: the segments are retired, then reused.
    for n in list_segments(dir.path()).expect("list") {
        pool.retire(&segment_path(dir.path(), n)).expect("retire");
    }
    let mut w = Writer::start(Arc::clone(&pool), 2).expect("writer");
    let mut frames = Vec::new();
    frame(11, 11, &[put("k11", "new")], &mut frames, |_| false);
    w.write(&frames, &[(frames.len(), 11)]).expect("write");
    drop(w);
    assert_eq!(collect(dir.path(), 10).expect("replay"), vec![11]);
}

/// Writes whole frames, one write each, of lsns `from..=to` into `buf`.
fn one_write_each(buf: &mut Vec<u8>, lsns: std::ops::RangeInclusive<u64>) {
    for lsn in lsns {
        frame(lsn, lsn, &[put(&format!("k{lsn}"), "v")], buf, |_| false);
    }
}

#[test]
fn damage_anywhere_before_a_later_write_is_refused_however_wide() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut buf = Vec::new();
    one_write_each(&mut buf, 1..=40);
    let one = buf.len() / 40;
    // Two damaged frames in a row (lsns 11 and 12): the frame after the
    // first is damaged too, and 13.. follow.
    let mut two = buf.clone();
    two[10 * one + HEADER + 2] ^= 0x10;
    two[11 * one + HEADER + 2] ^= 0x10;
    write_segment(dir.path(), &two);
    let err = collect(dir.path(), 0).expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("lsn 11 was expected") && text.contains("(lsn 13)"),
        "{text}"
    );
    // A zeroed stretch over many frames, lengths included.
    let mut zeroed = buf.clone();
    zeroed[5 * one + 7..30 * one + 3].fill(0);
    write_segment(dir.path(), &zeroed);
    let text = collect(dir.path(), 0).expect_err("refused").to_string();
    assert!(text.contains("lsn 6 was expected"), "{text}");
    // Damage among records the database holds already costs nothing by
    // itself, but records it does not hold may not be left behind it,
    // whatever write they belong to.
    let mut applied = buf.clone();
    applied[5 * one + HEADER + 2] ^= 0x10;
    write_segment(dir.path(), &applied);
    assert_eq!(
        collect(dir.path(), 40).expect("all applied"),
        Vec::<u64>::new()
    );
    let text = collect(dir.path(), 20).expect_err("refused").to_string();
    assert!(text.contains("(lsn 21)"), "{text}");
    // Everything after lsn 5 zeroed: nothing later is left, so this is
    // where the log ends (the documented limit).
    let mut tail = buf.clone();
    tail[5 * one + 7..].fill(0);
    write_segment(dir.path(), &tail);
    assert_eq!(
        collect(dir.path(), 0).expect("an end"),
        (1..=5).collect::<Vec<_>>()
    );
}

#[test]
fn a_torn_write_and_older_records_after_the_end_are_not_later_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Lsns 21..=30, written one by one, then a write of 31..=35 torn in
    // its first frame, with a reused segment's older records after it.
    let mut buf = Vec::new();
    one_write_each(&mut buf, 21..=30);
    let torn_at = buf.len();
    for lsn in 31..=35 {
        frame(lsn, 31, &[put(&format!("k{lsn}"), "v")], &mut buf, |_| {
            false
        });
    }
    buf[torn_at + HEADER + 1] ^= 0x01;
    one_write_each(&mut buf, 1..=20);
    write_segment(dir.path(), &buf);
    assert_eq!(
        collect(dir.path(), 20).expect("a torn tail"),
        (21..=30).collect::<Vec<_>>()
    );
}

#[test]
fn a_later_write_in_a_later_segment_is_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Segment 1 full of 1..=10; segment 2 held 11..=20, its first page
    // zeroed: 11 is gone, but a later write is in segment 2.
    let mut first = Vec::new();
    one_write_each(&mut first, 1..=10);
    std::fs::write(segment_path(dir.path(), 1), &first).expect("write");
    let mut second = Vec::new();
    one_write_each(&mut second, 11..=20);
    let half = second.len() / 2;
    second[..half].fill(0);
    second.resize(1 << 20, 0);
    std::fs::write(segment_path(dir.path(), 2), &second).expect("write");
    let text = collect(dir.path(), 0).expect_err("refused").to_string();
    assert!(
        text.contains("00000000000000000001.wal")
            && text.contains("lsn 11 was expected")
            && text.contains("00000000000000000002.wal"),
        "{text}"
    );
}

#[test]
fn a_torn_writes_leftovers_in_a_reused_segment_are_not_a_later_write() {
    // Segment 1 holds 1..=20, the database has applied up to 30 (21..=30
    // were in segments since retired), and segment 2 was reused from a
    // segment holding what a crash tore of a write 31..=35 (it started at
    // 31, no later than where the log now goes): an end, not damage.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Vec::new();
    one_write_each(&mut first, 1..=20);
    write_segment(dir.path(), &first);
    let mut leftovers = Vec::new();
    for lsn in 31..=35 {
        frame(
            lsn,
            31,
            &[put(&format!("k{lsn}"), "v")],
            &mut leftovers,
            |_| false,
        );
    }
    let mut second = vec![0u8; 4096];
    second.extend_from_slice(&leftovers[leftovers.len() / 5..]);
    second.resize(1 << 20, 0);
    std::fs::write(segment_path(dir.path(), 2), &second).expect("write");
    assert_eq!(collect(dir.path(), 30).expect("an end"), Vec::<u64>::new());
    // A later write there (its first lsn above 31) is refused.
    let mut later = vec![0u8; 4096];
    one_write_each(&mut later, 32..=33);
    later.resize(1 << 20, 0);
    std::fs::write(segment_path(dir.path(), 2), &later).expect("write");
    let text = collect(dir.path(), 30).expect_err("refused").to_string();
    assert!(text.contains("(lsn 32)"), "{text}");
}
