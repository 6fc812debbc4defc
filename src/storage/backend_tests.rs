//! The [`Backend`] contract, written once over `&dyn Backend` and run
//! against the local backend (a data directory): atomic transactions,
//! deletes and overwrites, scans in key order within their bounds, many
//! concurrent submitters, a large value, and a reopen.

use std::sync::Arc;

use bytes::Bytes;

use super::backend::{Backend, prefix_end, scan_all};
use super::keys::{Key, Space};
use super::{Store, StoreOptions, Txn};

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
}

/// The whole contract against `backend`; returns the large value.
async fn contract(backend: Arc<dyn Backend>) -> Bytes {
    atomic_multi_key(&*backend).await;
    delete_and_overwrite(&*backend).await;
    scans_in_order_within_bounds(&*backend).await;
    concurrent_submitters(Arc::clone(&backend)).await;
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
    super::apply::apply_once(&store.backend.inner).expect("apply");
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
