//! Ack modes, the message handed to a handler, and handler errors.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use super::{Client, ClientError, ErrorKind, Result, Settler, pb};

/// When a subscriber acknowledges a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckMode {
    /// Ack when the handler returns `Ok`; nack (with the error text as the
    /// reason) when it returns `Err`. At-least-once.
    #[default]
    Auto,
    /// The handler settles the message itself ([`Message::ack`],
    /// [`Message::nack`]); a message it leaves unsettled returns to the
    /// queue when its lease runs out. On a FIFO queue the next message of
    /// its group waits until it is settled or its lease is over.
    Manual,
    /// The message is acknowledged (deleted) before the handler runs: if
    /// the handler fails or the process stops, the message is lost.
    /// At-most-once.
    Immediate,
}

/// A handler's failure. `kind` is what a circuit breaker's `error_types`
/// match against (like a Mule error type, e.g. `HTTP:TIMEOUT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    kind: String,
    message: String,
}

impl HandlerError {
    /// An error of a kind.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> HandlerError {
        HandlerError {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// An error of kind `ANY`.
    pub fn any(message: impl Into<String>) -> HandlerError {
        HandlerError::new("ANY", message)
    }

    /// Its kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Its text (the nack reason in AUTO mode).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// How a message is settled.
#[derive(Debug, Clone)]
pub(super) enum Via {
    /// On the subscription stream it came on.
    Stream(Settler),
    /// With unary calls.
    Unary(Box<Client>),
    /// Already acknowledged at delivery (IMMEDIATE).
    Done,
}

/// The messages a subscriber holds, by token.
pub(super) type Registry = Arc<Mutex<HashMap<String, Arc<Held>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the subscriber keeps of a message it holds.
#[derive(Debug)]
pub(super) struct Held {
    pub token: String,
    pub via: Via,
    pub settled: AtomicBool,
    /// FIFO: why the server released this delivery (an earlier message of
    /// its group, leased with it, failed first); it must not be acked.
    released: Mutex<Option<String>>,
    /// The other messages of the subscriber, to mark those a nack released.
    peers: Weak<Mutex<HashMap<String, Arc<Held>>>>,
    /// Set once the server answered an ack or nack of the delivery
    /// (whatever the answer), or released it: the end of its turn in its
    /// FIFO group.
    answered: AtomicBool,
    /// Set once the server confirmed an ack or nack of the delivery (at
    /// delivery in IMMEDIATE mode). A nack's answer names what it
    /// released, so after a confirmed settle the subscriber knows which
    /// later messages of the group are gone; after any other end it does
    /// not.
    confirmed: AtomicBool,
    /// Signalled when `answered` is set.
    answer: Notify,
    /// Current lease deadline (ms since the epoch).
    pub deadline: AtomicU64,
    /// When the current lease started (ms since the epoch).
    pub started: AtomicU64,
}

impl Held {
    pub(super) fn new(
        d: &pb::Delivery,
        via: Via,
        timeout: Duration,
        peers: &Registry,
    ) -> Arc<Held> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let done = matches!(via, Via::Done);
        Arc::new(Held {
            token: d.ack_token.clone(),
            released: Mutex::new(None),
            peers: Arc::downgrade(peers),
            settled: AtomicBool::new(done),
            answered: AtomicBool::new(done),
            confirmed: AtomicBool::new(done),
            answer: Notify::new(),
            via,
            deadline: AtomicU64::new(d.lease_deadline_unix_ms),
            started: AtomicU64::new(d.lease_deadline_unix_ms.saturating_sub(timeout_ms)),
        })
    }

    /// Marks the delivery released by the server: it is settled, and
    /// acking or nacking it fails with `why`.
    fn release(&self, why: String) {
        *lock(&self.released) = Some(why);
        self.settled.store(true, Ordering::SeqCst);
        self.answered(false);
    }

    /// Records the server's answer to a settle (`ok`: confirmed).
    fn answered(&self, ok: bool) {
        if ok {
            self.confirmed.store(true, Ordering::SeqCst);
        }
        self.answered.store(true, Ordering::SeqCst);
        self.answer.notify_waiters();
    }

    /// True once the server confirmed an ack or nack of the delivery.
    pub(super) fn is_confirmed(&self) -> bool {
        self.confirmed.load(Ordering::SeqCst)
    }

    /// Waits until the server answered a settle of the delivery or
    /// released it (true), or until `grace_ms` after its lease ran out,
    /// as far as this clock can tell (false).
    pub(super) async fn answered_or_lapsed(&self, grace_ms: u64) -> bool {
        loop {
            // Created before the check: `notify_waiters` reaches it from
            // here on, so an answer between the check and the wait wakes it.
            let answer = self.answer.notified();
            if self.answered.load(Ordering::SeqCst) {
                return true;
            }
            // Read each time: the handler may still extend the lease.
            let until = self
                .deadline
                .load(Ordering::SeqCst)
                .saturating_add(grace_ms);
            let now = now_ms();
            if now >= until {
                return false;
            }
            // Answered, or the lease as it was ran out: the loop looks
            // again (the lease may have been extended meanwhile).
            let _ = tokio::time::timeout(Duration::from_millis(until - now), answer).await;
        }
    }

    /// True once the server released the delivery (see [`Held::release`]).
    pub(super) fn is_released(&self) -> bool {
        lock(&self.released).is_some()
    }

    fn claim(&self) -> Result<()> {
        if let Some(why) = lock(&self.released).clone() {
            return Err(ClientError::new(ErrorKind::LeaseLost, why));
        }
        if self.settled.swap(true, Ordering::SeqCst) {
            return Err(ClientError::new(
                ErrorKind::LeaseLost,
                "the message was settled already",
            ));
        }
        Ok(())
    }

    pub(super) async fn ack(&self) -> Result<()> {
        self.claim()?;
        let r = self.send_ack().await;
        self.answered(r.is_ok());
        r
    }

    async fn send_ack(&self) -> Result<()> {
        let r = match &self.via {
            Via::Stream(s) => s.ack(vec![self.token.clone()]).await?,
            Via::Unary(c) => c.ack(vec![self.token.clone()]).await?,
            Via::Done => return Ok(()),
        };
        check(r)
    }

    pub(super) async fn nack(
        &self,
        reason: &str,
        dead_letter: bool,
        delay: Option<u64>,
    ) -> Result<()> {
        self.claim()?;
        let r = self.send_nack(reason, dead_letter, delay).await;
        self.answered(r.is_ok());
        r
    }

    async fn send_nack(&self, reason: &str, dead_letter: bool, delay: Option<u64>) -> Result<()> {
        let item = pb::NackItem {
            ack_token: self.token.clone(),
            delay_ms: delay,
            reason: truncate(reason, 1024),
            dead_letter,
        };
        let (r, released) = match &self.via {
            Via::Stream(s) => s.nack_releasing(vec![item]).await?,
            Via::Unary(c) => c.nack_releasing(vec![item]).await?,
            Via::Done => return Ok(()),
        };
        // FIFO: later messages of this one's group that came with it are
        // released by the server; none of them may be acked now.
        if let Some(peers) = self.peers.upgrade() {
            let peers = lock(&peers);
            for r in released {
                if let Some(h) = peers.get(&r.ack_token) {
                    h.release(format!(
                        "released: the earlier message {} of its group failed first",
                        r.released_by
                    ));
                }
            }
        }
        check(r)
    }

    pub(super) async fn extend(&self, timeout: Duration) -> Result<()> {
        if self.settled.load(Ordering::SeqCst) {
            return Ok(());
        }
        let item = pb::ExtendItem {
            ack_token: self.token.clone(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let mut r = match &self.via {
            Via::Stream(s) => s.extend(vec![item]).await?,
            Via::Unary(c) => c.extend(vec![item]).await?,
            Via::Done => return Ok(()),
        };
        let res = r
            .pop()
            .ok_or_else(|| ClientError::new(ErrorKind::Closed, "no result"))?;
        if res.status == pb::SettleStatus::Ok as i32 {
            let now = now_ms();
            self.started.store(now, Ordering::SeqCst);
            self.deadline
                .store(res.lease_deadline_unix_ms, Ordering::SeqCst);
            Ok(())
        } else {
            Err(ClientError::new(ErrorKind::LeaseLost, res.error))
        }
    }
}

fn check(mut r: Vec<pb::SettleResult>) -> Result<()> {
    match r.pop() {
        Some(res) if res.status == pb::SettleStatus::Ok as i32 => Ok(()),
        Some(res) => Err(ClientError::new(ErrorKind::LeaseLost, res.error)),
        None => Err(ClientError::new(ErrorKind::Closed, "no result")),
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A message handed to a subscriber's handler.
#[derive(Debug, Clone)]
pub struct Message {
    delivery: Arc<pb::Delivery>,
    held: Arc<Held>,
}

impl Message {
    pub(super) fn new(delivery: pb::Delivery, held: Arc<Held>) -> Message {
        Message {
            delivery: Arc::new(delivery),
            held,
        }
    }

    pub(super) fn held_arc(&self) -> Arc<Held> {
        Arc::clone(&self.held)
    }

    /// The whole delivery (properties, history, ...).
    pub fn delivery(&self) -> &pb::Delivery {
        &self.delivery
    }

    /// The message id.
    pub fn id(&self) -> &str {
        &self.delivery.message_id
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.delivery.body
    }

    /// Deliveries so far in this queue, this one included: 1 on the first
    /// delivery, higher on every later one (a FIFO release included).
    pub fn delivery_count(&self) -> u32 {
        self.delivery.delivery_count
    }

    /// Failed attempts before this delivery (nacks, leases that ran out,
    /// streams closed with it): what the queue's `max_deliveries` counts.
    pub fn failed_attempts(&self) -> u32 {
        self.delivery.failed_attempts
    }

    /// The ack token (empty in IMMEDIATE mode).
    pub fn ack_token(&self) -> &str {
        &self.held.token
    }

    /// When the current lease runs out, in ms since the Unix epoch
    /// (extensions included).
    pub fn lease_deadline(&self) -> u64 {
        self.held.deadline.load(Ordering::SeqCst)
    }

    /// True once the message was acked or nacked (by the handler or the
    /// subscriber), or released.
    pub fn is_settled(&self) -> bool {
        self.held.settled.load(Ordering::SeqCst)
    }

    /// FIFO: true once the server released this delivery because an
    /// earlier message of its group, delivered with it, failed first. It
    /// comes again after that one; acking it fails, and the subscriber
    /// does not hand it to the handler if it has not yet.
    pub fn is_released(&self) -> bool {
        self.held.is_released()
    }

    /// Acknowledges the message (MANUAL mode). Fails with
    /// [`ErrorKind::LeaseLost`] if the lease is gone.
    pub async fn ack(&self) -> Result<()> {
        self.held.ack().await
    }

    /// Rejects the message: a failed attempt, redelivered later.
    pub async fn nack(&self, reason: &str) -> Result<()> {
        self.held.nack(reason, false, None).await
    }

    /// Rejects the message to the dead letter queue at once.
    pub async fn reject(&self, reason: &str) -> Result<()> {
        self.held.nack(reason, true, None).await
    }

    /// Extends the lease by `timeout` from now.
    pub async fn extend(&self, timeout: Duration) -> Result<()> {
        self.held.extend(timeout).await
    }

    /// Runs `op` until it succeeds, at most `attempts` times, waiting
    /// `backoff` (doubled each time) in between — but never past the
    /// lease: an attempt that could not finish before the lease runs out
    /// (with `margin` to spare) is not started, and the last error is
    /// returned. This is "Until Successful inside the acknowledgement
    /// timeout": the retries must end before the broker redelivers.
    pub async fn retry_within_lease<T, F, Fut>(
        &self,
        attempts: u32,
        backoff: Duration,
        margin: Duration,
        mut op: F,
    ) -> std::result::Result<T, HandlerError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, HandlerError>>,
    {
        let margin_ms = u64::try_from(margin.as_millis()).unwrap_or(u64::MAX);
        let mut wait = backoff;
        let mut last = HandlerError::any("no attempt made: the lease was too short");
        for attempt in 1..=attempts.max(1) {
            if now_ms().saturating_add(margin_ms) >= self.lease_deadline() {
                break;
            }
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => last = e,
            }
            if attempt == attempts {
                break;
            }
            let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            if now_ms().saturating_add(wait_ms).saturating_add(margin_ms) >= self.lease_deadline() {
                break;
            }
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
        Err(last)
    }
}
