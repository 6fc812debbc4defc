//! Queue attributes ⇄ a Letterbox queue's configuration and annotations.
//!
//! | SQS attribute | Letterbox |
//! |---|---|
//! | `VisibilityTimeout` (s) | `ack_timeout`; 0 (which the engine's 1 s minimum cannot hold) is the annotation `sqs.VisibilityTimeout0`, and SQS receives then lease for 0 ms |
//! | `DelaySeconds` | `delivery_delay` |
//! | `MessageRetentionPeriod` | `message_ttl` |
//! | `RedrivePolicy` | `dead_letter` (`maxReceiveCount` is `max_deliveries`), given back as SQS gives it |
//! | `FifoQueue`, `ContentBasedDeduplication` | `kind`, `content_based_dedup` |
//! | `CreatedTimestamp` | `created_at` |
//!
//! A queue created over SQS takes SQS's defaults where they differ from
//! Letterbox's: a visibility timeout of 30 s and a retention of 4 days.
//!
//! | | |
//! |---|---|
//! | `ApproximateNumberOfMessages*` | the exact figures: ready (with parked), in flight, delayed |
//! | `MaximumMessageSize`, `ReceiveMessageWaitTimeSeconds`, `RedriveAllowPolicy`, `Policy`, `DeduplicationScope`, `FifoThroughputLimit`, `KmsMasterKeyId`, `KmsDataKeyReusePeriodSeconds`, `SqsManagedSseEnabled`, `LastModifiedTimestamp` | annotations `sqs.NAME`, kept with the queue and enforced here where SQS enforces them |

use serde_json::{Map, Value};

use crate::queue::model::{
    DeadLetterInput, QueueConfigInput, QueueInfo, QueueKind, QueueRemovals, QueueStats, SECOND,
};

use crate::queue::annotations::AnnotationChange;

use super::error::SqsError;

/// The annotation prefix of SQS attributes.
pub(crate) const PREFIX: &str = "sqs.";
/// The annotation of a `VisibilityTimeout` of 0.
const VISIBILITY_ZERO: &str = "sqs.VisibilityTimeout0";
/// The annotation prefix of tags.
pub(crate) const TAG_PREFIX: &str = "sqs.tag.";

/// SQS's default `VisibilityTimeout` (s) of a queue it creates.
const DEFAULT_VISIBILITY: u64 = 30;
/// SQS's default `MessageRetentionPeriod` (s): 4 days.
const DEFAULT_RETENTION: u64 = 345_600;

/// The default `MaximumMessageSize`, and its bounds.
pub(crate) const MAX_MESSAGE_SIZE: (u64, u64, u64) = (1024, 1_048_576, 1_048_576);

/// Every attribute `GetQueueAttributes` knows.
const NAMES: [&str; 21] = [
    "Policy",
    "VisibilityTimeout",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
    "ApproximateNumberOfMessagesDelayed",
    "DelaySeconds",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "RedriveAllowPolicy",
    "SqsManagedSseEnabled",
];

/// A queue's ARN.
pub(crate) fn arn(region: &str, account: &str, name: &str) -> String {
    format!("arn:aws:sqs:{region}:{account}:{name}")
}

/// The region and queue name of an SQS ARN
/// (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
pub(crate) fn arn_parts(arn: &str) -> Option<(&str, &str)> {
    let mut parts = arn.splitn(6, ':');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some("arn"), Some(_), Some("sqs"), Some(region), Some(_), Some(name))
            if !name.is_empty() && !region.is_empty() =>
        {
            Some((region, name))
        }
        _ => None,
    }
}

/// Maps an SQS ARN to the Letterbox queue it names (`None`: not an SQS
/// ARN).
pub(crate) type Resolve<'a> = &'a dyn Fn(&str) -> Option<String>;

fn annotation<'a>(ann: &'a [(String, String)], name: &str) -> Option<&'a str> {
    ann.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A named attribute's annotation.
pub(crate) fn annotated<'a>(ann: &'a [(String, String)], attribute: &str) -> Option<&'a str> {
    annotation(ann, &format!("{PREFIX}{attribute}"))
}

