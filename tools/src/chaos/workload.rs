//! The workload: producers with per-producer sequence ids and a checksum
//! in every body, consumers whose handling of each message is fixed by the
//! seed and the message id (its *fate*), a Subscribe-stream consumer, and
//! an admin worker that creates, changes, deletes and reads queues.
//!
//! Every call goes into the [`History`]; nothing here judges the server.
//!
//! Unary calls go through the Rust client library ([`Client`]) with the
//! run's endpoint list (one server, or the two nodes of a pair): a call
//! that finds its node gone moves the client to the other one. Retries
//! are off (one attempt per call, see [`client_config`]), so each record
//! is the answer to exactly one request sent once. The two streams keep
//! the raw stubs (see [`stream_channel`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use letterbox::client::{Client, ClientConfig, ClientError, ErrorKind, RetryPolicy};
use letterbox::pb;
use letterbox::pb::messaging_service_client::MessagingServiceClient;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use super::history::{
    Admin, DeadLetter, Delivery, History, Outcome, PubMsg, Publish, QueueShape, Settle, SettleKind,
    SettleResult, Stamp, status_text,
};

/// Lease length of the workload's queues.
pub const ACK_TIMEOUT_MS: u64 = 1000;
/// Lease length the final drain asks for (the receive's `ack_timeout_ms`,
/// a Subscribe's too): long enough that a slow store's commits cannot make
/// a drain's acks come too late, short enough that a delivery whose ack
/// was lost comes back well within the drain's 20 s without progress.
pub const DRAIN_LEASE_MS: u64 = 10_000;
/// Most messages of one drain receive (of one FIFO group: `DRAIN_PER_GROUP`).
pub const DRAIN_BATCH: u32 = 20;
/// Most messages of one FIFO group in one drain receive.
pub const DRAIN_PER_GROUP: u32 = 5;
/// Deliveries before a dead-letter move.
pub const MAX_DELIVERIES: u32 = 3;
/// The standard queue.
pub const STD: &str = "std";
/// The FIFO queue.
pub const FIFO: &str = "fifo";
/// The standard queue whose messages carry short TTLs and are dead-lettered
/// on expiry.
pub const TTL: &str = "ttl";
/// Source queues, each with its DLQ `<name>.dlq`.
pub const SOURCES: [&str; 3] = [STD, FIFO, TTL];
/// The fanout exchange producers also publish through: bound to `std` and
/// `ttl`, each binding filtered on the property `dest`, so that every
/// message lands in exactly one of them and one call can fill both.
pub const EXCHANGE: &str = "route";
/// The property an exchange publish routes on.
pub const DEST: &str = "dest";

/// The DLQ of a source queue.
pub fn dlq_of(q: &str) -> String {
    format!("{q}.dlq")
}

/// Whether `q` is one of the workload's FIFO queues: the FIFO queue or its
/// DLQ (a DLQ has its source's kind).
pub fn fifo_kind(q: &str) -> bool {
    q == FIFO || q.strip_suffix(".dlq") == Some(FIFO)
}

/// What a consumer does with a message, fixed by seed and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fate {
    /// Ack.
    Ack,
    /// Nack the first delivery, then ack.
    Flaky,
    /// Hold the first delivery past its lease, then ack (which must fail).
    Slow,
    /// Never ack: nack every delivery (must end in the DLQ).
    Poison,
    /// Drop the first delivery (unary: let the lease run out; stream: close
    /// the stream), then ack.
    Vanish,
    /// Ack twice (the second must fail).
    DoubleAck,
    /// Extend the lease, hold past the original deadline, then ack.
    Extend,
}

/// A 64-bit hash of the seed and a string (FNV-1a, then a finaliser).
pub fn hash(seed: u64, s: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// The share of poison messages, in percent (default 5).
static POISON_PERCENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(5);

/// Sets the share of poison messages (0-100), taken from the `Ack` fate.
pub fn set_poison_percent(p: u64) {
    POISON_PERCENT.store(p.min(100), Ordering::Relaxed);
}

/// The fate of a message: by default 55 % ack, 10 % flaky, 5 % slow, 5 %
/// poison, 7 % vanish, 8 % double ack, 10 % extend.
pub fn fate(seed: u64, id: &str) -> Fate {
    let poison = POISON_PERCENT.load(Ordering::Relaxed);
    let h = hash(seed ^ 0xfa7e, id);
    if h % 100 < poison {
        return Fate::Poison;
    }
    match (h >> 8) % 100 {
        0..58 => Fate::Ack,
        58..68 => Fate::Flaky,
        68..73 => Fate::Slow,
        73..81 => Fate::Vanish,
        81..90 => Fate::DoubleAck,
        _ => Fate::Extend,
    }
}

/// The body published under `id`: `id|size|crc32 of the filler|filler`,
/// the filler derived from the seed and the id, `size` bytes in all (or
/// just the header when `size` is smaller).
pub fn body(seed: u64, id: &str, size: usize) -> Vec<u8> {
    let head = format!("{id}|{size}|");
    let fill_len = size.saturating_sub(head.len() + 9);
    let mut rng = fastrand::Rng::with_seed(hash(seed, id));
    let filler: Vec<u8> = (0..fill_len).map(|_| rng.alphanumeric() as u8).collect();
    let mut out = head.into_bytes();
    out.extend_from_slice(format!("{:08x}|", crc32fast::hash(&filler)).as_bytes());
    out.extend_from_slice(&filler);
    out
}

/// `None` if `got` is exactly the body published under `id`, else what is
/// wrong with it.
pub fn check_body(seed: u64, id: &str, got: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(&got[..got.len().min(600)]);
    let mut parts = text.splitn(3, '|');
    let (Some(bid), Some(size)) = (parts.next(), parts.next()) else {
        return Some(format!("unparseable body of {} bytes", got.len()));
    };
    if bid != id {
        return Some(format!("body belongs to message {bid:?}"));
    }
    let Ok(size) = size.parse::<usize>() else {
        return Some(format!("bad size field {size:?}"));
    };
    let want = body(seed, id, size);
    if want != got {
        return Some(format!(
            "body differs from the published one ({} bytes, {} expected)",
            got.len(),
            want.len()
        ));
    }
    None
}

/// Phases of the workload.
pub const RUNNING: u8 = 0;
/// Final phase: every fate but poison acks on sight.
pub const FINAL: u8 = 1;
/// The nemesis note that marks the start of the final phase.
pub const FINAL_NOTE: &str = "final phase: the drain begins";
/// Stop.
pub const STOP: u8 = 2;

/// State shared by the workers.
pub struct Shared {
    /// The history.
    pub hist: Arc<History>,
    /// The run's seed.
    pub seed: u64,
    /// The phase.
    pub phase: AtomicU8,
    /// Producers and the admin worker stop.
    pub quiet: AtomicBool,
    /// Settle tasks in flight.
    pub inflight: AtomicUsize,
    /// Consumers hold off (soak: let a backlog build up).
    pub paused: AtomicBool,
    /// Messages in the workload's queues at the last soak sample.
    pub backlog: AtomicU64,
    /// Soak: producers wait while the backlog is above this (0: never).
    pub backlog_cap: u64,
    /// The servers' URLs, comma-separated (one, or the two nodes of a
    /// pair in `--pair` mode).
    pub url: String,
}

impl Shared {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Relaxed)
    }
}

