//! The request body as streamed to the upstream: never buffered, cut off above the route's
//! `max_body_size`, and abandoned when the client stops sending for `body_read_timeout`.
//!
//! When either limit trips, or the client's body is malformed (a bad chunk, a chunk size that
//! overflows) or cut off, the body yields an error, which makes the upstream client abort the
//! upstream request; the shared [`BodyFault`] tells the handler that the fault is the client's
//! and which status to answer (413/408/400), so it is never taken for an upstream failure.
//!
//! For a group's retries, a body that was never read can be given back: when the upstream
//! client drops it unread (a connect or TLS failure: nothing reached the server), its `Drop`
//! puts the client's stream into a [`BodySlot`] so the next attempt can send it.
//!
//! The route's `timeout` is the upstream's time, not the client's: [`BodyFault`] also follows
//! whom the transfer is waiting on — the client (its next bytes: `body_read_timeout`, 408) or
//! the upstream (to connect, to take the bytes handed to it, to answer once the body has
//! ended) — and [`BodyFault::upstream_timeout`] runs the route's `timeout` only over the
//! latter, so a slow but legal upload is never a 504 nor a failure of the server.
//!
//! On a route whose limits read the body ([`crate::pipeline::body`]), [`PeekBody`] reads its
//! first bytes before the limits (at most `max_json_bytes` and one frame more, with the same
//! `body_read_timeout` and `max_body_size`); the upstream then gets them first ([`Prefix`]),
//! then the rest of the stream, as received. The framing is kept: a body sent with a length
//! keeps its `Content-Length` (the head is forwarded with it); one sent without (chunked, or
//! HTTP/2 without a length) is sent chunked even when it was read whole.
//!
//! What [`PeekBody`]s hold while their requests are not yet decided counts in the per-connection
//! and per-worker bounds both fronts share ([`crate::front::pending`]).

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::front::pending::{Held, PendingBodies};
use crate::pipeline::{BodyPrefix, ProxyError};

/// What, if anything, cut the body off, and whom its transfer waits on.
#[derive(Debug, Default, Clone)]
pub struct BodyFault(Arc<FaultState>);

#[derive(Debug, Default)]
struct FaultState {
    fault: AtomicU8,
    waiting: std::sync::Mutex<Waiting>,
    /// Told when `waiting` changes between the client and the upstream.
    changed: tokio::sync::Notify,
    /// The body's bytes received from the client and handed on (the most any attempt sent).
    received: std::sync::atomic::AtomicU64,
}

/// Whom an attempt's transfer waits on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// No attempt yet.
    #[default]
    Nothing,
    /// The upstream, since then: to connect and take the head, to take the body's last frame,
    /// or (the body ended, or there was none) to answer.
    Upstream(Instant),
    /// The client's next bytes (bounded by `body_read_timeout`).
    Client,
}

impl BodyFault {
    const TOO_LARGE: u8 = 1;
    const TIMEOUT: u8 = 2;
    const CLIENT: u8 = 3;

    /// The request body's bytes received from the client and handed upstream so far.
    pub fn received(&self) -> u64 {
        self.0.received.load(Ordering::Acquire)
    }

    pub fn too_large(&self) -> bool {
        self.0.fault.load(Ordering::Acquire) == Self::TOO_LARGE
    }
    pub fn timed_out(&self) -> bool {
        self.0.fault.load(Ordering::Acquire) == Self::TIMEOUT
    }
    /// The client's body could not be read: malformed framing, or the client went away.
    pub fn client_failed(&self) -> bool {
        self.0.fault.load(Ordering::Acquire) == Self::CLIENT
    }
    fn set(&self, v: u8) {
        self.0.fault.store(v, Ordering::Release);
    }

    /// An attempt starts: the upstream's time runs (to connect, then to take what it is sent).
    pub fn begin_attempt(&self) {
        self.wait_on(Waiting::Upstream(Instant::now()));
    }

    fn wait_on(&self, w: Waiting) {
        let Ok(mut g) = self.0.waiting.lock() else {
            return;
        };
        let kind_changed = std::mem::discriminant(&*g) != std::mem::discriminant(&w);
        *g = w;
        drop(g);
        // From one piece the upstream took to the next, the watcher finds the later time when
        // it wakes: only a change of side wakes it.
        if kind_changed {
            self.0.changed.notify_waiters();
        }
    }

    fn waiting(&self) -> Waiting {
        self.0.waiting.lock().map_or(Waiting::Nothing, |g| *g)
    }

    /// Resolves once the upstream has kept the attempt waiting for `timeout` at a stretch —
    /// connecting and taking the head, taking a piece of the body, or answering once the
    /// request has been sent — never while the transfer waits on the client.
    pub async fn upstream_timeout(&self, timeout: Duration) {
        loop {
            let notified = self.0.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.waiting() {
                Waiting::Upstream(since) => {
                    let Some(at) = since.checked_add(timeout) else {
                        return std::future::pending().await;
                    };
                    if Instant::now() >= at {
                        return;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notified => {}
                    }
                }
                Waiting::Client | Waiting::Nothing => notified.await,
            }
        }
    }
}

