//! `letterbox publish`, `consume` and `browse`.

use std::io::BufRead;
use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::output::{self, Out};
use super::{in_flag_words, usage};
use crate::client::{Client, Result, pb};
use crate::units::Millis;

fn key_value(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Flags of `publish`: `publish QUEUE [BODY...]`, or `publish --exchange
/// NAME [BODY...]`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The queue (unless --exchange is given), then message bodies, one
    /// message each.
    #[arg(value_name = "QUEUE BODY", required_unless_present = "exchange")]
    words: Vec<String>,
    /// Publish through this exchange instead of into a queue.
    #[arg(long)]
    exchange: Option<String>,
    /// Publish each line of this file as a message.
    #[arg(long, conflicts_with = "stdin")]
    file: Option<PathBuf>,
    /// Publish each line of standard input as a message.
    #[arg(long)]
    stdin: bool,
    /// A property KEY=VALUE for every message (repeatable).
    #[arg(short = 'p', long = "property", value_parser = key_value)]
    properties: Vec<(String, String)>,
    /// Client-chosen message id (one message only).
    #[arg(long)]
    id: Option<String>,
    /// FIFO message group.
    #[arg(long)]
    group: Option<String>,
    /// FIFO dedup id (one message only).
    #[arg(long)]
    dedup_id: Option<String>,
    /// Time to live of each message.
    #[arg(long)]
    ttl: Option<Millis>,
    /// Delay before each message is visible.
    #[arg(long)]
    delay: Option<Millis>,
    /// Messages per publish call (1 to 1000).
    #[arg(long, default_value_t = 100)]
    batch: usize,
}

impl PublishArgs {
    /// What can be told before connecting: a queue (or an exchange) and
    /// something to publish.
    pub(super) fn check(&self) -> Result<()> {
        let bodies = match &self.exchange {
            Some(_) => self.words.len(),
            None => {
                if self.words.is_empty() {
                    return Err(usage(
                        "give a queue to publish into (or --exchange NAME): letterbox publish QUEUE BODY...",
                    ));
                }
                self.words.len() - 1
            }
        };
        if bodies == 0 && self.file.is_none() && !self.stdin {
            return Err(usage(
                "nothing to publish: give bodies, --file or --stdin (letterbox publish QUEUE BODY...)",
            ));
        }
        Ok(())
    }
}

