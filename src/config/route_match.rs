//! What a route matches beyond its methods: its path matcher (`path`, `path_prefix`,
//! `path_regex`, `path_template`), its hosts (exact or wildcard), its `headers` and `query`
//! matchers and its `priority`. The raw keys (as the file writes them) and their validated,
//! compiled form, which [`crate::routing`] indexes.

use schemars::JsonSchema;
use serde::Deserialize;

use super::{invalid, ConfigError};

/// The most matchers of one kind (`headers`, `query`) on one route.
pub const MAX_FIELD_MATCHES: usize = 16;
/// The most hosts of one route.
pub const MAX_HOSTS: usize = 64;
/// The most bytes of a compiled `path_regex` or field `regex` (the `regex` crate's size limit):
/// a config cannot make one matcher take unbounded memory.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// The most segments of a `path_template`.
pub const MAX_TEMPLATE_SEGMENTS: usize = 32;

/// One `[[routes.headers]]` or `[[routes.query]]` entry: a field by name, and exactly one test.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFieldMatch {
    /// The header's name (any case) or the query parameter's name (matched in any ASCII case,
    /// percent-decoded, as `query:` subject parts read it) (string, required).
    pub(super) name: String,
    /// Matches when one of the field's values is exactly this (a query value percent-decoded,
    /// `+` as a space) (string; one of `value`, `regex`, `present`, `absent`).
    #[serde(default)]
    pub(super) value: Option<String>,
    /// Matches when one of the field's values matches this regular expression (Rust `regex`
    /// syntax), anchored at both ends (string; one of `value`, `regex`, `present`, `absent`).
    #[serde(default)]
    pub(super) regex: Option<String>,
    /// `true`: matches when the field is sent, whatever its value (bool; one of `value`,
    /// `regex`, `present`, `absent`).
    #[serde(default)]
    pub(super) present: Option<bool>,
    /// `true`: matches when the field is not sent (bool; one of `value`, `regex`, `present`,
    /// `absent`).
    #[serde(default)]
    pub(super) absent: Option<bool>,
}

/// The test of a header or query matcher.
#[derive(Debug, Clone)]
pub enum FieldTest {
    /// One of the values is exactly this.
    Exact(Box<[u8]>),
    /// One of the values matches (anchored).
    Regex(regex::bytes::Regex),
    /// The field is sent.
    Present,
    /// The field is not sent.
    Absent,
}

impl FieldTest {
    /// Whether the values of one field (every value sent under its name) pass.
    pub fn passes<V: AsRef<[u8]>>(&self, mut values: impl Iterator<Item = V>) -> bool {
        match self {
            FieldTest::Exact(want) => values.any(|v| v.as_ref() == &**want),
            FieldTest::Regex(re) => values.any(|v| re.is_match(v.as_ref())),
            FieldTest::Present => values.next().is_some(),
            FieldTest::Absent => values.next().is_none(),
        }
    }

    /// The test as the config writes it, for `explain` and `check`.
    pub fn describe(&self) -> String {
        match self {
            FieldTest::Exact(v) => format!("= {:?}", String::from_utf8_lossy(v)),
            FieldTest::Regex(re) => format!("~ {:?}", unanchored(re.as_str())),
            FieldTest::Present => "present".to_owned(),
            FieldTest::Absent => "absent".to_owned(),
        }
    }

    /// The same test (for `check`'s shadowing: a matcher is only known to cover an identical one).
    pub fn same(&self, other: &FieldTest) -> bool {
        match (self, other) {
            (FieldTest::Exact(a), FieldTest::Exact(b)) => a == b,
            (FieldTest::Regex(a), FieldTest::Regex(b)) => a.as_str() == b.as_str(),
            (FieldTest::Present, FieldTest::Present) | (FieldTest::Absent, FieldTest::Absent) => {
                true
            }
            _ => false,
        }
    }
}

/// A header matcher.
#[derive(Debug, Clone)]
pub struct HeaderMatch {
    pub name: http::HeaderName,
    pub test: FieldTest,
}

/// A query parameter matcher.
#[derive(Debug, Clone)]
pub struct QueryMatch {
    pub name: String,
    pub test: FieldTest,
}

/// A `path_regex`: its text and the regex anchored at both ends.
#[derive(Debug, Clone)]
pub struct PathRegex {
    pub text: String,
    pub regex: regex::Regex,
}

