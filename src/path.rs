//! Request-path normalisation: the one path that is both routed on and forwarded.
//!
//! A gateway that routes on one spelling of a path and forwards another lets a client dodge a
//! route's limits (`/open/../strict` routed as `/open`, resolved by the upstream as `/strict`). So
//! the path is normalised once, the route and limits are decided on the result, and exactly that
//! result is forwarded:
//! - percent-encoded unreserved characters are decoded (`%61` → `a`, `%2e` → `.`; RFC 3986
//!   §6.2.2.2) and other escapes get upper-case hex;
//! - dot-segments are removed (RFC 3986 §5.2.4) and empty segments (`//`) merged, like nginx's
//!   `merge_slashes`;
//! - what cannot be made unambiguous is refused with 400: an encoded `/` or `\` (`%2F`, `%5C`,
//!   which some upstreams decode into a separator), an encoded NUL, a raw `\`, a malformed escape,
//!   and `..` above the root.

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

/// Whether `path` is already in normal form (no escapes, no `//`, no dot-segments).
fn looks_normal(path: &str) -> bool {
    let b = path.as_bytes();
    !(b.contains(&b'%')
        || b.contains(&b'\\')
        || path.contains("//")
        || path.contains("/./")
        || path.contains("/../")
        || path.ends_with("/.")
        || path.ends_with("/.."))
}

/// Normalises an origin-form path (without the query). Borrowed when it is already normal.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if looks_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    // 1. Decode unreserved escapes, upper-case the rest, refuse ambiguous ones.
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
            if matches!(v, b'/' | b'\\' | 0) {
                return Err(PathError::AmbiguousEscape);
            }
            if is_unreserved(v) {
                decoded.push(char::from(v));
            } else {
                decoded.push('%');
                decoded.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
                decoded.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
            }
            i += 3;
        } else if b == b'\\' {
            return Err(PathError::Backslash);
        } else {
            // Multi-byte UTF-8 passes through byte-wise: `path` is a &str, and only ASCII is
            // touched above, so copying the run up to the next ASCII special is safe.
            let start = i;
            while i < bytes.len() && bytes[i] != b'%' && bytes[i] != b'\\' {
                i += 1;
            }
            decoded.push_str(&path[start..i]);
        }
    }
    // 2. Remove dot-segments and merge empty ones.
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = decoded.split('/').skip(1).collect();
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
        assert_eq!(n("/a%00"), Err(PathError::AmbiguousEscape));
        assert_eq!(n("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(n("/a%4"), Err(PathError::BadEscape));
        assert_eq!(n("/a\\b"), Err(PathError::Backslash));
    }

    #[test]
    fn above_root_is_refused() {
        assert_eq!(n("/.."), Err(PathError::AboveRoot));
        assert_eq!(n("/a/../../b"), Err(PathError::AboveRoot));
        assert_eq!(n("x"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn normalising_is_idempotent() {
        for p in ["/a/../b/", "//x//y", "/%7euser/./a", "/a/b/c/../../d"] {
            let once = n(p).unwrap();
            assert_eq!(n(&once).unwrap(), once, "{p}");
        }
    }
}
