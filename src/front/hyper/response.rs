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
//!
//! A compressed response's frames go through its [`Encoder`] after the cost scan (which reads
//! the body as the upstream sent it), each flushed as it passes (an event stream's event is
//! never held), the encoder's last bytes one data frame before the trailers or the end;
//! `unit = "bytes"` limits count the compressed bytes.
//!
//! A response under `limit_rate` ([`crate::http::pacing`]) hands its data frames on in the pieces its
//! pacer grants, sleeping on tokio's timer between them; the next frame is asked of the
//! upstream only once the last piece of this one is handed on, so the upstream is read no
//! faster than the client is written (one frame held at most). The pace applies to the bytes
//! the client gets (compressed, when compressed).
//!
//! Trailers are passed on up to [`MAX_TRAILER_BYTES`]. Larger ones are never passed, nor dropped
//! silently (a gRPC call would end as if OK without its server's status): they end a gRPC
//! response with `grpc-status` 13 (INTERNAL), any other with an error (the client sees the
//! response cut off), and are counted in `tollgate_upstream_trailers_too_large_total`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::compression::Encoder;
use crate::http::pacing::{Pace, Paced};
use crate::pipeline::{BodyCharge, Leases};
use crate::upstream::InFlight;

/// The largest trailer section passed on, counted as HTTP/2 counts a header list (each field's
/// name and value and 32 bytes): the same 64 KiB as the default `max_header_bytes` of a request
/// head. (HTTP/2 upstream connections take header lists up to
/// [`crate::upstream::connect::UPSTREAM_HEADER_LIST_BYTES`], so that larger trailers arrive
/// whole and are refused here rather than cut short by the HTTP/2 library.)
pub const MAX_TRAILER_BYTES: usize = 64 * 1024;

/// Why a response body was ended by the gateway.
#[derive(Debug, thiserror::Error)]
pub enum ResponseBodyError {
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
    #[error("the upstream's trailers are larger than {MAX_TRAILER_BYTES} bytes")]
    TrailersTooLarge,
    #[error("the response could not be compressed")]
    Encoder,
}

/// A trailer section's size as HTTP/2 counts it (RFC 9113 §6.5.2).
fn trailers_size(trailers: &http::HeaderMap) -> usize {
    trailers.iter().fold(0usize, |n, (name, value)| {
        n.saturating_add(name.as_str().len())
            .saturating_add(value.len())
            .saturating_add(32)
    })
}

/// What ends a gRPC call whose trailers were too large: INTERNAL, saying why.
fn grpc_trailers_refused() -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert(
        crate::pipeline::GRPC_STATUS.clone(),
        http::HeaderValue::from_static("13"),
    );
    h.insert(
        crate::pipeline::GRPC_MESSAGE.clone(),
        http::HeaderValue::from_static(
            "the upstream's trailers are larger than the gateway passes (64 KiB)",
        ),
    );
    h
}

/// An upstream response body.
pub struct UpstreamBody {
    inner: Incoming,
    _in_flight: Option<InFlight>,
    /// Concurrency slots, released before the last frame or when dropped.
    leases: Option<Leases>,
    /// The charge of limits whose cost is read from this body, made when it ends.
    charge: Option<BodyCharge>,
    /// The cache's copy of this body, stored when it ends in full.
    fill: Option<Box<crate::cache::Fill>>,
    /// The last frame (`Some(None)`: the end), held while the slots are released.
    last: Option<Option<Result<Frame<Bytes>, ResponseBodyError>>>,
    /// The route, for the count of trailers refused.
    route: Option<Arc<str>>,
    /// The response is a gRPC one: trailers refused become `grpc-status` 13.
    grpc: bool,
    /// The body is compressed through this (`None` once finished).
    encoder: Option<Encoder>,
    /// What follows the encoder's last bytes (the trailers or the end), sent next.
    after: Option<Option<Result<Frame<Bytes>, ResponseBodyError>>>,
    /// `limit_rate`: the body paced (boxed: a response without one carries a pointer).
    paced: Option<Box<Pacing>>,
    /// The body's first frame, read before the head was handed on (a compressed body's: see
    /// [`UpstreamBody::starting_with`]); passed on first.
    first: Option<Frame<Bytes>>,
}

