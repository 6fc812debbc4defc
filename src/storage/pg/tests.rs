//! Tests of the PostgreSQL state against a real PostgreSQL, started for
//! each test in a temporary directory on a loopback port (as the
//! `postgres` user when run as root: PostgreSQL refuses to run as root).
//! Without PostgreSQL's programs (Debian's `postgresql` package) they
//! skip, unless LETTERBOX_REQUIRE_ECOSYSTEM=1, when they fail.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::harness::{LocalPg, session_waiting, set_sync_standby};
use super::state::{MIGRATION_1, Outcome, PgError, PgState, SCHEMA_VERSION};
use crate::storage::keys::{Key, Space, SysKey};

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn put(k: Key<'_>, v: &[u8]) -> (Bytes, Option<Bytes>) {
    (k.encode(), Some(b(v)))
}

fn del(k: Key<'_>) -> (Bytes, Option<Bytes>) {
    (k.encode(), None)
}

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn commits_reads_and_scans_in_key_order() {
    let Some(pg) = LocalPg::start("commits_reads_and_scans_in_key_order") else {
        return;
    };
    let mut s = PgState::connect(&pg.url(), 1).await.expect("connect");
    let fence = s.acquire("a", TTL).await.expect("acquire").expect("free");
    assert_eq!(fence.epoch, 1);
    let batch = vec![
        put(Key::Meta(1, 2), b"m12"),
        put(Key::Meta(1, 1), b"m11"),
        put(Key::Meta(2, 1), b"m21"),
        put(Key::Payload(7), b"body"),
        put(Key::Counters(1), b"c1"),
        put(Key::Sys(SysKey::AppliedLsn), b"x"),
        // Put then deleted in the same batch: absent.
        put(Key::Meta(1, 3), b"gone"),
        del(Key::Meta(1, 3)),
        // Deleted then put: present with the last value.
        del(Key::Payload(8)),
        put(Key::Payload(8), b"eight"),
    ];
    s.commit(&fence, &batch, 5).await.expect("commit");
    assert_eq!(s.committed_lsn().await.expect("marker"), 5);
    assert_eq!(s.get(&Key::Meta(1, 3).encode()).await.expect("get"), None);
    assert_eq!(
        s.get(&Key::Payload(8).encode()).await.expect("get"),
        Some(b(b"eight"))
    );
    assert_eq!(
        s.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b(b"c1"))
    );

    let all = s
        .scan(&Space::Metas.prefix(), None, 100)
        .await
        .expect("scan");
    let keys: Vec<Bytes> = all.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        keys,
        vec![
            Key::Meta(1, 1).encode(),
            Key::Meta(1, 2).encode(),
            Key::Meta(2, 1).encode()
        ]
    );
    // Paging: after the first key, one at a time; a narrower prefix.
    let page = s
        .scan(&Space::Metas.prefix(), Some(&keys[0]), 1)
        .await
        .expect("scan");
    assert_eq!(page, vec![(keys[1].clone(), b(b"m12"))]);
    let of1 = s
        .scan(&Space::MetasOf(1).prefix(), None, 100)
        .await
        .expect("scan");
    assert_eq!(of1.len(), 2);

    // A later batch deletes and overwrites.
    s.commit(
        &fence,
        &[del(Key::Meta(1, 1)), put(Key::Meta(1, 2), b"again")],
        6,
    )
    .await
    .expect("commit");
    let of1 = s
        .scan(&Space::MetasOf(1).prefix(), None, 100)
        .await
        .expect("scan");
    assert_eq!(of1, vec![(Key::Meta(1, 2).encode(), b(b"again"))]);
    assert_eq!(s.resolve(6).await.expect("resolve"), Outcome::Committed);
    assert_eq!(s.resolve(7).await.expect("resolve"), Outcome::NotCommitted);

    // Shards do not see each other's keys.
    let other = PgState::connect(&pg.url(), 2).await.expect("connect");
    assert_eq!(
        other
            .scan(&Space::Metas.prefix(), None, 100)
            .await
            .expect("scan"),
        vec![]
    );
    assert_eq!(other.committed_lsn().await.expect("marker"), 0);
}

