//! SQS message move tasks as Letterbox redrives: back to each message's
//! source or to `DestinationArn`, listed with SQS's fields, paced,
//! cancelled, failed when the destination goes, refused as SQS refuses
//! them, and resumed after a kill -9 without moving anything twice.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::console_http::Web;
use crate::harness::*;
use crate::sqs::{Sqs, start};

/// Creates `dlq` and `src` (dead-lettering into it after one receive)
/// and puts `n` messages into `dlq` by receiving each twice with a
/// visibility of 0; returns the queues' URLs and ARNs and the message ids.
pub(crate) async fn dead_letters(
    sqs: &Sqs,
    src: &str,
    dlq: &str,
    n: usize,
) -> ((String, String), (String, String), BTreeSet<String>) {
    let dlq_url = url_of(
        &sqs.call("CreateQueue", json!({"QueueName": dlq}))
            .await
            .ok(),
    );
    let dlq_arn = arn(sqs, &dlq_url).await;
    let src_url = url_of(
        &sqs.call(
            "CreateQueue",
            json!({"QueueName": src, "Attributes": {"RedrivePolicy": json!({
                "deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}).to_string()}}),
        )
        .await
        .ok(),
    );
    let src_arn = arn(sqs, &src_url).await;
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let sent = sqs
            .call(
                "SendMessage",
                json!({"QueueUrl": src_url, "MessageBody": format!("m{i}")}),
            )
            .await
            .ok();
        ids.insert(sent["MessageId"].as_str().unwrap().to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(sqs, &dlq_url).await < n as u64 {
        sqs.call(
            "ReceiveMessage",
            json!({"QueueUrl": src_url, "MaxNumberOfMessages": 10, "VisibilityTimeout": 0}),
        )
        .await
        .ok();
        assert!(
            Instant::now() < deadline,
            "the messages were not dead-lettered"
        );
    }
    ((src_url, src_arn), (dlq_url, dlq_arn), ids)
}

fn url_of(v: &Value) -> String {
    v["QueueUrl"].as_str().unwrap().to_string()
}

async fn arn(sqs: &Sqs, url: &str) -> String {
    sqs.call(
        "GetQueueAttributes",
        json!({"QueueUrl": url, "AttributeNames": ["QueueArn"]}),
    )
    .await
    .ok()["Attributes"]["QueueArn"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The messages of a queue: visible, in flight and delayed.
async fn count(sqs: &Sqs, url: &str) -> u64 {
    let a = sqs
        .call(
            "GetQueueAttributes",
            json!({"QueueUrl": url, "AttributeNames": ["All"]}),
        )
        .await
        .ok();
    [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    .iter()
    .map(|k| a["Attributes"][k].as_str().unwrap().parse::<u64>().unwrap())
    .sum()
}

/// The newest task of `source_arn`, as `ListMessageMoveTasks` gives it.
async fn newest(sqs: &Sqs, source_arn: &str) -> Value {
    sqs.call("ListMessageMoveTasks", json!({"SourceArn": source_arn}))
        .await
        .ok()["Results"][0]
        .clone()
}

/// Polls until the newest task of `source_arn` is no longer active.
async fn ended(sqs: &Sqs, source_arn: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let t = newest(sqs, source_arn).await;
        if !matches!(t["Status"].as_str(), Some("RUNNING" | "CANCELLING")) {
            return t;
        }
        assert!(Instant::now() < deadline, "the task did not end: {t}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids of the messages a queue holds, received and deleted.
async fn drain(sqs: &Sqs, url: &str) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let r = sqs
            .call(
                "ReceiveMessage",
                json!({"QueueUrl": url, "MaxNumberOfMessages": 10}),
            )
            .await
            .ok();
        let Some(msgs) = r["Messages"].as_array().filter(|m| !m.is_empty()) else {
            return ids;
        };
        for m in msgs {
            ids.push(m["MessageId"].as_str().unwrap().to_string());
            sqs.call(
                "DeleteMessage",
                json!({"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]}),
            )
            .await
            .ok();
        }
    }
}

#[tokio::test]
async fn a_move_task_puts_dead_letters_back_and_is_listed_as_sqs_lists_it() {
    let (s, sqs) = start().await;
    let ((src_url, src_arn), (dlq_url, dlq_arn), ids) = dead_letters(&sqs, "src", "dlq", 3).await;

    // Refusals, as SQS words them; nothing starts.
    let r = sqs
        .call("StartMessageMoveTask", json!({"SourceArn": src_arn}))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "Source queue must be configured as a Dead Letter Queue."
    );
    let r = sqs
        .call(
            "StartMessageMoveTask",
            json!({"SourceArn": dlq_arn, "DestinationArn": format!("{src_arn}doesntexist")}),
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.query_error.as_deref(),
        Some("ResourceNotFoundException;Sender")
    );
    assert_eq!(
        r.json()["message"],
        "The resource that you specified for the DestinationArn parameter doesn't exist."
    );
    for rate in [0, 501] {
        let r = sqs
            .call(
                "StartMessageMoveTask",
                json!({"SourceArn": dlq_arn, "MaxNumberOfMessagesPerSecond": rate}),
            )
            .await;
        assert_eq!(r.status, 400, "{rate}: {}", r.body);
        assert!(
            r.body.contains("MaxNumberOfMessagesPerSecond"),
            "{}",
            r.body
        );
    }
    let none = sqs
        .call("ListMessageMoveTasks", json!({"SourceArn": dlq_arn}))
        .await
        .ok();
    assert_eq!(none, json!({"Results": []}));
    assert_eq!(count(&sqs, &dlq_url).await, 3);

    // A dead letter just read with a visibility of 0 is visible: it moves
    // too.
    let read = sqs
        .call(
            "ReceiveMessage",
            json!({"QueueUrl": dlq_url, "VisibilityTimeout": 0}),
        )
        .await
        .ok();
    assert_eq!(read["Messages"].as_array().map(Vec::len), Some(1));

    // Back to each message's source.
    let h = sqs
        .call("StartMessageMoveTask", json!({"SourceArn": dlq_arn}))
        .await
        .ok()["TaskHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let t = ended(&sqs, &dlq_arn, Duration::from_secs(10)).await;
    assert_eq!(t["Status"], "COMPLETED", "{t}");
    assert_eq!(t["SourceArn"], dlq_arn.as_str());
    assert_eq!(t["ApproximateNumberOfMessagesMoved"], 3);
    assert_eq!(t["ApproximateNumberOfMessagesToMove"], 3);
    assert!(t["StartedTimestamp"].as_u64().unwrap() > 1_000_000_000_000);
    for absent in [
        "TaskHandle",
        "DestinationArn",
        "MaxNumberOfMessagesPerSecond",
        "FailureReason",
    ] {
        assert!(t.get(absent).is_none(), "{absent} in {t}");
    }
    assert_eq!(count(&sqs, &dlq_url).await, 0);
    let back: BTreeSet<String> = drain(&sqs, &src_url).await.into_iter().collect();
    assert_eq!(back, ids);

    // Cancelling: a task that is over, a handle that is not one, a task
    // that does not exist.
    let r = sqs
        .call("CancelMessageMoveTask", json!({"TaskHandle": h}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("COMPLETED"), "{}", r.body);
    let r = sqs
        .call("CancelMessageMoveTask", json!({"TaskHandle": "foobared"}))
        .await;
    assert_eq!(
        r.json()["message"],
        "Value for parameter TaskHandle is invalid."
    );
    use base64::Engine as _;
    let other = base64::engine::general_purpose::STANDARD.encode(
        json!({"taskId": "10f57157-fc38-4da9-a113-4de7e12d05aa", "sourceArn": dlq_arn}).to_string(),
    );
    let r = sqs
        .call("CancelMessageMoveTask", json!({"TaskHandle": other}))
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["message"], "Task does not exist.");

    // The query protocol's answer.
    let r = sqs
        .query(&format!(
            "Action=ListMessageMoveTasks&SourceArn={}&MaxResults=10",
            dlq_arn.replace(':', "%3A")
        ))
        .await;
    assert!(
        r.body
            .contains("<ListMessageMoveTasksResult><ListMessageMoveTasksResultEntry>")
            && r.body.contains("<Status>COMPLETED</Status>"),
        "{}",
        r.body
    );
    s.stop().await;
}

#[tokio::test]
async fn a_paced_move_task_holds_its_rate_and_stops_when_cancelled() {
    let (s, sqs) = start().await;
    let (_, (dlq_url, dlq_arn), ids) = dead_letters(&sqs, "src", "dlq", 6).await;
    let other = url_of(
        &sqs.call("CreateQueue", json!({"QueueName": "other"}))
            .await
            .ok(),
    );
    let other_arn = arn(&sqs, &other).await;
    let started = Instant::now();
    let h = sqs
        .call(
            "StartMessageMoveTask",
            json!({"SourceArn": dlq_arn, "DestinationArn": other_arn, "MaxNumberOfMessagesPerSecond": 2}),
        )
        .await
        .ok()["TaskHandle"]
        .as_str()
        .unwrap()
        .to_string();
    // One active task a queue.
    let r = sqs
        .call("StartMessageMoveTask", json!({"SourceArn": dlq_arn}))
        .await;
    assert_eq!(
        r.json()["message"],
        "There is already a task running. Only one active task is allowed for a source queue arn at a given time."
    );
    let t = newest(&sqs, &dlq_arn).await;
    assert_eq!(t["Status"], "RUNNING");
    assert_eq!(t["TaskHandle"], h.as_str());
    assert_eq!(t["DestinationArn"], other_arn.as_str());
    assert_eq!(t["MaxNumberOfMessagesPerSecond"], 2);
    assert_eq!(t["ApproximateNumberOfMessagesToMove"], 6);
    // At 2 a second, the second message moves half a second after the
    // first: cancel once two are there.
    while count(&sqs, &other).await < 2 {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(450));
    let c = sqs
        .call("CancelMessageMoveTask", json!({"TaskHandle": h}))
        .await
        .ok();
    assert!(c["ApproximateNumberOfMessagesMoved"].as_u64().unwrap() <= 2);
    let t = ended(&sqs, &dlq_arn, Duration::from_secs(5)).await;
    assert_eq!(t["Status"], "CANCELLED", "{t}");
    assert!(t.get("TaskHandle").is_none());
    let moved = t["ApproximateNumberOfMessagesMoved"].as_u64().unwrap();
    assert!((2..6).contains(&moved), "{t}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(count(&sqs, &other).await, moved, "it stopped");
    assert_eq!(count(&sqs, &dlq_url).await, 6 - moved);

    // The rest at 4 a second: the last moves at least (n-1)/4 s after the
    // first.
    let rest = 6 - moved;
    let again = Instant::now();
    sqs.call(
        "StartMessageMoveTask",
        json!({"SourceArn": dlq_arn, "DestinationArn": other_arn, "MaxNumberOfMessagesPerSecond": 4}),
    )
    .await
    .ok();
    let t = ended(&sqs, &dlq_arn, Duration::from_secs(10)).await;
    assert_eq!(t["Status"], "COMPLETED", "{t}");
    assert!(again.elapsed() >= Duration::from_millis((rest - 1) * 250 - 50));
    let listed = sqs
        .call(
            "ListMessageMoveTasks",
            json!({"SourceArn": dlq_arn, "MaxResults": 10}),
        )
        .await
        .ok();
    let statuses: Vec<&str> = listed["Results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["Status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["COMPLETED", "CANCELLED"]);
    let all: BTreeSet<String> = drain(&sqs, &other).await.into_iter().collect();
    assert_eq!(all, ids, "each message moved once");
    s.stop().await;
}

#[tokio::test]
async fn a_move_task_fails_when_its_destination_is_deleted() {
    let (s, sqs) = start().await;
    let (_, (dlq_url, dlq_arn), _) = dead_letters(&sqs, "src", "dlq", 4).await;
    let other = url_of(
        &sqs.call("CreateQueue", json!({"QueueName": "other"}))
            .await
            .ok(),
    );
    let other_arn = arn(&sqs, &other).await;
    sqs.call(
        "StartMessageMoveTask",
        json!({"SourceArn": dlq_arn, "DestinationArn": other_arn, "MaxNumberOfMessagesPerSecond": 1}),
    )
    .await
    .ok();
    sqs.call("DeleteQueue", json!({"QueueUrl": other}))
        .await
        .ok();
    let t = ended(&sqs, &dlq_arn, Duration::from_secs(10)).await;
    assert_eq!(t["Status"], "FAILED", "{t}");
    assert_eq!(
        t["FailureReason"],
        "AWS.SimpleQueueService.NonExistentQueue"
    );
    assert!(count(&sqs, &dlq_url).await >= 2, "the rest stays");
    s.stop().await;
}

#[tokio::test]
async fn a_move_task_cut_by_a_kill_resumes_and_moves_nothing_twice() {
    let mut server = TestServer::start_with(&["--sqs-listen", "127.0.0.1:0"]).await;
    let sqs = Sqs::new(server.sqs.expect("the SQS endpoint"));
    let ((src_url, _), (dlq_url, dlq_arn), ids) = dead_letters(&sqs, "src", "dlq", 8).await;
    sqs.call(
        "StartMessageMoveTask",
        json!({"SourceArn": dlq_arn, "MaxNumberOfMessagesPerSecond": 4}),
    )
    .await
    .ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&sqs, &src_url).await < 2 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill();
    server.restart().await;
    let sqs = Sqs::new(server.sqs.expect("the SQS endpoint"));
    let t = ended(&sqs, &dlq_arn, Duration::from_secs(15)).await;
    assert_eq!(t["Status"], "COMPLETED", "{t}");
    assert_eq!(t["ApproximateNumberOfMessagesMoved"], 8, "{t}");
    assert_eq!(count(&sqs, &dlq_url).await, 0);
    let back = drain(&sqs, &src_url).await;
    assert_eq!(back.len(), 8, "{back:?}");
    assert_eq!(back.into_iter().collect::<BTreeSet<_>>(), ids);
    assert!(
        server.log().contains("resuming a message move task"),
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn the_console_shows_a_move_task_with_its_progress_and_stops_it() {
    let s = InProc::start_with(|c| {
        let at = |a: &str| Some(letterbox::server::ConsoleAt::Exactly(a.parse().unwrap()));
        c.sqs_listen = at("127.0.0.1:0");
        c.console_listen = at("127.0.0.1:0");
    })
    .await;
    let sqs = Sqs::new(s.sqs.expect("the SQS endpoint"));
    let mut web = Web::new(s.console.expect("the console"));
    let (_, (_, dlq_arn), _) = dead_letters(&sqs, "src", "dlq", 4).await;
    sqs.call(
        "StartMessageMoveTask",
        json!({"SourceArn": dlq_arn, "MaxNumberOfMessagesPerSecond": 1}),
    )
    .await
    .ok();
    let page = web.get("/queues/dlq/dead-letters").await;
    page.has("id=\"move-tasks\"").has("data-state=\"RUNNING\"");
    let at = page
        .body
        .find("/queues/dlq/move-tasks/")
        .expect("a link to the task");
    let link = &page.body[at..];
    let link = link[..link.find('"').unwrap()].to_string();
    let task = web.get(&link).await;
    task.has("id=\"redrive-progress\"")
        .has("data-state=\"RUNNING\"")
        .has(&format!("hx-get=\"{link}/progress\""));
    let csrf = task.csrf();
    let stopped = web
        .post(&format!("{link}/cancel"), &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(stopped.status, 303, "{}", stopped.body);
    assert_eq!(stopped.location(), link);
    let t = ended(&sqs, &dlq_arn, Duration::from_secs(5)).await;
    assert_eq!(t["Status"], "CANCELLED", "{t}");
    let done = web.get(&format!("{link}/progress")).await;
    done.has("data-state=\"CANCELLED\"");
    assert!(!done.body.contains("hx-get"), "{}", done.body);
    // A second cancel is refused, naming the state.
    let again = web
        .post(&format!("{link}/cancel"), &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(again.status, 409);
    again.has("CANCELLED");
    s.stop().await;
}

#[tokio::test]
async fn a_redrive_allow_policy_decides_which_queues_may_dead_letter_into_its_queue() {
    let (s, sqs) = start().await;
    let account = "000000000000";
    let arn = |n: &str| format!("arn:aws:sqs:us-east-1:{account}:{n}");
    let policy = |p: Value| p.to_string();
    sqs.call(
        "CreateQueue",
        json!({"QueueName": "only-a", "Attributes": {"RedriveAllowPolicy": policy(json!({
            "redrivePermission": "byQueue", "sourceQueueArns": [arn("a")]}))}}),
    )
    .await
    .ok();
    sqs.call(
        "CreateQueue",
        json!({"QueueName": "none", "Attributes": {"RedriveAllowPolicy": policy(json!({
            "redrivePermission": "denyAll"}))}}),
    )
    .await
    .ok();
    let redrive = |dlq: &str| json!({"RedrivePolicy": json!({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": 3}).to_string()});
    sqs.call(
        "CreateQueue",
        json!({"QueueName": "a", "Attributes": redrive("only-a")}),
    )
    .await
    .ok();
    let r = sqs
        .call(
            "CreateQueue",
            json!({"QueueName": "b", "Attributes": redrive("only-a")}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("RedriveAllowPolicy"), "{}", r.body);
    assert_eq!(
        sqs.call("GetQueueUrl", json!({"QueueName": "b"}))
            .await
            .status,
        400,
        "nothing was created"
    );
    sqs.call("CreateQueue", json!({"QueueName": "c"}))
        .await
        .ok();
    for dlq in ["only-a", "none"] {
        let r = sqs
            .call(
                "SetQueueAttributes",
                json!({"QueueUrl": "c", "Attributes": redrive(dlq)}),
            )
            .await;
        assert_eq!(r.status, 400, "{dlq}: {}", r.body);
    }
    let a = sqs
        .call(
            "GetQueueAttributes",
            json!({"QueueUrl": "c", "AttributeNames": ["RedrivePolicy"]}),
        )
        .await
        .ok();
    assert_eq!(a, json!({}), "c has no dead letter queue");
    s.stop().await;
}
