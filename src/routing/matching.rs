//! One route against one request, matcher by matcher, and the order among routes that match.
//!
//! The table ([`super::RouteTable`]) finds candidates through its indexes and asks a route only
//! what the index did not decide; [`Route::refusal`] asks everything, in a fixed order, and is
//! both what `explain` shows and the reference the table's differential test holds it to.
//!
//! The order (documented in the manual's routing page): a route's `priority` (higher first);
//! then the most specific host that matched (exact, then the wildcard with most labels, a
//! one-label `{name}` before `*`, then a route without hosts); then the path matcher's kind (an
//! exact `path`, then templates with most literal segments first, then regexes in file order,
//! then prefixes, longest first); then a route with `methods`; then most header matchers; then
//! most query matchers; then file order.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::HashMap;

use http::Method;

use crate::config::route_match::HostPattern;
use crate::http::head::RequestHead;

use super::Route;

/// The kind of a route's path matcher, in precedence order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathKind {
    Exact,
    Template,
    Regex,
    Prefix,
}

/// A route's rank among all routes, but for the host (which depends on the request).
pub(super) type OrderKey = (
    Reverse<i32>,
    PathKind,
    i64,
    bool,
    Reverse<usize>,
    Reverse<usize>,
    usize,
);

/// The precedence of a host pattern (lower first); [`ANY_HOST`] for a route without hosts.
pub(super) fn host_rank(h: &HostPattern) -> u32 {
    match h {
        HostPattern::Exact(_) => 0,
        HostPattern::Wildcard { suffix, name } => {
            let labels = u32::try_from(suffix.split('.').count())
                .unwrap_or(255)
                .min(255);
            1 + (255 - labels) * 2 + u32::from(name.is_none())
        }
    }
}

/// The host rank of a route without hosts: after every host.
pub(super) const ANY_HOST: u32 = u32::MAX;

/// What a route matches, borrowed from a compiled [`Route`] or from its config (so `check`
/// can rank and compare routes without building their upstreams).
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub name: &'a str,
    pub position: usize,
    pub path_prefix: &'a str,
    pub matching: &'a crate::config::route_match::RouteMatch,
    pub methods: Option<&'a [Method]>,
    pub case_sensitive: bool,
}

impl<'a> Shape<'a> {
    /// A route's config, at `position` in the file.
    pub fn of_config(r: &'a crate::config::RouteConfig, position: usize) -> Shape<'a> {
        Shape {
            name: &r.name,
            position,
            path_prefix: &r.path_prefix,
            matching: &r.matching,
            methods: r.methods.as_deref(),
            case_sensitive: r.case_sensitive,
        }
    }
}

/// Routes that can never match, each with the route ranked before it that takes every request
/// it would (by name): a conservative test (`tollgate check` warns of them).
///
/// At equal priority a route can only be shadowed by one with the very same path matcher (the
/// kinds rank exact, template, regex, prefix, and a route of a later kind or a shorter prefix
/// never ranks first); so each route is compared with the routes of its own path matcher and
/// priority, and with every route of a higher priority — all of them while those comparisons
/// stay under [`MAX_SHADOW_PAIRS`], which a config of thousands of prioritised routes passes
/// (then only the first kind of comparison is made).
pub fn shadowed<'a>(routes: &[Shape<'a>]) -> Vec<(&'a str, &'a str)> {
    let mut sorted: Vec<Shape<'a>> = routes.to_vec();
    sorted.sort_by_key(Shape::order_key);
    let mut by_path: HashMap<(i32, String), Vec<usize>> = HashMap::new();
    for (i, r) in sorted.iter().enumerate() {
        by_path
            .entry((r.matching.priority, r.path_key()))
            .or_default()
            .push(i);
    }
    // Routes are sorted by priority first: those of a higher priority than `b` come before
    // the first route of `b`'s priority.
    let higher = |j: usize| {
        let p = sorted.get(j).map_or(0, |b| b.matching.priority);
        sorted
            .iter()
            .take(j)
            .take_while(|a| a.matching.priority > p)
            .count()
    };
    let pairs: usize = (0..sorted.len()).map(higher).fold(0, usize::saturating_add);
    let across = pairs <= MAX_SHADOW_PAIRS;
    let mut out = Vec::new();
    for (j, b) in sorted.iter().enumerate() {
        let same = by_path
            .get(&(b.matching.priority, b.path_key()))
            .into_iter()
            .flatten()
            .take_while(|&&i| i < j)
            .filter_map(|&i| sorted.get(i));
        let above = sorted.iter().take(if across { higher(j) } else { 0 });
        if let Some(a) = above.chain(same).find(|a| a.covers(b)) {
            out.push((b.name, a.name));
        }
    }
    out
}

