//! Who is calling, precisely (issue #25), through the real binary on every store: subjects of
//! parts, IP prefixes, exemptions, access lists and a trusted real-IP header. The client
//! address comes from `X-Forwarded-For` sent by the test from 127.0.0.1, a trusted proxy.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;
use tollgate::consumers::{hash_key, hex};

on_every_store_and_cluster!(
    a_compound_subject_counts_each_combination,
    ipv6_clients_are_counted_by_their_network,
);

on_every_store!(
    compound_subjects_are_all_or_nothing,
    compound_subjects_are_exact_under_concurrency,
    a_missing_part_is_counted_by_address_or_refused,
    exempt_clients_skip_the_limit,
    access_lists_refuse_before_any_limit_is_charged,
    real_ip_header_is_believed_only_from_trusted_proxies,
    plan_limits_take_parts_and_consumers_can_be_exempt,
    explain_shows_parts_and_networks,
);

/// A gateway on `kind` trusting 127.0.0.1 for `X-Forwarded-For`, with `server_extra` in
/// `[server]` and `extra` tables before `[store]`.
async fn gw_with(kind: Kind, server_extra: &str, extra: &str, routes: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let cfg = config(&env.store, routes)
        .replacen(
            "[server]\n",
            &format!("[server]\ntrusted_proxies = [\"127.0.0.1/32\"]\n{server_extra}\n"),
            1,
        )
        .replacen("[store]\n", &format!("{extra}\n[store]\n"), 1);
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    (gw, env)
}

/// GET `path` from client `ip` with `headers`; the status.
async fn get(gw: &Gateway, path: &str, ip: &str, headers: &[(&str, &str)]) -> u16 {
    let mut r = client().get(gw.url(path)).header("x-forwarded-for", ip);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap().status().as_u16()
}

