//! CORS: `[routes.cors]`. The gateway answers a route's preflights itself and puts the CORS
//! headers on every response of the route, its own answers included: a browser app can read a
//! 429's `Retry-After` and `RateLimit` only if the 429 carries them, and only the gateway
//! writes its 429s.
//!
//! Origins are compared as browsers send them (RFC 6454 serialisation: `scheme://host[:port]`,
//! no path), case-insensitively; the configured spelling is echoed. What a browser never sends
//! matches nothing: a path or trailing `/`, user-info, whitespace, a list of origins, two
//! `Origin` headers. `Origin: null` (sandboxed frames, `file:` pages, some redirects) is an
//! opaque origin anyone can produce: it matches only `"*"` (which answers `*`, never `null`);
//! `"null"` is refused in `allow_origins`.
//!
//! A preflight's cost does not grow with what it asks: with `allow_headers` listed, the answer
//! is one value built at load; with `"*"` under credentials the requested list is checked in
//! one pass and echoed (bounded by `[server] max_header_bytes`, like any header).

use std::time::Duration;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, ACCESS_CONTROL_ALLOW_CREDENTIALS,
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::Method;
use serde::Deserialize;

use super::HeaderEdit;
use crate::http::head::{header_str, RequestHead};

/// The longest `max_age`: browsers cap it lower anyway (Firefox a day, Chromium two hours).
pub const MAX_MAX_AGE: Duration = Duration::from_secs(86_400);

/// The methods allowed when `allow_methods` is left out and the route has no `methods`.
const DEFAULT_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE";

/// A list that may be `["*"]`.
#[derive(Debug, Clone)]
enum Listed {
    /// `"*"`: `*` without credentials; with credentials the request's own list is echoed.
    Any,
    /// The value to send, built at load (`None`: send nothing).
    Value(Option<HeaderValue>),
}

/// `[routes.cors]`, compiled.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawCors")]
pub struct Cors {
    /// `"*"` in `allow_origins`.
    any_origin: bool,
    /// Exact origins, canonical, with the value echoed for each.
    origins: Vec<(String, HeaderValue)>,
    credentials: bool,
    methods: Listed,
    /// Whether `allow_methods` was written (else it follows the route's `methods`).
    methods_written: bool,
    headers: Listed,
    /// `None` until [`Cors::finish`]: the default needs the request id header's name.
    expose: Option<HeaderValue>,
    expose_written: bool,
    max_age: Option<HeaderValue>,
    /// Preflights are charged against the route's limits.
    pub charge_preflight: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCors {
    allow_origins: Vec<String>,
    #[serde(default)]
    allow_methods: Option<Vec<String>>,
    #[serde(default)]
    allow_headers: Vec<String>,
    #[serde(default)]
    expose_headers: Option<Vec<String>>,
    #[serde(default)]
    allow_credentials: bool,
    /// A humantime duration (`"10m"`).
    #[serde(default)]
    max_age: Option<String>,
    #[serde(default)]
    charge_preflight: bool,
}

/// An origin as configured, in the form browsers send: lower case, no default port.
fn canonical_origin(raw: &str) -> Result<String, String> {
    let bad = |why: &str| format!("cors.allow_origins: {raw:?} {why}");
    if raw == "null" {
        return Err(bad(
            "is the opaque origin of sandboxed frames and file: pages, which any page can produce; \
             it cannot be allowed (use \"*\" for a public API)",
        ));
    }
    let lower = raw.to_ascii_lowercase();
    let (scheme, rest) = lower.split_once("://").ok_or_else(|| {
        bad("is not an origin; write scheme://host[:port], e.g. \"https://app.example.com\"")
    })?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_lowercase())
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err(bad("has no valid scheme"));
    }
    if rest.contains('/') {
        return Err(bad(
            "has a path (or a trailing '/'); an origin is scheme://host[:port] only",
        ));
    }
    if rest.contains('*') {
        return Err(bad(
            "has a wildcard; list exact origins, or use \"*\" alone",
        ));
    }
    if rest.contains(['@', '?', '#']) || rest.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(bad(
            "is not an origin (user-info, query, whitespace or non-ASCII)",
        ));
    }
    let authority: http::uri::Authority = rest.parse().map_err(|_| bad("has no valid host"))?;
    if authority.host().is_empty() {
        return Err(bad("has no host"));
    }
    let default_port = match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    let host_port = match (authority.port_u16(), default_port) {
        (Some(p), Some(d)) if p == d => authority.host().to_owned(),
        _ => rest.to_owned(),
    };
    Ok(format!("{scheme}://{host_port}"))
}

