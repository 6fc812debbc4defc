//! Receiving: leasing (or, auto-ack, taking) messages, long polls, acks
//! riding on a receive, and what a receive does with a damaged body.
//!
//! A lease is granted in the same record that raises the delivery count,
//! so counts are exact across crashes. The token it hands out carries the
//! lease's epoch (the delivery count at the grant; see `delivery.rs` for
//! settling).

use std::collections::HashMap;
use std::time::Duration;

use crate::faults::{self, Fault};
use crate::storage::Key;
use crate::storage::records::PayloadRecord;

use super::delivery::{current_lease, forget_client_id, parse_tokens};
use super::error::{QueueError, Result};
use super::message::Message;
use super::model::{AckedReceive, DeadLetterReason, Delivery, ReceiveOptions, Settled};
use super::state::EntryState;
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

/// The acks riding on a receive.
struct Riding<'a> {
    /// The tokens, parsed; emptied once decided.
    parsed: Vec<AckToken>,
    /// The tokens as given.
    texts: &'a [String],
    /// Their outcomes, once durable.
    durable: Option<Vec<Settled>>,
}

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
        self.receive_acking(queue, opts, &[]).await?.received
    }

    /// [`Broker::receive`] that first acknowledges earlier deliveries, as
    /// [`Broker::ack`] does, in the same transaction as the new leases: a
    /// consumer that takes one message at a time pays for one call and one
    /// `fdatasync` per message instead of two. Nothing changes unless every
    /// argument is valid; if no message is ready, the acks are made
    /// durable before the wait.
    ///
    /// An error fails the whole call only while the acks have not taken
    /// effect (nothing changed), or when their own write failed (their
    /// outcome is then unknown, as after a failed [`Broker::ack`]). Once
    /// they are durable, the answer carries their outcomes, one per token
    /// in order, and the receive's own result: the deliveries, or why the
    /// receive failed after the acks.
    pub async fn receive_acking(
        &self,
        queue: &str,
        opts: ReceiveOptions,
        acks: &[String],
    ) -> Result<AckedReceive> {
        self.check_floor()?;
        let parsed = if acks.is_empty() {
            Vec::new()
        } else {
            validate::batch("ack_tokens", acks.len())?;
            parse_tokens("ack_tokens", acks.iter().map(String::as_str))?
        };
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
        let mut riding = Riding {
            parsed,
            texts: acks,
            durable: None,
        };
        let received = self.receive_turns(queue, opts, max, &mut riding).await;
        match riding.durable {
            Some(acks) => Ok(AckedReceive { acks, received }),
            None => Ok(AckedReceive {
                acks: Vec::new(),
                received: Ok(received?),
            }),
        }
    }

    /// The turns of a receive: pick, or wait for a message to become
    /// ready and pick again. The first turn decides the acks riding on it
    /// first (`riding`); once they are durable, their outcomes are in
    /// `riding.durable`, and what this returns is the receive's alone.
    async fn receive_turns(
        &self,
        queue: &str,
        opts: ReceiveOptions,
        max: u32,
        riding: &mut Riding<'_>,
    ) -> Result<Vec<Delivery>> {
        let give_up = self.clock.monotonic() + Duration::from_millis(opts.wait);
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
            let mut acked = None;
            let (picked, mut wake) = {
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
                if !riding.parsed.is_empty() {
                    // The first turn only: the acks, submitted before the
                    // pick. Acking first ends the leases that ran out
                    // (`catch_up`), which can move a message into this
                    // very queue; the pick reads what it leases from the
                    // store, which sees a change once it is submitted.
                    // The pick's change commits after this one.
                    let now = self.now();
                    let (parsed, texts) = (&riding.parsed, riding.texts);
                    acked = Some(self.decide(&mut st, |st, change| {
                        self.ack_in(st, parsed, texts, now, change)
                    })?);
                    riding.parsed.clear();
                }
                // A pick that fails leaves the acks submitted: they are
                // made durable and reported below, before its error.
                let picked = self.decide(&mut st, |st, change| {
                    self.pick(st, qid, max, &opts, timeout, &mut preread, change)
                });
                (picked, wake)
            };
            if let Some((results, commit)) = acked {
                durable(commit).await?;
                riding.durable = Some(results);
            }
            let ((picked, missed), commit) = picked?;
            if !picked.is_empty() {
                let out = self.deliver(queue, picked, commit).await?;
                if !out.is_empty() {
                    return Ok(out);
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
            let left = give_up.saturating_duration_since(self.clock.monotonic());
            if left.is_zero() || self.is_closing() {
                return Ok(Vec::new());
            }
            // Woken when a message may have become ready; otherwise the
            // wait runs out.
            if tokio::time::timeout(left, wake.changed()).await.is_err() {
                return Ok(Vec::new());
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
        let State {
            queues,
            timers,
            undo,
            ..
        } = st;
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
            q.remove(pos, timers, undo);
            forget_client_id(q, &meta, undo);
            change.txn.delete(Key::Meta(qid, pos));
            change.txn.delete(Key::Payload(meta.pid()));
            q.counters_mut(undo).acked += 1;
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
        q.lease(pos, deadline, epoch, timers, undo);
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
                failed_attempts: p.meta.failed_attempts(),
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
        let ((), commit) = self.decide(&mut st, |st, change| {
            for (t, why, _) in damaged {
                if current_lease(st, t, now).is_ok() {
                    self.set_aside(st, t.qid, t.pos, why, now, change)?;
                }
            }
            for t in held_back {
                if current_lease(st, t, now).is_ok() {
                    let meta = self.unlease(st, t.qid, t.pos, now)?;
                    persist::put(&mut change.txn, t.qid, t.pos, &meta);
                    self.make_ready_again(st, t.qid, t.pos, now, now, meta.delivery_count());
                    change.wake(t.qid);
                }
            }
            Ok(())
        })?;
        Ok(commit)
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
        let State {
            queues,
            timers,
            undo,
            ..
        } = st;
        let Some(q) = queues.get_mut(&qid) else {
            return;
        };
        if q.msgs
            .get(pos)
            .is_some_and(|e| e.state() == EntryState::Ready)
        {
            // Through a lease, the one transition out of ready.
            q.lease(pos, now, epoch, timers, undo);
        }
        q.release(pos, visible_at, now, timers, undo);
        q.set_epoch(pos, epoch, undo);
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
        self.make_ready_again(st, qid, pos, meta.visible_at(), now, meta.delivery_count());
        Ok(())
    }
}
