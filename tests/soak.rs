//! The chaos soak (issue #22, "Hardening III"): mixed traffic on every algorithm through two
//! gateways sharing one Redis while a driver restarts, freezes and partitions Redis, flaps the
//! upstream servers, reloads the configuration (overlapping reloads and invalid files
//! included) and sends hostile requests. When the driver stops and the traffic drains, it checks
//! and prints the invariants:
//!
//! - **budgets**: no limit admitted more than its budget, counted from what the clients saw
//!   across both gateways (see [`Budget`] for each algorithm's bound);
//! - **slots**: no concurrency slot is held once the driver has stopped (the gateways' gauges
//!   read 0 and the Redis lease sets hold no live lease);
//! - **memory**: each gateway's RSS at the end is within 2× + 30 MB of its RSS after warm-up;
//! - **panics**: no gateway logged `panicked`, and both still run;
//! - and what the chaos itself must not break: reloads converge on the file's last version,
//!   hostile requests are answered as documented (never 500, never hanging), normal traffic
//!   never gets a 500.
//!
//! Not in CI (`#[ignore]`): `scripts/soak [SECONDS]` runs it on a release build, 600 s by
//! default (`SOAK_SECONDS`; `SOAK_SEED` repeats a run's choices). Everything runs on
//! 127.0.0.1: a private `redis-server`, a TCP proxy between the gateways and Redis (the
//! partition), in-test upstream servers, the two gateway processes.
//!
//! **Outages and the budgets.** The store fails closed (`on_error = "deny"`), so an outage
//! admits nothing unmetered, and Redis restarts keep their data (AOF with `appendfsync
//! always`, so every write Redis acknowledged survives `SIGKILL`): the budgets of the limits
//! decided before the request are checked exactly, outages included. An emptied Redis would
//! legitimately start every limit afresh (README, "Failure modes"); this soak does not empty it.
//! The one allowance the README documents for an outage is a post-response charge
//! (`cost_header`, `count_status`) that fails: it is logged and lost. Responses whose exchange
//! overlapped an outage (widened by [`OUTAGE_MARGIN`]), or a moment when a gateway counted a
//! store error (a timeout on a loaded machine is one too), are therefore left out of those
//! limits' counts; the others must stay within the documented overshoot bound (`N ×
//! min(charge, capacity)` for N requests in flight).

mod support;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use support::{metric, metric_sum, Lcg};

/// Traffic before the chaos starts; the RSS baseline is read after it.
const WARM_UP: Duration = Duration::from_secs(5);
/// Traffic after the driver stops, on a healthy system.
const TAIL: Duration = Duration::from_secs(5);
/// How long the slots may take to be released once the traffic has stopped (a release that
/// failed in an outage is retried at least once a second).
const SETTLE: Duration = Duration::from_secs(30);
/// How long after an outage a post-response charge may still fail (the store's timeout, the
/// reconnect back-off of at most 2 s, the circuit breaker's 500 ms).
const OUTAGE_MARGIN: i64 = 4_000_000;
/// The header that carries the API keys.
const KEY: &str = "x-api-key";

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as i64
}

fn between(lcg: &mut Lcg, lo: u64, hi: u64) -> u64 {
    lo + lcg.next(hi - lo + 1)
}

// ---------------------------------------------------------------------------------------------
// The routes, their limits and the bound each limit's admissions must keep.
// ---------------------------------------------------------------------------------------------

const SEC: i64 = 1_000_000;

/// What the clients' view of one limit must satisfy. Times are the brackets `[sent, received]`
/// of each counted response, in µs of the system clock — Redis's `TIME` on this machine, and the
/// decision (or charge) happened inside the bracket.
#[derive(Clone, Copy, Debug)]
enum Budget {
    /// `fixed_window`, a calendar day, and `sliding_window` (whose estimate is never below the
    /// current window's count): the units admitted in each window of `p_us` aligned to the
    /// epoch are at most `l`. A response whose bracket spans a boundary may count in either
    /// window; the check fails only when no assignment fits.
    Window { l: i64, p_us: i64 },
    /// `sliding_log`: admissions whose decision times all lie within less than `p_us` are at
    /// most `l`.
    Span { l: i64, p_us: i64 },
    /// `token_bucket`, `gcra`, `leaky_bucket`: admissions decided within any interval of length
    /// D are at most `cap + D / t_us` (a full bucket of `cap`, refilled one unit per `t_us`;
    /// for the leaky bucket `cap` is B + 1).
    Rate { cap: i64, t_us: i64 },
    /// `concurrency`: requests of one subject inside the upstream at once are at most `l` (the
    /// upstream counts them; a slot is held from admission until the response body is sent).
    InFlight { l: usize },
}

/// Which responses are admissions a limit counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Counts {
    /// 200s.
    Ok,
    /// 401s (a `count_status = ["401"]` limit is charged only those).
    Unauthorized,
}

#[derive(Debug)]
struct LimitSpec {
    name: &'static str,
    /// The `[[routes.limits]]` body without its name.
    toml: String,
    budget: Budget,
    /// One budget per API key; else one for all the route's traffic (`global`, or `ip` with
    /// every client on 127.0.0.1).
    per_key: bool,
    /// Charged after the response: units are the request's cost, a charge may be lost in an
    /// outage (documented), and `overshoot` units more than the budget are documented.
    after: bool,
    overshoot: i64,
}

#[derive(Debug)]
struct RouteSpec {
    name: &'static str,
    /// API keys the clients use (`<route>-k<i>`); 0: none sent.
    keys: u64,
    /// Client tasks on this route (each one request at a time).
    tasks: usize,
    /// Pause between a task's requests, ms.
    pause_ms: (u64, u64),
    counts: Counts,
    limits: Vec<LimitSpec>,
}

fn limit(name: &'static str, toml: &str, budget: Budget) -> LimitSpec {
    LimitSpec {
        name,
        toml: toml.to_owned(),
        budget,
        per_key: true,
        after: false,
        overshoot: 0,
    }
}

