//! `chaos`: crash-safety testing of Letterbox.
//!
//! A seeded mixed workload (see [`workload`]) runs against a real server
//! process that a nemesis kills at chosen moments and restarts on the same
//! data directory, cycle after cycle: SIGKILL at a random moment, during
//! start-up, right after a graceful shutdown began, or from inside the
//! server at the n-th call of a class of file-system calls (fdatasync,
//! fsync, rename, pwrite... through the LD_PRELOAD library in
//! `tools/shim/`). With `--power-loss` every stop is also a power cut: the
//! data directory is replaced by what the library's durable mirror says
//! survives (only fsynced data, only fsynced directory entries).
//!
//! Every call is recorded on the client side (invoke, then ok / fail /
//! info); at the end the workload drains every queue, the server is
//! restarted once more, `letterbox verify` checks the data directory, and
//! the checker judges the history against the invariants I1-I17 (see
//! [`checker`]). The run prints a table and the seed, and fails on any
//! violation.
//!
//! With `--pair` (the PostgreSQL store: `--server-arg=--store ...`) two
//! nodes share the store, both `--standby`: each cycle ends the node
//! that owns the lease (at a kill point class), the other takes over,
//! and the ended node starts again as the new standby; the workload
//! lists both nodes.
//!
//! ```text
//! chaos --seed 7 --cycles 40                  # kill -9 chaos
//! chaos --seed 7 --cycles 30 --power-loss     # power cuts
//! chaos --seed 7 --cycles 10 --pair --no-verify --classes random,startup,storm,shutdown,graceful \
//!       --server-arg=--store --server-arg=postgres://... --server-arg=--lease-ttl --server-arg=2s
//! ```

// Figures and timings: the casts between counts and floats are intended.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss
)]

pub mod checker;
#[cfg(test)]
mod checker_tests;
pub mod damage;
pub mod history;
mod nemesis;
mod pair;
mod report;
pub mod server;
pub mod shim;
pub mod soak;
pub mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;

use history::History;
use server::{Server, ServerSpec};
use workload::Shared;

