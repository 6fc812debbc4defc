//! Queue actions: create, look up, list, delete, attributes, purge, tags,
//! permissions, dead letter sources.
//!
//! `AddPermission` and `RemovePermission` edit the queue's `Policy`
//! document as SQS does (a statement per label, returned by
//! `GetQueueAttributes`); Letterbox does not evaluate SQS policies: who
//! may do what is decided by its principals' grants, as over gRPC.

use serde_json::{Map, Value, json};

use crate::auth::Action;
use crate::queue::QueueError;
use crate::queue::annotations::AnnotationChange;

use super::attributes::{self, TAG_PREFIX, View};
use super::error::SqsError;
use super::{Call, Sqs, integer, queue_name, required, string, strings};

/// Most tags a queue has.
const MAX_TAGS: usize = 50;

/// Checks a new queue's name as SQS does.
fn check_name(name: &str, fifo: bool) -> Result<(), SqsError> {
    let base = name.strip_suffix(".fifo");
    let stem = base.unwrap_or(name);
    let ok_chars = !stem.is_empty()
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok_chars || name.len() > 80 {
        return Err(SqsError::invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ));
    }
    if fifo && base.is_none() {
        return Err(SqsError::invalid(
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or \
             underscores, must end with .fifo suffix and be 1 to 80 in length.",
        ));
    }
    if !fifo && base.is_some() {
        return Err(SqsError::invalid(format!(
            "Value {name} for parameter QueueName is invalid. Reason: The name of a standard \
             queue cannot end with .fifo; give FifoQueue=true for a FIFO queue."
        )));
    }
    Ok(())
}

impl Sqs {
    /// The name of the queue an input's `QueueUrl` names, checked to exist.
    /// The Letterbox queue of an input's `QueueUrl` (of the call's
    /// region), checked to exist.
    pub(crate) fn queue_of(&self, call: &Call, input: &Value) -> Result<String, SqsError> {
        let name = self.engine(call, &queue_name(required(input, "QueueUrl")?)?);
        self.broker.get_queue(&name).map_err(SqsError::from_queue)?;
        Ok(name)
    }

