//! Hostile input against the services: requests decoded from arbitrary
//! bytes, and requests with arbitrary field values, go through conversion
//! and the engine. Nothing may panic; every refusal is a status; and the
//! engine stays usable.

use std::sync::Arc;

use proptest::prelude::*;
use prost::Message as _;
use tonic::Request;

use super::Service;
use crate::auth::Authenticator;
use crate::clock::ManualClock;
use crate::pb;
use crate::pb::admin_service_server::AdminService;
use crate::pb::messaging_service_server::MessagingService;
use crate::queue::{Broker, BrokerOptions};
use crate::storage::{Store, StoreOptions};

/// Longer than any name the strategies make (bar astronomically unlikely
/// arbitrary strings).
const SENTINEL: &str = "sentinel-queue-never-generated";

struct Env {
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    service: Service,
}

fn env() -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let (store, _) = Store::open(dir.path(), opts).expect("store");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let broker = Broker::open(store, clock, BrokerOptions::default()).expect("broker");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let service = Service::new(
        Arc::new(broker),
        tokio_util::task::TaskTracker::new(),
        Arc::new(Authenticator::disabled()),
        Arc::default(),
    );
    Env {
        _dir: dir,
        rt,
        service,
    }
}

/// Numbers at and around every boundary the rules have.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(999),
        Just(1000),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        0u64..100_000_000,
        any::<u64>(),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("q".to_string()),
        Just("x".repeat(300)),
        "[a-z0-9._-]{1,12}",
        any::<String>(),
    ]
}

prop_compose! {
    fn queue_config()(
        kind in 0i32..4,
        ttl in proptest::option::of(number()),
        ack in proptest::option::of(number()),
        delay in proptest::option::of(number()),
        dlq in proptest::option::of((text(), any::<u32>())),
        backoff in proptest::option::of((number(), number(), any::<f64>())),
        max_length in proptest::option::of(number()),
        lease_total in proptest::option::of(number()),
        dedup in proptest::option::of(number()),
        poison in -1i32..4,
        content in proptest::option::of(any::<bool>()),
    ) -> pb::QueueConfig {
        pb::QueueConfig {
            kind,
            message_ttl_ms: ttl,
            ack_timeout_ms: ack,
            delivery_delay_ms: delay,
            dead_letter: dlq.map(|(queue, max_deliveries)| pb::DeadLetterPolicy { queue, max_deliveries }),
            retry_backoff: backoff.map(|(initial_ms, max_ms, multiplier)| pb::RetryBackoff { initial_ms, max_ms, multiplier }),
            dead_letter_on_expiry: None,
            max_length,
            max_lease_total_ms: lease_total,
            dedup_window_ms: dedup,
            on_poison: poison,
            content_based_dedup: content,
        }
    }
}

