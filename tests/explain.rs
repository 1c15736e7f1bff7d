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
