//! The subject parts read from a verified client certificate (`tls:fingerprint`,
//! `tls:subject_cn`, `tls:san_dns`, `tls:san_uri`): each borrows a field of the connection's
//! [`PeerCert`], worked out at the handshake, so a request computes nothing. A SAN part is the
//! certificate's *first* name of that kind (its order as issued): a partner's certificate
//! usually carries one SPIFFE ID, and counting by "any of them" would give one request several
//! subjects. No certificate, or a certificate without that field: the part is missing, and the
//! limit's `on_missing` decides, as for an absent header.

use super::peer::PeerCert;
use crate::config::TlsPart;

/// The bytes of `part` in the certificate `cert`; `None` when there is no certificate or it
/// lacks the field.
pub fn part(part: TlsPart, cert: Option<&PeerCert>) -> Option<&[u8]> {
    let cert = cert?;
    let text: &str = match part {
        TlsPart::Fingerprint => &cert.fingerprint,
        TlsPart::SubjectCn => cert.subject_cn.as_deref()?,
        TlsPart::SanDns => cert.san_dns.first()?,
        TlsPart::SanUri => cert.san_uri.first()?,
    };
    (!text.is_empty()).then_some(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_reads_its_field_and_is_missing_without_it() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["a.test".into(), "b.test".into()]).unwrap();
        p.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://example.org/a".try_into().unwrap(),
        ));
        p.distinguished_name.push(rcgen::DnType::CommonName, "acme");
        let c = PeerCert::of(p.self_signed(&key).unwrap().der()).unwrap();
        let s = |t| part(t, Some(&c)).map(|b| std::str::from_utf8(b).unwrap().to_owned());
        assert_eq!(s(TlsPart::Fingerprint).as_deref(), Some(&*c.fingerprint));
        assert_eq!(s(TlsPart::SubjectCn).as_deref(), Some("acme"));
        assert_eq!(s(TlsPart::SanDns).as_deref(), Some("a.test"));
        assert_eq!(
            s(TlsPart::SanUri).as_deref(),
            Some("spiffe://example.org/a")
        );
        assert_eq!(part(TlsPart::Fingerprint, None), None);
        // No URI SAN, no CN: missing.
        let bare = rcgen::CertificateParams::new(vec!["c.test".into()]).unwrap();
        let mut bare = bare;
        bare.distinguished_name = rcgen::DistinguishedName::new();
        let c = PeerCert::of(bare.self_signed(&key).unwrap().der()).unwrap();
        assert_eq!(part(TlsPart::SanUri, Some(&c)), None);
        assert_eq!(part(TlsPart::SubjectCn, Some(&c)), None);
    }
}
