//! What the hyper front removes of a message's headers itself: hop-by-hop headers (RFC 9110
//! §7.6.1) and underscored names. What the pipeline changes is its list of edits
//! ([`crate::pipeline::Edits`]); the hop-by-hop list is both fronts' one
//! ([`crate::pipeline::edits::HOP_BY_HOP`]).

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH};

use crate::pipeline::edits::{HOP_BY_HOP, NEVER_NAMED};

/// Removes hop-by-hop headers: `Connection` and every header it names (but `Content-Length`,
/// `Transfer-Encoding` and `Host`, which it cannot remove), `Keep-Alive`,
/// `Proxy-Connection`, `Proxy-Authorization`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
/// `HTTP2-Settings` (whether `Connection` names it or not).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names (compared, never hashed) instead of
    // ten hashed look-ups.
    if !headers.keys().any(hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        // Framing and `Host` are never removed by a `Connection` token (as on the fast
        // front, `http1::write`): the message's framing is the one its body is sent with.
        .filter(|name| !NEVER_NAMED.contains(&name.as_str()))
        .collect();
    remove_where(headers, |n| hop_by_hop(n) || named.contains(n));
}

/// Removes the fields `gone` picks, keeping the others in their order (`HeaderMap::remove`
/// moves the last field into the removed one's place, which would send the fields upstream in
/// another order than the fast front does). Rebuilds the map only when it has one to remove.
fn remove_where(headers: &mut HeaderMap, gone: impl Fn(&HeaderName) -> bool) {
    if !headers.keys().any(&gone) {
        return;
    }
    let old = std::mem::take(headers);
    let mut last: Option<HeaderName> = None;
    for (name, value) in old {
        if let Some(n) = name {
            last = Some(n);
        }
        if let Some(n) = &last {
            if !gone(n) {
                headers.append(n.clone(), value);
            }
        }
    }
}

/// A response's `Content-Length` as one value: hyper's client takes a list of one value
/// repeated (`5, 5`, RFC 9110 §8.6) and relays it as received; the client gets `5` (as from
/// the fast front).
pub fn one_content_length(headers: &mut HeaderMap) {
    let Some(v) = headers.get(CONTENT_LENGTH) else {
        return;
    };
    if !v.as_bytes().contains(&b',') {
        return;
    }
    let first = v
        .to_str()
        .ok()
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().to_owned());
    if let Some(Ok(v)) = first.map(|v| HeaderValue::from_str(&v)) {
        headers.insert(CONTENT_LENGTH, v);
    }
}

/// Whether `name` is hop-by-hop whether `Connection` names it or not (the one list of both
/// fronts, [`crate::pipeline::edits::HOP_BY_HOP`]).
fn hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Removes request headers whose names contain `_`: they can alias security headers
/// (`X_Forwarded_For` is `X-Forwarded-For` to CGI-style upstreams). nginx drops them too
/// (`underscores_in_headers off`).
pub fn drop_underscored(headers: &mut HeaderMap) {
    if !headers.keys().any(|k| k.as_str().contains('_')) {
        return;
    }
    remove_where(headers, |k| k.as_str().contains('_'));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HOST, TE};

    #[test]
    fn strips_listed_and_fixed_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, X-Secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert(
            "http2-settings",
            HeaderValue::from_static("AAMAAABkAARAAAAAAAIAAAAA"),
        );
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn a_lone_fixed_hop_header_is_found_without_connection() {
        // The fast path (no hop-by-hop header at all) must not miss one that `Connection`
        // does not name.
        let mut h = HeaderMap::new();
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        for name in HOP_BY_HOP {
            let mut h = HeaderMap::new();
            h.insert("x-keep", HeaderValue::from_static("1"));
            h.insert(name, HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name} was kept");
        }
    }

    /// #34 item 1: `Connection` never removes the framing or `Host`.
    #[test]
    fn connection_cannot_name_the_framing_away() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("Content-Length, Host"));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("2"));
        h.insert(HOST, HeaderValue::from_static("gw"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert!(h.contains_key(CONTENT_LENGTH) && h.contains_key(HOST));
    }

    #[test]
    fn underscores_dropped() {
        let mut h = HeaderMap::new();
        h.insert("x_forwarded_for", HeaderValue::from_static("6.6.6.6"));
        h.insert("x-ok", HeaderValue::from_static("1"));
        drop_underscored(&mut h);
        assert!(!h.contains_key("x_forwarded_for"));
        assert!(h.contains_key("x-ok"));
    }
}
