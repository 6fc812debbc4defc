//! The checker: the invariants I1-I17 of the reliability method, judged
//! from the client-side history alone.
//!
//! Times: each call has an invocation and a completion instant on the
//! run's monotonic clock, and a wall-clock instant comparable with the
//! server's (lease deadlines, TTLs, dead-letter times). A rule is only
//! reported as broken when the history proves it: e.g. a second lease
//! counts as overlapping only if the whole window in which the server could
//! have granted it lies inside a window in which the first lease was
//! certainly live.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use super::history::{
    Delivery, History, Outcome, QueueShape, Records, SettleKind, SettleResult, StatsRead,
};
use super::workload::{self, FIFO, Fate, MAX_DELIVERIES, SOURCES, TTL};

mod fifo;
use fifo::fifo_order;

/// Slack for comparisons between the client's and the server's clocks
/// (same machine; the server rounds to milliseconds).
const SLACK_MS: u64 = 50;
/// [`SLACK_MS`] in nanoseconds.
const SLACK_NS: i128 = SLACK_MS as i128 * 1_000_000;
/// Examples kept per invariant.
const EXAMPLES: usize = 8;

/// One invariant's result.
#[derive(Debug, Clone)]
pub struct Row {
    /// I1...
    pub code: &'static str,
    /// What it says.
    pub name: &'static str,
    /// Violations found.
    pub violations: usize,
    /// A few of them.
    pub examples: Vec<String>,
    /// False for informational rows (never a failure).
    pub counts: bool,
}

/// The checker's verdict.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// One row per invariant.
    pub rows: Vec<Row>,
    /// Informational figures.
    pub info: Vec<(String, String)>,
}

impl Report {
    /// Total violations of the invariants that count.
    pub fn violations(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.counts)
            .map(|r| r.violations)
            .sum()
    }

    /// Violations of one invariant.
    pub fn of(&self, code: &str) -> usize {
        self.rows
            .iter()
            .filter(|r| r.code == code)
            .map(|r| r.violations)
            .sum()
    }

    /// The table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{:<5} {:<52} {:>10}", "", "invariant", "violations");
        for r in &self.rows {
            let v = if r.counts {
                r.violations.to_string()
            } else {
                format!("({})", r.violations)
            };
            let _ = writeln!(out, "{:<5} {:<52} {:>10}", r.code, r.name, v);
            for e in &r.examples {
                let _ = writeln!(out, "        - {e}");
            }
        }
        out
    }
}

struct Rows {
    rows: BTreeMap<&'static str, Row>,
}

impl Rows {
    fn new() -> Rows {
        let mut rows = BTreeMap::new();
        for (code, name, counts) in [
            ("I1", "no acknowledged publish lost", true),
            ("I2", "no unexpected or corrupted message", true),
            ("I3", "a failed publish had no effect", true),
            ("I4", "no acknowledged message redelivered", true),
            (
                "I5",
                "delivery and failure counts exact, never going back",
                true,
            ),
            (
                "I6",
                "dead letters: one queue, after exhausting attempts",
                true,
            ),
            ("I7", "no overlapping leases of a message", true),
            ("I8", "lease expiry: unacked messages come back", true),
            (
                "I9",
                "FIFO: group order (delivered, acked), one in flight",
                true,
            ),
            ("I10", "no delivery after TTL", true),
            (
                "I11",
                "ack semantics (expired refused, live accepted)",
                true,
            ),
            ("I12", "queue configurations durable", true),
            ("I13", "stats equal to the truth", true),
            ("I14", "recovered: unknown publishes that appeared", false),
            ("I15", "redeliveries (expected: nack, lease, crash)", false),
            ("I16", "health: starts, exits, logs, verify", true),
            (
                "I17",
                "exchange publishes: each in its queue, all or nothing",
                true,
            ),
        ] {
            rows.insert(
                code,
                Row {
                    code,
                    name,
                    violations: 0,
                    examples: Vec::new(),
                    counts,
                },
            );
        }
        Rows { rows }
    }

    fn add(&mut self, code: &'static str, example: impl FnOnce() -> String) {
        if let Some(r) = self.rows.get_mut(code) {
            r.violations += 1;
            if r.examples.len() < EXAMPLES {
                r.examples.push(example());
            }
        }
    }

    fn finish(self) -> Vec<Row> {
        let mut rows: Vec<Row> = self.rows.into_values().collect();
        rows.sort_by_key(|r| r.code[1..].parse::<u32>().unwrap_or(0));
        rows
    }
}

