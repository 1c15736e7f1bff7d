//! Certificate revocation lists (`[server.tls.client_auth] crl`): read from PEM (`X509 CRL`
//! blocks, as `openssl ca -gencrl` writes) or DER (as CAs publish them), and checked against
//! the `ca` bundle when loaded — every CA of `ca` has a CRL, since the verifier refuses a
//! certificate whose revocation status it cannot know.

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};

/// The CRLs of one file, in its order.
pub fn read(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("the file is empty".to_owned());
    }
    let crls: Vec<CertificateRevocationListDer<'static>> =
        if bytes.starts_with(b"-----") || bytes.windows(11).any(|w| w == b"-----BEGIN ") {
            CertificateRevocationListDer::pem_slice_iter(&bytes)
                .collect::<Result<_, pem::Error>>()
                .map_err(|e| e.to_string())?
        } else {
            vec![CertificateRevocationListDer::from(bytes)]
        };
    if crls.is_empty() {
        return Err("no CRL found (a PEM `X509 CRL` block, or DER)".to_owned());
    }
    Ok(crls)
}

/// The raw DER of a CRL's issuer name; `None` when it does not parse.
pub fn issuer(crl: &CertificateRevocationListDer<'_>) -> Option<Vec<u8>> {
    let (_, c) = x509_parser::parse_x509_crl(crl.as_ref()).ok()?;
    Some(c.issuer().as_raw().to_vec())
}

/// The first certificate of `ca` (its subject, as text) that no CRL of `issuers` was issued by.
pub fn uncovered(ca: &[CertificateDer<'_>], issuers: &[Vec<u8>]) -> Option<String> {
    ca.iter().find_map(|cert| {
        let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let subject = c.subject();
        (!issuers.iter().any(|i| i.as_slice() == subject.as_raw())).then(|| subject.to_string())
    })
}
