#[test]
fn workers_default_to_the_cores_and_are_bounded() {
    let base = "[[routes]]\nname = \"a\"\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n";
    let c = Config::parse(base, Path::new(".")).unwrap();
    assert_eq!(c.server.workers, default_workers());
    let c = Config::parse(&format!("[server]\nworkers = 3\n{base}"), Path::new(".")).unwrap();
    assert_eq!(c.server.workers, 3);
    for bad in ["0", "1025"] {
        let e = Config::parse(
            &format!("[server]\nworkers = {bad}\n{base}"),
            Path::new("."),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("server.workers"), "{e}");
    }
}
use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("."))
}

const ROUTE: &str = r#"
[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://127.0.0.1:3000"
"#;

fn with_limit(limit: &str) -> String {
    format!("{ROUTE}\n[[routes.limits]]\n{limit}")
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("config unexpectedly valid:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn log_and_request_id_header() {
    let c = parse(ROUTE).unwrap();
    assert_eq!(c.log.access, AccessTarget::Off);
    assert_eq!(c.log.format, LogFormat::Json);
    assert_eq!(c.server.request_id_header.as_str(), "x-request-id");
    let c = parse(&format!(
            "[server]\nrequest_id_header = \"X-Trace\"\n[log]\naccess = \"stdout\"\nformat = \"json\"\n{ROUTE}"
        ))
        .unwrap();
    assert_eq!(c.log.access, AccessTarget::Stdout);
    assert_eq!(c.server.request_id_header.as_str(), "x-trace");
    let c = parse(&format!("[log]\naccess = \"logs/access.log\"\n{ROUTE}")).unwrap();
    assert_eq!(
        c.log.access,
        AccessTarget::File(Path::new(".").join("logs/access.log"))
    );
    let e = err(&format!("[log]\nformat = \"text\"\n{ROUTE}"));
    assert!(e.contains("format") && e.contains("line 2"), "{e}");
    let e = err(&format!("[log]\naccess = \"\"\n{ROUTE}"));
    assert!(e.contains("log.access"), "{e}");
    let e = err(&format!("[log]\nlevel = \"info\"\n{ROUTE}"));
    assert!(e.contains("level"), "{e}");
    for bad in ["x_request_id", "host", "bad header"] {
        let e = err(&format!("[server]\nrequest_id_header = \"{bad}\"\n{ROUTE}"));
        assert!(e.contains("request_id_header"), "{bad}: {e}");
    }
}

#[test]
fn defaults_are_documented_values() {
    let c = parse(ROUTE).unwrap();
    assert_eq!(c.server.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(c.admin.listen, "127.0.0.1:9090".parse().unwrap());
    assert_eq!(c.store.backend, Backend::Memory);
    assert_eq!(c.store.timeout, Duration::from_millis(50));
    assert_eq!(c.routes[0].timeout, Duration::from_secs(30));
    assert_eq!(
        c.routes[0]
            .upstream
            .as_ref()
            .unwrap()
            .url()
            .unwrap()
            .authority
            .as_str(),
        "127.0.0.1:3000"
    );
    assert_eq!(c.server.max_header_bytes, 65536);
}

#[test]
fn full_limit_parses_with_resolved_defaults() {
    let c = parse(&with_limit(
        "name = \"per-ip\"\nalgorithm = \"gcra\"\nlimit = 100\nperiod = \"1m\"\nsubject = \"ip\"",
    ))
    .unwrap();
    let l = &c.routes[0].limits[0];
    assert_eq!(l.algorithm, Algorithm::Gcra);
    assert_eq!(l.burst, 100);
    assert_eq!(l.cost, 1);
    assert_eq!(l.period, Duration::from_secs(60));
    assert_eq!(l.mode, Mode::Enforce);
}

#[test]
fn unknown_algorithm_names_the_value_and_line() {
    let e = err(&with_limit(
        "name = \"x\"\nalgorithm = \"fixed_windoww\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"",
    ));
    assert!(e.contains("fixed_windoww"), "{e}");
    assert!(e.contains("line 9"), "{e}");
}

#[test]
fn zero_limit_is_rejected() {
    let e = err(&with_limit(
        "name = \"x\"\nalgorithm = \"gcra\"\nlimit = 0\nperiod = \"1s\"\nsubject = \"ip\"",
    ));
    // Allowed only on a byte limit, which the limit's other keys say: the error names the key's
    // path, as every rule across keys does.
    assert!(
        e.contains("routes[0].limits[0].limit")
            && e.contains("unit = \"bytes\"")
            && e.contains("line 10"),
        "{e}"
    );
}

#[test]
fn bad_duration_is_rejected() {
    let e = err(&with_limit(
        "name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"soon\"\nsubject = \"ip\"",
    ));
    assert!(e.contains("period") && e.contains("soon"), "{e}");
}

#[test]
fn bad_cidr_is_rejected() {
    let e = err("[server]\ntrusted_proxies = [\"10.0.0.0/99\"]\n");
    assert!(
        e.contains("trusted_proxies") && e.contains("10.0.0.0/99"),
        "{e}"
    );
}

#[test]
fn unknown_keys_are_rejected_everywhere() {
    for text in [
            "[server]\nlisten_addr = \"0.0.0.0:1\"\n".to_owned(),
            "[store]\nbackend = \"memory\"\nttl = 3\n".to_owned(),
            format!("{ROUTE}prefix = \"/x\"\n"),
            with_limit("name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\nrate = 3"),
            "[extra]\na = 1\n".to_owned(),
        ] {
            let e = err(&text);
            assert!(e.contains("unknown field"), "{e}");
        }
}

#[test]
fn cross_field_rules_name_the_field() {
    let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1s\"\nsubject = \"ip\"\ncost = 3",
        ));
    assert!(e.contains("routes[0].limits[0].cost"), "{e}");
    let e = err(&format!("{ROUTE}{ROUTE}"));
    assert!(e.contains("routes[1].name"), "{e}");
    let e = err(&with_limit(
            "name = \"x\"\nalgorithm = \"sliding_window\"\nlimit = 2\nperiod = \"1s\"\nsubject = \"ip\"\nburst = 3",
        ));
    assert!(e.contains("routes[0].limits[0].burst"), "{e}");
    let e = err("[[routes]]\nname = \"a\"\npath_prefix = \"/a/../b\"\nupstream = \"http://x:1\"\n");
    assert!(e.contains("routes[0].path_prefix"), "{e}");
    // A path has one spelling (`path`): a prefix in another one is refused, naming the one.
    for (prefix, normal) in [("/café", "/caf%C3%A9"), ("/x%3Arun", "/x:run")] {
        let e = err(&format!(
            "[[routes]]\nname = \"a\"\npath_prefix = \"{prefix}\"\nupstream = \"http://x:1\"\n"
        ));
        assert!(
            e.contains("routes[0].path_prefix") && e.contains(&format!("write {normal:?}")),
            "{e}"
        );
    }
}

#[test]
fn subjects_parse() {
    assert_eq!(SubjectSpec::try_from("ip".to_owned()), Ok(SubjectSpec::Ip));
    assert_eq!(
        SubjectSpec::try_from("header:X-Api-Key".to_owned()),
        Ok(SubjectSpec::Header(http::HeaderName::from_static(
            "x-api-key"
        )))
    );
    assert_eq!(
        SubjectSpec::try_from("query:key".to_owned()),
        Ok(SubjectSpec::Query("key".to_owned()))
    );
    assert_eq!(
        SubjectSpec::try_from("cookie:x".to_owned()),
        Ok(SubjectSpec::Cookie("x".to_owned()))
    );
    assert!(SubjectSpec::try_from("cookie:".to_owned()).is_err());
    assert!(SubjectSpec::try_from("jwk:x".to_owned()).is_err());
    assert!(SubjectSpec::try_from("header:bad header".to_owned()).is_err());
}

/// Issue #25: compound subjects, prefixes, exemptions, access lists, real_ip_header — each bad
/// value named by key and (for values) line.
#[test]
fn who_is_calling_keys_are_checked() {
    let l = "name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n";
    let c = parse(&with_limit(&format!(
        "{l}subject = [\"header:X-Tenant\", \"ip\", \"method\", \"cookie:sid\"]\nipv6_prefix = 56\nexempt = [\"10.0.0.0/8\", \"192.0.2.7\"]"
    )))
    .unwrap();
    let lim = &c.routes[0].limits[0];
    assert_eq!(lim.subject.parts().len(), 4);
    assert_eq!(lim.prefixes, Prefixes { v4: 32, v6: 56 });
    assert_eq!(lim.exempt.nets.len(), 2);
    assert_eq!(c.server.prefixes, Prefixes { v4: 32, v6: 64 });
    let c = parse(&format!(
        "[server]\nipv4_prefix = 24\nipv6_prefix = 128\nreal_ip_header = \"CF-Connecting-IP\"\n{}",
        with_limit(&format!("{l}subject = \"ip\""))
    ))
    .unwrap();
    assert_eq!(c.routes[0].limits[0].prefixes, Prefixes { v4: 24, v6: 128 });
    assert_eq!(
        c.server.real_ip_header.as_ref().map(|h| h.as_str()),
        Some("cf-connecting-ip")
    );
    // Values: key and line.
    for (bad, key, line) in [
        (format!("{l}subject = [\"ip\", \"global\"]"), "subject", 12),
        (format!("{l}subject = [\"ip\", \"ip\"]"), "subject", 12),
        (format!("{l}subject = []"), "subject", 12),
        (format!("{l}subject = [\"ip\", \"nope\"]"), "subject", 12),
        (
            format!("{l}subject = [\"ip\",\"method\",\"path\",\"host\",\"header:a\",\"header:b\",\"query:c\",\"cookie:d\",\"cookie:e\"]"),
            "subject",
            12,
        ),
        (format!("{l}subject = \"ip\"\nipv4_prefix = 33"), "ipv4_prefix", 13),
        (format!("{l}subject = \"ip\"\nipv6_prefix = -1"), "ipv6_prefix", 13),
        (format!("{l}subject = \"ip\"\nexempt = [\"10.0.0.0/33\"]"), "exempt", 13),
        (format!("{l}subject = \"ip\"\nexempt = [\"consumer:\"]"), "exempt", 13),
    ] {
        let e = err(&with_limit(&bad));
        assert!(
            e.contains(key) && e.contains(&format!("line {line}")),
            "{bad}: {e}"
        );
    }
    let e = err(&format!("[server]\nipv6_prefix = 129\n{ROUTE}"));
    assert!(e.contains("ipv6_prefix") && e.contains("line 2"), "{e}");
    let e = err(&format!(
        "[server]\nreal_ip_header = \"X-Forwarded-For\"\n{ROUTE}"
    ));
    assert!(e.contains("real_ip_header") && e.contains("line 2"), "{e}");
    let e = err(&format!("{ROUTE}allow = [\"not-a-net\"]\n"));
    assert!(e.contains("allow") && e.contains("line 6"), "{e}");
    // Rules across keys: the key's path.
    for (bad, key) in [
        (
            with_limit(&format!(
                "{l}subject = [\"ip\", \"method\"]\non_missing = \"reject\""
            )),
            "routes[0].limits[0].on_missing",
        ),
        (
            with_limit(&format!("{l}subject = \"ip\"\nexempt = []")),
            "routes[0].limits[0].exempt",
        ),
        (
            with_limit(&format!("{l}subject = [\"consumer\", \"ip\"]")),
            "routes[0].limits[0].subject",
        ),
        (
            with_limit(&format!("{l}subject = \"ip\"\nexempt = [\"consumer:ops\"]")),
            "routes[0].limits[0].exempt",
        ),
        (format!("{ROUTE}allow = []\n"), "routes[0].allow"),
    ] {
        let e = err(&bad);
        assert!(e.contains(key), "{bad}: {e}");
    }
    let c = parse(&format!(
        "{ROUTE}allow = [\"10.0.0.0/8\"]\ndeny = [\"10.1.0.0/16\"]\n"
    ))
    .unwrap();
    assert!(c.routes[0].access.admits("10.2.0.1".parse().unwrap()));
    assert!(!c.routes[0].access.admits("10.1.0.1".parse().unwrap()));
}

#[test]
fn upstream_urls() {
    let u = UpstreamUrl::try_from("http://h:1/base/".to_owned()).unwrap();
    assert_eq!(u.base_path, "/base");
    assert!(UpstreamUrl::try_from("ftp://h:1".to_owned()).is_err());
    assert!(UpstreamUrl::try_from("/nohost".to_owned()).is_err());
}

/// A config with one limited route; `server`, `store`, `route` and `limit` are extra lines
/// for those tables.
fn durations(server: &str, store: &str, route: &str, limit: &str) -> String {
    format!(
            "[server]\n{server}\n[store]\n{store}\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\n\
             upstream = \"http://127.0.0.1:3000\"\n{route}\n[[routes.limits]]\nname = \"l\"\n\
             algorithm = \"fixed_window\"\nlimit = 1\nsubject = \"ip\"\n{limit}\n"
        )
}

/// Every duration key, as (key path, config with that key set to `value`).
fn every_duration_key(value: &str) -> Vec<(&'static str, String)> {
    let p = "period = \"1s\"";
    let set = |k: &str| format!("{k} = \"{value}\"");
    vec![
        (
            "server.header_read_timeout",
            durations(&set("header_read_timeout"), "", "", p),
        ),
        (
            "server.idle_timeout",
            durations(&set("idle_timeout"), "", "", p),
        ),
        (
            "server.body_read_timeout",
            durations(&set("body_read_timeout"), "", "", p),
        ),
        (
            "server.grace_period",
            durations(&set("grace_period"), "", "", p),
        ),
        ("store.timeout", durations("", &set("timeout"), "", p)),
        ("routes[0].timeout", durations("", "", &set("timeout"), p)),
        (
            "routes[0].limits[0].period",
            durations("", "", "", &set("period")),
        ),
    ]
}

#[test]
fn absurd_durations_are_refused_naming_the_key() {
    for (key, text) in every_duration_key("500000000000y") {
        let e = err(&text);
        assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
    }
}

#[test]
fn durations_just_over_their_bound_are_refused_naming_the_key() {
    // Timeouts: 1 day; store.timeout: 60 s; limit periods: 1 year (365.25 days).
    for (key, text) in every_duration_key("1day 1ms") {
        if key == "routes[0].limits[0].period" || key == "store.timeout" {
            continue;
        }
        let e = err(&text);
        assert!(
            e.contains(&format!("`{key}`")) && e.contains("1day"),
            "{key}: {e}"
        );
    }
    let e = err(&durations(
        "",
        "timeout = \"60001ms\"",
        "",
        "period = \"1s\"",
    ));
    assert!(e.contains("`store.timeout`") && e.contains("60s"), "{e}");
    let e = err(&durations("", "", "", "period = \"1y 1ms\""));
    assert!(
        e.contains("`routes[0].limits[0].period`") && e.contains("1year"),
        "{e}"
    );
}

#[test]
fn durations_at_their_bound_are_accepted() {
    let c = parse(&durations(
        "header_read_timeout = \"1day\"\nidle_timeout = \"24h\"\nbody_read_timeout = \"1d\"\n\
             grace_period = \"1day\"",
        "timeout = \"60s\"",
        "timeout = \"1day\"",
        "period = \"1y\"",
    ))
    .unwrap();
    let day = Duration::from_secs(86_400);
    assert_eq!(c.server.header_read_timeout, day);
    assert_eq!(c.server.grace_period, day);
    assert_eq!(c.store.timeout, Duration::from_secs(60));
    assert_eq!(c.routes[0].timeout, day);
    assert_eq!(
        c.routes[0].limits[0].period,
        Duration::from_secs(31_557_600)
    );
}

#[test]
fn zero_durations_are_refused_where_they_make_no_sense() {
    for (key, text) in every_duration_key("0s") {
        if key == "server.grace_period" {
            // Zero grace: close in-flight requests at once on SIGTERM. Meaningful.
            assert!(parse(&text).is_ok(), "{key}");
            continue;
        }
        let e = err(&text);
        assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
    }
}

#[test]
fn the_largest_burst_is_refused_not_a_panic() {
    for algorithm in ["leaky_bucket", "token_bucket", "gcra"] {
        let e = err(&with_limit(&format!(
                "name = \"x\"\nalgorithm = \"{algorithm}\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\n\
                 burst = 18446744073709551615"
            )));
        assert!(
            e.contains("`routes[0].limits[0].burst`"),
            "{algorithm}: {e}"
        );
    }
}

fn with_upstream(upstream: &str) -> String {
    format!("[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"{upstream}\"\n")
}

#[test]
fn upstream_with_user_info_is_refused() {
    for u in [
        "http://user:pw@127.0.0.1:3000",
        "http://user@127.0.0.1:3000/base",
    ] {
        let e = err(&with_upstream(u));
        assert!(
            e.contains("upstream") && e.contains("user-info") && e.contains("line 4"),
            "{u}: {e}"
        );
    }
}

#[test]
fn upstream_port_above_65535_is_refused() {
    for u in ["http://127.0.0.1:65536", "http://h:99999999"] {
        let e = err(&with_upstream(u));
        assert!(
            e.contains("upstream") && e.contains("port") && e.contains("line 4"),
            "{u}: {e}"
        );
    }
    let e = err(&with_upstream("http://127.0.0.1:0"));
    assert!(e.contains("upstream") && e.contains("port"), "{e}");
    let c = parse(&with_upstream("http://127.0.0.1:65535")).unwrap();
    assert_eq!(
        c.routes[0]
            .upstream
            .as_ref()
            .unwrap()
            .url()
            .unwrap()
            .authority
            .port_u16(),
        Some(65535)
    );
    for ok in ["http://example.com/base", "http://[::1]:8080"] {
        assert!(parse(&with_upstream(ok)).is_ok(), "{ok}");
    }
}

fn with_host(host: &str) -> String {
    format!("{ROUTE}host = \"{host}\"\n")
}

#[test]
fn route_host_with_a_port_is_refused() {
    for h in ["api.example.com:8080", "[::1]:443", "user@api.example.com"] {
        let e = err(&with_host(h));
        assert!(e.contains("`routes[0].host`"), "{h}: {e}");
    }
    let c = parse(&with_host("[::1]")).unwrap();
    assert_eq!(first_host(&c).as_deref(), Some("[::1]"));
}

/// The first route's first host, as written after normalisation.
fn first_host(c: &Config) -> Option<String> {
    c.routes.first()?.matching.hosts.first().map(|h| h.text())
}

#[test]
fn route_host_is_lowercased_and_loses_one_trailing_dot() {
    let c = parse(&with_host("Free.Example.COM.")).unwrap();
    assert_eq!(first_host(&c).as_deref(), Some("free.example.com"));
    let c = parse(&with_host("free.example.com")).unwrap();
    assert_eq!(first_host(&c).as_deref(), Some("free.example.com"));
    for h in ["free.example.com..", "."] {
        let e = err(&with_host(h));
        assert!(e.contains("`routes[0].host`"), "{h}: {e}");
    }
}

#[test]
fn path_prefix_with_query_or_fragment_is_refused() {
    for prefix in ["/api?x=1", "/api?", "/api#frag", "/#"] {
        let e = err(&format!(
            "[[routes]]\nname = \"a\"\npath_prefix = \"{prefix}\"\nupstream = \"http://x:1\"\n"
        ));
        assert!(e.contains("`routes[0].path_prefix`"), "{prefix}: {e}");
    }
}

#[test]
fn redis_backend_needs_valid_url() {
    let e = err("[store]\nbackend = \"redis\"\nurl = \"http://x\"\n");
    assert!(e.contains("store.url"), "{e}");
    let c =
        parse("[store]\nbackend = \"redis_cluster\"\nurls = [\"redis://a:1\", \"redis://b:2\"]\n")
            .unwrap();
    assert_eq!(c.store.urls.len(), 2);
}

const GROUP: &str = "[[upstreams]]\nname = \"users\"\nservers = [\"http://127.0.0.1:3001\", { url = \"http://127.0.0.1:3002\", weight = 3 }]\n";

fn grouped(group: &str, upstream: &str) -> String {
    format!(
        "{group}\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"{upstream}\"\n"
    )
}

#[test]
fn upstream_groups_parse_with_documented_defaults() {
    let c = parse(&grouped(GROUP, "users")).unwrap();
    let u = &c.upstreams[0];
    assert_eq!(u.servers.len(), 2);
    assert_eq!(u.servers[1].weight, 3);
    assert_eq!(u.balance, crate::upstream::Balance::RoundRobin);
    assert_eq!(u.max_fails, 1);
    assert_eq!(u.fail_timeout, Duration::from_secs(10));
    assert_eq!(u.retries, 1);
    assert_eq!(u.connect_timeout, Duration::from_secs(5));
    assert!(u.health_check.is_none());
    assert!(u.tls.verify);
    assert_eq!(
        c.routes[0].upstream,
        Some(UpstreamRef::Group("users".into()))
    );
    let c = parse(&grouped(
        &format!("{GROUP}[upstreams.health_check]\npath = \"/healthz\"\n"),
        "users",
    ))
    .unwrap();
    let h = c.upstreams[0].health_check.as_ref().unwrap();
    assert_eq!(
        (
            h.interval,
            h.timeout,
            h.healthy_threshold,
            h.unhealthy_threshold
        ),
        (Duration::from_secs(5), Duration::from_secs(1), 2, 3)
    );
}

#[test]
fn upstream_errors_name_the_key() {
    let e = err(&grouped(GROUP, "nosuch"));
    assert!(
        e.contains("`routes[0].upstream`") && e.contains("nosuch"),
        "{e}"
    );
    let e = err(&grouped(
        "[[upstreams]]\nname = \"users\"\nservers = [\"http://127.0.0.1:3001\", \"ftp://x:1\"]\n",
        "users",
    ));
    assert!(e.contains("ftp://x:1") && e.contains("line 3"), "{e}");
    let e = err(&grouped(
        "[[upstreams]]\nname = \"users\"\nservers = [{ url = \"http://a:1\", weight = 0 }]\n",
        "users",
    ));
    assert!(e.contains("`upstreams[0].servers[0].weight`"), "{e}");
    let e = err(&grouped(
        "[[upstreams]]\nname = \"users\"\nservers = [\"http://a:1\", \"https://b:1\"]\n",
        "users",
    ));
    assert!(e.contains("`upstreams[0].servers[1]`"), "{e}");
    let e = err(&grouped(
        "[[upstreams]]\nname = \"users\"\nservers = [\"http://a:1/base\"]\n",
        "users",
    ));
    assert!(e.contains("`upstreams[0].servers[0]`"), "{e}");
    let e = err(&grouped(&format!("{GROUP}balance = \"random\"\n"), "users"));
    assert!(e.contains("random"), "{e}");
    let e = err(&grouped(&format!("{GROUP}{GROUP}"), "users"));
    assert!(e.contains("`upstreams[1].name`"), "{e}");
    let e = err(&grouped(
        &format!("{GROUP}[upstreams.tls]\nverify = false\n"),
        "users",
    ));
    assert!(e.contains("`upstreams[0].tls`"), "{e}");
    let e = err(&grouped(
        &format!("{GROUP}[upstreams.health_check]\nintervall = \"1s\"\n"),
        "users",
    ));
    assert!(
        e.contains("unknown field") && e.contains("intervall"),
        "{e}"
    );
    let e = err(&grouped(GROUP, "bad name!"));
    assert!(e.contains("bad name!"), "{e}");
}

#[test]
fn https_route_urls_are_accepted() {
    let c = parse(&with_upstream("https://api.example.com/v1")).unwrap();
    let u = c.routes[0].upstream.as_ref().unwrap().url().unwrap();
    assert_eq!(u.scheme, http::uri::Scheme::HTTPS);
    assert_eq!(u.base_path, "/v1");
}

#[test]
fn verify_false_is_a_warning() {
    let c = parse(&grouped(
            "[[upstreams]]\nname = \"users\"\nservers = [\"https://a:1\"]\n[upstreams.tls]\nverify = false\n",
            "users",
        ))
        .unwrap();
    let w = c.warnings();
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("upstreams[0].tls.verify"), "{w:?}");
}

