//! Token limits for LLM APIs (issue #26): `cost_from` reads the cost from the response body —
//! a JSON body's `usage`, the last event of an event stream that carries it, a trailer — with
//! weights, charged when the body ends, on every store; the body streams through unchanged.
//! The upstream is the example OpenAI-compatible one (`examples/llm/mod.rs`).

mod support;

#[path = "../examples/llm/mod.rs"]
mod llm;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::*;

/// Starts the example chat upstream on 127.0.0.1:0.
async fn llm_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service_fn(llm::chat))
                    .await;
            });
        }
    });
    addr
}

/// A gateway on `kind` with one route `/v1` to the chat upstream and `limits` (TOML tables).
async fn gateway_with(kind: Kind, limits: &str) -> (Gateway, StoreEnv) {
    let up = llm_upstream().await;
    let env = store_env(kind);
    let gw = gateway(&config(
        &env.store,
        &(route("chat", "/v1", &format!("http://{up}"), "") + limits),
    ));
    wait_ready(&gw).await;
    (gw, env)
}

fn ask(words: usize, max_tokens: u64, stream: bool, usage: bool) -> String {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": vec!["w"; words].join(" ")}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": usage},
    })
    .to_string()
}

async fn post(c: &reqwest::Client, gw: &Gateway, body: String) -> (u16, String) {
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .header("x-api-key", "k1")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// The metrics once `limit`'s `outcome` count reaches `want` (a body's charge is made when
/// the gateway sees the body end, which may be just after the client has read it all), or
/// after 5 s, whatever they say then.
async fn metrics_once(gw: &Gateway, limit: &str, outcome: &str, want: f64) -> String {
    let t0 = Instant::now();
    loop {
        let m = gw.metrics().await;
        if cost_source(&m, limit, outcome) >= want || t0.elapsed() > Duration::from_secs(5) {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn cost_source(m: &str, limit: &str, outcome: &str) -> f64 {
    metric_sum(
        m,
        "tollgate_ratelimit_cost_source_total",
        &[
            &format!("limit=\"{limit}\""),
            &format!("outcome=\"{outcome}\""),
        ],
    )
}

/// `usage.total_tokens` of a JSON body: 40 tokens a request against 100 a minute — the fourth
/// request finds the limit spent (charged one unit each, it would pass).
async fn json_body_usage_is_charged(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\ncost_from = \"json:usage.total_tokens\""),
    )
    .await;
    let c = client();
    for i in 0..3 {
        let (status, body) = post(&c, &gw, ask(10, 30, false, false)).await;
        assert_eq!(status, 200, "request {i}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["usage"]["total_tokens"], 40, "the body arrives unchanged");
    }
    let (status, body) = post(&c, &gw, ask(10, 30, false, false)).await;
    assert_eq!(
        status, 429,
        "40 + 40 + 40 (clamped at 100) spent the limit: {body}"
    );
    let m = gw.metrics().await;
    assert_eq!(cost_source(&m, "tokens", "found"), 3.0, "{m}");
    assert_eq!(decisions(&m, "chat", "tokens", "charged_after"), Some(3.0));
}

/// An event stream's last event with `usage`, weighted: 2 prompt words + 4 × 5 completion
/// tokens = 22 a request against 50; every event reaches the client.
async fn stream_usage_is_charged_weighted(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"token_bucket\"\nlimit = 50\nperiod = \"1h\"\nsubject = \"header:x-api-key\"\ncost_from = [{ path = \"json:usage.prompt_tokens\", weight = 1 }, { path = \"json:usage.completion_tokens\", weight = 4 }]"),
    )
    .await;
    let c = client();
    for i in 0..3 {
        let (status, body) = post(&c, &gw, ask(2, 5, true, true)).await;
        assert_eq!(status, 200, "request {i}: {body}");
        assert_eq!(
            body.matches("data: ").count(),
            7,
            "5 tokens, usage, [DONE]: {body}"
        );
        assert!(body.ends_with("data: [DONE]\n\n"));
    }
    let (status, _) = post(&c, &gw, ask(2, 5, true, true)).await;
    assert_eq!(status, 429, "22 + 22 + 22 (clamped at 50) spent the bucket");
    assert_eq!(cost_source(&gw.metrics().await, "tokens", "found"), 3.0);
}

/// Without the field (a stream without `include_usage`) the limit's `cost` is charged; a body
/// that is not JSON is malformed, charged `cost` too.
async fn missing_and_malformed_usage_charge_cost(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 30\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\ncost = 10\ncost_from = \"json:usage.total_tokens\""),
    )
    .await;
    let c = client();
    let (status, _) = post(&c, &gw, ask(2, 5, true, false)).await;
    assert_eq!(status, 200);
    // The upstream answers a body that is not JSON with a JSON error without `usage`: missing.
    let (status, _) = post(&c, &gw, "not json".into()).await;
    assert_eq!(status, 400);
    let m = gw.metrics().await;
    assert_eq!(cost_source(&m, "tokens", "missing"), 2.0, "{m}");
    let (status, _) = post(&c, &gw, ask(2, 5, true, false)).await;
    assert_eq!(status, 200, "10 + 10 charged: 10 left");
    let (status, _) = post(&c, &gw, ask(2, 5, true, false)).await;
    assert_eq!(status, 429, "cost 10 each: 30 spent");
}

