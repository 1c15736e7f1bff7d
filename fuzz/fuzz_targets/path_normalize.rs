//! The path normaliser (`tollgate::http::path`), which decides the one path that is both routed on and
//! forwarded.
//!
//! Input: one byte choosing the `[server] path_params` setting(s), then the path.
//!
//! Properties, for every setting:
//! - normalising twice changes nothing, and a normal form without escapes is recognised as such
//!   without a copy (`Cow::Borrowed`);
//! - the normal form is absolute, has no `//`, no dot-segment, no control character, no `\`, and
//!   no `;` unless `path_params = "allow"`;
//! - the normal form is what the upstream receives: it is a valid request path that `http`
//!   (hyper's client) sends as it is;
//! - one spelling per path: every other spelling of the normal form that a percent-decoding
//!   upstream reads as the same path (an escape decoded, a character encoded, hex in lower case),
//!   and that a client can send, is refused or normalises to the same normal form. The gateway
//!   routes on the normal form, so no spelling that the upstream reads as a route's path can be
//!   routed elsewhere (and dodge that route's limits).
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use tollgate::http::path::{normalize_with, PathParams};

/// `raw` as a client could send it: a path that `http` (hyper's server and client) accepts and
/// reads back unchanged.
fn sendable(raw: &str) -> bool {
    http::uri::PathAndQuery::try_from(raw)
        .is_ok_and(|pq| pq.path() == raw && pq.query().is_none() && raw.starts_with('/'))
}

fn hex_digit(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Every spelling of `n` one step away that a percent-decoding reader takes for the same path.
fn respellings(n: &str, params: PathParams) -> Vec<String> {
    let b = n.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    // Bounded: a long path is checked on its first 64 positions.
    while i < b.len() && out.len() < 192 {
        if b[i] == b'%' && i + 2 < b.len() {
            let (hi, lo) = (b[i + 1], b[i + 2]);
            // The hex digits in lower case.
            let mut lower = n.to_owned();
            lower.replace_range(
                i..i + 3,
                &format!(
                    "%{}{}",
                    char::from(hi).to_ascii_lowercase(),
                    char::from(lo).to_ascii_lowercase()
                ),
            );
            out.push(lower);
            // The escape decoded (a run of escapes that decodes to one UTF-8 character at once).
            let mut run = Vec::new();
            let mut j = i;
            while j + 2 < b.len() && b[j] == b'%' {
                let (Some(h), Some(l)) = (hex_digit(b[j + 1]), hex_digit(b[j + 2])) else {
                    break;
                };
                run.push(h * 16 + l);
                j += 3;
                if let Ok(s) = std::str::from_utf8(&run) {
                    // '%' would start a different escape, '?' a query, '#' a fragment, '/' a
                    // segment: none of those is the same path.
                    if !matches!(s, "%" | "?" | "#" | "/") {
                        let mut decoded = n.to_owned();
                        decoded.replace_range(i..j, s);
                        out.push(decoded);
                    }
                    break;
                }
                if run.len() == 4 {
                    break;
                }
            }
            i += 3;
            continue;
        }
        // A character percent-encoded (all of its bytes).
        let Some(c) = n[i..].chars().next() else {
            break;
        };
        let len = c.len_utf8();
        if c != '/' && !(c == ';' && params != PathParams::Allow) {
            let encoded: String = n.as_bytes()[i..i + len]
                .iter()
                .map(|byte| format!("%{byte:02X}"))
                .collect();
            let mut s = n.to_owned();
            s.replace_range(i..i + len, &encoded);
            out.push(s);
        }
        i += len;
    }
    out
}

fn check(raw: &str, params: PathParams) {
    let Ok(n) = normalize_with(raw, params) else {
        return;
    };
    let n = n.into_owned();
    match normalize_with(&n, params) {
        // Without escapes, recognised as normal without a copy.
        Ok(Cow::Borrowed(again)) => assert_eq!(again, n, "normalising {raw:?} twice"),
        Ok(Cow::Owned(again)) if n.contains('%') => {
            assert_eq!(again, n, "normalising {raw:?} twice")
        }
        other => panic!("{raw:?} → {n:?} → {other:?} ({params:?}): not a fixed point"),
    }
    assert!(n.starts_with('/'), "{raw:?} → {n:?}");
    for bad in ["//", "/./", "/../", "\\"] {
        assert!(!n.contains(bad), "{raw:?} → {n:?} contains {bad:?}");
    }
    assert!(
        !n.ends_with("/.") && !n.ends_with("/.."),
        "{raw:?} → {n:?} ends in a dot-segment"
    );
    assert!(
        !n.bytes().any(|b| b < 0x20 || b == 0x7f),
        "{raw:?} → {n:?} has a control character"
    );
    if params != PathParams::Allow {
        assert!(!n.contains(';'), "{raw:?} → {n:?} ({params:?}) keeps a ';'");
    }
    assert!(
        sendable(&n),
        "{raw:?} → {n:?}: not a path the upstream receives as it is"
    );
    for other in respellings(&n, params) {
        if !sendable(&other) {
            continue;
        }
        if let Ok(m) = normalize_with(&other, params) {
            assert_eq!(
                m, n,
                "{other:?} is {n:?} to a decoding upstream, but normalises to {m:?} ({params:?})"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, path)) = data.split_first() else {
        return;
    };
    let Ok(raw) = std::str::from_utf8(path) else {
        return;
    };
    let all = [PathParams::Reject, PathParams::Strip, PathParams::Allow];
    match usize::from(which % 4) {
        3 => all.into_iter().for_each(|p| check(raw, p)),
        k => check(raw, all[k]),
    }
});
