//! The Anypoint MQ REST facade, driven as an Anypoint REST client drives
//! Anypoint MQ: authorize, administer queues, exchanges and bindings,
//! publish, consume with locks, extend, nack, ack; the same messages seen
//! through gRPC at the same time; authentication with client apps; the
//! error shapes of the specifications. (The contract test against the
//! official OpenAPI files is `tests/anypoint/run.sh`, run by
//! `contract_test_against_the_official_openapi_specs` below.)

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use letterbox::auth::{Authenticator, PrincipalConfig, hash_secret, hex_sha256};
use letterbox::pb;
use serde_json::{Value, json};

use crate::harness::*;

const MINUTE: u64 = 60_000;

/// An answer: status and JSON body (`Null` when empty).
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
    /// The `Retry-After` header, if any.
    retry_after: Option<String>,
}

impl Reply {
    #[track_caller]
    fn expect(self, status: u16) -> Value {
        assert_eq!(self.status, status, "body: {}", self.body);
        self.body
    }

    /// The Broker API's failure shape, with a message containing `needle`.
    #[track_caller]
    fn failure(self, status: u16, needle: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(self.body["status"], "failure", "{}", self.body);
        let m = self.body["statusMessage"].as_str().unwrap_or_default();
        assert!(m.contains(needle), "{m:?} does not contain {needle:?}");
    }

    /// The Admin API's failure shape.
    #[track_caller]
    fn admin_failure(self, status: u16, needle: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        let m = self.body["message"].as_str().unwrap_or_default();
        assert!(m.contains(needle), "{m:?} does not contain {needle:?}");
    }
}

/// A REST client of one facade, with the access token it got.
struct Rest {
    addr: SocketAddr,
    http: Client<HttpConnector, Full<Bytes>>,
    token: Option<String>,
}

const ORG: &str = "4f1c7e2a-org";
const ENV: &str = "9d3b-env";

impl Rest {
    fn new(addr: SocketAddr) -> Rest {
        Rest {
            addr,
            http: Client::builder(TokioExecutor::new()).build_http(),
            token: None,
        }
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
        token: Option<&str>,
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if !body.is_empty() {
            req = req.header("content-type", content_type);
        }
        if let Some(t) = token {
            req = req.header("authorization", format!("bearer {t}"));
        }
        let resp = self
            .http
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .expect("http call");
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
        };
        Reply {
            status,
            body,
            retry_after,
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        self.raw(
            method,
            path,
            "application/json",
            bytes,
            self.token.as_deref(),
        )
        .await
    }

    async fn authorize(&mut self, id: &str, secret: &str) -> Reply {
        let form = format!("client_id={id}&client_secret={secret}&grant_type=client_credentials");
        let r = self
            .raw(
                Method::POST,
                "/api/v1/authorize",
                "application/x-www-form-urlencoded",
                form.into_bytes(),
                None,
            )
            .await;
        if r.status == 200 {
            self.token = r.body["access_token"].as_str().map(str::to_string);
        }
        r
    }

    fn dest(d: &str) -> String {
        format!("/api/v1/organizations/{ORG}/environments/{ENV}/destinations/{d}")
    }

    fn admin(rest: &str) -> String {
        format!("/mq/admin/api/v1/organizations/{ORG}/environments/{ENV}/regions/us-east-1/{rest}")
    }

    async fn put_queue(&self, name: &str, body: Value) -> Value {
        self.call(
            Method::PUT,
            &Rest::admin(&format!("destinations/queues/{name}")),
            Some(body),
        )
        .await
        .expect(200)
    }

    async fn publish_batch(&self, dest: &str, msgs: Value) -> Reply {
        self.call(
            Method::PUT,
            &format!("{}/messages", Rest::dest(dest)),
            Some(msgs),
        )
        .await
    }

    async fn publish(&self, dest: &str, id: &str, msg: Value) -> Reply {
        self.call(
            Method::PUT,
            &format!("{}/messages/{id}", Rest::dest(dest)),
            Some(msg),
        )
        .await
    }

    async fn consume(&self, dest: &str, query: &str) -> Reply {
        self.call(
            Method::GET,
            &format!("{}/messages?{query}", Rest::dest(dest)),
            None,
        )
        .await
    }

    async fn ack(&self, dest: &str, id: &str, lock: &str) -> Reply {
        self.call(
            Method::DELETE,
            &format!("{}/messages/{id}", Rest::dest(dest)),
            Some(json!({ "lockId": lock })),
        )
        .await
    }

    async fn nack(&self, dest: &str, id: &str, lock: &str) -> Reply {
        self.call(
            Method::DELETE,
            &format!("{}/messages/{id}/locks/{}", Rest::dest(dest), enc(lock)),
            None,
        )
        .await
    }

    async fn extend(&self, dest: &str, id: &str, lock: &str, ttl: u64) -> Reply {
        self.call(
            Method::PATCH,
            &format!("{}/messages/{id}/locks/{}", Rest::dest(dest), enc(lock)),
            Some(json!({ "ttl": ttl })),
        )
        .await
    }
}

/// Percent-encodes a path segment, as clients do with lock ids.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn msg(id: &str, body: &str) -> Value {
    json!({"headers": {"messageId": id}, "properties": {}, "body": body})
}

fn lock(m: &Value) -> String {
    m["headers"]["lockId"].as_str().expect("lockId").to_string()
}

fn id(m: &Value) -> String {
    m["headers"]["messageId"]
        .as_str()
        .expect("messageId")
        .to_string()
}

async fn facade() -> InProc {
    InProc::start_with(|c| c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap())).await
}

async fn client_of(s: &InProc) -> Rest {
    let mut r = Rest::new(s.anypoint.expect("anypoint on"));
    r.authorize("local-app", "anything").await.expect(200);
    r
}

