//! The engine's own types: queue configurations, messages, deliveries,
//! dead-letter records, figures. No protobuf or storage type appears
//! here; the front ends and the engine's persistence code (`persist.rs`)
//! translate them.
//!
//! Durations and instants are milliseconds (instants since the Unix epoch).

use bytes::Bytes;

use super::error::QueueError;

/// Milliseconds in a second, a minute, an hour, a day.
pub const SECOND: u64 = 1_000;
/// Milliseconds in a minute.
pub const MINUTE: u64 = 60 * SECOND;
/// Milliseconds in an hour.
pub const HOUR: u64 = 60 * MINUTE;
/// Milliseconds in a day.
pub const DAY: u64 = 24 * HOUR;

/// STANDARD or FIFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueKind {
    /// At-least-once, best-effort order.
    #[default]
    Standard,
    /// Strict order per message group.
    Fifo,
}

impl QueueKind {
    /// True for FIFO queues.
    pub fn is_fifo(self) -> bool {
        self == QueueKind::Fifo
    }

    /// The kind's number in a stored queue record
    /// (`storage::records::QueueRecord::kind`): 1 standard, 2 FIFO. The
    /// one definition of that encoding, for the engine and `verify`.
    pub const fn code(self) -> u8 {
        match self {
            QueueKind::Standard => 1,
            QueueKind::Fifo => 2,
        }
    }

    /// The kind a stored record's number means; `None` for a number no
    /// kind has, which a start and `verify` refuse as damage (a queue read
    /// as the wrong kind would break FIFO order without a word).
    pub const fn from_code(code: u8) -> Option<QueueKind> {
        match code {
            1 => Some(QueueKind::Standard),
            2 => Some(QueueKind::Fifo),
            _ => None,
        }
    }
}

impl QueueKind {
    /// Its name in the definitions document and the REST and text
    /// interfaces: `STANDARD` or `FIFO`.
    pub const fn name(self) -> &'static str {
        match self {
            QueueKind::Standard => "STANDARD",
            QueueKind::Fifo => "FIFO",
        }
    }

    /// The kind of that [`QueueKind::name`].
    pub fn from_name(name: &str) -> Option<QueueKind> {
        [QueueKind::Standard, QueueKind::Fifo]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

impl std::fmt::Display for QueueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a FIFO queue does when a group's head exhausts its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoisonPolicy {
    /// Dead-letter the head and go on with the group.
    #[default]
    DeadLetterAndContinue,
    /// Hold the group until an operator acts.
    ParkGroup,
}

impl PoisonPolicy {
    /// Its name in the definitions document: `DEAD_LETTER_AND_CONTINUE`
    /// or `PARK_GROUP`.
    pub const fn name(self) -> &'static str {
        match self {
            PoisonPolicy::DeadLetterAndContinue => "DEAD_LETTER_AND_CONTINUE",
            PoisonPolicy::ParkGroup => "PARK_GROUP",
        }
    }

    /// The policy of that [`PoisonPolicy::name`].
    pub fn from_name(name: &str) -> Option<PoisonPolicy> {
        [PoisonPolicy::DeadLetterAndContinue, PoisonPolicy::ParkGroup]
            .into_iter()
            .find(|p| p.name() == name)
    }

    /// Its number in a stored queue record: the one definition of that
    /// encoding.
    pub const fn code(self) -> u8 {
        match self {
            PoisonPolicy::DeadLetterAndContinue => 1,
            PoisonPolicy::ParkGroup => 2,
        }
    }

    /// The policy a stored record's number means; `None` for a number no
    /// policy has (damage).
    pub const fn from_code(code: u8) -> Option<PoisonPolicy> {
        match code {
            1 => Some(PoisonPolicy::DeadLetterAndContinue),
            2 => Some(PoisonPolicy::ParkGroup),
            _ => None,
        }
    }
}

/// Where messages go after too many failed deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPolicy {
    /// The dead letter queue's name.
    pub queue: String,
    /// Failed attempts before the move (a FIFO release is not one).
    pub max_deliveries: u32,
}

/// A dead letter policy as a request gives it: the limit may be left to
/// the engine's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterInput {
    /// The dead letter queue's name.
    pub queue: String,
    /// Failed attempts before the move; `None` (or 0, which the wire
    /// formats send for "not given") takes the default.
    pub max_deliveries: Option<u32>,
}

