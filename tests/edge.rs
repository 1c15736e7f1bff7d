//! Edge readiness through the real binary: TLS with HTTP/2, hot reload under traffic, graceful
//! drain, protocol upgrades, and hostile input on raw sockets (framing, header and URI bounds,
//! body limits, slowloris, idle connections).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::*;

// ---------------------------------------------------------------------------------------------
// Raw-socket helpers.
// ---------------------------------------------------------------------------------------------

/// What came back on a raw connection.
struct Reply {
    text: String,
    /// The server closed the connection (EOF or reset), rather than going quiet.
    closed: bool,
}

impl Reply {
    fn status(&self) -> Option<u16> {
        self.text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse().ok())
    }
}

/// Reads until the server closes the connection or sends nothing for `quiet`.
async fn read_to_close(s: &mut TcpStream, quiet: Duration) -> Reply {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let closed = loop {
        match tokio::time::timeout(quiet, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    Reply {
        text: String::from_utf8_lossy(&out).into_owned(),
        closed,
    }
}

/// Sends `request` on a new connection (a write error, e.g. an early close, is not a failure)
/// and reads until the server closes or goes quiet for 3 s.
async fn raw(addr: SocketAddr, request: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(request).await;
    read_to_close(&mut s, Duration::from_secs(3)).await
}

/// Reads exactly one response with a `Content-Length` body (or none) from a kept-alive
/// connection.
async fn read_response(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if out.len() >= end + 4 + len {
                out.truncate(end + 4 + len);
                return String::from_utf8_lossy(&out).into_owned();
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .expect("no complete response in time")
            .unwrap();
        assert!(
            n > 0,
            "closed mid-response: {}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
    }
}

/// Polls the gateway's metrics until `name{labels}` sums to `want` (or 10 s pass); returns the
/// last value seen.
async fn wait_metric(gw: &Gateway, name: &str, labels: &[&str], want: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = metric_sum(&gw.metrics().await, name, labels);
        if v == want || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn plain(up: &Upstream, server: &str, extra: &str) -> String {
    let c = config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), extra),
    );
    c.replacen("[server]\n", &format!("[server]\n{server}\n"), 1)
}

// ---------------------------------------------------------------------------------------------
// TLS.
// ---------------------------------------------------------------------------------------------

/// A self-signed EC certificate for `localhost` and 127.0.0.1, written to `dir`.
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert_pem = ck.cert.pem();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (cert, key, cert_pem)
}

fn tls_config(up: &Upstream, cert: &std::path::Path, key: &std::path::Path) -> String {
    config("backend = \"memory\"", &route("api", "/api", &up.url(), "")).replacen(
        "[admin]",
        &format!(
            "[server.tls]\ncert = {:?}\nkey = {:?}\n\n[admin]",
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

#[tokio::test(flavor = "multi_thread")]
async fn tls_negotiates_http2_and_http1_and_forwards_proto_https() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path());
    let gw = gateway(&tls_config(&up, &cert, &key));
    let url = format!("https://127.0.0.1:{}/api/tls", gw.proxy.port());

    let res = tls_client(&pem, false).get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.version(),
        reqwest::Version::HTTP_2,
        "ALPN did not pick h2"
    );
    let res = tls_client(&pem, true).get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), reqwest::Version::HTTP_11);

    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.headers["x-forwarded-proto"], "https");
    }
    // Plain HTTP on the TLS port is not served.
    let res = client()
        .get(format!("http://127.0.0.1:{}/api/tls", gw.proxy.port()))
        .send()
        .await;
    assert!(res.is_err(), "plaintext was served on the TLS port");
    assert_eq!(up.hits(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_garbage_handshakes_are_counted_and_harm_no_other_connection() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path());
    let gw = gateway(&tls_config(&up, &cert, &key));
    let url = format!("https://127.0.0.1:{}/api/ok", gw.proxy.port());
    // One HTTP/2 connection, opened before the garbage and reused after it.
    let c = tls_client(&pem, false);
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);

    // Connections closed without a byte (TCP health checks) are not handshake errors.
    for _ in 0..2 {
        let s = TcpStream::connect(gw.proxy).await.unwrap();
        drop(s);
    }
    let garbage: [&[u8]; 3] = [
        b"GET /api/ok HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello",
        &[0xffu8; 64],
    ];
    for g in garbage {
        let r = raw(gw.proxy, g).await;
        assert!(r.closed, "a garbage handshake was left open");
        assert!(!r.text.contains("HTTP/1.1 200"), "{}", r.text);
    }
    assert_eq!(
        wait_metric(&gw, "tollgate_tls_handshake_errors_total", &[], 3.0).await,
        3.0
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        metric_sum(
            &gw.metrics().await,
            "tollgate_tls_handshake_errors_total",
            &[]
        ),
        3.0
    );
    // The existing connection and new ones are unaffected.
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    let fresh = tls_client(&pem, true);
    assert_eq!(fresh.get(&url).send().await.unwrap().status(), 200);
    assert_eq!(up.hits(), 3);
}

