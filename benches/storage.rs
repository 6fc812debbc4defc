//! Criterion benchmarks of the storage hot paths: the log append with
//! group commit (`Store::submit` + `Commit::wait`, one and several
//! submitters, small and 1 KiB payloads, on a temporary directory, so on
//! the real disk with its `fdatasync`), and record encoding and decoding
//! (`records::encode`/`decode` of a `MetaRecord`, `encode_payload`, the
//! WAL frame and `decode_txn`).
//!
//! ```sh
//! cargo bench --bench storage                 # everything
//! cargo bench --bench storage -- codec        # encoding only (no disk)
//! cargo bench --bench storage -- commit/      # the log path only
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use letterbox::storage::records::{self, LeaseRecord, MetaRecord, PayloadRecord};
use letterbox::storage::wal::{self, Mutation};
use letterbox::storage::{Key, Store, StoreOptions, Txn, encode_payload};

const SMALL: usize = 16;
const KIB: usize = 1024;

fn meta(pid: u64, size: usize) -> MetaRecord {
    MetaRecord {
        pid,
        message_id: format!("01JABCDEF{pid:016}"),
        client_id: false,
        enqueued_at: 1_700_000_000_000,
        expires_at: 1_700_000_000_000 + 14 * 86_400_000,
        visible_at: 1_700_000_000_000,
        delivery_count: 1,
        failed_attempts: 0,
        lease: Some(LeaseRecord {
            epoch: 1,
            deadline: 1_700_000_030_000,
            started: 1_700_000_000_000,
        }),
        first_delivered_at: 1_700_000_000_000,
        attempts: Vec::new(),
        dead_letters: Vec::new(),
        group: None,
        size: u32::try_from(size).unwrap_or(u32::MAX),
        own_ttl: false,
    }
}

fn payload(size: usize) -> PayloadRecord {
    PayloadRecord::new(1_700_000_000_000, Vec::new(), Bytes::from(vec![b'x'; size]))
}

/// The transaction of one publish: its payload and its meta record.
fn publish_txn(pid: u64, encoded_payload: &Bytes, size: usize) -> Txn {
    let mut txn = Txn::new();
    txn.put_payload(pid, encoded_payload.clone());
    txn.put_new_meta(1, pid, &meta(pid, size));
    txn
}

fn open_store(dir: &std::path::Path) -> Store {
    let opts = StoreOptions {
        segment_size: 64 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    Store::open(dir, opts).expect("open store").0
}

/// One submitter: each publish waits for its own commit (one fsync each).
/// Several submitters: their transactions share fsyncs (group commit);
/// the time is per transaction.
fn commit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("commit");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for size in [SMALL, KIB] {
        for submitters in [1u64, 16, 256] {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = Arc::new(open_store(dir.path()));
            let encoded = encode_payload(&payload(size));
            let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
            g.throughput(Throughput::Elements(1));
            g.bench_function(
                BenchmarkId::new(format!("submit_wait/{size}B"), submitters),
                |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        rt.block_on(async {
                            let per = iters.div_ceil(submitters);
                            let mut tasks = tokio::task::JoinSet::new();
                            for _ in 0..submitters {
                                let (store, encoded, next) =
                                    (store.clone(), encoded.clone(), next.clone());
                                tasks.spawn(async move {
                                    for _ in 0..per {
                                        let pid =
                                            next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        let commit = store.submit(publish_txn(pid, &encoded, size));
                                        commit.wait().await.expect("commit");
                                    }
                                });
                            }
                            while let Some(r) = tasks.join_next().await {
                                r.expect("submitter");
                            }
                        });
                        // per transaction, `per * submitters` ≥ iters were run
                        let done = iters.div_ceil(submitters) * submitters;
                        start.elapsed().mul_f64(iters as f64 / done as f64)
                    })
                },
            );
            drop(store);
        }
    }
    g.finish();
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    let m = meta(42, KIB);
    let encoded_meta = records::encode(&m);
    g.bench_function("meta/encode", |b| b.iter(|| records::encode(black_box(&m))));
    g.bench_function("meta/decode", |b| {
        b.iter(|| records::decode::<MetaRecord>(&"meta", black_box(&encoded_meta)).expect("decode"))
    });
    for size in [SMALL, KIB] {
        let p = payload(size);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::new("payload/encode", size), |b| {
            b.iter(|| encode_payload(black_box(&p)))
        });
        let encoded = encode_payload(&p);
        g.bench_function(BenchmarkId::new("payload/decode", size), |b| {
            b.iter(|| {
                records::decode::<PayloadRecord>(&"payload", black_box(&encoded)).expect("decode")
            })
        });
        // The WAL record of one publish: payload + meta + counters.
        let muts = vec![
            Mutation::put(Key::Payload(7).encode(), encoded.clone()),
            Mutation::put(Key::Meta(1, 7).encode(), encoded_meta.clone()),
            Mutation::put(Key::Counters(1).encode(), Bytes::from(vec![0u8; 80])),
        ];
        let mut out = Vec::with_capacity(4096);
        g.bench_function(BenchmarkId::new("wal/frame", size), |b| {
            b.iter(|| {
                out.clear();
                wal::frame(9, 9, black_box(&muts), &mut out, |k| {
                    k.first() == Some(&0x05)
                })
            })
        });
        let mut txn = Vec::new();
        wal::encode_txn(&muts, &mut txn);
        let txn = Bytes::from(txn);
        g.bench_function(BenchmarkId::new("wal/decode_txn", size), |b| {
            b.iter(|| wal::decode_txn(black_box(&txn)).expect("decode"))
        });
    }
    g.finish();
}

criterion_group!(benches, codec, commit);
criterion_main!(benches);
