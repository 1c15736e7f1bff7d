//! The two HTTP/1 fronts side by side: the same requests through a gateway on `http1 = "fast"`
//! and one on `http1 = "hyper"` must put the same bytes on the wire — toward the upstream
//! (header names in the client's case and order, the edits spliced in) and toward the client
//! (`Date` aside: the gateway's own answers carry the time of writing).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::*;

/// Where a message's head ends in `buf`, and how long its body is (`None`: chunked, ends at
/// the last chunk).
fn framing(buf: &[u8]) -> Option<(usize, Option<usize>)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        return Some((end, None));
    }
    let no_body = head.starts_with("http/1.1 204") || head.starts_with("http/1.1 304");
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    Some((end, Some(if no_body { 0 } else { len })))
}

/// The length of the first whole message in `buf`, if it is all there.
fn message_len(buf: &[u8]) -> Option<usize> {
    let (end, len) = framing(buf)?;
    match len {
        Some(n) => (buf.len() >= end + n).then_some(end + n),
        None => buf[end..]
            .windows(5)
            .position(|w| w == b"0\r\n\r\n")
            .map(|p| end + p + 5),
    }
}

/// A raw upstream: records every request's bytes as received (in order; the tests send one
/// request at a time) and answers by path, with a fixed `Date` so the answers are
/// comparable.
async fn raw_upstream() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    while let Some(n) = message_len(&buf) {
                        let req: Vec<u8> = buf.drain(..n).collect();
                        log.lock().unwrap().extend_from_slice(&req);
                        let line = String::from_utf8_lossy(&req[..req.len().min(64)]).into_owned();
                        let res: &[u8] = if line.contains(" /api/chunked") {
                            b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nX-Upstream-Case: Yes\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                        } else if line.contains(" /api/204") {
                            b"HTTP/1.1 204 No Content\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nX-Upstream-Case: Yes\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nContent-Type: text/plain\r\nX-Upstream-Case: Yes\r\nConnection: X-Up-Hop\r\nX-Up-Hop: secret\r\nKeep-Alive: timeout=5\r\nContent-Length: 3\r\n\r\nok\n"
                        };
                        if s.write_all(res).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Sends `requests` one at a time on one connection; returns the responses' bytes.
async fn exchange(addr: SocketAddr, requests: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    for req in requests {
        s.write_all(req).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let head_request = req.starts_with(b"HEAD ");
        let n = loop {
            let whole = if head_request {
                framing(&buf).map(|(end, _)| end)
            } else {
                message_len(&buf)
            };
            if let Some(n) = whole {
                break n;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let got = tokio::time::timeout(left, s.read(&mut chunk))
                .await
                .expect("no whole response in time")
                .unwrap();
            assert!(
                got > 0,
                "closed early after {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..got]);
        };
        out.push(buf.drain(..n).collect());
    }
    out
}

/// `bytes` without its `Date` lines.
fn dateless(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\r\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn both_fronts_send_the_same_bytes_both_ways() {
    let (up, seen) = raw_upstream().await;
    let url = format!("http://{up}");
    // GCRA, not a fixed window: a window's Retry-After counts down to its end on the wall clock,
    // so the two runs could straddle a second (CI saw 2040 against 2041); GCRA's is the period
    // less the few milliseconds between the two requests of one run, rounded up: 3600 in both.
    let routes = route("api", "/api", &url, "")
        + &route("lim", "/lim", &url, "rate_limit_headers = false")
        + &limit("name = \"one\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"global\"");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let requests: Vec<&[u8]> = vec![
        b"GET /api/a?x=1&y=%20 HTTP/1.1\r\nHost: Gw.Example\r\nUser-Agent: t/1\r\nX-Mixed-Case: A\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1\r\nX-Request-Id: t-1\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nTE: trailers\r\nX_Under: 1\r\n\r\n",
        b"POST /api/upload HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-Request-Id: t-2\r\n\r\nhello",
        b"GET /api/chunked HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-3\r\n\r\n",
        b"GET /api/204 HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-4\r\n\r\n",
        b"GET /nowhere HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-5\r\n\r\n",
        b"GET /lim/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-6\r\n\r\n",
        b"GET /lim/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-7\r\n\r\n",
        b"HEAD /api/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-8\r\n\r\n",
        b"POST /api/chunked-upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nX-Request-Id: t-9\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET /api/last HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-10\r\nConnection: close\r\n\r\n",
    ];
    let mut runs = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(&cfg, front));
        seen.lock().unwrap().clear();
        let answers = exchange(gw.proxy, &requests).await;
        let upstream = std::mem::take(&mut *seen.lock().unwrap());
        runs.push((front, answers, upstream));
    }
    let (_, hyper_answers, hyper_up) = &runs[0];
    let (_, fast_answers, fast_up) = &runs[1];
    assert_eq!(
        String::from_utf8_lossy(fast_up),
        String::from_utf8_lossy(hyper_up),
        "the upstream received different bytes"
    );
    assert!(
        String::from_utf8_lossy(fast_up).contains("X-Mixed-Case: A\r\n"),
        "header names keep the client's case"
    );
    for (i, (f, h)) in fast_answers.iter().zip(hyper_answers).enumerate() {
        assert_eq!(dateless(f), dateless(h), "response {} differs", i + 1);
    }
    let statuses: Vec<String> = fast_answers
        .iter()
        .map(|a| String::from_utf8_lossy(&a[..12]).into_owned())
        .collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 204",
            "HTTP/1.1 404",
            "HTTP/1.1 200",
            "HTTP/1.1 429",
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 200"
        ]
    );
}

