//! A large config: 10,000 routes with a limit each behind one catch-all route. The gateway routes
//! to any of them, and an idle one exports no per-route series (`/metrics` stays small).

mod support;

use support::*;

const ROUTES: usize = 10_000;

fn ten_thousand_routes(upstream: &str) -> String {
    let mut routes = String::with_capacity(ROUTES * 200);
    for i in 0..ROUTES {
        routes += &route(
            &format!("svc{i}"),
            &format!("/svc{i}/api"),
            upstream,
            "strip_prefix = true",
        );
        routes += &limit(
            "name = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 1000\nperiod = \"1s\"\nsubject = \"ip\"",
        );
    }
    routes + &route("default", "/", upstream, "")
}

fn has_route_series(text: &str, route: &str) -> bool {
    let label = format!("route=\"{route}\"");
    text.lines()
        .any(|l| !l.starts_with('#') && l.contains(&label))
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_routes_route_correctly_and_export_series_only_once_used() {
    let up = upstream().await;
    let gw = gateway(&config(
        "backend = \"memory\"",
        &ten_thousand_routes(&up.url()),
    ));
    let c = client();

    let idle = gw.metrics().await;
    assert!(
        idle.len() <= 2_000_000,
        "idle /metrics is {} bytes",
        idle.len()
    );
    for route in ["svc0", "svc9999", "default"] {
        assert!(
            !has_route_series(&idle, route),
            "{route} has series before any request:\n{idle}"
        );
    }

    // A route deep in the table: its prefix is stripped, so the upstream sees `/users/7`.
    let r = c.get(gw.url("/svc9999/api/users/7")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers().contains_key("ratelimit-policy"),
        "svc9999's limit is applied: {:?}",
        r.headers()
    );
    // Not a segment of any prefix: the catch-all forwards the path unchanged, with no limit.
    let r = c.get(gw.url("/svc9999/apix")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.headers().contains_key("ratelimit-policy"));
    assert_eq!(
        c.get(gw.url("/svc12345/api"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let uris: Vec<String> = up.seen().into_iter().map(|s| s.uri).collect();
    assert_eq!(uris, ["/users/7", "/svc9999/apix", "/svc12345/api"]);

    // The used routes now have their series; the others still have none.
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{route=\"svc9999\",status=\"200\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{route=\"default\",status=\"200\"}"
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(decisions(&m, "svc9999", "per-ip", "allowed"), Some(1.0));
    assert_eq!(decisions(&m, "svc9999", "per-ip", "limited"), Some(0.0));
    // The 5xx-ratio alert's sides exist at 0 from the route's first request.
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_upstream_responses_total",
            &["route=\"svc9999\"", "class=\"5xx\""]
        ),
        0.0
    );
    assert!(
        m.contains("tollgate_upstream_errors_total{route=\"svc9999\",kind=\"connect\"} 0"),
        "{m}"
    );
    for idle_route in ["svc0", "svc5000", "svc9998"] {
        assert!(!has_route_series(&m, idle_route), "{idle_route}:\n{m}");
    }
    assert!(m.len() <= 2_000_000);
}
