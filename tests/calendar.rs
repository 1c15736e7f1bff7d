//! Calendar quotas on every store, on injected time: a day quota resets at UTC midnight, a week
//! quota on Monday, a month quota at the month's boundary (28–31 days), and `Retry-After` points
//! at the boundary. The stores are built on a `ManualClock` (the in-process store reads it; the
//! Redis stores send it to the script), so no test waits for a day.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use tollgate::calendar::{days_from_civil, Calendar, CalendarWindow};
use tollgate::config::{
    Algorithm, Backend, LimitConfig, Mode, OnError, OnMissing, StoreConfig, SubjectSpec,
};
use tollgate::limiter::{Check, CompiledLimit, Decision, Op, SubjectDigest};
use tollgate::store::{AnyClock, AnyStore, ManualClock, Store};

const S: u64 = 1_000_000;

/// Microseconds at `y-m-d hh:mm:ss` UTC.
fn at(y: u64, m: u64, d: u64, hh: u64, mm: u64, ss: u64) -> u64 {
    (days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss) * S
}

fn quota(name: &str, limit: u64, calendar: impl Into<CalendarWindow>) -> LimitConfig {
    let calendar: CalendarWindow = calendar.into();
    LimitConfig {
        name: name.into(),
        algorithm: Algorithm::FixedWindow,
        limit,
        period: Duration::from_micros(calendar.max_len()),
        subject: SubjectSpec::Global,
        burst: 0,
        cost: 1,
        mode: Mode::Enforce,
        on_missing: OnMissing::Ip,
        calendar: Some(calendar),
        after: None,
        fleet: Default::default(),
        prefixes: Default::default(),
        exempt: Default::default(),
        refusal: None,
        limit_from: None,
        ban: None,
    }
}

/// A store of `kind` on `clock`, and what keeps its servers alive.
async fn store_on(kind: Kind, clock: &ManualClock) -> (AnyStore, Option<Redis>, Option<Cluster>) {
    let redis_cfg = |backend: Backend, urls: Vec<String>| StoreConfig {
        backend,
        urls,
        timeout: Duration::from_secs(2),
        on_error: OnError::Deny,
        key_prefix: "cal".into(),
        max_subjects: 1000,
        deny_cache: true,
        sentinel: None,
    };
    let (cfg, redis, cluster) = match kind {
        Kind::Memory => (redis_cfg(Backend::Memory, vec![]), None, None),
        Kind::Redis => {
            let r = redis();
            (redis_cfg(Backend::Redis, vec![r.url()]), Some(r), None)
        }
        Kind::RedisCluster => {
            let c = start_cluster();
            let urls = c.nodes.iter().map(|n| n.url()).collect();
            (redis_cfg(Backend::RedisCluster, urls), None, Some(c))
        }
    };
    let store = AnyStore::build(&cfg, AnyClock::Manual(clock.clone()), 1);
    // Connected once a decision succeeds (a probe limit of its own).
    let probe = CompiledLimit::compile(&Arc::from("probe"), &quota("p", 1000, Calendar::Day));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
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
            break;
        }
        assert!(Instant::now() < deadline, "the store never connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (store, redis, cluster)
}

async fn decide(store: &AnyStore, limit: &CompiledLimit, subject: SubjectDigest) -> Decision {
    store
        .decide(
            &[Check {
                limit,
                subject,
                op: Op::Decide,
            }],
            tollgate::worker::WorkerId::NONE,
        )
        .await
        .unwrap()
        .remove(0)
}

/// Allowed count of `n` requests.
async fn admitted(store: &AnyStore, limit: &CompiledLimit, s: SubjectDigest, n: usize) -> usize {
    let mut k = 0;
    for _ in 0..n {
        if decide(store, limit, s).await.allowed {
            k += 1;
        }
    }
    k
}

