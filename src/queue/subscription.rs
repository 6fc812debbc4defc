//! Subscriptions: push delivery under a credit, the engine's side.
//!
//! A [`Subscription`] holds what one consumer has out: the deliveries it
//! has not settled (token → lease deadline), its credit (most unsettled
//! deliveries at once) and its per-group cap. It takes new deliveries only
//! while it has room, forgets deliveries whose lease ran out (their credit
//! is free again), follows acks, nacks, extensions and FIFO releases, and
//! when it is closed returns every delivery still held to the queue, each
//! counting as an attempt. Adapters (the gRPC `Subscribe` stream) map
//! their protocol onto it and decide only when to write and wait.
//!
//! An ack on a subscription does not wait before the next step: it is
//! decided and logged (`Subscription::ack` hands back the engine's
//! `Pending`, not the storage's commit), its credit is freed, the next
//! receive leases and logs right behind it, and the ack is answered once
//! durable. So the ack and the lease usually share one `fdatasync`, and,
//! the log being ordered, a crash can lose the lease only with the ack.

use std::collections::HashMap;
use std::sync::Arc;

use super::model::{Delivery, Nack, ReceiveOptions, Released, Settled};
use super::{Broker, Pending, QueueError, Result, validate};

/// Most deliveries taken in one turn, so that subscriptions share a queue.
pub const TURN: u32 = 64;
/// Largest credit a subscription may ask for.
pub const MAX_CREDIT: u32 = 10_000;

/// How a subscription starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// The queue.
    pub queue: String,
    /// Most unsettled deliveries at once (1 to [`MAX_CREDIT`]).
    pub credit: u32,
    /// Lease length of its deliveries; the queue's ack timeout if `None`.
    pub ack_timeout: Option<u64>,
    /// FIFO: most deliveries of one group per turn (0: no cap).
    pub max_per_group: u32,
}

/// One consumer's subscription to a queue.
#[derive(Debug)]
pub struct Subscription {
    broker: Arc<Broker>,
    queue: String,
    credit: u32,
    per_group: u32,
    ack_timeout: Option<u64>,
    /// Unsettled deliveries: token → lease deadline.
    unsettled: HashMap<String, u64>,
}

impl Broker {
    /// Opens a subscription after checking its options against the queue.
    pub fn subscribe(self: &Arc<Broker>, opts: SubscribeOptions) -> Result<Subscription> {
        check_credit("open.credit", opts.credit)?;
        let q = self.get_queue(&opts.queue)?;
        if let Some(t) = opts.ack_timeout {
            validate::lease_length("open.ack_timeout_ms", t, q.config.max_lease_total)?;
        }
        Ok(Subscription {
            broker: Arc::clone(self),
            queue: opts.queue,
            credit: opts.credit,
            per_group: opts.max_per_group,
            ack_timeout: opts.ack_timeout,
            unsettled: HashMap::new(),
        })
    }
}

fn check_credit(field: &str, credit: u32) -> Result<()> {
    if credit == 0 || credit > MAX_CREDIT {
        return Err(QueueError::invalid(
            field,
            credit,
            format!("must be between 1 and {MAX_CREDIT}"),
        ));
    }
    Ok(())
}

impl Subscription {
    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Its credit.
    pub fn credit(&self) -> u32 {
        self.credit
    }

    /// Deliveries held now (lapsed leases included until [`Self::room`]).
    pub fn held(&self) -> usize {
        self.unsettled.len()
    }

    /// Changes the credit (capped at [`MAX_CREDIT`]; 0 pauses delivery).
    pub fn set_credit(&mut self, credit: u32) {
        self.credit = credit.min(MAX_CREDIT);
    }

    /// Changes the per-group cap of FIFO turns (0: none).
    pub fn set_max_per_group(&mut self, n: u32) {
        self.per_group = n;
    }

    /// How many more deliveries it may take now. Deliveries whose lease
    /// ran out are forgotten first: they are no longer the consumer's.
    pub fn room(&mut self) -> u32 {
        let now = self.broker.clock().now_ms();
        self.unsettled.retain(|_, deadline| *deadline > now);
        let held = u32::try_from(self.unsettled.len()).unwrap_or(u32::MAX);
        self.credit.saturating_sub(held)
    }

    /// Takes up to one turn's worth of ready deliveries within its room,
    /// without waiting (empty when none is ready or there is no room), and
    /// holds them until settled.
    pub async fn take(&mut self) -> Result<Vec<Delivery>> {
        let room = self.room();
        if room == 0 {
            return Ok(Vec::new());
        }
        let opts = ReceiveOptions {
            max_messages: room.min(TURN),
            wait: 0,
            ack_timeout: self.ack_timeout,
            auto_ack: false,
            max_per_group: self.per_group,
        };
        let got = self.broker.receive(&self.queue, opts).await?;
        for d in &got {
            if let Some(t) = &d.ack_token {
                self.unsettled.insert(t.clone(), d.lease_deadline);
            }
        }
        Ok(got)
    }

    /// The earliest lease deadline among held deliveries.
    pub fn next_deadline(&self) -> Option<u64> {
        self.unsettled.values().min().copied()
    }

