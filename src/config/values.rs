//! Scalar domain types of the configuration, parsed from strings while deserialising so that a
//! bad value is reported with its line and key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::Deserialize;

use super::is_label_safe;

// ---------------------------------------------------------------------------------------------

/// A humantime duration such as `"500ms"`, `"1s"`, `"1m"`, `"1h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct HumanDuration(pub Duration);

impl TryFrom<String> for HumanDuration {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        humantime::parse_duration(s.trim())
            .map(HumanDuration)
            .map_err(|e| {
                format!("invalid duration {s:?} ({e}); use e.g. \"500ms\", \"1s\", \"1m\", \"1h\"")
            })
    }
}

/// A byte count as nginx writes sizes (`limit_rate`, `limit_rate_after`): a whole number of
/// bytes, as an integer (`65536`) or a string with an optional `k`, `m` or `g` suffix (any case;
/// 1024, 1024², 1024³: `"64k"`, `"1m"`). Negative, fractional or overflowing values are errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeValue")]
pub struct ByteSize(pub u64);

/// A size as written: an integer or a string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    Int(i64),
    Text(String),
}

impl TryFrom<SizeValue> for ByteSize {
    type Error = String;
    fn try_from(v: SizeValue) -> Result<Self, String> {
        let bad = |what: &str| {
            format!("{what}: expected a whole number of bytes, with an optional k, m or g (\"64k\", \"1m\", 65536)")
        };
        match v {
            SizeValue::Int(n) => u64::try_from(n)
                .map(ByteSize)
                .map_err(|_| bad(&n.to_string())),
            SizeValue::Text(s) => {
                let t = s.trim();
                let (digits, unit) = match t.as_bytes().last() {
                    Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
                    Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
                    Some(b'g' | b'G') => (&t[..t.len() - 1], 1 << 30),
                    _ => (t, 1),
                };
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad(&format!("{s:?}")));
                }
                digits
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| n.checked_mul(unit))
                    .map(ByteSize)
                    .ok_or_else(|| {
                        format!("{s:?} is more bytes than the gateway counts (2^64 - 1)")
                    })
            }
        }
    }
}

/// A route's `max_json_bytes`: the largest request body read before the limits for `json:`
/// subject parts and reservations (1 byte to 64 MiB; default 1 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct MaxJsonBytes(pub u64);

/// `max_json_bytes`'s default: 1 MiB.
pub const DEFAULT_MAX_JSON_BYTES: u64 = 1 << 20;
/// The largest `max_json_bytes`: 64 MiB (what one request may hold in memory before its limits).
pub const MAX_MAX_JSON_BYTES: u64 = 64 << 20;

impl Default for MaxJsonBytes {
    fn default() -> Self {
        MaxJsonBytes(DEFAULT_MAX_JSON_BYTES)
    }
}

impl TryFrom<i64> for MaxJsonBytes {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, String> {
        u64::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_MAX_JSON_BYTES).contains(n))
            .map(MaxJsonBytes)
            .ok_or_else(|| {
                format!("invalid max_json_bytes {n}; expected 1 to {MAX_MAX_JSON_BYTES} (64 MiB)")
            })
    }
}

/// The rate-limiting algorithm of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    Gcra,
    LeakyBucket,
    /// Requests in flight at once, not a rate.
    Concurrency,
}

impl Algorithm {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

/// Whether a limit rejects (`enforce`) or only reports what it would do (`shadow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    Shadow,
}

/// What a `header:`/`query:` limit does when the request does not carry that subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Count the request against the client IP instead (the default).
    #[default]
    Ip,
    /// Answer 401 without calling the upstream.
    Reject,
}

/// The store behind the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    #[default]
    Memory,
    Redis,
    RedisCluster,
    /// One Redis primary found (and followed through failovers) by Redis Sentinel.
    RedisSentinel,
}

impl Backend {
    /// The name used in the config file and as the `backend` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis_cluster",
            Backend::RedisSentinel => "redis_sentinel",
        }
    }
}

/// What a request gets when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: forward the request.
    #[default]
    Allow,
    /// Fail closed: answer 503.
    Deny,
}

/// An upstream base URL, `http://host:port[/base/path]` (or `https://`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct UpstreamUrl {
    /// `http` or `https`.
    pub scheme: http::uri::Scheme,
    /// `host:port` as written.
    pub authority: http::uri::Authority,
    /// Path prepended to the forwarded path, without a trailing slash ("" for none).
    pub base_path: String,
}

impl UpstreamUrl {
    /// `host:port` with the port explicit (80 for `http`, 443 for `https` when not written):
    /// how the access log names the server that answered.
    pub fn host_port(&self) -> std::sync::Arc<str> {
        let default = if self.scheme == http::uri::Scheme::HTTPS {
            443
        } else {
            80
        };
        std::sync::Arc::from(format!(
            "{}:{}",
            self.authority.host(),
            self.authority.port_u16().unwrap_or(default)
        ))
    }
}

impl TryFrom<String> for UpstreamUrl {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let uri: Uri = s
            .parse()
            .map_err(|e| format!("invalid upstream URL {s:?}: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("upstream URL {s:?} needs a scheme (http:// or https://)"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!("upstream URL {s:?}: scheme must be http or https"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("upstream URL {s:?} needs a host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "upstream URL {s:?} must not contain user-info (`user:password@`): \
                 it would be sent upstream in `Host`"
            ));
        }
        // `http::Uri` accepts any digits after the ':'; only 1-65535 is a port.
        if let Some(port) = authority
            .as_str()
            .strip_prefix(authority.host())
            .filter(|p| !p.is_empty())
        {
            let valid = port
                .strip_prefix(':')
                .and_then(|p| p.parse::<u16>().ok())
                .is_some_and(|p| p != 0);
            if !valid {
                return Err(format!(
                    "upstream URL {s:?}: the port must be a number from 1 to 65535"
                ));
            }
        }
        if uri.query().is_some() {
            return Err(format!("upstream URL {s:?} must not have a query"));
        }
        let base_path = uri.path().trim_end_matches('/').to_owned();
        Ok(UpstreamUrl {
            scheme,
            authority,
            base_path,
        })
    }
}

