//! TLS to `https://` upstreams with rustls: the trust roots (the platform's, read once per
//! process, plus a group's `tls.ca`), hostname verification by rustls's WebPKI verifier, and the
//! `verify = false` escape hatch (which still checks the handshake's signatures, only not who
//! signed the certificate or for which name).

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::upstream::UpstreamTls;

fn provider() -> Arc<CryptoProvider> {
    crate::tls::crypto::shared()
}

/// The platform's trust roots, read once per process (a reload does not re-read them).
fn platform_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "cannot read some of the platform's trust roots");
        }
        if found.certs.is_empty() {
            tracing::warn!("no platform trust roots found: https:// upstreams verify only against a group's tls.ca");
        }
        found.certs
    })
}

/// Reads the certificates of a PEM file; errors name the file.
fn read_ca(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read CA file {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid CA file {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "no certificate found in CA file {}",
            path.display()
        ));
    }
    Ok(certs)
}

/// The rustls client configuration of a group: ALPN `http/1.1` (so that upgrades such as
/// WebSocket work the same over TLS), or `h2` alone for a group with `protocol = "h2"` (a
/// server that does not agree to it fails the handshake's check in `connect`).
pub fn client_config(t: &UpstreamTls, h2: bool) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let mut cfg = if t.verify {
        let mut roots = RootCertStore::empty();
        // Some platform stores hold certificates rustls cannot use: skip those, keep the rest.
        let _ = roots.add_parsable_certificates(platform_roots().iter().cloned());
        if let Some(ca) = &t.ca {
            for cert in read_ca(ca)? {
                roots.add(cert).map_err(|e| {
                    format!("unusable certificate in CA file {}: {e}", ca.display())
                })?;
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        // Still read the CA file: a missing file is a config error either way.
        if let Some(ca) = &t.ca {
            read_ca(ca)?;
        }
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerifier(provider())))
            .with_no_client_auth()
    };
    cfg.alpn_protocols = if h2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(Arc::new(cfg))
}

/// The name a group's connections send as SNI and verify the certificate against:
/// `tls.server_name`, or else the server's host.
pub fn server_name(
    t: &UpstreamTls,
    authority: &http::uri::Authority,
) -> Result<ServerName<'static>, String> {
    let host = match &t.server_name {
        Some(n) => n.as_str(),
        None => authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']'),
    };
    ServerName::try_from(host.to_owned()).map_err(|_| format!("{host:?} is not a valid TLS name"))
}

/// `verify = false`: any certificate, any name. The handshake's signatures are still checked.
#[derive(Debug)]
struct NoVerifier(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
