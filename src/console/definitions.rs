//! Definitions (queues, exchanges, bindings as JSON): export as a
//! download, import from a file or pasted text, with the validation
//! errors shown. Both need the admin grant on every name (`*`), as over
//! gRPC.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout::{self, csrf};
use super::{Failure, Flash, Posted, Session, Shared};
use crate::auth::Action;

fn admin_all(s: &Session, what: &str) -> Result<(), Failure> {
    if s.principal.allows_all(Action::Admin) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "principal {:?} needs admin on \"*\" to {what} definitions",
                s.principal.name()
            ),
        ))
    }
}

/// `GET /definitions`.
pub(crate) async fn page(Extension(s): Extension<Arc<Session>>) -> Response {
    render(&s, None, "", StatusCode::OK)
}

fn render(s: &Session, flash: Option<Flash>, text: &str, status: StatusCode) -> Response {
    let body = html! {
        h1 { "Definitions" }
        p { "Queues, exchanges and bindings as one JSON document: to keep in version control, or to set up another server the same way." }
        p { a #export href="/definitions/export" download="letterbox-definitions.json" { "Download the definitions" } }
        h2 { "Import" }
        p.muted { "Creates what is missing and updates bindings; an invalid document changes nothing." }
        form #import .box method="post" action="/definitions/import" {
            (csrf(s))
            label { "A file" input type="file" accept="application/json,.json" data-into="import-json"; }
            label { "Or the JSON" textarea #import-json name="json" rows="12" { (text) } }
            button.primary type="submit" { "Import" }
        }
    };
    (status, layout::page("Definitions", s, flash.as_ref(), body)).into_response()
}

/// `GET /definitions/export`: the JSON document, as a download.
pub(crate) async fn export(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
) -> Response {
    if let Err(f) = admin_all(&s, "export") {
        return f.into_response();
    }
    match serde_json::to_string_pretty(&c.broker.export_definitions()) {
        Ok(json) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"letterbox-definitions.json\"",
                ),
            ],
            json,
        )
            .into_response(),
        Err(e) => Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `POST /definitions/import`.
pub(crate) async fn import(
    State(c): State<Shared>,
    Extension(s): Extension<Arc<Session>>,
    form: Posted,
) -> Response {
    let json = form.get("json").unwrap_or("").to_string();
    let done = async {
        admin_all(&s, "import")?;
        if json.trim().is_empty() {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "nothing to import: choose a file or paste the JSON",
            ));
        }
        let r = c.broker.import_definitions_json(&json).await?;
        let detail = format!(
            "queues_created={} exchanges_created={} bindings_changed={}",
            r.queues_created, r.exchanges_created, r.bindings_changed
        );
        s.audit_done("definitions.import", "*", &detail);
        Ok(format!(
            "imported: {} queues created, {} exchanges created, {} bindings created or changed",
            r.queues_created, r.exchanges_created, r.bindings_changed
        ))
    };
    match done.await {
        Ok(t) => render(&s, Some(Flash::ok(t)), "", StatusCode::OK),
        // The text stays in the box, to be corrected.
        Err(f) => render(&s, Some(Flash::error(f.text)), &json, f.status),
    }
}
