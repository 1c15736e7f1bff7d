//! Prometheus metrics: names (a contract dashboards and alerts are built on), descriptions, and
//! small typed handles so the hot path only increments.
//!
//! Labels are bounded: route, limit and plan names come from the config, `status` is a status code,
//! `decision`/`kind`/`result` are fixed words. Never a path, subject, key or address.
//!
//! A route's and a limit's handles are registered at their first use, not at start-up: a gateway
//! with 10,000 routes of which a few get traffic exports those few, and an idle route costs a
//! pointer. The first use registers the whole group at once (every upstream class and error kind
//! of the route, every decision of the limit), so a ratio never lacks a side.
//!
//! The series of `[[upstreams]]` groups and servers are not the recorder's: they are written at
//! each scrape from the configuration that serves ([`UpstreamExposition`]), so those of a server
//! or group a reload removed go with it.

use std::ops::Deref;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
// The series the limiting core records (named in `tollgate_limit`, described here with the rest).
pub use tollgate_limit::metrics::{
    LeaseMetrics, StoreMetrics, DENY_CACHE_HITS, LEASE_REQUESTS, LEASE_UNITS, STORE_DURATION,
    STORE_ERRORS, STORE_EVICTIONS, STORE_SUBJECTS, STORE_UP,
};

pub const REQUESTS_TOTAL: &str = "tollgate_requests_total";
pub const REQUEST_DURATION: &str = "tollgate_request_duration_seconds";
pub const UPSTREAM_DURATION: &str = "tollgate_upstream_duration_seconds";
pub const UPSTREAM_ERRORS: &str = "tollgate_upstream_errors_total";
pub const UPSTREAM_RESPONSES: &str = "tollgate_upstream_responses_total";
pub const UPSTREAM_TRAILERS_TOO_LARGE: &str = "tollgate_upstream_trailers_too_large_total";
pub const DECISIONS_TOTAL: &str = "tollgate_ratelimit_decisions_total";
pub const BANS_TOTAL: &str = "tollgate_ratelimit_bans_total";
pub const TLS_HANDSHAKE_ERRORS: &str = "tollgate_tls_handshake_errors_total";
/// QUIC Retry packets sent (`[server.http3] retry`): connection attempts asked to prove their
/// address before anything is served.
pub const QUIC_RETRIES: &str = "tollgate_quic_retries_total";
/// The `reason` labels of [`TLS_HANDSHAKE_ERRORS`] (`tls::handshake::Failure`, held to this list
/// by a test there).
pub const TLS_HANDSHAKE_REASONS: [&str; 11] = [
    "timeout",
    "malformed",
    "unknown_sni",
    "incompatible",
    "client_cert_missing",
    "client_cert_unknown_ca",
    "client_cert_expired",
    "client_cert_revoked",
    "client_cert_invalid",
    "peer_alert",
    "other",
];
pub const TLS_CERT_EXPIRY: &str = "tollgate_tls_certificate_expiry_seconds";
/// `result`: `tls::acme::manager::RESULTS`.
pub const ACME_ORDERS: &str = "tollgate_acme_orders_total";
pub const CONFIG_RELOADS: &str = "tollgate_config_reloads_total";
pub const ACCESS_LOG_DROPPED: &str = "tollgate_access_log_dropped_total";
pub const UPSTREAM_SERVER_UP: &str = "tollgate_upstream_server_up";
pub const UPSTREAM_REQUESTS: &str = "tollgate_upstream_requests_total";
pub const UPSTREAM_RETRIES: &str = "tollgate_upstream_retries_total";
pub const CONSUMERS: &str = "tollgate_consumers";
pub const CACHE_REQUESTS: &str = "tollgate_cache_requests_total";
pub const CACHE_STORED_BYTES: &str = "tollgate_cache_stored_bytes";
pub const CACHE_STORED_ENTRIES: &str = "tollgate_cache_stored_entries";
/// The disk tier's files and their bytes (`[cache] disk_path`); the two above are the memory
/// tier's, as they were before there was a disk tier.
pub const CACHE_DISK_STORED_BYTES: &str = "tollgate_cache_disk_stored_bytes";
pub const CACHE_DISK_STORED_ENTRIES: &str = "tollgate_cache_disk_stored_entries";
/// `result`: written, skipped (the queue was full, or larger than the tier), failed.
pub const CACHE_DISK_WRITES: &str = "tollgate_cache_disk_writes_total";
/// `result`: hit, miss (the index knew a file that was gone), corrupt (removed).
pub const CACHE_DISK_READS: &str = "tollgate_cache_disk_reads_total";
/// The `status` labels of [`CACHE_REQUESTS`], in [`CacheStatus`]'s order.
pub const CACHE_STATUSES: [&str; 6] =
    ["hit", "miss", "stale", "revalidated", "bypass", "collapsed"];
