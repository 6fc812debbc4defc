//! The engine's load at start through both sources (`recovery`): the
//! local database read directly (`storage::Reader`) and the backend read
//! in pages of `Backend::scan` (`storage::Paged`), with pages small enough
//! that every space takes several.

use std::sync::Arc;

use bytes::Bytes;

use super::model::*;
use super::*;
use crate::clock::ManualClock;
use crate::storage::records::{
    CountersRecord, DedupRecord, ExchangeRecord, GroupRecord, MetaRecord, QueueRecord,
};
use crate::storage::{LoadSource, OwnedKey, Paged, Space, Store, StoreOptions};

const T0: u64 = 1_700_000_000_000;

fn store_opts() -> StoreOptions {
    StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

fn msg(body: &str) -> NewMessage {
    NewMessage {
        body: Bytes::copy_from_slice(body.as_bytes()),
        ..NewMessage::default()
    }
}

fn recv(n: u32) -> ReceiveOptions {
    ReceiveOptions {
        max_messages: n,
        ..ReceiveOptions::default()
    }
}

async fn nack(b: &Broker, d: &Delivery) {
    let n = Nack {
        token: d.ack_token.clone().expect("token"),
        delay: None,
        reason: "failed".into(),
        dead_letter: false,
    };
    b.nack(&[n]).await.expect("nack");
}

/// Queues of both kinds, a DLQ, exchanges with bindings, and messages
/// ready, leased, delayed, dead-lettered, parked, deduplicated and
/// acknowledged, with their counters.
async fn populate(b: &Broker) {
    let dlq = |q: &str, n: u32| QueueConfigInput {
        dead_letter: Some(DeadLetterInput::new(q, n)),
        ack_timeout: Some(10 * SECOND),
        ..QueueConfigInput::default()
    };
    let fifo = |extra: QueueConfigInput| QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ack_timeout: Some(10 * SECOND),
        ..extra
    };
    b.create_queue("dlq", &QueueConfigInput::default())
        .await
        .expect("dlq");
    b.create_queue("work", &dlq("dlq", 1)).await.expect("work");
    b.create_queue(
        "later",
        &QueueConfigInput {
            delivery_delay: Some(MINUTE),
            ..QueueConfigInput::default()
        },
    )
    .await
    .expect("later");
    b.create_queue("fdlq", &fifo(QueueConfigInput::default()))
        .await
        .expect("fdlq");
    b.create_queue(
        "f",
        &fifo(QueueConfigInput {
            on_poison: Some(PoisonPolicy::ParkGroup),
            dedup_window: Some(HOUR),
            ..dlq("fdlq", 1)
        }),
    )
    .await
    .expect("f");
    for x in ["x", "y", "z"] {
        b.create_exchange(x).await.expect("exchange");
    }
    b.bind("x", "work", vec![("kind".into(), "a".into())])
        .await
        .expect("bind");
    b.bind("x", "later", Vec::new()).await.expect("bind");
    b.bind("y", "work", Vec::new()).await.expect("bind");

    // Standard messages: some leased, one dead-lettered, one acked, some
    // through an exchange, some with their own delay and TTL.
    let bodies: Vec<NewMessage> = (0..9).map(|i| msg(&format!("w{i}"))).collect();
    b.publish("work", bodies).await.expect("publish");
    let routed = (0..3)
        .map(|i| NewMessage {
            properties: vec![("kind".into(), "a".into())],
            ..msg(&format!("x{i}"))
        })
        .collect();
    b.publish_to_exchange("x", routed).await.expect("publish");
    let own = (0..3)
        .map(|i| NewMessage {
            delay: Some(30 * SECOND),
            ttl: Some(HOUR),
            ..msg(&format!("d{i}"))
        })
        .collect();
    b.publish("work", own).await.expect("publish");
    let got = b.receive("work", recv(4)).await.expect("receive");
    assert_eq!(got.len(), 4);
    nack(b, &got[0]).await; // max 1: dead-lettered
    let t = got[1].ack_token.clone().expect("token");
    b.ack(&[t]).await.expect("ack");
    // got[2] and got[3] stay leased.

    // FIFO: three groups parked by a failure of their head, one leased,
    // one ready; dedup ids in the window.
    for g in ["a", "b", "c", "d", "e"] {
        let msgs = (0..3)
            .map(|i| NewMessage {
                group_id: Some(g.into()),
                dedup_id: Some(format!("{g}{i}")),
                ..msg(&format!("{g}{i}"))
            })
            .collect();
        b.publish("f", msgs).await.expect("publish");
    }
    let heads = b
        .receive(
            "f",
            ReceiveOptions {
                max_messages: 3,
                max_per_group: 1,
                ..ReceiveOptions::default()
            },
        )
        .await
        .expect("receive");
    assert_eq!(heads.len(), 3);
    for d in &heads {
        nack(b, d).await;
    }
    let leased = b.receive("f", recv(1)).await.expect("receive");
    assert_eq!(leased.len(), 1);
    let parked = b.stats("f").expect("stats").parked;
    assert_eq!(parked, 9, "three groups parked");
}

