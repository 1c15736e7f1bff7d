//! HTTP/3 at the edge (issue #53, `[server.http3]`) through the binary, with a client that is
//! not built on the server's QUIC or HTTP/3 library: PyPI's aioquic (`tests/support/h3client.py`,
//! installed by `scripts/test --install-only` into `target/aioquic-venv`). What a client sees:
//! status, fields, body; a limit's 429 counted with the TCP listener's requests on every store;
//! `Alt-Svc` on the TCP listener's responses (both HTTP/1 fronts, and HTTP/2); 0-RTT off by
//! default; with `early_data`, an early POST answered 425 and never charged and a replayed
//! early request charged at most once; with `retry = "always"`, an Initial from an address that
//! never answers gets a Retry and nothing is charged; a connection that migrates is counted by
//! the address each request arrives from.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::*;

on_every_store!(
    a_limit_counts_h3_and_tcp_requests_together,
    early_data_refuses_an_early_post_and_charges_a_replay_once,
    retry_always_answers_an_initial_with_a_retry_and_charges_nothing,
    a_migrated_connection_is_counted_by_the_address_it_moved_to,
    a_json_body_subject_and_compression_work_over_h3,
    a_client_certificate_is_a_subject_over_h3,
);

/// The aioquic virtualenv's Python (`TOLLGATE_AIOQUIC_VENV` overrides the directory).
fn python() -> PathBuf {
    let venv = std::env::var_os("TOLLGATE_AIOQUIC_VENV").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/aioquic-venv"),
        PathBuf::from,
    );
    let p = venv.join("bin/python");
    assert!(
        p.exists(),
        "aioquic is not installed at {}; run `scripts/test --install-only` (pip install aioquic into target/aioquic-venv)",
        venv.display()
    );
    p
}

/// Runs one client job (see `tests/support/h3client.py`) and returns what it printed.
async fn h3(job: Value) -> Value {
    h3_try(job).await.unwrap_or_else(|e| panic!("{e}"))
}

/// [`h3`], or why the client failed (what it wrote on stderr).
async fn h3_try(job: Value) -> Result<Value, String> {
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/h3client.py");
        let mut child = std::process::Command::new(python())
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("cannot start the HTTP/3 client");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(job.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            return Err(format!(
                "the HTTP/3 client failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "the HTTP/3 client printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    })
    .await
    .unwrap()
}

/// A job for `gw`'s HTTP/3 listener (the TLS listener's port, over UDP).
fn job(gw: &Gateway, ca: &Path, requests: Value) -> Value {
    json!({
        "host": "127.0.0.1",
        "port": gw.proxy.port(),
        "server_name": "localhost",
        "ca": ca.display().to_string(),
        "requests": requests,
        "timeout": 10,
    })
}

/// A header's value in a response printed by the client (`""` when absent).
fn field<'a>(res: &'a Value, name: &str) -> &'a str {
    res["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f[0] == name)
        .and_then(|f| f[1].as_str())
        .unwrap_or("")
}

/// A self-signed certificate for `localhost` written to `dir`: (cert, key, PEM).
fn self_signed(dir: &Path) -> (PathBuf, PathBuf, String) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert_pem = ck.cert.pem();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key, cert_pem)
}

/// `routes` on `store` with `[server.tls]` (`cert`, `key`) and, unless `http3` is `None`,
/// `[server.http3]` enabled with the lines `http3`.
fn h3_config(store: &str, routes: &str, cert: &Path, key: &Path, http3: Option<&str>) -> String {
    let h3 = http3.map_or(String::new(), |extra| {
        format!("[server.http3]\nenabled = true\n{extra}\n\n")
    });
    config(store, routes).replacen(
        "[admin]",
        &format!(
            "[server.tls]\ncert = {:?}\nkey = {:?}\n\n{h3}[admin]",
            cert.display().to_string(),
            key.display().to_string()
        ),
        1,
    )
}

