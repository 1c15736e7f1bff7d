//! `[server.tls]`: the certificates served by name (SNI), what to do with a name none serves,
//! the protocol floor, resumption (session cache, tickets from a key file a fleet shares) and
//! client certificates. The raw table mirrors the TOML; [`validate`] turns it into a
//! [`TlsConfig`] with paths resolved and the default certificate first. Loading the files
//! (and checking that each key fits its certificate) is [`crate::tls`]'s.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[server.tls]` as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    /// PEM certificate chain of the default certificate (relative paths are relative to the
    /// config file); with `key`. Optional when `[[server.tls.certs]]` lists certificates (path).
    #[serde(default)]
    pub(super) cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, RSA or EC) of `cert` (path).
    #[serde(default)]
    pub(super) key: Option<PathBuf>,
    /// `[[server.tls.certs]]`: more certificates, chosen by the name the client asks for (SNI).
    #[serde(default)]
    pub(super) certs: Vec<RawTlsCert>,
    /// A name no certificate serves (or no name, or an IP address): `"default"` serves the
    /// default certificate (as nginx does), `"reject"` ends the handshake with an alert
    /// (`"default"` | `"reject"`; default: `"default"`).
    #[serde(default)]
    pub(super) unknown_sni: UnknownSni,
    /// The oldest TLS version accepted (`"1.2"` | `"1.3"`; default: `"1.2"`).
    #[serde(default)]
    pub(super) min_version: TlsVersion,
    /// TLS 1.2 sessions remembered for resumption by session id, per process; `0` turns the
    /// cache off (integer; default: `10000`).
    #[serde(default = "default_session_cache")]
    pub(super) session_cache: usize,
    /// Session tickets (resumption without server state) (bool; default: `true`).
    #[serde(default = "super::raw::default_true")]
    pub(super) session_tickets: bool,
    /// Ticket keys shared by a fleet, so a client resumes on any gateway: one key a line, 64 hex
    /// digits (32 random bytes); the first line encrypts new tickets, every line decrypts.
    /// Rotate by adding a line at the top and dropping the last, then reload. Without it each
    /// process makes its own keys (path; default: none).
    #[serde(default)]
    pub(super) ticket_key_file: Option<PathBuf>,
    /// `[server.tls.client_auth]`: ask clients for a certificate issued by `ca`.
    #[serde(default)]
    pub(super) client_auth: Option<RawClientAuth>,
}

/// One `[[server.tls.certs]]` entry.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTlsCert {
    /// PEM certificate chain, leaf first (path, required).
    pub(super) cert: PathBuf,
    /// PEM private key of the leaf (path, required).
    pub(super) key: PathBuf,
    /// The names this certificate serves: exact (`api.example.com`) or one-label wildcards
    /// (`*.example.com`) (list of strings; default: the certificate's own DNS names).
    #[serde(default)]
    pub(super) names: Option<Vec<String>>,
    /// The certificate served when no other fits (at most one; default: `cert`/`key` of
    /// `[server.tls]` when given, else the first entry) (bool; default: `false`).
    #[serde(default)]
    pub(super) default: bool,
}

/// `[server.tls.client_auth]` as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientAuth {
    /// PEM bundle of the certificate authorities that issue client certificates (path, required).
    pub(super) ca: PathBuf,
    /// `"required"`: the handshake fails without a valid client certificate; `"optional"`: a
    /// client may send none (a route may still demand one with `client_cert = "required"`),
    /// but one it sends must be valid (`"required"` | `"optional"`; default: `"required"`).
    #[serde(default)]
    pub(super) mode: ClientAuthMode,
}

fn default_session_cache() -> usize {
    DEFAULT_SESSION_CACHE
}

/// The default `session_cache`.
pub const DEFAULT_SESSION_CACHE: usize = 10_000;
/// The largest `session_cache`: each entry holds a few hundred bytes.
pub const MAX_SESSION_CACHE: usize = 1_000_000;

/// `unknown_sni`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSni {
    /// Serve the default certificate.
    #[default]
    Default,
    /// End the handshake with an alert.
    Reject,
}

/// `min_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// `client_auth.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuthMode {
    #[default]
    Required,
    Optional,
}

/// One certificate the listener serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The names it serves as configured (lower case, no trailing dot); `None`: the
    /// certificate's own DNS names.
    pub names: Option<Vec<String>>,
}

/// Client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuthConfig {
    pub ca: PathBuf,
    pub mode: ClientAuthMode,
}

/// `[server.tls]`, with paths resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Never empty; the first is the default certificate.
    pub certs: Vec<TlsCert>,
    pub unknown_sni: UnknownSni,
    pub min_version: TlsVersion,
    pub session_cache: usize,
    pub session_tickets: bool,
    pub ticket_key_file: Option<PathBuf>,
    pub client_auth: Option<ClientAuthConfig>,
}

impl TlsConfig {
    /// Every file the TLS listener reads (what a reload re-reads and `watch_config` watches).
    pub fn files(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .certs
            .iter()
            .flat_map(|c| [c.cert.clone(), c.key.clone()])
            .collect();
        out.extend(self.ticket_key_file.clone());
        out.extend(self.client_auth.as_ref().map(|c| c.ca.clone()));
        out
    }
}

/// A name as the resolver compares it: lower case, without a trailing dot.
pub fn normalize_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Checks a configured name: a DNS name, or `*.` followed by one (one label wildcard).
fn check_name(field: &str, name: &str) -> Result<String, ConfigError> {
    let n = normalize_name(name);
    let host = n.strip_prefix("*.").unwrap_or(&n);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(invalid(
            field,
            format!("{name:?} is not a DNS name or a one-label wildcard (*.example.com)"),
        ));
    }
    Ok(n)
}

