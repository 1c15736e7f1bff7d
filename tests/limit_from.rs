//! #38 §3, limits set by the caller's identity: `limit_from = "jwt:CLAIM" | "header:NAME"` with
//! `limit_max`, through the binary on every store. A bad value gets the configured limit (never 0
//! or unlimited), a larger one `limit_max`; a header counts only from a trusted proxy; a caller's
//! count is kept under the limit it was decided by; the RateLimit fields and `/-/explain` say
//! the caller's limit.

mod support;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use support::*;

on_every_store!(
    a_trusted_header_sets_the_callers_limit,
    a_claim_sets_the_callers_limit,
);

const SECRET: &str = "a-test-secret-of-32-bytes-------";

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// A fixed window of 2 an hour per `x-user`, its limit from `x-tier-limit`, at most 5.
fn tiered(up: &Upstream) -> String {
    route("api", "/api", &up.url(), "")
        + &limit(
            "name = \"tiered\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:x-user\"\nlimit_from = \"header:x-tier-limit\"\nlimit_max = 5",
        )
}

/// How many requests of `user` (sending `tier`, when given) pass before the first 429 (at most
/// 10), and the `X-RateLimit-Limit` of the first answer.
async fn admitted(gw: &Gateway, user: &str, tier: &[&str]) -> (usize, String) {
    let c = client();
    let mut first = String::new();
    for n in 0..10 {
        let mut r = c.get(gw.url("/api/x")).header("x-user", user);
        for t in tier {
            r = r.header("x-tier-limit", *t);
        }
        let res = r.send().await.unwrap();
        if n == 0 {
            first = h(&res, "x-ratelimit-limit");
        }
        match res.status().as_u16() {
            200 => {}
            429 => return (n, first),
            s => panic!("unexpected {s}"),
        }
    }
    (10, first)
}

async fn a_trusted_header_sets_the_callers_limit(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let cfg = config(&env.store, &tiered(&up)).replacen(
        "[server]\n",
        "[server]\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
        1,
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    assert_eq!(admitted(&gw, "gold", &["4"]).await, (4, "4".into()));
    // The ceiling: no caller exceeds limit_max.
    assert_eq!(admitted(&gw, "greedy", &["100"]).await, (5, "5".into()));
    // Absent, or not a positive integer: the configured limit — never 0, never unlimited.
    assert_eq!(admitted(&gw, "none", &[]).await, (2, "2".into()));
    for (i, bad) in [
        "-1",
        "0",
        "1e309",
        "0x10",
        "3.0",
        "12345678901234567890",
        "[4]",
        " ",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(
            admitted(&gw, &format!("bad{i}"), &[bad]).await,
            (2, "2".into()),
            "{bad:?}"
        );
    }
    // Sent twice: which one counts is unclear, so neither does.
    assert_eq!(admitted(&gw, "twice", &["4", "5"]).await, (2, "2".into()));
    // The RateLimit fields carry the caller's quota.
    let res = client()
        .get(gw.url("/api/x"))
        .header("x-user", "policy")
        .header("x-tier-limit", "3")
        .send()
        .await
        .unwrap();
    assert!(
        h(&res, "ratelimit-policy").starts_with("\"tiered\";q=3;w=3600"),
        "{:?}",
        res.headers()
    );
    // A value that changes mid-window starts a count of its own (keys include the limit): gold
    // used its 4 under "4"; under "3" it has 3, and back under "4" none.
    assert_eq!(admitted(&gw, "gold", &["3"]).await.0, 3);
    assert_eq!(admitted(&gw, "gold", &["4"]).await.0, 0);
    // /-/explain says the caller's limit.
    let v: Value = client()
        .get(gw.admin_url("/-/explain?method=GET&path=/api/x&ip=127.0.0.1&header.x-user=someone&header.x-tier-limit=5"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v.to_string().contains("\"limit\":5"), "{v}");

    // From a peer that is not a trusted proxy the header is ignored: the default applies.
    let env2 = store_env(kind);
    let cfg = config(&env2.store, &tiered(&up)).replacen(
        "[server]\n",
        "[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
        1,
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    assert_eq!(admitted(&gw, "gold", &["4"]).await, (2, "2".into()));
}

async fn a_claim_sets_the_callers_limit(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let top = "[jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET\"\nalgorithms = [\"HS256\"]\n";
    let routes = route("api", "/api", &up.url(), "jwt = \"required\"")
        + &limit(
            "name = \"per-user\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"jwt:sub\"\nlimit_from = \"jwt:plan.rpm\"\nlimit_max = 6",
        );
    let gw = gateway_env(
        &config(&env.store, &format!("{top}\n{routes}")),
        &[("TOLLGATE_TEST_JWT_SECRET", SECRET)],
    );
    wait_ready(&gw).await;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let count = |sub: &'static str, rpm: Value| {
        let token = encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": sub, "exp": exp, "plan": {"rpm": rpm}}),
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        let gw = &gw;
        async move {
            let c = client();
            for n in 0..10 {
                let res = c
                    .get(gw.url("/api/x"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .unwrap();
                if res.status() == 429 {
                    return n;
                }
                assert_eq!(res.status(), 200);
            }
            10
        }
    };
    assert_eq!(count("a", json!(4)).await, 4);
    assert_eq!(count("b", json!("5")).await, 5);
    assert_eq!(count("c", json!(1000)).await, 6);
    for (sub, bad) in [
        ("d", json!(-1)),
        ("e", json!(0)),
        ("f", json!(1.5)),
        ("g", json!([4])),
        ("h", json!("0x10")),
        ("i", json!(null)),
        ("j", json!({"n": 4})),
        ("k", json!(u64::MAX)),
    ] {
        let got = count(sub, bad.clone()).await;
        // u64::MAX is a positive integer: the ceiling.
        let want = if sub == "k" { 6 } else { 2 };
        assert_eq!(got, want, "{bad}");
    }
}
