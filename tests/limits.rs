//! The limiting engine through the real binary, on every store: each scenario runs once on the
//! in-process store and once on a private Redis (`on_every_store!`).

mod support;

use std::time::{Duration, Instant};

use support::*;

on_every_store!(
    fixed_window_headers_and_429,
    every_algorithm_admits_its_limit,
    leaky_bucket_delays_then_rejects,
    api_keys_get_separate_buckets,
    spoofed_forwarded_for_buys_nothing,
    two_limits_are_all_or_nothing,
    cost_is_charged,
    shadow_mode_never_rejects,
    sub_second_windows,
    a_repeated_denial_reports_what_the_store_would_now,
    limits_are_exact_across_workers,
    repeated_subject_values_get_400,
    the_deny_cache_follows_injected_time,
    a_denial_reports_what_the_others_have_left,
);

async fn gw_with(kind: Kind, server_extra: &str, routes: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let mut cfg = config(&env.store, routes);
    if !server_extra.is_empty() {
        cfg = cfg.replacen("[server]\n", &format!("[server]\n{server_extra}\n"), 1);
    }
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    (gw, env)
}

/// [`gw_with`] on an injected clock standing at [`T0`].
async fn gw_on_clock(kind: Kind, routes: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let gw = gateway_on_clock(&config(&env.store, routes), T0);
    wait_ready(&gw).await;
    (gw, env)
}

fn one_limit(up: &Upstream, body: &str) -> String {
    route("api", "/api", &up.url(), "") + &limit(body)
}

/// The `pk` parameter of the RateLimit fields for a subject: its digest as `:base64:`.
fn pk(subject: tollgate::limiter::SubjectDigest) -> String {
    let mut s = String::new();
    subject.write_sf_bytes(&mut s);
    s
}

fn pk_ip(ip: &str) -> String {
    pk(tollgate::subject::ip_digest(ip.parse().unwrap()))
}

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

async fn fixed_window_headers_and_429(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(
        &up,
        "name = \"fw\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"",
    );
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let res = c.get(gw.url("/api/x")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(h(&res, "x-ratelimit-limit"), "5");
        assert_eq!(
            h(&res, "ratelimit-policy"),
            format!("\"fw\";q=5;w=3600;pk={}", pk_ip("127.0.0.1"))
        );
        // -11: `t` is the effective window (the window's end for a fixed window), and `pk`.
        let t = h(&res, "x-ratelimit-reset");
        assert!(
            h(&res, "ratelimit").ends_with(&format!(";t={t};pk={}", pk_ip("127.0.0.1"))),
            "{}",
            h(&res, "ratelimit")
        );
        let reset: u64 = h(&res, "x-ratelimit-reset").parse().unwrap();
        assert!((1..=3600).contains(&reset), "reset {reset}");
        remaining.push(h(&res, "x-ratelimit-remaining"));
    }
    assert_eq!(remaining, ["4", "3", "2", "1", "0"]);
    let mut denied = 0;
    for _ in 0..3 {
        let res = c.get(gw.url("/api/x")).send().await.unwrap();
        assert_eq!(res.status(), 429);
        denied += 1;
        let retry: u64 = h(&res, "retry-after").parse().unwrap();
        assert!((1..=3600).contains(&retry));
        assert_eq!(h(&res, "x-ratelimit-remaining"), "0");
        assert!(
            h(&res, "ratelimit").starts_with("\"fw\";r=0;t="),
            "{}",
            h(&res, "ratelimit")
        );
        assert_eq!(h(&res, "content-type"), "application/problem+json");
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["status"], 429);
        assert_eq!(
            body["type"],
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(body["violated-policies"], serde_json::json!(["fw"]));
        assert_eq!(body["route"], "api");
        assert_eq!(body["limit"], "fw");
        assert_eq!(body["retry_after"], retry);
    }
    assert_eq!(up.hits(), 5, "the upstream is not called for a 429");
    let m = gw.metrics().await;
    let d = |decision: &str| decisions(&m, "api", "fw", decision);
    assert_eq!(d("allowed"), Some(5.0));
    assert_eq!(d("limited"), Some(f64::from(denied)));
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"api\",status=\"429\"}"),
        Some(f64::from(denied))
    );
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"api\",status=\"200\"}"),
        Some(5.0)
    );
}