async fn calendar_quotas_reset_at_their_boundary(kind: Kind) {
    let clock = ManualClock::new(at(2026, 1, 31, 23, 59, 58));
    let (store, _r, _c) = store_on(kind, &clock).await;
    let route: Arc<str> = Arc::from("api");
    let day = CompiledLimit::compile(&route, &quota("daily", 2, Calendar::Day));
    let week = CompiledLimit::compile(&route, &quota("weekly", 3, Calendar::Week));
    let month = CompiledLimit::compile(&route, &quota("monthly", 4, Calendar::Month));
    let who = SubjectDigest::of(b'c', b"acme");

    // Saturday 31 January, 23:59:58: the day's 2 are used; the denial lasts 2 s, to midnight.
    assert_eq!(admitted(&store, &day, who, 3).await, 2);
    let d = decide(&store, &day, who).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, 2 * S);
    assert_eq!(d.reset_after, 2 * S);
    // One microsecond before midnight: still denied.
    clock.set(at(2026, 2, 1, 0, 0, 0) - 1);
    assert!(!decide(&store, &day, who).await.allowed);
    // Midnight UTC: a new day.
    clock.set(at(2026, 2, 1, 0, 0, 0));
    let d = decide(&store, &day, who).await;
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset_after), (1, 86_400 * S));

    // The month: 31 January takes 4; 1 February starts a new month.
    clock.set(at(2026, 1, 31, 12, 0, 0));
    assert_eq!(admitted(&store, &month, who, 5).await, 4);
    let d = decide(&store, &month, who).await;
    assert_eq!(d.retry_after, 12 * 3600 * S, "until 1 February 00:00");
    clock.set(at(2026, 2, 1, 0, 0, 0));
    assert_eq!(admitted(&store, &month, who, 5).await, 4);
    // 28 February 2026 is still February (a 28-day month): denied until 1 March.
    clock.set(at(2026, 2, 28, 23, 0, 0));
    let d = decide(&store, &month, who).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, 3600 * S);
    clock.set(at(2026, 3, 1, 0, 0, 0));
    assert!(decide(&store, &month, who).await.allowed);

    // The week runs Monday to Monday: Sunday 8 March is in the week of Monday 2 March.
    clock.set(at(2026, 3, 2, 0, 0, 0));
    assert_eq!(admitted(&store, &week, who, 4).await, 3);
    clock.set(at(2026, 3, 8, 23, 59, 59));
    let d = decide(&store, &week, who).await;
    assert_eq!((d.allowed, d.retry_after), (false, S));
    clock.set(at(2026, 3, 9, 0, 0, 0));
    assert!(decide(&store, &week, who).await.allowed);

    // Another consumer has a quota of its own.
    let other = SubjectDigest::of(b'c', b"globex");
    assert!(decide(&store, &week, other).await.allowed);
}

mod calendar_quotas_reset_at_their_boundary {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn memory() {
        calendar_quotas_reset_at_their_boundary(Kind::Memory).await
    }
    #[tokio::test(flavor = "multi_thread")]
    async fn redis() {
        calendar_quotas_reset_at_their_boundary(Kind::Redis).await
    }
    #[tokio::test(flavor = "multi_thread")]
    async fn redis_cluster() {
        calendar_quotas_reset_at_their_boundary(Kind::RedisCluster).await
    }
}