    /// Acks, decided and logged; durable when the [`Pending`] is. The
    /// acked deliveries stop counting against the credit at once, so the
    /// next [`Self::take`] can lease behind the ack and share its sync.
    pub fn ack(&mut self, tokens: &[String]) -> Result<(Vec<Settled>, Pending)> {
        let (results, pending) = self.broker.ack_begin(tokens)?;
        self.forget_settled(tokens, &results, false);
        Ok((results, pending))
    }

    /// Nacks; with the FIFO deliveries they released (SPEC §3), which are
    /// no longer the consumer's either.
    pub async fn nack(&mut self, items: &[Nack]) -> Result<(Vec<Settled>, Vec<Released>)> {
        let (results, released) = self.broker.nack_releasing(items).await?;
        let tokens: Vec<String> = items.iter().map(|i| i.token.clone()).collect();
        self.forget_settled(&tokens, &results, false);
        for r in &released {
            self.unsettled.remove(&r.ack_token);
        }
        Ok((results, released))
    }

    /// Extends leases; an extended delivery stays held with its new
    /// deadline.
    pub async fn extend(&mut self, items: &[(String, u64)]) -> Result<Vec<Settled>> {
        let results = self.broker.extend(items).await?;
        let tokens: Vec<String> = items.iter().map(|(t, _)| t.clone()).collect();
        self.forget_settled(&tokens, &results, true);
        Ok(results)
    }

    /// Follows settlements: acked, nacked or found expired, a delivery is
    /// no longer held; an extended one (`keeps`) is, until its new
    /// deadline.
    fn forget_settled(&mut self, tokens: &[String], results: &[Settled], keeps: bool) {
        for (t, s) in tokens.iter().zip(results) {
            match s {
                Settled::Ok { deadline } if keeps => {
                    if let Some(d) = self.unsettled.get_mut(t) {
                        *d = *deadline;
                    }
                }
                _ => {
                    self.unsettled.remove(t);
                }
            }
        }
    }

    /// Ends it: every delivery still held goes back to the queue, each
    /// counting as an attempt. The number returned.
    pub async fn close(self) -> Result<usize> {
        let tokens: Vec<String> = self.unsettled.into_keys().collect();
        self.broker.return_leases(&tokens).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::queue::BrokerOptions;
    use crate::queue::model::{NewMessage, QueueConfigInput};
    use crate::storage::{Store, StoreOptions};

    #[tokio::test]
    async fn credit_bounds_what_is_held_and_settling_frees_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let opts = StoreOptions {
            min_free_bytes: 0,
            ..StoreOptions::default()
        };
        let (store, _) = Store::open(dir.path(), opts).expect("store opens");
        let broker =
            Arc::new(Broker::open(store, clock.clone(), BrokerOptions::default()).expect("opens"));
        broker
            .create_queue("q", &QueueConfigInput::default())
            .await
            .expect("create");
        let msgs: Vec<NewMessage> = (0..5)
            .map(|i| NewMessage {
                body: bytes::Bytes::from(format!("m{i}")),
                ..NewMessage::default()
            })
            .collect();
        broker.publish("q", msgs).await.expect("publish");

        let err = broker
            .subscribe(SubscribeOptions {
                queue: "q".into(),
                credit: 0,
                ack_timeout: None,
                max_per_group: 0,
            })
            .expect_err("credit 0");
        assert!(err.to_string().contains("open.credit"), "{err}");

        let mut sub = broker
            .subscribe(SubscribeOptions {
                queue: "q".into(),
                credit: 2,
                ack_timeout: Some(1_000),
                max_per_group: 0,
            })
            .expect("subscribe");
        let got = sub.take().await.expect("take");
        assert_eq!(got.len(), 2);
        assert_eq!(sub.room(), 0);
        assert!(
            sub.take().await.expect("take").is_empty(),
            "no room, nothing taken"
        );

        // An ack frees its credit at once; the ack is durable after.
        let token = got[0].ack_token.clone().expect("token");
        let (results, pending) = sub.ack(std::slice::from_ref(&token)).expect("ack");
        assert_eq!(results, vec![Settled::Ok { deadline: 0 }]);
        assert_eq!(sub.room(), 1);
        pending.durable().await.expect("durable");

        // An extension keeps the delivery held with its new deadline; a
        // lapsed lease frees its credit.
        let kept = got[1].ack_token.clone().expect("token");
        sub.extend(&[(kept, 5_000)]).await.expect("extend");
        assert_eq!(sub.held(), 1);
        let d = sub.next_deadline().expect("deadline");
        assert!(d >= clock.now_ms() + 5_000);
        clock.advance(5_001);
        broker.run_timers().await.expect("timers");
        assert_eq!(sub.room(), 2);

        // Closing returns what is held.
        let out = sub.take().await.expect("take");
        assert_eq!(out.len(), 2);
        assert_eq!(sub.close().await.expect("close"), 2);
        let again = broker
            .receive(
                "q",
                ReceiveOptions {
                    max_messages: 10,
                    ..ReceiveOptions::default()
                },
            )
            .await
            .expect("receive");
        assert_eq!(again.len(), 4, "the acked message is gone, the rest ready");
    }
}
