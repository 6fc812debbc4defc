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
    /// `--classes`), e.g. `tools/pg-local.sh stop DIR`, an immediate
    /// shutdown that leaves PostgreSQL to recover from its WAL.
    #[arg(long)]
    pub db_crash_cmd: Option<String>,
    /// Shell command that starts the database again after
    /// `--db-crash-cmd`, e.g. `tools/pg-local.sh up DIR`.
    #[arg(long)]
    pub db_up_cmd: Option<String>,
}

/// Kill point classes, each a way a server epoch ends.
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

impl Nemesis {
    fn flags(&mut self) -> Vec<String> {
        if self.soak {
            return Vec::new();
        }
        // Options drawn per start (as RocksDB's crash test does): they move
        // the checkpoints, applies and segment switches around.
        let mut seg = ["256KiB", "1MiB", "1MiB"][self.rng.usize(0..3)];
        let mut ckpt = self.rng.u64(100..3000);
        if !self.damage_waiting.is_empty() {
            // A damage kind waits for the log to span several segments
            // from the checkpoint's on (one between two others, a second
            // segment after the checkpoint's, sizes recorded): the
            // smallest segments, and no checkpoint but the start's within
            // an epoch.
            seg = "64KiB";
            ckpt = ckpt.max(4 * self.max_run.as_millis() as u64);
        }
        let apply = self.rng.u64(20..600);
        // Small thresholds make database rewrites (and kills during them)
        // frequent.
        let rewrite = ["64KiB", "1MiB", "16MiB"][self.rng.usize(0..3)];
        // Bodies read back from the log soon after they are logged, or
        // from memory.
        let recent = ["0", "64KiB", "64MiB"][self.rng.usize(0..3)];
        vec![
            "--db-rewrite-min".into(),
            rewrite.into(),
            "--recent-payloads".into(),
            recent.into(),
            "--wal-segment-size".into(),
            seg.into(),
            "--checkpoint-interval".into(),
            format!("{ckpt}ms"),
            "--apply-interval".into(),
            format!("{apply}ms"),
            "--min-free-disk".into(),
            "0".into(),
            "--shutdown-grace".into(),
            "3s".into(),
        ]
    }

    fn spawn(&mut self, kill: Option<&str>) -> Result<Server> {
        self.epoch += 1;
        let node = self.pair.as_ref().map_or(0, |p| p.cur);
        self.counters.set_epoch(node, self.epoch);
        let flags = self.flags();
        self.hist.nemesis(
            self.epoch,
            "start",
            format!("{} kill={}", flags.join(" "), kill.unwrap_or("-")),
        );
        self.spec.spawn(&flags, kill, self.epoch)
    }

    async fn ready(&mut self, s: &mut Server) -> Result<bool> {
        let ok = s.wait_ready(Duration::from_secs(60)).await?;
        if ok {
            if let Some(at) = s.ready_at {
                self.ready_times.push(at - s.spawned);
            }
            self.hist.nemesis(self.epoch, "ready", "");
        } else {
            let status = s.try_wait();
            self.health.push(format!(
                "epoch {}: the server did not become ready ({}); log: {}",
                self.epoch,
                status.map_or("still running after 60 s".into(), |s| s.to_string()),
                server::log_tail(&self.spec.log, 5).replace('\n', " | ")
            ));
        }
        Ok(ok)
    }

    fn startup_estimate(&self) -> Duration {
        let n = self.ready_times.len();
        let recent = &self.ready_times[n.saturating_sub(5)..];
        recent
            .iter()
            .max()
            .copied()
            .unwrap_or(Duration::from_millis(300))
    }

    /// How long after SIGTERM a kill may come and still land inside the
    /// graceful stop: three quarters of the quickest recent stop (40 ms
    /// before any was seen), so that the draw does not depend on how fast
    /// this machine stops a server.
    fn stop_window(&self) -> Duration {
        let n = self.stop_times.len();
        self.stop_times[n.saturating_sub(5)..]
            .iter()
            .min()
            .map_or(Duration::from_millis(40), |d| *d * 3 / 4)
            .max(Duration::from_millis(1))
    }

    fn hit(&mut self, class: &str) {
        *self.hits.entry(class.to_string()).or_default() += 1;
    }

    /// Starts a server and waits until it is ready; `None` if it did not
    /// get there (the epoch then ended as "not ready").
    async fn spawn_ready(&mut self) -> Result<Option<Server>> {
        let mut s = self.spawn(None)?;
        if !self.ready(&mut s).await? {
            let status = s.kill();
            self.after_exit(
                &EpochEnd {
                    epoch: self.epoch,
                    class: "not ready".into(),
                    status,
                },
                false,
            )?;
            return Ok(None);
        }
        Ok(Some(s))
    }

    /// Stops a server with SIGTERM at the end of the run (a kill after
    /// 30 s), and checks the exit.
    async fn final_stop(&mut self, mut s: Server, epoch: u64) -> Result<()> {
        s.term();
        let status = s.wait_exit(Duration::from_secs(30)).await;
        self.after_exit(
            &EpochEnd {
                epoch,
                class: "final stop".into(),
                status,
            },
            true,
        )
    }

    /// An epoch ended by kill point class `class`: counts the hit, then
    /// [`Self::after_exit`].
    fn end(
        &mut self,
        class: &str,
        status: Option<std::process::ExitStatus>,
        expect_clean: bool,
    ) -> Result<()> {
        self.hit(class);
        self.after_exit(
            &EpochEnd {
                epoch: self.epoch,
                class: class.to_string(),
                status,
            },
            expect_clean,
        )
    }

