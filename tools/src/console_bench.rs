//! `console-bench`: what the web console costs. Against release servers
//! that it starts itself (loopback, ports chosen by the system, each on a
//! temporary data directory), it
//!
//! 1. **pages**: creates `--queues` (10,000) queues over gRPC, every 10th
//!    with a dead letter queue of its own (`<name>.dlq`, so 11,000 queues in
//!    all), publishes a few messages into every third, dead-letters
//!    `--dead-letters` (100) messages of `queue-0` into `queue-0.dlq`,
//!    waits for the console's next sample (`--sample-wait`, 6 s: it samples
//!    every 5 s), then GETs each page `--requests` (50) times, one after
//!    another on one keep-alive connection with the session cookie the
//!    first GET set, and reports p50 / p99 / max milliseconds (request sent
//!    to the last byte of the body) per page;
//! 2. **publish**: runs `loadgen`'s publish workload (1 and 64 in flight,
//!    1 KiB, the counts of `tools/bench/bench.sh` divided by `--div`, 4) against a
//!    fresh server per run in three configurations, alternating within each
//!    repetition (`--reps`, 3; the order rotates from one repetition to
//!    the next): `--console-listen off`; the console on and no page open;
//!    the console on with "a page open", a poller that does what an open
//!    queue page and an open overview do (the queue page's two plots each
//!    GET its `history.json` every 5 s; the overview is GET every 5 s).
//!    It reports the median msg/s and p99 per configuration and its ratio
//!    to `off`.
//!
//! `loadgen` runs as its own process, exactly as `tools/bench/bench.sh` runs it
//! (`commands.txt` has every command line); its JSON lines go to
//! `publish.jsonl` and `loadgen report` makes `loadgen-report.md` of them.
//! Everything is written under `--out`; the summary is printed too.

// Figures and CLI glue: the casts between counts, times and floats are
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
use crate::loadgen::target::{AckMode, ConsumerMode, ConsumerSpec, QueueSpec, Target};
use crate::loadgen::workload::publish_n;
use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use letterbox::launch::{NotReady, Serve};
use letterbox::pb::admin_service_client::AdminServiceClient;
use letterbox::pb::messaging_service_client::MessagingServiceClient;
use letterbox::pb::{
    CreateQueueRequest, DeadLetterPolicy, PublishMessage, PublishRequest, QueueConfig, QueueKind,
};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::Endpoint;

#[derive(Parser, Debug)]
#[command(
    name = "console-bench",
    about = "The web console's cost: page times at 10,000 queues, publish throughput with and without it"
)]
struct Args {
    /// The letterbox server binary (default: `letterbox` next to this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// The loadgen binary (default: `loadgen` next to this one).
    #[arg(long)]
    loadgen_bin: Option<PathBuf>,
    /// Where results go (created; files in it are overwritten).
    #[arg(long)]
    out: PathBuf,
    /// The servers' temporary data directories are made under this one.
    #[arg(long, default_value = "/tmp")]
    tmp: PathBuf,
    /// Only the page times (part 1).
    #[arg(long, conflicts_with = "publish_only")]
    pages_only: bool,
    /// Only the publish runs (part 2).
    #[arg(long)]
    publish_only: bool,
    /// Queues for the page times (each 10th gets a DLQ of its own besides).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(10..))]
    queues: u32,
    /// Messages dead-lettered from queue-0 into queue-0.dlq.
    #[arg(long, default_value_t = 100)]
    dead_letters: u64,
    /// Timed GETs of each page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    requests: u32,
    /// Wait after the queues are filled, for the console's next sample
    /// (it samples every 5 s).
    #[arg(long, default_value_t = 6.0)]
    sample_wait: f64,
    /// Repetitions of each publish run in each configuration.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// Divides the publish counts of `tools/bench/bench.sh` (50,000 at 1 in
    /// flight, 200,000 at 64).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    div: u64,
    /// Seconds between two rounds of the open page's requests.
    #[arg(long, default_value_t = 5.0)]
    poll_every: f64,
}

/// Entry point of the `console-bench` binary.
pub fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

