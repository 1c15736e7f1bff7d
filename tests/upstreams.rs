//! `[[upstreams]]` groups end to end: real backends in this process (each can be killed and
//! restarted on its port), the gateway as a process. Balancing, failover without client errors,
//! no replay of streamed bodies, passive and active health, ip_hash, HTTPS upstreams, and
//! `tollgate check` on bad groups.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use support::{client, gateway, metric, metric_sum, tollgate_bin, Gateway};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// What a backend shares with its test.
#[derive(Default)]
struct BackendState {
    /// Requests other than health checks.
    hits: AtomicUsize,
    /// POSTs received.
    posts: AtomicUsize,
    /// `/healthz` answers 503 while false.
    unhealthy: AtomicBool,
    /// The SNI of the last TLS handshake.
    sni: Mutex<Option<String>>,
}

/// A backend on 127.0.0.1 that answers `x-server: <id>`; `kill` closes its listener and every
/// connection at once, `restart` listens on the same port again.
struct Backend {
    id: usize,
    addr: SocketAddr,
    state: Arc<BackendState>,
    task: Option<tokio::task::JoinHandle<()>>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn handle(
    id: usize,
    state: Arc<BackendState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (parts, mut body) = req.into_parts();
    if parts.uri.path() == "/healthz" {
        let mut res = Response::new(Full::new(Bytes::new()));
        if state.unhealthy.load(Ordering::SeqCst) {
            *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        }
        return Ok(res);
    }
    state.hits.fetch_add(1, Ordering::SeqCst);
    if parts.method == http::Method::POST {
        state.posts.fetch_add(1, Ordering::SeqCst);
    }
    if parts.uri.path().ends_with("/die") {
        // Read the first chunk of the body, then drop the connection.
        let _ = body.frame().await;
        return Err(std::io::Error::other("backend dies mid-body"));
    }
    let mut len = 0;
    while let Some(Ok(f)) = body.frame().await {
        len += f.data_ref().map_or(0, |d| d.len());
    }
    if parts.uri.path().ends_with("/slow") {
        // Answers 1 s after the body ended.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut res = Response::new(Full::new(Bytes::from(format!("{id} {len}"))));
    res.headers_mut().insert("x-server", id.into());
    if let Some(sni) = state.sni.lock().unwrap().clone() {
        res.headers_mut().insert("x-sni", sni.parse().unwrap());
    }
    Ok(res)
}

impl Backend {
    async fn start(id: usize) -> Backend {
        Backend::start_tls(id, None).await
    }

    async fn start_tls(id: usize, tls: Option<Arc<rustls::ServerConfig>>) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut b = Backend {
            id,
            addr: listener.local_addr().unwrap(),
            state: Arc::default(),
            task: None,
            tls,
        };
        b.serve(listener);
        b
    }

    fn serve(&mut self, listener: TcpListener) {
        let (id, state, tls) = (self.id, self.state.clone(), self.tls.clone());
        self.task = Some(tokio::spawn(async move {
            // The connections live in the set: aborting this task drops them all.
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (state, tls) = (state.clone(), tls.clone());
                conns.spawn(async move {
                    let svc = {
                        let state = state.clone();
                        service_fn(move |req| handle(id, state.clone(), req))
                    };
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        Some(cfg) => {
                            let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(stream).await
                            else {
                                return;
                            };
                            *state.sni.lock().unwrap() =
                                s.get_ref().1.server_name().map(str::to_owned);
                            let _ = http.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        }));
    }

    fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
    fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }
    fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
    fn set_healthy(&self, healthy: bool) {
        self.state.unhealthy.store(!healthy, Ordering::SeqCst);
    }
}

async fn backends(n: usize) -> Vec<Backend> {
    let mut v = Vec::new();
    for id in 0..n {
        v.push(Backend::start(id).await);
    }
    v
}

/// A config: one worker (deterministic balancing), loopback trusted for X-Forwarded-For, the
/// given `[[upstreams]]` tables and one route `/api` to `upstream`.
fn cfg(upstreams: &str, upstream: &str, route_extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n{upstreams}\n\
         [[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"{upstream}\"\ntimeout = \"2s\"\n{route_extra}\n"
    )
}

fn servers(bs: &[&Backend]) -> String {
    let urls: Vec<String> = bs.iter().map(|b| format!("{:?}", b.url())).collect();
    format!("servers = [{}]", urls.join(", "))
}

fn up_series(b: &Backend) -> String {
    format!(
        "tollgate_upstream_server_up{{upstream=\"g\",server=\"{}\"}}",
        b.addr
    )
}

/// Waits until the scrape shows `series` at `want` (active checks run in the background).
async fn wait_metric(gw: &Gateway, series: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = gw.metrics().await;
        if metric(&text, series) == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never became {want}:\n{text}\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(gw: &Gateway, path: &str) -> (u16, Option<usize>, String) {
    let r = client().get(gw.url(path)).send().await.unwrap();
    let status = r.status().as_u16();
    let server = r
        .headers()
        .get("x-server")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (status, server, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn round_robin_spreads_by_weight_and_counts_per_server() {
    let b = backends(3).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{:?}, {{ url = {:?}, weight = 2 }}, {{ url = {:?}, weight = 3 }}]\n",
        b[0].url(),
        b[1].url(),
        b[2].url()
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let c = client();
    for _ in 0..120 {
        let r = c.get(gw.url("/api/x")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    // Smooth weighted round robin is exact over whole cycles of 6.
    assert_eq!([b[0].hits(), b[1].hits(), b[2].hits()], [20, 40, 60]);
    let text = gw.metrics().await;
    let requests = |i: usize| {
        metric(
            &text,
            &format!(
                "tollgate_upstream_requests_total{{upstream=\"g\",server=\"{}\",class=\"2xx\"}}",
                b[i].addr
            ),
        )
    };
    assert_eq!(
        [requests(0), requests(1), requests(2)],
        [Some(20.0), Some(40.0), Some(60.0)]
    );
    assert_eq!(metric(&text, &up_series(&b[1])), Some(1.0));
    assert_eq!(
        metric(&text, "tollgate_upstream_retries_total{upstream=\"g\"}"),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn weights_hold_across_workers_within_a_tolerance() {
    let b = backends(2).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{:?}, {{ url = {:?}, weight = 3 }}]\n",
        b[0].url(),
        b[1].url()
    );
    let gw = gateway(&cfg(&group, "g", "").replace("workers = 1", "workers = 2"));
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let url = gw.url("/api/x");
        tasks.spawn(async move {
            // A fresh client per task: new connections spread over both workers.
            let c = client();
            for _ in 0..50 {
                assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let (h0, h1) = (b[0].hits() as f64, b[1].hits() as f64);
    assert_eq!(h0 + h1, 400.0);
    assert!((h1 / 400.0 - 0.75).abs() < 0.05, "{h0} vs {h1}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_a_server_mid_load_fails_no_get() {
    let mut b = backends(3).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\nretries = 2\nfail_timeout = \"30s\"\n",
        servers(&[&b[0], &b[1], &b[2]])
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..4 {
        let (url, done) = (gw.url("/api/x"), done.clone());
        tasks.spawn(async move {
            let c = client();
            for _ in 0..150 {
                let r = c.get(&url).send().await.unwrap();
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
                done.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while done.load(Ordering::SeqCst) < 150 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b[1].kill();
    let killed_at = b[1].hits();
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert!(b[1].hits() <= killed_at + 4);
    assert!(b[0].hits() + b[1].hits() + b[2].hits() >= 600);
    let text = gw.metrics().await;
    assert_eq!(metric(&text, &up_series(&b[1])), Some(0.0), "{text}");
    assert_eq!(metric(&text, &up_series(&b[0])), Some(1.0));
    assert!(
        metric(&text, "tollgate_upstream_retries_total{upstream=\"g\"}").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_body_is_never_replayed_but_an_unsent_one_is() {
    let b = backends(2).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\nretries = 1\n",
        servers(&[&b[0], &b[1]])
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let chunks = || {
        let s = futures_util::stream::iter(
            (0..4).map(|_| Ok::<_, Infallible>(Bytes::from(vec![b'x'; 1000]))),
        );
        reqwest::Body::wrap_stream(s)
    };
    let r = client()
        .post(gw.url("/api/die"))
        .body(chunks())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let posts = b[0].state.posts.load(Ordering::SeqCst) + b[1].state.posts.load(Ordering::SeqCst);
    assert_eq!(posts, 1, "the streamed POST was replayed");

    // A refused connection sent nothing: the same streamed POST goes to the next server whole.
    let dead = format!("http://127.0.0.1:{}", support::free_port());
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{dead:?}, {:?}]\nretries = 1\n",
        b[1].url()
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let r = client()
        .post(gw.url("/api/echo"))
        .body(chunks())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "1 4000");
    let text = gw.metrics().await;
    assert_eq!(
        metric(&text, "tollgate_upstream_retries_total{upstream=\"g\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            &format!(
                "tollgate_upstream_requests_total{{upstream=\"g\",server=\"{}\",class=\"error\"}}",
                &dead[7..]
            )
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_server_is_out_for_fail_timeout_then_back_on_trial() {
    let mut b = backends(2).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\nmax_fails = 1\nfail_timeout = \"600ms\"\n",
        servers(&[&b[0], &b[1]])
    );
    let gw = gateway(&cfg(&group, "g", ""));
    b[0].kill();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The first request meets the dead server and is retried on the other.
    for _ in 0..4 {
        let (status, server, _) = get(&gw, "/api/x").await;
        assert_eq!((status, server), (200, Some(1)));
    }
    assert_eq!(metric(&gw.metrics().await, &up_series(&b[0])), Some(0.0));
    b[0].restart().await;
    // Still out: no request reaches it before fail_timeout.
    for _ in 0..4 {
        assert_eq!(get(&gw, "/api/x").await.1, Some(1));
    }
    assert_eq!(b[0].hits(), 0);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(get(&gw, "/api/x").await.1);
    }
    assert!(seen.contains(&Some(0)), "never back: {seen:?}");
    assert_eq!(metric(&gw.metrics().await, &up_series(&b[0])), Some(1.0));
}

/// Sends `POST path` with a 10-byte `Content-Length` body on a raw connection: `sent` bytes
/// of it, one every `gap`, then nothing more; returns the status and how long the answer took
/// from the head's write.
async fn slow_upload(gw: &Gateway, path: &str, sent: usize, gap: Duration) -> (u16, Duration) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let s = tokio::net::TcpStream::connect(gw.http_addr())
        .await
        .unwrap();
    let (mut rd, mut wr) = s.into_split();
    let t0 = Instant::now();
    wr.write_all(
        format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    // The write half stays open (its drop would send a FIN) until the answer is read.
    let writer = tokio::spawn(async move {
        for b in b"0123456789".iter().take(sent) {
            tokio::time::sleep(gap).await;
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(wr);
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while got.len() < 12 {
        let n = tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf))
            .await
            .expect("no answer in 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed without an answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let took = t0.elapsed();
    writer.abort();
    let status = std::str::from_utf8(&got[9..12]).unwrap().parse().unwrap();
    (status, took)
}

/// The route's `timeout` is the upstream's time from the request's end: a slow but legal upload
/// is the client's (`body_read_timeout`, 408), never a 504, never an upstream timeout, never a
/// failure of the server for passive health (#34 item 11).
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_upload_is_the_clients_time_not_the_upstreams() {
    let b = backends(2).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\nmax_fails = 1\nfail_timeout = \"30s\"\n",
        servers(&[&b[0], &b[1]])
    );
    // `/api`: the group; `/direct`: a route's own URL (a group of one; its own client on the
    // hyper front).
    let direct = format!(
        "[[routes]]\nname = \"direct\"\npath_prefix = \"/direct\"\nupstream = \"{}\"\ntimeout = \"300ms\"\n",
        b[0].url()
    );
    let gw = gateway(
        &(cfg(&group, "g", "")
            .replace("timeout = \"2s\"", "timeout = \"300ms\"")
            .replacen("[server]\n", "[server]\nbody_read_timeout = \"800ms\"\n", 1)
            + &direct),
    );
    let timeouts = |m: &str| metric_sum(m, "tollgate_upstream_errors_total", &["kind=\"timeout\""]);
    // A body that takes 1.2 s (a byte every 120 ms, each gap well inside body_read_timeout):
    // longer than the route's timeout, and answered.
    for path in ["/api/up", "/api/up", "/direct/up"] {
        let (status, took) = slow_upload(&gw, path, 10, Duration::from_millis(120)).await;
        assert_eq!(status, 200, "{path}: a slow upload answered after {took:?}");
        assert!(took >= Duration::from_millis(1000), "{took:?}");
    }
    // A body that stops: 408 after body_read_timeout, not 504 after the route's timeout.
    for path in ["/api/up", "/direct/up"] {
        let (status, took) = slow_upload(&gw, path, 3, Duration::from_millis(50)).await;
        assert_eq!(status, 408, "{path}: a stalled body after {took:?}");
        assert!(took >= Duration::from_millis(800), "{took:?}");
    }
    let m = gw.metrics().await;
    assert_eq!(timeouts(&m), 0.0, "{m}");
    assert_eq!(metric(&m, &up_series(&b[0])), Some(1.0), "{m}");
    assert_eq!(metric(&m, &up_series(&b[1])), Some(1.0), "{m}");
    // The upstream's own time still counts from the request's end: 504 at the timeout.
    for (i, path) in ["/api/slow", "/direct/slow"].into_iter().enumerate() {
        let (status, took) = slow_upload(&gw, path, 10, Duration::from_millis(10)).await;
        assert_eq!(status, 504, "{path}: after {took:?}");
        assert!(took < Duration::from_millis(900), "{path}: {took:?}");
        let m = gw.metrics().await;
        assert_eq!(timeouts(&m), (i + 1) as f64, "{m}");
    }
}

/// An upstream that takes no byte of a body keeps the request waiting: that is the upstream's
/// time, and the route's `timeout` ends it with 504 (the client sends as fast as it can).
#[tokio::test(flavor = "multi_thread")]
async fn an_upstream_that_takes_no_body_times_out() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let route = format!(
        "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://{up}\"\ntimeout = \"500ms\"\nmax_body_size = 1073741824\n"
    );
    let gw = gateway(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n{route}"
    ));
    let s = tokio::net::TcpStream::connect(gw.http_addr())
        .await
        .unwrap();
    let (mut rd, mut wr) = s.into_split();
    let t0 = Instant::now();
    let writer = tokio::spawn(async move {
        let _ = wr
            .write_all(b"POST /api/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
            .await;
        let chunk = vec![b'x'; 64 * 1024];
        while wr.write_all(&chunk).await.is_ok() {}
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while got.len() < 12 {
        let n = tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf))
            .await
            .expect("no answer in 10 s")
            .unwrap_or(0);
        assert!(n > 0, "closed without an answer");
        got.extend_from_slice(&buf[..n]);
    }
    writer.abort();
    assert!(
        got.starts_with(b"HTTP/1.1 504"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let m = gw.metrics().await;
    assert_eq!(
        metric_sum(&m, "tollgate_upstream_errors_total", &["kind=\"timeout\""]),
        1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn active_checks_take_servers_out_and_back_and_none_live_is_an_immediate_502() {
    let b = backends(2).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\n[upstreams.health_check]\npath = \"/healthz\"\n\
         interval = \"100ms\"\ntimeout = \"500ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n",
        servers(&[&b[0], &b[1]])
    );
    let gw = gateway(&cfg(&group, "g", ""));
    b[0].set_healthy(false);
    wait_metric(&gw, &up_series(&b[0]), 0.0).await;
    let before = b[0].hits();
    for _ in 0..6 {
        assert_eq!(get(&gw, "/api/x").await.1, Some(1));
    }
    assert_eq!(b[0].hits(), before);

    b[1].set_healthy(false);
    wait_metric(&gw, &up_series(&b[1]), 0.0).await;
    let t = Instant::now();
    let (status, _, body) = get(&gw, "/api/x").await;
    assert_eq!(status, 502);
    assert!(body.contains("no live upstream"), "{body}");
    assert!(t.elapsed() < Duration::from_millis(500));
    assert_eq!(b[1].hits(), 6);

    b[0].set_healthy(true);
    b[1].set_healthy(true);
    wait_metric(&gw, &up_series(&b[0]), 1.0).await;
    wait_metric(&gw, &up_series(&b[1]), 1.0).await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..4 {
        seen.insert(get(&gw, "/api/x").await.1);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

/// A server whose health endpoint answers 200 with a 256 MiB body (a status page that dumps
/// everything, a misrouted download) while `streaming`, else an empty 200. Counts the checks.
async fn big_health_body_server(
    streaming: Arc<AtomicBool>,
    checks: Arc<AtomicUsize>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use futures_util::StreamExt as _;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (streaming, checks) = (streaming.clone(), checks.clone());
            conns.spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    checks.fetch_add(1, Ordering::SeqCst);
                    let chunks = if streaming.load(Ordering::SeqCst) {
                        4096
                    } else {
                        0
                    };
                    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                    let body =
                        http_body_util::StreamBody::new(futures_util::stream::iter(0..chunks).map(
                            move |_| Ok::<_, Infallible>(hyper::body::Frame::data(chunk.clone())),
                        ));
                    async move { Ok::<_, Infallible>(Response::new(body)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
            while conns.try_join_next().is_some() {}
        }
    });
    (addr, task)
}

/// Only the status of a health check matters: the gateway reads a few KB of the body and
/// closes the connection. It used to read the whole body into memory, at every interval: a
/// health endpoint that streams 256 MiB took the gateway's RSS up by as much.
#[tokio::test(flavor = "multi_thread")]
async fn an_active_check_reads_a_few_kb_of_the_body_and_keeps_memory_small() {
    let streaming = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicUsize::new(0));
    let (addr, _server) = big_health_body_server(streaming.clone(), checks.clone()).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [\"http://{addr}\"]\n[upstreams.health_check]\n\
         path = \"/healthz\"\ninterval = \"200ms\"\ntimeout = \"5s\"\nhealthy_threshold = 1\n\
         unhealthy_threshold = 1\n"
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let series = format!("tollgate_upstream_server_up{{upstream=\"g\",server=\"{addr}\"}}");
    wait_metric(&gw, &series, 1.0).await;
    let pid = gw.child.id();
    let before = support::rss(pid);

    streaming.store(true, Ordering::SeqCst);
    let armed = checks.load(Ordering::SeqCst);
    let mut peak = before;
    let deadline = Instant::now() + Duration::from_secs(10);
    // At least three checks against the big body, however slow the machine.
    while checks.load(Ordering::SeqCst) < armed + 4 && Instant::now() < deadline {
        peak = peak.max(support::rss(pid));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    peak = peak.max(support::rss(pid));
    let checked = checks.load(Ordering::SeqCst) - armed;
    assert!(checked >= 3, "only {checked} checks in 10 s: {}", gw.logs());
    let mb = |b: u64| b >> 20;
    eprintln!(
        "RSS {} MB before, peak {} MB over {checked} checks",
        mb(before),
        mb(peak)
    );
    assert!(
        peak <= before + (32 << 20),
        "RSS {} MB before the big health bodies, peak {} MB over {checked} checks",
        mb(before),
        mb(peak)
    );
    // A 200 is healthy, whatever follows it.
    assert_eq!(metric(&gw.metrics().await, &series), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn ip_hash_keeps_a_client_on_its_server_and_moves_only_a_lost_servers_clients() {
    let mut b = backends(3).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\nbalance = \"ip_hash\"\nretries = 2\n",
        servers(&[&b[0], &b[1], &b[2]])
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let c = client();
    let server_of = |ip: String| {
        let c = c.clone();
        let url = gw.url("/api/x");
        async move {
            let r = c
                .get(url)
                .header("x-forwarded-for", ip)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.headers()["x-server"]
                .to_str()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        }
    };
    let mut home = Vec::new();
    for n in 1..=30 {
        let ip = format!("198.51.100.{n}");
        let first = server_of(ip.clone()).await;
        for _ in 0..3 {
            assert_eq!(server_of(ip.clone()).await, first, "{ip} moved");
        }
        home.push((ip, first));
    }
    let used: std::collections::HashSet<usize> = home.iter().map(|h| h.1).collect();
    assert_eq!(used.len(), 3, "{home:?}");
    b[2].kill();
    for (ip, was) in &home {
        let now = server_of(ip.clone()).await;
        if *was == 2 {
            assert_ne!(now, 2);
        } else {
            assert_eq!(now, *was, "{ip} moved though its server is live");
        }
    }
}

/// Issue #25 item 7: a trusted proxy that sends `Forwarded` (`forwarded_header = "forwarded"`):
/// `ip_hash` balances on the client it names, as limits and the access log do (one client
/// address per request), not on the proxy's own address (which would put every client on one
/// server). Issue #34 item 17: a client's `X-Forwarded-For` then moves no one.
#[tokio::test(flavor = "multi_thread")]
async fn ip_hash_balances_on_the_client_a_trusted_proxy_names_in_forwarded() {
    let b = backends(3).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\n{}\nbalance = \"ip_hash\"\n",
        servers(&[&b[0], &b[1], &b[2]])
    );
    let gw = gateway(&cfg(&group, "g", "").replacen(
        "[server]\n",
        "[server]\nforwarded_header = \"Forwarded\"\n",
        1,
    ));
    let c = client();
    let server_of = |forwarded: String, xff: Option<&'static str>| {
        let c = c.clone();
        let url = gw.url("/api/x");
        async move {
            let mut r = c.get(url).header("forwarded", forwarded);
            if let Some(x) = xff {
                r = r.header("x-forwarded-for", x);
            }
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.headers()["x-server"]
                .to_str()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        }
    };
    let mut used = std::collections::HashSet::new();
    for n in 1..=30 {
        let ip = format!("198.51.100.{n}");
        let by_forwarded = server_of(format!("for={ip};proto=http"), None).await;
        let with_xff = server_of(format!("for={ip}"), Some("203.0.113.1")).await;
        assert_eq!(
            by_forwarded, with_xff,
            "{ip}: a client's X-Forwarded-For moved it"
        );
        used.insert(by_forwarded);
    }
    assert_eq!(
        used.len(),
        3,
        "30 clients named in Forwarded all on {used:?}"
    );
}

/// A CA and a server certificate for `api.internal` and 127.0.0.1 signed by it; returns the
/// server's rustls config and the CA's PEM.
fn pki() -> (Arc<rustls::ServerConfig>, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Tollgate test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["api.internal".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params
        .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
        .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    (Arc::new(server), ca.pem())
}

#[tokio::test(flavor = "multi_thread")]
async fn https_upstreams_verify_against_tls_ca_send_sni_and_refuse_unknown_issuers() {
    let (server_tls, ca_pem) = pki();
    let b = Backend::start_tls(7, Some(server_tls)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &ca_pem).unwrap();
    let ca_line = format!("ca = {:?}\n", ca.display().to_string());

    // tls.ca: verified, by IP (no SNI for an address).
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{:?}]\n[upstreams.tls]\n{ca_line}",
        b.url()
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let (status, server, body) = get(&gw, "/api/x").await;
    assert_eq!((status, server), (200, Some(7)), "{body}");

    // server_name: the SNI and the name checked.
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{:?}]\n[upstreams.tls]\n{ca_line}server_name = \"api.internal\"\n",
        b.url()
    );
    let gw = gateway(&cfg(&group, "g", ""));
    let r = client().get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-sni"], "api.internal");
    // A name the certificate does not carry is refused.
    let group = group.replace("api.internal", "other.internal");
    let gw = gateway(&cfg(&group, "g", ""));
    let (status, _, body) = get(&gw, "/api/x").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("certificate"), "{body}");

    // Without tls.ca (a route's own https:// URL: the platform's roots): refused, counted.
    let hits = b.hits();
    let gw = gateway(&cfg("", &b.url(), ""));
    let (status, _, body) = get(&gw, "/api/x").await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("TLS") && body.contains("UnknownIssuer"),
        "{body}"
    );
    assert_eq!(b.hits(), hits);
    let text = gw.metrics().await;
    assert_eq!(
        metric(
            &text,
            "tollgate_upstream_errors_total{route=\"api\",kind=\"tls\"}"
        ),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_false_connects_to_any_certificate_and_warns() {
    let (server_tls, _) = pki();
    let b = Backend::start_tls(3, Some(server_tls)).await;
    let group = format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{:?}]\n[upstreams.tls]\nverify = false\n",
        b.url()
    );
    let config = cfg(&group, "g", "");
    let gw = gateway(&config);
    let (status, server, body) = get(&gw, "/api/x").await;
    assert_eq!((status, server), (200, Some(3)), "{body}");
    assert!(
        gw.logged("`upstreams[0].tls.verify` is false").await,
        "{}",
        gw.logs()
    );
    let (ok, output) = check(&config);
    assert!(ok, "{output}");
    assert!(
        output.contains("warning") && output.contains("tls.verify"),
        "{output}"
    );
}

/// Runs `tollgate check` on `config`; returns success and stdout + stderr.
fn check(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .arg("--config")
        .arg(&path)
        .arg("check")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn check_names_the_bad_key_of_a_group() {
    let ok = "[[upstreams]]\nname = \"g\"\nservers = [\"http://127.0.0.1:3001\", { url = \"https://127.0.0.1:3002\", weight = 2 }]\n";
    let (passed, output) = check(&cfg(
        "[[upstreams]]\nname = \"g\"\nservers = [\"http://127.0.0.1:3001\"]\n",
        "g",
        "",
    ));
    assert!(passed && output.contains("1 upstream group(s)"), "{output}");

    let (passed, output) = check(&cfg(
        "[[upstreams]]\nname = \"g\"\nservers = [\"http://127.0.0.1:3001\"]\n",
        "users",
        "",
    ));
    assert!(
        !passed && output.contains("routes[0].upstream") && output.contains("users"),
        "{output}"
    );

    let bad_url = cfg(
        "[[upstreams]]\nname = \"g\"\nservers = [\"http://127.0.0.1:3001\", \"http://127.0.0.1:99999\"]\n",
        "g",
        "",
    );
    let line = 1 + bad_url
        .lines()
        .position(|l| l.starts_with("servers"))
        .unwrap();
    let (passed, output) = check(&bad_url);
    assert!(
        !passed
            && output.contains("servers")
            && output.contains(&format!("line {line}"))
            && output.contains("99999"),
        "{output}"
    );

    let (passed, output) = check(&cfg(
        &ok.replace("http://127.0.0.1:3001", "https://127.0.0.1:3001")
            .replace(
                "weight = 2 }]",
                "weight = 2 }]\n[upstreams.tls]\nca = \"missing-ca.pem\"",
            ),
        "g",
        "",
    ));
    assert!(
        !passed && output.contains("upstreams[0].tls.ca") && output.contains("missing-ca.pem"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_keeps_the_health_of_servers_that_stay_and_drops_removed_ones() {
    let mut b = backends(2).await;
    let group =
        |servers: &str| format!("[[upstreams]]\nname = \"g\"\n{servers}\nfail_timeout = \"30s\"\n");
    let gw = gateway(&cfg(&group(&servers(&[&b[0], &b[1]])), "g", ""));
    b[0].kill();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(get(&gw, "/api/x").await.0, 200);
    assert_eq!(metric(&gw.metrics().await, &up_series(&b[0])), Some(0.0));
    b[0].restart().await;

    // Same group, another route: server 0 stays out for the rest of its fail_timeout.
    gw.write_config(
        &(cfg(&group(&servers(&[&b[0], &b[1]])), "g", "")
            + "[[routes]]\nname = \"other\"\npath_prefix = \"/other\"\nupstream = \"g\"\n"),
    );
    let r = client()
        .post(gw.admin_url("/-/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for _ in 0..6 {
        assert_eq!(get(&gw, "/api/x").await.1, Some(1));
    }
    assert_eq!(b[0].hits(), 0);
    assert_eq!(metric(&gw.metrics().await, &up_series(&b[0])), Some(0.0));

    // Server 0 removed: its series are gone (Prometheus marks them stale), so no alert keeps
    // firing on it.
    gw.write_config(&cfg(&group(&servers(&[&b[1]])), "g", ""));
    let r = client()
        .post(gw.admin_url("/-/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = gw.metrics().await;
    assert!(
        !text.contains(&format!("server=\"{}\"", b[0].addr)),
        "{text}"
    );
    assert_eq!(metric(&text, &up_series(&b[1])), Some(1.0));
}

/// Pod IP churn: every reload replaces a group's server with a new address. Only the servers
/// and groups of the configuration that serves have series: a removed server's (and a removed
/// group's) go at once, so `/metrics` stays the same size however many reloads there were.
/// They used to stay, at NaN, until a restart: 300 such reloads took `/metrics` from 47 lines
/// to 2,147.
#[tokio::test(flavor = "multi_thread")]
async fn reloads_that_replace_servers_keep_metrics_bounded() {
    let b = backends(1).await;
    let config = |churn: u16, with_h: bool| {
        let mut groups = format!(
            "[[upstreams]]\nname = \"g\"\nservers = [{:?}, \"http://127.0.0.1:{churn}\"]\n",
            b[0].url()
        );
        if with_h {
            groups.push_str("[[upstreams]]\nname = \"h\"\nservers = [\"http://127.0.0.1:9\"]\n");
        }
        cfg(&groups, "g", "")
    };
    let gw = gateway(&config(20_000, true));
    let c = client();
    let reload = |toml: String| {
        gw.write_config(&toml);
        let (c, url) = (c.clone(), gw.admin_url("/-/reload"));
        async move {
            let r = c.post(url).send().await.unwrap();
            let status = r.status().as_u16();
            assert_eq!(status, 200, "{}", r.text().await.unwrap());
        }
    };
    assert_eq!(get(&gw, "/api/x").await.0, 200);
    let lines = |text: &str| text.lines().count();
    let start = gw.metrics().await;
    for i in 1..=100u16 {
        reload(config(20_000 + i, true)).await;
    }
    let text = gw.metrics().await;
    let series = |upstream: &str, server: &str| {
        format!("tollgate_upstream_server_up{{upstream=\"{upstream}\",server=\"{server}\"}}")
    };
    assert_eq!(
        lines(&text),
        lines(&start),
        "/metrics grew with 100 reloads that replaced a server:\n{text}"
    );
    assert_eq!(
        metric(&text, &series("g", "127.0.0.1:20100")),
        Some(1.0),
        "the configured server's series:\n{text}"
    );
    assert!(
        !text.contains("127.0.0.1:20000") && !text.contains("127.0.0.1:20099\""),
        "a removed server's series is still exported:\n{text}"
    );
    // What stays keeps counting.
    let b0 = b[0].addr.to_string();
    assert_eq!(
        metric(
            &text,
            &format!(
                "tollgate_upstream_requests_total{{upstream=\"g\",server=\"{b0}\",class=\"2xx\"}}"
            )
        ),
        Some(1.0),
        "{text}"
    );

    // A removed group's series go too.
    reload(config(20_100, false)).await;
    let text = gw.metrics().await;
    assert!(
        !text.contains("upstream=\"h\""),
        "a removed group's series are still exported:\n{text}"
    );
    assert!(text.contains(&series("g", &b0)), "{text}");
}

/// #34 item 3: a reused upstream connection that closes after a non-idempotent request was
/// written gets the client a 502, and the request is not sent again (the retry rule, one for
/// both fronts). The upstream answers the first request of each connection and closes the
/// connection on reading the second, without an answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_post_on_a_reused_connection_that_closes_is_not_sent_again() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let posts = Arc::new(AtomicUsize::new(0));
    let p = posts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let p = p.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut served = 0;
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        if head.starts_with(b"POST ") {
                            p.fetch_add(1, Ordering::SeqCst);
                        }
                        served += 1;
                        if served > 1 {
                            return;
                        }
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await;
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    let gw = gateway(&cfg("", &format!("http://{addr}"), ""));
    let c = client();
    let r = c.get(gw.url("/api/a")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(gw.url("/api/b"))
        .header("content-length", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502, "{}", r.text().await.unwrap_or_default());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(posts.load(Ordering::SeqCst), 1, "the POST was sent again");
}

/// #35 §1: a status outside 100-599 is a failed attempt on both fronts (one planner): a GET
/// goes on to the group's next server, the bad answer counted among the route's other upstream
/// errors. (The hyper front used to take it as the answer, then refuse it with a 502.)
#[tokio::test(flavor = "multi_thread")]
async fn a_status_over_599_is_a_failed_attempt_on_every_front() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let odd = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        if s.write_all(b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok")
                            .await
                            .is_err()
                        {
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
    let good = Backend::start(1).await;
    let gw = gateway(&cfg(
        &format!(
            "[[upstreams]]\nname = \"g\"\nservers = [\"http://{odd}\", {:?}]\nretries = 1\n",
            good.url()
        ),
        "g",
        "",
    ));
    // Round robin: one of the two starts on the odd server.
    for _ in 0..2 {
        let (status, server, body) = get(&gw, "/api/a").await;
        assert_eq!((status, server), (200, Some(1)), "{body}");
    }
    assert_eq!(
        metric_sum(
            &gw.metrics().await,
            "tollgate_upstream_errors_total",
            &["route=\"api\"", "kind=\"other\""]
        ),
        1.0
    );
}
