//! `letterbox tls init DIR`: TLS that works the first time. A local CA, a
//! server certificate it signs for the names given, and, if asked, a
//! client certificate for mTLS, written as PEM files with the flags that
//! use them. No server is involved.
//!
//! The usual `openssl req -x509` one-liner makes a CA certificate, which
//! clients refuse as a server's own; the server refuses it at start too
//! (`crate::edge::tls`). The certificates made here are an end-entity
//! certificate for the server, signed by a CA of its own, which the
//! clients trust with `--ca-cert`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::output::Out;
use super::usage;
use crate::client::{ClientError, Code, ErrorKind, Result};

/// TLS commands.
#[derive(Debug, Subcommand)]
pub enum TlsCmd {
    /// Make a local CA, a server certificate it signs (and a client
    /// certificate with --client), as PEM files in DIR.
    Init(InitArgs),
}

/// Flags of `tls init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Directory for the files (created with mode 0700 if missing):
    /// ca.pem, ca.key, server.pem, server.key, and client.pem,
    /// client.key with --client.
    dir: PathBuf,
    /// A host name or IP address the server certificate is made out for
    /// (repeatable); clients must connect with one of them [default:
    /// localhost, 127.0.0.1 and ::1].
    #[arg(long = "name", value_name = "HOST")]
    names: Vec<String>,
    /// Also make a client certificate (for mTLS) with this common name.
    #[arg(long, value_name = "NAME")]
    client: Option<String>,
    /// Days the server and client certificates are valid (the CA: ten
    /// times as long).
    #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
    /// Replace files of the same names in DIR.
    #[arg(long)]
    force: bool,
}

/// The names a server certificate is made out for by default.
const DEFAULT_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The files one `tls init` writes.
struct Made {
    ca_cert: String,
    ca_key: String,
    server_cert: String,
    server_key: String,
    /// The client certificate, its key and its SHA-256 (hex, of its DER).
    client: Option<(String, String, String)>,
}

fn failed(what: &str, e: impl std::fmt::Display) -> ClientError {
    ClientError::new(
        ErrorKind::Rpc(Code::FailedPrecondition),
        format!("{what}: {e}"),
    )
}

/// The calendar date `days` from today (negative: before), UTC, for a
/// certificate's validity.
fn date_from_today(days: i64) -> Result<(i32, u8, u8)> {
    use chrono::Datelike as _;
    let date = chrono::Utc::now()
        .date_naive()
        .checked_add_signed(chrono::TimeDelta::days(days))
        .ok_or_else(|| usage(format!("--days {days}: out of range")))?;
    let part = |v: u32| u8::try_from(v).map_err(|e| failed("the date", e));
    Ok((date.year(), part(date.month())?, part(date.day())?))
}

/// Sets a certificate's validity: from yesterday (clocks a little behind
/// still accept it) to `days` from today.
fn valid_for(params: &mut CertificateParams, days: i64) -> Result<()> {
    let (y, m, d) = date_from_today(-1)?;
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = date_from_today(days)?;
    params.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(())
}

/// Makes the certificates (nothing written yet).
fn make(names: &[String], client: Option<&str>, days: u32) -> Result<Made> {
    let cert_err = |what: &'static str| move |e: rcgen::Error| failed(what, e);
    let days = i64::from(days);
    let ca_key = KeyPair::generate().map_err(cert_err("a key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(cert_err("the CA"))?;
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "Letterbox local CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    valid_for(&mut ca, days.saturating_mul(10))?;
    let ca_cert = ca.self_signed(&ca_key).map_err(cert_err("the CA"))?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().map_err(cert_err("a key"))?;
    let mut server = CertificateParams::new(names.to_vec())
        .map_err(|e| usage(format!("--name: {e} (give host names or IP addresses)")))?;
    server.distinguished_name = rcgen::DistinguishedName::new();
    server
        .distinguished_name
        .push(DnType::CommonName, names.first().map_or("letterbox", |n| n));
    server.is_ca = IsCa::ExplicitNoCa;
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.use_authority_key_identifier_extension = true;
    valid_for(&mut server, days)?;
    let server_cert = server
        .signed_by(&server_key, &issuer)
        .map_err(cert_err("the server certificate"))?;

    let client = match client {
        None => None,
        Some(name) => {
            let key = KeyPair::generate().map_err(cert_err("a key"))?;
            let mut params = CertificateParams::new(Vec::<String>::new())
                .map_err(cert_err("the client certificate"))?;
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::ExplicitNoCa;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            params.use_authority_key_identifier_extension = true;
            valid_for(&mut params, days)?;
            let cert = params
                .signed_by(&key, &issuer)
                .map_err(cert_err("the client certificate"))?;
            let digest: String = Sha256::digest(cert.der())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            Some((cert.pem(), key.serialize_pem(), digest))
        }
    };
    Ok(Made {
        ca_cert: ca_cert.pem(),
        ca_key: ca_key_pem,
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        client,
    })
}

/// Writes `text` to `path`: keys with mode 0600, certificates 0644;
/// `force` replaces a file that exists.
fn write(path: &Path, text: &str, private: bool, force: bool) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(if private { 0o600 } else { 0o644 });
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            usage(format!(
                "{} exists (give --force to replace it)",
                path.display()
            ))
        } else {
            failed(&format!("writing {}", path.display()), e)
        }
    })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| failed(&format!("writing {}", path.display()), e))
}

