//! `tollgate import`: the built binary on real configs (ingress-nginx's own documentation
//! examples, nginx.conf files of the common kinds). Every output is loaded with the config
//! loader `tollgate check` uses; what could not be converted must be on stderr with its file
//! and line, and `--strict` must fail then.

use std::path::Path;
use std::process::{Command, Output};

use tollgate::config::{Config, RouteConfig};

mod support;

use support::nginx::{nginx_bin, start_nginx, Nginx};

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/import/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn import(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("import")
        .args(args)
        .output()
        .expect("the tollgate binary runs")
}

/// Runs an import that must succeed, loads its output as `tollgate check` does, and returns the
/// config and the report.
fn imported(args: &[&str]) -> (Config, String) {
    let out = import(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "import failed: {stderr}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &stdout).expect("write the config");
    let loaded = tollgate::runtime::load::load_and_check(&path)
        .unwrap_or_else(|e| panic!("the import does not load: {e}\n{stdout}"));
    (loaded.config, stderr)
}

/// Whether the route is for `host` (among its hosts; `None`: any host).
fn has_host(r: &RouteConfig, host: Option<&str>) -> bool {
    match host {
        None => r.matching.hosts.is_empty(),
        Some(h) => r.matching.hosts.iter().any(|p| p.text() == h),
    }
}

/// Whether the route is the prefix `prefix`: a `path_prefix`, or an nginx location's string
/// prefix (`path_regex = "/v1.*"` or `"/v1/.*"`).
fn has_prefix(r: &RouteConfig, prefix: &str) -> bool {
    match &r.matching.path_regex {
        None => r.matching.path.is_none() && r.path_prefix == prefix,
        Some(re) => {
            re.text == format!("{}.*", regex::escape(prefix))
                || re.text == format!("{}/.*", regex::escape(prefix))
                // ingress-nginx's regex paths.
                || re.text == format!("(?i).*(?:^{prefix}).*")
        }
    }
}

fn route<'c>(config: &'c Config, host: Option<&str>, prefix: &str) -> &'c RouteConfig {
    config
        .routes
        .iter()
        .find(|r| has_host(r, host) && has_prefix(r, prefix))
        .unwrap_or_else(|| panic!("no route {host:?} {prefix}"))
}

fn limit_line(r: &RouteConfig, name: &str) -> String {
    let l = r
        .limits
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no limit {name} on {}", r.name));
    format!("{l:?}")
}

#[test]
fn ingress_annotations_become_limits_access_lists_cors_and_upstreams() {
    let file = fixture("annotations.yaml");
    let (config, report) = imported(&["ingress-nginx", &file]);
    let v1 = route(&config, Some("api.example.com"), "/v1");
    // limit-rps 5 × multiplier 2: nginx's burst 10, plus the request it admits on top.
    let rps = limit_line(v1, "rps");
    assert!(rps.contains("Gcra"), "{rps}");
    assert!(rps.contains("limit: 5"), "{rps}");
    assert!(
        rps.contains("burst: 11") || rps.contains("burst: Some(11)"),
        "{rps}"
    );
    let rpm = limit_line(v1, "rpm");
    assert!(rpm.contains("limit: 100"), "{rpm}");
    let conns = limit_line(v1, "connections");
    assert!(conns.contains("Concurrency"), "{conns}");
    assert_eq!(v1.max_body_size, 8 * 1024 * 1024);
    assert_eq!(v1.timeout, std::time::Duration::from_secs(120));
    assert!(format!("{:?}", v1.access).contains("172.16.0.0/12"));
    assert!(format!("{:?}", v1.access).contains("10.66.0.0/16"));
    // HTTPS backend, ip_hash, three tries = two retries.
    let group = config
        .upstreams
        .iter()
        .find(|u| u.name == "shop-api-8443")
        .expect("the Service's group");
    assert_eq!(group.retries, 2);
    let g = format!("{group:?}");
    assert!(g.contains("https") && g.contains("IpHash"), "{g}");
    // The redirect Ingress.
    let old = route(&config, Some("old.example.com"), "/");
    assert!(old.redirect.is_some());
    // pathType Exact is an exact path (issue #51).
    let health = config
        .routes
        .iter()
        .find(|r| r.matching.path.as_deref() == Some("/health"))
        .expect("an exact route for /health");
    assert!(has_host(health, Some("api.example.com")));
    // Reported with the file and line: auth-url (line 43), limit-rate (42), the wildcard
    // origin; the Service document as a note.
    assert!(
        report.contains(&format!("{file}:43: left out")) && report.contains("auth-url"),
        "{report}"
    );
    assert!(report.contains(&format!("{file}:42: left out")), "{report}");
    assert!(report.contains("https://*.example.com"), "{report}");
    assert!(!report.contains("pathType Exact"), "{report}");
    assert!(report.contains(&format!("{file}:8: note")), "{report}");
}

