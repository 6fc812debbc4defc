//! The log writer ([`LogWriter`]): the log thread's group commits, the
//! commits callers alone make themselves, the durable lsn, and where each
//! payload went.
//!
//! Its locks: `LOG` (the writing end, held for a whole group commit by the
//! log thread or a caller committing alone), `PLACED` (the payloads'
//! places, for the applier) and `DURABLE` (the durable lsn, with the
//! condition variable its waiters wait on). Holding `LOG`, a group commit
//! calls the log's writer (`wal::Writer`: `SPARE` when it moves to a new
//! segment), [`Checkpoints::enter`](super::checkpoint::Checkpoints::enter)
//! (`SEGMENTS`, then `RECORDED`) and the submission side (`STATE`: what
//! callers do, bodies swapped for their places), and takes `PLACED` and
//! `DURABLE` itself.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::submit::Pending;
use super::{Shared, payloads, wal};
use crate::storage::backend::CommitError;
use crate::storage::rank::{Rank, RankedCondvar, RankedGuard, RankedMutex};

/// Where the log writer put each payload value: key → (lsn, place). One
/// insert per published message, by the log writer; hashed like the
/// memtable.
pub(super) type Placed = HashMap<Bytes, (u64, payloads::Loc), foldhash::fast::RandomState>;

/// The writing end of the log and what is kept from one group commit to
/// the next. Whoever holds it writes: the log writer thread, or a caller
/// committing its own transaction ([`LogWriter::commit_alone`]). Pending
/// transactions are taken from the submission side only while holding
/// it, so batches reach the log in lsn order.
struct LogState {
    writer: wal::Writer,
    frames: Vec<u8>,
    bounds: Vec<(usize, u64)>,
    /// Durable payloads of the active memtable generation still whole as
    /// far as the log writer knows, oldest first, and their bytes (an
    /// overestimate: some were deleted or written again since, which their
    /// turn finds out). Emptied when the applier freezes the memtable: a
    /// frozen generation keeps its bodies until it is applied.
    recent: VecDeque<(Bytes, u64, payloads::Loc)>,
    recent_bytes: usize,
    /// The memtable generation `recent` belongs to.
    generation: u64,
    /// A write failed (with this error): nothing more is written.
    stopped: Option<CommitError>,
}

/// The log, held (see [`LogWriter::try_hold`]).
pub(super) struct Held<'a>(RankedGuard<'a, LogState>);

/// The log writer (see the module doc).
pub(super) struct LogWriter {
    log: RankedMutex<LogState>,
    /// Where the log writer put each payload value.
    placed: RankedMutex<Placed>,
    /// The highest lsn durable in the log.
    durable: RankedMutex<u64>,
    durable_cv: RankedCondvar,
    /// Most bytes of durable payloads the memtable keeps whole.
    recent_payload_bytes: usize,
}

impl LogWriter {
    /// The log writer of a log written by `writer`, durable up to
    /// `durable`.
    pub(super) fn new(writer: wal::Writer, durable: u64, recent_payload_bytes: usize) -> LogWriter {
        LogWriter {
            log: RankedMutex::new(
                Rank::LOG,
                "log",
                LogState {
                    writer,
                    frames: Vec::with_capacity(1 << 20),
                    bounds: Vec::new(),
                    recent: VecDeque::new(),
                    recent_bytes: 0,
                    generation: 0,
                    stopped: None,
                },
            ),
            placed: RankedMutex::default_with(Rank::PLACED, "placed"),
            durable: RankedMutex::new(Rank::DURABLE, "durable", durable),
            durable_cv: RankedCondvar::new(),
            recent_payload_bytes,
        }
    }