const PLANS: &str = r#"
[consumers]
header = "X-Api-Key"
file = "consumers.toml"

[[plans]]
name = "free"
[[plans.limits]]
name = "per-minute"
algorithm = "gcra"
limit = 60
period = "1m"
[[plans.limits]]
name = "daily"
algorithm = "fixed_window"
limit = 1000
calendar = "day"
scope = "route"
"#;

#[test]
fn consumers_and_plans() {
    let c = parse(&format!("{PLANS}{ROUTE}consumers = true\n")).unwrap();
    let cc = c.consumers.as_ref().unwrap();
    assert_eq!(
        cc.source,
        KeySource::Header(http::HeaderName::from_static("x-api-key"))
    );
    assert_eq!(cc.on_unknown, OnUnknown::Reject);
    assert_eq!(cc.file, Path::new(".").join("consumers.toml"));
    assert!(c.routes[0].consumers);
    let daily = &c.plans[0].limits[1];
    assert_eq!(daily.scope, Scope::Route);
    assert_eq!(
        daily.limit.calendar,
        Some(tollgate_limit::calendar::Calendar::Day.into())
    );
    assert_eq!(c.plans[0].limits[0].scope, Scope::Global);
    let c = parse(&format!(
        "{}{ROUTE}consumers = true\n",
        PLANS.replace("file =", "on_unknown = \"free\"\nfile =")
    ))
    .unwrap();
    assert_eq!(c.consumers.unwrap().on_unknown, OnUnknown::Plan(0));
}

