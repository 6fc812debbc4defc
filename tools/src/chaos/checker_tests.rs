//! The checker's FIFO rule (I9), lease expiry rule (I8) and counting rule
//! (I5) on hand-made histories: each case is a history that must pass or
//! must be flagged, so that a change to a rule that lets a reordering or a
//! count going back through, or flags a legal dead-letter skip, a legal
//! release (SPEC §3) or a late answer overtaken by the next delivery,
//! fails here before it can hide in a chaos run.

use super::checker::{Report, check};
use super::history::{
    DeadLetter, Delivery, History, Outcome, PubMsg, Publish, Records, Settle, SettleKind,
    SettleResult, Stamp,
};
use super::workload::{FIFO, MAX_DELIVERIES, dlq_of};

const GROUP: &str = "g";

/// `ms` milliseconds after `base`, on both clocks.
fn at(base: Stamp, ms: u64) -> Stamp {
    Stamp {
        t: base.t + ms * 1_000_000,
        wall: base.wall + ms,
    }
}

/// Publishes `ids` to the FIFO queue's group, one answered call each, in
/// order, all before 5 ms.
pub(super) fn published(base: Stamp, ids: &[&str]) -> Vec<Publish> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| Publish {
            queue: FIFO.to_string(),
            msgs: vec![PubMsg {
                id: id.to_string(),
                group: Some(GROUP.to_string()),
                ttl_ms: None,
                size: 16,
            }],
            inv: at(base, 2 * i as u64),
            done: at(base, 2 * i as u64 + 1),
            outcome: Outcome::Ok,
            process: "producer-0".to_string(),
            exchange: None,
            misrouted: Vec::new(),
        })
        .collect()
}

/// A first delivery of `id` from `queue` (count 1, no failed attempt),
/// arriving `ms` after `base` with a lease of `lease_ms`.
pub(super) fn delivered(
    base: Stamp,
    call: u64,
    queue: &str,
    id: &str,
    ms: u64,
    lease_ms: u64,
) -> Delivery {
    Delivery {
        idx: 0,
        call,
        queue: queue.to_string(),
        id: id.to_string(),
        count: 1,
        failed: 0,
        token: format!("t{call}-{id}"),
        deadline: base.wall + ms + lease_ms,
        group: GROUP.to_string(),
        dead_letters: Vec::new(),
        body_error: None,
        inv: at(base, ms.saturating_sub(1)),
        done: at(base, ms),
        stream: false,
        process: "consumer-0".to_string(),
    }
}

/// `id` as received from the DLQ, dead-lettered from the FIFO queue at
/// `moved_ms` after `base` (its deliveries in the group all lost to the
/// client).
pub(super) fn from_dlq(base: Stamp, call: u64, id: &str, moved_ms: u64) -> Delivery {
    let mut d = delivered(base, call, &dlq_of(FIFO), id, moved_ms + 100, 1_000);
    d.dead_letters.push(DeadLetter {
        source: FIFO.to_string(),
        reason: 1,
        count: 5,
        failed: 3,
        at: base.wall + moved_ms,
    });
    d
}

/// A settle of delivery `delivery` (its index in the list), invoked `ms`
/// after `base` and answered 1 ms later.
pub(super) fn settle(
    base: Stamp,
    delivery: usize,
    kind: SettleKind,
    ms: u64,
    result: SettleResult,
) -> Settle {
    Settle {
        delivery,
        kind,
        inv: at(base, ms),
        done: at(base, ms + 1),
        result,
        timeout_ms: 0,
    }
}

pub(super) fn ok() -> SettleResult {
    SettleResult::Ok { deadline: 0 }
}

fn released() -> SettleResult {
    SettleResult::Released {
        msg: "code 9: released".to_string(),
    }
}

/// The checker's report on these deliveries (numbered in order),
/// publishes and settles.
fn report(
    deliveries: Vec<Delivery>,
    publishes: Vec<Publish>,
    settles: Vec<Settle>,
    hist: &History,
) -> Report {
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
    check(&recs, hist, 7, &[])
}

fn i9(deliveries: Vec<Delivery>, publishes: Vec<Publish>, hist: &History) -> usize {
    report(deliveries, publishes, Vec::new(), hist).of("I9")
}

#[test]
fn a_message_after_one_dead_lettered_unseen_may_follow_it() {
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        from_dlq(base, 1, "m1", 200),
        delivered(base, 2, FIFO, "m2", 250, 1_000),
    ];
    assert_eq!(i9(ds, published(base, &["m1", "m2"]), &hist), 0);
}

