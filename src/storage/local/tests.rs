//! Tests of the local store: submissions read at once and durable after a
//! crash, group commits and the commits callers alone make, a failure,
//! the segments `CHECKPOINT` lists; sled's scans against a sorted map.

use super::*;
use crate::storage::records::{CountersRecord, PayloadRecord};
use crate::storage::{Key, Space, Txn, encode_payload};
use std::time::Instant;

pub(super) fn small_opts() -> StoreOptions {
    StoreOptions {
        segment_size: 64 << 10,
        apply_interval: Duration::from_millis(20),
        checkpoint_interval: Duration::from_millis(50),
        checkpoint_bytes: 32 << 10,
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

/// [`small_opts`] with neither the applier nor checkpoints on a timer
/// (an hour): what is applied and checkpointed is up to the test (and to
/// `apply_bytes` and `checkpoint_bytes`).
pub(super) fn unapplied_opts() -> StoreOptions {
    StoreOptions {
        apply_interval: Duration::from_secs(3600),
        checkpoint_interval: Duration::from_secs(3600),
        ..small_opts()
    }
}

pub(super) fn payload(i: u64) -> Bytes {
    encode_payload(&PayloadRecord::new(
        i,
        vec![],
        Bytes::from(format!("body-{i}")),
    ))
}

/// Whether the database (not the memtable) holds the payload.
pub(super) fn in_database(store: &Store, pid: u64) -> bool {
    store
        .backend
        .shared
        .db
        .handle()
        .get(Key::Payload(pid).encode())
        .expect("get")
        .is_some()
}

pub(super) fn body(store: &Store, pid: u64) -> Option<String> {
    store
        .get_payload(pid)
        .expect("read")
        .map(|p| String::from_utf8(p.body.to_vec()).expect("utf8"))
}

#[tokio::test]
async fn submitted_changes_are_visible_at_once_and_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    let mut t = Txn::new();
    t.put_payload(1, payload(1));
    t.put_payload(2, payload(2));
    let c = store.submit(t);
    assert_eq!(
        body(&store, 1).as_deref(),
        Some("body-1"),
        "memtable serves reads"
    );
    c.wait().await.expect("durable");
    let mut t = Txn::new();
    t.delete(Key::Payload(1));
    store.submit(t).wait().await.expect("durable");
    assert_eq!(body(&store, 1), None);
    store.close().expect("close");

    let (store, report) = Store::open(dir.path(), small_opts()).expect("reopen");
    assert_eq!(report.replayed, 0, "a clean close leaves nothing to replay");
    assert_eq!(body(&store, 1), None);
    assert_eq!(body(&store, 2).as_deref(), Some("body-2"));
}

#[tokio::test]
async fn a_crash_is_recovered_from_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = unapplied_opts();
    let (store, _) = Store::open(dir.path(), opts.clone()).expect("open");
    let mut commits = Vec::new();
    for i in 0..200u64 {
        let mut t = Txn::new();
        t.put_payload(i, payload(i));
        if i % 2 == 1 {
            t.delete(Key::Payload(i - 1));
        }
        t.put_counters(
            1,
            &CountersRecord {
                published: i + 1,
                ..CountersRecord::default()
            },
        );
        commits.push(store.submit(t));
    }
    for c in commits {
        c.wait().await.expect("durable");
    }
    assert_eq!(
        store.stats().applied_lsn,
        0,
        "nothing applied before the crash"
    );
    store.crash();

    // What a rebuild reads while the store opens is the replayed state.
    let (store, report, counters) = Store::open_with(dir.path(), opts, |r| {
        r.scan::<CountersRecord>(Space::Counters)
            .map(|c| c.expect("decodes").1.published)
            .collect::<Vec<_>>()
    })
    .expect("reopen");
    assert_eq!(report.replayed, 200);
    assert_eq!(counters, vec![200]);
    for i in 0..200u64 {
        let expect = (i % 2 == 1).then(|| format!("body-{i}"));
        assert_eq!(body(&store, i), expect, "pid {i}");
    }
    let counters: Vec<_> = store
        .reader()
        .scan::<CountersRecord>(Space::Counters)
        .collect();
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0].as_ref().expect("decodes").1.published, 200);
}

