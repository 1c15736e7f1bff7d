//! `[[rls.quota]]`: Tollgate as Envoy's quota service (RLQS), asked directly by a gRPC client
//! (tonic, with Envoy's generated types) as Envoy's `rate_limit_quota` filter asks it: usage
//! reports in, assignments out. An assignment is a lease charged in the store: two streams
//! never hold more than the limit between them, unused units come back, a spent limit answers
//! `DENY_ALL`. Bad input is refused bucket by bucket and counted. Every store.
//! (`tests/rls_envoy.rs` puts real Envoys in front.)

mod support;

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use support::*;
use tokio::sync::mpsc;
use tonic::Streaming;

/// A token bucket of 10 an hour (no refill within a test), four units at most per assignment.
const QUOTA: &str = "[[rls.quota]]\nname = \"api\"\ndomain = \"edge\"\nmatch = { route = \"api\" }\n\
                     subject = [\"tenant\"]\nalgorithm = \"token_bucket\"\nlimit = 10\nperiod = \"1h\"\n\
                     lease_max = 4\nassignment_ttl = \"5s\"\n";

struct Service {
    gw: Gateway,
    port: u16,
}

async fn service(store: &str) -> Service {
    let port = free_port();
    let cfg = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n{store}\n\n\
         [rls]\nlisten = \"127.0.0.1:{port}\"\n\n{QUOTA}"
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    Service { gw, port }
}

/// One stream, as one Envoy holds it.
struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

