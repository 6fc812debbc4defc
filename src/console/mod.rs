//! The web console: queues, their messages and dead letters, FIFO groups,
//! exchanges and definitions, in a browser, served by the `letterbox`
//! binary itself (`--console-listen`, on by default on loopback).
//!
//! Pages are HTML rendered on the server (maud); the browser gets two
//! small vendored libraries, embedded in the binary with everything else
//! (`assets/`): htmx for the parts that refresh themselves (a redrive's
//! progress) and uPlot for the depth and rate plots, plus `app.js` (the
//! plots, the file picker of the import). No CDN, no build step.
//!
//! Like the Anypoint facade, handlers are thin: parse, check the grants,
//! call [`Broker`], render. Every action is checked against the same
//! grants as gRPC ([`Principal::allows`]) and audited like them.
//!
//! Security (`session.rs`): with principals configured, a login page
//! takes a token or a client id and secret and opens a session (cookie
//! `letterbox_session`: `HttpOnly`, `SameSite=Strict`, `Secure` under
//! TLS); without principals every visitor is the anonymous principal, and
//! the console, like gRPC, is served on loopback only (`config.rs`
//! refuses anything else). Every state-changing request is a POST that
//! carries the session's CSRF token; a request from another origin is
//! refused; every page is sent with a strict Content-Security-Policy.
//!
//! The plots read an in-memory ring of samples (`history.rs`) taken every
//! few seconds from the same exact figures the API answers
//! ([`Broker::all_stats`]): one pass under the engine's lock per sample,
//! whatever the number of open pages.

mod assets;
mod definitions;
mod dlq;
mod exchanges;
mod history;
mod jobs;
mod layout;
mod move_tasks;
mod overview;
mod queue;
mod session;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth::{Action, Authenticator, Principal};
use crate::edge::audit;
use crate::edge::http::{GatedListener, Peer};
use crate::queue::Broker;

pub(crate) use session::Session;

/// Settings of the console.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// Time between two samples of the plots' history.
    pub sample_every: Duration,
    /// Served over TLS (cookies are then `Secure`).
    pub tls: bool,
}

impl Default for ConsoleOptions {
    fn default() -> Self {
        ConsoleOptions {
            sample_every: Duration::from_secs(5),
            tls: false,
        }
    }
}

/// What every handler works with.
pub(crate) struct Console {
    broker: Arc<Broker>,
    auth: Arc<Authenticator>,
    sessions: session::Sessions,
    logins: session::LoginThrottle,
    history: history::History,
    jobs: jobs::Jobs,
    started: Instant,
    opts: ConsoleOptions,
}

type Shared = Arc<Console>;

impl Console {
    fn now(&self) -> u64 {
        self.broker.clock().now_ms()
    }
}

/// A page or an answer to an action, with a flash line for the outcome.
pub(crate) struct Flash {
    ok: bool,
    text: String,
}

impl Flash {
    fn ok(text: impl Into<String>) -> Flash {
        Flash {
            ok: true,
            text: text.into(),
        }
    }
    fn error(text: impl Into<String>) -> Flash {
        Flash {
            ok: false,
            text: text.into(),
        }
    }
}

/// Why a request was refused or failed: a status and a sentence.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    text: String,
}

impl Failure {
    fn new(status: StatusCode, text: impl Into<String>) -> Failure {
        Failure {
            status,
            text: text.into(),
        }
    }
}

impl From<crate::queue::QueueError> for Failure {
    fn from(e: crate::queue::QueueError) -> Failure {
        Failure::new(crate::edge::status::http_status(&e), e.to_string())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let page = layout::error_page(self.status, &self.text);
        (self.status, page).into_response()
    }
}

/// Checks a grant of the session's principal; a refusal is audited and
/// answered 403, naming the principal, the action and the name.
fn allow(c: &Console, s: &Session, action: Action, name: &str) -> Result<(), Failure> {
    match s.principal.check(action, name) {
        Ok(()) => Ok(()),
        Err(e) => {
            audit::refused(
                s.who(),
                &format!("console.{}", action.name()),
                name,
                &e.to_string(),
            );
            let _ = c;
            Err(Failure::new(StatusCode::FORBIDDEN, e.to_string()))
        }
    }
}

