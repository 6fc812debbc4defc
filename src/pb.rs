//! The generated protobuf types and gRPC services of `letterbox.v1`.
//!
//! This is the only place that includes generated code. Generated types are
//! used by `grpc/` and `client/` only; the queue engine never sees them.
#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

tonic::include_proto!("letterbox.v1");

/// The encoded file descriptor set of `letterbox.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("letterbox_descriptor");
