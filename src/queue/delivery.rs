//! Delivery: receive (long poll, auto-ack), ack, nack, extend.
//!
//! A lease is granted in the same record that raises the delivery count,
//! so counts are exact across crashes. Tokens carry the lease's epoch (the
//! delivery count at the grant); a settle call whose token is not the
//! current, unexpired lease fails for that token and changes nothing.

use std::time::{Duration, Instant};

use crate::storage::Key;
use crate::storage::records::LeaseRecord;

use super::error::{QueueError, Result};
use super::model::{AttemptOutcome, Delivery, LeasedMessage, Nack, ReceiveOptions, Settled};
use super::state::{EntryState, QueueState};
use super::token::AckToken;
use super::{Broker, Change, State, durable, persist, validate};

/// Bytes counted per delivery besides its body, for the response budget.
const DELIVERY_OVERHEAD: u64 = 512;

/// A leased (or auto-acked) message waiting for its payload to be read.
struct Picked {
    qid: u32,
    pid: u64,
    token: Option<AckToken>,
    meta: crate::storage::records::MetaRecord,
    deadline: u64,
    /// Auto-ack: the payload, read before it was deleted.
    payload: Option<crate::storage::records::PayloadRecord>,
}

impl Broker {
    /// Leases up to `opts.max_messages` messages, waiting up to `opts.wait`
    /// for the first to become ready.
    pub async fn receive(&self, queue: &str, opts: ReceiveOptions) -> Result<Vec<Delivery>> {
        Ok(self.receive_acking(queue, opts, &[]).await?.1)
    }

    /// [`Broker::receive`] that first acknowledges earlier deliveries, as
    /// [`Broker::ack`] does, in the same transaction as the new leases: a
    /// consumer that takes one message at a time pays for one call and one
    /// `fdatasync` per message instead of two. Returns one outcome per
    /// token, in order, and the deliveries. Nothing changes unless every
    /// argument is valid; if no message is ready, the acks are made
    /// durable before the wait.
    pub async fn receive_acking(
        &self,
        queue: &str,
        opts: ReceiveOptions,
        acks: &[String],
    ) -> Result<(Vec<Settled>, Vec<Delivery>)> {
        let mut parsed = if acks.is_empty() {
            Vec::new()
        } else {
            validate::batch("ack_tokens", acks.len())?;
            parse_tokens("ack_tokens", acks.iter().map(String::as_str))?
        };
        let mut settled = Vec::new();
        let max = match opts.max_messages {
            0 => 10,
            n if n > validate::limits::MAX_RECEIVE => {
                return Err(QueueError::invalid(
                    "max_messages",
                    n,
                    format!("must be at most {}", validate::limits::MAX_RECEIVE),
                ));
            }
            n => n,
        };
        if opts.wait > validate::limits::MAX_WAIT {
            return Err(QueueError::invalid(
                "wait_ms",
                opts.wait,
                format!("must be at most {}", validate::limits::MAX_WAIT),
            ));
        }
        let give_up = Instant::now() + Duration::from_millis(opts.wait);
        loop {
            let (picked, commit, mut wake) = {
                let mut st = self.lock();
                let qid = st.qid(queue)?;
                let q = st.queue(qid)?;
                let timeout = match opts.ack_timeout {
                    Some(t) => {
                        validate::lease_length("ack_timeout_ms", t, q.config.max_lease_total)?;
                        t
                    }
                    None => q.config.ack_timeout,
                };
                let wake = q.wake.subscribe();
                let mut change = Change::default();
                if !parsed.is_empty() {
                    // The first turn only: the acks go in with its leases.
                    let now = self.now();
                    settled = self.ack_in(&mut st, &parsed, acks, now, &mut change)?;
                    parsed.clear();
                }
                let picked = self.pick(&mut st, qid, max, timeout, opts.auto_ack, &mut change)?;
                (picked, self.submit(&st, change), wake)
            };
            if !picked.is_empty() {
                return Ok((settled, self.deliver(queue, picked, commit).await?));
            }
            durable(commit).await?;
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() || self.is_closing() {
                return Ok((settled, Vec::new()));
            }
            // Woken when a message may have become ready; otherwise the
            // wait runs out.
            if tokio::time::timeout(left, wake.changed()).await.is_err() {
                return Ok((settled, Vec::new()));
            }
        }
    }

