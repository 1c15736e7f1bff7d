//! A fleet of gateways on one Redis: the local tier (`store = "local"`), Redis Sentinel, and
//! leases.

mod support;

use support::*;

/// `r` of limit `name` in a `RateLimit` field, if the field names it.
fn remaining(res: &reqwest::Response, name: &str) -> Option<u64> {
    let field = res.headers().get("ratelimit")?.to_str().ok()?;
    let item = field
        .split(", ")
        .find(|i| i.starts_with(&format!("\"{name}\";")))?;
    item.split(';')
        .find_map(|p| p.strip_prefix("r="))
        .and_then(|r| r.parse().ok())
}

/// A local burst guard (per client, in each gateway) in front of a shared quota (per team):
/// all-or-nothing across both tiers, and the shared tier is not asked when the local one
/// refuses.
async fn local_tier(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"burst\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"header:X-Client\"\nstore = \"local\"")
        + &limit("name = \"quota\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:X-Team\"");
    let cfg = config(&env.store, &routes);
    let a = gateway(&cfg);
    let b = gateway(&cfg);
    wait_ready(&a).await;
    wait_ready(&b).await;
    let c = client();
    let send = |gw: &Gateway, client: &str, team: &str| {
        c.get(gw.url("/api/x"))
            .header("x-client", client)
            .header("x-team", team)
            .send()
    };
    let shared = !matches!(kind, Kind::Memory);

    let r = send(&a, "c1", "t1").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        (remaining(&r, "burst"), remaining(&r, "quota")),
        (Some(2), Some(1))
    );
    let r = send(&a, "c1", "t1").await.unwrap();
    assert_eq!(r.status(), 200);
    // The quota refuses: c1's burst unit goes back (three times over).
    for _ in 0..3 {
        let r = send(&a, "c1", "t1").await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(remaining(&r, "quota"), Some(0));
    }
    let r = send(&a, "c1", "t2").await.unwrap();
    assert_eq!(r.status(), 200, "the refused requests kept no burst units");
    assert_eq!(remaining(&r, "burst"), Some(0));
    // The burst guard refuses: the quota is not charged (and, on Redis, not asked).
    let r = send(&a, "c1", "t3").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(remaining(&r, "burst"), Some(0));
    if shared {
        assert_eq!(remaining(&r, "quota"), None, "an unasked limit is left out");
    }
    let r = send(&b, "c9", "t3").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        remaining(&r, "quota"),
        Some(1),
        "t3's quota was not charged"
    );
    // Gateway b: its own burst count for c1, the quota shared on Redis.
    let r = send(&b, "c1", "t1").await.unwrap();
    if shared {
        assert_eq!(r.status(), 429, "t1's quota is spent fleet-wide");
    } else {
        assert_eq!(r.status(), 200, "each in-process store counts alone");
    }
    let r = send(&b, "c1", "t4").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        remaining(&r, "burst"),
        Some(if shared { 2 } else { 1 }),
        "b counts c1 alone (a refused request gave its unit back)"
    );
    let text = a.metrics().await;
    assert_eq!(decisions(&text, "api", "burst", "limited"), Some(1.0));
    assert_eq!(decisions(&text, "api", "quota", "limited"), Some(3.0));
}

on_every_store_and_cluster!(local_tier);

