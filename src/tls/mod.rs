//! TLS termination with rustls: the certificates by name ([`certs`], [`resolver`]), client
//! certificates ([`client_auth`]), resumption ([`tickets`]), the reasons a handshake fails
//! ([`handshake`]), the client's identity forwarded upstream ([`peer`]), and the listener's current configuration, rebuilt on reload
//! ([`TlsReloader`]). ALPN offers `h2` and `http/1.1`; 0-RTT is off (early data can be
//! replayed, and a rate limiter must not count a replay as a new request).

pub mod certs;
pub mod client_auth;
pub mod handshake;
pub mod peer;
pub mod resolver;
pub mod tickets;

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache};
use rustls::ServerConfig;

use crate::config::{TlsConfig, TlsVersion, UnknownSni};

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM.
    #[error("{0}: {1}")]
    File(String, String),
    /// A key that is not the certificate's.
    #[error("the private key {key} does not fit the certificate {cert}")]
    KeyMismatch { key: String, cert: String },
    /// rustls refused the settings.
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// The crypto provider every TLS listener uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A configuration loaded: what the acceptor serves, and when each name's certificate expires.
pub struct Loaded {
    pub server: Arc<ServerConfig>,
    /// Each served name (or, for a certificate serving none, its file name) with the soonest
    /// `notAfter` (Unix seconds) of the certificates serving it.
    pub expiry: BTreeMap<String, i64>,
}

/// Loads every file `[server.tls]` names; errors name the file.
pub fn load(t: &TlsConfig) -> Result<Loaded, TlsError> {
    let provider = provider();
    let certs = t
        .certs
        .iter()
        .map(|c| certs::load(c, &provider))
        .collect::<Result<Vec<_>, _>>()?;
    let mut expiry = BTreeMap::new();
    for c in &certs {
        let labels = if c.names.is_empty() {
            std::slice::from_ref(&c.file_label)
        } else {
            &c.names[..]
        };
        for l in labels {
            let e = expiry.entry(l.clone()).or_insert(c.not_after);
            *e = (*e).min(c.not_after);
        }
    }
    let resolver = resolver::SniResolver::new(&certs, t.unknown_sni == UnknownSni::Reject);
    let versions: &[&'static rustls::SupportedProtocolVersion] = match t.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = match &t.client_auth {
        None => builder.with_no_client_auth(),
        Some(c) => builder.with_client_cert_verifier(client_auth::verifier(c, provider)?),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg.max_early_data_size = 0;
    cfg.session_storage = if t.session_cache == 0 {
        Arc::new(NoServerSessionStorage {})
    } else {
        ServerSessionMemoryCache::new(t.session_cache)
    };
    if t.session_tickets {
        cfg.ticketer = match &t.ticket_key_file {
            Some(f) => Arc::new(tickets::KeyFileTicketer::load(f)?),
            None => {
                rustls::crypto::ring::Ticketer::new().map_err(|e| TlsError::Setup(e.to_string()))?
            }
        };
    }
    Ok(Loaded {
        server: Arc::new(cfg),
        expiry,
    })
}

/// Sets `tollgate_tls_certificate_expiry_seconds` for each name.
fn record_expiry(expiry: &BTreeMap<String, i64>) {
    for (name, not_after) in expiry {
        // Unix seconds fit an f64's mantissa exactly.
        #[allow(clippy::cast_precision_loss)]
        let v = *not_after as f64;
        metrics::gauge!(crate::metrics::TLS_CERT_EXPIRY, "name" => name.clone()).set(v);
    }
}

/// The current TLS configuration, swapped on reload: a connection in its handshake or serving
/// keeps the configuration it started with; new connections get the new one.
pub struct TlsReloader {
    current: ArcSwap<ServerConfig>,
}

impl TlsReloader {
    pub fn new(t: &TlsConfig) -> Result<TlsReloader, TlsError> {
        let loaded = load(t)?;
        record_expiry(&loaded.expiry);
        Ok(TlsReloader {
            current: ArcSwap::new(loaded.server),
        })
    }

    /// Re-reads the files; on error the previous configuration stays in use.
    pub fn reload(&self, t: &TlsConfig) -> Result<(), TlsError> {
        let loaded = load(t)?;
        record_expiry(&loaded.expiry);
        self.current.store(loaded.server);
        Ok(())
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }
}
