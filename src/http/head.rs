//! A read-only view of a request head: what the request pipeline ([`crate::pipeline`]) reads of
//! a request, whichever front parsed it. Implemented for the `http` crate's request parts (the
//! hyper front) and for [`OwnedHead`] (a head described by other means: `/-/explain`'s
//! question, tests); a front that parses heads in place implements it over its buffer.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Version};

/// What the pipeline reads of a request head. Header values are raw bytes, in the order
/// received; [`header_str`] reads one as text the way `HeaderValue::to_str` does.
pub trait RequestHead {
    fn method(&self) -> &Method;
    fn version(&self) -> Version;
    /// The path of the request target, as received (not normalised, no query).
    fn path(&self) -> &str;
    /// The query of the request target, as received, without the `?`.
    fn query(&self) -> Option<&str>;
    /// The authority of an absolute-form target (or of HTTP/2's `:authority`), if any.
    fn authority(&self) -> Option<&str>;
    /// The length of the request target's path and query, in bytes.
    fn target_len(&self) -> usize;
    /// Every value of header `name`, in the order received.
    fn header_values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a;

    /// The first value of header `name`.
    fn header_value<'a>(&'a self, name: &'a HeaderName) -> Option<&'a [u8]> {
        self.header_values(name).next()
    }

    /// Every field as `(name, value)` in the order received (names in any case), for a head
    /// that can list them; `None` (the default): it cannot (the HTTP cache then stores no
    /// response that varies, having no request values to compare).
    fn all_fields(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])> + '_> {
        None::<std::iter::Empty<(&[u8], &[u8])>>
    }
}

/// A header value as text: visible ASCII and tabs only, as `HeaderValue::to_str` accepts.
pub fn header_str(value: &[u8]) -> Option<&str> {
    if value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// A head held elsewhere.
impl<H: RequestHead> RequestHead for &H {
    fn method(&self) -> &Method {
        (**self).method()
    }

    fn version(&self) -> Version {
        (**self).version()
    }

    fn path(&self) -> &str {
        (**self).path()
    }

    fn query(&self) -> Option<&str> {
        (**self).query()
    }

    fn authority(&self) -> Option<&str> {
        (**self).authority()
    }

    fn target_len(&self) -> usize {
        (**self).target_len()
    }

    fn header_values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        (**self).header_values(name)
    }

    fn all_fields(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])> + '_> {
        (**self).all_fields()
    }
}

impl RequestHead for http::request::Parts {
    fn method(&self) -> &Method {
        &self.method
    }

    fn version(&self) -> Version {
        self.version
    }

    fn path(&self) -> &str {
        self.uri.path()
    }

    fn query(&self) -> Option<&str> {
        self.uri.query()
    }

    fn authority(&self) -> Option<&str> {
        self.uri.authority().map(|a| a.as_str())
    }

    fn target_len(&self) -> usize {
        self.uri.path_and_query().map_or(0, |pq| pq.as_str().len())
    }

    fn header_values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.get_all(name).iter().map(HeaderValue::as_bytes)
    }

    fn all_fields(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])> + '_> {
        Some(
            self.headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        )
    }
}

/// A request head held as plain values (for a request that did not come from a socket).
#[derive(Debug, Clone)]
pub struct OwnedHead {
    pub method: Method,
    pub version: Version,
    pub path: String,
    pub query: Option<String>,
    pub authority: Option<String>,
    pub headers: HeaderMap,
}

impl Default for OwnedHead {
    fn default() -> Self {
        OwnedHead {
            method: Method::GET,
            version: Version::HTTP_11,
            path: "/".to_owned(),
            query: None,
            authority: None,
            headers: HeaderMap::new(),
        }
    }
}

impl RequestHead for OwnedHead {
    fn method(&self) -> &Method {
        &self.method
    }

    fn version(&self) -> Version {
        self.version
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }

    fn authority(&self) -> Option<&str> {
        self.authority.as_deref()
    }

    fn target_len(&self) -> usize {
        self.path.len() + self.query.as_ref().map_or(0, |q| q.len() + 1)
    }

    fn header_values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.get_all(name).iter().map(HeaderValue::as_bytes)
    }

    fn all_fields(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])> + '_> {
        Some(
            self.headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_str_accepts_what_to_str_accepts() {
        for bytes in [
            &b"plain"[..],
            b"tab\there",
            b"",
            b"\x7f",
            b"caf\xc3\xa9",
            b"nul\x00",
            b"~!",
        ] {
            let Ok(v) = HeaderValue::from_bytes(bytes) else {
                continue;
            };
            assert_eq!(header_str(bytes), v.to_str().ok(), "{bytes:?}");
        }
    }

    #[test]
    fn parts_and_owned_heads_read_alike() {
        let req = http::Request::builder()
            .method("POST")
            .uri("http://h.example/a/b?x=1")
            .header("x-k", "1")
            .header("x-k", "2")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let mut headers = HeaderMap::new();
        headers.append("x-k", HeaderValue::from_static("1"));
        headers.append("x-k", HeaderValue::from_static("2"));
        let owned = OwnedHead {
            method: Method::POST,
            version: Version::HTTP_11,
            path: "/a/b".into(),
            query: Some("x=1".into()),
            authority: Some("h.example".into()),
            headers,
        };
        let name = HeaderName::from_static("x-k");
        assert_eq!(parts.path(), owned.path());
        assert_eq!(parts.query(), owned.query());
        assert_eq!(parts.authority(), owned.authority());
        assert_eq!(parts.target_len(), owned.target_len());
        assert_eq!(
            parts.header_values(&name).collect::<Vec<_>>(),
            owned.header_values(&name).collect::<Vec<_>>()
        );
        assert_eq!(owned.header_value(&name), Some(&b"1"[..]));
    }
}
