//! The request body's start read before the limits, on the fast front: for a route whose
//! limits read the JSON body (`crate::pipeline::body`). The bytes stay where the connection
//! reads them (its buffer), undecoded, so the exchange later sends them upstream as it sends
//! any body (`super::exchange`): nothing is copied for a `Content-Length` body; a chunked
//! one's data is decoded into a buffer of this request's (at most `max_json_bytes` and one
//! chunk more).
//!
//! Answers as the hyper front's reader (`crate::front::hyper::body::PeekBody`) does: 408 when the
//! client sends nothing for `body_read_timeout`, 400 for a body cut or malformed, 413 for more
//! than the route's `max_body_size`; and what the connection's buffer holds for the body until
//! the request is decided counts in the per-connection and per-worker bounds both fronts share
//! ([`crate::front::pending`]: 429, 503).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::codec::ChunkedDecoder;
use super::parse::BodyKind;
use super::session::ClientConn;
use crate::front::pending::{Held, PendingBodies};
use crate::pipeline::{Prefix, ProxyError};

/// The most bytes of chunk framing (sizes, extensions, line ends) held in the connection's
/// buffer beyond the data read, before the body is taken as too large to look into: a body in
/// one-byte chunks does not make the buffer grow without bound.
const MAX_FRAMING: usize = 64 * 1024;

/// A request body on a fast-front connection, read from its buffer
/// ([`ConnBody::read_from`]).
pub(super) struct ConnBody<'p> {
    kind: BodyKind,
    timeout: Duration,
    /// A chunked body's data so far.
    decoded: Vec<u8>,
    /// What the connection's buffer and `decoded` hold for the body, counted until the request
    /// is decided ([`ConnBody::decided`]).
    held: Held<'p>,
}

impl<'p> ConnBody<'p> {
    pub(super) fn new(kind: BodyKind, timeout: Duration, pending: PendingBodies<'p>) -> Self {
        ConnBody {
            kind,
            timeout,
            decoded: Vec::new(),
            held: Held::new(pending),
        }
    }

    /// The request is decided: what its body held no longer counts.
    pub(super) fn decided(&mut self) {
        self.held.release();
        self.decoded = Vec::new();
    }
}

/// Reads more of the body into the connection's buffer, within `body_read_timeout`; what the
/// buffer (and `decoded`) then hold counts in `held`.
async fn more<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut ClientConn<T>,
    timeout: Duration,
    held: &mut Held<'_>,
    decoded: usize,
) -> Result<(), ProxyError> {
    match tokio::time::timeout(timeout, c.read_more()).await {
        Err(_) => Err(ProxyError::BodyTimeout),
        Ok(Ok(0)) | Ok(Err(_)) => Err(ProxyError::BadBody),
        Ok(Ok(_)) => held.hold(c.buf.len().saturating_add(decoded)),
    }
}

