//! The README's walkthrough as a program: create a queue with a dead
//! letter queue, publish, receive, nack until the message dead-letters,
//! browse the DLQ, and take the message out of it.
//!
//! Start a server first (`cargo run -- serve`), then:
//!
//! ```text
//! cargo run --example walkthrough [http://127.0.0.1:50051]
//! ```

use letterbox::pb;
use letterbox::pb::admin_service_client::AdminServiceClient;
use letterbox::pb::messaging_service_client::MessagingServiceClient;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let mut admin = AdminServiceClient::connect(url.clone()).await?;
    let mut msg = MessagingServiceClient::connect(url).await?;

    // 1. A queue whose messages move to `invoices.dlq` after 3 failed
    //    deliveries. The DLQ is an ordinary queue and must exist first.
    for (name, dead_letter) in [
        ("invoices.dlq", None),
        (
            "invoices",
            Some(pb::DeadLetterPolicy {
                queue: "invoices.dlq".into(),
                max_deliveries: 3,
            }),
        ),
    ] {
        let config = pb::QueueConfig {
            dead_letter,
            ack_timeout_ms: Some(30_000),
            ..Default::default()
        };
        admin
            .create_queue(pb::CreateQueueRequest {
                name: name.into(),
                config: Some(config),
            })
            .await?;
        println!("queue {name} ready");
    }

    // 2. Publish. The answer comes once the message is on disk.
    let published = msg
        .publish(pb::PublishRequest {
            queue: "invoices".into(),
            messages: vec![pb::PublishMessage {
                body: b"order 42: issue the invoice".to_vec().into(),
                properties: [("customer".to_string(), "acme".to_string())].into(),
                ..Default::default()
            }],
        })
        .await?
        .into_inner();
    let id = &published.results[0].message_id;
    println!("published {id}");

    // 3. Receive and fail three times: each nack counts as a delivery
    //    attempt; after the third the broker moves the message to the DLQ.
    for _ in 0..3 {
        let got = msg
            .receive(pb::ReceiveRequest {
                queue: "invoices".into(),
                max_messages: 1,
                wait_ms: 5_000,
                ..Default::default()
            })
            .await?
            .into_inner();
        let Some(d) = got.deliveries.into_iter().next() else {
            return Err("nothing to receive".into());
        };
        println!("delivery {} of {}: failing it", d.delivery_count, d.message_id);
        msg.nack(pb::NackRequest {
            items: vec![pb::NackItem {
                ack_token: d.ack_token,
                reason: "tax service unavailable".into(),
                ..Default::default()
            }],
        })
        .await?;
    }

    // 4. Look at the DLQ without consuming: browsing never counts as a
    //    delivery. Each message carries its dead-letter record.
    let page = admin
        .browse(pb::BrowseRequest {
            queue: "invoices.dlq".into(),
            max_messages: 10,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    for m in &page.messages {
        for r in &m.dead_letters {
            println!(
                "in the DLQ: {} from {} after {} deliveries, last error {:?}",
                m.message_id, r.source_queue, r.delivery_count, r.last_nack_reason
            );
        }
    }

    // 5. Someone fixes the cause and handles the message: receive it from
    //    the DLQ and ack it.
    let got = msg
        .receive(pb::ReceiveRequest {
            queue: "invoices.dlq".into(),
            max_messages: 1,
            ..Default::default()
        })
        .await?
        .into_inner();
    if let Some(d) = got.deliveries.into_iter().next() {
        msg.ack(pb::AckRequest {
            ack_tokens: vec![d.ack_token],
        })
        .await?;
        println!("handled {} from the DLQ", d.message_id);
    }
    Ok(())
}
