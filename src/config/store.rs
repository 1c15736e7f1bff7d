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

pub(super) fn validate_store(s: RawStore) -> Result<StoreConfig, ConfigError> {
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
