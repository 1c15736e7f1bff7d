//! An HTTP/3 request's body as the life cycle reads it: the request stream's DATA frames and
//! trailers as an [`http_body::Body`], so that the hyper front's reader (`PeekBody`, the body
//! read before the limits) and sender (`RequestBody`: `max_body_size`, `body_read_timeout`, the
//! retry's give-back) take it as they take hyper's own.
//!
//! HTTP/3 frames a body by the stream's end, and a `content-length` the client sends must
//! match it (RFC 9114 §4.1.2): a body longer or shorter than it is malformed, and ends with an
//! error here, so the upstream (which gets the length in the head) is never sent more or less
//! than the head says.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

/// The request stream's receiving half.
pub type RecvStream = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// Why a request body stopped.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error(transparent)]
    Stream(#[from] h3::error::StreamError),
    #[error("the request body does not match its content-length")]
    Length,
    #[error("the request stream failed")]
    Broken,
}

/// A request stream's body.
pub struct RecvBody {
    stream: RecvStream,
    /// Data read ahead (the first poll, to learn whether there is a body at all).
    first: Option<Bytes>,
    /// Trailers read ahead (a body of trailers only), handed on next.
    trailers: Option<http::HeaderMap>,
    /// The stream failed while read ahead: the next poll says so.
    broken: bool,
    /// The DATA frames are over (trailers, or the end, come next).
    data_done: bool,
    done: bool,
    /// What `content-length` says is still to come (`None`: no length given).
    remaining: Option<u64>,
}

impl RecvBody {
    /// The body of a request whose head said `length` (its `content-length`).
    pub fn new(stream: RecvStream, length: Option<u64>) -> RecvBody {
        RecvBody {
            stream,
            first: None,
            trailers: None,
            broken: false,
            data_done: false,
            done: false,
            remaining: length,
        }
    }

    /// Finds out, without waiting, whether the body has ended already (a request whose FIN came
    /// with its head: most GETs): such a body is sent upstream as none, not as an empty chunked
    /// one.
    pub fn peek(&mut self, cx: &mut Context<'_>) {
        if self.done || self.data_done || self.first.is_some() {
            return;
        }
        match self.stream.poll_recv_data(cx) {
            Poll::Ready(Ok(Some(mut buf))) => {
                self.first = Some(buf.copy_to_bytes(buf.remaining()));
            }
            Poll::Ready(Ok(None)) => self.data_done = true,
            Poll::Ready(Err(_)) => self.broken = true,
            Poll::Pending => {}
        }
        if self.data_done && self.remaining.is_none_or(|r| r == 0) {
            // No data: the end, or trailers (kept for the next poll), may be known already.
            match self.stream.poll_recv_trailers(cx) {
                Poll::Ready(Ok(None)) => self.done = true,
                Poll::Ready(Ok(Some(t))) => self.trailers = Some(t),
                Poll::Ready(Err(_)) => self.broken = true,
                Poll::Pending => {}
            }
        }
    }

    /// Whether [`RecvBody::peek`] has learnt how the body starts: its first data, its end, its
    /// trailers, or a failure.
    pub fn settled(&self) -> bool {
        self.first.is_some()
            || self.done
            || self.broken
            || self.trailers.is_some()
            || (self.data_done && self.remaining.is_some_and(|r| r != 0))
    }

    /// Waits until the body is [`settled`](RecvBody::settled) (a request whose stream ends
    /// just after its head: an HTTP/3 client may send the FIN in a later packet than the
    /// HEADERS frame, as hyperium's h3 client does).
    pub async fn settle(&mut self) {
        std::future::poll_fn(|cx| {
            self.peek(cx);
            if self.settled() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    fn data(&mut self, data: Bytes) -> Result<Frame<Bytes>, RecvError> {
        if let Some(r) = self.remaining.as_mut() {
            *r = r.checked_sub(data.len() as u64).ok_or(RecvError::Length)?;
        }
        Ok(Frame::data(data))
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = RecvError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RecvError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.broken {
            this.done = true;
            return Poll::Ready(Some(Err(RecvError::Broken)));
        }
        if let Some(first) = this.first.take() {
            let frame = this.data(first);
            if frame.is_err() {
                this.done = true;
            }
            return Poll::Ready(Some(frame));
        }
        if !this.data_done {
            match std::task::ready!(this.stream.poll_recv_data(cx)) {
                Ok(Some(mut buf)) => {
                    let frame = this.data(buf.copy_to_bytes(buf.remaining()));
                    if frame.is_err() {
                        this.done = true;
                    }
                    return Poll::Ready(Some(frame));
                }
                Ok(None) => this.data_done = true,
                Err(e) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
        if this.remaining.is_some_and(|r| r != 0) {
            this.done = true;
            return Poll::Ready(Some(Err(RecvError::Length)));
        }
        if let Some(t) = this.trailers.take() {
            this.done = true;
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        let trailers = std::task::ready!(this.stream.poll_recv_trailers(cx));
        this.done = true;
        match trailers {
            Ok(Some(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        // An ended body is an empty one (as hyper's): not sent upstream as an empty chunked
        // body, and a request without one may go to another server.
        if self.done && self.first.is_none() && self.trailers.is_none() {
            return SizeHint::with_exact(0);
        }
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
