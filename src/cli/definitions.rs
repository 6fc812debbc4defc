//! `letterbox definitions export|import`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::output::Out;
use super::usage;
use crate::client::{Client, Result};

/// Definitions commands.
#[derive(Debug, Subcommand)]
pub enum DefinitionsCmd {
    /// Print every queue, exchange and binding as JSON (or write a file).
    Export {
        /// Write here instead of standard output.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Apply a definitions file: checked whole, applied atomically.
    Import {
        /// The definitions file.
        file: PathBuf,
    },
}

pub(super) async fn run(client: &Client, out: &Out, cmd: DefinitionsCmd) -> Result<()> {
    match cmd {
        DefinitionsCmd::Export { file } => {
            let doc = client.export_definitions().await?;
            match file {
                Some(path) => std::fs::write(&path, format!("{doc}\n"))
                    .map_err(|e| usage(format!("{}: {e}", path.display())))?,
                None => say!("{doc}"),
            }
        }
        DefinitionsCmd::Import { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| usage(format!("{}: {e}", file.display())))?;
            let r = client.import_definitions(&text).await?;
            if out.json {
                out.doc(&json!({"queues_created": r.queues_created, "exchanges_created": r.exchanges_created,
                                "bindings_changed": r.bindings_changed}));
            } else {
                say!(
                    "created {} queue(s) and {} exchange(s); {} binding(s) created or changed",
                    r.queues_created,
                    r.exchanges_created,
                    r.bindings_changed
                );
            }
        }
    }
    Ok(())
}
