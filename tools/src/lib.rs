//! Tools around Letterbox that are not part of the server.
//!
//! - [`loadgen`]: the load generator. It runs the same workloads against
//!   Letterbox and against peer brokers (RabbitMQ, NATS JetStream; cargo
//!   feature `peers`) and reports them side by side.
//! - [`scale`]: Letterbox at depth: fill to millions of messages, restart,
//!   drain, reclaim, many queues.

pub mod loadgen;
pub mod scale;
