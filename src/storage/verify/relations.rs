//! The relations between the records read: dead letter queues, messages
//! and their payloads, leases, groups, counters, reserved numbers.

use std::collections::HashMap;

use super::VerifyReport;
use super::scan::Records;
use crate::queue::model::QueueKind;
use crate::storage::SysKey;
use crate::storage::records::QueueRecord;

/// Queues by number, with their names.
type ByQid<'a> = HashMap<u32, (&'a String, &'a QueueRecord)>;

/// What the messages' pass found, for the checks after it.
#[derive(Default)]
struct Messages {
    /// Messages held, by queue number.
    live: HashMap<u32, u64>,
    /// Messages per payload number.
    owners: HashMap<u64, u32>,
    /// Highest position in use.
    max_pos: u64,
    /// Messages of queues that are gone.
    orphans: usize,
}

/// Runs every check of the relations between the records.
pub(super) fn check(r: &mut VerifyReport, recs: &Records) {
    let by_qid: ByQid<'_> = recs.queues.iter().map(|(n, q)| (q.qid, (n, q))).collect();
    if by_qid.len() != recs.queues.len() {
        r.problem("two queues share an internal number".to_string());
    }
    dead_letter_queues(r, recs);
    let msgs = messages(r, recs, &by_qid);
    payload_owners(r, recs, &msgs);
    groups_and_dedups(r, recs, &by_qid);
    counters(r, recs, &by_qid, &msgs);
    reserved_numbers(r, recs, &by_qid, &msgs);
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

/// Each message: its queue, its payload and size, its lease, its group.
fn messages(r: &mut VerifyReport, recs: &Records, by_qid: &ByQid<'_>) -> Messages {
    let mut out = Messages::default();
    for (qid, pos, m) in &recs.metas {
        out.max_pos = out.max_pos.max(*pos);
        let what = format!("message {} ({qid}/{pos})", m.message_id);
        let Some((_, q)) = by_qid.get(qid) else {
            // A queue delete cut short: the next start deletes these.
            out.orphans += 1;
            continue;
        };
        *out.live.entry(*qid).or_default() += 1;
        match recs.payload_sizes.get(&m.pid) {
            None => r.problem(format!("{what}: its payload {} is missing", m.pid)),
            Some(&size) if size != m.size as usize => r.problem(format!(
                "{what}: recorded size {} but its payload holds {size} bytes",
                m.size
            )),
            Some(_) => {}
        }
        *out.owners.entry(m.pid).or_default() += 1;
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
        if m.group.is_some() && !QueueKind::from_code(q.kind).is_fifo() {
            r.problem(format!("{what}: has a group but its queue is not FIFO"));
        }
    }
    if out.orphans > 0 {
        r.notes.push(format!(
            "{} message(s) of deleted queues (a delete cut short); the next start removes them",
            out.orphans
        ));
    }
    out
}

/// Each payload belongs to exactly one message.
fn payload_owners(r: &mut VerifyReport, recs: &Records, msgs: &Messages) {
    for (pid, n) in &msgs.owners {
        if *n > 1 {
            r.problem(format!("payload {pid} belongs to {n} messages"));
        }
    }
    let unowned = recs
        .payload_sizes
        .keys()
        .filter(|p| !msgs.owners.contains_key(p))
        .count();
    if unowned > 0 && msgs.orphans == 0 {
        r.problem(format!("{unowned} payload(s) belong to no message"));
    }
}

/// Groups only on FIFO queues; groups and dedup entries of deleted queues
/// noted.
fn groups_and_dedups(r: &mut VerifyReport, recs: &Records, by_qid: &ByQid<'_>) {
    for (qid, g) in &recs.groups {
        match by_qid.get(qid) {
            Some((_, q)) if QueueKind::from_code(q.kind).is_fifo() => {}
            Some((name, _)) => r.problem(format!(
                "group {g:?} stored for the standard queue {name:?}"
            )),
            None => r.notes.push(format!("group {g:?} of a deleted queue")),
        }
    }
    for qid in &recs.dedups {
        if !by_qid.contains_key(qid) {
            r.notes
                .push(format!("dedup entry of a deleted queue {qid}"));
        }
    }
}

/// Each queue's counters agree with the messages it holds.
fn counters(r: &mut VerifyReport, recs: &Records, by_qid: &ByQid<'_>, msgs: &Messages) {
    for (qid, (name, _)) in by_qid {
        let c = recs.counters.get(qid).copied().unwrap_or_default();
        let held = msgs.live.get(qid).copied().unwrap_or(0);
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

/// The reserved positions and the next queue number are beyond every one
/// in use.
fn reserved_numbers(r: &mut VerifyReport, recs: &Records, by_qid: &ByQid<'_>, msgs: &Messages) {
    if let Some(&reserved) = recs.sys.get(&(SysKey::PosReserved as u8))
        && !recs.metas.is_empty()
        && msgs.max_pos >= reserved
    {
        r.problem(format!(
            "position {} is in use but only positions below {reserved} were reserved",
            msgs.max_pos
        ));
    }
    if let Some(&next) = recs.sys.get(&(SysKey::NextQid as u8)) {
        let max_qid = by_qid.keys().max().copied().unwrap_or(0);
        if !by_qid.is_empty() && u64::from(max_qid) >= next {
            r.problem(format!(
                "queue number {max_qid} is in use but the next one to hand out is {next}"
            ));
        }
    }
}
