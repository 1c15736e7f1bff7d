//! Fronting a real API through the real binary (issue 27): header rules on both sides (the
//! gateway's own answers included), CORS on every answer and preflights answered by the
//! gateway, path rewrites, redirect routes and the plain-HTTP redirect listener; and the
//! config errors `tollgate check` gives for them. (CORS in a real browser: `cors_browser.rs`.)

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::*;

on_every_store_and_cluster!(
    header_rules_apply_on_both_sides_and_to_the_gateways_own_429,
    cors_headers_on_every_answer_including_429,
    a_charged_preflight_counts_against_the_limits,
);

on_every_store!(
    preflights_are_answered_by_the_gateway_and_not_charged,
    a_redirect_route_answers_after_its_limits,
);

fn h<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .map_or("", |v| v.to_str().unwrap_or(""))
}

fn per_ip(limit: u64) -> String {
    support::limit(&format!(
        "name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nperiod = \"1h\"\nsubject = \"ip\""
    ))
}

async fn start(kind: Kind, routes: &str) -> (Gateway, StoreEnv) {
    let env = store_env(kind);
    let gw = gateway(&config(&env.store, routes));
    wait_ready(&gw).await;
    (gw, env)
}

/// One request written by hand (what no client library sends), the whole answer read back.
fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Header rules.
// ---------------------------------------------------------------------------------------------

async fn header_rules_apply_on_both_sides_and_to_the_gateways_own_429(kind: Kind) {
    let up = upstream().await;
    let rules = r#"
[routes.request_headers]
remove = ["Cookie"]
set = { "X-Env" = "prod", "X-Client" = "$client_ip", "X-Req" = "id=$request_id", "X-Route" = "${route}", "X-Who" = "$consumer" }
add = { "X-Tag" = "gw" }

[routes.response_headers]
remove = ["X-Upstream"]
set = { "X-Served-By" = "tollgate/$route" }
add = { "Cache-Control" = "no-store" }
"#;
    let quiet = r#"
[routes.response_headers]
own_answers = false
set = { "X-Served-By" = "tollgate/$route" }
"#;
    let routes = route("api", "/api", &up.url(), rules)
        + &per_ip(2)
        + &route("quiet", "/quiet", &up.url(), quiet)
        + &per_ip(1);
    let (gw, _env) = start(kind, &routes).await;
    let c = client();
    for i in 0..2 {
        let res = c
            .get(gw.url("/api/x"))
            .header("cookie", "session=1")
            .header("x-env", "forged")
            .header("x-who", "forged")
            .header("x-tag", "client")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "request {i}");
        assert!(
            res.headers().get("x-upstream").is_none(),
            "removed from the response"
        );
        assert_eq!(h(&res, "x-served-by"), "tollgate/api");
        assert_eq!(h(&res, "cache-control"), "no-store");
        assert!(
            !h(&res, "ratelimit").is_empty(),
            "the gateway's own headers stay"
        );
        let id = h(&res, "x-request-id").to_owned();
        let seen = up.seen().pop().unwrap();
        assert!(seen.headers.get("cookie").is_none());
        assert_eq!(
            seen.headers["x-env"], "prod",
            "set replaces the client's value"
        );
        assert_eq!(seen.headers["x-client"], "127.0.0.1");
        assert_eq!(seen.headers["x-req"], format!("id={id}").as_str());
        assert_eq!(seen.headers["x-route"], "api");
        assert!(
            seen.headers.get("x-who").is_none(),
            "no consumer: an empty value removes the header (the client's too)"
        );
        let tags: Vec<_> = seen.headers.get_all("x-tag").iter().collect();
        assert_eq!(tags, ["client", "gw"], "add appends");
        assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    }
    // The gateway's own 429 gets the response rules too, its own headers untouched.
    let res = c.get(gw.url("/api/x")).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "x-served-by"), "tollgate/api");
    assert_eq!(h(&res, "cache-control"), "no-store");
    assert!(!h(&res, "retry-after").is_empty());
    assert!(!h(&res, "ratelimit").is_empty());
    assert_eq!(h(&res, "content-type"), "application/problem+json");
    assert_eq!(up.hits(), 2);

    // `own_answers = false`: only the upstream's answers.
    let res = c.get(gw.url("/quiet")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "x-served-by"), "tollgate/quiet");
    let res = c.get(gw.url("/quiet")).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("x-served-by").is_none());
}

