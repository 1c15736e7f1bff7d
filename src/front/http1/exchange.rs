//! The fast front as a codec of the one life cycle (`Fast`, a
//! [`crate::pipeline::cycle::Codec`]), in the request's own task: for the server the planner
//! picked, take an idle connection from this worker's pool or open one, write the head (the
//! client's, with the edits spliced in) and stream the body, read the response head; once the
//! life cycle relayed it, stream the response back; the connection goes back to the pool when
//! both messages ended cleanly.
//!
//! Timers, on the connection's one [`Deadline`]: the route's `timeout` is the upstream's time
//! only (to connect, to take each write of the request, to send its head once the request was
//! sent); the client's body reads have `body_read_timeout` (408). Streaming the response, an
//! upstream silent or a client taking nothing for `idle_timeout` ends the exchange and closes
//! both connections, and a client that closes while the upstream is silent is noticed at once.
//!
//! The attempts are the one planner's ([`crate::upstream::attempts`]: another server only when
//! nothing reached the failed one, a connect or TLS failure, or the request is idempotent and
//! has no body); this front only sends once. A reused idle connection the upstream had closed
//! meanwhile is not a failure of the server: a request the same rule allows (idempotent, no body) is sent
//! again once on a new connection; any other gets the 502.

use std::future::Future;
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::watch;

use super::codec::{chunk_head, ChunkedDecoder, ResponseBody};
use super::deadline::Deadline;
use super::parse::{BodyKind, Field, Head, MAX_HEADERS};
use super::prefix::ConnBody;
use super::session::{
    write_all_vectored, write_all_vectored_within, write_answer, write_refusal, ClientConn, Front,
    Logged, Next,
};
use super::write::{response_head, ResponseExtras, UpstreamHead};
use crate::compression::Encoder;
use crate::front::pending::PendingBodies;
use crate::http::fields::Fields;
use crate::http::head::RequestHead as _;
use crate::http::pacing::Paced;
use crate::pipeline::cycle::{self, Codec};
use crate::pipeline::drive::{self, Refusal, Relay, Rendered, ReplyHead};
use crate::pipeline::respond::Fate;
use crate::pipeline::{respond, BodyCharge, BodyPrefix, Edits, Leases, Prefix, ProxyError, Trail};
use crate::routing::Route;
use crate::runtime::state::{Shared, Snapshot};
use crate::upstream::attempts::{self, may_send_again, To};
use crate::upstream::pool::{open, Pool, UpStream};
use crate::upstream::{Failure, Group, InFlight};

/// The largest upstream response head read.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// How much of a pipelined next request is read while waiting for the upstream (to notice a
/// client that went away).
const MAX_PIPELINED: usize = 64 * 1024;

/// An upstream response head, kept as received.
pub(super) struct RespHead {
    bytes: Bytes,
    pub(super) status: u16,
    pub(super) reason: (u32, u32),
    fields: SmallVec<[Field; 16]>,
    pub(super) framing: ResponseBody,
    pub(super) keep_alive: bool,
}

impl RespHead {
    pub(super) fn slice(&self, (start, len): (u32, u32)) -> &[u8] {
        let start = start as usize;
        self.bytes
            .get(start..start + len as usize)
            .unwrap_or_default()
    }

    pub(super) fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.fields
            .iter()
            .map(|f| (self.slice(f.name), self.slice(f.value)))
    }
}

fn offsets(base: &[u8], part: &[u8]) -> (u32, u32) {
    let start = (part.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
    (
        u32::try_from(start).unwrap_or(0),
        u32::try_from(part.len()).unwrap_or(0),
    )
}

/// Parses a response head at the start of `buf`: `Ok(None)` while incomplete.
pub(super) fn parse_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<RespHead>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let n = match res.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(n)) => n,
        Err(e) => return Err(format!("invalid response head: {e}")),
    };
    let status = res.code.unwrap_or(0);
    // A status outside 100-599 (`099`, `600`) is no answer to relay (the hyper front's client
    // refuses it too): 502.
    if !(100..=599).contains(&status) {
        return Err(format!("invalid status code {status} in the response"));
    }
    let version = res.version.unwrap_or(0);
    let mut te_chunked = None;
    let mut length: Option<Option<u64>> = None;
    let mut close = version == 0;
    // Offsets from the buffer's start: the same for the head split off and frozen below (the
    // head is parsed once).
    let base: &[u8] = buf;
    let mut fields = SmallVec::new();
    for h in res.headers.iter() {
        let name = h.name.as_bytes();
        fields.push(Field {
            name: offsets(base, name),
            value: offsets(base, h.value),
        });
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let v = super::framing::trim(h.value);
            te_chunked =
                Some(v.rsplit(|b| *b == b',').next().is_some_and(|last| {
                    super::framing::trim(last).eq_ignore_ascii_case(b"chunked")
                }));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let n = list_length(h.value);
            length = Some(match (length, n) {
                (None, Some(n)) => Some(n),
                (Some(Some(prev)), Some(n)) if prev == n => Some(n),
                _ => None,
            });
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in h.value.split(|b| *b == b',') {
                let t = super::framing::trim(t);
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && version == 0 {
                    close = false;
                }
            }
        }
    }
    // Relayed as received, even empty (`HTTP/1.1 200 `), as the hyper front does.
    let reason = match res.reason {
        Some(r) if !r.is_empty() => offsets(base, r.as_bytes()),
        _ => (0, 0),
    };
    let framing = ResponseBody::of(head_request, status, te_chunked, length)
        .ok_or_else(|| "invalid Content-Length in the response".to_owned())?;
    let bytes = buf.split_to(n).freeze();
    Ok(Some(RespHead {
        status,
        reason,
        fields,
        framing,
        keep_alive: !close && framing != ResponseBody::Close,
        bytes,
    }))
}

