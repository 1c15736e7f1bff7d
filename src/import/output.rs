//! The `gateway.toml` an import builds: serde structs in the order a reader expects the keys,
//! rendered with `toml`, and the helpers both sources share (names, sizes, regex prefixes,
//! header rules Tollgate accepts). The rendered text is loaded with [`crate::config::Config::parse`]
//! before it is returned, so an import never prints a config `tollgate check` refuses.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Serialize;

use super::report::{Report, Severity};
use crate::config::ConfigError;

/// What an import produced: the config text and the report.
#[derive(Debug)]
pub struct Import {
    pub toml: String,
    pub report: Report,
}

/// Why an import produced nothing.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}: document {document}: not YAML: {message}")]
    Yaml {
        file: String,
        document: usize,
        message: String,
    },
    #[error("{file}:{line}: {message}")]
    Syntax {
        file: String,
        line: usize,
        message: String,
    },
    /// The generated config did not load: a defect of the importer, never the input's.
    #[error("the imported configuration does not load ({0}); please report this with the input")]
    Invalid(String),
    #[error("cannot write the configuration: {0}")]
    Render(#[from] toml::ser::Error),
}

/// The whole `gateway.toml`.
#[derive(Debug, Default, Serialize)]
pub struct Gateway {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<Server>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheStore>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<Upstream>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

/// `[server]`.
#[derive(Debug, Default, Serialize)]
pub struct Server {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

/// `[cache]`: the store's bounds and its disk tier (nginx's `proxy_cache_path`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CacheStore {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// Set when the tiers are below the default object size (which may not exceed them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_object_size: Option<u64>,
    /// The directory nginx keeps its responses in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_path: Option<String>,
    /// `max_size=` (the zones' total).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_max_bytes: Option<u64>,
}

/// `[routes.cache]` (nginx's `proxy_cache` and the directives around it).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouteCache {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_ttl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ttl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statuses: Option<Vec<u16>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_timeout: Option<String>,
}

/// `[[upstreams]]`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<ServerEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_fails: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<&'static str>,
    /// The source file and line, for the report when the group is left out.
    #[serde(skip)]
    pub file: String,
    #[serde(skip)]
    pub line: Option<usize>,
}

/// One entry of `servers`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ServerEntry {
    Url(String),
    Weighted { url: String, weight: u32 },
}

/// `[[routes]]`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Route {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Several hosts (`host` for one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// An exact path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Empty: none (every path, or the path is `path`'s or `path_regex`'s alone).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path_prefix: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preserve_host: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub case_sensitive: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderRules>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderRules>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors: Option<Cors>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<RouteCache>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<FieldMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<FieldMatch>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<Limit>,
    /// Where the route came from, written as a comment above it.
    #[serde(skip)]
    pub source: String,
    /// The source file and line, for the report of what is left out of the route.
    #[serde(skip)]
    pub file: String,
    #[serde(skip)]
    pub line: Option<usize>,
    /// The path `strip_prefix` strips when the route has no `path_prefix` (nginx's location).
    #[serde(skip)]
    pub strip_from: String,
}

/// One `[[routes.headers]]` or `[[routes.query]]` matcher.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FieldMatch {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

/// `rewrite = { match, to }`.
#[derive(Debug, Clone, Serialize)]
pub struct Rewrite {
    #[serde(rename = "match")]
    pub pattern: String,
    pub to: String,
}

/// `redirect = { to, status }`.
#[derive(Debug, Clone, Serialize)]
pub struct Redirect {
    pub to: String,
    pub status: u16,
}

/// `[routes.request_headers]` / `[routes.response_headers]`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HeaderRules {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_answers: Option<bool>,
}

/// `[routes.cors]`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cors {
    pub allow_origins: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_methods: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_headers: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expose_headers: Option<Vec<String>>,
    pub allow_credentials: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

