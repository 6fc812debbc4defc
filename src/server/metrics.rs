//! The Prometheus endpoint: `GET /metrics` on its own HTTP listener
//! (`--metrics-listen`), in the OpenMetrics text format.
//!
//! Queue figures are read from the engine at each scrape (nothing is
//! counted twice: the counters are the queues' own durable counters, so
//! they survive restarts); the commit path's distributions come from the
//! store's histograms.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::queue::Broker;
use crate::queue::model::QueueStats;

/// Reads the engine and the store at each scrape.
#[derive(Debug)]
struct Figures {
    broker: Arc<Broker>,
    recovery: Duration,
    replayed: u64,
    gate: Arc<super::conns::Gate>,
}

type Pick = fn(&QueueStats) -> u64;

const QUEUE_GAUGES: [(&str, &str, Pick); 5] = [
    ("letterbox_queue_ready", "Messages deliverable now", |s| {
        s.ready
    }),
    (
        "letterbox_queue_in_flight",
        "Messages leased to a consumer",
        |s| s.in_flight,
    ),
    (
        "letterbox_queue_delayed",
        "Messages waiting for a delivery delay or a retry backoff",
        |s| s.delayed,
    ),
    (
        "letterbox_queue_parked",
        "Messages in parked FIFO groups",
        |s| s.parked,
    ),
    (
        "letterbox_queue_messages",
        "All messages stored in the queue",
        |s| s.total,
    ),
];

