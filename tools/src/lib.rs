//! Tools around Letterbox that are not part of the server.
//!
//! - [`chaos`]: crash-safety testing: a seeded workload against a server
//!   that is killed (or loses power) over and over, and a checker of the
//!   client-side history.
//! - [`console_bench`]: what the web console costs: its pages' times at
//!   10,000 queues, publish throughput with it off, on, and with a page
//!   open.
//! - [`loadgen`]: the load generator. It runs the same workloads against
//!   Letterbox and against peer brokers (RabbitMQ, NATS JetStream; cargo
//!   feature `peers`) and reports them side by side.
//! - [`memory`]: the heap held per queued message after a start, the
//!   store's and the engine's indexes apart.
//! - [`scale`]: Letterbox at depth: fill to millions of messages, restart,
//!   drain, reclaim, many queues.

pub mod chaos;
pub mod console_bench;
pub mod loadgen;
pub mod memory;
pub mod scale;
