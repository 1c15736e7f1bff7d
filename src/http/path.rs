//! Request-path normalisation: the one path that is both routed on and forwarded.
//!
//! A gateway that routes on one spelling of a path and forwards another lets a client dodge a
//! route's limits (`/open/../strict` routed as `/open`, resolved by the upstream as `/strict`). So
//! the path is normalised once, the route and limits are decided on the result, and exactly that
//! result is forwarded:
//! - each path has one spelling, since an upstream that percent-decodes before routing (Go's
//!   `net/http`, Spring, Express, nginx) reads `/x%3Arun` as `/x:run` and `/caf%C3%A9` as
//!   `/café`: an escape of a character that may stand raw in a path (RFC 3986 `pchar`:
//!   unreserved, sub-delims, `:` and `@`) is decoded (`%61` → `a`, `%2e` → `.`, `%3A` → `:`),
//!   and every other byte is percent-encoded with upper-case hex (`%3f` → `%3F`, `"` → `%22`,
//!   `é` → `%C3%A9`), so the normal form is ASCII;
//! - dot-segments are removed (RFC 3986 §5.2.4) and empty segments (`//`) merged, like nginx's
//!   `merge_slashes`;
//! - what cannot be made unambiguous is refused with 400: an encoded `/` or `\` (`%2F`, `%5C`,
//!   which some upstreams decode into a separator), an encoded or raw control character (`%00` to
//!   `%1F`, `%7F`), encoded whitespace at either end of a segment (`/admin%20`, which some
//!   frameworks trim into `/admin`), a raw `\`, a malformed escape, and `..` above the root;
//! - path parameters (`;` in a segment, which Java servlet containers and Spring strip before
//!   routing: `/admin;x` is `/admin` to them) follow `[server] path_params`: refused (the default),
//!   stripped from each segment before routing (what is stripped is not forwarded either), or
//!   allowed as ordinary characters. An encoded `;` (`%3B`) is refused unless they are allowed
//!   (then it is decoded like any plain character): stacks differ on whether they decode it
//!   before or after stripping.

use std::borrow::Cow;

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path must start with '/'")]
    NotAbsolute,
    #[error("malformed percent-encoding in the path")]
    BadEscape,
    #[error("encoded '/', '\\' or NUL in the path is ambiguous and not accepted")]
    AmbiguousEscape,
    #[error("'\\' in the path is not accepted")]
    Backslash,
    #[error("the path climbs above the root with '..'")]
    AboveRoot,
    #[error("a control character in the path (raw or encoded) is not accepted")]
    ControlCharacter,
    #[error("encoded whitespace at the start or end of a path segment is not accepted")]
    EdgeWhitespace,
    #[error("';' path parameters are not accepted ([server] path_params)")]
    PathParameter,
}

/// What `;` path parameters (`/admin;jsessionid=x`) do: `[server] path_params`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathParams {
    /// A `;` in the path, raw or encoded, is a 400 (the default).
    #[default]
    Reject,
    /// Each segment's `;…` is removed before routing and not forwarded; an encoded `;` is a 400.
    Strip,
    /// `;` is an ordinary character, routed on and forwarded as written.
    Allow,
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// Whether byte `b` stands for itself in a normal path: RFC 3986 `pchar` (unreserved,
/// sub-delims, `:`, `@`) and `/`. An escape of one of these is decoded; every other byte is
/// percent-encoded. (`/` and `;` have rules of their own before this applies.)
fn is_plain(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'/' | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

/// Whether `path` is already in normal form (only plain bytes, so no escapes; no `;` unless
/// `params` allows it; no `//`, no dot-segments).
fn looks_normal(path: &str, params: PathParams) -> bool {
    let b = path.as_bytes();
    let semicolon_ok = params == PathParams::Allow;
    !(b.iter()
        .any(|&c| !is_plain(c) || (c == b';' && !semicolon_ok))
        || path.contains("//")
        || path.contains("/./")
        || path.contains("/../")
        || path.ends_with("/.")
        || path.ends_with("/.."))
}

/// Whitespace some stacks trim from a segment's ends, as it appears in the one spelling.
const ESCAPED_SPACE: &str = "%20";

/// Appends `v` percent-encoded with upper-case hex.
fn push_escaped(out: &mut String, v: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(v >> 4)]));
    out.push(char::from(HEX[usize::from(v & 0xf)]));
}