#[test]
fn a_message_delivered_before_the_earlier_one_left_is_flagged() {
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        from_dlq(base, 1, "m1", 200),
        delivered(base, 2, FIFO, "m2", 20, 1_000),
    ];
    assert_eq!(i9(ds, published(base, &["m1", "m2"]), &hist), 1);
}

#[test]
fn a_message_delivered_past_one_never_delivered_nor_dead_lettered_is_flagged() {
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![delivered(base, 1, FIFO, "m2", 20, 1_000)];
    assert_eq!(i9(ds, published(base, &["m1", "m2"]), &hist), 1);
}

#[test]
fn deliveries_in_order_one_lease_after_another_pass() {
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 100),
        delivered(base, 2, FIFO, "m2", 200, 1_000),
    ];
    assert_eq!(i9(ds, published(base, &["m1", "m2"]), &hist), 0);
}

#[test]
fn a_second_message_of_the_group_while_the_first_is_leased_is_flagged() {
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 2, FIFO, "m2", 200, 1_000),
    ];
    assert_eq!(i9(ds, published(base, &["m1", "m2"]), &hist), 1);
}

#[test]
fn a_later_message_first_delivered_before_the_earlier_is_flagged() {
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        delivered(base, 1, FIFO, "m2", 10, 50),
        delivered(base, 2, FIFO, "m1", 200, 1_000),
    ];
    assert_eq!(i9(ds, published(base, &["m1", "m2"]), &hist), 1);
}

// ---- the acknowledged order (SPEC §3: releases) ----------------------------

#[test]
fn a_later_message_acked_before_the_earlier_one_is_flagged() {
    // m1's lease runs out unsettled; m2 is delivered after it (another
    // call) and acked; m1 comes again and is acked only then.
    let hist = History::new(None);
    let base = hist.now();
    let mut m1_again = delivered(base, 3, FIFO, "m1", 300, 1_000);
    m1_again.count = 2;
    m1_again.failed = 1;
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 100),
        delivered(base, 2, FIFO, "m2", 200, 1_000),
        m1_again,
    ];
    let settles = vec![
        settle(base, 1, SettleKind::Ack, 210, ok()),
        settle(base, 2, SettleKind::Ack, 310, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    assert_eq!(r.of("I9"), 1, "{}", r.table());
}

#[test]
fn a_later_message_of_the_batch_acked_after_the_earlier_was_nacked_is_flagged() {
    // The server without the release: m1 and m2 leased together, m1
    // nacked, m2's ack succeeds, m1 is acked after m2. Both the ack after
    // the nack and the acknowledged order are flagged.
    let hist = History::new(None);
    let base = hist.now();
    let mut m1_again = delivered(base, 2, FIFO, "m1", 100, 1_000);
    m1_again.count = 2;
    m1_again.failed = 1;
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 1, FIFO, "m2", 10, 1_000),
        m1_again,
    ];
    let settles = vec![
        settle(base, 0, SettleKind::Nack, 20, ok()),
        settle(base, 1, SettleKind::Ack, 25, ok()),
        settle(base, 2, SettleKind::Ack, 110, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    assert_eq!(r.of("I9"), 2, "{}", r.table());
}

#[test]
fn a_release_then_redelivery_in_order_passes() {
    // m1 and m2 leased together; m1 nacked, which releases m2 (the nack's
    // answer says so, and m2's ack is refused as RELEASED); both come
    // again in order, m2's count one higher (its release counted as a
    // delivery) but no failed attempt, and are acked in order.
    let hist = History::new(None);
    let base = hist.now();
    let mut m1_again = delivered(base, 2, FIFO, "m1", 40, 1_000);
    m1_again.count = 2;
    m1_again.failed = 1;
    let mut m2_again = delivered(base, 2, FIFO, "m2", 40, 1_000);
    m2_again.count = 2;
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 1, FIFO, "m2", 10, 1_000),
        m1_again,
        m2_again,
    ];
    let settles = vec![
        settle(base, 0, SettleKind::Nack, 20, ok()),
        settle(base, 1, SettleKind::ReleasedWith, 20, released()),
        settle(base, 1, SettleKind::Ack, 25, released()),
        settle(base, 2, SettleKind::Ack, 45, ok()),
        settle(base, 3, SettleKind::Ack, 50, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    for inv in ["I5", "I6", "I7", "I8", "I9", "I11"] {
        assert_eq!(r.of(inv), 0, "{inv}: {}", r.table());
    }
}

#[test]
fn a_release_by_a_lease_run_out_then_redelivery_passes() {
    // m1 and m2 leased together; m1 is held past its lease (its late ack
    // refused as expired), which releases m2; the redeliveries are in
    // order, m2's counted, with no failed attempt.
    let hist = History::new(None);
    let base = hist.now();
    let mut m1_again = delivered(base, 2, FIFO, "m1", 500, 1_000);
    m1_again.count = 2;
    m1_again.failed = 1;
    let mut m2_again = delivered(base, 2, FIFO, "m2", 500, 1_000);
    m2_again.count = 2;
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 300),
        delivered(base, 1, FIFO, "m2", 10, 300),
        m1_again,
        m2_again,
    ];
    let settles = vec![
        settle(base, 0, SettleKind::Ack, 400, SettleResult::LeaseExpired),
        settle(base, 1, SettleKind::Ack, 402, released()),
        settle(base, 2, SettleKind::Ack, 510, ok()),
        settle(base, 3, SettleKind::Ack, 515, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    for inv in ["I5", "I7", "I9", "I11"] {
        assert_eq!(r.of(inv), 0, "{inv}: {}", r.table());
    }
}

/// m1 and m2 leased together, m1 nacked (releasing m2), both delivered
/// again; m2's second delivery with `count` and `failed`.
fn released_then_delivered_again(count: u32, failed: u32) -> Report {
    let hist = History::new(None);
    let base = hist.now();
    let mut m1_again = delivered(base, 2, FIFO, "m1", 40, 1_000);
    m1_again.count = 2;
    m1_again.failed = 1;
    let mut m2_again = delivered(base, 2, FIFO, "m2", 40, 1_000);
    m2_again.count = count;
    m2_again.failed = failed;
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 1, FIFO, "m2", 10, 1_000),
        m1_again,
        m2_again,
    ];
    let settles = vec![
        settle(base, 0, SettleKind::Nack, 20, ok()),
        settle(base, 1, SettleKind::ReleasedWith, 20, released()),
        settle(base, 2, SettleKind::Ack, 45, ok()),
        settle(base, 3, SettleKind::Ack, 50, ok()),
    ];
    report(ds, published(base, &["m1", "m2"]), settles, &hist)
}