/// Redis Sentinel: a primary, a replica and three sentinels; the primary is killed under
/// traffic. The gateway does not crash, `on_error` applies only during the switch, decisions
/// resume on the new primary within 5 s of the sentinels' switch, and `tollgate_store_up`
/// follows.
#[tokio::test(flavor = "multi_thread")]
async fn a_sentinel_failover_under_traffic() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let mut set = start_sentinels();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"wide\"\nalgorithm = \"fixed_window\"\nlimit = 1000000\nperiod = \"1h\"\nsubject = \"global\"")
        + &route("exact", "/exact", &up.url(), "")
        + &limit("name = \"k\"\nalgorithm = \"gcra\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"header:X-Key\"");
    let mut gw = gateway(&config(
        &set.store("timeout = \"200ms\"\non_error = \"deny\""),
        &routes,
    ));
    wait_ready(&gw).await;
    let up_gauge = |text: &str| metric(text, "tollgate_store_up");
    assert_eq!(up_gauge(&gw.metrics().await), Some(1.0));
    let old = set.primary.port;
    assert_eq!(set.primary_port(), Some(old));

    // Traffic: every answer with the time it came.
    let c = client();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<(Instant, u16)>>> = Arc::default();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (c, url, stop, seen) = (c.clone(), gw.url("/api/x"), stop.clone(), seen.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let status = match c.get(&url).send().await {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    seen.lock().unwrap().push((Instant::now(), status));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    set.primary.kill();

    // The switch, as the sentinels report it; `tollgate_store_up` watched meanwhile.
    let mut went_down = false;
    let switched = loop {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the sentinels never switched"
        );
        if set.primary_port().is_some_and(|p| p != old) {
            break Instant::now();
        }
        went_down |= up_gauge(&gw.metrics().await) == Some(0.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(set.primary_port(), Some(set.replica.port));
    while switched.elapsed() < Duration::from_secs(6) {
        went_down |= up_gauge(&gw.metrics().await) == Some(0.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    assert!(
        gw.child.try_wait().unwrap().is_none(),
        "the gateway crashed"
    );
    let seen = seen.lock().unwrap().clone();
    let odd: Vec<_> = seen
        .iter()
        .filter(|(_, s)| ![200, 503].contains(s))
        .collect();
    assert!(odd.is_empty(), "only 200 and the fail-closed 503: {odd:?}");
    let failed: Vec<Instant> = seen
        .iter()
        .filter(|(_, s)| *s == 503)
        .map(|(t, _)| *t)
        .collect();
    assert!(
        !failed.is_empty(),
        "the outage was never seen (on_error never applied)"
    );
    let first = failed.iter().min().unwrap();
    let last = failed.iter().max().unwrap();
    assert!(*first >= killed, "on_error before the primary died");
    assert!(
        *last < switched + Duration::from_secs(5),
        "still failing {:?} after the switch",
        last.duration_since(switched)
    );
    eprintln!(
        "kill→+switch-master {:?}; failures from {:?} after the kill to {:?} after the switch ({} of {})",
        switched.duration_since(killed),
        first.duration_since(killed),
        last.saturating_duration_since(switched),
        failed.len(),
        seen.len()
    );
    let after = seen.iter().filter(|(t, s)| t > last && *s == 200).count();
    assert!(
        after > 20,
        "decisions resumed: {after} admitted after the last failure"
    );
    assert!(
        went_down,
        "tollgate_store_up never said 0 during the switch"
    );
    assert_eq!(up_gauge(&gw.metrics().await), Some(1.0), "up again");

    // Exact on the new primary: 5 admitted, then refused; its keys are there.
    for i in 0..7 {
        let r = c
            .get(gw.url("/exact/x"))
            .header("x-key", "after")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), if i < 5 { 200 } else { 429 }, "request {i}");
    }
    assert!(set
        .replica
        .cli(&["KEYS", "tollgate:{exact:*"])
        .contains("exact:k:"));
    gw.signal(Signal::TERM);
    let _ = gw.child.wait();
}

/// `[server] workers = n` in a config made by [`config`].
fn with_workers(cfg: &str, n: usize) -> String {
    cfg.replacen("[server]\n", &format!("[server]\nworkers = {n}\n"), 1)
}

/// The proof: 3 gateways (2 workers each) × 240 concurrent requests on one subject, limit 100,
/// leases of at most 10: never more than 100 admitted, at least 100 − 3 × 2 × 10; and once the
/// leases are back, exactly 100 over the burst and what follows, for every leasing algorithm.
#[tokio::test(flavor = "multi_thread")]
async fn leases_never_admit_more_than_the_limit_across_gateways() {
    let r = redis();
    let up = upstream().await;
    let algs = [
        ("fixed_window", ""),
        ("token_bucket", "burst = 100\n"),
        ("gcra", "burst = 100\n"),
    ];
    let mut routes = String::new();
    for (alg, burst) in algs {
        routes += &route(alg, &format!("/{alg}"), &up.url(), "");
        routes += &limit(&format!(
            "name = \"l\"\nalgorithm = \"{alg}\"\nlimit = 100\nperiod = \"24h\"\n{burst}subject = \"header:X-Key\"\nsync = \"lease\"\nlease_max = 10\nlease_ttl = \"100ms\""
        ));
    }
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\non_error = \"deny\"",
        r.url()
    );
    let cfg = with_workers(&config(&store, &routes), 2);
    let gws = [gateway(&cfg), gateway(&cfg), gateway(&cfg)];
    for g in &gws {
        wait_ready(g).await;
    }
    let bound = 3 * 2 * 10;
    let c = client();
    for (alg, _) in algs {
        for round in 0..2 {
            let key = format!("k{round}");
            let mut tasks = Vec::new();
            for i in 0..240 {
                let (c, url, key) = (c.clone(), gws[i % 3].url(&format!("/{alg}/x")), key.clone());
                tasks.push(tokio::spawn(async move {
                    c.get(url)
                        .header("x-key", key)
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                }));
            }
            let mut ok = 0;
            for t in tasks {
                match t.await.unwrap().unwrap() {
                    200 => ok += 1,
                    429 => {}
                    s => panic!("{alg}: unexpected status {s}"),
                }
            }
            assert!(
                ok <= 100,
                "{alg} round {round}: {ok} admitted, over the limit"
            );
            assert!(
                ok >= 100 - bound,
                "{alg} round {round}: {ok} admitted, below 100 − {bound}"
            );
            // The leases go back within lease_ttl of their last use; then the rest is spent,
            // one request at a time: exactly 100 in all.
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let mut more = 0;
            for i in 0..120 {
                let s = c
                    .get(gws[i % 3].url(&format!("/{alg}/x")))
                    .header("x-key", &key)
                    .send()
                    .await
                    .unwrap()
                    .status();
                if s == 200 {
                    more += 1;
                }
            }
            assert_eq!(
                ok + more,
                100,
                "{alg} round {round}: {ok} in the burst, {more} after"
            );
            eprintln!("{alg} round {round}: {ok} admitted in the burst, {more} after");
        }
    }
    let mut returned = 0.0;
    let mut requests = 0.0;
    for g in &gws {
        let text = g.metrics().await;
        returned += metric_sum(
            &text,
            "tollgate_ratelimit_lease_units_total",
            &["outcome=\"returned\""],
        );
        requests += metric_sum(&text, "tollgate_ratelimit_lease_requests_total", &[]);
    }
    // Whether units were left to return depends on the burst's timing (the hot-subject test
    // checks the return itself).
    eprintln!("{requests} lease calls, {returned} units returned");
}

/// A hot subject takes few leases: 300 back-to-back requests of one subject on one gateway with
/// `lease_max = 20` take at most 150 lease calls (a cold subject leases 1, a hot one doubles up
/// to 20); the unused units are back within `lease_ttl`, so Redis then counts exactly 300.
/// On injected time: the leases age on the gateway's clock, so they go back as soon as the test
/// moves it past `lease_ttl` (10 s), long before 10 s of wall time.
#[tokio::test(flavor = "multi_thread")]
async fn a_hot_subject_takes_few_leases_and_gives_the_rest_back() {
    let r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 10000\nperiod = \"24h\"\nsubject = \"header:X-Key\"\nsync = \"lease\"\nlease_max = 20\nlease_ttl = \"10s\"");
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"",
        r.url()
    );
    let gw = gateway_on_clock(&with_workers(&config(&store, &routes), 1), T0);
    wait_ready(&gw).await;
    let c = client();
    let send = || c.get(gw.url("/api/x")).header("x-key", "hot").send();
    let first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(remaining(&first, "q"), Some(9999));
    let before = commandstat_calls(&r);
    for i in 1..300 {
        let res = send().await.unwrap();
        assert_eq!(res.status(), 200);
        // One gateway alone: the headers count down exactly as in exact mode (what Redis has
        // left plus what the lease still holds).
        assert_eq!(remaining(&res, "q"), Some(9999 - i), "request {i}");
    }
    let calls = commandstat_calls(&r) - before;
    let text = gw.metrics().await;
    let leases = metric(
        &text,
        "tollgate_ratelimit_lease_requests_total{route=\"api\",limit=\"q\"}",
    )
    .unwrap();
    eprintln!("300 requests: {leases} lease calls, {calls} script calls");
    assert!(leases <= 150.0, "{leases} lease calls for 300 requests");
    assert!(calls <= 150, "{calls} script calls for 300 requests");
    let used = metric(
        &text,
        "tollgate_ratelimit_lease_units_total{route=\"api\",limit=\"q\",outcome=\"used\"}",
    );
    assert_eq!(used, Some(300.0));
    // Back at lease_ttl after the last use: the sweep gives the rest back (one script call, the
    // only one: nobody sends meanwhile), and the next (cold) request sees 300 charged. Waited
    // for by polling, well under the 10 s a lease aging on wall time would take.
    let before = commandstat_calls(&r);
    gw.advance(std::time::Duration::from_secs(10)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while commandstat_calls(&r) == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the leased units did not go back at lease_ttl on the injected clock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let text = gw.metrics().await;
    let returned = metric(
        &text,
        "tollgate_ratelimit_lease_units_total{route=\"api\",limit=\"q\",outcome=\"returned\"}",
    )
    .unwrap_or(0.0);
    assert!(returned > 0.0);
    let res = send().await.unwrap();
    assert_eq!(
        remaining(&res, "q"),
        Some(10000 - 301),
        "{returned} returned"
    );
}