    /// Chooses the next epoch's kill point class: a shuffled round of all
    /// classes, so that every class comes up as often as the others.
    fn next_class(&mut self) -> String {
        if self.plan.is_empty() {
            let mut all: Vec<String> = if self.classes.is_empty() {
                let mut all = all_classes();
                // Random kills are the most common in real life: twice.
                all.push("random".to_string());
                all
            } else {
                self.classes.clone()
            };
            self.rng.shuffle(&mut all);
            self.plan = all;
        }
        self.plan.pop().unwrap_or_else(|| "random".into())
    }

    /// After a server epoch ended: records counts, checks the exit, and in
    /// power-loss mode replaces the data directory with what survives.
    fn after_exit(&mut self, end: &EpochEnd, expect_clean: bool) -> Result<()> {
        let counts = shim::read_counts(&self.spec.counts);
        for (class, n) in &counts {
            *self.calls.entry(class).or_default() += n;
            let e = self.per_epoch.entry(class).or_default();
            e.0 += n;
            e.1 += 1;
        }
        if counts.get("mmap_write").copied().unwrap_or(0) > 0 {
            self.health.push(format!(
                "epoch {}: the server wrote through a shared mapping of a data file, which the durable mirror does not model",
                end.epoch
            ));
        }
        let detail = end.status.map_or("-".to_string(), |s| s.to_string());
        self.hist
            .nemesis(end.epoch, "exit", format!("{} {detail}", end.class));
        if let Some(status) = end.status {
            use std::os::unix::process::ExitStatusExt;
            let killed = status.signal() == Some(9);
            let clean = status.code() == Some(0);
            // Fail-stop: a server whose database crashed under it stops
            // with exit code 3 (its store lost).
            let stopped = end.class == DB_CRASH && status.code() == Some(3);
            if !(killed || stopped || (clean && expect_clean)) {
                self.health.push(format!(
                    "epoch {} ({}): the server exited with {status}; log: {}",
                    end.epoch,
                    end.class,
                    server::log_tail(&self.spec.log, 6).replace('\n', " | ")
                ));
            }
        }
        if self.power {
            self.restore()?;
        }
        Ok(())
    }

    /// Power cut: the data directory becomes what the mirror says is
    /// durable.
    fn restore(&mut self) -> Result<()> {
        let Some(mirror) = &self.spec.mirror else {
            return Ok(());
        };
        if !mirror.join("root").exists() {
            // The server died before the library set its mirror up: nothing
            // it did can have been acknowledged; the directory stays.
            return Ok(());
        }
        let staging = self.run_dir.join("restored");
        let files = if self.spec.shim_mode == "torn" {
            let (files, pages) =
                shim::materialize_torn(mirror, &staging, &self.spec.root, &mut self.rng)?;
            self.torn_pages += pages;
            files
        } else {
            shim::materialize(mirror, &staging)?
        };
        let data = &self.spec.data;
        std::fs::remove_dir_all(data)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .with_context(|| format!("removing {}", data.display()))?;
        let name = data.file_name().context("data directory name")?;
        let survived = staging.join(name);
        if survived.exists() {
            std::fs::rename(&survived, data)
                .with_context(|| format!("moving {} to {}", survived.display(), data.display()))?;
        }
        let _ = std::fs::remove_dir_all(&staging);
        self.restores += 1;
        self.hist.nemesis(
            self.epoch,
            "restore",
            format!(
                "power cut: {files} files survive{}",
                if survived.exists() || data.exists() {
                    ""
                } else {
                    " (the data directory itself did not)"
                }
            ),
        );
        Ok(())
    }

