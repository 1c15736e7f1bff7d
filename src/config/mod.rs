//! Configuration: the TOML file as serde structs, then one validation step into domain types.
//!
//! Two layers (house style point 4): the `Raw*` structs ([`raw`]) mirror `gateway.toml` one to
//! one, with `deny_unknown_fields` everywhere so a typo is an error rather than a silently ignored
//! key. Scalar values that have a domain type ([`values`]: durations, addresses, CIDRs, URLs,
//! algorithms, subjects) are parsed while deserialising, so the TOML parser reports the line and
//! key of a bad value. Rules that span several fields (unique names, `cost` within the bucket, …)
//! are checked by `Config::from_raw` and the `validate_*` functions of [`store`], [`route`] and
//! [`limit`], whose errors name the field by its path (`routes[1].limits[0].cost`).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use crate::config::upstream::UpstreamConfig;

mod batched;
mod cache;
mod compression;
mod consumers;
mod cost_from;
mod fleet;
pub mod http3;
mod jwt;
mod limit;
mod limit_rate;
mod proxy_protocol;
mod raw;
mod refusal;
mod response;
pub mod rls;
pub mod rls_model;
mod route;
pub mod route_match;
pub mod schema;
mod store;
mod subject;
#[cfg(test)]
mod tests;
pub mod tls;
pub mod traces;
pub mod upstream;
mod values;
pub use self::cost_from::{CostSource, Source as CostSourceKind};

pub use cache::{CacheConfig, CacheRules, DiskConfig, KeyPart, RouteCacheConfig, NEVER_STORED};
pub use compression::{Coding, Compression, DEFAULT_TYPES as DEFAULT_COMPRESSED_TYPES};
pub use consumers::{ConsumersConfig, KeySource, OnUnknown, PlanConfig, PlanLimit};
pub use fleet::{Fleet, LeaseConfig, LimitStore, Sync as LimitSync};
pub use http3::{Http3Config, RetryMode};
pub use jwt::{JwtAlgorithm, JwtConfig, JwtKeySource, JwtMode, TokenSource};
pub use limit::{
    anchor_day, check_numbers, utc_offset, LimitConfig, LimitFrom, LimitSource, MAX_PERIOD,
};
pub use proxy_protocol::{ProxyProtocolConfig, ProxyProtocolMode};
use raw::{RawConfig, RawRoute};
pub use refusal::Refusal;
pub use response::{ChargeAfter, CountedBytes, Reserve, StatusSet, Unit};
use route::validate_route;
pub use route::RouteConfig;
use store::validate_store;
pub use store::{SentinelConfig, StoreConfig};
pub use subject::{
    AccessList, Exempt, ForwardedHeader, Prefixes, SubjectSpec, DEFAULT_IPV4_PREFIX,
    DEFAULT_IPV6_PREFIX,
};
pub use tls::{
    AcmeChallenge, AcmeConfig, ClientAuthConfig, ClientAuthMode, TlsCert, TlsConfig, TlsPart,
    TlsVersion, UnknownSni,
};
pub use values::*;

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

/// Why a `tls:` subject part needs `[server.tls.client_auth]`.
const TLS_PART_NEEDS_CLIENT_AUTH: &str =
    "counts by a tls: part of the client certificate, which is never present without [server.tls.client_auth]";

/// The line of the key at `path` (`routes[0].limits[1].cost`) in the TOML `text`, when the file
/// has it (a key left out to its default has no line).
fn line_of(text: &str, path: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let root = toml::de::DeValue::Table(doc.into_inner());
    let mut at = &root;
    let mut start = None;
    for segment in path.split('.') {
        let (name, indexes) = segment.split_once('[').unwrap_or((segment, ""));
        let v = at.get(name)?;
        start = Some(v.span().start);
        at = v.get_ref();
        for index in indexes.split('[').filter(|i| !i.is_empty()) {
            let i: usize = index.trim_end_matches(']').parse().ok()?;
            let v = at.get(i)?;
            start = Some(v.span().start);
            at = v.get_ref();
        }
    }
    let start = start?;
    Some(text.get(..start)?.matches('\n').count() + 1)
}

pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
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
    /// `[consumers]`, when the gateway knows its API's consumers.
    pub consumers: Option<ConsumersConfig>,
    /// `[[plans]]`, in config order (a consumer's plan is an index into it).
    pub plans: Vec<PlanConfig>,
    /// `[jwt]`: how bearer tokens are verified.
    pub jwt: Option<JwtConfig>,
    /// `[tracing]` with an `otlp_endpoint`: OpenTelemetry traces are on.
    pub tracing: Option<traces::TracingConfig>,
    /// `[rls]`: Envoy's rate limit service is on.
    pub rls: Option<rls::RlsConfig>,
    /// `[cache]`: the HTTP cache's bounds and defaults.
    pub cache: CacheConfig,
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
    /// What request bodies not yet decided may hold per connection and per worker
    /// (`max_pending_body_bytes_per_connection`, `max_pending_body_bytes_per_worker`).
    pub pending_bodies: crate::front::pending::PendingBounds,
    pub h2_max_concurrent_streams: u32,
    /// Worker threads (each a single-threaded runtime with its own `SO_REUSEPORT` listener).
    pub workers: usize,
    /// The header that carries the request id (`x-request-id`).
    pub request_id_header: http::HeaderName,
    /// What `;` path parameters do (`path_params`).
    pub path_params: crate::http::path::PathParams,
    /// A plain listener that answers every request with a 308 to the TLS listener.
    pub http_redirect_listen: Option<SocketAddr>,
    /// Reload when the config file or a file it names changes (`crate::runtime::watch`).
    pub watch_config: bool,
    /// The networks client addresses are counted by (`ipv4_prefix`, `ipv6_prefix`), unless a
    /// limit says otherwise.
    pub prefixes: Prefixes,
    /// A header a trusted proxy names the client in (`real_ip_header`), believed before
    /// `X-Forwarded-For` / `Forwarded`.
    pub real_ip_header: Option<http::HeaderName>,
    /// The one header family a trusted proxy's client address is read from
    /// (`forwarded_header`); the other is never read.
    pub forwarded_header: ForwardedHeader,
    /// PROXY protocol from these load balancers (`None`: off).
    pub proxy_protocol: Option<ProxyProtocolConfig>,
    /// Which HTTP/1 front serves HTTP/1 connections (`http1`).
    pub http1: Http1Front,
    /// `[server.compression]`: the compression of routes without their own.
    pub compression: Option<std::sync::Arc<Compression>>,
    /// `[server.http3]` when enabled: HTTP/3 over QUIC beside the TLS listener.
    pub http3: Option<Http3Config>,
}

/// `[server] http1`: the purpose-built HTTP/1 front (`crate::front::http1`) or hyper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http1Front {
    Fast,
    Hyper,
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

/// `[admin]`.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// `token_file`, resolved against the config file's directory: when set, the admin
    /// endpoints that change state (and, with `protect_reads`, those that reveal consumers'
    /// state) need `Authorization: Bearer TOKEN` (loaded by `crate::runtime::load`).
    pub token_file: Option<PathBuf>,
    /// `protect_reads` (default true): `/-/explain`, `/-/top`, `/-/usage` need a token too.
    pub protect_reads: bool,
}

/// The longest `[server]` timeout, `grace_period` or route `timeout`: one day. Longer is a typo,
/// and an unbounded duration overflows when added to an `Instant`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// The longest `store.timeout`: a rate-limit decision that may take longer than a minute no
/// longer protects anything.
pub const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(60);

