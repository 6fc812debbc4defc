//! A message's state in its queue, as the engine owns it: its counts, its
//! lease, its visibility and its histories, changed only through the
//! transitions below, each named after what happens to the message and
//! each keeping its rules in one place:
//!
//! - a delivery is counted by one, and only by a lease or an auto-ack
//!   take of a message that is not leased ([`Message::lease`],
//!   [`Message::take`]); the count goes back down only when that lease is
//!   taken back before anything was handed out ([`Message::take_back`]):
//!   a FIFO release ([`Message::release`]) and an operator's release of a
//!   parked group leave it. The delivery count is also the current
//!   lease's epoch;
//! - a failed attempt is counted by one, and only by a lease that ends
//!   without an ack ([`Message::fail`]: a nack, a reject, a lease that ran
//!   out, a stream closed with it); a FIFO release is not one. The failed
//!   attempts alone decide the move to the dead letter queue, and only an
//!   operator's release of the message's parked group resets them
//!   ([`Message::reset_failures`]);
//! - a lease ends with exactly one attempt in the history (a failure or a
//!   release), so the lease of epoch `e` is found from the end of the
//!   history;
//! - a lease never runs past its start plus the queue's ceiling
//!   ([`Message::extend`]);
//! - a dead-letter record always names the queue left and the reason
//!   ([`Message::dead_letter`]), and a message entering another queue
//!   starts a new life there ([`Message::enter_queue`]);
//! - the histories keep the most recent [`HISTORY_LIMIT`] entries.
//!
//! A transition the state does not allow (leasing a leased message, ending
//! a lease that is not there) is refused with [`Refused`]: the indexes and
//! the stored record disagree, and nothing is changed.
//!
//! `persist.rs` is the only code that maps a message to its stored record
//! and back ([`Stored`], [`Message::restore`]).

use super::error::QueueError;
use super::model::{Attempt, AttemptOutcome, DeadLetter, DeadLetterReason};

/// Most attempts kept per message, and most dead-letter records.
pub(crate) const HISTORY_LIMIT: usize = 16;

/// A message's current lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Fencing epoch: the lease count at the grant.
    pub epoch: u32,
    /// When the lease runs out, ms since the epoch.
    pub deadline: u64,
    /// When the lease was granted.
    pub started: u64,
}

/// A transition the message's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// Leasing or taking a message that is leased.
    #[error("message {0} is leased already")]
    Leased(String),
    /// Ending, releasing or extending a lease that is not there.
    #[error("message {0} is not leased")]
    NotLeased(String),
    /// Making a leased message visible at an instant.
    #[error("message {0} is leased; its visibility is its lease's")]
    VisibleWhileLeased(String),
    /// A release recorded as a failure.
    #[error("message {0}: a release is not a failed attempt")]
    ReleaseAsFailure(String),
}

impl From<Refused> for QueueError {
    fn from(r: Refused) -> Self {
        QueueError::DataLoss(format!(
            "a message's stored state disagrees with the queue's index: {r}"
        ))
    }
}

/// A message as it is first stored in a queue by a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Publication {
    /// The payload's number.
    pub pid: u64,
    /// The message id.
    pub id: String,
    /// True when the client chose the id.
    pub client_id: bool,
    /// Body size in bytes.
    pub size: u32,
    /// FIFO group (`None` for the default group and standard queues).
    pub group: Option<String>,
    /// The publish's instant.
    pub now: u64,
    /// Not deliverable before this instant.
    pub visible_at: u64,
    /// When its time to live runs out.
    pub expires_at: u64,
    /// Published with its own time to live.
    pub own_ttl: bool,
}