/// Every algorithm the README documents, on a route of its own (and two limits together on
/// `multi`). The numbers are small so that the clients spend every budget many times over; the
/// daily quota is spent about two thirds into a run of `seconds`.
fn routes(seconds: u64) -> Vec<RouteSpec> {
    let daily = (3 * seconds as i64).max(100);
    vec![
        RouteSpec {
            name: "fw",
            keys: 3,
            tasks: 3,
            pause_ms: (10, 90),
            counts: Counts::Ok,
            limits: vec![limit(
                "fw",
                "algorithm = \"fixed_window\"\nlimit = 10\nperiod = \"2s\"\nsubject = \"header:X-Api-Key\"",
                Budget::Window { l: 10, p_us: 2 * SEC },
            )],
        },
        RouteSpec {
            name: "sw",
            keys: 3,
            tasks: 3,
            pause_ms: (10, 90),
            counts: Counts::Ok,
            limits: vec![limit(
                "sw",
                "algorithm = \"sliding_window\"\nlimit = 10\nperiod = \"2s\"\nsubject = \"header:X-Api-Key\"",
                Budget::Window { l: 10, p_us: 2 * SEC },
            )],
        },
        RouteSpec {
            name: "sl",
            keys: 3,
            tasks: 3,
            pause_ms: (10, 90),
            counts: Counts::Ok,
            limits: vec![limit(
                "sl",
                "algorithm = \"sliding_log\"\nlimit = 8\nperiod = \"2s\"\nsubject = \"header:X-Api-Key\"",
                Budget::Span { l: 8, p_us: 2 * SEC },
            )],
        },
        RouteSpec {
            name: "tb",
            keys: 3,
            tasks: 3,
            pause_ms: (10, 90),
            counts: Counts::Ok,
            limits: vec![limit(
                "tb",
                "algorithm = \"token_bucket\"\nlimit = 5\nperiod = \"1s\"\nburst = 8\nsubject = \"header:X-Api-Key\"",
                Budget::Rate { cap: 8, t_us: SEC / 5 },
            )],
        },
        RouteSpec {
            name: "gcra",
            keys: 3,
            tasks: 3,
            pause_ms: (10, 90),
            counts: Counts::Ok,
            limits: vec![limit(
                "gcra",
                "algorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\nburst = 3\nsubject = \"header:X-Api-Key\"",
                Budget::Rate { cap: 3, t_us: SEC / 5 },
            )],
        },
        RouteSpec {
            name: "lb",
            keys: 2,
            tasks: 4,
            pause_ms: (0, 60),
            counts: Counts::Ok,
            limits: vec![limit(
                "lb",
                "algorithm = \"leaky_bucket\"\nlimit = 10\nperiod = \"1s\"\nburst = 3\nsubject = \"header:X-Api-Key\"",
                Budget::Rate { cap: 4, t_us: SEC / 10 },
            )],
        },
        RouteSpec {
            name: "cal",
            keys: 4,
            tasks: 2,
            pause_ms: (20, 120),
            counts: Counts::Ok,
            limits: vec![limit(
                "cal",
                &format!("algorithm = \"fixed_window\"\nlimit = {daily}\ncalendar = \"day\"\nsubject = \"header:X-Api-Key\""),
                Budget::Window { l: daily, p_us: 86_400 * SEC },
            )],
        },
        RouteSpec {
            name: "cc",
            keys: 2,
            tasks: 8,
            pause_ms: (0, 20),
            counts: Counts::Ok,
            limits: vec![limit(
                "in-flight",
                "algorithm = \"concurrency\"\nlimit = 3\nperiod = \"5m\"\nsubject = \"header:X-Api-Key\"",
                Budget::InFlight { l: 3 },
            )],
        },
        RouteSpec {
            name: "cost",
            keys: 2,
            tasks: 4,
            pause_ms: (0, 40),
            counts: Counts::Ok,
            limits: vec![
                LimitSpec {
                    after: true,
                    // Two slots per key (the limit below), each charged at most 10.
                    overshoot: 2 * 10,
                    ..limit(
                        "units",
                        "algorithm = \"fixed_window\"\nlimit = 60\nperiod = \"5s\"\nsubject = \"header:X-Api-Key\"\ncost_header = \"X-Cost\"",
                        Budget::Window { l: 60, p_us: 5 * SEC },
                    )
                },
                limit(
                    "cost-in-flight",
                    "algorithm = \"concurrency\"\nlimit = 2\nperiod = \"5m\"\nsubject = \"header:X-Api-Key\"",
                    Budget::InFlight { l: 2 },
                ),
            ],
        },
        RouteSpec {
            name: "login",
            keys: 0,
            tasks: 2,
            pause_ms: (10, 90),
            counts: Counts::Unauthorized,
            limits: vec![LimitSpec {
                per_key: false,
                after: true,
                // Two client tasks: at most two requests in flight, each charged 1.
                overshoot: 2,
                ..limit(
                    "failed-logins",
                    "algorithm = \"sliding_window\"\nlimit = 10\nperiod = \"5s\"\nsubject = \"ip\"\ncount_status = [\"401\"]",
                    Budget::Window { l: 10, p_us: 5 * SEC },
                )
            }],
        },
        RouteSpec {
            name: "multi",
            keys: 4,
            tasks: 3,
            pause_ms: (10, 90),
            counts: Counts::Ok,
            limits: vec![
                limit(
                    "per-key",
                    "algorithm = \"gcra\"\nlimit = 5\nperiod = \"1s\"\nburst = 3\nsubject = \"header:X-Api-Key\"",
                    Budget::Rate { cap: 3, t_us: SEC / 5 },
                ),
                LimitSpec {
                    per_key: false,
                    ..limit(
                        "all",
                        "algorithm = \"fixed_window\"\nlimit = 15\nperiod = \"1s\"\nsubject = \"global\"",
                        Budget::Window { l: 15, p_us: SEC },
                    )
                },
            ],
        },
    ]
}

