//! What the gateway asserts upstream about a verified client certificate: Envoy's
//! `X-Forwarded-Client-Cert` (XFCC) value, `Hash=<SHA-256 of the leaf, hex>;Subject="<subject
//! DN>";URI=<URI SAN>;DNS=<DNS SAN>` (one `URI=` / `DNS=` pair per name; the DN in the
//! certificate's order, as x509-parser writes it, where Envoy uses RFC 2253's reversed one). Built once per
//! connection, right after the handshake, so a request on it only clones a header value. The
//! header is always removed from what the client sent (`pipeline::edits`).

use http::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

/// The header the identity is forwarded in.
pub static X_FORWARDED_CLIENT_CERT: HeaderName = HeaderName::from_static("x-forwarded-client-cert");

/// The most bytes an XFCC value may have: a certificate with hundreds of SANs is not sent on.
const MAX_XFCC: usize = 8 << 10;

/// The XFCC value for the verified leaf certificate `der`; `None` when it cannot be parsed
/// (rustls verified it, so it can) or the value would be too long.
pub fn xfcc(der: &[u8]) -> Option<HeaderValue> {
    let mut out = String::from("Hash=");
    for b in Sha256::digest(der) {
        out.push_str(&format!("{b:02x}"));
    }
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    out.push_str(";Subject=\"");
    for c in cert.subject().to_string().chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::URI(u) => {
                    out.push_str(";URI=");
                    out.push_str(u);
                }
                x509_parser::extensions::GeneralName::DNSName(d) => {
                    out.push_str(";DNS=");
                    out.push_str(d);
                }
                _ => {}
            }
        }
    }
    if out.len() > MAX_XFCC {
        return None;
    }
    HeaderValue::from_str(&out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_has_the_hash_subject_and_names() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["acme.clients.test".to_owned()]).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "acme \"partner\"");
        p.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://example.org/partner/acme".try_into().unwrap(),
        ));
        let c = p.self_signed(&key).unwrap();
        let v = xfcc(c.der()).unwrap();
        let v = v.to_str().unwrap();
        let hash: String = Sha256::digest(c.der().as_ref())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(v.starts_with(&format!("Hash={hash};Subject=\"")), "{v}");
        assert!(v.contains("CN=acme \\\"partner\\\""), "{v}");
        assert!(v.contains(";DNS=acme.clients.test"), "{v}");
        assert!(v.contains(";URI=spiffe://example.org/partner/acme"), "{v}");
        assert!(xfcc(b"not a certificate").is_none());
    }
}
