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
pub mod man;
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
/// of the context in use (see [`context`]). They may come before the
/// subcommand too ([`Leading`]).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection")]
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

/// The connection flags given before the subcommand (`letterbox --context
/// prod queue list`, as `kubectl` and `nats` take them): the same as
/// [`Common`], which they fill in where the subcommand's own command line
/// gave nothing (a flag after the subcommand wins; both win over the
/// `LETTERBOX_*` variables, which [`Common`] reads).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Connection (client commands; also after the subcommand)")]
pub struct Leading {
    /// Server address, `http://HOST:PORT` or `https://HOST:PORT`, or
    /// several separated by commas [env: LETTERBOX_SERVER] [default: the
    /// context's, else http://127.0.0.1:50051].
    #[arg(long)]
    pub server: Option<String>,
    /// Connection profile to use instead of the selected one
    /// [env: LETTERBOX_CONTEXT].
    #[arg(long)]
    pub context: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Bearer token [env: LETTERBOX_TOKEN].
    #[arg(long)]
    pub token: Option<String>,
    /// Client id (with `--client-secret`) [env: LETTERBOX_CLIENT_ID].
    #[arg(long)]
    pub client_id: Option<String>,
    /// Client secret of `--client-id` [env: LETTERBOX_CLIENT_SECRET].
    #[arg(long)]
    pub client_secret: Option<String>,
    /// CA certificate (PEM) to trust for an `https://` server
    /// [env: LETTERBOX_CA_CERT].
    #[arg(long)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mTLS, with `--client-key`
    /// [env: LETTERBOX_CLIENT_CERT].
    #[arg(long)]
    pub client_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of `--client-cert` [env: LETTERBOX_CLIENT_KEY].
    #[arg(long)]
    pub client_key: Option<std::path::PathBuf>,
}

impl Leading {
    /// The flags given, by name, for a message.
    pub fn given(&self) -> Vec<&'static str> {
        let Leading {
            server,
            context,
            json,
            token,
            client_id,
            client_secret,
            ca_cert,
            client_cert,
            client_key,
        } = self;
        [
            ("--server", server.is_some()),
            ("--context", context.is_some()),
            ("--json", *json),
            ("--token", token.is_some()),
            ("--client-id", client_id.is_some()),
            ("--client-secret", client_secret.is_some()),
            ("--ca-cert", ca_cert.is_some()),
            ("--client-cert", client_cert.is_some()),
            ("--client-key", client_key.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, on)| on.then_some(flag))
        .collect()
    }
}

impl Common {
    /// Fills in what the leading flags give where the subcommand's own
    /// command line gave nothing; `from_command_line(id)` says whether it
    /// gave the flag whose argument id is `id` (`server`, `ca_cert`, ...).
    fn take_leading(&mut self, leading: Leading, from_command_line: impl Fn(&str) -> bool) {
        let Leading {
            server,
            context,
            json,
            token,
            client_id,
            client_secret,
            ca_cert,
            client_cert,
            client_key,
        } = leading;
        fn fill<T>(mine: &mut Option<T>, theirs: Option<T>, mine_given: bool) {
            if !mine_given && theirs.is_some() {
                *mine = theirs;
            }
        }
        fill(&mut self.server, server, from_command_line("server"));
        fill(&mut self.context, context, from_command_line("context"));
        fill(&mut self.token, token, from_command_line("token"));
        fill(
            &mut self.client_id,
            client_id,
            from_command_line("client_id"),
        );
        fill(
            &mut self.client_secret,
            client_secret,
            from_command_line("client_secret"),
        );
        fill(&mut self.ca_cert, ca_cert, from_command_line("ca_cert"));
        fill(
            &mut self.client_cert,
            client_cert,
            from_command_line("client_cert"),
        );
        fill(
            &mut self.client_key,
            client_key,
            from_command_line("client_key"),
        );
        self.json |= json;
    }
}

impl Command {
    /// Takes the connection flags given before the subcommand
    /// ([`Leading`]); `sub` is what clap matched of the subcommand, to
    /// tell the flags given after it from those of the variables.
    pub fn take_leading(&mut self, leading: Leading, sub: &clap::ArgMatches) {
        let from_command_line = |id: &str| {
            matches!(
                sub.try_get_raw(id).ok().flatten().and(sub.value_source(id)),
                Some(clap::parser::ValueSource::CommandLine)
            )
        };
        match self {
            Command::Context { json, .. } | Command::Tls { json, .. } => *json |= leading.json,
            Command::Queue { common, .. }
            | Command::Publish { common, .. }
            | Command::Consume { common, .. }
            | Command::Browse { common, .. }
            | Command::Group { common, .. }
            | Command::Exchange { common, .. }
            | Command::Dlq { common, .. }
            | Command::Definitions { common, .. }
            | Command::Health { common, .. } => {
                common.take_leading(leading, from_command_line);
            }
        }
    }
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
        args: message::PublishArgs,
        // Last: its help heading covers its own flags only.
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
    },
    /// Receive messages, print them, and ack (or nack) them.
    Consume {
        #[command(flatten)]
        #[allow(missing_docs)]
        args: message::ConsumeArgs,
        // Last: its help heading covers its own flags only.
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
    },
    /// Read messages without consuming them.
    Browse {
        #[command(flatten)]
        #[allow(missing_docs)]
        args: message::BrowseArgs,
        // Last: its help heading covers its own flags only.
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
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
    /// Whether the server serves: exit 0 when its gRPC health service
    /// answers SERVING, 1 when it answers otherwise (shutting down), 3 when
    /// it cannot be reached. For health checks (the container's, a load
    /// balancer's script).
    Health {
        /// The service to ask about: "" (the default) for the server as a
        /// whole, `letterbox.v1.MessagingService` or
        /// `letterbox.v1.AdminService`.
        #[arg(long, default_value = "")]
        service: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        common: Common,
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
        | Command::Definitions { common, .. }
        | Command::Health { common, .. } => common.clone(),
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
        Command::Health { service, .. } => match client.serving(&service).await {
            Ok(serving) => {
                let what = if serving { "serving" } else { "not serving" };
                if out.json {
                    out.line(&serde_json::json!({ "serving": serving }));
                } else {
                    say!("{}: {what}", client.endpoint());
                }
                if !serving {
                    return ExitCode::from(1);
                }
                Ok(())
            }
            Err(e) => Err(e),
        },
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