/// A route's `upstream`: a URL (a group of one) or the name of an `[[upstreams]]` group.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum UpstreamRef {
    Url(UpstreamUrl),
    Group(String),
}

impl UpstreamRef {
    /// The URL, if the route names one rather than a group.
    pub fn url(&self) -> Option<&UpstreamUrl> {
        match self {
            UpstreamRef::Url(u) => Some(u),
            UpstreamRef::Group(_) => None,
        }
    }
}

impl TryFrom<String> for UpstreamRef {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.contains("://") || s.contains('/') || s.contains(':') {
            return UpstreamUrl::try_from(s).map(UpstreamRef::Url);
        }
        if is_label_safe(&s) {
            Ok(UpstreamRef::Group(s))
        } else {
            Err(format!(
                "invalid upstream {s:?}: expected an [[upstreams]] group name or a URL such as \"http://127.0.0.1:3000\""
            ))
        }
    }
}

/// A listen address: `"0.0.0.0:8080"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ListenAddr(pub SocketAddr);

impl TryFrom<String> for ListenAddr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
            .map(ListenAddr)
            .map_err(|_| format!("invalid socket address {s:?}; expected e.g. \"0.0.0.0:8080\""))
    }
}

/// The request-id header's name: a valid header name without `_` (such headers are dropped on
/// the way upstream) that is not one of the headers the gateway itself rewrites.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RequestIdHeader(pub http::HeaderName);

impl Default for RequestIdHeader {
    fn default() -> Self {
        RequestIdHeader(http::HeaderName::from_static("x-request-id"))
    }
}

/// A header name the gateway can read from a request: valid, and without `_` (such names are
/// dropped before anything reads them).
pub(super) fn readable_header_name(s: &str) -> Result<http::HeaderName, String> {
    let name = http::HeaderName::from_bytes(s.trim().as_bytes())
        .map_err(|_| format!("invalid header name {s:?}"))?;
    if name.as_str().contains('_') {
        return Err(format!(
            "header name {s:?} contains '_'; such headers are dropped (use '-')"
        ));
    }
    Ok(name)
}

impl TryFrom<String> for RequestIdHeader {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let name = readable_header_name(&s)?;
        const RESERVED: &[&str] = &[
            "host",
            "connection",
            "content-length",
            "transfer-encoding",
            "upgrade",
            "te",
            "trailer",
            "keep-alive",
            "proxy-connection",
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
        ];
        if RESERVED.contains(&name.as_str()) {
            return Err(format!("header {s:?} cannot carry the request id"));
        }
        // The default as a static name: inserting it per request then touches no shared
        // reference count.
        if name == "x-request-id" {
            return Ok(RequestIdHeader::default());
        }
        Ok(RequestIdHeader(name))
    }
}

/// The access log's line format (`[log] format`); only JSON for now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Json,
}

/// Where access-log lines go (`[log] access`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessTarget {
    Off,
    Stdout,
    /// A file, appended to (created when missing) and reopened on SIGUSR1.
    File(PathBuf),
}

impl AccessTarget {
    /// Whether lines are written at all.
    pub fn is_on(&self) -> bool {
        !matches!(self, AccessTarget::Off)
    }
}

/// An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) as the IPv4 network it maps
/// (`10.0.0.0/8`): client addresses are compared in that form (a dual-stack socket's
/// `::ffff:198.51.100.7` is `198.51.100.7`), so an entry written the other way would match no
/// one (issue #34 item 16). A shorter prefix (`::/0`) stays IPv6.
fn v4_mapped_as_v4(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net,
        },
        _ => net,
    }
}

/// A CIDR (`10.0.0.0/8`) or a bare address (taken as /32 or /128); an IPv4-mapped IPv6 one is
/// the IPv4 address or network it maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr(pub IpNet);

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(Cidr(v4_mapped_as_v4(net).trunc()));
        }
        t.parse::<std::net::IpAddr>()
            .map(|ip| Cidr(IpNet::from(ip.to_canonical())))
            .map_err(|_| {
                format!("invalid CIDR {s:?}; expected e.g. \"10.0.0.0/8\" or \"192.0.2.7\"")
            })
    }
}

// ---------------------------------------------------------------------------------------------

/// Whose requests a plan limit counts together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// One count per consumer across every route with `consumers = true` (the default).
    #[default]
    Global,
    /// One count per consumer and route.
    Route,
}

#[cfg(test)]
mod cidr_tests {
    use super::Cidr;

    /// Issue #34 item 16: an IPv4-mapped IPv6 entry is the IPv4 address or network it maps, as
    /// client addresses are (a dual-stack socket's `::ffff:198.51.100.7` is `198.51.100.7`).
    #[test]
    fn v4_mapped_entries_are_v4() {
        let c = |s: &str| Cidr::try_from(s.to_owned()).unwrap().0.to_string();
        assert_eq!(c("::ffff:127.0.0.2"), "127.0.0.2/32");
        assert_eq!(c("::ffff:10.0.0.0/104"), "10.0.0.0/8");
        assert_eq!(c("::ffff:0:0/96"), "0.0.0.0/0");
        assert_eq!(c("2001:db8::/32"), "2001:db8::/32");
        assert_eq!(c("10.1.2.3/8"), "10.0.0.0/8");
    }
}
