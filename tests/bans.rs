//! #38 §4, the penalty box: `ban_after`, `ban_for` on a limit, through the binary on every store
//! and on injected time. A subject refused `ban_after` times within the limit's period is
//! refused outright for `ban_for` (Retry-After = the ban's end), answered without asking the
//! store, counted in `tollgate_ratelimit_bans_total`, listed in `/-/top`, and let out by
//! `POST /-/quota/reset`; on a shared store, shared by the fleet.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;

on_every_store!(a_subject_refused_n_times_is_banned);

fn h(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

async fn a_subject_refused_n_times_is_banned(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"10s\"\nsubject = \"ip\"\nban_after = 3\nban_for = \"1m\"");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let get = || c.get(gw.url("/api/x")).send();
    for _ in 0..2 {
        assert_eq!(get().await.unwrap().status(), 200);
    }
    // Two refusals: the window's own Retry-After.
    for _ in 0..2 {
        let res = get().await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(h(&res, "retry-after"), "10");
    }
    // The third starts the ban: retry when it ends.
    let res = get().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "retry-after"), "60", "{kind:?}");
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_bans_total{route=\"api\",limit=\"per-ip\"}"
        ),
        Some(1.0),
        "{m}"
    );
    // The window has passed, the ban has not: refused, without asking the store.
    gw.advance(Duration::from_secs(11)).await;
    let store_calls = |m: &str| metric_sum(m, "tollgate_store_duration_seconds_count", &[]);
    let before = store_calls(&gw.metrics().await);
    if matches!(kind, Kind::Redis) {
        assert!(before > 0.0, "Redis calls are measured");
    }
    for _ in 0..3 {
        let res = get().await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(h(&res, "retry-after"), "49");
        assert_eq!(h(&res, "x-ratelimit-remaining"), "0");
        assert!(
            h(&res, "ratelimit").starts_with("\"per-ip\";r=0;t=49"),
            "{:?}",
            res.headers()
        );
    }
    let m = gw.metrics().await;
    assert_eq!(store_calls(&m), before, "a banned request asked the store");
    assert_eq!(up.hits(), 2);
    // /-/top lists the ban.
    let top: Value = c
        .get(gw.admin_url("/-/top?route=api&limit=per-ip"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(top["banned"].as_array().map(Vec::len), Some(1), "{top}");
    assert_eq!(top["banned"][0]["ends_in_s"], 49, "{top}");
    // A reset lifts it.
    let r = c
        .post(gw.admin_url("/-/quota/reset"))
        .body(r#"{"route":"api","limit":"per-ip"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["bans_lifted"], 1, "{v}");
    assert_eq!(get().await.unwrap().status(), 200);
    // Banned again (two left in the window, then three refusals); the ban ends on its own.
    assert_eq!(get().await.unwrap().status(), 200);
    for _ in 0..3 {
        assert_eq!(get().await.unwrap().status(), 429);
    }
    gw.advance(Duration::from_secs(30)).await;
    assert_eq!(get().await.unwrap().status(), 429);
    gw.advance(Duration::from_secs(31)).await;
    assert_eq!(get().await.unwrap().status(), 200);
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_bans_total{route=\"api\",limit=\"per-ip\"}"
        ),
        Some(2.0)
    );
}

on_every_store_and_cluster!(a_fleet_shares_the_ban_through_the_store);

async fn reset(c: &reqwest::Client, gw: &Gateway) -> Value {
    let r = c
        .post(gw.admin_url("/-/quota/reset"))
        .body(r#"{"route":"api","limit":"per-ip"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// Two gateways on one store: a ban one starts refuses the subject on the other (429, the
/// ban's Retry-After and RateLimit fields, nothing charged), which then holds it without asking
/// the store; a reset on either lifts it on both; it ends at `ban_for`. On the memory store each
/// gateway has its own box (nothing is shared).
async fn a_fleet_shares_the_ban_through_the_store(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"10s\"\nsubject = \"ip\"\nban_after = 3\nban_for = \"1m\"");
    let cfg = config(&env.store, &routes);
    let a = gateway_on_clock(&cfg, T0);
    let b = gateway_on_clock(&cfg, T0);
    wait_ready(&a).await;
    wait_ready(&b).await;
    let c = client();
    let get = |gw: &Gateway| c.get(gw.url("/api/x")).send();
    for _ in 0..2 {
        assert_eq!(get(&a).await.unwrap().status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(get(&a).await.unwrap().status(), 429);
    }
    let res = get(&b).await.unwrap();
    if kind == Kind::Memory {
        // Nothing shared: the other gateway's own count admits it.
        assert_eq!(res.status(), 200);
        assert_eq!(up.hits(), 3);
        return;
    }
    assert_eq!(
        res.status(),
        429,
        "{kind:?}: the other gateway refuses the banned"
    );
    assert_eq!(h(&res, "retry-after"), "60", "{kind:?}");
    assert_eq!(h(&res, "x-ratelimit-remaining"), "0");
    assert!(
        h(&res, "ratelimit").starts_with("\"per-ip\";r=0;t=60"),
        "{:?}",
        res.headers()
    );
    assert_eq!(up.hits(), 2);
    // B holds the ban: past the window, refused without asking the store.
    a.advance(Duration::from_secs(11)).await;
    b.advance(Duration::from_secs(11)).await;
    let store_calls = |m: &str| metric_sum(m, "tollgate_store_duration_seconds_count", &[]);
    let before = store_calls(&b.metrics().await);
    for _ in 0..3 {
        let res = get(&b).await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(h(&res, "retry-after"), "49");
    }
    assert_eq!(
        store_calls(&b.metrics().await),
        before,
        "B asked the store while banned"
    );
    // Lifted on B: free on B at once, on A within a second or two (it watches the store).
    let v = reset(&c, &b).await;
    assert_eq!(v["bans_lifted"], 1, "{v}");
    assert_eq!(v["store_bans_lifted"], 1, "{v}");
    assert_eq!(get(&b).await.unwrap().status(), 200);
    let mut waited = 0;
    while get(&a).await.unwrap().status() != 200 {
        waited += 1;
        assert!(waited < 50, "A still holds the ban lifted on B");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Banned again from A (the window is spent: three refusals); the ban ends at ban_for on
    // both gateways.
    for _ in 0..3 {
        assert_eq!(get(&a).await.unwrap().status(), 429);
    }
    let res = get(&b).await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "retry-after"), "60");
    a.advance(Duration::from_secs(30)).await;
    b.advance(Duration::from_secs(30)).await;
    assert_eq!(get(&b).await.unwrap().status(), 429);
    a.advance(Duration::from_secs(31)).await;
    b.advance(Duration::from_secs(31)).await;
    assert_eq!(get(&b).await.unwrap().status(), 200);
    assert_eq!(get(&a).await.unwrap().status(), 200);
    let m = a.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_bans_total{route=\"api\",limit=\"per-ip\"}"
        ),
        Some(2.0),
        "bans are counted where they start"
    );
    let m = b.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_ratelimit_bans_total{route=\"api\",limit=\"per-ip\"}"
        ),
        Some(0.0),
        "{m}"
    );
}

