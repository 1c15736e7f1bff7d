//! Limits that look at the response (issue #15): `count_status` (failed-login limiting),
//! `cost_header` (the cost the upstream reports, with the overshoot bound) and
//! `algorithm = "concurrency"` (requests in flight, released on every path), on every store.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::*;

/// What the scripted upstream saw.
#[derive(Default)]
struct Counts {
    active: AtomicUsize,
    peak: AtomicUsize,
    hits: AtomicUsize,
    /// Requests waiting at the `/wave/N/…` barrier.
    wave: Mutex<usize>,
    /// `/wait`, `/stall`, `/cstall` connections the gateway closed before the upstream had
    /// answered in full.
    gone: AtomicUsize,
}

/// A raw HTTP/1.1 upstream scripted by path (one request per connection):
/// - `/login/ok` → 200, `/login/bad` → 401
/// - `/tokens/V` → 200 with `X-Tokens-Used: V` (`none`: no header; `junk`: `abc`; `neg`: `-5`;
///   `two`: two headers of 400; `huge`: 23 digits)
/// - `/hold/MS` → 200 after MS milliseconds (counting requests in flight and their peak)
/// - `/wave/N/V` → waits until N requests are at the barrier (at most 3 s), then like `/tokens/V`
/// - `/die` → closes the connection without an answer (the gateway answers 502)
/// - `/wait/MS` → 200 after MS milliseconds, or nothing once the gateway closes the connection
///   (counted in `gone`)
/// - `/stall/MS` (`Content-Length: 10`), `/cstall/MS` (chunked) → the head and 5 bytes of the
///   body, then the rest after MS milliseconds, or nothing once the gateway closes (`gone`)
/// - a WebSocket upgrade → 101, then echoes bytes
async fn scripted() -> (SocketAddr, Arc<Counts>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve_one(s, c.clone()));
        }
    });
    (addr, counts)
}

async fn serve_one(mut s: TcpStream, c: Arc<Counts>) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    c.hits.fetch_add(1, Ordering::SeqCst);
    if head.contains("upgrade: websocket") {
        let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n").await;
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        return;
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut status = "200 OK";
    let mut extra = String::new();
    let tokens = |v: &str| match v {
        "none" => String::new(),
        "junk" => "X-Tokens-Used: abc\r\n".into(),
        "neg" => "X-Tokens-Used: -5\r\n".into(),
        "two" => "X-Tokens-Used: 400\r\nX-Tokens-Used: 400\r\n".into(),
        "huge" => "X-Tokens-Used: 99999999999999999999999\r\n".into(),
        n => format!("X-Tokens-Used: {n}\r\n"),
    };
    match parts.as_slice() {
        [.., "login", "bad"] => status = "401 Unauthorized",
        [.., "tokens", v] => extra = tokens(v),
        [.., "hold", ms] => {
            let now = c.active.fetch_add(1, Ordering::SeqCst) + 1;
            c.peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(1000))).await;
            c.active.fetch_sub(1, Ordering::SeqCst);
        }
        [.., "wave", n, v] => {
            let n: usize = n.parse().unwrap_or(1);
            *c.wave.lock().unwrap() += 1;
            let deadline = Instant::now() + Duration::from_secs(3);
            while *c.wave.lock().unwrap() < n && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            extra = tokens(v);
        }
        [.., "die"] => return,
        [.., kind @ ("wait" | "stall" | "cstall"), ms] => {
            let (first, rest): (&[u8], &[u8]) = match *kind {
                "wait" => (b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
                "stall" => (
                    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345",
                    b"67890",
                ),
                _ => (
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n12345\r\n",
                    b"5\r\n67890\r\n0\r\n\r\n",
                ),
            };
            let _ = s.write_all(first).await;
            let mut sink = [0u8; 64];
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(1000))) => {
                    let _ = s.write_all(rest).await;
                }
                r = s.read(&mut sink) => if matches!(r, Ok(0) | Err(_)) {
                    c.gone.fetch_add(1, Ordering::SeqCst);
                },
            }
            return;
        }
        _ => {}
    }
    let res =
        format!("HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n{extra}\r\nok");
    let _ = s.write_all(res.as_bytes()).await;
}

async fn get(c: &reqwest::Client, url: &str, key: &str) -> reqwest::Response {
    c.get(url).header("X-Api-Key", key).send().await.unwrap()
}

