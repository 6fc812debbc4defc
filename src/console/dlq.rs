//! A dead letter queue's page: its dead-letter records as a table (source
//! queue, reason, deliveries, last error, when), filtered by source,
//! reason, time window and text; a selection (ticked rows, or everything
//! matching the filter) is redriven after a dry-run preview that says how
//! many and where to, at an optional rate, with its progress on a page of
//! its own (`jobs.rs`). The queue's SQS message move tasks are listed
//! there too (`move_tasks.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::jobs::{Job, JobState};
use super::layout::{self, csrf, time};
use super::{Failure, Flash, Posted, Session, Shared, allow};
use crate::auth::Action;
use crate::queue::model::{BrowsedMessage, DeadLetterReason};
use crate::queue::redrive::{RedriveSink, RedriveSpec, RedriveStep};

/// Rows shown per page.
const ROWS: usize = 100;
/// Messages read per request while looking for matching rows.
const SCAN: usize = 5_000;
/// Queue names suggested as a redrive's target.
const TARGET_SUGGESTIONS: usize = 100;
/// Messages read at most to turn a text filter into a selection.
const SELECT_SCAN: usize = 100_000;

/// The filter of the table, from the query string or the form.
#[derive(Debug, Default, Clone)]
struct Filter {
    source: String,
    reason: String,
    since: String,
    until: String,
    text: String,
}

impl Filter {
    fn from(get: impl Fn(&str) -> Option<String>) -> Filter {
        let f = |k: &str| get(k).map(|v| v.trim().to_string()).unwrap_or_default();
        Filter {
            source: f("source"),
            reason: f("reason"),
            since: f("since"),
            until: f("until"),
            text: f("text"),
        }
    }

    fn is_empty(&self) -> bool {
        self.source.is_empty()
            && self.reason.is_empty()
            && self.since.is_empty()
            && self.until.is_empty()
            && self.text.is_empty()
    }

    /// The parsed bounds: (reason, since, until).
    fn parsed(&self, now: u64) -> Result<(Option<DeadLetterReason>, u64, u64), Failure> {
        let bad = |e: String| Failure::new(StatusCode::BAD_REQUEST, e);
        let reason = match self.reason.as_str() {
            "" => None,
            r => Some(
                DeadLetterReason::ALL
                    .into_iter()
                    .find(|x| x.name() == r)
                    .ok_or_else(|| bad(format!("reason: {r:?} is not one of max_deliveries, rejected, expired, skipped, corrupted")))?,
            ),
        };
        let instant = |field: &str, v: &str| -> Result<u64, Failure> {
            if v.is_empty() {
                Ok(0)
            } else {
                crate::units::parse_instant(v, now).map_err(|e| bad(format!("{field}: {e}")))
            }
        };
        Ok((
            reason,
            instant("since", &self.since)?,
            instant("until", &self.until)?,
        ))
    }

    /// True when the message's latest dead-letter record (and its text)
    /// match. The same rule as the engine's selection, plus the text.
    fn matches(
        &self,
        m: &BrowsedMessage,
        reason: Option<DeadLetterReason>,
        since: u64,
        until: u64,
    ) -> bool {
        let last = m.dead_letters.last();
        let any_bound = !self.source.is_empty() || reason.is_some() || since != 0 || until != 0;
        match last {
            None if any_bound => return false,
            None => {}
            Some(d) => {
                if !self.source.is_empty() && d.source_queue != self.source {
                    return false;
                }
                if reason.is_some_and(|r| r != d.reason) {
                    return false;
                }
                if since != 0 && d.at < since {
                    return false;
                }
                if until != 0 && d.at >= until {
                    return false;
                }
            }
        }
        if self.text.is_empty() {
            return true;
        }
        let needle = self.text.to_lowercase();
        let has = |s: &str| s.to_lowercase().contains(&needle);
        has(&m.message_id)
            || has(&String::from_utf8_lossy(&m.body))
            || m.properties.iter().any(|(k, v)| has(k) || has(v))
            || m.dead_letters
                .iter()
                .any(|d| has(&d.last_nack_reason) || has(&d.note))
            || m.attempts.iter().any(|a| has(&a.reason))
    }

