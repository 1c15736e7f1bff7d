//! The HTTP/3 front as a codec of the one life cycle ([`crate::pipeline::cycle`]): the request
//! head as h3 decoded it, its body the request stream's ([`super::body::RecvBody`]), sent with
//! the same sender as the hyper front's (`front::hyper::attempt::Sender`: the route's
//! `timeout`, `max_body_size`, `body_read_timeout`, a retry's body handed back), the upstream's
//! response head written as an HTTP/3 HEADERS frame and its body streamed as DATA frames
//! through the same [`UpstreamBody`] as the hyper front's (slots, charges, compression,
//! `limit_rate`, trailers), answers written as a head and one DATA frame. Nothing here decides
//! anything: limits, retries, answers and the record are the life cycle's.

use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Method, Response, StatusCode, Version};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::body::RecvBody;
use crate::access_log::Record;
use crate::front::hyper::attempt::{Client, Sender};
use crate::front::hyper::body::{BodyFault, PeekBody};
use crate::front::hyper::{strip_hop_by_hop, UpstreamBody, UpstreamClient};
use crate::pipeline::drive::{Relay, Rendered, ReplyHead};
use crate::pipeline::{BodyPrefix, Edits, Flavor, Leases, ProxyError, Trail};
use crate::routing::{Route, Target};
use crate::runtime::state::Shared;
use crate::upstream::attempts::{self, To};
use crate::upstream::Group;

/// The request stream's sending half.
pub type SendStream = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// One HTTP/3 request as the life cycle drives it.
pub(super) struct H3<'x> {
    pub(super) shared: &'x Shared,
    pub(super) client: &'x UpstreamClient<RecvBody>,
    pub(super) worker: usize,
    pub(super) refused: Option<&'static str>,
    pub(super) flavor: Flavor,
    pub(super) accept_encoding: smallvec::SmallVec<[HeaderValue; 1]>,
    /// The client's body until the request is prepared.
    pub(super) body: Option<PeekBody<'x, RecvBody>>,
    pub(super) body_timeout: Duration,
    pub(super) idle: Duration,
    pub(super) fault: BodyFault,
    pub(super) going: Option<Sender<'x, RecvBody>>,
    /// Where the response goes.
    pub(super) send: SendStream,
    /// The request is a HEAD (an answer's body is not sent).
    pub(super) head: bool,
    /// The request came in early data and is not idempotent: answered 425, before the
    /// pipeline (so never charged).
    pub(super) too_early: bool,
    /// The request's QUIC connection: when it closes (the client went away), a request
    /// waiting on its upstream stops waiting — its slots released, its upstream connection
    /// closed — as on the TCP fronts, which watch their connection.
    pub(super) quic: quinn::Connection,
    /// The front wrote `content-length: 0` into the head (the stream ended with it): removed
    /// before the request goes upstream.
    pub(super) said_empty: bool,
}

impl BodyPrefix for H3<'_> {
    fn read(
        &mut self,
        max: u64,
        max_body_size: u64,
    ) -> impl std::future::Future<Output = Result<crate::pipeline::Prefix<'_>, ProxyError>> + Send
    {
        self.body.read(max, max_body_size)
    }
}

impl<'x> crate::pipeline::cycle::Codec for H3<'x> {
    type Head = http::request::Parts;
    type Response<'s> = Response<Incoming>;
    type Reply<'s> = Reply;
    type Done = ();

    fn refused(&self) -> Option<ProxyError> {
        if self.too_early {
            return Some(ProxyError::TooEarly);
        }
        self.refused.map(ProxyError::BadRequest)
    }

    fn accept_encoding(&self) -> impl Iterator<Item = &str> {
        self.accept_encoding.iter().filter_map(|v| v.to_str().ok())
    }

    fn flavor(&self) -> Flavor {
        self.flavor
    }

    fn worker(&self) -> usize {
        self.worker
    }

