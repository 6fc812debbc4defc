//! `letterbox queue create|get|list|update|delete|purge|stats`.

use clap::{Args, Subcommand, ValueEnum};
use indicatif::ProgressBar;
use serde_json::json;

use super::output::{self, Out, dur};
use super::{in_flag_words, usage};
use crate::client::{Client, ClientError, Code, ErrorKind, Result, pb};
use crate::units::Millis;

/// Queue commands.
#[derive(Debug, Subcommand)]
pub enum QueueCmd {
    /// Create a queue (a no-op if an identical one exists).
    Create {
        /// Queue name.
        name: String,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Show a queue's configuration and dead-letter sources.
    Get {
        /// Queue name.
        name: String,
    },
    /// List queues.
    List {
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Change a queue's configuration (flags not given keep their value).
    Update {
        /// Queue name.
        name: String,
        #[command(flatten)]
        config: ConfigArgs,
        /// Remove the dead letter queue.
        #[arg(long)]
        remove_dlq: bool,
        /// Remove the retry backoff.
        #[arg(long)]
        remove_backoff: bool,
        /// Remove the length limit.
        #[arg(long)]
        remove_max_length: bool,
    },
    /// Delete a queue and its messages.
    Delete {
        /// Queue name.
        name: String,
        /// Delete even if it is another queue's dead letter queue.
        #[arg(long)]
        force: bool,
    },
    /// Delete every message of a queue.
    Purge {
        /// Queue name.
        name: String,
    },
    /// Exact figures of a queue.
    Stats {
        /// Queue name.
        name: String,
    },
}

/// FIFO poison policy on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum OnPoison {
    /// Dead-letter the head and go on.
    DeadLetter,
    /// Hold the group until an operator acts.
    Park,
}

/// Queue configuration flags.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// A FIFO queue (strict order per message group).
    #[arg(long)]
    fifo: bool,
    /// Message time to live (1m to 14d).
    #[arg(long)]
    ttl: Option<Millis>,
    /// Lease length of a delivery (1s to 12h).
    #[arg(long)]
    ack_timeout: Option<Millis>,
    /// Delay before new messages are visible (up to 15m).
    #[arg(long)]
    delay: Option<Millis>,
    /// Dead letter queue.
    #[arg(long)]
    dlq: Option<String>,
    /// Deliveries before a message moves to the DLQ (1 to 1000).
    #[arg(long, requires = "dlq")]
    max_deliveries: Option<u32>,
    /// Move expired messages to the DLQ.
    #[arg(long)]
    dead_letter_on_expiry: Option<bool>,
    /// Retry backoff: INITIAL,MAX,MULTIPLIER (e.g. 1s,1m,2).
    #[arg(long)]
    backoff: Option<String>,
    /// Most messages in the queue.
    #[arg(long)]
    max_length: Option<u64>,
    /// Ceiling on one lease, extensions included.
    #[arg(long)]
    max_lease_total: Option<Millis>,
    /// FIFO: dedup window (0 to 24h).
    #[arg(long)]
    dedup_window: Option<Millis>,
    /// FIFO: what to do when a group's head exhausts its deliveries.
    #[arg(long, value_enum)]
    on_poison: Option<OnPoison>,
    /// FIFO: deduplicate by the body's hash when no dedup id is given.
    #[arg(long)]
    content_based_dedup: Option<bool>,
}

impl ConfigArgs {
    /// The request these flags make, each flag one field of the message
    /// (the server checks the values).
    pub(crate) fn to_pb(&self) -> Result<pb::QueueConfig> {
        let ConfigArgs {
            fifo,
            ttl,
            ack_timeout,
            delay,
            dlq,
            max_deliveries,
            dead_letter_on_expiry,
            backoff,
            max_length,
            max_lease_total,
            dedup_window,
            on_poison,
            content_based_dedup,
        } = self;
        let ms = |v: &Option<Millis>| v.map(Millis::as_ms);
        Ok(pb::QueueConfig {
            kind: if *fifo {
                pb::QueueKind::Fifo as i32
            } else {
                pb::QueueKind::Unspecified as i32
            },
            message_ttl_ms: ms(ttl),
            ack_timeout_ms: ms(ack_timeout),
            delivery_delay_ms: ms(delay),
            dead_letter: dlq.as_ref().map(|q| pb::DeadLetterPolicy {
                queue: q.clone(),
                // No --max-deliveries: 0, the server's default.
                max_deliveries: max_deliveries.unwrap_or(0),
            }),
            retry_backoff: backoff.as_deref().map(parse_backoff).transpose()?,
            dead_letter_on_expiry: *dead_letter_on_expiry,
            max_length: *max_length,
            max_lease_total_ms: ms(max_lease_total),
            dedup_window_ms: ms(dedup_window),
            on_poison: match on_poison {
                None => pb::PoisonPolicy::Unspecified,
                Some(OnPoison::DeadLetter) => pb::PoisonPolicy::DeadLetterAndContinue,
                Some(OnPoison::Park) => pb::PoisonPolicy::ParkGroup,
            } as i32,
            content_based_dedup: *content_based_dedup,
        })
    }
}