/// Command-line options.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "chaos",
    about = "Kill -9 and power-loss testing of Letterbox with a seeded workload and a history checker"
)]
pub struct Args {
    /// Seed of every random choice (workload, fates, kill points); a
    /// random one if not given. Printed first.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Kill cycles (server starts after the first).
    #[arg(long, default_value_t = 30)]
    pub cycles: u64,
    /// Simulate a power cut at every stop (durable mirror).
    #[arg(long)]
    pub power_loss: bool,
    /// Mirror mode: strict (only synced data survives; sync_file_range does
    /// not count), lenient (sync_file_range counts), or torn (strict, plus
    /// a random half of the pages written but not synced: torn and
    /// reordered write-back).
    #[arg(long, default_value = "strict")]
    pub shim_mode: String,
    /// The `letterbox` binary (default: next to this program).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// Working directory of the run (default: a new directory under the
    /// system's temporary directory, removed after a passing run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the working directory even when the run passes.
    #[arg(long)]
    pub keep: bool,
    /// Write the history as JSON lines to this file.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Producers.
    #[arg(long, default_value_t = 3)]
    pub producers: usize,
    /// Consumers on unary receives (one more consumes Subscribe streams).
    #[arg(long, default_value_t = 3)]
    pub consumers: usize,
    /// Longest time a server runs before it is killed, in ms.
    #[arg(long, default_value_t = 2500)]
    pub max_run_ms: u64,
    /// Fail unless every kill point class was hit at least this many
    /// times.
    #[arg(long, default_value_t = 0)]
    pub min_hits: u64,
    /// Invert the verdict: succeed only if the checker finds violations of
    /// this invariant, or of one of these (comma-separated), for negative
    /// controls: e.g. `I1` or `I1,I4`.
    #[arg(long)]
    pub expect_violation: Option<String>,
    /// Skip `letterbox verify` of the data directory at the end.
    #[arg(long)]
    pub no_verify: bool,
    /// Share of poison messages (never acked, so dead-lettered), percent.
    #[arg(long, default_value_t = 5)]
    pub poison_percent: u64,
    /// Kill point classes to use, comma-separated (default: all): random,
    /// startup, storm, shutdown, graceful, sys:<call> for fdatasync, fsync,
    /// pwrite, rename, unlink, create.
    #[arg(long, value_delimiter = ',')]
    pub classes: Vec<String>,
    /// Soak instead of chaos: run the workload against one server, with
    /// no kills, for this many seconds, sampling memory, disk use and log
    /// size (consumers pause 40 s out of every 120 s so that backlogs
    /// build up and drain). The server runs with its default settings.
    #[arg(long)]
    pub soak_secs: Option<u64>,
    /// Soak: seconds between samples.
    #[arg(long, default_value_t = 10)]
    pub sample_secs: u64,
    /// Damage mode: before about two cycles in three (the server down), delete,
    /// zero or truncate a log segment (docs/reliability/chaos.md, "Damage mode"); the
    /// next start must refuse naming the file (the segment is then put
    /// back) or start with nothing acknowledged missing. With
    /// `--min-hits`, every damage kind must also have been applied that
    /// many times.
    #[arg(long)]
    pub damage: bool,
    /// Damage mode: only these kinds (comma-separated; default all), e.g.
    /// for a negative control that concerns some of them.
    #[arg(long, value_delimiter = ',')]
    pub damage_kinds: Vec<String>,
    /// Extra flag for `letterbox serve` (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Two nodes on one shared store (give it with `--server-arg=--store`
    /// and a `postgres://` URL, and a short `--lease-ttl`): nodes `a` and
    /// `b` on ports of their own, both `--standby`. Each cycle ends the
    /// node that owns the lease by the cycle's kill point class, the
    /// other node takes over, and the ended node starts again as the
    /// standby (startup and storm: the node taking over is killed too,
    /// before it serves, and both start again). The workload lists both
    /// nodes. Only the classes random, startup, storm, shutdown and
    /// graceful; no power loss, damage or soak.
    #[arg(long)]
    pub pair: bool,
    /// Shell command that crashes the store's database, for the kill
    /// point class `db-crash` (with `--db-up-cmd`; give the class with
    /// `--classes`), e.g. `tools/services/pg-local.sh stop DIR`, an immediate
    /// shutdown that leaves PostgreSQL to recover from its WAL.
    #[arg(long)]
    pub db_crash_cmd: Option<String>,
    /// Shell command that starts the database again after
    /// `--db-crash-cmd`, e.g. `tools/services/pg-local.sh up DIR`.
    #[arg(long)]
    pub db_up_cmd: Option<String>,
}

/// Soak: most messages waiting in the workload's queues before producers
/// pause (the consumers, paused a third of the time, are slower than the
/// producers, so without a cap the backlog only grows).
const SOAK_BACKLOG_CAP: u64 = 20_000;

/// Power cuts during the very first start, before epoch 1 (power-loss
/// mode), each at the n-th fsync for an n drawn up to
/// [`FIRST_START_FSYNCS`].
const FIRST_START_CUTS: u64 = 3;
/// About as many fsyncs as a first start makes before it listens.
const FIRST_START_FSYNCS: u64 = 12;

/// Kill point classes, each a way a server epoch ends.
const NEMESIS_CLASSES: [&str; 5] = ["random", "startup", "shutdown", "graceful", "storm"];
/// The class that crashes the database under a serving server
/// (`--db-crash-cmd`), given by `--classes` only.
const DB_CRASH: &str = "db-crash";
/// Library classes used as kill points, with the guess of how many calls
/// an epoch makes before the first measurements replace it.
/// (`sync_file_range` is intercepted but not a class: the server no
/// longer calls it, see `vendor/sled/PATCHED.md`.)
const SYSCALL_CLASSES: [(&str, u64); 6] = [
    ("fdatasync", 200),
    ("fsync", 20),
    ("pwrite", 300),
    ("rename", 4),
    ("unlink", 2),
    ("create", 4),
];

/// Entry point of the `chaos` binary.
pub fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    let code = runtime.block_on(run(args))?;
    std::process::exit(code);
}

/// What happened to one server epoch.
struct EpochEnd {
    epoch: u64,
    class: String,
    status: Option<std::process::ExitStatus>,
}

