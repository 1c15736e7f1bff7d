//! The HTTP cache at the edge (#54), end to end: a real gateway with a `[routes.cache]` route
//! in front of a scripted upstream that counts what reaches it, on the HTTP/1 front under test
//! (`TOLLGATE_TEST_HTTP1`, both in `scripts/test`) and on HTTP/2 (h2c prior knowledge). Time is
//! the gateway's injected clock, and the upstream's `Date` follows it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};

mod support;

use support::{config, gateway_on_clock, metric, route, store_env, Gateway, Kind, StoreEnv};

/// What the scripted upstream saw: requests by path and query, and the last request's headers
/// by path and query.
#[derive(Default)]
struct Seen {
    count: HashMap<String, usize>,
    last: HashMap<String, http::HeaderMap>,
}

/// An upstream answering as each request's query asks (`cc`, `etag`, `vary`, `size`,
/// `status`, `delay` in ms, `cookie`, `lm`, `fail`, `tag`: its `Cache-Tag`), its `Date` on
/// `now` (seconds).
struct Scripted {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    now: Arc<AtomicU64>,
}

impl Scripted {
    fn count(&self, target: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .count
            .get(target)
            .copied()
            .unwrap_or(0)
    }

    fn last(&self, target: &str) -> http::HeaderMap {
        self.seen.lock().unwrap().last[target].clone()
    }
}

fn query(uri: &http::Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            (
                k.to_owned(),
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        })
        .collect()
}

