//! Slow and hostile clients against the connection limits: a flood of
//! connections that trickle their HTTP/1 request heads or send only the
//! HTTP/2 preface from one address locks no other address out of any
//! listener; a flood of one listener leaves the others their share; a
//! request head that trickles in is cut at its deadline, and a connection
//! that never asks for anything is closed at the handshake deadline;
//! listener reserves that do not fit in the cap stop the start.
//!
//! Loopback has a whole network (127.0.0.0/8), so the clients here come
//! from addresses of their own: the flood from 127.0.0.1 (or from
//! 127.0.0.10 and up), the client that must get in from 127.0.0.2.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use letterbox::pb;
use letterbox::pb::admin_service_client::AdminServiceClient;
use letterbox::pb::messaging_service_client::MessagingServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tonic::transport::Endpoint;

use crate::harness::*;

const FLOODER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const OTHER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The HTTP/2 client preface and an empty SETTINGS frame: all a gRPC
/// client sends before its first call.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
/// An HTTP/2 PING frame, the bytes a silent HTTP/2 client may trickle.
const H2_PING: &[u8] = b"\0\0\x08\x06\0\0\0\0\0slowping";
/// The start of an HTTP/1 request head, longer than the 24 bytes the
/// server once took as a finished handshake.
const H1_START: &[u8] = b"GET /queues HTTP/1.1\r\nHost: localhost\r\n";
/// A header trickled a byte at a time after [`H1_START`].
const H1_TRICKLE: &[u8] = b"X-Slow: 1\r\n";

/// A TCP connection to `to` from `from`.
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
    s.connect(to).await
}

/// One connection of a flood: what it sent first and what it trickles.
struct Slow {
    tcp: TcpStream,
    trickle: &'static [u8],
    at: usize,
}

impl Slow {
    /// Opens it and sends its first bytes; `None` when the server closed
    /// it at once.
    async fn open(from: Ipv4Addr, to: SocketAddr, grpc: bool) -> Option<Slow> {
        let mut tcp = connect_from(from, to).await.ok()?;
        let (first, trickle) = if grpc {
            (H2_HELLO, H2_PING)
        } else {
            (H1_START, H1_TRICKLE)
        };
        tcp.write_all(first).await.ok()?;
        Some(Slow {
            tcp,
            trickle,
            at: 0,
        })
    }

    /// A keep-alive HTTP/1 connection that made a whole request, got its
    /// answer and began its next request head; with the moment of the
    /// answer.
    async fn after_a_request(from: Ipv4Addr, to: SocketAddr) -> (Slow, Instant) {
        let mut tcp = connect_from(from, to).await.expect("accepted");
        tcp.write_all(b"GET /nothing-here HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 "), "{:?}", &buf[..n]);
        let answered = Instant::now();
        tcp.write_all(H1_START).await.unwrap();
        let slow = Slow {
            tcp,
            trickle: H1_TRICKLE,
            at: 0,
        };
        (slow, answered)
    }

    /// Sends the next trickled byte (an HTTP/2 client, a whole PING),
    /// without waiting.
    fn drip(&mut self) {
        let bytes = if self.trickle == H2_PING {
            self.trickle
        } else {
            let b = &self.trickle[self.at..=self.at];
            self.at = (self.at + 1) % self.trickle.len();
            b
        };
        let _ = self.tcp.try_write(bytes);
    }

    /// True once the server has closed the connection (within `wait`).
    async fn closed_within(&mut self, wait: Duration) -> bool {
        let mut buf = [0u8; 512];
        tokio::time::timeout(wait, async {
            loop {
                match self.tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }
}

/// Trickles a byte on every connection of `flood` each `every`, until
/// aborted.
fn trickle(mut flood: Vec<Slow>, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            for s in &mut flood {
                s.drip();
            }
        }
    })
}

/// gRPC clients on a connection from `from`.
async fn grpc_from(from: Ipv4Addr, to: SocketAddr) -> Result<Clients, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("http://{to}"))
        .expect("uri")
        .local_address(Some(IpAddr::V4(from)))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await?;
    Ok(Clients {
        admin: AdminServiceClient::new(channel.clone()),
        msg: MessagingServiceClient::new(channel),
    })
}

