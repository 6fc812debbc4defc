//! Tests of what the applier does with what is durable: generations
//! applied, payloads kept in the log and compacted, checkpoints retiring
//! segments, the database rewritten, room for publishers.

use std::time::Instant;

use bytes::Bytes;

use super::apply::apply_once;
use super::checkpoint::checkpoint;
use super::tests::{body, in_database, payload, small_opts, unapplied_opts};
use super::*;
use crate::storage::records::PayloadRecord;
use crate::storage::{Key, Result, SysKey, Txn, encode_payload};

fn big(i: u64) -> Bytes {
    encode_payload(&PayloadRecord::new(
        i,
        vec![],
        Bytes::from(format!("{i:0>900}")),
    ))
}

async fn put_payloads(store: &Store, range: std::ops::Range<u64>) {
    for i in range {
        let mut t = Txn::new();
        t.put_payload(i, big(i));
        store.submit(t).wait().await.expect("durable");
    }
}

async fn delete_payloads(store: &Store, ids: impl Iterator<Item = u64>) {
    for i in ids {
        let mut t = Txn::new();
        t.delete(Key::Payload(i));
        store.submit(t).wait().await.expect("durable");
    }
}

async fn settle(store: &Store) {
    // A few apply and checkpoint rounds.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(80)).await;
        let mut t = Txn::new();
        t.put_sys(SysKey::NextQid, 1);
        store.submit(t).wait().await.expect("durable");
    }
}

#[tokio::test]
async fn checkpoints_reclaim_log_segments_once_their_payloads_are_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    put_payloads(&store, 0..400).await;
    settle(&store).await;
    let held = wal::list_segments(&dir.path().join("wal")).expect("list");
    assert!(
        held.len() >= 5,
        "segments holding live payloads stay: {held:?}"
    );
    assert!(
        store.get_payload(3).expect("read").is_some(),
        "read back through its pointer"
    );
    delete_payloads(&store, 0..400).await;
    settle(&store).await;
    let segments = wal::list_segments(&dir.path().join("wal")).expect("list");
    assert!(store.stats().checkpoints > 0);
    assert!(segments.len() <= 3, "segments left: {segments:?}");
    store.close().expect("close");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    assert!(store.get_payload(399).expect("read").is_none());
}

#[tokio::test]
async fn sparse_old_segments_are_compacted_and_their_payloads_survive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    put_payloads(&store, 0..400).await;
    // Keep one payload in ten.
    delete_payloads(&store, (0..400).filter(|i| i % 10 != 0)).await;
    settle(&store).await;
    settle(&store).await;
    let stats = store.stats();
    assert!(stats.relocated > 0, "{stats:?}");
    assert!(stats.pinned_segments <= 3, "{stats:?}");
    let segments = wal::list_segments(&dir.path().join("wal")).expect("list");
    assert!(segments.len() <= 5, "segments left: {segments:?}");
    for i in (0..400).step_by(10) {
        let p = store.get_payload(i).expect("read").expect("kept");
        assert_eq!(p.body, Bytes::from(format!("{i:0>900}")));
    }
    store.crash();
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    for i in 0..400 {
        let p = store.get_payload(i).expect("read");
        assert_eq!(p.is_some(), i % 10 == 0, "payload {i}");
    }
}

#[tokio::test]
async fn fresh_keys_created_and_deleted_between_applies_never_reach_the_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = StoreOptions {
        apply_interval: Duration::from_secs(3600),
        ..small_opts()
    };
    let (store, _) = Store::open(dir.path(), opts).expect("open");
    let mut t = Txn::new();
    t.put_payload(1, payload(1));
    t.put_payload(2, payload(2));
    store.submit(t).wait().await.expect("durable");
    let mut t = Txn::new();
    t.delete(Key::Payload(1));
    store.submit(t).wait().await.expect("durable");
    assert_eq!(body(&store, 1), None);
    assert_eq!(
        store.backend.shared.submission.active_len(),
        1,
        "only pid 2 is left to apply"
    );
    apply_once(&store.backend.shared).expect("apply");
    assert!(!in_database(&store, 1));
    assert!(in_database(&store, 2));
    // Deleting a key that reached the database deletes it there.
    let mut t = Txn::new();
    t.delete(Key::Payload(2));
    store.submit(t).wait().await.expect("durable");
    apply_once(&store.backend.shared).expect("apply");
    assert!(!in_database(&store, 2));
    store.crash();
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    assert_eq!((body(&store, 1), body(&store, 2)), (None, None));
}

