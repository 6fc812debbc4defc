//! Subscribe streams: one session task per stream.
//!
//! The session pushes deliveries while the client holds fewer unsettled
//! deliveries than its credit, settles what the client sends, and when the
//! stream ends (closed, broken, or the server shutting down) returns every
//! delivery still unsettled to the queue, each counting as an attempt.
//!
//! Flow control: the session never has more than `credit` unsettled
//! deliveries out, and it sends through a small bounded channel, so a slow
//! consumer makes it wait instead of buffering. Sessions on one queue share
//! its messages: each takes at most a small batch per turn and yields.

use std::collections::HashMap;
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
use crate::queue::model::{Nack, ReceiveOptions, Settled};
use crate::queue::{Broker, QueueError, validate};
use crate::storage::Commit;

/// Most deliveries taken in one turn, so that sessions share a queue.
const TURN: u32 = 64;
/// Largest credit a subscription may ask for.
pub(crate) const MAX_CREDIT: u32 = 10_000;

type Tx = mpsc::Sender<Result<pb::SubscribeResponse, Status>>;

/// Checks the opening message.
pub(crate) fn check_open(broker: &Broker, open: &pb::SubscribeOpen) -> Result<(), QueueError> {
    if open.credit == 0 || open.credit > MAX_CREDIT {
        return Err(QueueError::invalid(
            "open.credit",
            open.credit,
            format!("must be between 1 and {MAX_CREDIT}"),
        ));
    }
    let q = broker.get_queue(&open.queue)?;
    if let Some(t) = open.ack_timeout_ms {
        validate::lease_length("open.ack_timeout_ms", t, q.config.max_lease_total)?;
    }
    Ok(())
}