/// `--backoff INITIAL,MAX,MULTIPLIER`.
fn parse_backoff(s: &str) -> Result<pb::RetryBackoff> {
    let parts: Vec<&str> = s.split(',').collect();
    let [initial, max, mult] = parts.as_slice() else {
        return Err(usage(format!(
            "--backoff {s:?}: expected INITIAL,MAX,MULTIPLIER"
        )));
    };
    let ms = |v: &str| {
        v.parse::<Millis>()
            .map(Millis::as_ms)
            .map_err(|e| usage(format!("--backoff: {e}")))
    };
    Ok(pb::RetryBackoff {
        initial_ms: ms(initial)?,
        max_ms: ms(max)?,
        multiplier: mult
            .parse()
            .map_err(|_| usage(format!("--backoff: multiplier {mult:?} is not a number")))?,
    })
}

/// A value of a queue's configuration as the flags write it (`--ttl 1h`),
/// the API's name of it given (`message_ttl_ms`, as the server lists the
/// values that differ); `None` when it is not set.
fn as_flags(field: &str, c: &pb::QueueConfig) -> Option<String> {
    let d = |v: Option<u64>| v.map(dur);
    match field {
        "kind" => (c.kind == pb::QueueKind::Fifo as i32).then(|| "--fifo".into()),
        "message_ttl_ms" => d(c.message_ttl_ms).map(|v| format!("--ttl {v}")),
        "ack_timeout_ms" => d(c.ack_timeout_ms).map(|v| format!("--ack-timeout {v}")),
        "delivery_delay_ms" => d(c.delivery_delay_ms).map(|v| format!("--delay {v}")),
        "dead_letter" => c.dead_letter.as_ref().map(|p| {
            if p.max_deliveries == 0 {
                format!("--dlq {}", p.queue)
            } else {
                format!("--dlq {} --max-deliveries {}", p.queue, p.max_deliveries)
            }
        }),
        "retry_backoff" => c.retry_backoff.as_ref().map(|b| {
            format!(
                "--backoff {},{},{}",
                dur(b.initial_ms),
                dur(b.max_ms),
                b.multiplier
            )
        }),
        "dead_letter_on_expiry" => c
            .dead_letter_on_expiry
            .map(|v| format!("--dead-letter-on-expiry {v}")),
        "max_length" => c.max_length.map(|v| format!("--max-length {v}")),
        "max_lease_total_ms" => d(c.max_lease_total_ms).map(|v| format!("--max-lease-total {v}")),
        "dedup_window_ms" => d(c.dedup_window_ms).map(|v| format!("--dedup-window {v}")),
        "on_poison" => match pb::PoisonPolicy::try_from(c.on_poison) {
            Ok(pb::PoisonPolicy::ParkGroup) => Some("--on-poison park".into()),
            Ok(pb::PoisonPolicy::DeadLetterAndContinue) => Some("--on-poison dead-letter".into()),
            _ => None,
        },
        "content_based_dedup" => c
            .content_based_dedup
            .map(|v| format!("--content-based-dedup {v}")),
        _ => None,
    }
}

/// The flag of a value, for one that is not set (`--dlq` for
/// `dead_letter`).
fn flag_of(field: &str) -> &'static str {
    match field {
        "kind" => "--fifo",
        "message_ttl_ms" => "--ttl",
        "ack_timeout_ms" => "--ack-timeout",
        "delivery_delay_ms" => "--delay",
        "dead_letter" => "--dlq",
        "retry_backoff" => "--backoff",
        "dead_letter_on_expiry" => "--dead-letter-on-expiry",
        "max_length" => "--max-length",
        "max_lease_total_ms" => "--max-lease-total",
        "dedup_window_ms" => "--dedup-window",
        "on_poison" => "--on-poison",
        "content_based_dedup" => "--content-based-dedup",
        _ => "a flag",
    }
}

