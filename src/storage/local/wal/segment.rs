//! Segment files: their names, and the pool of retired ones kept for
//! reuse.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use super::prealloc::preallocate;
use crate::storage::error::{Result, StorageError};
use crate::storage::local::fsutil;
use crate::storage::rank::{Rank, RankedMutex};

/// The path of segment `number`.
pub fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:020}.wal"))
}

/// Segment numbers present in `dir`, ascending.
pub fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| StorageError::io("read directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read directory", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(num) = name
            .strip_suffix(".wal")
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push(num);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// A segment ready to be written.
pub struct Segment {
    /// Its number.
    pub number: u64,
    /// The open file.
    pub file: File,
    /// Its path.
    pub path: PathBuf,
    /// Its size.
    pub size: u64,
}

/// Most retired segments kept for reuse.
const MAX_SPARES: usize = 2;

/// Segments retired after a checkpoint and kept for reuse, so that the
/// log is written into blocks that are already allocated (an overwrite,
/// which `fdatasync` makes durable without a metadata commit) and new
/// segments rarely need zero-filling. A reused segment still holds old
/// records; their lsns are below every new one, so replay reads them as
/// the end of the segment's data.
pub struct Pool {
    dir: PathBuf,
    size: u64,
    spares: RankedMutex<Vec<PathBuf>>,
    next_spare: std::sync::atomic::AtomicU64,
}

impl Pool {
    /// A pool for `dir`, picking up spares left by an earlier run.
    pub fn open(dir: &Path, size: u64) -> Result<Pool> {
        let mut spares = Vec::new();
        let mut next = 0u64;
        let entries =
            std::fs::read_dir(dir).map_err(|e| StorageError::io("read directory", dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io("read directory", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(n) = name
                .strip_prefix("spare-")
                .and_then(|r| r.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                next = next.max(n + 1);
                spares.push(entry.path());
            } else if name.ends_with(".tmp") {
                // A zero-fill cut short by a crash.
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Pool {
            dir: dir.to_path_buf(),
            size,
            spares: RankedMutex::new(Rank::POOL, "pool", spares),
            next_spare: std::sync::atomic::AtomicU64::new(next),
        })
    }

    /// Retired segments ready to be reused (taking no new space).
    pub fn spare_count(&self) -> usize {
        self.spares.lock().len()
    }

    /// Retires a segment whose records are all applied: kept as a spare,
    /// or deleted when there are enough. The caller fsyncs the directory.
    pub fn retire(&self, path: &Path) -> Result<()> {
        let mut spares = self.spares.lock();
        if spares.len() >= MAX_SPARES {
            return std::fs::remove_file(path).map_err(|e| StorageError::io("remove", path, e));
        }
        let n = self
            .next_spare
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let spare = self.dir.join(format!("spare-{n:020}.seg"));
        std::fs::rename(path, &spare).map_err(|e| StorageError::io("rename", path, e))?;
        spares.push(spare);
        Ok(())
    }

    /// Segment `number`, from a spare if there is one (renamed, directory
    /// fsynced), else zero-filled.
    pub fn segment(&self, number: u64) -> Result<Segment> {
        let spare = self.spares.lock().pop();
        let Some(spare) = spare else {
            return preallocate(&self.dir, number, self.size);
        };
        let path = segment_path(&self.dir, number);
        std::fs::rename(&spare, &path).map_err(|e| StorageError::io("rename", &spare, e))?;
        fsutil::sync_dir(&self.dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| StorageError::io("open", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| StorageError::io("stat", &path, e))?
            .len();
        Ok(Segment {
            number,
            file,
            path,
            size,
        })
    }
}