struct Nemesis {
    spec: ServerSpec,
    /// The server's counters of rare paths, read while the run goes on.
    counters: server::Counters,
    hist: Arc<History>,
    rng: fastrand::Rng,
    epoch: u64,
    /// Kill point class → hits.
    hits: BTreeMap<String, u64>,
    /// Library call counts of all epochs.
    calls: BTreeMap<&'static str, u64>,
    /// Per class: calls seen in all epochs and epochs seen (to aim the n
    /// of kill points at the mean).
    per_epoch: BTreeMap<&'static str, (u64, u64)>,
    /// Kill point classes planned but not hit, retried next.
    misses: BTreeMap<String, u32>,
    health: Vec<String>,
    ready_times: Vec<Duration>,
    /// How long graceful stops took, SIGTERM to exit.
    stop_times: Vec<Duration>,
    max_run: Duration,
    power: bool,
    run_dir: PathBuf,
    restores: u64,
    /// Torn mode: unsynced pages let through into rebuilt files.
    torn_pages: u64,
    plan: Vec<String>,
    classes: Vec<String>,
    soak: bool,
    /// Damage mode: the kinds in play (`--damage-kinds`, or all).
    damage_kinds: Vec<&'static str>,
    /// Damage kind → (applied, start refused naming the file, started).
    damage_outcomes: BTreeMap<&'static str, (u64, u64, u64)>,
    /// Times the coverage gate requires each damage kind of
    /// [`damage::REQUIRED`] (`--min-hits`, at least once).
    damage_min: u64,
    /// Damage kinds the coverage gate still requires that a damage round
    /// could not apply to the directory as it was, and none has since:
    /// while there is one, every cycle has a damage round, and the starts
    /// use small log segments and no timed checkpoint (see
    /// [`Self::flags`]), so that the log soon spans the segments those
    /// kinds need.
    damage_waiting: Vec<&'static str>,
    /// Starts after a damage the rule must refuse (the invariants judge
    /// whether anything was lost).
    damage_unrefused: Vec<String>,
    /// Byte ranges of the server log written by starts that refused a
    /// damaged directory, as they must: their "corrupt data" lines are
    /// expected.
    excused_log: Vec<(u64, u64)>,
    /// `--pair`: the other node and the pair's state.
    pair: Option<Pair>,
    /// `--db-crash-cmd` and `--db-up-cmd`.
    db: Option<(String, String)>,
}

/// Runs `cmd` with `sh -c`; fails unless it succeeds.
fn shell(cmd: &str) -> Result<()> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The two nodes of `--pair`. `Nemesis::spec` is always the node that
/// owns the lease (or is to): the two specs swap at a takeover.
struct Pair {
    /// The spec of the node that is not `Nemesis::spec`'s.
    other: ServerSpec,
    /// The index (0 for `a`, 1 for `b`) of `Nemesis::spec`'s node.
    cur: usize,
    /// `Nemesis::spec`'s node while it serves, with its epoch.
    owner: Option<(Server, u64)>,
    /// The other node while it runs as the standby, with its epoch.
    standby: Option<(Server, u64)>,
    /// Per takeover: from the owner's end (its kill, or its exit after
    /// SIGTERM) to the standby serving.
    takeovers: Vec<Duration>,
    /// After kills of nodes taking over (startup, storm): from the last
    /// kill to one of the two nodes started again serving.
    comebacks: Vec<Duration>,
    /// Nodes killed while taking over, before they served (startup and
    /// storm).
    takeover_kills: u64,
}

/// Every kill point class, once each.
fn all_classes() -> Vec<String> {
    NEMESIS_CLASSES
        .iter()
        .map(|c| c.to_string())
        .chain(SYSCALL_CLASSES.iter().map(|(c, _)| format!("sys:{c}")))
        .collect()
}

fn default_server_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("program directory")?;
    Ok(dir.join("letterbox"))
}

/// Runs `letterbox verify` on the data directory.
fn verify(bin: &Path, data: &Path) -> Result<Option<String>> {
    verify_applied(bin, data).map(|(problem, _)| problem)
}

