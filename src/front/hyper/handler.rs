//! The hyper front: one request through the gateway, as a codec ([`Hyper`]) of the one life
//! cycle ([`crate::pipeline::cycle`]). What is its own is protocol: the framing the connection
//! found, the head as hyper parsed it and the edits applied to it, hyper's clients, the
//! response handed back to hyper with its body streamed (or, for an accepted protocol upgrade,
//! a tunnel).

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
use crate::front::hyper::body::{BodyFault, PeekBody};
use crate::front::pending::PendingBodies;
use crate::front::server::ConnInfo;
use crate::pipeline::cycle::{self, Codec, Ground};
use crate::pipeline::drive::{Relay, Rendered, ReplyHead};
use crate::pipeline::{BodyPrefix, Edits, Flavor, Leases, Peer, ProxyError, Trail, WorkerCtx};
use crate::routing::{Route, Target};
use crate::runtime::state::Shared;
use crate::upstream::attempts::{self, To};
use crate::upstream::Group;

/// Answers one request on the proxy listener, with this worker's upstream client and settle
/// tracking, through the one life cycle ([`crate::pipeline::cycle`]). Returns the response and,
/// when the access log is on, the request's record (sent when its body ends).
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
    let server = &snap.config.server;
    let (mut parts, body) = req.into_parts();
    let refused = if request.conflicting_framing() {
        Some("a request may not carry both Content-Length and Transfer-Encoding")
    } else if parts.method == Method::CONNECT && parts.version <= Version::HTTP_11 {
        // The connection's framing scanner stops following at a CONNECT (what follows a granted
        // one is not HTTP), so the connection must not serve another request after it.
        Some("CONNECT is not supported")
    } else {
        None
    };
    // Read by the compression phase only on a route that compresses (one value kept inline:
    // no allocation).
    let accept_encoding = parts
        .headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .cloned()
        .collect();
    // Names with `_` are never seen (nor forwarded), as on the fast front: see
    // `drop_underscored`.
    drop_underscored(&mut parts.headers);
    let pending = PendingBodies {
        connection: &conn.state.pending_bodies,
        worker: pending,
        bounds: server.pending_bodies,
    };
    let mut codec = Hyper {
        flavor: Flavor::of(&parts),
        client,
        worker,
        conn: &conn,
        refused,
        accept_encoding,
        body: Some(PeekBody::new(body, server.body_read_timeout, pending)),
        body_timeout: server.body_read_timeout,
        idle: server.idle_timeout,
        fault: BodyFault::default(),
        going: None,
    };
    let peer = Peer {
        ip: conn.peer.ip(),
        ip_value: &conn.peer_ip,
        tls: conn.tls,
        client_cert: conn.client_cert.as_deref(),
    };
    let ground = Ground {
        shared,
        snap: &snap,
        ctx,
    };
    cycle::run(&mut codec, parts, ground, &peer, None, started).await
}

/// The hyper front as a codec of the one life cycle ([`crate::pipeline::cycle`]): the request
/// as hyper parsed it, sent with the worker's pooled hyper clients, the upstream's response
/// head edited as a header map and its body streamed by hyper (or, for an accepted upgrade, a
/// tunnel); answers handed back to hyper as responses.
struct Hyper<'x> {
    client: &'x UpstreamClient,
    worker: usize,
    conn: &'x ConnInfo,
    /// Why the request is refused before the pipeline (framing the connection cannot follow).
    refused: Option<&'static str>,
    /// The form of the gateway's answers (gRPC statuses for a gRPC client).
    flavor: Flavor,
    accept_encoding: smallvec::SmallVec<[HeaderValue; 1]>,
    /// The client's body until the request is prepared (read before the limits only on a
    /// route whose limits look into it).
    body: Option<PeekBody<'x>>,
    body_timeout: std::time::Duration,
    idle: std::time::Duration,
    /// What the client's body did to the attempts (shared with the body sent upstream).
    fault: BodyFault,
    going: Option<Going<'x>>,
}

