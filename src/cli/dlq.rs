//! `letterbox dlq redrive`: move messages out of a dead letter queue.

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::output::Out;
use crate::client::{Client, Result, pb};

/// Dead letter queue commands.
#[derive(Debug, Subcommand)]
pub enum DlqCmd {
    /// Move messages back to the queue each came from (or to --target).
    Redrive(RedriveArgs),
}

/// A dead-letter reason on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Reason {
    /// Deliveries exhausted.
    MaxDeliveries,
    /// Rejected by a consumer.
    Rejected,
    /// Time to live ran out.
    Expired,
    /// Skipped by an operator.
    Skipped,
    /// Its stored body was found damaged.
    Corrupted,
}

/// Flags of `dlq redrive`.
#[derive(Debug, Args)]
pub struct RedriveArgs {
    /// The dead letter queue.
    queue: String,
    /// Move to this queue instead of back to each message's source.
    #[arg(long)]
    target: Option<String>,
    /// Only this message id (repeatable).
    #[arg(long = "id")]
    ids: Vec<String>,
    /// Only messages dead-lettered from this queue.
    #[arg(long)]
    source: Option<String>,
    /// Only messages dead-lettered for this reason (repeatable).
    #[arg(long = "reason", value_enum)]
    reasons: Vec<Reason>,
    /// Only messages dead-lettered at or after this instant: RFC 3339
    /// (`2026-12-04T10:00:00Z`), relative (`-1h`, `"30m ago"`) or ms since
    /// the epoch.
    #[arg(long, value_parser = instant, allow_hyphen_values = true)]
    since: Option<u64>,
    /// Only messages dead-lettered before this instant (same forms as
    /// `--since`).
    #[arg(long, value_parser = instant, allow_hyphen_values = true)]
    until: Option<u64>,
    /// Move at most this many.
    #[arg(long)]
    limit: Option<u64>,
    /// Move at most this many per second.
    #[arg(long)]
    rate: Option<u32>,
    /// Only count what would move.
    #[arg(long)]
    dry_run: bool,
}

/// Parses `--since`/`--until` against the clock now.
fn instant(s: &str) -> std::result::Result<u64, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    crate::units::parse_instant(s, now)
}

/// Why matching messages stayed, in words (empty when none did).
fn skip_reasons(p: &pb::RedriveResponse) -> Vec<String> {
    let mut why = Vec::new();
    if p.skipped_leased > 0 {
        why.push(format!(
            "{} leased by a consumer (settle or let the lease end, then redrive again)",
            p.skipped_leased
        ));
    }
    if p.skipped_no_source > 0 {
        why.push(format!(
            "{} never dead-lettered: published straight into this queue, no source to go back to (give --target)",
            p.skipped_no_source
        ));
    }
    if p.skipped_no_target > 0 {
        why.push(format!(
            "{} whose queue to go back to no longer exists or is this queue (give --target)",
            p.skipped_no_target
        ));
    }
    if p.skipped_other_kind > 0 {
        why.push(format!(
            "{} whose queue to go back to is of the other kind (standard/FIFO)",
            p.skipped_other_kind
        ));
    }
    why
}

pub(super) async fn run(client: &Client, out: &Out, cmd: DlqCmd) -> Result<()> {
    let DlqCmd::Redrive(a) = cmd;
    let total = client.stats(&a.queue).await?.total;
    let is_dlq = !client
        .get_queue(&a.queue)
        .await?
        .dead_letter_sources
        .is_empty();
    let req = pb::RedriveRequest {
        queue: a.queue.clone(),
        target: a.target.clone().unwrap_or_default(),
        message_ids: a.ids.clone(),
        source_queue: a.source.clone().unwrap_or_default(),
        reasons: a
            .reasons
            .iter()
            .map(|r| match r {
                Reason::MaxDeliveries => pb::DeadLetterReason::MaxDeliveries,
                Reason::Rejected => pb::DeadLetterReason::Rejected,
                Reason::Expired => pb::DeadLetterReason::Expired,
                Reason::Skipped => pb::DeadLetterReason::Skipped,
                Reason::Corrupted => pb::DeadLetterReason::Corrupted,
            } as i32)
            .collect(),
        since_unix_ms: a.since.unwrap_or(0),
        until_unix_ms: a.until.unwrap_or(0),
        limit: a.limit.unwrap_or(0),
        rate_per_second: a.rate.unwrap_or(0),
        dry_run: a.dry_run,
    };
    let bar = (!out.json).then(|| {
        ProgressBar::new(total).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} scanned  {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    });
    let mut stream = client.redrive(req).await?;
    let mut last = pb::RedriveResponse::default();
    while let Some(p) = stream.message().await? {
        if let Some(b) = &bar {
            b.set_position(p.scanned);
            b.set_message(format!(
                "{} matched, {} moved, {} skipped",
                p.matched, p.moved, p.skipped
            ));
        }
        let done = p.done;
        last = p;
        if done {
            break;
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let why = skip_reasons(&last);
    if out.json {
        out.doc(&json!({
            "queue": a.queue, "dry_run": a.dry_run, "scanned": last.scanned, "matched": last.matched,
            "moved": last.moved, "skipped": last.skipped, "done": last.done,
            "skipped_leased": last.skipped_leased, "skipped_no_source": last.skipped_no_source,
            "skipped_no_target": last.skipped_no_target, "skipped_other_kind": last.skipped_other_kind,
            "is_dead_letter_queue": is_dlq,
        }));
    } else if a.dry_run {
        say!(
            "dry run: {} of {} message(s) would move ({} would be skipped)",
            last.matched - last.skipped,
            last.scanned,
            last.skipped
        );
    } else {
        say!(
            "moved {} message(s) out of {} ({} matched, {} skipped)",
            last.moved,
            a.queue,
            last.matched,
            last.skipped
        );
    }
    if !out.json {
        for w in &why {
            say!("  skipped: {w}");
        }
        if !is_dlq && a.target.is_none() && last.skipped_no_source > 0 {
            say!(
                "note: {} is not the dead letter queue of any queue; its messages came in directly and have nowhere to go back to: give --target QUEUE",
                a.queue
            );
        }
    }
    Ok(())
}