fn commandstat(r: &Redis, cmd: &str) -> u64 {
    let info = r.cli(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A request that is not banned costs one round trip with a penalty box as without: the ban is
/// read inside the decision's script call (one GET more in the script, no command more on the
/// wire). Measured with `INFO commandstats`: 10 requests, 10 script calls either way.
#[tokio::test(flavor = "multi_thread")]
async fn a_shared_ban_costs_no_round_trip() {
    let up = upstream().await;
    let env = store_env(Kind::Redis);
    let r = env._redis.as_ref().unwrap();
    let mut costs = Vec::new();
    for ban in ["", "\nban_after = 3\nban_for = \"1m\""] {
        let routes = route("api", "/api", &up.url(), "")
            + &limit(&format!("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"10s\"\nsubject = \"ip\"{ban}"));
        let gw = gateway_on_clock(&config(&env.store, &routes), T0);
        wait_ready(&gw).await;
        let c = client();
        assert_eq!(c.get(gw.url("/api/x")).send().await.unwrap().status(), 200);
        let calls = |r: &Redis| ["fcall", "evalsha", "eval", "get"].map(|cmd| commandstat(r, cmd));
        let before = calls(r);
        for _ in 0..10 {
            assert_eq!(c.get(gw.url("/api/x")).send().await.unwrap().status(), 200);
        }
        let after = calls(r);
        let script = (0..3).map(|i| after[i] - before[i]).sum::<u64>();
        costs.push((script, after[3] - before[3]));
        r.cli(&["FLUSHALL"]);
    }
    assert_eq!(
        costs[0].0, 10,
        "one script call a request without bans: {costs:?}"
    );
    assert_eq!(
        costs[1].0, 10,
        "one script call a request with bans: {costs:?}"
    );
    // Inside the script: the state's GET and the ban's (without bans the batch may go as runs,
    // which read the state otherwise).
    assert_eq!(costs[1].1, 20, "two GETs inside the script: {costs:?}");
}

on_every_store!(a_ban_shorter_than_the_limits_refusal_names_the_later);

/// A ban shorter than the limit's own refusal (`ban_for = "2s"` on a window of an hour): during
/// the ban `Retry-After` (and the `RateLimit` field's `t`) name the later of the two — the
/// window's end — so that a client retrying when told is not refused again. Past the ban the
/// store answers with the same end.
async fn a_ban_shorter_than_the_limits_refusal_names_the_later(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\"\nban_after = 3\nban_for = \"2s\"");
    let gw = gateway_on_clock(&config(&env.store, &routes), T0);
    wait_ready(&gw).await;
    let c = client();
    let get = || c.get(gw.url("/api/x")).send();
    for _ in 0..2 {
        assert_eq!(get().await.unwrap().status(), 200);
    }
    for _ in 0..3 {
        let res = get().await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(h(&res, "retry-after"), "3600", "{kind:?}");
    }
    // Banned (from memory): the window still refuses for longer than the ban.
    gw.advance(Duration::from_secs(1)).await;
    let res = get().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(
        h(&res, "retry-after"),
        "3599",
        "{kind:?}: the ban's end named"
    );
    assert!(
        h(&res, "ratelimit").starts_with("\"per-ip\";r=0;t=3599"),
        "{kind:?}: {:?}",
        res.headers()
    );
    // The ban over: the store refuses with the same end.
    gw.advance(Duration::from_secs(2)).await;
    let res = get().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "retry-after"), "3597", "{kind:?}");
    assert_eq!(up.hits(), 2);
}
