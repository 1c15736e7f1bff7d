//! The hyper front: one request through the gateway. Framing the connection found, then the
//! request pipeline ([`crate::pipeline::admit`]) decides; an admitted request's head gets the
//! pipeline's edits and goes upstream, its response streamed back (or, for an accepted protocol
//! upgrade, a tunnel); an answer is rendered here.

use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use super::attempt::{Client, Sender};
use super::headers::{drop_underscored, strip_hop_by_hop};
use super::{upgrade, ResBody, UpstreamBody, UpstreamClient};
use crate::access_log::Record;
use crate::compression::Offer;
use crate::front::hyper::body::{BodyFault, PeekBody, PendingBodies};
use crate::front::server::ConnInfo;
use crate::pipeline::drive;
use crate::pipeline::{
    admit, Admitted, Answer, Exchange, Flavor, Leases, Peer, ProxyError, Trail, WorkerCtx,
};
use crate::routing::Target;
use crate::state::{Shared, Snapshot};
use crate::upstream::attempts::{self, Plan};

/// Answers one request on the proxy listener, with this worker's upstream client and settle
/// tracking. Returns the response and, when the access log is on, the request's record (sent
/// when its body ends).
pub async fn handle(
    shared: &Shared,
    client: &UpstreamClient,
    worker: usize,
    ctx: &WorkerCtx,
    pending: &std::sync::atomic::AtomicUsize,
    conn: ConnInfo,
    req: Request<Incoming>,
) -> (Response<ResBody>, Option<Box<Record>>) {
    let started = Instant::now();
    let request = conn.state.begin_request();
    let snap = shared.snapshot.load_full();
    let logging = snap.config.log.access.is_on();
    let id_header = &snap.config.server.request_id_header;
    let request_id = crate::request_id::of(req.headers(), id_header, started);
    let method = req.method().clone();
    let flavor = Flavor::of_content_type(
        req.headers()
            .get(http::header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes),
    );
    // Read by the compression phase only on a route that compresses (one value kept inline:
    // no allocation).
    let accept_encoding: smallvec::SmallVec<[HeaderValue; 1]> = req
        .headers()
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .cloned()
        .collect();
    let accepted = || accept_encoding.iter().filter_map(|v| v.to_str().ok());
    let mut trail = Trail::default();
    let exchange = Exchange {
        started,
        method,
        request_id: &request_id,
        peer: conn.peer.ip(),
        status: StatusCode::OK,
    };
    let result = if request.conflicting_framing() {
        if logging {
            trail.path = req.uri().path().to_owned();
        }
        Err((
            Answer::from(ProxyError::BadFraming(
                "a request may not carry both Content-Length and Transfer-Encoding",
            )),
            exchange,
        ))
    } else if exchange.method == Method::CONNECT && req.version() <= Version::HTTP_11 {
        // The connection's framing scanner stops following at a CONNECT (what follows a granted
        // one is not HTTP), so the connection must not serve another request after it.
        Err((
            Answer::from(ProxyError::BadFraming("CONNECT is not supported")),
            exchange,
        ))
    } else {
        match forward(
            client,
            (worker, pending),
            ctx,
            &snap,
            &conn,
            req,
            &request_id,
            &mut trail,
        )
        .await
        {
            Err(answer) => Err((answer, exchange)),
            Ok(sent) => {
                relay(
                    shared,
                    &snap,
                    ctx,
                    logging,
                    &conn,
                    sent,
                    &mut trail,
                    exchange,
                    accepted(),
                )
                .await
            }
        }
    };
    match result {
        Ok(relayed) => relayed,
        Err((answer, exchange)) => {
            let r = drive::answer(
                shared,
                logging,
                answer,
                flavor,
                trail,
                exchange,
                id_header,
                accepted(),
            );
            if r.closes {
                conn.state.linger_on_close();
            }
            let mut res = Response::new(ResBody::Right(Full::new(Bytes::from(r.body))));
            *res.status_mut() = r.status;
            *res.headers_mut() = r.headers;
            (res, r.record)
        }
    }
}

/// What the upstream answered an admitted request: its response head and body, the request's
/// in-flight slot, what passed, and the upgrades of both sides (a `101` to switch).
struct Sent<'s> {
    route: &'s crate::routing::Route,
    passed: crate::pipeline::Passed<'s>,
    parts: http::response::Parts,
    body: Incoming,
    in_flight: Option<crate::upstream::InFlight>,
    upgrade: Option<HeaderValue>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    switched_to: Option<HeaderValue>,
    /// The request body's bytes sent upstream when the head arrived.
    request_bytes: u64,
}