/// A client that leaves mid-stream: the upstream never reported usage, so the limit's `cost` is
/// charged (the tokens it had reported so far would be, from the last complete event).
async fn a_client_leaving_mid_stream_is_charged(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 30\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\ncost = 10\ncost_from = \"json:usage.total_tokens\""),
    )
    .await;
    let addr = gw
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let body = ask(2, 200, true, true);
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: k1\r\nx-event-delay-ms: 20\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(s); // gone after the first events
    let t0 = Instant::now();
    loop {
        let m = gw.metrics().await;
        if cost_source(&m, "tokens", "missing") == 1.0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never charged: {m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let c = client();
    // 10 charged for the abandoned stream: 12 more leaves 8, under the cost of 10.
    let (status, _) = post(&c, &gw, ask(2, 10, true, true)).await;
    assert_eq!(status, 200);
    let (status, _) = post(&c, &gw, ask(2, 10, true, true)).await;
    assert_eq!(
        status, 429,
        "10 (abandoned) + 12 charged: 8 left, under cost"
    );
}

on_every_store_and_cluster!(json_body_usage_is_charged);
on_every_store!(
    stream_usage_is_charged_weighted,
    missing_and_malformed_usage_charge_cost,
    a_client_leaving_mid_stream_is_charged
);

/// `tollgate check` names the key of a bad `cost_from`.
#[test]
fn bad_cost_from_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.toml");
    std::fs::write(
        &path,
        config(
            "backend = \"memory\"",
            &(route("chat", "/v1", "http://127.0.0.1:9", "")
                + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 30\nperiod = \"1m\"\nsubject = \"ip\"\ncost_from = [\"json:usage.total_tokens\", { path = \"xml:usage\" }]")),
        ),
    )
    .unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("routes[0].limits[0].cost_from[1].path"),
        "{err}"
    );
}

/// A trailer (`trailer:NAME`) of a chunked HTTP/1.1 response, and an event stream to an HTTP/2
/// client: both charged when the body ends.
async fn trailer_and_http2_are_charged(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &(limit("name = \"by-trailer\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\ncost_from = \"trailer:x-tokens-used\"")
            + &limit("name = \"by-body\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\ncost_from = \"json:usage.total_tokens\"")),
    )
    .await;
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for (i, c) in [client(), h2].iter().enumerate() {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .header("x-api-key", "k1")
            .header("te", "trailers")
            .header("x-usage-trailer", "x-tokens-used")
            .body(ask(10, 20, true, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body = r.text().await.unwrap();
        assert_eq!(body.matches("data: ").count(), 22, "client {i}");
    }
    metrics_once(&gw, "by-body", "found", 2.0).await;
    let m = metrics_once(&gw, "by-trailer", "found", 2.0).await;
    assert_eq!(cost_source(&m, "by-body", "found"), 2.0, "{m}");
    assert_eq!(cost_source(&m, "by-trailer", "found"), 2.0, "{m}");
    // by-body: 30 + 30 charged; two more fit (90, then 10 left: clamped at 100), then spent.
    for want in [200, 200, 429] {
        let (status, _) = post(&client(), &gw, ask(10, 20, false, false)).await;
        assert_eq!(status, want);
    }
}

on_every_store!(trailer_and_http2_are_charged);

/// `reserve`: 50 units taken when a request is admitted, settled to its real cost (10) after:
/// six requests fit in 100 (each needs 50 left; 40 of each reservation go back), the seventh
/// finds 40 left. Without the give-back two would fit; without a reservation, ten.
async fn a_reservation_is_settled_to_the_real_cost(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\nreserve = 50\ncost_from = \"json:usage.total_tokens\""),
    )
    .await;
    let c = client();
    for i in 0..6 {
        let (status, body) = post(&c, &gw, ask(2, 8, false, false)).await;
        assert_eq!(status, 200, "request {i}: {body}");
    }
    let (status, _) = post(&c, &gw, ask(2, 8, false, false)).await;
    assert_eq!(status, 429, "60 used: 40 left, under the reservation of 50");
}

