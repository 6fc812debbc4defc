//! Queue administration: create, get, list, update, delete, purge, stats,
//! browse.

use crate::storage::{Key, SysKey};

use super::error::{QueueError, Result};
use super::model::{
    BrowsePage, BrowsedMessage, MessageState, QueueConfig, QueueConfigInput, QueueInfo,
    QueueRemovals, QueueStats,
};
use super::state::{EntryState, QueueState};
use super::{Broker, State, durable, persist, validate};

/// Messages deleted per transaction by purge and delete.
const CHUNK: usize = 4096;

impl Broker {
    /// Creates a queue; `Ok((info, false))` when an identical one exists.
    pub async fn create_queue(
        &self,
        name: &str,
        input: &QueueConfigInput,
    ) -> Result<(QueueInfo, bool)> {
        self.create_queue_annotated(name, input, Vec::new()).await
    }

    /// [`Broker::create_queue`] with the queue's annotations (string pairs
    /// a front end keeps with it, written in the same transaction). An
    /// existing queue with the same configuration is answered as it is,
    /// its annotations unchanged.
    pub async fn create_queue_annotated(
        &self,
        name: &str,
        input: &QueueConfigInput,
        annotations: Vec<(String, String)>,
    ) -> Result<(QueueInfo, bool)> {
        validate::name("name", name)?;
        let config = validate::new_config(input)?;
        let annotations = super::annotations::checked(annotations)?;
        let now = self.now();
        let commit = {
            let mut st = self.lock();
            if let Some(&qid) = st.names.get(name) {
                let existing = st.queue(qid)?;
                if existing.config == config {
                    return Ok((info(&st, qid)?, false));
                }
                let (detail, differ) = describe_difference(&existing.config, &config);
                return Err(QueueError::AlreadyExists {
                    kind: "queue",
                    name: name.to_string(),
                    detail,
                    differ,
                });
            }
            check_dead_letter(&st, name, &config)?;
            // Everything checked: nothing below fails.
            let ((), commit) = self.decide(&mut st, |st, change| {
                let qid = st.next_qid;
                st.next_qid += 1;
                change.txn.put_sys(SysKey::NextQid, u64::from(st.next_qid));
                change
                    .txn
                    .put_queue(name, &persist::queue_record(qid, now, &config));
                if !annotations.is_empty() {
                    super::annotations::put(change, qid, &annotations);
                }
                change.touch(qid);
                if let Some(dl) = &config.dead_letter {
                    st.dlq_sources
                        .entry(dl.queue.clone())
                        .or_default()
                        .insert(name.to_string());
                }
                st.names.insert(name.to_string(), qid);
                let mut q = QueueState::new(qid, name.to_string(), config, now);
                q.annotations = annotations;
                st.queues.insert(qid, q);
                Ok(())
            })?;
            commit
        };
        durable(commit).await?;
        let st = self.lock();
        let qid = st.qid(name)?;
        Ok((info(&st, qid)?, true))
    }

    /// Describes one queue.
    pub fn get_queue(&self, name: &str) -> Result<QueueInfo> {
        let st = self.lock();
        let qid = st.qid(name)?;
        info(&st, qid)
    }

    /// Lists queues in name order after `after`, with an optional prefix.
    pub fn list_queues(
        &self,
        prefix: &str,
        page_size: u32,
        after: Option<&str>,
    ) -> Result<(Vec<QueueInfo>, Option<String>)> {
        let size = validate::page_size("page_size", page_size)?;
        let st = self.lock();
        let start = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let mut out = Vec::new();
        let mut more = false;
        for (name, &qid) in st
            .names
            .range::<str, _>((start, std::ops::Bound::Unbounded))
            .filter(|(n, _)| n.starts_with(prefix))
        {
            if out.len() == size {
                more = true;
                break;
            }
            let _ = name;
            out.push(info(&st, qid)?);
        }
        let next = if more {
            out.last().map(|q| q.name.clone())
        } else {
            None
        };
        Ok((out, next))
    }

    /// Changes a queue's configuration.
    pub async fn update_queue(
        &self,
        name: &str,
        input: &QueueConfigInput,
        removals: QueueRemovals,
    ) -> Result<QueueInfo> {
        self.update_queue_annotated(name, input, removals, &[])
            .await
    }