/// An RSA certificate and PKCS#8 key: the key is a fixed test key (`tests/fixtures/rsa-key.pem`,
/// made once with `openssl genpkey -algorithm RSA`: ring, under rcgen, signs with RSA but cannot
/// make RSA keys), the certificate is made and signed with it by rcgen. No `openssl` command:
/// the suite needs only what `scripts/test` installs.
fn rsa_pair(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    const KEY: &str = include_str!("fixtures/rsa-key.pem");
    let signing = rcgen::KeyPair::from_pem(KEY).expect("the fixture is a PKCS#8 RSA key");
    assert!(
        signing.is_compatible(&rcgen::PKCS_RSA_SHA256),
        "the fixture is not an RSA key"
    );
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = params.self_signed(&signing).unwrap().pem();
    let cert = dir.join("rsa-cert.pem");
    let key = dir.join("rsa-key.pem");
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, KEY).unwrap();
    (cert, key)
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_bad_or_missing_files_are_config_errors_naming_the_file() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = self_signed(dir.path());
    let (rsa_cert, rsa_key) = rsa_pair(dir.path());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "this is not PEM\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (_, other_key, _) = self_signed(&other);

    let check = |c: &std::path::Path, k: &std::path::Path| {
        let file = dir.path().join("gateway.toml");
        std::fs::write(&file, tls_config(&up, c, k)).unwrap();
        let out = std::process::Command::new(tollgate_bin())
            .arg("check")
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    // PKCS#8 EC and PKCS#8 RSA pairs are valid.
    let (ok, out) = check(&cert, &key);
    assert!(ok, "{out}");
    let (ok, out) = check(&rsa_cert, &rsa_key);
    assert!(ok, "{out}");
    // Each bad file is named.
    for (c, k, named) in [
        (&missing, &key, &missing),
        (&garbage, &key, &garbage),
        (&cert, &missing, &missing),
        (&cert, &garbage, &garbage),
        (&cert, &rsa_cert, &rsa_cert),
    ] {
        let (ok, out) = check(c, k);
        assert!(!ok, "check accepted cert {c:?} key {k:?}");
        assert!(
            out.contains(&*named.display().to_string()),
            "does not name {named:?}: {out}"
        );
    }
    // A key that does not belong to the certificate.
    let (ok, out) = check(&cert, &other_key);
    assert!(!ok && out.contains("does not fit"), "{out}");

    // `run` refuses to start the same way.
    let file = dir.path().join("run.toml");
    std::fs::write(&file, tls_config(&up, &cert, &missing)).unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&*missing.display().to_string()), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Hot reload.
// ---------------------------------------------------------------------------------------------

