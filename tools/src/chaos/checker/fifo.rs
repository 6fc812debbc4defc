//! I9: FIFO group order (delivered, acked), one message of a group in
//! flight, and releases (SPEC §3). Four parts, each its own function:
//! the order of first deliveries, one in flight, the acknowledged order
//! (per group of the FIFO queue), and the settles a release voided (every
//! FIFO delivery).

use super::{Index, Rows, SLACK_NS, ms};
use crate::chaos::history::{Delivery, SettleKind, SettleResult};
use crate::chaos::workload::{self, FIFO};

/// I9 over the whole history.
pub(super) fn fifo_order(ix: &Index<'_>, rows: &mut Rows) {
    for ((queue, group), ids) in &ix.group_order {
        if queue != FIFO {
            continue;
        }
        first_delivery_order(ix, group, ids, rows);
        one_in_flight(ix, group, ids, rows);
        acked_order(ix, group, ids, rows);
    }
    released_settles(ix, rows);
}

/// The first delivery of `id` from the FIFO queue.
fn first<'a>(ix: &Index<'a>, id: &str) -> Option<&'a Delivery> {
    ix.by_msg
        .get(&(FIFO, id))
        .and_then(|v| v.first())
        .map(|&i| &ix.ds[i])
}

/// When `id` left the FIFO queue for its DLQ, as its DLQ deliveries'
/// records say (monotonic ns): its deliveries in the group may all have
/// gone to calls whose answers were lost (a receive cut off, a stream
/// closed with the delivery unread), each a counted attempt.
fn dead_lettered_at(ix: &Index<'_>, id: &str) -> Option<i128> {
    let dlq = workload::dlq_of(FIFO);
    ix.by_msg.get(&(dlq.as_str(), id)).and_then(|v| {
        v.iter()
            .flat_map(|&i| &ix.ds[i].dead_letters)
            .filter(|r| r.source == FIFO)
            .map(|r| ix.mono(r.at))
            .min()
    })
}

/// Order of first deliveries: no message is first delivered before an
/// earlier one of its group (earlier: its publish completed before this
/// one was invoked, as one producer owns each group), nor while an
/// earlier one that was never delivered from the group was still in it.
fn first_delivery_order(ix: &Index<'_>, group: &str, ids: &[String], rows: &mut Rows) {
    let mut latest_before: Option<(&str, u64)> = None;
    let mut missing_before: Option<&str> = None;
    let mut left_before: Option<(&str, i128)> = None;
    for idj in ids {
        let Some(dj) = first(ix, idj) else {
            if ix.msgs.get(idj.as_str()).is_some_and(|m| m.outcome.is_ok()) {
                match dead_lettered_at(ix, idj) {
                    Some(at) if left_before.is_none_or(|(_, t)| at > t) => {
                        left_before = Some((idj.as_str(), at));
                    }
                    Some(_) => {}
                    None if missing_before.is_none() => missing_before = Some(idj.as_str()),
                    None => {}
                }
            }
            continue;
        };
        if let Some(idi) = missing_before {
            rows.add("I9", || {
                format!("group {group}: {idj} delivered but the earlier {idi} never was")
            });
        } else if let Some((idi, at)) = left_before
            && i128::from(dj.done.t) < at - SLACK_NS
        {
            rows.add("I9", || {
                format!(
                    "group {group}: {idj} delivered {:.1} ms before the earlier {idi}, never delivered from the group, was dead-lettered",
                    (at - i128::from(dj.done.t)) as f64 / 1e6
                )
            });
        }
        if let Some((idi, inv)) = latest_before
            && inv > dj.done.t
        {
            rows.add("I9", || {
                format!(
                    "group {group}: {idj} first delivered {:.1} ms before the earlier {idi}",
                    ms(inv - dj.done.t)
                )
            });
        }
        if latest_before.is_none_or(|(_, t)| dj.inv.t > t) {
            latest_before = Some((idj.as_str(), dj.inv.t));
        }
    }
}