impl ConnBody<'_> {
    /// What [`crate::pipeline::BodyPrefix::read`] reads, from `c`'s buffer (the bytes of a `Content-Length`
    /// body stay there; a chunked one's data is decoded into this).
    pub(super) async fn read_from<'a, T: AsyncRead + AsyncWrite + Unpin>(
        &'a mut self,
        c: &'a mut ClientConn<T>,
        max: u64,
        max_body_size: u64,
    ) -> Result<Prefix<'a>, ProxyError> {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        // What was read with the head counts too.
        self.held.hold(c.buf.len())?;
        match self.kind {
            BodyKind::Length(n) => {
                // (A length above `max_body_size` was refused before the limits.)
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                let want = n.min(max.saturating_add(1));
                while c.buf.len() < want {
                    more(c, self.timeout, &mut self.held, 0).await?;
                }
                let have = c.buf.len().min(n);
                Ok(Prefix {
                    bytes: c.buf.get(..have).unwrap_or_default(),
                    whole: have == n,
                })
            }
            BodyKind::Chunked => {
                let limit = usize::try_from(max_body_size).unwrap_or(usize::MAX);
                let mut d = ChunkedDecoder::default();
                let mut at = 0;
                self.decoded.clear();
                while !d.is_done() && self.decoded.len() <= max {
                    let input = c.buf.get(at..).unwrap_or_default();
                    let r = d.decode(input).map_err(|_| ProxyError::BadBody)?;
                    let data = input.get(r.data.0..r.data.1).unwrap_or_default();
                    if self.decoded.len().saturating_add(data.len()) > limit {
                        return Err(ProxyError::BodyTooLarge(max_body_size));
                    }
                    self.decoded.extend_from_slice(data);
                    at += r.consumed;
                    if d.is_done() {
                        break;
                    }
                    if r.consumed == 0 || at >= c.buf.len() {
                        if at.saturating_sub(self.decoded.len()) > MAX_FRAMING {
                            break;
                        }
                        more(c, self.timeout, &mut self.held, self.decoded.len()).await?;
                    }
                }
                Ok(Prefix {
                    bytes: &self.decoded,
                    whole: d.is_done(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts no test shares.
    fn pending() -> PendingBodies<'static> {
        PendingBodies {
            connection: Box::leak(Box::new(std::sync::atomic::AtomicUsize::new(0))),
            worker: Box::leak(Box::new(std::sync::atomic::AtomicUsize::new(0))),
            bounds: crate::front::pending::PendingBounds::DEFAULT,
        }
    }

    fn conn(input: &'static [u8]) -> ClientConn<tokio::io::DuplexStream> {
        let (a, mut b) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let _ = b.write_all(input).await;
            // Kept open: the reader times out rather than seeing an end.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        ClientConn::new(a)
    }

    #[tokio::test]
    async fn a_length_body_is_read_in_place_up_to_one_byte_past_the_max() {
        let mut c = conn(b"{\"model\":\"m\"}NEXT");
        let mut b = ConnBody::new(BodyKind::Length(13), Duration::from_secs(5), pending());
        let p = b.read_from(&mut c, 1024, 1 << 20).await.unwrap();
        assert_eq!(p.bytes, b"{\"model\":\"m\"}");
        assert!(p.whole);
        // Still in the buffer, for the upstream.
        assert!(c.buf.starts_with(b"{\"model\""));
        let mut c = conn(b"0123456789");
        let mut b = ConnBody::new(BodyKind::Length(10), Duration::from_secs(5), pending());
        let p = b.read_from(&mut c, 3, 1 << 20).await.unwrap();
        // More than the max: what arrived (the whole body here, in one read), past the max.
        assert!(p.bytes.len() > 3, "{:?}", p.bytes);
    }

    #[tokio::test]
    async fn a_chunked_body_is_decoded_and_left_framed_in_the_buffer() {
        let raw: &[u8] = b"3\r\n{\"a\r\n6\r\n\":\"x\"}\r\n0\r\n\r\n";
        let mut c = conn(raw);
        let mut b = ConnBody::new(BodyKind::Chunked, Duration::from_secs(5), pending());
        let p = b.read_from(&mut c, 1024, 1 << 20).await.unwrap();
        assert_eq!(p.bytes, b"{\"a\":\"x\"}");
        assert!(p.whole);
        assert_eq!(&c.buf[..], raw);
        let mut c = conn(b"5\r\nhello\r\n");
        let mut b = ConnBody::new(BodyKind::Chunked, Duration::from_secs(5), pending());
        assert!(matches!(
            b.read_from(&mut c, 1024, 3).await,
            Err(ProxyError::BodyTooLarge(3))
        ));
    }

    #[tokio::test]
    async fn a_silent_client_gets_408_and_a_malformed_one_400() {
        let mut c = conn(b"{\"a\"");
        let mut b = ConnBody::new(BodyKind::Length(100), Duration::from_millis(50), pending());
        assert!(matches!(
            b.read_from(&mut c, 1024, 1 << 20).await,
            Err(ProxyError::BodyTimeout)
        ));
        let mut c = conn(b"zz\r\n");
        let mut b = ConnBody::new(BodyKind::Chunked, Duration::from_secs(5), pending());
        assert!(matches!(
            b.read_from(&mut c, 1024, 1 << 20).await,
            Err(ProxyError::BadBody)
        ));
    }
}
