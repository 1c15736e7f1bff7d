//! The request head, parsed in place: `httparse` finds the method, target, version and fields
//! in the bytes read; the head keeps those bytes (a `Bytes`, never copied) and the offsets of
//! each field, and the pipeline reads it through [`RequestHead`].
//!
//! The fast front serves only the plain kind of request itself (see [`Parsed::Fallback`]);
//! everything else — an error, an exotic framing, an upgrade, `Expect`, HTTP/1.0, `CONNECT`,
//! an absolute-form target, the HTTP/2 preface — goes to hyper with the bytes already read, so
//! each of those gets exactly the answer and the close it gets today.

use bytes::Bytes;
use http::header::HeaderName;
use http::uri::PathAndQuery;
use http::{Method, Version};
use smallvec::SmallVec;

use super::framing::{Framing, FramingFields};
use crate::http::head::RequestHead;

/// The most fields in a head (hyper's limit; more is hyper's 431).
pub const MAX_HEADERS: usize = 100;

/// Where one field lies in the head's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: (u32, u32),
    pub value: (u32, u32),
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// `Content-Length` bytes (0: no body).
    Length(u64),
    Chunked,
}

/// A request head parsed in place.
#[derive(Debug)]
pub struct Head {
    bytes: Bytes,
    method: Method,
    target: PathAndQuery,
    fields: SmallVec<[Field; 16]>,
    /// The body's framing.
    pub body: BodyKind,
    /// The client asked to close after this exchange (`Connection: close`).
    pub close: bool,
}

/// Why a head goes to hyper instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// hyper rejects it (or parses it differently from what this parser serves).
    Malformed,
    /// Not HTTP/1.1 (HTTP/1.0, the HTTP/2 preface).
    Version,
    /// `CONNECT`, an absolute-form or `*` target.
    Target,
    /// A framing other than none, one `Content-Length` or one `Transfer-Encoding: chunked`
    /// (hyper's framing rules, and the pipeline's refusals, apply there).
    Framing,
    /// `Upgrade`, `Expect`, `HTTP2-Settings`: protocol switches and interim answers.
    Protocol,
}

/// What the bytes read so far hold. (`Complete` is large, and not boxed: it is returned
/// once per head, and a box would be an allocation per request.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A whole head that the fast front serves, laid out by [`scan`].
    Complete(Layout),
    /// A head the fast front hands to hyper (with every byte read).
    Fallback(Fallback),
}

/// Where a whole head's parts lie in the bytes [`scan`] read (offsets from their start, so
/// they hold for those bytes split off and frozen): the head is parsed once.
#[derive(Debug)]
pub struct Layout {
    /// The head's length in bytes.
    pub len: usize,
    method: Method,
    target: (u32, u32),
    fields: SmallVec<[Field; 16]>,
    body: BodyKind,
    close: bool,
}

fn offsets(base: &[u8], part: &[u8]) -> (u32, u32) {
    let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    (
        u32::try_from(start).unwrap_or(0),
        u32::try_from(part.len()).unwrap_or(0),
    )
}

/// Looks at the bytes read so far: is there a whole head, and is it one to serve here? A
/// whole one is laid out at once (its fields' offsets, its framing), never parsed again.
pub fn scan(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Ok(httparse::Status::Complete(n)) => match layout(buf, &req, n) {
            Ok(l) => Parsed::Complete(l),
            Err(f) => Parsed::Fallback(f),
        },
        Err(httparse::Error::Version) => Parsed::Fallback(Fallback::Version),
        Err(_) => Parsed::Fallback(Fallback::Malformed),
    }
}

/// Whether a whole head is one the fast front serves, and where its parts lie.
fn layout(base: &[u8], req: &httparse::Request<'_, '_>, len: usize) -> Result<Layout, Fallback> {
    if req.version != Some(1) {
        return Err(Fallback::Version);
    }
    let method = req.method.unwrap_or_default();
    let path = req.path.unwrap_or_default();
    if method == "CONNECT" || !path.starts_with('/') || path.len() >= usize::from(u16::MAX) {
        return Err(Fallback::Target);
    }
    let mut framing = FramingFields::default();
    let mut fields = SmallVec::new();
    let mut close = false;
    let mut te_chunked_only = true;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"upgrade")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"http2-settings")
        {
            return Err(Fallback::Protocol);
        }
        framing.field(name, h.value, false);
        if name.eq_ignore_ascii_case(b"connection") {
            close |= h
                .value
                .split(|b| *b == b',')
                .any(|t| super::framing::trim(t).eq_ignore_ascii_case(b"close"));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            te_chunked_only &= super::framing::trim(h.value).eq_ignore_ascii_case(b"chunked");
        }
        fields.push(Field {
            name: offsets(base, name),
            value: offsets(base, h.value),
        });
    }
    if !framing.is_plain() || (framing.te_count() == 1 && !te_chunked_only) {
        return Err(Fallback::Framing);
    }
    let body = match framing.framing() {
        Framing::Body { chunked: true, .. } => BodyKind::Chunked,
        Framing::Body { length, .. } => BodyKind::Length(length),
        _ => return Err(Fallback::Framing),
    };
    // A method `http` takes (a token httparse took, at most this long): anything else is
    // hyper's to answer.
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| Fallback::Malformed)?;
    Ok(Layout {
        len,
        method,
        target: offsets(base, path.as_bytes()),
        fields,
        body,
        close,
    })
}

