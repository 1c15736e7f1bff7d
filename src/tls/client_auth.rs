//! Client certificates (`[server.tls.client_auth]`): the verifier the handshake runs (a chain to
//! one of `ca`'s certificates, valid now, for client authentication), required or optional.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use super::TlsError;
use crate::config::{ClientAuthConfig, ClientAuthMode};

/// The verifier for `c`, trusting the certificates of its `ca` bundle.
pub fn verifier(
    c: &ClientAuthConfig,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let file = c.ca.display().to_string();
    let mut roots = RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&c.ca)
        .map_err(|e| TlsError::File(file.clone(), e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::File(file.clone(), e.to_string()))?;
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| TlsError::File(file.clone(), e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::File(file, "no certificate found".to_owned()));
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = match c.mode {
        ClientAuthMode::Required => builder,
        ClientAuthMode::Optional => builder.allow_unauthenticated(),
    };
    builder
        .build()
        .map_err(|e| TlsError::File(file, e.to_string()))
}
