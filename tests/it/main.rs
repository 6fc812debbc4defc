//! Integration tests: real servers over gRPC on loopback. One binary.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod admin;
mod anypoint;
mod cli;
mod client;
mod clock;
mod console;
mod console_http;
mod definitions;
mod disk_faults;
mod docs;
mod durability;
mod ecosystem;
mod exchanges;
mod fifo;
mod ha;
mod harness;
mod log_damage;
mod logs;
mod messaging;
mod redrive;
mod security;
mod service_manager;
mod slow_clients;
mod sqs;
mod sqs_auth;
mod sqs_move;
mod subscriber_order;
mod tls_first_time;
mod verify;
mod walkthrough;