impl DeadLetterInput {
    /// A policy with the limit given (0: the default).
    pub fn new(queue: impl Into<String>, max_deliveries: u32) -> DeadLetterInput {
        DeadLetterInput {
            queue: queue.into(),
            max_deliveries: Some(max_deliveries),
        }
    }
}

/// Exponential delay before a failed message is visible again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBackoff {
    /// Delay after the first failed delivery.
    pub initial: u64,
    /// Largest delay.
    pub max: u64,
    /// Growth factor per further failed delivery.
    pub multiplier: f64,
}

impl RetryBackoff {
    /// The delay after the `failed_attempts`-th failed attempt (1-based).
    pub fn delay(&self, failed_attempts: u32) -> u64 {
        let exp = i32::try_from(failed_attempts.saturating_sub(1).min(64)).unwrap_or(64);
        let d = self.initial as f64 * self.multiplier.powi(exp);
        if d.is_finite() && d < self.max as f64 {
            // The value is below `max`, a u64: the conversion is exact
            // enough and cannot overflow.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let d = d as u64;
            d
        } else {
            self.max
        }
    }
}

/// A queue's configuration with every value in force.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// STANDARD or FIFO.
    pub kind: QueueKind,
    /// Message time to live.
    pub message_ttl: u64,
    /// Default lease length.
    pub ack_timeout: u64,
    /// Delay before a new message is visible.
    pub delivery_delay: u64,
    /// Dead letter queue, if any.
    pub dead_letter: Option<DeadLetterPolicy>,
    /// Retry backoff, if any.
    pub retry_backoff: Option<RetryBackoff>,
    /// Dead-letter expired messages instead of dropping them.
    pub dead_letter_on_expiry: bool,
    /// Length limit, if any.
    pub max_length: Option<u64>,
    /// Ceiling of one lease, extensions included.
    pub max_lease_total: u64,
    /// FIFO dedup window.
    pub dedup_window: u64,
    /// FIFO poison policy.
    pub on_poison: PoisonPolicy,
    /// FIFO content-based dedup.
    pub content_based_dedup: bool,
}

impl Default for QueueConfig {
    /// A standard queue's defaults
    /// ([`default_config`](super::validate::default_config)).
    fn default() -> Self {
        super::validate::default_config(QueueKind::Standard)
    }
}

impl QueueConfig {
    /// The request that asks for exactly this configuration: every value
    /// set, nothing removed (the FIFO-only values only for a FIFO queue,
    /// as a standard queue refuses them).
    pub fn to_input(&self) -> QueueConfigInput {
        let QueueConfig {
            kind,
            message_ttl,
            ack_timeout,
            delivery_delay,
            dead_letter,
            retry_backoff,
            dead_letter_on_expiry,
            max_length,
            max_lease_total,
            dedup_window,
            on_poison,
            content_based_dedup,
        } = self;
        QueueConfigInput {
            kind: Some(*kind),
            message_ttl: Some(*message_ttl),
            ack_timeout: Some(*ack_timeout),
            delivery_delay: Some(*delivery_delay),
            dead_letter: dead_letter
                .as_ref()
                .map(|d| DeadLetterInput::new(d.queue.clone(), d.max_deliveries)),
            retry_backoff: *retry_backoff,
            dead_letter_on_expiry: Some(*dead_letter_on_expiry),
            max_length: *max_length,
            max_lease_total: Some(*max_lease_total),
            dedup_window: kind.is_fifo().then_some(*dedup_window),
            on_poison: kind.is_fifo().then_some(*on_poison),
            content_based_dedup: kind.is_fifo().then_some(*content_based_dedup),
        }
    }
}

/// A configuration as requested: `None` means "the default" on create and
/// "unchanged" on update.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueConfigInput {
    /// STANDARD or FIFO.
    pub kind: Option<QueueKind>,
    /// Message time to live.
    pub message_ttl: Option<u64>,
    /// Default lease length.
    pub ack_timeout: Option<u64>,
    /// Delay before a new message is visible.
    pub delivery_delay: Option<u64>,
    /// Dead letter queue and its delivery limit.
    pub dead_letter: Option<DeadLetterInput>,
    /// Retry backoff.
    pub retry_backoff: Option<RetryBackoff>,
    /// Dead-letter expired messages.
    pub dead_letter_on_expiry: Option<bool>,
    /// Length limit.
    pub max_length: Option<u64>,
    /// Ceiling of one lease.
    pub max_lease_total: Option<u64>,
    /// FIFO dedup window.
    pub dedup_window: Option<u64>,
    /// FIFO poison policy.
    pub on_poison: Option<PoisonPolicy>,
    /// FIFO content-based dedup.
    pub content_based_dedup: Option<bool>,
}

