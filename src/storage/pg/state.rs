//! PostgreSQL as the place where state becomes durable: the schema, the
//! ownership lease with its epoch fence, fenced batch commits with a
//! commit marker, and reads and prefix scans of the key space.
//!
//! This is the database side of running Letterbox on a replicated
//! PostgreSQL (a Patroni cluster or a managed one): the server stays the
//! only writer of its shard's keys and decides everything in memory, as
//! with the local log; what it commits here is the same transactions of
//! absolute puts and deletes over the key space of [`crate::storage::keys`].
//!
//! ## Safety
//!
//! * **Ownership** of a shard is a row of `lb_owner` (`epoch`, `node`,
//!   `expires`) judged by the database's clock: [`PgState::acquire`] takes
//!   a free or lapsed lease (or one held under the same node name) and
//!   raises the epoch, so every owner has a larger epoch than any before
//!   it. A lease is liveness only.
//! * **The fence** is safety: every commit locks the owner row
//!   `FOR SHARE` in its own transaction, as its first statement, and that
//!   statement fails unless the epoch is still the committer's, aborting
//!   the transaction. A takeover's `UPDATE` of that row waits for
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
//! ## Round trips
//!
//! The statements of commits and reads are prepared once per connection
//! (`Statements`); each finds its rows by the primary key, so that the
//! generic plan PostgreSQL settles on after a few executions (planned
//! before the tables grew) stays an index lookup. (The chunks of replaced
//! values are deleted by key alone: the earlier join with the table, the
//! one statement whose plan could turn into a scan of a whole table, left
//! publishing 2-3× slower at times; planning every execution instead
//! cost consuming half its rate.) A commit is one round trip: `BEGIN`,
//! the fence, every write, the marker and `COMMIT` as one pipeline (each
//! request leaves when its future is first polled, and the server
//! answers in order). The fence is a statement that fails when the epoch
//! is not ours (`FENCE`), not one whose answer is looked at before the
//! writes are sent: a failed fence aborts the transaction, the writes
//! behind it are refused, and the commit is reported fenced. Likewise a
//! write the server refuses aborts the transaction, whose `COMMIT` then
//! rolls back without an error of its own: the commit is reported failed
//! by that write's answer. A write
//! that could not be sent (a failure before the server saw it) stops the
//! pipeline before its `COMMIT` (`ROLLBACK` instead). A `COMMIT` that
//! failed is an unknown outcome, as above. A failure that says the
//! connection is gone (closed, reset, the server shutting down or
//! read-only) before `COMMIT` is [`PgError::Lost`]: nothing committed, and
//! a new connection may succeed.
//!
//! Keys live in three tables by their tag, each with its own vacuum
//! settings: message records (`lb_meta`, rewritten on every delivery),
//! bodies (`lb_payload`) and everything else (`lb_small`). `bytea`
//! compares as bytes, so a table's order is the key space's order.
//!
//! ## Chunks
//!
//! A value longer than the chunk size ([`DEFAULT_CHUNK_SIZE`], see
//! [`PgState::set_chunk_size`]) is kept in pieces: its row holds an empty
//! `v` and the number of pieces in `chunks`, and the pieces are rows
//! `(shard, k, n, v)` of `lb_chunk`, `n` from 0. A commit that writes or
//! deletes a key first deletes the key's chunks (there are some only if
//! the value it replaces was chunked), in the same transaction; reads put
//! the pieces back together in the same statement (one snapshot), so a
//! caller never sees chunks. Schema
//! version 2 added them (the `chunks` column, default 0, and `lb_chunk`);
//! a version 1 database is migrated when a server first connects.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::{BoxFuture, MaybeDone, maybe_done};
use tokio_postgres::{Client, NoTls, Statement};

use crate::storage::backend::prefix_end;
use crate::storage::keys::{TAG_META, TAG_PAYLOAD};

/// The schema version this server writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// Values longer than this many bytes are stored in chunks of this size
/// unless [`PgState::set_chunk_size`] says otherwise (below
/// FoundationDB's 100 kB value limit, so that the layout would carry
/// over to a backend with one).
pub const DEFAULT_CHUNK_SIZE: usize = 64 << 10;

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
    /// Another node holds the shard's lease (see [`PgState::acquire`]).
    #[error(
        "shard {shard} is owned by node {:?} (epoch {}) for another {} ms: \
         not taking it over while that lease runs",
        .holder.node, .holder.epoch, .holder.remaining.as_millis()
    )]
    Held {
        /// The shard.
        shard: i32,
        /// Who holds it.
        holder: Holder,
    },
    /// A statement failed; nothing of the transaction was committed.
    #[error("PostgreSQL: {0}")]
    Db(String),
    /// The connection was lost (closed, reset, or the server shutting down
    /// or refusing writes, as a primary does while a failover demotes it)
    /// before the statement's outcome could matter: nothing of the
    /// transaction was committed, and a new connection may succeed.
    #[error("PostgreSQL: connection lost: {0}")]
    Lost(String),
}

