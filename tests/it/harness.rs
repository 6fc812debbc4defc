//! Test servers: the real `letterbox` binary on a temporary data
//! directory and a port chosen by the OS, or an in-process server with a
//! manual clock. Each test owns its server; none is leaked.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::Arc;
use std::time::Duration;

use letterbox::clock::ManualClock;
use letterbox::launch::Serve;
use letterbox::pb;
use letterbox::pb::admin_service_client::AdminServiceClient;
use letterbox::pb::messaging_service_client::MessagingServiceClient;
use letterbox::server::{RemoteStore, Server, ServerConfig};
use tonic::transport::Channel;

/// Flags every test server gets: small log segments so that start-up and
/// disk use stay small.
const TEST_FLAGS: &[(&str, &str)] = &[("--wal-segment-size", "1MiB"), ("--min-free-disk", "0")];

/// The PostgreSQL the suite runs against, when `LETTERBOX_TEST_PG` holds
/// its admin URL (`tools/services/pg-local.sh start` prints one): every test server
/// then keeps its state in a database of its own there (`--store`) instead
/// of its data directory.
pub fn test_pg() -> Option<String> {
    std::env::var("LETTERBOX_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
}

/// A new, empty database on the suite's PostgreSQL at `admin`; its URL.
pub async fn fresh_database(admin: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "lb_it_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let (client, conn) = tokio_postgres::connect(admin, tokio_postgres::NoTls)
        .await
        .expect("connect to LETTERBOX_TEST_PG");
    let conn = tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    drop(client);
    let _ = conn.await;
    let (base, query) = admin.split_once('?').unwrap_or((admin, ""));
    let (server, _) = base.rsplit_once('/').expect("an admin URL with a database");
    if query.is_empty() {
        format!("{server}/{name}")
    } else {
        format!("{server}/{name}?{query}")
    }
}

/// gRPC clients of one server.
#[derive(Clone)]
pub struct Clients {
    pub admin: AdminServiceClient<Channel>,
    pub msg: MessagingServiceClient<Channel>,
}

pub async fn connect(addr: SocketAddr) -> Clients {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    Clients {
        admin: AdminServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20),
        msg: MessagingServiceClient::new(channel).max_decoding_message_size(64 << 20),
    }
}

