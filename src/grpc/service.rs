//! The gRPC services: thin handlers that convert a request, call the
//! engine, and convert the answer. No rule lives here.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use super::access::{Caller, allow, allow_any, allow_tokens, caller};
use super::status::to_status;
use super::{convert, publish_stream, redrive, subscribe};
use crate::auth::{Action, Authenticator};
use crate::edge::consumers::Consumers;
use crate::pb;
use crate::pb::admin_service_server::AdminService;
use crate::pb::messaging_service_server::MessagingService;
use crate::queue::Broker;
use crate::queue::model::{Destination, Nack, QueueRemovals, ReceiveOptions};

/// Both services over one engine.
#[derive(Debug, Clone)]
pub(crate) struct Service {
    broker: Arc<Broker>,
    /// Who may do what.
    auth: Arc<Authenticator>,
    /// Subscription sessions, awaited at shutdown.
    sessions: TaskTracker,
    /// Who consumes each queue (for the metrics).
    consumers: Arc<Consumers>,
}

impl Service {
    /// Serves `broker` to the callers `auth` admits; subscription
    /// sessions are spawned on `sessions`; who consumes each queue is
    /// counted in `consumers`.
    pub(crate) fn new(
        broker: Arc<Broker>,
        sessions: TaskTracker,
        auth: Arc<Authenticator>,
        consumers: Arc<Consumers>,
    ) -> Service {
        Service {
            broker,
            auth,
            sessions,
            consumers,
        }
    }

    fn caller<T>(
        &self,
        req: &Request<T>,
    ) -> impl Future<Output = Result<Caller, Status>> + Send + use<T> {
        caller(&self.auth, req)
    }
}

type Rpc<T> = Result<Response<T>, Status>;

/// The queue or exchange a publish names (the engine reports a request
/// that names both or neither).
pub(crate) fn publish_target(r: &pb::PublishRequest) -> &str {
    if r.queue.is_empty() {
        &r.exchange
    } else {
        &r.queue
    }
}

fn page_token(t: &str) -> Option<&str> {
    (!t.is_empty()).then_some(t)
}