/// What only hyper answers — a target `httparse` takes and the URI parser refuses, a framing
/// the fast front does not serve, an upgrade to h2c — gets the same bytes from both fronts (the
/// fast front hands the connection to hyper with the bytes it read).
#[tokio::test(flavor = "multi_thread")]
async fn what_the_fast_front_hands_to_hyper_is_answered_alike() {
    let (up, _seen) = raw_upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &route("api", "/api", &format!("http://{up}"), ""),
    );
    let requests: [&[u8]; 4] = [
        b"GET /api/a>b HTTP/1.1\r\nHost: gw\r\nX-Request-Id: r-1\r\n\r\n",
        b"POST /api/x HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nX-Request-Id: r-2\r\n\r\n0\r\n\r\n",
        b"GET /api/x HTTP/1.1\r\nHost: gw\r\nX-A: a\r\n b\r\nX-Request-Id: r-3\r\n\r\n",
        b"GET /api/x HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nX-Request-Id: r-4\r\nConnection: close\r\n\r\n",
    ];
    let mut answers: Vec<Vec<String>> = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(&cfg, front));
        let mut got = Vec::new();
        for req in requests {
            let mut s = TcpStream::connect(gw.proxy).await.unwrap();
            s.write_all(req).await.unwrap();
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            got.push(dateless(&out));
        }
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
    let statuses: Vec<&str> = answers[1]
        .iter()
        .map(|a| a.get(..12).unwrap_or(a))
        .collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 400",
            "HTTP/1.1 400",
            "HTTP/1.1 400",
            "HTTP/1.1 200"
        ]
    );
}

