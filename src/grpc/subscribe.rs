//! Subscribe streams: one session task per stream, mapping the protocol
//! onto the engine's [`Subscription`] (credit, what is held, settling,
//! returning what is held at the end).
//!
//! The session pushes deliveries while the subscription has room, settles
//! what the client sends, and when the stream ends (closed, broken, or the
//! server shutting down) closes the subscription, which returns every
//! delivery still unsettled to the queue, each counting as an attempt.
//!
//! Flow control: it sends through a small bounded channel, so a slow
//! consumer makes it wait instead of buffering. Sessions on one queue share
//! its messages: each takes at most one turn's batch and yields.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::access::{Caller, allow_tokens};
use super::convert;
use super::status::to_status;
use crate::pb;
use crate::pb::subscribe_request::Kind as In;
use crate::pb::subscribe_response::Kind as Out;
use crate::queue::model::{Nack, Settled};
use crate::queue::subscription::{SubscribeOptions, Subscription};
use crate::queue::{Broker, Pending, QueueError};

type Tx = mpsc::Sender<Result<pb::SubscribeResponse, Status>>;

/// Opens the engine's subscription for an opening message.
pub(crate) fn open(
    broker: &Arc<Broker>,
    open: &pb::SubscribeOpen,
) -> Result<Subscription, QueueError> {
    broker.subscribe(SubscribeOptions {
        queue: open.queue.clone(),
        credit: open.credit,
        ack_timeout: open.ack_timeout_ms,
        max_per_group: open.max_per_group,
    })
}

/// Runs one subscription until the client goes away or the server stops.
pub(crate) async fn session(
    broker: Arc<Broker>,
    principal: Caller,
    mut sub: Subscription,
    mut inbound: Streaming<pb::SubscribeRequest>,
    tx: Tx,
) {
    let queue = sub.queue().to_string();
    // Acks decided and logged, answered once durable: after the next
    // receive has leased (see `answer_acks`).
    let mut acks: Vec<PendingAck> = Vec::new();
    tracing::debug!(queue = %queue, credit = sub.credit(), "subscription opened");
    let end = loop {
        if broker.is_closing() {
            break "server shutting down".to_string();
        }
        let mut wake = match broker.watch(&queue) {
            Ok(w) => w,
            Err(e) => {
                let _ = tx.send(Err(to_status(e))).await;
                break "queue gone".to_string();
            }
        };
        let room = sub.room();
        match sub.take().await {
            Ok(got) if !got.is_empty() => {
                let batch = pb::DeliveryBatch {
                    deliveries: got.into_iter().map(convert::delivery_pb).collect(),
                };
                let msg = pb::SubscribeResponse {
                    kind: Some(Out::Deliveries(batch)),
                };
                if tx.send(Ok(msg)).await.is_err() {
                    break "client went away".to_string();
                }
                if let Err(why) = answer_acks(&mut acks, &tx).await {
                    break why;
                }
                // Let other sessions of the queue have a turn.
                tokio::task::yield_now().await;
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send(Err(to_status(e))).await;
                break "receive failed".to_string();
            }
        }
        if let Err(why) = answer_acks(&mut acks, &tx).await {
            break why;
        }
        let sleep = sub.next_deadline().map_or(Duration::from_secs(3600), |d| {
            Duration::from_millis(d.saturating_sub(broker.clock().now_ms()).max(1))
        });
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(req)) => {
                    match handle(&broker, &principal, req, &mut sub, &tx).await {
                        Ok(Some(ack)) => acks.push(ack),
                        Ok(None) => {}
                        Err(why) => break why,
                    }
                }
                Ok(None) => break "client closed the stream".to_string(),
                Err(e) => break format!("stream broke: {}", e.message()),
            },
            changed = wake.changed(), if room > 0 => {
                if changed.is_err() {
                    break "queue gone".to_string();
                }
            }
            () = tokio::time::sleep(sleep) => {}
            () = tx.closed() => break "client went away".to_string(),
            () = broker.shutting_down() => break "server shutting down".to_string(),
        }
    };
    match sub.close().await {
        Ok(n) => {
            tracing::debug!(queue = %queue, returned = n, reason = %end, "subscription closed")
        }
        Err(e) => {
            tracing::warn!(queue = %queue, error = %e, "returning a closed subscription's deliveries failed")
        }
    }
}

/// An ack whose decision is logged and whose answer waits for it to be
/// durable.
struct PendingAck {
    pending: Pending,
    answer: pb::SubscribeResponse,
}

