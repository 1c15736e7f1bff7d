//! Test harness: real processes on loopback. `upstream()` starts an echo upstream on
//! `127.0.0.1:0`, `gateway(config)` starts the `tollgate` binary on `127.0.0.1:0` ports, and
//! `redis()` starts a private `redis-server` on a free port. Everything is stopped on drop.
#![allow(dead_code)]

pub mod nginx;
pub mod over_h3;
pub mod snippets;

#[allow(unused_imports)]
pub use over_h3::skip_on_h3;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: http::HeaderMap,
    pub body_len: usize,
}

/// An echo upstream running in the test's runtime.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn upstream_handler(
    seen: Arc<Mutex<Vec<Seen>>>,
    hits: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, mut body) = req.into_parts();
    hits.fetch_add(1, Ordering::SeqCst);
    if parts.uri.path().ends_with("/slow") {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let mut body_len = 0;
    let mut max_frame = 0;
    while let Some(frame) = body.frame().await {
        let f = frame?;
        if let Some(d) = f.data_ref() {
            body_len += d.len();
            max_frame = max_frame.max(d.len());
        }
    }
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body_len,
    });
    let mut res = Response::new(Full::new(Bytes::from(format!(
        "{{\"body_len\":{body_len},\"max_frame\":{max_frame}}}"
    ))));
    res.headers_mut()
        .insert("x-upstream", "yes".parse().unwrap());
    // Hop-by-hop headers the gateway must strip from responses.
    res.headers_mut()
        .insert("connection", "x-up-hop".parse().unwrap());
    res.headers_mut()
        .insert("x-up-hop", "secret".parse().unwrap());
    res.headers_mut()
        .insert("keep-alive", "timeout=5".parse().unwrap());
    if let Some((_, code)) = parts.uri.path().rsplit_once("/status/") {
        *res.status_mut() = StatusCode::from_u16(code.parse().unwrap_or(500)).unwrap();
    }
    Ok(res)
}

/// Starts a hand-written upstream on 127.0.0.1:0: `serve` runs on each connection accepted
/// (see [`read_request_head`]).
pub async fn raw_upstream<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            if let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s));
            }
        }
    });
    addr
}

/// The next request head on `s` (read into `buf`, which keeps what follows it), in lower case;
/// `None` when the connection ends first.
pub async fn read_request_head(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    buf.drain(..end);
    Some(head)
}

