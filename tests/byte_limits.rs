//! #38 §2, byte limits: `unit = "bytes"` with `bytes = "response" | "request" | "both"`,
//! through the binary on every store and on both HTTP/1 fronts (`TOLLGATE_TEST_HTTP1`). A byte
//! limit admits while bytes are left and is charged after the response with the bytes actually
//! sent: the response body's as handed to the client (framed by a length or chunked), the
//! request body's as sent upstream, and — a client that leaves mid-body — what it was sent by
//! then. The RateLimit fields say `qu="content-bytes"`.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

on_every_store!(
    response_bytes_are_counted,
    request_bytes_are_counted,
    a_client_that_leaves_pays_what_it_was_sent,
    a_body_read_before_the_limits_counts,
    a_plan_has_a_bandwidth_quota_per_consumer,
    a_byte_budget_of_zero_refuses_every_body
);

/// An upstream of bodies of a chosen size: `GET /len/N` (a `Content-Length` body of N bytes),
/// `/chunked/N` (chunked, in chunks of at most 1000), `/stall/N` (announces 10 MB, sends N
/// bytes, then nothing). A request body is read (by its `Content-Length`) and ignored; a `HEAD`
/// of `/len/N` gets the head alone.
async fn sized_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve(s));
        }
    });
    addr
}

async fn serve(mut s: TcpStream) {
    let mut buf = Vec::new();
    loop {
        // One request head, then its body.
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let body_len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < end + body_len {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + body_len);
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let n: usize = path.rsplit('/').next().unwrap().parse().unwrap_or(0);
        let ok = if path.contains("/chunked/") {
            let mut out =
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
                    .to_vec();
            let mut left = n;
            while left > 0 {
                let k = left.min(1000);
                out.extend_from_slice(format!("{k:x}\r\n").as_bytes());
                out.extend(std::iter::repeat_n(b'c', k));
                out.extend_from_slice(b"\r\n");
                left -= k;
            }
            out.extend_from_slice(b"0\r\n\r\n");
            s.write_all(&out).await
        } else if path.contains("/stall/") {
            let mut out =
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 10000000\r\n\r\n"
                    .to_vec();
            out.extend(std::iter::repeat_n(b's', n));
            let _ = s.write_all(&out).await;
            // Nothing more: the client leaves first.
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        } else {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {n}\r\n\r\n"
            )
            .into_bytes();
            if !head.starts_with("head ") {
                out.extend(std::iter::repeat_n(b'l', n));
            }
            s.write_all(&out).await
        };
        if ok.is_err() {
            return;
        }
    }
}

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn byte_limit(extra: &str) -> String {
    limit(&format!(
        "name = \"bytes\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"ip\"\nunit = \"bytes\"\n{extra}"
    ))
}

async fn response_bytes_are_counted(kind: Kind) {
    let up = sized_upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &format!("http://{up}"), "") + &byte_limit("");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    // 400 bytes each: a request limit of 1000 would admit them all; this one admits while
    // bytes are left (the third, with 200 left, is admitted and clamps the count at 1000).
    for path in ["/api/len/400", "/api/chunked/400", "/api/len/400"] {
        let res = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path} {kind:?}");
        assert!(
            h(&res, "ratelimit-policy")
                .starts_with("\"bytes\";q=1000;w=3600;qu=\"content-bytes\";pk="),
            "{:?}",
            res.headers()
        );
        assert_eq!(res.bytes().await.unwrap().len(), 400);
    }
    let res = c.get(gw.url("/api/len/1")).send().await.unwrap();
    assert_eq!(res.status(), 429, "{kind:?}");
    assert!(h(&res, "ratelimit-policy").contains("qu=\"content-bytes\""));
    // The window's end frees the bytes; a response without a body costs nothing.
    gw.advance(Duration::from_secs(3600)).await;
    for _ in 0..3 {
        let res = c.get(gw.url("/api/len/0")).send().await.unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = c.get(gw.url("/api/chunked/999")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.bytes().await.unwrap().len(), 999);
    // One byte left: admitted; then none.
    let res = c.get(gw.url("/api/len/5")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "x-ratelimit-remaining"), "0");
    res.bytes().await.unwrap();
    assert_eq!(
        c.get(gw.url("/api/len/0")).send().await.unwrap().status(),
        429
    );
    let m = gw.metrics().await;
    // Five responses with a body charged; the three without one cost nothing.
    assert_eq!(
        decisions(&m, "api", "bytes", "charged_after"),
        Some(5.0),
        "{m}"
    );
}