async fn stream(port: u16) -> Stream {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        match RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() > deadline => panic!("cannot connect: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let (tx, rx) = mpsc::channel(4);
    let out = futures_util::stream::unfold(rx, |mut rx: mpsc::Receiver<_>| async move {
        rx.recv().await.map(|m| (m, rx))
    });
    let rx = c
        .stream_rate_limit_quotas(out)
        .await
        .expect("stream opened")
        .into_inner();
    Stream { tx, rx }
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

fn usage(id: BucketId, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id),
        time_elapsed: None,
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

/// What an assignment says: the token bucket's tokens and TTL, or a blanket rule.
#[derive(Debug, PartialEq, Eq)]
enum Said {
    Tokens(u32, i64),
    Deny(i64),
    Allow(i64),
}

fn said(a: &BucketAction) -> Said {
    let Some(Action::QuotaAssignmentAction(q)) = &a.bucket_action else {
        panic!("not an assignment: {a:?}");
    };
    let ttl = q.assignment_time_to_live.as_ref().map_or(0, |d| d.seconds);
    match q.rate_limit_strategy.as_ref().and_then(|s| s.strategy) {
        Some(Strategy::TokenBucket(tb)) => {
            // The units: what Envoy's bucket (started full, every token spent as soon as it
            // exists) admits before TTL + 1 s; its expiry timer fires at the TTL. Envoy reads
            // the refill rate as tokens_per_fill ÷ the whole seconds of fill_interval.
            const NANOS: i128 = 1_000_000_000;
            let fill = tb.fill_interval.expect("a fill interval");
            assert!(fill.seconds >= 1 && (0..=1).contains(&fill.nanos), "{tb:?}");
            let secs = i128::from(fill.seconds);
            let per_fill = i128::from(tb.tokens_per_fill.expect("tokens per fill").value);
            let max = i128::from(tb.max_tokens);
            assert!(per_fill > 0 && max > 0, "{tb:?}");
            let life = i128::from(ttl + 1) * NANOS;
            let units = max + per_fill * (life - 1) / (secs * NANOS);
            // Envoy starts a bucket only when max_tokens ÷ fill rate is less than its host's
            // uptime: more than a few TTLs starts empty on a host booted recently.
            assert!(
                max * secs / per_fill <= 3 * i128::from(ttl + 1),
                "starts empty on a young host: {tb:?}"
            );
            Said::Tokens(u32::try_from(units).unwrap(), ttl)
        }
        Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => Said::Deny(ttl),
        Some(Strategy::BlanketRule(_)) => Said::Allow(ttl),
        other => panic!("unexpected strategy {other:?}"),
    }
}

impl Stream {
    /// Sends one report and returns the reply's assignments.
    async fn report(&mut self, usages: Vec<BucketQuotaUsage>) -> Vec<BucketAction> {
        self.tx
            .send(RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: usages,
            })
            .await
            .expect("sent");
        let reply = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .expect("a reply in time")
            .expect("no stream error")
            .expect("the stream is open");
        reply.bucket_action
    }

    /// Reports one bucket and returns what its assignment says.
    async fn one(&mut self, id: &BucketId, allowed: u64, denied: u64) -> Said {
        let a = self.report(vec![usage(id.clone(), allowed, denied)]).await;
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(
            a[0].bucket_id.as_ref(),
            Some(id),
            "the bucket is named back"
        );
        said(&a[0])
    }
}

/// Two streams (two Envoys: on Redis, on two gateways sharing the store) report one tenant's
/// bucket: the token buckets they get never add up to more than the limit, a spent limit
/// answers DENY_ALL, and units an assignment left unused come back for the other stream.
async fn assignments_are_leases(kind: Kind) {
    let env = store_env(kind);
    assignments_are_leases_on(&env.store, !matches!(kind, Kind::Memory)).await;
}

async fn assignments_are_leases_on(store: &str, shared: bool) {
    let a = service(store).await;
    let second = if shared {
        Some(service(store).await)
    } else {
        None
    };
    let b_port = second.as_ref().map_or(a.port, |s| s.port);
    let (mut sa, mut sb) = (stream(a.port).await, stream(b_port).await);
    let id = bucket(&[("route", "api"), ("tenant", "acme")]);
    // Demand 2 each (denied while no assignment): a first report gets lease_max (4). Until a
    // bucket's reports show Envoy's reporting interval, it is taken as Envoy 1.40's 5 s: every
    // assignment lives past the next report and a margin (7 s), above the quota's TTL (5 s).
    assert_eq!(sa.one(&id, 0, 2).await, Said::Tokens(4, 7));
    assert_eq!(sb.one(&id, 0, 2).await, Said::Tokens(4, 7));
    // Two units are left of the ten: a partial grant.
    assert_eq!(sa.one(&id, 0, 2).await, Said::Tokens(2, 7));
    // None left: denied until a unit refills (360 s away), for at most the TTL — and past the
    // next report.
    assert_eq!(sb.one(&id, 0, 2).await, Said::Deny(7));
    // From the third report on, the interval is learnt (these come at once: a second, the
    // least): the quota's TTL again.
    // A's third report closes its first assignment (4 units): 1 was used, 3 come back; it asks
    // twice its demand as a rate for TTL + 2 s (1 a second × 2 × 7 s), at most lease_max (4),
    // and gets the 3 there are.
    assert_eq!(sa.one(&id, 1, 0).await, Said::Tokens(3, 5));
    // B's first assignment (4 units) closes unused: they come back.
    assert_eq!(sb.one(&id, 0, 3).await, Said::Tokens(4, 5));
    // Another tenant has its own count.
    let other = bucket(&[("route", "api"), ("tenant", "other"), ("extra", "1")]);
    assert_eq!(sb.one(&other, 0, 9).await, Said::Tokens(4, 5));
    let m = a.gw.metrics().await;
    let granted_a = metric(
        &m,
        "tollgate_rlqs_units_total{quota=\"api\",kind=\"granted\"}",
    );
    let returned_a = metric(
        &m,
        "tollgate_rlqs_units_total{quota=\"api\",kind=\"returned\"}",
    );
    if second.is_none() {
        // One gateway: 4+4+2+3+4 (+4 for the other tenant) granted, 3+4 returned.
        assert_eq!((granted_a, returned_a), (Some(21.0), Some(7.0)), "{m}");
    } else {
        // A granted 4+2+3, returned 3.
        assert_eq!((granted_a, returned_a), (Some(9.0), Some(3.0)), "{m}");
    }
    // What Envoy reported it denied itself (on two gateways, A's alone).
    assert_eq!(
        metric(
            &m,
            "tollgate_rlqs_reported_requests_total{quota=\"api\",decision=\"denied\"}"
        ),
        Some(if second.is_none() { 20.0 } else { 4.0 }),
        "{m}"
    );
    assert!(!m.contains("acme"), "a bucket's value became a label:\n{m}");
}

on_every_store_and_cluster!(assignments_are_leases);

#[tokio::test(flavor = "multi_thread")]
async fn assignments_are_leases_on_sentinel() {
    let set = start_sentinels();
    assignments_are_leases_on(&set.store("timeout = \"2s\""), true).await;
}

/// Envoy reports a bucket the moment it appears, with the one request that made it, and next
/// at its reporting timer (every 5 s in Envoy 1.40, whatever `reporting_interval` says): the
/// first assignment has to last until then, so it is `lease_max`, not twice that one request
/// (which admitted 2 requests of a new tenant in its first seconds and refused the rest).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_buckets_first_assignment_is_lease_max() {
    let s = service("backend = \"memory\"").await;
    let mut st = stream(s.port).await;
    let id = bucket(&[("route", "api"), ("tenant", "new")]);
    assert_eq!(st.one(&id, 1, 0).await, Said::Tokens(4, 7));
    // Later reports are sized by their demand again, as a rate: 1 a second (the reports come
    // within a second: counted as one), twice, for the life + 2 s — 18, at most lease_max.
    // (Lives: 7 s until the reports show their interval, then the quota's 5 s.)
    assert_eq!(st.one(&id, 1, 0).await, Said::Tokens(4, 7));
    // A quiet report halves the assignment instead of dropping it to 1 (Envoy's next report is
    // 5 s away: a tenant back from a pause would be refused until then), and the next halves
    // it again.
    assert_eq!(st.one(&id, 0, 0).await, Said::Tokens(2, 5));
    assert_eq!(st.one(&id, 0, 0).await, Said::Tokens(1, 5));
}