/// Script calls (FCALL, EVALSHA and EVAL) Redis has run so far.
fn commandstat_calls(r: &Redis) -> u64 {
    let info = r.cli(&["INFO", "commandstats"]);
    ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
        .iter()
        .filter_map(|p| info.lines().find_map(|l| l.strip_prefix(p)))
        .filter_map(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

/// A leased limit among others: all-or-nothing with an exact limit (a request the exact limit
/// refuses spends no leased units), a cost of 2, and a shadow leased limit that never refuses.
async fn leases_with_other_limits(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"units\"\nalgorithm = \"fixed_window\"\nlimit = 10\ncost = 2\nperiod = \"24h\"\nsubject = \"header:X-Key\"\nsync = \"lease\"\nlease_max = 6")
        + &limit("name = \"team\"\nalgorithm = \"gcra\"\nlimit = 3\nburst = 3\nperiod = \"24h\"\nsubject = \"header:X-Team\"")
        + &limit("name = \"watch\"\nalgorithm = \"token_bucket\"\nlimit = 1\nburst = 1\nperiod = \"24h\"\nsubject = \"header:X-Key\"\nmode = \"shadow\"\nsync = \"lease\"\nlease_max = 1");
    // One worker: leases are per worker, and units another worker holds are refused to this one
    // until they come back (the documented under-admission), whichever worker a connection
    // lands on.
    let gw = gateway(&with_workers(&config(&env.store, &routes), 1));
    wait_ready(&gw).await;
    let c = client();
    let send = |team: &str| {
        c.get(gw.url("/api/x"))
            .header("x-key", "k1")
            .header("x-team", team)
            .send()
    };
    let mut got = Vec::new();
    for team in ["t1", "t1", "t1", "t1", "t1", "t2", "t2", "t2", "t2"] {
        let r = send(team).await.unwrap();
        got.push(r.status().as_u16());
    }
    // t1: 3 admitted, then refused by `team` (no units spent); t2: the key's last 2 requests
    // (10 units at 2 each), then refused by `units`.
    assert_eq!(
        got,
        [200, 200, 200, 429, 429, 200, 200, 429, 429],
        "{kind:?}"
    );
    let text = gw.metrics().await;
    assert_eq!(
        decisions(&text, "api", "units", "limited"),
        Some(2.0),
        "{kind:?}"
    );
    assert_eq!(
        decisions(&text, "api", "team", "limited"),
        Some(2.0),
        "{kind:?}"
    );
    assert!(
        decisions(&text, "api", "watch", "shadow").unwrap_or(0.0) >= 4.0,
        "{kind:?}: the shadow limit counted what it would refuse"
    );
}

on_every_store_and_cluster!(leases_with_other_limits);

/// A shared store for the lease scenarios, which only mean something on Redis: one Redis, a
/// three-master cluster, or a primary with a replica behind three sentinels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shared {
    Redis,
    Cluster,
    Sentinel,
}

