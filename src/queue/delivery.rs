//! Delivery: receive (long poll, auto-ack), ack, nack, extend.
//!
//! A lease is granted in the same record that raises the delivery count,
//! so counts are exact across crashes. Tokens carry the lease's epoch (the
//! delivery count at the grant); a settle call whose token is not the
//! current, unexpired lease fails for that token and changes nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::faults::{self, Fault};
use crate::storage::Key;
use crate::storage::records::PayloadRecord;

use super::error::{QueueError, Result};
use super::message::Message;
use super::model::{
    AttemptOutcome, DeadLetterReason, Delivery, LeaseEnd, LeasedMessage, Nack, ReceiveOptions,
    Released, Settled,
};
use super::state::{EntryState, QueueState};
use super::token::AckToken;
use super::{Broker, Change, State, durable, persist, validate};

/// Bytes counted per delivery besides its body, for the response budget.
const DELIVERY_OVERHEAD: u64 = 512;

/// A leased (or auto-acked) message waiting for its payload to be read.
struct Picked {
    qid: u32,
    /// Its queue is a FIFO queue.
    fifo: bool,
    pid: u64,
    token: Option<AckToken>,
    meta: Message,
    deadline: u64,
    /// Auto-ack: the payload, read before it was deleted.
    payload: Option<crate::storage::records::PayloadRecord>,
}

/// Auto-ack: the bodies of the messages a receive is about to take, read
/// before it takes the lock (payload number → the body, or what is wrong
/// with it), so that no payload is read under the lock.
type PreRead = HashMap<u64, std::result::Result<Option<PayloadRecord>, String>>;