/// A paced body's state: its pacer, its timer, and the rest of the data frame being sent.
struct Pacing {
    paced: Paced,
    sleep: Pin<Box<tokio::time::Sleep>>,
    pending: Bytes,
}

impl UpstreamBody {
    pub fn new(inner: Incoming, in_flight: Option<InFlight>) -> UpstreamBody {
        UpstreamBody {
            inner,
            _in_flight: in_flight,
            leases: None,
            charge: None,
            fill: None,
            last: None,
            route: None,
            grpc: false,
            encoder: None,
            after: None,
            paced: None,
            first: None,
        }
    }

    /// The body's first frame, read already (the head waited for it): passed on before the
    /// rest of `inner`.
    pub fn starting_with(mut self, first: Option<Frame<Bytes>>) -> UpstreamBody {
        self.first = first;
        self
    }

    /// Paces the body at `pace` (`limit_rate`), from now.
    pub fn pacing(mut self, pace: Option<Pace>) -> UpstreamBody {
        self.paced = pace.map(|p| {
            Box::new(Pacing {
                paced: Paced::new(p),
                sleep: Box::pin(tokio::time::sleep(std::time::Duration::ZERO)),
                pending: Bytes::new(),
            })
        });
        self
    }

    /// The next frame, in the pieces `pacing` grants (see the module comment).
    fn poll_paced(
        &mut self,
        pacing: &mut Pacing,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        loop {
            if pacing.pending.is_empty() {
                match std::task::ready!(self.poll_unpaced(cx)) {
                    Some(Ok(frame)) if frame.is_data() => match frame.into_data() {
                        Ok(data) if data.is_empty() => {
                            return Poll::Ready(Some(Ok(Frame::data(data))))
                        }
                        Ok(data) => pacing.pending = data,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                    other => return Poll::Ready(other),
                }
            }
            match pacing.paced.take(pacing.pending.len()) {
                Ok(n) => return Poll::Ready(Some(Ok(Frame::data(pacing.pending.split_to(n))))),
                Err(Some(at)) => {
                    pacing.sleep.as_mut().reset(at);
                    std::task::ready!(pacing.sleep.as_mut().poll(cx));
                }
                // Past what the clock can say: never in practice; the body waits for ever.
                Err(None) => return Poll::Pending,
            }
        }
    }

    /// Compresses the body through `encoder`.
    pub fn compressing(mut self, encoder: Option<Encoder>) -> UpstreamBody {
        self.encoder = encoder;
        self
    }

    /// `polled` through the encoder: a data frame compressed (`None`: it gave nothing yet,
    /// poll again), the end or the trailers preceded by the encoder's last bytes.
    fn encode(
        &mut self,
        polled: Option<Result<Frame<Bytes>, ResponseBodyError>>,
    ) -> Option<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        let Some(enc) = self.encoder.as_mut() else {
            return Some(polled);
        };
        let mut out = Vec::new();
        let ended = match &polled {
            Some(Ok(frame)) => match frame.data_ref() {
                Some(data) => {
                    if enc.push(data, &mut out).is_err() {
                        return Some(Some(Err(ResponseBodyError::Encoder)));
                    }
                    self.inner.is_end_stream()
                }
                None => true,
            },
            None => true,
            Some(Err(_)) => return Some(polled),
        };
        let data_frame = polled
            .as_ref()
            .is_some_and(|f| matches!(f, Ok(f) if f.is_data()));
        if ended {
            if let Some(enc) = self.encoder.take() {
                if enc.finish(&mut out).is_err() {
                    return Some(Some(Err(ResponseBodyError::Encoder)));
                }
            }
            if !data_frame {
                self.after = Some(polled);
            }
        }
        if out.is_empty() && !ended {
            return None;
        }
        Some(Some(Ok(Frame::data(Bytes::from(out)))))
    }

    /// Trailers over [`MAX_TRAILER_BYTES`] are counted for `route`; `grpc`: the response is a
    /// gRPC one (they end it with `grpc-status` 13 rather than an error).
    pub fn trailers_of(mut self, route: &Arc<str>, grpc: bool) -> UpstreamBody {
        self.route = Some(route.clone());
        self.grpc = grpc;
        self
    }

