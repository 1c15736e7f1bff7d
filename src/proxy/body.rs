//! The request body as streamed to the upstream: never buffered, cut off above the route's
//! `max_body_size`, and abandoned when the client stops sending for `body_read_timeout`.
//!
//! When either limit trips, or the client's body is malformed (a bad chunk, a chunk size that
//! overflows) or cut off, the body yields an error, which makes the upstream client abort the
//! upstream request; the shared [`BodyFault`] tells the handler that the fault is the client's
//! and which status to answer (413/408/400), so it is never taken for an upstream failure.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

/// What, if anything, cut the body off.
#[derive(Debug, Default, Clone)]
pub struct BodyFault(Arc<AtomicU8>);

impl BodyFault {
    const TOO_LARGE: u8 = 1;
    const TIMEOUT: u8 = 2;
    const CLIENT: u8 = 3;

    pub fn too_large(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::TOO_LARGE
    }
    pub fn timed_out(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::TIMEOUT
    }
    /// The client's body could not be read: malformed framing, or the client went away.
    pub fn client_failed(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::CLIENT
    }
    fn set(&self, v: u8) {
        self.0.store(v, Ordering::Release);
    }
}

/// Why the body stopped.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    #[error("no request body data for {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Client(#[from] hyper::Error),
}

/// The request body sent upstream.
pub struct RequestBody {
    inner: Incoming,
    remaining: u64,
    max: u64,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    fault: BodyFault,
}

impl RequestBody {
    pub fn new(inner: Incoming, max: u64, idle: Duration, fault: BodyFault) -> RequestBody {
        RequestBody {
            inner,
            remaining: max,
            max,
            idle,
            timer: None,
            fault,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > this.remaining {
                        this.fault.set(BodyFault::TOO_LARGE);
                        return Poll::Ready(Some(Err(BodyError::TooLarge(this.max))));
                    }
                    this.remaining -= n;
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
                this.fault.set(BodyFault::CLIENT);
                Poll::Ready(Some(Err(BodyError::Client(e))))
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

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