/// A request of `route`: its path and the units a cost limit is charged for it.
fn request_path(route: &str, lcg: &mut Lcg) -> (String, i64) {
    match route {
        "cost" => {
            let c = between(lcg, 1, 10);
            (format!("/cost/x?c={c}"), c as i64)
        }
        "login" if lcg.next(2) == 0 => ("/login/bad".into(), 1),
        "login" => ("/login/ok".into(), 1),
        "cc" => ("/cc/slow".into(), 1),
        r => (format!("/{r}/x"), 1),
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream servers that can be stopped and started again on their port.
// ---------------------------------------------------------------------------------------------

/// What every upstream server shares: the requests inside the upstream per (route, key), now and
/// at most, and each moment a count went above the route's slots.
#[derive(Default)]
struct UpstreamLog {
    inside: Mutex<Insides>,
    hits: AtomicU64,
}

#[derive(Default)]
struct Insides {
    counts: HashMap<(String, String), (usize, usize)>,
    /// The requests inside now: id → (server port, (route, key)).
    live: HashMap<u64, (u16, (String, String))>,
    next: u64,
    /// (µs, route, key, count) whenever a count went above its route's slots.
    over: Vec<(i64, String, String, usize)>,
}

/// The slots of the concurrency limit of a route (the upstream counts requests inside for them).
fn slots(route: &str) -> Option<usize> {
    match route {
        "cc" => Some(3),
        "cost" => Some(2),
        _ => None,
    }
}

/// One request inside the upstream, counted until dropped (or its server stops).
struct Inside {
    log: Arc<UpstreamLog>,
    id: u64,
}

impl Inside {
    fn enter(log: &Arc<UpstreamLog>, port: u16, at: (String, String), slots: usize) -> Inside {
        let mut g = log.inside.lock().unwrap();
        let g = &mut *g;
        let e = g.counts.entry(at.clone()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
        if e.0 > slots && g.over.len() < 20 {
            g.over.push((now_us(), at.0.clone(), at.1.clone(), e.0));
        }
        g.next += 1;
        let id = g.next;
        g.live.insert(id, (port, at));
        Inside {
            log: log.clone(),
            id,
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut g = self.log.inside.lock().unwrap();
        if let Some((_, at)) = g.live.remove(&self.id) {
            if let Some(e) = g.counts.get_mut(&at) {
                e.0 -= 1;
            }
        }
    }
}

impl UpstreamLog {
    /// A server stops: its requests stop counting now, before their connections close (the
    /// gateway then retries them elsewhere, and a handler dropped a moment after its socket
    /// closed must not count twice).
    fn retire(&self, port: u16) {
        let mut g = self.inside.lock().unwrap();
        let g = &mut *g;
        let gone: Vec<u64> = g
            .live
            .iter()
            .filter(|(_, (p, _))| *p == port)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some((_, at)) = g.live.remove(&id) {
                if let Some(e) = g.counts.get_mut(&at) {
                    e.0 -= 1;
                }
            }
        }
    }
}

/// The upstream: `/cc/…` takes 100 ms, `/cost/…?c=N` answers `X-Cost: N` after 20 ms,
/// `/login/bad` is a 401; every answer says the path it got in `X-Path`.
async fn app(
    log: Arc<UpstreamLog>,
    port: u16,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    log.hits.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let key = req
        .headers()
        .get(KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let route = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("")
        .to_owned();
    // Counted while the handler runs (and its server runs).
    let _inside = slots(&route).map(|n| Inside::enter(&log, port, (route.clone(), key), n));
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
    match route.as_str() {
        "cc" => tokio::time::sleep(Duration::from_millis(100)).await,
        "cost" => tokio::time::sleep(Duration::from_millis(20)).await,
        _ => {}
    }
    let mut res = Response::new(Full::new(Bytes::from_static(b"ok\n")));
    if path == "/login/bad" {
        *res.status_mut() = StatusCode::UNAUTHORIZED;
    }
    if let Some(c) = query.strip_prefix("c=") {
        if let Ok(v) = c.parse() {
            res.headers_mut().insert("x-cost", v);
        }
    }
    if let Ok(v) = path.parse() {
        res.headers_mut().insert("x-path", v);
    }
    Ok(res)
}

fn listen_on(port: u16) -> std::io::Result<TcpListener> {
    let s = TcpSocket::new_v4()?;
    s.set_reuseaddr(true)?;
    s.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    s.listen(1024)
}

/// Binds `port` again after a stop, retrying for a while (the port is ours, but a connection
/// may briefly use it as its source port).
async fn relisten(port: u16) -> TcpListener {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match listen_on(port) {
            Ok(l) => return l,
            Err(e) if Instant::now() > deadline => panic!("cannot listen on {port} again: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// One upstream server; `stop` closes its listener and every connection (requests inside are
/// dropped), `start` listens on the same port again.
struct Server {
    port: u16,
    log: Arc<UpstreamLog>,
    running: Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

impl Server {
    async fn new(log: Arc<UpstreamLog>) -> Server {
        let l = listen_on(0).expect("listen on 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        let mut s = Server {
            port,
            log,
            running: None,
        };
        s.serve(l);
        s
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn serve(&mut self, listener: TcpListener) {
        let (tx, rx) = watch::channel(false);
        let (log, port) = (self.log.clone(), self.port);
        let task = tokio::spawn(async move {
            let mut stop = rx.clone();
            loop {
                tokio::select! {
                    acc = listener.accept() => {
                        let Ok((stream, _)) = acc else { continue };
                        let (log, mut stop) = (log.clone(), rx.clone());
                        tokio::spawn(async move {
                            let svc = service_fn(move |req| app(log.clone(), port, req));
                            let conn = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), svc);
                            tokio::select! {
                                _ = conn => {}
                                _ = stop.changed() => {}
                            }
                        });
                    }
                    _ = stop.changed() => return,
                }
            }
        });
        self.running = Some((tx, task));
    }

    async fn stop(&mut self) {
        if let Some((tx, task)) = self.running.take() {
            self.log.retire(self.port);
            let _ = tx.send(true);
            let _ = task.await;
        }
    }

    async fn start(&mut self) {
        if self.running.is_none() {
            let l = relisten(self.port).await;
            self.serve(l);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis, and the network between the gateways and it.
// ---------------------------------------------------------------------------------------------

/// A private `redis-server` whose data survives a restart: AOF with `appendfsync always`, so a
/// write is on disk before Redis answers it, and `SIGKILL` loses nothing acknowledged.
struct SoakRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl SoakRedis {
    fn new() -> SoakRedis {
        let mut r = SoakRedis {
            port: support::free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        r.start();
        r
    }

    fn start(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let child = Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .arg("--dir")
                .arg(self.dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cannot start redis-server (scripts/test --install-only installs it)");
            self.child = Some(child);
            while Instant::now() < deadline {
                if self.cli(&["PING"]).trim() == "PONG" {
                    return;
                }
                // Exited (its port taken for a moment): start it again.
                if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not come up",
                self.port
            );
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        if let Some(c) = &self.child {
            rustix::process::kill_process(rustix::process::Pid::from_child(c), sig)
                .expect("signal redis-server");
        }
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli is not installed (scripts/test --install-only installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Live concurrency leases in every `…:cc` key (scored by their expiry in µs of Redis time).
    fn live_leases(&self) -> Option<i64> {
        let script = "local t = redis.call('TIME') \
            local now = string.format('%d', t[1] * 1000000 + t[2]) \
            local n = 0 \
            for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
              n = n + redis.call('ZCOUNT', k, '(' .. now, '+inf') \
            end \
            return n";
        self.cli(&["EVAL", script, "0", "tollgate:*:cc"])
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for SoakRedis {
    fn drop(&mut self) {
        self.signal(rustix::process::Signal::CONT);
        self.kill();
    }
}

/// The network between the gateways and Redis.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Net {
    Open,
    /// Connections stay open and nothing goes through (new ones are accepted and held).
    Blackhole,
    /// Every connection is closed and new ones are refused (the listener is closed).
    Cut,
}

/// A TCP proxy in front of Redis that the driver can cut.
fn net_proxy(redis_port: u16) -> (u16, watch::Sender<Net>) {
    let listener = listen_on(0).expect("listen on 127.0.0.1:0");
    let port = listener.local_addr().unwrap().port();
    let (tx, mut rx) = watch::channel(Net::Open);
    tokio::spawn(async move {
        let mut listener = Some(listener);
        loop {
            let net = *rx.borrow_and_update();
            if net == Net::Cut {
                listener = None;
                if rx.changed().await.is_err() {
                    return;
                }
                continue;
            }
            if listener.is_none() {
                listener = Some(relisten(port).await);
            }
            let Some(l) = &listener else { continue };
            tokio::select! {
                acc = l.accept() => {
                    if let Ok((s, _)) = acc {
                        tokio::spawn(pipe(s, redis_port, rx.clone()));
                    }
                }
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
    });
    (port, tx)
}

async fn pipe(mut a: TcpStream, redis_port: u16, mut rx: watch::Receiver<Net>) {
    loop {
        match *rx.borrow_and_update() {
            Net::Open => break,
            Net::Cut => return,
            Net::Blackhole => {}
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
    let Ok(mut b) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
        return;
    };
    let not_open = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => false,
        r = rx.wait_for(|n| *n != Net::Open) => r.is_ok(),
    };
    if not_open {
        // A black hole: both sockets stay open and silent until the cut.
        let _ = rx.wait_for(|n| *n != Net::Blackhole).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The gateways' configuration.
// ---------------------------------------------------------------------------------------------

struct Topology {
    net_port: u16,
    app: Vec<String>,
    stable: String,
}

/// Generation `gen` of the configuration. What changes with it: the `gen` route's upstream
/// base path (so a client can tell which generation serves), the `app` group's weights, and
/// every fifth generation the store's `timeout` (a changed `[store]` builds a new store).
/// The limits that are checked never change.
fn config_toml(t: &Topology, gen: u64, routes: &[RouteSpec]) -> String {
    let timeout = if (gen / 5) % 2 == 0 { "1s" } else { "900ms" };
    let servers: Vec<String> = t
        .app
        .iter()
        .enumerate()
        .map(|(i, u)| format!("{{ url = \"{u}\", weight = {} }}", 1 + (gen + i as u64) % 3))
        .collect();
    let mut s = format!(
        "# generation {gen}\n\
         [server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\nheader_read_timeout = \"2s\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{net}\"\ntimeout = \"{timeout}\"\non_error = \"deny\"\n\n\
         [[upstreams]]\nname = \"app\"\nservers = [{servers}]\nmax_fails = 1\nfail_timeout = \"2s\"\nretries = 2\nconnect_timeout = \"1s\"\n\
         [upstreams.health_check]\npath = \"/healthz\"\ninterval = \"1s\"\ntimeout = \"500ms\"\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n\
         [[routes]]\nname = \"gen\"\npath_prefix = \"/gen\"\nupstream = \"{stable}/g{gen}\"\n\n\
         [[routes]]\nname = \"open\"\npath_prefix = \"/open\"\nupstream = \"{stable}\"\n\n",
        net = t.net_port,
        servers = servers.join(", "),
        stable = t.stable,
    );
    for r in routes {
        s.push_str(&format!(
            "[[routes]]\nname = \"{0}\"\npath_prefix = \"/{0}\"\nupstream = \"app\"\ntimeout = \"5s\"\n",
            r.name
        ));
        for l in &r.limits {
            s.push_str(&format!(
                "[[routes.limits]]\nname = \"{}\"\n{}\n",
                l.name, l.toml
            ));
        }
        s.push('\n');
    }
    s
}

/// Replaces a file at once (a reload never reads half of it).
fn write_atomically(path: &PathBuf, text: &str) {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Traffic.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Rec {
    key: u8,
    /// 0: no response (a transport error).
    status: u16,
    lo: i64,
    hi: i64,
    units: i64,
    /// The gateway asked.
    gw: u8,
    /// `RateLimit`'s `r` for the route's first limit (its check), when given.
    remaining: Option<i64>,
}

#[derive(Clone)]
struct GwInfo {
    proxy: SocketAddr,
    admin: SocketAddr,
    pid: u32,
    config: PathBuf,
}

struct Ctx {
    client: reqwest::Client,
    gws: Vec<GwInfo>,
    routes: Vec<RouteSpec>,
    topology: Topology,
    stop_chaos: AtomicBool,
    stop_traffic: AtomicBool,
    /// Intervals (µs) when Redis was down, frozen or cut off.
    outages: Mutex<Vec<(i64, i64)>>,
    /// Intervals (µs) in which a gateway counted store errors (`tollgate_store_errors_total`
    /// rose between two scrapes): the driver's outages, and any other time the store failed
    /// (a timeout on a loaded machine).
    store_errors: Mutex<Vec<(i64, i64)>>,
    events: Mutex<BTreeMap<&'static str, u64>>,
    /// Every driver event with its time (µs), written to `target/tmp/soak/events.log`.
    timeline: Mutex<Vec<(i64, &'static str)>>,
    transport_errors: Mutex<Vec<String>>,
}

impl Ctx {
    fn event(&self, what: &'static str) {
        *self.events.lock().unwrap().entry(what).or_default() += 1;
        self.timeline.lock().unwrap().push((now_us(), what));
    }
}

async fn traffic(ctx: Arc<Ctx>, route: usize, seed: u64) -> Vec<Rec> {
    let mut lcg = Lcg(seed);
    let spec = &ctx.routes[route];
    let mut recs = Vec::new();
    while !ctx.stop_traffic.load(Ordering::Relaxed) {
        let gi = lcg.next(ctx.gws.len() as u64) as usize;
        let gw = &ctx.gws[gi];
        let key = if spec.keys > 0 {
            lcg.next(spec.keys)
        } else {
            0
        };
        let (path, units) = request_path(spec.name, &mut lcg);
        let mut req = ctx.client.get(format!("http://{}{path}", gw.proxy));
        if spec.keys > 0 {
            req = req.header(KEY, format!("{}-k{key}", spec.name));
        }
        let lo = now_us();
        let res = req.send().await;
        let hi = now_us();
        let mut remaining = None;
        let status = match res {
            Ok(r) => {
                let s = r.status().as_u16();
                remaining = r
                    .headers()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        let item = v.split(", ").next()?;
                        item.split(';')
                            .find_map(|p| p.strip_prefix("r="))?
                            .parse()
                            .ok()
                    });
                // The body ends the exchange (a concurrency slot is held until it is sent).
                let _ = r.bytes().await;
                s
            }
            Err(e) => {
                let mut errs = ctx.transport_errors.lock().unwrap();
                if errs.len() < 20 {
                    errs.push(format!(
                        "{} via {} after {} ms, sent at {lo} µs: {e:?}",
                        spec.name,
                        gw.proxy,
                        (now_us() - lo) / 1000
                    ));
                }
                0
            }
        };
        recs.push(Rec {
            key: key as u8,
            status,
            lo,
            hi,
            units,
            gw: gi as u8,
            remaining,
        });
        let pause = between(&mut lcg, spec.pause_ms.0, spec.pause_ms.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    recs
}

// ---------------------------------------------------------------------------------------------
// The driver.
// ---------------------------------------------------------------------------------------------

/// Scrapes both gateways' store error counters every 250 ms until the traffic stops, recording
/// each interval in which one rose.
async fn store_error_monitor(ctx: Arc<Ctx>) {
    let mut last: Vec<f64> = vec![0.0; ctx.gws.len()];
    let mut at = now_us();
    while !ctx.stop_traffic.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = now_us();
        let mut rose = false;
        for (i, gw) in ctx.gws.iter().enumerate() {
            let text = scrape(&ctx.client, gw).await;
            if text.is_empty() {
                continue;
            }
            let errors = metric_sum(&text, "tollgate_store_errors_total", &[]);
            rose |= errors > last[i];
            last[i] = errors;
        }
        if rose {
            ctx.store_errors.lock().unwrap().push((at, now));
        }
        at = now;
    }
}

/// Sleeps `ms`, in steps, returning early (false) when the chaos stops.
fn nap(ctx: &Ctx, ms: u64) -> bool {
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        if ctx.stop_chaos.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
    }
    true
}

async fn anap(ctx: &Ctx, ms: u64) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_millis(ms);
    while tokio::time::Instant::now() < end {
        if ctx.stop_chaos.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20).min(end - tokio::time::Instant::now())).await;
    }
    true
}

/// Restarts, freezes and partitions Redis, one thing at a time, every 3–10 s; each ends healthy.
/// Runs on a thread of its own (it starts processes and waits for them).
fn redis_chaos(ctx: &Ctx, redis: &mut SoakRedis, net: &watch::Sender<Net>, seed: u64) {
    use rustix::process::Signal;
    let mut lcg = Lcg(seed);
    while nap(ctx, between(&mut lcg, 3000, 10_000)) {
        let start = now_us();
        // The outage's length is fixed before it starts: a stop never leaves Redis unhealthy.
        let ms = |lcg: &mut Lcg, lo, hi| Duration::from_millis(between(lcg, lo, hi));
        match lcg.next(4) {
            0 => {
                ctx.event("redis: restart (SIGKILL, data kept)");
                redis.kill();
                std::thread::sleep(ms(&mut lcg, 300, 2000));
                redis.start();
            }
            1 => {
                ctx.event("redis: freeze (SIGSTOP/SIGCONT)");
                redis.signal(Signal::STOP);
                std::thread::sleep(ms(&mut lcg, 300, 2500));
                redis.signal(Signal::CONT);
            }
            2 => {
                ctx.event("partition: cut (closed, refused)");
                net.send_replace(Net::Cut);
                std::thread::sleep(ms(&mut lcg, 500, 3000));
                net.send_replace(Net::Open);
            }
            _ => {
                ctx.event("partition: black hole, then cut");
                net.send_replace(Net::Blackhole);
                std::thread::sleep(ms(&mut lcg, 500, 2500));
                net.send_replace(Net::Cut);
                std::thread::sleep(ms(&mut lcg, 100, 500));
                net.send_replace(Net::Open);
            }
        }
        ctx.outages.lock().unwrap().push((start, now_us()));
    }
}

/// Stops and restarts upstream servers: one for 0.5–4 s, or (one time in six) all of them for
/// 0.5–1.5 s.
async fn upstream_flaps(ctx: Arc<Ctx>, mut servers: Vec<Server>, seed: u64) -> Vec<Server> {
    let mut lcg = Lcg(seed);
    while anap(&ctx, between(&mut lcg, 1000, 4000)).await {
        if lcg.next(6) == 0 {
            ctx.event("upstream: all servers down");
            for s in &mut servers {
                s.stop().await;
            }
            tokio::time::sleep(Duration::from_millis(between(&mut lcg, 500, 1500))).await;
            for s in &mut servers {
                s.start().await;
            }
        } else {
            ctx.event("upstream: one server down");
            let i = lcg.next(servers.len() as u64) as usize;
            servers[i].stop().await;
            tokio::time::sleep(Duration::from_millis(between(&mut lcg, 500, 4000))).await;
            servers[i].start().await;
        }
    }
    servers
}

#[derive(Default, Debug)]
struct ReloadReport {
    /// Reloads that left a gateway on an older generation than its file's.
    lost: Vec<String>,
    /// Invalid files that were not answered 422, or that changed what serves.
    invalid: Vec<String>,
    posts: u64,
    sighups: u64,
    rejected_by_store: u64,
}

async fn post_reload(ctx: &Ctx, gw: &GwInfo) -> u16 {
    match ctx
        .client
        .post(format!("http://{}/-/reload", gw.admin))
        .timeout(Duration::from_secs(30))
        .send()
        .await
    {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

fn sighup(gw: &GwInfo) {
    let pid = rustix::process::Pid::from_raw(gw.pid as i32).expect("a gateway's pid is positive");
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).expect("SIGHUP a gateway");
}

/// The generation a gateway serves: the `gen` route's base path, echoed by the upstream.
async fn live_gen(ctx: &Ctx, gw: &GwInfo) -> Option<u64> {
    let r = ctx
        .client
        .get(format!("http://{}/gen/p", gw.proxy))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    let path = r.headers().get("x-path")?.to_str().ok()?.to_owned();
    path.strip_prefix("/g")?.split('/').next()?.parse().ok()
}

async fn reload_failures(ctx: &Ctx, gw: &GwInfo) -> f64 {
    let text = match ctx
        .client
        .get(format!("http://{}/metrics", gw.admin))
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    metric(&text, "tollgate_config_reloads_total{result=\"failure\"}").unwrap_or(0.0)
}

/// Waits until `gw` serves generation `want`. A reload the gateway rejected (a changed
/// `[store]` that did not answer in time: documented) is asked again until one is taken; a
/// gateway that settles on another generation with every reload accepted lost one.
async fn converge(ctx: &Ctx, gw: &GwInfo, want: u64, mut failures: f64, report: &mut ReloadReport) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = None;
    let mut rejected_last = false;
    while Instant::now() < deadline {
        got = live_gen(ctx, gw).await;
        if got == Some(want) {
            return;
        }
        let now_failures = reload_failures(ctx, gw).await;
        if now_failures > failures {
            failures = now_failures;
            rejected_last = post_reload(ctx, gw).await == 422;
            report.rejected_by_store += u64::from(rejected_last);
            if rejected_last {
                // Redis is down or still loading its data: ask again in a moment.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            continue;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if rejected_last {
        report.lost.push(format!(
            "gateway {}: every reload was rejected for 30 s (the store did not answer)",
            gw.admin
        ));
    } else {
        report.lost.push(format!(
            "gateway {} serves generation {got:?} while its file (and every reload since it was written) has {want}",
            gw.admin
        ));
    }
}

/// Rewrites both gateways' config files and reloads them every 2–6 s: `POST /-/reload`,
/// `SIGHUP`, overlapping reloads (a file rewritten while the previous reload may still be
/// reading it, both signals and requests), and invalid files (422, the old config keeps
/// serving).
async fn reloads(ctx: Arc<Ctx>, seed: u64) -> ReloadReport {
    let mut lcg = Lcg(seed);
    let mut report = ReloadReport::default();
    let mut gen = 0;
    let write = |gen: u64| {
        let text = config_toml(&ctx.topology, gen, &ctx.routes);
        for gw in &ctx.gws {
            write_atomically(&gw.config, &text);
        }
    };
    while anap(&ctx, between(&mut lcg, 2000, 6000)).await {
        let mut before = Vec::new();
        for gw in &ctx.gws {
            before.push(reload_failures(&ctx, gw).await);
        }
        match lcg.next(4) {
            0 => {
                ctx.event("reload: POST /-/reload");
                gen += 1;
                write(gen);
                for gw in &ctx.gws {
                    report.posts += 1;
                    let _ = post_reload(&ctx, gw).await;
                }
            }
            1 => {
                ctx.event("reload: SIGHUP");
                gen += 1;
                write(gen);
                for gw in &ctx.gws {
                    report.sighups += 1;
                    sighup(gw);
                }
            }
            2 => {
                ctx.event("reload: overlapping (file rewritten between reloads)");
                let mut tasks = Vec::new();
                for _ in 0..between(&mut lcg, 2, 4) {
                    gen += 1;
                    write(gen);
                    for gw in ctx.gws.clone() {
                        if lcg.next(3) == 0 {
                            report.sighups += 1;
                            sighup(&gw);
                        } else {
                            report.posts += 1;
                            let ctx = ctx.clone();
                            tasks.push(tokio::spawn(async move { post_reload(&ctx, &gw).await }));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(lcg.next(30))).await;
                }
                for gw in &ctx.gws {
                    // The last reload of each gateway starts after the last write.
                    report.posts += 1;
                    let (ctx, gw) = (ctx.clone(), gw.clone());
                    tasks.push(tokio::spawn(async move { post_reload(&ctx, &gw).await }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            }
            _ => {
                ctx.event("reload: invalid file (expect 422)");
                let text = format!(
                    "{}[[routes]]\nname = \"broken\"\nupstream = \"app\"\n",
                    config_toml(&ctx.topology, gen + 1, &ctx.routes)
                );
                for gw in &ctx.gws {
                    write_atomically(&gw.config, &text);
                }
                for gw in &ctx.gws {
                    report.posts += 1;
                    let status = post_reload(&ctx, gw).await;
                    if status != 422 {
                        report.invalid.push(format!(
                            "gateway {}: an invalid file was answered {status}, not 422",
                            gw.admin
                        ));
                    }
                    let serving = live_gen(&ctx, gw).await;
                    if serving.is_some_and(|g| g != gen) {
                        report.invalid.push(format!(
                            "gateway {}: after an invalid file it serves generation {serving:?}, not {gen}",
                            gw.admin
                        ));
                    }
                }
                // Put a valid file back (the next reload must take it).
                gen += 1;
                write(gen);
                before.clear();
                for gw in &ctx.gws {
                    before.push(reload_failures(&ctx, gw).await);
                }
                for gw in &ctx.gws {
                    report.posts += 1;
                    let _ = post_reload(&ctx, gw).await;
                }
            }
        }
        for (gw, failures) in ctx.gws.iter().zip(&before) {
            converge(&ctx, gw, gen, *failures, &mut report).await;
        }
    }
    report
}

// ---------------------------------------------------------------------------------------------
// Hostile requests.
// ---------------------------------------------------------------------------------------------

/// What a raw exchange ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Raw {
    Status(u16),
    /// Closed (or reset) without a status line.
    Closed,
    /// Nothing within the bound.
    Hung,
}

/// Sends `bytes` and reads until a status line, the end of the connection, or `bound`.
async fn raw_exchange(addr: SocketAddr, bytes: &[u8], bound: Duration) -> Raw {
    let go = async {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            return Raw::Closed;
        };
        let _ = s.write_all(bytes).await;
        read_status(&mut s).await
    };
    tokio::time::timeout(bound, go).await.unwrap_or(Raw::Hung)
}

async fn read_status(s: &mut TcpStream) -> Raw {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return status_of(&buf).map_or(Raw::Closed, Raw::Status),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(code) = status_of(&buf) {
            return Raw::Status(code);
        }
        if buf.len() > 64 * 1024 {
            return Raw::Closed;
        }
    }
}

fn status_of(buf: &[u8]) -> Option<u16> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[..line_end]).ok()?;
    line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// The hostile requests, each with the answers the README documents for it (`None`: any
/// answer but a 500 or a hang).
fn hostile(kind: u64, lcg: &mut Lcg) -> (&'static str, Vec<u8>, Option<&'static [u16]>) {
    match kind {
        0 => {
            let big = "a".repeat(80 * 1024);
            (
                "oversized head (80 KiB header)",
                format!("GET /open/x HTTP/1.1\r\nHost: t\r\nX-Big: {big}\r\n\r\n").into_bytes(),
                Some(&[431]),
            )
        }
        1 => (
            "path parameter /x;y",
            b"GET /open/x;y HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
            Some(&[400]),
        ),
        2 => (
            "encoded NUL %00",
            b"GET /open/%00 HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
            Some(&[400]),
        ),
        3 => (
            "invalid chunked body",
            b"POST /open/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            Some(&[400]),
        ),
        4 => (
            "Content-Length with Transfer-Encoding",
            b"POST /open/x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_vec(),
            Some(&[400]),
        ),
        5 => {
            let mut junk: Vec<u8> = (0..256).map(|_| lcg.next(256) as u8).collect();
            junk.extend_from_slice(b"\r\n\r\n");
            ("garbage bytes", junk, None)
        }
        6 => (
            "API key sent twice on a limited route",
            b"GET /fw/x HTTP/1.1\r\nHost: t\r\nX-Api-Key: fw-k0\r\nX-Api-Key: fw-k1\r\n\r\n".to_vec(),
            Some(&[400]),
        ),
        7 => (
            "target over 8 KiB",
            format!("GET /open/{} HTTP/1.1\r\nHost: t\r\n\r\n", "b".repeat(9000)).into_bytes(),
            Some(&[414]),
        ),
        8 => (
            "chunk size overflow",
            b"POST /open/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffffff\r\nx\r\n0\r\n\r\n"
                .to_vec(),
            Some(&[400]),
        ),
        9 => (
            "control character in a header value",
            b"GET /open/x HTTP/1.1\r\nHost: t\r\nX-A: a\x01b\r\n\r\n".to_vec(),
            Some(&[400]),
        ),
        10 => (
            "HTTP/2 preface, then junk",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x07\x00\x00\x00\x00\x00garbage-garbage!!".to_vec(),
            None,
        ),
        _ => (
            "dot-segments above the root",
            b"GET /open/../../x HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
            Some(&[400]),
        ),
    }
}

#[derive(Default, Debug)]
struct HostileReport {
    sent: BTreeMap<&'static str, u64>,
    wrong: Vec<String>,
    slowloris: u64,
    slowloris_slowest: Duration,
}

/// A slowloris: a head sent a line every 300 ms. The gateway must close it within
/// `header_read_timeout` (2 s here); the soak gives it 8 s.
async fn slowloris(addr: SocketAddr) -> Result<Duration, String> {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let _ = s.write_all(b"GET /open/x HTTP/1.1\r\nHost: t\r\n").await;
    let mut buf = [0u8; 1024];
    while started.elapsed() < Duration::from_secs(8) {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                // 408, or closed: either is the end of it.
                Ok(_) | Err(_) => return Ok(started.elapsed()),
            },
            _ = tokio::time::sleep(Duration::from_millis(300)) => {
                if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                    return Ok(started.elapsed());
                }
            }
        }
    }
    Err(format!(
        "slowloris still open after {:?}",
        started.elapsed()
    ))
}

async fn hostiles(ctx: Arc<Ctx>, seed: u64) -> HostileReport {
    let mut lcg = Lcg(seed);
    let mut report = HostileReport::default();
    let mut slow = Vec::new();
    while anap(&ctx, between(&mut lcg, 100, 400)).await {
        let gw = ctx.gws[lcg.next(ctx.gws.len() as u64) as usize].proxy;
        if lcg.next(10) == 0 && slow.len() < 4 {
            slow.push(tokio::spawn(slowloris(gw)));
            continue;
        }
        let (name, bytes, expect) = hostile(lcg.next(12), &mut lcg);
        *report.sent.entry(name).or_default() += 1;
        let got = raw_exchange(gw, &bytes, Duration::from_secs(10)).await;
        let fine = match (&got, expect) {
            (Raw::Hung, _) | (Raw::Status(500), _) => false,
            (Raw::Status(s), Some(ok)) => ok.contains(s),
            (Raw::Closed, Some(_)) => false,
            (_, None) => true,
        };
        if !fine && report.wrong.len() < 20 {
            report
                .wrong
                .push(format!("{name}: got {got:?}, expected {expect:?}"));
        }
        let (done, open): (Vec<_>, Vec<_>) = slow.into_iter().partition(|t| t.is_finished());
        slow = open;
        for t in done {
            slowloris_result(t.await, &mut report);
        }
    }
    for t in slow {
        slowloris_result(t.await, &mut report);
    }
    report
}

fn slowloris_result(
    r: Result<Result<Duration, String>, tokio::task::JoinError>,
    report: &mut HostileReport,
) {
    report.slowloris += 1;
    match r {
        Ok(Ok(d)) => report.slowloris_slowest = report.slowloris_slowest.max(d),
        Ok(Err(e)) => report.wrong.push(e),
        Err(e) => report.wrong.push(format!("slowloris task: {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------------------------

/// Whether `items` (first window, last window, units) can be assigned each to one window of
/// its range with at most `cap` units in every window (earliest deadline first, which is
/// exact for ranges on a line). `Err(window)`: the first window that overflows.
fn fits_windows(mut items: Vec<(i64, i64, i64)>, cap: i64) -> Result<(), i64> {
    items.sort_unstable();
    let mut heap: BinaryHeap<Reverse<(i64, i64)>> = BinaryHeap::new();
    let mut i = 0;
    let mut k = i64::MIN;
    while i < items.len() || !heap.is_empty() {
        if heap.is_empty() {
            k = k.max(items[i].0);
        }
        while i < items.len() && items[i].0 <= k {
            heap.push(Reverse((items[i].1, items[i].2)));
            i += 1;
        }
        let mut room = cap;
        while room > 0 {
            let Some(Reverse((last, left))) = heap.pop() else {
                break;
            };
            let take = left.min(room);
            room -= take;
            if left > take {
                heap.push(Reverse((last, left - take)));
            }
        }
        if let Some(Reverse((last, _))) = heap.peek() {
            if *last <= k {
                return Err(k);
            }
        }
        k += 1;
    }
    Ok(())
}

/// The outcome of one budget check.
struct BudgetResult {
    what: String,
    admitted: i64,
    /// Left out: a post-response charge that overlapped an outage (documented as lost).
    exempt: i64,
    /// Requests left out (a charge is one per request).
    exempt_requests: u64,
    worst: String,
    ok: bool,
}

/// `(lo, hi, units)` of the counted responses of one subject.
type Items = Vec<Rec>;

fn check_budget(budget: Budget, cap_extra: i64, items: &Items) -> (bool, String) {
    match budget {
        Budget::Window { l, p_us } => {
            let cap = l + cap_extra;
            let mut definite: HashMap<i64, i64> = HashMap::new();
            let ranged: Vec<(i64, i64, i64)> = items
                .iter()
                .map(|r| {
                    let (a, b) = (r.lo.div_euclid(p_us), r.hi.div_euclid(p_us));
                    if a == b {
                        *definite.entry(a).or_default() += r.units;
                    }
                    (a, b, r.units)
                })
                .collect();
            let max = definite.values().copied().max().unwrap_or(0);
            match fits_windows(ranged, cap) {
                Ok(()) => (true, format!("max {max} per window, budget {cap}")),
                Err(w) => {
                    let mut inside: Vec<&Rec> = items
                        .iter()
                        .filter(|r| r.lo.div_euclid(p_us) <= w && r.hi.div_euclid(p_us) >= w)
                        .collect();
                    inside.sort_by_key(|r| r.lo);
                    let inside: Vec<String> = inside
                        .iter()
                        .map(|r| {
                            format!(
                                "{}+{}ms:{}u@gw{}/r={:?}",
                                (r.lo - w * p_us) / 1000,
                                (r.hi - r.lo) / 1000,
                                r.units,
                                r.gw,
                                r.remaining
                            )
                        })
                        .collect();
                    (
                        false,
                        format!(
                            "window starting at {} µs holds more than {cap} (max {max} per window); \
                             in it (ms into the window + bracket: units, gateway, RateLimit r): {}",
                            w * p_us,
                            inside.join(" ")
                        ),
                    )
                }
            }
        }
        Budget::Span { l, p_us } => {
            let mut sorted: Vec<(i64, i64)> = items.iter().map(|r| (r.lo, r.hi)).collect();
            sorted.sort_unstable();
            let mut max = 0;
            for (i, &(lo, _)) in sorted.iter().enumerate() {
                let n = sorted[i..]
                    .iter()
                    .take_while(|&&(lo2, _)| lo2 - lo < p_us)
                    .filter(|&&(_, hi2)| hi2 - lo < p_us)
                    .count() as i64;
                max = max.max(n);
            }
            (
                max <= l,
                format!("max {max} within any {} ms, budget {l}", p_us / 1000),
            )
        }
        Budget::Rate { cap, t_us } => {
            let mut sorted: Vec<(i64, i64)> = items.iter().map(|r| (r.lo, r.hi)).collect();
            sorted.sort_unstable();
            let horizon = (cap + 20) * t_us;
            let mut worst = i64::MIN;
            let mut detail = String::new();
            for (i, &(lo, hi0)) in sorted.iter().enumerate() {
                let mut max_hi = hi0;
                for (n, &(lo2, hi2)) in sorted[i..].iter().enumerate() {
                    if lo2 - lo > horizon {
                        break;
                    }
                    max_hi = max_hi.max(hi2);
                    let count = n as i64 + 1;
                    let bound = cap + (max_hi - lo) / t_us;
                    if count - bound > worst {
                        worst = count - bound;
                        detail = format!(
                            "{count} admitted within {} ms where the bucket allows {bound}",
                            (max_hi - lo) / 1000
                        );
                    }
                }
            }
            (worst <= 0, detail)
        }
        Budget::InFlight { .. } => unreachable!("checked at the upstream"),
    }
}

fn budgets(ctx: &Ctx, recs: &[Vec<Rec>], up: &UpstreamLog) -> Vec<BudgetResult> {
    let outages = ctx.outages.lock().unwrap().clone();
    let store_errors = ctx.store_errors.lock().unwrap().clone();
    // A charge fails within its request's bracket; the counter shows it at the next scrape.
    let in_outage = |lo: i64, hi: i64| {
        outages
            .iter()
            .any(|&(a, b)| lo <= b + OUTAGE_MARGIN && hi >= a)
            || store_errors.iter().any(|&(a, b)| lo <= b && hi >= a)
    };
    let inside = up.inside.lock().unwrap();
    let mut out = Vec::new();
    for (ri, route) in ctx.routes.iter().enumerate() {
        let want = match route.counts {
            Counts::Ok => 200,
            Counts::Unauthorized => 401,
        };
        for l in &route.limits {
            if let Budget::InFlight { l: slots } = l.budget {
                let mut max = 0;
                let mut admitted = 0;
                for ((r, _), &(_, m)) in inside.counts.iter() {
                    if r == route.name {
                        max = max.max(m);
                    }
                }
                let over: Vec<String> = inside
                    .over
                    .iter()
                    .filter(|(_, r, _, _)| r == route.name)
                    .map(|(t, _, k, n)| format!("{n} of {k} at {t} µs"))
                    .collect();
                for rec in &recs[ri] {
                    admitted += i64::from(rec.status == want);
                }
                out.push(BudgetResult {
                    what: format!("{}/{} (concurrency)", route.name, l.name),
                    admitted,
                    exempt: 0,
                    exempt_requests: 0,
                    worst: if over.is_empty() {
                        format!("max {max} in the upstream at once, slots {slots}")
                    } else {
                        format!(
                            "max {max} in the upstream at once, slots {slots}: {}",
                            over.join(", ")
                        )
                    },
                    ok: max <= slots,
                });
                continue;
            }
            let mut subjects: BTreeMap<u8, Items> = BTreeMap::new();
            let (mut admitted, mut exempt, mut exempt_requests) = (0, 0, 0);
            for rec in recs[ri].iter().filter(|r| r.status == want) {
                let units = if l.after { rec.units } else { 1 };
                admitted += units;
                if l.after && in_outage(rec.lo, rec.hi) {
                    exempt += units;
                    exempt_requests += 1;
                    continue;
                }
                let subject = if l.per_key { rec.key } else { 0 };
                subjects
                    .entry(subject)
                    .or_default()
                    .push(Rec { units, ..*rec });
            }
            let mut ok = true;
            let mut worst = String::new();
            for (subject, items) in &subjects {
                let (fine, detail) = check_budget(l.budget, l.overshoot, items);
                if !fine || worst.is_empty() {
                    worst = if l.per_key {
                        format!("key {subject}: {detail}")
                    } else {
                        detail
                    };
                }
                ok &= fine;
                if !fine {
                    break;
                }
            }
            let alg = l.toml.split('"').nth(1).unwrap_or("?");
            out.push(BudgetResult {
                what: format!("{}/{} ({alg})", route.name, l.name),
                admitted,
                exempt,
                exempt_requests,
                worst,
                ok,
            });
        }
    }
    out
}

fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

async fn scrape(client: &reqwest::Client, gw: &GwInfo) -> String {
    match client
        .get(format!("http://{}/metrics", gw.admin))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

struct Line {
    name: String,
    ok: bool,
    detail: String,
}

fn line(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Line {
    Line {
        name: name.into(),
        ok,
        detail: detail.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// The soak.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a chaos soak of minutes: scripts/soak [SECONDS]"]
async fn chaos_soak() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_us() as u64);
    let started = Instant::now();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    eprintln!(
        "soak: {seconds} s of chaos, seed {seed} (SOAK_SEED={seed} repeats its choices), {date}"
    );

    let mut redis = SoakRedis::new();
    let (net_port, net) = net_proxy(redis.port);
    let log = Arc::new(UpstreamLog::default());
    let mut app = Vec::new();
    for _ in 0..3 {
        app.push(Server::new(log.clone()).await);
    }
    let stable = Server::new(Arc::new(UpstreamLog::default())).await;
    let topology = Topology {
        net_port,
        app: app.iter().map(Server::url).collect(),
        stable: stable.url(),
    };
    let routes = routes(seconds);
    let first = config_toml(&topology, 0, &routes);
    let gateways = [support::gateway(&first), support::gateway(&first)];
    for gw in &gateways {
        support::wait_ready(gw).await;
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        gws: gateways
            .iter()
            .map(|g| GwInfo {
                proxy: g.proxy,
                admin: g.admin,
                pid: g.child.id(),
                config: g.config_path.clone(),
            })
            .collect(),
        routes,
        topology,
        stop_chaos: AtomicBool::new(false),
        stop_traffic: AtomicBool::new(false),
        outages: Mutex::new(Vec::new()),
        store_errors: Mutex::new(Vec::new()),
        events: Mutex::new(BTreeMap::new()),
        timeline: Mutex::new(Vec::new()),
        transport_errors: Mutex::new(Vec::new()),
    });

    // Traffic, then the warm-up and the RSS baseline.
    let mut traffic_tasks = Vec::new();
    let mut n = 0u64;
    for (ri, r) in ctx.routes.iter().enumerate() {
        for _ in 0..r.tasks {
            n += 1;
            traffic_tasks.push((ri, tokio::spawn(traffic(ctx.clone(), ri, seed ^ (n << 32)))));
        }
    }
    let monitor = tokio::spawn(store_error_monitor(ctx.clone()));
    tokio::time::sleep(WARM_UP).await;
    let rss_start: Vec<Option<u64>> = ctx.gws.iter().map(|g| rss_kb(g.pid)).collect();

    // The driver.
    let redis_driver = {
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            redis_chaos(&ctx, &mut redis, &net, seed.wrapping_add(1));
            (redis, net)
        })
    };
    let flaps = tokio::spawn(upstream_flaps(ctx.clone(), app, seed.wrapping_add(2)));
    let reload_task = tokio::spawn(reloads(ctx.clone(), seed.wrapping_add(3)));
    let hostile_task = tokio::spawn(hostiles(ctx.clone(), seed.wrapping_add(4)));
    let chaos_started = Instant::now();
    while chaos_started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = chaos_started.elapsed().as_secs();
        if s % 60 == 0 {
            eprintln!("soak: {s} s of {seconds}");
        }
    }
    ctx.stop_chaos.store(true, Ordering::Relaxed);
    let (redis, _net) = tokio::task::spawn_blocking(move || redis_driver.join())
        .await
        .unwrap()
        .expect("the Redis driver panicked");
    let _app = flaps.await.expect("the upstream driver panicked");
    let reload_report = reload_task.await.expect("the reload driver panicked");
    let hostile_report = hostile_task.await.expect("the hostile driver panicked");
    let chaos_time = chaos_started.elapsed();

    // A healthy tail, then the traffic stops.
    tokio::time::sleep(TAIL).await;
    ctx.stop_traffic.store(true, Ordering::Relaxed);
    let _ = monitor.await;
    let mut recs: Vec<Vec<Rec>> = vec![Vec::new(); ctx.routes.len()];
    for (ri, t) in traffic_tasks {
        recs[ri].extend(t.await.expect("a traffic task panicked"));
    }

    // Slots: both gauges at 0 and no live lease in Redis, within SETTLE.
    let settle_start = Instant::now();
    let (mut gauges, mut leases);
    loop {
        gauges = Vec::new();
        for gw in &ctx.gws {
            let text = scrape(&client, gw).await;
            gauges.push(metric_sum(&text, "tollgate_ratelimit_in_flight", &[]));
        }
        leases = redis.live_leases();
        let clear = gauges.iter().all(|g| *g == 0.0) && leases == Some(0);
        if clear || settle_start.elapsed() > SETTLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let settle_time = settle_start.elapsed();
    let rss_end: Vec<Option<u64>> = ctx.gws.iter().map(|g| rss_kb(g.pid)).collect();

    // ---- the report ----
    let mut lines = Vec::new();
    let results = budgets(&ctx, &recs, &log);
    let budgets_ok = results.iter().all(|r| r.ok);
    lines.push(line(
        "no limit admitted more than its budget",
        budgets_ok,
        format!(
            "{} limits checked{}",
            results.len(),
            results
                .iter()
                .filter(|r| !r.ok)
                .map(|r| format!("; {}: {}", r.what, r.worst))
                .collect::<String>()
        ),
    ));
    lines.push(line(
        "no slot held after the driver stops",
        gauges.iter().all(|g| *g == 0.0) && leases == Some(0),
        format!(
            "tollgate_ratelimit_in_flight {gauges:?}, live Redis leases {leases:?}, after {:.1} s",
            settle_time.as_secs_f64()
        ),
    ));
    let mut rss_ok = true;
    let mut rss_detail = Vec::new();
    for (i, (s, e)) in rss_start.iter().zip(&rss_end).enumerate() {
        let (Some(s), Some(e)) = (s, e) else {
            rss_ok = false;
            rss_detail.push(format!("gateway {i}: RSS unreadable"));
            continue;
        };
        let bound = 2 * s + 30 * 1024;
        rss_ok &= *e <= bound;
        rss_detail.push(format!(
            "gateway {i}: {:.1} → {:.1} MB (bound {:.1})",
            *s as f64 / 1024.0,
            *e as f64 / 1024.0,
            bound as f64 / 1024.0
        ));
    }
    lines.push(line(
        "RSS back near its start",
        rss_ok,
        rss_detail.join("; "),
    ));
    let mut panics = Vec::new();
    let mut alive = true;
    let mut gateways = gateways;
    for (i, gw) in gateways.iter_mut().enumerate() {
        let logs = gw.logs();
        if let Some(l) = logs.lines().find(|l| l.contains("panicked")) {
            panics.push(format!("gateway {i}: {l}"));
        }
        if let Ok(Some(status)) = gw.child.try_wait() {
            alive = false;
            panics.push(format!("gateway {i} exited: {status}"));
        }
    }
    lines.push(line(
        "no panic in the logs, both gateways running",
        panics.is_empty() && alive,
        if panics.is_empty() {
            "none".to_owned()
        } else {
            panics.join("; ")
        },
    ));
    lines.push(line(
        "reloads converge on the file",
        reload_report.lost.is_empty() && reload_report.invalid.is_empty(),
        format!(
            "{} POST, {} SIGHUP; {} retries of a reload a store that did not answer in time rejected{}{}",
            reload_report.posts,
            reload_report.sighups,
            reload_report.rejected_by_store,
            reload_report
                .lost
                .iter()
                .map(|l| format!("; {l}"))
                .collect::<String>(),
            reload_report
                .invalid
                .iter()
                .map(|l| format!("; {l}"))
                .collect::<String>(),
        ),
    ));
    let hostile_total: u64 = hostile_report.sent.values().sum();
    lines.push(line(
        "hostile requests answered as documented",
        hostile_report.wrong.is_empty(),
        format!(
            "{hostile_total} requests, {} slowloris (slowest closed after {:.1} s){}",
            hostile_report.slowloris,
            hostile_report.slowloris_slowest.as_secs_f64(),
            hostile_report
                .wrong
                .iter()
                .map(|w| format!("; {w}"))
                .collect::<String>()
        ),
    ));
    let mut statuses: BTreeMap<&str, BTreeMap<u16, u64>> = BTreeMap::new();
    let mut total = 0u64;
    for (ri, r) in recs.iter().enumerate() {
        for rec in r {
            total += 1;
            *statuses
                .entry(ctx.routes[ri].name)
                .or_default()
                .entry(rec.status)
                .or_default() += 1;
        }
    }
    let mut texts = Vec::new();
    for gw in &ctx.gws {
        texts.push(scrape(&client, gw).await);
    }
    let sum = |name: &str, labels: &[&str]| -> f64 {
        texts.iter().map(|t| metric_sum(t, name, labels)).sum()
    };
    let count_status = |route: &str, status: u16| -> u64 {
        statuses
            .get(route)
            .and_then(|m| m.get(&status))
            .copied()
            .unwrap_or(0)
    };
    // A post-response charge is lost only when the store fails (documented): every response
    // whose charge the gateways did not apply overlapped an outage.
    let mut lost_lines = Vec::new();
    let mut lost_ok = true;
    for (route, limit, status) in [("cost", "units", 200), ("login", "failed-logins", 401)] {
        let charged = sum(
            "tollgate_ratelimit_decisions_total",
            &[
                &format!("route=\"{route}\""),
                &format!("limit=\"{limit}\""),
                "decision=\"charged_after\"",
            ],
        ) as u64;
        let responses = count_status(route, status);
        let lost = responses.saturating_sub(charged);
        let in_outages = results
            .iter()
            .find(|r| r.what.starts_with(&format!("{route}/{limit} ")))
            .map_or(0, |r| r.exempt_requests);
        lost_ok &= lost <= in_outages;
        lost_lines.push(format!(
            "{route}/{limit}: {charged} of {responses} charged, {lost} lost, {in_outages} overlapped an outage"
        ));
    }
    lines.push(line(
        "post-response charges lost only in outages",
        lost_ok,
        lost_lines.join("; "),
    ));
    let five_hundreds: u64 = statuses
        .values()
        .map(|m| m.get(&500).copied().unwrap_or(0))
        .sum();
    lines.push(line(
        "normal traffic never got a 500",
        five_hundreds == 0,
        format!("{five_hundreds} of {total}"),
    ));

    let mut out = String::new();
    out.push_str(&format!(
        "\n==== chaos soak: {date}, {:.0} s of chaos ({:.0} s in all), seed {seed} ====\n\n",
        chaos_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    out.push_str("invariant                                     | result | detail\n");
    out.push_str("----------------------------------------------|--------|-------\n");
    for l in &lines {
        out.push_str(&format!(
            "{:<46}| {:<7}| {}\n",
            l.name,
            if l.ok { "PASS" } else { "FAIL" },
            l.detail
        ));
    }
    out.push_str("\nbudgets (admitted: units the clients saw admitted; exempt: post-response charges overlapping an outage)\n");
    for r in &results {
        out.push_str(&format!(
            "  {:<34} {:<5} admitted {:>6}  exempt {:>4}  {}\n",
            r.what,
            if r.ok { "ok" } else { "OVER" },
            r.admitted,
            r.exempt,
            r.worst
        ));
    }
    out.push_str(&format!(
        "\nrequests: {total} (plus {hostile_total} hostile)\n"
    ));
    for (route, m) in &statuses {
        let parts: Vec<String> = m
            .iter()
            .map(|(s, n)| {
                if *s == 0 {
                    format!("transport error {n}")
                } else {
                    format!("{s} {n}")
                }
            })
            .collect();
        out.push_str(&format!("  {route:<6} {}\n", parts.join(", ")));
    }
    {
        let outages = ctx.outages.lock().unwrap();
        let errors = ctx.store_errors.lock().unwrap();
        let outside = errors
            .iter()
            .filter(|&&(a, b)| {
                !outages
                    .iter()
                    .any(|&(oa, ob)| a <= ob + OUTAGE_MARGIN && b >= oa)
            })
            .count();
        out.push_str(&format!(
            "\nstore errors seen in {} scrape intervals of 250 ms, {outside} of them away from the driver's outages\n",
            errors.len()
        ));
    }
    out.push_str("\nchaos:\n");
    for (what, n) in ctx.events.lock().unwrap().iter() {
        out.push_str(&format!("  {what:<54} {n}\n"));
    }
    out.push_str(&format!(
        "\ngateways (both): store errors {}, fail_closed {}, deny-cache hits {}, reloads ok {} / failed {}, upstream errors {}, retries {}\n",
        sum("tollgate_store_errors_total", &[]),
        sum("tollgate_ratelimit_decisions_total", &["decision=\"fail_closed\""]),
        sum("tollgate_store_deny_cache_hits_total", &[]),
        sum("tollgate_config_reloads_total", &["result=\"success\""]),
        sum("tollgate_config_reloads_total", &["result=\"failure\""]),
        sum("tollgate_upstream_errors_total", &[]),
        sum("tollgate_upstream_retries_total", &[]),
    ));
    out.push_str(&format!(
        "upstream requests: {}\n",
        log.hits.load(Ordering::Relaxed)
    ));
    let errs = ctx.transport_errors.lock().unwrap();
    if !errs.is_empty() {
        out.push_str("transport errors (first 20):\n");
        for e in errs.iter() {
            out.push_str(&format!("  {e}\n"));
        }
    }
    eprintln!("{out}");
    // Every gateway's whole log, for a look after the run.
    let log_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak");
    let _ = std::fs::create_dir_all(&log_dir);
    let timeline: String = ctx
        .timeline
        .lock()
        .unwrap()
        .iter()
        .map(|(t, what)| format!("{t} {what}\n"))
        .collect();
    let _ = std::fs::write(log_dir.join("events.log"), timeline);
    for (i, gw) in gateways.iter().enumerate() {
        let path = log_dir.join(format!("gateway-{i}.log"));
        if std::fs::write(&path, gw.logs()).is_ok() {
            eprintln!("gateway {i}'s log: {}", path.display());
        }
    }
    let failed: Vec<&str> = lines
        .iter()
        .filter(|l| !l.ok)
        .map(|l| l.name.as_str())
        .collect();
    if !failed.is_empty() {
        for (i, gw) in gateways.iter().enumerate() {
            let logs = gw.logs();
            let tail: Vec<&str> = logs.lines().rev().take(30).collect();
            eprintln!("---- gateway {i}: last log lines ----");
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
    assert!(failed.is_empty(), "invariants failed: {failed:?}");
}
