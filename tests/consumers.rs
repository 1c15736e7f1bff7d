//! API products through the real binary: consumers found by their key, their plan's limits
//! (shared across routes or per route), unknown keys, the consumers file on reload, calendar
//! quotas as a client sees them, and the draft -11 RateLimit fields for every algorithm.

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use support::*;
use tollgate::consumers::{hash_key, hex};
use tollgate::limiter::SubjectDigest;

on_every_store_and_cluster!(
    two_consumers_on_two_plans,
    a_plan_limit_is_shared_across_routes_unless_scoped
);

on_every_store!(
    unknown_keys_get_401_after_the_routes_own_limits,
    unknown_keys_on_a_named_plan_count_per_address,
    the_consumers_file_reloads,
    a_daily_quota_answers_until_utc_midnight,
    ratelimit_fields_of_draft_11_for_every_algorithm,
);

/// A consumers file in a directory of its own (the gateway's config names it by absolute path).
struct ConsumersFile {
    dir: tempfile::TempDir,
}

impl ConsumersFile {
    fn new(consumers: &[(&str, &str, &str)]) -> ConsumersFile {
        let f = ConsumersFile {
            dir: tempfile::tempdir().unwrap(),
        };
        f.write(consumers);
        f
    }

    fn path(&self) -> String {
        self.dir.path().join("consumers.toml").display().to_string()
    }

    /// Writes (name, plan, key) entries.
    fn write(&self, consumers: &[(&str, &str, &str)]) {
        let text: String = consumers
            .iter()
            .map(|(name, plan, key)| {
                format!(
                    "[[consumer]]\nname = \"{name}\"\nplan = \"{plan}\"\nkey_sha256 = \"{}\"\n\n",
                    hex(&hash_key(key.as_bytes()))
                )
            })
            .collect();
        std::fs::write(self.path(), text).unwrap();
    }
}

/// `[consumers]` reading `X-Api-Key` (plus `extra` lines), then `plans` verbatim.
fn consumers_toml(file: &ConsumersFile, extra: &str, plans: &str) -> String {
    format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = \"{}\"\n{extra}\n\n{plans}\n",
        file.path()
    )
}

/// A `[[plans]]` entry with `limits` (each a `[[plans.limits]]` body).
fn plan(name: &str, limits: &[&str]) -> String {
    let mut s = format!("[[plans]]\nname = \"{name}\"\n");
    for l in limits {
        s.push_str(&format!("[[plans.limits]]\n{l}\n"));
    }
    s
}

async fn start(kind: Kind, top: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let gw = gateway(&config(&env.store, top));
    wait_ready(&gw).await;
    (gw, env)
}

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn pk(subject: SubjectDigest) -> String {
    let mut s = String::new();
    subject.write_sf_bytes(&mut s);
    s
}

fn consumer_pk(name: &str) -> String {
    pk(SubjectDigest::of(b'c', name.as_bytes()))
}

fn ip_pk() -> String {
    pk(tollgate::subject::ip_digest("127.0.0.1".parse().unwrap()))
}

async fn get(c: &reqwest::Client, url: String, key: Option<&str>) -> reqwest::Response {
    let mut r = c.get(url);
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    r.send().await.unwrap()
}

async fn statuses(c: &reqwest::Client, url: &str, key: Option<&str>, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(c, url.to_owned(), key).await.status().as_u16());
    }
    out
}

fn hourly(name: &str, limit: u64) -> String {
    format!("name = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nperiod = \"1h\"")
}

