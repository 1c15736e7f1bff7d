//! The trace context of one request: read from the client's W3C `traceparent`/`tracestate`
//! (continued when valid, a new trace otherwise), the sampling decision, and what the request
//! records on its way for its spans ([`TraceTrail`]): the store decision's times, each
//! upstream attempt's span id, server, times and outcome.
//!
//! Every request of a gateway with `[tracing]` gets a context, sampled or not, so an upstream
//! always receives a `traceparent` naming the attempt that called it (with the sampled flag as
//! decided): a trace is never cut at the gateway.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use http::header::{HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

use super::export::Traces;
use crate::http::head::{header_str, RequestHead};
use crate::upstream::{AttemptOutcome, AttemptSpans};

pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The client's trace headers, as the W3C propagator reads them. A request with two
/// `traceparent` headers has none (W3C: start a new trace); of several `tracestate` headers
/// the first is read.
struct HeadExtractor<'a, H>(&'a H);

impl<H: RequestHead> Extractor for HeadExtractor<'_, H> {
    fn get(&self, key: &str) -> Option<&str> {
        let name = match key {
            "traceparent" => &TRACEPARENT,
            "tracestate" => &TRACESTATE,
            _ => return None,
        };
        let mut values = self.0.header_values(name);
        let first = values.next()?;
        if name == TRACEPARENT && values.next().is_some() {
            return None;
        }
        header_str(first)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// One upstream attempt's span.
#[derive(Debug)]
pub struct AttemptSpan {
    pub span_id: SpanId,
    pub server: Arc<str>,
    pub start: Instant,
    pub end: Option<Instant>,
    pub outcome: AttemptOutcome,
}

/// The store's decision, timed.
#[derive(Debug, Clone, Copy)]
pub struct StoreSpan {
    pub span_id: SpanId,
    pub start: Instant,
    pub end: Instant,
    /// The store answered (rather than failing).
    pub ok: bool,
}

/// A request's trace context and what its spans will say.
#[derive(Debug)]
pub struct TraceTrail<'s> {
    pub(super) traces: &'s Traces,
    pub trace_id: TraceId,
    /// The request span's id.
    pub span_id: SpanId,
    /// The client's span, when the client sent a valid `traceparent`.
    pub parent: Option<SpanId>,
    pub sampled: bool,
    pub state: TraceState,
    /// The same moment on the wall clock and the monotonic one: spans' times are instants
    /// converted through it.
    pub(super) anchor: (SystemTime, Instant),
    pub store: Option<StoreSpan>,
    pub attempts: Vec<AttemptSpan>,
}

impl<'s> TraceTrail<'s> {
    /// Reads the client's context from `head` and decides sampling.
    pub fn begin(traces: &'s Traces, head: &impl RequestHead) -> TraceTrail<'s> {
        let anchor = (SystemTime::now(), Instant::now());
        let cx = traces.propagator.extract(&HeadExtractor(head));
        let remote = cx.span().span_context().clone();
        let (trace_id, parent, state) = if remote.is_valid() {
            (
                remote.trace_id(),
                Some(remote.span_id()),
                remote.trace_state().clone(),
            )
        } else {
            (traces.new_trace_id(), None, TraceState::default())
        };
        let sampled = traces.should_sample(remote.is_valid().then_some(&cx), trace_id);
        TraceTrail {
            traces,
            trace_id,
            span_id: traces.new_span_id(),
            parent,
            sampled,
            state,
            anchor,
            store: None,
            attempts: Vec::new(),
        }
    }

    fn flags(&self) -> TraceFlags {
        if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        }
    }

