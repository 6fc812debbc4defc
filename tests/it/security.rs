//! Authentication, authorization, TLS and mTLS, health and reflection,
//! against the real binary. Every denied call must be refused with
//! UNAUTHENTICATED or PERMISSION_DENIED and change nothing.

use std::path::Path;
use std::time::Duration;

use letterbox::auth::{hash_secret, hex_sha256};
use letterbox::client::{Client, ClientConfig, Credentials, ErrorKind, TlsSettings, pb};
use tonic::Code;

use crate::harness::TestServer;

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const PRODUCER_TOKEN: &str = "producer-token-0123456789";
const CONSUMER_ID: &str = "orders-consumer";
const CONSUMER_SECRET: &str = "correct horse battery staple";

fn config_file(dir: &Path, extra: &str) -> String {
    let secret_hash = hash_secret(CONSUMER_SECRET).unwrap();
    let text = format!(
        r#"
[[principals]]
name = "ops"
token_sha256 = ["{admin}"]
admin = ["*"]
publish = ["*"]
consume = ["*"]

[[principals]]
name = "producer"
token_sha256 = ["{producer}"]
publish = ["orders"]

[[principals]]
name = "consumer"
client_id = "{CONSUMER_ID}"
secret_hash = "{secret_hash}"
consume = ["orders", "orders-*"]
{extra}
"#,
        admin = hex_sha256(ADMIN_TOKEN.as_bytes()),
        producer = hex_sha256(PRODUCER_TOKEN.as_bytes()),
    );
    let path = dir.join("letterbox.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn client(server: &TestServer, creds: Option<Credentials>) -> Client {
    let mut c = ClientConfig::new(format!("http://{}", server.addr));
    c.retry.max_attempts = 1;
    c.credentials = creds;
    Client::with_config(c).await.unwrap()
}

fn token(t: &str) -> Option<Credentials> {
    Some(Credentials::Token(t.into()))
}

fn consumer() -> Option<Credentials> {
    Some(Credentials::ClientSecret {
        id: CONSUMER_ID.into(),
        secret: CONSUMER_SECRET.into(),
    })
}

fn code<T: std::fmt::Debug>(r: letterbox::client::Result<T>) -> Code {
    match r.unwrap_err().kind() {
        ErrorKind::Rpc(c) => c,
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        other => panic!("not an RPC error: {other:?}"),
    }
}

#[tokio::test]
async fn every_call_needs_credentials_and_a_grant() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "");
    let server = TestServer::start_with(&["--config", &cfg]).await;
    let ops = client(&server, token(ADMIN_TOKEN)).await;
    ops.create_queue("orders", pb::QueueConfig::default())
        .await
        .unwrap();
    ops.create_queue("billing", pb::QueueConfig::default())
        .await
        .unwrap();
    ops.publish("billing", vec![Client::message("invoice")])
        .await
        .unwrap();

    // Nobody and impostors.
    let anon = client(&server, None).await;
    assert_eq!(code(anon.list_queues("").await), Code::Unauthenticated);
    assert_eq!(
        code(anon.publish("orders", vec![Client::message("x")]).await),
        Code::Unauthenticated
    );
    let wrong = client(&server, token("not-a-token")).await;
    assert_eq!(code(wrong.get_queue("orders").await), Code::Unauthenticated);
    let bad_secret = client(
        &server,
        Some(Credentials::ClientSecret {
            id: CONSUMER_ID.into(),
            secret: "guess".into(),
        }),
    )
    .await;
    assert_eq!(
        code(bad_secret.receive("orders", 1, Duration::ZERO).await),
        Code::Unauthenticated
    );

    // The producer publishes to orders and nothing else.
    let producer = client(&server, token(PRODUCER_TOKEN)).await;
    producer
        .publish("orders", vec![Client::message("order-1")])
        .await
        .unwrap();
    assert_eq!(
        code(
            producer
                .publish("billing", vec![Client::message("x")])
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(producer.receive("orders", 1, Duration::ZERO).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            producer
                .create_queue("new-queue", pb::QueueConfig::default())
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(producer.delete_queue("orders", true).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(producer.purge_queue("orders").await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(producer.export_definitions().await),
        Code::PermissionDenied
    );

    // The consumer (client id and secret) consumes orders only.
    let consumer_client = client(&server, consumer()).await;
    let got = consumer_client
        .receive("orders", 10, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        code(consumer_client.receive("billing", 1, Duration::ZERO).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            consumer_client
                .publish("orders", vec![Client::message("x")])
                .await
        ),
        Code::PermissionDenied
    );
    // A billing delivery taken by ops cannot be settled by the consumer.
    let billing = ops.receive("billing", 1, Duration::ZERO).await.unwrap();
    let billing_token = billing[0].ack_token.clone();
    assert_eq!(
        code(consumer_client.ack(vec![billing_token.clone()]).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            consumer_client
                .nack(vec![pb::NackItem {
                    ack_token: billing_token.clone(),
                    ..Default::default()
                }])
                .await
        ),
        Code::PermissionDenied
    );
    // Nor over a subscription to a queue it may consume.
    let sub = consumer_client.subscribe("orders", 4, None).await.unwrap();
    let refused = sub.settler().ack(vec![billing_token.clone()]).await;
    assert_eq!(code(refused), Code::PermissionDenied);
    drop(sub);
    assert_eq!(
        code(consumer_client.subscribe("billing", 4, None).await),
        Code::PermissionDenied
    );
    consumer_client
        .ack(vec![got[0].ack_token.clone()])
        .await
        .unwrap();

    // Nothing the refused calls tried happened.
    let billing_stats = ops.stats("billing").await.unwrap();
    assert_eq!(billing_stats.ready, 0);
    assert_eq!(billing_stats.in_flight, 1, "still held by ops");
    let orders_stats = ops.stats("orders").await.unwrap();
    assert_eq!(orders_stats.ready + orders_stats.in_flight, 0);
    let names: Vec<String> = ops
        .list_queues("")
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, vec!["billing", "orders"]);
    ops.ack(vec![billing_token]).await.unwrap();

    // Listing shows only what a principal has a grant on.
    let seen: Vec<String> = consumer_client
        .list_queues("")
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(seen, vec!["orders"]);
}

/// Five wrong secrets for one client id from one address within five
/// minutes: its calls from there are refused with RESOURCE_EXHAUSTED
/// without a check (the right secret too, until it is in the cache), and
/// other credentials go on working.
#[tokio::test]
async fn wrong_secrets_close_a_client_id_to_the_address_for_a_while() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "");
    let mut server = TestServer::start_with(&["--config", &cfg]).await;
    let guess = |secret: &str| {
        Some(Credentials::ClientSecret {
            id: CONSUMER_ID.into(),
            secret: secret.into(),
        })
    };
    for i in 0..5 {
        let c = client(&server, guess(&format!("guess-{i}"))).await;
        assert_eq!(code(c.list_queues("").await), Code::Unauthenticated);
    }
    for c in [
        client(&server, guess("guess-5")).await,
        client(&server, consumer()).await,
    ] {
        let e = c.list_queues("").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rpc(Code::ResourceExhausted), "{e}");
        assert!(
            e.to_string().contains(&format!(
                "too many wrong secrets for client id \"{CONSUMER_ID}\""
            )),
            "{e}"
        );
    }
    let ops = client(&server, token(ADMIN_TOKEN)).await;
    ops.list_queues("").await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn publish_streams_are_authorized_per_publish() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "");
    let server = TestServer::start_with(&["--config", &cfg]).await;
    let ops = client(&server, token(ADMIN_TOKEN)).await;
    for q in ["orders", "billing"] {
        ops.create_queue(q, pb::QueueConfig::default())
            .await
            .unwrap();
    }
    let mut msg = crate::harness::connect(server.addr).await.msg;
    let publish = |seq: u64, queue: &str| pb::PublishStreamRequest {
        sequence: seq,
        publish: Some(pb::PublishRequest {
            queue: queue.into(),
            messages: vec![Client::message(format!("message {seq}"))],
            exchange: String::new(),
        }),
    };
    let mut req = tonic::Request::new(tokio_stream::iter(vec![
        publish(1, "orders"),
        publish(2, "billing"),
        publish(3, "orders"),
    ]));
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {PRODUCER_TOKEN}").parse().unwrap(),
    );
    let mut answers = msg.publish_stream(req).await.unwrap().into_inner();
    let mut codes = Vec::new();
    while let Some(a) = answers.message().await.unwrap() {
        codes.push((a.sequence, a.code));
    }
    assert_eq!(
        codes,
        vec![(1, 0), (2, Code::PermissionDenied as i32), (3, 0)]
    );
    assert_eq!(ops.stats("billing").await.unwrap().ready, 0);
    assert_eq!(ops.stats("orders").await.unwrap().ready, 2);
    // Without credentials the stream itself is refused.
    let refused = msg
        .publish_stream(tokio_stream::iter(vec![publish(1, "orders")]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn the_config_file_is_validated_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "\n[[principals]]\nname = \"broken\"\n");
    let data = dir.path().join("data");
    let err = crate::harness::spawn(&data, &dir.path().join("log"), &["--config".into(), cfg])
        .unwrap_err();
    assert!(err.contains("principals[3] (broken)"), "{err}");
    assert!(
        !data.exists(),
        "a configuration error stops before the data directory is touched"
    );
    let err = crate::harness::spawn(
        &data,
        &dir.path().join("log"),
        &["--listen".into(), "0.0.0.0:0".into()],
    )
    .unwrap_err();
    assert!(err.contains("--allow-remote-without-auth"), "{err}");
}