/// What an update removes outright.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueRemovals {
    /// Remove the dead letter policy.
    pub dead_letter: bool,
    /// Remove the retry backoff.
    pub retry_backoff: bool,
    /// Remove the length limit.
    pub max_length: bool,
}

/// A queue as described to clients.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueInfo {
    /// Its name.
    pub name: String,
    /// Its configuration.
    pub config: QueueConfig,
    /// Queues whose dead letter queue it is.
    pub dead_letter_sources: Vec<String>,
    /// Creation time.
    pub created_at: u64,
}

/// A message to publish.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewMessage {
    /// Client-chosen id.
    pub message_id: Option<String>,
    /// Payload.
    pub body: Bytes,
    /// Properties, in any order.
    pub properties: Vec<(String, String)>,
    /// Own time to live.
    pub ttl: Option<u64>,
    /// Own delay.
    pub delay: Option<u64>,
    /// FIFO group.
    pub group_id: Option<String>,
    /// FIFO dedup id.
    pub dedup_id: Option<String>,
}

/// Where a publish goes: a queue, or an exchange that copies each message
/// into its bound queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// The queue of this name.
    Queue(String),
    /// The exchange of this name.
    Exchange(String),
}

impl Destination {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Destination::Queue(n) | Destination::Exchange(n) => n,
        }
    }

    /// The destination of a request with a queue and an exchange field,
    /// exactly one of them set (the other empty); `field` names the queue
    /// field in the error.
    pub fn of(queue: &str, exchange: &str, field: &str) -> Result<Destination, QueueError> {
        match (queue.is_empty(), exchange.is_empty()) {
            (false, true) => Ok(Destination::Queue(queue.to_string())),
            (true, false) => Ok(Destination::Exchange(exchange.to_string())),
            _ => Err(QueueError::invalid(
                field,
                format!("queue {queue:?}, exchange {exchange:?}"),
                "set exactly one of queue and exchange",
            )),
        }
    }
}

/// The outcome of one published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// Its id (the first one's, for a duplicate).
    pub message_id: String,
    /// True when it was not stored again.
    pub duplicate: bool,
    /// Through an exchange: the queues it was stored in.
    pub routed_to: Vec<String>,
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// Deliveries exhausted.
    MaxDeliveries,
    /// Rejected by a consumer.
    Rejected,
    /// Time to live ran out.
    Expired,
    /// Skipped by an operator.
    Skipped,
    /// Its stored body was found damaged (it failed its checksum) when it
    /// was about to be delivered; the note says what was wrong.
    Corrupted,
}

impl DeadLetterReason {
    /// Every reason, in the order of their codes.
    pub const ALL: [DeadLetterReason; 5] = [
        DeadLetterReason::MaxDeliveries,
        DeadLetterReason::Rejected,
        DeadLetterReason::Expired,
        DeadLetterReason::Skipped,
        DeadLetterReason::Corrupted,
    ];

    /// Its lower-case name, as the CLI and the console show it.
    pub fn name(self) -> &'static str {
        match self {
            DeadLetterReason::MaxDeliveries => "max_deliveries",
            DeadLetterReason::Rejected => "rejected",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::Skipped => "skipped",
            DeadLetterReason::Corrupted => "corrupted",
        }
    }
}

/// One move to a dead letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The queue the message left.
    pub source_queue: String,
    /// Why.
    pub reason: DeadLetterReason,
    /// Deliveries in the source queue at the move.
    pub delivery_count: u32,
    /// Failed attempts in the source queue at the move.
    pub failed_attempts: u32,
    /// Last nack reason.
    pub last_nack_reason: String,
    /// When.
    pub at: u64,
    /// Operator note.
    pub note: String,
}

/// How a delivery attempt ended without an ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Nacked.
    Nacked,
    /// Lease ran out.
    LeaseExpired,
    /// Rejected to the dead letter queue.
    Rejected,
    /// The subscribe stream closed.
    StreamClosed,
    /// FIFO: released, not failed: an earlier message of its group, leased
    /// with it, failed first (the reason names it). Counted as a delivery,
    /// not as a failed attempt.
    Released,
}

