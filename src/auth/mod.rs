//! Who may do what: principals, their credentials and their grants.
//!
//! A principal is a named identity with credentials (any of: a client id
//! and secret, bearer tokens, client-certificate fingerprints, an AWS
//! access key for the SQS endpoint: `aws.rs`) and grants:
//! lists of name patterns (`*` and `?` wildcards) for each [`Action`].
//! Secrets are stored as argon2id hashes (PHC strings, made by
//! `letterbox auth hash-secret`), tokens and certificates as SHA-256
//! digests: the configuration never holds a usable credential.
//!
//! Without any principal configured, authentication is off: every caller
//! is the anonymous principal, allowed everything, and the server only
//! listens on loopback unless told otherwise (see `config.rs`).
//!
//! This module knows nothing of gRPC or HTTP: the server extracts
//! [`Credentials`] from its transport and asks [`Authenticator`].

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::Deserialize;
use sha2::{Digest, Sha256};

mod aws;
pub(crate) mod failures;

pub use aws::new_aws_key;

use failures::Failures;

/// What a call does, for authorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Create, change, delete, purge and inspect queues and exchanges;
    /// redrive; definitions; group administration.
    Admin,
    /// Publish into a queue or through an exchange.
    Publish,
    /// Receive, subscribe, browse, ack, nack and extend leases.
    Consume,
}

impl Action {
    /// The lower-case name used in configuration and errors.
    pub fn name(self) -> &'static str {
        match self {
            Action::Admin => "admin",
            Action::Publish => "publish",
            Action::Consume => "consume",
        }
    }
}

/// One principal as written in the configuration file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Name, shown in logs and errors.
    pub name: String,
    /// Client id, presented with its secret (HTTP Basic form in the
    /// `authorization` header, or the Anypoint `authorize` call).
    #[serde(default)]
    pub client_id: Option<String>,
    /// argon2id PHC string of the client secret.
    #[serde(default)]
    pub secret_hash: Option<String>,
    /// SHA-256 digests (hex) of bearer tokens.
    #[serde(default)]
    pub token_sha256: Vec<String>,
    /// SHA-256 fingerprints (hex, colons allowed) of client certificates
    /// (DER), accepted when the server requires client certificates.
    #[serde(default)]
    pub cert_sha256: Vec<String>,
    /// AWS access key id, for SigV4-signed requests to the SQS endpoint.
    #[serde(default)]
    pub aws_access_key_id: Option<String>,
    /// A file whose first line is the secret access key of
    /// `aws_access_key_id` (SigV4 needs the secret itself, which is so
    /// kept out of the configuration file).
    #[serde(default)]
    pub aws_secret_access_key_file: Option<std::path::PathBuf>,
    /// Name patterns this principal may administer.
    #[serde(default)]
    pub admin: Vec<String>,
    /// Name patterns this principal may publish to.
    #[serde(default)]
    pub publish: Vec<String>,
    /// Name patterns this principal may consume from.
    #[serde(default)]
    pub consume: Vec<String>,
}

/// A configuration error, naming the principal and the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("principals[{index}] ({name}): {key}: {reason}")]
pub struct AuthConfigError {
    /// Position in the list.
    pub index: usize,
    /// The principal's name (may be empty).
    pub name: String,
    /// The offending key.
    pub key: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// Why a caller was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No or bad credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// Too many wrong secrets for a client id from one address lately:
    /// refused without a check (see [`MAX_FAILED_CHECKS`]).
    #[error("{message}")]
    Throttled {
        /// What happened and when the next secret is checked.
        message: String,
        /// Seconds until the next secret is checked.
        retry_after_secs: u64,
    },
    /// Known caller, action not granted.
    #[error("principal {principal:?} may not {action} {name:?}")]
    PermissionDenied {
        /// The caller.
        principal: String,
        /// The action's name.
        action: &'static str,
        /// The queue or exchange.
        name: String,
    },
}

/// Credentials presented with a call.
#[derive(Debug, Clone, Copy)]
pub enum Credentials<'a> {
    /// Nothing presented.
    None,
    /// A bearer token.
    Bearer(&'a str),
    /// A client id and secret.
    ClientSecret {
        /// The client id.
        id: &'a str,
        /// The secret in clear.
        secret: &'a str,
    },
}

/// A name pattern: `*` matches any run of characters, `?` one character.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern(Vec<char>);

