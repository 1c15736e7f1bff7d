//! `[cache]` and `[routes.cache]` (#54 §1): the HTTP cache's bounds and defaults, and each
//! route's use of it. `[cache]` sizes the one in-memory store every route shares
//! (`max_bytes`, `max_entries`) and gives the defaults of what a route may override
//! (`max_object_size`, `default_ttl`, `max_ttl`, `heuristic`, `statuses`, `lock_timeout`) and
//! names the response field whose tags a purge by tag matches (`tag_header`); a
//! route caches only with a `[routes.cache]` table (`enabled` defaults to true there), key by
//! key over `[cache]`'s values.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{ByteSize, HumanDuration};
use super::{invalid, ConfigError};

/// `max_bytes`'s default: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// `max_entries`' default.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;
/// `max_object_size`'s default: 1 MiB.
pub const DEFAULT_MAX_OBJECT_SIZE: u64 = 1 << 20;
/// `max_ttl`'s default: one day.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(86_400);
/// `tag_header`'s default (Cloudflare's name; Fastly's is `Surrogate-Key`).
pub const DEFAULT_TAG_HEADER: &str = "cache-tag";
/// `disk_max_bytes`' default: 1 GiB.
pub const DEFAULT_DISK_MAX_BYTES: u64 = 1 << 30;
/// `lock_timeout`'s default: 5 s (nginx's `proxy_cache_lock_timeout`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// The statuses stored by default: RFC 9110's heuristically cacheable ones (§15.1), but for
/// `206` (ranges are not cached).
pub const DEFAULT_STATUSES: &[u16] = &[200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];
/// Statuses never stored: refusals a cache must not hand to another caller, `304` (an answer
/// to a condition) and `206` (a range).
pub const NEVER_STORED: &[u16] = &[206, 304, 401, 403, 407, 429];

/// `[cache]` as written.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCache {
    /// The memory the stored responses may take, all routes together (bytes: an integer or
    /// `"64m"`; default: `"64m"`).
    #[serde(default)]
    max_bytes: Option<ByteSize>,
    /// The most responses stored (integer; default: `100000`).
    #[serde(default)]
    max_entries: Option<u64>,
    /// The response field listing a stored response's tags, for `POST /-/cache/purge` with
    /// `{"tag": "T"}`: tags separated by commas or spaces (Cloudflare's `Cache-Tag`, Fastly's
    /// `Surrogate-Key`) (string; default: `"Cache-Tag"`).
    #[serde(default)]
    tag_header: Option<String>,
    /// A directory for the disk tier (relative to the config file), behind the memory tier
    /// for every caching route: every stored response is also written there, off the worker
    /// threads, and kept across restarts (nginx's `proxy_cache_path`); created if missing.
    /// Unset: no disk tier (path; default: unset).
    #[serde(default)]
    disk_path: Option<String>,
    /// The bytes the disk tier's files may take, each counted in whole 4 KiB blocks; the
    /// least recently used are removed to make room (bytes: an integer or `"1g"`; default:
    /// `"1g"`; only with `disk_path`).
    #[serde(default)]
    disk_max_bytes: Option<ByteSize>,

    /// A response whose body outgrows this is relayed but not stored (bytes: an integer or
    /// `"1m"`; default: `"1m"`).
    #[serde(default)]
    max_object_size: Option<ByteSize>,
    /// The freshness lifetime of a storable response that states none (no `s-maxage`,
    /// `max-age` or `Expires`) and has no `Last-Modified` to estimate one from, where RFC 9111
    /// allows a heuristic (`heuristic = true`, a status of `statuses` or `public`); `"0s"`:
    /// such a response is not stored (nginx's `proxy_cache_valid`, Varnish's `default_ttl`)
    /// (duration; default: `"0s"`).
    #[serde(default)]
    default_ttl: Option<HumanDuration>,
    /// No response is fresh longer than this, whatever it states (duration; default: `"1d"`).
    #[serde(default)]
    max_ttl: Option<HumanDuration>,
    /// Heuristic freshness (RFC 9111 §4.2.2): a response without an explicit lifetime is fresh
    /// for 10% of the time since its `Last-Modified`, else `default_ttl` (boolean; default:
    /// `true`).
    #[serde(default)]
    heuristic: Option<bool>,
    /// The upstream statuses that may be stored (list of integers; default: `[200, 203, 204,
    /// 300, 301, 308, 404, 405, 410, 414, 501]`; never `206`, `304`, `401`, `403`, `407`,
    /// `429`).
    #[serde(default)]
    #[schemars(schema_with = "super::schema::cache_statuses")]
    statuses: Option<Vec<u16>>,
    /// How long concurrent misses of one key wait for the first one's response before going
    /// upstream themselves (nginx's `proxy_cache_lock_timeout`); `"0s"`: no collapsing
    /// (duration; default: `"5s"`).
    #[serde(default)]
    lock_timeout: Option<HumanDuration>,
}

