//! PublishStream against a server in this process, whose store's applier
//! a test can hold (`Store::hold_applier`): what a session does while a
//! publish waits for room in the store.

use std::sync::Arc;
use std::time::Duration;

use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};

use super::Service;
use crate::auth::Authenticator;
use crate::clock::SystemClock;
use crate::pb;
use crate::pb::messaging_service_client::MessagingServiceClient;
use crate::pb::messaging_service_server::MessagingServiceServer;
use crate::queue::model::QueueConfigInput;
use crate::queue::{Broker, BrokerOptions};
use crate::storage::{Store, StoreOptions};

fn publish(n: usize, size: usize) -> pb::PublishRequest {
    pb::PublishRequest {
        queue: "q".into(),
        messages: (0..n)
            .map(|_| pb::PublishMessage {
                body: vec![b'x'; size].into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The next answer of a publish stream, within 20 s (`late` otherwise).
async fn next_answer(
    answers: &mut tonic::Streaming<pb::PublishStreamResponse>,
    late: &str,
) -> pb::PublishStreamResponse {
    tokio::time::timeout(Duration::from_secs(20), answers.message())
        .await
        .expect(late)
        .expect("answer")
        .expect("an answer")
}

/// A publish that finds the store over its bound of unapplied changes
/// waits for room, and meanwhile the session answers the publishes before
/// it as they become durable. The applier is held, so the wait lasts until
/// the test lets it go: the first answer can only arrive during the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_go_out_while_a_publish_waits_for_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = StoreOptions {
        segment_size: 16 << 20,
        min_free_bytes: 0,
        max_unapplied_bytes: 1 << 20,
        apply_interval: Duration::from_secs(3600),
        checkpoint_interval: Duration::from_secs(3600),
        ..StoreOptions::default()
    };
    let (store, _) = Store::open(dir.path(), opts).expect("store");
    let (frozen_tx, frozen) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    store.hold_applier(frozen_tx, release_rx);
    let broker = Arc::new(
        Broker::open(store, Arc::new(SystemClock), BrokerOptions::default()).expect("broker"),
    );
    broker
        .create_queue("q", &QueueConfigInput::default())
        .await
        .expect("create");
    let service = Service::new(
        Arc::clone(&broker),
        tokio_util::task::TaskTracker::new(),
        Arc::new(Authenticator::disabled()),
        Arc::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MessagingServiceServer::new(service))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let mut client = MessagingServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    // 3 MB, over the bound of 1 MiB once stored; then a small publish,
    // which finds no room and wakes the applier, which is held.
    for (sequence, p) in [publish(30, 100_000), publish(1, 100)]
        .into_iter()
        .enumerate()
    {
        tx.send(pb::PublishStreamRequest {
            sequence: sequence as u64,
            publish: Some(p),
        })
        .await
        .expect("send");
    }
    let mut answers = client
        .publish_stream(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let waited = tokio::task::spawn_blocking(move || frozen.recv_timeout(Duration::from_secs(20)))
        .await
        .expect("join");
    waited.expect("the second publish never woke the applier");
    let first = next_answer(
        &mut answers,
        "no answer while the second publish waits for room",
    )
    .await;
    assert_eq!(
        (first.sequence, first.code, first.results.len()),
        (0, 0, 30)
    );
    // The second cannot be answered before the applier makes room.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), answers.message())
            .await
            .is_err(),
        "answered without room"
    );
    release.send(()).expect("release");
    let second = next_answer(&mut answers, "the second publish waited for good").await;
    assert_eq!(
        (second.sequence, second.code, second.results.len()),
        (1, 0, 1)
    );
    drop(tx);
    server.abort();
}
