//! The upstream's response body as streamed to the client, holding the request's place in its
//! server's in-flight count (`least_requests`) until the body is sent or dropped.
//!
//! It also holds the request's concurrency slots: they are released before the body's last
//! frame (or its end) is handed on, and that frame waits for the release, so a client that sends
//! its next request as soon as it has the whole answer never finds its own slot still taken.
//! A body dropped early (the client went away) releases them in `Leases`'s `Drop`.
//!
//! The charge of limits whose cost is in the body (`cost_from`, a [`BodyCharge`]) follows the
//! same way: every frame passes through its scan as it goes to the client, and the last frame
//! waits for the charge made at the end; a body dropped early is charged by its `Drop`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::pipeline::{BodyCharge, Leases};
use crate::upstream::InFlight;

/// An upstream response body.
pub struct UpstreamBody {
    inner: Incoming,
    _in_flight: Option<InFlight>,
    /// Concurrency slots, released before the last frame or when dropped.
    leases: Option<Leases>,
    /// The charge of limits whose cost is read from this body, made when it ends.
    charge: Option<BodyCharge>,
    /// The last frame (`Some(None)`: the end), held while the slots are released.
    last: Option<Option<Result<Frame<Bytes>, hyper::Error>>>,
}

impl UpstreamBody {
    pub fn new(inner: Incoming, in_flight: Option<InFlight>) -> UpstreamBody {
        UpstreamBody {
            inner,
            _in_flight: in_flight,
            leases: None,
            charge: None,
            last: None,
        }
    }

    /// Holds `leases` until the body is sent in full or dropped (the client went away).
    pub fn holding(mut self, leases: Option<Leases>) -> UpstreamBody {
        self.leases = leases;
        self
    }

    /// Scans the body for `charge` and charges it when the body ends (or is dropped).
    pub fn charging(mut self, charge: Option<BodyCharge>) -> UpstreamBody {
        self.charge = charge;
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
            if this.last.is_some() {
                if let Some(leases) = this.leases.as_mut() {
                    std::task::ready!(leases.poll_released(cx));
                    this.leases = None;
                }
                if let Some(charge) = this.charge.as_mut() {
                    std::task::ready!(charge.poll_charged(cx));
                    this.charge = None;
                }
                return Poll::Ready(this.last.take().flatten());
            }
            let polled = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
            if let (Some(charge), Some(Ok(frame))) = (this.charge.as_mut(), &polled) {
                if let Some(data) = frame.data_ref() {
                    charge.data(data);
                } else if let Some(trailers) = frame.trailers_ref() {
                    charge.trailers(trailers);
                }
            }
            if this.leases.is_none() && this.charge.is_none() {
                return Poll::Ready(polled);
            }
            let last = match &polled {
                Some(Ok(_)) => this.inner.is_end_stream(),
                None | Some(Err(_)) => true,
            };
            if !last {
                return Poll::Ready(polled);
            }
            if let Some(leases) = this.leases.as_mut() {
                leases.release();
            }
            if let Some(charge) = this.charge.as_mut() {
                charge.end();
            }
            this.last = Some(polled);
        }
    }

    fn is_end_stream(&self) -> bool {
        // Slots still held or a charge still to make: the end is still to come (see the module
        // comment).
        self.leases.is_none() && self.charge.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