#[test]
fn ingress_rewrite_example_from_the_docs() {
    let file = fixture("rewrite.yaml");
    let (config, report) = imported(&["ingress-nginx", &file]);
    // use-regex and rewrite-target: ingress-nginx's `location ~* "^PATH"`, a case-insensitive
    // search from the start.
    let r = config
        .routes
        .iter()
        .find(|r| has_host(r, Some("rewrite.bar.com")))
        .expect("the route");
    let re = &r.matching.path_regex.as_ref().expect("a path_regex").regex;
    for (path, takes) in [
        ("/something", true),
        ("/SOMETHING/x", true),
        ("/somethingelse", true),
        ("/x/something", false),
    ] {
        assert_eq!(re.is_match(path), takes, "{path}");
    }
    assert!(
        format!("{:?}", r.fronting).contains("something"),
        "{:?}",
        r.fronting
    );
    // app-root has no equivalent: reported at its line.
    assert!(report.contains(&format!("{file}:24: left out")), "{report}");
    assert!(report.contains("app-root"), "{report}");
}

#[test]
fn ingress_grpc_and_tls_examples() {
    let file = fixture("grpc.yaml");
    let (config, report) = imported(&["ingress-nginx", &file]);
    let group = &config.upstreams[0];
    assert!(format!("{group:?}").contains("H2c"), "{group:?}");
    assert!(report.contains("spec.tls"), "{report}");
    assert!(report.contains("ssl-redirect"), "{report}");
    let file = fixture("docker-registry-and-snippet.yaml");
    let (config, report) = imported(&["ingress-nginx", &file]);
    assert_eq!(config.routes.len(), 2);
    assert!(report.contains("configuration-snippet"), "{report}");
    assert!(report.contains("proxy-send-timeout"), "{report}");
    assert!(report.contains("proxy-body-size"), "{report}");
}

#[test]
fn strict_fails_when_anything_was_left_out() {
    let out = import(&["ingress-nginx", "--strict", &fixture("rewrite.yaml")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--strict"));
    // A config with nothing left out passes --strict.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let clean = dir.path().join("clean.yaml");
    std::fs::write(
        &clean,
        "kind: Ingress\nmetadata:\n  name: a\n  annotations:\n    nginx.ingress.kubernetes.io/limit-rpm: \"60\"\nspec:\n  rules:\n  - host: a.example\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service:\n            name: a\n            port:\n              number: 80\n",
    )
    .expect("write");
    let out = import(&["ingress-nginx", "--strict", &clean.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(Path::new(&clean).exists());
}

#[test]
fn bad_yaml_names_the_file_and_document() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: Ingress\n---\nkind: [unclosed\n").expect("write");
    let out = import(&["ingress-nginx", &bad.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("document 2"), "{err}");
}

#[test]
fn nginx_conf_limits_upstreams_locations_and_headers() {
    let file = fixture("api-gateway.conf");
    let (config, report) = imported(&["nginx", &file]);
    let v1 = route(&config, Some("api.example.com"), "/v1");
    assert!(
        route(&config, Some("www.api.example.com"), "/v1")
            .limits
            .len()
            == 3
    );
    // limit_req burst=20 nodelay: nginx admits 21 at once.
    let per_ip = limit_line(v1, "per_ip");
    assert!(
        per_ip.contains("Gcra") && per_ip.contains("limit: 10"),
        "{per_ip}"
    );
    assert!(per_ip.contains("burst: 21"), "{per_ip}");
    // Without nodelay nginx queues: a leaky bucket with the same queue.
    let per_key = limit_line(v1, "per_key");
    assert!(
        per_key.contains("LeakyBucket") && per_key.contains("burst: 5"),
        "{per_key}"
    );
    assert!(
        per_key.to_ascii_lowercase().contains("x-api-key"),
        "{per_key}"
    );
    assert!(limit_line(v1, "conns").contains("Concurrency"));
    assert!(v1.preserve_host);
    assert_eq!(v1.max_body_size, 2 * 1024 * 1024);
    assert_eq!(v1.timeout, std::time::Duration::from_secs(90));
    let group = config
        .upstreams
        .iter()
        .find(|u| u.name == "api_backend")
        .expect("the upstream block");
    let g = format!("{group:?}");
    assert!(
        g.contains("LeastRequests") && g.contains("weight: 3"),
        "{g}"
    );
    assert!(format!("{:?}", config.upstreams).contains("IpHash"));
    let admin = route(&config, Some("api.example.com"), "/admin");
    assert!(format!("{:?}", admin.access).contains("10.0.0.0/8"));
    let old = route(&config, Some("old.example.com"), "/");
    assert!(old.redirect.is_some());
    // Reported with file and line: the backup server, auth_basic, the static files, the
    // include, the regex location's `return 403` (Tollgate answers no fixed status).
    for (line, what) in [
        (19, "backup"),
        (57, "auth_basic"),
        (61, "Tollgate serves no files"),
        (9, "include"),
        (66, "return 403"),
    ] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("{file}:{line}: left out")) && l.contains(what)),
            "{line} {what}: {report}"
        );
    }
    let out = import(&["nginx", "--strict", &file]);
    assert!(!out.status.success());
}

/// Issue 54: `proxy_cache_path` becomes `[cache]`, `proxy_cache` a route's `[routes.cache]`
/// with `proxy_cache_valid`, `proxy_cache_methods`, `proxy_cache_key` and the lock converted;
/// what has no setting is reported with its line and what Tollgate does instead.
#[test]
fn nginx_proxy_cache_becomes_the_cache() {
    use tollgate::config::KeyPart;
    let file = fixture("proxy-cache.conf");
    let out = import(&["nginx", &file]);
    let toml = String::from_utf8_lossy(&out.stdout).into_owned();
    for key in [
        "[cache]",
        "disk_path = \"/var/cache/nginx/api\"",
        "disk_max_bytes = 268435456",
        "max_entries = 81920",
        "[routes.cache]",
        "enabled = true",
        "methods = [\"GET\", \"HEAD\"]",
        "key = [\"header:x-tenant\"]",
        "default_ttl = \"10m\"",
        "statuses = [200, 302, 404]",
        "lock_timeout = \"3s\"",
    ] {
        assert!(toml.contains(key), "{key}: {toml}");
    }
    let (config, report) = imported(&["nginx", &file]);
    // The zone's directory and max_size are the disk tier; the memory tier keeps its default.
    let disk = config.cache.disk.as_ref().expect("a disk tier");
    assert_eq!(disk.path, std::path::Path::new("/var/cache/nginx/api"));
    assert_eq!(disk.max_bytes, 256 << 20);
    assert_eq!(config.cache.max_bytes, 64 << 20);
    assert_eq!(config.cache.max_entries, (10 << 20) / 128);
    let catalog = route(&config, Some("api.example.com"), "/catalog");
    let c = catalog.cache.as_deref().expect("/catalog caches");
    assert!(c.get && c.head);
    assert_eq!(
        c.key,
        vec![KeyPart::Header(http::HeaderName::from_static("x-tenant"))]
    );
    assert_eq!(c.rules.default_ttl, std::time::Duration::from_secs(600));
    assert_eq!(c.rules.statuses, vec![200, 302, 404]);
    assert_eq!(c.rules.lock_timeout, std::time::Duration::from_secs(3));
    // `proxy_cache off`: no cache.
    assert!(route(&config, Some("api.example.com"), "/live")
        .cache
        .is_none());
    // A key with a cookie has no equivalent: the route caches on Tollgate's key.
    let search = route(&config, Some("api.example.com"), "/search");
    let s = search.cache.as_deref().expect("/search caches");
    assert!(s.key.is_empty());
    for (line, severity, what) in [
        (3, "note", "kept on disk in /var/cache/nginx/api"),
        (3, "note", "levels="),
        (3, "approximated", "inactive=60m"),
        (10, "approximated", "one default_ttl"),
        (11, "note", "revalidated"),
        (18, "left out", "stale-if-error"),
        (28, "left out", "$cookie_session"),
        (29, "left out", "proxy_no_cache"),
        (30, "left out", "proxy_cache_bypass"),
    ] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("{file}:{line}: {severity}")) && l.contains(what)),
            "{line} {severity} {what}: {report}"
        );
    }
}