/// [`verify`], and the lsn the database had applied the log to (its
/// "applied lsn" figure), if it says.
fn verify_applied(bin: &Path, data: &Path) -> Result<(Option<String>, Option<u64>)> {
    let out = std::process::Command::new(bin)
        .arg("verify")
        .arg("--data-dir")
        .arg(data)
        .output()
        .with_context(|| format!("running {} verify", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let applied = stdout.lines().find_map(|l| {
        l.trim()
            .strip_prefix("applied lsn")
            .and_then(|n| n.trim().parse().ok())
    });
    if out.status.success() {
        Ok((None, applied))
    } else {
        Ok((
            Some(format!(
                "letterbox verify failed ({}): {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )),
            applied,
        ))
    }
}

/// The damage kinds `--damage-kinds` names (all when it names none).
fn damage_kinds(names: &[String]) -> Result<Vec<&'static str>> {
    if names.is_empty() {
        return Ok(damage::KINDS.to_vec());
    }
    names
        .iter()
        .map(|n| {
            damage::KINDS
                .iter()
                .copied()
                .find(|k| k == n)
                .with_context(|| {
                    format!(
                        "--damage-kinds: {n:?} is not a damage kind (known: {})",
                        damage::KINDS.join(", ")
                    )
                })
        })
        .collect()
}

/// Runs the whole test; returns the process exit code.
pub async fn run(args: Args) -> Result<i32> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    println!(
        "chaos: seed {seed} ({}{}, {} cycles)",
        if args.power_loss {
            format!("power loss, {} mirror", args.shim_mode)
        } else {
            "kill -9".to_string()
        },
        if args.pair {
            ", two nodes taking over"
        } else {
            ""
        },
        args.cycles
    );
    let db = check_args(&args)?;
    let bin = match &args.server_bin {
        Some(b) => b.clone(),
        None => default_server_bin()?,
    };
    if !bin.exists() {
        bail!(
            "server binary {} not found (build it, or pass --server-bin)",
            bin.display()
        );
    }
    let run_dir = make_run_dir(&args, seed)?;
    let (spec, other) = server_specs(&args, &bin, &run_dir)?;
    let url = match &other {
        Some(b) => format!("http://127.0.0.1:{},http://127.0.0.1:{}", spec.port, b.port),
        None => format!("http://127.0.0.1:{}", spec.port),
    };
    let _ = std::fs::remove_file(&spec.log);
    let log_file = match &args.history {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let hist = Arc::new(History::new(log_file));
    let mut nem = Nemesis::new(&args, seed, spec, other, Arc::clone(&hist), &run_dir, db)?;
    let started = Instant::now();
    let sh = Arc::new(Shared {
        hist: Arc::clone(&hist),
        seed,
        phase: AtomicU8::new(workload::RUNNING),
        quiet: AtomicBool::new(false),
        inflight: AtomicUsize::new(0),
        paused: AtomicBool::new(false),
        backlog: std::sync::atomic::AtomicU64::new(0),
        // A soak's backlog grows while consumers pause and must drain
        // again: producers wait above this.
        backlog_cap: if args.soak_secs.is_some() {
            SOAK_BACKLOG_CAP
        } else {
            0
        },
        url,
    });

    if nem.power && args.soak_secs.is_none() {
        nem.first_start_cuts().await?;
    }
    // Epoch 1: create the queues, start the workers.
    let mut first = nem.spawn(None)?;
    if !nem.ready(&mut first).await? {
        bail!(
            "the server did not start: {}",
            server::log_tail(&nem.spec.log, 20)
        );
    }
    workload::setup(&sh).await?;
    let workers = Workers::start(&sh, &args);
    let (running, soak_samples) = first_epoch(&mut nem, &sh, &args, &run_dir, first).await?;
    cycles(&mut nem, &args, started).await?;

    // Final phase: a clean server, producers and admin stop, consumers ack
    // everything but poison, until every queue is empty.
    let Some((s, running_epoch)) = final_server(&mut nem, running).await? else {
        // A start refused on a directory this run did not damage (or put
        // back): the server found lost data and stopped, which the health
        // invariant counts; there is nothing left to drain.
        workers.abandon(&sh).await;
        let code = verdict(&args, seed, &nem, &hist, started.elapsed());
        println!("chaos: run directory kept: {}", run_dir.display());
        return Ok(code);
    };
    workers.drain(&sh, &mut nem).await;
    if !soak_samples.is_empty() {
        // Two checkpoints (30 s apart by default) retire what the drain
        // freed.
        tokio::time::sleep(Duration::from_secs(65)).await;
        let after = soak::Sample {
            at: started.elapsed().as_secs_f64(),
            rss: soak::rss(s.pid()),
            disk: soak::disk_use(&nem.spec.data),
            wal: soak::disk_use(&nem.spec.data.join("wal")),
            wal_files: soak::files_in(&nem.spec.data.join("wal")),
            log: std::fs::metadata(&nem.spec.log).map_or(0, |m| m.len()),
            backlog: workload_totals(&sh).await.unwrap_or(0),
            paused: false,
        };
        report::soak_verdict(&soak_samples, after, &mut nem.health);
    }
    let epoch = running_epoch.unwrap_or(nem.epoch);
    nem.final_stop(s, epoch).await?;
    after_restart(&mut nem, &sh, &args, &bin).await?;

    let code = verdict(&args, seed, &nem, &hist, started.elapsed());
    if code == 0 && !args.keep && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&run_dir);
    } else {
        println!("chaos: run directory kept: {}", run_dir.display());
    }
    Ok(code)
}

/// Checks the options that go together or exclude each other; returns
/// `--db-crash-cmd` and `--db-up-cmd`, if given.
fn check_args(args: &Args) -> Result<Option<(String, String)>> {
    let known: Vec<String> = NEMESIS_CLASSES
        .iter()
        .map(|s| s.to_string())
        .chain(SYSCALL_CLASSES.iter().map(|(c, _)| format!("sys:{c}")))
        .chain([DB_CRASH.to_string()])
        .collect();
    if let Some(bad) = args.classes.iter().find(|c| !known.contains(c)) {
        bail!(
            "--classes: {bad:?} is not a kill point class (known: {})",
            known.join(", ")
        );
    }
    let db = match (&args.db_crash_cmd, &args.db_up_cmd) {
        (Some(crash), Some(up)) => Some((crash.clone(), up.clone())),
        (None, None) => None,
        _ => bail!("--db-crash-cmd and --db-up-cmd go together"),
    };
    if args.classes.iter().any(|c| c == DB_CRASH) {
        if db.is_none() {
            bail!("--classes {DB_CRASH}: give --db-crash-cmd and --db-up-cmd");
        }
        if args.pair || args.power_loss || args.damage {
            bail!(
                "--classes {DB_CRASH}: one node on a shared store, no --pair, --power-loss or --damage"
            );
        }
    }
    if args.pair {
        if args.power_loss || args.damage || args.soak_secs.is_some() {
            bail!(
                "--pair: no --power-loss, --damage or --soak-secs (the nodes keep no local state)"
            );
        }
        if let Some(bad) = args.classes.iter().find(|c| c.starts_with("sys:")) {
            bail!(
                "--pair: {bad} needs the local log's file-system calls; use random, startup, storm, shutdown, graceful"
            );
        }
        if !args.server_args.iter().any(|a| a == "--store") {
            bail!(
                "--pair: give the shared store (--server-arg=--store --server-arg=postgres://...)"
            );
        }
    }
    workload::set_poison_percent(args.poison_percent);
    if !matches!(args.shim_mode.as_str(), "strict" | "lenient" | "torn") {
        bail!(
            "--shim-mode: {:?} is not strict, lenient or torn",
            args.shim_mode
        );
    }
    Ok(db)
}

/// The run's working directory (`--dir`, or a new one under the system's
/// temporary directory), made, with an empty `disk/` in it.
fn make_run_dir(args: &Args, seed: u64) -> Result<PathBuf> {
    let run_dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            let d = std::env::temp_dir().join(format!("chaos-{seed}-{}", std::process::id()));
            std::fs::create_dir_all(&d)?;
            d
        }
    };
    let run_dir = std::fs::canonicalize(&run_dir)?;
    let disk = run_dir.join("disk");
    let _ = std::fs::remove_dir_all(&disk);
    std::fs::create_dir_all(&disk)?;
    Ok(run_dir)
}

