//! FIFO order in the subscriber: the messages of one group run one after
//! another, in the order they came, while other groups (and every message
//! of a standard queue) run side by side up to `max_concurrency`.
//!
//! The server hands out a group's messages in order and, while any of
//! them is leased, to no one else (SPEC §3), so the subscriber only has
//! to keep its own handlers from overtaking each other. A message's turn
//! in its group begins when it is handed to the handler and ends once the
//! handler returned and the message is settled: acked or nacked with the
//! server's answer in, or its lease over (a MANUAL handler that returned
//! without settling it). Only then does the next message of the group
//! start.
//!
//! When one of a group's messages fails, the server releases the later
//! ones of that group leased with it; they come again after the failed
//! one. A nack's answer names them and they are skipped. A turn that ends
//! any other way (an ack or nack refused or unanswered, a lease that ran
//! out) leaves the group in doubt: the server may have released what the
//! subscriber still holds of it. Each next message of such a group is
//! checked first with an `ExtendLease`, which the server answers after
//! ending any lease that ran out (releasing what follows it): a message
//! whose lease is gone is skipped, and the first one that still holds its
//! lease clears the doubt.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

use super::Message;

/// The groups of a subscriber's FIFO queue that have a message running.
#[derive(Debug)]
pub(super) struct Groups {
    /// False for a standard queue: nothing is held back.
    fifo: bool,
    state: Mutex<State>,
    /// Signalled when a turn ends. `notify_one` keeps the signal when the
    /// dispatcher is not waiting yet, so none is lost.
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Groups with a message in its turn.
    busy: HashSet<String>,
    /// Groups whose last turn ended without a confirmed ack or nack.
    doubtful: HashSet<String>,
}

/// A message's turn in its group; see [`Groups::begin`].
#[derive(Debug)]
pub(super) struct Turn {
    /// The group; `None` on a standard queue.
    group: Option<String>,
    /// The group is in doubt: check the lease before running.
    pub check: bool,
}

impl Turn {
    /// True for a message of a FIFO queue.
    pub(super) fn grouped(&self) -> bool {
        self.group.is_some()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Groups {
    /// Groups of a FIFO queue (`fifo`), or none.
    pub(super) fn new(fifo: bool) -> Groups {
        Groups {
            fifo,
            state: Mutex::default(),
            freed: Notify::new(),
        }
    }

    /// The group of a message (the default group is the empty id).
    fn group<'a>(&self, m: &'a Message) -> Option<&'a str> {
        self.fifo.then(|| m.delivery().group_id.as_str())
    }

    /// The first message of `buffer` that may start now: one of a
    /// standard queue, one released (it is dropped, not run), or one
    /// whose group has no message in its turn. Buffers keep arrival
    /// order, so a group's messages are taken in order.
    pub(super) fn next_ready(&self, buffer: &VecDeque<Message>) -> Option<usize> {
        let state = lock(&self.state);
        buffer
            .iter()
            .position(|m| m.is_released() || self.group(m).is_none_or(|g| !state.busy.contains(g)))
    }

    /// Begins `m`'s turn: no other message of its group starts until
    /// [`Groups::end`]. Only the dispatcher calls this, after
    /// [`Groups::next_ready`] chose `m`.
    pub(super) fn begin(&self, m: &Message) -> Turn {
        let Some(group) = self.group(m) else {
            return Turn {
                group: None,
                check: false,
            };
        };
        let mut state = lock(&self.state);
        state.busy.insert(group.to_string());
        Turn {
            group: Some(group.to_string()),
            check: state.doubtful.contains(group),
        }
    }

    /// Ends a turn. `known`: the server confirmed the message's ack or
    /// nack, so what the subscriber holds of the group is as the server
    /// sees it; otherwise the group is in doubt.
    pub(super) fn end(&self, turn: Turn, known: bool) {
        let Some(group) = turn.group else {
            return;
        };
        {
            let mut state = lock(&self.state);
            if known {
                state.doubtful.remove(&group);
            } else {
                state.doubtful.insert(group.clone());
            }
            state.busy.remove(&group);
        }
        self.freed.notify_one();
    }

    /// Waits until a turn ends.
    pub(super) async fn freed(&self) {
        self.freed.notified().await;
    }
}