#[test]
fn consumers_and_plans_are_checked() {
    let cases: Vec<(String, &str)> = vec![
        (format!("{ROUTE}consumers = true\n"), "routes[0].consumers"),
        (
            PLANS.replace("header = \"X-Api-Key\"", "header = \"X-Api-Key\"\nquery = \"k\""),
            "`consumers`",
        ),
        (
            PLANS.replace("file =", "on_unknown = \"gold\"\nfile ="),
            "consumers.on_unknown",
        ),
        (
            PLANS.replace("period = \"1m\"", "period = \"1m\"\nsubject = \"global\""),
            "plans[0].limits[0].subject",
        ),
        (
            PLANS.replace("period = \"1m\"", "period = \"1m\"\ncalendar = \"day\""),
            "plans[0].limits[0].calendar",
        ),
        (
            PLANS.replace("algorithm = \"fixed_window\"", "algorithm = \"sliding_window\""),
            "plans[0].limits[1].calendar",
        ),
        (
            PLANS.replace("period = \"1m\"\n", ""),
            "plans[0].limits[0].period",
        ),
        (
            PLANS.replace("name = \"daily\"", "name = \"per-minute\""),
            "plans[0].limits[1].name",
        ),
        (
            format!("{PLANS}[[plans]]\nname = \"free\"\n"),
            "plans[1].name",
        ),
        (
            with_limit(
                "name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\nscope = \"route\"",
            ),
            "routes[0].limits[0].scope",
        ),
        (
            with_limit("name = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\""),
            "routes[0].limits[0].subject",
        ),
        (
            format!(
                "{PLANS}{ROUTE}consumers = true\n[[routes.limits]]\nname = \"daily\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\n"
            ),
            "routes[0].limits[0].name",
        ),
    ];
    for (text, field) in cases {
        let e = err(&text);
        assert!(e.contains(field), "expected {field} in: {e}\n{text}");
    }
    // A typo in [consumers] is a parse error naming the line.
    let e = err(&PLANS.replace("header =", "hedaer ="));
    assert!(e.contains("hedaer") && e.contains("line 3"), "{e}");
}