/// Why the body stopped.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    #[error("no request body data for {0:?}")]
    Timeout(Duration),
    /// The client's stream failed (hyper's error, or an HTTP/3 stream's).
    #[error("{0}")]
    Client(BoxError),
}

/// A boxed error, as hyper's client takes a body's.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body as a front receives it: hyper's [`Incoming`] (HTTP/1 and HTTP/2),
/// or an HTTP/3 request stream's (`crate::front::h3`). What [`PeekBody`] and [`RequestBody`]
/// read and stream.
pub trait ClientBody: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static {}

impl<B: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static> ClientBody for B {}

/// Where an unread body is given back (see the module comment): the client's stream and what
/// was read of it before the limits.
pub type BodySlot<B = Incoming> = Arc<std::sync::Mutex<Option<(B, Option<Prefix>)>>>;

/// What was read of the client's body before the limits, sent upstream before the rest.
#[derive(Debug)]
pub struct Prefix {
    data: Bytes,
    trailers: Option<HeaderMap>,
    /// The client gave no length (chunked, or HTTP/2 without one): nor does the upstream get one.
    chunked: bool,
}

impl Prefix {
    /// The body's bytes read so far.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty() && self.trailers.is_none()
    }
}

/// The client's body, of which [`BodyPrefix::read`] reads the start before the limits.
pub struct PeekBody<'a, B = Incoming> {
    inner: B,
    buf: BytesMut,
    trailers: Option<HeaderMap>,
    ended: bool,
    chunked: bool,
    idle: Duration,
    /// The bytes of `buf` counted in the connection's and worker's pending bodies.
    held: Held<'a>,
}

impl<'a, B: ClientBody> PeekBody<'a, B> {
    /// Nothing read yet; `idle` is `body_read_timeout`; what is read counts in `pending`.
    pub fn new(inner: B, idle: Duration, pending: PendingBodies<'a>) -> PeekBody<'a, B> {
        PeekBody {
            chunked: inner.size_hint().exact().is_none(),
            ended: inner.is_end_stream(),
            inner,
            buf: BytesMut::new(),
            trailers: None,
            idle,
            held: Held::new(pending),
        }
    }

    /// The client's stream and what was read of it (`None`: nothing, or nothing that changes
    /// what the upstream is sent). The request is decided: what it held no longer counts.
    pub fn into_parts(self) -> (B, Option<Prefix>) {
        drop(self.held);
        let inner = self.inner;
        let prefix = Prefix {
            data: self.buf.freeze(),
            trailers: self.trailers,
            chunked: self.chunked,
        };
        // An empty body read whole: sent as it would have been unread, but for one without a
        // length, which stays chunked (an empty chunked body, not an unframed one).
        let keep = !prefix.is_empty() || (self.chunked && self.ended);
        (inner, keep.then_some(prefix))
    }
}

impl<B: ClientBody> BodyPrefix for PeekBody<'_, B> {
    async fn read(
        &mut self,
        max: u64,
        max_body_size: u64,
    ) -> Result<crate::pipeline::Prefix<'_>, ProxyError> {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let limit = usize::try_from(max_body_size).unwrap_or(usize::MAX);
        while !self.ended && self.buf.len() <= max {
            if self.inner.is_end_stream() {
                self.ended = true;
                break;
            }
            let frame = match tokio::time::timeout(self.idle, self.inner.frame()).await {
                Err(_) => return Err(ProxyError::BodyTimeout),
                Ok(None) => {
                    self.ended = true;
                    break;
                }
                Ok(Some(Err(_))) => return Err(ProxyError::BadBody),
                Ok(Some(Ok(f))) => f,
            };
            match frame.into_data() {
                Ok(d) => {
                    if self.buf.len().saturating_add(d.len()) > limit {
                        return Err(ProxyError::BodyTooLarge(max_body_size));
                    }
                    self.held.take(d.len())?;
                    self.buf.extend_from_slice(&d);
                }
                Err(f) => {
                    if let Ok(t) = f.into_trailers() {
                        self.trailers = Some(t);
                        self.ended = true;
                    }
                }
            }
        }
        Ok(crate::pipeline::Prefix {
            bytes: &self.buf,
            whole: self.ended,
        })
    }
}

/// The request body sent upstream.
pub struct RequestBody<B = Incoming> {
    /// `None`: an empty body (a retried request that had none).
    inner: Option<B>,
    remaining: u64,
    max: u64,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    fault: BodyFault,
    /// A frame was read: the body can no longer be sent again.
    started: bool,
    give_back: Option<BodySlot<B>>,
    /// Read before the limits: sent first.
    prefix: Option<Prefix>,
}

impl<B> RequestBody<B> {
    pub fn new(inner: B, max: u64, idle: Duration, fault: BodyFault) -> RequestBody<B> {
        RequestBody {
            inner: Some(inner),
            remaining: max,
            max,
            idle,
            timer: None,
            fault,
            started: false,
            give_back: None,
            prefix: None,
        }
    }