/// Billing-day quotas on every store (Redis computes the windows in state.lua on the injected
/// time): a month from the 15th across the year end, one from the 28th across a leap day, and
/// a day from local midnight in UTC−05:00 across a month end.
async fn billing_day_quotas_follow_their_anchor_and_offset(kind: Kind) {
    let clock = ManualClock::new(at(2027, 12, 20, 12, 0, 0));
    let (store, _r, _c) = store_on(kind, &clock).await;
    let route: Arc<str> = Arc::from("api");
    let window = |unit: Calendar, anchor_day: u8, utc_offset_min: i16| CalendarWindow {
        unit,
        anchor_day,
        utc_offset_min,
    };
    let from15 =
        CompiledLimit::compile(&route, &quota("from15", 2, window(Calendar::Month, 15, 0)));
    let from28 =
        CompiledLimit::compile(&route, &quota("from28", 2, window(Calendar::Month, 28, 0)));
    let ny = CompiledLimit::compile(&route, &quota("ny", 2, window(Calendar::Day, 1, -300)));
    let who = SubjectDigest::of(b'c', b"acme");

    // 20 December 2027 is in the window of 15 December: it ends 15 January 2028, 00:00.
    assert_eq!(admitted(&store, &from15, who, 3).await, 2);
    let d = decide(&store, &from15, who).await;
    assert_eq!(
        d.retry_after,
        at(2028, 1, 15, 0, 0, 0) - at(2027, 12, 20, 12, 0, 0)
    );
    // 1 January (a plain month would start afresh): still the same window.
    clock.set(at(2028, 1, 1, 0, 0, 0));
    assert!(!decide(&store, &from15, who).await.allowed);
    clock.set(at(2028, 1, 15, 0, 0, 0) - 1);
    assert!(!decide(&store, &from15, who).await.allowed);
    clock.set(at(2028, 1, 15, 0, 0, 0));
    assert_eq!(admitted(&store, &from15, who, 3).await, 2);

    // From the 28th: 28 February 2028 to 28 March — 29 days, the leap day inside.
    clock.set(at(2028, 2, 29, 23, 0, 0));
    assert_eq!(admitted(&store, &from28, who, 3).await, 2);
    let d = decide(&store, &from28, who).await;
    assert_eq!(
        d.retry_after,
        at(2028, 3, 28, 0, 0, 0) - at(2028, 2, 29, 23, 0, 0)
    );
    clock.set(at(2028, 3, 1, 0, 0, 0));
    assert!(
        !decide(&store, &from28, who).await.allowed,
        "1 March is the same window"
    );
    clock.set(at(2028, 3, 28, 0, 0, 0));
    assert!(decide(&store, &from28, who).await.allowed);

    // UTC−05:00: 29 February 2028, 23:30 in New York is 1 March 04:30 UTC (a plain day would
    // have started at 00:00 UTC); the day ends at 05:00 UTC.
    clock.set(at(2028, 3, 1, 4, 30, 0));
    assert_eq!(admitted(&store, &ny, who, 3).await, 2);
    let d = decide(&store, &ny, who).await;
    assert_eq!((d.allowed, d.retry_after), (false, 1800 * S));
    clock.set(at(2028, 3, 1, 5, 0, 0));
    assert_eq!(admitted(&store, &ny, who, 3).await, 2);
}

mod billing_day_quotas_follow_their_anchor_and_offset {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn memory() {
        billing_day_quotas_follow_their_anchor_and_offset(Kind::Memory).await
    }
    #[tokio::test(flavor = "multi_thread")]
    async fn redis() {
        billing_day_quotas_follow_their_anchor_and_offset(Kind::Redis).await
    }
    #[tokio::test(flavor = "multi_thread")]
    async fn redis_cluster() {
        billing_day_quotas_follow_their_anchor_and_offset(Kind::RedisCluster).await
    }
}

/// A calendar quota charged after the response (`cost_header`): the charge lands in the
/// calendar's window, is clamped to a spent quota, and the next day starts afresh.
async fn a_calendar_quota_is_charged_after_the_response(kind: Kind) {
    let clock = ManualClock::new(at(2026, 5, 4, 22, 0, 0));
    let (store, _r, _c) = store_on(kind, &clock).await;
    let day = CompiledLimit::compile(&Arc::from("api"), &quota("daily", 10, Calendar::Day));
    let who = SubjectDigest::of(b'c', b"acme");
    let charge = |units| Check {
        limit: &day,
        subject: who,
        op: Op::Charge(units),
    };
    store
        .settle(&[charge(6)], tollgate::worker::WorkerId::NONE)
        .await
        .unwrap();
    let d = decide(&store, &day, who).await;
    assert_eq!((d.allowed, d.remaining), (true, 3), "10 - 6 charged - 1");
    // Beyond what is left: clamped to a spent quota, denied until midnight.
    store
        .settle(&[charge(10)], tollgate::worker::WorkerId::NONE)
        .await
        .unwrap();
    let d = decide(&store, &day, who).await;
    assert_eq!((d.allowed, d.retry_after), (false, 2 * 3600 * S));
    clock.set(at(2026, 5, 5, 0, 0, 0));
    let d = decide(&store, &day, who).await;
    assert_eq!((d.allowed, d.remaining), (true, 9));
}