/// What is known of a message from its publish.
struct Msg {
    queue: String,
    ttl_ms: Option<u64>,
    outcome: Outcome,
    inv_wall: u64,
    done_wall: u64,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The history, indexed once for every check.
struct Index<'a> {
    recs: &'a Records,
    hist: &'a History,
    ds: &'a [Delivery],
    /// Every published message by id.
    msgs: HashMap<&'a str, Msg>,
    /// The ids of each (queue, FIFO group), in publish order.
    group_order: HashMap<(String, String), Vec<String>>,
    /// Deliveries per (queue, id) and per id, by invocation.
    by_msg: HashMap<(&'a str, &'a str), Vec<usize>>,
    by_id: HashMap<&'a str, Vec<usize>>,
    /// Settles per delivery, by invocation.
    settles_of: HashMap<usize, Vec<usize>>,
    /// Earliest completion of an ok ack, per (queue, id).
    ok_ack: HashMap<(&'a str, &'a str), u64>,
    /// Acked (ok) or possibly acked (info), per id.
    accounted: HashSet<&'a str>,
    /// The deliveries of a FIFO queue (or its DLQ) that one receive call
    /// or stream batch leased together, per group, in queue order.
    batches: HashMap<(u64, &'a str, &'a str), Vec<usize>>,
    /// When the final phase (the drain) began.
    drain_from: u64,
    /// Batches of the FIFO queue with several messages of one group: all,
    /// and before the drain.
    multi_batches: (usize, usize),
}

impl<'a> Index<'a> {
    fn new(recs: &'a Records, hist: &'a History) -> Index<'a> {
        // ---- messages
        let mut msgs: HashMap<&str, Msg> = HashMap::new();
        let mut group_order: HashMap<(String, String), Vec<String>> = HashMap::new();
        for p in &recs.publishes {
            for m in &p.msgs {
                if let Some(g) = &m.group {
                    group_order
                        .entry((p.queue.clone(), g.clone()))
                        .or_default()
                        .push(m.id.clone());
                }
                msgs.insert(
                    m.id.as_str(),
                    Msg {
                        queue: p.queue.clone(),
                        ttl_ms: m.ttl_ms,
                        outcome: p.outcome.clone(),
                        inv_wall: p.inv.wall,
                        done_wall: p.done.wall,
                    },
                );
            }
        }