/// One segment of a `path_template`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSeg {
    /// A literal segment (in lower case on a `case_sensitive = false` route).
    Lit(Box<str>),
    /// `{name}`: one non-empty segment.
    Param(Box<str>),
    /// `{name...}`, last: the rest of the path (zero or more segments).
    Rest(Box<str>),
}

/// A compiled `path_template` (`/users/{id}/orders/{order}`, `/files/{rest...}`).
#[derive(Debug, Clone)]
pub struct PathTemplate {
    pub text: String,
    pub segs: Box<[TemplateSeg]>,
}

impl PathTemplate {
    /// The literal segments (more is more specific).
    pub fn literals(&self) -> usize {
        self.segs
            .iter()
            .filter(|s| matches!(s, TemplateSeg::Lit(_)))
            .count()
    }

    /// Whether the template names a capture `name`.
    pub fn names(&self, name: &str) -> bool {
        self.segs.iter().any(|s| match s {
            TemplateSeg::Param(n) | TemplateSeg::Rest(n) => &**n == name,
            TemplateSeg::Lit(_) => false,
        })
    }

    /// The template's captures of `path` (literals compared in any ASCII case when `fold`), by
    /// name: `None` when it does not match. Each capture is a slice of `path`.
    pub fn captures<'p>(&self, path: &'p str, fold: bool) -> Option<Vec<(&str, &'p str)>> {
        let mut out = Vec::new();
        self.walk(path, fold, &mut out).then_some(out)
    }

    /// Whether the template matches `path` (literals compared in any ASCII case when `fold`).
    pub fn matches(&self, path: &str, fold: bool) -> bool {
        self.walk(path, fold, &mut Vec::new())
    }

    fn walk<'s, 'p>(
        &'s self,
        path: &'p str,
        fold: bool,
        out: &mut Vec<(&'s str, &'p str)>,
    ) -> bool {
        let Some(mut rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut done = path == "/";
        for seg in self.segs.iter() {
            if let TemplateSeg::Rest(name) = seg {
                out.push((name, if done { "" } else { rest }));
                return true;
            }
            if done {
                return false;
            }
            let (this, after) = match rest.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (rest, None),
            };
            let ok = match seg {
                TemplateSeg::Lit(l) => {
                    if fold {
                        this.eq_ignore_ascii_case(l)
                    } else {
                        this == &**l
                    }
                }
                TemplateSeg::Param(name) => {
                    out.push((name, this));
                    !this.is_empty()
                }
                TemplateSeg::Rest(_) => true,
            };
            if !ok {
                return false;
            }
            match after {
                Some(a) => rest = a,
                None => done = true,
            }
        }
        done
    }
}

/// One host a route matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this host (lower case, no port, no trailing dot).
    Exact(String),
    /// `*.suffix` (one or more labels before `.suffix`, never `suffix` itself, as the Gateway
    /// API's wildcard hostnames), or `{name}.suffix` (exactly one label, captured as `name`).
    Wildcard {
        suffix: String,
        /// `{name}`: the capture's name, and the wildcard is one label.
        name: Option<Box<str>>,
    },
}

impl HostPattern {
    /// The pattern as written (normalised).
    pub fn text(&self) -> String {
        match self {
            HostPattern::Exact(h) => h.clone(),
            HostPattern::Wildcard { suffix, name: None } => format!("*.{suffix}"),
            HostPattern::Wildcard {
                suffix,
                name: Some(n),
            } => format!("{{{n}}}.{suffix}"),
        }
    }

    /// Whether the pattern matches a request's host (normalised: lower case, no port).
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Wildcard { suffix, name } => host
                .strip_suffix(suffix.as_str())
                .and_then(|l| l.strip_suffix('.'))
                .is_some_and(|labels| {
                    !labels.is_empty() && (name.is_none() || !labels.contains('.'))
                }),
        }
    }

    /// Whether every host this one matches is matched by `other` too (for `check`).
    pub fn within(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (HostPattern::Exact(h), o) => o.matches(h),
            (
                HostPattern::Wildcard { suffix, name },
                HostPattern::Wildcard {
                    suffix: o,
                    name: oname,
                },
            ) => {
                (suffix == o && (oname.is_none() || name.is_some()))
                    || (oname.is_none()
                        && suffix
                            .strip_suffix(o.as_str())
                            .is_some_and(|l| l.ends_with('.') && l.len() > 1))
            }
            _ => false,
        }
    }
}

