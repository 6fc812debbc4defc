//! Running a redrive for a `Redrive` stream: steps through the dead letter
//! queue, paces the moves to the rate limit, stops at the limit, and
//! reports progress as it goes (at most every 200 ms, and at the end).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tonic::Status;

use super::status::to_status;
use crate::pb;
use crate::queue::Broker;
use crate::queue::redrive::{RedriveSpec, RedriveStep};

/// Messages looked at per step.
const SCAN: usize = 512;

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
    let started = Instant::now();
    let mut total = RedriveStep::default();
    let mut cursor = 0u64;
    let mut reported = Instant::now();
    loop {
        if broker.is_closing() {
            caller.audit(
                "redrive.end",
                &spec.dlq,
                &format!("stopped by the shutdown: moved={}", total.moved),
            );
            let _ = tx
                .send(Err(Status::unavailable(
                    "the server is shutting down; run the redrive again to move the rest",
                )))
                .await;
            return;
        }
        let left = if limit == 0 {
            u64::MAX
        } else {
            limit - total.matched.min(limit)
        };
        if left == 0 {
            break;
        }
        // A step moves at most a tenth of a second's worth at the rate.
        let per_step = if rate == 0 {
            u64::MAX
        } else {
            u64::from(rate / 10).max(1)
        };
        let step = match broker
            .redrive_step(&spec, cursor, end, SCAN, left.min(per_step))
            .await
        {
            Ok(s) => s,
            Err(e) => {
                caller.audit(
                    "redrive.end",
                    &spec.dlq,
                    &format!("failed: {e}: moved={}", total.moved),
                );
                let _ = tx.send(Err(to_status(e))).await;
                return;
            }
        };
        total.add(&step);
        if rate > 0 && step.moved > 0 {
            // Hold the pace: `moved` messages take moved/rate seconds.
            let due = Duration::from_secs_f64(total.moved as f64 / f64::from(rate));
            let elapsed = started.elapsed();
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        }
        if reported.elapsed() >= Duration::from_millis(200) {
            reported = Instant::now();
            if tx.send(Ok(progress(&total, false))).await.is_err() {
                caller.audit(
                    "redrive.end",
                    &spec.dlq,
                    &format!("cancelled by the client: moved={}", total.moved),
                );
                return;
            }
        }
        match step.next {
            Some(c) => cursor = c,
            None => break,
        }
    }
    caller.audit(
        "redrive.end",
        &spec.dlq,
        &format!(
            "dry_run={} scanned={} matched={} moved={} skipped={} (leased={} no_source={} no_target={} other_kind={})",
            spec.dry_run,
            total.scanned,
            total.matched,
            total.moved,
            total.skipped,
            total.skipped_leased,
            total.skipped_no_source,
            total.skipped_no_target,
            total.skipped_other_kind
        ),
    );
    let _ = tx.send(Ok(progress(&total, true))).await;
}