/// A raw upstream that parses requests the way a plain HTTP/1.1 server does (its own framing:
/// a request without `Content-Length` has no body) and answers each with its request line
/// as the body; it records every request line it served.
async fn echo_line_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    while let Some(n) = message_len(&buf) {
                        let req: Vec<u8> = buf.drain(..n).collect();
                        let text = String::from_utf8_lossy(&req).into_owned();
                        let line = text.split("\r\n").next().unwrap_or_default().to_owned();
                        log.lock().unwrap().push(line.clone());
                        let res = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{line}",
                            line.len()
                        );
                        if s.write_all(res.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// #34 item 1: a client that lists `Content-Length` (or `Host`, `Transfer-Encoding`) in
/// `Connection` must not get that field dropped while its body is still sent — the upstream
/// would read the body as a second request, past routing and limits, and its answer, queued
/// on the pooled upstream connection, would reach the next client.
#[tokio::test(flavor = "multi_thread")]
async fn connection_cannot_remove_a_framing_field() {
    let (up, seen) = echo_line_upstream().await;
    let routes = route("api", "/api", &format!("http://{up}"), "");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let smuggled = "GET /secret HTTP/1.1\r\nHost: up\r\n\r\n";
    for front in ["fast", "hyper"] {
        let gw = gateway(&with_http1(&cfg, front));
        seen.lock().unwrap().clear();
        for (conn, te) in [("Content-Length", false), ("Transfer-Encoding", true)] {
            let req = if te {
                format!(
                    "POST /api/a HTTP/1.1\r\nHost: gw\r\nConnection: {conn}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{smuggled}\r\n0\r\n\r\n",
                    smuggled.len()
                )
            } else {
                format!(
                    "POST /api/a HTTP/1.1\r\nHost: gw\r\nConnection: {conn}\r\nContent-Length: {}\r\n\r\n{smuggled}",
                    smuggled.len()
                )
            };
            let first = exchange(gw.proxy, &[req.as_bytes()]).await;
            let first = String::from_utf8_lossy(&first[0]).into_owned();
            assert!(
                first.ends_with("POST /api/a HTTP/1.1"),
                "{front}, Connection: {conn}: {first}"
            );
            // The next client, on a new connection (the pooled upstream one is reused).
            tokio::time::sleep(Duration::from_millis(100)).await;
            let next = exchange(gw.proxy, &[b"GET /api/b HTTP/1.1\r\nHost: gw\r\n\r\n"]).await;
            let next = String::from_utf8_lossy(&next[0]).into_owned();
            assert!(
                next.ends_with("GET /api/b HTTP/1.1"),
                "{front}, Connection: {conn}: the next client got {next}"
            );
        }
        let lines = seen.lock().unwrap().clone();
        assert_eq!(
            lines,
            [
                "POST /api/a HTTP/1.1",
                "GET /api/b HTTP/1.1",
                "POST /api/a HTTP/1.1",
                "GET /api/b HTTP/1.1"
            ],
            "{front}: the upstream served other requests than the gateway decided on"
        );
    }
}

/// #34 item 1: with `preserve_host`, `Connection: Host` does not remove the `Host` field.
#[tokio::test(flavor = "multi_thread")]
async fn connection_cannot_remove_host() {
    let (up, seen) = raw_upstream().await;
    let routes = route(
        "api",
        "/api",
        &format!("http://{up}"),
        "preserve_host = true",
    );
    let cfg = config("backend = \"memory\"", &routes);
    for front in ["fast", "hyper"] {
        let gw = gateway(&with_http1(&cfg, front));
        seen.lock().unwrap().clear();
        let got = exchange(
            gw.proxy,
            &[b"GET /api/a HTTP/1.1\r\nHost: gw.example\r\nConnection: Host\r\n\r\n"],
        )
        .await;
        assert!(String::from_utf8_lossy(&got[0]).starts_with("HTTP/1.1 200"));
        let up = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        assert!(
            up.contains("\r\nHost: gw.example\r\n"),
            "{front}: the upstream got {up}"
        );
    }
}

/// An upstream answering each request with the bytes `answer` gives for its request line,
/// recording every request's bytes.
async fn scripted_upstream(answer: fn(&str) -> &'static [u8]) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    while let Some(n) = message_len(&buf) {
                        let req: Vec<u8> = buf.drain(..n).collect();
                        log.lock().unwrap().extend_from_slice(&req);
                        let text = String::from_utf8_lossy(&req).into_owned();
                        let line = text.split("\r\n").next().unwrap_or_default();
                        if s.write_all(answer(line)).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn odd_answer(line: &str) -> &'static [u8] {
    let path = line.split(' ').nth(1).unwrap_or_default();
    match path {
        "/api/dup-length" => {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nok"
        }
        "/api/list-length" => b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nX-A: 1\r\n\r\nok",
        "/api/no-reason" => b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
        "/api/empty-reason" => b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok",
        "/api/unknown-no-reason" => b"HTTP/1.1 299 \r\nContent-Length: 2\r\n\r\nok",
        "/api/odd-reason" => b"HTTP/1.1 200 Fine\r\nContent-Length: 2\r\n\r\nok",
        "/api/099" => b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok",
        "/api/600" => b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok",
        "/api/204-length" => b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n",
        "/api/204-chunked" => {
            b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
        }
        "/api/304-length" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 2\r\nX-A: 1\r\n\r\n",
        "/api/empty-field" => {
            b"HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Empty-Sp: \r\nContent-Length: 2\r\n\r\nok"
        }
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    }
}

/// #34 items 6 and 14: heads the two fronts used to relay differently — each request on a
/// connection of its own, both fronts the same bytes both ways, and the RFC's answer.
#[tokio::test(flavor = "multi_thread")]
async fn odd_heads_get_the_same_bytes_from_both_fronts() {
    let (up, seen) = scripted_upstream(odd_answer).await;
    let routes = route("api", "/api", &format!("http://{up}"), "");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let paths = [
        ("/api/dup-length", "200"),
        ("/api/list-length", "200"),
        ("/api/no-reason", "200"),
        ("/api/empty-reason", "200"),
        ("/api/unknown-no-reason", "299"),
        ("/api/odd-reason", "200"),
        ("/api/099", "502"),
        ("/api/600", "502"),
        ("/api/204-length", "204"),
        ("/api/204-chunked", "204"),
        ("/api/304-length", "304"),
        ("/api/empty-field", "200"),
    ];
    let mut requests: Vec<String> = paths
        .iter()
        .enumerate()
        .map(|(i, (p, _))| format!("GET {p} HTTP/1.1\r\nHost: gw\r\nX-Request-Id: o-{i}\r\n\r\n"))
        .collect();
    let client_side = [
        "GET /api/xff HTTP/1.1\r\nHost: gw\r\nConnection: X-Forwarded-For\r\nX-Forwarded-For: 10.9.9.9\r\nX-Request-Id: c-1\r\n\r\n",
        "GET /api/empty HTTP/1.1\r\nHost: gw\r\nX-Empty:\r\nX-Empty-Sp: \r\nX-Request-Id: c-2\r\n\r\n",
        "POST /api/cl HTTP/1.1\r\nHost: gw\r\nConnection: Content-Length\r\nContent-Length: 2\r\nX-Request-Id: c-3\r\n\r\nhi",
    ];
    requests.extend(client_side.iter().map(|s| s.to_string()));
    let mut runs = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(&cfg, front));
        let mut answers = Vec::new();
        let mut upstream = Vec::new();
        for req in &requests {
            seen.lock().unwrap().clear();
            let got = exchange(gw.proxy, &[req.as_bytes()]).await;
            answers.push(dateless(&got[0]));
            upstream.push(
                String::from_utf8_lossy(&std::mem::take(&mut *seen.lock().unwrap())).into_owned(),
            );
        }
        runs.push((answers, upstream));
    }
    let (hyper, fast) = (&runs[0], &runs[1]);
    let mut differ = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        if fast.1[i] != hyper.1[i] {
            differ.push(format!(
                "upstream bytes for {req:?}:\n fast  {:?}\n hyper {:?}",
                fast.1[i], hyper.1[i]
            ));
        }
        // A 502's detail names each front's own parser error: the status is compared.
        let both_502 =
            fast.0[i].starts_with("HTTP/1.1 502") && hyper.0[i].starts_with("HTTP/1.1 502");
        if fast.0[i] != hyper.0[i] && !both_502 {
            differ.push(format!(
                "answer to {req:?}:\n fast  {:?}\n hyper {:?}",
                fast.0[i], hyper.0[i]
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "the fronts differ:\n{}",
        differ.join("\n")
    );
    for (i, (p, status)) in paths.iter().enumerate() {
        assert!(
            fast.0[i].starts_with(&format!("HTTP/1.1 {status}")),
            "{p}: {}",
            fast.0[i]
        );
    }
    // Fields a status forbids are removed; a Content-Length list of one value is one value.
    for i in [8, 9] {
        let a = fast.0[i].to_ascii_lowercase();
        assert!(
            !a.contains("content-length") && !a.contains("transfer-encoding"),
            "{a}"
        );
    }
    for i in [0, 1] {
        assert_eq!(
            fast.0[i]
                .to_ascii_lowercase()
                .matches("content-length: 2\r\n")
                .count(),
            1,
            "{}",
            fast.0[i]
        );
    }
    // A client's `Connection: X-Forwarded-For` removes the client's own value; the gateway's
    // address is still sent.
    let xff = &fast.1[paths.len()];
    assert!(
        !xff.contains("10.9.9.9") && xff.contains("X-Forwarded-For: 127.0.0.1\r\n"),
        "{xff}"
    );
}

/// #34 item 14: a framing error's answer closes the connection at once on both fronts (a FIN
/// right after the answer), not after lingering with the socket open.
#[tokio::test(flavor = "multi_thread")]
async fn a_framing_error_closes_at_once_on_both_fronts() {
    let (up, _seen) = raw_upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &route("api", "/api", &format!("http://{up}"), ""),
    );
    let requests: [&[u8]; 2] = [
        b"POST /api/x HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nX-Request-Id: f-1\r\n\r\nzz\r\nhello\r\n",
        b"POST /nowhere HTTP/1.1\r\nHost: gw\r\nContent-Length: 100000\r\nConnection: close\r\nX-Request-Id: f-2\r\n\r\npartial",
    ];
    let mut answers: Vec<Vec<String>> = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(&cfg, front));
        let mut got = Vec::new();
        for req in requests {
            let mut s = TcpStream::connect(gw.proxy).await.unwrap();
            s.write_all(req).await.unwrap();
            // The client keeps its side open: the gateway's FIN must come by itself.
            let mut out = Vec::new();
            let t0 = Instant::now();
            let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            let took = t0.elapsed();
            assert!(
                matches!(read, Ok(Ok(_))) && took < Duration::from_millis(1000),
                "{front}: {:?} closed after {took:?}: {}",
                String::from_utf8_lossy(req),
                String::from_utf8_lossy(&out)
            );
            got.push(dateless(&out));
        }
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
    assert!(
        answers[1][0].starts_with("HTTP/1.1 400"),
        "{}",
        answers[1][0]
    );
    assert!(
        answers[1][1].starts_with("HTTP/1.1 404"),
        "{}",
        answers[1][1]
    );
}