pub(super) async fn publish(client: &Client, out: &Out, a: PublishArgs) -> Result<()> {
    let (target, mut bodies) = match &a.exchange {
        Some(x) => (x.clone(), a.words.clone()),
        None => {
            let Some((q, rest)) = a.words.split_first() else {
                return Err(usage("give a queue to publish into (or --exchange NAME)"));
            };
            (q.clone(), rest.to_vec())
        }
    };
    let mut total: Option<u64> = Some(bodies.len() as u64);
    let reader: Option<Box<dyn BufRead>> = if let Some(path) = &a.file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("--file {}: {e}", path.display())))?;
        bodies.extend(text.lines().map(str::to_string));
        total = Some(bodies.len() as u64);
        None
    } else if a.stdin {
        total = None;
        Some(Box::new(std::io::BufReader::new(std::io::stdin())))
    } else {
        None
    };
    if bodies.is_empty() && reader.is_none() {
        return Err(usage("nothing to publish: give bodies, --file or --stdin"));
    }
    if (a.id.is_some() || a.dedup_id.is_some()) && (bodies.len() != 1 || reader.is_some()) {
        return Err(usage("--id and --dedup-id apply to a single message"));
    }
    let batch = a.batch.clamp(1, 1000);
    let bar = (!out.json).then(|| match total {
        Some(n) if n > 1000 => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} messages ({per_sec})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        Some(_) => ProgressBar::hidden(),
        None => ProgressBar::new_spinner().with_message("publishing from standard input"),
    });
    let make = |body: String| pb::PublishMessage {
        message_id: a.id.clone().unwrap_or_default(),
        body: body.into_bytes().into(),
        properties: a.properties.iter().cloned().collect(),
        ttl_ms: a.ttl.map(Millis::as_ms),
        delay_ms: a.delay.map(Millis::as_ms),
        group_id: a.group.clone().unwrap_or_default(),
        dedup_id: a.dedup_id.clone().unwrap_or_default(),
    };
    let mut results: Vec<pb::PublishResult> = Vec::new();
    let mut pending: Vec<pb::PublishMessage> = bodies.into_iter().map(make).collect();
    let mut lines = reader.map(|r| r.lines());
    loop {
        if let Some(lines) = lines.as_mut() {
            while pending.len() < batch {
                match lines.next() {
                    Some(Ok(l)) => pending.push(make(l)),
                    Some(Err(e)) => return Err(usage(format!("standard input: {e}"))),
                    None => break,
                }
            }
        }
        if pending.is_empty() {
            break;
        }
        let chunk: Vec<_> = pending.drain(..pending.len().min(batch)).collect();
        let n = chunk.len() as u64;
        let published = match &a.exchange {
            Some(x) => client.publish_to_exchange(x, chunk).await,
            None => client.publish(&target, chunk).await,
        };
        results.extend(published.map_err(|e| in_flag_words(e, |f| publish_flag(f, &a)))?);
        if let Some(b) = &bar {
            b.inc(n);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if out.json {
        let routed: Vec<_> = results.iter().map(|r| json!({"message_id": r.message_id, "duplicate": r.duplicate, "routed_to": r.routed_to})).collect();
        out.doc(&json!({
            "target": target,
            "exchange": a.exchange.is_some(),
            "published": results.iter().filter(|r| !r.duplicate).count(),
            "duplicates": results.iter().filter(|r| r.duplicate).count(),
            "results": routed,
        }));
    } else if results.len() <= 20 {
        let rows: Vec<Vec<String>> = results
            .iter()
            .map(|r| {
                let result = if r.duplicate {
                    "duplicate (not stored again)".to_string()
                } else if a.exchange.is_some() {
                    format!(
                        "routed to {} queue(s): {}",
                        r.routed_to.len(),
                        r.routed_to.join(", ")
                    )
                } else {
                    "stored".to_string()
                };
                vec![r.message_id.clone(), result]
            })
            .collect();
        out.table(&["MESSAGE ID", "RESULT"], &rows);
    } else {
        let dups = results.iter().filter(|r| r.duplicate).count();
        say!(
            "published {} message(s) to {target} ({dups} duplicate(s))",
            results.len() - dups
        );
    }
    Ok(())
}

/// The flag of a message field the server refused
/// (`messages[3].ttl_ms`), and the value this command gave it.
fn publish_flag(field: &str, a: &PublishArgs) -> Option<(&'static str, Option<String>)> {
    let (_, name) = field.strip_prefix("messages[")?.split_once("].")?;
    let shown = |v: Option<Millis>| v.map(|m| m.to_string());
    Some(match name {
        "ttl_ms" => ("--ttl", shown(a.ttl)),
        "delay_ms" => ("--delay", shown(a.delay)),
        "group_id" => ("--group", a.group.clone()),
        "dedup_id" => ("--dedup-id", a.dedup_id.clone()),
        "message_id" => ("--id", a.id.clone()),
        "properties" => ("--property", None),
        _ => return None,
    })
}

/// Flags of `consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Queue to consume from.
    queue: String,
    /// Stop after this many messages (deliveries).
    #[arg(long)]
    count: Option<u64>,
    /// With --nack on a queue without a dead letter queue (where a nacked
    /// message comes back forever): stop once a message has been
    /// delivered this many times, unless --count is given.
    #[arg(long, default_value_t = 10)]
    max_deliveries: u32,
    /// Keep waiting for messages instead of stopping when the queue is
    /// empty.
    #[arg(long)]
    follow: bool,
    /// Nack instead of ack (a failed attempt).
    #[arg(long, conflicts_with = "reject")]
    nack: bool,
    /// Reject to the dead letter queue instead of ack.
    #[arg(long)]
    reject: bool,
    /// Reason given with --nack or --reject.
    #[arg(long, default_value = "")]
    reason: String,
    /// How long one receive waits for a message.
    #[arg(long, default_value = "1s")]
    wait: Millis,
    /// Lease length instead of the queue's ack timeout.
    #[arg(long)]
    ack_timeout: Option<Millis>,
    /// Most messages per receive.
    #[arg(long, default_value_t = 10)]
    max: u32,
    /// FIFO queues: most messages of one group per receive, 1 to 1000
    /// (unset: a receive takes a group's consecutive messages up to
    /// --max). Standard queues have no groups and ignore it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_per_group: Option<u32>,
}