/// The running store of a [`Shared`] kind and its `[store]` body.
struct SharedEnv {
    store: String,
    redis: Option<Redis>,
    cluster: Option<Cluster>,
    sentinels: Option<SentinelSet>,
}

impl SharedEnv {
    fn start(kind: Shared) -> SharedEnv {
        SharedEnv::start_with(kind, "timeout = \"1s\"\non_error = \"deny\"")
    }

    /// [`SharedEnv::start`] with `tail` (`timeout`, `on_error`…) in the `[store]` body.
    fn start_with(kind: Shared, tail: &str) -> SharedEnv {
        match kind {
            Shared::Redis => {
                let r = redis();
                SharedEnv {
                    store: format!("backend = \"redis\"\nurl = \"{}\"\n{tail}", r.url()),
                    redis: Some(r),
                    cluster: None,
                    sentinels: None,
                }
            }
            Shared::Cluster => {
                let c = start_cluster();
                SharedEnv {
                    store: format!(
                        "backend = \"redis_cluster\"\nurls = [{}]\n{tail}",
                        c.urls_toml()
                    ),
                    redis: None,
                    cluster: Some(c),
                    sentinels: None,
                }
            }
            Shared::Sentinel => {
                let s = start_sentinels();
                SharedEnv {
                    store: s.store(tail),
                    redis: None,
                    cluster: None,
                    sentinels: Some(s),
                }
            }
        }
    }

