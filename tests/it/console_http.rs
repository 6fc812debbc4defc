//! The web console over HTTP, as a browser speaks to it (the browser test
//! itself is `console.rs`): pages that show what gRPC changed, a redrive
//! from the dead-letter page that puts the message back exactly once,
//! every state change behind the session's CSRF token and the same-origin
//! rule, logins and grants with principals, and bad input refused naming
//! the bad value with nothing changed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use letterbox::auth::{Authenticator, PrincipalConfig, hash_secret, hex_sha256};
use letterbox::server::ConsoleAt;

use crate::harness::*;

/// A browser of one console: its cookie jar holds the session.
pub(crate) struct Web {
    addr: SocketAddr,
    http: Client<HttpConnector, Full<Bytes>>,
    cookie: Option<String>,
    /// Send `Sec-Fetch-Site: same-origin`, as a browser does for its own
    /// pages' requests.
    same_site: bool,
}

pub(crate) struct Page {
    pub(crate) status: u16,
    headers: hyper::HeaderMap,
    pub(crate) body: String,
}

impl Page {
    /// The CSRF token of the page's forms.
    pub(crate) fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no CSRF field in {}", self.body));
        let rest = &self.body[at + "name=\"csrf\" value=\"".len()..];
        rest[..rest.find('"').expect("end of value")].to_string()
    }

    pub(crate) fn location(&self) -> String {
        self.headers
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    /// Asserts the page holds `needle`, as markup or as text (with its
    /// quotes escaped as HTML escapes them).
    #[track_caller]
    pub(crate) fn has(&self, needle: &str) -> &Page {
        assert!(
            self.body.contains(needle) || self.body.contains(&needle.replace('"', "&quot;")),
            "status {}: {needle:?} not in {}",
            self.status,
            self.body
        );
        self
    }
}

impl Web {
    pub(crate) fn new(addr: SocketAddr) -> Web {
        Web {
            addr,
            http: Client::builder(TokioExecutor::new()).build_http(),
            cookie: None,
            same_site: false,
        }
    }

    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: String,
        origin: Option<&str>,
    ) -> Page {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("http://{}{path}", self.addr));
        if let Some(c) = &self.cookie {
            req = req.header("cookie", c.as_str());
        }
        if method == Method::POST {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if self.same_site {
            req = req.header("sec-fetch-site", "same-origin");
        }
        let resp = self
            .http
            .request(req.body(Full::new(Bytes::from(body))).expect("request"))
            .await
            .expect("console answers");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        if let Some(set) = headers.get("set-cookie").and_then(|v| v.to_str().ok()) {
            let pair = set.split(';').next().unwrap_or_default().to_string();
            self.cookie = (!pair.ends_with('=')).then_some(pair);
        }
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        Page {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub(crate) async fn get(&mut self, path: &str) -> Page {
        self.send(Method::GET, path, String::new(), None).await
    }

    pub(crate) async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        self.send(Method::POST, path, body, None).await
    }
}

async fn start(principals: Vec<PrincipalConfig>) -> InProc {
    InProc::start_with(move |c| {
        c.console_listen = Some(ConsoleAt::Exactly("127.0.0.1:0".parse().expect("addr")));
        c.console_sample_every = Duration::from_millis(100);
        if !principals.is_empty() {
            c.auth = Arc::new(Authenticator::new(&principals).expect("principals"));
        }
    })
    .await
}