    /// The body with `prefix` (what was read of it before the limits) sent first; it counts
    /// against `max_body_size` like the rest.
    pub fn with_prefix(mut self, prefix: Option<Prefix>) -> RequestBody<B> {
        if let Some(p) = &prefix {
            self.remaining = self.max.saturating_sub(p.len() as u64);
        }
        self.prefix = prefix;
        self
    }

    /// An empty body.
    pub fn empty() -> RequestBody<B> {
        RequestBody {
            inner: None,
            remaining: 0,
            max: 0,
            idle: Duration::ZERO,
            timer: None,
            fault: BodyFault::default(),
            started: false,
            give_back: None,
            prefix: None,
        }
    }

    /// Gives the client's stream back into `slot` if dropped unread.
    pub fn give_back_into(mut self, slot: BodySlot<B>) -> RequestBody<B> {
        self.give_back = Some(slot);
        self
    }
}

impl<B> Drop for RequestBody<B> {
    fn drop(&mut self) {
        if self.started {
            return;
        }
        if let (Some(slot), Some(inner)) = (self.give_back.take(), self.inner.take()) {
            if let Ok(mut s) = slot.lock() {
                *s = Some((inner, self.prefix.take()));
            }
        }
    }
}

impl<B: ClientBody> Body for RequestBody<B> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = self.as_mut().poll_frame_inner(cx);
        // Whom the transfer waits on now: a frame handed on is the upstream's to take (and
        // after the last, its answer); a body with nothing ready waits on the client.
        match &polled {
            Poll::Pending => self.fault.wait_on(Waiting::Client),
            Poll::Ready(_) => self.fault.wait_on(Waiting::Upstream(Instant::now())),
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self
            .inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        let Some(p) = &self.prefix else {
            return rest;
        };
        let n = p.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(n));
        // A body without a length keeps none (hyper would send an exact one as Content-Length).
        if let (false, Some(upper)) = (p.chunked, rest.upper()) {
            hint.set_upper(upper.saturating_add(n));
        }
        hint
    }
}

impl<B: ClientBody> RequestBody<B> {
    fn poll_frame_inner(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(p) = this.prefix.as_mut() {
            if !p.data.is_empty() {
                this.started = true;
                this.fault
                    .0
                    .received
                    .fetch_max(this.max - this.remaining, Ordering::AcqRel);
                return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut p.data)))));
            }
            if let Some(t) = p.trailers.take() {
                this.started = true;
                return Poll::Ready(Some(Ok(Frame::trailers(t))));
            }
            this.prefix = None;
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.started = true;
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > this.remaining {
                        this.fault.set(BodyFault::TOO_LARGE);
                        return Poll::Ready(Some(Err(BodyError::TooLarge(this.max))));
                    }
                    this.remaining -= n;
                    // What this attempt's body has carried, its prefix included (a retry
                    // carries the same bytes again: the most, not the sum).
                    this.fault
                        .0
                        .received
                        .fetch_max(this.max - this.remaining, Ordering::AcqRel);
                }
                if let Some(t) = this.timer.as_mut() {
                    // No deadline past `Instant`'s range: the timer keeps its far-future one.
                    if let Some(at) = Instant::now().checked_add(this.idle) {
                        t.as_mut().reset(at);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.started = true;
                this.fault.set(BodyFault::CLIENT);
                Poll::Ready(Some(Err(BodyError::Client(e.into()))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let idle = this.idle;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if timer.as_mut().poll(cx).is_ready() {
                    this.fault.set(BodyFault::TIMEOUT);
                    return Poll::Ready(Some(Err(BodyError::Timeout(idle))));
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    // On the wall clock (the crate's tokio has no `test-util`), in tens of milliseconds: the
    // upstream's timeout never fires early, nor while the transfer waits on the client.
    #[tokio::test]
    async fn the_upstream_timeout_runs_only_while_waiting_on_the_upstream() {
        let f = BodyFault::default();
        f.begin_attempt();
        let t0 = Instant::now();
        f.upstream_timeout(40 * MS).await;
        assert!(Instant::now() >= t0 + 40 * MS);

        // Waiting on the client: no timeout, however long.
        f.wait_on(Waiting::Client);
        let waited = tokio::time::timeout(150 * MS, f.upstream_timeout(40 * MS)).await;
        assert!(waited.is_err(), "fired while waiting on the client");

        // The client's bytes handed on: the upstream's clock starts then, and a piece taken
        // later starts it again.
        let watcher = {
            let f = f.clone();
            tokio::spawn(async move {
                f.upstream_timeout(80 * MS).await;
                Instant::now()
            })
        };
        tokio::time::sleep(20 * MS).await;
        let t1 = Instant::now();
        f.wait_on(Waiting::Upstream(t1));
        tokio::time::sleep(50 * MS).await;
        let t2 = Instant::now();
        f.wait_on(Waiting::Upstream(t2));
        let fired = watcher.await.unwrap();
        assert!(
            fired >= t2 + 80 * MS,
            "fired {:?} after the last piece",
            fired - t2
        );
        assert!(fired < t2 + Duration::from_secs(5));
    }
}