/// An admitted request, ready to go upstream.
struct Going<'x> {
    sender: Sender<'x>,
    /// The protocol an upgrade request asks for, and the client side's switch.
    upgrade: Option<HeaderValue>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
}

impl BodyPrefix for Hyper<'_> {
    fn read(
        &mut self,
        max: u64,
        max_body_size: u64,
    ) -> impl std::future::Future<Output = Result<crate::pipeline::Prefix<'_>, ProxyError>> + Send
    {
        self.body.read(max, max_body_size)
    }
}

impl<'x> Codec for Hyper<'x> {
    type Head = http::request::Parts;
    type Response<'s> = Response<Incoming>;
    type Reply<'s> = Reply<'x, 's>;
    type Done = (Response<ResBody>, Option<Box<Record>>);

    fn refused(&self) -> Option<ProxyError> {
        self.refused.map(ProxyError::BadFraming)
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
        // An upgrade request keeps its `Upgrade`; the client side's switch is taken from the
        // request.
        let upgrade = upgrade::requested(&parts);
        let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        let te_trailers = accepts_trailers(&parts.headers);
        strip_hop_by_hop(&mut parts.headers);
        // `TE: trailers` is the one TE HTTP/2 allows, and gRPC servers may insist on it: kept
        // for an HTTP/2 group when the client sent it (as Envoy does).
        if te_trailers && matches!(&route.target, Target::Group(g) if g.connect.protocol.is_h2()) {
            parts
                .headers
                .insert(http::header::TE, HeaderValue::from_static("trailers"));
        }
        if let Some(proto) = &upgrade {
            upgrade::restore_headers(&mut parts.headers, proto.clone());
        }
        let pq = std::mem::take(&mut edits.path_and_query);
        edits.apply(&mut parts.headers);
        if parts.version >= Version::HTTP_2 {
            join_cookie_crumbs(&mut parts.headers);
        }
        parts.version = Version::HTTP_11;
        let client = match &route.target {
            Target::Group(_) => Client::Group(self.worker),
            _ => Client::Shared(self.client),
        };
        let sender = Sender::new(
            client,
            route,
            parts,
            (body, prefix),
            pq,
            self.fault.clone(),
            self.body_timeout,
        );
        self.going = Some(Going {
            sender,
            upgrade,
            client_upgrade,
        });
    }

    fn bodyless(&self) -> bool {
        self.going.as_ref().is_none_or(|g| g.sender.bodyless())
    }