/// A report's bad buckets are refused one by one (the rest are answered), counted by reason;
/// a bucket no quota maps is under no limit (ALLOW_ALL); a stream keeps at most 1024 buckets.
#[tokio::test(flavor = "multi_thread")]
async fn bad_buckets_are_refused_and_counted() {
    let s = service("backend = \"memory\"").await;
    let mut st = stream(s.port).await;
    let good = bucket(&[("route", "api"), ("tenant", "t")]);
    let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let long = "v".repeat(5000);
    let a = st
        .report(vec![
            BucketQuotaUsage {
                bucket_id: None,
                ..usage(good.clone(), 0, 0)
            },
            usage(bucket(&[]), 0, 0),
            usage(bucket(&many), 0, 0),
            usage(bucket(&[("route", "api"), ("tenant", &long)]), 0, 0),
            usage(bucket(&[("route", "web")]), 0, 0),
            usage(good.clone(), 0, 1),
        ])
        .await;
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(said(&a[0]), Said::Allow(60));
    // A new bucket's first assignment: lease_max, past Envoy's next report (7 s).
    assert_eq!(said(&a[1]), Said::Tokens(4, 7));
    // 1023 more buckets: the stream keeps 1024, the last is refused.
    let usages: Vec<_> = (0..1023)
        .map(|i| {
            usage(
                bucket(&[("route", "api"), ("tenant", &format!("t{i}"))]),
                0,
                0,
            )
        })
        .collect();
    let a = st.report(usages).await;
    assert_eq!(a.len(), 1023);
    let a = st
        .report(vec![
            usage(
                bucket(&[("route", "api"), ("tenant", "one-too-many")]),
                0,
                0,
            ),
            usage(good.clone(), 0, 0),
        ])
        .await;
    assert_eq!(a.len(), 1, "only the known bucket is answered: {a:?}");
    let m = s.gw.metrics().await;
    for (reason, n) in [
        ("no_bucket_id", 2.0),
        ("bucket_id_too_large", 2.0),
        ("no_match", 1.0),
        ("too_many_buckets", 1.0),
    ] {
        assert_eq!(
            metric(
                &m,
                &format!("tollgate_rlqs_refused_total{{reason=\"{reason}\"}}")
            ),
            Some(n),
            "{reason}:\n{m}"
        );
    }
    assert_eq!(metric(&m, "tollgate_rlqs_streams"), Some(1.0), "{m}");
    drop(st);
    // The stream's end is seen.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let m = s.gw.metrics().await;
        if metric(&m, "tollgate_rlqs_streams") == Some(0.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A reload re-matches the buckets a live stream holds: the same quota (name, limit, subject)
/// keeps its bucket and takes the new `assignment_ttl` and `lease_max`; a changed limit starts
/// the bucket over under it; a bucket the new config no longer maps is answered as unmapped.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_rematches_a_live_streams_buckets() {
    let s = service("backend = \"memory\"").await;
    let mut st = stream(s.port).await;
    let id = bucket(&[("route", "api"), ("tenant", "acme")]);
    assert_eq!(st.one(&id, 0, 2).await, Said::Tokens(4, 7));
    let reload = |quota: &str| {
        let cfg = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\n\
             backend = \"memory\"\n\n[rls]\nlisten = \"127.0.0.1:{}\"\n\n{quota}",
            s.port
        );
        s.gw.write_config(&cfg);
        async {
            let res = client()
                .post(s.gw.admin_url("/-/reload"))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
        }
    };
    // The same quota with a shorter TTL and smaller leases: the stream's bucket takes them
    // (the TTL under the 7 s an assignment lives before the interval is learnt).
    let same = QUOTA
        .replace("lease_max = 4", "lease_max = 2")
        .replace("assignment_ttl = \"5s\"", "assignment_ttl = \"3s\"");
    reload(&same).await;
    assert_eq!(st.one(&id, 0, 2).await, Said::Tokens(2, 7));
    // Its limit changed (10 → 1 an hour): a fresh count under the new limit.
    reload(
        &same
            .replace("limit = 10", "limit = 1")
            .replace("lease_max = 2", "lease_max = 1"),
    )
    .await;
    assert_eq!(st.one(&id, 0, 2).await, Said::Tokens(1, 7));
    assert_eq!(st.one(&id, 0, 2).await, Said::Deny(7));
    // No quota maps the bucket any more: under no limit, as an unmapped bucket.
    reload(&same.replace("route = \"api\"", "route = \"web\"")).await;
    assert_eq!(st.one(&id, 0, 2).await, Said::Allow(60));
}

