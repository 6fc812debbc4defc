//! Letterbox: a durable single-node message queue with dead letter queues,
//! over gRPC.
//!
//! Code map (see ARCHITECTURE.md for the whole picture):
//!
//! - [`queue`]: the engine. Every rule of queues, leases, delivery counts,
//!   dead letters, TTLs, delays and FIFO groups; no I/O of its own.
//! - [`storage`]: durability. Our write-ahead log with group commit in
//!   front of sled; the only module that names sled.
//! - [`server`]: the composition root: opens the store, starts every
//!   front end side by side over the one engine, owns shutdown.
//! - The front ends, each importing the engine and `edge` only: `grpc`
//!   (the gRPC services with tonic, conversions, the status mapping),
//!   [`anypoint`] (the optional Anypoint MQ compatible REST facade: Broker
//!   API, an Admin and Stats subset), [`sqs`] (the Amazon SQS compatible
//!   endpoint: AWS JSON 1.0 and the query protocol), [`console`] (the web
//!   console) and `metrics` (the Prometheus endpoint).
//! - `edge`: what the front ends share: the audit log, connection caps,
//!   the HTTP listeners, TLS settings, consumers.
//! - [`pb`]: the generated protobuf types of `letterbox.v1`.
//! - [`cli`]: the command-line client, over [`client`] only.
//! - [`auth`]: principals, credentials and grants (who may do what).
//! - [`clock`]: wall-clock time, injectable for tests.
//! - [`faults`]: the crash tests' negative controls, compiled out unless
//!   the `fault-injection` feature is on.
//! - [`launch`]: `letterbox serve` as a child process: the lines it
//!   announces its listeners with, and the one way tests and tools start
//!   it and wait for them.
//! - [`client`]: the Rust client library (over [`pb`] only): calls,
//!   batching publisher, subscriptions, the subscriber with its strategies,
//!   ack modes and circuit breaker.
pub mod anypoint;
pub mod auth;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod console;
mod edge;
pub mod faults;
mod grpc;
pub mod launch;
mod metrics;
pub mod pb;
pub mod queue;
pub mod server;
pub mod sqs;
pub mod storage;
pub mod units;

#[cfg(test)]
mod queue_config_tests;
