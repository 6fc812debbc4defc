//! The PostgreSQL backend: [`PgBackend`] (`backend`), the
//! [`Backend`](super::Backend) over what PostgreSQL keeps for one shard of
//! the key space ([`PgState`], `state`: the schema, the ownership lease
//! and its fence, fenced batch commits with a commit marker, reads and
//! scans). `committer` has what the backend's calls share with its tasks
//! on the backend's own runtime (the committer, the lease renewal),
//! `recent` the recently committed values kept in memory. The only module
//! outside tests that names `tokio_postgres`.
//!
//! ## Lock order
//!
//! The backend's mutexes are `rank::RankedMutex`es, checked in debug
//! builds as the local backend's are: a thread takes a lock only while
//! every lock it holds has a lower rank. From lowest to highest (the
//! `Rank` constants below):
//!
//! 1. `CLOSED` (`PgBackend`: what the first close returned), held for a
//!    whole close. Under it: `RUNNING` (to take the tasks out), then
//!    `FRONT` (to mark the backend closed, and read whether it failed).
//!    Meanwhile the close waits for the committer, which runs on the
//!    backend's runtime thread and takes `FRONT`, `FENCE` and `READER`
//!    there, with nothing of the calling thread's held.
//! 2. `RUNNING` (`PgBackend`: the runtime's thread and tasks).
//! 3. `FRONT` (`committer::Shared`: the overlay of submitted changes, the
//!    queue for the committer, the next lsn, closed and failed, the recent
//!    values): held by a submission from deciding its changes to queuing
//!    them, by reads of the overlay, by the committer to take a batch and
//!    to answer it. Nothing is taken under it.
//! 4. `FENCE` (`committer::Shared`: the lease's epoch and how long it
//!    runs): read by commits and reads, replaced by a renewal; nothing
//!    under it.
//! 5. `READER` (`committer::Shared`: the connection for reads and
//!    renewals): held only to clone or replace it.
//!
//! No guard is held across an `.await`.

mod backend;
mod committer;
mod recent;
mod state;

pub use backend::{PgBackend, PgBackendOptions};
pub use state::{
    DEFAULT_CHUNK_SIZE, Fence, Holder, Outcome, PgError, PgState, Result, SCHEMA_VERSION,
    check_url, describe,
};

use super::rank::Rank;

impl Rank {
    /// What the first close returned (`PgBackend`).
    const CLOSED: Rank = Rank(10);
    /// The runtime's thread and tasks (`PgBackend`).
    const RUNNING: Rank = Rank(20);
    /// The overlay, the queue, the recent values (`committer::Shared`).
    const FRONT: Rank = Rank(30);
    /// The lease's epoch and validity (`committer::Shared`).
    const FENCE: Rank = Rank(40);
    /// The reading connection (`committer::Shared`).
    const READER: Rank = Rank(50);
}

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;
