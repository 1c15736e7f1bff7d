//! The keys of a limit that say where its count lives in a fleet of gateways: `store`
//! (`"shared"`, the `[store]`, or `"local"`, this gateway's own memory), and how a shared count is
//! kept in step: `sync = "exact"` (every request asks the store) or `"lease"` (a gateway takes
//! several units at once and admits from them locally; `lease_ttl`, `lease_max`).

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{Algorithm, HumanDuration};
use super::{bounded, invalid, ConfigError};

/// `[[routes.limits]] sync`: how a shared limit's count is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sync {
    /// Every request is decided by the store.
    #[default]
    Exact,
    /// Units are leased from the store in advance and spent locally.
    Lease,
}

/// The default `lease_ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_millis(250);
/// The longest `lease_ttl`.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(10);

/// A limit's lease settings (`sync = "lease"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Unused units go back at the latest this long after the lease's last use.
    pub ttl: Duration,
    /// The most units one lease holds.
    pub max: u64,
}

/// `[[routes.limits]] store`: where the limit's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LimitStore {
    /// The `[store]` (shared by every gateway when it is Redis).
    #[default]
    Shared,
    /// This gateway's own memory, whatever `[store] backend` says: each gateway counts alone.
    Local,
}

impl LimitStore {
    /// The name in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitStore::Shared => "shared",
            LimitStore::Local => "local",
        }
    }
}

/// A limit's fleet settings, with defaults resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fleet {
    pub store: LimitStore,
    /// `Some` with `sync = "lease"`.
    pub lease: Option<LeaseConfig>,
}

/// The fleet keys of one limit as written.
pub(super) struct RawFleet {
    pub store: LimitStore,
    pub sync: Sync,
    pub lease_ttl: Option<HumanDuration>,
    pub lease_max: Option<u64>,
}