/// What a route may override of `[cache]` (its keys, in both tables).
#[derive(Debug, Default, Clone)]
struct RawCacheRules {
    max_object_size: Option<ByteSize>,
    default_ttl: Option<HumanDuration>,
    max_ttl: Option<HumanDuration>,
    heuristic: Option<bool>,
    statuses: Option<Vec<u16>>,
    lock_timeout: Option<HumanDuration>,
}

/// The rule keys of a table as written.
macro_rules! take_rules {
    ($r:expr) => {
        RawCacheRules {
            max_object_size: $r.max_object_size,
            default_ttl: $r.default_ttl,
            max_ttl: $r.max_ttl,
            heuristic: $r.heuristic,
            statuses: $r.statuses,
            lock_timeout: $r.lock_timeout,
        }
    };
}

/// `[routes.cache]` as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouteCache {
    /// Whether the route's responses are cached (boolean; default: `true`).
    #[serde(default = "yes")]
    enabled: bool,
    /// The methods answered from the cache (`"GET"`, `"HEAD"`; a `HEAD` is answered from a
    /// stored `GET`) (list of strings; default: `["GET", "HEAD"]`).
    #[serde(default)]
    methods: Option<Vec<String>>,
    /// Parts added to the key (scheme, host, path and query): `header:NAME`, `consumer`,
    /// `jwt:CLAIM`, `ip` — one cache per caller (list of strings; default: `[]`).
    #[serde(default)]
    key: Vec<String>,
    /// Whether a hit is charged to the limits as any request is; only `true` for now (boolean;
    /// default: `true`: a cache is no way around a quota).
    #[serde(default = "yes")]
    charge_hits: bool,

    /// A response whose body outgrows this is relayed but not stored (bytes: an integer or
    /// `"1m"`; default: `"1m"`).
    #[serde(default)]
    max_object_size: Option<ByteSize>,
    /// The freshness lifetime of a storable response that states none (no `s-maxage`,
    /// `max-age` or `Expires`) and has no `Last-Modified` to estimate one from, where RFC 9111
    /// allows a heuristic (`heuristic = true`, a status of `statuses` or `public`); `"0s"`:
    /// such a response is not stored (nginx's `proxy_cache_valid`, Varnish's `default_ttl`)
    /// (duration; default: `"0s"`).
    #[serde(default)]
    default_ttl: Option<HumanDuration>,
    /// No response is fresh longer than this, whatever it states (duration; default: `"1d"`).
    #[serde(default)]
    max_ttl: Option<HumanDuration>,
    /// Heuristic freshness (RFC 9111 §4.2.2): a response without an explicit lifetime is fresh
    /// for 10% of the time since its `Last-Modified`, else `default_ttl` (boolean; default:
    /// `true`).
    #[serde(default)]
    heuristic: Option<bool>,
    /// The upstream statuses that may be stored (list of integers; default: `[200, 203, 204,
    /// 300, 301, 308, 404, 405, 410, 414, 501]`; never `206`, `304`, `401`, `403`, `407`,
    /// `429`).
    #[serde(default)]
    #[schemars(schema_with = "super::schema::cache_statuses")]
    statuses: Option<Vec<u16>>,
    /// How long concurrent misses of one key wait for the first one's response before going
    /// upstream themselves (nginx's `proxy_cache_lock_timeout`); `"0s"`: no collapsing
    /// (duration; default: `"5s"`).
    #[serde(default)]
    lock_timeout: Option<HumanDuration>,
}

fn yes() -> bool {
    true
}

/// `[cache]`, validated: the store's bounds and the rules' defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    pub max_bytes: u64,
    pub max_entries: u64,
    /// The response field whose tags are stored with a response (`tag_header`).
    pub tag_header: http::HeaderName,
    /// The disk tier (`disk_path`), if any.
    pub disk: Option<DiskConfig>,
    pub defaults: CacheRules,
}