/// One gRPC call sent as raw HTTP/2 frames (`frame`: the whole request body, gRPC framing
/// included): the `grpc-status` it ends with (in the trailers, or in the headers of a
/// trailers-only answer).
async fn raw_call(port: u16, path: &str, frame: Vec<u8>) -> String {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let call = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut body) = h2.send_request(call, false).unwrap();
    body.reserve_capacity(frame.len());
    body.send_data(frame.into(), true).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(answer.status(), 200);
    let head = answer.headers().clone();
    let mut answer = answer.into_body();
    let status = tokio::time::timeout(Duration::from_secs(10), async {
        if let Some(s) = head.get("grpc-status") {
            return s.to_str().unwrap().to_owned();
        }
        while let Some(chunk) = answer.data().await {
            let chunk = chunk.expect("the reply's body");
            let _ = answer.flow_control().release_capacity(chunk.len());
        }
        let trailers = answer.trailers().await.unwrap().expect("grpc trailers");
        trailers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    })
    .await
    .expect("the call ends in time");
    drop(h2);
    conn.abort();
    status
}

/// gRPC framing: the compressed flag, the length, the message.
fn grpc_frame(compressed: u8, len: u32, msg: &[u8]) -> Vec<u8> {
    let mut f = vec![compressed];
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// Malformed input ends a quota stream with the error `ShouldRateLimit` answers the same bytes
/// with on the same port — never `grpc-status: 0` — and each is counted by reason: garbage that
/// is no protobuf, a report over the 256 KiB limit, a compressed flag with no `grpc-encoding`.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_input_fails_the_call_and_is_counted() {
    let s = service("backend = \"memory\"").await;
    let _ = stream(s.port).await; // the listener is up
    let garbage = vec![0xffu8; 16];
    let big = vec![0u8; 300 << 10];
    let report = prost::Message::encode_to_vec(&RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![usage(bucket(&[("route", "api"), ("tenant", "z")]), 0, 1)],
    });
    let cases = [
        ("malformed_report", grpc_frame(0, 16, &garbage)),
        ("report_too_large", grpc_frame(0, 300 << 10, &big)),
        (
            "compressed_report",
            grpc_frame(1, u32::try_from(report.len()).unwrap(), &report),
        ),
    ];
    for (reason, frame) in cases {
        let rls = raw_call(
            s.port,
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            frame.clone(),
        )
        .await;
        let rlqs = raw_call(
            s.port,
            "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
            frame,
        )
        .await;
        assert_ne!(rlqs, "0", "{reason}: a failed quota stream ended OK");
        assert_eq!(
            rlqs, rls,
            "{reason}: as ShouldRateLimit answers the same bytes"
        );
    }
    let m = s.gw.metrics().await;
    for reason in ["malformed_report", "report_too_large", "compressed_report"] {
        assert_eq!(
            metric(
                &m,
                &format!("tollgate_rlqs_refused_total{{reason=\"{reason}\"}}")
            ),
            Some(1.0),
            "{reason}:\n{m}"
        );
    }
}