/// Validates the fleet keys of the limit at `at`, whose algorithm, quota (what `remaining`
/// counts down from), cost and after-response charging are given.
pub(super) fn validate_fleet(
    at: &str,
    f: RawFleet,
    algorithm: Algorithm,
    quota: u64,
    cost: u64,
    charged_after: bool,
) -> Result<Fleet, ConfigError> {
    let lat = |field: &str| format!("{at}.{field}");
    if f.sync == Sync::Exact {
        for (set, field) in [
            (f.lease_ttl.is_some(), "lease_ttl"),
            (f.lease_max.is_some(), "lease_max"),
        ] {
            if set {
                return Err(invalid(lat(field), "only applies with sync = \"lease\""));
            }
        }
        return Ok(Fleet {
            store: f.store,
            lease: None,
        });
    }
    if f.store == LimitStore::Local {
        return Err(invalid(
            lat("sync"),
            "a local limit is decided in process; leases are for shared limits",
        ));
    }
    if !matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::Gcra
    ) {
        let why = match algorithm {
            Algorithm::SlidingLog => "keeps one entry per request",
            Algorithm::SlidingWindow => "weighs a unit by the window it was charged in, so a unit leased in one window cannot be spent in the next",
            Algorithm::LeakyBucket => "gives each request its own place in the queue",
            _ => "counts requests in flight, not a rate",
        };
        return Err(invalid(
            lat("sync"),
            format!(
                "{} cannot lease: it {why}; use fixed_window, token_bucket or gcra",
                algorithm.as_str()
            ),
        ));
    }
    if charged_after {
        return Err(invalid(
            lat("sync"),
            "a lease charges before the request; count_status, cost_header and cost_from charge after the response",
        ));
    }
    let ttl = match f.lease_ttl {
        Some(d) => bounded(lat("lease_ttl"), d, MAX_LEASE_TTL, "10s", false)?,
        None => DEFAULT_LEASE_TTL,
    };
    if ttl < Duration::from_millis(1) {
        return Err(invalid(lat("lease_ttl"), "must be at least 1ms"));
    }
    let max = f.lease_max.unwrap_or_else(|| (quota / 20).max(cost));
    if max < cost || max > quota {
        return Err(invalid(
            lat("lease_max"),
            format!("must hold at least one request (cost {cost}) and at most the quota ({quota})"),
        ));
    }
    Ok(Fleet {
        store: f.store,
        lease: Some(LeaseConfig { ttl, max }),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const ROUTE: &str = "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n";

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new(".")).map_err(|e| e.to_string())
    }

    #[test]
    fn store_local_on_route_and_plan_limits() {
        let text = format!(
            "{ROUTE}[[routes.limits]]\nname = \"burst\"\nalgorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\nsubject = \"ip\"\nstore = \"local\"\n\
             [[routes.limits]]\nname = \"quota\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"\n\
             [[plans]]\nname = \"gold\"\n[[plans.limits]]\nname = \"p\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1s\"\nstore = \"local\"\n"
        );
        let c = parse(&text).unwrap();
        let limits = &c.routes[0].limits;
        assert_eq!(limits[0].fleet.store, LimitStore::Local);
        assert_eq!(limits[1].fleet.store, LimitStore::Shared, "the default");
        assert_eq!(c.plans[0].limits[0].limit.fleet.store, LimitStore::Local);
    }

    #[test]
    fn an_unknown_store_names_the_value_and_line() {
        let e = parse(&format!(
            "{ROUTE}[[routes.limits]]\nname = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\nstore = \"nearby\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("nearby") && e.contains("line 11"), "{e}");
    }
}

#[cfg(test)]
mod lease_tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::Config;

    fn limit(body: &str) -> Result<Config, String> {
        let text = format!(
            "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n[[routes.limits]]\nname = \"x\"\nperiod = \"1m\"\nsubject = \"ip\"\n{body}\n"
        );
        Config::parse(&text, Path::new(".")).map_err(|e| e.to_string())
    }

    #[test]
    fn lease_defaults_and_bounds() {
        let c = limit("algorithm = \"gcra\"\nlimit = 200\nsync = \"lease\"").unwrap();
        let l = c.routes[0].limits[0].fleet.lease.unwrap();
        assert_eq!(l.ttl, DEFAULT_LEASE_TTL);
        assert_eq!(l.max, 10, "a twentieth of the quota");
        let c = limit("algorithm = \"fixed_window\"\nlimit = 5\ncost = 2\nsync = \"lease\"\nlease_ttl = \"1s\"").unwrap();
        let l = c.routes[0].limits[0].fleet.lease.unwrap();
        assert_eq!(
            (l.ttl, l.max),
            (Duration::from_secs(1), 2),
            "at least one request"
        );
        for (body, field) in [
            (
                "algorithm = \"sliding_log\"\nlimit = 5\nsync = \"lease\"",
                "sync",
            ),
            (
                "algorithm = \"sliding_window\"\nlimit = 5\nsync = \"lease\"",
                "sync",
            ),
            (
                "algorithm = \"leaky_bucket\"\nlimit = 5\nsync = \"lease\"",
                "sync",
            ),
            (
                "algorithm = \"gcra\"\nlimit = 5\nsync = \"lease\"\nstore = \"local\"",
                "sync",
            ),
            (
                "algorithm = \"gcra\"\nlimit = 5\nsync = \"lease\"\ncount_status = [\"5xx\"]",
                "sync",
            ),
            (
                "algorithm = \"gcra\"\nlimit = 5\nsync = \"lease\"\nlease_ttl = \"11s\"",
                "lease_ttl",
            ),
            (
                "algorithm = \"gcra\"\nlimit = 5\nsync = \"lease\"\nlease_max = 6",
                "lease_max",
            ),
            (
                "algorithm = \"gcra\"\nlimit = 5\nlease_max = 2",
                "lease_max",
            ),
            (
                "algorithm = \"gcra\"\nlimit = 5\nlease_ttl = \"1s\"",
                "lease_ttl",
            ),
        ] {
            let e = limit(body).unwrap_err();
            assert!(
                e.contains(&format!("routes[0].limits[0].{field}`")),
                "{body}: {e}"
            );
        }
        let e = limit("algorithm = \"gcra\"\nlimit = 5\nsync = \"leased\"").unwrap_err();
        assert!(e.contains("leased") && e.contains("line 11"), "{e}");
    }
}
