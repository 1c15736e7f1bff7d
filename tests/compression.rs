//! #38 §1, compression through the binary on both HTTP/1 fronts (`TOLLGATE_TEST_HTTP1`):
//! `Accept-Encoding` negotiated with q-values (a malformed header gets identity), zstd, br and
//! gzip decoded by their own crates and by curl `--compressed`, each response never compressed
//! (already encoded, `no-transform`, 206, HEAD, 204, 304, an image, shorter than `min_length`),
//! `Vary` merged, the `ETag` made weak, a chunked upstream, an event stream flushed event by
//! event, the gateway's own 429 compressed, and `cost_from` over a gzip upstream (a bomb is
//! malformed: the fallback is charged, memory stays flat).

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

on_every_store!(
    cost_from_reads_a_gzip_upstream_and_a_bomb_is_bounded,
    byte_limits_count_the_compressed_bytes,
    an_event_stream_opening_with_a_byte_order_mark_is_charged
);

fn json_body() -> Vec<u8> {
    let mut b = b"{\"items\":[".to_vec();
    for i in 0..100 {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(format!("{{\"id\":{i},\"name\":\"item number {i}\"}}").as_bytes());
    }
    b.extend_from_slice(b"]}");
    b
}

fn gz(data: &[u8], level: u32) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn decode(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .unwrap();
        }
        "br" => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        "zstd" => out = zstd::stream::decode_all(data).unwrap(),
        "" => out = data.to_vec(),
        other => panic!("coding {other}"),
    }
    out
}

/// An upstream answering by path (see the module comment); `/sse` sends its first event, then
/// waits for `next` before the second.
async fn upstream_of(next: Arc<Notify>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve(s, next.clone()));
        }
    });
    addr
}

