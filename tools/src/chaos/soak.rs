//! Soak: the workload against one server for a long time, without kills,
//! sampling the server's memory (RSS), the data directory's disk use and
//! the log's size. Consumers pause now and then so that a backlog builds
//! up and drains, and the run ends with every queue drained: disk use must
//! come back down once the backlog is gone (segments retired, space
//! reused), and memory must not keep growing.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::workload::Shared;

/// One sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Seconds since the soak started.
    pub at: f64,
    /// Resident set size of the server, bytes.
    pub rss: u64,
    /// Disk blocks used by the data directory, bytes.
    pub disk: u64,
    /// Of which the log directory (`wal/`: segments, preallocated next
    /// segment and spares, all of a fixed size), bytes.
    pub wal: u64,
    /// Files in the log directory.
    pub wal_files: u64,
    /// The server's log (standard error), bytes.
    pub log: u64,
    /// Messages in the workload's queues.
    pub backlog: u64,
    /// Consumers paused at this moment.
    pub paused: bool,
}

/// Resident set size of a process, bytes.
pub fn rss(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Files directly in `dir`.
pub fn files_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().count() as u64)
}

/// Disk blocks used under `dir`, bytes.
pub fn disk_use(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            total += disk_use(&e.path());
        }
        total += m.blocks() * 512;
    }
    total
}

/// Samples every `every` for `length`, pausing the consumers for 40 s out
/// of every 120 s; writes each sample to `csv`.
pub async fn run(
    sh: &Shared,
    pid: u32,
    data: &Path,
    log: &Path,
    length: Duration,
    every: Duration,
    csv: &mut std::fs::File,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut out = Vec::new();
    let _ = writeln!(
        csv,
        "seconds,rss_bytes,disk_bytes,log_bytes,backlog,consumers_paused"
    );
    while start.elapsed() < length {
        let t = start.elapsed().as_secs();
        let paused = t % 120 >= 80;
        sh.paused.store(paused, Ordering::SeqCst);
        let s = Sample {
            at: start.elapsed().as_secs_f64(),
            rss: rss(pid),
            disk: disk_use(data),
            wal: disk_use(&data.join("wal")),
            wal_files: files_in(&data.join("wal")),
            log: std::fs::metadata(log).map_or(0, |m| m.len()),
            backlog: super::workload_totals(sh).await.unwrap_or(0),
            paused,
        };
        sh.backlog.store(s.backlog, Ordering::Relaxed);
        let _ = writeln!(
            csv,
            "{:.0},{},{},{},{},{}",
            s.at, s.rss, s.disk, s.log, s.backlog, s.paused
        );
        println!(
            "soak: {:>5.0} s  rss {:>6.1} MiB  disk {:>7.1} MiB  log {:>6.2} MiB  backlog {:>7}{}",
            s.at,
            mib(s.rss),
            mib(s.disk),
            mib(s.log),
            s.backlog,
            if s.paused { "  (consumers paused)" } else { "" }
        );
        out.push(s);
        tokio::time::sleep(every).await;
    }
    sh.paused.store(false, Ordering::SeqCst);
    out
}

/// Bytes in MiB.
pub fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
