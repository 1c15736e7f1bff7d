//! `[rls]` in the config file: Tollgate as Envoy's rate limit service (issue #37). Its listener
//! (`listen`, gRPC), envoyproxy/ratelimit's YAML files (`config_dir`), domains written inline
//! (`[[rls.domains]]`, the same model) and whether replies carry the draft-11 `RateLimit` /
//! `RateLimit-Policy` fields (`ratelimit_headers`). The raw serde struct and its validation
//! into [`RlsConfig`]; the descriptor trees themselves are compiled by `crate::rls::domains`
//! (with [`check_numbers`](super::check_numbers), the rules every limit's numbers obey).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Deserialize;

use super::rls_model::{RawDomain, RawQuota};
use super::{invalid, Algorithm, ConfigError, ListenAddr};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRls {
    /// The gRPC listener of `envoy.service.ratelimit.v3.RateLimitService` (and the quota
    /// service) (socket address, e.g. `"127.0.0.1:8081"`).
    listen: ListenAddr,
    /// A directory of envoyproxy/ratelimit YAML files (`*.yaml`, `*.yml`; one domain each),
    /// read as they are; relative to the config file (path).
    #[serde(default)]
    config_dir: Option<PathBuf>,
    /// Add the draft-11 `RateLimit` and `RateLimit-Policy` fields to every reply's
    /// `response_headers_to_add` (bool; default: `false`).
    #[serde(default)]
    ratelimit_headers: bool,
    /// Domains written here, in the same model as the YAML files (list; default: `[]`).
    #[serde(default)]
    domains: Vec<RawDomain>,
    /// Envoy's quota service (RLQS): the limits its `rate_limit_quota` filter's buckets map
    /// to (list; default: `[]`).
    #[serde(default)]
    quota: Vec<RawQuota>,
}

/// A validated `[rls]`: the service is on.
#[derive(Debug, Clone)]
pub struct RlsConfig {
    pub listen: SocketAddr,
    /// Resolved against the config file's directory.
    pub config_dir: Option<PathBuf>,
    pub ratelimit_headers: bool,
    /// `[[rls.domains]]`, compiled with the files' by `crate::rls::Domains::load`.
    pub domains: Vec<RawDomain>,
    /// `[[rls.quota]]`, compiled by `crate::rls::Quotas::load`.
    pub quota: Vec<RawQuota>,
}

pub(super) fn validate_rls(raw: RawRls, base_dir: &Path) -> Result<RlsConfig, ConfigError> {
    let config_dir = match raw.config_dir {
        Some(p) if p.as_os_str().is_empty() => {
            return Err(invalid("rls.config_dir", "must not be empty"))
        }
        p => p.map(|p| base_dir.join(p)),
    };
    Ok(RlsConfig {
        listen: raw.listen.0,
        config_dir,
        ratelimit_headers: raw.ratelimit_headers,
        domains: raw.domains,
        quota: raw.quota,
    })
}

/// A descriptor's fleet keys (`store`, `sync`, `lease_ttl`, `lease_max`) validated as a
/// route limit's are; `at` names the descriptor in errors.
pub fn validate_fleet(
    at: &str,
    store: Option<super::LimitStore>,
    sync: Option<super::LimitSync>,
    lease_ttl: Option<super::HumanDuration>,
    lease_max: Option<u64>,
    (algorithm, quota, cost): (Algorithm, u64, u64),
) -> Result<super::Fleet, ConfigError> {
    super::fleet::validate_fleet(
        at,
        super::fleet::RawFleet {
            store: store.unwrap_or_default(),
            sync: sync.unwrap_or_default(),
            lease_ttl,
            lease_max,
        },
        algorithm,
        quota,
        cost,
        false,
    )
}
