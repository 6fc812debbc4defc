//! Access tokens issued by `authorize`: opaque random strings, kept in
//! memory (a restart forgets them; clients authorize again on a 401, as
//! they must against Anypoint MQ too).
//!
//! As Anypoint MQ documents: a token lives 60 minutes, every use extends it
//! by another 60 minutes, and authorizing again with the same client id
//! returns the same token while it is valid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::auth::Principal;

struct Entry {
    principal: Arc<Principal>,
    client_id: String,
    expires_at: u64,
}

#[derive(Default)]
struct Inner {
    by_token: HashMap<String, Entry>,
    by_client: HashMap<String, String>,
}

/// The issued tokens.
pub(crate) struct Tokens {
    lifetime: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("lifetime", &self.lifetime)
            .field("issued", &self.lock().by_token.len())
            .finish()
    }
}

impl Tokens {
    /// Tokens that live `lifetime` milliseconds after their last use.
    pub(crate) fn new(lifetime: u64) -> Tokens {
        Tokens {
            lifetime,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Sections under this lock only touch the maps; a panic cannot
        // leave them inconsistent in a way that matters.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The token of `client_id` (the one it already has, if still valid
    /// and for the same principal, else a new one), valid for a lifetime
    /// from `now`. Expired tokens are forgotten on the way.
    pub(crate) fn issue(&self, client_id: &str, principal: Arc<Principal>, now: u64) -> String {
        let mut inner = self.lock();
        inner.by_token.retain(|_, e| e.expires_at > now);
        let Inner {
            by_token,
            by_client,
        } = &mut *inner;
        by_client.retain(|_, t| by_token.contains_key(t));
        if let Some(token) = by_client.get(client_id)
            && let Some(e) = by_token.get_mut(token)
            && Arc::ptr_eq(&e.principal, &principal)
        {
            e.expires_at = now + self.lifetime;
            return token.clone();
        }
        let (token, _) = crate::auth::new_token();
        by_token.insert(
            token.clone(),
            Entry {
                principal,
                client_id: client_id.to_string(),
                expires_at: now + self.lifetime,
            },
        );
        if let Some(old) = by_client.insert(client_id.to_string(), token.clone()) {
            by_token.remove(&old);
        }
        token
    }

    /// The principal of a valid token, whose life is extended; `None` for
    /// an unknown or expired one.
    pub(crate) fn check(&self, token: &str, now: u64) -> Option<Arc<Principal>> {
        let mut inner = self.lock();
        let e = inner.by_token.get_mut(token)?;
        if e.expires_at <= now {
            let client = e.client_id.clone();
            inner.by_token.remove(token);
            if inner.by_client.get(&client).is_some_and(|t| t == token) {
                inner.by_client.remove(&client);
            }
            return None;
        }
        e.expires_at = now + self.lifetime;
        Some(Arc::clone(&e.principal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_reused_per_client_extended_on_use_and_expire() {
        let tokens = Tokens::new(1_000);
        let p = Principal::anonymous();
        let t = tokens.issue("app", Arc::clone(&p), 0);
        assert_eq!(t.len(), 64);
        assert_eq!(
            tokens.issue("app", Arc::clone(&p), 500),
            t,
            "same client, same token"
        );
        let other = tokens.issue("other", Arc::clone(&p), 500);
        assert_ne!(other, t);
        // Used at 1400 (valid until 1500): now valid until 2400.
        assert!(tokens.check(&t, 1_400).is_some());
        assert!(tokens.check(&t, 2_399).is_some());
        assert!(
            tokens.check(&other, 2_399).is_none(),
            "not used, expired at 1500"
        );
        assert!(tokens.check(&t, 3_399).is_none(), "expired at 3399");
        assert!(tokens.check("unknown", 0).is_none());
        let fresh = tokens.issue("app", p, 4_000);
        assert_ne!(fresh, t, "an expired token is not handed out again");
    }
}
