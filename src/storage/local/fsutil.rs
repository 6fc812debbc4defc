//! File-system helpers for durability: fsync of directories and of whole
//! trees, the data directory's lock and format file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::storage::error::{Result, StorageError};

/// The data format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

const FORMAT_FILE: &str = "FORMAT";
const FORMAT_TMP_FILE: &str = "FORMAT.tmp";
/// The checkpoint record (see `checkpoint`).
pub(crate) const CHECKPOINT_FILE: &str = "CHECKPOINT";
const LOCK_FILE: &str = "LOCK";
const FORMAT_HEADER: &str = "letterbox data directory";
const DATABASE_FILE: &str = "DATABASE";
const DATABASE_HEADER: &str = "letterbox database";
/// The database directory of a data directory whose database was never
/// rewritten (no `DATABASE` file).
const FIRST_DATABASE: &str = "db";

/// Makes a directory's entries (creations, renames, deletions) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("fsync directory", dir, e))
}

/// fsyncs every file and directory under `root`, `root` included. Used at
/// checkpoints to make the embedded database durable as a whole (sled's
/// own flush syncs its data file only, not its blob files nor the
/// directory after a snapshot's rename).
pub fn sync_tree(root: &Path) -> Result<()> {
    let entries =
        std::fs::read_dir(root).map_err(|e| StorageError::io("read directory", root, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io("read directory", root, e))?;
        let path = entry.path();
        let ty = entry
            .file_type()
            .map_err(|e| StorageError::io("stat", &path, e))?;
        if ty.is_dir() {
            sync_tree(&path)?;
        } else if ty.is_file() {
            match File::open(&path) {
                Ok(f) => f
                    .sync_all()
                    .map_err(|e| StorageError::io("fsync", &path, e))?,
                // A file removed meanwhile (sled deletes old snapshots) has
                // nothing left to make durable.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("open", &path, e)),
            }
        }
    }
    sync_dir(root)
}

/// Creates `dir` (mode 0700) and its parents if missing, and makes each
/// new directory's entry durable (an fsync of its parent): a directory
/// created but never synced into its parent can vanish in a power cut,
/// with everything written inside it.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StorageError::io("create directory", dir, e))?;
    for d in missing.iter().rev() {
        match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => sync_dir(p)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

/// The held lock of a data directory; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes the exclusive lock of the data directory, failing at once if
/// another process holds it.
pub fn lock_dir(dir: &Path) -> Result<DirLock> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| StorageError::io("open", &path, e))?;
    // A lock found held is tried again for a moment before the refusal:
    // a process that forks (a test run starting PostgreSQL, a supervisor)
    // gives its child a copy of every open file until the child's exec
    // closes it, and the lock lives as long as any copy does, so a store
    // just closed can look held by another process for that long. Another
    // server really holding it holds it longer than this.
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(DirLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Err(StorageError::Locked { path }),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StorageError::io("lock", &path, e));
            }
        }
    }
}

/// How long [`lock_dir`] tries again a lock found held before refusing.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// Checks the format file of an existing data directory, or writes it into
/// a new (empty) one. Refuses a non-empty directory without one. Returns
/// true when the directory was new.
pub fn check_or_init_format(dir: &Path) -> Result<bool> {
    let path = dir.join(FORMAT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_format(&path, &text).map(|()| false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let others = std::fs::read_dir(dir)
                .map_err(|e| StorageError::io("read directory", dir, e))?
                .filter_map(|e| e.ok())
                // The lock, and the format file's temporary copy that a
                // crash during the very first start can leave behind.
                .filter(|e| e.file_name() != LOCK_FILE && e.file_name() != FORMAT_TMP_FILE)
                .count();
            if others > 0 {
                return Err(StorageError::NotDataDir {
                    path: dir.to_path_buf(),
                    reason: format!("it is not empty and has no {FORMAT_FILE} file"),
                });
            }
            write_format(dir, &path).map(|()| true)
        }
        Err(e) => Err(StorageError::io("read", &path, e)),
    }
}

/// True when `dir` has a format file but its first start never finished:
/// no checkpoint was ever recorded, the database was never rewritten and
/// the log has no segment. A start writes its first checkpoint before it
/// opens the log or answers any call, so such a directory holds nothing
/// that was acknowledged: a crash or power cut during the very first start
/// left it, and it is initialized again rather than refused.
pub fn first_start_unfinished(dir: &Path, wal_dir: &Path) -> Result<bool> {
    if dir.join(CHECKPOINT_FILE).exists() || dir.join(DATABASE_FILE).exists() {
        return Ok(false);
    }
    match std::fs::metadata(wal_dir) {
        Ok(_) => Ok(super::wal::list_segments(wal_dir)?.is_empty()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(StorageError::io("read directory", wal_dir, e)),
    }
}

/// Checks the format file without writing anything (for `verify`).
pub fn check_format(dir: &Path) -> Result<()> {
    let path = dir.join(FORMAT_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| StorageError::io("read", &path, e))?;
    parse_format(&path, &text)
}

/// Takes the data directory's lock for reading it offline, without
/// creating anything; `Ok(None)` when there is no lock file.
pub fn lock_dir_shared(dir: &Path) -> Result<Option<DirLock>> {
    let path = dir.join(LOCK_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io("open", &path, e)),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(DirLock { _file: file })),
        Err(std::fs::TryLockError::WouldBlock) => Err(StorageError::Locked { path }),
        Err(std::fs::TryLockError::Error(e)) => Err(StorageError::io("lock", &path, e)),
    }
}

