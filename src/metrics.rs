//! The Prometheus endpoint: `GET /metrics` on its own HTTP listener
//! (`--metrics-listen`), in the OpenMetrics text format.
//!
//! Queue figures are read from the engine at each scrape (nothing is
//! counted twice: the counters are the queues' own durable counters, so
//! they survive restarts); the commit path's distributions come from the
//! store's histograms; the front ends register what they count
//! themselves (the gRPC front end its calls, as they end); the
//! connections and consumers come from the front ends' shared kit
//! (`crate::edge`); the process's own figures are read from `/proc` at
//! each scrape.
//!
//! `/metrics` serves the queues' figures summed over all queues
//! (`letterbox_queues_ready`, ...), so that its size does not grow with
//! the number of queues; each queue's figures (`letterbox_queue_ready{queue}`,
//! ...) are at `/metrics/per-queue`, and in `/metrics` as well with
//! `--metrics-per-queue`. `letterbox_build_info` names the version and
//! the commit.
//!
//! With a token (`--metrics-token-file`, `--metrics-token`), both
//! answer 401 unless the request carries `Authorization: Bearer TOKEN`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::edge::Shared;
use crate::edge::consumers::Consumers;
use crate::edge::http::GatedListener;
use crate::queue::Broker;
use crate::queue::model::QueueStats;

/// Reads the engine and the store at each scrape.
#[derive(Debug)]
struct Figures {
    broker: Arc<Broker>,
    recovery: Duration,
    replayed: u64,
    gate: Arc<crate::edge::conns::Gate>,
    consumers: Arc<Consumers>,
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
        |s| s.counters.published,
    ),
    ("letterbox_queue_acked", "Messages acknowledged", |s| {
        s.counters.acked
    }),
    (
        "letterbox_queue_nacked",
        "Failed delivery attempts (nacks, lease expiries, closed streams)",
        |s| s.counters.nacked,
    ),
    (
        "letterbox_queue_expired",
        "Messages whose time to live ran out",
        |s| s.counters.expired,
    ),
    (
        "letterbox_queue_dead_lettered",
        "Messages moved from the queue to its dead letter queue",
        |s| s.counters.dead_lettered,
    ),
    (
        "letterbox_queue_dead_letters_received",
        "Messages moved into the queue as a dead letter queue",
        |s| s.counters.dead_letters_received,
    ),
    (
        "letterbox_queue_purged",
        "Messages deleted by purges",
        |s| s.counters.purged,
    ),
    (
        "letterbox_queue_redriven",
        "Messages moved out by redrives",
        |s| s.counters.redriven,
    ),
    (
        "letterbox_queue_redrive_received",
        "Messages moved in by redrives",
        |s| s.counters.redrive_received,
    ),
];

/// The figures of each queue, with a `queue` label: served at
/// `/metrics/per-queue`, and at `/metrics` too with `--metrics-per-queue`.
/// Their size grows with the number of queues.
#[derive(Debug)]
struct QueueFigures {
    broker: Arc<Broker>,
    consumers: Arc<Consumers>,
}