#[tokio::test]
async fn a_lapsed_lease_is_taken_over_and_the_old_owner_is_fenced() {
    let Some(pg) = LocalPg::start("a_lapsed_lease_is_taken_over_and_the_old_owner_is_fenced")
    else {
        return;
    };
    let mut a = PgState::connect(&pg.url(), 1).await.expect("connect");
    let mut b_ = PgState::connect(&pg.url(), 1).await.expect("connect");
    let short = Duration::from_millis(300);
    let fa = a.acquire("a", short).await.expect("acquire").expect("free");
    // Held: the other node is told by whom and for how long.
    let held = b_
        .acquire("b", TTL)
        .await
        .expect("acquire")
        .expect_err("held");
    assert_eq!((held.node.as_str(), held.epoch), ("a", fa.epoch));
    assert!(held.remaining <= short);
    a.commit(&fa, &[put(Key::Counters(1), b"a1")], 1)
        .await
        .expect("owner commits");

    tokio::time::sleep(short + Duration::from_millis(100)).await;
    let fb = b_
        .acquire("b", TTL)
        .await
        .expect("acquire")
        .expect("lapsed");
    assert_eq!(fb.epoch, fa.epoch + 1);

    // The old owner can neither write nor renew: nothing it sends lands.
    let err = a
        .commit(&fa, &[put(Key::Counters(1), b"stale")], 2)
        .await
        .expect_err("fenced");
    assert!(
        matches!(err, PgError::Fenced { mine, current, .. } if mine == fa.epoch && current == fb.epoch),
        "{err}"
    );
    assert!(matches!(
        a.renew(&fa, TTL).await,
        Err(PgError::Fenced { .. })
    ));
    assert_eq!(
        b_.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b(b"a1"))
    );
    assert_eq!(b_.committed_lsn().await.expect("marker"), 1);
    b_.commit(&fb, &[put(Key::Counters(1), b"b2")], 2)
        .await
        .expect("new owner commits");

    // A restart under the same name takes its own lease back at once.
    let fb2 = a
        .acquire("b", TTL)
        .await
        .expect("acquire")
        .expect("same node");
    assert_eq!(fb2.epoch, fb.epoch + 1);
    // Release lets another node in without waiting.
    a.release(&fb2).await.expect("release");
    let fc = b_
        .acquire("c", TTL)
        .await
        .expect("acquire")
        .expect("released");
    assert_eq!(fc.epoch, fb2.epoch + 1);
}