        // ---- indexes
        let ds = &recs.deliveries;
        let mut by_msg: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        let mut by_id: HashMap<&str, Vec<usize>> = HashMap::new();
        for d in ds {
            by_msg
                .entry((d.queue.as_str(), d.id.as_str()))
                .or_default()
                .push(d.idx);
            by_id.entry(d.id.as_str()).or_default().push(d.idx);
        }
        for v in by_msg.values_mut().chain(by_id.values_mut()) {
            v.sort_by_key(|&i| (ds[i].inv.t, ds[i].done.t));
        }
        let mut settles_of: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, s) in recs.settles.iter().enumerate() {
            settles_of.entry(s.delivery).or_default().push(i);
        }
        for v in settles_of.values_mut() {
            v.sort_by_key(|&i| recs.settles[i].inv.t);
        }

        // Earliest completion of an ok ack, per (queue, id).
        let mut ok_ack: HashMap<(&str, &str), u64> = HashMap::new();
        // Acked (ok) or possibly acked (info), per id.
        let mut accounted: HashSet<&str> = HashSet::new();
        for s in &recs.settles {
            if s.kind != SettleKind::Ack {
                continue;
            }
            let d = &ds[s.delivery];
            match &s.result {
                SettleResult::Ok { .. } => {
                    accounted.insert(d.id.as_str());
                    let e = ok_ack
                        .entry((d.queue.as_str(), d.id.as_str()))
                        .or_insert(u64::MAX);
                    *e = (*e).min(s.done.t);
                }
                SettleResult::Call(o) if o.is_info() => {
                    accounted.insert(d.id.as_str());
                }
                _ => {}
            }
        }

        // ---- FIFO batches (SPEC §3)
        // When one delivery of a batch fails (nack, reject, lease expiry,
        // stream closed), the later ones still leased are released with
        // it: their tokens settle nothing, and their deliveries count as
        // deliveries but not as failed attempts.
        let mut batches: HashMap<(u64, &str, &str), Vec<usize>> = HashMap::new();
        for d in ds {
            if workload::fifo_kind(&d.queue) {
                batches
                    .entry((d.call, d.queue.as_str(), d.group.as_str()))
                    .or_default()
                    .push(d.idx);
            }
        }
        // When the final phase began (the drain's big batches), to tell the
        // workload's releases from the drain's in the summary.
        let drain_from = recs
            .nemesis
            .iter()
            .find(|n| n.what == "note" && n.detail == workload::FINAL_NOTE)
            .map_or(u64::MAX, |n| n.at.t);
        // Batches of the FIFO queue with several messages of one group: all,
        // and before the drain.
        let mut multi_batches = (0usize, 0usize);
        for v in batches.values_mut() {
            v.sort_unstable();
            if v.len() > 1 && ds[v[0]].queue == FIFO {
                multi_batches.0 += 1;
                if ds[v[0]].inv.t < drain_from {
                    multi_batches.1 += 1;
                }
            }
        }
        Index {
            recs,
            hist,
            ds,
            msgs,
            group_order,
            by_msg,
            by_id,
            settles_of,
            ok_ack,
            accounted,
            batches,
            drain_from,
            multi_batches,
        }
    }

    /// A wall-clock instant on the run's monotonic clock (ns).
    fn mono(&self, wall: u64) -> i128 {
        self.hist.mono_of_wall(wall)
    }

    /// The settles of delivery `d`, by invocation.
    fn settles(&self, d: usize) -> Vec<&'a super::history::Settle> {
        let recs = self.recs;
        self.settles_of
            .get(&d)
            .map(|v| v.iter().map(|&i| &recs.settles[i]).collect())
            .unwrap_or_default()
    }

    /// The end of the window in which a delivery's lease was certainly
    /// live by its own settles ([arrival, end], monotonic ns).
    fn own_end(&self, d: &Delivery) -> i128 {
        let mut end = self.mono(d.deadline) - SLACK_NS;
        for s in self.settles(d.idx) {
            match (s.kind, &s.result) {
                (SettleKind::Extend, SettleResult::Ok { deadline }) => {
                    if i128::from(s.done.t) <= end {
                        end = end.max(self.mono(*deadline) - SLACK_NS);
                    }
                }
                _ => {
                    end = end.min(i128::from(s.inv.t));
                    break;
                }
            }
        }
        end
    }

    /// The deliveries leased with `d` before it, of its group.
    fn before(&self, d: &Delivery) -> Vec<usize> {
        self.batches
            .get(&(d.call, d.queue.as_str(), d.group.as_str()))
            .map(|v| v.iter().copied().take_while(|&i| i < d.idx).collect())
            .unwrap_or_default()
    }

    /// Whether delivery `i` was settled with success by one of `kinds`.
    fn ok_settled(&self, i: usize, kinds: &[SettleKind]) -> bool {
        self.settles(i)
            .iter()
            .any(|s| kinds.contains(&s.kind) && matches!(s.result, SettleResult::Ok { .. }))
    }

    /// The earliest instant at which an earlier delivery of `d`'s batch
    /// and group may have failed and so released `d` (one with an `ok` ack
    /// never failed); `None` if none can have.
    fn release_from(&self, d: &Delivery) -> Option<i128> {
        self.before(d)
            .into_iter()
            .filter(|&i| !self.ok_settled(i, &[SettleKind::Ack]))
            .map(|i| self.own_end(&self.ds[i]))
            .min()
    }

    /// Whether `d` may have been released by the time `t`.
    fn released_by(&self, d: &Delivery, t: u64) -> bool {
        self.release_from(d).is_some_and(|r| r <= i128::from(t))
    }

    /// Whether delivery `i` certainly ended without an ack before `t`: its
    /// nack succeeded, or the server said it was released, before `t`.
    fn failed_before(&self, i: usize, t: u64) -> bool {
        self.settles(i).iter().any(|s| {
            s.done.t < t
                && (s.kind == SettleKind::Nack && matches!(s.result, SettleResult::Ok { .. })
                    || matches!(s.result, SettleResult::Released { .. }))
        })
    }

    /// A delivery that may have been released: it neither acked nor
    /// nacked with success, and an earlier one of its batch and group may
    /// have failed. It may have ended without being a failed attempt.
    fn maybe_released(&self, d: &Delivery) -> bool {
        !self.ok_settled(d.idx, &[SettleKind::Ack, SettleKind::Nack])
            && self.release_from(d).is_some()
    }

    /// The end of the window in which a delivery's lease was certainly
    /// live: its own, cut where an earlier delivery of its batch and group
    /// may have failed.
    fn live_end(&self, d: &Delivery) -> i128 {
        let end = self.own_end(d);
        self.release_from(d).map_or(end, |r| end.min(r))
    }
}