    /// [`Sqs::arn_queue`] as attributes take it.
    fn resolver(&self) -> impl Fn(&str) -> Option<String> + '_ {
        move |arn| self.arn_queue(arn)
    }

    /// A queue's attributes' view.
    fn with_view<R>(
        &self,
        call: &Call,
        name: &str,
        f: impl FnOnce(&View<'_>) -> R,
    ) -> Result<R, SqsError> {
        let info = self.broker.get_queue(name).map_err(SqsError::from_queue)?;
        let stats = self.broker.stats(name).map_err(SqsError::from_queue)?;
        let annotations = self
            .broker
            .annotations(name)
            .map_err(SqsError::from_queue)?;
        let arn_of = |engine: &str| self.arn(call, engine);
        let view = View {
            info: &info,
            stats,
            annotations: &annotations,
            arn_of: &arn_of,
        };
        Ok(f(&view))
    }

    /// Checks that the dead letter queue `dlq` exists and lets `source`
    /// use it (its `RedriveAllowPolicy`).
    fn check_dead_letter_target(&self, source: &str, dlq: &str) -> Result<(), SqsError> {
        let ann = match self.broker.annotations(dlq) {
            Ok(a) => a,
            Err(QueueError::NotFound { .. }) => {
                return Err(SqsError::invalid(format!(
                    "Value for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist: {dlq}."
                )));
            }
            Err(e) => return Err(SqsError::from_queue(e)),
        };
        if !attributes::allows_source(&ann, source, &self.resolver()) {
            return Err(SqsError::invalid(format!(
                "Value for parameter RedrivePolicy is invalid. Reason: Queue {dlq} does not allow \
                 queue {source} to use it as a dead-letter queue (its RedriveAllowPolicy)."
            )));
        }
        Ok(())
    }

    pub(crate) async fn create_queue(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let sqs_name = required(input, "QueueName")?.to_string();
        let name = self.engine(call, &sqs_name);
        self.allow(call, Action::Admin, &name)?;
        let attrs = input.get("Attributes");
        let tags = tag_pairs(input.get("tags").or_else(|| input.get("Tags")))?;
        if tags.len() > MAX_TAGS {
            return Err(SqsError::invalid(format!(
                "Too many tags added for queue {name}."
            )));
        }
        if self.broker.get_queue(&name).is_ok() {
            let differs = self.with_view(call, &name, |v| {
                attributes::first_difference(v, attrs, &self.resolver())
            })?;
            if let Some(a) = differs {
                return Err(SqsError::queue_exists(format!(
                    "A queue already exists with the same name and a different value for attribute {a}"
                )));
            }
            return Ok(json!({"QueueUrl": self.url(call, &name)}));
        }
        let c = attributes::changes(attrs, true, None, &self.resolver())?;
        check_name(&sqs_name, c.fifo)?;
        if let Some(dlq) = &c.dead_letter {
            self.check_dead_letter_target(&name, dlq)?;
        }
        let mut changes = c.annotations;
        changes.extend(
            tags.into_iter()
                .map(|(k, v)| (format!("{TAG_PREFIX}{k}"), Some(v))),
        );
        let annotations = attributes::initial(changes, self.now())?;
        match self
            .broker
            .create_queue_annotated(&name, &c.input, annotations)
            .await
        {
            Ok((_, created)) => {
                if created {
                    self.audit(call, &name, "created over SQS");
                }
                Ok(json!({"QueueUrl": self.url(call, &name)}))
            }
            Err(QueueError::AlreadyExists { .. }) => Err(SqsError::queue_exists(format!(
                "A queue already exists with the same name and different attributes: {name}"
            ))),
            Err(e) => Err(SqsError::from_queue(e)),
        }
    }

    pub(crate) fn get_queue_url(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.engine(call, required(input, "QueueName")?);
        self.broker.get_queue(&name).map_err(SqsError::from_queue)?;
        self.allow(call, Action::Admin, &name)
            .or_else(|_| self.allow(call, Action::Publish, &name))
            .or_else(|_| self.allow(call, Action::Consume, &name))?;
        Ok(json!({"QueueUrl": self.url(call, &name)}))
    }

    pub(crate) fn list_queues(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let prefix = self.engine(call, string(input, "QueueNamePrefix").unwrap_or_default());
        let max = match integer(input, "MaxResults")? {
            None => None,
            Some(n) if (1..=1000).contains(&n) => Some(u32::try_from(n).unwrap_or(1000)),
            Some(n) => {
                return Err(SqsError::bad_value(
                    "MaxResults",
                    n,
                    "MaxResults must be an integer between 1 and 1000.",
                ));
            }
        };
        let after = match string(input, "NextToken") {
            Some(t) if max.is_some() => Some(decode_token(t)?),
            _ => None,
        };
        let (found, next) = self
            .broker
            .list_queues(&prefix, max.unwrap_or(1000), after.as_deref())
            .map_err(SqsError::from_queue)?;
        let urls: Vec<Value> = found
            .iter()
            .filter(|q| self.regions.local(&call.region, &q.name).is_some())
            .filter(|q| call.principal.sees(&q.name))
            .map(|q| Value::String(self.url(call, &q.name)))
            .collect();
        let mut out = Map::new();
        if !urls.is_empty() {
            out.insert("QueueUrls".into(), Value::Array(urls));
        }
        if let (Some(_), Some(n)) = (max, next) {
            out.insert("NextToken".into(), encode_token(&n).into());
        }
        Ok(Value::Object(out))
    }

    pub(crate) async fn delete_queue(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        // SQS deletes a dead letter queue in use: its sources keep no
        // dead letter queue (Letterbox detaches them).
        let n = self
            .broker
            .delete_queue(&name, true)
            .await
            .map_err(SqsError::from_queue)?;
        self.audit(call, &name, &format!("deleted over SQS with {n} messages"));
        Ok(json!({}))
    }

    pub(crate) async fn get_queue_attributes(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)
            .or_else(|_| self.allow(call, Action::Consume, &name))?;
        let names = strings(input, "AttributeNames");
        // Leases that ran out (a receive's 0 s visibility) end before the
        // figures are read.
        self.broker
            .run_timers()
            .await
            .map_err(SqsError::from_queue)?;
        let attrs = self.with_view(call, &name, |v| v.get(&names))??;
        if attrs.is_empty() {
            return Ok(json!({}));
        }
        Ok(json!({"Attributes": attrs}))
    }

    pub(crate) async fn set_queue_attributes(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let Some(attrs) = input.get("Attributes") else {
            return Err(SqsError::missing("Attributes"));
        };
        let info = self.broker.get_queue(&name).map_err(SqsError::from_queue)?;
        let c = attributes::changes(Some(attrs), false, Some(info.config.kind), &self.resolver())?;
        if let Some(dlq) = &c.dead_letter {
            self.check_dead_letter_target(&name, dlq)?;
        }
        let annotations = attributes::stamped(c.annotations, self.now());
        self.broker
            .update_queue_annotated(&name, &c.input, c.removals, &annotations)
            .await
            .map_err(SqsError::from_queue)?;
        self.audit(call, &name, "attributes set over SQS");
        Ok(json!({}))
    }

    pub(crate) async fn purge_queue(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let now = self.now();
        {
            let mut purges = self.purges.lock().unwrap_or_else(|e| e.into_inner());
            purges.retain(|_, at| now < *at + 60_000);
            if purges.contains_key(&name) {
                return Err(SqsError::purge_in_progress(&name));
            }
            purges.insert(name.clone(), now);
        }
        let n = self
            .broker
            .purge_queue(&name)
            .await
            .map_err(SqsError::from_queue)?;
        self.audit(call, &name, &format!("purged over SQS: {n} messages"));
        Ok(json!({}))
    }

    pub(crate) async fn tag_queue(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let tags = tag_pairs(input.get("Tags"))?;
        if tags.is_empty() {
            return Err(SqsError::missing("Tags"));
        }
        let changes: Vec<AnnotationChange> = tags
            .iter()
            .map(|(k, v)| (format!("{TAG_PREFIX}{k}"), Some(v.clone())))
            .collect();
        let changes = attributes::stamped(changes, self.now());
        self.broker
            .update_annotations(&name, |current| {
                let mut all = attributes::tags(current);
                for (k, v) in &tags {
                    all.insert(k.clone(), Value::String(v.clone()));
                }
                if all.len() > MAX_TAGS {
                    return Err(SqsError::invalid(format!(
                        "Too many tags added for queue {name}."
                    )));
                }
                Ok((changes, ()))
            })
            .await
            .map_err(SqsError::from_queue)??;
        Ok(json!({}))
    }

    pub(crate) async fn untag_queue(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let keys = strings(input, "TagKeys");
        if keys.is_empty() || keys.iter().any(|k| k.is_empty() || k.len() > 128) {
            return Err(SqsError::invalid(
                "Tag keys must be between 1 and 128 characters in length.",
            ));
        }
        let changes: Vec<AnnotationChange> = keys
            .into_iter()
            .map(|k| (format!("{TAG_PREFIX}{k}"), None))
            .collect();
        self.broker
            .update_annotations(&name, |_| {
                Ok::<_, SqsError>((attributes::stamped(changes, self.now()), ()))
            })
            .await
            .map_err(SqsError::from_queue)??;
        Ok(json!({}))
    }

    pub(crate) fn list_queue_tags(&self, call: &Call, input: &Value) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)
            .or_else(|_| self.allow(call, Action::Consume, &name))?;
        let tags = attributes::tags(
            &self
                .broker
                .annotations(&name)
                .map_err(SqsError::from_queue)?,
        );
        if tags.is_empty() {
            return Ok(json!({}));
        }
        Ok(json!({"Tags": tags}))
    }

    pub(crate) fn list_dead_letter_source_queues(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let max = match integer(input, "MaxResults")? {
            None => None,
            Some(n) if (1..=1000).contains(&n) => usize::try_from(n).ok(),
            Some(n) => {
                return Err(SqsError::bad_value(
                    "MaxResults",
                    n,
                    "MaxResults must be an integer between 1 and 1000.",
                ));
            }
        };
        let info = self.broker.get_queue(&name).map_err(SqsError::from_queue)?;
        let after = match string(input, "NextToken") {
            Some(t) if max.is_some() => Some(decode_token(t)?),
            _ => None,
        };
        let mut sources: Vec<String> = info
            .dead_letter_sources
            .into_iter()
            .filter(|s| after.as_ref().is_none_or(|a| s > a))
            .collect();
        sources.sort();
        let mut out = Map::new();
        let mut next = None;
        if let Some(m) = max
            && sources.len() > m
        {
            sources.truncate(m);
            next = sources.last().cloned();
        }
        out.insert(
            "queueUrls".into(),
            Value::Array(
                sources
                    .iter()
                    .map(|s| Value::String(self.url(call, s)))
                    .collect(),
            ),
        );
        if let Some(n) = next {
            out.insert("NextToken".into(), encode_token(&n).into());
        }
        Ok(Value::Object(out))
    }

    pub(crate) async fn add_permission(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let label = required(input, "Label")?.to_string();
        let accounts = strings(input, "AWSAccountIds");
        let actions = strings(input, "Actions");
        if actions.is_empty() {
            return Err(SqsError::missing("Actions"));
        }
        if accounts.is_empty() {
            return Err(SqsError::bad_value(
                "PrincipalId",
                "[]",
                "Unable to verify.",
            ));
        }
        if actions.len() > 7 {
            return Err(SqsError::over_limit(format!(
                "{} Actions were found, maximum allowed is 7.",
                actions.len()
            )));
        }
        const OWNER_ONLY: [&str; 6] = [
            "AddPermission",
            "RemovePermission",
            "CreateQueue",
            "DeleteQueue",
            "SetQueueAttributes",
            "TagQueue",
        ];
        if let Some(a) = actions.iter().find(|a| OWNER_ONLY.contains(&a.as_str())) {
            return Err(SqsError::bad_value(
                "ActionName",
                format!("SQS:{a}"),
                "Only the queue owner is allowed to invoke this action.",
            ));
        }
        let arn = self.arn(call, &name);
        self.edit_policy(&name, |policy| {
            let mut policy = policy.unwrap_or_else(|| {
                let mut m = Map::new();
                m.insert("Version".into(), "2012-10-17".into());
                m.insert("Id".into(), format!("{arn}/SQSDefaultPolicy").into());
                m
            });
            let mut statements = take_statements(&mut policy);
            if statements
                .iter()
                .any(|s| s.get("Sid").and_then(Value::as_str) == Some(label.as_str()))
            {
                return Err(SqsError::bad_value("Label", &label, "Already exists."));
            }
            let principal = |a: &String| Value::String(format!("arn:aws:iam::{a}:root"));
            let action = |a: &String| Value::String(format!("SQS:{a}"));
            let one_or_many = |v: Vec<Value>| {
                if v.len() == 1 {
                    v.into_iter().next().unwrap_or(Value::Null)
                } else {
                    Value::Array(v)
                }
            };
            statements.push(json!({
                "Sid": label,
                "Effect": "Allow",
                "Principal": {"AWS": one_or_many(accounts.iter().map(principal).collect())},
                "Action": one_or_many(actions.iter().map(action).collect()),
                "Resource": arn,
            }));
            policy.insert("Statement".into(), Value::Array(statements));
            Ok(policy)
        })
        .await
    }

    pub(crate) async fn remove_permission(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let name = self.queue_of(call, input)?;
        self.allow(call, Action::Admin, &name)?;
        let label = required(input, "Label")?.to_string();
        self.edit_policy(&name, |policy| {
            let mut policy = policy.unwrap_or_default();
            let mut statements = take_statements(&mut policy);
            let before = statements.len();
            statements.retain(|s| s.get("Sid").and_then(Value::as_str) != Some(label.as_str()));
            if statements.len() == before {
                return Err(SqsError::bad_value(
                    "Label",
                    &label,
                    "can't find label on existing policy.",
                ));
            }
            policy.insert("Statement".into(), Value::Array(statements));
            Ok(policy)
        })
        .await
    }

    /// Changes a queue's `Policy` document as `edit` decides from the
    /// current one, atomically.
    async fn edit_policy(
        &self,
        name: &str,
        edit: impl FnOnce(Option<Map<String, Value>>) -> Result<Map<String, Value>, SqsError>,
    ) -> Result<Value, SqsError> {
        let now = self.now();
        self.broker
            .update_annotations(name, |current| {
                let policy = Value::Object(edit(policy_of(current))?);
                let changes = vec![(
                    format!("{}Policy", attributes::PREFIX),
                    Some(policy.to_string()),
                )];
                Ok((attributes::stamped(changes, now), ()))
            })
            .await
            .map_err(SqsError::from_queue)??;
        Ok(json!({}))
    }
}