/// A response's `Content-Length` value: one decimal, or a list of the same decimal repeated
/// (`5, 5`), which RFC 9110 §8.6 lets a recipient take as that one value (as hyper does); the
/// client gets it as one value.
fn list_length(value: &[u8]) -> Option<u64> {
    let mut n = None;
    for part in value.split(|b| *b == b',') {
        let v = super::framing::digits(super::framing::trim(part))?;
        match n {
            Some(prev) if prev != v => return None,
            _ => n = Some(v),
        }
    }
    n
}

/// Why an attempt failed.
enum Failed {
    /// The client's fault (its body too large, too slow, malformed), or the client left.
    Client(Option<ProxyError>),
    /// The upstream failed; `unsent`: nothing reached it. `stale`: a reused connection that
    /// was closed before any byte of an answer.
    Upstream {
        failure: Failure,
        unsent: bool,
        stale: bool,
    },
    /// The upstream took longer than the route's `timeout`: to connect, to take a piece of the
    /// request, or to send its response head once the request was sent.
    Timeout,
}

/// The request body's progress toward the upstream.
struct BodyOut {
    kind: BodyKind,
    /// Bytes of a `Content-Length` body still to send.
    left: u64,
    decoder: ChunkedDecoder,
    sent: u64,
    started: bool,
    done: bool,
}

impl BodyOut {
    fn new(kind: BodyKind) -> BodyOut {
        let left = match kind {
            BodyKind::Length(n) => n,
            BodyKind::Chunked => 0,
        };
        BodyOut {
            kind,
            left,
            decoder: ChunkedDecoder::default(),
            sent: 0,
            started: false,
            done: kind == BodyKind::Length(0),
        }
    }

    /// The body's bytes sent upstream so far.
    fn forwarded(&self) -> u64 {
        match self.kind {
            BodyKind::Length(n) => n.saturating_sub(self.left),
            BodyKind::Chunked => self.sent,
        }
    }
}

/// Reads more of the client's body, within `timeout`.
async fn read_body<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut ClientConn<T>,
    timeout: Duration,
) -> Result<(), Failed> {
    match tokio::time::timeout(timeout, c.read_more()).await {
        Err(_) => Err(Failed::Client(Some(ProxyError::BodyTimeout))),
        Ok(Ok(0)) | Ok(Err(_)) => Err(Failed::Client(Some(ProxyError::BadBody))),
        Ok(Ok(_)) => Ok(()),
    }
}

/// Writes the head and streams the body to `up`. The time spent waiting on the client is the
/// client's (`body_timeout` for each read, then 408); each write must be taken by the upstream
/// within the route's `timeout` (nginx's `proxy_send_timeout`), else the upstream timed out.
async fn send_request<T: AsyncRead + AsyncWrite + Unpin>(
    up: &mut UpStream,
    head: &[u8],
    c: &mut ClientConn<T>,
    body: &mut BodyOut,
    route: &Route,
    body_timeout: Duration,
    timer: &mut Deadline,
) -> Result<(), Failed> {
    let up_err = |e: std::io::Error, sent_any: bool| Failed::Upstream {
        failure: Failure::Protocol(e.to_string()),
        unsent: false,
        stale: !sent_any,
    };
    let timed_out = |_| Failed::Timeout;
    match body.kind {
        BodyKind::Length(_) => {
            let piece = c
                .buf
                .len()
                .min(usize::try_from(body.left).unwrap_or(usize::MAX));
            if piece > 0 {
                body.started = true;
            }
            timer
                .timeout(
                    route.timeout,
                    write_all_vectored(up, &mut [head, &c.buf[..piece]]),
                )
                .await
                .map_err(timed_out)?
                .map_err(|e| up_err(e, false))?;
            c.buf.advance(piece);
            body.left -= piece as u64;
            while body.left > 0 {
                if c.buf.is_empty() {
                    read_body(c, body_timeout).await?;
                }
                let piece = c
                    .buf
                    .len()
                    .min(usize::try_from(body.left).unwrap_or(usize::MAX));
                timer
                    .timeout(route.timeout, up.write_all(&c.buf[..piece]))
                    .await
                    .map_err(timed_out)?
                    .map_err(|e| up_err(e, true))?;
                c.buf.advance(piece);
                body.left -= piece as u64;
            }
        }
        BodyKind::Chunked => {
            timer
                .timeout(route.timeout, up.write_all(head))
                .await
                .map_err(timed_out)?
                .map_err(|e| up_err(e, false))?;
            body.started = true;
            loop {
                let r = body
                    .decoder
                    .decode(&c.buf)
                    .map_err(|_| Failed::Client(Some(ProxyError::BadBody)))?;
                let (from, to) = r.data;
                if to > from {
                    body.sent += (to - from) as u64;
                    if body.sent > route.max_body_size {
                        return Err(Failed::Client(Some(ProxyError::BodyTooLarge(
                            route.max_body_size,
                        ))));
                    }
                    let mut ch = [0u8; 20];
                    let ch = chunk_head(to - from, &mut ch);
                    timer
                        .timeout(
                            route.timeout,
                            write_all_vectored(up, &mut [ch, &c.buf[from..to], b"\r\n"]),
                        )
                        .await
                        .map_err(timed_out)?
                        .map_err(|e| up_err(e, true))?;
                }
                c.buf.advance(r.consumed);
                if body.decoder.is_done() {
                    timer
                        .timeout(route.timeout, up.write_all(b"0\r\n\r\n"))
                        .await
                        .map_err(timed_out)?
                        .map_err(|e| up_err(e, true))?;
                    break;
                }
                if r.consumed == 0 || c.buf.is_empty() {
                    read_body(c, body_timeout).await?;
                }
            }
        }
    }
    body.done = true;
    Ok(())
}

