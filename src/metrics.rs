//! Prometheus metrics: names (a contract dashboards and alerts are built on), descriptions, and
//! small typed handles registered once per route and limit so the hot path only increments.
//!
//! Labels are bounded: route and limit names come from the config, `status` is a status code,
//! `decision`/`kind`/`result` are fixed words. Never a path, subject, key or address.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const REQUESTS_TOTAL: &str = "tollgate_requests_total";
pub const REQUEST_DURATION: &str = "tollgate_request_duration_seconds";
pub const UPSTREAM_DURATION: &str = "tollgate_upstream_duration_seconds";
pub const UPSTREAM_ERRORS: &str = "tollgate_upstream_errors_total";
pub const UPSTREAM_RESPONSES: &str = "tollgate_upstream_responses_total";
pub const DECISIONS_TOTAL: &str = "tollgate_ratelimit_decisions_total";
pub const STORE_DURATION: &str = "tollgate_store_duration_seconds";
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";
pub const STORE_UP: &str = "tollgate_store_up";
pub const STORE_EVICTIONS: &str = "tollgate_store_evictions_total";
pub const STORE_SUBJECTS: &str = "tollgate_store_subjects";
pub const DENY_CACHE_HITS: &str = "tollgate_store_deny_cache_hits_total";
pub const TLS_HANDSHAKE_ERRORS: &str = "tollgate_tls_handshake_errors_total";
pub const CONFIG_RELOADS: &str = "tollgate_config_reloads_total";

/// The `route` label of requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Latency buckets (seconds) for every histogram: 100µs to 30s.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Installs the global Prometheus recorder and describes every metric. Call once, before any
/// handle is registered (handles registered earlier are no-ops).
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
    // Series that only move on rare events are registered up front, so dashboards and alerts
    // see a 0 rather than no series at all.
    metrics::counter!(TLS_HANDSHAKE_ERRORS).absolute(0);
    for result in ["success", "failure"] {
        metrics::counter!(CONFIG_RELOADS, "result" => result).absolute(0);
    }
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        REQUESTS_TOTAL,
        "Responses sent by the gateway, by route and status code."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Whole request time at the gateway, by route."
    );
    describe_histogram!(
        UPSTREAM_DURATION,
        Unit::Seconds,
        "Time to the upstream's response head, by route; responses received only (failures are in tollgate_upstream_errors_total)."
    );
    describe_counter!(
        UPSTREAM_ERRORS,
        "Upstream failures by route and kind (connect, timeout, other)."
    );
    describe_counter!(
        UPSTREAM_RESPONSES,
        "Response heads received from the upstream, by route and status class (1xx to 5xx). Not the gateway's own answers (429, 503 when failing closed, 502/504 when the upstream fails)."
    );
    describe_counter!(
        DECISIONS_TOTAL,
        "Rate-limit decisions by route, limit and decision (allowed, limited, delayed, shadow, fail_open, fail_closed)."
    );
    describe_histogram!(
        STORE_DURATION,
        Unit::Seconds,
        "Time the store took to decide a request's limits."
    );
    describe_counter!(STORE_ERRORS, "Store errors by backend and kind.");
    describe_gauge!(
        STORE_UP,
        "1 when the limit store can decide, 0 when it is failing."
    );
    describe_counter!(
        STORE_EVICTIONS,
        "In-process store entries removed, by reason (expired, capacity)."
    );
    describe_gauge!(STORE_SUBJECTS, "Subjects tracked by the in-process store.");
    describe_counter!(
        DENY_CACHE_HITS,
        "Requests denied from the local deny cache without asking Redis."
    );
    describe_counter!(TLS_HANDSHAKE_ERRORS, "TLS handshakes that failed.");
    describe_counter!(
        CONFIG_RELOADS,
        "Configuration reloads by result (success, failure)."
    );
}

/// Handles of one route.
#[derive(Debug)]
pub struct RouteMetrics {
    route: Arc<str>,
    statuses: Box<[OnceLock<Counter>]>,
    pub request_duration: Histogram,
    pub upstream_duration: Histogram,
    pub upstream_connect_errors: Counter,
    pub upstream_timeouts: Counter,
    pub upstream_other_errors: Counter,
    /// Upstream responses by status class: index 0 is 1xx, 4 is 5xx.
    upstream_responses: [Counter; 5],
}

impl RouteMetrics {
    pub fn new(route: &Arc<str>) -> RouteMetrics {
        let r = route.to_string();
        let err = |kind: &'static str| metrics::counter!(UPSTREAM_ERRORS, "route" => r.clone(), "kind" => kind);
        RouteMetrics {
            route: route.clone(),
            statuses: (100..600).map(|_| OnceLock::new()).collect(),
            request_duration: metrics::histogram!(REQUEST_DURATION, "route" => r.clone()),
            upstream_duration: metrics::histogram!(UPSTREAM_DURATION, "route" => r.clone()),
            upstream_connect_errors: err("connect"),
            upstream_timeouts: err("timeout"),
            upstream_other_errors: err("other"),
            // Registered up front: the 5xx-ratio alert adds these to the error counters, and a
            // sum with a missing side has no result.
            upstream_responses: ["1xx", "2xx", "3xx", "4xx", "5xx"].map(|class| {
                metrics::counter!(UPSTREAM_RESPONSES, "route" => r.clone(), "class" => class)
            }),
        }
    }

    /// Counts one response with `status`.
    pub fn response(&self, status: http::StatusCode) {
        let code = status.as_u16();
        if let Some(cell) = self.statuses.get(usize::from(code.saturating_sub(100))) {
            cell.get_or_init(|| {
                metrics::counter!(REQUESTS_TOTAL, "route" => self.route.to_string(), "status" => code.to_string())
            })
            .increment(1);
        }
    }

    /// Counts one response head received from the upstream.
    pub fn upstream_response(&self, status: http::StatusCode) {
        let class = usize::from(status.as_u16() / 100).saturating_sub(1);
        if let Some(counter) = self.upstream_responses.get(class) {
            counter.increment(1);
        }
    }
}

/// Decision counters of one limit.
#[derive(Debug)]
pub struct LimitMetrics {
    pub allowed: Counter,
    pub limited: Counter,
    pub delayed: Counter,
    pub shadow: Counter,
    pub fail_open: Counter,
    pub fail_closed: Counter,
}

impl LimitMetrics {
    pub fn new(route: &Arc<str>, limit: &Arc<str>) -> LimitMetrics {
        let c = |decision: &'static str| metrics::counter!(DECISIONS_TOTAL, "route" => route.to_string(), "limit" => limit.to_string(), "decision" => decision);
        LimitMetrics {
            allowed: c("allowed"),
            limited: c("limited"),
            delayed: c("delayed"),
            shadow: c("shadow"),
            fail_open: c("fail_open"),
            fail_closed: c("fail_closed"),
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
