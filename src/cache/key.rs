//! A request's cache key: the URL it names (scheme, host, path and query, as received) and the
//! route's extra parts (`key = ["header:x-tenant", "consumer", "jwt:sub"]`), one text; and the
//! request values of the fields a stored response varies on (`Vary`), compared as text.
//! `GET` and `HEAD` share a key: a `HEAD` is answered from a stored `GET`.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HOST};

use crate::config::KeyPart;
use crate::http::head::RequestHead;
use crate::pipeline::Trail;

/// The separator of the URL and the extra parts (no header value, path or claim holds it
/// after escaping).
const PART: char = '\u{1}';

/// The key of a request: `scheme://host/path?query`, then each extra part's value (missing:
/// empty), each after [`PART`]. `None` when the request names no host.
pub fn key(
    head: &impl RequestHead,
    tls: bool,
    parts: &[KeyPart],
    trail: &Trail<'_>,
    client: IpAddr,
) -> Option<String> {
    let host = head.authority().or_else(|| {
        head.header_value(&HOST)
            .and_then(crate::http::head::header_str)
    })?;
    let mut out = String::with_capacity(64);
    out.push_str(if tls { "https://" } else { "http://" });
    for c in host.chars() {
        out.push(c.to_ascii_lowercase());
    }
    out.push_str(head.path());
    if let Some(q) = head.query() {
        out.push('?');
        out.push_str(q);
    }
    for part in parts {
        out.push(PART);
        match part {
            KeyPart::Header(name) => {
                for (i, v) in head.header_values(name).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    escape(&String::from_utf8_lossy(v), &mut out);
                }
            }
            KeyPart::Consumer => {
                if let Some(c) = &trail.consumer {
                    escape(&c.name, &mut out);
                }
            }
            KeyPart::Jwt(path) => {
                let claim = trail
                    .token
                    .as_ref()
                    .and_then(|t| crate::subject::claim_bytes(&t.claims, path));
                if let Some(b) = claim {
                    escape(&String::from_utf8_lossy(&b), &mut out);
                }
            }
            KeyPart::Ip => {
                let _ = write!(out, "{client}");
            }
        }
    }
    Some(out)
}

/// A part's value, its separators escaped.
fn escape(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            PART => out.push_str("\\u1"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
}

/// The URL part of a key (what purge and invalidation compare).
pub fn url_of(key: &str) -> &str {
    key.split(PART).next().unwrap_or(key)
}

/// The URL a `Location` or `Content-Location` value names, when it is of `url`'s origin
/// (relative, or absolute with the same scheme and host): what an unsafe method's response
/// invalidates too (RFC 9111 §4.4).
pub fn same_origin(url: &str, location: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let host_end = rest.find('/').unwrap_or(rest.len());
    let origin = &url[..scheme.len() + 3 + host_end];
    let location = location.trim();
    if location.is_empty() {
        return None;
    }
    if let Some(path) = location.strip_prefix("//") {
        return same_origin(url, &format!("{scheme}://{path}"));
    }
    if let Some((s, r)) = location.split_once("://") {
        let h_end = r.find('/').unwrap_or(r.len());
        let same =
            s.eq_ignore_ascii_case(scheme) && r[..h_end].eq_ignore_ascii_case(&rest[..host_end]);
        let path = if h_end == r.len() { "/" } else { &r[h_end..] };
        return same.then(|| format!("{origin}{path}"));
    }
    if location.starts_with('/') {
        return Some(format!("{origin}{location}"));
    }
    // A relative reference: against the URL's directory.
    let path = &rest[host_end..];
    let path = path.split('?').next().unwrap_or(path);
    let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
    Some(format!("{origin}{dir}{location}"))
}

/// The path (with its query) of a key's URL.
pub fn path_of(key: &str) -> &str {
    let url = url_of(key);
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// Whether a response field is one a cache neither stores nor forwards: the hop-by-hop fields
/// and the framing a front writes itself.
pub fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
    )
}

/// The fields of an upstream response as they are stored: the hop-by-hop ones, those its
/// `Connection` names and `Content-Length` (the front frames the stored body) left out.
pub fn stored_fields(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (n, v) in headers {
        if hop_by_hop(n)
            || *n == http::header::CONTENT_LENGTH
            || named.iter().any(|c| c == n.as_str())
        {
            continue;
        }
        out.append(n.clone(), v.clone());
    }
    out
}