fn tls_client(cert_pem: &str, http1_only: bool) -> reqwest::Client {
    let b = reqwest::Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap())
        .tls_built_in_root_certs(false);
    let b = if http1_only { b.http1_only() } else { b };
    b.build().unwrap()
}

const LIMIT_BY_IP: &str =
    "name = \"per_ip\"\nalgorithm = \"fixed_window\"\nperiod = \"1h\"\nsubject = \"ip\"\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_get_and_a_post_reach_the_upstream_and_come_back() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
        &cert,
        &key,
        Some(""),
    ));
    let out = h3(job(
        &gw,
        &cert,
        json!([
            {"method": "GET", "path": "/api/get?x=1", "headers": [["x-test", "one"]]},
            {"method": "POST", "path": "/api/post", "headers": [["content-type", "text/plain"]],
             "body": "hello over h3"},
            {"method": "PUT", "path": "/api/put", "headers": [["content-length", "5"]],
             "body": "12345"},
        ]),
    ))
    .await;
    let r = out["responses"].as_array().unwrap();
    for res in r {
        assert_eq!(res["status"], 200, "{res}");
        assert_eq!(field(res, "x-upstream"), "yes");
        // The upstream's hop-by-hop fields never reach an HTTP/3 client (RFC 9114 §4.2).
        for hop in ["connection", "keep-alive", "x-up-hop"] {
            assert_eq!(field(res, hop), "", "{hop} in {res}");
        }
        assert!(!field(res, "x-request-id").is_empty());
        assert!(!field(res, "date").is_empty());
    }
    assert_eq!(r[0]["body"], "{\"body_len\":0,\"max_frame\":0}");
    assert!(r[1]["body"]
        .as_str()
        .unwrap()
        .starts_with("{\"body_len\":13,"));
    assert!(r[2]["body"]
        .as_str()
        .unwrap()
        .starts_with("{\"body_len\":5,"));

    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    let get = seen.iter().find(|s| s.method == "GET").unwrap();
    assert_eq!(get.uri, "/api/get?x=1");
    assert_eq!(get.headers["x-test"], "one");
    // The upstream's `Host` (the route does not preserve the client's `:authority`); the
    // client's address is forwarded.
    assert_eq!(get.headers["host"], up.addr.to_string().as_str());
    assert_eq!(get.headers["x-forwarded-for"], "127.0.0.1");
    // A GET whose stream ended with its head is sent without a body, not an empty chunked one.
    assert!(!get.headers.contains_key("transfer-encoding"), "{get:?}");
    let post = seen.iter().find(|s| s.method == "POST").unwrap();
    assert_eq!(post.body_len, 13);
    assert_eq!(post.headers["content-type"], "text/plain");
    let put = seen.iter().find(|s| s.method == "PUT").unwrap();
    assert_eq!(put.headers["content-length"], "5");
}

