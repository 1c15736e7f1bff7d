//! The route table: compiled routes, matched most specific first, at a cost that does not grow
//! with the number of routes.
//!
//! Order: longest `path_prefix` first; among equal prefixes, a route with a `host` before one
//! without, and one with `methods` before one without (then config order). Prefixes are
//! segment-aware: `/api` matches `/api` and `/api/x`, never `/apix`.
//!
//! Shape: a segment trie per host (a map from the exact, lower-case host) plus one for the
//! host-less routes. A route sits at the trie node its prefix's segments lead to (`/` at the
//! root); each node lists its routes with `methods` first. A lookup walks the request path's
//! segments down the request host's trie and down the host-less one, keeping in each the deepest
//! node with a route that accepts the method; the host's route wins unless the host-less one has
//! the strictly longer prefix. That is exactly the order above, read per request in
//! O(path segments) hash lookups, however many routes there are. The table is built once per
//! config snapshot and read without locks.
//!
//! The trie is stored flat, one hash map per host from a node's path (`/svc/api`: the request
//! path up to a `/` or its end) to the node's routes, rather than as nodes owning maps of
//! children: a one-child node would cost a whole hash table, and most nodes have one child.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method};
use smallvec::SmallVec;

use crate::config::{ConfigError, RouteConfig, UpstreamRef, UpstreamUrl};
use crate::limiter::CompiledLimit;
use crate::metrics::RouteMetrics;
use crate::upstream::Group;

/// Where a route sends its requests.
#[derive(Debug)]
pub enum Target {
    /// A plain `http://` URL: the worker's shared pool, no balancing, no health, no retries
    /// (the lean path of a route that names one address, as before groups).
    Url {
        url: UpstreamUrl,
        /// `Host` sent upstream unless `preserve_host`.
        host: HeaderValue,
        /// `host:port` of the URL (the port explicit), for the access log.
        addr: Arc<str>,
        /// The same URL as a group of one: how the fast HTTP/1 front reaches it (one upstream
        /// path, its per-worker pool of idle connections).
        single: Arc<Group>,
    },
    /// An `[[upstreams]]` group, or a route's own `https://` URL as a group of one.
    Group(Arc<Group>),
    /// No upstream: the gateway answers with a redirect (after the route's limits).
    Redirect(crate::fronting::Redirect),
}

/// A route ready for the hot path.
#[derive(Debug)]
pub struct Route {
    pub name: Arc<str>,
    /// Its place in the config file's `[[routes]]` (the table has its own order).
    pub position: usize,
    pub path_prefix: String,
    pub host: Option<String>,
    pub methods: Option<Vec<Method>>,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    pub target: Target,
    /// The path prepended to the forwarded path (a route URL's path; "" for a group).
    pub base_path: String,
    pub timeout: Duration,
    pub max_body_size: u64,
    /// The largest request body read before the limits for [`Route::json_paths`].
    pub max_json_bytes: u64,
    /// The paths of the request's JSON body its limits (the route's and every plan's) read:
    /// `json:` subject parts and `reserve = "json:…"`; set once the plan limits are compiled.
    /// Empty: the body is never read before the limits.
    pub json_paths: Box<[Box<[Box<str>]>]>,
    pub rate_limit_headers: bool,
    /// `false`: matched in any ASCII case (its `path_prefix` is in lower case).
    pub case_sensitive: bool,
    /// Shared with what a request settles after its response (`proxy::charge`).
    pub limits: Vec<Arc<CompiledLimit>>,
    /// Requests need a known consumer (`consumers = true`).
    pub consumers: bool,
    /// `usage = true`: answered with the caller's usage (the `quota` module), never forwarded.
    pub usage: bool,
    /// With `consumers`: each plan's limits as applied here, by plan index (filled by
    /// `Snapshot::build`, which knows the plans).
    pub plan_limits: Vec<Vec<Arc<CompiledLimit>>>,
    /// Served by the hyper front even when `http1 = "fast"`: its [`Route::needs`] are not
    /// within what the fast front serves ([`Needs::HTTP1`]); set once the plan limits
    /// are compiled.
    pub hyper_only: bool,
    pub metrics: RouteMetrics,
    /// Header rules, CORS, rewrite (see [`crate::fronting`]).
    pub fronting: crate::fronting::Fronting,
    /// Who may use the route (`allow`, `deny`), checked before any limit.
    pub access: crate::config::AccessList,
    /// A bearer token verified by `[jwt]`: required or optional.
    pub jwt: Option<crate::config::JwtMode>,
    /// `client_cert = "required"`: a verified client certificate, or 403.
    pub client_cert_required: bool,
    /// The shape of the route's refusals by a limit without its own (`refusal`).
    pub refusal: Option<Arc<crate::config::Refusal>>,
    /// Response compression (`[routes.compression]`, else `[server.compression]`).
    pub compression: Option<Arc<crate::config::Compression>>,
    /// `limit_rate`: each response's body paced (a consumer's plan may set its own).
    pub limit_rate: Option<crate::pacing::Pace>,
}