async fn answer(
    seen: Arc<Mutex<Seen>>,
    now: Arc<AtomicU64>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    {
        let mut s = seen.lock().unwrap();
        *s.count.entry(target.clone()).or_default() += 1;
        s.last.insert(target.clone(), req.headers().clone());
    }
    let q = query(req.uri());
    if let Some(ms) = q.get("delay").and_then(|d| d.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let n = seen.lock().unwrap().count[&target];
    let size: usize = q.get("size").and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = if size > 0 {
        "x".repeat(size)
    } else {
        format!("{target} #{n}")
    };
    let mut res = Response::new(Full::new(Bytes::from(body)));
    let h = res.headers_mut();
    let date = std::time::UNIX_EPOCH + Duration::from_secs(now.load(Ordering::SeqCst));
    h.insert("date", httpdate::fmt_http_date(date).parse().unwrap());
    if let Some(cc) = q.get("cc") {
        h.insert("cache-control", cc.parse().unwrap());
    }
    if let Some(v) = q.get("vary") {
        h.insert("vary", v.parse().unwrap());
    }
    if let Some(t) = q.get("tag") {
        h.insert("cache-tag", t.parse().unwrap());
    }
    if q.contains_key("lm") {
        h.insert(
            "last-modified",
            "Thu, 01 Jan 2015 00:00:00 GMT".parse().unwrap(),
        );
    }
    if q.contains_key("cookie") {
        h.insert("set-cookie", "session=1".parse().unwrap());
    }
    if let Some(etag) = q.get("etag") {
        let etag = format!("\"{etag}\"");
        h.insert("etag", etag.parse().unwrap());
        let matches = req
            .headers()
            .get("if-none-match")
            .is_some_and(|v| v.as_bytes() == etag.as_bytes());
        if matches {
            *res.status_mut() = StatusCode::NOT_MODIFIED;
            *res.body_mut() = Full::new(Bytes::new());
            return Ok(res);
        }
    }
    if let Some(s) = q.get("status").and_then(|s| s.parse().ok()) {
        *res.status_mut() = StatusCode::from_u16(s).unwrap();
    }
    // `fail`: every request after the first answers 503.
    if q.contains_key("fail") && n > 1 {
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    Ok(res)
}

async fn scripted(now: u64) -> Scripted {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let clock = Arc::new(AtomicU64::new(now));
    let (s, c) = (seen.clone(), clock.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (s, c) = (s.clone(), c.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(s.clone(), c.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Scripted {
        addr,
        seen,
        now: clock,
    }
}

/// The protocols every scenario runs on: the HTTP/1 front under test, and HTTP/2.
fn clients() -> [(&'static str, reqwest::Client); 2] {
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    [("http1", support::client()), ("h2", h2)]
}

/// A gateway and its scripted upstream, on one clock (the current time, whole seconds), on a
/// store (the in-process one unless [`Setup::on`] says).
struct Setup {
    gw: Gateway,
    up: Scripted,
    _store: Option<StoreEnv>,
}

impl Setup {
    async fn new(extra: &str, limits: &str) -> Setup {
        Setup::on(None, extra, limits).await
    }

    async fn on(store: Option<StoreEnv>, extra: &str, limits: &str) -> Setup {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let up = scripted(now).await;
        let routes = route(
            "c",
            "/c",
            &format!("http://{}", up.addr),
            &format!("[routes.cache]\n{extra}\n{limits}"),
        );
        let body = store.as_ref().map_or("backend = \"memory\"", |s| &s.store);
        let gw = gateway_on_clock(&config(body, &routes), now * 1_000_000);
        Setup {
            gw,
            up,
            _store: store,
        }
    }

    /// Moves the gateway's clock and the upstream's `Date` together.
    async fn advance(&self, secs: u64) {
        self.up.now.fetch_add(secs, Ordering::SeqCst);
        self.gw.advance(Duration::from_secs(secs)).await;
    }
}

fn cache_status(r: &reqwest::Response) -> String {
    r.headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

async fn get(c: &reqwest::Client, s: &Setup, target: &str) -> (u16, String, String) {
    let r = c.get(s.gw.url(target)).send().await.unwrap();
    let status = r.status().as_u16();
    let cs = cache_status(&r);
    (status, cs, r.text().await.unwrap())
}

#[tokio::test]
async fn a_hit_never_reaches_the_upstream_and_max_age_ends_it() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        let t = "/c/a?cc=max-age%3D60";
        let (status, cs, body) = get(&c, &s, t).await;
        assert_eq!(status, 200, "{proto}");
        assert!(
            cs.contains("fwd=miss") && cs.contains("stored"),
            "{proto}: {cs}"
        );
        let r = c.get(s.gw.url(t)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            cache_status(&r).starts_with("tollgate; hit"),
            "{proto}: {r:?}"
        );
        assert_eq!(r.headers()["age"], "0");
        assert_eq!(r.text().await.unwrap(), body, "{proto}: the stored body");
        assert_eq!(
            s.up.count(t),
            1,
            "{proto}: a hit never reaches the upstream"
        );
        // 30 s later: still fresh, 30 s old.
        s.advance(30).await;
        let r = c.get(s.gw.url(t)).send().await.unwrap();
        assert_eq!(r.headers()["age"], "30", "{proto}");
        assert_eq!(s.up.count(t), 1);
        // Past max-age: fetched again.
        s.advance(31).await;
        let (_, cs, body2) = get(&c, &s, t).await;
        assert!(cs.contains("fwd=stale"), "{proto}: {cs}");
        assert_ne!(body2, body);
        assert_eq!(s.up.count(t), 2, "{proto}");
        // HEAD is answered from the stored GET.
        let r = c.head(s.gw.url(t)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(cache_status(&r).starts_with("tollgate; hit"), "{proto}");
        assert_eq!(s.up.count(t), 2, "{proto}: HEAD from the stored GET");
        // The metrics count hits and misses by route.
        let m = s.gw.metrics().await;
        let hits = metric(
            &m,
            r#"tollgate_cache_requests_total{route="c",status="hit"}"#,
        );
        assert_eq!(hits, Some(3.0), "{proto}: {m}");
        assert!(metric(&m, "tollgate_cache_stored_entries").unwrap_or(0.0) >= 1.0);
    }
}

#[tokio::test]
async fn what_a_shared_cache_must_not_store_is_not_stored() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        for t in [
            "/c/ns?cc=no-store%2C%20max-age%3D60",
            "/c/p?cc=private%2C%20max-age%3D60",
            "/c/k?cc=max-age%3D60&cookie=1",
            "/c/none",
            "/c/err?status=500&lm=1",
        ] {
            get(&c, &s, t).await;
            get(&c, &s, t).await;
            assert_eq!(s.up.count(t), 2, "{proto}: {t} was stored");
        }
        // Authorization: not stored unless the response allows a shared cache (§3.5).
        let t = "/c/auth?cc=max-age%3D60";
        for _ in 0..2 {
            c.get(s.gw.url(t))
                .header("authorization", "Bearer x")
                .send()
                .await
                .unwrap();
        }
        assert_eq!(s.up.count(t), 2, "{proto}");
        let t = "/c/auth?cc=public%2C%20max-age%3D60";
        for _ in 0..2 {
            c.get(s.gw.url(t))
                .header("authorization", "Bearer x")
                .send()
                .await
                .unwrap();
        }
        assert_eq!(s.up.count(t), 1, "{proto}: public allows it");
        // The request's no-store: not stored; its no-cache: revalidated.
        let t = "/c/req?cc=max-age%3D60";
        c.get(s.gw.url(t))
            .header("cache-control", "no-store")
            .send()
            .await
            .unwrap();
        get(&c, &s, t).await;
        assert_eq!(s.up.count(t), 2, "{proto}");
        get(&c, &s, t).await;
        assert_eq!(s.up.count(t), 2, "{proto}");
        c.get(s.gw.url(t))
            .header("cache-control", "no-cache")
            .send()
            .await
            .unwrap();
        assert_eq!(s.up.count(t), 3, "{proto}");
        // only-if-cached with nothing stored: 504, never upstream.
        let r = c
            .get(s.gw.url("/c/never?cc=max-age%3D60"))
            .header("cache-control", "only-if-cached")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 504, "{proto}");
        assert_eq!(s.up.count("/c/never?cc=max-age%3D60"), 0);
    }
}

#[tokio::test]
async fn vary_keeps_one_callers_variant_from_another() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        let t = "/c/v?cc=max-age%3D60&vary=accept-language";
        let ask = |lang: &'static str| {
            let c = c.clone();
            let url = s.gw.url(t);
            async move {
                let r = c
                    .get(url)
                    .header("accept-language", lang)
                    .send()
                    .await
                    .unwrap();
                cache_status(&r)
            }
        };
        ask("fr").await;
        assert!(ask("fr").await.contains("hit"), "{proto}");
        assert!(!ask("de").await.contains("hit"), "{proto}: another variant");
        assert_eq!(s.up.count(t), 2);
        // Vary: * never matches.
        let t = "/c/star?cc=max-age%3D60&vary=*";
        get(&c, &s, t).await;
        get(&c, &s, t).await;
        assert_eq!(s.up.count(t), 2, "{proto}");
        // Any field, two of them; a request without one is another variant.
        let t = "/c/new?cc=max-age%3D60&vary=x-tenant%2C%20x-b";
        for _ in 0..3 {
            c.get(s.gw.url(t))
                .header("x-tenant", "a")
                .header("x-b", "1")
                .send()
                .await
                .unwrap();
        }
        assert_eq!(s.up.count(t), 1, "{proto}");
        let r = c
            .get(s.gw.url(t))
            .header("x-tenant", "a")
            .send()
            .await
            .unwrap();
        assert!(!cache_status(&r).contains("hit"), "{proto}");
        let r = c
            .get(s.gw.url(t))
            .header("x-tenant", "b")
            .send()
            .await
            .unwrap();
        assert!(!cache_status(&r).contains("hit"), "{proto}");
    }
}

