//! `letterbox context add|use|ls|show|rm`: named connection profiles (a
//! server URL, TLS files, credentials), as `nats context` keeps them.
//!
//! A profile is one JSON file `contexts/NAME.json` in the configuration
//! directory (`$LETTERBOX_CONFIG_HOME`, else `$XDG_CONFIG_HOME/letterbox`,
//! else `~/.config/letterbox`), mode 0600 because it may hold a token or a
//! client secret; the directory is made mode 0700. The selected profile's
//! name is in `current`. Every client command uses the profile named by
//! `--context` (or `LETTERBOX_CONTEXT`), else the selected one; a flag or
//! variable given on the command line wins over the profile's value.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::output::Out;
use super::usage;
use crate::client::{ClientError, Code, ErrorKind, Result};

/// Connection profile commands.
#[derive(Debug, Subcommand)]
pub enum ContextCmd {
    /// Save a profile (`--force` replaces one of the same name).
    Add(AddArgs),
    /// Select the profile client commands use by default.
    Use {
        /// The profile's name.
        name: String,
    },
    /// List the profiles (`*` marks the selected one).
    Ls,
    /// Print a profile (the selected one by default); secrets masked.
    Show {
        /// The profile's name.
        name: Option<String>,
    },
    /// Delete a profile.
    Rm {
        /// The profile's name.
        name: String,
    },
}

/// Flags of `context add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The profile's name (letters, digits, `.`, `_`, `-`).
    name: String,
    /// Server address, `http://HOST:PORT` or `https://HOST:PORT`.
    #[arg(long)]
    server: String,
    /// A line saying what the profile is for.
    #[arg(long)]
    description: Option<String>,
    /// CA certificate (PEM) to trust for an `https://` server.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS, with `--client-key`.
    #[arg(long, requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// Private key (PEM) of `--client-cert`.
    #[arg(long, requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Bearer token.
    #[arg(long, conflicts_with_all = ["client_id", "client_secret"])]
    token: Option<String>,
    /// Client id (with `--client-secret`).
    #[arg(long, requires = "client_secret")]
    client_id: Option<String>,
    /// Client secret of `--client-id`.
    #[arg(long, requires = "client_id")]
    client_secret: Option<String>,
    /// Replace a profile of the same name.
    #[arg(long)]
    force: bool,
    /// Select it too (the first profile saved is selected anyway).
    #[arg(long = "use")]
    select: bool,
}

/// A saved profile: every field optional but the server.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Profile {
    /// Server address.
    pub server: String,
    /// What the profile is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// CA certificate file (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
    /// Client certificate file (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<PathBuf>,
    /// Client key file (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    /// Bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Client id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Client secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
}

/// The configuration directory (see the module documentation).
fn config_dir() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("LETTERBOX_CONFIG_HOME") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = var("XDG_CONFIG_HOME") {
        return Ok(PathBuf::from(d).join("letterbox"));
    }
    if let Some(h) = var("HOME") {
        return Ok(PathBuf::from(h).join(".config").join("letterbox"));
    }
    Err(usage(
        "no configuration directory for profiles: set LETTERBOX_CONFIG_HOME or HOME",
    ))
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(usage(format!(
            "context name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.')"
        )))
    }
}

fn io_err(what: &str, path: &Path, e: &std::io::Error) -> ClientError {
    ClientError::new(
        ErrorKind::Rpc(Code::FailedPrecondition),
        format!("{what} {}: {e}", path.display()),
    )
}

fn profile_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("contexts").join(format!("{name}.json"))
}

/// Reads a profile by name.
fn read(dir: &Path, name: &str) -> Result<Profile> {
    check_name(name)?;
    let path = profile_path(dir, name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(usage(format!(
                "no context named {name:?} (in {}; `letterbox context ls` lists them)",
                dir.display()
            )));
        }
        Err(e) => return Err(io_err("reading context", &path, &e)),
    };
    serde_json::from_str(&text).map_err(|e| usage(format!("context file {}: {e}", path.display())))
}

fn selected(dir: &Path) -> Result<Option<String>> {
    let path = dir.join("current");
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t.trim().to_string()).filter(|s| !s.is_empty())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("reading", &path, &e)),
    }
}

/// The profile client commands use: the one named (by `--context` or
/// `LETTERBOX_CONTEXT`), else the selected one, else none.
pub(super) fn active(named: Option<&str>) -> Result<Option<Profile>> {
    if let Some(name) = named {
        return read(&config_dir()?, name).map(Some);
    }
    let Ok(dir) = config_dir() else {
        return Ok(None);
    };
    match selected(&dir)? {
        Some(name) => read(&dir, &name).map(Some),
        None => Ok(None),
    }
}

/// Writes `bytes` to `path` with mode 0600, replacing it whole (a reader
/// never sees half a file).
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io_err("writing", &tmp, &e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| io_err("writing", &tmp, &e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("writing", path, &e))
}

fn make_dirs(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    let contexts = dir.join("contexts");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&contexts)
        .map_err(|e| io_err("creating", &contexts, &e))
}

fn absolute(flag: &str, p: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(p).map_err(|e| usage(format!("{flag}: {}: {e}", p.display())))
}

