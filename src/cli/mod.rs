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

pub mod context;
mod definitions;
mod dlq;
mod exchange;
mod group;
mod message;
pub(crate) mod output;
pub(crate) mod queue;
mod tls;

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::client::{Client, ClientConfig, ClientError, Code, Credentials, ErrorKind, TlsSettings};

/// The address used when neither a flag, a variable nor a context gives
/// one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";

/// Flags shared by every client command. Each wins over the same setting
/// of the context in use (see [`context`]).
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Server address, `http://HOST:PORT` or `https://HOST:PORT`, or
    /// several separated by commas (the nodes of a highly available pair,
    /// tried in order) [default: the context's, else
    /// http://127.0.0.1:50051].
    #[arg(long, global = true, env = "LETTERBOX_SERVER")]
    pub server: Option<String>,
    /// Connection profile to use instead of the selected one (`letterbox
    /// context`).
    #[arg(long, global = true, env = "LETTERBOX_CONTEXT")]
    pub context: Option<String>,
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

/// Checks a server address given on the command line or in a context.
pub(crate) fn check_server_url(url: &str) -> Result<(), ClientError> {
    crate::client::check_endpoint(url).map_err(|e| usage(e.to_string()))
}

impl Common {
    /// The client settings these flags describe, over the context in use.
    pub fn client_config(&self) -> Result<ClientConfig, ClientError> {
        let profile = context::active(self.context.as_deref())?.unwrap_or_default();
        let server = self
            .server
            .clone()
            .or_else(|| Some(profile.server.clone()).filter(|s| !s.is_empty()))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string());
        check_server_url(&server)?;
        let mut config = ClientConfig::new(server.clone());
        config.retry.max_attempts = 2;
        // Credentials given on the command line replace the context's as a
        // whole (a token flag never mixes with a context's client id).
        let given =
            self.token.is_some() || self.client_id.is_some() || self.client_secret.is_some();
        let (token, id, secret) = if given {
            (&self.token, &self.client_id, &self.client_secret)
        } else {
            (&profile.token, &profile.client_id, &profile.client_secret)
        };
        config.credentials = match (token, id, secret) {
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
        let ca_cert = self.ca_cert.clone().or(profile.ca_cert);
        let (client_cert, client_key) = if self.client_cert.is_some() || self.client_key.is_some() {
            (self.client_cert.clone(), self.client_key.clone())
        } else {
            (profile.client_cert, profile.client_key)
        };
        if ca_cert.is_some() || client_cert.is_some() || server.starts_with("https://") {
            let identity_pem = match (&client_cert, &client_key) {
                (Some(c), Some(k)) => Some((read("--client-cert", c)?, read("--client-key", k)?)),
                (None, None) => None,
                _ => return Err(usage("--client-cert and --client-key go together")),
            };
            config.tls = Some(TlsSettings {
                ca_pem: ca_cert
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

/// The client commands, each with the connection flags ([`Common`]).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, inspect, change, delete and purge queues.
    Queue {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: queue::QueueCmd,
    },
    /// Publish messages (from arguments, a file or standard input).
    Publish {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(flatten)]
        #[allow(missing_docs)]
        args: message::PublishArgs,
    },
    /// Receive messages, print them, and ack (or nack) them.
    Consume {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(flatten)]
        #[allow(missing_docs)]
        args: message::ConsumeArgs,
    },
    /// Read messages without consuming them.
    Browse {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(flatten)]
        #[allow(missing_docs)]
        args: message::BrowseArgs,
    },
    /// FIFO groups: list, skip a head, release a parked group.
    Group {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: group::GroupCmd,
    },
    /// Fanout exchanges and their bindings.
    Exchange {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: exchange::ExchangeCmd,
    },
    /// Dead letter queues: redrive.
    Dlq {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: dlq::DlqCmd,
    },
    /// Export or import queues, exchanges and bindings as JSON.
    Definitions {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: definitions::DefinitionsCmd,
    },
    /// Connection profiles: server address, TLS files and credentials
    /// saved under a name (`add`, `use`, `ls`, `show`, `rm`).
    Context {
        /// Print JSON instead of tables.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: context::ContextCmd,
    },
    /// TLS that works the first time: `tls init DIR` makes a local CA, a
    /// server certificate it signs and, with `--client`, a client
    /// certificate.
    Tls {
        /// Print JSON instead of text.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        #[allow(missing_docs)]
        cmd: tls::TlsCmd,
    },
}

/// Runs a client command.
pub async fn run(command: Command) -> ExitCode {
    let common = match &command {
        Command::Context { json, .. } => {
            let out = output::Out::new(*json);
            let Command::Context { cmd, .. } = command else {
                return ExitCode::from(2);
            };
            return match context::run(&out, cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            };
        }
        Command::Tls { json, .. } => {
            let out = output::Out::new(*json);
            let Command::Tls { cmd, .. } = command else {
                return ExitCode::from(2);
            };
            return match tls::run(&out, cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            };
        }
        Command::Queue { common, .. }
        | Command::Publish { common, .. }
        | Command::Consume { common, .. }
        | Command::Browse { common, .. }
        | Command::Group { common, .. }
        | Command::Exchange { common, .. }
        | Command::Dlq { common, .. }
        | Command::Definitions { common, .. } => common.clone(),
    };
    // Usage that can be told without the server is told before
    // connecting.
    if let Command::Publish { args, .. } = &command
        && let Err(e) = args.check()
    {
        return fail(&e);
    }
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
        Command::Queue { cmd, .. } => queue::run(&client, &out, cmd).await,
        Command::Publish { args, .. } => message::publish(&client, &out, args).await,
        Command::Consume { args, .. } => message::consume(&client, &out, args).await,
        Command::Browse { args, .. } => message::browse(&client, &out, args).await,
        Command::Group { cmd, .. } => group::run(&client, &out, cmd).await,
        Command::Exchange { cmd, .. } => exchange::run(&client, &out, cmd).await,
        Command::Dlq { cmd, .. } => dlq::run(&client, &out, cmd).await,
        Command::Definitions { cmd, .. } => definitions::run(&client, &out, cmd).await,
        Command::Context { .. } | Command::Tls { .. } => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &ClientError) -> ExitCode {
    eprintln!("letterbox: {e}");
    match e.kind() {
        ErrorKind::Transport | ErrorKind::Rpc(Code::Unavailable) => ExitCode::from(3),
        ErrorKind::InvalidArgument => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

/// The server's refusal of a value a flag gave, in the command line's
/// words: "`--ttl` must be between 1m and 14d (got 10s)" rather than the
/// API's field and its milliseconds. `flag_of` names the flag of an API
/// field (`config.message_ttl_ms`) and what it was given, if it is one of
/// this command's; any other error is left as it is. A flag's value
/// refused is bad usage (exit code 2).
pub(crate) fn in_flag_words(
    e: ClientError,
    flag_of: impl Fn(&str) -> Option<(&'static str, Option<String>)>,
) -> ClientError {
    if e.code() != Some(Code::InvalidArgument) {
        return e;
    }
    let Some((field, reason)) = e.field_violations().into_iter().next() else {
        return e;
    };
    let Some((flag, given)) = flag_of(&field) else {
        return e;
    };
    // Milliseconds as the duration flags write them.
    let reason = if field.ends_with("_ms") {
        reason
            .split(' ')
            .map(|w| match w.parse::<u64>() {
                Ok(ms) => output::dur(ms),
                Err(_) => w.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        reason
    };
    let got = given.map_or_else(String::new, |g| format!(" (got {g})"));
    usage(format!("`{flag}` {reason}{got}"))
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