/// The most route pairs of different priorities `shadowed` compares.
pub const MAX_SHADOW_PAIRS: usize = 10_000_000;

impl Route {
    /// What the route matches, borrowed.
    pub fn shape(&self) -> Shape<'_> {
        Shape {
            name: &self.name,
            position: self.position,
            path_prefix: &self.path_prefix,
            matching: &self.matching,
            methods: self.methods.as_deref(),
            case_sensitive: self.case_sensitive,
        }
    }

    /// The kind of the route's path matcher.
    pub fn path_kind(&self) -> PathKind {
        self.shape().path_kind()
    }

    /// The route's rank but for the host (see the module comment).
    pub(super) fn order_key(&self) -> OrderKey {
        self.shape().order_key()
    }

    /// The route's path matchers as text (`= /login`, `/api*`, `~ /v[0-9]+`, `/users/{id}`).
    pub fn path_text(&self) -> String {
        self.shape().path_text()
    }
}

impl<'a> Shape<'a> {
    /// The kind of the route's path matcher.
    pub fn path_kind(&self) -> PathKind {
        let m = self.matching;
        if m.path.is_some() {
            PathKind::Exact
        } else if m.path_template.is_some() {
            PathKind::Template
        } else if m.path_regex.is_some() {
            PathKind::Regex
        } else {
            PathKind::Prefix
        }
    }

    /// The route's rank but for the host (see the module comment).
    pub fn order_key(&self) -> OrderKey {
        let kind = self.path_kind();
        let within = match kind {
            PathKind::Exact => 0,
            PathKind::Template => self
                .matching
                .path_template
                .as_ref()
                .map_or(0, |t| -(i64::try_from(t.literals()).unwrap_or(0))),
            PathKind::Regex => i64::try_from(self.position).unwrap_or(i64::MAX),
            PathKind::Prefix => -(i64::try_from(self.path_prefix.len()).unwrap_or(0)),
        };
        (
            Reverse(self.matching.priority),
            kind,
            within,
            self.methods.is_none(),
            Reverse(self.matching.headers.len()),
            Reverse(self.matching.query.len()),
            self.position,
        )
    }

    /// The path matcher's kind and text, as a key: routes with the same key match the same
    /// paths (given the same case rule).
    fn path_key(&self) -> String {
        let text = match self.path_kind() {
            // A regex narrowed by a prefix is covered by the same regex narrowed less.
            PathKind::Regex => self
                .matching
                .path_regex
                .as_ref()
                .map_or(String::new(), |r| r.text.clone()),
            _ => self.path_text(),
        };
        // In lower case: a folding route covers a case-sensitive one of any spelling of its text
        // (`covers` tells the rest apart).
        format!("{:?}{}", self.path_kind(), text.to_ascii_lowercase())
    }

    /// The route's path matchers as text.
    pub fn path_text(&self) -> String {
        let m = self.matching;
        match self.path_kind() {
            PathKind::Exact => format!("= {}", m.path.as_deref().unwrap_or("")),
            PathKind::Template => m
                .path_template
                .as_ref()
                .map_or(String::new(), |t| t.text.clone()),
            PathKind::Regex => {
                let re = m.path_regex.as_ref().map_or("", |r| r.text.as_str());
                if m.prefix_given {
                    format!("{}* ~ {re}", self.path_prefix)
                } else {
                    format!("~ {re}")
                }
            }
            PathKind::Prefix => format!("{}*", self.path_prefix),
        }
    }
}

