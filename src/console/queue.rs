//! A queue's pages: its configuration and figures, the plots of its depth
//! and rates, its messages (browsed without leasing), one message with its
//! attempts and dead-letter history, and the actions: publish a test
//! message, purge (typed confirmation), change the configuration, delete;
//! for FIFO queues, the groups (release a parked one, skip a head).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use maud::{Markup, html};

use super::history::{FINE_WINDOW, Sample, WINDOW};
use super::layout::{self, BodyView, age, csrf, time};
use super::{Failure, Flash, Posted, Session, Shared, allow};
use crate::auth::Action;
use crate::queue::model::{
    BrowsedMessage, DeadLetterInput, GroupState, NewMessage, PoisonPolicy, QueueConfig,
    QueueConfigInput, QueueInfo, QueueKind, QueueRemovals,
};
use crate::units::Millis;

/// Messages per browsed page.
const BROWSE_PAGE: u32 = 50;
/// Body bytes shown on a message's page.
const BODY_SHOWN: usize = 256 << 10;

/// `GET /queues/{name}`.
pub(crate) async fn page(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    render(&c, &s, &name, &q, None, StatusCode::OK).await
}

async fn render(
    c: &Shared,
    s: &Session,
    name: &str,
    q: &HashMap<String, String>,
    flash: Option<Flash>,
    status: StatusCode,
) -> Response {
    match body(c, s, name, q).await {
        Ok(body) => (status, layout::page(name, s, flash.as_ref(), body)).into_response(),
        Err(f) => match flash {
            // The action's outcome first (e.g. the queue it deleted).
            Some(fl) => (
                status,
                layout::page(
                    name,
                    s,
                    Some(&fl),
                    html! {
                        p { a href="/" { "Back to the queues" } }
                    },
                ),
            )
                .into_response(),
            None => f.into_response(),
        },
    }
}

fn visible(s: &Session, name: &str) -> Result<(), Failure> {
    if s.principal.sees(name) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "principal {:?} has no grant on {name:?}",
                s.principal.name()
            ),
        ))
    }
}