/// What serving a route's requests takes beyond the plain path; a front declares the same
/// (what it serves), and a route goes to a front only when its needs are within that front's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// `[routes.request_headers]`: edits of the upstream head.
    pub request_headers: bool,
    /// `[routes.response_headers]` or `[routes.cors]`: the response phase
    /// (the pipeline's `respond` phase) on every response.
    pub responses: bool,
    /// A limit charged from the response's body (`cost_from = "json:…"`: a JSON body or an
    /// event stream), read as it passes.
    pub body_cost: bool,
    /// A limit charged from the response's trailers (`cost_from = "trailer:…"`).
    pub trailer_cost: bool,
    /// Limits that read the request's JSON body ([`Route::json_paths`]): the body is read
    /// before the limits.
    pub json_body: bool,
    /// An upstream group spoken to in HTTP/2 (gRPC).
    pub h2_upstream: bool,
}

impl Needs {
    /// Everything: what the hyper front serves.
    pub const ALL: Needs = Needs {
        request_headers: true,
        responses: true,
        body_cost: true,
        trailer_cost: true,
        json_body: true,
        h2_upstream: true,
    };

    /// What the fast HTTP/1 front serves: everything but an HTTP/2 upstream group. A route
    /// needing more is served by the hyper front (`crate::pipeline::serve` decides, per request).
    pub const HTTP1: Needs = Needs {
        h2_upstream: false,
        ..Needs::ALL
    };

    /// Whether a front serving `serves` can serve these needs.
    pub fn within(self, serves: Needs) -> bool {
        (!self.request_headers || serves.request_headers)
            && (!self.responses || serves.responses)
            && (!self.body_cost || serves.body_cost)
            && (!self.trailer_cost || serves.trailer_cost)
            && (!self.json_body || serves.json_body)
            && (!self.h2_upstream || serves.h2_upstream)
    }
}