impl Route {
    /// Whether `method` is one of the route's (or the route takes every method).
    pub fn accepts_method(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|ms| ms.contains(method))
    }

    /// Whether the request's headers and query pass every matcher of the route.
    pub fn fields_pass(&self, head: &impl RequestHead) -> bool {
        self.first_failing_field(head).is_none()
    }

    /// The first header or query matcher the request fails, as text.
    fn first_failing_field(&self, head: &impl RequestHead) -> Option<String> {
        for m in self.matching.headers.iter() {
            if !m.test.passes(head.header_values(&m.name)) {
                return Some(format!("header {} {}", m.name, m.test.describe()));
            }
        }
        for m in self.matching.query.iter() {
            let values = head.query().into_iter().flat_map(|q| {
                crate::subject::fields::query_params(q, &m.name)
                    .map(crate::subject::fields::decode_query_value)
            });
            if !m.test.passes(values) {
                return Some(format!("query {} {}", m.name, m.test.describe()));
            }
        }
        None
    }

    /// Whether the path `path_prefix` names matches (segment-aware; `lower`: the path in lower
    /// case, for a `case_sensitive = false` route).
    fn prefix_matches(&self, path: &str, lower: &str) -> bool {
        let p = &self.path_prefix;
        let path = if self.case_sensitive { path } else { lower };
        p == "/"
            || path == p
            || (path.starts_with(p.as_str()) && path.as_bytes().get(p.len()) == Some(&b'/'))
    }

    /// Whether the route's residual path matcher passes: the `path_prefix` a `path_regex` is
    /// narrowed by (the table's indexes decide every other path matcher).
    pub(super) fn residual_path(&self, path: &str, lower: &str) -> bool {
        !(self.matching.prefix_given && self.matching.path_regex.is_some())
            || self.prefix_matches(path, lower)
    }

    /// The best rank among the route's hosts that match `host`; `None` when none does.
    pub(super) fn host_rank_for(&self, host: Option<&str>) -> Option<u32> {
        if self.matching.hosts.is_empty() {
            return Some(ANY_HOST);
        }
        let host = host?;
        self.matching
            .hosts
            .iter()
            .filter(|h| h.matches(host))
            .map(host_rank)
            .min()
    }

    /// Why the route does not take a request, as text naming the matcher that refused it
    /// (`None`: it takes it). Matchers are asked in the order host, path, method, headers,
    /// query. `path` is the normalised path.
    pub fn refusal(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
        head: &impl RequestHead,
    ) -> Option<String> {
        if self.host_rank_for(host).is_none() {
            let hosts: Vec<String> = self.matching.hosts.iter().map(HostPattern::text).collect();
            return Some(format!("host: not {}", hosts.join(" | ")));
        }
        let lower: Cow<'_, str> = if self.case_sensitive {
            Cow::Borrowed(path)
        } else {
            Cow::Owned(path.to_ascii_lowercase())
        };
        let m = &self.matching;
        let path_ok = match self.path_kind() {
            PathKind::Exact => m.path.as_deref() == Some(&*lower),
            PathKind::Template => m
                .path_template
                .as_ref()
                .is_some_and(|t| t.matches(path, !self.case_sensitive)),
            PathKind::Regex => {
                m.path_regex
                    .as_ref()
                    .is_some_and(|r| r.regex.is_match(path))
                    && self.prefix_matches(path, &lower)
            }
            PathKind::Prefix => self.prefix_matches(path, &lower),
        };
        if !path_ok {
            return Some(format!("path: not {}", self.path_text()));
        }
        if !self.accepts_method(method) {
            let ms: Vec<&str> = self.methods.iter().flatten().map(Method::as_str).collect();
            return Some(format!("method: not {}", ms.join(" | ")));
        }
        self.first_failing_field(head)
    }

    /// The route's captures of a request (template segments by name, a `{name}` host label by
    /// name), for `path:NAME` and `host:NAME` subject parts and `${path.NAME}` in header rules.
    pub fn capture<'r>(
        &self,
        which: Capture<'_>,
        host: Option<&'r str>,
        path: &'r str,
    ) -> Option<&'r str> {
        match which {
            Capture::Path(name) => {
                let t = self.matching.path_template.as_ref()?;
                let caps = t.captures(path, !self.case_sensitive)?;
                caps.into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
            }
            Capture::Host(name) => {
                let host = host?;
                self.matching.hosts.iter().find_map(|h| match h {
                    HostPattern::Wildcard {
                        suffix,
                        name: Some(n),
                    } if &**n == name && h.matches(host) => host
                        .strip_suffix(suffix.as_str())
                        .and_then(|l| l.strip_suffix('.')),
                    _ => None,
                })
            }
        }
    }
}

