//! The upstream's response body as streamed to the client, holding the request's place in its
//! server's in-flight count (`least_requests`) until the body is sent or dropped.
//!
//! It also holds the request's concurrency slots: they are released before the body's last
//! frame (or its end) is handed on, and that frame waits for the release, so a client that sends
//! its next request as soon as it has the whole answer never finds its own slot still taken.
//! A body dropped early (the client went away) releases them in `Leases`'s `Drop`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::pipeline::Leases;
use crate::upstream::InFlight;

/// An upstream response body.
pub struct UpstreamBody {
    inner: Incoming,
    _in_flight: Option<InFlight>,
    /// Concurrency slots, released before the last frame or when dropped.
    leases: Option<Leases>,
    /// The last frame (`Some(None)`: the end), held while the slots are released.
    last: Option<Option<Result<Frame<Bytes>, hyper::Error>>>,
}

impl UpstreamBody {
    pub fn new(inner: Incoming, in_flight: Option<InFlight>) -> UpstreamBody {
        UpstreamBody {
            inner,
            _in_flight: in_flight,
            leases: None,
            last: None,
        }
    }

    /// Holds `leases` until the body is sent in full or dropped (the client went away).
    pub fn holding(mut self, leases: Option<Leases>) -> UpstreamBody {
        self.leases = leases;
        self
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        loop {
            if let (Some(leases), Some(_)) = (this.leases.as_mut(), this.last.as_ref()) {
                std::task::ready!(leases.poll_released(cx));
                this.leases = None;
                return Poll::Ready(this.last.take().flatten());
            }
            let polled = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
            let Some(leases) = this.leases.as_mut() else {
                return Poll::Ready(polled);
            };
            let last = match &polled {
                Some(Ok(_)) => this.inner.is_end_stream(),
                None | Some(Err(_)) => true,
            };
            if !last {
                return Poll::Ready(polled);
            }
            leases.release();
            this.last = Some(polled);
        }
    }

    fn is_end_stream(&self) -> bool {
        // Slots still held: the end is still to come (see the module comment).
        self.leases.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