/// `[[routes.limits]]`.
#[derive(Debug, Clone, Serialize)]
pub struct Limit {
    pub name: String,
    pub algorithm: &'static str,
    pub limit: u64,
    pub period: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    pub subject: Subject,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exempt: Option<Vec<String>>,
    /// `"shadow"` for nginx's `limit_req_dry_run on`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<RefusalStatus>,
}

/// A limit's `refusal = { status }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RefusalStatus {
    pub status: u16,
}

/// A limit's `subject`: one part or a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Subject {
    One(String),
    List(Vec<String>),
}

impl Subject {
    /// Whether the client address is (part of) the subject.
    pub fn has_ip(&self) -> bool {
        match self {
            Subject::One(s) => s == "ip",
            Subject::List(l) => l.iter().any(|s| s == "ip"),
        }
    }
}

/// Renders `gateway`, with `header` as leading comment lines, and loads the result with the
/// config loader to be sure it is valid. When it does not load, whatever the loader refuses is
/// found route by route (each loaded alone with the group it uses), left out and reported with
/// the route's file and line, and the rest is rendered: one value Tollgate cannot take never
/// costs the whole import.
pub fn render(
    gateway: &mut Gateway,
    header: &[String],
    report: &mut Report,
) -> Result<String, ImportError> {
    let out = text(gateway, header)?;
    if loads(&out).is_ok() {
        return Ok(out);
    }
    prune(gateway, report)?;
    let out = text(gateway, header)?;
    loads(&out).map_err(|e| ImportError::Invalid(e.to_string()))?;
    Ok(out)
}