/// The gateway's own 404 and 502 of a route get its response rules; a request no route
/// matches gets none (there is no route whose rules would apply).
#[tokio::test(flavor = "multi_thread")]
async fn response_rules_on_the_gateways_502_and_not_without_a_route() {
    let rules = "[routes.response_headers]\nset = { \"X-Served-By\" = \"tollgate\" }\n";
    let dead = format!("http://127.0.0.1:{}", free_port());
    let gw = gateway(&config(
        "backend = \"memory\"",
        &route("dead", "/dead", &dead, rules),
    ));
    let c = client();
    let res = c.get(gw.url("/dead/x")).send().await.unwrap();
    assert_eq!(res.status(), 502);
    assert_eq!(h(&res, "x-served-by"), "tollgate");
    let res = c.get(gw.url("/nowhere")).send().await.unwrap();
    assert_eq!(res.status(), 404);
    assert!(res.headers().get("x-served-by").is_none());
}

/// `tollgate check` on a config file; (success, stdout + stderr).
fn check(toml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn check_names_the_key_and_line_of_bad_fronting() {
    let base = "[server]\nlisten = \"127.0.0.1:0\"\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:1\"\n";
    // (extra lines from line 8 on, what the error must say)
    let cases = [
        (
            "[routes.request_headers]\nset = { \"X-A\" = \"a\\r\\nX-Injected: 1\" }",
            &["line 8", "request_headers.set", "line break"][..],
        ),
        (
            "[routes.request_headers]\nset = { \"X-Forwarded-For\" = \"1.2.3.4\" }",
            &["line 8", "X-Forwarded-For", "asserted"],
        ),
        (
            "[routes.response_headers]\nremove = [\"Retry-After\"]",
            &["line 8", "Retry-After", "asserted"],
        ),
        (
            "[routes.response_headers]\nset = { \"RateLimit\" = \"x\" }",
            &["line 8", "RateLimit"],
        ),
        (
            "[routes.request_headers]\nadd = { \"X-Sub\" = \"${jwt.}\" }",
            &["line 8", "$jwt.sub"],
        ),
        (
            "[routes.request_headers]\nadd = { \"X-Sub\" = \"$user\" }",
            &["line 8", "unknown variable", "$client_ip"],
        ),
        (
            "[routes.response_headers]\nset = { \"Content-Length\" = \"1\" }",
            &["line 8", "Content-Length"],
        ),
        (
            "[routes.cors]\nallow_origins = [\"https://a.example/\"]",
            &["line 8", "allow_origins", "path"],
        ),
        (
            "[routes.cors]\nallow_origins = [\"null\"]",
            &["line 8", "opaque"],
        ),
        (
            "[routes.cors]\nallow_origins = [\"*\"]\nallow_credentials = true",
            &["line 8", "cookies"],
        ),
        (
            "[routes.cors]\nallow_origins = [\"*\"]\nmax_age = \"2days\"",
            &["line 8", "max_age"],
        ),
        (
            "[routes.cors]\nallow_origin = [\"*\"]",
            &["line 9", "allow_origin"],
        ),
        (
            "rewrite = { match = \"^/api/(\", to = \"/x\" }",
            &["line 8", "rewrite.match"],
        ),
        (
            "rewrite = { match = \"^/api/(.*)$\", to = \"/v2/../$1\" }",
            &["line 8", "rewrite.to", "normalised"],
        ),
        (
            "rewrite = { match = \"^/api/(.*)$\", to = \"/v2/$2\" }",
            &["line 8", "no group 2"],
        ),
        (
            "redirect = { to = \"https://$host$request_uri\", status = 303 }",
            &["line 8", "303"],
        ),
    ];
    for (extra, want) in cases {
        let (ok, out) = check(&format!("{base}{extra}\n"));
        assert!(!ok, "{extra}: accepted");
        for w in want {
            assert!(out.contains(w), "{extra}: {w:?} not in\n{out}");
        }
    }
    // Rules that span keys name the key path.
    let cases = [
        (
            "[server]\nlisten = \"127.0.0.1:0\"\nrequest_id_header = \"X-Trace\"\n\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:1\"\n[routes.response_headers]\nremove = [\"X-Trace\"]\n",
            &["routes[0].response_headers", "request_id_header"][..],
        ),
        (
            &format!("{base}[routes.cors]\nallow_origins = [\"*\"]\n[routes.response_headers]\nset = {{ \"Access-Control-Allow-Origin\" = \"*\" }}\n"),
            &["routes[0].response_headers", "cors"],
        ),
        (&format!("{base}strip_prefix = true\nrewrite = {{ match = \"^/(.*)$\", to = \"/x/$1\" }}\n"), &["routes[0].rewrite", "strip_prefix"]),
        (&format!("{base}redirect = {{ to = \"/x\" }}\n"), &["routes[0].redirect", "no upstream"]),
        ("[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\n", &["routes[0].upstream"]),
        ("[server]\nhttp_redirect_listen = \"127.0.0.1:0\"\n", &["server.http_redirect_listen", "[server.tls]"]),
    ];
    for (toml, want) in cases {
        let (ok, out) = check(toml);
        assert!(!ok, "{toml}: accepted");
        for w in want {
            assert!(out.contains(w), "{toml}: {w:?} not in\n{out}");
        }
    }
    // Without [routes.cors], a rule may write CORS headers itself (as with nginx's add_header).
    let (ok, out) = check(&format!(
        "{base}[routes.response_headers]\nset = {{ \"Access-Control-Allow-Origin\" = \"*\" }}\n"
    ));
    assert!(ok, "{out}");
}

// ---------------------------------------------------------------------------------------------
// CORS.
// ---------------------------------------------------------------------------------------------

const APP: &str = "https://app.example";

fn cors_route(up: &str, extra: &str) -> String {
    route(
        "api",
        "/api",
        up,
        &format!("methods = [\"GET\", \"PUT\"]\n[routes.cors]\nallow_origins = [\"{APP}\"]\nallow_headers = [\"Content-Type\", \"X-Api-Key\"]\nmax_age = \"10m\"\n{extra}"),
    )
}

async fn cors_headers_on_every_answer_including_429(kind: Kind) {
    let up = upstream().await;
    let routes = cors_route(&up.url(), "allow_credentials = true") + &per_ip(2);
    let (gw, _env) = start(kind, &routes).await;
    let c = client();
    let res = c
        .get(gw.url("/api/x"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "access-control-allow-origin"), APP);
    assert_eq!(h(&res, "access-control-allow-credentials"), "true");
    let expose = h(&res, "access-control-expose-headers").to_owned();
    for name in [
        "RateLimit",
        "RateLimit-Policy",
        "Retry-After",
        "X-Request-Id",
    ] {
        assert!(expose.split(", ").any(|n| n == name), "{name} in {expose}");
    }
    assert!(res.headers().get_all("vary").iter().any(|v| v == "Origin"));
    // Another origin, `null`, two origins in one, odd spellings: no CORS header (the browser
    // keeps the answer from the page); the request itself is still forwarded (CORS is not
    // access control).
    for odd in [
        "https://evil.example",
        "null",
        "https://app.example, https://evil.example",
        "https://app.example/",
        "https://app.example.evil.example",
    ] {
        let res = c
            .get(gw.url("/api/x"))
            .header("origin", odd)
            .send()
            .await
            .unwrap();
        assert!(
            res.headers().get("access-control-allow-origin").is_none(),
            "{odd}"
        );
    }
    // The upper-case spelling of the allowed origin matches (the configured one is echoed).
    let res = c
        .get(gw.url("/api/x"))
        .header("origin", "HTTPS://APP.EXAMPLE")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429, "every request above was charged");
    assert_eq!(h(&res, "access-control-allow-origin"), APP);
    assert!(!h(&res, "retry-after").is_empty());
    assert!(!h(&res, "ratelimit").is_empty());
    assert!(!h(&res, "access-control-expose-headers").is_empty());
}