#[tonic::async_trait]
impl AdminService for Service {
    async fn create_queue(
        &self,
        req: Request<pb::CreateQueueRequest>,
    ) -> Rpc<pb::CreateQueueResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.name)?;
        let input = convert::config_input(r.config).map_err(to_status)?;
        let (q, created) = self
            .broker
            .create_queue(&r.name, &input)
            .await
            .map_err(to_status)?;
        if created {
            p.audit("queue.create", &r.name, "");
        }
        Ok(Response::new(pb::CreateQueueResponse {
            queue: Some(convert::queue_pb(q)),
            created,
        }))
    }

    async fn get_queue(&self, req: Request<pb::GetQueueRequest>) -> Rpc<pb::GetQueueResponse> {
        let p = self.caller(&req).await?;
        let name = req.into_inner().name;
        allow_any(&p, &name)?;
        let q = self.broker.get_queue(&name).map_err(to_status)?;
        Ok(Response::new(pb::GetQueueResponse {
            queue: Some(convert::queue_pb(q)),
        }))
    }

    async fn list_queues(
        &self,
        req: Request<pb::ListQueuesRequest>,
    ) -> Rpc<pb::ListQueuesResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        let (queues, next) = self
            .broker
            .list_queues(&r.prefix, r.page_size, page_token(&r.page_token))
            .map_err(to_status)?;
        Ok(Response::new(pb::ListQueuesResponse {
            queues: queues
                .into_iter()
                .filter(|q| p.sees(&q.name))
                .map(convert::queue_pb)
                .collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn update_queue(
        &self,
        req: Request<pb::UpdateQueueRequest>,
    ) -> Rpc<pb::UpdateQueueResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.name)?;
        let input = convert::config_input(r.config).map_err(to_status)?;
        let removals = QueueRemovals {
            dead_letter: r.remove_dead_letter,
            retry_backoff: r.remove_retry_backoff,
            max_length: r.remove_max_length,
        };
        let q = self
            .broker
            .update_queue(&r.name, &input, removals)
            .await
            .map_err(to_status)?;
        p.audit("queue.update", &r.name, "");
        Ok(Response::new(pb::UpdateQueueResponse {
            queue: Some(convert::queue_pb(q)),
        }))
    }

    async fn delete_queue(
        &self,
        req: Request<pb::DeleteQueueRequest>,
    ) -> Rpc<pb::DeleteQueueResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.name)?;
        let n = self
            .broker
            .delete_queue(&r.name, r.force)
            .await
            .map_err(to_status)?;
        p.audit(
            "queue.delete",
            &r.name,
            &format!("messages_deleted={n} force={}", r.force),
        );
        Ok(Response::new(pb::DeleteQueueResponse {
            messages_deleted: n,
        }))
    }

    async fn purge_queue(
        &self,
        req: Request<pb::PurgeQueueRequest>,
    ) -> Rpc<pb::PurgeQueueResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.name)?;
        let n = self.broker.purge_queue(&r.name).await.map_err(to_status)?;
        p.audit("queue.purge", &r.name, &format!("messages_deleted={n}"));
        Ok(Response::new(pb::PurgeQueueResponse {
            messages_deleted: n,
        }))
    }

    async fn get_queue_stats(
        &self,
        req: Request<pb::GetQueueStatsRequest>,
    ) -> Rpc<pb::GetQueueStatsResponse> {
        let p = self.caller(&req).await?;
        let name = req.into_inner().name;
        allow_any(&p, &name)?;
        let s = self.broker.stats(&name).map_err(to_status)?;
        Ok(Response::new(pb::GetQueueStatsResponse {
            name,
            stats: Some(convert::stats_pb(s)),
        }))
    }

    async fn browse(&self, req: Request<pb::BrowseRequest>) -> Rpc<pb::BrowseResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Consume, &r.queue)?;
        // Browse reads records and bodies from the store: off the async
        // workers.
        let broker = Arc::clone(&self.broker);
        let page = tokio::task::spawn_blocking(move || {
            broker.browse(&r.queue, r.max_messages, &r.page_token)
        })
        .await
        .map_err(|e| Status::internal(format!("browse stopped: {e}")))?
        .map_err(to_status)?;
        Ok(Response::new(pb::BrowseResponse {
            messages: page.messages.into_iter().map(convert::browsed_pb).collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn list_groups(
        &self,
        req: Request<pb::ListGroupsRequest>,
    ) -> Rpc<pb::ListGroupsResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow_any(&p, &r.queue)?;
        let only = convert::group_state_from("state", r.state).map_err(to_status)?;
        let (groups, next) = self
            .broker
            .list_groups(&r.queue, r.page_size, page_token(&r.page_token), only)
            .map_err(to_status)?;
        Ok(Response::new(pb::ListGroupsResponse {
            groups: groups.into_iter().map(convert::group_pb).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn skip_head(&self, req: Request<pb::SkipHeadRequest>) -> Rpc<pb::SkipHeadResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.queue)?;
        let id = self
            .broker
            .skip_head(&r.queue, &r.group_id, &r.note)
            .await
            .map_err(to_status)?;
        p.audit(
            "group.skip_head",
            &r.queue,
            &format!("group={} message_id={id}", r.group_id),
        );
        Ok(Response::new(pb::SkipHeadResponse { message_id: id }))
    }

    async fn create_exchange(
        &self,
        req: Request<pb::CreateExchangeRequest>,
    ) -> Rpc<pb::CreateExchangeResponse> {
        let p = self.caller(&req).await?;
        let name = req.into_inner().name;
        allow(&p, Action::Admin, &name)?;
        let (x, created) = self
            .broker
            .create_exchange(&name)
            .await
            .map_err(to_status)?;
        if created {
            p.audit("exchange.create", &name, "");
        }
        Ok(Response::new(pb::CreateExchangeResponse {
            exchange: Some(convert::exchange_pb(x)),
            created,
        }))
    }

    async fn get_exchange(
        &self,
        req: Request<pb::GetExchangeRequest>,
    ) -> Rpc<pb::GetExchangeResponse> {
        let p = self.caller(&req).await?;
        let name = req.into_inner().name;
        allow_any(&p, &name)?;
        let x = self.broker.get_exchange(&name).map_err(to_status)?;
        Ok(Response::new(pb::GetExchangeResponse {
            exchange: Some(convert::exchange_pb(x)),
        }))
    }

    async fn list_exchanges(
        &self,
        req: Request<pb::ListExchangesRequest>,
    ) -> Rpc<pb::ListExchangesResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        let (xs, next) = self
            .broker
            .list_exchanges(r.page_size, page_token(&r.page_token))
            .map_err(to_status)?;
        Ok(Response::new(pb::ListExchangesResponse {
            exchanges: xs
                .into_iter()
                .filter(|x| p.sees(&x.name))
                .map(convert::exchange_pb)
                .collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn delete_exchange(
        &self,
        req: Request<pb::DeleteExchangeRequest>,
    ) -> Rpc<pb::DeleteExchangeResponse> {
        let p = self.caller(&req).await?;
        let name = req.into_inner().name;
        allow(&p, Action::Admin, &name)?;
        self.broker
            .delete_exchange(&name)
            .await
            .map_err(to_status)?;
        p.audit("exchange.delete", &name, "");
        Ok(Response::new(pb::DeleteExchangeResponse {}))
    }

    async fn bind(&self, req: Request<pb::BindRequest>) -> Rpc<pb::BindResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        let b = r.binding.unwrap_or_default();
        allow(&p, Action::Admin, &r.exchange)?;
        allow(&p, Action::Admin, &b.queue)?;
        let x = self
            .broker
            .bind(&r.exchange, &b.queue, b.filter.into_iter().collect())
            .await
            .map_err(to_status)?;
        p.audit("exchange.bind", &r.exchange, &format!("queue={}", b.queue));
        Ok(Response::new(pb::BindResponse {
            exchange: Some(convert::exchange_pb(x)),
        }))
    }

    async fn unbind(&self, req: Request<pb::UnbindRequest>) -> Rpc<pb::UnbindResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.exchange)?;
        allow(&p, Action::Admin, &r.queue)?;
        let x = self
            .broker
            .unbind(&r.exchange, &r.queue)
            .await
            .map_err(to_status)?;
        p.audit(
            "exchange.unbind",
            &r.exchange,
            &format!("queue={}", r.queue),
        );
        Ok(Response::new(pb::UnbindResponse {
            exchange: Some(convert::exchange_pb(x)),
        }))
    }

    type RedriveStream = ReceiverStream<Result<pb::RedriveResponse, Status>>;

    async fn redrive(&self, req: Request<pb::RedriveRequest>) -> Rpc<Self::RedriveStream> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.queue)?;
        if r.target.is_empty() {
            // Back to the queues that dead-lettered them.
            let dlq = self.broker.get_queue(&r.queue).map_err(to_status)?;
            for source in &dlq.dead_letter_sources {
                allow(&p, Action::Publish, source)?;
            }
        } else {
            allow(&p, Action::Publish, &r.target)?;
        }
        Ok(Response::new(self.start_redrive(r, p)?))
    }

    async fn export_definitions(
        &self,
        req: Request<pb::ExportDefinitionsRequest>,
    ) -> Rpc<pb::ExportDefinitionsResponse> {
        let p = self.caller(&req).await?;
        if !p.allows_all(Action::Admin) {
            return Err(Status::permission_denied(format!(
                "principal {:?} needs admin on \"*\" to export definitions",
                p.name()
            )));
        }
        let defs = self.broker.export_definitions();
        let json =
            serde_json::to_string_pretty(&defs).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::ExportDefinitionsResponse { json }))
    }

    async fn import_definitions(
        &self,
        req: Request<pb::ImportDefinitionsRequest>,
    ) -> Rpc<pb::ImportDefinitionsResponse> {
        let p = self.caller(&req).await?;
        if !p.allows_all(Action::Admin) {
            return Err(Status::permission_denied(format!(
                "principal {:?} needs admin on \"*\" to import definitions",
                p.name()
            )));
        }
        let r = self
            .broker
            .import_definitions_json(&req.into_inner().json)
            .await
            .map_err(to_status)?;
        p.audit(
            "definitions.import",
            "*",
            &format!(
                "queues_created={} exchanges_created={} bindings_changed={}",
                r.queues_created, r.exchanges_created, r.bindings_changed
            ),
        );
        Ok(Response::new(pb::ImportDefinitionsResponse {
            queues_created: r.queues_created,
            exchanges_created: r.exchanges_created,
            bindings_changed: r.bindings_changed,
        }))
    }

    async fn release_group(
        &self,
        req: Request<pb::ReleaseGroupRequest>,
    ) -> Rpc<pb::ReleaseGroupResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Admin, &r.queue)?;
        let id = self
            .broker
            .release_group(&r.queue, &r.group_id)
            .await
            .map_err(to_status)?;
        p.audit(
            "group.release",
            &r.queue,
            &format!("group={} head_message_id={id}", r.group_id),
        );
        Ok(Response::new(pb::ReleaseGroupResponse {
            head_message_id: id,
        }))
    }
}

