//! Damaged bodies, and the races between a lease running out, a release
//! and the settles that meet them, against a real store with a manual
//! clock.
use bytes::Bytes;

use super::model::*;
use super::tests::*;

/// Replaces the stored payload of the message of `q` whose body is `body`
/// with one whose body fails its checksum (a byte flipped on disk).
async fn damage(env: &Env, q: &str, body_text: &str) {
    let b = env.b();
    let (qid, positions): (u32, Vec<u64>) = {
        let st = b.lock();
        let qid = st.qid(q).expect("queue");
        let positions = st.queues[&qid].msgs.iter().map(|(p, _)| p).collect();
        (qid, positions)
    };
    for pos in positions {
        let meta = b.meta(qid, pos).expect("meta");
        let Some(mut rec) = b.store.get_payload(meta.pid()).expect("payload") else {
            continue;
        };
        if rec.body.as_ref() != body_text.as_bytes() {
            continue;
        }
        let mut flipped = rec.body.to_vec();
        flipped[0] ^= 0x20;
        rec.body = Bytes::from(flipped);
        let mut txn = crate::storage::Txn::new();
        txn.put_payload(meta.pid(), crate::storage::encode_payload(&rec));
        let c = b.store.submit(txn);
        c.wait().await.expect("durable");
        return;
    }
    panic!("no message {body_text:?} in {q}");
}

#[tokio::test]
async fn a_damaged_body_goes_to_the_dlq_alone_and_uncounted() {
    let env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("q", with_dlq("dlq", 3)).await;
    env.publish("q", &["m1", "m2", "m3", "m4", "m5"]).await;
    damage(&env, "q", "m3").await;
    let (got, b) = bodies(&env, "q", 10).await;
    assert_eq!(b, ["m1", "m2", "m4", "m5"], "the neighbours are delivered");
    assert!(got.iter().all(|d| d.delivery_count == 1));
    assert_eq!(env.b().corrupt_records_found(), 1);
    let dl = env.b().browse("dlq", 10, "").expect("browse").messages;
    assert_eq!(dl.len(), 1);
    let rec = &dl[0].dead_letters[0];
    assert_eq!(rec.reason, DeadLetterReason::Corrupted);
    assert_eq!(rec.delivery_count, 0, "the failed read was no delivery");
    assert!(rec.note.contains("checksum"), "{}", rec.note);
    assert!(dl[0].damaged.contains("checksum"), "browse marks it");
    assert!(dl[0].body.is_empty());
    let st = env.stats("q");
    assert_eq!((st.in_flight, st.counters.dead_lettered), (4, 1));
}

#[tokio::test]
async fn without_a_dlq_a_damaged_body_waits_and_browse_marks_it() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["m1", "m2", "m3"]).await;
    damage(&env, "q", "m2").await;
    // A receive of one message at a time is not starved by it.
    let (first, b) = bodies(&env, "q", 1).await;
    assert_eq!(b, ["m1"]);
    env.ack(&first[0]).await;
    let (third, b) = bodies(&env, "q", 1).await;
    assert_eq!(b, ["m3"]);
    let page = env.b().browse("q", 10, "").expect("browse").messages;
    assert_eq!(page.len(), 2);
    env.ack(&third[0]).await;
    let bad = page.iter().find(|m| !m.damaged.is_empty()).expect("marked");
    assert_eq!(bad.state, MessageState::Delayed);
    assert_eq!(bad.delivery_count, 0);
    assert_eq!(env.stats("q").delayed, 1);
    // An hour later it is tried again, and set aside again: never lost.
    env.advance(HOUR).await;
    assert!(env.receive("q", 10).await.is_empty());
    assert_eq!(env.stats("q").total, 1);
    assert!(env.b().corrupt_records_found() >= 2);
}

#[tokio::test]
async fn an_auto_ack_receive_never_deletes_a_damaged_body() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.publish("q", &["m1", "m2", "m3"]).await;
    damage(&env, "q", "m2").await;
    let opts = ReceiveOptions {
        max_messages: 10,
        auto_ack: true,
        ..ReceiveOptions::default()
    };
    let got = env.b().receive("q", opts).await.expect("receive");
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["m1", "m3"]);
    let st = env.stats("q");
    assert_eq!((st.total, st.delayed, st.counters.acked), (1, 1, 2));
}

