//! `/-/explain` is the gateway's own evaluation, read (issue #35 §3): what it says the gateway
//! answers is what the gateway answers, and asking charges and counts nothing.

mod support;

use serde_json::Value;
use support::*;

const SECRET: &str = "a-test-secret-of-32-bytes-------";

async fn explain(gw: &Gateway, q: &str) -> (u16, Value) {
    let res = client()
        .get(gw.admin_url(&format!("/-/explain?{q}")))
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

/// A denied address without a token on a `jwt = "required"` route: the access lists come
/// before the token, so the gateway answers 403 — and explain says 403 (it said 401).
#[tokio::test(flavor = "multi_thread")]
async fn a_denied_address_without_a_token_is_403_in_explain_too() {
    let up = upstream().await;
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "jwt = \"required\"\ndeny = [\"127.0.0.1/32\"]",
    );
    let cfg = config("backend = \"memory\"", &format!("[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"\nalgorithms = [\"HS256\"]\n\n{routes}"));
    let gw = gateway_env(&cfg, &[("TOLLGATE_TEST_JWT_SECRET", SECRET)]);
    wait_ready(&gw).await;
    let real = client().get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(real.status(), 403);
    let (status, v) = explain(&gw, "path=/api/x&host=127.0.0.1&ip=127.0.0.1").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["route"], "api", "{v}");
    assert!(v["reason"].as_str().unwrap_or("").contains("403"), "{v}");
    assert_eq!(v["status"], 403, "{v}");
    // Another address is refused on its (missing) token, as the gateway would.
    let (_, v) = explain(&gw, "path=/api/x&host=127.0.0.1&ip=192.0.2.1").await;
    assert_eq!(v["status"], 401, "{v}");
}

/// Asking changes nothing admission counts: no limit charged or counted, no access denial or
/// refused token counted, no bad-token throttle started for the address asked about.
#[tokio::test(flavor = "multi_thread")]
async fn explain_counts_nothing_admission_counts() {
    let up = upstream().await;
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "jwt = \"required\"\ndeny = [\"192.0.2.66/32\"]",
    ) + &limit(
        "name = \"per-user\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"jwt:sub\"",
    );
    let cfg = config(
        "backend = \"memory\"",
        &format!("[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"\nalgorithms = [\"HS256\"]\nmax_bad_tokens = 2\n\n{routes}"),
    )
    .replacen("[server]\n", "[server]\ntrusted_proxies = [\"127.0.0.1/32\"]\n", 1);
    let gw = gateway_env(&cfg, &[("TOLLGATE_TEST_JWT_SECRET", SECRET)]);
    wait_ready(&gw).await;
    let good = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({"sub": "alice", "exp": 4_000_000_000u64}),
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    let before = gw.metrics().await;
    for _ in 0..5 {
        // A refused token, a denied address, a counted request: each explained, none counted.
        let (_, v) = explain(
            &gw,
            "path=/api/x&host=h&ip=203.0.113.5&header.Authorization=Bearer%20not.a.jwt",
        )
        .await;
        assert_eq!(v["status"], 401, "{v}");
        let (_, v) = explain(&gw, "path=/api/x&host=h&ip=192.0.2.66").await;
        assert_eq!(v["status"], 403, "{v}");
        let (_, v) = explain(
            &gw,
            &format!("path=/api/x&host=h&ip=203.0.113.5&header.Authorization=Bearer%20{good}"),
        )
        .await;
        assert_eq!(v["status"], Value::Null, "forwarded: {v}");
        assert_eq!(v["limits"][0]["remaining"], 2, "{v}");
    }
    let after = gw.metrics().await;
    for m in [
        "tollgate_jwt_rejected_total",
        "tollgate_access_denied_total",
        "tollgate_ratelimit_decisions_total",
    ] {
        assert_eq!(
            metric_sum(&before, m, &[]),
            metric_sum(&after, m, &[]),
            "{m} moved"
        );
    }
    // The address asked about with bad tokens is not throttled: its good token passes, twice
    // (the limit's two), then the limit refuses — as explain now says.
    let real = || {
        client()
            .get(gw.url("/api/x"))
            .header("x-forwarded-for", "203.0.113.5")
            .header("authorization", format!("Bearer {good}"))
            .send()
    };
    assert_eq!(real().await.unwrap().status(), 200);
    assert_eq!(real().await.unwrap().status(), 200);
    let (_, v) = explain(
        &gw,
        &format!("path=/api/x&host=h&ip=203.0.113.5&header.Authorization=Bearer%20{good}"),
    )
    .await;
    assert_eq!(
        (&v["status"], &v["limit"]),
        (&Value::from(429), &Value::from("per-user")),
        "{v}"
    );
    let res = real().await.unwrap();
    assert_eq!(res.status(), 429);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["limit"], "per-user");
}

/// What explain skipped before it was admission's own evaluation: the input check, a CORS
/// preflight, `max_body_size` — each answered as the gateway answers it.
#[tokio::test(flavor = "multi_thread")]
async fn explain_answers_the_input_check_preflights_and_body_sizes() {
    let up = upstream().await;
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "max_body_size = 100\n[routes.cors]\nallow_origins = [\"https://app.example\"]",
    ) + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    wait_ready(&gw).await;
    let c = client();
    let cases: [(&str, u16, reqwest::RequestBuilder); 3] = [
        (
            "path=/api/a%252fb&ip=127.0.0.1",
            400,
            c.get(gw.url("/api/a%2fb")),
        ),
        (
            "method=OPTIONS&path=/api/x&ip=127.0.0.1&header.Origin=https://app.example&header.Access-Control-Request-Method=POST",
            204,
            c.request(reqwest::Method::OPTIONS, gw.url("/api/x"))
                .header("origin", "https://app.example")
                .header("access-control-request-method", "POST"),
        ),
        (
            "method=POST&path=/api/x&ip=127.0.0.1&header.Content-Length=101",
            413,
            c.post(gw.url("/api/x")).body(vec![b'x'; 101]),
        ),
    ];
    for (q, want, req) in cases {
        let (_, v) = explain(&gw, q).await;
        assert_eq!(v["status"], want, "{q}: {v}");
        assert_eq!(req.send().await.unwrap().status(), want, "{q}");
    }
    // None of them was charged: the address has its five.
    let (_, v) = explain(&gw, "path=/api/x&ip=127.0.0.1").await;
    assert_eq!(v["limits"][0]["remaining"], 5, "{v}");
    assert_eq!(v["status"], Value::Null, "{v}");
}