/// What a route matches besides `path_prefix` and `methods` (validated).
#[derive(Debug, Clone, Default)]
pub struct RouteMatch {
    /// `path`: exactly this normalised path.
    pub path: Option<String>,
    /// `path_regex`: the whole normalised path matches.
    pub path_regex: Option<PathRegex>,
    /// `path_template`.
    pub path_template: Option<PathTemplate>,
    /// Whether `path_prefix` was written (else it is `/`, every path).
    pub prefix_given: bool,
    /// `host` / `hosts`: empty, any host.
    pub hosts: Vec<HostPattern>,
    pub headers: Box<[HeaderMatch]>,
    pub query: Box<[QueryMatch]>,
    /// Higher first, before the computed order (default 0).
    pub priority: i32,
}

impl RouteMatch {
    /// Everything the route matches on but methods, as text: two routes with the same key
    /// (and methods) match the same requests.
    pub fn key(&self, path_prefix: &str) -> String {
        let mut hosts: Vec<String> = self.hosts.iter().map(HostPattern::text).collect();
        hosts.sort();
        let fields = |f: &mut Vec<String>| {
            f.sort();
            f.join(",")
        };
        let mut h: Vec<String> = self
            .headers
            .iter()
            .map(|m| format!("{}{}", m.name, m.test.describe()))
            .collect();
        let mut q: Vec<String> = self
            .query
            .iter()
            .map(|m| format!("{}{}", m.name.to_ascii_lowercase(), m.test.describe()))
            .collect();
        format!(
            "{path_prefix}|{:?}|{:?}|{:?}|{hosts:?}|{}|{}|{}",
            self.path,
            self.path_regex.as_ref().map(|r| &r.text),
            self.path_template.as_ref().map(|t| &t.text),
            fields(&mut h),
            fields(&mut q),
            self.priority
        )
    }

    /// The capture names this route defines: its template's and its named wildcard hosts'.
    pub fn defines_path(&self, name: &str) -> bool {
        self.path_template.as_ref().is_some_and(|t| t.names(name))
    }

    /// Whether every one of the route's hosts names the capture `name`.
    pub fn defines_host(&self, name: &str) -> bool {
        !self.hosts.is_empty()
            && self
                .hosts
                .iter()
                .all(|h| matches!(h, HostPattern::Wildcard { name: Some(n), .. } if &**n == name))
    }
}

/// The regex text without the anchors [`anchored`] adds.
fn unanchored(s: &str) -> &str {
    s.strip_prefix("^(?:")
        .and_then(|s| s.strip_suffix(")$"))
        .unwrap_or(s)
}

/// `re` anchored at both ends.
fn anchored(re: &str) -> String {
    format!("^(?:{re})$")
}

/// A `path_regex`, compiled (case-insensitive on a `case_sensitive = false` route).
pub(super) fn path_regex(
    at: &str,
    text: &str,
    case_sensitive: bool,
) -> Result<PathRegex, ConfigError> {
    let regex = regex::RegexBuilder::new(&anchored(text))
        .case_insensitive(!case_sensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            invalid(
                at,
                format!("{text:?} is not a valid regular expression: {e}"),
            )
        })?;
    Ok(PathRegex {
        text: text.to_owned(),
        regex,
    })
}

/// A capture's name: an identifier.
pub fn capture_name_ok(name: &str) -> bool {
    let mut b = name.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && name.len() <= 64
}