async fn body(
    c: &Shared,
    s: &Session,
    name: &str,
    q: &HashMap<String, String>,
) -> Result<Markup, Failure> {
    visible(s, name)?;
    let info = c.broker.get_queue(name)?;
    let stats = c.broker.stats(name)?;
    let window = if q.get("window").is_some_and(|w| w == "1h") {
        "1h"
    } else {
        "15m"
    };
    let can_consume = s.principal.allows(Action::Consume, name);
    let after = q.get("after").map_or("", String::as_str).to_string();
    let browsed = if can_consume {
        let (b, n, a) = (Arc::clone(&c.broker), name.to_string(), after.clone());
        // Reads the messages' records and bodies: off the async workers.
        Some(
            tokio::task::spawn_blocking(move || b.browse(&n, BROWSE_PAGE, &a))
                .await
                .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??,
        )
    } else {
        None
    };
    let fifo = info.config.kind == QueueKind::Fifo;
    Ok(html! {
        h1 { "Queue " (name) @if fifo { " " span.muted { "FIFO" } } }
        p.tabs {
            a.on href=(format!("/queues/{name}")) { "Overview" }
            @if !info.dead_letter_sources.is_empty() || stats.counters.dead_letters_received > 0 {
                a #dead-letters-link href=(format!("/queues/{name}/dead-letters")) { "Dead letters" }
            }
            @if fifo { a href=(format!("/queues/{name}/groups")) { "Groups" } }
        }
        dl #queue-stats .facts {
            dt { "ready" } dd data-stat="ready" { (stats.ready) }
            dt { "in flight" } dd data-stat="in_flight" { (stats.in_flight) }
            dt { "delayed" } dd data-stat="delayed" { (stats.delayed) }
            dt { "parked" } dd data-stat="parked" { (stats.parked) }
            dt { "total" } dd data-stat="total" { (stats.total) }
            dt { "oldest" } dd data-stat="oldest_age" { (age(stats.oldest_age)) }
            dt { "published" } dd { (stats.counters.published) }
            dt { "acked" } dd { (stats.counters.acked) }
            dt { "nacked" } dd { (stats.counters.nacked) }
            dt { "dead-lettered" } dd { (stats.counters.dead_lettered) }
            dt { "expired" } dd { (stats.counters.expired) }
            dt { "redriven out / in" } dd { (stats.counters.redriven) " / " (stats.counters.redrive_received) }
        }
        (config_view(&info))
        h2 { "Depth and rates "
            span.tabs.muted {
                a.(if window == "15m" { "on" } else { "" }) href=(format!("/queues/{name}?window=15m")) { "15 min" }
                a.(if window == "1h" { "on" } else { "" }) href=(format!("/queues/{name}?window=1h")) { "1 hour" }
            }
        }
        div.plots {
            div #plot-depth .plot data-plot="depth" data-src=(format!("/queues/{name}/history.json?window={window}")) {}
            div #plot-rates .plot data-plot="rates" data-src=(format!("/queues/{name}/history.json?window={window}")) {}
        }
        h2 { "Messages" }
        @match &browsed {
            None => p.muted { "Browsing needs the consume grant on " (name) "." },
            Some(page) => {
                (messages_table(name, &page.messages))
                div.pager {
                    @if !after.is_empty() { a href=(format!("/queues/{name}")) { "← first" } }
                    @if let Some(next) = &page.next { a #next-page href=(format!("/queues/{name}?after={next}")) { "next →" } }
                }
            }
        }
        @if s.principal.allows(Action::Publish, name) {
            h2 { "Publish a test message" }
            form #publish .box method="post" action=(format!("/queues/{name}/publish")) {
                (csrf(s))
                label { "Body" textarea name="body" rows="4" {} }
                label { "Properties (key=value, one a line)" textarea name="properties" rows="2" {} }
                @if fifo { label { "Group id" input type="text" name="group_id"; } }
                label { "Delay" input type="text" name="delay" placeholder="e.g. 30s"; }
                button.primary type="submit" { "Publish" }
            }
        }
        @if s.principal.allows(Action::Admin, name) {
            (config_form(s, &info))
            h2 { "Purge" }
            form #purge .box.danger-zone method="post" action=(format!("/queues/{name}/purge")) {
                (csrf(s))
                p { "Deletes every message of " b { (name) } " (" (stats.total) " now), leased ones included. Type the queue's name to confirm." }
                label { "Queue name" input type="text" name="confirm" autocomplete="off"; }
                button #purge-submit .danger type="submit" { "Purge" }
            }
            h2 { "Delete" }
            form #delete .box.danger-zone method="post" action=(format!("/queues/{name}/delete")) {
                (csrf(s))
                p { "Deletes the queue and its messages. Type the queue's name to confirm." }
                label { "Queue name" input type="text" name="confirm" autocomplete="off"; }
                button #delete-submit .danger type="submit" { "Delete the queue" }
            }
        }
    })
}

fn config_view(info: &QueueInfo) -> Markup {
    let c = &info.config;
    html! {
        h2 { "Configuration" }
        dl #queue-config .facts {
            dt { "kind" } dd { (c.kind.to_string()) }
            dt { "ack timeout" } dd { (Millis(std::time::Duration::from_millis(c.ack_timeout)).to_string()) }
            dt { "message TTL" } dd { (Millis(std::time::Duration::from_millis(c.message_ttl)).to_string()) }
            dt { "delivery delay" } dd { (Millis(std::time::Duration::from_millis(c.delivery_delay)).to_string()) }
            dt { "max length" } dd { @if let Some(m) = c.max_length { (m) } @else { "none" } }
            dt { "max lease" } dd { (Millis(std::time::Duration::from_millis(c.max_lease_total)).to_string()) }
            dt { "dead letter queue" } dd {
                @if let Some(d) = &c.dead_letter {
                    a.dlq-link href=(format!("/queues/{}", d.queue)) { (d.queue) }
                    " after " (d.max_deliveries) " failed attempts"
                } @else { "none" }
            }
            dt { "dead letter queue of" } dd {
                @if info.dead_letter_sources.is_empty() { "none" }
                @for (i, src) in info.dead_letter_sources.iter().enumerate() {
                    @if i > 0 { ", " }
                    a.source-link href=(format!("/queues/{src}")) { (src) }
                }
            }
            dt { "retry backoff" } dd {
                @if let Some(b) = &c.retry_backoff {
                    (Millis(std::time::Duration::from_millis(b.initial)).to_string()) " ×" (b.multiplier) " up to " (Millis(std::time::Duration::from_millis(b.max)).to_string())
                } @else { "none" }
            }
            dt { "dead-letter on expiry" } dd { (c.dead_letter_on_expiry) }
            @if c.kind == QueueKind::Fifo {
                dt { "poison policy" } dd { (if c.on_poison == PoisonPolicy::ParkGroup { "park the group" } else { "dead-letter and go on" }) }
                dt { "dedup window" } dd { (Millis(std::time::Duration::from_millis(c.dedup_window)).to_string()) }
                dt { "content-based dedup" } dd { (c.content_based_dedup) }
            }
            dt { "created" } dd { (time(info.created_at)) }
        }
    }
}

