//! The parts of a request's life cycle past admission that every front shares: the one place
//! an upstream failure ([`crate::upstream::Failure`], typed on the upstream side) becomes the
//! gateway's answer (502 or 504, problem+json), and the one way a gateway's own answer is made
//! ready to write ([`answer`]: the failure log, the rendering, the route's response phase, the
//! exchange's record, the request id), and the one sequence from the upstream's response head
//! to the response a front streams ([`relay`]: the head relayable, the response charged, the
//! rate-limit headers, the slots handed over, the route's response rules, the record, the
//! request id), over the small [`ReplyHead`] each front implements for its own head.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use super::answer::{Answer, Flavor, ProxyError};
use super::body_charge::BodyCharge;
use super::passed::Passed;
use super::record::{Exchange, Trail};
use super::settle::{Leases, WorkerCtx};
use crate::access_log::Record;
use crate::compression::{self, Encoder, Offer, ResponseView};
use crate::http::fields::FieldSink;
use crate::metrics::RouteHandles;
use crate::routing::Route;
use crate::runtime::state::{Shared, Snapshot};
use crate::upstream::{Failure, Stop};

/// A front's upstream response head, as the driver ([`relay`]) reads and edits it. Each front
/// keeps its head in its own form (the hyper front a `HeaderMap`, the fast front the bytes as
/// received with an overlay): static dispatch, nothing boxed.
pub trait ReplyHead {
    /// Where the fields the gateway adds go (rate-limit headers, the request id).
    type Extras: FieldSink;
    /// The upstream's status.
    fn status(&self) -> StatusCode;
    /// A `101 Switching Protocols` switched (the tunnel takes the request's slots), or why it
    /// cannot be (`Err`: no upgrade to switch to, answered 502). Upgrades are front-specific.
    fn switch(&mut self, leases: &mut Option<Leases>) -> Result<(), String>;
    /// The head as a header map, for the limits charged after the response, which read it and
    /// strip the cost headers they read (a front may build it only then).
    fn map(&mut self) -> &mut HeaderMap;
    /// The limits charged after the response read [`ReplyHead::map`]: what they stripped is
    /// not relayed.
    fn charged(&mut self);
    /// The fields the gateway adds.
    fn extras(&mut self) -> &mut Self::Extras;
    /// The request body's bytes sent upstream so far (what `unit = "bytes"` limits with
    /// `bytes = "request"` or `"both"` count).
    fn request_bytes(&self) -> u64;
    /// The route's CORS and response header rules, on this head.
    fn respond(&mut self, trail: &Trail<'_>, request_id: &HeaderValue);
    /// The upstream's values of `name` that are text (read by the compression decision only).
    fn values<'s>(&'s self, name: &HeaderName) -> impl Iterator<Item = &'s str> + 's;
    /// The body's length, when the framing says it.
    fn known_length(&self) -> Option<u64>;
    /// Removes the field `name` from the response as the client gets it: the upstream's lines
    /// of it, a response rule's and the gateway's own.
    fn remove(&mut self, name: &HeaderName);
}

/// What the front streams the response with: the body's charge (`cost_from`), the slots
/// released at the body's end, and the access-log record sent once the body is written.
pub struct Relay {
    /// Boxed, as the encoder: a few hundred bytes each that most responses do not use, and a
    /// `Relay` is moved (measured: `memcpy` per request).
    pub charge: Option<Box<BodyCharge>>,
    /// The charge of the response's head, applied by a task (a remote store): waited for
    /// before the response is written, so that the next request sees it ([`Relay::charged`]).
    pub charging: Option<tokio::task::JoinHandle<()>>,
    /// The body is compressed through this (the head says so already: `Content-Encoding`
    /// set; the front drops `Content-Length` and frames the body itself).
    pub encoder: Option<Box<Encoder>>,
    pub leases: Option<Leases>,
    pub record: Option<Box<Record>>,
    /// `limit_rate`: the body paced (the caller's plan's, else the route's).
    pub pace: Option<crate::http::pacing::Pace>,
    /// The request's id and the field it goes in, for the 502 of a body broken before the
    /// head was sent ([`broken_before_head`]).
    pub request_id: (HeaderName, HeaderValue),
    /// The cache's copy of the body (`[routes.cache]`, a storable response): fed the
    /// upstream's bytes as they pass (before compression), ended when the body ends in full;
    /// dropped (nothing stored) when it is cut.
    pub fill: Option<Box<crate::cache::Fill>>,
}