/// Starts the echo upstream on 127.0.0.1:0.
pub async fn upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hits = Arc::new(AtomicUsize::new(0));
    let (s, h) = (seen.clone(), hits.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (s, h) = (s.clone(), h.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| upstream_handler(s.clone(), h.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Upstream {
        addr,
        seen,
        hits,
        task,
    }
}

/// A running `tollgate` process.
pub struct Gateway {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// `[server] http_redirect_listen`, when the config has one.
    pub redirect: Option<SocketAddr>,
    pub child: Child,
    pub config_path: PathBuf,
    /// `TOLLGATE_TEST_CLIENT=h3`: the adapter [`Gateway::url`] points at, which sends each
    /// request over HTTP/3 to the gateway ([`over_h3`]).
    pub h3: Option<over_h3::Adapter>,
    _dir: tempfile::TempDir,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    /// A URL of the proxy listener; with `TOLLGATE_TEST_CLIENT=h3`, of the adapter that sends
    /// the request over HTTP/3 ([`over_h3`]).
    pub fn url(&self, path: &str) -> String {
        match &self.h3 {
            Some(a) => format!("http://{}{}", a.addr, path),
            None => format!("http://{}{}", self.proxy, path),
        }
    }
    /// Where a well-formed HTTP/1.1 request written by hand reaches the gateway: the proxy
    /// listener, or with `TOLLGATE_TEST_CLIENT=h3` the adapter (which sends it over HTTP/3).
    /// Bytes that test the listener's own HTTP/1 parsing go to `proxy` and skip over HTTP/3.
    pub fn http_addr(&self) -> SocketAddr {
        self.h3.as_ref().map_or(self.proxy, |a| a.addr)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
    /// What the process logged so far.
    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
    /// Whether the gateway logs `needle` within 5 s: its stderr is read by a thread of its own,
    /// so a line written before an answer may be read only after the answer arrives.
    pub async fn logged(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self.logs().contains(needle) {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        true
    }
    /// Sends a signal (e.g. `Signal::TERM`, `Signal::HUP`) to the process.
    pub fn signal(&self, sig: Signal) {
        send_signal(&self.child, sig);
    }
    /// Rewrites the config file (for reload tests).
    pub fn write_config(&self, toml: &str) {
        let text = with_front(toml);
        let adapted = match (&self.h3, self.config_path.parent()) {
            (Some(_), Some(dir)) => over_h3::adapt(&text, dir),
            _ => None,
        };
        std::fs::write(&self.config_path, adapted.unwrap_or(text)).unwrap();
    }
    /// Moves the gateway's injected clock (a gateway started by [`gateway_on_clock`]) forward
    /// by `by`; the next request is decided at the new time. Returns the new time (µs).
    pub async fn advance(&self, by: Duration) -> u64 {
        let micros = u64::try_from(by.as_micros()).unwrap();
        self.move_clock(&format!("advance={micros}")).await
    }
    /// Sets the gateway's injected clock to `now` (µs since the epoch).
    pub async fn set_clock(&self, now: u64) -> u64 {
        self.move_clock(&format!("set={now}")).await
    }
    async fn move_clock(&self, query: &str) -> u64 {
        let res = client()
            .post(self.admin_url(&format!("/-/test/clock?{query}")))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body = res.text().await.unwrap();
        assert_eq!(status, 200, "POST /-/test/clock?{query}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["now"].as_u64().unwrap()
    }
    pub async fn metrics(&self) -> String {
        client()
            .get(self.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub use rustix::process::Signal;

/// Sends `sig` to `child` from this process (no `kill` command: a minimal Debian has none).
pub fn send_signal(child: &Child, sig: Signal) {
    let pid = rustix::process::Pid::from_child(child);
    if let Err(e) = rustix::process::kill_process(pid, sig) {
        panic!("cannot send {sig:?} to process {pid:?}: {e}");
    }
}

pub fn tollgate_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tollgate")
}

/// Starts the gateway with `config` (TOML). Listeners should be `127.0.0.1:0`; use [`config`].
pub fn gateway(config: &str) -> Gateway {
    gateway_env(config, &[])
}

/// The HTTP/1 front the tests run on: `TOLLGATE_TEST_HTTP1=fast|hyper` (unset: the config's
/// own, i.e. the default). `scripts/test` runs the front-sensitive test files on both.
pub fn test_front() -> Option<String> {
    std::env::var("TOLLGATE_TEST_HTTP1")
        .ok()
        .filter(|v| !v.is_empty())
}

/// `config` with `[server] http1` set to the front under test (see [`test_front`]), unless the
/// config names one itself.
pub fn with_front(config: &str) -> String {
    match test_front() {
        Some(front) => with_http1(config, &front),
        None => config.to_owned(),
    }
}

/// `config` with `[server] http1 = front` (unless it names one already).
pub fn with_http1(config: &str, front: &str) -> String {
    if config.lines().any(|l| l.trim_start().starts_with("http1")) {
        return config.to_owned();
    }
    let line = format!("http1 = \"{front}\"\n");
    match config.find("[server]\n") {
        Some(at) => {
            let at = at + "[server]\n".len();
            format!("{}{line}{}", &config[..at], &config[at..])
        }
        None => format!("[server]\n{line}\n{config}"),
    }
}

pub fn gateway_env(config: &str, env: &[(&str, &str)]) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("gateway.toml");
    let text = with_front(config);
    let adapted = over_h3::adapt(&text, dir.path());
    let h3 = adapted.is_some();
    std::fs::write(&config_path, adapted.unwrap_or(text)).unwrap();
    spawn_gateway(config_path, dir, env, h3)
}

/// A time to start injected clocks at: 2027-01-15 08:00:00 UTC, a whole hour (so windows of a
/// second, a minute or an hour start exactly there).
pub const T0: u64 = 1_800_000_000_000_000;

/// Starts the gateway with `config` on an injected clock standing at `now` (µs since the epoch;
/// e.g. [`T0`]): every decision — in process, in the Redis scripts, in the deny cache — is taken
/// at that time until the test moves it ([`Gateway::advance`], [`Gateway::set_clock`]). The
/// `test-clock` feature, on for the tests (README, "Tests on injected time").
pub fn gateway_on_clock(config: &str, now: u64) -> Gateway {
    gateway_env(config, &[("TOLLGATE_TEST_CLOCK", &now.to_string())])
}

/// Starts the gateway on a config file the test laid out itself (a Kubernetes-style mount of
/// symlinks, say); `config_path` is passed to `--config` as given.
pub fn gateway_at(config_path: &std::path::Path) -> Gateway {
    spawn_gateway(
        config_path.to_path_buf(),
        tempfile::tempdir().unwrap(),
        &[],
        false,
    )
}

fn spawn_gateway(
    config_path: PathBuf,
    dir: tempfile::TempDir,
    env: &[(&str, &str)],
    h3: bool,
) -> Gateway {
    let mut cmd = Command::new(tollgate_bin());
    cmd.arg("--config")
        .arg(&config_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    if !env.iter().any(|(k, _)| *k == "RUST_LOG") {
        cmd.env("RUST_LOG", "info");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("cannot start the tollgate binary");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut l = log2.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(Ok(line)) = lines.next() {
            if line.starts_with("tollgate listening") {
                let _ = tx.send(line);
            }
        }
    });
    let line = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(l) => l,
        Err(_) => {
            let _ = child.kill();
            std::thread::sleep(Duration::from_millis(100));
            panic!("gateway did not start; stderr:\n{}", log.lock().unwrap());
        }
    };
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    let h3 = h3.then(|| over_h3::start(field("h3=")));
    Gateway {
        h3,
        proxy: field("proxy="),
        admin: field("admin="),
        redirect: line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("redirect="))
            .and_then(|v| v.parse().ok()),
        child,
        config_path,
        _dir: dir,
        stderr: log,
    }
}

/// A config with both listeners on `127.0.0.1:0`, `store` as the `[store]` body and `routes`
/// appended verbatim.
pub fn config(store: &str, routes: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n{store}\n\n{routes}")
}

/// A route named `name` on `prefix` to `upstream`, with `extra` lines and then `limits`.
pub fn route(name: &str, prefix: &str, upstream: &str, extra: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\nupstream = \"{upstream}\"\n{extra}\n")
}

/// A `[[routes.limits]]` table.
pub fn limit(body: &str) -> String {
    format!("[[routes.limits]]\n{body}\n")
}

/// A plain HTTP client that never uses a proxy from the environment.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

/// A private `redis-server` on a free port.
pub struct Redis {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free now, for a process that must be told its port before it binds it. Picked below
/// the kernel's ephemeral range (32768–60999 by default): a port the kernel hands out for port 0
/// is also handed to the next outgoing connection of any test running beside, which then takes
/// it before the process binds it (`Address already in use`, seen under the full suite's load).
/// Here only another test's `free_port` can race, one port among 22,000.
pub fn free_port() -> u16 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id())
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::from(d.subsec_nanos())),
        );
    for _ in 0..1000 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut x = seed ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03);
        x ^= x >> 29;
        let port = 10_000 + u16::try_from(x % 22_000).unwrap_or(0);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn redis_server_bin() -> &'static str {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!(
            "redis-server is not installed; these tests start their own Redis. \
             Run `scripts/test`, which installs it (or `apt-get install -y redis-server redis-tools`)."
        );
    }
    "redis-server"
}