#[test]
fn a_monthly_quota_of_a_hundred_thousand_is_exact_enough() {
    // A fixed window multiplies no count by its period.
    parse(&with_limit(
        "name = \"m\"\nalgorithm = \"fixed_window\"\nlimit = 100000\ncalendar = \"month\"\nsubject = \"ip\"",
    ))
    .unwrap();
    parse(&with_limit(
        "name = \"m\"\nalgorithm = \"fixed_window\"\nlimit = 100000\nperiod = \"31days\"\nsubject = \"ip\"",
    ))
    .unwrap();
    // A sliding window does (prev × (P − elapsed)).
    let e = err(&with_limit(
        "name = \"m\"\nalgorithm = \"sliding_window\"\nlimit = 100000\nperiod = \"31days\"\nsubject = \"ip\"",
    ));
    assert!(e.contains("routes[0].limits[0].limit"), "{e}");
    let e = err(&with_limit(
        "name = \"m\"\nalgorithm = \"fixed_window\"\nlimit = 9007199254740992\nperiod = \"1s\"\nsubject = \"ip\"",
    ));
    assert!(e.contains("routes[0].limits[0].limit"), "{e}");
}

#[test]
fn path_params_and_case_sensitive() {
    let c = parse(ROUTE).unwrap();
    assert_eq!(c.server.path_params, crate::http::path::PathParams::Reject);
    assert!(c.routes[0].case_sensitive);
    let c = parse(&format!("[server]\npath_params = \"strip\"\n{ROUTE}")).unwrap();
    assert_eq!(c.server.path_params, crate::http::path::PathParams::Strip);
    let e = err(&format!("[server]\npath_params = \"drop\"\n{ROUTE}"));
    assert!(e.contains("path_params") && e.contains("line 2"), "{e}");
    let folded = ROUTE.replace("\"/api\"", "\"/API/V1\"\ncase_sensitive = false");
    assert_eq!(parse(&folded).unwrap().routes[0].path_prefix, "/api/v1");
    let e = err(&ROUTE.replace("\"/api\"", "\"/api%09\""));
    assert!(e.contains("routes[0].path_prefix"), "{e}");
}