async fn top(gw: &Gateway, route: &str, limit: &str) -> Value {
    client()
        .get(gw.admin_url(&format!("/-/top?route={route}&limit={limit}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn a_compound_subject_counts_each_combination(kind: Kind) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-tenant-ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = [\"header:x-tenant\", \"ip\", \"method\"]");
    let (gw, _env) = gw_with(
        kind,
        "",
        &format!("[log]\naccess = \"{}\"", log.display()),
        &routes,
    )
    .await;
    let t = |v: &'static str| [("x-tenant", v)];
    // One count per (tenant, address, method).
    for want in [200, 200, 429, 429] {
        assert_eq!(
            get(&gw, "/api/x", "198.51.100.1", &t("tenant-secret-a")).await,
            want,
            "{kind:?}"
        );
    }
    assert_eq!(
        get(&gw, "/api/x", "198.51.100.2", &t("tenant-secret-a")).await,
        200
    );
    assert_eq!(
        get(&gw, "/api/x", "198.51.100.1", &t("tenant-secret-b")).await,
        200
    );
    let post = client()
        .post(gw.url("/api/x"))
        .header("x-forwarded-for", "198.51.100.1")
        .header("x-tenant", "tenant-secret-a")
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 200, "another method is another combination");
    assert_eq!(up.hits(), 5);
    // /-/top shows the parts: the tenant hashed, the address and method plain.
    let v = top(&gw, "api", "per-tenant-ip").await;
    let text = v.to_string();
    assert!(!text.contains("tenant-secret"), "{text}");
    let first = &v["top"][0];
    assert_eq!(first["subject"], "parts", "{text}");
    assert_eq!(first["denied"], 2, "{text}");
    assert_eq!(first["parts"][0]["part"], "header:x-tenant");
    assert_eq!(
        first["parts"][0]["key"].as_str().unwrap().len(),
        8,
        "{text}"
    );
    assert_eq!(first["parts"][1]["value"], "198.51.100.1/32", "{text}");
    assert_eq!(first["parts"][2]["value"], "GET", "{text}");
    // So does the access log line of a denial; never the raw value.
    let lines = log_lines(&log, 7).await;
    let denied: Vec<&Value> = lines.iter().filter(|l| l["status"] == 429).collect();
    assert_eq!(denied.len(), 2, "{lines:?}");
    assert_eq!(denied[0]["subject"][1]["value"], "198.51.100.1/32");
    assert_eq!(denied[0]["subject"][0]["part"], "header:x-tenant");
    assert!(lines
        .iter()
        .filter(|l| l["status"] == 200)
        .all(|l| l.get("subject").is_none()));
    assert!(!std::fs::read_to_string(&log)
        .unwrap()
        .contains("tenant-secret"));
}

async fn compound_subjects_are_all_or_nothing(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-combo\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = [\"header:x-tenant\", \"path\"]\non_missing = \"reject\"")
        + &limit("name = \"all\"\nalgorithm = \"sliding_log\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"global\"");
    let (gw, _env) = gw_with(kind, "", "", &routes).await;
    let mut a = Vec::new();
    for _ in 0..6 {
        a.push(get(&gw, "/api/a", "198.51.100.1", &[("x-tenant", "t1")]).await);
    }
    assert_eq!(a, [200, 200, 200, 429, 429, 429], "{kind:?}");
    // The three denials were not counted by "all": two more fit, then "all" denies.
    assert_eq!(
        get(&gw, "/api/b", "198.51.100.1", &[("x-tenant", "t1")]).await,
        200
    );
    assert_eq!(
        get(&gw, "/api/a", "198.51.100.1", &[("x-tenant", "t2")]).await,
        200
    );
    assert_eq!(
        get(&gw, "/api/c", "198.51.100.1", &[("x-tenant", "t3")]).await,
        429
    );
    // t3's denial by "all" did not use t3's /api/c allowance: the combination still has 3.
    assert_eq!(up.hits(), 5);
    let m = gw.metrics().await;
    assert_eq!(
        decisions(&m, "api", "per-combo", "limited"),
        Some(3.0),
        "{m}"
    );
    assert_eq!(decisions(&m, "api", "all", "limited"), Some(1.0), "{m}");
}

async fn compound_subjects_are_exact_under_concurrency(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"combo\"\nalgorithm = \"gcra\"\nlimit = 20\nperiod = \"1h\"\nburst = 20\nsubject = [\"header:x-tenant\", \"ip\"]");
    let (gw, _env) = gw_with(kind, "workers = 4", "", &routes).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let url = gw.url("/api/x");
        // Two combinations, spread over fresh connections (and so over the workers); each
        // request from another address of one /64 (the `ip` part is the network).
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        let ip = format!("2001:db8::{:x}", i + 1);
        tasks.push(tokio::spawn(async move {
            let c = reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            let s = c
                .get(url)
                .header("x-forwarded-for", ip)
                .header("x-tenant", tenant)
                .send()
                .await
                .map(|r| r.status().as_u16());
            (tenant, s)
        }));
    }
    let (mut a, mut b) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            ("a", Ok(200)) => a += 1,
            ("b", Ok(200)) => b += 1,
            (_, Ok(429)) => {}
            (_, s) => panic!("{kind:?}: {s:?}"),
        }
    }
    assert_eq!((a, b), (20, 20), "{kind:?}");
}

async fn ipv6_clients_are_counted_by_their_network(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-net\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\"")
        + &route("host", "/host", &up.url(), "")
        + &limit("name = \"per-host\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\"\nipv6_prefix = 128\nipv4_prefix = 32");
    // Server-wide: IPv4 by /24, IPv6 by the default /64.
    let (gw, _env) = gw_with(kind, "ipv4_prefix = 24", "", &routes).await;
    // Two addresses of one /64 share a bucket (a host cannot rotate its way to fresh ones)…
    assert_eq!(
        get(&gw, "/api/x", "2001:db8:0:1::1", &[]).await,
        200,
        "{kind:?}"
    );
    assert_eq!(get(&gw, "/api/x", "2001:db8:0:1:ffff::2", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "2001:db8:0:1::3", &[]).await, 429);
    // …another /64 has its own.
    assert_eq!(get(&gw, "/api/x", "2001:db8:0:2::1", &[]).await, 200);
    // IPv4 by /24, and an IPv4-mapped IPv6 address is that IPv4 address.
    assert_eq!(get(&gw, "/api/x", "198.51.100.1", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "::ffff:198.51.100.77", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "198.51.100.200", &[]).await, 429);
    assert_eq!(get(&gw, "/api/x", "198.51.101.1", &[]).await, 200);
    // A limit with its own prefixes counts whole addresses again.
    for ip in ["2001:db8:0:1::1", "2001:db8:0:1::2"] {
        assert_eq!(get(&gw, "/host/x", ip, &[]).await, 200);
        assert_eq!(get(&gw, "/host/x", ip, &[]).await, 200);
        assert_eq!(get(&gw, "/host/x", ip, &[]).await, 429, "{ip}");
    }
    // /-/top names the network.
    let v = top(&gw, "api", "per-net").await;
    let ips: Vec<&str> = v["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ip"].as_str().unwrap())
        .collect();
    assert!(ips.contains(&"2001:db8:0:1::/64"), "{v}");
    assert!(ips.contains(&"198.51.100.0/24"), "{v}");
}

