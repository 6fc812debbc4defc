//! Rewriting the database to give its space back.
//!
//! sled reuses the space of deleted records but never returns it to the
//! file system: after a deep queue drains, its files stay at their
//! high-water mark. When the files are much larger than what is live, the
//! applier (the only thread that writes the database) copies every record
//! into a new database directory and makes that one current:
//!
//! 1. `db-N+1/` is created (a leftover of that name from an interrupted
//!    rewrite is removed first), every key of the current database copied
//!    into it, and it is flushed and fsynced, directories included. The
//!    current database does not change meanwhile: nothing else writes it.
//!    Readers go on reading it, and new transactions wait in the memtable.
//! 2. The `DATABASE` file is replaced (write, fsync, rename, fsync of the
//!    data directory) to name `db-N+1`. This is the commit point: a crash
//!    before it leaves the old database current and the new one is removed
//!    at the next start; a crash after it, the reverse.
//! 3. Readers are switched to the new database and the old directory is
//!    removed.
//!
//! Both databases hold the same applied lsn, so the log and the checkpoint
//! are valid for either.

use std::sync::atomic::Ordering;

use super::db::open_db;
use super::{Shared, fsutil};
use crate::storage::error::{Result, StorageError};

/// Writes per sled batch while copying.
const COPY_CHUNK: usize = 4096;
/// Rough bytes of database per live message (its state, payload pointer
/// and index records, with sled's overhead), to tell live data from slack
/// without reading the database.
const BYTES_PER_MESSAGE: u64 = 1024;
/// The files must be this many times the estimate of live data, and this
/// many times their size after the last rewrite.
const SLACK_FACTOR: u64 = 4;
/// No rewrite with more messages than this live: the copy would hold the
/// applier (and the memtable's memory) too long.
const MAX_LIVE_MESSAGES: u64 = 200_000;

/// Rewrites the database if its files are mostly slack (see the module).
/// Returns whether it did.
pub(super) fn maybe_rewrite(shared: &Shared) -> Result<bool> {
    let min = shared.opts.rewrite_min_bytes;
    if min == 0 {
        return Ok(false);
    }
    let size = shared
        .db
        .handle()
        .size_on_disk()
        .map_err(|e| shared.db.error(e))?;
    let live = shared.payloads.live();
    let estimate = live * BYTES_PER_MESSAGE;
    let last = shared.db.rewritten_bytes();
    if size < min
        || size < SLACK_FACTOR * estimate
        || size < SLACK_FACTOR * last
        || live > MAX_LIVE_MESSAGES
    {
        return Ok(false);
    }
    rewrite(shared, size)?;
    Ok(true)
}

/// Copies the database into the next generation and makes it current.
pub(super) fn rewrite(shared: &Shared, size_before: u64) -> Result<()> {
    let started = std::time::Instant::now();
    let old_path = shared.db.path();
    let generation = old_path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(fsutil::database_generation)
        .ok_or_else(|| {
            StorageError::corrupt(
                old_path.display().to_string(),
                "not the name of a database directory",
            )
        })?;
    let name = fsutil::database_name(generation + 1);
    let new_path = shared.dir.join(&name);
    if new_path.exists() {
        std::fs::remove_dir_all(&new_path).map_err(|e| StorageError::io("remove", &new_path, e))?;
    }
    let new_err = StorageError::db(&new_path);
    let old = shared.db.handle();
    let new = open_db(&new_path, shared.opts.cache_bytes)?;
    let mut batch = sled::Batch::default();
    let mut in_batch = 0usize;
    let mut copied = 0u64;
    for item in old.iter() {
        let (k, v) = item.map_err(|e| shared.db.error(e))?;
        batch.insert(k, v);
        in_batch += 1;
        copied += 1;
        if in_batch == COPY_CHUNK {
            new.apply_batch(std::mem::take(&mut batch))
                .map_err(new_err)?;
            in_batch = 0;
        }
    }
    new.apply_batch(batch).map_err(new_err)?;
    new.flush().map_err(new_err)?;
    fsutil::sync_tree(&new_path)?;
    fsutil::sync_dir(&shared.dir)?;
    fsutil::set_current_database(&shared.dir, &name)?;
    let size_after = new.size_on_disk().map_err(new_err)?;
    shared.db.switch(new, new_path);
    // Readers that took the old handle before the switch may still read
    // it; the files stay readable until they drop it (sled flushes on the
    // last drop, and there is nothing left to flush).
    drop(old);
    std::fs::remove_dir_all(&old_path).map_err(|e| StorageError::io("remove", &old_path, e))?;
    fsutil::sync_dir(&shared.dir)?;
    shared.db.rewritten(size_after);
    shared.counters.rewrites.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        records = copied,
        bytes_before = size_before,
        bytes_after = size_after,
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        database = %name,
        "rewrote the database to give back its free space"
    );
    Ok(())
}
