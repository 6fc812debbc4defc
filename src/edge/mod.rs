//! What the front ends share: the audit log, connection caps and
//! deadlines, the HTTP listeners, and who consumes each queue.

pub(crate) mod audit;
pub(crate) mod conns;
pub(crate) mod consumers;
pub(crate) mod http;