async fn a_missing_part_is_counted_by_address_or_refused(kind: Kind) {
    let up = upstream().await;
    let routes = route("ip", "/ip", &up.url(), "")
        + &limit("name = \"combo\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = [\"cookie:sid\", \"host\"]")
        + &route("rj", "/rj", &up.url(), "")
        + &limit("name = \"combo\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = [\"method\", \"cookie:sid\"]\non_missing = \"reject\"");
    let (gw, _env) = gw_with(kind, "", "", &routes).await;
    let sid = [("cookie", "theme=dark; sid=abc")];
    assert_eq!(
        get(&gw, "/ip/x", "198.51.100.1", &sid).await,
        200,
        "{kind:?}"
    );
    assert_eq!(get(&gw, "/ip/x", "198.51.100.9", &sid).await, 429);
    // Without the cookie, the address in its place: per address.
    assert_eq!(get(&gw, "/ip/x", "198.51.100.1", &[]).await, 200);
    assert_eq!(get(&gw, "/ip/x", "198.51.100.1", &[]).await, 429);
    assert_eq!(get(&gw, "/ip/x", "198.51.100.2", &[]).await, 200);
    // The cookie twice: 400, charged to neither.
    let twice = [("cookie", "sid=abc; sid=xyz")];
    assert_eq!(get(&gw, "/rj/x", "198.51.100.1", &twice).await, 400);
    // on_missing = "reject": 401 naming the part, never forwarded.
    let res = client()
        .get(gw.url("/rj/x"))
        .header("x-forwarded-for", "198.51.100.1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let body: Value = res.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("cookie:sid"),
        "{body}"
    );
    assert_eq!(get(&gw, "/rj/x", "198.51.100.1", &sid).await, 200);
    assert_eq!(up.hits(), 4);
}

async fn exempt_clients_skip_the_limit(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"\nexempt = [\"10.0.0.0/8\", \"2001:db8:ffff::/48\"]")
        + &limit("name = \"all\"\nalgorithm = \"fixed_window\"\nlimit = 6\nperiod = \"1h\"\nsubject = \"global\"");
    let (gw, _env) = gw_with(kind, "", "", &routes).await;
    for _ in 0..3 {
        assert_eq!(get(&gw, "/api/x", "10.1.2.3", &[]).await, 200, "{kind:?}");
    }
    assert_eq!(get(&gw, "/api/x", "2001:db8:ffff:1::1", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "198.51.100.1", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "198.51.100.1", &[]).await, 429);
    // Exempt from one limit, not from the others: "all" still counts them.
    assert_eq!(get(&gw, "/api/x", "10.1.2.3", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "10.1.2.3", &[]).await, 429);
    let m = gw.metrics().await;
    assert_eq!(decisions(&m, "api", "per-ip", "exempt"), Some(6.0), "{m}");
    assert_eq!(decisions(&m, "api", "per-ip", "allowed"), Some(1.0), "{m}");
    assert_eq!(decisions(&m, "api", "all", "allowed"), Some(6.0), "{m}");
}