/// A message's whole state, field by field, as it was stored: what
/// `persist.rs` reads a record into to [`Message::restore`] it. Nothing
/// else builds one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stored {
    /// The payload's number.
    pub pid: u64,
    /// The message id.
    pub id: String,
    /// True when the client chose the id.
    pub client_id: bool,
    /// When the message entered this queue.
    pub enqueued_at: u64,
    /// When its time to live runs out.
    pub expires_at: u64,
    /// Not deliverable before this instant.
    pub visible_at: u64,
    /// Deliveries in this queue so far; the current lease's epoch.
    pub delivery_count: u32,
    /// Failed attempts in this queue since it entered it, or since its
    /// parked group was last released.
    pub failed_attempts: u32,
    /// The current lease.
    pub lease: Option<Lease>,
    /// First delivery in this queue, 0 if never.
    pub first_delivered_at: u64,
    /// Recent failed attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Moves to dead letter queues, oldest first.
    pub dead_letters: Vec<DeadLetter>,
    /// FIFO group.
    pub group: Option<String>,
    /// Body size in bytes.
    pub size: u32,
    /// Published with its own time to live.
    pub own_ttl: bool,
}

/// A message's state in one queue.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Message {
    pid: u64,
    id: String,
    client_id: bool,
    enqueued_at: u64,
    expires_at: u64,
    visible_at: u64,
    delivery_count: u32,
    failed_attempts: u32,
    lease: Option<Lease>,
    first_delivered_at: u64,
    attempts: Vec<Attempt>,
    dead_letters: Vec<DeadLetter>,
    group: Option<String>,
    size: u32,
    own_ttl: bool,
}

impl Message {
    /// A message just published: never delivered, not leased, no history.
    pub(crate) fn publish(p: Publication) -> Message {
        Message {
            pid: p.pid,
            id: p.id,
            client_id: p.client_id,
            enqueued_at: p.now,
            expires_at: p.expires_at,
            visible_at: p.visible_at,
            delivery_count: 0,
            failed_attempts: 0,
            lease: None,
            first_delivered_at: 0,
            attempts: Vec::new(),
            dead_letters: Vec::new(),
            group: p.group,
            size: p.size,
            own_ttl: p.own_ttl,
        }
    }

    /// A message as it was stored, taken as it is (for `persist.rs`).
    pub(crate) fn restore(s: Stored) -> Message {
        Message {
            pid: s.pid,
            id: s.id,
            client_id: s.client_id,
            enqueued_at: s.enqueued_at,
            expires_at: s.expires_at,
            visible_at: s.visible_at,
            delivery_count: s.delivery_count,
            failed_attempts: s.failed_attempts,
            lease: s.lease,
            first_delivered_at: s.first_delivered_at,
            attempts: s.attempts,
            dead_letters: s.dead_letters,
            group: s.group,
            size: s.size,
            own_ttl: s.own_ttl,
        }
    }

    /// The payload's number.
    pub(crate) fn pid(&self) -> u64 {
        self.pid
    }

    /// The same message with its body stored under payload number `pid`
    /// (the DLQ two-steps negative control's copy has a body of its own).
    pub(crate) fn with_pid(mut self, pid: u64) -> Self {
        self.pid = pid;
        self
    }

    /// The message id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// True when the client chose the id.
    pub(crate) fn client_id(&self) -> bool {
        self.client_id
    }

    /// When the message entered this queue.
    pub(crate) fn enqueued_at(&self) -> u64 {
        self.enqueued_at
    }

    /// When its time to live runs out.
    pub(crate) fn expires_at(&self) -> u64 {
        self.expires_at
    }

    /// Not deliverable before this instant (while not leased).
    pub(crate) fn visible_at(&self) -> u64 {
        self.visible_at
    }

    /// Deliveries in this queue so far (leases and auto-ack takes); never
    /// lowered but by a lease taken back unseen. The current lease's
    /// epoch: the lease of epoch `e` is the `e`-th.
    pub(crate) fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    /// Failed attempts in this queue (nacks, rejects, leases that ran out,
    /// streams closed with the lease) since it entered it or its parked
    /// group was last released: what `max_deliveries` counts.
    pub(crate) fn failed_attempts(&self) -> u32 {
        self.failed_attempts
    }