/// A policy's `Statement` list, taken out of it.
fn take_statements(policy: &mut Map<String, Value>) -> Vec<Value> {
    match policy.remove("Statement") {
        Some(Value::Array(a)) => a,
        Some(one @ Value::Object(_)) => vec![one],
        _ => Vec::new(),
    }
}

/// The policy of a queue's annotations, as an object.
fn policy_of(annotations: &[(String, String)]) -> Option<Map<String, Value>> {
    match attributes::annotated(annotations, "Policy").map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(m))) => Some(m),
        _ => None,
    }
}

/// Tags given as a map, checked (keys 1 to 128 characters, values at most
/// 256).
fn tag_pairs(v: Option<&Value>) -> Result<Vec<(String, String)>, SqsError> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let Value::Object(m) = v else {
        return Err(SqsError::invalid(
            "Tags must be a map of tag keys to values.",
        ));
    };
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let v = v.as_str().unwrap_or_default();
        if k.is_empty() || k.len() > 128 {
            return Err(SqsError::invalid(
                "Tag keys must be between 1 and 128 characters in length.",
            ));
        }
        if v.len() > 256 {
            return Err(SqsError::invalid(format!(
                "Tag values can be at most 256 characters long; the value of tag {k} is {}.",
                v.len()
            )));
        }
        out.push((k.clone(), v.to_string()));
    }
    Ok(out)
}

/// A paging token: the last name of the page, in base64.
fn encode_token(name: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(name)
}

fn decode_token(t: &str) -> Result<String, SqsError> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| SqsError::invalid(format!("Invalid NextToken value {t}.")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_sqs_rules() {
        assert!(check_name("orders", false).is_ok());
        assert!(check_name("a-b_C9", false).is_ok());
        assert!(check_name("q.fifo", true).is_ok());
        assert!(check_name(&"p".repeat(81), false).is_err());
        assert!(check_name("/my/test", false).is_err());
        assert!(check_name("", false).is_err());
        assert!(check_name("q", true).is_err());
        assert!(check_name("q.fifo", false).is_err());
        assert_eq!(
            check_name("!@£$%^&*()queue", false).unwrap_err().message,
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        );
    }

    #[test]
    fn paging_tokens_round_trip() {
        assert_eq!(decode_token(&encode_token("q-3")).unwrap(), "q-3");
        assert!(decode_token("***").is_err());
    }
}
