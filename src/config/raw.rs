//! The raw file: serde structs that mirror `gateway.toml` one to one, and their defaults.

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values::*;
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) server: RawServer,
    #[serde(default)]
    pub(super) admin: RawAdmin,
    #[serde(default)]
    pub(super) store: RawStore,
    #[serde(default)]
    pub(super) log: RawLog,
    #[serde(default)]
    pub(super) upstreams: Vec<crate::config::upstream::RawUpstream>,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(super) consumers: Option<RawConsumers>,
    #[serde(default)]
    pub(super) plans: Vec<RawPlan>,
    /// `[jwt]` (`super::jwt`).
    #[serde(default)]
    pub(super) jwt: Option<super::jwt::RawJwt>,
    /// `[tracing]`: OpenTelemetry traces.
    #[serde(default)]
    pub(super) tracing: Option<super::traces::RawTracing>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    #[serde(default = "default_listen")]
    pub(super) listen: ListenAddr,
    #[serde(default)]
    pub(super) trusted_proxies: Vec<Cidr>,
    #[serde(default)]
    pub(super) tls: Option<RawTls>,
    #[serde(default = "default_header_read_timeout")]
    pub(super) header_read_timeout: HumanDuration,
    #[serde(default = "default_idle_timeout")]
    pub(super) idle_timeout: HumanDuration,
    #[serde(default = "default_body_read_timeout")]
    pub(super) body_read_timeout: HumanDuration,
    #[serde(default = "default_grace_period")]
    pub(super) grace_period: HumanDuration,
    #[serde(default = "default_max_header_bytes")]
    pub(super) max_header_bytes: usize,
    #[serde(default = "default_max_uri_bytes")]
    pub(super) max_uri_bytes: usize,
    #[serde(default = "default_h2_max_concurrent_streams")]
    pub(super) h2_max_concurrent_streams: u32,
    /// Worker threads, each with its own listener socket; default: the number of cores.
    #[serde(default)]
    pub(super) workers: Option<usize>,
    #[serde(default)]
    pub(super) request_id_header: RequestIdHeader,
    #[serde(default)]
    pub(super) path_params: RawPathParams,
    /// A plain listener answering every request with a 308 to the TLS listener.
    #[serde(default)]
    pub(super) http_redirect_listen: Option<ListenAddr>,
    /// Reload when the config file or a file it names changes (`crate::watch`).
    #[serde(default)]
    pub(super) watch_config: bool,
    /// Who is calling (`super::subject`): the networks addresses are counted by, and a header
    /// a trusted proxy names the client in.
    #[serde(default)]
    pub(super) ipv4_prefix: Option<super::subject::Ipv4Prefix>,
    #[serde(default)]
    pub(super) ipv6_prefix: Option<super::subject::Ipv6Prefix>,
    #[serde(default)]
    pub(super) real_ip_header: Option<super::subject::RealIpHeader>,
    #[serde(default)]
    pub(super) forwarded_header: super::subject::ForwardedHeader,
    /// PROXY protocol (`super::proxy_protocol`).
    #[serde(default)]
    pub(super) proxy_protocol: super::proxy_protocol::ProxyProtocolMode,
    #[serde(default)]
    pub(super) proxy_protocol_from: Vec<Cidr>,
    #[serde(default = "super::proxy_protocol::default_timeout")]
    pub(super) proxy_protocol_timeout: HumanDuration,
    /// Which HTTP/1 front serves plain-TCP and `http/1.1` TLS connections.
    #[serde(default)]
    pub(super) http1: RawHttp1,
}

/// `[server] http1`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawHttp1 {
    #[default]
    Fast,
    Hyper,
}