/// Reported counts are Envoy's `uint64`s: one over 2³² − 1 (more requests than one bucket of
/// one Envoy decides between two reports) is refused as malformed (`count_too_large`), so the
/// reported-requests counters never wrap and go backwards.
#[tokio::test(flavor = "multi_thread")]
async fn reported_counts_over_the_bound_are_refused_and_counters_never_wrap() {
    let s = service("backend = \"memory\"").await;
    let mut st = stream(s.port).await;
    let id = bucket(&[("route", "api"), ("tenant", "huge")]);
    assert_eq!(st.one(&id, 1, 2).await, Said::Tokens(4, 7));
    // Each report carries another bucket too: a reply is sent only with an assignment in it.
    let other = bucket(&[("route", "api"), ("tenant", "small")]);
    let over = st
        .report(vec![
            usage(id.clone(), u64::MAX, 0),
            usage(other.clone(), 0, 0),
        ])
        .await;
    let over_denied = st
        .report(vec![
            usage(id.clone(), 0, 1 << 32),
            usage(other.clone(), 0, 0),
        ])
        .await;
    // At the bound: counted.
    let at = st
        .report(vec![usage(id.clone(), 1, u64::from(u32::MAX))])
        .await;
    assert_eq!(at.len(), 1, "{at:?}");
    let m = s.gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_rlqs_reported_requests_total{quota=\"api\",decision=\"allowed\"}"
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_rlqs_reported_requests_total{quota=\"api\",decision=\"denied\"}"
        ),
        Some(2.0 + f64::from(u32::MAX)),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_rlqs_refused_total{reason=\"count_too_large\"}"
        ),
        Some(2.0),
        "{m}"
    );
    // A refused bucket gets no assignment (Envoy keeps the one it has).
    for a in [&over, &over_denied] {
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].bucket_id.as_ref(), Some(&other), "{a:?}");
    }
}

/// Streams opened on one client: one HTTP/2 connection.
async fn streams_on(
    c: &RateLimitQuotaServiceClient<tonic::transport::Channel>,
    n: usize,
) -> Vec<Result<Stream, tonic::Status>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (tx, rx) = mpsc::channel(4);
        let body = futures_util::stream::unfold(rx, |mut rx: mpsc::Receiver<_>| async move {
            rx.recv().await.map(|m| (m, rx))
        });
        let mut c = c.clone();
        out.push(c.stream_rate_limit_quotas(body).await.map(|r| Stream {
            tx,
            rx: r.into_inner(),
        }));
    }
    out
}

async fn client_of(port: u16) -> RateLimitQuotaServiceClient<tonic::transport::Channel> {
    RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connects")
        .max_decoding_message_size(4 << 20)
}

fn tenants(from: usize, n: usize) -> Vec<BucketQuotaUsage> {
    (from..from + n)
        .map(|i| {
            usage(
                bucket(&[("route", "api"), ("tenant", &format!("t{i}"))]),
                0,
                0,
            )
        })
        .collect()
}

