//! A sampled request's spans, built from its trace trail and the exchange record's facts once
//! the status is known: the request (server) span, the store decision's span and one client
//! span per upstream attempt, children of the request span. Plain `SpanData`, as the OTLP
//! exporter takes it; attribute names follow OpenTelemetry's HTTP conventions where one fits
//! (`http.request.method`, `http.response.status_code`, `url.path`, `server.address`,
//! `client.address`, `error.type`, `http.request.resend_count`) and are `tollgate.*` otherwise.
//!
//! The request span ends when the response head is sent (when the record is written): the
//! streaming of a long body, a gRPC stream's messages, is not in it.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use http::{Method, StatusCode};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use super::context::TraceTrail;
use crate::access_log::LimitDecision;
use crate::upstream::AttemptOutcome;

/// What the exchange record knows when the spans are written.
pub struct Facts<'a> {
    pub started: Instant,
    pub method: &'a Method,
    pub status: StatusCode,
    pub route: Option<&'a str>,
    /// The upstream group's name (or the route's, for a route's own URL).
    pub upstream: Option<&'a str>,
    pub host: Option<&'a str>,
    pub path: &'a str,
    pub client: Option<IpAddr>,
    pub request_id: &'a str,
    pub decision: Option<LimitDecision>,
    pub limit: Option<&'a str>,
    pub consumer: Option<&'a str>,
    pub store: &'static str,
}

impl TraceTrail<'_> {
    /// The wall-clock time of `at`.
    fn wall(&self, at: Instant) -> SystemTime {
        let (sys, mono) = self.anchor;
        if at >= mono {
            sys.checked_add(at.duration_since(mono)).unwrap_or(sys)
        } else {
            sys.checked_sub(mono.duration_since(at)).unwrap_or(sys)
        }
    }

    /// Sends a sampled request's spans to the exporter's queue; an unsampled one's are not
    /// built.
    pub fn finish(self, f: &Facts<'_>) {
        if !self.sampled {
            return;
        }
        let now = Instant::now();
        let traces = self.traces;
        let mut out = Vec::with_capacity(2 + self.attempts.len());

        let mut attrs = vec![
            KeyValue::new("http.request.method", f.method.as_str().to_owned()),
            KeyValue::new("http.response.status_code", i64::from(f.status.as_u16())),
            KeyValue::new("url.path", f.path.to_owned()),
            KeyValue::new("tollgate.request_id", f.request_id.to_owned()),
        ];
        if let Some(r) = f.route {
            attrs.push(KeyValue::new("tollgate.route", r.to_owned()));
        }
        if let Some(h) = f.host {
            attrs.push(KeyValue::new("server.address", h.to_owned()));
        }
        if let Some(ip) = f.client {
            attrs.push(KeyValue::new("client.address", ip.to_string()));
        }
        if let Some(d) = f.decision {
            attrs.push(KeyValue::new("tollgate.ratelimit.decision", d.as_str()));
        }
        if let Some(l) = f.limit {
            attrs.push(KeyValue::new("tollgate.ratelimit.limit", l.to_owned()));
        }
        if let Some(c) = f.consumer {
            attrs.push(KeyValue::new("tollgate.consumer", c.to_owned()));
        }
        if let Some(a) = self.attempts.last() {
            attrs.push(KeyValue::new(
                "tollgate.upstream.server",
                a.server.to_string(),
            ));
        }
        let name = match f.route {
            Some(r) => format!("{} {r}", f.method),
            None => f.method.to_string(),
        };
        out.push(self.span(
            self.span_id,
            self.parent.unwrap_or(SpanId::INVALID),
            self.parent.is_some(),
            SpanKind::Server,
            name,
            (self.wall(f.started), self.wall(now)),
            attrs,
            if f.status.is_server_error() {
                Status::error(f.status.as_str().to_owned())
            } else {
                Status::Unset
            },
        ));

        if let Some(s) = self.store {
            let mut attrs = vec![KeyValue::new("tollgate.store.backend", f.store)];
            if let Some(d) = f.decision {
                attrs.push(KeyValue::new("tollgate.ratelimit.decision", d.as_str()));
            }
            out.push(self.span(
                s.span_id,
                self.span_id,
                false,
                SpanKind::Internal,
                Cow::Borrowed("ratelimit decide"),
                (self.wall(s.start), self.wall(s.end)),
                attrs,
                if s.ok {
                    Status::Unset
                } else {
                    Status::error("the store failed")
                },
            ));
        }

        for (n, a) in self.attempts.iter().enumerate() {
            let mut attrs = vec![
                KeyValue::new("http.request.method", f.method.as_str().to_owned()),
                KeyValue::new("server.address", a.server.to_string()),
            ];
            if let Some(u) = f.upstream {
                attrs.push(KeyValue::new("tollgate.upstream", u.to_owned()));
            }
            if n > 0 {
                attrs.push(KeyValue::new(
                    "http.request.resend_count",
                    i64::try_from(n).unwrap_or(i64::MAX),
                ));
            }
            let status = match a.outcome {
                AttemptOutcome::Status(code) => {
                    attrs.push(KeyValue::new("http.response.status_code", i64::from(code)));
                    if code >= 500 {
                        Status::error(code.to_string())
                    } else {
                        Status::Unset
                    }
                }
                AttemptOutcome::Error(kind) => {
                    attrs.push(KeyValue::new("error.type", kind));
                    Status::error(kind)
                }
                AttemptOutcome::Pending => {
                    attrs.push(KeyValue::new("error.type", "cancelled"));
                    Status::Unset
                }
            };
            out.push(self.span(
                a.span_id,
                self.span_id,
                false,
                SpanKind::Client,
                format!("{} upstream", f.method),
                (self.wall(a.start), self.wall(a.end.unwrap_or(now))),
                attrs,
                status,
            ));
        }
        traces.send(out);
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &self,
        span_id: SpanId,
        parent: SpanId,
        parent_remote: bool,
        kind: SpanKind,
        name: impl Into<Cow<'static, str>>,
        (start, end): (SystemTime, SystemTime),
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                self.trace_id,
                span_id,
                opentelemetry::trace::TraceFlags::SAMPLED,
                false,
                self.state.clone(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: parent_remote,
            span_kind: kind,
            name: name.into(),
            start_time: start,
            end_time: end.max(start),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.traces.scope.clone(),
        }
    }
}

/// A route's upstream name for the attempt spans: its group's, or the route's own for a
/// route's own URL (only routes that call an upstream have attempts).
pub fn upstream_name(target: &crate::routing::Target, route: &Arc<str>) -> Arc<str> {
    if let crate::routing::Target::Group(g) = target {
        g.name.clone()
    } else {
        route.clone()
    }
}