    /// Refuses trailers over the bound (see the module comment).
    fn check_trailers(
        &self,
        polled: Option<Result<Frame<Bytes>, hyper::Error>>,
    ) -> Option<Result<Frame<Bytes>, ResponseBodyError>> {
        let frame = match polled? {
            Ok(f) => f,
            Err(e) => return Some(Err(e.into())),
        };
        if frame
            .trailers_ref()
            .is_none_or(|t| trailers_size(t) <= MAX_TRAILER_BYTES)
        {
            return Some(Ok(frame));
        }
        if let Some(route) = &self.route {
            metrics::counter!(crate::metrics::UPSTREAM_TRAILERS_TOO_LARGE, "route" => route.to_string())
                .increment(1);
        }
        static LOGGED: tollgate_limit::log_throttle::Throttles<1> =
            tollgate_limit::log_throttle::Throttles::new();
        if let Some(suppressed) = LOGGED.allow(0) {
            tracing::warn!(
                route = self.route.as_deref(),
                limit = MAX_TRAILER_BYTES,
                suppressed,
                "upstream trailers too large; response ended with an error"
            );
        }
        Some(if self.grpc {
            Ok(Frame::trailers(grpc_trailers_refused()))
        } else {
            Err(ResponseBodyError::TrailersTooLarge)
        })
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

    /// Copies the body into the cache (`fill`), stored when the body ends in full.
    pub fn filling(mut self, fill: Option<Box<crate::cache::Fill>>) -> UpstreamBody {
        self.fill = fill;
        self
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ResponseBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        let this = &mut *self;
        match this.paced.take() {
            None => this.poll_unpaced(cx),
            Some(mut pacing) => {
                let polled = this.poll_paced(&mut pacing, cx);
                this.paced = Some(pacing);
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Slots still held, a charge still to make, an encoder still to finish or a paced
        // frame's rest still to send: the end is still to come (see the module comment).
        self.first.is_none()
            && self.leases.is_none()
            && self.charge.is_none()
            && self.encoder.is_none()
            && self.after.is_none()
            && self.paced.as_ref().is_none_or(|p| p.pending.is_empty())
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.encoder.is_some() || self.after.is_some() {
            return SizeHint::default();
        }
        match &self.paced {
            Some(p) if !p.pending.is_empty() => {
                let pending = p.pending.len() as u64;
                let inner = self.inner.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(pending));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(pending));
                }
                hint
            }
            _ => self.inner.size_hint(),
        }
    }
}

impl UpstreamBody {
    /// The next frame as the upstream's body, its charge, slots and encoder make it (see the
    /// module comment), before any pacing.
    fn poll_unpaced(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
        let this = self;
        loop {
            if this.last.is_none() {
                if let Some(after) = this.after.take() {
                    return Poll::Ready(after);
                }
            }
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
            let polled = match this.first.take() {
                Some(frame) => Some(Ok(frame)),
                None => std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)),
            };
            let polled = this.check_trailers(polled);
            if let Some(fill) = this.fill.as_mut() {
                match &polled {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            fill.data(data);
                        }
                        if this.inner.is_end_stream() {
                            fill.end();
                            this.fill = None;
                        }
                    }
                    None => {
                        fill.end();
                        this.fill = None;
                    }
                    // Broken: nothing stored.
                    Some(Err(_)) => this.fill = None,
                }
            }
            if let (Some(charge), Some(Ok(frame))) = (this.charge.as_mut(), &polled) {
                if let Some(data) = frame.data_ref() {
                    charge.data(data);
                } else if let Some(trailers) = frame.trailers_ref() {
                    charge.trailers(trailers);
                }
            }
            let compressing = this.encoder.is_some();
            let Some(polled) = this.encode(polled) else {
                continue;
            };
            if let (Some(charge), Some(Ok(frame))) = (this.charge.as_mut(), &polled) {
                if let Some(data) = frame.data_ref() {
                    charge.sent(data.len());
                }
            }
            if this.leases.is_none() && this.charge.is_none() {
                return Poll::Ready(polled);
            }
            let last = match &polled {
                // The encoder's last bytes before the trailers: those follow at once.
                Some(Ok(_)) if compressing && this.encoder.is_none() => true,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_are_measured_as_http2_measures_a_header_list() {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert_eq!(trailers_size(&t), "grpc-status".len() + 1 + 32);
        let refused = grpc_trailers_refused();
        assert_eq!(refused["grpc-status"], "13");
        assert!(trailers_size(&refused) < MAX_TRAILER_BYTES);
    }
}