/// `[cache] disk_path` and `disk_max_bytes`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// The directory (resolved against the config file's).
    pub path: std::path::PathBuf,
    pub max_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
            tag_header: http::HeaderName::from_static(DEFAULT_TAG_HEADER),
            disk: None,
            defaults: CacheRules::default(),
        }
    }
}

/// The rules of what is stored, and for how long (a route's, over `[cache]`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRules {
    pub max_object_size: u64,
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    pub heuristic: bool,
    /// Sorted.
    pub statuses: Vec<u16>,
    /// Zero: no collapsing.
    pub lock_timeout: Duration,
}

impl Default for CacheRules {
    fn default() -> Self {
        CacheRules {
            max_object_size: DEFAULT_MAX_OBJECT_SIZE,
            default_ttl: Duration::ZERO,
            max_ttl: DEFAULT_MAX_TTL,
            heuristic: true,
            statuses: DEFAULT_STATUSES.to_vec(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }
}

/// A part of a route's cache key besides the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Header(http::HeaderName),
    /// The consumer's name (routes with `consumers = true`).
    Consumer,
    /// A claim of the verified token (routes with `jwt`): its path.
    Jwt(Box<[Box<str>]>),
    /// The client address.
    Ip,
}

/// `[routes.cache]`, validated, `[cache]`'s defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCacheConfig {
    pub get: bool,
    pub head: bool,
    pub key: Vec<KeyPart>,
    pub charge_hits: bool,
    pub rules: CacheRules,
}

impl RouteCacheConfig {
    /// Whether a key part reads the verified token's claims.
    pub fn needs_claims(&self) -> bool {
        self.key.iter().any(|k| matches!(k, KeyPart::Jwt(_)))
    }
}

/// Validates `[cache]`.
pub(super) fn validate_cache(
    raw: Option<RawCache>,
    base_dir: &std::path::Path,
) -> Result<CacheConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let max_bytes = raw.max_bytes.map_or(DEFAULT_MAX_BYTES, |b| b.0);
    if max_bytes == 0 {
        return Err(invalid("cache.max_bytes", "must be positive"));
    }
    let max_entries = raw.max_entries.unwrap_or(DEFAULT_MAX_ENTRIES);
    if max_entries == 0 {
        return Err(invalid("cache.max_entries", "must be positive"));
    }
    let tag_header = match raw.tag_header.as_deref() {
        None => http::HeaderName::from_static(DEFAULT_TAG_HEADER),
        Some(name) => http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("cache.tag_header", format!("{name:?} is no field name")))?,
    };
    let disk = match (raw.disk_path.as_deref(), raw.disk_max_bytes) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(invalid(
                "cache.disk_max_bytes",
                "bounds the disk tier, which needs cache.disk_path",
            ))
        }
        (Some(""), _) => return Err(invalid("cache.disk_path", "is empty")),
        (Some(path), max) => {
            let max_bytes = max.map_or(DEFAULT_DISK_MAX_BYTES, |b| b.0);
            if max_bytes < 1 << 16 {
                return Err(invalid("cache.disk_max_bytes", "must be at least 64k"));
            }
            Some(DiskConfig {
                path: base_dir.join(path),
                max_bytes,
            })
        }
    };
    let defaults = rules("cache", take_rules!(raw), &CacheRules::default())?;
    let config = CacheConfig {
        max_bytes,
        max_entries,
        tag_header,
        disk,
        defaults,
    };
    if config.defaults.max_object_size > config.largest() {
        return Err(invalid("cache.max_object_size", config.too_large()));
    }
    Ok(config)
}

impl CacheConfig {
    /// The largest response a tier may hold: the memory's bound, or the disk's if larger.
    pub fn largest(&self) -> u64 {
        self.disk
            .as_ref()
            .map_or(self.max_bytes, |d| d.max_bytes.max(self.max_bytes))
    }

    fn too_large(&self) -> &'static str {
        if self.disk.is_some() {
            "is larger than cache.max_bytes and cache.disk_max_bytes: no such response could be stored"
        } else {
            "is larger than cache.max_bytes: no such response could be stored"
        }
    }
}

