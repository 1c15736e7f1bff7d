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
    tollgate::runtime::load::load_and_check(&path)
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
            tollgate::runtime::load::load_and_check(file)
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

[cache]
statuses = [200]

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
        ("routes.0.paths", "\"/x\"", "an unknown key in a route"),
        (
            "routes.0.path",
            "\"/x\"",
            "an exact path beside a path_prefix",
        ),
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
            "server.listen",
            "\"127.0.0.1:65536\"",
            "a listen port above 65535",
        ),
        (
            "server.listen",
            "\"256.0.0.1:80\"",
            "a listen address with an octet above 255",
        ),
        (
            "server.listen",
            "\"010.0.0.1:80\"",
            "a listen address with a leading zero in an octet",
        ),
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
        // Issue 50 item 22: a port with leading zeros is the port.
        ("server.listen", "\"127.0.0.1:000080\""),
        ("server.listen", "\"127.0.0.1:65535\""),
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

// ---------------------------------------------------------------------------------------------
// Issue 50 item 22: every bound of the schema is the loader's.

/// `BASE` with each `(path, value)` set (keys and array indexes joined by `.`; a missing table
/// on the way is created; the value `!remove` removes the key).
fn mutate_all(changes: &[(&str, &str)]) -> String {
    let mut doc: toml::Value = toml::Value::Table(toml::from_str(BASE).unwrap());
    for (path, value) in changes {
        let remove = *value == "!remove";
        let value: toml::Table = if remove {
            toml::Table::new()
        } else {
            toml::from_str(&format!("v = {value}")).unwrap()
        };
        let value = value
            .get("v")
            .cloned()
            .unwrap_or(toml::Value::Boolean(false));
        let keys: Vec<&str> = path.split('.').collect();
        let (last, parents) = keys.split_last().unwrap();
        let mut at = &mut doc;
        for k in parents {
            at = match k.parse::<usize>() {
                Ok(i) => &mut at.as_array_mut().unwrap()[i],
                Err(_) => at
                    .as_table_mut()
                    .unwrap()
                    .entry(*k)
                    .or_insert_with(|| toml::Value::Table(toml::Table::new())),
            };
        }
        match last.parse::<usize>() {
            Ok(i) => at.as_array_mut().unwrap()[i] = value,
            Err(_) if remove => {
                at.as_table_mut().unwrap().remove(*last);
            }
            Err(_) => {
                at.as_table_mut().unwrap().insert((*last).to_owned(), value);
            }
        }
    }
    toml::to_string(&doc).unwrap()
}

/// `node` with its `$ref`s and one-element `allOf`s followed: the node and its JSON pointer.
fn resolve<'s>(
    root: &'s serde_json::Value,
    mut node: &'s serde_json::Value,
    mut pointer: String,
) -> (&'s serde_json::Value, String) {
    loop {
        if let Some(r) = node.get("$ref").and_then(|r| r.as_str()) {
            let name = r.trim_start_matches("#/definitions/");
            pointer = format!("/definitions/{name}");
            node = &root["definitions"][name];
        } else if let Some([one]) = node
            .get("allOf")
            .and_then(|a| a.as_array())
            .map(Vec::as_slice)
        {
            pointer.push_str("/allOf/0");
            node = one;
        } else {
            return (node, pointer);
        }
    }
}

/// The schema of the value at `path` of the config, and its pointer.
fn schema_at<'s>(
    root: &'s serde_json::Value,
    path: &str,
) -> Option<(&'s serde_json::Value, String)> {
    let (mut node, mut pointer) = (root, String::new());
    for seg in path.split('.') {
        let (n, p) = resolve(root, node, pointer);
        let want = if seg.parse::<usize>().is_ok() {
            "items"
        } else {
            "properties"
        };
        // A union (a server: a URL or a table) is entered by the branch that has what is wanted.
        let (n, p) = if n.get(want).is_some() {
            (n, p)
        } else {
            let branches = n.get("anyOf").or_else(|| n.get("oneOf"))?.as_array()?;
            let i = branches
                .iter()
                .position(|b| resolve(root, b, String::new()).0.get(want).is_some())?;
            let (b, bp) = resolve(root, &branches[i], format!("{p}/anyOf/{i}"));
            (b, bp)
        };
        (node, pointer) = if want == "items" {
            (n.get("items")?, format!("{p}/items"))
        } else {
            (
                n.get("properties")?.get(seg)?,
                format!("{p}/properties/{seg}"),
            )
        };
    }
    Some(resolve(root, node, pointer))
}

