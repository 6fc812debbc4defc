//! Every shape a queue's configuration takes, round-tripped: the engine's
//! request, the stored record, the gRPC message, the definitions document
//! and the command line's flags and JSON output (the Anypoint facade's
//! subset is checked in `src/anypoint/admin.rs`).
//!
//! The sample, [`full`], gives every field a value other than its
//! default, so that a field an interface drops comes back at its default
//! and fails the comparison. A field added to `QueueConfig` does not
//! compile here until the sample and
//! `every_value_of_the_sample_differs_from_its_default` give it a value,
//! nor in the exhaustive mappings of each interface until it is mapped.

use std::sync::Arc;

use clap::Parser;

use crate::clock::ManualClock;
use crate::queue::definitions::{self, QueueDef};
use crate::queue::model::{
    DeadLetterPolicy, HOUR, MINUTE, PoisonPolicy, QueueConfig, QueueConfigInput, QueueKind,
    QueueRemovals, RetryBackoff, SECOND,
};
use crate::queue::validate::{default_config, new_config, updated_config};
use crate::queue::{Broker, BrokerOptions};
use crate::storage::{Store, StoreOptions};

/// A FIFO queue's configuration with every value off its default.
pub(crate) fn full() -> QueueConfig {
    QueueConfig {
        kind: QueueKind::Fifo,
        message_ttl: 2 * 24 * HOUR,
        ack_timeout: 90 * SECOND,
        delivery_delay: 5 * SECOND,
        dead_letter: Some(DeadLetterPolicy {
            queue: "orders.dlq".into(),
            max_deliveries: 7,
        }),
        retry_backoff: Some(RetryBackoff {
            initial: 2 * SECOND,
            max: 3 * MINUTE,
            multiplier: 3.0,
        }),
        dead_letter_on_expiry: true,
        max_length: Some(12_345),
        max_lease_total: 6 * HOUR,
        dedup_window: 10 * MINUTE,
        on_poison: PoisonPolicy::ParkGroup,
        content_based_dedup: true,
    }
}

/// [`full`] for a standard queue: the FIFO-only values at their defaults
/// (a standard queue refuses any other).
pub(crate) fn full_standard() -> QueueConfig {
    let d = default_config(QueueKind::Standard);
    QueueConfig {
        kind: QueueKind::Standard,
        dedup_window: d.dedup_window,
        on_poison: d.on_poison,
        content_based_dedup: d.content_based_dedup,
        ..full()
    }
}

#[test]
fn every_value_of_the_sample_differs_from_its_default() {
    let d = QueueConfig::default();
    // No `..`: a new field must be named here.
    let QueueConfig {
        kind,
        message_ttl,
        ack_timeout,
        delivery_delay,
        dead_letter,
        retry_backoff,
        dead_letter_on_expiry,
        max_length,
        max_lease_total,
        dedup_window,
        on_poison,
        content_based_dedup,
    } = full();
    assert_ne!(kind, d.kind);
    assert_ne!(message_ttl, d.message_ttl);
    assert_ne!(ack_timeout, d.ack_timeout);
    assert_ne!(delivery_delay, d.delivery_delay);
    assert_ne!(dead_letter, d.dead_letter);
    assert_ne!(retry_backoff, d.retry_backoff);
    assert_ne!(dead_letter_on_expiry, d.dead_letter_on_expiry);
    assert_ne!(max_length, d.max_length);
    assert_ne!(max_lease_total, d.max_lease_total);
    assert_ne!(dedup_window, d.dedup_window);
    assert_ne!(on_poison, d.on_poison);
    assert_ne!(content_based_dedup, d.content_based_dedup);
    // And the sample is valid, as every round trip below assumes.
    assert_eq!(new_config(&full().to_input()).expect("valid"), full());
    assert_eq!(
        new_config(&full_standard().to_input()).expect("valid"),
        full_standard()
    );
}

#[test]
fn the_defaults_are_those_of_an_empty_request() {
    for kind in [QueueKind::Standard, QueueKind::Fifo] {
        let empty = QueueConfigInput {
            kind: Some(kind),
            ..QueueConfigInput::default()
        };
        assert_eq!(new_config(&empty).expect("valid"), default_config(kind));
    }
    assert_eq!(
        new_config(&QueueConfigInput::default()).expect("valid"),
        QueueConfig::default()
    );
}

#[test]
fn an_update_to_every_value_gives_exactly_those_values() {
    for c in [full(), full_standard()] {
        let base = default_config(c.kind);
        let up = updated_config(&base, &c.to_input(), QueueRemovals::default()).expect("valid");
        assert_eq!(up, c);
        // And back to the defaults, the optional values removed.
        let removals = QueueRemovals {
            dead_letter: true,
            retry_backoff: true,
            max_length: true,
        };
        assert_eq!(
            updated_config(&up, &base.to_input(), removals).expect("valid"),
            base,
            "{:?}",
            c.kind
        );
    }
}