fn answer(status: &str, fields: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\n{fields}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

async fn serve(mut s: TcpStream, next: Arc<Notify>) {
    let mut buf = Vec::new();
    loop {
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
        buf.drain(..end);
        let head_request = head.starts_with("head ");
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let body = json_body();
        const JSON: &str = "content-type: application/json\r\n";
        let mut out = match path.rsplit('/').next().unwrap_or("") {
            "json" => answer(
                "200 OK",
                &format!("{JSON}etag: \"v1\"\r\nvary: Origin\r\n"),
                &body,
            ),
            "chunked" => {
                let mut out =
                    format!("HTTP/1.1 200 OK\r\n{JSON}transfer-encoding: chunked\r\n\r\n")
                        .into_bytes();
                for piece in body.chunks(700) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                out
            }
            "encoded" => answer(
                "200 OK",
                &format!("{JSON}content-encoding: gzip\r\n"),
                &gz(&body, 6),
            ),
            "notransform" => answer(
                "200 OK",
                &format!("{JSON}cache-control: public, no-transform\r\n"),
                &body,
            ),
            // The directive on a second line of the list field.
            "notransform2" => answer(
                "200 OK",
                &format!("{JSON}cache-control: public\r\ncache-control: no-transform\r\n"),
                &body,
            ),
            // Encoded, said on the second line (the first an `identity`).
            "encoded2" => answer(
                "200 OK",
                &format!("{JSON}content-encoding: identity\r\ncontent-encoding: gzip\r\n"),
                &gz(&body, 6),
            ),
            "ranges" => answer("200 OK", &format!("{JSON}accept-ranges: bytes\r\n"), &body),
            "range" => answer(
                "206 Partial Content",
                &format!("{JSON}content-range: bytes 0-{}/99999\r\n", body.len() - 1),
                &body,
            ),
            // A chunk whose size line is no number, as the body's first bytes.
            "brokenchunk" => format!(
                "HTTP/1.1 200 OK\r\n{JSON}transfer-encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n"
            )
            .into_bytes(),
            // A head, then the upstream closes before the body's first byte.
            "cutbody" => {
                let head = format!("HTTP/1.1 200 OK\r\n{JSON}transfer-encoding: chunked\r\n\r\n");
                let _ = s.write_all(head.as_bytes()).await;
                return;
            }
            // 256 KiB of text a coding cannot shrink to nothing, then the response is held
            // open (its encoder alive) until the client leaves.
            "hold" => {
                let head = format!("HTTP/1.1 200 OK\r\n{JSON}transfer-encoding: chunked\r\n\r\n");
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
                for _ in 0..16 {
                    let mut piece = String::with_capacity(16 * 1024);
                    while piece.len() < 16 * 1024 - 32 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        piece.push_str(&format!("{{\"n\":{}}},", x % 100_000_000));
                    }
                    let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
                    if s.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                }
                let mut rest = [0u8; 64];
                while let Ok(n) = s.read(&mut rest).await {
                    if n == 0 {
                        return;
                    }
                }
                return;
            }
            "png" => answer("200 OK", "content-type: image/png\r\n", &body),
            "small" => answer("200 OK", JSON, b"{\"ok\":true}"),
            "nocontent" => b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
            "notmodified" => b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\n\r\n".to_vec(),
            "sse" => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let first = "data: one\n\n";
                let out = format!("{head}{:x}\r\n{first}\r\n", first.len());
                if s.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
                next.notified().await;
                let second = "data: two\n\n";
                format!("{:x}\r\n{second}\r\n0\r\n\r\n", second.len()).into_bytes()
            }
            // An event stream opening with a UTF-8 byte order mark (which an event stream
            // parser drops): its only event carries the usage.
            "bomsse" => answer(
                "200 OK",
                "content-type: text/event-stream\r\n",
                "\u{feff}data: {\"usage\":{\"total_tokens\":7}}\n\n".as_bytes(),
            ),
            "cost" => answer(
                "200 OK",
                &format!("{JSON}content-encoding: gzip\r\n"),
                &gz(br#"{"usage":{"total_tokens":7}}"#, 6),
            ),
            "bomb" => {
                // 100 MiB of spaces inside the document: some 100 KiB sent.
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(9));
                e.write_all(b"{\"usage\":").unwrap();
                let spaces = vec![b' '; 1 << 20];
                for _ in 0..100 {
                    e.write_all(&spaces).unwrap();
                }
                e.write_all(br#"{"total_tokens":7}}"#).unwrap();
                answer(
                    "200 OK",
                    &format!("{JSON}content-encoding: gzip\r\n"),
                    &e.finish().unwrap(),
                )
            }
            _ => answer("404 Not Found", "", b""),
        };
        if head_request {
            // The head only (its Content-Length says what a GET would get).
            let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            out.truncate(at);
        }
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// `GET url` with `Accept-Encoding: accept`.
async fn accepting(
    c: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    accept: &str,
) -> reqwest::Response {
    c.get(url)
        .header("accept-encoding", accept)
        .send()
        .await
        .unwrap()
}

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn compressing_gateway(extra: &str) -> (Gateway, Arc<Notify>) {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next.clone()).await;
    let routes = route(
        "api",
        "/api",
        &format!("http://{up}"),
        &format!("[routes.compression]\nmin_length = 100\n{extra}"),
    ) + &route("plain", "/plain", &format!("http://{up}"), "");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    wait_ready(&gw).await;
    (gw, next)
}

#[tokio::test(flavor = "multi_thread")]
async fn codings_are_negotiated_with_q_values_and_decode_to_the_body() {
    let (gw, _) = compressing_gateway("").await;
    let c = client();
    for (accept, coding) in [
        ("gzip", "gzip"),
        ("br", "br"),
        ("zstd", "zstd"),
        ("gzip, deflate, br, zstd", "zstd"),
        ("gzip;q=1, br;q=0.5", "gzip"),
        ("*;q=0.1, gzip", "gzip"),
        ("zstd;q=0, *", "br"),
        // The issue's bad header: every member is malformed, identity.
        ("gzip;q=2, *;q=-1, br;q=abc", ""),
        ("identity", ""),
        ("deflate", ""),
    ] {
        for path in ["/api/json", "/api/chunked"] {
            let res = accepting(&c, gw.url(path), accept).await;
            assert_eq!(res.status(), 200);
            assert_eq!(h(&res, "content-encoding"), coding, "{accept} {path}");
            let vary = if path == "/api/json" {
                "Origin, Accept-Encoding"
            } else {
                "Accept-Encoding"
            };
            assert_eq!(h(&res, "vary"), vary, "{accept} {path}");
            if path == "/api/json" {
                let etag = if coding.is_empty() {
                    "\"v1\""
                } else {
                    "W/\"v1\""
                };
                assert_eq!(h(&res, "etag"), etag, "{accept}");
                if coding.is_empty() {
                    assert_eq!(h(&res, "content-length"), json_body().len().to_string());
                }
            }
            if !coding.is_empty() {
                assert_eq!(h(&res, "content-length"), "", "{accept} {path}");
            }
            let bytes = res.bytes().await.unwrap();
            if !coding.is_empty() {
                assert!(
                    bytes.len() < json_body().len() / 3,
                    "{accept}: {}",
                    bytes.len()
                );
            }
            assert_eq!(decode(coding, &bytes), json_body(), "{accept} {path}");
        }
    }
    // No Accept-Encoding at all: identity (still varying). A route without compression: as
    // the upstream sent it.
    let res = c.get(gw.url("/api/json")).send().await.unwrap();
    assert_eq!(h(&res, "content-encoding"), "");
    assert_eq!(h(&res, "vary"), "Origin, Accept-Encoding");
    let res = accepting(&c, gw.url("/plain/json"), "gzip").await;
    assert_eq!(h(&res, "content-encoding"), "");
    assert_eq!(h(&res, "vary"), "Origin");
    assert_eq!(res.bytes().await.unwrap(), json_body());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateways_order_and_level_are_the_routes() {
    let (gw, _) = compressing_gateway("algorithms = [\"gzip\", \"br\"]\nlevel = 1").await;
    let c = client();
    let res = accepting(&c, gw.url("/api/json"), "zstd, br, gzip").await;
    assert_eq!(h(&res, "content-encoding"), "gzip");
    let got = res.bytes().await.unwrap();
    assert_eq!(decode("gzip", &got), json_body());
    // Level 1 is what the route asked: gzip -1's size (a sync flush adds a few bytes).
    let one = gz(&json_body(), 1).len();
    assert!(got.len().abs_diff(one) <= 16, "{} vs {one}", got.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn what_is_never_compressed() {
    let (gw, _) = compressing_gateway("").await;
    let c = client();
    for (path, status, encoding) in [
        ("/api/encoded", 200, "gzip"),
        ("/api/encoded2", 200, "identity, gzip"),
        ("/api/notransform", 200, ""),
        ("/api/notransform2", 200, ""),
        ("/api/range", 206, ""),
        ("/api/png", 200, ""),
        ("/api/small", 200, ""),
        ("/api/nocontent", 204, ""),
        ("/api/notmodified", 304, ""),
    ] {
        let res = accepting(&c, gw.url(path), "gzip, br, zstd").await;
        assert_eq!(res.status(), status, "{path}");
        assert_eq!(h(&res, "content-encoding"), encoding, "{path}");
        assert!(!h(&res, "vary").contains("Accept-Encoding"), "{path}");
        let bytes = res.bytes().await.unwrap();
        if path.starts_with("/api/encoded") {
            // Passed as the upstream encoded it, once.
            assert_eq!(decode("gzip", &bytes), json_body());
        }
    }
    let res = c
        .head(gw.url("/api/json"))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "content-encoding"), "");
    assert_eq!(h(&res, "content-length"), json_body().len().to_string());
}

/// A compressed response does not offer ranges (`Accept-Ranges` removed, as nginx's gzip
/// filter does): a range of the identity bytes appended to compressed ones would be garbage.
/// The identity answer keeps it.
#[tokio::test(flavor = "multi_thread")]
async fn a_compressed_response_offers_no_ranges() {
    let (gw, _) = compressing_gateway("").await;
    let c = client();
    for coding in ["gzip", "br", "zstd"] {
        let res = accepting(&c, gw.url("/api/ranges"), coding).await;
        assert_eq!(h(&res, "content-encoding"), coding);
        assert_eq!(
            h(&res, "accept-ranges"),
            "",
            "{coding}: {:?}",
            res.headers()
        );
        assert_eq!(decode(coding, &res.bytes().await.unwrap()), json_body());
    }
    let res = accepting(&c, gw.url("/api/ranges"), "identity").await;
    assert_eq!(h(&res, "content-encoding"), "");
    assert_eq!(h(&res, "accept-ranges"), "bytes");
    assert_eq!(res.bytes().await.unwrap(), json_body());
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_compressed_gets_the_body() {
    let (gw, _) = compressing_gateway("").await;
    for coding in ["gzip", "br", "zstd"] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--compressed", "-D", "-", "-H"])
            .arg(format!("accept-encoding: {coding}"))
            .arg(gw.url("/api/json"))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        if head
            .to_ascii_lowercase()
            .contains(&format!("content-encoding: {coding}"))
        {
            assert_eq!(body.as_bytes(), json_body(), "{coding}");
        } else {
            panic!("{coding}: {head}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_stream_arrives_event_by_event() {
    let (gw, next) = compressing_gateway("").await;
    for coding in ["gzip", "br", "zstd"] {
        let mut res = client()
            .get(gw.url("/api/sse"))
            .header("accept-encoding", coding)
            .send()
            .await
            .unwrap();
        assert_eq!(h(&res, "content-encoding"), coding);
        // Decoded as it comes: the first event before the upstream sends the second.
        let mut got = Vec::new();
        let mut first = String::new();
        while !first.contains("data: one\n\n") {
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), res.chunk())
                .await
                .expect("the first event, flushed")
                .unwrap()
                .expect("more body");
            got.extend_from_slice(&chunk);
            first = String::from_utf8_lossy(&partial(coding, &got)).into_owned();
        }
        assert!(!first.contains("two"));
        next.notify_one();
        while let Some(chunk) = res.chunk().await.unwrap() {
            got.extend_from_slice(&chunk);
        }
        assert_eq!(
            decode(coding, &got),
            b"data: one\n\ndata: two\n\n",
            "{coding}"
        );
    }
}

/// What a stream decodes to so far (the stream not ended).
fn partial(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            let mut d = flate2::write::GzDecoder::new(Vec::new());
            let _ = d.write_all(data);
            let _ = d.flush();
            out = d.get_ref().clone();
        }
        "br" => {
            let mut d = brotli::DecompressorWriter::new(Vec::new(), 4096);
            let _ = d.write_all(data);
            let _ = d.flush();
            out = d.get_ref().clone();
        }
        "zstd" => {
            let mut d = zstd::stream::write::Decoder::new(Vec::new()).unwrap();
            let _ = d.write_all(data);
            let _ = d.flush();
            out = d.get_ref().clone();
        }
        _ => out.extend_from_slice(data),
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateways_own_refusal_is_compressed() {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next).await;
    let routes = route(
        "api",
        "/api",
        &format!("http://{up}"),
        "[routes.compression]\nmin_length = 0",
    ) + &limit("name = \"one\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    wait_ready(&gw).await;
    let c = client();
    let ok = c.get(gw.url("/api/json")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    ok.bytes().await.unwrap();
    let res = accepting(&c, gw.url("/api/json"), "gzip").await;
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "content-encoding"), "gzip");
    assert_eq!(h(&res, "vary"), "Accept-Encoding");
    assert!(h(&res, "content-type").starts_with("application/problem+json"));
    let body = decode("gzip", &res.bytes().await.unwrap());
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["status"], 429, "{v}");
    // Without Accept-Encoding: as before.
    let res = c.get(gw.url("/api/json")).send().await.unwrap();
    assert_eq!(h(&res, "content-encoding"), "");
    let v: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
    assert_eq!(v["status"], 429);
}

async fn cost_from_reads_a_gzip_upstream_and_a_bomb_is_bounded(kind: Kind) {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next).await;
    let env = store_env(kind);
    let routes = route("llm", "/v1", &format!("http://{up}"), "")
        + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"global\"\ncost_from = \"json:usage.total_tokens\"\ncost = 100");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let remaining =
        |res: &reqwest::Response| -> i64 { h(res, "x-ratelimit-remaining").parse().unwrap() };
    let res = c.get(gw.url("/v1/cost")).send().await.unwrap();
    assert_eq!(res.status(), 200, "{kind:?}");
    let before = remaining(&res);
    // Passed as the upstream sent it (the client did not ask for it, the upstream answered
    // gzip anyway): the gateway decodes only for the scan.
    assert_eq!(h(&res, "content-encoding"), "gzip");
    res.bytes().await.unwrap();
    let res = c.get(gw.url("/v1/bomb")).send().await.unwrap();
    assert_eq!(
        before - remaining(&res),
        7,
        "the gzip body's cost, {kind:?}"
    );
    let after_cost = remaining(&res);
    let rss_before = rss(gw.child.id());
    res.bytes().await.unwrap();
    let res = c.get(gw.url("/v1/cost")).send().await.unwrap();
    // The bomb was stopped at the scan's bound: malformed, the fallback `cost` (100) charged.
    assert_eq!(after_cost - remaining(&res), 100, "{kind:?}");
    res.bytes().await.unwrap();
    let grown = rss(gw.child.id()).saturating_sub(rss_before);
    assert!(
        grown < 32 << 20,
        "RSS grew by {grown} bytes decoding a bomb"
    );
}