/// Validates a route's `[routes.cache]` at `at` (`routes[2].cache`) over `[cache]`'s
/// defaults: `None` when the route does not cache.
pub(super) fn validate_route_cache(
    at: &str,
    raw: RawRouteCache,
    cache: &CacheConfig,
) -> Result<Option<RouteCacheConfig>, ConfigError> {
    let rules = rules(at, take_rules!(raw), &cache.defaults)?;
    if rules.max_object_size > cache.largest() {
        return Err(invalid(format!("{at}.max_object_size"), cache.too_large()));
    }
    let (mut get, mut head) = (false, false);
    match raw.methods {
        None => (get, head) = (true, true),
        Some(list) => {
            for m in &list {
                match m.as_str() {
                    "GET" => get = true,
                    "HEAD" => head = true,
                    other => {
                        return Err(invalid(
                            format!("{at}.methods"),
                            format!(
                                "{other:?} is not cached: the methods are \"GET\" and \"HEAD\""
                            ),
                        ))
                    }
                }
            }
            if list.is_empty() {
                return Err(invalid(
                    format!("{at}.methods"),
                    "an empty list caches nothing; list methods or set enabled = false",
                ));
            }
        }
    }
    let mut key = Vec::with_capacity(raw.key.len());
    for k in &raw.key {
        let part = parse_key_part(k).map_err(|m| invalid(format!("{at}.key"), m))?;
        if key.contains(&part) {
            return Err(invalid(
                format!("{at}.key"),
                format!("{k:?} is listed twice"),
            ));
        }
        key.push(part);
    }
    if !raw.charge_hits {
        // The limits run before the lookup (a hit is known only after admission).
        return Err(invalid(
            format!("{at}.charge_hits"),
            "false is not supported yet: a hit is charged to the route's limits like any request",
        ));
    }
    if !raw.enabled {
        return Ok(None);
    }
    Ok(Some(RouteCacheConfig {
        get,
        head,
        key,
        charge_hits: raw.charge_hits,
        rules,
    }))
}

/// One key part as written.
fn parse_key_part(s: &str) -> Result<KeyPart, String> {
    let bad = || format!("{s:?} is no key part: expected header:NAME, consumer, jwt:CLAIM or ip");
    match s.split_once(':') {
        None if s == "consumer" => Ok(KeyPart::Consumer),
        None if s == "ip" => Ok(KeyPart::Ip),
        Some(("header", name)) => http::HeaderName::from_bytes(name.trim().as_bytes())
            .map(KeyPart::Header)
            .map_err(|_| bad()),
        Some(("jwt", path)) => {
            let parts: Vec<Box<str>> = path.split('.').map(Box::from).collect();
            if parts.iter().any(|p| p.is_empty()) {
                return Err(bad());
            }
            Ok(KeyPart::Jwt(parts.into_boxed_slice()))
        }
        _ => Err(bad()),
    }
}

