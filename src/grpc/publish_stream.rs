//! PublishStream sessions: publishes read in order, each decided and
//! logged at once (so they are stored in the order sent), their durability
//! awaited concurrently (so they share fsyncs), and answered in order.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::access::{Caller, allow};
use super::convert;
use super::service::publish_target;
use super::status::to_status;
use crate::auth::Action;
use crate::pb;
use crate::queue::model::{Destination, Published};
use crate::queue::{Broker, Publishing, QueueError};

/// Most publishes of one stream waiting for durability; beyond it the
/// session stops reading until some are answered (backpressure).
const MAX_IN_FLIGHT: usize = 8192;

type Tx = mpsc::Sender<Result<pb::PublishStreamResponse, Status>>;

fn begin(broker: &Broker, p: Option<pb::PublishRequest>) -> Result<Publishing, QueueError> {
    let p = p.unwrap_or_default();
    let msgs = p.messages.into_iter().map(convert::new_message).collect();
    broker.begin_publish_to(
        &Destination::of(&p.queue, &p.exchange, "publish.queue")?,
        msgs,
    )
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

/// A publish read from the stream: refused by access control, or begun
/// (decided and logged, or failed).
enum Read {
    Denied(Status),
    Begun(Result<Publishing, QueueError>),
}

/// The answer to publish `sequence`, once it is durable or failed.
async fn reply(sequence: u64, read: Read) -> Result<pb::PublishStreamResponse, Status> {
    match read {
        Read::Denied(s) => Ok(refused(sequence, &s)),
        Read::Begun(Ok(p)) => answer(sequence, p.done().await),
        Read::Begun(Err(e)) => answer(sequence, Err(e)),
    }
}

/// The wait for room in the store (see [`Broker::publish_room`]).
type RoomWait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs one publish stream until the client closes it and every publish
/// is answered. Each publish is authorized for `principal` on its own.
///
/// A publish read while the store has no room for more is held, and no
/// more are read, until there is room; the answers of the publishes before
/// it go out meanwhile.
pub(crate) async fn session(
    broker: Arc<Broker>,
    principal: Caller,
    mut inbound: Streaming<pb::PublishStreamRequest>,
    tx: Tx,
) {
    let mut pending = FuturesOrdered::new();
    let mut reading = true;
    let mut held: Option<(u64, Option<pb::PublishRequest>, RoomWait)> = None;
    loop {
        tokio::select! {
            biased;
            Some(response) = pending.next(), if !pending.is_empty() => {
                let response: Result<pb::PublishStreamResponse, Status> = response;
                let failed = response.is_err();
                if tx.send(response).await.is_err() || failed {
                    return;
                }
            }
            () = async {
                if let Some((_, _, wait)) = held.as_mut() {
                    wait.await;
                }
            }, if held.is_some() => {
                if let Some((sequence, publish, _)) = held.take() {
                    pending.push_back(reply(sequence, Read::Begun(begin(&broker, publish))));
                }
            }
            msg = inbound.message(), if reading && held.is_none() && pending.len() < MAX_IN_FLIGHT => match msg {
                Ok(Some(req)) => {
                    let sequence = req.sequence;
                    let target = req.publish.as_ref().map(publish_target).unwrap_or_default();
                    if let Err(s) = allow(&principal, Action::Publish, target) {
                        pending.push_back(reply(sequence, Read::Denied(s)));
                        continue;
                    }
                    let room = Arc::clone(&broker);
                    let mut wait: RoomWait = Box::pin(async move { room.publish_room().await });
                    if (&mut wait).now_or_never().is_some() {
                        pending.push_back(reply(sequence, Read::Begun(begin(&broker, req.publish))));
                    } else {
                        held = Some((sequence, req.publish, wait));
                    }
                }
                Ok(None) => reading = false,
                Err(_) => return,
            },
            else => return,
        }
    }
}
