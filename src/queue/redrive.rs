//! Redrive: moving messages out of a dead letter queue, back to the queue
//! each came from or to a named queue (SPEC §4).
//!
//! A redrive walks the DLQ in position order (dead-letter order), up to the
//! end the DLQ had when it started (so messages that fail again and come
//! back are not picked up a second time). Each step takes a chunk of
//! messages under the lock, checks the selection against each message's
//! dead-letter record, and moves the matching ones in one transaction:
//! every message is in exactly one queue at every instant. A redrive cut
//! by a crash is simply run again: what moved is no longer in the DLQ, and
//! nothing moves twice. Moved messages start a new life in the target
//! (delivery count 0, TTL from now) and keep their dead-letter history;
//! FIFO messages keep their group, and their order.

use std::future::Future;
use std::time::Duration;

use crate::storage::Key;

use super::dlq::{Moving, move_message};
use super::error::{QueueError, Result};
use super::message::Message;
use super::model::DeadLetterReason;
use super::state::EntryState;
use super::{Broker, Change, State, durable, persist, validate};

/// Which messages to move, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedriveSpec {
    /// The dead letter queue.
    pub dlq: String,
    /// Move everything here instead of back to each message's source.
    pub target: Option<String>,
    /// Only these message ids (empty: all).
    pub message_ids: Vec<String>,
    /// Only messages dead-lettered from this queue.
    pub source_queue: Option<String>,
    /// Only these reasons (empty: all).
    pub reasons: Vec<DeadLetterReason>,
    /// Dead-lettered at or after (0: no bound).
    pub since: u64,
    /// Dead-lettered before (0: no bound).
    pub until: u64,
    /// Count only.
    pub dry_run: bool,
}

/// What one step did (counts add up over steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedriveStep {
    /// Messages looked at.
    pub scanned: u64,
    /// Messages matching the selection.
    pub matched: u64,
    /// Messages moved.
    pub moved: u64,
    /// Matching messages left in place: the sum of the four reasons below.
    pub skipped: u64,
    /// Of `skipped`: leased by a consumer.
    pub skipped_leased: u64,
    /// Of `skipped`: never dead-lettered and no target given.
    pub skipped_no_source: u64,
    /// Of `skipped`: the queue to go back to is gone, or is this queue.
    pub skipped_no_target: u64,
    /// Of `skipped`: the queue to go back to is of the other kind.
    pub skipped_other_kind: u64,
    /// Where the next step starts; `None` when the walk is over.
    pub next: Option<u64>,
}

impl RedriveStep {
    /// Adds another step's counts to these.
    pub fn add(&mut self, o: &RedriveStep) {
        self.scanned += o.scanned;
        self.matched += o.matched;
        self.moved += o.moved;
        self.skipped += o.skipped;
        self.skipped_leased += o.skipped_leased;
        self.skipped_no_source += o.skipped_no_source;
        self.skipped_no_target += o.skipped_no_target;
        self.skipped_other_kind += o.skipped_other_kind;
    }
}

impl Broker {
    /// Checks a redrive request; returns the DLQ's end position, the bound
    /// of the walk.
    pub fn start_redrive(&self, spec: &RedriveSpec) -> Result<u64> {
        let mut st = self.lock();
        let qid = st.qid(&spec.dlq)?;
        let kind = st.queue(qid)?.config.kind;
        if let Some(t) = &spec.target {
            let tq = st.qid(t)?;
            let target = st.queue(tq)?;
            if target.config.kind != kind {
                return Err(QueueError::FailedPrecondition(format!(
                    "target queue {t:?} is {} but {:?} is {kind}; redrive moves messages between queues of the same kind",
                    target.config.kind, spec.dlq
                )));
            }
            if tq == qid {
                return Err(QueueError::invalid(
                    "target",
                    t,
                    "is the queue being redriven",
                ));
            }
        }
        if let Some(s) = &spec.source_queue {
            validate::name("source_queue", s)?;
        }
        if spec.until != 0 && spec.until <= spec.since {
            return Err(QueueError::invalid(
                "until_unix_ms",
                spec.until,
                format!("must be after since_unix_ms ({})", spec.since),
            ));
        }
        Ok(st.next_pos)
    }