/// #38 "Bad input": a byte limit of 0 refuses every exchange that could carry a counted body
/// (every request but a `HEAD` for response bytes; a request with a body for request bytes),
/// before the upstream, with the RateLimit fields and `Retry-After`, charging the route's other
/// limits nothing; an exchange without a counted body passes, as if the limit were not there.
async fn a_byte_budget_of_zero_refuses_every_body(kind: Kind) {
    let up = sized_upstream().await;
    let env = store_env(kind);
    let zero = |name: &str, bytes: &str| {
        limit(&format!(
            "name = \"{name}\"\nalgorithm = \"token_bucket\"\nlimit = 0\nperiod = \"1h\"\nsubject = \"ip\"\nunit = \"bytes\"\nbytes = \"{bytes}\""
        ))
    };
    let requests = limit(
        "name = \"reqs\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1h\"\nsubject = \"ip\"",
    );
    let routes = route("down", "/down", &format!("http://{up}"), "")
        + &zero("none", "response")
        + &requests
        + &route("up", "/up", &format!("http://{up}"), "")
        + &zero("none", "request");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    for path in ["/down/len/10", "/down/len/0", "/down/chunked/5"] {
        let res = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(res.status(), 429, "{path} {kind:?}");
        assert_eq!(h(&res, "retry-after"), "3600", "{:?}", res.headers());
        let policy = h(&res, "ratelimit-policy");
        assert!(
            policy.contains("\"none\";q=0;w=3600;qu=\"content-bytes\""),
            "{policy}"
        );
        assert!(
            h(&res, "ratelimit").contains("\"none\";r=0"),
            "{:?}",
            res.headers()
        );
    }
    let res = c
        .post(gw.url("/down/len/0"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    // A HEAD's answer has no body: the budget has nothing to refuse.
    let res = c.head(gw.url("/down/len/10")).send().await.unwrap();
    assert_eq!(res.status(), 200, "{kind:?}");
    assert_eq!(h(&res, "content-length"), "10");
    // Request bytes: a request without a body passes, one with a body is refused.
    for (body, want) in [(None, 200), (Some(""), 200), (Some("abc"), 429)] {
        let mut req = c.post(gw.url("/up/len/7"));
        if let Some(b) = body {
            req = req.body(b);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), want, "{body:?} {kind:?}");
        if want == 200 {
            assert_eq!(res.bytes().await.unwrap().len(), 7);
        }
    }
    let res = c.get(gw.url("/up/len/3")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.bytes().await.unwrap().len(), 3);
    let m = gw.metrics().await;
    assert_eq!(decisions(&m, "down", "none", "limited"), Some(4.0), "{m}");
    assert_eq!(decisions(&m, "up", "none", "limited"), Some(1.0), "{m}");
    // The route's request limit was not asked for the refused requests: only the HEAD counted.
    assert_eq!(decisions(&m, "down", "reqs", "allowed"), Some(1.0), "{m}");
    assert_eq!(
        decisions(&m, "down", "reqs", "limited").unwrap_or(0.0),
        0.0,
        "{m}"
    );
    // Nothing was kept in the store for a budget of nothing: the window passing changes nothing.
    gw.advance(Duration::from_secs(7200)).await;
    let res = c.get(gw.url("/down/len/1")).send().await.unwrap();
    assert_eq!(res.status(), 429);
}

async fn request_bytes_are_counted(kind: Kind) {
    let up = sized_upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &byte_limit("bytes = \"request\"")
        + &limit("name = \"both\"\nalgorithm = \"token_bucket\"\nlimit = 3000\nperiod = \"1h\"\nsubject = \"ip\"\nunit = \"bytes\"\nbytes = \"both\"");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    // Uploads of 600 with answers of 100: the request limit (1000) admits two (600, then 1200
    // clamped to 1000); the both limit has counted 1400 of its 3000.
    for _ in 0..2 {
        let res = c
            .post(gw.url("/api/len/100"))
            .body(vec![b'u'; 600])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{kind:?}");
        res.bytes().await.unwrap();
    }
    let res = c
        .post(gw.url("/api/len/100"))
        .body(vec![b'u'; 10])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429, "{kind:?}");
    let policy = h(&res, "ratelimit-policy");
    assert!(
        policy.contains("\"bytes\";q=1000;w=3600;qu=\"content-bytes\""),
        "{policy}"
    );
    let remaining = h(&res, "ratelimit");
    assert!(remaining.contains("\"bytes\";r=0"), "{remaining}");
    // A new window: a download does not count against the request limit.
    gw.advance(Duration::from_secs(3600)).await;
    let res = c.get(gw.url("/api/len/100")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    res.bytes().await.unwrap();
    let res = c.get(gw.url("/api/len/100")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        h(&res, "x-ratelimit-remaining"),
        "999",
        "{:?}",
        res.headers()
    );
}

/// A route whose limits read the request body (`json:` subject) reads it before the limits
/// (the hyper front, both fronts): a body read whole then still counts as sent upstream.
async fn a_body_read_before_the_limits_counts(kind: Kind) {
    let up = sized_upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &limit("name = \"bytes\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"json:user\"\nunit = \"bytes\"\nbytes = \"request\"");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let body = format!("{{\"user\":\"ann\",\"pad\":\"{}\"}}", "p".repeat(577));
    assert_eq!(body.len(), 600);
    for want in [200, 200, 429] {
        let res = c
            .post(gw.url("/api/len/10"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{kind:?}");
        res.bytes().await.unwrap();
    }
}

async fn a_client_that_leaves_pays_what_it_was_sent(kind: Kind) {
    let up = sized_upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &limit("name = \"bytes\"\nalgorithm = \"fixed_window\"\nlimit = 1000000\nperiod = \"1h\"\nsubject = \"ip\"\nunit = \"bytes\"");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    // A raw client reads the head and the first bytes, then leaves.
    let mut s = TcpStream::connect(
        gw.url("/")
            .trim_start_matches("http://")
            .trim_end_matches('/'),
    )
    .await
    .unwrap();
    s.write_all(b"GET /api/stall/50000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 50_000 && Instant::now() < deadline {
        let mut b = [0u8; 16384];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:.200}");
    let head = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    // Every byte the upstream sent reached the client (the gateway holds nothing back).
    while got.len() - head < 50_000 {
        let mut b = [0u8; 16384];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        got.extend_from_slice(&b[..n]);
    }
    assert_eq!(got.len() - head, 50_000);
    drop(s);
    // Charged what was sent (not the 10 MB announced, not nothing): 1000000 - 50000 left,
    // less the byte the next request needs left.
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let res = c.get(gw.url("/api/len/0")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        let left = h(&res, "x-ratelimit-remaining");
        if left == "949999" {
            break;
        }
        assert!(
            left == "999999" && Instant::now() < deadline,
            "{kind:?}: {left}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// "10 GB a month per consumer", in small: a plan's byte limit counts each consumer's bytes
/// across the routes, on its calendar month.
async fn a_plan_has_a_bandwidth_quota_per_consumer(kind: Kind) {
    use tollgate::consumers::{hash_key, hex};
    let up = sized_upstream().await;
    let env = store_env(kind);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    let mut consumers = String::new();
    for (name, key) in [("acme", "acme-key"), ("globex", "globex-key")] {
        consumers.push_str(&format!(
            "[[consumer]]\nname = \"{name}\"\nplan = \"metered\"\nkey_sha256 = \"{}\"\n\n",
            hex(&hash_key(key.as_bytes()))
        ));
    }
    std::fs::write(&file, consumers).unwrap();
    let top = format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = \"{}\"\n\n[[plans]]\nname = \"metered\"\n[[plans.limits]]\nname = \"egress\"\nalgorithm = \"fixed_window\"\ncalendar = \"month\"\nlimit = 1500\nunit = \"bytes\"\n\n",
        file.display()
    ) + &route("a", "/a", &format!("http://{up}"), "consumers = true")
        + &route("b", "/b", &format!("http://{up}"), "consumers = true");
    let gw = gateway_on_clock(&config(&env.store, &top), T0);
    wait_ready(&gw).await;
    let c = client();
    let get = |path: &str, key: &str| c.get(gw.url(path)).header("x-api-key", key).send();
    for path in ["/a/len/700", "/b/chunked/700", "/a/len/700"] {
        let res = get(path, "acme-key").await.unwrap();
        assert_eq!(res.status(), 200, "{path} {kind:?}");
        res.bytes().await.unwrap();
    }
    let res = get("/b/len/1", "acme-key").await.unwrap();
    assert_eq!(res.status(), 429, "{kind:?}");
    assert!(
        h(&res, "ratelimit-policy").contains("\"egress\";q=1500;w=2592000;qu=\"content-bytes\"")
    );
    // Another consumer has its own bytes.
    let res = get("/b/len/700", "globex-key").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "x-ratelimit-remaining"), "1499");
}

#[test]
fn byte_limits_are_refused_where_they_cannot_count() {
    fn base_of(limit: &str) -> String {
        format!("[server]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n[[routes.limits]]\nname = \"l\"\n{limit}period = \"1s\"\nsubject = \"ip\"\n")
    }
    let base = base_of("limit = 10\n");
    for (extra, key) in [
        ("algorithm = \"concurrency\"\nunit = \"bytes\"", "unit"),
        ("algorithm = \"leaky_bucket\"\nunit = \"bytes\"", "unit"),
        ("algorithm = \"fixed_window\"\nbytes = \"request\"", "bytes"),
        (
            "algorithm = \"fixed_window\"\nunit = \"bytes\"\ncost_header = \"x-cost\"",
            "cost_header",
        ),
        (
            "algorithm = \"fixed_window\"\nunit = \"bytes\"\ncost_from = \"json:usage.total\"",
            "cost_from",
        ),
        (
            "algorithm = \"token_bucket\"\nunit = \"bytes\"\nsync = \"lease\"",
            "sync",
        ),
    ] {
        check(extra, key);
    }
    // A limit of 0 is a byte budget of nothing (below), never "unlimited"; on any other limit,
    // and with what needs a count, it is refused when loaded.
    let zero = |extra: &str| {
        tollgate::config::Config::parse(
            &format!(
                "{}algorithm = \"fixed_window\"\nlimit = 0\n{extra}",
                base_of("")
            ),
            std::path::Path::new("."),
        )
        .map_err(|e| e.to_string())
    };
    assert!(zero("unit = \"bytes\"\n").is_ok());
    assert!(zero("unit = \"bytes\"\nbytes = \"both\"\n").is_ok());
    for (extra, key) in [
        ("", "limit"),
        ("unit = \"requests\"\n", "limit"),
        ("unit = \"bytes\"\nmode = \"shadow\"\n", "mode"),
        (
            "unit = \"bytes\"\nban_after = 3\nban_for = \"1m\"\n",
            "ban_after",
        ),
    ] {
        let e = zero(extra).unwrap_err();
        assert!(
            e.contains(&format!("routes[0].limits[0].{key}")),
            "{extra}: {e}"
        );
    }
    fn check(extra: &str, key: &str) {
        let base = base_of("limit = 10\n");
        let e =
            tollgate::config::Config::parse(&format!("{base}{extra}\n"), std::path::Path::new("."))
                .unwrap_err()
                .to_string();
        assert!(
            e.contains(&format!("routes[0].limits[0].{key}")),
            "{extra}: {e}"
        );
    }
    for ok in [
        "algorithm = \"fixed_window\"\nunit = \"bytes\"\nbytes = \"both\"",
        "algorithm = \"gcra\"\nunit = \"bytes\"\ncount_status = [\"2xx\"]",
        "algorithm = \"sliding_window\"\nunit = \"requests\"",
    ] {
        tollgate::config::Config::parse(&format!("{base}{ok}\n"), std::path::Path::new("."))
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}