pub const IN_FLIGHT: &str = "tollgate_ratelimit_in_flight";
pub const COST_SOURCE: &str = "tollgate_ratelimit_cost_source_total";
pub const ADMIN_UNAUTHORIZED: &str = "tollgate_admin_unauthorized_total";
pub const QUOTA_ADMIN: &str = "tollgate_quota_admin_total";
/// `[rls]` (Envoy's rate limit service): decisions per configured descriptor (`domain`,
/// `descriptor`: `rate_limit.name` or the configured path, never a request's value).
pub const RLS_DECISIONS: &str = "tollgate_rls_decisions_total";
/// `[rls]`: `ShouldRateLimit` calls by answer (`ok`, `over_limit`, `invalid`, `unavailable`).
pub const RLS_REQUESTS: &str = "tollgate_rls_requests_total";
/// `[rls]`: calls or descriptors refused or left unmatched, by `reason` (bounded list).
pub const RLS_REFUSED: &str = "tollgate_rls_refused_total";
/// `[[rls.quota]]` (RLQS): units leased to Envoys by `quota` and `kind` (`granted`, `returned`,
/// `lapsed`: unused but past their grant's state).
pub const RLQS_UNITS: &str = "tollgate_rlqs_units_total";
/// RLQS: assignments sent by `quota` and `action` (`token_bucket`, `deny_all`).
pub const RLQS_ASSIGNMENTS: &str = "tollgate_rlqs_assignments_total";
/// RLQS: the requests Envoy reports it decided itself, by `quota` and `decision`.
pub const RLQS_REPORTED: &str = "tollgate_rlqs_reported_requests_total";
/// RLQS: buckets refused or left unmapped, by `reason` (bounded list).
pub const RLQS_REFUSED: &str = "tollgate_rlqs_refused_total";
/// RLQS: streams open.
pub const RLQS_STREAMS: &str = "tollgate_rlqs_streams";
pub const ACCESS_DENIED: &str = "tollgate_access_denied_total";
pub const JWT_REJECTED: &str = "tollgate_jwt_rejected_total";
pub const PROXY_PROTOCOL_ERRORS: &str = "tollgate_proxy_protocol_errors_total";
/// The `reason` labels of [`PROXY_PROTOCOL_ERRORS`] (`server::proxy_protocol::Refused`, held to
/// this list by a test there).
pub const PROXY_PROTOCOL_REASONS: [&str; 4] = ["untrusted", "missing", "malformed", "timeout"];
pub const HTTP1_HANDOFFS: &str = "tollgate_http1_handoffs_total";
/// The `reason` labels of [`HTTP1_HANDOFFS`]: what the fast HTTP/1 front hands to hyper with
/// the connection (`protocol`: an upgrade, `Expect`, HTTP/1.0, a framing or target it does not
/// serve, anything malformed; `head_too_large`: hyper answers 431; `route`: a route whose
/// needs the fast front does not serve; `grpc`: a gRPC or gRPC-Web request).
pub const HTTP1_HANDOFF_REASONS: [&str; 4] = ["protocol", "head_too_large", "route", "grpc"];
pub const TRACE_EXPORT_ERRORS: &str = "tollgate_trace_export_errors_total";
pub const TRACE_SPANS_DROPPED: &str = "tollgate_trace_spans_dropped_total";
pub const TRACE_SPANS_EXPORTED: &str = "tollgate_trace_spans_exported_total";

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
    for reason in TLS_HANDSHAKE_REASONS {
        metrics::counter!(TLS_HANDSHAKE_ERRORS, "reason" => reason).absolute(0);
    }
    metrics::counter!(ACCESS_LOG_DROPPED).absolute(0);
    for reason in PROXY_PROTOCOL_REASONS {
        metrics::counter!(PROXY_PROTOCOL_ERRORS, "reason" => reason).absolute(0);
    }
    metrics::gauge!(CONSUMERS).set(0.0);
    for result in ["success", "failure"] {
        metrics::counter!(CONFIG_RELOADS, "result" => result).absolute(0);
    }
    metrics::counter!(ADMIN_UNAUTHORIZED).absolute(0);
    for reason in HTTP1_HANDOFF_REASONS {
        metrics::counter!(HTTP1_HANDOFFS, "reason" => reason).absolute(0);
    }
    for action in ["reset", "grant"] {
        metrics::counter!(QUOTA_ADMIN, "action" => action).absolute(0);
    }
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        CACHE_REQUESTS,
        "Requests of routes with [routes.cache], by route and cache status (hit, miss, stale, revalidated, bypass, collapsed)."
    );
    describe_gauge!(
        CACHE_STORED_BYTES,
        Unit::Bytes,
        "Bytes the HTTP cache's stored responses take in memory (as weighed)."
    );
    describe_gauge!(
        CACHE_STORED_ENTRIES,
        "Responses the HTTP cache holds in memory."
    );
    describe_gauge!(
        CACHE_DISK_STORED_BYTES,
        Unit::Bytes,
        "Bytes the HTTP cache's disk tier takes (its files, in whole 4 KiB blocks)."
    );
    describe_gauge!(
        CACHE_DISK_STORED_ENTRIES,
        "Responses the HTTP cache's disk tier holds (its files)."
    );
    describe_counter!(
        CACHE_DISK_WRITES,
        "Responses written to the HTTP cache's disk tier, by result (written, skipped, failed)."
    );
    describe_counter!(
        CACHE_DISK_READS,
        "Reads of the HTTP cache's disk tier, by result (hit, miss, corrupt)."
    );
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
        "Upstream failures by route and kind (connect, tls, timeout, other); each failed attempt counts, retried or not."
    );
    describe_counter!(
        UPSTREAM_RESPONSES,
        "Response heads received from the upstream, by route and status class (1xx to 5xx). Not the gateway's own answers (429, 503 when failing closed, 502/504 when the upstream fails)."
    );
    describe_counter!(
        QUIC_RETRIES,
        "QUIC Retry packets sent by the HTTP/3 listener ([server.http3] retry): connection attempts asked to prove their address before anything is served."
    );
    describe_counter!(
        UPSTREAM_TRAILERS_TOO_LARGE,
        "Upstream responses whose trailers were over 64 KiB, by route: a gRPC call ended with grpc-status 13, any other response with an error."
    );
    describe_counter!(
        DECISIONS_TOTAL,
        "Rate-limit decisions by route, limit, plan (empty for a route's own limits) and decision (allowed, limited, delayed, shadow, fail_open, fail_closed, exempt)."
    );
    describe_counter!(
        BANS_TOTAL,
        "Bans started by route and limit: a subject refused ban_after times within the limit's period, refused outright for ban_for."
    );
    describe_histogram!(
        STORE_DURATION,
        Unit::Seconds,
        "Time the store took to decide a request's limits."
    );
    describe_counter!(STORE_ERRORS, "Store errors by backend and kind.");
    describe_counter!(
        HTTP1_HANDOFFS,
        "Connections the fast HTTP/1 front handed to the hyper front (from that request on), by reason (protocol, head_too_large, route, grpc)."
    );
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
    describe_counter!(
        TLS_HANDSHAKE_ERRORS,
        "TLS handshakes that failed, by reason (timeout, malformed, unknown_sni, incompatible, client_cert_*, peer_alert, other)."
    );
    describe_counter!(
        ACME_ORDERS,
        "ACME certificate orders by result (issued: a name's first, renewed, failed); only with [server.tls.acme]."
    );
    describe_gauge!(
        TLS_CERT_EXPIRY,
        "When each configured TLS name's certificate expires (Unix time, seconds; the soonest of the certificates serving it)."
    );
    describe_counter!(
        LEASE_REQUESTS,
        "Leases asked of the store by limits with sync = \"lease\"."
    );
    describe_counter!(
        LEASE_UNITS,
        "Leased units by outcome: used by a request, returned unused, expired unused, revoked (their state was reset or lost)."
    );
    describe_gauge!(
        IN_FLIGHT,
        "Requests holding a slot of a concurrency limit on this gateway (sum over subjects)."
    );
    describe_counter!(
        COST_SOURCE,
        "Post-response charges of limits with cost_from, by route, limit and outcome: found (every source held an integer), missing, malformed (the limit's cost was charged instead)."
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Configuration reloads by result (success, failure)."
    );
    describe_counter!(
        TRACE_EXPORT_ERRORS,
        "Trace exports to the OTLP endpoint that failed or timed out (each drops its batch)."
    );
    describe_counter!(
        TRACE_SPANS_DROPPED,
        "Spans not exported: the export queue was full, or their export failed."
    );
    describe_counter!(TRACE_SPANS_EXPORTED, "Spans the OTLP endpoint accepted.");
    describe_gauge!(
        CONSUMERS,
        "Consumers loaded from the [consumers] file (set at start-up and on every reload)."
    );
    describe_counter!(
        ADMIN_UNAUTHORIZED,
        "Admin requests refused with 401: a protected endpoint without a known bearer token."
    );
    describe_counter!(
        QUOTA_ADMIN,
        "Quota operations applied on the admin API, by action (reset, grant)."
    );
    describe_counter!(
        PROXY_PROTOCOL_ERRORS,
        "Connections closed for their PROXY protocol header, by reason (untrusted: a header from a peer outside proxy_protocol_from; missing; malformed; timeout)."
    );
    describe_counter!(
        JWT_REJECTED,
        "Requests refused with 401 for their bearer token, by route and reason (missing, malformed, algorithm, unknown_key, bad_signature, expired, not_yet_valid, issuer, audience; throttled: answered 429 unverified, past [jwt] max_bad_tokens)."
    );
    describe_counter!(
        ACCESS_DENIED,
        "Requests refused with 403 by a route's allow/deny lists, by route."
    );
    describe_counter!(
        ACCESS_LOG_DROPPED,
        "Access-log lines not written: the writer's queue was full (a slow sink) or the write failed."
    );
    describe_counter!(
        RLS_DECISIONS,
        "Envoy rate limit service: descriptor decisions (ok, over_limit, shadow, unlimited) by domain and configured descriptor."
    );
    describe_counter!(
        RLS_REQUESTS,
        "Envoy rate limit service: ShouldRateLimit calls by answer (ok, over_limit, invalid, unavailable)."
    );
    describe_counter!(
        RLS_REFUSED,
        "Envoy rate limit service: calls refused as invalid, or descriptors matching nothing, by reason."
    );
    describe_counter!(
        RLQS_UNITS,
        "Envoy quota service (RLQS): units leased to Envoys (granted, returned, lapsed) by quota."
    );
    describe_counter!(
        RLQS_ASSIGNMENTS,
        "Envoy quota service (RLQS): assignments sent (token_bucket, deny_all) by quota."
    );
    describe_counter!(
        RLQS_REPORTED,
        "Envoy quota service (RLQS): requests Envoy reports it decided itself (allowed, denied) by quota."
    );
    describe_counter!(
        RLQS_REFUSED,
        "Envoy quota service (RLQS): buckets refused or mapped to no quota, by reason."
    );
    describe_gauge!(RLQS_STREAMS, "Envoy quota service (RLQS): streams open.");
}

