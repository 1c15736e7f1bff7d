//! The upstream's response body as streamed to the client, holding the request's place in its
//! server's in-flight count (`least_requests`) until the body is sent or dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::charge::Leases;
use crate::upstream::InFlight;

/// An upstream response body.
pub struct UpstreamBody {
    inner: Incoming,
    _in_flight: Option<InFlight>,
    /// Concurrency slots, released when the body is sent or dropped.
    _leases: Option<Leases>,
}

impl UpstreamBody {
    pub fn new(inner: Incoming, in_flight: Option<InFlight>) -> UpstreamBody {
        UpstreamBody {
            inner,
            _in_flight: in_flight,
            _leases: None,
        }
    }

    /// Holds `leases` until the body is sent in full or dropped (the client went away).
    pub fn holding(mut self, leases: Option<Leases>) -> UpstreamBody {
        self._leases = leases;
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
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
