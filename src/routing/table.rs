//! The route table: every route of a snapshot, in precedence order, indexed so that finding a
//! request's route costs the same with one route or ten thousand.
//!
//! Shape: routes are grouped into host buckets — one per exact host (a hash map), one per
//! wildcard suffix (a hash map from `example.com` to the buckets of `*.example.com` and
//! `{name}.example.com`, looked up once per label of the request's host), and one for routes
//! without hosts. In a bucket, exact paths sit in a hash map, prefixes in a flat segment trie,
//! templates in a segment trie, and the regexes in one `RegexSet`. A lookup asks each bucket
//! the request's host reaches for its best route: the candidates its indexes give, in rank
//! order, checked for what the indexes do not decide (methods, headers, query, the prefix
//! narrowing a regex). The winner is the best of the buckets' by (priority, host rank, rank).
//! A route's index in [`RouteTable::routes`] is its rank (see [`super::matching`]), so the
//! comparisons are integer ones. The table is built once per config snapshot and read without
//! locks.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use http::Method;
use smallvec::SmallVec;

use super::matching::{host_rank, ANY_HOST};
use super::trie::{PrefixTrie, Routes, Seeded, TemplateTrie};
use super::Route;
use crate::config::route_match::HostPattern;
use crate::config::{ConfigError, RouteConfig};
use crate::http::head::RequestHead;
use crate::upstream::Group;

/// The most bytes the regexes of one host bucket compile to, together.
const REGEX_SET_SIZE_LIMIT: usize = 256 << 20;

/// The routes of one host bucket, indexed by path matcher.
#[derive(Debug, Default)]
struct Bucket {
    /// Exact paths (`path`) of case-sensitive routes.
    exact: HashMap<Box<str>, Routes, Seeded>,
    /// Exact paths of `case_sensitive = false` routes, in lower case.
    exact_folded: HashMap<Box<str>, Routes, Seeded>,
    templates: TemplateTrie,
    templates_folded: TemplateTrie,
    /// The regex routes, in rank order, and their set (built once the bucket is full).
    regex_routes: Vec<usize>,
    regex_set: Option<regex::RegexSet>,
    prefixes: PrefixTrie,
}

/// The buckets of one wildcard suffix.
#[derive(Debug)]
struct Wild {
    /// `{name}.suffix`: one label only.
    one_label: bool,
    rank: u32,
    bucket: Bucket,
}

/// A request as the table sees it.
struct Ask<'a, H> {
    method: &'a Method,
    path: &'a str,
    lower: &'a str,
    head: &'a H,
}

/// All routes of a snapshot, in precedence order, indexed for lookup.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// In rank order (see the module comment).
    routes: Vec<Route>,
    by_host: HashMap<Box<str>, Bucket, Seeded>,
    wildcards: HashMap<Box<str>, SmallVec<[Wild; 1]>, Seeded>,
    any_host: Bucket,
    /// Bit `k` (1 to 63): some wildcard's suffix has `k` labels — only suffixes of a request's
    /// host with those label counts are looked up.
    wild_labels: u64,
    /// Some route matches in any case: the path is folded for lookups.
    folds: bool,
}

/// A route `explain` considered for a request, and what refused it (`None`: it matched).
#[derive(Debug, Clone)]
pub struct Candidate<'r> {
    pub route: &'r Route,
    pub refused: Option<String>,
}

impl Bucket {
    fn insert(&mut self, r: &Route, i: usize) {
        let m = &r.matching;
        if let Some(p) = &m.path {
            let map = if r.case_sensitive {
                &mut self.exact
            } else {
                &mut self.exact_folded
            };
            map.entry(Box::from(p.as_str())).or_default().push(i);
        } else if let Some(t) = &m.path_template {
            if r.case_sensitive {
                self.templates.insert(&t.segs, i);
            } else {
                self.templates_folded.insert(&t.segs, i);
            }
        } else if m.path_regex.is_some() {
            self.regex_routes.push(i);
        } else {
            self.prefixes.insert(&r.path_prefix, r.case_sensitive, i);
        }
    }

