//! The server under test: a `letterbox serve` child process on the run's
//! data directory and a fixed port, optionally under the LD_PRELOAD
//! library (kill points, durable mirror).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use letterbox::launch::{Serve, Served};

use crate::loadgen::scrape::{MetricsUrl, sample};

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The `letterbox` binary.
    pub bin: PathBuf,
    /// The data directory.
    pub data: PathBuf,
    /// The tree the library watches (the data directory's parent).
    pub root: PathBuf,
    /// Port on 127.0.0.1.
    pub port: u16,
    /// The server's standard error goes here (appended).
    pub log: PathBuf,
    /// The compiled library, if used.
    pub shim: Option<PathBuf>,
    /// The mirror directory (power-loss mode).
    pub mirror: Option<PathBuf>,
    /// `LBSHIM_MODE`.
    pub shim_mode: String,
    /// Where the library keeps its call counters.
    pub counts: PathBuf,
    /// Where the library records the kill point it fired.
    pub mark: PathBuf,
    /// Extra flags for `serve`.
    pub extra: Vec<String>,
    /// Port on 127.0.0.1 of the server's metrics endpoint.
    pub metrics_port: u16,
}

/// A running server.
pub struct Server {
    served: Served,
    /// When it was spawned.
    pub spawned: Instant,
    /// When it printed its address.
    pub ready_at: Option<Instant>,
}

impl ServerSpec {
    /// Starts the server with these flags and, optionally, a kill point
    /// (`class:n:delay_ms`) for the library.
    pub fn spawn(&self, flags: &[String], kill: Option<&str>, epoch: u64) -> Result<Server> {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        writeln!(
            log,
            "==== chaos: server epoch {epoch} {} kill point {}",
            flags.join(" "),
            kill.unwrap_or("-")
        )?;
        let _ = std::fs::remove_file(&self.mark);
        let mut serve = Serve::new(&self.bin, &self.data);
        let cmd = serve.command();
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .args(flags)
            .args(&self.extra)
            .env("LETTERBOX_LOG", "info")
            .env("LETTERBOX_LOG_FORMAT", "text")
            .env("NO_COLOR", "1");
        if let Some(shim) = &self.shim {
            cmd.env("LD_PRELOAD", shim)
                .env("LBSHIM_ROOT", &self.root)
                .env("LBSHIM_COUNTS", &self.counts)
                .env("LBSHIM_MARK", &self.mark)
                .env("LBSHIM_MODE", &self.shim_mode);
            if let Some(m) = &self.mirror {
                let _ = std::fs::remove_dir_all(m);
                cmd.env("LBSHIM_MIRROR", m);
            }
            if let Some(k) = kill {
                cmd.env("LBSHIM_KILL", k);
            }
        }
        let served = serve
            .spawn(log)
            .with_context(|| format!("starting {}", self.bin.display()))?;
        Ok(Server {
            served,
            spawned: Instant::now(),
            ready_at: None,
        })
    }
}

impl Server {
    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.served.child.id()
    }

    /// Waits up to `limit` for the address line; `Ok(false)` if the
    /// process exited first (or did not print it in time).
    pub async fn wait_ready(&mut self, limit: Duration) -> Result<bool> {
        let ready = self.served.wait(|a| a.grpc.is_some(), limit).await.is_ok();
        if ready {
            self.ready_at = Some(Instant::now());
        }
        Ok(ready)
    }

    /// True if the address line has arrived (without waiting).
    pub fn poll_ready(&mut self) -> bool {
        if self.ready_at.is_some() {
            return true;
        }
        self.served.poll();
        if self.served.announced.grpc.is_some() {
            self.ready_at = Some(Instant::now());
            return true;
        }
        false
    }

    /// The exit status if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.served.child.try_wait().ok().flatten()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let _ = self.served.child.kill();
        self.served.child.wait().ok()
    }

    /// SIGTERM (graceful shutdown begins).
    pub fn term(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.served.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }

    /// Waits up to `limit` for the process to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.served.child.kill();
            let _ = self.served.child.wait();
        }
    }
}