/// The queue's `VisibilityTimeout` is 0.
pub(crate) fn visibility_zero(ann: &[(String, String)]) -> bool {
    annotation(ann, VISIBILITY_ZERO) == Some("true")
}

/// The queue's `ReceiveMessageWaitTimeSeconds`, in seconds.
pub(crate) fn default_wait(ann: &[(String, String)]) -> u64 {
    annotated(ann, "ReceiveMessageWaitTimeSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The queue's `MaximumMessageSize`.
pub(crate) fn max_message_size(ann: &[(String, String)]) -> u64 {
    annotated(ann, "MaximumMessageSize")
        .and_then(|v| v.parse().ok())
        .unwrap_or(MAX_MESSAGE_SIZE.2)
}

/// The queue's tags.
pub(crate) fn tags(ann: &[(String, String)]) -> Map<String, Value> {
    ann.iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(TAG_PREFIX)
                .map(|t| (t.to_string(), Value::String(v.clone())))
        })
        .collect()
}

/// A queue as the attributes describe it.
pub(crate) struct View<'a> {
    pub(crate) info: &'a QueueInfo,
    pub(crate) stats: QueueStats,
    pub(crate) annotations: &'a [(String, String)],
    /// The ARN of a Letterbox queue.
    pub(crate) arn_of: &'a dyn Fn(&str) -> String,
}

impl View<'_> {
    /// An attribute's value, `None` when the queue has none.
    pub(crate) fn value(&self, name: &str) -> Option<String> {
        let c = &self.info.config;
        let fifo = c.kind.is_fifo();
        let secs = |ms: u64| (ms / SECOND).to_string();
        Some(match name {
            "VisibilityTimeout" if visibility_zero(self.annotations) => "0".into(),
            "VisibilityTimeout" => secs(c.ack_timeout),
            "DelaySeconds" => secs(c.delivery_delay),
            "MessageRetentionPeriod" => secs(c.message_ttl),
            "MaximumMessageSize" => max_message_size(self.annotations).to_string(),
            "ReceiveMessageWaitTimeSeconds" => default_wait(self.annotations).to_string(),
            "ApproximateNumberOfMessages" => (self.stats.ready + self.stats.parked).to_string(),
            "ApproximateNumberOfMessagesNotVisible" => self.stats.in_flight.to_string(),
            "ApproximateNumberOfMessagesDelayed" => self.stats.delayed.to_string(),
            "CreatedTimestamp" => secs(self.info.created_at),
            "LastModifiedTimestamp" => annotated(self.annotations, "LastModifiedTimestamp")
                .map_or_else(|| secs(self.info.created_at), str::to_string),
            "QueueArn" => (self.arn_of)(&self.info.name),
            "RedrivePolicy" => {
                let dl = c.dead_letter.as_ref()?;
                let target = (self.arn_of)(&dl.queue);
                // As SQS gives it back: the count a number, whatever the
                // request sent.
                format!(
                    "{{\"deadLetterTargetArn\": {}, \"maxReceiveCount\": {}}}",
                    Value::String(target),
                    dl.max_deliveries
                )
            }
            "FifoQueue" if fifo => "true".into(),
            "ContentBasedDeduplication" if fifo => c.content_based_dedup.to_string(),
            "DeduplicationScope" if fifo => annotated(self.annotations, "DeduplicationScope")
                .unwrap_or("queue")
                .to_string(),
            "FifoThroughputLimit" if fifo => annotated(self.annotations, "FifoThroughputLimit")
                .unwrap_or("perQueue")
                .to_string(),
            "SqsManagedSseEnabled" => annotated(self.annotations, "SqsManagedSseEnabled")
                .unwrap_or("false")
                .to_string(),
            "Policy" | "RedriveAllowPolicy" | "KmsMasterKeyId" | "KmsDataKeyReusePeriodSeconds" => {
                annotated(self.annotations, name)?.to_string()
            }
            _ => return None,
        })
    }

    /// The `Attributes` of `GetQueueAttributes` for `names` (`All` for
    /// every one); an unknown name is refused.
    pub(crate) fn get(&self, names: &[String]) -> Result<Map<String, Value>, SqsError> {
        let mut out = Map::new();
        for n in names {
            if n == "All" {
                for a in NAMES {
                    if let Some(v) = self.value(a) {
                        out.insert(a.to_string(), v.into());
                    }
                }
            } else if NAMES.contains(&n.as_str()) {
                if let Some(v) = self.value(n) {
                    out.insert(n.clone(), v.into());
                }
            } else {
                return Err(SqsError::attribute_name(n));
            }
        }
        Ok(out)
    }
}