/// Reads the response head from `up` (1xx answers skipped), while watching the client: a
/// client that closes its side abandons the request (as the hyper front's does).
async fn read_response<T: AsyncRead + AsyncWrite + Unpin>(
    up: &mut UpStream,
    ubuf: &mut BytesMut,
    c: &mut ClientConn<T>,
    head_request: bool,
) -> Result<RespHead, Failed> {
    let mut got_any = false;
    loop {
        if !ubuf.is_empty() {
            match parse_response(ubuf, head_request) {
                Ok(Some(h)) if (100..200).contains(&h.status) && h.status != 101 => continue,
                Ok(Some(h)) => return Ok(h),
                Ok(None) if ubuf.len() > MAX_RESPONSE_HEAD => {
                    return Err(Failed::Upstream {
                        failure: Failure::Protocol("response head too large".into()),
                        unsent: false,
                        stale: false,
                    })
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(Failed::Upstream {
                        failure: Failure::Protocol(e),
                        unsent: false,
                        stale: false,
                    })
                }
            }
        }
        if ubuf.capacity() - ubuf.len() < 4096 {
            ubuf.reserve(16 * 1024);
        }
        let watch_client = c.buf.len() < MAX_PIPELINED;
        tokio::select! {
            r = up.read_buf(ubuf) => match r {
                Ok(0) => return Err(Failed::Upstream {
                    failure: Failure::Protocol("connection closed before message completed".into()),
                    unsent: false,
                    stale: !got_any,
                }),
                Err(e) => return Err(Failed::Upstream {
                    failure: Failure::Protocol(e.to_string()),
                    unsent: false,
                    stale: !got_any,
                }),
                Ok(_) => got_any = true,
            },
            r = c.read_more(), if watch_client => match r {
                Ok(0) | Err(_) => return Err(Failed::Client(None)),
                Ok(_) => {}
            },
        }
    }
}

/// The response's end, before its last bytes are sent: the request's concurrency slots are
/// released and what the body costs (`cost_from`) is charged, both awaited (so a client that
/// asks again at once finds its slot free and its budget charged, as on the hyper front).
async fn release(leases: &mut Option<Leases>, charge: &mut Option<Box<BodyCharge>>) {
    if let Some(l) = leases.as_mut() {
        l.release();
    }
    if let Some(c) = charge.as_mut() {
        c.end();
    }
    if let Some(mut l) = leases.take() {
        std::future::poll_fn(|cx| l.poll_released(cx)).await;
    }
    if let Some(mut c) = charge.take() {
        std::future::poll_fn(|cx| c.poll_charged(cx)).await;
    }
}

/// Feeds bytes of the response body, as they are sent, to what reads its cost.
fn scanned(charge: &mut Option<Box<BodyCharge>>, bytes: &[u8]) {
    if let Some(c) = charge.as_mut() {
        c.data(bytes);
    }
}

/// `n` bytes of the response body handed to the client (`unit = "bytes"` limits count them).
fn sent(charge: &mut Option<Box<BodyCharge>>, n: usize) {
    if let Some(c) = charge.as_mut() {
        c.sent(n);
    }
}

/// What an upstream attempt delivered.
pub(super) struct Answered<'g> {
    /// (Taken back into the pool when the exchange ended cleanly.)
    up: Option<UpStream>,
    ubuf: BytesMut,
    head: RespHead,
    pool: &'g Pool,
}

/// The fast front as a codec of the one life cycle ([`crate::pipeline::cycle`]): the request's
/// head as parsed in the connection's buffer, its body read from there, the upstream head
/// written for each attempt over this worker's pooled connections, the response head as
/// received (with an overlay of what the gateway edits) and its body streamed; answers written
/// in place.
pub(super) struct Fast<'x, T> {
    front: &'x Front,
    c: &'x mut ClientConn<T>,
    timer: &'x mut Deadline,
    head: &'x Head,
    stop: &'x watch::Receiver<bool>,
    shared: &'x Shared,
    /// The body as admission reads it (routes whose limits read the JSON body).
    body_in: ConnBody<'x>,
    /// `idle_timeout`.
    idle: Duration,
    /// `body_read_timeout`.
    body_timeout: Duration,
    /// The admitted request, once prepared.
    going: Option<Going>,
}

/// An admitted request on its way upstream.
struct Going {
    uh: UpstreamHead,
    body: BodyOut,
    /// The upstream head, written into the connection's head buffer (taken from it, and given
    /// back before the response head is written there).
    out: Vec<u8>,
}