/// What became of one message a receive chose.
enum Taken {
    /// Leased, or auto-acked with its body.
    Leased(Box<Picked>),
    /// Auto-ack: its body is damaged; set aside.
    SetAside,
    /// Auto-ack: its body was not read beforehand; left ready.
    NotRead,
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
        self.check_floor()?;
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
        let mut acked = None;
        // Auto-ack turns in a row that found only messages not read
        // beforehand; past a few, wait for a change like any empty turn.
        const MAX_MISSES: u32 = 16;
        let mut misses = 0;
        loop {
            let mut preread = if opts.auto_ack {
                self.pre_read(queue, max, &opts)?
            } else {
                PreRead::new()
            };
            let (picked, missed, commit, mut wake) = {
                let mut st = self.lock();
                let qid = st.qid(queue)?;
                let q = st.queue(qid)?;
                let timeout = match opts.ack_timeout {
                    // A lease that ends at once: the message is counted as
                    // delivered and is visible again (SQS's receive with
                    // VisibilityTimeout=0).
                    Some(0) => 0,
                    Some(t) => {
                        validate::lease_length("ack_timeout_ms", t, q.config.max_lease_total)?;
                        t
                    }
                    None => q.config.ack_timeout,
                };
                let wake = q.wake.subscribe();
                let mut change = Change::default();
                if !parsed.is_empty() {
                    // The first turn only: the acks, submitted before the
                    // pick. Acking first ends the leases that ran out
                    // (`catch_up`), which can move a message into this
                    // very queue; the pick reads what it leases from the
                    // store, which sees a change once it is submitted.
                    // The pick's change commits after this one.
                    let now = self.now();
                    settled = self.ack_in(&mut st, &parsed, acks, now, &mut change)?;
                    parsed.clear();
                    acked = self.submit(&st, std::mem::take(&mut change));
                }
                let (picked, missed) =
                    self.pick(&mut st, qid, max, &opts, timeout, &mut preread, &mut change)?;
                (picked, missed, self.submit(&st, change), wake)
            };
            durable(acked.take()).await?;
            if !picked.is_empty() {
                let out = self.deliver(queue, picked, commit).await?;
                if !out.is_empty() {
                    return Ok((settled, out));
                }
                // All it picked was set aside (damaged bodies) or purged
                // meanwhile: those are out of the way now; pick again.
                continue;
            }
            durable(commit).await?;
            if missed && misses < MAX_MISSES {
                // Auto-ack: ready messages whose bodies were not read
                // beforehand (they became ready meanwhile); read and pick
                // again.
                misses += 1;
                continue;
            }
            misses = 0;
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
    #[allow(clippy::too_many_arguments)]
    fn pick(
        &self,
        st: &mut State,
        qid: u32,
        max: u32,
        opts: &ReceiveOptions,
        timeout: u64,
        preread: &mut PreRead,
        change: &mut Change,
    ) -> Result<(Vec<Picked>, bool)> {
        let now = self.now();
        let max = usize::try_from(max).unwrap_or(10);
        let per_group = usize::try_from(opts.max_per_group).unwrap_or(usize::MAX);
        let auto_ack = opts.auto_ack;
        // Leases that ran out and the sweeper has not ended yet end first,
        // so that their messages can be picked (a lease of 0 ms ends at
        // once).
        self.catch_up(st, now, change)?;
        let mut picked: Vec<Picked> = Vec::new();
        let mut used = 0u64;
        // FIFO groups whose message was set aside (a damaged body, auto-ack
        // only): the rest of the group waits behind it.
        let mut blocked: Vec<u32> = Vec::new();
        // Auto-ack: a ready message whose body was not read beforehand.
        let mut missed = false;
        loop {
            let q = st.queue(qid)?;
            let budget = self.opts.max_response_bytes.saturating_sub(used);
            if !picked.is_empty() && budget == 0 {
                break;
            }
            let candidates =
                q.deliverable(max - picked.len(), budget, DELIVERY_OVERHEAD, per_group);
            if candidates.is_empty() {
                break;
            }
            let mut expired_any = false;
            for pos in candidates {
                let q = st.queue(qid)?;
                let Some(e) = q.msgs.get(pos) else { continue };
                let group = e.group();
                if q.fifo.is_some() && blocked.contains(&group) {
                    continue;
                }
                if e.expires_at() <= now {
                    self.expire(st, qid, pos, now, change)?;
                    expired_any = true;
                    continue;
                }
                used += u64::from(e.size()) + DELIVERY_OVERHEAD;
                let read = if auto_ack { Some(&mut *preread) } else { None };
                match self.lease_one(st, qid, pos, now, timeout, read, change)? {
                    Taken::Leased(p) => picked.push(*p),
                    Taken::SetAside => blocked.push(group),
                    Taken::NotRead => {
                        missed = true;
                        blocked.push(group);
                    }
                }
            }
            if !expired_any || picked.len() >= max {
                break;
            }
        }
        Ok((picked, missed))
    }

    /// Auto-ack: reads the bodies of the messages a pick would take now,
    /// outside the lock (the positions are chosen under it, the records
    /// and bodies read after). What the pick then takes uses these; a
    /// message it finds without one is left for the next turn.
    fn pre_read(&self, queue: &str, max: u32, opts: &ReceiveOptions) -> Result<PreRead> {
        let max = usize::try_from(max).unwrap_or(10);
        let per_group = usize::try_from(opts.max_per_group).unwrap_or(usize::MAX);
        let (qid, positions) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let q = st.queue(qid)?;
            let budget = self.opts.max_response_bytes;
            (
                qid,
                q.deliverable(max, budget, DELIVERY_OVERHEAD, per_group),
            )
        };
        let mut pids = Vec::with_capacity(positions.len());
        for pos in positions {
            if let Some(meta) = persist::get(&self.store, qid, pos)? {
                pids.push(meta.pid());
            }
        }
        let mut read = PreRead::new();
        if pids.is_empty() {
            return Ok(read);
        }
        for (pid, body) in pids.iter().copied().zip(self.store.get_payloads(&pids)?) {
            let body = match body {
                Ok(p) => Ok(p),
                Err(e) if e.is_corrupt() => Err(e.to_string()),
                Err(e) => return Err(e.into()),
            };
            read.insert(pid, body);
        }
        Ok(read)
    }

