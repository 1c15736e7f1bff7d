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

/// Where an unread body is given back (see the module comment).
pub type BodySlot = Arc<std::sync::Mutex<Option<Incoming>>>;

/// The request body sent upstream.
pub struct RequestBody {
    /// `None`: an empty body (a retried request that had none).
    inner: Option<Incoming>,
    remaining: u64,
    max: u64,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    fault: BodyFault,
    /// A frame was read: the body can no longer be sent again.
    started: bool,
    give_back: Option<BodySlot>,
}

impl RequestBody {
    pub fn new(inner: Incoming, max: u64, idle: Duration, fault: BodyFault) -> RequestBody {
        RequestBody {
            inner: Some(inner),
            remaining: max,
            max,
            idle,
            timer: None,
            fault,
            started: false,
            give_back: None,
        }
    }

    /// An empty body.
    pub fn empty() -> RequestBody {
        RequestBody {
            inner: None,
            remaining: 0,
            max: 0,
            idle: Duration::ZERO,
            timer: None,
            fault: BodyFault::default(),
            started: false,
            give_back: None,
        }
    }

    /// Gives the client's stream back into `slot` if dropped unread.
    pub fn give_back_into(mut self, slot: BodySlot) -> RequestBody {
        self.give_back = Some(slot);
        self
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if self.started {
            return;
        }
        if let (Some(slot), Some(inner)) = (self.give_back.take(), self.inner.take()) {
            if let Ok(mut s) = slot.lock() {
                *s = Some(inner);
            }
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
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