    /// Chooses and leases messages under the lock. Expired candidates are
    /// expired instead of delivered, and the choice is made again past
    /// them (in a FIFO group the next message becomes the head).
    fn pick(
        &self,
        st: &mut State,
        qid: u32,
        max: u32,
        timeout: u64,
        auto_ack: bool,
        change: &mut Change,
    ) -> Result<Vec<Picked>> {
        let now = self.now();
        let max = usize::try_from(max).unwrap_or(10);
        let mut picked: Vec<Picked> = Vec::new();
        let mut used = 0u64;
        loop {
            let q = st.queue(qid)?;
            let budget = self.opts.max_response_bytes.saturating_sub(used);
            if !picked.is_empty() && budget == 0 {
                break;
            }
            let candidates = q.deliverable(max - picked.len(), budget, DELIVERY_OVERHEAD);
            if candidates.is_empty() {
                break;
            }
            let mut expired_any = false;
            for pos in candidates {
                let q = st.queue(qid)?;
                let Some(e) = q.msgs.get(pos) else { continue };
                if e.expires_at() <= now {
                    self.expire(st, qid, pos, now, change)?;
                    expired_any = true;
                    continue;
                }
                used += u64::from(e.size()) + DELIVERY_OVERHEAD;
                picked.push(self.lease_one(st, qid, pos, now, timeout, auto_ack, change)?);
            }
            if !expired_any || picked.len() >= max {
                break;
            }
        }
        Ok(picked)
    }

    /// Leases (or auto-acks) one ready message.
    #[allow(clippy::too_many_arguments)]
    fn lease_one(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        now: u64,
        timeout: u64,
        auto_ack: bool,
        change: &mut Change,
    ) -> Result<Picked> {
        let mut meta = self.meta(qid, pos)?;
        meta.delivery_count += 1;
        meta.leases += 1;
        if meta.first_delivered_at == 0 {
            meta.first_delivered_at = now;
        }
        let State { queues, timers, .. } = st;
        let q = queues
            .get_mut(&qid)
            .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
        if auto_ack {
            let payload = self.store.get_payload(meta.pid)?;
            q.remove(pos, timers);
            forget_client_id(q, &meta);
            change.txn.delete(Key::Meta(qid, pos));
            change.txn.delete(Key::Payload(meta.pid));
            q.counters.acked += 1;
            change.touch(qid);
            return Ok(Picked {
                qid,
                pid: meta.pid,
                token: None,
                meta,
                deadline: 0,
                payload,
            });
        }
        let deadline = now + timeout;
        let epoch = meta.leases;
        meta.lease = Some(LeaseRecord {
            epoch,
            deadline,
            started: now,
        });
        #[cfg(feature = "fault-no-delivery-count")]
        change.txn.put_meta_unlogged(qid, pos, &meta);
        #[cfg(not(feature = "fault-no-delivery-count"))]
        change.txn.put_meta(qid, pos, &meta);
        q.lease(pos, deadline, epoch, timers);
        Ok(Picked {
            qid,
            pid: meta.pid,
            token: Some(AckToken { qid, pos, epoch }),
            meta,
            deadline,
            payload: None,
        })
    }

    /// Reads the payloads of picked messages and waits for durability.
    async fn deliver(
        &self,
        queue: &str,
        picked: Vec<Picked>,
        mut commit: Option<crate::storage::Commit>,
    ) -> Result<Vec<Delivery>> {
        // The leases' write overlaps the payload reads below, but for a
        // single message (its caller may then commit it alone, the cheaper
        // way; see `Commit::wait`).
        if picked.len() > 1
            && let Some(c) = commit.as_mut()
        {
            c.start();
        }
        let mut out = Vec::with_capacity(picked.len());
        for p in picked {
            let payload = match p.payload {
                Some(payload) => Some(payload),
                None => self.store.get_payload(p.pid)?,
            };
            let Some(payload) = payload else {
                // Purged or deleted since it was leased.
                continue;
            };
            out.push(Delivery {
                queue: queue.to_string(),
                message_id: p.meta.message_id.clone(),
                body: payload.body,
                properties: payload.properties,
                ack_token: p.token.map(|t| t.to_string()),
                delivery_count: p.meta.delivery_count,
                published_at: payload.published_at,
                first_delivered_at: p.meta.first_delivered_at,
                enqueued_at: p.meta.enqueued_at,
                expires_at: p.meta.expires_at,
                lease_deadline: p.deadline,
                group_id: p.meta.group.clone(),
                dead_letters: persist::dead_letters(&p.meta),
                attempts: persist::attempts(&p.meta),
            });
            let _ = p.qid;
        }
        durable(commit).await?;
        Ok(out)
    }

    /// Acknowledges deliveries: each message is deleted for good.
    pub async fn ack(&self, tokens: &[String]) -> Result<Vec<Settled>> {
        let (results, commit) = self.ack_begin(tokens)?;
        durable(commit).await?;
        Ok(results)
    }

    /// The decision of [`Broker::ack`], without waiting for it to be
    /// durable: the caller waits for the commit before it answers. A
    /// subscription uses it to lease its next message before that wait, so
    /// that the ack and the lease share one `fdatasync`.
    pub(crate) fn ack_begin(
        &self,
        tokens: &[String],
    ) -> Result<(Vec<Settled>, Option<crate::storage::Commit>)> {
        validate::batch("ack_tokens", tokens.len())?;
        let parsed = parse_tokens("ack_tokens", tokens.iter().map(String::as_str))?;
        let now = self.now();
        let mut st = self.lock();
        let mut change = Change::default();
        let results = self.ack_in(&mut st, &parsed, tokens, now, &mut change)?;
        let commit = self.submit(&st, change);
        Ok((results, commit))
    }

