//! The `gateway.toml` an import builds: serde structs in the order a reader expects the keys,
//! rendered with `toml`, and the helpers both sources share (names, sizes, regex prefixes,
//! header rules Tollgate accepts). The rendered text is loaded with [`crate::config::Config::parse`]
//! before it is returned, so an import never prints a config `tollgate check` refuses.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::Serialize;

use super::report::Report;

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
    pub path_prefix: String,
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<Limit>,
    /// Where the route came from, written as a comment above it.
    #[serde(skip)]
    pub source: String,
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
/// config loader to be sure it is valid.
pub fn render(gateway: &Gateway, header: &[String]) -> Result<String, ImportError> {
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
    crate::config::Config::parse(&out, Path::new("."))
        .map_err(|e| ImportError::Invalid(e.to_string()))?;
    Ok(out)
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