/// The real binary, run as a child process.
pub struct TestServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    pub addr: SocketAddr,
    /// The Anypoint MQ REST address, when started with `--anypoint-listen`.
    pub anypoint: Option<SocketAddr>,
    /// The SQS endpoint's address, when started with `--sqs-listen`.
    pub sqs: Option<SocketAddr>,
    args: Vec<String>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_with(&[]).await
    }

    pub async fn start_with(args: &[&str]) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        if let Some(admin) = test_pg()
            && !args.iter().any(|a| a.starts_with("--store"))
        {
            let url = fresh_database(&admin).await;
            args.extend(["--store".into(), url, "--node-name".into(), "it".into()]);
        }
        let (child, a) = spawn_announced(
            &dir.path().join("data"),
            &dir.path().join("server.log"),
            &args,
        )
        .expect("server starts");
        TestServer {
            dir,
            child: Some(child),
            addr: a.grpc.expect("address"),
            anypoint: a.anypoint,
            sqs: sqs_addr(&a),
            args,
        }
    }

    /// The server process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub async fn clients(&self) -> Clients {
        connect(self.addr).await
    }

    /// SIGKILL: no destructor, no flush, no checkpoint.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: a graceful shutdown. Waits without blocking the
    /// runtime, so that this test's clients can answer the server's
    /// shutdown handshake.
    pub async fn stop(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_raw(i32::try_from(c.id()).expect("pid")).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("signal");
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts again on the same data directory (after `kill` or `stop`).
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill first");
        let (child, a) = spawn_announced(
            &self.data_dir(),
            &self.dir.path().join("server.log"),
            &self.args,
        )
        .expect("server restarts");
        self.child = Some(child);
        self.addr = a.grpc.expect("address");
        self.anypoint = a.anypoint;
        self.sqs = sqs_addr(&a);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts the binary; returns it and the address from its first line of
/// output, or what it printed if it exited instead.
pub fn spawn(data: &Path, log: &Path, args: &[String]) -> Result<(Child, SocketAddr), String> {
    spawn_full(data, log, args).map(|(c, a, _)| (c, a))
}

/// The SQS endpoint's address of what a server printed.
fn sqs_addr(a: &letterbox::launch::Announced) -> Option<SocketAddr> {
    a.sqs
        .as_deref()
        .and_then(|u| u.strip_prefix("http://"))
        .and_then(|u| u.trim_end_matches('/').parse().ok())
}

/// [`spawn`], also reading the Anypoint MQ REST address from the second
/// line when `args` turn it on.
pub fn spawn_full(
    data: &Path,
    log: &Path,
    args: &[String],
) -> Result<(Child, SocketAddr, Option<SocketAddr>), String> {
    let (child, a) = spawn_announced(data, log, args)?;
    Ok((child, a.grpc.expect("address"), a.anypoint))
}

/// Starts the binary; returns it and what it announced (the gRPC
/// address, and those of the listeners `args` turn on: Anypoint MQ REST,
/// SQS).
pub fn spawn_announced(
    data: &Path,
    log: &Path,
    args: &[String],
) -> Result<(Child, letterbox::launch::Announced), String> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let defaults = TEST_FLAGS
        .iter()
        .filter(|(flag, _)| !args.iter().any(|a| a.starts_with(flag)))
        .flat_map(|(flag, value)| [*flag, *value]);
    let listen: &[&str] = if args.iter().any(|a| a.starts_with("--listen")) {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let mut serve = Serve::new(env!("CARGO_BIN_EXE_letterbox"), data);
    serve
        .command()
        .args(listen)
        .args(defaults)
        .args(args)
        .env("LETTERBOX_LOG", "info");
    let anypoint = args.iter().any(|a| a.starts_with("--anypoint-listen"));
    let sqs = args
        .iter()
        .position(|a| a == "--sqs-listen")
        .and_then(|i| args.get(i + 1))
        .is_some_and(|v| v != "off");
    let mut served = serve.spawn(log_file).expect("spawn letterbox");
    match served.wait_blocking(
        |a| a.grpc.is_some() && (!anypoint || a.anypoint.is_some()) && (!sqs || a.sqs.is_some()),
        Duration::from_secs(60),
    ) {
        Ok(()) => Ok((served.child, served.announced)),
        Err(e) => Err(format!(
            "{e}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )),
    }
}

/// A server in this process, with a manual clock.
pub struct InProc {
    pub clock: Arc<ManualClock>,
    pub addr: SocketAddr,
    /// The Anypoint MQ REST address, when the configuration turned it on.
    pub anypoint: Option<SocketAddr>,
    /// The web console's address, when the configuration turned it on.
    pub console: Option<SocketAddr>,
    /// The metrics endpoint's address, when the configuration turned it on.
    pub metrics: Option<SocketAddr>,
    /// The SQS endpoint's address, when the configuration turned it on.
    pub sqs: Option<SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

pub const T0: u64 = 1_700_000_000_000;

impl InProc {
    pub async fn start() -> InProc {
        InProc::start_with(|_| {}).await
    }

    /// Starts with the test defaults changed by `change`.
    pub async fn start_with(change: impl FnOnce(&mut ServerConfig)) -> InProc {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(T0));
        let mut config = ServerConfig::new(
            dir.path().join("data"),
            "127.0.0.1:0".parse().expect("addr"),
        );
        config.store.segment_size = 1 << 20;
        config.store.min_free_bytes = 0;
        config.broker.sweep_interval = Duration::from_millis(10);
        if let Some(admin) = test_pg() {
            config.remote = Some(RemoteStore {
                url: fresh_database(&admin).await,
                node: "it".into(),
                lease_ttl: Duration::from_secs(10),
                standby: false,
            });
        }
        change(&mut config);
        let server = Server::start(config, clock.clone()).await.expect("start");
        let addr = server.local_addr();
        let anypoint = server.anypoint_addr();
        let console = server.console_addr();
        let metrics = server.metrics_addr();
        let sqs = server.sqs_addr();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(async {
                    let _ = rx.await;
                })
                .await
                .expect("serve");
        });
        InProc {
            clock,
            addr,
            anypoint,
            console,
            metrics,
            sqs,
            stop: Some(tx),
            task: Some(task),
            _dir: dir,
        }
    }

    pub async fn clients(&self) -> Clients {
        connect(self.addr).await
    }

    /// Moves the clock and waits for the sweeper to act on it.
    pub async fn advance(&self, ms: u64) {
        self.clock.advance(ms);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("server task");
        }
    }
}

// ---- request helpers ----------------------------------------------------

