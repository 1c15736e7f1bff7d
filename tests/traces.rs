//! OpenTelemetry traces through the binary, against a real OTLP receiver started by the test:
//! an HTTP server on 127.0.0.1:0 that decodes `ExportTraceServiceRequest`s (OTLP/HTTP with
//! protobuf), or the same over gRPC; and a receiver that never answers.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use support::*;

/// A span as received, with its resource's `service.name`.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    span: Span,
}

impl Got {
    fn attr(&self, key: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                other => format!("{other:?}"),
            })
    }
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }
    fn parent(&self) -> String {
        hex(&self.span.parent_span_id)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A running receiver: what it got.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Got>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn keep(req: ExportTraceServiceRequest, into: &Mutex<Vec<Got>>) {
    let mut out = into.lock().unwrap();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                out.push(Got {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
}

impl Receiver {
    /// OTLP/HTTP: `POST /v1/traces` with a protobuf body.
    async fn http() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let s = spans.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let s = s.clone();
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let decoded = ExportTraceServiceRequest::decode(body)
                                .expect("an ExportTraceServiceRequest");
                            keep(decoded, &s);
                            let answer = ExportTraceServiceResponse::default().encode_to_vec();
                            let mut res = Response::new(Full::new(Bytes::from(answer)));
                            res.headers_mut().insert(
                                "content-type",
                                http::HeaderValue::from_static("application/x-protobuf"),
                            );
                            Ok::<_, Infallible>(res)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver { addr, spans, task }
    }

    /// OTLP/gRPC: the collector's `TraceService/Export`, over h2c.
    async fn grpc() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let s = spans.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let s = s.clone();
                        async move {
                            assert_eq!(
                                req.uri().path(),
                                "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
                            );
                            let codec = tonic_prost::ProstCodec::<
                                ExportTraceServiceResponse,
                                ExportTraceServiceRequest,
                            >::default();
                            let mut grpc = tonic::server::Grpc::new(codec);
                            let export = Export(s);
                            Ok::<_, Infallible>(grpc.unary(export, req).await)
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver { addr, spans, task }
    }

    /// A collector that accepts connections and reads, but never answers.
    async fn hanging() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                held.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                    // Held open, unanswered, until the client gives up.
                    std::future::pending::<()>().await;
                }));
            }
        });
        Receiver {
            addr,
            spans: Arc::new(Mutex::new(Vec::new())),
            task,
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `n` spans of `trace_id` arrived; returns them.
    async fn trace(&self, trace_id: &str, n: usize) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got: Vec<Got> = self
                .spans()
                .into_iter()
                .filter(|g| g.trace_id() == trace_id)
                .collect();
            if got.len() >= n || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The receiver's gRPC method.
#[derive(Clone)]
struct Export(Arc<Mutex<Vec<Got>>>);

impl tonic::server::UnaryService<ExportTraceServiceRequest> for Export {
    type Response = ExportTraceServiceResponse;
    type Future =
        tonic::codegen::BoxFuture<tonic::Response<ExportTraceServiceResponse>, tonic::Status>;
    fn call(&mut self, req: tonic::Request<ExportTraceServiceRequest>) -> Self::Future {
        let s = self.0.clone();
        Box::pin(async move {
            keep(req.into_inner(), &s);
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        })
    }
}

/// Spans exported within a few tens of milliseconds (the SDK's variable).
const FAST_EXPORT: &[(&str, &str)] = &[("OTEL_BSP_SCHEDULE_DELAY", "20")];

fn tracing_section(endpoint: &str, extra: &str) -> String {
    format!("[tracing]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"edge-test\"\n{extra}\n\n")
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// `00-<trace>-<span>-<flags>` split.
fn parts(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    assert_eq!(p[0], "00");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

// The store's decision is a span of its own: on every store.
on_every_store!(a_request_span_continues_the_clients_trace_with_store_and_attempt_children);

async fn a_request_span_continues_the_clients_trace_with_store_and_attempt_children(kind: Kind) {
    let env = store_env(kind);
    let rx = Receiver::http().await;
    let up = upstream().await;
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n{}\n\n{}{}{}",
        env.store,
        tracing_section(&format!("http://{}/v1/traces", rx.addr), ""),
        route("api", "/api/", &up.url(), ""),
        limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1m\"\nsubject = \"ip\""),
    );
    let gw = gateway_env(&cfg, FAST_EXPORT);
    wait_ready(&gw).await;
    let c = client();
    let res = c
        .get(gw.url("/api/hello"))
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .header("tracestate", "vendor=abc")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    // The upstream was called in the client's trace, by the attempt's span.
    let seen = up.seen();
    let tp = seen[0].headers["traceparent"].to_str().unwrap();
    let (trace, attempt_span, flags) = parts(tp);
    assert_eq!(trace, CLIENT_TRACE);
    assert_ne!(attempt_span, CLIENT_SPAN);
    assert_eq!(flags, "01");
    assert_eq!(seen[0].headers["tracestate"], "vendor=abc");

    let spans = rx.trace(CLIENT_TRACE, 3).await;
    assert_eq!(
        spans.len(),
        3,
        "request, store and attempt spans: {spans:#?}"
    );
    let by_kind = |k: SpanKind| -> Got {
        spans
            .iter()
            .find(|g| g.span.kind == k as i32)
            .unwrap_or_else(|| panic!("no {k:?} span in {spans:#?}"))
            .clone()
    };
    let request = by_kind(SpanKind::Server);
    assert_eq!(request.service, "edge-test");
    assert_eq!(request.parent(), CLIENT_SPAN, "continues the client's span");
    assert_eq!(request.span.name, "GET api");
    assert_eq!(request.attr("tollgate.route").as_deref(), Some("api"));
    assert_eq!(
        request.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(request.attr("http.request.method").as_deref(), Some("GET"));
    assert_eq!(request.attr("url.path").as_deref(), Some("/api/hello"));
    assert_eq!(
        request.attr("tollgate.ratelimit.decision").as_deref(),
        Some("allowed")
    );
    assert!(request.attr("tollgate.request_id").is_some());
    let store = by_kind(SpanKind::Internal);
    assert_eq!(store.span.name, "ratelimit decide");
    assert_eq!(store.parent(), request.span_id());
    let backend = match kind {
        Kind::Memory => "memory",
        _ => "redis",
    };
    assert_eq!(
        store.attr("tollgate.store.backend").as_deref(),
        Some(backend)
    );
    let attempt = by_kind(SpanKind::Client);
    assert_eq!(attempt.parent(), request.span_id());
    assert_eq!(
        attempt.span_id(),
        attempt_span,
        "the upstream's parent is the attempt"
    );
    assert_eq!(
        attempt.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attempt.attr("server.address"), Some(up.addr.to_string()));
    assert!(request.span.start_time_unix_nano <= store.span.start_time_unix_nano);
    assert!(store.span.end_time_unix_nano <= attempt.span.start_time_unix_nano);
    assert!(attempt.span.end_time_unix_nano <= request.span.end_time_unix_nano);

    // The limited request: its span says so, and no attempt was made.
    let limited_trace = "0af7651916cd43dd8448eb211c80319c";
    let res = c
        .get(gw.url("/api/again"))
        .header(
            "traceparent",
            format!("00-{limited_trace}-b7ad6b7169203331-01"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let spans = rx.trace(limited_trace, 2).await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let request = spans
        .iter()
        .find(|g| g.span.kind == SpanKind::Server as i32)
        .unwrap();
    assert_eq!(
        request.attr("http.response.status_code").as_deref(),
        Some("429")
    );
    assert_eq!(
        request.attr("tollgate.ratelimit.decision").as_deref(),
        Some("limited")
    );
    assert_eq!(
        request.attr("tollgate.ratelimit.limit").as_deref(),
        Some("per-ip")
    );
    assert!(!spans.iter().any(|g| g.span.kind == SpanKind::Client as i32));

    // The collector holds the spans before the exporter has its answer and counts them: wait
    // (bounded) for the count rather than read it once.
    let mut exported = 0.0;
    for _ in 0..100 {
        let m = gw.metrics().await;
        assert_eq!(metric(&m, "tollgate_trace_export_errors_total"), Some(0.0));
        exported = metric(&m, "tollgate_trace_spans_exported_total").unwrap();
        if exported >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(exported >= 5.0, "{exported}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_a_traceparent_starts_a_trace_and_retries_get_their_own_spans() {
    let rx = Receiver::http().await;
    let up = upstream().await;
    // A group whose first server refuses connections: the second attempt succeeds.
    let dead = free_port();
    let cfg = config(
        "backend = \"memory\"",
        &format!(
            "{}[[upstreams]]\nname = \"pair\"\nbalance = \"least_requests\"\nservers = [\"http://127.0.0.1:{dead}\", \"{}\"]\nretries = 1\nmax_fails = 0\n\n{}",
            tracing_section(&format!("http://{}/v1/traces", rx.addr), ""),
            up.url(),
            route("grp", "/g/", "pair", "")
        ),
    );
    let gw = gateway_env(&cfg, FAST_EXPORT);
    // least_requests with nothing in flight starts from a moving index: send until one request
    // has tried the dead server first.
    let c = client();
    let mut retried = None;
    for _ in 0..6 {
        let res = c.get(gw.url("/g/x")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        let tp = up.seen().last().unwrap().headers["traceparent"]
            .to_str()
            .unwrap()
            .to_owned();
        let (trace, _, flags) = parts(&tp);
        assert_eq!(flags, "01", "sample_ratio defaults to 1");
        rx.trace(&trace, 2).await;
        // A request's spans are queued together: a moment more, and all have arrived.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let spans = rx.trace(&trace, 0).await;
        let request = spans
            .iter()
            .find(|g| g.span.kind == SpanKind::Server as i32)
            .expect("a request span");
        assert!(
            request.span.parent_span_id.is_empty(),
            "a new trace has a root span"
        );
        let attempts: Vec<&Got> = spans
            .iter()
            .filter(|g| g.span.kind == SpanKind::Client as i32)
            .collect();
        if attempts.len() == 2 {
            retried = Some((
                tp,
                attempts.iter().map(|g| (*g).clone()).collect::<Vec<_>>(),
            ));
            break;
        }
    }
    let (tp, attempts) = retried.expect("one request tried the dead server first");
    let failed = attempts
        .iter()
        .find(|g| g.attr("error.type").is_some())
        .expect("the failed attempt");
    assert_eq!(failed.attr("error.type").as_deref(), Some("connect"));
    assert_eq!(
        failed.attr("server.address"),
        Some(format!("127.0.0.1:{dead}"))
    );
    let ok = attempts
        .iter()
        .find(|g| g.attr("http.response.status_code").is_some())
        .expect("the attempt that answered");
    assert_eq!(ok.attr("http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(ok.attr("tollgate.upstream").as_deref(), Some("pair"));
    assert_eq!(
        parts(&tp).1,
        ok.span_id(),
        "the server that answered saw its attempt's span"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unsampled_requests_are_propagated_but_not_exported() {
    let rx = Receiver::http().await;
    let up = upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &format!(
            "{}{}",
            tracing_section(
                &format!("http://{}/v1/traces", rx.addr),
                "sample_ratio = 0.0"
            ),
            route("api", "/api/", &up.url(), "")
        ),
    );
    let gw = gateway_env(&cfg, FAST_EXPORT);
    let c = client();
    for _ in 0..5 {
        assert_eq!(c.get(gw.url("/api/x")).send().await.unwrap().status(), 200);
    }
    for s in up.seen() {
        let (_, _, flags) = parts(s.headers["traceparent"].to_str().unwrap());
        assert_eq!(flags, "00", "not sampled, and the upstream is told so");
    }
    // A client that samples its trace is followed whatever the ratio: once its spans arrived,
    // nothing else was exported.
    let res = c
        .get(gw.url("/api/x"))
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(rx.trace(CLIENT_TRACE, 2).await.len(), 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let others: Vec<Got> = rx
        .spans()
        .into_iter()
        .filter(|g| g.trace_id() != CLIENT_TRACE)
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_are_exported_over_otlp_grpc_too() {
    let rx = Receiver::grpc().await;
    let up = upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &format!(
            "{}{}",
            tracing_section(&format!("http://{}", rx.addr), "otlp_protocol = \"grpc\""),
            route("api", "/api/", &up.url(), "")
        ),
    );
    let gw = gateway_env(&cfg, FAST_EXPORT);
    let res = client()
        .get(gw.url("/api/x"))
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let spans = rx.trace(CLIENT_TRACE, 2).await;
    assert_eq!(spans.len(), 2, "request and attempt: {spans:#?}");
    assert!(spans.iter().all(|g| g.service == "edge-test"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_collector_costs_requests_nothing_and_counts_export_errors() {
    let rx = Receiver::hanging().await;
    let up = upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &format!(
            "{}{}",
            tracing_section(
                &format!("http://{}/v1/traces", rx.addr),
                "export_timeout = \"200ms\""
            ),
            route("api", "/api/", &up.url(), "")
        ),
    );
    // A queue of 8 spans: it fills while the export hangs.
    let gw = gateway_env(
        &cfg,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
        ],
    );
    let c = client();
    let started = Instant::now();
    for i in 0..40 {
        let t0 = Instant::now();
        let res = c.get(gw.url(&format!("/api/{i}"))).send().await.unwrap();
        assert_eq!(res.status(), 200);
        // Far below the export timeout: no request waits for an export.
        assert!(
            t0.elapsed() < Duration::from_millis(150),
            "request {i} took {:?}",
            t0.elapsed()
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = gw.metrics().await;
        let errors = metric(&m, "tollgate_trace_export_errors_total").unwrap_or(0.0);
        let dropped = metric(&m, "tollgate_trace_spans_dropped_total").unwrap_or(0.0);
        if (errors >= 1.0 && dropped >= 1.0) || Instant::now() > deadline {
            assert!(errors >= 1.0, "{m}");
            assert!(dropped >= 1.0, "a full queue drops spans: {m}");
            assert_eq!(metric(&m, "tollgate_trace_spans_exported_total"), Some(0.0));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The gateway still serves normally.
    assert_eq!(
        c.get(gw.url("/api/last")).send().await.unwrap().status(),
        200
    );
    assert!(!gw.logs().contains("panicked"));
}

#[test]
fn check_names_the_tracing_key_that_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let cases: HashMap<&str, &str> = [
        (
            "[tracing]\notlp_endpoint = \"http://127.0.0.1:4318/v1/traces\"\nsample_ratio = 1.5\n",
            "tracing.sample_ratio",
        ),
        (
            "[tracing]\notlp_endpoint = \"collector:4318\"\n",
            "tracing.otlp_endpoint",
        ),
        (
            "[tracing]\notlp_endpoint = \"https://c:4317\"\notlp_protocol = \"grpc\"\n",
            "tracing.otlp_endpoint",
        ),
        (
            "[tracing]\notlp_endpoint = \"http://c:4318/v1/traces\"\notlp_protocol = \"thrift\"\n",
            "line 3",
        ),
        (
            "[tracing]\notlp_endpoint = \"http://c:4318/v1/traces\"\nservice_name = \"\"\n",
            "tracing.service_name",
        ),
    ]
    .into_iter()
    .collect();
    for (toml, want) in cases {
        std::fs::write(&path, toml).unwrap();
        let out = std::process::Command::new(tollgate_bin())
            .arg("--config")
            .arg(&path)
            .arg("check")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml}");
        assert!(err.contains(want), "{toml}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_turns_traces_on_and_off() {
    let rx = Receiver::http().await;
    let up = upstream().await;
    let routes = route("api", "/api/", &up.url(), "");
    let off = config("backend = \"memory\"", &routes);
    let on = config(
        "backend = \"memory\"",
        &format!(
            "{}{routes}",
            tracing_section(&format!("http://{}/v1/traces", rx.addr), "")
        ),
    );
    let gw = gateway_env(&off, FAST_EXPORT);
    let c = client();
    let traced = |c: &reqwest::Client, url: String| {
        let c = c.clone();
        async move {
            let res = c
                .get(url)
                .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
        }
    };
    traced(&c, gw.url("/api/1")).await;
    // Off: the client's traceparent passes untouched, and nothing is exported.
    assert_eq!(
        up.seen()[0].headers["traceparent"],
        format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    );
    assert!(!gw.metrics().await.contains("tollgate_trace_"));

    gw.write_config(&on);
    let res = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
    traced(&c, gw.url("/api/2")).await;
    assert_eq!(
        rx.trace(CLIENT_TRACE, 2).await.len(),
        2,
        "on after the reload"
    );
    let (_, span, _) = parts(up.seen()[1].headers["traceparent"].to_str().unwrap());
    assert_ne!(span, CLIENT_SPAN);

    gw.write_config(&off);
    let res = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    traced(&c, gw.url("/api/3")).await;
    assert_eq!(
        up.seen()[2].headers["traceparent"],
        format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
        "off again"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rx.spans().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_span_names_the_consumer() {
    let rx = Receiver::http().await;
    let up = upstream().await;
    // acme's key is "demo-acme-key" (the example's; its overrides need the example's plans).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumers.toml");
    std::fs::write(
        &path,
        "[[consumer]]\nname = \"acme\"\nplan = \"gold\"\nkey_sha256 = \"a2fb8545fcd457204e9fee11be92013aa3240b1b146fe262ba608fdfc159041c\"\n",
    )
    .unwrap();
    let file = path.display();
    let cfg = config(
        "backend = \"memory\"",
        &format!(
            "{}[consumers]\nheader = \"X-Api-Key\"\nfile = \"{file}\"\n\n[[plans]]\nname = \"gold\"\n\n[[plans]]\nname = \"free\"\n\n{}",
            tracing_section(&format!("http://{}/v1/traces", rx.addr), ""),
            route("api", "/api/", &up.url(), "consumers = true")
        ),
    );
    let gw = gateway_env(&cfg, FAST_EXPORT);
    let res = client()
        .get(gw.url("/api/x"))
        .header("x-api-key", "demo-acme-key")
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{}", gw.logs());
    let spans = rx.trace(CLIENT_TRACE, 2).await;
    let request = spans
        .iter()
        .find(|g| g.span.kind == SpanKind::Server as i32)
        .expect("a request span");
    assert_eq!(request.attr("tollgate.consumer").as_deref(), Some("acme"));
}