/// How to start the server (the LD_PRELOAD library built into the run
/// directory), and with `--pair` the second node's.
fn server_specs(
    args: &Args,
    bin: &Path,
    run_dir: &Path,
) -> Result<(ServerSpec, Option<ServerSpec>)> {
    let disk = run_dir.join("disk");
    let shim_path = shim::build(run_dir)?;
    let port = server::free_port()?;
    let mut spec = ServerSpec {
        bin: bin.to_path_buf(),
        data: disk.join("data"),
        root: disk.clone(),
        port,
        log: run_dir.join("server.log"),
        shim: Some(shim_path),
        mirror: args.power_loss.then(|| run_dir.join("mirror")),
        shim_mode: args.shim_mode.clone(),
        counts: run_dir.join("shim-counts"),
        mark: run_dir.join("shim-killed"),
        extra: args.server_args.clone(),
        metrics_port: server::free_port()?,
    };
    // `--pair`: node `b` beside `a`, each with its own ports, log and
    // library files, both standbys (whichever gets the lease serves).
    let other = if args.pair {
        let mut b = spec.clone();
        b.data = disk.join("data-b");
        b.port = server::free_port()?;
        b.metrics_port = server::free_port()?;
        b.log = run_dir.join("server-b.log");
        b.counts = run_dir.join("shim-counts-b");
        b.mark = run_dir.join("shim-killed-b");
        spec.log = run_dir.join("server-a.log");
        for (node, name) in [(&mut spec, "a"), (&mut b, "b")] {
            node.extra
                .extend(["--node-name".into(), name.into(), "--standby".into()]);
        }
        let _ = std::fs::remove_file(&b.log);
        Some(b)
    } else {
        None
    };
    Ok((spec, other))
}