#[tokio::test]
async fn scenario_dlq_locks_and_redelivery_as_an_anypoint_client() {
    let s = facade().await;
    let mut rest = Rest::new(s.anypoint.unwrap());
    // Authorize (any client app while authentication is off).
    let auth = rest.authorize("my-app", "s3cret").await.expect(200);
    assert_eq!(auth["token_type"], "bearer");
    assert_eq!(auth["simple_client"]["orgId"], "local-org");
    assert!(auth["access_token"].as_str().unwrap().len() >= 32);
    let again = rest.authorize("my-app", "s3cret").await.expect(200);
    assert_eq!(
        again["access_token"], auth["access_token"],
        "same client id, same token"
    );

    // A queue with a dead letter queue, created as an admin script would.
    let dlq = rest.put_queue("orders-dlq", json!({})).await;
    assert_eq!(dlq["queueId"], "orders-dlq");
    assert_eq!(dlq["fifo"], false);
    let q = rest
        .put_queue(
            "orders",
            json!({"defaultTtl": 3_600_000, "defaultLockTtl": 10_000, "encrypted": false,
                   "fifo": false, "deadLetterQueueId": "orders-dlq", "maxDeliveries": 2,
                   "defaultDeliveryDelay": 0}),
        )
        .await;
    assert_eq!(
        (
            &q["defaultLockTtl"],
            &q["maxDeliveries"],
            &q["deadLetterQueueId"]
        ),
        (&json!(10_000), &json!(2), &json!("orders-dlq"))
    );
    // Idempotent.
    let q2 = rest
        .put_queue(
            "orders",
            json!({"defaultTtl": 3_600_000, "defaultLockTtl": 10_000,
                   "deadLetterQueueId": "orders-dlq", "maxDeliveries": 2}),
        )
        .await;
    assert_eq!(q2, q);
    let dlq = rest
        .call(
            Method::GET,
            &Rest::admin("destinations/queues/orders-dlq"),
            None,
        )
        .await
        .expect(200);
    assert_eq!(dlq["deadLetterSources"], json!(["orders"]));

    // Batch publish, with typed properties.
    let published = rest
        .publish_batch(
            "orders",
            json!([
                {"headers": {"messageId": "order-1"}, "properties": {"amount": 1009, "currency": "EUR", "express": true}, "body": "{\"id\":1}"},
                {"headers": {"messageId": "order-2"}, "properties": {}, "body": "two"},
                {"headers": {"messageId": "order-3", "ttl": 60000}, "body": "three"},
            ]),
        )
        .await
        .expect(200);
    let statuses: Vec<&str> = published
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["successful"; 3]);
    assert_eq!(published[1]["messageId"], "order-2");
    // Publishing an id already in the queue: accepted, not stored twice.
    let dup = rest
        .publish("orders", "order-2", msg("order-2", "two again"))
        .await
        .expect(201);
    assert_eq!(dup["status"], "successful");
    assert!(
        dup["statusMessage"]
            .as_str()
            .unwrap()
            .contains("not stored again")
    );

    // Consume with a 5 s lock.
    let got = rest
        .consume("orders", "batchSize=10&lockTtl=5000&pollingTime=0")
        .await
        .expect(200);
    let got = got.as_array().unwrap().clone();
    assert_eq!(
        got.iter().map(id).collect::<Vec<_>>(),
        ["order-1", "order-2", "order-3"]
    );
    let first = &got[0];
    assert_eq!(
        first["properties"],
        json!({"amount": 1009, "currency": "EUR", "express": true}),
        "properties come back as they were published"
    );
    assert_eq!(first["body"], "{\"id\":1}");
    let h = &first["headers"];
    assert_eq!(h["deliveryCount"], "1");
    assert_eq!(h["ttl"], "3600000");
    assert_eq!(got[2]["headers"]["ttl"], "60000");
    assert!(
        h["created"].as_str().unwrap().ends_with(" GMT"),
        "{}",
        h["created"]
    );
    for v in h.as_object().unwrap().values() {
        assert!(v.is_string(), "headers are strings: {h}");
    }
    // Nothing else is ready.
    assert_eq!(rest.consume("orders", "pollingTime=0").await.status, 204);

    // Extend order-1's lock to a minute; the others run out after 5 s.
    let ext = rest
        .extend("orders", "order-1", &lock(first), MINUTE)
        .await
        .expect(200);
    assert!(
        ext["statusMessage"]
            .as_str()
            .unwrap()
            .starts_with("lock extended until")
    );
    s.advance(6_000).await;
    rest.ack("orders", "order-2", &lock(&got[1])).await.failure(
        400,
        &format!("LockId: {} provided is expired", lock(&got[1])),
    );
    // order-1 is still locked: the others come back, with a new count.
    let again = rest
        .consume("orders", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    let again = again.as_array().unwrap().clone();
    assert_eq!(
        again.iter().map(id).collect::<Vec<_>>(),
        ["order-2", "order-3"]
    );
    assert_eq!(again[0]["headers"]["deliveryCount"], "2");
    let acked = rest
        .ack("orders", "order-2", &lock(&again[0]))
        .await
        .expect(200);
    assert_eq!(
        acked,
        json!({"messageId": "order-2", "status": "successful", "statusMessage": "message acknowledged"})
    );
    // A lock must be of the message and destination named.
    rest.ack("orders", "order-1", &lock(&again[1]))
        .await
        .failure(400, "is not a lock of message order-1");
    rest.ack("orders-dlq", "order-3", &lock(&again[1]))
        .await
        .failure(400, "is not a lock on destination orders-dlq");
    rest.ack("orders", "order-3", "AQEBxyz+/=")
        .await
        .failure(400, "LockId: AQEBxyz+/= is unknown or expired");
    // order-3 reached its second delivery: a nack moves it to the DLQ.
    rest.nack("orders", "order-3", &lock(&again[1]))
        .await
        .expect(200);
    // order-1: nack (its first delivery ends), then its second ends too.
    rest.nack("orders", "order-1", &lock(first))
        .await
        .expect(200);
    let second = rest.consume("orders", "pollingTime=0").await.expect(200);
    assert_eq!(id(&second[0]), "order-1");
    assert_eq!(second[0]["headers"]["deliveryCount"], "2");
    rest.nack("orders", "order-1", &lock(&second[0]))
        .await
        .expect(200);
    assert_eq!(rest.consume("orders", "pollingTime=0").await.status, 204);

    // Both are in the DLQ, intact; ack them there.
    let dead = rest
        .consume("orders-dlq", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    let dead = dead.as_array().unwrap().clone();
    assert_eq!(
        dead.iter().map(id).collect::<Vec<_>>(),
        ["order-3", "order-1"]
    );
    assert_eq!(dead[1]["properties"]["amount"], 1009);
    assert_eq!(dead[1]["headers"]["deliveryCount"], "1");
    let stats = rest
        .call(
            Method::GET,
            &format!("/mq/stats/api/v1/organizations/{ORG}/environments/{ENV}/regions/us-east-1/queues?destinationIds=orders,orders-dlq,nope"),
            None,
        )
        .await
        .expect(200);
    assert_eq!(
        stats,
        json!([
            {"destination": "orders", "messages": 0, "inflightMessages": 0},
            {"destination": "orders-dlq", "messages": 2, "inflightMessages": 2},
        ])
    );
    let acked = rest
        .call(
            Method::DELETE,
            &format!("{}/messages", Rest::dest("orders-dlq")),
            Some(json!([
                {"messageId": "order-3", "lockId": lock(&dead[0])},
                {"messageId": "order-1", "lockId": lock(&dead[1])},
                {"messageId": "order-1", "lockId": lock(&dead[1])},
            ])),
        )
        .await
        .expect(200);
    let statuses: Vec<&str> = acked
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["successful", "successful", "failure"]);
    assert_eq!(acked[1]["lockId"], lock(&dead[1]));
    assert!(
        acked[2]["statusMessage"]
            .as_str()
            .unwrap()
            .contains("provided is expired")
    );
    let mut grpc = s.clients().await;
    assert_eq!(grpc.stats("orders-dlq").await.total, 0);
    s.stop().await;
}

#[tokio::test]
async fn batch_nack_and_batch_lock_ttl_answer_per_item() {
    let s = facade().await;
    let rest = client_of(&s).await;
    rest.put_queue("q", json!({"defaultLockTtl": 10_000})).await;
    rest.publish_batch("q", json!([msg("a", "1"), msg("b", "2")]))
        .await
        .expect(200);
    let got = rest
        .consume("q", "batchSize=2&pollingTime=0")
        .await
        .expect(200);
    let (a, b) = (lock(&got[0]), lock(&got[1]));
    let ext = rest
        .call(
            Method::PATCH,
            &format!("{}/messages/locks", Rest::dest("q")),
            Some(json!([
                {"messageId": "a", "lockId": a, "ttl": 50_000},
                {"messageId": "b", "lockId": "not-a-lock", "ttl": 50_000},
            ])),
        )
        .await
        .expect(200);
    assert_eq!(ext[0]["status"], "successful");
    assert_eq!(ext[1]["status"], "failure");
    assert!(
        ext[1]["statusMessage"]
            .as_str()
            .unwrap()
            .contains("LockId: not-a-lock is unknown or expired")
    );
    // A ttl beyond 12 hours makes the request invalid.
    rest.call(
        Method::PATCH,
        &format!("{}/messages/locks", Rest::dest("q")),
        Some(json!([
            {"messageId": "a", "lockId": a, "ttl": 1_000},
            {"messageId": "b", "lockId": b, "ttl": 50_000_000},
        ])),
    )
    .await
    .failure(
        400,
        "[1].ttl 50000000 ms is more than 43200000 ms (12 hours)",
    );
    s.advance(20_000).await;
    // b ran out after 10 s and is ready again; a holds its 50 s lock.
    let b2 = rest.consume("q", "pollingTime=0").await.expect(200);
    assert_eq!(id(&b2[0]), "b");
    let nacked = rest
        .call(
            Method::DELETE,
            &format!("{}/messages/locks", Rest::dest("q")),
            Some(json!([
                {"messageId": "a", "lockId": a},
                {"messageId": "b", "lockId": b},
            ])),
        )
        .await
        .expect(200);
    assert_eq!(nacked[0]["status"], "successful");
    assert_eq!(nacked[1]["status"], "failure", "b's first lock is stale");
    let a2 = rest.consume("q", "pollingTime=0").await.expect(200);
    assert_eq!(
        (id(&a2[0]), a2[0]["headers"]["deliveryCount"].as_str()),
        ("a".into(), Some("2"))
    );
    s.stop().await;
}