/// One message of a group in flight at a time (a single receive may hand
/// out several consecutive ones).
fn one_in_flight(ix: &Index<'_>, group: &str, ids: &[String], rows: &mut Rows) {
    let mut all: Vec<&Delivery> = ids
        .iter()
        .filter_map(|id| ix.by_msg.get(&(FIFO, id.as_str())))
        .flatten()
        .map(|&i| &ix.ds[i])
        .collect();
    all.sort_by_key(|d| d.inv.t);
    for (ai, a) in all.iter().enumerate() {
        let end_a = ix.live_end(a);
        if end_a <= i128::from(a.done.t) {
            continue;
        }
        // Candidates were invoked after a arrived; sorted by invocation,
        // so scan from the first invoked at or after a.done.
        let start = all.partition_point(|d| d.inv.t < a.done.t);
        for b in &all[start.max(ai + 1).min(all.len())..] {
            if i128::from(b.inv.t) > end_a {
                break;
            }
            if b.id != a.id && b.call != a.call && i128::from(b.done.t) <= end_a {
                rows.add("I9", || {
                    format!(
                        "group {group}: {} delivered while {} was leased (deadline {})",
                        b.id, a.id, a.deadline
                    )
                });
            }
        }
    }
}

/// From when `id` was certainly acked or dead-lettered (monotonic ns):
/// its first ack (`ok` or `info`: an answer lost in a crash may have
/// acked it) invoked, or its move to the DLQ (less the clock slack);
/// `i128::MAX` for neither.
fn done_from(ix: &Index<'_>, id: &str) -> i128 {
    let acked = ix
        .by_msg
        .get(&(FIFO, id))
        .into_iter()
        .flatten()
        .flat_map(|&i| ix.settles(i))
        .filter(|s| {
            s.kind == SettleKind::Ack
                && (matches!(s.result, SettleResult::Ok { .. })
                    || matches!(&s.result, SettleResult::Call(o) if o.is_info()))
        })
        .map(|s| i128::from(s.inv.t))
        .min();
    let moved = dead_lettered_at(ix, id).map(|at| at - SLACK_NS);
    acked.into_iter().chain(moved).min().unwrap_or(i128::MAX)
}

/// The acknowledged order: the messages of the group whose ack succeeded
/// follow the publish order, less the dead-lettered ones (and the unknown
/// publishes that never appeared). So when an ack of j succeeded, every
/// earlier message i was acked or dead-lettered already (see
/// [`done_from`]): violated when that happened only after j's ack
/// completed. One exception: i was leased with j, in the same batch, and
/// had not certainly failed when j's ack was invoked (a consumer may ack
/// a later message while an earlier one of its batch is leased; ours do
/// so only after an ack of i whose answer was lost).
fn acked_order(ix: &Index<'_>, group: &str, ids: &[String], rows: &mut Rows) {
    let (by_msg, ds) = (&ix.by_msg, ix.ds);
    let order: Vec<(&str, i128)> = ids
        .iter()
        .map(String::as_str)
        .filter(|id| {
            ix.msgs.get(id).is_some_and(|m| {
                m.outcome.is_ok() || m.outcome.is_info() && ix.by_id.contains_key(id)
            })
        })
        .map(|id| (id, done_from(ix, id)))
        .collect();
    // The latest `done_from` of the messages before j.
    let mut latest = i128::MIN;
    for (jpos, &(idj, _)) in order.iter().enumerate() {
        if jpos > 0 {
            latest = latest.max(order[jpos - 1].1);
        }
        let Some(list) = by_msg.get(&(FIFO, idj)) else {
            continue;
        };
        for &j in list {
            let dj = &ds[j];
            for s in ix.settles(j) {
                if s.kind != SettleKind::Ack || !matches!(s.result, SettleResult::Ok { .. }) {
                    continue;
                }
                let t = i128::from(s.done.t);
                if latest <= t {
                    continue;
                }
                let culprit = order[..jpos].iter().find(|&&(idi, from)| {
                    from > t
                        && !by_msg.get(&(FIFO, idi)).is_some_and(|v| {
                            v.iter()
                                .any(|&i| ds[i].call == dj.call && !ix.failed_before(i, s.inv.t))
                        })
                });
                if let Some(&(idi, from)) = culprit {
                    rows.add("I9", || {
                        let when = if from == i128::MAX {
                            "never acked nor dead-lettered".to_string()
                        } else {
                            format!(
                                "acked or dead-lettered {:.1} ms later at the earliest",
                                (from - t) as f64 / 1e6
                            )
                        };
                        format!(
                            "group {group}: {idj} acked (delivery {}) before the earlier {idi} ({when})",
                            dj.count
                        )
                    });
                }
            }
        }
    }
}

