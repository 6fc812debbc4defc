//! Opening the store the engine runs on: the local data directory
//! (recovery included), or the queues' lease in PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use super::{RemoteStore, ServerConfig, ServerError};
use crate::clock::Clock;
use crate::queue::{Broker, BrokerOptions};
use crate::storage::pg::PgError;
use crate::storage::{OpenReport, PgBackend, PgBackendOptions, StorageError};

/// What a blocking start-up step that did not return left behind: its
/// panic's message, or why it was cancelled.
fn join_failure(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        let p = e.into_panic();
        p.downcast_ref::<&str>()
            .map(|s| format!("panicked: {s}"))
            .or_else(|| p.downcast_ref::<String>().map(|s| format!("panicked: {s}")))
            .unwrap_or_else(|| "panicked".into())
    } else {
        e.to_string()
    }
}

/// Opens the data directory and recovers (the local store).
pub(super) async fn open_local(
    config: &ServerConfig,
    clock: Arc<dyn Clock>,
) -> Result<(Broker, OpenReport), ServerError> {
    let dir = config.data_dir.clone();
    let db_dir = crate::storage::fsutil::current_database(&dir).unwrap_or_else(|_| dir.join("db"));
    let store_opts = config.store.clone();
    let broker_opts = config.broker.clone();
    // Opening replays the log and scans the database: blocking work.
    let (broker, report) = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let (broker, mut report) = Broker::start(&dir, store_opts, clock, broker_opts)?;
        // Recovery is the whole of it: the store's replay and the
        // engine's indexes rebuilt from the database.
        report.elapsed = started.elapsed();
        Ok::<_, ServerError>((broker, report))
    })
    .await
    .map_err(|e| {
        // sled panics on some damage instead of returning an error.
        ServerError::Open(StorageError::Corrupt {
            what: db_dir.display().to_string(),
            reason: format!(
                "reading it failed ({}): the database is damaged (see letterbox verify)",
                join_failure(e)
            ),
        })
    })??;
    Ok((broker, report))
}

/// Takes the queues' lease in PostgreSQL (as a standby: waits until the
/// owner's lease lapses) and rebuilds the engine's indexes from the
/// database.
pub(super) async fn open_remote(
    remote: RemoteStore,
    clock: Arc<dyn Clock>,
    broker_opts: BrokerOptions,
) -> Result<(Broker, OpenReport), ServerError> {
    let backend = take_lease(&remote).await?;
    tracing::info!(
        store = %crate::storage::pg::describe(&remote.url),
        node = %remote.node,
        epoch = backend.epoch(),
        "this node owns the queues; loading them"
    );
    let started = std::time::Instant::now();
    let broker = tokio::task::spawn_blocking(move || Broker::open(backend, clock, broker_opts))
        .await
        .map_err(|e| ServerError::Aborted {
            what: "loading the queues from PostgreSQL",
            why: join_failure(e),
        })??;
    Ok((
        broker,
        OpenReport {
            applied_lsn: 0,
            replayed: 0,
            elapsed: started.elapsed(),
        },
    ))
}

/// Opens the PostgreSQL store under the queues' lease; as a standby,
/// waits while another node holds it or the database cannot be reached.
async fn take_lease(remote: &RemoteStore) -> Result<PgBackend, ServerError> {
    let target = crate::storage::pg::describe(&remote.url);
    let poll = remote.lease_ttl / 3;
    let mut announced = false;
    loop {
        let r = remote.clone();
        let opened = tokio::task::spawn_blocking(move || {
            PgBackend::open(
                &r.url,
                PgBackendOptions {
                    node: r.node.clone(),
                    lease_ttl: r.lease_ttl,
                    ..PgBackendOptions::default()
                },
            )
        })
        .await
        .map_err(|e| ServerError::Aborted {
            what: "taking the PostgreSQL store's lease",
            why: join_failure(e),
        })?;
        match opened {
            Ok(b) => return Ok(b),
            Err(StorageError::Pg(PgError::Held { holder, .. })) if remote.standby => {
                if !announced {
                    tracing::info!(
                        store = %target,
                        owner = %holder.node,
                        epoch = holder.epoch,
                        lease_left_ms = u64::try_from(holder.remaining.as_millis()).unwrap_or(u64::MAX),
                        "standby: another node owns the queues; taking over once its lease lapses"
                    );
                    announced = true;
                }
                let wait = holder.remaining.clamp(Duration::from_millis(50), poll);
                tokio::time::sleep(wait).await;
            }
            Err(StorageError::Pg(
                e @ (PgError::Connect { .. } | PgError::Lost(_) | PgError::Db(_)),
            )) if remote.standby => {
                tracing::warn!(store = %target, error = %e, "standby: PostgreSQL not reachable; trying again");
                tokio::time::sleep(poll).await;
            }
            Err(e) => return Err(ServerError::Open(e)),
        }
    }
}
