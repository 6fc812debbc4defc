//! The command-line client: `letterbox queue|publish|consume|browse|group|
//! exchange|dlq|definitions`.
//! Built on [`crate::client`] only.
//!
//! Output is a human-readable table by default and JSON with `--json`
//! (one document, or one JSON object per line for `consume`). Exit codes:
//! 0 success, 1 the server refused the request, 2 bad usage, 3 the server
//! could not be reached.

mod definitions;
mod dlq;
mod exchange;
mod group;
mod message;
mod output;
mod queue;

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::client::{Client, ClientConfig, ClientError, ErrorKind};

/// Flags shared by every client command.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Server address.
    #[arg(
        long,
        global = true,
        env = "LETTERBOX_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The client commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, inspect, change, delete and purge queues.
    #[command(subcommand)]
    Queue(queue::QueueCmd),
    /// Publish messages (from arguments, a file or standard input).
    Publish(message::PublishArgs),
    /// Receive messages, print them, and ack (or nack) them.
    Consume(message::ConsumeArgs),
    /// Read messages without consuming them.
    Browse(message::BrowseArgs),
    /// FIFO groups: list, skip a head, release a parked group.
    #[command(subcommand)]
    Group(group::GroupCmd),
    /// Fanout exchanges and their bindings.
    #[command(subcommand)]
    Exchange(exchange::ExchangeCmd),
    /// Dead letter queues: redrive.
    #[command(subcommand)]
    Dlq(dlq::DlqCmd),
    /// Export or import queues, exchanges and bindings as JSON.
    #[command(subcommand)]
    Definitions(definitions::DefinitionsCmd),
}

/// Runs a client command.
pub async fn run(common: Common, command: Command) -> ExitCode {
    let mut config = ClientConfig::new(common.server.clone());
    config.retry.max_attempts = 2;
    let client = match Client::with_config(config).await {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let out = output::Out::new(common.json);
    let result = match command {
        Command::Queue(cmd) => queue::run(&client, &out, cmd).await,
        Command::Publish(a) => message::publish(&client, &out, a).await,
        Command::Consume(a) => message::consume(&client, &out, a).await,
        Command::Browse(a) => message::browse(&client, &out, a).await,
        Command::Group(cmd) => group::run(&client, &out, cmd).await,
        Command::Exchange(cmd) => exchange::run(&client, &out, cmd).await,
        Command::Dlq(cmd) => dlq::run(&client, &out, cmd).await,
        Command::Definitions(cmd) => definitions::run(&client, &out, cmd).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &ClientError) -> ExitCode {
    eprintln!("letterbox: {e}");
    match e.kind() {
        ErrorKind::Transport | ErrorKind::Rpc(tonic::Code::Unavailable) => ExitCode::from(3),
        ErrorKind::InvalidArgument => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

/// An error about the command line itself (exit code 2).
fn usage(message: impl Into<String>) -> ClientError {
    ClientError::new(ErrorKind::InvalidArgument, message)
}
