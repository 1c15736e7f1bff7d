//! The input phase: checks of a request's head before it is routed (framing that could smuggle
//! a request past one party or another, the target's length, the `Host` header) and the path as
//! routing sees it.

use std::borrow::Cow;

use http::header::{HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::Version;

use super::answer::ProxyError;
use crate::config::ServerConfig;
use crate::http::head::{header_str, RequestHead};

/// What the input phase found: the host (for routing and `X-Forwarded-Host`) and the path.
pub struct Input<'h> {
    /// The host without port and one trailing dot, lower-case.
    pub host: Option<String>,
    /// The host as received, for `X-Forwarded-Host` (and `preserve_host`).
    pub raw_host: Option<HeaderValue>,
    /// The normalised path.
    pub path: Cow<'h, str>,
}

/// The input checks, in order: framing (HTTP/1), the target's length, the host, the path.
pub fn check<'h>(
    head: &'h impl RequestHead,
    server: &ServerConfig,
) -> Result<Input<'h>, ProxyError> {
    if head.version() <= Version::HTTP_11 {
        check_framing(head)?;
    }
    if head.target_len() > server.max_uri_bytes {
        return Err(ProxyError::UriTooLong(server.max_uri_bytes));
    }
    let (host, raw_host) = request_host(head)?;
    let path = normalized_path(head.path(), server.path_params)?;
    Ok(Input {
        host,
        raw_host,
        path,
    })
}

/// The request's `Content-Length`, when it is one number.
pub fn content_length(head: &impl RequestHead) -> Option<u64> {
    head.header_value(&CONTENT_LENGTH)
        .and_then(header_str)
        .and_then(|s| s.trim().parse::<u64>().ok())
}

/// Refuses framings that smuggle requests past one party or another: `Content-Length` with
/// `Transfer-Encoding`, a `Transfer-Encoding` other than a lone `chunked`, and conflicting
/// `Content-Length`s.
fn check_framing(head: &impl RequestHead) -> Result<(), ProxyError> {
    let mut te = head.header_values(&TRANSFER_ENCODING);
    if let Some(first) = te.next() {
        if head.header_value(&CONTENT_LENGTH).is_some() {
            return Err(ProxyError::BadFraming(
                "a request may not carry both Content-Length and Transfer-Encoding",
            ));
        }
        if te.next().is_some() || !first.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Err(ProxyError::BadFraming(
                "only Transfer-Encoding: chunked is accepted",
            ));
        }
    }
    let mut cl = head.header_values(&CONTENT_LENGTH);
    if let Some(first) = cl.next() {
        if cl.any(|v| v != first)
            || header_str(first)
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_none()
        {
            return Err(ProxyError::BadFraming(
                "conflicting or malformed Content-Length",
            ));
        }
    }
    Ok(())
}

/// The request's host (without port and one trailing dot, lower-case) for routing, and the raw
/// value for `X-Forwarded-Host`. HTTP/1.1 requests need exactly one `Host`.
fn request_host(
    head: &impl RequestHead,
) -> Result<(Option<String>, Option<HeaderValue>), ProxyError> {
    let mut hosts = head.header_values(&HOST);
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadRequest("duplicate Host header"));
    }
    let raw: Option<HeaderValue> = match (header, head.authority()) {
        (_, Some(a)) => HeaderValue::from_str(a).ok(),
        (Some(h), None) => Some(
            HeaderValue::from_bytes(h)
                .map_err(|_| ProxyError::BadRequest("invalid Host header"))?,
        ),
        (None, None) => {
            if head.version() == Version::HTTP_11 {
                return Err(ProxyError::BadRequest("missing Host header"));
            }
            None
        }
    };
    let host = match &raw {
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| ProxyError::BadRequest("invalid Host header"))?;
            // RFC 9112 §3.2: no user-info in a request's authority. `paid.example:80@free.example`
            // would be routed on the part after `@` and forwarded as sent.
            if s.contains('@') {
                return Err(ProxyError::BadRequest(
                    "user-info ('@') in the Host or the target's authority is not accepted",
                ));
            }
            Some(
                crate::routing::route_host(s)
                    .ok_or(ProxyError::BadRequest("invalid Host header"))?,
            )
        }
        None => None,
    };
    Ok((host, raw))
}

/// The request's path, normalised for routing; what cannot be normalised is a 400.
pub fn normalized_path(
    raw: &str,
    params: crate::http::path::PathParams,
) -> Result<Cow<'_, str>, ProxyError> {
    use crate::http::path::PathError;
    crate::http::path::normalize_with(raw, params).map_err(|e| {
        ProxyError::BadRequest(match e {
            PathError::NotAbsolute => "the request target must be an absolute path",
            PathError::BadEscape => "malformed percent-encoding in the path",
            PathError::AmbiguousEscape => "encoded '/', '\\' or NUL in the path is not accepted",
            PathError::Backslash => "'\\' in the path is not accepted",
            PathError::AboveRoot => "the path climbs above the root",
            PathError::ControlCharacter => "a control character in the path is not accepted",
            PathError::EdgeWhitespace => {
                "encoded whitespace at the start or end of a path segment is not accepted"
            }
            PathError::PathParameter => "';' path parameters are not accepted",
        })
    })
}