async fn byte_limits_count_the_compressed_bytes(kind: Kind) {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next).await;
    let env = store_env(kind);
    let routes = route("api", "/api", &format!("http://{up}"), "[routes.compression]")
        + &limit("name = \"egress\"\nalgorithm = \"fixed_window\"\nlimit = 1000000\nperiod = \"1h\"\nsubject = \"ip\"\nunit = \"bytes\"");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let remaining =
        |res: &reqwest::Response| -> i64 { h(res, "x-ratelimit-remaining").parse().unwrap() };
    let mut left = Vec::new();
    let mut sizes = Vec::new();
    for accept in ["gzip", "", "br", ""] {
        let res = accepting(&c, gw.url("/api/json"), accept).await;
        assert_eq!(res.status(), 200, "{kind:?}");
        left.push(remaining(&res));
        sizes.push(res.bytes().await.unwrap().len() as i64);
    }
    assert!(sizes[0] < sizes[1] / 3, "{sizes:?}");
    // Each response was charged the bytes the client was written: compressed, or not.
    for i in 0..3 {
        assert_eq!(
            left[i] - left[i + 1],
            sizes[i],
            "{i}: {left:?} {sizes:?} {kind:?}"
        );
    }
}

/// A route's header rule on `Vary` (here `add`) and compression's `Accept-Encoding` both reach
/// the client, with the upstream's own `Vary`, on every front: the compression phase merges
/// into the response as the rules left it. (On the fast front the merge read the upstream's
/// fields only, and replaced the rule's value.)
#[tokio::test(flavor = "multi_thread")]
async fn a_header_rule_on_vary_survives_compression() {
    let (gw, _) =
        compressing_gateway("\n[routes.response_headers]\nadd = { \"Vary\" = \"Cookie\" }").await;
    let c = client();
    for (path, want) in [
        ("/api/json", "Origin, Cookie, Accept-Encoding"),
        ("/api/chunked", "Cookie, Accept-Encoding"),
    ] {
        for accept in ["gzip", "identity"] {
            let res = accepting(&c, gw.url(path), accept).await;
            assert_eq!(res.status(), 200);
            let vary: Vec<String> = h(&res, "vary")
                .split(',')
                .map(|t| t.trim().to_owned())
                .collect();
            let want: Vec<String> = want.split(", ").map(str::to_owned).collect();
            // Each token once (a repeated field line would be harmless, a lost one is not).
            let mut seen = vary.clone();
            seen.dedup();
            assert_eq!(seen, want, "{path} {accept}: {vary:?}");
        }
    }
}