    fn hidden(&self) -> Markup {
        html! {
            input type="hidden" name="source" value=(self.source);
            input type="hidden" name="reason" value=(self.reason);
            input type="hidden" name="since" value=(self.since);
            input type="hidden" name="until" value=(self.until);
            input type="hidden" name="text" value=(self.text);
        }
    }
}

/// The last error of a dead letter: its last nack reason, else the last
/// attempt's reason.
fn last_error(m: &BrowsedMessage) -> &str {
    m.dead_letters
        .last()
        .map(|d| d.last_nack_reason.as_str())
        .filter(|r| !r.is_empty())
        .or_else(|| m.attempts.last().map(|a| a.reason.as_str()))
        .unwrap_or("")
}

/// Reads the DLQ from after `after`, keeping matching messages, until
/// `rows` are found or `scan` were read; returns them and where to go on.
async fn scan(
    c: &Shared,
    dlq: &str,
    filter: &Filter,
    after: &str,
    rows: usize,
    scan: usize,
) -> Result<(Vec<BrowsedMessage>, Option<String>), Failure> {
    let (reason, since, until) = filter.parsed(c.now())?;
    let (b, name, f, mut token) = (
        Arc::clone(&c.broker),
        dlq.to_string(),
        filter.clone(),
        after.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let mut found = Vec::new();
        let mut read = 0usize;
        loop {
            let page = b.browse(&name, 500, &token)?;
            read += page.messages.len();
            for m in page.messages {
                let pos = m.position;
                if f.matches(&m, reason, since, until) {
                    found.push(m);
                    if found.len() == rows {
                        return Ok((found, Some(pos.to_string())));
                    }
                }
            }
            match page.next {
                Some(n) if read < scan => token = n,
                next => return Ok((found, next)),
            }
        }
    })
    .await
    .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e: crate::queue::QueueError| Failure::from(e))
}

/// `GET /queues/{name}/dead-letters`.
pub(crate) async fn page(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let filter = Filter::from(|k| q.get(k).cloned());
    let after = q.get("after").cloned().unwrap_or_default();
    match render(&c, &s, &name, &filter, &after).await {
        Ok(body) => {
            layout::page(&format!("Dead letters of {name}"), &s, None, body).into_response()
        }
        Err(f) => {
            let page = layout::page(
                &format!("Dead letters of {name}"),
                &s,
                Some(&Flash::error(f.text.clone())),
                html! { p { a href=(format!("/queues/{name}/dead-letters")) { "Clear the filter" } } },
            );
            (f.status, page).into_response()
        }
    }
}

