//! The Redis store: decisions identical to the in-process store, exact under concurrency across
//! gateway processes, outages, key hygiene, one round trip per request, and Redis Cluster.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use tollgate::config::{
    Algorithm, Backend, LimitConfig, Mode, OnError, OnMissing, StoreConfig, SubjectSpec,
};
use tollgate::limiter::{Check, CompiledLimit, Decision, Op, SubjectDigest};
use tollgate::store::{redis_key, AnyClock, AnyStore, ManualClock, MemoryStore, Store};

fn limit_cfg(
    name: &str,
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: u64,
    cost: u64,
    mode: Mode,
) -> LimitConfig {
    LimitConfig {
        name: name.into(),
        algorithm,
        limit,
        period: Duration::from_millis(period_ms),
        subject: SubjectSpec::Global,
        burst,
        cost,
        mode,
        on_missing: OnMissing::Ip,
        calendar: None,
        after: None,
        fleet: Default::default(),
        prefixes: Default::default(),
        exempt: Default::default(),
        refusal: None,
        limit_from: None,
        ban: None,
    }
}

fn redis_store_cfg(url: String) -> StoreConfig {
    StoreConfig {
        backend: Backend::Redis,
        urls: vec![url],
        timeout: Duration::from_secs(2),
        on_error: OnError::Deny,
        key_prefix: "diff".into(),
        max_subjects: 100_000,
        deny_cache: false,
        sentinel: None,
    }
}

async fn connected(store: &AnyStore) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = CompiledLimit::compile(
        &Arc::from("probe"),
        &limit_cfg("p", Algorithm::Gcra, 1000, 1000, 1000, 1, Mode::Enforce),
    );
    while Instant::now() < deadline {
        let check = [Check {
            limit: &probe,
            subject: SubjectDigest::of(b'g', b""),
            op: Op::Decide,
        }];
        if store
            .decide(&check, tollgate::worker::WorkerId::NONE)
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Redis store never connected");
}

/// Validation keeps `store.timeout` at most 60 s; a `StoreConfig` built in code is not validated,
/// and the connect task must not panic on a huge timeout ("overflow" in `timeout * 2`).
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_store_timeout_built_in_code_still_connects() {
    let r = redis();
    let mut cfg = redis_store_cfg(r.url());
    cfg.timeout = Duration::MAX;
    let store = AnyStore::build(&cfg, AnyClock::System, 1);
    connected(&store).await;
}