/// Checks that the duration at `field` is at most `max` (written `max_text` in the error) and,
/// unless `zero_ok`, positive.
pub(crate) fn bounded(
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

    /// What is valid but dangerous (`tls.verify = false`): printed by `tollgate check` and
    /// logged at start-up and on reload.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.admin.token_file.is_none() && !self.admin.listen.ip().is_loopback() {
            out.push(format!(
                "`admin.listen` is {} (not loopback) and `admin.token_file` is not set: anyone who \
                 can reach it can reload the config, reset and grant quotas, and read consumers' usage",
                self.admin.listen
            ));
        }
        out.extend(self.upstreams
            .iter()
            .enumerate()
            .filter(|(_, u)| u.is_https() && !u.tls.verify)
            .map(|(i, u)| {
                format!(
                    "`upstreams[{i}].tls.verify` is false: the certificates of group {:?} are NOT checked; \
                     anyone on the path can impersonate its servers",
                    u.name
                )
            }));
        out
    }

    /// Parses and validates TOML text; relative file paths are resolved against `base_dir`.
    pub fn parse(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        // A large file's routes are parsed a batch at a time, so its whole document is never
        // held (`batched`: glibc would keep that peak resident); any doubt or error there, and
        // the whole file is parsed, which gives every error as it always did.
        if text.len() >= batched::MIN_FILE_BYTES {
            if let Some(config) = batched::parse(text, base_dir) {
                return Ok(config);
            }
        }
        Config::parse_whole(text, base_dir)
    }

    /// [`Config::parse`] with the whole file parsed as one document.
    fn parse_whole(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<config>"),
            message: e.to_string().trim_end().to_owned(),
        })?;
        Config::from_raw(raw, base_dir).map_err(|e| match e {
            // A rule across keys names the key by its path; the file gives its line.
            ConfigError::Invalid { field, message } => match line_of(text, &field) {
                Some(line) => ConfigError::Invalid {
                    message: format!("{message} (line {line})"),
                    field,
                },
                None => ConfigError::Invalid { field, message },
            },
            other => other,
        })
    }

    fn from_raw(mut raw: RawConfig, base_dir: &Path) -> Result<Config, ConfigError> {
        let routes = std::mem::take(&mut raw.routes);
        Config::from_parts(raw, routes.len(), routes.into_iter().map(Ok), base_dir)
    }

    /// Validates `raw` with its `count` routes taken from `raw_routes` (`raw.routes` is not
    /// read): each route is validated as it comes, so the batches of [`batched`] are never all
    /// held at once.
    fn from_parts(
        raw: RawConfig,
        count: usize,
        raw_routes: impl Iterator<Item = Result<RawRoute, ConfigError>>,
        base_dir: &Path,
    ) -> Result<Config, ConfigError> {
        let s = raw.server;
        if s.max_header_bytes < 8192 {
            return Err(invalid("server.max_header_bytes", "must be at least 8192"));
        }
        if s.max_uri_bytes < 64 {
            return Err(invalid("server.max_uri_bytes", "must be at least 64"));
        }
        for (field, n) in [
            (
                "server.max_pending_body_bytes_per_connection",
                s.max_pending_body_bytes_per_connection,
            ),
            (
                "server.max_pending_body_bytes_per_worker",
                s.max_pending_body_bytes_per_worker,
            ),
        ] {
            if n == 0 {
                return Err(invalid(field, "must be positive"));
            }
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
        let http3 = http3::validate(s.http3.unwrap_or_default(), s.tls.is_some())?;
        let server = ServerConfig {
            listen: s.listen.0,
            trusted_proxies: s.trusted_proxies.iter().map(|c| c.0).collect(),
            tls: s.tls.map(|t| tls::validate(t, base_dir)).transpose()?,
            header_read_timeout,
            idle_timeout,
            body_read_timeout,
            grace_period,
            max_header_bytes: s.max_header_bytes,
            max_uri_bytes: s.max_uri_bytes,
            pending_bodies: crate::front::pending::PendingBounds {
                per_connection: s.max_pending_body_bytes_per_connection,
                per_worker: s.max_pending_body_bytes_per_worker,
            },
            h2_max_concurrent_streams: s.h2_max_concurrent_streams,
            workers,
            request_id_header: s.request_id_header.0,
            path_params: match s.path_params {
                raw::RawPathParams::Reject => crate::http::path::PathParams::Reject,
                raw::RawPathParams::Strip => crate::http::path::PathParams::Strip,
                raw::RawPathParams::Allow => crate::http::path::PathParams::Allow,
            },
            http_redirect_listen: s.http_redirect_listen.map(|l| l.0),
            watch_config: s.watch_config,
            prefixes: Prefixes {
                v4: s.ipv4_prefix.map_or(DEFAULT_IPV4_PREFIX, |p| p.0),
                v6: s.ipv6_prefix.map_or(DEFAULT_IPV6_PREFIX, |p| p.0),
            },
            real_ip_header: s.real_ip_header.map(|h| h.0),
            forwarded_header: s.forwarded_header,
            proxy_protocol: proxy_protocol::validate(
                s.proxy_protocol,
                &s.proxy_protocol_from,
                s.proxy_protocol_timeout,
            )?,
            http1: match s.http1 {
                raw::RawHttp1::Fast => Http1Front::Fast,
                raw::RawHttp1::Hyper => Http1Front::Hyper,
            },
            compression: s
                .compression
                .map(|c| compression::validate_compression("server.compression", c))
                .transpose()?
                .map(std::sync::Arc::new),
            http3,
        };
        if let Some(addr) = server.http_redirect_listen {
            if server.tls.is_none() {
                return Err(invalid(
                    "server.http_redirect_listen",
                    "redirects to the TLS listener, so it needs [server.tls]",
                ));
            }
            // Port 0 picks a free port for each.
            if addr.port() != 0 && addr.port() == server.listen.port() {
                return Err(invalid(
                    "server.http_redirect_listen",
                    "must be another address than `listen`",
                ));
            }
        }
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
        let cache = cache::validate_cache(raw.cache, base_dir)?;

        let mut upstreams: Vec<UpstreamConfig> = Vec::with_capacity(raw.upstreams.len());
        for (i, u) in raw.upstreams.into_iter().enumerate() {
            let u = crate::config::upstream::validate(i, u, base_dir, is_label_safe)
                .map_err(|(field, message)| invalid(field, message))?;
            if upstreams.iter().any(|o| o.name == u.name) {
                return Err(invalid(
                    format!("upstreams[{i}].name"),
                    format!("duplicate upstream name {:?}", u.name),
                ));
            }
            upstreams.push(u);
        }

        let plans = consumers::validate_plans(raw.plans, server.prefixes)?;
        let consumers = match raw.consumers {
            Some(c) => Some(consumers::validate_consumers(c, &plans, base_dir)?),
            None => None,
        };

        let jwt = match raw.jwt {
            Some(j) => Some(jwt::validate_jwt(j, base_dir)?),
            None => None,
        };

        let client_auth = server.tls.as_ref().is_some_and(|t| t.client_auth.is_some());
        if !client_auth {
            for (k, p) in plans.iter().enumerate() {
                if let Some(m) = p
                    .limits
                    .iter()
                    .position(|l| l.limit.subject.needs_client_cert())
                {
                    return Err(invalid(
                        format!("plans[{k}].limits[{m}].subject"),
                        TLS_PART_NEEDS_CLIENT_AUTH,
                    ));
                }
            }
        }

        let mut routes = Vec::with_capacity(count);
        let mut names = HashSet::new();
        let mut keys = HashMap::new();
        for (i, r) in raw_routes.enumerate() {
            let mut route = validate_route(i, r?, server.prefixes, &cache)?;
            if route.compression.is_none() {
                route.compression = server.compression.clone();
            }
            if server.trusted_proxies.is_empty() {
                if let Some(j) = route.limits.iter().position(|l| {
                    matches!(
                        l.limit_from.as_ref().map(|f| &f.source),
                        Some(LimitSource::Header(_))
                    )
                }) {
                    return Err(invalid(
                        format!("routes[{i}].limits[{j}].limit_from"),
                        "a header sets a caller's limit only from [server] trusted_proxies (a client could raise its own); list them, or use jwt:CLAIM",
                    ));
                }
            }
            crate::fronting::check_route(
                &mut route.fronting,
                route.methods.as_deref(),
                &server.request_id_header,
            )
            .map_err(|(key, message)| invalid(format!("routes[{i}].{key}"), message))?;
            if let Some(UpstreamRef::Group(g)) = &route.upstream {
                if !upstreams.iter().any(|u| &u.name == g) {
                    return Err(invalid(
                        format!("routes[{i}].upstream"),
                        format!("no [[upstreams]] group is named {g:?}"),
                    ));
                }
            }
            if let (Some(cc), true) = (&consumers, route.consumers) {
                if cc.jwt_claim.is_some() && jwt.is_none() {
                    return Err(invalid(
                        "consumers.jwt_claim",
                        "needs a [jwt] section (the keys tokens are verified with)",
                    ));
                }
                if cc.source == KeySource::TokenOnly && route.jwt.is_none() {
                    return Err(invalid(
                        format!("routes[{i}].jwt"),
                        "[consumers] come from tokens only (`jwt_claim`): set jwt = \"required\" or \"optional\"",
                    ));
                }
            }
            if route.jwt.is_some() && jwt.is_none() {
                return Err(invalid(
                    format!("routes[{i}].jwt"),
                    "needs a [jwt] section (the keys tokens are verified with)",
                ));
            }
            // A claim is known only on routes that verify tokens.
            let plan_limits = plans
                .iter()
                .filter(|_| route.consumers)
                .flat_map(|p| p.limits.iter().map(|l| &l.limit));
            if route.client_cert_required && !client_auth {
                return Err(invalid(
                    format!("routes[{i}].client_cert"),
                    "demands a client certificate, which is never verified without [server.tls.client_auth]",
                ));
            }
            // A certificate's part could never be present without client certificates.
            if !client_auth {
                if let Some(j) = route
                    .limits
                    .iter()
                    .position(|l| l.subject.needs_client_cert())
                {
                    return Err(invalid(
                        format!("routes[{i}].limits[{j}].subject"),
                        TLS_PART_NEEDS_CLIENT_AUTH,
                    ));
                }
            }
            for l in route.limits.iter().chain(plan_limits) {
                if route.jwt.is_none() && l.subject.needs_claims() {
                    return Err(invalid(
                        format!("routes[{i}].jwt"),
                        format!(
                            "limit {:?} counts by a jwt: claim; set jwt = \"required\" or \"optional\"",
                            l.name
                        ),
                    ));
                }
                if route.jwt.is_none()
                    && matches!(
                        l.limit_from.as_ref().map(|f| &f.source),
                        Some(LimitSource::Jwt(_))
                    )
                {
                    return Err(invalid(
                        format!("routes[{i}].jwt"),
                        format!(
                            "limit {:?} reads its limit from a jwt: claim; set jwt = \"required\" or \"optional\"",
                            l.name
                        ),
                    ));
                }
            }
            if !route.consumers {
                // A consumer is known only on routes with `consumers = true`.
                for (j, l) in route.limits.iter().enumerate() {
                    if l.subject.needs_consumer() {
                        return Err(invalid(
                            format!("routes[{i}].limits[{j}].subject"),
                            "the consumer is known only on routes with `consumers = true`",
                        ));
                    }
                    if !l.exempt.consumers.is_empty() {
                        return Err(invalid(
                            format!("routes[{i}].limits[{j}].exempt"),
                            "consumer: exemptions need a route with `consumers = true`",
                        ));
                    }
                }
            }
            if route.consumers {
                if consumers.is_none() {
                    return Err(invalid(
                        format!("routes[{i}].consumers"),
                        "needs a [consumers] section (where the key is read, the consumers file)",
                    ));
                }
                // One name space for the RateLimit fields: a route's limit and a plan's limit
                // answered together must not share a name.
                for (j, l) in route.limits.iter().enumerate() {
                    if let Some(p) = plans
                        .iter()
                        .find(|p| p.limits.iter().any(|pl| pl.limit.name == l.name))
                    {
                        return Err(invalid(
                            format!("routes[{i}].limits[{j}].name"),
                            format!(
                                "plan {:?} has a limit named {:?} too; rename one (they share the RateLimit fields)",
                                p.name, l.name
                            ),
                        ));
                    }
                }
            }
            if !names.insert(route.name.clone()) {
                return Err(invalid(
                    format!("routes[{i}].name"),
                    format!("duplicate route name {:?}", route.name),
                ));
            }
            let key = (
                route.matching.key(&route.path_prefix),
                route.methods.clone(),
            );
            if let Some(j) = keys.get(&key) {
                return Err(invalid(
                    format!("routes[{i}]"),
                    format!(
                        "matches exactly what routes[{j}] ({:?}) matches (the same path, hosts, methods, headers, query and priority): one of them would never be used",
                        routes.get(*j).map_or("", |r: &RouteConfig| r.name.as_str())
                    ),
                ));
            }
            keys.insert(key, i);
            routes.push(route);
        }
        let mut server = server;
        let plain_listener = server.http_redirect_listen.is_some();
        if let Some(acme) = server.tls.as_mut().and_then(|t| t.acme.as_mut()) {
            tls::acme_names(
                acme,
                routes
                    .iter()
                    .flat_map(|r| r.matching.hosts.iter())
                    .filter_map(|h| match h {
                        route_match::HostPattern::Exact(h) => Some(h.as_str()),
                        route_match::HostPattern::Wildcard { .. } => None,
                    }),
                plain_listener,
            )?;
        }
        Ok(Config {
            server,
            admin: AdminConfig {
                listen: raw.admin.listen.0,
                token_file: match raw.admin.token_file {
                    Some(p) if p.as_os_str().is_empty() => {
                        return Err(invalid("admin.token_file", "must not be empty"))
                    }
                    p => p.map(|p| base_dir.join(p)),
                },
                protect_reads: raw.admin.protect_reads,
            },
            store,
            log,
            upstreams,
            routes,
            consumers,
            plans,
            jwt,
            tracing: match raw.tracing {
                Some(t) => traces::validate_tracing(t)?,
                None => None,
            },
            rls: match raw.rls {
                Some(r) => Some(rls::validate_rls(r, base_dir)?),
                None => None,
            },
            cache,
        })
    }
}

pub(crate) fn is_label_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}
