//! SQS message move tasks of a dead letter queue (`crate::edge::move_tasks`:
//! Letterbox redrives started with `StartMessageMoveTask`, kept with the
//! queue): listed on its dead-letter page, each with its progress on a
//! page of its own that refreshes itself while the task runs, and a Stop
//! button (the same cancel as `CancelMessageMoveTask`).

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use super::layout::{self, csrf, time};
use super::{Failure, Posted, Session, Shared, allow};
use crate::auth::Action;
use crate::edge::move_tasks::{self as tasks, CancelRefused, Status, Task};

/// Where the task's messages go, as said to the user.
fn to(t: &Task) -> String {
    t.destination
        .clone()
        .unwrap_or_else(|| "each message's source queue".into())
}

/// The dead-letter page's table of the queue's move tasks (nothing when
/// it has none).
pub(crate) fn section(c: &Shared, name: &str) -> Markup {
    let Ok(list) = tasks::of(&c.broker, name) else {
        return html! {};
    };
    if list.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Message move tasks" }
        table #move-tasks {
            thead { tr { th { "task" } th { "state" } th { "to" } th.num { "moved" } th.num { "to move" } th.num { "rate" } th { "started" } } }
            tbody {
                @for t in &list {
                    tr data-task=(t.id) data-state=(t.status.name()) {
                        td { a href=(format!("/queues/{name}/move-tasks/{}", t.id)) { (t.id) } }
                        td { (t.status.name()) }
                        td { (to(t)) }
                        td.num { (t.moved) }
                        td.num { (t.to_move) }
                        td.num { @if let Some(r) = t.rate { (r) "/s" } @else { "—" } }
                        td { (time(t.started)) }
                    }
                }
            }
        }
    }
}

fn task_of(c: &Shared, s: &Session, name: &str, id: &str) -> Result<Task, Failure> {
    allow(c, s, Action::Admin, name)?;
    tasks::of(&c.broker, name)?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no move task {id:?} of queue {name:?} (the last {} are kept)",
                    tasks::KEPT
                ),
            )
        })
}

fn progress(s: &Session, name: &str, t: &Task) -> Markup {
    let active = t.status.active();
    html! {
        div #redrive-progress .progress data-state=(t.status.name()) data-moved=(t.moved)
            hx-get=[active.then(|| format!("/queues/{name}/move-tasks/{}/progress", t.id))]
            hx-trigger=[active.then_some("every 500ms")]
            hx-swap=[active.then_some("outerHTML")] {
            p { "State: " b { (t.status.name()) } }
            p { "Moved " b { (t.moved) } " of " (t.to_move) " that could move when it started." }
            @if let Some(why) = &t.failure { p.flash.error { (why) } }
            @if t.status == Status::Running {
                form.inline method="post" action=(format!("/queues/{name}/move-tasks/{}/cancel", t.id)) {
                    (csrf(s))
                    button #redrive-stop type="submit" { "Stop" }
                }
            }
            @if !active { p { a href=(format!("/queues/{name}/dead-letters")) { "Back to the dead letters of " (name) } } }
        }
    }
}

/// `GET /queues/{name}/move-tasks/{id}`.
pub(crate) async fn page(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    match task_of(&c, &s, &name, &id) {
        Ok(t) => layout::page(
            "Message move task",
            &s,
            None,
            html! {
                h1 { "Message move task from " (name) " to " (to(&t)) }
                p.muted { "Started over SQS " (time(t.started)) @if let Some(r) = t.rate { ", at most " (r) " messages a second" } "." }
                (progress(&s, &name, &t))
            },
        )
        .into_response(),
        Err(f) => f.into_response(),
    }
}

/// `GET /queues/{name}/move-tasks/{id}/progress`: the progress element
/// alone (for htmx).
pub(crate) async fn progress_part(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    match task_of(&c, &s, &name, &id) {
        Ok(t) => progress(&s, &name, &t).into_response(),
        Err(f) => f.into_response(),
    }
}

/// `POST /queues/{name}/move-tasks/{id}/cancel`.
pub(crate) async fn cancel(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path((name, id)): Path<(String, String)>,
    _form: Posted,
) -> Response {
    if let Err(f) = task_of(&c, &s, &name, &id) {
        return f.into_response();
    }
    match tasks::cancel(&c.broker, &name, &id).await {
        Ok(Ok(_)) => {
            s.audit_done("redrive.cancel", &name, &format!("move task {id}"));
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("/queues/{name}/move-tasks/{id}"))],
            )
                .into_response()
        }
        Ok(Err(CancelRefused::NotRunning(st))) => Failure::new(
            StatusCode::CONFLICT,
            format!("move task {id:?} is {}, not running", st.name()),
        )
        .into_response(),
        Ok(Err(CancelRefused::NoTask)) => {
            Failure::new(StatusCode::NOT_FOUND, format!("no move task {id:?}")).into_response()
        }
        Err(e) => Failure::from(e).into_response(),
    }
}