/// An HTTP/1 client on one connection from `from`.
struct H1 {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

/// An answer: status, headers and body.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl H1 {
    async fn open(from: Ipv4Addr, to: SocketAddr) -> Result<H1, String> {
        let tcp = connect_from(from, to).await.map_err(|e| e.to_string())?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(H1 {
            send,
            host: to.to_string(),
        })
    }

    async fn call(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Result<Answer, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        // The connection takes the next request once it is done with the
        // last answer.
        self.send.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .send
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// Publishes `body` to `queue` over gRPC from `from`.
async fn publish_grpc(
    from: Ipv4Addr,
    to: SocketAddr,
    queue: &str,
    body: &str,
) -> Result<(), String> {
    let mut c = grpc_from(from, to).await.map_err(|e| format!("{e:?}"))?;
    c.msg
        .publish(pb::PublishRequest {
            queue: queue.into(),
            messages: vec![msg(body)],
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Publishes `body` to `queue` through the Anypoint MQ REST facade from
/// `from`: authorize, then publish.
async fn publish_rest(
    from: Ipv4Addr,
    to: SocketAddr,
    queue: &str,
    body: &str,
) -> Result<(), String> {
    let mut h = H1::open(from, to).await?;
    let auth = h
        .call(
            Method::POST,
            "/api/v1/authorize",
            &[("content-type", "application/x-www-form-urlencoded")],
            "client_id=app&client_secret=secret&grant_type=client_credentials".into(),
        )
        .await?;
    if auth.status != 200 {
        return Err(format!("authorize: {} {}", auth.status, auth.body));
    }
    let token: serde_json::Value = serde_json::from_str(&auth.body).map_err(|e| e.to_string())?;
    let token = token["access_token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let id = format!("rest-{body}");
    let msg = serde_json::json!({"headers": {"messageId": id}, "properties": {}, "body": body});
    let put = h
        .call(
            Method::PUT,
            &format!("/api/v1/organizations/o/environments/e/destinations/{queue}/messages/{id}"),
            &[
                ("content-type", "application/json"),
                ("authorization", &format!("bearer {token}")),
            ],
            msg.to_string(),
        )
        .await?;
    if put.status != 201 {
        return Err(format!("publish: {} {}", put.status, put.body));
    }
    Ok(())
}

/// Publishes `body` to `queue` from the web console from `from`: its
/// queue page (the session and its CSRF token), then the publish form.
async fn publish_console(
    from: Ipv4Addr,
    to: SocketAddr,
    queue: &str,
    body: &str,
) -> Result<(), String> {
    let mut h = H1::open(from, to).await?;
    let page = h
        .call(Method::GET, &format!("/queues/{queue}"), &[], String::new())
        .await
        .map_err(|e| format!("queue page: {e}"))?;
    if page.status != 200 {
        return Err(format!("queue page: {} {}", page.status, page.body));
    }
    let cookie = page
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .to_string();
    let field = "name=\"csrf\" value=\"";
    let csrf = page
        .body
        .find(field)
        .map(|at| &page.body[at + field.len()..])
        .and_then(|rest| rest.split('"').next())
        .ok_or("no CSRF token on the queue page")?
        .to_string();
    let form = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("csrf", csrf.as_str()), ("body", body)])
        .finish();
    let posted = h
        .call(
            Method::POST,
            &format!("/queues/{queue}/publish"),
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("cookie", &cookie),
            ],
            form,
        )
        .await
        .map_err(|e| format!("publish: {e}"))?;
    if posted.status != 200 || !posted.body.contains("published message") {
        return Err(format!("publish: {} {}", posted.status, posted.body));
    }
    Ok(())
}

/// Runs `what` within a second.
async fn within_a_second(name: &str, what: impl std::future::Future<Output = Result<(), String>>) {
    let started = Instant::now();
    match tokio::time::timeout(Duration::from_secs(1), what).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{name}: failed after {:?}: {e}", started.elapsed()),
        Err(_) => panic!("{name}: not done within a second"),
    }
}

/// Raises this process's soft limit of open files to its hard limit;
/// returns the soft limit then in force.
fn raise_open_files() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// 1,000 connections from 127.0.0.1 spread over the gRPC, REST and
/// console listeners of the binary (its connection settings left at their
/// defaults, under the 1,024 open files of many hosts): the HTTP/1 ones
/// trickle their request heads a byte a second, the gRPC ones sent their
/// HTTP/2 preface and SETTINGS and then only PINGs. A client from
/// 127.0.0.2 still connects and publishes within a second on every
/// listener, and everything published, before the flood and during it, is
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_connections_from_one_address_locks_no_other_address_out() {
    use letterbox::launch::Serve;
    // The flood and this process's other tests need descriptors: as many
    // of the 1,000 as the limit allows, and the server's cap below it so
    // that, without a cap per address, the flood would take every slot.
    let files = raise_open_files();
    let flood_size = usize::try_from(files.saturating_sub(400).min(1000)).unwrap_or(1000);
    assert!(
        flood_size >= 200,
        "the limit of open files ({files}) leaves no room for a flood"
    );
    let server_files = if flood_size >= 1000 {
        1024
    } else {
        flood_size * 3 / 4 + 256
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut serve = Serve::wrapped(
        &[
            "sh",
            "-c",
            &format!("ulimit -n {server_files} && exec \"$@\""),
            "sh",
        ],
        env!("CARGO_BIN_EXE_letterbox"),
        &dir.path().join("data"),
    );
    serve
        .command()
        .args([
            "--listen",
            "127.0.0.1:0",
            "--anypoint-listen",
            "127.0.0.1:0",
            "--console-listen",
            "127.0.0.1:0",
            "--wal-segment-size",
            "1MiB",
            "--min-free-disk",
            "0",
        ])
        .env("LETTERBOX_LOG", "info");
    let mut served = serve.spawn(std::fs::File::create(&log).unwrap()).unwrap();
    served
        .wait(
            |a| a.grpc.is_some() && a.anypoint.is_some() && a.console.is_some(),
            Duration::from_secs(60),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap()));
    let grpc = served.announced.grpc.unwrap();
    let rest = served.announced.anypoint.unwrap();
    let console: SocketAddr = served
        .announced
        .console
        .as_deref()
        .and_then(|u| u.strip_prefix("http://"))
        .and_then(|u| u.trim_end_matches('/').parse().ok())
        .expect("console address");
    let mut child = served.child;

    let mut c = grpc_from(OTHER, grpc)
        .await
        .expect("connect before the flood");
    c.create("q", config()).await;
    c.publish("q", &["before"]).await;

    let mut flood = Vec::new();
    for i in 0..flood_size {
        let (to, is_grpc) = match i % 3 {
            0 => (grpc, true),
            1 => (rest, false),
            _ => (console, false),
        };
        if let Some(s) = Slow::open(FLOODER, to, is_grpc).await {
            flood.push(s);
        }
    }
    let dripping = trickle(flood, Duration::from_secs(1));
    // The server has taken in (or turned away) the whole flood.
    tokio::time::sleep(Duration::from_millis(300)).await;

    within_a_second("gRPC", publish_grpc(OTHER, grpc, "q", "grpc")).await;
    within_a_second("REST", publish_rest(OTHER, rest, "q", "rest")).await;
    within_a_second("console", publish_console(OTHER, console, "q", "console")).await;

    dripping.abort();
    let _ = dripping.await;
    let mut bodies: Vec<String> = c
        .browse("q")
        .await
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["before", "console", "grpc", "rest"]);
    assert!(child.try_wait().unwrap().is_none(), "the server is up");
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("storage failed"), "{text}");
    assert!(!text.contains("Too many open files"), "{text}");
}