    /// Acknowledges the deliveries of `parsed` (whose texts are `tokens`)
    /// under the lock, into `change`: one outcome per token, in order.
    fn ack_in(
        &self,
        st: &mut State,
        parsed: &[AckToken],
        tokens: &[String],
        now: u64,
        change: &mut Change,
    ) -> Result<Vec<Settled>> {
        let mut results = Vec::with_capacity(parsed.len());
        for (t, text) in parsed.iter().zip(tokens) {
            if let Err(why) = current_lease(st, t, now) {
                results.push(Settled::LeaseExpired(format!(
                    "lease expired: token {text} {why}"
                )));
                continue;
            }
            let State { queues, timers, .. } = &mut *st;
            let Some(q) = queues.get_mut(&t.qid) else {
                continue;
            };
            if let Some((_, pid)) = q.remove(t.pos, timers) {
                if !q.client_ids.is_empty() {
                    let meta = self.meta(t.qid, t.pos)?;
                    forget_client_id(q, &meta);
                }
                change.txn.delete(Key::Meta(t.qid, t.pos));
                change.txn.delete(Key::Payload(pid));
                q.counters.acked += 1;
                change.touch(t.qid);
                change.wake(t.qid);
            }
            results.push(Settled::Ok { deadline: 0 });
        }
        Ok(results)
    }

    /// Rejects deliveries: each counts as a failed attempt.
    pub async fn nack(&self, items: &[Nack]) -> Result<Vec<Settled>> {
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
        let now = self.now();
        let (results, commit) = {
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
            let mut change = Change::default();
            let mut results = Vec::with_capacity(items.len());
            for (t, n) in parsed.iter().zip(items) {
                if let Err(why) = current_lease(&st, t, now) {
                    results.push(Settled::LeaseExpired(format!(
                        "lease expired: token {} {why}",
                        n.token
                    )));
                    continue;
                }
                let outcome = if n.dead_letter {
                    AttemptOutcome::Rejected
                } else {
                    AttemptOutcome::Nacked
                };
                self.end_lease(
                    &mut st,
                    t.qid,
                    t.pos,
                    now,
                    outcome,
                    &n.reason,
                    n.delay,
                    &mut change,
                )?;
                results.push(Settled::Ok { deadline: 0 });
            }
            (results, self.submit(&st, change))
        };
        durable(commit).await?;
        Ok(results)
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
        let now = self.now();
        let (results, commit) = {
            let mut st = self.lock();
            let mut change = Change::default();
            let mut results = Vec::with_capacity(items.len());
            for (t, (text, timeout)) in parsed.iter().zip(items) {
                if let Err(why) = current_lease(&st, t, now) {
                    results.push(Settled::LeaseExpired(format!(
                        "lease expired: token {text} {why}"
                    )));
                    continue;
                }
                let mut meta = self.meta(t.qid, t.pos)?;
                let State { queues, timers, .. } = &mut *st;
                let Some(q) = queues.get_mut(&t.qid) else {
                    continue;
                };
                let Some(lease) = meta.lease.as_mut() else {
                    results.push(Settled::LeaseExpired(format!(
                        "lease expired: token {text} is not leased"
                    )));
                    continue;
                };
                let deadline = (now + timeout).min(lease.started + q.config.max_lease_total);
                lease.deadline = deadline;
                q.set_deadline(t.pos, deadline, timers);
                change.txn.put_meta(t.qid, t.pos, &meta);
                results.push(Settled::Ok { deadline });
            }
            (results, self.submit(&st, change))
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
            message_id: meta.message_id,
            deadline: e.due(),
        }))
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
        let parsed: Vec<AckToken> = tokens
            .iter()
            .filter_map(|t| AckToken::parse("ack_token", t).ok())
            .collect();
        if parsed.is_empty() {
            return Ok(0);
        }
        let now = self.now();
        let (n, commit) = {
            let mut st = self.lock();
            let mut change = Change::default();
            let mut n = 0;
            for t in &parsed {
                if current_lease(&st, t, now).is_ok() {
                    self.end_lease(
                        &mut st,
                        t.qid,
                        t.pos,
                        now,
                        AttemptOutcome::StreamClosed,
                        "",
                        Some(0),
                        &mut change,
                    )?;
                    n += 1;
                }
            }
            (n, self.submit(&st, change))
        };
        durable(commit).await?;
        Ok(n)
    }
}

/// Parses every token of a request before anything is done.
fn parse_tokens<'a>(field: &str, tokens: impl Iterator<Item = &'a str>) -> Result<Vec<AckToken>> {
    tokens
        .enumerate()
        .map(|(i, t)| AckToken::parse(&format!("{field}[{i}]"), t))
        .collect()
}

/// Checks that a token is the current, unexpired lease of its message.
fn current_lease(st: &State, t: &AckToken, now: u64) -> std::result::Result<(), &'static str> {
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
pub(crate) fn forget_client_id(q: &mut QueueState, meta: &crate::storage::records::MetaRecord) {
    if meta.client_id {
        q.client_ids.remove(&meta.message_id);
    }
}
