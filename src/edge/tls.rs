//! TLS settings of the listeners ([`TlsConfig`]), and the acceptor of the
//! HTTP listeners built from them (the gRPC front end builds its own from
//! the same settings).

use std::sync::Arc;

/// TLS settings of the gRPC listener (PEM contents); the HTTP listeners
/// serve the same certificate, without client certificates.
#[derive(Clone)]
pub struct TlsConfig {
    /// The server's certificate chain.
    pub cert_pem: Vec<u8>,
    /// The server's private key.
    pub key_pem: Vec<u8>,
    /// CA certificates that sign client certificates; with it, clients
    /// may present certificates (mTLS).
    pub client_ca_pem: Option<Vec<u8>>,
    /// Refuse connections without a valid client certificate.
    pub require_client_cert: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("client_ca", &self.client_ca_pem.is_some())
            .field("require_client_cert", &self.require_client_cert)
            .finish_non_exhaustive()
    }
}

/// TLS for the HTTP listeners (REST, console, metrics): the server's
/// certificate, HTTP/1.1, no client certificates. An error says what
/// could not be used.
pub(crate) fn http_acceptor(tls: &TlsConfig) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(&tls.key_pem).map_err(|e| format!("the private key: {e}"))?;
    let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| e.to_string())?;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(c)))
}

/// Checks the server's own certificate (the first of `--tls-cert`'s
/// chain): a CA certificate (basic constraints `CA:TRUE`, what the usual
/// `openssl req -x509` one-liner makes) is refused, since every client
/// refuses it as a server's own certificate; the error says what to do
/// instead.
pub(crate) fn check_server_cert(cert_pem: &[u8]) -> Result<(), String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let first = CertificateDer::pem_slice_iter(cert_pem)
        .next()
        .ok_or("no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)")?
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    match is_ca(&first) {
        Ok(false) => Ok(()),
        Ok(true) => Err(
            "it is a CA certificate (basic constraints CA:TRUE), which clients refuse as a server's own; \
             give a server certificate signed by that CA, or make a CA and a server certificate signed by it \
             with `letterbox tls init DIR --name HOST`"
                .into(),
        ),
        Err(e) => Err(format!("the certificate does not parse as X.509: {e}")),
    }
}

/// OID of the basic constraints extension (RFC 5280, 4.2.1.9).
const BASIC_CONSTRAINTS: [u64; 4] = [2, 5, 29, 19];

/// Whether a DER certificate is a CA's: its basic constraints extension
/// says `cA: TRUE`.
fn is_ca(der: &[u8]) -> Result<bool, yasna::ASN1Error> {
    use yasna::Tag;
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    let extensions = yasna::parse_ber(der, |r| {
        r.read_sequence(|r| {
            // TBSCertificate: [0] version, serial, signature, issuer,
            // validity, subject, key, [1], [2], [3] extensions.
            let found = r.next().read_sequence(|r| {
                let mut found = None;
                while let Some(v) = r.read_optional(|r| r.read_tagged_der())? {
                    if v.tag() == Tag::context(3) {
                        found = Some(v.value().to_vec());
                    }
                }
                Ok(found)
            })?;
            r.next().read_der()?;
            r.next().read_der()?;
            Ok(found)
        })
    })?;
    let Some(extensions) = extensions else {
        return Ok(false);
    };
    // Extension ::= SEQUENCE { extnID, critical BOOLEAN DEFAULT FALSE, extnValue OCTET STRING }
    let all = yasna::parse_ber(&extensions, |r| {
        r.collect_sequence_of(|r| {
            r.read_sequence(|r| {
                let id = r.next().read_oid()?;
                r.read_optional(|r| r.read_bool())?;
                let value = r.next().read_bytes()?;
                Ok((id, value))
            })
        })
    })?;
    let Some((_, value)) = all
        .iter()
        .find(|(id, _)| id.components().as_slice() == BASIC_CONSTRAINTS)
    else {
        return Ok(false);
    };
    // BasicConstraints ::= SEQUENCE { cA BOOLEAN DEFAULT FALSE, pathLenConstraint INTEGER OPTIONAL }
    yasna::parse_ber(value, |r| {
        r.read_sequence(|r| {
            let ca = r.read_optional(|r| r.read_bool())?.unwrap_or(false);
            r.read_optional(|r| r.read_der())?;
            Ok(ca)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(ca: bool, with_path_len: bool) -> String {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.is_ca = match (ca, with_path_len) {
            (true, false) => IsCa::Ca(BasicConstraints::Unconstrained),
            (true, true) => IsCa::Ca(BasicConstraints::Constrained(0)),
            (false, _) => IsCa::ExplicitNoCa,
        };
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_ca_certificate_is_refused_as_the_servers_own() {
        for path_len in [false, true] {
            let e = check_server_cert(cert(true, path_len).as_bytes()).unwrap_err();
            assert!(e.contains("CA certificate"), "{e}");
            assert!(e.contains("letterbox tls init"), "{e}");
        }
        check_server_cert(cert(false, false).as_bytes()).unwrap();
        // No basic constraints at all: an end entity.
        let key = rcgen::KeyPair::generate().unwrap();
        let plain = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        check_server_cert(plain.as_bytes()).unwrap();
        let e = check_server_cert(b"not pem").unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
    }
}
