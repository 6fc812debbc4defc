//! `scale`: how Letterbox behaves as it fills up. Against a release server
//! that it starts itself on a fresh data directory, it
//!
//! 1. fills one queue to `--messages` (1 M by default; 10 M with
//!    `--messages 10000000`) messages of `--size` bytes in `--steps` steps,
//!    timing the publishes of each step (batched: `--batch` messages per
//!    call, `--window` in flight), with the server's RSS and disk use after
//!    each step;
//! 2. restarts the server gracefully (SIGTERM) and after `kill -9`, timing
//!    the stop, the time until the first successful call, and reading the
//!    `recovery_ms` the server logs; the RSS after a restart is the index
//!    of the queued messages (nothing else is loaded yet);
//! 3. drains the queue in the same steps (receive + ack, `--prefetch`
//!    unsettled, acks batched), timing each step: throughput at depth;
//! 4. measures the disk before and after the drain and after the next
//!    checkpoints (space reclaimed);
//! 5. creates `--queues` (10,000) queues, publishes one message into each,
//!    lists them all (pages of 1000), timing each.
//!
//! It prints a markdown report (and writes it and a JSON file with the raw
//! figures with `--out`).

// Figures and CLI glue: the casts between counts, sizes and floats are
// intended.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss
)]
// Request literals end in `..Default::default()` even where every field is
// set today, as in loadgen: `letterbox.v1` grows by adding fields.
#![allow(clippy::needless_update)]

use crate::loadgen::letterbox::LetterboxTarget;
use crate::loadgen::scrape::{MetricsUrl, sample};
use crate::loadgen::target::{AckMode, Consumer, ConsumerMode, ConsumerSpec, QueueSpec, Target};
use crate::loadgen::workload::publish_n;
use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use letterbox::launch::Serve;
use letterbox::pb::admin_service_client::AdminServiceClient;
use letterbox::pb::messaging_service_client::MessagingServiceClient;
use letterbox::pb::{
    CreateQueueRequest, GetQueueStatsRequest, ListQueuesRequest, PublishMessage, PublishRequest,
    QueueConfig, QueueKind,
};
use serde_json::{Map, Value, json};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

#[derive(Parser, Debug)]
#[command(
    name = "scale",
    about = "Letterbox at depth: fill, restart, drain, reclaim, many queues"
)]
struct Args {
    /// The letterbox server binary (default: `letterbox` next to this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Work directory: the server's data goes to DIR/data, its log to
    /// DIR/server.log. Wiped at start (it must be empty or hold an earlier
    /// run of this tool).
    #[arg(long, default_value = "/tmp/letterbox-scale")]
    dir: PathBuf,
    /// gRPC port of the server it starts.
    #[arg(long, default_value_t = 50061)]
    port: u16,
    /// Metrics port of the server it starts.
    #[arg(long, default_value_t = 50062)]
    metrics_port: u16,
    /// Messages to fill the queue with (10000000 for the 10 M run).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Fill and drain in this many equal steps.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    steps: u64,
    /// Message body bytes.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=(64 << 20)))]
    size: u64,
    /// Messages per Publish call while filling.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
    /// Messages in flight while filling.
    #[arg(long, default_value_t = 1024)]
    window: u32,
    /// Unsettled deliveries while draining.
    #[arg(long, default_value_t = 256)]
    prefetch: u32,
    /// Drain with Receive long polls or a Subscribe stream.
    #[arg(long, value_enum, default_value_t = ConsumerMode::Receive)]
    consumer: ConsumerMode,
    /// Queues for the many-queues phase (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    queues: u32,
    /// Extra arguments for `letterbox serve` (one string, split on spaces).
    #[arg(long, default_value = "")]
    server_args: String,
    /// Keep the data directory afterwards (it is removed by default).
    #[arg(long)]
    keep: bool,
    /// Also write the report to FILE.md and the raw figures to FILE.json.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Entry point of the `scale` binary.
pub fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// The server process this tool runs.
struct ServerProc {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    metrics_port: u16,
    extra: Vec<String>,
    child: Option<Child>,
}

impl ServerProc {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn metrics(&self) -> MetricsUrl {
        MetricsUrl {
            authority: format!("127.0.0.1:{}", self.metrics_port),
            path: "/metrics".into(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn pid(&self) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| anyhow!("server not running"))
    }

