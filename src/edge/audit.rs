//! The audit log: one `info` event with the target `letterbox::audit` per
//! destructive or security-relevant act, whichever door it came through
//! (gRPC, the Anypoint REST facade or the console): queues and exchanges created,
//! changed, deleted or purged, bindings changed, definitions imported,
//! redrives started and ended, FIFO group heads skipped and groups
//! released, and every refused credential or grant. Each event names the
//! `action`, the `name` acted on, the `principal` and the `peer` address;
//! `detail` adds what the act did (messages deleted, moved, ...).
//!
//! Select it alone with `--log letterbox::audit=info` (or keep it in the
//! default `info`); with `--log-format json` each event is one JSON line.
//! docs/configuration.md ("Logs and the audit log") lists the actions and
//! how to route them to a file of their own.

use std::net::SocketAddr;

use crate::queue::redrive::{RedriveEnd, RedriveSpec, RedriveStep};

/// Who did it: the principal's name and the peer address, if known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Who<'a> {
    /// The principal's name (`anonymous` with authentication off).
    pub principal: &'a str,
    /// The caller's address.
    pub peer: Option<SocketAddr>,
}

fn peer_text(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "-".to_string(), |p| p.to_string())
}

/// An act that was done.
pub(crate) fn done(who: Who<'_>, action: &str, name: &str, detail: &str) {
    tracing::info!(
        target: "letterbox::audit",
        action,
        name,
        principal = who.principal,
        peer = %peer_text(who.peer),
        outcome = "done",
        detail,
        "audit: {action} {name}"
    );
}

/// An act refused by access control: credentials not accepted, or a grant
/// missing.
pub(crate) fn refused(who: Who<'_>, action: &str, name: &str, reason: &str) {
    tracing::info!(
        target: "letterbox::audit",
        action,
        name,
        principal = who.principal,
        peer = %peer_text(who.peer),
        outcome = "refused",
        detail = reason,
        "audit: refused {action} {name}"
    );
}

/// The audit detail of a redrive's end, whichever door started it.
pub(crate) fn redrive_end(spec: &RedriveSpec, total: &RedriveStep, ended: &RedriveEnd) -> String {
    match ended {
        RedriveEnd::Done => format!(
            "dry_run={} scanned={} matched={} moved={} skipped={} (leased={} no_source={} no_target={} other_kind={})",
            spec.dry_run,
            total.scanned,
            total.matched,
            total.moved,
            total.skipped,
            total.skipped_leased,
            total.skipped_no_source,
            total.skipped_no_target,
            total.skipped_other_kind
        ),
        RedriveEnd::ShutDown => format!("stopped by the shutdown: moved={}", total.moved),
        RedriveEnd::Cancelled => format!("cancelled by the client: moved={}", total.moved),
        RedriveEnd::Failed(e) => format!("failed: {e}: moved={}", total.moved),
    }
}
