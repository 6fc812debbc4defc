//! Preparing segments ahead of the writer: zero-filled and fsynced, or
//! reused from the pool.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::segment::{Pool, Segment, segment_path};
use crate::storage::error::{Result, StorageError};
use crate::storage::local::fsutil;
use crate::storage::rank::{Rank, RankedCondvar, RankedMutex};

/// Bytes of zeros a preallocation writes and flushes at a time. The log
/// writer's `fdatasync` calls wait behind whatever write-back is queued on
/// the same disk: a step of 4 MiB held them up 9-18 ms on the benchmark
/// machine; with 256 KiB steps most of those slow calls went
/// (docs/benchmarks/2026-11-30f/NOTES.md, "Preallocation in small steps").
const PREALLOC_STEP: usize = 256 << 10;

/// The zeros a preallocation writes: static, so that preparing a segment
/// takes no heap (a 256 KiB buffer alive for the seconds a segment takes
/// to prepare showed up in whatever heap figure was read meanwhile).
static ZEROS: [u8; PREALLOC_STEP] = [0; PREALLOC_STEP];

/// Creates segment `number` of `size` bytes filled with zeros and makes it
/// durable (file and directory).
pub fn preallocate(dir: &Path, number: u64, size: u64) -> Result<Segment> {
    let path = segment_path(dir, number);
    let tmp = dir.join(format!("{number:020}.tmp"));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| StorageError::io("create", &tmp, e))?;
    let mut left = size;
    while left > 0 {
        let n = usize::try_from(left).map_or(PREALLOC_STEP, |l| l.min(PREALLOC_STEP));
        if let Err(e) = file.write_all(&ZEROS[..n]) {
            let _ = std::fs::remove_file(&tmp);
            return Err(StorageError::io("preallocate", &tmp, e));
        }
        left -= n as u64;
        if let Err(e) = file.sync_data() {
            let _ = std::fs::remove_file(&tmp);
            return Err(StorageError::io("fsync", &tmp, e));
        }
    }
    if let Err(e) = file.sync_all() {
        let _ = std::fs::remove_file(&tmp);
        return Err(StorageError::io("fsync", &tmp, e));
    }
    std::fs::rename(&tmp, &path).map_err(|e| StorageError::io("rename", &path, e))?;
    fsutil::sync_dir(dir)?;
    Ok(Segment {
        number,
        file,
        path,
        size,
    })
}

/// Shared state between the writer and the preallocation thread.
struct Spare {
    ready: Option<Result<Segment>>,
    next_number: u64,
    stop: bool,
}

/// Keeps the next segment ready ahead of the writer.
pub struct Preallocator {
    shared: Arc<(RankedMutex<Spare>, RankedCondvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Preallocator {
    /// Starts the thread; the first segment it prepares is `first_number`.
    pub fn start(pool: Arc<Pool>, first_number: u64) -> Preallocator {
        let shared = Arc::new((
            RankedMutex::new(
                Rank::SPARE,
                "spare",
                Spare {
                    ready: None,
                    next_number: first_number,
                    stop: false,
                },
            ),
            RankedCondvar::new(),
        ));
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("letterbox-wal-prealloc".into())
            .spawn(move || preallocate_loop(&pool, &s))
            .ok();
        Preallocator { shared, thread }
    }

    /// Takes the prepared segment, waiting for it if needed.
    pub fn take(&self) -> Result<Segment> {
        let (lock, cv) = &*self.shared;
        let mut spare = lock.lock();
        loop {
            if let Some(seg) = spare.ready.take() {
                cv.notify_all();
                return seg;
            }
            if self.thread.is_none() {
                return Err(StorageError::Stopped {
                    reason: "no preallocation thread".into(),
                });
            }
            spare = cv.wait(spare);
        }
    }
}

impl Drop for Preallocator {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().stop = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn preallocate_loop(pool: &Pool, shared: &(RankedMutex<Spare>, RankedCondvar)) {
    let (lock, cv) = shared;
    loop {
        let number = {
            let mut spare = lock.lock();
            while spare.ready.is_some() && !spare.stop {
                spare = cv.wait(spare);
            }
            if spare.stop {
                return;
            }
            spare.next_number
        };
        let result = pool.segment(number);
        let mut spare = lock.lock();
        if spare.stop {
            return;
        }
        match &result {
            Ok(_) => spare.next_number += 1,
            Err(e) => tracing::warn!(error = %e, "cannot prepare the next log segment"),
        }
        let failed = result.is_err();
        spare.ready = Some(result);
        cv.notify_all();
        if failed {
            // Hand the error over (the writer fails if it needs a segment
            // now), then try again after a pause.
            drop(spare);
            std::thread::sleep(Duration::from_millis(200));
            let mut spare = lock.lock();
            if matches!(spare.ready, Some(Err(_))) {
                spare.ready = None;
            }
        }
    }
}