impl Shape<'_> {
    /// Whether this route, ranked before `b`, takes every request `b` would: then `b` never
    /// matches. Conservative: `false` whenever it is not plain from the matchers' text.
    pub fn covers(&self, b: &Shape<'_>) -> bool {
        let a = self;
        let (pa, pb) = (a.matching.priority, b.matching.priority);
        if pa < pb {
            return false;
        }
        let hosts_ok = if a.matching.hosts.is_empty() {
            b.matching.hosts.is_empty() || pa > pb
        } else if pa > pb {
            !b.matching.hosts.is_empty()
                && b.matching
                    .hosts
                    .iter()
                    .all(|h| a.matching.hosts.iter().any(|g| h.within(g)))
        } else {
            // Equal priority: b's host would rank b first unless a has the very same pattern.
            !b.matching.hosts.is_empty()
                && b.matching
                    .hosts
                    .iter()
                    .all(|h| a.matching.hosts.contains(h))
        };
        if !hosts_ok || !a.covers_path(b) {
            return false;
        }
        let methods_ok = match (a.methods, b.methods) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(x), Some(y)) => y.iter().all(|m| x.contains(m)),
        };
        methods_ok
            && a.matching.headers.iter().all(|h| {
                b.matching
                    .headers
                    .iter()
                    .any(|g| g.name == h.name && g.test.same(&h.test))
            })
            && a.matching.query.iter().all(|q| {
                b.matching
                    .query
                    .iter()
                    .any(|g| g.name.eq_ignore_ascii_case(&q.name) && g.test.same(&q.test))
            })
    }

    /// Whether every path `b` matches, this route's path matchers match.
    fn covers_path(&self, b: &Shape<'_>) -> bool {
        let (a, ma, mb) = (self, self.matching, b.matching);
        // A case-sensitive matcher does not take the other spellings a folding one does.
        let case_ok = !a.case_sensitive || b.case_sensitive;
        let under = |p: &str, q: &str| {
            p == "/" || q == p || (q.starts_with(p) && q.as_bytes().get(p.len()) == Some(&b'/'))
        };
        let fold = |s: &str| {
            if a.case_sensitive {
                s.to_owned()
            } else {
                s.to_ascii_lowercase()
            }
        };
        match (a.path_kind(), b.path_kind()) {
            (PathKind::Prefix, _) if a.path_prefix == "/" => true,
            (PathKind::Prefix, PathKind::Prefix) => {
                case_ok && under(a.path_prefix, &fold(b.path_prefix))
            }
            (PathKind::Prefix, PathKind::Exact) => {
                case_ok
                    && mb
                        .path
                        .as_deref()
                        .is_some_and(|e| under(a.path_prefix, &fold(e)))
            }
            (PathKind::Prefix, PathKind::Regex) => {
                case_ok && mb.prefix_given && under(a.path_prefix, &fold(b.path_prefix))
            }
            (PathKind::Exact, PathKind::Exact) => {
                case_ok && ma.path.as_deref().map(&fold) == mb.path.as_deref().map(&fold)
            }
            (PathKind::Template, PathKind::Template) => {
                a.case_sensitive == b.case_sensitive
                    && ma.path_template.as_ref().map(|t| &t.segs)
                        == mb.path_template.as_ref().map(|t| &t.segs)
            }
            (PathKind::Template, PathKind::Exact) => {
                case_ok
                    && ma
                        .path_template
                        .as_ref()
                        .zip(mb.path.as_deref())
                        .is_some_and(|(t, e)| t.matches(e, !a.case_sensitive))
            }
            (PathKind::Regex, PathKind::Regex) => {
                a.case_sensitive == b.case_sensitive
                    && ma.path_regex.as_ref().map(|r| &r.text)
                        == mb.path_regex.as_ref().map(|r| &r.text)
                    && (!ma.prefix_given
                        || (mb.prefix_given && under(a.path_prefix, b.path_prefix)))
            }
            (PathKind::Regex, PathKind::Exact) => {
                case_ok
                    && ma
                        .path_regex
                        .as_ref()
                        .zip(mb.path.as_deref())
                        .is_some_and(|(r, e)| r.regex.is_match(e))
                    && (!ma.prefix_given
                        || mb
                            .path
                            .as_deref()
                            .is_some_and(|e| under(a.path_prefix, &fold(e))))
            }
            _ => false,
        }
    }
}

/// Which capture of a route (see [`Route::capture`]).
#[derive(Debug, Clone, Copy)]
pub enum Capture<'n> {
    Path(&'n str),
    Host(&'n str),
}

/// The `n`-th label of a host from the left (1-based): `host:1` of `acme.api.example.com` is
/// `acme`.
pub fn host_label(host: &str, n: usize) -> Option<&str> {
    host.split('.')
        .nth(n.checked_sub(1)?)
        .filter(|l| !l.is_empty())
}