async fn render(
    c: &Shared,
    s: &Session,
    name: &str,
    filter: &Filter,
    after: &str,
) -> Result<Markup, Failure> {
    allow(c, s, Action::Consume, name)?;
    let info = c.broker.get_queue(name)?;
    let (rows, next) = scan(c, name, filter, after, ROWS, SCAN).await?;
    // Suggestions for the target (any queue of the same kind may be
    // typed; the engine checks it): the queues that dead-letter here
    // first, then others, at most TARGET_SUGGESTIONS.
    let mut targets: Vec<String> = info.dead_letter_sources.clone();
    if let Ok((qs, _)) = c.broker.list_queues("", 1000, None) {
        targets.extend(
            qs.into_iter()
                .filter(|q| q.name != name && q.config.kind == info.config.kind)
                .map(|q| q.name)
                .filter(|n| !info.dead_letter_sources.contains(n)),
        );
    }
    targets.truncate(TARGET_SUGGESTIONS);
    let next_link = |n: &str| {
        let mut u = form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("source", &filter.source),
            ("reason", &filter.reason),
            ("since", &filter.since),
            ("until", &filter.until),
            ("text", &filter.text),
        ] {
            if !v.is_empty() {
                u.append_pair(k, v);
            }
        }
        u.append_pair("after", n);
        format!("/queues/{name}/dead-letters?{}", u.finish())
    };
    let admin = s.principal.allows(Action::Admin, name);
    Ok(html! {
        h1 { "Dead letters of " (name) }
        p.tabs {
            a href=(format!("/queues/{name}")) { "Overview" }
            a.on href=(format!("/queues/{name}/dead-letters")) { "Dead letters" }
        }
        p.muted {
            "Dead letter queue of: "
            @if info.dead_letter_sources.is_empty() { "no queue now" }
            @for (i, src) in info.dead_letter_sources.iter().enumerate() {
                @if i > 0 { ", " }
                a href=(format!("/queues/{src}")) { (src) }
            }
        }
        (super::move_tasks::section(c, name))
        form #dlq-filter .row method="get" action=(format!("/queues/{name}/dead-letters")) {
            label { "Source queue" input type="text" name="source" value=(filter.source) list="dlq-sources"; }
            datalist #dlq-sources { @for src in &info.dead_letter_sources { option value=(src) {} } }
            label { "Reason" select name="reason" {
                option value="" { "any" }
                @for r in DeadLetterReason::ALL { option value=(r.name()) selected[filter.reason == r.name()] { (r.name()) } }
            } }
            label { "Since (e.g. -1h, 2026-12-05T10:00:00Z)" input type="text" name="since" value=(filter.since); }
            label { "Until" input type="text" name="until" value=(filter.until); }
            label { "Text (id, body, properties, errors)" input type="search" name="text" value=(filter.text); }
            button type="submit" { "Filter" }
            @if !filter.is_empty() { a href=(format!("/queues/{name}/dead-letters")) { "clear" } }
        }
        form #redrive method="post" action=(format!("/queues/{name}/redrive")) {
            (csrf(s))
            (filter.hidden())
            table #dead-letters {
                thead { tr {
                    th { input #select-page type="checkbox" title="select the rows of this page"; }
                    th { "message id" } th { "source" } th { "reason" } th.num { "deliveries" }
                    th.num { "failed" } th { "last error" } th { "dead-lettered at" } th { "body" }
                } }
                tbody {
                    @for m in &rows {
                        @let d = m.dead_letters.last();
                        tr data-message-id=(m.message_id) {
                            td { input type="checkbox" name="id" value=(m.message_id); }
                            td { a href=(format!("/queues/{name}/messages/{}", m.position)) { (m.message_id) } }
                            td data-col="source" { (d.map_or("", |d| d.source_queue.as_str())) }
                            td data-col="reason" { (d.map_or("", |d| d.reason.name())) }
                            td.num data-col="deliveries" { (d.map_or(m.delivery_count, |d| d.delivery_count)) }
                            td.num data-col="failed_attempts" { (d.map_or(m.failed_attempts, |d| d.failed_attempts)) }
                            td data-col="last_error" { (last_error(m)) }
                            td data-col="dead_lettered_at" { (d.map_or_else(String::new, |d| time(d.at))) }
                            td.muted { (layout::preview(&m.body)) }
                        }
                    }
                    @if rows.is_empty() { tr { td colspan="9" .muted { @if filter.is_empty() { "No dead letters." } @else { "No dead letter matches the filter." } } } }
                }
            }
            @if let Some(n) = &next { p.pager { a #next-page href=(next_link(n)) { "more →" } } }
            @if admin {
                fieldset #redrive-options {
                    legend { "Redrive" }
                    div.row {
                        label.check { span { "Every message matching the filter, not only the ticked ones" } input #all-matching type="checkbox" name="all" value="1"; }
                        label { "To (empty: back to each message's source queue)"
                            input type="text" name="target" list="redrive-targets" placeholder="its source queue";
                        }
                        datalist #redrive-targets { @for t in &targets { option value=(t) {} } }
                        label { "Rate (messages/s, 0: as fast as it goes)" input type="number" name="rate" min="0" value="0"; }
                        button #redrive-preview .primary type="submit" name="mode" value="preview" { "Preview" }
                    }
                }
            }
        }
    })
}