/// What the engine shows of its state: every listing and figure.
fn listings(b: &Broker) -> String {
    let mut out = format!("{:#?}\n", b.all_stats());
    out += &format!("{:#?}\n", b.list_queues("", 100, None).expect("queues"));
    out += &format!("{:#?}\n", b.list_exchanges(100, None).expect("exchanges"));
    out += &format!(
        "{:#?}\n",
        b.list_groups("f", 100, None, None).expect("groups")
    );
    for (name, _, _) in b.all_stats() {
        out += &format!("{:#?}\n", b.browse(&name, 100, "").expect("browse"));
    }
    out
}

/// The state's debug dump as a sorted list of lines: the same for the
/// same state whatever order its hash maps list their entries in.
fn dump(st: &State) -> Vec<String> {
    let mut lines: Vec<String> = format!("{st:#?}").lines().map(str::to_string).collect();
    lines.sort();
    lines
}

/// Every entry of every space the load reads, in the order read.
fn spaces<S: LoadSource>(src: &S) -> Vec<String> {
    fn all<T: crate::storage::records::Record + std::fmt::Debug, S: LoadSource>(
        src: &S,
        space: Space,
    ) -> Vec<String> {
        src.scan::<T>(space)
            .map(|item| {
                let (k, v): (OwnedKey, T) = item.expect("scan");
                format!("{k:?} {v:?}")
            })
            .collect()
    }
    let mut out = vec![
        all::<QueueRecord, S>(src, Space::Queues),
        all::<CountersRecord, S>(src, Space::Counters),
        all::<ExchangeRecord, S>(src, Space::Exchanges),
        all::<GroupRecord, S>(src, Space::Groups),
        all::<MetaRecord, S>(src, Space::Metas),
        all::<DedupRecord, S>(src, Space::Dedups),
    ];
    for (i, space) in out.iter().enumerate() {
        assert!(space.len() > 2, "space {i} spans several pages of 2");
    }
    out.push(vec![format!(
        "{:?} {:?}",
        src.get_sys(SysKey::PosReserved).expect("sys"),
        src.get_sys(SysKey::NextQid).expect("sys")
    )]);
    out.into_iter().flatten().collect()
}

#[tokio::test]
async fn the_reader_and_backend_pages_load_the_same_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let (store, _) = Store::open(dir.path(), store_opts()).expect("store");
    let b = Broker::open(store, clock.clone(), BrokerOptions::default()).expect("broker");
    populate(&b).await;
    let before = listings(&b);
    b.close().expect("close");

    // The sources, entry by entry, and the state they load.
    let (store, _) = Store::open(dir.path(), store_opts()).expect("store");
    let now = clock.now_ms();
    let reader = store.reader();
    let want = spaces(&reader);
    let (st, cleanup) = recovery::load(&reader, now).expect("load");
    assert!(cleanup.is_empty());
    let want_state = dump(&st);
    for page in [1, 2, 3, 1024] {
        let paged = Paged::new(store.backend(), page);
        assert_eq!(spaces(&paged), want, "entries read in pages of {page}");
        let (st, cleanup) = recovery::load(&paged, now).expect("load");
        assert!(cleanup.is_empty());
        assert_eq!(dump(&st), want_state, "state loaded in pages of {page}");
    }

    // The reader holds the database open.
    drop(reader);

    // And the engine over each shows what it showed before the stop.
    let b = Broker::open(store, clock.clone(), BrokerOptions::default()).expect("broker");
    assert_eq!(listings(&b), before, "loaded through the reader");
    b.close().expect("close");
    let (store, _) = Store::open(dir.path(), store_opts()).expect("store");
    let b = Broker::open_paged(store, clock.clone(), BrokerOptions::default(), 2).expect("broker");
    assert_eq!(listings(&b), before, "loaded in pages of 2");
    b.close().expect("close");
}

/// A backend whose pages repeat the last entry of the one before (a
/// paging bug) is caught, not loaded twice.
#[test]
fn a_page_repeating_an_entry_is_an_error() {
    struct Repeating(std::sync::Mutex<Vec<(Bytes, Bytes)>>);
    impl crate::storage::Backend for Repeating {
        fn submit(&self, _: crate::storage::Txn) -> crate::storage::Commit {
            unreachable!()
        }
        fn get(&self, _: &[u8]) -> crate::storage::Result<Option<Bytes>> {
            Ok(None)
        }
        fn scan(
            &self,
            start: &[u8],
            _: Option<&[u8]>,
            limit: usize,
        ) -> crate::storage::Result<Vec<(Bytes, Bytes)>> {
            // Starts at the key before `start` (drops its trailing 0).
            let all = self.0.lock().expect("lock");
            let from = &start[..start.len().saturating_sub(1)];
            Ok(all
                .iter()
                .filter(|(k, _)| k.as_ref() >= from)
                .take(limit)
                .cloned()
                .collect())
        }
        fn failure(&self) -> tokio::sync::watch::Receiver<Option<String>> {
            tokio::sync::watch::channel(None).1
        }
        fn close(&self) -> crate::storage::Result<()> {
            Ok(())
        }
    }
    let entries = (0u8..5)
        .map(|i| (Bytes::from(vec![0x09, i]), Bytes::from_static(b"v")))
        .collect();
    let b = Repeating(std::sync::Mutex::new(entries));
    let got: Vec<_> = crate::storage::pages(&b, &[0x09], 2).collect();
    assert!(
        got.iter().any(Result::is_err),
        "a repeated key is reported: {got:?}"
    );
}
