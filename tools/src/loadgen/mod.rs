//! loadgen: Letterbox's load generator, which measures Letterbox and peer
//! durable queues side by side with the same workloads.
//!
//! ```text
//! loadgen run --target letterbox --workload publish-durable --window 64 --reps 3 --out r.jsonl
//! loadgen report --results r.jsonl --disk results/<run>/disk
//! ```
//!
//! Targets are pluggable: see [`target`]. `letterbox` is always built; the
//! peers (`rabbit-quorum`, `rabbit-classic`, `nats-js`) need the cargo
//! feature `peers`.

// Statistics and CLI glue: the casts between counts, sizes and floats are
// intended.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss
)]

#[cfg(feature = "peers")]
pub mod jetstream;
pub mod letterbox;
#[cfg(feature = "peers")]
pub mod rabbit;
pub mod report;
pub mod stats;
pub mod target;
pub mod workload;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::io::Write;
use target::{AckMode, Endpoints};
use workload::{Params, RunResult, Workload};

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "Durable queue load generator (Letterbox; RabbitMQ and NATS JetStream with feature `peers`)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one workload against one target, `--reps` times; one JSON line per rep.
    Run(Box<RunArgs>),
    /// Summarize result files into a markdown table (medians over reps).
    Report {
        /// results .jsonl files
        #[arg(long, num_args = 1.., required = true)]
        results: Vec<String>,
        /// directory with fio JSON outputs from scripts/disk-limit.sh
        #[arg(long)]
        disk: Option<std::path::PathBuf>,
    },
}

#[derive(Parser)]
struct RunArgs {
    /// letterbox | rabbit-quorum | rabbit-classic | nats-js (see target::connect)
    #[arg(long)]
    target: String,
    #[arg(long, value_enum)]
    workload: Workload,
    /// messages per run
    #[arg(long, default_value_t = 100_000)]
    count: u64,
    /// payload bytes
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// wall-clock bound for the measured phase; the run stops by itself
    #[arg(long, default_value_t = 30.0)]
    max_secs: f64,
    /// publish in-flight window (unconfirmed messages)
    #[arg(long, default_value_t = 64)]
    window: u32,
    /// publish-durable: messages per publish request (Letterbox only; the
    /// peers publish one message per call and ignore it)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
    /// consumer prefetch (AMQP basic.qos) / pull batch size (JetStream) /
    /// unsettled deliveries (Letterbox)
    #[arg(long, default_value_t = 256)]
    prefetch: u32,
    /// consumer ack mode
    #[arg(long, value_enum, default_value_t = AckMode::Async)]
    ack: AckMode,
    /// end-to-end: producer rate limit in msgs/s (0 = unthrottled)
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// redelivery: max deliveries / x-delivery-limit
    #[arg(long, default_value_t = 3)]
    delivery_limit: u32,
    #[arg(long, default_value = "loadgen")]
    queue: String,
    /// PID of the broker process, to record its CPU time per run
    #[arg(long)]
    broker_pid: Option<u32>,
    #[arg(long, default_value_t = 1)]
    reps: u32,
    /// free-form label stored with the results (and shown in the report)
    #[arg(long, default_value = "")]
    label: String,
    /// append JSON lines here (stdout always gets them too)
    #[arg(long)]
    out: Option<String>,
    #[arg(
        long,
        default_value = "http://127.0.0.1:50051",
        env = "LOADGEN_LETTERBOX_URL"
    )]
    letterbox_url: String,
    #[arg(
        long,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        env = "LOADGEN_AMQP_URL"
    )]
    amqp_url: String,
    #[arg(
        long,
        default_value = "nats://127.0.0.1:4222",
        env = "LOADGEN_NATS_URL"
    )]
    nats_url: String,
}

/// Entry point of the `loadgen` binary.
pub fn main() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        stats::now_ns(); // fix the epoch
        match Cli::parse().cmd {
            Cmd::Run(a) => run(*a).await,
            Cmd::Report { results, disk } => {
                print!("{}", report::report(&results, disk.as_deref())?);
                Ok(())
            }
        }
    })
}

async fn run(a: RunArgs) -> Result<()> {
    let ep = Endpoints {
        letterbox_url: a.letterbox_url.clone(),
        amqp_url: a.amqp_url.clone(),
        nats_url: a.nats_url.clone(),
    };
    let t = target::connect(&a.target, &ep).await?;
    let caps = t.caps();
    let mut p = Params {
        count: a.count,
        size: a.size,
        max_secs: a.max_secs,
        window: a.window,
        batch: a.batch,
        prefetch: a.prefetch,
        ack: a.ack,
        rate: a.rate,
        delivery_limit: a.delivery_limit,
        broker_pid: a.broker_pid,
    };
    if p.batch > 1 && (!caps.publish_batch || a.workload != Workload::PublishDurable) {
        eprintln!(
            "[{} {}] note: --batch {} ignored ({}); publishing one message per call",
            t.name(),
            serde_json::to_value(a.workload)?.as_str().unwrap_or(""),
            p.batch,
            if caps.publish_batch {
                "only publish-durable batches"
            } else {
                "this target publishes one message per call"
            }
        );
        p.batch = 1;
    }
    let needs_sync =
        a.ack == AckMode::Sync && matches!(a.workload, Workload::ConsumeAck | Workload::EndToEnd);
    let needs_limit = a.workload == Workload::Redelivery;
    if (needs_sync && !caps.sync_ack) || (needs_limit && !caps.delivery_limit) {
        eprintln!(
            "[{} {}] skipped: target does not support {}",
            t.name(),
            workload::variant(a.workload, &p),
            if needs_limit {
                "a delivery limit"
            } else {
                "sync acks"
            }
        );
        return Ok(());
    }
    for rep in 1..=a.reps {
        let o = workload::run(t.as_ref(), a.workload, &p, &a.queue).await?;
        let secs = o.elapsed.as_secs_f64();
        let r = RunResult {
            target: t.name().to_string(),
            target_desc: t.describe(),
            workload: a.workload,
            variant: workload::variant(a.workload, &p),
            label: a.label.clone(),
            rep,
            params: p.clone(),
            requested: a.count,
            completed: o.completed,
            timed_out: o.timed_out,
            elapsed_s: secs,
            msgs_per_s: if secs > 0.0 {
                o.completed as f64 / secs
            } else {
                0.0
            },
            latency: o.latency,
            extra: o.extra,
        };
        let line = serde_json::to_string(&r)?;
        println!("{line}");
        if let Some(path) = &a.out {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            writeln!(f, "{line}")?;
        }
        eprintln!(
            "[{} {} {} rep {}] {} msgs in {:.2}s = {:.0} msg/s{}{}",
            r.target,
            serde_json::to_value(r.workload)?.as_str().unwrap_or(""),
            r.variant,
            rep,
            r.completed,
            secs,
            r.msgs_per_s,
            r.latency
                .as_ref()
                .map(|l| format!(" p50 {:.2}ms p99 {:.2}ms", l.p50_ms, l.p99_ms))
                .unwrap_or_default(),
            if r.timed_out { " (time-bounded)" } else { "" }
        );
    }
    Ok(())
}