/// `[server] path_params`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawPathParams {
    #[default]
    Reject,
    Strip,
    Allow,
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
            request_id_header: RequestIdHeader::default(),
            path_params: RawPathParams::default(),
            http_redirect_listen: None,
            watch_config: false,
            ipv4_prefix: None,
            ipv6_prefix: None,
            real_ip_header: None,
            forwarded_header: Default::default(),
            proxy_protocol: Default::default(),
            proxy_protocol_from: Vec::new(),
            proxy_protocol_timeout: super::proxy_protocol::default_timeout(),
            http1: RawHttp1::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    #[serde(default = "default_admin_listen")]
    pub(super) listen: ListenAddr,
    /// The SHA-256 of each admin token, one a line (`crate::admin::auth`).
    #[serde(default)]
    pub(super) token_file: Option<PathBuf>,
    /// With a token file: whether `/-/explain`, `/-/top` and `/-/usage` need a token too.
    #[serde(default = "default_true")]
    pub(super) protect_reads: bool,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: default_admin_listen(),
            token_file: None,
            protect_reads: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(default)]
    pub(super) backend: Backend,
    #[serde(default)]
    pub(super) url: Option<String>,
    #[serde(default)]
    pub(super) urls: Vec<String>,
    #[serde(default = "default_store_timeout")]
    pub(super) timeout: HumanDuration,
    #[serde(default)]
    pub(super) on_error: OnError,
    #[serde(default = "default_key_prefix")]
    pub(super) key_prefix: String,
    #[serde(default = "default_max_subjects")]
    pub(super) max_subjects: NonZeroU64,
    #[serde(default = "default_deny_cache")]
    pub(super) deny_cache: bool,
    /// `backend = "redis_sentinel"`: the sentinels' URLs.
    #[serde(default)]
    pub(super) sentinels: Vec<String>,
    /// `backend = "redis_sentinel"`: the name the sentinels monitor the primary under.
    #[serde(default)]
    pub(super) master_name: Option<String>,
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
            sentinels: Vec::new(),
            master_name: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    #[serde(default = "default_access")]
    pub(super) access: String,
    #[serde(default)]
    pub(super) format: LogFormat,
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
pub(super) struct RawRoute {
    pub(super) name: String,
    pub(super) path_prefix: String,
    /// Required unless `redirect` or `usage = true` (checked by `validate_route`).
    #[serde(default)]
    pub(super) upstream: Option<UpstreamRef>,
    #[serde(default = "default_route_timeout")]
    pub(super) timeout: HumanDuration,
    #[serde(default)]
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) methods: Option<Vec<String>>,
    #[serde(default)]
    pub(super) strip_prefix: bool,
    #[serde(default)]
    pub(super) preserve_host: bool,
    #[serde(default = "default_true")]
    pub(super) rate_limit_headers: bool,
    #[serde(default = "default_true")]
    pub(super) case_sensitive: bool,
    #[serde(default = "default_max_body_size")]
    pub(super) max_body_size: u64,
    /// The largest request body read for `json:` subject parts and reservations.
    #[serde(default)]
    pub(super) max_json_bytes: super::values::MaxJsonBytes,
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
    /// Requests need a known consumer; its plan's limits apply here too.
    #[serde(default)]
    pub(super) consumers: bool,
    /// Fronting (`crate::fronting`): header rules, CORS, rewrite, redirect.
    #[serde(default)]
    pub(super) request_headers: Option<crate::fronting::RequestRules>,
    #[serde(default)]
    pub(super) response_headers: Option<crate::fronting::ResponseRules>,
    #[serde(default)]
    pub(super) cors: Option<crate::fronting::Cors>,
    #[serde(default)]
    pub(super) rewrite: Option<crate::fronting::Rewrite>,
    #[serde(default)]
    pub(super) redirect: Option<crate::fronting::Redirect>,
    /// Answered by the gateway: the calling consumer's usage (`crate::quota`).
    #[serde(default)]
    pub(super) usage: bool,
    /// Access lists (`super::subject::AccessList`).
    #[serde(default)]
    pub(super) allow: Option<Vec<Cidr>>,
    #[serde(default)]
    pub(super) deny: Option<Vec<Cidr>>,
    /// `"required"` or `"optional"`: a bearer token verified by `[jwt]`.
    #[serde(default)]
    pub(super) jwt: Option<super::jwt::JwtMode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimit {
    pub(super) name: String,
    pub(super) algorithm: Algorithm,
    pub(super) limit: NonZeroU64,
    /// Required unless `calendar` is set (checked by `validate_limit`).
    #[serde(default)]
    pub(super) period: Option<HumanDuration>,
    /// Required on routes, refused on plans (whose subject is the consumer).
    #[serde(default)]
    pub(super) subject: Option<super::subject::SubjectSpec>,
    #[serde(default)]
    pub(super) calendar: Option<crate::calendar::Calendar>,
    /// `calendar = "month"`: the billing day windows start on (1–28).
    #[serde(default)]
    pub(super) anchor_day: Option<i64>,
    /// `calendar = "day" | "week"`: the windows' offset from UTC (`"-05:00"`).
    #[serde(default)]
    pub(super) utc_offset: Option<String>,
    /// Plans only: `"global"` (the default) or `"route"`.
    #[serde(default)]
    pub(super) scope: Option<Scope>,
    #[serde(default)]
    pub(super) burst: Option<u64>,
    #[serde(default)]
    pub(super) cost: Option<NonZeroU64>,
    #[serde(default)]
    pub(super) mode: Mode,
    #[serde(default)]
    pub(super) on_missing: OnMissing,
    /// Limits that look at the response (`super::response`).
    #[serde(default)]
    pub(super) count_status: Option<Vec<super::response::RawStatus>>,
    #[serde(default)]
    pub(super) cost_header: Option<String>,
    #[serde(default)]
    pub(super) strip_cost_header: Option<bool>,
    /// The cost read from the response body or trailers (`super::cost_from`).
    #[serde(default)]
    pub(super) cost_from: Option<super::cost_from::RawCostFrom>,
    /// Units reserved before the request, settled after the response (`super::response`).
    #[serde(default)]
    pub(super) reserve: Option<super::response::RawReserve>,
    /// With `reserve = "json:…"`: the most one request reserves.
    #[serde(default)]
    pub(super) reserve_max: Option<u64>,
    /// Where the limit's state lives (`super::fleet`).
    #[serde(default)]
    pub(super) store: super::fleet::LimitStore,
    #[serde(default)]
    pub(super) sync: super::fleet::Sync,
    #[serde(default)]
    pub(super) lease_ttl: Option<HumanDuration>,
    #[serde(default)]
    pub(super) lease_max: Option<u64>,
    /// Overrides of `[server] ipv4_prefix` / `ipv6_prefix` for this limit.
    #[serde(default)]
    pub(super) ipv4_prefix: Option<super::subject::Ipv4Prefix>,
    #[serde(default)]
    pub(super) ipv6_prefix: Option<super::subject::Ipv6Prefix>,
    /// Whom the limit does not apply to.
    #[serde(default)]
    pub(super) exempt: Option<Vec<super::subject::ExemptEntry>>,
}