fn sibling(name: &str, given: Option<&PathBuf>) -> Result<PathBuf> {
    let p = match given {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .ok_or_else(|| anyhow!("no directory for this executable"))?
            .join(name),
    };
    if !p.exists() {
        bail!(
            "{} not found: build it (`cargo build --release --bin letterbox -p letterbox-tools --bin loadgen --bin console-bench`) or pass --{name}-bin",
            p.display()
        );
    }
    Ok(p)
}

/// Appends a line to `commands.txt`.
struct Log {
    path: PathBuf,
}

impl Log {
    fn line(&self, line: &str) -> Result<()> {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        writeln!(f, "{line}")?;
        Ok(())
    }
}

async fn run(a: Args) -> Result<()> {
    let server = sibling("letterbox", a.server_bin.as_ref())?;
    let loadgen = sibling("loadgen", a.loadgen_bin.as_ref())?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let log = Log {
        path: a.out.join("commands.txt"),
    };
    let _ = std::fs::remove_file(&log.path);
    log.line(&format!(
        "# {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    ))?;
    std::fs::write(a.out.join("env.txt"), env_text(&server))?;
    let mut md = String::new();
    if !a.publish_only {
        let pages = pages(&a, &server, &log).await?;
        md.push_str(&pages);
        std::fs::write(a.out.join("pages.md"), &pages)?;
    }
    if !a.pages_only {
        let publish = publish(&a, &server, &loadgen, &log).await?;
        md.push_str(&publish);
        std::fs::write(a.out.join("publish.md"), &publish)?;
    }
    print!("{md}");
    eprintln!("results in {}", a.out.display());
    Ok(())
}

fn env_text(server: &Path) -> String {
    let cmd = |c: &str, args: &[&str]| {
        Command::new(c)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "?".into());
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let rev = cmd("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !cmd(
        "git",
        &["status", "--porcelain", "--", "src", "tools", "proto"],
    )
    .is_empty();
    format!(
        "date: {}\nkernel: {}\ncpus: {cpus}\ncpu: {cpu}\nload before the run: {}\nrustc: {}\nserver: {}\nletterbox + tools: {rev}{}\n",
        cmd("date", &["-u", "+%FT%TZ"]),
        cmd("uname", &["-r"]),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        cmd("rustc", &["--version"]),
        server.display(),
        if dirty { "+dirty" } else { "" },
    )
}

// ---------------------------------------------------------------- server

/// A `letterbox serve` child on a temporary data directory, every
/// listener on 127.0.0.1 at a port the system chose.
struct Server {
    child: Option<Child>,
    grpc: String,
    metrics: String,
    console: Option<String>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(bin: &Path, tmp: &Path, console: bool, log: &Log) -> Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("console-bench-")
            .tempdir_in(tmp)
            .with_context(|| format!("a temporary directory in {}", tmp.display()))?;
        let console_listen = if console { "127.0.0.1:0" } else { "off" };
        let data = dir.path().join("data");
        let flags = [
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--console-listen",
            console_listen,
        ];
        log.line(&format!(
            "{} serve --data-dir {} {}",
            bin.display(),
            data.display(),
            flags.join(" ")
        ))?;
        let server_log = std::fs::File::create(dir.path().join("server.log"))?;
        let mut serve = Serve::new(bin, &data);
        serve.command().args(flags);
        let mut served = serve
            .spawn(server_log)
            .with_context(|| format!("starting {}", bin.display()))?;
        let waited = served
            .wait(
                |a| a.grpc.is_some() && a.metrics.is_some() && (!console || a.console.is_some()),
                Duration::from_secs(60),
            )
            .await;
        let a = std::mem::take(&mut served.announced);
        let s = Server {
            child: Some(served.child),
            grpc: a.grpc.map(|g| format!("http://{g}")).unwrap_or_default(),
            metrics: a.metrics.unwrap_or_default(),
            console: a.console.map(|c| c.trim_end_matches('/').to_string()),
            _dir: dir,
        };
        match waited {
            Ok(()) => {}
            Err(NotReady::Timeout) => bail!(
                "the server did not announce its listeners in 60 s: {}",
                s.log_tail()
            ),
            Err(NotReady::Exited(_)) => {
                bail!("the server exited while starting: {}", s.log_tail())
            }
        }
        if console && s.console.as_deref().is_some_and(|c| c.starts_with("https")) {
            bail!("the console is served over TLS; this tool speaks plain HTTP");
        }
        Ok(s)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self._dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then waits (SIGKILL after 60 s).
    async fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let t0 = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("the server exited with {status}: {}", self.log_tail());
                }
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the server did not stop within 60 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------- browser

/// One browser tab's connection to the console: one keep-alive HTTP/1.1
/// connection, and the session cookie the first answer set.
struct Browser {
    authority: String,
    send: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    cookie: Option<String>,
}

/// One answer.
struct Answer {
    status: u16,
    bytes: usize,
    took: Duration,
}

impl Browser {
    async fn open(base: &str) -> Result<Browser> {
        let authority = base
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("console URL {base:?} is not http://"))?
            .to_string();
        let tcp = tokio::net::TcpStream::connect(&authority)
            .await
            .with_context(|| format!("connecting to the console at {authority}"))?;
        tcp.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut b = Browser {
            authority,
            send,
            cookie: None,
        };
        // The first GET opens the session.
        let first = b.get("/").await?;
        if first.status != 200 || b.cookie.is_none() {
            bail!(
                "GET / answered {} {}: expected 200 and a letterbox_session cookie",
                first.status,
                if b.cookie.is_some() {
                    "with a cookie"
                } else {
                    "without a cookie"
                }
            );
        }
        Ok(b)
    }

    /// GETs `path`; times it from the request sent to the body's last
    /// byte.
    async fn get(&mut self, path: &str) -> Result<Answer> {
        let mut req = hyper::Request::get(path).header(hyper::header::HOST, &self.authority);
        if let Some(c) = &self.cookie {
            req = req.header(hyper::header::COOKIE, c);
        }
        let req = req.body(Empty::<Bytes>::new())?;
        self.send.ready().await?;
        let t0 = Instant::now();
        let resp = self
            .send
            .send_request(req)
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = resp.status().as_u16();
        for v in resp.headers().get_all(hyper::header::SET_COOKIE) {
            if let Some(pair) = v.to_str().ok().and_then(|s| s.split(';').next())
                && pair.starts_with("letterbox_session=")
            {
                self.cookie = Some(pair.to_string());
            }
        }
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            bytes: body.len(),
            took: t0.elapsed(),
        })
    }
}