    fn seal(&mut self, routes: &[Route]) -> Result<(), String> {
        if self.regex_routes.is_empty() {
            return Ok(());
        }
        let patterns = self.regex_routes.iter().filter_map(|&i| {
            let r = routes.get(i)?;
            let re = r.matching.path_regex.as_ref()?;
            Some(if r.case_sensitive {
                format!("^(?:{})$", re.text)
            } else {
                format!("(?i)^(?:{})$", re.text)
            })
        });
        let set = regex::RegexSetBuilder::new(patterns)
            .size_limit(REGEX_SET_SIZE_LIMIT)
            .build()
            .map_err(|e| format!("the path regexes of one host do not compile together: {e}"))?;
        self.regex_set = Some(set);
        Ok(())
    }

    /// The best route of the bucket for `ask` (the lowest index that takes it).
    fn best<H: RequestHead>(&self, routes: &[Route], ask: &Ask<'_, H>) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut consider = |list: &Routes| {
            for &i in list {
                if best.is_some_and(|b| i >= b) {
                    return;
                }
                let Some(r) = routes.get(i) else {
                    continue;
                };
                if r.accepts_method(ask.method)
                    && r.residual_path(ask.path, ask.lower)
                    && r.fields_pass(ask.head)
                {
                    best = Some(i);
                    return;
                }
            }
        };
        if !self.exact.is_empty() {
            if let Some(l) = self.exact.get(ask.path) {
                consider(l);
            }
        }
        if !self.exact_folded.is_empty() {
            if let Some(l) = self.exact_folded.get(ask.lower) {
                consider(l);
            }
        }
        self.templates.visit(ask.path, &mut consider);
        self.templates_folded.visit(ask.lower, &mut consider);
        // `is_match` first: no allocation, and it stops as soon as no regex can match (most
        // requests); only a path some regex matches pays for the set of which ones.
        if let Some(set) = self.regex_set.as_ref().filter(|s| s.is_match(ask.path)) {
            for k in set.matches(ask.path).iter() {
                if let Some(&i) = self.regex_routes.get(k) {
                    consider(&Routes::from_elem(i, 1));
                }
            }
        }
        self.prefixes.visit(ask.path, ask.lower, &mut consider);
        best
    }
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
        routes.sort_by_key(Route::order_key);
        let mut table = RouteTable {
            folds: routes.iter().any(|r| !r.case_sensitive),
            ..RouteTable::default()
        };
        for (i, r) in routes.iter().enumerate() {
            if r.matching.hosts.is_empty() {
                table.any_host.insert(r, i);
            }
            for h in &r.matching.hosts {
                match h {
                    HostPattern::Exact(h) => table
                        .by_host
                        .entry(Box::from(h.as_str()))
                        .or_default()
                        .insert(r, i),
                    HostPattern::Wildcard { suffix, name } => {
                        let labels = suffix.split('.').count().min(63);
                        table.wild_labels |= 1u64 << labels;
                        let ws = table
                            .wildcards
                            .entry(Box::from(suffix.as_str()))
                            .or_default();
                        let one_label = name.is_some();
                        let w = match ws.iter().position(|w| w.one_label == one_label) {
                            Some(k) => &mut ws[k],
                            None => {
                                ws.push(Wild {
                                    one_label,
                                    rank: host_rank(h),
                                    bucket: Bucket::default(),
                                });
                                let last = ws.len() - 1;
                                &mut ws[last]
                            }
                        };
                        w.bucket.insert(r, i);
                    }
                }
            }
        }
        let seal = |b: &mut Bucket| {
            b.seal(&routes).map_err(|message| ConfigError::Invalid {
                field: "routes".to_owned(),
                message,
            })
        };
        seal(&mut table.any_host)?;
        for b in table.by_host.values_mut() {
            seal(b)?;
        }
        for ws in table.wildcards.values_mut() {
            for w in ws.iter_mut() {
                seal(&mut w.bucket)?;
            }
        }
        table.routes = routes;
        Ok(table)
    }

    /// The route for a request: `host` is the request's host (lower case, no port), `path` its
    /// normalised path, `head` the request as received (for header and query matchers).
    pub fn find<H: RequestHead>(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
        head: &H,
    ) -> Option<&Route> {
        let lower: Cow<'_, str> = if self.folds && path.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(path.to_ascii_lowercase())
        } else {
            Cow::Borrowed(path)
        };
        let ask = Ask {
            method,
            path,
            lower: &lower,
            head,
        };
        let mut win: Option<(Reverse<i32>, u32, usize)> = None;
        let mut consider = |b: &Bucket, rank: u32| {
            if let Some(i) = b.best(&self.routes, &ask) {
                let prio = self.routes.get(i).map_or(0, |r| r.matching.priority);
                let key = (Reverse(prio), rank, i);
                if win.is_none_or(|w| key < w) {
                    win = Some(key);
                }
            }
        };
        if let Some(h) = host {
            if let Some(b) = self.by_host.get(h) {
                consider(b, 0);
            }
            if !self.wildcards.is_empty() {
                // From the right: the suffix of 1 label, of 2, …; only counts some wildcard has.
                for (k, (dot, _)) in h.rmatch_indices('.').enumerate() {
                    let k = (k + 1).min(63);
                    if self.wild_labels & (1u64 << k) == 0 {
                        continue;
                    }
                    let (labels, suffix) = (&h[..dot], &h[dot + 1..]);
                    let Some(ws) = self.wildcards.get(suffix) else {
                        continue;
                    };
                    for w in ws {
                        if !(labels.is_empty() || (w.one_label && labels.contains('.'))) {
                            consider(&w.bucket, w.rank);
                        }
                    }
                }
            }
        }
        consider(&self.any_host, ANY_HOST);
        win.and_then(|(_, _, i)| self.routes.get(i))
    }

    /// For `explain`: every route in the order they are tried for a request (its best host
    /// first), up to the one that takes it, each with what refused it; at most `max`, the
    /// winner always among them.
    pub fn candidates<H: RequestHead>(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
        head: &H,
        max: usize,
    ) -> Vec<Candidate<'_>> {
        let mut order: Vec<(Reverse<i32>, u32, usize)> = self
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let rank = r.host_rank_for(host).unwrap_or(ANY_HOST);
                (Reverse(r.matching.priority), rank, i)
            })
            .collect();
        order.sort();
        let mut out = Vec::new();
        for (_, _, i) in order {
            let Some(r) = self.routes.get(i) else {
                continue;
            };
            let refused = r.refusal(host, method, path, head);
            let took = refused.is_none();
            if out.len() + 1 < max || took {
                out.push(Candidate { route: r, refused });
            }
            if took {
                break;
            }
        }
        out
    }

    /// Routes that can never match, each with the route that takes every request it would.
    pub fn shadowed(&self) -> Vec<(&str, &str)> {
        let shapes: Vec<_> = self.routes.iter().map(Route::shape).collect();
        super::matching::shadowed(&shapes)
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
    use crate::config::Config;
    use crate::http::head::OwnedHead;

    fn table(toml: &str) -> RouteTable {
        let c = Config::parse(toml, std::path::Path::new(".")).unwrap();
        RouteTable::new(&c.routes, &HashMap::new(), 1).unwrap()
    }

    fn route(name: &str, prefix: &str, extra: &str) -> String {
        format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\nupstream = \"http://127.0.0.1:1\"\n{extra}\n")
    }

    fn find<'a>(t: &'a RouteTable, host: Option<&str>, m: Method, path: &str) -> Option<&'a str> {
        t.find(host, &m, path, &OwnedHead::default())
            .map(|r| &*r.name)
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

    /// The reference lookup: every route asked in full ([`Route::refusal`]), the best of those
    /// that take the request by (priority, host rank, rank). The table's indexes are held to it.
    fn reference<'a>(
        t: &'a RouteTable,
        host: Option<&str>,
        method: &Method,
        path: &str,
        head: &OwnedHead,
    ) -> Option<&'a Route> {
        t.iter()
            .enumerate()
            .filter(|(_, r)| r.refusal(host, method, path, head).is_none())
            .min_by_key(|(i, r)| {
                (
                    Reverse(r.matching.priority),
                    r.host_rank_for(host).unwrap_or(ANY_HOST),
                    *i,
                )
            })
            .map(|(_, r)| r)
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

    const SEGMENTS: &[&str] = &["api", "v1", "a", "apix", "v10", "API"];

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

    /// One random route's matchers (TOML lines), of every kind.
    fn random_matchers(rng: &mut Rng) -> String {
        let mut out = String::new();
        match rng.below(8) {
            0 | 1 => {
                let p = random_path(rng, false);
                out += &format!("path = \"{p}\"\n");
            }
            2 => {
                let t = rng.pick(&[
                    "/api/{id}",
                    "/{a}/v1",
                    "/a/{rest...}",
                    "/{x}/{y}",
                    "/api/v1/{id}",
                    "/{all...}",
                ]);
                out += &format!("path_template = \"{t}\"\n");
            }
            3 => {
                let re = rng.pick(&["/api/.*", "/(a|v1)/v1", ".*x", "/API.*", "/[a-z]+"]);
                out += &format!("path_regex = \"{re}\"\n");
                if rng.below(3) == 0 {
                    out += &format!("path_prefix = \"{}\"\n", rng.pick(&["/api", "/a", "/"]));
                }
            }
            _ => {
                let p = random_path(rng, false);
                if p != "/" || rng.below(2) == 0 {
                    out += &format!("path_prefix = \"{p}\"\n");
                }
            }
        }
        if rng.below(5) == 0 {
            out += "case_sensitive = false\n";
        }
        match rng.below(6) {
            0 => {
                out += &format!(
                    "host = \"{}\"\n",
                    rng.pick(&["a.example", "b.example", "x.example"])
                )
            }
            1 => {
                out += &format!(
                    "host = \"{}\"\n",
                    rng.pick(&["*.example", "*.x.example", "{t}.example"])
                )
            }
            2 => out += "hosts = [\"a.example\", \"*.x.example\"]\n",
            _ => {}
        }
        match rng.below(4) {
            0 => out += "methods = [\"GET\"]\n",
            1 => out += "methods = [\"POST\", \"GET\"]\n",
            _ => {}
        }
        if rng.below(8) == 0 {
            out += &format!("priority = {}\n", rng.below(3));
        }
        for _ in 0..rng.below(3).saturating_sub(1) {
            let test = rng.pick(&[
                "value = \"1\"",
                "regex = \"[0-9]+\"",
                "present = true",
                "absent = true",
            ]);
            out += &format!("[[routes.headers]]\nname = \"x-v\"\n{test}\n");
        }
        if rng.below(5) == 0 {
            let test = rng.pick(&["value = \"a b\"", "present = true", "absent = true"]);
            out += &format!("[[routes.query]]\nname = \"q\"\n{test}\n");
        }
        out
    }

    fn head(method: &Method, query: Option<&str>, v: Option<&str>) -> OwnedHead {
        let mut h = OwnedHead {
            method: method.clone(),
            query: query.map(str::to_owned),
            ..OwnedHead::default()
        };
        if let Some(v) = v {
            h.headers
                .insert("x-v", http::HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// Random route sets of every matcher kind (exact, prefix, template, regex, hosts exact and
    /// wildcard, methods, headers, query, priority, case), looked up with random requests: the
    /// indexed table finds the very route the reference finds.
    #[test]
    fn the_indexed_lookup_agrees_with_the_reference() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut lookups, mut matched, mut kinds) = (0, 0, std::collections::HashSet::new());
        let mut sets = 0;
        let mut shadowed_sets = 0usize;
        while sets < 400 {
            let mut toml = String::new();
            for i in 0..1 + rng.below(24) {
                toml += &format!(
                    "[[routes]]\nname = \"r{i}\"\nupstream = \"http://127.0.0.1:1\"\n{}",
                    random_matchers(&mut rng)
                );
            }
            let Ok(c) = Config::parse(&toml, std::path::Path::new(".")) else {
                continue; // two routes matching alike: refused, as it should be
            };
            sets += 1;
            let t = RouteTable::new(&c.routes, &HashMap::new(), 1).unwrap();
            // `check`'s shadowing: the indexed comparison finds what comparing every pair finds,
            // and a route it reports never takes a request below.
            let shadowed: Vec<(&str, &str)> = t.shadowed();
            let all: Vec<_> = t.iter().map(Route::shape).collect();
            let pairwise: Vec<(&str, &str)> = all
                .iter()
                .enumerate()
                .filter_map(|(j, b)| {
                    all.iter()
                        .take(j)
                        .find(|a| a.covers(b))
                        .map(|a| (b.name, a.name))
                })
                .collect();
            assert_eq!(shadowed, pairwise, "in\n{toml}");
            shadowed_sets += usize::from(!shadowed.is_empty());
            for _ in 0..60 {
                let path = random_path(&mut rng, true);
                let host = match rng.below(6) {
                    0 => None,
                    1 => Some("example"),
                    2 => Some("y.z.x.example"),
                    3 => Some("z.x.example"),
                    _ => Some(rng.pick(&["a.example", "b.example", "x.example"])),
                };
                let method = [Method::GET, Method::POST, Method::DELETE][rng.below(3)].clone();
                let query = [None, Some("q=a+b"), Some("Q=1&q=a%20b"), Some("x=1")][rng.below(4)];
                let v = [None, Some("1"), Some("22"), Some("x")][rng.below(4)];
                let h = head(&method, query, v);
                let want = reference(&t, host, &method, &path, &h).map(|r| &*r.name);
                let got = t.find(host, &method, &path, &h);
                if let Some(r) = got {
                    assert!(
                        !shadowed.iter().any(|(never, _)| *never == &*r.name),
                        "{} is reported shadowed but takes {host:?} {method} {path:?} in\n{toml}",
                        r.name
                    );
                }
                assert_eq!(
                    got.map(|r| &*r.name),
                    want,
                    "{host:?} {method} {path:?} {query:?} x-v={v:?} in\n{toml}"
                );
                let cands = t.candidates(host, &method, &path, &h, usize::MAX);
                assert_eq!(
                    cands
                        .last()
                        .filter(|c| c.refused.is_none())
                        .map(|c| &*c.route.name),
                    want,
                    "explain's last candidate is the route found"
                );
                lookups += 1;
                matched += usize::from(want.is_some());
                if let Some(r) = got {
                    kinds.insert((
                        r.path_kind(),
                        r.matching.hosts.first().map(HostPattern::text),
                    ));
                }
            }
        }
        // The sets exercise every kind and both outcomes, not only misses.
        assert!(
            matched > lookups / 4 && matched < lookups,
            "{matched}/{lookups}"
        );
        assert!(kinds.len() >= 12, "{kinds:?}");
        assert!(
            shadowed_sets > 20,
            "{shadowed_sets} sets with a shadowed route"
        );
    }

    fn exact(name: &str, path: &str, extra: &str) -> String {
        format!("[[routes]]\nname = \"{name}\"\npath = \"{path}\"\nupstream = \"http://127.0.0.1:1\"\n{extra}\n")
    }

    fn with(name: &str, matchers: &str) -> String {
        format!("[[routes]]\nname = \"{name}\"\nupstream = \"http://127.0.0.1:1\"\n{matchers}\n")
    }

    /// The canonical rate-limit config: a tight limit on exactly `/login` beside the API's.
    #[test]
    fn an_exact_path_beats_every_prefix_and_only_itself() {
        let t = table(&(route("api", "/", "") + &exact("login", "/login", "")));
        assert_eq!(find(&t, None, Method::POST, "/login"), Some("login"));
        for other in ["/login/", "/login/x", "/loginx", "/Login", "/"] {
            assert_eq!(find(&t, None, Method::POST, other), Some("api"), "{other}");
        }
    }

    /// The precedence, one rule at a time (the manual's list, in its order).
    #[test]
    fn the_documented_precedence() {
        // Host: exact, then the wildcard with most labels, then `{name}` before `*`, then any —
        // before any path rule.
        let t = table(
            &(with("any", "path = \"/a/b\"")
                + &with("star", "host = \"*.example.com\"")
                + &with("deeper", "host = \"*.x.example.com\"")
                + &with("named", "host = \"{t}.x.example.com\"")
                + &with("exact", "host = \"a.x.example.com\"")),
        );
        assert_eq!(
            find(&t, Some("a.x.example.com"), Method::GET, "/a/b"),
            Some("exact")
        );
        assert_eq!(
            find(&t, Some("b.x.example.com"), Method::GET, "/a/b"),
            Some("named")
        );
        assert_eq!(
            find(&t, Some("c.b.x.example.com"), Method::GET, "/a/b"),
            Some("deeper")
        );
        assert_eq!(
            find(&t, Some("x.example.com"), Method::GET, "/a/b"),
            Some("star")
        );
        assert_eq!(
            find(&t, Some("example.com"), Method::GET, "/a/b"),
            Some("any")
        );
        // Path: exact, templates (most literals first), regexes (file order), prefixes (longest).
        let t = table(
            &(route("short", "/u", "")
                + &route("long", "/u/7", "")
                + &with("re2", "path_regex = \"/u/[0-9]+\"")
                + &with("re1", "path_regex = \"/u/.*\"")
                + &with("any2", "path_template = \"/{a}/{b}\"")
                + &with("lit1", "path_template = \"/u/{id}\"")
                + &exact("exact", "/u/7", "")),
        );
        assert_eq!(find(&t, None, Method::GET, "/u/7"), Some("exact"));
        assert_eq!(find(&t, None, Method::GET, "/u/8"), Some("lit1"));
        assert_eq!(find(&t, None, Method::GET, "/v/8"), Some("any2"));
        assert_eq!(find(&t, None, Method::GET, "/u/8/9"), Some("re1"));
        assert_eq!(find(&t, None, Method::GET, "/u/7/9"), Some("re1"));
        let t = table(&(route("short", "/u", "") + &route("long", "/u/7", "")));
        assert_eq!(find(&t, None, Method::GET, "/u/7/9"), Some("long"));
        // Then methods, then most headers, then most query matchers, then file order.
        let h1 = "[[routes.headers]]\nname = \"x-v\"\npresent = true\n";
        let q1 = "[[routes.query]]\nname = \"q\"\npresent = true\n";
        let t = table(
            &(route("first", "/p", "")
                + &route("query", "/p", q1)
                + &route("header", "/p", h1)
                + &route("method", "/p", "methods = [\"GET\"]")),
        );
        let ask = |m: Method, q: Option<&str>, v: Option<&str>| {
            t.find(None, &m, "/p", &head(&m, q, v))
                .map(|r| r.name.to_string())
        };
        assert_eq!(
            ask(Method::GET, Some("q=1"), Some("1")).as_deref(),
            Some("method")
        );
        assert_eq!(
            ask(Method::POST, Some("q=1"), Some("1")).as_deref(),
            Some("header")
        );
        assert_eq!(
            ask(Method::POST, Some("q=1"), None).as_deref(),
            Some("query")
        );
        assert_eq!(ask(Method::POST, None, None).as_deref(), Some("first"));
        // `priority` overrides all of it.
        let t = table(&(exact("login", "/login", "") + &route("catch", "/", "priority = 1")));
        assert_eq!(find(&t, None, Method::GET, "/login"), Some("catch"));
    }

    /// The Gateway API's HTTPRoute precedence (its API reference, `HTTPRouteRule.matches` and
    /// `HTTPRouteSpec.hostnames`), as a table: each row's routes, a request, the route that must
    /// take it.
    #[test]
    fn the_gateway_api_precedence_examples() {
        let h = |n: usize| -> String {
            (0..n)
                .map(|k| format!("[[routes.headers]]\nname = \"h{k}\"\npresent = true\n"))
                .collect()
        };
        let rows: Vec<(String, &str, Option<&str>, &str)> = vec![
            // "Exact" path match before any prefix.
            (exact("exact", "/foo", "") + &route("prefix", "/foo", ""), "/foo", None, "exact"),
            // "Prefix" path match with the largest number of characters.
            (route("short", "/foo", "") + &route("long", "/foo/bar", ""), "/foo/bar/x", None, "long"),
            // Method match.
            (route("any", "/foo", "") + &route("get", "/foo", "methods = [\"GET\"]"), "/foo", None, "get"),
            // Largest number of header matches.
            (route("one", "/foo", &h(1)) + &route("two", "/foo", &h(2)), "/foo", None, "two"),
            // Largest number of query param matches.
            (
                route("one", "/foo", "[[routes.query]]\nname = \"a\"\npresent = true\n")
                    + &route("two", "/foo", "[[routes.query]]\nname = \"a\"\npresent = true\n[[routes.query]]\nname = \"b\"\npresent = true\n"),
                "/foo",
                None,
                "two",
            ),
            // Ties: the first rule in order.
            (route("first", "/foo", "methods = [\"GET\"]") + &route("second", "/foo", "methods = [\"GET\", \"POST\"]"), "/foo", None, "first"),
            // Hostnames: a matching exact name before a wildcard, a wildcard before none.
            (with("wild", "host = \"*.example.com\"") + &with("exact", "host = \"foo.example.com\""), "/", Some("foo.example.com"), "exact"),
            (with("none", "") + &with("wild", "host = \"*.example.com\""), "/", Some("foo.example.com"), "wild"),
            // A wildcard never matches the apex.
            (with("none", "") + &with("wild", "host = \"*.example.com\""), "/", Some("example.com"), "none"),
            // The hostname before the path: a host's `/` before another host's exact path.
            (exact("login", "/login", "") + &with("host", "host = \"foo.example.com\""), "/login", Some("foo.example.com"), "host"),
        ];
        for (toml, path, host, want) in rows {
            let t = table(&toml);
            let hd = head(&Method::GET, Some("a=1&b=2"), None);
            let mut hd = hd;
            for k in 0..2 {
                hd.headers.insert(
                    http::HeaderName::from_bytes(format!("h{k}").as_bytes()).unwrap(),
                    http::HeaderValue::from_static("1"),
                );
            }
            let got = t.find(host, &Method::GET, path, &hd).map(|r| &*r.name);
            assert_eq!(got, Some(want), "{host:?} {path} in\n{toml}");
        }
    }

    #[test]
    fn captures_of_templates_and_hosts() {
        let t = table(&with(
            "t",
            "host = \"{tenant}.api.test\"\npath_template = \"/users/{id}/files/{rest...}\"",
        ));
        let r = t
            .find(
                Some("acme.api.test"),
                &Method::GET,
                "/users/7/files/a/b",
                &OwnedHead::default(),
            )
            .unwrap();
        let (h, p) = (Some("acme.api.test"), "/users/7/files/a/b");
        assert_eq!(
            r.capture(super::super::Capture::Path("id"), h, p),
            Some("7")
        );
        assert_eq!(
            r.capture(super::super::Capture::Path("rest"), h, p),
            Some("a/b")
        );
        assert_eq!(
            r.capture(super::super::Capture::Host("tenant"), h, p),
            Some("acme")
        );
        assert_eq!(super::super::host_label("acme.api.test", 2), Some("api"));
        assert_eq!(super::super::host_label("acme.api.test", 4), None);
        assert!(t
            .find(Some("a.b.api.test"), &Method::GET, p, &OwnedHead::default())
            .is_none());
        assert!(t
            .find(Some("api.test"), &Method::GET, p, &OwnedHead::default())
            .is_none());
    }

    #[test]
    fn shadowed_routes_are_named_with_the_route_that_takes_their_requests() {
        let t = table(
            &(route("api", "/api", "")
                + &route("v1", "/api/v1", "priority = -1")
                + &exact("login", "/api/login", "priority = -1")
                + &route("other", "/other", "")
                + &route("get", "/api/x", "methods = [\"GET\"]")),
        );
        let s = t.shadowed();
        assert!(s.contains(&("v1", "api")), "{s:?}");
        assert!(s.contains(&("login", "api")), "{s:?}");
        assert_eq!(s.len(), 2, "{s:?}");
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
        let s = t
            .find(None, &Method::GET, "/svc/x", &OwnedHead::default())
            .unwrap();
        assert_eq!(s.upstream_path("/svc/x"), "/x");
        assert_eq!(s.upstream_path("/svc"), "/");
        let b = t2
            .find(None, &Method::GET, "/b/y", &OwnedHead::default())
            .unwrap();
        assert_eq!(b.upstream_path("/b/y"), "/base/b/y");
    }
}