/// Issue 56: buckets were bounded per stream (1,024) only, and one connection may open 1,024
/// streams. A connection keeps at most 4,096 buckets across its streams and opens at most 64
/// quota streams; beyond, buckets are refused (`connection_buckets`) and streams answered
/// `RESOURCE_EXHAUSTED` (`connection_streams`). Another connection has its own bound.
#[tokio::test(flavor = "multi_thread")]
async fn buckets_and_streams_are_bounded_per_connection() {
    let s = service("backend = \"memory\"").await;
    let c = client_of(s.port).await;
    let mut streams: Vec<Stream> = streams_on(&c, 5)
        .await
        .into_iter()
        .map(|s| s.expect("opened"))
        .collect();
    let mut answered = 0;
    for (i, st) in streams.iter_mut().enumerate() {
        answered += st.report(tenants(i * 1000, 1000)).await.len();
    }
    assert_eq!(answered, 4096, "a connection keeps 4,096 buckets");
    // Another connection is not held to the first one's count.
    let other = client_of(s.port).await;
    let mut o = streams_on(&other, 1).await.pop().unwrap().expect("opened");
    assert_eq!(o.report(tenants(10_000, 1000)).await.len(), 1000);
    // 64 quota streams per connection: 5 are open, 59 more are, the next is refused.
    let more = streams_on(&c, 60).await;
    let mut refused = Vec::new();
    let mut opened: Vec<Stream> = Vec::new();
    for r in more {
        match r {
            Ok(st) => opened.push(st),
            Err(e) => refused.push(e),
        }
    }
    // A stream's status comes with its first reply; send a report on each (of a bucket no
    // quota maps: the connection keeps no more buckets, an unmapped one is still answered).
    let mut ended = 0;
    for st in opened.iter_mut() {
        st.tx
            .send(RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: vec![usage(bucket(&[("route", "web")]), 0, 0)],
            })
            .await
            .expect("sent");
        match tokio::time::timeout(Duration::from_secs(10), st.rx.message())
            .await
            .expect("an answer in time")
        {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                ended += 1;
            }
        }
    }
    for e in &refused {
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    }
    assert_eq!(refused.len() + ended, 1, "the 65th stream is refused");
    let m = s.gw.metrics().await;
    for (reason, n) in [("connection_buckets", 904.0), ("connection_streams", 1.0)] {
        assert_eq!(
            metric(
                &m,
                &format!("tollgate_rlqs_refused_total{{reason=\"{reason}\"}}")
            ),
            Some(n),
            "{reason}:\n{m}"
        );
    }
    drop((streams, o, opened));
}

