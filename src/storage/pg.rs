//! PostgreSQL as the place where state becomes durable: the schema, the
//! ownership lease with its epoch fence, fenced batch commits with a
//! commit marker, and reads and prefix scans of the key space.
//!
//! This is the database side of running Letterbox on a replicated
//! PostgreSQL (a Patroni cluster or a managed one): the server stays the
//! only writer of its shard's keys and decides everything in memory, as
//! with the local log; what it commits here is the same transactions of
//! absolute puts and deletes over the key space of [`super::keys`].
//!
//! ## Safety
//!
//! * **Ownership** of a shard is a row of `lb_owner` (`epoch`, `node`,
//!   `expires`) judged by the database's clock: [`PgState::acquire`] takes
//!   a free or lapsed lease (or one held under the same node name) and
//!   raises the epoch, so every owner has a larger epoch than any before
//!   it. A lease is liveness only.
//! * **The fence** is safety: every commit locks the owner row
//!   `FOR SHARE` in its own transaction and goes on only if the epoch is
//!   still the committer's. A takeover's `UPDATE` of that row waits for
//!   in-flight commits (it needs the row exclusively), and every commit
//!   after it reads the new epoch and is refused ([`PgError::Fenced`]): an
//!   owner that was paused or cut off can never write after another took
//!   over.
//! * **Unknown outcomes**: a commit whose `COMMIT` failed (the connection
//!   lost while the primary or its synchronous standby was answering) may
//!   or may not have happened. It is reported as [`PgError::Unknown`] and
//!   settled by [`PgState::resolve`], which waits for any transaction
//!   still holding the owner row and then reads the shard's commit marker
//!   (`lb_marker.committed_lsn`, written by every commit); it is never
//!   blindly sent again after something newer.
//! * **Schema**: created by the server and versioned in `lb_schema`; a
//!   database whose schema is newer than this server's is refused.
//!
//! Keys live in three tables by their tag, each with its own vacuum
//! settings: message records (`lb_meta`, rewritten on every delivery),
//! bodies (`lb_payload`) and everything else (`lb_small`). `bytea`
//! compares as bytes, so a table's order is the key space's order.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_postgres::{Client, NoTls};

use super::backend::prefix_end;
use super::keys::{TAG_META, TAG_PAYLOAD};

/// The schema version this server writes and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// What went wrong with PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The database could not be reached or did not accept the session.
    #[error("PostgreSQL at {target}: {detail}")]
    Connect {
        /// The hosts tried (the URL without its password).
        target: String,
        /// Why.
        detail: String,
    },
    /// The database holds a newer Letterbox schema than this server knows.
    #[error(
        "the database's Letterbox schema is version {found}, newer than this server's {supported}: \
         run a server at least as new as the one that wrote it"
    )]
    NewerSchema {
        /// The version found in `lb_schema`.
        found: i32,
        /// [`SCHEMA_VERSION`].
        supported: i32,
    },
    /// Another node owns the shard now.
    #[error("shard {shard}: ownership lost (this node's epoch {mine}, the shard's now {current})")]
    Fenced {
        /// The shard.
        shard: i32,
        /// The epoch this node held.
        mine: i64,
        /// The shard's current epoch.
        current: i64,
    },
    /// `COMMIT` failed: the batch may or may not be durable. Settle it with
    /// [`PgState::resolve`] before committing anything else.
    #[error("the outcome of the commit up to lsn {lsn} is unknown: {detail}")]
    Unknown {
        /// The batch's last lsn.
        lsn: u64,
        /// The error `COMMIT` gave.
        detail: String,
    },
    /// A statement failed; nothing of the transaction was committed.
    #[error("PostgreSQL: {0}")]
    Db(String),
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> PgError {
        PgError::Db(db_text(&e))
    }
}

/// An error's text with the server's message, when there is one.
fn db_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, PgError>;

/// The right to write a shard: its epoch, and until when this node may
/// act on it by its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The epoch every commit checks.
    pub epoch: i64,
    /// The lease as this node counts it: from before the statement that
    /// took or renewed it, so never later than the database's.
    pub valid_until: Instant,
}

/// Who holds a shard's lease, when this node could not take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's node name.
    pub node: String,
    /// Its epoch.
    pub epoch: i64,
    /// How long its lease still runs by the database's clock.
    pub remaining: Duration,
}