pub(super) async fn consume(client: &Client, out: &Out, a: ConsumeArgs) -> Result<()> {
    // Deliveries received (what --count counts), and the messages settled:
    // a message nacked three times is one message, three deliveries.
    let mut done = 0u64;
    let mut settled: std::collections::HashSet<String> = std::collections::HashSet::new();
    // A nack or reject needs to know where the message goes.
    let dlq = if a.nack || a.reject {
        let q = client.get_queue(&a.queue).await?;
        q.config
            .and_then(|c| c.dead_letter)
            .map(|d| d.queue)
            .filter(|d| !d.is_empty())
    } else {
        None
    };
    if a.reject && dlq.is_none() {
        return Err(crate::client::ClientError::new(
            crate::client::ErrorKind::Rpc(crate::client::Code::FailedPrecondition),
            format!(
                "queue {:?} has no dead letter queue, so --reject has nowhere to put a message; give it one (`letterbox queue update {} --dlq NAME`) or use --nack",
                a.queue, a.queue
            ),
        ));
    }
    let stop_at = (a.nack && dlq.is_none() && a.count.is_none()).then_some(a.max_deliveries.max(1));
    loop {
        let left = a.count.map_or(u64::MAX, |c| c.saturating_sub(done));
        if left == 0 {
            break;
        }
        let req = pb::ReceiveRequest {
            queue: a.queue.clone(),
            max_messages: u32::try_from(left.min(u64::from(a.max.clamp(1, 1000)))).unwrap_or(10),
            wait_ms: a.wait.as_ms().min(20_000),
            ack_timeout_ms: a.ack_timeout.map(Millis::as_ms),
            auto_ack: false,
            ack_tokens: Vec::new(),
            max_per_group: a.max_per_group.unwrap_or(0),
        };
        let got = client.receive_with(req).await.map_err(|e| {
            in_flag_words(e, |f| {
                (f == "ack_timeout_ms")
                    .then(|| ("--ack-timeout", a.ack_timeout.map(|m| m.to_string())))
            })
        })?;
        if got.is_empty() {
            if a.follow {
                continue;
            }
            break;
        }
        for d in &got {
            if out.json {
                out.line(&output::delivery_json(d));
            } else {
                say!(
                    "{}  delivery {} ({} failed)  {}",
                    d.message_id,
                    d.delivery_count,
                    d.failed_attempts,
                    output::body_cell(&d.body)
                );
            }
        }
        let tokens: Vec<String> = got.iter().map(|d| d.ack_token.clone()).collect();
        let results = if a.nack || a.reject {
            let items = tokens
                .into_iter()
                .map(|t| pb::NackItem {
                    ack_token: t,
                    reason: a.reason.clone(),
                    dead_letter: a.reject,
                    delay_ms: None,
                })
                .collect();
            client.nack(items).await?
        } else {
            client.ack(tokens).await?
        };
        for r in &results {
            if r.status == pb::SettleStatus::Ok as i32 {
                if let Some(d) = got.iter().find(|d| d.ack_token == r.ack_token) {
                    settled.insert(d.message_id.clone());
                }
            } else {
                eprintln!("letterbox: {}", r.error);
            }
        }
        done += got.len() as u64;
        if let Some(limit) = stop_at
            && let Some(d) = got.iter().find(|d| d.delivery_count >= limit)
        {
            eprintln!(
                "letterbox: stopping: message {} was delivered {} times and nacked each time; queue {:?} has no dead letter queue, so a nacked message comes back forever (give --count N to go on, or give the queue a DLQ)",
                d.message_id, d.delivery_count, a.queue
            );
            break;
        }
    }
    if !out.json {
        let verb = if a.reject {
            "rejected"
        } else if a.nack {
            "nacked"
        } else {
            "acked"
        };
        eprintln!("{}", settled_line(verb, settled.len() as u64, done));
    }
    Ok(())
}

/// Flags of `browse`.
#[derive(Debug, Args)]
pub struct BrowseArgs {
    /// Queue to read.
    queue: String,
    /// Most messages to show.
    #[arg(long, default_value_t = 100)]
    max: usize,
}

pub(super) async fn browse(client: &Client, out: &Out, a: BrowseArgs) -> Result<()> {
    let mut msgs = Vec::new();
    let mut token = String::new();
    while msgs.len() < a.max {
        let want = u32::try_from((a.max - msgs.len()).min(1000)).unwrap_or(1000);
        let page = client.browse(&a.queue, want, &token).await?;
        msgs.extend(page.messages);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
        tokio::task::yield_now().await;
    }
    if out.json {
        out.doc(&json!(
            msgs.iter().map(output::browsed_json).collect::<Vec<_>>()
        ));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = msgs
        .iter()
        .map(|m| {
            let dl = m.dead_letters.last().map_or("-".into(), |d| {
                let mut cell = format!(
                    "{} from {} after {} ({} failed)",
                    output::reason_name(d.reason),
                    d.source_queue,
                    crate::units::count_of(u64::from(d.delivery_count), "delivery", "deliveries"),
                    d.failed_attempts
                );
                if !d.last_nack_reason.is_empty() {
                    cell.push_str(&format!(": {:?}", d.last_nack_reason));
                }
                if !d.note.is_empty() {
                    cell.push_str(&format!(" (note: {:?})", d.note));
                }
                cell
            });
            vec![
                m.message_id.clone(),
                output::state_name(m.state),
                m.delivery_count.to_string(),
                m.failed_attempts.to_string(),
                if m.group_id.is_empty() {
                    "-".into()
                } else {
                    m.group_id.clone()
                },
                dl,
                output::body_cell(&m.body),
            ]
        })
        .collect();
    out.table(
        &[
            "MESSAGE ID",
            "STATE",
            "DELIVERIES",
            "FAILED",
            "GROUP",
            "DEAD-LETTERED",
            "BODY",
        ],
        &rows,
    );
    Ok(())
}

/// What `consume` says at the end: the messages settled, and the
/// deliveries when a message came more than once ("nacked 2 message(s)
/// in 6 deliveries").
fn settled_line(verb: &str, messages: u64, deliveries: u64) -> String {
    if deliveries > messages {
        let s = if deliveries == 1 { "y" } else { "ies" };
        format!("{verb} {messages} message(s) in {deliveries} deliver{s}")
    } else {
        format!("{verb} {messages} message(s)")
    }
}
