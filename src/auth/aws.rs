//! AWS access keys of principals, for the SQS endpoint's SigV4 signatures
//! (`crate::sqs`).
//!
//! A SigV4 signature is an HMAC made with the secret access key itself,
//! so the server must hold the secret, not a hash of it: a principal's
//! `aws_secret_access_key_file` names a file holding it (its first line),
//! read at start, and the configuration file keeps nothing a client could
//! present. `letterbox auth new-aws-key` makes a pair.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::Principal;

/// The access keys: id → (secret, principal).
#[derive(Default)]
pub(crate) struct AwsKeys {
    by_id: HashMap<String, (String, Arc<Principal>)>,
}

impl AwsKeys {
    /// Adds a principal's key: the id checked (16 to 128 letters, digits
    /// or `_`, as AWS's), the secret read from `file`. `Err` says which
    /// key is wrong and why.
    pub(crate) fn add(
        &mut self,
        id: &str,
        file: &Path,
        principal: Arc<Principal>,
    ) -> Result<(), (&'static str, String)> {
        if !(16..=128).contains(&id.len())
            || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err((
                "aws_access_key_id",
                format!(
                    "{id:?} is not an access key id: 16 to 128 letters, digits or '_' (make one with `letterbox auth new-aws-key`)"
                ),
            ));
        }
        if self.by_id.contains_key(id) {
            return Err((
                "aws_access_key_id",
                format!("{id:?} is used by an earlier principal"),
            ));
        }
        let text = std::fs::read_to_string(file).map_err(|e| {
            (
                "aws_secret_access_key_file",
                format!("{}: {e}", file.display()),
            )
        })?;
        let secret = text.lines().next().unwrap_or_default().trim().to_string();
        if secret.is_empty() {
            return Err((
                "aws_secret_access_key_file",
                format!(
                    "{}: is empty (its first line is the secret access key)",
                    file.display()
                ),
            ));
        }
        self.by_id.insert(id.to_string(), (secret, principal));
        Ok(())
    }

    /// The secret and principal of an access key id.
    pub(crate) fn get(&self, id: &str) -> Option<(&str, &Arc<Principal>)> {
        self.by_id.get(id).map(|(s, p)| (s.as_str(), p))
    }
}

/// A new random access key: its id (20 characters, `LBK` then 17 upper
/// case letters and digits, shaped as AWS's) and its secret (40
/// characters of base64).
pub fn new_aws_key() -> (String, String) {
    use argon2::password_hash::rand_core::{OsRng, RngCore};
    use base64::Engine as _;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut raw = [0u8; 17];
    OsRng.fill_bytes(&mut raw);
    let id: String = std::iter::once("LBK".to_string())
        .chain(
            raw.iter()
                .map(|b| char::from(ALPHABET[usize::from(b % 32)]).to_string()),
        )
        .collect();
    let mut secret = [0u8; 30];
    OsRng.fill_bytes(&mut secret);
    (id, base64::engine::general_purpose::STANDARD.encode(secret))
}
