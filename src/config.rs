//! Configuration: the TOML file as serde structs, then one validation step into domain types.
//!
//! Two layers (house style point 4): the `Raw*` structs mirror `gateway.toml` one to one, with
//! `deny_unknown_fields` everywhere so a typo is an error rather than a silently ignored key. Scalar
//! values that have a domain type (durations, addresses, CIDRs, URLs, algorithms, subjects) are
//! parsed while deserialising, so the TOML parser reports the line and key of a bad value. Rules
//! that span several fields (unique names, `cost` within the bucket, …) are checked by
//! `Config::from_raw`, whose errors name the field by its path (`routes[1].limits[0].cost`).

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, Uri};
use ipnet::IpNet;
use serde::Deserialize;

use crate::upstream::config::UpstreamConfig;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or a value does not fit its key (the message names the line).
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A rule spanning several fields was broken; `field` is the key's path.
    #[error("invalid config: `{field}`: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar domain types, parsed from strings while deserialising.
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

/// The rate-limiting algorithm of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    Gcra,
    LeakyBucket,
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
        }
    }
}

/// Who a limit counts: `ip`, `header:NAME`, `query:NAME` or `global`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum SubjectSpec {
    Ip,
    Global,
    Header(http::HeaderName),
    Query(String),
}

impl TryFrom<String> for SubjectSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let bad =
            || format!("invalid subject {s:?}; expected ip, global, header:NAME or query:NAME");
        match s.as_str() {
            "ip" => Ok(SubjectSpec::Ip),
            "global" => Ok(SubjectSpec::Global),
            other => {
                if let Some(name) = other.strip_prefix("header:") {
                    http::HeaderName::from_bytes(name.trim().as_bytes())
                        .map(SubjectSpec::Header)
                        .map_err(|_| bad())
                } else if let Some(name) = other.strip_prefix("query:") {
                    if name.is_empty() {
                        Err(bad())
                    } else {
                        Ok(SubjectSpec::Query(name.to_owned()))
                    }
                } else {
                    Err(bad())
                }
            }
        }
    }
}

impl fmt::Display for SubjectSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectSpec::Ip => f.write_str("ip"),
            SubjectSpec::Global => f.write_str("global"),
            SubjectSpec::Header(h) => write!(f, "header:{h}"),
            SubjectSpec::Query(q) => write!(f, "query:{q}"),
        }
    }
}

/// Whether a limit rejects (`enforce`) or only reports what it would do (`shadow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Enforce,
    Shadow,
}

/// What a `header:`/`query:` limit does when the request does not carry that subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// Count the request against the client IP instead (the default).
    #[default]
    Ip,
    /// Answer 401 without calling the upstream.
    Reject,
}

/// The store behind the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    #[default]
    Memory,
    Redis,
    RedisCluster,
}

impl Backend {
    /// The name used in the config file and as the `backend` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis_cluster",
        }
    }
}

/// What a request gets when the store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
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

impl TryFrom<String> for RequestIdHeader {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let name = http::HeaderName::from_bytes(s.trim().as_bytes())
            .map_err(|_| format!("invalid header name {s:?}"))?;
        if name.as_str().contains('_') {
            return Err(format!(
                "header name {s:?} contains '_'; such headers are dropped (use '-')"
            ));
        }
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
            return Ok(default_request_id_header());
        }
        Ok(RequestIdHeader(name))
    }
}

/// The access log's line format (`[log] format`); only JSON for now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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

/// A CIDR (`10.0.0.0/8`) or a bare address (taken as /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr(pub IpNet);

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(Cidr(net.trunc()));
        }
        t.parse::<std::net::IpAddr>()
            .map(|ip| Cidr(IpNet::from(ip)))
            .map_err(|_| {
                format!("invalid CIDR {s:?}; expected e.g. \"10.0.0.0/8\" or \"192.0.2.7\"")
            })
    }
}

