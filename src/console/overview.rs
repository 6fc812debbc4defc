//! The overview: every queue the principal may see, filtered, sorted and
//! paged, with its depths and rates, and the server's facts.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, http::StatusCode};
use maud::html;

use super::history::Sample;
use super::layout::{self, age, bytes, csrf, rate};
use super::{Failure, Flash, Posted, Session, Shared, allow};
use crate::auth::Action;
use crate::queue::model::{DeadLetterInput, QueueConfigInput, QueueKind, QueueStats};

/// Rows per page unless asked.
const PER_PAGE: usize = 50;

/// The columns one can sort by: (key, heading, numeric).
const COLUMNS: [(&str, &str); 10] = [
    ("ready", "ready"),
    ("in_flight", "in flight"),
    ("delayed", "delayed"),
    ("parked", "parked"),
    ("dlq_depth", "DLQ depth"),
    ("oldest_age", "oldest"),
    ("publish_rate", "publish/s"),
    ("ack_rate", "ack/s"),
    ("nack_rate", "nack/s"),
    ("dead_letter_rate", "dead-letter/s"),
];

struct Row {
    name: String,
    kind: &'static str,
    dlq: Option<String>,
    stats: QueueStats,
    dlq_depth: Option<u64>,
    rates: [f64; 4],
}

impl Row {
    /// The value sorted on for a column (oldest age sorts by ready count:
    /// the age needs a read per queue, done for the shown page only).
    fn key(&self, col: &str) -> f64 {
        match col {
            "ready" | "oldest_age" => self.stats.ready as f64,
            "in_flight" => self.stats.in_flight as f64,
            "delayed" => self.stats.delayed as f64,
            "parked" => self.stats.parked as f64,
            "dlq_depth" => self.dlq_depth.unwrap_or(0) as f64,
            "publish_rate" => self.rates[0],
            "ack_rate" => self.rates[1],
            "nack_rate" => self.rates[2],
            "dead_letter_rate" => self.rates[3],
            _ => 0.0,
        }
    }
}

/// `GET /`.
pub(crate) async fn page(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    // One pass over every queue under the engine's lock, and a read per
    // shown queue: off the async workers.
    tokio::task::spawn_blocking(move || render(&c, &s, &q, None, StatusCode::OK))
        .await
        .unwrap_or_else(|e| {
            Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        })
}

fn render(
    c: &Shared,
    s: &Session,
    q: &HashMap<String, String>,
    flash: Option<Flash>,
    status: StatusCode,
) -> Response {
    let filter = q.get("q").map_or("", |v| v.trim());
    let sort = q.get("sort").map_or("name", String::as_str);
    let desc = q.get("dir").is_some_and(|d| d == "desc");
    let per = q
        .get("per")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(PER_PAGE)
        .clamp(10, 500);
    let page_no = q
        .get("page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let now = c.now();
    let all = c.broker.all_stats();
    let depth: HashMap<&str, u64> = all
        .iter()
        .map(|(n, _, st)| (n.as_str(), st.total))
        .collect();
    let mut rows: Vec<Row> = all
        .iter()
        .filter(|(name, _, _)| filter.is_empty() || name.contains(filter))
        .filter(|(name, _, _)| s.principal.sees(name))
        .map(|(name, dlq, stats)| Row {
            name: name.clone(),
            kind: "",
            dlq: dlq.clone(),
            dlq_depth: dlq.as_deref().and_then(|d| depth.get(d).copied()),
            rates: c.history.rates(name, now, &Sample::of(stats)),
            stats: *stats,
        })
        .collect();
    let total_rows = rows.len();
    if sort != "name" {
        rows.sort_by(|a, b| {
            a.key(sort)
                .total_cmp(&b.key(sort))
                .then(a.name.cmp(&b.name))
        });
    }
    if desc {
        rows.reverse();
    }
    let pages = total_rows.div_ceil(per).max(1);
    let page_no = page_no.min(pages);
    let mut shown: Vec<Row> = rows
        .into_iter()
        .skip((page_no - 1) * per)
        .take(per)
        .collect();
    // The shown page only: the oldest message's age (a read per queue)
    // and the kind.
    for r in &mut shown {
        if let Ok(st) = c.broker.stats(&r.name) {
            r.stats.oldest_age = st.oldest_age;
        }
        if let Ok(info) = c.broker.get_queue(&r.name) {
            r.kind = if info.config.kind == QueueKind::Fifo {
                "FIFO"
            } else {
                ""
            };
        }
    }
    let link = |sort_by: &str, dir: &str, page: usize| -> String {
        let mut u = form_urlencoded::Serializer::new(String::new());
        if !filter.is_empty() {
            u.append_pair("q", filter);
        }
        u.append_pair("sort", sort_by);
        u.append_pair("dir", dir);
        if page > 1 {
            u.append_pair("page", &page.to_string());
        }
        format!("/?{}", u.finish())
    };
    let heading = |key: &str, label: &str| {
        let next_dir = if sort == key && !desc { "desc" } else { "asc" };
        let mark = if sort == key {
            if desc { " ▾" } else { " ▴" }
        } else {
            ""
        };
        html! { a href=(link(key, next_dir, 1)) { (label) (mark) } }
    };
    let facts = facts(c);
    let body = html! {
        h1 { "Queues" }
        (facts)
        form #filter .row method="get" action="/" {
            label { "Name contains" input type="search" name="q" value=(filter) placeholder="orders"; }
            input type="hidden" name="sort" value=(sort);
            input type="hidden" name="dir" value=(if desc { "desc" } else { "asc" });
            button type="submit" { "Filter" }
            span.muted { (total_rows) " queue" @if total_rows != 1 { "s" } }
        }
        table #queues {
            thead { tr {
                th { (heading("name", "queue")) }
                @for (key, label) in COLUMNS {
                    th.num { (heading(key, label)) }
                }
                th { "dead letter queue" }
            } }
            tbody {
                @for r in &shown {
                    tr data-queue=(r.name) {
                        td { a.queue-link href=(format!("/queues/{}", r.name)) { (r.name) }
                             @if !r.kind.is_empty() { " " span.muted { (r.kind) } } }
                        td.num data-col="ready" { (r.stats.ready) }
                        td.num data-col="in_flight" { (r.stats.in_flight) }
                        td.num data-col="delayed" { (r.stats.delayed) }
                        td.num data-col="parked" { (r.stats.parked) }
                        td.num data-col="dlq_depth" { @if let Some(d) = r.dlq_depth { (d) } @else { span.muted { "–" } } }
                        td.num data-col="oldest_age" { (age(r.stats.oldest_age)) }
                        td.num data-col="publish_rate" { (rate(r.rates[0])) }
                        td.num data-col="ack_rate" { (rate(r.rates[1])) }
                        td.num data-col="nack_rate" { (rate(r.rates[2])) }
                        td.num data-col="dead_letter_rate" { (rate(r.rates[3])) }
                        td { @if let Some(d) = &r.dlq { a href=(format!("/queues/{d}/dead-letters")) { (d) } } }
                    }
                }
                @if shown.is_empty() {
                    tr { td colspan="12" .muted { @if filter.is_empty() { "No queues yet." } @else { "No queue name contains " (filter) "." } } }
                }
            }
        }
        @if pages > 1 {
            div.pager {
                @if page_no > 1 { a href=(link(sort, if desc { "desc" } else { "asc" }, page_no - 1)) { "← previous" } }
                span { "page " (page_no) " of " (pages) }
                @if page_no < pages { a href=(link(sort, if desc { "desc" } else { "asc" }, page_no + 1)) { "next →" } }
            }
        }
        @if s.principal.allows_all(Action::Admin) || s.principal.allows(Action::Admin, "*") {
            h2 { "Create a queue" }
            form #create-queue .row method="post" action="/queues" {
                (csrf(s))
                label { "Name" input type="text" name="name" required; }
                label { "Kind" select name="kind" { option value="standard" { "standard" } option value="fifo" { "FIFO" } } }
                label { "Dead letter queue" input type="text" name="dead_letter_queue" placeholder="(none)"; }
                label { "Max deliveries" input type="number" name="max_deliveries" min="0" placeholder="default"; }
                button.primary type="submit" { "Create" }
            }
        }
    };
    (status, layout::page("Queues", s, flash.as_ref(), body)).into_response()
}