impl Pattern {
    fn parse(text: &str) -> Result<Pattern, String> {
        if text.is_empty() {
            return Err("an empty pattern matches nothing; use \"*\" for everything".into());
        }
        if text.chars().any(char::is_control) {
            return Err(format!("pattern {text:?} contains a control character"));
        }
        Ok(Pattern(text.chars().collect()))
    }

    /// Iterative wildcard match with backtracking on the last `*`: linear
    /// in practice, never exponential.
    fn matches(&self, name: &str) -> bool {
        let p = &self.0;
        let s: Vec<char> = name.chars().collect();
        let (mut i, mut j) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while j < s.len() {
            if i < p.len() && (p[i] == '?' || p[i] == s[j]) {
                i += 1;
                j += 1;
            } else if i < p.len() && p[i] == '*' {
                star = Some((i, j));
                i += 1;
            } else if let Some((si, sj)) = star {
                i = si + 1;
                j = sj + 1;
                star = Some((si, sj + 1));
            } else {
                return false;
            }
        }
        p[i..].iter().all(|c| *c == '*')
    }
}

/// An authenticated caller and what it may do.
#[derive(Debug)]
pub struct Principal {
    name: String,
    admin: Vec<Pattern>,
    publish: Vec<Pattern>,
    consume: Vec<Pattern>,
    anonymous: bool,
}

impl Principal {
    /// The caller when authentication is off: allowed everything.
    pub fn anonymous() -> Arc<Principal> {
        Arc::new(Principal {
            name: "anonymous".into(),
            admin: Vec::new(),
            publish: Vec::new(),
            consume: Vec::new(),
            anonymous: true,
        })
    }

    /// The principal's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `action` on the queue or exchange `name` is granted.
    pub fn allows(&self, action: Action, name: &str) -> bool {
        if self.anonymous {
            return true;
        }
        let patterns = match action {
            Action::Admin => &self.admin,
            Action::Publish => &self.publish,
            Action::Consume => &self.consume,
        };
        patterns.iter().any(|p| p.matches(name))
    }

    /// Whether `action` is granted on every name (a `*` grant): needed for
    /// calls that are not about one named object (definitions export).
    pub fn allows_all(&self, action: Action) -> bool {
        self.allows(action, "") && self.allows(action, "*")
    }

    /// Whether any grant of any action could match `name` (listing shows
    /// only such names).
    pub fn sees(&self, name: &str) -> bool {
        [Action::Admin, Action::Publish, Action::Consume]
            .into_iter()
            .any(|a| self.allows(a, name))
    }

    /// [`Principal::allows`] as a result.
    pub fn check(&self, action: Action, name: &str) -> Result<(), AuthError> {
        if self.allows(action, name) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied {
                principal: self.name.clone(),
                action: action.name(),
                name: name.to_string(),
            })
        }
    }
}

type Digest32 = [u8; 32];

fn sha256(bytes: &[u8]) -> Digest32 {
    Sha256::digest(bytes).into()
}

