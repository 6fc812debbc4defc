//! Settling deliveries: ack, nack, extend, leases returned by a closed
//! subscription; what a token's lease is or was (receiving is
//! `receive.rs`).
//!
//! Tokens carry the lease's epoch (the delivery count at the grant); a
//! settle call whose token is not the current, unexpired lease fails for
//! that token and changes nothing.

use crate::storage::Key;

use super::error::{QueueError, Result};
use super::message::Message;
use super::model::{AttemptOutcome, LeaseEnd, LeasedMessage, Nack, Released, Settled};
use super::state::{EntryState, QueueState};
use super::token::AckToken;
use super::undo::Undo;
use super::{Broker, Change, State, durable, persist, validate};

impl Broker {
    /// Acknowledges deliveries: each message is deleted for good.
    pub async fn ack(&self, tokens: &[String]) -> Result<Vec<Settled>> {
        let (results, pending) = self.ack_begin(tokens)?;
        pending.durable().await?;
        Ok(results)
    }

    /// The decision of [`Broker::ack`], without waiting for it to be
    /// durable: the caller waits for the commit before it answers. A
    /// subscription uses it to lease its next message before that wait, so
    /// that the ack and the lease share one `fdatasync`.
    pub fn ack_begin(&self, tokens: &[String]) -> Result<(Vec<Settled>, super::Pending)> {
        validate::batch("ack_tokens", tokens.len())?;
        let parsed = parse_tokens("ack_tokens", tokens.iter().map(String::as_str))?;
        self.check_floor()?;
        let now = self.now();
        let mut st = self.lock();
        let (results, commit) = self.decide(&mut st, |st, change| {
            self.ack_in(st, &parsed, tokens, now, change)
        })?;
        Ok((results, super::Pending::new(commit)))
    }

    /// Acknowledges the deliveries of `parsed` (whose texts are `tokens`)
    /// under the lock, into `change`: one outcome per token, in order.
    pub(super) fn ack_in(
        &self,
        st: &mut State,
        parsed: &[AckToken],
        tokens: &[String],
        now: u64,
        change: &mut Change,
    ) -> Result<Vec<Settled>> {
        self.catch_up(st, now, change)?;
        let mut results = Vec::with_capacity(parsed.len());
        for (t, text) in parsed.iter().zip(tokens) {
            if let Err(why) = current_lease(st, t, now) {
                results.push(self.not_current(st, t, text, why, change)?);
                continue;
            }
            let State {
                queues,
                timers,
                undo,
                ..
            } = &mut *st;
            let Some(q) = queues.get_mut(&t.qid) else {
                continue;
            };
            if let Some((_, pid)) = q.remove(t.pos, timers, undo) {
                if !q.client_ids.is_empty() {
                    let meta = self.meta(t.qid, t.pos)?;
                    forget_client_id(q, &meta, undo);
                }
                change.txn.delete(Key::Meta(t.qid, t.pos));
                change.txn.delete(Key::Payload(pid));
                q.counters_mut(undo).acked += 1;
                change.touch(t.qid);
                change.wake(t.qid);
            }
            results.push(Settled::Ok { deadline: 0 });
        }
        Ok(results)
    }

    /// Rejects deliveries: each counts as a failed attempt.
    pub async fn nack(&self, items: &[Nack]) -> Result<Vec<Settled>> {
        Ok(self.nack_releasing(items).await?.0)
    }

    /// [`Broker::nack`] that also returns the FIFO deliveries the nacks
    /// released (later messages of a failed message's group that were
    /// leased with it, SPEC §3): their tokens settle nothing any more.
    pub async fn nack_releasing(&self, items: &[Nack]) -> Result<(Vec<Settled>, Vec<Released>)> {
        let (ends, released) = self.nack_ends(items).await?;
        Ok((ends.into_iter().map(|(s, _)| s).collect(), released))
    }

