//! The storage boundary: what the queue engine needs from the place its
//! state becomes durable, and nothing else.
//!
//! A [`Backend`] takes transactions of absolute puts and deletes over the
//! key space of [`super::keys`], applies each atomically and in submission
//! order, and says when each is durable (a [`Commit`]); it reads one key
//! and scans a key range, both as of the latest *submitted* transaction
//! (the engine reads what it has just decided, durable or not), and reads
//! several keys at once (in one round trip where a backend has them); it reports
//! a fail-stop error on its failure watch; and it closes.
//!
//! [`Store`](super::Store) is the engine's typed front over a backend.
//! The engine holds a `Store<AnyBackend>`: [`AnyBackend`](super::AnyBackend)
//! has one variant per kind of backend, chosen at start, and makes explicit
//! what only some backends can do (waiting for room ahead of an apply
//! queue, free-space floors, commit-path figures). Two backends exist:
//!
//! * [`LocalBackend`](super::LocalBackend): the write-ahead log in front of
//!   sled, with its memtable, in one data directory (the module doc of
//!   `local` has its durability contract). The server runs on it by
//!   default.
//! * [`PgBackend`](super::PgBackend): one shard of the key space in
//!   PostgreSQL ([`super::pg`]: fenced batch commits under an ownership
//!   lease, a commit marker), with an in-memory overlay of the changes not
//!   yet committed in front of it (`serve --store postgres://...`). It
//!   keeps the same contract (the tests run the same suite against both).
//!
//! The engine loads its state at start from a
//! [`LoadSource`](super::LoadSource): the local database read directly
//! ([`Reader`](super::Reader), overlapping the store's own scan), or any
//! backend read in key order in pages of [`Backend::scan`]
//! ([`Paged`](super::Paged)).
//!
//! ## Limits a backend may have
//!
//! The boundary is shaped so that a backend with per-transaction limits
//! (FoundationDB: 5 s and 10 MB per transaction, 100 kB per value) fits
//! it: values over the backend's own limit are chunked inside the backend
//! (the engine never sees chunks; the PostgreSQL backend does so above
//! its chunk size, 64 KiB by default); a backend groups whole transactions
//! into batches and may start a new batch where a byte bound is reached,
//! but never splits one transaction; and a scan returns at most `limit`
//! entries, so the caller pages through a large range in many short
//! reads. What it does not cover yet: a single transaction larger than a
//! backend's transaction limit (a 10 MB body) would have to be written
//! ahead of its transaction in pieces of its own.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use tokio::sync::{oneshot, watch};

use super::{Result, StorageError, Txn};

/// Durable state behind the engine (see the module doc).
pub trait Backend: Send + Sync + 'static {
    /// Takes one transaction: applied atomically, after every transaction
    /// submitted before it; readable at once by [`Backend::get`] and
    /// [`Backend::scan`]; durable when the returned [`Commit`] resolves
    /// (with an error once the backend has stopped).
    fn submit(&self, txn: Txn) -> Commit;

    /// A key's value as of the latest submitted transaction.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>>;

    /// The values of `keys`, in their order (`None` where a key has
    /// none), each as [`Backend::get`] reads it. A backend whose reads are
    /// round trips reads the keys it does not hold in memory together (the
    /// PostgreSQL backend: one query); by default, one [`Backend::get`]
    /// after another.
    fn get_many(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// Up to `limit` entries with keys from `start` (inclusive) to `end`
    /// (exclusive; `None`: to the end of the key space), in key order, as
    /// of the latest submitted transaction. Fewer than `limit` means the
    /// range holds no more: the next page starts just after the last key
    /// returned (see [`scan_all`]).
    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<(Bytes, Bytes)>>;

    /// Turns `Some(reason)` once the backend has stopped for good
    /// (fail-stop): every later transaction gets an error.
    fn failure(&self) -> watch::Receiver<Option<String>>;

    /// Stops taking transactions, makes every one submitted durable (or
    /// answers it with the error that stopped the backend), and lets its
    /// resources go. Returns the failure that stopped it, if any. Later
    /// calls do nothing more.
    fn close(&self) -> Result<()>;
}

/// Why a transaction did not become durable: the error that stopped the
/// backend (or the reason it was closed), shared by every transaction it
/// refused. A waiter gets it as [`StorageError::Stopped`].
pub type CommitError = Arc<StorageError>;

