//! #38 §5, the refusal's shape: `refusal = { status, body, content_type }` on a route or a limit
//! (the limit's wins), through the binary on both HTTP/1 fronts and every store: the status and
//! body change, the RateLimit fields and `Retry-After` stay, a gRPC client keeps its gRPC status.

mod support;

use support::*;

on_every_store!(
    a_limit_refusal_takes_its_own_status_and_body,
    the_route_refusal_applies_to_limits_without_their_own,
);

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

const FW: &str = "algorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\"";

async fn gw(kind: Kind, routes: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let gw = gateway(&config(&env.store, routes));
    wait_ready(&gw).await;
    (gw, env)
}

/// Spends `n` requests that pass.
async fn spend(c: &reqwest::Client, url: &str, n: usize) {
    for _ in 0..n {
        assert_eq!(c.get(url).send().await.unwrap().status(), 200);
    }
}

async fn a_limit_refusal_takes_its_own_status_and_body(kind: Kind) {
    let up = upstream().await;
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "refusal = { status = 429, body = \"route's\" }",
    ) + &limit(&format!(
        "name = \"per-ip\"\n{FW}\nrefusal = {{ status = 503, content_type = \"text/html\", body = \"\"\"\n<p>Slow down, $client_ip ($route, $$$limit):\nretry in $retry_after s, $remaining left. id=$request_id</p>\"\"\" }}"
    ));
    let (gw, _env) = gw(kind, &routes).await;
    let c = client();
    spend(&c, &gw.url("/api/x"), 2).await;
    let res = c.get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(res.status(), 503);
    let id = h(&res, "x-request-id");
    assert!(!id.is_empty());
    assert_eq!(h(&res, "content-type"), "text/html");
    let retry: u64 = h(&res, "retry-after").parse().unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");
    assert_eq!(h(&res, "x-ratelimit-limit"), "2");
    assert_eq!(h(&res, "x-ratelimit-remaining"), "0");
    assert!(
        h(&res, "ratelimit").starts_with("\"per-ip\";r=0;t="),
        "{:?}",
        res.headers()
    );
    assert!(!h(&res, "ratelimit-policy").is_empty());
    let body = res.text().await.unwrap();
    assert_eq!(
        body,
        format!("<p>Slow down, 127.0.0.1 (api, $2):\nretry in {retry} s, 0 left. id={id}</p>")
    );
    assert_eq!(up.hits(), 2);
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"api\",status=\"503\"}"),
        Some(1.0),
        "{m}"
    );
}

async fn the_route_refusal_applies_to_limits_without_their_own(kind: Kind) {
    let up = upstream().await;
    // The route's shape with no body: its status, the problem+json body.
    let routes = route("api", "/api", &up.url(), "refusal = { status = 503 }")
        + &limit(&format!("name = \"per-ip\"\n{FW}"))
        + &route("plain", "/plain", &up.url(), "")
        + &limit(&format!("name = \"per-ip\"\n{FW}"));
    let (gw, _env) = gw(kind, &routes).await;
    let c = client();
    spend(&c, &gw.url("/api/x"), 2).await;
    let res = c.get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(h(&res, "content-type"), "application/problem+json");
    assert!(!h(&res, "retry-after").is_empty());
    assert_eq!(h(&res, "x-ratelimit-remaining"), "0");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 503);
    assert_eq!(body["limit"], "per-ip");
    // A route without one keeps the 429 problem+json.
    spend(&c, &gw.url("/plain/x"), 2).await;
    let res = c.get(gw.url("/plain/x")).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "content-type"), "application/problem+json");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 429);
}

/// A gRPC request keeps its gRPC answer (trailers-only, `grpc-status: 8`, no body) whatever the
/// refusal's status and body, with the rate-limit headers.
#[tokio::test(flavor = "multi_thread")]
async fn a_grpc_request_keeps_its_grpc_status() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit(&format!(
            "name = \"per-ip\"\n{FW}\nrefusal = {{ status = 503, body = \"go away\" }}"
        ));
    let (gw, _env) = gw(Kind::Memory, &routes).await;
    let c = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let call = || {
        c.post(gw.url("/api/test.Echo/Unary"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(vec![0u8, 0, 0, 0, 0])
            .send()
    };
    for _ in 0..2 {
        call().await.unwrap();
    }
    let res = call().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "grpc-status"), "8");
    assert_eq!(h(&res, "content-type"), "application/grpc");
    assert!(!h(&res, "retry-after").is_empty());
    assert!(
        h(&res, "ratelimit").contains("per-ip"),
        "{:?}",
        res.headers()
    );
    assert!(res.bytes().await.unwrap().is_empty());
}
