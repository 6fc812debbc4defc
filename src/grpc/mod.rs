//! The gRPC front end (tonic): the two services as thin handlers,
//! credentials and grants, conversions, the status mapping.

mod access;
pub(crate) mod calls;
pub(crate) mod convert;
mod publish_stream;
pub(crate) mod redrive;
mod service;
pub(crate) mod status;
mod subscribe;

pub use service::Service;

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod publish_stream_tests;