/// An empty transaction (the engine's wait for changes of other calls):
/// durable once every transaction before it is, and the log with it
/// replays after a crash, the transactions after it too.
#[tokio::test]
async fn an_empty_transaction_waits_for_those_before_it_and_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = unapplied_opts();
    let (store, _) = Store::open(dir.path(), opts.clone()).expect("open");
    let mut t = Txn::new();
    t.put_payload(1, payload(1));
    let first = store.submit(t);
    let empty = store.submit(Txn::new());
    assert!(empty.lsn() > first.lsn());
    empty.wait().await.expect("durable");
    assert!(
        durable_within(&store, first.lsn(), Duration::ZERO),
        "the transaction before it is durable"
    );
    first.wait().await.expect("durable");
    let mut t = Txn::new();
    t.put_payload(2, payload(2));
    store.submit(t).wait().await.expect("durable");
    store.crash();
    let (store, report) = Store::open(dir.path(), opts).expect("reopen");
    assert_eq!(report.replayed, 3);
    assert_eq!(body(&store, 1).as_deref(), Some("body-1"));
    assert_eq!(body(&store, 2).as_deref(), Some("body-2"));
}

/// Eight tasks at once, each submitting 50 transactions one after the
/// other and waiting for each: every one is durable and readable, and
/// they shared `fdatasync`s.
async fn eight_writers_share_fsyncs(store: Store) {
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for i in 0..50u64 {
                store
                    .submit(one_payload(w * 1000 + i))
                    .wait()
                    .await
                    .expect("durable");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let stats = store.stats();
    assert_eq!(stats.records, 400);
    assert!(stats.log_syncs < stats.records, "{stats:?}");
    for w in 0..8u64 {
        let pid = w * 1000 + 49;
        assert_eq!(body(&store, pid), Some(format!("body-{pid}")));
    }
}

#[tokio::test]
async fn concurrent_submissions_share_fsyncs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    eight_writers_share_fsyncs(store).await;
}

/// Waits up to `limit` for `lsn` to be durable, without waking the log
/// writer (unlike `LogWriter::wait_durable`).
fn durable_within(store: &Store, lsn: u64, limit: Duration) -> bool {
    store.backend.shared.log.durable_within(lsn, limit)
}

fn one_payload(i: u64) -> Txn {
    let mut t = Txn::new();
    t.put_payload(i, payload(i));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_alone_commits_its_own_transaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    for i in 0..20u64 {
        writer_asleep(&store).await;
        store.submit(one_payload(i)).wait().await.expect("durable");
    }
    let stats = store.stats();
    assert_eq!((stats.records, stats.log_syncs), (20, 20), "{stats:?}");
    // The first goes to the log writer; once callers are seen to come one
    // at a time, each commits its own (the log writer could only take one
    // on a spurious wake-up).
    assert!(stats.caller_commits >= 15, "{stats:?}");
    store.close().expect("close");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("reopen");
    for i in 0..20u64 {
        assert_eq!(body(&store, i), Some(format!("body-{i}")));
    }
}

