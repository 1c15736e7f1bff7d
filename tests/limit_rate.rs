//! #38 §2, `limit_rate` and `limit_rate_after` through the binary on both HTTP/1 fronts
//! (`TOLLGATE_TEST_HTTP1`): a response paced past its free bytes (a `Content-Length` body, a
//! chunked one and a compressed one), a route without it fast, a plan's rate winning over the
//! route's (`0`: no limit), and the upstream read no faster than a slow client is written (the
//! gateway's memory does not grow by a 64 MiB body; the upstream is dropped when the client
//! leaves mid-body).
//!
//! Timings are measured by the client on the real clock, with generous bounds (a behaviour
//! test, not a benchmark): the pacing sleeps on tokio's timer, which the injected store clock
//! (`test-clock`) does not drive.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIG: usize = 256 * 1024;
const HUGE: u64 = 64 << 20;

/// Incompressible bytes (compression leaves their size as is): a fixed pseudo-random sequence.
fn noise(n: usize) -> Vec<u8> {
    let mut lcg = Lcg(7);
    (0..n).map(|_| lcg.next(256) as u8).collect()
}

/// What the upstream saw of `/huge`: the bytes it wrote, and whether its client (the gateway)
/// went away mid-body.
#[derive(Default)]
struct Huge {
    written: AtomicU64,
    dropped: AtomicBool,
}

/// An upstream answering `/big` (256 KiB, `Content-Length`), `/chunked` (the same, chunked) and
/// `/huge` (64 MiB generated as it is written).
async fn upstream_of(huge: Arc<Huge>) -> SocketAddr {
    raw_upstream(move |s| serve(s, huge.clone())).await
}