impl PgError {
    /// Whether a new connection may succeed where this failed: the
    /// database could not be reached, or the connection was lost.
    pub fn is_connection(&self) -> bool {
        matches!(self, PgError::Connect { .. } | PgError::Lost(_))
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> PgError {
        if connection_lost(&e) {
            PgError::Lost(db_text(&e))
        } else {
            PgError::Db(db_text(&e))
        }
    }
}

/// Whether `e` says the connection is gone rather than refusing a
/// statement: closed, an I/O error, or the server's word that it is
/// shutting down, cannot accept the session, or is read-only now (SQLSTATE
/// classes 08 and 57, and 25006: a demoted primary).
fn connection_lost(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            // 57014 is a statement cancelled (a timeout), not a loss.
            code.starts_with("08") || (code.starts_with("57") && code != "57014") || code == "25006"
        }
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
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
    chunk_size: usize,
    stmts: Statements,
}

/// The statements of commits and reads, prepared once per connection: a
/// statement given as text is prepared again on every call, one more
/// round trip each time, and a prepared one can be sent in a pipeline.
struct Statements {
    /// The fence ([`FENCE`]): fails unless the owner row's epoch is `$2`.
    fence: Statement,
    /// Records the batch's lsn in the shard's commit marker.
    marker: Statement,
    /// Deletes the chunks of some keys (`$2`).
    drop_chunks: Statement,
    /// Inserts the pieces of chunked values.
    insert_chunks: Statement,
    /// Per table of [`TABLES`], in that order.
    tables: Vec<TableStatements>,
    /// Reads keys of every table at once (`k = ANY($2)`).
    get_many: Statement,
    /// A range of the key space with its end (`$4`), and to the end.
    scan_to: Statement,
    scan_all: Statement,
}

/// The statements of one table.
struct TableStatements {
    /// Deletes some keys.
    delete: Statement,
    /// Inserts or replaces rows (keys, values, chunk counts).
    upsert: Statement,
    /// Reads one key.
    get: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> std::result::Result<Statements, tokio_postgres::Error> {
        let mut tables = Vec::with_capacity(TABLES.len());
        for t in TABLES {
            tables.push(TableStatements {
                delete: client
                    .prepare(&format!(
                        "DELETE FROM {t} WHERE shard = $1 AND k = ANY($2)"
                    ))
                    .await?,
                upsert: client
                    .prepare(&format!(
                        "INSERT INTO {t} (shard, k, v, chunks)
                         SELECT $1, * FROM unnest($2::bytea[], $3::bytea[], $4::int[])
                         ON CONFLICT (shard, k) DO UPDATE SET v = excluded.v, chunks = excluded.chunks"
                    ))
                    .await?,
                get: client
                    .prepare(&format!(
                        "SELECT k, v, chunks, {CHUNKS} FROM {t} t WHERE shard = $1 AND k = $2"
                    ))
                    .await?,
            });
        }
        let every = |part: &str| {
            TABLES
                .iter()
                .map(|t| part.replace("{t}", t))
                .collect::<Vec<_>>()
                .join(" UNION ALL ")
        };
        let get_many = format!(
            "SELECT k, v, chunks, {CHUNKS} FROM ({}) t",
            every("(SELECT k, v, chunks FROM {t} WHERE shard = $1 AND k = ANY($2))")
        );
        let scan = |bound: &str| {
            format!(
                "SELECT k, v, chunks, {CHUNKS} FROM ({}) t ORDER BY k LIMIT $3",
                every(&format!(
                    "(SELECT k, v, chunks FROM {{t}} WHERE shard = $1 AND k >= $2 {bound}
                      ORDER BY k LIMIT $3)"
                ))
            )
        };
        Ok(Statements {
            fence: client.prepare(FENCE).await?,
            marker: client
                .prepare("UPDATE lb_marker SET committed_lsn = $2 WHERE shard = $1")
                .await?,
            drop_chunks: client
                .prepare("DELETE FROM lb_chunk WHERE shard = $1 AND k = ANY($2)")
                .await?,
            insert_chunks: client
                .prepare(
                    "INSERT INTO lb_chunk (shard, k, n, v)
                     SELECT $1, * FROM unnest($2::bytea[], $3::int[], $4::bytea[])",
                )
                .await?,
            tables,
            get_many: client.prepare(&get_many).await?,
            scan_to: client.prepare(&scan("AND k < $4")).await?,
            scan_all: client.prepare(&scan("")).await?,
        })
    }
}