/// The hyper front's response head for the driver ([`drive::relay`]): the upstream's header
/// map, edited in place; a `101` switched to a tunnel between the two upgrades.
struct Reply<'a> {
    parts: &'a mut http::response::Parts,
    upgrade: Option<HeaderValue>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    switched_to: Option<HeaderValue>,
    conn: &'a ConnInfo,
    idle: std::time::Duration,
    route: &'a crate::routing::Route,
    request_bytes: u64,
    /// The body's length (`None`: unknown).
    length: Option<u64>,
}

impl drive::ReplyHead for Reply<'_> {
    type Extras = http::HeaderMap;

    fn status(&self) -> StatusCode {
        self.parts.status
    }

    fn switch(&mut self, leases: &mut Option<Leases>) -> Result<(), String> {
        if self.parts.status != StatusCode::SWITCHING_PROTOCOLS {
            return Ok(());
        }
        let upstream = self.parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        match (
            self.upgrade.take(),
            self.client_upgrade.take(),
            upstream,
            self.switched_to.take(),
        ) {
            (Some(_), Some(client), Some(upstream), Some(proto)) => {
                self.conn.state.set_upgraded();
                upgrade::restore_headers(&mut self.parts.headers, proto);
                upgrade::tunnel(
                    client,
                    upstream,
                    self.conn.state.clone(),
                    self.idle,
                    self.route.name.clone(),
                    leases.take(),
                );
                Ok(())
            }
            _ => Err("switched protocols without an upgrade to switch to".to_owned()),
        }
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
}

/// The upstream's answer through the driver ([`drive::relay`]), then its body streamed holding
/// the in-flight slot, the request's slots and the body's charge.
#[allow(clippy::too_many_arguments)]
async fn relay<'a, 'v>(
    shared: &Shared,
    snap: &Snapshot,
    ctx: &WorkerCtx,
    logging: bool,
    conn: &ConnInfo,
    sent: Sent<'_>,
    trail: &mut Trail<'_>,
    exchange: Exchange<'a>,
    accept_encoding: impl IntoIterator<Item = &'v str>,
) -> Result<(Response<ResBody>, Option<Box<Record>>), (Answer, Exchange<'a>)> {
    let Sent {
        route,
        mut passed,
        mut parts,
        body,
        in_flight,
        upgrade,
        client_upgrade,
        switched_to,
        request_bytes,
    } = sent;
    let offer = route
        .compression
        .as_deref()
        .and_then(|c| Offer::of(Some(c), exchange.method == Method::HEAD, accept_encoding));
    let length = http_body::Body::size_hint(&body).exact();
    let mut reply = Reply {
        length,
        parts: &mut parts,
        upgrade,
        client_upgrade,
        switched_to,
        conn,
        idle: snap.config.server.idle_timeout,
        route,
        request_bytes,
    };
    let relay = drive::relay(
        shared,
        snap,
        ctx,
        logging,
        route,
        &mut passed,
        trail,
        exchange,
        &mut reply,
        offer,
    )
    .await
    .map_err(|(e, exchange)| (Answer::from(e), exchange))?;
    if relay.encoder.is_some() {
        // The compressed body's length is known only at its end.
        parts.headers.remove(http::header::CONTENT_LENGTH);
    }
    let grpc = Flavor::of_content_type(
        parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes),
    ) == Flavor::Grpc;
    let response = Response::from_parts(
        parts,
        Either::Left(
            UpstreamBody::new(body, in_flight)
                .trailers_of(&route.name, grpc)
                .holding(relay.leases)
                .charging(relay.charge)
                .compressing(relay.encoder)
                .pacing(relay.pace),
        ),
    );
    Ok((response, relay.record))
}

/// Joins an HTTP/2 request's cookie crumbs (one `cookie` field per cookie, RFC 9113 §8.2.3)
/// into the one `Cookie` line an HTTP/1.1 upstream expects, with "; ".
fn join_cookie_crumbs(headers: &mut http::HeaderMap) {
    let mut crumbs = headers.get_all(http::header::COOKIE).iter();
    if crumbs.next().is_none() || crumbs.next().is_none() {
        return;
    }
    let mut joined = Vec::new();
    for v in headers.get_all(http::header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    // Each crumb was a valid value: so is their join.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(http::header::COOKIE, v);
    }
}

/// Whether the request's `TE` lists `trailers`.
fn accepts_trailers(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
}

