//! The README's walkthrough as a program: create a queue with a dead
//! letter queue, publish, receive, nack until the message dead-letters,
//! browse the DLQ, and take the message out of it.
//!
//! Start a server first (`cargo run --release -- serve`), then:
//!
//! ```text
//! cargo run --release --example walkthrough [http://127.0.0.1:50051]
//! ```
//!
//! `tests/it/walkthrough.rs` runs [`run`] against a fresh server and checks
//! that it prints exactly what the README shows.

use std::io::Write;
use std::time::Duration;

use letterbox::client::{Client, pb};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    run(&url, &mut std::io::stdout().lock()).await
}

/// The walkthrough against the server at `url`, its report written to
/// `out` line by line.
pub(crate) async fn run(url: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(url).await?;

    // 1. A queue whose messages move to `invoices.dlq` after 3 failed
    //    deliveries. The DLQ is an ordinary queue and must exist first.
    client
        .create_queue("invoices.dlq", pb::QueueConfig::default())
        .await?;
    let config = pb::QueueConfig {
        dead_letter: Some(pb::DeadLetterPolicy {
            queue: "invoices.dlq".into(),
            max_deliveries: 3,
        }),
        ack_timeout_ms: Some(30_000),
        ..Default::default()
    };
    client.create_queue("invoices", config).await?;
    writeln!(out, "queues invoices and invoices.dlq ready")?;

    // 2. Publish. The answer comes once the message is on disk.
    let message = pb::PublishMessage {
        properties: [("customer".to_string(), "acme".to_string())].into(),
        ..Client::message("order 42: issue the invoice")
    };
    let published = client.publish("invoices", vec![message]).await?;
    let id = &published[0].message_id;
    writeln!(out, "published {id}")?;

    // 3. Receive and fail three times: each nack counts as a delivery
    //    attempt; after the third the broker moves the message to the DLQ.
    for _ in 0..3 {
        let got = client
            .receive("invoices", 1, Duration::from_secs(5))
            .await?;
        let Some(d) = got.into_iter().next() else {
            return Err("nothing to receive".into());
        };
        writeln!(
            out,
            "delivery {} of {}: failing it",
            d.delivery_count, d.message_id
        )?;
        client
            .nack(vec![pb::NackItem {
                ack_token: d.ack_token,
                reason: "tax service unavailable".into(),
                ..Default::default()
            }])
            .await?;
    }

    // 4. Look at the DLQ without consuming: browsing never counts as a
    //    delivery. Each message carries its dead-letter record.
    let page = client.browse("invoices.dlq", 10, "").await?;
    for m in &page.messages {
        for r in &m.dead_letters {
            writeln!(
                out,
                "in the DLQ: {} from {} after {} deliveries, last error {:?}",
                m.message_id, r.source_queue, r.delivery_count, r.last_nack_reason
            )?;
        }
    }

    // 5. Someone fixes the cause and handles the message: receive it from
    //    the DLQ and ack it (or redrive it back: `letterbox dlq redrive`).
    for d in client.receive("invoices.dlq", 1, Duration::ZERO).await? {
        client.ack(vec![d.ack_token]).await?;
        writeln!(out, "handled {} from the DLQ", d.message_id)?;
    }
    Ok(())
}
