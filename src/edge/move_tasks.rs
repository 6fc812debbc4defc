//! SQS message move tasks as their dead letter queue keeps them: what the
//! SQS endpoint (`crate::sqs`, which starts and runs them) and the web
//! console (which lists and stops them) share. A queue's tasks are one
//! annotation ([`ANNOTATION`]): the last [`KEPT`] as JSON, oldest first.

use serde::{Deserialize, Serialize};

use crate::queue::Broker;
use crate::queue::QueueError;
use crate::queue::annotations::AnnotationChange;

/// The annotation of a queue that holds its move tasks.
pub(crate) const ANNOTATION: &str = "sqs.MoveTasks";
/// Tasks kept per queue (`ListMessageMoveTasks` lists at most 10).
pub(crate) const KEPT: usize = 10;
/// Where a task stands, as SQS names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum Status {
    /// Moving messages.
    Running,
    /// Asked to stop; stops at the runner's next write.
    Cancelling,
    /// Stopped by a cancel.
    Cancelled,
    /// The walk is over.
    Completed,
    /// Stopped by a failure (`failure` says which).
    Failed,
}

impl Status {
    /// SQS's name of it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Status::Running => "RUNNING",
            Status::Cancelling => "CANCELLING",
            Status::Cancelled => "CANCELLED",
            Status::Completed => "COMPLETED",
            Status::Failed => "FAILED",
        }
    }

    /// Running or being cancelled: the queue's one active task.
    pub(crate) fn active(self) -> bool {
        matches!(self, Status::Running | Status::Cancelling)
    }
}

/// One task, as its queue's annotation keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Task {
    /// Its id (a UUID, as SQS's).
    pub(crate) id: String,
    /// Where it stands.
    pub(crate) status: Status,
    /// The queue the messages go to; `None`: back to each one's source.
    pub(crate) destination: Option<String>,
    /// `MaxNumberOfMessagesPerSecond`, if given.
    pub(crate) rate: Option<u32>,
    /// Messages moved so far.
    pub(crate) moved: u64,
    /// Messages it could move when it started.
    pub(crate) to_move: u64,
    /// When it started (ms since the epoch).
    pub(crate) started: u64,
    /// The queue's end position when it started: the walk's bound.
    pub(crate) end: u64,
    /// Why it failed.
    pub(crate) failure: Option<String>,
    /// The principal that started it (for the audit log).
    pub(crate) by: String,
}

/// The tasks of a queue's annotations, oldest first.
pub(crate) fn read(annotations: &[(String, String)]) -> Vec<Task> {
    annotations
        .iter()
        .find(|(k, _)| k == ANNOTATION)
        .and_then(|(_, v)| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The annotation change that keeps `tasks` (the last [`KEPT`]).
pub(crate) fn write(mut tasks: Vec<Task>) -> AnnotationChange {
    let extra = tasks.len().saturating_sub(KEPT);
    tasks.drain(..extra);
    let text = serde_json::to_string(&tasks).unwrap_or_else(|_| "[]".into());
    (ANNOTATION.to_string(), Some(text))
}

/// The move tasks of `queue`, newest first (for the console).
pub(crate) fn of(broker: &Broker, queue: &str) -> Result<Vec<Task>, QueueError> {
    let mut tasks = read(&broker.annotations(queue)?);
    tasks.reverse();
    Ok(tasks)
}

/// Why a cancel was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelRefused {
    /// No task with that id in that queue.
    NoTask,
    /// The task is not running.
    NotRunning(Status),
}

/// Asks the task `id` of `queue` to stop; answers the messages it moved
/// so far. Durable when it returns.
pub(crate) async fn cancel(
    broker: &Broker,
    queue: &str,
    id: &str,
) -> Result<Result<u64, CancelRefused>, QueueError> {
    broker
        .update_annotations(queue, |ann| {
            let mut tasks = read(ann);
            let Some(t) = tasks.iter_mut().find(|t| t.id == id) else {
                return Err(CancelRefused::NoTask);
            };
            if t.status != Status::Running {
                return Err(CancelRefused::NotRunning(t.status));
            }
            t.status = Status::Cancelling;
            let moved = t.moved;
            Ok((vec![write(tasks)], moved))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_tasks_are_kept() {
        let t = |i: usize| Task {
            id: i.to_string(),
            status: Status::Completed,
            destination: None,
            rate: None,
            moved: 0,
            to_move: 0,
            started: 0,
            end: 0,
            failure: None,
            by: "anonymous".into(),
        };
        let (k, v) = write((0..12).map(t).collect());
        let back = read(&[(k, v.unwrap())]);
        assert_eq!(back.len(), KEPT);
        assert_eq!(back[0].id, "2");
        assert!(read(&[(ANNOTATION.into(), "not json".into())]).is_empty());
    }
}