fn ms_text(ms: u64) -> String {
    Millis(std::time::Duration::from_millis(ms)).to_string()
}

fn config_form(s: &Session, info: &QueueInfo) -> Markup {
    let name = &info.name;
    html! {
        h2 { "Change the configuration" }
        form #edit-config .box method="post" action=(format!("/queues/{name}/config")) {
            (csrf(s))
            (config_fields(&info.config))
            button.primary type="submit" { "Save" }
        }
    }
}

/// The form's fields, each showing the value in force; [`config_request`]
/// reads them back.
fn config_fields(c: &QueueConfig) -> Markup {
    html! {
        div.row {
            label { "Ack timeout" input type="text" name="ack_timeout" value=(ms_text(c.ack_timeout)); }
            label { "Message TTL" input type="text" name="message_ttl" value=(ms_text(c.message_ttl)); }
            label { "Delivery delay" input type="text" name="delivery_delay" value=(ms_text(c.delivery_delay)); }
            label { "Max length (empty: none)" input type="number" min="1" name="max_length" value=(c.max_length.map(|m| m.to_string()).unwrap_or_default()); }
        }
        div.row {
            label { "Dead letter queue (empty: none)" input type="text" name="dead_letter_queue" value=(c.dead_letter.as_ref().map(|d| d.queue.clone()).unwrap_or_default()); }
            label { "Max deliveries" input type="number" min="1" name="max_deliveries" value=(c.dead_letter.as_ref().map(|d| d.max_deliveries.to_string()).unwrap_or_default()); }
            label { "Dead-letter on expiry" select name="dead_letter_on_expiry" {
                option value="false" selected[!c.dead_letter_on_expiry] { "no" }
                option value="true" selected[c.dead_letter_on_expiry] { "yes" }
            } }
        }
    }
}

/// The update a posted configuration form asks for: the values of its
/// fields, an empty dead letter queue or max length removing it.
fn config_request(form: &Posted) -> Result<(QueueConfigInput, QueueRemovals), Failure> {
    let mut input = QueueConfigInput {
        ack_timeout: duration("ack timeout", form.text("ack_timeout"))?,
        message_ttl: duration("message TTL", form.text("message_ttl"))?,
        delivery_delay: duration("delivery delay", form.text("delivery_delay"))?,
        dead_letter_on_expiry: Some(form.text("dead_letter_on_expiry") == "true"),
        ..QueueConfigInput::default()
    };
    let mut removals = QueueRemovals::default();
    match form.text("max_length") {
        "" => removals.max_length = true,
        m => {
            input.max_length = Some(m.parse().map_err(|_| {
                Failure::new(
                    StatusCode::BAD_REQUEST,
                    format!("max length: {m:?} is not a whole number"),
                )
            })?);
        }
    }
    match form.text("dead_letter_queue") {
        "" => removals.dead_letter = true,
        d => {
            let max = match form.text("max_deliveries") {
                "" => 0,
                m => m.parse().map_err(|_| {
                    Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!("max deliveries: {m:?} is not a whole number"),
                    )
                })?,
            };
            input.dead_letter = Some(DeadLetterInput::new(d, max));
        }
    }
    Ok((input, removals))
}