/// A `path_template`, checked and compiled: each literal segment a normalised path segment,
/// each `{name}` a whole segment, `{name...}` only last, no name twice.
pub(super) fn path_template(
    at: &str,
    text: &str,
    case_sensitive: bool,
) -> Result<PathTemplate, ConfigError> {
    let bad = |why: &str| invalid(at, format!("{text:?}: {why}"));
    let Some(body) = text.strip_prefix('/') else {
        return Err(bad("must start with '/'"));
    };
    if text.contains(['?', '#']) {
        return Err(bad("must be a path only, without '?' or '#'"));
    }
    let raw: Vec<&str> = if body.is_empty() {
        Vec::new()
    } else {
        body.split('/').collect()
    };
    if raw.len() > MAX_TEMPLATE_SEGMENTS {
        return Err(bad(&format!(
            "has more than {MAX_TEMPLATE_SEGMENTS} segments"
        )));
    }
    let mut segs = Vec::with_capacity(raw.len());
    let mut names: Vec<&str> = Vec::new();
    for (k, s) in raw.iter().enumerate() {
        if let Some(inner) = s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let (name, rest) = match inner.strip_suffix("...") {
                Some(n) => (n, true),
                None => (inner, false),
            };
            if !capture_name_ok(name) {
                return Err(bad(&format!(
                    "{{{inner}}}: a capture is named with letters, digits and '_' (not starting with a digit), as {{id}} or {{rest...}}"
                )));
            }
            if names.contains(&name) {
                return Err(bad(&format!("names {{{name}}} twice")));
            }
            names.push(name);
            if rest {
                if k + 1 != raw.len() {
                    return Err(bad(&format!(
                        "{{{name}...}} takes the rest of the path: it must be the last segment"
                    )));
                }
                segs.push(TemplateSeg::Rest(name.into()));
            } else {
                segs.push(TemplateSeg::Param(name.into()));
            }
            continue;
        }
        if s.contains(['{', '}']) {
            return Err(bad(&format!(
                "segment {s:?}: a capture is a whole segment ({{name}}), braces cannot appear elsewhere"
            )));
        }
        if s.is_empty() && k + 1 != raw.len() {
            return Err(bad("has an empty segment ('//')"));
        }
        let one = format!("/{s}");
        match crate::http::path::normalize_with(&one, crate::http::path::PathParams::Allow) {
            Ok(n) if n == one => {}
            _ => {
                return Err(bad(&format!(
                    "segment {s:?} is not a normalised path segment (no '.', '..', '%2f', control characters; percent-encode as the normalised path does)"
                )))
            }
        }
        segs.push(TemplateSeg::Lit(if case_sensitive {
            Box::from(*s)
        } else {
            s.to_ascii_lowercase().into_boxed_str()
        }));
    }
    if segs.is_empty() {
        return Err(bad("matches only `/`: write `path = \"/\"`"));
    }
    Ok(PathTemplate {
        text: text.to_owned(),
        segs: segs.into(),
    })
}

/// A host of `host` / `hosts`: an exact name, `*.suffix` or `{name}.suffix`.
pub(super) fn host_pattern(at: &str, raw: &str) -> Result<HostPattern, ConfigError> {
    let trimmed = raw.trim();
    let (wild, rest) = if let Some(r) = trimmed.strip_prefix("*.") {
        (Some(None), r)
    } else if let Some((first, r)) = trimmed.strip_prefix('{').and_then(|s| s.split_once("}.")) {
        if !capture_name_ok(first) {
            return Err(invalid(
                at,
                format!("{raw:?}: a host capture is named with letters, digits and '_', as {{tenant}}.example.com"),
            ));
        }
        (Some(Some(Box::<str>::from(first))), r)
    } else {
        (None, trimmed)
    };
    if rest.contains(['*', '{', '}']) {
        return Err(invalid(
            at,
            format!("{raw:?}: a wildcard is the whole first label only (`*.example.com` or `{{name}}.example.com`)"),
        ));
    }
    let h = super::route::route_host(rest).map_err(|m| invalid(at, m))?;
    Ok(match wild {
        None => HostPattern::Exact(h),
        Some(name) => {
            if h.parse::<std::net::Ipv4Addr>().is_ok() || h.starts_with('[') {
                return Err(invalid(
                    at,
                    format!("{raw:?}: a wildcard needs a domain name"),
                ));
            }
            HostPattern::Wildcard { suffix: h, name }
        }
    })
}

/// A `headers` or `query` entry's test: exactly one of its four keys.
fn field_test(at: &str, m: &RawFieldMatch) -> Result<FieldTest, ConfigError> {
    let given = usize::from(m.value.is_some())
        + usize::from(m.regex.is_some())
        + usize::from(m.present.is_some())
        + usize::from(m.absent.is_some());
    if given != 1 {
        return Err(invalid(
            at,
            "needs exactly one of `value`, `regex`, `present = true` or `absent = true`",
        ));
    }
    if m.present == Some(false) || m.absent == Some(false) {
        return Err(invalid(
            at,
            "`present` and `absent` are written `= true` (for a field that must not be sent, write `absent = true`)",
        ));
    }
    Ok(if let Some(v) = &m.value {
        FieldTest::Exact(v.as_bytes().into())
    } else if let Some(re) = &m.regex {
        FieldTest::Regex(
            regex::bytes::RegexBuilder::new(&anchored(re))
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| {
                    invalid(
                        format!("{at}.regex"),
                        format!("{re:?} is not a valid regular expression: {e}"),
                    )
                })?,
        )
    } else if m.present.is_some() {
        FieldTest::Present
    } else {
        FieldTest::Absent
    })
}