/// The end on which a backend answers a transaction: `Ok` once it is
/// durable.
pub(crate) type Answer = oneshot::Sender<std::result::Result<(), CommitError>>;

/// The end on which a [`Commit`] waits for its answer.
pub(crate) type Receiver = oneshot::Receiver<std::result::Result<(), CommitError>>;

/// A backend's part in the commits its callers wait for, for a backend
/// that lets a caller make its commit itself (the local one: a caller
/// alone writes its own group commit, see `local::log`). A commit the
/// backend has not started making durable (deferred) is started by
/// waiting for it, by [`Commit::start`] or by dropping it.
pub(crate) trait Committer: Send + Sync {
    /// Starts making everything up to `lsn` durable, if it is not yet
    /// (the local backend wakes its log writer).
    fn start(&self, lsn: u64);

    /// Whether the caller of a deferred commit of `lsn` should make it
    /// durable itself ([`Committer::commit_alone`], after a yield).
    fn alone(&self, lsn: u64) -> bool;

    /// Makes `lsn` durable on the caller's thread if it still may (the
    /// test of [`Committer::alone`] made again); otherwise leaves it to
    /// the backend.
    fn commit_alone(&self, lsn: u64);

    /// Blocks the calling thread until everything up to `lsn` is durable
    /// (started first); false if the backend failed.
    fn wait_durable(&self, lsn: u64) -> bool;
}

/// A submitted transaction; [`Commit::wait`] resolves when it is durable.
///
/// Backend-neutral: a backend answers it on a channel, with a
/// [`CommitError`] if it cannot make it durable, and may take part in
/// the wait (the local backend does, for its commits by a caller alone).
pub struct Commit {
    lsn: u64,
    /// The channel of the backend's answer, or why it refused the
    /// transaction at once (taken by a wait).
    answer: Option<std::result::Result<Receiver, CommitError>>,
    /// The backend's part in the wait, if it takes one.
    committer: Option<Weak<dyn Committer>>,
    /// The backend has not started making it durable: waiting for it (or
    /// dropping it) must either commit it or start it.
    deferred: bool,
}

impl std::fmt::Debug for Commit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commit")
            .field("lsn", &self.lsn)
            .field("answer", &self.answer)
            .field("committer", &self.committer.is_some())
            .field("deferred", &self.deferred)
            .finish()
    }
}

impl Commit {
    /// A transaction `lsn` that its backend answers on `answer`; if
    /// `deferred`, the backend has not started making it durable yet (see
    /// [`Committer`]).
    pub(crate) fn pending(lsn: u64, answer: Receiver, deferred: bool) -> Commit {
        Commit {
            lsn,
            answer: Some(Ok(answer)),
            committer: None,
            deferred,
        }
    }

    /// A transaction refused at once, for `why`.
    pub(crate) fn refused(why: CommitError) -> Commit {
        Commit {
            lsn: 0,
            answer: Some(Err(why)),
            committer: None,
            deferred: false,
        }
    }

    /// The same commit, with its backend's part in the wait.
    pub(crate) fn with_committer(mut self, committer: Weak<dyn Committer>) -> Commit {
        self.committer = Some(committer);
        self
    }

    /// The transaction's log sequence number.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }

    /// The backend's part in the wait, while the backend is there.
    fn committer(&self) -> Option<Arc<dyn Committer>> {
        self.committer.as_ref().and_then(Weak::upgrade)
    }

    /// Has the transaction written without waiting for [`Commit::wait`]:
    /// for a caller with work to do first (reading the payloads of the
    /// messages it leased), which the write then overlaps.
    pub fn start(&mut self) {
        if self.deferred {
            self.deferred = false;
            if let Some(c) = self.committer() {
                c.start(self.lsn);
            }
        }
    }

