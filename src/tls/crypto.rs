//! The crypto provider every TLS path uses (listeners, upstream clients, ACME, session tickets),
//! chosen at build time: ring by default, aws-lc-rs with the `aws-lc` cargo feature. Issue 36 §4
//! asks for the faster of the two; BENCHMARKS.md "Stop 40: the TLS crypto provider" has the
//! measurements (callgrind's counts, `bench/tls-instructions.sh`, and native CPU per handshake)
//! that kept ring. One place, so a build never mixes the two.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ProducesTickets;

/// The provider (cipher suites, key exchange groups, signature verification, key loading).
pub fn provider() -> CryptoProvider {
    #[cfg(feature = "aws-lc")]
    {
        rustls::crypto::aws_lc_rs::default_provider()
    }
    #[cfg(not(feature = "aws-lc"))]
    {
        rustls::crypto::ring::default_provider()
    }
}

/// The same, shared.
pub fn shared() -> Arc<CryptoProvider> {
    Arc::new(provider())
}

/// A process-local ticketer with rotating keys (used when no fleet key file is configured).
pub fn ticketer() -> Result<Arc<dyn ProducesTickets>, rustls::Error> {
    #[cfg(feature = "aws-lc")]
    {
        rustls::crypto::aws_lc_rs::Ticketer::new()
    }
    #[cfg(not(feature = "aws-lc"))]
    {
        rustls::crypto::ring::Ticketer::new()
    }
}
