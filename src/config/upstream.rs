//! `[[upstreams]]` in the config file: the raw serde structs (deny unknown keys; URLs, durations
//! and enums parsed while deserialising so that TOML names the line) and their validation into
//! [`UpstreamConfig`], whose errors name the key by its path (`upstreams[0].servers[1]`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::{HumanDuration, UpstreamUrl};

/// The most servers in one group (a request's tried servers fit in a small bitset).
pub const MAX_SERVERS: usize = 256;
/// The smallest `weight` of a server (the loader's and the schema's bound).
pub const MIN_WEIGHT: u32 = 1;
/// The largest `weight` of a server.
pub const MAX_WEIGHT: u32 = 1000;
/// The most `retries` of a group.
pub const MAX_RETRIES: u32 = 16;

/// How a group picks a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Smooth weighted round robin (nginx's).
    #[default]
    RoundRobin,
    /// The server with the fewest requests in flight, relative to its weight.
    LeastRequests,
    /// Consistent (rendezvous) hashing of the client IP.
    IpHash,
}

impl Balance {
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::RoundRobin => "round_robin",
            Balance::LeastRequests => "least_requests",
            Balance::IpHash => "ip_hash",
        }
    }
}

/// How a group's connections speak HTTP (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
pub enum Protocol {
    /// HTTP/1.1 (over TLS with ALPN `http/1.1` for `https://` servers).
    #[default]
    #[serde(rename = "http1")]
    Http1,
    /// HTTP/2 over TLS, agreed by ALPN (`https://` servers only).
    #[serde(rename = "h2")]
    H2,
    /// HTTP/2 over plain TCP with prior knowledge (`http://` servers only).
    #[serde(rename = "h2c")]
    H2c,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::H2 => "h2",
            Protocol::H2c => "h2c",
        }
    }

    /// Whether the connections speak HTTP/2.
    pub fn is_h2(self) -> bool {
        matches!(self, Protocol::H2 | Protocol::H2c)
    }
}

/// One entry of `servers`: a URL string, or `{ url, weight }`.
#[derive(Debug, Clone)]
pub struct RawServer {
    url: UpstreamUrl,
    weight: Option<u32>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawServerTable {
    url: UpstreamUrl,
    #[serde(default)]
    weight: Option<u32>,
}

impl<'de> Deserialize<'de> for RawServer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawServer;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a server URL or a table { url = \"…\", weight = N }")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawServer, E> {
                let url = UpstreamUrl::try_from(s.to_owned()).map_err(E::custom)?;
                Ok(RawServer { url, weight: None })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawServer, A::Error> {
                let t = RawServerTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawServer {
                    url: t.url,
                    weight: t.weight,
                })
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Unique; what routes name in `upstream`, and the `upstream` metric label (letters, digits,
    /// `-_.`) (string, required).
    name: String,
    /// 1–256 servers, each a URL string or `{ url = "…", weight = N }`; `scheme://host:port`
    /// without a path (use the route's `strip_prefix`); every server of a group has the same
    /// scheme; no server twice (list, required).
    servers: Vec<RawServer>,
    /// `round_robin`, `least_requests` or `ip_hash` (below) (string; default: `"round_robin"`).
    #[serde(default)]
    balance: Balance,
    /// Failures within `fail_timeout` that take a server out (passive health); `0` turns passive
    /// health off. Ignored in a group of one server (as nginx does) (integer; default: `1`).
    #[serde(default = "default_max_fails")]
    max_fails: u32,
    /// The window the failures are counted in, and how long the server then stays out (duration;
    /// default: `"10s"`).
    #[serde(default = "default_fail_timeout")]
    fail_timeout: HumanDuration,
    /// Further servers a failed request may try (0–16; never more than the other servers) (integer;
    /// default: `1`).
    #[serde(default = "default_retries")]
    retries: u32,
    /// TCP connect, and again the TLS handshake, to one server (duration; default: `"5s"`).
    #[serde(default = "default_connect_timeout")]
    connect_timeout: HumanDuration,
    /// `[upstreams.health_check]`: active health checks (none without it).
    #[serde(default)]
    health_check: Option<RawHealthCheck>,
    /// `[upstreams.tls]`: how `https://` servers are verified.
    #[serde(default)]
    tls: Option<RawUpstreamTls>,
    /// How the group's connections speak: HTTP/1.1; HTTP/2 over TLS agreed by ALPN (`https://`
    /// servers only); HTTP/2 over plain TCP with prior knowledge (`http://` servers only). See
    /// HTTP/2 upstreams and gRPC (`"http1"` | `"h2"` | `"h2c"`; default: `"http1"`).
    #[serde(default)]
    protocol: Protocol,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawHealthCheck {
    /// `GET` this path (and query) on every server; a 2xx or 3xx is healthy (only the status
    /// counts) (string; default: `"/"`).
    #[serde(default = "default_check_path")]
    path: String,
    /// Time between two rounds (all servers checked at once) (duration; default: `"5s"`).
    #[serde(default = "default_check_interval")]
    interval: HumanDuration,
    /// A check without its response head and the first 4 KiB of the body (or all of a shorter one)
    /// by then failed (duration; default: `"1s"`).
    #[serde(default = "default_check_timeout")]
    timeout: HumanDuration,
    /// Successes in a row that bring a server back (integer; default: `2`).
    #[serde(default = "default_healthy_threshold")]
    healthy_threshold: u32,
    /// Failures in a row that take a server out (integer; default: `3`).
    #[serde(default = "default_unhealthy_threshold")]
    unhealthy_threshold: u32,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    /// Extra trust roots (PEM, one or more certificates), added to the platform's; relative to the
    /// config file; checked by `tollgate check` (path).
    #[serde(default)]
    ca: Option<PathBuf>,
    /// The name sent as SNI and verified in the certificate, for every server of the group (servers
    /// addressed by IP, one certificate name) (string; default: each server's host).
    #[serde(default)]
    server_name: Option<String>,
    /// `false` accepts any certificate for any name: `tollgate check` and the start-up (and every
    /// reload) log a warning. Use only to try things out (bool; default: `true`).
    #[serde(default = "default_verify")]
    verify: bool,
}

fn default_max_fails() -> u32 {
    1
}
fn default_fail_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_retries() -> u32 {
    1
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration(DEFAULT_CONNECT_TIMEOUT)
}
fn default_check_path() -> String {
    "/".to_owned()
}
fn default_check_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}
fn default_check_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(1))
}
fn default_healthy_threshold() -> u32 {
    2
}
fn default_unhealthy_threshold() -> u32 {
    3
}
fn default_verify() -> bool {
    true
}

