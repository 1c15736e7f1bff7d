//! `tollgate schema` against the loader, with an independent validator (the `jsonschema` crate):
//!
//! - every example config, `gateway.toml`, the deploy configs, the consumers files and every TOML
//!   snippet of the manual (completed as `tests/docs_snippets.rs` does) validate: the schema
//!   never refuses what the loader accepts;
//! - for a set of mutations of a config that uses every table (an unknown key at the top, in
//!   `[server]`, a route, a limit, a plan, `[[upstreams]]`, `[store]`…, a wrong type, a bad enum
//!   value, a malformed duration, address, CIDR, URL or subject) the loader refuses and the
//!   schema refuses. Rules only code checks (a cross-field rule) may pass the schema; none of
//!   the mutations here is such a rule;
//! - the committed `gateway.schema.json` is what `tollgate schema` prints today.

use std::path::{Path, PathBuf};

mod support;

use support::snippets::{complete, sandbox, toml_snippets, Snippet};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn validator(schema: &serde_json::Value) -> jsonschema::Validator {
    assert_eq!(
        schema["$schema"], "http://json-schema.org/draft-07/schema#",
        "the schema says which draft it is"
    );
    jsonschema::validator_for(schema).expect("the schema is a valid JSON Schema")
}

fn gateway_validator() -> jsonschema::Validator {
    validator(&tollgate::config::schema::gateway())
}

fn consumers_validator() -> jsonschema::Validator {
    validator(&tollgate::config::schema::consumers())
}

/// The TOML text as the JSON value a schema validates (what taplo does with a TOML file).
fn as_json(text: &str) -> serde_json::Value {
    let value: toml::Table = toml::from_str(text).expect("valid TOML");
    serde_json::to_value(value).unwrap()
}

