//! The certificate for a handshake, chosen by the name the client asks for (SNI): the exact
//! name first, then a one-label wildcard (`*.example.com` covers `api.example.com`, not
//! `example.com` nor `a.b.example.com`, as RFC 6125 §6.4.3 has it), then the default — or
//! nothing with `unknown_sni = "reject"` (rustls then ends the handshake with an alert).
//! Names compare case-insensitively (rustls lower-cases the SNI) and a trailing dot is ignored.
//! A client that sends no SNI, or an IP address (which rustls ignores), gets what an unknown
//! name gets.
//!
//! Several certificates may serve one name (RSA and ECDSA, say): the first whose key can sign
//! with one of the client's signature schemes wins, ECDSA and EdDSA keys before RSA ones (they
//! are cheaper to sign with). Built once per (re)load; a lookup allocates nothing.
//!
//! With `[server.tls.acme]`, a certificate obtained for a name is chosen after the configured
//! exact names and before the wildcards (a configured file wins; an ACME name is exact). A
//! ClientHello that offers only the ALPN `acme-tls/1` is the ACME server validating
//! TLS-ALPN-01: it gets the challenge certificate for its name, or nothing.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureAlgorithm;

use super::certs::LoadedCert;

/// The certificates that may serve one name, preferred first.
type Candidates = Vec<Arc<CertifiedKey>>;

/// The SNI resolver of one configuration.
#[derive(Debug)]
pub struct SniResolver {
    exact: HashMap<String, Candidates>,
    /// By the parent domain: `*.example.com` is under `example.com`.
    wildcard: HashMap<String, Candidates>,
    /// `None` with `unknown_sni = "reject"`, or with no configured certificate.
    default: Option<Candidates>,
    /// The ACME task's certificates and challenge answers.
    acme: Option<Arc<super::acme::AcmeState>>,
}

/// ECDSA and EdDSA first: they sign faster than RSA, and every client that offers them can
/// use them.
fn preference(key: &CertifiedKey) -> u8 {
    match key.key.algorithm() {
        SignatureAlgorithm::ECDSA | SignatureAlgorithm::ED25519 | SignatureAlgorithm::ED448 => 0,
        _ => 1,
    }
}

impl SniResolver {
    /// `certs[0]` is the default certificate.
    pub fn new(certs: &[LoadedCert], reject_unknown: bool) -> SniResolver {
        let mut exact: HashMap<String, Candidates> = HashMap::new();
        let mut wildcard: HashMap<String, Candidates> = HashMap::new();
        let mut default: Candidates = Vec::new();
        for (i, c) in certs.iter().enumerate() {
            for name in &c.names {
                let (map, key) = match name.strip_prefix("*.") {
                    Some(parent) => (&mut wildcard, parent),
                    None => (&mut exact, name.as_str()),
                };
                let list = map.entry(key.to_owned()).or_default();
                if !list.iter().any(|k| Arc::ptr_eq(k, &c.key)) {
                    list.push(c.key.clone());
                }
            }
            // The default name's other key types (an RSA twin of the default ECDSA
            // certificate) serve unknown names too.
            if i == 0 || (!c.names.is_empty() && c.names == certs[0].names) {
                default.push(c.key.clone());
            }
        }
        for list in exact.values_mut().chain(wildcard.values_mut()) {
            list.sort_by_key(|k| preference(k));
        }
        default.sort_by_key(|k| preference(k));
        SniResolver {
            exact,
            wildcard,
            default: (!reject_unknown && !default.is_empty()).then_some(default),
            acme: None,
        }
    }

    /// Consults `acme`'s certificates too.
    pub fn with_acme(mut self, acme: Option<Arc<super::acme::AcmeState>>) -> SniResolver {
        self.acme = acme;
        self
    }

    /// The candidates for `sni` (already lower case, as rustls hands it).
    fn lookup(&self, sni: Option<&str>) -> Option<&Candidates> {
        if let Some(name) = sni {
            let name = name.strip_suffix('.').unwrap_or(name);
            if let Some(c) = self.exact.get(name) {
                return Some(c);
            }
            if let Some((_, parent)) = name.split_once('.') {
                if let Some(c) = self.wildcard.get(parent) {
                    return Some(c);
                }
            }
        }
        self.default.as_ref()
    }

