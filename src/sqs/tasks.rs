//! Message move tasks (`StartMessageMoveTask`, `ListMessageMoveTasks`,
//! `CancelMessageMoveTask`) are Letterbox redrives, kept durably.
//!
//! A task is a record in its dead letter queue's annotations
//! (`crate::edge::move_tasks`: the last tasks of the queue as JSON), written
//! before `StartMessageMoveTask` answers. It runs through the engine's
//! paced redrive ([`Broker::run_redrive`]): back to each message's source,
//! or to `DestinationArn`; at most `MaxNumberOfMessagesPerSecond`
//! messages a second; bounded by the end the queue had when the task
//! started, so that messages dead-lettered later are not moved. While it
//! runs, its count of moved messages is written to its record at most
//! every 200 ms, and each write reads back whether it was cancelled.
//!
//! - **Crash safety.** Every message moves in one transaction (it is in
//!   exactly one queue at every instant), and a task whose record says
//!   `RUNNING` when the endpoint starts is run again from the start of its
//!   queue to its bound: what it moved is no longer there, so nothing
//!   moves twice. Its `ApproximateNumberOfMessagesMoved` is then made up
//!   for the messages moved after its last write: what it could move at
//!   its start less what still waits below its bound.
//! - **Cancelling** (`CancelMessageMoveTask`, or the console) writes
//!   `CANCELLING` into the record; the runner stops at its next write and
//!   leaves `CANCELLED`. A cancel is durable too: a task cancelled before a
//!   crash is not run again.
//! - **Ends.** `COMPLETED` when the walk is over; `FAILED` when a step
//!   fails or the queue the messages go to is gone
//!   (`FailureReason` `AWS.SimpleQueueService.NonExistentQueue`, as SQS
//!   says it). Leased messages are left in place, as redrive leaves them
//!   (leases that ran out, such as a receive's visibility of 0, are ended
//!   before a task starts: those messages move).
//!
//! Tasks run while the SQS endpoint is served (they are started and
//! resumed by it); the console shows them, with their progress, on the
//! dead letter queue's page and can cancel them.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::auth::Action;
use crate::edge::audit;
use crate::queue::Broker;
use crate::queue::QueueError;
use crate::queue::redrive::{RedriveEnd, RedriveSink, RedriveSpec, RedriveStep};

use super::error::SqsError;
use super::{Call, Sqs, integer, required, string};
use crate::edge::move_tasks::{CancelRefused, Status, Task, cancel, of, read, write};

/// The largest `MaxNumberOfMessagesPerSecond`.
const MAX_RATE: i64 = 500;

/// A task handle: base64 of `{"taskId":…,"sourceArn":…}`, as SQS's.
fn handle(id: &str, source_arn: &str) -> String {
    use base64::Engine as _;
    let doc = json!({"taskId": id, "sourceArn": source_arn}).to_string();
    base64::engine::general_purpose::STANDARD.encode(doc)
}

/// The task id and source ARN of a handle.
fn parse_handle(h: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(h.trim())
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    Some((
        v.get("taskId")?.as_str()?.to_string(),
        v.get("sourceArn")?.as_str()?.to_string(),
    ))
}

impl Sqs {
    /// The queue an ARN parameter names, checked to exist
    /// (`ResourceNotFoundException` as SQS words it otherwise).
    fn resource(&self, param: &str, arn: &str) -> Result<String, SqsError> {
        let name = self
            .arn_queue(arn)
            .ok_or_else(|| SqsError::bad_value(param, arn, "Invalid ARN."))?;
        match self.broker.get_queue(&name) {
            Ok(_) => Ok(name),
            Err(QueueError::NotFound { .. }) => Err(SqsError::resource_not_found(format!(
                "The resource that you specified for the {param} parameter doesn't exist."
            ))),
            Err(e) => Err(SqsError::from_queue(e)),
        }
    }

