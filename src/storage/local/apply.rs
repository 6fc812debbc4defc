//! The applier ([`Applier`]): its thread puts durable memtable
//! generations into the database, and checkpoints now and then (see
//! `checkpoint`).
//!
//! Its one lock, `HOOK` (tests), is taken with nothing else held. It
//! holds no lock while it calls the other parts: the submission side to
//! wait for work, freeze, and let a generation go (`STATE`), the log
//! writer for the durable lsn and the payloads' places (`DURABLE`,
//! `PLACED`), the payload counts (`LIVE`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::checkpoint::checkpoint;
use super::log::Placed;
use super::memtable::Slot;
use super::{Shared, payloads};
use crate::storage::error::{Result, StorageError};
use crate::storage::keys::{Key, SysKey};
#[cfg(test)]
use crate::storage::rank::{Rank, RankedMutex};

/// The applier's own state (see the module doc).
pub(super) struct Applier {
    /// The lsn up to which the database holds every change.
    applied: AtomicU64,
    /// Set to stop without a final apply and checkpoint (a simulated
    /// crash, for tests).
    abandon: AtomicBool,
    /// Tests: run once a frozen generation is durable, before it takes
    /// the payload places (see `LocalBackend::hold_applier`).
    #[cfg(test)]
    after_freeze: RankedMutex<Option<Box<dyn FnMut() + Send>>>,
}

impl Applier {
    /// The applier of a database that holds every change up to
    /// `applied`.
    pub(super) fn new(applied: u64) -> Applier {
        Applier {
            applied: AtomicU64::new(applied),
            abandon: AtomicBool::new(false),
            #[cfg(test)]
            after_freeze: RankedMutex::default_with(Rank::HOOK, "after_freeze"),
        }
    }

    /// The lsn up to which the database holds every change.
    pub(super) fn applied_lsn(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }

    /// Stops without a final apply and checkpoint (tests: a crash).
    #[cfg(test)]
    pub(super) fn abandon(&self) {
        self.abandon.store(true, Ordering::Relaxed);
    }

    fn abandoned(&self) -> bool {
        self.abandon.load(Ordering::Relaxed)
    }

    /// Tests: `hook` runs each time a frozen generation is durable, before
    /// its places are taken.
    #[cfg(test)]
    pub(super) fn set_hook(&self, hook: Box<dyn FnMut() + Send>) {
        *self.after_freeze.lock() = Some(hook);
    }
}

/// The applier thread: freezes the memtable, waits for its records to be
/// durable, applies it to sled in one batch, and checkpoints now and then.
pub(super) fn run(shared: &Shared) {
    let opts = &shared.opts;
    let mut last_checkpoint = Instant::now();
    let mut log_bytes_at_checkpoint = 0u64;
    let mut last_space_check = Instant::now();
    loop {
        let closing = shared.submission.wait_for_apply(opts.apply_interval);
        if shared.failed() {
            return;
        }
        if closing && shared.applier.abandoned() {
            return;
        }
        if let Err(e) = apply_once(shared) {
            shared.fail(e);
            return;
        }
        if closing && shared.applier.abandoned() {
            return;
        }
        if closing {
            // The log writer drains before it exits; apply what it wrote.
            let next = shared.submission.next_lsn();
            if !shared.log.wait_durable(shared, next - 1) {
                return;
            }
            if let Err(e) = apply_once(shared).and_then(|()| checkpoint(shared)) {
                shared.fail(e);
            }
            return;
        }
        if last_space_check.elapsed() >= Duration::from_millis(500) {
            shared.space.refresh(&shared.pool);
            last_space_check = Instant::now();
        }
        let log_bytes = shared.counters.log_bytes.load(Ordering::Relaxed);
        if last_checkpoint.elapsed() >= opts.checkpoint_interval
            || log_bytes - log_bytes_at_checkpoint >= opts.checkpoint_bytes
        {
            if let Err(e) = checkpoint(shared) {
                shared.fail(e);
                return;
            }
            last_checkpoint = Instant::now();
            log_bytes_at_checkpoint = log_bytes;
        }
    }
}

/// Most writes in one sled batch of the applier (see [`apply_once`]).
pub(super) const APPLY_CHUNK: usize = 256;

/// Applies the memtable's current content to sled once it is durable.
pub(super) fn apply_once(shared: &Shared) -> Result<()> {
    let Some((frozen, upto)) = shared.submission.freeze() else {
        return Ok(());
    };
    let started = Instant::now();
    if !shared.log.wait_durable(shared, upto) {
        return Err(StorageError::Stopped {
            reason: "log writer failed".into(),
        });
    }
    #[cfg(test)]
    if let Some(hook) = shared.applier.after_freeze.lock().as_mut() {
        hook();
    }
    // In key order: sled inserts neighbouring keys far cheaper than
    // scattered ones (fewer node splits and copies).
    let mut ordered: Vec<(&Bytes, &Slot)> = frozen.iter().collect();
    ordered.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let placed = shared.log.take_places(upto);
    let written = write_generation(shared, &ordered, &placed, upto)?;
    finish_generation(shared, written, upto, started);
    Ok(())
}

