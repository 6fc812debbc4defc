//! The subscriber: runs a handler for each message of a queue, with the
//! prefetch strategy (a push subscription and a local buffer whose leases
//! are extended before they run out) or the polling strategy (a receive on
//! a fixed interval or a cron schedule, with optional backpressure), an ack
//! mode, a concurrency limit and an optional circuit breaker.
//!
//! **FIFO order.** On a FIFO queue the messages of one group run one
//! after another, in order, whatever `max_concurrency`: the next message
//! of a group starts once the one before it returned from the handler and
//! is settled (in MANUAL mode: settled by the handler, or its lease over;
//! a message left unsettled holds its group until then). Messages of
//! other groups run meanwhile, up to `max_concurrency` at once, as every
//! message of a standard queue does. A message waiting for its group
//! keeps its lease (it is extended, with either strategy). When a message
//! fails (a nack, an ack refused, a lease that ran out), the later
//! messages of its group that came with it were released by the server
//! (SPEC §3): they are skipped, never handed to the handler, and come
//! again after the failed one. Details in `src/client/fifo.rs`.
//!
//! ```no_run
//! use std::time::Duration;
//! use letterbox::client::{AckMode, Client, HandlerError, Subscriber, SubscriberConfig};
//!
//! # async fn demo() -> Result<(), letterbox::client::ClientError> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let config = SubscriberConfig {
//!     ack_mode: AckMode::Auto,
//!     max_concurrency: 4,
//!     ..SubscriberConfig::prefetch("invoices", 20)
//! };
//! let handle = Subscriber::start(client, config, |msg| async move {
//!     if msg.body().is_empty() {
//!         return Err(HandlerError::new("INVOICE:INVALID", "empty order"));
//!     }
//!     Ok(())
//! })
//! .await?;
//! tokio::time::sleep(Duration::from_secs(60)).await;
//! handle.stop().await?;
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::future::Future;
use std::ops::ControlFlow;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use super::ack_mode::{Held, Registry, Via, now_ms};
use super::circuit::{CircuitBreaker, CircuitState, Permit};
use super::fifo::{Groups, Turn};
use super::{AckMode, Client, ClientError, ErrorKind, HandlerError, Message, Result, Settler, pb};

/// When a polling subscriber fetches.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Every interval.
    Every(Duration),
    /// On a cron schedule (seconds field first, as in the Mule scheduler:
    /// `0 * 14 * * ?` is every minute from 14:00 to 14:59), in UTC.
    Cron(Box<cron::Schedule>),
}

impl Schedule {
    /// Parses a cron expression.
    pub fn cron(expr: &str) -> Result<Schedule> {
        cron::Schedule::from_str(expr)
            .map(|s| Schedule::Cron(Box::new(s)))
            .map_err(|e| {
                ClientError::new(
                    ErrorKind::InvalidArgument,
                    format!("cron expression {expr:?}: {e}"),
                )
            })
    }

    /// Time to wait until the next fetch.
    fn next_wait(&self) -> Option<Duration> {
        match self {
            Schedule::Every(d) => Some(*d),
            Schedule::Cron(s) => {
                let next = s.upcoming(chrono::Utc).next()?;
                let ms = (next - chrono::Utc::now()).num_milliseconds().max(0);
                Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
            }
        }
    }
}

/// How a subscriber gets messages.
#[derive(Debug, Clone)]
pub enum Strategy {
    /// A push subscription holding up to `max_local` messages (buffered
    /// and being handled). A held message whose lease reaches 80 % of its
    /// length gets it extended, so a slow handler never loses its message.
    Prefetch {
        /// Most messages held locally.
        max_local: u32,
    },
    /// A receive on a schedule, up to `fetch_size` messages held each
    /// time (fetched and not yet handled). With `backpressure`, only as
    /// many as `max_concurrency` leaves room for are fetched, so at most
    /// `max_concurrency` messages are ever leased by this subscriber.
    /// Fetched messages waiting for a handler slot (or for their FIFO
    /// group) have their leases extended; messages being handled do not.
    Polling {
        /// When to fetch.
        schedule: Schedule,
        /// Most messages per fetch (1 to 1000).
        fetch_size: u32,
        /// Fetch only what the free handler slots can take.
        backpressure: bool,
    },
}