/// A lazily connecting channel: calls made while the server is down fail
/// fast, and it reconnects when the server is back.
pub fn channel(url: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(url.to_string())?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(8))
        .connect_lazy())
}

fn msg_client(ch: &Channel) -> MessagingServiceClient<Channel> {
    MessagingServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20)
}

/// The settings of the workload's [`Client`]: the limits of [`channel`],
/// and one attempt per call. The library retries a call that failed with
/// UNAVAILABLE or a broken connection when it is safe to repeat, and a
/// publish whose messages all have ids is (the repeat is idempotent):
/// but a repeat of a publish or a settle whose first attempt may have
/// been done would leave in the history only the second answer, of a
/// request the checker does not know was sent twice. With one attempt,
/// such a call is recorded as what it is, an unknown outcome, and the
/// workload's own next call goes to the other node (the library's
/// failover, which retries do not drive, moves the client at once).
pub fn client_config(url: &str) -> ClientConfig {
    let mut c = ClientConfig::new(url);
    c.connect_timeout = Duration::from_millis(500);
    c.request_timeout = Duration::from_secs(8);
    c.retry = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    c
}

/// Connects a [`Client`] (to the first node that answers), trying again
/// every 50 ms while none does; `None` once the workload stops. An
/// attempt is given 2 s at most (a connection made to a node that then
/// stops answering must not hold a worker up).
pub async fn connect(sh: &Shared) -> Option<Client> {
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            Client::with_config(client_config(&sh.url)),
        )
        .await;
        match attempt {
            Ok(Ok(c)) => return Some(c),
            _ if sh.phase() != STOP => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return None,
        }
    }
}

/// The raw stub of one node, for the two streams. They keep the stubs:
/// the library's `Subscription` settles through its own requests and the
/// `Publisher` batches messages into requests of its own and retries
/// them, while the checker needs the answer to each request the workload
/// sent (by its request id or sequence), and a broken stream's
/// unanswered requests as unknown outcomes. `at` picks the node; a stream
/// worker moves to the next one after a stream could not be opened or
/// broke.
fn stream_channel(sh: &Shared, at: usize) -> anyhow::Result<Channel> {
    let urls: Vec<&str> = sh.url.split(',').map(str::trim).collect();
    channel(urls[at % urls.len()])
}

/// How a call through the [`Client`] that failed ended, as the raw stub's
/// status would say ([`Outcome::from_status`]): an answer of the server
/// is judged by its status; a connection that could not be made is a
/// failure (the request was never sent); any other transport failure (a
/// connection broken during the call) leaves the outcome unknown.
pub fn client_outcome(e: &ClientError) -> Outcome {
    if let Some(s) = e.status() {
        return Outcome::from_status(s);
    }
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Transport
            if msg.starts_with("connection refused at ") || msg.contains("tcp connect error") =>
        {
            Outcome::Fail {
                code: "Unavailable".into(),
                msg,
            }
        }
        kind => Outcome::Info {
            code: match kind {
                ErrorKind::Rpc(c) => format!("{c:?}"),
                ErrorKind::Transport => "Unavailable".into(),
                other => format!("{other:?}"),
            },
            msg,
        },
    }
}

fn refused(o: &Outcome) -> bool {
    !o.is_ok()
}

/// How a call that returned `r` ended.
fn call_outcome<T>(r: &Result<T, ClientError>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(e) => client_outcome(e),
    }
}

/// The configuration of the workload's queues: that of their DLQs, plus
/// the dead letter policy.
pub fn source_config(q: &str) -> pb::QueueConfig {
    pb::QueueConfig {
        dead_letter: Some(pb::DeadLetterPolicy {
            queue: dlq_of(q),
            max_deliveries: MAX_DELIVERIES,
        }),
        dead_letter_on_expiry: Some(q == TTL),
        ..dlq_config(q)
    }
}

/// The configuration of a DLQ.
pub fn dlq_config(q: &str) -> pb::QueueConfig {
    pb::QueueConfig {
        kind: if q == FIFO {
            pb::QueueKind::Fifo as i32
        } else {
            pb::QueueKind::Standard as i32
        },
        ack_timeout_ms: Some(ACK_TIMEOUT_MS),
        ..Default::default()
    }
}

/// The shape of a configuration as read back.
pub fn shape(c: &pb::QueueConfig) -> QueueShape {
    QueueShape {
        kind: c.kind,
        ttl_ms: c.message_ttl_ms.unwrap_or(0),
        ack_timeout_ms: c.ack_timeout_ms.unwrap_or(0),
        max_length: c.max_length.unwrap_or(0),
        dead_letter: c
            .dead_letter
            .as_ref()
            .map(|d| (d.queue.clone(), d.max_deliveries)),
        dead_letter_on_expiry: c.dead_letter_on_expiry.unwrap_or(false),
    }
}

/// The shape a create with `c` gives (defaults filled in as the server
/// documents them).
pub fn expected_shape(c: &pb::QueueConfig) -> QueueShape {
    QueueShape {
        kind: if c.kind == 0 {
            pb::QueueKind::Standard as i32
        } else {
            c.kind
        },
        ttl_ms: c.message_ttl_ms.unwrap_or(7 * 24 * 3600 * 1000),
        ack_timeout_ms: c.ack_timeout_ms.unwrap_or(120_000),
        ..shape(c)
    }
}

/// Creates one queue, recording the call.
pub async fn create_queue(
    sh: &Shared,
    admin: &Client,
    name: &str,
    config: pb::QueueConfig,
) -> Outcome {
    let inv = sh.hist.now();
    let r = admin.create_queue(name, config.clone()).await;
    let outcome = call_outcome(&r);
    sh.hist.admin(Admin {
        op: "create",
        queue: name.into(),
        config: Some(expected_shape(&config)),
        inv,
        done: sh.hist.now(),
        outcome: outcome.clone(),
    });
    outcome
}