#[test]
fn a_usage_route_has_no_upstream_and_needs_consumers() {
    let consumers =
        "[consumers]\nheader = \"X-Api-Key\"\nfile = \"c.toml\"\n[[plans]]\nname = \"p\"\n";
    let usage = "[[routes]]\nname = \"u\"\npath_prefix = \"/usage\"\nusage = true\n";
    let c = parse(&format!("{consumers}{usage}consumers = true\n")).unwrap();
    assert!(c.routes[0].usage);
    let e = err(&format!("{consumers}{usage}"));
    assert!(
        e.contains("`routes[0].usage`") && e.contains("consumers = true"),
        "{e}"
    );
    let e = err(&format!(
        "{consumers}{usage}consumers = true\nupstream = \"http://127.0.0.1:1\"\n"
    ));
    assert!(
        e.contains("`routes[0].upstream`") && e.contains("remove"),
        "{e}"
    );
    let e = err("[[routes]]\nname = \"a\"\npath_prefix = \"/\"\n");
    assert!(
        e.contains("`routes[0].upstream`") && e.contains("required"),
        "{e}"
    );
}

#[test]
fn billing_days_and_offsets_are_checked() {
    let month = "name = \"m\"\nalgorithm = \"fixed_window\"\nlimit = 10\ncalendar = \"month\"\nsubject = \"ip\"";
    let day = "name = \"d\"\nalgorithm = \"fixed_window\"\nlimit = 10\ncalendar = \"day\"\nsubject = \"ip\"";
    let c = parse(&with_limit(&format!("{month}\nanchor_day = 15"))).unwrap();
    let w = c.routes[0].limits[0].calendar.unwrap();
    assert_eq!((w.anchor_day, w.utc_offset_min), (15, 0));
    let c = parse(&with_limit(&format!("{day}\nutc_offset = \"-05:00\""))).unwrap();
    assert_eq!(c.routes[0].limits[0].calendar.unwrap().utc_offset_min, -300);
    let c = parse(&with_limit(&format!("{day}\nutc_offset = \"+09:30\""))).unwrap();
    assert_eq!(c.routes[0].limits[0].calendar.unwrap().utc_offset_min, 570);
    for (bad, key, says) in [
        (format!("{month}\nanchor_day = 31"), "anchor_day", "1 to 28"),
        (format!("{month}\nanchor_day = 0"), "anchor_day", "1 to 28"),
        (format!("{day}\nanchor_day = 2"), "anchor_day", "month"),
        (format!("{month}\nutc_offset = \"+01:00\""), "utc_offset", "day"),
        (format!("{day}\nutc_offset = \"5h\""), "utc_offset", "-05:00"),
        (format!("{day}\nutc_offset = \"+15:00\""), "utc_offset", "14:00"),
        (format!("{day}\nutc_offset = \"+01:60\""), "utc_offset", "14:00"),
        (
            "name = \"x\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"\nanchor_day = 3".to_owned(),
            "anchor_day",
            "calendar",
        ),
    ] {
        let e = err(&with_limit(&bad));
        assert!(
            e.contains(&format!("`routes[0].limits[0].{key}`")) && e.contains(says),
            "{bad}: {e}"
        );
    }
}