impl<'x, T> Fast<'x, T> {
    /// `pending`: what the connection's bodies not yet decided hold (this front serves one
    /// request of a connection at a time, so at most this one's).
    pub(super) fn new(
        front: &'x Front,
        (c, timer, pending): (
            &'x mut ClientConn<T>,
            &'x mut Deadline,
            &'x std::sync::atomic::AtomicUsize,
        ),
        head: &'x Head,
        stop: &'x watch::Receiver<bool>,
        snap: &Snapshot,
    ) -> Self {
        let server = &snap.config.server;
        let pending = PendingBodies {
            connection: pending,
            worker: &front.pending_bodies,
            bounds: server.pending_bodies,
        };
        Fast {
            front,
            c,
            timer,
            head,
            stop,
            shared: &front.shared,
            body_in: ConnBody::new(head.body, server.body_read_timeout, pending),
            idle: server.idle_timeout,
            body_timeout: server.body_read_timeout,
            going: None,
        }
    }

    /// The connection's head buffer back from the upstream head.
    /// Before an answer is written: the body decided, the head's buffer given back; whether
    /// the connection closes after it (`close`, or a body not read to its end, which leaves
    /// the connection's framing unknown).
    fn answering(&mut self, close: bool) -> bool {
        self.body_in.decided();
        self.give_back_out();
        let unread = self.going.as_ref().is_some_and(|g| !g.body.done);
        close || self.head.close || *self.stop.borrow() || unread
    }

    fn give_back_out(&mut self) {
        if let Some(g) = self.going.as_mut() {
            if g.out.capacity() > 0 {
                self.c.out = std::mem::take(&mut g.out);
            }
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> BodyPrefix for Fast<'_, T> {
    fn read(
        &mut self,
        max: u64,
        max_body_size: u64,
    ) -> impl Future<Output = Result<Prefix<'_>, ProxyError>> + Send {
        self.body_in.read_from(self.c, max, max_body_size)
    }
}

impl<'x, T: AsyncRead + AsyncWrite + Unpin + Send> Codec for Fast<'x, T> {
    type Head = &'x Head;
    type Response<'s> = Answered<'s>;
    type Reply<'s> = Reply<'s>;
    type Done = Next;

    fn accept_encoding(&self) -> impl Iterator<Item = &str> {
        cycle::accept_encoding(self.head)
    }

    fn worker(&self) -> usize {
        self.front.worker
    }

    fn prepare(&mut self, head: &'x Head, route: &Route, edits: Edits) {
        self.body_in.decided();
        self.going = Some(Going {
            uh: UpstreamHead::new(head, edits, route.preserve_host),
            body: BodyOut::new(head.body),
            out: std::mem::take(&mut self.c.out),
        });
    }

    fn bodyless(&self) -> bool {
        !self.head.has_body()
    }

