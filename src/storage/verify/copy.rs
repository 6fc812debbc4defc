//! The scratch copy of the database a check replays the log into.

use std::path::{Path, PathBuf};

use super::{VerifyOptions, VerifyReport};
use crate::storage::error::{Result, StorageError};

/// A scratch copy, removed when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    /// A new directory's name under the scratch base of `opts`.
    pub(super) fn new(opts: &VerifyOptions) -> Scratch {
        let base = opts.scratch.clone().unwrap_or_else(std::env::temp_dir);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Scratch(base.join(format!("letterbox-verify-{}-{nanos}", std::process::id())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies `db_dir` into the scratch directory and opens the copy; `None`
/// (with the problem reported) when the copy does not open.
pub(super) fn open_copy(
    db_dir: &Path,
    scratch: &Scratch,
    r: &mut VerifyReport,
) -> Result<Option<sled::Db>> {
    let db_bytes = copy_tree(db_dir, &scratch.0)?;
    r.figure("database bytes", db_bytes);
    match crate::storage::open_db(&scratch.0, 64 << 20) {
        Ok(db) => Ok(Some(db)),
        Err(e) => {
            let why = match e {
                StorageError::Corrupt { reason, .. } => reason,
                StorageError::Db { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            r.problem(format!("{}: {why}", db_dir.display()));
            Ok(None)
        }
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<u64> {
    std::fs::create_dir_all(to).map_err(|e| StorageError::io("create directory", to, e))?;
    let mut bytes = 0;
    let entries =
        std::fs::read_dir(from).map_err(|e| StorageError::io("read directory", from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read directory", from, e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ty = entry
            .file_type()
            .map_err(|e| StorageError::io("stat", &src, e))?;
        if ty.is_dir() {
            bytes += copy_tree(&src, &dst)?;
        } else if ty.is_file() {
            bytes += std::fs::copy(&src, &dst).map_err(|e| StorageError::io("copy", &src, e))?;
        }
    }
    Ok(bytes)
}