// ---------------------------------------------------------------------------------------------
// The raw file.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    log: RawLog,
    #[serde(default)]
    upstreams: Vec<crate::upstream::config::RawUpstream>,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default = "default_listen")]
    listen: ListenAddr,
    #[serde(default)]
    trusted_proxies: Vec<Cidr>,
    #[serde(default)]
    tls: Option<RawTls>,
    #[serde(default = "default_header_read_timeout")]
    header_read_timeout: HumanDuration,
    #[serde(default = "default_idle_timeout")]
    idle_timeout: HumanDuration,
    #[serde(default = "default_body_read_timeout")]
    body_read_timeout: HumanDuration,
    #[serde(default = "default_grace_period")]
    grace_period: HumanDuration,
    #[serde(default = "default_max_header_bytes")]
    max_header_bytes: usize,
    #[serde(default = "default_max_uri_bytes")]
    max_uri_bytes: usize,
    #[serde(default = "default_h2_max_concurrent_streams")]
    h2_max_concurrent_streams: u32,
    /// Worker threads, each with its own listener socket; default: the number of cores.
    #[serde(default)]
    workers: Option<usize>,
    #[serde(default = "default_request_id_header")]
    request_id_header: RequestIdHeader,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: default_listen(),
            trusted_proxies: Vec::new(),
            tls: None,
            header_read_timeout: default_header_read_timeout(),
            idle_timeout: default_idle_timeout(),
            body_read_timeout: default_body_read_timeout(),
            grace_period: default_grace_period(),
            max_header_bytes: default_max_header_bytes(),
            max_uri_bytes: default_max_uri_bytes(),
            h2_max_concurrent_streams: default_h2_max_concurrent_streams(),
            workers: None,
            request_id_header: default_request_id_header(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    #[serde(default = "default_admin_listen")]
    listen: ListenAddr,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: default_admin_listen(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(default)]
    backend: Backend,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    urls: Vec<String>,
    #[serde(default = "default_store_timeout")]
    timeout: HumanDuration,
    #[serde(default)]
    on_error: OnError,
    #[serde(default = "default_key_prefix")]
    key_prefix: String,
    #[serde(default = "default_max_subjects")]
    max_subjects: NonZeroU64,
    #[serde(default = "default_deny_cache")]
    deny_cache: bool,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            backend: Backend::Memory,
            url: None,
            urls: Vec::new(),
            timeout: default_store_timeout(),
            on_error: OnError::Allow,
            key_prefix: default_key_prefix(),
            max_subjects: default_max_subjects(),
            deny_cache: default_deny_cache(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    #[serde(default = "default_access")]
    access: String,
    #[serde(default)]
    format: LogFormat,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            access: default_access(),
            format: LogFormat::Json,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: String,
    path_prefix: String,
    upstream: UpstreamRef,
    #[serde(default = "default_route_timeout")]
    timeout: HumanDuration,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    methods: Option<Vec<String>>,
    #[serde(default)]
    strip_prefix: bool,
    #[serde(default)]
    preserve_host: bool,
    #[serde(default = "default_true")]
    rate_limit_headers: bool,
    #[serde(default = "default_max_body_size")]
    max_body_size: u64,
    #[serde(default)]
    limits: Vec<RawLimit>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    name: String,
    algorithm: Algorithm,
    limit: NonZeroU64,
    period: HumanDuration,
    subject: SubjectSpec,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    cost: Option<NonZeroU64>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    on_missing: OnMissing,
}

fn default_access() -> String {
    "off".to_owned()
}
fn default_request_id_header() -> RequestIdHeader {
    RequestIdHeader(http::HeaderName::from_static("x-request-id"))
}
fn default_listen() -> ListenAddr {
    ListenAddr(SocketAddr::from(([0, 0, 0, 0], 8080)))
}
fn default_admin_listen() -> ListenAddr {
    ListenAddr(SocketAddr::from(([127, 0, 0, 1], 9090)))
}
fn default_header_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
fn default_body_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_grace_period() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_max_header_bytes() -> usize {
    64 * 1024
}
fn default_max_uri_bytes() -> usize {
    8 * 1024
}
fn default_h2_max_concurrent_streams() -> u32 {
    256
}
fn default_store_timeout() -> HumanDuration {
    HumanDuration(Duration::from_millis(50))
}
fn default_key_prefix() -> String {
    "tollgate".to_owned()
}
fn default_max_subjects() -> NonZeroU64 {
    NonZeroU64::new(100_000).unwrap_or(NonZeroU64::MIN)
}
fn default_deny_cache() -> bool {
    true
}
fn default_route_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_true() -> bool {
    true
}
fn default_max_body_size() -> u64 {
    10 * 1024 * 1024
}

// ---------------------------------------------------------------------------------------------
// The validated configuration.
// ---------------------------------------------------------------------------------------------

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub store: StoreConfig,
    pub log: LogConfig,
    /// `[[upstreams]]` groups, in config order.
    pub upstreams: Vec<UpstreamConfig>,
    pub routes: Vec<RouteConfig>,
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub trusted_proxies: Vec<IpNet>,
    pub tls: Option<TlsConfig>,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub body_read_timeout: Duration,
    pub grace_period: Duration,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub h2_max_concurrent_streams: u32,
    /// Worker threads (each a single-threaded runtime with its own `SO_REUSEPORT` listener).
    pub workers: usize,
    /// The header that carries the request id (`x-request-id`).
    pub request_id_header: http::HeaderName,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub access: AccessTarget,
    pub format: LogFormat,
}

/// The most `[server] workers` accepted.
pub const MAX_WORKERS: usize = 1024;

/// The default `[server] workers`: the number of cores this process may use.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `[server.tls]`, with paths resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[admin]`.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub backend: Backend,
    /// Redis URLs: one for `redis`, the seed nodes for `redis_cluster`, none for `memory`.
    pub urls: Vec<String>,
    pub timeout: Duration,
    pub on_error: OnError,
    pub key_prefix: String,
    pub max_subjects: u64,
    pub deny_cache: bool,
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// Normalised: starts with `/`, no trailing `/` (except the root prefix `/`).
    pub path_prefix: String,
    /// A URL, or the name of a group of [`Config::upstreams`] (checked to exist).
    pub upstream: UpstreamRef,
    pub timeout: Duration,
    pub host: Option<String>,
    /// `None`: every method.
    pub methods: Option<Vec<Method>>,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    pub rate_limit_headers: bool,
    pub max_body_size: u64,
    pub limits: Vec<LimitConfig>,
}

/// One `[[routes.limits]]` entry, with defaults resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitConfig {
    pub name: String,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period: Duration,
    pub subject: SubjectSpec,
    /// Resolved: token_bucket/gcra default to `limit`, leaky_bucket to 0, windows ignore it.
    pub burst: u64,
    pub cost: u64,
    pub mode: Mode,
    pub on_missing: OnMissing,
}

/// The largest integer both Rust and Redis's Lua (IEEE doubles) compute with exactly.
const EXACT_MAX: u128 = 1 << 53;