/// Runs one subscription until the client goes away or the server stops.
pub(crate) async fn session(
    broker: Arc<Broker>,
    principal: Caller,
    open: pb::SubscribeOpen,
    mut inbound: Streaming<pb::SubscribeRequest>,
    tx: Tx,
) {
    let mut credit = open.credit;
    let mut per_group = open.max_per_group;
    // Unsettled deliveries: token → lease deadline.
    let mut unsettled: HashMap<String, u64> = HashMap::new();
    let queue = open.queue.clone();
    // Acks decided and logged, answered once durable: after the next
    // receive has leased (see `answer_acks`).
    let mut acks: Vec<PendingAck> = Vec::new();
    tracing::debug!(queue = %queue, credit, "subscription opened");
    let end = loop {
        if broker.is_closing() {
            break "server shutting down".to_string();
        }
        prune_expired(&broker, &mut unsettled);
        let room = credit.saturating_sub(u32::try_from(unsettled.len()).unwrap_or(u32::MAX));
        let mut wake = match broker.watch(&queue) {
            Ok(w) => w,
            Err(e) => {
                let _ = tx.send(Err(to_status(e))).await;
                break "queue gone".to_string();
            }
        };
        if room > 0 {
            let opts = ReceiveOptions {
                max_messages: room.min(TURN),
                wait: 0,
                ack_timeout: open.ack_timeout_ms,
                auto_ack: false,
                max_per_group: per_group,
            };
            match broker.receive(&queue, opts).await {
                Ok(got) if !got.is_empty() => {
                    for d in &got {
                        if let Some(t) = &d.ack_token {
                            unsettled.insert(t.clone(), d.lease_deadline);
                        }
                    }
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
        }
        if let Err(why) = answer_acks(&mut acks, &tx).await {
            break why;
        }
        let next_deadline = unsettled.values().min().copied();
        let sleep = next_deadline.map_or(Duration::from_secs(3600), |d| {
            Duration::from_millis(d.saturating_sub(broker.clock().now_ms()).max(1))
        });
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(req)) => {
                    let limits = Limits { credit: &mut credit, per_group: &mut per_group };
                    match handle(&broker, &principal, req, limits, &mut unsettled, &tx).await {
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
    let tokens: Vec<String> = unsettled.into_keys().collect();
    match broker.return_leases(&tokens).await {
        Ok(n) => {
            tracing::debug!(queue = %queue, returned = n, reason = %end, "subscription closed")
        }
        Err(e) => {
            tracing::warn!(queue = %queue, error = %e, "returning a closed subscription's deliveries failed")
        }
    }
}

/// Forgets deliveries whose lease ran out: they are no longer the
/// client's, and free their credit.
fn prune_expired(broker: &Broker, unsettled: &mut HashMap<String, u64>) {
    let now = broker.clock().now_ms();
    unsettled.retain(|_, deadline| *deadline > now);
}

/// An ack whose decision is logged and whose answer waits for it to be
/// durable.
struct PendingAck {
    commit: Commit,
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
        if let Err(e) = a.commit.wait().await {
            let _ = tx.send(Err(to_status(QueueError::from(e)))).await;
            return Err("storage failed".into());
        }
        tx.send(Ok(a.answer))
            .await
            .map_err(|_| "client went away".to_string())?;
    }
    Ok(())
}

/// What the client may change of its subscription while it runs.
struct Limits<'a> {
    /// Most unsettled deliveries.
    credit: &'a mut u32,
    /// FIFO: most deliveries of one group per turn (0: no cap).
    per_group: &'a mut u32,
}

/// Handles one client message; `Err` ends the session. A successful ack
/// comes back to be answered once durable (see [`answer_acks`]).
async fn handle(
    broker: &Broker,
    principal: &Caller,
    req: pb::SubscribeRequest,
    limits: Limits<'_>,
    unsettled: &mut HashMap<String, u64>,
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
    let mut commit = None;
    // FIFO deliveries the request's nacks released (SPEC §3).
    let mut released = Vec::new();
    // (request id, outcome, tokens, whether a success keeps the delivery held)
    let (request_id, result, tokens, keeps): (
        u64,
        Result<Vec<Settled>, QueueError>,
        Vec<String>,
        bool,
    ) = match req.kind {
        Some(In::Credit(n)) => {
            *limits.credit = n.min(MAX_CREDIT);
            return Ok(None);
        }
        Some(In::MaxPerGroup(n)) => {
            *limits.per_group = n;
            return Ok(None);
        }
        Some(In::Ack(a)) => {
            let r = broker.ack_begin(&a.ack_tokens).map(|(results, c)| {
                commit = c;
                results
            });
            (a.request_id, r, a.ack_tokens, false)
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
            let r = broker.nack_releasing(&items).await.map(|(results, r)| {
                released = r;
                results
            });
            (n.request_id, r, tokens, false)
        }
        Some(In::Extend(e)) => {
            let items: Vec<(String, u64)> = e
                .items
                .into_iter()
                .map(|i| (i.ack_token, i.timeout_ms))
                .collect();
            let r = broker.extend(&items).await;
            // A successful extension moves the deadline the session tracks.
            if let Ok(results) = &r {
                for ((t, _), s) in items.iter().zip(results) {
                    if let (Settled::Ok { deadline }, Some(d)) = (s, unsettled.get_mut(t)) {
                        *d = *deadline;
                    }
                }
            }
            let tokens = items.into_iter().map(|(t, _)| t).collect();
            (e.request_id, r, tokens, true)
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
        Ok(results) => {
            for (t, s) in tokens.iter().zip(&results) {
                // Acked, nacked or found expired: no longer held. An
                // extended lease stays held.
                if !(keeps && matches!(s, Settled::Ok { .. })) {
                    unsettled.remove(t);
                }
            }
            // Released with a failed message of their group: no longer
            // the client's, and their credit is free again.
            for r in &released {
                unsettled.remove(&r.ack_token);
            }
            pb::StreamSettled {
                request_id,
                results: tokens
                    .into_iter()
                    .zip(results)
                    .map(|(t, s)| convert::settle_pb(t, s))
                    .collect(),
                code: 0,
                error: String::new(),
                released: convert::released_pb(released),
            }
        }
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
    if let Some(commit) = commit {
        return Ok(Some(PendingAck {
            commit,
            answer: msg,
        }));
    }
    tx.send(Ok(msg))
        .await
        .map(|()| None)
        .map_err(|_| "client went away".to_string())
}