    /// Starts the server; returns the time until a call succeeds.
    async fn start(&mut self) -> Result<Duration> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let t0 = Instant::now();
        let mut serve = Serve::new(&self.bin, &self.data());
        serve
            .command()
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .args(&self.extra);
        // Ready means a call succeeds (below), not the announcement.
        let child = serve
            .spawn(log)
            .with_context(|| format!("starting {}", self.bin.display()))?
            .child;
        self.child = Some(child);
        // First successful call: ListQueues on a fresh connection.
        loop {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "the server exited with {status} while starting; see {}",
                    self.log_path().display()
                );
            }
            if let Ok(ch) = Endpoint::from_shared(self.url())?
                .connect_timeout(Duration::from_millis(200))
                .connect()
                .await
                && AdminServiceClient::new(ch)
                    .list_queues(ListQueuesRequest {
                        page_size: 1,
                        ..Default::default()
                    })
                    .await
                    .is_ok()
            {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(600) {
                bail!("the server did not answer within 600 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the server with SIGTERM (graceful) or SIGKILL; returns the
    /// time until it exited.
    async fn stop(&mut self, graceful: bool) -> Result<Duration> {
        let Some(mut child) = self.child.take() else {
            return Ok(Duration::ZERO);
        };
        let t0 = Instant::now();
        if graceful {
            let st = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .context("running kill -TERM")?;
            if !st.success() {
                bail!("kill -TERM {} failed", child.id());
            }
        } else {
            child.kill()?;
        }
        loop {
            if let Some(status) = child.try_wait()? {
                if graceful && !status.success() {
                    bail!("the server exited with {status} after SIGTERM");
                }
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(120) {
                child.kill()?;
                bail!("the server did not stop within 120 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `recovery_ms` of the last "recovered" line of the server log.
    fn last_recovery_ms(&self) -> Option<u64> {
        let log = std::fs::read_to_string(self.log_path()).ok()?;
        log.lines()
            .rev()
            .map(strip_ansi)
            .find_map(|l| l.split("recovery_ms").nth(1).map(str::to_string))
            .and_then(|v| {
                // text (possibly with colour codes) or JSON: the first
                // number after the field name
                let v = v.trim_start_matches(|c: char| !c.is_ascii_digit());
                v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
            })
    }

    fn rss(&self) -> Result<u64> {
        rss_bytes(self.pid()?)
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A log line without terminal colour codes (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// VmRSS of a process, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// Disk use of a directory tree: allocated bytes (as `du`) and apparent
/// bytes (file sizes).
pub fn disk_use(dir: &Path) -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut alloc = 0u64;
    let mut apparent = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            // a segment retired while we walk
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", d.display())),
        };
        for e in entries {
            let e = e?;
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                alloc += m.blocks() * 512;
                apparent += m.len();
            }
        }
    }
    Ok((alloc, apparent))
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1 << 20) as f64)
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn fmt_rate(x: f64) -> String {
    let s = format!("{x:.0}");
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

async fn admin(url: &str) -> Result<AdminServiceClient<Channel>> {
    Ok(AdminServiceClient::new(
        Endpoint::from_shared(url.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await?,
    )
    .max_decoding_message_size(64 << 20))
}

async fn depth(url: &str, queue: &str) -> Result<u64> {
    let r = admin(url)
        .await?
        .get_queue_stats(GetQueueStatsRequest {
            name: queue.into(),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow!("GetQueueStats {queue}: {s}"))?;
    Ok(r.into_inner().stats.map_or(0, |s| s.total))
}

async fn checkpoints(m: &MetricsUrl) -> Result<u64> {
    let page = m.get().await?;
    sample(&page, "letterbox_checkpoints_total")
        .map(|v| v as u64)
        .ok_or_else(|| anyhow!("no letterbox_checkpoints_total on the metrics page"))
}

/// Receives and acks `n` messages; returns the time taken.
async fn drain(c: &mut dyn Consumer, n: u64) -> Result<Duration> {
    let t0 = Instant::now();
    for got in 0..n {
        let d = tokio::time::timeout(Duration::from_secs(30), c.next())
            .await
            .map_err(|_| anyhow!("no delivery for 30 s after {got} of {n}"))??;
        d.settle.ack().await?;
    }
    Ok(t0.elapsed())
}

/// Prepares the work directory: absent, empty, or an earlier run's.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let ours = dir.join("data").join("FORMAT").exists() || dir.join("server.log").exists();
        let empty = std::fs::read_dir(dir)?.next().is_none();
        if !ours && !empty {
            bail!(
                "{} exists and is not an earlier scale run (no data/FORMAT or server.log); \
                 choose another --dir",
                dir.display()
            );
        }
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

async fn run(a: Args) -> Result<()> {
    let bin = match &a.server_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .ok_or_else(|| anyhow!("no directory for this executable"))?
            .join("letterbox"),
    };
    if !bin.exists() {
        bail!(
            "server binary {} not found: build it (`cargo build --release --bin letterbox`) or pass --server-bin",
            bin.display()
        );
    }
    fresh_dir(&a.dir)?;
    let mut srv = ServerProc {
        bin,
        dir: a.dir.clone(),
        port: a.port,
        metrics_port: a.metrics_port,
        extra: a.server_args.split_whitespace().map(String::from).collect(),
        child: None,
    };
    let mut raw = Map::new();
    let mut md = String::new();
    let r = phases(&a, &mut srv, &mut raw, &mut md).await;
    let _ = srv.stop(true).await;
    if !a.keep {
        let _ = std::fs::remove_dir_all(srv.data());
    }
    r?;
    print!("{md}");
    if let Some(out) = &a.out {
        std::fs::write(out.with_extension("md"), &md)?;
        std::fs::write(
            out.with_extension("json"),
            serde_json::to_string_pretty(&Value::Object(raw))?,
        )?;
        eprintln!(
            "wrote {} and {}",
            out.with_extension("md").display(),
            out.with_extension("json").display()
        );
    }
    Ok(())
}

async fn phases(
    a: &Args,
    srv: &mut ServerProc,
    raw: &mut Map<String, Value>,
    md: &mut String,
) -> Result<()> {
    let n = a.messages;
    let size = a.size as usize;
    let steps = a.steps.min(n);
    let step = n.div_ceil(steps);
    let first = srv.start().await?;
    eprintln!("server up in {first:?} (pid {})", srv.pid()?);
    let rss_empty = srv.rss()?;
    let t = LetterboxTarget::connect(&srv.url(), None).await?;
    let q = QueueSpec {
        name: "scale".into(),
        delivery_limit: None,
        fifo: false,
    };
    t.reset(&q).await?;
    let metrics = srv.metrics();
    writeln!(
        md,
        "## Letterbox at depth: {n} messages of {size} B\n\n\
         Server: `{} serve` {}, on a fresh data directory; fill: `Publish` calls of {} messages, {} in flight; \
         drain: {:?} with {} unsettled, acks batched.\n",
        srv.bin.display(),
        a.server_args,
        a.batch,
        a.window,
        a.consumer,
        a.prefetch
    )?;
    let (rss_full, du_full, apparent_full) = fill(a, srv, &t, &q, step, raw, md).await?;
    restarts(srv, &q, n, rss_empty, raw, md).await?;
    let rss_restarted = srv.rss()?;
    drain_in_steps(a, srv, &q, step, raw, md).await?;
    let (du_drained, _) = disk_use(&srv.data())?;
    let figures = Figures {
        rss_empty,
        rss_full,
        rss_restarted,
        du_full,
        apparent_full,
        du_drained,
    };
    space(a, srv, &metrics, &figures, raw, md).await?;

    // 5. Many queues.
    if a.queues > 0 {
        many_queues(a, srv, raw, md).await?;
    }
    Ok(())
}

/// Phase 1: fills the queue with `a.messages` in steps of `step`, a row per
/// step; returns the server's RSS and the data directory's disk use (du,
/// apparent) once full.
async fn fill(
    a: &Args,
    srv: &ServerProc,
    t: &LetterboxTarget,
    q: &QueueSpec,
    step: u64,
    raw: &mut Map<String, Value>,
    md: &mut String,
) -> Result<(u64, u64, u64)> {
    let n = a.messages;
    let size = a.size as usize;
    let steps = a.steps.min(n);
    writeln!(
        md,
        "### Fill\n\n| step | depth after | publish msg/s | server RSS MiB | data dir MiB (du) |\n|---|---|---|---|---|"
    )?;
    let mut fill = Vec::new();
    let mut depth_now = 0u64;
    for i in 0..steps {
        let k = step.min(n - depth_now);
        if k == 0 {
            break;
        }
        let (acked, took, _, timed_out) =
            publish_n(t, q, k, size, a.window, a.batch, Duration::from_secs(3600)).await?;
        if timed_out || acked != k {
            bail!("step {i}: published {acked}/{k}");
        }
        depth_now += k;
        let rss = srv.rss()?;
        let (du, _) = disk_use(&srv.data())?;
        let r = rate(k, took);
        eprintln!("fill step {}: depth {depth_now}, {r:.0} msg/s", i + 1);
        writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            i + 1,
            depth_now,
            fmt_rate(r),
            mib(rss),
            mib(du)
        )?;
        fill.push(json!({"depth": depth_now, "msgs_per_s": r, "rss": rss, "du": du}));
    }
    raw.insert("fill".into(), json!(fill));
    let got = depth(&srv.url(), &q.name).await?;
    if got != n {
        bail!("the queue holds {got} messages after the fill, expected {n}");
    }
    let rss_full = srv.rss()?;
    let (du_full, apparent_full) = disk_use(&srv.data())?;
    let rates: Vec<f64> = fill
        .iter()
        .filter_map(|f| f["msgs_per_s"].as_f64())
        .collect();
    let (lo, hi) = rates
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    writeln!(
        md,
        "\nPublish throughput over the fill: slowest step {} msg/s, fastest {} msg/s (last ÷ first step: {:.2}).\n",
        fmt_rate(lo),
        fmt_rate(hi),
        rates.last().unwrap_or(&0.0) / rates.first().unwrap_or(&1.0).max(1e-9)
    )?;
    Ok((rss_full, du_full, apparent_full))
}

/// Phase 2: restarts the full server twice, gracefully and with `kill -9`: the
/// stop's and the start's times, the server's recovery_ms, the RSS after
/// the start (the index) per queued message.
async fn restarts(
    srv: &mut ServerProc,
    q: &QueueSpec,
    n: u64,
    rss_empty: u64,
    raw: &mut Map<String, Value>,
    md: &mut String,
) -> Result<()> {
    writeln!(
        md,
        "### Restart with {n} queued messages\n\n| how | stop took | start → first successful call | server's recovery_ms | RSS after start MiB | RSS per queued message |\n|---|---|---|---|---|---|"
    )?;
    let mut restarts = Vec::new();
    for graceful in [true, false] {
        let stopped = srv.stop(graceful).await?;
        let up = srv.start().await?;
        let rec = srv.last_recovery_ms();
        // Let the start settle (the first sweep), then read RSS.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss = srv.rss()?;
        let got = depth(&srv.url(), &q.name).await?;
        if got != n {
            bail!("after the restart the queue holds {got} messages, expected {n}");
        }
        let how = if graceful {
            "graceful (SIGTERM)"
        } else {
            "kill -9"
        };
        eprintln!("restart {how}: up in {up:?}, recovery_ms {rec:?}");
        writeln!(
            md,
            "| {how} | {:.2} s | {:.2} s | {} | {} | {:.0} B |",
            stopped.as_secs_f64(),
            up.as_secs_f64(),
            rec.map_or("?".into(), |r| r.to_string()),
            mib(rss),
            rss.saturating_sub(rss_empty) as f64 / n as f64
        )?;
        restarts.push(
            json!({"graceful": graceful, "stop_s": stopped.as_secs_f64(),
            "first_call_s": up.as_secs_f64(), "recovery_ms": rec, "rss": rss}),
        );
    }
    raw.insert("restarts".into(), json!(restarts));
    Ok(())
}

/// Phase 3: drains the queue in steps of `step` (receive + ack), a row per step.
async fn drain_in_steps(
    a: &Args,
    srv: &ServerProc,
    q: &QueueSpec,
    step: u64,
    raw: &mut Map<String, Value>,
    md: &mut String,
) -> Result<()> {
    let t = LetterboxTarget::connect(&srv.url(), None).await?;
    writeln!(
        md,
        "\n### Drain (receive + ack)\n\n| step | depth before | receive+ack msg/s |\n|---|---|---|"
    )?;
    let mut drains = Vec::new();
    let mut left = a.messages;
    let mut i = 0;
    // One consumer for the whole drain: what it prefetched for the next
    // step is consumed there.
    let spec = ConsumerSpec {
        prefetch: a.prefetch,
        ack: AckMode::Async,
        mode: a.consumer,
    };
    let mut consumer = t.consumer(q, &spec).await?;
    while left > 0 {
        let k = step.min(left);
        let took = drain(consumer.as_mut(), k).await?;
        let r = rate(k, took);
        i += 1;
        eprintln!("drain step {i}: depth {left}, {r:.0} msg/s");
        writeln!(md, "| {i} | {left} | {} |", fmt_rate(r))?;
        drains.push(json!({"depth_before": left, "msgs_per_s": r}));
        left -= k;
    }
    consumer.close().await?;
    raw.insert("drain".into(), json!(drains));
    let got = depth(&srv.url(), &q.name).await?;
    if got != 0 {
        bail!("after the drain the queue holds {got} messages");
    }
    Ok(())
}

/// Memory and disk figures taken along the phases (bytes).
struct Figures {
    rss_empty: u64,
    rss_full: u64,
    rss_restarted: u64,
    du_full: u64,
    apparent_full: u64,
    du_drained: u64,
}

/// Phase 4, space: waits for the next two checkpoints (at most 120 s), then
/// writes the memory and disk figures, the space the drain gave back
/// among them.
async fn space(
    a: &Args,
    srv: &ServerProc,
    metrics: &MetricsUrl,
    f: &Figures,
    raw: &mut Map<String, Value>,
    md: &mut String,
) -> Result<()> {
    let n = a.messages;
    let size = a.size as usize;
    let c0 = checkpoints(metrics).await?;
    let t0 = Instant::now();
    while checkpoints(metrics).await? < c0 + 2 && t0.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let waited = t0.elapsed();
    let (du_reclaimed, _) = disk_use(&srv.data())?;
    writeln!(
        md,
        "\n### Memory and disk\n\n| figure | value |\n|---|---|\n\
         | server RSS, empty | {} MiB |\n\
         | server RSS after the fill | {} MiB ({:.0} B per queued message over empty) |\n\
         | server RSS after a restart with {n} queued (the index) | {} MiB ({:.0} B per queued message over empty) |\n\
         | data dir after the fill (du / apparent) | {} / {} MiB: {:.0} B per message ({size} B bodies) |\n\
         | data dir after the drain | {} MiB |\n\
         | data dir after the next 2 checkpoints ({:.0} s later) | {} MiB (reclaimed {} MiB of {}) |\n",
        mib(f.rss_empty),
        mib(f.rss_full),
        f.rss_full.saturating_sub(f.rss_empty) as f64 / n as f64,
        mib(f.rss_restarted),
        f.rss_restarted.saturating_sub(f.rss_empty) as f64 / n as f64,
        mib(f.du_full),
        mib(f.apparent_full),
        f.du_full as f64 / n as f64,
        mib(f.du_drained),
        waited.as_secs_f64(),
        mib(du_reclaimed),
        mib(f.du_full.saturating_sub(du_reclaimed)),
        mib(f.du_full),
    )?;
    raw.insert(
        "memory_disk".into(),
        json!({"rss_empty": f.rss_empty, "rss_full": f.rss_full, "rss_restarted": f.rss_restarted,
            "du_full": f.du_full, "apparent_full": f.apparent_full, "du_drained": f.du_drained,
            "du_after_checkpoints": du_reclaimed, "checkpoint_wait_s": waited.as_secs_f64()}),
    );
    Ok(())
}

async fn many_queues(
    a: &Args,
    srv: &mut ServerProc,
    raw: &mut Map<String, Value>,
    md: &mut String,
) -> Result<()> {
    let nq = a.queues;
    let url = srv.url();
    let in_flight = 64;
    let names: Vec<String> = (0..nq).map(|i| format!("many-{i:06}")).collect();
    let rss0 = srv.rss()?;
    // Create.
    let adm = admin(&url).await?;
    let t0 = Instant::now();
    futures::future::try_join_all((0..in_flight).map(|w| {
        let mut adm = adm.clone();
        let names = &names;
        async move {
            for name in names.iter().skip(w).step_by(in_flight) {
                adm.create_queue(CreateQueueRequest {
                    name: name.clone(),
                    config: Some(QueueConfig {
                        kind: QueueKind::Standard as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .map_err(|s| anyhow!("CreateQueue {name}: {s}"))?;
            }
            anyhow::Ok(())
        }
    }))
    .await?;
    let created = t0.elapsed();
    // One message into each.
    let ch = Endpoint::from_shared(url.clone())?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let msg = MessagingServiceClient::new(ch);
    let body = bytes::Bytes::from(vec![b'q'; a.size as usize]);
    let t0 = Instant::now();
    futures::future::try_join_all((0..in_flight).map(|w| {
        let mut msg = msg.clone();
        let (names, body) = (&names, body.clone());
        async move {
            for name in names.iter().skip(w).step_by(in_flight) {
                msg.publish(PublishRequest {
                    queue: name.clone(),
                    messages: vec![PublishMessage {
                        body: body.clone(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .await
                .map_err(|s| anyhow!("Publish {name}: {s}"))?;
            }
            anyhow::Ok(())
        }
    }))
    .await?;
    let published = t0.elapsed();
    // List them all.
    let mut adm = admin(&url).await?;
    let t0 = Instant::now();
    let mut listed = 0usize;
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let r = adm
            .list_queues(ListQueuesRequest {
                page_size: 1000,
                page_token: token.clone(),
                prefix: "many-".into(),
            })
            .await
            .map_err(|s| anyhow!("ListQueues: {s}"))?
            .into_inner();
        listed += r.queues.len();
        pages += 1;
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    let list = t0.elapsed();
    if listed != nq as usize {
        bail!("ListQueues returned {listed} queues, expected {nq}");
    }
    let rss1 = srv.rss()?;
    writeln!(
        md,
        "### {nq} queues\n\n| operation | time | rate |\n|---|---|---|\n\
         | create {nq} queues ({in_flight} calls in flight) | {:.2} s | {} queues/s |\n\
         | publish 1 message into each ({in_flight} in flight) | {:.2} s | {} msg/s |\n\
         | list all ({pages} pages of ≤1000) | {:.3} s | {:.1} ms per page |\n\
         | server RSS growth | {} MiB | {:.0} B per queue |\n",
        created.as_secs_f64(),
        fmt_rate(rate(u64::from(nq), created)),
        published.as_secs_f64(),
        fmt_rate(rate(u64::from(nq), published)),
        list.as_secs_f64(),
        list.as_secs_f64() * 1000.0 / f64::from(pages),
        mib(rss1.saturating_sub(rss0)),
        rss1.saturating_sub(rss0) as f64 / f64::from(nq),
    )?;
    raw.insert(
        "queues".into(),
        json!({"queues": nq, "create_s": created.as_secs_f64(), "publish_s": published.as_secs_f64(),
            "list_s": list.as_secs_f64(), "pages": pages, "rss_before": rss0, "rss_after": rss1}),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_and_disk_of_this_process() {
        let rss = rss_bytes(std::process::id()).unwrap();
        assert!(rss > 1 << 20, "{rss}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![1u8; 5_000]).unwrap();
        let (alloc, apparent) = disk_use(dir.path()).unwrap();
        assert_eq!(apparent, 15_000);
        assert!(alloc >= 15_000, "{alloc}");
    }

    #[test]
    fn reads_recovery_ms_from_text_and_json_logs() {
        let dir = tempfile::tempdir().unwrap();
        let srv = ServerProc {
            bin: PathBuf::new(),
            dir: dir.path().to_path_buf(),
            port: 0,
            metrics_port: 0,
            extra: Vec::new(),
            child: None,
        };
        assert_eq!(srv.last_recovery_ms(), None);
        std::fs::write(
            srv.log_path(),
            "x recovered \u{1b}[3mrecovery_ms\u{1b}[0m\u{1b}[2m=\u{1b}[0m634\n\
             {\"fields\":{\"message\":\"recovered\",\"recovery_ms\":71}}\nserving\n",
        )
        .unwrap();
        assert_eq!(srv.last_recovery_ms(), Some(71));
        std::fs::write(
            srv.log_path(),
            "x recovered \u{1b}[3mrecovery_ms\u{1b}[0m\u{1b}[2m=\u{1b}[0m634\n",
        )
        .unwrap();
        assert_eq!(srv.last_recovery_ms(), Some(634));
        std::fs::write(srv.log_path(), "recovered recovery_ms=634 other=5\n").unwrap();
        assert_eq!(srv.last_recovery_ms(), Some(634));
    }

    #[test]
    fn refuses_to_wipe_a_foreign_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious"), b"x").unwrap();
        let e = fresh_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not an earlier scale run"), "{e}");
        assert!(dir.path().join("precious").exists());
        std::fs::write(dir.path().join("server.log"), b"").unwrap();
        fresh_dir(dir.path()).unwrap();
        assert!(!dir.path().join("precious").exists());
    }
}