    /// Every server holding state (the primaries).
    fn primaries(&self) -> Vec<&Redis> {
        let mut out: Vec<&Redis> = self.redis.iter().collect();
        if let Some(c) = &self.cluster {
            out.extend(c.nodes.iter());
        }
        if let Some(s) = &self.sentinels {
            out.push(&s.primary);
        }
        out
    }

    /// The state lost: `FLUSHALL` on every primary.
    fn flushall(&self) {
        for r in self.primaries() {
            assert_eq!(r.cli(&["FLUSHALL"]).trim(), "OK");
        }
    }
}

/// `scenario::redis`, `scenario::redis_cluster` and `scenario::redis_sentinel` tests of each
/// `async fn scenario(kind: Shared)`.
macro_rules! on_every_shared_store {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn redis() {
                super::$name(super::Shared::Redis).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn redis_cluster() {
                super::$name(super::Shared::Cluster).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn redis_sentinel() {
                super::$name(super::Shared::Sentinel).await
            }
        }
    )*};
}

on_every_shared_store!(
    leased_units_never_go_back_into_a_state_after_a_loss,
    a_reset_revokes_the_outstanding_leases,
    a_redis_stall_loses_no_leased_units,
    a_redis_stall_in_a_steady_flow_loses_at_most_lease_max,
);

/// Requests of subject `key` to `url` admitted before the first 429 (at most `max`).
async fn admitted_until_refused(c: &reqwest::Client, url: &str, key: &str, max: usize) -> usize {
    for n in 0..max {
        let s = c
            .get(url)
            .header("x-key", key)
            .header("x-api-key", key)
            .send()
            .await
            .unwrap()
            .status();
        if s == 429 {
            return n;
        }
        assert_eq!(s, 200, "request {n}");
    }
    max
}