fn messages_table(name: &str, msgs: &[BrowsedMessage]) -> Markup {
    html! {
        table #messages {
            thead { tr { th.num { "#" } th { "message id" } th { "state" } th.num { "deliveries" } th.num { "failed" } th { "group" } th { "enqueued" } th { "body" } } }
            tbody {
                @for m in msgs {
                    tr data-message-id=(m.message_id) {
                        td.num { (m.position) }
                        td { a href=(format!("/queues/{name}/messages/{}", m.position)) { (m.message_id) } }
                        td { (m.state.name()) }
                        td.num data-col="deliveries" { (m.delivery_count) }
                        td.num data-col="failed_attempts" { (m.failed_attempts) }
                        td { (m.group_id.as_deref().unwrap_or("")) }
                        td { (time(m.enqueued_at)) }
                        td.muted { @if m.damaged.is_empty() { (layout::preview(&m.body)) } @else { "damaged: " (m.damaged) } }
                    }
                }
                @if msgs.is_empty() { tr { td colspan="8" .muted { "No messages." } } }
            }
        }
    }
}

/// `GET /queues/{name}/history.json?window=15m|1h`: the plots' data.
pub(crate) async fn history_json(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(f) = visible(&s, &name) {
        return f.into_response();
    }
    let window = if q.get("window").is_some_and(|w| w == "1h") {
        WINDOW
    } else {
        FINE_WINDOW
    };
    match c.broker.stats(&name) {
        Ok(st) => {
            match serde_json::to_vec(&c.history.plot(&name, window, c.now(), Sample::of(&st))) {
                Ok(json) => (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    json,
                )
                    .into_response(),
                Err(e) => {
                    Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
                }
            }
        }
        Err(e) => Failure::from(e).into_response(),
    }
}

fn properties(text: &str) -> Result<Vec<(String, String)>, Failure> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!("properties: {l:?} is not key=value"),
                    )
                })
        })
        .collect()
}

fn duration(field: &str, text: &str) -> Result<Option<u64>, Failure> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<Millis>()
        .map(|m| Some(m.as_ms()))
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("{field}: {e}")))
}

/// Runs an action and answers the queue's page with its outcome.
async fn act(c: &Shared, s: &Session, name: &str, done: Result<String, Failure>) -> Response {
    let q = HashMap::new();
    match done {
        Ok(text) => render(c, s, name, &q, Some(Flash::ok(text)), StatusCode::OK).await,
        Err(f) => render(c, s, name, &q, Some(Flash::error(f.text)), f.status).await,
    }
}

/// `POST /queues/{name}/publish`.
pub(crate) async fn publish(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let done = async {
        allow(&c, &s, Action::Publish, &name)?;
        let group = form.text("group_id");
        let msg = NewMessage {
            body: Bytes::from(form.get("body").unwrap_or("").to_string()),
            properties: properties(form.text("properties"))?,
            delay: duration("delay", form.text("delay"))?,
            group_id: (!group.is_empty()).then(|| group.to_string()),
            ..NewMessage::default()
        };
        let published = c.broker.publish(&name, vec![msg]).await?;
        let id = published
            .first()
            .map(|p| p.message_id.clone())
            .unwrap_or_default();
        Ok(format!("published message {id}"))
    };
    act(&c, &s, &name, done.await).await
}

/// `POST /queues/{name}/purge`: only with the queue's name typed.
pub(crate) async fn purge(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        confirm(&form, &name, "purge")?;
        let n = c.broker.purge_queue(&name).await?;
        s.audit_done("queue.purge", &name, &format!("deleted={n}"));
        Ok(format!(
            "purged {name}: {n} message{} deleted",
            if n == 1 { "" } else { "s" }
        ))
    };
    act(&c, &s, &name, done.await).await
}

