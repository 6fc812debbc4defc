//! loadgen: Letterbox's load generator, which measures Letterbox and peer
//! durable queues side by side with the same workloads.
//!
//! ```text
//! loadgen run --target letterbox --workload publish-durable --window 64 --reps 3 --out r.jsonl
//! loadgen report --results r.jsonl --disk results/<run>/disk
//! ```
//!
//! Targets are pluggable: see [`target`]. `letterbox` and the SQS targets
//! (`letterbox-sqs`, `moto-sqs`: [`sqs`]) are always built; the
//! peers (`rabbit-quorum`, `rabbit-quorum-3`, `rabbit-classic`, `nats-js`)
//! need the cargo feature `peers`.

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
pub mod scrape;
pub mod sqs;
pub mod stats;
pub mod target;
pub mod workload;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::io::Write;
use target::{AckMode, Caps, ConsumerMode, Endpoints};
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
        /// directory with fio JSON outputs from tools/bench/disk-limit.sh
        #[arg(long)]
        disk: Option<std::path::PathBuf>,
    },
}

#[derive(Parser)]
struct RunArgs {
    /// letterbox | letterbox-sqs | moto-sqs | tonic-floor | rabbit-quorum |
    /// rabbit-quorum-3 | rabbit-classic | nats-js (see target::connect)
    #[arg(long)]
    target: String,
    #[arg(long, value_enum)]
    workload: Workload,
    /// messages per run
    #[arg(long, default_value_t = 100_000)]
    count: u64,
    /// payload bytes, 16 B to 64 MiB (the server's default limit is 10 MiB)
    #[arg(long, default_value_t = workload::DEFAULT_SIZE,
          value_parser = parse_size)]
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
    /// consume-ack, end-to-end, redelivery, fifo, redrive: pull with
    /// `Receive` long polls, or push over one `Subscribe` stream (Letterbox
    /// only; reported as its own row), or `get`: one AMQP `basic.get` per
    /// message (RabbitMQ only, with --prefetch 1; its own row)
    #[arg(long, value_enum, default_value_t = ConsumerMode::Receive)]
    consumer: ConsumerMode,
    /// fifo: message groups (the run has groups × per-group messages;
    /// `--count` is not used)
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    groups: u64,
    /// fifo: messages per group
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    per_group: u64,
    /// fifo: concurrent consumers
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    consumers: u32,
    /// end-to-end: producer rate limit in msgs/s (0 = unthrottled)
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// redelivery: max deliveries / x-delivery-limit
    #[arg(long, default_value_t = 3)]
    delivery_limit: u32,
    #[arg(long, default_value = "loadgen")]
    queue: String,
    /// PID of the broker process, to record its CPU time per run; a
    /// broker of several processes (a cluster): their PIDs, comma-separated
    /// or the flag repeated, their CPU times added up
    #[arg(long, value_delimiter = ',')]
    broker_pid: Vec<u32>,
    #[arg(long, default_value_t = 1)]
    reps: u32,
    /// number of the first repetition in the results (a script that runs
    /// each repetition of a row as a call of its own, targets alternating,
    /// numbers them 1, 2, 3, ...)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    first_rep: u32,
    /// threads of loadgen's own async runtime, whatever the target: 0 for
    /// one per core (tokio's default), 1 for all of its tasks on one thread
    /// (no wake-ups across threads between a call and its answer)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
    client_threads: u16,
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
    /// Letterbox's metrics endpoint (`letterbox serve --metrics-listen`),
    /// e.g. http://127.0.0.1:9464/metrics: adds fsyncs per second and log
    /// bytes per message to each result
    #[arg(long, env = "LOADGEN_LETTERBOX_METRICS_URL")]
    letterbox_metrics_url: Option<String>,
    #[arg(
        long,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        env = "LOADGEN_AMQP_URL"
    )]
    amqp_url: String,
    /// rabbit-quorum-3: a node of the 3-node cluster (tools/services/rabbit-cluster.sh)
    #[arg(
        long,
        default_value = "amqp://guest:guest@127.0.0.1:5681/%2f",
        env = "LOADGEN_AMQP_CLUSTER_URL"
    )]
    amqp_cluster_url: String,
    #[arg(
        long,
        default_value = "nats://127.0.0.1:4222",
        env = "LOADGEN_NATS_URL"
    )]
    nats_url: String,
    /// letterbox-sqs: Letterbox's SQS endpoint (`letterbox serve --sqs-listen`)
    #[arg(long, default_value = "http://127.0.0.1:9324", env = "LOADGEN_SQS_URL")]
    sqs_url: String,
    /// moto-sqs: moto's server (`moto_server`)
    #[arg(
        long,
        default_value = "http://127.0.0.1:5000",
        env = "LOADGEN_MOTO_URL"
    )]
    moto_url: String,
}

/// Entry point of the `loadgen` binary.
pub fn main() -> Result<()> {
    let cli = Cli::parse();
    let threads = match &cli.cmd {
        Cmd::Run(a) => a.client_threads,
        Cmd::Report { .. } => 1,
    };
    let rt = match threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(n))
            .enable_all()
            .build()?,
    };
    rt.block_on(dispatch(cli))
}

