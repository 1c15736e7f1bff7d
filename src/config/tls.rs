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
    /// `[server.tls.acme]`: obtain and renew certificates from an ACME server (RFC 8555).
    #[serde(default)]
    pub(super) acme: Option<RawAcme>,
}

/// `[server.tls.acme]` as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAcme {
    /// The ACME server's directory URL, `https://` (Let's Encrypt:
    /// `https://acme-v02.api.letsencrypt.org/directory`) (string, required).
    pub(super) directory: String,
    /// Contact addresses of the account (`mailto:ops@example.com`) (list of strings; default:
    /// none).
    #[serde(default)]
    pub(super) contact: Vec<String>,
    /// The names to obtain certificates for, one certificate each (list of DNS names; default:
    /// the routes' `host`s that are DNS names without a wildcard).
    #[serde(default)]
    pub(super) names: Option<Vec<String>>,
    /// How the server proves control of a name: `"http-01"` is answered on
    /// `[server] http_redirect_listen` (port 80), `"tls-alpn-01"` on the TLS listener (port
    /// 443) (`"http-01"` | `"tls-alpn-01"`; default: `"http-01"`).
    #[serde(default)]
    pub(super) challenge: AcmeChallenge,
    /// A directory for the account key and the certificates (created if missing, private keys
    /// mode 0600); gateways sharing it order each certificate once (path, required).
    pub(super) storage: PathBuf,
    /// PEM bundle to trust for the directory's HTTPS, for a private ACME server (pebble, step-ca)
    /// (path; default: the system's roots).
    #[serde(default)]
    pub(super) ca: Option<PathBuf>,
}

/// `acme.challenge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
pub enum AcmeChallenge {
    #[default]
    #[serde(rename = "http-01")]
    Http01,
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
}

/// `[server.tls.acme]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeConfig {
    pub directory: String,
    pub contact: Vec<String>,
    /// Lower case, no trailing dot, no wildcard, never empty after [`acme_names`].
    pub names: Vec<String>,
    pub challenge: AcmeChallenge,
    pub storage: PathBuf,
    pub ca: Option<PathBuf>,
}

/// At most this many ACME names (one certificate each, ordered one after another).
pub const MAX_ACME_NAMES: usize = 100;

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
    /// Certificate revocation lists (PEM or DER files) of the CAs of `ca`: a client certificate
    /// they revoke is refused; every CA of `ca` needs its CRL listed. Re-read on reload (list
    /// of paths; default: none).
    #[serde(default)]
    pub(super) crl: Vec<PathBuf>,
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

/// A route's `client_cert`: what it demands of the connection beyond its listener's
/// `client_auth.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientCertDemand {
    /// A verified client certificate, or 403 before the limits and the upstream.
    Required,
}

/// A subject part read from the verified client certificate (`tls:fingerprint`,
/// `tls:subject_cn`, `tls:san_dns`, `tls:san_uri`); its reader is `crate::tls::subject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsPart {
    /// The SHA-256 of the leaf, lower-case hex.
    Fingerprint,
    /// The subject's first common name.
    SubjectCn,
    /// The first DNS name of the subjectAltName.
    SanDns,
    /// The first URI of the subjectAltName (a SPIFFE ID).
    SanUri,
}

impl TlsPart {
    /// The part after `tls:`.
    pub fn parse(s: &str) -> Option<TlsPart> {
        Some(match s {
            "fingerprint" => TlsPart::Fingerprint,
            "subject_cn" => TlsPart::SubjectCn,
            "san_dns" => TlsPart::SanDns,
            "san_uri" => TlsPart::SanUri,
            _ => return None,
        })
    }

    /// As written after `tls:`.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsPart::Fingerprint => "fingerprint",
            TlsPart::SubjectCn => "subject_cn",
            TlsPart::SanDns => "san_dns",
            TlsPart::SanUri => "san_uri",
        }
    }
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
    /// The CRL files, in order.
    pub crl: Vec<PathBuf>,
}

