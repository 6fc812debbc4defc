//! Authentication and authorization of gRPC calls: credentials come from
//! the `authorization` metadata (`Bearer <token>` or `Basic
//! base64(client_id:secret)`) or the TLS client certificate; `crate::auth`
//! decides. Denials never reach the engine, so they change nothing.

use std::sync::Arc;

use base64::Engine as _;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

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

/// Who is calling: the principal for the request's credentials.
pub(crate) fn caller<T>(auth: &Authenticator, req: &Request<T>) -> Result<Arc<Principal>, Status> {
    if !auth.is_enabled() {
        return auth
            .authenticate(Credentials::None, None)
            .map_err(auth_status);
    }
    let certs = req.peer_certs();
    let leaf = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
    let p = presented(req.metadata())?;
    let creds = match &p {
        Presented::None => Credentials::None,
        Presented::Bearer(t) => Credentials::Bearer(t),
        Presented::Basic(id, secret) => Credentials::ClientSecret { id, secret },
    };
    let p = auth.authenticate(creds, leaf).map_err(auth_status)?;
    tracing::Span::current().record("principal", p.name());
    Ok(p)
}

/// `action` on `name`, or PERMISSION_DENIED.
pub(crate) fn allow(p: &Principal, action: Action, name: &str) -> Result<(), Status> {
    p.check(action, name).map_err(auth_status)
}

/// Some action on `name` (reading its description or stats), or
/// PERMISSION_DENIED.
pub(crate) fn allow_any(p: &Principal, name: &str) -> Result<(), Status> {
    if p.sees(name) {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "principal {:?} has no grant on {name:?}",
            p.name()
        )))
    }
}

/// `Consume` on the queue of every token that names an existing queue.
/// Tokens that do not parse or whose queue is gone are left to the engine,
/// which reports them per token.
pub(crate) fn allow_tokens<'a>(
    p: &Principal,
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