#[tokio::test]
async fn fifo_a_damaged_body_holds_its_group_back_and_nothing_is_counted() {
    let mut env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    publish_group(&env, "f", "h", &["h1"]).await;
    damage(&env, "f", "m2").await;
    let (got, b) = bodies(&env, "f", 10).await;
    // m3 is not delivered ahead of m2; group h is not held up.
    assert_eq!(b, ["m1", "h1"]);
    for d in &got {
        assert_eq!(env.ack(d).await, Settled::Ok { deadline: 0 });
    }
    env.crash();
    assert!(env.receive("f", 10).await.is_empty(), "m2 blocks its group");
    let page = env.b().browse("f", 10, "").expect("browse").messages;
    let counts: Vec<u32> = page.iter().map(|m| m.delivery_count).collect();
    assert_eq!(counts, [0, 0], "neither m2 nor m3 counted a delivery");
}

#[tokio::test]
async fn fifo_a_lease_run_out_releases_before_the_sweeper_comes() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    let got = env.receive("f", 10).await;
    // m2's lease is extended; m1's runs out, and the sweeper has not run.
    let t2 = got[1].ack_token.clone().expect("token");
    env.b().extend(&[(t2, 60 * SECOND)]).await.expect("extend");
    env.clock.advance(11 * SECOND);
    // The ack of m2 ends m1's lease first, which releases m2.
    let r = env.ack(&got[1]).await;
    assert!(matches!(r, Settled::Released(_)), "{r:?}");
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
}

#[tokio::test]
async fn fifo_nacking_a_whole_batch_in_one_call_releases_the_rest() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let got = env.receive("f", 10).await;
    let items: Vec<Nack> = got
        .iter()
        .map(|d| Nack {
            token: d.ack_token.clone().expect("token"),
            delay: None,
            reason: "whole batch".into(),
            dead_letter: false,
        })
        .collect();
    let (r, released) = env.b().nack_releasing(&items).await.expect("nack");
    assert_eq!(r[0], Settled::Ok { deadline: 0 });
    assert!(matches!(r[1], Settled::Released(_)), "{:?}", r[1]);
    assert!(matches!(r[2], Settled::Released(_)), "{:?}", r[2]);
    assert_eq!(released.len(), 2);
    let (again, _) = bodies(&env, "f", 10).await;
    let counts: Vec<(u32, u32)> = again
        .iter()
        .map(|d| (d.delivery_count, d.failed_attempts))
        .collect();
    assert_eq!(counts, [(2, 1), (2, 0), (2, 0)]);
}

/// An ack riding on a Receive first ends the leases that ran out (a FIFO
/// release must not wait for the sweeper); when that moves a message into
/// the very queue being received from, the pick that follows must find
/// it stored, not fail with "indexed but not stored" and leave the move
/// in memory only.
#[tokio::test]
async fn an_ack_riding_on_receive_moves_due_messages_before_the_pick() {
    let mut env = Env::new();
    env.create("dlq", QueueConfigInput::default()).await;
    env.create("work", with_dlq("dlq", 1)).await;
    env.publish("work", &["first", "second"]).await;
    let leased = env.receive("work", 2).await;
    assert_eq!(leased.len(), 2);
    // Ack the second one while receiving from the DLQ, after the first
    // one's lease ran out and before the sweeper ran.
    env.clock.advance(11 * SECOND);
    let ack = leased[1].ack_token.clone().expect("token");
    let r = env
        .b()
        .receive_acking(
            "dlq",
            ReceiveOptions {
                max_messages: 10,
                ..ReceiveOptions::default()
            },
            &[ack],
        )
        .await
        .expect("receive with an ack");
    let (settled, got) = (r.acks, r.received.expect("the receive"));
    // The second one's lease also ran out, so the ack comes too late.
    assert!(
        matches!(settled[0], Settled::LeaseExpired(_)),
        "{settled:?}"
    );
    let bodies: Vec<&str> = got.iter().map(body).collect();
    assert_eq!(bodies, ["first", "second"]);
    // In the store too: after a crash the DLQ still holds them, leased.
    env.crash();
    let s = env.stats("dlq");
    assert_eq!(s.total, 2, "{s:?}");
    assert_eq!(env.stats("work").total, 0);
}