    /// The current lease, if leased.
    pub(crate) fn current_lease(&self) -> Option<Lease> {
        self.lease
    }

    /// First delivery in this queue, 0 if never.
    pub(crate) fn first_delivered_at(&self) -> u64 {
        self.first_delivered_at
    }

    /// Recent failed (or released) attempts, oldest first.
    pub(crate) fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    /// Moves to dead letter queues, oldest first.
    pub(crate) fn dead_letters(&self) -> &[DeadLetter] {
        &self.dead_letters
    }

    /// FIFO group, `None` for the default group and standard queues.
    pub(crate) fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Body size in bytes.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// True when the message was published with its own time to live.
    pub(crate) fn own_ttl(&self) -> bool {
        self.own_ttl
    }

    /// Counts one delivery (the first sets `first_delivered_at`).
    fn count_delivery(&mut self, now: u64) -> Result<(), Refused> {
        if self.lease.is_some() {
            return Err(Refused::Leased(self.id.clone()));
        }
        self.delivery_count = self.delivery_count.saturating_add(1);
        if self.first_delivered_at == 0 {
            self.first_delivered_at = now;
        }
        Ok(())
    }

    /// Leases the message from `now` until `deadline`: one more delivery,
    /// whose count is the lease's epoch (returned).
    pub(crate) fn lease(&mut self, now: u64, deadline: u64) -> Result<u32, Refused> {
        self.count_delivery(now)?;
        self.lease = Some(Lease {
            epoch: self.delivery_count,
            deadline,
            started: now,
        });
        Ok(self.delivery_count)
    }

    /// Takes the message for an auto-ack delivery (at most once): counted
    /// like a lease, but nothing is held; the message is then deleted.
    pub(crate) fn take(&mut self, now: u64) -> Result<(), Refused> {
        self.count_delivery(now)
    }

    /// Takes back the current lease before anything was handed out: the
    /// delivery it counted goes back down (so the next grant reuses the
    /// epoch of a token no one saw), and a first delivery made `now` is
    /// forgotten. Returns false, changing nothing, when the message is not
    /// leased.
    pub(crate) fn take_back(&mut self, now: u64) -> bool {
        if self.lease.take().is_none() {
            return false;
        }
        self.delivery_count = self.delivery_count.saturating_sub(1);
        if self.delivery_count == 0 && self.first_delivered_at == now {
            self.first_delivered_at = 0;
        }
        true
    }

    /// Extends the current lease to `now + timeout`, but never past its
    /// start plus `max_total`. Returns the new deadline.
    pub(crate) fn extend(
        &mut self,
        now: u64,
        timeout: u64,
        max_total: u64,
    ) -> Result<u64, Refused> {
        let Some(lease) = self.lease.as_mut() else {
            return Err(Refused::NotLeased(self.id.clone()));
        };
        let deadline = (now + timeout).min(lease.started + max_total);
        lease.deadline = deadline;
        Ok(deadline)
    }

    /// Ends the current lease without an ack (nack, reject, lease expiry,
    /// a closed stream): one more failed attempt, recorded in the history.
    /// The delivery stays counted.
    pub(crate) fn fail(
        &mut self,
        now: u64,
        outcome: AttemptOutcome,
        reason: &str,
    ) -> Result<(), Refused> {
        if outcome == AttemptOutcome::Released {
            return Err(Refused::ReleaseAsFailure(self.id.clone()));
        }
        if self.lease.take().is_none() {
            return Err(Refused::NotLeased(self.id.clone()));
        }
        self.failed_attempts = self.failed_attempts.saturating_add(1);
        self.push_attempt(now, outcome, reason);
        Ok(())
    }

    /// FIFO: ends the current lease because an earlier message of its
    /// group, leased with it, failed first: the delivery stays counted (it
    /// reached a consumer), but it is no failed attempt (a release never
    /// brings a message nearer its dead letter queue); the attempt history
    /// records the release with `reason`, and the message is visible again
    /// `now`.
    pub(crate) fn release(&mut self, now: u64, reason: &str) -> Result<(), Refused> {
        if self.lease.take().is_none() {
            return Err(Refused::NotLeased(self.id.clone()));
        }
        self.visible_at = now;
        self.push_attempt(now, AttemptOutcome::Released, reason);
        Ok(())
    }

