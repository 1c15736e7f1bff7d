//! Automatic certificates (ACME, RFC 8555) for `[server.tls.acme]`: what the listeners share
//! with the ordering task ([`state`]: issued certificates, pending HTTP-01 tokens and TLS-ALPN-01
//! certificates), the `storage` directory a fleet shares ([`storage`]: account, certificates,
//! lock files), the HTTP client to the directory ([`client`]), one order ([`order`]) and the
//! task that decides when to order ([`manager`]). The protocol itself is instant-acme's.

pub mod client;
pub mod manager;
pub mod order;
pub mod state;
pub mod storage;

pub use state::AcmeState;

/// Why an ACME step failed (logged; counted as `result="failed"`).
#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    /// The directory, the account or the order (instant-acme's error, with the server's
    /// problem document when there is one).
    #[error("ACME: {0}")]
    Protocol(#[from] instant_acme::Error),
    /// The order ended in a state other than ready/valid.
    #[error("ACME order {0}")]
    Order(String),
    /// Reading or writing `storage`.
    #[error("ACME storage {path}: {error}")]
    Storage { path: String, error: std::io::Error },
    /// A certificate that came back (or was stored) cannot be served.
    #[error("ACME certificate: {0}")]
    Certificate(String),
    /// The whole attempt took longer than [`manager::ATTEMPT_TIMEOUT`].
    #[error("ACME attempt timed out")]
    Timeout,
}