    /// Boxed: an attempt's future (hyper's request, its head and body) is a few kilobytes,
    /// and would otherwise be part of every request's future, which hyper's service moves
    /// into its box (measured: +8 % instructions a request).
    fn send<'s>(
        &mut self,
        route: &'s Route,
        group: &'s Group,
        to: To,
    ) -> impl std::future::Future<Output = Result<Response<Incoming>, attempts::Failed<ProxyError>>> + Send
    {
        Box::pin(async move {
            match self.going.as_mut() {
                Some(g) => g.sender.send(route, group, to).await,
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
        self.going.as_mut().is_some_and(|g| g.sender.again())
    }

    fn left(&mut self) -> Option<Self::Done> {
        None
    }

    fn reply<'s>(
        &mut self,
        response: Response<Incoming>,
        in_flight: Option<crate::upstream::InFlight>,
        route: &'s Route,
    ) -> Reply<'x, 's> {
        let (mut parts, body) = response.into_parts();
        // An intermediary answers in its own version (RFC 9110 §2.5): an HTTP/1.0 upstream must
        // not turn the client's answer into an HTTP/1.0 one, which would also end its
        // keep-alive. (hyper still answers an HTTP/1.0 client in HTTP/1.0.)
        parts.version = Version::HTTP_11;
        // A response framed by its chunks is not also framed by a `Content-Length` it carries
        // (RFC 9112 §6.3: Transfer-Encoding overrides it, and a proxy removes it); kept, it
        // would cut the body short on the way to the client.
        if parts.headers.contains_key(http::header::TRANSFER_ENCODING) {
            parts.headers.remove(http::header::CONTENT_LENGTH);
        }
        // What a `101` switches to, read before the hop-by-hop fields go.
        let switched_to = parts.headers.get(http::header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        super::headers::one_content_length(&mut parts.headers);
        let (upgrade, client_upgrade) = match self.going.as_mut() {
            Some(g) => (g.upgrade.take(), g.client_upgrade.take()),
            None => (None, None),
        };
        Reply {
            length: http_body::Body::size_hint(&body).exact(),
            parts,
            body: Some(body),
            in_flight,
            upgrade,
            client_upgrade,
            switched_to,
            conn: self.conn,
            idle: self.idle,
            route,
            request_bytes: self.fault.received(),
        }
    }

    /// The upstream's answer, relayed: its body streamed holding the in-flight slot, the
    /// request's slots and the body's charge.
    async fn stream<'s>(
        &mut self,
        reply: &mut Reply<'x, 's>,
        relay: &mut Relay,
        route: &'s Route,
    ) -> Self::Done {
        let mut parts = std::mem::replace(&mut reply.parts, Response::new(()).into_parts().0);
        let Some(mut body) = reply.body.take() else {
            let r = Response::new(ResBody::Right(Full::new(Bytes::new())));
            return (r, relay.record.take());
        };
        let mut first = None;
        if relay.encoder.is_some() {
            // The compressed body's length is known only at its end.
            parts.headers.remove(http::header::CONTENT_LENGTH);
            // The head waits for the body's first frame, as the fast front's does: a body
            // broken before it is answered 502 (nginx's answer when it has sent no head),
            // not with a head and nothing after. An upstream silent for `idle_timeout` gets the
            // head, and its body is waited for as any other.
            match tokio::time::timeout(reply.idle, http_body_util::BodyExt::frame(&mut body)).await
            {
                Ok(Some(Err(_))) => {
                    let rendered =
                        crate::pipeline::drive::broken_before_head(route, relay, self.flavor());
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
        let response = Response::from_parts(
            parts,
            Either::Left(
                UpstreamBody::new(body, reply.in_flight.take())
                    .starting_with(first)
                    .trailers_of(&route.name, grpc)
                    .holding(relay.leases.take())
                    .charging(relay.charge.take().map(|c| *c))
                    .filling(relay.fill.take())
                    .compressing(relay.encoder.take().map(|e| *e))
                    .pacing(relay.pace.take()),
            ),
        );
        (response, relay.record.take())
    }

    async fn answer(&mut self, r: Rendered, _: bool) -> Self::Done {
        if r.closes {
            self.conn.state.linger_on_close();
        }
        let mut res = Response::new(ResBody::Right(Full::new(Bytes::from(r.body))));
        *res.status_mut() = r.status;
        *res.headers_mut() = r.headers;
        (res, r.record)
    }
}

/// The hyper front's response head for the driver ([`crate::pipeline::drive::relay`]): the
/// upstream's header map, edited in place; a `101` switched to a tunnel between the two
/// upgrades.
struct Reply<'x, 's> {
    parts: http::response::Parts,
    /// (Taken by the response.)
    body: Option<Incoming>,
    in_flight: Option<crate::upstream::InFlight>,
    upgrade: Option<HeaderValue>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    switched_to: Option<HeaderValue>,
    conn: &'x ConnInfo,
    idle: std::time::Duration,
    route: &'s Route,
    request_bytes: u64,
    /// The body's length (`None`: unknown).
    length: Option<u64>,
}

impl ReplyHead for Reply<'_, '_> {
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

    fn remove(&mut self, name: &http::HeaderName) {
        self.parts.headers.remove(name);
    }
}

/// Joins an HTTP/2 request's cookie crumbs (one `cookie` field per cookie, RFC 9113 §8.2.3)
/// into the one `Cookie` line an HTTP/1.1 upstream expects, with "; ".
pub(crate) fn join_cookie_crumbs(headers: &mut http::HeaderMap) {
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
pub(crate) fn accepts_trailers(headers: &http::HeaderMap) -> bool {
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