mod a_calendar_quota_is_charged_after_the_response {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn memory() {
        a_calendar_quota_is_charged_after_the_response(Kind::Memory).await
    }
    #[tokio::test(flavor = "multi_thread")]
    async fn redis() {
        a_calendar_quota_is_charged_after_the_response(Kind::Redis).await
    }
}

/// The libfaketime library that `scripts/test` installs (Debian's `libfaketime`).
fn libfaketime() -> String {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
        .map(|p| p.display().to_string())
        .expect("libfaketime is not installed: run `scripts/test` (or `apt-get install -y libfaketime`)")
}

/// Hardening III #5: a gateway whose clock is a day behind Redis's still enforces a day quota
/// on Redis, and its `Retry-After` points at Redis's midnight. Before the fix the window came
/// from the gateway's clock and its key's TTL from Redis `TIME`: the key expired at once and
/// the quota was never enforced. The gateway runs under libfaketime (`FAKETIME=-1d`); Redis
/// keeps the real time.
async fn a_gateway_behind_redis_cannot_switch_a_quota_off(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 2\ncalendar = \"day\"\nsubject = \"global\"");
    let lib = libfaketime();
    let gw = gateway_env(
        &config(&env.store, &routes),
        &[("LD_PRELOAD", &lib), ("FAKETIME", "-1d")],
    );
    wait_ready(&gw).await;
    let c = client();
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..4 {
        let r = c.get(gw.url("/api/x")).send().await.unwrap();
        statuses.push(r.status().as_u16());
        if let Some(v) = r.headers().get("retry-after") {
            retry_after = v.to_str().ok().and_then(|v| v.parse::<u64>().ok());
        }
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    // Until the next UTC midnight by the real (Redis) clock, not the gateway's a day earlier.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_midnight = 86_400 - now % 86_400;
    let retry_after = retry_after.expect("a 429 has Retry-After");
    assert!(
        retry_after.abs_diff(to_midnight) <= 2,
        "Retry-After {retry_after}, midnight in {to_midnight}"
    );
}

mod a_gateway_behind_redis_cannot_switch_a_quota_off {
    #[tokio::test(flavor = "multi_thread")]
    async fn redis() {
        super::a_gateway_behind_redis_cannot_switch_a_quota_off(super::Kind::Redis).await
    }
    #[tokio::test(flavor = "multi_thread")]
    async fn redis_cluster() {
        super::a_gateway_behind_redis_cannot_switch_a_quota_off(super::Kind::RedisCluster).await
    }
}

/// Through the binary on injected time (`TOLLGATE_TEST_CLOCK`): a day quota two seconds before
/// UTC midnight denies with `Retry-After: 2` and the reset header at the boundary, still denies
/// a microsecond before it, and admits the full quota again at midnight — on every store, the
/// Redis scripts deciding at the injected time rather than Redis `TIME`.
async fn a_gateways_day_quota_resets_at_midnight_of_its_injected_clock(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 2\ncalendar = \"day\"\nsubject = \"global\"");
    let midnight = at(2027, 3, 1, 0, 0, 0);
    let gw = gateway_on_clock(&config(&env.store, &routes), midnight - 2 * S);
    wait_ready(&gw).await;
    let c = client();
    let get = || c.get(gw.url("/api/x")).send();
    assert_eq!(get().await.unwrap().status(), 200, "{kind:?}");
    let r = get().await.unwrap();
    assert_eq!(r.status(), 200, "{kind:?}");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0", "{kind:?}");
    let r = get().await.unwrap();
    assert_eq!(r.status(), 429, "{kind:?}");
    assert_eq!(r.headers()["retry-after"], "2", "{kind:?}");
    assert_eq!(r.headers()["x-ratelimit-reset"], "2", "{kind:?}");
    gw.set_clock(midnight - 1).await;
    assert_eq!(get().await.unwrap().status(), 429, "{kind:?}");
    gw.set_clock(midnight).await;
    let r = get().await.unwrap();
    assert_eq!(r.status(), 200, "{kind:?}");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "1", "{kind:?}");
    // The next window is a whole day.
    assert_eq!(r.headers()["x-ratelimit-reset"], "86400", "{kind:?}");
    assert_eq!(up.hits(), 3);
}

on_every_store_and_cluster!(a_gateways_day_quota_resets_at_midnight_of_its_injected_clock);