/// What a redrive request selects, made into the engine's spec.
struct Selection {
    spec: RedriveSpec,
    rate: u32,
    /// The form's fields, to post again from the preview.
    fields: Vec<(String, String)>,
}

async fn selection(c: &Shared, dlq: &str, form: &Posted) -> Result<Selection, Failure> {
    let filter = Filter::from(|k| form.get(k).map(str::to_string));
    let all = form.text("all") == "1";
    let ids: Vec<String> = form.all("id").map(str::to_string).collect();
    let target = form.text("target").to_string();
    let rate = match form.text("rate") {
        "" => 0,
        r => r.parse::<u32>().map_err(|_| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("rate: {r:?} is not a whole number of messages per second"),
            )
        })?,
    };
    let mut spec = RedriveSpec {
        dlq: dlq.to_string(),
        target: (!target.is_empty()).then_some(target),
        ..RedriveSpec::default()
    };
    if all {
        let (reason, since, until) = filter.parsed(c.now())?;
        spec.source_queue = (!filter.source.is_empty()).then(|| filter.source.clone());
        spec.reasons = reason.into_iter().collect();
        spec.since = since;
        spec.until = until;
        if !filter.text.is_empty() {
            // The engine selects by record, not by text: the text filter
            // becomes the list of the messages it matches.
            let (found, more) = scan(c, dlq, &filter, "", SELECT_SCAN, SELECT_SCAN).await?;
            if more.is_some() {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the text filter matches more than {SELECT_SCAN} messages; narrow it with the source, reason or time filters"
                    ),
                ));
            }
            if found.is_empty() {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    "no message matches the filter",
                ));
            }
            spec.message_ids = found.into_iter().map(|m| m.message_id).collect();
        }
    } else {
        if ids.is_empty() {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "nothing selected: tick messages, or choose every message matching the filter",
            ));
        }
        spec.message_ids = ids;
    }
    let fields = form
        .0
        .iter()
        .filter(|(k, _)| k != "csrf" && k != "mode")
        .cloned()
        .collect();
    Ok(Selection { spec, rate, fields })
}

/// A sink that only counts (the dry run's).
struct Quiet;

impl RedriveSink for Quiet {
    async fn progress(&mut self, _: &RedriveStep) -> bool {
        true
    }
}

/// Rows of the preview's sample of the selection.
const SAMPLE: usize = 20;

/// A selected message, as the preview lists it.
struct Picked {
    id: String,
    position: u64,
    source: String,
    reason: &'static str,
    deliveries: u32,
    failed_attempts: u32,
    last_error: String,
}