    /// The fast front's "send once": the upstream head written for the server picked, over an
    /// idle connection of this worker's pool for it or a new one, the client's body streamed,
    /// the response head read. The planner ([`crate::upstream::attempts`]) does the rest.
    async fn send<'s>(
        &mut self,
        route: &'s Route,
        group: &'s Group,
        to: To,
    ) -> Result<Answered<'s>, attempts::Failed<ProxyError>> {
        let Fast {
            front,
            c,
            timer,
            head,
            going,
            body_timeout,
            ..
        } = self;
        let Some(g) = going.as_mut() else {
            let e = ProxyError::Upstream("the request was not prepared".to_owned());
            return Err(attempts::Failed::Client(Some(e)));
        };
        let server = &group.servers[to.index];
        if let Some(stamp) = to.trace {
            g.uh.stamp(head, stamp);
        }
        g.uh.write(head, &server.host, &mut g.out);
        let pool = group.pool(front.worker, to.index);
        // The retry rule (one for both fronts): may a request written to a server go again?
        let resendable = may_send_again(head.method(), !head.has_body(), false);
        let head_request = *head.method() == Method::HEAD;
        // The route's `timeout` is the upstream's time: to connect, to take each piece of the
        // request (`send_request`), and to send its response head from the request's end. The
        // time the client takes to send its body is not in it (#34 item 11).
        let mut fresh_tries = 0;
        let r = loop {
            let (mut up, reused) = match pool.take() {
                Some(up) if fresh_tries == 0 => (up, true),
                _ => match timer
                    .timeout(route.timeout, open(&group.connect, &server.authority))
                    .await
                {
                    Err(_) => break Err(Failed::Timeout),
                    Ok(Ok(up)) => (up, false),
                    Ok(Err(e)) => {
                        break Err(Failed::Upstream {
                            failure: Failure::from(&e),
                            unsent: true,
                            stale: false,
                        })
                    }
                },
            };
            let mut ubuf = std::mem::take(&mut c.spare);
            let sent =
                send_request(&mut up, &g.out, c, &mut g.body, route, *body_timeout, timer).await;
            let r = match sent {
                Ok(()) => timer
                    .timeout(
                        route.timeout,
                        read_response(&mut up, &mut ubuf, c, head_request),
                    )
                    .await
                    .unwrap_or(Err(Failed::Timeout)),
                Err(e) => Err(e),
            };
            match r {
                Ok(h) => {
                    break Ok(Answered {
                        up: Some(up),
                        ubuf,
                        head: h,
                        pool,
                    })
                }
                // The upstream closed an idle connection as it was reused: not the server's
                // failure; sent again once on a new connection if the retry rule allows it
                // (idempotent and bodyless: a written POST never goes twice, it gets the 502).
                Err(Failed::Upstream { stale: true, .. })
                    if reused && resendable && !g.body.started && fresh_tries == 0 =>
                {
                    fresh_tries += 1;
                    g.body.done = g.body.kind == BodyKind::Length(0);
                    continue;
                }
                Err(e) => break Err(e),
            }
        };
        r.map_err(|e| match e {
            Failed::Client(e) => attempts::Failed::Client(e),
            Failed::Timeout => attempts::Failed::Upstream {
                failure: Failure::Timeout(route.timeout),
                unsent: false,
            },
            Failed::Upstream {
                failure, unsent, ..
            } => attempts::Failed::Upstream { failure, unsent },
        })
    }

    fn status(answered: &Answered<'_>) -> StatusCode {
        StatusCode::from_u16(answered.head.status).unwrap_or(StatusCode::BAD_GATEWAY)
    }

    fn left(&mut self) -> Option<Next> {
        Some(Next::Close { linger: false })
    }

    fn reply<'s>(
        &mut self,
        answered: Answered<'s>,
        _: Option<InFlight>,
        _: &'s Route,
    ) -> Reply<'s> {
        self.give_back_out();
        Reply {
            request_bytes: self.going.as_ref().map_or(0, |g| g.body.forwarded()),
            answered,
            map: None,
            stripped: SmallVec::new(),
            extras: Fields::default(),
            edits: None,
        }
    }

    async fn answer(&mut self, rendered: Rendered, close: bool) -> Next {
        let close = self.answering(close);
        write_answer(self.shared, self.c, self.head, rendered, close).await
    }

    async fn refuse(&mut self, refusal: Refusal<'_>, close: bool) -> Next {
        let close = self.answering(close);
        write_refusal(self.shared, self.c, self.head, refusal, close).await
    }

    async fn stream<'s>(
        &mut self,
        reply: &mut Reply<'s>,
        relay: &mut Relay,
        route: &'s Route,
    ) -> Next {
        let Relay {
            charge,
            leases,
            record,
            encoder,
            pace,
            fill,
            ..
        } = relay;
        let Reply {
            answered:
                Answered {
                    up,
                    ubuf,
                    head: rh,
                    pool,
                },
            stripped,
            extras,
            edits,
            ..
        } = reply;
        let body_done = self.going.as_ref().is_none_or(|g| g.body.done);
        let c = &mut *self.c;
        let timer = &mut *self.timer;
        let mut log = Logged {
            record: record.take(),
            shared: self.shared,
            fill: fill.take(),
        };
        let close = self.head.close || *self.stop.borrow();
        let framing = rh.framing;
        let encoder = encoder.take();
        let mut out = std::mem::take(&mut c.out);
        response_head(
            &mut out,
            rh.status,
            Some(rh.slice(rh.reason)),
            rh.fields(),
            &ResponseExtras {
                headers: extras.iter(),
                stripped,
                // A compressed body's length is known only at its end: chunked.
                framing: if encoder.is_some() {
                    ResponseBody::Chunked
                } else {
                    framing
                },
                close,
                edits: edits.as_ref(),
            },
        );
        super::session::alt_svc(c.alt_svc.as_ref(), &mut out);
        let idle = self.idle;
        let mut paced = pace.take().map(Paced::new);
        let Some(upstream) = up.as_mut() else {
            return Next::Close { linger: false };
        };
        let streamed = match encoder {
            None => {
                stream_response(
                    c,
                    upstream,
                    ubuf,
                    &out,
                    framing,
                    (leases, charge, &mut log),
                    &mut paced,
                    timer,
                    idle,
                )
                .await
            }
            Some(e) => {
                let to = (leases, charge, &mut log);
                let time = (timer, idle, &mut paced);
                stream_compressed(c, upstream, ubuf, &out, framing, e, to, time).await
            }
        };
        c.out = out;
        let clean = match streamed {
            Ok(clean) => clean,
            Err(Cut::Unsent) => {
                *record = log.record.take();
                let rendered = drive::broken_before_head(route, relay, self.flavor());
                return write_answer(self.shared, self.c, self.head, rendered, true).await;
            }
            // Both connections close (the upstream's is dropped with the reply, unpooled).
            Err(cut) => {
                if matches!(cut, Cut::Idle) {
                    tracing::debug!(route = &*route.name, "response ended by idle_timeout");
                }
                return Next::Close { linger: false };
            }
        };
        if clean && rh.keep_alive && ubuf.is_empty() && body_done {
            if let Some(up) = up.take() {
                pool.put(up);
            }
        }
        // Kept for the next exchange once the response head (which shares its allocation) is
        // gone: its next `reserve` then reuses the allocation in place.
        drop(std::mem::take(&mut rh.bytes));
        if ubuf.is_empty() {
            c.spare = std::mem::take(ubuf);
        }
        if close {
            Next::Close { linger: false }
        } else {
            Next::KeepAlive
        }
    }
}

/// The fast front's response head for the driver ([`drive::relay`]): the head as received,
/// with the fields the gateway adds, the cost headers the limits stripped and the route's
/// response rules as an overlay (a header map is built only for limits charged after the
/// response; a route without response rules builds no overlay).
pub(super) struct Reply<'g> {
    answered: Answered<'g>,
    map: Option<HeaderMap>,
    stripped: SmallVec<[HeaderName; 1]>,
    extras: Fields,
    edits: Option<respond::ResponseEdits>,
    /// The request body's bytes sent upstream.
    request_bytes: u64,
}