/// Runs every check. `health` are problems the orchestration saw (a start
/// that never became ready, an unexpected exit, a failed verify...).
pub fn check(recs: &Records, hist: &History, seed: u64, health: &[String]) -> Report {
    let mut rows = Rows::new();
    let mut info = Vec::new();
    let ix = Index::new(recs, hist);
    fifo_releases(&ix, &mut info);
    let ok_published = lost(&ix, &mut rows, &mut info);
    unexpected(&ix, &mut rows);
    exchange_publishes(&ix, &mut rows);
    per_message(&ix, &mut rows, &mut info);
    let dead_lettered = dead_letters(&ix, seed, &mut rows, &mut info);
    lease_expiry(&ix, &mut rows);
    fifo_order(&ix, &mut rows);
    ttl(&ix, &mut rows);
    ack_semantics(&ix, &mut rows);
    configurations(recs, &mut rows);
    check_stats(recs, &ix.msgs, &ix.by_id, &dead_lettered, &mut rows);
    recovered(&ix, &mut rows, &mut info);
    info.push(("acknowledged publishes".into(), ok_published.to_string()));
    // I16 health
    for h in health {
        rows.add("I16", || h.clone());
    }
    Report {
        rows: rows.finish(),
        info,
    }
}

/// Informational: how often FIFO batches released deliveries.
fn fifo_releases(ix: &Index<'_>, info: &mut Vec<(String, String)>) {
    let ds = ix.ds;
    let released_deliveries = ds
        .iter()
        .filter(|d| {
            ix.settles(d.idx)
                .iter()
                .any(|s| matches!(s.result, SettleResult::Released { .. }))
        })
        .count();
    // Settles answered RELEASED: all, and before the drain.
    let answered: Vec<u64> = ix
        .recs
        .settles
        .iter()
        .filter(|s| {
            s.kind != SettleKind::ReleasedWith && matches!(s.result, SettleResult::Released { .. })
        })
        .map(|s| s.inv.t)
        .collect();
    let answered_running = answered.iter().filter(|&&t| t < ix.drain_from).count();
    info.push((
        "FIFO releases".into(),
        format!(
            "{} batches leased several messages of one group ({} before the final drain); {released_deliveries} deliveries released; {} settles answered RELEASED ({answered_running} before the final drain)",
            ix.multi_batches.0,
            ix.multi_batches.1,
            answered.len()
        ),
    ));
}

/// I1: no acknowledged publish lost. Returns how many publishes were
/// acknowledged.
fn lost(ix: &Index<'_>, rows: &mut Rows, info: &mut Vec<(String, String)>) -> usize {
    let Index {
        msgs,
        by_id,
        accounted,
        ..
    } = ix;
    let mut lost_by_producer: BTreeMap<String, usize> = BTreeMap::new();
    let mut ok_published = 0usize;
    for (id, m) in msgs {
        if !m.outcome.is_ok() {
            continue;
        }
        ok_published += 1;
        if accounted.contains(id) {
            continue;
        }
        let producer = id.split('-').next().unwrap_or("?").to_string();
        *lost_by_producer.entry(producer).or_default() += 1;
        let seen = by_id.get(id).map_or(0, Vec::len);
        rows.add("I1", || {
            format!(
                "{id} ({}): publish acknowledged, {} deliveries seen, never acked",
                m.queue, seen
            )
        });
    }
    if !lost_by_producer.is_empty() {
        info.push(("lost per producer".into(), format!("{lost_by_producer:?}")));
    }
    ok_published
}

/// I2: no unexpected or corrupted message; I3: a failed publish had no
/// effect.
fn unexpected(ix: &Index<'_>, rows: &mut Rows) {
    let Index { msgs, .. } = ix;
    let ds = ix.ds;
    for d in ds {
        let Some(m) = msgs.get(d.id.as_str()) else {
            rows.add("I2", || {
                format!("{} delivered from {} but never published", d.id, d.queue)
            });
            continue;
        };
        if let Some(e) = &d.body_error {
            rows.add("I2", || format!("{} from {}: {e}", d.id, d.queue));
        }
        if d.queue != m.queue && d.queue != workload::dlq_of(&m.queue) {
            rows.add("I2", || {
                format!(
                    "{} published to {} delivered from {}",
                    d.id, m.queue, d.queue
                )
            });
        }
        if m.outcome.is_fail() {
            rows.add("I3", || {
                format!(
                    "{} delivered from {} although its publish failed ({:?})",
                    d.id, d.queue, m.outcome
                )
            });
        }
    }
}