/// Issue 56: a stream that never reads its replies held up to 4 of them (≈ 1 MB) on top of
/// what HTTP/2 buffers, on each of up to 1,024 streams a connection. Replies not yet taken by
/// the client are bounded per connection (2 MiB) and per process: a stream whose reply does not
/// fit ends (`unread_replies`, `RESOURCE_EXHAUSTED`), and its buckets with it.
#[tokio::test(flavor = "multi_thread")]
async fn replies_a_client_never_reads_are_bounded_per_connection() {
    let s = service("backend = \"memory\"").await;
    let c = client_of(s.port).await;
    // 4 streams of 900 buckets whose ids are long: replies of ≈ 200 KB each, never read.
    let pad = "p".repeat(180);
    let mut streams: Vec<Stream> = streams_on(&c, 4)
        .await
        .into_iter()
        .map(|s| s.expect("opened"))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let m = loop {
        for (i, st) in streams.iter_mut().enumerate() {
            let usages: Vec<_> = (0..900)
                .map(|j| {
                    usage(
                        bucket(&[
                            ("route", "api"),
                            ("tenant", &format!("s{i}t{j}")),
                            ("pad", &pad),
                        ]),
                        0,
                        0,
                    )
                })
                .collect();
            // The stream stops reading reports once its replies wait: do not block on it.
            let _ = st.tx.try_send(RateLimitQuotaUsageReports {
                domain: "edge".into(),
                bucket_quota_usages: usages,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let m = s.gw.metrics().await;
        if metric(&m, "tollgate_rlqs_refused_total{reason=\"unread_replies\"}").unwrap_or(0.0)
            >= 1.0
        {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stream refused:\n{m}"
        );
    };
    assert!(!m.contains("s0t"), "a bucket's value became a label");
    // The refused stream's end is an error, after the replies it had queued.
    let mut failed = 0;
    for st in streams.iter_mut() {
        loop {
            match tokio::time::timeout(Duration::from_millis(500), st.rx.message()).await {
                Ok(Ok(Some(_))) => continue,
                Ok(Err(e)) => {
                    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                    failed += 1;
                    break;
                }
                // Still open (waiting for reports), or ended OK (never).
                Ok(Ok(None)) => panic!("a stream ended OK"),
                Err(_) => break,
            }
        }
    }
    assert!(failed >= 1, "the refused stream ends RESOURCE_EXHAUSTED");
}

/// Several reports on one quota stream, sent as raw HTTP/2 frames (each `report` its own gRPC
/// message, the stream then ended by the client): the messages of the reply, undecoded, and the
/// `grpc-status` it ends with.
async fn raw_stream(port: u16, reports: &[Vec<u8>]) -> (Vec<Vec<u8>>, String) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let call = http::Request::post(format!(
        "http://127.0.0.1:{port}/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (answer, mut body) = h2.send_request(call, false).unwrap();
    let mut frames = Vec::new();
    for r in reports {
        frames.extend(grpc_frame(0, u32::try_from(r.len()).unwrap(), r));
    }
    body.reserve_capacity(frames.len());
    body.send_data(frames.into(), true).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(answer.status(), 200);
    let head = answer.headers().clone();
    let mut answer = answer.into_body();
    let (bytes, status) = tokio::time::timeout(Duration::from_secs(10), async {
        let mut bytes = Vec::new();
        if let Some(s) = head.get("grpc-status") {
            return (bytes, s.to_str().unwrap().to_owned());
        }
        while let Some(chunk) = answer.data().await {
            let chunk = chunk.expect("the reply's body");
            let _ = answer.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        let trailers = answer.trailers().await.unwrap().expect("grpc trailers");
        let status = trailers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (bytes, status)
    })
    .await
    .expect("the call ends in time");
    drop(h2);
    conn.abort();
    let mut messages = Vec::new();
    let mut rest = bytes.as_slice();
    while rest.len() >= 5 {
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        messages.push(rest[5..5 + len].to_vec());
        rest = &rest[5 + len..];
    }
    (messages, status)
}

/// Issue 50 §1 for the quota service: Envoy forwards a header's bytes as they came, so a
/// bucket_id value may be no UTF-8 (`X-Tenant: caf\xe9`). Decoded as protobuf strings it
/// failed the whole stream with `INTERNAL` — every bucket of that Envoy lost its assignments
/// and fell to its fallback (open by default). It is a value like any other: its bucket is
/// answered (its bucket_id sent back byte for byte), and the stream goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_id_value_that_is_not_utf8_is_answered() {
    let s = service("backend = \"memory\"").await;
    let _ = stream(s.port).await; // the listener is up
    let report = |tenant: &str| {
        prost::Message::encode_to_vec(&RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![usage(bucket(&[("route", "api"), ("tenant", tenant)]), 1, 0)],
        })
    };
    // "cafX", then its last byte made 0xe9 (the same length: the message stays well formed).
    let mut latin1 = report("cafX");
    let at = latin1
        .windows(4)
        .position(|w| w == b"cafX")
        .expect("the value");
    latin1[at + 3] = 0xe9;
    let (replies, status) = raw_stream(s.port, &[report("a"), latin1, report("b")]).await;
    assert_eq!(status, "0", "the stream ends OK: {} replies", replies.len());
    assert_eq!(replies.len(), 3, "every report is answered");
    assert!(
        replies[1].windows(4).any(|w| w == b"caf\xe9"),
        "the bucket_id is sent back byte for byte"
    );
    let m = s.gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_rlqs_refused_total{reason=\"malformed_report\"}"
        ),
        Some(0.0),
        "{m}"
    );
}