    /// Makes the message (not leased) deliverable from `at` on: a retry
    /// after its delay, a parked head kept visible, a damaged one put off.
    pub(crate) fn visible_from(&mut self, at: u64) -> Result<(), Refused> {
        if self.lease.is_some() {
            return Err(Refused::VisibleWhileLeased(self.id.clone()));
        }
        self.visible_at = at;
        Ok(())
    }

    /// An operator released its parked FIFO group: it starts again with no
    /// failed attempts counted. Its deliveries (and so its lease epochs)
    /// and its attempt history stay.
    pub(crate) fn reset_failures(&mut self) {
        self.failed_attempts = 0;
    }

    /// Records a move out of `source` to its dead letter queue `now`, for
    /// `reason` (with an operator's or the engine's `note`): the record
    /// keeps both counts and the last nack reason. The move itself is
    /// [`Message::enter_queue`].
    pub(crate) fn dead_letter(
        &mut self,
        source: String,
        reason: DeadLetterReason,
        note: &str,
        now: u64,
    ) {
        let last_nack_reason = self
            .attempts
            .iter()
            .rev()
            .find(|a| !a.reason.is_empty())
            .map(|a| a.reason.clone())
            .unwrap_or_default();
        self.dead_letters.push(DeadLetter {
            source_queue: source,
            reason,
            delivery_count: self.delivery_count,
            failed_attempts: self.failed_attempts,
            last_nack_reason,
            at: now,
            note: note.to_string(),
        });
        trim(&mut self.dead_letters);
    }

    /// Starts a new life in another queue (a dead-letter move or a
    /// redrive), `now`: no deliveries, no failed attempts, no lease, no
    /// attempts in its history, its time to live `ttl` and its delay
    /// `delay` counted from now, the queue's time to live rather than one
    /// of its own, its group kept only into a FIFO queue. Its id, payload
    /// and dead-letter history go with it.
    pub(crate) fn enter_queue(&mut self, now: u64, ttl: u64, delay: u64, fifo: bool) {
        self.delivery_count = 0;
        self.failed_attempts = 0;
        self.lease = None;
        self.first_delivered_at = 0;
        self.attempts.clear();
        self.enqueued_at = now;
        self.expires_at = now + ttl;
        self.visible_at = now + delay;
        self.own_ttl = false;
        if !fifo {
            self.group = None;
        }
    }

    /// Appends an attempt, keeping the most recent ones.
    fn push_attempt(&mut self, at: u64, outcome: AttemptOutcome, reason: &str) {
        self.attempts.push(Attempt {
            at,
            outcome,
            reason: reason.to_string(),
        });
        trim(&mut self.attempts);
    }
}