/// Each message of `bytes` (heads split at their blank line, bodies kept) with its fields
/// grouped by name in lower case (stable: a name's values keep their order), `Date` aside:
/// what a header rule changes is then compared as RFC 9110 §5.3 reads a message (the order
/// of fields of different names carries no meaning; hyper's `HeaderMap` reorders them at a
/// removal, the fast front keeps the client's).
fn by_name(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(end) = rest.find("\r\n\r\n") {
        let (head, after) = rest.split_at(end + 4);
        let mut lines = head.trim_end().split("\r\n");
        let start = lines.next().unwrap_or_default().to_owned();
        let mut fields: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
            .filter(|(n, _)| n != "date")
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        // A body up to the next message's start line, if any.
        let next = after
            .find("GET ")
            .into_iter()
            .chain(after.find("HTTP/1.1 "))
            .chain(after.find("OPTIONS "))
            .chain(after.find("POST "))
            .min()
            .unwrap_or(after.len());
        let (body, tail) = after.split_at(next);
        out.push(format!("{start}\n{fields:?}\n{body:?}"));
        rest = tail;
    }
    out
}

/// `requests` on one connection to a gateway on `cfg` with `http1 = "hyper"`, then with
/// `"fast"`: the answers and what the upstream (`seen`) received, for each; the fast front
/// must have handed no connection to hyper (`tollgate_http1_handoffs_total`).
async fn on_both_fronts(
    cfg: &str,
    requests: &[&[u8]],
    seen: &Mutex<Vec<u8>>,
) -> [(Vec<Vec<u8>>, Vec<u8>); 2] {
    let mut runs = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(cfg, front));
        seen.lock().unwrap().clear();
        let answers = exchange(gw.proxy, requests).await;
        let upstream = std::mem::take(&mut *seen.lock().unwrap());
        let handoffs = metric_sum(&gw.metrics().await, "tollgate_http1_handoffs_total", &[]);
        if front == "fast" {
            assert_eq!(handoffs, 0.0, "the fast front handed a connection to hyper");
        }
        runs.push((answers, upstream));
    }
    let fast = runs.pop().unwrap();
    let hyper = runs.pop().unwrap();
    [hyper, fast]
}