impl Route {
    /// The path as a `path` subject part counts it: as the route matches it — in lower case on
    /// a `case_sensitive = false` route, so `/API/x` and `/api/x` share one bucket (issue #34
    /// item 21). Copies only a path with upper case on such a route.
    pub fn counted_path<'p>(&self, path: &'p str) -> std::borrow::Cow<'p, str> {
        if self.case_sensitive || !path.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Borrowed(path)
        } else {
            std::borrow::Cow::Owned(path.to_ascii_lowercase())
        }
    }

    /// The paths of the request body its limits read (see [`Route::json_paths`]), each once.
    pub fn request_json_paths(&self) -> Box<[Box<[Box<str>]>]> {
        let mut out: Vec<Box<[Box<str>]>> = Vec::new();
        for l in self.limits.iter().chain(self.plan_limits.iter().flatten()) {
            let reserve = match l.reserve() {
                Some(crate::config::Reserve::Json { path, .. }) => Some(&**path),
                _ => None,
            };
            for p in l.subject.json_paths().chain(reserve) {
                if !out.iter().any(|o| **o == *p) {
                    out.push(p.into());
                }
            }
        }
        out.into()
    }

    /// What serving the route's requests takes beyond the plain path (computed once, at
    /// load: see [`Route::hyper_only`]).
    pub fn needs(&self) -> Needs {
        let f = &self.fronting;
        let sources = self
            .limits
            .iter()
            .chain(self.plan_limits.iter().flatten())
            .filter_map(|l| l.after.as_ref())
            .flat_map(|a| a.cost_from.iter());
        let (mut body_cost, mut trailer_cost) = (false, false);
        for s in sources {
            match s.source {
                crate::config::CostSourceKind::Json(_) => body_cost = true,
                crate::config::CostSourceKind::Trailer(_) => trailer_cost = true,
            }
        }
        let h2_upstream = match &self.target {
            Target::Group(g) => g.connect.protocol != crate::config::upstream::Protocol::Http1,
            _ => false,
        };
        Needs {
            request_headers: f.request_headers.is_some(),
            responses: f.touches_responses(),
            body_cost,
            trailer_cost,
            json_body: !self.json_paths.is_empty(),
            h2_upstream,
        }
    }

    /// Compiles a route; `groups` are the snapshot's compiled `[[upstreams]]` by name.
    /// `singles` are the groups of one built so far for routes' own URLs, by scheme and
    /// authority: routes naming the same address share one (its pool of idle connections too).
    pub fn compile(
        r: &RouteConfig,
        groups: &HashMap<String, Arc<Group>>,
        singles: &mut HashMap<String, Arc<Group>>,
        workers: usize,
    ) -> Result<Route, String> {
        let name: Arc<str> = Arc::from(r.name.as_str());
        let limits: Vec<Arc<CompiledLimit>> = r
            .limits
            .iter()
            .map(|l| Arc::new(CompiledLimit::compile(&name, l)))
            .collect();
        let (target, base_path) = match &r.upstream {
            None => match &r.redirect {
                Some(redirect) => (Target::Redirect(redirect.clone()), String::new()),
                None => return Err("a route needs an upstream (or a redirect)".to_owned()),
            },
            Some(UpstreamRef::Url(url)) if url.scheme == http::uri::Scheme::HTTP => (
                Target::Url {
                    url: url.clone(),
                    host: HeaderValue::from_str(url.authority.as_str())
                        .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
                    addr: url.host_port(),
                    single: single(singles, url, workers)?,
                },
                url.base_path.clone(),
            ),
            Some(UpstreamRef::Url(url)) => (
                Target::Group(single(singles, url, workers)?),
                url.base_path.clone(),
            ),
            Some(UpstreamRef::Group(g)) => (
                Target::Group(
                    groups
                        .get(g)
                        .cloned()
                        .ok_or_else(|| format!("no [[upstreams]] group is named {g:?}"))?,
                ),
                String::new(),
            ),
        };
        Ok(Route {
            metrics: RouteMetrics::new(&name),
            name,
            position: 0,
            path_prefix: r.path_prefix.clone(),
            host: r.host.clone(),
            methods: r.methods.clone(),
            strip_prefix: r.strip_prefix,
            preserve_host: r.preserve_host,
            target,
            base_path,
            timeout: r.timeout,
            max_body_size: r.max_body_size,
            max_json_bytes: r.max_json_bytes,
            json_paths: Box::default(),
            rate_limit_headers: r.rate_limit_headers,
            case_sensitive: r.case_sensitive,
            limits,
            consumers: r.consumers,
            usage: r.usage,
            plan_limits: Vec::new(),
            hyper_only: false,
            fronting: r.fronting.clone(),
            access: r.access.clone(),
            jwt: r.jwt,
            client_cert_required: r.client_cert_required,
            refusal: r.refusal.clone(),
            compression: r.compression.clone(),
            limit_rate: r.limit_rate,
        })
    }

    /// The path to send upstream for a (normalised) request path: rewritten when the route's
    /// `rewrite` matches (`Err` when the result is not a normalised path), else with the prefix
    /// stripped under `strip_prefix`; behind the upstream URL's base path either way.
    pub fn forwarded_path(
        &self,
        path: &str,
        params: crate::path::PathParams,
    ) -> Result<String, crate::fronting::rewrite::NotNormal> {
        if let Some(rw) = &self.fronting.rewrite {
            if let Some(p) = rw.apply(path, params)? {
                let mut out = String::with_capacity(self.base_path.len() + p.len());
                out.push_str(&self.base_path);
                out.push_str(&p);
                return Ok(out);
            }
        }
        Ok(self.upstream_path(path))
    }

    /// The path to send upstream for a (normalised) request path.
    pub fn upstream_path(&self, path: &str) -> String {
        let rest = if self.strip_prefix && self.path_prefix != "/" {
            &path[self.path_prefix.len().min(path.len())..]
        } else {
            path
        };
        let mut out = String::with_capacity(self.base_path.len() + rest.len() + 1);
        out.push_str(&self.base_path);
        if !rest.starts_with('/') {
            out.push('/');
        }
        out.push_str(rest);
        out
    }
}

