//! When a response is not compressed, whatever the client accepts: a HEAD, a status without a
//! body or not a whole representation (1xx, 204, 206, 304), an upgrade, a body already encoded,
//! `Cache-Control: no-transform` (RFC 9111 §5.2.2.6), a `Content-Range`, a type not in the
//! route's list, or a known length below `min_length`.

/// What the rule reads of an exchange (plain values: each front fills it from its own head).
/// The list fields (`Content-Encoding`, `Cache-Control`) are read whole, every line of them,
/// by [`encoded`] and [`no_transform`]: a directive on a second line counts as on the first
/// (RFC 9110 §5.3).
#[derive(Debug, Clone, Copy, Default)]
pub struct ResponseView<'a> {
    pub head_request: bool,
    pub status: u16,
    /// The response's `Content-Encoding` lines name a coding other than `identity`
    /// ([`encoded`]).
    pub encoded: bool,
    /// The response's `Cache-Control` lines hold `no-transform` ([`no_transform`]).
    pub no_transform: bool,
    pub content_range: bool,
    /// The response's `Content-Type` value.
    pub content_type: Option<&'a str>,
    /// `Content-Length`, when known.
    pub content_length: Option<u64>,
    /// A `Connection: upgrade` / 101 exchange.
    pub upgrade: bool,
}

/// The members of a list field's lines (RFC 9110 §5.6.1), trimmed, empty ones left out.
fn members<'a>(lines: impl IntoIterator<Item = &'a str>) -> impl Iterator<Item = &'a str> {
    lines
        .into_iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|m| !m.is_empty())
}

/// Whether `Content-Encoding` (every line of it) names a coding other than `identity`: the
/// body is encoded already and is passed once, not encoded again.
pub fn encoded<'a>(lines: impl IntoIterator<Item = &'a str>) -> bool {
    members(lines).any(|c| !c.eq_ignore_ascii_case("identity"))
}

/// Whether `Cache-Control` (every line of it) holds `no-transform` (RFC 9111 §5.2.2.6).
pub fn no_transform<'a>(lines: impl IntoIterator<Item = &'a str>) -> bool {
    members(lines).any(|d| d.eq_ignore_ascii_case("no-transform"))
}

/// Whether the response may be compressed, given the media types compressed (`types`: exact
/// `type/subtype`, or `type/*`, case-insensitive) and the smallest length compressed.
pub fn may_compress(r: &ResponseView<'_>, types: &[impl AsRef<str>], min_length: u64) -> bool {
    if r.head_request
        || r.upgrade
        || r.content_range
        || matches!(r.status, 100..=199 | 204 | 206 | 304)
    {
        return false;
    }
    if r.encoded || r.no_transform {
        return false;
    }
    if r.content_length.is_some_and(|n| n < min_length) {
        return false;
    }
    let Some(ct) = r.content_type else {
        return false;
    };
    let base = ct.split(';').next().unwrap_or("").trim();
    types.iter().any(|t| match t.as_ref().strip_suffix("/*") {
        Some(main) => base
            .split_once('/')
            .is_some_and(|(m, _)| m.eq_ignore_ascii_case(main)),
        None => base.eq_ignore_ascii_case(t.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: &[&str] = &["text/*", "application/json", "text/event-stream"];

    fn json(len: Option<u64>) -> ResponseView<'static> {
        ResponseView {
            status: 200,
            content_type: Some("application/json; charset=utf-8"),
            content_length: len,
            ..ResponseView::default()
        }
    }

    #[test]
    fn what_is_never_compressed() {
        assert!(may_compress(&json(Some(2000)), TYPES, 1024));
        assert!(may_compress(&json(None), TYPES, 1024));
        assert!(!may_compress(&json(Some(100)), TYPES, 1024));
        for r in [
            ResponseView {
                head_request: true,
                ..json(None)
            },
            ResponseView {
                status: 204,
                ..json(None)
            },
            ResponseView {
                status: 304,
                ..json(None)
            },
            ResponseView {
                status: 206,
                ..json(None)
            },
            ResponseView {
                content_range: true,
                ..json(None)
            },
            ResponseView {
                upgrade: true,
                ..json(None)
            },
            ResponseView {
                encoded: true,
                ..json(None)
            },
            ResponseView {
                no_transform: true,
                ..json(None)
            },
            ResponseView {
                content_type: Some("image/png"),
                ..json(None)
            },
            ResponseView {
                content_type: None,
                ..json(None)
            },
        ] {
            assert!(!may_compress(&r, TYPES, 0), "{r:?}");
        }
        assert!(may_compress(
            &ResponseView {
                content_type: Some("Text/HTML"),
                ..json(None)
            },
            TYPES,
            0
        ));
    }

    /// A list field is every line of it: a second line counts as the first.
    #[test]
    fn every_line_of_a_list_field_is_read() {
        assert!(no_transform(["public, No-Transform"]));
        assert!(no_transform(["public", "no-transform"]));
        assert!(!no_transform(["public", "max-age=60"]));
        assert!(!no_transform([]));
        assert!(encoded(["identity", "gzip"]));
        assert!(encoded([" , gzip"]));
        assert!(!encoded(["identity", "Identity,"]));
        assert!(!encoded([]));
    }
}
