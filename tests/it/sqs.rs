//! The SQS endpoint over HTTP, as SQS clients speak to it (AWS JSON 1.0
//! and the query protocol), on one engine with gRPC: queues and messages
//! made over one are seen over the other, attribute types kept; SQS's
//! error shapes; receipt handles of earlier receives; a visibility of 0.
//! (Real clients from their registries: `tests/sqs/run.sh`, run by
//! `ecosystem.rs`.)

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use letterbox::pb;
use serde_json::{Value, json};

use crate::harness::*;

/// An answer: status, headers of interest and body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) query_error: Option<String>,
    pub(crate) body: String,
}

impl Reply {
    #[track_caller]
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    #[track_caller]
    pub(crate) fn ok(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.body);
        self.json()
    }
}

pub(crate) struct Sqs {
    pub(crate) addr: SocketAddr,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Sqs {
    pub(crate) fn new(addr: SocketAddr) -> Sqs {
        Sqs {
            addr,
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub(crate) async fn send(&self, req: hyper::http::request::Builder, body: String) -> Reply {
        let resp = self
            .http
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .expect("http call");
        let status = resp.status().as_u16();
        let query_error = resp
            .headers()
            .get("x-amzn-query-error")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            query_error,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// A JSON protocol call, asking for the query protocol's codes.
    pub(crate) async fn call(&self, action: &str, input: Value) -> Reply {
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}/", self.addr))
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", format!("AmazonSQS.{action}"))
            .header("x-amzn-query-mode", "true");
        self.send(req, input.to_string()).await
    }

    /// A query protocol call.
    pub(crate) async fn query(&self, form: &str) -> Reply {
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}/", self.addr))
            .header("content-type", "application/x-www-form-urlencoded");
        self.send(req, form.to_string()).await
    }
}

pub(crate) async fn start() -> (InProc, Sqs) {
    let s = InProc::start_with(|c| {
        c.sqs_listen = Some(letterbox::server::ConsoleAt::Exactly(
            "127.0.0.1:0".parse().unwrap(),
        ));
    })
    .await;
    let sqs = Sqs::new(s.sqs.expect("the SQS endpoint is on"));
    (s, sqs)
}

#[tokio::test]
async fn queues_and_messages_are_one_engine_with_grpc() {
    let (s, sqs) = start().await;
    let mut c = s.clients().await;
    let url = sqs
        .call(
            "CreateQueue",
            json!({"QueueName": "orders", "Attributes": {"VisibilityTimeout": "45", "DelaySeconds": "0"}}),
        )
        .await
        .ok()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(url.ends_with("/000000000000/orders"), "{url}");
    // An ordinary Letterbox queue, SQS's defaults where not given.
    let q = c
        .admin
        .get_queue(pb::GetQueueRequest {
            name: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let cfg = q.queue.unwrap().config.unwrap();
    assert_eq!(cfg.ack_timeout_ms, Some(45_000));
    assert_eq!(cfg.message_ttl_ms, Some(345_600_000));

    // SQS → gRPC: typed attributes are properties, their types kept.
    let sent = sqs
        .call(
            "SendMessage",
            json!({"QueueUrl": url, "MessageBody": "derp", "MessageAttributes": {
                "SOME_Valid.attribute-Name": {"StringValue": "1493147359900", "DataType": "Number"},
                "bin": {"BinaryValue": "AAEC", "DataType": "Binary"},
            }}),
        )
        .await
        .ok();
    assert_eq!(sent["MD5OfMessageBody"], "58fd9edd83341c29f1aebba81c31e257");
    let got = c.receive("orders", 1).await;
    assert_eq!(body(&got[0]), "derp");
    let props = &got[0].properties;
    assert_eq!(props["SOME_Valid.attribute-Name"], "1493147359900");
    assert_eq!(props["bin"], "AAEC");
    assert!(ok(&c.nack(&got[0].ack_token, "back").await));
    // ... and back over SQS with their types and AWS's digest.
    let r = sqs
        .call(
            "ReceiveMessage",
            json!({"QueueUrl": url, "MessageAttributeNames": ["All"], "AttributeNames": ["All"]}),
        )
        .await
        .ok();
    let m = &r["Messages"][0];
    assert_eq!(
        m["MessageAttributes"]["SOME_Valid.attribute-Name"],
        json!({"StringValue": "1493147359900", "DataType": "Number"})
    );
    assert_eq!(
        m["MessageAttributes"]["bin"],
        json!({"BinaryValue": "AAEC", "DataType": "Binary"})
    );
    assert_eq!(m["Attributes"]["ApproximateReceiveCount"], "2");
    let handle = m["ReceiptHandle"].as_str().unwrap().to_string();
    sqs.call(
        "DeleteMessage",
        json!({"QueueUrl": url, "ReceiptHandle": handle}),
    )
    .await
    .ok();
    assert_eq!(c.stats("orders").await.total, 0);

    // gRPC → SQS: a property is a String attribute.
    let mut m = msg("from grpc");
    m.properties.insert("team".into(), "blue".into());
    c.msg
        .publish(pb::PublishRequest {
            queue: "orders".into(),
            messages: vec![m],
            ..Default::default()
        })
        .await
        .unwrap();
    let r = sqs
        .call(
            "ReceiveMessage",
            json!({"QueueUrl": url, "MessageAttributeNames": ["team"]}),
        )
        .await
        .ok();
    let m = &r["Messages"][0];
    assert_eq!(m["Body"], "from grpc");
    assert_eq!(
        m["MessageAttributes"]["team"],
        json!({"StringValue": "blue", "DataType": "String"})
    );
    s.stop().await;
}

#[tokio::test]
async fn errors_are_shaped_as_sqs_shapes_them() {
    let (s, sqs) = start().await;
    let r = sqs.call("GetQueueUrl", json!({"QueueName": "nope"})).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["__type"], "com.amazonaws.sqs#QueueDoesNotExist");
    assert_eq!(
        r.query_error.as_deref(),
        Some("AWS.SimpleQueueService.NonExistentQueue;Sender")
    );
    // The query protocol: XML, the legacy code.
    let r = sqs.query("Action=GetQueueUrl&QueueName=nope").await;
    assert_eq!(r.status, 400);
    assert!(
        r.body
            .contains("<Code>AWS.SimpleQueueService.NonExistentQueue</Code>")
            && r.body.contains("<Type>Sender</Type>"),
        "{}",
        r.body
    );
    let r = sqs
        .query("Action=CreateQueue&QueueName=q1&Attribute.1.Name=DelaySeconds&Attribute.1.Value=5")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("<CreateQueueResult><QueueUrl>http://"),
        "{}",
        r.body
    );
    let r = sqs
        .query("Action=SendMessage&QueueUrl=q1&MessageBody=%3Ca%26b%3E")
        .await;
    assert!(r.body.contains("<MD5OfMessageBody>"), "{}", r.body);
    // Limits, named as SQS names them; nothing is changed.
    let r = sqs
        .call(
            "ReceiveMessage",
            json!({"QueueUrl": "q1", "MaxNumberOfMessages": 11}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."
    );
    let r = sqs
        .call(
            "SetQueueAttributes",
            json!({"QueueUrl": "q1", "Attributes": {"MessageRetentionPeriod": "59"}}),
        )
        .await;
    assert_eq!(
        r.query_error.as_deref(),
        Some("InvalidAttributeValue;Sender")
    );
    let a = sqs
        .call(
            "GetQueueAttributes",
            json!({"QueueUrl": "q1", "AttributeNames": ["MessageRetentionPeriod", "DelaySeconds"]}),
        )
        .await
        .ok();
    assert_eq!(
        a["Attributes"],
        json!({"MessageRetentionPeriod": "345600", "DelaySeconds": "5"})
    );
    s.stop().await;
}

#[tokio::test]
async fn handles_of_earlier_receives_delete_and_a_zero_visibility_shows_the_message_again() {
    let (s, sqs) = start().await;
    let url = sqs
        .call(
            "CreateQueue",
            json!({"QueueName": "v0", "Attributes": {"VisibilityTimeout": "0"}}),
        )
        .await
        .ok()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_string();
    sqs.call("SendMessage", json!({"QueueUrl": url, "MessageBody": "b"}))
        .await
        .ok();
    let first = sqs
        .call("ReceiveMessage", json!({"QueueUrl": url}))
        .await
        .ok();
    let second = sqs
        .call("ReceiveMessage", json!({"QueueUrl": url}))
        .await
        .ok();
    let h1 = first["Messages"][0]["ReceiptHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let h2 = second["Messages"][0]["ReceiptHandle"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(h1, h2);
    assert_eq!(second["Messages"][0]["Attributes"], Value::Null);
    // The first receive's handle deletes the message; both stay valid.
    sqs.call(
        "DeleteMessage",
        json!({"QueueUrl": url, "ReceiptHandle": h1}),
    )
    .await
    .ok();
    let none = sqs
        .call("ReceiveMessage", json!({"QueueUrl": url}))
        .await
        .ok();
    assert_eq!(none, json!({}));
    for h in [&h1, &h2] {
        sqs.call(
            "DeleteMessage",
            json!({"QueueUrl": url, "ReceiptHandle": h}),
        )
        .await
        .ok();
    }
    let r = sqs
        .call(
            "DeleteMessage",
            json!({"QueueUrl": url, "ReceiptHandle": "nope"}),
        )
        .await;
    assert_eq!(
        r.query_error.as_deref(),
        Some("ReceiptHandleIsInvalid;Sender")
    );

    // A handle whose visibility ran out still changes the visibility of
    // the message's current receive.
    let q = sqs
        .call(
            "CreateQueue",
            json!({"QueueName": "v1", "Attributes": {"VisibilityTimeout": "1"}}),
        )
        .await
        .ok()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_string();
    sqs.call("SendMessage", json!({"QueueUrl": q, "MessageBody": "c"}))
        .await
        .ok();
    let old = sqs
        .call("ReceiveMessage", json!({"QueueUrl": q}))
        .await
        .ok();
    let old = old["Messages"][0]["ReceiptHandle"]
        .as_str()
        .unwrap()
        .to_string();
    s.advance(1_100).await;
    let again = sqs
        .call("ReceiveMessage", json!({"QueueUrl": q}))
        .await
        .ok();
    assert_eq!(again["Messages"][0]["Body"], "c");
    sqs.call(
        "ChangeMessageVisibility",
        json!({"QueueUrl": q, "ReceiptHandle": old, "VisibilityTimeout": 100}),
    )
    .await
    .ok();
    s.advance(2_000).await;
    let hidden = sqs
        .call("ReceiveMessage", json!({"QueueUrl": q}))
        .await
        .ok();
    assert_eq!(hidden, json!({}), "the change held the current receive");
    s.stop().await;
}

/// The README's boto3 and AWS CLI snippets as printed, boto3 and the AWS
/// CLI through the dead-letter and FIFO flows, boto3
/// across a kill -9 and with a principal's access key (SigV4), and moto
/// 5.2.5's own
/// SQS tests in its server mode, from PyPI (`tests/sqs/run.sh`; skips
/// as `skip_or_run` says where PyPI cannot be had).
#[test]
fn boto3_the_aws_cli_and_motos_own_sqs_tests_pass_against_the_endpoint() {
    let Some(text) = crate::ecosystem::skip_or_run(
        "boto3_the_aws_cli_and_motos_own_sqs_tests_pass_against_the_endpoint",
        "tests/sqs/run.sh",
        &[],
        &[],
    ) else {
        return;
    };
    assert!(
        text.contains("PASS: boto3 dead-letter and FIFO flows")
            && text.contains("PASS: AWS CLI dead-letter and FIFO flows")
            && text.contains("PASS: the README's python block prints what the README shows")
            && text.contains("PASS: the README's sh block prints what the README shows")
            && text.contains("PASS: boto3 across a kill -9")
            && text.contains("PASS: boto3 with principals")
            && text.contains("PASS: SQS clients against a real server"),
        "{text}"
    );
}

/// A JSON protocol call whose signature's scope names `region` (any
/// credentials are taken without principals; the region is the scope's).
async fn in_region(sqs: &Sqs, region: &str, action: &str, input: Value) -> Reply {
    use hyper::{HeaderMap, Uri};
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
    let body = input.to_string();
    let key = letterbox::sqs::Signer {
        access_key: "anything",
        secret: "anything",
        region,
    };
    letterbox::sqs::sign(key, &Method::POST, &uri, &mut h, body.as_bytes(), 0);
    let mut req = Request::builder().method(Method::POST).uri(uri);
    for (k, v) in &h {
        req = req.header(k, v);
    }
    sqs.send(req, body).await
}

#[tokio::test]
async fn each_region_has_its_own_queues() {
    let (s, sqs) = start().await;
    let mut c = s.clients().await;
    let home = sqs
        .call("CreateQueue", json!({"QueueName": "orders"}))
        .await
        .ok()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_string();
    let eu = in_region(
        &sqs,
        "eu-west-1",
        "CreateQueue",
        json!({"QueueName": "orders"}),
    )
    .await
    .ok()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_string();
    // Same URL (the region travels in the signature), two queues.
    assert_eq!(home, eu);
    in_region(
        &sqs,
        "eu-west-1",
        "CreateQueue",
        json!({"QueueName": "only-eu"}),
    )
    .await
    .ok();
    let names: Vec<String> = c
        .admin
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .queues
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["eu-west-1.only-eu", "eu-west-1.orders", "orders"]);
    let urls = |v: Value| -> Vec<String> {
        v["QueueUrls"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|u| u.as_str().unwrap().rsplit('/').next().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        urls(sqs.call("ListQueues", json!({})).await.ok()),
        ["orders"]
    );
    assert_eq!(
        urls(
            in_region(&sqs, "eu-west-1", "ListQueues", json!({}))
                .await
                .ok()
        ),
        ["only-eu", "orders"]
    );
    assert_eq!(
        urls(
            in_region(
                &sqs,
                "eu-west-1",
                "ListQueues",
                json!({"QueueNamePrefix": "on"})
            )
            .await
            .ok()
        ),
        ["only-eu"]
    );
    assert!(
        urls(
            in_region(&sqs, "ap-south-1", "ListQueues", json!({}))
                .await
                .ok()
        )
        .is_empty()
    );
    let r = sqs
        .call("GetQueueUrl", json!({"QueueName": "only-eu"}))
        .await;
    assert_eq!(r.status, 400, "another region's queue is not there");
    // A message sent in one region is not in the other.
    in_region(
        &sqs,
        "eu-west-1",
        "SendMessage",
        json!({"QueueUrl": eu, "MessageBody": "eu"}),
    )
    .await
    .ok();
    assert_eq!(c.stats("eu-west-1.orders").await.total, 1);
    assert_eq!(c.stats("orders").await.total, 0);
    let got = sqs
        .call("ReceiveMessage", json!({"QueueUrl": home}))
        .await
        .ok();
    assert_eq!(got, json!({}));
    // ARNs name the queue's region; a redrive policy's ARN its region's
    // queue.
    let arn = in_region(
        &sqs,
        "eu-west-1",
        "GetQueueAttributes",
        json!({"QueueUrl": eu, "AttributeNames": ["QueueArn"]}),
    )
    .await
    .ok()["Attributes"]["QueueArn"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(arn, "arn:aws:sqs:eu-west-1:000000000000:orders");
    in_region(
        &sqs,
        "eu-west-1",
        "SetQueueAttributes",
        json!({"QueueUrl": "only-eu", "Attributes": {"RedrivePolicy": json!({
            "deadLetterTargetArn": arn, "maxReceiveCount": 2}).to_string()}}),
    )
    .await
    .ok();
    let q = c
        .admin
        .get_queue(pb::GetQueueRequest {
            name: "eu-west-1.only-eu".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        q.queue.unwrap().config.unwrap().dead_letter.unwrap().queue,
        "eu-west-1.orders"
    );
    let r = sqs
        .call(
            "CreateQueue",
            json!({"QueueName": "x", "Attributes": {"RedrivePolicy": json!({
                "deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:only-eu",
                "maxReceiveCount": 2}).to_string()}}),
        )
        .await;
    assert_eq!(r.status, 400, "no only-eu in us-east-1: {}", r.body);
    s.stop().await;
}

/// `@aws-sdk/client-sqs` (which checks the MD5 digests) and `sqs-consumer`
/// from npm through the dead-letter flow (back with a move task) and a
/// FIFO flow, and the README's JavaScript snippet as printed
/// (`tests/sqs/js.sh`; skips as `skip_or_run` says where npm
/// cannot be had).
#[test]
fn the_javascript_sdk_and_sqs_consumer_run_the_dead_letter_and_fifo_flows() {
    let Some(text) = crate::ecosystem::skip_or_run(
        "the_javascript_sdk_and_sqs_consumer_run_the_dead_letter_and_fifo_flows",
        "tests/sqs/js.sh",
        &[],
        &[],
    ) else {
        return;
    };
    assert!(
        text.contains("PASS: JavaScript SDK and sqs-consumer dead-letter and FIFO flows")
            && text.contains("PASS: the README's js block prints what the README shows"),
        "{text}"
    );
}
