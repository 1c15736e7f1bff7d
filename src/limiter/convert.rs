//! The config layer's types → the limiting core's own (`tollgate_limit`): the core knows no
//! config file, so the validated `[[routes.limits]]` and `[store]` become its domain types here,
//! in one place.

use tollgate_limit::store::{Backend as StoreBackend, SentinelSettings, StoreSettings};

use super::{Algorithm, Policy};
use crate::config::{self, Backend, LimitConfig, StoreConfig};

impl From<config::Algorithm> for Algorithm {
    fn from(a: config::Algorithm) -> Algorithm {
        match a {
            config::Algorithm::FixedWindow => Algorithm::FixedWindow,
            config::Algorithm::SlidingWindow => Algorithm::SlidingWindow,
            config::Algorithm::SlidingLog => Algorithm::SlidingLog,
            config::Algorithm::TokenBucket => Algorithm::TokenBucket,
            config::Algorithm::Gcra => Algorithm::Gcra,
            config::Algorithm::LeakyBucket => Algorithm::LeakyBucket,
            config::Algorithm::Concurrency => Algorithm::Concurrency,
        }
    }
}

/// A policy's algorithm compared with the config's name for one (`l.policy.algorithm ==
/// config::Algorithm::Concurrency`).
impl PartialEq<config::Algorithm> for Algorithm {
    fn eq(&self, other: &config::Algorithm) -> bool {
        *self == Algorithm::from(*other)
    }
}

/// The same comparison the other way round (`config::Algorithm::Gcra == l.policy.algorithm`).
impl PartialEq<Algorithm> for config::Algorithm {
    fn eq(&self, other: &Algorithm) -> bool {
        Algorithm::from(*self) == *other
    }
}

/// The policy of a validated limit.
pub fn policy_of(l: &LimitConfig) -> Policy {
    Policy {
        algorithm: l.algorithm.into(),
        limit: l.limit,
        period: u64::try_from(l.period.as_micros()).unwrap_or(u64::MAX),
        burst: l.burst,
        cost: l.cost,
        calendar: l.calendar,
    }
}

impl From<Backend> for StoreBackend {
    fn from(b: Backend) -> StoreBackend {
        match b {
            Backend::Memory => StoreBackend::Memory,
            Backend::Redis => StoreBackend::Redis,
            Backend::RedisCluster => StoreBackend::RedisCluster,
            Backend::RedisSentinel => StoreBackend::RedisSentinel,
        }
    }
}

/// `[store]` as the store is built from it (`AnyStore::build(&config.store, …)`).
impl From<&StoreConfig> for StoreSettings {
    fn from(c: &StoreConfig) -> StoreSettings {
        StoreSettings {
            backend: c.backend.into(),
            urls: c.urls.clone(),
            timeout: c.timeout,
            key_prefix: c.key_prefix.clone(),
            max_subjects: c.max_subjects,
            deny_cache: c.deny_cache,
            sentinel: c.sentinel.as_ref().map(|s| SentinelSettings {
                sentinels: s.sentinels.clone(),
                master_name: s.master_name.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_keeps_its_name() {
        for a in [
            config::Algorithm::FixedWindow,
            config::Algorithm::SlidingWindow,
            config::Algorithm::SlidingLog,
            config::Algorithm::TokenBucket,
            config::Algorithm::Gcra,
            config::Algorithm::LeakyBucket,
            config::Algorithm::Concurrency,
        ] {
            assert_eq!(Algorithm::from(a).as_str(), a.as_str());
            assert!(Algorithm::from(a) == a && a == Algorithm::from(a));
        }
    }
}
