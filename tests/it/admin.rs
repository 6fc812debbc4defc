//! Queue administration and configuration validation (SPEC §1, §7).

use letterbox::pb;
use tonic::Code;

use crate::harness::*;

#[tokio::test]
async fn create_returns_every_default_and_is_idempotent() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    let q = c.create("orders", config()).await;
    let cfg = q.config.expect("config");
    assert_eq!(cfg.kind, pb::QueueKind::Standard as i32);
    assert_eq!(cfg.message_ttl_ms, Some(7 * 24 * 3600 * 1000));
    assert_eq!(cfg.ack_timeout_ms, Some(120_000));
    assert_eq!(cfg.delivery_delay_ms, Some(0));
    assert_eq!(cfg.max_lease_total_ms, Some(12 * 3600 * 1000));
    assert_eq!(cfg.dead_letter_on_expiry, Some(false));
    assert_eq!(cfg.max_length, None);
    let again = c
        .admin
        .create_queue(pb::CreateQueueRequest {
            name: "orders".into(),
            config: None,
        })
        .await
        .expect("idempotent")
        .into_inner();
    assert!(!again.created);
    let different = c
        .admin
        .create_queue(pb::CreateQueueRequest {
            name: "orders".into(),
            config: Some(pb::QueueConfig {
                ack_timeout_ms: Some(5000),
                ..config()
            }),
        })
        .await;
    assert_status(different, Code::AlreadyExists, "ack_timeout");
}