/// [`normalize_with`] the default `[server] path_params` (`"reject"`).
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    normalize_with(path, PathParams::Reject)
}

/// Normalises an origin-form path (without the query). Borrowed when it is already normal.
pub fn normalize_with(path: &str, params: PathParams) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if looks_normal(path, params) {
        return Ok(Cow::Borrowed(path));
    }
    if path.bytes().any(is_control) {
        return Err(PathError::ControlCharacter);
    }
    if params == PathParams::Reject && path.contains(';') {
        return Err(PathError::PathParameter);
    }
    // 1. One spelling: decode the escapes of plain bytes, encode every other byte, refuse
    //    ambiguous ones.
    let bytes = path.as_bytes();
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let (hi, lo) = match (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => (h, l),
                _ => return Err(PathError::BadEscape),
            };
            let v = hi * 16 + lo;
            if matches!(v, b'/' | b'\\') {
                return Err(PathError::AmbiguousEscape);
            }
            if is_control(v) {
                return Err(PathError::ControlCharacter);
            }
            if v == b';' && params != PathParams::Allow {
                return Err(PathError::PathParameter);
            }
            if is_plain(v) {
                decoded.push(char::from(v));
            } else {
                push_escaped(&mut decoded, v);
            }
            i += 3;
        } else if b == b'\\' {
            return Err(PathError::Backslash);
        } else if is_plain(b) {
            // A run of plain bytes (ASCII, so `path[start..i]` is on character boundaries).
            let start = i;
            while i < bytes.len() && is_plain(bytes[i]) {
                i += 1;
            }
            decoded.push_str(&path[start..i]);
        } else {
            // A byte that may not stand raw (a space, `"`, non-ASCII UTF-8, …): encoded.
            push_escaped(&mut decoded, b);
            i += 1;
        }
    }
    // Whitespace at either end of a segment or of a `;` parameter, which some stacks trim, is
    // refused. Checked on the one spelling, so that a space raw or encoded, and a `;` raw or
    // encoded, are judged alike (hyper hands over no raw space, but `/-/explain` is given a
    // decoded path).
    let space = ESCAPED_SPACE;
    if decoded
        .split(['/', ';'])
        .any(|part| part.starts_with(space) || part.ends_with(space))
    {
        return Err(PathError::EdgeWhitespace);
    }
    // 2. Remove dot-segments and merge empty ones (after stripping path parameters, as the
    //    servlet containers that strip them do: `/..;x/admin` is `/../admin` to them).
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = decoded
        .split('/')
        .skip(1)
        .map(|seg| match params {
            PathParams::Strip => seg.split(';').next().unwrap_or(""),
            _ => seg,
        })
        .collect();
    let last = segs.len().saturating_sub(1);
    let mut trailing_slash = false;
    for (k, seg) in segs.iter().enumerate() {
        match *seg {
            "" => trailing_slash = k == last,
            "." => trailing_slash = k == last,
            ".." => {
                if out.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = k == last;
            }
            s => {
                out.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut result = String::with_capacity(decoded.len());
    for seg in &out {
        result.push('/');
        result.push_str(seg);
    }
    if trailing_slash || result.is_empty() {
        result.push('/');
    }
    Ok(Cow::Owned(result))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p).map(|c| c.into_owned())
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for p in [
            "/",
            "/api",
            "/api/",
            "/api/v1/x.json",
            "/a/.hidden",
            "/a/..b",
        ] {
            assert!(matches!(normalize(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn dot_segments_and_slashes() {
        assert_eq!(n("/a/../b").unwrap(), "/b");
        assert_eq!(n("/a/%2e%2e/b").unwrap(), "/b");
        assert_eq!(n("/a/%2E%2e/b").unwrap(), "/b");
        assert_eq!(n("//b").unwrap(), "/b");
        assert_eq!(n("/./b").unwrap(), "/b");
        assert_eq!(n("/a/b/..").unwrap(), "/a/");
        assert_eq!(n("/a/./").unwrap(), "/a/");
        assert_eq!(n("/a//b//").unwrap(), "/a/b/");
        assert_eq!(n("/open/../strict/x").unwrap(), "/strict/x");
        assert_eq!(n("/a/.").unwrap(), "/a/");
    }

    #[test]
    fn escapes() {
        assert_eq!(n("/%61pi").unwrap(), "/api");
        assert_eq!(n("/a%20b").unwrap(), "/a%20b");
        assert_eq!(n("/a%3fb").unwrap(), "/a%3Fb");
        assert_eq!(n("/caf%C3%A9").unwrap(), "/caf%C3%A9");
        assert_eq!(n("/a/..%2fb"), Err(PathError::AmbiguousEscape));
        assert_eq!(n("/a%2Fb"), Err(PathError::AmbiguousEscape));
        assert_eq!(n("/a%5cb"), Err(PathError::AmbiguousEscape));
        assert_eq!(n("/a%00"), Err(PathError::ControlCharacter));
        assert_eq!(n("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(n("/a%4"), Err(PathError::BadEscape));
        assert_eq!(n("/a\\b"), Err(PathError::Backslash));
    }

    /// Spellings that some upstream reads as `/admin` while a plain router sees another path
    /// (Hardening III #1): refused, or stripped, never routed elsewhere as written.
    #[test]
    fn spellings_that_dodge_a_route_are_refused() {
        for p in [
            "/admin;x",
            "/admin%3bx",
            "/admin%3Bx",
            "/admin;",
            "/..;/admin",
        ] {
            assert_eq!(n(p), Err(PathError::PathParameter), "{p}");
        }
        for p in [
            "/admin%09",
            "/admin%0a",
            "/admin%7F",
            "/admin%1f/x",
            "/a\tb",
        ] {
            assert_eq!(n(p), Err(PathError::ControlCharacter), "{p}");
        }
        assert_eq!(n("/a\x01b"), Err(PathError::ControlCharacter));
        for p in ["/admin%20", "/%20admin", "/admin%20/x", "/x/%20"] {
            assert_eq!(n(p), Err(PathError::EdgeWhitespace), "{p}");
        }
        // Inside a segment a space is just a character.
        assert_eq!(n("/a%20b").unwrap(), "/a%20b");
    }

    #[test]
    fn path_params_strip_and_allow() {
        let strip = |p: &str| normalize_with(p, PathParams::Strip).map(|c| c.into_owned());
        let allow = |p: &str| normalize_with(p, PathParams::Allow).map(|c| c.into_owned());
        assert_eq!(strip("/admin;x").unwrap(), "/admin");
        assert_eq!(
            strip("/admin;jsessionid=1/users;v=2").unwrap(),
            "/admin/users"
        );
        assert_eq!(strip("/open/..;x/admin").unwrap(), "/admin");
        assert_eq!(strip("/;x/admin").unwrap(), "/admin");
        assert_eq!(strip("/admin%3bx"), Err(PathError::PathParameter));
        assert_eq!(allow("/admin;x").unwrap(), "/admin;x");
        assert!(matches!(
            normalize_with("/m;v=1", PathParams::Allow),
            Ok(Cow::Borrowed(_))
        ));
        // Allowed, `%3B` is `;` (one spelling per path).
        assert_eq!(allow("/admin%3bx").unwrap(), "/admin;x");
        assert_eq!(allow("/admin%09"), Err(PathError::ControlCharacter));
        for p in ["/a;b/../c;d", "/x;;/y"] {
            let once = strip(p).unwrap();
            assert_eq!(strip(&once).unwrap(), once, "{p}");
        }
    }

    #[test]
    fn above_root_is_refused() {
        assert_eq!(n("/.."), Err(PathError::AboveRoot));
        assert_eq!(n("/a/../../b"), Err(PathError::AboveRoot));
        assert_eq!(n("x"), Err(PathError::NotAbsolute));
    }

    /// Found by the fuzz target `path_normalize`: a percent-decoding upstream (Go's `net/http`,
    /// Spring, Express, nginx) reads `/caf%C3%A9` and `/café`, `/x%3Arun` and `/x:run`, as the
    /// same path, so the gateway must route them the same. Each path has one spelling: an escape
    /// of a character that may stand raw is decoded, any other byte (non-ASCII included) is
    /// percent-encoded.
    #[test]
    fn every_spelling_a_decoding_upstream_reads_alike_normalises_alike() {
        let allow = |p: &str| normalize_with(p, PathParams::Allow).map(|c| c.into_owned());
        for (spellings, normal) in [
            (&["/caf%C3%A9", "/caf%c3%a9", "/café"][..], "/caf%C3%A9"),
            (&["/v1/x:run", "/v1/x%3Arun", "/v1/x%3arun"], "/v1/x:run"),
            (&["/u/me@x.org", "/u/me%40x.org"], "/u/me@x.org"),
            (&["/c++", "/c%2B%2B", "/c%2b+"], "/c++"),
            (
                &["/a!$&'()*,=b", "/a%21%24%26%27%28%29%2A%2C%3Db"],
                "/a!$&'()*,=b",
            ),
            (
                &["/\"{}[]^|x", "/%22%7B%7D%5B%5D%5E%7Cx"],
                "/%22%7B%7D%5B%5D%5E%7Cx",
            ),
        ] {
            for s in spellings {
                assert_eq!(n(s).unwrap(), normal, "{s}");
                assert_eq!(allow(s).unwrap(), normal, "{s}");
            }
        }
        // A normal form without escapes is recognised as such without a copy.
        for normal in ["/v1/x:run", "/u/me@x.org", "/a!$&'()*+,=b"] {
            assert!(
                matches!(normalize(normal), Ok(Cow::Borrowed(_))),
                "{normal}"
            );
        }
        // With `;` allowed, `%3B` and `;` are one character too.
        assert_eq!(allow("/m%3Bv=1").unwrap(), "/m;v=1");
        // Raw whitespace at a segment's ends is refused like encoded whitespace (the path given
        // to `/-/explain` is already decoded).
        assert_eq!(n("/admin "), Err(PathError::EdgeWhitespace));
        assert_eq!(n("/ admin/x"), Err(PathError::EdgeWhitespace));
        assert_eq!(n("/a b").unwrap(), "/a%20b");
    }

    #[test]
    fn normalising_is_idempotent() {
        for p in ["/a/../b/", "//x//y", "/%7euser/./a", "/a/b/c/../../d"] {
            let once = n(p).unwrap();
            assert_eq!(n(&once).unwrap(), once, "{p}");
        }
    }

    /// Found by the fuzz target `path_normalize` (normalising twice changed the answer): with
    /// `;` allowed, whitespace next to a `;` written `%3B`, or a space written raw, passed the
    /// first time and was refused the second, once both were in their one spelling. Whitespace
    /// at a segment's or parameter's ends is now judged on that spelling.
    #[test]
    fn whitespace_next_to_an_encoded_semicolon_is_judged_like_a_raw_one() {
        let allow = |p: &str| normalize_with(p, PathParams::Allow).map(|c| c.into_owned());
        for p in [
            "/a %3Bb",
            "/a%20%3Bb",
            "/a%3B%20b",
            "/a%20;b",
            "/a;%20b",
            "/a%3B /b",
        ] {
            assert_eq!(allow(p), Err(PathError::EdgeWhitespace), "{p}");
        }
        assert_eq!(allow("/a%20b%3Bc").unwrap(), "/a%20b;c");
        assert_eq!(allow("/a%20b;c").unwrap(), "/a%20b;c");
    }
}