/// Handles of one route, registered at the route's first use (its first response, upstream
/// response or upstream error); until then the route exports no series. Dereferences to the
/// registered [`RouteHandles`], registering them on first access.
#[derive(Debug)]
pub struct RouteMetrics {
    route: Arc<str>,
    handles: OnceLock<Box<RouteHandles>>,
}

/// The registered handles of a route.
#[derive(Debug)]
pub struct RouteHandles {
    statuses: StatusCounters,
    pub request_duration: Histogram,
    pub upstream_duration: Histogram,
    pub upstream_connect_errors: Counter,
    pub upstream_tls_errors: Counter,
    pub upstream_timeouts: Counter,
    pub upstream_other_errors: Counter,
    /// Upstream responses by status class: index 0 is 1xx, 4 is 5xx.
    upstream_responses: [Counter; 5],
    /// Requests refused by the route's access lists.
    pub access_denied: Counter,
}

impl RouteHandles {
    fn register(route: &str) -> RouteHandles {
        let err = |kind: &'static str| metrics::counter!(UPSTREAM_ERRORS, "route" => route.to_owned(), "kind" => kind);
        RouteHandles {
            statuses: StatusCounters::default(),
            request_duration: metrics::histogram!(REQUEST_DURATION, "route" => route.to_owned()),
            upstream_duration: metrics::histogram!(UPSTREAM_DURATION, "route" => route.to_owned()),
            // Every class and kind at 0 together: the 5xx-ratio alert adds the classes to the
            // error counters, and a sum with a missing side has no result.
            upstream_connect_errors: err("connect"),
            upstream_tls_errors: err("tls"),
            upstream_timeouts: err("timeout"),
            upstream_other_errors: err("other"),
            upstream_responses: ["1xx", "2xx", "3xx", "4xx", "5xx"].map(|class| {
                metrics::counter!(UPSTREAM_RESPONSES, "route" => route.to_owned(), "class" => class)
            }),
            access_denied: metrics::counter!(ACCESS_DENIED, "route" => route.to_owned()),
        }
    }
}