impl Redis {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts redis-server on `port` with `extra` arguments; waits until it answers PING.
    pub fn start_on(port: u16, extra: &[&str]) -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(redis_server_bin())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server");
        let r = Redis {
            port,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if r.cli(&["PING"]).trim() == "PONG" {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server on port {port} did not come up");
    }

    /// Runs `redis-cli` against this server; returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is not installed; run `scripts/test` (or `apt-get install -y redis-tools`)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered.
    pub fn pause(&self) {
        send_signal(&self.child, Signal::STOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        send_signal(&self.child, Signal::CONT);
    }

    /// Stops the server (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a private redis-server on a free port.
pub fn redis() -> Redis {
    Redis::start_on(free_port(), &[])
}

/// A three-master Redis Cluster of private `redis-server`s (no replicas).
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    /// The `urls = [...]` list of a `[store]` body.
    pub fn urls_toml(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("\"{}\"", n.url()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p < 55_000 && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// Starts a three-master cluster on free ports (each with its bus port free too) and waits for
/// `cluster_state:ok`.
pub fn start_cluster() -> Cluster {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let port = cluster_port();
        nodes.push(Redis::start_on(
            port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--cluster-node-timeout",
                "2000",
            ],
        ));
    }
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli is not installed; `apt-get install -y redis-tools`");
    assert!(
        out.status.success(),
        "cluster create failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            return Cluster { nodes };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the cluster never reached cluster_state:ok");
}

/// The value of a Prometheus sample `name{labels}` in `text` (labels in exposition order).
pub fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == name_and_labels).then(|| v.parse().ok()).flatten()
    })
}

