//! One connection's handshake: rustls's, then the check rustls does not make on a resumed
//! session.
//!
//! rustls resumes a session (a TLS 1.3 ticket, a TLS 1.2 ticket or session id) with the client
//! certificate chain it was made with, and does not run the client certificate verifier again
//! (it has no hook to refuse a session at resumption either). The keys of `ticket_key_file`
//! outlive a reload, and a ticket lives six hours, so without this check a session made before
//! `client_auth` changed — its CA removed from `ca`, its certificate listed in a `crl`,
//! `client_auth` added or made `"required"` — or before its certificate expired, would resume
//! as verified. So a resumed session's chain is verified again with the listener's current
//! verifier, the one a full handshake runs now (a chain to `ca`, valid now, not revoked), and a
//! session without a certificate is held to `mode = "required"`; a session that fails ends the
//! connection before a request is read, counted as a failed handshake by its reason. Without
//! `client_auth`, a certificate a resumed session carries is not taken as the client's identity
//! (no verifier vouches for it). A full handshake's certificate was just verified by rustls.
//!
//! The other way rustls allows — binding tickets to a digest of `client_auth`, so that a
//! session from before a change does not resume — would miss a certificate that expires while
//! its ticket is alive and depends on where sessions are kept; verifying again covers both, at
//! the cost of a chain verification per resumed handshake with a client certificate.

use std::io;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::{HandshakeKind, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};

use super::peer::PeerCert;

/// What a listener accepts connections with: the configuration loaded, and its client
/// certificate verifier (the same one the configuration's handshakes run).
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// A connection past its handshake, with the client's verified certificate.
pub struct Accepted<IO> {
    pub stream: tokio_rustls::server::TlsStream<IO>,
    /// The verified leaf's facts (mTLS); `None` without one.
    pub client_cert: Option<Arc<PeerCert>>,
}

impl Acceptor {
    pub fn new(server: Arc<ServerConfig>, verifier: Option<Arc<dyn ClientCertVerifier>>) -> Self {
        Acceptor {
            inner: tokio_rustls::TlsAcceptor::from(server),
            verifier,
        }
    }

    /// The handshake, then the resumed session's check. An error carries the
    /// [`rustls::Error`] that [`super::handshake::Failure::of`] reads the reason from.
    pub async fn accept<IO>(&self, io: IO) -> io::Result<Accepted<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let stream = self.inner.accept(io).await?;
        let conn = stream.get_ref().1;
        let chain = conn.peer_certificates();
        let chain = match conn.handshake_kind() {
            Some(HandshakeKind::Resumed) => match &self.verifier {
                Some(v) => {
                    resumed(v.as_ref(), chain, UnixTime::now())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    chain
                }
                None => None,
            },
            _ => chain,
        };
        let client_cert = chain
            .and_then(|c| c.first())
            .and_then(|leaf| PeerCert::of(leaf))
            .map(Arc::new);
        Ok(Accepted {
            stream,
            client_cert,
        })
    }
}

/// Whether a resumed session's client certificate `chain` (leaf first) passes `verifier` at
/// `now`, as a full handshake's would; a session without one passes unless the verifier makes
/// a certificate mandatory.
pub fn resumed(
    verifier: &dyn ClientCertVerifier,
    chain: Option<&[CertificateDer<'static>]>,
    now: UnixTime,
) -> Result<(), rustls::Error> {
    match chain.and_then(|c| c.split_first()) {
        Some((leaf, intermediates)) => verifier
            .verify_client_cert(leaf, intermediates, now)
            .map(|_| ()),
        None if verifier.client_auth_mandatory() => Err(rustls::Error::NoCertificatesPresented),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClientAuthConfig, ClientAuthMode};

    fn ca(cn: &str) -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let pem = p.self_signed(&key).unwrap().pem();
        (rcgen::Issuer::new(p, key), pem)
    }

    fn leaf(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, year: i32) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["c.test".to_owned()]).unwrap();
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(year, 1, 1);
        p.signed_by(&key, issuer).unwrap().der().clone()
    }

    fn verifier(pem: &str, mode: ClientAuthMode) -> Arc<dyn ClientCertVerifier> {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, pem).unwrap();
        let c = ClientAuthConfig {
            ca,
            mode,
            crl: Vec::new(),
        };
        crate::tls::client_auth::verifier(&c, crate::tls::crypto::shared()).unwrap()
    }

    #[test]
    fn a_resumed_session_is_held_to_the_current_verifier() {
        let (partners, partners_pem) = ca("Partners");
        let (others, others_pem) = ca("Others");
        let now = UnixTime::now();
        let good = [leaf(&partners, 2100)];
        let required = verifier(&partners_pem, ClientAuthMode::Required);
        assert!(resumed(required.as_ref(), Some(&good), now).is_ok());
        assert!(matches!(
            resumed(required.as_ref(), Some(&[leaf(&others, 2100)]), now),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))
        ));
        // Expired since the session was made.
        assert!(matches!(
            resumed(required.as_ref(), Some(&[leaf(&partners, 2021)]), now),
            Err(rustls::Error::InvalidCertificate(_))
        ));
        // No certificate: only an optional listener takes it.
        assert!(matches!(
            resumed(required.as_ref(), None, now),
            Err(rustls::Error::NoCertificatesPresented)
        ));
        assert!(matches!(
            resumed(required.as_ref(), Some(&[]), now),
            Err(rustls::Error::NoCertificatesPresented)
        ));
        let optional = verifier(&others_pem, ClientAuthMode::Optional);
        assert!(resumed(optional.as_ref(), None, now).is_ok());
        assert!(resumed(optional.as_ref(), Some(&good), now).is_err());
    }
}
