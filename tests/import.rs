//! `tollgate import`: the built binary on real configs (ingress-nginx's own documentation
//! examples, nginx.conf files of the common kinds). Every output is loaded with the config
//! loader `tollgate check` uses; what could not be converted must be on stderr with its file
//! and line, and `--strict` must fail then.

use std::path::Path;
use std::process::{Command, Output};

use tollgate::config::{Config, RouteConfig};

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
    let loaded = tollgate::load::load_and_check(&path)
        .unwrap_or_else(|e| panic!("the import does not load: {e}\n{stdout}"));
    (loaded.config, stderr)
}

fn route<'c>(config: &'c Config, host: Option<&str>, prefix: &str) -> &'c RouteConfig {
    config
        .routes
        .iter()
        .find(|r| r.host.as_deref() == host && r.path_prefix == prefix)
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
    // Reported with the file and line: auth-url (line 43), limit-rate (42), the wildcard
    // origin, Exact as a prefix; the Service document as a note.
    assert!(
        report.contains(&format!("{file}:43: left out")) && report.contains("auth-url"),
        "{report}"
    );
    assert!(report.contains(&format!("{file}:42: left out")), "{report}");
    assert!(report.contains("https://*.example.com"), "{report}");
    assert!(report.contains("pathType Exact"), "{report}");
    assert!(report.contains(&format!("{file}:8: note")), "{report}");
}

#[test]
fn ingress_rewrite_example_from_the_docs() {
    let file = fixture("rewrite.yaml");
    let (config, report) = imported(&["ingress-nginx", &file]);
    let r = route(&config, Some("rewrite.bar.com"), "/");
    assert!(!r.case_sensitive);
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
    // include, the regex location's 403.
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