pub(super) fn default_access() -> String {
    "off".to_owned()
}
pub(super) fn default_listen() -> ListenAddr {
    ListenAddr(SocketAddr::from(([0, 0, 0, 0], 8080)))
}
pub(super) fn default_admin_listen() -> ListenAddr {
    ListenAddr(SocketAddr::from(([127, 0, 0, 1], 9090)))
}
pub(super) fn default_header_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
pub(super) fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
pub(super) fn default_body_read_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
pub(super) fn default_grace_period() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
pub(super) fn default_max_header_bytes() -> usize {
    64 * 1024
}
pub(super) fn default_max_uri_bytes() -> usize {
    8 * 1024
}
pub(super) fn default_h2_max_concurrent_streams() -> u32 {
    256
}
pub(super) fn default_store_timeout() -> HumanDuration {
    HumanDuration(Duration::from_millis(50))
}
pub(super) fn default_key_prefix() -> String {
    "tollgate".to_owned()
}
pub(super) fn default_max_subjects() -> NonZeroU64 {
    NonZeroU64::new(100_000).unwrap_or(NonZeroU64::MIN)
}
pub(super) fn default_deny_cache() -> bool {
    true
}
pub(super) fn default_route_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
pub(super) fn default_true() -> bool {
    true
}
pub(super) fn default_max_body_size() -> u64 {
    10 * 1024 * 1024
}

/// `[consumers]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsumers {
    #[serde(default)]
    pub(super) header: Option<String>,
    #[serde(default)]
    pub(super) query: Option<String>,
    pub(super) file: PathBuf,
    #[serde(default = "default_on_unknown")]
    pub(super) on_unknown: String,
    #[serde(default)]
    pub(super) strip_key: bool,
    /// Consumers (and their plans) from verified tokens' claims.
    #[serde(default)]
    pub(super) jwt_claim: Option<String>,
    #[serde(default)]
    pub(super) plan_claim: Option<String>,
}

fn default_on_unknown() -> String {
    "reject".to_owned()
}

/// `[[plans]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlan {
    pub(super) name: String,
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
}
