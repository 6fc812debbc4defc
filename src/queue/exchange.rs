//! Fanout exchanges with filtered bindings (SPEC §5).
//!
//! Publishing through an exchange stores a copy of each message (its own
//! payload and position, the same message id) in every bound queue whose
//! filter matches the message's properties, all in one transaction: after
//! a crash every bound queue has it, or none does.
//!
//! FIFO queues cannot be bound (as in Anypoint MQ): a FIFO queue's order
//! and dedup window are the publisher's contract with that one queue, and
//! an exchange fans a message out to queues whose groups, delays and dedup
//! rules differ.

use std::collections::{BTreeMap, HashMap};

use crate::faults::{self, Fault};
use crate::storage::Key;
use crate::storage::records::ExchangeRecord;

use super::error::{QueueError, Result};
use super::model::{NewMessage, Published};
use super::publish::{Publishing, encode_all, new_message_id, store_new};
use super::{Broker, Change, State, durable, validate};

/// An exchange in memory: bindings by queue name, each with its filter
/// (property pairs, sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExchangeState {
    pub created_at: u64,
    pub bindings: BTreeMap<String, Vec<(String, String)>>,
}

impl ExchangeState {
    pub(crate) fn record(&self) -> ExchangeRecord {
        ExchangeRecord {
            created_at: self.created_at,
            bindings: self
                .bindings
                .iter()
                .map(|(q, f)| (q.clone(), f.clone()))
                .collect(),
        }
    }
}

/// An exchange as described to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeInfo {
    /// Its name.
    pub name: String,
    /// (queue, filter) bindings in queue order.
    pub bindings: Vec<(String, Vec<(String, String)>)>,
    /// Creation time.
    pub created_at: u64,
}

fn info(name: &str, x: &ExchangeState) -> ExchangeInfo {
    ExchangeInfo {
        name: name.to_string(),
        bindings: x
            .bindings
            .iter()
            .map(|(q, f)| (q.clone(), f.clone()))
            .collect(),
        created_at: x.created_at,
    }
}

fn no_exchange(name: &str) -> QueueError {
    QueueError::NotFound {
        kind: "exchange",
        name: name.to_string(),
    }
}

/// True when a message's properties have every pair of the filter.
fn matches(filter: &[(String, String)], props: &[(String, String)]) -> bool {
    filter
        .iter()
        .all(|(k, v)| props.iter().any(|(pk, pv)| pk == k && pv == v))
}

impl Broker {
    /// Creates an exchange; `Ok((info, false))` if it existed.
    pub async fn create_exchange(&self, name: &str) -> Result<(ExchangeInfo, bool)> {
        validate::name("name", name)?;
        let now = self.now();
        let (x, commit) = {
            let mut st = self.lock();
            if let Some(x) = st.exchanges.get(name) {
                return Ok((info(name, x), false));
            }
            let x = ExchangeState {
                created_at: now,
                bindings: BTreeMap::new(),
            };
            self.decide(&mut st, |st, change| {
                change.txn.put_exchange(name, &x.record());
                st.exchanges.insert(name.to_string(), x.clone());
                Ok(info(name, &x))
            })?
        };
        durable(commit).await?;
        Ok((x, true))
    }

    /// Describes an exchange.
    pub fn get_exchange(&self, name: &str) -> Result<ExchangeInfo> {
        let st = self.lock();
        st.exchanges
            .get(name)
            .map(|x| info(name, x))
            .ok_or_else(|| no_exchange(name))
    }

    /// Lists exchanges in name order after `after`.
    pub fn list_exchanges(
        &self,
        page_size: u32,
        after: Option<&str>,
    ) -> Result<(Vec<ExchangeInfo>, Option<String>)> {
        let size = validate::page_size("page_size", page_size)?;
        let st = self.lock();
        let start = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let mut iter = st
            .exchanges
            .range::<str, _>((start, std::ops::Bound::Unbounded));
        let page: Vec<ExchangeInfo> = iter.by_ref().take(size).map(|(n, x)| info(n, x)).collect();
        let next = if iter.next().is_some() {
            page.last().map(|x| x.name.clone())
        } else {
            None
        };
        Ok((page, next))
    }

    /// Deletes an exchange and its bindings.
    pub async fn delete_exchange(&self, name: &str) -> Result<()> {
        let commit = {
            let mut st = self.lock();
            let ((), commit) = self.decide(&mut st, |st, change| {
                if st.exchanges.remove(name).is_none() {
                    return Err(no_exchange(name));
                }
                change.txn.delete(Key::Exchange(name));
                Ok(())
            })?;
            commit
        };
        durable(commit).await
    }

    /// Binds a queue to an exchange with a filter (replacing an earlier
    /// binding of the same queue).
    pub async fn bind(
        &self,
        exchange: &str,
        queue: &str,
        filter: Vec<(String, String)>,
    ) -> Result<ExchangeInfo> {
        validate::filter("binding.filter", &filter)?;
        let mut filter = filter;
        filter.sort();
        let (x, commit) = {
            let mut st = self.lock();
            check_bindable(&st, queue)?;
            self.decide(&mut st, |st, change| {
                let x = st
                    .exchanges
                    .get_mut(exchange)
                    .ok_or_else(|| no_exchange(exchange))?;
                x.bindings.insert(queue.to_string(), filter);
                change.txn.put_exchange(exchange, &x.record());
                Ok(info(exchange, x))
            })?
        };
        durable(commit).await?;
        Ok(x)
    }