/// Waits until `url` is answered 200 (a released slot), at most `within`.
async fn admitted_within(c: &reqwest::Client, url: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = c.get(url).send().await {
            // Done when its body is read: a slot is held until the body has been sent.
            if r.status() == reqwest::StatusCode::OK && r.bytes().await.is_ok() {
                return true;
            }
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_every_store_and_cluster!(
    failed_logins_count_only_the_failures,
    the_upstream_reports_the_cost,
    concurrent_requests_overshoot_no_more_than_documented,
    at_most_n_requests_in_flight,
    a_slot_is_released_on_every_path,
    a_client_that_leaves_mid_exchange_frees_its_slot_and_upstream_at_once,
    a_client_that_leaves_before_the_head_is_charged,
);

async fn failed_logins_count_only_the_failures(kind: Kind) {
    let (up, _) = scripted().await;
    let env = store_env(kind);
    let routes = route("login", "/login", &format!("http://{up}"), "")
        + &limit("name = \"failed-logins\"\nalgorithm = \"sliding_window\"\nlimit = 5\nperiod = \"15m\"\nsubject = \"ip\"\ncount_status = [\"401\", \"403\"]");
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    for i in 0..20 {
        let r = get(&c, &gw.url("/login/ok"), "").await;
        assert_eq!(r.status(), 200, "successful login {i} is never limited");
    }
    for i in 0..5 {
        let r = get(&c, &gw.url("/login/bad"), "").await;
        assert_eq!(r.status(), 401, "failed login {i} reaches the upstream");
    }
    let r = get(&c, &gw.url("/login/bad"), "").await;
    assert_eq!(r.status(), 429, "the 6th failed login within the period");
    let r = get(&c, &gw.url("/login/ok"), "").await;
    assert_eq!(r.status(), 429, "and a correct login after it");
    assert!(r.headers().contains_key("retry-after"));
    let m = gw.metrics().await;
    assert_eq!(
        decisions(&m, "login", "failed-logins", "charged_after"),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        decisions(&m, "login", "failed-logins", "limited"),
        Some(2.0)
    );
}

async fn the_upstream_reports_the_cost(kind: Kind) {
    let (up, _) = scripted().await;
    let env = store_env(kind);
    let u = format!("http://{up}");
    let routes = route("llm", "/llm", &u, "")
        + &limit("name = \"tokens\"\nalgorithm = \"token_bucket\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"\ncost_header = \"X-Tokens-Used\"\nstrip_cost_header = false")
        + &route("hidden", "/hidden", &u, "")
        + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"\ncost = 100\ncost_header = \"X-Tokens-Used\"\nstrip_cost_header = true");
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();

    // 400 + 300 + 300 of a 1000 budget: the 4th request is refused.
    for (i, n) in ["400", "300", "300"].iter().enumerate() {
        let r = get(&c, &gw.url(&format!("/llm/tokens/{n}")), "alice").await;
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.headers()["x-tokens-used"], *n, "passed on to the client");
    }
    let r = get(&c, &gw.url("/llm/tokens/1"), "alice").await;
    assert_eq!(r.status(), 429);

    // A missing or malformed header charges `cost` (100): ten such answers spend 1000.
    for (i, v) in [
        "none", "junk", "neg", "two", "none", "none", "junk", "none", "none", "none",
    ]
    .iter()
    .enumerate()
    {
        let r = get(&c, &gw.url(&format!("/hidden/tokens/{v}")), "bob").await;
        assert_eq!(r.status(), 200, "request {i} ({v})");
        assert!(
            !r.headers().contains_key("x-tokens-used"),
            "strip_cost_header removes it"
        );
        let remaining: u64 = r.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(remaining, 900 - 100 * i as u64, "charged `cost` each");
    }
    assert_eq!(
        get(&c, &gw.url("/hidden/tokens/none"), "bob")
            .await
            .status(),
        429
    );

    // A value beyond the capacity is clamped to it: one answer spends the whole budget.
    assert_eq!(
        get(&c, &gw.url("/llm/tokens/huge"), "carol").await.status(),
        200
    );
    assert_eq!(
        get(&c, &gw.url("/llm/tokens/1"), "carol").await.status(),
        429
    );
    // Logged (stderr is read by a thread: give it a moment).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw.logs().contains("clamped") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gw.logs().contains("clamped"), "{}", gw.logs());
}

