//! `tonic-floor`: what tonic itself allows on this machine, the floor
//! Letterbox's calls are measured against.
//!
//! A bare tonic server of `letterbox.v1.MessagingService` with the same
//! tonic, the same transport settings as `letterbox serve` (HTTP/2
//! keepalive, concurrent streams, concurrency limit per connection,
//! timeout, `TCP_NODELAY`) and empty handlers: `Publish` answers one
//! result per message at once, `PublishStream` answers each request at
//! once, in order; nothing is stored, no layer of Letterbox's own runs.
//! Every other method is UNIMPLEMENTED. Drive it with
//! `loadgen run --target tonic-floor --letterbox-url http://ADDR` (the
//! same client code as `--target letterbox`).
//!
//! ```text
//! tonic-floor --listen 127.0.0.1:50061
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use letterbox::pb;
use letterbox::pb::messaging_service_server::{MessagingService, MessagingServiceServer};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

#[derive(Parser)]
#[command(
    name = "tonic-floor",
    about = "A bare tonic server with empty handlers: the floor of a gRPC call's cost"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50061")]
    listen: SocketAddr,
    /// Worker threads of the runtime (0: one per core, as `letterbox serve`).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// The defaults of `letterbox serve` (`letterbox::server::Limits`).
const MAX_CONCURRENT_STREAMS: u32 = 1024;
const CONCURRENCY_PER_CONNECTION: usize = 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const KEEPALIVE: Duration = Duration::from_secs(30);

struct Floor;

type Rpc<T> = Result<Response<T>, Status>;

fn results(n: usize) -> Vec<pb::PublishResult> {
    (0..n).map(|_| pb::PublishResult::default()).collect()
}

#[tonic::async_trait]
impl MessagingService for Floor {
    async fn publish(&self, req: Request<pb::PublishRequest>) -> Rpc<pb::PublishResponse> {
        let n = req.get_ref().messages.len();
        Ok(Response::new(pb::PublishResponse {
            results: results(n),
        }))
    }

    async fn receive(&self, _: Request<pb::ReceiveRequest>) -> Rpc<pb::ReceiveResponse> {
        Err(Status::unimplemented(
            "tonic-floor: Publish and PublishStream only",
        ))
    }

    async fn ack(&self, _: Request<pb::AckRequest>) -> Rpc<pb::AckResponse> {
        Err(Status::unimplemented(
            "tonic-floor: Publish and PublishStream only",
        ))
    }

    async fn nack(&self, _: Request<pb::NackRequest>) -> Rpc<pb::NackResponse> {
        Err(Status::unimplemented(
            "tonic-floor: Publish and PublishStream only",
        ))
    }

    async fn extend_lease(
        &self,
        _: Request<pb::ExtendLeaseRequest>,
    ) -> Rpc<pb::ExtendLeaseResponse> {
        Err(Status::unimplemented(
            "tonic-floor: Publish and PublishStream only",
        ))
    }

    type PublishStreamStream = ReceiverStream<Result<pb::PublishStreamResponse, Status>>;

    async fn publish_stream(
        &self,
        req: Request<Streaming<pb::PublishStreamRequest>>,
    ) -> Rpc<Self::PublishStreamStream> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            while let Some(Ok(r)) = inbound.next().await {
                let n = r.publish.map_or(0, |p| p.messages.len());
                let answer = pb::PublishStreamResponse {
                    sequence: r.sequence,
                    results: results(n),
                    ..Default::default()
                };
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type SubscribeStream = ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(
        &self,
        _: Request<Streaming<pb::SubscribeRequest>>,
    ) -> Rpc<Self::SubscribeStream> {
        Err(Status::unimplemented(
            "tonic-floor: Publish and PublishStream only",
        ))
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if args.threads > 0 {
        rt.worker_threads(args.threads);
    }
    rt.enable_all().build()?.block_on(serve(args.listen))
}

async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("tonic-floor listening on {}", listener.local_addr()?);
    let incoming = TcpListenerStream::new(listener).map(|c| {
        c.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .concurrency_limit_per_connection(CONCURRENCY_PER_CONNECTION)
        .timeout(REQUEST_TIMEOUT)
        .add_service(MessagingServiceServer::new(Floor))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
