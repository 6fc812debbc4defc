//! `pg-failover`: Letterbox's PostgreSQL state (`letterbox::storage::pg`)
//! through a failover of the PostgreSQL primary.
//!
//! One writer holds the shard's lease and commits numbered batches, each
//! a set of keys with its number as the commit marker's lsn, as fast as
//! the cluster takes them, for `--secs`. Meanwhile something else kills
//! the primary (`tools/reliability/pg-failover.sh` does: `kill -9` of its Patroni and
//! postmaster). A commit that fails is never sent again blindly: the
//! writer reconnects through the multi-host URL (which finds the new
//! primary), takes the lease again, and settles the batch by the marker
//! (`PgState::resolve`); only a batch the marker says was not committed
//! is sent again. At the end it reads every batch back on a fresh
//! connection and checks:
//!
//! - every acknowledged batch is there, every key with its value, and the
//!   marker is the last acknowledged batch;
//! - a batch the marker called not committed had none of its keys on the
//!   new primary, and no batch past the last acknowledged one is there;
//!
//! and prints one JSON line (acknowledged batches, failures, the longest
//! gap between two acknowledged commits: the failover time as a writer
//! sees it). Exits non-zero when a check fails.
//!
//! ```text
//! pg-failover --url 'postgres://postgres@127.0.0.1:5441,127.0.0.1:5442,127.0.0.1:5443/postgres?target_session_attrs=read-write' --secs 40
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use letterbox::storage::pg::{Fence, Outcome, PgError, PgState};

#[derive(Parser)]
#[command(
    name = "pg-failover",
    about = "Commit numbered batches to Letterbox's PostgreSQL state through a failover and check that none acknowledged is lost and none unacknowledged appears"
)]
struct Args {
    /// The cluster's multi-host URL with target_session_attrs=read-write.
    #[arg(long)]
    url: String,
    /// How long to write.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// The shard to write (a fresh one per run keeps runs apart).
    #[arg(long, default_value_t = 7)]
    shard: i32,
    /// Keys per batch.
    #[arg(long, default_value_t = 16)]
    keys: u32,
    /// Give up when no commit succeeds for this long.
    #[arg(long, default_value_t = 120)]
    give_up_secs: u64,
    /// Negative control of the read-back: delete one acknowledged key
    /// before reading back, so the run must report it missing and fail.
    #[arg(long)]
    control_lose_one: bool,
}

const NODE: &str = "pg-failover";
const LEASE: Duration = Duration::from_secs(600);

fn key(batch: u64, j: u32) -> Bytes {
    Bytes::from(format!("pg-failover/{batch:010}/{j:04}"))
}

fn value(batch: u64, j: u32) -> Bytes {
    Bytes::from(format!("batch {batch} key {j}").repeat(8))
}

fn batch(n: u64, keys: u32) -> Vec<(Bytes, Option<Bytes>)> {
    (0..keys).map(|j| (key(n, j), Some(value(n, j)))).collect()
}

/// A connection to the primary with this writer's lease, retried until
/// `deadline`.
async fn connect(args: &Args, deadline: Instant) -> anyhow::Result<(PgState, Fence)> {
    let mut last = String::new();
    while Instant::now() < deadline {
        match PgState::connect(&args.url, args.shard).await {
            Ok(state) => match state.acquire(NODE, LEASE).await {
                Ok(Ok(fence)) => return Ok((state, fence)),
                Ok(Err(holder)) => anyhow::bail!("the shard is held by {holder:?}"),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("no primary accepted a session before the deadline: {last}")
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pg-failover: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<bool> {
    let give_up = Duration::from_secs(args.give_up_secs);
    let (mut state, mut fence) = connect(args, Instant::now() + give_up).await?;
    let start_lsn = state.committed_lsn().await?;
    let first = start_lsn + 1;
    let mut next = first;
    let mut failures = 0u64;
    let mut resolved_committed = 0u64;
    let mut resolved_not = 0u64;
    let mut present_after_not_committed = 0u64;
    let mut last_ack = Instant::now();
    let mut longest_gap = Duration::ZERO;
    let end = Instant::now() + Duration::from_secs(args.secs);

    // Past `--secs` the run goes on until a commit after the last failure
    // is acknowledged, so the failover's gap is always measured.
    let mut acked_since_failure = true;
    while Instant::now() < end || !acked_since_failure {
        let body = batch(next, args.keys);
        match state.commit(&fence, &body, next).await {
            Ok(()) => {}
            Err(PgError::Fenced { .. }) => {
                anyhow::bail!("fenced: another node took the shard during the run")
            }
            Err(e) => {
                failures += 1;
                acked_since_failure = false;
                eprintln!("batch {next}: {e}");
                // Settle the batch on the new primary before anything else.
                let settled = loop {
                    let deadline = last_ack + give_up;
                    if Instant::now() > deadline {
                        anyhow::bail!("no commit settled for {give_up:?}");
                    }
                    let (s, f) = connect(args, deadline).await?;
                    state = s;
                    fence = f;
                    match state.resolve(next).await {
                        Ok(outcome) => break outcome,
                        Err(e) => eprintln!("resolving batch {next}: {e}"),
                    }
                };
                match settled {
                    Outcome::Committed => resolved_committed += 1,
                    Outcome::NotCommitted => {
                        resolved_not += 1;
                        // The marker's word checked against the keys.
                        if state.get(&key(next, 0)).await?.is_some() {
                            present_after_not_committed += 1;
                        }
                        continue;
                    }
                }
            }
        }
        let now = Instant::now();
        longest_gap = longest_gap.max(now - last_ack);
        last_ack = now;
        acked_since_failure = true;
        next += 1;
    }
    let last = next - 1;

    if args.control_lose_one && last >= first {
        state.commit(&fence, &[(key(first, 0), None)], last).await?;
    }

    // Read back on a fresh session.
    let (check, _) = connect(args, Instant::now() + give_up).await?;
    let mut missing = 0u64;
    let mut wrong = 0u64;
    for n in first..=last {
        for j in 0..args.keys {
            match check.get(&key(n, j)).await? {
                None => missing += 1,
                Some(v) if v != value(n, j) => wrong += 1,
                Some(_) => {}
            }
        }
    }
    let extra = check
        .scan(format!("pg-failover/{:010}/", last + 1).as_bytes(), None, 1)
        .await?
        .len();
    let marker = check.committed_lsn().await?;
    let acknowledged = last + 1 - first;
    let ok = missing == 0
        && wrong == 0
        && extra == 0
        && marker == last
        && present_after_not_committed == 0;
    println!(
        "{}",
        serde_json::json!({
            "acknowledged_batches": acknowledged,
            "keys_per_batch": args.keys,
            "commit_failures": failures,
            "settled_committed": resolved_committed,
            "settled_not_committed": resolved_not,
            "present_after_not_committed": present_after_not_committed,
            "longest_gap_ms": longest_gap.as_millis(),
            "missing_keys": missing,
            "wrong_values": wrong,
            "unacknowledged_batches_present": extra,
            "marker": marker,
            "last_acknowledged": last,
            "ok": ok,
        })
    );
    Ok(ok)
}
