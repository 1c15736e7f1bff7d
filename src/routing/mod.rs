//! Routes: what a route matches and where it sends its requests ([`Route`]), and the table that
//! finds a request's route ([`RouteTable`], in `table`), at a cost that does not grow with the
//! number of routes.

mod host;
mod matching;
mod table;
mod trie;

pub use host::route_host;
pub use matching::{host_label, shadowed, Capture, PathKind, Shape};
pub use table::{Candidate, RouteTable};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method};

use crate::config::{RouteConfig, UpstreamRef, UpstreamUrl};
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
    /// `/` for a route without one (it matches every path, or its other path matcher decides).
    pub path_prefix: String,
    /// The route's other matchers (exact, regex or template path, hosts, headers, query,
    /// priority).
    pub matching: crate::config::route_match::RouteMatch,
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
    pub limit_rate: Option<crate::http::pacing::Pace>,
    /// `[routes.cache]` (`None`: the route caches nothing).
    pub cache: Option<Box<crate::cache::RouteCache>>,
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
        let cache = r.cache.as_ref().map(|c| {
            Box::new(crate::cache::RouteCache {
                config: c.clone(),
                counts: crate::metrics::CacheCounters::new(&name),
            })
        });
        Ok(Route {
            metrics: RouteMetrics::new(&name),
            name,
            position: 0,
            path_prefix: r.path_prefix.clone(),
            matching: r.matching.clone(),
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
            cache,
        })
    }

    /// The path to send upstream for a (normalised) request path: rewritten when the route's
    /// `rewrite` matches (`Err` when the result is not a normalised path), else with the prefix
    /// stripped under `strip_prefix`; behind the upstream URL's base path either way.
    pub fn forwarded_path(
        &self,
        path: &str,
        params: crate::http::path::PathParams,
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