    /// [`Broker::update_queue`] that also changes the queue's annotations,
    /// in the same transaction (applied to them as they are then).
    pub async fn update_queue_annotated(
        &self,
        name: &str,
        input: &QueueConfigInput,
        removals: QueueRemovals,
        annotations: &[super::annotations::AnnotationChange],
    ) -> Result<QueueInfo> {
        validate::name("name", name)?;
        let commit = {
            let mut st = self.lock();
            let qid = st.qid(name)?;
            let q = st.queue(qid)?;
            let config = validate::updated_config(&q.config, input, removals)?;
            let created_at = q.created_at;
            check_dead_letter(&st, name, &config)?;
            let q = st.queue(qid)?;
            let pairs = (!annotations.is_empty())
                .then(|| super::annotations::applied(&q.annotations, annotations))
                .transpose()?;
            let old_dl = q.config.dead_letter.clone();
            // Everything checked: nothing below fails.
            let ((), commit) = self.decide(&mut st, |st, change| {
                if let Some(q) = st.queues.get_mut(&qid) {
                    q.config = config.clone();
                    if let Some(a) = pairs {
                        super::annotations::put(change, qid, &a);
                        q.annotations = a;
                    }
                }
                if let Some(dl) = old_dl
                    && let Some(s) = st.dlq_sources.get_mut(&dl.queue)
                {
                    s.remove(name);
                }
                if let Some(dl) = &config.dead_letter {
                    st.dlq_sources
                        .entry(dl.queue.clone())
                        .or_default()
                        .insert(name.to_string());
                }
                change
                    .txn
                    .put_queue(name, &persist::queue_record(qid, created_at, &config));
                change.wake(qid);
                Ok(())
            })?;
            commit
        };
        durable(commit).await?;
        self.get_queue(name)
    }

    /// Deletes a queue and its messages; returns how many messages went.
    pub async fn delete_queue(&self, name: &str, force: bool) -> Result<u64> {
        validate::name("name", name)?;
        let (qid, commit) = {
            let mut st = self.lock();
            let qid = st.qid(name)?;
            let sources: Vec<String> = st
                .dlq_sources
                .get(name)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            if !sources.is_empty() && !force {
                return Err(QueueError::FailedPrecondition(format!(
                    "queue {name:?} is the dead letter queue of {}; detach it first or delete with force",
                    sources.join(", ")
                )));
            }
            let own_dl = st.queue(qid)?.config.dead_letter.clone();
            // Everything checked: nothing below fails.
            let ((), commit) = self.decide(&mut st, |st, change| {
                // Detach the sources: they lose their dead letter queue.
                for src in &sources {
                    let Some(sq) = st.names.get(src).and_then(|q| st.queues.get_mut(q)) else {
                        continue;
                    };
                    sq.config.dead_letter = None;
                    sq.config.dead_letter_on_expiry = false;
                    let rec = persist::queue_record(sq.qid, sq.created_at, &sq.config);
                    change.txn.put_queue(src, &rec);
                }
                st.dlq_sources.remove(name);
                if let Some(dl) = own_dl
                    && let Some(s) = st.dlq_sources.get_mut(&dl.queue)
                {
                    s.remove(name);
                }
                change.txn.delete(Key::Queue(name));
                change.txn.delete(Key::Counters(qid));
                change.txn.delete(Key::Annotations(qid));
                super::exchange::unbind_everywhere(st, name, change);
                st.names.remove(name);
                Ok(())
            })?;
            (qid, commit)
        };
        durable(commit).await?;
        // The queue is gone for every caller; now drop its messages in
        // chunks (a crash in between leaves orphans that the next start
        // deletes).
        let deleted = self.drop_messages(qid, u64::MAX, true).await?;
        let mut st = self.lock();
        if let Some(q) = st.queues.remove(&qid) {
            q.wake();
        }
        Ok(deleted)
    }

    /// Deletes every message of a queue; returns how many.
    pub async fn purge_queue(&self, name: &str) -> Result<u64> {
        validate::name("name", name)?;
        let (qid, upto) = {
            let st = self.lock();
            (st.qid(name)?, st.next_pos)
        };
        self.drop_messages(qid, upto, false).await
    }

