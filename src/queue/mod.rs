//! The queue engine: every rule of queues, leases, delivery counting, dead
//! letters, TTLs, delays and FIFO groups lives here.
//!
//! [`Broker`] is what the server calls. It holds the in-memory indexes
//! (see `state.rs`) behind one mutex and the [`Store`] that makes changes
//! durable. Every state-changing operation follows the same path:
//!
//! 1. validate the request without the lock (a bad request changes
//!    nothing);
//! 2. take the lock, check preconditions, decide (which messages a receive
//!    leases, whether a nack dead-letters), update the indexes and build
//!    one storage transaction with the resulting absolute records;
//! 3. submit the transaction while still holding the lock, so the log
//!    order is the decision order;
//! 4. release the lock and wait for the transaction to be durable before
//!    answering.
//!
//! **All or nothing.** Steps 2 and 3 run in `Broker::decide`: an
//! operation either ends with its whole change submitted, the indexes
//! changed with it, or fails leaving the indexes exactly as they were and
//! nothing submitted. A step can fail after earlier ones changed the
//! indexes (a batch ack whose third record does not read, a nack whose
//! second token's message the store disagrees about, a redrive or a
//! dead-letter move half done); every change to the indexes is recorded
//! by the transition that makes it (`undo.rs`), and `decide` puts them
//! back when the operation fails, before the lock is released. So memory
//! never holds a change the store was not given, and a restart after a
//! failed operation finds the state the operation found. Nothing after
//! the submit fails but the wait for durability, which is fail-stop.
//!
//! Because the log is ordered, a receive that leases a message whose
//! publish is not yet durable answers only after the publish is.
//!
//! The engine reads time only through [`Clock`] and touches disk only
//! through [`Store`]. It never names tonic, prost or sled.

mod admin;
pub mod annotations;
pub mod definitions;
mod delivery;
mod dlq;
mod entries;
pub mod error;
pub mod exchange;
mod expiry;
mod fifo;
mod message;
pub mod model;
mod persist;
mod publish;
pub use publish::Publishing;
mod receive;
mod recovery;
pub mod redrive;
mod state;
pub mod subscription;
mod timers;
pub mod token;
mod undo;
pub mod validate;
pub mod verify;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Clock;
use crate::storage::{AnyBackend, LOAD_PAGE, OpenReport, Paged, Store, StoreOptions, SysKey, Txn};
use message::Message;

pub use error::{Exhausted, QueueError, Result};
use state::{QueueState, Timers};

/// Positions are reserved in blocks of this size; after a crash the rest
/// of the block is skipped, so no position is ever handed out twice.
const POS_BLOCK: u64 = 1 << 20;

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// Largest message body.
    pub max_message_size: usize,
    /// A receive returns no more body bytes than this (at least one
    /// message), so that its response fits the client's size limit.
    pub max_response_bytes: u64,
    /// How often the sweeper looks for due leases, delays and expiries.
    pub sweep_interval: Duration,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            max_message_size: 10 << 20,
            max_response_bytes: 4 << 20,
            sweep_interval: Duration::from_millis(50),
        }
    }
}

/// The engine's state behind its lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub queues: HashMap<u32, QueueState>,
    pub names: BTreeMap<String, u32>,
    /// DLQ name → names of the queues that use it.
    pub dlq_sources: HashMap<String, BTreeSet<String>>,
    /// Exchanges by name.
    pub exchanges: BTreeMap<String, exchange::ExchangeState>,
    pub timers: Timers,
    pub next_pos: u64,
    pub pos_reserved: u64,
    pub next_qid: u32,
    /// What the current operation changed in the indexes, to put back if
    /// it fails (`undo.rs`).
    pub undo: undo::Undo,
}

impl State {
    /// The internal number of a queue, or NOT_FOUND.
    pub(crate) fn qid(&self, name: &str) -> Result<u32> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| QueueError::no_queue(name))
    }

    /// A queue by internal number.
    pub(crate) fn queue(&mut self, qid: u32) -> Result<&mut QueueState> {
        self.queues
            .get_mut(&qid)
            .ok_or_else(|| QueueError::Unavailable(format!("queue number {qid} vanished")))
    }

    /// Hands out the next message position, reserving a new block in the
    /// transaction when the current one is used up.
    pub(crate) fn alloc_pos(&mut self, txn: &mut Txn) -> u64 {
        self.undo.positions(self.next_pos, self.pos_reserved);
        if self.next_pos >= self.pos_reserved {
            self.pos_reserved = self.next_pos + POS_BLOCK;
            txn.put_sys(SysKey::PosReserved, self.pos_reserved);
        }
        let pos = self.next_pos;
        self.next_pos += 1;
        pos
    }
}