fn reload_config(up: &Upstream, extra_routes: &str) -> String {
    let fw = limit("name = \"three\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"global\"");
    let routes = route("api", "/api", &up.url(), "")
        + &route("limited", "/limited", &up.url(), "")
        + &fw
        + extra_routes;
    config("backend = \"memory\"", &routes)
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_under_traffic_fails_no_request_and_applies_the_new_config() {
    let up = upstream().await;
    let gw = gateway(&reload_config(&up, ""));
    // A SIGHUP right after start-up reloads (it must not be taken for "terminate").
    gw.signal(Signal::HUP);
    let c = client();
    assert_eq!(
        wait_metric(
            &gw,
            "tollgate_config_reloads_total",
            &["result=\"success\""],
            1.0
        )
        .await,
        1.0
    );
    assert_eq!(c.get(gw.url("/new/x")).send().await.unwrap().status(), 404);

    let traffic = Traffic::start(&c, gw.url("/api/traffic"), 4);
    let wait_for = |path: &'static str| {
        let c = c.clone();
        let url = gw.url(path);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let s = c.get(&url).send().await.unwrap().status();
                if s == 200 || Instant::now() > deadline {
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // SIGHUP adds /new.
    gw.write_config(&reload_config(&up, &route("new", "/new", &up.url(), "")));
    gw.signal(Signal::HUP);
    assert_eq!(wait_for("/new/x").await, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // POST /-/reload adds /newer.
    gw.write_config(&reload_config(
        &up,
        &(route("new", "/new", &up.url(), "") + &route("newer", "/newer", &up.url(), "")),
    ));
    let res = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        c.get(gw.url("/newer/x")).send().await.unwrap().status(),
        200
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (ok, failed) = traffic.finish().await;
    assert!(
        failed.is_empty(),
        "requests failed during reload: {failed:?}"
    );
    assert!(ok >= 20, "too little traffic ran: {ok}");
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_config_reloads_total{result=\"success\"}"),
        Some(3.0)
    );
    assert_eq!(
        metric_sum(&m, "tollgate_config_reloads_total", &["result=\"failure\""]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_reload_is_rejected_and_the_old_config_keeps_serving() {
    let up = upstream().await;
    let gw = gateway(&reload_config(&up, ""));
    let c = client();
    assert_eq!(c.get(gw.url("/api/a")).send().await.unwrap().status(), 200);

    let bad = reload_config(&up, &route("bad", "/bad", "ftp://127.0.0.1:1", ""));
    gw.write_config(&bad);
    let res = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert!(!res.status().is_success(), "{}", res.status());
    let body = res.text().await.unwrap();
    assert!(body.contains("scheme must be http"), "{body}");

    gw.write_config("[server\nlisten = ");
    gw.signal(Signal::HUP);
    assert_eq!(
        wait_metric(
            &gw,
            "tollgate_config_reloads_total",
            &["result=\"failure\""],
            2.0
        )
        .await,
        2.0
    );
    let logs = gw.logs();
    assert!(logs.contains("configuration reload failed"), "{logs}");
    assert!(logs.contains("scheme must be http"), "{logs}");
    assert!(logs.contains("gateway.toml"), "{logs}");

    // The old configuration still serves, and the rejected route does not exist.
    assert_eq!(c.get(gw.url("/api/b")).send().await.unwrap().status(), 200);
    assert_eq!(c.get(gw.url("/bad/x")).send().await.unwrap().status(), 404);
    let m = gw.metrics().await;
    assert_eq!(
        metric_sum(&m, "tollgate_config_reloads_total", &["result=\"success\""]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn limiter_state_of_an_unchanged_limit_survives_a_reload() {
    let up = upstream().await;
    let gw = gateway(&reload_config(&up, ""));
    let c = client();
    for _ in 0..3 {
        assert_eq!(
            c.get(gw.url("/limited/x")).send().await.unwrap().status(),
            200
        );
    }
    gw.write_config(&reload_config(&up, &route("new", "/new", &up.url(), "")));
    let res = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(c.get(gw.url("/new/x")).send().await.unwrap().status(), 200);
    let res = c.get(gw.url("/limited/x")).send().await.unwrap();
    assert_eq!(res.status(), 429, "the reload reset the limit's state");
    assert_eq!(
        up.seen()
            .iter()
            .filter(|s| s.uri.starts_with("/limited"))
            .count(),
        3
    );
}

// ---------------------------------------------------------------------------------------------
// Graceful drain.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_in_flight_requests_refuses_new_ones_and_exits_zero() {
    let up = upstream().await;
    let mut gw = gateway(&plain(&up, "", ""));
    // A kept-alive HTTP/1.1 request the upstream answers after 1.5 s.
    let mut slow = TcpStream::connect(gw.proxy).await.unwrap();
    slow.write_all(b"GET /api/slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while up.hits() == 0 {
        assert!(Instant::now() < deadline, "the slow request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t0 = Instant::now();
    gw.signal(Signal::TERM);

    // New connections are refused while the slow request is still in flight.
    let refused = loop {
        if TcpStream::connect(gw.proxy).await.is_err() {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(1), "still accepting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(refused < Duration::from_millis(1400), "{refused:?}");
    // A draining gateway is not ready: load balancers stop sending to it.
    let ready = client().get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "readyz while draining");
    let body = ready.text().await.unwrap();
    assert!(body.contains(r#""status":"not_serving""#), "{body}");

    let res = read_response(&mut slow).await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    assert!(
        res.to_ascii_lowercase().contains("connection: close"),
        "{res}"
    );
    assert!(
        read_to_close(&mut slow, Duration::from_secs(3))
            .await
            .closed
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = gw.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the gateway did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    assert!(gw.logged("all connections drained").await, "{}", gw.logs());
}

// ---------------------------------------------------------------------------------------------
// Hostile input.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn content_length_with_transfer_encoding_gets_400_and_a_closed_connection() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    for req in [
        &b"POST /api/s HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /api/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"POST /api/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\nGET /api/smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let r = raw(gw.proxy, req).await;
        assert_eq!(r.status(), Some(400), "{}", r.text);
        assert!(r.closed, "connection left open: {}", r.text);
        assert_eq!(r.text.matches("HTTP/1.1").count(), 1, "{}", r.text);
    }
    // Behind an innocent request on the same connection.
    let r = raw(
        gw.proxy,
        b"GET /api/first HTTP/1.1\r\nHost: x\r\n\r\n\
          POST /api/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await;
    assert!(r.text.starts_with("HTTP/1.1 200"), "{}", r.text);
    assert!(r.text.contains("}HTTP/1.1 400 Bad Request"), "{}", r.text);
    assert!(r.closed);
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].uri, "/api/first");
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_is_refused_and_closes_the_connection() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    let smuggle: &[u8] = b"POST /api/s HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    // The CONNECT answered first, then a request with both framings on the same connection.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n")
        .await
        .unwrap();
    let first = read_response(&mut s).await;
    assert!(first.starts_with("HTTP/1.1 400"), "{first}");
    let _ = s.write_all(smuggle).await;
    let r = read_to_close(&mut s, Duration::from_secs(3)).await;
    assert!(r.closed, "connection left open after CONNECT: {}", r.text);
    assert!(!r.text.contains("HTTP/1.1 200"), "{}", r.text);
    // Pipelined behind the CONNECT.
    let mut req = b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n".to_vec();
    req.extend_from_slice(smuggle);
    let r = raw(gw.proxy, &req).await;
    assert_eq!(r.status(), Some(400), "{}", r.text);
    assert_eq!(r.text.matches("HTTP/1.1").count(), 1, "{}", r.text);
    assert!(r.closed);
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicting_content_lengths_get_400() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    for req in [
        &b"POST /api/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"
            [..],
        b"POST /api/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!",
        b"POST /api/s HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
    ] {
        let r = raw(gw.proxy, req).await;
        assert_eq!(r.status(), Some(400), "{}", r.text);
        assert!(r.closed);
    }
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn transfer_encodings_other_than_a_lone_chunked_get_400() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    for te in [
        "gzip, chunked",
        "chunked, gzip",
        "gzip",
        "identity",
        "chunked\r\nTransfer-Encoding: chunked",
        "x-custom, chunked",
    ] {
        let req = format!(
            "POST /api/te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let r = raw(gw.proxy, req.as_bytes()).await;
        assert_eq!(r.status(), Some(400), "{te}: {}", r.text);
        assert!(r.closed, "{te}: connection left open");
    }
    assert_eq!(up.hits(), 0, "a bad Transfer-Encoding reached the upstream");
    // A lone chunked is fine.
    let r = raw(
        gw.proxy,
        b"POST /api/te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
    assert_eq!(up.seen()[0].body_len, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn underscore_headers_never_reach_the_upstream() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    let r = raw(
        gw.proxy,
        b"GET /api/u HTTP/1.1\r\nHost: x\r\nX_Forwarded_For: 6.6.6.6\r\nX_Real_IP: 6.6.6.6\r\nx-ok: 1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
    let s = up.seen().pop().unwrap();
    assert!(
        s.headers.keys().all(|k| !k.as_str().contains('_')),
        "{:?}",
        s.headers
    );
    assert_eq!(s.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(s.headers["x-ok"], "1");
}

#[tokio::test(flavor = "multi_thread")]
async fn control_characters_in_header_values_never_reach_the_upstream() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    for bad in [
        &b"X-A: a\0b"[..],
        b"X-A: a\rInjected: 1",
        b"X-A: a\r\n Injected: 1",
        b"X-A: a\r\n\tInjected: 1",
        b"X-A: \x01\x7f",
    ] {
        let mut req = b"GET /api/c HTTP/1.1\r\nHost: x\r\n".to_vec();
        req.extend_from_slice(bad);
        req.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let r = raw(gw.proxy, &req).await;
        assert_eq!(
            r.status(),
            Some(400),
            "{:?}: {}",
            String::from_utf8_lossy(bad),
            r.text
        );
    }
    assert_eq!(up.hits(), 0);
    // A bare LF ends a header line: it separates two headers, never lands inside a value.
    let r = raw(
        gw.proxy,
        b"GET /api/c HTTP/1.1\r\nHost: x\r\nX-A: a\nX-B: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    if r.status() == Some(200) {
        let s = up.seen().pop().unwrap();
        assert_eq!(s.headers["x-a"], "a");
        assert_eq!(s.headers["x-b"], "b");
    } else {
        assert_eq!(r.status(), Some(400), "{}", r.text);
    }
    for s in up.seen() {
        for v in s.headers.values() {
            assert!(
                !v.as_bytes().iter().any(|b| matches!(b, b'\r' | b'\n' | 0)),
                "{v:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn header_block_over_64_kib_gets_431() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    let req = |n: usize| {
        format!(
            "GET /api/h HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(n)
        )
    };
    let r = raw(gw.proxy, req(60 * 1024).as_bytes()).await;
    assert_eq!(r.status(), Some(200), "60 KiB: {}", r.text);
    let r = raw(gw.proxy, req(70 * 1024).as_bytes()).await;
    assert_eq!(r.status(), Some(431), "70 KiB: {}", r.text);
    assert!(r.closed);
    // Many small headers add up the same way.
    let many: String = (0..90)
        .map(|i| format!("X-H{i}: {}\r\n", "b".repeat(800)))
        .collect();
    let r = raw(
        gw.proxy,
        format!("GET /api/h HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert_eq!(r.status(), Some(431), "{}", r.text);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn uri_over_8_kib_gets_414() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    let req = |n: usize| {
        format!(
            "GET /api/{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "p".repeat(n)
        )
    };
    let r = raw(gw.proxy, req(8000).as_bytes()).await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
    let r = raw(gw.proxy, req(8300).as_bytes()).await;
    assert_eq!(r.status(), Some(414), "{}", r.text);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn declared_body_over_max_body_size_gets_413_without_being_read() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", "max_body_size = 1024"));
    // The body is never sent: the answer must not wait for it, nor ask for it.
    let t0 = Instant::now();
    let r = raw(
        gw.proxy,
        b"POST /api/big HTTP/1.1\r\nHost: x\r\nContent-Length: 20971520\r\nExpect: 100-continue\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(413), "{}", r.text);
    assert!(!r.text.contains("100 Continue"), "{}", r.text);
    assert!(r.closed);
    assert!(t0.elapsed() < Duration::from_secs(3));
    // At the limit is fine.
    let mut req =
        b"POST /api/ok HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend_from_slice(&[b'x'; 1024]);
    let r = raw(gw.proxy, &req).await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
    assert_eq!(up.hits(), 1);
    assert_eq!(up.seen()[0].uri, "/api/ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_body_crossing_max_body_size_is_cut_off_with_413() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", "max_body_size = 1024"));
    // 256 KiB in 1 KiB chunks, written while the answer is read: the gateway must stop
    // forwarding after 1 KiB, abort the upstream request, and still get the 413 across.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"POST /api/up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let chunk = format!("400\r\n{}\r\n", "y".repeat(1024));
        for _ in 0..256 {
            if wr.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = wr.write_all(b"0\r\n\r\n").await;
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), rd.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    writer.abort();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(closed);
    // The upstream request was aborted: the upstream may have seen it start (depending on
    // whether the head was flushed before the cut), but never a complete body.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(up.hits() <= 1);
    assert!(up.seen().is_empty(), "the upstream finished reading a body");
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"api\",status=\"413\"}"),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_chunked_body_is_the_clients_fault_not_the_upstreams() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    for body in [
        &b"zz\r\n"[..],
        b"fffffffffffffffffffff\r\n",
        b"5\r\nhelloXX\r\n0\r\n\r\n",
        b"3\r\nabc\r\n5;\n",
    ] {
        let mut req =
            b"POST /api/chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        req.extend_from_slice(body);
        let r = raw(gw.proxy, &req).await;
        let shown = String::from_utf8_lossy(body);
        assert_eq!(r.status(), Some(400), "{shown}: {}", r.text);
        assert!(
            r.text.contains("application/problem+json"),
            "{shown}: {}",
            r.text
        );
        assert!(r.closed, "{shown}: connection left open");
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"api\",status=\"400\"}"),
        Some(4.0),
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "tollgate_upstream_errors_total", &[]),
        0.0,
        "{m}"
    );
    let logs = gw.logs();
    assert!(!logs.contains("WARN"), "{logs}");
    assert!(up.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn slowloris_connections_delay_no_one_and_are_closed_after_header_read_timeout() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "header_read_timeout = \"1s\"", ""));
    let t0 = Instant::now();
    let mut slow = Vec::new();
    for i in 0..300 {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        // Most send a partial head; some send nothing at all, some a prefix of the h2 preface.
        match i % 10 {
            0 => {}
            1 => s.write_all(b"PRI * HT").await.unwrap(),
            _ => s
                .write_all(b"GET /api/x HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap(),
        }
        slow.push(s);
    }
    let opened = t0.elapsed();
    let t1 = Instant::now();
    let res = client().get(gw.url("/api/normal")).send().await.unwrap();
    let took = t1.elapsed();
    assert_eq!(res.status(), 200);
    assert!(
        took < Duration::from_millis(500),
        "a normal request took {took:?} next to 300 slow ones"
    );
    // Every slow connection is closed, around header_read_timeout after it opened.
    let closers = slow.into_iter().map(|mut s| {
        tokio::spawn(async move {
            let r = read_to_close(&mut s, Duration::from_secs(6)).await;
            (r.closed, t0.elapsed())
        })
    });
    let mut closed = 0;
    for c in closers {
        let (was_closed, at) = c.await.unwrap();
        if was_closed {
            closed += 1;
            assert!(
                at >= Duration::from_millis(900),
                "closed after {at:?}, before header_read_timeout"
            );
            assert!(
                at < opened + Duration::from_secs(4),
                "closed only after {at:?}"
            );
        }
    }
    assert_eq!(closed, 300, "slow connections left open");
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_lines_on_a_kept_alive_connection_start_the_header_read_timeout() {
    let up = upstream().await;
    let gw = gateway(&plain(
        &up,
        "idle_timeout = \"4s\"\nheader_read_timeout = \"1s\"",
        "",
    ));
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"GET /api/ka HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    // Empty lines are what may precede a request line: they begin the wait for a head.
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let closed_after = loop {
        if s.write_all(b"\r\n").await.is_err() {
            break t0.elapsed();
        }
        match tokio::time::timeout(Duration::from_millis(250), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break t0.elapsed(),
            Ok(Ok(n)) => panic!("unexpected answer: {}", String::from_utf8_lossy(&buf[..n])),
            Err(_) => {}
        }
        assert!(t0.elapsed() < Duration::from_secs(8), "never closed");
    };
    assert!(
        closed_after >= Duration::from_millis(900) && closed_after < Duration::from_millis(2500),
        "closed after {closed_after:?}, not header_read_timeout after the first empty line"
    );
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn stalled_request_body_gets_408() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "body_read_timeout = \"1s\"", ""));
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"POST /api/stall HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let t0 = Instant::now();
    let r = read_to_close(&mut s, Duration::from_secs(6)).await;
    let took = t0.elapsed();
    assert_eq!(r.status(), Some(408), "{}", r.text);
    assert!(r.closed);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(up.seen().is_empty());
}

/// An upstream for the response-body timers, one request per connection, by path:
/// `/api/stall` → a head with `Content-Length: 100` and 10 bytes, then silence;
/// `/api/flood` → a head with a 1 GiB `Content-Length`, then bytes as fast as they are taken.
/// Each connection's end (the gateway closed it) is sent on the channel.
async fn body_timer_upstream() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Instant>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                if head.starts_with(b"GET /api/stall ") {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                        .await;
                    let mut sink = [0u8; 64];
                    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                } else {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                        .await;
                    let chunk = vec![b'x'; 64 * 1024];
                    while s.write_all(&chunk).await.is_ok() {}
                }
                let _ = tx.send(Instant::now());
            });
        }
    });
    (addr, rx)
}

/// `idle_timeout` ends a response whose upstream goes silent mid-body, and one whose client
/// stops reading: both connections are closed (#34 item 2). The fast front closes at
/// `idle_timeout`; the hyper front closes gracefully then, and drops the connection after its
/// 5 s close grace (`server::connection::CLOSE_GRACE`): the bounds take both.
#[tokio::test(flavor = "multi_thread")]
async fn idle_timeout_ends_a_stalled_response_body_and_closes_both_connections() {
    // idle_timeout, plus the hyper front's close grace, plus a margin.
    let bound = Duration::from_millis(500 + 5_000 + 2_500);
    let (up, mut ended) = body_timer_upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &route("api", "/api", &format!("http://{up}"), ""),
    )
    .replacen("[server]\n", "[server]\nidle_timeout = \"500ms\"\n", 1);
    let gw = gateway(&cfg);

    // The upstream goes silent after 10 of 100 bytes: the client gets those, then the close.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"GET /api/stall HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    let r = read_to_close(&mut s, bound).await;
    let took = t0.elapsed();
    assert!(
        r.closed,
        "a silent response body is never ended: {}",
        r.text
    );
    assert!(r.text.starts_with("HTTP/1.1 200"), "{}", r.text);
    assert!(r.text.ends_with("\r\n\r\n0123456789"), "{}", r.text);
    assert!(
        took >= Duration::from_millis(400) && took < bound,
        "closed after {took:?}"
    );
    let at = tokio::time::timeout(Duration::from_secs(3), ended.recv())
        .await
        .expect("the upstream connection is left open")
        .unwrap();
    assert!(at - t0 < bound);

    // A client that reads nothing of a large body: once the buffers are full, nothing moves for
    // idle_timeout and both connections close.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"GET /api/flood HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    let at = tokio::time::timeout(bound + Duration::from_secs(2), ended.recv())
        .await
        .expect("the upstream connection of a client that reads nothing is left open")
        .unwrap();
    assert!(at - t0 < bound + Duration::from_secs(2));
    // The client's connection is closed too: reading it out ends (EOF or reset), it does not
    // go quiet.
    let mut buf = vec![0u8; 256 * 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the client's connection is left open");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_keep_alive_connections_are_closed_after_idle_timeout() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "idle_timeout = \"1s\"", ""));

    // HTTP/1.1: two requests on one connection, then silence.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    for _ in 0..2 {
        s.write_all(b"GET /api/ka HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let res = read_response(&mut s).await;
        assert!(res.starts_with("HTTP/1.1 200"), "{res}");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let t0 = Instant::now();
    let r = read_to_close(&mut s, Duration::from_secs(8)).await;
    let idle = t0.elapsed();
    assert!(r.closed, "idle HTTP/1.1 connection left open");
    assert!(
        idle >= Duration::from_millis(300) && idle < Duration::from_secs(4),
        "closed after {idle:?}"
    );

    // HTTP/2 (prior knowledge): the connection ends once idle.
    let tcp = TcpStream::connect(gw.proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = conn.await;
        let _ = done_tx.send(Instant::now());
    });
    let req = http::Request::get(format!("http://{}/api/h2", gw.proxy))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let res = sender.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), http::Version::HTTP_2);
    drop(res);
    let t0 = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(8), done_rx)
        .await
        .expect("idle HTTP/2 connection left open")
        .unwrap();
    let idle = ended - t0;
    assert!(idle < Duration::from_secs(4), "closed after {idle:?}");
    assert_eq!(up.hits(), 3);

    // A keep-alive connection lives for idle_timeout, even when header_read_timeout is shorter.
    let gw = gateway(&plain(
        &up,
        "idle_timeout = \"3s\"\nheader_read_timeout = \"1s\"",
        "",
    ));
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"GET /api/ka HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    let t0 = Instant::now();
    let r = read_to_close(&mut s, Duration::from_secs(8)).await;
    let idle = t0.elapsed();
    assert!(r.closed);
    assert!(
        idle >= Duration::from_millis(2500) && idle < Duration::from_secs(6),
        "closed after {idle:?}, not after idle_timeout"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_or_duplicate_host_gets_400_on_http_1_1() {
    let up = upstream().await;
    let gw = gateway(&plain(&up, "", ""));
    let r = raw(
        gw.proxy,
        b"GET /api/h HTTP/1.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(400), "{}", r.text);
    let r = raw(
        gw.proxy,
        b"GET /api/h HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(400), "{}", r.text);
    let r = raw(
        gw.proxy,
        b"GET /api/h HTTP/1.1\r\nHost: a\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(400), "{}", r.text);
    assert_eq!(up.hits(), 0);
    // HTTP/1.0 needs no Host.
    let r = raw(gw.proxy, b"GET /api/h HTTP/1.0\r\n\r\n").await;
    assert!(r.text.starts_with("HTTP/1.0 200"), "{}", r.text);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trailing_dot_in_host_does_not_skip_a_host_route() {
    let up = upstream().await;
    let routes = route("open", "/", &up.url(), "")
        + &route("free", "/", &up.url(), "host = \"free.example.com\"")
        + &limit("name = \"one\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"global\"");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    let get = |host: &str| {
        format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
    };
    let r = raw(gw.proxy, &get("free.example.com")).await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
    for host in [
        "free.example.com.",
        "FREE.example.com.",
        "free.example.com.:8080",
        "free.example.com",
    ] {
        let r = raw(gw.proxy, &get(host)).await;
        assert_eq!(r.status(), Some(429), "{host}: {}", r.text);
    }
    // Only one dot is a DNS root; other hosts still go to the catch-all route.
    for host in ["free.example.com..", "other.example.com."] {
        let r = raw(gw.proxy, &get(host)).await;
        assert_eq!(r.status(), Some(200), "{host}: {}", r.text);
    }
    assert_eq!(up.hits(), 3);
}

/// A raw HTTP/1.0 upstream: reads one request head, answers `HTTP/1.0 200 OK` (with a
/// `Content-Length` unless the path ends in `/eof`, then the body ends at the close) and closes.
async fn http10_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let res: &[u8] = if line.contains("/eof ") {
                    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil-close"
                } else {
                    b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nsized"
                };
                let _ = s.write_all(res).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// Reads from a kept-alive connection until `end` has arrived; returns everything read.
async fn read_until(s: &mut TcpStream, end: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&out).contains(end) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {end:?} in time: {}", String::from_utf8_lossy(&out)))
            .unwrap_or(0);
        assert!(
            n > 0,
            "closed before {end:?}: {}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_1_0_upstream_does_not_downgrade_http_1_1_clients() {
    let addr = http10_upstream().await;
    let gw = gateway(&config(
        "backend = \"memory\"",
        &route("old", "/old", &format!("http://{addr}"), ""),
    ));
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    for (path, body) in [
        ("/old/a", "sized"),
        ("/old/eof", "until-close"),
        ("/old/b", "sized"),
        ("/old/eof", "until-close"),
    ] {
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        // A body read to the upstream's close is sent chunked; a sized one keeps its length.
        let res = if body == "sized" {
            read_response(&mut s).await
        } else {
            read_until(&mut s, "\r\n0\r\n\r\n").await
        };
        assert!(res.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {res}");
        assert!(res.contains(body), "{path}: {res}");
        assert!(
            !res.to_ascii_lowercase().contains("connection: close"),
            "{path}: {res}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Upgrades.
// ---------------------------------------------------------------------------------------------

/// A raw upstream: answers a WebSocket (or h2c) upgrade with 101 and then echoes bytes; anything
/// else gets a 200. Records each request head (lower-cased).
async fn upgrade_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let h = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let h = h.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                h.lock().unwrap().push(head.clone());
                if head.contains("upgrade: h2c") {
                    // What an h2c-capable upstream does: switch, then speak HTTP/2 (here: echo).
                    s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
                        .await
                        .unwrap();
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                } else if head.contains("upgrade: websocket") {
                    s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
                        .await
                        .unwrap();
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                } else {
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno",
                        )
                        .await;
                }
            });
        }
    });
    (addr, heads)
}

const WS_REQUEST: &[u8] = b"GET /ws/chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .expect("no response head")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_upgrade_is_tunnelled_only_when_the_upstream_switches() {
    let (ws_addr, heads) = upgrade_upstream().await;
    let up = upstream().await;
    let ws_route = route("ws", "/ws", &format!("http://{ws_addr}"), "")
        + &limit("name = \"one\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"global\"");
    let routes = ws_route + &route("plain", "/plain", &up.url(), "");
    let gw = gateway(&config("backend = \"memory\"", &routes));

    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(WS_REQUEST).await.unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(head.contains("connection: upgrade"), "{head}");
    assert!(head.contains("sec-websocket-accept:"), "{head}");
    for msg in [&b"hello through the tunnel"[..], b"\x81\x05bytes\x00\xff"] {
        s.write_all(msg).await.unwrap();
        let mut echo = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echo))
            .await
            .expect("no echo through the tunnel")
            .unwrap();
        assert_eq!(echo, msg);
    }
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].contains("upgrade: websocket"), "{}", seen[0]);
    assert!(seen[0].contains("connection: upgrade"), "{}", seen[0]);
    assert!(seen[0].contains("sec-websocket-key:"), "{}", seen[0]);

    // The route's limit applies to upgrades: the second is refused before the upstream.
    let r = raw(gw.proxy, WS_REQUEST).await;
    assert_eq!(r.status(), Some(429), "{}", r.text);
    assert_eq!(heads.lock().unwrap().len(), 1);

    // An upstream that answers 200 gets no tunnel: later bytes are HTTP again.
    let mut s2 = TcpStream::connect(gw.proxy).await.unwrap();
    s2.write_all(&WS_REQUEST.to_vec().replace_path("/plain/chat"))
        .await
        .unwrap();
    let res = read_response(&mut s2).await;
    assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    assert!(!res.to_ascii_lowercase().contains("upgrade:"), "{res}");
    s2.write_all(b"hello through the tunnel\r\n\r\n")
        .await
        .unwrap();
    let r = read_to_close(&mut s2, Duration::from_secs(3)).await;
    assert!(!r.text.contains("hello through the tunnel"), "{}", r.text);
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn h2c_and_other_upgrades_are_not_forwarded_and_get_a_plain_response() {
    let (addr, heads) = upgrade_upstream().await;
    let gw = gateway(&config(
        "backend = \"memory\"",
        &route("open", "/open", &format!("http://{addr}"), ""),
    ));
    for (i, req) in [
        &b"GET /open/a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"[..],
        // HTTP2-Settings not listed in Connection is removed all the same.
        b"GET /open/b HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        b"GET /open/c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: foo/2\r\n\r\n",
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        s.write_all(req).await.unwrap();
        let res = read_response(&mut s).await;
        assert!(res.starts_with("HTTP/1.1 200"), "{res}");
        assert!(!res.to_ascii_lowercase().contains("upgrade"), "{res}");
        let seen = heads.lock().unwrap().clone();
        assert_eq!(seen.len(), i + 1);
        let head = &seen[i];
        assert!(!head.contains("upgrade"), "forwarded: {head}");
        assert!(!head.contains("http2-settings"), "forwarded: {head}");
    }
}

trait ReplacePath {
    fn replace_path(self, path: &str) -> Vec<u8>;
}

impl ReplacePath for Vec<u8> {
    fn replace_path(self, path: &str) -> Vec<u8> {
        String::from_utf8(self)
            .unwrap()
            .replacen("/ws/chat", path, 1)
            .into_bytes()
    }
}

/// Issue #34 item 9: a `Host` with user-info (`paid.example:80@free.example`) is refused with
/// 400 on either front (RFC 9112 §3.2: no user-info in a request's authority), never routed on
/// the part after `@` nor forwarded; an absolute-form target with user-info too.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_with_user_info_is_400() {
    let up = upstream().await;
    let routes = "[[routes]]\nname = \"free\"\nhost = \"free.example\"\npath_prefix = \"/\"\nupstream = \"UP\"\n"
        .replace("UP", &up.url());
    let gw = gateway(&config("backend = \"memory\"", &routes));
    wait_ready(&gw).await;
    for request in [
        "GET /x HTTP/1.1\r\nHost: paid.example:80@free.example\r\nConnection: close\r\n\r\n",
        "GET /x HTTP/1.1\r\nHost: u@free.example\r\nConnection: close\r\n\r\n",
        "GET http://paid.example:80@free.example/x HTTP/1.1\r\nHost: paid.example:80@free.example\r\nConnection: close\r\n\r\n",
    ] {
        let r = raw(gw.proxy, request.as_bytes()).await;
        assert_eq!(r.status(), Some(400), "{request:?}: {}", r.text);
    }
    assert_eq!(up.hits(), 0, "a Host with user-info was forwarded");
    // The plain host is served.
    let r = raw(
        gw.proxy,
        b"GET /x HTTP/1.1\r\nHost: free.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
}

/// Issue #34 item 8: what the gateway asserts upstream (`X-Consumer`, `X-Forwarded-Host`,
/// `X-Forwarded-Proto`, the request id) is never taken from the client, on a route without
/// `consumers = true` too, on either front.
#[tokio::test(flavor = "multi_thread")]
async fn asserted_headers_are_never_taken_from_the_client() {
    let up = upstream().await;
    let gw = gateway(&config(
        "backend = \"memory\"",
        &route("api", "/api", &up.url(), ""),
    ));
    wait_ready(&gw).await;
    let r = raw(
        gw.proxy,
        b"GET /api/x HTTP/1.1\r\nHost: a.example\r\nX-Consumer: admin\r\nx-consumer: root\r\nX-Forwarded-Proto: https\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status(), Some(200), "{}", r.text);
    // HTTP/1.0 without Host: no X-Forwarded-Host of the gateway's, and none of the client's.
    let r = raw(
        gw.proxy,
        b"GET /api/y HTTP/1.0\r\nX-Consumer: admin\r\nX-Forwarded-Host: bank.example\r\n\r\n",
    )
    .await;
    assert!(r.text.starts_with("HTTP/1.0 200"), "{}", r.text);
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert!(
            s.headers.get("x-consumer").is_none(),
            "a forged X-Consumer reached the upstream: {:?}",
            s.headers
        );
        assert_eq!(s.headers["x-forwarded-proto"], "http");
    }
    assert!(
        seen[1].headers.get("x-forwarded-host").is_none(),
        "a forged X-Forwarded-Host reached the upstream: {:?}",
        seen[1].headers
    );
}

// ---------------------------------------------------------------------------------------------
// HTTP/2 memory (#34 items 13 and 26).
// ---------------------------------------------------------------------------------------------

/// A client connection whose reads can be stopped: a client that grants windows and then reads
/// nothing, so that what the gateway sends stays with the gateway.
struct Stall {
    inner: TcpStream,
    paused: Arc<std::sync::atomic::AtomicBool>,
}

impl tokio::io::AsyncRead for Stall {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.paused.load(std::sync::atomic::Ordering::SeqCst) {
            // Never woken: the connection reads nothing more.
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Stall {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A raw upstream answering every request with a 4 MiB body.
async fn big_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut res = b"HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\n".to_vec();
    res.resize(res.len() + (4 << 20), b'x');
    let res: &'static [u8] = Box::leak(res.into_boxed_slice());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                let mut head = Vec::new();
                loop {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    head.clear();
                    if s.write_all(res).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// An HTTP/2 connection (prior knowledge) granting the largest windows, whose reads `paused`
/// stops.
async fn h2_greedy(
    addr: SocketAddr,
    paused: Arc<std::sync::atomic::AtomicBool>,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let io = Stall { inner: tcp, paused };
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(i32::MAX as u32)
            .initial_connection_window_size(i32::MAX as u32)
            .handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// #34 item 13: a client that grants a 2 GB window and then reads nothing, on 256 streams of
/// 4 MiB responses, makes the gateway hold no more than its documented bound (16 MiB of
/// response data per connection: 8 MiB queued for the client, 32 KiB read ahead per upstream
/// connection), not what the window would allow (168 MiB before the bound). The margin above
/// 16 MiB is the 256 requests' own state.
#[tokio::test(flavor = "multi_thread")]
async fn an_http2_client_granting_a_huge_window_and_reading_nothing_is_bounded() {
    let up = big_upstream().await;
    let gw = gateway(&config(
        "backend = \"memory\"",
        &route("big", "/big", &format!("http://{up}"), ""),
    ));
    let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut send = h2_greedy(gw.proxy, paused.clone()).await;
    // One whole exchange first: the connection's settings are agreed; the baseline is taken.
    let req = http::Request::get(format!("http://{}/big/0", gw.proxy))
        .body(http_body_util::Empty::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    let n = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes()
        .len();
    assert_eq!(n, 4 << 20);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss(gw.child.id());
    paused.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut held = Vec::new();
    for i in 0..256 {
        let req = http::Request::get(format!("http://{}/big/{i}", gw.proxy))
            .body(http_body_util::Empty::new())
            .unwrap();
        let mut s = send.clone();
        held.push(tokio::spawn(async move { s.send_request(req).await }));
    }
    // Long enough for every stream's upstream to answer and the gateway to fill what it holds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grown = rss(gw.child.id()).saturating_sub(before);
    assert!(
        grown < 48 << 20,
        "the gateway grew by {} MiB for one connection",
        grown >> 20
    );
    drop(held);
}

type HangingBody = http_body_util::StreamBody<
    std::pin::Pin<
        Box<
            dyn futures_util::Stream<
                    Item = Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>,
                > + Send,
        >,
    >,
>;

/// A JSON body whose first `len` bytes are sent, and then nothing, never ending.
fn hanging_body(len: usize) -> HangingBody {
    use futures_util::StreamExt as _;
    let mut b = br#"{"model":"m","pad":""#.to_vec();
    b.resize(len, b'x');
    let first = futures_util::stream::iter([Ok(hyper::body::Frame::data(bytes::Bytes::from(b)))]);
    http_body_util::StreamBody::new(Box::pin(first.chain(futures_util::stream::pending())))
}

/// `streams` POSTs to `/llm/x` on a new HTTP/2 connection to `addr`, each with a body that
/// sends `len` bytes and never ends; the status of each answered within `within` (`None`: no
/// answer).
async fn unfinished_posts(
    addr: SocketAddr,
    streams: usize,
    len: usize,
    within: Duration,
) -> Vec<Option<u16>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let mut s = send.clone();
        let req = http::Request::post(format!("http://{addr}/llm/x"))
            .header("content-type", "application/json")
            .body(hanging_body(len))
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let _ = s.ready().await;
            match tokio::time::timeout(within, s.send_request(req)).await {
                Ok(Ok(res)) => Some(res.status().as_u16()),
                _ => None,
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    drop(send);
    out
}

on_every_store!(unfinished_bodies_are_seen_by_a_per_ip_limit_and_bounded);

/// #34 item 26: on a route whose limits read the JSON body, the limits that do not (per IP)
/// decide before the body is read: 4 connections × 250 unfinished streams from one address
/// get their 429s at once, only the limit's 20 are read. And what is held for bodies not yet
/// decided is bounded per connection (4 MiB): beyond it a stream is refused (429) at once.
async fn unfinished_bodies_are_seen_by_a_per_ip_limit_and_bounded(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let per_model = limit(
        "name = \"per-model\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nperiod = \"1m\"\nsubject = \"json:model\"",
    );
    let per_ip = limit(
        "name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 20\nperiod = \"1d\"\nsubject = \"ip\"",
    );
    let gw = gateway(&config(
        &env.store,
        &(route("llm", "/llm", &up.url(), "") + &per_model + &per_ip),
    ));
    wait_ready(&gw).await;
    let started = Instant::now();
    let runs = (0..4).map(|_| unfinished_posts(gw.proxy, 250, 8 << 10, Duration::from_secs(5)));
    let all: Vec<Option<u16>> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect();
    let limited = all.iter().filter(|s| **s == Some(429)).count();
    let unanswered = all.iter().filter(|s| s.is_none()).count();
    assert_eq!(
        (limited, unanswered),
        (980, 20),
        "the per-IP limit sees every stream before its body ({:?} s)",
        started.elapsed()
    );
    assert_eq!(up.hits(), 0, "no unfinished body reached the upstream");
    drop(gw);

    // No per-IP limit: 100 streams of 64 KiB on one connection; about 4 MiB of them are held,
    // the rest refused at once.
    let gw = gateway(&config(
        &env.store,
        &(route("llm", "/llm", &up.url(), "") + &per_model),
    ));
    wait_ready(&gw).await;
    let all = unfinished_posts(gw.proxy, 100, 64 << 10, Duration::from_secs(3)).await;
    let limited = all.iter().filter(|s| **s == Some(429)).count();
    let unanswered = all.iter().filter(|s| s.is_none()).count();
    assert_eq!(limited + unanswered, 100, "{all:?}");
    assert!(
        (55..=64).contains(&unanswered),
        "about 4 MiB of bodies held on the connection, the rest refused: {unanswered} held"
    );
}

/// The status of the answer on `s` if one starts within `within` (`None`: no answer yet).
async fn status_within(s: &mut TcpStream, within: Duration) -> Option<u16> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + within;
    while !got.windows(2).any(|w| w == b"\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
    std::str::from_utf8(&got)
        .ok()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()
}

/// #50 item 9: on a route whose limits read the JSON body, what slow clients' bodies hold
/// before their limits decide is bounded per worker, alike on both HTTP/1 fronts: with
/// `max_pending_body_bytes_per_worker` at 1 MiB, four clients holding 240 KiB each (their
/// bodies still coming, so no answer yet) fill it, and each next client gets 503 at once.
#[tokio::test(flavor = "multi_thread")]
async fn slow_json_bodies_are_bounded_per_worker_on_both_fronts() {
    let up = upstream().await;
    let per_model = limit(
        "name = \"per-model\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nperiod = \"1m\"\nsubject = \"json:model\"",
    );
    let cfg = config(
        "backend = \"memory\"",
        &(route("llm", "/llm", &up.url(), "") + &per_model),
    )
    .replacen(
        "[server]\n",
        "[server]\nworkers = 1\nmax_pending_body_bytes_per_worker = 1048576\n",
        1,
    );
    let mut sent = br#"{"model":"m","pad":""#.to_vec();
    sent.resize(240 << 10, b'x');
    let head = "POST /llm/x HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 3145728\r\n\r\n";
    let mut statuses = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(&cfg, front));
        wait_ready(&gw).await;
        let mut clients = Vec::new();
        let mut got = Vec::new();
        for _ in 0..8 {
            let mut s = TcpStream::connect(gw.proxy).await.unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(&sent).await.unwrap();
            // Read by the gateway before the next client comes (an answer, if any, at once).
            got.push(status_within(&mut s, Duration::from_millis(500)).await);
            clients.push(s);
        }
        assert_eq!(
            got,
            [
                None,
                None,
                None,
                None,
                Some(503),
                Some(503),
                Some(503),
                Some(503)
            ],
            "{front}: four bodies held, the rest refused"
        );
        assert_eq!(
            up.hits(),
            0,
            "{front}: no undecided body reached the upstream"
        );
        statuses.push(got);
    }
    assert_eq!(statuses[0], statuses[1]);
}