/// The one sequence from an upstream's response head to the response a front streams, for
/// every front: the head relayable (else 502, counted among the route's upstream errors, and
/// `exchange` handed back for the answer), what the response costs charged (check before,
/// charge after), the rate-limit headers, the slots taken for the body's end, the route's
/// response rules, compression (`offer`: the route compresses and the request is no HEAD), the
/// exchange recorded with the upstream's status, the request id, and the body's pace
/// (`limit_rate`: the caller's plan's, else the route's).
#[allow(clippy::too_many_arguments, clippy::result_large_err)]
pub fn relay<'a, R: ReplyHead>(
    shared: &Shared,
    snap: &Snapshot,
    ctx: &WorkerCtx,
    logging: bool,
    route: &Route,
    passed: &mut Passed<'_>,
    trail: &mut Trail<'_>,
    mut exchange: Exchange<'a>,
    reply: &mut R,
    offer: Option<Offer<'_>>,
) -> Result<Relay, (ProxyError, Exchange<'a>)> {
    if let Err(detail) = reply.switch(&mut passed.leases) {
        return Err((unrelayable(&route.metrics, detail), exchange));
    }
    let status = reply.status();
    let (mut charge, mut charging) = (None, None);
    if passed.charges_after() {
        let request_bytes = reply.request_bytes();
        (charge, charging) =
            passed.charge_response(&snap.store, ctx, status, reply.map(), request_bytes);
        reply.charged();
    }
    passed.write_headers(route, reply.extras());
    let leases = passed.leases.take();
    exchange.status = status;
    let request_id = exchange.request_id;
    reply.respond(trail, request_id);
    let encoder = match offer {
        Some(offer) => compress(reply, &offer, status, ctx),
        None => None,
    };
    let pace = trail.plan_rate.unwrap_or(route.limit_rate);
    let record = std::mem::take(trail).finish(shared, logging, exchange);
    reply
        .extras()
        .set(&snap.config.server.request_id_header, request_id.as_bytes());
    Ok(Relay {
        fill: None,
        pace,
        encoder: encoder.map(Box::new),
        charge: charge.map(Box::new),
        charging,
        leases,
        record,
        request_id: (
            snap.config.server.request_id_header.clone(),
            request_id.clone(),
        ),
    })
}

impl Relay {
    /// Waits for the head's charge, when a task applies it (nothing to wait for in process).
    pub async fn charged(&mut self) {
        if let Some(task) = self.charging.take() {
            let _ = task.await;
        }
    }
}

/// The answer to a response whose upstream body broke (a chunk that does not parse, the
/// upstream gone) before any of it reached the client, its head not sent either (a front holds
/// the head until the body's first bytes: the fast HTTP/1 front always, every front for a
/// compressed body): 502, as nginx answers when it has sent no head. Counted among the route's
/// upstream errors; the exchange's record (`relay`'s, made with the upstream's status) says 502.
pub fn broken_before_head(route: &Route, relay: &mut Relay, flavor: Flavor) -> Rendered {
    let e = unrelayable(
        &route.metrics,
        "the response body broke before its first byte".to_owned(),
    );
    let (id_header, request_id) = &relay.request_id;
    let (status, mut headers, body) = Answer::from(e).parts_for(request_id, flavor);
    headers.insert(id_header, request_id.clone());
    let record = relay.record.take().map(|mut r| {
        r.status = status.as_u16();
        r
    });
    Rendered {
        status,
        headers,
        body: body.into_bytes(),
        closes: true,
        record,
    }
}