    pub(crate) async fn start_message_move_task(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let source_arn = required(input, "SourceArn")?;
        let source = self.resource("SourceArn", source_arn)?;
        let destination = match string(input, "DestinationArn").filter(|d| !d.is_empty()) {
            Some(d) => Some(self.resource("DestinationArn", d)?),
            None => None,
        };
        let rate = match integer(input, "MaxNumberOfMessagesPerSecond")? {
            None => None,
            Some(r) if (1..=MAX_RATE).contains(&r) => u32::try_from(r).ok(),
            Some(r) => {
                return Err(SqsError::bad_value(
                    "MaxNumberOfMessagesPerSecond",
                    r,
                    &format!("must be between 1 and {MAX_RATE}."),
                ));
            }
        };
        self.allow(call, Action::Admin, &source)?;
        let info = self
            .broker
            .get_queue(&source)
            .map_err(SqsError::from_queue)?;
        if info.dead_letter_sources.is_empty() {
            return Err(SqsError::invalid(
                "Source queue must be configured as a Dead Letter Queue.",
            ));
        }
        match &destination {
            Some(d) => self.allow(call, Action::Publish, d)?,
            None => {
                for s in &info.dead_letter_sources {
                    self.allow(call, Action::Publish, s)?;
                }
            }
        }
        let spec = RedriveSpec {
            dlq: source.clone(),
            target: destination.clone(),
            ..RedriveSpec::default()
        };
        // Leases that ran out (a receive's visibility of 0) end first: their
        // messages are visible, so the task moves them.
        self.broker
            .run_timers()
            .await
            .map_err(SqsError::from_queue)?;
        let end = self
            .broker
            .start_redrive(&spec)
            .map_err(SqsError::from_queue)?;
        // What it can move now: a dry run's count.
        let dry = RedriveSpec {
            dry_run: true,
            ..spec.clone()
        };
        let (plan, ended) = self.broker.run_redrive(&dry, end, 0, 0, &mut Quiet).await;
        if let RedriveEnd::Failed(e) = ended {
            return Err(SqsError::from_queue(e));
        }
        let task = Task {
            id: super::request_id(),
            status: Status::Running,
            destination,
            rate,
            moved: 0,
            to_move: plan.matched - plan.skipped,
            started: self.now(),
            end,
            failure: None,
            by: call.principal.name().to_string(),
        };
        let t = task.clone();
        self.broker
            .update_annotations(&source, move |ann| {
                let mut tasks = read(ann);
                if tasks.iter().any(|t| t.status.active()) {
                    return Err(SqsError::invalid(
                        "There is already a task running. Only one active task is allowed for a \
                         source queue arn at a given time.",
                    ));
                }
                tasks.push(t);
                Ok((vec![write(tasks)], ()))
            })
            .await
            .map_err(SqsError::from_queue)??;
        self.audit(
            call,
            &source,
            &format!(
                "move task {} started: target={} rate={} to_move={}",
                task.id,
                task.destination.as_deref().unwrap_or("(sources)"),
                task.rate.unwrap_or(0),
                task.to_move
            ),
        );
        let handle = handle(&task.id, &self.arn(call, &source));
        spawn(Arc::clone(&self.broker), source, task);
        Ok(json!({"TaskHandle": handle}))
    }

    pub(crate) fn list_message_move_tasks(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let source_arn = required(input, "SourceArn")?;
        let source = self.resource("SourceArn", source_arn)?;
        self.allow(call, Action::Admin, &source)?;
        let max = match integer(input, "MaxResults")? {
            None => 1,
            Some(n) if (1..=10).contains(&n) => usize::try_from(n).unwrap_or(1),
            Some(n) => {
                return Err(SqsError::bad_value(
                    "MaxResults",
                    n,
                    "must be between 1 and 10.",
                ));
            }
        };
        let tasks = of(&self.broker, &source).map_err(SqsError::from_queue)?;
        let results: Vec<Value> = tasks
            .iter()
            .take(max)
            .map(|t| {
                let mut m = Map::new();
                let source_arn = self.arn(call, &source);
                if t.status == Status::Running {
                    m.insert("TaskHandle".into(), handle(&t.id, &source_arn).into());
                }
                m.insert("Status".into(), t.status.name().into());
                m.insert("SourceArn".into(), source_arn.into());
                if let Some(d) = &t.destination {
                    m.insert("DestinationArn".into(), self.arn(call, d).into());
                }
                if let Some(r) = t.rate {
                    m.insert("MaxNumberOfMessagesPerSecond".into(), r.into());
                }
                m.insert("ApproximateNumberOfMessagesMoved".into(), t.moved.into());
                m.insert("ApproximateNumberOfMessagesToMove".into(), t.to_move.into());
                if let Some(f) = &t.failure {
                    m.insert("FailureReason".into(), f.clone().into());
                }
                m.insert("StartedTimestamp".into(), t.started.into());
                Value::Object(m)
            })
            .collect();
        Ok(json!({"Results": results}))
    }

