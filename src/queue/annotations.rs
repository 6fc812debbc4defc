//! What the engine keeps for front ends that speak another queue API (the
//! SQS endpoint, `src/sqs/`), without reading it:
//!
//! - a queue's **annotations**: string pairs stored with the queue, in the
//!   transaction that creates or updates it, and deleted with it (SQS
//!   attributes that have no engine setting, tags, move tasks);
//! - settling by a token of **any** lease of a message, not only the
//!   current one: an SQS receipt handle from an earlier receive still
//!   deletes its message, and still changes the visibility of the
//!   message's current lease (SQS does both; Letterbox's own `Ack` and
//!   `ExtendLease` refuse a token whose lease is over).

use crate::storage::Key;
use crate::storage::records::AnnotationsRecord;

use super::error::{QueueError, Result};
use super::state::EntryState;
use super::token::AckToken;
use super::{Broker, Change, durable};

/// Most bytes of a queue's annotations, names and values together.
pub const MAX_ANNOTATION_BYTES: usize = 256 << 10;

/// Annotations sorted by name, checked: names non-empty and unique, the
/// whole within [`MAX_ANNOTATION_BYTES`].
pub(crate) fn checked(mut pairs: Vec<(String, String)>) -> Result<Vec<(String, String)>> {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    if pairs.iter().any(|(k, _)| k.is_empty()) {
        return Err(QueueError::invalid(
            "annotations",
            "\"\"",
            "annotation names must not be empty",
        ));
    }
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(QueueError::invalid(
            "annotations",
            &w[0].0,
            "is given twice",
        ));
    }
    let total: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ANNOTATION_BYTES {
        return Err(QueueError::invalid(
            "annotations",
            format!("{total} bytes"),
            format!("must be at most {MAX_ANNOTATION_BYTES} bytes together"),
        ));
    }
    Ok(pairs)
}

/// Writes a queue's annotations into `change`.
pub(crate) fn put(change: &mut Change, qid: u32, pairs: &[(String, String)]) {
    if pairs.is_empty() {
        change.txn.delete(Key::Annotations(qid));
    } else {
        change.txn.put_annotations(
            qid,
            &AnnotationsRecord {
                pairs: pairs.to_vec(),
            },
        );
    }
}

/// What became of a message deleted by a token of any of its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// It was in the queue and is gone now.
    Deleted,
    /// It was no longer in the queue (deleted, expired, moved or purged
    /// before).
    Gone,
    /// The token is of another queue than the one named.
    OtherQueue,
}

impl Broker {
    /// A queue's annotations, sorted by name.
    pub fn annotations(&self, queue: &str) -> Result<Vec<(String, String)>> {
        let mut st = self.lock();
        let qid = st.qid(queue)?;
        Ok(st.queue(qid)?.annotations.clone())
    }

    /// Replaces a queue's annotations; durable when it returns.
    pub async fn set_annotations(&self, queue: &str, pairs: Vec<(String, String)>) -> Result<()> {
        let pairs = checked(pairs)?;
        let commit = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let mut change = Change::default();
            put(&mut change, qid, &pairs);
            st.queue(qid)?.annotations = pairs;
            self.submit(&st, change)
        };
        durable(commit).await
    }

    /// Deletes the messages that `tokens` were leases of, in `queue`,
    /// whether that lease is still current, ended, or followed by another
    /// (SQS's `DeleteMessage`): one outcome per token. A token that does
    /// not parse is refused before anything is deleted.
    pub async fn delete_leased(&self, queue: &str, tokens: &[String]) -> Result<Vec<Deleted>> {
        let parsed = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| AckToken::parse(&format!("receipt_handles[{i}]"), t))
            .collect::<Result<Vec<_>>>()?;
        self.check_floor()?;
        let (out, commit) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let mut change = Change::default();
            let mut out = Vec::with_capacity(parsed.len());
            for t in &parsed {
                if t.qid != qid {
                    out.push(Deleted::OtherQueue);
                    continue;
                }
                let super::State { queues, timers, .. } = &mut *st;
                let Some(q) = queues.get_mut(&qid) else {
                    out.push(Deleted::Gone);
                    continue;
                };
                if !q.msgs.contains(t.pos) {
                    out.push(Deleted::Gone);
                    continue;
                }
                let meta = self.meta(qid, t.pos)?;
                if let Some((_, pid)) = q.remove(t.pos, timers) {
                    super::delivery::forget_client_id(q, &meta);
                    change.txn.delete(Key::Meta(qid, t.pos));
                    change.txn.delete(Key::Payload(pid));
                    q.counters.acked += 1;
                    change.touch(qid);
                    change.wake(qid);
                }
                out.push(Deleted::Deleted);
            }
            (out, self.submit(&st, change))
        };
        durable(commit).await?;
        Ok(out)
    }

    /// The token of the current lease of the message that `token` was a
    /// lease of, if that message is leased now (by this token or by a
    /// later receive); `None` when it is not leased or no longer in the
    /// queue. The queue is `Err(NotFound)` when `token` names another
    /// queue than `queue`.
    pub fn current_lease_of(&self, queue: &str, token: &str) -> Result<Option<String>> {
        let t = AckToken::parse("receipt_handle", token)?;
        let now = self.now();
        let st = self.lock();
        let qid = st.qid(queue)?;
        if t.qid != qid {
            return Err(QueueError::invalid(
                "receipt_handle",
                token,
                format!("is not a lease of a message of queue {queue:?}"),
            ));
        }
        let Some(e) = st.queues.get(&qid).and_then(|q| q.msgs.get(t.pos)) else {
            return Ok(None);
        };
        if e.state() != EntryState::Leased || e.due() <= now {
            return Ok(None);
        }
        Ok(Some(
            AckToken {
                qid,
                pos: t.pos,
                epoch: e.epoch(),
            }
            .to_string(),
        ))
    }
}