#[tokio::test]
async fn a_stale_response_is_revalidated_with_its_etag_and_a_304_freshens_it() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        let t = "/c/e?cc=max-age%3D10&etag=v1";
        let (_, _, body) = get(&c, &s, t).await;
        assert!(s.up.last(t).get("if-none-match").is_none());
        s.advance(11).await;
        let (status, cs, again) = get(&c, &s, t).await;
        assert_eq!(status, 200, "{proto}");
        assert_eq!(again, body, "{proto}: the stored body, revalidated");
        assert!(
            cs.contains("fwd=stale") && cs.contains("fwd-status=304"),
            "{proto}: {cs}"
        );
        assert_eq!(s.up.last(t)["if-none-match"], "\"v1\"");
        assert_eq!(s.up.count(t), 2);
        // Freshened: a hit again.
        let (_, cs, _) = get(&c, &s, t).await;
        assert!(cs.starts_with("tollgate; hit"), "{proto}: {cs}");
        assert_eq!(s.up.count(t), 2);
        // The client's own condition is answered from the store.
        let r = c
            .get(s.gw.url(t))
            .header("if-none-match", "\"v1\"")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 304, "{proto}");
        assert_eq!(s.up.count(t), 2);
        let m = s.gw.metrics().await;
        let n = metric(
            &m,
            r#"tollgate_cache_requests_total{route="c",status="revalidated"}"#,
        );
        assert_eq!(n, Some(1.0), "{proto}");
    }
}