#[tokio::test]
async fn a_payload_deleted_while_its_relocation_is_pending_stays_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = StoreOptions {
        checkpoint_bytes: u64::MAX,
        ..unapplied_opts()
    };
    let (store, _) = Store::open(dir.path(), opts.clone()).expect("open");
    put_payloads(&store, 0..400).await;
    apply_once(&store.backend.shared).expect("apply");
    delete_payloads(&store, (0..400).filter(|i| i % 10 != 0)).await;
    apply_once(&store.backend.shared).expect("apply");
    checkpoint(&store.backend.shared).expect("checkpoint and compact");
    assert!(store.stats().relocated > 0);
    // Deleted after its relocation was logged, before it was applied.
    delete_payloads(&store, [0u64, 10].into_iter()).await;
    assert!(store.get_payload(0).expect("read").is_none());
    assert!(store.get_payload(10).expect("read").is_none());
    assert!(store.get_payload(20).expect("read").is_some());
    // Crash before applying: the relocations and the deletes are replayed.
    store.crash();
    let (store, report) = Store::open(dir.path(), opts.clone()).expect("reopen");
    assert!(report.replayed > 0);
    assert!(
        store.get_payload(0).expect("read").is_none(),
        "replay keeps it deleted"
    );
    assert!(store.get_payload(10).expect("read").is_none());
    assert_eq!(
        store.get_payload(20).expect("read").expect("kept").body,
        Bytes::from(format!("{:0>900}", 20))
    );
    // The same, applied before the crash.
    delete_payloads(&store, [20u64].into_iter()).await;
    apply_once(&store.backend.shared).expect("apply");
    store.crash();
    let (store, _) = Store::open(dir.path(), opts).expect("reopen");
    assert!(store.get_payload(20).expect("read").is_none());
    assert!(store.get_payload(30).expect("read").is_some());
}

/// Puts messages with a 512 B state record each (which lives in the
/// database itself, unlike bodies) and a payload, and applies them. Well
/// under the rewrite's estimate of 1 KiB of database per message, so
/// that sled's own slack (its files run to 2-3x the records) cannot pass
/// for a drained database.
async fn put_states(store: &Store, range: std::ops::Range<u64>) {
    for chunk in range.collect::<Vec<_>>().chunks(256) {
        let mut t = Txn::new();
        for &i in chunk {
            t.put(Key::Meta(1, i), Bytes::from(vec![(i % 251) as u8; 512]));
            t.put_payload(i, payload(i));
        }
        store.submit(t).wait().await.expect("durable");
    }
    apply_once(&store.backend.shared).expect("apply");
}

fn rewrite_opts() -> StoreOptions {
    StoreOptions {
        checkpoint_bytes: u64::MAX,
        segment_size: 4 << 20,
        rewrite_min_bytes: 4 << 20,
        ..unapplied_opts()
    }
}

fn db_size(store: &Store) -> u64 {
    store
        .backend
        .shared
        .db
        .handle()
        .size_on_disk()
        .expect("size")
}