/// A POSTed form whose CSRF token matched the session's: its fields in
/// order.
pub(crate) struct Posted(Vec<(String, String)>);

impl Posted {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    fn text(&self, key: &str) -> &str {
        self.get(key).unwrap_or("").trim()
    }
    fn all(&self, key: &str) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Largest form accepted (a test message of the default largest size,
/// URL-encoded, and a definitions document).
const MAX_FORM: usize = 8 << 20;

impl<S: Send + Sync> FromRequest<S> for Posted {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Self::Rejection> {
        let session = req.extensions().get::<Arc<Session>>().cloned();
        let header_token = req
            .headers()
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = axum::body::to_bytes(req.into_body(), MAX_FORM)
            .await
            .map_err(|e| {
                Failure::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("reading the form: {e} (at most {} MiB)", MAX_FORM >> 20),
                )
                .into_response()
            })?;
        let fields: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
        let sent = fields
            .iter()
            .find(|(k, _)| k == "csrf")
            .map(|(_, v)| v.clone())
            .or(header_token);
        let Some(session) = session else {
            return Err(csrf_refused());
        };
        match sent {
            Some(t) if session.csrf_matches(&t) => Ok(Posted(fields)),
            _ => Err(csrf_refused()),
        }
    }
}

fn csrf_refused() -> Response {
    Failure::new(
        StatusCode::FORBIDDEN,
        "the form's CSRF token is missing or not this session's: reload the page and try again",
    )
    .into_response()
}

/// Builds the console's routes.
fn router(console: Shared) -> Router {
    Router::new()
        .route("/", get(overview::page))
        .route("/queues", post(overview::create_queue))
        .route("/queues/{name}", get(queue::page))
        .route("/queues/{name}/history.json", get(queue::history_json))
        .route("/queues/{name}/publish", post(queue::publish))
        .route("/queues/{name}/purge", post(queue::purge))
        .route("/queues/{name}/config", post(queue::update_config))
        .route("/queues/{name}/delete", post(queue::delete))
        .route("/queues/{name}/messages/{pos}", get(queue::message))
        .route("/queues/{name}/groups", get(queue::groups))
        .route("/queues/{name}/groups/release", post(queue::release_group))
        .route("/queues/{name}/groups/skip", post(queue::skip_head))
        .route("/queues/{name}/dead-letters", get(dlq::page))
        .route("/queues/{name}/redrive", post(dlq::redrive))
        .route("/queues/{name}/move-tasks/{id}", get(move_tasks::page))
        .route(
            "/queues/{name}/move-tasks/{id}/progress",
            get(move_tasks::progress_part),
        )
        .route(
            "/queues/{name}/move-tasks/{id}/cancel",
            post(move_tasks::cancel),
        )
        .route("/jobs/{id}", get(dlq::job))
        .route("/jobs/{id}/progress", get(dlq::job_progress))
        .route("/jobs/{id}/cancel", post(dlq::cancel))
        .route("/exchanges", get(exchanges::page).post(exchanges::create))
        .route("/exchanges/{name}/bind", post(exchanges::bind))
        .route("/exchanges/{name}/unbind", post(exchanges::unbind))
        .route("/exchanges/{name}/delete", post(exchanges::delete))
        .route("/definitions", get(definitions::page))
        .route("/definitions/export", get(definitions::export))
        .route("/definitions/import", post(definitions::import))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", post(session::logout))
        .route("/assets/{file}", get(assets::serve))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&console),
            guard,
        ))
        .with_state(console)
}