async fn a_limit_counts_h3_and_tcp_requests_together(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path());
    let routes = route("api", "/api", &up.url(), "") + &limit(&format!("{LIMIT_BY_IP}limit = 4"));
    let gw = gateway(&h3_config(&env.store, &routes, &cert, &key, Some("")));
    let tcp = format!("https://localhost:{}/api/x", gw.proxy.port());

    let out = h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/1"}, {"method": "GET", "path": "/api/2"}]),
    ))
    .await;
    let rem: Vec<&str> = out["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| field(r, "x-ratelimit-remaining"))
        .collect();
    assert_eq!(rem, ["3", "2"]);
    // The TCP listener, over HTTP/1.1 (the fast front) and HTTP/2 (hyper's): the same count.
    for (http1, left) in [(true, "1"), (false, "0")] {
        let c = reqwest::Client::builder()
            .no_proxy()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap())
            .tls_built_in_root_certs(false)
            .resolve("localhost", gw.proxy);
        let c = if http1 { c.http1_only() } else { c };
        let res = c.build().unwrap().get(&tcp).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["x-ratelimit-remaining"], left);
    }
    let out = h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/3"}]),
    ))
    .await;
    let res = &out["responses"][0];
    assert_eq!(res["status"], 429, "{res}");
    assert_eq!(field(res, "content-type"), "application/problem+json");
    assert!(field(res, "retry-after").parse::<u64>().unwrap() > 0);
    let problem: Value = serde_json::from_str(res["body"].as_str().unwrap()).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], json!(["per_ip"]));
    assert_eq!(up.hits(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn alt_svc_is_advertised_on_the_tcp_listener_on_both_fronts() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path());
    let routes = route("api", "/api", &up.url(), "") + &limit(&format!("{LIMIT_BY_IP}limit = 1"));
    for front in ["fast", "hyper"] {
        let gw = gateway(&with_http1(
            &h3_config("backend = \"memory\"", &routes, &cert, &key, Some("")),
            front,
        ));
        let want = format!("h3=\":{}\"; ma=86400", gw.proxy.port());
        let url = |p: &str| format!("https://127.0.0.1:{}{p}", gw.proxy.port());
        for http1 in [true, false] {
            let c = tls_client(&pem, http1);
            // A relayed response, the gateway's 404 and a limit's 429: each advertises HTTP/3.
            for (path, status) in [("/api/a", 0), ("/nothing", 404), ("/api/b", 429)] {
                let res = c.get(url(path)).send().await.unwrap();
                if status != 0 {
                    assert_eq!(res.status(), status);
                }
                assert_eq!(
                    res.headers().get("alt-svc").map(|v| v.to_str().unwrap()),
                    Some(want.as_str()),
                    "{front} front, http1 {http1}, {path}"
                );
            }
        }
    }
    // Without `[server.http3]`: none.
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &routes,
        &cert,
        &key,
        None,
    ));
    for http1 in [true, false] {
        let res = tls_client(&pem, http1)
            .get(format!("https://127.0.0.1:{}/api/a", gw.proxy.port()))
            .send()
            .await
            .unwrap();
        assert!(res.headers().get("alt-svc").is_none());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn zero_rtt_is_off_by_default() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
        &cert,
        &key,
        Some(""),
    ));
    let ticket = dir.path().join("ticket");
    let mut first = job(&gw, &cert, json!([{"method": "GET", "path": "/api/1"}]));
    first["ticket_out"] = json!(ticket.display().to_string());
    let out = h3(first).await;
    assert_eq!(out["responses"][0]["status"], 200);
    assert_eq!(out["got_ticket"], true);
    // Resumed with the ticket, the request written before the handshake: no early data (the
    // ticket allows none), so the POST goes after the handshake and is served.
    let mut second = job(
        &gw,
        &cert,
        json!([{"method": "POST", "path": "/api/2", "body": "x"}]),
    );
    second["ticket_in"] = json!(ticket.display().to_string());
    second["early"] = json!(true);
    let out = h3(second).await;
    assert_eq!(out["session_resumed"], true, "{out}");
    assert_eq!(out["early_data_accepted"], false, "{out}");
    assert_eq!(out["responses"][0]["status"], 200);
}