fn masked(secret: Option<&String>) -> Option<&'static str> {
    secret.map(|_| "********")
}

fn auth_kind(p: &Profile) -> &'static str {
    match (&p.token, &p.client_id, &p.client_cert) {
        (Some(_), _, _) => "token",
        (None, Some(_), _) => "client secret",
        (None, None, Some(_)) => "client certificate",
        (None, None, None) => "none",
    }
}

fn shown(name: &str, p: &Profile, current: bool) -> serde_json::Value {
    json!({
        "name": name,
        "current": current,
        "server": p.server,
        "description": p.description,
        "ca_cert": p.ca_cert,
        "client_cert": p.client_cert,
        "client_key": p.client_key,
        "token": masked(p.token.as_ref()),
        "client_id": p.client_id,
        "client_secret": masked(p.client_secret.as_ref()),
    })
}

/// Runs a `context` subcommand (no server involved).
pub(super) fn run(out: &Out, cmd: ContextCmd) -> Result<()> {
    let dir = config_dir()?;
    match cmd {
        ContextCmd::Add(a) => {
            check_name(&a.name)?;
            super::check_server_url(&a.server)?;
            let profile = Profile {
                server: a.server,
                description: a.description,
                ca_cert: a.ca_cert.map(|p| absolute("--ca-cert", &p)).transpose()?,
                client_cert: a
                    .client_cert
                    .map(|p| absolute("--client-cert", &p))
                    .transpose()?,
                client_key: a
                    .client_key
                    .map(|p| absolute("--client-key", &p))
                    .transpose()?,
                token: a.token,
                client_id: a.client_id,
                client_secret: a.client_secret,
            };
            make_dirs(&dir)?;
            let path = profile_path(&dir, &a.name);
            if path.exists() && !a.force {
                return Err(usage(format!(
                    "context {:?} exists (give --force to replace it)",
                    a.name
                )));
            }
            let text = serde_json::to_vec_pretty(&profile)
                .map_err(|e| usage(format!("context {:?}: {e}", a.name)))?;
            write_private(&path, &text)?;
            let select = a.select || selected(&dir)?.is_none();
            if select {
                write_private(&dir.join("current"), a.name.as_bytes())?;
            }
            if out.json {
                out.doc(&shown(&a.name, &profile, select));
            } else {
                say!(
                    "saved context {} ({}){}",
                    a.name,
                    path.display(),
                    if select { "; selected" } else { "" }
                );
            }
        }
        ContextCmd::Use { name } => {
            read(&dir, &name)?;
            make_dirs(&dir)?;
            write_private(&dir.join("current"), name.as_bytes())?;
            if !out.json {
                say!("using context {name}");
            }
        }
        ContextCmd::Ls => {
            let current = selected(&dir)?;
            let mut names = Vec::new();
            match std::fs::read_dir(dir.join("contexts")) {
                Ok(entries) => {
                    for e in entries.flatten() {
                        let file = e.file_name().to_string_lossy().into_owned();
                        if let Some(n) = file.strip_suffix(".json") {
                            names.push(n.to_string());
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("listing", &dir.join("contexts"), &e)),
            }
            names.sort();
            let mut rows = Vec::new();
            let mut docs = Vec::new();
            for n in &names {
                let p = read(&dir, n)?;
                let cur = current.as_deref() == Some(n.as_str());
                rows.push(vec![
                    format!("{}{n}", if cur { "* " } else { "  " }),
                    p.server.clone(),
                    auth_kind(&p).to_string(),
                    p.description.clone().unwrap_or_default(),
                ]);
                docs.push(shown(n, &p, cur));
            }
            if out.json {
                out.doc(&json!(docs));
            } else if rows.is_empty() {
                say!("no contexts (add one with `letterbox context add NAME --server URL`)");
            } else {
                out.table(&["  NAME", "SERVER", "AUTH", "DESCRIPTION"], &rows);
            }
        }
        ContextCmd::Show { name } => {
            let current = selected(&dir)?;
            let Some(name) = name.or_else(|| current.clone()) else {
                return Err(usage(
                    "no context selected (`letterbox context use NAME`, or name one)",
                ));
            };
            let p = read(&dir, &name)?;
            let doc = shown(&name, &p, current.as_deref() == Some(name.as_str()));
            if out.json {
                out.doc(&doc);
            } else if let Some(fields) = doc.as_object() {
                let pairs: Vec<(&str, String)> = fields
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        (
                            k.as_str(),
                            v.as_str().map_or_else(|| v.to_string(), str::to_string),
                        )
                    })
                    .collect();
                out.pairs(&pairs);
            }
        }
        ContextCmd::Rm { name } => {
            check_name(&name)?;
            let path = profile_path(&dir, &name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(usage(format!("no context named {name:?}")));
                }
                Err(e) => return Err(io_err("deleting", &path, &e)),
            }
            if selected(&dir)?.as_deref() == Some(name.as_str()) {
                let cur = dir.join("current");
                std::fs::remove_file(&cur).map_err(|e| io_err("deleting", &cur, &e))?;
            }
            if !out.json {
                say!("deleted context {name}");
            }
        }
    }
    Ok(())
}