/// A transaction being built, with the queues whose counters changed and
/// the queues whose waiters must be woken.
#[derive(Debug, Default)]
pub(crate) struct Change {
    pub txn: Txn,
    touched: Vec<u32>,
    woken: Vec<u32>,
    /// FIFO deliveries released by a failure of an earlier message of
    /// their group (`dlq.rs`), for the caller to report.
    pub released: Vec<model::Released>,
    /// The call answers from state another call changed, which may not be
    /// durable yet (a token whose lease was ended or released): the
    /// transaction is submitted even when empty, so that the answer waits
    /// until everything submitted before it is durable.
    pub answers_from_others: bool,
}

impl Change {
    /// Notes that a queue's counters changed.
    pub(crate) fn touch(&mut self, qid: u32) {
        if !self.touched.contains(&qid) {
            self.touched.push(qid);
        }
    }

    /// Notes that messages may have become deliverable in a queue.
    pub(crate) fn wake(&mut self, qid: u32) {
        if !self.woken.contains(&qid) {
            self.woken.push(qid);
        }
    }

    /// Adds the touched counters to the transaction and wakes waiters.
    pub(crate) fn finish(mut self, st: &State) -> Txn {
        for qid in &self.touched {
            if let Some(q) = st.queues.get(qid) {
                self.txn.put_counters(*qid, &(&q.counters).into());
            }
        }
        for qid in &self.woken {
            if let Some(q) = st.queues.get(qid) {
                q.wake();
            }
        }
        self.txn
    }
}

/// The queue engine.
pub struct Broker {
    store: Store<AnyBackend>,
    clock: Arc<dyn Clock>,
    opts: BrokerOptions,
    state: Mutex<State>,
    closing: AtomicBool,
    shutdown: tokio_util::sync::CancellationToken,
    /// Stored records found damaged (bodies failing their checksum) since
    /// the start.
    corrupt_found: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("store", &self.store)
            .finish()
    }
}

impl Broker {
    /// Builds the engine over an opened store (a local [`Store`] or a
    /// `Store<AnyBackend>`), rebuilding the in-memory indexes from it: a
    /// local store's database read directly, any other backend read in
    /// key order in pages of [`crate::storage::Backend::scan`].
    pub fn open(
        store: impl Into<Store<AnyBackend>>,
        clock: Arc<dyn Clock>,
        opts: BrokerOptions,
    ) -> Result<Broker> {
        let store = store.into();
        let now = clock.now_ms();
        let loaded = match store.backend().local() {
            Some(local) => recovery::load(&local.reader(), now)?,
            None => recovery::load(&Paged::new(store.backend(), LOAD_PAGE), now)?,
        };
        Ok(Broker::assemble(store, loaded, clock, opts))
    }

    /// Tests: [`Broker::open`] loading through the backend path, in pages
    /// of `page` entries, whatever the backend.
    #[cfg(test)]
    pub(crate) fn open_paged(
        store: impl Into<Store<AnyBackend>>,
        clock: Arc<dyn Clock>,
        opts: BrokerOptions,
        page: usize,
    ) -> Result<Broker> {
        let store = store.into();
        let loaded = recovery::load(&Paged::new(store.backend(), page), clock.now_ms())?;
        Ok(Broker::assemble(store, loaded, clock, opts))
    }

    /// Opens the data directory's store and rebuilds the indexes from it,
    /// the rebuild overlapping the store's own scan ([`Store::open_with`]).
    pub fn start(
        dir: &Path,
        store_opts: StoreOptions,
        clock: Arc<dyn Clock>,
        opts: BrokerOptions,
    ) -> Result<(Broker, OpenReport)> {
        let now = clock.now_ms();
        let (store, report, loaded) =
            Store::open_with(dir, store_opts, |reader| recovery::load(reader, now))?;
        Ok((Broker::assemble(store.into(), loaded?, clock, opts), report))
    }

