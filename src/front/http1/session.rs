//! What the requests of one fast-front connection share, between the connection loop
//! ([`super::conn`]) and the upstream exchange ([`super::exchange`]): the worker serving them
//! ([`Front`]), the client connection and its buffers ([`ClientConn`]), what a request leaves
//! the connection in ([`Next`]), the access-log record ([`Logged`]), and the gateway's own
//! answers written ([`write_answer`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use http::HeaderValue;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::codec::ResponseBody;
use super::deadline::Deadline;
use super::parse::{BodyKind, Head};
use super::write::{response_head, ResponseExtras};
use crate::access_log::Record;
use crate::http::head::RequestHead as _;
use crate::pipeline::drive::{Refusal, Rendered};
use crate::pipeline::WorkerCtx;
use crate::runtime::state::Shared;

/// What serves requests on one worker: the shared state, the worker's index (its pools),
/// settle tracking, and what request bodies not yet decided hold on the worker (both fronts'
/// together: [`crate::front::pending`]).
pub struct Front {
    pub shared: Arc<Shared>,
    pub worker: usize,
    pub ctx: WorkerCtx,
    pub pending_bodies: std::sync::atomic::AtomicUsize,
}

/// The read buffer a connection starts with, and how much more it reserves at a time.
pub(super) const READ_BUFFER: usize = 16 * 1024;

/// The most a connection's buffers keep between requests: one grown past it (a large body read
/// before the limits, a large head written) is given back once the request is over
/// ([`ClientConn::shrink`]), so an idle keep-alive connection does not hold a large body's
/// memory for its life.
pub(super) const KEPT_BUFFER: usize = 64 * 1024;

/// The client connection as the loop and the exchange use it.
pub(super) struct ClientConn<T> {
    pub(super) io: T,
    /// Bytes read and not consumed (the rest of a body, pipelined requests).
    pub(super) buf: BytesMut,
    /// The head being written (reused).
    pub(super) out: Vec<u8>,
    /// The upstream read buffer of the last exchange, kept for the next (empty when none): a
    /// keep-alive connection does not allocate one per request.
    pub(super) spare: BytesMut,
    /// `buf`'s allocation grew past [`KEPT_BUFFER`] since the last [`ClientConn::shrink`]
    /// (`BytesMut::capacity` counts only what lies after the bytes consumed, so the allocation's
    /// size is seen when it is reserved).
    pub(super) grown: bool,
    /// `Alt-Svc` for every response head (`[server.http3]`, on the TLS listener).
    pub(super) alt_svc: Option<HeaderValue>,
}

impl<T> ClientConn<T> {
    /// A connection with its buffers at their usual size.
    pub(super) fn new(io: T) -> ClientConn<T> {
        ClientConn {
            io,
            alt_svc: None,
            buf: BytesMut::with_capacity(READ_BUFFER),
            out: Vec::with_capacity(1024),
            spare: BytesMut::new(),
            grown: false,
        }
    }

