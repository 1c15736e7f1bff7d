//! What the Kubernetes manifests (deploy/kubernetes/) mean, checked without a cluster: the
//! ConfigMap's gateway.toml and consumers file pass `tollgate check` as mounted, the Secret is a
//! valid token file, the probes ask /readyz and /healthz on the admin port, the termination
//! grace covers the preStop pause and the drain, every selector finds the pods, the
//! ServiceMonitor scrapes the admin Service as job "tollgate" (what the alert rules expect), and
//! the PrometheusRule is exactly what `scripts/gen-prometheusrule` makes of the shipped rules.
//! Their schemas (strict) are checked by `scripts/validate-kubernetes` in CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_norway::Value as Yaml;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// Every document of every manifest, with its file name.
fn manifests() -> Vec<(String, Yaml)> {
    let mut files: Vec<String> = std::fs::read_dir(repo("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = read(&format!("deploy/kubernetes/{f}"));
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v = Yaml::deserialize(doc).unwrap_or_else(|e| panic!("{f}: {e}"));
            out.push((f.clone(), v));
        }
    }
    out
}

fn find<'a>(all: &'a [(String, Yaml)], kind: &str, name: &str) -> &'a Yaml {
    all.iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"].as_str() == Some(kind) && v["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn s(v: &Yaml) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// Whether `selector` (a matchLabels map) selects `labels`.
fn selects(selector: &Yaml, labels: &Yaml) -> bool {
    let sel = selector.as_mapping().expect("a label map");
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let k: Yaml = serde_norway::from_str(&read("deploy/kubernetes/kustomization.yaml")).unwrap();
    let listed: BTreeSet<&str> = k["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    let files: BTreeSet<String> = manifests()
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| f != "kustomization.yaml")
        .collect();
    let files: BTreeSet<&str> = files.iter().map(String::as_str).collect();
    assert_eq!(listed, files);
}