#[tokio::test]
async fn a_drained_database_is_rewritten_and_gives_its_space_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), rewrite_opts()).expect("open");
    put_states(&store, 0..32_000).await;
    checkpoint(&store.backend.shared).expect("checkpoint");
    let full = db_size(&store);
    assert_eq!(store.stats().rewrites, 0, "all of it is live ({full} B)");
    assert!(full > 16 << 20, "{full}");
    // Drain all but a few.
    let mut t = Txn::new();
    for i in (0..32_000).filter(|i| i % 1000 != 7) {
        t.delete(Key::Meta(1, i));
        t.delete(Key::Payload(i));
    }
    store.submit(t).wait().await.expect("durable");
    apply_once(&store.backend.shared).expect("apply");
    checkpoint(&store.backend.shared).expect("checkpoint");
    assert_eq!(store.stats().rewrites, 1);
    let after = db_size(&store);
    assert!(after * 4 < full, "{after} after, {full} before");
    assert!(
        !dir.path().join("db").exists(),
        "the old database is removed"
    );
    assert_eq!(
        fsutil::current_database(dir.path()).expect("current"),
        dir.path().join("db-1")
    );
    // Nothing to give back now: no second rewrite.
    checkpoint(&store.backend.shared).expect("checkpoint");
    assert_eq!(store.stats().rewrites, 1);
    // Reads and writes go to the new database, before and after a crash.
    let meta = |store: &Store, i| store.get(&Key::Meta(1, i)).expect("read");
    assert_eq!(meta(&store, 1007).expect("kept")[0], (1007 % 251) as u8);
    assert!(meta(&store, 1008).is_none());
    put_states(&store, 9000..9010).await;
    store.crash();
    let (store, _) = Store::open(dir.path(), rewrite_opts()).expect("reopen");
    assert_eq!(meta(&store, 7007).expect("kept")[0], (7007 % 251) as u8);
    assert_eq!(meta(&store, 9009).expect("kept")[0], (9009 % 251) as u8);
    assert!(meta(&store, 7008).is_none());
}

#[tokio::test]
async fn a_rewrite_interrupted_before_or_after_its_switch_is_cleaned_up_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    put_states(&store, 0..10).await;
    store.close().expect("close");
    // Before the switch: a new database half written.
    std::fs::create_dir(dir.path().join("db-1")).expect("mkdir");
    std::fs::write(dir.path().join("db-1").join("db"), b"half written").expect("write");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    assert!(!dir.path().join("db-1").exists());
    assert!(store.get(&Key::Meta(1, 9)).expect("read").is_some());
    // After the switch: the old database not yet removed.
    rewrite::rewrite(&store.backend.shared, 0).expect("rewrite");
    store.close().expect("close");
    assert!(!dir.path().join("db").exists());
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir(to).expect("mkdir");
        for e in std::fs::read_dir(from).expect("list") {
            let e = e.expect("entry");
            if e.file_type().expect("type").is_file() {
                std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
            }
        }
    };
    copy(&dir.path().join("db-1"), &dir.path().join("db"));
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    assert!(!dir.path().join("db").exists());
    assert!(dir.path().join("db-1").exists());
    assert!(store.get(&Key::Meta(1, 9)).expect("read").is_some());
    store.close().expect("close");
}

#[tokio::test]
async fn a_bad_record_of_the_current_database_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    put_states(&store, 0..10).await;
    store.close().expect("close");
    let record = dir.path().join("DATABASE");
    std::fs::write(&record, "letterbox database\ncurrent ../elsewhere\n").expect("write");
    let e = Store::open(dir.path(), small_opts()).expect_err("malformed");
    assert!(e.to_string().contains("DATABASE"), "{e}");
    // Naming a database that is not there: never start empty.
    std::fs::write(&record, "letterbox database\ncurrent db-7\n").expect("write");
    let e = Store::open(dir.path(), small_opts()).expect_err("missing");
    assert!(e.to_string().contains("db-7"), "{e}");
    assert!(
        dir.path().join("db").exists(),
        "nothing is removed when the current one is missing"
    );
}

/// A 64 KiB bound on unapplied bytes, and an applier that applies only
/// when woken (its interval is an hour, its early trigger 1 GiB).
fn bounded_opts() -> StoreOptions {
    StoreOptions {
        apply_bytes: 1 << 30,
        max_unapplied_bytes: 64 << 10,
        checkpoint_bytes: u64::MAX,
        ..unapplied_opts()
    }
}

#[tokio::test]
async fn room_waits_for_the_applier_when_too_much_is_unapplied_and_wakes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The applier sleeps for an hour once it has gone to sleep: only a
    // waiting publisher's wake-up makes it apply.
    let (store, _) = Store::open(dir.path(), bounded_opts()).expect("open");
    let body = Bytes::from(vec![7u8; 1024]);
    tokio::time::timeout(Duration::from_secs(1), store.room())
        .await
        .expect("an empty memtable leaves room at once");
    let mut last = None;
    for i in 0..100u64 {
        let mut t = Txn::new();
        t.put_payload(
            i,
            encode_payload(&PayloadRecord::new(i, vec![], body.clone())),
        );
        last = Some(store.submit(t));
    }
    last.expect("submitted").wait().await.expect("durable");
    let before = store.stats();
    // The applier, if it had not gone to sleep yet when the bytes went
    // over the bound, applies at once instead; either way room() returns
    // once it has.
    tokio::time::timeout(Duration::from_secs(10), store.room())
        .await
        .expect("room() wakes the applier and returns once it has applied");
    let after = store.stats();
    assert!(after.room_waits <= 1);
    assert!(after.unapplied_bytes < 64 << 10, "{after:?}");
    assert!(after.applied_lsn > 0 && after.applied_lsn <= before.durable_lsn);
    assert_eq!(body_len(&store, 99), Some(1024), "read back from the log");
}

