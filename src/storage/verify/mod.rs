//! Offline check of a data directory (`letterbox verify`): storage's
//! part.
//!
//! Nothing in the directory is modified: the check takes the directory's
//! lock (so no server runs on it meanwhile), copies the database to a
//! scratch directory, replays the log into the copy exactly as a start
//! would (which checks every log frame's CRC and the lsn sequence), and
//! then reads every record of the result:
//!
//! * every key and value decodes; system values are 8 bytes;
//! * every payload pointer points into an existing segment, within its
//!   size, at a record that decodes and whose body matches its CRC;
//! * every message has its queue and its payload, each payload belongs to
//!   exactly one message, the recorded body size is the payload's;
//! * reserved positions and queue numbers are beyond every one in use.
//!
//! `verify_store` returns what it found and the records it read; the
//! queue rules over those records (dead letter queues, leases, FIFO
//! groups, counters) are the engine's, checked after these by
//! `queue::verify`, which `letterbox verify` runs.
//!
//! Each step is a module: `copy` (the scratch copy), `log` (the log and
//! its replay), `scan` (every record) and `relations` (the relations
//! between them).

mod copy;
mod log;
mod relations;
mod scan;

pub(crate) use scan::Records;

use std::path::{Path, PathBuf};

use super::error::{Result, StorageError};
use super::fsutil;

/// Options of a check.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Where to copy the database (default: the system's temporary
    /// directory). It needs as much free space as `db/` takes.
    pub scratch: Option<PathBuf>,
}

/// What a check found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Damage and inconsistencies; empty when the directory is sound.
    pub problems: Vec<String>,
    /// Figures about the directory, in order.
    pub figures: Vec<(String, String)>,
    /// Notes that are not problems (states a start repairs).
    pub notes: Vec<String>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_sound(&self) -> bool {
        self.problems.is_empty()
    }

    /// Records a problem.
    pub(crate) fn problem(&mut self, p: impl Into<String>) {
        // Thousands of copies of one kind of damage say nothing more.
        if self.problems.len() < 1000 {
            self.problems.push(p.into());
        }
    }

    fn figure(&mut self, name: &str, value: impl ToString) {
        self.figures.push((name.to_string(), value.to_string()));
    }
}

/// Storage's checks of the data directory `dir`. `Err` when it cannot be
/// checked at all (not a data directory, an unknown format, in use by a
/// server, an I/O error); otherwise the report says what is wrong, if
/// anything, and the records read come with it (none when the directory
/// holds no database to read).
pub(crate) fn verify_store(
    dir: &Path,
    opts: &VerifyOptions,
) -> Result<(VerifyReport, Option<Records>)> {
    let mut r = VerifyReport::default();
    if !dir.is_dir() {
        return Err(StorageError::NotDataDir {
            path: dir.to_path_buf(),
            reason: "it is not a directory".into(),
        });
    }
    let _lock = fsutil::lock_dir_shared(dir)?;
    fsutil::check_format(dir)?;
    let db_dir = fsutil::current_database(dir)?;
    let wal_dir = dir.join("wal");
    if !has_database(dir, &db_dir, &wal_dir, &mut r)? {
        return Ok((r, None));
    }
    let scratch = copy::Scratch::new(opts);
    let Some(db) = copy::open_copy(&db_dir, &scratch, &mut r)? else {
        return Ok((r, None));
    };
    let applied = log::database_lsn(&db, &db_dir, &mut r)?;
    let seg_sizes = log::segment_sizes(&wal_dir, &mut r)?;
    log::replay(dir, &db, &db_dir, applied, &mut r)?;

    let recs = scan::read_all(&db, &db_dir, &wal_dir, &seg_sizes, &mut r)?;
    r.figure("queues", recs.queues.len());
    r.figure("messages", recs.metas.len());
    r.figure("payloads", recs.payload_sizes.len());
    r.figure("payloads kept in the log", recs.pointers);
    r.figure("payload bytes", recs.payload_bytes);

    relations::check(&mut r, &recs);
    Ok((r, Some(recs)))
}

/// Whether the directory holds a database to check: not when its first
/// start was cut short (a note) or its database is missing (a problem).
/// Notes the databases an interrupted rewrite left.
fn has_database(dir: &Path, db_dir: &Path, wal_dir: &Path, r: &mut VerifyReport) -> Result<bool> {
    if fsutil::first_start_unfinished(dir, wal_dir)? {
        r.notes.push(
            "the first start of this directory was cut short before it finished: it holds nothing acknowledged, and the next start initializes it again".into(),
        );
        return Ok(false);
    }
    if !db_dir.join("db").exists() {
        r.problem(format!(
            "{}: the database is missing (the directory has a FORMAT file, so it held data)",
            db_dir.display()
        ));
        return Ok(false);
    }
    let stale = fsutil::stale_databases(dir, db_dir)?;
    if !stale.is_empty() {
        r.figure(
            "databases left by an interrupted rewrite (removed at the next start)",
            stale.len(),
        );
    }
    Ok(true)
}