async fn early_data_refuses_an_early_post_and_charges_a_replay_once(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let routes = route("api", "/api", &up.url(), "") + &limit(&format!("{LIMIT_BY_IP}limit = 4"));
    let gw = gateway(&h3_config(
        &env.store,
        &routes,
        &cert,
        &key,
        Some("early_data = true\nretry = \"never\""),
    ));
    let ticket = dir.path().join("ticket");
    let t = ticket.display().to_string();
    let mut first = job(&gw, &cert, json!([{"method": "GET", "path": "/api/1"}]));
    first["ticket_out"] = json!(t);
    let out = h3(first).await;
    assert_eq!(out["responses"][0]["status"], 200);
    assert_eq!(field(&out["responses"][0], "x-ratelimit-remaining"), "3");

    // An early POST: 425, never sent upstream, never charged.
    let mut early_post = job(
        &gw,
        &cert,
        json!([{"method": "POST", "path": "/api/2", "body": "pay"}]),
    );
    early_post["ticket_in"] = json!(t);
    // A session resumes once (stateful resumption): the next connection uses this one's.
    early_post["ticket_out"] = json!(t);
    early_post["early"] = json!(true);
    let out = h3(early_post).await;
    assert_eq!(out["early_data_accepted"], true, "{out}");
    let res = &out["responses"][0];
    assert_eq!(res["status"], 425, "{res}");
    assert_eq!(field(res, "content-type"), "application/problem+json");
    assert_eq!(up.hits(), 1);

    // An early GET, served once the handshake completes; its first flight then replayed three
    // times from addresses that never answer (a replay, or a spoofed source): the replays
    // cannot resume the session again nor complete a handshake, so they are never served nor
    // charged.
    let mut early_get = job(&gw, &cert, json!([{"method": "GET", "path": "/api/3"}]));
    early_get["ticket_in"] = json!(t);
    early_get["early"] = json!(true);
    early_get["replay"] = json!(3);
    let out = h3(early_get).await;
    assert_eq!(out["early_data_accepted"], true, "{out}");
    let res = &out["responses"][0];
    assert_eq!(res["status"], 200, "{res}");
    assert_eq!(field(res, "x-ratelimit-remaining"), "2");
    // The replayed connections wait for a handshake that never completes (header_read_timeout
    // bounds them); give them time to have been served, had they been.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    let out = h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/4"}]),
    ))
    .await;
    let res = &out["responses"][0];
    assert_eq!(res["status"], 200, "{res}");
    assert_eq!(field(res, "x-ratelimit-remaining"), "1");
    assert_eq!(up.hits(), 3);
}