#[test]
fn a_release_that_takes_the_delivery_back_is_flagged() {
    // What the server did before the two counts (SPEC §3): the release
    // lowered m2's count, so its second delivery said 1 again.
    let r = released_then_delivered_again(1, 0);
    assert_eq!(r.of("I5"), 1, "{}", r.table());
    // Counted, and no failure: passes.
    let r = released_then_delivered_again(2, 0);
    assert_eq!(r.of("I5"), 0, "{}", r.table());
    // A failed attempt the release did not make is as wrong as a lost one
    // would be; here it only shows as more than the deliveries before.
    let r = released_then_delivered_again(2, 2);
    assert_eq!(r.of("I5"), 1, "{}", r.table());
}

#[test]
fn failed_attempts_that_go_back_are_flagged() {
    // m1 fails twice, then comes with no failed attempt: nothing (no
    // operator's release in the workload) resets them.
    let hist = History::new(None);
    let base = hist.now();
    let mut second = delivered(base, 2, FIFO, "m1", 100, 1_000);
    second.count = 2;
    second.failed = 1;
    let mut third = delivered(base, 3, FIFO, "m1", 200, 1_000);
    third.count = 3;
    let ds = vec![delivered(base, 1, FIFO, "m1", 10, 1_000), second, third];
    let settles = vec![
        settle(base, 0, SettleKind::Nack, 20, ok()),
        settle(base, 1, SettleKind::Nack, 110, ok()),
        settle(base, 2, SettleKind::Ack, 210, ok()),
    ];
    let r = report(ds, published(base, &["m1"]), settles, &hist);
    assert_eq!(r.of("I5"), 1, "{}", r.table());
}

#[test]
fn a_delivery_after_max_deliveries_failed_attempts_is_flagged() {
    // The third failure must move m1 to the DLQ; a fourth delivery from
    // its queue is flagged, whatever its count.
    let hist = History::new(None);
    let base = hist.now();
    let mut fourth = delivered(base, 2, FIFO, "m1", 100, 1_000);
    fourth.count = 7;
    fourth.failed = MAX_DELIVERIES;
    let ds = vec![fourth];
    let settles = vec![settle(base, 0, SettleKind::Ack, 110, ok())];
    let r = report(ds, published(base, &["m1"]), settles, &hist);
    assert_eq!(r.of("I5"), 1, "{}", r.table());
}

