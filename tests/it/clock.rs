//! Time rules through an in-process server with a manual clock: TTL,
//! delays, retry backoff, DLQ TTL counted from the move.

use letterbox::pb;

use crate::harness::*;

const MINUTE: u64 = 60_000;

#[tokio::test]
async fn ttl_delay_and_backoff_follow_the_clock() {
    let srv = InProc::start().await;
    let mut c = srv.clients().await;
    c.create(
        "dlq",
        pb::QueueConfig {
            message_ttl_ms: Some(30 * MINUTE),
            ..config()
        },
    )
    .await;
    c.create(
        "q",
        pb::QueueConfig {
            message_ttl_ms: Some(10 * MINUTE),
            delivery_delay_ms: Some(5_000),
            dead_letter_on_expiry: Some(true),
            retry_backoff: Some(pb::RetryBackoff {
                initial_ms: 2_000,
                max_ms: 8_000,
                multiplier: 4.0,
            }),
            ..with_dlq("dlq", 5)
        },
    )
    .await;
    c.publish("q", &["delayed"]).await;
    assert!(
        c.receive("q", 1).await.is_empty(),
        "delivery delay holds it back"
    );
    assert_eq!(c.stats("q").await.delayed, 1);
    srv.advance(5_000).await;
    let d = c.receive("q", 1).await.remove(0);
    c.nack(&d.ack_token, "").await;
    srv.advance(1_999).await;
    assert!(
        c.receive("q", 1).await.is_empty(),
        "backoff: 2 s after the first failure"
    );
    srv.advance(1).await;
    let d = c.receive("q", 1).await.remove(0);
    c.nack(&d.ack_token, "").await;
    srv.advance(7_999).await;
    assert!(
        c.receive("q", 1).await.is_empty(),
        "backoff: 8 s (capped) after the second"
    );
    srv.advance(1).await;
    assert_eq!(c.stats("q").await.ready, 1);
    // Its time to live runs out: moved to the DLQ (reason EXPIRED), where
    // its TTL counts from the move.
    srv.advance(10 * MINUTE).await;
    let st = c.stats("q").await;
    assert_eq!((st.total, st.expired, st.dead_lettered), (0, 1, 1));
    let m = c.browse("dlq").await.remove(0);
    assert_eq!(
        m.dead_letters[0].reason,
        pb::DeadLetterReason::Expired as i32
    );
    assert_eq!(m.expires_at_unix_ms, m.enqueued_at_unix_ms + 30 * MINUTE);
    srv.advance(30 * MINUTE).await;
    assert_eq!(
        c.stats("dlq").await.expired,
        1,
        "dropped when the DLQ's TTL runs out"
    );
    srv.stop().await;
}

#[tokio::test]
async fn an_expired_message_is_never_delivered() {
    let srv = InProc::start().await;
    let mut c = srv.clients().await;
    c.create(
        "q",
        pb::QueueConfig {
            message_ttl_ms: Some(MINUTE),
            ..config()
        },
    )
    .await;
    c.msg
        .publish(pb::PublishRequest {
            queue: "q".into(),
            messages: vec![
                pb::PublishMessage {
                    ttl_ms: Some(1_000),
                    ..msg("short")
                },
                msg("long"),
            ],
            ..Default::default()
        })
        .await
        .unwrap();
    // The sweeper has not run yet at this instant; receive checks anyway.
    srv.clock.advance(1_000);
    let got = c.receive("q", 10).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["long"]);
    assert_eq!(c.stats("q").await.expired, 1);
    srv.stop().await;
}