/// POSTs `body` as API key `key` to the example upstream, which sends its events `delay_ms`
/// apart; the status, once the whole stream is read.
async fn streamed(c: &reqwest::Client, url: &str, key: &str, delay_ms: u32, body: String) -> u16 {
    let r = c
        .post(url)
        .header("x-api-key", key)
        .header("x-event-delay-ms", delay_ms.to_string())
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let _ = r.text().await;
    status
}

/// A burst of concurrent requests cannot all pass a budget that holds two reservations: with
/// `reserve = 40` of 100, two of five concurrent streams are admitted; once they end, their
/// real cost (6 each) is all that is spent.
async fn reservations_bound_a_concurrent_burst(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1h\"\nsubject = \"header:x-api-key\"\nreserve = 40\ncost_from = \"json:usage.total_tokens\""),
    )
    .await;
    let c = client();
    let calls = (0..5).map(|_| {
        let (c, url) = (c.clone(), gw.url("/v1/chat/completions"));
        tokio::spawn(async move { streamed(&c, &url, "k1", 100, ask(2, 4, true, true)).await })
    });
    let mut statuses = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        statuses.push(call.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, vec![200, 200, 429, 429, 429]);
    // 2 × 6 spent: 88 left, two reservations fit again.
    for _ in 0..2 {
        let (status, _) = post(&c, &gw, ask(2, 4, false, false)).await;
        assert_eq!(status, 200);
    }
}

on_every_store!(
    a_reservation_is_settled_to_the_real_cost,
    reservations_bound_a_concurrent_burst
);

// ---------------------------------------------------------------------------------------------
// Per-model limits and reservations read from the request body (issue #26 items 2 and 3).
// ---------------------------------------------------------------------------------------------

/// What the chat upstream received of one request: its head and its body's bytes.
#[derive(Clone)]
struct Received {
    headers: http::HeaderMap,
    body: bytes::Bytes,
}