    /// `traceparent` naming span `span` of this trace.
    fn traceparent(&self, span: SpanId) -> HeaderValue {
        let v = format!("00-{}-{}-{:02x}", self.trace_id, span, self.flags().to_u8());
        // Hex digits and dashes only.
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// Records that the store decided between `start` and now; `ok`: it answered.
    pub fn store_decided(&mut self, start: Instant, ok: bool) {
        self.store = Some(StoreSpan {
            span_id: self.traces.new_span_id(),
            start,
            end: Instant::now(),
            ok,
        });
    }

    /// Starts an attempt to `server`: its span, and the `traceparent` (and `tracestate`, if
    /// any) to send it.
    pub fn begin_attempt(&mut self, server: &Arc<str>) -> (HeaderValue, Option<HeaderValue>) {
        let span_id = self.traces.new_span_id();
        self.attempts.push(AttemptSpan {
            span_id,
            server: server.clone(),
            start: Instant::now(),
            end: None,
            outcome: AttemptOutcome::Pending,
        });
        let state = self.state.header();
        let state = (!state.is_empty())
            .then(|| HeaderValue::from_str(&state).ok())
            .flatten();
        (self.traceparent(span_id), state)
    }

    /// Ends the attempt begun last.
    pub fn end_attempt(&mut self, outcome: AttemptOutcome) {
        if let Some(a) = self.attempts.last_mut() {
            a.end = Some(Instant::now());
            a.outcome = outcome;
        }
    }

    /// Sets the trace headers of an upstream attempt to `server` on `headers` (replacing the
    /// client's).
    pub fn stamp_attempt(&mut self, server: &Arc<str>, headers: &mut http::HeaderMap) {
        let (parent, state) = self.begin_attempt(server);
        headers.insert(TRACEPARENT.clone(), parent);
        match state {
            Some(s) => {
                headers.insert(TRACESTATE.clone(), s);
            }
            None => {
                headers.remove(&TRACESTATE);
            }
        }
    }
}

impl AttemptSpans for TraceTrail<'_> {
    fn begin_attempt(&mut self, server: &Arc<str>) -> (HeaderValue, Option<HeaderValue>) {
        TraceTrail::begin_attempt(self, server)
    }

    fn end_attempt(&mut self, outcome: AttemptOutcome) {
        TraceTrail::end_attempt(self, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::traces::{OtlpProtocol, TracingConfig};
    use crate::http::head::OwnedHead;

    fn traces(ratio: f64) -> Traces {
        Traces::detached(&TracingConfig {
            otlp_endpoint: "http://127.0.0.1:1/v1/traces".parse().unwrap(),
            otlp_protocol: OtlpProtocol::HttpProtobuf,
            sample_ratio: ratio,
            service_name: "t".into(),
            export_timeout: std::time::Duration::from_secs(1),
        })
    }

    fn head(headers: &[(&str, &str)]) -> OwnedHead {
        let mut h = OwnedHead::default();
        for (k, v) in headers {
            h.headers.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_client_trace_is_continued_with_its_sampling_decision() {
        let t = traces(0.0);
        let h = head(&[("traceparent", PARENT), ("tracestate", "vendor=x")]);
        let mut trail = TraceTrail::begin(&t, &h);
        assert_eq!(
            trail.trace_id.to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(trail.parent.unwrap().to_string(), "00f067aa0ba902b7");
        assert!(
            trail.sampled,
            "the client's sampled flag wins over a ratio of 0"
        );
        let mut up = http::HeaderMap::new();
        up.insert(&TRACEPARENT, HeaderValue::from_static(PARENT));
        trail.stamp_attempt(&Arc::from("127.0.0.1:1"), &mut up);
        let sent = up[&TRACEPARENT].to_str().unwrap().to_owned();
        let a = &trail.attempts[0];
        assert_eq!(
            sent,
            format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", a.span_id)
        );
        assert_eq!(up[&TRACESTATE], "vendor=x");

        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let all = traces(1.0);
        let trail = TraceTrail::begin(&all, &head(&[("traceparent", unsampled)]));
        assert!(
            !trail.sampled,
            "nor does a ratio of 1 override a client's 'no'"
        );
    }

    #[test]
    fn bad_or_repeated_traceparents_start_a_new_trace() {
        let t = traces(1.0);
        for bad in [
            &[("traceparent", "garbage")][..],
            &[(
                "traceparent",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            )],
            &[(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            )],
            &[("traceparent", PARENT), ("traceparent", PARENT)],
            &[(
                "traceparent",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )],
        ] {
            let trail = TraceTrail::begin(&t, &head(bad));
            assert!(trail.parent.is_none(), "{bad:?}");
            assert_ne!(trail.trace_id, TraceId::INVALID);
            assert!(trail.sampled, "a ratio of 1 samples every new trace");
        }
        let t = traces(0.0);
        assert!(!TraceTrail::begin(&t, &head(&[])).sampled);
    }
}
