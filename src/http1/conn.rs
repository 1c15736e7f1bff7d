//! The fast front's connection loop: reads request heads (in order: a pipelined request waits
//! in the buffer until the one before it is answered), runs each through the pipeline, sends
//! the admitted ones upstream ([`super::exchange`]) and renders the pipeline's answers; keeps
//! the connection alive, enforces the header and idle timeouts, and closes at a drain.
//!
//! A head it does not serve (see [`super::parse::Fallback`]) ends the loop with a
//! [`Handoff`]: the connection and every byte read of it, for hyper to serve from there on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio::time::Instant;

use super::codec::ResponseBody;
use super::parse::{scan, BodyKind, Head, Parsed};
use super::write::{response_head, ResponseExtras};
use crate::access_log::Record;
use crate::log_throttle::Throttles;
use crate::pipeline::{admit, Answer, Exchange, Peer, Trail, WorkerCtx};
use crate::state::Shared;

/// How long a connection closed with unread input keeps reading and discarding, so the
/// client can still read the answer (as the hyper front's connections do).
const LINGER: Duration = Duration::from_secs(2);

/// What serves requests on one worker: the shared state, the worker's index (its pools) and
/// settle tracking.
#[derive(Clone)]
pub struct Front {
    pub shared: Arc<Shared>,
    pub worker: usize,
    pub ctx: WorkerCtx,
}

/// The client side of a connection.
#[derive(Clone, Debug)]
pub struct Client {
    pub peer: SocketAddr,
    /// The peer's address as a header value (`X-Forwarded-For`).
    pub peer_ip: HeaderValue,
    pub tls: bool,
}

/// The connection's timers and head limit.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub idle: Duration,
    pub header: Duration,
    pub max_head: usize,
}

/// A connection handed to hyper: the IO and the bytes read but not served.
pub struct Handoff<T> {
    pub io: T,
    pub read: Bytes,
}

/// The client connection as the loop and the exchange use it.
pub(super) struct ClientConn<T> {
    pub(super) io: T,
    /// Bytes read and not consumed (the rest of a body, pipelined requests).
    pub(super) buf: BytesMut,
    /// The head being written (reused).
    pub(super) out: Vec<u8>,
}

impl<T: AsyncRead + AsyncWrite + Unpin> ClientConn<T> {
    /// Reads more bytes into the buffer; `Ok(0)` at end of input.
    pub(super) async fn read_more(&mut self) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        self.io.read_buf(&mut self.buf).await
    }
}

/// Writes every byte of `bufs` (one vectored write when the socket takes it all).
pub(super) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    bufs: &mut [&[u8]],
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
        let mut n = w.write_vectored(&slices).await?;
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
}

/// Serves `io` until it closes, idles out or drains (`None`), or meets a request it hands to
/// hyper (`Some`).
pub async fn serve<T>(
    front: &Front,
    io: T,
    client: &Client,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
) -> Option<Handoff<T>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let mut c = ClientConn {
        io,
        buf: BytesMut::with_capacity(16 * 1024),
        out: Vec::with_capacity(1024),
    };
    let opened = Instant::now();
    let mut last_active = opened;
    let mut first = true;
    let mut watching = true;
    loop {
        // A head: from the first byte (or the connection's start, for its first request) it
        // must be complete within `header`; with nothing read, the connection may idle.
        let mut head_since =
            (!c.buf.is_empty() || first).then(|| if first { opened } else { Instant::now() });
        let len = loop {
            if !c.buf.is_empty() {
                match scan(&c.buf) {
                    Parsed::Complete(n) if n <= limits.max_head => break n,
                    // hyper answers an oversized head (431) and closes.
                    Parsed::Complete(_) => {
                        return Some(Handoff {
                            io: c.io,
                            read: c.buf.freeze(),
                        });
                    }
                    Parsed::Fallback(why) => {
                        tracing::trace!(?why, "request handed to hyper");
                        return Some(Handoff {
                            io: c.io,
                            read: c.buf.freeze(),
                        });
                    }
                    Parsed::Partial if c.buf.len() > limits.max_head => {
                        // hyper answers the oversized head (431) and closes.
                        return Some(Handoff {
                            io: c.io,
                            read: c.buf.freeze(),
                        });
                    }
                    Parsed::Partial => {}
                }
            }
            let draining = *stop.borrow();
            if draining && c.buf.is_empty() {
                return None;
            }
            let idle_due = last_active + limits.idle;
            let due = match head_since {
                Some(since) => (since + limits.header).min(idle_due),
                None => idle_due,
            };
            tokio::select! {
                read = c.read_more() => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {
                        last_active = Instant::now();
                        head_since.get_or_insert(last_active);
                    }
                },
                changed = stop.changed(), if !draining && watching => {
                    // The drain's sender gone: nothing will say "drain" any more.
                    watching = changed.is_ok();
                }
                _ = tokio::time::sleep_until(due) => {
                    tracing::debug!(peer = %client.peer, "connection timed out waiting for a request head");
                    return None;
                }
            }
        };
        first = false;
        let bytes = c.buf.split_to(len).freeze();
        let Some(head) = Head::parse(bytes.clone()) else {
            // A target `httparse` takes and `http`'s URI parser does not (`/>`): hyper's to
            // answer (400), with every byte as read.
            let mut read = BytesMut::with_capacity(bytes.len() + c.buf.len());
            read.extend_from_slice(&bytes);
            read.extend_from_slice(&c.buf);
            return Some(Handoff {
                io: c.io,
                read: read.freeze(),
            });
        };
        let next = request(front, &mut c, client, head, stop).await;
        last_active = Instant::now();
        match next {
            Next::KeepAlive => {}
            Next::Close { linger } => {
                let _ = c.io.flush().await;
                if linger {
                    let _ = tokio::time::timeout(LINGER, async {
                        let mut sink = [0u8; 8192];
                        while let Ok(n) = c.io.read(&mut sink).await {
                            if n == 0 {
                                break;
                            }
                        }
                    })
                    .await;
                }
                let _ = c.io.shutdown().await;
                return None;
            }
        }
    }
}