#[test]
fn the_grpc_message_carries_every_value() {
    use crate::grpc::convert::{config_input, config_pb};
    for c in [full(), full_standard()] {
        let pb = config_pb(&c);
        if !c.kind.is_fifo() {
            // A standard queue's message leaves the FIFO-only values
            // unset, which a request refuses set.
            assert_eq!(pb.dedup_window_ms, None);
            assert_eq!(pb.on_poison, 0);
            assert_eq!(pb.content_based_dedup, None);
        }
        let input = config_input(Some(pb)).expect("converts");
        assert_eq!(new_config(&input).expect("valid"), c);
        // A config in force sent back as an update changes nothing.
        assert_eq!(
            updated_config(&c, &input, QueueRemovals::default()).expect("valid"),
            c
        );
    }
}

#[test]
fn the_definitions_entry_carries_every_value() {
    for c in [full(), full_standard()] {
        let def = definitions::queue_def("orders", &c);
        let json = serde_json::to_string(&def).expect("serializes");
        let back: QueueDef = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, def);
        let input = definitions::input(0, &back).expect("converts");
        assert_eq!(new_config(&input).expect("valid"), c, "{json}");
    }
}

/// The command line's flags for [`full`], as a person would type them.
const FULL_FLAGS: &[&str] = &[
    "--fifo",
    "--ttl",
    "2d",
    "--ack-timeout",
    "90s",
    "--delay",
    "5s",
    "--dlq",
    "orders.dlq",
    "--max-deliveries",
    "7",
    "--dead-letter-on-expiry",
    "true",
    "--backoff",
    "2s,3m,3",
    "--max-length",
    "12345",
    "--max-lease-total",
    "6h",
    "--dedup-window",
    "10m",
    "--on-poison",
    "park",
    "--content-based-dedup",
    "true",
];

#[derive(Debug, Parser)]
struct Flags {
    #[command(flatten)]
    config: crate::cli::queue::ConfigArgs,
}

#[test]
fn the_command_line_flags_set_every_value() {
    use crate::grpc::convert::config_input;
    let flags = Flags::try_parse_from(std::iter::once("queue").chain(FULL_FLAGS.iter().copied()))
        .expect("flags parse");
    let pb = flags.config.to_pb().expect("converts");
    let input = config_input(Some(pb)).expect("converts");
    assert_eq!(new_config(&input).expect("valid"), full());
    // No flag: nothing set, every default.
    let none = Flags::try_parse_from(["queue"]).expect("flags parse");
    let input = config_input(Some(none.config.to_pb().expect("converts"))).expect("converts");
    assert_eq!(input, QueueConfigInput::default());
}

#[test]
fn the_command_lines_json_names_every_value_as_the_definitions_do() {
    use crate::grpc::convert::config_pb;
    let c = full();
    let shown = crate::cli::output::config_json(&config_pb(&c));
    let mut def = serde_json::to_value(definitions::queue_def("orders", &c)).expect("json");
    if let Some(m) = def.as_object_mut() {
        m.remove("name");
    }
    assert_eq!(shown, def);
}

#[tokio::test]
async fn the_stored_record_keeps_every_value_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let opts = || StoreOptions {
        segment_size: 1 << 20,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let open = || {
        let (store, _) = Store::open(dir.path(), opts()).expect("store opens");
        Broker::open(store, clock.clone(), BrokerOptions::default()).expect("broker opens")
    };
    let b = open();
    let fifo_dlq = QueueConfigInput {
        kind: Some(QueueKind::Fifo),
        ..QueueConfigInput::default()
    };
    b.create_queue("orders.dlq", &fifo_dlq).await.expect("dlq");
    b.create_queue("std.dlq", &QueueConfigInput::default())
        .await
        .expect("dlq");
    b.create_queue("fifo", &full().to_input())
        .await
        .expect("created");
    let standard = QueueConfig {
        dead_letter: Some(DeadLetterPolicy {
            queue: "std.dlq".into(),
            max_deliveries: 7,
        }),
        ..full_standard()
    };
    b.create_queue("standard", &QueueConfigInput::default())
        .await
        .expect("created");
    b.update_queue("standard", &standard.to_input(), QueueRemovals::default())
        .await
        .expect("updated");
    b.close().expect("closes");
    let b = open();
    assert_eq!(b.get_queue("fifo").expect("kept").config, full());
    assert_eq!(b.get_queue("standard").expect("kept").config, standard);
    b.close().expect("closes");
}
