//! The route table: compiled routes, matched most specific first.
//!
//! Order: longest `path_prefix` first; among equal prefixes, a route with a `host` before one
//! without, and one with `methods` before one without. Prefixes are segment-aware: `/api` matches
//! `/api` and `/api/x`, never `/apix`. The table is built once per config snapshot and read
//! without locks.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method};

use crate::config::{RouteConfig, UpstreamUrl};
use crate::limiter::CompiledLimit;
use crate::metrics::RouteMetrics;

/// A route ready for the hot path.
#[derive(Debug)]
pub struct Route {
    pub name: Arc<str>,
    pub path_prefix: String,
    pub host: Option<String>,
    pub methods: Option<Vec<Method>>,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    pub upstream: UpstreamUrl,
    /// `Host` sent upstream unless `preserve_host`.
    pub upstream_host: HeaderValue,
    pub timeout: Duration,
    pub max_body_size: u64,
    pub rate_limit_headers: bool,
    pub limits: Vec<CompiledLimit>,
    /// `RateLimit-Policy` of the enforcing limits (none when there are none).
    pub policy_header: Option<HeaderValue>,
    pub metrics: RouteMetrics,
}

impl Route {
    pub fn compile(r: &RouteConfig, key_prefix: &str) -> Route {
        let name: Arc<str> = Arc::from(r.name.as_str());
        let limits: Vec<CompiledLimit> = r
            .limits
            .iter()
            .map(|l| CompiledLimit::compile(&name, l, key_prefix))
            .collect();
        let policy = limits
            .iter()
            .filter(|l| !l.shadow)
            .map(|l| l.policy_item.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let upstream_host = HeaderValue::from_str(r.upstream.authority.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Route {
            metrics: RouteMetrics::new(&name),
            name,
            path_prefix: r.path_prefix.clone(),
            host: r.host.clone(),
            methods: r.methods.clone(),
            strip_prefix: r.strip_prefix,
            preserve_host: r.preserve_host,
            upstream: r.upstream.clone(),
            upstream_host,
            timeout: r.timeout,
            max_body_size: r.max_body_size,
            rate_limit_headers: r.rate_limit_headers,
            limits,
            policy_header: if policy.is_empty() {
                None
            } else {
                HeaderValue::from_str(&policy).ok()
            },
        }
    }

    fn prefix_matches(&self, path: &str) -> bool {
        let p = &self.path_prefix;
        p == "/"
            || path == p
            || (path.starts_with(p.as_str()) && path.as_bytes().get(p.len()) == Some(&b'/'))
    }

    /// The path to send upstream for a (normalised) request path.
    pub fn upstream_path(&self, path: &str) -> String {
        let rest = if self.strip_prefix && self.path_prefix != "/" {
            &path[self.path_prefix.len().min(path.len())..]
        } else {
            path
        };
        let mut out = String::with_capacity(self.upstream.base_path.len() + rest.len() + 1);
        out.push_str(&self.upstream.base_path);
        if !rest.starts_with('/') {
            out.push('/');
        }
        out.push_str(rest);
        out
    }
}

/// All routes of a snapshot, most specific first.
#[derive(Debug, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    pub fn new(routes: &[RouteConfig], key_prefix: &str) -> RouteTable {
        let mut routes: Vec<Route> = routes
            .iter()
            .map(|r| Route::compile(r, key_prefix))
            .collect();
        routes.sort_by_key(|r| {
            (
                std::cmp::Reverse(r.path_prefix.len()),
                r.host.is_none(),
                r.methods.is_none(),
            )
        });
        RouteTable { routes }
    }

    /// The route for a request; `host` is the request's host without port, lower-case.
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| {
            r.prefix_matches(path)
                && r.host.as_deref().is_none_or(|h| Some(h) == host)
                && r.methods.as_ref().is_none_or(|ms| ms.contains(method))
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn table(toml: &str) -> RouteTable {
        let c = Config::parse(toml, std::path::Path::new(".")).unwrap();
        RouteTable::new(&c.routes, "t")
    }

    fn route(name: &str, prefix: &str, extra: &str) -> String {
        format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\nupstream = \"http://127.0.0.1:1\"\n{extra}\n")
    }

    fn find<'a>(t: &'a RouteTable, host: Option<&str>, m: Method, path: &str) -> Option<&'a str> {
        t.find(host, &m, path).map(|r| &*r.name)
    }

    #[test]
    fn longest_prefix_wins_and_is_segment_aware() {
        let t = table(
            &(route("root", "/", "") + &route("api", "/api", "") + &route("v1", "/api/v1", "")),
        );
        assert_eq!(find(&t, None, Method::GET, "/api"), Some("api"));
        assert_eq!(find(&t, None, Method::GET, "/api/x"), Some("api"));
        assert_eq!(find(&t, None, Method::GET, "/apix"), Some("root"));
        assert_eq!(find(&t, None, Method::GET, "/api/v1/users"), Some("v1"));
        assert_eq!(find(&t, None, Method::GET, "/api/v10"), Some("api"));
        assert_eq!(find(&t, None, Method::GET, "/"), Some("root"));
    }

    #[test]
    fn host_and_method_narrow() {
        let t = table(
            &(route("any", "/api", "")
                + &route("host", "/api", "host = \"API.example.com\"")
                + &route("post", "/api", "methods = [\"post\"]")),
        );
        assert_eq!(
            find(&t, Some("api.example.com"), Method::GET, "/api/x"),
            Some("host")
        );
        assert_eq!(
            find(&t, Some("other"), Method::POST, "/api/x"),
            Some("post")
        );
        assert_eq!(find(&t, None, Method::GET, "/api/x"), Some("any"));
        let t = table(&route("only", "/api", "methods = [\"GET\"]"));
        assert_eq!(find(&t, None, Method::DELETE, "/api"), None);
    }

    #[test]
    fn no_route_is_none() {
        let t = table(&route("api", "/api", ""));
        assert_eq!(find(&t, None, Method::GET, "/other"), None);
    }

    #[test]
    fn upstream_paths() {
        let t = table(&route("s", "/svc", "strip_prefix = true"));
        let t2 = table(&route("b", "/b", "").replace("http://127.0.0.1:1", "http://h:1/base"));
        let s = t.find(None, &Method::GET, "/svc/x").unwrap();
        assert_eq!(s.upstream_path("/svc/x"), "/x");
        assert_eq!(s.upstream_path("/svc"), "/");
        let b = t2.find(None, &Method::GET, "/b/y").unwrap();
        assert_eq!(b.upstream_path("/b/y"), "/base/b/y");
    }
}