    /// The log if it is free (a try: exempt from the lock order, as it
    /// does not wait).
    pub(super) fn try_hold(&self) -> Option<Held<'_>> {
        self.log.try_lock().map(Held)
    }

    /// Tests: the log, held.
    #[cfg(test)]
    pub(super) fn hold(&self) -> Held<'_> {
        Held(self.log.lock())
    }

    /// The highest lsn durable in the log.
    pub(super) fn durable_lsn(&self) -> u64 {
        *self.durable.lock()
    }

    /// Wakes the log writer if `lsn` is not durable yet and transactions
    /// are waiting for it, some of which may not have woken it.
    pub(super) fn announce(&self, shared: &Shared, lsn: u64) {
        if self.durable_lsn() >= lsn {
            return;
        }
        shared.submission.wake_log_writer_if_pending();
    }

    /// Waits until everything up to `lsn` is durable; false on failure.
    pub(super) fn wait_durable(&self, shared: &Shared, lsn: u64) -> bool {
        self.announce(shared, lsn);
        let mut d = self.durable.lock();
        while *d < lsn {
            if shared.failed() {
                return false;
            }
            d = self.durable_cv.wait_timeout(d, Duration::from_millis(100));
        }
        true
    }

    /// Tests: waits up to `limit` for `lsn` to be durable, without waking
    /// the log writer (unlike [`LogWriter::wait_durable`]).
    #[cfg(test)]
    pub(super) fn durable_within(&self, lsn: u64, limit: Duration) -> bool {
        let d = self.durable.lock();
        let d = self.durable_cv.wait_timeout_while(d, limit, |d| *d < lsn);
        *d >= lsn
    }

    /// Wakes whoever waits for durability (the store stopped).
    pub(super) fn wake_waiters(&self) {
        self.durable_cv.notify_all();
    }

    /// Commits transaction `lsn` on the caller's thread if it is alone
    /// (the last one waiting for the log, with at most one before it, all
    /// queued after a quiet commit: see `Submission::take_alone`), nothing
    /// is being written and the last group commit was quiet: a caller
    /// alone (one request at a time) then pays for the write and its
    /// `fdatasync` only, not also for waking the log writer thread and
    /// being woken by it. Otherwise callers are arriving together and the
    /// log writer's group commit takes it, as it would have: a commit of
    /// one on the side would take an `fdatasync` from the groups.
    ///
    /// Called by [`Commit::wait`](crate::storage::Commit::wait) once
    /// `Submission::alone` said yes, after a yield: the test is made again
    /// here, under the log.
    pub(super) fn commit_alone(&self, shared: &Shared, lsn: u64) {
        let Some(mut log) = self.try_hold() else {
            return;
        };
        let batch = shared.submission.take_alone(lsn);
        if !batch.is_empty() && self.commit_batch(shared, &mut log, batch) {
            shared
                .counters
                .caller_commits
                .fetch_add(1, Ordering::Relaxed);
        }
        drop(log);
        // The log writer may have found the log taken and gone back to
        // sleep with work pending.
        shared.submission.wake_log_writer_if_pending();
    }

    /// Writes one group of transactions to the log, makes it durable and
    /// answers each; false once the log has failed (every caller told).
    pub(super) fn commit_batch(
        &self,
        shared: &Shared,
        log: &mut Held<'_>,
        batch: Vec<Pending>,
    ) -> bool {
        let log = &mut *log.0;
        if let Some(why) = &log.stopped {
            refuse(batch, why);
            return false;
        }
        let located = log.frame_batch(&batch);
        let t = Instant::now();
        let written = log
            .writer
            .write(&log.frames, &log.bounds)
            .and_then(|wrote| {
                // A segment's place in the log is durable before any record
                // in it is answered (negative control: not at all).
                shared.checkpoints.enter(&wrote.entered)?;
                Ok(wrote.placed)
            });
        let placed = match written {
            Ok(placed) => placed,
            Err(e) => {
                let why = Arc::new(e);
                refuse(batch, &why);
                log.stopped = Some(Arc::clone(&why));
                shared.fail(why);
                return false;
            }
        };
        self.note_places(
            log,
            shared.submission.generation(),
            &batch,
            located,
            &placed,
        );
        let last = batch[batch.len() - 1].lsn;
        shared
            .submission
            .note_group(batch.len() == 1 || batch.iter().all(|p| p.unannounced));
        count_sync(shared, batch.len(), log.frames.len(), t.elapsed());
        *self.durable.lock() = last;
        self.durable_cv.notify_all();
        // The oldest durable bodies beyond the most recent ones leave the
        // memtable for their places (see `Slot`); they are freed below,
        // outside the lock.
        let places = log.oldest_beyond(self.recent_payload_bytes);
        let swapped = shared.submission.swap_for_places(&places);
        drop(places);
        for p in batch {
            shared
                .metrics
                .commit_seconds
                .observe(p.submitted.elapsed().as_secs_f64());
            let _ = p.done.send(Ok(()));
        }
        drop(swapped);
        if log.frames.capacity() > 64 << 20 {
            log.frames = Vec::with_capacity(1 << 20);
        }
        true
    }

    /// Notes where the batch's payloads went (`placed`: segment and file
    /// offset of each frame), in the map for the applier and in the list
    /// of recent payloads of the active memtable generation (`generation`).
    fn note_places(
        &self,
        log: &mut LogState,
        generation: u64,
        batch: &[Pending],
        located: Vec<(usize, usize, usize)>,
        placed: &[(u64, u64)],
    ) {
        if generation != log.generation {
            log.generation = generation;
            log.recent.clear();
            log.recent_bytes = 0;
        }
        if located.is_empty() {
            return;
        }
        let mut map = self.placed.lock();
        for (fi, mi, off) in located {
            let (p, (seg, frame_off)) = (&batch[fi], placed[fi]);
            let m = &p.muts[mi];
            let len = m.value.as_ref().map_or(0, Bytes::len);
            let loc = payloads::Loc {
                seg,
                off: frame_off + off as u64,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            };
            map.insert(m.key.clone(), (p.lsn, loc));
            log.recent.push_back((m.key.clone(), p.lsn, loc));
            log.recent_bytes += usize::try_from(loc.len).unwrap_or(usize::MAX);
        }
    }

    /// The payload places of the generation up to `upto` (the applier's).
    pub(super) fn take_places(&self, upto: u64) -> Placed {
        // Most of the map is this generation's: take it whole (the log
        // writer, which inserts into it after every write, is not held up
        // while it is sorted out) and put back the few places logged
        // since the freeze, unless the writer has placed that key again
        // meanwhile (later still).
        let mut mine = std::mem::take(&mut *self.placed.lock());
        let mut newer = Vec::new();
        mine.retain(|k, (lsn, loc)| {
            if *lsn <= upto {
                true
            } else {
                newer.push((k.clone(), (*lsn, *loc)));
                false
            }
        });
        if !newer.is_empty() {
            let mut map = self.placed.lock();
            for (k, place) in newer {
                map.entry(k).or_insert(place);
            }
        }
        mine
    }
}