async fn retry_always_answers_an_initial_with_a_retry_and_charges_nothing(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    for (retry, first_packet) in [("always", "retry"), ("never", "initial")] {
        // A route of its own per gateway: a Redis store keeps the first one's count.
        let routes = route(&format!("api_{retry}"), "/api", &up.url(), "")
            + &limit(&format!("{LIMIT_BY_IP}limit = 1"));
        let gw = gateway(&h3_config(
            &env.store,
            &routes,
            &cert,
            &key,
            Some(&format!("retry = \"{retry}\"")),
        ));
        // A first flight (Initial, a request written into it) from an address that never
        // answers: with `always` the server's one packet is a Retry (no connection state, no
        // handshake), with `never` its handshake starts; neither serves nor charges anything.
        for _ in 0..3 {
            let mut spoofed = job(&gw, &cert, json!([{"method": "GET", "path": "/api/x"}]));
            spoofed["flight_only"] = json!(true);
            let out = h3(spoofed).await;
            let packets = out["first_packets"].as_array().unwrap();
            assert_eq!(
                packets.first(),
                Some(&json!(first_packet)),
                "retry = {retry}: {out}"
            );
            if retry == "always" {
                assert!(packets.iter().all(|p| p == "retry"), "{out}");
            }
        }
        // The address's one request (limit 1) is still there for a client that answers (and,
        // with `always`, proves its address by the Retry's token).
        let out = h3(job(
            &gw,
            &cert,
            json!([{"method": "GET", "path": "/api/y"}]),
        ))
        .await;
        let res = &out["responses"][0];
        assert_eq!(res["status"], 200, "retry = {retry}: {res}");
        assert_eq!(field(res, "x-ratelimit-remaining"), "0");
        let retries = metric(&gw.metrics().await, "tollgate_quic_retries_total").unwrap_or(0.0);
        if retry == "always" {
            // Three spoofed Initials and the real client's first one.
            assert_eq!(retries, 4.0);
        } else {
            assert_eq!(retries, 0.0);
        }
    }
    assert_eq!(up.hits(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_swaps_the_certificate_of_the_h3_listener() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, first_pem) = self_signed(dir.path());
    let first_ca = dir.path().join("first-ca.pem");
    std::fs::write(&first_ca, &first_pem).unwrap();
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
        &cert,
        &key,
        Some(""),
    ));
    let get = json!([{"method": "GET", "path": "/api/a"}]);
    assert_eq!(
        h3(job(&gw, &first_ca, get.clone())).await["responses"][0]["status"],
        200
    );
    // A new certificate in the same files: a client that trusts only it is refused until the
    // reload, and served after it; the first certificate is no longer served.
    let other = tempfile::tempdir().unwrap();
    let (new_cert, new_key, _) = self_signed(other.path());
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    // (A client refused gives up after a second.)
    let refused = |ca: &Path| {
        let mut j = job(&gw, ca, json!([{"method": "GET", "path": "/api/a"}]));
        j["timeout"] = json!(1);
        j
    };
    assert!(h3_try(refused(&new_cert)).await.is_err());
    let res = client()
        .post(gw.admin_url("/-/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let out = h3_try(job(&gw, &new_cert, get.clone())).await;
    assert_eq!(
        out.as_ref().map(|o| o["responses"][0]["status"].clone()),
        Ok(json!(200)),
        "after the reload: {out:?}"
    );
    assert!(h3_try(refused(&first_ca)).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_upstreams_trailers_reach_the_h3_client() {
    use tokio::io::AsyncWriteExt as _;
    let addr = raw_upstream(|mut s| async move {
        let mut buf = Vec::new();
        while read_request_head(&mut s, &mut buf).await.is_some() {
            let answer =
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n\
                          5\r\nhello\r\n0\r\nx-checksum: abc123\r\n\r\n";
            if s.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &format!("http://{addr}"), ""),
        &cert,
        &key,
        Some(""),
    ));
    let out = h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/t", "headers": [["te", "trailers"]]}]),
    ))
    .await;
    let res = &out["responses"][0];
    assert_eq!(res["status"], 200, "{res}");
    assert_eq!(res["body"], "hello");
    assert_eq!(res["trailers"], json!([["x-checksum", "abc123"]]), "{res}");
}

/// A request's trailers (a HEADERS frame after its body, from aioquic) reach the upstream — an
/// HTTP/2 group (`protocol = "h2c"`), as request trailers do from the HTTP/2 front (an HTTP/1.1
/// upstream gets none from any front: `Trailer` is hop-by-hop) — with the body whole; and the
/// upstream's answer, a cost in its trailer (`cost_from = "trailer:…"`), is charged over HTTP/3:
/// the next request finds the budget less that cost.
#[tokio::test(flavor = "multi_thread")]
async fn a_requests_trailers_reach_the_upstream_and_a_trailer_cost_is_charged() {
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, StreamBody};
    use hyper::body::Frame;
    // An h2c upstream: answers "ok" with the request's trailer echoed and a cost of 7 in its
    // own trailers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: std::sync::Arc<std::sync::Mutex<Vec<(usize, http::HeaderMap)>>> =
        std::sync::Arc::default();
    let seen_up = seen.clone();
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen_up.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let got = req.into_body().collect().await?;
                            let trailers = got.trailers().cloned().unwrap_or_default();
                            let len = got.to_bytes().len();
                            seen.lock().unwrap().push((len, trailers.clone()));
                            let mut out = http::HeaderMap::new();
                            out.insert("x-cost", http::HeaderValue::from_static("7"));
                            if let Some(v) = trailers.get("x-digest") {
                                out.insert("x-got-digest", v.clone());
                            }
                            let frames = vec![
                                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(
                                    b"ok",
                                ))),
                                Ok(Frame::trailers(out)),
                            ];
                            Ok::<_, hyper::Error>(hyper::Response::new(StreamBody::new(
                                futures_util::stream::iter(frames),
                            )))
                        }
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let routes = format!(
        "[[upstreams]]\nname = \"t\"\nprotocol = \"h2c\"\nservers = [\"http://{addr}\"]\n\n{}{}",
        route("api", "/api", "t", ""),
        limit("name = \"cost\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1h\"\nsubject = \"global\"\ncost_from = \"trailer:x-cost\"")
    );
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &routes,
        &cert,
        &key,
        Some(""),
    ));
    let upload = json!({
        "method": "POST", "path": "/api/upload",
        "headers": [["content-type", "text/plain"], ["te", "trailers"]],
        "body": "hello trailers",
        "trailers": [["x-digest", "sha-256=abc"]],
    });
    let out = h3(job(&gw, &cert, json!([upload]))).await;
    let res = &out["responses"][0];
    assert_eq!(res["status"], 200, "{res}");
    assert_eq!(res["body"], "ok");
    assert_eq!(
        res["trailers"],
        json!([["x-cost", "7"], ["x-got-digest", "sha-256=abc"]]),
        "{res}"
    );
    // The body whole, and the client's trailer, reached the upstream.
    let (len, trailers) = seen.lock().unwrap()[0].clone();
    assert_eq!(len, "hello trailers".len());
    assert_eq!(trailers["x-digest"], "sha-256=abc");
    // The first answer's trailer cost 7: the next request finds 100 - 7 - 1 left after it.
    let out = h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/next"}]),
    ))
    .await;
    let res = &out["responses"][0];
    assert_eq!(res["status"], 200, "{res}");
    assert_eq!(field(res, "x-ratelimit-remaining"), "92", "{res}");
    server.abort();
}