impl AttemptOutcome {
    /// Its lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            AttemptOutcome::Nacked => "nacked",
            AttemptOutcome::LeaseExpired => "lease_expired",
            AttemptOutcome::Rejected => "rejected",
            AttemptOutcome::StreamClosed => "stream_closed",
            AttemptOutcome::Released => "released",
        }
    }
}

/// One failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// When it ended.
    pub at: u64,
    /// How.
    pub outcome: AttemptOutcome,
    /// The nack reason.
    pub reason: String,
}

/// Receive options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveOptions {
    /// Most messages.
    pub max_messages: u32,
    /// Long-poll wait.
    pub wait: u64,
    /// Lease length override.
    pub ack_timeout: Option<u64>,
    /// Delete on delivery.
    pub auto_ack: bool,
    /// FIFO: most messages of one group in this receive (0: no cap).
    pub max_per_group: u32,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            max_messages: 10,
            wait: 0,
            ack_timeout: None,
            auto_ack: false,
            max_per_group: 0,
        }
    }
}

/// A message handed to a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The queue it came from.
    pub queue: String,
    /// Its id.
    pub message_id: String,
    /// Payload.
    pub body: Bytes,
    /// Properties, sorted by key.
    pub properties: Vec<(String, String)>,
    /// Token for ack/nack/extend; `None` for auto-ack.
    pub ack_token: Option<String>,
    /// Deliveries so far in this queue, this one included.
    pub delivery_count: u32,
    /// Failed attempts so far in this queue (since its parked group was
    /// last released, if it was).
    pub failed_attempts: u32,
    /// First publish time.
    pub published_at: u64,
    /// First delivery from this queue.
    pub first_delivered_at: u64,
    /// When it entered this queue (published, dead-lettered or redriven).
    pub enqueued_at: u64,
    /// When its time to live runs out.
    pub expires_at: u64,
    /// Lease deadline (0 for auto-ack).
    pub lease_deadline: u64,
    /// FIFO group.
    pub group_id: Option<String>,
    /// Earlier dead-letter moves.
    pub dead_letters: Vec<DeadLetter>,
    /// Recent failed attempts.
    pub attempts: Vec<Attempt>,
}

/// What a receive with acks riding on it did
/// ([`crate::queue::Broker::receive_acking`]).
#[derive(Debug)]
pub struct AckedReceive {
    /// One outcome per ack token, in order, durable. Empty without acks.
    pub acks: Vec<Settled>,
    /// The deliveries, or why the receive failed after the acks took
    /// effect.
    pub received: crate::queue::Result<Vec<Delivery>>,
}

/// The message a current lease is on (see [`crate::queue::Broker::lease_holder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedMessage {
    /// The queue the message is in.
    pub queue: String,
    /// Its id.
    pub message_id: String,
    /// The lease deadline.
    pub deadline: u64,
}

/// One delivery to reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    /// Its token.
    pub token: String,
    /// Visibility delay overriding the backoff.
    pub delay: Option<u64>,
    /// Reason, kept in the attempt history.
    pub reason: String,
    /// Dead-letter it now.
    pub dead_letter: bool,
}

/// The outcome of settling one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Done; for an extension, the new deadline.
    Ok {
        /// New lease deadline (extend only, else 0).
        deadline: u64,
    },
    /// The lease is not current; nothing changed.
    LeaseExpired(String),
    /// FIFO: the lease was ended because an earlier message of its group,
    /// leased with it, failed first (the text names it); nothing changed.
    Released(String),
}

/// What became of a message whose lease ended without an ack (a nack, or
/// a lease that ran out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEnd {
    /// Back in its queue, to be delivered again (at once, or after a
    /// delay or the queue's retry backoff).
    Requeued,
    /// Moved to a dead letter queue.
    DeadLettered {
        /// The dead letter queue.
        queue: String,
        /// Why.
        reason: DeadLetterReason,
        /// Its failed attempts in the queue it left, this one included.
        failed_attempts: u32,
    },
    /// Its time to live had run out: deleted.
    Expired,
    /// FIFO with `on_poison = PARK_GROUP`: it ran out of deliveries and
    /// holds its group until an operator acts.
    Parked,
}