/// What writing a generation into the database did, to be accounted once
/// it is in.
#[derive(Default)]
struct Written<'a> {
    /// Segments that gained a payload pointer, one entry per pointer
    /// (pointer counts change only once the batch is applied).
    added: Vec<u64>,
    /// Segments that lost one.
    removed: Vec<u64>,
    /// Fresh keys left out of the database, with the lsn of the delete
    /// that overtook them (see `overtaken`).
    unseen: Vec<(&'a Bytes, u64)>,
    /// Writes left out for a later durable delete.
    skipped: u64,
}

/// Writes a frozen generation (`ordered`, in key order) into the database
/// with the applied lsn `upto`.
fn write_generation<'a>(
    shared: &Shared,
    ordered: &[(&'a Bytes, &'a Slot)],
    placed: &Placed,
    upto: u64,
) -> Result<Written<'a>> {
    // Applied in chunks: sled's `apply_batch` holds a lock that stops
    // every read of the database until the whole batch is in, and the
    // engine reads under its own lock, so one large batch (a burst of
    // publishes) would stall every call for its whole length. A crash
    // between chunks leaves the applied lsn behind the chunks applied;
    // replay applies their records again, which changes nothing (replay is
    // idempotent).
    let mut batch = sled::Batch::default();
    let mut written = Written::default();
    let db = shared.db.handle();
    // Per chunk: the delete that overtook each entry, if any.
    let mut gone: Vec<Option<u64>> = Vec::new();
    for (i, &(k, slot)) in ordered.iter().enumerate() {
        if i % APPLY_CHUNK == 0 {
            if i > 0 {
                db.apply_batch(std::mem::take(&mut batch))
                    .map_err(|e| shared.db.error(e))?;
            }
            let chunk = &ordered[i..ordered.len().min(i + APPLY_CHUNK)];
            gone = shared.submission.overtaken(chunk, shared.log.durable_lsn());
        }
        if let Some(lsn) = gone.get(i % APPLY_CHUNK).copied().flatten() {
            written.skipped += 1;
            if slot.fresh {
                written.unseen.push((k, lsn));
            }
            continue;
        }
        write_slot(shared, &db, (k, slot), placed, &mut batch, &mut written)?;
    }
    batch.insert(
        Key::Sys(SysKey::AppliedLsn).encode().as_ref(),
        &upto.to_be_bytes(),
    );
    db.apply_batch(batch).map_err(|e| shared.db.error(e))?;
    Ok(written)
}

/// Adds one memtable slot's change to `batch` (a payload put as its place
/// in the log), noting the payload pointers it adds and removes.
fn write_slot(
    shared: &Shared,
    db: &sled::Db,
    (k, slot): (&Bytes, &Slot),
    placed: &Placed,
    batch: &mut sled::Batch,
    written: &mut Written<'_>,
) -> Result<()> {
    let db_err = |e| shared.db.error(e);
    let payload = payloads::located(k);
    // The payload pointer the database holds now, if any.
    let old = |k: &Bytes| -> Result<Option<payloads::Loc>> {
        Ok(db
            .get(k)
            .map_err(db_err)?
            .and_then(|v| payloads::Loc::decode(&v)))
    };
    match &slot.value {
        Some(v) => {
            if slot.if_exists && !db.contains_key(k).map_err(db_err)? {
                return Ok(());
            }
            // Where the log writer put this value, if it is a payload:
            // from its map, or the slot itself once swapped for it.
            let here = placed
                .get(k)
                .filter(|(lsn, _)| *lsn == slot.lsn)
                .map(|(_, loc)| *loc)
                .or_else(|| slot.placed.then(|| payloads::Loc::decode(v)).flatten());
            match (payload, here) {
                (true, Some(loc)) => {
                    if !slot.fresh {
                        written.removed.extend(old(k)?.map(|l| l.seg));
                    }
                    batch.insert(k.as_ref(), &loc.encode()[..]);
                    written.added.push(loc.seg);
                }
                _ => {
                    if payload && !slot.fresh {
                        written.removed.extend(old(k)?.map(|l| l.seg));
                    }
                    batch.insert(k.as_ref(), v.as_ref());
                }
            }
        }
        // A fresh key deleted is never in the database.
        None if slot.fresh => {}
        // A payload's pointer goes out of the batch: the removal
        // hands back the pointer it removed (whose segment loses a
        // reference), where reading it first would walk the tree
        // twice for every message acked. Keys are distinct within a
        // generation, so this order is as good as the batch's.
        None if payload => {
            let gone = db.remove(k.as_ref()).map_err(db_err)?;
            written
                .removed
                .extend(gone.and_then(|v| payloads::Loc::decode(&v)).map(|l| l.seg));
        }
        None => {
            batch.remove(k.as_ref());
        }
    }
    Ok(())
}

/// Once a generation is in the database: pointer counts, the memtable
/// let go of it, the applied lsn, and publishers waiting for room told.
fn finish_generation(shared: &Shared, written: Written<'_>, upto: u64, started: Instant) {
    shared.payloads.count(written.added, written.removed);
    shared.submission.unfreeze();
    shared.applier.applied.store(upto, Ordering::Relaxed);
    // A fresh key left out never reached the database, so the delete that
    // overtook it need not reach it either: it now deletes a key created
    // in its own generation (unless the key has changed again since).
    for part in written.unseen.chunks(APPLY_CHUNK) {
        shared.submission.mark_fresh(part);
    }
    shared
        .counters
        .overtaken
        .fetch_add(written.skipped, Ordering::Relaxed);
    shared
        .metrics
        .apply_seconds
        .observe(started.elapsed().as_secs_f64());
    shared.submission.notify_room();
}
