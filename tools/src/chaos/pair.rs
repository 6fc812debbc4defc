//! `--pair`: two nodes on one shared store, both `--standby`. Each cycle
//! ends the node that owns the lease; the other takes over, and the ended
//! node starts again as the new standby.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::Nemesis;
use super::server;

impl Nemesis {
    /// `--pair`: the two nodes swap roles (`Nemesis::spec` becomes the
    /// other node's).
    pub(super) fn swap(&mut self) {
        if let Some(p) = self.pair.as_mut() {
            std::mem::swap(&mut self.spec, &mut p.other);
            p.cur ^= 1;
        }
    }

    /// `--pair`: starts the other node as the standby (it waits for the
    /// lease).
    pub(super) fn spawn_standby(&mut self) -> Result<()> {
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
    pub(super) async fn pair_up(&mut self, since: Option<Instant>) -> Result<()> {
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
    pub(super) async fn pair_cycle(&mut self, class: &str) -> Result<()> {
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
}
