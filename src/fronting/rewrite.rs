//! Path rewrites: `rewrite = { match = "^/v1/(.*)$", to = "/api/$1" }` on a route.
//!
//! The regular expression (the `regex` crate: linear time in the path, whatever the pattern)
//! is matched against the normalised path after routing: the route, and so its limits, are
//! decided on the path the client sent, and a rewrite cannot move a request to another route.
//! On a match the path sent upstream is `to` with its groups filled in (the whole path is
//! replaced, as nginx's `rewrite` and ingress-nginx's `rewrite-target` do); without a match the
//! path is forwarded as usual. The client's query follows unchanged.
//!
//! The result must itself be a normalised path (checked with the same normaliser as a client's
//! path): groups joined with text can spell `..`, `//` or an escape (`/api/.` + `./admin`), which
//! an upstream would resolve above the rewritten prefix. Such a request is answered 400, never
//! forwarded. `to` is checked at load the same way (with its groups filled with a plain
//! segment), so a rewrite that could only produce such paths is refused by `tollgate check`.

use regex::{Regex, RegexBuilder};
use serde::Deserialize;

use crate::http::path::{normalize_with, PathParams};

/// The most memory a compiled `match` may take (the `regex` crate's size limit).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Lit(String),
    Group(usize),
}

/// A route's `rewrite`, compiled.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawRewrite")]
pub struct Rewrite {
    regex: Regex,
    to: Vec<Piece>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRewrite {
    #[serde(rename = "match")]
    pattern: String,
    to: String,
}

/// Why a rewritten path is not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotNormal;

impl TryFrom<RawRewrite> for Rewrite {
    type Error = String;
    fn try_from(r: RawRewrite) -> Result<Rewrite, String> {
        let regex = RegexBuilder::new(&r.pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| format!("rewrite.match: {e}"))?;
        let to = parse_to(&r.to, &regex).map_err(|e| format!("rewrite.to: {:?}: {e}", r.to))?;
        let rw = Rewrite { regex, to };
        // Every group as a plain segment: what is left is the template's own text.
        let sample = rw.fill(|_| "x");
        match normalize_with(&sample, PathParams::Allow) {
            Ok(n) if n == sample => Ok(rw),
            _ => Err(format!(
                "rewrite.to: {:?} must give a normalised path (no '.', '..', '//', %2F or other escapes of \
                 plain characters, no control characters)",
                r.to
            )),
        }
    }
}

fn parse_to(to: &str, regex: &Regex) -> Result<Vec<Piece>, String> {
    if !to.starts_with('/') {
        return Err("must start with '/'".into());
    }
    if to.contains(['?', '#']) {
        return Err("must be a path only (the client's query is kept)".into());
    }
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut rest = to;
    while let Some(i) = rest.find('$') {
        lit.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            lit.push('$');
            rest = r;
            continue;
        }
        let (name, after) = if let Some(r) = rest.strip_prefix('{') {
            let end = r.find('}').ok_or("`${` without its `}`")?;
            (&r[..end], &r[end + 1..])
        } else {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if end == 0 {
                return Err("`$` must be followed by a group number, `{name}` or `$`".into());
            }
            (&rest[..end], &rest[end..])
        };
        let group = match name.parse::<usize>() {
            Ok(n) if n < regex.captures_len() => n,
            Ok(n) => return Err(format!("`match` has no group {n}")),
            Err(_) => regex
                .capture_names()
                .position(|c| c == Some(name))
                .ok_or_else(|| format!("`match` has no group named {name:?}"))?,
        };
        if !lit.is_empty() {
            pieces.push(Piece::Lit(std::mem::take(&mut lit)));
        }
        pieces.push(Piece::Group(group));
        rest = after;
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        pieces.push(Piece::Lit(lit));
    }
    Ok(pieces)
}

impl Rewrite {
    fn fill<'a>(&'a self, group: impl Fn(usize) -> &'a str) -> String {
        let mut out = String::new();
        for p in &self.to {
            match p {
                Piece::Lit(l) => out.push_str(l),
                Piece::Group(g) => out.push_str(group(*g)),
            }
        }
        out
    }

    /// The rewritten path for a normalised request path: `Ok(None)` when `match` does not
    /// match, `Err` when the result is not a normalised path (see the module comment).
    pub fn apply(&self, path: &str, params: PathParams) -> Result<Option<String>, NotNormal> {
        let Some(caps) = self.regex.captures(path) else {
            return Ok(None);
        };
        let mut out = String::with_capacity(path.len() + 16);
        for p in &self.to {
            match p {
                Piece::Lit(l) => out.push_str(l),
                Piece::Group(g) => out.push_str(caps.get(*g).map_or("", |m| m.as_str())),
            }
        }
        match normalize_with(&out, params) {
            Ok(n) if n == out => Ok(Some(out)),
            _ => Err(NotNormal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(toml: &str) -> Result<Rewrite, String> {
        toml::from_str::<Rewrite>(toml).map_err(|e| e.to_string())
    }

    #[test]
    fn groups_fill_the_target() {
        let r = rw("match = \"^/v1/(?P<rest>.*)$\"\nto = \"/api/${rest}\"").unwrap();
        let p = PathParams::Reject;
        assert_eq!(r.apply("/v1/users/7", p), Ok(Some("/api/users/7".into())));
        assert_eq!(r.apply("/v2/users", p), Ok(None));
        let r = rw("match = \"^/v1/(.*)$\"\nto = \"/api/$1\"").unwrap();
        assert_eq!(r.apply("/v1/a%20b", p), Ok(Some("/api/a%20b".into())));
    }

    #[test]
    fn a_result_that_climbs_or_escapes_is_refused() {
        let r = rw("match = \"^/v1/x(.*)$\"\nto = \"/api/.$1\"").unwrap();
        // `/api/.` + `./admin` = `/api/../admin`: above `/api`.
        assert_eq!(r.apply("/v1/x./admin", PathParams::Reject), Err(NotNormal));
        let r = rw("match = \"^/v1/([^/]*)(.*)$\"\nto = \"/api/$1$2\"").unwrap();
        assert_eq!(
            r.apply("/v1/", PathParams::Reject),
            Ok(Some("/api/".into()))
        );
        let r = rw("match = \"^/f/([a-z0-9]*)/(.*)$\"\nto = \"/files/$1%2$2\"").unwrap_err();
        assert!(r.contains("normalised"), "{r}");
    }

    #[test]
    fn bad_rewrites_are_refused_at_load() {
        for (toml, want) in [
            ("match = \"(\"\nto = \"/x\"", "rewrite.match"),
            ("match = \"^/(.*)$\"\nto = \"x/$1\"", "start with"),
            ("match = \"^/(.*)$\"\nto = \"/$2\"", "no group 2"),
            ("match = \"^/(.*)$\"\nto = \"/${name}\"", "no group named"),
            ("match = \"^/(.*)$\"\nto = \"/a/../$1\"", "normalised"),
            ("match = \"^/(.*)$\"\nto = \"/a/%2F$1\"", "normalised"),
            ("match = \"^/(.*)$\"\nto = \"/a?x=1\"", "query"),
            ("match = \"^/(.*)$\"\nto = \"/$x\"", "group number"),
        ] {
            let e = rw(toml).unwrap_err();
            assert!(e.contains(want), "{toml}: {e}");
        }
    }
}