/// Issue #25: `[jwt]` and a route's `jwt`, bad values named by key and line, rules by key.
#[test]
fn jwt_keys_are_checked() {
    let jwt = "[jwt]\njwks_file = \"jwks.json\"\nalgorithms = [\"RS256\", \"ES256\"]\nissuer = \"https://idp\"\naudience = [\"a\", \"b\"]\nleeway = \"30s\"\nheader = \"X-Token\"\nquery = \"access_token\"\n";
    let c = parse(&format!("{jwt}{ROUTE}jwt = \"required\"\n")).unwrap();
    let j = c.jwt.as_ref().unwrap();
    assert_eq!(j.algorithms.len(), 2);
    assert_eq!(
        j.audience.as_deref(),
        Some(&["a".to_owned(), "b".to_owned()][..])
    );
    assert_eq!(j.leeway, Duration::from_secs(30));
    assert_eq!(
        j.header,
        TokenSource::Header(http::HeaderName::from_static("x-token"))
    );
    assert_eq!(c.routes[0].jwt, Some(JwtMode::Required));
    let c = parse(&format!(
        "[jwt]\nsecret_env = \"S\"\n{ROUTE}jwt = \"optional\"\n"
    ))
    .unwrap();
    let j = c.jwt.as_ref().unwrap();
    assert_eq!(j.algorithms, [jsonwebtoken::Algorithm::HS256]);
    assert_eq!(j.header, TokenSource::Bearer);
    assert_eq!(j.leeway, Duration::from_secs(60));
    // Values: key and line.
    for (bad, key, line) in [
        (
            "[jwt]\nsecret_env = \"S\"\nalgorithms = [\"none\"]\n",
            "algorithms",
            3,
        ),
        (
            "[jwt]\nsecret_env = \"S\"\nalgorithms = [\"HS999\"]\n",
            "algorithms",
            3,
        ),
        (
            "[jwt]\nsecret_env = \"S\"\nleeway = \"soon\"\n",
            "leeway",
            3,
        ),
        ("[jwt]\nsecret_env = \"S\"\nkeys = 1\n", "keys", 3),
    ] {
        let e = err(&format!("{bad}{ROUTE}"));
        assert!(
            e.contains(key) && e.contains(&format!("line {line}")),
            "{bad}: {e}"
        );
    }
    let e = err(&format!("{ROUTE}jwt = \"sometimes\"\n"));
    assert!(e.contains("jwt") && e.contains("line 6"), "{e}");
    // Rules: the key's path.
    for (bad, key) in [
        ("[jwt]\n".to_owned(), "`jwt`"),
        (
            "[jwt]\nsecret_env = \"S\"\njwks_file = \"j\"\n".to_owned(),
            "`jwt`",
        ),
        (
            "[jwt]\nsecret_env = \"S\"\nalgorithms = [\"RS256\"]\n".to_owned(),
            "jwt.algorithms",
        ),
        (
            "[jwt]\njwks_file = \"j\"\nalgorithms = [\"HS256\"]\n".to_owned(),
            "jwt.algorithms",
        ),
        (
            "[jwt]\njwks_file = \"j\"\nalgorithms = []\n".to_owned(),
            "jwt.algorithms",
        ),
        (
            "[jwt]\njwks_file = \"j\"\nleeway = \"2h\"\n".to_owned(),
            "jwt.leeway",
        ),
        (
            "[jwt]\njwks_file = \"j\"\naudience = []\n".to_owned(),
            "jwt.audience",
        ),
        (
            "[jwt]\njwks_file = \"j\"\nquery = \"\"\n".to_owned(),
            "jwt.query",
        ),
        (
            "[jwt]\njwks_file = \"j\"\nheader = \"bad header\"\n".to_owned(),
            "jwt.header",
        ),
    ] {
        let e = err(&format!("{bad}{ROUTE}"));
        assert!(e.contains(key), "{bad}: {e}");
    }
    // A route's jwt needs [jwt]; a jwt: subject needs the route's jwt.
    let e = err(&format!("{ROUTE}jwt = \"required\"\n"));
    assert!(e.contains("routes[0].jwt"), "{e}");
    let l = "[[routes.limits]]\nname = \"x\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"jwt:sub\"\n";
    let e = err(&format!("[jwt]\nsecret_env = \"S\"\n{ROUTE}{l}"));
    assert!(e.contains("routes[0].jwt"), "{e}");
    assert!(parse(&format!(
        "[jwt]\nsecret_env = \"S\"\n{ROUTE}jwt = \"required\"\n{l}"
    ))
    .is_ok());
    let e = err(&format!(
        "[jwt]\nsecret_env = \"S\"\n{ROUTE}jwt = \"required\"\n{}",
        l.replace("jwt:sub", "jwt:a..b")
    ));
    assert!(e.contains("subject") && e.contains("line 14"), "{e}");
}