#[allow(clippy::too_many_arguments)]
async fn forward<'s>(
    client: &UpstreamClient,
    (worker, pending): (usize, &std::sync::atomic::AtomicUsize),
    ctx: &WorkerCtx,
    snap: &'s Snapshot,
    conn: &ConnInfo,
    req: Request<Incoming>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
) -> Result<Sent<'s>, Answer> {
    let server = &snap.config.server;
    let (mut parts, body) = req.into_parts();
    // Names with `_` are never seen (nor forwarded): see `drop_underscored`.
    drop_underscored(&mut parts.headers);
    // Read before the limits only on a route whose limits look into it.
    let pending = PendingBodies {
        connection: &conn.state.pending_bodies,
        worker: pending,
    };
    let mut body = PeekBody::new(body, server.body_read_timeout, pending);
    let peer = Peer {
        ip: conn.peer.ip(),
        ip_value: &conn.peer_ip,
        tls: conn.tls,
        client_cert: conn.client_cert.as_deref(),
    };
    let Admitted {
        route,
        passed,
        mut edits,
        client: client_ip,
    } = admit(snap, ctx, &parts, &mut body, &peer, request_id, trail, None).await?;
    let (body, prefix) = body.into_parts();

    // An upgrade request keeps its `Upgrade`; the client side's switch is taken from the request.
    let upgrade_proto = upgrade::requested(&parts);
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let te_trailers = accepts_trailers(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    // `TE: trailers` is the one TE HTTP/2 allows, and gRPC servers may insist on it: kept for
    // an HTTP/2 group when the client sent it (as Envoy does).
    if te_trailers && matches!(&route.target, Target::Group(g) if g.connect.protocol.is_h2()) {
        parts
            .headers
            .insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(proto) = &upgrade_proto {
        upgrade::restore_headers(&mut parts.headers, proto.clone());
    }
    let pq = std::mem::take(&mut edits.path_and_query);
    edits.apply(&mut parts.headers);
    if parts.version >= Version::HTTP_2 {
        join_cookie_crumbs(&mut parts.headers);
    }
    parts.version = Version::HTTP_11;
    let fault = BodyFault::default();
    // From here the upstream may do the work: a client that leaves before its head is charged.
    let abandoned = passed.arm_abandoned(&snap.store, ctx);
    let (client, group) = match &route.target {
        Target::Url { single, .. } => (Client::Shared(client), &**single),
        Target::Group(group) => (Client::Group(worker), &**group),
        // Answered by the pipeline (`admit`): never reaches a front.
        Target::Redirect(_) => {
            return Err(ProxyError::Upstream("a redirect route has no upstream".to_owned()).into())
        }
    };
    let mut sender = Sender::new(
        (client, group),
        route,
        parts,
        (body, prefix),
        pq,
        &fault,
        server.body_read_timeout,
    );
    let method = sender.method().clone();
    let plan = Plan {
        group,
        worker,
        metrics: &route.metrics,
        method: &method,
        bodyless: sender.bodyless(),
        client: client_ip,
    };
    // Boxed: the attempts' future is large, and would otherwise be part of every request's
    // future (see `Proxy::call`).
    let sent = Box::pin(attempts::run(plan, &mut sender, trail.for_attempts())).await;
    // The upstream's head arrived, or the exchange failed (never charged): the client's
    // leaving is no longer what ends it.
    if let Some(a) = abandoned {
        a.disarm();
    }
    let (response, in_flight) = sent.map_err(|stop| {
        crate::pipeline::drive::stopped(stop)
            .unwrap_or(ProxyError::Upstream("the client went away".to_owned()))
    })?;
    let (mut rparts, rbody) = response.into_parts();
    // An intermediary answers in its own version (RFC 9110 §2.5): an HTTP/1.0 upstream must not
    // turn the client's answer into an HTTP/1.0 one, which would also end its keep-alive. (hyper
    // still answers an HTTP/1.0 client in HTTP/1.0.)
    rparts.version = Version::HTTP_11;
    // A response framed by its chunks is not also framed by a `Content-Length` it carries
    // (RFC 9112 §6.3: Transfer-Encoding overrides it, and a proxy removes it); kept, it would
    // cut the body short on the way to the client.
    if rparts.headers.contains_key(http::header::TRANSFER_ENCODING) {
        rparts.headers.remove(http::header::CONTENT_LENGTH);
    }
    // What a `101` switches to, read before the hop-by-hop fields go.
    let switched_to = rparts.headers.get(http::header::UPGRADE).cloned();
    strip_hop_by_hop(&mut rparts.headers);
    super::headers::one_content_length(&mut rparts.headers);
    Ok(Sent {
        route,
        passed,
        parts: rparts,
        body: rbody,
        in_flight,
        upgrade: upgrade_proto,
        client_upgrade,
        switched_to,
        request_bytes: fault.received(),
    })
}