/// `Err` with every complaint of the validator.
fn validate(v: &jsonschema::Validator, text: &str) -> Result<(), String> {
    let json = as_json(text);
    let errors: Vec<String> = v
        .iter_errors(&json)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Loads a config as `tollgate check` does, in `dir`.
fn load(dir: &Path, text: &str) -> Result<(), String> {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    tollgate::load::load_and_check(&path)
        .map(|_| ())
        .map_err(|e| format!("{e:#}"))
}

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

/// A consumers file is named `consumers.toml` (examples) or holds `[[consumer]]` tables.
fn is_consumers_file(path: &Path, text: &str) -> bool {
    path.file_name().is_some_and(|n| n == "consumers.toml") || text.contains("[[consumer]]")
}

#[test]
fn every_example_and_deploy_config_validates() {
    let gateway = gateway_validator();
    let consumers = consumers_validator();
    let mut files = vec![root().join("gateway.toml")];
    toml_files(&root().join("examples"), &mut files);
    toml_files(&root().join("deploy"), &mut files);
    let mut configs = 0;
    let mut consumer_files = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let result = if is_consumers_file(file, &text) {
            consumer_files += 1;
            validate(&consumers, &text)
        } else {
            configs += 1;
            // The loader accepts it (so the schema must too).
            tollgate::load::load_and_check(file)
                .map_err(|e| format!("the loader refuses it: {e:#}"))
                .and_then(|_| validate(&gateway, &text))
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    eprintln!("{configs} configs and {consumer_files} consumers files validated");
    assert!(configs >= 15, "only {configs} configs found");
    assert!(
        consumer_files >= 2,
        "only {consumer_files} consumers files found"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_manual_snippet_validates() {
    let gateway = gateway_validator();
    let consumers = consumers_validator();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (page, block) in toml_snippets() {
        let result = match complete(&block.info, &block.text) {
            Ok(Snippet::Config(config)) => validate(&gateway, &config),
            Ok(Snippet::ConsumersFile { file, config }) => {
                validate(&consumers, &file).and_then(|_| validate(&gateway, &config))
            }
            Ok(Snippet::NoCheck) => continue,
            // `tests/docs_snippets.rs` reports these.
            Err(_) => continue,
        };
        checked += 1;
        if let Err(e) = result {
            failures.push(format!(
                "{}:{} ({}): {e}",
                page.display(),
                block.line,
                block.info
            ));
        }
    }
    eprintln!("{checked} snippets validated");
    assert!(checked >= 40, "only {checked} snippets validated");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A config with every table the mutations below touch; the loader and the schema accept it.
const BASE: &str = r#"
[server]
listen = "127.0.0.1:0"
trusted_proxies = ["10.0.0.0/8", "192.0.2.7"]
header_read_timeout = "5s"
forwarded_header = "X-Forwarded-For"
http1 = "fast"

[server.tls]
cert = "cert.pem"
key = "key.pem"

[admin]
listen = "127.0.0.1:0"
token_file = "admin-tokens"

[store]
backend = "memory"
timeout = "50ms"

[log]
access = "off"

[jwt]
jwks_file = "jwks.json"
algorithms = ["RS256"]
leeway = "30s"

[tracing]
service_name = "tollgate"

[consumers]
header = "X-Api-Key"
file = "consumers.toml"

[[plans]]
name = "free"
[[plans.limits]]
name = "per-minute"
algorithm = "gcra"
limit = 60
period = "1m"

[[upstreams]]
name = "backend"
servers = ["http://127.0.0.1:3000", { url = "http://127.0.0.1:3001", weight = 2 }]
balance = "round_robin"
[upstreams.health_check]
path = "/health"

[[upstreams]]
name = "secure"
servers = ["https://127.0.0.1:8443"]
[upstreams.tls]
server_name = "api.internal"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "backend"
consumers = true
jwt = "optional"
rewrite = { match = "^/api/(.*)$", to = "/$1" }
[routes.request_headers]
set = { "X-From" = "tollgate" }
[routes.response_headers]
remove = ["Server"]
[routes.cors]
allow_origins = ["https://app.example.com"]
max_age = "10m"
[[routes.limits]]
name = "per-ip"
algorithm = "token_bucket"
limit = 10
period = "1s"
subject = "ip"
exempt = ["10.0.0.0/8", "consumer:ops"]
[[routes.limits]]
name = "tokens"
algorithm = "token_bucket"
limit = 100000
period = "1h"
subject = ["header:x-tenant", "ip"]
cost_from = [{ path = "json:usage.total_tokens", weight = 2 }]

[[routes]]
name = "old"
path_prefix = "/old"
redirect = { to = "/api", status = 301 }

[[routes]]
name = "direct"
path_prefix = "/direct"
upstream = "http://127.0.0.1:3002/base"
"#;

/// `BASE` with the value at `path` (keys and array indexes joined by `.`) set to `value` (a TOML
/// value as written).
fn mutate(path: &str, value: &str) -> String {
    let mut doc: toml::Value = toml::Value::Table(toml::from_str(BASE).unwrap());
    let value: toml::Table = toml::from_str(&format!("v = {value}")).unwrap();
    let value = value["v"].clone();
    let keys: Vec<&str> = path.split('.').collect();
    let (last, parents) = keys.split_last().unwrap();
    let mut at = &mut doc;
    for k in parents {
        at = match k.parse::<usize>() {
            Ok(i) => &mut at.as_array_mut().unwrap()[i],
            Err(_) => at.as_table_mut().unwrap().get_mut(*k).unwrap(),
        };
    }
    match last.parse::<usize>() {
        Ok(i) => at.as_array_mut().unwrap()[i] = value,
        Err(_) => {
            at.as_table_mut().unwrap().insert((*last).to_owned(), value);
        }
    }
    toml::to_string(&doc).unwrap()
}

#[test]
fn the_schema_and_the_loader_refuse_the_same_mutations() {
    let schema = gateway_validator();
    let dir = sandbox();
    assert_eq!(
        load(dir.path(), BASE),
        Ok(()),
        "the loader accepts the base"
    );
    assert_eq!(
        validate(&schema, BASE),
        Ok(()),
        "the schema accepts the base"
    );
    // (path, value, what it is)
    let mutations: &[(&str, &str, &str)] = &[
        // Unknown keys, one per table.
        ("listen", "\"0.0.0.0:1\"", "an unknown key at the top"),
        (
            "server.listen_on",
            "\"0.0.0.0:1\"",
            "an unknown key in [server]",
        ),
        (
            "server.tls.chain",
            "\"x.pem\"",
            "an unknown key in [server.tls]",
        ),
        ("admin.tokens", "\"x\"", "an unknown key in [admin]"),
        ("store.urll", "\"redis://x\"", "an unknown key in [store]"),
        ("log.level", "\"info\"", "an unknown key in [log]"),
        ("jwt.issuers", "[\"x\"]", "an unknown key in [jwt]"),
        (
            "tracing.endpoint",
            "\"http://x\"",
            "an unknown key in [tracing]",
        ),
        (
            "consumers.headers",
            "\"x\"",
            "an unknown key in [consumers]",
        ),
        ("plans.0.limitz", "[]", "an unknown key in a plan"),
        (
            "plans.0.limits.0.subjekt",
            "\"ip\"",
            "an unknown key in a plan's limit",
        ),
        (
            "upstreams.0.server",
            "[\"http://x:1\"]",
            "an unknown key in [[upstreams]]",
        ),
        (
            "upstreams.0.servers.1",
            "{ url = \"http://127.0.0.1:3001\", wieght = 2 }",
            "an unknown key in a server table",
        ),
        (
            "upstreams.0.health_check.every",
            "\"5s\"",
            "an unknown key in a health check",
        ),
        (
            "upstreams.1.tls.insecure",
            "true",
            "an unknown key in [upstreams.tls]",
        ),
        ("routes.0.path", "\"/x\"", "an unknown key in a route"),
        ("routes.0.limits.0.burts", "5", "an unknown key in a limit"),
        (
            "routes.0.cors.allow_origin",
            "[\"*\"]",
            "an unknown key in [routes.cors]",
        ),
        (
            "routes.0.request_headers.append",
            "{ a = \"b\" }",
            "an unknown key in request_headers",
        ),
        (
            "routes.0.response_headers.delete",
            "[\"a\"]",
            "an unknown key in response_headers",
        ),
        (
            "routes.0.rewrite.from",
            "\"^/\"",
            "an unknown key in rewrite",
        ),
        (
            "routes.1.redirect.code",
            "301",
            "an unknown key in redirect",
        ),
        (
            "routes.0.limits.1.cost_from.0.factor",
            "2",
            "an unknown key in a cost_from source",
        ),
        // Wrong types.
        (
            "routes.0.limits.0.limit",
            "\"ten\"",
            "a string for an integer",
        ),
        ("routes.0.strip_prefix", "\"yes\"", "a string for a bool"),
        ("server.workers", "\"4\"", "a string for workers"),
        (
            "server.trusted_proxies",
            "\"10.0.0.0/8\"",
            "a string for a list",
        ),
        ("routes.0.limits.0.limit", "0", "a zero limit"),
        ("store", "\"memory\"", "a string for a table"),
        (
            "routes",
            "{ name = \"x\" }",
            "a table for an array of tables",
        ),
        // Bad enum values.
        (
            "routes.0.limits.0.algorithm",
            "\"token-bucket\"",
            "a bad algorithm",
        ),
        ("store.backend", "\"redis-cluster\"", "a bad backend"),
        ("store.on_error", "\"fail\"", "a bad on_error"),
        ("upstreams.0.balance", "\"random\"", "a bad balance"),
        ("upstreams.0.protocol", "\"http2\"", "a bad protocol"),
        ("server.http1", "\"fastest\"", "a bad http1 front"),
        ("server.path_params", "\"keep\"", "a bad path_params"),
        ("server.proxy_protocol", "\"v3\"", "a bad proxy_protocol"),
        ("routes.0.limits.0.mode", "\"dry_run\"", "a bad mode"),
        (
            "routes.0.limits.0.on_missing",
            "\"deny\"",
            "a bad on_missing",
        ),
        ("routes.0.limits.0.store", "\"global\"", "a bad limit store"),
        ("routes.0.limits.0.sync", "\"eventual\"", "a bad sync"),
        ("routes.0.jwt", "\"yes\"", "a bad jwt mode"),
        ("log.format", "\"text\"", "a bad log format"),
        (
            "tracing.otlp_protocol",
            "\"http/json\"",
            "a bad OTLP protocol",
        ),
        ("plans.0.limits.0.scope", "\"world\"", "a bad scope"),
        ("routes.1.redirect.status", "303", "a bad redirect status"),
        ("routes.0.limits.0.calendar", "\"year\"", "a bad calendar"),
        (
            "server.forwarded_header",
            "\"X-Real-IP\"",
            "a bad forwarded_header",
        ),
        ("jwt.algorithms", "[\"none\"]", "the none algorithm"),
        // Strings the loader parses.
        (
            "routes.0.limits.0.period",
            "\"10 parsecs\"",
            "a bad duration",
        ),
        (
            "routes.0.limits.0.period",
            "\"10\"",
            "a duration without a unit",
        ),
        (
            "server.listen",
            "\"localhost\"",
            "a listen address without a port",
        ),
        ("server.trusted_proxies", "[\"10.0.0.0/x\"]", "a bad CIDR"),
        (
            "routes.2.upstream",
            "\"ftp://127.0.0.1:21\"",
            "an upstream URL that is not http",
        ),
        (
            "routes.2.upstream",
            "\"http://u:p@127.0.0.1:1\"",
            "an upstream URL with user-info",
        ),
        (
            "routes.2.upstream",
            "\"http://127.0.0.1:1/?q=1\"",
            "an upstream URL with a query",
        ),
        ("routes.0.upstream", "\"back end\"", "a bad group name"),
        (
            "upstreams.0.servers.0",
            "\"127.0.0.1:3000\"",
            "a server without a scheme",
        ),
        (
            "routes.0.limits.0.subject",
            "\"headers:x\"",
            "a bad subject",
        ),
        ("routes.0.limits.0.subject", "[]", "an empty subject list"),
        (
            "routes.0.limits.0.subject",
            "[\"ip\", \"global\"]",
            "global in a subject list",
        ),
        (
            "routes.0.limits.0.subject",
            "[\"ip\", \"ip\"]",
            "a subject part twice",
        ),
        (
            "routes.0.limits.0.exempt",
            "[\"consumer:\"]",
            "an exemption without a name",
        ),
        ("server.ipv4_prefix", "33", "an IPv4 prefix above 32"),
        (
            "routes.0.limits.0.ipv6_prefix",
            "129",
            "an IPv6 prefix above 128",
        ),
        ("routes.0.max_json_bytes", "0", "max_json_bytes of 0"),
        ("routes.0.limit_rate", "-1", "a negative limit_rate"),
        ("routes.0.limit_rate", "\"1.5m\"", "a fractional limit_rate"),
        (
            "routes.0.limit_rate",
            "\"64kb\"",
            "a limit_rate with an unknown suffix",
        ),
        (
            "plans.0.limit_rate_after",
            "\"-5\"",
            "a negative limit_rate_after",
        ),
        (
            "routes.0.rewrite.to",
            "\"api/$1\"",
            "a rewrite target without a leading /",
        ),
        (
            "server.request_id_header",
            "\"x_request_id\"",
            "a header name with '_'",
        ),
    ];
    let mut disagreements = Vec::new();
    for (path, value, what) in mutations {
        let text = mutate(path, value);
        let loader = load(dir.path(), &text);
        let schema = validate(&schema, &text);
        match (&loader, &schema) {
            (Err(_), Err(_)) => {}
            _ => disagreements.push(format!(
                "{what} ({path} = {value}): loader {loader:?}, schema {schema:?}"
            )),
        }
    }
    assert!(
        disagreements.is_empty(),
        "the loader and the schema disagree:\n{}",
        disagreements.join("\n")
    );
}

#[test]
fn the_schema_accepts_every_spelling_the_loader_does() {
    // Where the schema has a pattern for a string the loader parses, spellings the loader accepts
    // that a too-strict pattern would refuse.
    let schema = gateway_validator();
    let dir = sandbox();
    let accepted: &[(&str, &str)] = &[
        ("routes.0.limits.0.period", "\"1.5s\""),
        ("routes.0.limits.0.period", "\"1m30s\""),
        ("routes.0.limits.0.period", "\"1m 30s\""),
        ("routes.0.limits.0.period", "\"500 ms\""),
        ("routes.0.limits.0.period", "\" 2days \""),
        ("routes.0.limits.0.period", "\"1hour\""),
        ("routes.0.limits.0.period", "\"250msec\""),
        ("server.listen", "\"[::1]:8080\""),
        (
            "server.trusted_proxies",
            "[\"::ffff:10.0.0.0/104\", \" 2001:db8::/32 \", \"::1\"]",
        ),
        ("server.forwarded_header", "\"forwarded\""),
        ("server.real_ip_header", "\"CF-Connecting-IP\""),
        ("routes.2.upstream", "\"HTTPS://127.0.0.1:8443/a/b/\""),
        ("routes.2.upstream", "\"http://[::1]:3000\""),
        ("routes.2.upstream", "\"http://localhost\""),
        (
            "routes.0.limits.0.subject",
            "[\"cookie:session_id\", \"jwt:org.id\", \"json:a.b\"]",
        ),
        (
            "routes.0.limits.0.exempt",
            "[\"consumer:ops team\", \"::1\"]",
        ),
        (
            "upstreams.0.servers.0",
            "{ url = \"http://127.0.0.1:3000\" }",
        ),
        ("jwt.algorithms", "[\" RS256 \", \"PS512\"]"),
        ("jwt.audience", "[\"a\", \"b\"]"),
        ("routes.0.limits.1.cost_from", "\"trailer:x-cost\""),
        ("routes.0.limit_rate", "\" 64K \""),
        ("routes.0.limit_rate", "0"),
        ("routes.0.limit_rate", "\"1g\""),
    ];
    let mut failures = Vec::new();
    for (path, value) in accepted {
        let text = mutate(path, value);
        let loader = load(dir.path(), &text);
        let schema = validate(&schema, &text);
        if loader.is_err() || schema.is_err() {
            failures.push(format!(
                "{path} = {value}: loader {loader:?}, schema {schema:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_consumers_schema_refuses_what_the_loader_refuses() {
    let schema = consumers_validator();
    let key = "e2186dbdb1bb4193608605e84f33208765b5693b55edd4f730a719a100eeea6f";
    let good = format!("[[consumer]]\nname = \"acme\"\nplan = \"free\"\nkey_sha256 = \"{key}\"\n");
    let load_with = |file: &str| {
        let dir = sandbox();
        std::fs::write(dir.path().join("consumers.toml"), file).unwrap();
        load(dir.path(), support::snippets::CONSUMERS_CONFIG)
    };
    assert_eq!(load_with(&good), Ok(()));
    assert_eq!(validate(&schema, &good), Ok(()));
    let bad = [
        format!("{good}plans = \"gold\"\n"),
        good.replace(key, "xyz"),
        good.replace("[[consumer]]", "[[consumers]]"),
        format!("{good}anchor_day = 31\n"),
    ];
    for text in &bad {
        assert!(load_with(text).is_err(), "the loader accepts {text}");
        assert!(
            validate(&schema, text).is_err(),
            "the schema accepts {text}"
        );
    }
}

#[test]
fn the_committed_schema_is_what_tollgate_schema_prints() {
    let printed = std::process::Command::new(support::tollgate_bin())
        .arg("schema")
        .output()
        .unwrap();
    assert!(printed.status.success());
    let printed = String::from_utf8(printed.stdout).unwrap();
    let value: serde_json::Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(value, tollgate::config::schema::gateway());
    let committed = std::fs::read_to_string(root().join("gateway.schema.json")).unwrap();
    assert!(
        committed == printed,
        "gateway.schema.json is stale: run `cargo run -- schema > gateway.schema.json`"
    );
    // `gateway.toml` points editors at it, with a line the loader reads as a comment.
    let config = std::fs::read_to_string(root().join("gateway.toml")).unwrap();
    assert!(config.starts_with("#:schema ./gateway.schema.json\n"));

    let consumers = std::process::Command::new(support::tollgate_bin())
        .args(["schema", "consumers"])
        .output()
        .unwrap();
    assert!(consumers.status.success());
    let value: serde_json::Value = serde_json::from_slice(&consumers.stdout).unwrap();
    assert_eq!(value, tollgate::config::schema::consumers());
}