async fn access_lists_refuse_before_any_limit_is_charged(kind: Kind) {
    let up = upstream().await;
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "allow = [\"198.51.100.0/24\", \"2001:db8::/32\"]\ndeny = [\"198.51.100.66\"]",
    ) + &limit("name = \"all\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"global\"")
        + &route("open", "/open", &up.url(), "deny = [\"203.0.113.0/24\"]");
    let (gw, _env) = gw_with(kind, "", "", &routes).await;
    for ip in ["203.0.113.1", "198.51.100.66", "192.0.2.1", "203.0.113.2"] {
        let res = client()
            .get(gw.url("/api/x"))
            .header("x-forwarded-for", ip)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 403, "{kind:?} {ip}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["status"], 403);
    }
    // None of the refusals used the route's limit.
    assert_eq!(get(&gw, "/api/x", "198.51.100.1", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "2001:db8::5", &[]).await, 200);
    assert_eq!(get(&gw, "/api/x", "198.51.100.1", &[]).await, 429);
    assert_eq!(get(&gw, "/open/x", "192.0.2.1", &[]).await, 200);
    assert_eq!(get(&gw, "/open/x", "203.0.113.9", &[]).await, 403);
    assert_eq!(up.hits(), 3);
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_access_denied_total{route=\"api\"}"),
        Some(4.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "tollgate_access_denied_total{route=\"open\"}"),
        Some(1.0)
    );
    assert_eq!(decisions(&m, "api", "all", "allowed"), Some(2.0), "{m}");
}

async fn real_ip_header_is_believed_only_from_trusted_proxies(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"");
    // Trusted: 127.0.0.1 (the test).
    let (gw, _env) = gw_with(kind, "real_ip_header = \"CF-Connecting-IP\"", "", &routes).await;
    let send = |cf: &'static str, xff: &'static str| {
        let r = client()
            .get(gw.url("/api/x"))
            .header("cf-connecting-ip", cf)
            .header("x-forwarded-for", xff);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    // The header names the client; X-Forwarded-For does not change who it is.
    assert_eq!(send("203.0.113.7", "198.51.100.1").await, 200, "{kind:?}");
    assert_eq!(send("203.0.113.7", "198.51.100.2").await, 429);
    assert_eq!(send("203.0.113.8", "198.51.100.2").await, 200);
    // Not an address: X-Forwarded-For as before.
    assert_eq!(send("garbage", "198.51.100.3").await, 200);
    assert_eq!(send("garbage", "198.51.100.3").await, 429);

    // Without trusted proxies the header is ignored: every request is 127.0.0.1's.
    let env = store_env(kind);
    let cfg = config(&env.store, &routes).replacen(
        "[server]\n",
        "[server]\nreal_ip_header = \"CF-Connecting-IP\"\n",
        1,
    );
    let gw2 = gateway(&cfg);
    wait_ready(&gw2).await;
    let res = |cf: &'static str| {
        let r = client()
            .get(gw2.url("/api/x"))
            .header("cf-connecting-ip", cf);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(res("203.0.113.50").await, 200);
    assert_eq!(
        res("203.0.113.51").await,
        429,
        "a spoofed header bought a bucket"
    );
}

/// (name, plan, key) entries as a consumers file in `dir`; its path.
fn consumers_file(dir: &Path, consumers: &[(&str, &str, &str)]) -> String {
    let text: String = consumers
        .iter()
        .map(|(name, plan, key)| {
            format!(
                "[[consumer]]\nname = \"{name}\"\nplan = \"{plan}\"\nkey_sha256 = \"{}\"\n\n",
                hex(&hash_key(key.as_bytes()))
            )
        })
        .collect();
    let path = dir.join("consumers.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn plan_limits_take_parts_and_consumers_can_be_exempt(kind: Kind) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = consumers_file(
        dir.path(),
        &[("acme", "free", "key-acme"), ("ops", "free", "key-ops")],
    );
    let extra = format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = \"{file}\"\n\n[[plans]]\nname = \"free\"\n\
         [[plans.limits]]\nname = \"per-path\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = [\"path\"]\n"
    );
    let routes = route("api", "/api", &up.url(), "consumers = true")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = [\"consumer\", \"ip\"]\nexempt = [\"consumer:ops\"]");
    let (gw, _env) = gw_with(kind, "", &extra, &routes).await;
    let key = |k: &'static str| [("x-api-key", k)];
    // Per consumer and path: two on /api/a, two more on /api/b.
    assert_eq!(
        get(&gw, "/api/a", "198.51.100.1", &key("key-acme")).await,
        200,
        "{kind:?}"
    );
    assert_eq!(
        get(&gw, "/api/a", "198.51.100.1", &key("key-acme")).await,
        200
    );
    assert_eq!(
        get(&gw, "/api/a", "198.51.100.1", &key("key-acme")).await,
        429
    );
    assert_eq!(
        get(&gw, "/api/b", "198.51.100.1", &key("key-acme")).await,
        200
    );
    // acme's per-(consumer, ip) route limit (3) is spent now; from another address it is not.
    assert_eq!(
        get(&gw, "/api/c", "198.51.100.1", &key("key-acme")).await,
        429
    );
    assert_eq!(
        get(&gw, "/api/c", "198.51.100.2", &key("key-acme")).await,
        200
    );
    // ops is exempt from the route's limit, not from its plan's.
    for p in ["/api/a", "/api/a", "/api/b", "/api/b", "/api/c"] {
        assert_eq!(
            get(&gw, p, "198.51.100.1", &key("key-ops")).await,
            200,
            "{p}"
        );
    }
    assert_eq!(
        get(&gw, "/api/a", "198.51.100.1", &key("key-ops")).await,
        429
    );
    let m = gw.metrics().await;
    assert_eq!(decisions(&m, "api", "per-ip", "exempt"), Some(6.0), "{m}");
}