async fn serve(mut s: TcpStream, huge: Arc<Huge>) {
    let mut buf = Vec::new();
    while let Some(head) = read_request_head(&mut s, &mut buf).await {
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        const TEXT: &str = "content-type: text/plain\r\n";
        let body = noise(BIG);
        let out = match path.rsplit('/').next().unwrap_or("") {
            "big" => {
                let mut out =
                    format!("HTTP/1.1 200 OK\r\n{TEXT}content-length: {BIG}\r\n\r\n").into_bytes();
                out.extend_from_slice(&body);
                out
            }
            "chunked" => {
                let mut out =
                    format!("HTTP/1.1 200 OK\r\n{TEXT}transfer-encoding: chunked\r\n\r\n")
                        .into_bytes();
                for piece in body.chunks(8 * 1024) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                out
            }
            "huge" => {
                let head = format!("HTTP/1.1 200 OK\r\n{TEXT}content-length: {HUGE}\r\n\r\n");
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = vec![b'x'; 64 * 1024];
                let mut left = HUGE;
                while left > 0 {
                    if s.write_all(&piece).await.is_err() {
                        huge.dropped.store(true, Ordering::SeqCst);
                        return;
                    }
                    huge.written.fetch_add(piece.len() as u64, Ordering::SeqCst);
                    left -= piece.len() as u64;
                }
                continue;
            }
            _ => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
        };
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// `GET url` read whole: the body and the time it took, measured by the client.
async fn timed(c: &reqwest::Client, url: String, headers: &[(&str, &str)]) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut req = c.get(&url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200, "{url}");
    let body = res.bytes().await.unwrap().to_vec();
    (body, start.elapsed())
}

fn paced(t: Duration, what: &str) {
    // 192 KiB past the free 64 KiB at 64 KiB/s: 3 s (less a tenth of a second's burst).
    assert!(
        t >= Duration::from_millis(2_500) && t < Duration::from_secs(6),
        "{what}: {t:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limited_route_is_paced_and_a_plain_one_is_fast() {
    let up = upstream_of(Arc::default()).await;
    let u = format!("http://{up}");
    let rate = "limit_rate = \"64k\"\nlimit_rate_after = \"64k\"";
    let routes = route("slow", "/slow", &u, rate)
        + &route(
            "zip",
            "/zip",
            &u,
            &format!("{rate}\n[routes.compression]\ntypes = [\"text/plain\"]\n"),
        )
        + &route("fast", "/fast", &u, "");
    let gw = gateway(&config("backend = \"memory\"", &routes));
    wait_ready(&gw).await;
    let c = client();
    let want = noise(BIG);
    // Unpaced first: fast.
    let (body, t) = timed(&c, gw.url("/fast/big"), &[]).await;
    assert_eq!(body, want);
    assert!(t < Duration::from_millis(1_500), "the plain route: {t:?}");
    // Three paced responses at once: each response has its own pace (nginx's `limit_rate`).
    let gzip = [("accept-encoding", "gzip")];
    let (big, chunked, zip) = tokio::join!(
        timed(&c, gw.url("/slow/big"), &[]),
        timed(&c, gw.url("/slow/chunked"), &[]),
        async {
            let start = Instant::now();
            let res = c
                .get(gw.url("/zip/big"))
                .header(gzip[0].0, gzip[0].1)
                .send()
                .await
                .unwrap();
            assert_eq!(res.headers()["content-encoding"], "gzip");
            // Counted in compressed bytes (noise: about as many).
            let n = res.bytes().await.unwrap().len();
            assert!(n >= BIG, "{n}");
            start.elapsed()
        },
    );
    assert_eq!(big.0, want);
    paced(big.1, "Content-Length body");
    assert_eq!(chunked.0, want);
    paced(chunked.1, "chunked body");
    paced(zip, "compressed body");
}

/// `[consumers]` reading `X-Api-Key` with consumers `gold` (plan `gold`: `limit_rate = 0`) and
/// `free` (plan `free`: `limit_rate = "128k"`), on a route of `limit_rate = "32k"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plans_rate_wins_over_the_routes() {
    use tollgate::consumers::{hash_key, hex};
    let up = upstream_of(Arc::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    let entries: String = [("gold", "gold-key"), ("free", "free-key")]
        .iter()
        .map(|(name, key)| {
            format!(
                "[[consumer]]\nname = \"{name}\"\nplan = \"{name}\"\nkey_sha256 = \"{}\"\n\n",
                hex(&hash_key(key.as_bytes()))
            )
        })
        .collect();
    std::fs::write(&file, entries).unwrap();
    let top = format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = \"{}\"\non_unknown = \"anon\"\n\n[[plans]]\nname = \"gold\"\nlimit_rate = 0\n\n[[plans]]\nname = \"free\"\nlimit_rate = \"128k\"\n\n[[plans]]\nname = \"anon\"\n\n",
        file.display()
    ) + &route(
        "api",
        "/api",
        &format!("http://{up}"),
        "consumers = true\nlimit_rate = \"32k\"",
    );
    let gw = gateway(&config("backend = \"memory\"", &top));
    wait_ready(&gw).await;
    let c = client();
    let want = noise(BIG);
    let (gold, free, anon) = tokio::join!(
        timed(&c, gw.url("/api/big"), &[("x-api-key", "gold-key")]),
        timed(&c, gw.url("/api/big"), &[("x-api-key", "free-key")]),
        timed(&c, gw.url("/api/big"), &[("x-api-key", "nobody")]),
    );
    assert_eq!(gold.0, want);
    assert_eq!(free.0, want);
    assert_eq!(anon.0, want);
    // gold: no limit at all.
    assert!(gold.1 < Duration::from_millis(1_500), "gold: {:?}", gold.1);
    // free: 256 KiB at 128 KiB/s, 2 s; far from the route's 8 s.
    assert!(
        free.1 >= Duration::from_millis(1_600) && free.1 < Duration::from_secs(5),
        "free: {:?}",
        free.1
    );
    // A plan without `limit_rate` (`on_unknown`'s): the route's 32 KiB/s, 8 s.
    assert!(anon.1 >= Duration::from_millis(6_500), "anon: {:?}", anon.1);
}

/// A 64 MiB body under a small rate to a client that reads slowly: the upstream is read no
/// faster than the client is written (what the upstream wrote stays within the sockets'
/// buffers of what the client read), the gateway's memory does not grow by the body, and the
/// client leaving mid-body drops the upstream's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_client_holds_back_the_upstream_and_memory_stays_flat() {
    let huge = Arc::new(Huge::default());
    let up = upstream_of(huge.clone()).await;
    let routes = route(
        "slow",
        "/slow",
        &format!("http://{up}"),
        "limit_rate = \"1m\"",
    );
    let gw = gateway(&config("backend = \"memory\"", &routes));
    wait_ready(&gw).await;
    let rss_before = rss(gw.child.id());
    let addr = gw
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET /slow/huge HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // A slow reader: 64 KiB every 100 ms (some 640 KiB/s, below the rate), for 3 s.
    let mut read = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the gateway closed early");
        read += n as u64;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written = huge.written.load(Ordering::SeqCst);
    let grown = rss(gw.child.id()).saturating_sub(rss_before);
    assert!(read > 256 * 1024 && read < 8 << 20, "read {read}");
    // Loopback sockets buffer a few MiB each way (the upstream's send buffer, the gateway's
    // receive buffer): a gateway that read ahead would have taken all 64 MiB by now.
    assert!(
        written < read + (24 << 20),
        "the upstream wrote {written} bytes for {read} read by the client"
    );
    assert!(grown < 24 << 20, "RSS grew by {grown} bytes");
    // The client leaves mid-body: the gateway drops the upstream's connection.
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !huge.dropped.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the upstream was never dropped (wrote {})",
            huge.written.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(huge.written.load(Ordering::SeqCst) < HUGE);
}
