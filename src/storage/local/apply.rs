//! Applying: the applier thread puts durable memtable generations into the
//! database and checkpoints (the database made durable, log segments
//! retired, pinned segments compacted).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::log::Placed;
use super::memtable::{Memtable, Slot, overtaken};
use super::{Inner, Key, Result, StorageError, SysKey, Txn, fsutil, lock, payloads, rewrite, wal};
use crate::faults::{self, Fault};

/// The applier thread: freezes the memtable, waits for its records to be
/// durable, applies it to sled in one batch, and checkpoints now and then.
pub(super) fn applier(inner: &Inner) {
    let mut last_checkpoint = Instant::now();
    let mut log_bytes_at_checkpoint = 0u64;
    let mut last_space_check = Instant::now();
    loop {
        let closing = {
            let st = lock(&inner.state);
            let st = inner
                .apply_cv
                .wait_timeout_while(st, inner.opts.apply_interval, |s| {
                    s.closed.is_none()
                        && s.active_bytes <= inner.opts.apply_bytes
                        && !inner.room_wanted()
                });
            st.closed.is_some()
        };
        if inner.failed() {
            return;
        }
        if closing && inner.abandon.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = apply_once(inner) {
            inner.fail(e);
            return;
        }
        if closing && inner.abandon.load(Ordering::Relaxed) {
            return;
        }
        if closing {
            // The log writer drains before it exits; apply what it wrote.
            let next = lock(&inner.state).next_lsn;
            if !inner.wait_durable(next - 1) {
                return;
            }
            if let Err(e) = apply_once(inner).and_then(|()| checkpoint(inner)) {
                inner.fail(e);
            }
            return;
        }
        if last_space_check.elapsed() >= Duration::from_millis(500) {
            inner.refresh_space();
            last_space_check = Instant::now();
        }
        let log_bytes = inner.counters.log_bytes.load(Ordering::Relaxed);
        if last_checkpoint.elapsed() >= inner.opts.checkpoint_interval
            || log_bytes - log_bytes_at_checkpoint >= inner.opts.checkpoint_bytes
        {
            if let Err(e) = checkpoint(inner) {
                inner.fail(e);
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
pub(super) fn apply_once(inner: &Inner) -> Result<()> {
    let Some((frozen, upto)) = freeze(inner) else {
        return Ok(());
    };
    let started = Instant::now();
    if !inner.wait_durable(upto) {
        return Err(StorageError::Stopped {
            reason: "log writer failed".into(),
        });
    }
    #[cfg(test)]
    if let Some(hook) = lock(&inner.after_freeze).as_mut() {
        hook();
    }
    // In key order: sled inserts neighbouring keys far cheaper than
    // scattered ones (fewer node splits and copies).
    let mut ordered: Vec<(&Bytes, &Slot)> = frozen.iter().collect();
    ordered.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let placed = take_places(inner, upto);
    let written = write_generation(inner, &ordered, &placed, upto)?;
    finish_generation(inner, written, upto, started);
    Ok(())
}

/// Freezes the active memtable generation; returns it and the lsn of the
/// last transaction in it, or `None` when there is nothing to apply.
fn freeze(inner: &Inner) -> Option<(Arc<Memtable>, u64)> {
    let mut st = lock(&inner.state);
    if st.active.is_empty() {
        // Everything submitted since the last apply was created and
        // deleted in between: nothing to apply, and nothing held.
        let held = std::mem::take(&mut st.active_bytes);
        drop(st);
        if held > 0 {
            inner.unapplied.fetch_sub(held, Ordering::Relaxed);
            inner.room.notify_waiters();
        }
        return None;
    }
    let frozen = st.freeze();
    inner.generations.fetch_add(1, Ordering::Relaxed);
    Some((frozen, st.next_lsn - 1))
}

/// The log writer's payload places of the generation up to `upto`.
fn take_places(inner: &Inner, upto: u64) -> Placed {
    // Most of the map is this generation's: take it whole (the log
    // writer, which inserts into it after every write, is not held up
    // while it is sorted out) and put back the few places logged
    // since the freeze, unless the writer has placed that key again
    // meanwhile (later still).
    let mut mine = std::mem::take(&mut *lock(&inner.placed));
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
        let mut map = lock(&inner.placed);
        for (k, place) in newer {
            map.entry(k).or_insert(place);
        }
    }
    mine
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
    inner: &Inner,
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
    let db = inner.db();
    // Per chunk: the delete that overtook each entry, if any.
    let mut gone: Vec<Option<u64>> = Vec::new();
    for (i, &(k, slot)) in ordered.iter().enumerate() {
        if i % APPLY_CHUNK == 0 {
            if i > 0 {
                db.apply_batch(std::mem::take(&mut batch))
                    .map_err(|e| inner.db_error(e))?;
            }
            gone = overtaken(inner, &ordered[i..ordered.len().min(i + APPLY_CHUNK)]);
        }
        if let Some(lsn) = gone.get(i % APPLY_CHUNK).copied().flatten() {
            written.skipped += 1;
            if slot.fresh {
                written.unseen.push((k, lsn));
            }
            continue;
        }
        write_slot(inner, &db, (k, slot), placed, &mut batch, &mut written)?;
    }
    batch.insert(
        Key::Sys(SysKey::AppliedLsn).encode().as_ref(),
        &upto.to_be_bytes(),
    );
    db.apply_batch(batch).map_err(|e| inner.db_error(e))?;
    Ok(written)
}

/// Adds one memtable slot's change to `batch` (a payload put as its place
/// in the log), noting the payload pointers it adds and removes.
fn write_slot(
    inner: &Inner,
    db: &sled::Db,
    (k, slot): (&Bytes, &Slot),
    placed: &Placed,
    batch: &mut sled::Batch,
    written: &mut Written<'_>,
) -> Result<()> {
    let db_err = |e| inner.db_error(e);
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
fn finish_generation(inner: &Inner, written: Written<'_>, upto: u64, started: Instant) {
    {
        let mut live = lock(&inner.live);
        for seg in written.added {
            live.add(seg);
        }
        for seg in written.removed {
            live.remove(seg);
        }
    }
    {
        let mut st = lock(&inner.state);
        let bytes = st.unfreeze();
        inner.unapplied.fetch_sub(bytes, Ordering::Relaxed);
    }
    inner.applied.store(upto, Ordering::Relaxed);
    // A fresh key left out never reached the database, so the delete that
    // overtook it need not reach it either: it now deletes a key created
    // in its own generation (unless the key has changed again since).
    for part in written.unseen.chunks(APPLY_CHUNK) {
        lock(&inner.state).mark_fresh(part);
    }
    inner
        .counters
        .overtaken
        .fetch_add(written.skipped, Ordering::Relaxed);
    inner
        .metrics
        .apply_seconds
        .observe(started.elapsed().as_secs_f64());
    inner.room.notify_waiters();
}

/// Makes the database durable up to the applied lsn, then deletes log
/// segments that hold nothing newer.
pub(super) fn checkpoint(inner: &Inner) -> Result<()> {
    let applied = inner.applied.load(Ordering::Relaxed);
    inner.db().flush().map_err(|e| inner.db_error(e))?;
    fsutil::sync_tree(&inner.db_path())?;
    // Held while `CHECKPOINT` is rewritten: the log writer adds the
    // segments it moves into under the same lock (`note_segments`), so
    // neither undoes the other's line.
    let mut recorded = lock(&inner.recorded);
    // Where the log goes on: the last segment whose first record is at or
    // before the one after `applied` (the segments before it are retired
    // below), or the one the log began in at this start.
    let (log, written) = {
        let segments = lock(&inner.segments);
        let log = segments
            .iter()
            .rev()
            .find(|&&(_, first)| first <= applied + 1)
            .copied()
            .unwrap_or((inner.start_segment, applied + 1));
        // The segments with durable records from there on (the writer
        // notes a segment once its first record is durable).
        let written: Vec<(u64, Option<u64>)> = segments
            .iter()
            .filter(|&&(n, _)| n >= log.0)
            .map(|&(n, first)| (n, (!faults::on(Fault::NoSegmentNotes)).then_some(first)))
            .collect();
        (log, written)
    };
    let mut listed = Vec::with_capacity(written.len() + 1);
    if written.first().is_none_or(|&(n, _)| n != log.0) {
        // The segment the log goes on in holds no record yet.
        listed.push((log.0, None));
    }
    listed.extend(written);
    let wal_dir = inner.dir.join("wal");
    let next = fsutil::Checkpoint {
        applied,
        log: Some(log),
        sizes: segment_sizes(&wal_dir, listed)?,
    };
    fsutil::write_checkpoint(&inner.dir, &next)?;
    *recorded = next;
    drop(recorded);
    let mut retire = Vec::new();
    {
        let mut segments = lock(&inner.segments);
        let mut live = lock(&inner.live);
        // Segment i holds lsns below the first lsn of segment i+1: once
        // those are applied it goes, unless payloads still point into it.
        while segments.len() >= 2 && segments[1].1 <= applied + 1 {
            let (number, _) = segments.remove(0);
            if live.count(number) > 0 {
                live.pinned.insert(number);
            } else {
                retire.push(number);
            }
        }
        let emptied: Vec<u64> = live
            .pinned
            .iter()
            .copied()
            .filter(|s| live.count(*s) == 0)
            .collect();
        for seg in emptied {
            live.pinned.remove(&seg);
            retire.push(seg);
        }
        // A compaction whose relocations are applied is over (what is
        // still live there, if anything, is compacted again later).
        if let Some((seg, lsn)) = live.compacting
            && (lsn <= applied || !live.pinned.contains(&seg))
        {
            live.compacting = None;
        }
    }
    for seg in &retire {
        inner.files.close(*seg);
        inner.pool.retire(&wal::segment_path(&wal_dir, *seg))?;
    }
    if !retire.is_empty() {
        fsutil::sync_dir(&wal_dir)?;
    }
    inner.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
    rewrite::maybe_rewrite(inner)?;
    compact(inner)
}

/// Adds segments the log writer has just put its first durable records
/// in to `CHECKPOINT`'s list (the applied lsn and log position unchanged),
/// before any of those records is answered: a segment's place in the log
/// is then durable, so a start refuses the segment truncated, zeroed or
/// replaced however soon after the switch that happens.
pub(super) fn note_segments(inner: &Inner, entered: &[fsutil::LoggedSegment]) -> Result<()> {
    if entered.is_empty() {
        return Ok(());
    }
    let mut recorded = lock(&inner.recorded);
    let mut next = recorded.clone();
    for e in entered {
        match next.sizes.iter_mut().find(|s| s.number == e.number) {
            // Listed by the last checkpoint (or the start) without a
            // record in it yet.
            Some(listed) => *listed = *e,
            None => next.sizes.push(*e),
        }
    }
    if next == *recorded {
        return Ok(()); // a checkpoint has listed them already
    }
    fsutil::write_checkpoint(&inner.dir, &next)?;
    *recorded = next;
    Ok(())
}

/// The given log segments as `CHECKPOINT` lists them: (number, lsn of
/// the first record if one is durable there), with their sizes. Segments
/// only appear whole (renamed into place once full size) and only grow.
pub(super) fn segment_sizes(
    wal_dir: &Path,
    numbers: impl IntoIterator<Item = (u64, Option<u64>)>,
) -> Result<Vec<fsutil::LoggedSegment>> {
    let mut out = Vec::new();
    for (number, first) in numbers {
        let path = wal::segment_path(wal_dir, number);
        let m = std::fs::metadata(&path).map_err(|e| StorageError::io("stat", &path, e))?;
        out.push(fsutil::LoggedSegment {
            number,
            size: m.len(),
            first,
        });
    }
    Ok(out)
}

/// Segments kept for their payloads before compaction starts.
pub(super) const KEEP_PINNED: usize = 2;
/// Relocations per transaction.
pub(super) const RELOCATE_BATCH: usize = 256;

/// Moves the live payloads of the pinned segment most worth it to the
/// current segment, so that it can be retired. The relocations are
/// conditional puts: a payload deleted meanwhile stays deleted.
pub(super) fn compact(inner: &Inner) -> Result<()> {
    let Some(seg) = lock(&inner.live).to_compact(KEEP_PINNED) else {
        return Ok(());
    };
    let wal_dir = inner.dir.join("wal");
    let mut moved = 0u64;
    let mut txn = Txn::new();
    let mut last_lsn = 0u64;
    // Not waited for: the relocations are applied with everything else.
    let submit = |txn: Txn| -> u64 { inner.submit(txn, false).lsn() };
    for (key, value, loc) in payloads::payloads_in(&wal_dir, seg)? {
        let current = inner.db().get(&key).map_err(|e| inner.db_error(e))?;
        if current.and_then(|v| payloads::Loc::decode(&v)) != Some(loc) {
            continue; // deleted, or already somewhere else
        }
        txn.relocate(key, value);
        moved += 1;
        if txn.muts.len() >= RELOCATE_BATCH {
            last_lsn = submit(std::mem::take(&mut txn));
        }
    }
    if !txn.is_empty() {
        last_lsn = submit(txn);
    }
    inner.counters.relocated.fetch_add(moved, Ordering::Relaxed);
    lock(&inner.live).compacting = Some((seg, last_lsn));
    tracing::debug!(segment = seg, moved, "compacting a log segment");
    Ok(())
}
