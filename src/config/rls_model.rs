//! The rate-limit service's configuration as written: envoyproxy/ratelimit's format (`domain`,
//! nested `descriptors` with `key`, optional `value`, `rate_limit`, `shadow_mode`,
//! `quota_mode`, `share_threshold`, `detailed_metric`, `value_to_metric`, `metadata`), read the same from its YAML files (`[rls] config_dir`) and from
//! `[[rls.domains]]` in `gateway.toml`. Unknown fields are refused (the error names the file
//! and line), as for `gateway.toml`. Tollgate's additions sit in `rate_limit`: `algorithm`,
//! `period` (any length, instead of `unit`), `burst` and `cost`.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::config::{Algorithm, HumanDuration, LimitStore, LimitSync};

/// One domain: a tree of descriptors.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDomain {
    /// The domain Envoy's filter names (`domain` of its `envoy.filters.http.ratelimit`) (string).
    pub domain: String,
    /// The descriptors of the domain (list; default: `[]`).
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
}

/// One level of a descriptor: an entry `key` (and `value`), its limit, the deeper levels.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptor {
    /// The entry's key (string).
    pub key: String,
    /// The entry's value; without it, any value of the key (a value match is preferred).
    /// `*` matches any run of characters (`value: "/api/*"`) (string).
    #[serde(default)]
    pub value: Option<String>,
    /// The limit of a descriptor that ends here.
    #[serde(default)]
    pub rate_limit: Option<RawRateLimit>,
    /// Deeper levels: descriptors with more entries (list; default: `[]`).
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
    /// Decide and count, but never refuse (bool; default: `false`).
    #[serde(default)]
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's metrics naming: accepted, changes nothing. Tollgate's metric
    /// labels never carry a request's values (bool; default: `false`).
    #[serde(default)]
    pub detailed_metric: bool,
    /// envoyproxy/ratelimit's metrics naming: accepted, changes nothing, as `detailed_metric`
    /// (bool; default: `false`).
    #[serde(default)]
    pub value_to_metric: bool,
    /// With a wildcard `value` (`files/*`): every value it matches shares one count, instead of
    /// one count per value (bool; default: `false`).
    #[serde(default)]
    pub share_threshold: bool,
    /// A soft limit: a call is refused only when every `quota_mode` descriptor of it is over
    /// its limit (or another descriptor refuses); one over it alone is reported `OVER_LIMIT`
    /// and the call admitted (bool; default: `false`).
    #[serde(default)]
    pub quota_mode: bool,
    /// envoyproxy/ratelimit's free-form `metadata` (sent back to Envoy there with
    /// `RESPONSE_DYNAMIC_METADATA`): accepted, any mapping, and ignored (table; default: none).
    #[serde(default)]
    #[schemars(with = "Option<std::collections::BTreeMap<String, serde_json::Value>>")]
    pub metadata: Option<Metadata>,
}

/// `metadata`: a mapping of anything, read and dropped (nothing of it is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata;

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Metadata, D::Error> {
        std::collections::BTreeMap::<String, serde::de::IgnoredAny>::deserialize(d)?;
        Ok(Metadata)
    }
}

/// A descriptor's limit.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    /// `second`, `minute`, `hour`, `day`, `week`, `month` (30 days) or `year` (365 days), any
    /// case; or leave it out and give `period` (string).
    #[serde(default)]
    pub unit: Option<String>,
    /// Requests admitted per unit (integer).
    #[serde(default)]
    pub requests_per_unit: Option<u64>,
    /// No limit: the descriptor is always admitted (bool; default: `false`).
    #[serde(default)]
    pub unlimited: bool,
    /// The limit's name: in `replaces`, the reply's `current_limit.name`, the RateLimit fields
    /// and the metrics (string; default: the descriptor's path, `key_value.key2`).
    #[serde(default)]
    pub name: Option<String>,
    /// The limits (by name) this one replaces when both match one request (list of `{name}`).
    #[serde(default)]
    pub replaces: Vec<RawReplaces>,
    /// Tollgate: the algorithm (default: `"fixed_window"`, envoyproxy/ratelimit's only one).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// Tollgate: the period, of any length, instead of `unit` (duration).
    #[serde(default)]
    pub period: Option<HumanDuration>,
    /// Tollgate: the bucket of `token_bucket`, `gcra`, `leaky_bucket` (integer; default: the
    /// limit for the first two, 0 for the leaky bucket).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Tollgate: units one hit takes (integer; default: 1); a request's `hits_addend`
    /// multiplies it.
    #[serde(default)]
    pub cost: Option<u64>,
    /// Tollgate: where the count lives, `shared` (the `[store]`) or `local` (this process)
    /// (default: `shared`).
    #[serde(default)]
    pub store: Option<LimitStore>,
    /// Tollgate: `exact` (every call asks the store) or `lease` (units taken from the store in
    /// advance and spent in process; fixed_window, token_bucket, gcra) (default: `exact`).
    #[serde(default)]
    pub sync: Option<LimitSync>,
    /// Tollgate, with `sync: lease`: how long unused leased units are kept (duration;
    /// default: `250ms`).
    #[serde(default)]
    pub lease_ttl: Option<HumanDuration>,
    /// Tollgate, with `sync: lease`: the most units one lease takes (integer; default: a
    /// twentieth of the limit).
    #[serde(default)]
    pub lease_max: Option<u64>,
}

/// An entry of `replaces`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawReplaces {
    /// The name of the limit replaced (string).
    pub name: String,
}

/// One `[[rls.quota]]`: which buckets of Envoy's `rate_limit_quota` filter (by their
/// `bucket_id`) share a limit, and the limit. Tollgate answers the filter's usage reports with
/// leased token buckets of this limit (see `crate::rls::rlqs`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawQuota {
    /// The quota's name: the metric label and the limit's name in the store (string).
    pub name: String,
    /// The filter's `domain` this quota answers; unset: any domain (string).
    #[serde(default)]
    pub domain: Option<String>,
    /// The `bucket_id` entries a bucket must have (key = value; `"*"`: any value) to fall under
    /// this quota; the first quota (in file order) whose entries all match wins (table; default:
    /// `{}`, every bucket).
    #[serde(default, rename = "match")]
    pub matches: std::collections::BTreeMap<String, String>,
    /// The `bucket_id` keys whose values are the subject (each distinct set of values has its
    /// own count) (list; default: every key of the bucket_id).
    #[serde(default)]
    pub subject: Option<Vec<String>>,
    /// `fixed_window`, `token_bucket` or `gcra` (the algorithms whose units lease) (default:
    /// `"fixed_window"`).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// Requests admitted per period, fleet-wide (integer).
    pub limit: u64,
    /// The period (duration).
    pub period: HumanDuration,
    /// The bucket of `token_bucket` and `gcra` (integer; default: the limit).
    #[serde(default)]
    pub burst: Option<u64>,
    /// The longest an assignment lives in Envoy (`assignment_time_to_live`), whole seconds
    /// (duration; default: `10s`).
    #[serde(default)]
    pub assignment_ttl: Option<HumanDuration>,
    /// The most units one assignment grants one Envoy (integer; default: enough for one Envoy
    /// at the limit's average rate, twice, over `assignment_ttl` + 2 s; at least a tenth of the
    /// limit, at least 1, at most the limit).
    pub lease_max: Option<u64>,
}
