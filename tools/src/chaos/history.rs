//! The client-side history: every call the workload made, with the time it
//! was invoked and the time it completed, and how it completed (`ok`,
//! `fail`: the server refused it and nothing happened, `info`: unknown,
//! e.g. the connection broke). Nemesis events go in the same history. The
//! checker reads nothing else: the server's word counts only as what a
//! client saw.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Outcome {
    /// It succeeded.
    Ok,
    /// It failed with a code that means "no effect".
    Fail {
        /// gRPC code name.
        code: String,
        /// The message.
        msg: String,
    },
    /// Unknown whether it took effect.
    Info {
        /// gRPC code name.
        code: String,
        /// The message.
        msg: String,
    },
}

impl Outcome {
    /// Classifies a gRPC status. Codes that by contract mean "nothing was
    /// done" are `fail`, and so is a connection that could not be made (the
    /// request was never sent); anything else is `info`.
    pub fn from_status(s: &tonic::Status) -> Outcome {
        use tonic::Code::*;
        let code = format!("{:?}", s.code());
        let msg = status_text(s);
        match s.code() {
            InvalidArgument | NotFound | AlreadyExists | FailedPrecondition | ResourceExhausted
            | PermissionDenied | Unauthenticated | OutOfRange => Outcome::Fail { code, msg },
            Unavailable if msg.contains("tcp connect error") => Outcome::Fail { code, msg },
            _ => Outcome::Info { code, msg },
        }
    }

    /// True for `ok`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }

    /// True for `info`.
    pub fn is_info(&self) -> bool {
        matches!(self, Outcome::Info { .. })
    }

    /// True for `fail`.
    pub fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail { .. })
    }
}

/// The text of a status with its sources (transport errors hide the cause
/// there).
pub fn status_text(s: &tonic::Status) -> String {
    let mut out = s.message().to_string();
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = src {
        out.push_str(": ");
        out.push_str(&e.to_string());
        src = e.source();
    }
    out
}

/// A point in time, both on the monotonic clock of the run (ns since its
/// start) and on the wall clock (ms since the Unix epoch, comparable with
/// the server's instants).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Stamp {
    /// Nanoseconds since the start of the run.
    pub t: u64,
    /// Milliseconds since the Unix epoch.
    pub wall: u64,
}

/// One message of a publish.
#[derive(Debug, Clone, Serialize)]
pub struct PubMsg {
    /// Client-chosen message id, unique in the run.
    pub id: String,
    /// FIFO group, if any.
    pub group: Option<String>,
    /// Per-message TTL, if any.
    pub ttl_ms: Option<u64>,
    /// Body size.
    pub size: usize,
}

/// A publish call.
#[derive(Debug, Clone, Serialize)]
pub struct Publish {
    /// The queue.
    pub queue: String,
    /// The messages.
    pub msgs: Vec<PubMsg>,
    /// Invoked.
    pub inv: Stamp,
    /// Completed.
    pub done: Stamp,
    /// How it ended.
    pub outcome: Outcome,
    /// Producer.
    pub process: String,
    /// Through an exchange: its name and the call's id, shared by the
    /// records of the queues one call filled (one record per queue).
    pub exchange: Option<(String, u64)>,
    /// Through an exchange, in an answered call: the messages not stored in
    /// exactly their queue, as the answer's `routed_to` said.
    pub misrouted: Vec<String>,
}

/// One dead-letter record as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Source queue.
    pub source: String,
    /// Reason code (1 max deliveries, 2 rejected, 3 expired, 4 skipped).
    pub reason: i32,
    /// Delivery count at the move.
    pub count: u32,
    /// Failed attempts at the move.
    pub failed: u32,
    /// When (server wall clock).
    pub at: u64,
}