impl Deref for RouteMetrics {
    type Target = RouteHandles;

    fn deref(&self) -> &RouteHandles {
        self.handles
            .get_or_init(|| Box::new(RouteHandles::register(&self.route)))
    }
}

impl RouteMetrics {
    /// Handles for `route`; nothing is registered until the first use.
    pub fn new(route: &Arc<str>) -> RouteMetrics {
        RouteMetrics {
            route: route.clone(),
            handles: OnceLock::new(),
        }
    }

    /// Counts one response with `status` (its series appears at the route's first one).
    pub fn response(&self, status: http::StatusCode) {
        let code = status.as_u16();
        self.statuses
            .get(code, || {
                metrics::counter!(REQUESTS_TOTAL, "route" => self.route.to_string(), "status" => code.to_string())
            })
            .increment(1);
    }

    /// Counts one response head received from the upstream.
    pub fn upstream_response(&self, status: http::StatusCode) {
        let class = usize::from(status.as_u16() / 100).saturating_sub(1);
        if let Some(counter) = self.upstream_responses.get(class) {
            counter.increment(1);
        }
    }
}

/// Slots per [`StatusCounters`] table: more than the statuses a route usually answers with.
const STATUS_SLOTS: usize = 16;

/// `tollgate_requests_total` counters of one route by status, filled as statuses are first seen:
/// a small open-addressing table whose slots are claimed with a compare-and-swap and never
/// released, chained to a further table once full. After a status's first response, counting it
/// is two loads and an increment: no lock, no allocation.
#[derive(Debug, Default)]
struct StatusCounters {
    slots: [StatusSlot; STATUS_SLOTS],
    /// The table for statuses that found every slot here taken.
    more: OnceLock<Box<StatusCounters>>,
}