    /// Deletes the messages of a queue with positions below `upto`, a
    /// chunk per transaction. For a deleted queue (`gone`), counters are
    /// not kept.
    async fn drop_messages(&self, qid: u32, upto: u64, gone: bool) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let commit = {
                let mut st = self.lock();
                let Some(q) = st.queues.get(&qid) else { break };
                let chunk: Vec<u64> = q.msgs.range(..upto).take(CHUNK).map(|(p, _)| p).collect();
                if chunk.is_empty() {
                    break;
                }
                let ((), commit) = self.decide(&mut st, |st, change| {
                    let State {
                        queues,
                        timers,
                        undo,
                        ..
                    } = st;
                    let Some(q) = queues.get_mut(&qid) else {
                        return Ok(());
                    };
                    for pos in &chunk {
                        if let Some((_, pid)) = q.remove(*pos, timers, undo) {
                            change.txn.delete(Key::Meta(qid, *pos));
                            change.txn.delete(Key::Payload(pid));
                        }
                    }
                    if !gone {
                        q.counters_mut(undo).purged += chunk.len() as u64;
                        change.touch(qid);
                    }
                    Ok(())
                })?;
                total += chunk.len() as u64;
                commit
            };
            durable(commit).await?;
        }
        // The client ids of the messages gone (nothing to store).
        let mut st = self.lock();
        self.decide(&mut st, |st, _| {
            let State { queues, undo, .. } = st;
            if let Some(q) = queues.get_mut(&qid) {
                let gone: Vec<String> = q
                    .client_ids
                    .iter()
                    .filter(|(_, p)| **p < upto)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in gone {
                    q.forget_client_id(&id, undo);
                }
            }
            Ok(())
        })?;
        Ok(total)
    }

    /// The figures of every queue (without the oldest message's age, which
    /// needs a read per queue), with its dead letter queue, in name order:
    /// what the metrics endpoint reports.
    pub fn all_stats(&self) -> Vec<(String, Option<String>, QueueStats)> {
        let st = self.lock();
        st.names
            .iter()
            .filter_map(|(name, qid)| {
                let q = st.queues.get(qid)?;
                let dlq = q.config.dead_letter.as_ref().map(|d| d.queue.clone());
                Some((name.clone(), dlq, figures(q)))
            })
            .collect()
    }

    /// Age in milliseconds of each queue's oldest message deliverable now
    /// (0 when there is none), by queue name. The positions are picked
    /// under the engine's lock and their records read after it is
    /// released; a message that left meanwhile counts as none.
    pub fn oldest_ready_ages(&self) -> Vec<(String, u64)> {
        let picked: Vec<(String, u32, Option<u64>)> = {
            let st = self.lock();
            st.names
                .iter()
                .filter_map(|(name, qid)| {
                    let q = st.queues.get(qid)?;
                    Some((name.clone(), *qid, q.oldest_ready_pos()))
                })
                .collect()
        };
        let now = self.now();
        picked
            .into_iter()
            .map(|(name, qid, pos)| {
                let age = pos
                    .and_then(|p| persist::get(&self.store, qid, p).ok().flatten())
                    .map_or(0, |meta| now.saturating_sub(meta.enqueued_at()));
                (name, age)
            })
            .collect()
    }

    /// Exact figures of a queue.
    pub fn stats(&self, name: &str) -> Result<QueueStats> {
        let now = self.now();
        let (qid, first, mut stats) = {
            let mut st = self.lock();
            let qid = st.qid(name)?;
            let q = st.queue(qid)?;
            (qid, q.msgs.first_pos(), figures(q))
        };
        if let Some(pos) = first {
            // The message may have left meanwhile; then it is not the oldest.
            if let Some(meta) = persist::get(&self.store, qid, pos)? {
                stats.oldest_age = now.saturating_sub(meta.enqueued_at());
            }
        }
        Ok(stats)
    }

    /// Reads messages without leasing them, in queue order, starting after
    /// the position in `page_token`.
    pub fn browse(&self, name: &str, max: u32, page_token: &str) -> Result<BrowsePage> {
        let size = validate::page_size("max_messages", max)?;
        let after = if page_token.is_empty() {
            None
        } else {
            Some(page_token.parse::<u64>().map_err(|_| {
                QueueError::invalid(
                    "page_token",
                    page_token,
                    "is not a token from an earlier page",
                )
            })?)
        };
        let (qid, picked, more) = {
            let mut st = self.lock();
            let qid = st.qid(name)?;
            let q = st.queue(qid)?;
            let start = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let mut picked = Vec::new();
            let mut iter = q.msgs.range((start, std::ops::Bound::Unbounded));
            for (pos, e) in iter.by_ref().take(size) {
                picked.push((pos, message_state(q, pos, e.state(), e.group())));
            }
            (qid, picked, iter.next().is_some())
        };
        let mut messages = Vec::with_capacity(picked.len());
        let mut last = None;
        for (pos, state) in picked {
            last = Some(pos);
            let Some(meta) = persist::get(&self.store, qid, pos)? else {
                continue;
            };
            // A damaged body is shown as such; the rest of the page is
            // read as usual.
            let (payload, damaged) = match self.store.get_payload(meta.pid()) {
                Ok(Some(p)) => (p, String::new()),
                Ok(None) => continue,
                Err(e) if e.is_corrupt() => {
                    self.note_corrupt();
                    let empty = crate::storage::records::PayloadRecord {
                        published_at: 0,
                        properties: Vec::new(),
                        body_crc: 0,
                        body: bytes::Bytes::new(),
                    };
                    (empty, e.to_string())
                }
                Err(e) => return Err(e.into()),
            };
            let leased = meta.current_lease().map_or(0, |l| l.deadline);
            messages.push(BrowsedMessage {
                position: pos,
                damaged,
                message_id: meta.id().to_string(),
                body: payload.body,
                properties: payload.properties,
                state,
                delivery_count: meta.delivery_count(),
                failed_attempts: meta.failed_attempts(),
                published_at: payload.published_at,
                enqueued_at: meta.enqueued_at(),
                expires_at: meta.expires_at(),
                visible_at: if state == MessageState::Delayed {
                    meta.visible_at()
                } else {
                    0
                },
                lease_deadline: leased,
                group_id: meta.group().map(str::to_string),
                dead_letters: meta.dead_letters().to_vec(),
                attempts: meta.attempts().to_vec(),
            });
        }
        Ok(BrowsePage {
            messages,
            next: if more {
                last.map(|p| p.to_string())
            } else {
                None
            },
        })
    }
}