/// Creates the workload's queues (DLQs first) and its exchange with its
/// two bindings, retrying until each is made.
pub async fn setup(sh: &Shared) -> anyhow::Result<()> {
    let admin = connect(sh)
        .await
        .ok_or_else(|| anyhow::anyhow!("no server to set the queues up on"))?;
    for q in SOURCES {
        for (name, config) in [
            (dlq_of(q), dlq_config(q)),
            (q.to_string(), source_config(q)),
        ] {
            let mut tries = 0;
            while !create_queue(sh, &admin, &name, config.clone())
                .await
                .is_ok()
            {
                tries += 1;
                if tries > 200 {
                    anyhow::bail!("cannot create queue {name}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let mut tries = 0;
    loop {
        let made = async {
            admin.create_exchange(EXCHANGE).await?;
            for q in [STD, TTL] {
                admin
                    .bind(EXCHANGE, q, vec![(DEST.to_string(), q.to_string())])
                    .await?;
            }
            Ok::<_, ClientError>(())
        }
        .await;
        match made {
            Ok(()) => return Ok(()),
            Err(s) => {
                tries += 1;
                if tries > 200 {
                    anyhow::bail!("cannot set up exchange {EXCHANGE}: {s}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn pick_size(rng: &mut fastrand::Rng) -> usize {
    match rng.u32(0..100) {
        0..60 => 64,
        60..90 => 1024,
        90..99 => 16 << 10,
        _ => 200 << 10,
    }
}

/// One publish request of a producer: 1-4 messages into one queue, or
/// through the exchange (`queue` `None`), each message naming its queue.
struct Batch {
    queue: Option<&'static str>,
    msgs: Vec<(&'static str, PubMsg)>,
    req: pb::PublishRequest,
}

/// Draws a producer's next batch (ids `p<p>-<seq>`).
fn next_batch(sh: &Shared, p: usize, rng: &mut fastrand::Rng, seq: &mut u64) -> Batch {
    // `None`: through the exchange, each message to `std` or `ttl`.
    let queue = match rng.u32(0..100) {
        0..38 => Some(STD),
        38..73 => Some(FIFO),
        73..88 => Some(TTL),
        _ => None,
    };
    let n = rng.usize(1..=4);
    let mut msgs = Vec::with_capacity(n);
    let mut req = Vec::with_capacity(n);
    for _ in 0..n {
        *seq += 1;
        let id = format!("p{p}-{seq}");
        let size = pick_size(rng);
        let dest = queue.unwrap_or(if rng.u32(0..100) < 60 { STD } else { TTL });
        let group = (dest == FIFO).then(|| format!("g{p}.{}", rng.u32(0..3)));
        let ttl_ms = (dest == TTL).then(|| rng.u64(1500..4000));
        let b = body(sh.seed, &id, size);
        req.push(pb::PublishMessage {
            message_id: id.clone(),
            body: b.clone().into(),
            ttl_ms,
            group_id: group.clone().unwrap_or_default(),
            properties: if queue.is_none() {
                [(DEST.to_string(), dest.to_string())].into()
            } else {
                Default::default()
            },
            ..Default::default()
        });
        msgs.push((
            dest,
            PubMsg {
                id,
                group,
                ttl_ms,
                size: b.len(),
            },
        ));
    }
    Batch {
        queue,
        msgs,
        req: pb::PublishRequest {
            queue: queue.unwrap_or_default().into(),
            messages: req,
            exchange: if queue.is_none() {
                EXCHANGE.into()
            } else {
                String::new()
            },
        },
    }
}

/// Records how a batch's publish ended: one record per queue it fills
/// (through the exchange they share the call's id, the call being all or
/// nothing), with the messages an answered call through the exchange did
/// not store in exactly their queue (`results`: the answer's).
fn record_batch(
    sh: &Shared,
    b: Batch,
    inv: Stamp,
    outcome: Outcome,
    results: Option<&[pb::PublishResult]>,
    process: &str,
) {
    let done = sh.hist.now();
    let misrouted: Vec<String> = match (results, b.queue) {
        (Some(results), None) => b
            .msgs
            .iter()
            .enumerate()
            .filter_map(|(i, (dest, m))| {
                let r = results.get(i);
                r.is_none_or(|r| r.duplicate || r.routed_to != [dest.to_string()])
                    .then(|| {
                        format!(
                            "{} through {EXCHANGE} for {dest}: routed to {:?}",
                            m.id,
                            r.map(|r| r.routed_to.clone())
                        )
                    })
            })
            .collect(),
        _ => Vec::new(),
    };
    let call = b.queue.is_none().then(|| sh.hist.call_id());
    let mut misrouted = Some(misrouted);
    for q in [STD, FIFO, TTL] {
        let mine: Vec<PubMsg> = b
            .msgs
            .iter()
            .filter(|(dest, _)| *dest == q)
            .map(|(_, m)| m.clone())
            .collect();
        if mine.is_empty() {
            continue;
        }
        sh.hist.publish(Publish {
            queue: q.into(),
            msgs: mine,
            inv,
            done,
            outcome: outcome.clone(),
            process: process.to_string(),
            exchange: call.map(|c| (EXCHANGE.to_string(), c)),
            misrouted: misrouted.take().unwrap_or_default(),
        });
    }
}

/// Whether a soak's backlog is above its cap (producers wait).
fn backlog_full(sh: &Shared) -> bool {
    sh.backlog_cap > 0 && sh.backlog.load(Ordering::Relaxed) > sh.backlog_cap
}

/// Waits while a soak's backlog is above its cap; false once producers
/// are to stop.
async fn may_publish(sh: &Shared) -> bool {
    while backlog_full(sh) {
        if sh.quiet.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    !sh.quiet.load(Ordering::Relaxed)
}

/// A producer: publishes batches of 1-4 messages with ids `p<n>-<seq>`
/// until told to stop, one unary `Publish` at a time. Each FIFO group
/// belongs to one producer, so a group's publish order is the producer's
/// order.
pub async fn producer(sh: Arc<Shared>, p: usize) -> anyhow::Result<()> {
    let Some(client) = connect(&sh).await else {
        return Ok(());
    };
    let mut rng = fastrand::Rng::with_seed(sh.seed ^ (0x5eed_0000 + p as u64));
    let mut seq = 0u64;
    let process = format!("producer {p}");
    while may_publish(&sh).await {
        let b = next_batch(&sh, p, &mut rng, &mut seq);
        let inv = sh.hist.now();
        let msgs = b.req.messages.clone();
        let r = match b.queue {
            Some(q) => client.publish(q, msgs).await,
            None => client.publish_to_exchange(EXCHANGE, msgs).await,
        };
        let outcome = call_outcome(&r);
        let failed = refused(&outcome);
        let results = r.as_ref().ok().map(Vec::as_slice);
        record_batch(&sh, b, inv, outcome, results, &process);
        let pause = if failed { 50 } else { rng.u64(0..15) };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    Ok(())
}

/// Requests a stream producer keeps unanswered at most.
const STREAM_WINDOW: usize = 4;

/// A producer over `PublishStream`: the same batches (ids `p<n>-<seq>`),
/// up to [`STREAM_WINDOW`] requests in flight on one stream, each
/// answered in order once durable. A request answered with an error code
/// was refused (nothing stored); when the stream breaks, the requests not
/// yet answered may or may not have been stored. Then a new stream.
pub async fn stream_producer(sh: Arc<Shared>, p: usize) -> anyhow::Result<()> {
    let mut node = 0;
    let mut rng = fastrand::Rng::with_seed(sh.seed ^ (0x5eed_0000 + p as u64));
    let mut seq = 0u64;
    let mut sequence = 0u64;
    let process = format!("stream producer {p}");
    'streams: while may_publish(&sh).await {
        let mut client = msg_client(&stream_channel(&sh, node)?);
        let (tx, rx) = mpsc::channel::<pb::PublishStreamRequest>(STREAM_WINDOW);
        let mut inbound = match client
            .publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(_) => {
                node += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Sent and not yet answered, in order.
        let mut pending: std::collections::VecDeque<(u64, Batch, Stamp)> = Default::default();
        loop {
            let quiet = sh.quiet.load(Ordering::Relaxed);
            let room = pending.len() < STREAM_WINDOW && !quiet && !backlog_full(&sh);
            tokio::select! {
                biased;
                answer = inbound.message() => {
                    match answer {
                        Ok(Some(a)) => {
                            let Some((sent, b, inv)) = pending.pop_front() else {
                                anyhow::bail!("{process}: an answer to nothing sent ({})", a.sequence);
                            };
                            if a.sequence != sent {
                                anyhow::bail!("{process}: answer {} where {sent} was due", a.sequence);
                            }
                            let outcome = if a.code == 0 {
                                Outcome::Ok
                            } else {
                                Outcome::Fail {
                                    code: format!("{:?}", tonic::Code::from(a.code)),
                                    msg: a.error.clone(),
                                }
                            };
                            let results = (a.code == 0).then_some(a.results.as_slice());
                            record_batch(&sh, b, inv, outcome, results, &process);
                        }
                        other => {
                            // The stream ended or broke: what was not
                            // answered may or may not be stored, unless
                            // the connection was never made.
                            let outcome = match other {
                                Err(s) => match Outcome::from_status(&s) {
                                    fail @ Outcome::Fail { .. } if s.code() == tonic::Code::Unavailable => fail,
                                    _ => Outcome::Info {
                                        code: format!("{:?}", s.code()),
                                        msg: status_text(&s),
                                    },
                                },
                                _ => Outcome::Info {
                                    code: "Ok".to_string(),
                                    msg: "the stream ended before its answers".to_string(),
                                },
                            };
                            for (_, b, inv) in pending.drain(..) {
                                record_batch(&sh, b, inv, outcome.clone(), None, &process);
                            }
                            node += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue 'streams;
                        }
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(rng.u64(0..30))), if room => {
                    let b = next_batch(&sh, p, &mut rng, &mut seq);
                    sequence += 1;
                    let inv = sh.hist.now();
                    let req = pb::PublishStreamRequest {
                        sequence,
                        publish: Some(b.req.clone()),
                    };
                    pending.push_back((sequence, b, inv));
                    if tx.send(req).await.is_err() {
                        // The stream is gone; its end is read above.
                        continue;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(100)), if !room && pending.is_empty() => {
                    if quiet {
                        break 'streams;
                    }
                }
            }
        }
    }
    Ok(())
}

fn dead_letters(d: &pb::Delivery) -> Vec<DeadLetter> {
    d.dead_letters
        .iter()
        .map(|r| DeadLetter {
            source: r.source_queue.clone(),
            reason: r.reason,
            count: r.delivery_count,
            failed: r.failed_attempts,
            at: r.at_unix_ms,
        })
        .collect()
}

fn record_delivery(
    sh: &Shared,
    d: &pb::Delivery,
    call: u64,
    queue: &str,
    inv: Stamp,
    stream: bool,
    process: &str,
) -> usize {
    sh.hist.delivery(Delivery {
        idx: 0,
        call,
        queue: queue.to_string(),
        id: d.message_id.clone(),
        count: d.delivery_count,
        failed: d.failed_attempts,
        token: d.ack_token.clone(),
        deadline: d.lease_deadline_unix_ms,
        group: d.group_id.clone(),
        dead_letters: dead_letters(d),
        body_error: check_body(sh.seed, &d.message_id, &d.body),
        inv,
        done: sh.hist.now(),
        stream,
        process: process.to_string(),
    })
}

/// What to do with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Ack,
    Nack,
    Hold,
    Drop,
    DoubleAck,
    Extend,
}

/// What a consumer does with a delivery of `id` that failed `failed`
/// times before (a release is no failure).
fn action(sh: &Shared, queue: &str, id: &str, failed: u32) -> Action {
    if queue.ends_with(".dlq") {
        return Action::Ack;
    }
    let f = fate(sh.seed, id);
    if sh.phase() != RUNNING {
        return if f == Fate::Poison {
            Action::Nack
        } else {
            Action::Ack
        };
    }
    match f {
        Fate::Ack => Action::Ack,
        Fate::Flaky if failed == 0 => Action::Nack,
        Fate::Slow if failed == 0 => Action::Hold,
        Fate::Poison => Action::Nack,
        Fate::Vanish if failed == 0 => Action::Drop,
        Fate::DoubleAck => Action::DoubleAck,
        Fate::Extend => Action::Extend,
        _ => Action::Ack,
    }
}

fn settle_result(r: &pb::SettleResult) -> SettleResult {
    if r.status == pb::SettleStatus::Ok as i32 {
        SettleResult::Ok {
            deadline: r.lease_deadline_unix_ms,
        }
    } else if r.status == pb::SettleStatus::Released as i32 {
        SettleResult::Released {
            msg: format!("code {}: {}", r.code, r.error),
        }
    } else {
        SettleResult::LeaseExpired
    }
}

/// Token → delivery index of the deliveries a consumer holds from one
/// receive call or stream, to map the releases a nack's answer lists.
type Mates = HashMap<String, usize>;

/// Records the deliveries that a nack's answer (invoked at `inv`) says it
/// released with the nacked message (FIFO, SPEC §3), as far as they are
/// among `mates`.
fn record_released(sh: &Shared, released: &[pb::ReleasedDelivery], mates: &Mates, inv: Stamp) {
    let done = sh.hist.now();
    for r in released {
        if let Some(&idx) = mates.get(&r.ack_token) {
            sh.hist.settle(Settle {
                delivery: idx,
                kind: SettleKind::ReleasedWith,
                inv,
                done,
                result: SettleResult::Released {
                    msg: format!("released by the nack of {}", r.released_by),
                },
                timeout_ms: 0,
            });
        }
    }
}

/// The result of a settle call that answered with no result for a token.
fn no_result() -> SettleResult {
    SettleResult::Call(Outcome::Info {
        code: "Ok".into(),
        msg: "no result".into(),
    })
}

/// Records a unary settle call of one token (delivery `idx`), invoked at
/// `inv`, that returned `r` (its settle results); `timeout_ms` of an
/// extend, else 0.
fn record_settle(
    sh: &Shared,
    idx: usize,
    kind: SettleKind,
    inv: Stamp,
    r: Result<Vec<pb::SettleResult>, Outcome>,
    timeout_ms: u64,
) {
    let result = match r {
        Ok(results) => match results.first() {
            Some(r) => settle_result(r),
            None => no_result(),
        },
        Err(o) => SettleResult::Call(o),
    };
    sh.hist.settle(Settle {
        delivery: idx,
        kind,
        inv,
        done: sh.hist.now(),
        result,
        timeout_ms,
    });
}

async fn ack(sh: &Shared, client: &Client, idx: usize, token: &str) {
    let inv = sh.hist.now();
    let r = client
        .ack(vec![token.to_string()])
        .await
        .map_err(|e| client_outcome(&e));
    record_settle(sh, idx, SettleKind::Ack, inv, r, 0);
}

/// Acks the deliveries `acks` (delivery index, token) in one call, each
/// recorded with its own result (the call's failure for all if it fails).
async fn ack_many(sh: &Shared, client: &Client, acks: &[(usize, String)]) {
    if acks.is_empty() {
        return;
    }
    let inv = sh.hist.now();
    let r = client
        .ack(acks.iter().map(|(_, t)| t.clone()).collect())
        .await
        .map_err(|e| client_outcome(&e));
    for (i, (idx, _)) in acks.iter().enumerate() {
        let one = match &r {
            Ok(results) => Ok(results.get(i).cloned().into_iter().collect()),
            Err(o) => Err(o.clone()),
        };
        record_settle(sh, *idx, SettleKind::Ack, inv, one, 0);
    }
}

async fn nack(sh: &Shared, client: &Client, idx: usize, token: &str, mates: &Mates) {
    let inv = sh.hist.now();
    let r = client
        .nack_releasing(vec![pb::NackItem {
            ack_token: token.to_string(),
            reason: "chaos".into(),
            ..Default::default()
        }])
        .await
        .map_err(|e| client_outcome(&e));
    let released = r
        .as_ref()
        .map(|(_, released)| released.clone())
        .unwrap_or_default();
    record_settle(
        sh,
        idx,
        SettleKind::Nack,
        inv,
        r.map(|(results, _)| results),
        0,
    );
    record_released(sh, &released, mates, inv);
}

async fn extend(sh: &Shared, client: &Client, idx: usize, token: &str, ms: u64) {
    let inv = sh.hist.now();
    let r = client
        .extend(vec![pb::ExtendItem {
            ack_token: token.to_string(),
            timeout_ms: ms,
        }])
        .await
        .map_err(|e| client_outcome(&e));
    record_settle(sh, idx, SettleKind::Extend, inv, r, ms);
}

/// Acks waiting to ride on a consumer's next `Receive`: (delivery index,
/// token).
type Riding = std::sync::Mutex<Vec<(usize, String)>>;

/// Puts a plain ack on the consumer's next `Receive`.
fn ride(sh: &Shared, riding: &Riding, idx: usize, token: &str) {
    sh.inflight.fetch_add(1, Ordering::SeqCst);
    riding
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((idx, token.to_string()));
}

/// Sleeps until 300 ms after the lease deadline `deadline`.
async fn past_deadline(sh: &Shared, deadline: u64) {
    let now = sh.hist.now().wall;
    let wait = deadline.saturating_sub(now) + 300;
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

/// Does what `act` says with one unary delivery, to the end (holds and
/// extensions included). `Drop` waits until the lease has run out, as a
/// consumer that lost the delivery and goes on with the next one of a
/// FIFO group only then; `mates` are the deliveries of the same receive.
async fn settle_one(
    sh: &Shared,
    client: &Client,
    act: Action,
    idx: usize,
    d: &pb::Delivery,
    mates: &Mates,
) {
    let token = d.ack_token.as_str();
    match act {
        Action::Ack => ack(sh, client, idx, token).await,
        Action::Nack => nack(sh, client, idx, token, mates).await,
        Action::DoubleAck => {
            ack(sh, client, idx, token).await;
            ack(sh, client, idx, token).await;
        }
        Action::Hold => {
            past_deadline(sh, d.lease_deadline_unix_ms).await;
            ack(sh, client, idx, token).await;
        }
        Action::Extend => {
            extend(sh, client, idx, token, 2500).await;
            tokio::time::sleep(Duration::from_millis(ACK_TIMEOUT_MS + 200)).await;
            ack(sh, client, idx, token).await;
        }
        Action::Drop => past_deadline(sh, d.lease_deadline_unix_ms).await,
    }
}

/// Handles one unary delivery of a standard queue by its fate; each runs
/// in its own task. Every other plain ack rides on the consumer's next
/// `Receive`.
fn handle(
    sh: &Arc<Shared>,
    client: &Client,
    idx: usize,
    d: pb::Delivery,
    queue: &str,
    riding: &Riding,
) {
    let act = action(sh, queue, &d.message_id, d.failed_attempts);
    if act == Action::Drop {
        return;
    }
    if act == Action::Ack && idx.is_multiple_of(2) {
        ride(sh, riding, idx, &d.ack_token);
        return;
    }
    let sh = Arc::clone(sh);
    let client = client.clone();
    sh.inflight.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        settle_one(&sh, &client, act, idx, &d, &Mates::new()).await;
        sh.inflight.fetch_sub(1, Ordering::SeqCst);
    });
}

/// Handles the deliveries of one receive from a FIFO queue as a naive
/// consumer that keeps each group's order does: the messages of one
/// group one after the other, each to the end of its fate (hold, extend,
/// a nack, a drop that waits for the lease to run out) before the next,
/// which it then settles whatever happened to the one before (so a nack
/// or a lease run out is followed by the acks of the later messages of
/// the group leased with it: SPEC §3 releases those, and their acks must
/// be refused). Groups run in parallel, each in a task. Only the last
/// message of a group in the batch may ride on the next `Receive`: an ack
/// that rides goes after the direct acks of the messages behind it.
fn handle_fifo(
    sh: &Arc<Shared>,
    client: &Client,
    batch: Vec<(usize, pb::Delivery)>,
    queue: &str,
    riding: &Arc<Riding>,
) {
    let mates: Arc<Mates> = Arc::new(
        batch
            .iter()
            .map(|(idx, d)| (d.ack_token.clone(), *idx))
            .collect(),
    );
    let mut groups: Vec<Vec<(usize, pb::Delivery)>> = Vec::new();
    for (idx, d) in batch {
        match groups.iter_mut().find(|g| g[0].1.group_id == d.group_id) {
            Some(g) => g.push((idx, d)),
            None => groups.push(vec![(idx, d)]),
        }
    }
    for group in groups {
        let sh = Arc::clone(sh);
        let client = client.clone();
        let riding = Arc::clone(riding);
        let mates = Arc::clone(&mates);
        let queue = queue.to_string();
        sh.inflight.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let last = group.len() - 1;
            for (n, (idx, d)) in group.iter().enumerate() {
                let act = action(&sh, &queue, &d.message_id, d.failed_attempts);
                // Riding only while running: the final drain must not
                // leave an ack behind on a consumer that stops.
                if act == Action::Ack && n == last && idx.is_multiple_of(2) && sh.phase() == RUNNING
                {
                    ride(&sh, &riding, *idx, &d.ack_token);
                    continue;
                }
                settle_one(&sh, &client, act, *idx, d, &mates).await;
            }
            sh.inflight.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Handles the deliveries of one receive of the final drain: per FIFO
/// group (all of a standard queue's as one), in order, the acks in one
/// call, flushed before each nack (poison), which may release the group's
/// later deliveries (whose acks are then refused and the messages come
/// again). One task per group.
fn handle_drain(sh: &Arc<Shared>, client: &Client, batch: Vec<(usize, pb::Delivery)>, queue: &str) {
    let mates: Arc<Mates> = Arc::new(
        batch
            .iter()
            .map(|(idx, d)| (d.ack_token.clone(), *idx))
            .collect(),
    );
    let fifo = fifo_kind(queue);
    let mut groups: Vec<Vec<(usize, pb::Delivery)>> = Vec::new();
    for (idx, d) in batch {
        match groups
            .iter_mut()
            .find(|g| !fifo || g[0].1.group_id == d.group_id)
        {
            Some(g) => g.push((idx, d)),
            None => groups.push(vec![(idx, d)]),
        }
    }
    for group in groups {
        let sh = Arc::clone(sh);
        let client = client.clone();
        let mates = Arc::clone(&mates);
        let queue = queue.to_string();
        sh.inflight.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let mut acks: Vec<(usize, String)> = Vec::new();
            for (idx, d) in &group {
                match action(&sh, &queue, &d.message_id, d.failed_attempts) {
                    Action::Nack => {
                        ack_many(&sh, &client, &std::mem::take(&mut acks)).await;
                        nack(&sh, &client, *idx, &d.ack_token, &mates).await;
                    }
                    _ => acks.push((*idx, d.ack_token.clone())),
                }
            }
            ack_many(&sh, &client, &acks).await;
            sh.inflight.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// A consumer of unary receives over every queue.
pub async fn consumer(sh: Arc<Shared>, c: usize) -> anyhow::Result<()> {
    let Some(client) = connect(&sh).await else {
        return Ok(());
    };
    let mut rng = fastrand::Rng::with_seed(sh.seed ^ (0xc0_0000 + c as u64));
    let queues: Vec<String> = SOURCES
        .iter()
        .flat_map(|q| [q.to_string(), q.to_string(), dlq_of(q)])
        .collect();
    let name = format!("consumer {c}");
    let riding = Arc::new(Riding::default());
    while sh.phase() != STOP {
        if sh.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let queue = queues[rng.usize(0..queues.len())].clone();
        // The final drain takes big batches and hardly waits on empty
        // queues: a backlog of thousands must drain in well under its 90 s.
        let draining = sh.phase() == FINAL;
        let max_messages = rng.u32(1..=8);
        let acks: Vec<(usize, String)> =
            std::mem::take(&mut *riding.lock().unwrap_or_else(|e| e.into_inner()));
        let call = sh.hist.call_id();
        let inv = sh.hist.now();
        let r = client
            .receive_response(pb::ReceiveRequest {
                queue: queue.clone(),
                max_messages: if draining { DRAIN_BATCH } else { max_messages },
                wait_ms: if draining { 20 } else { 200 },
                ack_tokens: acks.iter().map(|(_, t)| t.clone()).collect(),
                // The drain acks a batch in one call (a FIFO group's up to
                // its first nack) under a lease of its own: a slow store
                // (a PostgreSQL commit per call on a loaded machine) must
                // not make the acks come after the queue's 1 s lease, and
                // the messages go round until the drain gives up.
                ack_timeout_ms: draining.then_some(DRAIN_LEASE_MS),
                max_per_group: if draining { DRAIN_PER_GROUP } else { 0 },
                ..Default::default()
            })
            .await
            .map_err(|e| client_outcome(&e));
        // The riding acks: one outcome each, or the call's failure.
        for (i, (idx, _)) in acks.iter().enumerate() {
            let one = match &r {
                Ok(resp) => Ok(resp.ack_results.get(i).cloned().into_iter().collect()),
                Err(o) => Err(o.clone()),
            };
            record_settle(&sh, *idx, SettleKind::Ack, inv, one, 0);
        }
        sh.inflight.fetch_sub(acks.len(), Ordering::SeqCst);
        // The acks took effect but the receive after them failed: its
        // own outcome, with no delivery.
        let r = match r {
            Ok(resp) if resp.receive_code != 0 => Err(Outcome::from_status(&tonic::Status::new(
                tonic::Code::from(resp.receive_code),
                resp.receive_error,
            ))),
            r => r,
        };
        match r {
            Ok(resp) => {
                sh.hist.receive_call(&Outcome::Ok);
                let batch: Vec<(usize, pb::Delivery)> = resp
                    .deliveries
                    .into_iter()
                    .map(|d| {
                        let idx = record_delivery(&sh, &d, call, &queue, inv, false, &name);
                        (idx, d)
                    })
                    .collect();
                if draining {
                    handle_drain(&sh, &client, batch, &queue);
                } else if fifo_kind(&queue) {
                    handle_fifo(&sh, &client, batch, &queue, &riding);
                } else {
                    for (idx, d) in batch {
                        handle(&sh, &client, idx, d, &queue, &riding);
                    }
                }
            }
            Err(o) => {
                sh.hist.receive_call(&o);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let left: Vec<(usize, String)> =
        std::mem::take(&mut *riding.lock().unwrap_or_else(|e| e.into_inner()));
    for (idx, token) in left {
        ack(&sh, &client, idx, &token).await;
        sh.inflight.fetch_sub(1, Ordering::SeqCst);
    }
    Ok(())
}

/// A consumer on Subscribe streams: sessions of 1-4 s with a credit of
/// 1-3; a `Vanish` message's first delivery makes it drop the stream.
pub async fn stream_consumer(sh: Arc<Shared>) -> anyhow::Result<()> {
    use letterbox::pb::subscribe_request::Kind as In;
    use letterbox::pb::subscribe_response::Kind as Out;
    let mut node = 0;
    let mut rng = fastrand::Rng::with_seed(sh.seed ^ 0x57ea);
    let name = "stream consumer".to_string();
    while sh.phase() != STOP {
        if sh.paused.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let queue = [STD, FIFO, TTL][rng.usize(0..3)].to_string();
        let (tx, rx) = mpsc::channel::<pb::SubscribeRequest>(64);
        let _ = tx
            .send(pb::SubscribeRequest {
                kind: Some(In::Open(pb::SubscribeOpen {
                    queue: queue.clone(),
                    credit: rng.u32(1..=3),
                    // The drain's lease (see `DRAIN_LEASE_MS`) in a session
                    // opened once the drain began.
                    ack_timeout_ms: (sh.phase() == FINAL).then_some(DRAIN_LEASE_MS),
                    max_per_group: 0,
                })),
            })
            .await;
        let inv = sh.hist.now();
        let mut client = msg_client(&stream_channel(&sh, node)?);
        let mut stream = match client
            .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(s) => s.into_inner(),
            Err(_) => {
                node += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let session_end = tokio::time::Instant::now() + Duration::from_millis(rng.u64(1000..4000));
        let mut session = Session::new();
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = tokio::time::sleep_until(session_end) => break,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(_) => {
                    node += 1;
                    break;
                }
            };
            match resp.kind {
                Some(Out::Deliveries(batch)) => {
                    let dropped = session
                        .deliveries(&sh, &batch, &queue, inv, &name, &tx)
                        .await;
                    if dropped {
                        break;
                    }
                }
                Some(Out::Settled(s)) => session.settled(&sh, &s),
                None => {}
            }
        }
        // Close the stream: every unsettled delivery goes back to the queue
        // (as far as the client knows, at any moment from now on), and
        // settles not yet answered may or may not have been done.
        drop(tx);
        drop(stream);
        session.closed(&sh);
    }
    Ok(())
}

/// One Subscribe stream's deliveries and settles, as its consumer knows
/// them.
struct Session {
    /// Token → delivery index, of the stream's deliveries not settled.
    unsettled: HashMap<String, usize>,
    /// Token → delivery index, of all the stream's deliveries.
    mates: Mates,
    /// Settle request id → (kind, deliveries, invoked), not answered yet.
    pending: HashMap<u64, (SettleKind, Vec<usize>, Stamp)>,
    next_req: u64,
}

impl Session {
    fn new() -> Session {
        Session {
            unsettled: HashMap::new(),
            mates: Mates::new(),
            pending: HashMap::new(),
            next_req: 1,
        }
    }

    /// Records a batch of deliveries and settles each on the stream (an
    /// ack, or a nack for a message to fail); true when a `Vanish`
    /// message's first delivery means the stream is to be dropped.
    async fn deliveries(
        &mut self,
        sh: &Shared,
        batch: &pb::DeliveryBatch,
        queue: &str,
        inv: Stamp,
        name: &str,
        tx: &mpsc::Sender<pb::SubscribeRequest>,
    ) -> bool {
        use letterbox::pb::subscribe_request::Kind as In;
        let call = sh.hist.call_id();
        let mut got = Vec::with_capacity(batch.deliveries.len());
        for d in &batch.deliveries {
            let idx = record_delivery(sh, d, call, queue, inv, true, name);
            self.unsettled.insert(d.ack_token.clone(), idx);
            self.mates.insert(d.ack_token.clone(), idx);
            got.push((idx, d));
        }
        for (idx, d) in got {
            let kind = match action(sh, queue, &d.message_id, d.failed_attempts) {
                Action::Drop => return true,
                Action::Nack => SettleKind::Nack,
                _ => SettleKind::Ack,
            };
            let id = self.next_req;
            self.next_req += 1;
            let req = match kind {
                SettleKind::Nack => In::Nack(pb::StreamNack {
                    request_id: id,
                    items: vec![pb::NackItem {
                        ack_token: d.ack_token.clone(),
                        reason: "chaos".into(),
                        ..Default::default()
                    }],
                }),
                _ => In::Ack(pb::StreamAck {
                    request_id: id,
                    ack_tokens: vec![d.ack_token.clone()],
                }),
            };
            self.pending.insert(id, (kind, vec![idx], sh.hist.now()));
            self.unsettled.remove(&d.ack_token);
            if tx
                .send(pb::SubscribeRequest { kind: Some(req) })
                .await
                .is_err()
            {
                break;
            }
        }
        false
    }

    /// Records the answer to a settle request, and the deliveries of a
    /// nacked message's group released with it.
    fn settled(&mut self, sh: &Shared, s: &pb::StreamSettled) {
        let Some((kind, idxs, inv)) = self.pending.remove(&s.request_id) else {
            return;
        };
        let done = sh.hist.now();
        for (i, idx) in idxs.into_iter().enumerate() {
            let result = if s.code != 0 {
                // Classified as a unary call's status is: only the codes
                // that say nothing was done are a failure.
                SettleResult::Call(Outcome::from_status(&tonic::Status::new(
                    tonic::Code::from(s.code),
                    s.error.clone(),
                )))
            } else {
                match s.results.get(i) {
                    Some(r) => settle_result(r),
                    None => no_result(),
                }
            };
            sh.hist.settle(Settle {
                delivery: idx,
                kind,
                inv,
                done,
                result,
                timeout_ms: 0,
            });
        }
        // Later deliveries of a nacked message's group, released with it:
        // no longer this stream's.
        record_released(sh, &s.released, &self.mates, inv);
        for r in &s.released {
            self.unsettled.remove(&r.ack_token);
        }
    }

    /// The stream is closed: its unsettled deliveries are released, and
    /// its settles not answered may or may not have been done.
    fn closed(self, sh: &Shared) {
        let now = sh.hist.now();
        for (_, idx) in self.unsettled {
            sh.hist.settle(Settle {
                delivery: idx,
                kind: SettleKind::Release,
                inv: now,
                done: now,
                result: SettleResult::Ok { deadline: 0 },
                timeout_ms: 0,
            });
        }
        for (_, (kind, idxs, inv)) in self.pending {
            for idx in idxs {
                sh.hist.settle(Settle {
                    delivery: idx,
                    kind,
                    inv,
                    done: now,
                    result: SettleResult::Call(Outcome::Info {
                        code: "Cancelled".into(),
                        msg: "stream closed before the answer".into(),
                    }),
                    timeout_ms: 0,
                });
            }
        }
    }
}

/// Queues the admin worker plays with.
pub const META_QUEUES: usize = 4;

/// The admin worker: creates, updates, deletes and reads `meta-<n>`
/// queues, and reads the workload's own queues, so that the checker can
/// tell whether configurations survive every restart.
pub async fn admin_worker(sh: Arc<Shared>) -> anyhow::Result<()> {
    let Some(admin) = connect(&sh).await else {
        return Ok(());
    };
    let mut rng = fastrand::Rng::with_seed(sh.seed ^ 0xad_0000);
    while !sh.quiet.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.u64(100..400))).await;
        let n = rng.usize(0..META_QUEUES + 2);
        if n >= META_QUEUES {
            // Read one of the workload's queues.
            let q = SOURCES[rng.usize(0..SOURCES.len())];
            let name = if rng.bool() { q.to_string() } else { dlq_of(q) };
            get_queue(&sh, &admin, &name).await;
            continue;
        }
        let name = format!("meta-{n}");
        match rng.u32(0..10) {
            0..3 => {
                let config = pb::QueueConfig {
                    kind: if rng.bool() {
                        pb::QueueKind::Fifo as i32
                    } else {
                        pb::QueueKind::Standard as i32
                    },
                    message_ttl_ms: Some(rng.u64(60..600) * 1000),
                    ack_timeout_ms: Some(rng.u64(1..60) * 1000),
                    max_length: rng.bool().then(|| rng.u64(1..100_000)),
                    ..Default::default()
                };
                let o = create_queue(&sh, &admin, &name, config).await;
                if o.is_info() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            3..5 => {
                let ack = rng.u64(1..60) * 1000;
                let inv = sh.hist.now();
                let r = admin
                    .update_queue(pb::UpdateQueueRequest {
                        name: name.clone(),
                        config: Some(pb::QueueConfig {
                            ack_timeout_ms: Some(ack),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await;
                let outcome = call_outcome(&r);
                sh.hist.admin(Admin {
                    op: "update",
                    queue: name,
                    config: Some(QueueShape {
                        kind: 0,
                        ttl_ms: 0,
                        ack_timeout_ms: ack,
                        max_length: 0,
                        dead_letter: None,
                        dead_letter_on_expiry: false,
                    }),
                    inv,
                    done: sh.hist.now(),
                    outcome,
                });
            }
            5..7 => {
                let inv = sh.hist.now();
                let r = admin.delete_queue(&name, false).await;
                let outcome = call_outcome(&r);
                sh.hist.admin(Admin {
                    op: "delete",
                    queue: name,
                    config: None,
                    inv,
                    done: sh.hist.now(),
                    outcome,
                });
            }
            _ => get_queue(&sh, &admin, &name).await,
        }
    }
    Ok(())
}

/// Reads a queue's configuration, recording it.
pub async fn get_queue(sh: &Shared, admin: &Client, name: &str) {
    let inv = sh.hist.now();
    let r = admin.get_queue(name).await;
    let (outcome, config) = match r {
        Ok(q) => (Outcome::Ok, q.config.map(|c| shape(&c))),
        Err(e) => (client_outcome(&e), None),
    };
    sh.hist.admin(Admin {
        op: "get",
        queue: name.into(),
        config,
        inv,
        done: sh.hist.now(),
        outcome,
    });
}

/// Reads the stats of every workload queue, recording them; `None` if a
/// call failed.
pub async fn read_stats(sh: &Shared, label: &'static str) -> Option<Vec<(String, u64)>> {
    let admin = Client::with_config(client_config(&sh.url)).await.ok()?;
    let mut totals = Vec::new();
    for q in SOURCES {
        for name in [q.to_string(), dlq_of(q)] {
            let s = admin.stats(&name).await.ok()?;
            totals.push((name.clone(), s.total));
            sh.hist.stats(super::history::StatsRead {
                label,
                queue: name,
                total: s.total,
                published: s.published,
                acked: s.acked,
                expired: s.expired,
                dead_lettered: s.dead_lettered,
                dead_letters_received: s.dead_letters_received,
                nacked: s.nacked,
            });
        }
    }
    Some(totals)
}

/// One receive on every workload queue after the final restart: anything
/// returned reappeared. Recorded as deliveries (and acked).
pub async fn sweep_once(sh: &Arc<Shared>) -> anyhow::Result<usize> {
    let client = Client::with_config(client_config(&sh.url)).await?;
    let mut n = 0;
    for q in SOURCES {
        for name in [q.to_string(), dlq_of(q)] {
            let call = sh.hist.call_id();
            let inv = sh.hist.now();
            let deliveries = client
                .receive_with(pb::ReceiveRequest {
                    queue: name.clone(),
                    max_messages: 100,
                    wait_ms: 300,
                    ..Default::default()
                })
                .await?;
            for d in deliveries {
                let idx = record_delivery(sh, &d, call, &name, inv, false, "final sweep");
                ack(sh, &client, idx, &d.ack_token).await;
                n += 1;
            }
        }
    }
    Ok(n)
}