/// I17: exchange publishes, each in its queue, all or nothing.
fn exchange_publishes(ix: &Index<'_>, rows: &mut Rows) {
    let Index { by_id, .. } = ix;
    // Each message in exactly its queue, as the answer said; a call whose
    // outcome is unknown stored all of its messages (in both queues) or none.
    let mut exchange_calls: BTreeMap<u64, (&str, Vec<&str>)> = BTreeMap::new();
    for p in &ix.recs.publishes {
        for e in &p.misrouted {
            rows.add("I17", || format!("{e} (answered {:?})", p.outcome));
        }
        if let Some((name, call)) = &p.exchange
            && p.outcome.is_info()
        {
            let c = exchange_calls
                .entry(*call)
                .or_insert_with(|| (name.as_str(), Vec::new()));
            c.1.extend(p.msgs.iter().map(|m| m.id.as_str()));
        }
    }
    for (name, ids) in exchange_calls.values() {
        let appeared: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| by_id.contains_key(id))
            .collect();
        if !appeared.is_empty() && appeared.len() != ids.len() {
            rows.add("I17", || {
                format!(
                    "a publish through {name} with an unknown outcome stored {appeared:?} of {ids:?}"
                )
            });
        }
    }
}

/// I4, I5 and I7 per (queue, id), and I15 (redeliveries).
fn per_message(ix: &Index<'_>, rows: &mut Rows, info: &mut Vec<(String, String)>) {
    let Index { by_msg, ok_ack, .. } = ix;
    let ds = ix.ds;
    let mut redeliveries = 0usize;
    for ((queue, id), list) in by_msg {
        if let Some(&acked) = ok_ack.get(&(*queue, *id)) {
            for &i in list {
                let d = &ds[i];
                if d.inv.t > acked {
                    rows.add("I4", || {
                        format!(
                            "{id} delivered from {queue} (count {}) by a receive invoked {:.1} ms after its ack succeeded",
                            d.count,
                            ms(d.inv.t - acked)
                        )
                    });
                }
            }
        }
        let is_source = SOURCES.contains(queue);
        redeliveries += list.len().saturating_sub(1);
        for (a_pos, &a) in list.iter().enumerate() {
            let da = &ds[a];
            // Every delivery counts (this one included), and the failed
            // attempts before it are fewer; a message that failed
            // `max_deliveries` times is not delivered from its queue again.
            if da.count == 0 || da.failed >= da.count || (is_source && da.failed >= MAX_DELIVERIES)
            {
                rows.add("I5", || {
                    format!(
                        "{id} delivered from {queue} with count {} after {} failed attempts (max deliveries {MAX_DELIVERIES})",
                        da.count, da.failed
                    )
                });
            }
            let end_a = ix.live_end(da);
            for &b in &list[a_pos + 1..] {
                let db = &ds[b];
                // Never going back: a later delivery has a higher count (a
                // FIFO release counts too) and no fewer failed attempts.
                if db.inv.t > da.done.t && (db.count <= da.count || db.failed < da.failed) {
                    rows.add("I5", || {
                        format!(
                            "{id} in {queue}: count {} ({} failed) then {} ({} failed) (second receive invoked {:.1} ms after the first delivery)",
                            da.count,
                            da.failed,
                            db.count,
                            db.failed,
                            ms(db.inv.t - da.done.t)
                        )
                    });
                }
                if db.token != da.token && db.inv.t >= da.done.t && i128::from(db.done.t) <= end_a {
                    rows.add("I7", || {
                        format!(
                            "{id} in {queue}: delivered again (count {}) while the lease of delivery {} (deadline {}) was live",
                            db.count, da.count, da.deadline
                        )
                    });
                }
            }
        }
    }
    info.push(("redeliveries".into(), redeliveries.to_string()));
    rows.rows
        .entry("I15")
        .and_modify(|r| r.violations = redeliveries);
}