#[derive(Debug, Default)]
struct StatusSlot {
    /// The status this slot counts, 0 while free (no status is 0).
    code: AtomicU16,
    counter: OnceLock<Counter>,
}

impl StatusCounters {
    /// The counter of `code`, registered with `register` at its first use.
    fn get(&self, code: u16, register: impl Fn() -> Counter) -> &Counter {
        let mut table = self;
        loop {
            let start = usize::from(code) % STATUS_SLOTS;
            for slot in table.slots[start..].iter().chain(&table.slots[..start]) {
                let mut owner = slot.code.load(Ordering::Acquire);
                if owner == 0 {
                    owner = match slot.code.compare_exchange(
                        0,
                        code,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => code,
                        Err(current) => current,
                    };
                }
                if owner == code {
                    return slot.counter.get_or_init(&register);
                }
            }
            table = table.more.get_or_init(Box::default);
        }
    }
}

/// Decision counters of one limit, registered (all six at 0) at the limit's first decision;
/// until then the limit exports no series. Dereferences to the registered [`DecisionCounters`],
/// registering them on first access.
#[derive(Debug)]
pub struct LimitMetrics {
    route: Arc<str>,
    limit: Arc<str>,
    /// The plan of a plan's limit, `""` for a route's own (a config name: bounded).
    plan: Arc<str>,
    counters: OnceLock<Box<DecisionCounters>>,
}