/// A lease counter of `gw`'s metrics (`outcome` used, returned, expired, revoked).
async fn lease_units(gw: &Gateway, route: &str, limit: &str, outcome: &str) -> f64 {
    metric(
        &gw.metrics().await,
        &format!(
            "tollgate_ratelimit_lease_units_total{{route=\"{route}\",limit=\"{limit}\",outcome=\"{outcome}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

/// Issue #34 item 24: a lease belongs to one generation of its state. Two gateways hold leased
/// units when the state is lost (`FLUSHALL`); a third then spends the fresh limit, exactly 30.
/// When the two give their units back (at `lease_ttl` on their injected clocks) they must not
/// land in the new state: the third gateway still gets nothing more. The overshoot after a
/// loss is at most what was leased before it (here none of it is spent: 0).
async fn leased_units_never_go_back_into_a_state_after_a_loss(kind: Shared) {
    let env = SharedEnv::start(kind);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 30\nperiod = \"24h\"\nsubject = \"header:X-Key\"\nsync = \"lease\"\nlease_max = 8\nlease_ttl = \"5s\"");
    let cfg = with_workers(&config(&env.store, &routes), 1);
    let gws = [
        gateway_on_clock(&cfg, T0),
        gateway_on_clock(&cfg, T0),
        gateway_on_clock(&cfg, T0),
    ];
    for g in &gws {
        wait_ready(g).await;
    }
    let c = client();
    // Leases of 1, 2, 4 and 8: 15 units charged by each of the first two, 10 spent, 5 held.
    for g in &gws[..2] {
        assert_eq!(
            admitted_until_refused(&c, &g.url("/api/x"), "k", 10).await,
            10
        );
    }
    env.flushall();
    assert_eq!(
        admitted_until_refused(&c, &gws[2].url("/api/x"), "k", 100).await,
        30,
        "{kind:?}: a fresh limit after the loss"
    );
    // The first two give their units back, at lease_ttl after their last use (the third's
    // clock moves too: its denial is cached for lease_ttl).
    for g in &gws {
        g.advance(std::time::Duration::from_secs(6)).await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for g in &gws[..2] {
        while lease_units(g, "api", "q", "returned").await
            + lease_units(g, "api", "q", "expired").await
            < 5.0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{kind:?}: the held units were not given back"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    // Let the returns land, then ask again on the third (its own lease is spent: it asks Redis).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        admitted_until_refused(&c, &gws[2].url("/api/x"), "k", 100).await,
        0,
        "{kind:?}: units leased before the loss went back into the new state"
    );
}

/// Issue #34 item 24: `/-/quota/reset` revokes the leases of the limit it resets: after a
/// reset a consumer gets exactly the fresh limit (100), not the fresh limit plus the units its
/// gateway still held, nor plus units given back into the new state.
async fn a_reset_revokes_the_outstanding_leases(kind: Shared) {
    let env = SharedEnv::start(kind);
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    std::fs::write(
        &file,
        format!(
            "[[consumer]]\nname = \"acme\"\nplan = \"p\"\nkey_sha256 = \"{}\"\n",
            tollgate::consumers::hex(&tollgate::consumers::hash_key(b"k"))
        ),
    )
    .unwrap();
    let plans = format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = \"{}\"\n\n[[plans]]\nname = \"p\"\n[[plans.limits]]\nname = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"24h\"\nsync = \"lease\"\nlease_max = 20\nlease_ttl = \"5s\"\n\n",
        file.display()
    );
    let routes = plans + &route("api", "/api", &up.url(), "consumers = true");
    // One worker: a unit another worker holds would be refused to this one meanwhile.
    let gw = gateway_on_clock(&with_workers(&config(&env.store, &routes), 1), T0);
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");
    // Leases of 1, 2, 4, 8, 16, 20…: 50 spent, some held.
    assert_eq!(admitted_until_refused(&c, &url, "k", 50).await, 50);
    let r = c
        .post(gw.admin_url("/-/quota/reset"))
        .body(r#"{"consumer":"acme","limit":"q"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let after = admitted_until_refused(&c, &url, "k", 300).await;
    assert_eq!(after, 100, "{kind:?}: after a reset");
    // What the gateway holds of the new state goes back at lease_ttl; nothing more appears.
    gw.advance(std::time::Duration::from_secs(6)).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        admitted_until_refused(&c, &url, "k", 300).await,
        0,
        "{kind:?}: units came back after the fresh limit was spent"
    );
}

/// Issue #34 item 25: lease calls the gateway gave up on (Redis stalled past `[store] timeout`)
/// run in Redis when it resumes; they must grant nothing, or their units would go to no one.
/// After the stall the subject still gets its whole limit, 50.
async fn a_redis_stall_loses_no_leased_units(kind: Shared) {
    let env = SharedEnv::start(kind);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 50\nperiod = \"24h\"\nsubject = \"header:X-Key\"\nsync = \"lease\"\nlease_max = 10\nlease_ttl = \"5s\"");
    let gw = gateway_on_clock(&with_workers(&config(&env.store, &routes), 1), T0);
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");
    // Redis is up and the script loaded: one request, one unit.
    assert_eq!(admitted_until_refused(&c, &url, "warm", 1).await, 1);
    for r in env.primaries() {
        r.pause();
    }
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            c.get(url)
                .header("x-key", "k")
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s != 200),
        "{kind:?}: admitted while Redis was stalled: {statuses:?}"
    );
    // The stall ends: the calls the gateway gave up on run now.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    for r in env.primaries() {
        r.resume();
    }
    // The gateway reconnects (a back-off of at most 2 s): to every node of a cluster, as 30
    // subjects (on 30 slots) say.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    for probe in 0..30 {
        loop {
            let s = c
                .get(gw.url("/api/x"))
                .header("x-key", format!("probe{probe}"))
                .send()
                .await
                .unwrap()
                .status();
            if s == 200 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{kind:?}: the gateway did not come back after the stall"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        admitted_until_refused(&c, &url, "k", 100).await,
        50,
        "{kind:?}: units leased by calls the gateway gave up on were lost"
    );
}

