//! Exchanges and their bindings, with each binding's filter (property
//! equalities): list, create, delete, bind, unbind.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout::{self, csrf, time};
use super::{Failure, Flash, Posted, Session, Shared, allow};
use crate::auth::Action;

/// `GET /exchanges`.
pub(crate) async fn page(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
) -> Response {
    render(&c, &s, None, StatusCode::OK)
}

fn render(c: &Shared, s: &Session, flash: Option<Flash>, status: StatusCode) -> Response {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        match c.broker.list_exchanges(1000, after.as_deref()) {
            Ok((page, next)) => {
                all.extend(page.into_iter().filter(|x| s.principal.sees(&x.name)));
                match next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            Err(e) => return Failure::from(e).into_response(),
        }
    }
    let body = html! {
        h1 { "Exchanges" }
        table #exchanges {
            thead { tr { th { "exchange" } th { "created" } th { "bound queue" } th { "filter" } th {} } }
            tbody {
                @for x in &all {
                    @let admin = s.principal.allows(Action::Admin, &x.name);
                    @if x.bindings.is_empty() {
                        tr data-exchange=(x.name) { td { b { (x.name) } } td { (time(x.created_at)) } td.muted colspan="2" { "no bindings" } td {} }
                    }
                    @for (i, (queue, filter)) in x.bindings.iter().enumerate() {
                        tr data-exchange=(x.name) data-binding=(queue) {
                            td { @if i == 0 { b { (x.name) } } }
                            td { @if i == 0 { (time(x.created_at)) } }
                            td { a href=(format!("/queues/{queue}")) { (queue) } }
                            td { @if filter.is_empty() { span.muted { "every message" } }
                                 @for (k, v) in filter { code { (k) "=" (v) } " " } }
                            td { @if admin {
                                form.inline method="post" action=(format!("/exchanges/{}/unbind", x.name)) {
                                    (csrf(s)) input type="hidden" name="queue" value=(queue);
                                    button type="submit" { "unbind" }
                                }
                            } }
                        }
                    }
                    @if admin {
                        tr.actions {
                            td colspan="5" {
                                form.row method="post" action=(format!("/exchanges/{}/bind", x.name)) {
                                    (csrf(s))
                                    label { "Bind queue" input type="text" name="queue" required; }
                                    label { "Filter (key=value, comma-separated; empty: every message)" input type="text" name="filter"; }
                                    button type="submit" { "bind to " (x.name) }
                                }
                                form.inline method="post" action=(format!("/exchanges/{}/delete", x.name)) {
                                    (csrf(s))
                                    button.danger type="submit" { "delete " (x.name) }
                                }
                            }
                        }
                    }
                }
                @if all.is_empty() { tr { td colspan="5" .muted { "No exchanges." } } }
            }
        }
        h2 { "Create an exchange" }
        form #create-exchange .row method="post" action="/exchanges" {
            (csrf(s))
            label { "Name" input type="text" name="name" required; }
            button.primary type="submit" { "Create" }
        }
    };
    (status, layout::page("Exchanges", s, flash.as_ref(), body)).into_response()
}

fn outcome(c: &Shared, s: &Session, done: Result<String, Failure>) -> Response {
    match done {
        Ok(t) => render(c, s, Some(Flash::ok(t)), StatusCode::OK),
        Err(f) => render(c, s, Some(Flash::error(f.text)), f.status),
    }
}

/// `POST /exchanges`: creates one.
pub(crate) async fn create(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    form: Posted,
) -> Response {
    let name = form.text("name").to_string();
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        let (_, created) = c.broker.create_exchange(&name).await?;
        s.audit_done("exchange.create", &name, "");
        Ok(if created {
            format!("exchange {name} created")
        } else {
            format!("exchange {name} exists already")
        })
    };
    outcome(&c, &s, done.await)
}

fn filter(text: &str) -> Result<Vec<(String, String)>, Failure> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!("filter: {p:?} is not key=value"),
                    )
                })
        })
        .collect()
}

/// `POST /exchanges/{name}/bind`.
pub(crate) async fn bind(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let queue = form.text("queue").to_string();
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        allow(&c, &s, Action::Admin, &queue)?;
        let f = filter(form.text("filter"))?;
        c.broker.bind(&name, &queue, f).await?;
        s.audit_done("exchange.bind", &name, &format!("queue={queue}"));
        Ok(format!("{queue} bound to {name}"))
    };
    outcome(&c, &s, done.await)
}

/// `POST /exchanges/{name}/unbind`.
pub(crate) async fn unbind(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    form: Posted,
) -> Response {
    let queue = form.text("queue").to_string();
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        allow(&c, &s, Action::Admin, &queue)?;
        c.broker.unbind(&name, &queue).await?;
        s.audit_done("exchange.unbind", &name, &format!("queue={queue}"));
        Ok(format!("{queue} unbound from {name}"))
    };
    outcome(&c, &s, done.await)
}

/// `POST /exchanges/{name}/delete`.
pub(crate) async fn delete(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    Path(name): Path<String>,
    _form: Posted,
) -> Response {
    let done = async {
        allow(&c, &s, Action::Admin, &name)?;
        c.broker.delete_exchange(&name).await?;
        s.audit_done("exchange.delete", &name, "");
        Ok(format!("exchange {name} deleted"))
    };
    outcome(&c, &s, done.await)
}