/// `[consumers] jwt_claim` / `plan_claim`.
#[test]
fn consumers_from_tokens_are_checked() {
    let plans = "[[plans]]\nname = \"free\"\n";
    let c = parse(&format!(
        "[jwt]\nsecret_env = \"S\"\n[consumers]\nfile = \"c.toml\"\njwt_claim = \"sub\"\nplan_claim = \"org.plan\"\n{plans}{ROUTE}consumers = true\njwt = \"required\"\n"
    ))
    .unwrap();
    let cc = c.consumers.as_ref().unwrap();
    assert_eq!(cc.source, KeySource::TokenOnly);
    assert_eq!(cc.plan_claim.as_ref().unwrap().len(), 2);
    for (bad, key) in [
        // Tokens only, on a route that verifies none.
        (format!("[jwt]\nsecret_env = \"S\"\n[consumers]\nfile = \"c.toml\"\njwt_claim = \"sub\"\n{plans}{ROUTE}consumers = true\n"), "routes[0].jwt"),
        (format!("[consumers]\nfile = \"c.toml\"\nheader = \"K\"\njwt_claim = \"sub\"\n{plans}{ROUTE}consumers = true\n"), "consumers.jwt_claim"),
        (format!("[consumers]\nfile = \"c.toml\"\nheader = \"K\"\nplan_claim = \"plan\"\n{plans}{ROUTE}consumers = true\n"), "consumers.plan_claim"),
        (format!("[jwt]\nsecret_env = \"S\"\n[consumers]\nfile = \"c.toml\"\njwt_claim = \"a..b\"\n{plans}{ROUTE}"), "consumers.jwt_claim"),
        (format!("[consumers]\nfile = \"c.toml\"\n{plans}{ROUTE}"), "`consumers`"),
    ] {
        let e = err(&bad);
        assert!(e.contains(key), "{bad}: {e}");
    }
}

/// `[server] proxy_protocol*`.
#[test]
fn proxy_protocol_keys_are_checked() {
    let c = parse(&format!(
        "[server]\nproxy_protocol = \"any\"\nproxy_protocol_from = [\"10.0.0.0/8\", \"fd00::/8\"]\n{ROUTE}"
    ))
    .unwrap();
    let pp = c.server.proxy_protocol.as_ref().unwrap();
    assert_eq!(pp.mode, ProxyProtocolMode::Any);
    assert_eq!(pp.from.len(), 2);
    assert_eq!(pp.timeout, Duration::from_secs(5));
    assert!(parse(ROUTE).unwrap().server.proxy_protocol.is_none());
    for (bad, key, line) in [
        ("proxy_protocol = \"v3\"", "proxy_protocol", 2),
        (
            "proxy_protocol_from = [\"10.0.0.0/40\"]",
            "proxy_protocol_from",
            2,
        ),
        (
            "proxy_protocol_timeout = \"soon\"",
            "proxy_protocol_timeout",
            2,
        ),
    ] {
        let e = err(&format!("[server]\n{bad}\n{ROUTE}"));
        assert!(
            e.contains(key) && e.contains(&format!("line {line}")),
            "{bad}: {e}"
        );
    }
    for (bad, key) in [
        ("proxy_protocol = \"v1\"", "server.proxy_protocol_from"),
        ("proxy_protocol_from = [\"10.0.0.0/8\"]", "server.proxy_protocol_from"),
        (
            "proxy_protocol = \"v2\"\nproxy_protocol_from = [\"10.0.0.0/8\"]\nproxy_protocol_timeout = \"2m\"",
            "server.proxy_protocol_timeout",
        ),
    ] {
        let e = err(&format!("[server]\n{bad}\n{ROUTE}"));
        assert!(e.contains(key), "{bad}: {e}");
    }
}

/// Issue #26: `json:` subject parts, `reserve = "json:…"` with `reserve_max`, and a route's
/// `max_json_bytes` — on route and plan limits; bad values named by key and line, rules by key.
#[test]
fn per_model_limits_and_json_reservations() {
    let tokens = "name = \"t\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"1m\"\ncost_from = \"json:usage.total_tokens\"";
    let c = parse(&with_limit(&format!(
        "{tokens}\nsubject = [\"header:x-key\", \"json:model\"]\non_missing = \"reject\"\nreserve = \"json:max_tokens\"\nreserve_max = 500"
    )))
    .unwrap();
    let r = &c.routes[0];
    assert_eq!(r.max_json_bytes, 1 << 20, "the default: 1 MiB");
    assert_eq!(
        r.limits[0].subject.to_string(),
        "[header:x-key, json:model]"
    );
    assert_eq!(
        r.limits[0].after.as_ref().and_then(|a| a.reserve.as_ref()),
        Some(&Reserve::Json {
            path: vec![Box::from("max_tokens")].into(),
            max: 500
        })
    );
    let c = parse(&format!("{ROUTE}max_json_bytes = 4096\n")).unwrap();
    assert_eq!(c.routes[0].max_json_bytes, 4096);
    // A plan's limit: per consumer and model.
    let plans = format!(
        "[consumers]\nheader = \"x-key\"\nfile = \"c.toml\"\n[[plans]]\nname = \"p\"\n[[plans.limits]]\n{tokens}\nsubject = [\"json:model\"]\nreserve = \"json:max_tokens\"\nreserve_max = 500\n{ROUTE}consumers = true\n"
    );
    let c = parse(&plans).unwrap();
    assert_eq!(
        c.plans[0].limits[0].limit.subject.to_string(),
        "[consumer, json:model]"
    );
    // A consumer's override keeps reserve_max within the limit.
    assert!(c.plans[0].limits[0].overridden(400).is_err());
    assert!(c.plans[0].limits[0].overridden(500).is_ok());
    // Values: key and line.
    for (bad, line) in [("0", 6), ("-1", 6), ("67108865", 6), ("\"1MiB\"", 6)] {
        let e = err(&format!("{ROUTE}max_json_bytes = {bad}\n"));
        assert!(
            e.contains("max_json_bytes") && e.contains(&format!("line {line}")),
            "{bad}: {e}"
        );
    }
    for bad in ["json:", "json:a..b", "json:.x"] {
        let e = err(&with_limit(&format!(
            "{tokens}\nsubject = [\"ip\", \"{bad}\"]"
        )));
        assert!(e.contains("subject") && e.contains("line 13"), "{bad}: {e}");
    }
    // Rules: the key's path.
    let e = err(&with_limit(&format!(
        "{tokens}\nsubject = \"ip\"\nreserve = \"json:max_tokens\""
    )));
    assert!(e.contains("routes[0].limits[0].reserve_max"), "{e}");
    let e = err(&with_limit(&format!(
        "{tokens}\nsubject = \"ip\"\nreserve = \"json\"\nreserve_max = 5"
    )));
    assert!(e.contains("routes[0].limits[0].reserve"), "{e}");
}

