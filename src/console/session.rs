//! Sessions of the console: a random token in an `HttpOnly`,
//! `SameSite=Strict` cookie (`Secure` under TLS) names a session, which
//! holds its principal and its CSRF token. With authentication off every
//! visitor gets an anonymous session on its first request; with it on, the
//! login page opens one for valid credentials (a bearer token, or a client
//! id and secret, checked by [`Authenticator`] off the async workers).
//! Sessions live in memory: an hour after their last use, twelve hours at
//! most, and until the server stops. An address whose last
//! [`MAX_FAILED_LOGINS`] logins within [`FAILED_LOGIN_WINDOW`] all failed
//! is refused (429, `Retry-After`) without its credentials being checked
//! until the oldest of them is that old ([`LoginThrottle`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::html;
use subtle::ConstantTimeEq;

use super::{Failure, Posted, Shared, layout};
use crate::auth::failures::Failures;
use crate::auth::{Credentials, Principal, hex_sha256, new_token};
use crate::edge::audit;
use crate::queue::model::{HOUR, MINUTE, SECOND};

/// The cookie's name.
pub(crate) const COOKIE: &str = "letterbox_session";
/// Idle lifetime.
const IDLE: u64 = HOUR;
/// Whole lifetime.
const LIFETIME: u64 = 12 * HOUR;
/// Most sessions kept (the oldest go first).
const MAX_SESSIONS: usize = 10_000;
/// Failed logins from one address that close the login to it...
pub(crate) const MAX_FAILED_LOGINS: usize = 5;
/// ...when they all fell within this time.
pub(crate) const FAILED_LOGIN_WINDOW: u64 = 5 * MINUTE;
/// Most addresses whose failed logins are remembered (those with none
/// within the window go first, then the longest quiet).
const MAX_TRACKED_ADDRESSES: usize = 10_000;

/// Failed console logins by address: brute force against a secret or a
/// token gets [`MAX_FAILED_LOGINS`] tries per [`FAILED_LOGIN_WINDOW`]
/// from one address, and costs no argon2 check beyond them. A successful
/// login forgets the address's failures. Behind a reverse proxy every
/// visitor has the proxy's address.
pub(crate) type LoginThrottle = Failures<IpAddr>;

/// The console's [`LoginThrottle`].
pub(crate) fn login_throttle() -> LoginThrottle {
    Failures::new(
        MAX_FAILED_LOGINS,
        FAILED_LOGIN_WINDOW,
        MAX_TRACKED_ADDRESSES,
    )
}

/// One session.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) principal: Arc<Principal>,
    pub(crate) peer: Option<SocketAddr>,
    /// Opened by a login (authentication on), not given to a visitor.
    pub(crate) logged_in: bool,
    csrf: String,
    opened: u64,
    last_used: Mutex<u64>,
}

impl Session {
    /// Its CSRF token, for the forms.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// True when `token` is this session's CSRF token.
    pub(crate) fn csrf_matches(&self, token: &str) -> bool {
        bool::from(self.csrf.as_bytes().ct_eq(token.as_bytes()))
    }

    /// Who acts, for the audit log.
    pub(crate) fn who(&self) -> audit::Who<'_> {
        audit::Who {
            principal: self.principal.name(),
            peer: self.peer,
        }
    }

    /// Audits an act done through this session; the detail says it came
    /// through the console.
    pub(crate) fn audit_done(&self, action: &str, name: &str, detail: &str) {
        let detail = if detail.is_empty() {
            "from the console".to_string()
        } else {
            format!("{detail} (from the console)")
        };
        audit::done(self.who(), action, name, &detail);
    }
}