    fn assemble(
        store: Store<AnyBackend>,
        (state, cleanup): (State, Txn),
        clock: Arc<dyn Clock>,
        opts: BrokerOptions,
    ) -> Broker {
        if !cleanup.is_empty() {
            tracing::info!("deleting records of queues deleted before the last stop");
            // Durable at the next commit; losing it to a crash only means
            // doing it again at the next start.
            let _ = store.submit(cleanup);
        }
        Broker {
            store,
            clock,
            opts,
            state: Mutex::new(state),
            closing: AtomicBool::new(false),
            shutdown: tokio_util::sync::CancellationToken::new(),
            corrupt_found: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Starts a graceful shutdown: waiting receives return at once (with
    /// what they have, possibly nothing); everything else goes on.
    pub fn begin_shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.shutdown.cancel();
        let st = self.lock();
        for q in st.queues.values() {
            q.wake();
        }
    }

    /// Resolves once [`Broker::begin_shutdown`] was called.
    pub async fn shutting_down(&self) {
        self.shutdown.cancelled().await;
    }

    /// True once [`Broker::begin_shutdown`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// The store under the engine.
    pub fn store(&self) -> &Store<AnyBackend> {
        &self.store
    }

    /// Stored records found damaged since the start (message bodies that
    /// failed their checksum when read for a delivery or a browse).
    pub fn corrupt_records_found(&self) -> u64 {
        self.corrupt_found.load(Ordering::Relaxed)
    }

    /// Refuses a write that is not a publish (ack, nack, extension,
    /// receive) while free disk space is below the hard floor.
    pub(crate) fn check_floor(&self) -> Result<()> {
        if self.store.above_floor() {
            return Ok(());
        }
        Err(Exhausted::DiskFloor.error(format!(
            "disk full: free space in {} is below a quarter of the configured minimum (the hard floor); acks, nacks and receives are refused too until space is freed",
            self.store.location()
        )))
    }

    pub(crate) fn note_corrupt(&self) {
        self.corrupt_found.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The engine's options.
    pub fn options(&self) -> &BrokerOptions {
        &self.opts
    }

    /// Stops the engine and closes its store (applies and checkpoints).
    pub fn close(self) -> Result<()> {
        self.store.close().map_err(QueueError::from)
    }

    /// Takes the engine's lock. Sections under it are short and never
    /// await; a panic while holding it cannot leave the indexes half
    /// changed in a way the next caller could not work with, so a poisoned
    /// lock is taken over.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The name of the queue an ack token was issued for, if the token
    /// parses and the queue still exists.
    pub fn token_queue(&self, token: &str) -> Option<String> {
        let t = token::AckToken::parse("ack_token", token).ok()?;
        self.lock().queues.get(&t.qid).map(|q| q.name.clone())
    }

    /// Reads a message's stored state; its absence is a broken invariant.
    pub(crate) fn meta(&self, qid: u32, pos: u64) -> Result<Message> {
        persist::get(&self.store, qid, pos)?.ok_or_else(|| {
            QueueError::DataLoss(format!("message {qid}/{pos} is indexed but not stored"))
        })
    }

    /// A message's record as `change`, not yet submitted, leaves it (the
    /// store only sees a change once it is submitted): a call that reads a
    /// record after its own change wrote it (a lease its `catch_up` ended,
    /// a message a release made ready) must not act on the older one.
    /// `None` when the change deleted it.
    pub(crate) fn meta_in(&self, change: &Change, qid: u32, pos: u64) -> Result<Option<Message>> {
        match persist::pending(&change.txn, qid, pos)? {
            Some(pending) => Ok(pending),
            None => Ok(Some(self.meta(qid, pos)?)),
        }
    }

    /// Runs one state-changing operation under the lock: `decide` builds
    /// a fresh change (and changes the indexes, each change recorded in
    /// `st.undo`). If it succeeds, the change is submitted and its commit
    /// returned with its result; if it fails, the indexes are put back as
    /// they were (`State::roll_back`) and nothing is submitted. Every
    /// state-changing section of the engine runs in here (module docs).
    pub(crate) fn decide<T>(
        &self,
        st: &mut State,
        decide: impl FnOnce(&mut State, &mut Change) -> Result<T>,
    ) -> Result<(T, Option<crate::storage::Commit>)> {
        st.undo.clear();
        let mut change = Change::default();
        match decide(st, &mut change) {
            Ok(out) => {
                st.undo.clear();
                Ok((out, self.submit(st, change)))
            }
            Err(e) => {
                st.roll_back();
                Err(e)
            }
        }
    }

    /// Submits a change under the lock and returns its commit: what
    /// [`Broker::decide`] does with a change that succeeded (and the
    /// exchange negative control with its first part).
    pub(crate) fn submit(&self, st: &State, change: Change) -> Option<crate::storage::Commit> {
        let wait = change.answers_from_others;
        let txn = change.finish(st);
        (wait || !txn.is_empty()).then(|| self.store.submit(txn))
    }
}

/// A change the engine decided and logged, pending until it is durable:
/// what it hands to adapters that answer only once the change is on disk
/// (the storage's own commit stays inside the engine).
#[derive(Debug, Default)]
#[must_use = "a change is answered only once it is durable"]
pub struct Pending(Option<crate::storage::Commit>);

impl Pending {
    pub(crate) fn new(commit: Option<crate::storage::Commit>) -> Pending {
        Pending(commit)
    }

    /// Waits until the change is durable.
    pub async fn durable(self) -> Result<()> {
        durable(self.0).await
    }
}

/// Waits for a commit, if there is one.
pub(crate) async fn durable(commit: Option<crate::storage::Commit>) -> Result<()> {
    match commit {
        Some(c) => c.wait().await.map_err(QueueError::from),
        None => Ok(()),
    }
}

#[cfg(test)]
mod damage_tests;
#[cfg(test)]
mod fifo_rules_tests;
#[cfg(test)]
mod fifo_tests;
#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod undo_tests;