/// Answers the pending acks once they are durable. The session leases its
/// next messages first: an ack frees credit, and the lease that uses it is
/// logged right behind the ack, so that both share one `fdatasync` (a
/// consumer with a credit of 1 would otherwise wait for two per message).
/// The acked deliveries no longer count against the credit meanwhile: if
/// the ack is lost to a crash, the lease logged after it is lost too.
async fn answer_acks(acks: &mut Vec<PendingAck>, tx: &Tx) -> Result<(), String> {
    for a in acks.drain(..) {
        if let Err(e) = a.pending.durable().await {
            let _ = tx.send(Err(to_status(e))).await;
            return Err("storage failed".into());
        }
        tx.send(Ok(a.answer))
            .await
            .map_err(|_| "client went away".to_string())?;
    }
    Ok(())
}

/// Handles one client message; `Err` ends the session. A successful ack
/// comes back to be answered once durable (see [`answer_acks`]).
async fn handle(
    broker: &Broker,
    principal: &Caller,
    req: pb::SubscribeRequest,
    sub: &mut Subscription,
    tx: &Tx,
) -> Result<Option<PendingAck>, String> {
    // Tokens of other queues need the caller's grant on those queues too.
    let (request_id, tokens): (u64, Vec<&str>) = match &req.kind {
        Some(In::Ack(a)) => (
            a.request_id,
            a.ack_tokens.iter().map(String::as_str).collect(),
        ),
        Some(In::Nack(n)) => (
            n.request_id,
            n.items.iter().map(|i| i.ack_token.as_str()).collect(),
        ),
        Some(In::Extend(e)) => (
            e.request_id,
            e.items.iter().map(|i| i.ack_token.as_str()).collect(),
        ),
        _ => (0, Vec::new()),
    };
    if let Err(status) = allow_tokens(principal, broker, tokens) {
        let settled = pb::StreamSettled {
            request_id,
            results: Vec::new(),
            code: status.code() as i32,
            error: status.message().to_string(),
            released: Vec::new(),
        };
        let msg = pb::SubscribeResponse {
            kind: Some(Out::Settled(settled)),
        };
        return tx
            .send(Ok(msg))
            .await
            .map(|()| None)
            .map_err(|_| "client went away".to_string());
    }
    let mut pending = None;
    // FIFO deliveries the request's nacks released (SPEC §3).
    let mut released = Vec::new();
    let (request_id, result, tokens): (u64, Result<Vec<Settled>, QueueError>, Vec<String>) =
        match req.kind {
            Some(In::Credit(n)) => {
                sub.set_credit(n);
                return Ok(None);
            }
            Some(In::MaxPerGroup(n)) => {
                sub.set_max_per_group(n);
                return Ok(None);
            }
            Some(In::Ack(a)) => {
                let r = sub.ack(&a.ack_tokens).map(|(results, p)| {
                    pending = Some(p);
                    results
                });
                (a.request_id, r, a.ack_tokens)
            }
            Some(In::Nack(n)) => {
                let items: Vec<Nack> = n
                    .items
                    .into_iter()
                    .map(|i| Nack {
                        token: i.ack_token,
                        delay: i.delay_ms,
                        reason: i.reason,
                        dead_letter: i.dead_letter,
                    })
                    .collect();
                let tokens = items.iter().map(|i| i.token.clone()).collect();
                let r = sub.nack(&items).await.map(|(results, r)| {
                    released = r;
                    results
                });
                (n.request_id, r, tokens)
            }
            Some(In::Extend(e)) => {
                let items: Vec<(String, u64)> = e
                    .items
                    .into_iter()
                    .map(|i| (i.ack_token, i.timeout_ms))
                    .collect();
                let r = sub.extend(&items).await;
                let tokens = items.into_iter().map(|(t, _)| t).collect();
                (e.request_id, r, tokens)
            }
            Some(In::Open(_)) => {
                let _ = tx
                    .send(Err(Status::invalid_argument(
                        "the subscription is already open",
                    )))
                    .await;
                return Err("second open".into());
            }
            None => return Ok(None),
        };
    let settled = match result {
        Ok(results) => pb::StreamSettled {
            request_id,
            results: tokens
                .into_iter()
                .zip(results)
                .map(|(t, s)| convert::settle_pb(t, s))
                .collect(),
            code: 0,
            error: String::new(),
            released: convert::released_pb(released),
        },
        Err(e @ QueueError::Storage(_)) => {
            let _ = tx.send(Err(to_status(e))).await;
            return Err("storage failed".into());
        }
        Err(e) => {
            let status = to_status(e);
            pb::StreamSettled {
                request_id,
                results: Vec::new(),
                code: status.code() as i32,
                error: status.message().to_string(),
                released: Vec::new(),
            }
        }
    };
    let msg = pb::SubscribeResponse {
        kind: Some(Out::Settled(settled)),
    };
    if let Some(pending) = pending {
        return Ok(Some(PendingAck {
            pending,
            answer: msg,
        }));
    }
    tx.send(Ok(msg))
        .await
        .map(|()| None)
        .map_err(|_| "client went away".to_string())
}
