//! PublishStream sessions: publishes read in order, each decided and
//! logged at once (so they are stored in the order sent), their durability
//! awaited concurrently (so they share fsyncs), and answered in order.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::access::allow;
use super::convert;
use super::service::publish_target;
use super::status::to_status;
use crate::auth::{Action, Principal};
use crate::pb;
use crate::queue::model::Published;
use crate::queue::{Broker, Publishing, QueueError};

/// Most publishes of one stream waiting for durability; beyond it the
/// session stops reading until some are answered (backpressure).
const MAX_IN_FLIGHT: usize = 8192;

type Tx = mpsc::Sender<Result<pb::PublishStreamResponse, Status>>;

fn begin(broker: &Broker, p: Option<pb::PublishRequest>) -> Result<Publishing, QueueError> {
    let p = p.unwrap_or_default();
    let msgs = p.messages.into_iter().map(convert::new_message).collect();
    match (p.queue.is_empty(), p.exchange.is_empty()) {
        (false, true) => broker.begin_publish(&p.queue, msgs),
        (true, false) => broker.begin_publish_to_exchange(&p.exchange, msgs),
        _ => Err(QueueError::invalid(
            "publish.queue",
            format!("queue {:?}, exchange {:?}", p.queue, p.exchange),
            "set exactly one of queue and exchange",
        )),
    }
}

fn answer(
    sequence: u64,
    r: Result<Vec<Published>, QueueError>,
) -> Result<pb::PublishStreamResponse, Status> {
    match r {
        Ok(results) => Ok(pb::PublishStreamResponse {
            sequence,
            results: results.into_iter().map(convert::published_pb).collect(),
            code: 0,
            error: String::new(),
        }),
        // The store failed: nothing more will be durable; end the stream.
        Err(e @ QueueError::Storage(_)) => Err(to_status(e)),
        Err(e) => {
            let s = to_status(e);
            Ok(pb::PublishStreamResponse {
                sequence,
                results: Vec::new(),
                code: s.code() as i32,
                error: s.message().to_string(),
            })
        }
    }
}

/// A publish the caller may not make: answered with its status, the stream
/// goes on.
fn refused(sequence: u64, s: &Status) -> pb::PublishStreamResponse {
    pb::PublishStreamResponse {
        sequence,
        results: Vec::new(),
        code: s.code() as i32,
        error: s.message().to_string(),
    }
}

/// Runs one publish stream until the client closes it and every publish
/// is answered. Each publish is authorized for `principal` on its own.
pub(crate) async fn session(
    broker: Arc<Broker>,
    principal: Arc<Principal>,
    mut inbound: Streaming<pb::PublishStreamRequest>,
    tx: Tx,
) {
    let mut pending = FuturesOrdered::new();
    let mut reading = true;
    loop {
        tokio::select! {
            biased;
            Some(reply) = pending.next(), if !pending.is_empty() => {
                let reply: Result<pb::PublishStreamResponse, Status> = reply;
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    return;
                }
            }
            msg = inbound.message(), if reading && pending.len() < MAX_IN_FLIGHT => match msg {
                Ok(Some(req)) => {
                    let sequence = req.sequence;
                    let target = req.publish.as_ref().map(publish_target).unwrap_or_default();
                    let denied = allow(&principal, Action::Publish, target).err();
                    let begun = match &denied {
                        None => {
                            broker.publish_room().await;
                            begin(&broker, req.publish)
                        }
                        Some(_) => Err(QueueError::FailedPrecondition(String::new())),
                    };
                    pending.push_back(async move {
                        if let Some(s) = denied {
                            return Ok(refused(sequence, &s));
                        }
                        let r = match begun {
                            Ok(p) => p.done().await,
                            Err(e) => Err(e),
                        };
                        answer(sequence, r)
                    });
                }
                Ok(None) => reading = false,
                Err(_) => return,
            },
            else => return,
        }
    }
}
