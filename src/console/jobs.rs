//! Redrives started from the console, run in the background through the
//! engine's paced runner ([`Broker::run_redrive`]) and watched from a page
//! that polls their progress. The last 100 are kept in memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::queue::Broker;
use crate::queue::redrive::{RedriveEnd, RedriveSink, RedriveSpec, RedriveStep};

/// Jobs kept.
const KEPT: usize = 100;

/// Where a job stands.
#[derive(Debug, Clone)]
pub(crate) enum JobState {
    Running,
    Done,
    Failed(String),
}

impl JobState {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed(_) => "failed",
        }
    }
}

/// One redrive.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) dlq: String,
    /// Where the messages go, as said to the user.
    pub(crate) to: String,
    pub(crate) rate: u32,
    pub(crate) started_at: u64,
    progress: Mutex<(RedriveStep, JobState)>,
    cancel: AtomicBool,
}

impl Job {
    /// The counts so far and the state.
    pub(crate) fn progress(&self) -> (RedriveStep, JobState) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set(&self, total: RedriveStep, state: JobState) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = (total, state);
    }

    /// Asks the job to stop after its current step.
    pub(crate) fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

struct Sink(Arc<Job>);

impl RedriveSink for Sink {
    async fn progress(&mut self, total: &RedriveStep) -> bool {
        self.0.set(*total, JobState::Running);
        !self.0.cancel.load(Ordering::Relaxed)
    }
}

/// The kept jobs, newest last.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    kept: Mutex<VecDeque<Arc<Job>>>,
}

impl Jobs {
    pub(crate) fn new() -> Jobs {
        Jobs::default()
    }

    /// A job by id.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|j| j.id == id)
            .cloned()
    }

    /// Starts a redrive checked by [`Broker::start_redrive`] (`end`); `done`
    /// is called with the counts and the outcome when it ends.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        &self,
        broker: Arc<Broker>,
        spec: RedriveSpec,
        end: u64,
        rate: u32,
        to: String,
        now: u64,
        done: impl FnOnce(&RedriveSpec, &RedriveStep, &RedriveEnd) + Send + 'static,
    ) -> Arc<Job> {
        let (id, _) = crate::auth::new_token();
        let job = Arc::new(Job {
            id: id[..16].to_string(),
            dlq: spec.dlq.clone(),
            to,
            rate,
            started_at: now,
            progress: Mutex::new((RedriveStep::default(), JobState::Running)),
            cancel: AtomicBool::new(false),
        });
        {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            kept.push_back(Arc::clone(&job));
            while kept.len() > KEPT {
                kept.pop_front();
            }
        }
        let j = Arc::clone(&job);
        tokio::spawn(async move {
            let (total, ended) = broker
                .run_redrive(&spec, end, 0, rate, &mut Sink(Arc::clone(&j)))
                .await;
            let state = match &ended {
                RedriveEnd::Done => JobState::Done,
                RedriveEnd::Cancelled => JobState::Failed("stopped by the user".into()),
                RedriveEnd::ShutDown => JobState::Failed(
                    "the server is shutting down; run the redrive again to move the rest".into(),
                ),
                RedriveEnd::Failed(e) => JobState::Failed(e.to_string()),
            };
            done(&spec, &total, &ended);
            j.set(total, state);
        });
        job
    }
}
