//! The log: every segment's frames, then the replay a start would do.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;

use super::VerifyReport;
use crate::storage::error::{Result, StorageError};
use crate::storage::{SysKey, checkpoint, fsutil, wal};

/// Checks the database's format version and reads how far it applied the
/// log.
pub(super) fn database_lsn(db: &sled::Db, db_dir: &Path, r: &mut VerifyReport) -> Result<u64> {
    match crate::storage::read_sys(db, SysKey::FormatVersion, db_dir)? {
        Some(v) if v == u64::from(fsutil::FORMAT_VERSION) => {}
        Some(v) => r.problem(format!(
            "{}: database format {v}, this build reads {}",
            db_dir.display(),
            fsutil::FORMAT_VERSION
        )),
        None => r.problem(format!(
            "{}: the database has no format version: it is empty or lost its records",
            db_dir.display()
        )),
    }
    let applied = crate::storage::read_sys(db, SysKey::AppliedLsn, db_dir)?.unwrap_or(0);
    r.figure("applied lsn", applied);
    Ok(applied)
}

/// Reads every segment and counts its frames: the size of each segment,
/// by number.
pub(super) fn segment_sizes(wal_dir: &Path, r: &mut VerifyReport) -> Result<HashMap<u64, u64>> {
    let segments = if wal_dir.is_dir() {
        wal::list_segments(wal_dir)?
    } else {
        r.problem(format!(
            "{}: the log directory is missing",
            wal_dir.display()
        ));
        Vec::new()
    };
    let mut seg_sizes: HashMap<u64, u64> = HashMap::new();
    let mut frames = 0usize;
    for &n in &segments {
        let path = wal::segment_path(wal_dir, n);
        let data =
            Bytes::from(std::fs::read(&path).map_err(|e| StorageError::io("read", &path, e))?);
        seg_sizes.insert(n, data.len() as u64);
        frames += wal::frame_lsns(&data).len();
    }
    r.figure("log segments", segments.len());
    r.figure("log records in segments", frames);
    Ok(seg_sizes)
}

/// Checks the log's continuity from the last checkpoint, then replays it
/// into the copy as a start would.
pub(super) fn replay(
    dir: &Path,
    db: &sled::Db,
    db_dir: &Path,
    applied: u64,
    r: &mut VerifyReport,
) -> Result<()> {
    let wal_dir = dir.join("wal");
    let checkpoint = checkpoint::read(dir);
    if let Ok(cp) = &checkpoint
        && let Some(log) = cp.log
        && let Err(e) = wal::check_continuity(&wal_dir, cp.applied, log, &cp.sizes)
    {
        r.problem(format!("log: {e}"));
    }
    match crate::storage::replay_into(db, &wal_dir, applied, db_dir) {
        Ok((end, batch)) => {
            db.apply_batch(batch).map_err(|e| StorageError::Db {
                path: db_dir.to_path_buf(),
                source: e,
            })?;
            r.figure("log records newer than the database", end.replayed);
            r.figure("last lsn", end.last_lsn);
            match checkpoint.as_ref().map(|c| c.applied) {
                Ok(cp) if cp > end.last_lsn => r.problem(format!(
                    "{}: holds changes up to lsn {} (with the log), but a checkpoint made lsn {cp} durable: the database is damaged or truncated",
                    db_dir.display(),
                    end.last_lsn
                )),
                Ok(cp) => r.figure("last checkpoint lsn", cp),
                Err(e) => r.problem(e.to_string()),
            }
        }
        Err(e) => r.problem(format!("log: {e}")),
    }
    Ok(())
}