async fn a_migrated_connection_is_counted_by_the_address_it_moved_to(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let routes = route("api", "/api", &up.url(), "") + &limit(&format!("{LIMIT_BY_IP}limit = 2"));
    let gw = gateway(&h3_config(&env.store, &routes, &cert, &key, Some("")));
    // 127.0.0.2 spends its two requests.
    let mut first = job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/a"}, {"method": "GET", "path": "/api/a"}]),
    );
    first["bind"] = json!("127.0.0.2");
    let out = h3(first).await;
    assert_eq!(out["responses"][1]["status"], 200);
    // The subject's digest (`pk`) in the RateLimit field.
    let pk = |res: &Value| {
        field(res, "ratelimit")
            .rsplit_once("pk=")
            .map(|(_, pk)| pk.to_owned())
    };
    let pk_2 = pk(&out["responses"][0]).expect("a RateLimit field with a pk");
    // A connection opened from a fresh address (127.0.0.3: its request is served, one left),
    // then moved to 127.0.0.2: its next request is 127.0.0.2's, refused — a connection cannot
    // carry an address's fresh count to another address.
    let mut moved = job(&gw, &cert, json!([{"method": "GET", "path": "/api/b"}]));
    moved["bind"] = json!("127.0.0.3");
    moved["migrate_to"] = json!("127.0.0.2");
    moved["after_migration"] = json!([{"method": "GET", "path": "/api/c"}]);
    let out = h3(moved).await;
    let r = out["responses"].as_array().unwrap();
    assert_eq!(r[0]["status"], 200, "{out}");
    assert_eq!(r[1]["status"], 429, "{out}");
    // Counted as 127.0.0.3, then as 127.0.0.2.
    assert_ne!(pk(&r[0]).as_deref(), Some(pk_2.as_str()));
    assert_eq!(pk(&r[1]).as_deref(), Some(pk_2.as_str()), "{out}");
    assert_eq!(up.hits(), 3);
    let seen = up.seen();
    let from: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["x-forwarded-for"].to_str().unwrap())
        .collect();
    assert_eq!(from, ["127.0.0.2", "127.0.0.2", "127.0.0.3"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_max_body_size_is_refused_413_and_a_short_one_400() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), "max_body_size = 10"),
        &cert,
        &key,
        Some(""),
    ));
    let out = h3(job(
        &gw,
        &cert,
        json!([
            {"method": "POST", "path": "/api/big", "body": "0123456789abcdef"},
            {"method": "POST", "path": "/api/small", "body": "0123"},
            // A body shorter than its content-length: malformed (RFC 9114 §4.1.2).
            {"method": "POST", "path": "/api/short", "headers": [["content-length", "9"]],
             "body": "0123"},
        ]),
    ))
    .await;
    let r = out["responses"].as_array().unwrap();
    assert_eq!(r[0]["status"], 413, "{out}");
    assert_eq!(r[1]["status"], 200, "{out}");
    assert_eq!(r[2]["status"], 400, "{out}");
    // What reached the upstream in full: only the small body.
    let bodies: Vec<usize> = up
        .seen()
        .iter()
        .filter(|s| s.uri != "/api/big" && s.uri != "/api/short")
        .map(|s| s.body_len)
        .collect();
    assert_eq!(bodies, [4]);
}