/// Where the selected messages would go (the target, or each message's
/// source, counted), and the first [`SAMPLE`] of them, read from the
/// DLQ's first [`SELECT_SCAN`] messages.
async fn destinations(c: &Shared, spec: &RedriveSpec) -> Result<(String, Vec<Picked>), Failure> {
    let (b, name, s) = (Arc::clone(&c.broker), spec.dlq.clone(), spec.clone());
    let (counts, sample) = tokio::task::spawn_blocking(move || {
        let mut sample: Vec<Picked> = Vec::new();
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut token = String::new();
        let mut read = 0;
        loop {
            let page = b.browse(&name, 500, &token)?;
            read += page.messages.len();
            for m in &page.messages {
                let Some(d) = m.dead_letters.last() else {
                    continue;
                };
                let picked = (s.message_ids.is_empty() || s.message_ids.contains(&m.message_id))
                    && s.source_queue.as_ref().is_none_or(|q| *q == d.source_queue)
                    && (s.reasons.is_empty() || s.reasons.contains(&d.reason))
                    && (s.since == 0 || d.at >= s.since)
                    && (s.until == 0 || d.at < s.until);
                if picked {
                    *counts.entry(d.source_queue.clone()).or_default() += 1;
                    if sample.len() < SAMPLE {
                        sample.push(Picked {
                            id: m.message_id.clone(),
                            position: m.position,
                            source: d.source_queue.clone(),
                            reason: d.reason.name(),
                            deliveries: d.delivery_count,
                            failed_attempts: d.failed_attempts,
                            last_error: last_error(m).to_string(),
                        });
                    }
                }
            }
            match page.next {
                Some(n) if read < SELECT_SCAN => token = n,
                _ => return Ok::<_, crate::queue::QueueError>((counts, sample)),
            }
        }
    })
    .await
    .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let to = match &spec.target {
        Some(t) => t.clone(),
        None if counts.is_empty() => "their source queues".into(),
        None => counts
            .iter()
            .map(|(q, n)| format!("{q} ({n})"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    Ok((to, sample))
}

/// `POST /queues/{name}/redrive`: `mode=preview` answers the dry run's
/// plan with a form to confirm it; `mode=run` starts the redrive and
/// sends the browser to its progress.
pub(crate) async fn redrive(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    match redrive_inner(&c, &s, &name, &form).await {
        Ok(r) => r,
        Err(f) => {
            let page = layout::page(
                "Redrive",
                &s,
                Some(&Flash::error(f.text.clone())),
                html! { p { a href=(format!("/queues/{name}/dead-letters")) { "Back to the dead letters of " (name) } } },
            );
            (f.status, page).into_response()
        }
    }
}

async fn redrive_inner(
    c: &Shared,
    s: &Session,
    name: &str,
    form: &Posted,
) -> Result<Response, Failure> {
    allow(c, s, Action::Admin, name)?;
    let sel = selection(c, name, form).await?;
    match &sel.spec.target {
        Some(t) => allow(c, s, Action::Publish, t)?,
        None => {
            for src in c.broker.get_queue(name)?.dead_letter_sources {
                allow(c, s, Action::Publish, &src)?;
            }
        }
    }
    let (to, sample) = destinations(c, &sel.spec).await?;
    if form.text("mode") == "run" {
        let end = c.broker.start_redrive(&sel.spec)?;
        s.audit_done(
            "redrive.start",
            name,
            &format!(
                "target={} dry_run=false limit=0 rate={}",
                sel.spec.target.as_deref().unwrap_or("(sources)"),
                sel.rate
            ),
        );
        let (who, peer) = (s.principal.name().to_string(), s.peer);
        let job = c.jobs.start(
            Arc::clone(&c.broker),
            sel.spec,
            end,
            sel.rate,
            to,
            c.now(),
            move |spec, total, ended| {
                crate::edge::audit::done(
                    crate::edge::audit::Who {
                        principal: &who,
                        peer,
                    },
                    "redrive.end",
                    &spec.dlq,
                    &crate::edge::audit::redrive_end(spec, total, ended),
                );
            },
        );
        return Ok((
            StatusCode::SEE_OTHER,
            [(header::LOCATION, format!("/jobs/{}", job.id))],
        )
            .into_response());
    }
    let mut dry = sel.spec.clone();
    dry.dry_run = true;
    let end = c.broker.start_redrive(&dry)?;
    let (total, ended) = c.broker.run_redrive(&dry, end, 0, 0, &mut Quiet).await;
    if let crate::queue::redrive::RedriveEnd::Failed(e) = ended {
        return Err(e.into());
    }
    let movable = total.matched - total.skipped;
    let body = html! {
        h1 { "Redrive from " (name) ": preview" }
        div #redrive-plan .progress data-count=(movable) data-skipped=(total.skipped) {
            p { b { (movable) } " message" @if movable != 1 { "s" } " will move to " b { (to) } "." }
            @if total.skipped > 0 {
                p.muted { (total.skipped) " matching message" @if total.skipped != 1 { "s" } " will stay: "
                    (total.skipped_leased) " leased by a consumer, "
                    (total.skipped_no_source) " never dead-lettered (choose a target), "
                    (total.skipped_no_target) " whose queue is gone, "
                    (total.skipped_other_kind) " whose queue is of the other kind." }
            }
            @if sel.rate > 0 { p { "At most " (sel.rate) " messages a second." } }
        }
        @if !sample.is_empty() {
            h2 { "The selection" @if movable > sample.len() as u64 { " (the first " (sample.len()) ")" } }
            table #redrive-sample {
                thead { tr { th { "message id" } th { "source" } th { "reason" } th.num { "deliveries" } th.num { "failed" } th { "last error" } } }
                tbody {
                    @for p in &sample {
                        tr data-message-id=(p.id) {
                            td { a href=(format!("/queues/{name}/messages/{}", p.position)) { (p.id) } }
                            td { (p.source) } td { (p.reason) } td.num { (p.deliveries) } td.num { (p.failed_attempts) } td { (p.last_error) }
                        }
                    }
                }
            }
        }
        form #redrive-run method="post" action=(format!("/queues/{name}/redrive")) {
            (csrf(s))
            @for (k, v) in &sel.fields { input type="hidden" name=(k) value=(v); }
            button #redrive-confirm .primary type="submit" name="mode" value="run" disabled[movable == 0] { "Redrive " (movable) " message" @if movable != 1 { "s" } }
            " "
            a href=(format!("/queues/{name}/dead-letters")) { "cancel" }
        }
    };
    Ok(layout::page("Redrive preview", s, None, body).into_response())
}