/// An upstream body broken before its first byte reached the client (a chunk size line that is
/// no number, or the upstream gone after its head) is answered 502, as nginx does when no head
/// was sent, rather than with nothing, or a 200 cut short: compressed on both fronts (the head
/// waits for the body's first piece), and uncompressed on the fast front (which holds every
/// head so; the hyper front sends an uncompressed response's head at once).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_broken_before_its_first_byte_is_a_502() {
    let (gw, _) = compressing_gateway("").await;
    let c = client();
    let mut codings = vec!["gzip", "br", "zstd"];
    // Over HTTP/3 an uncompressed head goes at once (as on hyper's front), and the stream is
    // then reset.
    if test_front().as_deref() != Some("hyper") && !over_h3::enabled() {
        codings.push("identity");
    }
    for path in ["/api/brokenchunk", "/api/cutbody"] {
        for &coding in &codings {
            let res = c
                .get(gw.url(path))
                .header("accept-encoding", coding)
                .send()
                .await;
            let res = res.unwrap_or_else(|e| panic!("{path} {coding}: no answer: {e}"));
            assert_eq!(res.status(), 502, "{path} {coding}");
            assert_eq!(h(&res, "content-encoding"), "", "{path} {coding}");
            let v: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
            assert_eq!(v["status"], 502, "{path} {coding}: {v}");
        }
    }
}