/// The host a request is routed by, from a `Host` value or an authority: without the port and
/// one trailing dot (`example.com.` is `example.com`, as in DNS), lower case. `None` when it is
/// not an authority.
pub fn route_host(authority: &str) -> Option<String> {
    if let Some(h) = plain_host(authority) {
        // What nearly every request sends: no parse, no copy but the result.
        return Some(without_dot(h).to_owned());
    }
    let authority: http::uri::Authority = authority.parse().ok()?;
    Some(without_dot(authority.host()).to_ascii_lowercase())
}

fn without_dot(h: &str) -> &str {
    h.strip_suffix('.').filter(|h| !h.is_empty()).unwrap_or(h)
}

/// The host of an authority that is a lower-case name or IPv4 address (`a-z`, `0-9`, `-`,
/// `.`), with or without a port of 1 to 5 digits: one `http::uri::Authority` takes as it is,
/// with that host. `None` for anything else (upper case, IPv6, user info, …), which goes
/// through the full parse.
fn plain_host(authority: &str) -> Option<&str> {
    let (host, port) = match authority.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    let name = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    let plain = !host.is_empty()
        && host.bytes().all(name)
        && port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    plain.then_some(host)
}

/// One segment trie, stored flat (see the module comment).
#[derive(Debug, Default)]
struct Trie {
    /// The routes of `/`, which matches every path.
    root: Routes,
    /// Every other node by its path, the inner nodes on the way to a prefix included (with no
    /// routes) so that a walk stops at the first segment no route continues with.
    nodes: HashMap<Box<str>, Routes, Seeded>,
    /// The nodes of routes with `case_sensitive = false`, by their lower-case path; walked with
    /// the request path in lower case, and only when there are any.
    folded: HashMap<Box<str>, Routes, Seeded>,
}

/// The tries' hasher: seeded per map (a client chooses the paths looked up), and a few times
/// cheaper than SipHash on short strings.
type Seeded = foldhash::fast::RandomState;

/// Indices into [`RouteTable::routes`] of the routes ending at a node, in table order: with
/// `methods` first, then config order. Usually one.
type Routes = SmallVec<[usize; 1]>;

/// Where `path` may be cut into a node's path: before each `/` and at its end. Cutting the
/// whole string keeps the old rule exact for any prefix `p` but `/`: `p` matches `path` when
/// `path` is `p` or starts with `p` followed by `/`, that is when `p` is one of these cuts.
fn cuts(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(|(i, _)| i)
        .chain(std::iter::once(path.len()))
        .filter_map(|end| path.get(..end))
}

impl Trie {
    fn insert(&mut self, prefix: &str, case_sensitive: bool, route: usize) {
        if prefix == "/" {
            self.root.push(route);
            return;
        }
        let nodes = if case_sensitive {
            &mut self.nodes
        } else {
            &mut self.folded
        };
        for node in cuts(prefix) {
            if !nodes.contains_key(node) {
                nodes.insert(Box::from(node), Routes::new());
            }
        }
        if let Some(routes) = nodes.get_mut(prefix) {
            routes.push(route);
        }
    }
}