fn parse_digest(text: &str) -> Result<Digest32, String> {
    let hex: String = text.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{text:?} is not a SHA-256 digest (64 hex digits)"));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Lower-case hex of a SHA-256 digest.
pub fn hex_sha256(bytes: &[u8]) -> String {
    sha256(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes a client secret for the configuration file (argon2id, random
/// salt, PHC string).
pub fn hash_secret(secret: &str) -> Result<String, String> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    argon2::Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// A new random bearer token (32 bytes, hex) and the digest to configure.
pub fn new_token() -> (String, String) {
    use argon2::password_hash::rand_core::RngCore;
    let mut raw = [0u8; 32];
    argon2::password_hash::rand_core::OsRng.fill_bytes(&mut raw);
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let digest = hex_sha256(token.as_bytes());
    (token, digest)
}

struct ClientEntry {
    phc: String,
    principal: Arc<Principal>,
}

/// How long a client secret, once verified with argon2, is taken on its
/// SHA-256 alone. A restart forgets every verification; with a
/// configuration that could change while the server runs, this would be
/// the longest a removed or changed secret still works.
pub const VERIFIED_TTL: Duration = Duration::from_secs(5 * 60);

/// Wrong secrets of one client id from one address that stop its secrets
/// from being checked from there...
pub const MAX_FAILED_CHECKS: usize = 5;
/// ...when they all fell within this time, until the oldest of them is
/// that old. Guessing a secret then costs the server no argon2 check past
/// [`MAX_FAILED_CHECKS`] per window, and one misconfigured service locks
/// out only its own client id from its own address; a client whose right
/// secret is in the cache ([`VERIFIED_TTL`]) is not checked, so not
/// refused.
pub const FAILED_CHECK_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Most (address, client id) pairs whose wrong secrets are remembered
/// (those with none within the window go first, then the longest quiet).
const MAX_TRACKED_FAILURES: usize = 10_000;

/// The monotonic time the secret cache reads (tests move it).
type Now = Box<dyn Fn() -> Instant + Send + Sync>;

/// Checks credentials against the configured principals.
pub struct Authenticator {
    enabled: bool,
    clients: HashMap<String, ClientEntry>,
    tokens: HashMap<Digest32, Arc<Principal>>,
    certs: HashMap<Digest32, Arc<Principal>>,
    /// AWS access keys (SigV4, the SQS endpoint).
    aws: aws::AwsKeys,
    /// Per configured client id, the SHA-256 of the secret last verified
    /// with argon2 and when: argon2 is slow on purpose, and a client
    /// presents the same secret on every call. Entries older than
    /// [`VERIFIED_TTL`] are verified again. Only a configured client id
    /// with its right secret gets an entry, so the map holds at most one
    /// entry per configured client whatever callers send.
    verified: Mutex<HashMap<String, (Digest32, Instant)>>,
    /// Wrong secrets by (address, client id), for [`MAX_FAILED_CHECKS`],
    /// at milliseconds since `epoch`.
    failures: Failures<(Option<IpAddr>, String)>,
    /// Now, for the cache and the wrong secrets.
    now: Now,
    /// Where the wrong secrets' milliseconds count from.
    epoch: Instant,
    /// How many secrets were verified with argon2.
    argon2_runs: AtomicU64,
    anonymous: Arc<Principal>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("enabled", &self.enabled)
            .field("clients", &self.clients.len())
            .field("tokens", &self.tokens.len())
            .field("certs", &self.certs.len())
            .finish()
    }
}

impl Authenticator {
    /// Authentication off: everyone is the anonymous principal.
    pub fn disabled() -> Authenticator {
        Authenticator {
            enabled: false,
            clients: HashMap::new(),
            tokens: HashMap::new(),
            certs: HashMap::new(),
            aws: aws::AwsKeys::default(),
            verified: Mutex::new(HashMap::new()),
            failures: Failures::new(
                MAX_FAILED_CHECKS,
                millis(FAILED_CHECK_WINDOW),
                MAX_TRACKED_FAILURES,
            ),
            now: Box::new(Instant::now),
            epoch: Instant::now(),
            argon2_runs: AtomicU64::new(0),
            anonymous: Principal::anonymous(),
        }
    }

    /// Builds the authenticator from the configured principals, validating
    /// all of them (unique names, client ids, tokens and certificates;
    /// parsable hashes and patterns; at least one credential each). An
    /// empty list turns authentication off.
    pub fn new(principals: &[PrincipalConfig]) -> Result<Authenticator, AuthConfigError> {
        let mut a = Authenticator::disabled();
        a.enabled = !principals.is_empty();
        let mut names = HashSet::new();
        for (index, p) in principals.iter().enumerate() {
            let err = |key: &'static str, reason: String| AuthConfigError {
                index,
                name: p.name.clone(),
                key,
                reason,
            };
            if p.name.trim().is_empty() {
                return Err(err("name", "is empty".into()));
            }
            if !names.insert(p.name.as_str()) {
                return Err(err("name", "is used by an earlier principal".into()));
            }
            let patterns = |key: &'static str, list: &[String]| {
                list.iter()
                    .map(|t| Pattern::parse(t).map_err(|r| err(key, r)))
                    .collect::<Result<Vec<_>, _>>()
            };
            let principal = Arc::new(Principal {
                name: p.name.clone(),
                admin: patterns("admin", &p.admin)?,
                publish: patterns("publish", &p.publish)?,
                consume: patterns("consume", &p.consume)?,
                anonymous: false,
            });
            match (&p.client_id, &p.secret_hash) {
                (Some(id), Some(phc)) => {
                    if id.is_empty() {
                        return Err(err("client_id", "is empty".into()));
                    }
                    PasswordHash::new(phc).map_err(|e| {
                        err(
                            "secret_hash",
                            format!("is not a PHC hash string ({e}); make one with `letterbox auth hash-secret`"),
                        )
                    })?;
                    if a.clients.contains_key(id) {
                        return Err(err(
                            "client_id",
                            format!("{id:?} is used by an earlier principal"),
                        ));
                    }
                    a.clients.insert(
                        id.clone(),
                        ClientEntry {
                            phc: phc.clone(),
                            principal: Arc::clone(&principal),
                        },
                    );
                }
                (Some(_), None) => {
                    return Err(err("secret_hash", "is missing (client_id needs it)".into()));
                }
                (None, Some(_)) => {
                    return Err(err("client_id", "is missing (secret_hash needs it)".into()));
                }
                (None, None) => {}
            }
            for t in &p.token_sha256 {
                let d = parse_digest(t).map_err(|r| err("token_sha256", r))?;
                if a.tokens.insert(d, Arc::clone(&principal)).is_some() {
                    return Err(err("token_sha256", format!("{t} is configured twice")));
                }
            }
            for c in &p.cert_sha256 {
                let d = parse_digest(c).map_err(|r| err("cert_sha256", r))?;
                if a.certs.insert(d, Arc::clone(&principal)).is_some() {
                    return Err(err("cert_sha256", format!("{c} is configured twice")));
                }
            }
            match (&p.aws_access_key_id, &p.aws_secret_access_key_file) {
                (Some(id), Some(file)) => a
                    .aws
                    .add(id, file, Arc::clone(&principal))
                    .map_err(|(key, reason)| err(key, reason))?,
                (Some(_), None) => {
                    return Err(err(
                        "aws_secret_access_key_file",
                        "is missing (aws_access_key_id needs it)".into(),
                    ));
                }
                (None, Some(_)) => {
                    return Err(err(
                        "aws_access_key_id",
                        "is missing (aws_secret_access_key_file needs it)".into(),
                    ));
                }
                (None, None) => {}
            }
            if p.client_id.is_none()
                && p.token_sha256.is_empty()
                && p.cert_sha256.is_empty()
                && p.aws_access_key_id.is_none()
            {
                return Err(err(
                    "name",
                    "has no credential (client_id + secret_hash, token_sha256, cert_sha256 or aws_access_key_id + aws_secret_access_key_file)"
                        .into(),
                ));
            }
        }
        Ok(a)
    }

    /// Whether any principal is configured.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The secret access key and the principal of an AWS access key id
    /// (SigV4 signatures of the SQS endpoint).
    pub fn aws_key(&self, access_key_id: &str) -> Option<(&str, Arc<Principal>)> {
        self.aws.get(access_key_id).map(|(s, p)| (s, Arc::clone(p)))
    }

    /// Whether some principal is known by a client certificate.
    pub fn uses_certificates(&self) -> bool {
        !self.certs.is_empty()
    }

    /// How many client secrets were checked with argon2 (the checks the
    /// cache did not answer), since the start.
    pub fn argon2_runs(&self) -> u64 {
        self.argon2_runs.load(Ordering::Relaxed)
    }

    /// Who presents these credentials (and, if any, this client
    /// certificate, DER). With authentication off, the anonymous
    /// principal. A certificate of a known principal is enough; otherwise
    /// the credentials must be valid.
    ///
    /// A client secret not verified in the last [`VERIFIED_TTL`] costs an
    /// argon2 verification (tens of milliseconds of CPU): async callers
    /// use [`Authenticator::authenticate_async`].
    pub fn authenticate(
        &self,
        creds: Credentials<'_>,
        certificate: Option<&[u8]>,
    ) -> Result<Arc<Principal>, AuthError> {
        match self.quick(creds, certificate) {
            Some(answer) => answer,
            None => match creds {
                Credentials::ClientSecret { id, secret } => self.verify_secret(None, id, secret),
                Credentials::None | Credentials::Bearer(_) => {
                    unreachable!("only a client secret needs argon2")
                }
            },
        }
    }

    /// [`Authenticator::authenticate`] for async callers: the answer is
    /// immediate (the future is ready when first polled) unless a client
    /// secret must be verified with argon2, which then runs on the blocking
    /// pool, off the async workers. The future borrows nothing. `peer` is
    /// the caller's address: wrong secrets are counted by address and
    /// client id ([`MAX_FAILED_CHECKS`]).
    pub fn authenticate_async(
        self: &Arc<Self>,
        creds: Credentials<'_>,
        certificate: Option<&[u8]>,
        peer: Option<IpAddr>,
    ) -> impl Future<Output = Result<Arc<Principal>, AuthError>> + Send + use<> {
        let slow = match self.quick(creds, certificate) {
            Some(answer) => Err(answer),
            None => match creds {
                Credentials::ClientSecret { id, secret } => {
                    Ok((Arc::clone(self), id.to_string(), secret.to_string()))
                }
                Credentials::None | Credentials::Bearer(_) => {
                    unreachable!("only a client secret needs argon2")
                }
            },
        };
        async move {
            let (auth, id, secret) = match slow {
                Err(answer) => return answer,
                Ok(job) => job,
            };
            let shown = id.clone();
            match tokio::task::spawn_blocking(move || auth.verify_secret(peer, &id, &secret)).await
            {
                Ok(answer) => answer,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Cancelled: the runtime is shutting down.
                Err(e) => Err(AuthError::Unauthenticated(format!(
                    "the secret of client id {shown:?} could not be checked: {e}"
                ))),
            }
        }
    }

    /// The answer for these credentials if it needs no argon2
    /// verification; `None` for a configured client id whose secret is not
    /// in the cache (or was verified too long ago).
    fn quick(
        &self,
        creds: Credentials<'_>,
        certificate: Option<&[u8]>,
    ) -> Option<Result<Arc<Principal>, AuthError>> {
        if !self.enabled {
            return Some(Ok(Arc::clone(&self.anonymous)));
        }
        if let Some(p) = certificate.and_then(|der| self.certs.get(&sha256(der))) {
            return Some(Ok(Arc::clone(p)));
        }
        Some(match creds {
            Credentials::None => Err(AuthError::Unauthenticated(
                "credentials required: a bearer token or a client id and secret in the authorization header".into(),
            )),
            Credentials::Bearer(token) => self
                .tokens
                .get(&sha256(token.as_bytes()))
                .cloned()
                .ok_or_else(|| AuthError::Unauthenticated("unknown bearer token".into())),
            Credentials::ClientSecret { id, secret } => {
                let Some(entry) = self.clients.get(id) else {
                    return Some(Err(refused(id)));
                };
                let digest = sha256(secret.as_bytes());
                let now = (self.now)();
                let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
                match verified.get(id) {
                    Some((d, at)) if *d == digest && now.saturating_duration_since(*at) < VERIFIED_TTL => {
                        Ok(Arc::clone(&entry.principal))
                    }
                    Some((_, at)) if now.saturating_duration_since(*at) >= VERIFIED_TTL => {
                        verified.remove(id);
                        return None;
                    }
                    _ => return None,
                }
            }
        })
    }

    /// Checks a client secret with argon2 and, when right, caches it and
    /// forgets the wrong ones from `peer`; refused without a check while
    /// `peer` has had [`MAX_FAILED_CHECKS`] wrong secrets for `id` within
    /// [`FAILED_CHECK_WINDOW`].
    fn verify_secret(
        &self,
        peer: Option<IpAddr>,
        id: &str,
        secret: &str,
    ) -> Result<Arc<Principal>, AuthError> {
        let entry = self.clients.get(id).ok_or_else(|| refused(id))?;
        let key = (peer, id.to_string());
        let now = (self.now)();
        let at = millis(now.saturating_duration_since(self.epoch));
        if let Some(wait) = self.failures.wait(&key, at) {
            let secs = wait.div_ceil(1_000);
            let from = peer.map_or_else(|| "an unknown address".to_string(), |p| p.to_string());
            return Err(AuthError::Throttled {
                message: format!(
                    "too many wrong secrets for client id {id:?} from {from}: {MAX_FAILED_CHECKS} within {} minutes; the next is checked in {secs} s",
                    FAILED_CHECK_WINDOW.as_secs() / 60
                ),
                retry_after_secs: secs,
            });
        }
        let hash = PasswordHash::new(&entry.phc).map_err(|_| refused(id))?;
        self.argon2_runs.fetch_add(1, Ordering::Relaxed);
        if argon2::Argon2::default()
            .verify_password(secret.as_bytes(), &hash)
            .is_err()
        {
            self.failures.failed(key, at);
            return Err(refused(id));
        }
        self.failures.succeeded(&key);
        self.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), (sha256(secret.as_bytes()), now));
        Ok(Arc::clone(&entry.principal))
    }
}

/// `d` in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn refused(id: &str) -> AuthError {
    AuthError::Unauthenticated(format!("bad client id or secret for {id:?}"))
}

#[cfg(test)]
mod tests;
