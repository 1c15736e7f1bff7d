//! Operability through the real binary: the access log, request ids, `/-/top` (who is being
//! throttled) and `/-/explain`. Store-facing scenarios run on every store (`on_every_store!`).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;
use tollgate::limiter::SubjectDigest;

on_every_store!(
    access_log_lines_carry_every_field,
    top_lists_denied_subjects_in_order_without_raw_keys,
    explain_reports_what_the_next_request_gets_and_charges_nothing,
);

/// A gateway on `kind`'s store with `extra` put at the top of the file (e.g. a `[log]` table)
/// and `server_extra` into `[server]`.
async fn gw_with(kind: Kind, server_extra: &str, extra: &str, routes: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let cfg = config(&env.store, routes)
        .replacen("[server]\n", &format!("[server]\n{server_extra}\n"), 1)
        .replacen("[store]\n", &format!("{extra}\n[store]\n"), 1);
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    (gw, env)
}

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// The TOML string for a path.
fn toml_path(p: &Path) -> String {
    p.display().to_string().replace('\\', "\\\\")
}

/// Waits until the file at `path` has at least `n` lines; returns them parsed as JSON.
async fn log_lines(path: &Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n || Instant::now() > deadline {
            return text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port nothing listens on.
fn dead_upstream() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

const FIELDS: &[&str] = &[
    "ts",
    "request_id",
    "client_ip",
    "method",
    "host",
    "path",
    "status",
    "bytes_sent",
    "duration_ms",
    "upstream_ms",
    "route",
    "upstream",
    "limit",
    "decision",
    "consumer",
];

fn assert_fields(line: &Value) {
    let obj = line.as_object().unwrap();
    for f in FIELDS {
        assert!(obj.contains_key(*f), "no {f} in {line}");
    }
    assert_eq!(obj.len(), FIELDS.len(), "{line}");
    let ts = line["ts"].as_str().unwrap();
    // RFC 3339, UTC, microseconds: 2025-01-31T23:59:59.123456Z
    assert_eq!(ts.len(), 27, "{ts}");
    assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T' && ts.as_bytes()[19] == b'.');
    assert!(line["duration_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(line["client_ip"], "127.0.0.1");
}

async fn access_log_lines_carry_every_field(kind: Kind) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"header:x-api-key\"")
        + &route("dead", "/dead", &dead_upstream(), "")
        + &route("sh", "/sh", &up.url(), "")
        + &limit("name = \"trial\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"\nmode = \"shadow\"")
        + &route("queue", "/queue", &up.url(), "")
        + &limit("name = \"smooth\"\nalgorithm = \"leaky_bucket\"\nlimit = 10\nperiod = \"1s\"\nburst = 1\nsubject = \"ip\"");
    let (gw, _env) = gw_with(
        kind,
        "",
        &format!("[log]\naccess = \"{}\"\nformat = \"json\"", toml_path(&log)),
        &routes,
    )
    .await;
    let c = client();
    let key = "raw-secret-key-1";
    let mut sent = Vec::new();
    for (path, want) in [
        ("/api/a?token=query-secret", 200),
        ("/api/b", 429),
        ("/nothing/here", 404),
        ("/dead/x", 502),
        ("/sh/1", 200),
        ("/sh/2", 200),
        ("/queue/1", 200),
        ("/queue/2", 200),
    ] {
        let res = c
            .get(gw.url(path))
            .header("x-api-key", key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{path}");
        let id = h(&res, "x-request-id");
        let body = res.bytes().await.unwrap();
        sent.push((id, body.len()));
    }
    let lines = log_lines(&log, 8).await;
    assert_eq!(lines.len(), 8, "{lines:?}");
    // One line per request, found by its id: requests on different connections (a 502 closes
    // its connection) may be logged in another order than they were answered.
    let lines: Vec<Value> = sent
        .iter()
        .map(|(id, _)| {
            lines
                .iter()
                .find(|l| l["request_id"] == id.as_str())
                .cloned()
                .unwrap_or_else(|| panic!("no line for request {id}: {lines:?}"))
        })
        .collect();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(key), "a raw API key in the access log");
    assert!(
        !text.contains("query-secret"),
        "a query string in the access log"
    );
    for (l, (id, len)) in lines.iter().zip(&sent) {
        assert_fields(l);
        assert_eq!(l["request_id"], id.as_str());
        assert_eq!(l["bytes_sent"], *len as u64, "{l}");
        assert_eq!(l["method"], "GET");
        assert_eq!(l["host"], "127.0.0.1");
    }
    let up_addr = up.addr.to_string();
    let (ok, limited, missing, dead) = (&lines[0], &lines[1], &lines[2], &lines[3]);
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["path"], "/api/a");
    assert_eq!(ok["route"], "api");
    assert_eq!(ok["upstream"], up_addr.as_str());
    assert!(ok["upstream_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(ok["decision"], "allowed");
    assert_eq!(ok["limit"], Value::Null);

    assert_eq!(limited["status"], 429);
    assert_eq!(limited["decision"], "limited");
    assert_eq!(limited["limit"], "per-key");
    assert_eq!(
        limited["upstream"],
        Value::Null,
        "the upstream was not called"
    );
    assert_eq!(limited["upstream_ms"], Value::Null);

    assert_eq!(missing["status"], 404);
    assert_eq!(missing["path"], "/nothing/here");
    assert_eq!(missing["route"], Value::Null);
    assert_eq!(missing["decision"], Value::Null);

    assert_eq!(dead["status"], 502);
    assert_eq!(dead["route"], "dead");
    assert!(dead["upstream"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(dead["upstream_ms"].as_f64().is_some());
    assert_eq!(
        dead["decision"],
        Value::Null,
        "a route without limits decides nothing"
    );

    assert_eq!(lines[4]["decision"], "allowed");
    assert_eq!(lines[5]["decision"], "shadow");
    assert_eq!(
        lines[5]["limit"], "trial",
        "the shadow limit that would have denied"
    );
    assert_eq!(lines[6]["decision"], "allowed");
    assert_eq!(lines[7]["decision"], "delayed");
    assert!(
        lines[7]["duration_ms"].as_f64().unwrap() >= 50.0,
        "{}",
        lines[7]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_open_requests_are_logged_as_fail_open() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let cfg = config(
        &format!(
            "backend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"100ms\"\non_error = \"allow\"",
            free_port()
        ),
        &(route("api", "/api", &up.url(), "")
            + &limit("name = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1m\"\nsubject = \"ip\"")),
    )
    .replacen(
        "[store]\n",
        &format!("[log]\naccess = \"{}\"\n\n[store]\n", toml_path(&log)),
        1,
    );
    let gw = gateway(&cfg);
    let res = client().get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(res.status(), 200, "the store is down: fail open");
    let lines = log_lines(&log, 1).await;
    assert_fields(&lines[0]);
    assert_eq!(lines[0]["decision"], "fail_open");
    assert_eq!(lines[0]["status"], 200);
    assert_eq!(lines[0]["route"], "api");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sink_nobody_reads_neither_slows_requests_nor_grows_memory() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("access.fifo");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo failed");
    // Nobody opens the FIFO for reading: the writer blocks in open(2) for good.
    let cfg = config("backend = \"memory\"", "").replacen(
        "[store]\n",
        &format!("[log]\naccess = \"{}\"\n\n[store]\n", toml_path(&fifo)),
        1,
    );
    let gw = gateway(&cfg);
    let c = client();
    // More than the writer's queue and its batch in hand: the rest must be dropped, not waited
    // for. Each request has a deadline, so a request blocked by the sink fails the test.
    let total = tollgate::access_log::CAPACITY + 2_000;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..16 {
        let c = c.clone();
        let url = gw.url("/no-route");
        tasks.push(tokio::spawn(async move {
            for _ in (t..total).step_by(16) {
                let res = c
                    .get(&url)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await
                    .expect("a request waited for the access log");
                assert_eq!(res.status(), 404);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = gw.metrics().await;
    let dropped = metric(&m, "tollgate_access_log_dropped_total").unwrap();
    let queued = (tollgate::access_log::CAPACITY + 1024) as f64;
    assert!(
        dropped >= total as f64 - queued,
        "{dropped} dropped of {total} ({:?})",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_access_log_is_reopened_on_sigusr1_and_follows_a_reload() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let routes = route("api", "/api", &up.url(), "");
    let with_log = config("backend = \"memory\"", &routes).replacen(
        "[store]\n",
        &format!("[log]\naccess = \"{}\"\n\n[store]\n", toml_path(&log)),
        1,
    );
    let gw = gateway(&with_log);
    let c = client();
    c.get(gw.url("/api/1")).send().await.unwrap();
    assert_eq!(log_lines(&log, 1).await.len(), 1);
    // logrotate: move the file, then SIGUSR1; the next line goes to a new file.
    std::fs::rename(&log, &rotated).unwrap();
    gw.signal(Signal::USR1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.logs().contains("reopening the access log") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.get(gw.url("/api/2")).send().await.unwrap();
    let lines = log_lines(&log, 1).await;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["path"], "/api/2");
    assert_eq!(log_lines(&rotated, 1).await.len(), 1);
    // A reload that turns the log off: no more lines.
    gw.write_config(&config("backend = \"memory\"", &routes));
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    c.get(gw.url("/api/3")).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(log_lines(&log, 1).await.len(), 1, "the log is off");
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_are_kept_generated_and_propagated() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"one\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    let c = client();
    // Kept: the client's valid id goes upstream and comes back.
    let res = c
        .get(gw.url("/api/a"))
        .header("x-request-id", "client-id-42")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "x-request-id"), "client-id-42");
    let seen = up.seen();
    assert_eq!(seen[0].headers["x-request-id"], "client-id-42");
    // Generated (none sent, or one too long): a UUID v7, the same upstream and back.
    let long = "x".repeat(129);
    for sent in [None, Some(long.as_str()), Some("has space")] {
        let mut r = c.get(gw.url("/api/b"));
        if let Some(v) = sent {
            r = r.header("x-request-id", v);
        }
        let res = r.send().await.unwrap();
        let id = h(&res, "x-request-id");
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(&id[14..15], "7", "UUID v7: {id}");
        // The 429's problem+json carries it too.
        assert_eq!(res.status(), 429);
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["request_id"], id.as_str());
    }
    // Every problem+json: a 404, with the client's id.
    let res = c
        .get(gw.url("/nowhere"))
        .header("x-request-id", "abc\"def")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(h(&res, "x-request-id"), "abc\"def");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["request_id"], "abc\"def");
    // Two generated ids differ.
    let a = c.get(gw.url("/nowhere")).send().await.unwrap();
    let b = c.get(gw.url("/nowhere")).send().await.unwrap();
    assert_ne!(h(&a, "x-request-id"), h(&b, "x-request-id"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_request_id_header_is_configurable() {
    let up = upstream().await;
    let cfg = config("backend = \"memory\"", &route("api", "/api", &up.url(), "")).replacen(
        "[server]\n",
        "[server]\nrequest_id_header = \"X-Trace-Id\"\n",
        1,
    );
    let gw = gateway(&cfg);
    let res = client()
        .get(gw.url("/api/a"))
        .header("x-trace-id", "t-1")
        .send()
        .await
        .unwrap();
    assert_eq!(h(&res, "x-trace-id"), "t-1");
    assert_eq!(h(&res, "x-request-id"), "");
    assert_eq!(up.seen()[0].headers["x-trace-id"], "t-1");
}

async fn top_lists_denied_subjects_in_order_without_raw_keys(kind: Kind) {
    let up = upstream().await;
    let fw = |name: &str, subject: &str| {
        limit(&format!(
            "name = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"{subject}\""
        ))
    };
    let routes = route("ips", "/ips", &up.url(), "")
        + &fw("per-ip", "ip")
        + &route("keys", "/keys", &up.url(), "")
        + &fw("per-key", "header:x-api-key");
    let (gw, _env) = gw_with(kind, "trusted_proxies = [\"127.0.0.1\"]", "", &routes).await;
    let c = client();
    // 3 addresses denied 5, 3 and 1 times; 2 keys denied 4 and 2 times (after one admitted
    // request each).
    for (ip, denied) in [("10.0.0.2", 3), ("10.0.0.1", 5), ("10.0.0.3", 1)] {
        for i in 0..=denied {
            let res = c
                .get(gw.url("/ips/x"))
                .header("x-forwarded-for", ip)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), if i == 0 { 200 } else { 429 });
        }
    }
    let keys = [("secret-key-aaa", 2), ("secret-key-bbb", 4)];
    for (key, denied) in keys {
        for i in 0..=denied {
            let res = c
                .get(gw.url("/keys/x"))
                .header("x-api-key", key)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), if i == 0 { 200 } else { 429 });
        }
    }
    // A request without the key is counted by its address (`on_missing = "ip"`), and shown so.
    for want in [200, 429] {
        let res = c
            .get(gw.url("/keys/x"))
            .header("x-forwarded-for", "10.0.0.9")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want);
    }
    let get = |q: &'static str| {
        let c = c.clone();
        let url = gw.admin_url(q);
        async move {
            let res = c.get(url).send().await.unwrap();
            let status = res.status();
            (status, res.text().await.unwrap())
        }
    };
    let (status, body) = get("/-/top?route=ips&limit=per-ip").await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["route"], "ips");
    assert_eq!(v["limit"], "per-ip");
    assert!(v["window_s"].as_u64().unwrap() >= 60);
    let want = serde_json::json!([
        {"subject": "ip", "ip": "10.0.0.1", "denied": 5},
        {"subject": "ip", "ip": "10.0.0.2", "denied": 3},
        {"subject": "ip", "ip": "10.0.0.3", "denied": 1},
    ]);
    assert_eq!(v["top"], want);

    let (_, body) = get("/-/top?route=keys&limit=per-key").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let short = |k: &str| SubjectDigest::of(b'h', k.as_bytes()).short_hex();
    let want = serde_json::json!([
        {"subject": "header", "key": short("secret-key-bbb"), "denied": 4},
        {"subject": "header", "key": short("secret-key-aaa"), "denied": 2},
        {"subject": "ip", "ip": "10.0.0.9", "denied": 1},
    ]);
    assert_eq!(v["top"], want);

    let (_, all) = get("/-/top").await;
    for (key, _) in keys {
        assert!(!all.contains(key), "a raw key in /-/top");
    }
    let v: Value = serde_json::from_str(&all).unwrap();
    let names: Vec<&str> = v["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["limit"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"per-ip") && names.contains(&"per-key"));
    assert_eq!(get("/-/top?route=ips&limit=nope").await.0, 404);
    assert_eq!(get("/-/top?route=nope").await.0, 404);
    assert_eq!(get("/-/top?bogus=1").await.0, 400);
    let (_, only) = get("/-/top?route=keys").await;
    let v: Value = serde_json::from_str(&only).unwrap();
    assert_eq!(v["limits"].as_array().unwrap().len(), 1);

    // `tollgate top --once` prints the table.
    let out = std::process::Command::new(tollgate_bin())
        .args(["top", "--once", "--admin", &gw.admin.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("ips") || l.starts_with("keys"))
        .collect();
    assert_eq!(rows.len(), 6, "{table}");
    assert!(
        rows[0].contains("10.0.0.1") && rows[0].ends_with('5'),
        "{table}"
    );
    assert!(rows[1].contains(&short("secret-key-bbb")), "{table}");
    assert!(!table.contains("secret-key"), "{table}");
    let out = std::process::Command::new(tollgate_bin())
        .args([
            "top",
            "--once",
            "--route",
            "keys",
            "--admin",
            &gw.admin.to_string(),
        ])
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        !table.contains("10.0.0.1") && table.contains("per-key"),
        "{table}"
    );

    // A reload that keeps the limits keeps what they denied.
    gw.write_config(&std::fs::read_to_string(&gw.config_path).unwrap().replace(
        "[[routes]]\nname = \"keys\"",
        "[[routes]]\nname = \"extra\"\npath_prefix = \"/extra\"\nupstream = \"http://127.0.0.1:9\"\n\n[[routes]]\nname = \"keys\"",
    ));
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (_, body) = get("/-/top?route=ips&limit=per-ip").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["top"][0]["denied"], 5, "{body}");
}

/// Every name `/-/top` is asked about is one it knows, or 404 naming it (the README's "an
/// unknown route or limit is 404"): `?limit=` alone included, which answered 200 with an empty
/// list. A known route without limits has an empty list.
#[tokio::test(flavor = "multi_thread")]
async fn top_answers_404_for_an_unknown_route_or_limit_with_or_without_the_other() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"")
        + &route("open", "/open", &up.url(), "");
    let (gw, _env) = gw_with(Kind::Memory, "", "", &routes).await;
    let c = client();
    let get = |q: &'static str| {
        let c = c.clone();
        let url = gw.admin_url(q);
        async move {
            let res = c.get(url).send().await.unwrap();
            let status = res.status().as_u16();
            let body: Value = serde_json::from_str(&res.text().await.unwrap()).unwrap();
            (status, body)
        }
    };
    let (status, body) = get("/-/top?limit=nope").await;
    assert_eq!(status, 404, "an unknown limit without a route: {body}");
    assert!(body["error"].as_str().unwrap().contains("nope"), "{body}");
    for q in [
        "/-/top?route=api&limit=nope",
        "/-/top?route=nope",
        "/-/top?route=nope&limit=per-ip",
        "/-/top?route=open&limit=per-ip",
    ] {
        let (status, body) = get(q).await;
        assert_eq!(status, 404, "{q}: {body}");
    }
    let (status, body) = get("/-/top?limit=per-ip").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limits"].as_array().unwrap().len(), 1, "{body}");
    let (status, body) = get("/-/top?route=open").await;
    assert_eq!((status, &body["limits"]), (200, &serde_json::json!([])));
}

async fn explain_reports_what_the_next_request_gets_and_charges_nothing(kind: Kind) {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-key\"\nalgorithm = \"gcra\"\nlimit = 10\nperiod = \"1h\"\nsubject = \"header:x-api-key\"\ncost = 2")
        + &route("web", "/web", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"sliding_log\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"ip\"")
        + &limit("name = \"per-ip-hourly\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"ip\"");
    let (gw, _env) = gw_with(kind, "", "", &routes).await;
    let c = client();
    let key = "k-explained";
    let real = || c.get(gw.url("/api/x")).header("x-api-key", key).send();
    let explain = |q: String| {
        let url = gw.admin_url(&format!("/-/explain?{q}"));
        let c = c.clone();
        async move {
            let res = c.get(url).send().await.unwrap();
            let status = res.status();
            let v: Value = res.json().await.unwrap();
            (status, v)
        }
    };
    let ask = format!("method=GET&path=/api/x&host=127.0.0.1&header.X-Api-Key={key}");
    for _ in 0..2 {
        assert_eq!(real().await.unwrap().status(), 200);
    }
    let (status, v) = explain(ask.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["route"], "api");
    let l = &v["limits"][0];
    assert_eq!(l["name"], "per-key");
    assert_eq!(l["algorithm"], "gcra");
    assert_eq!(l["subject"], "header");
    assert_eq!(
        l["key"],
        SubjectDigest::of(b'h', key.as_bytes()).short_hex().as_str()
    );
    assert_eq!(l["limit"], 10);
    assert_eq!(l["would_admit"], true);
    let remaining = l["remaining"].as_u64().unwrap();
    assert_eq!(remaining, 6, "10 - 2 requests of cost 2: {v}");
    assert!(l["reset_s"].as_u64().unwrap() > 0);
    assert!(!v.to_string().contains(key), "a raw key in /-/explain");
    // Explaining charges nothing.
    for _ in 0..5 {
        assert_eq!(explain(ask.clone()).await.1, v);
    }
    // The next real request reports remaining − C.
    let res = real().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        h(&res, "x-ratelimit-remaining"),
        (remaining - 2).to_string()
    );
    // Exhausted: explain says so, as the real 429 does.
    while real().await.unwrap().status() == 200 {}
    let (_, v) = explain(ask.clone()).await;
    let l = &v["limits"][0];
    assert_eq!(l["would_admit"], false);
    let res = real().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(
        l["remaining"].as_u64().unwrap().to_string(),
        h(&res, "x-ratelimit-remaining")
    );

    // Address subjects need `ip`; the limit's state is the same as the real client's.
    assert_eq!(c.get(gw.url("/web/x")).send().await.unwrap().status(), 200);
    let (status, v) = explain("path=/web/x".into()).await;
    assert_eq!(status, 400, "{v}");
    let (_, v) = explain("path=/web/x&ip=127.0.0.1".into()).await;
    let l = &v["limits"][0];
    assert_eq!(l["subject"], "ip");
    assert_eq!(l["ip"], "127.0.0.1");
    assert_eq!(l["algorithm"], "sliding_log");
    assert_eq!(l["remaining"], 2);
    let l2 = &v["limits"][1];
    assert_eq!(l2["name"], "per-ip-hourly");
    assert_eq!(l2["remaining"], 4, "every limit of the route: {v}");
    let res = c.get(gw.url("/web/x")).send().await.unwrap();
    assert_eq!(h(&res, "x-ratelimit-remaining"), "1");
    assert!(
        h(&res, "ratelimit").contains("\"per-ip-hourly\";r=3;"),
        "{}",
        h(&res, "ratelimit")
    );
    // Another address is untouched.
    let (_, v) = explain("path=/web/x&ip=192.0.2.9".into()).await;
    assert_eq!(v["limits"][0]["remaining"], 3);
    assert_eq!(v["limits"][1]["remaining"], 5);

    // No route: why.
    let (status, v) = explain("path=/elsewhere&method=POST".into()).await;
    assert_eq!(status, 200);
    assert_eq!(v["route"], Value::Null);
    assert!(v["reason"].as_str().unwrap().contains("404"), "{v}");
    let (status, _) = explain("method=GET".into()).await;
    assert_eq!(status, 400, "path is required");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_groups_the_access_log_names_the_server_that_answered_and_every_attempt_carries_the_id(
) {
    let up = upstream().await;
    let (dead, dead2) = (dead_upstream(), dead_upstream());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    // `max_fails = 0`: the dead server stays in rotation, so round robin sends every other
    // request to it first and the retry to the live one.
    let groups = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{dead:?}, {:?}]\nmax_fails = 0\n\n\
         [[upstreams]]\nname = \"down\"\nservers = [{dead:?}, {dead2:?}]\nmax_fails = 0\n",
        up.url()
    );
    let routes = groups + &route("api", "/api", "g", "") + &route("down", "/down", "down", "");
    let (gw, _env) = gw_with(
        Kind::Memory,
        "",
        &format!("[log]\naccess = \"{}\"\nformat = \"json\"", toml_path(&log)),
        &routes,
    )
    .await;
    let c = client();
    for i in 0..4 {
        let res = c
            .get(gw.url("/api/x"))
            .header("x-request-id", format!("attempt-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    for _ in 0..2 {
        let res = c.get(gw.url("/down/x")).send().await.unwrap();
        assert_eq!(res.status(), 502);
    }
    let m = gw.metrics().await;
    assert!(
        metric(&m, "tollgate_upstream_retries_total{upstream=\"g\"}").unwrap_or(0.0) >= 1.0,
        "some requests were retried"
    );
    // Retried requests reached the live server with the client's id.
    let ids: Vec<String> = up
        .seen()
        .iter()
        .map(|s| s.headers["x-request-id"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["attempt-0", "attempt-1", "attempt-2", "attempt-3"]);
    let lines = log_lines(&log, 6).await;
    assert_eq!(lines.len(), 6, "{lines:?}");
    let live = up.addr.to_string();
    for l in &lines[..4] {
        assert_fields(l);
        assert_eq!(l["route"], "api");
        assert_eq!(
            l["upstream"],
            live.as_str(),
            "the server that answered: {l}"
        );
        assert!(l["upstream_ms"].as_f64().is_some());
    }
    let dead_addrs = [&dead["http://".len()..], &dead2["http://".len()..]];
    let failed: Vec<&str> = lines[4..]
        .iter()
        .map(|l| l["upstream"].as_str().unwrap())
        .collect();
    for f in &failed {
        assert!(dead_addrs.contains(f), "a server of the group: {f}");
    }
}

/// Overlapping reloads end on the file's last version. Before, each reload swapped in what it
/// had read when it finished: one held up by a new store's PING (here a frozen Redis) finished
/// after a later, quick one and put the older file back — both answered 200, and the gateway
/// served a config its file no longer had (the chaos soak found gateways a generation or two
/// behind their file after overlapping reloads that built new stores).
#[tokio::test(flavor = "multi_thread")]
async fn overlapping_reloads_end_on_the_last_file() {
    use rustix::process::{kill_process, Pid, Signal};
    let up = upstream().await;
    let redis = redis();
    let pid = redis
        .cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .and_then(|v| v.parse().ok())
        .and_then(Pid::from_raw)
        .expect("redis-server's process_id in INFO");
    let version = |n: u32, store: &str| {
        config(
            store,
            &route(&format!("v{n}"), &format!("/v{n}"), &up.url(), ""),
        )
    };
    let memory = "backend = \"memory\"";
    let on_redis = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"5s\"",
        redis.url()
    );
    let gw = gateway(&version(0, memory));
    wait_ready(&gw).await;
    let c = client();
    let reload = |c: reqwest::Client, url: String| {
        tokio::spawn(async move { c.post(url).send().await.unwrap().status().as_u16() })
    };

    // The first reload reads a file that moves to Redis, which is frozen: it waits for a PING.
    kill_process(pid, Signal::STOP).unwrap();
    gw.write_config(&version(1, &on_redis));
    let first = reload(c.clone(), gw.admin_url("/-/reload"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The second is asked for after the file changed again (back on memory: nothing to wait for).
    gw.write_config(&version(2, memory));
    let second = reload(c.clone(), gw.admin_url("/-/reload"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill_process(pid, Signal::CONT).unwrap();
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(second.await.unwrap(), 200);

    // The file says v2, and so does the gateway.
    assert_eq!(c.get(gw.url("/v2/x")).send().await.unwrap().status(), 200);
    assert_eq!(c.get(gw.url("/v1/x")).send().await.unwrap().status(), 404);
}

/// `[store]` follows a reload: memory → Redis → (an unreachable Redis: refused, Redis keeps
/// deciding) → memory, under steady traffic through a limit, with no failed request.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_switches_the_store_without_failing_a_request() {
    let up = upstream().await;
    let redis = redis();
    let routes = route("busy", "/busy", &up.url(), "")
        + &limit("name = \"roomy\"\nalgorithm = \"fixed_window\"\nlimit = 1000000\nperiod = \"1h\"\nsubject = \"global\"")
        + &route("few", "/few", &up.url(), "")
        + &limit("name = \"two\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"global\"");
    let memory = config("backend = \"memory\"", &routes);
    let on_redis = config(
        &format!(
            "backend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"reloaded\"",
            redis.url()
        ),
        &routes,
    )
    // A changed listener address is not applied; the 200 says so.
    .replacen("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.2:0\"", 1);
    let dead = config(
        &format!(
            "backend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"300ms\"",
            free_port()
        ),
        &routes,
    );
    let gw = gateway(&memory);
    wait_ready(&gw).await;
    let c = client();
    let ready = |c: reqwest::Client, url: String| async move {
        let r = c.get(url).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    let reload = |c: reqwest::Client, url: String| async move {
        let r = c.post(url).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };

    let traffic = Traffic::start(&c, gw.url("/busy/x"), 4);
    // On memory, the small limit is spent.
    for want in [200, 200, 429] {
        assert_eq!(c.get(gw.url("/few/x")).send().await.unwrap().status(), want);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // memory → Redis: the new store decides (its own, fresh state) and holds the keys.
    gw.write_config(&on_redis);
    let (code, body) = reload(c.clone(), gw.admin_url("/-/reload")).await;
    assert_eq!(code, 200, "{body}");
    let warnings: Value = serde_json::from_str(&body).unwrap();
    assert!(
        warnings["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("listener addresses changed")),
        "{body}"
    );
    let (code, r) = ready(c.clone(), gw.admin_url("/readyz")).await;
    assert_eq!((code, r["store"].as_str()), (200, Some("redis")), "{r}");
    assert_eq!(c.get(gw.url("/few/x")).send().await.unwrap().status(), 200);
    let keys = redis.cli(&["--scan", "--pattern", "reloaded*"]);
    assert!(
        keys.lines().count() >= 2,
        "no keys in the new store: {keys:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;

    // An unreachable Redis is refused with 422; the running Redis store keeps deciding.
    gw.write_config(&dead);
    let (code, body) = reload(c.clone(), gw.admin_url("/-/reload")).await;
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("store"), "{body}");
    let (code, r) = ready(c.clone(), gw.admin_url("/readyz")).await;
    assert_eq!((code, r["store"].as_str()), (200, Some("redis")), "{r}");
    assert_eq!(c.get(gw.url("/few/x")).send().await.unwrap().status(), 200);
    assert_eq!(c.get(gw.url("/few/x")).send().await.unwrap().status(), 429);

    // Redis → memory.
    gw.write_config(&memory);
    let (code, body) = reload(c.clone(), gw.admin_url("/-/reload")).await;
    assert_eq!(code, 200, "{body}");
    let (code, r) = ready(c.clone(), gw.admin_url("/readyz")).await;
    assert_eq!((code, r["store"].as_str()), (200, Some("memory")), "{r}");
    assert_eq!(c.get(gw.url("/few/x")).send().await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (ok, failed) = traffic.finish().await;
    assert!(
        failed.is_empty(),
        "requests failed during the store reloads: {failed:?}"
    );
    assert!(ok >= 20, "too little traffic ran: {ok}");
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_config_reloads_total{result=\"success\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&m, "tollgate_config_reloads_total{result=\"failure\"}"),
        Some(1.0)
    );
}