/// Subscriber settings.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// The queue.
    pub queue: String,
    /// Prefetch or polling.
    pub strategy: Strategy,
    /// When messages are acknowledged.
    pub ack_mode: AckMode,
    /// Most handlers running at once (of a FIFO queue, one per message
    /// group at a time).
    pub max_concurrency: usize,
    /// Lease length instead of the queue's ack timeout.
    pub ack_timeout: Option<Duration>,
    /// Circuit breaker, private or shared (see [`CircuitBreaker::shared`]).
    pub circuit: Option<Arc<CircuitBreaker>>,
}

impl SubscriberConfig {
    /// The prefetch strategy with defaults: AUTO acks, one handler at a
    /// time, the queue's ack timeout, no circuit breaker.
    pub fn prefetch(queue: impl Into<String>, max_local: u32) -> SubscriberConfig {
        SubscriberConfig {
            queue: queue.into(),
            strategy: Strategy::Prefetch { max_local },
            ack_mode: AckMode::Auto,
            max_concurrency: 1,
            ack_timeout: None,
            circuit: None,
        }
    }

    /// The polling strategy with defaults (fetch up to 10 every interval,
    /// no backpressure).
    pub fn polling(queue: impl Into<String>, every: Duration) -> SubscriberConfig {
        SubscriberConfig {
            strategy: Strategy::Polling {
                schedule: Schedule::Every(every),
                fetch_size: 10,
                backpressure: false,
            },
            ..SubscriberConfig::prefetch(queue, 10)
        }
    }
}

/// Figures of a running subscriber.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Handler runs started.
    pub handled: u64,
    /// Handler runs that returned `Ok`.
    pub succeeded: u64,
    /// Handler runs that returned `Err`.
    pub failed: u64,
    /// Lease extensions made.
    pub extended: u64,
    /// Messages given back unhandled (circuit open, stop).
    pub returned: u64,
    /// FIFO messages not handed to the handler because a failure of an
    /// earlier message of their group released them (SPEC §3), or whose
    /// lease was found gone when their turn came.
    pub released: u64,
    /// Most handlers seen running at once.
    pub max_in_flight: usize,
}

type HandlerFuture =
    std::pin::Pin<Box<dyn Future<Output = std::result::Result<(), HandlerError>> + Send>>;
type Handler = Arc<dyn Fn(Message) -> HandlerFuture + Send + Sync>;

#[derive(Default)]
struct Counters {
    handled: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    extended: AtomicU64,
    returned: AtomicU64,
    released: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

struct Shared {
    client: Client,
    config: SubscriberConfig,
    handler: Handler,
    slots: Arc<Semaphore>,
    /// Messages held (buffered or being handled), for lease extension.
    held: Registry,
    counters: Counters,
    timeout: Duration,
    /// Signalled when a handler run finishes.
    finished: Notify,
    /// FIFO: the groups with a message in its turn.
    groups: Groups,
    /// Set when the subscriber stops.
    stopping: watch::Receiver<bool>,
}

/// Starts subscribers; see the module documentation.
#[derive(Debug)]
pub struct Subscriber;

/// A running subscriber.
#[derive(Debug)]
pub struct SubscriberHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<()>>,
    shared: Arc<SharedView>,
}

/// What the handle can see of the subscriber.
struct SharedView(Arc<Shared>);

impl std::fmt::Debug for SharedView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("queue", &self.0.config.queue)
            .finish()
    }
}

impl SubscriberHandle {
    /// Current figures.
    pub fn stats(&self) -> SubscriberStats {
        let c = &self.shared.0.counters;
        SubscriberStats {
            handled: c.handled.load(Ordering::SeqCst),
            succeeded: c.succeeded.load(Ordering::SeqCst),
            failed: c.failed.load(Ordering::SeqCst),
            extended: c.extended.load(Ordering::SeqCst),
            returned: c.returned.load(Ordering::SeqCst),
            released: c.released.load(Ordering::SeqCst),
            max_in_flight: c.max_in_flight.load(Ordering::SeqCst),
        }
    }

    /// Stops gracefully: no more fetching, handlers in flight finish,
    /// buffered messages are returned to the queue.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|e| ClientError::new(ErrorKind::Closed, format!("subscriber task: {e}")))?
    }
}