/// I6: dead letters. Returns the dead-lettered messages: their source and
/// reason.
fn dead_letters<'a>(
    ix: &'a Index<'a>,
    seed: u64,
    rows: &mut Rows,
    info: &mut Vec<(String, String)>,
) -> HashMap<&'a str, (&'a str, i32)> {
    let Index {
        msgs,
        by_id,
        ok_ack,
        accounted,
        ..
    } = ix;
    let ds = ix.ds;
    let mut dead_lettered: HashMap<&str, (&str, i32)> = HashMap::new();
    for (id, list) in by_id {
        let Some(m) = msgs.get(id) else { continue };
        let dlq = workload::dlq_of(&m.queue);
        let in_dlq: Vec<&Delivery> = list
            .iter()
            .map(|&i| &ds[i])
            .filter(|d| d.queue == dlq)
            .collect();
        let Some(first) = in_dlq.first() else {
            continue;
        };
        let Some(rec) = first.dead_letters.last() else {
            rows.add("I6", || {
                format!("{id} delivered from {dlq} without a dead-letter record")
            });
            continue;
        };
        dead_lettered.insert(id, (m.queue.as_str(), rec.reason));
        if rec.source != m.queue {
            rows.add("I6", || {
                format!(
                    "{id}: dead-letter record names {} instead of {}",
                    rec.source, m.queue
                )
            });
        }
        let source_deliveries: Vec<&Delivery> = list
            .iter()
            .map(|&i| &ds[i])
            .filter(|d| d.queue == m.queue)
            .collect();
        match rec.reason {
            1 => {
                if rec.failed != MAX_DELIVERIES || rec.count < rec.failed {
                    rows.add("I6", || {
                        format!(
                            "{id}: dead-lettered for MAX_DELIVERIES after {} failed attempts and {} deliveries (max {MAX_DELIVERIES})",
                            rec.failed, rec.count
                        )
                    });
                }
                // Released deliveries (FIFO) are no failed attempts.
                let counted = source_deliveries
                    .iter()
                    .filter(|d| !ix.maybe_released(d))
                    .count();
                if counted > MAX_DELIVERIES as usize {
                    rows.add("I6", || {
                        format!(
                            "{id}: {counted} deliveries seen from {} before the move, not counting released ones (max {MAX_DELIVERIES})",
                            m.queue
                        )
                    });
                }
            }
            3 => {
                let ttl = m.ttl_ms.unwrap_or(0);
                if m.queue != TTL || rec.at + 2 < m.inv_wall + ttl {
                    rows.add("I6", || {
                        format!(
                            "{id}: dead-lettered as EXPIRED at {} though published at {} with TTL {ttl} ms",
                            rec.at, m.inv_wall
                        )
                    });
                }
            }
            r => rows.add("I6", || format!("{id}: unexpected dead-letter reason {r}")),
        }
        if ok_ack.contains_key(&(m.queue.as_str(), *id)) {
            rows.add("I6", || {
                format!("{id}: in {dlq} although an ack in {} succeeded", m.queue)
            });
        }
        for d in &source_deliveries {
            if d.inv.t > first.done.t {
                rows.add("I6", || {
                    format!(
                        "{id}: delivered from {} (count {}) after it was seen in {dlq}",
                        m.queue, d.count
                    )
                });
            }
        }
        for d in &in_dlq {
            if d.dead_letters.last().map(|r| r.at) != Some(rec.at) {
                rows.add("I6", || {
                    format!("{id}: two different dead-letter moves into {dlq}")
                });
            }
        }
    }
    let mut dl_by_fate: BTreeMap<String, usize> = BTreeMap::new();
    for (id, (_, reason)) in &dead_lettered {
        let f = workload::fate(seed, id);
        *dl_by_fate
            .entry(format!("{f:?}/{}", reason_name(*reason)))
            .or_default() += 1;
    }
    info.push((
        "dead-lettered by fate/reason".into(),
        format!("{dl_by_fate:?}"),
    ));
    // Poison messages that were published and never dead-lettered (they
    // are never acked by a consumer, so they must have been moved).
    for (id, m) in msgs {
        if m.outcome.is_ok()
            && workload::fate(seed, id) == Fate::Poison
            && !dead_lettered.contains_key(id)
            && accounted.contains(id)
        {
            rows.add("I6", || {
                format!(
                    "{id}: a poison message of {} that never reached its DLQ",
                    m.queue
                )
            });
        }
    }
    dead_lettered
}

/// I8: lease expiry, unacked messages come back.
fn lease_expiry(ix: &Index<'_>, rows: &mut Rows) {
    let Index { by_id, .. } = ix;
    let ds = ix.ds;
    // A delivery whose lease ended without a settle that may have worked
    // (dropped, held past its deadline, stream closed, settle refused) must
    // be followed by another delivery of the message (in its queue or its
    // DLQ).
    for d in ds {
        if d.process == "final sweep" {
            continue;
        }
        let maybe_settled = ix.settles(d.idx).iter().any(|s| {
            matches!(s.kind, SettleKind::Ack | SettleKind::Nack)
                && matches!(&s.result, SettleResult::Ok { .. })
                || matches!(&s.result, SettleResult::Call(o) if o.is_info())
        });
        if maybe_settled {
            continue;
        }
        // Came back: a delivery asked for after this one arrived, or
        // arriving after it; or, in whatever order the answers arrived, a
        // higher count in the same queue (its lease ended: a delivery
        // held up past its own deadline by a slow commit can arrive after
        // the one that followed it), or a copy in another queue (its DLQ)
        // asked for after this one.
        let again = by_id.get(d.id.as_str()).is_some_and(|v| {
            v.iter().map(|&i| &ds[i]).any(|e| {
                e.idx != d.idx
                    && (e.inv.t > d.done.t
                        || e.done.t > d.done.t
                        || (e.queue == d.queue && e.count > d.count)
                        || (e.queue != d.queue && e.done.t > d.inv.t))
            })
        });
        if !again {
            rows.add("I8", || {
                format!(
                    "{} in {}: delivery {} was never settled and the message never came back",
                    d.id, d.queue, d.count
                )
            });
        }
    }
}