#[test]
fn the_configmap_passes_tollgate_check_as_mounted() {
    let all = manifests();
    let cm = find(&all, "ConfigMap", "tollgate-config");
    let secret = find(&all, "Secret", "tollgate-admin-tokens");
    // /etc/tollgate as the pod sees it: the ConfigMap's keys, the Secret at admin/.
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().display().to_string();
    for (k, v) in cm["data"].as_mapping().unwrap() {
        let text = s(v).replace("/etc/tollgate", &etc);
        std::fs::write(dir.path().join(s(k)), text).unwrap();
    }
    std::fs::create_dir(dir.path().join("admin")).unwrap();
    for (k, v) in secret["stringData"].as_mapping().unwrap() {
        std::fs::write(dir.path().join("admin").join(s(k)), s(v)).unwrap();
    }
    let loaded = tollgate::runtime::load::load_and_check(&dir.path().join("gateway.toml"))
        .unwrap_or_else(|e| panic!("the ConfigMap's gateway.toml: {e}"));
    let c = &loaded.config;
    assert!(
        c.server.watch_config,
        "the ConfigMap is reloaded by watch_config"
    );
    assert!(c.admin.token_file.is_some() && loaded.admin_tokens.is_some());
    assert_eq!(loaded.consumers.len(), 2);
    assert!(c.warnings().is_empty(), "warnings: {:?}", c.warnings());
    // The same through the binary.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config"])
        .arg(dir.path().join("gateway.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_deployment_probes_drains_and_mounts_as_the_gateway_needs() {
    let all = manifests();
    let cm = find(&all, "ConfigMap", "tollgate-config");
    let config =
        tollgate::Config::parse(s(&cm["data"]["gateway.toml"]), Path::new("/etc/tollgate"))
            .unwrap();
    let d = find(&all, "Deployment", "tollgate");
    let spec = &d["spec"];
    assert!(spec["replicas"].as_u64().unwrap() >= 2, "several replicas");
    assert!(selects(
        &spec["selector"]["matchLabels"],
        &spec["template"]["metadata"]["labels"]
    ));
    let pod = &spec["template"]["spec"];
    let c = &pod["containers"][0];
    let port = |name: &str| {
        c["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port("proxy"), u64::from(config.server.listen.port()));
    assert_eq!(port("admin"), u64::from(config.admin.listen.port()));
    assert!(
        config.admin.listen.ip().is_unspecified(),
        "probes reach the admin listener"
    );
    assert_eq!(s(&c["readinessProbe"]["httpGet"]["path"]), "/readyz");
    assert_eq!(s(&c["readinessProbe"]["httpGet"]["port"]), "admin");
    assert_eq!(s(&c["livenessProbe"]["httpGet"]["path"]), "/healthz");
    assert_eq!(s(&c["livenessProbe"]["httpGet"]["port"]), "admin");
    // The pause before SIGTERM, then the drain, within the grace the kubelet gives.
    let pause: u64 = s(&c["lifecycle"]["preStop"]["exec"]["command"][1])
        .parse()
        .unwrap();
    assert_eq!(s(&c["lifecycle"]["preStop"]["exec"]["command"][0]), "sleep");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace > pause + config.server.grace_period.as_secs(),
        "terminationGracePeriodSeconds {grace} must exceed the preStop pause {pause} + grace_period {:?}",
        config.server.grace_period
    );
    // The ConfigMap mounted as a directory (a subPath mount never sees an update), and the
    // config read from it.
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let config_mount = mounts
        .iter()
        .find(|m| m["name"].as_str() == Some("config"))
        .unwrap();
    assert!(config_mount.get("subPath").is_none());
    assert_eq!(s(&config_mount["mountPath"]), "/etc/tollgate");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str() == Some("config"))
        .unwrap();
    assert_eq!(s(&volume["configMap"]["name"]), "tollgate-config");
    assert_eq!(s(&c["args"][1]), "/etc/tollgate/gateway.toml");
    let tokens = mounts
        .iter()
        .find(|m| m["name"].as_str() == Some("admin-tokens"))
        .unwrap();
    assert_eq!(
        config.admin.token_file.as_deref(),
        Some(Path::new(&format!("{}/tokens", s(&tokens["mountPath"]))))
    );
    // The store is the Redis of redis.yaml.
    let redis = find(&all, "Service", "tollgate-redis");
    assert_eq!(
        config.store.urls,
        [format!(
            "redis://tollgate-redis:{}",
            redis["spec"]["ports"][0]["port"].as_u64().unwrap()
        )]
    );
}

#[test]
fn services_budgets_and_monitors_select_the_pods() {
    let all = manifests();
    let d = find(&all, "Deployment", "tollgate");
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let container_ports: BTreeSet<&str> = d["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| s(&p["name"]))
        .collect();
    for name in ["tollgate", "tollgate-admin"] {
        let svc = find(&all, "Service", name);
        assert!(selects(&svc["spec"]["selector"], pod_labels), "{name}");
        for p in svc["spec"]["ports"].as_sequence().unwrap() {
            assert!(
                container_ports.contains(s(&p["targetPort"])),
                "{name}: {p:?}"
            );
        }
    }
    // Clients reach the proxy only: the admin port is on its own Service.
    let proxy = find(&all, "Service", "tollgate");
    assert_eq!(proxy["spec"]["ports"].as_sequence().unwrap().len(), 1);
    let pdb = find(&all, "PodDisruptionBudget", "tollgate");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    assert!(
        pdb["spec"]["maxUnavailable"].as_u64().unwrap() < d["spec"]["replicas"].as_u64().unwrap()
    );
    let np = find(&all, "NetworkPolicy", "tollgate");
    assert!(selects(
        &np["spec"]["podSelector"]["matchLabels"],
        pod_labels
    ));

    let sm = find(&all, "ServiceMonitor", "tollgate");
    let admin = find(&all, "Service", "tollgate-admin");
    assert!(selects(
        &sm["spec"]["selector"]["matchLabels"],
        &admin["metadata"]["labels"]
    ));
    assert!(!selects(
        &sm["spec"]["selector"]["matchLabels"],
        &proxy["metadata"]["labels"]
    ));
    let port = s(&sm["spec"]["endpoints"][0]["port"]);
    assert!(admin["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|p| s(&p["name"]) == port));
    assert_eq!(s(&sm["spec"]["endpoints"][0]["path"]), "/metrics");
    // The job label is the Service's label named by jobLabel: "tollgate", as the rules expect.
    let job = s(&admin["metadata"]["labels"][s(&sm["spec"]["jobLabel"])]);
    assert_eq!(job, "tollgate");
    assert!(read("deploy/prometheus/alerts.yml").contains("job=\"tollgate\""));
}

#[test]
fn the_prometheus_rule_is_generated_from_the_shipped_alerts() {
    let out = Command::new("sh")
        .arg(repo("scripts/gen-prometheusrule"))
        .arg("--stdout")
        .output()
        .expect("sh runs scripts/gen-prometheusrule");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        generated,
        read("deploy/kubernetes/prometheusrule.yaml"),
        "deploy/kubernetes/prometheusrule.yaml is stale: run scripts/gen-prometheusrule"
    );
    let rule: Yaml = serde_norway::from_str(&generated).unwrap();
    let alerts: Yaml = serde_norway::from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    assert_eq!(rule["spec"]["groups"], alerts["groups"]);
    assert_eq!(s(&rule["kind"]), "PrometheusRule");
    assert_eq!(s(&rule["apiVersion"]), "monitoring.coreos.com/v1");
}

#[test]
fn the_secret_is_a_token_file() {
    let all = manifests();
    let secret = find(&all, "Secret", "tollgate-admin-tokens");
    let t = tollgate::admin::AdminTokens::parse(s(&secret["stringData"]["tokens"])).unwrap();
    assert!(
        t.admits(Some(b"Bearer change-me")),
        "the documented placeholder token"
    );
}