fn text(gateway: &Gateway, header: &[String]) -> Result<String, ImportError> {
    let body = toml::to_string(gateway)?;
    let mut out = String::new();
    for h in header {
        out.push_str("# ");
        out.push_str(h);
        out.push('\n');
    }
    out.push('\n');
    let mut sources = gateway.routes.iter().map(|r| r.source.as_str());
    for line in body.lines() {
        if line == "[[routes]]" {
            if let Some(s) = sources.next() {
                if !s.is_empty() {
                    out.push_str("# from ");
                    out.push_str(s);
                    out.push('\n');
                }
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

fn loads(text: &str) -> Result<(), ConfigError> {
    crate::config::Config::parse(text, Path::new(".")).map(|_| ())
}

/// The most values left out of one route before the route itself is.
const MAX_PRUNED_PER_ROUTE: usize = 32;

/// Leaves out of `gateway` what the loader refuses, reporting each.
fn prune(gateway: &mut Gateway, report: &mut Report) -> Result<(), ImportError> {
    let probe = |upstream: String| Route {
        name: "probe".into(),
        path_prefix: "/".into(),
        upstream: Some(upstream),
        ..Route::default()
    };
    // The listener.
    if let Some(server) = &gateway.server {
        let alone = Gateway {
            server: Some(Server {
                listen: server.listen.clone(),
            }),
            routes: vec![probe("http://127.0.0.1:1".into())],
            ..Gateway::default()
        };
        if let Err(e) = loads(&toml::to_string(&alone)?) {
            report.add(
                Severity::LeftOut,
                "",
                None,
                "[server]",
                format!("{}: left out", loader_message(&e)),
            );
            gateway.server = None;
        }
    }
    // The store's bounds.
    if let Some(cache) = &gateway.cache {
        let alone = Gateway {
            cache: Some(cache.clone()),
            routes: vec![probe("http://127.0.0.1:1".into())],
            ..Gateway::default()
        };
        if let Err(e) = loads(&toml::to_string(&alone)?) {
            report.add(
                Severity::LeftOut,
                "",
                None,
                "[cache]",
                format!(
                    "{}: left out (Tollgate's defaults apply)",
                    loader_message(&e)
                ),
            );
            gateway.cache = None;
        }
    }
    // The groups, each with a route that uses it.
    let mut groups = Vec::new();
    for group in std::mem::take(&mut gateway.upstreams) {
        let alone = Gateway {
            upstreams: vec![group.clone()],
            routes: vec![probe(group.name.clone())],
            ..Gateway::default()
        };
        match loads(&toml::to_string(&alone)?) {
            Ok(()) => groups.push(group),
            Err(e) => report.add(
                Severity::LeftOut,
                &group.file,
                group.line,
                format!("upstream {}", group.name),
                format!(
                    "{}: the group and the routes to it are left out",
                    loader_message(&e)
                ),
            ),
        }
    }
    gateway.upstreams = groups;
    let by_name: HashMap<&str, &Upstream> = gateway
        .upstreams
        .iter()
        .map(|u| (u.name.as_str(), u))
        .collect();
    let store = gateway.cache.clone();
    let mut routes = Vec::new();
    'routes: for mut route in std::mem::take(&mut gateway.routes) {
        let place = route
            .source
            .split_once(" (")
            .and_then(|(_, p)| p.strip_suffix(')'))
            .unwrap_or(&route.source)
            .to_owned();
        for _ in 0..MAX_PRUNED_PER_ROUTE {
            let group = route
                .upstream
                .as_deref()
                .and_then(|u| by_name.get(u))
                .map(|u| (*u).clone());
            let alone = Gateway {
                server: None,
                cache: store.clone(),
                upstreams: group.into_iter().collect(),
                routes: vec![route.clone()],
            };
            let text = toml::to_string(&alone)?;
            let Err(e) = loads(&text) else {
                routes.push(route);
                continue 'routes;
            };
            let message = loader_message(&e);
            let key = refused_key(&e, &text);
            let what = key
                .as_deref()
                .and_then(|k| k.strip_prefix("routes[0]."))
                .map(str::to_owned);
            match what.as_deref().map(|w| route.leave_out(w)) {
                Some(Some(left)) => report.add(
                    Severity::LeftOut,
                    &route.file,
                    route.line,
                    place.clone(),
                    format!("{left}: {message}: left out"),
                ),
                _ => {
                    report.add(
                        Severity::LeftOut,
                        &route.file,
                        route.line,
                        place.clone(),
                        format!("{message}: the route is left out"),
                    );
                    continue 'routes;
                }
            }
        }
        report.add(
            Severity::LeftOut,
            &route.file,
            route.line,
            place,
            "too many values the loader refuses: the route is left out",
        );
    }
    gateway.routes = routes;
    Ok(())
}

/// The loader's reason, without the line in the probe's text.
fn loader_message(e: &ConfigError) -> String {
    match e {
        ConfigError::Invalid { field, message } => {
            let m = match message.rfind(" (line ") {
                Some(i) if message.ends_with(')') => &message[..i],
                _ => message.as_str(),
            };
            format!("`{field}`: {m}")
        }
        ConfigError::Parse { message, .. } => message
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty() && !l.starts_with('|') && !l.contains(" | "))
            .unwrap_or(message)
            .to_owned(),
        other => other.to_string(),
    }
}

/// The path (`routes[0].limits[1].burst`) of the value the loader refused in `text`.
fn refused_key(e: &ConfigError, text: &str) -> Option<String> {
    match e {
        ConfigError::Invalid { field, .. } => Some(field.clone()),
        ConfigError::Parse { message, .. } => {
            let number = |after: &str| -> Option<usize> {
                let at = message.find(after)? + after.len();
                message[at..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .ok()
            };
            let line = number("line ")?;
            let start: usize = text
                .split_inclusive('\n')
                .take(line.checked_sub(1)?)
                .map(str::len)
                .sum();
            let end = start + text.get(start..)?.find('\n').unwrap_or(text.len() - start);
            // The column counts characters from 1: the byte it points at.
            let at = number("column ")
                .and_then(|c| text[start..end].char_indices().nth(c.checked_sub(1)?))
                .map(|(i, _)| start + i);
            let doc = toml::de::DeTable::parse(text).ok()?;
            let root = toml::de::DeValue::Table(doc.into_inner());
            let mut path = Vec::new();
            let found = at.is_some_and(|at| leaf_on(&root, at..at + 1, true, &mut path))
                || leaf_on(&root, start..end, false, &mut path);
            if !found {
                return None;
            }
            let mut key = path.concat();
            // serde names the field within the table it reports (`cors.allow_methods: …`).
            let last = message.lines().map(str::trim).rfind(|l| !l.is_empty())?;
            if let Some((field, _)) = last.split_once(": ") {
                let dotted = field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.[]".contains(&b));
                if let Some((first, more)) = field.split_once('.').filter(|_| dotted) {
                    if key.ends_with(&format!(".{first}")) {
                        key.push('.');
                        key.push_str(more);
                    }
                }
            }
            Some(key)
        }
        _ => None,
    }
}

/// Finds the first leaf value that starts within `range` (a byte range; with `inside`, that
/// holds `range.start` within its span), filling `path` with its keys (`routes`, `[0]`,
/// `.timeout`).
fn leaf_on(
    value: &toml::de::DeValue<'_>,
    range: std::ops::Range<usize>,
    inside: bool,
    path: &mut Vec<String>,
) -> bool {
    use toml::de::DeValue;
    let here = |v: &toml::Spanned<DeValue<'_>>| {
        if inside {
            v.span().contains(&range.start)
        } else {
            range.contains(&v.span().start)
        }
    };
    // A value within, else a table or array whose own span (its header, for a `[table]`)
    // holds the place.
    let child = |path: &mut Vec<String>, seg: String, v: &toml::Spanned<DeValue<'_>>| {
        path.push(seg);
        let found = match v.get_ref() {
            DeValue::Table(_) | DeValue::Array(_) => {
                leaf_on(v.get_ref(), range.clone(), inside, path) || here(v)
            }
            _ => here(v),
        };
        if !found {
            path.pop();
        }
        found
    };
    match value {
        DeValue::Table(t) => t.iter().any(|(k, v)| {
            let seg = if path.is_empty() {
                k.get_ref().to_string()
            } else {
                format!(".{}", k.get_ref())
            };
            child(path, seg, v)
        }),
        DeValue::Array(a) => a
            .iter()
            .enumerate()
            .any(|(i, v)| child(path, format!("[{i}]"), v)),
        _ => false,
    }
}

impl Route {
    /// Leaves out the value at `key` (`timeout`, `limits[1].burst`, `cors.allow_methods`):
    /// what was left out, or `None` when the route cannot do without it.
    fn leave_out(&mut self, key: &str) -> Option<String> {
        let (head, rest) = match key.find(['.', '[']) {
            Some(i) => (&key[..i], &key[i..]),
            None => (key, ""),
        };
        let index = || -> Option<usize> { rest.strip_prefix('[')?.split(']').next()?.parse().ok() };
        match head {
            "strip_prefix" => self
                .strip_prefix
                .take()
                .map(|v| format!("strip_prefix = {v}")),
            "preserve_host" => self
                .preserve_host
                .take()
                .map(|v| format!("preserve_host = {v}")),
            "case_sensitive" => self
                .case_sensitive
                .take()
                .map(|v| format!("case_sensitive = {v}")),
            "timeout" => self.timeout.take().map(|v| format!("timeout = {v:?}")),
            "max_body_size" => self
                .max_body_size
                .take()
                .map(|v| format!("max_body_size = {v}")),
            "rewrite" => self
                .rewrite
                .take()
                .map(|r| format!("rewrite = {{ match = {:?}, to = {:?} }}", r.pattern, r.to)),
            "limits" => {
                let i = index()?;
                (i < self.limits.len()).then(|| {
                    let l = self.limits.remove(i);
                    format!("limit {:?} ({} per {})", l.name, l.limit, l.period)
                })
            }
            // An access list narrower by the entry; one left empty leaves the route out (an
            // allow list that lets no one in is what nginx's would do with no entry left).
            "allow" | "deny" => {
                let list = if head == "allow" {
                    &mut self.allow
                } else {
                    &mut self.deny
                };
                let entries = list.as_mut()?;
                let i = index()?;
                if i >= entries.len() {
                    return None;
                }
                let entry = entries.remove(i);
                if entries.is_empty() {
                    if head == "allow" {
                        return None;
                    }
                    *list = None;
                }
                Some(format!("{head} entry {entry:?}"))
            }
            "request_headers" | "response_headers" => {
                let rules = if head == "request_headers" {
                    &mut self.request_headers
                } else {
                    &mut self.response_headers
                };
                let mut parts = rest.trim_start_matches('.').splitn(2, '.');
                let (kind, name) = (parts.next().unwrap_or(""), parts.next());
                let r = rules.as_mut()?;
                let left = match (kind, name) {
                    ("set", Some(n)) => {
                        r.set.remove(n).map(|v| format!("{head}.set {n:?} = {v:?}"))
                    }
                    ("add", Some(n)) => {
                        r.add.remove(n).map(|v| format!("{head}.add {n:?} = {v:?}"))
                    }
                    _ => None,
                };
                match left {
                    Some(l) => {
                        if r.set.is_empty() && r.add.is_empty() && r.remove.is_empty() {
                            *rules = None;
                        }
                        Some(l)
                    }
                    None => rules.take().map(|_| format!("[routes.{head}]")),
                }
            }
            "cors" => {
                let c = self.cors.as_mut()?;
                let sub = rest.trim_start_matches('.');
                let sub = sub.split(['.', '[']).next().unwrap_or("");
                let left = match sub {
                    "allow_methods" => c
                        .allow_methods
                        .take()
                        .map(|v| format!("cors.allow_methods = {v:?}")),
                    "allow_headers" => c
                        .allow_headers
                        .take()
                        .map(|v| format!("cors.allow_headers = {v:?}")),
                    "expose_headers" => c
                        .expose_headers
                        .take()
                        .map(|v| format!("cors.expose_headers = {v:?}")),
                    "max_age" => c.max_age.take().map(|v| format!("cors.max_age = {v:?}")),
                    _ => None,
                };
                left.or_else(|| self.cors.take().map(|_| "[routes.cors]".to_owned()))
            }
            "cache" => self.cache.take().map(|_| "[routes.cache]".to_owned()),
            // name, host, path_prefix, upstream, redirect: the route itself.
            _ => None,
        }
    }
}

/// Unique names made of the characters Tollgate takes (letters, digits, `-_.`).
#[derive(Debug, Default)]
pub struct Names {
    taken: HashSet<String>,
}

impl Names {
    /// `wanted` cleaned up, with `-2`, `-3`… when already taken.
    pub fn unique(&mut self, wanted: &str) -> String {
        let mut base: String = wanted
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        while base.contains("--") {
            base = base.replace("--", "-");
        }
        // Route names are at most 64 characters: room for a `-NNN`.
        let mut base = base.trim_matches('-').to_owned();
        base.truncate(56);
        let base = base.trim_matches('-').to_owned();
        let base = if base.is_empty() || base == "unmatched" {
            "route".to_owned()
        } else {
            base
        };
        let mut name = base.clone();
        let mut n = 2;
        while !self.taken.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        name
    }
}

/// An nginx size (`1m`, `512k`, `10485760`, `1g`) in bytes.
pub fn nginx_size(value: &str) -> Option<u64> {
    let v = value.trim();
    let (digits, factor) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 1024),
        Some((i, 'm' | 'M')) => (&v[..i], 1024 * 1024),
        Some((i, 'g' | 'G')) => (&v[..i], 1024 * 1024 * 1024),
        _ => (v, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(factor)
}

/// An nginx time (`60`, `60s`, `1m`, `500ms`) as a humantime string Tollgate reads.
pub fn nginx_time(value: &str) -> Option<String> {
    let v = value.trim();
    if v.is_empty() {
        return None;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = v.parse().ok()?;
        return (secs > 0).then(|| format!("{secs}s"));
    }
    let d = humantime::parse_duration(v).ok()?;
    if d.is_zero() {
        return None;
    }
    Some(humantime::format_duration(d).to_string())
}

/// The path prefix every match of an anchored path regex starts with, cut back to a whole
/// segment: `/something(/|$)(.*)` → `/something`, `/api/v[0-9]+/x` → `/api`.
pub fn regex_prefix(pattern: &str) -> String {
    let p = pattern.strip_prefix('^').unwrap_or(pattern);
    let mut literal = String::new();
    let mut rest = "";
    for (i, c) in p.char_indices() {
        if ".^$*+?()[]{}|\\".contains(c) {
            rest = &p[i..];
            break;
        }
        literal.push(c);
    }
    // A quantifier applies to the last literal character: it is not certain.
    if rest.starts_with(['*', '?', '{']) {
        literal.pop();
    }
    let segment_ends = rest.is_empty()
        || rest.starts_with('$')
        || rest.starts_with("(/|$)")
        || rest.starts_with("(/.*)")
        || rest.starts_with("(/|$)")
        || literal.ends_with('/');
    let cut = if segment_ends {
        literal.as_str()
    } else {
        literal.rfind('/').map_or("", |i| &literal[..i])
    };
    let cut = cut.trim_end_matches('/');
    if cut.is_empty() || !cut.starts_with('/') {
        "/".to_owned()
    } else {
        cut.to_owned()
    }
}

/// A prefix path as Tollgate routes on it: no trailing `/` (segment-aware), `/` for the root.
pub fn prefix_path(path: &str) -> String {
    let p = path.trim_end_matches('/');
    if p.is_empty() {
        "/".to_owned()
    } else {
        p.to_owned()
    }
}

/// Why a header rule would be refused by the loader, if it would.
pub fn header_rule_refused(name: &str, response: bool) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.contains('_') || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Some("not a header name Tollgate accepts in a rule (no `_`)");
    }
    const FRAMING: [&str; 9] = [
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
        "http2-settings",
    ];
    if FRAMING.contains(&lower.as_str()) {
        return Some("a framing or hop-by-hop header, which the gateway writes itself");
    }
    if response
        && (lower.starts_with("ratelimit")
            || lower.starts_with("x-ratelimit-")
            || lower == "retry-after"
            || lower == "x-request-id")
    {
        return Some("a header the gateway asserts itself");
    }
    if !response
        && [
            "host",
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "x-consumer",
            "x-request-id",
        ]
        .contains(&lower.as_str())
    {
        return Some("a header the gateway asserts itself");
    }
    None
}

