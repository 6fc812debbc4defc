//! The `letterbox` binary: `letterbox serve` runs the server; the other
//! subcommands are the command-line client (see `cli/`).
//!
//! Exit codes of `serve`: 0 after a graceful shutdown; 2 for bad flags; 1
//! when the server cannot start (data directory locked, damaged or of an
//! unknown format, address in use); 3 when the storage failed while
//! running (fail-stop: restart to recover from disk). `verify`: 0 sound,
//! 1 damage found, 2 cannot check (not a data directory, unknown format,
//! in use by a server). Client commands: 0 success, 1 refused by the
//! server, 2 bad usage, 3 server unreachable.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use letterbox::cli;
use letterbox::clock::SystemClock;
use letterbox::config::{LogFormat, ServeArgs};
use letterbox::server::{Server, ServerError};
use tracing_subscriber::EnvFilter;

/// mimalloc: the server allocates many small short-lived buffers across
/// threads (HTTP/2 frames, protobuf messages), where glibc's malloc spends a
/// fifth of the request path.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Letterbox: a durable message queue with dead letter queues.
#[derive(Debug, Parser)]
#[command(name = "letterbox", version, about)]
struct Cli {
    #[command(flatten)]
    common: cli::Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Check a data directory offline (the server must be stopped):
    /// format, log records and their checksums, every stored record,
    /// payloads, and the consistency of queues, messages and counters.
    /// Nothing is modified.
    Verify(VerifyArgs),
    #[command(flatten)]
    Client(cli::Command),
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
    use letterbox::storage::verify::{VerifyOptions, verify};
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

fn init_logs(filter: &str, format: LogFormat) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("--log / LETTERBOX_LOG: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

async fn serve(args: ServeArgs) -> ExitCode {
    let config = match args.server_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("letterbox: {e}");
            return ExitCode::from(2);
        }
    };
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
    let report = server.open_report();
    tracing::info!(
        data_dir = %config.data_dir.display(),
        replayed = report.replayed,
        recovery_ms = u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
        "recovered"
    );
    // The first line of standard output is the bound address: scripts and
    // tests started with port 0 read it.
    println!("letterbox listening on {}", server.local_addr());
    tracing::info!(addr = %server.local_addr(), "serving gRPC");
    match server.serve(shutdown_signal()).await {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            if let Err(e) = init_logs(&args.log, args.log_format) {
                eprintln!("letterbox: {e}");
                return ExitCode::from(2);
            }
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
            runtime.block_on(serve(args))
        }
        Command::Verify(args) => verify(&args),
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
            runtime.block_on(cli::run(cli.common, cmd))
        }
    }
}