prop_compose! {
    fn message()(
        id in text(),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        props in proptest::collection::vec((text(), text()), 0..4),
        ttl in proptest::option::of(number()),
        delay in proptest::option::of(number()),
        group in text(),
        dedup in text(),
    ) -> pb::PublishMessage {
        pb::PublishMessage {
            message_id: id,
            body: body.into(),
            properties: props.into_iter().collect(),
            ttl_ms: ttl,
            delay_ms: delay,
            group_id: group,
            dedup_id: dedup,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Arbitrary field values through every conversion and rule.
    #[test]
    fn arbitrary_requests_get_answers_not_panics(
        name in prop_oneof![Just("target".to_string()), text()],
        config in queue_config(),
        messages in proptest::collection::vec(message(), 0..4),
        max in prop_oneof![Just(0u32), Just(1), Just(10_000), any::<u32>()],
        wait in number(),
        ack_timeout in proptest::option::of(number()),
        token in prop_oneof![text(), "[0-9a-f]{40}"],
        nack_delay in proptest::option::of(number()),
    ) {
        let e = env();
        e.rt.block_on(async {
            let s = &e.service;
            // A well-formed queue, so later calls reach deep rules, and one
            // no generated name can touch, to check the engine after.
            for q in ["target", SENTINEL] {
                s.create_queue(Request::new(pb::CreateQueueRequest {
                    name: q.into(),
                    config: None,
                }))
                .await
                .expect("a plain queue is created");
            }
            let _ = s.create_queue(Request::new(pb::CreateQueueRequest {
                name: name.clone(),
                config: Some(config.clone()),
            }))
            .await;
            let _ = s.update_queue(Request::new(pb::UpdateQueueRequest {
                name: name.clone(),
                config: Some(config),
                remove_dead_letter: false,
                remove_retry_backoff: true,
                remove_max_length: false,
            }))
            .await;
            let _ = s.publish(Request::new(pb::PublishRequest {
                queue: name.clone(),
                messages: messages.clone(),
                exchange: String::new(),
            }))
            .await;
            let _ = s.publish(Request::new(pb::PublishRequest {
                queue: "target".into(),
                messages,
                exchange: String::new(),
            }))
            .await;
            let got = s.receive(Request::new(pb::ReceiveRequest {
                queue: name.clone(),
                max_messages: max,
                wait_ms: wait.min(5),
                ack_timeout_ms: ack_timeout,
                auto_ack: false,
                ack_tokens: Vec::new(),
                max_per_group: 0,
            }))
            .await;
            let mut tokens = vec![token];
            if let Ok(r) = got {
                tokens.extend(r.into_inner().deliveries.into_iter().map(|d| d.ack_token));
            }
            // Acks riding on a receive, of the generated token and of real ones.
            let _ = s.receive(Request::new(pb::ReceiveRequest {
                queue: name.clone(),
                max_messages: max,
                ack_tokens: tokens.iter().skip(usize::from(wait % 2 == 0)).cloned().collect(),
                ..Default::default()
            }))
            .await;
            let _ = s.extend_lease(Request::new(pb::ExtendLeaseRequest {
                items: tokens.iter().map(|t| pb::ExtendItem { ack_token: t.clone(), timeout_ms: wait }).collect(),
            }))
            .await;
            let _ = s.nack(Request::new(pb::NackRequest {
                items: tokens.iter().map(|t| pb::NackItem {
                    ack_token: t.clone(),
                    delay_ms: nack_delay,
                    reason: "r".repeat(usize::try_from(wait % 5000).unwrap_or(0)),
                    dead_letter: wait % 2 == 0,
                }).collect(),
            }))
            .await;
            let _ = s.ack(Request::new(pb::AckRequest { ack_tokens: tokens })).await;
            let _ = s.browse(Request::new(pb::BrowseRequest {
                queue: name.clone(),
                max_messages: max,
                page_token: name.clone(),
            }))
            .await;
            let _ = s.list_queues(Request::new(pb::ListQueuesRequest {
                prefix: name.clone(),
                page_size: max,
                page_token: name.clone(),
            }))
            .await;
            let _ = s.delete_queue(Request::new(pb::DeleteQueueRequest { name, force: wait % 2 == 0 })).await;
            // The engine still works.
            let ok = s.publish(Request::new(pb::PublishRequest {
                queue: SENTINEL.into(),
                messages: vec![pb::PublishMessage { body: b"still fine".to_vec().into(), ..Default::default() }],
                exchange: String::new(),
            }))
            .await;
            prop_assert!(ok.is_ok(), "{ok:?}");
            Ok(())
        })?;
    }

    /// Requests decoded from arbitrary bytes (what a hostile client can put
    /// on the wire past the protobuf decoder).
    #[test]
    fn requests_from_arbitrary_bytes_get_answers_not_panics(
        raw in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let e = env();
        e.rt.block_on(async {
            let s = &e.service;
            if let Ok(r) = pb::CreateQueueRequest::decode(raw.as_slice()) {
                let _ = s.create_queue(Request::new(r)).await;
            }
            if let Ok(r) = pb::UpdateQueueRequest::decode(raw.as_slice()) {
                let _ = s.update_queue(Request::new(r)).await;
            }
            if let Ok(r) = pb::PublishRequest::decode(raw.as_slice()) {
                let _ = s.publish(Request::new(r)).await;
            }
            if let Ok(mut r) = pb::ReceiveRequest::decode(raw.as_slice()) {
                r.wait_ms = r.wait_ms.min(5);
                let _ = s.receive(Request::new(r)).await;
            }
            if let Ok(r) = pb::NackRequest::decode(raw.as_slice()) {
                let _ = s.nack(Request::new(r)).await;
            }
            if let Ok(r) = pb::ExtendLeaseRequest::decode(raw.as_slice()) {
                let _ = s.extend_lease(Request::new(r)).await;
            }
            if let Ok(r) = pb::BindRequest::decode(raw.as_slice()) {
                let _ = s.bind(Request::new(r)).await;
            }
            if let Ok(r) = pb::ListGroupsRequest::decode(raw.as_slice()) {
                let _ = s.list_groups(Request::new(r)).await;
            }
            if let Ok(r) = pb::ImportDefinitionsRequest::decode(raw.as_slice()) {
                let _ = s.import_definitions(Request::new(r)).await;
            }
            if let Ok(r) = pb::RedriveRequest::decode(raw.as_slice()) {
                let _ = s.redrive(Request::new(r)).await;
            }
        });
    }
}
