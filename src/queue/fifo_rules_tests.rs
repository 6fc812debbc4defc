//! FIFO group rules (SPEC §3) against a real store with a manual clock:
//! one holder per group, releases, parking, dedup, fairness.

use std::time::Duration;

use bytes::Bytes;

use super::model::*;
use super::tests::*;

#[tokio::test]
async fn fifo_groups_are_leased_to_one_consumer_at_a_time_in_order() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "a", &["a1", "a2", "a3"]).await;
    publish_group(&env, "f", "b", &["b1"]).await;
    let first = env.receive("f", 2).await;
    assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["a1", "a2"]);
    let second = env.receive("f", 10).await;
    assert_eq!(
        second.iter().map(body).collect::<Vec<_>>(),
        ["b1"],
        "group a is leased"
    );
    env.nack(&first[0], "").await;
    // a1 failed, so a2, leased with it, was released: its ack settles
    // nothing (SPEC §3).
    assert!(matches!(env.ack(&first[1]).await, Settled::Released(_)));
    // a1 went back to the head, and a2 follows it again.
    let again = env.receive("f", 10).await;
    assert_eq!(
        again.iter().map(body).collect::<Vec<_>>(),
        ["a1", "a2", "a3"]
    );
    // Both were delivered twice; only a1 failed (SPEC §3: a release is a
    // delivery, not a failed attempt).
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!(
        (again[1].delivery_count, again[1].failed_attempts),
        (2, 0),
        "a release counts as a delivery, not as a failure"
    );
    assert_eq!((again[2].delivery_count, again[2].failed_attempts), (1, 0));
}

#[tokio::test]
async fn fifo_a_nack_releases_the_later_messages_of_its_group_leased_with_it() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    publish_group(&env, "f", "h", &["h1"]).await;
    let (got, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2", "m3", "h1"]);
    // Acking a later one while an earlier one is still leased is allowed
    // (a consumer acking as it goes is not what the rule refuses) ...
    let (got2, _) = {
        // ... but here m1 fails first.
        let n = Nack {
            token: got[1].ack_token.clone().expect("token"),
            delay: None,
            reason: "m2 broke".into(),
            dead_letter: false,
        };
        let (r, released) = env.b().nack_releasing(&[n]).await.expect("nack");
        assert_eq!(r, [Settled::Ok { deadline: 0 }]);
        // m3 is released with m2; m1 (earlier) and h1 (another group) not.
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].message_id, got[2].message_id);
        assert_eq!(released[0].because_of, got[1].message_id);
        assert_eq!(Some(&released[0].ack_token), got[2].ack_token.as_ref());
        (got.clone(), ())
    };
    let Settled::Released(why) = env.ack(&got2[2]).await else {
        panic!("m3's ack must say it was released");
    };
    assert!(why.contains(&got[1].message_id), "{why}");
    assert!(
        why.contains(got[2].ack_token.as_deref().expect("token")),
        "{why}"
    );
    // m1 is still leased and can be acked; h1 too.
    assert_eq!(env.ack(&got[0]).await, Settled::Ok { deadline: 0 });
    assert_eq!(env.ack(&got[3]).await, Settled::Ok { deadline: 0 });
    // An extend or a nack of the released token is refused the same way.
    let r = env
        .b()
        .extend(&[(got[2].ack_token.clone().expect("token"), 10 * SECOND)])
        .await
        .expect("extend");
    assert!(matches!(r[0], Settled::Released(_)));
    assert!(matches!(env.nack(&got[2], "").await, Settled::Released(_)));
    // The group restarts at m2, then m3; m3's release is in its history,
    // counted as a delivery but not as a failure.
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2", "m3"]);
    assert_eq!((again[0].delivery_count, again[0].failed_attempts), (2, 1));
    assert_eq!(again[0].attempts[0].reason, "m2 broke");
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
    assert_eq!(again[1].attempts.len(), 1);
    assert_eq!(again[1].attempts[0].outcome, AttemptOutcome::Released);
    assert!(again[1].attempts[0].reason.contains(&got[1].message_id));
    let st = env.stats("f");
    assert_eq!(st.counters.nacked, 1, "only m2's failure counts");
    // The old token of m3 still names the release after m3 was leased
    // again.
    assert!(matches!(env.ack(&got[2]).await, Settled::Released(_)));
    assert_eq!(env.ack(&again[0]).await, Settled::Ok { deadline: 0 });
    assert_eq!(env.ack(&again[1]).await, Settled::Ok { deadline: 0 });
}

