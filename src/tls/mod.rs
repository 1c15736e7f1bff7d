//! TLS termination with rustls: the certificates by name ([`certs`], [`resolver`]), client
//! certificates ([`client_auth`], their revocation lists [`crl`]), resumption ([`tickets`]),
//! a connection's handshake and the check of a resumed session ([`accept`]), the reasons a
//! handshake fails ([`handshake`]), the client's identity forwarded upstream ([`peer`]), and
//! the listener's current configuration, rebuilt on reload ([`TlsReloader`]). ALPN offers `h2` and `http/1.1`; 0-RTT is off (early data can be
//! replayed, and a rate limiter must not count a replay as a new request).

pub mod accept;
pub mod acme;
pub mod certs;
pub mod client_auth;
pub mod crl;
pub mod crypto;
pub mod handshake;
pub mod peer;
pub mod resolver;
pub mod subject;
pub mod tickets;

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
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
    /// A value of a key that cannot be used (a CRL that is not one, a CA without its CRL).
    #[error("{field}: {message}")]
    Config { field: String, message: String },
}

impl TlsError {
    /// The config key it concerns (`server.tls` unless a key of it is named) and what is
    /// wrong, for a config error.
    pub fn field_and_message(self) -> (String, String) {
        match self {
            TlsError::Config { field, message } => (field, message),
            other => ("server.tls".to_owned(), other.to_string()),
        }
    }
}

/// The crypto provider every TLS listener uses ([`crypto`]).
fn provider() -> Arc<CryptoProvider> {
    crypto::shared()
}

/// A configuration loaded: what the acceptor serves, and when each name's certificate expires.
pub struct Loaded {
    pub server: Arc<ServerConfig>,
    /// The client certificate verifier `server` runs, with `client_auth`.
    pub verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// Each served name (or, for a certificate serving none, its file name) with the soonest
    /// `notAfter` (Unix seconds) of the certificates serving it.
    pub expiry: BTreeMap<String, i64>,
}

/// Loads every file `[server.tls]` names; errors name the file. `acme`: the certificates the
/// ACME task obtains (and its TLS-ALPN-01 answers), consulted by the resolver.
pub fn load(t: &TlsConfig, acme: Option<Arc<acme::AcmeState>>) -> Result<Loaded, TlsError> {
    build(t, acme, None)
}

/// The same certificates, client certificate verifier and tickets for QUIC (`[server.http3]`):
/// TLS 1.3 only, ALPN `h3` only (ACME's TLS-ALPN-01 is answered on TCP), early data accepted
/// (as QUIC takes it: all or nothing) only with `early_data`.
pub fn load_quic(
    t: &TlsConfig,
    acme: Option<Arc<acme::AcmeState>>,
    early_data: bool,
) -> Result<Loaded, TlsError> {
    build(t, acme, Some(early_data))
}