impl Service {
    /// Runs a redrive on a session task, streaming its progress.
    fn start_redrive(
        &self,
        r: pb::RedriveRequest,
        p: Caller,
    ) -> Result<ReceiverStream<Result<pb::RedriveResponse, Status>>, Status> {
        let spec = convert::redrive_spec(&r).map_err(to_status)?;
        let end = self.broker.start_redrive(&spec).map_err(to_status)?;
        p.audit(
            "redrive.start",
            &r.queue,
            &format!(
                "target={} dry_run={} limit={} rate={}",
                if r.target.is_empty() {
                    "(sources)"
                } else {
                    &r.target
                },
                r.dry_run,
                r.limit,
                r.rate_per_second
            ),
        );
        let (tx, rx) = mpsc::channel(4);
        self.sessions.spawn(
            redrive::run(
                Arc::clone(&self.broker),
                spec,
                end,
                r.limit,
                r.rate_per_second,
                tx,
                p,
            )
            .instrument(tracing::Span::current()),
        );
        Ok(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl MessagingService for Service {
    type PublishStreamStream = ReceiverStream<Result<pb::PublishStreamResponse, Status>>;

    async fn publish_stream(
        &self,
        req: Request<Streaming<pb::PublishStreamRequest>>,
    ) -> Rpc<Self::PublishStreamStream> {
        let p = self.caller(&req).await?;
        let (tx, rx) = mpsc::channel(64);
        self.sessions.spawn(
            publish_stream::session(Arc::clone(&self.broker), p, req.into_inner(), tx)
                .instrument(tracing::Span::current()),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type SubscribeStream = ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(
        &self,
        req: Request<Streaming<pb::SubscribeRequest>>,
    ) -> Rpc<Self::SubscribeStream> {
        let p = self.caller(&req).await?;
        let mut inbound = req.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before its open message"))?;
        let Some(pb::subscribe_request::Kind::Open(open)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message of a Subscribe stream must be `open`",
            ));
        };
        allow(&p, Action::Consume, &open.queue)?;
        let sub = subscribe::open(&self.broker, &open).map_err(to_status)?;
        let (tx, rx) = mpsc::channel(4);
        let consumer = self.consumers.subscribed(&open.queue);
        let session = subscribe::session(Arc::clone(&self.broker), p, sub, inbound, tx);
        self.sessions.spawn(
            async move {
                session.await;
                drop(consumer);
            }
            .instrument(tracing::Span::current()),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn publish(&self, req: Request<pb::PublishRequest>) -> Rpc<pb::PublishResponse> {
        let p = self.caller(&req).await?;
        let r = req.into_inner();
        allow(&p, Action::Publish, publish_target(&r))?;
        tracing::debug!(queue = %r.queue, messages = r.messages.len(), "publish");
        let msgs = r.messages.into_iter().map(convert::new_message).collect();
        let to = Destination::of(&r.queue, &r.exchange, "queue").map_err(to_status)?;
        let results = self.broker.publish_to(&to, msgs).await.map_err(to_status)?;
        tracing::debug!(
            message_ids = ?results.iter().map(|p| p.message_id.as_str()).collect::<Vec<_>>(),
            "published"
        );
        Ok(Response::new(pb::PublishResponse {
            results: results
                .into_iter()
                .map(|p| pb::PublishResult {
                    message_id: p.message_id,
                    duplicate: p.duplicate,
                    routed_to: p.routed_to,
                })
                .collect(),
        }))
    }

    async fn receive(&self, req: Request<pb::ReceiveRequest>) -> Rpc<pb::ReceiveResponse> {
        let p = self.caller(&req).await?;
        let peer = req.remote_addr();
        let r = req.into_inner();
        allow(&p, Action::Consume, &r.queue)?;
        allow_tokens(&p, &self.broker, r.ack_tokens.iter().map(String::as_str))?;
        let opts = ReceiveOptions {
            max_messages: r.max_messages,
            wait: r.wait_ms,
            ack_timeout: r.ack_timeout_ms,
            auto_ack: r.auto_ack,
            max_per_group: r.max_per_group,
        };
        let answer = self
            .broker
            .receive_acking(&r.queue, opts, &r.ack_tokens)
            .await
            .map_err(to_status)?;
        if let Some(peer) = peer {
            self.consumers
                .received(&r.queue, peer, std::time::Instant::now());
        }
        // The acks took effect; a receive that failed after them is told in
        // the answer, beside their outcomes.
        let (got, receive_code, receive_error) = match answer.received {
            Ok(got) => (got, 0, String::new()),
            Err(e) => {
                let status = to_status(e);
                tracing::debug!(queue = %r.queue, error = %status.message(), "receive failed after its acks");
                (
                    Vec::new(),
                    status.code() as i32,
                    status.message().to_string(),
                )
            }
        };
        tracing::debug!(
            queue = %r.queue,
            message_ids = ?got.iter().map(|d| d.message_id.as_str()).collect::<Vec<_>>(),
            acks = r.ack_tokens.len(),
            "receive"
        );
        Ok(Response::new(pb::ReceiveResponse {
            deliveries: got.into_iter().map(convert::delivery_pb).collect(),
            ack_results: r
                .ack_tokens
                .into_iter()
                .zip(answer.acks)
                .map(|(t, s)| convert::settle_pb(t, s))
                .collect(),
            receive_code,
            receive_error,
        }))
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Rpc<pb::AckResponse> {
        let p = self.caller(&req).await?;
        let tokens = req.into_inner().ack_tokens;
        allow_tokens(&p, &self.broker, tokens.iter().map(String::as_str))?;
        let results = self.broker.ack(&tokens).await.map_err(to_status)?;
        Ok(Response::new(pb::AckResponse {
            results: tokens
                .into_iter()
                .zip(results)
                .map(|(t, s)| convert::settle_pb(t, s))
                .collect(),
        }))
    }

    async fn nack(&self, req: Request<pb::NackRequest>) -> Rpc<pb::NackResponse> {
        let p = self.caller(&req).await?;
        let items: Vec<Nack> = req
            .into_inner()
            .items
            .into_iter()
            .map(|i| Nack {
                token: i.ack_token,
                delay: i.delay_ms,
                reason: i.reason,
                dead_letter: i.dead_letter,
            })
            .collect();
        allow_tokens(&p, &self.broker, items.iter().map(|i| i.token.as_str()))?;
        let (results, released) = self
            .broker
            .nack_releasing(&items)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::NackResponse {
            results: items
                .into_iter()
                .zip(results)
                .map(|(i, s)| convert::settle_pb(i.token, s))
                .collect(),
            released: convert::released_pb(released),
        }))
    }

    async fn extend_lease(
        &self,
        req: Request<pb::ExtendLeaseRequest>,
    ) -> Rpc<pb::ExtendLeaseResponse> {
        let p = self.caller(&req).await?;
        let items: Vec<(String, u64)> = req
            .into_inner()
            .items
            .into_iter()
            .map(|i| (i.ack_token, i.timeout_ms))
            .collect();
        allow_tokens(&p, &self.broker, items.iter().map(|(t, _)| t.as_str()))?;
        let results = self.broker.extend(&items).await.map_err(to_status)?;
        Ok(Response::new(pb::ExtendLeaseResponse {
            results: items
                .into_iter()
                .zip(results)
                .map(|((t, _), s)| convert::settle_pb(t, s))
                .collect(),
        }))
    }
}