/// An ack refused because another call ended its lease (here a nack
/// that released it) is answered only once that call's change is
/// durable: a crash could otherwise undo the release the answer reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_refused_by_another_calls_change_waits_until_that_is_durable() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    let (got, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    env.b()
        .store()
        .backend()
        .local()
        .expect("local store")
        .hold_log(held_tx, release_rx);
    held_rx.recv().expect("log held");
    // The nack is decided and logged, not durable.
    let mut nack = std::pin::pin!(env.nack(&got[0], "m1 broke"));
    let early = tokio::time::timeout(Duration::from_millis(100), &mut nack).await;
    assert!(early.is_err(), "a nack answered before it was durable");
    // m2's ack finds m2 released by it: no answer while the nack may
    // still be lost.
    let mut ack = std::pin::pin!(env.ack(&got[1]));
    let early = tokio::time::timeout(Duration::from_millis(300), &mut ack).await;
    assert!(
        early.is_err(),
        "RELEASED answered before the release was durable: {early:?}"
    );
    release_tx.send(()).expect("release");
    assert_eq!(nack.await, Settled::Ok { deadline: 0 });
    assert!(matches!(ack.await, Settled::Released(_)));
}

#[tokio::test]
async fn fifo_a_lease_that_runs_out_releases_the_rest_of_its_group_as_no_failure() {
    let mut env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    env.create("f", fifo(with_dlq("fdlq", 2))).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    // Twice: both leased, both run out. m1 fails each time; m2 is released
    // each time, so it never reaches max_deliveries, though its
    // deliveries rise like m1's.
    for round in 1..=2 {
        let (got, b) = bodies(&env, "f", 10).await;
        assert_eq!(b, ["m1", "m2"], "round {round}");
        assert_eq!(
            (got[0].delivery_count, got[0].failed_attempts),
            (round, round - 1)
        );
        assert_eq!((got[1].delivery_count, got[1].failed_attempts), (round, 0));
        // A restart with the leases outstanding changes nothing.
        env.crash();
        env.advance(11 * SECOND).await;
        assert!(matches!(env.ack(&got[1]).await, Settled::Released(_)));
    }
    // m1 went to the DLQ after its second failure; the group goes on
    // with m2, which was never a failed attempt.
    let (got, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2"]);
    assert_eq!((got[0].delivery_count, got[0].failed_attempts), (3, 0));
    assert_eq!(
        got[0]
            .attempts
            .iter()
            .map(|a| a.outcome)
            .collect::<Vec<_>>(),
        [AttemptOutcome::Released, AttemptOutcome::Released]
    );
    let (dl, b) = bodies(&env, "fdlq", 10).await;
    assert_eq!(b, ["m1"]);
    assert_eq!(dl[0].dead_letters[0].delivery_count, 2);
    assert_eq!(dl[0].dead_letters[0].failed_attempts, 2);
}

#[tokio::test]
async fn fifo_a_reject_releases_and_the_group_goes_on_with_the_next() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    env.create("f", fifo(with_dlq("fdlq", 5))).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let got = env.receive("f", 10).await;
    let n = Nack {
        token: got[0].ack_token.clone().expect("token"),
        delay: None,
        reason: "invalid".into(),
        dead_letter: true,
    };
    let (_, released) = env.b().nack_releasing(&[n]).await.expect("reject");
    assert_eq!(released.len(), 2);
    assert!(matches!(env.ack(&got[1]).await, Settled::Released(_)));
    let (_, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m2", "m3"]);
}

#[tokio::test]
async fn fifo_the_release_survives_a_crash() {
    let mut env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2"]).await;
    let got = env.receive("f", 10).await;
    env.nack(&got[0], "").await;
    env.crash();
    assert!(matches!(env.ack(&got[1]).await, Settled::Released(_)));
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2"]);
    assert_eq!((again[1].delivery_count, again[1].failed_attempts), (2, 0));
}

#[tokio::test]
async fn fifo_returned_leases_release_in_order() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["m1", "m2", "m3"]).await;
    let got = env.receive("f", 10).await;
    // A closed stream returns its deliveries in any order: the earliest
    // counts as the failed attempt, the later ones are released.
    let tokens: Vec<String> = got
        .iter()
        .rev()
        .map(|d| d.ack_token.clone().expect("t"))
        .collect();
    assert_eq!(env.b().return_leases(&tokens).await.expect("return"), 1);
    let (again, b) = bodies(&env, "f", 10).await;
    assert_eq!(b, ["m1", "m2", "m3"]);
    let counts: Vec<(u32, u32)> = again
        .iter()
        .map(|d| (d.delivery_count, d.failed_attempts))
        .collect();
    assert_eq!(counts, [(2, 1), (2, 0), (2, 0)]);
    assert_eq!(again[0].attempts[0].outcome, AttemptOutcome::StreamClosed);
}