    /// [`Broker::nack_releasing`] that also says, for each nack that
    /// settled, what became of its message (ready again, moved to the
    /// dead letter queue, expired, parked); `None` beside a token whose
    /// lease was not current.
    pub async fn nack_ends(
        &self,
        items: &[Nack],
    ) -> Result<(Vec<(Settled, Option<LeaseEnd>)>, Vec<Released>)> {
        validate::batch("items", items.len())?;
        let parsed = parse_tokens("items.ack_token", items.iter().map(|n| n.token.as_str()))?;
        for (i, n) in items.iter().enumerate() {
            if let Some(d) = n.delay
                && d > validate::limits::MAX_DELAY
            {
                return Err(QueueError::invalid(
                    format!("items[{i}].delay_ms"),
                    d,
                    format!("must be at most {}", validate::limits::MAX_DELAY),
                ));
            }
            validate::reason(&format!("items[{i}].reason"), &n.reason)?;
        }
        self.check_floor()?;
        let now = self.now();
        let (results, released, commit) = {
            let mut st = self.lock();
            // A reject needs a dead letter queue: check all before changing any.
            for (t, n) in parsed.iter().zip(items) {
                if !n.dead_letter {
                    continue;
                }
                if let Some(q) = st.queues.get(&t.qid)
                    && q.config.dead_letter.is_none()
                {
                    return Err(QueueError::FailedPrecondition(format!(
                        "queue {:?} has no dead letter queue, so token {} cannot be rejected to one",
                        q.name, n.token
                    )));
                }
            }
            let ((results, released), commit) = self.decide(&mut st, |st, change| {
                self.catch_up(st, now, change)?;
                let mut results = Vec::with_capacity(items.len());
                for (t, n) in parsed.iter().zip(items) {
                    if let Err(why) = current_lease(st, t, now) {
                        results.push((self.not_current(st, t, &n.token, why, change)?, None));
                        continue;
                    }
                    let outcome = if n.dead_letter {
                        AttemptOutcome::Rejected
                    } else {
                        AttemptOutcome::Nacked
                    };
                    let end =
                        self.end_lease(st, t.qid, t.pos, now, outcome, &n.reason, n.delay, change)?;
                    results.push((Settled::Ok { deadline: 0 }, Some(end)));
                }
                Ok((results, std::mem::take(&mut change.released)))
            })?;
            (results, released, commit)
        };
        durable(commit).await?;
        Ok((results, released))
    }

    /// Extends leases: new deadline = now + timeout, capped by the queue's
    /// `max_lease_total` counted from the grant.
    pub async fn extend(&self, items: &[(String, u64)]) -> Result<Vec<Settled>> {
        validate::batch("items", items.len())?;
        let parsed = parse_tokens("items.ack_token", items.iter().map(|(t, _)| t.as_str()))?;
        for (i, (_, timeout)) in items.iter().enumerate() {
            validate::lease_length(
                &format!("items[{i}].timeout_ms"),
                *timeout,
                validate::limits::ACK_TIMEOUT.1,
            )?;
        }
        self.check_floor()?;
        let now = self.now();
        let (results, commit) = {
            let mut st = self.lock();
            self.decide(&mut st, |st, change| {
                self.catch_up(st, now, change)?;
                let mut results = Vec::with_capacity(items.len());
                for (t, (text, timeout)) in parsed.iter().zip(items) {
                    if let Err(why) = current_lease(st, t, now) {
                        results.push(self.not_current(st, t, text, why, change)?);
                        continue;
                    }
                    let mut meta = self.meta(t.qid, t.pos)?;
                    let State {
                        queues,
                        timers,
                        undo,
                        ..
                    } = &mut *st;
                    let Some(q) = queues.get_mut(&t.qid) else {
                        continue;
                    };
                    let Ok(deadline) = meta.extend(now, *timeout, q.config.max_lease_total) else {
                        change.answers_from_others = true;
                        results.push(Settled::LeaseExpired(format!(
                            "lease expired: token {text} is not leased"
                        )));
                        continue;
                    };
                    q.set_deadline(t.pos, deadline, timers, undo);
                    persist::put(&mut change.txn, t.qid, t.pos, &meta);
                    results.push(Settled::Ok { deadline });
                }
                Ok(results)
            })?
        };
        durable(commit).await?;
        Ok(results)
    }
}