/// Waits until the file at `path` has at least `n` lines; returns them parsed as JSON.
async fn log_lines(path: &Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n || Instant::now() > deadline {
            return text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/-/explain` derives the same combination the gateway counts, and names networks.
async fn explain_shows_parts_and_networks(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"combo\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = [\"header:x-tenant\", \"ip\"]")
        + &limit("name = \"per-net\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"");
    let (gw, _env) = gw_with(kind, "", "", &routes).await;
    assert_eq!(
        get(&gw, "/api/x", "2001:db8::1", &[("x-tenant", "t")]).await,
        200
    );
    let explain = |q: &'static str| {
        let url = gw.admin_url(&format!("/-/explain?{q}"));
        async move {
            client()
                .get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // Another address of the same /64: the same combination, one request already counted.
    let v = explain("path=/api/x&ip=2001:db8::2&header.X-Tenant=t").await;
    assert_eq!(v["limits"][0]["subject"], "parts", "{v}");
    assert_eq!(v["limits"][0]["remaining"], 4, "{kind:?} {v}");
    assert_eq!(v["limits"][1]["subject"], "ip", "{v}");
    assert_eq!(v["limits"][1]["ip"], "2001:db8::/64", "{v}");
    assert_eq!(v["limits"][1]["remaining"], 4, "{v}");
    let v = explain("path=/api/x&ip=2001:db8::2&header.X-Tenant=u").await;
    assert_eq!(v["limits"][0]["remaining"], 5, "{v}");
    // Without ip: the answer needs it.
    let res = client()
        .get(gw.admin_url("/-/explain?path=/api/x&header.X-Tenant=t"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
}

/// GET `path` with raw `headers` (no X-Forwarded-For of the helper's); the status.
async fn get_raw(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut r = client().get(gw.url(path));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap().status().as_u16()
}

/// Issue #34 item 15: a trusted proxy's forwarded header the client address cannot be derived
/// from (junk, more than 64 hops, `010.1.1.1`, `for=unknown`) never makes the client the proxy:
/// such a request matches no `allow` list and no exemption (fail closed).
#[tokio::test(flavor = "multi_thread")]
async fn an_underivable_client_matches_no_allow_list_or_exemption() {
    let up = upstream().await;
    let routes = route("inside", "/inside", &up.url(), "allow = [\"127.0.0.1/32\"]")
        + &route("open", "/open", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"\nexempt = [\"127.0.0.1/32\"]");
    let many = vec!["198.51.100.1"; 65].join(", ");
    for (family, header, value) in [
        ("", "x-forwarded-for", "junk"),
        ("", "x-forwarded-for", many.as_str()),
        ("", "x-forwarded-for", "010.1.1.1"),
        ("", "x-forwarded-for", "198.51.100.1, junk"),
        (
            "forwarded_header = \"forwarded\"",
            "forwarded",
            "for=unknown",
        ),
        (
            "forwarded_header = \"forwarded\"",
            "forwarded",
            "for=_hidden",
        ),
    ] {
        let (gw, _env) = gw_with(Kind::Memory, family, "", &routes).await;
        assert_eq!(
            get_raw(&gw, "/inside/x", &[(header, value)]).await,
            403,
            "{header}: {value} passed the proxy's allow list"
        );
        assert_eq!(get_raw(&gw, "/open/x", &[(header, value)]).await, 200);
        assert_eq!(
            get_raw(&gw, "/open/x", &[(header, value)]).await,
            429,
            "{header}: {value} was exempt as the proxy"
        );
        // The proxy's own request (no forwarded header) is still the proxy's.
        assert_eq!(get_raw(&gw, "/inside/x", &[]).await, 200);
    }
}

/// Issue #34 item 16: access-list entries are normalised as client addresses are: an
/// IPv4-mapped IPv6 entry is the IPv4 address (or network) it maps.
#[tokio::test(flavor = "multi_thread")]
async fn v4_mapped_entries_match_v4_clients() {
    let up = upstream().await;
    let routes = route(
        "api",
        "/api",
        &up.url(),
        "deny = [\"::ffff:198.51.100.2\", \"::ffff:203.0.113.0/120\"]",
    );
    let (gw, _env) = gw_with(Kind::Memory, "", "", &routes).await;
    assert_eq!(get(&gw, "/api/x", "198.51.100.2", &[]).await, 403);
    assert_eq!(get(&gw, "/api/x", "203.0.113.77", &[]).await, 403);
    assert_eq!(get(&gw, "/api/x", "198.51.100.3", &[]).await, 200);
}

/// Issue #34 item 17: one header family decides the client address: by default
/// `X-Forwarded-For` (a `Forwarded` header never does), with `forwarded_header = "forwarded"`
/// RFC 7239's `Forwarded` (a client's `X-Forwarded-For` never does).
#[tokio::test(flavor = "multi_thread")]
async fn one_header_family_decides_the_client() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"");
    let (gw, _env) = gw_with(
        Kind::Memory,
        "forwarded_header = \"forwarded\"",
        "",
        &routes,
    )
    .await;
    // The proxy speaks RFC 7239; the client adds X-Forwarded-For of its own each time.
    for (i, forged) in ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
        .iter()
        .enumerate()
    {
        let want = if i == 0 { 200 } else { 429 };
        assert_eq!(
            get_raw(
                &gw,
                "/api/x",
                &[
                    ("forwarded", "for=198.51.100.7"),
                    ("x-forwarded-for", forged)
                ]
            )
            .await,
            want,
            "X-Forwarded-For {forged} bought a bucket"
        );
    }
    assert_eq!(
        get_raw(&gw, "/api/x", &[("forwarded", "for=198.51.100.8")]).await,
        200
    );
    // By default a Forwarded header decides nothing: the XFF walk only.
    let (gw, _env) = gw_with(Kind::Memory, "", "", &routes).await;
    assert_eq!(
        get_raw(
            &gw,
            "/api/x",
            &[
                ("forwarded", "for=198.51.100.9"),
                ("x-forwarded-for", "198.51.100.1")
            ]
        )
        .await,
        200
    );
    assert_eq!(
        get_raw(
            &gw,
            "/api/x",
            &[
                ("forwarded", "for=198.51.100.10"),
                ("x-forwarded-for", "198.51.100.1")
            ]
        )
        .await,
        429,
        "a Forwarded header changed who the client is"
    );
}

/// Issue #34 item 21: `path` and `query:` parts are normalised as the route matches and as
/// upstreams read them: a `case_sensitive = false` route counts `/API/X` and `/api/x` as one
/// path; `+` and `%20` in a query value are one space.
#[tokio::test(flavor = "multi_thread")]
async fn path_and_query_parts_are_normalised() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "case_sensitive = false")
        + &limit("name = \"per-path\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"path\"")
        + &route("q", "/q", &up.url(), "")
        + &limit("name = \"per-model\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"query:model\"\non_missing = \"reject\"");
    let (gw, _env) = gw_with(Kind::Memory, "", "", &routes).await;
    assert_eq!(get(&gw, "/api/Items", "198.51.100.1", &[]).await, 200);
    assert_eq!(
        get(&gw, "/API/items", "198.51.100.1", &[]).await,
        429,
        "another case of one path bought a bucket"
    );
    assert_eq!(
        get(&gw, "/q/x?model=big+one", "198.51.100.1", &[]).await,
        200
    );
    assert_eq!(
        get(&gw, "/q/x?model=big%20one", "198.51.100.1", &[]).await,
        429,
        "%20 and + are one space to the upstream"
    );
}
