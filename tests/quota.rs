//! Running an API business (issue #28) through the real binary, on every store: the admin API's
//! tokens, usage for callers and support, quota reset and grant, per-consumer overrides and
//! billing-day quotas.

mod support;

use support::*;
use tollgate::consumers::{hash_key, hex};

on_every_store_and_cluster!(
    the_admin_api_needs_a_token_when_a_token_file_is_set,
    a_caller_and_support_see_the_same_usage_charging_nothing,
    reset_and_grant_give_a_consumer_its_quota_back,
    a_grant_adds_units_beyond_the_quota_in_the_current_window,
    a_grant_racing_requests_loses_no_update,
    a_consumer_overrides_its_plans_numbers,
    a_billing_day_moves_a_consumers_month,
    watch_config_reloads_on_a_kubernetes_configmap_swap,
    usage_reset_and_grant_act_on_each_key_of_a_compound_subject,
);

const ADMIN_TOKEN: &str = "admin-s3cret";

/// Files the gateway's config names (consumers file, token file), in a directory of their own.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.path(name), text).unwrap();
        self.path(name)
    }

    /// A token file admitting [`ADMIN_TOKEN`].
    fn tokens(&self) -> String {
        self.write(
            "admin-tokens",
            &format!("# support\n\n{}\n", hex(&hash_key(ADMIN_TOKEN.as_bytes()))),
        )
    }

    /// A consumers file of (name, plan, key, extra lines) entries.
    fn consumers(&self, entries: &[(&str, &str, &str, &str)]) -> String {
        let text: String = entries
            .iter()
            .map(|(name, plan, key, extra)| {
                format!(
                    "[[consumer]]\nname = \"{name}\"\nplan = \"{plan}\"\nkey_sha256 = \"{}\"\n{extra}\n",
                    hex(&hash_key(key.as_bytes()))
                )
            })
            .collect();
        self.write("consumers.toml", &text)
    }
}