/// N requests admitted before any of them is charged overshoot the budget by at most
/// N × min(charge, capacity) (README, "Limits that look at the response").
async fn concurrent_requests_overshoot_no_more_than_documented(kind: Kind) {
    const N: usize = 5;
    const EACH: u64 = 300;
    let (up, counts) = scripted().await;
    let env = store_env(kind);
    let routes = route("llm", "/llm", &format!("http://{up}"), "")
        + &limit("name = \"tokens\"\nalgorithm = \"token_bucket\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"\ncost_header = \"X-Tokens-Used\"");
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    // Nearly spent: 100 of 1000 left.
    assert_eq!(get(&c, &gw.url("/llm/tokens/900"), "k").await.status(), 200);
    let url = gw.url(&format!("/llm/wave/{N}/{EACH}"));
    let wave: Vec<_> = (0..N)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { get(&c, &url, "k").await.status().as_u16() })
        })
        .collect();
    let mut admitted = 0u64;
    for w in wave {
        if w.await.unwrap() == 200 {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, N as u64,
        "all were evaluated before any was charged"
    );
    assert_eq!(*counts.wave.lock().unwrap(), N);
    let charged = 900 + admitted * EACH;
    let overshoot = charged.saturating_sub(1000);
    assert!(
        overshoot <= N as u64 * EACH,
        "overshoot {overshoot} > N × charge"
    );
    // The overshoot stops there: the limit is spent, and the next wave is refused whole.
    for _ in 0..N {
        assert_eq!(get(&c, &gw.url("/llm/tokens/1"), "k").await.status(), 429);
    }
    assert_eq!(counts.hits.load(Ordering::SeqCst), 1 + N);
}

async fn at_most_n_requests_in_flight(kind: Kind) {
    let (up, counts) = scripted().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &limit("name = \"in-flight\"\nalgorithm = \"concurrency\"\nlimit = 4\nperiod = \"5m\"\nsubject = \"ip\"");
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    let slow: Vec<_> = (0..10)
        .map(|_| {
            let (c, url) = (c.clone(), gw.url("/api/hold/800"));
            tokio::spawn(async move {
                let r = c.get(url).send().await.unwrap();
                let h = |n: &str| {
                    r.headers()
                        .get(n)
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default()
                };
                let out = (r.status().as_u16(), h("retry-after"), h("ratelimit-policy"));
                let _ = r.bytes().await;
                out
            })
        })
        .collect();
    // While they are held: the gauge counts the 4 slots.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_in_flight{route=\"api\",limit=\"in-flight\"}"
        ),
        Some(4.0),
        "{m}"
    );
    let mut ok = 0;
    for s in slow {
        let (status, retry, policy) = s.await.unwrap();
        match status {
            200 => ok += 1,
            429 => assert_eq!(retry, "1"),
            other => panic!("status {other}"),
        }
        assert!(
            policy.contains("\"in-flight\";q=4;qu=\"concurrent-requests\""),
            "{policy}"
        );
    }
    assert_eq!(ok, 4, "exactly 4 forwarded");
    assert_eq!(counts.peak.load(Ordering::SeqCst), 4, "4 at a time");
    // Completed requests released their slots: 4 more fit at once.
    let again: Vec<_> = (0..4)
        .map(|_| {
            let (c, url) = (c.clone(), gw.url("/api/hold/300"));
            tokio::spawn(async move {
                let r = c.get(url).send().await.unwrap();
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                status
            })
        })
        .collect();
    for a in again {
        assert_eq!(a.await.unwrap(), 200);
    }
    // A slot is released when its response body has been sent, and on Redis the release is
    // one more call: the gauge gets there just after the client has the whole response.
    let series = "tollgate_ratelimit_in_flight{route=\"api\",limit=\"in-flight\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut held = metric(&gw.metrics().await, series);
    while held != Some(0.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = metric(&gw.metrics().await, series);
    }
    assert_eq!(
        held,
        Some(0.0),
        "slots still held 5 s after the last response"
    );
}

const WS_REQUEST: &[u8] = b"GET /ws/chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