// ---------------------------------------------------------------- part 1

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => f64::midpoint(s[n / 2 - 1], s[n / 2]),
    }
}

fn queue_name(i: u32) -> String {
    format!("queue-{i}")
}

/// Creates the queues (64 calls in flight): `queue-0` ... and, for each
/// 10th, its DLQ `queue-N.dlq` first.
async fn create_queues(url: &str, n: u32) -> Result<Duration> {
    let ch = Endpoint::from_shared(url.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let adm = AdminServiceClient::new(ch);
    let in_flight = 64usize;
    let ids: Vec<u32> = (0..n).collect();
    let t0 = Instant::now();
    futures::future::try_join_all((0..in_flight).map(|w| {
        let mut adm = adm.clone();
        let ids = &ids;
        async move {
            for &i in ids.iter().skip(w).step_by(in_flight) {
                let name = queue_name(i);
                let dead_letter = if i % 10 == 0 {
                    let dlq = format!("{name}.dlq");
                    adm.create_queue(CreateQueueRequest {
                        name: dlq.clone(),
                        config: Some(QueueConfig {
                            kind: QueueKind::Standard as i32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| anyhow!("CreateQueue {dlq}: {s}"))?;
                    Some(DeadLetterPolicy {
                        queue: dlq,
                        max_deliveries: 3,
                        ..Default::default()
                    })
                } else {
                    None
                };
                adm.create_queue(CreateQueueRequest {
                    name: name.clone(),
                    config: Some(QueueConfig {
                        kind: QueueKind::Standard as i32,
                        dead_letter,
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
    Ok(t0.elapsed())
}

/// Publishes `1 + i % 5` messages of 1 KiB into every third queue
/// (`i % 3 == 1`), one call per queue, 64 calls in flight. Returns the
/// messages published.
async fn publish_some(url: &str, n: u32) -> Result<u64> {
    let ch = Endpoint::from_shared(url.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let msg = MessagingServiceClient::new(ch);
    let body = Bytes::from(vec![b'm'; 1024]);
    let in_flight = 64usize;
    let ids: Vec<u32> = (0..n).filter(|i| i % 3 == 1).collect();
    let counts = futures::future::try_join_all((0..in_flight).map(|w| {
        let mut msg = msg.clone();
        let (ids, body) = (&ids, body.clone());
        async move {
            let mut sent = 0u64;
            for &i in ids.iter().skip(w).step_by(in_flight) {
                let name = queue_name(i);
                let k = 1 + i % 5;
                msg.publish(PublishRequest {
                    queue: name.clone(),
                    messages: (0..k)
                        .map(|_| PublishMessage {
                            body: body.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .await
                .map_err(|s| anyhow!("Publish {name}: {s}"))?;
                sent += u64::from(k);
            }
            anyhow::Ok(sent)
        }
    }))
    .await?;
    Ok(counts.into_iter().sum())
}

/// `queue-0`: `n` messages published through loadgen's Letterbox target
/// and moved to `queue-0.dlq` (a nack with `dead_letter`), then as many
/// published again and left ready.
async fn dead_letter_some(url: &str, n: u64) -> Result<()> {
    let t = LetterboxTarget::connect(url, None).await?;
    // loadgen's queue layout is this tool's: `<name>` with `<name>.dlq`;
    // reset re-creates both (empty, delivery limit 3).
    let q = QueueSpec {
        name: queue_name(0),
        delivery_limit: Some(3),
        fifo: false,
    };
    t.reset(&q).await?;
    let max = Duration::from_secs(60);
    publish_n(&t, &q, n, 1024, 64, 1, max).await?;
    let mut c = t
        .consumer(
            &q,
            &ConsumerSpec {
                prefetch: 64,
                ack: AckMode::Async,
                mode: ConsumerMode::Receive,
            },
        )
        .await?;
    for got in 0..n {
        let d = tokio::time::timeout(Duration::from_secs(30), c.next())
            .await
            .map_err(|_| anyhow!("no delivery for 30 s after {got} of {n}"))??;
        d.settle.dead_letter().await?;
    }
    c.close().await?;
    publish_n(&t, &q, n, 1024, 64, 1, max).await?;
    Ok(())
}

async fn pages(a: &Args, bin: &Path, log: &Log) -> Result<String> {
    eprintln!("== pages: start a server");
    let mut srv = Server::start(bin, &a.tmp, true, log).await?;
    eprintln!(
        "   server pid {}, console {}",
        srv.pid(),
        srv.console.as_deref().unwrap_or("?")
    );
    let r = pages_on(a, &srv, log).await;
    srv.stop().await?;
    r
}

async fn pages_on(a: &Args, srv: &Server, log: &Log) -> Result<String> {
    let console = srv
        .console
        .clone()
        .ok_or_else(|| anyhow!("the server did not announce its console"))?;
    let nq = a.queues;
    let ndlq = nq.div_ceil(10);
    eprintln!("== pages: create {nq} queues and {ndlq} DLQs");
    let created = create_queues(&srv.grpc, nq).await?;
    eprintln!("   {:.1} s", created.as_secs_f64());
    let published = publish_some(&srv.grpc, nq).await?;
    dead_letter_some(&srv.grpc, a.dead_letters).await?;
    eprintln!(
        "== pages: {published} messages in every third queue, {} dead-lettered into queue-0.dlq; wait {} s for a sample",
        a.dead_letters, a.sample_wait
    );
    tokio::time::sleep(Duration::from_secs_f64(a.sample_wait)).await;
    let one = queue_name(1);
    let dlq = format!("{}.dlq", queue_name(0));
    let last_page = (nq + ndlq).div_ceil(50);
    let page = 150.min(last_page);
    let paths: Vec<(String, String)> = vec![
        ("overview, default sort (name)".into(), "/".into()),
        (
            "overview sorted by ready, descending".into(),
            "/?sort=ready&dir=desc".into(),
        ),
        (
            "overview filtered: name contains queue-99".into(),
            "/?q=queue-99".into(),
        ),
        (format!("overview, page {page}"), format!("/?page={page}")),
        (format!("queue page ({one})"), format!("/queues/{one}")),
        (
            format!("queue plot data, 1 h ({one})"),
            format!("/queues/{one}/history.json?window=1h"),
        ),
        (
            format!("dead letters ({dlq}, {} records)", a.dead_letters),
            format!("/queues/{dlq}/dead-letters"),
        ),
    ];
    let mut b = Browser::open(&console).await?;
    let mut md = String::new();
    writeln!(
        md,
        "## Console pages at {} queues ({nq} + {ndlq} DLQs)\n\n\
         {published} messages in every third queue, {} dead letters in {dlq}; \
         {} GETs of each page in turn on one keep-alive connection, from the request to the \
         last byte of the body (server and client on the same {} cores; p99 of {} is the \
         nearest rank).\n\n\
         | page | GET | p50 ms | p99 ms | max ms | bytes |\n|---|---|---|---|---|---|",
        nq + ndlq,
        a.dead_letters,
        a.requests,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        a.requests,
    )?;
    let mut raw = Vec::new();
    for (what, path) in &paths {
        log.line(&format!("GET {console}{path}   # x{}", a.requests))?;
        let mut ms = Vec::with_capacity(a.requests as usize);
        let mut bytes = 0;
        for _ in 0..a.requests {
            let r = b.get(path).await?;
            if r.status != 200 {
                bail!("GET {path} answered {}", r.status);
            }
            bytes = r.bytes;
            ms.push(r.took.as_secs_f64() * 1000.0);
        }
        let mut sorted = ms.clone();
        sorted.sort_by(f64::total_cmp);
        let (p50, p99, max) = (pct(&sorted, 50.0), pct(&sorted, 99.0), pct(&sorted, 100.0));
        eprintln!("   {path}: p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms, {bytes} B");
        writeln!(
            md,
            "| {what} | `{path}` | {p50:.2} | {p99:.2} | {max:.2} | {bytes} |"
        )?;
        raw.push(json!({"page": what, "path": path, "ms": ms, "bytes": bytes,
            "p50_ms": p50, "p99_ms": p99, "max_ms": max}));
    }
    md.push('\n');
    std::fs::write(
        a.out.join("pages.json"),
        serde_json::to_string_pretty(&json!({
            "queues": nq, "dlqs": ndlq, "messages": published,
            "dead_letters": a.dead_letters, "create_s": created.as_secs_f64(),
            "requests": a.requests, "pages": raw,
        }))?,
    )?;
    Ok(md)
}

// ---------------------------------------------------------------- part 2

/// The three configurations of the publish runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Off,
    Idle,
    Page,
}

impl Setup {
    const ALL: [Setup; 3] = [Setup::Off, Setup::Idle, Setup::Page];

    fn label(self) -> &'static str {
        match self {
            Setup::Off => "console=off",
            Setup::Idle => "console=on,no page",
            Setup::Page => "console=on,page open",
        }
    }
}

/// What the poller did.
#[derive(Debug, Default)]
struct Polled {
    ok: u64,
    failed: u64,
    ms: Vec<f64>,
}

/// An open queue page and an open overview: every `every`, the queue
/// page's two plots each GET its `history.json` (15 minutes, the page's
/// default) and the overview is GET once, until `stop`.
async fn poll(console: String, queue: String, every: Duration, stop: Arc<AtomicBool>) -> Polled {
    let mut out = Polled::default();
    let mut browser: Option<Browser> = None;
    let plot = format!("/queues/{queue}/history.json?window=15m");
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        for path in [plot.as_str(), plot.as_str(), "/"] {
            if browser.is_none() {
                browser = Browser::open(&console).await.ok();
            }
            let Some(b) = browser.as_mut() else {
                out.failed += 1;
                continue;
            };
            match b.get(path).await {
                // The queue is missing between loadgen's delete and
                // create: an answer all the same.
                Ok(r) if r.status == 200 || r.status == 404 => {
                    out.ok += 1;
                    out.ms.push(r.took.as_secs_f64() * 1000.0);
                }
                Ok(_) => out.failed += 1,
                Err(_) => {
                    out.failed += 1;
                    browser = None;
                }
            }
        }
    }
    out
}

/// One publish run: a fresh server in `setup`, loadgen against it.
#[allow(clippy::too_many_arguments)]
async fn publish_run(
    a: &Args,
    server: &Path,
    loadgen: &Path,
    log: &Log,
    setup: Setup,
    rep: u32,
    row: &[String],
    results: &Path,
) -> Result<Option<Polled>> {
    let mut srv = Server::start(server, &a.tmp, setup != Setup::Off, log).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let poller = match (setup, &srv.console) {
        (Setup::Page, Some(c)) => Some(tokio::spawn(poll(
            c.clone(),
            "loadgen".into(),
            Duration::from_secs_f64(a.poll_every),
            Arc::clone(&stop),
        ))),
        (Setup::Page, None) => bail!("the server did not announce its console"),
        _ => None,
    };
    let mut args: Vec<String> = vec![
        "run".into(),
        "--target".into(),
        "letterbox".into(),
        "--workload".into(),
        "publish-durable".into(),
    ];
    args.extend(row.iter().cloned());
    args.extend(
        [
            "--label",
            setup.label(),
            "--first-rep",
            &rep.to_string(),
            "--broker-pid",
            &srv.pid().to_string(),
            "--letterbox-url",
            &srv.grpc,
            "--letterbox-metrics-url",
            &srv.metrics,
            "--out",
            &results.display().to_string(),
        ]
        .map(str::to_string),
    );
    log.line(&format!("{} {}", loadgen.display(), shell_words(&args)))?;
    let out = tokio::process::Command::new(loadgen)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .with_context(|| format!("running {}", loadgen.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("   {}", stderr);
    stop.store(true, Ordering::Relaxed);
    let polled = match poller {
        Some(p) => Some(p.await?),
        None => None,
    };
    srv.stop().await?;
    if !out.status.success() {
        bail!("loadgen failed ({}): {stderr}", out.status);
    }
    Ok(polled)
}

fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.is_empty() || a.contains([' ', ',', '=', '"', '\'']) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn publish(a: &Args, server: &Path, loadgen: &Path, log: &Log) -> Result<String> {
    let results = a.out.join("publish.jsonl");
    let _ = std::fs::remove_file(&results);
    let rows: Vec<(&str, Vec<String>)> = vec![
        (
            "publish, 1 in flight",
            format!("--window 1 --count {} --max-secs 45", 50_000 / a.div)
                .split(' ')
                .map(str::to_string)
                .collect(),
        ),
        (
            "publish, 64 in flight",
            format!("--window 64 --count {} --max-secs 60", 200_000 / a.div)
                .split(' ')
                .map(str::to_string)
                .collect(),
        ),
    ];
    let mut polled = Polled::default();
    for (what, row) in &rows {
        for rep in 1..=a.reps {
            // Each repetition in another order: off, idle, page; idle,
            // page, off; page, off, idle; ...
            for k in 0..3 {
                let setup = Setup::ALL[(k + rep as usize - 1) % 3];
                eprintln!("== {what}, rep {rep}, {}", setup.label());
                if let Some(p) =
                    publish_run(a, server, loadgen, log, setup, rep, row, &results).await?
                {
                    polled.ok += p.ok;
                    polled.failed += p.failed;
                    polled.ms.extend(p.ms);
                }
            }
        }
    }
    // loadgen's own report of every repetition.
    let rep = Command::new(loadgen)
        .args(["report", "--results"])
        .arg(&results)
        .output()
        .with_context(|| format!("running {} report", loadgen.display()))?;
    if rep.status.success() {
        std::fs::write(a.out.join("loadgen-report.md"), &rep.stdout)?;
        log.line(&format!(
            "{} report --results {} > loadgen-report.md",
            loadgen.display(),
            results.display()
        ))?;
    } else {
        eprintln!(
            "loadgen report failed: {}",
            String::from_utf8_lossy(&rep.stderr)
        );
    }
    summarize(a, &rows, &results, &polled)
}

fn summarize(
    a: &Args,
    rows: &[(&str, Vec<String>)],
    results: &Path,
    polled: &Polled,
) -> Result<String> {
    let lines: Vec<Value> = std::fs::read_to_string(results)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let mut md = String::new();
    writeln!(
        md,
        "## Publish with and without the console\n\n\
         1 KiB, durable acks (`loadgen --workload publish-durable`), a fresh server per run, \
         the three configurations alternating within each repetition; medians of {} \
         (each repetition's figure in brackets), ratio of medians to `off`. \
         \"page open\": every {} s the queue page's two plots each GET its history.json and \
         the overview is GET ({} answers, {} failed, p50 {:.1} ms / max {:.1} ms).\n\n\
         | row (messages) | console | msg/s | ÷ off | publish p50 / p99 ms | broker CPU % |\n\
         |---|---|---|---|---|---|",
        a.reps,
        a.poll_every,
        polled.ok,
        polled.failed,
        median(&polled.ms),
        polled.ms.iter().copied().fold(0.0, f64::max),
    )?;
    for (what, row) in rows {
        let window: u64 = row
            .iter()
            .position(|x| x == "--window")
            .and_then(|i| row.get(i + 1))
            .and_then(|w| w.parse().ok())
            .unwrap_or(0);
        let count = row
            .iter()
            .position(|x| x == "--count")
            .and_then(|i| row.get(i + 1))
            .cloned()
            .unwrap_or_default();
        let of = |setup: Setup| -> Vec<&Value> {
            let mut v: Vec<&Value> = lines
                .iter()
                .filter(|l| {
                    l["label"] == setup.label() && l["params"]["window"].as_u64() == Some(window)
                })
                .collect();
            v.sort_by_key(|l| l["rep"].as_u64());
            v
        };
        let base = median(
            &of(Setup::Off)
                .iter()
                .filter_map(|l| l["msgs_per_s"].as_f64())
                .collect::<Vec<_>>(),
        );
        for setup in Setup::ALL {
            let runs = of(setup);
            let f = |k: &dyn Fn(&Value) -> Option<f64>| -> Vec<f64> {
                runs.iter().filter_map(|l| k(l)).collect()
            };
            let rate = f(&|l| l["msgs_per_s"].as_f64());
            let p50 = f(&|l| l["latency"]["p50_ms"].as_f64());
            let p99 = f(&|l| l["latency"]["p99_ms"].as_f64());
            let cpu = f(&|l| l["extra"]["broker_cpu_pct"].as_f64());
            let each = rate
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ");
            let ratio = if setup == Setup::Off {
                "1".to_string()
            } else {
                format!(
                    "{:.3} ({})",
                    median(&rate) / base,
                    rate.iter()
                        .zip(
                            of(Setup::Off)
                                .iter()
                                .filter_map(|l| l["msgs_per_s"].as_f64())
                        )
                        .map(|(r, o)| format!("{:.2}", r / o))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            writeln!(
                md,
                "| {what} ({count}) | {} | {:.0} ({each}) | {ratio} | {:.2} / {:.2} | {:.0} |",
                setup.label().trim_start_matches("console="),
                median(&rate),
                median(&p50),
                median(&p99),
                median(&cpu),
            )?;
        }
    }
    writeln!(
        md,
        "\nThe per-repetition ratio pairs each repetition with `off`'s of the same \
         number (run within the same minute or two)."
    )?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let v: Vec<f64> = (1..=50).map(f64::from).collect();
        assert_eq!(pct(&v, 50.0), 25.0);
        assert_eq!(pct(&v, 99.0), 50.0);
        assert_eq!(pct(&v, 100.0), 50.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn quoted_commands() {
        let args = ["--label", "console=on,no page", "--window", "1"].map(str::to_string);
        assert_eq!(
            shell_words(&args),
            "--label 'console=on,no page' --window 1"
        );
    }
}