/// Opens `n` requests for `/api/hold` accepting `coding` on a raw connection each, reads their
/// heads and then nothing more: `(connections, how many were compressed)`.
async fn stalled(gw: &Gateway, n: usize, coding: &str) -> (Vec<TcpStream>, usize) {
    let mut conns = Vec::new();
    let mut compressed = 0;
    for _ in 0..n {
        let mut s = TcpStream::connect(gw.http_addr()).await.unwrap();
        let req = format!("GET /api/hold HTTP/1.1\r\nhost: x\r\naccept-encoding: {coding}\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let r = tokio::time::timeout(std::time::Duration::from_secs(30), s.read(&mut byte))
                .await
                .expect("a head");
            assert_eq!(r.unwrap(), 1, "the head, whole");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("vary: accept-encoding"), "{head}");
        if head.contains(&format!("content-encoding: {coding}")) {
            compressed += 1;
        }
        conns.push(s);
    }
    (conns, compressed)
}

/// A worker runs at most 128 encoders at once: past them a response goes as identity (still
/// varying), and an encoder freed (its client gone) is taken again.
#[tokio::test(flavor = "multi_thread")]
async fn encoders_per_worker_are_capped() {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next).await;
    let routes = route(
        "api",
        "/api",
        &format!("http://{up}"),
        "[routes.compression]\nmin_length = 100",
    );
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    let (mut held, compressed) = stalled(&gw, 128, "gzip").await;
    assert_eq!(compressed, 128, "each under the cap compressed");
    let (more, compressed) = stalled(&gw, 2, "gzip").await;
    assert_eq!(compressed, 0, "past the cap: identity");
    drop(more);
    // One client leaves: its encoder is free for the next.
    drop(held.pop());
    let mut compressed = 0;
    for _ in 0..50 {
        let (c, n) = stalled(&gw, 1, "gzip").await;
        drop(c);
        if n == 1 {
            compressed = 1;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(compressed, 1, "a freed encoder is taken again");
}

/// What a compressed response whose client stops reading holds in the gateway, measured as the
/// growth of its resident memory over 32 such responses (each encoder fed 256 KiB of text, its
/// window and tables filled): bounded by the encoder's window and tables chosen for it (see the
/// manual's Compression page), per coding, on either front.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_compressed_response_holds_little() {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next).await;
    let routes = route(
        "api",
        "/api",
        &format!("http://{up}"),
        "[routes.compression]\nmin_length = 100\nlevel = 9",
    );
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nworkers = 1\n",
        1,
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    const N: usize = 32;
    for coding in ["br", "zstd", "gzip"] {
        // A first round warms the allocator up (its arenas, the connection's buffers).
        let (warm, _) = stalled(&gw, 4, coding).await;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let before = rss(gw.child.id());
        let (conns, compressed) = stalled(&gw, N, coding).await;
        assert_eq!(compressed, N, "{coding}");
        // The encoders have been fed the whole 256 KiB.
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let grown = rss(gw.child.id()).saturating_sub(before);
        let each = grown / N as u64;
        eprintln!("{coding}: {each} bytes per stalled compressed response");
        assert!(
            each < 640 * 1024,
            "{coding}: {each} bytes held per stalled compressed response"
        );
        drop(conns);
        drop(warm);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// `cost_from` over an event stream that opens with a byte order mark: the first event's `data`
/// is read (the mark dropped, as an event stream parser does), its usage charged — not the
/// fallback `cost` of a stream with no usage.
async fn an_event_stream_opening_with_a_byte_order_mark_is_charged(kind: Kind) {
    let next = Arc::new(Notify::new());
    let up = upstream_of(next).await;
    let env = store_env(kind);
    let routes = route("llm", "/v1", &format!("http://{up}"), "")
        + &limit("name = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1h\"\nsubject = \"global\"\ncost_from = \"json:usage.total_tokens\"\ncost = 100");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let remaining =
        |res: &reqwest::Response| -> i64 { h(res, "x-ratelimit-remaining").parse().unwrap() };
    let res = c.get(gw.url("/v1/bomsse")).send().await.unwrap();
    assert_eq!(res.status(), 200, "{kind:?}");
    let before = remaining(&res);
    let body = res.bytes().await.unwrap();
    assert!(
        body.starts_with("\u{feff}data: ".as_bytes()),
        "passed as sent"
    );
    let mut charged = 0;
    for _ in 0..50 {
        let res = c.get(gw.url("/v1/small")).send().await.unwrap();
        charged = before - remaining(&res);
        res.bytes().await.unwrap();
        if charged >= 7 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // `/v1/small` is charged when its own body ends: after the read above.
    assert_eq!(charged, 7, "{kind:?}: the first event's usage");
}