/// How an unknown commit outcome settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The batch is durable.
    Committed,
    /// It is not, and nothing newer is: the same batch may be sent again.
    NotCommitted,
}

/// One shard's state in PostgreSQL, over one connection.
pub struct PgState {
    client: Client,
    shard: i32,
    target: String,
}

impl std::fmt::Debug for PgState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgState")
            .field("shard", &self.shard)
            .field("target", &self.target)
            .finish()
    }
}

/// The hosts and database of a URL, for messages (no password).
pub fn describe(url: &str) -> String {
    match url.parse::<tokio_postgres::Config>() {
        Ok(c) => {
            let hosts: Vec<String> = c
                .get_hosts()
                .iter()
                .zip(c.get_ports().iter().chain(std::iter::repeat(&5432)))
                .map(|(h, p)| match h {
                    tokio_postgres::config::Host::Tcp(h) => format!("{h}:{p}"),
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                })
                .collect();
            format!("{}/{}", hosts.join(","), c.get_dbname().unwrap_or(""))
        }
        Err(_) => "an unparsable URL".to_string(),
    }
}

const MIGRATION_1: &str = "
CREATE TABLE lb_owner (shard int PRIMARY KEY, epoch bigint NOT NULL, node text NOT NULL,
                       expires timestamptz NOT NULL);
CREATE TABLE lb_marker (shard int PRIMARY KEY, committed_lsn bigint NOT NULL);
CREATE TABLE lb_meta (shard int NOT NULL, k bytea NOT NULL, v bytea NOT NULL,
                      PRIMARY KEY (shard, k)) WITH (fillfactor = 70,
                      autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
CREATE TABLE lb_payload (shard int NOT NULL, k bytea NOT NULL, v bytea NOT NULL,
                         PRIMARY KEY (shard, k));
CREATE TABLE lb_small (shard int NOT NULL, k bytea NOT NULL, v bytea NOT NULL,
                       PRIMARY KEY (shard, k)) WITH (fillfactor = 50);
";

/// The table a key lives in, by its tag.
fn table(key: &[u8]) -> &'static str {
    match key.first() {
        Some(&TAG_META) => "lb_meta",
        Some(&TAG_PAYLOAD) => "lb_payload",
        _ => "lb_small",
    }
}

const TABLES: [&str; 3] = ["lb_meta", "lb_payload", "lb_small"];