/// #35 §2: a route with header rules (templates, `add`), CORS and a limit is served by the fast
/// front itself — request by request on one keep-alive connection, nothing handed to hyper
/// (`tollgate_http1_handoffs_total` stays 0) — and both fronts put the same bytes on the wire:
/// the upstream head with the rules spliced in, the upstream's answer with the response rules
/// and CORS, the gateway's own answers (429, preflight, 404) with theirs.
#[tokio::test(flavor = "multi_thread")]
async fn header_rules_and_cors_are_served_by_the_fast_front_alike() {
    let (up, seen) = raw_upstream().await;
    let url = format!("http://{up}");
    let fronted = "[routes.request_headers]\nremove = [\"Cookie\"]\nset = { \"X-Route\" = \"$route\", \"User-Agent\" = \"gw/$route\" }\nadd = { \"Accept\" = \"text/plain\", \"X-Tag\" = \"gw\" }\n[routes.response_headers]\nremove = [\"X-Upstream-Case\"]\nset = { \"Content-Type\" = \"text/x-gw\", \"X-Served-By\" = \"$route\" }\nadd = { \"Vary\" = \"Accept\", \"Cache-Control\" = \"no-store\" }\n[routes.cors]\nallow_origins = [\"https://app.example\"]\nallow_headers = [\"Content-Type\"]\nmax_age = \"10m\"\n";
    let routes = route("front", "/api", &url, fronted)
        + &limit("name = \"two\"\nalgorithm = \"gcra\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"global\"")
        + &route("plain", "/plain", &url, "");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let requests: Vec<&[u8]> = vec![
        b"GET /api/a HTTP/1.1\r\nHost: gw\r\nOrigin: https://app.example\r\nUser-Agent: t/1\r\nAccept: */*\r\nCookie: s=1\r\nX-Tag: client\r\nX-Request-Id: c-1\r\n\r\n",
        b"OPTIONS /api/a HTTP/1.1\r\nHost: gw\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: GET\r\nX-Request-Id: c-2\r\n\r\n",
        b"GET /plain/b HTTP/1.1\r\nHost: gw\r\nX-Request-Id: c-3\r\n\r\n",
        b"GET /api/chunked HTTP/1.1\r\nHost: gw\r\nOrigin: https://other.example\r\nX-Request-Id: c-4\r\n\r\n",
        b"GET /api/c HTTP/1.1\r\nHost: gw\r\nOrigin: https://app.example\r\nX-Request-Id: c-5\r\n\r\n",
        b"GET /plain/d HTTP/1.1\r\nHost: gw\r\nX-Request-Id: c-6\r\n\r\n",
    ];
    let [(hyper_answers, hyper_up), (fast_answers, fast_up)] =
        &on_both_fronts(&cfg, &requests, &seen).await;
    let up_text = String::from_utf8_lossy(fast_up);
    assert_eq!(
        by_name(fast_up),
        by_name(hyper_up),
        "the upstream received different fields"
    );
    assert!(up_text.contains("x-route: front\r\n"), "{up_text}");
    assert!(
        up_text.contains("Accept: */*\r\n") && up_text.contains(": text/plain\r\n"),
        "{up_text}"
    );
    assert!(!up_text.contains("s=1"), "Cookie removed: {up_text}");
    assert!(up_text.contains("gw/front"), "{up_text}");
    for (i, (f, h)) in fast_answers.iter().zip(hyper_answers).enumerate() {
        assert_eq!(by_name(f), by_name(h), "response {} differs", i + 1);
    }
    let first = String::from_utf8_lossy(&fast_answers[0]).to_ascii_lowercase();
    for want in [
        "access-control-allow-origin: https://app.example\r\n",
        "x-served-by: front\r\n",
        "vary: origin\r\n",
        "vary: accept\r\n",
        "content-type: text/x-gw\r\n",
    ] {
        assert!(first.contains(want), "{want:?} in {first}");
    }
    assert!(!first.contains("x-upstream-case"), "{first}");
    let statuses: Vec<String> = fast_answers
        .iter()
        .map(|a| String::from_utf8_lossy(&a[..12]).into_owned())
        .collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 200",
            "HTTP/1.1 204",
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 429",
            "HTTP/1.1 200"
        ]
    );
    let limited = String::from_utf8_lossy(&fast_answers[4]).to_ascii_lowercase();
    assert!(
        limited.contains("access-control-allow-origin: https://app.example\r\n")
            && limited.contains("x-served-by: front\r\n"),
        "the gateway's own 429 carries CORS and the rules: {limited}"
    );
}