#[tokio::test]
async fn an_unsafe_method_invalidates_and_purge_removes() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        let t = "/c/i?cc=max-age%3D60";
        get(&c, &s, t).await;
        get(&c, &s, t).await;
        assert_eq!(s.up.count(t), 1);
        let r = c.post(s.gw.url(t)).body("x").send().await.unwrap();
        assert_eq!(r.status(), 200);
        get(&c, &s, t).await;
        assert_eq!(s.up.count(t), 3, "{proto}: POST invalidated the URL");
        // Purge by prefix, then by key.
        let purge = |body: &'static str| {
            let c = support::client();
            let url = s.gw.admin_url("/-/cache/purge");
            async move {
                let r = c.post(url).body(body).send().await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
        assert_eq!(
            purge(r#"{"prefix":"/c/i"}"#).await,
            (200, r#"{"purged":1}"#.to_owned())
        );
        get(&c, &s, t).await;
        assert_eq!(s.up.count(t), 4, "{proto}: purged");
        // The key is the URL the gateway was asked for (over HTTP/3, `https`).
        let key = format!(
            r#"{{"key":"{}://{}{t}"}}"#,
            support::over_h3::scheme(),
            s.gw.proxy
        );
        let key: &'static str = Box::leak(key.into_boxed_str());
        assert_eq!(
            purge(key).await,
            (200, r#"{"purged":1}"#.to_owned()),
            "{proto}"
        );
        assert_eq!(purge("{}").await.0, 400);
    }
}

/// Purge by tag (#54 §5): every stored response whose `Cache-Tag` listed the tag goes, the
/// others stay.
#[tokio::test]
async fn purge_by_tag_removes_every_tagged_response() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        let a1 = "/c/t1?cc=max-age%3D60&tag=a";
        let a2 = "/c/t2?cc=max-age%3D60&tag=x%2C%20a";
        let b = "/c/t3?cc=max-age%3D60&tag=b";
        for t in [a1, a2, b] {
            get(&c, &s, t).await;
            let (_, status, _) = get(&c, &s, t).await;
            assert!(status.starts_with("tollgate; hit"), "{proto} {t}: {status}");
            assert_eq!(s.up.count(t), 1, "{proto} {t}");
        }
        let r = support::client()
            .post(s.gw.admin_url("/-/cache/purge"))
            .body(r#"{"tag":"a"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), r#"{"purged":2}"#, "{proto}");
        for t in [a1, a2] {
            let (_, status, _) = get(&c, &s, t).await;
            assert!(status.contains("fwd=miss"), "{proto} {t}: {status}");
            assert_eq!(s.up.count(t), 2, "{proto} {t}: purged");
        }
        let (_, status, _) = get(&c, &s, b).await;
        assert!(status.starts_with("tollgate; hit"), "{proto}: {status}");
        assert_eq!(s.up.count(b), 1, "{proto}: `b` stays");
    }
}

#[tokio::test]
async fn concurrent_misses_make_one_upstream_request() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        let t = "/c/slow?cc=max-age%3D60&delay=300";
        let tasks: Vec<_> = (0..5)
            .map(|_| {
                let c = c.clone();
                let url = s.gw.url(t);
                tokio::spawn(async move {
                    let r = c.get(url).send().await.unwrap();
                    (r.status().as_u16(), r.text().await.unwrap())
                })
            })
            .collect();
        let mut bodies = Vec::new();
        for task in tasks {
            let (status, body) = task.await.unwrap();
            assert_eq!(status, 200);
            bodies.push(body);
        }
        assert_eq!(s.up.count(t), 1, "{proto}: collapsed");
        assert!(bodies.iter().all(|b| *b == bodies[0]), "{proto}");
        let m = s.gw.metrics().await;
        let n = metric(
            &m,
            r#"tollgate_cache_requests_total{route="c",status="collapsed"}"#,
        );
        assert_eq!(n, Some(4.0), "{proto}: {m}");
    }
}

#[tokio::test]
async fn a_body_larger_than_max_object_size_is_served_whole_but_not_stored() {
    for (proto, c) in clients() {
        let s = Setup::new("max_object_size = \"4k\"", "").await;
        let t = "/c/big?cc=max-age%3D60&size=5000";
        for _ in 0..2 {
            let (status, _, body) = get(&c, &s, t).await;
            assert_eq!((status, body.len()), (200, 5000), "{proto}");
        }
        assert_eq!(s.up.count(t), 2, "{proto}");
        let t = "/c/small?cc=max-age%3D60&size=4000";
        for _ in 0..2 {
            let (_, _, body) = get(&c, &s, t).await;
            assert_eq!(body.len(), 4000);
        }
        assert_eq!(s.up.count(t), 1, "{proto}");
    }
}

#[tokio::test]
async fn hits_are_charged_like_any_request() {
    for ((proto, c), kind) in clients()
        .into_iter()
        .flat_map(|pc| [(pc.clone(), Kind::Memory), (pc, Kind::Redis)])
    {
        let limits = "[[routes.limits]]\nname = \"two\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"global\"\n";
        let s = Setup::on(Some(store_env(kind)), "", limits).await;
        let t = "/c/q?cc=max-age%3D60";
        let (a, _, _) = get(&c, &s, t).await;
        let (b, cs, _) = get(&c, &s, t).await;
        assert_eq!((a, b), (200, 200), "{proto}");
        assert!(cs.contains("hit"));
        let (third, cs, _) = get(&c, &s, t).await;
        assert_eq!(third, 429, "{proto} on {kind:?}: a hit is charged");
        assert!(
            cs.is_empty(),
            "{proto}: a refusal is the gateway's own, never stored"
        );
        assert_eq!(s.up.count(t), 1);
    }
}