/// The connect timeout of a group that sets none, and of a route's own URL.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A validated `[[upstreams]]` group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    pub name: String,
    pub servers: Vec<ServerSpec>,
    pub balance: Balance,
    /// 0: passive health is off.
    pub max_fails: u32,
    pub fail_timeout: Duration,
    pub retries: u32,
    pub connect_timeout: Duration,
    pub health_check: Option<HealthCheckConfig>,
    /// For `https://` servers (the defaults when `[upstreams.tls]` is left out).
    pub tls: UpstreamTls,
    /// HTTP/1.1, or HTTP/2 (`h2` over TLS, `h2c` over plain TCP).
    pub protocol: Protocol,
}

impl UpstreamConfig {
    /// Whether the servers are `https://` (a group has one scheme).
    pub fn is_https(&self) -> bool {
        self.servers
            .first()
            .is_some_and(|s| s.url.scheme == http::uri::Scheme::HTTPS)
    }
}

/// One server of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub url: UpstreamUrl,
    pub weight: u32,
}

/// `[upstreams.health_check]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckConfig {
    pub path: http::uri::PathAndQuery,
    pub interval: Duration,
    pub timeout: Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
}

/// `[upstreams.tls]`, with `ca` resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    pub ca: Option<PathBuf>,
    pub server_name: Option<String>,
    pub verify: bool,
}

impl Default for UpstreamTls {
    fn default() -> Self {
        UpstreamTls {
            ca: None,
            server_name: None,
            verify: true,
        }
    }
}

/// Why a group is invalid: the key's path and the message.
pub type Invalid = (String, String);