/// Issue #50 item 16: a stall in a steady flow. One subject at 50 requests a second on one
/// worker (`fixed_window` 1000 per hour, the default `lease_max` of 50, `timeout = "50ms"`,
/// `on_error = "deny"`): its lease is renewed again and again when Redis stops for 3 s, then
/// resumes. The calls the gateway gave up on during the stall (renewals, and calls sent on the
/// connections it reopens meanwhile) run when Redis resumes; they must grant nothing. After the
/// flow, the subject's window is spent to its end: what it admitted in all is the limit, less
/// at most workers × `lease_max` = 50 (the documented bound; in practice 0), never more.
async fn a_redis_stall_in_a_steady_flow_loses_at_most_lease_max(kind: Shared) {
    use std::time::Duration;
    const LIMIT: usize = 1000;
    const LEASE_MAX: usize = LIMIT / 20; // the default: a twentieth of the quota
    let env = SharedEnv::start_with(kind, "timeout = \"50ms\"\non_error = \"deny\"");
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit(&format!("name = \"q\"\nalgorithm = \"fixed_window\"\nlimit = {LIMIT}\nperiod = \"1h\"\nsubject = \"header:X-Key\"\nsync = \"lease\""));
    // One worker: the bound is workers × lease_max, and the drain below spends what it holds.
    // An injected clock: the hour's window never ends during the test.
    let gw = gateway_on_clock(&with_workers(&config(&env.store, &routes), 1), T0);
    wait_ready(&gw).await;
    let c = client();
    let url = gw.url("/api/x");
    // The steady flow: a request every 20 ms, each on its own task (a slow answer does not
    // slow the flow), until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flow = {
        let (c, url, stop) = (c.clone(), url.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                tick.tick().await;
                let (c, url) = (c.clone(), url.clone());
                sent.push(tokio::spawn(async move {
                    c.get(url)
                        .header("x-key", "k")
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0)
                }));
            }
            let mut statuses = Vec::new();
            for t in sent {
                statuses.push(t.await.unwrap_or(0));
            }
            statuses
        })
    };
    // A second of flow (the lease grows to lease_max and is renewed), 3 s of stall, and a
    // second after it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for r in env.primaries() {
        r.pause();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for r in env.primaries() {
        r.resume();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let statuses = flow.await.unwrap();
    let flowed = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429 || *s == 503),
        "{kind:?}: {statuses:?}"
    );
    assert!(
        statuses.iter().any(|s| *s != 200),
        "{kind:?}: the stall was never seen ({} requests)",
        statuses.len()
    );
    // The gateway is back (to every node of a cluster, as 30 subjects on 30 slots say), and
    // the calls given up on have run.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    for probe in 0..30 {
        loop {
            let s = c
                .get(gw.url("/api/x"))
                .header("x-key", format!("probe{probe}"))
                .send()
                .await
                .unwrap()
                .status();
            if s == 200 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{kind:?}: the gateway did not come back after the stall"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The rest of the window, to its end (the worker's lease included).
    let drained = admitted_until_refused(&c, &url, "k", LIMIT + 1).await;
    let admitted = flowed + drained;
    let used = lease_units(&gw, "api", "q", "used").await;
    let returned = lease_units(&gw, "api", "q", "returned").await;
    let expired = lease_units(&gw, "api", "q", "expired").await;
    eprintln!(
        "{kind:?}: {} requests in the flow, {flowed} admitted; {drained} after; lease units used {used}, returned {returned}, expired {expired}",
        statuses.len()
    );
    assert!(
        admitted <= LIMIT,
        "{kind:?}: {admitted} admitted against a limit of {LIMIT}"
    );
    let lost = LIMIT - admitted;
    assert!(
        lost <= LEASE_MAX,
        "{kind:?}: {lost} units lost in the stall ({admitted} of {LIMIT} admitted: {flowed} in the flow, {drained} after it); the bound is workers × lease_max = {LEASE_MAX}"
    );
}