/// The flag of a configuration field the server refused
/// (`config.message_ttl_ms`), and the value this command gave it.
fn config_flag(field: &str, requested: &pb::QueueConfig) -> Option<(&'static str, Option<String>)> {
    let field = field.strip_prefix("config.")?;
    if field == "dead_letter.max_deliveries" {
        let given = requested
            .dead_letter
            .as_ref()
            .map(|d| d.max_deliveries.to_string());
        return Some(("--max-deliveries", given));
    }
    let part = match field {
        "retry_backoff.initial_ms" => Some("--backoff INITIAL"),
        "retry_backoff.max_ms" => Some("--backoff MAX"),
        "retry_backoff.multiplier" => Some("--backoff MULTIPLIER"),
        _ => None,
    };
    let top = field.split('.').next().unwrap_or(field);
    let flag = flag_of(top);
    if flag == "a flag" {
        return None;
    }
    let given = as_flags(top, requested).map(|v| {
        let value = v.strip_prefix(flag).unwrap_or(&v).trim();
        // `--dlq NAME --max-deliveries N`: the queue alone.
        value.split(" --").next().unwrap_or(value).to_string()
    });
    Some((part.unwrap_or(flag), given.filter(|g| !g.is_empty())))
}

/// `queue create` of a queue that exists with another configuration: the
/// settings that differ, as flags, the queue's and this command's.
async fn exists_otherwise(
    client: &Client,
    name: &str,
    requested: &pb::QueueConfig,
    e: &ClientError,
) -> ClientError {
    let differ: Vec<String> = e
        .error_info()
        .and_then(|(_, meta)| meta.get("differ").cloned())
        .map(|d| d.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let existing = match client.get_queue(name).await {
        Ok(q) => q.config.unwrap_or_default(),
        Err(_) => return ClientError::new(e.kind(), e.to_string()),
    };
    if differ.is_empty() {
        return ClientError::new(e.kind(), e.to_string());
    }
    let parts: Vec<String> = differ
        .iter()
        .map(|field| {
            let has =
                as_flags(field, &existing).unwrap_or_else(|| format!("no {}", flag_of(field)));
            let asked = as_flags(field, requested)
                .unwrap_or_else(|| format!("no {} (the default)", flag_of(field)));
            format!("the queue has {has}, this command {asked}")
        })
        .collect();
    ClientError::new(
        ErrorKind::Rpc(Code::AlreadyExists),
        format!(
            "queue {name:?} already exists with other settings: {}; change them with `letterbox queue update {name} ...`, or create it with the flags it has",
            parts.join("; ")
        ),
    )
}

fn show_queue(out: &Out, q: &pb::Queue) {
    if out.json {
        return out.doc(&output::queue_json(q));
    }
    let c = q.config.clone().unwrap_or_default();
    let mut pairs = vec![
        ("name", q.name.clone()),
        ("kind", output::kind_name(c.kind).to_string()),
        ("message ttl", dur(c.message_ttl_ms.unwrap_or(0))),
        ("ack timeout", dur(c.ack_timeout_ms.unwrap_or(0))),
        ("delivery delay", dur(c.delivery_delay_ms.unwrap_or(0))),
        (
            "dead letter queue",
            c.dead_letter.as_ref().map_or("-".into(), |d| {
                format!(
                    "{} after {}",
                    d.queue,
                    crate::units::count_of(u64::from(d.max_deliveries), "delivery", "deliveries")
                )
            }),
        ),
        (
            "retry backoff",
            c.retry_backoff.as_ref().map_or("-".into(), |b| {
                // The form --backoff takes: INITIAL,MAX,MULTIPLIER.
                format!("{},{},{}", dur(b.initial_ms), dur(b.max_ms), b.multiplier)
            }),
        ),
        (
            "dead letter on expiry",
            c.dead_letter_on_expiry.unwrap_or(false).to_string(),
        ),
        (
            "max length",
            c.max_length.map_or("-".into(), |n| n.to_string()),
        ),
        ("max lease total", dur(c.max_lease_total_ms.unwrap_or(0))),
    ];
    if c.kind == pb::QueueKind::Fifo as i32 {
        pairs.push(("dedup window", dur(c.dedup_window_ms.unwrap_or(0))));
        pairs.push((
            "on poison",
            if c.on_poison == pb::PoisonPolicy::ParkGroup as i32 {
                "park group"
            } else {
                "dead letter and continue"
            }
            .into(),
        ));
        pairs.push((
            "content based dedup",
            c.content_based_dedup.unwrap_or(false).to_string(),
        ));
    }
    pairs.push((
        "dead letter sources",
        if q.dead_letter_sources.is_empty() {
            "-".into()
        } else {
            q.dead_letter_sources.join(", ")
        },
    ));
    pairs.push(("created", output::time(q.created_at_unix_ms)));
    out.pairs(&pairs);
}

pub(super) async fn run(client: &Client, out: &Out, cmd: QueueCmd) -> Result<()> {
    match cmd {
        QueueCmd::Create { name, config } => {
            let requested = config.to_pb()?;
            let q = match client.create_queue(&name, requested.clone()).await {
                Err(e) if e.code() == Some(Code::AlreadyExists) => {
                    return Err(exists_otherwise(client, &name, &requested, &e).await);
                }
                r => r.map_err(|e| in_flag_words(e, |f| config_flag(f, &requested)))?,
            };
            show_queue(out, &q);
        }
        QueueCmd::Get { name } => show_queue(out, &client.get_queue(&name).await?),
        QueueCmd::List { prefix } => {
            let queues = client.list_queues(&prefix).await?;
            let stats = depths(client, &queues).await?;
            if out.json {
                out.doc(&json!(
                    queues
                        .iter()
                        .zip(&stats)
                        .map(|(q, s)| {
                            let mut v = output::queue_json(q);
                            if let (Some(o), Some(s)) = (v.as_object_mut(), s) {
                                o.insert("stats".into(), output::stats_json(&q.name, s));
                            }
                            v
                        })
                        .collect::<Vec<_>>()
                ));
            } else {
                let count = |s: &Option<pb::QueueStats>, f: fn(&pb::QueueStats) -> u64| {
                    s.as_ref().map_or("-".into(), |s| f(s).to_string())
                };
                let rows: Vec<Vec<String>> = queues
                    .iter()
                    .zip(&stats)
                    .map(|(q, s)| {
                        let c = q.config.clone().unwrap_or_default();
                        vec![
                            q.name.clone(),
                            output::kind_name(c.kind).to_string(),
                            count(s, |s| s.ready),
                            count(s, |s| s.in_flight),
                            count(s, |s| s.total),
                            c.dead_letter.map_or("-".into(), |d| d.queue),
                            dur(c.ack_timeout_ms.unwrap_or(0)),
                            dur(c.message_ttl_ms.unwrap_or(0)),
                        ]
                    })
                    .collect();
                out.table(
                    &[
                        "NAME",
                        "KIND",
                        "READY",
                        "IN FLIGHT",
                        "TOTAL",
                        "DLQ",
                        "ACK TIMEOUT",
                        "TTL",
                    ],
                    &rows,
                );
            }
        }
        QueueCmd::Update {
            name,
            config,
            remove_dlq,
            remove_backoff,
            remove_max_length,
        } => {
            let requested = config.to_pb()?;
            let q = client
                .update_queue(pb::UpdateQueueRequest {
                    name,
                    config: Some(requested.clone()),
                    remove_dead_letter: remove_dlq,
                    remove_retry_backoff: remove_backoff,
                    remove_max_length,
                })
                .await
                .map_err(|e| in_flag_words(e, |f| config_flag(f, &requested)))?;
            show_queue(out, &q);
        }
        QueueCmd::Delete { name, force } => {
            let n = client.delete_queue(&name, force).await?;
            if out.json {
                out.doc(&json!({"deleted": name, "messages_deleted": n}));
            } else {
                say!("deleted queue {name} and {n} message(s)");
            }
        }
        QueueCmd::Purge { name } => {
            let spinner = (!out.json).then(|| {
                let s = ProgressBar::new_spinner().with_message(format!("purging {name}"));
                s.enable_steady_tick(std::time::Duration::from_millis(100));
                s
            });
            let n = client.purge_queue(&name).await;
            if let Some(s) = spinner {
                s.finish_and_clear();
            }
            let n = n?;
            if out.json {
                out.doc(&json!({"queue": name, "messages_deleted": n}));
            } else {
                say!("purged {n} message(s) from {name}");
            }
        }
        QueueCmd::Stats { name } => {
            let s = client.stats(&name).await?;
            if out.json {
                out.doc(&output::stats_json(&name, &s));
                return Ok(());
            }
            out.pairs(&[
                ("queue", name),
                ("ready", s.ready.to_string()),
                ("in flight", s.in_flight.to_string()),
                ("delayed", s.delayed.to_string()),
                ("parked", s.parked.to_string()),
                ("total", s.total.to_string()),
                ("oldest message age", dur(s.oldest_message_age_ms)),
                ("published", s.published.to_string()),
                ("acked", s.acked.to_string()),
                ("nacked", s.nacked.to_string()),
                ("expired", s.expired.to_string()),
                ("dead-lettered", s.dead_lettered.to_string()),
                ("dead letters received", s.dead_letters_received.to_string()),
                ("redriven out", s.redriven.to_string()),
                ("redriven in", s.redrive_received.to_string()),
                ("purged", s.purged.to_string()),
            ]);
        }
    }
    Ok(())
}

/// Each queue's figures, asked 16 at a time; `None` for a queue deleted
/// since it was listed.
async fn depths(client: &Client, queues: &[pb::Queue]) -> Result<Vec<Option<pb::QueueStats>>> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    stream::iter(queues)
        .map(|q| async move {
            match client.stats(&q.name).await {
                Ok(s) => Ok(Some(s)),
                Err(e) if e.code() == Some(crate::client::Code::NotFound) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .buffered(16)
        .try_collect()
        .await
}