/// A header value Tollgate takes: printable ASCII and spaces, no control characters.
pub fn header_value_ok(value: &str) -> bool {
    value.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_prefixes() {
        assert_eq!(regex_prefix("/something(/|$)(.*)"), "/something");
        // The slash is optional, so `/somethingelse` matches too: only `/` is certain.
        assert_eq!(regex_prefix("/something/?(.*)"), "/");
        assert_eq!(regex_prefix("^/api/v[0-9]+/x"), "/api");
        assert_eq!(regex_prefix("/(.*)"), "/");
        assert_eq!(regex_prefix("/.*"), "/");
        assert_eq!(regex_prefix("/exact$"), "/exact");
    }

    #[test]
    fn sizes_and_times() {
        assert_eq!(nginx_size("8m"), Some(8 * 1024 * 1024));
        assert_eq!(nginx_size("512K"), Some(512 * 1024));
        assert_eq!(nginx_size("100"), Some(100));
        assert_eq!(nginx_size("x"), None);
        assert_eq!(nginx_time("120").as_deref(), Some("120s"));
        assert_eq!(nginx_time("1m").as_deref(), Some("1m"));
        assert_eq!(nginx_time("0"), None);
    }

    #[test]
    fn names_are_unique_and_clean() {
        let mut n = Names::default();
        assert_eq!(n.unique("api.example.com/v1/"), "api.example.com-v1");
        assert_eq!(n.unique("api.example.com/v1"), "api.example.com-v1-2");
        assert_eq!(n.unique("/"), "route");
    }
}