/// A `RedrivePolicy`: `Some((dead letter queue, maxReceiveCount))`, or
/// `None` for an empty one (`""` or `{}`), which removes it.
pub(crate) fn parse_redrive(
    text: &str,
    resolve: Resolve<'_>,
) -> Result<Option<(String, u32)>, SqsError> {
    let bad = |why: &str| {
        SqsError::invalid(format!(
            "Value {text} for parameter RedrivePolicy is invalid. Reason: {why}"
        ))
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let v: Value =
        serde_json::from_str(text).map_err(|_| bad("Redrive policy is not a valid JSON map."))?;
    let Value::Object(m) = v else {
        return Err(bad("Redrive policy is not a valid JSON map."));
    };
    if m.is_empty() {
        return Ok(None);
    }
    let target = m
        .get("deadLetterTargetArn")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            bad("Redrive policy does not contain mandatory attribute: deadLetterTargetArn.")
        })?;
    let name = resolve(target).ok_or_else(|| bad("Invalid value for deadLetterTargetArn."))?;
    let count = match m.get("maxReceiveCount") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        None => {
            return Err(bad(
                "Redrive policy does not contain mandatory attribute: maxReceiveCount.",
            ));
        }
        _ => None,
    };
    let count = count
        .filter(|c| (1..=1000).contains(c))
        .and_then(|c| u32::try_from(c).ok())
        .ok_or_else(|| {
            bad("Invalid value for maxReceiveCount: must be an integer from 1 to 1000.")
        })?;
    Ok(Some((name, count)))
}

/// A `RedriveAllowPolicy`, checked: `redrivePermission` `allowAll`,
/// `denyAll` or `byQueue` (with 1 to 10 `sourceQueueArns`).
fn check_redrive_allow(text: &str) -> Result<(), SqsError> {
    let bad = |why: &str| {
        SqsError::invalid(format!(
            "Value {text} for parameter RedriveAllowPolicy is invalid. Reason: {why}"
        ))
    };
    let v: Value = serde_json::from_str(text).map_err(|_| bad("Not a valid JSON map."))?;
    match v.get("redrivePermission").and_then(Value::as_str) {
        Some("allowAll" | "denyAll") => Ok(()),
        Some("byQueue") => match v.get("sourceQueueArns").and_then(Value::as_array) {
            Some(a)
                if (1..=10).contains(&a.len())
                    && a.iter().all(|x| x.as_str().and_then(arn_parts).is_some()) =>
            {
                Ok(())
            }
            _ => Err(bad("byQueue needs sourceQueueArns: 1 to 10 queue ARNs.")),
        },
        _ => Err(bad(
            "redrivePermission must be allowAll, denyAll or byQueue.",
        )),
    }
}

/// Whether the queue `dlq`'s `RedriveAllowPolicy` lets the Letterbox
/// queue `source` use it as its dead letter queue.
pub(crate) fn allows_source(
    dlq_annotations: &[(String, String)],
    source: &str,
    resolve: Resolve<'_>,
) -> bool {
    let Some(text) = annotated(dlq_annotations, "RedriveAllowPolicy") else {
        return true;
    };
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return true;
    };
    match v.get("redrivePermission").and_then(Value::as_str) {
        Some("denyAll") => false,
        Some("byQueue") => v
            .get("sourceQueueArns")
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .any(|x| x.as_str().and_then(resolve).as_deref() == Some(source))
            }),
        _ => true,
    }
}

/// What a `CreateQueue` or `SetQueueAttributes` asks for.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// The engine's settings.
    pub(crate) input: QueueConfigInput,
    /// What the engine's settings remove.
    pub(crate) removals: QueueRemovals,
    /// Annotations set (`Some`) or removed (`None`).
    pub(crate) annotations: Vec<AnnotationChange>,
    /// `FifoQueue` was given as `true`.
    pub(crate) fifo: bool,
    /// The dead letter queue a `RedrivePolicy` names (to check its
    /// `RedriveAllowPolicy`).
    pub(crate) dead_letter: Option<String>,
}