impl Broker {
    /// The message whose current, unexpired lease `token` is: its queue,
    /// its id and the deadline; `None` when the token is well formed but
    /// not (or no longer) a current lease. Lets a caller that names the
    /// queue and message besides the token (the Anypoint REST paths) check
    /// that they agree before settling, and authorize on the queue. A
    /// message's queue and id never change while it is leased, so the
    /// answer stays true until the lease ends.
    pub fn lease_holder(&self, field: &str, token: &str) -> Result<Option<LeasedMessage>> {
        let t = AckToken::parse(field, token)?;
        let now = self.now();
        let st = self.lock();
        if current_lease(&st, &t, now).is_err() {
            return Ok(None);
        }
        let Some(q) = st.queues.get(&t.qid) else {
            return Ok(None);
        };
        let Some(e) = q.msgs.get(t.pos) else {
            return Ok(None);
        };
        let meta = self.meta(t.qid, t.pos)?;
        Ok(Some(LeasedMessage {
            queue: q.name.clone(),
            message_id: meta.id().to_string(),
            deadline: e.due(),
        }))
    }

    /// Why the lease `token` was released, if it was: a FIFO delivery
    /// whose lease ended because an earlier message of its group, leased
    /// with it, failed first (SPEC §3). `None` for a current lease, or one
    /// that ended otherwise.
    pub fn released_lease(&self, field: &str, token: &str) -> Result<Option<String>> {
        let t = AckToken::parse(field, token)?;
        let now = self.now();
        let st = self.lock();
        if current_lease(&st, &t, now).is_ok() {
            return Ok(None);
        }
        self.released_by(&st, &t, None)
    }

    /// A receiver that changes whenever messages may have become
    /// deliverable in the queue (publish, nack, expiry, a delay ending) or
    /// the engine starts shutting down. Subscribe before trying to receive,
    /// so that no wake-up is missed.
    pub fn watch(&self, queue: &str) -> Result<tokio::sync::watch::Receiver<u64>> {
        let mut st = self.lock();
        let qid = st.qid(queue)?;
        Ok(st.queue(qid)?.wake.subscribe())
    }

    /// Returns deliveries whose holder went away (a subscription that
    /// closed): each counts as a failed attempt (outcome STREAM_CLOSED) and
    /// is visible again at once, or moves to the dead letter queue if it
    /// exhausted its deliveries. Tokens whose lease is no longer current
    /// are skipped. Returns how many were returned.
    pub async fn return_leases(&self, tokens: &[String]) -> Result<usize> {
        let mut parsed: Vec<AckToken> = tokens
            .iter()
            .filter_map(|t| AckToken::parse("ack_token", t).ok())
            .collect();
        // In queue order: in a FIFO group the earliest returned delivery
        // fails and releases the later ones, which are no failed attempts
        // (SPEC §3).
        parsed.sort_by_key(|t| (t.qid, t.pos));
        if parsed.is_empty() {
            return Ok(0);
        }
        let now = self.now();
        let (n, commit) = {
            let mut st = self.lock();
            self.decide(&mut st, |st, change| {
                let mut n = 0;
                for t in &parsed {
                    if current_lease(st, t, now).is_ok() {
                        self.end_lease(
                            st,
                            t.qid,
                            t.pos,
                            now,
                            AttemptOutcome::StreamClosed,
                            "",
                            Some(0),
                            change,
                        )?;
                        n += 1;
                    }
                }
                Ok(n)
            })?
        };
        durable(commit).await?;
        Ok(n)
    }
}

impl Broker {
    /// Ends the leases that ran out before `now` and the sweeper has not
    /// ended yet (it runs every 50 ms), in the settling call's transaction:
    /// a FIFO message whose lease ran out releases the later ones of its
    /// group first, so that none of them can be acked in that gap ahead
    /// of its redelivery (SPEC §3). Free when nothing is due.
    pub(super) fn catch_up(&self, st: &mut State, now: u64, change: &mut Change) -> Result<()> {
        if st.timers.first().is_some_and(|&(due, _, _)| due <= now) {
            self.due_timers(st, now, change)?;
        }
        Ok(())
    }