pub fn msg(body: &str) -> pb::PublishMessage {
    pb::PublishMessage {
        body: body.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

pub fn config() -> pb::QueueConfig {
    pb::QueueConfig::default()
}

pub fn with_dlq(dlq: &str, max: u32) -> pb::QueueConfig {
    pb::QueueConfig {
        dead_letter: Some(pb::DeadLetterPolicy {
            queue: dlq.into(),
            max_deliveries: max,
        }),
        ..Default::default()
    }
}

impl Clients {
    /// Opens a `PublishStream`: requests go in through the sender (the
    /// stream ends when it is dropped), answers come out of the stream.
    pub async fn publish_stream(
        &mut self,
        capacity: usize,
    ) -> (
        tokio::sync::mpsc::Sender<pb::PublishStreamRequest>,
        tonic::Streaming<pb::PublishStreamResponse>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(capacity);
        let answers = self
            .msg
            .publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        (tx, answers)
    }

    pub async fn create(&mut self, name: &str, config: pb::QueueConfig) -> pb::Queue {
        self.admin
            .create_queue(pb::CreateQueueRequest {
                name: name.into(),
                config: Some(config),
            })
            .await
            .expect("create queue")
            .into_inner()
            .queue
            .expect("queue")
    }

    pub async fn publish(&mut self, queue: &str, bodies: &[&str]) -> Vec<String> {
        self.msg
            .publish(pb::PublishRequest {
                queue: queue.into(),
                messages: bodies.iter().map(|b| msg(b)).collect(),
                ..Default::default()
            })
            .await
            .expect("publish")
            .into_inner()
            .results
            .into_iter()
            .map(|r| r.message_id)
            .collect()
    }

    pub async fn receive(&mut self, queue: &str, max: u32) -> Vec<pb::Delivery> {
        self.receive_with(pb::ReceiveRequest {
            queue: queue.into(),
            max_messages: max,
            ..Default::default()
        })
        .await
    }

    pub async fn receive_with(&mut self, req: pb::ReceiveRequest) -> Vec<pb::Delivery> {
        self.msg
            .receive(req)
            .await
            .expect("receive")
            .into_inner()
            .deliveries
    }

    pub async fn ack(&mut self, tokens: &[&str]) -> Vec<pb::SettleResult> {
        self.msg
            .ack(pb::AckRequest {
                ack_tokens: tokens.iter().map(|t| t.to_string()).collect(),
            })
            .await
            .expect("ack")
            .into_inner()
            .results
    }

    pub async fn nack(&mut self, token: &str, reason: &str) -> pb::SettleResult {
        self.msg
            .nack(pb::NackRequest {
                items: vec![pb::NackItem {
                    ack_token: token.into(),
                    reason: reason.into(),
                    ..Default::default()
                }],
            })
            .await
            .expect("nack")
            .into_inner()
            .results
            .remove(0)
    }

    pub async fn stats(&mut self, queue: &str) -> pb::QueueStats {
        self.admin
            .get_queue_stats(pb::GetQueueStatsRequest { name: queue.into() })
            .await
            .expect("stats")
            .into_inner()
            .stats
            .expect("stats")
    }

    pub async fn browse(&mut self, queue: &str) -> Vec<pb::BrowsedMessage> {
        self.admin
            .browse(pb::BrowseRequest {
                queue: queue.into(),
                max_messages: 1000,
                page_token: String::new(),
            })
            .await
            .expect("browse")
            .into_inner()
            .messages
    }
}

pub fn body(d: &pb::Delivery) -> String {
    String::from_utf8(d.body.to_vec()).expect("utf8")
}

pub fn ok(r: &pb::SettleResult) -> bool {
    r.status == pb::SettleStatus::Ok as i32
}

/// Asserts a call failed with `code` and a message containing `needle`.
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(
    r: Result<T, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) {
    match r {
        Ok(v) => panic!("expected {code:?} containing {needle:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "status {s:?}");
            assert!(
                s.message().contains(needle),
                "message {:?} does not contain {needle:?}",
                s.message()
            );
        }
    }
}

/// The binary as a client command, with no profile, server, context,
/// token or CA of the user's own in the way.
pub fn letterbox() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_letterbox"));
    c.env("LETTERBOX_CONFIG_HOME", "/nonexistent/letterbox-config")
        .env_remove("LETTERBOX_SERVER")
        .env_remove("LETTERBOX_CONTEXT")
        .env_remove("LETTERBOX_TOKEN")
        .env_remove("LETTERBOX_CA_CERT");
    c
}