#[tokio::test]
async fn fifo_groups_and_message_id_dedup() {
    let s = facade().await;
    let rest = client_of(&s).await;
    let q = rest.put_queue("f", json!({"fifo": true})).await;
    assert_eq!(q["fifo"], true);
    let grouped = |id: &str, group: &str| json!({"headers": {"messageId": id, "messageGroupId": group}, "body": id});
    rest.publish_batch(
        "f",
        json!([
            grouped("a1", "A"),
            grouped("b1", "B"),
            grouped("a2", "A"),
            grouped("b2", "B")
        ]),
    )
    .await
    .expect(200);
    // One message per group at a time here: batchSize 1, group A first.
    let one = rest.consume("f", "pollingTime=0").await.expect(200);
    assert_eq!(id(&one[0]), "a1");
    assert_eq!(one[0]["headers"]["messageGroupId"], "A");
    let two = rest.consume("f", "pollingTime=0").await.expect(200);
    assert_eq!(id(&two[0]), "b1");
    // Both groups are locked: nothing else is delivered.
    assert_eq!(rest.consume("f", "pollingTime=0").await.status, 204);
    // A nacked head stays the head of its group.
    rest.nack("f", "a1", &lock(&one[0])).await.expect(200);
    let again = rest.consume("f", "pollingTime=0").await.expect(200);
    assert_eq!(id(&again[0]), "a1");
    rest.ack("f", "a1", &lock(&again[0])).await.expect(200);
    rest.ack("f", "b1", &lock(&two[0])).await.expect(200);
    // Dedup by message id for 5 minutes, even after consumption.
    let dup = rest
        .publish("f", "a1", grouped("a1", "A"))
        .await
        .expect(201);
    assert!(
        dup["statusMessage"]
            .as_str()
            .unwrap()
            .contains("not stored again")
    );
    let rest_of = rest
        .consume("f", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    let ids: Vec<String> = rest_of.as_array().unwrap().iter().map(id).collect();
    assert_eq!(ids, ["a2", "b2"]);
    // A FIFO queue refuses a per-message delay, naming the header.
    rest.publish(
        "f",
        "late",
        json!({"headers": {"messageId": "late", "deliveryDelay": 1000}, "body": ""}),
    )
    .await
    .failure(400, "messages[0].headers.deliveryDelay");
    s.advance(5 * MINUTE).await;
    let fresh = rest
        .publish("f", "a1", grouped("a1", "A"))
        .await
        .expect(201);
    assert_eq!(fresh["statusMessage"], "published", "the window ran out");
    s.stop().await;
}

/// SPEC §3 over REST: a batch consume of a FIFO queue leases consecutive
/// messages of a group; when the first fails, the second's lock is
/// released with it and cannot be acked ahead of the first's redelivery.
#[tokio::test]
async fn fifo_a_failed_message_releases_the_rest_of_its_batch() {
    let s = facade().await;
    let rest = client_of(&s).await;
    rest.put_queue("f", json!({"fifo": true})).await;
    let grouped =
        |id: &str| json!({"headers": {"messageId": id, "messageGroupId": "g"}, "body": id});
    rest.publish_batch("f", json!([grouped("m1"), grouped("m2")]))
        .await
        .expect(200);
    let got = rest
        .consume("f", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    let ids: Vec<String> = got.as_array().unwrap().iter().map(id).collect();
    assert_eq!(ids, ["m1", "m2"]);
    rest.nack("f", "m1", &lock(&got[0])).await.expect(200);
    rest.ack("f", "m2", &lock(&got[1]))
        .await
        .failure(400, "released: the earlier message m1");
    let again = rest
        .consume("f", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    let ids: Vec<String> = again.as_array().unwrap().iter().map(id).collect();
    assert_eq!(ids, ["m1", "m2"], "m1 first again, then m2");
    // Both were delivered twice; only m1 failed (the REST consumer's
    // `deliveryCount` never goes back, SPEC §3).
    assert_eq!(again[0]["headers"]["deliveryCount"], "2");
    assert_eq!(again[0]["headers"]["failedAttempts"], "1");
    assert_eq!(again[1]["headers"]["deliveryCount"], "2");
    assert_eq!(again[1]["headers"]["failedAttempts"], "0");
    rest.ack("f", "m1", &lock(&again[0])).await.expect(200);
    rest.ack("f", "m2", &lock(&again[1])).await.expect(200);
    s.stop().await;
}

#[tokio::test]
async fn exchanges_bindings_and_routing_rules() {
    let s = facade().await;
    let rest = client_of(&s).await;
    let x = rest
        .call(
            Method::PUT,
            &Rest::admin("destinations/exchanges/orders-x"),
            Some(json!({"encrypted": false})),
        )
        .await
        .expect(200);
    assert_eq!(
        x,
        json!({"type": "exchange", "exchangeId": "orders-x", "encrypted": false})
    );
    rest.call(
        Method::PUT,
        &Rest::admin("destinations/queues/orders-x"),
        Some(json!({})),
    )
    .await
    .admin_failure(400, "share one namespace");
    for q in ["all-orders", "eu-orders"] {
        rest.put_queue(q, json!({})).await;
        rest.call(
            Method::PUT,
            &Rest::admin(&format!("bindings/exchanges/orders-x/queues/{q}")),
            None,
        )
        .await
        .expect(200);
    }
    let rules = rest
        .call(
            Method::PUT,
            &Rest::admin("bindings/exchanges/orders-x/queues/eu-orders/rules/routing"),
            Some(json!({"routingRules": [
                {"propertyName": "region", "propertyType": "STRING", "matcherType": "EQ", "value": "EU"}
            ]})),
        )
        .await
        .expect(201);
    assert_eq!(rules["routingRules"][0]["value"], "EU");
    rest.call(
        Method::PUT,
        &Rest::admin("bindings/exchanges/orders-x/queues/eu-orders/rules/routing"),
        Some(json!({"routingRules": [
            {"propertyName": "amount", "propertyType": "NUMERIC", "matcherType": "GT", "value": 10}
        ]})),
    )
    .await
    .admin_failure(501, "NUMERIC GT is not supported");
    let bound = rest
        .call(
            Method::GET,
            &Rest::admin("bindings/exchanges/orders-x?inclusion=all"),
            None,
        )
        .await
        .expect(200);
    assert_eq!(
        bound,
        json!([
            {"exchangeId": "orders-x", "queueId": "all-orders"},
            {"exchangeId": "orders-x", "queueId": "eu-orders", "routingRules": [
                {"propertyName": "region", "propertyType": "STRING", "matcherType": "EQ", "value": "EU"}
            ]},
        ])
    );
    let of_queue = rest
        .call(Method::GET, &Rest::admin("bindings/queues/eu-orders"), None)
        .await
        .expect(200);
    assert_eq!(
        of_queue,
        json!([{"exchangeId": "orders-x", "queueId": "eu-orders"}])
    );

    // Publishing to the exchange routes by the rule.
    let eu = rest
        .publish(
            "orders-x",
            "o-eu",
            json!({"properties": {"region": "EU"}, "body": "eu"}),
        )
        .await
        .expect(201);
    assert_eq!(
        eu["statusMessage"],
        "published, routed to all-orders, eu-orders"
    );
    rest.publish_batch(
        "orders-x",
        json!([{"headers": {"messageId": "o-us"}, "properties": {"region": "US"}, "body": "us"}]),
    )
    .await
    .expect(200);
    let all = rest
        .consume("all-orders", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    assert_eq!(
        all.as_array().unwrap().iter().map(id).collect::<Vec<_>>(),
        ["o-eu", "o-us"]
    );
    let eu_only = rest
        .consume("eu-orders", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    assert_eq!(
        eu_only
            .as_array()
            .unwrap()
            .iter()
            .map(id)
            .collect::<Vec<_>>(),
        ["o-eu"]
    );
    rest.consume("orders-x", "pollingTime=0")
        .await
        .failure(400, "is an exchange");

    // Listing destinations, then removing rules, bindings, the exchange.
    let listed = rest
        .call(
            Method::GET,
            &Rest::admin("destinations?inclusion=minimal"),
            None,
        )
        .await
        .expect(200);
    assert_eq!(
        listed,
        json!([
            {"type": "queue", "queueId": "all-orders"},
            {"type": "queue", "queueId": "eu-orders"},
            {"type": "exchange", "exchangeId": "orders-x", "encrypted": false},
        ])
    );
    let exchanges_only = rest
        .call(
            Method::GET,
            &Rest::admin("destinations?destinationType=exchange&startsWith=nothing"),
            None,
        )
        .await;
    assert_eq!(exchanges_only.status, 204);
    rest.call(
        Method::DELETE,
        &Rest::admin("bindings/exchanges/orders-x/queues/eu-orders/rules/routing"),
        None,
    )
    .await
    .expect(204);
    rest.call(
        Method::DELETE,
        &Rest::admin("bindings/exchanges/orders-x/queues/all-orders"),
        None,
    )
    .await
    .expect(204);
    rest.publish("orders-x", "o-2", json!({"body": "to eu-orders only"}))
        .await
        .expect(201);
    let mut grpc = s.clients().await;
    assert_eq!(grpc.stats("all-orders").await.total, 2);
    assert_eq!(grpc.stats("eu-orders").await.total, 2);
    rest.call(
        Method::DELETE,
        &Rest::admin("destinations/exchanges/orders-x"),
        None,
    )
    .await
    .expect(204);
    rest.publish("orders-x", "o-3", json!({"body": "x"}))
        .await
        .failure(404, "Destination not found: orders-x");
    s.stop().await;
}

#[tokio::test]
async fn the_same_messages_through_grpc_and_rest() {
    let s = facade().await;
    let rest = client_of(&s).await;
    let mut grpc = s.clients().await;
    grpc.create("shared", config()).await;
    // Published over gRPC (a client id, string properties, a binary body),
    // consumed over REST, acknowledged over gRPC with the lock id.
    grpc.msg
        .publish(pb::PublishRequest {
            queue: "shared".into(),
            messages: vec![
                pb::PublishMessage {
                    message_id: "from-grpc".into(),
                    body: b"\xff\xfe binary".to_vec().into(),
                    properties: [("k".to_string(), "v".to_string())].into(),
                    ..Default::default()
                },
                msg_pb("from-grpc-2"),
            ],
            ..Default::default()
        })
        .await
        .unwrap();
    let got = rest
        .consume("shared", "batchSize=1&pollingTime=0")
        .await
        .expect(200);
    assert_eq!(id(&got[0]), "from-grpc");
    assert_eq!(got[0]["properties"], json!({"k": "v"}));
    assert_eq!(got[0]["headers"]["payloadEncoding"], "base64");
    assert_eq!(got[0]["body"], "//4gYmluYXJ5");
    let r = grpc.ack(&[&lock(&got[0])]).await;
    assert!(ok(&r[0]), "the lock id is the gRPC ack token");
    // Received over gRPC, acknowledged over REST with the ack token.
    let d = grpc.receive("shared", 1).await.remove(0);
    assert_eq!(d.message_id, "from-grpc-2");
    rest.ack("shared", "from-grpc-2", &d.ack_token)
        .await
        .expect(200);
    // Published over REST, received over gRPC: numbers are their JSON
    // text, and the reserved property says which were numbers.
    rest.publish(
        "shared",
        "from-rest",
        json!({"headers": {"deliveryDelay": 0}, "properties": {"n": 5.5, "s": "x"}, "body": "hello"}),
    )
    .await
    .expect(201);
    let d = grpc.receive("shared", 1).await.remove(0);
    assert_eq!(
        (d.message_id.as_str(), body(&d).as_str()),
        ("from-rest", "hello")
    );
    assert_eq!(d.properties["n"], "5.5");
    assert_eq!(d.properties["s"], "x");
    assert_eq!(
        serde_json::from_str::<Value>(&d.properties["anypoint.meta"]).unwrap(),
        json!({"json": ["n"], "deliveryDelay": 0})
    );
    // Nacked over gRPC, it comes back over REST as it was published.
    grpc.nack(&d.ack_token, "").await;
    let back = rest.consume("shared", "pollingTime=0").await.expect(200);
    assert_eq!(back[0]["properties"], json!({"n": 5.5, "s": "x"}));
    assert_eq!(back[0]["headers"]["deliveryDelay"], "0");
    assert_eq!(back[0]["headers"]["deliveryCount"], "2");
    // Queues made over REST are ordinary queues over gRPC.
    rest.put_queue("made-by-rest", json!({"defaultLockTtl": 30_000}))
        .await;
    let q = grpc
        .admin
        .get_queue(pb::GetQueueRequest {
            name: "made-by-rest".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .queue
        .unwrap();
    assert_eq!(q.config.unwrap().ack_timeout_ms, Some(30_000));
    s.stop().await;
}

fn msg_pb(id: &str) -> pb::PublishMessage {
    pb::PublishMessage {
        message_id: id.into(),
        body: b"x".to_vec().into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn long_polls_wait_for_a_message_and_end_at_shutdown() {
    let s = facade().await;
    let rest = Arc::new(client_of(&s).await);
    rest.put_queue("lp", json!({})).await;
    let r = Arc::clone(&rest);
    let started = Instant::now();
    let poll = tokio::spawn(async move { r.consume("lp", "pollingTime=10000").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    rest.publish("lp", "m", msg("m", "x")).await.expect(201);
    let got = poll.await.unwrap().expect(200);
    assert_eq!(id(&got[0]), "m");
    assert!(started.elapsed() < Duration::from_secs(5));
    // A poll that finds nothing answers 204 once pollingTime has passed.
    let started = Instant::now();
    assert_eq!(rest.consume("lp", "pollingTime=300").await.status, 204);
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A poll in flight at shutdown answers 204 at once.
    let r = Arc::clone(&rest);
    let poll = tokio::spawn(async move { r.consume("lp", "pollingTime=20000").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    s.stop().await;
    let reply = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the poll ended")
        .unwrap();
    assert_eq!(reply.status, 204);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn lock_lengths_and_groups_on_standard_queues() {
    let s = facade().await;
    let rest = client_of(&s).await;
    rest.put_queue("q", json!({"defaultLockTtl": 30_000})).await;
    let grouped =
        |id: &str| json!({"headers": {"messageId": id, "messageGroupId": "g-1"}, "body": id});
    rest.publish_batch("q", json!([grouped("a"), grouped("b"), grouped("c")]))
        .await
        .expect(200);
    let mut grpc = s.clients().await;
    let deadline = |grpc: &mut Clients, id: &'static str| {
        let mut grpc = grpc.clone();
        async move {
            grpc.browse("q")
                .await
                .into_iter()
                .find(|m| m.message_id == id)
                .unwrap()
                .lease_deadline_unix_ms
        }
    };
    // No lockTtl (or 0): the queue's default lock.
    let a = rest
        .consume("q", "pollingTime=0&lockTtl=0")
        .await
        .expect(200);
    assert_eq!(id(&a[0]), "a");
    assert_eq!(
        a[0]["headers"]["messageGroupId"], "g-1",
        "a standard queue keeps a group as a header"
    );
    assert_eq!(deadline(&mut grpc, "a").await, T0 + 30_000);
    // The specification allows 24 hours; a lock lasts at most 12.
    rest.consume("q", "pollingTime=0&lockTtl=86400000")
        .await
        .expect(200);
    assert_eq!(deadline(&mut grpc, "b").await, T0 + 12 * 60 * MINUTE);
    // Below a second: one second.
    rest.consume("q", "pollingTime=0&lockTtl=1")
        .await
        .expect(200);
    assert_eq!(deadline(&mut grpc, "c").await, T0 + 1_000);
    // A PATCH ttl below a second is a second too; 0 is refused.
    rest.extend("q", "a", &lock(&a[0]), 5).await.expect(200);
    assert_eq!(deadline(&mut grpc, "a").await, T0 + 1_000);
    rest.extend("q", "a", &lock(&a[0]), 0)
        .await
        .failure(400, "ttl must be at least 1");
    s.stop().await;
}

#[tokio::test]
async fn errors_follow_the_shapes_and_codes_of_the_specs() {
    let s = InProc::start_with(|c| {
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.broker.max_message_size = 1024;
    })
    .await;
    let mut rest = Rest::new(s.anypoint.unwrap());
    // No token, a bad token, a wrong scheme: 401.
    rest.consume("q", "")
        .await
        .failure(401, "access token is required");
    rest.token = Some("made-up".into());
    rest.consume("q", "")
        .await
        .failure(401, "unknown or expired");
    rest.authorize("", "")
        .await
        .failure(401, "client_id and client_secret");
    let r = rest
        .raw(
            Method::POST,
            "/api/v1/authorize",
            "application/x-www-form-urlencoded",
            b"client_id=a&client_secret=b&grant_type=password".to_vec(),
            None,
        )
        .await;
    r.failure(401, "grant_type \"password\"");
    rest.authorize("app", "x").await.expect(200);
    // Destinations.
    rest.consume("nope", "pollingTime=0")
        .await
        .failure(404, "Destination not found: nope");
    rest.publish("nope", "m", msg("m", "x"))
        .await
        .failure(404, "Destination not found: nope");
    rest.ack("nope", "m", "x")
        .await
        .failure(404, "Destination not found");
    rest.put_queue("q", json!({})).await;
    // Query parameters out of their ranges.
    for (query, needle) in [
        ("pollingTime=20001", "pollingTime"),
        ("batchSize=11", "batchSize"),
        ("batchSize=0", "batchSize"),
        ("lockTtl=86400001", "lockTtl"),
        ("payloadVisibility=some", "payloadVisibility"),
    ] {
        rest.consume("q", query).await.failure(400, needle);
    }
    // Bodies.
    rest.publish_batch("q", json!([]))
        .await
        .failure(400, "1 to 10 messages");
    let eleven: Vec<Value> = (0..11).map(|i| msg(&format!("m{i}"), "x")).collect();
    rest.publish_batch("q", Value::Array(eleven))
        .await
        .failure(400, "1 to 10 messages, not 11");
    rest.publish_batch("q", json!([{"body": "no id"}]))
        .await
        .failure(400, "messages[0].headers.messageId is required");
    rest.publish("q", "m", json!({"headers": {"ttl": 10}, "body": "x"}))
        .await
        .failure(400, "messages[0].headers.ttl");
    let r = rest
        .raw(
            Method::PUT,
            &format!("{}/messages/m", Rest::dest("q")),
            "application/json",
            b"{not json".to_vec(),
            rest.token.as_deref(),
        )
        .await;
    r.failure(400, "not valid JSON");
    // Too large: 413 with the send response shape (per message in a batch).
    let big = "x".repeat(2000);
    let r = rest.publish("q", "big", msg("big", &big)).await;
    assert_eq!(r.status, 413);
    assert_eq!(
        (&r.body["messageId"], &r.body["status"]),
        (&json!("big"), &json!("failure"))
    );
    let r = rest
        .publish_batch("q", json!([msg("small", "x"), msg("big", &big)]))
        .await;
    assert_eq!(r.status, 413);
    assert_eq!(r.body[0]["messageId"], "small");
    assert!(
        r.body[0]["statusMessage"]
            .as_str()
            .unwrap()
            .contains("all or nothing")
    );
    let mut grpc = s.clients().await;
    assert_eq!(
        grpc.stats("q").await.total,
        0,
        "refused publishes store nothing"
    );
    // Admin errors are {"message": ...}.
    rest.call(
        Method::GET,
        &Rest::admin("destinations/queues/missing"),
        None,
    )
    .await
    .admin_failure(404, "queue not found: missing");
    rest.call(
        Method::PUT,
        &Rest::admin("destinations/queues/bad"),
        Some(json!({"defaultLockTtl": 10})),
    )
    .await
    .admin_failure(400, "defaultLockTtl");
    rest.call(
        Method::PUT,
        &Rest::admin("destinations/queues/bad"),
        Some(json!({"maxDeliveries": 3})),
    )
    .await
    .admin_failure(400, "maxDeliveries needs deadLetterQueueId");
    rest.call(
        Method::PUT,
        &Rest::admin("destinations/queues/bad"),
        Some(json!({"deadLetterQueueId": "missing-dlq"})),
    )
    .await
    .admin_failure(404, "missing-dlq");
    rest.call(
        Method::PUT,
        &Rest::admin("destinations/queues/q"),
        Some(json!({"fifo": true})),
    )
    .await
    .admin_failure(400, "fifo");
    // Unknown operations: a JSON 404 or 405.
    rest.call(Method::GET, "/api/v1/nothing-here", None)
        .await
        .failure(404, "no such operation: GET /api/v1/nothing-here");
    rest.call(Method::POST, &format!("{}/messages", Rest::dest("q")), None)
        .await
        .failure(405, "POST is not an operation");
    // A HEAD of the messages would lock them unseen: refused.
    rest.publish("q", "h", msg("h", "x")).await.expect(201);
    let head = rest
        .call(
            Method::HEAD,
            &format!("{}/messages?pollingTime=0", Rest::dest("q")),
            None,
        )
        .await;
    assert_eq!(head.status, 405);
    assert_eq!(grpc.stats("q").await.in_flight, 0, "nothing was locked");
    s.stop().await;
}

#[tokio::test]
async fn admin_put_replaces_patch_changes_and_purge_empties() {
    let s = facade().await;
    let rest = client_of(&s).await;
    rest.put_queue("dlq", json!({})).await;
    let q = rest
        .put_queue(
            "work",
            json!({"defaultTtl": 120_000, "deadLetterQueueId": "dlq", "maxDeliveries": 3}),
        )
        .await;
    assert_eq!(q["maxDeliveries"], 3);
    // A PUT is the whole configuration: left out means default, and no
    // deadLetterQueueId means no dead letter queue.
    let q = rest
        .put_queue("work", json!({"defaultLockTtl": 5_000}))
        .await;
    assert_eq!(q["defaultTtl"], 604_800_000);
    assert_eq!(q["defaultLockTtl"], 5_000);
    assert!(q.get("deadLetterQueueId").is_none(), "{q}");
    // v2 PATCH: only what is given.
    let v2 = format!(
        "/mq/admin/api/v2/organizations/{ORG}/environments/{ENV}/regions/eu-central-1/destinations/queues/work"
    );
    let q = rest
        .call(
            Method::PATCH,
            &v2,
            Some(json!({"deadLetterQueueId": "dlq", "maxDeliveries": 4})),
        )
        .await
        .expect(200);
    assert_eq!(
        (&q["maxDeliveries"], &q["defaultLockTtl"]),
        (&json!(4), &json!(5_000))
    );
    let q = rest
        .call(Method::PATCH, &v2, Some(json!({"defaultTtl": 60_000})))
        .await
        .expect(200);
    assert_eq!(
        (&q["maxDeliveries"], &q["defaultTtl"]),
        (&json!(4), &json!(60_000))
    );
    // v1 PATCH without the dead-letter fields removes the DLQ.
    let q = rest
        .call(
            Method::PATCH,
            &Rest::admin("destinations/queues/work"),
            Some(json!({"defaultDeliveryDelay": 1_000})),
        )
        .await
        .expect(200);
    assert_eq!(q["defaultDeliveryDelay"], 1_000);
    assert!(q.get("deadLetterQueueId").is_none(), "{q}");
    // Purge, then delete.
    rest.publish_batch("work", json!([msg("a", "1"), msg("b", "2")]))
        .await
        .expect(200);
    rest.call(
        Method::DELETE,
        &Rest::admin("destinations/queues/work/messages"),
        None,
    )
    .await
    .expect(204);
    let mut grpc = s.clients().await;
    assert_eq!(grpc.stats("work").await.total, 0);
    rest.call(
        Method::DELETE,
        &Rest::admin("destinations/queues/work"),
        None,
    )
    .await
    .expect(204);
    rest.call(Method::GET, &Rest::admin("destinations/queues/work"), None)
        .await
        .admin_failure(404, "queue not found");
    s.stop().await;
}

fn principal(name: &str, client: &str, secret: &str) -> PrincipalConfig {
    PrincipalConfig {
        name: name.into(),
        client_id: Some(client.into()),
        secret_hash: Some(hash_secret(secret).unwrap()),
        ..Default::default()
    }
}

/// Five wrong secrets for one client id from one address within five
/// minutes: `authorize` for it from there answers 429 without a check, the
/// right secret too, while another client id is checked as usual.
#[tokio::test]
async fn wrong_secrets_close_authorize_for_that_client_from_that_address() {
    let auth = Arc::new(
        Authenticator::new(&[
            principal("ops", "ops-client", "ops-secret"),
            principal("app", "app-client", "app-secret"),
        ])
        .unwrap(),
    );
    let s = InProc::start_with(move |c| {
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.auth = auth;
    })
    .await;
    let mut rest = Rest::new(s.anypoint.unwrap());
    for i in 0..5 {
        rest.authorize("ops-client", &format!("guess-{i}"))
            .await
            .failure(401, "bad client id or secret");
    }
    for secret in ["guess-5", "ops-secret"] {
        let r = rest.authorize("ops-client", secret).await;
        let wait: u64 = r
            .retry_after
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("Retry-After in seconds");
        assert!((1..=300).contains(&wait), "{wait}");
        r.failure(
            429,
            "too many wrong secrets for client id \"ops-client\" from 127.0.0.1",
        );
    }
    rest.authorize("app-client", "app-secret").await.expect(200);
    s.stop().await;
}

#[tokio::test]
async fn client_apps_are_checked_and_tokens_expire() {
    let app = PrincipalConfig {
        publish: vec!["orders".into()],
        consume: vec!["orders".into()],
        ..principal("orders-app", "orders-client", "orders-secret")
    };
    let admin = PrincipalConfig {
        admin: vec!["*".into()],
        consume: vec!["*".into()],
        token_sha256: vec![hex_sha256(b"static-admin-token")],
        ..principal("ops", "ops-client", "ops-secret")
    };
    let auth = Arc::new(Authenticator::new(&[app, admin]).unwrap());
    let s = InProc::start_with(move |c| {
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.auth = auth;
    })
    .await;
    let mut ops = Rest::new(s.anypoint.unwrap());
    ops.authorize("ops-client", "wrong")
        .await
        .failure(401, "bad client id or secret");
    ops.authorize("nobody", "ops-secret")
        .await
        .failure(401, "bad client id or secret");
    ops.authorize("ops-client", "ops-secret").await.expect(200);
    ops.put_queue("orders", json!({})).await;
    ops.put_queue("billing", json!({})).await;
    // A configured bearer token works as well.
    let mut static_ops = Rest::new(s.anypoint.unwrap());
    static_ops.token = Some("static-admin-token".into());
    static_ops.put_queue("audit", json!({})).await;

    let mut app = Rest::new(s.anypoint.unwrap());
    app.authorize("orders-client", "orders-secret")
        .await
        .expect(200);
    app.publish("orders", "o1", msg("o1", "x"))
        .await
        .expect(201);
    app.publish("billing", "b1", msg("b1", "x"))
        .await
        .failure(403, "may not publish \"billing\"");
    app.consume("billing", "pollingTime=0")
        .await
        .failure(403, "may not consume");
    app.call(
        Method::PUT,
        &Rest::admin("destinations/queues/mine"),
        Some(json!({})),
    )
    .await
    .admin_failure(403, "may not admin");
    let got = app.consume("orders", "pollingTime=0").await.expect(200);
    // A lock on "orders" cannot be settled through "billing".
    ops.ack("billing", "o1", &lock(&got[0]))
        .await
        .failure(400, "not a lock on destination billing");
    app.ack("orders", "o1", &lock(&got[0])).await.expect(200);
    // Listing shows what the caller may see.
    app.call(Method::GET, &Rest::admin("destinations"), None)
        .await
        .expect(200)
        .as_array()
        .unwrap()
        .iter()
        .for_each(|d| assert_eq!(d["queueId"], "orders"));
    // 60 minutes after its last use a token is gone; each use extends it.
    s.advance(50 * MINUTE).await;
    app.consume("orders", "pollingTime=0").await.expect(204);
    s.advance(50 * MINUTE).await;
    app.consume("orders", "pollingTime=0").await.expect(204);
    s.advance(61 * MINUTE).await;
    app.consume("orders", "pollingTime=0")
        .await
        .failure(401, "unknown or expired");
    app.authorize("orders-client", "orders-secret")
        .await
        .expect(200);
    app.consume("orders", "pollingTime=0").await.expect(204);
    s.stop().await;
}

#[tokio::test]
async fn the_binary_serves_the_facade_on_the_second_line_address() {
    let mut s = TestServer::start_with(&[
        "--anypoint-listen",
        "127.0.0.1:0",
        "--anypoint-lock-ttl-unit",
        "s",
    ])
    .await;
    let mut rest = Rest::new(s.anypoint.expect("second line"));
    rest.authorize("app", "secret").await.expect(200);
    rest.put_queue("q", json!({"defaultLockTtl": 10_000})).await;
    rest.publish("q", "m", msg("m", "x")).await.expect(201);
    let got = rest.consume("q", "pollingTime=0").await.expect(200);
    // With `--anypoint-lock-ttl-unit s`, a PATCH ttl of 600 is 10 minutes.
    rest.extend("q", "m", &lock(&got[0]), 600).await.expect(200);
    let mut grpc = s.clients().await;
    let leased = grpc.browse("q").await.remove(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let now = u64::try_from(now).unwrap();
    let left = leased.lease_deadline_unix_ms.saturating_sub(now);
    assert!(
        (590_000..=600_000).contains(&left),
        "lease ends in {left} ms"
    );
    let status = s.stop().await;
    assert!(status.success(), "{status}");
    // Off by default.
    let plain = TestServer::start().await;
    assert!(plain.anypoint.is_none());
}

/// The curl walk-through of README.md's "Use Letterbox as a local Anypoint
/// MQ", exactly as printed there, run by bash (stopping at the first
/// failing command) against the binary: ack, a nack that moves a message
/// to the dead letter queue, and that message read in the DLQ.
#[tokio::test]
async fn the_readme_curl_walkthrough_runs_as_printed() {
    let block = readme_anypoint_curl_block();
    let mut s = TestServer::start_with(&["--anypoint-listen", "127.0.0.1:0"]).await;
    let mq = format!("http://{}", s.anypoint.expect("anypoint on"));
    let out = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block])
            .env("MQ", mq)
            .output()
            .expect("run bash")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README block failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // One answer per line up to the DLQ read, which json.tool spreads out.
    let answers: Vec<Value> = lines
        .iter()
        .take_while(|l| **l != "[")
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{stdout}")))
        .collect();
    assert_eq!(answers.len(), 5, "{stdout}");
    assert_eq!(answers[0]["queueId"], "order-created-invoice-dlq");
    assert_eq!(answers[1]["maxDeliveries"], 1);
    assert_eq!(answers[2][1]["status"], "successful");
    assert_eq!(
        answers[3],
        json!({"messageId": "order-1", "status": "successful", "statusMessage": "message acknowledged"})
    );
    let nack = &answers[4];
    assert_eq!(
        (
            &nack["messageId"],
            &nack["deadLettered"],
            &nack["deadLetterQueueId"]
        ),
        (
            &json!("order-2"),
            &json!(true),
            &json!("order-created-invoice-dlq")
        ),
        "{nack}"
    );
    let start = lines.iter().position(|l| *l == "[").expect("the DLQ read");
    let dead: Value = serde_json::from_str(&lines[start..].join("\n")).expect("JSON");
    let m = &dead[0];
    assert_eq!(m["headers"]["messageId"], "order-2", "{dead}");
    assert_eq!(m["body"], "{\"order\":2}");
    let p = &m["properties"];
    assert_eq!(p["amount"], 42);
    assert_eq!(p["x-letterbox-dead-letter-source"], "order-created-invoice");
    assert_eq!(p["x-letterbox-dead-letter-reason"], "MAX_DELIVERIES");
    assert_eq!(p["x-letterbox-dead-letter-delivery-count"], "1");
    assert!(
        p["x-letterbox-dead-letter-time"]
            .as_str()
            .is_some_and(|t| t.ends_with(" GMT")),
        "{p}"
    );
    let status = s.stop().await;
    assert!(status.success(), "{status}");
}

/// The `sh` block of README.md's Anypoint section that starts with `MQ=`.
fn readme_anypoint_curl_block() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Use Letterbox as a local Anypoint MQ"))
        .expect("the Anypoint section of README.md");
    section
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split_once("\n```").map(|(code, _)| code))
        .find(|code| code.starts_with("MQ="))
        .expect("a sh block starting with MQ= in the Anypoint section")
        .to_string()
}

#[tokio::test]
async fn a_nack_says_when_the_message_moved_and_the_dlq_copy_carries_its_record() {
    let s = facade().await;
    let rest = client_of(&s).await;
    let mut grpc = s.clients().await;
    rest.put_queue("jobs-dlq", json!({})).await;
    rest.put_queue(
        "jobs",
        json!({"deadLetterQueueId": "jobs-dlq", "maxDeliveries": 2}),
    )
    .await;
    rest.publish_batch(
        "jobs",
        json!([
            {"headers": {"messageId": "j1"}, "properties": {"x-letterbox-dead-letter-source": "made up", "k": "v"}, "body": "one"},
            msg("j2", "two"),
        ]),
    )
    .await
    .expect(200);
    // First deliveries: a nack makes j1 available again, and says so.
    let got = rest
        .consume("jobs", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    assert_eq!(
        got[0]["properties"],
        json!({"x-letterbox-dead-letter-source": "made up", "k": "v"}),
        "published properties of those names pass through"
    );
    let r = rest.nack("jobs", "j1", &lock(&got[0])).await.expect(200);
    assert_eq!(
        r,
        json!({"messageId": "j1", "status": "successful",
               "statusMessage": "message released: available again for this or other consumers",
               "deadLettered": false})
    );
    // j2 is nacked over gRPC, with a reason.
    assert!(ok(&grpc.nack(&lock(&got[1]), "payment service down").await));
    // Second deliveries: their last. A single nack and a batch nack.
    let got = rest
        .consume("jobs", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    assert_eq!(got.as_array().unwrap().len(), 2, "{got}");
    let r = rest.nack("jobs", "j1", &lock(&got[0])).await.expect(200);
    assert_eq!(
        (&r["deadLettered"], &r["deadLetterQueueId"]),
        (&json!(true), &json!("jobs-dlq"))
    );
    assert_eq!(
        r["statusMessage"],
        "message moved to the dead letter queue jobs-dlq: it reached the queue's maxDeliveries (2 failed attempts)"
    );
    let d = grpc.receive("jobs", 1).await;
    assert!(d.is_empty(), "j2 is still locked by its REST consume");
    let r = rest
        .call(
            Method::DELETE,
            &format!("{}/messages/locks", Rest::dest("jobs")),
            Some(json!([
                {"messageId": "j2", "lockId": lock(&got[1])},
                {"messageId": "j2", "lockId": lock(&got[1])},
            ])),
        )
        .await
        .expect(200);
    assert_eq!(
        (
            &r[0]["status"],
            &r[0]["deadLettered"],
            &r[0]["deadLetterQueueId"]
        ),
        (&json!("successful"), &json!(true), &json!("jobs-dlq"))
    );
    assert_eq!(r[1]["status"], "failure");
    assert!(r[1].get("deadLettered").is_none(), "{}", r[1]);
    // In the DLQ: each carries the record of its move.
    let dead = rest
        .consume("jobs-dlq", "batchSize=10&pollingTime=0")
        .await
        .expect(200);
    assert_eq!(
        dead[0]["properties"],
        json!({
            "k": "v",
            "x-letterbox-dead-letter-source": "jobs",
            "x-letterbox-dead-letter-reason": "MAX_DELIVERIES",
            "x-letterbox-dead-letter-delivery-count": "2",
            "x-letterbox-dead-letter-failed-attempts": "2",
            "x-letterbox-dead-letter-time": "Tue, 14 Nov 2023 22:13:20 GMT",
        }),
        "the record replaces the published look-alike"
    );
    assert_eq!(id(&dead[1]), "j2");
    assert_eq!(
        dead[1]["properties"]["x-letterbox-dead-letter-last-error"],
        "payment service down"
    );
    assert_eq!(dead[1]["headers"]["deliveryCount"], "1");
    assert_eq!(dead[1]["headers"]["failedAttempts"], "0");
    // gRPC's Browse shows the same record.
    let browsed = grpc.browse("jobs-dlq").await;
    let record = &browsed[1].dead_letters[0];
    assert_eq!(
        (
            record.source_queue.as_str(),
            record.delivery_count,
            record.failed_attempts
        ),
        ("jobs", 2, 2)
    );
    s.stop().await;
}

#[tokio::test]
async fn admin_and_stats_operations_letterbox_lacks_answer_501_naming_them() {
    let s = facade().await;
    let mut rest = client_of(&s).await;
    let admin = format!("/mq/admin/api/v1/organizations/{ORG}/environments/{ENV}");
    let stats = format!("/mq/stats/api/v1/organizations/{ORG}");
    let region = "regions/us-east-1";
    let cases = [
        (
            Method::DELETE,
            format!("/mq/admin/api/v1/organizations/{ORG}"),
            "DELETE /v1/organizations/{organizationId}",
        ),
        (
            Method::DELETE,
            admin.clone(),
            "DELETE /v1/organizations/{organizationId}/environments/{environmentId}",
        ),
        (
            Method::GET,
            format!("{admin}/clients"),
            "GET /v1/organizations/{organizationId}/environments/{environmentId}/clients",
        ),
        (
            Method::PUT,
            format!("{admin}/clients"),
            "PUT /v1/organizations/{organizationId}/environments/{environmentId}/clients",
        ),
        (
            Method::POST,
            format!("{admin}/clients/c1"),
            "POST /v1/organizations/{organizationId}/environments/{environmentId}/clients/{clientId}",
        ),
        (
            Method::DELETE,
            format!("{admin}/clients/c1"),
            "DELETE /v1/organizations/{organizationId}/environments/{environmentId}/clients/{clientId}",
        ),
        (
            Method::GET,
            format!("{admin}/regions"),
            "GET /v1/organizations/{organizationId}/environments/{environmentId}/regions",
        ),
        (
            Method::GET,
            format!("{admin}/{region}"),
            "GET /v1/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}",
        ),
        (
            Method::PUT,
            format!("{admin}/{region}/destinations/queues/q/fallback"),
            "PUT /v1/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}/destinations/queues/{queueId}/fallback",
        ),
        (
            Method::GET,
            stats.clone(),
            "GET /organizations/{organizationId}",
        ),
        (
            Method::GET,
            format!("{stats}/environments/{ENV}"),
            "GET /organizations/{organizationId}/environments/{environmentId}",
        ),
        (
            Method::GET,
            format!("{stats}/environments/{ENV}/{region}/queues/q?startDate=x&endDate=y&period=60"),
            "GET /organizations/{organizationId}/environments/{environmentId}/regions/{regionId}/queues/{queueId}",
        ),
        (
            Method::GET,
            format!("{stats}/environments/{ENV}/{region}/exchanges/x"),
            "GET /organizations/{organizationId}/environments/{environmentId}/regions/{regionId}/exchanges/{exchangeId}",
        ),
    ];
    for (method, path, operation) in &cases {
        let r = rest.call(method.clone(), path, Some(json!({}))).await;
        assert_eq!(r.status, 501, "{method} {path}: {}", r.body);
        assert_eq!(r.body["operation"], *operation, "{method} {path}");
        let m = r.body["message"].as_str().unwrap();
        assert!(
            m.starts_with(&format!("{operation} is not implemented by Letterbox: ")),
            "{m}"
        );
    }
    // The implemented neighbours still answer as before.
    rest.call(Method::GET, &format!("{admin}/{region}/destinations"), None)
        .await
        .expect(204);
    rest.call(
        Method::GET,
        &format!("{stats}/environments/{ENV}/{region}/queues?destinationIds=q"),
        None,
    )
    .await
    .expect(204);
    // A method no specification has on these paths is still 405, an
    // unknown path 404.
    rest.call(Method::PATCH, &format!("{admin}/regions"), None)
        .await
        .admin_failure(405, "PATCH is not an operation");
    rest.call(Method::GET, &format!("{admin}/somewhere"), None)
        .await
        .admin_failure(404, "no such operation");
    // Authentication first, as for every call.
    rest.token = None;
    rest.call(Method::GET, &format!("{admin}/regions"), None)
        .await
        .admin_failure(401, "access token is required");
    s.stop().await;
}

#[tokio::test]
async fn error_texts_speak_rest() {
    let s = InProc::start_with(|c| {
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.broker.max_message_size = 1024;
        c.anypoint.max_body_bytes = 4096;
    })
    .await;
    let rest = client_of(&s).await;
    let mut grpc = s.clients().await;
    // The dead letter queue of another queue: 409, in Admin API terms.
    rest.put_queue("dlq", json!({})).await;
    rest.put_queue("a", json!({"deadLetterQueueId": "dlq", "maxDeliveries": 3}))
        .await;
    let r = rest
        .call(
            Method::DELETE,
            &Rest::admin("destinations/queues/dlq"),
            None,
        )
        .await;
    let m = r.body["message"].as_str().unwrap_or_default().to_string();
    r.admin_failure(
        409,
        "queue dlq is the dead letter queue of a: give it another deadLetterQueueId, or none",
    );
    assert!(!m.contains("force"), "{m}");
    rest.call(
        Method::PATCH,
        &Rest::admin("destinations/queues/a"),
        Some(json!({})),
    )
    .await
    .expect(200);
    rest.call(
        Method::DELETE,
        &Rest::admin("destinations/queues/dlq"),
        None,
    )
    .await
    .expect(204);
    // 63 properties and a number: anypoint.meta makes 65, and is named.
    let mut props = serde_json::Map::new();
    for i in 0..63 {
        props.insert(format!("p{i}"), json!("v"));
    }
    props.insert("n".into(), json!(1));
    let r = rest
        .publish("a", "m", json!({"properties": props, "body": "x"}))
        .await;
    r.failure(
        400,
        "messages[0].properties: 64 properties plus anypoint.meta make 65, and at most 64 are allowed",
    );
    props.remove("n");
    props.insert("p63".into(), json!("v"));
    let r = rest
        .publish(
            "a",
            "m",
            json!({"headers": {"deliveryDelay": 5}, "properties": props.clone(), "body": "x"}),
        )
        .await;
    r.failure(400, "anypoint.meta");
    // 64 string properties and no header kept in it: accepted.
    rest.publish("a", "m", json!({"properties": props, "body": "x"}))
        .await
        .expect(201);
    props.insert("p64".into(), json!("v"));
    let r = rest
        .publish("a", "m", json!({"properties": props, "body": "x"}))
        .await;
    r.failure(400, "at most 64 entries are allowed");
    // A lock id Letterbox never issued.
    rest.nack("a", "m", "0123456789abcdef")
        .await
        .failure(400, "LockId: 0123456789abcdef is unknown or expired");
    rest.extend("a", "m", "nope", 1_000)
        .await
        .failure(400, "LockId: nope is unknown or expired");
    // Over the size limit: a message (the engine's limit) and a request
    // body (the facade's) fail in the same per-message shape.
    let big = "x".repeat(2000);
    let one = rest.publish("a", "big", msg("big", &big)).await;
    assert_eq!(one.status, 413);
    let huge = "x".repeat(5000);
    let over = rest.publish("a", "huge", msg("huge", &huge)).await;
    assert_eq!(over.status, 413, "{}", over.body);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&over.body), keys(&one.body));
    assert_eq!(
        (&over.body["messageId"], &over.body["status"]),
        (&json!("huge"), &json!("failure"))
    );
    assert!(
        over.body["statusMessage"]
            .as_str()
            .unwrap()
            .contains("the request body is more than 4096 bytes"),
        "{}",
        over.body
    );
    // A batch: the ids before the limit are named, each with the reason.
    let text = format!(
        r#"[{{"headers":{{"messageId":"b1"}},"body":"x"}},{{"headers":{{"messageId":"b2"}},"body":"{huge}"}},{{"headers":{{"messageId":"b3"}},"body":"x"}}]"#
    );
    let r = rest
        .raw(
            Method::PUT,
            &format!("{}/messages", Rest::dest("a")),
            "application/json",
            text.into_bytes(),
            rest.token.as_deref(),
        )
        .await;
    assert_eq!(r.status, 413, "{}", r.body);
    let items = r.body.as_array().expect("an array, as for a batch");
    let ids: Vec<&str> = items
        .iter()
        .map(|i| i["messageId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["b1", "b2"]);
    for i in items {
        assert_eq!(i["status"], "failure");
        assert!(
            i["statusMessage"]
                .as_str()
                .unwrap()
                .contains("(a batch is published all or nothing)"),
            "{i}"
        );
    }
    let batch_small = rest
        .publish_batch("a", json!([msg("s1", "x"), msg("s2", &big)]))
        .await;
    assert_eq!(batch_small.status, 413);
    assert_eq!(keys(&batch_small.body[0]), keys(&items[0]));
    assert_eq!(grpc.stats("a").await.total, 1, "only the accepted m");
    s.stop().await;
}

/// The contract test: schemathesis drives the facade from the official
/// OpenAPI files (Broker, Admin, Stats), and a Python client validates the
/// answers of a scripted session against the specifications' schemas.
/// The script installs what it needs (from PyPI) under target/.
#[test]
fn contract_test_against_the_official_openapi_specs() {
    let Some(text) = crate::ecosystem::skip_or_run(
        "contract_test_against_the_official_openapi_specs",
        "tests/anypoint/run.sh",
        &[],
        &[],
    ) else {
        return;
    };
    assert!(text.contains("PASS: anypoint contract"), "{text}");
}

/// The REST facade's destructive acts and refused credentials are in the
/// audit log like gRPC's, with the principal and the peer address.
#[tokio::test]
async fn rest_admin_acts_and_refusals_are_audited() {
    let s =
        TestServer::start_with(&["--anypoint-listen", "127.0.0.1:0", "--log-format", "json"]).await;
    let mut rest = Rest::new(s.anypoint.expect("anypoint on"));
    rest.authorize("app", "secret").await.expect(200);
    rest.put_queue("work", json!({})).await;
    rest.put_queue("work", json!({"defaultLockTtl": 5_000}))
        .await;
    rest.publish_batch("work", json!([msg("a", "1"), msg("b", "2")]))
        .await
        .expect(200);
    rest.call(
        Method::DELETE,
        &Rest::admin("destinations/queues/work/messages"),
        None,
    )
    .await
    .expect(204);
    rest.call(
        Method::DELETE,
        &Rest::admin("destinations/queues/work"),
        None,
    )
    .await
    .expect(204);
    let stranger = Rest {
        token: Some("no-such-token".into()),
        ..Rest::new(rest.addr)
    };
    stranger
        .call(Method::GET, &Rest::admin("destinations"), None)
        .await
        .expect(401);

    let events: Vec<Value> = s
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "letterbox::audit")
        .map(|v| v["fields"].clone())
        .collect();
    let actions: Vec<(&str, &str)> = events
        .iter()
        .map(|f| {
            (
                f["action"].as_str().unwrap(),
                f["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("queue.create", "done"),
            ("queue.update", "done"),
            ("queue.purge", "done"),
            ("queue.delete", "done"),
            ("authenticate", "refused"),
        ],
        "{events:?}"
    );
    assert_eq!(events[2]["detail"], "messages_deleted=2");
    for e in &events {
        assert!(
            e["peer"]
                .as_str()
                .is_some_and(|p| p.starts_with("127.0.0.1:")),
            "{e}"
        );
    }
    assert_eq!(events[0]["principal"], "anonymous", "{events:?}");
}

/// A request whose body the handler does not need (a GET sent with a body,
/// as some clients do) still leaves its keep-alive connection usable, even
/// when the body comes after the headers in a later packet.
#[tokio::test]
async fn a_body_sent_after_the_headers_keeps_the_connection_usable() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start_with(&["--anypoint-listen", "127.0.0.1:0"]).await;
    let addr = s.anypoint.expect("anypoint on");
    let mut rest = Rest::new(addr);
    rest.authorize("app", "secret").await.expect(200);
    rest.put_queue("kept", json!({})).await;
    let token = rest.token.clone().expect("token");
    let path = Rest::admin("destinations/queues/kept");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    tcp.write_all(b"{}").await.unwrap();
    // Read the first answer, then ask again on the same connection.
    let read_answer = async |tcp: &mut tokio::net::TcpStream| {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
                .await
                .expect("an answer in time")
                .unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    break;
                }
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    let first = read_answer(&mut tcp).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let again = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: bearer {token}\r\n\r\n");
    tcp.write_all(again.as_bytes()).await.unwrap();
    let second = read_answer(&mut tcp).await;
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "the connection was closed: {second:?}"
    );
}
