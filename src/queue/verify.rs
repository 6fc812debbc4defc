//! `letterbox verify`: storage's checks of a data directory
//! (`storage::verify`: the log, every record, payloads, reserved numbers),
//! then the queue rules over the records they read:
//!
//! * dead letter queues exist, have their source's kind and are not their
//!   source;
//! * leases are consistent (the lease's epoch is the lease count, the
//!   delivery count does not exceed it, a lease starts before it ends);
//! * groups are only on FIFO queues, for messages and group records alike;
//! * each queue's counters agree with the messages it holds (what came in
//!   minus what went out, within what expiries explain).
//!
//! Nothing in the directory is modified.

use std::collections::HashMap;
use std::path::Path;

use super::model::QueueKind;
use crate::storage::verify::{Records, verify_store};

pub use crate::storage::verify::{VerifyOptions, VerifyReport};

/// Checks the data directory `dir`: storage's checks, then the queue's.
/// `Err` when it cannot be checked at all (not a data directory, an
/// unknown format, in use by a server, an I/O error); otherwise the report
/// says what is wrong, if anything.
pub fn verify(dir: &Path, opts: &VerifyOptions) -> crate::storage::Result<VerifyReport> {
    let (mut r, recs) = verify_store(dir, opts)?;
    if let Some(recs) = recs {
        check(&mut r, &recs);
    }
    Ok(r)
}

/// Every queue rule over the records read.
fn check(r: &mut VerifyReport, recs: &Records) {
    let mut kinds: HashMap<u32, (&String, QueueKind)> = HashMap::new();
    for (n, q) in &recs.queues {
        match QueueKind::from_code(q.kind) {
            Some(kind) => {
                kinds.insert(q.qid, (n, kind));
            }
            None => r.problem(format!(
                "queue {n:?}: kind {} is none of 1 (standard), 2 (FIFO)",
                q.kind
            )),
        }
    }
    dead_letter_queues(r, recs);
    let held = messages(r, recs, &kinds);
    groups(r, recs, &kinds);
    counters(r, recs, &kinds, &held);
}

/// Each dead letter queue exists, is of its source's kind and is not its
/// source.
fn dead_letter_queues(r: &mut VerifyReport, recs: &Records) {
    for (name, q) in &recs.queues {
        if let Some((dlq, _)) = &q.dead_letter {
            match recs.queues.get(dlq) {
                None => r.problem(format!(
                    "queue {name:?}: its dead letter queue {dlq:?} does not exist"
                )),
                Some(d) if d.kind != q.kind => r.problem(format!(
                    "queue {name:?}: its dead letter queue {dlq:?} is of another kind"
                )),
                Some(_) if dlq == name => {
                    r.problem(format!("queue {name:?} is its own dead letter queue"))
                }
                _ => {}
            }
        }
    }
}

/// Each message of a queue: its lease, its delivery count, its group.
/// Returns the messages each queue holds.
fn messages(
    r: &mut VerifyReport,
    recs: &Records,
    kinds: &HashMap<u32, (&String, QueueKind)>,
) -> HashMap<u32, u64> {
    let mut held: HashMap<u32, u64> = HashMap::new();
    for (qid, pos, m) in &recs.metas {
        // Messages of deleted queues are storage's note.
        let Some((_, kind)) = kinds.get(qid) else {
            continue;
        };
        *held.entry(*qid).or_default() += 1;
        let what = format!("message {} ({qid}/{pos})", m.message_id);
        if let Some(l) = &m.lease {
            if l.epoch != m.delivery_count {
                r.problem(format!(
                    "{what}: lease epoch {} but {} deliveries counted",
                    l.epoch, m.delivery_count
                ));
            }
            if l.started > l.deadline {
                r.problem(format!("{what}: lease ends before it starts"));
            }
        }
        if m.failed_attempts > m.delivery_count {
            r.problem(format!(
                "{what}: {} failed attempts but only {} deliveries",
                m.failed_attempts, m.delivery_count
            ));
        }
        if m.group.is_some() && !kind.is_fifo() {
            r.problem(format!("{what}: has a group but its queue is not FIFO"));
        }
    }
    held
}

/// Group records only for FIFO queues (those of deleted queues are
/// storage's note).
fn groups(r: &mut VerifyReport, recs: &Records, kinds: &HashMap<u32, (&String, QueueKind)>) {
    for (qid, g) in &recs.groups {
        if let Some((name, kind)) = kinds.get(qid)
            && !kind.is_fifo()
        {
            r.problem(format!(
                "group {g:?} stored for the standard queue {name:?}"
            ));
        }
    }
}

/// Each queue's counters agree with the messages it holds.
fn counters(
    r: &mut VerifyReport,
    recs: &Records,
    kinds: &HashMap<u32, (&String, QueueKind)>,
    held: &HashMap<u32, u64>,
) {
    for (qid, (name, _)) in kinds {
        let c = recs.counters.get(qid).copied().unwrap_or_default();
        let held = held.get(qid).copied().unwrap_or(0);
        let came = c.published + c.dead_letters_received + c.redrive_received;
        let went = c.acked + c.dead_lettered + c.purged + c.redriven;
        // An expiry either drops a message (counted only as expired) or
        // moves it to the DLQ (counted as expired and dead-lettered).
        let most = i128::from(came) - i128::from(went);
        let least = most - i128::from(c.expired);
        if i128::from(held) > most || i128::from(held) < least {
            r.problem(format!(
                "queue {name:?}: holds {held} messages, but its counters say {} (in {came}, out {went}, expired {})",
                if least == most {
                    most.to_string()
                } else {
                    format!("{least} to {most}")
                },
                c.expired
            ));
        }
    }
}
