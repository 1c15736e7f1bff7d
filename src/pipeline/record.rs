//! The exchange record: what the pipeline learns about a request on its way through, and, once
//! its answer's status is known, the route's metrics and the access-log record, written here
//! once per exchange for every front.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::{Method, StatusCode};

use crate::access_log::{LimitDecision, Record};
use crate::limiter::CompiledLimit;
use crate::routing::Route;
use crate::runtime::state::Shared;
use crate::traces::{Facts, TraceTrail};

/// What the pipeline learns about a request on its way through, for the metrics and the access
/// log. Filled by moving what the request path computes anyway; the few fields only the access
/// log needs (the raw path of a refused request) are computed only when the log is on.
#[derive(Default)]
pub struct Trail<'s> {
    pub route: Option<&'s Route>,
    pub host: Option<String>,
    pub path: String,
    /// The client address (behind trusted proxies), once worked out: at most once a request.
    pub client_ip: Option<IpAddr>,
    /// The server that answered (or failed) the last attempt, as `host:port`, and the time that
    /// attempt took to its response head or failure; `None` if no upstream was called.
    pub upstream: Option<(&'s Arc<str>, Duration)>,
    /// The limit that denied (or the shadow limit that would have).
    pub limit: Option<&'s CompiledLimit>,
    pub decision: Option<LimitDecision>,
    /// The request's `Origin` (routes with `[routes.cors]` only), for the CORS headers of
    /// whatever the answer is ([`super::respond`]).
    pub origin: Option<HeaderValue>,
    /// The consumer the request's key (or verified token) names (routes with `consumers = true`).
    pub consumer: Option<crate::consumers::ConsumerRef<'s>>,
    /// The parts of the subject `limit` counted, as shown (a subject of parts or of a newer
    /// kind, when it denied or would have).
    pub subject: Option<Arc<[crate::limiter::ShownPart]>>,
    /// The request's trace context and spans to be (`[tracing]` only; boxed, so a gateway
    /// without traces carries a pointer).
    pub trace: Option<Box<TraceTrail<'s>>>,
    /// The request's verified bearer token (routes with `jwt`), for `$jwt.CLAIM` in response
    /// header rules.
    pub token: Option<std::sync::Arc<crate::jwt::Verified>>,
    /// The caller's plan's `limit_rate`, when the plan sets one (`Some(None)`: no limit, in
    /// place of the route's).
    pub plan_rate: Option<Option<crate::http::pacing::Pace>>,
    /// What the HTTP cache did (`[routes.cache]`), for the access log.
    pub cache: Option<&'static str>,
}

/// What a front tells the record about the exchange besides the trail.
pub struct Exchange<'a> {
    pub started: Instant,
    pub method: Method,
    pub request_id: &'a HeaderValue,
    /// The TCP peer (the client address when none was worked out).
    pub peer: IpAddr,
    pub status: StatusCode,
}

impl<'s> Trail<'s> {
    /// The trail's parts the upstream planner records into
    /// ([`crate::upstream::attempts::run`]), for every front.
    pub fn for_attempts(&mut self) -> crate::upstream::attempts::Records<'_, 's> {
        let spans = self
            .trace
            .as_deref_mut()
            .map(|t| t as &mut (dyn crate::upstream::AttemptSpans + Send + 's));
        (&mut self.upstream, spans)
    }
}

impl Trail<'_> {
    /// Records the exchange: the route's response metrics (or the unmatched ones), the debug
    /// line, a sampled request's spans and, when the access log is on, the record (sent by the
    /// front when the body ends).
    pub fn finish(
        mut self,
        shared: &Shared,
        logging: bool,
        x: Exchange<'_>,
    ) -> Option<Box<Record>> {
        if let Some(t) = self.trace.take() {
            self.trace_spans(*t, shared, &x);
        }
        let matched = self.route;
        let metrics = matched.map_or(&shared.unmatched, |r| &r.metrics);
        metrics.response(x.status);
        let elapsed = x.started.elapsed();
        metrics.request_duration.record(elapsed.as_secs_f64());
        tracing::debug!(
            route = matched.map_or(crate::metrics::UNMATCHED_ROUTE, |r| &*r.name),
            method = %x.method,
            status = x.status.as_u16(),
            peer = %x.peer,
            elapsed_ms = elapsed.as_secs_f64() * 1000.0,
            "request"
        );
        logging.then(|| {
            Box::new(Record {
                started: x.started,
                duration: Duration::ZERO,
                request_id: x.request_id.clone(),
                client_ip: self.client_ip.unwrap_or_else(|| x.peer.to_canonical()),
                method: x.method,
                host: self.host,
                path: self.path,
                status: x.status.as_u16(),
                bytes_sent: 0,
                upstream: self.upstream.map(|(a, d)| (a.clone(), d)),
                route: matched.map(|r| r.name.clone()),
                limit: self.limit.map(|l| l.name.clone()),
                decision: self.decision,
                consumer: self.consumer.as_ref().map(|c| c.name.clone()),
                subject: self.subject,
                cache: self.cache,
            })
        })
    }

    /// Hands the request's spans to the exporter (nothing for an unsampled request).
    fn trace_spans(&self, t: TraceTrail<'_>, shared: &Shared, x: &Exchange<'_>) {
        if !t.sampled {
            return;
        }
        let upstream = self
            .route
            .map(|r| crate::traces::spans::upstream_name(&r.target, &r.name));
        let store = shared.snapshot.load().store.backend();
        t.finish(&Facts {
            started: x.started,
            method: &x.method,
            status: x.status,
            route: self.route.map(|r| &*r.name),
            upstream: upstream.as_deref(),
            host: self.host.as_deref(),
            path: &self.path,
            client: self.client_ip,
            request_id: x.request_id.to_str().unwrap_or_default(),
            decision: self.decision,
            limit: self.limit.map(|l| &*l.name),
            consumer: self.consumer.as_deref().map(|c| &*c.name),
            store,
        });
    }
}
