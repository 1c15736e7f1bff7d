//! What the stores record, through the `metrics` facade: the series' names and the handles the
//! stores hold.
//!
//! The crate records and never exports: whoever embeds it installs a recorder (the gateway's
//! Prometheus exporter, which also describes these series at start-up), or none, and then
//! recording costs nothing. The facade rather than an observer trait of our own because the
//! handles are what the hot path wants anyway (a `Counter` is an `Arc` to an atomic), and the
//! gateway's other series use the same facade. Labels are bounded: the backend, an error kind,
//! and the route and limit names the embedder gives.

use metrics::{Counter, Histogram};

pub const STORE_DURATION: &str = "tollgate_store_duration_seconds";
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";
pub const STORE_UP: &str = "tollgate_store_up";
pub const STORE_EVICTIONS: &str = "tollgate_store_evictions_total";
pub const STORE_SUBJECTS: &str = "tollgate_store_subjects";
pub const DENY_CACHE_HITS: &str = "tollgate_store_deny_cache_hits_total";
pub const LEASE_REQUESTS: &str = "tollgate_ratelimit_lease_requests_total";
pub const LEASE_UNITS: &str = "tollgate_ratelimit_lease_units_total";

/// The lease counters of a limit with `sync = "lease"` (labels: its route and name).
#[derive(Debug, Clone)]
pub struct LeaseMetrics {
    pub requests: Counter,
    pub used: Counter,
    pub returned: Counter,
    pub expired: Counter,
    pub revoked: Counter,
}

impl LeaseMetrics {
    pub fn new(route: &str, limit: &str) -> LeaseMetrics {
        let (r, l) = (route.to_owned(), limit.to_owned());
        let units = |outcome: &'static str| metrics::counter!(LEASE_UNITS, "route" => r.clone(), "limit" => l.clone(), "outcome" => outcome);
        LeaseMetrics {
            requests: metrics::counter!(LEASE_REQUESTS, "route" => r.clone(), "limit" => l.clone()),
            used: units("used"),
            returned: units("returned"),
            expired: units("expired"),
            revoked: units("revoked"),
        }
    }
}

/// Handles of the store.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    backend: &'static str,
    pub duration: Histogram,
}

impl StoreMetrics {
    pub fn new(backend: &'static str) -> StoreMetrics {
        for kind in ["connect", "timeout", "server", "circuit_open", "other"] {
            metrics::counter!(STORE_ERRORS, "backend" => backend, "kind" => kind).absolute(0);
        }
        StoreMetrics {
            backend,
            duration: metrics::histogram!(STORE_DURATION, "backend" => backend),
        }
    }

    pub fn error(&self, kind: &'static str) {
        metrics::counter!(STORE_ERRORS, "backend" => self.backend, "kind" => kind).increment(1);
    }

    pub fn set_up(&self, up: bool) {
        metrics::gauge!(STORE_UP).set(if up { 1.0 } else { 0.0 });
    }
}
