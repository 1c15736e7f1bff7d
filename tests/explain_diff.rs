//! The differential test of `/-/explain` (issue #35 §3): for the routes of every example config
//! (`examples/configs/*.toml`) and a generated set of requests — methods, paths (some failing
//! the input check), hosts, API keys, valid, invalid and absent tokens, client addresses inside
//! and outside the access lists and exemptions (by `X-Forwarded-For` from a trusted proxy),
//! CORS preflights, no bodies — explain's verdict (the status the gateway answers itself, or
//! none: forwarded; and the limit that refuses) equals what the gateway answers to the same
//! request. Explain is asked first (it must change nothing), then the request is sent.
//!
//! Each config is made runnable here, and nothing else of it changes: listeners on
//! `127.0.0.1:0`; every upstream the test's; Redis-backed stores (one Redis, a Cluster, a
//! Sentinel set) on one test `redis-server`; `127.0.0.1` added to `trusted_proxies` (the test
//! is the proxy); `[jwt]` keyed by a test secret (HS256; the example's JWKS has no private key
//! here), its issuer and audience kept; the consumers files replaced by ones with known keys
//! where the example's keys are not given; the admin token and the tracing exporter dropped.
//! `behind-nlb-proxy-protocol.toml` runs without its PROXY protocol (the client here cannot
//! write one): its addresses are the peer's, as from any other client. Time is the injected
//! clock, standing still, so a limit's state moves only by the requests.

mod support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};
use support::*;
use toml::{Table, Value as Toml};

const SECRET: &str = "a-test-secret-of-32-bytes-------";
/// Requests per config.
const REQUESTS: usize = 300;

/// The consumers file of `api-products.toml` with keys the test knows: `acme-key` (gold, with
/// an override), `globex-key` (free).
const API_PRODUCTS_CONSUMERS: &str = r#"
[[consumer]]
name = "acme"
plan = "gold"
key_sha256 = "afacab3575137afa4e00d9cbcafcb14c9ae25f779d964eb0ea5b2c4eb5dfd163"
limits = { monthly = 500000 }
anchor_day = 15

[[consumer]]
name = "globex"
plan = "free"
key_sha256 = "f2a455b59b858a04c51108416af2042203cb6ac35fa4141fba4148bc856e78d4"
"#;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs")
}

fn table<'t>(t: &'t mut Table, key: &str) -> &'t mut Table {
    t.entry(key)
        .or_insert_with(|| Toml::Table(Table::new()))
        .as_table_mut()
        .expect("a table")
}

/// The example `name` made runnable here (see the module's comment).
fn runnable(name: &str, up: &str, redis: &str, dir: &Path) -> String {
    let text = std::fs::read_to_string(examples().join(name)).unwrap();
    let mut t: Table = text.parse().unwrap();
    let server = table(&mut t, "server");
    server.insert("listen".into(), "127.0.0.1:0".into());
    for k in [
        "proxy_protocol",
        "proxy_protocol_from",
        "proxy_protocol_timeout",
        "tls",
        "http1",
        "watch_config",
    ] {
        server.remove(k);
    }
    let trusted = server
        .entry("trusted_proxies")
        .or_insert_with(|| Toml::Array(Vec::new()))
        .as_array_mut()
        .unwrap();
    trusted.push("127.0.0.1/32".into());
    let admin = table(&mut t, "admin");
    admin.insert("listen".into(), "127.0.0.1:0".into());
    admin.remove("token_file");
    let store = table(&mut t, "store");
    if store
        .get("backend")
        .and_then(Toml::as_str)
        .is_some_and(|b| b.starts_with("redis"))
    {
        for k in ["urls", "sentinels", "master_name"] {
            store.remove(k);
        }
        store.insert("backend".into(), "redis".into());
        store.insert("url".into(), redis.into());
        store.insert("timeout".into(), "2s".into());
    }
    if let Some(tracing) = t.get_mut("tracing").and_then(Toml::as_table_mut) {
        tracing.insert(
            "otlp_endpoint".into(),
            "http://127.0.0.1:9/v1/traces".into(),
        );
    }
    if let Some(jwt) = t.get_mut("jwt").and_then(Toml::as_table_mut) {
        jwt.remove("jwks_file");
        jwt.insert("secret_env".into(), "TOLLGATE_TEST_JWT_SECRET".into());
        jwt.insert("algorithms".into(), Toml::Array(vec!["HS256".into()]));
    }
    if let Some(cc) = t.get_mut("consumers").and_then(Toml::as_table_mut) {
        let file = cc.get("file").and_then(Toml::as_str).unwrap().to_owned();
        let path = if name == "api-products.toml" {
            let p = dir.join("consumers.toml");
            std::fs::write(&p, API_PRODUCTS_CONSUMERS).unwrap();
            p
        } else {
            examples().join(file)
        };
        cc.insert("file".into(), path.to_str().unwrap().into());
    }
    for u in t
        .get_mut("upstreams")
        .and_then(Toml::as_array_mut)
        .into_iter()
        .flatten()
    {
        let u = u.as_table_mut().unwrap();
        u.insert("servers".into(), Toml::Array(vec![up.into()]));
        for k in ["tls", "health_check", "protocol"] {
            u.remove(k);
        }
    }
    for r in t
        .get_mut("routes")
        .and_then(Toml::as_array_mut)
        .into_iter()
        .flatten()
    {
        let r = r.as_table_mut().unwrap();
        if r.get("upstream")
            .and_then(Toml::as_str)
            .is_some_and(|u| u.starts_with("http"))
        {
            r.insert("upstream".into(), up.into());
        }
    }
    toml::to_string(&t).unwrap()
}