/// The headers every answer carries: a strict Content-Security-Policy (no
/// inline script or style, nothing from elsewhere), no framing, no
/// sniffing, no referrer.
fn secure_headers(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// Every request: the session (opened for anonymous visitors when
/// authentication is off; required otherwise, except for the login page
/// and the assets), the same-origin rule for POSTs, the security headers.
async fn guard(
    State(c): State<Shared>,
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path().to_string();
    let public = path == "/login" || path.starts_with("/assets/");
    if !c.auth.is_enabled() && !loopback_host(req.headers()) {
        // Without principals the console serves loopback only; a page of
        // another site whose name was made to resolve to this machine (DNS
        // rebinding) names its own host, and gets nothing.
        let mut r = Failure::new(
            StatusCode::FORBIDDEN,
            "without principals the console answers only to a loopback host name (localhost, 127.0.0.1, [::1])",
        )
        .into_response();
        secure_headers(r.headers_mut());
        return r;
    }
    if req.method() == Method::POST && !same_origin(req.headers()) {
        let mut r = Failure::new(
            StatusCode::FORBIDDEN,
            "the request comes from another site (its Origin is not this console's)",
        )
        .into_response();
        secure_headers(r.headers_mut());
        return r;
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map(|p| p.0.0);
    let now = c.now();
    let mut set_cookie = None;
    let session = match session::cookie(req.headers()).and_then(|t| c.sessions.get(t, now)) {
        Some(s) => Some(s),
        None if !c.auth.is_enabled() => {
            let (token, s) = c.sessions.open(Principal::anonymous(), peer, false, now);
            set_cookie = Some(session::set_cookie(&token, c.opts.tls));
            Some(s)
        }
        None => None,
    };
    let mut resp = match session {
        Some(s) => {
            req.extensions_mut().insert(s);
            next.run(req).await
        }
        None if public => next.run(req).await,
        None if req.method() == Method::GET => {
            let to = format!(
                "/login?next={}",
                form_urlencoded::byte_serialize(path.as_bytes()).collect::<String>()
            );
            (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
        }
        None => Failure::new(
            StatusCode::UNAUTHORIZED,
            "log in first: this console needs credentials (a token, or a client id and secret)",
        )
        .into_response(),
    };
    if let Some(cookie) = set_cookie
        && let Ok(v) = HeaderValue::from_str(&cookie)
    {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    let h = resp.headers_mut();
    secure_headers(h);
    if !path.starts_with("/assets/") {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// True unless the request names an origin other than the host it was
/// sent to (browsers send `Origin` with every cross-site POST). An opaque
/// `Origin: null` passes only when the browser says the request is
/// same-origin (`Sec-Fetch-Site`).
fn same_origin(h: &HeaderMap) -> bool {
    let Some(origin) = h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if origin == "null" {
        return h
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() == b"same-origin");
    }
    let Some(host) = h.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    origin
        .split_once("://")
        .is_some_and(|(_, rest)| rest.trim_end_matches('/') == host)
}

/// True when the request's `Host` is a loopback name or address (with
/// any port).
fn loopback_host(h: &HeaderMap) -> bool {
    let Some(host) = h.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Serves the console over `shared`'s engine on `listener` until
/// `shutdown` resolves; the sampler of the plots' history runs meanwhile.
pub(crate) fn serve(
    listener: GatedListener,
    shared: &crate::edge::Shared,
    opts: ConsoleOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (broker, auth) = (Arc::clone(&shared.broker), Arc::clone(&shared.auth));
    async move {
        let console = Arc::new(Console {
            history: history::History::new(opts.sample_every),
            sessions: session::Sessions::new(),
            logins: session::login_throttle(),
            jobs: jobs::Jobs::new(),
            started: Instant::now(),
            broker,
            auth,
            opts,
        });
        let (stop_sampler, sampler_stopped) = tokio::sync::oneshot::channel::<()>();
        let sampler = tokio::spawn(history::sample(Arc::clone(&console), sampler_stopped));
        crate::edge::http::serve(listener, router(console), shutdown).await;
        let _ = stop_sampler.send(());
        let _ = sampler.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(h: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(header::HOST, HeaderValue::from_str(h).expect("header"));
        m
    }

    #[test]
    fn only_loopback_host_names_pass_without_principals() {
        for ok in [
            "localhost",
            "localhost:8025",
            "127.0.0.1:8025",
            "127.0.0.2",
            "[::1]:8025",
            "LOCALHOST",
        ] {
            assert!(loopback_host(&host(ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8025",
            "10.0.0.1:8025",
            "localhost.evil.example",
            "[::2]:1",
        ] {
            assert!(!loopback_host(&host(bad)), "{bad}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }

    #[test]
    fn an_opaque_origin_passes_only_from_the_same_origin() {
        let mut h = host("127.0.0.1:8025");
        assert!(same_origin(&h), "no Origin: not a cross-site browser POST");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8025"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_origin(&h));
    }
}