    /// Waits until the transaction is durable. When the backend lets the
    /// caller make it durable itself (the local backend, when it is the
    /// last one waiting for the log, with at most one before it, and
    /// callers have been coming one at a time), the
    /// caller writes and syncs it instead of handing it over and being
    /// woken (on tokio's multi-thread runtime with two workers or more: it
    /// blocks its worker meanwhile).
    pub async fn wait(mut self) -> Result<()> {
        let answer = self.answer.take();
        if self.deferred {
            if let Some(c) = self.committer() {
                if c.alone(self.lsn) {
                    // Calls already received get their turn first (tokio
                    // polls for I/O before resuming a task that yielded):
                    // if they submit, this one is no longer alone.
                    tokio::task::yield_now().await;
                    c.commit_alone(self.lsn);
                }
                c.start(self.lsn);
            }
            self.deferred = false;
        }
        match answer {
            Some(Ok(rx)) => match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(why)) => Err(StorageError::stopped_by(&why)),
                Err(_) => Err(unanswered()),
            },
            Some(Err(why)) => Err(StorageError::stopped_by(&why)),
            None => Err(unanswered()),
        }
    }

    /// Blocks the calling thread until the transaction is durable; false
    /// if it failed. For the negative controls only
    /// ([`Fault::DlqTwoSteps`](crate::faults::Fault::DlqTwoSteps),
    /// [`Fault::ExchangeTwoSteps`](crate::faults::Fault::ExchangeTwoSteps)),
    /// which wait under the engine's lock, on an async worker: a backend
    /// that takes part in the wait waits on its own (the local one on its
    /// durable lsn); any other answers through its
    /// channel, read on a thread of its own (a channel cannot be waited
    /// for blocking on an async worker).
    pub(crate) fn wait_blocking(mut self) -> bool {
        if let Some(c) = self.committer() {
            // `wait_durable` starts it.
            self.deferred = false;
            return c.wait_durable(self.lsn);
        }
        match self.answer.take() {
            Some(Ok(rx)) => std::thread::scope(|s| {
                s.spawn(move || matches!(rx.blocking_recv(), Ok(Ok(()))))
                    .join()
                    .unwrap_or(false)
            }),
            Some(Err(_)) | None => false,
        }
    }
}

impl Drop for Commit {
    /// A commit not waited for (or whose wait was cancelled) is the
    /// backend's to make.
    fn drop(&mut self) {
        if self.deferred
            && let Some(c) = self.committer()
        {
            c.start(self.lsn);
        }
    }
}

/// The error of a commit whose backend went away without answering it.
fn unanswered() -> StorageError {
    StorageError::Stopped {
        reason: "the backend stopped without answering".into(),
    }
}

/// The smallest byte string above every string starting with `prefix`,
/// `None` if there is none (all bytes 0xff, or empty).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Every entry whose key starts with `prefix`, in key order, read in
/// pages of `page` entries (at least one; see [`pages`](super::pages),
/// which reads them lazily).
pub fn scan_all<B: Backend + ?Sized>(
    backend: &B,
    prefix: &[u8],
    page: usize,
) -> Result<Vec<(Bytes, Bytes)>> {
    super::pages(backend, prefix, page).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A commit of a backend that takes no part in the wait (no
    /// [`Committer`]) is waited for through its channel, from an async
    /// worker too.
    #[tokio::test]
    async fn a_commit_without_a_committer_is_waited_for_through_its_channel() {
        let stopped = || {
            Arc::new(StorageError::Stopped {
                reason: "stopped".into(),
            })
        };
        let commit = |answer: std::result::Result<(), CommitError>| {
            let (tx, rx) = oneshot::channel();
            let sending = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let _ = tx.send(answer);
            });
            (Commit::pending(1, rx, false), sending)
        };
        let (c, sending) = commit(Ok(()));
        assert!(c.wait_blocking(), "durable");
        sending.join().expect("sender");
        let (c, sending) = commit(Err(stopped()));
        assert!(!c.wait_blocking(), "failed");
        sending.join().expect("sender");
        assert!(
            !Commit::refused(stopped()).wait_blocking(),
            "refused at submission"
        );
    }

    /// A waiter gets the error that stopped the backend as
    /// [`StorageError::Stopped`], with that error's text (a `Stopped`
    /// one's own reason).
    #[tokio::test]
    async fn a_refused_commit_is_stopped_with_its_cause() {
        let io = Arc::new(StorageError::io(
            "write",
            "/x/wal/1.wal",
            std::io::Error::other("disk on fire"),
        ));
        let err = Commit::refused(io).wait().await.expect_err("refused");
        assert_eq!(
            err.to_string(),
            "storage stopped: write /x/wal/1.wal: disk on fire"
        );
        let closed = Arc::new(StorageError::Stopped {
            reason: "store closed".into(),
        });
        let err = Commit::refused(closed).wait().await.expect_err("refused");
        assert_eq!(err.to_string(), "storage stopped: store closed");
    }
}