/// Waits until the log writer thread sleeps: one that is still awake
/// after its last commit takes whatever is queued, so a test counting the
/// commits callers make waits for it before each submission.
async fn writer_asleep(store: &Store) {
    let until = Instant::now() + Duration::from_secs(10);
    while !store.backend.shared.submission.writer_waiting() {
        assert!(Instant::now() < until, "the log writer never went to sleep");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// A store that applies nothing meanwhile (the applier's wait for
/// durability would wake the log writer too), after three callers one at a
/// time: quiet, so the next submissions do not wake the log writer
/// themselves.
async fn quiet_store(dir: &std::path::Path) -> Store {
    let opts = StoreOptions {
        apply_interval: Duration::from_secs(3600),
        ..small_opts()
    };
    let (store, _) = Store::open(dir, opts).expect("open");
    for i in 0..3u64 {
        writer_asleep(&store).await;
        store.submit(one_payload(i)).wait().await.expect("durable");
    }
    assert!(store.backend.shared.submission.is_quiet());
    store
}

/// A caller that holds one transaction while it submits and waits for a
/// second (a subscription's ack, then the lease its credit let go) commits
/// both itself, in one `fdatasync`, and callers stay one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_alone_commits_the_pair_it_submitted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = quiet_store(dir.path()).await;
    let before = store.stats();
    for i in 0..10u64 {
        writer_asleep(&store).await;
        let held = store.submit(one_payload(100 + 2 * i));
        store
            .submit(one_payload(101 + 2 * i))
            .wait()
            .await
            .expect("durable");
        assert!(durable_within(&store, held.lsn(), Duration::ZERO));
        held.wait().await.expect("durable");
    }
    let after = store.stats();
    assert_eq!(after.records - before.records, 20, "{after:?}");
    assert_eq!(after.log_syncs - before.log_syncs, 10, "{after:?}");
    assert!(
        after.caller_commits - before.caller_commits >= 9,
        "{after:?}"
    );
    assert!(store.backend.shared.submission.is_quiet());
    // Three at once are more than a caller takes on: the log writer groups
    // them.
    let (a, b) = (
        store.submit(one_payload(200)),
        store.submit(one_payload(201)),
    );
    let commits = store.stats().caller_commits;
    store
        .submit(one_payload(202))
        .wait()
        .await
        .expect("durable");
    assert_eq!(store.stats().caller_commits, commits);
    a.wait().await.expect("durable");
    b.wait().await.expect("durable");
    for i in (100..120).chain(200..203) {
        assert_eq!(body(&store, i), Some(format!("body-{i}")));
    }
}

/// Where callers may commit alone (tokio's multi-thread runtime), callers
/// arriving together are still grouped by the log writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_arriving_together_are_grouped_by_the_log_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    eight_writers_share_fsyncs(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_not_waited_for_are_made_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = quiet_store(dir.path()).await;
    // Dropped without waiting.
    let lsn = store.submit(one_payload(10)).lsn();
    assert!(durable_within(&store, lsn, Duration::from_secs(10)));
    // Held while another is waited for: both go in one group.
    writer_asleep(&store).await;
    let held = store.submit(one_payload(11));
    let syncs = store.stats().log_syncs;
    store.submit(one_payload(12)).wait().await.expect("durable");
    assert!(durable_within(&store, held.lsn(), Duration::ZERO));
    assert_eq!(store.stats().log_syncs, syncs + 1);
    held.wait().await.expect("durable");
    // A wait cancelled before it committed (at its yield), callers one at
    // a time again first.
    for i in 20..22u64 {
        store.submit(one_payload(i)).wait().await.expect("durable");
    }
    assert!(store.backend.shared.submission.is_quiet());
    let lsn = {
        let c = store.submit(one_payload(13));
        let lsn = c.lsn();
        let mut wait = std::pin::pin!(c.wait());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(wait.as_mut(), &mut cx).is_pending());
        lsn
    };
    assert!(durable_within(&store, lsn, Duration::from_secs(10)));
    for i in [10, 11, 12, 13] {
        assert_eq!(body(&store, i), Some(format!("body-{i}")));
    }
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_store, _) = Store::open(dir.path(), small_opts()).expect("open");
    let err = Store::open(dir.path(), small_opts()).expect_err("locked");
    assert!(matches!(err, StorageError::Locked { .. }), "{err}");
}

#[tokio::test]
async fn submissions_after_close_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), small_opts()).expect("open");
    store.backend.shared.fail(StorageError::Stopped {
        reason: "test".into(),
    });
    let mut t = Txn::new();
    t.put_payload(1, payload(1));
    assert!(store.submit(t).wait().await.is_err());
    assert_eq!(
        store.failure().borrow().as_deref(),
        Some("storage stopped: test")
    );
}

