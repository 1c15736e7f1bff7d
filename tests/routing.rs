//! Routing II end to end: exact, template, regex and prefix paths, exact and wildcard hosts,
//! header and query matchers and `priority`, through the real gateway on HTTP/1.1 (the front
//! `TOLLGATE_TEST_HTTP1` picks) and HTTP/2 (h2c); captures as subject parts and header-rule
//! variables; `explain`'s candidates; `check`'s shadowing warning.

mod support;

use std::net::SocketAddr;
use std::process::Command;

use support::*;

/// A client that sends every name of `hosts` to the gateway at `addr` (so `Host` and
/// `:authority` are those names), in HTTP/1.1 or HTTP/2 with prior knowledge.
fn client_for(addr: SocketAddr, hosts: &[&str], h2: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder().no_proxy();
    for h in hosts {
        b = b.resolve(h, addr);
    }
    if h2 {
        b = b.http2_prior_knowledge();
    }
    b.build().unwrap()
}

/// A request (URL, headers) and the route that must take it.
type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);

const HOSTS: &[&str] = &[
    "acme.api.test",
    "globex.api.test",
    "a.b.api.test",
    "api.test",
    "www.example.test",
];

/// The routes every scenario below runs on; each answers with `x-route` naming itself.
fn routes(up: &str, store_limits: bool) -> String {
    let tag = "[routes.response_headers]\nset = { \"x-route\" = \"$route\" }\n";
    let lim = |body: &str| {
        if store_limits {
            limit(body)
        } else {
            String::new()
        }
    };
    format!(
        "[[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstream = \"{up}\"\n{tag}\n\
         [[routes]]\nname = \"login\"\npath = \"/login\"\nupstream = \"{up}\"\n{tag}\n{}\n\
         [[routes]]\nname = \"users\"\npath_template = \"/users/{{id}}/orders/{{rest...}}\"\nupstream = \"{up}\"\n\
         [routes.response_headers]\nset = {{ \"x-route\" = \"$route\", \"x-user\" = \"${{path.id}}\" }}\n{}\n\
         [[routes]]\nname = \"versioned\"\npath_regex = \"/v[0-9]+/.*\"\nupstream = \"{up}\"\n{tag}\n\
         [[routes]]\nname = \"tenant\"\nhost = \"{{tenant}}.api.test\"\nupstream = \"{up}\"\n\
         [routes.response_headers]\nset = {{ \"x-route\" = \"$route\", \"x-tenant\" = \"${{host.tenant}}\" }}\n{}\n\
         [[routes]]\nname = \"deep\"\nhost = \"*.api.test\"\nupstream = \"{up}\"\n{tag}\n\
         [[routes]]\nname = \"v2\"\npath_prefix = \"/svc\"\nupstream = \"{up}\"\n{tag}\n\
         [[routes.headers]]\nname = \"x-version\"\nvalue = \"2\"\n\
         [[routes]]\nname = \"debug\"\npath_prefix = \"/svc\"\nupstream = \"{up}\"\n{tag}\n\
         [[routes.query]]\nname = \"debug\"\npresent = true\n\
         [[routes]]\nname = \"pinned\"\npath_prefix = \"/pinned\"\npriority = 5\nupstream = \"{up}\"\n{tag}\n\
         [[routes]]\nname = \"pinned-exact\"\npath = \"/pinned/x\"\nupstream = \"{up}\"\n{tag}\n",
        lim("name = \"tight\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1h\"\nsubject = \"ip\""),
        lim("name = \"per-user\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"path:id\""),
        lim("name = \"per-tenant\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"host:tenant\""),
    )
}

async fn route_of(c: &reqwest::Client, url: String, headers: &[(&str, &str)]) -> (u16, String) {
    let mut rq = c.get(url);
    for (k, v) in headers {
        rq = rq.header(*k, *v);
    }
    let res = rq.send().await.unwrap();
    let name = res
        .headers()
        .get("x-route")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (res.status().as_u16(), name)
}

/// Every matcher picks its route, on HTTP/1.1 and on HTTP/2.
#[tokio::test(flavor = "multi_thread")]
async fn each_matcher_routes_on_http1_and_http2() {
    let up = upstream().await;
    let gw = gateway(&config("backend = \"memory\"", &routes(&up.url(), false)));
    wait_ready(&gw).await;
    let port = gw.http_addr().port();
    for h2 in [false, true] {
        let c = client_for(gw.http_addr(), HOSTS, h2);
        let at = |host: &str, path: &str| format!("http://{host}:{port}{path}");
        let plain = "www.example.test";
        let cases: Vec<Case> = vec![
            (at(plain, "/login"), vec![], "login"),
            (at(plain, "/login/"), vec![], "api"),
            (at(plain, "/login/x"), vec![], "api"),
            (at(plain, "/loginx"), vec![], "api"),
            (at(plain, "/users/7/orders"), vec![], "users"),
            (at(plain, "/users/7/orders/9/items"), vec![], "users"),
            (at(plain, "/users//orders"), vec![], "api"),
            (at(plain, "/users/7"), vec![], "api"),
            (at(plain, "/v2/things"), vec![], "versioned"),
            (at(plain, "/vx/things"), vec![], "api"),
            // A percent-encoded spelling is normalised before any matcher reads it.
            (at(plain, "/%6Cogin"), vec![], "login"),
            (at(plain, "/v2/a/../b"), vec![], "versioned"),
            // Hosts: `{tenant}` takes one label, `*` one or more; never the apex.
            (at("acme.api.test", "/login"), vec![], "tenant"),
            (at("a.b.api.test", "/login"), vec![], "deep"),
            (at("api.test", "/x"), vec![], "api"),
            // Headers and query, on the request as received.
            (at(plain, "/svc/x"), vec![("x-version", "2")], "v2"),
            (at(plain, "/svc/x"), vec![("x-version", "3")], "api"),
            (at(plain, "/svc/x?debug"), vec![], "debug"),
            (at(plain, "/svc/x?DEBUG=1"), vec![], "debug"),
            (at(plain, "/svc/x?nodebug=1"), vec![], "api"),
            // Two matching routes of one rank: the one with more header matchers… here
            // `v2` (a header) and `debug` (a query): headers first.
            (at(plain, "/svc/x?debug=1"), vec![("x-version", "2")], "v2"),
            // `priority` over an exact path.
            (at(plain, "/pinned/x"), vec![], "pinned"),
        ];
        for (url, headers, want) in cases {
            let (status, got) = route_of(&c, url.clone(), &headers).await;
            assert_eq!(
                (status, got.as_str()),
                (200, want),
                "h2={h2} {url} {headers:?}"
            );
        }
        // The captures reach the header rules.
        let res = c.get(at(plain, "/users/42/orders/1")).send().await.unwrap();
        assert_eq!(res.headers()["x-user"], "42", "h2={h2}");
        let res = c.get(at("globex.api.test", "/")).send().await.unwrap();
        assert_eq!(res.headers()["x-tenant"], "globex", "h2={h2}");
    }
}

