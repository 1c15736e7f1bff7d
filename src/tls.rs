//! TLS termination with rustls: certificate loading (re-read on reload) and ALPN `h2`/`http/1.1`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

use crate::config::TlsConfig;

/// Loads the certificate chain and key named in `[server.tls]`; errors name the file.
pub fn load(t: &TlsConfig) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&t.cert)
        .map_err(|e| format!("cannot read certificate file {}: {e}", t.cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid certificate file {}: {e}", t.cert.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate found in {}", t.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&t.key)
        .map_err(|e| format!("cannot read private key file {}: {e}", t.key.display()))?;
    let mut cfg =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                format!(
                    "certificate {} does not fit key {}: {e}",
                    t.cert.display(),
                    t.key.display()
                )
            })?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The current TLS configuration, swapped on reload.
pub struct TlsReloader {
    current: ArcSwap<ServerConfig>,
}

impl TlsReloader {
    pub fn new(t: &TlsConfig) -> Result<TlsReloader, String> {
        Ok(TlsReloader {
            current: ArcSwap::new(load(t)?),
        })
    }

    /// Re-reads the files; on error the previous certificate stays in use.
    pub fn reload(&self, t: &TlsConfig) -> Result<(), String> {
        self.current.store(load(t)?);
        Ok(())
    }

    /// An acceptor with the current certificate.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }
}
