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