/// Sum of every sample of `name` whose label set contains all of `labels` (`k="v"` strings).
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            let (n, rest) = k.split_once('{').unwrap_or((k, ""));
            (n == name && labels.iter().all(|lab| rest.contains(lab)))
                .then(|| v.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The resident set of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kb * 1024
}

/// Waits until `/readyz` answers 200 (a Redis store connects in the background).
pub async fn wait_ready(gw: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(r) = client().get(gw.admin_url("/readyz")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gateway never became ready: {}", gw.logs());
}

/// `tollgate_ratelimit_decisions_total{route,limit,plan="",decision}` (a route's own limit) in
/// a scrape.
pub fn decisions(text: &str, route: &str, limit: &str, decision: &str) -> Option<f64> {
    plan_decisions(text, route, limit, "", decision)
}

/// `tollgate_ratelimit_decisions_total{route,limit,plan,decision}` in a scrape.
pub fn plan_decisions(
    text: &str,
    route: &str,
    limit: &str,
    plan: &str,
    decision: &str,
) -> Option<f64> {
    metric(
        text,
        &format!("tollgate_ratelimit_decisions_total{{route=\"{route}\",limit=\"{limit}\",plan=\"{plan}\",decision=\"{decision}\"}}"),
    )
}

// ---------------------------------------------------------------------------------------------
// Every store.
// ---------------------------------------------------------------------------------------------

/// Which store a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Redis,
    /// A three-master Redis Cluster (`on_every_store_and_cluster!`).
    RedisCluster,
}

/// A store for one test: the `[store]` body, and the Redis server (or cluster) it uses (kept
/// alive).
pub struct StoreEnv {
    pub store: String,
    pub _redis: Option<Redis>,
    pub _cluster: Option<Cluster>,
}

pub fn store_env(kind: Kind) -> StoreEnv {
    match kind {
        Kind::Memory => StoreEnv {
            store: "backend = \"memory\"".into(),
            _redis: None,
            _cluster: None,
        },
        Kind::RedisCluster => {
            let c = start_cluster();
            StoreEnv {
                store: format!(
                    "backend = \"redis_cluster\"\nurls = [{}]\ntimeout = \"2s\"\non_error = \"deny\"",
                    c.urls_toml()
                ),
                _redis: None,
                _cluster: Some(c),
            }
        }
        Kind::Redis => {
            let r = redis();
            StoreEnv {
                store: format!(
                    "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\non_error = \"deny\"",
                    r.url()
                ),
                _redis: Some(r),
                _cluster: None,
            }
        }
    }
}

/// Runs a scenario on the in-process store and on Redis: `on_every_store!(scenario, …)` makes
/// `scenario::memory` and `scenario::redis` tests of each `async fn scenario(kind: Kind)`.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn memory() {
                super::$name($crate::support::Kind::Memory).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn redis() {
                super::$name($crate::support::Kind::Redis).await
            }
        }
    )*};
}

/// `on_every_store!` plus a Redis Cluster: `scenario::memory`, `scenario::redis` and
/// `scenario::redis_cluster` (a cluster start costs a second or two: for scenarios whose keys or
/// multi-slot decisions differ from one Redis).
#[macro_export]
macro_rules! on_every_store_and_cluster {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn memory() {
                super::$name($crate::support::Kind::Memory).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn redis() {
                super::$name($crate::support::Kind::Redis).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn redis_cluster() {
                super::$name($crate::support::Kind::RedisCluster).await
            }
        }
    )*};
}