/// `[server.tls]`, with paths resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The first is the default certificate; empty only with `acme` (then a name with no
    /// certificate yet gets a handshake alert).
    pub certs: Vec<TlsCert>,
    pub unknown_sni: UnknownSni,
    pub min_version: TlsVersion,
    pub session_cache: usize,
    pub session_tickets: bool,
    pub ticket_key_file: Option<PathBuf>,
    pub client_auth: Option<ClientAuthConfig>,
    pub acme: Option<AcmeConfig>,
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
        if let Some(c) = &self.client_auth {
            out.push(c.ca.clone());
            out.extend(c.crl.iter().cloned());
        }
        out
    }
}

fn validate_acme(raw: RawAcme, base_dir: &Path) -> Result<AcmeConfig, ConfigError> {
    let f = |k: &str| format!("server.tls.acme.{k}");
    match http::Uri::try_from(raw.directory.as_str()) {
        Ok(u) if u.scheme_str() == Some("https") && u.host().is_some() => {}
        _ => {
            return Err(invalid(
                f("directory"),
                format!(
                    "{:?} is not an https:// URL (RFC 8555 requires HTTPS)",
                    raw.directory
                ),
            ))
        }
    }
    for (i, c) in raw.contact.iter().enumerate() {
        if !c.starts_with("mailto:") || c.len() <= "mailto:".len() {
            return Err(invalid(
                format!("{}[{i}]", f("contact")),
                format!("{c:?} is not a mailto: address"),
            ));
        }
    }
    let names = match raw.names {
        None => Vec::new(),
        Some(n) if n.is_empty() => {
            return Err(invalid(
                f("names"),
                "is empty; leave it out to use the routes' hosts",
            ))
        }
        Some(n) => {
            let mut out: Vec<String> = Vec::new();
            for (i, name) in n.iter().enumerate() {
                let field = format!("{}[{i}]", f("names"));
                let name = check_name(&field, name)?;
                if name.starts_with("*.") {
                    return Err(invalid(
                        field,
                        "a wildcard needs the DNS-01 challenge, which Tollgate does not answer",
                    ));
                }
                if !out.contains(&name) {
                    out.push(name);
                }
            }
            out
        }
    };
    Ok(AcmeConfig {
        directory: raw.directory,
        contact: raw.contact,
        names,
        challenge: raw.challenge,
        storage: base_dir.join(raw.storage),
        ca: raw.ca.map(|c| base_dir.join(c)),
    })
}