/// A FIFO delivery released because an earlier message of its group failed
/// (SPEC §3): its token no longer settles anything and the message will be
/// delivered again after the one that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The released delivery's token.
    pub ack_token: String,
    /// The released message's id.
    pub message_id: String,
    /// The id of the earlier message whose failure released it.
    pub because_of: String,
}

/// Exact figures of a queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Deliverable now.
    pub ready: u64,
    /// Leased.
    pub in_flight: u64,
    /// Waiting for a delay.
    pub delayed: u64,
    /// In parked FIFO groups.
    pub parked: u64,
    /// All messages.
    pub total: u64,
    /// Age of the oldest message in the queue.
    pub oldest_age: u64,
    /// Its counters since it was created.
    pub counters: QueueCounters,
}

/// A queue's counters since it was created, as the engine keeps them and
/// answers them. Stored as a `CountersRecord` (one record per queue,
/// written with the change that moved them), mapped field by field in
/// `persist.rs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Messages published into the queue.
    pub published: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Failed attempts.
    pub nacked: u64,
    /// Messages expired.
    pub expired: u64,
    /// Messages moved out to the DLQ.
    pub dead_lettered: u64,
    /// Messages moved in from source queues.
    pub dead_letters_received: u64,
    /// Messages deleted by purges.
    pub purged: u64,
    /// Messages moved out by redrives.
    pub redriven: u64,
    /// Messages moved in by redrives.
    pub redrive_received: u64,
}

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Deliverable now.
    Ready,
    /// Waiting for its delay.
    Delayed,
    /// Leased.
    Leased,
    /// Behind an earlier message of its FIFO group.
    Blocked,
    /// Head of a parked group.
    Parked,
}

impl MessageState {
    /// Its lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            MessageState::Ready => "ready",
            MessageState::Delayed => "delayed",
            MessageState::Leased => "leased",
            MessageState::Blocked => "blocked",
            MessageState::Parked => "parked",
        }
    }
}

/// A message as seen by Browse.
#[derive(Debug, Clone, PartialEq)]
pub struct BrowsedMessage {
    /// Its position in the queue: browsing from `position - 1` starts
    /// with it.
    pub position: u64,
    /// Its id.
    pub message_id: String,
    /// Payload.
    pub body: Bytes,
    /// Properties.
    pub properties: Vec<(String, String)>,
    /// Where it stands.
    pub state: MessageState,
    /// Deliveries so far in this queue.
    pub delivery_count: u32,
    /// Failed attempts so far in this queue (since its parked group was
    /// last released, if it was).
    pub failed_attempts: u32,
    /// First publish time.
    pub published_at: u64,
    /// When it entered this queue.
    pub enqueued_at: u64,
    /// When it expires.
    pub expires_at: u64,
    /// When it becomes visible (delayed).
    pub visible_at: u64,
    /// Lease deadline (leased).
    pub lease_deadline: u64,
    /// FIFO group.
    pub group_id: Option<String>,
    /// Earlier dead-letter moves.
    pub dead_letters: Vec<DeadLetter>,
    /// Recent failed attempts.
    pub attempts: Vec<Attempt>,
    /// Empty, or why its stored body could not be read (damaged: it
    /// failed its checksum); the body and properties are then empty.
    pub damaged: String,
}

/// A page of browsed messages.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BrowsePage {
    /// The messages.
    pub messages: Vec<BrowsedMessage>,
    /// Token for the next page, if any.
    pub next: Option<String>,
}

/// The state of a FIFO group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// Head deliverable now.
    Ready,
    /// A message of it is leased.
    Leased,
    /// Its head is delayed.
    Delayed,
    /// Parked.
    Parked,
}

impl GroupState {
    /// Its lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Ready => "ready",
            GroupState::Leased => "leased",
            GroupState::Delayed => "delayed",
            GroupState::Parked => "parked",
        }
    }
}

/// A FIFO group as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    /// Group id; empty for the default group.
    pub group_id: String,
    /// Messages in the group.
    pub backlog: u64,
    /// Leased messages.
    pub in_flight: u64,
    /// Age of its oldest message.
    pub oldest_age: u64,
    /// State.
    pub state: GroupState,
    /// Why it is not ready.
    pub reason: String,
    /// Head message id.
    pub head_message_id: String,
    /// Head delivery count.
    pub head_delivery_count: u32,
    /// Head failed attempts (since the group was last released).
    pub head_failed_attempts: u32,
}