/// The group of one for a route's own URL: the one already built for the same scheme and
/// authority, else a new one (named by that authority, as the access log names the server).
fn single(
    singles: &mut HashMap<String, Arc<Group>>,
    url: &UpstreamUrl,
    workers: usize,
) -> Result<Arc<Group>, String> {
    let key = format!("{}://{}", url.scheme, url.authority);
    if let Some(g) = singles.get(&key) {
        return Ok(Arc::clone(g));
    }
    let g = Arc::new(Group::single(url.authority.as_str(), url, workers)?);
    singles.insert(key, Arc::clone(&g));
    Ok(g)
}

/// All routes of a snapshot, most specific first, indexed for lookup.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Most specific first (the matching order; see the module comment).
    routes: Vec<Route>,
    /// The tries of routes with a `host`, by host.
    by_host: HashMap<Box<str>, Trie, Seeded>,
    /// The trie of routes without a `host`.
    any_host: Trie,
}

impl RouteTable {
    pub fn new(
        routes: &[RouteConfig],
        groups: &HashMap<String, Arc<Group>>,
        workers: usize,
    ) -> Result<RouteTable, ConfigError> {
        let mut compiled = Vec::with_capacity(routes.len());
        let mut singles = HashMap::new();
        for (i, r) in routes.iter().enumerate() {
            let route = Route::compile(r, groups, &mut singles, workers).map_err(|message| {
                ConfigError::Invalid {
                    field: format!("routes[{i}].upstream"),
                    message,
                }
            })?;
            compiled.push(Route {
                position: i,
                ..route
            });
        }
        let mut routes = compiled;
        // Stable: routes equal on all three keys keep their config order.
        routes.sort_by_key(|r| {
            (
                std::cmp::Reverse(r.path_prefix.len()),
                r.host.is_none(),
                r.methods.is_none(),
            )
        });
        let mut by_host: HashMap<Box<str>, Trie, Seeded> = HashMap::default();
        let mut any_host = Trie::default();
        for (i, r) in routes.iter().enumerate() {
            let trie = match &r.host {
                Some(h) => by_host.entry(Box::from(h.as_str())).or_default(),
                None => &mut any_host,
            };
            // Inserted in table order, so each node lists its routes with `methods` first.
            trie.insert(&r.path_prefix, r.case_sensitive, i);
        }
        Ok(RouteTable {
            routes,
            by_host,
            any_host,
        })
    }

    /// The route for a request; `host` is the request's host without port, lower-case.
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&Route> {
        let hosted = host
            .and_then(|h| self.by_host.get(h))
            .and_then(|trie| self.longest(trie, method, path));
        let any = self.longest(&self.any_host, method, path);
        match (hosted, any) {
            // Among equal prefixes the route with a host comes first.
            (Some(h), Some(a)) if a.path_prefix.len() > h.path_prefix.len() => Some(a),
            (Some(h), _) => Some(h),
            (None, a) => a,
        }
    }

    /// In one trie, the route with the longest prefix matching `path` that accepts `method`
    /// (among equal prefixes, the first in table order).
    fn longest(&self, trie: &Trie, method: &Method, path: &str) -> Option<&Route> {
        let mut best = self.first_accepting(&trie.root, method);
        self.walk(&trie.nodes, method, path, &mut best);
        if !trie.folded.is_empty() {
            self.walk(&trie.folded, method, &path.to_ascii_lowercase(), &mut best);
        }
        best.map(|(_, r)| r)
    }

    /// Walks `path`'s cuts down `nodes`, keeping in `best` the longest accepting route.
    fn walk<'a>(
        &'a self,
        nodes: &HashMap<Box<str>, Routes, Seeded>,
        method: &Method,
        path: &str,
        best: &mut Option<(usize, &'a Route)>,
    ) {
        for node in cuts(path) {
            let Some(routes) = nodes.get(node) else {
                break;
            };
            if let Some((i, r)) = self.first_accepting(routes, method) {
                // Deeper is longer, except `` (the first cut) under `/` (the root), which only a
                // hand-made prefix can be: compare lengths as the order says, and among equal
                // lengths the table order (a case-sensitive and a folded route may tie).
                let better = best.is_none_or(|(j, b)| {
                    let (len, best_len) = (r.path_prefix.len(), b.path_prefix.len());
                    len > best_len || (len == best_len && i < j)
                });
                if better {
                    *best = Some((i, r));
                }
            }
        }
    }