/// Completes `[server.tls.acme]` once the routes are known: without `names`, the routes'
/// hosts that are plain DNS names (a wildcard or an IP address cannot be ordered over HTTP-01
/// or TLS-ALPN-01). HTTP-01 is answered on the plain listener, so it needs one.
pub(super) fn acme_names<'a>(
    acme: &mut AcmeConfig,
    hosts: impl Iterator<Item = &'a str>,
    plain_listener: bool,
) -> Result<(), ConfigError> {
    if acme.challenge == AcmeChallenge::Http01 && !plain_listener {
        return Err(invalid(
            "server.tls.acme.challenge",
            "\"http-01\" is answered on the plain listener: set [server] http_redirect_listen \
             (port 80), or use \"tls-alpn-01\"",
        ));
    }
    if acme.names.is_empty() {
        for h in hosts {
            let h = h.rsplit_once(':').map_or(h, |(n, p)| {
                if p.bytes().all(|b| b.is_ascii_digit()) {
                    n
                } else {
                    h
                }
            });
            if h.parse::<std::net::IpAddr>().is_ok() || h.starts_with("*.") {
                continue;
            }
            if let Ok(n) = check_name("-", h) {
                if !acme.names.contains(&n) {
                    acme.names.push(n);
                }
            }
        }
        if acme.names.is_empty() {
            return Err(invalid(
                "server.tls.acme.names",
                "is absent and no route has a `host` to order a certificate for",
            ));
        }
    }
    if acme.names.len() > MAX_ACME_NAMES {
        return Err(invalid(
            "server.tls.acme.names",
            format!("at most {MAX_ACME_NAMES} names"),
        ));
    }
    Ok(())
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
    if certs.is_empty() && raw.acme.is_none() {
        return Err(invalid(
            "server.tls",
            "needs a certificate: `cert` and `key`, [[server.tls.certs]], or [server.tls.acme]",
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
            crl: c.crl.into_iter().map(|f| base_dir.join(f)).collect(),
        }),
        acme: raw.acme.map(|a| validate_acme(a, base_dir)).transpose()?,
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
    fn crl_paths_are_resolved_and_watched() {
        let t = parse(
            "cert = \"a.pem\"\nkey = \"a.key\"\n[client_auth]\nca = \"ca.pem\"\ncrl = [\"ca.crl\", \"/abs/sub.crl\"]\n",
        )
        .unwrap();
        let c = t.client_auth.as_ref().unwrap();
        assert_eq!(
            c.crl,
            [Path::new("/etc/tollgate/ca.crl"), Path::new("/abs/sub.crl")]
        );
        let files = t.files();
        assert!(files.contains(&PathBuf::from("/etc/tollgate/ca.crl")));
        assert!(files.contains(&PathBuf::from("/abs/sub.crl")));
        let none =
            parse("cert = \"a.pem\"\nkey = \"a.key\"\n[client_auth]\nca = \"ca.pem\"\n").unwrap();
        assert!(none.client_auth.unwrap().crl.is_empty());
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

    #[test]
    fn acme_alone_is_enough_and_names_come_from_the_routes() {
        let t = parse(
            "[acme]\ndirectory = \"https://acme.test/dir\"\nstorage = \"acme\"\nchallenge = \"tls-alpn-01\"\n",
        )
        .unwrap();
        assert!(t.certs.is_empty());
        let mut a = t.acme.unwrap();
        assert_eq!(a.storage, Path::new("/etc/tollgate/acme"));
        acme_names(
            &mut a,
            [
                "API.example.com",
                "*.example.org",
                "10.0.0.1",
                "api.example.com",
                "b.test:8443",
            ]
            .into_iter(),
            false,
        )
        .unwrap();
        assert_eq!(a.names, ["api.example.com", "b.test"]);
        let mut none = a.clone();
        none.names.clear();
        let e = acme_names(&mut none, std::iter::empty(), false).unwrap_err();
        assert!(e.to_string().contains("server.tls.acme.names"), "{e}");
        a.challenge = AcmeChallenge::Http01;
        let e = acme_names(&mut a, std::iter::empty(), false).unwrap_err();
        assert!(e.to_string().contains("http_redirect_listen"), "{e}");
        assert!(acme_names(&mut a, std::iter::empty(), true).is_ok());
    }

    #[test]
    fn acme_refusals_name_the_field() {
        for (acme, field) in [
            ("directory = \"http://acme.test/dir\"\nstorage = \"s\"\n", "acme.directory"),
            (
                "directory = \"https://acme.test/dir\"\nstorage = \"s\"\nnames = [\"*.example.com\"]\n",
                "acme.names[0]",
            ),
            (
                "directory = \"https://acme.test/dir\"\nstorage = \"s\"\nnames = []\n",
                "acme.names",
            ),
            (
                "directory = \"https://acme.test/dir\"\nstorage = \"s\"\ncontact = [\"ops@example.com\"]\n",
                "acme.contact[0]",
            ),
        ] {
            let e = parse(&format!("[acme]\n{acme}")).unwrap_err().to_string();
            assert!(e.contains(field), "{acme}: {e}");
        }
        assert!(parse(
            "[acme]\ndirectory = \"https://a.test/\"\nstorage = \"s\"\nchallenge = \"dns-01\"\n"
        )
        .is_err());
    }
}
