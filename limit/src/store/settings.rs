//! Which store to build and how it is reached: the store's own settings, in its own types (the
//! gateway's `[store]` section converts to them).

use std::time::Duration;

/// Which store decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// In process.
    #[default]
    Memory,
    Redis,
    RedisCluster,
    /// One Redis primary found (and followed through failovers) by Redis Sentinel.
    RedisSentinel,
}

impl Backend {
    /// The `backend` metric label (and the gateway's config spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis_cluster",
            Backend::RedisSentinel => "redis_sentinel",
        }
    }
}

/// What [`AnyStore::build`](super::AnyStore::build) builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    pub backend: Backend,
    /// Redis URLs: one for `Redis` and `RedisSentinel` (the primary's scheme, credentials and
    /// database), the seed nodes for `RedisCluster`, none for `Memory`.
    pub urls: Vec<String>,
    /// How long one Redis round trip may take.
    pub timeout: Duration,
    /// Prepended to every Redis key.
    pub key_prefix: String,
    /// The most subjects the in-process store keeps (then it evicts the least used).
    pub max_subjects: u64,
    /// Whether denials are cached in process in front of Redis.
    pub deny_cache: bool,
    /// `RedisSentinel`: where the primary is found.
    pub sentinel: Option<SentinelSettings>,
}

/// The sentinels of a `RedisSentinel` store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// The sentinels' `redis://` or `rediss://` URLs (each with its own credentials).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub master_name: String,
}

impl From<&StoreSettings> for StoreSettings {
    fn from(s: &StoreSettings) -> StoreSettings {
        s.clone()
    }
}