fn body_len(store: &Store, pid: u64) -> Option<usize> {
    store.get_payload(pid).expect("read").map(|p| p.body.len())
}

#[tokio::test]
async fn room_is_given_back_when_everything_held_was_created_and_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), bounded_opts()).expect("open");
    let body = Bytes::from(vec![7u8; 1024]);
    // Published and acked before any apply: the memtable ends up empty,
    // but the bytes went through it.
    let mut last = None;
    for i in 0..100u64 {
        let mut t = Txn::new();
        t.put_payload(
            i,
            encode_payload(&PayloadRecord::new(i, vec![], body.clone())),
        );
        store.submit(t);
        let mut t = Txn::new();
        t.delete(Key::Payload(i));
        last = Some(store.submit(t));
    }
    last.expect("submitted").wait().await.expect("durable");
    tokio::time::timeout(Duration::from_secs(10), store.room())
        .await
        .expect("an empty memtable holds nothing: room() returns");
    assert!(store.stats().unapplied_bytes < 64 << 10);
    assert_eq!(body_len(&store, 5), None);
}

/// The database's own value for a payload key: a pointer into the log
/// when the applier knew where the log writer put the payload.
fn stored_pointer(store: &Store, pid: u64) -> Option<payloads::Loc> {
    let raw = store
        .backend
        .shared
        .db
        .handle()
        .get(Key::Payload(pid).encode())
        .expect("read")?;
    payloads::Loc::decode(&raw)
}

#[tokio::test]
async fn payloads_logged_while_a_generation_is_applied_keep_their_places() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    let (frozen_tx, frozen) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    store.hold_applier(frozen_tx, release_rx);
    let mut t = Txn::new();
    t.put_payload(1, payload(1));
    store.submit(t).wait().await.expect("durable");
    // The applier froze the generation of payload 1 and holds it.
    frozen
        .recv_timeout(Duration::from_secs(10))
        .expect("the applier froze a generation");
    // Payload 2 is logged (and placed) after that freeze: it belongs to
    // the next generation, and its place must wait for it.
    let mut t = Txn::new();
    t.put_payload(2, payload(2));
    let c = store.submit(t);
    let lsn2 = c.lsn();
    c.wait().await.expect("durable");
    release.send(()).expect("release");
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.backend.shared.applier.applied_lsn() < lsn2 {
        assert!(Instant::now() < deadline, "payload 2 never applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for pid in [1, 2] {
        let loc = stored_pointer(&store, pid)
            .unwrap_or_else(|| panic!("payload {pid} is stored whole, not as a pointer"));
        assert!(loc.len > 0, "{loc:?}");
    }
    assert_eq!(body(&store, 2).as_deref(), Some("body-2"));
    store.close().expect("close");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    assert_eq!(body(&store, 1).as_deref(), Some("body-1"));
    assert_eq!(body(&store, 2).as_deref(), Some("body-2"));
}

/// Options under which nothing is applied or checkpointed unless a test
/// calls `apply_once` itself, and every durable payload is swapped for its
/// place at once (none kept whole).
fn manual_apply_opts() -> StoreOptions {
    StoreOptions {
        recent_payload_bytes: 0,
        ..unapplied_opts()
    }
}

/// Whether the memtable holds the payload's place in the log rather than
/// the payload itself.
fn is_placed(store: &Store, pid: u64) -> bool {
    let slot = store
        .backend
        .shared
        .submission
        .active_slot(&Key::Payload(pid).encode())
        .expect("in the memtable");
    slot.placed
        && slot
            .value
            .as_ref()
            .and_then(|v| payloads::Loc::decode(v))
            .is_some()
}