fn int(name: &str, value: &str, lo: u64, hi: u64) -> Result<u64, SqsError> {
    match value.trim().parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(SqsError::attribute_value(format!(
            "Invalid value for the parameter {name}."
        ))),
    }
}

fn boolean(name: &str, value: &str) -> Result<bool, SqsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(SqsError::attribute_value(format!(
            "Invalid value for the parameter {name}."
        ))),
    }
}

/// Reads the `Attributes` of a `CreateQueue` (`create`) or
/// `SetQueueAttributes`; `kind` is the queue's kind when it exists.
pub(crate) fn changes(
    attrs: Option<&Value>,
    create: bool,
    kind: Option<QueueKind>,
    resolve: Resolve<'_>,
) -> Result<Changes, SqsError> {
    let mut c = Changes::default();
    if create {
        // SQS's defaults, where Letterbox's differ.
        c.input.ack_timeout = Some(DEFAULT_VISIBILITY * SECOND);
        c.input.message_ttl = Some(DEFAULT_RETENTION * SECOND);
    }
    let Some(attrs) = attrs else {
        return Ok(c);
    };
    let Value::Object(m) = attrs else {
        return Err(SqsError::invalid(
            "Attributes must be a map of attribute names to values.",
        ));
    };
    // FifoQueue first: the FIFO-only attributes depend on it.
    let mut pairs: Vec<(String, String)> = m
        .iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.trim().to_string(), text)
        })
        .collect();
    pairs.sort_by_key(|(k, _)| k != "FifoQueue");
    let mut fifo = kind.is_some_and(QueueKind::is_fifo);
    let now = |c: &mut Changes, name: &str, v: Option<String>| {
        c.annotations.push((format!("{PREFIX}{name}"), v));
    };
    for (name, value) in pairs {
        match name.as_str() {
            "FifoQueue" if create => {
                c.fifo = value.trim().eq_ignore_ascii_case("true");
                fifo = c.fifo;
                if c.fifo {
                    c.input.kind = Some(QueueKind::Fifo);
                }
            }
            "FifoQueue" => {
                if boolean(&name, &value)? != fifo {
                    return Err(SqsError::invalid(
                        "Value for parameter FifoQueue is invalid. Reason: Modifying queue type is not supported.",
                    ));
                }
            }
            "VisibilityTimeout" => {
                let v = int(&name, &value, 0, 43_200)?;
                c.input.ack_timeout = Some(v.max(1) * SECOND);
                c.annotations
                    .push((VISIBILITY_ZERO.into(), (v == 0).then(|| "true".to_string())));
            }
            "DelaySeconds" => c.input.delivery_delay = Some(int(&name, &value, 0, 900)? * SECOND),
            "MessageRetentionPeriod" => {
                c.input.message_ttl = Some(int(&name, &value, 60, 1_209_600)? * SECOND);
            }
            "MaximumMessageSize" => {
                let v = int(&name, &value, MAX_MESSAGE_SIZE.0, MAX_MESSAGE_SIZE.1)?;
                now(&mut c, &name, Some(v.to_string()));
            }
            "ReceiveMessageWaitTimeSeconds" => {
                let v = int(&name, &value, 0, 20)?;
                now(&mut c, &name, Some(v.to_string()));
            }
            "KmsDataKeyReusePeriodSeconds" => {
                let v = int(&name, &value, 60, 86_400)?;
                now(&mut c, &name, Some(v.to_string()));
            }
            "SqsManagedSseEnabled" => {
                let v = boolean(&name, &value)?;
                now(&mut c, &name, Some(v.to_string()));
            }
            "KmsMasterKeyId" | "Policy" => {
                let v = (!value.is_empty()).then_some(value);
                if let Some(text) = &v
                    && name == "Policy"
                    && !serde_json::from_str::<Value>(text).is_ok_and(|p| p.is_object())
                {
                    return Err(SqsError::attribute_value(
                        "Invalid value for the parameter Policy.",
                    ));
                }
                now(&mut c, &name, v);
            }
            "RedrivePolicy" => match parse_redrive(&value, resolve)? {
                Some((dlq, count)) => {
                    c.input.dead_letter = Some(DeadLetterInput::new(dlq.clone(), count));
                    c.dead_letter = Some(dlq);
                }
                None => {
                    c.removals.dead_letter = true;
                    c.input.dead_letter_on_expiry = Some(false);
                }
            },
            "RedriveAllowPolicy" => {
                let v = (!value.trim().is_empty()).then_some(value);
                if let Some(text) = &v {
                    check_redrive_allow(text)?;
                }
                now(&mut c, &name, v);
            }
            "ContentBasedDeduplication" | "DeduplicationScope" | "FifoThroughputLimit" if !fifo => {
                return Err(SqsError::invalid(format!(
                    "Unknown Attribute {name}: it applies to FIFO queues only."
                )));
            }
            "ContentBasedDeduplication" => {
                c.input.content_based_dedup = Some(boolean(&name, &value)?);
            }
            "DeduplicationScope" => match value.as_str() {
                "queue" | "messageGroup" => now(&mut c, &name, Some(value)),
                _ => {
                    return Err(SqsError::attribute_value(
                        "Invalid value for the parameter DeduplicationScope.",
                    ));
                }
            },
            "FifoThroughputLimit" => match value.as_str() {
                "perQueue" | "perMessageGroupId" => now(&mut c, &name, Some(value)),
                _ => {
                    return Err(SqsError::attribute_value(
                        "Invalid value for the parameter FifoThroughputLimit.",
                    ));
                }
            },
            other => return Err(SqsError::attribute_name(other)),
        }
    }
    Ok(c)
}