    /// Damage mode, with the server down: two calls in three, and every
    /// call while a kind the coverage gate requires waits (see
    /// `damage_waiting`), damages the log (of the kinds in play, the one
    /// applied least so far that can be applied soundly now) and starts
    /// the server. A refusal must name a
    /// damaged file; the copies are then put back. A start is an epoch
    /// like the others (killed at a random moment), and the checker's
    /// invariants judge what it lost.
    async fn damage_round(&mut self) -> Result<()> {
        let skip = self.rng.u8(0..3) == 0;
        if skip && self.damage_waiting.is_empty() {
            return Ok(());
        }
        // The directory the damage starts from must be sound (what the
        // last stop left), and so must be the one with the copies put back
        // after a refusal: a damage must never leak into later cycles.
        // How far its database has applied the log decides which damaged
        // records a start must refuse.
        let (before, applied) = verify_applied(&self.spec.bin, &self.spec.data)?;
        // The kind applied least so far that can be applied now (ties in
        // a random order), so that a run covers every kind.
        let mut order = self.damage_kinds.clone();
        self.rng.shuffle(&mut order);
        order.sort_by_key(|k| self.damage_outcomes.get(k).map_or(0, |o| o.0));
        let mut skipped = Vec::new();
        let mut chosen = None;
        for kind in order {
            if let Some(d) = damage::plan(kind, &self.spec.data, applied, &mut self.rng) {
                chosen = Some(d);
                break;
            }
            skipped.push(kind);
        }
        for k in skipped {
            if damage::REQUIRED.contains(&k)
                && self.damage_outcomes.get(k).map_or(0, |o| o.0) < self.damage_min
                && !self.damage_waiting.contains(&k)
            {
                self.damage_waiting.push(k);
            }
        }
        let Some(d) = chosen else {
            return Ok(());
        };
        let applied = self.damage_outcomes.get(d.kind).map_or(0, |o| o.0) + 1;
        if applied >= self.damage_min {
            self.damage_waiting.retain(|k| *k != d.kind);
        }
        if let Some(problem) = &before {
            self.health.push(format!(
                "epoch {}: before damage ({}), the directory the last stop left was not sound: {problem}",
                self.epoch,
                d.describe()
            ));
        }
        let backup = self.run_dir.join("damage-backup");
        damage::apply(&d, &backup)?;
        self.damage_outcomes.entry(d.kind).or_default().0 += 1;
        self.hist.nemesis(self.epoch, "damage", d.describe());
        server::note(&self.spec.log, &format!("damage {}", d.describe()))?;
        let from = server::log_len(&self.spec.log);
        let mut s = self.spawn(None)?;
        if s.wait_ready(Duration::from_secs(60)).await? {
            if let Some(at) = s.ready_at {
                self.ready_times.push(at - s.spawned);
            }
            self.hist.nemesis(self.epoch, "ready", "");
            self.damage_outcomes.entry(d.kind).or_default().2 += 1;
            if d.must_refuse {
                self.damage_unrefused
                    .push(format!("epoch {}: {}", self.epoch, d.describe()));
            }
            let _ = std::fs::remove_dir_all(&backup);
            let run = self.rng.u64(50..self.max_run.as_millis().max(100) as u64);
            tokio::time::sleep(Duration::from_millis(run)).await;
            let status = s.kill();
            return self.end("random", status, false);
        }
        let status = match s.wait_exit(Duration::from_secs(5)).await {
            Some(st) => Some(st),
            None => s.kill(),
        };
        let to = server::log_len(&self.spec.log);
        let text = server::log_since(&self.spec.log, from);
        let detail = status.map_or("-".to_string(), |s| s.to_string());
        match (
            status.and_then(|s| s.code()),
            damage::refusal_line(&text, &d),
        ) {
            (Some(1), Some(line)) => {
                self.damage_outcomes.entry(d.kind).or_default().1 += 1;
                self.excused_log.push((from, to));
                self.hist.nemesis(
                    self.epoch,
                    "exit",
                    format!("damage refused {detail}: {}", line.trim()),
                );
            }
            _ => {
                self.hist
                    .nemesis(self.epoch, "exit", format!("damage {detail}"));
                let tail: Vec<&str> = text.lines().rev().take(6).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                self.health.push(format!(
                    "epoch {}: after damage ({}), the server neither started nor refused with exit 1 and a \"cannot start\" line naming the damaged file ({detail}); log: {}",
                    self.epoch,
                    d.describe(),
                    tail.join(" | ")
                ));
            }
        }
        damage::restore(&d, &backup)?;
        self.hist
            .nemesis(self.epoch, "restore", "damaged segments put back");
        server::note(&self.spec.log, "damaged segments put back")?;
        if before.is_none()
            && let Some(problem) = verify(&self.spec.bin, &self.spec.data)?
        {
            self.health.push(format!(
                "epoch {}: with the damaged segments put back ({}), the directory is not sound as it was before the damage: {problem}",
                self.epoch,
                d.describe()
            ));
        }
        Ok(())
    }

    /// `--pair`: the two nodes swap roles (`Nemesis::spec` becomes the
    /// other node's).
    fn swap(&mut self) {
        if let Some(p) = self.pair.as_mut() {
            std::mem::swap(&mut self.spec, &mut p.other);
            p.cur ^= 1;
        }
    }

    /// `--pair`: starts the other node as the standby (it waits for the
    /// lease).
    fn spawn_standby(&mut self) -> Result<()> {
        self.swap();
        let s = self.spawn(None);
        let epoch = self.epoch;
        self.swap();
        let s = s?;
        if let Some(p) = self.pair.as_mut() {
            p.standby = Some((s, epoch));
        }
        Ok(())
    }

    /// `--pair`: how long a takeover may take, for kills aimed inside
    /// one: the longest of the last five (3 s before any was seen).
    fn takeover_estimate(&self) -> Duration {
        self.pair
            .as_ref()
            .and_then(|p| {
                let n = p.takeovers.len();
                p.takeovers[n.saturating_sub(5)..].iter().max().copied()
            })
            .unwrap_or(Duration::from_secs(3))
    }

    /// An epoch `epoch` ended by kill point class `class`: counts the hit
    /// (unless `class` is not a kill point class), then
    /// [`Self::after_exit`].
    fn end_of(
        &mut self,
        epoch: u64,
        class: &str,
        status: Option<std::process::ExitStatus>,
        expect_clean: bool,
        hit: bool,
    ) -> Result<()> {
        if hit {
            self.hit(class);
        }
        self.after_exit(
            &EpochEnd {
                epoch,
                class: class.to_string(),
                status,
            },
            expect_clean,
        )
    }

