//! The checker's FIFO rule (I9) on hand-made histories: each case is a
//! history that must pass or must be flagged, so that a change to the rule
//! that lets a reordering through, or flags a legal dead-letter skip, fails
//! here before it can hide in a chaos run.

use super::checker::check;
use super::history::{DeadLetter, Delivery, History, Outcome, PubMsg, Publish, Records, Stamp};
use super::workload::{FIFO, dlq_of};

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
fn published(base: Stamp, ids: &[&str]) -> Vec<Publish> {
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

/// A delivery of `id` from `queue`, arriving `ms` after `base` with a lease
/// of `lease_ms`.
fn delivered(base: Stamp, call: u64, queue: &str, id: &str, ms: u64, lease_ms: u64) -> Delivery {
    Delivery {
        idx: 0,
        call,
        queue: queue.to_string(),
        id: id.to_string(),
        count: 1,
        token: format!("t{call}"),
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
fn from_dlq(base: Stamp, call: u64, id: &str, moved_ms: u64) -> Delivery {
    let mut d = delivered(base, call, &dlq_of(FIFO), id, moved_ms + 100, 1_000);
    d.dead_letters.push(DeadLetter {
        source: FIFO.to_string(),
        reason: 1,
        count: 5,
        at: base.wall + moved_ms,
    });
    d
}

fn i9(deliveries: Vec<Delivery>, publishes: Vec<Publish>, hist: &History) -> usize {
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
        ..Records::default()
    };
    check(&recs, hist, 7, &[]).of("I9")
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
