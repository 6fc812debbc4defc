//! The SQS endpoint with principals: every request signed (SigV4) with
//! the access key of a principal, its signature, date and payload hash
//! checked, refusals with AWS's codes, grants as over gRPC, and refusals
//! and acts in the audit log.

use std::time::{SystemTime, UNIX_EPOCH};

use hyper::{HeaderMap, Method, Request, Uri};
use letterbox::sqs::{Signer, sign};
use serde_json::{Value, json};

use crate::harness::*;
use crate::sqs::{Reply, Sqs};

const OPS_KEY: &str = "LBKOPSOPSOPSOPS00001";
const OPS_SECRET: &str = "ops/secret+access+key/0123456789abcdefghij";
const APP_KEY: &str = "LBKAPPAPPAPPAPP00002";
const APP_SECRET: &str = "app/secret+access+key/0123456789abcdefghij";

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A server whose principals `ops` (everything) and `app` (publish and
/// consume `orders` of `eu-west-1`, the Letterbox queue
/// `eu-west-1.orders`) have access keys, their secrets in files.
async fn server(dir: &std::path::Path) -> TestServer {
    let ops_secret = dir.join("ops.secret");
    let app_secret = dir.join("app.secret");
    std::fs::write(&ops_secret, format!("{OPS_SECRET}\n")).unwrap();
    std::fs::write(&app_secret, APP_SECRET).unwrap();
    let cfg = dir.join("letterbox.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[[principals]]
name = "ops"
aws_access_key_id = "{OPS_KEY}"
aws_secret_access_key_file = "{}"
admin = ["*"]
publish = ["*"]
consume = ["*"]

[[principals]]
name = "app"
aws_access_key_id = "{APP_KEY}"
aws_secret_access_key_file = "{}"
publish = ["eu-west-1.orders"]
consume = ["eu-west-1.orders"]
"#,
            ops_secret.display(),
            app_secret.display()
        ),
    )
    .unwrap();
    TestServer::start_with(&[
        "--config",
        &cfg.display().to_string(),
        "--sqs-listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ])
    .await
}

/// A JSON protocol request, signed as `key` at `at_ms` (unsigned with
/// `None`), `change` applied after signing.
async fn call(
    sqs: &Sqs,
    key: Option<Signer<'_>>,
    at_ms: u64,
    action: &str,
    input: Value,
    change: impl FnOnce(&mut HeaderMap, &mut String),
) -> Reply {
    let uri: Uri = format!("http://{}/", sqs.addr).parse().unwrap();
    let mut h = HeaderMap::new();
    h.insert("host", sqs.addr.to_string().parse().unwrap());
    h.insert(
        "content-type",
        "application/x-amz-json-1.0".parse().unwrap(),
    );
    h.insert(
        "x-amz-target",
        format!("AmazonSQS.{action}").parse().unwrap(),
    );
    h.insert("x-amzn-query-mode", "true".parse().unwrap());
    let mut body = input.to_string();
    if let Some(k) = key {
        sign(k, &Method::POST, &uri, &mut h, body.as_bytes(), at_ms);
    }
    change(&mut h, &mut body);
    let mut req = Request::builder().method(Method::POST).uri(uri);
    for (k, v) in &h {
        req = req.header(k, v);
    }
    sqs.send(req, body).await
}

fn ops() -> Signer<'static> {
    Signer {
        access_key: OPS_KEY,
        secret: OPS_SECRET,
        region: "eu-west-1",
    }
}

fn app() -> Signer<'static> {
    Signer {
        access_key: APP_KEY,
        secret: APP_SECRET,
        region: "eu-west-1",
    }
}