    /// Whether `sni` is served by a certificate of its own (not the default's fallback).
    pub fn knows(&self, sni: &str) -> bool {
        let name = sni.strip_suffix('.').unwrap_or(sni);
        self.exact.contains_key(name)
            || name
                .split_once('.')
                .is_some_and(|(_, parent)| self.wildcard.contains_key(parent))
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(acme) = &self.acme {
            let name = hello
                .server_name()
                .map(|n| n.strip_suffix('.').unwrap_or(n));
            if let Some(mut alpn) = hello.alpn() {
                if alpn.next() == Some(super::acme::state::ACME_TLS_ALPN) && alpn.next().is_none() {
                    return acme.alpn_cert(name?);
                }
            }
            if let Some(name) = name {
                if !self.exact.contains_key(name) {
                    if let Some(key) = acme.issued(name) {
                        return Some(key);
                    }
                }
            }
        }
        let candidates = self.lookup(hello.server_name())?;
        let schemes = hello.signature_schemes();
        candidates
            .iter()
            .find(|k| k.key.choose_scheme(schemes).is_some())
            .or_else(|| candidates.first())
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(names: &[&str], ecdsa: bool) -> LoadedCert {
        // ring makes no RSA keys: Ed25519 stands for the second key type (the integration
        // tests serve a real RSA twin).
        let alg = if ecdsa {
            &rcgen::PKCS_ECDSA_P256_SHA256
        } else {
            &rcgen::PKCS_ED25519
        };
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params = rcgen::CertificateParams::new(vec!["x.test".to_owned()]).unwrap();
        let c = params.self_signed(&key).unwrap();
        let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let signer = crate::tls::crypto::provider()
            .key_provider
            .load_private_key(der)
            .unwrap();
        LoadedCert {
            key: Arc::new(CertifiedKey::new(vec![c.der().clone()], signer)),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            not_before: 0,
            not_after: 0,
            file_label: "x.pem".into(),
        }
    }

    #[test]
    fn exact_then_wildcard_then_default() {
        let certs = [
            cert(&["default.test"], true),
            cert(&["api.example.com"], true),
            cert(&["*.example.com"], true),
        ];
        let r = SniResolver::new(&certs, false);
        let pick = |sni: Option<&str>| {
            let c = r.lookup(sni).unwrap();
            certs
                .iter()
                .position(|l| Arc::ptr_eq(&l.key, &c[0]))
                .unwrap()
        };
        assert_eq!(pick(Some("api.example.com")), 1);
        assert_eq!(pick(Some("api.example.com.")), 1);
        assert_eq!(pick(Some("web.example.com")), 2);
        assert_eq!(pick(Some("example.com")), 0, "a wildcard covers one label");
        assert_eq!(
            pick(Some("a.b.example.com")),
            0,
            "a wildcard covers one label"
        );
        assert_eq!(pick(Some("other.test")), 0);
        assert_eq!(pick(None), 0);
        assert!(r.knows("web.example.com") && !r.knows("other.test"));

        let strict = SniResolver::new(&certs, true);
        assert!(strict.lookup(Some("other.test")).is_none());
        assert!(strict.lookup(None).is_none());
        assert!(strict.lookup(Some("api.example.com")).is_some());
    }

    #[test]
    fn the_clients_signature_schemes_choose_among_a_names_keys() {
        let certs = [cert(&["a.test"], false), cert(&["a.test"], true)];
        let r = SniResolver::new(&certs, false);
        let c = r.lookup(Some("a.test")).unwrap();
        assert_eq!(c.len(), 2);
        let pick = |schemes: &[rustls::SignatureScheme]| {
            let k = c.iter().find(|k| k.key.choose_scheme(schemes).is_some());
            certs
                .iter()
                .position(|l| Arc::ptr_eq(&l.key, k.unwrap()))
                .unwrap()
        };
        assert_eq!(pick(&[rustls::SignatureScheme::ED25519]), 0);
        assert_eq!(pick(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256]), 1);
        // Both serve names the default serves.
        assert_eq!(r.lookup(None).unwrap().len(), 2);
    }
}