async fn every_algorithm_admits_its_limit(kind: Kind) {
    let up = upstream().await;
    let mut routes = String::new();
    for alg in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
    ] {
        routes += &route(alg, &format!("/{alg}"), &up.url(), "");
        routes += &limit(&format!(
            "name = \"l\"\nalgorithm = \"{alg}\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\""
        ));
    }
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    for alg in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
    ] {
        let mut statuses = Vec::new();
        let mut remaining = Vec::new();
        for _ in 0..8 {
            let res = c.get(gw.url(&format!("/{alg}/x"))).send().await.unwrap();
            statuses.push(res.status().as_u16());
            remaining.push(h(&res, "x-ratelimit-remaining"));
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429], "{alg}");
        assert_eq!(remaining[..5], ["4", "3", "2", "1", "0"], "{alg}");
    }
    assert_eq!(up.hits(), 25);
}

async fn leaky_bucket_delays_then_rejects(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(&up, "name = \"lb\"\nalgorithm = \"leaky_bucket\"\nlimit = 5\nperiod = \"1s\"\nburst = 3\nsubject = \"global\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let c = c.clone();
            let url = gw.url("/api/x");
            tokio::spawn(async move {
                let res = c.get(url).send().await.unwrap();
                (res.status().as_u16(), t0.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let mut ok: Vec<Duration> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, d)| *d)
        .collect();
    let rejected: Vec<Duration> = results
        .iter()
        .filter(|(s, _)| *s == 429)
        .map(|(_, d)| *d)
        .collect();
    ok.sort();
    assert_eq!((ok.len(), rejected.len()), (4, 2), "{results:?}");
    // Forwarded at ≈0, 0.2, 0.4, 0.6 s: each waited at least its slot (small margin for clock
    // granularity), and not much longer.
    for (i, d) in ok.iter().enumerate() {
        let slot = Duration::from_millis(200 * i as u64);
        assert!(
            *d + Duration::from_millis(30) >= slot,
            "request {i} forwarded after {d:?}, before its slot {slot:?}"
        );
        assert!(
            *d < slot + Duration::from_millis(900),
            "request {i} forwarded after {d:?}"
        );
    }
    let m = gw.metrics().await;
    let d = |decision: &str| decisions(&m, "api", "lb", decision);
    assert_eq!(d("allowed"), Some(1.0));
    assert_eq!(d("delayed"), Some(3.0));
    assert_eq!(d("limited"), Some(2.0));
}

async fn api_keys_get_separate_buckets(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(&up, "name = \"key\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"")
        + &route("strict", "/strict", &up.url(), "")
        + &limit("name = \"key\"\nalgorithm = \"gcra\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"query:key\"\non_missing = \"reject\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let get = |key: Option<&'static str>| {
        let mut r = c.get(gw.url("/api/x"));
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        [
            get(Some("a")).await,
            get(Some("a")).await,
            get(Some("a")).await
        ],
        [200, 200, 429]
    );
    assert_eq!(
        [
            get(Some("b")).await,
            get(Some("b")).await,
            get(Some("b")).await
        ],
        [200, 200, 429]
    );
    // Without the header the limit counts the client address, in a bucket of its own.
    assert_eq!(
        [get(None).await, get(None).await, get(None).await],
        [200, 200, 429]
    );
    // on_missing = "reject": 401 without the subject; query keys get their own buckets.
    let q = |p: &str| c.get(gw.url(p)).send();
    assert_eq!(q("/strict/x").await.unwrap().status(), 401);
    assert_eq!(q("/strict/x?key=k1").await.unwrap().status(), 200);
    assert_eq!(q("/strict/x?key=k1").await.unwrap().status(), 200);
    assert_eq!(q("/strict/x?key=k1").await.unwrap().status(), 429);
    assert_eq!(q("/strict/x?other=1&key=k2").await.unwrap().status(), 200);
}

async fn spoofed_forwarded_for_buys_nothing(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(
        &up,
        "name = \"ip\"\nalgorithm = \"token_bucket\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\"",
    );
    // No trusted proxies: X-Forwarded-For is ignored.
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let mut statuses = Vec::new();
    for i in 0..4 {
        let res = c
            .get(gw.url("/api/x"))
            .header("x-forwarded-for", format!("203.0.113.{i}"))
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    drop(gw);
    // Loopback trusted: the address the proxy forwards for is the subject.
    let (gw, _env2) = gw_with(kind, "trusted_proxies = [\"127.0.0.0/8\"]", &routes).await;
    let send = |xff: &'static str| {
        let r = c.get(gw.url("/api/x")).header("x-forwarded-for", xff);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(
        [
            send("198.51.100.1").await,
            send("198.51.100.1").await,
            send("198.51.100.1").await
        ],
        [200, 200, 429]
    );
    assert_eq!(
        send("198.51.100.2").await,
        200,
        "another client behind the trusted proxy has its own bucket"
    );
    // A client that prepends a fake hop is still identified by the hop the proxy appended.
    assert_eq!(send("6.6.6.6, 198.51.100.1").await, 429);
}

async fn two_limits_are_all_or_nothing(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"")
        + &limit("name = \"all\"\nalgorithm = \"sliding_log\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"global\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let send = |key: &'static str| {
        let r = c.get(gw.url("/api/x")).header("x-api-key", key);
        async move { r.send().await.unwrap() }
    };
    let mut k1 = Vec::new();
    for _ in 0..10 {
        k1.push(send("k1").await.status().as_u16());
    }
    assert_eq!(k1, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    // k1's seven denied requests were not counted by "all": two more fit.
    let res = send("k2").await;
    assert_eq!(res.status(), 200);
    // Headers describe the limit with the fewest remaining units ("all": 5 − 4 = 1).
    assert_eq!(h(&res, "x-ratelimit-remaining"), "1");
    // A key subject has a partition key (its digest), a global one none.
    let k2 = pk(tollgate::limiter::SubjectDigest::of(b'h', b"k2"));
    assert_eq!(
        h(&res, "ratelimit-policy"),
        format!("\"per-key\";q=3;w=3600;pk={k2}, \"all\";q=5;w=3600")
    );
    assert!(
        h(&res, "ratelimit").contains("\"per-key\";r=2;"),
        "{}",
        h(&res, "ratelimit")
    );
    assert!(
        h(&res, "ratelimit").contains("\"all\";r=1;"),
        "{}",
        h(&res, "ratelimit")
    );
    assert_eq!(send("k2").await.status(), 200);
    let res = send("k3").await;
    assert_eq!(res.status(), 429);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["limit"], "all");
    // k3's denial by "all" did not use up k3's per-key allowance either.
    assert_eq!(up.hits(), 5);
}

async fn cost_is_charged(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(&up, "name = \"c\"\nalgorithm = \"sliding_window\"\nlimit = 10\nperiod = \"1h\"\ncost = 3\nsubject = \"ip\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let res = c.get(gw.url("/api/x")).send().await.unwrap();
        seen.push((res.status().as_u16(), h(&res, "x-ratelimit-remaining")));
    }
    let want: Vec<(u16, String)> = vec![
        (200, "7".into()),
        (200, "4".into()),
        (200, "1".into()),
        (429, "1".into()),
        (429, "1".into()),
    ];
    assert_eq!(seen, want);
}

async fn shadow_mode_never_rejects(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(&up, "name = \"s\"\nalgorithm = \"gcra\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\"\nmode = \"shadow\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    for _ in 0..6 {
        let res = c.get(gw.url("/api/x")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(
            res.headers().get("x-ratelimit-remaining").is_none(),
            "shadow limits are not advertised"
        );
    }
    assert_eq!(up.hits(), 6);
    let m = gw.metrics().await;
    let d = |decision: &str| decisions(&m, "api", "s", decision);
    assert_eq!(d("allowed"), Some(2.0));
    assert_eq!(d("shadow"), Some(4.0));
    assert_eq!(d("limited"), Some(0.0));
}

async fn sub_second_windows(kind: Kind) {
    let up = upstream().await;
    let routes = route("fw", "/fw", &up.url(), "")
        + &limit("name = \"l\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"400ms\"\nsubject = \"ip\"")
        + &route("sw", "/sw", &up.url(), "")
        + &limit("name = \"l\"\nalgorithm = \"sliding_window\"\nlimit = 3\nperiod = \"400ms\"\nsubject = \"ip\"");
    // On injected time (T0 starts a 400 ms window): exactly the limit per window, no margins.
    let (gw, _env) = gw_on_clock(kind, &routes).await;
    let c = client();
    for p in ["/fw/x", "/sw/x"] {
        gw.set_clock(T0).await;
        for i in 0..3 {
            let res = c.get(gw.url(p)).send().await.unwrap();
            assert_eq!(res.status(), 200, "{p} #{i}");
        }
        let res = c.get(gw.url(p)).send().await.unwrap();
        assert_eq!(res.status(), 429, "{p}");
        assert_eq!(
            h(&res, "retry-after"),
            "1",
            "{p}: sub-second waits round up to 1 s"
        );
        // 399 ms on, still the same window (the sliding window still counts all 3).
        gw.advance(Duration::from_millis(399)).await;
        assert_eq!(c.get(gw.url(p)).send().await.unwrap().status(), 429, "{p}");
        // Two periods after the start the window is open again, with the full quota.
        gw.set_clock(T0 + 800_000).await;
        let res = c.get(gw.url(p)).send().await.unwrap();
        assert_eq!(res.status(), 200, "{p}");
        assert_eq!(h(&res, "x-ratelimit-remaining"), "2", "{p}");
    }
}

/// A flood of new subjects at `max_subjects` must not reset a denied subject (in-process store:
/// Redis evicts by its own `maxmemory` policy). Eviction drops first what grants least when lost.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_flood_does_not_reset_an_exhausted_subject() {
    let up = upstream().await;
    let routes = route("login", "/login", &up.url(), "")
        + &limit("name = \"ip\"\nalgorithm = \"sliding_log\"\nlimit = 3\nperiod = \"10m\"\nsubject = \"ip\"")
        + &route("api", "/api", &up.url(), "")
        + &limit("name = \"key\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"24h\"\nsubject = \"header:X-Api-Key\"");
    let cfg = config("backend = \"memory\"\nmax_subjects = 200", &routes);
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(c.get(gw.url("/login")).send().await.unwrap().status(), 200);
    }
    let denied = c.get(gw.url("/login")).send().await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["retry-after"], "600");

    // 2,000 fresh keys, ten times the store's capacity, 8 at a time.
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (c, url) = (c.clone(), gw.url("/api/x"));
        tasks.push(tokio::spawn(async move {
            for i in 0..250 {
                let r = c
                    .get(&url)
                    .header("x-api-key", format!("flood-{t}-{i}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let after = c.get(gw.url("/login")).send().await.unwrap();
    assert_eq!(
        after.status(),
        429,
        "the flood evicted the exhausted login limit"
    );
    let m = gw.metrics().await;
    let tracked = metric(&m, "tollgate_store_subjects").unwrap_or(f64::NAN);
    assert!(
        (150.0..=200.0).contains(&tracked),
        "tollgate_store_subjects = {tracked} with max_subjects = 200"
    );
    assert!(
        metric_sum(
            &m,
            "tollgate_store_evictions_total",
            &["reason=\"capacity\""]
        ) >= 1800.0
    );
}

/// A denial answered again later (on Redis, from the deny cache) reports what the store would
/// answer at that moment: `remaining` grows back as GCRA drains, and Retry-After is never early.
async fn a_repeated_denial_reports_what_the_store_would_now(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(
        &up,
        "name = \"g\"\nalgorithm = \"gcra\"\nlimit = 60\nperiod = \"60s\"\nburst = 10\ncost = 3\nsubject = \"header:X-Api-Key\"",
    );
    let (gw, _env) = gw_on_clock(kind, &routes).await;
    let c = client();
    let send = || c.get(gw.url("/api/x")).header("x-api-key", "k").send();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = send().await.unwrap();
        seen.push((r.status().as_u16(), h(&r, "x-ratelimit-remaining")));
    }
    let expect: Vec<(u16, String)> = vec![
        (200, "7".into()),
        (200, "4".into()),
        (200, "1".into()),
        (429, "1".into()),
    ];
    assert_eq!(seen, expect, "{kind:?}");
    // 1.5 s later the bucket has drained 1.5 units: 2 whole units remain, the request (cost 3)
    // is still denied and may retry in 0.5 s (on Redis, answered by the deny cache).
    gw.advance(Duration::from_millis(1500)).await;
    let r = send().await.unwrap();
    assert_eq!(r.status(), 429, "{kind:?}");
    assert_eq!(h(&r, "x-ratelimit-remaining"), "2", "{kind:?}");
    assert!(
        h(&r, "ratelimit").contains("r=2"),
        "{kind:?}: {}",
        h(&r, "ratelimit")
    );
    let retry: u64 = h(&r, "retry-after").parse().unwrap();
    assert_eq!(retry, 1, "{kind:?}");
    // 0.499 s later the request still does not fit.
    gw.advance(Duration::from_millis(499)).await;
    assert_eq!(send().await.unwrap().status(), 429, "{kind:?}");
    // Retry-After is never early: the request after it is admitted.
    gw.advance(Duration::from_secs(retry) - Duration::from_millis(499))
        .await;
    assert_eq!(send().await.unwrap().status(), 200, "{kind:?}");
}

/// The production layering under injected time: on Redis the deny cache stands in front of the
/// store. A denial is cached (the repeat is answered without a store round trip), and once the
/// injected clock passes the retry time the next request reaches the store and is admitted —
/// a cache that aged on wall time would still deny it. The in-process store (no cache) decides
/// the same.
async fn the_deny_cache_follows_injected_time(kind: Kind) {
    let up = upstream().await;
    // A window of one second (T0 starts one): the cache holds a denial until its retry time
    // (at most `MAX_CACHED`, a second, itself).
    let routes = one_limit(
        &up,
        "name = \"w\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1s\"\nsubject = \"header:X-Api-Key\"",
    );
    let (gw, _env) = gw_on_clock(kind, &routes).await;
    let c = client();
    let send = || c.get(gw.url("/api/x")).header("x-api-key", "k").send();
    let hits = |m: &str| metric_sum(m, "tollgate_store_deny_cache_hits_total", &[]);
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(send().await.unwrap().status(), 200);
    let denied = send().await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(h(&denied, "x-ratelimit-reset"), "1");
    // 0.6 s on: still denied, 0.4 s to wait; on Redis answered by the cache.
    gw.advance(Duration::from_millis(600)).await;
    let r = send().await.unwrap();
    assert_eq!(r.status(), 429, "{kind:?}");
    assert_eq!(h(&r, "retry-after"), "1", "{kind:?}");
    if kind != Kind::Memory {
        assert_eq!(
            hits(&gw.metrics().await),
            1.0,
            "{kind:?}: the repeated denial was answered by the cache"
        );
    }
    // Past the retry time on the injected clock (a few ms of wall time since the denial, which
    // a cache aging on wall time would still answer): the request reaches the store, in the
    // next window, and is admitted with the window's quota.
    gw.advance(Duration::from_millis(401)).await;
    let r = send().await.unwrap();
    assert_eq!(r.status(), 200, "{kind:?}");
    assert_eq!(h(&r, "x-ratelimit-remaining"), "1", "{kind:?}");
    if kind != Kind::Memory {
        assert_eq!(
            hits(&gw.metrics().await),
            1.0,
            "{kind:?}: the store was asked, not the cache"
        );
    }
    assert_eq!(up.hits(), 3);
}

async fn repeated_subject_values_get_400(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(&up, "name = \"key\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"")
        + &route("q", "/q", &up.url(), "")
        + &limit("name = \"key\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"query:key\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    // Exhaust key "z" on both routes.
    let res = c
        .get(gw.url("/api/x"))
        .header("x-api-key", "z")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        c.get(gw.url("/q/x?key=z")).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        c.get(gw.url("/q/x?key=z")).send().await.unwrap().status(),
        429
    );
    let hits = up.hits();

    // The exhausted key followed (or preceded) by a fresh one: refused, naming the field.
    for (first, second) in [("z", "a"), ("b", "z"), ("c", "c")] {
        let res = c
            .get(gw.url("/api/x"))
            .header("x-api-key", first)
            .header("x-api-key", second)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{first}, {second}");
        assert_eq!(h(&res, "content-type"), "application/problem+json");
        let body = res.text().await.unwrap();
        assert!(body.contains("x-api-key"), "{body}");
    }
    for q in [
        "key=z&key=a",
        "key=a&key=z",
        "key=d&x=1&k%65y=e",
        "key=&key=f",
    ] {
        let res = c.get(gw.url(&format!("/q/x?{q}"))).send().await.unwrap();
        assert_eq!(res.status(), 400, "{q}");
        let body = res.text().await.unwrap();
        assert!(
            body.contains("query:key") || body.contains("\"key\""),
            "{body}"
        );
    }
    assert_eq!(
        up.hits(),
        hits,
        "a request with a repeated subject reached the upstream"
    );
    // One value (even a comma-separated one) is one subject, as before.
    let res = c
        .get(gw.url("/api/x"))
        .header("x-api-key", "g, h")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        c.get(gw.url("/q/x?key=i")).send().await.unwrap().status(),
        200
    );
}

/// Four workers, each with its own listener socket: one store decides for all of them, so a
/// subject's limit is exact whichever worker its connections land on.
async fn limits_are_exact_across_workers(kind: Kind) {
    let up = upstream().await;
    let routes = one_limit(
        &up,
        "name = \"g\"\nalgorithm = \"gcra\"\nlimit = 30\nperiod = \"1h\"\nburst = 30\nsubject = \"global\"",
    );
    let (gw, _env) = gw_with(kind, "workers = 4", &routes).await;
    let pid = gw.child.id();
    let workers = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("tollgate-worker"))
        .count();
    assert_eq!(workers, 4, "{kind:?}: worker threads");
    // Many fresh connections, so the kernel spreads them over the four sockets.
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let url = gw.url("/api/x");
        tasks.push(tokio::spawn(async move {
            let c = reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            c.get(url).send().await.map(|r| r.status().as_u16())
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            200 => ok += 1,
            429 => {}
            s => panic!("{kind:?}: status {s}"),
        }
    }
    assert_eq!(ok, 30, "{kind:?}: admitted across 4 workers");
}

/// On a denial nothing is charged: the `RateLimit` field's `r` of the limits that admitted the
/// request is what they have left, not what they would have had after charging it (#50 item
/// 15). Two of them, of costs 1 and 2, next to the one that refuses.
async fn a_denial_reports_what_the_others_have_left(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"tight\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"")
        + &limit("name = \"wide\"\nalgorithm = \"fixed_window\"\nlimit = 10\nperiod = \"1h\"\nsubject = \"ip\"\ncost = 2")
        + &limit("name = \"slide\"\nalgorithm = \"sliding_window\"\nlimit = 10\nperiod = \"1h\"\nsubject = \"ip\"");
    let (gw, _env) = gw_with(kind, "", &routes).await;
    let c = client();
    let res = c.get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let field = h(&res, "ratelimit");
    assert!(field.contains("\"wide\";r=8;"), "{kind:?}: {field}");
    assert!(field.contains("\"slide\";r=9;"), "{kind:?}: {field}");
    for _ in 0..2 {
        let res = c.get(gw.url("/api/x")).send().await.unwrap();
        assert_eq!(res.status(), 429);
        let field = h(&res, "ratelimit");
        assert!(field.starts_with("\"tight\";r=0;"), "{kind:?}: {field}");
        assert!(field.contains("\"wide\";r=8;"), "{kind:?}: {field}");
        assert!(field.contains("\"slide\";r=9;"), "{kind:?}: {field}");
    }
    assert_eq!(up.hits(), 1);
}
