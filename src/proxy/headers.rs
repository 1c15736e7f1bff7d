//! What the hyper front removes of a message's headers itself: hop-by-hop headers (RFC 9110
//! §7.6.1) and underscored names. What the pipeline changes is its list of edits
//! ([`crate::pipeline::Edits`]).

use http::header::{
    HeaderMap, HeaderName, CONNECTION, CONTENT_LENGTH, HOST, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};

pub static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
/// Connection-specific (RFC 9113 §3.2.1): it belongs to an `h2c` upgrade, which is never forwarded.
pub static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// Removes hop-by-hop headers: `Connection` and every header it names (but `Content-Length`,
/// `Transfer-Encoding` and `Host`, which it cannot remove), `Keep-Alive`,
/// `Proxy-Connection`, `Proxy-Authorization`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
/// `HTTP2-Settings` (whether `Connection` names it or not).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names (compared, never hashed) instead of
    // ten hashed look-ups.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(&k)) {
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
        .filter(|name| ![CONTENT_LENGTH, TRANSFER_ENCODING, HOST].contains(name))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The hop-by-hop headers removed whether `Connection` names them or not.
static HOP_BY_HOP: [&HeaderName; 9] = [
    &CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &PROXY_AUTHORIZATION,
    &TE,
    &TRAILER,
    &TRANSFER_ENCODING,
    &UPGRADE,
    &HTTP2_SETTINGS,
];

/// Removes request headers whose names contain `_`: they can alias security headers
/// (`X_Forwarded_For` is `X-Forwarded-For` to CGI-style upstreams). nginx drops them too
/// (`underscores_in_headers off`).
pub fn drop_underscored(headers: &mut HeaderMap) {
    if !headers.keys().any(|k| k.as_str().contains('_')) {
        return;
    }
    let bad: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().contains('_'))
        .cloned()
        .collect();
    for k in bad {
        headers.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderValue;

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
            h.insert(name.clone(), HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name} was kept");
        }
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