/// What the test knows of a route, to aim requests at it.
struct RouteInfo {
    prefix: String,
    host: Option<String>,
    methods: Vec<String>,
    cors: bool,
}

fn routes_of(config: &str) -> Vec<RouteInfo> {
    let t: Table = config.parse().unwrap();
    t.get("routes")
        .and_then(Toml::as_array)
        .into_iter()
        .flatten()
        .filter_map(Toml::as_table)
        .map(|r| RouteInfo {
            prefix: r
                .get("path_prefix")
                .and_then(Toml::as_str)
                .unwrap_or("/")
                .to_owned(),
            host: r.get("host").and_then(Toml::as_str).map(str::to_owned),
            methods: r
                .get("methods")
                .and_then(Toml::as_array)
                .map(|m| {
                    m.iter()
                        .filter_map(|m| m.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            cors: r.contains_key("cors"),
        })
        .collect()
}

fn token(claims: &Value, secret: &str) -> String {
    encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// One generated request.
#[derive(Debug)]
struct Case {
    method: String,
    path: String,
    query: Option<String>,
    host: Option<String>,
    headers: Vec<(String, String)>,
    ip: IpAddr,
}

fn pick<'a, T>(rng: &mut Lcg, from: &'a [T]) -> &'a T {
    &from[rng.next(from.len() as u64) as usize]
}

fn generate(rng: &mut Lcg, routes: &[RouteInfo], jwt: &Table) -> Case {
    let r = pick(rng, routes);
    let base = r.prefix.trim_end_matches('/');
    let path = if rng.next(8) == 0 {
        // Refused by the input check (400), or routed nowhere (404). (A path that climbs
        // above the root cannot be sent: the client's URL parser resolves it first.)
        let bad = pick(
            rng,
            &[
                "/a%2fb",
                "/a;b=c",
                "/a%zz",
                "/a%00b",
                "/%20a",
                "/nowhere/at-all",
            ],
        );
        format!("{}{bad}", pick(rng, &["", base]))
    } else {
        format!("{base}{}", pick(rng, &["/x", "/a/b", "", "/", "/x/y/z"]))
    };
    let path = if path.is_empty() { "/".into() } else { path };
    let mut methods: Vec<&str> = vec!["GET", "POST", "PUT", "DELETE"];
    methods.extend(r.methods.iter().map(String::as_str));
    let mut method = pick(rng, &methods).to_string();
    let mut headers = Vec::new();
    if r.cors && rng.next(3) == 0 {
        // A CORS preflight (or an OPTIONS without one).
        method = "OPTIONS".into();
        headers.push(("origin".into(), "https://app.example.com".into()));
        if rng.next(4) != 0 {
            headers.push((
                "access-control-request-method".into(),
                pick(rng, &["GET", "POST", "PATCH"]).to_string(),
            ));
        }
    } else if r.cors && rng.next(2) == 0 {
        headers.push(("origin".into(), "https://app.example.com".into()));
    }
    let host = match (&r.host, rng.next(5)) {
        (Some(h), 1..) => Some(h.clone()),
        (_, 0) => Some(pick(rng, &["other.example.com", "free.api.example.com"]).to_string()),
        _ => None,
    };
    let key = pick(
        rng,
        &[
            "",
            "",
            "k1",
            "k2",
            "acme-key",
            "globex-key",
            "demo-llm-key",
            "nobody",
        ],
    );
    if !key.is_empty() {
        headers.push(("x-api-key".into(), key.to_string()));
    }
    let tenant = pick(rng, &["", "t1", "t2"]);
    if !tenant.is_empty() {
        headers.push(("x-tenant".into(), tenant.to_string()));
    }
    if rng.next(3) == 0 {
        headers.push(("cookie".into(), "session=s1".into()));
    }
    let claims = |sub: &str, org: &str| {
        let mut c = json!({"sub": sub, "org": {"id": org}, "exp": 4_000_000_000u64});
        if let Some(i) = jwt.get("issuer").and_then(Toml::as_str) {
            c["iss"] = json!(i);
        }
        if let Some(a) = jwt.get("audience").and_then(Toml::as_str) {
            c["aud"] = json!(a);
        }
        c
    };
    match rng.next(6) {
        0 | 1 => {}
        2 => {
            let t = token(&claims("u1", "o1"), SECRET);
            headers.push(("authorization".into(), format!("Bearer {t}")));
        }
        3 => {
            let t = token(&claims("u2", "o1"), SECRET);
            headers.push(("authorization".into(), format!("Bearer {t}")));
        }
        4 => {
            let t = token(&claims("u1", "o1"), "another-secret-of-32-bytes------");
            headers.push(("authorization".into(), format!("Bearer {t}")));
        }
        _ => headers.push(("authorization".into(), "Bearer not.a.jwt".into())),
    }
    let query = pick(rng, &[None, None, Some("tenant=a"), Some("q=1")]).map(str::to_owned);
    // Half from one address, so that limits counting by address refuse some.
    let ip: IpAddr = pick(
        rng,
        &[
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.9",
            "198.51.100.7",
            "198.51.100.13",
            "2001:db8:ffff::5",
            "2001:db8:1::1",
        ],
    )
    .parse()
    .unwrap();
    Case {
        method,
        path,
        query,
        host,
        headers,
        ip,
    }
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Explain's verdict: the status the gateway answers itself (`None`: forwarded) and the limit
/// that refuses.
async fn explained(c: &reqwest::Client, gw: &Gateway, case: &Case) -> (Option<u16>, Value) {
    let mut q = format!(
        "method={}&path={}&ip={}",
        case.method,
        enc(&case.path),
        enc(&case.ip.to_string())
    );
    if let Some(h) = &case.host {
        q.push_str(&format!("&host={}", enc(h)));
    }
    for (k, v) in &case.headers {
        q.push_str(&format!("&header.{k}={}", enc(v)));
    }
    if let Some(query) = &case.query {
        for pair in query.split('&') {
            q.push_str(&format!("&query.{pair}"));
        }
    }
    let res = c
        .get(gw.admin_url(&format!("/-/explain?{q}")))
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let v: Value = res.json().await.unwrap();
    assert_eq!(status, 200, "explain refused the question {case:?}: {v}");
    (v["status"].as_u64().map(|s| s as u16), v)
}

/// The gateway's answer: its status, whether the upstream answered, and the limit that refused.
async fn answered(c: &reqwest::Client, gw: &Gateway, case: &Case) -> (u16, bool, Value) {
    let mut url = gw.url(&case.path);
    if let Some(q) = &case.query {
        url = format!("{url}?{q}");
    }
    let method = reqwest::Method::from_bytes(case.method.as_bytes()).unwrap();
    let mut req = c
        .request(method, url)
        .header("x-forwarded-for", case.ip.to_string());
    if let Some(h) = &case.host {
        req = req.header("host", h);
    }
    for (k, v) in &case.headers {
        req = req.header(k, v);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let upstream = res.headers().get("x-upstream").is_some();
    let body = res.text().await.unwrap();
    (
        status,
        upstream,
        serde_json::from_str(&body).unwrap_or(Value::Null),
    )
}

/// Runs the generated requests against the example `name`: explain first, then the request.
async fn differential(name: &str) {
    let up = upstream().await;
    let redis = redis();
    let dir = tempfile::tempdir().unwrap();
    let config = runnable(name, &up.url(), &redis.url(), dir.path());
    let gw = gateway_env(
        &config,
        &[
            ("TOLLGATE_TEST_CLOCK", &T0.to_string()),
            ("TOLLGATE_TEST_JWT_SECRET", SECRET),
        ],
    );
    wait_ready(&gw).await;
    let routes = routes_of(&config);
    let t: Table = config.parse().unwrap();
    let jwt = t
        .get("jwt")
        .and_then(Toml::as_table)
        .cloned()
        .unwrap_or_default();
    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // A seed per config: the same requests every run.
    let seed = name
        .bytes()
        .fold(35u64, |h, b| h.wrapping_mul(31) ^ b as u64);
    let mut rng = Lcg(seed);
    let (mut forwarded, mut answered_by_gateway, mut limited) = (0, 0, 0);
    let mut seen = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..REQUESTS {
        let case = generate(&mut rng, &routes, &jwt);
        let (mut verdict, mut v) = explained(&c, &gw, &case).await;
        let (mut status, mut upstream, mut body) = answered(&c, &gw, &case).await;
        if v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("refused tokens"))
            && status != 429
        {
            // The bad-token throttle counts per wall-clock second: the second ended between
            // the question and the request. Asked again within one.
            (verdict, v) = explained(&c, &gw, &case).await;
            (status, upstream, body) = answered(&c, &gw, &case).await;
        }
        let at = format!("{name} request {i}: {case:?}\nexplain: {v}\ngateway: {status} {body}");
        match verdict {
            None => {
                assert!(
                    upstream && status == 200,
                    "explain says forwarded, the gateway did not: {at}"
                );
                forwarded += 1;
            }
            Some(s) => {
                assert!(!upstream, "explain says {s}, the gateway forwarded: {at}");
                assert_eq!(status, s, "{at}");
                answered_by_gateway += 1;
                *seen.entry(s).or_default() += 1;
                if s == 429 {
                    assert_eq!(v["limit"], body["limit"], "the limit that refuses: {at}");
                    limited += 1;
                }
            }
        }
    }
    eprintln!("{name}: {forwarded} forwarded, answered {seen:?}");
    // Each config sees both verdicts (a generator that only ever hits one proves little) — but
    // for llm-tokens, whose every limit reads the body these requests do not have: each is
    // refused (400 without its `json:model`, 401 without a known key).
    assert!(
        (forwarded > 0 || name == "llm-tokens.toml") && answered_by_gateway > 0,
        "{name}: {forwarded} forwarded, {answered_by_gateway} answered ({limited} limited)"
    );
}

macro_rules! configs {
    ($($test:ident => $file:literal),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread")]
        async fn $test() {
            differential($file).await
        }
    )*};
}

configs! {
    api_key_tiers_redis => "api-key-tiers-redis.toml",
    api_products => "api-products.toml",
    behind_nlb_proxy_protocol => "behind-nlb-proxy-protocol.toml",
    edge_behind_lb => "edge-behind-lb.toml",
    fleet_sentinel => "fleet-sentinel.toml",
    fronting => "fronting.toml",
    grpc => "grpc.toml",
    jwt => "jwt.toml",
    llm_tokens => "llm-tokens.toml",
    redis_cluster => "redis-cluster.toml",
    response_limits => "response-limits.toml",
    single_instance => "single-instance.toml",
    tracing => "tracing.toml",
    upstreams => "upstreams.toml",
    who_is_calling => "who-is-calling.toml",
}

/// Every example config is in the list above.
#[test]
fn every_example_config_is_tested() {
    let listed = include_str!("explain_diff.rs");
    for e in std::fs::read_dir(examples()).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".toml") {
            assert!(
                listed.contains(&format!("=> \"{name}\"")),
                "{name} is not in tests/explain_diff.rs"
            );
        }
    }
}