const QUEUE_COUNTERS: [(&str, &str, Pick); 9] = [
    (
        "letterbox_queue_published",
        "Messages published into the queue",
        |s| s.published,
    ),
    ("letterbox_queue_acked", "Messages acknowledged", |s| {
        s.acked
    }),
    (
        "letterbox_queue_nacked",
        "Failed delivery attempts (nacks, lease expiries, closed streams)",
        |s| s.nacked,
    ),
    (
        "letterbox_queue_expired",
        "Messages whose time to live ran out",
        |s| s.expired,
    ),
    (
        "letterbox_queue_dead_lettered",
        "Messages moved from the queue to its dead letter queue",
        |s| s.dead_lettered,
    ),
    (
        "letterbox_queue_dead_letters_received",
        "Messages moved into the queue as a dead letter queue",
        |s| s.dead_letters_received,
    ),
    (
        "letterbox_queue_purged",
        "Messages deleted by purges",
        |s| s.purged,
    ),
    (
        "letterbox_queue_redriven",
        "Messages moved out by redrives",
        |s| s.redriven,
    ),
    (
        "letterbox_queue_redrive_received",
        "Messages moved in by redrives",
        |s| s.redrive_received,
    ),
];

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let queues = self.broker.all_stats();
        for (name, help, pick) in QUEUE_GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (queue, _, s) in &queues {
                let labels = [("queue", queue.as_str())];
                ConstGauge::new(to_i64(pick(s))).encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, pick) in QUEUE_COUNTERS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (queue, _, s) in &queues {
                let labels = [("queue", queue.as_str())];
                ConstCounter::new(pick(s)).encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "letterbox_queue_dead_letter_depth",
                "Messages in the queue's dead letter queue",
                None,
                MetricType::Gauge,
            )?;
            for (queue, dlq, _) in &queues {
                let Some(dlq) = dlq else { continue };
                let depth = queues
                    .iter()
                    .find(|(n, _, _)| n == dlq)
                    .map_or(0, |(_, _, s)| s.total);
                let labels = [
                    ("queue", queue.as_str()),
                    ("dead_letter_queue", dlq.as_str()),
                ];
                ConstGauge::new(to_i64(depth)).encode(family.encode_family(&labels)?)?;
            }
        }
        let store = self.broker.store().stats();
        let counters: [(&str, &str, u64); 12] = [
            (
                "letterbox_connections_refused",
                "Connections closed at once because --max-connections were open",
                self.gate.refused(),
            ),
            (
                "letterbox_corrupt_records_found",
                "Stored records found damaged (message bodies failing their checksum when read for a delivery or a browse); each damaged message is set aside (RELIABILITY.md)",
                self.broker.corrupt_records_found(),
            ),
            (
                "letterbox_log_syncs",
                "fdatasync calls on the write-ahead log (one per group commit)",
                store.log_syncs,
            ),
            (
                "letterbox_log_caller_commits",
                "Group commits made by a caller waiting alone (its transaction, with at most one queued just before it), not by the log writer thread",
                store.caller_commits,
            ),
            (
                "letterbox_log_records",
                "Transactions made durable in the write-ahead log",
                store.records,
            ),
            (
                "letterbox_log_written_bytes",
                "Bytes written to the write-ahead log",
                store.log_bytes,
            ),
            (
                "letterbox_checkpoints",
                "Checkpoints completed",
                store.checkpoints,
            ),
            (
                "letterbox_payloads_relocated",
                "Message bodies moved to a newer log segment by compaction",
                store.relocated,
            ),
            (
                "letterbox_apply_writes_overtaken",
                "Writes the applier left out of the database because a later delete of the key was already durable",
                store.overtaken,
            ),
            (
                "letterbox_database_rewrites",
                "Database rewrites that gave its free space back to the file system",
                store.rewrites,
            ),
            (
                "letterbox_publish_waits",
                "Publishes that waited for the database to catch up (unapplied changes over --max-unapplied)",
                store.room_waits,
            ),
            (
                "letterbox_recovery_replayed_records",
                "Log records replayed at the last start",
                self.replayed,
            ),
        ];
        for (name, help, v) in counters {
            ConstCounter::new(v).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Counter,
            )?)?;
        }
        let failed = i64::from(self.broker.store().failure().borrow().is_some());
        let gauges: [(&str, &str, f64); 5] = [
            (
                "letterbox_connections_open",
                "Connections open now, over the gRPC, REST and metrics listeners",
                to_f64(self.gate.open() as u64),
            ),
            (
                "letterbox_log_pinned_segments",
                "Log segments kept only for the message bodies they hold",
                to_f64(store.pinned_segments),
            ),
            (
                "letterbox_log_unapplied_bytes",
                "Bytes of durable changes held in memory until they are applied to the database",
                to_f64(store.unapplied_bytes),
            ),
            (
                "letterbox_recovery_seconds",
                "Time the last start took to open, replay and rebuild",
                self.recovery.as_secs_f64(),
            ),
            (
                "letterbox_storage_failed",
                "1 once the storage failed (the server stops, fail-stop)",
                to_f64(u64::try_from(failed).unwrap_or(1)),
            ),
        ];
        for (name, help, v) in gauges {
            ConstGauge::new(v).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn to_f64(v: u64) -> f64 {
    v as f64
}

/// The registry of one server.
pub(crate) fn registry(
    broker: Arc<Broker>,
    recovery: Duration,
    replayed: u64,
    gate: Arc<super::conns::Gate>,
) -> Registry {
    let mut r = Registry::default();
    let m = broker.store().metrics().clone();
    r.register(
        "letterbox_commit_seconds",
        "Time from a change's submission to its durability (the wait of every acknowledged call)",
        m.commit_seconds,
    );
    r.register(
        "letterbox_log_sync_seconds",
        "Time of each group commit's write and fdatasync",
        m.sync_seconds,
    );
    r.register(
        "letterbox_log_sync_batch_records",
        "Transactions made durable by one fdatasync",
        m.batch_records,
    );
    r.register(
        "letterbox_apply_seconds",
        "Time of each application of the changes held in memory to the database",
        m.apply_seconds,
    );
    r.register_collector(Box::new(Figures {
        broker,
        recovery,
        replayed,
        gate,
    }));
    r
}

/// The HTTP routes.
pub(crate) fn router(registry: Registry) -> Router {
    let registry = Arc::new(registry);
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = Arc::clone(&registry);
            async move {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &registry) {
                    Ok(()) => (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                        .into_response(),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }
        }),
    )
}