/// One slot (limit 1): each way a request can end must give it back.
async fn a_slot_is_released_on_every_path(kind: Kind) {
    let (up, _) = scripted().await;
    let env = store_env(kind);
    let u = format!("http://{up}");
    let one = "name = \"one\"\nalgorithm = \"concurrency\"\nlimit = 1\nperiod = \"5m\"\nsubject = \"global\"";
    let routes = route("api", "/api", &u, "timeout = \"300ms\"")
        + &limit(one)
        + &route("ws", "/ws", &u, "")
        + &limit(one);
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    let free = gw.url("/api/login/ok");
    let released = Duration::from_secs(2);

    // A client that asks again as soon as it has the whole answer finds its slot free.
    for i in 0..30 {
        let r = c.get(&free).send().await.unwrap();
        assert_eq!(r.status(), 200, "sequential request {i}");
        r.bytes().await.unwrap();
    }

    // A HEAD (no body) gives its slot back too.
    for _ in 0..3 {
        let r = c.head(&free).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(admitted_within(&c, &free, released).await, "after a HEAD");
    }

    // The slot is held while a request is in flight.
    let held = {
        let (c, url) = (c.clone(), gw.url("/api/hold/250"));
        tokio::spawn(async move { c.get(url).send().await.unwrap().status().as_u16() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(c.get(&free).send().await.unwrap().status(), 429, "held");
    assert_eq!(held.await.unwrap(), 200);
    assert!(
        admitted_within(&c, &free, released).await,
        "after completion"
    );

    // The client goes away before the answer.
    let gone = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    assert!(gone.get(gw.url("/api/hold/250")).send().await.is_err());
    assert!(
        admitted_within(&c, &free, released).await,
        "after a disconnect"
    );

    // The upstream times out (route timeout 300ms) → 504.
    let r = c.get(gw.url("/api/hold/2000")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    assert!(
        admitted_within(&c, &free, released).await,
        "after a timeout"
    );

    // The upstream breaks the connection → 502.
    let r = c.get(gw.url("/api/die")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert!(admitted_within(&c, &free, released).await, "after a 502");

    // A WebSocket tunnel holds its slot until it closes.
    if skip_on_h3(
        "the WebSocket part: HTTP/3 has no Upgrade (RFC 9220's extended CONNECT is not served)",
    ) {
        return;
    }
    let ws_free = gw.url("/ws/login/ok");
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(WS_REQUEST).await.unwrap();
    let mut head = vec![0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        c.get(&ws_free).send().await.unwrap().status(),
        429,
        "tunnel open"
    );
    drop(s);
    assert!(
        admitted_within(&c, &ws_free, released).await,
        "after the tunnel closed"
    );

    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_in_flight{route=\"api\",limit=\"one\"}"
        ),
        Some(0.0),
        "{m}"
    );
}

/// A client that closes its connection while the gateway waits on the upstream — for the
/// response head, or mid-body while the upstream is silent — gives its slot back and its
/// upstream connection is closed at once, not when the upstream writes again (#34 item 10).
async fn a_client_that_leaves_mid_exchange_frees_its_slot_and_upstream_at_once(kind: Kind) {
    let (up, counts) = scripted().await;
    let env = store_env(kind);
    let one = "name = \"one\"\nalgorithm = \"concurrency\"\nlimit = 1\nperiod = \"5m\"\nsubject = \"global\"";
    let routes = route("api", "/api", &format!("http://{up}"), "") + &limit(one);
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    let free = gw.url("/api/login/ok");
    // The upstream holds each answer 8 s: "at once" is well inside that.
    for (i, (path, seen)) in [
        ("/api/wait/8000", &b""[..]),
        ("/api/stall/8000", &b"12345"[..]),
        ("/api/cstall/8000", &b"12345"[..]),
    ]
    .into_iter()
    .enumerate()
    {
        let hits = counts.hits.load(Ordering::SeqCst);
        let mut s = TcpStream::connect(gw.http_addr()).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        // Until the request is at the upstream and what it sent so far reached the client.
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let deadline = Instant::now() + Duration::from_secs(5);
        while counts.hits.load(Ordering::SeqCst) == hits
            || !(seen.is_empty() || got.windows(seen.len()).any(|w| w == seen))
        {
            assert!(
                Instant::now() < deadline,
                "{path}: {}",
                String::from_utf8_lossy(&got)
            );
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await
            {
                assert!(n > 0, "{path}: closed early");
                got.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(
            c.get(&free).send().await.unwrap().status(),
            429,
            "{path}: the slot is held while the exchange runs"
        );
        drop(s);
        let t0 = Instant::now();
        assert!(
            admitted_within(&c, &free, Duration::from_millis(1500)).await,
            "{path}: the slot still held {:?} after the client left",
            t0.elapsed()
        );
        let deadline = Instant::now() + Duration::from_millis(1500);
        while counts.gone.load(Ordering::SeqCst) <= i {
            assert!(
                Instant::now() < deadline,
                "{path}: the upstream connection still open after the client left"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A gateway killed with requests in flight leaks its Redis leases for `period` at most: on
/// injected time (both gateways' clocks at T0, the lease taken there), the slot is still held a
/// microsecond before `period` ends and free at its end.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_gateways_leases_expire_after_the_period() {
    let (up, counts) = scripted().await;
    let env = store_env(Kind::Redis);
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &limit("name = \"one\"\nalgorithm = \"concurrency\"\nlimit = 1\nperiod = \"2s\"\nsubject = \"global\"");
    let cfg = config(&env.store, &routes);
    let mut a = gateway_on_clock(&cfg, T0);
    let b = gateway_on_clock(&cfg, T0);
    wait_ready(&a).await;
    wait_ready(&b).await;
    let c = client();
    let held = {
        let (c, url) = (c.clone(), a.url("/api/hold/10000"));
        tokio::spawn(async move { c.get(url).send().await })
    };
    // Until the request has reached the upstream (real I/O, not a clock wait).
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts.hits.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the held request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let status = || async { c.get(b.url("/api/login/ok")).send().await.unwrap().status() };
    assert_eq!(status().await, 429, "the dead gateway's lease still counts");
    b.set_clock(T0 + 2_000_000 - 1).await;
    assert_eq!(status().await, 429, "not freed before the lease's period");
    b.set_clock(T0 + 2_000_000).await;
    assert_eq!(
        status().await,
        200,
        "freed at the end of the lease's period"
    );
    // (Checked last: over HTTP/3 the client learns of the death by its idle timeout, seconds
    // in which the lease's key would expire in Redis.)
    assert!(
        held.await.unwrap().is_err(),
        "the killed gateway answers nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// The differential test: the in-process store and Redis charge after the response and hold
// slots identically.
// ---------------------------------------------------------------------------------------------

mod differential {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use tollgate::config::{
        Algorithm, Backend, ChargeAfter, LimitConfig, Mode, OnError, OnMissing, StoreConfig,
        SubjectSpec,
    };
    use tollgate::limiter::adjust::{check, Adjust};
    use tollgate::limiter::{Check, CompiledLimit, Op, SubjectDigest};
    use tollgate::store::{AnyClock, AnyStore, ManualClock, MemoryStore, Store};

    use super::support::{redis, Lcg};

    fn cfg(name: &str, algorithm: Algorithm, limit: u64, burst: u64, after: bool) -> LimitConfig {
        LimitConfig {
            name: name.into(),
            algorithm,
            limit,
            period: Duration::from_millis(500),
            subject: SubjectSpec::Global,
            burst,
            cost: 1,
            mode: Mode::Enforce,
            on_missing: OnMissing::Ip,
            calendar: None,
            after: after.then_some(ChargeAfter {
                statuses: None,
                cost_header: None,
                strip_cost_header: false,
                cost_from: Vec::new(),
                reserve: None,
                bytes: None,
            }),
            fleet: Default::default(),
            prefixes: Default::default(),
            exempt: Default::default(),
            refusal: None,
            limit_from: None,
            ban: None,
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn memory_and_redis_charge_after_and_hold_slots_identically() {
        let r = redis();
        let mut now: u64 = 1_700_000_000_123_456;
        let clock = ManualClock::new(now);
        let store_cfg = StoreConfig {
            backend: Backend::Redis,
            urls: vec![r.url()],
            timeout: Duration::from_secs(2),
            on_error: OnError::Deny,
            key_prefix: "diff".into(),
            max_subjects: 100_000,
            deny_cache: false,
            sentinel: None,
        };
        let store = AnyStore::build(&store_cfg, AnyClock::Manual(clock.clone()), 2);
        let memory = MemoryStore::with_clock(100_000, AnyClock::Manual(clock.clone()));
        let route: Arc<str> = Arc::from("diff");
        let limits: Vec<CompiledLimit> = [
            cfg("fw", Algorithm::FixedWindow, 20, 0, true),
            cfg("sw", Algorithm::SlidingWindow, 20, 0, true),
            cfg("sl", Algorithm::SlidingLog, 20, 0, true),
            cfg("tb", Algorithm::TokenBucket, 20, 20, true),
            cfg("gcra", Algorithm::Gcra, 20, 20, true),
            cfg("cc", Algorithm::Concurrency, 3, 0, false),
        ]
        .iter()
        .map(|c| CompiledLimit::compile(&route, c))
        .collect();
        let subject = SubjectDigest::of(b'g', b"");
        // Connected: a first decision succeeds.
        let deadline = Instant::now() + Duration::from_secs(10);
        let probe = [Check {
            limit: &limits[0],
            subject,
            op: Op::Decide,
        }];
        while store
            .peek(&probe, tollgate::worker::WorkerId::NONE)
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "Redis never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut rng = Lcg(7);
        let mut held: Vec<(usize, u64)> = Vec::new();
        let (mut denied, mut compared, mut lease) = (0, 0, 0u64);
        let mut granted = 0;
        let (sim_start, wall_start) = (now, Instant::now());
        for step in 0..600 {
            now += rng.next(8_000);
            let wall = u64::try_from(wall_start.elapsed().as_micros()).unwrap();
            now = now.max(sim_start + wall);
            clock.set(now);
            let i = rng.next(limits.len() as u64) as usize;
            let l = &limits[i];
            let is_cc = l.policy.algorithm == Algorithm::Concurrency;
            // Support grants now and then (beyond the quota too): later charges after the
            // response meet states holding credit.
            if rng.next(8) == 0 && check(l.policy.algorithm, Adjust::Grant(1)).is_ok() {
                let g = Adjust::Grant(1 + rng.next(l.policy.quota()));
                let c = Check {
                    limit: l,
                    subject,
                    op: Op::Decide,
                };
                memory.adjust_now(&c, g, now);
                store.adjust(&c, g).await.unwrap();
                granted += 1;
            }
            if is_cc && !held.is_empty() && rng.next(2) == 0 {
                let (j, id) = held.remove(rng.next(held.len() as u64) as usize);
                let c = [Check {
                    limit: &limits[j],
                    subject,
                    op: Op::Release(id),
                }];
                memory
                    .settle(&c, tollgate::worker::WorkerId::NONE)
                    .await
                    .unwrap();
                store
                    .settle(&c, tollgate::worker::WorkerId::NONE)
                    .await
                    .unwrap();
                continue;
            }
            lease += 1;
            let op = if is_cc {
                Op::Acquire(lease)
            } else {
                Op::Decide
            };
            let c = [Check {
                limit: l,
                subject,
                op,
            }];
            let m = memory
                .decide(&c, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap();
            let d = store
                .decide(&c, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap();
            assert_eq!(m, d, "step {step}: {} at {now}", l.name);
            compared += 1;
            if !m[0].allowed {
                denied += 1;
                continue;
            }
            if is_cc {
                held.push((i, lease));
            } else {
                // The response's cost: 0 (free), small, or beyond the capacity (clamped).
                let units = [0, 1, 3, 7, 50][rng.next(5) as usize];
                let c = [Check {
                    limit: l,
                    subject,
                    op: Op::Charge(units),
                }];
                memory
                    .settle(&c, tollgate::worker::WorkerId::NONE)
                    .await
                    .unwrap();
                store
                    .settle(&c, tollgate::worker::WorkerId::NONE)
                    .await
                    .unwrap();
            }
        }
        assert!(compared > 400);
        assert!(granted > 30, "{granted} grants");
        assert!(
            denied > 50 && denied < compared - 50,
            "both outcomes: {denied}/{compared}"
        );
    }
}

/// A drained gateway gives back the slots of the requests it finished: no lease is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_drain_releases_the_slots_of_its_last_requests() {
    let (up, _) = scripted().await;
    let env = store_env(Kind::Redis);
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &limit("name = \"one\"\nalgorithm = \"concurrency\"\nlimit = 4\nperiod = \"5m\"\nsubject = \"global\"");
    let mut gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    let held: Vec<_> = (0..3)
        .map(|_| {
            let (c, url) = (c.clone(), gw.url("/api/hold/500"));
            tokio::spawn(async move { c.get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let redis = env._redis.as_ref().unwrap();
    let leases = |r: &Redis| -> usize {
        r.cli(&["--scan", "--pattern", "*:cc"])
            .lines()
            .map(|k| r.cli(&["ZCARD", k]).trim().parse::<usize>().unwrap_or(0))
            .sum()
    };
    assert_eq!(leases(redis), 3, "three leases while in flight");
    gw.signal(Signal::TERM);
    for h in held {
        assert_eq!(h.await.unwrap(), 200, "drained requests finish");
    }
    let status = gw.child.wait().unwrap();
    assert!(status.success());
    assert_eq!(leases(redis), 0, "every lease released before exit");
}

/// The in-process store's cap never evicts a slot in use: its release would find nothing and the
/// subject would get more than its slots.
#[test]
fn a_full_memory_store_keeps_slots_in_use() {
    use tollgate::config::{Algorithm, LimitConfig, Mode, OnMissing, SubjectSpec};
    use tollgate::limiter::{Check, CompiledLimit, Op, SubjectDigest};
    use tollgate::store::MemoryStore;
    let cfg = |name: &str, algorithm, limit| LimitConfig {
        name: name.into(),
        algorithm,
        limit,
        period: Duration::from_secs(60),
        subject: SubjectSpec::Ip,
        burst: 0,
        cost: 1,
        mode: Mode::Enforce,
        on_missing: OnMissing::Ip,
        after: None,
        fleet: Default::default(),
        calendar: None,
        prefixes: Default::default(),
        exempt: Default::default(),
        refusal: None,
        limit_from: None,
        ban: None,
    };
    let route: Arc<str> = Arc::from("r");
    let cc = CompiledLimit::compile(&route, &cfg("cc", Algorithm::Concurrency, 1));
    let fw = CompiledLimit::compile(&route, &cfg("fw", Algorithm::FixedWindow, 100));
    let store = MemoryStore::new(8);
    let now = 1_700_000_000_000_000;
    let me = SubjectDigest::of(b'i', b"me");
    let take = |lease| {
        store.decide_now(
            &[Check {
                limit: &cc,
                subject: me,
                op: Op::Acquire(lease),
            }],
            now,
        )[0]
        .allowed
    };
    assert!(take(1));
    for i in 0..1000u32 {
        let s = SubjectDigest::of(b'i', &i.to_le_bytes());
        let c = [Check {
            limit: &fw,
            subject: s,
            op: Op::Decide,
        }];
        assert!(store.decide_now(&c, now)[0].allowed);
    }
    assert!(!take(2), "the slot in use survived 1000 new subjects");
    store.settle_now(
        &[Check {
            limit: &cc,
            subject: me,
            op: Op::Release(1),
        }],
        now,
    );
    assert!(take(3), "released");
}

/// Hardening III #3: once a request has been sent upstream, a client that leaves before the
/// response head is charged the limit's `cost` (before the fix it was charged nothing, so an
/// LLM-style upstream could be made to do unlimited metered work). The upstream's own failure
/// (a 502) is still never charged.
async fn a_client_that_leaves_before_the_head_is_charged(kind: Kind) {
    let (up, counts) = scripted().await;
    let env = store_env(kind);
    let routes = route("llm", "/llm", &format!("http://{up}"), "")
        + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"\ncost_header = \"X-Tokens-Used\"");
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    let c = client();
    // Failures of the upstream charge nothing: both budgets' units stay.
    for _ in 0..3 {
        assert_eq!(get(&c, &gw.url("/llm/die"), "alice").await.status(), 502);
    }
    // Two abandoned exchanges: each reaches the upstream, and the client leaves after 200 ms.
    for i in 0..2 {
        let hits = counts.hits.load(Ordering::SeqCst);
        let left = c
            .get(gw.url("/llm/hold/2000"))
            .header("X-Api-Key", "alice")
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        assert!(left.is_err(), "abandoned request {i} was answered");
        assert_eq!(
            counts.hits.load(Ordering::SeqCst),
            hits + 1,
            "request {i} reached the upstream"
        );
    }
    // The two `cost`s spend the budget of 2 (a request reporting 0 tokens is not charged, so
    // polling does not spend it).
    let deadline = Instant::now() + Duration::from_secs(3);
    let status = loop {
        let s = get(&c, &gw.url("/llm/tokens/0"), "alice").await.status();
        if s == 429 || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 429, "abandoned exchanges were not charged");
    // Another caller is untouched.
    assert_eq!(get(&c, &gw.url("/llm/tokens/0"), "bob").await.status(), 200);
}

/// Hardening III #4: a release that fails while Redis is unreachable is retried once it is back
/// (before the fix the slot stayed taken for the whole `period`, five minutes here), and
/// `tollgate_ratelimit_in_flight` counts the slot until its release is made (before: 0 at once).
/// Redis only: the in-process store cannot be partitioned.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_lost_in_a_redis_outage_is_retried() {
    let (up, _) = scripted().await;
    let r = redis();
    let gw = one_slot_on(&r, up);
    wait_ready(&gw).await;
    let c = client();
    let in_flight = |m: &str| {
        metric(
            m,
            "tollgate_ratelimit_in_flight{route=\"api\",limit=\"one\"}",
        )
    };

    // A request holds the slot; Redis freezes before its end, so its release fails.
    let held = {
        let (c, url) = (c.clone(), gw.url("/api/hold/700"));
        tokio::spawn(async move { c.get(url).send().await.unwrap().bytes().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.pause();
    held.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        in_flight(&gw.metrics().await),
        Some(1.0),
        "the slot is still held while its release has not been made"
    );
    r.resume();
    // Back: the release is retried and the slot is free again well within its 5-minute lease.
    assert!(
        admitted_within(&c, &gw.url("/api/login/ok"), Duration::from_secs(10)).await,
        "the slot stayed taken after Redis came back"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while in_flight(&gw.metrics().await) != Some(0.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = gw.metrics().await;
    assert_eq!(in_flight(&m), Some(0.0), "{m}");
}

/// A gateway on `r` (200 ms timeout, failing closed) with one global concurrency slot, held for
/// up to 5 minutes, on `/api` to `up`.
fn one_slot_on(r: &Redis, up: SocketAddr) -> Gateway {
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"\non_error = \"deny\"",
        r.url()
    );
    let routes = route("api", "/api", &format!("http://{up}"), "")
        + &limit("name = \"one\"\nalgorithm = \"concurrency\"\nlimit = 1\nperiod = \"5m\"\nsubject = \"global\"");
    gateway(&config(&store, &routes))
}

/// The pid of a private redis-server, from its `INFO` (to signal it without a `kill` binary).
fn redis_pid(r: &Redis) -> rustix::process::Pid {
    r.cli(&["INFO", "server"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .and_then(|v| v.parse().ok())
        .and_then(rustix::process::Pid::from_raw)
        .expect("redis-server's process_id in INFO")
}

/// Live concurrency leases in every `…:cc` key of `r`.
fn live_leases(r: &Redis) -> String {
    let script =
        "local t = redis.call('TIME') local now = string.format('%d', t[1] * 1000000 + t[2]) \
        local n = 0 for _, k in ipairs(redis.call('KEYS', '*:cc')) do \
        n = n + redis.call('ZCOUNT', k, '(' .. now, '+inf') end return n";
    r.cli(&["EVAL", script, "0"]).trim().to_owned()
}

/// A slot whose acquire failed at the gateway and ran in Redis all the same (the script ran, its
/// answer was lost: a timeout, a connection cut after the send) is released: before the fix the
/// lease held the slot for its whole `period` (five minutes here) although the request was
/// answered 503 — the chaos soak found such slots held once its driver had stopped. Redis only.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_taken_by_an_acquire_whose_answer_was_lost_is_released() {
    let (up, _) = scripted().await;
    let r = redis();
    let pid = redis_pid(&r);
    let gw = one_slot_on(&r, up);
    wait_ready(&gw).await;
    let c = client();
    // A request that takes and gives back the slot: Redis has the script loaded (a cold Redis
    // would answer the stale call below NOSCRIPT and run nothing).
    assert!(admitted_within(&c, &gw.url("/api/login/ok"), Duration::from_secs(5)).await);

    // Redis freezes: the acquire is sent, not answered within the timeout (503), and stays in
    // Redis's socket; thawed, Redis runs it and takes the slot for a request long gone.
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let res = c.get(gw.url("/api/login/ok")).send().await.unwrap();
    assert_eq!(res.status(), 503, "fail closed while Redis is frozen");
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();

    assert!(
        admitted_within(&c, &gw.url("/api/login/ok"), Duration::from_secs(10)).await,
        "the slot taken by the lost acquire stayed held (live leases: {})",
        live_leases(&r)
    );
    assert_eq!(live_leases(&r), "0");
    let deadline = Instant::now() + Duration::from_secs(3);
    let in_flight = |m: &str| {
        metric(
            m,
            "tollgate_ratelimit_in_flight{route=\"api\",limit=\"one\"}",
        )
    };
    while in_flight(&gw.metrics().await) != Some(0.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = gw.metrics().await;
    assert_eq!(in_flight(&m), Some(0.0), "{m}");
}