async fn two_consumers_on_two_plans(kind: Kind) {
    let up = upstream().await;
    let file = ConsumersFile::new(&[
        ("acme", "gold", "acme-key"),
        ("globex", "free", "globex-key"),
    ]);
    let top = consumers_toml(
        &file,
        "",
        &(plan("free", &[&hourly("per-hour", 2)]) + &plan("gold", &[&hourly("per-hour", 4)])),
    ) + &route("api", "/api", &up.url(), "consumers = true");
    let (gw, _env) = start(kind, &top).await;
    let c = client();
    let url = gw.url("/api/x");

    // A spoofed X-Consumer is replaced by the gateway's.
    let res = c
        .get(&url)
        .header("x-api-key", "acme-key")
        .header("x-consumer", "globex")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        h(&res, "ratelimit-policy"),
        format!("\"per-hour\";q=4;w=3600;pk={}", consumer_pk("acme"))
    );
    assert!(
        h(&res, "ratelimit").starts_with("\"per-hour\";r=3;t="),
        "{}",
        h(&res, "ratelimit")
    );
    assert!(h(&res, "ratelimit").ends_with(&format!(";pk={}", consumer_pk("acme"))));
    assert_eq!(
        statuses(&c, &url, Some("acme-key"), 4).await,
        [200, 200, 200, 429]
    );
    assert_eq!(
        statuses(&c, &url, Some("globex-key"), 3).await,
        [200, 200, 429]
    );
    let res = get(&c, url.clone(), Some("globex-key")).await;
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["violated-policies"], serde_json::json!(["per-hour"]));

    let seen = up.seen();
    assert_eq!(seen.len(), 6);
    let consumers: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["x-consumer"].to_str().unwrap())
        .collect();
    assert_eq!(
        consumers,
        ["acme", "acme", "acme", "acme", "globex", "globex"]
    );
    // Without strip_key the key is forwarded.
    assert_eq!(seen[0].headers["x-api-key"], "acme-key");

    let m = gw.metrics().await;
    let d = |p: &str, decision: &str| plan_decisions(&m, "api", "per-hour", p, decision);
    assert_eq!(d("gold", "allowed"), Some(4.0));
    assert_eq!(d("gold", "limited"), Some(1.0));
    assert_eq!(d("free", "allowed"), Some(2.0));
    assert_eq!(d("free", "limited"), Some(2.0));
    assert_eq!(metric(&m, "tollgate_consumers"), Some(2.0));
    assert!(!m.contains("acme"), "a consumer name in the metrics");

    // /-/explain finds the consumer and its plan's limits; /-/top lists them.
    let e: serde_json::Value = c
        .get(gw.admin_url("/-/explain?path=/api/x&header.X-Api-Key=acme-key"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(e["consumer"], "acme", "{e}");
    assert_eq!(e["limits"][0]["plan"], "gold", "{e}");
    assert_eq!(e["limits"][0]["subject"], "consumer", "{e}");
    assert_eq!(e["limits"][0]["would_admit"], false, "{e}");
    let e: serde_json::Value = c
        .get(gw.admin_url("/-/explain?path=/api/x&header.X-Api-Key=nobody"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(e["reason"].as_str().unwrap().contains("401"), "{e}");
    let t: serde_json::Value = c
        .get(gw.admin_url("/-/top?route=api"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let denied: u64 = t["limits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["plan"] == "free")
        .map(|l| l["top"][0]["denied"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(denied, 2, "{t}");
}

async fn a_plan_limit_is_shared_across_routes_unless_scoped(kind: Kind) {
    let up = upstream().await;
    let file = ConsumersFile::new(&[("acme", "p", "k")]);
    let top = consumers_toml(
        &file,
        "",
        &plan(
            "p",
            &[
                &hourly("shared", 3),
                &(hourly("local", 2) + "\nscope = \"route\""),
            ],
        ),
    ) + &route("a", "/a", &up.url(), "consumers = true")
        + &route("b", "/b", &up.url(), "consumers = true");
    let (gw, _env) = start(kind, &top).await;
    let c = client();
    // Route a: its own "local" allowance (2) runs out first.
    assert_eq!(
        statuses(&c, &gw.url("/a"), Some("k"), 3).await,
        [200, 200, 429]
    );
    // Route b has its own "local" count but shares "shared" (3): one more request fits.
    let res = get(&c, gw.url("/b"), Some("k")).await;
    assert_eq!(res.status(), 200);
    let res = get(&c, gw.url("/b"), Some("k")).await;
    assert_eq!(res.status(), 429);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["shared"]));
    assert_eq!(up.hits(), 3);
}

async fn unknown_keys_get_401_after_the_routes_own_limits(kind: Kind) {
    let up = upstream().await;
    let file = ConsumersFile::new(&[("acme", "free", "good")]);
    let top = consumers_toml(&file, "on_unknown = \"reject\"", &plan("free", &[&hourly("quota", 100)]))
        + &route("api", "/api", &up.url(), "consumers = true")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 4\nperiod = \"1h\"\nsubject = \"ip\"");
    let (gw, _env) = start(kind, &top).await;
    let c = client();
    let url = gw.url("/api/x");
    assert_eq!(get(&c, url.clone(), Some("good")).await.status(), 200);
    let res = get(&c, url.clone(), Some("guess-1")).await;
    assert_eq!(res.status(), 401);
    assert_eq!(h(&res, "content-type"), "application/problem+json");
    assert!(h(&res, "www-authenticate").starts_with("Key"));
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 401);
    assert!(
        body["detail"].as_str().unwrap().contains("x-api-key"),
        "{body}"
    );
    // A missing key is unknown too; both were charged to the address's limit.
    assert_eq!(get(&c, url.clone(), None).await.status(), 401);
    assert_eq!(get(&c, url.clone(), Some("guess-2")).await.status(), 401);
    // The address's 4 are spent: key guessing is throttled like any other traffic.
    assert_eq!(statuses(&c, &url, Some("guess-3"), 2).await, [429, 429]);
    assert_eq!(up.hits(), 1, "an unknown key never reaches the upstream");
    // A key sent twice is refused, as for limit subjects.
    let res = c
        .get(&url)
        .header("x-api-key", "good")
        .header("x-api-key", "other")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
}

async fn unknown_keys_on_a_named_plan_count_per_address(kind: Kind) {
    let up = upstream().await;
    let file = ConsumersFile::new(&[("acme", "gold", "good")]);
    let log = file.dir.path().join("access.log");
    let top = format!("[log]\naccess = \"{}\"\n\n", log.display())
        + &consumers_toml(
            &file,
            "on_unknown = \"anonymous\"\nstrip_key = true",
            &(plan("anonymous", &[&hourly("quota", 2)]) + &plan("gold", &[&hourly("quota", 100)])),
        )
        + &route("api", "/api", &up.url(), "consumers = true");
    let (gw, _env) = start(kind, &top).await;
    let c = client();
    let url = gw.url("/api/x");
    // An unknown key and no key count together, per address, on the "anonymous" plan.
    let res = c
        .get(&url)
        .header("x-api-key", "who-knows")
        .header("x-consumer", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(h(&res, "ratelimit-policy").ends_with(&format!(";pk={}", ip_pk())));
    assert_eq!(get(&c, url.clone(), None).await.status(), 200);
    assert_eq!(get(&c, url.clone(), Some("another")).await.status(), 429);
    // A known key has its own plan.
    assert_eq!(get(&c, url.clone(), Some("good")).await.status(), 200);
    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    assert!(
        seen[0].headers.get("x-consumer").is_none(),
        "no consumer, and the client's X-Consumer is dropped"
    );
    assert_eq!(seen[2].headers["x-consumer"], "acme");
    assert!(
        seen.iter().all(|s| s.headers.get("x-api-key").is_none()),
        "strip_key removes the key"
    );
    let m = gw.metrics().await;
    assert_eq!(
        plan_decisions(&m, "api", "quota", "anonymous", "limited"),
        Some(1.0)
    );
    // The access log names the consumer of a known key only.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let lines: Vec<serde_json::Value> = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() >= 4 || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let consumers: Vec<&serde_json::Value> = lines.iter().map(|l| &l["consumer"]).collect();
    assert_eq!(
        consumers,
        [
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &serde_json::json!("acme")
        ]
    );
}

async fn the_consumers_file_reloads(kind: Kind) {
    let up = upstream().await;
    let file = ConsumersFile::new(&[("acme", "free", "k1")]);
    let top = consumers_toml(
        &file,
        "",
        &(plan("free", &[&hourly("quota", 1)]) + &plan("gold", &[&hourly("quota", 3)])),
    ) + &route("api", "/api", &up.url(), "consumers = true");
    let (gw, _env) = start(kind, &top).await;
    let c = client();
    let url = gw.url("/api/x");
    assert_eq!(statuses(&c, &url, Some("k1"), 2).await, [200, 429]);
    assert_eq!(get(&c, url.clone(), Some("k2")).await.status(), 401);

    // acme moves to gold; initech arrives.
    file.write(&[("acme", "gold", "k1"), ("initech", "free", "k2")]);
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(statuses(&c, &url, Some("k1"), 1).await, [200]);
    assert_eq!(statuses(&c, &url, Some("k2"), 2).await, [200, 429]);
    assert_eq!(metric(&gw.metrics().await, "tollgate_consumers"), Some(2.0));

    // A bad file (an unknown plan on line 8) is refused; the previous consumers stay.
    std::fs::write(
        file.path(),
        format!(
            "[[consumer]]\nname = \"acme\"\nplan = \"gold\"\nkey_sha256 = \"{}\"\n\n[[consumer]]\nname = \"x\"\nplan = \"platinum\"\nkey_sha256 = \"{}\"\n",
            hex(&hash_key(b"k1")),
            hex(&hash_key(b"k3"))
        ),
    )
    .unwrap();
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 422);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("line 8") && text.contains("platinum"),
        "{text}"
    );
    assert!(gw.logged("line 8").await, "{}", gw.logs());
    assert_eq!(statuses(&c, &url, Some("k1"), 1).await, [200]);
    assert_eq!(get(&c, url.clone(), Some("k3")).await.status(), 401);
    assert_eq!(metric(&gw.metrics().await, "tollgate_consumers"), Some(2.0));
}

async fn a_daily_quota_answers_until_utc_midnight(kind: Kind) {
    let up = upstream().await;
    let file = ConsumersFile::new(&[("acme", "free", "k")]);
    let top = consumers_toml(
        &file,
        "",
        &plan(
            "free",
            &["name = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 2\ncalendar = \"day\""],
        ),
    ) + &route("api", "/api", &up.url(), "consumers = true");
    let (gw, _env) = start(kind, &top).await;
    let c = client();
    let url = gw.url("/api/x");
    let res = get(&c, url.clone(), Some("k")).await;
    assert_eq!(res.status(), 200);
    assert!(h(&res, "ratelimit-policy").starts_with("\"daily\";q=2;w=86400;pk="));
    assert_eq!(get(&c, url.clone(), Some("k")).await.status(), 200);
    let res = get(&c, url.clone(), Some("k")).await;
    assert_eq!(res.status(), 429);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_midnight = 86_400 - now % 86_400;
    let retry: u64 = h(&res, "retry-after").parse().unwrap();
    assert!(
        retry.abs_diff(to_midnight) <= 5,
        "Retry-After {retry}, {to_midnight} s to UTC midnight"
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["violated-policies"], serde_json::json!(["daily"]));
}

async fn ratelimit_fields_of_draft_11_for_every_algorithm(kind: Kind) {
    let up = upstream().await;
    // (algorithm, extra keys, expected `t` after one request: None = only checked positive)
    let cases: [(&str, &str, Option<u64>); 6] = [
        ("fixed_window", "limit = 5\nperiod = \"1h\"", None),
        ("sliding_window", "limit = 5\nperiod = \"1h\"", None),
        ("sliding_log", "limit = 5\nperiod = \"1h\"", Some(3600)),
        // One unit per second: the next one arrives within 1 s.
        (
            "token_bucket",
            "limit = 10\nperiod = \"10s\"\nburst = 5",
            Some(1),
        ),
        ("gcra", "limit = 10\nperiod = \"10s\"\nburst = 5", Some(1)),
        (
            "leaky_bucket",
            "limit = 10\nperiod = \"10s\"\nburst = 3",
            Some(1),
        ),
    ];
    let mut routes = String::new();
    for (alg, extra, _) in &cases {
        routes += &route(alg, &format!("/{alg}"), &up.url(), "");
        routes += &limit(&format!(
            "name = \"{alg}\"\nalgorithm = \"{alg}\"\n{extra}\nsubject = \"ip\""
        ));
    }
    let (gw, _env) = start(kind, &routes).await;
    let c = client();
    for (alg, _, t) in &cases {
        let res = get(&c, gw.url(&format!("/{alg}")), None).await;
        assert_eq!(res.status(), 200, "{alg}");
        let field = h(&res, "ratelimit");
        let policy = h(&res, "ratelimit-policy");
        assert!(policy.starts_with(&format!("\"{alg}\";q=")), "{policy}");
        assert!(policy.ends_with(&format!(";pk={}", ip_pk())), "{policy}");
        let (head, pk_part) = field.split_once(";pk=").unwrap();
        assert_eq!(
            format!(":{}", pk_part.trim_start_matches(':')),
            ip_pk(),
            "{field}"
        );
        let got: u64 = head.rsplit_once(";t=").unwrap().1.parse().unwrap();
        match t {
            Some(t) => assert_eq!(got, *t, "{alg}: {field}"),
            None => assert!(got > 0, "{alg}: {field}"),
        }
        if *alg == "fixed_window" {
            assert_eq!(got.to_string(), h(&res, "x-ratelimit-reset"));
        }
    }
    // Denied: `t` is the time until the request would be admitted, as Retry-After.
    let url = gw.url("/gcra");
    for _ in 0..4 {
        get(&c, url.clone(), None).await;
    }
    let res = get(&c, url, None).await;
    assert_eq!(res.status(), 429);
    let retry = h(&res, "retry-after");
    assert!(
        h(&res, "ratelimit").contains(&format!(";r=0;t={retry};")),
        "{} vs Retry-After {retry}",
        h(&res, "ratelimit")
    );
}

/// Resident memory of this process in bytes (Linux `/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// 100,000 consumers load well within a second and cost little memory. The bound is generous
/// because tests run unoptimised (a debug build parses TOML several times slower); the release
/// numbers are in the README.
#[test]
fn a_hundred_thousand_consumers_load_quickly_and_compactly() {
    let n = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumers.toml");
    let mut text = String::with_capacity(n * 120);
    for i in 0..n {
        let plan = if i % 10 == 0 { "gold" } else { "free" };
        text.push_str(&format!(
            "[[consumer]]\nname = \"customer-{i:06}\"\nplan = \"{plan}\"\nkey_sha256 = \"{}\"\n\n",
            hex(&hash_key(format!("key-{i}").as_bytes()))
        ));
    }
    std::fs::write(&path, &text).unwrap();
    drop(text);
    let before = rss();
    let t0 = std::time::Instant::now();
    let table = tollgate::consumers::ConsumerTable::load(&path, &["free", "gold"]).unwrap();
    let took = t0.elapsed();
    let grown = rss().saturating_sub(before);
    assert_eq!(table.len(), n);
    let c = table.get(&hash_key(b"key-99990")).unwrap();
    assert_eq!((&*c.name, c.plan), ("customer-099990", 1));
    let held = table.memory_bytes();
    eprintln!(
        "100000 consumers: loaded in {took:?}; the table holds {:.1} MB; resident memory +{:.1} MB while loading (the 12 MB file text included)",
        held as f64 / 1e6,
        grown as f64 / 1e6
    );
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    // About 100 bytes a consumer.
    assert!(held < 16_000_000, "{held} bytes");
    assert!(grown < 100_000_000, "{grown} bytes");
}

/// A key read from the query: found there, and with `strip_key` removed from the forwarded
/// query (the other parameters kept). Not store-facing: the in-process store.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_in_the_query_is_found_and_stripped() {
    let up = upstream().await;
    let file = ConsumersFile::new(&[("acme", "free", "s3cret")]);
    let top = format!(
        "[consumers]\nquery = \"api_key\"\nfile = \"{}\"\nstrip_key = true\n\n{}",
        file.path(),
        plan("free", &[&hourly("quota", 10)])
    ) + &route("api", "/api", &up.url(), "consumers = true");
    let (gw, _env) = start(Kind::Memory, &top).await;
    let c = client();
    let res = c
        .get(gw.url("/api/x?a=1&api_key=s3cret&b=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = c.get(gw.url("/api/x?api_key=s3cret")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let res = c.get(gw.url("/api/x?api_key=wrong")).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let seen = up.seen();
    let uris: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["/api/x?a=1&b=2", "/api/x"]);
    assert_eq!(seen[0].headers["x-consumer"], "acme");
}

/// Hardening III #2: a key spelled as some upstream reads it (after `;`, in another case,
/// percent-encoded) is the key: charged, identified and stripped. Before, each spelling was
/// "no key": the limit did not apply and the key reached the upstream unseen.
#[tokio::test(flavor = "multi_thread")]
async fn every_spelling_of_a_query_key_is_the_key() {
    let up = upstream().await;
    let c = client();
    // A limit counting by `query:api_key`.
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"k\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"query:api_key\"");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    let status = |q: &str| {
        let url = gw.url(&format!("/api/x?{q}"));
        let c = c.clone();
        async move { c.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("api_key=K").await, 200);
    for q in ["x=1;api_key=K", "API_KEY=K", "a=1&Api_Key=K", "api%5Fkey=K"] {
        assert_eq!(status(q).await, 429, "{q}");
    }
    assert_eq!(status("api_key=other").await, 200);
    // Two spellings at once are refused: the upstream may read either.
    assert_eq!(status("api_key=fresh;API_KEY=other2").await, 400);
    drop(gw);

    // A consumer key: identified in any spelling, and stripped from the forwarded query in any.
    let file = ConsumersFile::new(&[("acme", "free", "s3cret")]);
    let top = format!(
        "[consumers]\nquery = \"api_key\"\nfile = \"{}\"\nstrip_key = true\non_unknown = \"anon\"\n\n{}{}",
        file.path(),
        plan("free", &[&hourly("quota", 10)]),
        plan("anon", &[&hourly("quota", 10)])
    ) + &route("api", "/api", &up.url(), "consumers = true");
    let (gw, _env) = start(Kind::Memory, &top).await;
    let before = up.seen().len();
    for q in ["x=1;api_key=s3cret", "API_KEY=s3cret&y=2"] {
        let res = c.get(gw.url(&format!("/api/x?{q}"))).send().await.unwrap();
        assert_eq!(res.status(), 200, "{q}");
    }
    let seen = up.seen();
    let got: Vec<(&str, Option<&str>)> = seen[before..]
        .iter()
        .map(|s| {
            (
                s.uri.as_str(),
                s.headers.get("x-consumer").and_then(|v| v.to_str().ok()),
            )
        })
        .collect();
    assert_eq!(
        got,
        [("/api/x?x=1", Some("acme")), ("/api/x?y=2", Some("acme"))]
    );
}

/// `tollgate key hash` prints the key_sha256 of the key on stdin (one trailing newline
/// ignored); `tollgate key new` prints a new key and its hash.
#[test]
fn key_hash_and_key_new() {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let hash = |input: &[u8]| {
        let mut child = Command::new(tollgate_bin())
            .args(["key", "hash"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.success(), String::from_utf8(out.stdout).unwrap())
    };
    let want = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n";
    assert_eq!(hash(b"password\n"), (true, want.to_owned()));
    assert_eq!(hash(b"password"), (true, want.to_owned()));
    // Only one newline is ignored: this key ends with one, which no header can carry.
    assert!(!hash(b"password\n\n").0);
    assert!(!hash(b"").0, "an empty key is refused");
    // Hardening III #2: whitespace at either end could never match a header: refused.
    for bad in [
        &b" password\n"[..],
        b"password \n",
        b"password\t",
        b"\tpassword",
    ] {
        assert!(!hash(bad).0, "{bad:?} was hashed");
    }

    let out = Command::new(tollgate_bin())
        .args(["key", "new"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(format!("{}\n", lines[1]), hash(lines[0].as_bytes()).1);
}