/// The differential test: the in-process store and Redis, both on one manual clock, decide the
/// same trace. Redis decides through the production path: the batcher, the coalescing script
/// and the breaker layer. Each step sends 1–8 requests at once, so batches hold several requests,
/// often for the same key (coalesced); the in-process store decides them one after another in the
/// same order.
#[tokio::test(flavor = "multi_thread")]
async fn memory_and_redis_decide_identically_on_a_trace() {
    let r = redis();
    // 5 s before a UTC midnight: the trace crosses it (the calendar limit's day ends).
    let mut now: u64 = 1_700_006_395_123_456;
    let clock = ManualClock::new(now);
    let store = AnyStore::build(
        &redis_store_cfg(r.url()),
        AnyClock::Manual(clock.clone()),
        2,
    );
    connected(&store).await;
    let memory = MemoryStore::with_clock(100_000, AnyClock::Manual(clock.clone()));
    let route: Arc<str> = Arc::from("diff");
    let mut sets: Vec<Vec<CompiledLimit>> = Vec::new();
    for (i, alg) in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ]
    .into_iter()
    .enumerate()
    {
        let burst = match alg {
            Algorithm::TokenBucket | Algorithm::Gcra => 6,
            Algorithm::LeakyBucket => 3,
            _ => 0,
        };
        for (j, (limit, period, cost)) in [(5, 1000, 1), (7, 250, 2), (3, 3000, 1)]
            .into_iter()
            .enumerate()
        {
            let b = if burst == 0 { 0 } else { burst.max(cost) };
            let cfg = limit_cfg(
                &format!("l{i}{j}"),
                alg,
                limit,
                period,
                b,
                cost,
                Mode::Enforce,
            );
            sets.push(vec![CompiledLimit::compile(&route, &cfg)]);
        }
    }
    // Multi-limit sets: all-or-nothing, with a shadow limit in one of them.
    let pair = |a: LimitConfig, b: LimitConfig| {
        vec![
            CompiledLimit::compile(&route, &a),
            CompiledLimit::compile(&route, &b),
        ]
    };
    sets.push(pair(
        limit_cfg("m1", Algorithm::FixedWindow, 4, 1000, 0, 1, Mode::Enforce),
        limit_cfg("m2", Algorithm::SlidingLog, 6, 2000, 0, 1, Mode::Enforce),
    ));
    sets.push(pair(
        limit_cfg("m3", Algorithm::Gcra, 4, 1000, 4, 1, Mode::Enforce),
        limit_cfg("m4", Algorithm::TokenBucket, 2, 1000, 2, 1, Mode::Shadow),
    ));
    // A calendar day quota, alone and with a GCRA limit.
    let mut day = limit_cfg(
        "cal",
        Algorithm::FixedWindow,
        20,
        86_400_000,
        0,
        1,
        Mode::Enforce,
    );
    day.calendar = Some(tollgate::calendar::Calendar::Day.into());
    sets.push(vec![CompiledLimit::compile(&route, &day)]);
    sets.push(pair(
        limit_cfg("m5", Algorithm::Gcra, 10, 1000, 10, 1, Mode::Enforce),
        day.clone(),
    ));
    // Billing-day windows: a month from the 15th and a day in UTC−05:00 (state.lua computes
    // them on the same injected time).
    let mut anchored = day.clone();
    anchored.name = "bill".into();
    anchored.calendar = Some(tollgate::calendar::CalendarWindow {
        anchor_day: 15,
        ..tollgate::calendar::Calendar::Month.into()
    });
    anchored.period = Duration::from_secs(31 * 86_400);
    let mut local = day.clone();
    local.name = "local".into();
    local.calendar = Some(tollgate::calendar::CalendarWindow {
        utc_offset_min: -300,
        ..tollgate::calendar::Calendar::Day.into()
    });
    sets.push(pair(anchored, local));

    // The sets whose limits are all of fw, sw, tb, gcra and lb (sent as runs).
    let runnable: Vec<usize> = (0..sets.len())
        .filter(|&i| (i < 18 && i / 3 != 2) || i == 19)
        .collect();
    let mut rng = Lcg(42);
    let subjects: Vec<SubjectDigest> = (0..2)
        .map(|i| SubjectDigest::of(b'h', format!("key-{i}").as_bytes()))
        .collect();
    let mut compared = 0;
    let mut denied = 0;
    let mut batched = 0;
    // Redis expires keys in real time, the trace runs on injected time: between any two steps
    // the trace's clock must advance at least as much as the wall clock did (a stall on a slow
    // machine), or Redis would drop a key whose state is still live in the trace.
    let mut wall_prev = Instant::now();
    let before = script_calls(&r);
    let mut requests = 0;
    let (mut leased, mut returned, mut granted) = (0, 0, 0);
    for step in 0..1000 {
        // 0-12 ms between steps, or the wall clock's advance when that was more.
        let wall = Instant::now();
        let waited = u64::try_from(wall.duration_since(wall_prev).as_micros()).unwrap();
        wall_prev = wall;
        now += rng.next(12_000).max(waited);
        clock.set(now);
        let n = 1 + rng.next(8) as usize;
        // Every other step only limits the script can take as runs (not the sliding log or a
        // calendar window), often the same request again: runs of identical requests.
        let as_runs = step % 2 == 0;
        let mut picks: Vec<(usize, SubjectDigest)> = Vec::with_capacity(n);
        for _ in 0..n {
            let subject = subjects[rng.next(subjects.len() as u64) as usize];
            let pick = match picks.last() {
                Some(&last) if as_runs && rng.next(2) == 0 => last,
                _ if as_runs => (runnable[rng.next(runnable.len() as u64) as usize], subject),
                _ => (rng.next(sets.len() as u64) as usize, subject),
            };
            picks.push(pick);
        }
        // Leases (odd steps: a lease is never sent as runs): the first limit of a set that can
        // lease (fixed window, calendar window, token bucket, GCRA) asks for up to 1-5 units;
        // sometimes unused units are given back.
        let leasable = |set: usize| matches!(set, 0..=2 | 9..=14 | 19..=21);
        let checks: Vec<Vec<Check<'_>>> = picks
            .iter()
            .map(|&(set, subject)| {
                let lease = !as_runs && leasable(set) && rng.next(2) == 0;
                let n = 1 + rng.next(5);
                sets[set]
                    .iter()
                    .enumerate()
                    .map(|(i, l)| Check {
                        limit: l,
                        subject,
                        op: if lease && i == 0 {
                            Op::Lease(n)
                        } else {
                            Op::Decide
                        },
                    })
                    .collect()
            })
            .collect();
        if !as_runs && rng.next(3) == 0 {
            let set = [0, 1, 2, 9, 10, 11, 12, 13, 14, 19, 20, 21][rng.next(12) as usize];
            let back = [Check {
                limit: &sets[set][0],
                subject: subjects[rng.next(subjects.len() as u64) as usize],
                op: Op::Return(1 + rng.next(3)),
            }];
            memory
                .settle(&back, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap();
            store
                .settle(&back, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap();
            returned += 1;
        }
        // Support grants on a quarter of the steps (beyond the quota too, on both stores), so
        // decisions, runs, leases and returns meet states holding credit, and see it lapse.
        if rng.next(4) == 0 {
            use tollgate::limiter::adjust::{check, Adjust};
            let set = &sets[rng.next(sets.len() as u64) as usize];
            let l = &set[rng.next(set.len() as u64) as usize];
            if check(l.policy.algorithm, Adjust::Grant(1)).is_ok() {
                let g = Adjust::Grant(1 + rng.next(l.policy.quota()));
                let c = Check {
                    limit: l,
                    subject: subjects[rng.next(subjects.len() as u64) as usize],
                    op: Op::Decide,
                };
                memory.adjust_now(&c, g, now);
                store.adjust(&c, g).await.unwrap();
                granted += 1;
            }
        }
        leased += checks
            .iter()
            .flatten()
            .filter(|c| matches!(c.op, Op::Lease(_)))
            .count();
        let mut m = Vec::new();
        for c in &checks {
            m.push(
                memory
                    .decide(c, tollgate::worker::WorkerId::NONE)
                    .await
                    .unwrap(),
            );
        }
        // Polled in order, so queued in order: one batch, decided in this order.
        let d: Vec<_> = futures_util::future::join_all(
            checks
                .iter()
                .map(|c| store.decide(c, tollgate::worker::WorkerId::NONE)),
        )
        .await
        .into_iter()
        .map(|x| x.unwrap())
        .collect();
        // A lease granted on Redis carries its state's generation in `retry_after` (decide.lua;
        // in process there is none): compared without it.
        let d: Vec<Vec<Decision>> = d
            .into_iter()
            .zip(&checks)
            .map(|(ds, cs)| {
                ds.into_iter()
                    .zip(cs)
                    .map(|(x, c)| match c.op {
                        Op::Lease(_) if x.allowed => {
                            assert!(x.retry_after > 0, "a grant without its generation");
                            Decision {
                                retry_after: 0,
                                ..x
                            }
                        }
                        _ => x,
                    })
                    .collect()
            })
            .collect();
        assert_eq!(m, d, "step {step} at {now}: {picks:?}");
        requests += n;
        batched += usize::from(n > 1);
        for x in &m {
            compared += x.len();
            denied += x.iter().filter(|x| !x.allowed).count();
        }
    }
    let calls = script_calls(&r) - before;
    assert!(
        calls * 2 < requests as u64,
        "{calls} script calls for {requests} requests: the trace did not go through batches"
    );
    assert!(batched > 500);
    assert!(compared >= 3000);
    assert!(
        leased > 300 && returned > 100 && granted > 150,
        "{leased} leases, {returned} returns, {granted} grants"
    );
    assert!(
        now > 1_700_006_400_000_000,
        "the trace never crossed midnight"
    );
    assert!(
        denied > 100 && denied < compared - 100,
        "the trace must exercise both outcomes: {denied}/{compared}"
    );
}

fn redis_store(url: &str, on_error: &str) -> String {
    format!("backend = \"redis\"\nurl = \"{url}\"\ntimeout = \"200ms\"\non_error = \"{on_error}\"")
}

#[tokio::test(flavor = "multi_thread")]
async fn three_gateways_admit_exactly_the_limit_under_concurrency() {
    let r = redis();
    let up = upstream().await;
    let mut routes = String::new();
    let algs = [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
    ];
    for alg in algs {
        routes += &route(alg, &format!("/{alg}"), &up.url(), "");
        routes += &limit(&format!("name = \"g\"\nalgorithm = \"{alg}\"\nlimit = 20\nperiod = \"1h\"\nsubject = \"global\""));
    }
    let cfg = config(
        &format!(
            "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_error = \"deny\"",
            r.url()
        ),
        &routes,
    );
    let gws = [gateway(&cfg), gateway(&cfg), gateway(&cfg)];
    for g in &gws {
        wait_ready(g).await;
    }
    let c = client();
    for alg in algs {
        let mut tasks = Vec::new();
        for i in 0..240 {
            let url = gws[i % 3].url(&format!("/{alg}/x"));
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                c.get(url).send().await.map(|r| r.status().as_u16())
            }));
        }
        let mut ok = 0;
        let mut limited = 0;
        for t in tasks {
            match t.await.unwrap().unwrap() {
                200 => ok += 1,
                429 => limited += 1,
                s => panic!("{alg}: unexpected status {s}"),
            }
        }
        assert_eq!((ok, limited), (20, 220), "{alg}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn outage_fails_open_or_closed_quickly_and_recovers() {
    let port = free_port();
    let mut r = Redis::start_on(port, &[]);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"k\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"");
    let mut open = gateway(&config(&redis_store(&r.url(), "allow"), &routes));
    let mut closed = gateway(&config(&redis_store(&r.url(), "deny"), &routes));
    wait_ready(&open).await;
    wait_ready(&closed).await;
    let c = client();
    let send = |gw: &Gateway, key: &str| {
        c.get(gw.url("/api/x"))
            .header("x-api-key", key.to_owned())
            .send()
    };
    for _ in 0..3 {
        assert_eq!(send(&open, "a").await.unwrap().status(), 200);
    }
    let denied = Instant::now();
    assert_eq!(send(&open, "a").await.unwrap().status(), 429);

    r.kill();
    // A denial Redis already gave is still known (deny cache) for at most its second
    // (`MAX_CACHED`, from before the denial's round trip): "a" stays limited within it. On a
    // loaded machine the kill may take longer; the cache's own clock is tested with an
    // injected clock (`the_deny_cache_follows_an_injected_clock`).
    let s = send(&open, "a").await.unwrap().status();
    if denied.elapsed() < Duration::from_millis(1000) {
        assert_eq!(s, 429);
    }
    for i in 0..10 {
        let t0 = Instant::now();
        let s = send(&open, "fresh").await.unwrap().status();
        assert_eq!(s, 200, "fail-open request {i}");
        assert!(
            t0.elapsed() < Duration::from_millis(700),
            "fail-open took {:?}",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let res = send(&closed, "b").await.unwrap();
        assert_eq!(res.status(), 503, "fail-closed request {i}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert!(
            t0.elapsed() < Duration::from_millis(700),
            "fail-closed took {:?}",
            t0.elapsed()
        );
    }
    let ready = c.get(closed.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "readyz reports the store down");
    let m = open.metrics().await;
    assert!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total",
            &["decision=\"fail_open\""]
        ) >= 10.0
    );
    assert!(metric_sum(&m, "tollgate_store_errors_total", &[]) >= 1.0);
    // After repeated failures the circuit breaker answers without asking Redis.
    assert!(
        metric_sum(
            &m,
            "tollgate_store_errors_total",
            &["kind=\"circuit_open\""]
        ) >= 1.0,
        "the circuit never opened:\n{m}"
    );
    assert_eq!(metric(&m, "tollgate_store_up"), Some(0.0));
    let m = closed.metrics().await;
    assert!(
        metric_sum(
            &m,
            "tollgate_ratelimit_decisions_total",
            &["decision=\"fail_closed\""]
        ) >= 10.0
    );

    // Redis comes back on the same port (empty): limiting resumes by itself.
    let _r2 = Redis::start_on(port, &[]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut statuses = Vec::new();
    let mut attempt = 0;
    while Instant::now() < deadline {
        statuses.clear();
        attempt += 1;
        let key = format!("c{attempt}");
        for _ in 0..5 {
            statuses.push(send(&closed, &key).await.unwrap().status().as_u16());
        }
        if statuses == [200, 200, 200, 429, 429] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "limiting did not resume after Redis came back"
    );
    wait_ready(&closed).await;
    assert!(open.child.try_wait().unwrap().is_none() && closed.child.try_wait().unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_expire_hide_subjects_and_survive_script_flush() {
    let r = redis();
    let up = upstream().await;
    let mut routes = String::new();
    for alg in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
        "leaky_bucket",
    ] {
        routes += &route(alg, &format!("/{alg}"), &up.url(), "");
        routes += &limit(&format!("name = \"key\"\nalgorithm = \"{alg}\"\nlimit = 3\nperiod = \"10s\"\nsubject = \"header:X-Api-Key\""));
        routes += &limit(&format!(
            "name = \"ip\"\nalgorithm = \"{alg}\"\nlimit = 50\nperiod = \"1m\"\nsubject = \"ip\""
        ));
    }
    // On injected time at T0, the start of a 10 s window: no key expires between the requests
    // and the scan below, and each limit admits exactly what its algorithm allows at one instant.
    let gw = gateway_on_clock(&config(&redis_store(&r.url(), "deny"), &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    const SECRET: &str = "super-secret-api-key-123";
    for alg in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
        "leaky_bucket",
    ] {
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let s = c
                .get(gw.url(&format!("/{alg}/x")))
                .header("x-api-key", SECRET)
                .send()
                .await
                .unwrap()
                .status();
            statuses.push(s.as_u16());
        }
        // The leaky bucket (queue length 0) lets one through, the next one T = P/L later.
        let expect: &[u16] = if alg == "leaky_bucket" {
            &[200, 429, 429, 429, 429]
        } else {
            &[200, 200, 200, 429, 429]
        };
        assert_eq!(statuses, expect, "{alg}");
    }
    let keys: Vec<String> = r.cli(&["--scan"]).lines().map(str::to_owned).collect();
    assert_eq!(keys.len(), 12, "{keys:?}");
    for k in &keys {
        assert!(
            !k.contains(SECRET) && !k.contains("127.0.0.1"),
            "raw subject in key {k}"
        );
        assert!(k.starts_with("tollgate:{"), "{k}");
        let ttl: i64 = r.cli(&["PTTL", k]).trim().parse().unwrap();
        assert!(ttl > 0 && ttl <= 120_000, "{k} has TTL {ttl}");
    }
    // Sliding-log sets never hold more than L entries.
    for k in keys.iter().filter(|k| k.ends_with(":sl")) {
        let n: u64 = r.cli(&["ZCARD", k]).trim().parse().unwrap();
        assert!(n <= 50, "{k}: {n} entries");
    }
    // The script is the library's function: loaded once, then called by FCALL.
    assert!(
        r.cli(&["FUNCTION", "LIST"]).contains("tollgate_"),
        "the library is loaded"
    );
    assert!(commandstat(&r, "fcall") > 0, "called by FCALL");
    assert_eq!(commandstat(&r, "evalsha"), 0, "never by EVALSHA");
    // After FUNCTION FLUSH and SCRIPT FLUSH the library is loaded again transparently.
    assert_eq!(r.cli(&["FUNCTION", "FLUSH"]).trim(), "OK");
    assert_eq!(r.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let s = c
        .get(gw.url("/fixed_window/x"))
        .header("x-api-key", "another")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(s, 200);
    let s = c
        .get(gw.url("/fixed_window/x"))
        .header("x-api-key", SECRET)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(s, 429, "state survived the flush of scripts");
    assert!(
        r.cli(&["FUNCTION", "LIST"]).contains("tollgate_"),
        "the library is loaded again"
    );
}

/// A Redis whose ACL refuses functions (as one before 7.0 has none): the gateway calls the same
/// source by EVAL, then EVALSHA, and decides exactly as with the library.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_without_functions_runs_the_same_script_by_evalsha() {
    let r = redis();
    assert_eq!(
        r.cli(&[
            "ACL",
            "SETUSER",
            "nofn",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-fcall",
            "-function"
        ])
        .trim(),
        "OK"
    );
    let up = upstream().await;
    let mut routes = String::new();
    for alg in ["fixed_window", "gcra", "sliding_log"] {
        routes += &route(alg, &format!("/{alg}"), &up.url(), "");
        routes += &limit(&format!(
            "name = \"k\"\nalgorithm = \"{alg}\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\""
        ));
    }
    let url = r.url().replacen("redis://", "redis://nofn:pw@", 1);
    let gw = gateway(&config(&redis_store(&url, "deny"), &routes));
    wait_ready(&gw).await;
    let c = client();
    for alg in ["fixed_window", "gcra", "sliding_log"] {
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let res = c
                .get(gw.url(&format!("/{alg}/x")))
                .header("x-api-key", "a")
                .send()
                .await
                .unwrap();
            statuses.push(res.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429], "{alg}");
    }
    assert!(commandstat(&r, "evalsha") > 0, "called by EVALSHA");
    assert!(
        !r.cli(&["FUNCTION", "LIST"]).contains("tollgate_"),
        "nothing loaded"
    );
}