#[tokio::test]
async fn the_most_recent_durable_payloads_stay_whole_in_the_memtable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = big(1).len();
    let opts = StoreOptions {
        recent_payload_bytes: 2 * one,
        ..manual_apply_opts()
    };
    let (store, _) = Store::open(dir.path(), opts).expect("open");
    put_payloads(&store, 1..6).await;
    let placed: Vec<bool> = (1..6).map(|pid| is_placed(&store, pid)).collect();
    assert_eq!(
        placed,
        [true, true, true, false, false],
        "the two newest stay whole"
    );
    for pid in 1..6u64 {
        assert_eq!(body(&store, pid), Some(format!("{pid:0>900}")));
    }
}

#[tokio::test]
async fn durable_payloads_leave_the_memtable_for_their_places() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), manual_apply_opts()).expect("open");
    put_payloads(&store, 1..3).await;
    // Answered, so swapped: the memtable holds each payload's place in
    // the log, not its body.
    for pid in [1u64, 2] {
        assert!(is_placed(&store, pid), "payload {pid} is still whole");
    }
    // Reads take the bodies from the log.
    let want = |i: u64| Some(format!("{i:0>900}"));
    assert_eq!(body(&store, 1), want(1));
    assert_eq!(body(&store, 2), want(2));
    // A delete after the swap still wins, and a fresh payload created and
    // deleted in one generation still never reaches the database.
    delete_payloads(&store, [2].into_iter()).await;
    assert_eq!(body(&store, 2), None);
    apply_once(&store.backend.shared).expect("apply");
    let loc = stored_pointer(&store, 1).expect("payload 1 applied as a pointer");
    assert_eq!(store.backend.shared.payloads.count_in(loc.seg), 1);
    assert!(!in_database(&store, 2));
    assert_eq!(body(&store, 1), want(1));
    store.close().expect("close");
    let (store, _) = Store::open(dir.path(), manual_apply_opts()).expect("reopen");
    assert_eq!(body(&store, 1), want(1));
    assert_eq!(body(&store, 2), None);
}

/// Starts an apply on another thread and returns once it has frozen a
/// generation and seen it durable: it then waits, with nothing of it
/// applied, until the returned sender is used (or dropped). Join the
/// thread for the apply's result.
fn held_apply(
    store: &Store,
) -> (
    std::thread::JoinHandle<Result<()>>,
    std::sync::mpsc::Sender<()>,
) {
    let (frozen_tx, frozen) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    store.hold_applier(frozen_tx, release_rx);
    let shared = Arc::clone(&store.backend.shared);
    let first = std::thread::spawn(move || apply_once(&shared));
    frozen
        .recv_timeout(Duration::from_secs(10))
        .expect("the apply froze a generation");
    (first, release)
}

#[tokio::test]
async fn a_swapped_payload_logged_again_during_its_apply_is_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), manual_apply_opts()).expect("open");
    put_payloads(&store, 1..2).await;
    // Generation 1 (payload 1, swapped for its place) is frozen and held
    // by an apply on another thread.
    let (first, release) = held_apply(&store);
    // Meanwhile payload 1 is logged again (a compaction's relocation):
    // the log writer's map now holds the newer place, so the held apply
    // finds the older one only in the slot itself.
    let mut t = Txn::new();
    t.relocate(Key::Payload(1).encode(), big(1));
    store.submit(t).wait().await.expect("durable");
    release.send(()).expect("release");
    first.join().expect("apply thread").expect("apply");
    // The held apply stored the older place, and counted it: until the
    // relocation is applied, its segment must not look empty.
    let older = stored_pointer(&store, 1).expect("payload 1 stored as a pointer");
    assert_eq!(
        store.backend.shared.payloads.count_in(older.seg),
        1,
        "{older:?}"
    );
    apply_once(&store.backend.shared).expect("apply the relocation");
    let loc = stored_pointer(&store, 1).expect("payload 1 stored as a pointer");
    let counts = store.backend.shared.payloads.counts();
    assert_eq!(
        counts.values().sum::<u64>(),
        1,
        "one payload, one live pointer: {counts:?} (newest place {loc:?})"
    );
    assert_eq!(counts.get(&loc.seg), Some(&1));
    assert_eq!(body(&store, 1), Some(format!("{:0>900}", 1)));
}