/// The longest `[server]` timeout, `grace_period` or route `timeout`: one day. Longer is a typo,
/// and an unbounded duration overflows when added to an `Instant`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The longest `store.timeout`: a rate-limit decision that may take longer than a minute no
/// longer protects anything.
pub const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest limit `period`: one year (humantime's `1y`, 365.25 days).
pub const MAX_PERIOD: Duration = Duration::from_secs(31_557_600);

/// Checks that the duration at `field` is at most `max` (written `max_text` in the error) and,
/// unless `zero_ok`, positive.
fn bounded(
    field: impl Into<String>,
    d: HumanDuration,
    max: Duration,
    max_text: &str,
    zero_ok: bool,
) -> Result<Duration, ConfigError> {
    if d.0.is_zero() && !zero_ok {
        return Err(invalid(field, "must be positive"));
    }
    if d.0 > max {
        return Err(invalid(
            field,
            format!(
                "{} is too long; the maximum is {max_text}",
                humantime::format_duration(d.0)
            ),
        ));
    }
    Ok(d.0)
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        Config::parse(&text, base).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Reads and validates the file at `path` and loads every file it names (the `[server.tls]`
    /// certificate and key): exactly what `tollgate check` checks and what a reload must pass,
    /// in one place so that the two can never disagree.
    pub fn load_and_check(path: &Path) -> Result<Config, ConfigError> {
        let config = Config::load(path)?;
        config.check_files()?;
        Ok(config)
    }

    /// Loads the files the configuration names, so a missing or unreadable file is a config
    /// error now rather than a failed start-up later.
    fn check_files(&self) -> Result<(), ConfigError> {
        if let Some(t) = &self.server.tls {
            crate::tls::load(t).map_err(|e| invalid("server.tls", e))?;
        }
        // The access log is opened by its writer thread, never here: opening a FIFO would
        // block. Its directory must exist, and the path must not be a directory.
        if let AccessTarget::File(p) = &self.log.access {
            if p.is_dir() {
                return Err(invalid(
                    "log.access",
                    format!("{} is a directory", p.display()),
                ));
            }
            let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
            if dir.is_some_and(|d| !d.is_dir()) {
                return Err(invalid(
                    "log.access",
                    format!("the directory of {} does not exist", p.display()),
                ));
            }
        }
        for (i, u) in self.upstreams.iter().enumerate() {
            if u.is_https() {
                crate::upstream::tls::client_config(&u.tls)
                    .map_err(|e| invalid(format!("upstreams[{i}].tls.ca"), e))?;
            }
        }
        Ok(())
    }

    /// What is valid but dangerous (`tls.verify = false`): printed by `tollgate check` and
    /// logged at start-up and on reload.
    pub fn warnings(&self) -> Vec<String> {
        self.upstreams
            .iter()
            .enumerate()
            .filter(|(_, u)| u.is_https() && !u.tls.verify)
            .map(|(i, u)| {
                format!(
                    "`upstreams[{i}].tls.verify` is false: the certificates of group {:?} are NOT checked; \
                     anyone on the path can impersonate its servers",
                    u.name
                )
            })
            .collect()
    }

    /// Parses and validates TOML text; relative file paths are resolved against `base_dir`.
    pub fn parse(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            message: e.to_string().trim_end().to_owned(),
        })?;
        Config::from_raw(raw, base_dir)
    }

    fn from_raw(raw: RawConfig, base_dir: &Path) -> Result<Config, ConfigError> {
        let s = raw.server;
        if s.max_header_bytes < 8192 {
            return Err(invalid("server.max_header_bytes", "must be at least 8192"));
        }
        if s.max_uri_bytes < 64 {
            return Err(invalid("server.max_uri_bytes", "must be at least 64"));
        }
        if s.h2_max_concurrent_streams == 0 {
            return Err(invalid(
                "server.h2_max_concurrent_streams",
                "must be positive",
            ));
        }
        let timeout = |field: &str, d: HumanDuration, zero_ok: bool| {
            bounded(format!("server.{field}"), d, MAX_TIMEOUT, "1day", zero_ok)
        };
        let header_read_timeout = timeout("header_read_timeout", s.header_read_timeout, false)?;
        let idle_timeout = timeout("idle_timeout", s.idle_timeout, false)?;
        let body_read_timeout = timeout("body_read_timeout", s.body_read_timeout, false)?;
        // Zero grace is meaningful: on SIGTERM, close in-flight requests at once.
        let grace_period = timeout("grace_period", s.grace_period, true)?;
        let workers = match s.workers {
            None => default_workers(),
            Some(n) if (1..=MAX_WORKERS).contains(&n) => n,
            Some(_) => {
                return Err(invalid(
                    "server.workers",
                    format!("must be between 1 and {MAX_WORKERS}"),
                ))
            }
        };
        let server = ServerConfig {
            listen: s.listen.0,
            trusted_proxies: s.trusted_proxies.iter().map(|c| c.0).collect(),
            tls: s.tls.map(|t| TlsConfig {
                cert: base_dir.join(t.cert),
                key: base_dir.join(t.key),
            }),
            header_read_timeout,
            idle_timeout,
            body_read_timeout,
            grace_period,
            max_header_bytes: s.max_header_bytes,
            max_uri_bytes: s.max_uri_bytes,
            h2_max_concurrent_streams: s.h2_max_concurrent_streams,
            workers,
            request_id_header: s.request_id_header.0,
        };
        let log = LogConfig {
            access: match raw.log.access.as_str() {
                "off" => AccessTarget::Off,
                "stdout" => AccessTarget::Stdout,
                "" => {
                    return Err(invalid(
                        "log.access",
                        "expected \"off\", \"stdout\" or a file path",
                    ))
                }
                path => AccessTarget::File(base_dir.join(path)),
            },
            format: raw.log.format,
        };

        let store = validate_store(raw.store)?;

        let mut upstreams: Vec<UpstreamConfig> = Vec::with_capacity(raw.upstreams.len());
        for (i, u) in raw.upstreams.into_iter().enumerate() {
            let u = crate::upstream::config::validate(i, u, base_dir, is_label_safe)
                .map_err(|(field, message)| invalid(field, message))?;
            if upstreams.iter().any(|o| o.name == u.name) {
                return Err(invalid(
                    format!("upstreams[{i}].name"),
                    format!("duplicate upstream name {:?}", u.name),
                ));
            }
            upstreams.push(u);
        }

        let mut routes = Vec::with_capacity(raw.routes.len());
        let mut names = HashSet::new();
        let mut keys = HashSet::new();
        for (i, r) in raw.routes.into_iter().enumerate() {
            let route = validate_route(i, r)?;
            if let UpstreamRef::Group(g) = &route.upstream {
                if !upstreams.iter().any(|u| &u.name == g) {
                    return Err(invalid(
                        format!("routes[{i}].upstream"),
                        format!("no [[upstreams]] group is named {g:?}"),
                    ));
                }
            }
            if !names.insert(route.name.clone()) {
                return Err(invalid(
                    format!("routes[{i}].name"),
                    format!("duplicate route name {:?}", route.name),
                ));
            }
            let key = (
                route.host.clone(),
                route.path_prefix.clone(),
                route.methods.clone(),
            );
            if !keys.insert(key) {
                return Err(invalid(
                    format!("routes[{i}].path_prefix"),
                    "another route has the same host, path_prefix and methods",
                ));
            }
            routes.push(route);
        }
        Ok(Config {
            server,
            admin: AdminConfig {
                listen: raw.admin.listen.0,
            },
            store,
            log,
            upstreams,
            routes,
        })
    }
}

