//! The one HTTP/1 framing model: where a head ends, what a head's `Content-Length` and
//! `Transfer-Encoding` mean for the bytes after it, and the chunked framing byte by byte, each
//! read the way hyper's parser and chunked decoder read them.
//!
//! Both users follow these rules: the fast front's parser and body decoder
//! ([`super::parse`], [`super::codec`]) and the hyper front's framing scanner
//! (`server::h1_scan`), which must agree with hyper on where each request starts. So the two
//! fronts cannot drift apart on what a request's body is.

/// The end (exclusive) of a head in `buf`: after the first empty line, searching from `from`.
pub fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let tail = buf.get(from..)?;
    memchr::memchr_iter(b'\n', tail)
        .map(|i| from + i)
        .find_map(|i| match (buf.get(i + 1), buf.get(i + 2)) {
            (Some(b'\n'), _) => Some(i + 2),
            (Some(b'\r'), Some(b'\n')) => Some(i + 3),
            _ => None,
        })
}

/// hyper's `ChunkedState`, with the chunk size carried along.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunk {
    Start,
    Size(u64),
    Lws(u64),
    Ext(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

/// One byte of chunked framing (not chunk data): `Some(Some(next))`, `Some(None)` at the end
/// of the body, `None` where hyper's decoder fails.
pub fn step(state: Chunk, b: u8) -> Option<Option<Chunk>> {
    let digit = |size: u64| -> Option<Option<Chunk>> {
        let size = size.checked_mul(16)?.checked_add(hex(b)?)?;
        Some(Some(Chunk::Size(size)))
    };
    match state {
        Chunk::Start => digit(0),
        Chunk::Size(size) => match b {
            b'\t' | b' ' => Some(Some(Chunk::Lws(size))),
            b';' => Some(Some(Chunk::Ext(size))),
            b'\r' => Some(Some(Chunk::SizeLf(size))),
            _ => digit(size),
        },
        Chunk::Lws(size) => match b {
            b'\t' | b' ' => Some(Some(Chunk::Lws(size))),
            b';' => Some(Some(Chunk::Ext(size))),
            b'\r' => Some(Some(Chunk::SizeLf(size))),
            _ => None,
        },
        Chunk::Ext(size) => match b {
            b'\r' => Some(Some(Chunk::SizeLf(size))),
            b'\n' => None,
            _ => Some(Some(Chunk::Ext(size))),
        },
        Chunk::SizeLf(size) => match (b, size) {
            (b'\n', 0) => Some(Some(Chunk::EndCr)),
            (b'\n', n) => Some(Some(Chunk::Data(n))),
            _ => None,
        },
        Chunk::Data(_) => None,
        Chunk::DataCr => (b == b'\r').then_some(Some(Chunk::DataLf)),
        Chunk::DataLf => (b == b'\n').then_some(Some(Chunk::Start)),
        Chunk::EndCr => Some(Some(if b == b'\r' {
            Chunk::EndLf
        } else {
            Chunk::Trailer
        })),
        Chunk::EndLf => (b == b'\n').then_some(None),
        Chunk::Trailer => Some(Some(if b == b'\r' {
            Chunk::TrailerLf
        } else {
            Chunk::Trailer
        })),
        Chunk::TrailerLf => (b == b'\n').then_some(Some(Chunk::EndCr)),
    }
}

/// A header value without the spaces and tabs around it.
pub fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |p| p + 1);
    &v[start..end.max(start)]
}

/// A decimal `Content-Length` (digits only, no sign, no overflow).
pub fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// What a request head's framing headers mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// A body of this framing follows (`length` 0 and not chunked: none).
    Body { chunked: bool, length: u64 },
    /// Both `Content-Length` and `Transfer-Encoding`: refused (400, then closed).
    Conflicting,
    /// A framing hyper rejects (or that this model does not follow): a `Transfer-Encoding`
    /// whose last coding is not `chunked`, one on HTTP/1.0, a malformed or conflicting
    /// `Content-Length`.
    Invalid,
}

/// Reads a head's framing headers one field at a time, as hyper does.
#[derive(Debug, Default)]
pub struct FramingFields {
    te: bool,
    te_chunked: bool,
    /// `Transfer-Encoding` fields seen (the fast front serves only one).
    te_count: u32,
    has_cl: bool,
    cl_count: u32,
    length: Option<u64>,
    invalid: bool,
}

impl FramingFields {
    /// One header field of a head of version HTTP/1.0 (`http10`) or HTTP/1.1.
    pub fn field(&mut self, name: &[u8], value: &[u8], http10: bool) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if http10 {
                self.invalid = true;
            }
            self.te = true;
            self.te_count += 1;
            let value = trim(value);
            self.te_chunked = value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            self.has_cl = true;
            self.cl_count += 1;
            if self.te {
                return;
            }
            let Some(n) = digits(trim(value)) else {
                self.invalid = true;
                return;
            };
            if self.length.is_some_and(|prev| prev != n) {
                self.invalid = true;
            }
            self.length = Some(n);
        }
    }

    /// What the fields read mean.
    pub fn framing(&self) -> Framing {
        if self.invalid || (self.te && !self.te_chunked) {
            return Framing::Invalid;
        }
        if self.te && self.has_cl {
            return Framing::Conflicting;
        }
        Framing::Body {
            chunked: self.te,
            length: self.length.unwrap_or(0),
        }
    }

    /// Whether the framing is the plain kind the fast front serves itself: no framing header,
    /// one `Content-Length`, or one `Transfer-Encoding: chunked`.
    pub fn is_plain(&self) -> bool {
        self.te_count <= 1 && self.cl_count <= 1 && self.framing() != Framing::Invalid
    }

    /// Whether a lone `Transfer-Encoding` is exactly `chunked` (not `gzip, chunked`).
    pub fn te_count(&self) -> u32 {
        self.te_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_spaces_and_tabs() {
        assert_eq!(trim(b"  a b\t "), b"a b");
        assert_eq!(trim(b"\t"), b"");
        assert_eq!(trim(b""), b"");
        assert_eq!(trim(b"x"), b"x");
    }

    #[test]
    fn framing_of_fields() {
        let f = |fields: &[(&[u8], &[u8])], http10: bool| {
            let mut ff = FramingFields::default();
            for (n, v) in fields {
                ff.field(n, v, http10);
            }
            ff.framing()
        };
        assert_eq!(
            f(&[(b"Content-Length", b" 5 ")], false),
            Framing::Body {
                chunked: false,
                length: 5
            }
        );
        assert_eq!(
            f(&[(b"transfer-encoding", b"gzip, Chunked")], false),
            Framing::Body {
                chunked: true,
                length: 0
            }
        );
        assert_eq!(
            f(
                &[
                    (b"transfer-encoding", b"chunked"),
                    (b"content-length", b"3")
                ],
                false
            ),
            Framing::Conflicting
        );
        assert_eq!(
            f(&[(b"transfer-encoding", b"chunked")], true),
            Framing::Invalid
        );
        assert_eq!(
            f(&[(b"transfer-encoding", b"gzip")], false),
            Framing::Invalid
        );
        assert_eq!(
            f(
                &[(b"content-length", b"1"), (b"content-length", b"2")],
                false
            ),
            Framing::Invalid
        );
        assert_eq!(f(&[(b"content-length", b"+1")], false), Framing::Invalid);
    }
}