/// One delivery received (from a Receive call or a Subscribe stream).
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    /// Index of the delivery in the history.
    pub idx: usize,
    /// Identifies the receive call (or stream batch) it came in.
    pub call: u64,
    /// The queue.
    pub queue: String,
    /// Message id.
    pub id: String,
    /// Delivery count (this delivery included).
    pub count: u32,
    /// Failed attempts before this delivery.
    pub failed: u32,
    /// Ack token.
    pub token: String,
    /// Lease deadline (server wall clock).
    pub deadline: u64,
    /// FIFO group.
    pub group: String,
    /// Dead-letter history.
    pub dead_letters: Vec<DeadLetter>,
    /// `None` when the body matches what was published under this id;
    /// otherwise what is wrong with it.
    pub body_error: Option<String>,
    /// The receive was invoked.
    pub inv: Stamp,
    /// The delivery arrived.
    pub done: Stamp,
    /// Came on a Subscribe stream.
    pub stream: bool,
    /// Consumer.
    pub process: String,
}

/// What a settle call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleKind {
    /// Ack.
    Ack,
    /// Nack.
    Nack,
    /// ExtendLease.
    Extend,
    /// The consumer dropped its stream with this delivery unsettled.
    Release,
    /// FIFO: the answer to a nack of an earlier message of this delivery's
    /// group (`NackResponse.released`, `StreamSettled.released`) listed
    /// this delivery as released with it (SPEC §3): its lease ended between
    /// that nack's invocation and completion (the instants recorded). Its
    /// result is [`SettleResult::Released`], naming that message.
    ReleasedWith,
}

/// The result of settling one token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SettleResult {
    /// Settled (for an extend: the new deadline).
    Ok {
        /// New deadline of an extend, else 0.
        deadline: u64,
    },
    /// The token was refused as expired or settled.
    LeaseExpired,
    /// FIFO: the token was refused because its lease was released when an
    /// earlier message of its group, leased with it, failed first
    /// (`SETTLE_STATUS_RELEASED`, code 9, SPEC §3); nothing was changed.
    Released {
        /// The server's text (it names the earlier message).
        msg: String,
    },
    /// The whole call failed or is unknown.
    Call(Outcome),
}

/// A settle of one delivery.
#[derive(Debug, Clone, Serialize)]
pub struct Settle {
    /// The delivery (index into the deliveries).
    pub delivery: usize,
    /// What it was.
    pub kind: SettleKind,
    /// Invoked.
    pub inv: Stamp,
    /// Completed.
    pub done: Stamp,
    /// Result.
    pub result: SettleResult,
    /// Extend: the lease length asked for.
    pub timeout_ms: u64,
}

/// An admin call on a queue's configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Admin {
    /// create | update | delete | get
    pub op: &'static str,
    /// The queue.
    pub queue: String,
    /// The configuration given (create, update) or read (get), as the
    /// fields the workload sets.
    pub config: Option<QueueShape>,
    /// Invoked.
    pub inv: Stamp,
    /// Completed.
    pub done: Stamp,
    /// How it ended (a get of a missing queue is `fail` NotFound).
    pub outcome: Outcome,
}

/// The fields of a queue's configuration that the workload sets and the
/// checker compares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueShape {
    /// 1 standard, 2 FIFO.
    pub kind: i32,
    /// Message TTL.
    pub ttl_ms: u64,
    /// Ack timeout.
    pub ack_timeout_ms: u64,
    /// Max length, 0 when unlimited.
    pub max_length: u64,
    /// DLQ and max deliveries.
    pub dead_letter: Option<(String, u32)>,
    /// Dead-letter on expiry.
    pub dead_letter_on_expiry: bool,
}

/// Stats read at quiescence.
#[derive(Debug, Clone, Serialize)]
pub struct StatsRead {
    /// Which read (after the drain, after the last restart).
    pub label: &'static str,
    /// The queue.
    pub queue: String,
    /// total, published, acked, expired, dead_lettered,
    /// dead_letters_received.
    pub total: u64,
    /// Published counter.
    pub published: u64,
    /// Acked counter.
    pub acked: u64,
    /// Expired counter.
    pub expired: u64,
    /// Dead-lettered counter.
    pub dead_lettered: u64,
    /// Dead letters received counter.
    pub dead_letters_received: u64,
    /// Nacked counter (failed attempts).
    pub nacked: u64,
}

/// A nemesis event.
#[derive(Debug, Clone, Serialize)]
pub struct Nemesis {
    /// Server epoch (one per start).
    pub epoch: u64,
    /// start | ready | kill | term | exit | restore | note
    pub what: String,
    /// Detail (kill point class, exit status...).
    pub detail: String,
    /// When.
    pub at: Stamp,
}