fn validate_store(s: RawStore) -> Result<StoreConfig, ConfigError> {
    let urls = match s.backend {
        Backend::Memory => Vec::new(),
        Backend::Redis => {
            if !s.urls.is_empty() {
                return Err(invalid(
                    "store.urls",
                    "is for backend = \"redis_cluster\"; use `url`",
                ));
            }
            vec![s.url.unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())]
        }
        Backend::RedisCluster => {
            if s.url.is_some() {
                return Err(invalid(
                    "store.url",
                    "is for backend = \"redis\"; use `urls`",
                ));
            }
            if s.urls.is_empty() {
                return Err(invalid(
                    "store.urls",
                    "redis_cluster needs at least one node URL",
                ));
            }
            s.urls
        }
    };
    for (i, u) in urls.iter().enumerate() {
        let field = if s.backend == Backend::Redis {
            "store.url".to_owned()
        } else {
            format!("store.urls[{i}]")
        };
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            return Err(invalid(
                field,
                format!("{u:?} must start with redis:// or rediss://"),
            ));
        }
        if redis::IntoConnectionInfo::into_connection_info(u.as_str()).is_err() {
            return Err(invalid(field, format!("{u:?} is not a valid Redis URL")));
        }
    }
    let timeout = bounded("store.timeout", s.timeout, MAX_STORE_TIMEOUT, "60s", false)?;
    if s.key_prefix.is_empty()
        || !s
            .key_prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    {
        return Err(invalid(
            "store.key_prefix",
            "must be non-empty and use only letters, digits, '-', '_', '.', ':'",
        ));
    }
    Ok(StoreConfig {
        backend: s.backend,
        urls,
        timeout,
        on_error: s.on_error,
        key_prefix: s.key_prefix,
        max_subjects: s.max_subjects.get(),
        deny_cache: s.deny_cache,
    })
}

fn is_label_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// A route's `host`, as requests' hosts are matched: lower-case, without a port, and without
/// the one trailing dot a fully qualified name may carry (`example.com.` is `example.com`).
fn route_host(raw: &str) -> Result<String, String> {
    let lower = raw.trim().to_ascii_lowercase();
    let h = lower.strip_suffix('.').unwrap_or(&lower);
    let bad = || format!("{raw:?} is not a valid host name");
    if h.is_empty() || h.ends_with('.') || h.contains('@') {
        return Err(bad());
    }
    let authority = h.parse::<http::uri::Authority>().map_err(|_| bad())?;
    if authority.host() != h {
        return Err(format!(
            "{raw:?} must be a host name without a port (the port of a request's Host is ignored)"
        ));
    }
    Ok(h.to_owned())
}

