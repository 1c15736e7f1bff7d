//! `tollgate import`: the built binary on real configs (ingress-nginx's own documentation
//! examples, nginx.conf files of the common kinds). Every output is loaded with the config
//! loader `tollgate check` uses; what could not be converted must be on stderr with its file
//! and line, and `--strict` must fail then.

use std::path::Path;
use std::process::{Command, Output};

use tollgate::config::{Config, RouteConfig};

mod support;

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

// ---------------------------------------------------------------------------------------------
// End to end: real nginx with the original, Tollgate with the import, the same upstreams and the
// same requests.

/// nginx, if this machine has it (`scripts/test` installs Debian's `nginx`).
fn nginx_bin() -> Option<std::path::PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nginx"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([std::path::PathBuf::from("/usr/sbin/nginx")])
        .find(|p| p.is_file())
}

/// A running nginx, stopped on drop.
struct Nginx {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs nginx on `conf` in a directory of its own: not a daemon, one process, its temporary
/// files, pid file and logs under that directory (nothing under /var or /run), listening on
/// `port` of 127.0.0.1.
fn start_nginx(bin: &Path, conf: &str, port: u16) -> Nginx {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    // What a packaged nginx would put under /var/lib/nginx: here, under the prefix.
    let conf = conf.replacen(
        "http {",
        "http {\n    access_log off;\n    client_body_temp_path tmp/body;\n    proxy_temp_path tmp/proxy;\n    \
         fastcgi_temp_path tmp/fastcgi;\n    uwsgi_temp_path tmp/uwsgi;\n    scgi_temp_path tmp/scgi;",
        1,
    );
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(&path)
        .args(["-e", "stderr"])
        // `crit`: not the "limiting requests" lines of every refusal, but a failed start still.
        .args([
            "-g",
            "daemon off; master_process off; pid nginx.pid; error_log stderr crit;",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("nginx starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nginx does not listen on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Nginx {
        child,
        port,
        _dir: dir,
    }
}

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