/// The open sessions, by the SHA-256 of their cookie's token.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    pub(crate) fn new() -> Sessions {
        Sessions::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session; returns the cookie's token and the session.
    pub(crate) fn open(
        &self,
        principal: Arc<Principal>,
        peer: Option<SocketAddr>,
        logged_in: bool,
        now: u64,
    ) -> (String, Arc<Session>) {
        let (token, key) = new_token();
        let (csrf, _) = new_token();
        let s = Arc::new(Session {
            principal,
            peer,
            logged_in,
            csrf,
            opened: now,
            last_used: Mutex::new(now),
        });
        let mut open = self.lock();
        open.retain(|_, s| alive(s, now));
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open
                .iter()
                .min_by_key(|(_, s)| s.opened)
                .map(|(k, _)| k.clone())
        {
            open.remove(&oldest);
        }
        open.insert(key, Arc::clone(&s));
        (token, s)
    }

    /// The live session of a cookie's token, its last use set to `now`.
    pub(crate) fn get(&self, token: &str, now: u64) -> Option<Arc<Session>> {
        let key = hex_sha256(token.as_bytes());
        let mut open = self.lock();
        let s = open.get(&key)?;
        if !alive(s, now) {
            open.remove(&key);
            return None;
        }
        *s.last_used.lock().unwrap_or_else(|e| e.into_inner()) = now;
        Some(Arc::clone(s))
    }

    /// Ends the session of a cookie's token.
    pub(crate) fn close(&self, token: &str) {
        self.lock().remove(&hex_sha256(token.as_bytes()));
    }
}

fn alive(s: &Session, now: u64) -> bool {
    let last = *s.last_used.lock().unwrap_or_else(|e| e.into_inner());
    now.saturating_sub(last) < IDLE && now.saturating_sub(s.opened) < LIFETIME
}

/// The session token in a request's cookies.
pub(crate) fn cookie(h: &HeaderMap) -> Option<&str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v)
}

/// The `Set-Cookie` value of a new session.
pub(crate) fn set_cookie(token: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Where to go after logging in: a local path only.
fn local_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.contains('\\') => n.to_string(),
        _ => "/".to_string(),
    }
}

/// `GET /login`.
pub(crate) async fn login_page(
    State(c): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    login_form(&c, q.get("next").map(String::as_str), None, StatusCode::OK)
}

fn login_form(c: &Shared, next: Option<&str>, error: Option<&str>, status: StatusCode) -> Response {
    let next = local_next(next);
    let body = html! {
        h1 { "Log in" }
        @if !c.auth.is_enabled() {
            p { "Authentication is off on this server: no login is needed. "
                a href="/" { "Open the console." } }
        }
        @if let Some(e) = error {
            p #flash .flash.error { (e) }
        }
        form #login method="post" action="/login" {
            input type="hidden" name="next" value=(next);
            fieldset {
                legend { "With a token" }
                label { "Token " input type="password" name="token" autocomplete="off"; }
            }
            fieldset {
                legend { "Or with a client id and secret" }
                label { "Client id " input type="text" name="client_id" autocomplete="username"; }
                label { "Secret " input type="password" name="secret" autocomplete="current-password"; }
            }
            button #login-submit type="submit" { "Log in" }
        }
    };
    (status, layout::bare("Log in", body)).into_response()
}

/// `POST /login`: the form needs no CSRF token (there is no session yet);
/// the same-origin rule of the guard applies.
pub(crate) async fn login(State(c): State<Shared>, req: axum::extract::Request) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<crate::edge::http::Peer>>()
        .map(|p| p.0.0);
    let body = match axum::body::to_bytes(req.into_body(), 64 << 10).await {
        Ok(b) => b,
        Err(e) => {
            return Failure::new(StatusCode::BAD_REQUEST, format!("reading the form: {e}"))
                .into_response();
        }
    };
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let field = |k: &str| form.get(k).map_or("", |v| v.trim()).to_string();
    let (token, id, secret, next) = (
        field("token"),
        field("client_id"),
        form.get("secret").cloned().unwrap_or_default(),
        field("next"),
    );
    let presented = if token.is_empty() {
        id.clone()
    } else {
        "(token)".into()
    };
    let refused = |why: &str| {
        audit::refused(
            audit::Who {
                principal: &presented,
                peer,
            },
            "console.login",
            "",
            why,
        );
    };
    let from = peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip());
    if let Some(ms) = c.logins.wait(&from, c.now()) {
        let secs = ms.div_ceil(SECOND);
        let why = format!(
            "too many failed logins from {from}: {MAX_FAILED_LOGINS} within {} minutes; try again in {secs} s",
            FAILED_LOGIN_WINDOW / MINUTE
        );
        refused(&why);
        let mut r = login_form(&c, Some(&next), Some(&why), StatusCode::TOO_MANY_REQUESTS);
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return r;
    }
    let creds = if !token.is_empty() {
        Credentials::Bearer(&token)
    } else if !id.is_empty() {
        Credentials::ClientSecret {
            id: &id,
            secret: &secret,
        }
    } else {
        Credentials::None
    };
    // argon2 takes tens of milliseconds: a secret not verified lately is
    // checked on the blocking pool, off the async workers.
    let checked = c
        .auth
        .authenticate_async(creds, None, peer.map(|p| p.ip()))
        .await;
    let principal = match checked {
        Ok(p) => p,
        Err(e) => {
            c.logins.failed(from, c.now());
            refused(&e.to_string());
            return login_form(
                &c,
                Some(&next),
                Some(&e.to_string()),
                StatusCode::UNAUTHORIZED,
            );
        }
    };
    c.logins.succeeded(&from);
    let (token, s) = c.sessions.open(principal, peer, true, c.now());
    audit::done(s.who(), "console.login", "", "session opened");
    let mut r = (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, local_next(Some(&next)))],
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&set_cookie(&token, c.opts.tls)) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