/// The registered decision counters of a limit.
#[derive(Debug)]
pub struct DecisionCounters {
    pub allowed: Counter,
    pub limited: Counter,
    pub delayed: Counter,
    pub shadow: Counter,
    pub fail_open: Counter,
    pub fail_closed: Counter,
    /// Requests the limit's `exempt` list let past it (not decided).
    pub exempt: Counter,
    /// Bans this limit started (`ban_after`).
    pub bans: Counter,
}

impl LimitMetrics {
    /// Counters for `limit` of `route`; nothing is registered until the first decision.
    pub fn new(route: &Arc<str>, limit: &Arc<str>) -> LimitMetrics {
        LimitMetrics::with_plan(route, limit, "")
    }

    /// Counters for `limit` of `plan` applied on `route` (`""`: the route's own limit).
    pub fn with_plan(route: &Arc<str>, limit: &Arc<str>, plan: &str) -> LimitMetrics {
        LimitMetrics {
            route: route.clone(),
            limit: limit.clone(),
            plan: Arc::from(plan),
            counters: OnceLock::new(),
        }
    }
}

impl Deref for LimitMetrics {
    type Target = DecisionCounters;

    fn deref(&self) -> &DecisionCounters {
        self.counters.get_or_init(|| {
            let c = |decision: &'static str| metrics::counter!(DECISIONS_TOTAL, "route" => self.route.to_string(), "limit" => self.limit.to_string(), "plan" => self.plan.to_string(), "decision" => decision);
            Box::new(DecisionCounters {
                allowed: c("allowed"),
                limited: c("limited"),
                delayed: c("delayed"),
                shadow: c("shadow"),
                fail_open: c("fail_open"),
                fail_closed: c("fail_closed"),
                exempt: c("exempt"),
                bans: metrics::counter!(BANS_TOTAL, "route" => self.route.to_string(), "limit" => self.limit.to_string()),
            })
        })
    }
}

/// The attempts of one server of an `[[upstreams]]` group, by class: plain counters, not
/// registered with the recorder. The upstream series (`tollgate_upstream_server_up`,
/// `tollgate_upstream_requests_total`, `tollgate_upstream_retries_total`) are written at each
/// scrape from the groups of the configuration that serves ([`UpstreamExposition`]), so a
/// server or group that a reload removed has no series left: the recorder has no way to drop
/// a series, and with pod IP churn every reload would add a server's seven for good.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Attempts by class: index 0 is 1xx, 4 is 5xx, 5 is `error`.
    requests: [AtomicU64; 6],
}

/// The `class` label of each [`ServerMetrics`] counter.
const SERVER_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

impl ServerMetrics {
    /// Counts one attempt that got a response head with `status`.
    pub fn response(&self, status: http::StatusCode) {
        let class = usize::from(status.as_u16() / 100).saturating_sub(1);
        if let Some(c) = self.requests.get(class.min(4)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one attempt that got no response head.
    pub fn error(&self) {
        self.requests[5].fetch_add(1, Ordering::Relaxed);
    }
}

/// The attempts on a further server of a group after a failure (`tollgate_upstream_retries_total`);
/// carried over a reload by the group's name, as a server's counters are by its address.
pub type RetryCounter = Arc<AtomicU64>;

/// Writes the upstream series of one scrape, in the exporter's text format, after what the
/// recorder renders: one family at a time, so the groups are visited once per family.
pub struct UpstreamExposition<'a> {
    out: &'a mut String,
}

/// One configured server, as the scrape sees it.
pub struct ServerSample<'a> {
    pub upstream: &'a str,
    pub server: &'a str,
    pub up: bool,
    pub metrics: &'a ServerMetrics,
}