/// The harness's config with `admin` lines added to `[admin]`.
fn config_with_admin(store: &str, admin: &str, rest: &str) -> String {
    config(store, rest).replacen(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\n{admin}\n"),
        1,
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn the_admin_api_needs_a_token_when_a_token_file_is_set(kind: Kind) {
    let up = upstream().await;
    let files = Files::new();
    let tokens = files.tokens();
    let env = store_env(kind);
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"");
    let gw = gateway(&config_with_admin(
        &env.store,
        &format!("token_file = \"{tokens}\""),
        &routes,
    ));
    wait_ready(&gw).await;
    let c = client();

    // Probes and scrapers carry no token.
    for open in ["/healthz", "/readyz", "/metrics"] {
        let r = c.get(gw.admin_url(open)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{open}");
    }
    // Every protected endpoint: no token, a wrong one, another scheme: 401.
    let protected = [
        ("POST", "/-/reload"),
        ("GET", "/-/explain?path=/api/x&ip=10.0.0.1"),
        ("GET", "/-/top"),
        ("GET", "/-/usage?consumer=acme"),
        ("POST", "/-/quota/reset"),
        ("POST", "/-/quota/grant"),
        ("POST", "/-/cache/purge"),
    ];
    let mut refused = 0.0;
    for (method, path) in protected {
        for auth in [
            None,
            Some(bearer("wrong")),
            Some(format!("Basic {ADMIN_TOKEN}")),
        ] {
            let mut r = c.request(method.parse().unwrap(), gw.admin_url(path));
            if let Some(a) = &auth {
                r = r.header("authorization", a);
            }
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            assert_eq!(
                r.headers()["www-authenticate"],
                "Bearer realm=\"tollgate-admin\""
            );
            refused += 1.0;
        }
    }
    // The token opens them.
    let r = c
        .post(gw.admin_url("/-/reload"))
        .header("authorization", bearer(ADMIN_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for path in ["/-/explain?path=/api/x&ip=10.0.0.1", "/-/top"] {
        let r = c
            .get(gw.admin_url(path))
            .header("authorization", bearer(ADMIN_TOKEN))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let r = c
        .post(gw.admin_url("/-/cache/purge"))
        .header("authorization", bearer(ADMIN_TOKEN))
        .body(r#"{"prefix":"/"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), r#"{"purged":0}"#);
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_admin_unauthorized_total"),
        Some(refused)
    );
    assert_eq!(
        metric(&m, "tollgate_config_reloads_total{result=\"success\"}"),
        Some(1.0),
        "no reload ran without the token"
    );

    // `protect_reads = false`: the reads open, reloads still need the token. A reload also
    // reads the token file afresh: the old token stops working.
    gw.write_config(&config_with_admin(
        &env.store,
        &format!("token_file = \"{tokens}\"\nprotect_reads = false"),
        &routes,
    ));
    let r = c
        .post(gw.admin_url("/-/reload"))
        .header("authorization", bearer(ADMIN_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c.get(gw.admin_url("/-/top")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    std::fs::write(&tokens, format!("{}\n", hex(&hash_key(b"rotated")))).unwrap();
    let r = c
        .post(gw.admin_url("/-/reload"))
        .header("authorization", bearer(ADMIN_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(gw.admin_url("/-/reload"))
        .header("authorization", bearer(ADMIN_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the rotated-out token still works");
    let r = c
        .post(gw.admin_url("/-/reload"))
        .header("authorization", bearer("rotated"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A malformed token file is refused with its path and line: by a reload (the previous
    // tokens stay) and by `tollgate check`.
    std::fs::write(&tokens, "# ops\nnot-a-sha256\n").unwrap();
    let r = c
        .post(gw.admin_url("/-/reload"))
        .header("authorization", bearer("rotated"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("admin-tokens") && text.contains("line 2"),
        "{text}"
    );
    let out = std::process::Command::new(tollgate_bin())
        .arg("check")
        .arg("--config")
        .arg(&gw.config_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("admin-tokens") && err.contains("line 2") && err.contains("admin.token_file"),
        "{err}"
    );
}

/// A non-loopback admin listener without a token file is warned about at start (and by
/// `tollgate check`); with a token file, or on loopback, it is not.
#[tokio::test]
async fn an_open_admin_listener_off_loopback_is_warned_about() {
    let up = upstream().await;
    let files = Files::new();
    let tokens = files.tokens();
    let routes = route("api", "/api", &up.url(), "");
    let open = config("backend = \"memory\"", &routes).replacen(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        "[admin]\nlisten = \"0.0.0.0:0\"",
        1,
    );
    let gw = gateway(&open);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !gw.logs().contains("not loopback") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(gw.logs().contains("not loopback"), "{}", gw.logs());
    let out = std::process::Command::new(tollgate_bin())
        .arg("check")
        .arg("--config")
        .arg(&gw.config_path)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not loopback"));
    drop(gw);

    for (admin, why) in [
        (
            format!("[admin]\nlisten = \"0.0.0.0:0\"\ntoken_file = \"{tokens}\""),
            "with a token file",
        ),
        (
            "[admin]\nlisten = \"127.0.0.1:0\"".to_owned(),
            "on loopback",
        ),
    ] {
        let cfg = config("backend = \"memory\"", &routes).replacen(
            "[admin]\nlisten = \"127.0.0.1:0\"",
            &admin,
            1,
        );
        let gw = gateway(&cfg);
        wait_ready(&gw).await;
        assert!(!gw.logs().contains("not loopback"), "{why}: {}", gw.logs());
    }
}

/// `[consumers]` reading `X-Api-Key` from `file`, then `plans` verbatim.
fn consumers_toml(file: &str, plans: &str) -> String {
    format!("[consumers]\nheader = \"X-Api-Key\"\nfile = \"{file}\"\n\n{plans}\n")
}

/// Plan `gold`: 1000 a calendar month across the API, 10 an hour per route.
const GOLD: &str = r#"
[[plans]]
name = "gold"
[[plans.limits]]
name = "monthly"
algorithm = "fixed_window"
limit = 1000
calendar = "month"
[[plans.limits]]
name = "hourly"
algorithm = "fixed_window"
limit = 10
period = "1h"
scope = "route"
"#;

/// A gateway config on `store` with the consumers file `file` under `plans` and one route
/// `api` (`/api`, consumers on) to `upstream`.
fn api_config(store: &str, file: &str, plans: &str, upstream: &str) -> String {
    let routes = route("api", "/api", upstream, "consumers = true");
    config(store, &(consumers_toml(file, plans) + &routes))
}

async fn get_key(c: &reqwest::Client, url: &str, key: Option<&str>) -> reqwest::Response {
    let mut r = c.get(url);
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.send().await.unwrap()
}

/// The usage body without `reset_seconds` (which counts down between two asks), after checking
/// each is within the limit's window.
fn settled(mut v: serde_json::Value) -> serde_json::Value {
    for l in v["limits"].as_array_mut().unwrap() {
        let reset = l["reset_seconds"].as_u64().unwrap();
        let window = l["window_seconds"].as_u64().unwrap();
        assert!(reset > 0 && reset <= window.max(31 * 86_400), "{l}");
        l.as_object_mut().unwrap().remove("reset_seconds");
    }
    v
}

async fn a_caller_and_support_see_the_same_usage_charging_nothing(kind: Kind) {
    let up = upstream().await;
    let files = Files::new();
    let file = files.consumers(&[
        ("acme", "gold", "k-acme", ""),
        ("globex", "gold", "k-globex", ""),
    ]);
    let routes = route("api", "/api", &up.url(), "consumers = true")
        + &route("search", "/search", &up.url(), "consumers = true")
        + "[[routes]]\nname = \"usage\"\npath_prefix = \"/v1/usage\"\nusage = true\nconsumers = true\n"
        + &limit("name = \"polls\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"ip\"");
    let env = store_env(kind);
    let gw = gateway(&config(
        &env.store,
        &(consumers_toml(&file, GOLD) + &routes),
    ));
    wait_ready(&gw).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(
            get_key(&c, &gw.url("/api/x"), Some("k-acme"))
                .await
                .status(),
            200
        );
    }
    for _ in 0..2 {
        assert_eq!(
            get_key(&c, &gw.url("/search"), Some("k-acme"))
                .await
                .status(),
            200
        );
    }

    let r = get_key(&c, &gw.url("/v1/usage"), Some("k-acme")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["cache-control"], "no-store");
    let body: serde_json::Value = r.json().await.unwrap();
    let want = serde_json::json!({
        "consumer": "acme",
        "plan": "gold",
        "limits": [
            {"name": "monthly", "limit": 1000, "remaining": 995, "window_seconds": 2_592_000},
            {"name": "hourly", "route": "api", "limit": 10, "remaining": 7, "window_seconds": 3600},
            {"name": "hourly", "route": "search", "limit": 10, "remaining": 8, "window_seconds": 3600},
        ],
    });
    assert_eq!(settled(body), want);
    // Asking charged nothing: the same again, and the same from the admin API.
    let again: serde_json::Value = get_key(&c, &gw.url("/v1/usage"), Some("k-acme"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(settled(again), want);
    let r = c
        .get(gw.admin_url("/-/usage?consumer=acme"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(settled(r.json().await.unwrap()), want);
    // Another consumer of the plan has its own counts.
    let r = c
        .get(gw.admin_url("/-/usage?consumer=globex"))
        .send()
        .await
        .unwrap();
    let g = settled(r.json().await.unwrap());
    assert_eq!(g["consumer"], "globex");
    let left: Vec<u64> = g["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(left, [1000, 10, 10]);
    // No key: 401 as on any consumers route (after the route's own limits: a third poll).
    assert_eq!(get_key(&c, &gw.url("/v1/usage"), None).await.status(), 401);
    // The usage route is never forwarded, and its own limit throttles polling (3 an hour).
    assert_eq!(up.hits(), 5);
    assert_eq!(
        get_key(&c, &gw.url("/v1/usage"), Some("k-acme"))
            .await
            .status(),
        429
    );
    // The admin API: an unknown consumer is 404, no consumer 400.
    let r = c
        .get(gw.admin_url("/-/usage?consumer=nobody"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("nobody"));
    let r = c.get(gw.admin_url("/-/usage")).send().await.unwrap();
    assert_eq!(r.status(), 400);
}

/// One plan per algorithm (each limit counts 3 units over a long period, so nothing refills
/// during a test), a consumer on each, and plans whose limits refuse a grant.
const PLANS: &str = r#"
[[plans]]
name = "calendar"
[[plans.limits]]
name = "monthly"
algorithm = "fixed_window"
limit = 3
calendar = "month"

[[plans]]
name = "window"
[[plans.limits]]
name = "sliding"
algorithm = "sliding_window"
limit = 3
period = "8760h"
scope = "route"

[[plans]]
name = "bucket"
[[plans.limits]]
name = "tokens"
algorithm = "token_bucket"
limit = 3
period = "8760h"
burst = 3

[[plans]]
name = "cell"
[[plans.limits]]
name = "gcra"
algorithm = "gcra"
limit = 3
period = "8760h"
burst = 3
scope = "route"

[[plans]]
name = "log"
[[plans.limits]]
name = "log"
algorithm = "sliding_log"
limit = 3
period = "8760h"

[[plans]]
name = "inflight"
[[plans.limits]]
name = "inflight"
algorithm = "concurrency"
limit = 3
period = "1m"
"#;

async fn post(
    c: &reqwest::Client,
    gw: &Gateway,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let r = c
        .post(gw.admin_url(path))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// How many requests with `key` are admitted before the first 429 (at most `max`).
async fn admitted(c: &reqwest::Client, url: &str, key: &str, max: usize) -> usize {
    for n in 0..max {
        let s = get_key(c, url, Some(key)).await.status();
        if s == 429 {
            return n;
        }
        assert_eq!(s, 200);
    }
    max
}

async fn reset_and_grant_give_a_consumer_its_quota_back(kind: Kind) {
    let up = upstream().await;
    let files = Files::new();
    let file = files.consumers(&[
        ("acme", "calendar", "k-cal", ""),
        ("wave", "window", "k-sw", ""),
        ("tank", "bucket", "k-tb", ""),
        ("cell", "cell", "k-gcra", ""),
        ("logan", "log", "k-log", ""),
        ("busy", "inflight", "k-cc", ""),
    ]);
    let env = store_env(kind);
    let gw = gateway(&api_config(&env.store, &file, PLANS, &up.url()));
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");

    for (consumer, key, limit, route) in [
        ("acme", "k-cal", "monthly", None),
        ("wave", "k-sw", "sliding", Some("api")),
        ("tank", "k-tb", "tokens", None),
        ("cell", "k-gcra", "gcra", Some("api")),
    ] {
        let which = match route {
            Some(r) => {
                format!("\"consumer\":\"{consumer}\",\"limit\":\"{limit}\",\"route\":\"{r}\"")
            }
            None => format!("\"consumer\":\"{consumer}\",\"limit\":\"{limit}\""),
        };
        assert_eq!(admitted(&c, &url, key, 10).await, 3, "{limit}");
        // Two units back: exactly two more requests.
        let (status, body) = post(
            &c,
            &gw,
            "/-/quota/grant",
            &format!("{{{which},\"units\":2}}"),
        )
        .await;
        assert_eq!(status, 200, "{limit}: {body}");
        assert_eq!(body["action"], "grant");
        assert_eq!(body["units"], 2);
        assert_eq!(body["limit"]["remaining"], 2, "{limit}: {body}");
        assert_eq!(admitted(&c, &url, key, 10).await, 2, "{limit}");
        // All 3 used again, 3 granted: exactly 3 more (beyond: see the next scenario).
        let (status, body) = post(
            &c,
            &gw,
            "/-/quota/grant",
            &format!("{{{which},\"units\":3}}"),
        )
        .await;
        assert_eq!(
            (status, &body["limit"]["remaining"]),
            (200, &serde_json::json!(3)),
            "{limit}"
        );
        assert_eq!(admitted(&c, &url, key, 10).await, 3, "{limit}");
        // A reset: fresh.
        let (status, body) = post(&c, &gw, "/-/quota/reset", &format!("{{{which}}}")).await;
        assert_eq!(status, 200, "{limit}: {body}");
        assert_eq!(body["action"], "reset");
        assert_eq!(body["limit"]["remaining"], 3, "{limit}: {body}");
        assert_eq!(admitted(&c, &url, key, 10).await, 3, "{limit}");
    }
    // A sliding log can be reset, not granted; a concurrency limit neither (409).
    assert_eq!(admitted(&c, &url, "k-log", 10).await, 3);
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/grant",
        r#"{"consumer":"logan","limit":"log","units":1}"#,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("reset it instead"));
    let (status, _) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"logan","limit":"log"}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(admitted(&c, &url, "k-log", 10).await, 3);
    let (status, _) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"busy","limit":"inflight"}"#,
    )
    .await;
    assert_eq!(status, 409);

    // Bad requests: what exists is named.
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"nobody","limit":"monthly"}"#,
    )
    .await;
    assert_eq!(status, 404);
    assert!(body["error"].as_str().unwrap().contains("nobody"), "{body}");
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"wave","limit":"nope","route":"api"}"#,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        body["limits"],
        serde_json::json!([{"limit": "sliding", "route": "api"}])
    );
    // A route limit named without its route, a global one with a route: not found either.
    let (status, _) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"wave","limit":"sliding"}"#,
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"acme","limit":"monthly","route":"api"}"#,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["limits"], serde_json::json!([{"limit": "monthly"}]));
    for (path, bad) in [
        (
            "/-/quota/grant",
            r#"{"consumer":"acme","limit":"monthly","units":-5}"#,
        ),
        (
            "/-/quota/grant",
            r#"{"consumer":"acme","limit":"monthly","units":0}"#,
        ),
        (
            "/-/quota/grant",
            r#"{"consumer":"acme","limit":"monthly","units":4}"#,
        ),
        (
            "/-/quota/grant",
            r#"{"consumer":"acme","limit":"monthly","units":1e30}"#,
        ),
        (
            "/-/quota/grant",
            r#"{"consumer":"acme","limit":"monthly","units":1.5}"#,
        ),
        (
            "/-/quota/grant",
            r#"{"consumer":"acme","limit":"monthly","units":"2"}"#,
        ),
        ("/-/quota/grant", r#"{"consumer":"acme","limit":"monthly"}"#),
        (
            "/-/quota/reset",
            r#"{"consumer":"acme","limit":"monthly","units":1}"#,
        ),
        (
            "/-/quota/reset",
            r#"{"consumer":"acme","limit":"monthly","extra":1}"#,
        ),
        ("/-/quota/reset", r#"{"consumer":"acme"}"#),
        ("/-/quota/reset", "not json"),
    ] {
        let (status, body) = post(&c, &gw, path, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"].is_string(), "{bad}: {body}");
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_quota_admin_total{action=\"grant\"}"),
        Some(8.0)
    );
    assert_eq!(
        metric(&m, "tollgate_quota_admin_total{action=\"reset\"}"),
        Some(5.0)
    );
    assert!(gw.logged("quota adjusted").await, "{}", gw.logs());
}

/// Support gives a consumer N more requests now, whatever it has used: one who spent its whole
/// quota gets exactly 3 more after a grant of 3, one who used nothing gets its quota plus 3 (the
/// headers and usage show more remaining than the quota), and the credit is bounded by the quota
/// (remaining at most twice it).
async fn a_grant_adds_units_beyond_the_quota_in_the_current_window(kind: Kind) {
    let up = upstream().await;
    let files = Files::new();
    let file = files.consumers(&[
        ("acme", "calendar", "k-cal", ""),
        ("acme2", "calendar", "k-cal2", ""),
        ("wave", "window", "k-sw", ""),
        ("wave2", "window", "k-sw2", ""),
        ("tank", "bucket", "k-tb", ""),
        ("tank2", "bucket", "k-tb2", ""),
        ("cell", "cell", "k-gcra", ""),
        ("cell2", "cell", "k-gcra2", ""),
    ]);
    let env = store_env(kind);
    let gw = gateway(&api_config(&env.store, &file, PLANS, &up.url()));
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");
    let which = |consumer: &str, limit: &str, route: Option<&str>| match route {
        Some(r) => format!("\"consumer\":\"{consumer}\",\"limit\":\"{limit}\",\"route\":\"{r}\""),
        None => format!("\"consumer\":\"{consumer}\",\"limit\":\"{limit}\""),
    };
    for (spent, fresh, limit, route) in [
        (("acme", "k-cal"), ("acme2", "k-cal2"), "monthly", None),
        (("wave", "k-sw"), ("wave2", "k-sw2"), "sliding", Some("api")),
        (("tank", "k-tb"), ("tank2", "k-tb2"), "tokens", None),
        (
            ("cell", "k-gcra"),
            ("cell2", "k-gcra2"),
            "gcra",
            Some("api"),
        ),
    ] {
        // The whole quota spent: 429. A grant of 3: exactly 3 more, then 429 again.
        assert_eq!(admitted(&c, &url, spent.1, 10).await, 3, "{limit}");
        let grant = format!("{{{},\"units\":3}}", which(spent.0, limit, route));
        let (status, body) = post(&c, &gw, "/-/quota/grant", &grant).await;
        assert_eq!(status, 200, "{limit}: {body}");
        assert_eq!(body["units"], 3);
        assert_eq!(
            (&body["limit"]["limit"], &body["limit"]["remaining"]),
            (&serde_json::json!(3), &serde_json::json!(3)),
            "{limit}: {body}"
        );
        assert_eq!(admitted(&c, &url, spent.1, 10).await, 3, "{limit}");

        // Nothing used: the quota and 3 more. Remaining shows it, above the quota.
        let grant = format!("{{{},\"units\":3}}", which(fresh.0, limit, route));
        let (status, body) = post(&c, &gw, "/-/quota/grant", &grant).await;
        assert_eq!(status, 200, "{limit}: {body}");
        assert_eq!(body["limit"]["remaining"], 6, "{limit}: {body}");
        // Bounded: a second grant finds the credit full (at most the quota: remaining 2 × 3).
        let (status, body) = post(&c, &gw, "/-/quota/grant", &grant).await;
        assert_eq!(status, 200, "{limit}: {body}");
        assert_eq!(body["limit"]["remaining"], 6, "{limit}: {body}");
        let r = c
            .get(gw.admin_url(&format!("/-/usage?consumer={}", fresh.0)))
            .send()
            .await
            .unwrap();
        let usage: serde_json::Value = r.json().await.unwrap();
        assert_eq!(usage["limits"][0]["remaining"], 6, "{limit}: {usage}");
        let r = get_key(&c, &url, Some(fresh.1)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit"], "3", "{limit}");
        assert_eq!(r.headers()["x-ratelimit-remaining"], "5", "{limit}");
        assert_eq!(admitted(&c, &url, fresh.1, 10).await, 5, "{limit}");
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_quota_admin_total{action=\"grant\"}"),
        Some(12.0)
    );
}

/// Grants racing a burst of requests on the same consumer: the store applies each atomically,
/// so the consumer gets exactly its quota plus what was granted — a lost update (a grant
/// overwritten by a request's write, or the other way round) would show as more or fewer.
async fn a_grant_racing_requests_loses_no_update(kind: Kind) {
    const QUOTA: usize = 200;
    const GRANTS: usize = 5;
    const UNITS: usize = 10;
    let up = upstream().await;
    let files = Files::new();
    let file = files.consumers(&[("acme", "calendar", "k", "")]);
    let plan = PLANS.replacen(
        "limit = 3\ncalendar",
        &format!("limit = {QUOTA}\ncalendar"),
        1,
    );
    let env = store_env(kind);
    let gw = gateway(&api_config(&env.store, &file, &plan, &up.url()));
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");
    // Half the quota first, so every grant finds at least its units used.
    for _ in 0..QUOTA / 2 {
        assert_eq!(get_key(&c, &url, Some("k")).await.status(), 200);
    }
    let ok = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(QUOTA / 2));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, url, ok) = (c.clone(), url.clone(), ok.clone());
            tokio::spawn(async move {
                for _ in 0..25 {
                    if get_key(&c, &url, Some("k")).await.status() == 200 {
                        ok.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for _ in 0..GRANTS {
        let (status, body) = post(
            &c,
            &gw,
            "/-/quota/grant",
            &format!("{{\"consumer\":\"acme\",\"limit\":\"monthly\",\"units\":{UNITS}}}"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rest = admitted(&c, &url, "k", QUOTA).await;
    let total = ok.load(std::sync::atomic::Ordering::SeqCst) + rest;
    assert_eq!(total, QUOTA + GRANTS * UNITS);
}

async fn a_consumer_overrides_its_plans_numbers(kind: Kind) {
    let up = upstream().await;
    let files = Files::new();
    let write = |acme: &str| {
        files.consumers(&[
            ("acme", "calendar", "k-acme", acme),
            ("globex", "calendar", "k-globex", ""),
        ])
    };
    let file = write("limits = { monthly = 5 }");
    let env = store_env(kind);
    let gw = gateway(&api_config(&env.store, &file, PLANS, &up.url()));
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");
    let r = get_key(&c, &url, Some("k-acme")).await;
    assert!(
        r.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .starts_with("\"monthly\";q=5;"),
        "{:?}",
        r.headers()
    );
    assert_eq!(
        admitted(&c, &url, "k-acme", 10).await,
        4,
        "5 with the override"
    );
    assert_eq!(admitted(&c, &url, "k-globex", 10).await, 3, "3 on the plan");
    let usage = |name: &'static str| {
        let c = c.clone();
        let u = gw.admin_url(&format!("/-/usage?consumer={name}"));
        async move {
            let v: serde_json::Value = c.get(u).send().await.unwrap().json().await.unwrap();
            v["limits"][0].clone()
        }
    };
    assert_eq!(usage("acme").await["limit"], 5);
    assert_eq!(usage("acme").await["remaining"], 0);
    assert_eq!(usage("globex").await["limit"], 3);
    // A grant is bounded by the consumer's own quota.
    let (status, _) = post(
        &c,
        &gw,
        "/-/quota/grant",
        r#"{"consumer":"acme","limit":"monthly","units":5}"#,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &c,
        &gw,
        "/-/quota/grant",
        r#"{"consumer":"acme","limit":"monthly","units":6}"#,
    )
    .await;
    assert_eq!(status, 400);
    // The plan's denials and the override's land in the same /-/top entry.
    let top: serde_json::Value = c
        .get(gw.admin_url("/-/top?route=api&limit=monthly"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(top["top"].as_array().unwrap().len(), 2, "{top}");

    // Reloaded with the file: a new number, and a bad override is refused naming file and line
    // (the previous consumers keep serving).
    write("limits = { monthly = 9 }");
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(usage("acme").await["limit"], 9);
    write("limits = { daily = 9 }");
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 422);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("consumers.toml") && text.contains("line 5") && text.contains("daily"),
        "{text}"
    );
    assert_eq!(usage("acme").await["limit"], 9);
}

/// A consumer's `anchor_day` moves its monthly window: with tomorrow as its billing day, its
/// month ends at the next UTC midnight, while the plan's (from the 1st, or the plan's own
/// `anchor_day`) does not. On injected time (2027-03-09 12:00 UTC): exactly 12 h to go, and
/// the consumer's window turns at that midnight.
async fn a_billing_day_moves_a_consumers_month(kind: Kind) {
    const NOON: u64 = 1_804_593_600; // 2027-03-09 12:00:00 UTC
    let anchor = 10;
    let up = upstream().await;
    let files = Files::new();
    let file = files.consumers(&[
        (
            "acme",
            "calendar",
            "k-acme",
            &format!("anchor_day = {anchor}"),
        ),
        ("globex", "calendar", "k-globex", ""),
    ]);
    let env = store_env(kind);
    let gw = gateway_on_clock(
        &api_config(&env.store, &file, PLANS, &up.url()),
        NOON * 1_000_000,
    );
    wait_ready(&gw).await;
    let c = client();
    let reset = |name: &'static str| {
        let c = c.clone();
        let u = gw.admin_url(&format!("/-/usage?consumer={name}"));
        async move {
            let v: serde_json::Value = c.get(u).send().await.unwrap().json().await.unwrap();
            v["limits"][0]["reset_seconds"].as_u64().unwrap()
        }
    };
    let acme = reset("acme").await;
    let globex = reset("globex").await;
    assert_eq!(
        acme,
        12 * 3600,
        "the consumer's month ends at the next midnight"
    );
    assert!(acme != globex && globex <= 31 * 86_400, "{acme} {globex}");
    // The window is the consumer's own in the store too: its 3 are counted there.
    assert_eq!(admitted(&c, &gw.url("/api/x"), "k-acme", 5).await, 3);
    assert_eq!(admitted(&c, &gw.url("/api/x"), "k-globex", 5).await, 3);
    // A second before midnight both are still spent; at midnight only the consumer whose
    // billing day it is has a new month.
    gw.set_clock((NOON + 12 * 3600 - 1) * 1_000_000).await;
    assert_eq!(admitted(&c, &gw.url("/api/x"), "k-acme", 1).await, 0);
    gw.advance(std::time::Duration::from_secs(1)).await;
    assert_eq!(admitted(&c, &gw.url("/api/x"), "k-acme", 5).await, 3);
    assert_eq!(admitted(&c, &gw.url("/api/x"), "k-globex", 1).await, 0);
}

/// A ConfigMap volume as the kubelet lays it out: the files are symlinks through `..data`, a
/// symlink to a timestamped directory; an update writes a new directory and renames a new
/// `..data` symlink over the old one (the files' paths never change).
struct ConfigMapVolume {
    dir: tempfile::TempDir,
    version: std::cell::Cell<u32>,
}

impl ConfigMapVolume {
    fn new(files: &[(&str, &str)]) -> ConfigMapVolume {
        let v = ConfigMapVolume {
            dir: tempfile::tempdir().unwrap(),
            version: std::cell::Cell::new(0),
        };
        v.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), v.dir.path().join(name)).unwrap();
        }
        v
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// The kubelet's atomic update: a new timestamped directory, `..data` swapped to it, the
    /// old directory removed.
    fn update(&self, files: &[(&str, &str)]) {
        let old = self.version.get();
        let new = old + 1;
        self.version.set(new);
        let stamped = format!("..2026_11_24_08_00_00.{new}");
        let d = self.dir.path().join(&stamped);
        std::fs::create_dir(&d).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
        }
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&stamped, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
        if old > 0 {
            std::fs::remove_dir_all(self.dir.path().join(format!("..2026_11_24_08_00_00.{old}")))
                .unwrap();
        }
    }
}

/// Waits (up to 10 s) until a request with `key` to `path` gets `status`.
async fn eventually(c: &reqwest::Client, gw: &Gateway, path: &str, key: &str, status: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = get_key(c, &gw.url(path), Some(key)).await.status().as_u16();
        if got == status {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} with {key} still answers {got}, not {status}: {}",
            gw.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn watch_config_reloads_on_a_kubernetes_configmap_swap(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let gateway_toml = |extra_route: &str| {
        config(
            &env.store,
            &(consumers_toml("consumers.toml", GOLD)
                + &route("api", "/api", &up.url(), "consumers = true")
                + extra_route),
        )
        .replacen("[server]\n", "[server]\nwatch_config = true\n", 1)
    };
    let consumers = |entries: &[(&str, &str)]| -> String {
        entries
            .iter()
            .map(|(name, key)| {
                format!(
                    "[[consumer]]\nname = \"{name}\"\nplan = \"gold\"\nkey_sha256 = \"{}\"\n\n",
                    hex(&hash_key(key.as_bytes()))
                )
            })
            .collect()
    };
    let volume = ConfigMapVolume::new(&[
        ("gateway.toml", &gateway_toml("")),
        ("consumers.toml", &consumers(&[("acme", "k1")])),
    ]);
    let gw = gateway_at(&volume.path("gateway.toml"));
    wait_ready(&gw).await;
    let c = client();
    assert_eq!(
        get_key(&c, &gw.url("/api/x"), Some("k1")).await.status(),
        200
    );
    assert_eq!(
        get_key(&c, &gw.url("/api/x"), Some("k2")).await.status(),
        401
    );

    // The ConfigMap gains a consumer: the swap of `..data` is seen, the file reloaded.
    volume.update(&[
        ("gateway.toml", &gateway_toml("")),
        (
            "consumers.toml",
            &consumers(&[("acme", "k1"), ("globex", "k2")]),
        ),
    ]);
    eventually(&c, &gw, "/api/x", "k2", 200).await;
    assert!(
        gw.logged("watched configuration files changed").await,
        "{}",
        gw.logs()
    );
    // And a route, in gateway.toml itself.
    volume.update(&[
        (
            "gateway.toml",
            &gateway_toml(&route("more", "/more", &up.url(), "consumers = true")),
        ),
        (
            "consumers.toml",
            &consumers(&[("acme", "k1"), ("globex", "k2")]),
        ),
    ]);
    eventually(&c, &gw, "/more", "k1", 200).await;
    // A bad file is refused (logged and counted); what serves stays.
    volume.update(&[
        (
            "gateway.toml",
            &gateway_toml(&route("more", "/more", &up.url(), "consumers = true")),
        ),
        ("consumers.toml", "[[consumer]]\nname = \"x\"\n"),
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while metric(
        &gw.metrics().await,
        "tollgate_config_reloads_total{result=\"failure\"}",
    ) != Some(1.0)
    {
        assert!(std::time::Instant::now() < deadline, "{}", gw.logs());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        get_key(&c, &gw.url("/more/x"), Some("k2")).await.status(),
        200
    );
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_config_reloads_total{result=\"success\"}"),
        Some(2.0)
    );
}

/// Plan `llm`: 3 requests an hour per consumer *and model* (`json:model`), 2 per consumer and
/// path.
const LLM: &str = r#"
[[plans]]
name = "llm"
[[plans.limits]]
name = "per-model"
algorithm = "fixed_window"
limit = 3
period = "1h"
subject = ["consumer", "json:model"]
on_missing = "reject"
[[plans.limits]]
name = "per-path"
algorithm = "fixed_window"
limit = 2
period = "1h"
subject = ["path"]
"#;

/// How many POSTs of `body` to `url` with `key` are admitted before the first 429 (at most `max`).
async fn admitted_post(c: &reqwest::Client, url: &str, key: &str, body: &str, max: usize) -> usize {
    for n in 0..max {
        let s = c
            .post(url)
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
            .status();
        if s == 429 {
            return n;
        }
        assert_eq!(s, 200);
    }
    max
}

/// The usage entries of `limit` in a usage body, as (parts, remaining), sorted.
fn entries_of(body: &serde_json::Value, limit: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = body["limits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["name"] == limit)
        .map(|l| (l["parts"].to_string(), l["remaining"].as_u64().unwrap()))
        .collect();
    out.sort();
    out
}

async fn get_json(c: &reqwest::Client, url: &str) -> (u16, serde_json::Value) {
    let r = c.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (
        status,
        serde_json::from_str(&r.text().await.unwrap()).unwrap(),
    )
}

/// Issue #34 item 23: a plan limit counted by `["consumer", "json:model"]` or `["path"]` is one
/// count per combination; usage lists each, reset and grant act on the one named (`model`,
/// `path`) or, for a reset, on every one the gateway counted.
async fn usage_reset_and_grant_act_on_each_key_of_a_compound_subject(kind: Kind) {
    let up = upstream().await;
    let files = Files::new();
    let file = files.consumers(&[("acme", "llm", "k-llm", "")]);
    let env = store_env(kind);
    let gw = gateway(&api_config(&env.store, &file, LLM, &up.url()));
    wait_ready(&gw).await;
    let c = client();
    let m1 = r#"{"model":"m1"}"#;
    let m2 = r#"{"model":"m2"}"#;
    // Three paths so that per-path leaves room for per-model.
    assert_eq!(
        admitted_post(&c, &gw.url("/api/a"), "k-llm", m1, 2).await,
        2
    );
    assert_eq!(
        admitted_post(&c, &gw.url("/api/b"), "k-llm", m1, 1).await,
        1
    );
    assert_eq!(
        admitted_post(&c, &gw.url("/api/c"), "k-llm", m1, 1).await,
        0
    );
    assert_eq!(
        admitted_post(&c, &gw.url("/api/c"), "k-llm", m2, 1).await,
        1
    );

    let usage = |q: &str| gw.admin_url(&format!("/-/usage?consumer=acme{q}"));
    let (status, body) = get_json(&c, &usage("")).await;
    assert_eq!(status, 200, "{body}");
    let m1p = r#"[{"part":"json:model","value":"m1"}]"#;
    let m2p = r#"[{"part":"json:model","value":"m2"}]"#;
    assert_eq!(
        entries_of(&body, "per-model"),
        vec![(m1p.to_owned(), 0), (m2p.to_owned(), 2)],
        "{body}"
    );
    let pp = |p: &str| format!(r#"[{{"part":"path","value":"{p}"}}]"#);
    // /api/c: 0, not 1 — per-path reads no body, so it is decided before per-model and still
    // counts the m1 request per-model refused (#34 item 26; README "Reading the request body").
    assert_eq!(
        entries_of(&body, "per-path"),
        vec![(pp("/api/a"), 0), (pp("/api/b"), 1), (pp("/api/c"), 0)],
        "{body}"
    );
    // One model named: its key, read directly.
    let (status, body) = get_json(&c, &usage("&model=m1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(entries_of(&body, "per-model"), vec![(m1p.to_owned(), 0)]);
    let (status, body) = get_json(&c, &usage("&json:model=m3")).await;
    assert_eq!(status, 200, "{body}");
    let m3p = r#"[{"part":"json:model","value":"m3"}]"#;
    assert_eq!(entries_of(&body, "per-model"), vec![(m3p.to_owned(), 3)]);
    let (status, body) = get_json(&c, &usage("&colour=blue")).await;
    assert_eq!(status, 400, "{body}");

    // A reset of model m1: m1 fresh, m2 untouched.
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"acme","limit":"per-model","model":"m1"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limit"]["remaining"], 3, "{body}");
    assert_eq!(
        admitted_post(&c, &gw.url("/api/d"), "k-llm", m1, 1).await,
        1
    );
    // A grant to m2: one more than it had.
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/grant",
        r#"{"consumer":"acme","limit":"per-model","model":"m2","units":1}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limit"]["remaining"], 3, "{body}");
    // A grant must name its key.
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/grant",
        r#"{"consumer":"acme","limit":"per-model","units":1}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"acme","limit":"per-model","colour":"blue"}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // A reset naming no part: every key of the consumer's limit the gateway counted.
    assert_eq!(
        admitted_post(&c, &gw.url("/api/e"), "k-llm", m2, 2).await,
        2
    );
    assert_eq!(
        admitted_post(&c, &gw.url("/api/f"), "k-llm", m2, 5).await,
        1
    );
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"acme","limit":"per-model"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["keys"], 2, "{body}");
    let (_, body) = get_json(&c, &usage("")).await;
    assert_eq!(
        entries_of(&body, "per-model"),
        vec![(m1p.to_owned(), 3), (m2p.to_owned(), 3)],
        "{body}"
    );
    // The path of a ["path"] limit.
    assert_eq!(
        admitted_post(&c, &gw.url("/api/a"), "k-llm", m2, 1).await,
        0
    );
    let (status, body) = post(
        &c,
        &gw,
        "/-/quota/reset",
        r#"{"consumer":"acme","limit":"per-path","path":"/api/a"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        admitted_post(&c, &gw.url("/api/a"), "k-llm", m2, 5).await,
        2
    );
}
