//! Authentication and authorization of gRPC calls: credentials come from
//! the `authorization` metadata (`Bearer <token>` or `Basic
//! base64(client_id:secret)`) or the TLS client certificate; `crate::auth`
//! decides. Denials never reach the engine, so they change nothing.

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;

use base64::Engine as _;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::auth::{Action, AuthError, Authenticator, Credentials, Principal};
use crate::edge::audit;
use crate::queue::Broker;

/// The status a client sees for an authentication or authorization error.
pub(crate) fn auth_status(e: AuthError) -> Status {
    match e {
        AuthError::Unauthenticated(m) => Status::unauthenticated(m),
        AuthError::Throttled { message, .. } => Status::resource_exhausted(message),
        e @ AuthError::PermissionDenied { .. } => Status::permission_denied(e.to_string()),
    }
}

/// Owned credentials read from metadata.
enum Presented {
    None,
    Bearer(String),
    Basic(String, String),
}

fn presented(meta: &MetadataMap) -> Result<Presented, Status> {
    let Some(value) = meta.get("authorization") else {
        return Ok(Presented::None);
    };
    let text = value
        .to_str()
        .map_err(|_| Status::unauthenticated("the authorization header is not ASCII"))?;
    let (scheme, rest) = text.split_once(' ').ok_or_else(|| {
        Status::unauthenticated(
            "the authorization header must be `Bearer <token>` or `Basic <base64 of id:secret>`",
        )
    })?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(Presented::Bearer(rest.to_string()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|_| Status::unauthenticated("the Basic credentials are not base64"))?;
        let text = String::from_utf8(raw)
            .map_err(|_| Status::unauthenticated("the Basic credentials are not UTF-8"))?;
        let (id, secret) = text.split_once(':').ok_or_else(|| {
            Status::unauthenticated("the Basic credentials must be `client_id:secret`")
        })?;
        return Ok(Presented::Basic(id.to_string(), secret.to_string()));
    }
    Err(Status::unauthenticated(format!(
        "unsupported authorization scheme {scheme:?} (use Bearer or Basic)"
    )))
}

/// The principal of a call and the address it came from.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    principal: Arc<Principal>,
    peer: Option<SocketAddr>,
}

impl Deref for Caller {
    type Target = Principal;
    fn deref(&self) -> &Principal {
        &self.principal
    }
}

impl Caller {
    /// Who this is, for the audit log.
    pub(crate) fn who(&self) -> audit::Who<'_> {
        audit::Who {
            principal: self.principal.name(),
            peer: self.peer,
        }
    }

    /// Records a destructive or security-relevant act in the audit log.
    pub(crate) fn audit(&self, action: &str, name: &str, detail: &str) {
        audit::done(self.who(), action, name, detail);
    }
}

/// Who is calling: the principal for the request's credentials. Refused
/// credentials are recorded in the audit log. The credentials are read
/// from the request before the returned future, which borrows nothing; it
/// is ready at once unless a client secret must be verified with argon2,
/// which then runs on the blocking pool (see
/// [`Authenticator::authenticate_async`]).
pub(crate) fn caller<T>(
    auth: &Arc<Authenticator>,
    req: &Request<T>,
) -> impl Future<Output = Result<Caller, Status>> + Send + use<T> {
    let peer = req.remote_addr();
    let refused = move |e: AuthError, presented: &str| {
        audit::refused(
            audit::Who {
                principal: presented,
                peer,
            },
            "authenticate",
            "-",
            &e.to_string(),
        );
        auth_status(e)
    };
    // What to wait for: the principal, or the refusal, and who was shown.
    let enabled = auth.is_enabled();
    let checked = if enabled {
        let certs = req.peer_certs();
        let leaf = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
        match presented(req.metadata()) {
            Ok(p) => {
                let (creds, shown) = match &p {
                    Presented::None => (Credentials::None, "(none)".to_string()),
                    Presented::Bearer(t) => (Credentials::Bearer(t), "(bearer token)".to_string()),
                    Presented::Basic(id, secret) => (
                        Credentials::ClientSecret { id, secret },
                        format!("client id {id}"),
                    ),
                };
                Ok((
                    auth.authenticate_async(creds, leaf, peer.map(|p| p.ip())),
                    shown,
                ))
            }
            Err(s) => {
                audit::refused(
                    audit::Who {
                        principal: "-",
                        peer,
                    },
                    "authenticate",
                    "-",
                    s.message(),
                );
                Err(s)
            }
        }
    } else {
        Ok((
            auth.authenticate_async(Credentials::None, None, None),
            "-".to_string(),
        ))
    };
    async move {
        let (principal, shown) = checked?;
        let principal = principal.await.map_err(|e| refused(e, &shown))?;
        if enabled {
            tracing::Span::current().record("principal", principal.name());
        }
        Ok(Caller { principal, peer })
    }
}

