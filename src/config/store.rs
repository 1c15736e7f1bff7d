//! `[store]`: which store decides, and how it is reached.

use std::time::Duration;

use super::raw::RawStore;
use super::values::{Backend, OnError};
use super::{bounded, invalid, ConfigError, MAX_STORE_TIMEOUT};

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
    /// `backend = "redis_sentinel"`: where the primary is found (`urls[0]` then gives only the
    /// primary's scheme, credentials and database).
    pub sentinel: Option<SentinelConfig>,
}

/// `[store] sentinels` and `master_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The sentinels' `redis://` or `rediss://` URLs (each with its own credentials).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub master_name: String,
}

impl StoreConfig {
    /// Whether `other` builds the same store: every key but `on_error` (which each request
    /// reads from the configuration) is part of the store.
    pub fn same_store(&self, other: &StoreConfig) -> bool {
        StoreConfig {
            on_error: other.on_error,
            ..self.clone()
        } == *other
    }
}

/// A `redis://` or `rediss://` URL the redis crate can use, at `field`.
fn check_url(field: &str, u: &str) -> Result<(), ConfigError> {
    if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
        return Err(invalid(
            field,
            format!("{u:?} must start with redis:// or rediss://"),
        ));
    }
    if redis::IntoConnectionInfo::into_connection_info(u).is_err() {
        return Err(invalid(field, format!("{u:?} is not a valid Redis URL")));
    }
    Ok(())
}

/// `sentinels` and `master_name`: required with `redis_sentinel`, refused otherwise.
fn validate_sentinel(s: &RawStore) -> Result<Option<SentinelConfig>, ConfigError> {
    if s.backend != Backend::RedisSentinel {
        if !s.sentinels.is_empty() {
            return Err(invalid(
                "store.sentinels",
                "is for backend = \"redis_sentinel\"",
            ));
        }
        if s.master_name.is_some() {
            return Err(invalid(
                "store.master_name",
                "is for backend = \"redis_sentinel\"",
            ));
        }
        return Ok(None);
    }
    if s.sentinels.is_empty() {
        return Err(invalid(
            "store.sentinels",
            "redis_sentinel needs at least one sentinel URL",
        ));
    }
    for (i, u) in s.sentinels.iter().enumerate() {
        check_url(&format!("store.sentinels[{i}]"), u)?;
    }
    let master_name = match &s.master_name {
        None => {
            return Err(invalid(
                "store.master_name",
                "is required with redis_sentinel",
            ))
        }
        Some(n) if n.is_empty() || n.len() > 128 || !n.bytes().all(|b| b.is_ascii_graphic()) => {
            return Err(invalid(
                "store.master_name",
                format!("{n:?}: use 1-128 visible ASCII characters, no spaces"),
            ))
        }
        Some(n) => n.clone(),
    };
    Ok(Some(SentinelConfig {
        sentinels: s.sentinels.clone(),
        master_name,
    }))
}

pub(super) fn validate_store(s: RawStore) -> Result<StoreConfig, ConfigError> {
    let sentinel = validate_sentinel(&s)?;
    let urls = match s.backend {
        Backend::Memory => Vec::new(),
        Backend::Redis | Backend::RedisSentinel => {
            if !s.urls.is_empty() {
                return Err(invalid(
                    "store.urls",
                    "is for backend = \"redis_cluster\"; use `url` (and `sentinels` for redis_sentinel)",
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
        let field = if s.backend == Backend::RedisCluster {
            format!("store.urls[{i}]")
        } else {
            "store.url".to_owned()
        };
        check_url(&field, u)?;
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
        sentinel,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Backend, Config};

    fn parse(store: &str) -> Result<Config, String> {
        Config::parse(&format!("[store]\n{store}\n"), Path::new(".")).map_err(|e| e.to_string())
    }

    #[test]
    fn redis_sentinel_needs_sentinels_and_a_master_name() {
        let c = parse(
            "backend = \"redis_sentinel\"\nsentinels = [\"redis://10.0.0.1:26379\", \"rediss://u:p@10.0.0.2:26379\"]\nmaster_name = \"mymaster\"\nurl = \"rediss://:secret@primary:6379/2\"",
        )
        .unwrap();
        assert_eq!(c.store.backend, Backend::RedisSentinel);
        let s = c.store.sentinel.unwrap();
        assert_eq!(s.sentinels.len(), 2);
        assert_eq!(s.master_name, "mymaster");
        assert_eq!(c.store.urls, vec!["rediss://:secret@primary:6379/2"]);
        for (store, field) in [
            ("backend = \"redis_sentinel\"\nmaster_name = \"m\"", "store.sentinels"),
            (
                "backend = \"redis_sentinel\"\nsentinels = [\"redis://a:1\"]",
                "store.master_name",
            ),
            (
                "backend = \"redis_sentinel\"\nsentinels = [\"redis://a:1\", \"http://b:2\"]\nmaster_name = \"m\"",
                "store.sentinels[1]",
            ),
            (
                "backend = \"redis_sentinel\"\nsentinels = [\"redis://a:1\"]\nmaster_name = \"my master\"",
                "store.master_name",
            ),
            (
                "backend = \"redis_sentinel\"\nsentinels = [\"redis://a:1\"]\nmaster_name = \"m\"\nurls = [\"redis://a:1\"]",
                "store.urls",
            ),
            ("backend = \"redis\"\nsentinels = [\"redis://a:1\"]", "store.sentinels"),
            ("backend = \"redis\"\nmaster_name = \"m\"", "store.master_name"),
        ] {
            let e = parse(store).unwrap_err();
            assert!(e.contains(&format!("`{field}`")), "{store}: {e}");
        }
        let e = parse("backend = \"redis_sentinal\"").unwrap_err();
        assert!(e.contains("redis_sentinal") && e.contains("line 2"), "{e}");
    }
}