/// Everything recorded in a run.
#[derive(Debug, Default)]
pub struct Records {
    /// Publishes.
    pub publishes: Vec<Publish>,
    /// Deliveries.
    pub deliveries: Vec<Delivery>,
    /// Settles.
    pub settles: Vec<Settle>,
    /// Admin calls.
    pub admin: Vec<Admin>,
    /// Stats reads.
    pub stats: Vec<StatsRead>,
    /// Nemesis events.
    pub nemesis: Vec<Nemesis>,
    /// Receive calls: (ok, fail, info).
    pub receives: (u64, u64, u64),
}

/// The shared history of a run.
pub struct History {
    start: Instant,
    start_wall: u64,
    recs: Mutex<Records>,
    next_call: std::sync::atomic::AtomicU64,
    log: Option<Mutex<std::io::BufWriter<std::fs::File>>>,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl History {
    /// A new history; with `log`, every event is also written there as a
    /// JSON line.
    pub fn new(log: Option<std::fs::File>) -> History {
        History {
            start: Instant::now(),
            start_wall: wall_ms(),
            recs: Mutex::new(Records::default()),
            next_call: std::sync::atomic::AtomicU64::new(1),
            log: log.map(|f| Mutex::new(std::io::BufWriter::new(f))),
        }
    }

    /// Now.
    pub fn now(&self) -> Stamp {
        Stamp {
            t: u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX),
            wall: wall_ms(),
        }
    }

    /// The monotonic time (ns since start) corresponding to a wall-clock
    /// instant (ms since the epoch).
    pub fn mono_of_wall(&self, wall: u64) -> i128 {
        (i128::from(wall) - i128::from(self.start_wall)) * 1_000_000
    }

    /// A fresh call id.
    pub fn call_id(&self) -> u64 {
        self.next_call
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Records> {
        self.recs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log<T: Serialize>(&self, kind: &str, v: &T) {
        if let Some(l) = &self.log {
            let mut w = l.lock().unwrap_or_else(|e| e.into_inner());
            let line = serde_json::json!({ "kind": kind, "v": v });
            let _ = writeln!(w, "{line}");
        }
    }

    /// Records a publish.
    pub fn publish(&self, p: Publish) {
        self.log("publish", &p);
        self.lock().publishes.push(p);
    }

    /// Records a receive call's outcome (deliveries are recorded one by
    /// one).
    pub fn receive_call(&self, o: &Outcome) {
        let mut r = self.lock();
        match o {
            Outcome::Ok => r.receives.0 += 1,
            Outcome::Fail { .. } => r.receives.1 += 1,
            Outcome::Info { .. } => r.receives.2 += 1,
        }
    }

    /// Records a delivery; returns its index.
    pub fn delivery(&self, mut d: Delivery) -> usize {
        let mut r = self.lock();
        d.idx = r.deliveries.len();
        self.log("delivery", &d);
        r.deliveries.push(d);
        r.deliveries.len() - 1
    }

    /// Records a settle.
    pub fn settle(&self, s: Settle) {
        self.log("settle", &s);
        self.lock().settles.push(s);
    }

    /// Records an admin call.
    pub fn admin(&self, a: Admin) {
        self.log("admin", &a);
        self.lock().admin.push(a);
    }

    /// Records a stats read.
    pub fn stats(&self, s: StatsRead) {
        self.log("stats", &s);
        self.lock().stats.push(s);
    }

    /// Records a nemesis event.
    pub fn nemesis(&self, epoch: u64, what: &str, detail: impl Into<String>) {
        let n = Nemesis {
            epoch,
            what: what.to_string(),
            detail: detail.into(),
            at: self.now(),
        };
        self.log("nemesis", &n);
        self.lock().nemesis.push(n);
    }

    /// Takes the records out (at the end of the run).
    pub fn take(&self) -> Records {
        if let Some(l) = &self.log {
            let _ = l.lock().unwrap_or_else(|e| e.into_inner()).flush();
        }
        std::mem::take(&mut *self.lock())
    }
}