/// The workload's tasks: producers and the admin worker, stopped first at
/// the end, and consumers, which drain the queues before they stop.
struct Workers {
    workers: Vec<tokio::task::JoinHandle<Result<()>>>,
    consumers: Vec<tokio::task::JoinHandle<Result<()>>>,
}

impl Workers {
    fn start(sh: &Arc<Shared>, args: &Args) -> Workers {
        let mut workers = Vec::new();
        for p in 0..args.producers {
            workers.push(tokio::spawn(workload::producer(Arc::clone(sh), p)));
        }
        workers.push(tokio::spawn(workload::stream_producer(
            Arc::clone(sh),
            args.producers,
        )));
        let mut consumers = Vec::new();
        for c in 0..args.consumers {
            consumers.push(tokio::spawn(workload::consumer(Arc::clone(sh), c)));
        }
        consumers.push(tokio::spawn(workload::stream_consumer(Arc::clone(sh))));
        workers.push(tokio::spawn(workload::admin_worker(Arc::clone(sh))));
        Workers { workers, consumers }
    }

    /// Stops every task at once, without a drain: the final server did
    /// not start.
    async fn abandon(self, sh: &Shared) {
        sh.quiet.store(true, Ordering::SeqCst);
        sh.phase.store(workload::STOP, Ordering::SeqCst);
        for t in self.workers.into_iter().chain(self.consumers) {
            t.abort();
            let _ = t.await;
        }
    }