/// Drops the oldest entries of a history beyond [`HISTORY_LIMIT`].
fn trim<T>(history: &mut Vec<T>) {
    if history.len() > HISTORY_LIMIT {
        let extra = history.len() - HISTORY_LIMIT;
        history.drain(..extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn published() -> Message {
        Message::publish(Publication {
            pid: 7,
            id: "m-1".to_string(),
            client_id: true,
            size: 5,
            group: Some("g".to_string()),
            now: 1_000,
            visible_at: 1_500,
            expires_at: 61_000,
            own_ttl: true,
        })
    }

    /// A message leased at `now` for ten seconds.
    fn leased(now: u64) -> Message {
        let mut m = published();
        m.lease(now, now + 10_000).expect("not leased");
        m
    }

    #[test]
    fn a_published_message_has_no_deliveries_lease_or_history() {
        let m = published();
        assert_eq!(m.pid(), 7);
        assert_eq!(m.id(), "m-1");
        assert!(m.client_id());
        assert_eq!(m.enqueued_at(), 1_000);
        assert_eq!(m.visible_at(), 1_500);
        assert_eq!(m.expires_at(), 61_000);
        assert_eq!(m.group(), Some("g"));
        assert_eq!(m.size(), 5);
        assert!(m.own_ttl());
        assert_eq!((m.delivery_count(), m.failed_attempts()), (0, 0));
        assert_eq!(m.current_lease(), None);
        assert_eq!(m.first_delivered_at(), 0);
        assert!(m.attempts().is_empty());
        assert!(m.dead_letters().is_empty());
    }

    #[test]
    fn a_lease_counts_one_delivery_and_its_count_is_the_epoch() {
        let mut m = published();
        assert_eq!(m.lease(2_000, 12_000), Ok(1));
        assert_eq!(m.delivery_count(), 1);
        assert_eq!(m.failed_attempts(), 0);
        assert_eq!(m.first_delivered_at(), 2_000);
        assert_eq!(
            m.current_lease(),
            Some(Lease {
                epoch: 1,
                deadline: 12_000,
                started: 2_000
            })
        );
        m.fail(3_000, AttemptOutcome::Nacked, "").expect("leased");
        assert_eq!(m.lease(4_000, 14_000), Ok(2));
        assert_eq!((m.delivery_count(), m.failed_attempts()), (2, 1));
        // The first delivery stays the first.
        assert_eq!(m.first_delivered_at(), 2_000);
    }

    #[test]
    fn a_leased_message_cannot_be_leased_or_taken_again() {
        let mut m = leased(2_000);
        let before = m.clone();
        assert_eq!(
            m.lease(2_500, 9_000),
            Err(Refused::Leased("m-1".to_string()))
        );
        assert_eq!(m.take(2_500), Err(Refused::Leased("m-1".to_string())));
        assert_eq!(m, before);
    }

    #[test]
    fn an_auto_ack_take_counts_a_delivery_without_a_lease() {
        let mut m = published();
        m.take(2_000).expect("not leased");
        assert_eq!((m.delivery_count(), m.failed_attempts()), (1, 0));
        assert_eq!(m.first_delivered_at(), 2_000);
        assert_eq!(m.current_lease(), None);
    }

    #[test]
    fn a_lease_taken_back_unseen_is_not_counted() {
        let mut m = leased(2_000);
        assert!(m.take_back(2_000));
        assert_eq!((m.delivery_count(), m.failed_attempts()), (0, 0));
        assert_eq!(m.current_lease(), None);
        assert_eq!(m.first_delivered_at(), 0);
        assert!(m.attempts().is_empty());
        // Nothing to take back: nothing changes.
        let before = m.clone();
        assert!(!m.take_back(2_000));
        assert_eq!(m, before);
    }

    #[test]
    fn a_lease_taken_back_later_keeps_the_first_delivery() {
        let mut m = leased(2_000);
        m.fail(3_000, AttemptOutcome::LeaseExpired, "")
            .expect("leased");
        m.lease(4_000, 5_000).expect("not leased");
        assert!(m.take_back(4_000));
        // The failure stays; the delivery taken back unseen does not.
        assert_eq!((m.delivery_count(), m.failed_attempts()), (1, 1));
        assert_eq!(m.first_delivered_at(), 2_000);
        let mut once = leased(2_000);
        // Taken back at another instant than the grant's: kept.
        assert!(once.take_back(2_001));
        assert_eq!(once.first_delivered_at(), 2_000);
    }

    #[test]
    fn an_extension_never_passes_the_lease_ceiling() {
        let mut m = leased(2_000);
        assert_eq!(m.extend(3_000, 5_000, 60_000), Ok(8_000));
        assert_eq!(m.current_lease().map(|l| l.deadline), Some(8_000));
        assert_eq!(m.extend(3_000, 90_000, 60_000), Ok(62_000));
        assert_eq!(m.current_lease().map(|l| l.deadline), Some(62_000));
        assert_eq!(m.current_lease().map(|l| l.started), Some(2_000));
        assert_eq!(m.delivery_count(), 1);
        let mut not_leased = published();
        let before = not_leased.clone();
        assert_eq!(
            not_leased.extend(3_000, 5_000, 60_000),
            Err(Refused::NotLeased("m-1".to_string()))
        );
        assert_eq!(not_leased, before);
    }

    #[test]
    fn a_failure_ends_the_lease_with_one_attempt_and_keeps_the_count() {
        let mut m = leased(2_000);
        m.fail(3_000, AttemptOutcome::Nacked, "busy")
            .expect("leased");
        assert_eq!(m.current_lease(), None);
        assert_eq!((m.delivery_count(), m.failed_attempts()), (1, 1));
        assert_eq!(
            m.attempts(),
            &[Attempt {
                at: 3_000,
                outcome: AttemptOutcome::Nacked,
                reason: "busy".to_string()
            }]
        );
        // No lease, nothing to fail.
        let before = m.clone();
        assert_eq!(
            m.fail(4_000, AttemptOutcome::LeaseExpired, ""),
            Err(Refused::NotLeased("m-1".to_string()))
        );
        assert_eq!(m, before);
    }

    #[test]
    fn a_release_is_not_recorded_as_a_failure() {
        let mut m = leased(2_000);
        let before = m.clone();
        assert_eq!(
            m.fail(3_000, AttemptOutcome::Released, "x"),
            Err(Refused::ReleaseAsFailure("m-1".to_string()))
        );
        assert_eq!(m, before);
    }

    #[test]
    fn a_release_counts_the_delivery_but_no_failure_and_makes_the_message_visible() {
        let mut m = leased(2_000);
        m.release(3_000, "released: m-0 failed first")
            .expect("leased");
        assert_eq!(m.current_lease(), None);
        // The delivery reached a consumer: it stays counted (and it is
        // the epoch of a token that was seen). It is no failed attempt.
        assert_eq!((m.delivery_count(), m.failed_attempts()), (1, 0));
        assert_eq!(m.visible_at(), 3_000);
        assert_eq!(m.attempts().len(), 1);
        assert_eq!(m.attempts()[0].outcome, AttemptOutcome::Released);
        assert_eq!(m.attempts()[0].reason, "released: m-0 failed first");
        let before = m.clone();
        assert_eq!(
            m.release(4_000, "again"),
            Err(Refused::NotLeased("m-1".to_string()))
        );
        assert_eq!(m, before);
    }

    #[test]
    fn only_a_message_not_leased_is_made_visible_at_an_instant() {
        let mut m = leased(2_000);
        let before = m.clone();
        assert_eq!(
            m.visible_from(9_000),
            Err(Refused::VisibleWhileLeased("m-1".to_string()))
        );
        assert_eq!(m, before);
        m.fail(3_000, AttemptOutcome::Nacked, "").expect("leased");
        m.visible_from(9_000).expect("not leased");
        assert_eq!(m.visible_at(), 9_000);
    }

    #[test]
    fn releasing_a_parked_group_resets_the_failed_attempts_only() {
        let mut m = leased(2_000);
        m.fail(3_000, AttemptOutcome::Nacked, "no").expect("leased");
        m.reset_failures();
        assert_eq!((m.delivery_count(), m.failed_attempts()), (1, 0));
        assert_eq!(m.attempts().len(), 1);
        assert_eq!(m.lease(1_000, 2_000), Ok(2));
    }

    #[test]
    fn a_dead_letter_record_names_the_source_and_the_reason() {
        let mut m = leased(2_000);
        m.fail(3_000, AttemptOutcome::Nacked, "bad input")
            .expect("leased");
        m.lease(4_000, 5_000).expect("not leased");
        m.fail(5_000, AttemptOutcome::LeaseExpired, "")
            .expect("leased");
        m.dead_letter(
            "orders".to_string(),
            DeadLetterReason::MaxDeliveries,
            "",
            6_000,
        );
        assert_eq!(
            m.dead_letters(),
            &[DeadLetter {
                source_queue: "orders".to_string(),
                reason: DeadLetterReason::MaxDeliveries,
                delivery_count: 2,
                failed_attempts: 2,
                // The last reason given, not the last (empty) one.
                last_nack_reason: "bad input".to_string(),
                at: 6_000,
                note: String::new(),
            }]
        );
    }

    #[test]
    fn a_message_entering_a_queue_starts_a_new_life_there() {
        let mut m = leased(2_000);
        m.fail(3_000, AttemptOutcome::Rejected, "no")
            .expect("leased");
        m.dead_letter("orders".to_string(), DeadLetterReason::Rejected, "", 3_000);
        let mut standard = m.clone();
        m.enter_queue(4_000, 100_000, 0, true);
        assert_eq!((m.delivery_count(), m.failed_attempts()), (0, 0));
        assert_eq!(m.current_lease(), None);
        assert_eq!(m.first_delivered_at(), 0);
        assert!(m.attempts().is_empty());
        assert_eq!(m.enqueued_at(), 4_000);
        assert_eq!(m.expires_at(), 104_000);
        assert_eq!(m.visible_at(), 4_000);
        assert!(!m.own_ttl());
        assert_eq!(m.group(), Some("g"));
        assert_eq!(
            (m.id(), m.pid(), m.size(), m.client_id()),
            ("m-1", 7, 5, true)
        );
        assert_eq!(m.dead_letters().len(), 1);
        standard.enter_queue(4_000, 100_000, 250, false);
        assert_eq!(standard.group(), None);
        assert_eq!(standard.visible_at(), 4_250);
        // A leased message entering a queue leaves its lease behind.
        let mut l = leased(2_000);
        l.enter_queue(4_000, 1_000, 0, false);
        assert_eq!(l.current_lease(), None);
        assert_eq!(l.lease(4_000, 5_000), Ok(1));
    }

    #[test]
    fn the_histories_keep_the_most_recent_entries() {
        let mut m = published();
        for i in 0..(HISTORY_LIMIT as u64 + 3) {
            m.lease(i, i + 1).expect("not leased");
            m.fail(i, AttemptOutcome::Nacked, &i.to_string())
                .expect("leased");
            m.dead_letter(format!("q{i}"), DeadLetterReason::Skipped, "", i);
        }
        assert_eq!(m.attempts().len(), HISTORY_LIMIT);
        assert_eq!(m.attempts()[0].reason, "3");
        assert_eq!(m.attempts().last().map(|a| a.reason.as_str()), Some("18"));
        assert_eq!(m.dead_letters().len(), HISTORY_LIMIT);
        assert_eq!(m.dead_letters()[0].source_queue, "q3");
    }

    #[test]
    fn a_refusal_is_data_loss_to_the_caller() {
        let e = QueueError::from(Refused::NotLeased("m-1".to_string()));
        assert!(matches!(e, QueueError::DataLoss(ref s) if s.contains("m-1 is not leased")));
    }

    /// One transition, with its arguments.
    #[derive(Debug, Clone)]
    enum Op {
        Lease(u64),
        TakeBack,
        Extend(u64),
        Fail(u8),
        Release,
        Visible(u64),
        ResetFailures,
        DeadLetter,
        Enter(bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u64..100_000).prop_map(Op::Lease),
            1 => Just(Op::TakeBack),
            1 => (0u64..200_000).prop_map(Op::Extend),
            2 => (0u8..5).prop_map(Op::Fail),
            1 => Just(Op::Release),
            1 => (0u64..100_000).prop_map(Op::Visible),
            1 => Just(Op::ResetFailures),
            1 => Just(Op::DeadLetter),
            1 => any::<bool>().prop_map(Op::Enter),
        ]
    }

    proptest! {
        /// Whatever the order of transitions: a delivery is counted by one
        /// and only by a lease, and goes back down only when that lease is
        /// taken back unseen; a failed attempt is counted by one and only
        /// by a failure, and reset only by an operator's release (or a new
        /// queue); a release counts neither way; every lease that ended
        /// left exactly one attempt (what finds a released token's attempt
        /// from the end); a refused transition changes nothing.
        #[test]
        fn transitions_keep_the_counts_and_the_history_in_step(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            let mut m = published();
            let mut now = 1_000u64;
            // Attempts left since the message entered its queue, untrimmed.
            let mut ended = 0u32;
            for op in ops {
                now += 10;
                let before = m.clone();
                let outcome = match op {
                    Op::Lease(d) => m.lease(now, now + d).map(|_| ()),
                    Op::TakeBack => {
                        m.take_back(now);
                        Ok(())
                    }
                    Op::Extend(t) => m.extend(now, t, 300_000).map(|_| ()),
                    Op::Fail(o) => {
                        let outcome = [
                            AttemptOutcome::Nacked,
                            AttemptOutcome::LeaseExpired,
                            AttemptOutcome::Rejected,
                            AttemptOutcome::StreamClosed,
                            AttemptOutcome::Released,
                        ][usize::from(o)];
                        m.fail(now, outcome, "r")
                    }
                    Op::Release => m.release(now, "released"),
                    Op::Visible(at) => m.visible_from(at),
                    Op::ResetFailures => {
                        m.reset_failures();
                        Ok(())
                    }
                    Op::DeadLetter => {
                        m.dead_letter("src".to_string(), DeadLetterReason::Rejected, "", now);
                        Ok(())
                    }
                    Op::Enter(fifo) => {
                        m.enter_queue(now, 60_000, 0, fifo);
                        Ok(())
                    }
                };
                if outcome.is_err() {
                    prop_assert_eq!(&m, &before);
                    continue;
                }
                match op {
                    Op::Lease(_) => {
                        prop_assert_eq!(m.delivery_count(), before.delivery_count() + 1);
                        prop_assert_eq!(m.failed_attempts(), before.failed_attempts());
                        prop_assert_eq!(m.current_lease().map(|l| l.epoch), Some(m.delivery_count()));
                    }
                    Op::Fail(_) => {
                        ended += 1;
                        prop_assert_eq!(m.delivery_count(), before.delivery_count());
                        prop_assert_eq!(m.failed_attempts(), before.failed_attempts() + 1);
                    }
                    Op::Release => {
                        ended += 1;
                        prop_assert_eq!(m.delivery_count(), before.delivery_count());
                        prop_assert_eq!(m.failed_attempts(), before.failed_attempts());
                    }
                    Op::Enter(_) => {
                        ended = 0;
                        prop_assert_eq!((m.delivery_count(), m.failed_attempts()), (0, 0));
                    }
                    Op::ResetFailures => {
                        prop_assert_eq!(m.delivery_count(), before.delivery_count());
                        prop_assert_eq!(m.failed_attempts(), 0);
                    }
                    Op::TakeBack => {
                        prop_assert!(m.delivery_count() <= before.delivery_count());
                        prop_assert_eq!(m.failed_attempts(), before.failed_attempts());
                    }
                    Op::Extend(_) | Op::Visible(_) | Op::DeadLetter => {
                        prop_assert_eq!(m.delivery_count(), before.delivery_count());
                        prop_assert_eq!(m.failed_attempts(), before.failed_attempts());
                    }
                }
                if let Some(l) = m.current_lease() {
                    prop_assert!(l.deadline <= l.started + 300_000);
                }
                prop_assert!(m.failed_attempts() <= m.delivery_count());
                prop_assert_eq!(m.delivery_count(), ended + u32::from(m.current_lease().is_some()));
                let kept = usize::try_from(ended).unwrap_or(usize::MAX).min(HISTORY_LIMIT);
                prop_assert_eq!(m.attempts().len(), kept);
            }
        }
    }
}