/// The compression phase of an upstream's response (see [`crate::compression::head`]): the
/// encoder when the body is to be compressed, with the head edited for it.
/// A worker already running [`compression::MAX_ENCODERS_PER_WORKER`] encoders sends the
/// response as identity (still varying: the next may be compressed).
fn compress<R: ReplyHead>(
    reply: &mut R,
    offer: &Offer<'_>,
    status: StatusCode,
    ctx: &WorkerCtx,
) -> Option<Encoder> {
    use http::header::{
        ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_RANGE, CONTENT_TYPE, ETAG, VARY,
    };
    let (coding, vary, etag) = {
        let first = |n: &HeaderName| reply.values(n).next();
        let view = ResponseView {
            head_request: false,
            status: status.as_u16(),
            encoded: compression::encoded(reply.values(&CONTENT_ENCODING)),
            no_transform: compression::no_transform(reply.values(&CACHE_CONTROL)),
            content_range: first(&CONTENT_RANGE).is_some(),
            content_type: first(&CONTENT_TYPE),
            content_length: reply.known_length(),
            upgrade: false,
        };
        let coding = compression::decide(offer, &view)?;
        let vary = compression::with_vary(reply.values(&VARY));
        let etag = coding.and_then(|_| first(&ETAG).and_then(compression::weak_etag));
        (coding, vary, etag)
    };
    let encoder = coding.and_then(|c| Encoder::streaming(c, offer.config.level, ctx.encoders()));
    let x = reply.extras();
    if let Some(v) = vary {
        x.set(&VARY, v.as_bytes());
    }
    if let Some(e) = &encoder {
        x.set(&CONTENT_ENCODING, e.coding().token().as_bytes());
        if let Some(t) = etag {
            x.set(&ETAG, t.as_bytes());
        }
        // Ranges of the encoded body are not offered (a range the upstream would serve is of
        // the identity bytes): as nginx's gzip filter, the field goes.
        reply.remove(&ACCEPT_RANGES);
    }
    encoder
}

/// A gateway's own answer, ready for a front to write.
pub struct Rendered {
    /// The status on the wire (200 for a gRPC client's answer; the exchange was recorded with
    /// the status the answer means).
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Compressed when the route compresses and the client accepts it.
    pub body: Vec<u8>,
    /// The connection must close after it (a framing or body error).
    pub closes: bool,
    /// The access-log record (when the log is on), sent once the body is written.
    pub record: Option<Box<Record>>,
}

/// Makes `answer` ready to write, for every front: a server error logged (one throttle),
/// rendered in the client's `flavor`, the route's CORS and response header rules applied (on
/// the gateway's own answers too), compressed as the route's upstream responses are
/// (`accept_encoding`: the request's values, read only on a route that compresses), the
/// exchange recorded with the status the answer means, and the request id set in `id_header`.
#[allow(clippy::too_many_arguments)]
pub fn answer<'v>(
    shared: &Shared,
    logging: bool,
    answer: Answer,
    flavor: Flavor,
    trail: Trail<'_>,
    mut exchange: Exchange<'_>,
    id_header: &HeaderName,
    accept_encoding: impl IntoIterator<Item = &'v str>,
) -> Rendered {
    let e = &answer.error;
    answer.log_failed(trail.route.map(|r| &*r.name), exchange.request_id);
    let closes = e.closes_connection();
    exchange.status = e.status();
    let request_id = exchange.request_id.clone();
    let (status, mut headers, body) = answer.parts_for(&request_id, flavor);
    super::respond(&trail, &request_id, true, &mut headers);
    let head_request = exchange.method == http::Method::HEAD;
    let offer = Offer::of(
        trail.route.and_then(|r| r.compression.as_deref()),
        head_request,
        accept_encoding,
    );
    let body = match offer {
        Some(offer) => compress_body(&offer, status, &mut headers, body.as_bytes()),
        None => body.into_bytes(),
    };
    let record = trail.finish(shared, logging, exchange);
    headers.insert(id_header, request_id);
    Rendered {
        status,
        headers,
        body,
        closes,
        record,
    }
}

/// The field RFC 9211 reports a cache's handling of the request in.
pub static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// A stored response answering a request is charged as its relay would have been: the limits
/// charged after the response (`count_status`, `cost_header`, `cost_from` read from the stored
/// body, `unit = "bytes"`) charged on the stored status, fields and body. The fields as the
/// client gets them (the cost headers the limits strip, stripped) when any was charged.
pub async fn charge_hit(
    snap: &Snapshot,
    ctx: &WorkerCtx,
    passed: &Passed<'_>,
    hit: &crate::cache::Hit,
) -> Option<HeaderMap> {
    if !passed.charges_after() {
        return None;
    }
    let e = &*hit.entry;
    let mut headers = e.headers.clone();
    let (charge, charging) = passed.charge_response(&snap.store, ctx, e.status, &mut headers, 0);
    if let Some(task) = charging {
        let _ = task.await;
    }
    if let Some(mut charge) = charge {
        charge.data(&e.body);
        charge.sent(e.body.len());
        charge.end();
        std::future::poll_fn(|cx| charge.poll_charged(cx)).await;
    }
    Some(headers)
}

