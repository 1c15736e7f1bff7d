//! Client certificates (`[server.tls.client_auth]`): the verifier the handshake runs (a chain to
//! one of `ca`'s certificates, valid now, for client authentication, and not revoked by one of
//! `crl`'s lists), required or optional. A resumed session is verified again with it
//! ([`super::accept`]).
//!
//! With `crl`, every certificate of the chain but the trust anchor is checked (webpki's
//! default), and one whose issuer has no CRL in the list is refused (its status is unknown; as
//! nginx's `ssl_crl`), so every CA of `ca` must have its CRL listed — checked here, at load. A
//! CRL past its `nextUpdate` still applies (what it revokes stays revoked).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use super::{crl, TlsError};
use crate::config::{ClientAuthConfig, ClientAuthMode};

/// The key the CRL errors name.
const CRL_FIELD: &str = "server.tls.client_auth.crl";

/// The verifier for `c`, trusting the certificates of its `ca` bundle and applying its CRLs.
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
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|e| TlsError::File(file.clone(), e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::File(file, "no certificate found".to_owned()));
    }
    let roots = Arc::new(roots);
    let mut crls = Vec::new();
    let mut issuers = Vec::new();
    for (i, path) in c.crl.iter().enumerate() {
        let named = |message: String| TlsError::Config {
            field: format!("{CRL_FIELD}[{i}]"),
            message: format!("{}: {message}", path.display()),
        };
        let these = crl::read(path).map_err(named)?;
        // Parsed as the handshake will parse them, so a list webpki refuses is refused here,
        // with its file.
        WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .with_crls(these.iter().cloned())
            .build()
            .map_err(|e| named(format!("not a usable CRL: {e}")))?;
        for one in &these {
            issuers.push(crl::issuer(one).ok_or_else(|| named("not a usable CRL".to_owned()))?);
        }
        crls.extend(these);
    }
    if !crls.is_empty() {
        if let Some(subject) = crl::uncovered(&certs, &issuers) {
            return Err(TlsError::Config {
                field: CRL_FIELD.to_owned(),
                message: format!(
                    "no CRL of \"{subject}\", a CA of {file}: with `crl`, every CA of `ca` needs \
                     its CRL listed (a certificate whose revocation status is unknown is refused)"
                ),
            });
        }
    }
    let builder = WebPkiClientVerifier::builder_with_provider(roots, provider).with_crls(crls);
    let builder = match c.mode {
        ClientAuthMode::Required => builder,
        ClientAuthMode::Optional => builder.allow_unauthenticated(),
    };
    builder
        .build()
        .map_err(|e| TlsError::File(file, e.to_string()))
}