/// The values on both sides of every bound of `node` (its own, its union's branches', its
/// items'), as TOML.
fn samples(root: &serde_json::Value, node: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut choices = Vec::new();
    let mut nodes = vec![node];
    let mut array = false;
    if node.get("type").and_then(|t| t.as_str()) == Some("array") {
        array = true;
        nodes = vec![resolve(root, &node["items"], String::new()).0];
    }
    let mut i = 0;
    while i < nodes.len() {
        let n = resolve(root, nodes[i], String::new()).0;
        i += 1;
        if let Some(e) = n.get("enum").and_then(|e| e.as_array()) {
            choices.extend(e.iter().cloned());
        }
        if let Some(c) = n.get("const") {
            choices.push(c.clone());
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(b) = n.get(key).and_then(|b| b.as_array()) {
                nodes.extend(b.iter());
            }
        }
        let (min, max) = (
            n.get("minimum").and_then(|m| m.as_i64()),
            n.get("maximum").and_then(|m| m.as_i64()),
        );
        for v in [min.map(|m| m - 1), min, max, max.map(|m| m + 1)]
            .into_iter()
            .flatten()
        {
            out.push(v.to_string());
        }
    }
    let ints: Vec<i64> = choices.iter().filter_map(|c| c.as_i64()).collect();
    for c in &choices {
        out.push(c.to_string());
    }
    if choices.iter().any(|c| c.is_string()) {
        out.push("\"not-a-choice\"".into());
    }
    if let (Some(lo), Some(hi)) = (ints.iter().min(), ints.iter().max()) {
        out.push((lo - 1).to_string());
        out.push((hi + 1).to_string());
    }
    if array {
        out = out.into_iter().map(|v| format!("[{v}]")).collect();
    }
    out
}