    /// The outcome for a token whose lease is not current (`why`): a
    /// FIFO delivery released by the failure of an earlier message of its
    /// group says so and names it; any other, that the lease expired.
    /// `change` is the call's transaction so far, which the store does not
    /// see yet: the release of this token by an earlier token of the same
    /// call, or the end of this very lease by the call's `catch_up` (its
    /// record then says how the lease ended, not how the one before did).
    /// The lease may have been ended by another call whose change is not
    /// durable yet: the answer waits for it (`answers_from_others`).
    fn not_current(
        &self,
        st: &State,
        t: &AckToken,
        text: &str,
        why: &str,
        change: &mut Change,
    ) -> Result<Settled> {
        change.answers_from_others = true;
        if let Some(reason) = self.released_by(st, t, Some(change))? {
            return Ok(Settled::Released(format!(
                "token {text} was {reason}; the group restarts at that message, so this delivery settles nothing"
            )));
        }
        Ok(Settled::LeaseExpired(format!(
            "lease expired: token {text} {why}"
        )))
    }

    /// The reason recorded when the lease `t` was released (SPEC §3), if
    /// it was. Every lease that ended at a position left one attempt in
    /// the message's history, oldest first, so the lease of epoch `e` ended
    /// with the attempt `ended - e` places from the end (while the history
    /// still holds it: it keeps the most recent ones). The record is read
    /// as `pending`, the caller's change not yet submitted, leaves it.
    fn released_by(
        &self,
        st: &State,
        t: &AckToken,
        pending: Option<&Change>,
    ) -> Result<Option<String>> {
        let Some(q) = st.queues.get(&t.qid) else {
            return Ok(None);
        };
        let Some(e) = q.msgs.get(t.pos) else {
            return Ok(None);
        };
        if q.fifo.is_none() {
            return Ok(None);
        }
        let meta = match pending {
            Some(change) => match self.meta_in(change, t.qid, t.pos)? {
                Some(meta) => meta,
                None => return Ok(None),
            },
            None => self.meta(t.qid, t.pos)?,
        };
        let ended = meta
            .delivery_count()
            .saturating_sub(u32::from(e.state() == EntryState::Leased));
        if t.epoch == 0 || t.epoch > ended {
            return Ok(None);
        }
        let back = usize::try_from(ended - t.epoch).unwrap_or(usize::MAX);
        let attempts = meta.attempts();
        let attempt = attempts
            .len()
            .checked_sub(back.saturating_add(1))
            .and_then(|i| attempts.get(i));
        Ok(attempt
            .filter(|a| a.outcome == AttemptOutcome::Released)
            .map(|a| a.reason.clone()))
    }
}

/// Parses every token of a request before anything is done.
pub(super) fn parse_tokens<'a>(
    field: &str,
    tokens: impl Iterator<Item = &'a str>,
) -> Result<Vec<AckToken>> {
    tokens
        .enumerate()
        .map(|(i, t)| AckToken::parse(&format!("{field}[{i}]"), t))
        .collect()
}

/// Checks that a token is the current, unexpired lease of its message.
pub(super) fn current_lease(
    st: &State,
    t: &AckToken,
    now: u64,
) -> std::result::Result<(), &'static str> {
    let q = st
        .queues
        .get(&t.qid)
        .ok_or("(its queue no longer exists)")?;
    let e = q
        .msgs
        .get(t.pos)
        .ok_or("(the message is no longer in the queue)")?;
    if e.state() != EntryState::Leased || e.epoch() != t.epoch {
        return Err("(the lease was settled, or ran out and the message was delivered again)");
    }
    if e.due() <= now {
        return Err("(the lease ran out)");
    }
    Ok(())
}

/// Drops a message's client id from its queue's index.
pub(crate) fn forget_client_id(q: &mut QueueState, meta: &Message, undo: &mut Undo) {
    if meta.client_id() {
        q.forget_client_id(meta.id(), undo);
    }
}