    /// One step of a redrive: looks at up to `scan` messages at positions
    /// from `from` (below `end`) and moves up to `budget` matching ones.
    pub async fn redrive_step(
        &self,
        spec: &RedriveSpec,
        from: u64,
        end: u64,
        scan: usize,
        budget: u64,
    ) -> Result<RedriveStep> {
        let now = self.now();
        let (step, commit) = {
            let mut st = self.lock();
            let qid = st.qid(&spec.dlq)?;
            let q = st.queue(qid)?;
            let kind = q.config.kind;
            let chunk: Vec<(u64, EntryState)> = q
                .msgs
                .range(from..end)
                .take(scan)
                .map(|(p, e)| (p, e.state()))
                .collect();
            let step = RedriveStep {
                next: (chunk.len() == scan).then(|| chunk.last().map_or(end, |(p, _)| p + 1)),
                ..RedriveStep::default()
            };
            self.decide(&mut st, |st, change| {
                self.redrive_chunk(st, spec, qid, kind, chunk, step, budget, now, change)
            })?
        };
        durable(commit).await?;
        Ok(step)
    }

    /// The moves of one redrive step, under the lock.
    #[allow(clippy::too_many_arguments)]
    fn redrive_chunk(
        &self,
        st: &mut State,
        spec: &RedriveSpec,
        qid: u32,
        kind: super::model::QueueKind,
        chunk: Vec<(u64, EntryState)>,
        mut step: RedriveStep,
        budget: u64,
        now: u64,
        change: &mut Change,
    ) -> Result<RedriveStep> {
        for (pos, state) in chunk {
            if step.moved >= budget {
                step.next = Some(pos);
                break;
            }
            step.scanned += 1;
            let meta = self.meta(qid, pos)?;
            if !selected(spec, &meta) {
                continue;
            }
            step.matched += 1;
            let target = match &spec.target {
                Some(t) => Some(t.clone()),
                None => meta.dead_letters().last().map(|d| d.source_queue.clone()),
            };
            let tqid = target.as_deref().and_then(|t| st.names.get(t).copied());
            let tkind = tqid.and_then(|t| st.queues.get(&t)).map(|t| t.config.kind);
            let skip = match (target.is_some(), tqid, tkind) {
                (false, _, _) => Some(&mut step.skipped_no_source),
                (true, None, _) | (true, Some(_), None) => Some(&mut step.skipped_no_target),
                (true, Some(t), _) if t == qid => Some(&mut step.skipped_no_target),
                (true, Some(_), Some(k)) if k != kind => Some(&mut step.skipped_other_kind),
                _ if state == EntryState::Leased => Some(&mut step.skipped_leased),
                _ => None,
            };
            if let Some(reason) = skip {
                *reason += 1;
                step.skipped += 1;
                continue;
            }
            let Some(tqid) = tqid else {
                continue;
            };
            if !spec.dry_run {
                move_back(st, qid, pos, tqid, meta, now, change)?;
            }
            step.moved += u64::from(!spec.dry_run);
        }
        Ok(step)
    }
}

/// Where a paced redrive's progress goes: called at most every 200 ms
/// while it runs, with the counts so far; answering `false` cancels it.
pub trait RedriveSink: Send {
    /// The counts so far.
    fn progress(&mut self, total: &RedriveStep) -> impl Future<Output = bool> + Send;
}

/// How a paced redrive ended.
#[derive(Debug)]
pub enum RedriveEnd {
    /// The walk is over, or the limit was reached.
    Done,
    /// The server began shutting down; running it again moves the rest.
    ShutDown,
    /// The sink answered `false`.
    Cancelled,
    /// A step failed.
    Failed(QueueError),
}