/// A free port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Counters of the server's metrics endpoint that show which rare paths a
/// run took (none is checked: the checker judges the history alone).
pub const WATCHED: [&str; 2] = [
    "letterbox_apply_writes_overtaken_total",
    "letterbox_payloads_relocated_total",
];

/// The highest value of each watched counter read, per (node, epoch).
type Seen = BTreeMap<(usize, u64), [u64; WATCHED.len()]>;

/// Reads [`WATCHED`] from the servers' metrics endpoints (one per node)
/// every 100 ms while a run goes on and keeps, per node and server epoch,
/// the highest value read (each start counts from zero). A value is kept
/// only if the node's epoch did not change while it was read, so a page
/// is never credited to the wrong start. What an epoch counted after its last read is missed: the
/// totals are lower bounds.
pub struct Counters {
    /// The current epoch of each node.
    epochs: Arc<Vec<AtomicU64>>,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Counters {
    /// Starts reading `http://127.0.0.1:{port}/metrics` of each node's
    /// port.
    pub fn watch(ports: &[u16]) -> Result<Counters> {
        let urls = ports
            .iter()
            .map(|port| MetricsUrl::parse(&format!("http://127.0.0.1:{port}/metrics")))
            .collect::<Result<Vec<_>>>()?;
        let epochs: Arc<Vec<AtomicU64>> =
            Arc::new(ports.iter().map(|_| AtomicU64::new(0)).collect());
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let (e, s) = (Arc::clone(&epochs), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            loop {
                for (node, url) in urls.iter().enumerate() {
                    let before = e[node].load(Ordering::SeqCst);
                    if let Ok(page) = url.get().await
                        && e[node].load(Ordering::SeqCst) == before
                    {
                        let mut seen = s.lock().unwrap_or_else(|p| p.into_inner());
                        let slot = seen.entry((node, before)).or_default();
                        for (v, name) in slot.iter_mut().zip(WATCHED) {
                            if let Some(x) = sample(&page, name) {
                                // Counters are whole numbers.
                                *v = (*v).max(x as u64);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(Counters { epochs, seen, task })
    }

    /// A new server epoch begins on node `node` (the index of its port),
    /// before its server is spawned.
    pub fn set_epoch(&self, node: usize, epoch: u64) {
        if let Some(e) = self.epochs.get(node) {
            e.store(epoch, Ordering::SeqCst);
        }
    }

    /// Each watched counter summed over the epochs.
    pub fn totals(&self) -> Vec<(&'static str, u64)> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        WATCHED
            .iter()
            .enumerate()
            .map(|(i, name)| (*name, seen.values().map(|v| v[i]).sum()))
            .collect()
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Lines of the server log that show a panic or damaged data, but for
/// those in the byte ranges `excused` (`[from, to)`: starts that refused a
/// directory damaged on purpose, as they must).
pub fn bad_log_lines(log: &Path, excused: &[(u64, u64)]) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    let mut at = 0u64;
    let mut out = Vec::new();
    for l in text.split_inclusive('\n') {
        let start = at;
        at += l.len() as u64;
        if excused
            .iter()
            .any(|&(from, to)| start >= from && start < to)
        {
            continue;
        }
        if l.contains("panicked") || l.contains("corrupt data") || l.contains("RUST_BACKTRACE") {
            out.push(l.trim_end().to_string());
        }
    }
    out
}

/// The server log's length in bytes (0 if it does not exist yet).
pub fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// The server log from byte `from` on.
pub fn log_since(log: &Path, from: u64) -> String {
    let bytes = std::fs::read(log).unwrap_or_default();
    let from = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

/// Appends a line of the nemesis (`==== chaos: TEXT`) to the server log,
/// so that the log shows what was done to the directory between starts.
pub fn note(log: &Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    writeln!(f, "==== chaos: {text}")?;
    Ok(())
}

/// The last lines of the server log.
pub fn log_tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