    fn prepare(&mut self, mut parts: http::request::Parts, route: &Route, mut edits: Edits) {
        let Some(body) = self.body.take() else { return };
        let (body, prefix) = body.into_parts();
        if self.said_empty {
            parts.headers.remove(http::header::CONTENT_LENGTH);
        }
        // `:authority` is the `Host` of the HTTP/1.1 request sent upstream (RFC 9114 §4.3.1).
        if !parts.headers.contains_key(http::header::HOST) {
            if let Some(v) = parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                parts.headers.insert(http::header::HOST, v);
            }
        }
        let te_trailers = crate::front::hyper::accepts_trailers(&parts.headers);
        strip_hop_by_hop(&mut parts.headers);
        if te_trailers && matches!(&route.target, Target::Group(g) if g.connect.protocol.is_h2()) {
            parts
                .headers
                .insert(http::header::TE, HeaderValue::from_static("trailers"));
        }
        let pq = std::mem::take(&mut edits.path_and_query);
        edits.apply(&mut parts.headers);
        crate::front::hyper::join_cookie_crumbs(&mut parts.headers);
        parts.version = Version::HTTP_11;
        let client = match &route.target {
            Target::Group(_) => Client::Group(self.worker),
            _ => Client::Shared(self.client),
        };
        self.going = Some(Sender::new(
            client,
            route,
            parts,
            (body, prefix),
            pq,
            self.fault.clone(),
            self.body_timeout,
        ));
    }

    fn bodyless(&self) -> bool {
        self.going.as_ref().is_none_or(Sender::bodyless)
    }

    fn send<'s>(
        &mut self,
        route: &'s Route,
        group: &'s Group,
        to: To,
    ) -> impl std::future::Future<Output = Result<Response<Incoming>, attempts::Failed<ProxyError>>> + Send
    {
        Box::pin(async move {
            match self.going.as_mut() {
                Some(g) => tokio::select! {
                    r = g.send(route, group, to) => r,
                    _ = self.quic.closed() => Err(attempts::Failed::Client(None)),
                },
                None => Err(attempts::Failed::Client(Some(ProxyError::Upstream(
                    "the request was not prepared".to_owned(),
                )))),
            }
        })
    }

    fn status(response: &Response<Incoming>) -> StatusCode {
        response.status()
    }

    fn again(&mut self) -> bool {
        self.going.as_mut().is_some_and(Sender::again)
    }

    /// The client's connection is gone: nothing to answer.
    fn left(&mut self) -> Option<()> {
        self.quic.close_reason().is_some().then_some(())
    }

    fn reply(
        &mut self,
        response: Response<Incoming>,
        in_flight: Option<crate::upstream::InFlight>,
        _route: &Route,
    ) -> Reply {
        let (mut parts, body) = response.into_parts();
        if parts.headers.contains_key(http::header::TRANSFER_ENCODING) {
            parts.headers.remove(http::header::CONTENT_LENGTH);
        }
        // HTTP/3 has no connection-specific fields (RFC 9114 §4.2).
        strip_hop_by_hop(&mut parts.headers);
        crate::front::hyper::one_content_length(&mut parts.headers);
        Reply {
            length: http_body::Body::size_hint(&body).exact(),
            parts,
            body: Some(body),
            in_flight,
            request_bytes: self.fault.received(),
        }
    }

    async fn stream(&mut self, reply: &mut Reply, relay: &mut Relay, route: &Route) {
        let mut parts = std::mem::replace(&mut reply.parts, Response::new(()).into_parts().0);
        let mut log = Logged {
            record: relay.record.take(),
            shared: self.shared,
        };
        let Some(mut body) = reply.body.take() else {
            return;
        };
        let mut first = None;
        if relay.encoder.is_some() {
            parts.headers.remove(http::header::CONTENT_LENGTH);
            // As the hyper front: the head waits for the body's first frame, so a body broken
            // before it is answered 502.
            match tokio::time::timeout(self.idle, body.frame()).await {
                Ok(Some(Err(_))) => {
                    relay.record = log.record.take();
                    let rendered =
                        crate::pipeline::drive::broken_before_head(route, relay, self.flavor);
                    return self.answer(rendered, true).await;
                }
                Ok(Some(Ok(frame))) => first = Some(frame),
                Ok(None) | Err(_) => {}
            }
        }
        let grpc = Flavor::of_content_type(
            parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(HeaderValue::as_bytes),
        ) == Flavor::Grpc;
        let mut body = UpstreamBody::new(body, reply.in_flight.take())
            .starting_with(first)
            .trailers_of(&route.name, grpc)
            .holding(relay.leases.take())
            .charging(relay.charge.take().map(|c| *c))
            .filling(relay.fill.take())
            .compressing(relay.encoder.take().map(|e| *e))
            .pacing(relay.pace.take());
        date(&mut parts.headers);
        let head = Response::from_parts(parts, ());
        if self.send.send_response(head).await.is_err() {
            return;
        }
        loop {
            let next = tokio::select! {
                f = tokio::time::timeout(self.idle, body.frame()) => f,
                // The client went away while the upstream is silent: the body's drop charges
                // what it owes and releases the slots.
                _ = self.quic.closed() => return,
            };
            let frame = match next {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => break,
                // The upstream failed, went silent for `idle_timeout`, or sent trailers too
                // large: the client sees the stream reset, not a body that looks whole.
                Ok(Some(Err(_))) | Err(_) => {
                    self.send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                    return;
                }
            };
            let sent = match frame.into_data() {
                Ok(data) if data.is_empty() => Ok(()),
                Ok(data) => {
                    let n = data.len();
                    let sent = tokio::time::timeout(self.idle, self.send.send_data(data)).await;
                    log.sent(n);
                    match sent {
                        Ok(r) => r.map_err(|_| ()),
                        Err(_) => Err(()),
                    }
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(t) => {
                        let sent = self.send.send_trailers(t).await.map_err(|_| ());
                        if sent.is_ok() {
                            let _ = self.send.finish().await;
                        }
                        // The body's end (its slots released, its charge made) follows the
                        // trailers: polled once more.
                        let _ = tokio::time::timeout(self.idle, body.frame()).await;
                        return;
                    }
                    Err(_) => Ok(()),
                },
            };
            if sent.is_err() {
                // The client went away (or stopped reading): the body's drop charges what
                // it owes and releases the slots.
                self.send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
                return;
            }
        }
        let _ = self.send.finish().await;
    }

    async fn answer(&mut self, r: Rendered, _close: bool) {
        let Rendered {
            status,
            mut headers,
            body,
            record,
            ..
        } = r;
        let mut log = Logged {
            record,
            shared: self.shared,
        };
        let body: Vec<u8> = if self.head { Vec::new() } else { body };
        date(&mut headers);
        let mut head = Response::new(());
        *head.status_mut() = status;
        *head.headers_mut() = headers;
        if self.send.send_response(head).await.is_err() {
            return;
        }
        if !body.is_empty() {
            let n = body.len();
            if self.send.send_data(Bytes::from(body)).await.is_err() {
                return;
            }
            log.sent(n);
        }
        let _ = self.send.finish().await;
    }
}