/// The fence of a commit: locks the shard's owner row `FOR SHARE` and
/// fails (division by zero, SQLSTATE 22012) unless its epoch is `$2`, a
/// missing row included. Being an error, not an answer to look at, it
/// can go in the same pipeline as the writes behind it: if it fails, the
/// transaction is aborted and nothing behind it is committed.
const FENCE: &str = "SELECT 1 / (SELECT count(*) FROM (SELECT epoch FROM lb_owner \
                     WHERE shard = $1 FOR SHARE) o WHERE o.epoch = $2)::int";

/// The SQLSTATE of a failed [`FENCE`]: division by zero.
const FENCE_FAILED: &str = "22012";

/// The fence's place in a commit's pipeline (after `BEGIN`).
const FENCE_REQUEST: usize = 1;

/// A request of a commit's pipeline: rows changed, or the error.
type Request<'a> = BoxFuture<'a, std::result::Result<u64, tokio_postgres::Error>>;

/// One table's share of a commit.
#[derive(Default)]
struct Part<'a> {
    deletes: Vec<&'a [u8]>,
    keys: Vec<&'a [u8]>,
    values: Vec<&'a [u8]>,
    counts: Vec<i32>,
}

impl std::fmt::Debug for PgState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgState")
            .field("shard", &self.shard)
            .field("target", &self.target)
            .field("chunk_size", &self.chunk_size)
            .finish()
    }
}

/// Checks that `url` parses as a PostgreSQL connection URL; the error
/// says why not (without the URL, which may hold a password).
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    url.parse::<tokio_postgres::Config>()
        .map(|_| ())
        .map_err(|e| e.to_string())
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

pub(super) const MIGRATION_1: &str = "
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

/// Chunked values (see the module doc). Adding a column with a constant
/// default rewrites no table.
const MIGRATION_2: &str = "
ALTER TABLE lb_meta ADD COLUMN chunks int NOT NULL DEFAULT 0;
ALTER TABLE lb_payload ADD COLUMN chunks int NOT NULL DEFAULT 0;
ALTER TABLE lb_small ADD COLUMN chunks int NOT NULL DEFAULT 0;
CREATE TABLE lb_chunk (shard int NOT NULL, k bytea NOT NULL, n int NOT NULL, v bytea NOT NULL,
                       PRIMARY KEY (shard, k, n));
";

/// Each migration and the version it leads to, in order.
const MIGRATIONS: [(i32, &str); 2] = [(1, MIGRATION_1), (2, MIGRATION_2)];