/// A segment's place in the log is durable before any record in it is
/// answered: by the time a commit into a segment resolves, `CHECKPOINT`
/// lists that segment with the lsn of its first record.
#[tokio::test]
async fn a_segment_is_listed_with_its_first_record_before_its_records_are_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), unapplied_opts()).expect("open");
    let listed = || {
        checkpoint::read(dir.path())
            .expect("checkpoint")
            .sizes
            .into_iter()
            .map(|s| (s.number, s.first))
            .collect::<Vec<_>>()
    };
    let start = listed();
    assert_eq!(start.len(), 1, "{start:?}");
    assert_eq!(start[0].1, None, "no record yet: {start:?}");
    let first = store.submit(one_payload(1));
    let lsn = first.lsn();
    first.wait().await.expect("durable");
    assert_eq!(listed(), vec![(start[0].0, Some(lsn))]);
    // Payloads larger than a 64 KiB segment's room move the log on: each
    // new segment is listed once its commit resolves.
    for i in 2..12u64 {
        let mut t = Txn::new();
        t.put_payload(
            i,
            encode_payload(&PayloadRecord::new(
                i,
                vec![],
                Bytes::from(vec![7u8; 40 << 10]),
            )),
        );
        let c = store.submit(t);
        let lsn = c.lsn();
        c.wait().await.expect("durable");
        let now = listed();
        let (_, first) = *now.last().expect("listed");
        assert!(first.is_some_and(|f| f <= lsn), "{now:?} after lsn {lsn}");
    }
    assert!(listed().len() >= 5, "{:?}", listed());
    store.close().expect("close");
}

mod sled_scans {
    //! sled's iterator (patched: a forward step reads the next key of its
    //! leaf by index, vendor/sled/PATCHED.md) against a `BTreeMap`: the
    //! same keys in the same order, forward, backward and both ways,
    //! within prefixes and ranges, over trees whose leaves have split and
    //! merged.

    use std::collections::BTreeMap;
    use std::ops::Bound;

    use proptest::prelude::*;

    fn key(prefix: u8, n: u16) -> Vec<u8> {
        let mut k = vec![prefix];
        k.extend_from_slice(&n.to_be_bytes());
        k
    }

    #[derive(Debug, Clone)]
    enum Step {
        Next,
        Back,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn scans_see_what_a_sorted_map_holds(
            puts in proptest::collection::vec((0u8..3, 0u16..600), 0..400),
            deletes in proptest::collection::vec((0u8..3, 0u16..600), 0..300),
            prefix in 0u8..3,
            lo in 0u16..600,
            span in 0u16..600,
            steps in proptest::collection::vec(prop_oneof![3 => Just(Step::Next), 1 => Just(Step::Back)], 0..300),
        ) {
            let db = sled::Config::new().temporary(true).open().expect("open");
            let mut model = BTreeMap::new();
            for (p, n) in &puts {
                let k = key(*p, *n);
                db.insert(&k, k.repeat(3)).expect("insert");
                model.insert(k.clone(), k.repeat(3));
            }
            for (p, n) in &deletes {
                let k = key(*p, *n);
                db.remove(&k).expect("remove");
                model.remove(&k);
            }
            // A whole prefix, forward and backward.
            let got: Vec<_> = db
                .scan_prefix([prefix])
                .map(|r| r.expect("item"))
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect();
            let want: Vec<_> = model
                .range(key(prefix, 0)..=key(prefix, u16::MAX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            prop_assert_eq!(&got, &want);
            let back: Vec<_> = db
                .scan_prefix([prefix])
                .rev()
                .map(|r| r.expect("item").0.to_vec())
                .collect();
            let want_back: Vec<_> = want.iter().rev().map(|(k, _)| k.clone()).collect();
            prop_assert_eq!(back, want_back);
            // A range with bounds inside the keys, walked both ways at
            // once: every key once, in order from each end.
            let (a, b) = (key(prefix, lo), key(prefix, lo.saturating_add(span)));
            let mut iter = db.range(a.clone()..b.clone());
            let mut window: std::collections::VecDeque<Vec<u8>> = model
                .range::<Vec<u8>, _>((Bound::Included(a), Bound::Excluded(b)))
                .map(|(k, _)| k.clone())
                .collect();
            for step in &steps {
                let (got, want) = match step {
                    Step::Next => (iter.next(), window.pop_front()),
                    Step::Back => (iter.next_back(), window.pop_back()),
                };
                prop_assert_eq!(got.map(|r| r.expect("item").0.to_vec()), want);
            }
            let rest: Vec<_> = iter.map(|r| r.expect("item").0.to_vec()).collect();
            prop_assert_eq!(rest, Vec::from(window));
        }
    }
}