/// An ack that comes after its lease ran out, before the sweeper ended
/// it, ends it itself (`catch_up`) and answers LEASE_EXPIRED. When the
/// message's previous lease had been released (SPEC §3), that answer must
/// not be RELEASED naming the message that failed back then: the expiry
/// the ack's own call recorded is the lease's end, not the release before.
#[tokio::test]
async fn fifo_an_ack_after_the_deadline_answers_expired_though_the_lease_before_was_released() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let first = env.receive("f", 10).await;
    // m1 fails: m2 and m3, leased with it, are released.
    env.nack(&first[0], "").await;
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2", "m3"]);
    assert_eq!(env.ack(&again[0]).await, Settled::Ok { deadline: 0 });
    // m2's lease runs out (m3's too); the sweeper has not run.
    env.clock.advance(11 * SECOND);
    let r = env.ack(&again[1]).await;
    assert!(matches!(r, Settled::LeaseExpired(_)), "{r:?}");
    // m2's expiry released m3, and m3's ack names m2, not m1.
    let Settled::Released(why) = env.ack(&again[2]).await else {
        panic!("m3 was released with m2");
    };
    assert!(why.contains(&again[1].message_id), "{why}");
    // m2 failed once (the expiry); m3 was released by it, no failure.
    // Both were delivered three times.
    let (last, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2", "m3"]);
    assert_eq!((last[0].delivery_count, last[0].failed_attempts), (3, 1));
    assert_eq!((last[1].delivery_count, last[1].failed_attempts), (3, 0));
}

/// One sweep that ends a FIFO lease and then expires what it released:
/// the released message's record was written by the sweep's own change
/// (its lease gone, the release in its history, no failure counted), and
/// the move to the DLQ must carry that record, not the stored one.
#[tokio::test]
async fn fifo_a_message_released_and_expired_in_one_sweep_is_dead_lettered_as_no_failure() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    let cfg = QueueConfigInput {
        message_ttl: Some(MINUTE),
        dead_letter_on_expiry: Some(true),
        ..fifo(with_dlq("fdlq", 5))
    };
    env.create("f", cfg).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    env.advance(55 * SECOND).await;
    let got = env.receive("f", 10).await;
    assert_eq!(got.len(), 2);
    // Past both the leases (10 s) and the time to live (a minute), in one
    // sweep: m1's lease ends first and releases m2, then both expire.
    env.advance(11 * SECOND).await;
    let (dl, b) = bodies(&env, "fdlq", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    let counts: Vec<(u32, u32)> = dl
        .iter()
        .map(|d| {
            let r = &d.dead_letters[0];
            (r.delivery_count, r.failed_attempts)
        })
        .collect();
    assert_eq!(
        counts,
        [(1, 1), (1, 0)],
        "m2's release counted as a delivery, not as a failure"
    );
    assert!(
        dl[1].dead_letters[0].last_nack_reason.contains("released"),
        "{:?}",
        dl[1].dead_letters[0]
    );
}

#[tokio::test]
async fn the_oldest_ready_age_is_that_of_the_first_message_deliverable_now() {
    let env = Env::new();
    env.create("q", QueueConfigInput::default()).await;
    env.create("f", fifo(QueueConfigInput::default())).await;
    let ages = |env: &Env| {
        env.b()
            .oldest_ready_ages()
            .into_iter()
            .collect::<std::collections::HashMap<_, _>>()
    };
    assert_eq!(ages(&env)["q"], 0, "empty");
    env.publish("q", &["a"]).await;
    env.clock.advance(1000);
    env.publish("q", &["b"]).await;
    publish_group(&env, "f", "g1", &["g1a", "g1b"]).await;
    env.clock.advance(500);
    publish_group(&env, "f", "g2", &["g2a"]).await;
    env.clock.advance(250);
    let a = ages(&env);
    assert_eq!((a["q"], a["f"]), (1750, 750));
    // Leased, the first is no longer ready: the next one is.
    assert_eq!(env.receive("q", 1).await.len(), 1);
    // FIFO: g1 is leased, so only g2's head is deliverable.
    assert_eq!(body(&env.receive("f", 1).await[0]), "g1a");
    let a = ages(&env);
    assert_eq!((a["q"], a["f"]), (750, 250));
    assert_eq!(env.receive("q", 10).await.len(), 1);
    assert_eq!(env.receive("f", 10).await.len(), 1);
    let a = ages(&env);
    assert_eq!((a["q"], a["f"]), (0, 0), "nothing deliverable now");
}