/// The example chat upstream behind a recorder of every request's head and body bytes.
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<Received>>>) {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let record = record.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = match body.collect().await {
                            Ok(b) => b.to_bytes(),
                            Err(_) => bytes::Bytes::from_static(b"(cut)"),
                        };
                        record.lock().unwrap().push(Received {
                            headers: parts.headers.clone(),
                            body: body.clone(),
                        });
                        llm::chat(hyper::Request::from_parts(parts, Full::new(body))).await
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A consumers file with one consumer, `acme` on plan `p`, key `k1`.
fn consumers_file(dir: &std::path::Path) -> String {
    let path = dir.join("consumers.toml");
    std::fs::write(
        &path,
        format!(
            "[[consumer]]\nname = \"acme\"\nplan = \"p\"\nkey_sha256 = \"{}\"\n",
            tollgate::consumers::hex(&tollgate::consumers::hash_key(b"k1"))
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn chat(model: serde_json::Value, words: usize, max_tokens: u64) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": vec!["w"; words].join(" ")}],
        "max_tokens": max_tokens,
    })
    .to_string()
}

/// Per-model budgets, the worked example: a plan of 100 tokens a minute per consumer
/// *and model* (`subject = ["json:model"]` on a plan's limit), weighted output tokens. Two
/// models of one consumer have separate budgets: the third request for a spent model is 429
/// while the other model still passes. A model that is not a string, or none, is refused with
/// 400 (`on_missing = "reject"`) and charges nothing.
async fn per_model_budgets(kind: Kind) {
    let up = llm_upstream().await;
    let env = store_env(kind);
    let dir = tempfile::tempdir().unwrap();
    let plans = format!(
        "[consumers]\nheader = \"x-api-key\"\nfile = \"{}\"\n\n[[plans]]\nname = \"p\"\n[[plans.limits]]\nname = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\nsubject = [\"json:model\"]\non_missing = \"reject\"\ncost_from = [{{ path = \"json:usage.prompt_tokens\", weight = 1 }}, {{ path = \"json:usage.completion_tokens\", weight = 4 }}]\n\n",
        consumers_file(dir.path())
    );
    let gw = gateway(&config(
        &env.store,
        &(plans + &route("chat", "/v1", &format!("http://{up}"), "consumers = true")),
    ));
    wait_ready(&gw).await;
    let c = client();
    // 10 prompt words + 4 × 10 completion tokens = 50 a request: two spend a model's 100.
    for (i, model) in ["model-a", "model-a"].iter().enumerate() {
        let (status, body) = post(&c, &gw, chat((*model).into(), 10, 10)).await;
        assert_eq!(status, 200, "request {i}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["model"], *model,
            "the body reaches the upstream unchanged"
        );
    }
    let (status, body) = post(&c, &gw, chat("model-a".into(), 10, 10)).await;
    assert_eq!(status, 429, "model-a's 100 are spent: {body}");
    assert!(body.contains("\"tokens\""), "{body}");
    // Bad input: 400, naming the field, nothing charged.
    for bad in [
        chat(7.into(), 1, 1),
        chat(serde_json::Value::Null, 1, 1),
        chat("".into(), 1, 1),
        "{\"messages\": []}".to_owned(),
        "not json".to_owned(),
    ] {
        let (status, body) = post(&c, &gw, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("json:model"), "{body}");
    }
    for i in 0..2 {
        let (status, body) = post(&c, &gw, chat("model-b".into(), 10, 10)).await;
        assert_eq!(status, 200, "model-b, request {i}: its own budget: {body}");
    }
    let (status, _) = post(&c, &gw, chat("model-b".into(), 10, 10)).await;
    assert_eq!(status, 429, "model-b's 100 are spent too");
    let m = gw.metrics().await;
    assert_eq!(cost_source(&m, "tokens", "found"), 4.0, "{m}");
    // `/-/top` shows the model hashed; `/-/explain` (which has no body) says so.
    let top = c
        .get(gw.admin_url("/-/top?route=chat&limit=tokens"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        top.contains("json:model") && !top.contains("model-a"),
        "{top}"
    );
    let r = c
        .get(gw.admin_url(
            "/-/explain?method=POST&path=/v1/chat/completions&ip=127.0.0.1&header.x-api-key=k1",
        ))
        .send()
        .await
        .unwrap();
    let (status, text) = (r.status().as_u16(), r.text().await.unwrap());
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("json:model") && text.contains("400"),
        "{text}"
    );
}

/// `reserve = "json:max_tokens"` capped by `reserve_max`: each request reserves what its body
/// asks for. Of five concurrent streams asking 35 tokens against 100, two are admitted (a third
/// reservation does not fit: without reservations all five would pass a budget with room for
/// one unit); each is settled to its real cost (2 prompt + 35 = 37) after its response.
/// Waits until the chat route's first limit has `remaining` left for API key `key`: a
/// settlement lands as its body ends, which may be just after the client read it all
/// (`/-/explain` reads the limit without charging it).
async fn settled(c: &reqwest::Client, gw: &Gateway, key: &str, remaining: u64) {
    let t0 = Instant::now();
    loop {
        let e: serde_json::Value = c
            .get(gw.admin_url(&format!(
                "/-/explain?method=POST&path=/v1/chat/completions&ip=127.0.0.1&header.x-api-key={key}"
            )))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if e["limits"][0]["remaining"] == remaining {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{key} never settled at {remaining}: {e}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn json_reservations_bound_a_burst(kind: Kind) {
    let (gw, _env) = gateway_with(
        kind,
        &limit("name = \"tokens\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1h\"\nsubject = \"header:x-api-key\"\nreserve = \"json:max_tokens\"\nreserve_max = 40\ncost_from = \"json:usage.total_tokens\""),
    )
    .await;
    let c = client();
    let burst = |key: &'static str, n: usize| {
        (0..n)
            .map(|_| {
                let (c, url) = (c.clone(), gw.url("/v1/chat/completions"));
                tokio::spawn(
                    async move { streamed(&c, &url, key, 20, ask(2, 35, true, true)).await },
                )
            })
            .collect::<Vec<_>>()
    };
    let mut statuses = Vec::new();
    for call in burst("k1", 5) {
        statuses.push(call.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, vec![200, 200, 429, 429, 429]);
    let send = |key: &'static str, max_tokens: u64| {
        let (c, url) = (c.clone(), gw.url("/v1/chat/completions"));
        async move {
            c.post(url)
                .header("x-api-key", key)
                .body(ask(2, max_tokens, false, false))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Settled: 2 × 37 spent, 26 left — a reservation of 30 does not fit, one of 20 does. A
    // stream's settlement lands as its body ends, which may be just after the client read it
    // all: wait for both (`/-/explain` reads the bucket without charging it).
    settled(&c, &gw, "k1", 26).await;
    assert_eq!(send("k1", 30).await, 429, "26 left, 30 asked");
    assert_eq!(send("k1", 20).await, 200, "26 left, 20 asked");
    // reserve_max caps what a body asks: 4000 reserves 40, admitted; its real cost (clamped to
    // the bucket) then spends it.
    assert_eq!(send("k2", 4000).await, 200, "capped at 40");
    settled(&c, &gw, "k2", 0).await;
    assert_eq!(
        send("k2", 1).await,
        429,
        "4002 charged: the bucket is spent"
    );
    // A body without the field reserves the limit's cost (1).
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .header("x-api-key", "k3")
        .body("{\"model\":\"m\",\"messages\":[]}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = metrics_once(&gw, "tokens", "found", 5.0).await;
    assert_eq!(cost_source(&m, "tokens", "found"), 5.0, "{m}");
}

on_every_store_and_cluster!(per_model_budgets, json_reservations_bound_a_burst);

/// Sends `raw` (a whole HTTP/1.1 request, or its start) and reads the answer until the
/// connection closes or `within` passes.
async fn raw_exchange(gw: &Gateway, raw: &[u8], within: Duration) -> String {
    let addr = gw
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Bad input through the binary, with the upstream recording what it receives: a model that is
/// not a string, a body that is not JSON and one larger than `max_json_bytes` are forwarded
/// whole, their model part missing (counted by address, apart from every model); a chunked
/// body is read and forwarded chunked; a client that stops mid-body gets 408; with
/// `on_missing = "reject"` a body without a usable model is 400 and never reaches the upstream.
#[tokio::test(flavor = "multi_thread")]
async fn bad_request_bodies_through_the_binary() {
    let (up, seen) = recording_upstream().await;
    let per_model = "name = \"per-model\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1m\"\nsubject = [\"header:x-api-key\", \"json:model\"]";
    let gw = gateway(
        &config(
            "backend = \"memory\"",
            &(route(
                "lax",
                "/v1",
                &format!("http://{up}"),
                "max_json_bytes = 1024",
            ) + &limit(per_model)
                + &route(
                    "strict",
                    "/v2",
                    &format!("http://{up}"),
                    "max_json_bytes = 1024",
                )
                + &limit(&format!("{per_model}\non_missing = \"reject\""))),
        )
        .replace("[admin]", "body_read_timeout = \"1s\"\n\n[admin]"),
    );
    wait_ready(&gw).await;
    let c = client();
    let send = |path: &'static str, key: &'static str, body: String| {
        let (c, url) = (c.clone(), gw.url(path));
        async move {
            let r = c
                .post(url)
                .header("x-api-key", key)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let last = || seen.lock().unwrap().last().cloned().unwrap();
    let count = || seen.lock().unwrap().len();

    // Exact bytes, Content-Length kept (escapes, non-ASCII, odd spacing).
    let exact = "{ \"model\" : \"caf\\u00e9-é\", \"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\"}] ,\"max_tokens\":1 }\n";
    let (status, _) = send("/v1/chat/completions", "kx", exact.to_owned()).await;
    assert_eq!(status, 200);
    let r = last();
    assert_eq!(r.body, exact.as_bytes());
    assert_eq!(
        r.headers.get("content-length").unwrap(),
        &exact.len().to_string()
    );
    assert!(r.headers.get("transfer-encoding").is_none());

    // Not a string, not JSON, too large: one bucket (the address in the model's place), apart
    // from every model's; each body forwarded whole.
    let big = chat("big".into(), 2000, 1);
    assert!(big.len() > 1024);
    for (i, body) in [chat(7.into(), 1, 1), "not json".to_owned()]
        .into_iter()
        .enumerate()
    {
        let (status, answer) = send("/v1/chat/completions", "k1", body.clone()).await;
        assert_ne!(status, 429, "{i}: {answer}");
        assert_eq!(last().body, body.as_bytes(), "{i}");
    }
    let (status, _) = send("/v1/chat/completions", "k1", big.clone()).await;
    assert_eq!(status, 429, "the missing-model bucket of k1 holds 2");
    let (status, _) = send("/v1/chat/completions", "k1", chat("big".into(), 1, 1)).await;
    assert_eq!(
        status, 200,
        "the model 'big' read from a small body: its own bucket"
    );
    let (status, _) = send("/v1/chat/completions", "k2", big.clone()).await;
    assert_eq!(
        status, 200,
        "a large body is forwarded (k2's own missing bucket)"
    );
    let r = last();
    assert_eq!(r.body, big.as_bytes(), "byte for byte");
    assert_eq!(
        r.headers.get("content-length").unwrap(),
        &big.len().to_string()
    );

    // Strict: 400 naming the field, the upstream not called, nothing charged.
    let before = count();
    for body in [
        chat(7.into(), 1, 1),
        "not json".to_owned(),
        big.clone(),
        "{}".to_owned(),
    ] {
        let (status, answer) = send("/v2/chat/completions", "k1", body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.contains("json:model"), "{answer}");
    }
    assert_eq!(count(), before, "never forwarded");
    for _ in 0..2 {
        let (status, _) = send("/v2/chat/completions", "k1", chat("m".into(), 1, 1)).await;
        assert_eq!(status, 200, "the 400s charged nothing");
    }

    // A chunked body: read for its model (strict admits it), forwarded chunked, same bytes.
    let body = chat("chunky".into(), 3, 1);
    let (a, b) = body.split_at(body.len() / 2);
    let raw = format!(
        "POST /v2/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: k1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let answer = raw_exchange(&gw, raw.as_bytes(), Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let r = last();
    assert_eq!(r.body, body.as_bytes());
    assert_eq!(
        r.headers.get("transfer-encoding").map(|v| v.as_bytes()),
        Some(&b"chunked"[..])
    );
    assert!(r.headers.get("content-length").is_none());

    // An HTTP/2 client's body: read, forwarded with the same bytes.
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let body = chat("h2-model".into(), 3, 1);
    let r = h2
        .post(gw.url("/v2/chat/completions"))
        .header("x-api-key", "k1")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(last().body, body.as_bytes());

    // A client that stops mid-body: 408 after body_read_timeout, no hang, nothing forwarded.
    let before = count();
    let t0 = Instant::now();
    let answer = raw_exchange(
        &gw,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: k9\r\ncontent-length: 100\r\n\r\n{\"model\":",
        Duration::from_secs(10),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(count(), before);
}

/// `tollgate check` names the key of a bad `max_json_bytes` and of a JSON reservation without
/// its `reserve_max`.
#[test]
fn bad_body_keys_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.toml");
    let tokens = "name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 30\nperiod = \"1m\"\nsubject = \"ip\"\ncost_from = \"json:usage.total_tokens\"";
    for (extra, lim, want) in [
        ("max_json_bytes = 0", tokens.to_owned(), "max_json_bytes"),
        (
            "",
            format!("{tokens}\nreserve = \"json:max_tokens\""),
            "routes[0].limits[0].reserve_max",
        ),
        (
            "",
            format!("{tokens}\nreserve = \"json:\"\nreserve_max = 10"),
            "routes[0].limits[0].reserve",
        ),
    ] {
        std::fs::write(
            &path,
            config(
                "backend = \"memory\"",
                &(route("chat", "/v1", "http://127.0.0.1:9", extra) + &limit(&lim)),
            ),
        )
        .unwrap();
        let out = std::process::Command::new(tollgate_bin())
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(want), "{want}: {err}");
    }
}
