//! The writing end of the log.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::prealloc::Preallocator;
use super::segment::{Pool, Segment};
use crate::faults::{self, Fault};
use crate::storage::error::{Result, StorageError};
use crate::storage::local::LoggedSegment;

/// What [`Writer::write`] did.
#[derive(Debug)]
pub struct Wrote {
    /// Where each frame landed: (segment, offset).
    pub placed: Vec<(u64, u64)>,
    /// The segments this write put the first durable records in.
    pub entered: Vec<LoggedSegment>,
}

/// The segment being written.
pub struct Writer {
    current: Segment,
    offset: u64,
    /// Negative control ([`Fault::AckBeforeFsync`]): the last batch's
    /// fdatasync, left to the next one. Never set without that fault.
    unsynced: bool,
    prealloc: Preallocator,
}

impl Writer {
    /// Starts writing into a new segment numbered after `last_number`.
    pub fn start(pool: Arc<Pool>, last_number: u64) -> Result<Writer> {
        let current = pool.segment(last_number + 1)?;
        let prealloc = Preallocator::start(pool, last_number + 2);
        Ok(Writer {
            current,
            offset: 0,
            unsynced: false,
            prealloc,
        })
    }

    /// Writes framed records and makes them durable. `frames` holds whole
    /// frames back to back; `bounds` gives (end offset in `frames`, lsn) of
    /// each. Returns once everything is fdatasync'd: where each frame
    /// landed (segment, offset), and the segments this write was the first
    /// to put a durable record in. The caller records those in
    /// `CHECKPOINT` before it acknowledges any record (so that a segment
    /// the log moved into cannot be truncated, zeroed or replaced
    /// unnoticed). A record never spans segments, and a segment's records
    /// are durable before the next segment is written.
    pub fn write(&mut self, frames: &[u8], bounds: &[(usize, u64)]) -> Result<Wrote> {
        // Negative control: the batch before, answered long since, is
        // synced only now.
        if faults::on(Fault::AckBeforeFsync) && std::mem::take(&mut self.unsynced) {
            self.current
                .file
                .sync_data()
                .map_err(|e| StorageError::io("fdatasync", &self.current.path, e))?;
        }
        let mut start = 0usize;
        let mut i = 0usize;
        let mut placed = Vec::with_capacity(bounds.len());
        let mut entered = Vec::new();
        while i < bounds.len() {
            let room = self.current.size - self.offset;
            // Take as many whole frames as fit.
            let mut j = i;
            while j < bounds.len() && (bounds[j].0 - start) as u64 <= room {
                j += 1;
            }
            if j == i {
                // The next frame does not fit: move to a new segment (one
                // large enough for it).
                let need = (bounds[i].0 - start) as u64;
                self.switch(need)?;
                continue;
            }
            let end = bounds[j - 1].0;
            // Where each of these frames lands: (segment, file offset).
            let mut frame_start = start;
            for b in &bounds[i..j] {
                placed.push((
                    self.current.number,
                    self.offset + (frame_start - start) as u64,
                ));
                frame_start = b.0;
            }
            self.current
                .file
                .write_all_at(&frames[start..end], self.offset)
                .map_err(|e| StorageError::io("write", &self.current.path, e))?;
            // Negative control: the last fdatasync is left to the next
            // batch; this one is answered without it.
            if faults::on(Fault::AckBeforeFsync) && j == bounds.len() {
                self.unsynced = true;
            } else {
                self.current
                    .file
                    .sync_data()
                    .map_err(|e| StorageError::io("fdatasync", &self.current.path, e))?;
            }
            // Noted once durable: the caller has a checkpoint list the
            // segment with this first lsn, which a start then requires.
            if self.offset == 0 {
                entered.push(LoggedSegment {
                    number: self.current.number,
                    size: self.current.size,
                    first: Some(bounds[i].1),
                });
            }
            self.offset += (end - start) as u64;
            start = end;
            i = j;
        }
        Ok(Wrote { placed, entered })
    }

    fn switch(&mut self, need: u64) -> Result<()> {
        let mut next = self.prealloc.take()?;
        if need > next.size {
            // A record larger than a segment: grow this one to hold it.
            next.file
                .set_len(need)
                .and_then(|()| next.file.sync_all())
                .map_err(|e| StorageError::io("extend", &next.path, e))?;
            next.size = need;
        }
        self.current = next;
        self.offset = 0;
        Ok(())
    }

    /// Number of the segment being written.
    pub fn current_number(&self) -> u64 {
        self.current.number
    }
}