/// Messages looked at per step of a paced redrive.
const SCAN: usize = 512;

impl Broker {
    /// Runs a redrive checked by [`Broker::start_redrive`] (`end` is what
    /// it returned) to its end: steps through the DLQ, moves at most
    /// `limit` matching messages (0: no limit) at most `rate` per second
    /// (0: no pacing), and reports progress to `sink`. Returns the counts
    /// and how it ended. Every door (gRPC, the console) runs redrives
    /// through this.
    pub async fn run_redrive(
        &self,
        spec: &RedriveSpec,
        end: u64,
        limit: u64,
        rate: u32,
        sink: &mut impl RedriveSink,
    ) -> (RedriveStep, RedriveEnd) {
        let started = self.clock.monotonic();
        let mut total = RedriveStep::default();
        let mut cursor = 0u64;
        let mut reported = started;
        loop {
            if self.is_closing() {
                return (total, RedriveEnd::ShutDown);
            }
            let left = if limit == 0 {
                u64::MAX
            } else {
                limit - total.matched.min(limit)
            };
            if left == 0 {
                break;
            }
            // A step moves at most a tenth of a second's worth at the rate.
            let per_step = if rate == 0 {
                u64::MAX
            } else {
                u64::from(rate / 10).max(1)
            };
            let step = match self
                .redrive_step(spec, cursor, end, SCAN, left.min(per_step))
                .await
            {
                Ok(s) => s,
                Err(e) => return (total, RedriveEnd::Failed(e)),
            };
            total.add(&step);
            if rate > 0 && step.moved > 0 {
                // Hold the pace: `moved` messages take moved/rate seconds.
                let due = Duration::from_secs_f64(total.moved as f64 / f64::from(rate));
                let elapsed = self.clock.monotonic() - started;
                if due > elapsed {
                    tokio::time::sleep(due - elapsed).await;
                }
            }
            let now = self.clock.monotonic();
            if now - reported >= Duration::from_millis(200) {
                reported = now;
                if !sink.progress(&total).await {
                    return (total, RedriveEnd::Cancelled);
                }
            }
            match step.next {
                Some(c) => cursor = c,
                None => break,
            }
        }
        (total, RedriveEnd::Done)
    }
}

/// True when the message's latest dead-letter record matches the selection.
fn selected(spec: &RedriveSpec, meta: &Message) -> bool {
    if !spec.message_ids.is_empty() && !spec.message_ids.iter().any(|id| id == meta.id()) {
        return false;
    }
    let Some(last) = meta.dead_letters().last() else {
        // Published straight into the DLQ: no source, selected only by id
        // or with an explicit target.
        return spec.source_queue.is_none()
            && spec.reasons.is_empty()
            && spec.since == 0
            && spec.until == 0;
    };
    if spec
        .source_queue
        .as_ref()
        .is_some_and(|s| *s != last.source_queue)
    {
        return false;
    }
    if !spec.reasons.is_empty() && !spec.reasons.contains(&last.reason) {
        return false;
    }
    if spec.since != 0 && last.at < spec.since {
        return false;
    }
    if spec.until != 0 && last.at >= spec.until {
        return false;
    }
    true
}

/// Moves one message from the DLQ to the target, atomically.
fn move_back(
    st: &mut State,
    qid: u32,
    pos: u64,
    tqid: u32,
    meta: Message,
    now: u64,
    change: &mut Change,
) -> Result<()> {
    let moves = Moving {
        from: qid,
        pos,
        to: tqid,
        delay: None,
        out: |c| &mut c.redriven,
        into: |c| &mut c.redrive_received,
    };
    let Some((new_pos, meta)) = move_message(st, &moves, meta, now, change)? else {
        return Ok(());
    };
    change.txn.delete(Key::Meta(qid, pos));
    persist::put_new(&mut change.txn, tqid, new_pos, &meta);
    change.wake(tqid);
    Ok(())
}