#[test]
fn nginx_conf_syntax_errors_name_the_line() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let bad = dir.path().join("nginx.conf");
    std::fs::write(&bad, "http {\n  server {\n    listen 80\n  }\n}\n").expect("write");
    let out = import(&["nginx", &bad.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nginx.conf:4:"), "{err}");
}

#[test]
fn nginx_conf_grpc_https_and_composite_keys() {
    let file = fixture("grpc-and-https.conf");
    let (config, report) = imported(&["nginx", &file]);
    let group = config
        .upstreams
        .iter()
        .find(|u| u.name == "orders")
        .expect("the gRPC group");
    let g = format!("{group:?}");
    assert!(g.contains("H2c"), "{g}");
    assert_eq!(group.max_fails, 3);
    let billing = route(&config, None, "/billing");
    assert!(billing.strip_prefix);
    let u = format!("{:?}", billing.upstream);
    assert!(u.contains("https") && u.contains("/api"), "{u}");
    assert!(limit_line(billing, "by_query").contains("apikey"));
    let both = limit_line(billing, "by_ip_path");
    assert!(both.contains("Gcra") && both.contains("burst: 5"), "{both}");
    assert!(
        report.contains(&format!("{file}:22: left out")) && report.contains("$upstream_addr"),
        "{report}"
    );
    assert!(
        report.contains(&format!("{file}:4: approximated")),
        "{report}"
    );
}

// ---------------------------------------------------------------------------------------------
// End to end: real nginx with the original, Tollgate with the import, the same upstreams and the
// same requests.

/// What one proxy did with the same requests: how many each burst had admitted (a 2xx), and
/// which upstream saw which paths.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    app_admitted: usize,
    api_admitted: [usize; 2],
    app_paths: Vec<String>,
    api_paths: Vec<String>,
}