#[tokio::test]
async fn health_and_reflection_answer_without_credentials() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "");
    let server = TestServer::start_with(&["--config", &cfg]).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    for service in [
        "",
        "letterbox.v1.AdminService",
        "letterbox.v1.MessagingService",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("unexpected answer {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"letterbox.v1.AdminService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"letterbox.v1.MessagingService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );

    // The older v1alpha protocol, which most grpcurl builds ask for.
    {
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        let mut alpha = ServerReflectionClient::new(channel.clone());
        let reqs = vec![
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            },
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol(
                    "letterbox.v1.MessagingService".into(),
                )),
            },
        ];
        let mut answers = alpha
            .server_reflection_info(tokio_stream::iter(reqs))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("unexpected answer {answer:?}");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        for want in [
            "letterbox.v1.MessagingService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            assert!(names.contains(&want.to_string()), "{want}: {names:?}");
        }
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::FileDescriptorResponse(files)) = answer.message_response else {
            panic!("unexpected answer {answer:?}");
        };
        assert!(!files.file_descriptor_proto.is_empty());
    }
}

pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    pub(crate) server_cert: String,
    pub(crate) server_key: String,
    pub(crate) client_cert: String,
    pub(crate) client_key: String,
    pub(crate) client_der: Vec<u8>,
}