impl ReplyHead for Reply<'_> {
    type Extras = Fields;

    fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.answered.head.status).unwrap_or(StatusCode::BAD_GATEWAY)
    }

    /// The fast front switches no protocol (an upgrade request is served by the hyper front).
    fn switch(&mut self, _: &mut Option<Leases>) -> Result<(), String> {
        if self.answered.head.status == 101 {
            return Err("switched protocols without an upgrade to switch to".into());
        }
        Ok(())
    }

    fn map(&mut self) -> &mut HeaderMap {
        let rh = &self.answered.head;
        self.map.get_or_insert_with(|| {
            let mut map = HeaderMap::new();
            for (n, v) in rh.fields() {
                if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
                    map.append(n, v);
                }
            }
            map
        })
    }

    fn charged(&mut self) {
        let Some(map) = &self.map else { return };
        for (n, _) in self.answered.head.fields() {
            if let Ok(n) = HeaderName::from_bytes(n) {
                if !map.contains_key(&n) && !self.stripped.contains(&n) {
                    self.stripped.push(n);
                }
            }
        }
    }

    fn extras(&mut self) -> &mut Fields {
        &mut self.extras
    }

    fn request_bytes(&self) -> u64 {
        self.request_bytes
    }

    /// The values of `name` as the client gets them (what [`response_head`] writes): the
    /// gateway's own fields of that name when it set any (they replace the upstream's), else the
    /// upstream's under the response rules' edits, less what a charge stripped. (Read by the
    /// compression phase only, after the rules: its `Vary` merge keeps a rule's values.)
    fn values<'s>(&'s self, name: &HeaderName) -> impl Iterator<Item = &'s str> + 's {
        let text = |v: &'s [u8]| std::str::from_utf8(v).ok();
        let mut out: SmallVec<[&'s str; 4]> = self
            .extras
            .iter()
            .filter(|(n, _)| *n == name)
            .filter_map(|(_, v)| text(v))
            .collect();
        if out.is_empty() && !self.extras.iter().any(|(n, _)| n == name) {
            let upstream = self
                .answered
                .head
                .fields()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_str().as_bytes()))
                .filter_map(|(_, v)| text(v));
            if !self.stripped.contains(name) {
                match self
                    .edits
                    .as_ref()
                    .map(|e| e.fate(name.as_str().as_bytes()))
                {
                    None | Some(Fate::Kept) => out.extend(upstream),
                    Some(Fate::Dropped) => {}
                    Some(Fate::Here { keep, values, .. }) => {
                        if keep {
                            out.extend(upstream);
                        }
                        out.extend(values.iter().filter_map(|v| v.to_str().ok()));
                    }
                }
            }
        }
        out.into_iter()
    }

    fn known_length(&self) -> Option<u64> {
        match self.answered.head.framing {
            ResponseBody::Length(n) => Some(n),
            ResponseBody::None => Some(0),
            ResponseBody::Chunked | ResponseBody::Close => None,
        }
    }

    fn remove(&mut self, name: &HeaderName) {
        self.extras.remove(name);
        // The upstream's lines (a response rule's in their place included) are not written.
        if !self.stripped.contains(name) {
            self.stripped.push(name.clone());
        }
    }

    fn respond(&mut self, trail: &Trail<'_>, request_id: &HeaderValue) {
        if !respond::responds(trail) {
            return;
        }
        let mut e = respond::ResponseEdits::default();
        respond::respond(trail, request_id, false, &mut e);
        let extras = &mut self.extras;
        e.resolve(self.answered.head.fields(), |n, v| extras.add(n, v));
        self.edits = Some(e);
    }
}

/// Why a response stopped before its end.
enum Cut {
    /// The upstream closed or failed mid-message.
    Upstream,
    /// The upstream's body broke (a chunk that does not parse, the upstream gone) before any of
    /// the response reached the client — its head is held until the body's first bytes: the
    /// gateway answers 502 in its place.
    Unsent,
    /// The upstream sent nothing, or the client took nothing, for `idle_timeout`.
    Idle,
    /// The client closed its connection (or it broke).
    Client,
}

/// Reads more of the response into `ubuf` (`Ok(0)`: the upstream's end of input) while
/// watching the client: a client that closes while the upstream is silent ends the exchange at
/// once (its slots and the upstream connection are released then, not when the upstream next
/// writes), and an upstream silent for `idle` ends it too.
async fn read_upstream<T: AsyncRead + AsyncWrite + Unpin>(
    up: &mut UpStream,
    ubuf: &mut BytesMut,
    c: &mut ClientConn<T>,
    timer: &mut Deadline,
    idle: Duration,
) -> Result<usize, Cut> {
    if ubuf.capacity() - ubuf.len() < 4096 {
        ubuf.reserve(16 * 1024);
    }
    let at = tokio::time::Instant::now().checked_add(idle);
    loop {
        let watch_client = c.buf.len() < MAX_PIPELINED;
        tokio::select! {
            r = up.read_buf(ubuf) => return r.map_err(|_| Cut::Upstream),
            r = c.read_more(), if watch_client => match r {
                Ok(0) | Err(_) => return Err(Cut::Client),
                // A pipelined request: it waits in the buffer for its turn.
                Ok(_) => {}
            },
            () = async { match at { Some(at) => timer.until(at).await, None => std::future::pending().await } } => {
                return Err(Cut::Idle);
            }
        }
    }
}