/// `changes` with `LastModifiedTimestamp` set to now, to be applied to a
/// queue's annotations as they are then
/// ([`crate::queue::Broker::update_annotations`]).
pub(crate) fn stamped(mut changes: Vec<AnnotationChange>, now_ms: u64) -> Vec<AnnotationChange> {
    let stamp = format!("{PREFIX}LastModifiedTimestamp");
    changes.retain(|(k, _)| *k != stamp);
    changes.push((stamp, Some((now_ms / SECOND).to_string())));
    changes
}

/// A new queue's annotations: `changes` and `LastModifiedTimestamp`.
pub(crate) fn initial(
    changes: Vec<AnnotationChange>,
    now_ms: u64,
) -> Result<Vec<(String, String)>, SqsError> {
    crate::queue::annotations::applied(&[], &stamped(changes, now_ms)).map_err(SqsError::from_queue)
}

/// Whether the attributes of a `CreateQueue` for an existing queue are
/// those it has: each given attribute's value (normalized) is the
/// queue's. Returns the first that differs.
pub(crate) fn first_difference(
    view: &View<'_>,
    attrs: Option<&Value>,
    resolve: Resolve<'_>,
) -> Option<String> {
    let Value::Object(m) = attrs? else {
        return None;
    };
    for (k, v) in m {
        let name = k.trim();
        let given = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let current = view.value(name);
        let same = match name {
            "FifoQueue" => {
                given.trim().eq_ignore_ascii_case("true") == view.info.config.kind.is_fifo()
            }
            "RedrivePolicy" => {
                parse_redrive(&given, resolve).ok().flatten()
                    == current
                        .as_deref()
                        .and_then(|c| parse_redrive(c, resolve).ok().flatten())
            }
            "Policy" | "RedriveAllowPolicy" => {
                let parse = |t: &str| serde_json::from_str::<Value>(t).ok();
                match &current {
                    Some(c) => parse(c) == parse(&given),
                    None => given.trim().is_empty(),
                }
            }
            "ContentBasedDeduplication" | "SqsManagedSseEnabled" => {
                current.is_some_and(|c| c.eq_ignore_ascii_case(given.trim()))
            }
            _ => match (
                given.trim().parse::<u64>(),
                current.as_deref().map(str::parse::<u64>),
            ) {
                (Ok(g), Some(Ok(c))) => g == c,
                _ => current.as_deref() == Some(given.as_str()),
            },
        };
        if !same {
            return Some(name.to_string());
        }
    }
    None
}
