//! Definitions: every queue, exchange and binding as one JSON document
//! (in the spirit of RabbitMQ's definitions file), exported and imported.
//!
//! Import validates the whole document against the server's state first
//! (names, every configuration value, dead letter queues that resolve to a
//! queue of the same kind without a loop, exchanges and bindings that name
//! existing or defined objects, no FIFO queue bound); any problem is an
//! error naming the entry, and nothing is applied. Then everything is
//! applied in one transaction. Importing a document twice changes nothing
//! the second time; a queue that exists with a different configuration is
//! an error (queues are not silently reconfigured).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::error::{QueueError, Result};
use super::exchange::ExchangeState;
use super::model::{
    DeadLetterInput, PoisonPolicy, QueueConfig, QueueConfigInput, QueueKind, RetryBackoff,
};
use super::state::QueueState;
use super::{Broker, durable, persist, validate};
use crate::storage::SysKey;

/// The definitions document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definitions {
    /// Queues, in name order.
    #[serde(default)]
    pub queues: Vec<QueueDef>,
    /// Exchanges, in name order.
    #[serde(default)]
    pub exchanges: Vec<ExchangeDef>,
    /// Bindings, by exchange then queue.
    #[serde(default)]
    pub bindings: Vec<BindingDef>,
}

/// A queue in a definitions document. Missing fields take their defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueDef {
    /// Queue name.
    pub name: String,
    /// `STANDARD` or `FIFO`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Message time to live (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_ttl_ms: Option<u64>,
    /// Lease length (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timeout_ms: Option<u64>,
    /// Delivery delay (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_delay_ms: Option<u64>,
    /// Dead letter queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterDef>,
    /// Retry backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<BackoffDef>,
    /// Dead-letter expired messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_on_expiry: Option<bool>,
    /// Length limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// Ceiling of one lease (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lease_total_ms: Option<u64>,
    /// FIFO dedup window (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<u64>,
    /// FIFO poison policy: `DEAD_LETTER_AND_CONTINUE` or `PARK_GROUP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_poison: Option<String>,
    /// FIFO content-based dedup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_based_dedup: Option<bool>,
}

/// A dead letter policy in a definitions document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterDef {
    /// The dead letter queue.
    pub queue: String,
    /// Deliveries before the move.
    #[serde(default)]
    pub max_deliveries: u32,
}

/// A retry backoff in a definitions document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffDef {
    /// First delay (ms).
    pub initial_ms: u64,
    /// Largest delay (ms).
    pub max_ms: u64,
    /// Growth factor.
    pub multiplier: f64,
}

/// An exchange in a definitions document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeDef {
    /// Exchange name.
    pub name: String,
}

/// A binding in a definitions document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingDef {
    /// The exchange.
    pub exchange: String,
    /// The bound queue.
    pub queue: String,
    /// Property filter (empty: every message).
    #[serde(default)]
    pub filter: BTreeMap<String, String>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Queues created.
    pub queues_created: u32,
    /// Exchanges created.
    pub exchanges_created: u32,
    /// Bindings created or changed.
    pub bindings_changed: u32,
}

/// A queue's entry: every value in force, the FIFO-only ones for FIFO
/// queues only.
pub(crate) fn queue_def(name: &str, c: &QueueConfig) -> QueueDef {
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
    } = c;
    let fifo = kind.is_fifo();
    QueueDef {
        name: name.to_string(),
        kind: Some(kind.to_string()),
        message_ttl_ms: Some(*message_ttl),
        ack_timeout_ms: Some(*ack_timeout),
        delivery_delay_ms: Some(*delivery_delay),
        dead_letter: dead_letter.as_ref().map(|d| DeadLetterDef {
            queue: d.queue.clone(),
            max_deliveries: d.max_deliveries,
        }),
        retry_backoff: retry_backoff.map(|b| BackoffDef {
            initial_ms: b.initial,
            max_ms: b.max,
            multiplier: b.multiplier,
        }),
        dead_letter_on_expiry: Some(*dead_letter_on_expiry),
        max_length: *max_length,
        max_lease_total_ms: Some(*max_lease_total),
        dedup_window_ms: fifo.then_some(*dedup_window),
        on_poison: fifo.then(|| on_poison.name().to_string()),
        content_based_dedup: fifo.then_some(*content_based_dedup),
    }
}