/// A stored response answering a request (the cache's hit, or a response freshened by a
/// `304`), ready for a front to write as an answer, for every front: its status, fields and
/// body (none and `304` when the request's own conditions hold for it) with `Age` and
/// `Cache-Status`, the rate-limit headers of the limits it passed, the route's response rules,
/// compression as the route's responses have it, the exchange recorded with its status, and
/// the request id. `headers`: its fields as [`charge_hit`] left them (`None`: as stored).
#[allow(clippy::too_many_arguments)]
pub fn cached<'v>(
    shared: &Shared,
    logging: bool,
    hit: crate::cache::Hit,
    headers: Option<HeaderMap>,
    passed: &Passed<'_>,
    route: &Route,
    trail: Trail<'_>,
    mut exchange: Exchange<'_>,
    id_header: &HeaderName,
    accept_encoding: impl IntoIterator<Item = &'v str>,
) -> Rendered {
    let e = &*hit.entry;
    let mut headers = headers.unwrap_or_else(|| e.headers.clone());
    headers.insert(http::header::AGE, HeaderValue::from(hit.age));
    if let Ok(v) = HeaderValue::from_str(&hit.cache_status) {
        headers.insert(CACHE_STATUS.clone(), v);
    }
    passed.write_headers(route, &mut headers);
    let request_id = exchange.request_id.clone();
    super::respond(&trail, &request_id, false, &mut headers);
    let (status, body) = if hit.not_modified {
        headers.remove(http::header::CONTENT_ENCODING);
        (StatusCode::NOT_MODIFIED, Vec::new())
    } else {
        let head_request = exchange.method == http::Method::HEAD;
        let offer = Offer::of(route.compression.as_deref(), head_request, accept_encoding)
            .filter(|_| !headers.contains_key(http::header::CONTENT_ENCODING));
        let body = match offer {
            Some(offer) => compress_body(&offer, e.status, &mut headers, &e.body),
            None => e.body.to_vec(),
        };
        (e.status, body)
    };
    exchange.status = status;
    let record = trail.finish(shared, logging, exchange);
    headers.insert(id_header, request_id);
    Rendered {
        status,
        headers,
        body,
        closes: false,
        record,
    }
}

/// A limit's refusal with nothing of the route's to add to it, ready for a front to write
/// (see [`Codec::refuse`](super::cycle::Codec::refuse)): what [`answer`] would render, kept as
/// plain data — the refusal, its RateLimit fields, the request id — so that a front can write
/// its head and body straight into a buffer of its own, with nothing allocated per refusal.
pub struct Refusal<'a> {
    /// A [`ProxyError::Limited`].
    pub error: ProxyError,
    pub rate: Option<crate::limiter::RateFields>,
    pub request_id: &'a HeaderValue,
    pub id_header: &'a HeaderName,
    /// The access-log record (when the log is on), sent once the body is written.
    pub record: Option<Box<Record>>,
}

impl Refusal<'_> {
    /// The same answer through the generic path ([`answer`]'s rendering): for a front that
    /// writes answers only from a [`Rendered`], and the reference the fast front's writing is
    /// tested against.
    pub fn rendered(self) -> Rendered {
        let Refusal {
            error,
            rate,
            request_id,
            id_header,
            record,
        } = self;
        let closes = error.closes_connection();
        let answer = Answer {
            error,
            headers: HeaderMap::new(),
            rate,
        };
        let (status, mut headers, body) = answer.parts(request_id);
        headers.insert(id_header, request_id.clone());
        Rendered {
            status,
            headers,
            body: body.into_bytes(),
            closes,
            record,
        }
    }
}

/// The names a [`Refusal`]'s head is written with: a request id header of one of these names
/// takes the generic path (where the `HeaderMap` merges them).
static REFUSAL_FIELDS: [&HeaderName; 4] = [
    &http::header::CONTENT_TYPE,
    &http::header::RETRY_AFTER,
    &http::header::CONTENT_LENGTH,
    &http::header::DATE,
];

/// Whether `answer` is a refusal [`refusal`] makes ready: a limit's refusal, to a client that
/// takes problem+json, on a route with no response rules, CORS or compression to apply to it
/// (those take [`answer`]'s way), the request id in a field of its own.
pub fn is_plain_refusal(
    answer: &Answer,
    flavor: Flavor,
    trail: &Trail<'_>,
    id_header: &HeaderName,
) -> bool {
    matches!(answer.error, ProxyError::Limited { .. })
        && flavor == Flavor::Problem
        && answer.headers.is_empty()
        && trail
            .route
            .is_none_or(|r| r.compression.is_none() && !r.fronting.touches_responses())
        && *id_header != http::header::CONNECTION
        && !crate::limiter::RateFields::writes(id_header)
        && !REFUSAL_FIELDS.iter().any(|n| **n == *id_header)
}