/// The server's facts: version, uptime, where the state lives (a data
/// directory) and free space, log sync latency and commits per second
/// (over the last sample).
fn facts(c: &Shared) -> maud::Markup {
    let store = c.broker.store();
    let location = store.location();
    let rate_now = c.history.store_rate();
    let uptime = u64::try_from(c.started.elapsed().as_millis()).unwrap_or(u64::MAX);
    html! {
        dl #server-facts .facts {
            dt { "version" } dd data-fact="version" { (env!("CARGO_PKG_VERSION")) }
            dt { "uptime" } dd data-fact="uptime" { (age(uptime)) }
            dt { (location.kind()) } dd data-fact="data_dir" { (location.to_string()) }
            dt { "disk free" } dd data-fact="disk_free" { (store.free_bytes().map_or_else(|| "unknown".to_string(), bytes)) }
            dt { "log sync latency" } dd data-fact="sync_latency" { (rate_now.sync_micros.map_or_else(|| "—".to_string(), |us| format!("{us:.0} µs"))) }
            dt { "commits per second" } dd data-fact="commits_per_second" { (rate(rate_now.commits_per_second)) }
        }
    }
}

/// `POST /queues`: creates a queue (admin on its name).
pub(crate) async fn create_queue(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    form: Posted,
) -> Response {
    let name = form.text("name").to_string();
    let q = HashMap::new();
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        let mut input = QueueConfigInput {
            kind: Some(if form.text("kind") == "fifo" {
                QueueKind::Fifo
            } else {
                QueueKind::Standard
            }),
            ..QueueConfigInput::default()
        };
        let dlq = form.text("dead_letter_queue");
        if !dlq.is_empty() {
            let max = match form.text("max_deliveries") {
                "" => 0,
                m => m.parse::<u32>().map_err(|_| {
                    Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!("max deliveries: {m:?} is not a whole number"),
                    )
                })?,
            };
            input.dead_letter = Some(DeadLetterInput::new(dlq, max));
        }
        let (_, created) = c.broker.create_queue(&name, &input).await?;
        s.audit_done("queue.create", &name, "");
        Ok::<_, Failure>(created)
    };
    let (flash, status) = match done.await {
        Ok(true) => (Flash::ok(format!("queue {name} created")), StatusCode::OK),
        Ok(false) => (
            Flash::ok(format!("queue {name} exists already, as asked")),
            StatusCode::OK,
        ),
        Err(f) => (Flash::error(f.text), f.status),
    };
    tokio::task::spawn_blocking(move || render(&c, &s, &q, Some(flash), status))
        .await
        .unwrap_or_else(|e| {
            Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        })
}
