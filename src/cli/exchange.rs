//! `letterbox exchange create|get|list|delete|bind|unbind`.

use clap::Subcommand;
use serde_json::{Value, json};

use super::output::Out;
use super::usage;
use crate::client::{Client, Result, pb};

/// Exchange commands.
#[derive(Debug, Subcommand)]
pub enum ExchangeCmd {
    /// Create a fanout exchange.
    Create {
        /// Exchange name.
        name: String,
    },
    /// Show an exchange and its bindings.
    Get {
        /// Exchange name.
        name: String,
    },
    /// List exchanges.
    List,
    /// Delete an exchange and its bindings.
    Delete {
        /// Exchange name.
        name: String,
    },
    /// Bind a queue, optionally only for messages with given properties.
    Bind {
        /// Exchange name.
        exchange: String,
        /// Queue name.
        queue: String,
        /// Route only messages with this property value (KEY=VALUE,
        /// repeatable).
        #[arg(long = "filter")]
        filter: Vec<String>,
    },
    /// Remove a queue's binding.
    Unbind {
        /// Exchange name.
        exchange: String,
        /// Queue name.
        queue: String,
    },
}

fn exchange_json(x: &pb::Exchange) -> Value {
    json!({
        "name": x.name,
        "bindings": x.bindings.iter().map(|b| json!({"queue": b.queue, "filter": b.filter})).collect::<Vec<_>>(),
    })
}

fn show(out: &Out, x: &pb::Exchange) {
    if out.json {
        return out.doc(&exchange_json(x));
    }
    say!("exchange {}", x.name);
    let rows: Vec<Vec<String>> = x
        .bindings
        .iter()
        .map(|b| {
            let mut f: Vec<String> = b.filter.iter().map(|(k, v)| format!("{k}={v}")).collect();
            f.sort();
            vec![
                b.queue.clone(),
                if f.is_empty() {
                    "(every message)".into()
                } else {
                    f.join(", ")
                },
            ]
        })
        .collect();
    out.table(&["QUEUE", "FILTER"], &rows);
}

pub(super) async fn run(client: &Client, out: &Out, cmd: ExchangeCmd) -> Result<()> {
    match cmd {
        ExchangeCmd::Create { name } => show(out, &client.create_exchange(&name).await?),
        ExchangeCmd::Get { name } => show(out, &client.get_exchange(&name).await?),
        ExchangeCmd::List => {
            let xs = client.list_exchanges().await?;
            if out.json {
                out.doc(&json!(xs.iter().map(exchange_json).collect::<Vec<_>>()));
            } else {
                let rows: Vec<Vec<String>> = xs
                    .iter()
                    .map(|x| vec![x.name.clone(), x.bindings.len().to_string()])
                    .collect();
                out.table(&["NAME", "BINDINGS"], &rows);
            }
        }
        ExchangeCmd::Delete { name } => {
            client.delete_exchange(&name).await?;
            if out.json {
                out.doc(&json!({"deleted": name}));
            } else {
                say!("deleted exchange {name}");
            }
        }
        ExchangeCmd::Bind {
            exchange,
            queue,
            filter,
        } => {
            let pairs = filter
                .iter()
                .map(|f| {
                    f.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| usage(format!("--filter {f:?} is not KEY=VALUE")))
                })
                .collect::<Result<Vec<_>>>()?;
            show(out, &client.bind(&exchange, &queue, pairs).await?);
        }
        ExchangeCmd::Unbind { exchange, queue } => {
            show(out, &client.unbind(&exchange, &queue).await?)
        }
    }
    Ok(())
}