/// #36 §3: `tls:` parts parse, show as written, and need client certificates.
#[test]
fn tls_subject_parts_need_client_auth() {
    for part in ["fingerprint", "subject_cn", "san_dns", "san_uri"] {
        let s = SubjectSpec::parse_one(&format!("tls:{part}")).unwrap();
        assert_eq!(s.to_string(), format!("tls:{part}"));
        assert!(s.needs_client_cert() && s.can_be_missing());
    }
    assert!(SubjectSpec::parse_one("tls:serial").is_err());
    let e = err(&with_limit(
        "name = \"per-cert\"\nalgorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\nsubject = [\"tls:fingerprint\", \"ip\"]",
    ));
    assert!(e.contains("routes[0].limits[0].subject"), "{e}");
    assert!(e.contains("[server.tls.client_auth]"), "{e}");
}

/// #36 §3: a route's `client_cert = "required"` needs `[server.tls.client_auth]`.
#[test]
fn a_route_demanding_a_client_certificate_needs_client_auth() {
    let e = err(&ROUTE.replace("upstream = ", "client_cert = \"required\"\nupstream = "));
    assert!(e.contains("routes[0].client_cert"), "{e}");
    assert!(e.contains("[server.tls.client_auth]"), "{e}");
    assert!(
        err(&ROUTE.replace("upstream = ", "client_cert = \"optional\"\nupstream = "))
            .contains("client_cert")
    );
}

/// #38 §2: `limit_rate` and `limit_rate_after` on a route and a plan — sizes with nginx's
/// suffixes, 0 as no limit (and a plan's 0 kept, to lift a route's), bad values named by key
/// and line, `limit_rate_after` alone named by key.
#[test]
fn limit_rate_takes_sizes_and_names_bad_values() {
    use crate::http::pacing::Pace;
    use std::num::NonZeroU64;
    let pace = |rate: u64, after: u64| Pace {
        rate: NonZeroU64::new(rate).unwrap(),
        after,
    };
    for (value, want) in [
        ("65536", 65536),
        ("\"64k\"", 64 << 10),
        ("\"64K\"", 64 << 10),
        ("\" 1m \"", 1 << 20),
        ("\"2g\"", 2 << 30),
        ("\"100\"", 100),
    ] {
        let c = parse(&format!("{ROUTE}limit_rate = {value}\n")).unwrap();
        assert_eq!(c.routes[0].limit_rate, Some(pace(want, 0)), "{value}");
    }
    let c = parse(&format!(
        "{ROUTE}limit_rate = \"64k\"\nlimit_rate_after = \"1m\"\n"
    ))
    .unwrap();
    assert_eq!(c.routes[0].limit_rate, Some(pace(64 << 10, 1 << 20)));
    for off in ["0", "\"0k\""] {
        let c = parse(&format!(
            "{ROUTE}limit_rate = {off}\nlimit_rate_after = 5\n"
        ))
        .unwrap();
        assert_eq!(c.routes[0].limit_rate, None, "{off}: no limit");
    }
    assert_eq!(parse(ROUTE).unwrap().routes[0].limit_rate, None);
    for bad in [
        "-1",
        "\"-1k\"",
        "\"1.5m\"",
        "\"64kb\"",
        "\"k\"",
        "\"\"",
        "\"17179869184g\"",
        "\"99999999999999999999\"",
        "1.5",
    ] {
        let e = err(&format!("{ROUTE}limit_rate = {bad}\n"));
        assert!(
            e.contains("limit_rate") && e.contains("line 6"),
            "{bad}: {e}"
        );
    }
    let e = err(&format!("{ROUTE}limit_rate_after = \"1m\"\n"));
    assert!(e.contains("routes[0].limit_rate_after"), "{e}");
    // A plan: its own pace, or 0 (no limit, in place of the route's), or none (the route's).
    let plans = "[consumers]\nheader = \"x-key\"\nfile = \"c.toml\"\n[[plans]]\nname = \"a\"\nlimit_rate = \"1m\"\nlimit_rate_after = 10\n[[plans]]\nname = \"b\"\nlimit_rate = 0\n[[plans]]\nname = \"c\"\n";
    let c = parse(&format!(
        "{plans}{ROUTE}consumers = true\nlimit_rate = 1000\n"
    ))
    .unwrap();
    assert_eq!(c.plans[0].limit_rate, Some(Some(pace(1 << 20, 10))));
    assert_eq!(c.plans[1].limit_rate, Some(None));
    assert_eq!(c.plans[2].limit_rate, None);
    let e = err("[consumers]\nheader = \"x-key\"\nfile = \"c.toml\"\n[[plans]]\nname = \"a\"\nlimit_rate_after = 10\n");
    assert!(e.contains("plans[0].limit_rate_after"), "{e}");
}