pub(crate) fn pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["edge-service".to_string()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
        client_der: client.der().to_vec(),
        client_cert: client.pem(),
        client_key: client_key.serialize_pem(),
    }
}

#[tokio::test]
async fn tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let ca = write("ca.pem", &pki.ca_pem);
    let cert = write("server.pem", &pki.server_cert);
    let key = write("server.key", &pki.server_key);
    let cfg = config_file(
        dir.path(),
        &format!(
            "\n[[principals]]\nname = \"edge\"\ncert_sha256 = [\"{}\"]\npublish = [\"orders\"]\n",
            hex_sha256(&pki.client_der)
        ),
    );
    let server = TestServer::start_with(&[
        "--config",
        &cfg,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
    ])
    .await;
    let tls_client = |identity: bool, creds: Option<Credentials>| {
        let mut c = ClientConfig::new(format!("https://localhost:{}", server.addr.port()));
        c.retry.max_attempts = 1;
        c.credentials = creds;
        c.tls = Some(TlsSettings {
            ca_pem: Some(pki.ca_pem.clone().into_bytes()),
            identity_pem: identity.then(|| {
                (
                    pki.client_cert.clone().into_bytes(),
                    pki.client_key.clone().into_bytes(),
                )
            }),
            domain: None,
        });
        Client::with_config(c)
    };
    // A token over TLS.
    let ops = tls_client(false, token(ADMIN_TOKEN)).await.unwrap();
    ops.create_queue("orders", pb::QueueConfig::default())
        .await
        .unwrap();
    // The client certificate is the credential.
    let edge = tls_client(true, None).await.unwrap();
    edge.publish("orders", vec![Client::message("from the edge")])
        .await
        .unwrap();
    assert_eq!(
        code(edge.receive("orders", 1, Duration::ZERO).await),
        Code::PermissionDenied
    );
    // No certificate and no token: refused.
    let nobody = tls_client(false, None).await.unwrap();
    assert_eq!(code(nobody.list_queues("").await), Code::Unauthenticated);
    // Plain text to a TLS port does not get through.
    let mut plain = ClientConfig::new(format!("http://{}", server.addr));
    plain.retry.max_attempts = 1;
    plain.request_timeout = Duration::from_secs(5);
    if let Ok(c) = Client::with_config(plain).await {
        assert!(c.list_queues("").await.is_err());
    }
    assert_eq!(ops.stats("orders").await.unwrap().ready, 1);
}

