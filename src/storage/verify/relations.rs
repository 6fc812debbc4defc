//! The relations between the records read that storage answers for:
//! messages and their queues and payloads, records of deleted queues,
//! reserved numbers. The queue rules over the same records (dead letter
//! queues, leases, groups, counters) are checked by `queue::verify`.

use std::collections::HashMap;

use super::VerifyReport;
use super::scan::Records;
use crate::storage::SysKey;
use crate::storage::records::QueueRecord;

/// Queues by number, with their names.
type ByQid<'a> = HashMap<u32, (&'a String, &'a QueueRecord)>;

/// What the messages' pass found, for the checks after it.
#[derive(Default)]
struct Messages {
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
    let msgs = messages(r, recs, &by_qid);
    payload_owners(r, recs, &msgs);
    deleted_queues(r, recs, &by_qid);
    reserved_numbers(r, recs, &by_qid, &msgs);
}

/// Each message: its queue, its payload and size.
fn messages(r: &mut VerifyReport, recs: &Records, by_qid: &ByQid<'_>) -> Messages {
    let mut out = Messages::default();
    for (qid, pos, m) in &recs.metas {
        out.max_pos = out.max_pos.max(*pos);
        let what = format!("message {} ({qid}/{pos})", m.message_id);
        if !by_qid.contains_key(qid) {
            // A queue delete cut short: the next start deletes these.
            out.orphans += 1;
            continue;
        }
        match recs.payload_sizes.get(&m.pid) {
            None => r.problem(format!("{what}: its payload {} is missing", m.pid)),
            Some(&size) if size != m.size as usize => r.problem(format!(
                "{what}: recorded size {} but its payload holds {size} bytes",
                m.size
            )),
            Some(_) => {}
        }
        *out.owners.entry(m.pid).or_default() += 1;
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

/// Groups and dedup entries of deleted queues noted.
fn deleted_queues(r: &mut VerifyReport, recs: &Records, by_qid: &ByQid<'_>) {
    for (qid, g) in &recs.groups {
        if !by_qid.contains_key(qid) {
            r.notes.push(format!("group {g:?} of a deleted queue"));
        }
    }
    for qid in &recs.dedups {
        if !by_qid.contains_key(qid) {
            r.notes
                .push(format!("dedup entry of a deleted queue {qid}"));
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