impl Collector for QueueFigures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let queues = self.broker.all_stats();
        let ages: HashMap<String, u64> = self.broker.oldest_ready_ages().into_iter().collect();
        {
            let mut family = encoder.encode_descriptor(
                "letterbox_queue_oldest_ready_age_seconds",
                "Age of the oldest message deliverable now (0 when none): standard queues, the first ready message; FIFO queues, the oldest head of a group that can deliver",
                None,
                MetricType::Gauge,
            )?;
            for (queue, _, _) in &queues {
                let ms = ages.get(queue).copied().unwrap_or(0);
                let labels = [("queue", queue.as_str())];
                ConstGauge::new(to_f64(ms) / 1000.0).encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let (subscribed, receiving) = self.consumers.counts(Instant::now());
            let mut family = encoder.encode_descriptor(
                "letterbox_queue_consumers",
                "Consumers of the queue: kind=subscribe, Subscribe streams open now; kind=receive, distinct peer addresses whose Receive calls (gRPC or REST) succeeded in the last 60 s",
                None,
                MetricType::Gauge,
            )?;
            for (queue, _, _) in &queues {
                for (kind, counts) in [("subscribe", &subscribed), ("receive", &receiving)] {
                    let n = counts.get(queue).copied().unwrap_or(0);
                    let labels = [("queue", queue.as_str()), ("kind", kind)];
                    ConstGauge::new(to_i64(n as u64)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
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
        Ok(())
    }
}

/// The name of an aggregate over every queue: `letterbox_queues_ready`
/// for `letterbox_queue_ready`.
fn all_queues(name: &str) -> String {
    name.replacen("letterbox_queue_", "letterbox_queues_", 1)
}

/// The figures over all queues together, without a label per queue: a
/// scrape's size does not grow with the number of queues.
fn encode_totals(
    broker: &Broker,
    consumers: &Consumers,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let queues = broker.all_stats();
    ConstGauge::new(to_i64(queues.len() as u64)).encode(encoder.encode_descriptor(
        "letterbox_queues",
        "Queues that exist",
        None,
        MetricType::Gauge,
    )?)?;
    for (name, help, pick) in QUEUE_GAUGES {
        let sum: u64 = queues.iter().map(|(_, _, s)| pick(s)).sum();
        let help = format!("{help}, over all queues");
        ConstGauge::new(to_i64(sum)).encode(encoder.encode_descriptor(
            &all_queues(name),
            &help,
            None,
            MetricType::Gauge,
        )?)?;
    }
    for (name, help, pick) in QUEUE_COUNTERS {
        let sum: u64 = queues.iter().map(|(_, _, s)| pick(s)).sum();
        let help = format!("{help}, over the queues that exist (a deleted queue's leave the sum)");
        ConstCounter::new(sum).encode(encoder.encode_descriptor(
            &all_queues(name),
            &help,
            None,
            MetricType::Counter,
        )?)?;
    }
    let oldest = broker
        .oldest_ready_ages()
        .into_iter()
        .map(|(_, ms)| ms)
        .max()
        .unwrap_or(0);
    ConstGauge::new(to_f64(oldest) / 1000.0).encode(encoder.encode_descriptor(
        "letterbox_queues_oldest_ready_age_seconds",
        "Age of the oldest message deliverable now in any queue (0 when none)",
        None,
        MetricType::Gauge,
    )?)?;
    {
        let (subscribed, receiving) = consumers.counts(Instant::now());
        let mut family = encoder.encode_descriptor(
            "letterbox_queues_consumers",
            "Consumers over all queues: kind=subscribe, Subscribe streams open now; kind=receive, per queue the distinct peers whose Receive calls succeeded in the last 60 s, summed",
            None,
            MetricType::Gauge,
        )?;
        for (kind, counts) in [("subscribe", &subscribed), ("receive", &receiving)] {
            let n: usize = counts.values().sum();
            ConstGauge::new(to_i64(n as u64)).encode(family.encode_family(&[("kind", kind)])?)?;
        }
    }
    let dlqs: std::collections::HashSet<&str> =
        queues.iter().filter_map(|(_, d, _)| d.as_deref()).collect();
    let dead: u64 = queues
        .iter()
        .filter(|(n, _, _)| dlqs.contains(n.as_str()))
        .map(|(_, _, s)| s.total)
        .sum();
    ConstGauge::new(to_i64(dead)).encode(encoder.encode_descriptor(
        "letterbox_queues_dead_letter_messages",
        "Messages in the queues that are some queue's dead letter queue",
        None,
        MetricType::Gauge,
    )?)?;
    Ok(())
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        encode_totals(&self.broker, &self.consumers, &mut encoder)?;
        let store = self.broker.store().stats().unwrap_or_default();
        let counters: [(&str, &str, u64); 12] = [
            (
                "letterbox_connections_refused",
                "Connections closed at once because a cap was reached: --max-connections, --max-connections-per-address for their address, or their listener's share",
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
        let free = self.broker.store().free_bytes();
        let gauges: [(&str, &str, f64); 7] = [
            (
                "letterbox_disk_free_bytes",
                "Free bytes on the data directory's file system, as last measured for the publish floor (every 500 ms and after every MiB of log written)",
                free.map_or(f64::NAN, to_f64),
            ),
            (
                "letterbox_disk_min_free_bytes",
                "Free bytes under which publishes are refused (--min-free-disk)",
                self.broker
                    .store()
                    .min_free_bytes()
                    .map_or(f64::NAN, to_f64),
            ),
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
        encode_process(&mut encoder)
    }
}

/// The process's figures under their usual names (those of the Prometheus
/// client libraries' process collectors), read from `/proc/self`; left
/// out where `/proc` cannot be read.
fn encode_process(encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    let Ok(me) = procfs::process::Process::myself() else {
        return Ok(());
    };
    let Ok(stat) = me.stat() else {
        return Ok(());
    };
    let ticks = to_f64(procfs::ticks_per_second().max(1));
    let cpu = to_f64(stat.utime.saturating_add(stat.stime)) / ticks;
    ConstCounter::new(cpu).encode(encoder.encode_descriptor(
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        None,
        MetricType::Counter,
    )?)?;
    let mut gauges: Vec<(&str, &str, f64)> = vec![
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            to_f64(stat.rss.saturating_mul(procfs::page_size())),
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            to_f64(stat.vsize),
        ),
        (
            "process_threads",
            "Number of OS threads in the process",
            to_f64(u64::try_from(stat.num_threads).unwrap_or(0)),
        ),
    ];
    if let Ok(boot) = procfs::boot_time_secs() {
        gauges.push((
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            to_f64(boot) + to_f64(stat.starttime) / ticks,
        ));
    }
    if let Ok(n) = me.fd_count() {
        gauges.push((
            "process_open_fds",
            "Number of open file descriptors",
            to_f64(n as u64),
        ));
    }
    if let Ok(limits) = me.limits() {
        let max = match limits.max_open_files.soft_limit {
            procfs::process::LimitValue::Value(v) => to_f64(v),
            procfs::process::LimitValue::Unlimited => f64::INFINITY,
        };
        gauges.push((
            "process_max_fds",
            "Maximum number of open file descriptors",
            max,
        ));
    }
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

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn to_f64(v: u64) -> f64 {
    v as f64
}

/// What the registry of one server reads.
struct Sources {
    broker: Arc<Broker>,
    recovery: Duration,
    replayed: u64,
    gate: Arc<crate::edge::conns::Gate>,
    consumers: Arc<Consumers>,
}

/// The registries of one server: `/metrics`'s (per-queue figures in it
/// only with `per_queue`) and `/metrics/per-queue`'s; `front_ends`
/// registers what the front ends count themselves (after the store's
/// histograms).
fn registries(
    sources: Sources,
    per_queue: bool,
    front_ends: impl FnOnce(&mut Registry),
) -> (Registry, Registry) {
    let Sources {
        broker,
        recovery,
        replayed,
        gate,
        consumers,
    } = sources;
    let mut queues = Registry::default();
    queues.register_collector(Box::new(QueueFigures {
        broker: Arc::clone(&broker),
        consumers: Arc::clone(&consumers),
    }));
    let mut r = Registry::default();
    r.register(
        "letterbox_build",
        "The server's version and the commit it was built from",
        prometheus_client::metrics::info::Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", env!("LETTERBOX_COMMIT")),
        ]),
    );
    if per_queue {
        r.register_collector(Box::new(QueueFigures {
            broker: Arc::clone(&broker),
            consumers: Arc::clone(&consumers),
        }));
    }
    // The commit path's distributions, where the backend keeps them (the
    // local one does).
    if let Some(m) = broker.store().metrics().cloned() {
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
    }
    if let Some(m) = broker.store().pg_metrics().cloned() {
        r.register(
            "letterbox_commit_seconds",
            "Time from a change's submission to its durability (the wait of every acknowledged call)",
            m.commit_seconds,
        );
        r.register(
            "letterbox_pg_transaction_seconds",
            "Time of each PostgreSQL transaction of the commit path, from BEGIN to the answer of its COMMIT (with a synchronous standby, its flush too)",
            m.transaction_seconds,
        );
        r.register(
            "letterbox_pg_batch_records",
            "Transactions committed by one PostgreSQL transaction (group commit at work)",
            m.batch_records,
        );
    }
    front_ends(&mut r);
    r.register_collector(Box::new(Figures {
        broker,
        recovery,
        replayed,
        gate,
        consumers,
    }));
    (r, queues)
}

/// True when `headers` carry `Authorization: Bearer TOKEN` with the token
/// whose SHA-256 is `want` (compared in constant time).
fn bearer_ok(headers: &HeaderMap, want: &[u8; 32]) -> bool {
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
    else {
        return false;
    };
    let got: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    got.ct_eq(want).into()
}

/// One registry's page, or 401 without the token `want` is the SHA-256
/// of (when there is one).
fn page(
    registry: &Registry,
    want: Option<&[u8; 32]>,
    headers: &HeaderMap,
) -> axum::response::Response {
    if let Some(want) = want
        && !bearer_ok(headers, want)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required\n",
        )
            .into_response();
    }
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
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

/// The HTTP routes: `/metrics` and `/metrics/per-queue`; with `token`,
/// both need it as a bearer token.
pub(crate) fn router(registry: Registry, per_queue: Registry, token: Option<&str>) -> Router {
    let want: Option<Arc<[u8; 32]>> = token.map(|t| Arc::new(Sha256::digest(t.as_bytes()).into()));
    let serve = |registry: Registry| {
        let registry = Arc::new(registry);
        let want = want.clone();
        get(move |headers: HeaderMap| {
            let registry = Arc::clone(&registry);
            let want = want.clone();
            async move { page(&registry, want.as_deref(), &headers) }
        })
    };
    Router::new()
        .route("/metrics", serve(registry))
        .route("/metrics/per-queue", serve(per_queue))
}

/// What the endpoint tells besides the engine and the front ends' kit.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// How long recovery took at start.
    pub(crate) recovery: Duration,
    /// Log records replayed at start.
    pub(crate) replayed: u64,
    /// A bearer token `/metrics` requires, none when `None`.
    pub(crate) token: Option<String>,
    /// Each queue's figures in `/metrics` too (`--metrics-per-queue`),
    /// not only at `/metrics/per-queue`.
    pub(crate) per_queue: bool,
}

/// Serves the endpoint over `shared`'s engine, connections and consumers
/// on `listener` until `shutdown` resolves; `front_ends` registers what
/// the front ends count themselves.
pub(crate) fn serve(
    listener: GatedListener,
    shared: &Shared,
    opts: Options,
    front_ends: impl FnOnce(&mut Registry),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let sources = Sources {
        broker: Arc::clone(&shared.broker),
        recovery: opts.recovery,
        replayed: opts.replayed,
        gate: Arc::clone(&shared.gate),
        consumers: Arc::clone(&shared.consumers),
    };
    let (registry, per_queue) = registries(sources, opts.per_queue, front_ends);
    let app = router(registry, per_queue, opts.token.as_deref());
    crate::edge::http::serve(listener, app, shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_token_must_match() {
        let want: [u8; 32] = Sha256::digest(b"s3cret").into();
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert!(bearer_ok(&with("Bearer s3cret"), &want));
        assert!(bearer_ok(&with("bearer s3cret"), &want));
        assert!(!bearer_ok(&with("Bearer s3cre"), &want));
        assert!(!bearer_ok(&with("Basic s3cret"), &want));
        assert!(!bearer_ok(&with("s3cret"), &want));
        assert!(!bearer_ok(&HeaderMap::new(), &want));
    }
}