/// I10: no delivery after TTL.
fn ttl(ix: &Index<'_>, rows: &mut Rows) {
    let Index { msgs, .. } = ix;
    let ds = ix.ds;
    for d in ds {
        if d.queue != TTL {
            continue;
        }
        let Some(m) = msgs.get(d.id.as_str()) else {
            continue;
        };
        let Some(ttl) = m.ttl_ms else { continue };
        if d.inv.wall > m.done_wall + ttl + SLACK_MS {
            rows.add("I10", || {
                format!(
                    "{} delivered by a receive invoked {} ms after its TTL of {ttl} ms ran out",
                    d.id,
                    d.inv.wall - m.done_wall - ttl
                )
            });
        }
    }
}

/// I11: ack semantics (expired refused, live accepted).
fn ack_semantics(ix: &Index<'_>, rows: &mut Rows) {
    let ds = ix.ds;
    for d in ds {
        let mut deadline = d.deadline;
        let mut ok_acks = 0;
        let mut attempted = false;
        for s in ix.settles(d.idx) {
            match (&s.kind, &s.result) {
                (SettleKind::Release, _) => attempted = true,
                (kind, SettleResult::Released { msg }) => {
                    // Released only by the failure of an earlier message
                    // of its group leased with it (SPEC §3).
                    if !ix.released_by(d, s.done.t) {
                        rows.add("I11", || {
                            format!(
                                "{} in {}: {kind:?} answered RELEASED ({msg}) though no earlier message of its group leased with it may have failed",
                                d.id, d.queue
                            )
                        });
                    }
                    attempted = true;
                }
                (SettleKind::ReleasedWith, _) => attempted = true,
                (kind, SettleResult::Ok { deadline: nd }) => {
                    if s.inv.wall > deadline + SLACK_MS {
                        rows.add("I11", || {
                            format!(
                                "{} in {}: {kind:?} succeeded {} ms after the lease ran out",
                                d.id,
                                d.queue,
                                s.inv.wall - deadline
                            )
                        });
                    }
                    match kind {
                        SettleKind::Ack => {
                            ok_acks += 1;
                            if ok_acks > 1 {
                                rows.add("I11", || {
                                    format!(
                                        "{} in {}: the same token acked twice with success",
                                        d.id, d.queue
                                    )
                                });
                            }
                        }
                        SettleKind::Extend => deadline = deadline.max(*nd),
                        _ => {}
                    }
                    if *kind != SettleKind::Extend {
                        attempted = true;
                    }
                }
                (kind, SettleResult::LeaseExpired) => {
                    // A released lease whose message left since (or whose
                    // attempt history no longer holds the release) is
                    // refused as expired.
                    if !attempted
                        && s.done.wall + SLACK_MS < deadline
                        && !ix.released_by(d, s.done.t)
                    {
                        rows.add("I11", || {
                            format!(
                                "{} in {}: {kind:?} refused as expired {} ms before the lease deadline",
                                d.id,
                                d.queue,
                                deadline - s.done.wall
                            )
                        });
                    }
                    attempted = true;
                }
                (SettleKind::Extend, SettleResult::Call(o)) if !o.is_fail() => {
                    // It may have extended the lease: to at most its
                    // completion plus the length asked for.
                    deadline = deadline.max(s.done.wall + s.timeout_ms);
                    attempted = true;
                }
                (_, SettleResult::Call(_)) => attempted = true,
            }
        }
    }
}