fn usage_answer(line: &str) -> &'static [u8] {
    if line.contains("/sse") {
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n15\r\ndata: {\"x\":\"hello\"}\n\n\r\n24\r\ndata: {\"usage\":{\"total_tokens\":4}}\n\n\r\n0\r\n\r\n"
    } else {
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 34\r\n\r\n{\"usage\":{\"total_tokens\":7},\"a\":1}"
    }
}

/// #35 §2: `cost_from` (a JSON body, an event stream) and limits that read the request's JSON
/// body (`json:` subject parts) are served by the fast front itself — nothing handed to hyper —
/// and charge on it what they charge on the hyper front: the remaining budget each front
/// reports after the same requests is the same.
#[tokio::test(flavor = "multi_thread")]
async fn body_costs_and_json_subjects_are_served_by_the_fast_front_alike() {
    let (up, seen) = scripted_upstream(usage_answer).await;
    let url = format!("http://{up}");
    let routes = route("llm", "/v1", &url, "")
        + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1h\"\nsubject = \"global\"\ncost_from = \"json:usage.total_tokens\"")
        + &route("models", "/models", &url, "")
        + &limit("name = \"per-model\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"json:model\"");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let requests: Vec<&[u8]> = vec![
        b"POST /v1/chat HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-1\r\nAccept-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /v1/sse HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-2\r\n\r\n",
        b"GET /v1/chat HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-3\r\n\r\n",
        b"POST /models/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-4\r\nContent-Length: 13\r\n\r\n{\"model\":\"a\"}",
        b"POST /models/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n8\r\nel\":\"a\"}\r\n0\r\n\r\n",
        b"POST /models/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-6\r\nContent-Length: 13\r\n\r\n{\"model\":\"a\"}",
        b"POST /models/b HTTP/1.1\r\nHost: gw\r\nX-Request-Id: b-7\r\nContent-Length: 13\r\n\r\n{\"model\":\"b\"}",
    ];
    let [(hyper_answers, hyper_up), (fast_answers, fast_up)] =
        &on_both_fronts(&cfg, &requests, &seen).await;
    // (Heads only: hyper re-chunks a chunked body it read the start of.)
    let heads = |b: &[u8]| -> Vec<String> {
        by_name(b)
            .into_iter()
            .map(|m| m.rsplit_once('\n').map_or(m.clone(), |(h, _)| h.to_owned()))
            .collect()
    };
    assert_eq!(
        heads(fast_up),
        heads(hyper_up),
        "the upstream received different fields"
    );
    assert!(
        !String::from_utf8_lossy(fast_up).contains("gzip"),
        "a body read for its cost comes unencoded"
    );
    let remaining = |a: &[u8]| -> Option<String> {
        String::from_utf8_lossy(a)
            .to_ascii_lowercase()
            .split("\r\n")
            .find_map(|l| l.strip_prefix("x-ratelimit-remaining: ").map(str::to_owned))
    };
    let fast_left: Vec<Option<String>> = fast_answers.iter().map(|a| remaining(a)).collect();
    let hyper_left: Vec<Option<String>> = hyper_answers.iter().map(|a| remaining(a)).collect();
    assert_eq!(fast_left, hyper_left);
    // Each next request sees the budget less what the one before cost: 7 (the JSON body),
    // then 4 (the stream's last event).
    let n = |i: usize| -> i64 { fast_left[i].as_deref().unwrap_or("0").parse().unwrap() };
    assert_eq!((n(0) - n(1), n(1) - n(2)), (7, 4), "{fast_left:?}");
    let statuses: Vec<String> = fast_answers
        .iter()
        .map(|a| String::from_utf8_lossy(&a[..12]).into_owned())
        .collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 200",
            "HTTP/1.1 429",
            "HTTP/1.1 200"
        ],
        "two requests a model: the third for `a` refused, `b` counted apart"
    );
}

