//! The [`Backend`] contract, written once over `&dyn Backend` and run
//! against the local backend (a data directory) and the PostgreSQL
//! backend (a PostgreSQL of the test's own, see `pg::harness`; skipped
//! without PostgreSQL unless LETTERBOX_REQUIRE_ECOSYSTEM=1): atomic
//! transactions, deletes and overwrites, scans in key order within their
//! bounds, many concurrent submitters, a large value, and a reopen. Then
//! what only the PostgreSQL backend has: its lease, its fence, chunks,
//! and scans over changes not yet committed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::backend::{Backend, prefix_end, scan_all};
use super::keys::{Key, Space};
use super::pg::harness::{LocalPg, session_waiting, set_sync_standby};
use super::pg::{PgError, PgState};
use super::{PgBackend, PgBackendOptions, StorageError, Store, StoreOptions, Txn};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn opts() -> StoreOptions {
    StoreOptions {
        segment_size: 256 << 10,
        apply_interval: std::time::Duration::from_millis(20),
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

/// Keys and values of a prefix, as strings of the values.
fn values(backend: &dyn Backend, prefix: &[u8]) -> Vec<Bytes> {
    scan_all(backend, prefix, 2)
        .expect("scan")
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// Several keys of several spaces in one transaction: all there at once,
/// before and after they are durable.
async fn atomic_multi_key(backend: &dyn Backend) {
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("c1"));
    t.put(Key::Meta(1, 1), b("m11"));
    t.put(Key::Payload(1), b("p1"));
    let c = backend.submit(t);
    for (k, v) in [
        (Key::Counters(1), "c1"),
        (Key::Meta(1, 1), "m11"),
        (Key::Payload(1), "p1"),
    ] {
        assert_eq!(backend.get(&k.encode()).expect("get"), Some(b(v)));
    }
    c.wait().await.expect("durable");
    assert_eq!(
        backend.get(&Key::Payload(1).encode()).expect("get"),
        Some(b("p1"))
    );
    assert_eq!(backend.get(&Key::Payload(2).encode()).expect("get"), None);
}

/// A delete removes a key; an overwrite replaces it; the last change of a
/// key within one transaction wins.
async fn delete_and_overwrite(backend: &dyn Backend) {
    let mut t = Txn::new();
    t.put(Key::Counters(2), b("first"));
    t.put(Key::Counters(3), b("doomed"));
    backend.submit(t).wait().await.expect("durable");
    let mut t = Txn::new();
    t.put(Key::Counters(2), b("second"));
    t.delete(Key::Counters(3));
    t.put(Key::Counters(4), b("x"));
    t.put(Key::Counters(4), b("y"));
    backend.submit(t).wait().await.expect("durable");
    assert_eq!(
        backend.get(&Key::Counters(2).encode()).expect("get"),
        Some(b("second"))
    );
    assert_eq!(backend.get(&Key::Counters(3).encode()).expect("get"), None);
    assert_eq!(
        backend.get(&Key::Counters(4).encode()).expect("get"),
        Some(b("y"))
    );
}

/// Scans return keys in order, from `start` inclusive to `end` exclusive,
/// at most `limit` of them, with deletes and overwrites seen, whether the
/// changes are durable or only submitted.
async fn scans_in_order_within_bounds(backend: &dyn Backend) {
    let mut t = Txn::new();
    for pos in [5u64, 1, 9, 3, 7] {
        t.put(Key::Meta(7, pos), b(&format!("m{pos}")));
    }
    t.put(Key::Meta(6, 1), b("other queue"));
    t.put(Key::Meta(8, 1), b("other queue"));
    backend.submit(t).wait().await.expect("durable");
    // Not yet durable when scanned: a delete, an overwrite and a new key.
    let mut t = Txn::new();
    t.delete(Key::Meta(7, 3));
    t.put(Key::Meta(7, 5), b("m5'"));
    t.put(Key::Meta(7, 4), b("m4"));
    let c = backend.submit(t);
    let all = values(backend, &Space::MetasOf(7).prefix());
    assert_eq!(all, vec![b("m1"), b("m4"), b("m5'"), b("m7"), b("m9")]);
    // Bounds: [4, 9) holds 4, 5 and 7; a limit cuts the page.
    let (start, end) = (Key::Meta(7, 4).encode(), Key::Meta(7, 9).encode());
    let keys: Vec<Bytes> = backend
        .scan(&start, Some(&end), 10)
        .expect("scan")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        vec![
            Key::Meta(7, 4).encode(),
            Key::Meta(7, 5).encode(),
            Key::Meta(7, 7).encode()
        ]
    );
    let page = backend.scan(&start, Some(&end), 2).expect("scan");
    assert_eq!(page.len(), 2);
    assert_eq!(page[1].0, Key::Meta(7, 5).encode());
    assert!(
        backend
            .scan(&start, Some(&end), 0)
            .expect("scan")
            .is_empty()
    );
    // Unbounded above: from the last queue's first key to the end of the
    // key space, nothing of queue 7 and everything after it.
    let from8 = backend
        .scan(&Key::Meta(8, 0).encode(), None, 1000)
        .expect("scan");
    assert_eq!(
        from8.first().map(|(k, _)| k.clone()),
        Some(Key::Meta(8, 1).encode())
    );
    assert!(from8.windows(2).all(|w| w[0].0 < w[1].0), "in key order");
    c.wait().await.expect("durable");
    assert_eq!(
        values(backend, &Space::MetasOf(7).prefix()),
        vec![b("m1"), b("m4"), b("m5'"), b("m7"), b("m9")]
    );
    assert!(prefix_end(&[0xff, 0xff]).is_none());
}

/// Many submitters at once: every transaction durable, none lost, each
/// readable.
async fn concurrent_submitters(backend: Arc<dyn Backend>) {
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let backend = Arc::clone(&backend);
        tasks.push(tokio::spawn(async move {
            let mut t = Txn::new();
            t.put(Key::Payload(1000 + i), b(&format!("body {i}")));
            t.put(Key::Meta(9, i), b(&format!("meta {i}")));
            backend.submit(t).wait().await
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("durable");
    }
    assert_eq!(values(&*backend, &Space::MetasOf(9).prefix()).len(), 200);
    for i in [0u64, 99, 199] {
        assert_eq!(
            backend.get(&Key::Payload(1000 + i).encode()).expect("get"),
            Some(b(&format!("body {i}")))
        );
    }
}

/// A value far over any backend's value limit comes back whole, from a
/// read and from a scan.
async fn large_value(backend: &dyn Backend) -> Bytes {
    let big: Bytes = (0..(1 << 20) + 12_345)
        .map(|i: u32| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut t = Txn::new();
    t.put(Key::Payload(77), big.clone());
    backend.submit(t).wait().await.expect("durable");
    assert_eq!(
        backend.get(&Key::Payload(77).encode()).expect("get"),
        Some(big.clone())
    );
    let start = Key::Payload(77).encode();
    let got = backend.scan(&start, None, 1).expect("scan");
    assert_eq!(got, vec![(start, big.clone())]);
    big
}

/// The values of `keys` read together.
fn many(backend: &dyn Backend, keys: &[Key<'_>]) -> Vec<Option<Bytes>> {
    let keys: Vec<Bytes> = keys.iter().map(Key::encode).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
    backend.get_many(&refs).expect("get_many")
}

/// The value of `Payload(203)`: over the PostgreSQL tests' chunk size.
fn value_203() -> Bytes {
    (0..100_000u32)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Several keys read at once: answered in the order asked, `None` for a
/// key never written and for one deleted, a key asked twice answered
/// twice, keys of every space, a value over the chunk size whole; the
/// same at once and once durable; no keys, no values.
async fn get_many_in_order(backend: &dyn Backend) {
    let mut t = Txn::new();
    t.put(Key::Meta(20, 1), b("m1"));
    t.put(Key::Payload(201), b("p201"));
    t.put(Key::Counters(20), b("c20"));
    t.put(Key::Payload(202), b("p202"));
    backend.submit(t).wait().await.expect("durable");
    let big = value_203();
    let mut t = Txn::new();
    t.put(Key::Payload(203), big.clone());
    t.delete(Key::Payload(202));
    let c = backend.submit(t);
    let keys = [
        Key::Payload(203),
        Key::Meta(20, 1),
        Key::Payload(999),
        Key::Payload(202),
        Key::Counters(20),
        Key::Payload(201),
        Key::Meta(20, 1),
    ];
    let want = vec![
        Some(big),
        Some(b("m1")),
        None,
        None,
        Some(b("c20")),
        Some(b("p201")),
        Some(b("m1")),
    ];
    assert_eq!(many(backend, &keys), want, "at once");
    c.wait().await.expect("durable");
    assert_eq!(many(backend, &keys), want, "once durable");
    assert!(many(backend, &[]).is_empty());
}

/// What the contract leaves behind, checked again after a reopen.
fn after_reopen(backend: &dyn Backend, big: &Bytes) {
    assert_eq!(
        backend.get(&Key::Counters(2).encode()).expect("get"),
        Some(b("second"))
    );
    assert_eq!(backend.get(&Key::Counters(3).encode()).expect("get"), None);
    assert_eq!(
        values(backend, &Space::MetasOf(7).prefix()),
        vec![b("m1"), b("m4"), b("m5'"), b("m7"), b("m9")]
    );
    assert_eq!(values(backend, &Space::MetasOf(9).prefix()).len(), 200);
    assert_eq!(
        backend.get(&Key::Payload(77).encode()).expect("get"),
        Some(big.clone())
    );
    assert_eq!(
        many(
            backend,
            &[
                Key::Counters(3),
                Key::Payload(77),
                Key::Counters(2),
                Key::Payload(203)
            ]
        ),
        vec![
            None,
            Some(big.clone()),
            Some(b("second")),
            Some(value_203())
        ]
    );
}

/// The whole contract against `backend`; returns the large value.
async fn contract(backend: Arc<dyn Backend>) -> Bytes {
    atomic_multi_key(&*backend).await;
    delete_and_overwrite(&*backend).await;
    scans_in_order_within_bounds(&*backend).await;
    concurrent_submitters(Arc::clone(&backend)).await;
    get_many_in_order(&*backend).await;
    large_value(&*backend).await
}

/// The local backend as a shared trait object (a store's backend, moved
/// out of it).
fn local(dir: &std::path::Path) -> Arc<dyn Backend> {
    let (store, _) = Store::open(dir, opts()).expect("open");
    Arc::new(store.backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_backend_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let big = contract(Arc::clone(&backend)).await;
    backend.close().expect("close");
    drop(backend);
    let backend = local(dir.path());
    after_reopen(&*backend, &big);
    backend.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_scan_merges_the_memtable_over_the_database() {
    // Changes applied to the database, then changes submitted after them
    // (in the memtable until the applier takes them): a scan sees the
    // later ones over the earlier.
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), opts()).expect("open");
    let mut t = Txn::new();
    for pos in 0..10u64 {
        t.put(Key::Meta(3, pos), b(&format!("old {pos}")));
    }
    store.submit(t).wait().await.expect("durable");
    store.backend().apply_now().expect("apply");
    let mut t = Txn::new();
    t.delete(Key::Meta(3, 0));
    t.delete(Key::Meta(3, 9));
    t.put(Key::Meta(3, 4), b("new 4"));
    t.put(Key::Meta(3, 10), b("new 10"));
    store.submit(t).wait().await.expect("durable");
    let got = values(store.backend(), &Space::MetasOf(3).prefix());
    let want: Vec<Bytes> = (1..9u64)
        .map(|p| {
            if p == 4 {
                b("new 4")
            } else {
                b(&format!("old {p}"))
            }
        })
        .chain([b("new 10")])
        .collect();
    assert_eq!(got, want);
    store.close().expect("close");
}

const TTL: Duration = Duration::from_secs(30);

/// The PostgreSQL backend of shard 3 on `pg` under node name `node`,
/// with small batches and chunks (the large value spans many), and no
/// recent bodies kept in memory (every read past the overlay goes to
/// PostgreSQL).
fn pg_open(pg: &LocalPg, node: &str, ttl: Duration, chunk: usize) -> super::Result<PgBackend> {
    pg_open_keeping(pg, node, ttl, chunk, 0)
}

/// [`pg_open`], keeping up to `recent_bytes` of committed bodies.
fn pg_open_keeping(
    pg: &LocalPg,
    node: &str,
    ttl: Duration,
    chunk: usize,
    recent_bytes: usize,
) -> super::Result<PgBackend> {
    PgBackend::open(
        &pg.url(),
        PgBackendOptions {
            shard: 3,
            node: node.into(),
            lease_ttl: ttl,
            max_batch_bytes: 64 << 10,
            chunk_size: chunk,
            recent_bytes,
        },
    )
}

/// A plain connection to `pg`, for looking at its tables.
async fn sql(pg: &LocalPg) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c
}

/// Rows of `lb_chunk`.
async fn chunk_rows(c: &tokio_postgres::Client) -> i64 {
    c.query_one("SELECT count(*) FROM lb_chunk", &[])
        .await
        .expect("count")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_backend_keeps_the_contract() {
    let Some(pg) = LocalPg::start("the_postgres_backend_keeps_the_contract") else {
        return;
    };
    let chunk = 16 << 10;
    let backend: Arc<dyn Backend> = Arc::new(pg_open(&pg, "a", TTL, chunk).expect("open"));
    let big = contract(Arc::clone(&backend)).await;
    let last = backend.submit(Txn::new());
    let last_lsn = last.lsn();
    last.wait().await.expect("durable");
    // The large values are in chunks, and the overlay is empty once all
    // is committed: what follows is read from PostgreSQL.
    let c = sql(&pg).await;
    assert_eq!(
        chunk_rows(&c).await,
        i64::try_from(big.len().div_ceil(chunk) + value_203().len().div_ceil(chunk))
            .expect("count")
    );
    after_reopen(&*backend, &big);
    backend.close().expect("close");
    backend.close().expect("close again");
    drop(backend);
    // Another node takes the shard at once: the lease was released.
    let backend = pg_open(&pg, "b", TTL, chunk).expect("reopen");
    assert_eq!(backend.epoch(), 2);
    after_reopen(&backend, &big);
    let next = backend.submit(Txn::new());
    assert_eq!(
        next.lsn(),
        last_lsn + 1,
        "lsns go on from the commit marker"
    );
    next.wait().await.expect("durable");
    backend.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_owner_is_refused_naming_the_holder() {
    let Some(pg) = LocalPg::start("a_second_owner_is_refused_naming_the_holder") else {
        return;
    };
    let a = pg_open(&pg, "node-a", TTL, 1024).expect("open");
    let err = pg_open(&pg, "node-b", TTL, 1024).expect_err("held");
    let text = err.to_string();
    match &err {
        StorageError::Pg(PgError::Held { shard, holder }) => {
            assert_eq!(*shard, 3);
            assert_eq!(holder.node, "node-a");
            assert_eq!(holder.epoch, a.epoch());
            assert!(holder.remaining > TTL - Duration::from_secs(10), "{text}");
        }
        other => panic!("not refused for the lease: {other}"),
    }
    assert!(
        text.contains("node-a") && text.contains("epoch 1"),
        "{text}"
    );
    // The holder goes on committing.
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("still mine"));
    a.submit(t).wait().await.expect("durable");
    a.close().expect("close");
    let b_ = pg_open(&pg, "node-b", TTL, 1024).expect("released");
    assert_eq!(b_.epoch(), 2);
    assert_eq!(
        b_.get(&Key::Counters(1).encode()).expect("get"),
        Some(b("still mine"))
    );
    b_.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_whose_lease_was_taken_over_is_fenced_and_stops() {
    let Some(pg) = LocalPg::start("a_backend_whose_lease_was_taken_over_is_fenced_and_stops")
    else {
        return;
    };
    let a = pg_open(&pg, "a", Duration::from_secs(1), 1024).expect("open");
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("a1"));
    a.submit(t).wait().await.expect("durable");
    let mut failure = a.failure();
    assert!(failure.borrow().is_none());
    // A stalls: its lease lapses and another node takes the shard.
    a.pause_renewal();
    let other = PgState::connect(&pg.url(), 3).await.expect("connect");
    let mut tries = 0;
    let fb = loop {
        match other.acquire("b", TTL).await.expect("acquire") {
            Ok(fence) => break fence,
            Err(holder) => {
                assert_eq!(holder.node, "a");
                tries += 1;
                assert!(tries < 100, "the lease never lapsed: {holder:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(fb.epoch, a.epoch() + 1);
    // A's next commit is refused by the fence and A stops.
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("stale"));
    let err = a.submit(t).wait().await.expect_err("fenced");
    let text = err.to_string();
    assert!(
        text.contains("ownership lost") && text.contains("epoch 1") && text.contains("now 2"),
        "{text}"
    );
    tokio::time::timeout(Duration::from_secs(5), failure.wait_for(Option::is_some))
        .await
        .expect("in time")
        .expect("failure");
    assert_eq!(
        failure.borrow().as_deref(),
        Some(text.trim_start_matches("storage stopped: "))
    );
    let mut t = Txn::new();
    t.put(Key::Counters(2), b("later"));
    a.submit(t).wait().await.expect_err("stopped for good");
    // Nothing of A's after the takeover is in the database.
    assert_eq!(
        other.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b("a1"))
    );
    assert_eq!(
        other.get(&Key::Counters(2).encode()).await.expect("get"),
        None
    );
    let err = a.close().expect_err("close says why it stopped");
    assert!(err.to_string().contains("ownership lost"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_of_a_replaced_or_deleted_value_are_removed() {
    let Some(pg) = LocalPg::start("chunks_of_a_replaced_or_deleted_value_are_removed") else {
        return;
    };
    let c = sql(&pg).await;
    let backend = pg_open(&pg, "a", TTL, 1000).expect("open");
    let big: Bytes = (0..10_500u32)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<u8>>()
        .into();
    let key = Key::Payload(5).encode();
    let mut t = Txn::new();
    t.put(Key::Payload(5), big.clone());
    t.put(Key::Payload(6), b("small"));
    backend.submit(t).wait().await.expect("durable");
    assert_eq!(chunk_rows(&c).await, 11);
    assert_eq!(backend.get(&key).expect("get"), Some(big.clone()));
    let page = backend.scan(&key, None, 10).expect("scan");
    assert_eq!(
        page,
        vec![
            (key.clone(), big.clone()),
            (Key::Payload(6).encode(), b("small"))
        ]
    );
    // Overwritten by a small value: no chunk left.
    let mut t = Txn::new();
    t.put(Key::Payload(5), b("now small"));
    backend.submit(t).wait().await.expect("durable");
    assert_eq!(chunk_rows(&c).await, 0);
    assert_eq!(backend.get(&key).expect("get"), Some(b("now small")));
    // Large again, then deleted.
    let mut t = Txn::new();
    t.put(Key::Payload(5), big.slice(..2500));
    backend.submit(t).wait().await.expect("durable");
    assert_eq!(chunk_rows(&c).await, 3);
    assert_eq!(backend.get(&key).expect("get"), Some(big.slice(..2500)));
    let mut t = Txn::new();
    t.delete(Key::Payload(5));
    backend.submit(t).wait().await.expect("durable");
    assert_eq!(chunk_rows(&c).await, 0);
    assert_eq!(backend.get(&key).expect("get"), None);
    backend.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_read_past_rows_hidden_by_changes_not_yet_committed() {
    let Some(pg) = LocalPg::start("scans_read_past_rows_hidden_by_changes_not_yet_committed")
    else {
        return;
    };
    let backend = pg_open(&pg, "a", TTL, 1024).expect("open");
    let mut t = Txn::new();
    for pos in 0..12u64 {
        t.put(Key::Meta(4, pos), b(&format!("m{pos}")));
    }
    backend.submit(t).wait().await.expect("durable");
    // Another session holds a row the next commit writes: the commit
    // waits, and its changes stay in the overlay meanwhile.
    let blocker = sql(&pg).await;
    blocker
        .batch_execute("BEGIN; SELECT * FROM lb_meta FOR UPDATE")
        .await
        .expect("lock");
    let mut t = Txn::new();
    for pos in 0..9u64 {
        t.delete(Key::Meta(4, pos));
    }
    t.put(Key::Meta(4, 10), b("m10'"));
    let c = backend.submit(t);
    let prefix = Space::MetasOf(4).prefix();
    let end = prefix_end(&prefix);
    // Nine rows of PostgreSQL are hidden: a page of two still has two,
    // and a page of four only three (the end of the range).
    let page = backend.scan(&prefix, end.as_deref(), 2).expect("scan");
    assert_eq!(
        page,
        vec![
            (Key::Meta(4, 9).encode(), b("m9")),
            (Key::Meta(4, 10).encode(), b("m10'"))
        ]
    );
    let page = backend.scan(&prefix, end.as_deref(), 4).expect("scan");
    assert_eq!(page.len(), 3);
    assert_eq!(page[2], (Key::Meta(4, 11).encode(), b("m11")));
    assert_eq!(backend.get(&Key::Meta(4, 0).encode()).expect("get"), None);
    blocker.batch_execute("ROLLBACK").await.expect("unlock");
    c.wait().await.expect("durable");
    assert_eq!(
        values(&backend, &prefix),
        vec![b("m9"), b("m10'"), b("m11")]
    );
    backend.close().expect("close");
}

/// Several keys read at once over changes not yet committed: keys the
/// overlay deletes are absent though PostgreSQL still has their rows, a
/// key it overwrites has its new value, the others (inline and in chunks)
/// are read from PostgreSQL, in pages of several queries (`MAX_READ` is 3
/// in tests). The same once the changes are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_many_reads_past_rows_hidden_by_changes_not_yet_committed() {
    let Some(pg) = LocalPg::start("get_many_reads_past_rows_hidden_by_changes_not_yet_committed")
    else {
        return;
    };
    let backend = pg_open(&pg, "a", TTL, 1024).expect("open");
    let big: Bytes = (0..5000u32)
        .map(|i| (i % 7) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut t = Txn::new();
    for pos in 0..6u64 {
        t.put(Key::Meta(5, pos), b(&format!("m{pos}")));
    }
    t.put(Key::Payload(50), big.clone());
    t.put(Key::Payload(51), big.clone());
    backend.submit(t).wait().await.expect("durable");
    let c = sql(&pg).await;
    assert_eq!(chunk_rows(&c).await, 10, "two values of five chunks");
    // Another session holds the rows the next commit writes: the commit
    // waits, and its changes stay in the overlay meanwhile.
    c.batch_execute("BEGIN; SELECT * FROM lb_meta FOR UPDATE")
        .await
        .expect("lock");
    let mut t = Txn::new();
    t.delete(Key::Meta(5, 0));
    t.delete(Key::Meta(5, 3));
    t.put(Key::Meta(5, 4), b("m4'"));
    t.delete(Key::Payload(51));
    let commit = backend.submit(t);
    let keys: Vec<Key<'_>> = (0..6u64)
        .map(|pos| Key::Meta(5, pos))
        .chain([Key::Payload(50), Key::Payload(51), Key::Payload(52)])
        .collect();
    let want = vec![
        None,
        Some(b("m1")),
        Some(b("m2")),
        None,
        Some(b("m4'")),
        Some(b("m5")),
        Some(big),
        None,
        None,
    ];
    assert_eq!(many(&backend, &keys), want, "over the overlay");
    let rows: i64 = sql(&pg)
        .await
        .query_one("SELECT count(*) FROM lb_meta", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 6, "the deletes are not committed yet");
    c.batch_execute("ROLLBACK").await.expect("unlock");
    commit.wait().await.expect("durable");
    assert_eq!(many(&backend, &keys), want, "committed");
    assert_eq!(
        chunk_rows(&c).await,
        5,
        "the deleted value's chunks are gone"
    );
    backend.close().expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_commit_outcome_is_settled_and_the_backend_goes_on() {
    let Some(pg) = LocalPg::start("an_unknown_commit_outcome_is_settled_and_the_backend_goes_on")
    else {
        return;
    };
    let url = pg.url();
    let monitor = sql(&pg).await;
    let backend = pg_open(&pg, "a", TTL, 1024).expect("open");
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("one"));
    backend.submit(t).wait().await.expect("durable");
    // A synchronous standby that never answers holds the COMMIT; the
    // session is then cut off: the committer cannot know the outcome.
    set_sync_standby(&monitor, &url, "'nobody'").await;
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("two"));
    let c = backend.submit(t);
    let pid = session_waiting(&monitor, "COMMIT", "SyncRep").await;
    monitor
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    set_sync_standby(&monitor, &url, "''").await;
    // Settled by the commit marker on a new connection: durable.
    tokio::time::timeout(Duration::from_secs(20), c.wait())
        .await
        .expect("in time")
        .expect("settled as committed");
    assert!(backend.failure().borrow().is_none());
    assert_eq!(
        backend.get(&Key::Counters(1).encode()).expect("get"),
        Some(b("two"))
    );
    // The new connection commits what comes next.
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("three"));
    backend.submit(t).wait().await.expect("durable");
    let other = PgState::connect(&url, 3).await.expect("connect");
    assert_eq!(
        other.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b("three"))
    );
    backend.close().expect("close");
}

/// Ends the session `pid` of `pg` and waits until it is gone.
async fn cut(monitor: &tokio_postgres::Client, pid: i32) {
    let ended: bool = monitor
        .query_one("SELECT pg_terminate_backend($1, $2)", &[&pid, &10_000i64])
        .await
        .expect("terminate")
        .get(0);
    assert!(ended, "session {pid} still there");
}

/// The reading connection cut while the writing one lives: a read meets
/// the lost connection, is made again on a new one and answers; the
/// backend goes on. Then, with no connection to be had, a read that meets
/// the loss keeps trying until the lease runs out and the backend stops:
/// the read fails only with the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_a_lost_connection_is_made_again_until_the_lease_runs_out() {
    let Some(pg) =
        LocalPg::start("a_read_on_a_lost_connection_is_made_again_until_the_lease_runs_out")
    else {
        return;
    };
    let monitor = sql(&pg).await;
    // The renewals (on the reading connection) paused, so that only the
    // read finds the connection lost; the lease (6 s) runs from the open.
    let backend = pg_open(&pg, "a", Duration::from_secs(6), 1024).expect("open");
    backend.pause_renewal();
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("one"));
    backend.submit(t).wait().await.expect("durable");

    let reader = backend.reader_pid();
    cut(&monitor, reader).await;
    assert_eq!(
        backend
            .get(&Key::Counters(1).encode())
            .expect("read again on a new connection"),
        Some(b("one"))
    );
    assert!(backend.failure().borrow().is_none());
    assert_ne!(backend.reader_pid(), reader, "a new reading connection");
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("two"));
    backend.submit(t).wait().await.expect("the writer goes on");

    // No new session of the database can start: the read waits out the
    // lease, then the backend stops and the read fails, naming why.
    // (Said from another database: a session cannot close its own.)
    let url = pg.url();
    let (base, db) = url.rsplit_once('/').expect("a database in the URL");
    let (admin, conn) =
        tokio_postgres::connect(&format!("{base}/template1"), tokio_postgres::NoTls)
            .await
            .expect("connect to template1");
    tokio::spawn(conn);
    admin
        .batch_execute(&format!("ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS false"))
        .await
        .expect("no connections");
    cut(&monitor, backend.reader_pid()).await;
    let err = backend
        .get(&Key::Counters(1).encode())
        .expect_err("no read once the lease ran out");
    assert!(
        err.to_string()
            .contains("a read could not be made while the lease ran"),
        "{err}"
    );
    let stopped = backend.failure().borrow().clone();
    assert!(stopped.is_some_and(|r| r.contains("a read could not be made")));
    let mut t = Txn::new();
    t.put(Key::Counters(1), b("three"));
    backend
        .submit(t)
        .wait()
        .await
        .expect_err("a stopped backend commits nothing");
    admin
        .batch_execute(&format!("ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS true"))
        .await
        .expect("connections again");
    let other = PgState::connect(&pg.url(), 3).await.expect("connect");
    assert_eq!(
        other.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b("two"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_if_the_key_exists_follows_the_overlay_then_postgres() {
    let Some(pg) = LocalPg::start("a_put_if_the_key_exists_follows_the_overlay_then_postgres")
    else {
        return;
    };
    let backend = pg_open(&pg, "a", TTL, 1024).expect("open");
    let (p1, p2, p3, p4) = (
        Key::Payload(1).encode(),
        Key::Payload(2).encode(),
        Key::Payload(3).encode(),
        Key::Payload(4).encode(),
    );
    let mut t = Txn::new();
    t.put(Key::Payload(1), b("in pg"));
    t.put(Key::Payload(2), b("deleted later"));
    backend.submit(t).wait().await.expect("durable");
    // Held back: the deletion of 2 and the put of 4 stay in the overlay.
    let blocker = sql(&pg).await;
    blocker
        .batch_execute("BEGIN; SELECT * FROM lb_payload FOR UPDATE")
        .await
        .expect("lock");
    let mut t = Txn::new();
    t.delete(Key::Payload(2));
    t.put(Key::Payload(4), b("in the overlay"));
    let first = backend.submit(t);
    let mut t = Txn::new();
    for k in [&p1, &p2, &p3, &p4] {
        t.relocate(k.clone(), b("moved"));
    }
    let second = backend.submit(t);
    blocker.batch_execute("ROLLBACK").await.expect("unlock");
    first.wait().await.expect("durable");
    second.wait().await.expect("durable");
    assert_eq!(backend.get(&p1).expect("get"), Some(b("moved")));
    assert_eq!(backend.get(&p2).expect("get"), None);
    assert_eq!(backend.get(&p3).expect("get"), None);
    assert_eq!(backend.get(&p4).expect("get"), Some(b("moved")));
    backend.close().expect("close");
}

/// Bodies (and message records) kept in memory once committed are what
/// PostgreSQL holds: an overwrite or a delete is read at once and after
/// its commit, with a budget that holds them all and with one that holds
/// a single body (the rest evicted, read from PostgreSQL); a body too
/// large for the budget is not kept. The contract holds with the bodies
/// kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_bodies_kept_in_memory_follow_every_change() {
    let Some(pg) = LocalPg::start("committed_bodies_kept_in_memory_follow_every_change") else {
        return;
    };
    for (shard_node, budget) in [("kept-all", 1 << 20), ("kept-one", 40)] {
        let backend = pg_open_keeping(&pg, shard_node, TTL, 16 << 10, budget).expect("open");
        let c = sql(&pg).await;
        c.batch_execute("DELETE FROM lb_payload; DELETE FROM lb_chunk")
            .await
            .expect("clear");
        let get = |pid: u64| backend.get(&Key::Payload(pid).encode()).expect("get");
        let mut t = Txn::new();
        for pid in 1..=5 {
            t.put(Key::Payload(pid), b(&format!("body-{pid}")));
        }
        backend.submit(t).wait().await.expect("durable");
        for pid in 1..=5 {
            assert_eq!(get(pid), Some(b(&format!("body-{pid}"))), "{shard_node}");
        }
        let mut t = Txn::new();
        t.put(Key::Payload(2), b("two"));
        t.delete(Key::Payload(3));
        let commit = backend.submit(t);
        assert_eq!(
            get(2),
            Some(b("two")),
            "{shard_node}: the overwrite at once"
        );
        assert_eq!(get(3), None, "{shard_node}: the delete at once");
        commit.wait().await.expect("durable");
        assert_eq!(
            get(2),
            Some(b("two")),
            "{shard_node}: the overwrite once committed"
        );
        assert_eq!(get(3), None, "{shard_node}: the delete once committed");
        assert_eq!(
            many(
                &backend,
                &[
                    Key::Payload(1),
                    Key::Payload(2),
                    Key::Payload(3),
                    Key::Payload(4)
                ]
            ),
            vec![Some(b("body-1")), Some(b("two")), None, Some(b("body-4"))],
            "{shard_node}: read together, kept or not"
        );
        let rows: i64 = c
            .query_one("SELECT count(*) FROM lb_payload", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, 4, "{shard_node}");
        // A message record is kept too: once committed it is read from
        // memory (its row, removed behind the backend's back, is not
        // looked for), and a change replaces it at once.
        if budget > 1000 {
            let mut t = Txn::new();
            t.put(Key::Meta(8, 1), b("record"));
            backend.submit(t).wait().await.expect("durable");
            c.batch_execute("DELETE FROM lb_meta").await.expect("clear");
            let meta = || backend.get(&Key::Meta(8, 1).encode()).expect("get");
            assert_eq!(meta(), Some(b("record")), "{shard_node}: kept");
            let mut t = Txn::new();
            t.put(Key::Meta(8, 1), b("leased"));
            let commit = backend.submit(t);
            assert_eq!(meta(), Some(b("leased")), "{shard_node}: changed");
            commit.wait().await.expect("durable");
            assert_eq!(meta(), Some(b("leased")), "{shard_node}: committed");
            let mut t = Txn::new();
            t.delete(Key::Meta(8, 1));
            backend.submit(t).wait().await.expect("durable");
            assert_eq!(meta(), None, "{shard_node}: deleted");
        }
        // A body larger than the budget is stored and read back whole.
        let big = Bytes::from(vec![7u8; 64 << 10]);
        let mut t = Txn::new();
        t.put(Key::Payload(9), big.clone());
        backend.submit(t).wait().await.expect("durable");
        assert_eq!(get(9), Some(big), "{shard_node}");
        backend.close().expect("close");
    }
    sql(&pg)
        .await
        .batch_execute(
            "DELETE FROM lb_payload; DELETE FROM lb_chunk; DELETE FROM lb_meta; DELETE FROM lb_small",
        )
        .await
        .expect("clear");
    let backend: Arc<dyn Backend> =
        Arc::new(pg_open_keeping(&pg, "contract", TTL, 16 << 10, 1 << 20).expect("open"));
    contract(Arc::clone(&backend)).await;
    backend.close().expect("close");
}