fn validate_route(i: usize, r: RawRoute) -> Result<RouteConfig, ConfigError> {
    let at = |field: &str| format!("routes[{i}].{field}");
    if !is_label_safe(&r.name) {
        return Err(invalid(
            at("name"),
            format!("{:?}: use 1-64 letters, digits, '-', '_' or '.'", r.name),
        ));
    }
    if r.name == crate::metrics::UNMATCHED_ROUTE {
        return Err(invalid(
            at("name"),
            "\"unmatched\" is reserved for requests with no route",
        ));
    }
    let prefix = r.path_prefix.trim();
    if prefix.contains(['?', '#']) {
        return Err(invalid(
            at("path_prefix"),
            format!("{prefix:?} must be a path only, without '?' or '#' (routes match the path)"),
        ));
    }
    if !prefix.starts_with('/') {
        return Err(invalid(
            at("path_prefix"),
            format!("{prefix:?} must start with '/'"),
        ));
    }
    if crate::path::normalize(prefix).ok().as_deref() != Some(prefix) {
        return Err(invalid(
            at("path_prefix"),
            format!("{prefix:?} must be a normalised path (no '.', '..', '//', '%2f' or '?')"),
        ));
    }
    let path_prefix = if prefix.len() > 1 {
        prefix.trim_end_matches('/').to_owned()
    } else {
        prefix.to_owned()
    };
    let timeout = bounded(at("timeout"), r.timeout, MAX_TIMEOUT, "1day", false)?;
    let host = match r.host {
        Some(h) => Some(route_host(&h).map_err(|m| invalid(at("host"), m))?),
        None => None,
    };
    let methods = match r.methods {
        Some(ms) => {
            if ms.is_empty() {
                return Err(invalid(
                    at("methods"),
                    "must list at least one method (or be left out)",
                ));
            }
            let mut out = Vec::with_capacity(ms.len());
            for m in ms {
                let upper = m.trim().to_ascii_uppercase();
                let method = Method::from_bytes(upper.as_bytes())
                    .map_err(|_| invalid(at("methods"), format!("{m:?} is not an HTTP method")))?;
                out.push(method);
            }
            Some(out)
        }
        None => None,
    };
    if r.max_body_size == 0 {
        return Err(invalid(at("max_body_size"), "must be positive"));
    }
    let mut limits = Vec::with_capacity(r.limits.len());
    let mut names = HashSet::new();
    for (j, l) in r.limits.into_iter().enumerate() {
        let lat = |field: &str| format!("routes[{i}].limits[{j}].{field}");
        if !is_label_safe(&l.name) {
            return Err(invalid(
                lat("name"),
                format!("{:?}: use 1-64 letters, digits, '-', '_' or '.'", l.name),
            ));
        }
        if !names.insert(l.name.clone()) {
            return Err(invalid(
                lat("name"),
                format!("duplicate limit name {:?} in this route", l.name),
            ));
        }
        let limit = l.limit.get();
        let period_us = l.period.0.as_micros();
        if l.period.0 < Duration::from_millis(1) {
            return Err(invalid(lat("period"), "must be at least 1ms"));
        }
        bounded(
            lat("period"),
            l.period,
            MAX_PERIOD,
            "1year (365.25 days)",
            false,
        )?;
        if period_us % 1000 != 0 {
            return Err(invalid(
                lat("period"),
                "must be a whole number of milliseconds",
            ));
        }
        let burst = match l.algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                if l.burst.is_some() {
                    return Err(invalid(
                        lat("burst"),
                        format!("{} has no burst; leave it out", l.algorithm.as_str()),
                    ));
                }
                0
            }
            Algorithm::TokenBucket | Algorithm::Gcra => match l.burst {
                Some(0) => return Err(invalid(lat("burst"), "must be positive")),
                Some(b) => b,
                None => limit,
            },
            Algorithm::LeakyBucket => l.burst.unwrap_or(0),
        };
        let cost = l.cost.map_or(1, NonZeroU64::get);
        let capacity = match l.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => burst,
            Algorithm::LeakyBucket => burst.saturating_add(1),
            _ => limit,
        };
        if cost > capacity {
            return Err(invalid(
                lat("cost"),
                format!("cost {cost} can never be admitted (the bucket holds {capacity})"),
            ));
        }
        if matches!(l.algorithm, Algorithm::Gcra | Algorithm::LeakyBucket)
            && period_us / u128::from(limit) == 0
        {
            return Err(invalid(lat("limit"), "period / limit must be at least 1µs"));
        }
        if matches!(l.algorithm, Algorithm::SlidingLog) && limit > 100_000 {
            return Err(invalid(
                lat("limit"),
                "sliding_log keeps one entry per request; use at most 100000 (or sliding_window)",
            ));
        }
        if u128::from(limit.max(burst).saturating_add(cost))
            .checked_mul(period_us.max(1))
            .is_none_or(|n| n >= EXACT_MAX)
        {
            // Name the key that made the product too large.
            let field = if burst > limit { "burst" } else { "limit" };
            return Err(invalid(
                lat(field),
                format!("{field} × period is too large to compute exactly (keep it under 2^53 µs)"),
            ));
        }
        if let (SubjectSpec::Ip | SubjectSpec::Global, OnMissing::Reject) =
            (&l.subject, l.on_missing)
        {
            return Err(invalid(
                lat("on_missing"),
                "only applies to header: and query: subjects",
            ));
        }
        limits.push(LimitConfig {
            name: l.name,
            algorithm: l.algorithm,
            limit,
            period: l.period.0,
            subject: l.subject,
            burst,
            cost,
            mode: l.mode,
            on_missing: l.on_missing,
        });
    }
    Ok(RouteConfig {
        name: r.name,
        path_prefix,
        upstream: r.upstream,
        timeout,
        host,
        methods,
        strip_prefix: r.strip_prefix,
        preserve_host: r.preserve_host,
        rate_limit_headers: r.rate_limit_headers,
        max_body_size: r.max_body_size,
        limits,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn workers_default_to_the_cores_and_are_bounded() {
        let base =
            "[[routes]]\nname = \"a\"\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n";
        let c = Config::parse(base, Path::new(".")).unwrap();
        assert_eq!(c.server.workers, default_workers());
        let c = Config::parse(&format!("[server]\nworkers = 3\n{base}"), Path::new(".")).unwrap();
        assert_eq!(c.server.workers, 3);
        for bad in ["0", "1025"] {
            let e = Config::parse(
                &format!("[server]\nworkers = {bad}\n{base}"),
                Path::new("."),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("server.workers"), "{e}");
        }
    }
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("."))
    }

    const ROUTE: &str = r#"