/// The canonical config: a tight limit on exactly `/login` beside the API; a limit per
/// template capture; a limit per tenant of a `{tenant}` host — on every store, both protocols.
async fn captures_and_exact_paths_are_limited_apart(kind: Kind) {
    let env = store_env(kind);
    let up = upstream().await;
    let gw = gateway(&config(&env.store, &routes(&up.url(), true)));
    wait_ready(&gw).await;
    let port = gw.http_addr().port();
    let at = |host: &str, path: &str| format!("http://{host}:{port}{path}");
    let plain = "www.example.test";
    let c1 = client_for(gw.http_addr(), HOSTS, false);
    let c2 = client_for(gw.http_addr(), HOSTS, true);
    // `/login`: two per client, whatever the protocol; `/login/x` is the API's, unlimited.
    assert_eq!(route_of(&c1, at(plain, "/login"), &[]).await.0, 200);
    assert_eq!(route_of(&c2, at(plain, "/login"), &[]).await.0, 200);
    assert_eq!(route_of(&c1, at(plain, "/login"), &[]).await.0, 429);
    assert_eq!(route_of(&c2, at(plain, "/login"), &[]).await.0, 429);
    for _ in 0..3 {
        assert_eq!(
            route_of(&c1, at(plain, "/login/x"), &[]).await,
            (200, "api".into())
        );
    }
    // One order list per user id.
    assert_eq!(
        route_of(&c1, at(plain, "/users/7/orders"), &[]).await.0,
        200
    );
    assert_eq!(
        route_of(&c2, at(plain, "/users/7/orders/x"), &[]).await.0,
        429
    );
    assert_eq!(
        route_of(&c2, at(plain, "/users/8/orders"), &[]).await.0,
        200
    );
    // One request per tenant, one route for all of them.
    assert_eq!(route_of(&c1, at("acme.api.test", "/a"), &[]).await.0, 200);
    assert_eq!(route_of(&c2, at("acme.api.test", "/b"), &[]).await.0, 429);
    assert_eq!(route_of(&c2, at("globex.api.test", "/a"), &[]).await.0, 200);
    assert_eq!(route_of(&c1, at("globex.api.test", "/a"), &[]).await.0, 429);
}

on_every_store!(captures_and_exact_paths_are_limited_apart);

/// `explain` names the route that took a request and what refused the ones tried before it.
#[tokio::test(flavor = "multi_thread")]
async fn explain_says_which_matcher_refused_each_candidate() {
    let up = upstream().await;
    let gw = gateway(&config("backend = \"memory\"", &routes(&up.url(), false)));
    wait_ready(&gw).await;
    let c = client();
    let ask = |q: &str| c.get(gw.admin_url(&format!("/-/explain?{q}"))).send();
    let v: serde_json::Value = ask("path=/svc/x&header.x-version=3")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["route"], "api", "{v}");
    let cands = v["candidates"].as_array().unwrap();
    let refused = |name: &str| {
        cands
            .iter()
            .find(|c| c["route"] == name)
            .map(|c| c["refused_by"].as_str().unwrap_or("").to_owned())
    };
    assert_eq!(
        refused("v2").as_deref(),
        Some("header x-version = \"2\""),
        "{v}"
    );
    assert!(refused("debug").unwrap().starts_with("query debug"), "{v}");
    assert!(
        refused("login").unwrap().starts_with("path: not = /login"),
        "{v}"
    );
    assert_eq!(cands.last().unwrap()["route"], "api", "{v}");
    assert!(cands.last().unwrap()["refused_by"].is_null(), "{v}");
    let v: serde_json::Value = ask("path=/x&host=globex.api.test")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["route"], "tenant", "{v}");
    assert_eq!(v["candidates"][0]["route"], "pinned", "{v}");
}

/// `tollgate check` names a route that can never match and the route that takes its requests;
/// a wildcard host is no longer accepted and then never matched.
#[test]
fn check_warns_of_a_shadowed_route() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:1\"\n\
         [[routes]]\nname = \"never\"\npath = \"/api/login\"\npriority = -1\nupstream = \"http://127.0.0.1:1\"\n\
         [[routes]]\nname = \"fine\"\npath = \"/login\"\nupstream = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("route \"never\" can never match: route \"api\" takes every request it would"),
        "{err}"
    );
    assert!(!err.contains("\"fine\""), "{err}");
}
