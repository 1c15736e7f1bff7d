//! One configured certificate loaded: the chain and key read from their PEM files, the key
//! checked against the leaf (so `tollgate check` refuses a pair that does not fit, naming the
//! files), and what the leaf says that the resolver and the expiry gauge need — its DNS names
//! and its `notAfter`. Parsed once at load, never per handshake.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::TlsError;
use crate::config::TlsCert;

/// A certificate ready to serve.
pub struct LoadedCert {
    pub key: Arc<CertifiedKey>,
    /// The names it serves (lower case, no trailing dot; `*.` for a wildcard): as configured,
    /// else the leaf's DNS names.
    pub names: Vec<String>,
    /// The leaf's `notBefore`, Unix seconds (when an ACME certificate is renewed).
    pub not_before: i64,
    /// The leaf's `notAfter`, Unix seconds.
    pub not_after: i64,
    /// What the expiry gauge calls it when it serves no name: the certificate file's name.
    pub file_label: String,
}

/// Reads `c`'s files with `provider`'s key loader.
pub fn load(c: &TlsCert, provider: &CryptoProvider) -> Result<LoadedCert, TlsError> {
    let file = |p: &std::path::Path| p.display().to_string();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&c.cert)
        .map_err(|e| TlsError::File(file(&c.cert), e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::File(file(&c.cert), e.to_string()))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::File(
            file(&c.cert),
            "no certificate found".to_owned(),
        ));
    };
    let facts = leaf_facts(leaf).map_err(|e| TlsError::File(file(&c.cert), e))?;
    let der = PrivateKeyDer::from_pem_file(&c.key)
        .map_err(|e| TlsError::File(file(&c.key), e.to_string()))?;
    let signer = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| TlsError::File(file(&c.key), e.to_string()))?;
    let key = CertifiedKey::new(chain, signer);
    match key.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(_) => {
            return Err(TlsError::KeyMismatch {
                key: file(&c.key),
                cert: file(&c.cert),
            })
        }
    }
    let names = match &c.names {
        Some(n) => n.clone(),
        None => facts.dns_names,
    };
    Ok(LoadedCert {
        key: Arc::new(key),
        names,
        not_before: facts.not_before,
        not_after: facts.not_after,
        file_label: c
            .cert
            .file_name()
            .map_or_else(|| file(&c.cert), |f| f.to_string_lossy().into_owned()),
    })
}

/// What the resolver needs from a leaf certificate.
struct LeafFacts {
    dns_names: Vec<String>,
    not_before: i64,
    not_after: i64,
}

fn leaf_facts(der: &CertificateDer<'_>) -> Result<LeafFacts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("the first certificate cannot be parsed: {e}"))?;
    let mut dns_names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                let d = crate::config::tls::normalize_name(d);
                if !dns_names.contains(&d) {
                    dns_names.push(d);
                }
            }
        }
    }
    Ok(LeafFacts {
        dns_names,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}