pub(super) fn header_matches(
    at: &str,
    raw: Vec<RawFieldMatch>,
) -> Result<Box<[HeaderMatch]>, ConfigError> {
    if raw.len() > MAX_FIELD_MATCHES {
        return Err(invalid(
            at,
            format!("at most {MAX_FIELD_MATCHES} header matchers"),
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(k, m)| {
            let at = format!("{at}[{k}]");
            let name = http::HeaderName::from_bytes(m.name.trim().as_bytes()).map_err(|_| {
                invalid(
                    format!("{at}.name"),
                    format!("{:?} is not a header name", m.name),
                )
            })?;
            Ok(HeaderMatch {
                name,
                test: field_test(&at, m)?,
            })
        })
        .collect()
}

pub(super) fn query_matches(
    at: &str,
    raw: Vec<RawFieldMatch>,
) -> Result<Box<[QueryMatch]>, ConfigError> {
    if raw.len() > MAX_FIELD_MATCHES {
        return Err(invalid(
            at,
            format!("at most {MAX_FIELD_MATCHES} query matchers"),
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(k, m)| {
            let at = format!("{at}[{k}]");
            if m.name.is_empty() || m.name.contains(['&', ';', '=']) {
                return Err(invalid(
                    format!("{at}.name"),
                    format!("{:?} is not a query parameter name", m.name),
                ));
            }
            Ok(QueryMatch {
                name: m.name.clone(),
                test: field_test(&at, m)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> PathTemplate {
        path_template("t", s, true).unwrap()
    }

    #[test]
    fn templates_match_whole_segments_and_capture_them() {
        let u = t("/users/{id}/orders/{order}");
        assert_eq!(
            u.captures("/users/7/orders/x1", false),
            Some(vec![("id", "7"), ("order", "x1")])
        );
        for miss in [
            "/users/7/orders",
            "/users//orders/1",
            "/users/7/orders/1/",
            "/users/7/orders/1/x",
            "/Users/7/orders/1",
            "/",
        ] {
            assert!(u.captures(miss, false).is_none(), "{miss}");
        }
        let f = t("/files/{rest...}");
        assert_eq!(f.captures("/files", false), Some(vec![("rest", "")]));
        assert_eq!(f.captures("/files/", false), Some(vec![("rest", "")]));
        assert_eq!(f.captures("/files/a/b", false), Some(vec![("rest", "a/b")]));
        assert!(f.captures("/filesx", false).is_none());
        assert!(t("/Users/{id}").matches("/users/1", true));
        assert!(!t("/Users/{id}").matches("/users/1", false));
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in [
            "users",
            "/a/{x}/{x}",
            "/{rest...}/a",
            "/a{b}",
            "/{1x}",
            "/a//b",
            "/a/../b",
            "/",
        ] {
            assert!(path_template("t", bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn wildcard_hosts_never_match_the_apex() {
        let w = host_pattern("h", "*.Example.com").unwrap();
        assert!(w.matches("a.example.com") && w.matches("a.b.example.com"));
        assert!(
            !w.matches("example.com") && !w.matches("aexample.com") && !w.matches(".example.com")
        );
        let n = host_pattern("h", "{tenant}.example.com").unwrap();
        assert!(n.matches("a.example.com") && !n.matches("a.b.example.com"));
        assert!(host_pattern("h", "a.*.com").is_err());
        assert!(host_pattern("h", "*").is_err());
        assert!(host_pattern("h", "*.1.2.3.4").is_err());
        assert!(HostPattern::Exact("a.example.com".into()).within(&w));
        assert!(n.within(&w) && !w.within(&n));
        let deeper = host_pattern("h", "*.x.example.com").unwrap();
        assert!(deeper.within(&w) && !w.within(&deeper));
    }
}