/// Script calls Redis has run so far: the library's function (FCALL), and the script by EVALSHA
/// and EVAL (where the library is loaded, or functions are missing).
fn script_calls(r: &Redis) -> u64 {
    commandstat(r, "fcall") + commandstat(r, "evalsha") + commandstat(r, "eval")
}

fn commandstat(r: &Redis, cmd: &str) -> u64 {
    let info = r.cli(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn total_commands(r: &Redis) -> u64 {
    let info = r.cli(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_round_trip_per_request_for_two_limits() {
    let r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"ip\"\nalgorithm = \"gcra\"\nlimit = 1000\nperiod = \"1m\"\nsubject = \"ip\"")
        + &limit("name = \"key\"\nalgorithm = \"sliding_window\"\nlimit = 1000\nperiod = \"1m\"\nsubject = \"header:X-Api-Key\"");
    let gw = gateway(&config(&redis_store(&r.url(), "deny"), &routes));
    wait_ready(&gw).await;
    let c = client();
    c.get(gw.url("/api/warm"))
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    let (evalsha0, total0) = (script_calls(&r), total_commands(&r));
    for _ in 0..50 {
        assert_eq!(
            c.get(gw.url("/api/x"))
                .header("x-api-key", "k")
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let evalsha = script_calls(&r) - evalsha0;
    let total = total_commands(&r) - total0;
    assert_eq!(evalsha, 50, "one script call per request");
    // Everything else Redis counted ran inside those scripts (HMGET/HSET/GET/SET/PEXPIRE...),
    // which commandstats also lists; no command was sent outside a script.
    let inside: u64 = ["get", "set", "time"]
        .iter()
        .map(|c| commandstat(&r, c))
        .sum();
    assert!(
        total >= evalsha && inside > 0,
        "total {total}, evalsha {evalsha}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_cluster_shared_by_two_gateways_is_exact() {
    let cluster = start_cluster();
    let up = upstream().await;
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("\"{}\"", n.url()))
        .collect();
    let store = format!(
        "backend = \"redis_cluster\"\nurls = [{}]\ntimeout = \"2s\"\non_error = \"deny\"",
        urls.join(", ")
    );
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"key\"\nalgorithm = \"sliding_log\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"")
        + &route("two", "/two", &up.url(), "")
        + &limit("name = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"")
        + &limit("name = \"all\"\nalgorithm = \"gcra\"\nlimit = 5\nperiod = \"1h\"\nsubject = \"global\"");
    let cfg = config(&store, &routes);
    let gws = [gateway(&cfg), gateway(&cfg)];
    for g in &gws {
        wait_ready(g).await;
    }
    let c = client();
    let keys: Vec<String> = (0..12).map(|i| format!("tenant-{i}")).collect();
    let mut tasks = Vec::new();
    for (k, key) in keys.iter().enumerate() {
        for i in 0..16 {
            let url = gws[(i + k) % 2].url("/api/x");
            let (c, key) = (c.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let s = c
                    .get(url)
                    .header("x-api-key", &key)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16();
                (key, s)
            }));
        }
    }
    let mut admitted = std::collections::HashMap::<String, u32>::new();
    for t in tasks {
        let (key, s) = t.await.unwrap();
        assert!(s == 200 || s == 429, "status {s}");
        if s == 200 {
            *admitted.entry(key).or_default() += 1;
        }
    }
    for key in &keys {
        assert_eq!(admitted.get(key).copied().unwrap_or(0), 5, "{key}");
    }
    // The keys are spread over the masters.
    let used = cluster
        .nodes
        .iter()
        .filter(|n| n.cli(&["DBSIZE"]).trim() != "0")
        .count();
    assert!(used >= 2, "all keys landed on one master");
    // Every master has the library, and the decisions were its function's.
    for n in &cluster.nodes {
        assert!(n.cli(&["FUNCTION", "LIST"]).contains("tollgate_"));
    }
    let fcalls: u64 = cluster.nodes.iter().map(|n| commandstat(n, "fcall")).sum();
    assert!(fcalls > 0, "called by FCALL");

    // Two limits in different slots stay all-or-nothing: k1's denied requests are not charged
    // to "all", so two more requests fit, then "all" denies without charging "per-key".
    let send = |i: usize, key: &'static str| {
        let r = c.get(gws[i % 2].url("/two/x")).header("x-api-key", key);
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let mut k1 = Vec::new();
    for i in 0..8 {
        k1.push(send(i, "k1").await);
    }
    assert_eq!(k1, [200, 200, 200, 429, 429, 429, 429, 429]);
    assert_eq!([send(0, "k2").await, send(1, "k2").await], [200, 200]);
    assert_eq!(send(0, "k3").await, 429);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denied_subject_is_answered_from_the_deny_cache() {
    let r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"key\"\nalgorithm = \"gcra\"\nlimit = 2\nperiod = \"2s\"\nsubject = \"header:X-Api-Key\"")
        + &limit("name = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nperiod = \"1m\"\nsubject = \"ip\"");
    // On injected time: every request below is decided at T0 until the clock moves.
    let gw = gateway_on_clock(&config(&redis_store(&r.url(), "deny"), &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let send = || c.get(gw.url("/api/x")).header("x-api-key", "hammer").send();
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(send().await.unwrap().status(), 200);
    let first = send().await.unwrap();
    assert_eq!(first.status(), 429);
    let retry: u64 = first.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let before = script_calls(&r);
    for _ in 0..200 {
        let res = send().await.unwrap();
        assert_eq!(res.status(), 429);
        assert!(res.headers().contains_key("retry-after"));
    }
    let calls = script_calls(&r) - before;
    assert!(
        calls <= 2,
        "{calls} Redis calls for 200 requests over the limit (≤ 0.01 per request)"
    );
    let m = gw.metrics().await;
    assert!(metric(&m, "tollgate_store_deny_cache_hits_total").unwrap_or(0.0) >= 198.0);
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_decisions_total{route=\"api\",limit=\"key\",plan=\"\",decision=\"limited\"}"
        ),
        Some(201.0)
    );
    // The verdict is kept only until it could change: a millisecond before Retry-After the key
    // is still denied, at it the key is admitted.
    assert_eq!(retry, 1);
    gw.advance(Duration::from_millis(999)).await;
    assert_eq!(send().await.unwrap().status(), 429);
    gw.advance(Duration::from_millis(1)).await;
    assert_eq!(send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_that_refuses_writes_is_a_store_error() {
    // maxmemory of 1 byte with noeviction: every write in the script fails with OOM.
    let r = Redis::start_on(
        free_port(),
        &["--maxmemory", "1", "--maxmemory-policy", "noeviction"],
    );
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"k\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"ip\"");
    let open = gateway(&config(&redis_store(&r.url(), "allow"), &routes));
    let closed = gateway(&config(&redis_store(&r.url(), "deny"), &routes));
    // Readiness follows successful decisions, so it never comes: send until Redis has answered
    // (with its OOM error) rather than the connection still being set up.
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let res = c.get(closed.url("/api/x")).send().await.unwrap();
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let m = closed.metrics().await;
        if metric_sum(&m, "tollgate_store_errors_total", &["kind=\"server\""]) >= 1.0 {
            assert!(decisions(&m, "api", "k", "fail_closed").unwrap_or(0.0) >= 1.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Redis's OOM reply never counted as a server error:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        assert_eq!(
            c.get(open.url("/api/x")).send().await.unwrap().status(),
            200
        );
    }
    let m = open.metrics().await;
    assert!(decisions(&m, "api", "k", "fail_open").unwrap_or(0.0) >= 3.0);
    assert_eq!(
        up.hits(),
        3,
        "fail-closed requests never reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_requests_share_round_trips_and_stay_exact() {
    let r = redis();
    let mut cfg = redis_store_cfg(r.url());
    cfg.key_prefix = "batch".into();
    let store = AnyStore::build(&cfg, AnyClock::System, 1);
    connected(&store).await;
    let route: Arc<str> = Arc::from("batch");
    let limits = [
        CompiledLimit::compile(
            &route,
            &limit_cfg(
                "fw",
                Algorithm::FixedWindow,
                40,
                3_600_000,
                0,
                1,
                Mode::Enforce,
            ),
        ),
        CompiledLimit::compile(
            &route,
            &limit_cfg(
                "sl",
                Algorithm::SlidingLog,
                1000,
                3_600_000,
                0,
                1,
                Mode::Enforce,
            ),
        ),
    ];
    let subject = SubjectDigest::of(b'g', b"");
    let before = script_calls(&r);
    let decisions = futures_util::future::join_all((0..100).map(|_| {
        let store = &store;
        let limits = &limits;
        async move {
            let checks: Vec<Check<'_>> = limits
                .iter()
                .map(|l| Check {
                    limit: l,
                    subject,
                    op: Op::Decide,
                })
                .collect();
            store
                .decide(&checks, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap()
        }
    }))
    .await;
    let calls = script_calls(&r) - before;
    let admitted = decisions
        .iter()
        .filter(|d| d[0].allowed && d[1].allowed)
        .count();
    let half = decisions
        .iter()
        .filter(|d| d[0].allowed != d[1].allowed)
        .count();
    assert_eq!(admitted, 40, "exactly the fixed window's 40 are admitted");
    assert_eq!(
        half, 60,
        "the 60 denied by the window are allowed by the log but not charged to it"
    );
    // All-or-nothing inside batches: the log was charged exactly 40 times.
    let key = redis_key("batch", &limits[1], &subject);
    assert_eq!(r.cli(&["ZCARD", &key]).trim(), "40");
    assert!(
        calls < 50,
        "{calls} EVALSHAs for 100 concurrent requests: they were not batched"
    );
}

/// The one request let through to probe a half-open circuit is cancelled by its client; once
/// Redis answers again, limiting must resume within moments, whatever clients did meanwhile.
async fn a_cancelled_probe_does_not_keep_the_circuit_open(http2: bool) {
    let r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"k\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"header:X-Api-Key\"");
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"300ms\"\non_error = \"allow\"",
        r.url()
    );
    let gw = gateway(&config(&store, &routes));
    wait_ready(&gw).await;
    let mut b = reqwest::Client::builder().no_proxy();
    if http2 {
        b = b.http2_prior_knowledge();
    }
    let c = b.build().unwrap();
    let send = |key: &str| {
        c.get(gw.url("/api/x"))
            .header("x-api-key", key.to_owned())
            .send()
    };

    r.pause();
    // Three timeouts open the circuit (each request fails open).
    for _ in 0..3 {
        assert_eq!(send("warm").await.unwrap().status(), 200);
    }
    let m = gw.metrics().await;
    assert_eq!(metric(&m, "tollgate_store_up"), Some(0.0), "{m}");
    // After the back-off, the next request is the probe: its client gives up while it waits for
    // the frozen Redis (an HTTP/1 disconnect, or an HTTP/2 RST_STREAM). Requests that find the
    // circuit open are answered at once; keep going until one was let through and cut off.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut cut_off = false;
    while !cut_off && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cut_off = c
            .get(gw.url("/api/x"))
            .header("x-api-key", "probe")
            .timeout(Duration::from_millis(100))
            .send()
            .await
            .is_err();
    }
    assert!(cut_off, "no request was ever let through to probe");
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.resume();

    // Limiting resumes: a fresh key gets its 2 requests, then 429.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut statuses = Vec::new();
    let mut attempt = 0;
    while Instant::now() < deadline {
        attempt += 1;
        let key = format!("after{attempt}");
        statuses.clear();
        for _ in 0..3 {
            statuses.push(send(&key).await.unwrap().status().as_u16());
        }
        if statuses == [200, 200, 429] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        statuses,
        [200, 200, 429],
        "limiting stayed off after Redis recovered (http2: {http2})"
    );
    let ready = client().get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(metric(&gw.metrics().await, "tollgate_store_up"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_probe_cut_off_by_an_http1_disconnect_does_not_keep_the_circuit_open() {
    a_cancelled_probe_does_not_keep_the_circuit_open(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_probe_reset_by_http2_does_not_keep_the_circuit_open() {
    a_cancelled_probe_does_not_keep_the_circuit_open(true).await;
}

/// `tollgate_store_up` and `/readyz` agree from the start, also on a gateway nobody sends to.
#[tokio::test(flavor = "multi_thread")]
async fn store_up_agrees_with_readyz_on_an_idle_gateway() {
    let mut r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "");
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"300ms\"\non_error = \"allow\"",
        r.url()
    );
    let gw = gateway(&config(&store, &routes));
    wait_ready(&gw).await;
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_store_up"),
        Some(1.0),
        "readyz says up, the gauge must too:\n{m}"
    );
    // Redis goes away while nobody sends: both notice within a few seconds.
    r.kill();
    let deadline = Instant::now() + Duration::from_secs(6);
    let (mut gauge, mut ready) = (None, 0);
    while Instant::now() < deadline {
        gauge = metric(&gw.metrics().await, "tollgate_store_up");
        ready = client()
            .get(gw.admin_url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if gauge == Some(0.0) && ready == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!((gauge, ready), (Some(0.0), 503));
}

/// A store outage under load logs each kind of failure at most about once a second, with the
/// number of lines suppressed, instead of one WARN per request.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_does_not_flood_the_log() {
    let mut r = redis();
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"k\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"ip\"");
    let gw = gateway(&config(&redis_store(&r.url(), "deny"), &routes));
    wait_ready(&gw).await;
    r.kill();
    let c = client();
    let t0 = Instant::now();
    let mut sent = 0;
    while t0.elapsed() < Duration::from_millis(2500) {
        assert_eq!(c.get(gw.url("/api/x")).send().await.unwrap().status(), 503);
        sent += 1;
    }
    let logs = gw.logs();
    let store_lines = logs
        .lines()
        .filter(|l| l.contains("rate-limit store failed"))
        .count();
    let failed_lines = logs
        .lines()
        .filter(|l| l.contains("request failed"))
        .count();
    assert!(sent > 100, "only {sent} requests sent");
    assert!(
        (1..=6).contains(&store_lines) && failed_lines <= 6,
        "{sent} failed requests logged {store_lines} store warnings and {failed_lines} request warnings"
    );
    assert!(
        logs.contains("suppressed"),
        "the log says how many lines it left out:\n{logs}"
    );
}

/// Post-response charges of different amounts for one limit and subject, settled in one store
/// call (one request's, or several requests' batched by a lane), all count. Before the fix each
/// amount named the key afresh: the script read the key once per amount and wrote it once per
/// amount, the last write winning, so every charge but one was lost while all answered OK (the
/// chaos soak saw a `cost_header` budget overspent: 9 units missing from a window).
#[tokio::test(flavor = "multi_thread")]
async fn charges_of_different_amounts_settled_together_all_count() {
    let r = redis();
    let redis = AnyStore::build(&redis_store_cfg(r.url()), AnyClock::System, 1);
    connected(&redis).await;
    let memory = AnyStore::Memory(MemoryStore::new(1000));
    let l = CompiledLimit::compile(
        &Arc::from("api"),
        &limit_cfg(
            "units",
            Algorithm::FixedWindow,
            100,
            3_600_000,
            0,
            1,
            Mode::Enforce,
        ),
    );
    let subject = SubjectDigest::of(b'k', b"caller");
    let check = |op| Check {
        limit: &l,
        subject,
        op,
    };
    for store in [&memory, &redis] {
        store
            .settle(
                &[
                    check(Op::Charge(9)),
                    check(Op::Charge(4)),
                    check(Op::Charge(9)),
                ],
                tollgate::worker::WorkerId::NONE,
            )
            .await
            .unwrap();
        let d = store
            .decide(&[check(Op::Decide)], tollgate::worker::WorkerId::NONE)
            .await
            .unwrap();
        assert_eq!(
            d[0].remaining,
            100 - 22 - 1,
            "{}: every charge counted",
            store.backend()
        );
    }
}

/// The deny cache ages its entries on the store's clock: under an injected clock a denial is
/// answered locally (no script call) with its retry time counting down as the clock moves, and
/// Redis is asked again once the clock passes the retry time.
#[tokio::test(flavor = "multi_thread")]
async fn the_deny_cache_follows_an_injected_clock() {
    let r = redis();
    let t0: u64 = 1_700_000_000_000_000;
    let clock = ManualClock::new(t0);
    let mut cfg = redis_store_cfg(r.url());
    cfg.deny_cache = true;
    let store = AnyStore::build(&cfg, AnyClock::Manual(clock.clone()), 1);
    connected(&store).await;
    let route: Arc<str> = Arc::from("dc");
    let l = CompiledLimit::compile(
        &route,
        &limit_cfg("w", Algorithm::FixedWindow, 2, 10_000, 0, 1, Mode::Enforce),
    );
    let check = [Check {
        limit: &l,
        subject: SubjectDigest::of(b'h', b"k"),
        op: Op::Decide,
    }];
    let w = tollgate::worker::WorkerId::NONE;
    let decide = || store.decide(&check, w);
    assert!(decide().await.unwrap()[0].allowed);
    assert!(decide().await.unwrap()[0].allowed);
    let denied = decide().await.unwrap()[0];
    assert!(!denied.allowed);
    let calls = script_calls(&r);
    clock.advance(400_000);
    let cached = decide().await.unwrap()[0];
    assert!(!cached.allowed);
    assert_eq!(
        cached.retry_after,
        denied.retry_after - 400_000,
        "aged on the injected clock"
    );
    assert_eq!(script_calls(&r), calls, "answered from the deny cache");
    // Past the window's end: asked again, and admitted.
    clock.advance(denied.retry_after - 400_000);
    assert!(decide().await.unwrap()[0].allowed);
    assert_eq!(script_calls(&r), calls + 1);
}

/// Support's corrections, differential: `quota.lua` on Redis and `limiter::adjust` in process,
/// on one manual clock, give every algorithm that takes them the same state. Each round spends
/// a random part of each limit on both stores, grants (or resets) a random amount on both, and
/// compares what each store would decide next; the next round's decisions spend what was
/// granted, beyond the quota too (credit), or see it lapse. Each round also grants to a subject
/// that used nothing: both stores then hold its quota plus the grant.
#[tokio::test(flavor = "multi_thread")]
async fn memory_and_redis_apply_the_same_grants_and_resets() {
    use tollgate::calendar::{Calendar, CalendarWindow};
    use tollgate::limiter::adjust::Adjust;
    let r = redis();
    // Long periods: Redis expires keys in real time, the trace's clock only moves forward.
    let mut now: u64 = 1_700_006_395_123_456;
    let clock = ManualClock::new(now);
    let redis_store = AnyStore::build(
        &redis_store_cfg(r.url()),
        AnyClock::Manual(clock.clone()),
        1,
    );
    connected(&redis_store).await;
    let memory = MemoryStore::with_clock(100_000, AnyClock::Manual(clock.clone()));
    let route: Arc<str> = Arc::from("adj");
    let mut month = limit_cfg(
        "cal",
        Algorithm::FixedWindow,
        40,
        31 * 86_400_000,
        0,
        1,
        Mode::Enforce,
    );
    month.calendar = Some(CalendarWindow {
        anchor_day: 15,
        ..Calendar::Month.into()
    });
    let limits: Vec<CompiledLimit> = [
        limit_cfg(
            "fw",
            Algorithm::FixedWindow,
            40,
            3_600_000,
            0,
            1,
            Mode::Enforce,
        ),
        limit_cfg(
            "sw",
            Algorithm::SlidingWindow,
            40,
            60_000,
            0,
            2,
            Mode::Enforce,
        ),
        limit_cfg(
            "tb",
            Algorithm::TokenBucket,
            40,
            60_000,
            30,
            1,
            Mode::Enforce,
        ),
        limit_cfg("gcra", Algorithm::Gcra, 40, 60_000, 30, 1, Mode::Enforce),
        limit_cfg(
            "lb",
            Algorithm::LeakyBucket,
            40,
            60_000,
            20,
            1,
            Mode::Enforce,
        ),
        month,
    ]
    .iter()
    .map(|c| CompiledLimit::compile(&route, c))
    .collect();
    let subject = SubjectDigest::of(b'c', b"acme");
    let mut rng = Lcg(7);
    let (mut compared, mut beyond) = (0, 0);
    for round in 0..40 {
        now += rng.next(3_000_000);
        clock.set(now);
        for l in &limits {
            let check = [Check {
                limit: l,
                subject,
                op: Op::Decide,
            }];
            for _ in 0..rng.next(25) {
                let m = memory.decide_now(&check, now);
                let d = redis_store
                    .decide(&check, tollgate::worker::WorkerId::NONE)
                    .await
                    .unwrap();
                assert_eq!(m, d, "{} round {round}: a decision", l.name);
            }
            let adjust = if rng.next(5) == 0 {
                Adjust::Reset
            } else {
                Adjust::Grant(1 + rng.next(l.policy.quota()))
            };
            memory.adjust_now(&check[0], adjust, now);
            redis_store.adjust(&check[0], adjust).await.unwrap();
            let m = memory.peek_now(&check, now);
            let d = redis_store
                .peek(&check, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap();
            assert_eq!(m, d, "{} round {round}: after {adjust:?}", l.name);
            compared += 1;
            let available = |d: &tollgate::limiter::Decision| {
                if d.allowed {
                    d.remaining + l.policy.cost
                } else {
                    d.remaining
                }
            };
            if available(&m[0]) > l.policy.quota() {
                beyond += 1;
            }

            let fresh = [Check {
                limit: l,
                subject: SubjectDigest::of(b'c', format!("fresh-{round}").as_bytes()),
                op: Op::Decide,
            }];
            let units = 1 + rng.next(l.policy.quota());
            memory.adjust_now(&fresh[0], Adjust::Grant(units), now);
            redis_store
                .adjust(&fresh[0], Adjust::Grant(units))
                .await
                .unwrap();
            let m = memory.peek_now(&fresh, now);
            let d = redis_store
                .peek(&fresh, tollgate::worker::WorkerId::NONE)
                .await
                .unwrap();
            assert_eq!(m, d, "{} round {round}: granted {units} fresh", l.name);
            assert_eq!(available(&m[0]), l.policy.quota() + units, "{}", l.name);
        }
    }
    assert_eq!(compared, 40 * limits.len());
    assert!(beyond > 40, "{beyond} grants beyond the quota compared");
}