    pub(crate) async fn cancel_message_move_task(
        &self,
        call: &Call,
        input: &Value,
    ) -> Result<Value, SqsError> {
        let h = required(input, "TaskHandle")?;
        let (id, source_arn) = parse_handle(h)
            .ok_or_else(|| SqsError::invalid("Value for parameter TaskHandle is invalid."))?;
        let source = self.resource("SourceArn", &source_arn)?;
        self.allow(call, Action::Admin, &source)?;
        let moved = match cancel(&self.broker, &source, &id)
            .await
            .map_err(SqsError::from_queue)?
        {
            Ok(moved) => moved,
            Err(CancelRefused::NoTask) => {
                return Err(SqsError::resource_not_found("Task does not exist."));
            }
            Err(CancelRefused::NotRunning(s)) => {
                return Err(SqsError::invalid(format!(
                    "Only a task in RUNNING status can be cancelled; task {id} is {}.",
                    s.name()
                )));
            }
        };
        self.audit(call, &source, &format!("move task {id} cancelled"));
        Ok(json!({"ApproximateNumberOfMessagesMoved": moved}))
    }
}

/// A dry run's sink: never cancels.
struct Quiet;

impl RedriveSink for Quiet {
    async fn progress(&mut self, _: &RedriveStep) -> bool {
        true
    }
}

/// What a running task's sink found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stop {
    /// Its record is no longer running (cancelled), or is gone.
    Cancelled,
    /// The queue the messages go to is gone.
    NoTarget,
}

/// A running task's progress, written to its record.
struct Record {
    broker: Arc<Broker>,
    queue: String,
    id: String,
    destination: Option<String>,
    /// Moved before this run (a resumed task).
    before: u64,
    stop: Option<Stop>,
}

/// SQS's failure reason for a queue that is gone.
const NO_QUEUE: &str = "AWS.SimpleQueueService.NonExistentQueue";

impl Record {
    /// Writes the count; false when the task must stop.
    async fn save(&mut self, moved: u64) -> bool {
        let id = self.id.clone();
        let written = self
            .broker
            .update_annotations(&self.queue, |ann| {
                let mut tasks = read(ann);
                let Some(t) = tasks.iter_mut().find(|t| t.id == id) else {
                    return Ok((Vec::new(), false));
                };
                let running = t.status == Status::Running;
                if t.moved == moved {
                    return Ok((Vec::new(), running));
                }
                t.moved = moved;
                Ok::<_, ()>((vec![write(tasks)], running))
            })
            .await;
        match written {
            Ok(Ok(true)) => true,
            _ => {
                self.stop = Some(Stop::Cancelled);
                false
            }
        }
    }
}

impl RedriveSink for Record {
    async fn progress(&mut self, total: &RedriveStep) -> bool {
        if let Some(d) = &self.destination
            && matches!(self.broker.get_queue(d), Err(QueueError::NotFound { .. }))
        {
            self.stop = Some(Stop::NoTarget);
            return false;
        }
        self.save(self.before + total.moved).await
    }
}