/// A comma-separated list of header names or methods from the config, joined for a header.
fn join(at: &str, items: &[String], check: impl Fn(&str) -> bool) -> Result<String, String> {
    let mut out = String::new();
    for i in items {
        let t = i.trim();
        if !check(t) {
            return Err(format!("cors.{at}: {i:?} is not valid here"));
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(t);
    }
    Ok(out)
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn value(s: String) -> Result<HeaderValue, String> {
    HeaderValue::try_from(s).map_err(|e| e.to_string())
}

impl TryFrom<RawCors> for Cors {
    type Error = String;
    fn try_from(r: RawCors) -> Result<Cors, String> {
        if r.allow_origins.is_empty() {
            return Err("cors.allow_origins: list the origins allowed (or \"*\")".into());
        }
        let mut any_origin = false;
        let mut origins = Vec::new();
        for o in &r.allow_origins {
            if o.trim() == "*" {
                any_origin = true;
                continue;
            }
            let c = canonical_origin(o.trim())?;
            if !origins.iter().any(|(x, _)| *x == c) {
                let v = value(c.clone())?;
                origins.push((c, v));
            }
        }
        if any_origin && !origins.is_empty() {
            return Err("cors.allow_origins: \"*\" already allows every origin; list origins or \"*\", not both".into());
        }
        if any_origin && r.allow_credentials {
            return Err("cors.allow_origins: \"*\" with allow_credentials = true would let every site read \
                        responses made with its visitors' cookies; list the origins"
                .into());
        }
        let star = |l: &[String]| l.len() == 1 && l[0].trim() == "*";
        let methods = match &r.allow_methods {
            Some(l) if star(l) => Listed::Any,
            Some(l) if l.is_empty() => {
                return Err("cors.allow_methods: list at least one method (or leave it out)".into())
            }
            Some(l) => Listed::Value(Some(value(
                join("allow_methods", l, |m| is_token(m) && m != "*")?.to_ascii_uppercase(),
            )?)),
            None => Listed::Value(Some(HeaderValue::from_static(DEFAULT_METHODS))),
        };
        let headers = if star(&r.allow_headers) {
            Listed::Any
        } else if r.allow_headers.is_empty() {
            Listed::Value(None)
        } else {
            Listed::Value(Some(value(join(
                "allow_headers",
                &r.allow_headers,
                |h| h != "*" && HeaderName::from_bytes(h.as_bytes()).is_ok(),
            )?)?))
        };
        let expose = match &r.expose_headers {
            Some(l) if star(l) => {
                if r.allow_credentials {
                    return Err(
                        "cors.expose_headers: \"*\" means a header named `*` to browsers when \
                                credentials are allowed; list the headers"
                            .into(),
                    );
                }
                Some(HeaderValue::from_static("*"))
            }
            Some(l) if l.is_empty() => None,
            Some(l) => Some(value(join("expose_headers", l, |h| {
                h != "*" && HeaderName::from_bytes(h.as_bytes()).is_ok()
            })?)?),
            None => None,
        };
        let max_age = match r.max_age {
            None => None,
            Some(text) => {
                let d = humantime::parse_duration(text.trim()).map_err(|e| {
                    format!("cors.max_age: invalid duration {text:?} ({e}); use e.g. \"10m\"")
                })?;
                if d > MAX_MAX_AGE {
                    return Err(format!(
                        "cors.max_age: {text:?} is too long; the maximum is 1day (browsers cap it lower)"
                    ));
                }
                Some(HeaderValue::from(d.as_secs()))
            }
        };
        Ok(Cors {
            any_origin,
            origins,
            credentials: r.allow_credentials,
            methods,
            methods_written: r.allow_methods.is_some(),
            headers,
            expose_written: r.expose_headers.is_some(),
            expose,
            max_age,
            charge_preflight: r.charge_preflight,
        })
    }
}

/// A request's `Origin`, when it has exactly one.
pub fn origin_of(head: &impl RequestHead) -> Option<HeaderValue> {
    let mut all = head.header_values(&ORIGIN);
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    HeaderValue::from_bytes(first).ok()
}

/// The method a CORS preflight asks about: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method` (a valid method).
pub fn preflight_method(head: &impl RequestHead) -> Option<Method> {
    if head.method() != Method::OPTIONS || head.header_value(&ORIGIN).is_none() {
        return None;
    }
    let m = head.header_value(&ACCESS_CONTROL_REQUEST_METHOD)?;
    Method::from_bytes(m.trim_ascii()).ok()
}

impl Cors {
    /// Completes what needs more than `[routes.cors]`: the route's `methods` (the default
    /// `allow_methods`) and the request id header's name (in the default `expose_headers`).
    pub fn finish(&mut self, route_methods: Option<&[Method]>, request_id: &HeaderName) {
        if let (false, Some(ms)) = (self.methods_written, route_methods) {
            let list: Vec<&str> = ms.iter().map(Method::as_str).collect();
            if let Ok(v) = HeaderValue::from_str(&list.join(", ")) {
                self.methods = Listed::Value(Some(v));
            }
        }
        if !self.expose_written {
            let v = format!(
                "RateLimit, RateLimit-Policy, X-RateLimit-Limit, X-RateLimit-Remaining, \
                 X-RateLimit-Reset, Retry-After, {}",
                canonical_case(request_id.as_str())
            );
            self.expose = HeaderValue::from_str(&v).ok();
        }
    }

    /// The value echoed for `origin`, when it is allowed (`*` for any origin).
    fn allowed(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.any_origin {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin?.as_bytes();
        self.origins
            .iter()
            .find(|(c, _)| c.as_bytes().eq_ignore_ascii_case(o))
            .map(|(_, v)| v.clone())
    }

    /// The CORS headers of any response of the route (the gateway's own answers included):
    /// the upstream's own `Access-Control-*` headers are replaced, so a browser never sees two.
    pub fn write_response(&self, origin: Option<&HeaderValue>, h: &mut impl HeaderEdit) {
        for n in [
            &ACCESS_CONTROL_ALLOW_ORIGIN,
            &ACCESS_CONTROL_ALLOW_CREDENTIALS,
            &ACCESS_CONTROL_EXPOSE_HEADERS,
        ] {
            h.remove(n);
        }
        if !self.any_origin {
            // The answer differs by Origin: caches must key on it.
            h.append(&VARY, HeaderValue::from_static("Origin"));
        }
        let Some(allowed) = self.allowed(origin) else {
            return;
        };
        h.insert(&ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        if self.credentials {
            h.insert(
                &ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        if let Some(e) = &self.expose {
            h.insert(&ACCESS_CONTROL_EXPOSE_HEADERS, e.clone());
        }
    }

    /// The headers of a preflight answer besides those of [`Cors::write_response`]: the
    /// methods, headers and max age allowed (nothing when the origin is not allowed).
    pub fn write_preflight(&self, head: &impl RequestHead, h: &mut HeaderMap) {
        h.append(
            VARY,
            HeaderValue::from_static(
                "Access-Control-Request-Method, Access-Control-Request-Headers",
            ),
        );
        if self.allowed(origin_of(head).as_ref()).is_none() {
            return;
        }
        match &self.methods {
            Listed::Any if !self.credentials => {
                h.insert(ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("*"));
            }
            Listed::Any => {
                if let Some(m) = preflight_method(head) {
                    if let Ok(v) = HeaderValue::from_str(m.as_str()) {
                        h.insert(ACCESS_CONTROL_ALLOW_METHODS, v);
                    }
                }
            }
            Listed::Value(Some(v)) => {
                h.insert(ACCESS_CONTROL_ALLOW_METHODS, v.clone());
            }
            Listed::Value(None) => {}
        }
        match &self.headers {
            Listed::Any if !self.credentials => {
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("*"));
            }
            Listed::Any => {
                if let Some(v) = requested_headers(head) {
                    h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v);
                }
            }
            Listed::Value(Some(v)) => {
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
            }
            Listed::Value(None) => {}
        }
        if let Some(m) = &self.max_age {
            h.insert(ACCESS_CONTROL_MAX_AGE, m.clone());
        }
    }
}

/// The request's `Access-Control-Request-Headers`, when every item is a header name (then it is
/// echoed as one value); `None` for a malformed list, which then gets no header (the browser
/// refuses the request).
fn requested_headers(head: &impl RequestHead) -> Option<HeaderValue> {
    let mut out: Vec<u8> = Vec::new();
    for v in head.header_values(&ACCESS_CONTROL_REQUEST_HEADERS) {
        for item in header_str(v)?.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if !is_token(item) {
                return None;
            }
            if !out.is_empty() {
                out.extend_from_slice(b", ");
            }
            out.extend_from_slice(item.as_bytes());
        }
    }
    if out.is_empty() {
        return None;
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(out)).ok()
}

/// `x-request-id` as `X-Request-Id` (header names are case-insensitive; this is for people).
fn canonical_case(name: &str) -> String {
    name.split('-')
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::OwnedHead;

    fn cors(toml: &str) -> Result<Cors, String> {
        let mut c: Cors = toml::from_str(toml).map_err(|e| e.to_string())?;
        c.finish(None, &HeaderName::from_static("x-request-id"));
        Ok(c)
    }

    #[test]
    fn origins_are_canonical_and_odd_ones_refused() {
        let c =
            cors("allow_origins = [\"HTTPS://App.Example.com:443\", \"http://localhost:3000\"]")
                .unwrap();
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(
            c.allowed(Some(&v("https://app.example.com"))).unwrap(),
            "https://app.example.com"
        );
        assert_eq!(
            c.allowed(Some(&v("HTTPS://APP.EXAMPLE.COM"))).unwrap(),
            "https://app.example.com"
        );
        for odd in [
            "null",
            "https://app.example.com/",
            "https://app.example.com:443",
            "https://evil.com, https://app.example.com",
            " https://app.example.com",
            "https://app.example.com.evil.com",
            "http://localhost:30000",
        ] {
            assert!(c.allowed(Some(&v(odd))).is_none(), "{odd}");
        }
        for bad in [
            "null",
            "https://a.com/",
            "a.com",
            "https://*.a.com",
            "https://u@a.com",
        ] {
            let e = cors(&format!("allow_origins = [\"{bad}\"]")).unwrap_err();
            assert!(e.contains("allow_origins"), "{bad}: {e}");
        }
        let e = cors("allow_origins = [\"*\"]\nallow_credentials = true").unwrap_err();
        assert!(e.contains("cookies"), "{e}");
        let any = cors("allow_origins = [\"*\"]").unwrap();
        assert_eq!(any.allowed(Some(&v("null"))).unwrap(), "*");
    }

    #[test]
    fn default_expose_headers_name_the_rate_limit_headers() {
        let c = cors("allow_origins = [\"*\"]").unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("https://upstream"),
        );
        c.write_response(None, &mut h);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        let e = h[ACCESS_CONTROL_EXPOSE_HEADERS].to_str().unwrap();
        for n in [
            "RateLimit",
            "RateLimit-Policy",
            "Retry-After",
            "X-Request-Id",
        ] {
            assert!(e.split(", ").any(|x| x == n), "{n} in {e}");
        }
    }

    #[test]
    fn a_preflight_with_hundreds_of_headers() {
        let many: Vec<String> = (0..500).map(|i| format!("x-h{i}")).collect();
        let mut head = OwnedHead {
            method: Method::OPTIONS,
            ..OwnedHead::default()
        };
        head.headers
            .insert(ORIGIN, HeaderValue::from_static("https://a.example"));
        head.headers.insert(
            ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("PUT"),
        );
        head.headers.insert(
            ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_str(&many.join(",")).unwrap(),
        );
        let listed =
            cors("allow_origins = [\"https://a.example\"]\nallow_headers = [\"Content-Type\"]")
                .unwrap();
        let mut h = HeaderMap::new();
        listed.write_preflight(&head, &mut h);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_HEADERS], "Content-Type");
        assert_eq!(h[ACCESS_CONTROL_ALLOW_METHODS], DEFAULT_METHODS);
        let echo = cors("allow_origins = [\"https://a.example\"]\nallow_headers = [\"*\"]\nallow_credentials = true").unwrap();
        let mut h = HeaderMap::new();
        echo.write_preflight(&head, &mut h);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_HEADERS].len(), many.join(", ").len());
        head.headers.insert(
            ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("x-a, bad header"),
        );
        let mut h = HeaderMap::new();
        echo.write_preflight(&head, &mut h);
        assert!(!h.contains_key(ACCESS_CONTROL_ALLOW_HEADERS));
    }
}