/// The table a key lives in, by its tag: its place in [`TABLES`].
fn table(key: &[u8]) -> usize {
    match key.first() {
        Some(&TAG_META) => 0,
        Some(&TAG_PAYLOAD) => 1,
        _ => 2,
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
        migrate(&client).await?;
        client
            .execute(
                "INSERT INTO lb_marker (shard, committed_lsn) VALUES ($1, 0)
                 ON CONFLICT (shard) DO NOTHING",
                &[&shard],
            )
            .await?;
        let stmts = Statements::prepare(&client).await?;
        Ok(PgState {
            client,
            shard,
            target,
            chunk_size: DEFAULT_CHUNK_SIZE,
            stmts,
        })
    }

    /// The hosts and database this state is kept in.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The shard.
    pub fn shard(&self) -> i32 {
        self.shard
    }

    /// Stores values longer than `bytes` (at least 1) in chunks of that
    /// size from now on. Reads do not depend on it.
    pub fn set_chunk_size(&mut self, bytes: usize) {
        self.chunk_size = bytes.max(1);
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
        let client = &self.client;
        let stmts = &self.stmts;
        // One round trip: BEGIN, the fence, every write, the marker and
        // the COMMIT, sent together. The fence goes first and fails unless
        // the epoch is still ours, which aborts the transaction: the
        // writes behind it are refused and the COMMIT rolls back.
        let chunk = self.chunk_size;
        let mut parts: Vec<(&TableStatements, Part<'_>)> = Vec::new();
        // Every key written or deleted: the chunks of the values they
        // replace go first.
        let touched: Vec<&[u8]> = last.keys().copied().collect();
        let mut chunk_keys: Vec<&[u8]> = Vec::new();
        let mut chunk_ns: Vec<i32> = Vec::new();
        let mut chunk_values: Vec<&[u8]> = Vec::new();
        for (t, ts) in stmts.tables.iter().enumerate() {
            let mut part = Part::default();
            for (k, v) in last.iter().filter(|(k, _)| table(k) == t) {
                match v {
                    Some(v) if v.len() > chunk => {
                        let pieces = v.chunks(chunk);
                        let n = i32::try_from(pieces.len())
                            .map_err(|_| PgError::Db(format!("a value of {} bytes", v.len())))?;
                        part.keys.push(k);
                        part.values.push(&[]);
                        part.counts.push(n);
                        for (i, piece) in (0..n).zip(pieces) {
                            chunk_keys.push(k);
                            chunk_ns.push(i);
                            chunk_values.push(piece);
                        }
                    }
                    Some(v) => {
                        part.keys.push(k);
                        part.values.push(v.as_ref());
                        part.counts.push(0);
                    }
                    None => part.deletes.push(k),
                }
            }
            parts.push((ts, part));
        }
        let touched = &touched;
        let epoch = fence.epoch;
        let mut requests: Vec<Request<'_>> = vec![
            Box::pin(async move { client.batch_execute("BEGIN").await.map(|()| 0) }),
            Box::pin(async move { client.execute(&stmts.fence, &[&shard, &epoch]).await }),
            Box::pin(async move { client.execute(&stmts.drop_chunks, &[&shard, touched]).await }),
        ];
        for (ts, part) in &parts {
            if !part.deletes.is_empty() {
                requests.push(Box::pin(async move {
                    client.execute(&ts.delete, &[&shard, &part.deletes]).await
                }));
            }
            if !part.keys.is_empty() {
                requests.push(Box::pin(async move {
                    client
                        .execute(
                            &ts.upsert,
                            &[&shard, &part.keys, &part.values, &part.counts],
                        )
                        .await
                }));
            }
        }
        let (chunk_keys, chunk_ns, chunk_values) = (&chunk_keys, &chunk_ns, &chunk_values);
        if !chunk_keys.is_empty() {
            requests.push(Box::pin(async move {
                client
                    .execute(
                        &stmts.insert_chunks,
                        &[&shard, chunk_keys, chunk_ns, chunk_values],
                    )
                    .await
            }));
        }
        requests.push(Box::pin(async move {
            client.execute(&stmts.marker, &[&shard, &marker]).await
        }));
        let mut writes: Vec<MaybeDone<Request<'_>>> =
            requests.into_iter().map(maybe_done).collect();
        // Each request leaves when its future is first polled: all of them
        // now, in order. One that failed without the server's word (its
        // encoding, or the connection already gone) was not sent, and the
        // COMMIT must not follow it.
        let unsent = std::future::poll_fn(|cx| {
            for f in &mut writes {
                let _ = Pin::new(f).poll(cx);
            }
            Poll::Ready(writes.iter().find_map(|f| match f {
                MaybeDone::Done(Err(e)) if e.as_db_error().is_none() => {
                    Some((db_text(e), connection_lost(e)))
                }
                _ => None,
            }))
        })
        .await;
        if let Some((detail, lost)) = unsent {
            let _ = client.batch_execute("ROLLBACK").await;
            let detail = format!("a write of the commit up to lsn {lsn} was not sent: {detail}");
            return Err(if lost {
                PgError::Lost(detail)
            } else {
                PgError::Db(detail)
            });
        }
        // The COMMIT behind them, then every answer, in order.
        let (_, committed) = futures_util::future::join(
            futures_util::future::join_all(writes.iter_mut()),
            client.batch_execute("COMMIT"),
        )
        .await;
        // A statement the server refused aborted the transaction: its
        // COMMIT then rolls back (without an error), and nothing of the
        // batch is committed. The fence's refusal comes first: the writes
        // behind it were refused for it. A request that failed otherwise
        // (the connection lost) leaves the COMMIT's own answer to decide.
        let mut refused = None;
        for (i, f) in writes.iter_mut().enumerate() {
            if let Some(Err(e)) = Pin::new(f).take_output()
                && let Some(db) = e.as_db_error()
            {
                refused = Some((i == FENCE_REQUEST && db.code().code() == FENCE_FAILED, e));
                break;
            }
        }
        drop(writes);
        match refused {
            Some((true, _)) => return Err(self.fenced(fence.epoch).await),
            Some((false, e)) => return Err(e.into()),
            None => {}
        }
        committed.map_err(|e| PgError::Unknown {
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

    /// The process id of this connection's session (tests: to cut it).
    #[cfg(test)]
    pub(crate) async fn session_pid(&self) -> Result<i32> {
        Ok(self
            .client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0))
    }

    /// One key's value.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let row = self
            .client
            .query_opt(&self.stmts.tables[table(key)].get, &[&self.shard, &key])
            .await?;
        row.map(|r| whole(&r).map(|(_, v)| v)).transpose()
    }

    /// The rows of those of `keys` that exist, with their whole values,
    /// read in one statement (in no particular order).
    pub async fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<(Bytes, Bytes)>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .client
            .query(&self.stmts.get_many, &[&self.shard, &keys])
            .await?;
        rows.iter().map(whole).collect()
    }

    /// Up to `limit` keys starting with `prefix`, in order, after `after`
    /// (exclusive) when given: one page of a scan.
    pub async fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        let start = match after {
            Some(after) if after >= prefix => {
                let mut s = after.to_vec();
                s.push(0);
                s
            }
            _ => prefix.to_vec(),
        };
        let end = prefix_end(prefix);
        let mut got = self.scan_range(&start, end.as_deref(), limit).await?;
        got.retain(|(k, _)| k.starts_with(prefix));
        Ok(got)
    }

    /// Up to `limit` entries with keys from `start` (inclusive) to `end`
    /// (exclusive; `None`: to the end of the key space), in key order,
    /// over every table, read in one statement.
    pub async fn scan_range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        if limit == 0 || end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match end {
            Some(end) => {
                self.client
                    .query(&self.stmts.scan_to, &[&self.shard, &start, &limit, &end])
                    .await?
            }
            None => {
                self.client
                    .query(&self.stmts.scan_all, &[&self.shard, &start, &limit])
                    .await?
            }
        };
        rows.iter().map(whole).collect()
    }
}

