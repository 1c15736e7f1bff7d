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
    pub(super) upstream: UpstreamRef,
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
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
    /// Requests need a known consumer; its plan's limits apply here too.
    #[serde(default)]
    pub(super) consumers: bool,
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
    pub(super) subject: Option<SubjectSpec>,
    #[serde(default)]
    pub(super) calendar: Option<crate::calendar::Calendar>,
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