/// The same requests, one after the other, to `base`: ten to `/app/` (one client address), then
/// six to `/api/` with API key `a` and six with key `b`.
async fn bursts(base: &str, app: &support::Upstream, api: &support::Upstream) -> Observed {
    let client = support::client();
    let (app_before, api_before) = (app.seen().len(), api.seen().len());
    let mut app_admitted = 0;
    for i in 0..10 {
        let res = client
            .get(format!("{base}/app/item/{i}"))
            .send()
            .await
            .unwrap();
        app_admitted += usize::from(res.status().is_success());
    }
    let mut api_admitted = [0; 2];
    for (k, key) in ["a", "b"].iter().enumerate() {
        for i in 0..6 {
            let res = client
                .get(format!("{base}/api/v1/{key}/{i}"))
                .header("x-api-key", *key)
                .send()
                .await
                .unwrap();
            api_admitted[k] += usize::from(res.status().is_success());
        }
    }
    let paths = |u: &support::Upstream, from: usize| {
        let mut p: Vec<String> = u.seen()[from..].iter().map(|s| s.uri.clone()).collect();
        p.sort();
        p
    };
    Observed {
        app_admitted,
        api_admitted,
        app_paths: paths(app, app_before),
        api_paths: paths(api, api_before),
    }
}

/// Issue #39 part 3: nginx with `limit_req` zones (burst and nodelay, keyed on the client address
/// and on `$http_x_api_key`) and two locations to two upstreams, and Tollgate with `tollgate import
/// nginx`'s output, admit the same requests of the same bursts and send them to the same
/// upstreams.
///
/// Why the counts are deterministic: nginx's `limit_req` is a leaky bucket kept in milli-requests
/// with millisecond timestamps; with `burst=B nodelay` a burst admits 1 + B requests when it
/// arrives within one token period (1 s for `rate=1r/s`, 500 ms for `2r/s`), since less than one
/// token leaks back meanwhile. The bursts here are 10 and 6 sequential requests on loopback (a few
/// milliseconds each), far inside those periods, so nginx admits exactly 6 and 4 (per key), and
/// so must the import (a GCRA with `burst = B + 1`). Refusals differ in status only (nginx's 503,
/// Tollgate's 429), so only admitted requests are compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_and_the_import_admit_and_route_alike() {
    let Some(nginx) = nginx_bin() else {
        eprintln!(
            "SKIPPED nginx_and_the_import_admit_and_route_alike: no nginx on this machine \
             (Debian package `nginx`; `scripts/test` installs it)"
        );
        return;
    };
    let app = support::upstream().await;
    let api = support::upstream().await;
    let port = support::free_port();
    let original = std::fs::read_to_string(fixture("limit-req-e2e.conf"))
        .unwrap()
        .replace("127.0.0.1:3001", &app.addr.to_string())
        .replace("127.0.0.1:3002", &api.addr.to_string())
        .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"));
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(&conf, &original).unwrap();

    // nginx with the original.
    let from_nginx = {
        let server = start_nginx(&nginx, &original, port);
        bursts(&format!("http://127.0.0.1:{}", server.port), &app, &api).await
    };

    // Tollgate with the import of the same file (its listeners on free ports).
    let out = import(&["nginx", conf.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let toml = String::from_utf8(out.stdout).unwrap().replace(
        &format!("listen = \"127.0.0.1:{port}\""),
        "listen = \"127.0.0.1:0\"",
    );
    assert!(toml.contains("listen = \"127.0.0.1:0\""), "{toml}");
    let gw = support::gateway(&format!("{toml}\n[admin]\nlisten = \"127.0.0.1:0\"\n"));
    let from_tollgate = bursts(&gw.url(""), &app, &api).await;

    // What nginx did, as computed above: the counts are nginx's own, not assumed.
    assert_eq!(from_nginx.app_admitted, 6, "nginx: {from_nginx:?}");
    assert_eq!(from_nginx.api_admitted, [4, 4], "nginx: {from_nginx:?}");
    assert!(from_nginx.app_paths.iter().all(|p| p.starts_with("/app/")));
    assert!(from_nginx
        .api_paths
        .iter()
        .all(|p| p.starts_with("/api/v1/")));
    assert_eq!(from_tollgate, from_nginx);
}

/// nginx running `fixture` and Tollgate running its import, side by side: `127.0.0.1:300N` in
/// the fixture is upstream N (from 1), `listen 8080;` a free port. `None` without nginx.
struct Side {
    _nginx: Nginx,
    nginx_base: String,
    gateway: support::Gateway,
    /// The import's report (its stderr).
    report: String,
    file: String,
}

fn side_by_side(name: &str, upstreams: &[&support::Upstream]) -> Option<Side> {
    let Some(bin) = nginx_bin() else {
        eprintln!(
            "SKIPPED: no nginx on this machine (Debian package `nginx`; `scripts/test` installs it)"
        );
        return None;
    };
    let port = support::free_port();
    let mut original = std::fs::read_to_string(fixture(name))
        .unwrap()
        .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"));
    for (i, u) in upstreams.iter().enumerate() {
        original = original.replace(&format!("127.0.0.1:{}", 3001 + i), &u.addr.to_string());
    }
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join(name);
    std::fs::write(&conf, &original).unwrap();
    let nginx = start_nginx(&bin, &original, port);
    let file = conf.to_str().unwrap().to_owned();
    let out = import(&["nginx", &file]);
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{report}");
    let toml = String::from_utf8(out.stdout).unwrap().replace(
        &format!("listen = \"127.0.0.1:{port}\""),
        "listen = \"127.0.0.1:0\"",
    );
    let gateway = support::gateway(&format!("{toml}\n[admin]\nlisten = \"127.0.0.1:0\"\n"));
    Some(Side {
        nginx_base: format!("http://127.0.0.1:{}", nginx.port),
        _nginx: nginx,
        gateway,
        report,
        file,
    })
}

/// Which of `upstreams` (by index) the request for `path` with `Host: host` reached, through the
/// proxy at `base`, and the status.
async fn chosen(
    base: &str,
    host: &str,
    path: &str,
    upstreams: &[&support::Upstream],
) -> (Option<usize>, u16) {
    let before: Vec<usize> = upstreams.iter().map(|u| u.hits()).collect();
    let res = support::client()
        .get(format!("{base}{path}"))
        .header("host", host)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let _ = res.bytes().await;
    let reached = upstreams
        .iter()
        .zip(&before)
        .position(|(u, b)| u.hits() > *b);
    (reached, status)
}

/// Issue 50 item 19, then issue 51 item 5: exact (`=`) and regex (`~`, `~*`) locations written
/// before `location /` took `/` over after import (`~ \.php$` became the prefix `/`); then they
/// were left out. Now they are converted with nginx's precedence (exact, longest prefix, `^~`,
/// regexes in file order), and every request goes where nginx sends it. The random configs of
/// tests/routing_nginx.rs hold the same against nginx at large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_and_the_import_choose_the_same_location() {
    let ups = [
        support::upstream().await,
        support::upstream().await,
        support::upstream().await,
        support::upstream().await,
    ];
    let refs: Vec<&support::Upstream> = ups.iter().collect();
    let Some(side) = side_by_side("precedence.conf", &refs) else {
        return;
    };
    let requests = [
        ("regex.test", "/"),
        ("regex.test", "/index.html"),
        ("regex.test", "/index.php"),
        ("regex.test", "/a/b"),
        ("regex.test", "/status"),
        ("regex.test", "/status.php"),
        ("regex.test", "/statusx"),
        ("regex.test", "/status/a"),
        ("regex.test", "/images/a"),
        ("regex.test", "/Images/a.php"),
        ("regex.test", "/static/x"),
        ("regex.test", "/static/x.php"),
        ("regex.test", "/app/x"),
        ("regex.test", "/app/x.php"),
        ("regex.test", "/app/"),
        ("regex.test", "/app"),
        ("regex.test", "/apple"),
        ("exact.test", "/"),
        ("exact.test", "/x"),
        ("exact.test", "/a/b"),
    ];
    let mut differ = Vec::new();
    for (host, path) in requests {
        let by_nginx = chosen(&side.nginx_base, host, path, &refs).await;
        let by_tollgate = chosen(&side.gateway.url(""), host, path, &refs).await;
        assert!(by_nginx.0.is_some(), "nginx: {host}{path}: {by_nginx:?}");
        if by_nginx != by_tollgate {
            differ.push(format!(
                "{host}{path}: nginx {by_nginx:?}, import {by_tollgate:?}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "(upstream index, status) differ:\n{}\n{}",
        differ.join("\n"),
        side.report
    );
    // The location left out, with its file and line.
    let file = &side.file;
    let (line, what) = (39, "named location");
    assert!(
        side.report
            .lines()
            .any(|l| l.starts_with(&format!("{file}:{line}: left out")) && l.contains(what)),
        "{line} {what}: {}",
        side.report
    );
}

/// An Ingress for `a.example` with `annotations` (YAML lines, indented by 4) and two paths: `path`
/// and `/ok`.
fn ingress_with(annotations: &str, path: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: t\n  annotations:\n    kubernetes.io/ingress.class: nginx\n{annotations}spec:\n  rules:\n  - host: a.example\n    http:\n      paths:\n      - path: {path}\n        pathType: ImplementationSpecific\n        backend:\n          service:\n            name: s\n            port:\n              number: 80\n      - path: /ok\n        pathType: Prefix\n        backend:\n          service:\n            name: s\n            port:\n              number: 80\n"
    )
}

/// An nginx.conf with `location /ok` and `body` in the same server.
fn nginx_with(body: &str) -> String {
    format!(
        "http {{\n  server {{\n    listen 8080;\n    location /ok {{ proxy_pass http://127.0.0.1:3000; }}\n{body}  }}\n}}\n"
    )
}

/// (source, text, a route that must be there (host, prefix), what the report's line holds)
type Case<'a> = (&'a str, String, (Option<&'a str>, &'a str), &'a str);

/// Issue 50 item 18: one value Tollgate's loader refuses aborted the whole import ("the
/// imported configuration does not load"). Each is left out and reported with its file and
/// line, the rest is converted, and the output loads.
#[test]
fn a_value_that_cannot_be_converted_is_left_out_and_the_rest_converted() {
    const A: &str = "    nginx.ingress.kubernetes.io/";
    // (source, text, a route that must be there (host, prefix), a line of the report must
    // hold this and start with `FILE:LINE: left out`)
    let cases: Vec<Case> = vec![
        (
            "ingress-nginx",
            ingress_with(
                &format!("{A}rewrite-target: /$2?x=1\n"),
                "/something(/|$)(.*)",
            ),
            (Some("a.example"), "/ok"),
            "rewrite",
        ),
        (
            "ingress-nginx",
            ingress_with(&format!("{A}proxy-read-timeout: \"86401\"\n"), "/a"),
            (Some("a.example"), "/a"),
            "timeout",
        ),
        (
            "ingress-nginx",
            ingress_with("", "/café"),
            (Some("a.example"), "/ok"),
            "/café",
        ),
        (
            "ingress-nginx",
            ingress_with("", "/a/../b"),
            (Some("a.example"), "/ok"),
            "/a/../b",
        ),
        (
            "ingress-nginx",
            ingress_with("", "/a%2fb"),
            (Some("a.example"), "/ok"),
            "/a%2fb",
        ),
        (
            "ingress-nginx",
            ingress_with(
                &format!("{A}whitelist-source-range: \"10.0.0.0/33, 192.0.2.0/24\"\n"),
                "/a",
            ),
            (Some("a.example"), "/a"),
            "10.0.0.0/33",
        ),
        (
            "ingress-nginx",
            ingress_with(
                &format!("{A}enable-cors: \"true\"\n{A}cors-allow-methods: \"FOO BAR\"\n"),
                "/a",
            ),
            (Some("a.example"), "/a"),
            "FOO BAR",
        ),
        (
            "ingress-nginx",
            ingress_with(&format!("{A}limit-rps: \"1000001\"\n"), "/a"),
            (Some("a.example"), "/a"),
            "1000001",
        ),
        (
            "nginx",
            nginx_with("    location /slow {\n      proxy_read_timeout 7d;\n      proxy_pass http://127.0.0.1:3000;\n    }\n"),
            (None, "/slow"),
            "7d",
        ),
        (
            "nginx",
            nginx_with("    location @x {\n      proxy_pass http://127.0.0.1:3000;\n    }\n"),
            (None, "/ok"),
            "@x",
        ),
        (
            "nginx",
            nginx_with("    location /c {\n      allow 10.0.0.0/33;\n      allow 192.0.2.0/24;\n      deny all;\n      proxy_pass http://127.0.0.1:3000;\n    }\n"),
            (None, "/c"),
            "10.0.0.0/33",
        ),
        (
            "nginx",
            nginx_with("    location /a//b {\n      proxy_pass http://127.0.0.1:3000;\n    }\n"),
            (None, "/ok"),
            "/a//b",
        ),
    ];
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut failures = Vec::new();
    for (i, (source, text, (host, prefix), what)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("case{i}.in"));
        std::fs::write(&file, text).unwrap();
        let file = file.display().to_string();
        let out = import(&[source, &file]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let report = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            failures.push(format!("case {i} ({what}): import failed: {report}"));
            continue;
        }
        let path = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&path, &stdout).unwrap();
        let config = match tollgate::runtime::load::load_and_check(&path) {
            Ok(l) => l.config,
            Err(e) => {
                failures.push(format!("case {i} ({what}): does not load: {e}\n{stdout}"));
                continue;
            }
        };
        if !config
            .routes
            .iter()
            .any(|r| has_host(r, *host) && has_prefix(r, prefix))
        {
            failures.push(format!(
                "case {i} ({what}): no route {host:?} {prefix}\n{stdout}"
            ));
        }
        let reported = report.lines().any(|l| {
            l.starts_with(&format!("{file}:"))
                && l[file.len() + 1..]
                    .split_once(": left out")
                    .is_some_and(|(n, _)| n.parse::<usize>().is_ok())
                && l.contains(what)
        });
        if !reported {
            failures.push(format!(
                "case {i} ({what}): not reported as left out with its line:\n{report}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The statuses of `n` requests for `path` through the proxy at `base`, one after the other.
async fn statuses(base: &str, path: &str, n: usize) -> Vec<u16> {
    let client = support::client();
    let mut out = Vec::new();
    for i in 0..n {
        let res = client.get(format!("{base}{path}{i}")).send().await.unwrap();
        out.push(res.status().as_u16());
        let _ = res.bytes().await;
    }
    out
}

/// Issue 50 items 17 and 21: `limit_req_dry_run on` was imported as an enforcing limit (nginx
/// forwarded 20 of 20, the import 2 of 20) and `limit_req_status 503` as 429. Real nginx and
/// the import answer the same statuses to the same requests: a dry run is `mode = "shadow"`,
/// the status a `refusal = { status }`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_and_the_import_refuse_alike() {
    let app = support::upstream().await;
    let Some(side) = side_by_side("dry-run-and-status.conf", &[&app]) else {
        return;
    };
    let mut differ = Vec::new();
    for path in ["/dry/", "/busy/", "/many/"] {
        let by_nginx = statuses(&side.nginx_base, path, 20).await;
        let by_tollgate = statuses(&side.gateway.url(""), path, 20).await;
        if by_nginx != by_tollgate {
            differ.push(format!(
                "{path}: nginx {by_nginx:?}\n{path}: import {by_tollgate:?}"
            ));
        }
    }
    assert!(differ.is_empty(), "{}\n{}", differ.join("\n"), side.report);
}

/// Runs `tollgate import ARGS` with at most `limit` for it: `None` when it took longer (it is
/// killed then).
fn import_within(args: &[&str], limit: std::time::Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("import")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the tollgate binary runs");
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Issue 50 item 20: 60,000 nested blocks crashed the nginx importer (a stack overflow, exit
/// 134), and deeply nested YAML took the Ingress reader quadratic time (200 KB: 45 s). Both are
/// refused at once with an error that names the depth, and exit 1.
#[test]
fn deep_nesting_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let deep_conf = dir.path().join("deep.conf");
    std::fs::write(
        &deep_conf,
        format!("{}{}", "a {\n".repeat(60_000), "}\n".repeat(60_000)),
    )
    .unwrap();
    // Flow YAML 200 KB deep, block sequences (`- - - …`) and nested mappings.
    let flow = dir.path().join("flow.yaml");
    std::fs::write(
        &flow,
        format!(
            "kind: Ingress\nspec: {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        ),
    )
    .unwrap();
    let flow_maps = dir.path().join("flow-maps.yaml");
    std::fs::write(
        &flow_maps,
        format!(
            "kind: Ingress\nspec: {}1{}\n",
            "{a: ".repeat(50_000),
            "}".repeat(50_000)
        ),
    )
    .unwrap();
    let dashes = dir.path().join("dashes.yaml");
    std::fs::write(
        &dashes,
        format!("kind: Ingress\nspec:\n{}x\n", "- ".repeat(100_000)),
    )
    .unwrap();
    let mut failures = Vec::new();
    for (source, file) in [
        ("nginx", &deep_conf),
        ("ingress-nginx", &flow),
        ("ingress-nginx", &flow_maps),
        ("ingress-nginx", &dashes),
    ] {
        let started = std::time::Instant::now();
        let out = import_within(
            &[source, file.to_str().unwrap()],
            std::time::Duration::from_secs(5),
        );
        let took = started.elapsed();
        match out {
            None => failures.push(format!("{}: still running after {took:?}", file.display())),
            Some(out) => {
                let err = String::from_utf8_lossy(&out.stderr);
                if out.status.code() != Some(1) || !err.contains("nested") {
                    failures.push(format!(
                        "{}: {:?} in {took:?}: {}",
                        file.display(),
                        out.status,
                        err.chars().take(300).collect::<String>()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Nesting as deep as real files have is read.
    let fine = format!("{}{}", "http {\n".repeat(30), "}\n".repeat(30));
    assert!(tollgate::import::nginx_conf::parse("f", &fine).is_ok());
}

fn ingress(text: &str) -> tollgate::import::Import {
    tollgate::import::ingress::convert(&[("in.yaml".into(), text.into())]).expect("converts")
}

/// Issue 50 item 21: `enable-cors: "1"` / `"t"` (Go's `strconv.ParseBool`, which ingress-nginx
/// reads booleans with) were ignored; a value ParseBool refuses is reported.
#[test]
fn ingress_booleans_are_read_as_go_reads_them() {
    for yes in ["1", "t", "T", "TRUE", "true", "True"] {
        let out = ingress(&ingress_with(
            &format!("    nginx.ingress.kubernetes.io/enable-cors: \"{yes}\"\n"),
            "/a",
        ));
        assert!(out.toml.contains("[routes.cors]"), "{yes}: {}", out.toml);
    }
    for no in ["0", "f", "F", "FALSE", "false", "False"] {
        let out = ingress(&ingress_with(
            &format!("    nginx.ingress.kubernetes.io/enable-cors: \"{no}\"\n"),
            "/a",
        ));
        assert!(!out.toml.contains("[routes.cors]"), "{no}: {}", out.toml);
        assert_eq!(out.report.lossy(), 0, "{no}: {:?}", out.report);
    }
    for bad in ["yes", "on", "tRUE"] {
        let out = ingress(&ingress_with(
            &format!("    nginx.ingress.kubernetes.io/enable-cors: \"{bad}\"\n"),
            "/a",
        ));
        assert!(!out.toml.contains("[routes.cors]"), "{bad}: {}", out.toml);
        assert!(
            out.report
                .items
                .iter()
                .any(|i| i.place.contains("enable-cors") && i.line == Some(7)),
            "{bad}: {:?}",
            out.report
        );
    }
    // cors-allow-credentials is read the same way (default true).
    let out = ingress(&ingress_with(
        "    nginx.ingress.kubernetes.io/enable-cors: \"t\"\n    nginx.ingress.kubernetes.io/cors-allow-origin: \"https://a.example\"\n    nginx.ingress.kubernetes.io/cors-allow-credentials: \"0\"\n",
        "/a",
    ));
    assert!(
        out.toml.contains("allow_credentials = false"),
        "{}",
        out.toml
    );
}

/// Issue 50 item 21: a negative `cors-max-age` silently became the default.
#[test]
fn ingress_negative_cors_max_age_is_reported() {
    let out = ingress(&ingress_with(
        "    nginx.ingress.kubernetes.io/enable-cors: \"true\"\n    nginx.ingress.kubernetes.io/cors-max-age: \"-5\"\n",
        "/a",
    ));
    assert!(
        out.report
            .items
            .iter()
            .any(|i| i.place.contains("cors-max-age")
                && i.line == Some(8)
                && i.message.contains("-5")),
        "{:?}",
        out.report
    );
}

/// Issue 50 item 21: a second `limit_req` of the same zone was skipped without a report line.
#[test]
fn nginx_second_limit_req_of_a_zone_is_reported() {
    let conf = "http {\n  limit_req_zone $binary_remote_addr zone=one:1m rate=1r/s;\n  server {\n    location / {\n      limit_req zone=one burst=5;\n      limit_req zone=one burst=9 nodelay;\n      proxy_pass http://127.0.0.1:3000;\n    }\n  }\n}\n";
    let out =
        tollgate::import::nginx::convert(&[("n.conf".into(), conf.into())]).expect("converts");
    assert!(
        out.report
            .items
            .iter()
            .any(|i| i.line == Some(6) && i.place.contains("burst=9")),
        "{:?}",
        out.report
    );
}

/// An Ingress of `n` paths for one host, to 100 Services.
fn many_paths(n: usize) -> String {
    let mut yaml = String::from(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: many\nspec:\n  rules:\n  - host: a.example\n    http:\n      paths:\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "      - path: /p{i}\n        pathType: Prefix\n        backend:\n          service:\n            name: s{}\n            port:\n              number: 80\n",
            i % 100
        ));
    }
    yaml
}

/// Issue 50 item 21: the Ingress import took quadratic time in its paths (20,000: 20 s in a
/// release build; more than ten minutes in a debug one). Ten times the paths take about ten
/// times as long, not a hundred: the ratio is what is asserted (wall times on a shared machine
/// vary; the ratio of a quadratic import would be 100).
#[test]
fn ingress_with_many_paths_imports_in_linear_time() {
    let time = |n: usize| {
        let yaml = many_paths(n);
        let started = std::time::Instant::now();
        let out = ingress(&yaml);
        let took = started.elapsed();
        assert_eq!(out.toml.matches("[[routes]]").count(), n);
        (took, out)
    };
    let small = (0..3).map(|_| time(2_000).0).min().unwrap();
    let (big, out) = time(20_000);
    eprintln!("2,000 paths imported in {small:?}, 20,000 in {big:?}");
    // The line of each path is its own (found in order, not searched for from the top).
    assert!(
        out.toml
            .contains(&format!("in.yaml:{} (", 10 + 7 * (20_000 - 1))),
        "the last path's line"
    );
    assert!(
        big < small * 30,
        "10 times the paths took {} times as long ({small:?}, {big:?})",
        big.as_secs_f64() / small.as_secs_f64()
    );
}

/// Issue #51 item 5: `tollgate import gateway-api` reads HTTPRoutes and Envoy Gateway's
/// BackendTrafficPolicy: every match a route the loader takes, the weighted backends a group,
/// the limits on the routes of the HTTPRoute targeted, and what is left out reported with its
/// file and line (`--strict` fails then).
#[test]
fn gateway_api_routes_and_rate_limits() {
    let file = fixture("gateway-api.yaml");
    let (config, report) = imported(&["gateway-api", &file]);
    assert_eq!(config.routes.len(), 3, "{report}");
    let login = config
        .routes
        .iter()
        .find(|r| r.matching.path.as_deref() == Some("/login"))
        .expect("the exact route");
    assert!(has_host(login, Some("*.tenants.example.com")));
    assert_eq!(
        login.methods.as_deref(),
        Some(&[http::Method::POST][..]),
        "{:?}",
        login.methods
    );
    let v1 = route(&config, Some("api.example.com"), "/v1");
    assert!(limit_line(v1, "global-0").contains("FixedWindow"));
    assert!(config.upstreams.iter().any(|u| u.name == "shop-api-1"));
    for (line, what) in [(42, "RequestMirror"), (87, "x-plan")] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("{file}:{line}: left out")) && l.contains(what)),
            "{line} {what}: {report}"
        );
    }
    assert!(!import(&["gateway-api", "--strict", &file]).status.success());
}