impl PgState {
    /// Connects (the first host of a multi-host URL that accepts, e.g.
    /// `postgres://a:5432,b:5432/letterbox?target_session_attrs=read-write`
    /// for the primary of a cluster), creates or checks the schema, and
    /// makes sure the shard's marker exists.
    pub async fn connect(url: &str, shard: i32) -> Result<PgState> {
        let target = describe(url);
        let (client, connection) =
            tokio_postgres::connect(url, NoTls)
                .await
                .map_err(|e| PgError::Connect {
                    target: target.clone(),
                    detail: db_text(&e),
                })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "PostgreSQL connection ended");
            }
        });
        let state = PgState {
            client,
            shard,
            target,
        };
        state.migrate().await?;
        state
            .client
            .execute(
                "INSERT INTO lb_marker (shard, committed_lsn) VALUES ($1, 0)
                 ON CONFLICT (shard) DO NOTHING",
                &[&shard],
            )
            .await?;
        Ok(state)
    }

    /// The hosts and database this state is kept in.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Creates the schema, or checks that the one there is not newer.
    /// Concurrent servers serialise on an advisory lock.
    async fn migrate(&self) -> Result<()> {
        // A constant key of our own for the advisory lock ("lbox").
        const LOCK: i64 = 0x6c62_6f78;
        self.client
            .execute("SELECT pg_advisory_lock($1)", &[&LOCK])
            .await?;
        let result = self.migrate_locked().await;
        let unlocked = self
            .client
            .execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
            .await;
        result?;
        unlocked?;
        Ok(())
    }

    async fn migrate_locked(&self) -> Result<()> {
        self.client
            .batch_execute("CREATE TABLE IF NOT EXISTS lb_schema (version int NOT NULL)")
            .await?;
        let found: Option<i32> = self
            .client
            .query_opt("SELECT max(version) FROM lb_schema", &[])
            .await?
            .and_then(|row| row.get(0));
        let found = found.unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(PgError::NewerSchema {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if found < 1 {
            let sql = format!("BEGIN; {MIGRATION_1} INSERT INTO lb_schema VALUES (1); COMMIT;");
            self.client.batch_execute(&sql).await?;
        }
        Ok(())
    }

    /// Takes the shard's lease for `ttl` if it is free, lapsed by the
    /// database's clock, or held under this node's name (a restart); the
    /// epoch goes up by one. `Err(holder)` when another node holds it.
    pub async fn acquire(
        &self,
        node: &str,
        ttl: Duration,
    ) -> Result<std::result::Result<Fence, Holder>> {
        let started = Instant::now();
        let ms = millis(ttl);
        let row = self
            .client
            .query_opt(
                "INSERT INTO lb_owner AS o (shard, epoch, node, expires)
                 VALUES ($1, 1, $2, now() + $3 * interval '1 millisecond')
                 ON CONFLICT (shard) DO UPDATE
                   SET epoch = o.epoch + 1, node = excluded.node, expires = excluded.expires
                   WHERE o.expires < now() OR o.node = excluded.node
                 RETURNING epoch",
                &[&self.shard, &node, &ms],
            )
            .await?;
        if let Some(row) = row {
            return Ok(Ok(Fence {
                epoch: row.get(0),
                valid_until: started + ttl,
            }));
        }
        let row = self
            .client
            .query_one(
                "SELECT node, epoch,
                        greatest(0, extract(epoch FROM expires - now()) * 1000)::bigint
                 FROM lb_owner WHERE shard = $1",
                &[&self.shard],
            )
            .await?;
        let remaining: i64 = row.get(2);
        Ok(Err(Holder {
            node: row.get(0),
            epoch: row.get(1),
            remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
        }))
    }

    /// Extends this node's lease by `ttl` from now (database clock).
    /// [`PgError::Fenced`] if another node took the shard.
    pub async fn renew(&self, fence: &Fence, ttl: Duration) -> Result<Fence> {
        let started = Instant::now();
        let n = self
            .client
            .execute(
                "UPDATE lb_owner SET expires = now() + $3 * interval '1 millisecond'
                 WHERE shard = $1 AND epoch = $2",
                &[&self.shard, &fence.epoch, &millis(ttl)],
            )
            .await?;
        if n == 0 {
            return Err(self.fenced(fence.epoch).await);
        }
        Ok(Fence {
            epoch: fence.epoch,
            valid_until: started + ttl,
        })
    }

    /// Gives the lease up at once, so a standby need not wait for it to
    /// lapse. Does nothing if another node already holds it.
    pub async fn release(&self, fence: &Fence) -> Result<()> {
        self.client
            .execute(
                "UPDATE lb_owner SET expires = now() - interval '1 millisecond'
                 WHERE shard = $1 AND epoch = $2",
                &[&self.shard, &fence.epoch],
            )
            .await?;
        Ok(())
    }

    async fn fenced(&self, mine: i64) -> PgError {
        let current = match self
            .client
            .query_opt(
                "SELECT epoch FROM lb_owner WHERE shard = $1",
                &[&self.shard],
            )
            .await
        {
            Ok(Some(row)) => row.get(0),
            Ok(None) => 0,
            Err(e) => return e.into(),
        };
        PgError::Fenced {
            shard: self.shard,
            mine,
            current,
        }
    }

    /// Applies `batch` (puts with a value, deletes without; in order, the
    /// last change of a key winning) atomically and durably if `fence` is
    /// still the shard's, and records `lsn` as the shard's commit marker.
    pub async fn commit(
        &mut self,
        fence: &Fence,
        batch: &[(Bytes, Option<Bytes>)],
        lsn: u64,
    ) -> Result<()> {
        let marker = i64::try_from(lsn).map_err(|_| PgError::Db(format!("lsn {lsn} too large")))?;
        // The last change of each key, by table.
        let mut last: BTreeMap<&[u8], Option<&Bytes>> = BTreeMap::new();
        for (k, v) in batch {
            last.insert(k.as_ref(), v.as_ref());
        }
        let shard = self.shard;
        let txn = self.client.transaction().await?;
        let epoch: Option<i64> = txn
            .query_opt(
                "SELECT epoch FROM lb_owner WHERE shard = $1 FOR SHARE",
                &[&shard],
            )
            .await?
            .map(|row| row.get(0));
        if epoch != Some(fence.epoch) {
            drop(txn);
            return Err(PgError::Fenced {
                shard,
                mine: fence.epoch,
                current: epoch.unwrap_or(0),
            });
        }
        for t in TABLES {
            let mut deletes: Vec<&[u8]> = Vec::new();
            let mut keys: Vec<&[u8]> = Vec::new();
            let mut values: Vec<&[u8]> = Vec::new();
            for (k, v) in last.iter().filter(|(k, _)| table(k) == t) {
                match v {
                    Some(v) => {
                        keys.push(k);
                        values.push(v.as_ref());
                    }
                    None => deletes.push(k),
                }
            }
            if !deletes.is_empty() {
                txn.execute(
                    &format!("DELETE FROM {t} WHERE shard = $1 AND k = ANY($2)"),
                    &[&shard, &deletes],
                )
                .await?;
            }
            if !keys.is_empty() {
                txn.execute(
                    &format!(
                        "INSERT INTO {t} (shard, k, v) SELECT $1, * FROM unnest($2::bytea[], $3::bytea[])
                         ON CONFLICT (shard, k) DO UPDATE SET v = excluded.v"
                    ),
                    &[&shard, &keys, &values],
                )
                .await?;
            }
        }
        txn.execute(
            "UPDATE lb_marker SET committed_lsn = $2 WHERE shard = $1",
            &[&shard, &marker],
        )
        .await?;
        txn.commit().await.map_err(|e| PgError::Unknown {
            lsn,
            detail: db_text(&e),
        })
    }

    /// Settles a commit whose outcome was unknown: waits until no
    /// transaction holds the owner row (an in-flight commit of the old
    /// connection finishes or is rolled back first), then reads the commit
    /// marker. Call it on a fresh connection, before committing anything
    /// newer.
    pub async fn resolve(&mut self, lsn: u64) -> Result<Outcome> {
        let shard = self.shard;
        let txn = self.client.transaction().await?;
        txn.execute(
            "SELECT 1 FROM lb_owner WHERE shard = $1 FOR UPDATE",
            &[&shard],
        )
        .await?;
        let committed: i64 = txn
            .query_opt(
                "SELECT committed_lsn FROM lb_marker WHERE shard = $1",
                &[&shard],
            )
            .await?
            .map_or(0, |row| row.get(0));
        txn.commit().await?;
        Ok(if u64::try_from(committed).unwrap_or(0) >= lsn {
            Outcome::Committed
        } else {
            Outcome::NotCommitted
        })
    }

    /// The shard's commit marker: the lsn of the last committed batch.
    pub async fn committed_lsn(&self) -> Result<u64> {
        let v: i64 = self
            .client
            .query_opt(
                "SELECT committed_lsn FROM lb_marker WHERE shard = $1",
                &[&self.shard],
            )
            .await?
            .map_or(0, |row| row.get(0));
        Ok(u64::try_from(v).unwrap_or(0))
    }

    /// One key's value.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let row = self
            .client
            .query_opt(
                &format!("SELECT v FROM {} WHERE shard = $1 AND k = $2", table(key)),
                &[&self.shard, &key],
            )
            .await?;
        Ok(row.map(|r| Bytes::from(r.get::<_, Vec<u8>>(0))))
    }

    /// Up to `limit` keys starting with `prefix`, in order, after `after`
    /// (exclusive) when given: one page of a scan.
    pub async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let from: &[u8] = after.unwrap_or(prefix);
        let op = if after.is_some() { ">" } else { ">=" };
        // Every key with the prefix sorts below the prefix's successor; a
        // prefix of 0xff bytes only has no successor.
        let sql_end;
        let rows = match prefix_end(prefix) {
            Some(end) => {
                sql_end = end;
                self.client
                    .query(
                        &format!(
                            "SELECT k, v FROM {} WHERE shard = $1 AND k {op} $2 AND k < $3
                             ORDER BY k LIMIT $4",
                            table(prefix)
                        ),
                        &[&self.shard, &from, &sql_end, &limit],
                    )
                    .await?
            }
            None => {
                self.client
                    .query(
                        &format!(
                            "SELECT k, v FROM {} WHERE shard = $1 AND k {op} $2
                             ORDER BY k LIMIT $3",
                            table(prefix)
                        ),
                        &[&self.shard, &from, &limit],
                    )
                    .await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    Bytes::from(r.get::<_, Vec<u8>>(0)),
                    Bytes::from(r.get::<_, Vec<u8>>(1)),
                )
            })
            .filter(|(k, _)| k.starts_with(prefix))
            .collect())
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
#[path = "pg_tests.rs"]
mod tests;