/// How a run ended, with a failure as SQS's error code.
enum Ended {
    Done,
    ShutDown,
    Cancelled,
    Failed(&'static str),
}

fn ended_ref(e: &RedriveEnd) -> Ended {
    match e {
        RedriveEnd::Done => Ended::Done,
        RedriveEnd::ShutDown => Ended::ShutDown,
        RedriveEnd::Cancelled => Ended::Cancelled,
        RedriveEnd::Failed(QueueError::NotFound { .. }) => Ended::Failed(NO_QUEUE),
        RedriveEnd::Failed(e) => Ended::Failed(SqsError::from_queue_ref(e).code),
    }
}

/// Runs `task` of `queue` in the background.
fn spawn(broker: Arc<Broker>, queue: String, task: Task) {
    tokio::spawn(run(broker, queue, task));
}

/// Runs a task to its end and writes how it ended.
async fn run(broker: Arc<Broker>, queue: String, task: Task) {
    let spec = RedriveSpec {
        dlq: queue.clone(),
        target: task.destination.clone(),
        ..RedriveSpec::default()
    };
    let mut record = Record {
        broker: Arc::clone(&broker),
        queue: queue.clone(),
        id: task.id.clone(),
        destination: task.destination.clone(),
        before: task.moved,
        stop: None,
    };
    let (total, ended) = broker
        .run_redrive(&spec, task.end, 0, task.rate.unwrap_or(0), &mut record)
        .await;
    let moved = task.moved + total.moved;
    let target_gone = || {
        task.destination
            .as_ref()
            .is_some_and(|d| matches!(broker.get_queue(d), Err(QueueError::NotFound { .. })))
    };
    let (status, failure) = match (ended_ref(&ended), &record.stop) {
        (Ended::ShutDown, _) => {
            // Left running: the endpoint runs it again at its next start.
            record.save(moved).await;
            return;
        }
        (Ended::Cancelled, Some(Stop::NoTarget)) => (Status::Failed, Some(NO_QUEUE.into())),
        (Ended::Cancelled, _) => (Status::Cancelled, None),
        (Ended::Failed(code), _) => (Status::Failed, Some(code.to_string())),
        (Ended::Done, _) if total.skipped_no_target > 0 && target_gone() => {
            (Status::Failed, Some(NO_QUEUE.into()))
        }
        (Ended::Done, _) => (Status::Completed, None),
    };
    let id = task.id.clone();
    let failure_text = failure.clone();
    let _ = broker
        .update_annotations(&queue, |ann| {
            let mut tasks = read(ann);
            let Some(t) = tasks.iter_mut().find(|t| t.id == id) else {
                return Ok((Vec::new(), ()));
            };
            t.moved = moved;
            t.status = status;
            t.failure = failure_text;
            Ok::<_, ()>((vec![write(tasks)], ()))
        })
        .await;
    let detail = format!(
        "move task {} {}: {}",
        task.id,
        status.name(),
        audit::redrive_end(&spec, &total, &ended)
    );
    audit::done(
        audit::Who {
            principal: &task.by,
            peer: None,
        },
        "redrive.end",
        &queue,
        &detail,
    );
}

/// A task cut short, with its count of moved messages made up for those
/// moved after its last write: what it could move at its start less what
/// still matches below its bound (never less than its last count).
async fn recount(broker: &Broker, queue: &str, mut task: Task) -> Task {
    let spec = RedriveSpec {
        dlq: queue.to_string(),
        target: task.destination.clone(),
        dry_run: true,
        ..RedriveSpec::default()
    };
    let (left, ended) = broker.run_redrive(&spec, task.end, 0, 0, &mut Quiet).await;
    if matches!(ended, RedriveEnd::Done) {
        task.moved = task.moved.max(task.to_move.saturating_sub(left.matched));
    }
    task
}

/// Runs again the tasks that were running when the endpoint last stopped
/// (a crash or a shutdown), and ends those being cancelled then.
pub(crate) async fn resume(broker: &Arc<Broker>) {
    let mut after: Option<String> = None;
    loop {
        let Ok((queues, next)) = broker.list_queues("", 1000, after.as_deref()) else {
            return;
        };
        for q in queues {
            let Ok(ann) = broker.annotations(&q.name) else {
                continue;
            };
            for task in read(&ann) {
                match task.status {
                    Status::Running => {
                        let task = recount(broker, &q.name, task).await;
                        tracing::info!(queue = %q.name, task = %task.id, moved = task.moved, "sqs: resuming a message move task");
                        spawn(Arc::clone(broker), q.name.clone(), task);
                    }
                    Status::Cancelling => {
                        let id = task.id.clone();
                        let _ = broker
                            .update_annotations(&q.name, |ann| {
                                let mut tasks = read(ann);
                                if let Some(t) = tasks.iter_mut().find(|t| t.id == id) {
                                    t.status = Status::Cancelled;
                                }
                                Ok::<_, ()>((vec![write(tasks)], ()))
                            })
                            .await;
                    }
                    _ => {}
                }
            }
        }
        match next {
            Some(n) => after = Some(n),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_carry_the_task_and_its_queue() {
        let h = handle("t-1", "arn:aws:sqs:us-east-1:000000000000:dlq");
        assert_eq!(
            parse_handle(&h),
            Some((
                "t-1".into(),
                "arn:aws:sqs:us-east-1:000000000000:dlq".into()
            ))
        );
        assert_eq!(parse_handle("foobared"), None);
    }
}
