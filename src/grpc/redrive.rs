//! Running a redrive for a `Redrive` stream: the engine's paced runner
//! ([`Broker::run_redrive`]) with its progress sent on the stream (at most
//! every 200 ms, and at the end), and the start and end audited.

use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::Status;

use super::status::to_status;
use crate::edge::audit;
use crate::pb;
use crate::queue::Broker;
use crate::queue::redrive::{RedriveEnd, RedriveSink, RedriveSpec, RedriveStep};

type Tx = mpsc::Sender<Result<pb::RedriveResponse, Status>>;

fn progress(t: &RedriveStep, done: bool) -> pb::RedriveResponse {
    pb::RedriveResponse {
        scanned: t.scanned,
        matched: t.matched,
        moved: t.moved,
        skipped: t.skipped,
        done,
        skipped_leased: t.skipped_leased,
        skipped_no_source: t.skipped_no_source,
        skipped_no_target: t.skipped_no_target,
        skipped_other_kind: t.skipped_other_kind,
    }
}

/// The stream as the runner's sink: a closed stream cancels the redrive.
struct Stream<'a>(&'a Tx);

impl RedriveSink for Stream<'_> {
    async fn progress(&mut self, total: &RedriveStep) -> bool {
        self.0.send(Ok(progress(total, false))).await.is_ok()
    }
}

/// Runs the redrive; `end` is the DLQ's end position at the start.
pub(crate) async fn run(
    broker: Arc<Broker>,
    spec: RedriveSpec,
    end: u64,
    limit: u64,
    rate: u32,
    tx: Tx,
    caller: super::access::Caller,
) {
    let (total, ended) = broker
        .run_redrive(&spec, end, limit, rate, &mut Stream(&tx))
        .await;
    let detail = audit::redrive_end(&spec, &total, &ended);
    caller.audit("redrive.end", &spec.dlq, &detail);
    let last = match ended {
        RedriveEnd::Done => Ok(progress(&total, true)),
        RedriveEnd::Cancelled => return,
        RedriveEnd::ShutDown => Err(Status::unavailable(
            "the server is shutting down; run the redrive again to move the rest",
        )),
        RedriveEnd::Failed(e) => Err(to_status(e)),
    };
    let _ = tx.send(last).await;
}
