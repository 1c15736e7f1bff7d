//! Why a handshake failed, as the bounded `reason` label of
//! `tollgate_tls_handshake_errors_total`. rustls's error (carried inside the `io::Error`
//! tokio-rustls returns) is mapped to a handful of reasons an operator can act on.

use std::io;

use rustls::{CertificateError, Error};

/// A failed handshake's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No complete handshake within `header_read_timeout`.
    Timeout,
    /// Not TLS, or a ClientHello (or later message) that is malformed or oversized.
    Malformed,
    /// A name no certificate serves (or none) with `unknown_sni = "reject"`.
    UnknownSni,
    /// Nothing in common: versions (`min_version`), cipher suites, groups, signature schemes.
    Incompatible,
    /// `client_auth.mode = "required"` and no certificate was sent.
    ClientCertMissing,
    /// A client certificate from a CA not in `client_auth.ca`.
    ClientCertUnknownCa,
    /// An expired (or not yet valid) client certificate.
    ClientCertExpired,
    /// A client certificate (or a CA of its chain) revoked by a `client_auth.crl` list.
    ClientCertRevoked,
    /// Any other invalid client certificate (wrong usage, a chain too long, a CA whose
    /// revocation status no CRL gives, …).
    ClientCertInvalid,
    /// The client ended the handshake with an alert (it did not trust our certificate, say).
    PeerAlert,
    Other,
}

impl Failure {
    /// The `reason` label (one of [`crate::metrics::TLS_HANDSHAKE_REASONS`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Malformed => "malformed",
            Failure::UnknownSni => "unknown_sni",
            Failure::Incompatible => "incompatible",
            Failure::ClientCertMissing => "client_cert_missing",
            Failure::ClientCertUnknownCa => "client_cert_unknown_ca",
            Failure::ClientCertExpired => "client_cert_expired",
            Failure::ClientCertRevoked => "client_cert_revoked",
            Failure::ClientCertInvalid => "client_cert_invalid",
            Failure::PeerAlert => "peer_alert",
            Failure::Other => "other",
        }
    }

    /// The reason of a handshake that ended in `e`; `None` for a peer that closed without
    /// finishing (a TCP health check, a client giving up), which is not counted.
    pub fn of(e: &io::Error) -> Option<Failure> {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return None;
        }
        let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<Error>()) else {
            return Some(Failure::Other);
        };
        Some(match tls {
            Error::InvalidMessage(_)
            | Error::InappropriateMessage { .. }
            | Error::InappropriateHandshakeMessage { .. }
            | Error::PeerMisbehaved(_)
            | Error::DecryptError => Failure::Malformed,
            Error::PeerIncompatible(_) => Failure::Incompatible,
            // What rustls says when the resolver (`unknown_sni = "reject"`) has no certificate.
            Error::General(m) if m.starts_with("no server certificate") => Failure::UnknownSni,
            Error::NoCertificatesPresented => Failure::ClientCertMissing,
            Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => Failure::ClientCertUnknownCa,
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => Failure::ClientCertExpired,
                CertificateError::Revoked => Failure::ClientCertRevoked,
                _ => Failure::ClientCertInvalid,
            },
            Error::AlertReceived(_) => Failure::PeerAlert,
            _ => Failure::Other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_the_declared_labels() {
        let all = [
            Failure::Timeout,
            Failure::Malformed,
            Failure::UnknownSni,
            Failure::Incompatible,
            Failure::ClientCertMissing,
            Failure::ClientCertUnknownCa,
            Failure::ClientCertExpired,
            Failure::ClientCertRevoked,
            Failure::ClientCertInvalid,
            Failure::PeerAlert,
            Failure::Other,
        ];
        let labels: Vec<&str> = all.iter().map(|f| f.as_str()).collect();
        assert_eq!(labels, crate::metrics::TLS_HANDSHAKE_REASONS);
    }

    #[test]
    fn rustls_errors_map_to_reasons() {
        let wrap = |e: Error| io::Error::new(io::ErrorKind::InvalidData, e);
        let cases = [
            (
                Error::General("no server certificate chain resolved".into()),
                Failure::UnknownSni,
            ),
            (
                Error::InvalidCertificate(CertificateError::UnknownIssuer),
                Failure::ClientCertUnknownCa,
            ),
            (
                Error::InvalidCertificate(CertificateError::Expired),
                Failure::ClientCertExpired,
            ),
            (
                Error::InvalidCertificate(CertificateError::Revoked),
                Failure::ClientCertRevoked,
            ),
            (Error::NoCertificatesPresented, Failure::ClientCertMissing),
            (
                Error::PeerIncompatible(rustls::PeerIncompatible::Tls13RequiredForQuic),
                Failure::Incompatible,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(Failure::of(&wrap(e)), Some(want));
        }
        assert_eq!(
            Failure::of(&io::Error::from(io::ErrorKind::UnexpectedEof)),
            None
        );
        assert_eq!(
            Failure::of(&io::Error::from(io::ErrorKind::ConnectionReset)),
            Some(Failure::Other)
        );
    }
}
