//! The PostgreSQL backend: [`PgBackend`] (`backend`), the
//! [`Backend`](super::Backend) over what PostgreSQL keeps for one shard of
//! the key space ([`PgState`], `state`: the schema, the ownership lease
//! and its fence, fenced batch commits with a commit marker, reads and
//! scans). The only module outside tests that names `tokio_postgres`.

mod backend;
mod state;

pub use backend::{PgBackend, PgBackendOptions};
pub use state::{
    DEFAULT_CHUNK_SIZE, Fence, Holder, Outcome, PgError, PgState, Result, SCHEMA_VERSION,
    check_url, describe,
};

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;