#[tokio::test]
async fn a_takeover_waits_for_a_commit_in_flight_and_fences_the_next() {
    let Some(pg) = LocalPg::start("a_takeover_waits_for_a_commit_in_flight_and_fences_the_next")
    else {
        return;
    };
    let url = pg.url();
    let mut a = PgState::connect(&url, 1).await.expect("connect");
    let fa = a
        .acquire("a", Duration::from_millis(200))
        .await
        .expect("acquire")
        .expect("free");
    // A blocker holds a payload row so that a's commit stops after its
    // fence check, holding the owner row FOR SHARE: a commit in flight.
    let (blocker, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    // pg_stat_activity is read outside the blocker's transaction (a
    // transaction sees one snapshot of it).
    let (monitor, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    a.commit(&fa, &[put(Key::Payload(1), b"v0")], 1)
        .await
        .expect("commit");
    blocker
        .batch_execute(
            "BEGIN; SELECT v FROM lb_payload WHERE k = '\\x050000000000000001' FOR UPDATE",
        )
        .await
        .expect("lock");
    let a = Arc::new(tokio::sync::Mutex::new(a));
    let in_flight = {
        let a = a.clone();
        tokio::spawn(async move {
            let mut a = a.lock().await;
            a.commit(&fa, &[put(Key::Payload(1), b"v1")], 2).await
        })
    };
    waiting_for_locks(&monitor, 1).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    // a's lease has lapsed; b takes over, and must wait for a's commit.
    let b_ = PgState::connect(&url, 1).await.expect("connect");
    let takeover = tokio::spawn(async move {
        let f = b_.acquire("b", TTL).await;
        (b_, f)
    });
    waiting_for_locks(&monitor, 2).await;
    assert!(
        !takeover.is_finished(),
        "the takeover did not wait for the commit in flight"
    );
    blocker.batch_execute("COMMIT").await.expect("unlock");
    in_flight
        .await
        .expect("join")
        .expect("the commit in flight lands");
    let (b_, fb) = takeover.await.expect("join");
    let fb = fb.expect("acquire").expect("lapsed");
    // The new owner sees the commit that was in flight; the old owner's
    // next commit is refused.
    assert_eq!(
        b_.get(&Key::Payload(1).encode()).await.expect("get"),
        Some(b(b"v1"))
    );
    let err = a
        .lock()
        .await
        .commit(&fa, &[put(Key::Payload(1), b"v2")], 3)
        .await
        .expect_err("fenced");
    assert!(
        matches!(err, PgError::Fenced { current, .. } if current == fb.epoch),
        "{err}"
    );
    assert_eq!(b_.committed_lsn().await.expect("marker"), 2);
}

/// Waits until `n` sessions wait for a lock (or fails after 20 s).
async fn waiting_for_locks(c: &tokio_postgres::Client, n: i64) {
    for _ in 0..400 {
        let waiting: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let activity: Vec<String> = c
        .query(
            "SELECT coalesce(wait_event_type, '-') || ' ' || coalesce(wait_event, '-') || ' ' || state || ': ' || query
             FROM pg_stat_activity WHERE backend_type = 'client backend'",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|r| r.get(0))
        .collect();
    panic!("{n} sessions never waited for a lock: {activity:#?}");
}

#[tokio::test]
async fn the_schema_is_created_once_and_a_newer_one_refused() {
    let Some(pg) = LocalPg::start("the_schema_is_created_once_and_a_newer_one_refused") else {
        return;
    };
    let url = pg.url();
    // Two servers creating it at once: one schema, both connected.
    let (x, y) = tokio::join!(PgState::connect(&url, 1), PgState::connect(&url, 1));
    x.expect("first");
    y.expect("second");
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let versions: Vec<i32> = c
        .query("SELECT version FROM lb_schema ORDER BY version", &[])
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<i32>>());
    c.execute(
        "INSERT INTO lb_schema VALUES ($1)",
        &[&(SCHEMA_VERSION + 1)],
    )
    .await
    .expect("newer");
    let err = PgState::connect(&url, 1).await.expect_err("newer schema");
    assert!(
        matches!(err, PgError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1),
        "{err}"
    );
    // An unreachable database names where it looked.
    let err = PgState::connect("postgres://postgres@127.0.0.1:1/nowhere", 1)
        .await
        .expect_err("unreachable");
    assert!(err.to_string().contains("127.0.0.1:1/nowhere"), "{err}");
}

#[tokio::test]
async fn an_unknown_commit_outcome_is_settled_by_the_marker() {
    let Some(pg) = LocalPg::start("an_unknown_commit_outcome_is_settled_by_the_marker") else {
        return;
    };
    let url = pg.url();
    let (monitor, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let mut a = PgState::connect(&url, 1).await.expect("connect");
    let fa = a.acquire("a", TTL).await.expect("acquire").expect("free");
    a.commit(&fa, &[put(Key::Counters(1), b"one")], 1)
        .await
        .expect("commit");

    // A synchronous standby that never answers: COMMIT is done locally and
    // waits for it. The session is then cut off, as when a primary dies or
    // the network drops during COMMIT: its outcome is unknown to the
    // committer, and the marker tells.
    set_sync_standby(&monitor, &url, "'nobody'").await;
    let committing = tokio::spawn(async move {
        let r = a.commit(&fa, &[put(Key::Counters(1), b"two")], 2).await;
        (a, r)
    });
    let pid = session_waiting(&monitor, "COMMIT", "SyncRep").await;
    monitor
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    let (_, r) = committing.await.expect("join");
    let err = r.expect_err("cut off during COMMIT");
    assert!(matches!(err, PgError::Unknown { lsn: 2, .. }), "{err}");
    set_sync_standby(&monitor, &url, "''").await;
    let mut fresh = PgState::connect(&url, 1).await.expect("connect");
    assert_eq!(fresh.resolve(2).await.expect("resolve"), Outcome::Committed);
    assert_eq!(
        fresh.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b(b"two"))
    );

    // Cut off before COMMIT (waiting for a row another session holds):
    // a lost connection, not an unknown outcome (a new connection may
    // send the batch again), and the marker says not committed.
    let fa = fresh
        .acquire("a", TTL)
        .await
        .expect("acquire")
        .expect("same node");
    monitor
        .batch_execute("BEGIN; SELECT * FROM lb_small FOR UPDATE")
        .await
        .expect("lock");
    let committing = tokio::spawn(async move {
        let r = fresh
            .commit(&fa, &[put(Key::Counters(1), b"three")], 3)
            .await;
        (fresh, r)
    });
    let (watcher, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let pid = session_waiting(&watcher, "INSERT INTO lb_small", "transactionid").await;
    watcher
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    let (_, r) = committing.await.expect("join");
    let err = r.expect_err("cut off before COMMIT");
    assert!(matches!(err, PgError::Lost(_)), "{err}");
    monitor.batch_execute("COMMIT").await.expect("unlock");
    let mut again = PgState::connect(&url, 1).await.expect("connect");
    assert_eq!(
        again.resolve(3).await.expect("resolve"),
        Outcome::NotCommitted
    );
    assert_eq!(
        again.get(&Key::Counters(1).encode()).await.expect("get"),
        Some(b(b"two"))
    );
}

#[tokio::test]
async fn a_version_1_database_is_migrated_and_keeps_its_rows() {
    let Some(pg) = LocalPg::start("a_version_1_database_is_migrated_and_keeps_its_rows") else {
        return;
    };
    let url = pg.url();
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    // What a server of schema version 1 left.
    c.batch_execute(&format!(
        "CREATE TABLE lb_schema (version int NOT NULL); {MIGRATION_1}
         INSERT INTO lb_schema VALUES (1);
         INSERT INTO lb_small VALUES (1, '\\x0100000001', 'old');
         INSERT INTO lb_marker VALUES (1, 9);"
    ))
    .await
    .expect("version 1");
    let mut s = PgState::connect(&url, 1).await.expect("connect");
    let versions: Vec<i32> = c
        .query("SELECT version FROM lb_schema ORDER BY version", &[])
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, vec![1, 2]);
    assert_eq!(s.committed_lsn().await.expect("marker"), 9);
    let old = Bytes::from_static(b"\x01\x00\x00\x00\x01");
    assert_eq!(s.get(&old).await.expect("get"), Some(b(b"old")));
    // Chunked values work on the migrated schema.
    s.set_chunk_size(2);
    let fence = s.acquire("a", TTL).await.expect("acquire").expect("free");
    s.commit(&fence, &[(old.clone(), Some(b(b"older")))], 10)
        .await
        .expect("commit");
    assert_eq!(s.get(&old).await.expect("get"), Some(b(b"older")));
    let chunks: i64 = c
        .query_one("SELECT count(*) FROM lb_chunk", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(chunks, 3);
}

#[tokio::test]
async fn chunked_values_read_whole_and_leave_no_chunks_behind() {
    let Some(pg) = LocalPg::start("chunked_values_read_whole_and_leave_no_chunks_behind") else {
        return;
    };
    let url = pg.url();
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let chunks = || async {
        c.query("SELECT k, n, length(v) FROM lb_chunk ORDER BY k, n", &[])
            .await
            .expect("chunks")
            .iter()
            .map(|r| {
                (
                    r.get::<_, Vec<u8>>(0),
                    r.get::<_, i32>(1),
                    r.get::<_, i32>(2),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut s = PgState::connect(&url, 1).await.expect("connect");
    s.set_chunk_size(4);
    let fence = s.acquire("a", TTL).await.expect("acquire").expect("free");
    let (m1, m2, p1) = (Key::Meta(1, 1), Key::Meta(1, 2), Key::Payload(1));
    s.commit(
        &fence,
        &[
            put(m1.clone(), b"0123456789"),
            put(m2.clone(), b"four"),
            put(p1.clone(), b"abcdefgh"),
        ],
        1,
    )
    .await
    .expect("commit");
    let m1k = m1.encode().to_vec();
    let p1k = p1.encode().to_vec();
    assert_eq!(
        chunks().await,
        vec![
            (m1k.clone(), 0, 4),
            (m1k.clone(), 1, 4),
            (m1k.clone(), 2, 2),
            (p1k.clone(), 0, 4),
            (p1k.clone(), 1, 4)
        ]
    );
    assert_eq!(
        s.get(&m1.encode()).await.expect("get"),
        Some(b(b"0123456789"))
    );
    // A range over every table: key order, values whole.
    let all = s.scan_range(&[], None, 10).await.expect("scan");
    assert_eq!(
        all,
        vec![
            (m1.encode(), b(b"0123456789")),
            (m2.encode(), b(b"four")),
            (p1.encode(), b(b"abcdefgh"))
        ]
    );
    let bounded = s
        .scan_range(&m2.encode(), Some(&p1.encode()), 10)
        .await
        .expect("scan");
    assert_eq!(bounded, vec![(m2.encode(), b(b"four"))]);
    // Overwritten small, deleted, and overwritten large by a shorter one.
    s.commit(
        &fence,
        &[
            put(m1.clone(), b"tiny"),
            del(p1.clone()),
            put(m2.clone(), b"0123456"),
        ],
        2,
    )
    .await
    .expect("commit");
    let m2k = m2.encode().to_vec();
    assert_eq!(chunks().await, vec![(m2k.clone(), 0, 4), (m2k, 1, 3)]);
    assert_eq!(s.get(&m1.encode()).await.expect("get"), Some(b(b"tiny")));
    assert_eq!(s.get(&p1.encode()).await.expect("get"), None);
    assert_eq!(
        s.scan(&Space::Metas.prefix(), None, 10)
            .await
            .expect("scan"),
        vec![(m1.encode(), b(b"tiny")), (m2.encode(), b(b"0123456"))]
    );
}

#[tokio::test]
async fn a_commit_the_server_refuses_in_part_commits_nothing() {
    let Some(pg) = LocalPg::start("a_commit_the_server_refuses_in_part_commits_nothing") else {
        return;
    };
    let url = pg.url();
    let mut s = PgState::connect(&url, 1).await.expect("connect");
    let fence = s.acquire("a", TTL).await.expect("acquire").expect("free");
    s.commit(&fence, &[put(Key::Payload(1), b"before")], 1)
        .await
        .expect("commit");
    // The server will refuse one row of the next batch: a constraint on
    // one key of one table, the batch's other writes to every table sent
    // in the same pipeline before and after it.
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let refused = Key::Counters(9).encode();
    let hex: String = refused.iter().map(|x| format!("{x:02x}")).collect();
    admin
        .batch_execute(&format!(
            "ALTER TABLE lb_small ADD CONSTRAINT refuse_one CHECK (k <> '\\x{hex}'::bytea)"
        ))
        .await
        .expect("constraint");
    let batch = vec![
        put(Key::Meta(1, 1), b"m11"),
        put(Key::Payload(1), b"after"),
        put(Key::Payload(2), &vec![7u8; 200_000]),
        (refused.clone(), Some(b(b"no"))),
        put(Key::Counters(8), b"c8"),
    ];
    let err = s.commit(&fence, &batch, 2).await.expect_err("refused");
    assert!(matches!(err, PgError::Db(_)), "{err:?}");
    assert!(err.to_string().contains("refuse_one"), "{err}");
    // Nothing of it: the marker, every key as before.
    assert_eq!(s.committed_lsn().await.expect("marker"), 1);
    assert_eq!(s.get(&Key::Meta(1, 1).encode()).await.expect("get"), None);
    assert_eq!(
        s.get(&Key::Payload(1).encode()).await.expect("get"),
        Some(b(b"before"))
    );
    assert_eq!(s.get(&Key::Payload(2).encode()).await.expect("get"), None);
    assert_eq!(s.get(&Key::Counters(8).encode()).await.expect("get"), None);
    let chunks: i64 = admin
        .query_one("SELECT count(*) FROM lb_chunk", &[])
        .await
        .expect("chunks")
        .get(0);
    assert_eq!(chunks, 0);
    // The connection is out of the failed transaction: the next commit
    // goes through.
    admin
        .batch_execute("ALTER TABLE lb_small DROP CONSTRAINT refuse_one")
        .await
        .expect("drop constraint");
    s.commit(&fence, &batch, 3).await.expect("commit after");
    assert_eq!(s.committed_lsn().await.expect("marker"), 3);
    assert_eq!(
        s.get(&Key::Payload(2).encode()).await.expect("get"),
        Some(b(&vec![7u8; 200_000]))
    );
}

#[tokio::test]
async fn a_fenced_commit_sent_in_one_pipeline_writes_nothing() {
    let Some(pg) = LocalPg::start("a_fenced_commit_sent_in_one_pipeline_writes_nothing") else {
        return;
    };
    let url = pg.url();
    let mut s = PgState::connect(&url, 1).await.expect("connect");
    let fence = s.acquire("a", TTL).await.expect("acquire").expect("free");
    s.commit(
        &fence,
        &[
            put(Key::Payload(1), b"before"),
            put(Key::Payload(3), &vec![3u8; 200_000]),
        ],
        1,
    )
    .await
    .expect("commit");
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let chunks = || async {
        admin
            .query_one("SELECT count(*) FROM lb_chunk", &[])
            .await
            .expect("chunks")
            .get::<_, i64>(0)
    };
    let before = chunks().await;
    // Writes of every kind behind the fence in the same pipeline: new
    // rows, a replaced one, a chunked value, a delete of a chunked one.
    let batch = vec![
        put(Key::Meta(1, 1), b"m11"),
        put(Key::Payload(1), b"after"),
        put(Key::Payload(2), &vec![7u8; 200_000]),
        del(Key::Payload(3)),
        put(Key::Counters(8), b"c8"),
    ];
    // Another node's epoch (as a takeover leaves it), then no owner row
    // at all: the fence refuses both, and nothing of the batch lands.
    admin
        .execute("UPDATE lb_owner SET epoch = epoch + 1 WHERE shard = 1", &[])
        .await
        .expect("bump");
    let err = s.commit(&fence, &batch, 2).await.expect_err("fenced");
    assert!(
        matches!(err, PgError::Fenced { mine, current, .. } if mine == fence.epoch && current == fence.epoch + 1),
        "{err:?}"
    );
    admin
        .execute("DELETE FROM lb_owner WHERE shard = 1", &[])
        .await
        .expect("delete");
    let err = s.commit(&fence, &batch, 2).await.expect_err("fenced");
    assert!(matches!(err, PgError::Fenced { current: 0, .. }), "{err:?}");
    assert_eq!(s.committed_lsn().await.expect("marker"), 1);
    assert_eq!(
        s.get(&Key::Payload(1).encode()).await.expect("get"),
        Some(b(b"before"))
    );
    assert_eq!(s.get(&Key::Meta(1, 1).encode()).await.expect("get"), None);
    assert_eq!(s.get(&Key::Payload(2).encode()).await.expect("get"), None);
    assert_eq!(
        s.get(&Key::Payload(3).encode()).await.expect("get"),
        Some(b(&vec![3u8; 200_000]))
    );
    assert_eq!(s.get(&Key::Counters(8).encode()).await.expect("get"), None);
    assert_eq!(chunks().await, before);
    // The connection is out of the aborted transactions: once the shard
    // is taken again, its commits go through.
    let again = s.acquire("a", TTL).await.expect("acquire").expect("free");
    s.commit(&again, &batch, 2).await.expect("commit after");
    assert_eq!(s.committed_lsn().await.expect("marker"), 2);
    assert_eq!(s.get(&Key::Payload(3).encode()).await.expect("get"), None);
}