/// The log writer thread: takes every pending transaction, writes them in
/// one go, fdatasyncs, and answers them.
pub(super) fn run(shared: &Shared) {
    let log = &shared.log;
    // Each batch is taken while holding the log: batches are written in
    // lsn order.
    while let Some((mut held, batch)) = shared.submission.log_batch(|| log.try_hold()) {
        if !log.commit_batch(shared, &mut held, batch) {
            return;
        }
    }
}

/// Answers every transaction of `batch` with an error.
pub(super) fn refuse(batch: Vec<Pending>, why: &CommitError) {
    for p in batch {
        let _ = p.done.send(Err(Arc::clone(why)));
    }
}

/// The figures of one group commit: its write and `fdatasync` took
/// `synced`.
fn count_sync(shared: &Shared, records: usize, bytes: usize, synced: Duration) {
    let counters = &shared.counters;
    counters.sync_micros.fetch_add(
        u64::try_from(synced.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    shared.metrics.sync_seconds.observe(synced.as_secs_f64());
    #[allow(clippy::cast_precision_loss)]
    shared.metrics.batch_records.observe(records as f64);
    counters.log_syncs.fetch_add(1, Ordering::Relaxed);
    counters
        .records
        .fetch_add(records as u64, Ordering::Relaxed);
    counters
        .log_bytes
        .fetch_add(bytes as u64, Ordering::Relaxed);
}

impl LogState {
    /// Frames the transactions of `batch` into `frames` (their ends and
    /// lsns in `bounds`); returns where each payload value is: (index in
    /// the batch, mutation index, value offset in its frame).
    fn frame_batch(&mut self, batch: &[Pending]) -> Vec<(usize, usize, usize)> {
        self.frames.clear();
        self.bounds.clear();
        let first = batch[0].lsn;
        let mut located = Vec::new();
        for (fi, p) in batch.iter().enumerate() {
            for (mi, off) in wal::frame(p.lsn, first, &p.muts, &mut self.frames, payloads::located)
            {
                located.push((fi, mi, off));
            }
            self.bounds.push((self.frames.len(), p.lsn));
        }
        located
    }

    /// Takes the oldest recent payloads off the list until what is left
    /// is at most `keep` bytes.
    fn oldest_beyond(&mut self, keep: usize) -> Vec<(Bytes, u64, payloads::Loc)> {
        let mut places = Vec::new();
        while self.recent_bytes > keep {
            let Some(place) = self.recent.pop_front() else {
                break;
            };
            self.recent_bytes = self
                .recent_bytes
                .saturating_sub(usize::try_from(place.2.len).unwrap_or(usize::MAX));
            places.push(place);
        }
        places
    }
}
