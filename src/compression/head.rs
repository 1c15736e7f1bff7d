//! What compressing a response changes in its head, and whether to: the one decision both
//! fronts run (through [`crate::pipeline::drive`]). `Content-Encoding` set, `Vary:
//! Accept-Encoding` merged into the response's own `Vary` (on every response that could have
//! been compressed, so that a cache keeps the variants apart, as nginx's `gzip_vary` does),
//! a strong `ETag` made weak (the bytes differ, the representation does not: nginx's rule),
//! `Content-Length` dropped (the front frames the body itself).

use super::{may_compress, negotiate, ResponseView};
use crate::config::{Coding, Compression};

/// What a request asks of a compressing route: the coding negotiated (`None`: identity) and the
/// route's table. `None` as a whole for a route without compression and for a HEAD (whose
/// answer has no body to compress).
#[derive(Debug, Clone, Copy)]
pub struct Offer<'c> {
    pub coding: Option<Coding>,
    pub config: &'c Compression,
}

impl<'c> Offer<'c> {
    /// The offer for a request with these `Accept-Encoding` values to a route compressing
    /// with `config`.
    pub fn of<'a>(
        config: Option<&'c Compression>,
        head_request: bool,
        accept_encoding: impl IntoIterator<Item = &'a str>,
    ) -> Option<Offer<'c>> {
        let config = config.filter(|_| !head_request)?;
        Some(Offer {
            coding: negotiate(accept_encoding, &config.algorithms),
            config,
        })
    }
}

/// Whether a response may be compressed for `offer`: `Some(coding)` to compress with,
/// `Some(None)` when it may but the client takes identity (it still varies), `None` when it
/// may not (no `Vary` either).
pub fn decide(offer: &Offer<'_>, view: &ResponseView<'_>) -> Option<Option<Coding>> {
    let c = offer.config;
    may_compress(view, &c.types, c.min_length).then_some(offer.coding)
}

/// The `Vary` value with `Accept-Encoding` in it: `None` when the response's values (`values`)
/// already name it or `*` (nothing to change).
pub fn with_vary<'a>(values: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut joined = String::new();
    for v in values {
        for t in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if t == "*" || t.eq_ignore_ascii_case("accept-encoding") {
                return None;
            }
            if !joined.is_empty() {
                joined.push_str(", ");
            }
            joined.push_str(t);
        }
    }
    if !joined.is_empty() {
        joined.push_str(", ");
    }
    joined.push_str("Accept-Encoding");
    Some(joined)
}

/// A strong `ETag` made weak (`"x"` → `W/"x"`); `None` when it is weak already.
pub fn weak_etag(etag: &str) -> Option<String> {
    let etag = etag.trim();
    if etag.starts_with("W/") || etag.is_empty() {
        return None;
    }
    Some(format!("W/{etag}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vary_is_merged_once_and_etags_weakened() {
        assert_eq!(
            with_vary([].into_iter()).as_deref(),
            Some("Accept-Encoding")
        );
        assert_eq!(
            with_vary(["Origin", " Cookie,,"].into_iter()).as_deref(),
            Some("Origin, Cookie, Accept-Encoding")
        );
        assert_eq!(with_vary(["origin, accept-encoding"].into_iter()), None);
        assert_eq!(with_vary(["*"].into_iter()), None);
        assert_eq!(weak_etag("\"abc\"").as_deref(), Some("W/\"abc\""));
        assert_eq!(weak_etag("W/\"abc\""), None);
    }

    #[test]
    fn head_requests_and_routes_without_compression_offer_nothing() {
        let c = crate::config::Compression {
            algorithms: vec![Coding::Gzip],
            min_length: 10,
            types: vec!["text/*".into()],
            level: None,
        };
        assert!(Offer::of(None, false, ["gzip"]).is_none());
        assert!(Offer::of(Some(&c), true, ["gzip"]).is_none());
        let o = Offer::of(Some(&c), false, ["br, gzip;q=0.5"]).unwrap();
        assert_eq!(o.coding, Some(Coding::Gzip));
        let text = ResponseView {
            status: 200,
            content_type: Some("text/plain"),
            ..ResponseView::default()
        };
        assert_eq!(decide(&o, &text), Some(Some(Coding::Gzip)));
        let short = ResponseView {
            content_length: Some(3),
            ..text
        };
        assert_eq!(decide(&o, &short), None);
        let identity = Offer::of(Some(&c), false, ["br"]).unwrap();
        assert_eq!(decide(&identity, &text), Some(None));
    }
}