/// The gateway's own 401, 502 and 400 (a refused path) carry the CORS headers too.
#[tokio::test(flavor = "multi_thread")]
async fn cors_headers_on_the_gateways_401_and_502() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let keyed = support::limit("name = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1m\"\nsubject = \"header:X-Api-Key\"\non_missing = \"reject\"");
    let gw = gateway(&config(
        "backend = \"memory\"",
        &(cors_route(&dead, "") + &keyed),
    ));
    let c = client();
    let res = c
        .get(gw.url("/api/x"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(h(&res, "access-control-allow-origin"), APP);
    let res = c
        .get(gw.url("/api/x"))
        .header("origin", APP)
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 502);
    assert_eq!(h(&res, "access-control-allow-origin"), APP);
}

async fn preflights_are_answered_by_the_gateway_and_not_charged(kind: Kind) {
    let up = upstream().await;
    let routes = cors_route(&up.url(), "") + &per_ip(1);
    let (gw, _env) = start(kind, &routes).await;
    let c = client();
    for _ in 0..5 {
        // The route has `methods = ["GET", "PUT"]`: a preflight is routed by the method it asks about.
        let res = c
            .request(reqwest::Method::OPTIONS, gw.url("/api/x"))
            .header("origin", APP)
            .header("access-control-request-method", "PUT")
            .header("access-control-request-headers", "content-type, x-api-key")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 204);
        assert_eq!(h(&res, "access-control-allow-origin"), APP);
        assert_eq!(h(&res, "access-control-allow-methods"), "GET, PUT");
        assert_eq!(
            h(&res, "access-control-allow-headers"),
            "Content-Type, X-Api-Key"
        );
        assert_eq!(h(&res, "access-control-max-age"), "600");
        assert!(res.headers().get("x-request-id").is_some());
    }
    // A preflight from an origin not allowed: 204 without the allowing headers.
    let res = c
        .request(reqwest::Method::OPTIONS, gw.url("/api/x"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "PUT")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    assert!(res.headers().get("access-control-allow-origin").is_none());
    assert!(res.headers().get("access-control-allow-methods").is_none());
    // Hundreds of requested headers: answered at once, with the configured list.
    let many: Vec<String> = (0..600).map(|i| format!("x-header-{i}")).collect();
    let res = c
        .request(reqwest::Method::OPTIONS, gw.url("/api/x"))
        .header("origin", APP)
        .header("access-control-request-method", "GET")
        .header("access-control-request-headers", many.join(", "))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(
        h(&res, "access-control-allow-headers"),
        "Content-Type, X-Api-Key"
    );
    assert_eq!(up.hits(), 0, "preflights never reach the upstream");
    // None of them was charged: the one request the limit allows is still there.
    let res = c
        .get(gw.url("/api/x"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // An OPTIONS without Access-Control-Request-Method is no preflight: routed as OPTIONS (no
    // route takes it here).
    let res = c
        .request(reqwest::Method::OPTIONS, gw.url("/api/x"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
}

async fn a_charged_preflight_counts_against_the_limits(kind: Kind) {
    let up = upstream().await;
    let routes = cors_route(&up.url(), "charge_preflight = true") + &per_ip(2);
    let (gw, _env) = start(kind, &routes).await;
    let c = client();
    let preflight = || {
        c.request(reqwest::Method::OPTIONS, gw.url("/api/x"))
            .header("origin", APP)
            .header("access-control-request-method", "GET")
            .send()
    };
    assert_eq!(preflight().await.unwrap().status(), 204);
    let res = preflight().await.unwrap();
    assert_eq!(res.status(), 204);
    assert!(
        !h(&res, "ratelimit").is_empty(),
        "a charged preflight says what it cost"
    );
    let res = preflight().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(h(&res, "access-control-allow-origin"), APP);
    let res = c
        .get(gw.url("/api/x"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(up.hits(), 0);
}

// ---------------------------------------------------------------------------------------------
// Rewrites and redirects.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn rewrites_forward_the_rewritten_path_and_never_a_climbing_one() {
    let up = upstream().await;
    let routes = route(
        "v1",
        "/v1",
        &format!("{}/base", up.url()),
        "rewrite = { match = \"^/v1/(?P<rest>.*)$\", to = \"/api/${rest}\" }",
    ) + &per_ip(100)
        + &route(
            "dots",
            "/dots",
            &up.url(),
            "rewrite = { match = \"^/dots/x(.*)$\", to = \"/api/.$1\" }",
        );
    let gw = gateway(&config("backend = \"memory\"", &routes));
    let c = client();
    let res = c.get(gw.url("/v1/users/7?expand=1")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(up.seen().pop().unwrap().uri, "/base/api/users/7?expand=1");
    // Routed (and limited) on the client's path, normalised first: `/v1/a/../b` is `/v1/b`.
    let res = c.get(gw.url("/v1/a/%2e%2e/b")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(up.seen().pop().unwrap().uri, "/base/api/b");
    assert!(
        h(&res, "ratelimit").contains("r=98"),
        "{}",
        h(&res, "ratelimit")
    );
    // No match (`/v1` alone): forwarded as it came.
    let res = c.get(gw.url("/v1")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(up.seen().pop().unwrap().uri, "/base/v1");
    // `/api/.` + `./admin` would be `/api/../admin`: refused, never forwarded.
    let hits = up.hits();
    let res = c.get(gw.url("/dots/x./admin")).send().await.unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(up.hits(), hits);
    let res = c.get(gw.url("/dots/xy")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(up.seen().pop().unwrap().uri, "/api/.y");
    // `%2F` cannot come from a client's path (refused before routing).
    let res = c
        .get(gw.url("/v1/a%2F..%2F..%2Fadmin"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(up.hits(), hits + 1);
}

async fn a_redirect_route_answers_after_its_limits(kind: Kind) {
    let routes = "[[routes]]\nname = \"old\"\npath_prefix = \"/old\"\nredirect = { to = \"https://$host$request_uri\", status = 301 }\n".to_owned()
        + &per_ip(2)
        + "[[routes]]\nname = \"moved\"\npath_prefix = \"/moved\"\nredirect = { to = \"/new$path\" }\n";
    let (gw, _env) = start(kind, &routes).await;
    let c = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = c
        .get(gw.url("/old/a/../b?x=1&y=2"))
        .header("host", "API.Example.com:8080")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 301);
    assert_eq!(h(&res, "location"), "https://api.example.com/old/b?x=1&y=2");
    assert!(!h(&res, "ratelimit").is_empty());
    let res = c.get(gw.url("/moved/x")).send().await.unwrap();
    assert_eq!(res.status(), 308, "the default status keeps the method");
    assert_eq!(h(&res, "location"), "/new/moved/x");
    // HTTP/1.0 without Host: `$host` has no value, so 400 (never a Location without a host);
    // charged like any request of the route. A target without `$host` needs none.
    let res = raw(gw.proxy, "GET /old/z HTTP/1.0\r\n\r\n");
    assert!(res.starts_with("HTTP/1.0 400"), "{res}");
    let res = raw(gw.proxy, "GET /moved/y HTTP/1.0\r\n\r\n");
    assert!(res.starts_with("HTTP/1.0 308"), "{res}");
    let res = c.get(gw.url("/old")).send().await.unwrap();
    assert_eq!(res.status(), 429, "a redirect route's limits apply");
}

#[tokio::test(flavor = "multi_thread")]
async fn http_redirect_listen_sends_every_request_to_the_tls_listener() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let toml = config("backend = \"memory\"", &route("api", "/api", &up.url(), "")).replacen(
        "[admin]",
        &format!(
            "[server.tls]\ncert = {:?}\nkey = {:?}\n\n[admin]",
            cert.display().to_string(),
            key.display().to_string()
        ),
        1,
    );
    let toml = toml.replacen(
        "[server]\n",
        "[server]\nhttp_redirect_listen = \"127.0.0.1:0\"\n",
        1,
    );
    let gw = gateway(&toml);
    let redirect = gw
        .redirect
        .expect("the redirect listener's address on the start line");
    let tls = gw.proxy.port();
    let res = raw(
        redirect,
        "POST /api/x?y=1 HTTP/1.1\r\nHost: API.example.com:80\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(res.starts_with("HTTP/1.1 308"), "{res}");
    assert!(
        res.to_ascii_lowercase().contains(&format!(
            "location: https://api.example.com:{tls}/api/x?y=1\r\n"
        )),
        "{res}"
    );
    assert!(res.to_ascii_lowercase().contains("x-request-id: "), "{res}");
    // Any path, routed or not: the redirect listener routes nothing.
    let res = raw(
        redirect,
        "GET /nowhere HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
    );
    assert!(
        res.contains(&format!("https://a.example:{tls}/nowhere")),
        "{res}"
    );
    // No Host, or a Host with user-info: 400, never a Location elsewhere.
    let res = raw(redirect, "GET / HTTP/1.0\r\n\r\n");
    assert!(res.starts_with("HTTP/1.0 400"), "{res}");
    let res = raw(
        redirect,
        "GET / HTTP/1.1\r\nHost: user@evil.example\r\nConnection: close\r\n\r\n",
    );
    assert!(res.starts_with("HTTP/1.1 400"), "{res}");
    // Issue #34 item 9: the issue's spelling too.
    let res = raw(
        redirect,
        "GET / HTTP/1.1\r\nHost: paid.example:80@free.example\r\nConnection: close\r\n\r\n",
    );
    assert!(res.starts_with("HTTP/1.1 400"), "{res}");
    assert_eq!(up.hits(), 0);
}

/// #34 item 14: a request to the redirect listener with two `Host` fields has no one host to
/// redirect to (RFC 9112 §3.2: 400), as the proxy listener answers it; never a 308 to either.
#[tokio::test(flavor = "multi_thread")]
async fn the_redirect_listener_refuses_a_duplicate_host() {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let toml = config("backend = \"memory\"", &route("api", "/api", &up.url(), "")).replacen(
        "[admin]",
        &format!(
            "[server.tls]\ncert = {:?}\nkey = {:?}\n\n[admin]",
            cert.display().to_string(),
            key.display().to_string()
        ),
        1,
    );
    let toml = toml.replacen(
        "[server]\n",
        "[server]\nhttp_redirect_listen = \"127.0.0.1:0\"\n",
        1,
    );
    let gw = gateway(&toml);
    let redirect = gw.redirect.expect("the redirect listener's address");
    for hosts in [
        "Host: a.example\r\nHost: evil.example\r\n",
        "Host: a.example\r\nHost: a.example\r\n",
    ] {
        let res = raw(
            redirect,
            &format!("GET /x HTTP/1.1\r\n{hosts}Connection: close\r\n\r\n"),
        );
        assert!(res.starts_with("HTTP/1.1 400"), "{hosts:?}: {res}");
        assert!(
            !res.to_ascii_lowercase().contains("location:"),
            "{hosts:?}: {res}"
        );
    }
    // One Host still gets its redirect.
    let res = raw(
        redirect,
        "GET /x HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
    );
    assert!(res.starts_with("HTTP/1.1 308"), "{res}");
}

/// `$consumer` is the consumer's name on a route with `consumers = true`, on both sides; an
/// unknown key's request (`on_unknown` = a plan) has none, and the header is not sent.
#[tokio::test(flavor = "multi_thread")]
async fn the_consumer_variable_names_the_caller() {
    use tollgate::consumers::{hash_key, hex};
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("consumers.toml");
    std::fs::write(
        &file,
        format!(
            "[[consumer]]\nname = \"acme corp\"\nplan = \"free\"\nkey_sha256 = \"{}\"\n",
            hex(&hash_key(b"k-acme"))
        ),
    )
    .unwrap();
    let top = format!(
        "[consumers]\nheader = \"X-Api-Key\"\nfile = {:?}\non_unknown = \"free\"\n\n[[plans]]\nname = \"free\"\n[[plans.limits]]\nname = \"hourly\"\nalgorithm = \"fixed_window\"\nlimit = 100\nperiod = \"1h\"\n\n",
        file.display().to_string()
    );
    let rules = "consumers = true\n[routes.request_headers]\nset = { \"X-Who\" = \"consumer=$consumer\", \"X-Only\" = \"$consumer\" }\n[routes.response_headers]\nset = { \"X-Billed-To\" = \"$consumer\" }\n";
    let gw = gateway(&config(
        "backend = \"memory\"",
        &(top + &route("api", "/api", &up.url(), rules)),
    ));
    let c = client();
    let res = c
        .get(gw.url("/api/x"))
        .header("x-api-key", "k-acme")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(h(&res, "x-billed-to"), "acme corp");
    let seen = up.seen().pop().unwrap();
    assert_eq!(seen.headers["x-who"], "consumer=acme corp");
    assert_eq!(seen.headers["x-only"], "acme corp");
    assert_eq!(seen.headers["x-consumer"], "acme corp");
    let res = c
        .get(gw.url("/api/x"))
        .header("x-api-key", "unknown")
        .header("x-only", "forged")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("x-billed-to").is_none());
    let seen = up.seen().pop().unwrap();
    assert_eq!(seen.headers["x-who"], "consumer=");
    assert!(seen.headers.get("x-only").is_none(), "{:?}", seen.headers);
}

/// Header rules and CORS are part of the route: a reload swaps them with it, and a reload
/// that would break one is refused (the running ones stay).
#[tokio::test(flavor = "multi_thread")]
async fn fronting_follows_a_reload() {
    let up = upstream().await;
    let with = |origin: &str, env: &str| {
        config(
            "backend = \"memory\"",
            &route(
                "api",
                "/api",
                &up.url(),
                &format!("[routes.request_headers]\nset = {{ \"X-Env\" = \"{env}\" }}\n[routes.cors]\nallow_origins = [\"{origin}\"]\n"),
            ),
        )
    };
    let gw = gateway(&with("https://a.example", "one"));
    let c = client();
    let get = |origin: &'static str| c.get(gw.url("/api/x")).header("origin", origin).send();
    let res = get("https://a.example").await.unwrap();
    assert_eq!(h(&res, "access-control-allow-origin"), "https://a.example");
    assert_eq!(up.seen().pop().unwrap().headers["x-env"], "one");

    gw.write_config(&with("https://b.example", "two"));
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let res = get("https://a.example").await.unwrap();
    assert!(res.headers().get("access-control-allow-origin").is_none());
    let res = get("https://b.example").await.unwrap();
    assert_eq!(h(&res, "access-control-allow-origin"), "https://b.example");
    assert_eq!(up.seen().pop().unwrap().headers["x-env"], "two");

    gw.write_config(&with("https://b.example", "a\\r\\nX-Evil: 1"));
    let r = c.post(gw.admin_url("/-/reload")).send().await.unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("line break"));
    let res = get("https://b.example").await.unwrap();
    assert_eq!(h(&res, "access-control-allow-origin"), "https://b.example");
    assert_eq!(up.seen().pop().unwrap().headers["x-env"], "two");
}