fn confirm(form: &Posted, name: &str, what: &str) -> Result<(), Failure> {
    let typed = form.text("confirm");
    if typed == name {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!(
                "not confirmed: type the queue's name ({name}) to {what} it; {typed:?} was typed"
            ),
        ))
    }
}

/// `POST /queues/{name}/delete`: only with the queue's name typed.
pub(crate) async fn delete(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        confirm(&form, &name, "delete")?;
        let n = c.broker.delete_queue(&name, true).await?;
        s.audit_done("queue.delete", &name, &format!("messages={n}"));
        Ok(format!("deleted queue {name} and its {n} messages"))
    };
    match done.await {
        Ok(text) => (
            StatusCode::OK,
            layout::page(
                "Deleted",
                &s,
                Some(&Flash::ok(text)),
                html! { p { a href="/" { "Back to the queues" } } },
            ),
        )
            .into_response(),
        Err(f) => act(&c, &s, &name, Err(f)).await,
    }
}

/// `POST /queues/{name}/config`.
pub(crate) async fn update_config(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        let (input, removals) = config_request(&form)?;
        c.broker.update_queue(&name, &input, removals).await?;
        s.audit_done("queue.update", &name, "");
        Ok(format!("configuration of {name} saved"))
    };
    act(&c, &s, &name, done.await).await
}

/// `GET /queues/{name}/messages/{pos}`: one message, browsed.
pub(crate) async fn message(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path((name, pos)): Path<(String, u64)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let shown = async {
        allow(&c, &s, Action::Consume, &name)?;
        let (b, n) = (Arc::clone(&c.broker), name.clone());
        let token = if pos == 0 {
            String::new()
        } else {
            (pos - 1).to_string()
        };
        let page = tokio::task::spawn_blocking(move || b.browse(&n, 1, &token))
            .await
            .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
        let m = page
            .messages
            .into_iter()
            .find(|m| m.position == pos)
            .ok_or_else(|| {
                Failure::new(
                    StatusCode::NOT_FOUND,
                    format!("no message at position {pos} of {name}: acked, moved or purged since"),
                )
            })?;
        Ok::<_, Failure>(m)
    };
    let m = match shown.await {
        Ok(m) => m,
        Err(f) => return f.into_response(),
    };
    let view = BodyView::parse(q.get("as").map(String::as_str))
        .unwrap_or_else(|| layout::best_view(&m.body));
    let body = html! {
        h1 { "Message " (m.message_id) }
        p { a href=(format!("/queues/{name}")) { "← " (name) } }
        dl #message-facts .facts {
            dt { "state" } dd { (m.state.name()) }
            dt { "deliveries" } dd data-col="deliveries" { (m.delivery_count) }
            dt { "failed attempts" } dd data-col="failed_attempts" { (m.failed_attempts) }
            dt { "group" } dd { (m.group_id.as_deref().unwrap_or("")) }
            dt { "published" } dd { (time(m.published_at)) }
            dt { "enqueued" } dd { (time(m.enqueued_at)) }
            dt { "expires" } dd { (time(m.expires_at)) }
            @if m.visible_at > 0 { dt { "visible at" } dd { (time(m.visible_at)) } }
            @if m.lease_deadline > 0 { dt { "lease ends" } dd { (time(m.lease_deadline)) } }
            dt { "size" } dd { (layout::bytes(m.body.len() as u64)) }
        }
        h2 { "Body " span.tabs {
            @for v in [BodyView::Text, BodyView::Json, BodyView::Hex] {
                a.(if v == view { "on" } else { "" }) href=(format!("?as={}", v.name())) { (v.name()) }
            }
        } }
        @if !m.damaged.is_empty() { p.flash.error { "The stored body is damaged: " (m.damaged) } }
        pre #message-body .body { (layout::body_text(&m.body, view, BODY_SHOWN)) }
        h2 { "Properties" }
        table #properties {
            thead { tr { th { "key" } th { "value" } } }
            tbody {
                @for (k, v) in &m.properties { tr { td { (k) } td { (v) } } }
                @if m.properties.is_empty() { tr { td colspan="2" .muted { "none" } } }
            }
        }
        h2 { "Attempts" }
        table #attempts {
            thead { tr { th { "ended" } th { "outcome" } th { "reason" } } }
            tbody {
                @for a in &m.attempts { tr { td { (time(a.at)) } td { (a.outcome.name()) } td { (a.reason) } } }
                @if m.attempts.is_empty() { tr { td colspan="3" .muted { "none recorded" } } }
            }
        }
        h2 { "Dead-letter history" }
        table #dead-letter-history {
            thead { tr { th { "at" } th { "from" } th { "reason" } th.num { "deliveries" } th.num { "failed" } th { "last error" } th { "note" } } }
            tbody {
                @for d in &m.dead_letters {
                    tr { td { (time(d.at)) } td { (d.source_queue) } td { (d.reason.name()) } td.num { (d.delivery_count) } td.num { (d.failed_attempts) } td { (d.last_nack_reason) } td { (d.note) } }
                }
                @if m.dead_letters.is_empty() { tr { td colspan="7" .muted { "never dead-lettered" } } }
            }
        }
        @if let Some(last) = m.dead_letters.last() {
            @if s.principal.allows(Action::Admin, &name) {
                form #redrive-one .box method="post" action=(format!("/queues/{name}/redrive")) {
                    (csrf(&s))
                    input type="hidden" name="id" value=(m.message_id);
                    input type="hidden" name="target" value="";
                    p { "Send it back to " b { (last.source_queue) } "." }
                    button #redrive-preview .primary type="submit" name="mode" value="preview" { "Preview the redrive" }
                }
            }
        }
    };
    layout::page(&m.message_id, &s, None, body).into_response()
}