#[tokio::test]
async fn explicit_lifetimes_store_any_status_and_stale_if_error_answers_a_failure() {
    for (proto, c) in clients() {
        let s = Setup::new("", "").await;
        // A 500 with max-age: stored (an explicit lifetime; statuses lists the heuristic ones).
        let t = "/c/e500?cc=max-age%3D60&status=500";
        get(&c, &s, t).await;
        let (status, cs, _) = get(&c, &s, t).await;
        assert_eq!(status, 500);
        assert!(cs.starts_with("tollgate; hit"), "{proto}: {cs}");
        assert_eq!(s.up.count(t), 1, "{proto}");
        // stale-if-error: the upstream fails once it is stale; the stored response answers.
        let t = "/c/sie?cc=max-age%3D10%2C%20stale-if-error%3D60&fail=1";
        let (_, _, body) = get(&c, &s, t).await;
        s.advance(11).await;
        let (status, cs, stale) = get(&c, &s, t).await;
        assert_eq!((status, stale), (200, body), "{proto}: {cs}");
        assert!(cs.contains("fwd=stale"), "{proto}: {cs}");
        assert_eq!(s.up.count(t), 2);
        // Past its window: the failure is relayed.
        s.advance(60).await;
        let (status, _, _) = get(&c, &s, t).await;
        assert_eq!(status, 503, "{proto}");
    }
}

#[tokio::test]
async fn the_access_log_records_what_the_cache_did() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let s = Setup::new(
        "",
        &format!("[log]\naccess = {:?}\n", log.display().to_string()),
    )
    .await;
    let c = support::client();
    let t = "/c/log?cc=max-age%3D60";
    get(&c, &s, t).await;
    get(&c, &s, t).await;
    let mut lines = Vec::new();
    for _ in 0..100 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        lines = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect();
        if lines.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["cache"], "miss");
    assert_eq!(lines[1]["cache"], "hit");
    assert_eq!(lines[1]["status"], 200);
}

#[tokio::test]
async fn a_hit_is_charged_by_the_limits_charged_after_the_response() {
    for ((proto, c), kind) in clients()
        .into_iter()
        .flat_map(|pc| [(pc.clone(), Kind::Memory), (pc, Kind::Redis)])
    {
        // Two 200s an hour: counted after the response (`count_status`).
        let limits = "[[routes.limits]]\nname = \"ok\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"global\"\ncount_status = [200]\n";
        let s = Setup::on(Some(store_env(kind)), "", limits).await;
        let t = "/c/after?cc=max-age%3D60";
        let (a, _, _) = get(&c, &s, t).await;
        let (b, cs, _) = get(&c, &s, t).await;
        assert_eq!((a, b), (200, 200), "{proto}");
        assert!(cs.contains("hit"), "{proto}: {cs}");
        let (third, _, _) = get(&c, &s, t).await;
        assert_eq!(third, 429, "{proto} on {kind:?}: the hit's 200 was counted");
        assert_eq!(s.up.count(t), 1);
    }
}

/// A gateway with a disk tier in `dir`, its proxy on `port` (the same across a restart: the
/// key holds the host the client names), in front of `up`, on the clock at `now` (seconds).
fn disk_gateway(up: &Scripted, dir: &std::path::Path, port: u16, cache: &str, now: u64) -> Gateway {
    let routes = route(
        "c",
        "/c",
        &format!("http://{}", up.addr),
        "[routes.cache]\n",
    );
    let text = config("backend = \"memory\"", &routes).replacen(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
        1,
    );
    let text = format!(
        "[cache]\ndisk_path = {:?}\n{cache}\n\n{text}",
        dir.display().to_string()
    );
    gateway_on_clock(&text, now * 1_000_000)
}

/// The entry files of a disk tier's directory (32 hex digits), and every file's bytes.
fn disk_files(dir: &std::path::Path) -> (Vec<String>, u64) {
    let mut names = Vec::new();
    let mut bytes = 0;
    for f in std::fs::read_dir(dir).unwrap().flatten() {
        bytes += f.metadata().map(|m| m.len()).unwrap_or(0);
        let name = f.file_name().into_string().unwrap();
        if name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            names.push(name);
        }
    }
    names.sort();
    (names, bytes)
}

