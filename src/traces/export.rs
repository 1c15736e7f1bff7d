//! The exporter: a bounded queue the request path `try_send`s finished spans to, and one task
//! on the main runtime that batches them and exports each batch with the OTLP exporter of the
//! `opentelemetry-otlp` crate (HTTP/protobuf over hyper, or gRPC over tonic), bounded by
//! `export_timeout`.
//!
//! Ours rather than the SDK's `BatchSpanProcessor` because the request path builds finished
//! `SpanData` itself (no live span objects, no global tracer) and because a failed export must
//! move a Prometheus counter, which the SDK's processor only logs. The batching follows the
//! SDK's (and reads the same `OTEL_BSP_*` variables): up to `OTEL_BSP_MAX_QUEUE_SIZE` (2048)
//! spans queued, exported every `OTEL_BSP_SCHEDULE_DELAY` ms (5000) or as soon as
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512) are waiting, one export at a time.

use std::time::Duration;

use opentelemetry::trace::{SpanKind, TraceId};
use opentelemetry::{Context, InstrumentationScope};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample as _, SpanData,
    SpanExporter as _,
};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

use crate::config::traces::{OtlpProtocol, TracingConfig};
use crate::metrics::{TRACE_EXPORT_ERRORS, TRACE_SPANS_DROPPED, TRACE_SPANS_EXPORTED};
use tollgate_limit::log_throttle::Throttles;

/// The tracing of one configuration: how requests are sampled and where their spans go. Kept
/// by a reload that leaves `[tracing]` as it was; dropped with the last snapshot using it,
/// which ends its export task once the queue is drained.
pub struct Traces {
    pub config: TracingConfig,
    tx: mpsc::Sender<SpanData>,
    sampler: Sampler,
    ids: RandomIdGenerator,
    pub(super) propagator: TraceContextPropagator,
    pub(super) scope: InstrumentationScope,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The SDK's batch settings, from the standard `OTEL_BSP_*` variables.
struct Batching {
    queue: usize,
    batch: usize,
    delay: Duration,
}

impl Batching {
    fn from_env() -> Batching {
        let var = |name: &str, default: u64| -> u64 {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        let queue =
            usize::try_from(var("OTEL_BSP_MAX_QUEUE_SIZE", 2048).min(1 << 20)).unwrap_or(2048);
        let batch = usize::try_from(var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)).unwrap_or(512);
        Batching {
            queue,
            batch: batch.min(queue),
            delay: Duration::from_millis(var("OTEL_BSP_SCHEDULE_DELAY", 5000).min(3_600_000)),
        }
    }
}

impl Traces {
    fn new(cfg: &TracingConfig, queue: usize) -> (Traces, mpsc::Receiver<SpanData>) {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let traces = Traces {
            config: cfg.clone(),
            tx,
            sampler: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio))),
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
            scope: InstrumentationScope::builder("tollgate")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        };
        (traces, rx)
    }

    /// Builds the exporter and starts its task on the current runtime. Errors name what is
    /// wrong with the endpoint.
    pub fn start(cfg: &TracingConfig) -> Result<Traces, String> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "traces need the async runtime".to_owned())?;
        let _guard = handle.enter();
        let mut exporter = build_exporter(cfg)?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name(cfg.service_name.clone())
                .build(),
        );
        let batching = Batching::from_env();
        let (traces, rx) = Traces::new(cfg, batching.queue);
        // Registered now: a dashboard sees 0, not no series.
        metrics::counter!(TRACE_EXPORT_ERRORS).increment(0);
        metrics::counter!(TRACE_SPANS_DROPPED).increment(0);
        metrics::counter!(TRACE_SPANS_EXPORTED).increment(0);
        handle.spawn(run(rx, exporter, batching, cfg.export_timeout));
        tracing::info!(
            endpoint = %cfg.otlp_endpoint,
            protocol = cfg.otlp_protocol.as_str(),
            sample_ratio = cfg.sample_ratio,
            "exporting traces"
        );
        Ok(traces)
    }

    /// Sampling and ids without an exporter (the queue is never read): for tests.
    pub fn detached(cfg: &TracingConfig) -> Traces {
        Traces::new(cfg, 1).0
    }

    pub(super) fn new_trace_id(&self) -> TraceId {
        self.ids.new_trace_id()
    }

    pub(super) fn new_span_id(&self) -> opentelemetry::trace::SpanId {
        self.ids.new_span_id()
    }

    /// The decision for a request: its client's when `parent` (a valid remote context) is
    /// given, else `sample_ratio` of the trace id.
    pub(super) fn should_sample(&self, parent: Option<&Context>, trace_id: TraceId) -> bool {
        let r =
            self.sampler
                .should_sample(parent, trace_id, "request", &SpanKind::Server, &[], &[]);
        r.decision == SamplingDecision::RecordAndSample
    }

    /// Queues finished spans; when the queue is full (the collector is slow or down) they are
    /// dropped and counted.
    pub(super) fn send(&self, spans: Vec<SpanData>) {
        for s in spans {
            if self.tx.try_send(s).is_err() {
                metrics::counter!(TRACE_SPANS_DROPPED).increment(1);
            }
        }
    }
}

fn build_exporter(cfg: &TracingConfig) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let endpoint = cfg.otlp_endpoint.to_string();
    let timeout = cfg.export_timeout;
    let built = match cfg.otlp_protocol {
        OtlpProtocol::HttpProtobuf => {
            let b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .with_timeout(timeout)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            let connect = crate::upstream::connect::tcp_connector(timeout);
            if cfg.otlp_endpoint.scheme_str() == Some("https") {
                let tls = crate::upstream::tls::client_config(
                    &crate::config::upstream::UpstreamTls::default(),
                    false,
                )?;
                let c = crate::upstream::connect::TlsConnector::new(tls, None, timeout, false);
                b.with_http_client(opentelemetry_http::hyper::HyperClient::new(
                    c, timeout, None,
                ))
                .build()
            } else {
                b.with_http_client(opentelemetry_http::hyper::HyperClient::new(
                    connect, timeout, None,
                ))
                .build()
            }
        }
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(timeout)
            .build(),
    };
    built.map_err(|e| format!("cannot set up the OTLP exporter: {e}"))
}

/// The export task: batches, exports one batch at a time, counts what failed. Ends when every
/// sender is gone and the queue is empty.
async fn run(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    b: Batching,
    timeout: Duration,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(b.batch);
    loop {
        // Wait for the first span, then for more until the delay or a full batch.
        if rx.recv_many(&mut batch, b.batch).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + b.delay;
        let mut closed = false;
        while batch.len() < b.batch {
            let room = b.batch - batch.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, room)).await {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let spans = batch.len() as u64;
        let result =
            tokio::time::timeout(timeout, exporter.export(std::mem::take(&mut batch))).await;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            )),
        };
        match error {
            None => metrics::counter!(TRACE_SPANS_EXPORTED).increment(spans),
            Some(e) => {
                metrics::counter!(TRACE_EXPORT_ERRORS).increment(1);
                metrics::counter!(TRACE_SPANS_DROPPED).increment(spans);
                // One line a second at most: a collector that is down fails every export.
                static FAILED: Throttles<1> = Throttles::new();
                if let Some(suppressed) = FAILED.allow(0) {
                    tracing::warn!(error = %e, spans, suppressed, "trace export failed; the spans are dropped");
                }
            }
        }
        if closed {
            return;
        }
        batch = Vec::with_capacity(b.batch);
    }
}