fn positive(field: String, d: HumanDuration, max: Duration) -> Result<Duration, Invalid> {
    if d.0.is_zero() {
        return Err((field, "must be positive".to_owned()));
    }
    if d.0 > max {
        return Err((
            field,
            format!(
                "{} is too long; the maximum is {}",
                humantime::format_duration(d.0),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(d.0)
}

/// Validates group `i`; `label_safe` is the config's rule for names used as metric labels.
pub fn validate(
    i: usize,
    u: RawUpstream,
    base_dir: &Path,
    label_safe: fn(&str) -> bool,
) -> Result<UpstreamConfig, Invalid> {
    let at = |field: &str| format!("upstreams[{i}].{field}");
    if !label_safe(&u.name) {
        return Err((
            at("name"),
            format!("{:?}: use 1-64 letters, digits, '-', '_' or '.'", u.name),
        ));
    }
    if u.servers.is_empty() {
        return Err((at("servers"), "must list at least one server".to_owned()));
    }
    if u.servers.len() > MAX_SERVERS {
        return Err((
            at("servers"),
            format!("at most {MAX_SERVERS} servers per group"),
        ));
    }
    let mut servers: Vec<ServerSpec> = Vec::with_capacity(u.servers.len());
    for (j, s) in u.servers.into_iter().enumerate() {
        let field = format!("upstreams[{i}].servers[{j}]");
        if !s.url.base_path.is_empty() {
            return Err((
                field,
                format!(
                    "a server is scheme://host:port without a path (got path {:?}); \
                     use the route's strip_prefix, or a route URL for a base path",
                    s.url.base_path
                ),
            ));
        }
        let weight = s.weight.unwrap_or(1);
        if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
            return Err((
                format!("{field}.weight"),
                format!("must be between {MIN_WEIGHT} and {MAX_WEIGHT}"),
            ));
        }
        if let Some(first) = servers.first() {
            if first.url.scheme != s.url.scheme {
                return Err((
                    field,
                    "every server of a group must use the same scheme (http:// or https://)"
                        .to_owned(),
                ));
            }
        }
        if servers.iter().any(|o| o.url.authority == s.url.authority) {
            return Err((field, format!("{} is listed twice", s.url.authority)));
        }
        servers.push(ServerSpec { url: s.url, weight });
    }
    if u.retries > MAX_RETRIES {
        return Err((at("retries"), format!("must be at most {MAX_RETRIES}")));
    }
    let day = super::MAX_TIMEOUT;
    let fail_timeout = positive(at("fail_timeout"), u.fail_timeout, day)?;
    let connect_timeout = positive(at("connect_timeout"), u.connect_timeout, day)?;
    let health_check = match u.health_check {
        None => None,
        Some(h) => {
            let hat = |f: &str| format!("upstreams[{i}].health_check.{f}");
            if !h.path.starts_with('/') {
                return Err((hat("path"), format!("{:?} must start with '/'", h.path)));
            }
            let path = h.path.parse::<http::uri::PathAndQuery>().map_err(|e| {
                (
                    hat("path"),
                    format!("{:?} is not a valid path: {e}", h.path),
                )
            })?;
            if h.healthy_threshold == 0 {
                return Err((hat("healthy_threshold"), "must be positive".to_owned()));
            }
            if h.unhealthy_threshold == 0 {
                return Err((hat("unhealthy_threshold"), "must be positive".to_owned()));
            }
            Some(HealthCheckConfig {
                path,
                interval: positive(hat("interval"), h.interval, day)?,
                timeout: positive(hat("timeout"), h.timeout, day)?,
                healthy_threshold: h.healthy_threshold,
                unhealthy_threshold: h.unhealthy_threshold,
            })
        }
    };
    let is_https = servers
        .first()
        .is_some_and(|s| s.url.scheme == http::uri::Scheme::HTTPS);
    let tls = match u.tls {
        None => UpstreamTls::default(),
        Some(_) if !is_https => {
            return Err((
                at("tls"),
                "applies to https:// servers; this group's servers are http://".to_owned(),
            ))
        }
        Some(t) => {
            if let Some(name) = &t.server_name {
                if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                    return Err((
                        format!("upstreams[{i}].tls.server_name"),
                        format!("{name:?} is not a valid DNS name or IP address"),
                    ));
                }
            }
            UpstreamTls {
                ca: t.ca.map(|p| base_dir.join(p)),
                server_name: t.server_name,
                verify: t.verify,
            }
        }
    };
    match (u.protocol, is_https) {
        (Protocol::H2, false) => {
            return Err((
                at("protocol"),
                "\"h2\" is HTTP/2 over TLS and needs https:// servers; use \"h2c\" for HTTP/2 over plain TCP".to_owned(),
            ))
        }
        (Protocol::H2c, true) => {
            return Err((
                at("protocol"),
                "\"h2c\" is HTTP/2 over plain TCP and needs http:// servers; use \"h2\" for HTTP/2 over TLS".to_owned(),
            ))
        }
        _ => {}
    }
    Ok(UpstreamConfig {
        name: u.name,
        servers,
        balance: u.balance,
        max_fails: u.max_fails,
        fail_timeout,
        retries: u.retries,
        connect_timeout,
        health_check,
        tls,
        protocol: u.protocol,
    })
}