/// Writes the response head and streams the body to the client, releasing the request's
/// concurrency slots before its last bytes are sent (so a client that asks again at once finds
/// its slot free). `Ok(true)`: the upstream's message ended cleanly (its connection is
/// reusable); `Err`: the exchange was cut (the client's connection is to be closed, the
/// upstream's dropped). An upstream silent mid-body, or a client that takes no byte, for
/// `idle` (`idle_timeout`) cuts it, as the hyper front does.
#[allow(clippy::too_many_arguments)]
async fn stream_response<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut ClientConn<T>,
    up: &mut UpStream,
    ubuf: &mut BytesMut,
    head: &[u8],
    framing: ResponseBody,
    (leases, charge, log): (
        &mut Option<Leases>,
        &mut Option<Box<BodyCharge>>,
        &mut Logged<'_>,
    ),
    paced: &mut Option<Paced>,
    timer: &mut Deadline,
    idle: Duration,
) -> Result<bool, Cut> {
    let mut head: &[u8] = head;
    match framing {
        ResponseBody::None | ResponseBody::Length(0) => {
            log.ended();
            release(leases, charge).await;
            write_all_vectored_within(&mut c.io, &mut [head], Some((timer, idle)))
                .await
                .map_err(|_| Cut::Client)?;
            Ok(true)
        }
        ResponseBody::Length(n) => {
            let mut left = n;
            loop {
                if ubuf.is_empty() {
                    read_or_cut(up, ubuf, c, head, framing, (timer, idle)).await?;
                }
                let mut piece = ubuf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                if let Some(p) = paced.as_mut() {
                    // The rest stays in `ubuf`: the upstream is read once it is written.
                    piece = p.grant(piece).await;
                }
                left -= piece as u64;
                scanned(charge, &ubuf[..piece]);
                log.copy(&ubuf[..piece]);
                if left == 0 {
                    // The last bytes are counted as sent: the charge is made before them.
                    sent(charge, piece);
                    log.ended();
                    release(leases, charge).await;
                }
                write_all_vectored_within(
                    &mut c.io,
                    &mut [head, &ubuf[..piece]],
                    Some((timer, idle)),
                )
                .await
                .map_err(|_| Cut::Client)?;
                if left != 0 {
                    sent(charge, piece);
                }
                log.sent(piece);
                head = b"";
                ubuf.advance(piece);
                if left == 0 {
                    return Ok(true);
                }
            }
        }
        ResponseBody::Chunked | ResponseBody::Close => {
            // A cost read from a trailer: the trailer section is kept (bounded) for it.
            let mut decoder = if charge.as_ref().is_some_and(|c| c.reads_trailers()) {
                ChunkedDecoder::keeping_trailers()
            } else {
                ChunkedDecoder::default()
            };
            loop {
                let (data, consumed, ended) = if framing == ResponseBody::Chunked {
                    let r = decoder.decode(ubuf).map_err(|_| broken(head))?;
                    (r.data, r.consumed, decoder.is_done())
                } else {
                    ((0, ubuf.len()), ubuf.len(), false)
                };
                let (from, to) = data;
                if to > from {
                    scanned(charge, &ubuf[from..to]);
                    log.copy(&ubuf[from..to]);
                }
                // Paced: the chunk's data in the pieces granted, before the upstream is read.
                let to_client = (&mut head, &mut *charge, &mut *log);
                chunks(c, &ubuf[from..to], to_client, paced, (timer, idle)).await?;
                ubuf.advance(consumed);
                let eof = if ended {
                    true
                } else if consumed == 0 || ubuf.is_empty() {
                    read_or_cut(up, ubuf, c, head, framing, (timer, idle)).await?
                } else {
                    false
                };
                if eof {
                    if let Some(c) = charge.as_mut() {
                        c.trailer_fields(|| decoder.trailers());
                    }
                    log.ended();
                    release(leases, charge).await;
                    write_all_vectored_within(
                        &mut c.io,
                        &mut [head, b"0\r\n\r\n"],
                        Some((timer, idle)),
                    )
                    .await
                    .map_err(|_| Cut::Client)?;
                    return Ok(framing == ResponseBody::Chunked);
                }
            }
        }
    }
}