fn trailer_answer(_line: &str) -> &'static [u8] {
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Other: 1\r\nX-Tokens-Used: 6\r\n\r\n"
}

/// #35 §2: a cost read from a trailer (`cost_from = "trailer:…"`) is served by the fast front
/// itself — its chunked decoder keeps the (bounded) trailer section for the charge; nothing is
/// handed to hyper — and charges there what it charges on the hyper front: each request finds
/// the budget less the 6 the one before reported in its trailer.
#[tokio::test(flavor = "multi_thread")]
async fn a_trailer_cost_is_served_by_the_fast_front_alike() {
    let (up, seen) = scripted_upstream(trailer_answer).await;
    let url = format!("http://{up}");
    let routes = route("llm", "/v1", &url, "")
        + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1h\"\nsubject = \"global\"\ncost_from = \"trailer:x-tokens-used\"");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let requests: Vec<&[u8]> = vec![
        b"GET /v1/a HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-1\r\n\r\n",
        b"POST /v1/b HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-2\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /v1/c HTTP/1.1\r\nHost: gw\r\nX-Request-Id: t-3\r\n\r\n",
    ];
    let [(hyper_answers, hyper_up), (fast_answers, fast_up)] =
        &on_both_fronts(&cfg, &requests, &seen).await;
    assert_eq!(
        by_name(fast_up),
        by_name(hyper_up),
        "the upstream received different fields"
    );
    assert!(
        String::from_utf8_lossy(fast_up)
            .to_ascii_lowercase()
            .contains("te: trailers\r\n"),
        "the upstream is told the client takes trailers"
    );
    // (Not the whole answers: the window's reset may tick between the two runs.)
    let body = |a: &[u8]| -> Vec<u8> {
        let end = a.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
        a[end..].to_vec()
    };
    for (i, (f, h)) in fast_answers.iter().zip(hyper_answers).enumerate() {
        assert_eq!(&f[..12], &h[..12], "response {} differs", i + 1);
        assert_eq!(body(f), body(h), "response {} differs", i + 1);
    }
    let remaining = |a: &[u8]| -> i64 {
        String::from_utf8_lossy(a)
            .to_ascii_lowercase()
            .split("\r\n")
            .find_map(|l| l.strip_prefix("x-ratelimit-remaining: ").map(str::to_owned))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    let left: Vec<i64> = fast_answers.iter().map(|a| remaining(a)).collect();
    let hyper_left: Vec<i64> = hyper_answers.iter().map(|a| remaining(a)).collect();
    assert_eq!(left, hyper_left);
    assert_eq!((left[0] - left[1], left[1] - left[2]), (6, 6), "{left:?}");
}