#[tokio::test]
async fn fifo_max_per_group_caps_one_group_in_a_receive() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    publish_group(&env, "f", "g", &["g1", "g2", "g3"]).await;
    publish_group(&env, "f", "h", &["h1", "h2"]).await;
    let opts = ReceiveOptions {
        max_messages: 10,
        max_per_group: 1,
        ..ReceiveOptions::default()
    };
    let got = env.b().receive("f", opts).await.expect("receive");
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["g1", "h1"]);
    for d in &got {
        env.ack(d).await;
    }
    let opts = ReceiveOptions {
        max_per_group: 2,
        ..opts
    };
    let got = env.b().receive("f", opts).await.expect("receive");
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["g2", "g3", "h2"]);
}

#[tokio::test]
async fn fifo_rotation_is_fair_to_small_groups() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    let big: Vec<String> = (0..200).map(|i| format!("big{i}")).collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    publish_group(&env, "f", "big", &big).await;
    publish_group(&env, "f", "small", &["s1"]).await;
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "big0");
    env.ack(&d).await;
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(
        body(&d),
        "s1",
        "the small group is served before the big one's next message"
    );
}

#[tokio::test]
async fn fifo_poison_dead_letters_and_continues() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    env.create("f", fifo(with_dlq("fdlq", 2))).await;
    publish_group(&env, "f", "g", &["p", "next"]).await;
    for _ in 0..2 {
        let d = env.receive("f", 1).await.remove(0);
        assert_eq!(body(&d), "p");
        env.nack(&d, "boom").await;
    }
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "next");
    let dl = env.receive("fdlq", 1).await.remove(0);
    assert_eq!(
        (body(&dl), dl.group_id.as_deref()),
        ("p", Some("g")),
        "group kept in the DLQ"
    );
}

#[tokio::test]
async fn fifo_park_skip_and_release() {
    let env = Env::new();
    env.create("fdlq", fifo(QueueConfigInput::default())).await;
    let cfg = fifo(QueueConfigInput {
        on_poison: Some(PoisonPolicy::ParkGroup),
        ..with_dlq("fdlq", 1)
    });
    env.create("f", cfg).await;
    publish_group(&env, "f", "g", &["p", "q", "r"]).await;
    let d = env.receive("f", 1).await.remove(0);
    env.nack(&d, "boom").await;
    assert!(env.receive("f", 10).await.is_empty(), "the group is parked");
    let (groups, _) = env.b().list_groups("f", 10, None, None).expect("groups");
    assert_eq!(groups[0].state, GroupState::Parked);
    assert_eq!(groups[0].backlog, 3);
    assert_eq!(env.stats("f").parked, 3);
    let (groups, _) = env.b().list_groups("f", 10, None, None).expect("groups");
    assert_eq!(
        (
            groups[0].head_delivery_count,
            groups[0].head_failed_attempts
        ),
        (1, 1)
    );
    let id = env.b().release_group("f", "g").await.expect("release");
    assert_eq!(id, d.message_id);
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(
        (body(&d), d.delivery_count, d.failed_attempts),
        ("p", 2, 0),
        "the release resets the failed attempts, not the deliveries"
    );
    env.nack(&d, "boom again").await;
    assert!(env.receive("f", 10).await.is_empty(), "parked again");
    let skipped = env
        .b()
        .skip_head("f", "g", "bad data, ticket 42")
        .await
        .expect("skip");
    assert_eq!(skipped, d.message_id);
    let d = env.receive("f", 1).await.remove(0);
    assert_eq!(body(&d), "q");
    let m = env
        .b()
        .browse("fdlq", 1, "")
        .expect("browse")
        .messages
        .remove(0);
    assert_eq!(m.dead_letters[0].reason, DeadLetterReason::Skipped);
    assert_eq!(m.dead_letters[0].note, "bad data, ticket 42");
}

#[tokio::test]
async fn fifo_dedup_window_survives_a_crash_and_expires() {
    let mut env = Env::new();
    env.create(
        "f",
        fifo(QueueConfigInput {
            dedup_window: Some(MINUTE),
            ..Default::default()
        }),
    )
    .await;
    let m = |d: &str| NewMessage {
        body: Bytes::from_static(b"x"),
        dedup_id: Some(d.into()),
        ..Default::default()
    };
    let first = env
        .b()
        .publish("f", vec![m("k"), m("k")])
        .await
        .expect("publish");
    assert!(!first[0].duplicate && first[1].duplicate);
    assert_eq!(first[1].message_id, first[0].message_id);
    let d = env.receive("f", 1).await.remove(0);
    env.ack(&d).await;
    env.crash();
    let again = env.b().publish("f", vec![m("k")]).await.expect("publish");
    assert!(again[0].duplicate, "consumed, but still within the window");
    assert_eq!(again[0].message_id, first[0].message_id);
    env.advance(MINUTE).await;
    let later = env.b().publish("f", vec![m("k")]).await.expect("publish");
    assert!(!later[0].duplicate, "the window ran out");
}