#[test]
fn a_same_count_again_without_a_possible_release_is_flagged() {
    // m2 alone in its batch, nothing earlier failed: its next delivery
    // must count.
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 2, FIFO, "m1", 1_200, 1_000),
    ];
    let settles = vec![settle(base, 1, SettleKind::Ack, 1_210, ok())];
    let r = report(ds, published(base, &["m1"]), settles, &hist);
    assert_eq!(r.of("I5"), 1, "{}", r.table());
}

#[test]
fn released_without_an_earlier_failure_in_the_batch_is_flagged() {
    // m2 answered RELEASED though the m1 leased with it was acked.
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 1, FIFO, "m2", 10, 1_000),
    ];
    let settles = vec![
        settle(base, 0, SettleKind::Ack, 20, ok()),
        settle(base, 1, SettleKind::Ack, 25, released()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    assert_eq!(r.of("I11"), 1, "{}", r.table());
}

#[test]
fn an_ack_ahead_of_an_earlier_message_still_leased_in_the_batch_passes() {
    // Allowed (SPEC §3): m2 acked while m1, leased with it, had not
    // failed; m1's ack follows.
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 1, FIFO, "m2", 10, 1_000),
    ];
    let settles = vec![
        settle(base, 1, SettleKind::Ack, 20, ok()),
        settle(base, 0, SettleKind::Ack, 30, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    assert_eq!(r.of("I9"), 0, "{}", r.table());
}

#[test]
fn an_ack_after_an_earlier_ack_whose_answer_was_lost_passes() {
    // m1's ack is cut off by a crash (it did not take effect: m1 comes
    // again), m2's ack after it succeeds while m1 is still leased; m1 is
    // acked after m2. The checker cannot tell this from a consumer acking
    // ahead: not flagged.
    let hist = History::new(None);
    let base = hist.now();
    let mut m1_again = delivered(base, 2, FIFO, "m1", 1_200, 1_000);
    m1_again.count = 2;
    m1_again.failed = 1;
    let ds = vec![
        delivered(base, 1, FIFO, "m1", 10, 1_000),
        delivered(base, 1, FIFO, "m2", 10, 1_000),
        m1_again,
    ];
    let lost = SettleResult::Call(Outcome::Info {
        code: "Unavailable".to_string(),
        msg: "connection reset".to_string(),
    });
    let settles = vec![
        settle(base, 0, SettleKind::Ack, 20, lost),
        settle(base, 1, SettleKind::Ack, 400, ok()),
        settle(base, 2, SettleKind::Ack, 1_210, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    assert_eq!(r.of("I9"), 0, "{}", r.table());
}

#[test]
fn an_ack_after_the_earlier_one_was_dead_lettered_passes() {
    // m1 leaves for the DLQ (its deliveries in the group lost to the
    // client) before m2 is delivered and acked.
    let hist = History::new(None);
    let base = hist.now();
    let ds = vec![
        from_dlq(base, 1, "m1", 200),
        delivered(base, 2, FIFO, "m2", 250, 1_000),
    ];
    let settles = vec![
        settle(base, 0, SettleKind::Ack, 310, ok()),
        settle(base, 1, SettleKind::Ack, 260, ok()),
    ];
    let r = report(ds, published(base, &["m1", "m2"]), settles, &hist);
    assert_eq!(r.of("I9"), 0, "{}", r.table());
}

/// m1's second delivery held up by a slow commit past its own deadline:
/// the lease it was answered with ran out before it arrived, and the third
/// delivery, leased meanwhile, arrived first (and was acked).
fn late_second_delivery(with_third: bool) -> Report {
    let hist = History::new(None);
    let base = hist.now();
    let mut second = delivered(base, 2, FIFO, "m1", 1_500, 1_000);
    second.count = 2;
    second.failed = 1;
    second.inv = at(base, 10);
    second.deadline = base.wall + 1_010;
    let mut third = delivered(base, 3, FIFO, "m1", 1_400, 1_000);
    third.count = 3;
    third.failed = 2;
    third.inv = at(base, 1_100);
    let mut ds = vec![second];
    let mut settles = vec![settle(
        base,
        0,
        SettleKind::Ack,
        1_510,
        SettleResult::LeaseExpired,
    )];
    if with_third {
        ds.push(third);
        settles.push(settle(base, 1, SettleKind::Ack, 1_420, ok()));
    }
    report(ds, published(base, &["m1"]), settles, &hist)
}

#[test]
fn a_late_delivery_overtaken_by_the_next_one_came_back() {
    let r = late_second_delivery(true);
    assert_eq!(r.of("I8"), 0, "{}", r.table());
}

#[test]
fn a_delivery_never_settled_and_never_delivered_again_is_flagged() {
    let r = late_second_delivery(false);
    assert_eq!(r.of("I8"), 1, "{}", r.table());
}
