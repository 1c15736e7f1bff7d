//! What the gateway knows of a verified client certificate ([`PeerCert`]), worked out once per
//! connection right after the handshake, so a request on it reads fields and clones one header
//! value: the leaf's SHA-256 fingerprint, its subject CN, its DNS and URI SANs, and what is
//! asserted upstream about it, Envoy's `X-Forwarded-Client-Cert` (XFCC) value,
//! `Hash=<SHA-256 of the leaf, hex>;Subject="<subject DN>";URI=<URI SAN>;DNS=<DNS SAN>` (one
//! `URI=` / `DNS=` pair per name; the DN in the certificate's order, as x509-parser writes it,
//! where Envoy uses RFC 2253's reversed one). The header is always removed from what the client
//! sent (`pipeline::edits`). A plain-TCP connection, or one without a client certificate, has
//! none (`None`: nothing is allocated).

use http::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

/// The header the identity is forwarded in.
pub static X_FORWARDED_CLIENT_CERT: HeaderName = HeaderName::from_static("x-forwarded-client-cert");

/// The most bytes an XFCC value may have: a certificate with hundreds of SANs is not sent on.
const MAX_XFCC: usize = 8 << 10;

/// The most SANs of each kind kept (a subject part reads the first; the rest are for XFCC).
const MAX_NAMES: usize = 64;

/// The SHA-256 of a certificate's DER: what `cert_sha256` in the consumers file names.
pub type CertHash = [u8; 32];

/// A verified client certificate's facts (the leaf's), shared by every request of its
/// connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The SHA-256 of the leaf's DER, 64 lower-case hex digits (what `cert_sha256` and
    /// `tls:fingerprint` match).
    pub fingerprint: Box<str>,
    /// The same, as bytes (the consumers table's key).
    pub sha256: CertHash,
    /// The subject's first common name, when it has one.
    pub subject_cn: Option<Box<str>>,
    /// The DNS names of its subjectAltName, in the certificate's order.
    pub san_dns: Vec<Box<str>>,
    /// The URIs of its subjectAltName (SPIFFE IDs), in the certificate's order.
    pub san_uri: Vec<Box<str>>,
    /// The `X-Forwarded-Client-Cert` value; `None` when it would be too long or not a header
    /// value (the header is then removed, not sent).
    pub xfcc: Option<HeaderValue>,
}

impl PeerCert {
    /// The facts of the verified leaf certificate `der`; `None` when it cannot be parsed
    /// (rustls verified it, so it can).
    pub fn of(der: &[u8]) -> Option<PeerCert> {
        let sha256: [u8; 32] = Sha256::digest(der).into();
        let fingerprint = crate::hex::encode(&sha256).into_boxed_str();
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject_cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(Box::from);
        let mut san_dns = Vec::new();
        let mut san_uri = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    x509_parser::extensions::GeneralName::URI(u) if san_uri.len() < MAX_NAMES => {
                        san_uri.push(Box::from(*u));
                    }
                    x509_parser::extensions::GeneralName::DNSName(d)
                        if san_dns.len() < MAX_NAMES =>
                    {
                        san_dns.push(Box::from(*d));
                    }
                    _ => {}
                }
            }
        }
        let mut out = String::from("Hash=");
        out.push_str(&fingerprint);
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
        let xfcc = if out.len() > MAX_XFCC {
            None
        } else {
            HeaderValue::from_str(&out).ok()
        };
        Some(PeerCert {
            fingerprint,
            sha256,
            subject_cn,
            san_dns,
            san_uri,
            xfcc,
        })
    }
}

/// The XFCC value for the verified leaf certificate `der` (see [`PeerCert::xfcc`]).
pub fn xfcc(der: &[u8]) -> Option<HeaderValue> {
    PeerCert::of(der)?.xfcc
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
        let p = PeerCert::of(c.der()).unwrap();
        assert_eq!(&*p.fingerprint, hash);
        assert_eq!(p.subject_cn.as_deref(), Some("acme \"partner\""));
        assert_eq!(p.san_dns, vec![Box::from("acme.clients.test")]);
        assert_eq!(
            p.san_uri,
            vec![Box::from("spiffe://example.org/partner/acme")]
        );
    }
}