/// Makes a plain refusal ([`is_plain_refusal`]) ready to write, as [`answer`] does any answer:
/// a server error (a 503 refusal) logged, the exchange recorded with the refusal's status.
pub fn refusal<'a>(
    shared: &Shared,
    logging: bool,
    answer: Answer,
    trail: Trail<'_>,
    mut exchange: Exchange<'a>,
    id_header: &'a HeaderName,
) -> Refusal<'a> {
    answer.log_failed(trail.route.map(|r| &*r.name), exchange.request_id);
    exchange.status = answer.error.status();
    let request_id = exchange.request_id;
    let record = trail.finish(shared, logging, exchange);
    Refusal {
        error: answer.error,
        rate: answer.rate,
        request_id,
        id_header,
        record,
    }
}

/// The compression phase of a gateway's own answer (or a stored response): the whole body
/// compressed at once.
fn compress_body(
    offer: &Offer<'_>,
    status: StatusCode,
    headers: &mut HeaderMap,
    body: &[u8],
) -> Vec<u8> {
    use http::header::{CONTENT_ENCODING, CONTENT_TYPE, VARY};
    let first = |n| headers.get(n).and_then(|v: &HeaderValue| v.to_str().ok());
    let view = ResponseView {
        status: status.as_u16(),
        content_type: first(CONTENT_TYPE),
        content_length: u64::try_from(body.len()).ok(),
        ..ResponseView::default()
    };
    let Some(coding) = compression::decide(offer, &view) else {
        return body.to_vec();
    };
    let vary = compression::with_vary(headers.get_all(VARY).iter().filter_map(|v| v.to_str().ok()));
    if let Some(v) = vary.and_then(|v| HeaderValue::from_str(&v).ok()) {
        headers.insert(VARY, v);
    }
    let Some(c) = coding else {
        return body.to_vec();
    };
    match Encoder::whole(c, offer.config.level, body) {
        Ok(z) => {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static(c.token()));
            headers.remove(http::header::CONTENT_LENGTH);
            z
        }
        Err(_) => body.to_vec(),
    }
}

impl From<Failure> for ProxyError {
    fn from(f: Failure) -> ProxyError {
        match f {
            Failure::Connect => ProxyError::UpstreamConnect,
            Failure::Tls(detail) => ProxyError::UpstreamTls(detail),
            Failure::Timeout(after) => ProxyError::UpstreamTimeout(after),
            Failure::Protocol(detail) => ProxyError::Upstream(detail),
            Failure::NoLive => ProxyError::NoLiveUpstream,
        }
    }
}

/// The answer to attempts that ended without a response: the upstream's failure, or the
/// client's (`None`: the client left, nothing to answer).
pub fn stopped(stop: Stop<ProxyError>) -> Option<ProxyError> {
    match stop {
        Stop::Upstream(f) => Some(f.into()),
        Stop::Client(e) => e,
    }
}

/// A response head that is no answer to relay (a status over 599, a `101` without an upgrade
/// to switch to): counted among the route's other upstream errors, answered 502.
pub fn unrelayable(metrics: &RouteHandles, detail: String) -> ProxyError {
    let f = Failure::Protocol(detail);
    f.count(metrics);
    f.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use std::time::Duration;

    #[test]
    fn upstream_failures_are_502_or_504_with_todays_details() {
        let cases = [
            (Failure::Connect, 502, "cannot connect to the upstream"),
            (
                Failure::Tls("invalid peer certificate: UnknownIssuer".into()),
                502,
                "TLS with the upstream failed: invalid peer certificate: UnknownIssuer",
            ),
            (
                Failure::Timeout(Duration::from_millis(300)),
                504,
                "the upstream did not answer within 300ms",
            ),
            (
                Failure::Protocol("connection closed before message completed".into()),
                502,
                "the upstream failed: connection closed before message completed",
            ),
            (Failure::NoLive, 502, "no live upstream"),
        ];
        for (f, status, detail) in cases {
            assert_eq!(f.to_string(), detail);
            let e = ProxyError::from(f);
            assert_eq!(e.status(), StatusCode::from_u16(status).unwrap());
            assert_eq!(e.to_string(), detail);
        }
        assert!(stopped(Stop::Client(None)).is_none());
    }
}