    /// Stops the producers and the admin worker, lets the consumers ack
    /// everything but poison until every queue is empty (90 s at most,
    /// 20 s without progress), then stops them.
    async fn drain(self, sh: &Shared, nem: &mut Nemesis) {
        sh.quiet.store(true, Ordering::SeqCst);
        for w in self.workers {
            match w.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => nem.health.push(format!("a workload task failed: {e:#}")),
                Err(e) => nem.health.push(format!("a workload task panicked: {e}")),
            }
        }
        sh.phase.store(workload::FINAL, Ordering::SeqCst);
        sh.hist.nemesis(nem.epoch, "note", workload::FINAL_NOTE);
        let drain_until = Instant::now() + Duration::from_secs(90);
        let mut empty_reads = 0;
        let mut drained = false;
        // (total, since when unchanged): a drain that makes no progress for
        // 20 s is over.
        let mut last: (Option<u64>, Instant) = (None, Instant::now());
        while Instant::now() < drain_until {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let totals = workload_totals(sh).await;
            if totals.is_some_and(|t| t == 0) && sh.inflight.load(Ordering::SeqCst) == 0 {
                empty_reads += 1;
                if empty_reads >= 3 {
                    drained = true;
                    break;
                }
            } else {
                empty_reads = 0;
            }
            if totals != last.0 {
                last = (totals, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(20) {
                break;
            }
        }
        sh.phase.store(workload::STOP, Ordering::SeqCst);
        for c in self.consumers {
            let _ = c.await;
        }
        if !drained {
            nem.health.push(format!(
                "the queues did not drain (90 s at most, 20 s without progress): {:?}",
                workload::read_stats(sh, "undrained").await
            ));
        }
        let _ = workload::read_stats(sh, "after the drain").await;
    }
}

/// The end of epoch 1. `--pair`: node `a` serves (its lease taken at
/// once) and `b` starts as its standby. Soak: the whole soak, the server
/// left running (returned) with the samples. Otherwise: killed after a
/// random time, the first cycle.
async fn first_epoch(
    nem: &mut Nemesis,
    sh: &Shared,
    args: &Args,
    run_dir: &Path,
    mut first: Server,
) -> Result<(Option<Server>, Vec<soak::Sample>)> {
    if nem.pair.is_some() {
        let epoch = nem.epoch;
        if let Some(p) = nem.pair.as_mut() {
            p.owner = Some((first, epoch));
        }
        nem.spawn_standby()?;
        Ok((None, Vec::new()))
    } else if let Some(secs) = args.soak_secs {
        let mut csv = std::fs::File::create(run_dir.join("soak.csv"))?;
        let samples = soak::run(
            sh,
            first.pid(),
            &nem.spec.data,
            &nem.spec.log,
            Duration::from_secs(secs),
            Duration::from_secs(args.sample_secs.max(1)),
            &mut csv,
        )
        .await;
        Ok((Some(first), samples))
    } else {
        tokio::time::sleep(Duration::from_millis(nem.rng.u64(200..1500))).await;
        let status = first.kill();
        nem.hit("random");
        nem.after_exit(
            &EpochEnd {
                epoch: nem.epoch,
                class: "random".into(),
                status,
            },
            false,
        )?;
        drop(first);
        Ok((None, Vec::new()))
    }
}

/// The kill cycles (none in a soak): per cycle, in damage mode a damage
/// round, then an epoch (or with `--pair` a pair's cycle) ended by the
/// next kill point class; a class that was not hit is tried again next,
/// up to three times.
async fn cycles(nem: &mut Nemesis, args: &Args, started: Instant) -> Result<()> {
    let cycles = if args.soak_secs.is_some() {
        0
    } else {
        args.cycles
    };
    // A pair's cycles each end its owner; the local mode's first cycle
    // was the kill of the first server.
    let first_cycle = if nem.pair.is_some() { 0 } else { 1 };
    for cycle in first_cycle..cycles {
        if args.damage {
            nem.damage_round().await?;
        }
        let class = nem.next_class();
        let before = nem.hits.get(&class).copied().unwrap_or(0);
        if nem.pair.is_some() {
            nem.pair_cycle(&class).await?;
        } else {
            nem.epoch(&class).await?;
        }
        if nem.hits.get(&class).copied().unwrap_or(0) == before {
            // Not hit (a start-up kill that came after the start, a call
            // not reached...): try this class again next, a few times.
            let m = nem.misses.entry(class.clone()).or_default();
            *m += 1;
            if *m <= 3 {
                nem.plan.push(class);
            }
        }
        if cycle % 10 == 0 {
            println!(
                "chaos: cycle {cycle}/{}, {:.0} s",
                args.cycles,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// The server of the final phase, and its epoch if it is not the last
/// one started: the soak's, still running; with `--pair` the owner (the
/// pair brought up if no node serves), its standby killed; otherwise a
/// new one. `None`, with a health violation recorded, when a new one does
/// not start.
async fn final_server(
    nem: &mut Nemesis,
    running: Option<Server>,
) -> Result<Option<(Server, Option<u64>)>> {
    let mut running = running;
    let mut running_epoch = None;
    if nem.pair.as_ref().is_some_and(|p| p.owner.is_none()) {
        nem.pair_up(None).await?;
    }
    if let Some((s, epoch)) = nem.pair.as_mut().and_then(|p| p.owner.take()) {
        running = Some(s);
        // The standby goes (SIGKILL): the final stops and the restart
        // below are the owner's node's.
        if let Some((mut sb, e)) = nem.pair.as_mut().and_then(|p| p.standby.take()) {
            let status = sb.kill();
            nem.swap();
            nem.end_of(e, "final: standby stopped", status, false, false)?;
            nem.swap();
        }
        running_epoch = Some(epoch);
    }
    let s = match running {
        Some(s) => s,
        None => {
            let mut s = nem.spawn(None)?;
            if !nem.ready(&mut s).await? {
                let status = s
                    .try_wait()
                    .map_or("still running".into(), |st| st.to_string());
                let _ = s.kill();
                nem.health.push(format!(
                    "the server did not start for the final phase ({status}); what was acknowledged cannot be read back; the end of its log:\n{}",
                    server::log_tail(&nem.spec.log, 30)
                ));
                return Ok(None);
            }
            s
        }
    };
    Ok(Some((s, running_epoch)))
}

/// After the final stop: a restart, where nothing may reappear and the
/// counters must hold (`--pair`: the other node, which takes the lease
/// the stop gave up); then `letterbox verify` of the data directory and
/// the servers' logs.
async fn after_restart(nem: &mut Nemesis, sh: &Arc<Shared>, args: &Args, bin: &Path) -> Result<()> {
    nem.swap();
    let mut s = nem.spawn(None)?;
    if nem.ready(&mut s).await? {
        let _ = workload::read_stats(sh, "after a restart").await;
        match workload::sweep_once(sh).await {
            Ok(0) => {}
            Ok(n) => nem.health.push(format!(
                "{n} message(s) delivered after the queues were drained and the server restarted"
            )),
            Err(e) => nem.health.push(format!("final sweep failed: {e}")),
        }
    }
    let epoch = nem.epoch;
    nem.final_stop(s, epoch).await?;
    if !args.no_verify
        && nem.pair.is_none()
        && let Some(problem) = verify(bin, &nem.spec.data)?
    {
        nem.health.push(problem);
    }
    for line in server::bad_log_lines(&nem.spec.log, &nem.excused_log) {
        nem.health.push(format!("server log: {line}"));
    }
    if let Some(p) = &nem.pair {
        for line in server::bad_log_lines(&p.other.log, &[]) {
            nem.health.push(format!("server log: {line}"));
        }
    }
    Ok(())
}

/// The verdict: the checker's report of the history, the coverage gate
/// (every kill point class of the run, and in damage mode every required
/// damage kind, at least `--min-hits` times) and `--expect-violation`;
/// prints them and returns the exit code.
fn verdict(args: &Args, seed: u64, nem: &Nemesis, hist: &History, took: Duration) -> i32 {
    // Coverage gate: over the classes this run was given.
    let mut classes: Vec<String> = if nem.classes.is_empty() {
        all_classes()
    } else {
        nem.classes.clone()
    };
    classes.retain(|c| c != "storm");
    let missing: Vec<String> = classes
        .iter()
        .filter(|c| nem.hits.get(*c).copied().unwrap_or(0) < args.min_hits)
        .cloned()
        .collect();
    let missing_damage: Vec<&str> = if args.damage {
        damage::REQUIRED
            .iter()
            .copied()
            .filter(|k| nem.damage_kinds.contains(k))
            .filter(|k| nem.damage_outcomes.get(k).map_or(0, |o| o.0) < args.min_hits)
            .collect()
    } else {
        Vec::new()
    };

    let recs = hist.take();
    let report = checker::check(&recs, hist, seed, &nem.health);
    report::print_summary(args, seed, nem, &recs, &report, took);
    let mut ok = report.violations() == 0;
    if !missing.is_empty() {
        println!(
            "chaos: insufficient coverage: kill point classes hit fewer than {} times: {}",
            args.min_hits,
            missing.join(", ")
        );
        ok = false;
    }
    if !missing_damage.is_empty() {
        println!(
            "chaos: insufficient coverage: damage kinds applied fewer than {} times: {}",
            args.min_hits,
            missing_damage.join(", ")
        );
        ok = false;
    }
    let code = match &args.expect_violation {
        Some(inv) => {
            let n: usize = inv.split(',').map(|i| report.of(i.trim())).sum();
            if n > 0 {
                println!(
                    "chaos: expected violations of {inv} found ({n}): the checker catches this fault"
                );
                0
            } else {
                println!(
                    "chaos: FAILED: no violation of {inv} found; the checker missed this fault"
                );
                1
            }
        }
        None if ok => 0,
        None => 1,
    };
    println!(
        "chaos: seed {seed}: {}",
        if code == 0 { "PASS" } else { "FAIL" }
    );
    code
}

async fn workload_totals(sh: &Shared) -> Option<u64> {
    let admin = letterbox::client::Client::with_config(workload::client_config(&sh.url))
        .await
        .ok()?;
    let mut total = 0;
    for q in workload::SOURCES {
        for name in [q.to_string(), workload::dlq_of(q)] {
            total += admin.stats(&name).await.ok()?.total;
        }
    }
    Some(total)
}