/// I12: queue configurations durable.
fn configurations(recs: &Records, rows: &mut Rows) {
    let mut states: BTreeMap<&str, Vec<Option<QueueShape>>> = BTreeMap::new();
    for a in &recs.admin {
        let st = states.entry(a.queue.as_str()).or_insert_with(|| vec![None]);
        match (a.op, &a.outcome) {
            ("create", Outcome::Ok) => *st = vec![a.config.clone()],
            ("create", o) if o.is_info() => push_state(st, a.config.clone()),
            ("update", o) if !o.is_fail() => {
                let Some(new) = &a.config else { continue };
                let next: Vec<Option<QueueShape>> = st
                    .iter()
                    .map(|s| {
                        s.clone().map(|mut s| {
                            s.ack_timeout_ms = new.ack_timeout_ms;
                            s
                        })
                    })
                    .collect();
                if o.is_ok() {
                    *st = next.into_iter().filter(Option::is_some).collect();
                } else {
                    for s in next {
                        push_state(st, s);
                    }
                }
            }
            ("delete", Outcome::Ok) => *st = vec![None],
            ("delete", o) if o.is_info() => push_state(st, None),
            ("get", Outcome::Ok) => {
                if !st.contains(&a.config) {
                    rows.add("I12", || {
                        format!(
                            "queue {}: read {:?}, expected one of {:?}",
                            a.queue, a.config, st
                        )
                    });
                }
                *st = vec![a.config.clone()];
            }
            ("get", Outcome::Fail { code, .. }) if code == "NotFound" => {
                if !st.contains(&None) {
                    rows.add("I12", || {
                        format!("queue {}: not found, expected {:?}", a.queue, st)
                    });
                }
                *st = vec![None];
            }
            _ => {}
        }
    }
}

/// I14: unknown publishes that appeared (informational).
fn recovered(ix: &Index<'_>, rows: &mut Rows, info: &mut Vec<(String, String)>) {
    let Index { msgs, by_id, .. } = ix;
    let recovered = msgs
        .iter()
        .filter(|(id, m)| m.outcome.is_info() && by_id.contains_key(*id))
        .count();
    let unknown = msgs.values().filter(|m| m.outcome.is_info()).count();
    rows.rows
        .entry("I14")
        .and_modify(|r| r.violations = recovered);
    info.push((
        "unknown publishes".into(),
        format!("{unknown} ({recovered} of them appeared)"),
    ));
}

fn push_state(st: &mut Vec<Option<QueueShape>>, s: Option<QueueShape>) {
    if !st.contains(&s) {
        st.push(s);
    }
}

fn reason_name(r: i32) -> &'static str {
    match r {
        1 => "MAX_DELIVERIES",
        2 => "REJECTED",
        3 => "EXPIRED",
        4 => "SKIPPED",
        _ => "?",
    }
}

fn check_stats(
    recs: &Records,
    msgs: &HashMap<&str, Msg>,
    by_id: &HashMap<&str, Vec<usize>>,
    dead_lettered: &HashMap<&str, (&str, i32)>,
    rows: &mut Rows,
) {
    let reads: BTreeMap<(&str, &str), &StatsRead> = recs
        .stats
        .iter()
        .map(|s| ((s.label, s.queue.as_str()), s))
        .collect();
    let labels: BTreeSet<&str> = recs.stats.iter().map(|s| s.label).collect();
    if labels.is_empty() {
        rows.add("I13", || "no stats were read at the end of the run".into());
        return;
    }
    for q in SOURCES {
        let dlq = workload::dlq_of(q);
        // Stored: acknowledged publishes, and unknown ones that appeared.
        let stored: usize = msgs
            .iter()
            .filter(|(id, m)| {
                m.queue == q
                    && (m.outcome.is_ok() || (m.outcome.is_info() && by_id.contains_key(*id)))
            })
            .count();
        let dl: usize = dead_lettered.values().filter(|(s, _)| *s == q).count();
        let expired: usize = dead_lettered
            .values()
            .filter(|(s, r)| *s == q && *r == 3)
            .count();
        for label in &labels {
            let (Some(s), Some(d)) = (reads.get(&(*label, q)), reads.get(&(*label, dlq.as_str())))
            else {
                rows.add("I13", || format!("{label}: stats of {q} or {dlq} missing"));
                continue;
            };
            let mut check = |what: &str, got: u64, want: usize| {
                if got != want as u64 {
                    rows.add("I13", || {
                        format!("{label}: {what} is {got}, the history says {want}")
                    });
                }
            };
            check(&format!("{q} total"), s.total, 0);
            check(&format!("{dlq} total"), d.total, 0);
            check(&format!("{q} published"), s.published, stored);
            check(&format!("{q} dead_lettered"), s.dead_lettered, dl);
            check(&format!("{q} expired"), s.expired, expired);
            check(&format!("{q} acked"), s.acked, stored.saturating_sub(dl));
            check(
                &format!("{dlq} dead_letters_received"),
                d.dead_letters_received,
                dl,
            );
            check(&format!("{dlq} acked"), d.acked, dl);
            check(&format!("{dlq} published"), d.published, 0);
        }
    }
}