pub(super) fn validate(raw: RawTls, base_dir: &Path) -> Result<TlsConfig, ConfigError> {
    let mut certs = Vec::new();
    let mut default = None;
    match (raw.cert, raw.key) {
        (Some(cert), Some(key)) => {
            certs.push(TlsCert {
                cert: base_dir.join(cert),
                key: base_dir.join(key),
                names: None,
            });
            default = Some(0);
        }
        (None, None) => {}
        (Some(_), None) => return Err(invalid("server.tls.key", "`cert` needs its `key`")),
        (None, Some(_)) => return Err(invalid("server.tls.cert", "`key` needs its `cert`")),
    }
    let offset = certs.len();
    for (i, c) in raw.certs.into_iter().enumerate() {
        let field = format!("server.tls.certs[{i}]");
        if c.default {
            if default.is_some() {
                return Err(invalid(
                    format!("{field}.default"),
                    "only one certificate may be the default (the top-level `cert` is one)",
                ));
            }
            default = Some(offset + i);
        }
        let names = match c.names {
            None => None,
            Some(names) if names.is_empty() => {
                return Err(invalid(
                    format!("{field}.names"),
                    "is empty; leave it out to serve the certificate's own names",
                ))
            }
            Some(names) => Some(
                names
                    .iter()
                    .enumerate()
                    .map(|(j, n)| check_name(&format!("{field}.names[{j}]"), n))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        certs.push(TlsCert {
            cert: base_dir.join(c.cert),
            key: base_dir.join(c.key),
            names,
        });
    }
    if certs.is_empty() {
        return Err(invalid(
            "server.tls",
            "needs a certificate: `cert` and `key`, or [[server.tls.certs]]",
        ));
    }
    if let Some(d) = default.filter(|d| *d != 0) {
        let c = certs.remove(d);
        certs.insert(0, c);
    }
    if raw.session_cache > MAX_SESSION_CACHE {
        return Err(invalid(
            "server.tls.session_cache",
            format!("must be at most {MAX_SESSION_CACHE}"),
        ));
    }
    if raw.ticket_key_file.is_some() && !raw.session_tickets {
        return Err(invalid(
            "server.tls.ticket_key_file",
            "has no effect with session_tickets = false",
        ));
    }
    Ok(TlsConfig {
        certs,
        unknown_sni: raw.unknown_sni,
        min_version: raw.min_version,
        session_cache: raw.session_cache,
        session_tickets: raw.session_tickets,
        ticket_key_file: raw.ticket_key_file.map(|f| base_dir.join(f)),
        client_auth: raw.client_auth.map(|c| ClientAuthConfig {
            ca: base_dir.join(c.ca),
            mode: c.mode,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<TlsConfig, ConfigError> {
        let raw: RawTls = toml::from_str(toml).map_err(|e| invalid("-", e.to_string()))?;
        validate(raw, Path::new("/etc/tollgate"))
    }

    #[test]
    fn the_top_level_pair_is_the_default_and_paths_are_resolved() {
        let t = parse(
            "cert = \"a.pem\"\nkey = \"a.key\"\n[[certs]]\ncert = \"b.pem\"\nkey = \"b.key\"\nnames = [\"API.example.com.\", \"*.example.org\"]\n",
        )
        .unwrap();
        assert_eq!(t.certs.len(), 2);
        assert_eq!(t.certs[0].cert, Path::new("/etc/tollgate/a.pem"));
        assert_eq!(
            t.certs[1].names.as_deref(),
            Some(&["api.example.com".to_owned(), "*.example.org".to_owned()][..])
        );
        assert_eq!(t.unknown_sni, UnknownSni::Default);
        assert_eq!(t.min_version, TlsVersion::Tls12);
    }

    #[test]
    fn a_marked_default_comes_first() {
        let t = parse(
            "[[certs]]\ncert = \"b.pem\"\nkey = \"b.key\"\n[[certs]]\ncert = \"c.pem\"\nkey = \"c.key\"\ndefault = true\n",
        )
        .unwrap();
        assert_eq!(t.certs[0].cert, Path::new("/etc/tollgate/c.pem"));
    }

    #[test]
    fn refusals_name_the_field() {
        for (toml, field) in [
            ("cert = \"a.pem\"\n", "server.tls.key"),
            ("unknown_sni = \"reject\"\n", "server.tls"),
            (
                "cert = \"a\"\nkey = \"b\"\n[[certs]]\ncert = \"b\"\nkey = \"c\"\ndefault = true\n",
                "server.tls.certs[0].default",
            ),
            (
                "[[certs]]\ncert = \"b\"\nkey = \"c\"\nnames = [\"a.*.example.com\"]\n",
                "server.tls.certs[0].names[0]",
            ),
            (
                "[[certs]]\ncert = \"b\"\nkey = \"c\"\nnames = []\n",
                "server.tls.certs[0].names",
            ),
            (
                "cert = \"a\"\nkey = \"b\"\nsession_cache = 2000000\n",
                "server.tls.session_cache",
            ),
        ] {
            let e = parse(toml).unwrap_err().to_string();
            assert!(e.contains(field), "{toml}: {e}");
        }
        assert!(parse("cert = \"a\"\nkey = \"b\"\nmin_version = \"1.1\"\n").is_err());
    }
}