    /// Removes a queue's binding.
    pub async fn unbind(&self, exchange: &str, queue: &str) -> Result<ExchangeInfo> {
        let (x, commit) = {
            let mut st = self.lock();
            self.decide(&mut st, |st, change| {
                let x = st
                    .exchanges
                    .get_mut(exchange)
                    .ok_or_else(|| no_exchange(exchange))?;
                if x.bindings.remove(queue).is_none() {
                    return Err(QueueError::NotFound {
                        kind: "binding",
                        name: format!("{exchange} -> {queue}"),
                    });
                }
                change.txn.put_exchange(exchange, &x.record());
                Ok(info(exchange, x))
            })?
        };
        durable(commit).await?;
        Ok(x)
    }

    /// Publishes through an exchange: each message into every bound queue
    /// whose filter matches, all messages and copies in one transaction,
    /// all or nothing.
    pub async fn publish_to_exchange(
        &self,
        exchange: &str,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Published>> {
        self.publish_room().await;
        self.begin_publish_to_exchange(exchange, msgs)?.done().await
    }

    /// The deciding half of [`Broker::publish_to_exchange`] (see
    /// [`Broker::begin_publish`]).
    pub fn begin_publish_to_exchange(
        &self,
        exchange: &str,
        msgs: Vec<NewMessage>,
    ) -> Result<Publishing> {
        self.admit_batch(&msgs)?;
        let now = self.now();
        let payloads = encode_all(&msgs, now);
        let (results, commit) = {
            let mut st = self.lock();
            let x = st
                .exchanges
                .get(exchange)
                .ok_or_else(|| no_exchange(exchange))?;
            // Where each message goes.
            let routes: Vec<Vec<u32>> = msgs
                .iter()
                .map(|m| {
                    x.bindings
                        .iter()
                        .filter(|(_, f)| matches(f, &m.properties))
                        .filter_map(|(q, _)| st.names.get(q).copied())
                        .collect()
                })
                .collect();
            // Check every copy against its queue before changing anything.
            self.admit_space()?;
            let mut per_queue: HashMap<u32, Vec<usize>> = HashMap::new();
            for (i, qids) in routes.iter().enumerate() {
                for &qid in qids {
                    per_queue.entry(qid).or_default().push(i);
                }
            }
            let mut dups: HashMap<(u32, usize), bool> = HashMap::new();
            for (&qid, idxs) in &per_queue {
                let q = st.queue(qid)?;
                let sub: Vec<NewMessage> = idxs.iter().map(|&i| msgs[i].clone()).collect();
                let no_keys = vec![Vec::new(); sub.len()];
                let found = self.admit(q, &sub, idxs, &no_keys, now, Some(exchange))?;
                for (k, d) in idxs.iter().zip(found) {
                    dups.insert((qid, *k), d.is_some());
                }
            }
            // Negative control: the copies into the first queue routed to
            // go in a transaction of their own, made durable 100 ms before
            // the rest (the crash tests must catch the split).
            let split = if faults::on(Fault::ExchangeTwoSteps) && per_queue.len() > 1 {
                routes.iter().flatten().next().copied()
            } else {
                None
            };
            self.decide(&mut st, |st, change| {
                let mut first = Change::default();
                let mut results = Vec::with_capacity(msgs.len());
                for (i, (m, payload)) in msgs.iter().zip(payloads).enumerate() {
                    let id = match &m.message_id {
                        Some(id) => (id.clone(), true),
                        None => (new_message_id(now, st.next_pos), false),
                    };
                    let mut routed_to = Vec::new();
                    for &qid in &routes[i] {
                        if dups.get(&(qid, i)).copied().unwrap_or(false) {
                            continue;
                        }
                        let target = if split == Some(qid) {
                            &mut first
                        } else {
                            &mut *change
                        };
                        store_new(st, qid, m, id.clone(), payload.clone(), &[], now, target)?;
                        let State { queues, undo, .. } = &mut *st;
                        let q = queues.get_mut(&qid).ok_or_else(|| {
                            QueueError::Unavailable(format!("queue number {qid} vanished"))
                        })?;
                        q.counters_mut(undo).published += 1;
                        routed_to.push(q.name.clone());
                        target.touch(qid);
                        target.wake(qid);
                    }
                    results.push(Published {
                        message_id: id.0,
                        duplicate: routed_to.is_empty() && !routes[i].is_empty(),
                        routed_to,
                    });
                }
                // Nothing fails after this point: the first part may be
                // submitted on its own.
                if split.is_some()
                    && let Some(c) = self.submit(st, first)
                {
                    c.wait_blocking();
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Ok(results)
            })?
        };
        Ok(Publishing::new(results, commit))
    }
}

/// A queue can be bound when it exists and is a standard queue.
pub(crate) fn check_bindable(st: &State, queue: &str) -> Result<()> {
    let qid = st.qid(queue)?;
    let q = st
        .queues
        .get(&qid)
        .ok_or_else(|| QueueError::no_queue(queue))?;
    if q.config.kind.is_fifo() {
        return Err(QueueError::FailedPrecondition(format!(
            "queue {queue:?} is a FIFO queue; FIFO queues cannot be bound to exchanges"
        )));
    }
    Ok(())
}

/// Removes every binding to a queue (it is being deleted).
pub(crate) fn unbind_everywhere(st: &mut State, queue: &str, change: &mut Change) {
    for (name, x) in &mut st.exchanges {
        if x.bindings.remove(queue).is_some() {
            change.txn.put_exchange(name, &x.record());
        }
    }
}