/// Creates the schema, or checks that the one there is not newer.
/// Concurrent servers serialise on an advisory lock.
async fn migrate(client: &Client) -> Result<()> {
    // A constant key of our own for the advisory lock ("lbox").
    const LOCK: i64 = 0x6c62_6f78;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&LOCK])
        .await?;
    let result = migrate_locked(client).await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
        .await;
    result?;
    unlocked?;
    Ok(())
}

async fn migrate_locked(client: &Client) -> Result<()> {
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS lb_schema (version int NOT NULL)")
        .await?;
    let found: Option<i32> = client
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
    for (version, migration) in MIGRATIONS {
        if found < version {
            let sql =
                format!("BEGIN; {migration} INSERT INTO lb_schema VALUES ({version}); COMMIT;");
            client.batch_execute(&sql).await?;
        }
    }
    Ok(())
}

/// The chunks of a row `t` of a chunked value, in order, in the same
/// statement as the row (one snapshot); NULL for a value kept inline.
const CHUNKS: &str = "CASE WHEN t.chunks > 0 THEN
    (SELECT array_agg(c.v ORDER BY c.n) FROM lb_chunk c WHERE c.shard = $1 AND c.k = t.k) END";

/// A row's key and whole value (`k, v, chunks, the chunks`): its value,
/// or its chunks put together.
fn whole(row: &tokio_postgres::Row) -> Result<(Bytes, Bytes)> {
    let k: Vec<u8> = row.get(0);
    let count: i32 = row.get(2);
    if count == 0 {
        return Ok((Bytes::from(k), Bytes::from(row.get::<_, Vec<u8>>(1))));
    }
    let pieces: Vec<Vec<u8>> = row.get::<_, Option<Vec<Vec<u8>>>>(3).unwrap_or_default();
    if usize::try_from(count).ok() != Some(pieces.len()) {
        return Err(PgError::Db(format!(
            "key {}: {count} chunks recorded, {} found",
            hex(&k),
            pieces.len()
        )));
    }
    Ok((Bytes::from(k), Bytes::from(pieces.concat())))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
