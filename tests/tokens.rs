//! Token limits for LLM APIs (issue #26): `cost_from` reads the cost from the response body —
//! a JSON body's `usage`, the last event of an event stream that carries it, a trailer — with
//! weights, charged when the body ends, on every store; the body streams through unchanged.
//! The upstream is the example OpenAI-compatible one (`examples/llm/mod.rs`).

mod support;

#[path = "../examples/llm/mod.rs"]
mod llm;

use std::net::SocketAddr;
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
    let m = gw.metrics().await;
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
        tokio::spawn(async move {
            let r = c
                .post(url)
                .header("x-api-key", "k1")
                .header("x-event-delay-ms", "100")
                .body(ask(2, 4, true, true))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let _ = r.text().await;
            status
        })
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