/// `orders` with the dead letter queue `orders-dlq` (one delivery), and
/// one message nacked into it with `reason`; returns its id.
async fn dead_letter_one(c: &mut Clients, reason: &str) -> String {
    c.create("orders-dlq", config()).await;
    c.create("orders", with_dlq("orders-dlq", 1)).await;
    let id = c.publish("orders", &[r#"{"order":42}"#]).await.remove(0);
    let d = c.receive("orders", 1).await;
    assert!(ok(&c.nack(&d[0].ack_token, reason).await));
    assert_eq!(c.stats("orders-dlq").await.total, 1);
    id
}

#[tokio::test]
async fn a_dead_letter_is_read_and_redriven_from_the_console_exactly_once() {
    let server = start(Vec::new()).await;
    let mut c = server.clients().await;
    let mut web = Web::new(server.console.expect("console on"));
    let home = web.get("/").await;
    assert_eq!(home.status, 200);
    home.has("id=\"server-facts\"");
    let id = dead_letter_one(&mut c, "payment service said 503").await;
    web.get("/")
        .await
        .has("data-queue=\"orders\"")
        .has("data-queue=\"orders-dlq\"");
    let dlq = web.get("/queues/orders-dlq/dead-letters").await;
    dlq.has(&format!("data-message-id=\"{id}\""))
        .has("<td data-col=\"source\">orders</td>")
        .has("<td data-col=\"reason\">max_deliveries</td>")
        .has("<td data-col=\"last_error\">payment service said 503</td>");
    let csrf = dlq.csrf();
    let fields = |mode| {
        vec![
            ("csrf", csrf.clone()),
            ("id", id.clone()),
            ("target", String::new()),
            ("rate", "0".into()),
            ("mode", mode),
        ]
    };
    let as_ref = |v: &Vec<(&'static str, String)>| -> Vec<(&'static str, String)> { v.clone() };
    let preview_fields = as_ref(&fields("preview".into()));
    let preview: Vec<(&str, &str)> = preview_fields
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    let plan = web.post("/queues/orders-dlq/redrive", &preview).await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    plan.has("data-count=\"1\"").has("<b>orders (1)</b>");
    // The dry run moved nothing.
    assert_eq!(c.stats("orders-dlq").await.total, 1);
    let run_fields = fields("run".into());
    let run: Vec<(&str, &str)> = run_fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let started = web.post("/queues/orders-dlq/redrive", &run).await;
    assert_eq!(started.status, 303, "{}", started.body);
    let job = started.location();
    assert!(job.starts_with("/jobs/"), "{job}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = web.get(&format!("{job}/progress")).await;
        if p.body.contains("data-state=\"done\"") {
            p.has("data-moved=\"1\"");
            break;
        }
        assert!(!p.body.contains("data-state=\"failed\""), "{}", p.body);
        assert!(Instant::now() < deadline, "redrive not done: {}", p.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let back = c.browse("orders").await;
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].message_id, id);
    assert_eq!(c.stats("orders-dlq").await.total, 0);
    // Running the same selection again moves nothing twice.
    let again = web.post("/queues/orders-dlq/redrive", &run).await;
    assert_eq!(again.status, 303);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.browse("orders").await.len(), 1);
    // The message's page shows its history.
    let page = web.get("/queues/orders").await;
    page.has(&format!("data-message-id=\"{id}\""));
    // The plots' samples, every 100 ms here, with the server's clock
    // moved a second at a time: several points by now.
    for _ in 0..3 {
        server.clock.advance(1000);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let plot = web.get("/queues/orders/history.json?window=15m").await;
    assert_eq!(plot.status, 200);
    let json: serde_json::Value = serde_json::from_str(&plot.body).expect("json");
    let points = json["t"].as_array().map_or(0, Vec::len);
    assert!(points >= 3, "{}", plot.body);
    assert_eq!(Some(points), json["ready"].as_array().map(Vec::len));
    assert_eq!(
        json["ready"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|v| v.as_u64()),
        Some(1)
    );
    server.stop().await;
}

#[tokio::test]
async fn every_change_needs_the_sessions_csrf_token_the_same_origin_and_a_typed_confirmation() {
    let server = start(Vec::new()).await;
    let mut c = server.clients().await;
    c.create("orders", config()).await;
    c.publish("orders", &["a", "b"]).await;
    let mut web = Web::new(server.console.expect("console on"));
    let page = web.get("/queues/orders").await;
    let csp = page
        .headers
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!page.body.contains("<script>"), "no inline script");
    let cookie = page
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let csrf = page.csrf();
    // A page of another site whose name resolves here (DNS rebinding)
    // names its own host: nothing for it without principals.
    let rebound = web
        .http
        .request(
            Request::builder()
                .uri(format!("http://{}/", web.addr))
                .header("host", "evil.example:8025")
                .body(Full::new(Bytes::new()))
                .expect("request"),
        )
        .await
        .expect("answer");
    assert_eq!(rebound.status(), 403);
    // No token, a wrong one, another site: refused, nothing purged.
    let none = web
        .post("/queues/orders/purge", &[("confirm", "orders")])
        .await;
    assert_eq!(none.status, 403, "{}", none.body);
    none.has("CSRF");
    let wrong = web
        .post(
            "/queues/orders/purge",
            &[("csrf", "0000"), ("confirm", "orders")],
        )
        .await;
    assert_eq!(wrong.status, 403);
    let body = format!("csrf={csrf}&confirm=orders");
    let cross = web
        .send(
            Method::POST,
            "/queues/orders/purge",
            body,
            Some("http://evil.example"),
        )
        .await;
    assert_eq!(cross.status, 403, "{}", cross.body);
    // An opaque origin passes only when the browser says the request is
    // its own (some browsers send `Origin: null` with same-origin forms).
    let body = format!("csrf={csrf}&confirm=nope");
    let opaque = web
        .send(
            Method::POST,
            "/queues/orders/purge",
            body.clone(),
            Some("null"),
        )
        .await;
    assert_eq!(opaque.status, 403, "{}", opaque.body);
    web.same_site = true;
    let own = web
        .send(Method::POST, "/queues/orders/purge", body, Some("null"))
        .await;
    web.same_site = false;
    assert_eq!(
        own.status, 400,
        "past the origin check, to the confirmation: {}",
        own.body
    );
    // Another session's token is not this one's.
    let mut other = Web::new(server.console.expect("console on"));
    other.get("/").await;
    let stolen = other
        .post(
            "/queues/orders/purge",
            &[("csrf", csrf.as_str()), ("confirm", "orders")],
        )
        .await;
    assert_eq!(stolen.status, 403);
    // The confirmation must be the queue's name.
    let unconfirmed = web
        .post(
            "/queues/orders/purge",
            &[("csrf", csrf.as_str()), ("confirm", "order")],
        )
        .await;
    assert_eq!(unconfirmed.status, 400);
    unconfirmed
        .has("class=\"flash error\"")
        .has("\"order\" was typed");
    assert_eq!(c.stats("orders").await.total, 2, "nothing purged yet");
    let purged = web
        .post(
            "/queues/orders/purge",
            &[("csrf", csrf.as_str()), ("confirm", "orders")],
        )
        .await;
    assert_eq!(purged.status, 200, "{}", purged.body);
    purged.has("class=\"flash ok\"").has("2 messages deleted");
    assert_eq!(c.stats("orders").await.total, 0);
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_value_and_changes_nothing() {
    let server = start(Vec::new()).await;
    let mut c = server.clients().await;
    c.create("orders", config()).await;
    let mut web = Web::new(server.console.expect("console on"));
    let csrf = web.get("/queues/orders").await.csrf();
    let bad = web
        .post(
            "/queues/orders/publish",
            &[
                ("csrf", &csrf),
                ("body", "x"),
                ("properties", "no-equals-sign"),
            ],
        )
        .await;
    assert_eq!(bad.status, 400);
    bad.has("\"no-equals-sign\" is not key=value");
    let bad = web
        .post(
            "/queues/orders/config",
            &[
                ("csrf", &csrf),
                ("ack_timeout", "soon"),
                ("message_ttl", "7d"),
            ],
        )
        .await;
    assert_eq!(bad.status, 400);
    bad.has("ack timeout").has("soon");
    let bad = web
        .post("/queues", &[("csrf", &csrf), ("name", "no spaces")])
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    bad.has("no spaces");
    let missing = web.get("/queues/nope").await;
    assert_eq!(missing.status, 404);
    let stats = c.stats("orders").await;
    assert_eq!((stats.published, stats.total), (0, 0));
    let q = c
        .admin
        .get_queue(letterbox::pb::GetQueueRequest {
            name: "orders".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .queue
        .expect("queue");
    assert_eq!(
        q.config.expect("config").ack_timeout_ms,
        Some(120_000),
        "unchanged"
    );
    let ok = web
        .post(
            "/queues/orders/publish",
            &[("csrf", &csrf), ("body", "hello"), ("properties", "k=v")],
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    ok.has("published message");
    let got = c.browse("orders").await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].properties.get("k").map(String::as_str), Some("v"));
    server.stop().await;
}

#[tokio::test]
async fn a_test_message_over_the_size_limit_is_413_and_a_full_queue_429() {
    let server = InProc::start_with(|c| {
        c.console_listen = Some(ConsoleAt::Exactly("127.0.0.1:0".parse().expect("addr")));
        c.broker.max_message_size = 16;
    })
    .await;
    let mut c = server.clients().await;
    let mut full = config();
    full.max_length = Some(1);
    c.create("orders", full).await;
    let mut web = Web::new(server.console.expect("console on"));
    let csrf = web.get("/queues/orders").await.csrf();
    let large = web
        .post(
            "/queues/orders/publish",
            &[("csrf", &csrf), ("body", "seventeen bytes!!")],
        )
        .await;
    assert_eq!(large.status, 413, "{}", large.body);
    large.has("more than the limit of 16 bytes");
    let fits = [("csrf", csrf.as_str()), ("body", "fits")];
    let ok = web.post("/queues/orders/publish", &fits).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let full = web.post("/queues/orders/publish", &fits).await;
    assert_eq!(full.status, 429, "{}", full.body);
    full.has("is full");
    assert_eq!(c.stats("orders").await.total, 1);
    server.stop().await;
}

#[tokio::test]
async fn with_principals_the_console_asks_for_credentials_and_applies_the_grants() {
    let all = vec!["*".to_string()];
    let principals = vec![
        PrincipalConfig {
            name: "ops".into(),
            client_id: Some("ops-app".into()),
            secret_hash: Some(hash_secret("ops-secret").expect("hash")),
            admin: all.clone(),
            publish: all.clone(),
            consume: all.clone(),
            ..PrincipalConfig::default()
        },
        PrincipalConfig {
            name: "reader".into(),
            token_sha256: vec![hex_sha256(b"reader-token")],
            consume: all.clone(),
            ..PrincipalConfig::default()
        },
    ];
    let server = start(principals).await;
    let console = server.console.expect("console on");
    // The queue is made over gRPC as ops.
    let ch = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "ops-app:ops-secret"
        )
    );
    let mut admin = letterbox::pb::admin_service_client::AdminServiceClient::with_interceptor(
        ch.clone(),
        move |mut r: tonic::Request<()>| {
            r.metadata_mut()
                .insert("authorization", basic.parse().expect("ascii"));
            Ok(r)
        },
    );
    admin
        .create_queue(letterbox::pb::CreateQueueRequest {
            name: "orders".into(),
            config: Some(config()),
        })
        .await
        .expect("create");

    let mut anon = Web::new(console);
    let home = anon.get("/").await;
    assert_eq!(home.status, 303);
    assert_eq!(home.location(), "/login?next=%2F");
    let post = anon
        .post("/queues/orders/purge", &[("confirm", "orders")])
        .await;
    assert_eq!(post.status, 401);
    let login = anon.get("/login").await;
    login.has("id=\"login\"");
    let refused = anon
        .post("/login", &[("token", "not-a-token"), ("next", "/")])
        .await;
    assert_eq!(refused.status, 401);
    refused.has("unknown bearer token");
    assert!(anon.cookie.is_none(), "no session for bad credentials");

    let mut reader = Web::new(console);
    let r = reader
        .post(
            "/login",
            &[("token", "reader-token"), ("next", "/queues/orders")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.location(), "/queues/orders");
    let page = reader.get("/queues/orders").await;
    assert_eq!(page.status, 200);
    page.has("reader").has("id=\"messages\"");
    assert!(
        !page.body.contains("id=\"purge\""),
        "no purge form without the grant"
    );
    let csrf = page.csrf();
    let denied = reader
        .post(
            "/queues/orders/purge",
            &[("csrf", csrf.as_str()), ("confirm", "orders")],
        )
        .await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    denied.has("principal \"reader\" may not admin \"orders\"");

    let mut ops = Web::new(console);
    let r = ops
        .post(
            "/login",
            &[
                ("client_id", "ops-app"),
                ("secret", "ops-secret"),
                ("next", "/"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let csrf = ops.get("/queues/orders").await.csrf();
    let ok = ops
        .post(
            "/queues/orders/purge",
            &[("csrf", csrf.as_str()), ("confirm", "orders")],
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    ok.has("class=\"flash ok\"");
    // Logging out ends the session.
    let out = ops.post("/logout", &[("csrf", csrf.as_str())]).await;
    assert_eq!(out.status, 303);
    assert_eq!(ops.get("/").await.status, 303);
    server.stop().await;
}

/// Five failed logins from one address within five minutes close the
/// login to it: the next attempt is refused (429, `Retry-After`) without
/// its credentials being checked, right ones too, until the first failure
/// is five minutes old; then a right one logs in.
#[tokio::test]
async fn failed_logins_close_the_login_to_the_address_for_a_while() {
    let principals = vec![PrincipalConfig {
        name: "reader".into(),
        token_sha256: vec![hex_sha256(b"reader-token")],
        consume: vec!["*".to_string()],
        ..PrincipalConfig::default()
    }];
    let server = start(principals).await;
    let console = server.console.expect("console on");
    let mut web = Web::new(console);
    for i in 0..5 {
        let r = web
            .post("/login", &[("token", &format!("guess-{i}")), ("next", "/")])
            .await;
        assert_eq!(r.status, 401, "guess {i}: {}", r.body);
        server.clock.advance(10_000);
    }
    let closed = web
        .post("/login", &[("token", "reader-token"), ("next", "/")])
        .await;
    assert_eq!(closed.status, 429, "{}", closed.body);
    closed.has("too many failed logins from 127.0.0.1");
    assert_eq!(
        closed
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("250"),
        "five minutes from the first failure, 50 s ago"
    );
    assert!(web.cookie.is_none(), "no session");
    server.clock.advance(249_000);
    let still = web
        .post("/login", &[("token", "reader-token"), ("next", "/")])
        .await;
    assert_eq!(still.status, 429, "{}", still.body);
    server.clock.advance(1_000);
    let open = web
        .post("/login", &[("token", "reader-token"), ("next", "/")])
        .await;
    assert_eq!(open.status, 303, "{}", open.body);
    assert!(web.cookie.is_some(), "logged in");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_tls_the_console_serves_https_with_secure_cookies() {
    let pki = crate::security::pki();
    let (cert, key) = (pki.server_cert.clone(), pki.server_key.clone());
    let server = InProc::start_with(move |c| {
        c.console_listen = Some(ConsoleAt::Exactly("127.0.0.1:0".parse().expect("addr")));
        c.tls = Some(letterbox::server::TlsConfig {
            cert_pem: cert.into_bytes(),
            key_pem: key.into_bytes(),
            client_ca_pem: None,
            require_client_cert: false,
        });
    })
    .await;
    let at = server.console.expect("console on");
    let (head, body) = crate::ecosystem::https_exchange(
        at,
        &pki.ca_pem,
        "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("https");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let cookie = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_default();
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    assert!(body.contains("id=\"queues\""), "{body}");
    // Plain HTTP gets no page.
    let plain = Web::new(at);
    let answered = tokio::time::timeout(Duration::from_secs(3), async {
        let req = Request::builder()
            .uri(format!("http://{at}/"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        plain.http.request(req).await
    })
    .await;
    assert!(
        !matches!(answered, Ok(Ok(ref r)) if r.status() == 200),
        "no page over plain HTTP"
    );
    server.stop().await;
}

#[tokio::test]
async fn groups_exchanges_and_definitions_are_handled_from_the_console() {
    use letterbox::pb;
    let server = start(Vec::new()).await;
    let mut c = server.clients().await;
    let fifo = pb::QueueConfig {
        kind: pb::QueueKind::Fifo as i32,
        ..config()
    };
    c.create("jobs-dlq", fifo).await;
    c.create(
        "jobs",
        pb::QueueConfig {
            kind: pb::QueueKind::Fifo as i32,
            on_poison: pb::PoisonPolicy::ParkGroup as i32,
            ..with_dlq("jobs-dlq", 1)
        },
    )
    .await;
    c.msg
        .publish(pb::PublishRequest {
            queue: "jobs".into(),
            messages: ["first", "second"]
                .iter()
                .map(|b| pb::PublishMessage {
                    group_id: "tenant-7".into(),
                    ..msg(b)
                })
                .collect(),
            ..Default::default()
        })
        .await
        .expect("publish");
    let d = c.receive("jobs", 1).await;
    assert!(ok(&c.nack(&d[0].ack_token, "bad input").await));
    let mut web = Web::new(server.console.expect("console on"));
    let groups = web.get("/queues/jobs/groups?state=parked").await;
    assert_eq!(groups.status, 200, "{}", groups.body);
    groups.has("data-group=\"tenant-7\"").has("<td>parked</td>");
    let csrf = groups.csrf();
    let released = web
        .post(
            "/queues/jobs/groups/release",
            &[("csrf", &csrf), ("group", "tenant-7")],
        )
        .await;
    assert_eq!(released.status, 200, "{}", released.body);
    released.has("class=\"flash ok\"");
    assert_eq!(
        c.receive("jobs", 1).await[0].message_id,
        d[0].message_id,
        "the head again"
    );

    // Exchanges: create, bind with a filter, see it, unbind.
    c.create("eu-orders", config()).await;
    let made = web
        .post("/exchanges", &[("csrf", &csrf), ("name", "orders-x")])
        .await;
    assert_eq!(made.status, 200, "{}", made.body);
    let bound = web
        .post(
            "/exchanges/orders-x/bind",
            &[
                ("csrf", &csrf),
                ("queue", "eu-orders"),
                ("filter", "region=eu"),
            ],
        )
        .await;
    assert_eq!(bound.status, 200, "{}", bound.body);
    bound
        .has("data-binding=\"eu-orders\"")
        .has("<code>region=eu</code>");
    let bad = web
        .post(
            "/exchanges/orders-x/bind",
            &[
                ("csrf", &csrf),
                ("queue", "eu-orders"),
                ("filter", "region"),
            ],
        )
        .await;
    assert_eq!(bad.status, 400);
    bad.has("\"region\" is not key=value");
    let x = c
        .admin
        .get_exchange(pb::GetExchangeRequest {
            name: "orders-x".into(),
        })
        .await
        .expect("exchange")
        .into_inner();
    assert_eq!(format!("{x:?}").matches("eu-orders").count(), 1, "{x:?}");

    // Definitions: the export is a download; a bad import changes nothing
    // and says why; a good one creates.
    let export = web.get("/definitions/export").await;
    assert_eq!(export.status, 200);
    assert!(
        export
            .headers
            .get("content-disposition")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("attachment")),
        "{:?}",
        export.headers
    );
    let json: serde_json::Value = serde_json::from_str(&export.body).expect("json");
    assert!(export.body.contains("orders-x"), "{json}");
    let bad = web
        .post(
            "/definitions/import",
            &[
                ("csrf", &csrf),
                ("json", r#"{"queues":[{"name":"bad name"}]}"#),
            ],
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    bad.has("class=\"flash error\"").has("bad name");
    let good = web
        .post(
            "/definitions/import",
            &[
                ("csrf", &csrf),
                ("json", r#"{"queues":[{"name":"imported"}]}"#),
            ],
        )
        .await;
    assert_eq!(good.status, 200, "{}", good.body);
    good.has("1 queues created");
    assert_eq!(c.stats("imported").await.total, 0, "exists");
    server.stop().await;
}