impl<'a> UpstreamExposition<'a> {
    pub fn new(out: &'a mut String) -> UpstreamExposition<'a> {
        UpstreamExposition { out }
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) {
        use metrics_exporter_prometheus::formatting::{write_help_line, write_type_line};
        write_help_line(self.out, name, None, None, help);
        write_type_line(self.out, name, None, None, kind);
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        use metrics_exporter_prometheus::formatting::sanitize_label_value;
        use std::fmt::Write as _;
        self.out.push_str(name);
        self.out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            let _ = write!(self.out, "{k}=\"{}\"", sanitize_label_value(v));
        }
        let _ = writeln!(self.out, "}} {value}");
    }

    /// `tollgate_upstream_server_up` and `tollgate_upstream_requests_total` of `servers` (in
    /// order), then `tollgate_upstream_retries_total` of `groups`. Nothing without a group.
    pub fn write<'s>(
        mut self,
        servers: impl Iterator<Item = ServerSample<'s>> + Clone,
        groups: impl Iterator<Item = (&'s str, u64)> + Clone,
    ) {
        if groups.clone().next().is_none() {
            return;
        }
        self.family(
            UPSTREAM_SERVER_UP,
            "gauge",
            "1 while a server of an [[upstreams]] group is in rotation, 0 while it is out by passive or active health checks.",
        );
        for s in servers.clone() {
            let labels = [("upstream", s.upstream), ("server", s.server)];
            self.sample(UPSTREAM_SERVER_UP, &labels, u8::from(s.up));
        }
        self.out.push('\n');
        self.family(
            UPSTREAM_REQUESTS,
            "counter",
            "Attempts sent to each server of an [[upstreams]] group, by upstream, server and class (1xx to 5xx: the response head's status; error: no response head).",
        );
        for s in servers {
            for (class, count) in SERVER_CLASSES.iter().zip(&s.metrics.requests) {
                let labels = [
                    ("upstream", s.upstream),
                    ("server", s.server),
                    ("class", class),
                ];
                self.sample(UPSTREAM_REQUESTS, &labels, count.load(Ordering::Relaxed));
            }
        }
        self.out.push('\n');
        self.family(
            UPSTREAM_RETRIES,
            "counter",
            "Attempts on a further server of a group after a failure, by upstream.",
        );
        for (upstream, retries) in groups {
            self.sample(UPSTREAM_RETRIES, &[("upstream", upstream)], retries);
        }
        self.out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    use http::StatusCode;

    use super::*;

    /// Runs `f` against a private Prometheus recorder; returns its result and what it renders.
    fn scrape<T>(f: impl FnOnce(&dyn Fn() -> String) -> T) -> T {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || f(&|| handle.render()))
    }

    fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(name)).collect()
    }

    #[test]
    fn a_route_exports_nothing_until_its_first_response_then_its_alert_series() {
        scrape(|render| {
            let route: Arc<str> = Arc::from("api");
            let m = RouteMetrics::new(&route);
            let l = LimitMetrics::new(&route, &Arc::from("per-ip"));
            assert_eq!(
                render().trim(),
                "",
                "an idle route and limit export nothing"
            );

            m.response(StatusCode::OK);
            m.response(StatusCode::OK);
            m.response(StatusCode::TOO_MANY_REQUESTS);
            let text = render();
            let mut requests = series(&text, "tollgate_requests_total");
            requests.sort_unstable();
            assert_eq!(
                requests,
                [
                    "tollgate_requests_total{route=\"api\",status=\"200\"} 2",
                    "tollgate_requests_total{route=\"api\",status=\"429\"} 1"
                ],
                "{text}"
            );
            // The 5xx-ratio alert's two sides appear together, at 0.
            assert!(
                text.contains("tollgate_upstream_responses_total{route=\"api\",class=\"5xx\"} 0"),
                "{text}"
            );
            assert!(
                text.contains("tollgate_upstream_errors_total{route=\"api\",kind=\"connect\"} 0"),
                "{text}"
            );
            assert!(
                series(&text, "tollgate_ratelimit_decisions_total").is_empty(),
                "{text}"
            );

            l.allowed.increment(1);
            let text = render();
            assert_eq!(
                series(&text, "tollgate_ratelimit_decisions_total").len(),
                7,
                "{text}"
            );
            assert!(text.contains("tollgate_ratelimit_decisions_total{route=\"api\",limit=\"per-ip\",plan=\"\",decision=\"allowed\"} 1"), "{text}");
            assert!(text.contains("tollgate_ratelimit_decisions_total{route=\"api\",limit=\"per-ip\",plan=\"\",decision=\"limited\"} 0"), "{text}");
        });
    }

    /// Every status a response can carry gets its own counter, registered once, however many a
    /// route sees (the first table fills and chains), and from several threads at once.
    #[test]
    fn status_counters_register_each_status_once_and_count_it() {
        let table = StatusCounters::default();
        let registered: Mutex<HashMap<u16, Arc<AtomicU64>>> = Mutex::default();
        let counter = |code: u16| {
            table.get(code, || {
                let a = Arc::new(AtomicU64::new(0));
                let previous = registered.lock().unwrap().insert(code, a.clone());
                assert!(previous.is_none(), "{code} registered twice");
                Counter::from_arc(a)
            })
        };
        std::thread::scope(|s| {
            for t in 0..4u16 {
                s.spawn(move || {
                    for round in 0..3 {
                        for code in (100..=999u16).filter(|c| c % 4 == t || round > 0) {
                            counter(code).increment(1);
                        }
                    }
                });
            }
        });
        let registered = registered.into_inner().unwrap();
        assert_eq!(registered.len(), 900);
        for (code, n) in registered {
            // Thread `code % 4` counts it three times, the other three twice.
            assert_eq!(n.load(Ordering::Relaxed), 9, "status {code}");
        }
    }

    /// What an idle route and limit cost: their names (a limit's: route, limit and plan) and
    /// one empty pointer each.
    #[test]
    fn idle_handles_are_small() {
        assert!(std::mem::size_of::<RouteMetrics>() <= 32);
        assert!(std::mem::size_of::<LimitMetrics>() <= 64);
    }
}

/// How the cache served a request (the `status` label of [`CACHE_REQUESTS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    Hit = 0,
    Miss,
    Stale,
    Revalidated,
    Bypass,
    Collapsed,
}

impl CacheStatus {
    /// Its `status` label (and the access log's `cache` field).
    pub fn as_str(self) -> &'static str {
        CACHE_STATUSES[self as usize]
    }
}

/// A caching route's [`CACHE_REQUESTS`] counters, registered at their first use (all six at
/// once: a hit ratio never lacks a side).
#[derive(Debug)]
pub struct CacheCounters {
    route: Arc<str>,
    handles: OnceLock<[Counter; 6]>,
}

impl CacheCounters {
    pub fn new(route: &Arc<str>) -> CacheCounters {
        CacheCounters {
            route: route.clone(),
            handles: OnceLock::new(),
        }
    }

    /// One more request served as `status`.
    pub fn count(&self, status: CacheStatus) {
        let handles = self.handles.get_or_init(|| {
            CACHE_STATUSES.map(|s| {
                metrics::counter!(CACHE_REQUESTS, "route" => self.route.to_string(), "status" => s)
            })
        });
        handles[status as usize].increment(1);
    }
}

/// The cache's stored entries and bytes (its memory tier).
pub fn cache_stored(entries: usize, bytes: u64) {
    metrics::gauge!(CACHE_STORED_ENTRIES).set(entries as f64);
    metrics::gauge!(CACHE_STORED_BYTES).set(bytes as f64);
}

/// The disk tier's files and bytes.
pub fn cache_disk_stored(files: u64, bytes: u64) {
    metrics::gauge!(CACHE_DISK_STORED_ENTRIES).set(files as f64);
    metrics::gauge!(CACHE_DISK_STORED_BYTES).set(bytes as f64);
}

/// One write of the disk tier (`result`: written, skipped, failed).
pub fn cache_disk_write(result: &'static str) {
    metrics::counter!(CACHE_DISK_WRITES, "result" => result).increment(1);
}

/// One read of the disk tier (`result`: hit, miss, corrupt).
pub fn cache_disk_read(result: &'static str) {
    metrics::counter!(CACHE_DISK_READS, "result" => result).increment(1);
}