/// `GET /queues/{name}/groups`: a FIFO queue's groups, parked first.
pub(crate) async fn groups(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    groups_page(&c, &s, &name, &q, None, StatusCode::OK)
}

fn groups_page(
    c: &Shared,
    s: &Session,
    name: &str,
    q: &HashMap<String, String>,
    flash: Option<Flash>,
    status: StatusCode,
) -> Response {
    let only_parked = q.get("state").is_some_and(|v| v == "parked");
    let after = q.get("after").map(String::as_str);
    let listed = visible(s, name).and_then(|()| {
        c.broker
            .list_groups(name, 100, after, only_parked.then_some(GroupState::Parked))
            .map_err(Failure::from)
    });
    let (rows, next) = match listed {
        Ok(x) => x,
        Err(f) => return f.into_response(),
    };
    let admin = s.principal.allows(Action::Admin, name);
    let body = html! {
        h1 { "Groups of " (name) }
        p.tabs {
            a href=(format!("/queues/{name}")) { "Overview" }
            a.(if only_parked { "" } else { "on" }) href=(format!("/queues/{name}/groups")) { "all" }
            a.(if only_parked { "on" } else { "" }) href=(format!("/queues/{name}/groups?state=parked")) { "parked" }
        }
        table #groups {
            thead { tr { th { "group" } th { "state" } th.num { "backlog" } th.num { "in flight" } th { "oldest" } th { "head" } th.num { "head deliveries" } th.num { "head failed" } th { "why" } th {} } }
            tbody {
                @for g in &rows {
                    tr data-group=(g.group_id) {
                        td { @if g.group_id.is_empty() { span.muted { "(default)" } } @else { (g.group_id) } }
                        td { (g.state.name()) }
                        td.num { (g.backlog) }
                        td.num { (g.in_flight) }
                        td { (age(g.oldest_age)) }
                        td { (g.head_message_id) }
                        td.num { (g.head_delivery_count) }
                        td.num { (g.head_failed_attempts) }
                        td { (g.reason) }
                        td {
                            @if admin {
                                @if g.state == GroupState::Parked {
                                    form.inline method="post" action=(format!("/queues/{name}/groups/release")) {
                                        (csrf(s)) input type="hidden" name="group" value=(g.group_id);
                                        button.release type="submit" { "release" }
                                    }
                                    " "
                                }
                                form.inline method="post" action=(format!("/queues/{name}/groups/skip")) {
                                    (csrf(s)) input type="hidden" name="group" value=(g.group_id);
                                    input type="text" name="note" placeholder="note";
                                    button.skip type="submit" { "skip head" }
                                }
                            }
                        }
                    }
                }
                @if rows.is_empty() { tr { td colspan="9" .muted { "No groups." } } }
            }
        }
        @if let Some(n) = next {
            p.pager { a href=(format!("/queues/{name}/groups?after={n}{}", if only_parked { "&state=parked" } else { "" })) { "next →" } }
        }
    };
    (
        status,
        layout::page(&format!("Groups of {name}"), s, flash.as_ref(), body),
    )
        .into_response()
}

