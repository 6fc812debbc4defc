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

/// An annotation set (`Some`) or removed (`None`).
pub type AnnotationChange = (String, Option<String>);

/// `current` with `changes` applied (a later change of a name wins),
/// checked as [`checked`] checks.
pub(crate) fn applied(
    current: &[(String, String)],
    changes: &[AnnotationChange],
) -> Result<Vec<(String, String)>> {
    let mut out: std::collections::BTreeMap<String, String> = current.iter().cloned().collect();
    for (k, v) in changes {
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    checked(out.into_iter().collect())
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

    /// Changes a queue's annotations as `f` decides from the current ones,
    /// atomically (no other change of them comes between the read and the
    /// write); durable when it returns. `f` answers the changes and a
    /// value, or its own error, which changes nothing. No changes: nothing
    /// is written.
    pub async fn update_annotations<T, E>(
        &self,
        queue: &str,
        f: impl FnOnce(&[(String, String)]) -> std::result::Result<(Vec<AnnotationChange>, T), E>,
    ) -> Result<std::result::Result<T, E>> {
        let (out, commit) = {
            let mut st = self.lock();
            let qid = st.qid(queue)?;
            let q = st.queue(qid)?;
            let (changes, out) = match f(&q.annotations) {
                Ok(r) => r,
                Err(e) => return Ok(Err(e)),
            };
            if changes.is_empty() {
                return Ok(Ok(out));
            }
            let pairs = applied(&q.annotations, &changes)?;
            let mut change = Change::default();
            put(&mut change, qid, &pairs);
            q.annotations = pairs;
            (out, self.submit(&st, change))
        };
        durable(commit).await?;
        Ok(Ok(out))
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
            self.decide(&mut st, |st, change| {
                let mut out = Vec::with_capacity(parsed.len());
                for t in &parsed {
                    if t.qid != qid {
                        out.push(Deleted::OtherQueue);
                        continue;
                    }
                    let super::State {
                        queues,
                        timers,
                        undo,
                        ..
                    } = &mut *st;
                    let Some(q) = queues.get_mut(&qid) else {
                        out.push(Deleted::Gone);
                        continue;
                    };
                    if !q.msgs.contains(t.pos) {
                        out.push(Deleted::Gone);
                        continue;
                    }
                    let meta = if q.client_ids.is_empty() {
                        None
                    } else {
                        Some(self.meta(qid, t.pos)?)
                    };
                    if let Some((_, pid)) = q.remove(t.pos, timers, undo) {
                        if let Some(meta) = meta {
                            super::delivery::forget_client_id(q, &meta, undo);
                        }
                        change.txn.delete(Key::Meta(qid, t.pos));
                        change.txn.delete(Key::Payload(pid));
                        q.counters_mut(undo).acked += 1;
                        change.touch(qid);
                        change.wake(qid);
                    }
                    out.push(Deleted::Deleted);
                }
                Ok(out)
            })?
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::queue::BrokerOptions;
    use crate::queue::model::QueueConfigInput;
    use crate::storage::{Store, StoreOptions};

    fn open(dir: &std::path::Path) -> Broker {
        let opts = StoreOptions {
            segment_size: 1 << 20,
            min_free_bytes: 0,
            ..StoreOptions::default()
        };
        let (store, _) = Store::open(dir, opts).expect("store opens");
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        Broker::open(store, clock, BrokerOptions::default()).expect("broker opens")
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn updates_apply_to_the_current_annotations_and_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        b.create_queue_annotated("q", &QueueConfigInput::default(), pairs(&[("a", "1")]))
            .await
            .unwrap();
        let seen = b
            .update_annotations("q", |cur| {
                Ok::<_, ()>((vec![("b".to_string(), Some("2".to_string()))], cur.to_vec()))
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen, pairs(&[("a", "1")]));
        // The closure's own error changes nothing.
        let refused = b
            .update_annotations("q", |_| Err::<(Vec<AnnotationChange>, ()), _>("no"))
            .await
            .unwrap();
        assert_eq!(refused, Err("no"));
        b.update_queue_annotated(
            "q",
            &QueueConfigInput::default(),
            crate::queue::model::QueueRemovals::default(),
            &[("a".to_string(), None), ("c".to_string(), Some("3".into()))],
        )
        .await
        .unwrap();
        assert_eq!(
            b.annotations("q").unwrap(),
            pairs(&[("b", "2"), ("c", "3")])
        );
        b.store.crash();
        let b = open(dir.path());
        assert_eq!(
            b.annotations("q").unwrap(),
            pairs(&[("b", "2"), ("c", "3")])
        );
        // Too large a whole is refused and changes nothing.
        let big = "x".repeat(MAX_ANNOTATION_BYTES);
        assert!(
            b.update_annotations("q", |_| Ok::<_, ()>((vec![("d".into(), Some(big))], ())))
                .await
                .is_err()
        );
        assert_eq!(
            b.annotations("q").unwrap(),
            pairs(&[("b", "2"), ("c", "3")])
        );
        b.delete_queue("q", false).await.unwrap();
        b.create_queue("q", &QueueConfigInput::default())
            .await
            .unwrap();
        assert!(b.annotations("q").unwrap().is_empty());
    }
}
