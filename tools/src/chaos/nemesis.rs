//! The nemesis: starts the server epoch after epoch, ends each by a kill
//! point class (SIGKILL at a random moment, during start-up, inside a
//! graceful stop, at the n-th call of a file-system call; SIGTERM; a
//! crash of the store's database), damages the log between epochs in
//! damage mode, and in power-loss mode rebuilds the data directory from
//! the durable mirror after every stop.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::history::History;
use super::server::{self, Server, ServerSpec};
use super::{
    Args, DB_CRASH, EpochEnd, FIRST_START_CUTS, FIRST_START_FSYNCS, NEMESIS_CLASSES, Nemesis, Pair,
    SYSCALL_CLASSES, all_classes, damage, damage_kinds, shell, shim, verify, verify_applied,
};

impl Nemesis {
    /// The nemesis of a run: `spec` is how to start the server (with
    /// `--pair` node `a`), `other` node `b`.
    pub(super) fn new(
        args: &Args,
        seed: u64,
        spec: ServerSpec,
        other: Option<ServerSpec>,
        hist: Arc<History>,
        run_dir: &Path,
        db: Option<(String, String)>,
    ) -> Result<Nemesis> {
        let mut metrics_ports = vec![spec.metrics_port];
        metrics_ports.extend(other.as_ref().map(|b| b.metrics_port));
        let counters = server::Counters::watch(&metrics_ports)?;
        let damage_kinds = damage_kinds(&args.damage_kinds)?;
        Ok(Nemesis {
            spec,
            counters,
            hist,
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
            run_dir: run_dir.to_path_buf(),
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
        })
    }

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

    pub(super) fn spawn(&mut self, kill: Option<&str>) -> Result<Server> {
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

    pub(super) async fn ready(&mut self, s: &mut Server) -> Result<bool> {
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
    pub(super) fn stop_window(&self) -> Duration {
        let n = self.stop_times.len();
        self.stop_times[n.saturating_sub(5)..]
            .iter()
            .min()
            .map_or(Duration::from_millis(40), |d| *d * 3 / 4)
            .max(Duration::from_millis(1))
    }

    pub(super) fn hit(&mut self, class: &str) {
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
    pub(super) async fn final_stop(&mut self, mut s: Server, epoch: u64) -> Result<()> {
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
    pub(super) fn end(
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
    pub(super) fn next_class(&mut self) -> String {
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
    pub(super) fn after_exit(&mut self, end: &EpochEnd, expect_clean: bool) -> Result<()> {
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
    pub(super) async fn damage_round(&mut self) -> Result<()> {
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

    /// An epoch `epoch` ended by kill point class `class`: counts the hit
    /// (unless `class` is not a kill point class), then
    /// [`Self::after_exit`].
    pub(super) fn end_of(
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

    /// Runs one epoch of the given class to its end. The server is started
    /// here; on return it is dead.
    pub(super) async fn epoch(&mut self, class: &str) -> Result<()> {
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

    /// Before epoch 1, in power-loss mode: the very first start of the
    /// directory, cut short by a power cut at its n-th fsync (its format
    /// file, its directories, the database's files and the first
    /// checkpoint), [`FIRST_START_CUTS`] times; the start after it must
    /// still come up.
    pub(super) async fn first_start_cuts(&mut self) -> Result<()> {
        for _ in 0..FIRST_START_CUTS {
            let n = self.rng.u64(1..=FIRST_START_FSYNCS);
            let mut s = self.spawn(Some(&format!("fsync:{n}:0")))?;
            let until = Instant::now() + Duration::from_secs(30);
            let (class, status) = loop {
                if let Some(st) = s.try_wait() {
                    if self.spec.mark.exists() {
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
            self.end(class, status, false)?;
        }
        Ok(())
    }
}
