//! The `letterbox` binary: `letterbox serve` runs the server; the other
//! subcommands are the command-line client (see `cli/`).
//!
//! Exit codes of `serve`: 0 after a graceful shutdown; 2 for bad flags; 1
//! when the server cannot start (data directory locked, damaged or of an
//! unknown format, address in use); 3 when the storage failed while
//! running (fail-stop: restart to recover from disk). `verify`: 0 sound,
//! 1 damage found, 2 cannot check (not a data directory, unknown format,
//! in use by a server). Client commands: 0 success, 1 refused by the
//! server, 2 bad usage, 3 server unreachable. A build with the
//! `fault-injection` feature exits 2 at once when `LETTERBOX_FAULT` names
//! no fault (src/faults.rs).

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use letterbox::cli;
use letterbox::clock::SystemClock;
use letterbox::config::{LogFormat, ServeArgs, read_config_file};
use letterbox::launch::{ANYPOINT_PREFIX, CONSOLE_PREFIX, GRPC_PREFIX, METRICS_PREFIX, SQS_PREFIX};
use letterbox::server::{FrontEnd, Server, ServerError};
use tracing_subscriber::EnvFilter;

/// mimalloc: the server allocates many small short-lived buffers across
/// threads (HTTP/2 frames, protobuf messages), where glibc's malloc spends a
/// fifth of the request path.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for the server process, unless
/// `MIMALLOC_ALLOW_THP` is set (then mimalloc's own setting stands).
/// mimalloc asks the kernel for huge pages on its arenas, and a huge page
/// is zeroed whole (2 MiB) the first time any byte of it is touched: the
/// server's short-lived request and body buffers then spend much of their
/// CPU in the kernel zeroing pages, and its resident memory grows by whole
/// huge pages (docs/benchmarks/2026-12-01/NOTES.md, "Transparent huge pages off").
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none()
        && let Err(e) = rustix::thread::disable_transparent_huge_pages(true)
    {
        tracing::warn!(
            error = %e,
            "cannot turn transparent huge pages off: memory may grow by whole huge pages and the kernel spend CPU zeroing them (set MIMALLOC_ALLOW_THP=1 to leave them to the allocator and silence this)"
        );
    }
}

/// Letterbox: a durable message queue with dead letter queues.
#[derive(Debug, Parser)]
#[command(name = "letterbox", version, about)]
struct Cli {
    #[command(flatten)]
    leading: cli::Leading,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Make credentials for the configuration file.
    #[command(subcommand)]
    Auth(AuthCmd),
    /// Check a data directory offline (the server must be stopped):
    /// format, log records and their checksums, every stored record,
    /// payloads, and the consistency of queues, messages and counters.
    /// Nothing is modified.
    Verify(VerifyArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) to standard output.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to standard output, or write one page
    /// per subcommand into a directory.
    Man {
        /// Write `letterbox.1`, `letterbox-serve.1`, ... here instead.
        #[arg(long)]
        out_dir: Option<std::path::PathBuf>,
    },
    #[command(flatten)]
    Client(Box<cli::Command>),
}

/// Writes generated text to standard output; a reader that went away
/// (`| head`) is not an error.
fn emit(bytes: &[u8]) -> ExitCode {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("letterbox: writing the output: {e}");
            ExitCode::from(1)
        }
    }
}

fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "letterbox", &mut script);
    emit(&script)
}