/// The request an entry makes (the engine's checks follow).
pub(crate) fn input(i: usize, d: &QueueDef) -> Result<QueueConfigInput> {
    let QueueDef {
        name: _,
        kind,
        message_ttl_ms,
        ack_timeout_ms,
        delivery_delay_ms,
        dead_letter,
        retry_backoff,
        dead_letter_on_expiry,
        max_length,
        max_lease_total_ms,
        dedup_window_ms,
        on_poison,
        content_based_dedup,
    } = d;
    let kind = match kind.as_deref() {
        None => QueueKind::Standard,
        Some(k) => QueueKind::from_name(k).ok_or_else(|| {
            QueueError::invalid(format!("queues[{i}].kind"), k, "must be STANDARD or FIFO")
        })?,
    };
    let on_poison = on_poison
        .as_deref()
        .map(|p| {
            PoisonPolicy::from_name(p).ok_or_else(|| {
                QueueError::invalid(
                    format!("queues[{i}].on_poison"),
                    p,
                    "must be DEAD_LETTER_AND_CONTINUE or PARK_GROUP",
                )
            })
        })
        .transpose()?;
    Ok(QueueConfigInput {
        kind: Some(kind),
        message_ttl: *message_ttl_ms,
        ack_timeout: *ack_timeout_ms,
        delivery_delay: *delivery_delay_ms,
        dead_letter: dead_letter
            .as_ref()
            .map(|x| DeadLetterInput::new(x.queue.clone(), x.max_deliveries)),
        retry_backoff: retry_backoff.as_ref().map(|b| RetryBackoff {
            initial: b.initial_ms,
            max: b.max_ms,
            multiplier: b.multiplier,
        }),
        dead_letter_on_expiry: *dead_letter_on_expiry,
        max_length: *max_length,
        max_lease_total: *max_lease_total_ms,
        dedup_window: *dedup_window_ms,
        on_poison,
        content_based_dedup: *content_based_dedup,
    })
}

/// Prefixes a validation error's field with the entry it came from.
fn at(entry: &str, e: QueueError) -> QueueError {
    match e {
        QueueError::InvalidArgument {
            field,
            value,
            reason,
        } => QueueError::InvalidArgument {
            field: format!("{entry}.{}", field.trim_start_matches("config.")),
            value,
            reason,
        },
        other => other,
    }
}

impl Broker {
    /// Every queue, exchange and binding, in name order.
    pub fn export_definitions(&self) -> Definitions {
        let st = self.lock();
        let mut queues: Vec<QueueDef> = st
            .names
            .iter()
            .filter_map(|(n, qid)| st.queues.get(qid).map(|q| queue_def(n, &q.config)))
            .collect();
        queues.sort_by(|a, b| a.name.cmp(&b.name));
        let exchanges = st
            .exchanges
            .keys()
            .map(|n| ExchangeDef { name: n.clone() })
            .collect();
        let bindings = st
            .exchanges
            .iter()
            .flat_map(|(x, e)| {
                e.bindings.iter().map(move |(q, f)| BindingDef {
                    exchange: x.clone(),
                    queue: q.clone(),
                    filter: f.iter().cloned().collect(),
                })
            })
            .collect();
        Definitions {
            queues,
            exchanges,
            bindings,
        }
    }

    /// Parses and applies a definitions document (see the module doc).
    pub async fn import_definitions_json(&self, json: &str) -> Result<ImportReport> {
        let defs: Definitions = serde_json::from_str(json).map_err(|e| {
            QueueError::invalid(
                "definitions",
                format!("line {} column {}", e.line(), e.column()),
                format!("is not a definitions document: {e}"),
            )
        })?;
        self.import_definitions(&defs).await
    }