/// [`stream_response`] for a body compressed through `enc` (the client's framing is chunked):
/// each piece of the upstream's body is scanned for its cost as received (uncompressed), fed
/// to the encoder and flushed; what it gives is sent before the next upstream read, so an event
/// stream's event is never held. `unit = "bytes"` limits count the compressed bytes sent.
#[allow(clippy::too_many_arguments)]
async fn stream_compressed<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut ClientConn<T>,
    up: &mut UpStream,
    ubuf: &mut BytesMut,
    head: &[u8],
    framing: ResponseBody,
    enc: Box<Encoder>,
    (leases, charge, log): (
        &mut Option<Leases>,
        &mut Option<Box<BodyCharge>>,
        &mut Logged<'_>,
    ),
    (timer, idle, paced): (&mut Deadline, Duration, &mut Option<Paced>),
) -> Result<bool, Cut> {
    let mut head: &[u8] = head;
    let mut enc = Some(enc);
    let mut z: Vec<u8> = Vec::new();
    let mut left = match framing {
        ResponseBody::Length(n) => n,
        _ => 0,
    };
    let mut decoder = if charge.as_ref().is_some_and(|c| c.reads_trailers()) {
        ChunkedDecoder::keeping_trailers()
    } else {
        ChunkedDecoder::default()
    };
    loop {
        let ((from, to), consumed, ended) = match framing {
            ResponseBody::Length(_) => {
                let n = ubuf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                left -= n as u64;
                ((0, n), n, left == 0)
            }
            ResponseBody::Chunked => {
                let r = decoder.decode(ubuf).map_err(|_| broken(head))?;
                (r.data, r.consumed, decoder.is_done())
            }
            ResponseBody::Close => ((0, ubuf.len()), ubuf.len(), false),
            ResponseBody::None => ((0, 0), 0, true),
        };
        if to > from {
            scanned(charge, &ubuf[from..to]);
            log.copy(&ubuf[from..to]);
            if let Some(e) = enc.as_mut() {
                e.push(&ubuf[from..to], &mut z).map_err(|_| broken(head))?;
            }
        }
        ubuf.advance(consumed);
        let eof = if ended {
            true
        } else if consumed == 0 || ubuf.is_empty() {
            // What is compressed so far goes out before the upstream is waited for (paced: in
            // the pieces granted).
            let to_client = (&mut head, &mut *charge, &mut *log);
            chunks(c, &z, to_client, paced, (timer, idle)).await?;
            z.clear();
            read_or_cut(up, ubuf, c, head, framing, (timer, idle)).await?
        } else {
            false
        };
        if eof {
            if let Some(e) = enc.take() {
                e.finish(&mut z).map_err(|_| Cut::Upstream)?;
            }
            if let Some(c) = charge.as_mut() {
                c.trailer_fields(|| decoder.trailers());
            }
            // Paced: the encoder's last bytes in the pieces granted, then the end alone (the
            // client sees the body's end only with it).
            if paced.is_some() {
                let to_client = (&mut head, &mut *charge, &mut *log);
                chunks(c, &z, to_client, paced, (timer, idle)).await?;
                z.clear();
            }
            // The last bytes are counted as sent: the charge is made before them.
            sent(charge, z.len());
            log.ended();
            release(leases, charge).await;
            let mut ch = [0u8; 20];
            let ch: &[u8] = if z.is_empty() {
                b""
            } else {
                chunk_head(z.len(), &mut ch)
            };
            let crlf: &[u8] = if z.is_empty() { b"" } else { b"\r\n" };
            write_all_vectored_within(
                &mut c.io,
                &mut [head, ch, &z, crlf, b"0\r\n\r\n"],
                Some((timer, idle)),
            )
            .await
            .map_err(|_| Cut::Client)?;
            log.sent(z.len());
            return Ok(framing != ResponseBody::Close);
        }
    }
}

/// Writes `data` as chunks, after `head` (the response head while it is not sent yet, emptied
/// once written): one chunk when not `paced`, else one per piece granted (see
/// [`crate::http::pacing`]), each counted as sent once written.
async fn chunks<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut ClientConn<T>,
    mut data: &[u8],
    (head, charge, log): (&mut &[u8], &mut Option<Box<BodyCharge>>, &mut Logged<'_>),
    paced: &mut Option<Paced>,
    (timer, idle): (&mut Deadline, Duration),
) -> Result<(), Cut> {
    while !data.is_empty() {
        let mut piece = data.len();
        if let Some(p) = paced.as_mut() {
            piece = p.grant(piece).await;
        }
        let mut ch = [0u8; 20];
        let ch = chunk_head(piece, &mut ch);
        write_all_vectored_within(
            &mut c.io,
            &mut [head, ch, &data[..piece], b"\r\n"],
            Some((timer, idle)),
        )
        .await
        .map_err(|_| Cut::Client)?;
        sent(charge, piece);
        log.sent(piece);
        *head = b"";
        data = &data[piece..];
    }
    Ok(())
}

/// Reads more of the response ([`read_upstream`]): `Ok(true)` at the end of a close-delimited
/// body, `Ok(false)` when more arrived. A response cut short (the upstream's end before its
/// framing's, a failure, `idle` without a byte) is cut off ([`cut_off`], `head` still unsent).
async fn read_or_cut<T: AsyncRead + AsyncWrite + Unpin>(
    up: &mut UpStream,
    ubuf: &mut BytesMut,
    c: &mut ClientConn<T>,
    head: &[u8],
    framing: ResponseBody,
    (timer, idle): (&mut Deadline, Duration),
) -> Result<bool, Cut> {
    match read_upstream(up, ubuf, c, timer, idle).await {
        Ok(0) if framing == ResponseBody::Close => Ok(true),
        Ok(0) => Err(cut_off(c, head, Cut::Upstream, timer, idle).await),
        Err(cut) => Err(cut_off(c, head, cut, timer, idle).await),
        Ok(_) => Ok(false),
    }
}

/// The cut of an upstream that broke while `head` (the response head, emptied once sent) is
/// still unsent: [`Cut::Unsent`], answered 502; else [`Cut::Upstream`].
fn broken(head: &[u8]) -> Cut {
    if head.is_empty() {
        Cut::Upstream
    } else {
        Cut::Unsent
    }
}

/// A response cut before its end: an upstream that broke before the head was sent is
/// [`Cut::Unsent`] (answered 502, as nginx does when it has sent no head); after an idle
/// upstream the head still goes to a client that is there (unless it was sent already), whose
/// connection then closes short of the framing's end, so the client sees the answer was cut.
async fn cut_off<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut ClientConn<T>,
    head: &[u8],
    cut: Cut,
    timer: &mut Deadline,
    idle: Duration,
) -> Cut {
    if matches!(cut, Cut::Upstream) {
        return broken(head);
    }
    if !matches!(cut, Cut::Client) && !head.is_empty() {
        let _ = write_all_vectored_within(&mut c.io, &mut [head], Some((timer, idle))).await;
    }
    cut
}