fn progress(s: &Session, job: &Job) -> Markup {
    let (t, state) = job.progress();
    let running = matches!(state, JobState::Running);
    html! {
        div #redrive-progress .progress data-state=(state.name()) data-moved=(t.moved)
            hx-get=[running.then(|| format!("/jobs/{}/progress", job.id))]
            hx-trigger=[running.then_some("every 500ms")]
            hx-swap=[running.then_some("outerHTML")] {
            p { "State: " b { (state.name()) } }
            p { "Moved " b { (t.moved) } " of " (t.matched) " matching (" (t.scanned) " looked at, " (t.skipped) " left in place)." }
            @if let JobState::Failed(why) = &state { p.flash.error { (why) } }
            @if running {
                form.inline method="post" action=(format!("/jobs/{}/cancel", job.id)) {
                    (csrf(s))
                    button #redrive-stop type="submit" { "Stop" }
                }
            }
            @if !running { p { a href=(format!("/queues/{}/dead-letters", job.dlq)) { "Back to the dead letters of " (job.dlq) } } }
        }
    }
}

fn job_of(c: &Shared, s: &Session, id: &str) -> Result<Arc<Job>, Failure> {
    let job = c.jobs.get(id).ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_FOUND,
            format!("no redrive {id:?} (the last 100 are kept)"),
        )
    })?;
    allow(c, s, Action::Admin, &job.dlq)?;
    Ok(job)
}

/// `GET /jobs/{id}`: a redrive's progress, refreshing itself until done.
pub(crate) async fn job(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(id): Path<String>,
) -> Response {
    match job_of(&c, &s, &id) {
        Ok(job) => layout::page(
            "Redrive",
            &s,
            None,
            html! {
                h1 { "Redrive from " (job.dlq) " to " (job.to) }
                p.muted { "Started " (time(job.started_at)) @if job.rate > 0 { ", at most " (job.rate) " messages a second" } "." }
                (progress(&s, &job))
            },
        )
        .into_response(),
        Err(f) => f.into_response(),
    }
}

/// `GET /jobs/{id}/progress`: the progress element alone (for htmx).
pub(crate) async fn job_progress(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(id): Path<String>,
) -> Response {
    match job_of(&c, &s, &id) {
        Ok(job) => progress(&s, &job).into_response(),
        Err(f) => f.into_response(),
    }
}

/// `POST /jobs/{id}/cancel`: stops a redrive after its current step.
pub(crate) async fn cancel(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(id): Path<String>,
    _form: Posted,
) -> Response {
    match job_of(&c, &s, &id) {
        Ok(job) => {
            job.cancel();
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("/jobs/{}", job.id))],
            )
                .into_response()
        }
        Err(f) => f.into_response(),
    }
}