[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://127.0.0.1:3000"
"#;

    fn with_limit(limit: &str) -> String {
        format!("{ROUTE}\n[[routes.limits]]\n{limit}")
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("config unexpectedly valid:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn log_and_request_id_header() {
        let c = parse(ROUTE).unwrap();
        assert_eq!(c.log.access, AccessTarget::Off);
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.server.request_id_header.as_str(), "x-request-id");
        let c = parse(&format!(
            "[server]\nrequest_id_header = \"X-Trace\"\n[log]\naccess = \"stdout\"\nformat = \"json\"\n{ROUTE}"
        ))
        .unwrap();
        assert_eq!(c.log.access, AccessTarget::Stdout);
        assert_eq!(c.server.request_id_header.as_str(), "x-trace");
        let c = parse(&format!("[log]\naccess = \"logs/access.log\"\n{ROUTE}")).unwrap();
        assert_eq!(
            c.log.access,
            AccessTarget::File(Path::new(".").join("logs/access.log"))
        );
        let e = err(&format!("[log]\nformat = \"text\"\n{ROUTE}"));
        assert!(e.contains("format") && e.contains("line 2"), "{e}");
        let e = err(&format!("[log]\naccess = \"\"\n{ROUTE}"));
        assert!(e.contains("log.access"), "{e}");
        let e = err(&format!("[log]\nlevel = \"info\"\n{ROUTE}"));
        assert!(e.contains("level"), "{e}");
        for bad in ["x_request_id", "host", "bad header"] {
            let e = err(&format!("[server]\nrequest_id_header = \"{bad}\"\n{ROUTE}"));
            assert!(e.contains("request_id_header"), "{bad}: {e}");
        }
    }

    #[test]
    fn defaults_are_documented_values() {
        let c = parse(ROUTE).unwrap();
        assert_eq!(c.server.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(c.admin.listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.store.backend, Backend::Memory);
        assert_eq!(c.store.timeout, Duration::from_millis(50));
        assert_eq!(c.routes[0].timeout, Duration::from_secs(30));
        assert_eq!(
            c.routes[0].upstream.url().unwrap().authority.as_str(),
            "127.0.0.1:3000"
        );
        assert_eq!(c.server.max_header_bytes, 65536);
    }

    #[test]
    fn full_limit_parses_with_resolved_defaults() {
        let c = parse(&with_limit(
            "name = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"ip\"",
        ))
        .unwrap();
        let l = &c.routes[0].limits[0];
        assert_eq!(l.algorithm, Algorithm::Gcra);
        assert_eq!(l.burst, 100);
        assert_eq!(l.cost, 1);
        assert_eq!(l.period, Duration::from_secs(60));
        assert_eq!(l.mode, Mode::Enforce);
    }

    #[test]
    fn unknown_algorithm_names_the_value_and_line() {
        let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"fixed_windoww\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"",
        ));
        assert!(e.contains("fixed_windoww"), "{e}");
        assert!(e.contains("line 9"), "{e}");
    }

    #[test]
    fn zero_limit_is_rejected() {
        let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"gcra\"\nlimit = 0\nperiod = \"1s\"\nsubject = \"ip\"",
        ));
        assert!(e.contains("limit") && e.contains("line 10"), "{e}");
    }

    #[test]
    fn bad_duration_is_rejected() {
        let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"soon\"\nsubject = \"ip\"",
        ));
        assert!(e.contains("period") && e.contains("soon"), "{e}");
    }

    #[test]
    fn bad_cidr_is_rejected() {
        let e = err("[server]\ntrusted_proxies = [\"10.0.0.0/99\"]\n");
        assert!(
            e.contains("trusted_proxies") && e.contains("10.0.0.0/99"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected_everywhere() {
        for text in [
            "[server]\nlisten_addr = \"0.0.0.0:1\"\n".to_owned(),
            "[store]\nbackend = \"memory\"\nttl = 3\n".to_owned(),
            format!("{ROUTE}prefix = \"/x\"\n"),
            with_limit("name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\nrate = 3"),
            "[extra]\na = 1\n".to_owned(),
        ] {
            let e = err(&text);
            assert!(e.contains("unknown field"), "{e}");
        }
    }

    #[test]
    fn cross_field_rules_name_the_field() {
        let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1s\"\nsubject = \"ip\"\ncost = 3",
        ));
        assert!(e.contains("routes[0].limits[0].cost"), "{e}");
        let e = err(&format!("{ROUTE}{ROUTE}"));
        assert!(e.contains("routes[1].name"), "{e}");
        let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"sliding_window\"\nlimit = 2\nperiod = \"1s\"\nsubject = \"ip\"\nburst = 3",
        ));
        assert!(e.contains("routes[0].limits[0].burst"), "{e}");
        let e =
            err("[[routes]]\nname = \"a\"\npath_prefix = \"/a/../b\"\nupstream = \"http://x:1\"\n");
        assert!(e.contains("routes[0].path_prefix"), "{e}");
    }

    #[test]
    fn subjects_parse() {
        assert_eq!(SubjectSpec::try_from("ip".to_owned()), Ok(SubjectSpec::Ip));
        assert_eq!(
            SubjectSpec::try_from("header:X-Api-Key".to_owned()),
            Ok(SubjectSpec::Header(http::HeaderName::from_static(
                "x-api-key"
            )))
        );
        assert_eq!(
            SubjectSpec::try_from("query:key".to_owned()),
            Ok(SubjectSpec::Query("key".to_owned()))
        );
        assert!(SubjectSpec::try_from("cookie:x".to_owned()).is_err());
        assert!(SubjectSpec::try_from("header:bad header".to_owned()).is_err());
    }

    #[test]
    fn upstream_urls() {
        let u = UpstreamUrl::try_from("http://h:1/base/".to_owned()).unwrap();
        assert_eq!(u.base_path, "/base");
        assert!(UpstreamUrl::try_from("ftp://h:1".to_owned()).is_err());
        assert!(UpstreamUrl::try_from("/nohost".to_owned()).is_err());
    }

    /// A config with one limited route; `server`, `store`, `route` and `limit` are extra lines
    /// for those tables.
    fn durations(server: &str, store: &str, route: &str, limit: &str) -> String {
        format!(
            "[server]\n{server}\n[store]\n{store}\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\n\
             upstream = \"http://127.0.0.1:3000\"\n{route}\n[[routes.limits]]\nname = \"l\"\n\
             algorithm = \"fixed_window\"\nlimit = 1\nsubject = \"ip\"\n{limit}\n"
        )
    }

    /// Every duration key, as (key path, config with that key set to `value`).
    fn every_duration_key(value: &str) -> Vec<(&'static str, String)> {
        let p = "period = \"1s\"";
        let set = |k: &str| format!("{k} = \"{value}\"");
        vec![
            (
                "server.header_read_timeout",
                durations(&set("header_read_timeout"), "", "", p),
            ),
            (
                "server.idle_timeout",
                durations(&set("idle_timeout"), "", "", p),
            ),
            (
                "server.body_read_timeout",
                durations(&set("body_read_timeout"), "", "", p),
            ),
            (
                "server.grace_period",
                durations(&set("grace_period"), "", "", p),
            ),
            ("store.timeout", durations("", &set("timeout"), "", p)),
            ("routes[0].timeout", durations("", "", &set("timeout"), p)),
            (
                "routes[0].limits[0].period",
                durations("", "", "", &set("period")),
            ),
        ]
    }

    #[test]
    fn absurd_durations_are_refused_naming_the_key() {
        for (key, text) in every_duration_key("500000000000y") {
            let e = err(&text);
            assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
        }
    }

    #[test]
    fn durations_just_over_their_bound_are_refused_naming_the_key() {
        // Timeouts: 1 day; store.timeout: 60 s; limit periods: 1 year (365.25 days).
        for (key, text) in every_duration_key("1day 1ms") {
            if key == "routes[0].limits[0].period" || key == "store.timeout" {
                continue;
            }
            let e = err(&text);
            assert!(
                e.contains(&format!("`{key}`")) && e.contains("1day"),
                "{key}: {e}"
            );
        }
        let e = err(&durations(
            "",
            "timeout = \"60001ms\"",
            "",
            "period = \"1s\"",
        ));
        assert!(e.contains("`store.timeout`") && e.contains("60s"), "{e}");
        let e = err(&durations("", "", "", "period = \"1y 1ms\""));
        assert!(
            e.contains("`routes[0].limits[0].period`") && e.contains("1year"),
            "{e}"
        );
    }

    #[test]
    fn durations_at_their_bound_are_accepted() {
        let c = parse(&durations(
            "header_read_timeout = \"1day\"\nidle_timeout = \"24h\"\nbody_read_timeout = \"1d\"\n\
             grace_period = \"1day\"",
            "timeout = \"60s\"",
            "timeout = \"1day\"",
            "period = \"1y\"",
        ))
        .unwrap();
        let day = Duration::from_secs(86_400);
        assert_eq!(c.server.header_read_timeout, day);
        assert_eq!(c.server.grace_period, day);
        assert_eq!(c.store.timeout, Duration::from_secs(60));
        assert_eq!(c.routes[0].timeout, day);
        assert_eq!(
            c.routes[0].limits[0].period,
            Duration::from_secs(31_557_600)
        );
    }

    #[test]
    fn zero_durations_are_refused_where_they_make_no_sense() {
        for (key, text) in every_duration_key("0s") {
            if key == "server.grace_period" {
                // Zero grace: close in-flight requests at once on SIGTERM. Meaningful.
                assert!(parse(&text).is_ok(), "{key}");
                continue;
            }
            let e = err(&text);
            assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
        }
    }

    #[test]
    fn the_largest_burst_is_refused_not_a_panic() {
        for algorithm in ["leaky_bucket", "token_bucket", "gcra"] {
            let e = err(&with_limit(&format!(
                "name = \"x\"\nalgorithm = \"{algorithm}\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\n\
                 burst = 18446744073709551615"
            )));
            assert!(
                e.contains("`routes[0].limits[0].burst`"),
                "{algorithm}: {e}"
            );
        }
    }

    fn with_upstream(upstream: &str) -> String {
        format!("[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"{upstream}\"\n")
    }

    #[test]
    fn upstream_with_user_info_is_refused() {
        for u in [
            "http://user:pw@127.0.0.1:3000",
            "http://user@127.0.0.1:3000/base",
        ] {
            let e = err(&with_upstream(u));
            assert!(
                e.contains("upstream") && e.contains("user-info") && e.contains("line 4"),
                "{u}: {e}"
            );
        }
    }

    #[test]
    fn upstream_port_above_65535_is_refused() {
        for u in ["http://127.0.0.1:65536", "http://h:99999999"] {
            let e = err(&with_upstream(u));
            assert!(
                e.contains("upstream") && e.contains("port") && e.contains("line 4"),
                "{u}: {e}"
            );
        }
        let e = err(&with_upstream("http://127.0.0.1:0"));
        assert!(e.contains("upstream") && e.contains("port"), "{e}");
        let c = parse(&with_upstream("http://127.0.0.1:65535")).unwrap();
        assert_eq!(
            c.routes[0].upstream.url().unwrap().authority.port_u16(),
            Some(65535)
        );
        for ok in ["http://example.com/base", "http://[::1]:8080"] {
            assert!(parse(&with_upstream(ok)).is_ok(), "{ok}");
        }
    }

    fn with_host(host: &str) -> String {
        format!("{ROUTE}host = \"{host}\"\n")
    }

    #[test]
    fn route_host_with_a_port_is_refused() {
        for h in ["api.example.com:8080", "[::1]:443", "user@api.example.com"] {
            let e = err(&with_host(h));
            assert!(e.contains("`routes[0].host`"), "{h}: {e}");
        }
        let c = parse(&with_host("[::1]")).unwrap();
        assert_eq!(c.routes[0].host.as_deref(), Some("[::1]"));
    }

    #[test]
    fn route_host_is_lowercased_and_loses_one_trailing_dot() {
        let c = parse(&with_host("Free.Example.COM.")).unwrap();
        assert_eq!(c.routes[0].host.as_deref(), Some("free.example.com"));
        let c = parse(&with_host("free.example.com")).unwrap();
        assert_eq!(c.routes[0].host.as_deref(), Some("free.example.com"));
        for h in ["free.example.com..", "."] {
            let e = err(&with_host(h));
            assert!(e.contains("`routes[0].host`"), "{h}: {e}");
        }
    }

    #[test]
    fn path_prefix_with_query_or_fragment_is_refused() {
        for prefix in ["/api?x=1", "/api?", "/api#frag", "/#"] {
            let e = err(&format!(
                "[[routes]]\nname = \"a\"\npath_prefix = \"{prefix}\"\nupstream = \"http://x:1\"\n"
            ));
            assert!(e.contains("`routes[0].path_prefix`"), "{prefix}: {e}");
        }
    }

    #[test]
    fn redis_backend_needs_valid_url() {
        let e = err("[store]\nbackend = \"redis\"\nurl = \"http://x\"\n");
        assert!(e.contains("store.url"), "{e}");
        let c = parse(
            "[store]\nbackend = \"redis_cluster\"\nurls = [\"redis://a:1\", \"redis://b:2\"]\n",
        )
        .unwrap();
        assert_eq!(c.store.urls.len(), 2);
    }

    const GROUP: &str = "[[upstreams]]\nname = \"users\"\nservers = [\"http://127.0.0.1:3001\", { url = \"http://127.0.0.1:3002\", weight = 3 }]\n";

    fn grouped(group: &str, upstream: &str) -> String {
        format!("{group}\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"{upstream}\"\n")
    }

    #[test]
    fn upstream_groups_parse_with_documented_defaults() {
        let c = parse(&grouped(GROUP, "users")).unwrap();
        let u = &c.upstreams[0];
        assert_eq!(u.servers.len(), 2);
        assert_eq!(u.servers[1].weight, 3);
        assert_eq!(u.balance, crate::upstream::Balance::RoundRobin);
        assert_eq!(u.max_fails, 1);
        assert_eq!(u.fail_timeout, Duration::from_secs(10));
        assert_eq!(u.retries, 1);
        assert_eq!(u.connect_timeout, Duration::from_secs(5));
        assert!(u.health_check.is_none());
        assert!(u.tls.verify);
        assert_eq!(c.routes[0].upstream, UpstreamRef::Group("users".into()));
        let c = parse(&grouped(
            &format!("{GROUP}[upstreams.health_check]\npath = \"/healthz\"\n"),
            "users",
        ))
        .unwrap();
        let h = c.upstreams[0].health_check.as_ref().unwrap();
        assert_eq!(
            (
                h.interval,
                h.timeout,
                h.healthy_threshold,
                h.unhealthy_threshold
            ),
            (Duration::from_secs(5), Duration::from_secs(1), 2, 3)
        );
    }

    #[test]
    fn upstream_errors_name_the_key() {
        let e = err(&grouped(GROUP, "nosuch"));
        assert!(
            e.contains("`routes[0].upstream`") && e.contains("nosuch"),
            "{e}"
        );
        let e = err(&grouped(
            "[[upstreams]]\nname = \"users\"\nservers = [\"http://127.0.0.1:3001\", \"ftp://x:1\"]\n",
            "users",
        ));
        assert!(e.contains("ftp://x:1") && e.contains("line 3"), "{e}");
        let e = err(&grouped(
            "[[upstreams]]\nname = \"users\"\nservers = [{ url = \"http://a:1\", weight = 0 }]\n",
            "users",
        ));
        assert!(e.contains("`upstreams[0].servers[0].weight`"), "{e}");
        let e = err(&grouped(
            "[[upstreams]]\nname = \"users\"\nservers = [\"http://a:1\", \"https://b:1\"]\n",
            "users",
        ));
        assert!(e.contains("`upstreams[0].servers[1]`"), "{e}");
        let e = err(&grouped(
            "[[upstreams]]\nname = \"users\"\nservers = [\"http://a:1/base\"]\n",
            "users",
        ));
        assert!(e.contains("`upstreams[0].servers[0]`"), "{e}");
        let e = err(&grouped(&format!("{GROUP}balance = \"random\"\n"), "users"));
        assert!(e.contains("random"), "{e}");
        let e = err(&grouped(&format!("{GROUP}{GROUP}"), "users"));
        assert!(e.contains("`upstreams[1].name`"), "{e}");
        let e = err(&grouped(
            &format!("{GROUP}[upstreams.tls]\nverify = false\n"),
            "users",
        ));
        assert!(e.contains("`upstreams[0].tls`"), "{e}");
        let e = err(&grouped(
            &format!("{GROUP}[upstreams.health_check]\nintervall = \"1s\"\n"),
            "users",
        ));
        assert!(
            e.contains("unknown field") && e.contains("intervall"),
            "{e}"
        );
        let e = err(&grouped(GROUP, "bad name!"));
        assert!(e.contains("bad name!"), "{e}");
    }

    #[test]
    fn https_route_urls_are_accepted() {
        let c = parse(&with_upstream("https://api.example.com/v1")).unwrap();
        let u = c.routes[0].upstream.url().unwrap();
        assert_eq!(u.scheme, http::uri::Scheme::HTTPS);
        assert_eq!(u.base_path, "/v1");
    }

    #[test]
    fn verify_false_is_a_warning() {
        let c = parse(&grouped(
            "[[upstreams]]\nname = \"users\"\nservers = [\"https://a:1\"]\n[upstreams.tls]\nverify = false\n",
            "users",
        ))
        .unwrap();
        let w = c.warnings();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("upstreams[0].tls.verify"), "{w:?}");
    }
}