    /// `--pair`: the standby (the other node) takes over after the owner
    /// ended at `ended`: waits up to 60 s for it to serve, and makes it
    /// the owner. A standby that exits or does not serve in time is a
    /// health problem (it is then killed).
    async fn takeover(&mut self, ended: Instant) -> Result<()> {
        self.swap();
        let Some((mut s, epoch)) = self.pair.as_mut().and_then(|p| p.standby.take()) else {
            return Ok(());
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if s.poll_ready() {
                let took = ended.elapsed();
                self.hist.nemesis(
                    epoch,
                    "ready",
                    format!("takeover in {} ms", took.as_millis()),
                );
                if let Some(p) = self.pair.as_mut() {
                    p.takeovers.push(took);
                    p.owner = Some((s, epoch));
                }
                return Ok(());
            }
            if let Some(status) = s.try_wait() {
                self.health.push(format!(
                    "epoch {epoch}: the standby exited instead of taking over ({status}); log: {}",
                    server::log_tail(&self.spec.log, 5).replace('\n', " | ")
                ));
                return self.end_of(epoch, "standby exit", Some(status), false, false);
            }
            if Instant::now() >= until {
                self.health.push(format!(
                    "epoch {epoch}: the standby did not take over within 60 s; log: {}",
                    server::log_tail(&self.spec.log, 5).replace('\n', " | ")
                ));
                let status = s.kill();
                return self.end_of(epoch, "no takeover", status, false, false);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `--pair`: brings the pair up when no node serves: starts the nodes
    /// not running (both `--standby`), waits up to 60 s for one of them
    /// to take the lease and serve; it becomes the owner, the other the
    /// standby. `since`: when the last node that held the lease was
    /// killed, if one was (the time to a node serving is then a
    /// takeover's).
    async fn pair_up(&mut self, since: Option<Instant>) -> Result<()> {
        let mine = self.spawn(None)?;
        let mut nodes = [Some((mine, self.epoch)), None];
        nodes[1] = match self.pair.as_mut().and_then(|p| p.standby.take()) {
            Some(s) => Some(s),
            None => {
                self.swap();
                let s = self.spawn(None);
                let epoch = self.epoch;
                self.swap();
                Some((s?, epoch))
            }
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            for i in 0..2 {
                let ready = nodes[i].as_mut().is_some_and(|(s, _)| s.poll_ready());
                if ready {
                    if i == 1 {
                        self.swap();
                        nodes.swap(0, 1);
                    }
                    let [owner, standby] = nodes;
                    let took = since.map(|t| t.elapsed());
                    if let Some((_, epoch)) = &owner {
                        let detail = took.map_or("the pair is up".to_string(), |t| {
                            format!("the pair is up: takeover in {} ms", t.as_millis())
                        });
                        self.hist.nemesis(*epoch, "ready", detail);
                    }
                    if let Some(p) = self.pair.as_mut() {
                        p.owner = owner;
                        p.standby = standby;
                        p.comebacks.extend(took);
                    }
                    return Ok(());
                }
            }
            let exited = nodes
                .iter_mut()
                .flatten()
                .any(|(s, _)| s.try_wait().is_some());
            if exited || Instant::now() >= until {
                let logs = format!(
                    "{} | {}",
                    server::log_tail(&self.spec.log, 5).replace('\n', " | "),
                    self.pair
                        .as_ref()
                        .map_or(String::new(), |p| server::log_tail(&p.other.log, 5)
                            .replace('\n', " | "))
                );
                bail!(
                    "--pair: neither node came to serve (one exited, or 60 s passed); logs: {logs}"
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `--pair`: one cycle. The owner serves a while, then is ended by
    /// `class` (random: SIGKILL; shutdown: SIGKILL within its graceful
    /// stop; graceful: SIGTERM and its clean exit); the standby takes
    /// over and the ended node starts again as the standby. Startup and
    /// storm: the owner is killed, then the node taking over is killed
    /// before it serves (storm: three times, the node started again
    /// alone each time), and the pair comes up again.
    async fn pair_cycle(&mut self, class: &str) -> Result<()> {
        if self.pair.as_ref().is_some_and(|p| p.owner.is_none()) {
            self.pair_up(None).await?;
        }
        let Some((mut s, epoch)) = self.pair.as_mut().and_then(|p| p.owner.take()) else {
            bail!("--pair: no owner");
        };
        if self.pair.as_ref().is_some_and(|p| p.standby.is_none()) {
            self.spawn_standby()?;
        }
        let max_run = self.max_run;
        let run = self.rng.u64(100..max_run.as_millis().max(200) as u64);
        tokio::time::sleep(Duration::from_millis(run)).await;
        match class {
            "shutdown" | "graceful" => {
                let window = self.stop_window();
                s.term();
                let termed = Instant::now();
                self.hist.nemesis(epoch, "term", "");
                if class == "shutdown" {
                    let g = self.rng.u64(0..=window.as_micros() as u64);
                    tokio::time::sleep(Duration::from_micros(g)).await;
                    let (c, status) = match s.try_wait() {
                        Some(st) => {
                            self.stop_times.push(termed.elapsed());
                            ("graceful", Some(st))
                        }
                        None => ("shutdown", s.kill()),
                    };
                    self.end_of(epoch, c, status, true, true)?;
                } else {
                    let status = s.wait_exit(Duration::from_secs(30)).await;
                    match status {
                        Some(_) => self.stop_times.push(termed.elapsed()),
                        None => self
                            .health
                            .push(format!("epoch {epoch}: still running 30 s after SIGTERM")),
                    }
                    let status = match status {
                        Some(st) => Some(st),
                        None => s.kill(),
                    };
                    self.end_of(epoch, "graceful", status, true, true)?;
                }
            }
            "startup" | "storm" => {
                let status = s.kill();
                self.end_of(epoch, "owner killed", status, false, false)?;
                let ended = Instant::now();
                drop(s);
                self.swap();
                let kills = if class == "storm" { 3 } else { 1 };
                for k in 0..kills {
                    let taking = if k == 0 {
                        self.pair.as_mut().and_then(|p| p.standby.take())
                    } else {
                        Some((self.spawn(None)?, self.epoch))
                    };
                    let Some((mut t, e)) = taking else {
                        break;
                    };
                    let est = self.takeover_estimate();
                    let at = Duration::from_micros(
                        self.rng
                            .u64(0..=u64::try_from(est.as_micros()).unwrap_or(1_000_000)),
                    );
                    let since = if k == 0 { ended } else { Instant::now() };
                    tokio::time::sleep(at.saturating_sub(since.elapsed())).await;
                    let ready = t.poll_ready();
                    let status = t.kill();
                    if !ready && let Some(p) = self.pair.as_mut() {
                        p.takeover_kills += 1;
                    }
                    let c = if ready { "random" } else { class };
                    self.end_of(e, c, status, false, true)?;
                }
                // No node runs: both start again.
                return self.pair_up(Some(Instant::now())).await;
            }
            _ => {
                let status = s.kill();
                self.end_of(epoch, "random", status, false, true)?;
            }
        }
        let ended = Instant::now();
        drop(s);
        self.takeover(ended).await?;
        if self.pair.as_ref().is_some_and(|p| p.owner.is_some()) {
            self.spawn_standby()?;
        }
        Ok(())
    }

    /// Runs one epoch of the given class to its end. The server is started
    /// here; on return it is dead.
    async fn epoch(&mut self, class: &str) -> Result<()> {
        let max_run = self.max_run;
        if let Some(sys) = class.strip_prefix("sys:") {
            let guess = SYSCALL_CLASSES
                .iter()
                .find(|(c, _)| *c == sys)
                .map_or(10, |(_, g)| *g);
            let mean = self
                .per_epoch
                .get(sys)
                .map_or(guess, |(sum, epochs)| sum / (*epochs).max(1));
            let n = self.rng.u64(1..=mean.max(1));
            let delay = self.rng.u64(0..4);
            let kill = format!("{sys}:{n}:{delay}");
            let mut s = self.spawn(Some(&kill))?;
            let until = Instant::now() + Duration::from_secs(30) + max_run;
            let mut ready_until: Option<Instant> = None;
            let status = loop {
                if let Some(st) = s.try_wait() {
                    break Some(st);
                }
                if s.poll_ready() && ready_until.is_none() {
                    if let Some(at) = s.ready_at {
                        self.ready_times.push(at - s.spawned);
                    }
                    self.hist.nemesis(self.epoch, "ready", "");
                    ready_until = Some(Instant::now() + max_run);
                }
                if ready_until.is_some_and(|u| Instant::now() >= u) || Instant::now() >= until {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let (class, status) = match status {
                Some(st) if self.spec.mark.exists() => (format!("sys:{sys}"), Some(st)),
                Some(st) => ("unexpected exit".to_string(), Some(st)),
                None => {
                    if ready_until.is_none() {
                        self.health
                            .push(format!("epoch {}: not ready 30 s after start", self.epoch));
                    }
                    ("random".to_string(), s.kill())
                }
            };
            return self.end(&class, status, false);
        }
        match class {
            "startup" | "storm" => {
                let kills = if class == "storm" { 3 } else { 1 };
                for _ in 0..kills {
                    let est = self.startup_estimate();
                    let at = Duration::from_micros(
                        self.rng
                            .u64(0..=u64::try_from(est.as_micros()).unwrap_or(1000)),
                    );
                    let mut s = self.spawn(None)?;
                    tokio::time::sleep(at).await;
                    let ready = s.poll_ready();
                    let status = s.kill();
                    let c = if ready { "random" } else { class };
                    self.end(c, status, false)?;
                }
                Ok(())
            }
            "shutdown" | "graceful" => {
                let Some(mut s) = self.spawn_ready().await? else {
                    return Ok(());
                };
                let run = self.rng.u64(100..max_run.as_millis().max(200) as u64);
                tokio::time::sleep(Duration::from_millis(run)).await;
                let window = self.stop_window();
                s.term();
                let termed = Instant::now();
                self.hist.nemesis(self.epoch, "term", "");
                if class == "shutdown" {
                    // The kill must land inside the graceful stop to be a
                    // kill at all: it comes within the window, and the exit
                    // is looked for only when the kill is due.
                    let g = self.rng.u64(0..=window.as_micros() as u64);
                    tokio::time::sleep(Duration::from_micros(g)).await;
                    let (c, status) = match s.try_wait() {
                        Some(st) => {
                            // It stopped sooner than that: aim lower next time.
                            self.stop_times.push(termed.elapsed());
                            ("graceful", Some(st))
                        }
                        None => ("shutdown", s.kill()),
                    };
                    self.end(c, status, true)
                } else {
                    let status = s.wait_exit(Duration::from_secs(30)).await;
                    if status.is_some() {
                        self.stop_times.push(termed.elapsed());
                    }
                    if status.is_none() {
                        self.health.push(format!(
                            "epoch {}: still running 30 s after SIGTERM",
                            self.epoch
                        ));
                    }
                    let status = match status {
                        Some(st) => Some(st),
                        None => s.kill(),
                    };
                    self.end("graceful", status, true)
                }
            }
            DB_CRASH => {
                let (crash, up) = self.db.clone().context("db-crash needs --db-crash-cmd")?;
                let Some(mut s) = self.spawn_ready().await? else {
                    return Ok(());
                };
                let run = self.rng.u64(50..max_run.as_millis().max(100) as u64);
                tokio::time::sleep(Duration::from_millis(run)).await;
                shell(&crash)?;
                let down = self.rng.u64(0..=1500);
                self.hist.nemesis(self.epoch, "db-crash", "");
                tokio::time::sleep(Duration::from_millis(down)).await;
                shell(&up)?;
                self.hist
                    .nemesis(self.epoch, "db-up", format!("after {down} ms"));
                // Fail-stop: the server stops (exit code 3) at its first
                // commit on the lost connection, or when its lease runs
                // out unrenewed; one that had nothing to commit meanwhile
                // goes on and is killed.
                let status = match s.wait_exit(Duration::from_secs(15)).await {
                    Some(st) => Some(st),
                    None => s.kill(),
                };
                self.end(DB_CRASH, status, false)
            }
            _ => {
                let Some(mut s) = self.spawn_ready().await? else {
                    return Ok(());
                };
                let run = self.rng.u64(50..max_run.as_millis().max(100) as u64);
                tokio::time::sleep(Duration::from_millis(run)).await;
                let status = s.kill();
                self.end("random", status, false)
            }
        }
    }
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
    let shim_path = shim::build(&run_dir)?;
    let port = server::free_port()?;
    let mut spec = ServerSpec {
        bin: bin.clone(),
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
    let url = match &other {
        Some(b) => format!("http://127.0.0.1:{port},http://127.0.0.1:{}", b.port),
        None => format!("http://127.0.0.1:{port}"),
    };
    let _ = std::fs::remove_file(&spec.log);
    let log_file = match &args.history {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let hist = Arc::new(History::new(log_file));
    let mut metrics_ports = vec![spec.metrics_port];
    metrics_ports.extend(other.as_ref().map(|b| b.metrics_port));
    let counters = server::Counters::watch(&metrics_ports)?;
    let damage_kinds = damage_kinds(&args.damage_kinds)?;
    let mut nem = Nemesis {
        spec,
        counters,
        hist: Arc::clone(&hist),
        rng: fastrand::Rng::with_seed(seed ^ 0x9e3779b97f4a7c15),
        epoch: 0,
        hits: BTreeMap::new(),
        calls: BTreeMap::new(),
        per_epoch: BTreeMap::new(),
        misses: BTreeMap::new(),
        health: Vec::new(),
        ready_times: Vec::new(),
        stop_times: Vec::new(),
        max_run: Duration::from_millis(args.max_run_ms.max(100)),
        power: args.power_loss,
        run_dir: run_dir.clone(),
        restores: 0,
        torn_pages: 0,
        plan: Vec::new(),
        classes: if args.pair && args.classes.is_empty() {
            NEMESIS_CLASSES.iter().map(|c| c.to_string()).collect()
        } else {
            args.classes.clone()
        },
        soak: args.soak_secs.is_some(),
        damage_kinds,
        damage_outcomes: BTreeMap::new(),
        damage_min: args.min_hits.max(1),
        damage_waiting: Vec::new(),
        damage_unrefused: Vec::new(),
        excused_log: Vec::new(),
        pair: other.map(|other| Pair {
            other,
            cur: 0,
            owner: None,
            standby: None,
            takeovers: Vec::new(),
            comebacks: Vec::new(),
            takeover_kills: 0,
        }),
        db,
    };
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

    // Before epoch 1, in power-loss mode: the very first start of the
    // directory, cut short by a power cut at its n-th fsync (its format
    // file, its directories, the database's files and the first
    // checkpoint); the start after it must still come up.
    if nem.power && args.soak_secs.is_none() {
        for _ in 0..FIRST_START_CUTS {
            let n = nem.rng.u64(1..=FIRST_START_FSYNCS);
            let mut s = nem.spawn(Some(&format!("fsync:{n}:0")))?;
            let until = Instant::now() + Duration::from_secs(30);
            let (class, status) = loop {
                if let Some(st) = s.try_wait() {
                    if nem.spec.mark.exists() {
                        break ("first start", Some(st));
                    }
                    break ("unexpected exit", Some(st));
                }
                // A start with fewer fsyncs than n came up: a power cut
                // once it listens.
                if s.poll_ready() || Instant::now() >= until {
                    break ("random", s.kill());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            nem.end(class, status, false)?;
        }
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
    let mut workers = Vec::new();
    for p in 0..args.producers {
        workers.push(tokio::spawn(workload::producer(Arc::clone(&sh), p)));
    }
    workers.push(tokio::spawn(workload::stream_producer(
        Arc::clone(&sh),
        args.producers,
    )));
    let mut consumers = Vec::new();
    for c in 0..args.consumers {
        consumers.push(tokio::spawn(workload::consumer(Arc::clone(&sh), c)));
    }
    consumers.push(tokio::spawn(workload::stream_consumer(Arc::clone(&sh))));
    workers.push(tokio::spawn(workload::admin_worker(Arc::clone(&sh))));
    let mut soak_samples = Vec::new();
    let mut running = None;
    let mut running_epoch = None;
    if nem.pair.is_some() {
        // Node `a` serves (its lease taken at once); `b` is its standby.
        let epoch = nem.epoch;
        if let Some(p) = nem.pair.as_mut() {
            p.owner = Some((first, epoch));
        }
        nem.spawn_standby()?;
    } else if let Some(secs) = args.soak_secs {
        let mut csv = std::fs::File::create(run_dir.join("soak.csv"))?;
        soak_samples = soak::run(
            &sh,
            first.pid(),
            &nem.spec.data,
            &nem.spec.log,
            Duration::from_secs(secs),
            Duration::from_secs(args.sample_secs.max(1)),
            &mut csv,
        )
        .await;
        running = Some(first);
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
    }

    // The cycles.
    let cycles = if args.soak_secs.is_some() {
        0
    } else {
        args.cycles
    };
    // A pair's cycles each end its owner; the local mode's first cycle
    // was the kill of the first server above.
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

    // Final phase: a clean server, producers and admin stop, consumers ack
    // everything but poison, until every queue is empty.
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
                bail!(
                    "the server did not start for the final phase ({}); the end of its log:\n{}",
                    s.try_wait()
                        .map_or("still running".into(), |st| st.to_string()),
                    server::log_tail(&nem.spec.log, 30)
                );
            }
            s
        }
    };
    sh.quiet.store(true, Ordering::SeqCst);
    for w in workers {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => nem.health.push(format!("a workload task failed: {e:#}")),
            Err(e) => nem.health.push(format!("a workload task panicked: {e}")),
        }
    }
    sh.phase.store(workload::FINAL, Ordering::SeqCst);
    hist.nemesis(nem.epoch, "note", workload::FINAL_NOTE);
    let drain_until = Instant::now() + Duration::from_secs(90);
    let mut empty_reads = 0;
    let mut drained = false;
    // (total, since when unchanged): a drain that makes no progress for
    // 20 s is over.
    let mut last: (Option<u64>, Instant) = (None, Instant::now());
    while Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let totals = workload_totals(&sh).await;
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
    for c in consumers {
        let _ = c.await;
    }
    if !drained {
        nem.health.push(format!(
            "the queues did not drain (90 s at most, 20 s without progress): {:?}",
            workload::read_stats(&sh, "undrained").await
        ));
    }
    let _ = workload::read_stats(&sh, "after the drain").await;
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
        soak_verdict(&soak_samples, after, &mut nem.health);
    }
    let epoch = running_epoch.unwrap_or(nem.epoch);
    nem.final_stop(s, epoch).await?;

    // Restart once more: nothing may reappear, the counters must hold.
    // (`--pair`: the other node, which takes the lease the stop gave up.)
    nem.swap();
    let mut s = nem.spawn(None)?;
    if nem.ready(&mut s).await? {
        let _ = workload::read_stats(&sh, "after a restart").await;
        match workload::sweep_once(&sh).await {
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
        && let Some(problem) = verify(&bin, &nem.spec.data)?
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
    let report = checker::check(&recs, &hist, seed, &nem.health);
    print_summary(&args, seed, &nem, &recs, &report, started.elapsed());
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
    if code == 0 && !args.keep && args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&run_dir);
    } else {
        println!("chaos: run directory kept: {}", run_dir.display());
    }
    Ok(code)
}

/// Judges a soak: disk use must come back down after the drain, memory
/// must not keep growing; prints the figures.
fn soak_verdict(samples: &[soak::Sample], after: soak::Sample, health: &mut Vec<String>) {
    use soak::mib;
    let first = samples[0];
    let peak_disk = samples.iter().map(|s| s.disk).max().unwrap_or(0);
    let peak_backlog = samples.iter().map(|s| s.backlog).max().unwrap_or(0);
    let third = samples.len().div_ceil(3);
    let rss_early = samples[..third].iter().map(|s| s.rss).max().unwrap_or(0);
    let rss_late = samples[samples.len() - third..]
        .iter()
        .map(|s| s.rss)
        .max()
        .unwrap_or(0);
    let rss_peak = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    let minutes = samples.last().map_or(1.0, |s| s.at / 60.0).max(1.0 / 60.0);
    println!();
    println!(
        "soak: {:.1} min, {} samples; peak backlog {peak_backlog} messages",
        minutes,
        samples.len()
    );
    println!(
        "soak: disk {:.1} MiB at the start, {:.1} MiB at the peak, {:.1} MiB after the drain and two checkpoints",
        mib(first.disk),
        mib(peak_disk),
        mib(after.disk)
    );
    println!(
        "soak: RSS {:.1} MiB at the start, highest {:.1} MiB in the first third, {:.1} MiB in the last third, peak {:.1} MiB, {:.1} MiB after the drain",
        mib(first.rss),
        mib(rss_early),
        mib(rss_late),
        mib(rss_peak),
        mib(after.rss)
    );
    println!(
        "soak: server log {:.2} MiB ({:.1} KiB per minute)",
        mib(after.log),
        after.log as f64 / 1024.0 / minutes
    );
    // Space comes back: what the backlog took outside the log's fixed-size
    // files (the database) is mostly returned, and the log is back to its
    // bounded reserve: the current segment, the next one prepared, and at
    // most two spares kept for reuse.
    let data = |s: &soak::Sample| s.disk.saturating_sub(s.wal);
    let peak_data = samples.iter().map(data).max().unwrap_or(0);
    let peak_wal_files = samples.iter().map(|s| s.wal_files).max().unwrap_or(0);
    println!(
        "soak: outside the log {:.1} MiB at the start, {:.1} MiB at the peak, {:.1} MiB after; log {} file(s) ({:.1} MiB) at the start, {} at the peak, {} ({:.1} MiB) after",
        mib(data(&first)),
        mib(peak_data),
        mib(data(&after)),
        first.wal_files,
        mib(first.wal),
        peak_wal_files,
        after.wal_files,
        mib(after.wal)
    );
    let grown = peak_data.saturating_sub(data(&first));
    let kept = data(&after).saturating_sub(data(&first));
    if grown > 16 << 20 && kept * 2 > grown {
        health.push(format!(
            "soak: disk use did not come back down: {:.1} MiB outside the log at the start, {:.1} MiB at the peak, {:.1} MiB after the drain",
            mib(data(&first)),
            mib(peak_data),
            mib(data(&after))
        ));
    }
    if after.wal_files > 4 {
        health.push(format!(
            "soak: the log kept {} files after the drain (at most 4: current, next, two spares)",
            after.wal_files
        ));
    }
    // Memory is bounded: no growth from the first third to the last
    // beyond a quarter (caches fill early).
    if rss_late > rss_early + rss_early / 4 + (32 << 20) {
        health.push(format!(
            "soak: memory kept growing: RSS {:.1} MiB in the first third, {:.1} MiB in the last",
            mib(rss_early),
            mib(rss_late)
        ));
    }
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

fn print_summary(
    args: &Args,
    seed: u64,
    nem: &Nemesis,
    recs: &history::Records,
    report: &checker::Report,
    took: Duration,
) {
    // A call through the exchange that filled two queues has a record for
    // each: count it once.
    let mut seen_calls = std::collections::HashSet::new();
    let calls: Vec<&history::Publish> = recs
        .publishes
        .iter()
        .filter(|p| {
            p.exchange
                .as_ref()
                .is_none_or(|(_, c)| seen_calls.insert(*c))
        })
        .collect();
    let through_exchange = calls.iter().filter(|p| p.exchange.is_some()).count();
    let count =
        |f: &dyn Fn(&history::Outcome) -> bool| calls.iter().filter(|p| f(&p.outcome)).count();
    let msgs: usize = recs.publishes.iter().map(|p| p.msgs.len()).sum();
    println!();
    println!(
        "chaos: seed {seed}, {} mode, {} kill cycles, {} server starts, {:.0} s",
        if args.power_loss {
            "power-loss"
        } else {
            "kill -9"
        },
        args.cycles,
        nem.epoch,
        took.as_secs_f64()
    );
    println!(
        "operations: {} publish calls ({} through {}; {} messages; ok {}, fail {}, info {}), {} receive calls (ok {}, fail {}, info {}), {} deliveries, {} settles, {} admin calls",
        calls.len(),
        through_exchange,
        workload::EXCHANGE,
        msgs,
        count(&|o| o.is_ok()),
        count(&|o| o.is_fail()),
        count(&|o| o.is_info()),
        recs.receives.0 + recs.receives.1 + recs.receives.2,
        recs.receives.0,
        recs.receives.1,
        recs.receives.2,
        recs.deliveries.len(),
        recs.settles.len(),
        recs.admin.len()
    );
    let hits: Vec<String> = nem.hits.iter().map(|(c, n)| format!("{c} {n}")).collect();
    println!("kill points hit: {}", hits.join(", "));
    if let Some(p) = &nem.pair {
        let spread = |v: &[Duration]| {
            let mut t = v.to_vec();
            t.sort_unstable();
            let ms = |d: Option<&Duration>| d.map_or(0, |d| d.as_millis());
            format!(
                "min {} ms, median {} ms, max {} ms",
                ms(t.first()),
                ms(t.get(t.len() / 2)),
                ms(t.last())
            )
        };
        println!(
            "takeovers: {} (the owner's end to the standby serving: {}); nodes killed while taking over: {}, after which one of the two started again served {} times ({})",
            p.takeovers.len(),
            spread(&p.takeovers),
            p.takeover_kills,
            p.comebacks.len(),
            spread(&p.comebacks)
        );
    }
    if args.damage {
        let per_kind: Vec<String> = nem
            .damage_kinds
            .iter()
            .map(|k| {
                let (a, r, st) = nem.damage_outcomes.get(k).copied().unwrap_or_default();
                format!("{k} {a} ({r} refused, {st} started)")
            })
            .collect();
        let (a, r, st) = nem
            .damage_outcomes
            .values()
            .fold((0, 0, 0), |x, o| (x.0 + o.0, x.1 + o.1, x.2 + o.2));
        println!(
            "damage applied: {a}; start refused naming the damaged file: {r}; started (nothing acknowledged may be missing): {st}; by kind: {}",
            per_kind.join(", ")
        );
        if !nem.damage_unrefused.is_empty() {
            println!(
                "damage the start rule must refuse, started anyway: {} ({})",
                nem.damage_unrefused.len(),
                nem.damage_unrefused
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
    }
    if nem.power {
        println!(
            "power cuts (directory rebuilt from the durable mirror): {}{}",
            nem.restores,
            if args.shim_mode == "torn" {
                format!(", {} unsynced pages let through", nem.torn_pages)
            } else {
                String::new()
            }
        );
    }
    let calls: Vec<String> = nem
        .calls
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    println!(
        "file-system calls seen by the library: {}",
        calls.join(", ")
    );
    let counted: Vec<String> = nem
        .counters
        .totals()
        .iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    println!(
        "server counters, summed over its starts (read every 100 ms, so at least): {}",
        counted.join(", ")
    );
    for (k, v) in &report.info {
        println!("{k}: {v}");
    }
    println!();
    print!("{}", report.table());
    println!(
        "total violations: {} (rows in parentheses are informational)",
        report.violations()
    );
}