/// Runs loadgen with these arguments (the first is the program name), as
/// the binary would; for tests and other tools.
pub async fn run_cli<I, T>(args: I) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    dispatch(Cli::try_parse_from(args)?).await
}

async fn dispatch(cli: Cli) -> Result<()> {
    stats::now_ns(); // fix the epoch
    match cli.cmd {
        Cmd::Run(a) => run(*a).await,
        Cmd::Report { results, disk } => {
            print!("{}", report::report(&results, disk.as_deref())?);
            Ok(())
        }
    }
}

async fn run(a: RunArgs) -> Result<()> {
    let ep = Endpoints {
        letterbox_url: a.letterbox_url.clone(),
        letterbox_metrics_url: a
            .letterbox_metrics_url
            .clone()
            .filter(|u| !u.is_empty() && a.target == "letterbox"),
        amqp_url: a.amqp_url.clone(),
        amqp_cluster_url: a.amqp_cluster_url.clone(),
        nats_url: a.nats_url.clone(),
        sqs_url: a.sqs_url.clone(),
        moto_url: a.moto_url.clone(),
    };
    let t = target::connect(&a.target, &ep).await?;
    let caps = t.caps();
    let mut p = params(&a);
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
    if let Some(what) = missing_capability(&a, &caps) {
        eprintln!(
            "[{} {}] skipped: target does not support {what}",
            t.name(),
            workload::variant(a.workload, &p),
        );
        return Ok(());
    }
    let requested = workload::requested(a.workload, &p);
    // A client other than the default is a row of its own in the report.
    let variant = match a.client_threads {
        0 => workload::variant(a.workload, &p),
        n => format!("{},client_threads={n}", workload::variant(a.workload, &p)),
    };
    for rep in a.first_rep..a.first_rep.saturating_add(a.reps) {
        let o = workload::run(t.as_ref(), a.workload, &p, &a.queue).await?;
        let secs = o.elapsed.as_secs_f64();
        let r = RunResult {
            target: t.name().to_string(),
            target_desc: t.describe(),
            workload: a.workload,
            variant: variant.clone(),
            label: a.label.clone(),
            rep,
            params: p.clone(),
            requested,
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
        record(&r, a.out.as_deref())?;
    }
    Ok(())
}

/// The workload's parameters from the command line.
fn params(a: &RunArgs) -> Params {
    Params {
        count: a.count,
        size: a.size,
        max_secs: a.max_secs,
        window: a.window,
        batch: a.batch,
        prefetch: a.prefetch,
        ack: a.ack,
        rate: a.rate,
        delivery_limit: a.delivery_limit,
        broker_pid: a.broker_pid.clone(),
        consumer: a.consumer,
        groups: a.groups,
        per_group: a.per_group,
        consumers: a.consumers,
    }
}

/// What the workload needs that the target cannot do, if anything.
fn missing_capability(a: &RunArgs, caps: &Caps) -> Option<&'static str> {
    let needs_sync = a.ack == AckMode::Sync
        && matches!(
            a.workload,
            Workload::ConsumeAck | Workload::EndToEnd | Workload::Fifo
        );
    let consumes = a.workload != Workload::PublishDurable;
    [
        (needs_sync && !caps.sync_ack, "sync acks"),
        (
            a.workload == Workload::Redelivery && !caps.delivery_limit,
            "a delivery limit",
        ),
        (
            consumes && a.consumer == ConsumerMode::Subscribe && !caps.subscribe,
            "--consumer subscribe",
        ),
        (
            consumes && a.consumer == ConsumerMode::Get && !caps.get,
            "--consumer get",
        ),
        (a.workload == Workload::Fifo && !caps.fifo, "FIFO groups"),
        (a.workload == Workload::Redrive && !caps.redrive, "redrive"),
    ]
    .into_iter()
    .find_map(|(miss, what)| miss.then_some(what))
}

/// Prints one run's result (a JSON line on standard output, appended to
/// `out` too, and a summary on standard error).
fn record(r: &RunResult, out: Option<&str>) -> Result<()> {
    let line = serde_json::to_string(r)?;
    println!("{line}");
    if let Some(path) = out {
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
        r.rep,
        r.completed,
        r.elapsed_s,
        r.msgs_per_s,
        r.latency
            .as_ref()
            .map(|l| format!(" p50 {:.2}ms p99 {:.2}ms", l.p50_ms, l.p99_ms))
            .unwrap_or_default(),
        if r.timed_out { " (time-bounded)" } else { "" }
    );
    Ok(())
}

/// `--size`: 16 bytes (timestamp and sequence number) up to 64 MiB.
fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of bytes"))?;
    if !(16..=64 << 20).contains(&n) {
        return Err(format!(
            "{n} bytes is out of range: 16 (timestamp + sequence number) to 67108864 (64 MiB)"
        ));
    }
    Ok(n)
}