/// `action` on `name`, or PERMISSION_DENIED (recorded in the audit log).
pub(crate) fn allow(c: &Caller, action: Action, name: &str) -> Result<(), Status> {
    c.check(action, name).map_err(|e| {
        audit::refused(c.who(), action.name(), name, &e.to_string());
        auth_status(e)
    })
}

/// Some action on `name` (reading its description or stats), or
/// PERMISSION_DENIED (recorded in the audit log).
pub(crate) fn allow_any(c: &Caller, name: &str) -> Result<(), Status> {
    if c.sees(name) {
        Ok(())
    } else {
        let reason = format!("principal {:?} has no grant on {name:?}", c.name());
        audit::refused(c.who(), "read", name, &reason);
        Err(Status::permission_denied(reason))
    }
}

/// `Consume` on the queue of every token that names an existing queue.
/// Tokens that do not parse or whose queue is gone are left to the engine,
/// which reports them per token.
pub(crate) fn allow_tokens<'a>(
    p: &Caller,
    broker: &Broker,
    tokens: impl IntoIterator<Item = &'a str>,
) -> Result<(), Status> {
    for t in tokens {
        if let Some(queue) = broker.token_queue(t) {
            allow(p, Action::Consume, &queue)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", value.parse().unwrap());
        m
    }

    #[test]
    fn authorization_headers_parse() {
        assert!(matches!(
            presented(&MetadataMap::new()).unwrap(),
            Presented::None
        ));
        assert!(matches!(
            presented(&meta("Bearer abc")).unwrap(),
            Presented::Bearer(t) if t == "abc"
        ));
        let basic = base64::engine::general_purpose::STANDARD.encode("id:se:cret");
        assert!(matches!(
            presented(&meta(&format!("basic {basic}"))).unwrap(),
            Presented::Basic(i, s) if i == "id" && s == "se:cret"
        ));
        for bad in ["Bearer", "Digest x", "Basic !!!", "Basic aWQ="] {
            let e = presented(&meta(bad)).err().unwrap();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad}");
        }
    }

    #[tokio::test]
    async fn a_client_secret_is_verified_off_the_worker_once_then_from_the_cache() {
        let auth = Arc::new(
            Authenticator::new(&[crate::auth::PrincipalConfig {
                name: "app".into(),
                client_id: Some("app-id".into()),
                secret_hash: Some(crate::auth::hash_secret("s3cret").unwrap()),
                ..Default::default()
            }])
            .unwrap(),
        );
        let request = |secret: &str| {
            let basic =
                base64::engine::general_purpose::STANDARD.encode(format!("app-id:{secret}"));
            let mut r = Request::new(());
            *r.metadata_mut() = meta(&format!("Basic {basic}"));
            r
        };
        let poll_once = |f: std::pin::Pin<&mut dyn Future<Output = Result<Caller, Status>>>| {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            f.poll(&mut cx)
        };
        let mut first = std::pin::pin!(caller(&auth, &request("s3cret")));
        assert!(
            poll_once(first.as_mut()).is_pending(),
            "argon2 runs on the blocking pool"
        );
        assert_eq!(first.await.unwrap().name(), "app");
        let mut again = std::pin::pin!(caller(&auth, &request("s3cret")));
        match poll_once(again.as_mut()) {
            std::task::Poll::Ready(c) => assert_eq!(c.unwrap().name(), "app"),
            std::task::Poll::Pending => panic!("a cached secret needs no wait"),
        }
        assert_eq!(auth.argon2_runs(), 1);
        let wrong = caller(&auth, &request("wrong")).await.unwrap_err();
        assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
        assert_eq!(auth.argon2_runs(), 2);
    }
}