/// `quic`: `None` for the TCP listener; for QUIC, whether early data is accepted.
fn build(
    t: &TlsConfig,
    acme: Option<Arc<acme::AcmeState>>,
    quic: Option<bool>,
) -> Result<Loaded, TlsError> {
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
    let resolver =
        resolver::SniResolver::new(&certs, t.unknown_sni == UnknownSni::Reject).with_acme(acme);
    let versions: &[&'static rustls::SupportedProtocolVersion] = match t.min_version {
        _ if quic.is_some() => &[&rustls::version::TLS13],
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let verifier = t
        .client_auth
        .as_ref()
        .map(|c| client_auth::verifier(c, provider))
        .transpose()?;
    let builder = match &verifier {
        None => builder.with_no_client_auth(),
        Some(v) => builder.with_client_cert_verifier(v.clone()),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if t.acme
        .as_ref()
        .is_some_and(|a| a.challenge == crate::config::AcmeChallenge::TlsAlpn01)
    {
        // Last: chosen only by a client offering nothing else (the ACME server's validator);
        // the accept path closes such a connection after the handshake.
        cfg.alpn_protocols.push(acme::state::ACME_TLS_ALPN.to_vec());
    }
    cfg.max_early_data_size = 0;
    if let Some(early_data) = quic {
        cfg.alpn_protocols = vec![b"h3".to_vec()];
        // QUIC takes early data whole or not at all (RFC 9001 §4.6.1).
        cfg.max_early_data_size = if early_data { u32::MAX } else { 0 };
    }
    cfg.session_storage = if t.session_cache == 0 {
        Arc::new(NoServerSessionStorage {})
    } else {
        ServerSessionMemoryCache::new(t.session_cache)
    };
    // Early data needs stateful resumption (rustls takes it only then): each session resumes
    // once from the session cache, so a replayed first flight cannot resume (nor send early
    // data) again. Stateless tickets stay on the TCP listener and on QUIC without early data.
    // One ticket per handshake, full or resumed (rustls sends two by default; OpenSSL, so nginx,
    // sends two after a full handshake and one after a resumption): each ticket costs a key
    // derivation, an encryption and two draws from the kernel's random source, and a client
    // resumes with the newest one it holds (BENCHMARKS.md, stop 52).
    cfg.send_tls13_tickets = 1;
    if t.session_tickets && quic != Some(true) {
        cfg.ticketer = match &t.ticket_key_file {
            Some(f) => Arc::new(tickets::KeyFileTicketer::load(f)?),
            None => crypto::ticketer().map_err(|e| TlsError::Setup(e.to_string()))?,
        };
    }
    Ok(Loaded {
        server: Arc::new(cfg),
        verifier,
        expiry,
    })
}

/// Sets `tollgate_tls_certificate_expiry_seconds` for each name.
fn record_expiry(expiry: &BTreeMap<String, i64>) {
    for (name, not_after) in expiry {
        record_expiry_of(name, *not_after);
    }
}

/// Sets `tollgate_tls_certificate_expiry_seconds{name}` (a configured name).
pub(crate) fn record_expiry_of(name: &str, not_after: i64) {
    // Unix seconds fit an f64's mantissa exactly.
    #[allow(clippy::cast_precision_loss)]
    let v = not_after as f64;
    metrics::gauge!(crate::metrics::TLS_CERT_EXPIRY, "name" => name.to_owned()).set(v);
}

/// What runs after a reload of `[server.tls]` ([`TlsReloader::on_reload`]).
pub type ReloadHook = Box<dyn Fn(&TlsConfig) + Send + Sync>;

/// The current TLS configuration, swapped on reload: a connection in its handshake or serving
/// keeps the configuration it started with; new connections get the new one.
pub struct TlsReloader {
    current: ArcSwap<accept::Acceptor>,
    /// With `[server.tls.acme]` at start (changing it takes a restart).
    acme: Option<Arc<acme::AcmeState>>,
    /// `Alt-Svc` on the TCP listener's responses, once the HTTP/3 listener is bound.
    alt_svc: std::sync::OnceLock<http::HeaderValue>,
    /// What else serves these certificates (the HTTP/3 listener): told of each reload.
    on_reload: std::sync::OnceLock<ReloadHook>,
}

impl TlsReloader {
    pub fn new(t: &TlsConfig) -> Result<TlsReloader, TlsError> {
        let acme = t
            .acme
            .as_ref()
            .map(|_| Arc::new(acme::AcmeState::default()));
        let loaded = load(t, acme.clone())?;
        record_expiry(&loaded.expiry);
        Ok(TlsReloader {
            current: ArcSwap::from_pointee(accept::Acceptor::new(loaded.server, loaded.verifier)),
            acme,
            alt_svc: std::sync::OnceLock::new(),
            on_reload: std::sync::OnceLock::new(),
        })
    }

    /// Advertises the HTTP/3 listener (`[server.http3]`) on the TCP listener's responses.
    pub fn set_alt_svc(&self, value: http::HeaderValue) {
        let _ = self.alt_svc.set(value);
    }

    /// The `Alt-Svc` value the TCP listener's responses carry, with `[server.http3]`.
    pub fn alt_svc(&self) -> Option<&http::HeaderValue> {
        self.alt_svc.get()
    }

    /// The ACME task's shared state, with `[server.tls.acme]`.
    pub fn acme(&self) -> Option<&Arc<acme::AcmeState>> {
        self.acme.as_ref()
    }

    /// Re-reads the files; on error the previous configuration stays in use.
    pub fn reload(&self, t: &TlsConfig) -> Result<(), TlsError> {
        let loaded = load(t, self.acme.clone())?;
        record_expiry(&loaded.expiry);
        self.current.store(Arc::new(accept::Acceptor::new(
            loaded.server,
            loaded.verifier,
        )));
        if let Some(hook) = self.on_reload.get() {
            hook(t);
        }
        Ok(())
    }

    /// `hook` runs after each successful reload, with the new `[server.tls]` (the HTTP/3
    /// listener rebuilds its QUIC configuration from it). One hook; a second is ignored.
    pub fn on_reload(&self, hook: ReloadHook) {
        let _ = self.on_reload.set(hook);
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> Arc<accept::Acceptor> {
        self.current.load_full()
    }
}
