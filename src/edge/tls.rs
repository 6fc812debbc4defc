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
