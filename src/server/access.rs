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

use super::audit;
use crate::auth::{Action, AuthError, Authenticator, Credentials, Principal};
use crate::queue::Broker;

/// The status a client sees for an authentication or authorization error.
pub(crate) fn auth_status(e: AuthError) -> Status {
    match e {
        AuthError::Unauthenticated(m) => Status::unauthenticated(m),
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
/// credentials are recorded in the audit log.
pub(crate) fn caller<T>(auth: &Authenticator, req: &Request<T>) -> Result<Caller, Status> {
    let peer = req.remote_addr();
    let refused = |e: AuthError, presented: &str| {
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
    if !auth.is_enabled() {
        let principal = auth
            .authenticate(Credentials::None, None)
            .map_err(|e| refused(e, "-"))?;
        return Ok(Caller { principal, peer });
    }
    let certs = req.peer_certs();
    let leaf = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
    let p = match presented(req.metadata()) {
        Ok(p) => p,
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
            return Err(s);
        }
    };
    let (creds, shown) = match &p {
        Presented::None => (Credentials::None, "(none)".to_string()),
        Presented::Bearer(t) => (Credentials::Bearer(t), "(bearer token)".to_string()),
        Presented::Basic(id, secret) => (
            Credentials::ClientSecret { id, secret },
            format!("client id {id}"),
        ),
    };
    let principal = auth
        .authenticate(creds, leaf)
        .map_err(|e| refused(e, &shown))?;
    tracing::Span::current().record("principal", principal.name());
    Ok(Caller { principal, peer })
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
}
