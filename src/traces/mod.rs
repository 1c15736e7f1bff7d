//! OpenTelemetry traces (`[tracing]`): a span per request, with child spans for the store's
//! decision and for each upstream attempt, and the W3C trace context continued from the client
//! (or started) and sent upstream.
//!
//! Shaped so that tracing costs the request path almost nothing and never waits:
//! - [`context`]: at the start of a request, the client's `traceparent`/`tracestate` are read
//!   (the `opentelemetry` crates' W3C propagator) and the sampling decision taken (parent-based,
//!   `sample_ratio` for new traces); the pipeline carries the result in its trail
//!   ([`TraceTrail`]): ids and a few instants, no span objects.
//! - [`spans`]: once the exchange's status is known, the trail of a sampled request becomes
//!   plain `SpanData` (built from the same exchange record the metrics and access log use, so
//!   every front gets spans), handed to the exporter's queue with a `try_send`.
//! - [`export`]: one task on the main runtime batches the queue and exports with the OTLP
//!   exporter (HTTP/protobuf or gRPC), each export bounded by `export_timeout`. A collector that
//!   is down or hangs costs failed exports (`tollgate_trace_export_errors_total`) and, once the
//!   bounded queue is full, dropped spans (`tollgate_trace_spans_dropped_total`); never a
//!   request's time or unbounded memory.

pub mod context;
pub mod export;
pub mod spans;

pub use self::context::{TraceTrail, TRACEPARENT, TRACESTATE};
pub use self::export::Traces;
pub use self::spans::Facts;