/// The rules at `at`, each key over `base`'s.
fn rules(at: &str, raw: RawCacheRules, base: &CacheRules) -> Result<CacheRules, ConfigError> {
    let statuses = match raw.statuses {
        None => base.statuses.clone(),
        Some(mut list) => {
            for s in &list {
                if !(200..=599).contains(s) {
                    return Err(invalid(
                        format!("{at}.statuses"),
                        format!("{s} is no final status (200 to 599)"),
                    ));
                }
                if NEVER_STORED.contains(s) {
                    return Err(invalid(
                        format!("{at}.statuses"),
                        format!(
                            "{s} is never stored (a refusal, a condition's or a range's answer)"
                        ),
                    ));
                }
            }
            list.sort_unstable();
            list.dedup();
            list
        }
    };
    let out = CacheRules {
        max_object_size: raw.max_object_size.map_or(base.max_object_size, |b| b.0),
        default_ttl: raw.default_ttl.map_or(base.default_ttl, |d| d.0),
        max_ttl: raw.max_ttl.map_or(base.max_ttl, |d| d.0),
        heuristic: raw.heuristic.unwrap_or(base.heuristic),
        statuses,
        lock_timeout: raw.lock_timeout.map_or(base.lock_timeout, |d| d.0),
    };
    if out.max_object_size == 0 {
        return Err(invalid(format!("{at}.max_object_size"), "must be positive"));
    }
    if out.max_ttl.is_zero() {
        return Err(invalid(
            format!("{at}.max_ttl"),
            "must be positive (set enabled = false to cache nothing)",
        ));
    }
    if out.default_ttl > out.max_ttl {
        return Err(invalid(
            format!("{at}.default_ttl"),
            "is longer than max_ttl, which bounds it",
        ));
    }
    if out.lock_timeout > Duration::from_secs(60) {
        return Err(invalid(format!("{at}.lock_timeout"), "must be at most 1m"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(text: &str) -> Result<Option<RouteCacheConfig>, ConfigError> {
        let raw: RawRouteCache = toml::from_str(text).unwrap();
        validate_route_cache("routes[0].cache", raw, &CacheConfig::default())
    }

    #[test]
    fn a_route_takes_the_defaults_and_overrides_them_key_by_key() {
        let r = route("").unwrap().unwrap();
        assert!(r.get && r.head && r.charge_hits);
        assert_eq!(r.rules, CacheRules::default());
        let r = route(
            r#"methods = ["GET"]
key = ["header:x-tenant", "consumer", "jwt:org.id"]
max_ttl = "10m"
statuses = [404, 200]"#,
        )
        .unwrap()
        .unwrap();
        assert!(r.get && !r.head);
        assert_eq!(r.rules.statuses, vec![200, 404]);
        assert_eq!(r.rules.max_ttl, Duration::from_secs(600));
        assert_eq!(r.key.len(), 3);
        assert!(r.needs_claims());
        assert!(route("enabled = false").unwrap().is_none());
    }

    #[test]
    fn errors_name_the_key() {
        let field = |text: &str| match route(text) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(field(r#"methods = ["POST"]"#), "routes[0].cache.methods");
        assert_eq!(field("statuses = [429]"), "routes[0].cache.statuses");
        assert_eq!(field("statuses = [304]"), "routes[0].cache.statuses");
        assert_eq!(field(r#"key = ["cookie:x"]"#), "routes[0].cache.key");
        assert_eq!(field("charge_hits = false"), "routes[0].cache.charge_hits");
        assert_eq!(
            field(r#"default_ttl = "2d""#),
            "routes[0].cache.default_ttl"
        );
        assert_eq!(
            field(r#"max_object_size = "1g""#),
            "routes[0].cache.max_object_size"
        );
        let raw: RawCache = toml::from_str(r#"tag_header = "a b""#).unwrap();
        assert!(matches!(
            validate_cache(Some(raw), std::path::Path::new("/etc/tollgate")),
            Err(ConfigError::Invalid { field, .. }) if field == "cache.tag_header"
        ));
        let raw: RawCache = toml::from_str(r#"tag_header = "Surrogate-Key""#).unwrap();
        assert_eq!(
            validate_cache(Some(raw), std::path::Path::new("/etc/tollgate"))
                .unwrap()
                .tag_header,
            "surrogate-key"
        );
        let raw: RawCache = toml::from_str("max_entries = 0").unwrap();
        assert!(matches!(
            validate_cache(Some(raw), std::path::Path::new("/etc/tollgate")),
            Err(ConfigError::Invalid { field, .. }) if field == "cache.max_entries"
        ));
    }

    #[test]
    fn the_disk_tier_is_a_directory_bounded_in_bytes() {
        let base = std::path::Path::new("/etc/tollgate");
        let cache = |text: &str| validate_cache(Some(toml::from_str(text).unwrap()), base);
        assert_eq!(cache("").unwrap().disk, None);
        let c = cache(r#"disk_path = "cache""#).unwrap();
        let disk = c.disk.clone().unwrap();
        assert_eq!(disk.path, base.join("cache"));
        assert_eq!(disk.max_bytes, DEFAULT_DISK_MAX_BYTES);
        // A response larger than the memory tier fits the disk's.
        let c = cache(
            r#"disk_path = "/var/cache/tollgate"
disk_max_bytes = "100m"
max_bytes = "1m"
max_object_size = "10m""#,
        )
        .unwrap();
        let path = &c.disk.as_ref().unwrap().path;
        assert_eq!(path, std::path::Path::new("/var/cache/tollgate"));
        assert_eq!(c.largest(), 100 << 20);
        let field = |text: &str| match cache(text) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(field(r#"disk_max_bytes = "1g""#), "cache.disk_max_bytes");
        assert_eq!(field(r#"disk_path = """#), "cache.disk_path");
        assert_eq!(
            field("disk_path = \"c\"\ndisk_max_bytes = 1000"),
            "cache.disk_max_bytes"
        );
        assert_eq!(
            field("max_bytes = \"1m\"\nmax_object_size = \"2m\""),
            "cache.max_object_size"
        );
    }
}