/// A queue's configuration as `GetQueue` shows it, sent back: accepted
/// by `CreateQueue` (the same queue, not created again) and by
/// `UpdateQueue` (nothing changed), for a standard queue (whose FIFO-only
/// values are left unset) and a FIFO one.
#[tokio::test]
async fn a_configuration_read_back_can_be_sent_again() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    let fifo = pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        dedup_window_ms: Some(60_000),
        on_poison: pb::PoisonPolicy::ParkGroup as i32,
        ..config()
    };
    for (name, cfg) in [("standard", config()), ("ordered", fifo)] {
        c.create(name, cfg).await;
        let shown = c
            .admin
            .get_queue(pb::GetQueueRequest { name: name.into() })
            .await
            .expect("get")
            .into_inner()
            .queue
            .expect("queue")
            .config
            .expect("config");
        if name == "standard" {
            assert_eq!(
                (
                    shown.dedup_window_ms,
                    shown.on_poison,
                    shown.content_based_dedup
                ),
                (None, 0, None),
                "FIFO-only values unset on a standard queue"
            );
        }
        let again = c
            .admin
            .create_queue(pb::CreateQueueRequest {
                name: name.into(),
                config: Some(shown.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("{name}: its own configuration refused: {e}"))
            .into_inner();
        assert!(!again.created, "{name}");
        let updated = c
            .admin
            .update_queue(pb::UpdateQueueRequest {
                name: name.into(),
                config: Some(shown.clone()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{name}: its own configuration refused as an update: {e}"))
            .into_inner();
        assert_eq!(updated.queue.expect("queue").config, Some(shown), "{name}");
    }
}

#[tokio::test]
async fn bad_names_and_values_are_refused_naming_them() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    let long = "a".repeat(256);
    for (name, needle) in [
        ("", "name"),
        (".x", ".x"),
        ("a b", "a b"),
        (long.as_str(), "255"),
    ] {
        let r = c
            .admin
            .create_queue(pb::CreateQueueRequest {
                name: name.into(),
                config: None,
            })
            .await;
        assert_status(r, Code::InvalidArgument, needle);
    }
    let cases: Vec<(pb::QueueConfig, &str)> = vec![
        (
            pb::QueueConfig {
                message_ttl_ms: Some(59_999),
                ..config()
            },
            "config.message_ttl_ms",
        ),
        (
            pb::QueueConfig {
                message_ttl_ms: Some(15 * 24 * 3600 * 1000),
                ..config()
            },
            "config.message_ttl_ms",
        ),
        (
            pb::QueueConfig {
                ack_timeout_ms: Some(999),
                ..config()
            },
            "config.ack_timeout_ms",
        ),
        (
            pb::QueueConfig {
                ack_timeout_ms: Some(12 * 3600 * 1000 + 1),
                ..config()
            },
            "config.ack_timeout_ms",
        ),
        (
            pb::QueueConfig {
                delivery_delay_ms: Some(900_001),
                ..config()
            },
            "config.delivery_delay_ms",
        ),
        (
            pb::QueueConfig {
                max_length: Some(0),
                ..config()
            },
            "config.max_length",
        ),
        (
            pb::QueueConfig {
                max_lease_total_ms: Some(1000),
                ..config()
            },
            "config.max_lease_total_ms",
        ),
        (
            pb::QueueConfig {
                dead_letter_on_expiry: Some(true),
                ..config()
            },
            "config.dead_letter_on_expiry",
        ),
        (
            pb::QueueConfig {
                kind: 7,
                ..config()
            },
            "config.kind",
        ),
        (
            pb::QueueConfig {
                dedup_window_ms: Some(1000),
                ..config()
            },
            "config.dedup_window_ms",
        ),
        (
            pb::QueueConfig {
                retry_backoff: Some(pb::RetryBackoff {
                    initial_ms: 10,
                    max_ms: 5,
                    multiplier: 2.0,
                }),
                ..config()
            },
            "config.retry_backoff.max_ms",
        ),
        (
            pb::QueueConfig {
                retry_backoff: Some(pb::RetryBackoff {
                    initial_ms: 10,
                    max_ms: 50,
                    multiplier: 0.5,
                }),
                ..config()
            },
            "config.retry_backoff.multiplier",
        ),
        (with_dlq("x", 1001), "config.dead_letter.max_deliveries"),
    ];
    for (cfg, field) in cases {
        let r = c
            .admin
            .create_queue(pb::CreateQueueRequest {
                name: "q".into(),
                config: Some(cfg.clone()),
            })
            .await;
        assert_status(r, Code::InvalidArgument, field);
    }
    let r = c
        .admin
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect("list");
    assert!(r.into_inner().queues.is_empty(), "nothing was created");
}

#[tokio::test]
async fn dead_letter_queue_rules() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    let create = |name: &str, cfg: pb::QueueConfig| pb::CreateQueueRequest {
        name: name.into(),
        config: Some(cfg),
    };
    assert_status(
        c.admin
            .create_queue(create("q", with_dlq("missing", 3)))
            .await,
        Code::NotFound,
        "missing",
    );
    assert_status(
        c.admin.create_queue(create("q", with_dlq("q", 3))).await,
        Code::InvalidArgument,
        "own dead letter",
    );
    c.create(
        "fifo-dlq",
        pb::QueueConfig {
            kind: pb::QueueKind::Fifo as i32,
            ..config()
        },
    )
    .await;
    assert_status(
        c.admin
            .create_queue(create("q", with_dlq("fifo-dlq", 3)))
            .await,
        Code::FailedPrecondition,
        "same kind",
    );
    c.create("dlq", config()).await;
    c.create("a", with_dlq("dlq", 3)).await;
    c.create("b", with_dlq("dlq", 3)).await;
    let dlq = c
        .admin
        .get_queue(pb::GetQueueRequest { name: "dlq".into() })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(dlq.queue.expect("queue").dead_letter_sources, ["a", "b"]);
    // dlq -> a -> dlq would loop.
    let r = c
        .admin
        .update_queue(pb::UpdateQueueRequest {
            name: "dlq".into(),
            config: Some(with_dlq("a", 2)),
            ..Default::default()
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "loop");
    let r = c
        .admin
        .delete_queue(pb::DeleteQueueRequest {
            name: "dlq".into(),
            force: false,
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "dead letter queue of a, b");
    c.admin
        .delete_queue(pb::DeleteQueueRequest {
            name: "dlq".into(),
            force: true,
        })
        .await
        .expect("forced");
    let a = c
        .admin
        .get_queue(pb::GetQueueRequest { name: "a".into() })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        a.queue.expect("queue").config.expect("config").dead_letter,
        None
    );
    assert_status(
        c.admin
            .get_queue(pb::GetQueueRequest { name: "dlq".into() })
            .await,
        Code::NotFound,
        "dlq",
    );
}

#[tokio::test]
async fn update_keeps_unset_fields_and_never_changes_the_kind() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create(
        "q",
        pb::QueueConfig {
            max_length: Some(10),
            ..config()
        },
    )
    .await;
    let q = c
        .admin
        .update_queue(pb::UpdateQueueRequest {
            name: "q".into(),
            config: Some(pb::QueueConfig {
                ack_timeout_ms: Some(5000),
                ..config()
            }),
            ..Default::default()
        })
        .await
        .expect("update")
        .into_inner()
        .queue
        .expect("queue");
    let cfg = q.config.expect("config");
    assert_eq!((cfg.ack_timeout_ms, cfg.max_length), (Some(5000), Some(10)));
    let q = c
        .admin
        .update_queue(pb::UpdateQueueRequest {
            name: "q".into(),
            remove_max_length: true,
            ..Default::default()
        })
        .await
        .expect("update")
        .into_inner()
        .queue
        .expect("queue");
    assert_eq!(q.config.expect("config").max_length, None);
    let r = c
        .admin
        .update_queue(pb::UpdateQueueRequest {
            name: "q".into(),
            config: Some(pb::QueueConfig {
                kind: pb::QueueKind::Fifo as i32,
                ..config()
            }),
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "config.kind");
    let r = c
        .admin
        .update_queue(pb::UpdateQueueRequest {
            name: "nope".into(),
            ..Default::default()
        })
        .await;
    assert_status(r, Code::NotFound, "nope");
}

#[tokio::test]
async fn list_pages_through_queues_in_name_order() {
    let s = TestServer::start().await;
    let mut c = s.clients().await;
    for n in ["c", "a", "b", "x.1", "x.2"] {
        c.create(n, config()).await;
    }
    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .admin
            .list_queues(pb::ListQueuesRequest {
                page_size: 2,
                page_token: token.clone(),
                prefix: String::new(),
            })
            .await
            .expect("list")
            .into_inner();
        names.extend(page.queues.into_iter().map(|q| q.name));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(names, ["a", "b", "c", "x.1", "x.2"]);
    let x = c
        .admin
        .list_queues(pb::ListQueuesRequest {
            prefix: "x.".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(x.queues.len(), 2);
    let r = c
        .admin
        .list_queues(pb::ListQueuesRequest {
            page_size: 1001,
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "page_size");
}