/// The access-log record of an exchange, sent when dropped (the body ended, failed, or the
/// client went away).
pub(super) struct Logged<'a> {
    pub(super) record: Option<Box<Record>>,
    pub(super) shared: &'a Shared,
}

impl Logged<'_> {
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

/// One request: the pipeline, then the upstream exchange or the gateway's answer.
async fn request<T>(
    front: &Front,
    c: &mut ClientConn<T>,
    client: &Client,
    head: Head,
    stop: &watch::Receiver<bool>,
) -> Next
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let started = std::time::Instant::now();
    let shared = &*front.shared;
    let snap = shared.snapshot.load_full();
    let logging = snap.config.log.access.is_on();
    let id_header = &snap.config.server.request_id_header;
    let request_id = crate::request_id::of_head(&head, id_header, started);
    let mut trail = Trail::default();
    let peer = Peer {
        ip: client.peer.ip(),
        ip_value: &client.peer_ip,
        tls: client.tls,
    };
    let admitted = admit(&snap, &front.ctx, &head, &peer, &request_id, &mut trail).await;
    let exchange = Exchange {
        started,
        method: head.method().clone(),
        request_id: &request_id,
        peer: client.peer.ip(),
        status: http::StatusCode::OK,
    };
    match admitted {
        Ok(admitted) => {
            super::exchange::forward(
                front, &snap, c, &head, admitted, trail, exchange, logging, stop,
            )
            .await
        }
        Err(answer) => {
            let close = head.close || *stop.borrow();
            answer_with(shared, c, &head, answer, trail, exchange, logging, close).await
        }
    }
}

/// Renders the gateway's own answer to `head`'s request and says what the connection does
/// next.
#[allow(clippy::too_many_arguments)]
pub(super) async fn answer_with<T>(
    shared: &Shared,
    c: &mut ClientConn<T>,
    head: &Head,
    answer: Answer,
    trail: Trail<'_>,
    mut exchange: Exchange<'_>,
    logging: bool,
    close: bool,
) -> Next
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
{
    let e = &answer.error;
    let status = e.status();
    if status.is_server_error() {
        // One line a second per status at most: a dead upstream fails every request.
        static FAILED: Throttles<6> = Throttles::new();
        if let Some(suppressed) = FAILED.allow(usize::from(status.as_u16() - 500)) {
            tracing::warn!(route = trail.route.map(|r| &*r.name), status = status.as_u16(), error = %e, request_id = exchange.request_id.to_str().unwrap_or(""), suppressed, "request failed");
        }
    }
    let closes = e.closes_connection();
    // The request's body, if any, was not read: skip it when it is all here already, else
    // close (lingering) after the answer.
    let mut unread = false;
    match head.body {
        BodyKind::Length(n) if closes => unread = n > 0,
        BodyKind::Length(n) => match usize::try_from(n) {
            Ok(n) if n <= c.buf.len() => {
                let _ = c.buf.split_to(n);
            }
            _ => unread = true,
        },
        BodyKind::Chunked => {
            let mut d = super::codec::ChunkedDecoder::default();
            match d.decode_all_buffered(&c.buf) {
                Some(n) => {
                    let _ = c.buf.split_to(n);
                }
                None => unread = true,
            }
        }
    }
    let close = close || closes || unread;
    exchange.status = status;
    let request_id = exchange.request_id.clone();
    let record = trail.finish(shared, logging, exchange);
    let mut log = Logged { record, shared };
    let (status, mut headers, body) = answer.parts(&request_id);
    let id_header = &shared.snapshot.load().config.server.request_id_header;
    headers.insert(id_header, request_id);
    let mut out = std::mem::take(&mut c.out);
    response_head(
        &mut out,
        status.as_u16(),
        b"",
        std::iter::empty(),
        &ResponseExtras {
            headers: &headers,
            stripped: &[],
            framing: ResponseBody::Length(body.len() as u64),
            close,
        },
    );
    let body_bytes: &[u8] = if *head.method() == http::Method::HEAD {
        b""
    } else {
        body.as_bytes()
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

use crate::head::RequestHead as _;