/// Many addresses flooding the REST facade with trickling request heads
/// fill its share of the connections, not the whole cap: gRPC and the
/// console keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_listener_leaves_the_others_their_share() {
    let s = InProc::start_with(|c| {
        c.limits.max_connections = Some(40);
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.console_listen = Some(letterbox::server::ConsoleAt::Exactly(
            "127.0.0.1:0".parse().unwrap(),
        ));
    })
    .await;
    let rest = s.anypoint.unwrap();
    let mut c = grpc_from(OTHER, s.addr)
        .await
        .expect("connect before the flood");
    c.create("q", config()).await;
    let mut flood = Vec::new();
    for host in 10..18 {
        for _ in 0..10 {
            if let Some(slow) = Slow::open(Ipv4Addr::new(127, 0, 0, host), rest, false).await {
                flood.push(slow);
            }
        }
    }
    let dripping = trickle(flood, Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = Ipv4Addr::new(127, 0, 0, 3);
    within_a_second("gRPC", publish_grpc(other, s.addr, "q", "grpc")).await;
    within_a_second(
        "console",
        publish_console(other, s.console.unwrap(), "q", "console"),
    )
    .await;
    dripping.abort();
    let _ = dripping.await;
    assert_eq!(c.stats("q").await.total, 2);
    s.stop().await;
}