    /// Between requests: a buffer grown past [`KEPT_BUFFER`] goes back to the usual size (the
    /// bytes not yet consumed, a pipelined request's, moved into a fresh one); while more than
    /// that is unread it is kept, and shrunk after a later request.
    pub(super) fn shrink(&mut self) {
        if self.grown && self.buf.len() <= KEPT_BUFFER {
            let mut fresh = BytesMut::with_capacity(READ_BUFFER.max(self.buf.len()));
            fresh.extend_from_slice(&self.buf);
            self.buf = fresh;
            self.grown = false;
        }
        if self.spare.capacity() > KEPT_BUFFER {
            self.spare = BytesMut::new();
        }
        if self.out.capacity() > KEPT_BUFFER {
            self.out = Vec::with_capacity(1024);
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> ClientConn<T> {
    /// Reads more bytes into the buffer; `Ok(0)` at end of input.
    pub(super) async fn read_more(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(READ_BUFFER);
            self.grown |= self.buf.capacity() > KEPT_BUFFER;
        }
        self.io.read_buf(&mut self.buf).await
    }
}

/// Writes every byte of `bufs` (one vectored write when the socket takes it all).
pub(super) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    bufs: &mut [&[u8]],
) -> std::io::Result<()> {
    write_all_vectored_within(w, bufs, None).await
}

/// [`write_all_vectored`], each write given at most `idle` on `timer` when set (a peer that
/// takes no byte for that long fails the write with `TimedOut`: nginx's `send_timeout`, between
/// two writes rather than for the whole message).
pub(super) async fn write_all_vectored_within<W: AsyncWrite + Unpin>(
    w: &mut W,
    bufs: &mut [&[u8]],
    mut idle: Option<(&mut Deadline, Duration)>,
) -> std::io::Result<()> {
    let mut first = 0;
    while first < bufs.len() {
        if bufs[first].is_empty() {
            first += 1;
            continue;
        }
        let slices: smallvec::SmallVec<[std::io::IoSlice<'_>; 4]> = bufs[first..]
            .iter()
            .map(|b| std::io::IoSlice::new(b))
            .collect();
        let mut n = match idle.as_mut() {
            Some((timer, after)) => timer
                .timeout(*after, w.write_vectored(&slices))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??,
            None => w.write_vectored(&slices).await?,
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && first < bufs.len() {
            let len = bufs[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                bufs[first] = &bufs[first][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// How a request ended for the connection.
pub(super) enum Next {
    /// Read the next request.
    KeepAlive,
    /// Close (after lingering when the request's input was not all read).
    Close { linger: bool },
    /// Hand the connection to the hyper front, this request first (nothing was written), and
    /// why (a `reason` of `crate::metrics::HTTP1_HANDOFFS`).
    Hyper(&'static str),
}

/// The access-log record of an exchange, sent when dropped (the body ended, failed, or the
/// client went away).
pub(super) struct Logged<'a> {
    pub(super) record: Option<Box<Record>>,
    pub(super) shared: &'a Shared,
    /// The cache's copy of the response body (see [`crate::pipeline::drive::Relay::fill`]).
    pub(super) fill: Option<Box<crate::cache::Fill>>,
}

impl Logged<'_> {
    /// The upstream's body bytes as they pass, for the cache's copy.
    pub(super) fn copy(&mut self, bytes: &[u8]) {
        if let Some(f) = self.fill.as_mut() {
            f.data(bytes);
        }
    }

    /// The upstream's body ended in full: the cache's copy is stored.
    pub(super) fn ended(&mut self) {
        if let Some(mut f) = self.fill.take() {
            f.end();
        }
    }

    pub(super) fn sent(&mut self, n: usize) {
        if let Some(r) = self.record.as_mut() {
            r.bytes_sent = r
                .bytes_sent
                .saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
        }
    }
}

impl Drop for Logged<'_> {
    fn drop(&mut self) {
        if let Some(mut r) = self.record.take() {
            r.duration = r.started.elapsed();
            self.shared.access_log.send(r);
        }
    }
}

/// Before an answer: the request's body, if any, was not read — skipped when it is all here
/// already (and the connection need not close, `closes` false); `true`: it is not, and the
/// connection closes (lingering) after the answer.
fn skip_unread<T>(c: &mut ClientConn<T>, head: &Head, closes: bool) -> bool {
    match head.body {
        BodyKind::Length(n) if closes => n > 0,
        BodyKind::Length(n) => match usize::try_from(n) {
            Ok(n) if n <= c.buf.len() => {
                let _ = c.buf.split_to(n);
                false
            }
            _ => true,
        },
        BodyKind::Chunked => {
            let mut d = super::codec::ChunkedDecoder::default();
            match d.decode_all_buffered(&c.buf) {
                Some(n) => {
                    let _ = c.buf.split_to(n);
                    false
                }
                None => true,
            }
        }
    }
}

/// Adds `Alt-Svc` (the HTTP/3 listener, advertised on the TLS listener) to a response head
/// written into `out` (its last field before the blank line).
pub(super) fn alt_svc(value: Option<&HeaderValue>, out: &mut Vec<u8>) {
    let Some(v) = value else { return };
    if out.ends_with(b"\r\n\r\n") {
        out.truncate(out.len() - 2);
        out.extend_from_slice(b"alt-svc: ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
    }
}

/// Writes a limit's refusal to `head`'s request ([`crate::pipeline::drive::refusal`]): its body
/// and head rendered into the connection's own buffer ([`super::write::refusal`]) and sent
/// with one write, nothing allocated; the same bytes as [`write_answer`] of its
/// [`Refusal::rendered`].
pub(super) async fn write_refusal<T>(
    shared: &Shared,
    c: &mut ClientConn<T>,
    head: &Head,
    refusal: Refusal<'_>,
    close: bool,
) -> Next
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let Refusal {
        error,
        rate,
        request_id,
        id_header,
        record,
    } = refusal;
    let mut log = Logged {
        record,
        shared,
        fill: None,
    };
    let closes = error.closes_connection();
    let unread = skip_unread(c, head, closes);
    let close = close || closes || unread;
    let mut out = std::mem::take(&mut c.out);
    let at = super::write::refusal(
        &mut out,
        &error,
        rate.as_ref(),
        (id_header, request_id),
        close,
    );
    alt_svc(c.alt_svc.as_ref(), &mut out);
    let (body, head_bytes) = out.split_at(at);
    let body: &[u8] = if *head.method() == http::Method::HEAD {
        b""
    } else {
        body
    };
    let sent = body.len();
    let written = write_all_vectored(&mut c.io, &mut [head_bytes, body]).await;
    c.out = out;
    if written.is_err() {
        return Next::Close { linger: false };
    }
    log.sent(sent);
    if close {
        Next::Close { linger: unread }
    } else {
        Next::KeepAlive
    }
}

/// Writes the gateway's own answer to `head`'s request, made ready by the life cycle
/// ([`crate::pipeline::drive::answer`]), and says what the connection does next (`close`: it
/// closes after the answer).
pub(super) async fn write_answer<T>(
    shared: &Shared,
    c: &mut ClientConn<T>,
    head: &Head,
    rendered: Rendered,
    close: bool,
) -> Next
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let Rendered {
        status,
        headers,
        body,
        closes,
        record,
    } = rendered;
    let mut log = Logged {
        record,
        shared,
        fill: None,
    };
    let unread = skip_unread(c, head, closes);
    let close = close || closes || unread;
    let listed: smallvec::SmallVec<[(&http::HeaderName, &[u8]); 8]> =
        headers.iter().map(|(n, v)| (n, v.as_bytes())).collect();
    let mut out = std::mem::take(&mut c.out);
    response_head(
        &mut out,
        status.as_u16(),
        None,
        std::iter::empty(),
        &ResponseExtras {
            headers: listed.iter().copied(),
            stripped: &[],
            framing: ResponseBody::Length(body.len() as u64),
            close,
            edits: None,
        },
    );
    alt_svc(c.alt_svc.as_ref(), &mut out);
    let body_bytes: &[u8] = if *head.method() == http::Method::HEAD {
        b""
    } else {
        &body
    };
    let written = write_all_vectored(&mut c.io, &mut [&out, body_bytes]).await;
    c.out = out;
    if written.is_err() {
        return Next::Close { linger: false };
    }
    log.sent(body_bytes.len());
    if close {
        Next::Close { linger: unread }
    } else {
        Next::KeepAlive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf as _;

    /// The allocation behind `buf`, as its next read would see it: what a reserve makes
    /// available from the start of the unread bytes.
    fn reachable(buf: &mut BytesMut) -> usize {
        buf.reserve(READ_BUFFER);
        buf.capacity()
    }

    /// #50 item 9: after a large body (3 MiB, read whole as a body read before the limits is),
    /// the connection's buffer goes back under [`KEPT_BUFFER`], also with a pipelined request
    /// left in it; small requests never reallocate it.
    #[tokio::test]
    async fn the_buffer_shrinks_back_after_a_large_body() {
        let body = vec![b'x'; 3 << 20];
        let next = b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n";
        let (a, mut b) = tokio::io::duplex(256 * 1024);
        let mut input = body.clone();
        input.extend_from_slice(next);
        let writer = tokio::spawn(async move {
            b.write_all(&input).await.unwrap();
            b
        });
        let mut c = ClientConn::new(a);
        while c.buf.len() < body.len() + next.len() {
            assert!(c.read_more().await.unwrap() > 0);
        }
        let _peer = writer.await.unwrap();
        assert!(
            reachable(&mut c.buf) >= body.len(),
            "the body was read whole"
        );
        c.buf.advance(body.len());
        c.shrink();
        assert_eq!(&c.buf[..], next, "the pipelined request is kept");
        let kept = reachable(&mut c.buf);
        assert!(
            kept <= KEPT_BUFFER,
            "the buffer keeps {kept} bytes after a large body"
        );
        // A connection that never grew keeps its buffer as it is.
        let (a, _b) = tokio::io::duplex(1024);
        let mut c = ClientConn::new(a);
        c.buf.extend_from_slice(next);
        let at = c.buf.as_ptr();
        c.shrink();
        assert_eq!(c.buf.as_ptr(), at, "not reallocated");
    }
}