#[track_caller]
fn refused(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(
        r.query_error.as_deref(),
        Some(format!("{code};Sender").as_str()),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn with_principals_requests_must_be_signed_with_their_access_keys() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path()).await;
    let sqs = Sqs::new(server.sqs.expect("the SQS endpoint"));
    let none = |_: &mut HeaderMap, _: &mut String| {};
    let list = json!({});

    // Signed by a principal's key: served, in the region of its scope.
    let q = call(
        &sqs,
        Some(ops()),
        now_ms(),
        "CreateQueue",
        json!({"QueueName": "orders"}),
        none,
    )
    .await
    .ok();
    let url = q["QueueUrl"].as_str().unwrap().to_string();
    let a = call(
        &sqs,
        Some(ops()),
        now_ms(),
        "GetQueueAttributes",
        json!({"QueueUrl": url, "AttributeNames": ["QueueArn"]}),
        none,
    )
    .await
    .ok();
    assert!(
        a["Attributes"]["QueueArn"]
            .as_str()
            .unwrap()
            .starts_with("arn:aws:sqs:eu-west-1:"),
        "{a}"
    );

    // Not signed; an unknown key; a wrong secret.
    refused(
        &call(&sqs, None, now_ms(), "ListQueues", list.clone(), none).await,
        403,
        "MissingAuthenticationToken",
    );
    let stranger = Signer {
        access_key: "LBKNOBODYNOBODY00003",
        ..ops()
    };
    refused(
        &call(
            &sqs,
            Some(stranger),
            now_ms(),
            "ListQueues",
            list.clone(),
            none,
        )
        .await,
        403,
        "InvalidClientTokenId",
    );
    let wrong = Signer {
        secret: APP_SECRET,
        ..ops()
    };
    refused(
        &call(
            &sqs,
            Some(wrong),
            now_ms(),
            "ListQueues",
            list.clone(),
            none,
        )
        .await,
        403,
        "SignatureDoesNotMatch",
    );
    // The body changed after signing; a payload hash that is not the
    // body's; a signed header changed.
    let tampered = call(
        &sqs,
        Some(app()),
        now_ms(),
        "SendMessage",
        json!({"QueueUrl": url, "MessageBody": "pay 10"}),
        |_, b| *b = b.replace("pay 10", "pay 99"),
    )
    .await;
    refused(&tampered, 403, "SignatureDoesNotMatch");
    let declared = call(
        &sqs,
        Some(app()),
        now_ms(),
        "ListQueues",
        list.clone(),
        |h, _| {
            h.insert(
                "x-amz-content-sha256",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                    .parse()
                    .unwrap(),
            );
        },
    )
    .await;
    refused(&declared, 403, "SignatureDoesNotMatch");
    assert!(
        declared.body.contains("x-amz-content-sha256"),
        "{}",
        declared.body
    );
    let retargeted = call(
        &sqs,
        Some(app()),
        now_ms(),
        "ListQueues",
        list.clone(),
        |h, _| {
            h.insert("x-amz-target", "AmazonSQS.PurgeQueue".parse().unwrap());
        },
    )
    .await;
    refused(&retargeted, 403, "SignatureDoesNotMatch");
    // Malformed.
    let bad = call(&sqs, None, now_ms(), "ListQueues", list.clone(), |h, _| {
        h.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=x".parse().unwrap(),
        );
    })
    .await;
    refused(&bad, 400, "IncompleteSignature");
    // The date: 14 minutes off is taken, 16 is not.
    let minute = 60_000;
    for (at, ok) in [
        (now_ms() - 14 * minute, true),
        (now_ms() + 14 * minute, true),
        (now_ms() - 16 * minute, false),
        (now_ms() + 16 * minute, false),
    ] {
        let r = call(&sqs, Some(app()), at, "ListQueues", list.clone(), none).await;
        if ok {
            r.ok();
        } else {
            refused(&r, 400, "RequestExpired");
        }
    }
    assert_eq!(
        call(
            &sqs,
            Some(ops()),
            now_ms(),
            "GetQueueAttributes",
            json!({"QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages"]}),
            none
        )
        .await
        .ok()["Attributes"]["ApproximateNumberOfMessages"],
        "0",
        "nothing refused was sent"
    );

    // Grants apply as over gRPC.
    call(
        &sqs,
        Some(app()),
        now_ms(),
        "SendMessage",
        json!({"QueueUrl": url, "MessageBody": "pay 10"}),
        none,
    )
    .await
    .ok();
    let denied = call(
        &sqs,
        Some(app()),
        now_ms(),
        "PurgeQueue",
        json!({"QueueUrl": url}),
        none,
    )
    .await;
    refused(&denied, 403, "AccessDenied");
    assert!(
        denied
            .body
            .contains("principal \\\"app\\\" may not admin \\\"eu-west-1.orders\\\""),
        "{}",
        denied.body
    );
    let other = call(
        &sqs,
        Some(app()),
        now_ms(),
        "CreateQueue",
        json!({"QueueName": "other"}),
        none,
    )
    .await;
    refused(&other, 403, "AccessDenied");
    let listed = call(
        &sqs,
        Some(app()),
        now_ms(),
        "ListQueues",
        list.clone(),
        none,
    )
    .await
    .ok();
    assert_eq!(listed["QueueUrls"].as_array().unwrap().len(), 1, "{listed}");

    // The audit log: the refusals with the key presented, the acts with
    // the principal.
    let events: Vec<Value> = server
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "letterbox::audit")
        .map(|v| v["fields"].clone())
        .collect();
    let with = |action: &str, outcome: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|f| f["action"] == action && f["outcome"] == outcome)
            .collect()
    };
    let auth = with("authenticate", "refused");
    assert!(
        auth.iter()
            .any(|f| f["principal"] == "access key LBKNOBODYNOBODY00003"
                && f["detail"]
                    .as_str()
                    .unwrap()
                    .starts_with("InvalidClientTokenId")),
        "{events:?}"
    );
    assert!(
        auth.iter()
            .all(|f| f["peer"].as_str().unwrap().starts_with("127.0.0.1:")),
        "{events:?}"
    );
    assert_eq!(auth.len(), 9, "{events:?}");
    assert!(
        auth.iter()
            .all(|f| !f["detail"].as_str().unwrap().contains("Canonical")),
        "the audit log keeps the reason only: {events:?}"
    );
    let created = with("CreateQueue", "done");
    assert_eq!(created.len(), 1, "{events:?}");
    assert_eq!(created[0]["principal"], "ops");
    assert_eq!(with("admin", "refused").len(), 2, "{events:?}");
}