/// Runs a `tls` subcommand.
pub(super) fn run(out: &Out, cmd: TlsCmd) -> Result<()> {
    let TlsCmd::Init(a) = cmd;
    let names: Vec<String> = if a.names.is_empty() {
        DEFAULT_NAMES.iter().map(|n| n.to_string()).collect()
    } else {
        a.names.clone()
    };
    if let Some(bad) = names
        .iter()
        .find(|n| n.trim().is_empty() || n.contains('/'))
    {
        return Err(usage(format!(
            "--name {bad:?}: give a host name or an IP address"
        )));
    }
    let made = make(&names, a.client.as_deref(), a.days)?;
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&a.dir)
            .map_err(|e| failed(&format!("creating {}", a.dir.display()), e))?;
    }
    let at = |file: &str| a.dir.join(file);
    let mut files = vec![
        (at("ca.pem"), made.ca_cert.as_str(), false),
        (at("ca.key"), made.ca_key.as_str(), true),
        (at("server.pem"), made.server_cert.as_str(), false),
        (at("server.key"), made.server_key.as_str(), true),
    ];
    if let Some((cert, key, _)) = &made.client {
        files.push((at("client.pem"), cert.as_str(), false));
        files.push((at("client.key"), key.as_str(), true));
    }
    // Nothing is written when any file is in the way.
    if !a.force
        && let Some((path, _, _)) = files.iter().find(|(p, _, _)| p.exists())
    {
        return Err(usage(format!(
            "{} exists (give --force to replace it)",
            path.display()
        )));
    }
    for (path, text, private) in &files {
        write(path, text, *private, a.force)?;
    }
    let shown = |file: &str| at(file).display().to_string();
    let mut serve = format!(
        "letterbox serve --tls-cert {} --tls-key {}",
        shown("server.pem"),
        shown("server.key")
    );
    let mut connect = format!(
        "letterbox queue list --server https://{}:50051 --ca-cert {}",
        url_host(names.first().map_or("localhost", |n| n)),
        shown("ca.pem")
    );
    if made.client.is_some() {
        serve.push_str(&format!(" --tls-client-ca {}", shown("ca.pem")));
        connect.push_str(&format!(
            " --client-cert {} --client-key {}",
            shown("client.pem"),
            shown("client.key")
        ));
    }
    let digest = made.client.as_ref().map(|(_, _, d)| d.clone());
    if out.json {
        out.doc(&json!({
            "dir": a.dir,
            "names": names,
            "days": a.days,
            "ca_cert": shown("ca.pem"),
            "ca_key": shown("ca.key"),
            "server_cert": shown("server.pem"),
            "server_key": shown("server.key"),
            "client_cert": made.client.as_ref().map(|_| shown("client.pem")),
            "client_key": made.client.as_ref().map(|_| shown("client.key")),
            "client_cert_sha256": digest,
            "serve": serve,
            "connect": connect,
        }));
        return Ok(());
    }
    say!(
        "wrote {}: the CA's certificate; clients trust it with --ca-cert",
        shown("ca.pem")
    );
    say!(
        "wrote {}: the CA's private key (mode 0600); keep it safe, or delete it once you need no more certificates",
        shown("ca.key")
    );
    say!(
        "wrote {}: the server's certificate, for {}, valid {} days",
        shown("server.pem"),
        names.join(", "),
        a.days
    );
    say!("wrote {}: its private key (mode 0600)", shown("server.key"));
    if let (Some(name), Some(d)) = (&a.client, &digest) {
        say!(
            "wrote {}: a client certificate for {name:?} (its SHA-256: {d})",
            shown("client.pem")
        );
        say!("wrote {}: its private key (mode 0600)", shown("client.key"));
    }
    say!("serve with:   {serve}");
    say!("connect with: {connect}");
    if let Some(d) = digest {
        say!("a principal that signs in with the client certificate: cert_sha256 = [\"{d}\"]");
    }
    Ok(())
}

/// A host as written in a URL (an IPv6 address in brackets).
fn url_host(name: &str) -> String {
    if name.contains(':') {
        format!("[{name}]")
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_certificate_is_not_a_ca_and_the_ca_is() {
        let made = make(&["localhost".into(), "10.0.0.7".into()], Some("edge"), 30).unwrap();
        crate::edge::tls::check_server_cert(made.server_cert.as_bytes()).unwrap();
        assert!(crate::edge::tls::check_server_cert(made.ca_cert.as_bytes()).is_err());
        let (_, _, digest) = made.client.unwrap();
        assert_eq!(digest.len(), 64);
    }
}
