//! The command-line client: `letterbox queue|publish|consume|browse|group|
//! exchange|dlq|definitions`.
//! Built on [`crate::client`] only.
//!
//! Output is a human-readable table by default and JSON with `--json`
//! (one document, or one JSON object per line for `consume`). Exit codes:
//! 0 success, 1 the server refused the request, 2 bad usage, 3 the server
//! could not be reached.

/// `println!` for the client's output, except that a closed pipe (the
/// reader went away, as with `| head`) ends the program quietly instead of
/// panicking.
macro_rules! say {
    ($($t:tt)*) => {
        $crate::cli::print_line(format_args!($($t)*))
    };
}

mod definitions;
mod dlq;
mod exchange;
mod group;
mod message;
mod output;
mod queue;

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::client::{Client, ClientConfig, ClientError, Credentials, ErrorKind, TlsSettings};

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
    /// Bearer token, for a server with authentication on.
    #[arg(long, global = true, env = "LETTERBOX_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Client id (with `--client-secret`), for a server with
    /// authentication on.
    #[arg(long, global = true, env = "LETTERBOX_CLIENT_ID")]
    pub client_id: Option<String>,
    /// Client secret of `--client-id`.
    #[arg(
        long,
        global = true,
        env = "LETTERBOX_CLIENT_SECRET",
        hide_env_values = true
    )]
    pub client_secret: Option<String>,
    /// CA certificate (PEM) to trust for an `https://` server.
    #[arg(long, global = true, env = "LETTERBOX_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mTLS, with `--client-key`.
    #[arg(long, global = true, env = "LETTERBOX_CLIENT_CERT")]
    pub client_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of `--client-cert`.
    #[arg(long, global = true, env = "LETTERBOX_CLIENT_KEY")]
    pub client_key: Option<std::path::PathBuf>,
}

impl Common {
    /// The client settings these flags describe.
    pub fn client_config(&self) -> Result<ClientConfig, ClientError> {
        let mut config = ClientConfig::new(self.server.clone());
        config.retry.max_attempts = 2;
        config.credentials = match (&self.token, &self.client_id, &self.client_secret) {
            (Some(t), None, None) => Some(Credentials::Token(t.clone())),
            (None, Some(id), Some(secret)) => Some(Credentials::ClientSecret {
                id: id.clone(),
                secret: secret.clone(),
            }),
            (None, None, None) => None,
            (Some(_), _, _) => {
                return Err(usage(
                    "--token: give either a token or --client-id with --client-secret",
                ));
            }
            (None, Some(_), None) => return Err(usage("--client-id: needs --client-secret")),
            (None, None, Some(_)) => return Err(usage("--client-secret: needs --client-id")),
        };
        let read = |flag: &str, p: &std::path::Path| {
            std::fs::read(p).map_err(|e| usage(format!("{flag}: {}: {e}", p.display())))
        };
        if self.ca_cert.is_some()
            || self.client_cert.is_some()
            || self.server.starts_with("https://")
        {
            let identity_pem = match (&self.client_cert, &self.client_key) {
                (Some(c), Some(k)) => Some((read("--client-cert", c)?, read("--client-key", k)?)),
                (None, None) => None,
                _ => return Err(usage("--client-cert and --client-key go together")),
            };
            config.tls = Some(TlsSettings {
                ca_pem: self
                    .ca_cert
                    .as_deref()
                    .map(|p| read("--ca-cert", p))
                    .transpose()?,
                identity_pem,
                domain: None,
            });
        }
        Ok(config)
    }
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
    let config = match common.client_config() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
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

/// Writes one line to standard output (see `say!`).
pub(crate) fn print_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("letterbox: writing the output: {e}");
        std::process::exit(1);
    }
}
