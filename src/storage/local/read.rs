//! Reads of the local store: a key, several keys, a range, each as of
//! the latest submitted transaction (the memtable over the database, and
//! payloads through their places in the log). They take `STATE` (to look
//! in the memtable), `VOLATILE` under a negative control, and `FILES` (to
//! read a payload), one after the other, never two at once.

use bytes::Bytes;

use super::{Shared, payloads};
use crate::faults::{self, Fault};
use crate::storage::error::{Result, StorageError};

/// See [`Backend::get`](crate::storage::Backend::get): the memtable, then
/// the database.
pub(super) fn get(shared: &Shared, k: &[u8]) -> Result<Option<Bytes>> {
    if faults::on(Fault::NoDeliveryCount)
        && let Some(v) = shared.submission.volatile(k)
    {
        return Ok(Some(v));
    }
    let slot = shared.submission.lookup(k);
    match slot {
        Some((Some(v), placed)) => return mem_value(shared, v, placed).map(Some),
        Some((None, _)) => return Ok(None),
        None => {}
    }
    let v = shared.db.handle().get(k).map_err(|e| shared.db.error(e))?;
    match v {
        None => Ok(None),
        Some(iv) => db_value(shared, k, &iv).map(Some),
    }
}

/// A memtable value as read: the payload itself when the slot holds
/// its place in the log (`placed`).
fn mem_value(shared: &Shared, v: Bytes, placed: bool) -> Result<Bytes> {
    if !placed {
        return Ok(v);
    }
    let loc = payloads::Loc::decode(&v).ok_or_else(|| {
        StorageError::corrupt(
            shared.dir.display().to_string(),
            "a payload's place in the log does not decode",
        )
    })?;
    shared.payloads.read(loc)
}

/// A database value of key `k` as read: the payload itself when the
/// database holds its place in the log.
fn db_value(shared: &Shared, k: &[u8], iv: &[u8]) -> Result<Bytes> {
    match payloads::Loc::decode(iv).filter(|_| payloads::located(k)) {
        Some(loc) => shared.payloads.read(loc),
        None => Ok(Bytes::copy_from_slice(iv)),
    }
}

/// See [`Backend::scan`](crate::storage::Backend::scan): the memtable's
/// changes in the range merged
/// over the database's entries.
pub(super) fn scan(
    shared: &Shared,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Bytes, Bytes)>> {
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    // The memtable first, then the database (as `get` reads them): a
    // generation the applier puts into the database meanwhile is read
    // from the memtable's copy.
    let over = shared.submission.changes_in(start, end);
    let mut over = over.into_iter().peekable();
    let db = shared.db.handle();
    let items = match end {
        Some(end) => db.range::<&[u8], _>(start..end),
        None => db.range::<&[u8], _>(start..),
    };
    // Takes a memtable change: false once the page is full.
    let take = |out: &mut Vec<(Bytes, Bytes)>, k: Bytes, v: Option<Bytes>, placed: bool| {
        if let Some(v) = v {
            out.push((k, mem_value(shared, v, placed)?));
        }
        Ok::<bool, StorageError>(out.len() < limit)
    };
    for item in items {
        let (k, iv) = item.map_err(|e| shared.db.error(e))?;
        while let Some((mk, _)) = over.peek()
            && mk.as_ref() < k.as_ref()
        {
            if let Some((mk, (v, placed))) = over.next()
                && !take(&mut out, mk, v, placed)?
            {
                return Ok(out);
            }
        }
        if over.peek().is_some_and(|(mk, _)| mk.as_ref() == k.as_ref()) {
            if let Some((mk, (v, placed))) = over.next()
                && !take(&mut out, mk, v, placed)?
            {
                return Ok(out);
            }
            continue;
        }
        out.push((Bytes::copy_from_slice(&k), db_value(shared, &k, &iv)?));
        if out.len() >= limit {
            return Ok(out);
        }
    }
    for (mk, (v, placed)) in over {
        if !take(&mut out, mk, v, placed)? {
            break;
        }
    }
    Ok(out)
}