/// #50 item 13: a chunked request body whose trailer section is malformed — a space before the
/// colon, an obs-fold line, an empty name, a NUL in a value, a line without a colon, or a
/// pipelined request sent where the final CRLF belongs — gets the same 400 from both fronts,
/// and the connection closes at once: the pipelined request is never served, and no request
/// reaches the upstream whole.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_trailers_get_the_same_400_and_close_on_both_fronts() {
    let (up, seen) = raw_upstream().await;
    let cfg = config(
        "backend = \"memory\"",
        &route("api", "/api", &format!("http://{up}"), ""),
    );
    let cases: [(&str, &[u8]); 6] = [
        ("a space before the colon", b"X-T : 1\r\n\r\n"),
        ("obs-fold", b"X-T: 1\r\n 2\r\n\r\n"),
        ("an empty name", b": 1\r\n\r\n"),
        ("a NUL", b"X-T: a\0b\r\n\r\n"),
        ("no colon", b"X-T 1\r\n\r\n"),
        (
            "a pipelined request for the final CRLF",
            b"X-T: 1\r\nGET /api/smuggled HTTP/1.1\r\nHost: gw\r\n\r\n",
        ),
    ];
    let mut answers: Vec<Vec<String>> = Vec::new();
    for front in ["hyper", "fast"] {
        let gw = gateway(&with_http1(&cfg, front));
        seen.lock().unwrap().clear();
        let mut got = Vec::new();
        for (i, (what, trailer)) in cases.iter().enumerate() {
            let mut req = format!(
                "POST /api/t HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nX-Request-Id: t-{i}\r\n\r\n5\r\nhello\r\n0\r\n"
            )
            .into_bytes();
            req.extend_from_slice(trailer);
            let mut s = TcpStream::connect(gw.proxy).await.unwrap();
            s.write_all(&req).await.unwrap();
            // The client keeps its side open: the gateway's FIN must come by itself.
            let mut out = Vec::new();
            let t0 = Instant::now();
            let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            let took = t0.elapsed();
            let answer = dateless(&out);
            assert!(
                matches!(read, Ok(Ok(_))) && took < Duration::from_millis(1000),
                "{front}, {what}: closed after {took:?}: {answer}"
            );
            assert!(
                answer.starts_with("HTTP/1.1 400") && answer.matches("HTTP/1.1").count() == 1,
                "{front}, {what}: {answer}"
            );
            got.push(answer);
        }
        let upstream = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        assert_eq!(
            upstream, "",
            "{front}: a whole request reached the upstream"
        );
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
}