/// A later message of a batch settled with success after an earlier one
/// of its group, leased with it, certainly failed (its nack succeeded, or
/// it was answered RELEASED) before that settle was invoked: the failure
/// released it (SPEC §3), so its token settles nothing.
fn released_settles(ix: &Index<'_>, rows: &mut Rows) {
    let ds = ix.ds;
    for d in ds {
        if !workload::fifo_kind(&d.queue) {
            continue;
        }
        let earlier = ix.before(d);
        if earlier.is_empty() {
            continue;
        }
        for s in ix.settles(d.idx) {
            if !matches!(s.result, SettleResult::Ok { .. })
                || !matches!(
                    s.kind,
                    SettleKind::Ack | SettleKind::Nack | SettleKind::Extend
                )
            {
                continue;
            }
            if let Some(&a) = earlier.iter().find(|&&a| ix.failed_before(a, s.inv.t)) {
                rows.add("I9", || {
                    format!(
                        "group {}: {:?} of {} in {} succeeded after the earlier {}, leased with it, failed: it should have been released",
                        d.group, s.kind, d.id, d.queue, ds[a].id
                    )
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each part of I9 alone, on hand-made histories (the whole checker's
    //! cases are in `checker_tests.rs`).

    use super::*;
    use crate::chaos::checker_tests::{delivered, from_dlq, ok, published, settle};
    use crate::chaos::history::{History, Publish, Records, Settle};

    /// I9 violations that `part` finds in these deliveries (numbered in
    /// order), publishes and settles.
    fn found(
        part: impl Fn(&Index<'_>, &mut Rows),
        deliveries: Vec<Delivery>,
        publishes: Vec<Publish>,
        settles: Vec<Settle>,
        hist: &History,
    ) -> usize {
        let deliveries = deliveries
            .into_iter()
            .enumerate()
            .map(|(i, mut d)| {
                d.idx = i;
                d
            })
            .collect();
        let recs = Records {
            publishes,
            deliveries,
            settles,
            ..Records::default()
        };
        let ix = Index::new(&recs, hist);
        let mut rows = Rows::new();
        part(&ix, &mut rows);
        rows.rows.get("I9").map_or(0, |r| r.violations)
    }

    /// `part` run on each group of the FIFO queue.
    fn per_group(
        part: fn(&Index<'_>, &str, &[String], &mut Rows),
    ) -> impl Fn(&Index<'_>, &mut Rows) {
        move |ix, rows| {
            for ((queue, group), ids) in &ix.group_order {
                if queue == FIFO {
                    part(ix, group, ids, rows);
                }
            }
        }
    }

    #[test]
    fn first_deliveries_follow_the_publish_order() {
        let hist = History::new(None);
        let base = hist.now();
        let pubs = || published(base, &["m1", "m2"]);
        let part = || per_group(first_delivery_order);
        let in_order = vec![
            delivered(base, 1, FIFO, "m1", 10, 100),
            delivered(base, 2, FIFO, "m2", 200, 1_000),
        ];
        assert_eq!(found(part(), in_order, pubs(), Vec::new(), &hist), 0);
        let reversed = vec![
            delivered(base, 1, FIFO, "m2", 10, 50),
            delivered(base, 2, FIFO, "m1", 200, 1_000),
        ];
        assert_eq!(found(part(), reversed, pubs(), Vec::new(), &hist), 1);
        // Past an earlier message never delivered nor dead-lettered.
        let skipped = vec![delivered(base, 1, FIFO, "m2", 20, 1_000)];
        assert_eq!(found(part(), skipped, pubs(), Vec::new(), &hist), 1);
        // Past an earlier one dead-lettered unseen: only after it left.
        let after = vec![
            from_dlq(base, 1, "m1", 200),
            delivered(base, 2, FIFO, "m2", 250, 1_000),
        ];
        assert_eq!(found(part(), after, pubs(), Vec::new(), &hist), 0);
        let before = vec![
            from_dlq(base, 1, "m1", 200),
            delivered(base, 2, FIFO, "m2", 20, 1_000),
        ];
        assert_eq!(found(part(), before, pubs(), Vec::new(), &hist), 1);
    }

    #[test]
    fn one_message_of_a_group_is_in_flight_at_a_time() {
        let hist = History::new(None);
        let base = hist.now();
        let pubs = || published(base, &["m1", "m2"]);
        let part = || per_group(one_in_flight);
        let one_after_another = vec![
            delivered(base, 1, FIFO, "m1", 10, 100),
            delivered(base, 2, FIFO, "m2", 200, 1_000),
        ];
        assert_eq!(
            found(part(), one_after_another, pubs(), Vec::new(), &hist),
            0
        );
        let overlapping = vec![
            delivered(base, 1, FIFO, "m1", 10, 1_000),
            delivered(base, 2, FIFO, "m2", 200, 1_000),
        ];
        assert_eq!(found(part(), overlapping, pubs(), Vec::new(), &hist), 1);
        // One receive handing out both is allowed.
        let one_batch = vec![
            delivered(base, 1, FIFO, "m1", 10, 1_000),
            delivered(base, 1, FIFO, "m2", 10, 1_000),
        ];
        assert_eq!(found(part(), one_batch, pubs(), Vec::new(), &hist), 0);
    }

    #[test]
    fn acks_follow_the_publish_order() {
        // m1's lease runs out unsettled; m2 is delivered after it and
        // acked; m1 comes again and is acked only then.
        let hist = History::new(None);
        let base = hist.now();
        let deliveries = || {
            let mut m1_again = delivered(base, 3, FIFO, "m1", 300, 1_000);
            m1_again.count = 2;
            m1_again.failed = 1;
            vec![
                delivered(base, 1, FIFO, "m1", 10, 100),
                delivered(base, 2, FIFO, "m2", 200, 1_000),
                m1_again,
            ]
        };
        let pubs = || published(base, &["m1", "m2"]);
        let part = || per_group(acked_order);
        let out_of_order = vec![
            settle(base, 1, SettleKind::Ack, 210, ok()),
            settle(base, 2, SettleKind::Ack, 310, ok()),
        ];
        assert_eq!(found(part(), deliveries(), pubs(), out_of_order, &hist), 1);
        // m1 acked at its first delivery, before m2 was: in order.
        let in_order = vec![
            settle(base, 0, SettleKind::Ack, 20, ok()),
            settle(base, 1, SettleKind::Ack, 210, ok()),
        ];
        assert_eq!(found(part(), deliveries(), pubs(), in_order, &hist), 0);
    }

    #[test]
    fn a_settle_after_an_earlier_message_of_its_batch_failed_is_flagged() {
        let hist = History::new(None);
        let base = hist.now();
        let batch = || {
            vec![
                delivered(base, 1, FIFO, "m1", 10, 1_000),
                delivered(base, 1, FIFO, "m2", 10, 1_000),
            ]
        };
        let pubs = || published(base, &["m1", "m2"]);
        let after_nack = vec![
            settle(base, 0, SettleKind::Nack, 20, ok()),
            settle(base, 1, SettleKind::Ack, 25, ok()),
        ];
        assert_eq!(
            found(released_settles, batch(), pubs(), after_nack, &hist),
            1
        );
        let both_acked = vec![
            settle(base, 0, SettleKind::Ack, 20, ok()),
            settle(base, 1, SettleKind::Ack, 25, ok()),
        ];
        assert_eq!(
            found(released_settles, batch(), pubs(), both_acked, &hist),
            0
        );
    }
}