#[tokio::test]
async fn required_client_certificates_refuse_connections_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let ca = write("ca.pem", &pki.ca_pem);
    let cert = write("server.pem", &pki.server_cert);
    let key = write("server.key", &pki.server_key);
    let server = TestServer::start_with(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
        "--tls-require-client-cert",
    ])
    .await;
    let mut c = ClientConfig::new(format!("https://localhost:{}", server.addr.port()));
    c.retry.max_attempts = 1;
    c.request_timeout = Duration::from_secs(5);
    c.tls = Some(TlsSettings {
        ca_pem: Some(pki.ca_pem.clone().into_bytes()),
        ..Default::default()
    });
    let refused = match Client::with_config(c.clone()).await {
        Ok(client) => client.list_queues("").await.is_err(),
        Err(_) => true,
    };
    assert!(
        refused,
        "a connection without a client certificate must fail"
    );
    c.tls = Some(TlsSettings {
        ca_pem: Some(pki.ca_pem.clone().into_bytes()),
        identity_pem: Some((pki.client_cert.into_bytes(), pki.client_key.into_bytes())),
        domain: None,
    });
    let client = Client::with_config(c).await.unwrap();
    // No principals: authentication is off, the certificate only opens
    // the connection.
    client.list_queues("").await.unwrap();
}

/// The audit events of the server's log (JSON lines, target
/// `letterbox::audit`), as (action, name, principal, outcome, detail).
fn audit_events(log: &str) -> Vec<(String, String, String, String, String)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "letterbox::audit")
        .map(|v| {
            let f = &v["fields"];
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            assert!(
                f["peer"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("127.0.0.1:")),
                "no peer address: {v}"
            );
            (
                s("action"),
                s("name"),
                s("principal"),
                s("outcome"),
                s("detail"),
            )
        })
        .collect()
}

#[tokio::test]
async fn destructive_acts_and_refusals_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(dir.path(), "");
    let server = TestServer::start_with(&["--config", &cfg, "--log-format", "json"]).await;
    let ops = client(&server, token(ADMIN_TOKEN)).await;
    ops.create_queue("orders", pb::QueueConfig::default())
        .await
        .unwrap();
    // Creating it again changes nothing: no event.
    ops.create_queue("orders", pb::QueueConfig::default())
        .await
        .unwrap();
    ops.publish("orders", vec![Client::message("a"), Client::message("b")])
        .await
        .unwrap();
    assert_eq!(ops.purge_queue("orders").await.unwrap(), 2);
    // A grant missing, and credentials refused.
    let producer = client(&server, token(PRODUCER_TOKEN)).await;
    assert_eq!(
        code(producer.purge_queue("orders").await),
        Code::PermissionDenied
    );
    let stranger = client(&server, token("not-a-token-at-all")).await;
    assert_eq!(code(stranger.list_queues("").await), Code::Unauthenticated);
    ops.delete_queue("orders", false).await.unwrap();

    let events = audit_events(&server.log());
    let find = |action: &str, outcome: &str| {
        events
            .iter()
            .filter(|e| e.0 == action && e.3 == outcome)
            .cloned()
            .collect::<Vec<_>>()
    };
    let created = find("queue.create", "done");
    assert_eq!(created.len(), 1, "{events:?}");
    assert_eq!(
        (created[0].1.as_str(), created[0].2.as_str()),
        ("orders", "ops")
    );
    let purged = find("queue.purge", "done");
    assert_eq!(purged.len(), 1, "{events:?}");
    assert_eq!(purged[0].4, "messages_deleted=2");
    let denied = find("admin", "refused");
    assert_eq!(denied.len(), 1, "{events:?}");
    assert_eq!(
        (denied[0].1.as_str(), denied[0].2.as_str()),
        ("orders", "producer")
    );
    let unknown = find("authenticate", "refused");
    assert_eq!(unknown.len(), 1, "{events:?}");
    assert_eq!(unknown[0].2, "(bearer token)");
    assert_eq!(find("queue.delete", "done").len(), 1, "{events:?}");
}
