//! Damaged bytes where stored data should be: log frames, transactions,
//! keys, payload pointers, records, and whole log segments damaged or cut
//! before a restart. Decoding answers an error (or stops replay at the
//! damage); nothing panics.

use proptest::prelude::*;

use super::*;
use crate::storage::records::*;
use crate::storage::{Txn, encode_payload, keys};

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
        let bytes = Bytes::from(raw.clone());
        let _ = wal::decode_txn(&bytes);
        for txn in wal::frames(&bytes) {
            let _ = txn.len();
        }
        let _ = keys::OwnedKey::decode(&raw);
        let _ = payloads::Loc::decode(&raw);
        let what = "fuzzed";
        let _ = decode::<QueueRecord>(&what, &raw);
        let _ = decode::<CountersRecord>(&what, &raw);
        let _ = decode::<LeaseRecord>(&what, &raw);
        let _ = decode::<MetaRecord>(&what, &raw);
        let _ = decode::<DedupRecord>(&what, &raw);
        let _ = decode::<GroupRecord>(&what, &raw);
        let _ = decode::<ExchangeRecord>(&what, &raw);
        if let Ok(p) = decode::<PayloadRecord>(&what, &raw) {
            let _ = p.verify(&what);
        }
    }

    /// A valid record with one byte changed or a tail cut decodes to an
    /// error or to some value, never a panic.
    #[test]
    fn damaged_records_never_panic(at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<bool>()) {
        let meta = encode(&MetaRecord {
            pid: 7,
            message_id: "m-1".into(),
            client_id: false,
            enqueued_at: 1,
            expires_at: 2,
            visible_at: 1,
            delivery_count: 2,
            failed_attempts: 1,
            lease: None,
            first_delivered_at: 1,
            attempts: Vec::new(),
            dead_letters: Vec::new(),
            group: Some("g".into()),
            size: 4,
            own_ttl: false,
        });
        let mut raw = meta.to_vec();
        let i = at.index(raw.len());
        if cut {
            raw.truncate(i);
        } else {
            raw[i] = byte;
        }
        let _ = decode::<MetaRecord>(&"damaged", &raw);
        let payload = encode_payload(&PayloadRecord::new(1, vec![("k".into(), "v".into())], Bytes::from_static(b"body")));
        let mut raw = payload.to_vec();
        let i = at.index(raw.len());
        raw[i] ^= byte | 1;
        if let Ok(p) = decode::<PayloadRecord>(&"damaged", &raw) {
            let _ = p.verify(&"damaged");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A log damaged after a crash (bytes flipped, or the file cut short)
    /// either opens, with replay stopping at the damage, or is refused
    /// with an error; it never panics.
    #[test]
    fn a_damaged_log_is_refused_or_replayed_never_a_panic(
        damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = StoreOptions {
            segment_size: 64 << 10,
            apply_interval: Duration::from_secs(3600),
            checkpoint_interval: Duration::from_secs(3600),
            min_free_bytes: 0,
            ..StoreOptions::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        {
            let (store, _) = Store::open(dir.path(), opts.clone()).expect("open");
            rt.block_on(async {
                for i in 0..40u64 {
                    let mut t = Txn::new();
                    t.put_payload(i, encode_payload(&PayloadRecord::new(i, vec![], Bytes::from(vec![7u8; 300]))));
                    t.put_counters(1, &CountersRecord::default());
                    store.submit(t).wait().await.expect("durable");
                }
            });
            store.crash();
        }
        let wal_dir = dir.path().join("wal");
        for seg in wal::list_segments(&wal_dir).expect("segments") {
            let path = wal::segment_path(&wal_dir, seg);
            let mut bytes = std::fs::read(&path).expect("read");
            // Damage where the records are, not in the zeroed tail.
            let used = bytes.iter().rposition(|b| *b != 0).map_or(1, |p| p + 1);
            for (at, b) in &damage {
                let i = at.index(used);
                bytes[i] ^= b | 1;
            }
            if let Some(c) = cut {
                bytes.truncate(c.index(used));
            }
            std::fs::write(&path, &bytes).expect("write");
        }
        if let Ok((store, _)) = Store::open(dir.path(), opts) {
            // Whatever survived reads without panics.
            for i in 0..40u64 {
                let _ = store.get_payload(i);
            }
            let _ = store.close();
        }
    }
}