#[tokio::test]
async fn puts_overtaken_by_a_durable_delete_are_left_out_of_the_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), manual_apply_opts()).expect("open");
    // Payload 3 reaches the database first.
    put_payloads(&store, 3..4).await;
    apply_once(&store.backend.shared).expect("apply");
    let older = stored_pointer(&store, 3).expect("payload 3 stored as a pointer");
    // The next generation creates payloads 1 and 2 and writes payload 3
    // again (a compaction's relocation: a put of a key the database
    // holds).
    put_payloads(&store, 1..3).await;
    let mut t = Txn::new();
    t.relocate(Key::Payload(3).encode(), big(3));
    store.submit(t).wait().await.expect("durable");
    let (first, release) = held_apply(&store);
    // While that generation waits to be applied, payloads 1 and 3 are
    // deleted, durably.
    delete_payloads(&store, [1, 3].into_iter()).await;
    release.send(()).expect("release");
    first.join().expect("apply thread").expect("apply");
    assert_eq!(store.stats().overtaken, 2, "{:?}", store.stats());
    assert!(!in_database(&store, 1), "payload 1 was written after all");
    assert!(in_database(&store, 2));
    assert_eq!(
        stored_pointer(&store, 3),
        Some(older),
        "payload 3 was rewritten after all"
    );
    assert_eq!((body(&store, 1), body(&store, 3)), (None, None));
    assert_eq!(body(&store, 2), Some(format!("{:0>900}", 2)));
    {
        // The delete of payload 1 now concerns a key the database never
        // held; that of payload 3 still has its older pointer to remove.
        let slot = |pid: u64| {
            store
                .backend
                .shared
                .submission
                .active_slot(&Key::Payload(pid).encode())
                .expect("the delete")
        };
        assert!(slot(1).fresh && slot(1).value.is_none());
        assert!(!slot(3).fresh && slot(3).value.is_none());
    }
    // A crash before the deletes are applied: the log replays them.
    store.crash();
    let (store, _) = Store::open(dir.path(), manual_apply_opts()).expect("reopen");
    assert_eq!(
        (body(&store, 1), body(&store, 2), body(&store, 3)),
        (None, Some(format!("{:0>900}", 2)), None)
    );
    apply_once(&store.backend.shared).expect("apply the deletes");
    assert!(!in_database(&store, 1) && !in_database(&store, 3));
    let counts = store.backend.shared.payloads.counts();
    assert_eq!(
        counts.values().sum::<u64>(),
        1,
        "one payload left, one live pointer: {counts:?}"
    );
}

#[tokio::test]
async fn a_delete_not_yet_durable_overtakes_no_put() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), manual_apply_opts()).expect("open");
    put_payloads(&store, 1..2).await;
    let (first, release) = held_apply(&store);
    // The test holds the log, so the delete of payload 1 is submitted
    // (readers see it) but neither written nor durable while the held
    // apply goes on.
    let log = store.backend.shared.log.hold();
    let mut t = Txn::new();
    t.delete(Key::Payload(1));
    let delete = store.submit(t);
    release.send(()).expect("release");
    first.join().expect("apply thread").expect("apply");
    let overtaken = store.stats().overtaken;
    let stored = in_database(&store, 1);
    let fresh = {
        let slot = store
            .backend
            .shared
            .submission
            .active_slot(&Key::Payload(1).encode())
            .expect("the delete");
        assert!(slot.value.is_none());
        slot.fresh
    };
    drop(log);
    store.backend.shared.submission.wake_log_writer();
    // A crash now would lose the delete: the put must be in the database.
    assert_eq!(overtaken, 0, "{:?}", store.stats());
    assert!(
        stored,
        "payload 1 was left out for a delete not yet durable"
    );
    // And the delete still has a stored key to remove.
    assert!(
        !fresh,
        "the delete was marked as never reaching the database"
    );
    assert_eq!(body(&store, 1), None);
    delete.wait().await.expect("durable");
    apply_once(&store.backend.shared).expect("apply the delete");
    assert!(!in_database(&store, 1));
    assert_eq!(body(&store, 1), None);
}