/// `POST /logout`.
pub(crate) async fn logout(State(c): State<Shared>, headers: HeaderMap, _: Posted) -> Response {
    if let Some(t) = cookie(&headers) {
        c.sessions.close(t);
    }
    let to = if c.auth.is_enabled() { "/login" } else { "/" };
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
    if let Ok(v) = HeaderValue::from_str(&clear_cookie(c.opts.tls)) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lives_while_used_and_no_longer() {
        let s = Sessions::new();
        let (token, session) = s.open(Principal::anonymous(), None, false, 0);
        assert!(s.get(&token, IDLE - 1).is_some());
        assert!(s.get(&token, 2 * IDLE - 2).is_some(), "use extends it");
        assert!(s.get(&token, 4 * IDLE).is_none(), "idle too long");
        assert!(s.get("not-a-token", 1).is_none());
        assert!(session.csrf_matches(session.csrf()));
        assert!(!session.csrf_matches(""));
        assert!(!session.csrf_matches("x"));
    }

    #[test]
    fn failed_logins_close_an_address_for_the_window_only() {
        let t = login_throttle();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for i in 0..MAX_FAILED_LOGINS as u64 {
            assert_eq!(t.wait(&a, 1000 * i), None, "try {i}");
            t.failed(a, 1000 * i);
        }
        // Closed until the first failure is a window old.
        let last = 1000 * (MAX_FAILED_LOGINS as u64 - 1);
        assert_eq!(t.wait(&a, last), Some(FAILED_LOGIN_WINDOW - last));
        assert_eq!(t.wait(&b, last), None, "another address may try");
        assert_eq!(t.wait(&a, FAILED_LOGIN_WINDOW - 1), Some(1));
        // Then one more try, and closed again if it fails.
        assert_eq!(t.wait(&a, FAILED_LOGIN_WINDOW), None);
        t.failed(a, FAILED_LOGIN_WINDOW);
        assert_eq!(t.wait(&a, FAILED_LOGIN_WINDOW), Some(1000));
        // Failures spread wider than the window never close it.
        let spread = login_throttle();
        for i in 0..3 * MAX_FAILED_LOGINS as u64 {
            let now = i * (FAILED_LOGIN_WINDOW / MAX_FAILED_LOGINS as u64 + 1);
            assert_eq!(spread.wait(&a, now), None, "try {i}");
            spread.failed(a, now);
        }
        // A login forgets the failures.
        t.succeeded(&a);
        assert_eq!(t.wait(&a, FAILED_LOGIN_WINDOW), None);
    }

    #[test]
    fn the_addresses_remembered_are_bounded() {
        let t = login_throttle();
        for i in 0..u32::try_from(MAX_TRACKED_ADDRESSES).unwrap() + 10 {
            t.failed(IpAddr::V4(Ipv4Addr::from(i)), u64::from(i));
        }
        assert_eq!(t.len(), MAX_TRACKED_ADDRESSES);
        assert!(
            !t.remembers(&IpAddr::V4(Ipv4Addr::from(0))),
            "the longest quiet went first"
        );
    }

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(local_next(Some("/queues/a")), "/queues/a");
        assert_eq!(local_next(Some("//evil.example/")), "/");
        assert_eq!(local_next(Some("https://evil.example/")), "/");
        assert_eq!(local_next(None), "/");
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; letterbox_session=abc; b=2"),
        );
        assert_eq!(cookie(&h), Some("abc"));
        assert!(set_cookie("t", true).contains("Secure"));
        assert!(set_cookie("t", false).contains("HttpOnly; SameSite=Strict"));
    }
}