impl Subscriber {
    /// Starts a subscriber running `handler` for each message. It reads
    /// the queue first (its kind, and its ack timeout unless
    /// [`SubscriberConfig::ack_timeout`] is given), so the queue must
    /// exist.
    pub async fn start<F, Fut>(
        client: Client,
        config: SubscriberConfig,
        handler: F,
    ) -> Result<SubscriberHandle>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), HandlerError>> + Send + 'static,
    {
        let queue = client
            .get_queue(&config.queue)
            .await?
            .config
            .unwrap_or_default();
        let timeout = config
            .ack_timeout
            .unwrap_or_else(|| Duration::from_millis(queue.ack_timeout_ms.unwrap_or(120_000)));
        let fifo = queue.kind == pb::QueueKind::Fifo as i32;
        let handler: Handler = Arc::new(move |m| Box::pin(handler(m)));
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            slots: Arc::new(Semaphore::new(config.max_concurrency.max(1))),
            client,
            config,
            handler,
            held: Registry::default(),
            counters: Counters::default(),
            timeout,
            finished: Notify::new(),
            groups: Groups::new(fifo),
            stopping: stop_rx.clone(),
        });
        let s = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            match s.config.strategy.clone() {
                Strategy::Prefetch { max_local } => prefetch(s, max_local.max(1), stop_rx).await,
                Strategy::Polling {
                    schedule,
                    fetch_size,
                    backpressure,
                } => {
                    polling(
                        s,
                        schedule,
                        fetch_size.clamp(1, 1000),
                        backpressure,
                        stop_rx,
                    )
                    .await
                }
            }
        });
        Ok(SubscriberHandle {
            stop,
            task,
            shared: Arc::new(SharedView(shared)),
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long after a FIFO message's lease ran out, by this clock, its
/// group waits for it when a MANUAL handler returned without settling it:
/// room for a server clock behind this one.
const LEASE_GRACE: Duration = Duration::from_secs(1);

impl Shared {
    /// Wraps a delivery; in IMMEDIATE mode acknowledges it first.
    async fn message(&self, d: pb::Delivery, via: Via) -> Option<Message> {
        let held = Held::new(&d, via, self.timeout, &self.held);
        if self.config.ack_mode == AckMode::Immediate
            && !d.ack_token.is_empty()
            && let Err(e) = held.ack().await
        {
            tracing::warn!(error = %e, "immediate ack failed; the message is not handled");
            return None;
        }
        if !held.settled.load(Ordering::SeqCst) {
            lock(&self.held).insert(held.token.clone(), Arc::clone(&held));
        }
        Some(Message::new(d, held))
    }

    /// Gives an unhandled message back to the queue.
    async fn give_back(&self, m: &Message) {
        self.counters.returned.fetch_add(1, Ordering::SeqCst);
        lock(&self.held).remove(m.ack_token());
        if !m.is_settled() {
            let _ = m
                .held_arc()
                .nack("returned unhandled by the subscriber", false, Some(0))
                .await;
        }
    }

    /// Extends the leases of held messages that reached 80 % of their
    /// length.
    fn extend_due(self: &Arc<Self>) {
        let held: Vec<Arc<Held>> = lock(&self.held).values().cloned().collect();
        self.extend_due_of(held);
    }

    /// Extends the leases among `held` that reached 80 % of their length.
    fn extend_due_of(self: &Arc<Self>, held: impl IntoIterator<Item = Arc<Held>>) {
        let now = now_ms();
        let due: Vec<Arc<Held>> = held
            .into_iter()
            .filter(|h| {
                let start = h.started.load(Ordering::SeqCst);
                let end = h.deadline.load(Ordering::SeqCst);
                !h.settled.load(Ordering::SeqCst)
                    && now >= start + (end.saturating_sub(start)) * 4 / 5
            })
            .collect();
        for h in due {
            let s = Arc::clone(self);
            tokio::spawn(async move {
                match h.extend(s.timeout).await {
                    Ok(()) => {
                        s.counters.extended.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => tracing::debug!(error = %e, "lease extension failed"),
                }
            });
        }
    }

    /// Gives back every message of `buffer`, in order.
    async fn give_back_all(&self, buffer: &mut VecDeque<Message>) {
        while let Some(m) = buffer.pop_front() {
            self.give_back(&m).await;
        }
    }

    /// Runs the handler for a message on a permit, in the message's turn
    /// in its FIFO group (see [`super::fifo`]); settles per the ack mode
    /// and reports to the circuit breaker. A FIFO message released
    /// meanwhile (an earlier one of its group failed) is dropped instead:
    /// it comes again after that one.
    fn dispatch(self: &Arc<Self>, m: Message, permit: OwnedSemaphorePermit) {
        if m.is_released() {
            self.drop_released(&m);
            return;
        }
        let turn = self.groups.begin(&m);
        // Counted at once, so that a dispatcher waiting for the handlers
        // to finish sees this one.
        let c = &self.counters;
        let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        c.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let s = Arc::clone(self);
        tokio::spawn(async move {
            let ran = !turn.check || s.lease_held(&m).await;
            if ran {
                s.run(&m).await;
            }
            lock(&s.held).remove(m.ack_token());
            s.counters.in_flight.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
            s.finished.notify_waiters();
            let known = ran && s.turn_over(&turn, &m).await;
            s.groups.end(turn, known);
        });
    }

    /// Runs the handler; settles in AUTO mode.
    async fn run(&self, m: &Message) {
        let c = &self.counters;
        c.handled.fetch_add(1, Ordering::SeqCst);
        let outcome = (self.handler)(m.clone()).await;
        match &outcome {
            Ok(()) => {
                c.succeeded.fetch_add(1, Ordering::SeqCst);
                if let Some(cb) = &self.config.circuit {
                    cb.on_success();
                }
            }
            Err(e) => {
                c.failed.fetch_add(1, Ordering::SeqCst);
                if let Some(cb) = &self.config.circuit {
                    cb.on_failure(e.kind());
                }
            }
        }
        if self.config.ack_mode == AckMode::Auto && !m.is_settled() {
            let settled = match &outcome {
                Ok(()) => m.ack().await,
                Err(e) => m.nack(e.message()).await,
            };
            if let Err(e) = settled {
                tracing::debug!(message_id = %m.id(), error = %e, "settling after the handler failed");
            }
        }
    }

    /// Drops a released message unhandled.
    fn drop_released(&self, m: &Message) {
        self.counters.released.fetch_add(1, Ordering::SeqCst);
        lock(&self.held).remove(m.ack_token());
    }

    /// A message of a FIFO group in doubt: true if it still holds its
    /// lease (now extended). One whose lease is gone (released, or run
    /// out) is dropped; one that cannot be checked is given back.
    async fn lease_held(&self, m: &Message) -> bool {
        match m.held_arc().extend(self.timeout).await {
            Ok(()) => true,
            Err(e) if e.kind() == ErrorKind::LeaseLost => {
                tracing::debug!(message_id = %m.id(), error = %e, "lease gone before its turn; skipped");
                self.drop_released(m);
                false
            }
            Err(e) => {
                tracing::debug!(message_id = %m.id(), error = %e, "lease not checked; given back");
                self.give_back(m).await;
                false
            }
        }
    }

    /// Waits for the end of a FIFO message's turn once its handler
    /// returned: its settle answered (at once in AUTO and IMMEDIATE
    /// mode), or [`LEASE_GRACE`] after its lease ran out (a MANUAL
    /// handler that returned without settling it), or the subscriber
    /// stopping. True when the server confirmed the settle.
    async fn turn_over(&self, turn: &Turn, m: &Message) -> bool {
        if !turn.grouped() {
            return true;
        }
        let held = m.held_arc();
        let grace = u64::try_from(LEASE_GRACE.as_millis()).unwrap_or(u64::MAX);
        let mut stopping = self.stopping.clone();
        tokio::select! {
            _ = held.answered_or_lapsed(grace) => {}
            _ = stopping.wait_for(|stop| *stop) => {}
        }
        held.is_confirmed()
    }

    /// Waits until no handler runs.
    async fn idle(&self) {
        loop {
            let finished = self.finished.notified();
            if self.counters.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            finished.await;
        }
    }

    /// Waits for every handler in flight.
    async fn drain(&self) {
        let n = u32::try_from(self.config.max_concurrency.max(1)).unwrap_or(u32::MAX);
        if let Ok(all) = self.slots.acquire_many(n).await {
            drop(all);
        }
    }
}

/// What a prefetch subscriber is doing about its circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Messages flow.
    Flowing,
    /// Circuit open: nothing is fetched before this instant.
    Waiting(Instant),
    /// Holding the circuit's probe; `got` once its message arrived.
    Probing { got: bool },
}

/// True when the circuit is not closed (checked again right before a
/// dispatch: a handler that just finished may have tripped it).
fn tripped(circuit: Option<&Arc<CircuitBreaker>>) -> bool {
    circuit.is_some_and(|c| c.state() != CircuitState::Closed)
}

fn decide(circuit: Option<&Arc<CircuitBreaker>>) -> Mode {
    let Some(c) = circuit else {
        return Mode::Flowing;
    };
    if c.state() == CircuitState::Closed {
        return Mode::Flowing;
    }
    match c.permit() {
        Permit::Flow => Mode::Flowing,
        Permit::Probe => Mode::Probing { got: false },
        Permit::Wait(t) => Mode::Waiting(t),
    }
}

async fn open(
    s: &Shared,
    credit: u32,
    stop: &mut watch::Receiver<bool>,
) -> Option<super::Subscription> {
    let mut wait = Duration::from_millis(100);
    loop {
        match s
            .client
            .subscribe(&s.config.queue, credit, Some(s.timeout))
            .await
        {
            Ok(sub) => return Some(sub),
            Err(e) => {
                tracing::warn!(queue = %s.config.queue, error = %e, "cannot subscribe; retrying")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return None,
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

async fn prefetch(s: Arc<Shared>, max_local: u32, mut stop: watch::Receiver<bool>) -> Result<()> {
    let Some(mut sub) = open(&s, max_local, &mut stop).await else {
        return Ok(());
    };
    let mut settler: Settler = sub.settler();
    let mut credit = max_local;
    let mut buffer: VecDeque<Message> = VecDeque::new();
    let mut mode = decide(s.config.circuit.as_ref());
    let check = (s.timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut tick = tokio::time::interval(check);
    loop {
        if !matches!(mode, Mode::Probing { .. }) {
            mode = decide(s.config.circuit.as_ref());
        }
        let want = match mode {
            Mode::Flowing => max_local,
            Mode::Waiting(_) | Mode::Probing { got: true } => 0,
            Mode::Probing { got: false } => 1,
        };
        if want != credit && settler.set_credit(want).await.is_ok() {
            credit = want;
        }
        if matches!(mode, Mode::Waiting(_)) {
            s.give_back_all(&mut buffer).await;
        }
        // The first message that may start: FIFO groups keep their order.
        let ready = s.groups.next_ready(&buffer);
        let can_dispatch = ready.is_some() && !matches!(mode, Mode::Waiting(_));
        let until = match mode {
            Mode::Waiting(t) => t,
            _ => Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            d = sub.next() => match d {
                Some(Ok(d)) => {
                    let Some(m) = s.message(d, Via::Stream(settler.clone())).await else { continue };
                    match mode {
                        Mode::Waiting(_) => s.give_back(&m).await,
                        Mode::Probing { got: false } => {
                            mode = Mode::Probing { got: true };
                            buffer.push_back(m);
                        }
                        _ => buffer.push_back(m),
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(queue = %s.config.queue, error = %e, "subscription broke; reopening");
                    buffer.clear();
                    let Some(again) = open(&s, credit.max(1), &mut stop).await else { break };
                    sub = again;
                    settler = sub.settler();
                }
                None => {
                    buffer.clear();
                    let Some(again) = open(&s, credit.max(1), &mut stop).await else { break };
                    sub = again;
                    settler = sub.settler();
                }
            },
            permit = Arc::clone(&s.slots).acquire_owned(), if can_dispatch => {
                if let (Ok(permit), Some(m)) = (permit, ready.and_then(|i| buffer.remove(i))) {
                    let probe = matches!(mode, Mode::Probing { got: true });
                    if !probe && tripped(s.config.circuit.as_ref()) {
                        // The handler that just freed this slot tripped
                        // the circuit: this message goes back.
                        drop(permit);
                        s.give_back(&m).await;
                        continue;
                    }
                    s.dispatch(m, permit);
                    if probe {
                        // Wait for the probe's outcome before deciding.
                        s.idle().await;
                        mode = decide(s.config.circuit.as_ref());
                    }
                }
            }
            // Every buffered message waits for its group: one may go
            // once a turn ends.
            () = s.groups.freed(), if ready.is_none() && !buffer.is_empty() => {}
            _ = tick.tick() => s.extend_due(),
            () = tokio::time::sleep_until(until), if matches!(mode, Mode::Waiting(_)) => {}
            _ = stop.changed() => break,
        }
    }
    // Graceful stop: no more deliveries, give back the buffer, let the
    // handlers in flight finish (settling on the still-open stream).
    let _ = settler.set_credit(0).await;
    s.give_back_all(&mut buffer).await;
    if let (Mode::Probing { .. }, Some(c)) = (mode, &s.config.circuit) {
        c.release_probe();
    }
    s.drain().await;
    sub.close().await;
    Ok(())
}

async fn polling(
    s: Arc<Shared>,
    schedule: Schedule,
    fetch_size: u32,
    backpressure: bool,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    // Fetched and not yet dispatched (waiting for a slot, or for the
    // message before it in its FIFO group), in arrival order.
    let mut pending: VecDeque<Message> = VecDeque::new();
    // The first fetch at once, then on the schedule.
    let mut next_fetch = Some(Instant::now());
    // The message fetched as the circuit's probe is pending.
    let mut probe = false;
    // Pending messages keep their leases (those being handled do not:
    // polling extends none).
    let check = (s.timeout / 10).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut tick = tokio::time::interval(check);
    loop {
        let ready = s.groups.next_ready(&pending);
        let fetch_at = next_fetch.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            () = tokio::time::sleep_until(fetch_at), if next_fetch.is_some() && !probe => {
                next_fetch = schedule.next_wait().map(|w| Instant::now() + w);
                probe = s.fetch(fetch_size, backpressure, &mut pending).await.is_break();
            }
            permit = Arc::clone(&s.slots).acquire_owned(), if ready.is_some() => {
                let (Ok(permit), Some(m)) = (permit, ready.and_then(|i| pending.remove(i))) else {
                    break;
                };
                if !probe && !m.is_released() && tripped(s.config.circuit.as_ref()) {
                    // The circuit tripped meanwhile: what is not
                    // dispatched goes back.
                    drop(permit);
                    s.give_back(&m).await;
                    s.give_back_all(&mut pending).await;
                    continue;
                }
                s.dispatch(m, permit);
                if probe {
                    probe = false;
                    s.idle().await;
                }
            }
            // Every pending message waits for its group: one may go once
            // a turn ends.
            () = s.groups.freed(), if ready.is_none() && !pending.is_empty() => {}
            _ = tick.tick() => s.extend_due_of(pending.iter().map(Message::held_arc)),
            _ = stop.changed() => break,
        }
        if next_fetch.is_none() && pending.is_empty() {
            break;
        }
    }
    s.give_back_all(&mut pending).await;
    if let (true, Some(c)) = (probe, &s.config.circuit) {
        c.release_probe();
    }
    s.drain().await;
    Ok(())
}

impl Shared {
    /// One fetch of the polling strategy into `pending`, as the circuit
    /// allows: none while it is open (what is pending goes back), a
    /// single message as its probe when half open, else up to
    /// `fetch_size` messages held at once (up to what the free handler
    /// slots leave room for, with backpressure). `Break` when the probe's
    /// message is pending.
    async fn fetch(
        &self,
        fetch_size: u32,
        backpressure: bool,
        pending: &mut VecDeque<Message>,
    ) -> ControlFlow<()> {
        let probing = match decide(self.config.circuit.as_ref()) {
            Mode::Flowing => false,
            Mode::Probing { .. } => true,
            Mode::Waiting(_) => {
                self.give_back_all(pending).await;
                return ControlFlow::Continue(());
            }
        };
        if probing {
            self.give_back_all(pending).await;
        }
        let held = u32::try_from(pending.len()).unwrap_or(u32::MAX);
        let mut n = if probing {
            1
        } else {
            fetch_size.saturating_sub(held)
        };
        if backpressure {
            let free = u32::try_from(self.slots.available_permits()).unwrap_or(u32::MAX);
            n = n.min(free.saturating_sub(held));
        }
        let got = if n == 0 {
            Vec::new()
        } else {
            let req = pb::ReceiveRequest {
                queue: self.config.queue.clone(),
                max_messages: n,
                wait_ms: 0,
                ack_timeout_ms: Some(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)),
                auto_ack: self.config.ack_mode == AckMode::Immediate,
                ack_tokens: Vec::new(),
                max_per_group: 0,
            };
            self.client.receive_with(req).await.unwrap_or_else(|e| {
                tracing::warn!(queue = %self.config.queue, error = %e, "poll failed");
                Vec::new()
            })
        };
        let via = if self.config.ack_mode == AckMode::Immediate {
            Via::Done
        } else {
            Via::Unary(Box::new(self.client.clone()))
        };
        for d in got {
            if let Some(m) = self.message(d, via.clone()).await {
                pending.push_back(m);
            }
        }
        if !probing {
            return ControlFlow::Continue(());
        }
        if pending.is_empty() {
            if let Some(c) = &self.config.circuit {
                c.release_probe();
            }
            return ControlFlow::Continue(());
        }
        ControlFlow::Break(())
    }
}