fn message_state(q: &QueueState, pos: u64, state: EntryState, gidx: u32) -> MessageState {
    match state {
        EntryState::Leased => MessageState::Leased,
        EntryState::Delayed => MessageState::Delayed,
        EntryState::Ready => match &q.fifo {
            None => MessageState::Ready,
            Some(f) => match f.groups.get(&gidx) {
                Some(g) if g.parked.is_some() => MessageState::Parked,
                Some(g) if g.msgs.first() != Some(&pos) || g.leased > 0 => MessageState::Blocked,
                _ => MessageState::Ready,
            },
        },
    }
}

/// Describes a queue.
pub(crate) fn info(st: &State, qid: u32) -> Result<QueueInfo> {
    let q = st
        .queues
        .get(&qid)
        .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))?;
    Ok(QueueInfo {
        name: q.name.clone(),
        config: q.config.clone(),
        dead_letter_sources: st
            .dlq_sources
            .get(&q.name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default(),
        created_at: q.created_at,
    })
}

/// Checks a queue's dead letter policy against the other queues: the DLQ
/// exists, is not the queue itself, has the same kind, and the chain of
/// dead letter queues does not lead back to the queue.
fn check_dead_letter(st: &State, name: &str, config: &QueueConfig) -> Result<()> {
    let Some(dl) = &config.dead_letter else {
        return Ok(());
    };
    if dl.queue == name {
        return Err(QueueError::invalid(
            "config.dead_letter.queue",
            &dl.queue,
            "a queue cannot be its own dead letter queue",
        ));
    }
    let dlq_qid = st
        .names
        .get(&dl.queue)
        .ok_or_else(|| QueueError::NotFound {
            kind: "dead letter queue",
            name: dl.queue.clone(),
        })?;
    let dlq = st
        .queues
        .get(dlq_qid)
        .ok_or_else(|| QueueError::no_queue(&dl.queue))?;
    if dlq.config.kind != config.kind {
        return Err(QueueError::FailedPrecondition(format!(
            "dead letter queue {:?} is {} but queue {name:?} is {}; they must be of the same kind",
            dl.queue, dlq.config.kind, config.kind
        )));
    }
    // Follow the chain from the DLQ; it must not come back to `name`.
    let mut seen = vec![dl.queue.clone()];
    let mut next = dlq.config.dead_letter.as_ref().map(|d| d.queue.clone());
    while let Some(n) = next {
        if n == name {
            seen.push(n);
            return Err(QueueError::FailedPrecondition(format!(
                "dead letter queues would form a loop: {name} -> {}",
                seen.join(" -> ")
            )));
        }
        if seen.contains(&n) {
            break;
        }
        next = st
            .names
            .get(&n)
            .and_then(|id| st.queues.get(id))
            .and_then(|q| q.config.dead_letter.as_ref())
            .map(|d| d.queue.clone());
        seen.push(n);
    }
    Ok(())
}