/// Every node of the schema with a bound of its own: a `maximum`, a `minimum` other than the
/// 0 of an unsigned type, or a list of choices (`enum`, `const`s).
fn bounded(node: &serde_json::Value, pointer: &str, out: &mut Vec<String>) {
    match node {
        serde_json::Value::Object(map) => {
            let consts = map
                .get("oneOf")
                .and_then(|o| o.as_array())
                .is_some_and(|o| o.iter().all(|b| b.get("const").is_some()));
            if map.contains_key("maximum")
                || map.get("minimum").is_some_and(|m| m != 0)
                || map.contains_key("enum")
                || consts
            {
                out.push(pointer.to_owned());
            }
            for (k, v) in map {
                bounded(v, &format!("{pointer}/{k}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                bounded(v, &format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Keys whose bounds are sampled: the config path, and what else it needs set to be taken
/// (a cross-field rule of the loader).
const BOUNDED_KEYS: &[(&str, &[(&str, &str)])] = &[
    ("server.compression.level", &[]),
    ("cache.statuses.0", &[]),
    ("server.compression.algorithms", &[]),
    ("upstreams.0.servers.1.weight", &[]),
    (
        "routes.0.limits.0.anchor_day",
        &[
            ("routes.0.limits.0.calendar", "\"month\""),
            ("routes.0.limits.0.algorithm", "\"fixed_window\""),
            ("routes.0.limits.0.period", "!remove"),
        ],
    ),
    ("routes.1.redirect.status", &[]),
    ("routes.0.refusal.status", &[]),
    ("server.ipv4_prefix", &[]),
    ("routes.0.limits.0.ipv6_prefix", &[]),
    ("routes.0.max_json_bytes", &[]),
    ("routes.0.limits.0.mode", &[]),
    (
        "routes.0.limits.0.on_missing",
        &[("routes.0.limits.0.subject", "\"header:x-a\"")],
    ),
    ("routes.0.limits.0.store", &[]),
    (
        "routes.0.limits.0.sync",
        &[
            ("store.backend", "\"redis\""),
            ("store.url", "\"redis://127.0.0.1:1\""),
        ],
    ),
    ("upstreams.0.balance", &[]),
    ("server.http1", &[]),
    ("server.max_pending_body_bytes_per_connection", &[]),
    ("server.max_pending_body_bytes_per_worker", &[]),
    ("server.path_params", &[]),
    ("store.on_error", &[]),
    ("log.format", &[]),
    ("tracing.otlp_protocol", &[]),
    ("routes.0.jwt", &[]),
    ("plans.0.limits.0.scope", &[]),
    ("routes.0.limits.0.algorithm", &[]),
    ("routes.0.limits.0.limit", &[]),
    ("routes.0.limits.0.cost", &[]),
    (
        "routes.0.limits.0.ban_after",
        &[("routes.0.limits.0.ban_for", "\"1m\"")],
    ),
    ("routes.0.limits.1.cost_from.0.weight", &[]),
    ("store.max_subjects", &[]),
    ("server.tls.min_version", &[]),
    ("server.tls.unknown_sni", &[]),
    ("server.http3.max_concurrent_streams", &[]),
    ("server.http3.max_udp_payload", &[]),
    ("server.http3.retry", &[]),
];

#[test]
fn the_schema_and_the_loader_agree_at_every_bound() {
    let root = tollgate::config::schema::gateway();
    let schema = validator(&root);
    let dir = sandbox();
    let mut disagreements = Vec::new();
    let mut sampled = Vec::new();
    let mut count = 0;
    for (path, context) in BOUNDED_KEYS {
        let (node, pointer) =
            schema_at(&root, path).unwrap_or_else(|| panic!("the schema has no {path}"));
        sampled.push(pointer.clone());
        let values = samples(&root, node);
        assert!(values.len() >= 2, "{path} ({pointer}): no bound to sample");
        for value in values {
            let mut changes = context.to_vec();
            changes.push((path, &value));
            let text = mutate_all(&changes);
            let loader = load(dir.path(), &text);
            let by_schema = validate(&schema, &text);
            count += 1;
            if loader.is_ok() != by_schema.is_ok() {
                disagreements.push(format!(
                    "{path} = {value}: loader {loader:?}, schema {by_schema:?}"
                ));
            }
        }
    }
    eprintln!(
        "{count} values sampled at the bounds of {} keys",
        BOUNDED_KEYS.len()
    );
    assert!(
        disagreements.is_empty(),
        "the loader and the schema disagree:\n{}",
        disagreements.join("\n")
    );
    // Every bounded node of the schema is sampled (or said here why not).
    let mut all = Vec::new();
    bounded(&root, "", &mut all);
    let unsampled: Vec<&String> = all
        .iter()
        .filter(|p| !sampled.iter().any(|s| p.starts_with(s.as_str())))
        .filter(|p| !NOT_SAMPLED.iter().any(|(n, _)| p.starts_with(n)))
        .collect();
    assert!(
        unsampled.is_empty(),
        "bounds of the schema no sample reaches (add them to BOUNDED_KEYS):\n{unsampled:#?}"
    );
}

/// Bounded nodes not sampled above, and why.
const NOT_SAMPLED: &[(&str, &str)] = &[
    (
        "/definitions/RouteCache/properties/statuses",
        "the same schema as Cache/properties/statuses (sampled), checked by the same function",
    ),
    (
        "/definitions/Limit/then/properties/limit",
        "the same key as Limit/properties/limit (sampled), its bound when `unit` is not bytes",
    ),
    (
        "/definitions/AcmeChallenge",
        "needs an ACME account and directory in the base config",
    ),
    (
        "/definitions/ClientAuthMode",
        "needs a client CA file in the base config",
    ),
    (
        "/definitions/ClientCertDemand",
        "needs [server.tls.client_auth] in the base config",
    ),
    (
        "/definitions/Backend",
        "each choice needs its own keys (`url` for redis, `nodes` for a cluster)",
    ),
    (
        "/definitions/Calendar",
        "each choice needs a period of its own length",
    ),
    (
        "/definitions/Unit",
        "`bytes` needs the response-limit keys with it",
    ),
    ("/definitions/CountedBytes", "only with `unit = \"bytes\"`"),
    (
        "/definitions/ProxyProtocolMode",
        "every choice but `off` needs `proxy_protocol_from`, which `off` refuses (a rule across keys)",
    ),
    (
        "/definitions/Protocol",
        "`h2` needs https:// servers and `h2c` http:// ones: no one group takes every choice",
    ),
    (
        "/definitions/Limit/properties/limit_max",
        "only on a plan's limit that consumers override",
    ),
];
