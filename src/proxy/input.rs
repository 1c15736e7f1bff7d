//! Checks of a request's head before it is routed: framing that could smuggle a request past one
//! party or another, the `Host` header, and the path as routing sees it.

use std::borrow::Cow;

use http::header::{HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::request::Parts;
use http::Version;

use super::error::ProxyError;

/// Refuses framings that smuggle requests past one party or another: `Content-Length` with
/// `Transfer-Encoding`, a `Transfer-Encoding` other than a lone `chunked`, and conflicting
/// `Content-Length`s.
pub(super) fn check_framing(req: &Parts) -> Result<(), ProxyError> {
    let h = &req.headers;
    let mut te = h.get_all(TRANSFER_ENCODING).iter();
    if let Some(first) = te.next() {
        if h.contains_key(CONTENT_LENGTH) {
            return Err(ProxyError::BadFraming(
                "a request may not carry both Content-Length and Transfer-Encoding",
            ));
        }
        if te.next().is_some()
            || !first
                .as_bytes()
                .trim_ascii()
                .eq_ignore_ascii_case(b"chunked")
        {
            return Err(ProxyError::BadFraming(
                "only Transfer-Encoding: chunked is accepted",
            ));
        }
    }
    let mut cl = h.get_all(CONTENT_LENGTH).iter();
    if let Some(first) = cl.next() {
        if cl.any(|v| v != first)
            || first
                .to_str()
                .ok()
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
pub(super) fn request_host(
    req: &Parts,
) -> Result<(Option<Cow<'_, str>>, Option<HeaderValue>), ProxyError> {
    let mut hosts = req.headers.get_all(HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadRequest("duplicate Host header"));
    }
    let raw: Option<HeaderValue> = match (header, req.uri.authority()) {
        (_, Some(a)) => HeaderValue::from_str(a.as_str()).ok(),
        (Some(h), None) => Some(h.clone()),
        (None, None) => {
            if req.version == Version::HTTP_11 {
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
            let h = crate::routing::route_host(s)
                .ok_or(ProxyError::BadRequest("invalid Host header"))?;
            Some(Cow::Owned(h))
        }
        None => None,
    };
    Ok((host, raw))
}

/// The request's path, normalised for routing; what cannot be normalised is a 400.
pub(super) fn normalized_path(
    raw: &str,
    params: crate::path::PathParams,
) -> Result<Cow<'_, str>, ProxyError> {
    use crate::path::PathError;
    crate::path::normalize_with(raw, params).map_err(|e| {
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