/// How an existing queue's configuration differs from a requested one:
/// the words (each value as the API gives it, no debug text) and the
/// names of the values that differ.
pub(super) fn describe_difference(
    old: &QueueConfig,
    new: &QueueConfig,
) -> (String, Vec<&'static str>) {
    // Both named whole: a new field does not compile until it is compared.
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
    } = old;
    let wanted = new;
    let dl = |d: &Option<super::model::DeadLetterPolicy>| {
        d.as_ref().map_or_else(
            || "none".to_string(),
            |d| {
                format!(
                    "{:?} after {}",
                    d.queue,
                    crate::units::count_of(u64::from(d.max_deliveries), "delivery", "deliveries")
                )
            },
        )
    };
    let backoff = |b: &Option<super::model::RetryBackoff>| {
        b.as_ref().map_or_else(
            || "none".to_string(),
            |b| format!("{}ms to {}ms, times {}", b.initial, b.max, b.multiplier),
        )
    };
    let length = |n: &Option<u64>| n.map_or_else(|| "none".to_string(), |n| n.to_string());
    // The API's name of each value, the existing one, the requested one.
    let all: [(&'static str, String, String); 12] = [
        ("kind", kind.name().into(), wanted.kind.name().into()),
        (
            "message_ttl_ms",
            message_ttl.to_string(),
            wanted.message_ttl.to_string(),
        ),
        (
            "ack_timeout_ms",
            ack_timeout.to_string(),
            wanted.ack_timeout.to_string(),
        ),
        (
            "delivery_delay_ms",
            delivery_delay.to_string(),
            wanted.delivery_delay.to_string(),
        ),
        ("dead_letter", dl(dead_letter), dl(&wanted.dead_letter)),
        (
            "retry_backoff",
            backoff(retry_backoff),
            backoff(&wanted.retry_backoff),
        ),
        (
            "dead_letter_on_expiry",
            dead_letter_on_expiry.to_string(),
            wanted.dead_letter_on_expiry.to_string(),
        ),
        ("max_length", length(max_length), length(&wanted.max_length)),
        (
            "max_lease_total_ms",
            max_lease_total.to_string(),
            wanted.max_lease_total.to_string(),
        ),
        (
            "dedup_window_ms",
            dedup_window.to_string(),
            wanted.dedup_window.to_string(),
        ),
        (
            "on_poison",
            on_poison.name().into(),
            wanted.on_poison.name().into(),
        ),
        (
            "content_based_dedup",
            content_based_dedup.to_string(),
            wanted.content_based_dedup.to_string(),
        ),
    ];
    let differ: Vec<_> = all.iter().filter(|(_, a, b)| a != b).collect();
    let text = differ
        .iter()
        .map(|(field, a, b)| format!("{field} {a} (requested {b})"))
        .collect::<Vec<_>>()
        .join(", ");
    (
        format!("with a different configuration: {text}"),
        differ.iter().map(|(field, _, _)| *field).collect(),
    )
}

/// A queue's counts and counters, oldest age left at 0.
fn figures(q: &super::state::QueueState) -> QueueStats {
    let parked = q.fifo.as_ref().map_or(0, |f| f.parked_messages(&q.msgs));
    QueueStats {
        ready: q.ready_count(),
        in_flight: q.leased,
        delayed: q.delayed,
        parked,
        total: q.msgs.len() as u64,
        oldest_age: 0,
        counters: q.counters,
    }
}