fn parse_format(path: &Path, text: &str) -> Result<()> {
    let mut lines = text.lines();
    if lines.next() != Some(FORMAT_HEADER) {
        return Err(StorageError::NotDataDir {
            path: path.to_path_buf(),
            reason: format!("first line is not {FORMAT_HEADER:?}"),
        });
    }
    let found = lines
        .next()
        .and_then(|l| l.strip_prefix("format "))
        .unwrap_or("")
        .trim()
        .to_string();
    if found.parse::<u32>().ok() == Some(FORMAT_VERSION) {
        Ok(())
    } else {
        Err(StorageError::FormatVersion {
            path: path.to_path_buf(),
            found,
            supported: FORMAT_VERSION,
        })
    }
}

fn write_format(dir: &Path, path: &PathBuf) -> Result<()> {
    let tmp = dir.join(FORMAT_TMP_FILE);
    let mut f = File::create(&tmp).map_err(|e| StorageError::io("create", &tmp, e))?;
    f.write_all(format!("{FORMAT_HEADER}\nformat {FORMAT_VERSION}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| StorageError::io("rename", path, e))?;
    sync_dir(dir)
}

/// Replaces the file `name` of `dir` with `text` atomically and durably:
/// written to `name.tmp`, fsynced, renamed over `name`, and the directory
/// fsynced. A crash leaves the old content or the new one.
pub(crate) fn replace_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| StorageError::io("create", &tmp, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| StorageError::io("rename", &path, e))?;
    sync_dir(dir)
}

/// The generation of a database directory's name: `db` is 0, `db-N` is N.
pub fn database_generation(name: &str) -> Option<u64> {
    if name == FIRST_DATABASE {
        return Some(0);
    }
    let n = name.strip_prefix("db-")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|n| *n > 0)
}

/// The name of the database directory of generation `generation`.
pub fn database_name(generation: u64) -> String {
    if generation == 0 {
        FIRST_DATABASE.into()
    } else {
        format!("db-{generation}")
    }
}

/// The directory of the current database: the one the `DATABASE` file
/// names (written when the database is rewritten, see
/// [`set_current_database`]), or `db` when there is no such file.
pub fn current_database(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(DATABASE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dir.join(FIRST_DATABASE)),
        Err(e) => return Err(StorageError::io("read", &path, e)),
    };
    let mut lines = text.lines();
    let name = (lines.next() == Some(DATABASE_HEADER))
        .then(|| lines.next())
        .flatten()
        .and_then(|l| l.strip_prefix("current "))
        .map(str::trim)
        .filter(|n| database_generation(n).is_some());
    match name {
        Some(n) => Ok(dir.join(n)),
        None => Err(StorageError::corrupt(
            path.display().to_string(),
            "malformed record of the current database (expected `current db-N`)",
        )),
    }
}

/// Makes `name` the current database, durably (write, fsync, rename,
/// fsync of the directory): until this returns the previous one stays
/// current, whatever happens.
pub fn set_current_database(dir: &Path, name: &str) -> Result<()> {
    replace_file(
        dir,
        DATABASE_FILE,
        &format!("{DATABASE_HEADER}\ncurrent {name}\n"),
    )
}

/// Database directories of `dir` other than `current`: what a rewrite
/// interrupted by a crash left (a new database never made current, or the
/// old one not yet deleted).
pub fn stale_databases(dir: &Path, current: &Path) -> Result<Vec<PathBuf>> {
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io("read directory", dir, e))? {
        let entry = entry.map_err(|e| StorageError::io("read directory", dir, e))?;
        let name = entry.file_name();
        let is_db = name.to_str().and_then(database_generation).is_some();
        if is_db && entry.path() != current && entry.path().is_dir() {
            stale.push(entry.path());
        }
    }
    Ok(stale)
}

/// Free bytes available to this process on the file system of `dir`.
pub fn free_bytes(dir: &Path) -> Result<u64> {
    let st = rustix::fs::statvfs(dir)
        .map_err(|e| StorageError::io("statvfs", dir, std::io::Error::from(e)))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_is_written_then_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        check_or_init_format(dir.path()).expect("init");
        check_or_init_format(dir.path()).expect("check");
        std::fs::write(
            dir.path().join(FORMAT_FILE),
            "letterbox data directory\nformat 99\n",
        )
        .expect("write");
        let err = check_or_init_format(dir.path()).expect_err("newer format");
        assert!(err.to_string().contains("format 99"), "{err}");
    }

    #[test]
    fn a_format_file_cut_short_before_its_rename_is_not_taken_for_foreign_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(LOCK_FILE), "").expect("lock");
        std::fs::write(dir.path().join(FORMAT_TMP_FILE), "letterbox da").expect("tmp");
        assert!(
            check_or_init_format(dir.path()).expect("init"),
            "a new directory"
        );
        check_format(dir.path()).expect("a whole format file");
        assert!(!dir.path().join(FORMAT_TMP_FILE).exists());
    }

    #[test]
    fn foreign_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("notes.txt"), "hello").expect("write");
        let err = check_or_init_format(dir.path()).expect_err("refused");
        assert!(err.to_string().contains("no FORMAT"), "{err}");
    }

    #[test]
    fn second_lock_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _held = lock_dir(dir.path()).expect("first lock");
        let err = lock_dir(dir.path()).expect_err("second lock");
        assert!(matches!(err, StorageError::Locked { .. }));
    }

    #[test]
    fn a_lock_released_within_the_patience_is_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A copy of the locked file held for a moment (as a forked child
        // holds one until its exec), then closed.
        let held = lock_dir(dir.path()).expect("first lock");
        let copy = held._file.try_clone().expect("dup");
        drop(held);
        let t = std::thread::spawn(move || {
            std::thread::sleep(LOCK_PATIENCE / 5);
            drop(copy);
        });
        let _lock = lock_dir(dir.path()).expect("taken once the copy is closed");
        t.join().expect("thread");
    }
}