#[tokio::test]
async fn fifo_refuses_per_message_delays_and_standard_refuses_groups() {
    let env = Env::new();
    env.create("f", fifo(QueueConfigInput::default())).await;
    env.create("s", QueueConfigInput::default()).await;
    let delayed = NewMessage {
        body: Bytes::from_static(b"x"),
        delay: Some(5),
        ..Default::default()
    };
    let err = env
        .b()
        .publish("f", vec![delayed])
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("messages[0].delay_ms"), "{err}");
    let grouped = NewMessage {
        body: Bytes::from_static(b"x"),
        group_id: Some("g".into()),
        ..Default::default()
    };
    let err = env
        .b()
        .publish("s", vec![grouped])
        .await
        .expect_err("refused")
        .to_string();
    assert!(err.contains("messages[0].group_id"), "{err}");
    assert_eq!(env.stats("f").total + env.stats("s").total, 0);
}

#[tokio::test]
async fn fifo_dedups_client_message_ids_over_the_window_even_after_consumption() {
    let mut env = Env::new();
    // The default window: 5 minutes, Anypoint MQ's FIFO dedup rule.
    env.create("f", fifo(QueueConfigInput::default())).await;
    let m = |id: &str, body: &'static str| NewMessage {
        message_id: Some(id.into()),
        body: Bytes::from_static(body.as_bytes()),
        group_id: Some("g".into()),
        ..Default::default()
    };
    let first = env
        .b()
        .publish("f", vec![m("order-1", "first"), m("order-1", "again")])
        .await
        .expect("publish");
    assert!(!first[0].duplicate && first[1].duplicate);
    let d = env.receive("f", 10).await;
    assert_eq!(d.len(), 1, "the repeat in the batch was not stored");
    assert_eq!(body(&d[0]), "first");
    env.ack(&d[0]).await;
    assert_eq!(env.stats("f").total, 0);
    env.crash();
    env.advance(4 * MINUTE).await;
    let again = env
        .b()
        .publish("f", vec![m("order-1", "late repeat")])
        .await
        .expect("publish");
    assert!(
        again[0].duplicate,
        "consumed, crashed, but still within 5 minutes"
    );
    assert_eq!(again[0].message_id, "order-1");
    assert_eq!(env.stats("f").total, 0, "nothing stored");
    env.advance(MINUTE).await;
    let later = env
        .b()
        .publish("f", vec![m("order-1", "new")])
        .await
        .expect("publish");
    assert!(!later[0].duplicate, "the window ran out");
    assert_eq!(body(&env.receive("f", 1).await[0]), "new");
}

#[tokio::test]
async fn lease_holder_names_the_queue_and_message_of_a_current_lease_only() {
    let env = Env::new();
    env.create(
        "q",
        QueueConfigInput {
            ack_timeout: Some(10 * SECOND),
            message_ttl: Some(HOUR),
            ..Default::default()
        },
    )
    .await;
    env.b()
        .publish(
            "q",
            vec![NewMessage {
                message_id: Some("m-1".into()),
                body: Bytes::from_static(b"x"),
                ..Default::default()
            }],
        )
        .await
        .expect("publish");
    env.clock.advance(5);
    let d = env.receive("q", 1).await.remove(0);
    assert_eq!((d.enqueued_at, d.expires_at), (T0, T0 + HOUR));
    let token = d.ack_token.clone().expect("token");
    let held = env
        .b()
        .lease_holder("lockId", &token)
        .expect("well formed")
        .expect("current");
    assert_eq!(
        held,
        LeasedMessage {
            queue: "q".into(),
            message_id: "m-1".into(),
            deadline: T0 + 5 + 10 * SECOND,
        }
    );
    let err = env
        .b()
        .lease_holder("lockId", "not-a-token")
        .expect_err("malformed")
        .to_string();
    assert!(
        err.contains("lockId") && err.contains("not-a-token"),
        "{err}"
    );
    // A lease that ran out (before any sweep) is no longer held.
    env.clock.advance(10 * SECOND);
    assert_eq!(env.b().lease_holder("lockId", &token).expect("ok"), None);
    env.advance(0).await;
    let d = env.receive("q", 1).await.remove(0);
    let token2 = d.ack_token.clone().expect("token");
    assert!(
        env.b()
            .lease_holder("lockId", &token2)
            .expect("ok")
            .is_some()
    );
    env.ack(&d).await;
    assert_eq!(env.b().lease_holder("lockId", &token2).expect("ok"), None);
}