/// `POST /queues/{name}/groups/release`.
pub(crate) async fn release_group(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let group = form.text("group").to_string();
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        let r = c.broker.release_group(&name, &group).await?;
        s.audit_done("group.release", &name, &format!("group={group:?}"));
        Ok::<_, Failure>(format!(
            "group {group:?} released: its head {r} is deliverable again"
        ))
    };
    group_outcome(&c, &s, &name, done.await)
}

/// `POST /queues/{name}/groups/skip`: the head goes to the DLQ.
pub(crate) async fn skip_head(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let group = form.text("group").to_string();
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        let id = c.broker.skip_head(&name, &group, form.text("note")).await?;
        s.audit_done(
            "group.skip_head",
            &name,
            &format!("group={group:?} message={id}"),
        );
        Ok::<_, Failure>(format!("skipped message {id}, the head of group {group:?}"))
    };
    group_outcome(&c, &s, &name, done.await)
}

fn group_outcome(c: &Shared, s: &Session, name: &str, done: Result<String, Failure>) -> Response {
    let q = HashMap::new();
    match done {
        Ok(t) => groups_page(c, s, name, &q, Some(Flash::ok(t)), StatusCode::OK),
        Err(f) => groups_page(c, s, name, &q, Some(Flash::error(f.text)), f.status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::validate::{default_config, updated_config};

    /// The values of the fields a page shows (inputs, and the selected
    /// option of each select), as a browser posts them.
    fn posted(html: &str) -> Posted {
        let attr = |tag: &str, name: &str| -> Option<String> {
            let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            let len = tag[start..].find('"')?;
            Some(tag[start..start + len].to_string())
        };
        let mut fields = Vec::new();
        let mut select = None;
        for tag in html.split('<').filter_map(|t| t.split('>').next()) {
            if tag.starts_with("input ") {
                if let Some(name) = attr(tag, "name") {
                    fields.push((name, attr(tag, "value").unwrap_or_default()));
                }
            } else if tag.starts_with("select ") {
                select = attr(tag, "name");
            } else if tag.starts_with("option ")
                && tag.contains(" selected")
                && let (Some(name), Some(v)) = (&select, attr(tag, "value"))
            {
                fields.push((name.clone(), v));
            }
        }
        Posted(fields)
    }

    /// The form carries a subset of a queue's configuration: those values
    /// come back when it is posted as shown, the others stay as they
    /// were. A new field of `QueueConfig` must be placed in one group or
    /// the other below.
    #[test]
    fn the_configuration_form_posted_as_shown_keeps_its_values() {
        for c in [
            crate::queue_config_tests::full(),
            crate::queue_config_tests::full_standard(),
        ] {
            let html = config_fields(&c).into_string();
            let (input, removals) = config_request(&posted(&html)).expect("a valid form");
            let before = default_config(c.kind);
            let back = updated_config(&before, &input, removals).expect("valid");
            let QueueConfig {
                kind,
                message_ttl,
                ack_timeout,
                delivery_delay,
                dead_letter,
                dead_letter_on_expiry,
                max_length,
                // Not on the form: shown on the page, changed elsewhere.
                retry_backoff: _,
                max_lease_total: _,
                dedup_window: _,
                on_poison: _,
                content_based_dedup: _,
            } = c;
            let expected = QueueConfig {
                kind,
                message_ttl,
                ack_timeout,
                delivery_delay,
                dead_letter,
                dead_letter_on_expiry,
                max_length,
                ..before
            };
            assert_eq!(back, expected, "{html}");
        }
    }
}