    /// Leases one ready message, or auto-acks it when given the bodies
    /// read beforehand: an auto-ack whose body is damaged sets it aside
    /// instead ([`Broker::set_aside`]); one whose body was not read leaves
    /// it as it is.
    #[allow(clippy::too_many_arguments)]
    fn lease_one(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        now: u64,
        timeout: u64,
        preread: Option<&mut PreRead>,
        change: &mut Change,
    ) -> Result<Taken> {
        // As this receive's change leaves it: its `catch_up` may have
        // ended the message's lease a moment ago.
        let Some(mut meta) = self.meta_in(change, qid, pos)? else {
            return Ok(Taken::NotRead);
        };
        let body = match preread {
            Some(read) => match read.remove(&meta.pid()) {
                Some(body) => Some(body),
                None => return Ok(Taken::NotRead),
            },
            None => None,
        };
        let State { queues, timers, .. } = st;
        let q = queues
            .get_mut(&qid)
            .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
        let fifo = q.fifo.is_some();
        if let Some(body) = body {
            let payload = match body {
                Ok(p) => p,
                Err(why) => {
                    self.set_aside(st, qid, pos, &why, now, change)?;
                    return Ok(Taken::SetAside);
                }
            };
            meta.take(now)?;
            q.remove(pos, timers);
            forget_client_id(q, &meta);
            change.txn.delete(Key::Meta(qid, pos));
            change.txn.delete(Key::Payload(meta.pid()));
            q.counters.acked += 1;
            change.touch(qid);
            return Ok(Taken::Leased(Box::new(Picked {
                qid,
                fifo,
                pid: meta.pid(),
                token: None,
                meta,
                deadline: 0,
                payload,
            })));
        }
        let deadline = now + timeout;
        let epoch = meta.lease(now, deadline)?;
        if faults::on(Fault::NoDeliveryCount) {
            persist::put_unlogged(&mut change.txn, qid, pos, &meta);
        } else {
            persist::put(&mut change.txn, qid, pos, &meta);
        }
        q.lease(pos, deadline, epoch, timers);
        Ok(Taken::Leased(Box::new(Picked {
            qid,
            fifo,
            pid: meta.pid(),
            token: Some(AckToken { qid, pos, epoch }),
            meta,
            deadline,
            payload: None,
        })))
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
        // The bodies not read beforehand, read together (one round trip
        // on a backend whose reads are round trips).
        let unread: Vec<u64> = picked
            .iter()
            .filter(|p| p.payload.is_none())
            .map(|p| p.pid)
            .collect();
        let mut bodies: HashMap<u64, crate::storage::Result<Option<PayloadRecord>>> =
            if unread.is_empty() {
                HashMap::new()
            } else {
                unread
                    .iter()
                    .copied()
                    .zip(self.store.get_payloads(&unread)?)
                    .collect()
            };
        let mut out = Vec::with_capacity(picked.len());
        // Leases of damaged bodies, and of the later messages of their
        // FIFO groups, taken back instead of delivered.
        // (token, what is wrong, its FIFO group)
        let mut damaged: Vec<(AckToken, String, Option<String>)> = Vec::new();
        let mut held_back: Vec<AckToken> = Vec::new();
        for p in picked {
            if p.fifo
                && let Some(t) = p.token
                && damaged
                    .iter()
                    .any(|(d, _, group)| d.qid == p.qid && group.as_deref() == p.meta.group())
            {
                held_back.push(t);
                continue;
            }
            let payload = match p.payload {
                Some(payload) => Some(payload),
                None => match bodies.remove(&p.pid).unwrap_or(Ok(None)) {
                    Ok(payload) => payload,
                    Err(e) if e.is_corrupt() => {
                        if let Some(t) = p.token {
                            damaged.push((t, e.to_string(), p.meta.group().map(str::to_string)));
                        }
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            let Some(payload) = payload else {
                // Purged or deleted since it was leased.
                continue;
            };
            out.push(Delivery {
                queue: queue.to_string(),
                message_id: p.meta.id().to_string(),
                body: payload.body,
                properties: payload.properties,
                ack_token: p.token.map(|t| t.to_string()),
                delivery_count: p.meta.delivery_count(),
                published_at: payload.published_at,
                first_delivered_at: p.meta.first_delivered_at(),
                enqueued_at: p.meta.enqueued_at(),
                expires_at: p.meta.expires_at(),
                lease_deadline: p.deadline,
                group_id: p.meta.group().map(str::to_string),
                dead_letters: p.meta.dead_letters().to_vec(),
                attempts: p.meta.attempts().to_vec(),
            });
        }
        let taken_back = if damaged.is_empty() {
            None
        } else {
            self.take_back(&damaged, &held_back)?
        };
        durable(commit).await?;
        durable(taken_back).await?;
        Ok(out)
    }

    /// Takes back leases this receive granted but does not hand out: the
    /// damaged messages are set aside, the held-back ones (later in a
    /// damaged message's FIFO group) are ready again, neither counted as
    /// a delivery. Leases no longer current (a purge meanwhile) are left.
    fn take_back(
        &self,
        damaged: &[(AckToken, String, Option<String>)],
        held_back: &[AckToken],
    ) -> Result<Option<crate::storage::Commit>> {
        let now = self.now();
        let mut st = self.lock();
        let mut change = Change::default();
        for (t, why, _) in damaged {
            if current_lease(&st, t, now).is_ok() {
                self.set_aside(&mut st, t.qid, t.pos, why, now, &mut change)?;
            }
        }
        for t in held_back {
            if current_lease(&st, t, now).is_ok() {
                let meta = self.unlease(&mut st, t.qid, t.pos, now)?;
                persist::put(&mut change.txn, t.qid, t.pos, &meta);
                self.make_ready_again(&mut st, t.qid, t.pos, now, now, meta.leases());
                change.wake(t.qid);
            }
        }
        Ok(self.submit(&st, change))
    }

    /// A message whose current lease (or auto-ack pick) is being taken
    /// back before anything was handed out ([`Message::take_back`]).
    fn unlease(&self, st: &mut State, qid: u32, pos: u64, now: u64) -> Result<Message> {
        let mut meta = self.meta(qid, pos)?;
        let leased = st
            .queue(qid)?
            .msgs
            .get(pos)
            .is_some_and(|e| e.state() == EntryState::Leased);
        if leased {
            meta.take_back(now);
        }
        Ok(meta)
    }

    /// Puts a leased or ready message back as ready (or delayed until
    /// `visible_at`), its entry's epoch `epoch`.
    fn make_ready_again(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        visible_at: u64,
        now: u64,
        epoch: u32,
    ) {
        let State { queues, timers, .. } = st;
        let Some(q) = queues.get_mut(&qid) else {
            return;
        };
        if q.msgs
            .get(pos)
            .is_some_and(|e| e.state() == EntryState::Ready)
        {
            // Through a lease, the one transition out of ready.
            q.lease(pos, now, epoch, timers);
        }
        q.release(pos, visible_at, now, timers);
        if let Some(e) = q.msgs.get_mut(pos) {
            e.set_epoch(epoch);
        }
    }

    /// A message whose stored body is damaged (found when it was about to
    /// be delivered) is not delivered and its read is not counted: it moves
    /// to its queue's dead letter queue with reason CORRUPTED (the note
    /// says what was wrong), or, without one, waits an hour before it is
    /// tried again, so that it is neither lost nor in the way of the
    /// queue's healthy messages (in a FIFO group, the group waits behind
    /// it: order is not skipped silently). Logged, and counted by
    /// `letterbox_corrupt_records_found`.
    pub(crate) fn set_aside(
        &self,
        st: &mut State,
        qid: u32,
        pos: u64,
        why: &str,
        now: u64,
        change: &mut Change,
    ) -> Result<()> {
        let mut meta = self.unlease(st, qid, pos, now)?;
        self.note_corrupt();
        let q = st.queue(qid)?;
        tracing::error!(queue = %q.name, message_id = %meta.id(), error = %why,
            "a stored message body is damaged; it was not delivered");
        if q.config.dead_letter.is_some() {
            match self.dead_letter(
                st,
                qid,
                pos,
                meta.clone(),
                DeadLetterReason::Corrupted,
                why,
                now,
                change,
            ) {
                Err(QueueError::FailedPrecondition(_)) => {} // its DLQ is gone
                done => return done,
            }
        }
        meta.visible_from(now + super::model::HOUR)?;
        persist::put(&mut change.txn, qid, pos, &meta);
        self.make_ready_again(st, qid, pos, meta.visible_at(), now, meta.leases());
        Ok(())
    }

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
        let mut change = Change::default();
        let results = self.ack_in(&mut st, &parsed, tokens, now, &mut change)?;
        let commit = self.submit(&st, change);
        Ok((results, super::Pending::new(commit)))
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
        self.catch_up(st, now, change)?;
        let mut results = Vec::with_capacity(parsed.len());
        for (t, text) in parsed.iter().zip(tokens) {
            if let Err(why) = current_lease(st, t, now) {
                results.push(self.not_current(st, t, text, why, change)?);
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
            let mut change = Change::default();
            self.catch_up(&mut st, now, &mut change)?;
            let mut results = Vec::with_capacity(items.len());
            for (t, n) in parsed.iter().zip(items) {
                if let Err(why) = current_lease(&st, t, now) {
                    results.push((self.not_current(&st, t, &n.token, why, &mut change)?, None));
                    continue;
                }
                let outcome = if n.dead_letter {
                    AttemptOutcome::Rejected
                } else {
                    AttemptOutcome::Nacked
                };
                let end = self.end_lease(
                    &mut st,
                    t.qid,
                    t.pos,
                    now,
                    outcome,
                    &n.reason,
                    n.delay,
                    &mut change,
                )?;
                results.push((Settled::Ok { deadline: 0 }, Some(end)));
            }
            let released = std::mem::take(&mut change.released);
            (results, released, self.submit(&st, change))
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
            let mut change = Change::default();
            self.catch_up(&mut st, now, &mut change)?;
            let mut results = Vec::with_capacity(items.len());
            for (t, (text, timeout)) in parsed.iter().zip(items) {
                if let Err(why) = current_lease(&st, t, now) {
                    results.push(self.not_current(&st, t, text, why, &mut change)?);
                    continue;
                }
                let mut meta = self.meta(t.qid, t.pos)?;
                let State { queues, timers, .. } = &mut *st;
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
                q.set_deadline(t.pos, deadline, timers);
                persist::put(&mut change.txn, t.qid, t.pos, &meta);
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
        // fails and releases the later ones, uncounted (SPEC §3).
        parsed.sort_by_key(|t| (t.qid, t.pos));
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

impl Broker {
    /// Ends the leases that ran out before `now` and the sweeper has not
    /// ended yet (it runs every 50 ms), in the settling call's transaction:
    /// a FIFO message whose lease ran out releases the later ones of its
    /// group first, so that none of them can be acked in that gap ahead
    /// of its redelivery (SPEC §3). Free when nothing is due.
    fn catch_up(&self, st: &mut State, now: u64, change: &mut Change) -> Result<()> {
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
            .leases()
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
pub(crate) fn forget_client_id(q: &mut QueueState, meta: &Message) {
    if meta.client_id() {
        q.client_ids.remove(meta.id());
    }
}