/// Steady traffic: `tasks` loops sending GET `url` until [`Traffic::finish`], counting 200s and
/// recording every other status or error.
pub struct Traffic {
    stop: Arc<std::sync::atomic::AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    pub fn start(c: &reqwest::Client, url: String, tasks: usize) -> Traffic {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..tasks)
            .map(|_| {
                let (stop, ok, failed, c, url) = (
                    stop.clone(),
                    ok.clone(),
                    failed.clone(),
                    c.clone(),
                    url.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        match c.get(&url).send().await {
                            Ok(r) if r.status() == 200 => {
                                ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(r) => failed.lock().unwrap().push(r.status().to_string()),
                            Err(e) => failed.lock().unwrap().push(e.to_string()),
                        }
                    }
                })
            })
            .collect();
        Traffic {
            stop,
            ok,
            failed,
            tasks,
        }
    }

    /// Stops the loops; returns how many requests got 200 and what the others got.
    pub async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        let failed = self.failed.lock().unwrap().clone();
        (self.ok.load(Ordering::SeqCst), failed)
    }
}

/// A small deterministic generator for traces (no dependency, same trace every run).
pub struct Lcg(pub u64);
impl Lcg {
    /// The next number in `0..n`.
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

// ---------------------------------------------------------------------------------------------
// Redis Sentinel.
// ---------------------------------------------------------------------------------------------

/// A `redis-sentinel` process on a free port, with its own config file (sentinels rewrite it).
pub struct SentinelProc {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for SentinelProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SentinelProc {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this sentinel; returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is not installed; run `scripts/test`");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A primary, one replica and three sentinels monitoring them as `master_name`, with tight
/// timings (down after 400 ms, failover timeout 2 s) so a failover takes seconds.
pub struct SentinelSet {
    pub primary: Redis,
    pub replica: Redis,
    pub sentinels: Vec<SentinelProc>,
    pub master_name: &'static str,
}

fn redis_sentinel_bin() -> &'static str {
    if Command::new("redis-sentinel")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!(
            "redis-sentinel is not installed; the failover tests start their own sentinels. \
             Run `scripts/test`, which installs it (or `apt-get install -y redis-sentinel`)."
        );
    }
    "redis-sentinel"
}

impl SentinelSet {
    /// The `[store]` body of a gateway using these sentinels.
    pub fn store(&self, extra: &str) -> String {
        let urls: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("\"{}\"", s.url()))
            .collect();
        format!(
            "backend = \"redis_sentinel\"\nsentinels = [{}]\nmaster_name = \"{}\"\n{extra}",
            urls.join(", "),
            self.master_name
        )
    }

    /// The primary's port as the first sentinel that answers names it.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let out = s.cli(&["SENTINEL", "get-master-addr-by-name", self.master_name]);
            out.lines().nth(1).and_then(|p| p.trim().parse().ok())
        })
    }
}

/// Starts a primary, a replica of it and three sentinels; waits until the replica is in sync
/// and every sentinel knows the replica and the two other sentinels.
pub fn start_sentinels() -> SentinelSet {
    let bin = redis_sentinel_bin();
    let master_name = "tollgate-primary";
    let primary = redis();
    let replica = Redis::start_on(
        free_port(),
        &["--replicaof", "127.0.0.1", &primary.port.to_string()],
    );
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {master_name} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {master_name} 400\n\
                 sentinel failover-timeout {master_name} 2000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                dir.path().display(),
                primary.port
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-sentinel");
        sentinels.push(SentinelProc {
            port,
            child,
            _dir: dir,
        });
    }
    let set = SentinelSet {
        primary,
        replica,
        sentinels,
        master_name,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let field = |text: &str, name: &str| -> Option<String> {
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if l.trim() == name {
                return lines.next().map(|v| v.trim().to_owned());
            }
        }
        None
    };
    while Instant::now() < deadline {
        let synced = set
            .replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up");
        let known = set.sentinels.iter().all(|s| {
            let m = s.cli(&["SENTINEL", "master", master_name]);
            field(&m, "num-slaves").as_deref() == Some("1")
                && field(&m, "num-other-sentinels").as_deref() == Some("2")
        });
        if synced && known {
            return set;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the sentinels never saw the replica and each other");
}
