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
                let cause = pg_cause(&target, &e.to_string()).await;
                tracing::warn!(
                    store = %target,
                    error = %e,
                    "standby: cannot reach PostgreSQL ({cause}); trying again in {} ms",
                    poll.as_millis()
                );
                tokio::time::sleep(poll).await;
            }
            Err(StorageError::Pg(PgError::Held { holder, .. })) => {
                return Err(ServerError::LeaseHeld {
                    target,
                    owner: holder.node,
                    epoch: holder.epoch,
                    left_ms: u64::try_from(holder.remaining.as_millis()).unwrap_or(u64::MAX),
                });
            }
            Err(StorageError::Pg(PgError::Connect { target, detail })) => {
                return Err(ServerError::PgUnreachable {
                    cause: pg_cause(&target, &detail).await,
                    target,
                    detail,
                });
            }
            Err(e) => return Err(ServerError::Open(e)),
        }
    }
}

/// Why PostgreSQL could not be reached, in words, and what to check:
/// from PostgreSQL's own answer (its SQLSTATE code) when it gave one,
/// else found out by trying the hosts of `target` (`host:port,.../db`)
/// as the connection did: resolving each name, then connecting.
async fn pg_cause(target: &str, detail: &str) -> String {
    if let Some(cause) = answered_cause(detail) {
        return cause.to_string();
    }
    let hosts = target.rsplit_once('/').map_or(target, |(h, _)| h);
    for host in hosts.split(',').filter(|h| !h.starts_with('/')) {
        if let Some(cause) = unreachable_cause(host).await {
            return cause;
        }
    }
    "PostgreSQL answers there but did not accept the session: see its words".to_string()
}

/// The cause of a refusal PostgreSQL answered, from its words and code.
fn answered_cause(detail: &str) -> Option<&'static str> {
    let has = |words: &[&str]| words.iter().any(|w| detail.contains(w));
    Some(
        if has(&["(28P01)", "(28000)", "password authentication failed"]) {
            "authentication failed: check the user and password in --store (or PGPASSWORD, ~/.pgpass) and pg_hba.conf"
        } else if has(&["(3D000)"]) {
            "the database does not exist: create it, or name another one in --store"
        } else if has(&["(57P03)", "the database system is starting up"]) {
            "PostgreSQL is starting up or shutting down"
        } else if has(&["(53300)", "too many connections"]) {
            "PostgreSQL has no connection left (max_connections)"
        } else if has(&["(42501)", "permission denied"]) {
            "the user lacks a privilege it needs (it creates the lb_* tables)"
        } else {
            return None;
        },
    )
}

/// Why `host:port` cannot be reached (its name does not resolve, the
/// connection is refused or not answered), or `None` if it can.
async fn unreachable_cause(host_port: &str) -> Option<String> {
    let limit = Duration::from_secs(5);
    let (host, port) = host_port.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let addrs: Vec<std::net::SocketAddr> =
        match tokio::time::timeout(limit, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(a)) => a.collect(),
            Ok(Err(_)) => {
                return Some(format!(
                    "the host name {host:?} does not resolve (DNS): check the host in --store"
                ));
            }
            Err(_) => {
                return Some(format!(
                    "resolving the host name {host:?} took over 5 s (DNS)"
                ));
            }
        };
    let mut refused = None;
    for addr in addrs {
        match tokio::time::timeout(limit, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => return None,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = Some(format!(
                    "connection refused at {addr}: no PostgreSQL listens there (is it running, on that port?)"
                ));
            }
            Ok(Err(e)) => refused = Some(format!("cannot connect to {addr}: {e}")),
            Err(_) => {
                refused = Some(format!(
                    "no answer from {addr} within 5 s: is it reachable (a firewall, the network)?"
                ));
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::pg_cause;

    #[tokio::test]
    async fn postgresql_failures_are_named() {
        let generic = "error connecting to server";
        for (target, detail, words) in [
            (
                "127.0.0.1:1/db",
                generic,
                "connection refused at 127.0.0.1:1",
            ),
            (
                "no-such-host.invalid:5432/db",
                generic,
                "the host name \"no-such-host.invalid\" does not resolve (DNS)",
            ),
            (
                "127.0.0.1:1/db",
                "password authentication failed for user \"letterbox\" (28P01)",
                "authentication failed",
            ),
            (
                "127.0.0.1:1/db",
                "database \"nope\" does not exist (3D000)",
                "the database does not exist",
            ),
        ] {
            let cause = pg_cause(target, detail).await;
            assert!(cause.starts_with(words), "{detail}: {cause}");
        }
    }
}