async fn a_json_body_subject_and_compression_work_over_h3(kind: Kind) {
    use std::io::Read as _;
    use tokio::io::AsyncWriteExt as _;
    let env = store_env(kind);
    // An upstream answering JSON of a known length, worth compressing.
    let json_body = format!("{{\"items\":[{}]}}", vec!["\"item\""; 200].join(","));
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{json_body}",
        json_body.len()
    );
    let addr = raw_upstream(move |mut s| {
        let answer = answer.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = read_request_head(&mut s, &mut buf).await {
                // The request's body (its length given) is read before the answer.
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < len {
                    let mut chunk = [0u8; 4096];
                    match tokio::io::AsyncReadExt::read(&mut s, &mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                buf.drain(..len);
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let routes = route(
        "api",
        "/api",
        &format!("http://{addr}"),
        "[routes.compression]\nalgorithms = [\"gzip\"]\nmin_length = 64\n",
    ) + &limit("name = \"per_user\"\nalgorithm = \"fixed_window\"\nperiod = \"1h\"\nlimit = 1\nsubject = \"json:user\"\non_missing = \"reject\"");
    let gw = gateway(&h3_config(&env.store, &routes, &cert, &key, Some("")));
    let post = |user: &str| {
        json!({"method": "POST", "path": "/api/q",
               "headers": [["content-type", "application/json"], ["accept-encoding", "gzip"]],
               "body": format!("{{\"user\":\"{user}\",\"pad\":\"{}\"}}", "x".repeat(3000))})
    };
    // ann's first request alone, then her second beside bob's (the streams of one job run at
    // once: which of two of ann's the limit saw first would be a race).
    let first = h3(job(&gw, &cert, json!([post("ann")]))).await;
    let out = h3(job(&gw, &cert, json!([post("ann"), post("bob")]))).await;
    let mut r = first["responses"].as_array().unwrap().clone();
    r.extend(out["responses"].as_array().unwrap().iter().cloned());
    let out = json!({ "responses": r });
    // The limit counts by the body's `user`: ann's second request is refused, bob's served.
    assert_eq!(r[0]["status"], 200, "{out}");
    assert_eq!(r[1]["status"], 429, "{out}");
    assert_eq!(r[2]["status"], 200, "{out}");
    // The served answers are gzip, and decompress to the upstream's body.
    for res in [&r[0], &r[2]] {
        assert_eq!(field(res, "content-encoding"), "gzip", "{res}");
        use base64::Engine as _;
        let gz = base64::engine::general_purpose::STANDARD
            .decode(res["body_b64"].as_str().unwrap())
            .unwrap();
        let mut plain = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut plain)
            .unwrap();
        assert_eq!(plain, json_body);
    }
}

async fn a_client_certificate_is_a_subject_over_h3(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    // A CA and two client certificates it issued; a third from a CA the gateway does not trust.
    let ca = |cn: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let pem = p.self_signed(&key).unwrap().pem();
        (rcgen::Issuer::new(p, key), pem)
    };
    let (partners, partners_pem) = ca("Partners");
    let (others, _) = ca("Others");
    let client = |issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, cn: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![format!("{cn}.clients.test")]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let c = p.signed_by(&key, issuer).unwrap();
        let (cert, key_file) = (
            dir.path().join(format!("{cn}.pem")),
            dir.path().join(format!("{cn}.key")),
        );
        std::fs::write(&cert, c.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert, key_file)
    };
    let alice = client(&partners, "alice");
    let bob = client(&partners, "bob");
    let mallory = client(&others, "mallory");
    let ca_file = dir.path().join("partners.pem");
    std::fs::write(&ca_file, partners_pem).unwrap();
    let routes = route("api", "/api", &up.url(), "")
        + &limit(
            "name = \"per_cn\"\nalgorithm = \"fixed_window\"\nperiod = \"1h\"\nlimit = 1\n\
             subject = \"tls:subject_cn\"\non_missing = \"reject\"",
        );
    let config = h3_config(&env.store, &routes, &cert, &key, Some("")).replacen(
        "[server.http3]",
        &format!(
            "[server.tls.client_auth]\nca = {:?}\nmode = \"optional\"\n\n[server.http3]",
            ca_file.display().to_string()
        ),
        1,
    );
    let gw = gateway(&config);
    let as_client = |id: Option<&(PathBuf, PathBuf)>, n: usize| {
        let mut j = job(
            &gw,
            &cert,
            json!(vec![json!({"method": "GET", "path": "/api/x"}); n]),
        );
        if let Some((c, k)) = id {
            j["client_cert"] = json!(c.display().to_string());
            j["client_key"] = json!(k.display().to_string());
        }
        j
    };
    let statuses = |out: &Value| -> Vec<u64> {
        out["responses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_u64().unwrap())
            .collect()
    };
    // Counted by the certificate's CN: alice's second request is refused, bob's first served.
    assert_eq!(statuses(&h3(as_client(Some(&alice), 2)).await), [200, 429]);
    assert_eq!(statuses(&h3(as_client(Some(&bob), 1)).await), [200]);
    // No certificate (the listener allows that): the route's subject is missing, 401.
    assert_eq!(statuses(&h3(as_client(None, 1)).await), [401]);
    // A certificate from a CA the gateway does not trust: no handshake.
    let mut refused = as_client(Some(&mallory), 1);
    refused["timeout"] = json!(2);
    assert!(h3_try(refused).await.is_err());
    assert_eq!(up.hits(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_in_flight_finishes_when_the_gateway_drains() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
        &cert,
        &key,
        Some(""),
    ));
    // The upstream takes 1.5 s (`/slow`); SIGTERM arrives while it is in flight.
    let slow = tokio::spawn(h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/slow"}]),
    )));
    // Until the request is at the upstream (the client's start takes its time on a busy machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while up.hits() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    gw.signal(Signal::TERM);
    let out = slow.await.unwrap();
    assert_eq!(out["responses"][0]["status"], 200, "{out}");
    // The process ends once drained.
    let mut gw = gw;
    let status = tokio::task::spawn_blocking(move || {
        let gw = &mut gw;
        gw.child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn under_load_retry_starts_past_64_handshakes_in_progress() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let gw = gateway(&h3_config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
        &cert,
        &key,
        Some("retry = \"under_load\""),
    ));
    let flight = |spoof: usize| {
        let mut j = job(&gw, &cert, json!([]));
        j["flight_only"] = json!(true);
        j["spoof"] = json!(spoof);
        j
    };
    // Quiet: a new connection's Initial is answered with the handshake.
    let out = h3(flight(0)).await;
    assert_eq!(out["first_packets"][0], "initial", "{out}");
    // 70 handshakes left hanging by addresses that never answer (header_read_timeout ends
    // them): past 64 in progress, a new connection is asked to prove its address first.
    let out = h3(flight(70)).await;
    assert_eq!(out["first_packets"][0], "retry", "{out}");
    let retries = metric(&gw.metrics().await, "tollgate_quic_retries_total").unwrap_or(0.0);
    assert!(retries >= 1.0, "{retries}");
    // A client that answers is still served (through the Retry).
    let out = h3(job(
        &gw,
        &cert,
        json!([{"method": "GET", "path": "/api/x"}]),
    ))
    .await;
    assert_eq!(out["responses"][0]["status"], 200, "{out}");
}