fn man(out_dir: Option<&std::path::Path>) -> ExitCode {
    let cmd = Cli::command();
    let written = match out_dir {
        Some(dir) => cli::man::write_pages(cmd, dir).map_err(|e| format!("{}: {e}", dir.display())),
        None => match cli::man::render(cmd) {
            Ok(page) => return emit(&page),
            Err(e) => Err(e.to_string()),
        },
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("letterbox man: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, Subcommand)]
enum AuthCmd {
    /// Hash a client secret read from standard input (one line) for a
    /// principal's `secret_hash`.
    HashSecret,
    /// Make a random bearer token: prints the token (give it to the
    /// client) and its digest (put it in `token_sha256`).
    NewToken,
    /// Make a random AWS access key for the SQS endpoint: prints the
    /// access key id (put it in `aws_access_key_id`) and the secret access
    /// key (give both to the client; write the secret into the file named
    /// by `aws_secret_access_key_file`).
    NewAwsKey,
}

fn auth_command(cmd: &AuthCmd) -> ExitCode {
    match cmd {
        AuthCmd::HashSecret => {
            let mut line = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut line) {
                eprintln!("letterbox: reading the secret: {e}");
                return ExitCode::from(1);
            }
            let secret = line.trim_end_matches(['\r', '\n']);
            if secret.is_empty() {
                eprintln!("letterbox: the secret is empty (give it on standard input)");
                return ExitCode::from(2);
            }
            match letterbox::auth::hash_secret(secret) {
                Ok(h) => {
                    println!("{h}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("letterbox: {e}");
                    ExitCode::from(1)
                }
            }
        }
        AuthCmd::NewToken => {
            let (token, digest) = letterbox::auth::new_token();
            println!("token:        {token}");
            println!("token_sha256: {digest}");
            ExitCode::SUCCESS
        }
        AuthCmd::NewAwsKey => {
            let (id, secret) = letterbox::auth::new_aws_key();
            println!("aws_access_key_id:     {id}");
            println!("aws_secret_access_key: {secret}");
            ExitCode::SUCCESS
        }
    }
}

/// Flags of `letterbox verify`.
#[derive(Debug, clap::Args)]
struct VerifyArgs {
    /// Data directory to check.
    #[arg(long, env = "LETTERBOX_DATA_DIR", default_value = "letterbox-data")]
    data_dir: std::path::PathBuf,
    /// Where to copy the database for the check (default: the system's
    /// temporary directory); needs as much space as `db/`.
    #[arg(long)]
    scratch: Option<std::path::PathBuf>,
}

fn verify(args: &VerifyArgs) -> ExitCode {
    use letterbox::queue::verify::{VerifyOptions, verify};
    let opts = VerifyOptions {
        scratch: args.scratch.clone(),
    };
    match verify(&args.data_dir, &opts) {
        Ok(report) => {
            println!("data directory {}", args.data_dir.display());
            for (name, value) in &report.figures {
                println!("  {name:<38} {value}");
            }
            for note in &report.notes {
                println!("note: {note}");
            }
            if report.is_sound() {
                println!("ok: no damage or inconsistency found");
                ExitCode::SUCCESS
            } else {
                for p in &report.problems {
                    println!("problem: {p}");
                }
                println!("{} problem(s) found", report.problems.len());
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!(
                "letterbox verify: cannot check {}: {e}",
                args.data_dir.display()
            );
            ExitCode::from(2)
        }
    }
}

/// Parses the command line; for `serve`, merges the configuration file
/// below flags and variables.
fn parse_command_line() -> Result<Cli, clap::Error> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = Cli::command().try_get_matches_from(&argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let (Command::Serve(args), Some(("serve", given))) = (&cli.command, matches.subcommand())
        && let Some(path) = &args.config
    {
        let settings = read_config_file(path, given)
            .map_err(|e| Cli::command().error(clap::error::ErrorKind::ValueValidation, e))?;
        argv.extend(settings.args);
        let matches = Cli::command().try_get_matches_from(&argv)?;
        cli = Cli::from_arg_matches(&matches)?;
        if let Command::Serve(args) = &mut cli.command {
            args.principals = settings.principals;
        }
    }
    // Connection flags before the subcommand: for the client commands.
    let leading = std::mem::take(&mut cli.leading);
    match (&mut cli.command, matches.subcommand()) {
        (Command::Client(cmd), Some((_, sub))) => cmd.take_leading(leading, sub),
        (_, sub) => {
            if let Some(flag) = leading.given().first() {
                let name = sub.map_or("letterbox", |(n, _)| n);
                return Err(Cli::command().error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "{flag} is a connection flag of the client commands (queue, publish, ...), not of `{name}`"
                    ),
                ));
            }
        }
    }
    Ok(cli)
}

/// PostgreSQL's notices (`relation "lb_owner" already exists, skipping`,
/// which a standby's every attempt at the lease would log at `info`) are
/// left out unless the filter names `tokio_postgres` itself; its errors
/// come through the server's own messages.
const QUIET_PG_NOTICES: &str = "tokio_postgres::connection=warn";

fn init_logs(filter: &str, format: LogFormat) -> Result<(), String> {
    let mut filter =
        EnvFilter::try_new(filter).map_err(|e| format!("--log / LETTERBOX_LOG: {e}"))?;
    if !filter.to_string().contains("tokio_postgres")
        && let Ok(quiet) = QUIET_PG_NOTICES.parse()
    {
        filter = filter.add_directive(quiet);
    }
    // Colours only for a person at a terminal: a file, a pipe or the
    // journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Resolves at SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: a SIGTERM that comes while
/// the server recovers or right after it announced itself must still stop
/// it gracefully, not kill it.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
}

/// Prints a line on standard output for whoever started the server. A
/// reader that went away (a closed pipe) is not an error of the server.
fn announce(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn serve(args: ServeArgs) -> ExitCode {
    let config = match args.server_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("letterbox: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = shutdown_signal();
    let server = match Server::start(config.clone(), Arc::new(SystemClock)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("letterbox: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(path) = &args.definitions {
        let applied = match std::fs::read_to_string(path) {
            Ok(text) => server
                .broker()
                .import_definitions_json(&text)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match applied {
            Ok(r) => tracing::info!(
                file = %path.display(),
                queues = r.queues_created,
                exchanges = r.exchanges_created,
                bindings = r.bindings_changed,
                "definitions applied"
            ),
            Err(e) => {
                eprintln!("letterbox: definitions {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    if config.auth.is_enabled() {
        tracing::info!("authentication on: every call needs a principal's credentials");
    } else {
        tracing::warn!(
            addr = %server.local_addr(),
            "authentication off (no principals configured): every caller may do everything; listening on loopback only unless --allow-remote-without-auth"
        );
    }
    let report = server.open_report();
    tracing::info!(
        store = %server.broker().store().location(),
        replayed = report.replayed,
        recovery_ms = u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
        "recovered"
    );
    // The first line of standard output is the bound address: scripts and
    // tests started with port 0 read it. Then one line per other listener
    // (src/launch.rs), and for each a log line with its TLS settings.
    for l in server.listening() {
        let line = match l.front_end {
            FrontEnd::Grpc => format!("{GRPC_PREFIX}{}", l.addr),
            FrontEnd::Anypoint => format!("{ANYPOINT_PREFIX}{}", l.addr),
            FrontEnd::Metrics => format!("{METRICS_PREFIX}{}", l.url()),
            FrontEnd::Console => format!("{CONSOLE_PREFIX}{}", l.url()),
            FrontEnd::Sqs => format!("{SQS_PREFIX}{}", l.url()),
        };
        announce(&line);
        tracing::info!(
            listener = %l.front_end.name(),
            url = %l.url(),
            tls = %if l.tls { "on" } else { "off" },
            client_certs = %l.client_certs.as_str(),
            "serving {}",
            l.front_end.what()
        );
        if l.front_end == FrontEnd::Metrics && config.metrics_token.is_some() {
            tracing::info!("metrics require a bearer token");
        }
    }
    // Under systemd with `Type=notify`: ready now, stopping at the signal.
    ready_notify("READY=1\nSTATUS=serving");
    let shutdown = async move {
        shutdown.await;
        ready_notify("STOPPING=1\nSTATUS=stopping");
    };
    match server.serve(shutdown).await {
        Ok(()) => {
            tracing::info!("stopped cleanly");
            ExitCode::SUCCESS
        }
        Err(e @ ServerError::StorageFailed(_)) => {
            eprintln!("letterbox: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("letterbox: {e}");
            ExitCode::from(1)
        }
    }
}

/// Tells the service manager `state` (`letterbox::server::notify`); a
/// failure is logged, as the server serves all the same.
fn ready_notify(state: &str) {
    match letterbox::server::notify::notify(state) {
        Ok(true) => tracing::debug!(state, "service manager notified"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            error = %e,
            "cannot notify the service manager through NOTIFY_SOCKET; check the unit's NotifyAccess= setting"
        ),
    }
}

fn main() -> ExitCode {
    let cli = match parse_command_line() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // Builds with the `fault-injection` feature only: the negative control
    // named by LETTERBOX_FAULT, if any (src/faults.rs). Other builds read
    // nothing.
    let fault = match letterbox::faults::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("letterbox: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Auth(cmd) => auth_command(&cmd),
        Command::Serve(args) => {
            if let Err(e) = init_logs(&args.log, args.log_format) {
                eprintln!("letterbox: {e}");
                return ExitCode::from(2);
            }
            if let Some(f) = fault {
                tracing::warn!(
                    fault = f.name(),
                    "fault injection: this server breaks a durability rule on purpose"
                );
            }
            no_transparent_huge_pages();
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("letterbox: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            runtime.block_on(serve(*args))
        }
        Command::Verify(args) => verify(&args),
        Command::Completions { shell } => completions(shell),
        Command::Man { out_dir } => man(out_dir.as_deref()),
        Command::Client(cmd) => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("letterbox: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            runtime.block_on(cli::run(*cmd))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