    /// Applies a definitions document (see the module doc).
    pub async fn import_definitions(&self, defs: &Definitions) -> Result<ImportReport> {
        // Checks that need no state.
        let mut configs = Vec::with_capacity(defs.queues.len());
        let mut seen = BTreeSet::new();
        for (i, d) in defs.queues.iter().enumerate() {
            let entry = format!("queues[{i}]");
            validate::name(&format!("{entry}.name"), &d.name)?;
            if !seen.insert(d.name.clone()) {
                return Err(QueueError::invalid(
                    format!("{entry}.name"),
                    &d.name,
                    "appears twice",
                ));
            }
            let cfg = validate::new_config(&input(i, d)?).map_err(|e| at(&entry, e))?;
            configs.push(cfg);
        }
        let mut xseen = BTreeSet::new();
        for (i, x) in defs.exchanges.iter().enumerate() {
            validate::name(&format!("exchanges[{i}].name"), &x.name)?;
            if !xseen.insert(x.name.clone()) {
                return Err(QueueError::invalid(
                    format!("exchanges[{i}].name"),
                    &x.name,
                    "appears twice",
                ));
            }
        }
        let now = self.now();
        let (report, commit) = {
            let mut st = self.lock();
            // The state after the import: existing queues plus new ones.
            let mut kinds: BTreeMap<String, (QueueKind, Option<String>)> = st
                .names
                .iter()
                .filter_map(|(n, qid)| {
                    st.queues.get(qid).map(|q| {
                        (
                            n.clone(),
                            (
                                q.config.kind,
                                q.config.dead_letter.as_ref().map(|d| d.queue.clone()),
                            ),
                        )
                    })
                })
                .collect();
            let mut new_queues = Vec::new();
            for (i, (d, cfg)) in defs.queues.iter().zip(&configs).enumerate() {
                match st.names.get(&d.name).and_then(|qid| st.queues.get(qid)) {
                    Some(q) if q.config == *cfg => {}
                    Some(q) => {
                        let (detail, differ) = super::admin::describe_difference(&q.config, cfg);
                        return Err(QueueError::AlreadyExists {
                            kind: "queue",
                            name: d.name.clone(),
                            detail: format!("{detail} (queues[{i}]); change it with UpdateQueue"),
                            differ,
                        });
                    }
                    None => {
                        kinds.insert(
                            d.name.clone(),
                            (cfg.kind, cfg.dead_letter.as_ref().map(|x| x.queue.clone())),
                        );
                        new_queues.push((i, d.name.clone(), cfg.clone()));
                    }
                }
            }
            for (i, name, cfg) in &new_queues {
                let Some(dl) = &cfg.dead_letter else { continue };
                let field = format!("queues[{i}].dead_letter.queue");
                if dl.queue == *name {
                    return Err(QueueError::invalid(
                        field,
                        &dl.queue,
                        "a queue cannot be its own dead letter queue",
                    ));
                }
                let Some((kind, _)) = kinds.get(&dl.queue) else {
                    return Err(QueueError::invalid(
                        field,
                        &dl.queue,
                        "names no existing or defined queue",
                    ));
                };
                if *kind != cfg.kind {
                    return Err(QueueError::invalid(
                        field,
                        &dl.queue,
                        format!(
                            "is {kind} but {name:?} is {}; they must be of the same kind",
                            cfg.kind
                        ),
                    ));
                }
                // Follow the chain; it must not come back.
                let mut cur = Some(dl.queue.clone());
                let mut steps = 0;
                while let Some(c) = cur {
                    if c == *name || steps > kinds.len() {
                        return Err(QueueError::invalid(
                            field,
                            &dl.queue,
                            "dead letter queues would form a loop",
                        ));
                    }
                    cur = kinds.get(&c).and_then(|(_, next)| next.clone());
                    steps += 1;
                }
            }
            let exchange_names: BTreeSet<String> = st
                .exchanges
                .keys()
                .cloned()
                .chain(defs.exchanges.iter().map(|x| x.name.clone()))
                .collect();
            for (i, b) in defs.bindings.iter().enumerate() {
                if !exchange_names.contains(&b.exchange) {
                    return Err(QueueError::invalid(
                        format!("bindings[{i}].exchange"),
                        &b.exchange,
                        "names no existing or defined exchange",
                    ));
                }
                match kinds.get(&b.queue) {
                    None => {
                        return Err(QueueError::invalid(
                            format!("bindings[{i}].queue"),
                            &b.queue,
                            "names no existing or defined queue",
                        ));
                    }
                    Some((QueueKind::Fifo, _)) => {
                        return Err(QueueError::invalid(
                            format!("bindings[{i}].queue"),
                            &b.queue,
                            "is a FIFO queue; FIFO queues cannot be bound to exchanges",
                        ));
                    }
                    Some(_) => {}
                }
                let filter: Vec<(String, String)> = b.filter.clone().into_iter().collect();
                validate::filter(&format!("bindings[{i}].filter"), &filter)?;
            }

            // Everything checked: apply in one transaction; nothing below
            // fails.
            self.decide(&mut st, |st, change| {
                let mut report = ImportReport::default();
                for (_, name, cfg) in new_queues {
                    let qid = st.next_qid;
                    st.next_qid += 1;
                    change.txn.put_sys(SysKey::NextQid, u64::from(st.next_qid));
                    change
                        .txn
                        .put_queue(&name, &persist::queue_record(qid, now, &cfg));
                    change.touch(qid);
                    if let Some(dl) = &cfg.dead_letter {
                        st.dlq_sources
                            .entry(dl.queue.clone())
                            .or_default()
                            .insert(name.clone());
                    }
                    st.names.insert(name.clone(), qid);
                    st.queues.insert(qid, QueueState::new(qid, name, cfg, now));
                    report.queues_created += 1;
                }
                for x in &defs.exchanges {
                    if !st.exchanges.contains_key(&x.name) {
                        let e = ExchangeState {
                            created_at: now,
                            bindings: BTreeMap::new(),
                        };
                        change.txn.put_exchange(&x.name, &e.record());
                        st.exchanges.insert(x.name.clone(), e);
                        report.exchanges_created += 1;
                    }
                }
                let mut touched = BTreeSet::new();
                for b in &defs.bindings {
                    let filter: Vec<(String, String)> = b.filter.clone().into_iter().collect();
                    if let Some(e) = st.exchanges.get_mut(&b.exchange)
                        && e.bindings.get(&b.queue) != Some(&filter)
                    {
                        e.bindings.insert(b.queue.clone(), filter);
                        touched.insert(b.exchange.clone());
                        report.bindings_changed += 1;
                    }
                }
                for name in touched {
                    if let Some(e) = st.exchanges.get(&name) {
                        change.txn.put_exchange(&name, &e.record());
                    }
                }
                Ok(report)
            })?
        };
        durable(commit).await?;
        Ok(report)
    }
}