impl Head {
    /// The head in `bytes`: the first [`Layout::len`] bytes [`scan`] read, split off. `None`
    /// if its target is one `http`'s URI parser refuses (then the caller hands the connection
    /// to hyper).
    pub fn parse(bytes: Bytes, layout: Layout) -> Option<Head> {
        let (start, len) = (layout.target.0 as usize, layout.target.1 as usize);
        let target =
            PathAndQuery::from_maybe_shared(bytes.slice(start..start.checked_add(len)?)).ok()?;
        Some(Head {
            bytes,
            method: layout.method,
            target,
            fields: layout.fields,
            body: layout.body,
            close: layout.close,
        })
    }

    fn slice(&self, (start, len): (u32, u32)) -> &[u8] {
        let start = start as usize;
        self.bytes
            .get(start..start + len as usize)
            .unwrap_or_default()
    }

    /// The head's bytes as received.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The fields in order: name as received, value.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.fields
            .iter()
            .map(|f| (self.slice(f.name), self.slice(f.value)))
    }

    /// Whether the request has a body.
    pub fn has_body(&self) -> bool {
        self.body != BodyKind::Length(0)
    }
}

/// Whether a field name is one the gateway never reads nor forwards (see
/// `crate::front::hyper::drop_underscored`).
pub fn underscored(name: &[u8]) -> bool {
    name.contains(&b'_')
}

impl RequestHead for Head {
    fn method(&self) -> &Method {
        &self.method
    }

    fn version(&self) -> Version {
        Version::HTTP_11
    }

    fn path(&self) -> &str {
        self.target.path()
    }

    fn query(&self) -> Option<&str> {
        self.target.query()
    }

    fn authority(&self) -> Option<&str> {
        None
    }

    fn target_len(&self) -> usize {
        self.target.as_str().len()
    }

    fn header_values<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        let want = name.as_str().as_bytes();
        self.fields().filter_map(move |(n, v)| {
            (n.len() == want.len() && n.eq_ignore_ascii_case(want) && !underscored(n)).then_some(v)
        })
    }

    fn all_fields(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])> + '_> {
        Some(self.fields().filter(|(n, _)| !underscored(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CONTENT_LENGTH;

    fn head(s: &str) -> Option<Head> {
        match scan(s.as_bytes()) {
            Parsed::Complete(l) => Head::parse(Bytes::copy_from_slice(&s.as_bytes()[..l.len]), l),
            _ => None,
        }
    }

    #[test]
    fn parses_in_place() {
        let h = head(
            "POST /a/b?x=1 HTTP/1.1\r\nHost: h\r\nX-K: 1\r\nx-k: 2\r\nContent-Length: 3\r\n\r\nabc",
        )
        .unwrap();
        assert_eq!(h.method(), Method::POST);
        assert_eq!(h.path(), "/a/b");
        assert_eq!(h.query(), Some("x=1"));
        assert_eq!(h.target_len(), 8);
        let k = HeaderName::from_static("x-k");
        assert_eq!(
            h.header_values(&k).collect::<Vec<_>>(),
            vec![&b"1"[..], b"2"]
        );
        assert_eq!(h.header_value(&CONTENT_LENGTH), Some(&b"3"[..]));
        assert_eq!(h.body, BodyKind::Length(3));
        assert!(!h.close);
    }

    #[test]
    fn hands_the_rest_to_hyper() {
        for (req, why) in [
            ("GET / HTTP/1.0\r\n\r\n", Fallback::Version),
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Fallback::Version),
            ("CONNECT h:1 HTTP/1.1\r\n\r\n", Fallback::Target),
            ("GET http://h/ HTTP/1.1\r\n\r\n", Fallback::Target),
            (
                "GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
                Fallback::Protocol,
            ),
            (
                "POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
                Fallback::Protocol,
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                Fallback::Framing,
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                Fallback::Framing,
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                Fallback::Framing,
            ),
            ("GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", Fallback::Malformed),
            ("GET / HTTP/1.1\r\nX: a\0\r\n\r\n", Fallback::Malformed),
        ] {
            match scan(req.as_bytes()) {
                Parsed::Fallback(f) => assert_eq!(f, why, "{req:?}"),
                other => panic!("{req:?}: {other:?}"),
            }
        }
        assert!(matches!(
            scan(b"GET / HTTP/1.1\r\nHost: x\r\n"),
            Parsed::Partial
        ));
    }

    #[test]
    fn underscored_names_are_not_seen() {
        let h = head("GET / HTTP/1.1\r\nX_Forwarded_For: 6.6.6.6\r\n\r\n").unwrap();
        let xff = HeaderName::from_static("x-forwarded-for");
        assert_eq!(h.header_values(&xff).count(), 0);
    }
}
