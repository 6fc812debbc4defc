//! `letterbox group list|skip|release`: FIFO group administration.

use clap::Subcommand;
use serde_json::json;

use super::output::{self, Out, dur};
use crate::client::{Client, Result, pb};

/// Group commands.
#[derive(Debug, Subcommand)]
pub enum GroupCmd {
    /// List a FIFO queue's groups.
    List {
        /// FIFO queue.
        queue: String,
        /// Only parked groups.
        #[arg(long)]
        parked: bool,
    },
    /// Move a group's head to the dead letter queue and let the group go on.
    Skip {
        /// FIFO queue.
        queue: String,
        /// Group id ("" for the default group).
        group: String,
        /// Note kept in the dead-letter record.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Release a parked group: its head is delivered again, its failed
    /// attempts reset to 0 (its delivery count stays).
    Release {
        /// FIFO queue.
        queue: String,
        /// Group id ("" for the default group).
        group: String,
    },
}

pub(super) async fn run(client: &Client, out: &Out, cmd: GroupCmd) -> Result<()> {
    match cmd {
        GroupCmd::List { queue, parked } => {
            let mut groups = Vec::new();
            let mut token = String::new();
            loop {
                let page = client
                    .list_groups(pb::ListGroupsRequest {
                        queue: queue.clone(),
                        page_size: 1000,
                        page_token: token.clone(),
                        state: if parked {
                            pb::GroupState::Parked as i32
                        } else {
                            0
                        },
                    })
                    .await?;
                groups.extend(page.groups);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            if out.json {
                let v: Vec<_> = groups
                    .iter()
                    .map(|g| {
                        json!({"group_id": g.group_id, "state": output::group_state_name(g.state), "backlog": g.backlog,
                               "in_flight": g.in_flight, "oldest_message_age_ms": g.oldest_message_age_ms,
                               "reason": g.reason, "head_message_id": g.head_message_id,
                               "head_delivery_count": g.head_delivery_count,
                               "head_failed_attempts": g.head_failed_attempts})
                    })
                    .collect();
                out.doc(&json!(v));
            } else {
                let rows: Vec<Vec<String>> = groups
                    .iter()
                    .map(|g| {
                        vec![
                            if g.group_id.is_empty() {
                                "(default)".into()
                            } else {
                                g.group_id.clone()
                            },
                            output::group_state_name(g.state),
                            g.backlog.to_string(),
                            g.in_flight.to_string(),
                            dur(g.oldest_message_age_ms),
                            g.reason.clone(),
                        ]
                    })
                    .collect();
                out.table(
                    &["GROUP", "STATE", "BACKLOG", "IN FLIGHT", "OLDEST", "REASON"],
                    &rows,
                );
            }
        }
        GroupCmd::Skip { queue, group, note } => {
            let id = client.skip_head(&queue, &group, &note).await?;
            if out.json {
                out.doc(&json!({"queue": queue, "group_id": group, "skipped_message_id": id}));
            } else {
                say!("moved {id} from group {group:?} of {queue} to the dead letter queue");
            }
        }
        GroupCmd::Release { queue, group } => {
            let id = client.release_group(&queue, &group).await?;
            if out.json {
                out.doc(&json!({"queue": queue, "group_id": group, "head_message_id": id}));
            } else {
                say!("released group {group:?} of {queue}; its head {id} is deliverable again");
            }
        }
    }
    Ok(())
}