/// One field's values in a request, normalised for `Vary` matching.
pub fn request_value(head: &impl RequestHead, name: &HeaderName) -> Option<Box<str>> {
    let mut out = String::new();
    let mut any = false;
    for v in head.header_values(name) {
        normalise_into(&mut out, v, &mut any);
    }
    any.then(|| out.into_boxed_str())
}

/// Appends a field value's comma-separated items to `out` (`,` between them, spaces around
/// them dropped); `any`: `out` holds an item already.
fn normalise_into(out: &mut String, value: &[u8], any: &mut bool) {
    for item in String::from_utf8_lossy(value).split(',') {
        if *any {
            out.push(',');
        }
        out.push_str(item.trim());
        *any = true;
    }
}

/// Every field of a request, its values normalised as [`request_value`] does, by lower-case
/// name (`None`: the head cannot list its fields). Bounded by the head's size.
pub fn request_fields(head: &impl RequestHead) -> Option<Vec<(HeaderName, Box<str>)>> {
    let mut out: Vec<(HeaderName, String)> = Vec::new();
    for (n, v) in head.all_fields()? {
        let Ok(name) = HeaderName::from_bytes(n) else {
            continue;
        };
        match out.iter_mut().find(|(h, _)| *h == name) {
            Some((_, s)) => normalise_into(s, v, &mut true),
            None => {
                let mut s = String::new();
                normalise_into(&mut s, v, &mut false);
                out.push((name, s));
            }
        }
    }
    Some(
        out.into_iter()
            .map(|(n, s)| (n, s.into_boxed_str()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::OwnedHead;
    use http::HeaderValue;

    fn head(path: &str, query: Option<&str>, headers: &[(&str, &str)]) -> OwnedHead {
        let mut h = OwnedHead {
            path: path.into(),
            query: query.map(Into::into),
            ..OwnedHead::default()
        };
        for (n, v) in headers {
            h.headers.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_key_is_the_url_and_the_routes_parts() {
        let trail = Trail::default();
        let ip: IpAddr = [10, 0, 0, 1].into();
        let h = head(
            "/a/b",
            Some("x=1"),
            &[("host", "API.example.com:8080"), ("x-tenant", "t1")],
        );
        let k = key(&h, true, &[], &trail, ip).unwrap();
        assert_eq!(k, "https://api.example.com:8080/a/b?x=1");
        let parts = [
            KeyPart::Header(HeaderName::from_static("x-tenant")),
            KeyPart::Ip,
        ];
        let k = key(&h, false, &parts, &trail, ip).unwrap();
        assert_eq!(url_of(&k), "http://api.example.com:8080/a/b?x=1");
        assert_eq!(path_of(&k), "/a/b?x=1");
        assert!(k.ends_with("\u{1}t1\u{1}10.0.0.1"));
        // Another tenant, another key; none: an empty part, not the same as "t1".
        let other = head("/a/b", Some("x=1"), &[("host", "api.example.com:8080")]);
        assert_ne!(key(&other, false, &parts, &trail, ip).unwrap(), k);
        // No host: no key.
        assert!(key(&head("/", None, &[]), false, &[], &trail, ip).is_none());
    }

    #[test]
    fn a_location_of_the_same_origin_is_a_url_to_invalidate() {
        let url = "http://a.example/x/y?q=1";
        assert_eq!(
            same_origin(url, "/z").as_deref(),
            Some("http://a.example/z")
        );
        assert_eq!(
            same_origin(url, "z?k").as_deref(),
            Some("http://a.example/x/z?k")
        );
        assert_eq!(
            same_origin(url, "HTTP://A.example/w").as_deref(),
            Some("http://a.example/w")
        );
        assert_eq!(same_origin(url, "https://a.example/w"), None);
        assert_eq!(same_origin(url, "http://b.example/w"), None);
        assert_eq!(same_origin(url, "//b.example/w"), None);
    }

    #[test]
    fn stored_fields_leave_the_hop_by_hop_ones_out() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "x-private"),
            ("x-private", "1"),
            ("keep-alive", "5"),
            ("content-length", "3"),
            ("etag", "\"e\""),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let s = stored_fields(&h);
        assert_eq!(s.len(), 1);
        assert_eq!(s["etag"], "\"e\"");
    }

    #[test]
    fn request_fields_are_listed_once_by_name_as_vary_reads_them() {
        let h = head(
            "/",
            None,
            &[("accept", "a/b ,  c/d"), ("Accept", "e/f"), ("x", "1")],
        );
        let f = request_fields(&h).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(&*f[0].1, "a/b,c/d,e/f");
        assert_eq!(
            Some(f[0].1.clone()),
            request_value(&h, &HeaderName::from_static("accept"))
        );
    }
}