/// A `Date` field, unless the upstream sent one (hyper's server adds it on the other fronts).
fn date(headers: &mut http::HeaderMap) {
    if !headers.contains_key(http::header::DATE) {
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(std::time::SystemTime::now()))
        {
            headers.insert(http::header::DATE, v);
        }
    }
}

/// The access-log record of a request, sent (with the bytes written) when dropped.
struct Logged<'a> {
    record: Option<Box<Record>>,
    shared: &'a Shared,
}

impl Logged<'_> {
    fn sent(&mut self, n: usize) {
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

/// The HTTP/3 front's response head for the driver: the upstream's header map, edited in
/// place. (No protocol upgrade: HTTP/3 has none.)
pub(super) struct Reply {
    parts: http::response::Parts,
    body: Option<Incoming>,
    in_flight: Option<crate::upstream::InFlight>,
    request_bytes: u64,
    length: Option<u64>,
}

impl ReplyHead for Reply {
    type Extras = http::HeaderMap;

    fn status(&self) -> StatusCode {
        self.parts.status
    }

    fn switch(&mut self, _: &mut Option<Leases>) -> Result<(), String> {
        if self.parts.status == StatusCode::SWITCHING_PROTOCOLS {
            return Err("switched protocols, which HTTP/3 cannot carry".to_owned());
        }
        Ok(())
    }

    fn map(&mut self) -> &mut http::HeaderMap {
        &mut self.parts.headers
    }

    fn charged(&mut self) {}

    fn extras(&mut self) -> &mut http::HeaderMap {
        &mut self.parts.headers
    }

    fn request_bytes(&self) -> u64 {
        self.request_bytes
    }

    fn respond(&mut self, trail: &Trail<'_>, request_id: &HeaderValue) {
        crate::pipeline::respond(trail, request_id, false, &mut self.parts.headers);
    }

    fn values<'s>(&'s self, name: &http::HeaderName) -> impl Iterator<Item = &'s str> + 's {
        self.parts
            .headers
            .get_all(name)
            .into_iter()
            .filter_map(|v| v.to_str().ok())
    }

    fn known_length(&self) -> Option<u64> {
        self.length
    }

    fn remove(&mut self, name: &http::HeaderName) {
        self.parts.headers.remove(name);
    }
}

/// Whether `method` is idempotent (RFC 9110 §9.2.2): what an early (0-RTT) request may be.
pub(super) fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}
