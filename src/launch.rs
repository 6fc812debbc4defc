//! `letterbox serve` as a child process: the lines the server prints on
//! standard output once its listeners are bound (one definition, used by
//! `src/main.rs` to print them), and the one way the tests and tools start
//! the binary and wait for those lines.
//!
//! The server prints, in this order: the gRPC address
//! ([`GRPC_PREFIX`]), the Anypoint MQ REST address when that facade is on
//! ([`ANYPOINT_PREFIX`]), the metrics URL when metrics are on
//! ([`METRICS_PREFIX`]), the console URL when the console is on
//! ([`CONSOLE_PREFIX`]), the SQS endpoint's URL when it is on
//! ([`SQS_PREFIX`]).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The first line: `letterbox listening on ADDR` (the gRPC address).
pub const GRPC_PREFIX: &str = "letterbox listening on ";
/// `letterbox anypoint listening on ADDR`.
pub const ANYPOINT_PREFIX: &str = "letterbox anypoint listening on ";
/// `letterbox metrics on URL`.
pub const METRICS_PREFIX: &str = "letterbox metrics on ";
/// `letterbox console at URL`.
pub const CONSOLE_PREFIX: &str = "letterbox console at ";
/// `letterbox sqs at URL`.
pub const SQS_PREFIX: &str = "letterbox sqs at ";

/// What the server has announced so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announced {
    /// The gRPC address.
    pub grpc: Option<SocketAddr>,
    /// The Anypoint MQ REST address.
    pub anypoint: Option<SocketAddr>,
    /// The metrics URL, as printed.
    pub metrics: Option<String>,
    /// The console URL, as printed.
    pub console: Option<String>,
    /// The SQS endpoint's URL, as printed.
    pub sqs: Option<String>,
    /// Lines that are none of these.
    pub other: Vec<String>,
}

impl Announced {
    /// Takes one line of the server's standard output into account.
    pub fn read(&mut self, line: &str) {
        let line = line.trim();
        let addr = |rest: &str| rest.trim().parse::<SocketAddr>().ok();
        if let Some(rest) = line.strip_prefix(GRPC_PREFIX) {
            self.grpc = addr(rest);
        } else if let Some(rest) = line.strip_prefix(ANYPOINT_PREFIX) {
            self.anypoint = addr(rest);
        } else if let Some(rest) = line.strip_prefix(METRICS_PREFIX) {
            self.metrics = Some(rest.trim().to_string());
        } else if let Some(rest) = line.strip_prefix(CONSOLE_PREFIX) {
            self.console = Some(rest.trim().to_string());
        } else if let Some(rest) = line.strip_prefix(SQS_PREFIX) {
            self.sqs = Some(rest.trim().to_string());
        } else {
            self.other.push(line.to_string());
        }
    }
}

/// Why the server did not announce what was waited for.
#[derive(Debug)]
pub enum NotReady {
    /// Its standard output closed first (it exited, or is exiting); the
    /// status if it has exited.
    Exited(Option<ExitStatus>),
    /// The time limit passed.
    Timeout,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Exited(Some(s)) => write!(f, "the server exited with {s} while starting"),
            NotReady::Exited(None) => write!(f, "the server closed its output while starting"),
            NotReady::Timeout => write!(f, "the server did not announce its listeners in time"),
        }
    }
}

impl std::error::Error for NotReady {}

/// A `letterbox serve` command line being put together.
pub struct Serve {
    cmd: Command,
}

impl Serve {
    /// `BIN serve --data-dir DATA`.
    pub fn new(bin: impl AsRef<OsStr>, data: &Path) -> Serve {
        Serve::wrapped(&[], bin, data)
    }

    /// The same behind a wrapper command (`sh -c '...' sh`, `fiu-run -x`):
    /// `WRAPPER... BIN serve --data-dir DATA`.
    pub fn wrapped(wrapper: &[&str], bin: impl AsRef<OsStr>, data: &Path) -> Serve {
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin.as_ref());
                c
            }
            None => Command::new(bin.as_ref()),
        };
        cmd.arg("serve").arg("--data-dir").arg(data);
        Serve { cmd }
    }

    /// The command, to add flags and environment variables.
    pub fn command(&mut self) -> &mut Command {
        &mut self.cmd
    }

    /// Starts it with standard input closed, standard error to `stderr`
    /// and standard output read by a thread (every line, so that the
    /// server never blocks on a full pipe).
    pub fn spawn(mut self, stderr: impl Into<Stdio>) -> std::io::Result<Served> {
        let mut child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no standard output to read"))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Once nobody listens, keep draining.
                let _ = tx.send(line);
            }
        });
        Ok(Served {
            child,
            lines,
            announced: Announced::default(),
        })
    }
}

/// A started server and what it has announced.
pub struct Served {
    /// The process.
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Its announcements read so far.
    pub announced: Announced,
}

impl Served {
    /// Reads the lines that have arrived, without waiting; false once its
    /// standard output has closed and every line is read.
    pub fn poll(&mut self) -> bool {
        loop {
            match self.lines.try_recv() {
                Ok(line) => self.announced.read(&line),
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// One step of a wait: `Some` when it is over.
    fn step(
        &mut self,
        ready: &impl Fn(&Announced) -> bool,
        until: Instant,
    ) -> Option<Result<(), NotReady>> {
        let open = self.poll();
        if ready(&self.announced) {
            return Some(Ok(()));
        }
        if !open {
            return Some(Err(NotReady::Exited(self.child.wait().ok())));
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            // Its last lines may still be in the pipe.
            self.poll();
            if ready(&self.announced) {
                return Some(Ok(()));
            }
            return Some(Err(NotReady::Exited(Some(status))));
        }
        if Instant::now() >= until {
            return Some(Err(NotReady::Timeout));
        }
        None
    }

    /// Waits up to `limit` until `ready` holds of what it has announced,
    /// blocking the thread.
    pub fn wait_blocking(
        &mut self,
        ready: impl Fn(&Announced) -> bool,
        limit: Duration,
    ) -> Result<(), NotReady> {
        let until = Instant::now() + limit;
        loop {
            if let Some(r) = self.step(&ready, until) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// [`Served::wait_blocking`] without blocking the async runtime.
    pub async fn wait(
        &mut self,
        ready: impl Fn(&Announced) -> bool,
        limit: Duration,
    ) -> Result<(), NotReady> {
        let until = Instant::now() + limit;
        loop {
            if let Some(r) = self.step(&ready, until) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_announcement() {
        let mut a = Announced::default();
        a.read(&format!("{GRPC_PREFIX}127.0.0.1:5\n"));
        a.read(&format!("{ANYPOINT_PREFIX}127.0.0.1:6"));
        a.read(&format!("{METRICS_PREFIX}http://127.0.0.1:7/metrics"));
        a.read(&format!("{CONSOLE_PREFIX}http://127.0.0.1:8/"));
        a.read(&format!("{SQS_PREFIX}http://127.0.0.1:9/"));
        a.read("something else");
        assert_eq!(a.grpc, "127.0.0.1:5".parse().ok());
        assert_eq!(a.anypoint, "127.0.0.1:6".parse().ok());
        assert_eq!(a.metrics.as_deref(), Some("http://127.0.0.1:7/metrics"));
        assert_eq!(a.console.as_deref(), Some("http://127.0.0.1:8/"));
        assert_eq!(a.sqs.as_deref(), Some("http://127.0.0.1:9/"));
        assert_eq!(a.other, vec!["something else".to_string()]);
    }
}