    fn first_accepting(&self, routes: &Routes, method: &Method) -> Option<(usize, &Route)> {
        routes
            .iter()
            .filter_map(|&i| Some((i, self.routes.get(i)?)))
            .find(|(_, r)| r.methods.as_ref().is_none_or(|ms| ms.contains(method)))
    }

    /// Every route, most specific first.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter()
    }

    /// Every route, mutably (while a snapshot is being built).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Route> {
        self.routes.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_host_shortcut_agrees_with_the_full_parse() {
        let full = |a: &str| -> Option<String> {
            let authority: http::uri::Authority = a.parse().ok()?;
            Some(without_dot(authority.host()).to_ascii_lowercase())
        };
        let mut cases: Vec<String> = [
            "example.com",
            "example.com.",
            "example.com:8080",
            "a",
            ".",
            "-",
            "..",
            "1.2.3.4",
            "1.2.3.4:1",
            "x:65535",
            "x:99999",
            "x:0",
            "x:080",
            "api-v2.example.com.:443",
            "EXAMPLE.com",
            "ex_ample.com",
            "[::1]:80",
            "user@host",
            "host:",
            ":80",
            "",
            "host:80:80",
            "host:123456",
            "h%41",
            "a b",
            "a.b.",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every short string over an alphabet of what matters here.
        let alphabet = ['a', 'Z', '0', '-', '.', ':', '_', '@', '['];
        for n in 1..=4u32 {
            for k in 0..alphabet.len().pow(n) {
                let mut s = String::new();
                let mut k = k;
                for _ in 0..n {
                    s.push(alphabet[k % alphabet.len()]);
                    k /= alphabet.len();
                }
                cases.push(s);
            }
        }
        for a in &cases {
            if let Some(h) = plain_host(a) {
                assert_eq!(Some(without_dot(h).to_owned()), full(a), "{a:?}");
            }
            assert_eq!(route_host(a), full(a), "{a:?}");
        }
    }
    use crate::config::Config;

    fn table(toml: &str) -> RouteTable {
        let c = Config::parse(toml, std::path::Path::new(".")).unwrap();
        RouteTable::new(&c.routes, &HashMap::new(), 1).unwrap()
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

    /// The lookup as it was before the trie: a linear scan over the routes sorted most specific
    /// first. The differential test holds the trie to it.
    fn linear_find<'a>(
        routes: &[&'a Route],
        host: Option<&str>,
        method: &Method,
        path: &str,
    ) -> Option<&'a Route> {
        let mut sorted = routes.to_vec();
        sorted.sort_by_key(|r| {
            (
                std::cmp::Reverse(r.path_prefix.len()),
                r.host.is_none(),
                r.methods.is_none(),
            )
        });
        let prefix_matches = |p: &str| {
            p == "/"
                || path == p
                || (path.starts_with(p) && path.as_bytes().get(p.len()) == Some(&b'/'))
        };
        sorted.into_iter().find(|r| {
            prefix_matches(&r.path_prefix)
                && r.host.as_deref().is_none_or(|h| Some(h) == host)
                && r.methods.as_ref().is_none_or(|ms| ms.contains(method))
        })
    }

    /// xorshift64*: reproducible random route sets without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % n as u64).unwrap()
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[self.below(xs.len())]
        }
    }

    const SEGMENTS: &[&str] = &["api", "v1", "a", "apix", "v10"];
    const HOSTS: &[&str] = &["a.example", "b.example"];

    fn random_path(rng: &mut Rng, empty_segments: bool) -> String {
        let mut p = String::new();
        for _ in 0..rng.below(4) {
            p.push('/');
            if empty_segments && rng.below(8) == 0 {
                continue;
            }
            p.push_str(rng.pick(SEGMENTS));
        }
        if p.is_empty() || rng.below(4) == 0 {
            p.push('/');
        }
        p
    }

    /// Random route sets (with `/`, trailing-slash prefixes the config trims, hosts, methods),
    /// looked up with random hosts, methods and paths (trailing slashes, `//`, unknown hosts):
    /// the trie finds the very route the linear scan finds.
    #[test]
    fn trie_lookup_agrees_with_the_linear_scan() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let method_sets = [
            "",
            "methods = [\"GET\"]",
            "methods = [\"post\"]",
            "methods = [\"GET\", \"POST\"]",
        ];
        let (mut lookups, mut matched, mut host_won) = (0, 0, 0);
        for _ in 0..400 {
            let mut toml = String::new();
            let mut keys = std::collections::HashSet::new();
            for i in 0..1 + rng.below(24) {
                let prefix = random_path(&mut rng, false);
                let host = (rng.below(3) == 0).then(|| rng.pick(HOSTS));
                let methods = rng.pick(&method_sets);
                let trimmed = if prefix.len() > 1 {
                    prefix.trim_end_matches('/').to_owned()
                } else {
                    prefix.clone()
                };
                if !keys.insert((trimmed, host, methods)) {
                    continue;
                }
                let host = host.map_or(String::new(), |h| format!("host = \"{h}\""));
                toml += &route(&format!("r{i}"), &prefix, &format!("{host}\n{methods}"));
            }
            let t = table(&toml);
            let all: Vec<&Route> = t.iter().collect();
            for _ in 0..60 {
                let path = random_path(&mut rng, true);
                let host = match rng.below(4) {
                    0 => None,
                    1 => Some("c.example"),
                    _ => Some(rng.pick(HOSTS)),
                };
                let method = [Method::GET, Method::POST, Method::DELETE][rng.below(3)].clone();
                let want = linear_find(&all, host, &method, &path).map(|r| &*r.name);
                let got = t.find(host, &method, &path).map(|r| &*r.name);
                assert_eq!(got, want, "{host:?} {method} {path:?} in\n{toml}");
                lookups += 1;
                matched += usize::from(want.is_some());
                host_won += usize::from(
                    t.find(host, &method, &path)
                        .is_some_and(|r| r.host.is_some()),
                );
            }
        }
        // The sets exercise both outcomes and the host tries, not only misses.
        assert!(
            matched > lookups / 3 && matched < lookups,
            "{matched}/{lookups}"
        );
        assert!(host_won > lookups / 20, "{host_won}/{lookups}");
    }

    /// The old order, spelled out: a longer host-less prefix beats a shorter one with a host;
    /// at equal prefixes the host wins, and a route with methods beats one without.
    #[test]
    fn a_longer_prefix_beats_a_host_and_a_host_beats_methods() {
        let t = table(
            &(route("host-api", "/api", "host = \"a.example\"")
                + &route("v1", "/api/v1/", "")
                + &route("get-api", "/api", "methods = [\"GET\"]")
                + &route("root", "/", "host = \"a.example\"")),
        );
        let a = Some("a.example");
        assert_eq!(find(&t, a, Method::GET, "/api/v1/x"), Some("v1"));
        assert_eq!(find(&t, a, Method::GET, "/api/v1/"), Some("v1"));
        assert_eq!(find(&t, a, Method::GET, "/api/x"), Some("host-api"));
        assert_eq!(find(&t, None, Method::GET, "/api/x"), Some("get-api"));
        assert_eq!(find(&t, None, Method::POST, "/api/x"), None);
        assert_eq!(find(&t, a, Method::POST, "/apix"), Some("root"));
        assert_eq!(find(&t, a, Method::POST, "/api//v1"), Some("host-api"));
    }

    /// Routes anywhere in a 10,000-route table are found by their paths, the others fall through.
    #[test]
    fn many_routes_each_found_by_its_prefix() {
        let mut toml = route("root", "/", "");
        for i in 0..10_000 {
            toml += &route(&format!("svc{i}"), &format!("/svc{i}/api"), "");
        }
        let t = table(&toml);
        for i in [0, 1, 4_999, 9_999] {
            let name = format!("svc{i}");
            let path = format!("/svc{i}/api/users/7");
            assert_eq!(find(&t, None, Method::GET, &path), Some(name.as_str()));
        }
        assert_eq!(find(&t, None, Method::GET, "/svc10000/api"), Some("root"));
        assert_eq!(find(&t, None, Method::GET, "/svc7/apix"), Some("root"));
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