/// Waits (5 s at most) until `ok` holds of the directory's entry files.
async fn wait_disk(dir: &std::path::Path, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
    for _ in 0..250 {
        let (names, _) = disk_files(dir);
        if ok(&names) {
            return names;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the disk tier's directory never got there: {:?}",
        disk_files(dir)
    );
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A fresh client of `proto` (a restarted gateway on the same port: no pooled connection).
fn client_of(proto: &str) -> reqwest::Client {
    clients().into_iter().find(|(p, _)| *p == proto).unwrap().1
}

async fn get_on(c: &reqwest::Client, gw: &Gateway, target: &str) -> (u16, String, String) {
    let r = c.get(gw.url(target)).send().await.unwrap();
    let status = r.status().as_u16();
    let cs = cache_status(&r);
    (status, cs, r.text().await.unwrap())
}

async fn purge_on(gw: &Gateway, body: &str) -> (u16, String) {
    let r = support::client()
        .post(gw.admin_url("/-/cache/purge"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The disk tier (#54 §2): a stored response is kept across a restart and served from disk
/// without the upstream; a purge removes its file.
#[tokio::test]
async fn a_response_on_disk_is_served_after_a_restart_and_purge_removes_its_file() {
    for proto in ["http1", "h2"] {
        let now = now_secs();
        let up = scripted(now).await;
        let dir = tempfile::tempdir().unwrap();
        let port = support::free_port();
        let t = "/c/r?cc=max-age%3D600";
        let gw = disk_gateway(&up, dir.path(), port, "", now);
        let c = client_of(proto);
        let (status, cs, body) = get_on(&c, &gw, t).await;
        assert_eq!(status, 200, "{proto}");
        assert!(cs.contains("stored"), "{proto}: {cs}");
        let files = wait_disk(dir.path(), |f| f.len() == 1).await;
        drop(gw);
        drop(c);

        let gw = disk_gateway(&up, dir.path(), port, "", now);
        let c = client_of(proto);
        let (status, cs, again) = get_on(&c, &gw, t).await;
        assert_eq!(status, 200, "{proto}");
        assert!(
            cs.starts_with("tollgate; hit") && cs.contains("detail=disk"),
            "{proto}: served from disk after the restart: {cs}"
        );
        assert_eq!(again, body, "{proto}: the stored body");
        assert_eq!(up.count(t), 1, "{proto}: the upstream was not asked again");
        // Promoted: the next hit is the memory tier's.
        let (_, cs, _) = get_on(&c, &gw, t).await;
        assert!(
            cs.starts_with("tollgate; hit") && !cs.contains("disk"),
            "{proto}: {cs}"
        );
        let m = gw.metrics().await;
        assert_eq!(
            metric(&m, "tollgate_cache_disk_stored_entries"),
            Some(1.0),
            "{proto}"
        );
        assert_eq!(
            metric(&m, r#"tollgate_cache_disk_reads_total{result="hit"}"#),
            Some(1.0),
            "{proto}: {m}"
        );

        // In both tiers, purged once; its file goes.
        assert_eq!(
            purge_on(&gw, r#"{"prefix":"/c/r"}"#).await,
            (200, r#"{"purged":1}"#.to_owned())
        );
        wait_disk(dir.path(), |f| !f.contains(&files[0])).await;
        drop(gw);
        drop(c);
        let gw = disk_gateway(&up, dir.path(), port, "", now);
        let c = client_of(proto);
        let (_, cs, _) = get_on(&c, &gw, t).await;
        assert!(cs.contains("fwd=miss"), "{proto}: purged for good: {cs}");
        assert_eq!(up.count(t), 2, "{proto}");
        // Purged by tag, from disk alone (a restart empties the memory tier).
        let tagged = "/c/tag?cc=max-age%3D600&tag=x";
        get_on(&c, &gw, tagged).await;
        wait_disk(dir.path(), |f| f.len() == 2).await;
        drop(gw);
        drop(c);
        let gw = disk_gateway(&up, dir.path(), port, "", now);
        assert_eq!(
            purge_on(&gw, r#"{"tag":"x"}"#).await,
            (200, r#"{"purged":1}"#.to_owned()),
            "{proto}"
        );
        wait_disk(dir.path(), |f| f.len() == 1).await;
    }
}

/// The disk tier stays within `disk_max_bytes` under a load that writes ten times as much,
/// and what the memory tier cannot hold (evicted, or larger than its share) hits from disk.
#[tokio::test]
async fn the_disk_tier_stays_within_its_bytes_and_serves_what_memory_cannot_hold() {
    const MAX: u64 = 512 << 10;
    let cache = "disk_max_bytes = \"512k\"\nmax_bytes = \"64k\"\nmax_object_size = \"200k\"";
    for proto in ["http1", "h2"] {
        let now = now_secs();
        let up = scripted(now).await;
        let dir = tempfile::tempdir().unwrap();
        let gw = disk_gateway(&up, dir.path(), support::free_port(), cache, now);
        let c = client_of(proto);
        // Ten times the bound, 20 kB at a time.
        let n = (10 * MAX / 20_000) as usize;
        for i in 0..n {
            let (status, _, body) =
                get_on(&c, &gw, &format!("/c/l{i}?cc=max-age%3D600&size=20000")).await;
            assert_eq!((status, body.len()), (200, 20_000), "{proto}");
            if i % 25 == 0 {
                let (files, bytes) = disk_files(dir.path());
                assert!(
                    bytes <= MAX,
                    "{proto}: {bytes} bytes in {} files",
                    files.len()
                );
            }
        }
        // The writer done: the last one is on disk.
        let last = n - 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (files, bytes) = disk_files(dir.path());
        assert!(
            bytes <= MAX,
            "{proto}: {bytes} bytes in {} files",
            files.len()
        );
        assert!(files.len() >= 15, "{proto}: {} files", files.len());
        let m = gw.metrics().await;
        let counted = metric(&m, "tollgate_cache_disk_stored_bytes").unwrap();
        assert!(
            counted <= MAX as f64 && counted >= bytes as f64,
            "{proto}: {m}"
        );
        assert!(metric(&m, "tollgate_cache_stored_bytes").unwrap() <= (64 << 10) as f64);
        // Evicted from memory (64k hold three), still on disk.
        let t = format!("/c/l{}?cc=max-age%3D600&size=20000", last - 8);
        let (_, cs, _) = get_on(&c, &gw, &t).await;
        assert!(cs.starts_with("tollgate; hit"), "{proto}: {cs}");
        assert_eq!(up.count(&t), 1, "{proto}");
        // Larger than the memory tier: on disk alone, a hit from there.
        let big = "/c/big?cc=max-age%3D600&size=150000";
        get_on(&c, &gw, big).await;
        let mut served = String::new();
        for _ in 0..50 {
            let (_, cs, body) = get_on(&c, &gw, big).await;
            assert_eq!(body.len(), 150_000);
            served = cs;
            if served.contains("detail=disk") {
                break;
            }
            // Not written yet: a miss again, which writes it again.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(served.contains("detail=disk"), "{proto}: {served}");
        let (_, bytes) = disk_files(dir.path());
        assert!(bytes <= MAX, "{proto}: {bytes}");
    }
}

/// Damaged files in the directory (cut short, a flipped byte, junk, a temporary file a crash
/// left) are ignored and removed at start or when read; the gateway serves on.
#[tokio::test]
async fn damaged_files_on_disk_are_ignored_and_removed() {
    for proto in ["http1", "h2"] {
        let now = now_secs();
        let up = scripted(now).await;
        let dir = tempfile::tempdir().unwrap();
        let port = support::free_port();
        let (a, b) = ("/c/da?cc=max-age%3D600", "/c/db?cc=max-age%3D600");
        let gw = disk_gateway(&up, dir.path(), port, "", now);
        let c = client_of(proto);
        get_on(&c, &gw, a).await;
        let fa = wait_disk(dir.path(), |f| f.len() == 1).await[0].clone();
        get_on(&c, &gw, b).await;
        let fb = wait_disk(dir.path(), |f| f.len() == 2)
            .await
            .into_iter()
            .find(|f| *f != fa)
            .unwrap();
        drop(gw);
        drop(c);
        // `a` cut short, a byte of `b`'s body flipped, junk and a temporary file.
        let pa = dir.path().join(&fa);
        let bytes = std::fs::read(&pa).unwrap();
        std::fs::write(&pa, &bytes[..bytes.len() - 10]).unwrap();
        let pb = dir.path().join(&fb);
        let mut bytes = std::fs::read(&pb).unwrap();
        let at = bytes.len() - 8;
        bytes[at] ^= 0x20;
        std::fs::write(&pb, bytes).unwrap();
        let junk = dir.path().join("00112233445566778899aabbccddeeff");
        std::fs::write(&junk, b"not a stored response").unwrap();
        let temp = dir.path().join(format!("{fa}.9.tmp"));
        std::fs::write(&temp, b"half").unwrap();

        let gw = disk_gateway(&up, dir.path(), port, "", now);
        let c = client_of(proto);
        for _ in 0..250 {
            if !junk.exists() && !temp.exists() && !pa.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !junk.exists() && !temp.exists() && !pa.exists(),
            "{proto}: removed at start"
        );
        for t in [a, b] {
            let (status, cs, body) = get_on(&c, &gw, t).await;
            assert_eq!(status, 200, "{proto}");
            assert!(
                cs.contains("fwd=miss"),
                "{proto} {t}: not served damaged: {cs}"
            );
            assert!(body.ends_with("#2"), "{proto}: {body}");
            assert_eq!(up.count(t), 2, "{proto} {t}");
        }
        let m = gw.metrics().await;
        assert_eq!(
            metric(&m, r#"tollgate_cache_disk_reads_total{result="corrupt"}"#),
            Some(1.0),
            "{proto}: {m}"
        );
        // Both stored again, and served.
        wait_disk(dir.path(), |f| f.len() == 2).await;
        let (_, cs, _) = get_on(&c, &gw, b).await;
        assert!(cs.starts_with("tollgate; hit"), "{proto}: {cs}");
    }
}

/// `GET /-/explain` on a caching route (#54 §5): whether the request would be a hit, read
/// without changing anything (no fill, no promotion from disk).
#[tokio::test]
async fn explain_says_whether_a_request_would_be_a_hit() {
    let now = now_secs();
    let up = scripted(now).await;
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let gw = disk_gateway(&up, dir.path(), port, "", now);
    let t = "/c/e?cc=max-age%3D60";
    let explain = |gw: &Gateway, extra: &str| {
        let url = gw.admin_url(&format!(
            "/-/explain?path=/c/e&query.cc=max-age%3D60&host=127.0.0.1:{port}{extra}"
        ));
        async move {
            let r = support::client().get(url).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let v: serde_json::Value = r.json().await.unwrap();
            v["cache"].clone()
        }
    };
    let c = explain(&gw, "").await;
    assert_eq!(c["enabled"], true, "{c}");
    assert_eq!(c["status"], "miss", "{c}");
    assert_eq!(
        c["key"],
        format!(
            "{}://127.0.0.1:{port}/c/e?cc=max-age%3D60",
            support::over_h3::scheme()
        ),
        "{c}"
    );
    // Asking fetched nothing and stored nothing.
    assert_eq!(up.count(t), 0);
    let (_, cs, _) = get_on(&support::client(), &gw, t).await;
    assert!(cs.contains("fwd=miss"), "{cs}");
    gw.advance(Duration::from_secs(20)).await;
    let c = explain(&gw, "").await;
    assert_eq!(
        (&c["status"], &c["age"], &c["ttl"], &c["tier"]),
        (&"hit".into(), &20.into(), &40.into(), &"memory".into()),
        "{c}"
    );
    // Another scheme is another key; a request's no-cache revalidates.
    // (Over HTTP/3 the gateway listens with TLS: its requests are `https`.)
    let other = if support::over_h3::scheme() == "https" {
        "http"
    } else {
        "https"
    };
    assert_eq!(
        explain(&gw, &format!("&scheme={other}")).await["status"],
        "miss"
    );
    let c = explain(&gw, "&header.Cache-Control=no-cache").await;
    assert_eq!(
        (&c["status"], &c["revalidate"]),
        (&"stale".into(), &true.into()),
        "{c}"
    );
    // A POST is not looked up.
    assert_eq!(explain(&gw, "&method=POST").await["status"], "bypass");
    gw.advance(Duration::from_secs(41)).await;
    assert_eq!(explain(&gw, "").await["status"], "stale");
    assert_eq!(up.count(t), 1, "explain never reaches the upstream");

    // After a restart: on disk alone; explaining does not promote it.
    wait_disk(dir.path(), |f| f.len() == 1).await;
    drop(gw);
    let gw = disk_gateway(&up, dir.path(), port, "", now);
    gw.advance(Duration::from_secs(10)).await;
    let c = explain(&gw, "").await;
    assert_eq!(
        (&c["status"], &c["tier"]),
        (&"hit".into(), &"disk".into()),
        "{c}"
    );
    let c = explain(&gw, "").await;
    assert_eq!(c["tier"], "disk", "not promoted to memory: {c}");
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, r#"tollgate_cache_disk_reads_total{result="hit"}"#),
        None,
        "explain counts no read: {m}"
    );
    let (_, cs, _) = get_on(&support::client(), &gw, t).await;
    assert!(cs.contains("detail=disk"), "{cs}");
}