/// A request head that trickles in a byte at a time is cut at its
/// deadline however often its bytes come: the first one at the handshake
/// deadline, a later one of a keep-alive connection at the header
/// deadline after the previous answer (so its first request made it a
/// client, past the handshake deadline). A connection that sent the HTTP/2
/// preface and SETTINGS (and PINGs) but never a call is cut at the
/// handshake deadline; one that has made its call stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_request_heads_and_callless_connections_are_cut_at_their_deadline() {
    const HANDSHAKE: Duration = Duration::from_millis(600);
    const HEADER: Duration = Duration::from_millis(1000);
    let s = InProc::start_with(|c| {
        c.limits.handshake_timeout = HANDSHAKE;
        c.limits.header_timeout = HEADER;
        c.limits.idle_timeout = Duration::from_secs(30);
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.console_listen = Some(letterbox::server::ConsoleAt::Exactly(
            "127.0.0.1:0".parse().unwrap(),
        ));
    })
    .await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    let (rest, console, metrics) = (s.anypoint.unwrap(), s.console.unwrap(), s.metrics.unwrap());
    // Each: what it is, the connection, when its deadline began and how
    // long it is.
    let mut slow = Vec::new();
    for (to, grpc) in [
        (s.addr, true),
        (rest, false),
        (console, false),
        (metrics, false),
    ] {
        let conn = Slow::open(FLOODER, to, grpc).await.expect("accepted");
        slow.push((
            format!("{to}, first request"),
            conn,
            Instant::now(),
            HANDSHAKE,
        ));
    }
    for to in [rest, console, metrics] {
        let (conn, answered) = Slow::after_a_request(FLOODER, to).await;
        slow.push((format!("{to}, second request"), conn, answered, HEADER));
    }
    // A byte every 100 ms (a PING for HTTP/2), for up to 4 s.
    let started = Instant::now();
    let mut closed = vec![None; slow.len()];
    while started.elapsed() < Duration::from_secs(4) && closed.iter().any(Option::is_none) {
        for (i, (_, conn, _, _)) in slow.iter_mut().enumerate() {
            if closed[i].is_none() {
                conn.drip();
                if conn.closed_within(Duration::from_millis(25)).await {
                    closed[i] = Some(Instant::now());
                }
            }
        }
    }
    for ((what, _, from, deadline), when) in slow.iter().zip(&closed) {
        let when = when.unwrap_or_else(|| panic!("{what}: still open after 4 s of trickling"));
        let after = when - *from;
        assert!(
            after + Duration::from_millis(150) >= *deadline,
            "{what}: closed after {after:?}, before its deadline of {deadline:?}"
        );
    }
    // The client that made its call keeps its connection past the
    // deadline: open are it and the scrape's own.
    let mut scrape = H1::open(OTHER, metrics).await.unwrap();
    let text = scrape
        .call(Method::GET, "/metrics", &[], String::new())
        .await
        .unwrap()
        .body;
    let open = text.lines().find_map(|l| {
        l.strip_prefix("letterbox_connections_open ")?
            .trim()
            .parse::<f64>()
            .ok()
    });
    assert_eq!(open, Some(2.0), "{text}");
    c.publish("q", &["after"]).await;
    assert_eq!(c.stats("q").await.total, 1);
    s.stop().await;
}

/// Reserves that do not fit in the cap stop the start, naming the
/// setting and what fits.
#[tokio::test]
async fn reserves_larger_than_the_cap_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = letterbox::server::ServerConfig::new(
        dir.path().join("data"),
        "127.0.0.1:0".parse().unwrap(),
    );
    config.store.min_free_bytes = 0;
    config.limits.max_connections = Some(10);
    config.limits.listener_reserve = Some(6);
    config.console_listen = Some(letterbox::server::ConsoleAt::Exactly(
        "127.0.0.1:0".parse().unwrap(),
    ));
    let clock = std::sync::Arc::new(letterbox::clock::ManualClock::new(T0));
    let e = letterbox::server::Server::start(config, clock)
        .await
        .expect_err("refused");
    let text = e.to_string();
    assert!(
        text.contains("--listener-reserve 6") && text.contains("at most 5 each"),
        "{text}"
    );
}
