//! The one request life cycle, for every front: [`run`] takes a request from its head to its
//! end — the request id, admission ([`super::admit()`]), the upstream attempts (the one planner,
//! [`crate::upstream::attempts`]), the response head through [`super::drive::relay`] (charges,
//! rate-limit headers, the route's response rules, compression, the record), or the gateway's
//! own answer through [`super::drive::answer`] — over a small [`Codec`] each front implements.
//!
//! A codec holds only what is protocol: how the front reads the request's head and body, how it
//! sends the request once to the server the planner picks ([`SendOnce`]), how it writes a
//! response head and streams its body, how it writes an answer, and what the connection does
//! next. It holds no retry, forwarding-header, failure-log or answer logic of its own.
//! (The shape is pingora's: one `process_request` over each server's `Session`.)

use std::future::Future;
use std::time::Instant;

use http::{Method, StatusCode};

use super::admit::{admit, admit_now, admit_waiting, Admitted, Peer, Routed, Step};
use super::answer::{Answer, Flavor, ProxyError};
use super::body::BodyPrefix;
use super::drive::{self, Refusal, Relay, Rendered, ReplyHead};
use super::edits::Edits;
use super::record::{Exchange, Trail};
use super::settle::WorkerCtx;
use crate::cache::{Looked, Outcome};
use crate::compression::Offer;
use crate::http::fields::FieldSink as _;
use crate::http::head::{header_str, RequestHead};
use crate::routing::{Route, Target};
use crate::runtime::state::{Shared, Snapshot};
use crate::upstream::attempts::{self, Failed, Plan, SendOnce, To};
use crate::upstream::{Group, InFlight};

/// What a front does for one request, as the life cycle ([`run`]) drives it: its body read
/// for admission (the [`BodyPrefix`] it is), the request sent once to a server, a response head
/// handed to the driver and streamed, an answer written.
///
/// (No lifetime of the trait's own: every impl holds for any lifetime of a route, so that a
/// request's future can be proven `Send` — see rust-lang/rust#100013.)
pub trait Codec: BodyPrefix + Send {
    /// The request head as the pipeline reads it (handed to the codec at [`Codec::prepare`]).
    type Head: RequestHead + Send + Sync;
    /// What an answered attempt gives (at least its response head).
    type Response<'s>: Send;
    /// An answered attempt's response head, as the driver edits it.
    type Reply<'s>: ReplyHead + Send;
    /// What the request leaves the connection in (the fast front: read the next request or
    /// close; hyper's: the response it hands back to hyper, and its record).
    type Done;

    /// A request the front cannot follow the framing of, refused before the pipeline.
    fn refused(&self) -> Option<ProxyError> {
        None
    }

    /// The request's `Accept-Encoding` values (the compression of answers and responses).
    fn accept_encoding(&self) -> impl Iterator<Item = &str>;

    /// The form of the gateway's answers to this request: problem+json, unless the front
    /// serves gRPC (then [`Flavor::of`] the request).
    fn flavor(&self) -> Flavor {
        Flavor::Problem
    }

    /// The worker serving the request (its pools, its round-robin counter).
    fn worker(&self) -> usize;

    /// The admitted request made ready for its attempts: the pipeline's `edits` applied (by
    /// the one forwarding-header writer, [`Edits`]), the hop-by-hop fields dropped.
    fn prepare(&mut self, head: Self::Head, route: &Route, edits: Edits);

    /// The request has no body (the retry rule). After [`Codec::prepare`].
    fn bodyless(&self) -> bool;

    /// Sends the request once to `group`'s server `to.index` and reads its response head
    /// (the planner's "send once", [`SendOnce::send`]).
    fn send<'s>(
        &mut self,
        route: &'s Route,
        group: &'s Group,
        to: To,
    ) -> impl Future<Output = Result<Self::Response<'s>, Failed<ProxyError>>> + Send;

    /// The response head's status.
    fn status(response: &Self::Response<'_>) -> StatusCode;

    /// See [`SendOnce::again`].
    fn again(&mut self) -> bool {
        true
    }

    /// The client left during the attempts: what the connection does (`None`: answered as an
    /// upstream failure, by a front that must answer every request).
    fn left(&mut self) -> Option<Self::Done>;

    /// An answered attempt's response head, made relayable, for the driver.
    fn reply<'s>(
        &mut self,
        response: Self::Response<'s>,
        in_flight: Option<InFlight>,
        route: &'s Route,
    ) -> Self::Reply<'s>;

    /// Writes the response the driver relayed: its head, and its body streamed holding what
    /// `relay` carries (the slots, the body's charge, the encoder, the pace, the record: the
    /// codec takes them). Both by reference: they stay where the driver holds them (a
    /// response head is a kilobyte or more, and a request's future is not copied for it).
    fn stream<'s>(
        &mut self,
        reply: &mut Self::Reply<'s>,
        relay: &mut Relay,
        route: &'s Route,
    ) -> impl Future<Output = Self::Done> + Send;

    /// Writes a gateway's answer, ready ([`drive::answer`]); `close`: the connection must
    /// close after it (the upstream's response could not be relayed).
    fn answer(&mut self, answer: Rendered, close: bool) -> impl Future<Output = Self::Done> + Send;

    /// Writes a limit's refusal, ready ([`drive::refusal`]): by default as any answer (the
    /// generic rendering); a front that writes heads itself writes it straight into its
    /// buffer, nothing allocated per refusal.
    fn refuse(
        &mut self,
        refusal: Refusal<'_>,
        close: bool,
    ) -> impl Future<Output = Self::Done> + Send {
        self.answer(refusal.rendered(), close)
    }
}

/// A codec as the planner's sender, for one route and group.
struct Attempts<'c, 's, C> {
    codec: &'c mut C,
    route: &'s Route,
    group: &'s Group,
}

impl<'s, C: Codec> SendOnce for Attempts<'_, 's, C> {
    type Response = C::Response<'s>;
    type Fault = ProxyError;

    fn send(
        &mut self,
        to: To,
    ) -> impl Future<Output = Result<C::Response<'s>, Failed<ProxyError>>> + Send {
        self.codec.send(self.route, self.group, to)
    }

    fn status(response: &C::Response<'s>) -> StatusCode {
        C::status(response)
    }

    fn again(&mut self) -> bool {
        self.codec.again()
    }
}

/// Where the life cycle runs: the gateway, the configuration the request is served with, and
/// the worker's settle tracking.
pub struct Ground<'r, 's> {
    pub shared: &'r Shared,
    pub snap: &'s Snapshot,
    pub ctx: &'r WorkerCtx,
}

/// One request's whole life on `codec`, its head `head`, started at `started`: `routed` when
/// the front looked the route up already (to decide that it serves the request).
pub async fn run<'s, C: Codec>(
    codec: &mut C,
    head: C::Head,
    ground: Ground<'_, 's>,
    peer: &Peer<'_>,
    routed: Option<Routed<'s, '_>>,
    started: Instant,
) -> C::Done {
    let Ground { shared, snap, ctx } = ground;
    let logging = snap.config.log.access.is_on();
    let id_header = &snap.config.server.request_id_header;
    let request_id = crate::http::request_id::of_head(&head, id_header, started);
    let mut trail = Trail::default();
    let mut exchange = Exchange {
        started,
        method: head.method().clone(),
        request_id: &request_id,
        peer: peer.ip,
        status: StatusCode::OK,
    };
    // Every way a request ends but a relayed response: the gateway's answer, and whether the
    // connection must close after it.
    let (answer, close): (Answer, bool) = 'answered: {
        if let Some(refused) = codec.refused() {
            if logging {
                trail.path = head.path().to_owned();
            }
            break 'answered (refused.into(), false);
        }
        // The body is read before the limits only on a route whose limits read it; a config
        // with such a route admits in a future (boxed), reading the body. Elsewhere admission
        // runs without one, deciding in process when the store can ([`admit_now`]); only a
        // request that waits (a store round trip, a delay) builds one, boxed: kept out of
        // every request's future.
        let admitted = if snap.json_routes {
            let request_id = &request_id;
            Box::pin(admit(
                snap, ctx, &head, codec, peer, request_id, &mut trail, routed,
            ))
            .await
        } else {
            match admit_now(snap, ctx, &head, peer, &request_id, &mut trail, routed) {
                Step::Done(admitted) => admitted,
                Step::Wait(waiting) => {
                    Box::pin(admit_waiting(
                        waiting,
                        snap,
                        ctx,
                        &head,
                        peer,
                        &request_id,
                        &mut trail,
                    ))
                    .await
                }
            }
        };
        let Admitted {
            route,
            mut passed,
            mut edits,
            client,
        } = match admitted {
            Ok(a) => a,
            Err(a) => break 'answered (a, false),
        };
        // The cache phase (#54), after admission (a hit is charged as any request): a hit is
        // answered from the store; a miss is forwarded with what its response does there.
        let mut forward = None;
        if let (Some(rc), Some(cache)) = (route.cache.as_deref(), snap.cache.as_ref()) {
            let now = crate::cache::now(&shared.clock);
            match crate::cache::lookup(cache, rc, &head, peer.tls, &trail, client, now).await {
                Looked::Hit(hit) => {
                    trail.cache = Some(hit.status.as_str());
                    let charged = drive::charge_hit(snap, ctx, &passed, &hit).await;
                    let ae = codec.accept_encoding();
                    let r = drive::cached(
                        shared, logging, hit, charged, &passed, route, trail, exchange, id_header,
                        ae,
                    );
                    return codec.answer(r, false).await;
                }
                Looked::NotCached => break 'answered (ProxyError::NotCached.into(), false),
                Looked::Forward(f) => {
                    trail.cache = Some(f.status().as_str());
                    f.edit(&mut edits);
                    forward = Some(f);
                }
            }
        }
        let group: &Group = match &route.target {
            Target::Url { single, .. } => single,
            Target::Group(g) => g,
            // Answered by admission: never forwarded.
            Target::Redirect(_) => {
                let e = ProxyError::Upstream("a redirect route has no upstream".to_owned());
                break 'answered (e.into(), false);
            }
        };
        codec.prepare(head, route, edits);
        // From here the upstream may do the work: a client that leaves before its head is
        // charged.
        let abandoned = passed.arm_abandoned(&snap.store, ctx);
        let plan = Plan {
            group,
            worker: codec.worker(),
            metrics: &route.metrics,
            method: &exchange.method,
            bodyless: codec.bodyless(),
            client,
        };
        let mut sender = Attempts {
            codec: &mut *codec,
            route,
            group,
        };
        let sent = attempts::run(plan, &mut sender, trail.for_attempts()).await;
        let (response, in_flight) = match sent.map_err(drive::stopped) {
            Ok(sent) => sent,
            // The client went away: the abandoned guard (dropped here) charges what it owes.
            Err(None) => match codec.left() {
                Some(done) => return done,
                None => {
                    let e = ProxyError::Upstream("the client went away".to_owned());
                    break 'answered (e.into(), false);
                }
            },
            Err(Some(e)) => {
                // The exchange failed: never charged.
                if let Some(a) = abandoned {
                    a.disarm();
                }
                // A stored response that may answer a failure (`stale-if-error`).
                let now = crate::cache::now(&shared.clock);
                if let Some(hit) = forward.and_then(|f| f.failed(now)) {
                    trail.cache = Some(hit.status.as_str());
                    let charged = drive::charge_hit(snap, ctx, &passed, &hit).await;
                    let ae = codec.accept_encoding();
                    let r = drive::cached(
                        shared, logging, hit, charged, &passed, route, trail, exchange, id_header,
                        ae,
                    );
                    return codec.answer(r, false).await;
                }
                break 'answered (e.into(), false);
            }
        };
        // The upstream's head arrived: the client's leaving is no longer what ends the
        // exchange.
        if let Some(a) = abandoned {
            a.disarm();
        }
        let mut reply = codec.reply(response, in_flight, route);
        // The cache phase on the response head: the body copied into the store as it
        // streams, or a stored response answering in its place (freshened by a 304, or stale
        // on a server error).
        let (mut fill, mut cache_status) = (None, None);
        if let Some(f) = forward {
            let now = crate::cache::now(&shared.clock);
            let (status, length) = (reply.status(), reply.known_length());
            match f.respond(status, reply.map(), length, now) {
                Outcome::Serve(hit) => {
                    drop(reply);
                    trail.cache = Some(hit.status.as_str());
                    let charged = drive::charge_hit(snap, ctx, &passed, &hit).await;
                    let ae = codec.accept_encoding();
                    let r = drive::cached(
                        shared, logging, hit, charged, &passed, route, trail, exchange, id_header,
                        ae,
                    );
                    return codec.answer(r, false).await;
                }
                Outcome::Fill(f, s) => (fill, cache_status) = (Some(f), Some(s)),
                Outcome::Relay(s) => cache_status = s,
            }
        }
        // A route without compression pays this one branch.
        let offer = route.compression.as_deref().and_then(|c| {
            Offer::of(
                Some(c),
                exchange.method == Method::HEAD,
                codec.accept_encoding(),
            )
        });
        let relayed = drive::relay(
            shared,
            snap,
            ctx,
            logging,
            route,
            &mut passed,
            &mut trail,
            exchange,
            &mut reply,
            offer,
        );
        match relayed {
            Ok(mut relay) => {
                if relay.charging.is_some() {
                    relay.charged().await;
                }
                if let Some(s) = cache_status {
                    reply.extras().set(&drive::CACHE_STATUS, s.as_bytes());
                }
                relay.fill = fill;
                return codec.stream(&mut reply, &mut relay, route).await;
            }
            // The head could not be relayed: answered, and the connection closes.
            Err((e, back)) => {
                exchange = back;
                break 'answered (e.into(), true);
            }
        }
    };
    let flavor = codec.flavor();
    if drive::is_plain_refusal(&answer, flavor, &trail, id_header) {
        let refusal = drive::refusal(shared, logging, answer, trail, exchange, id_header);
        return codec.refuse(refusal, close).await;
    }
    let rendered = drive::answer(
        shared,
        logging,
        answer,
        flavor,
        trail,
        exchange,
        id_header,
        codec.accept_encoding(),
    );
    codec.answer(rendered, close).await
}

/// The `Accept-Encoding` values of a head, as text (for a codec's
/// [`Codec::accept_encoding`]).
pub fn accept_encoding(head: &impl RequestHead) -> impl Iterator<Item = &str> {
    head.header_values(&http::header::ACCEPT_ENCODING)
        .filter_map(header_str)
}

#[cfg(test)]
mod tests {
    //! The life cycle on a scripted codec: what it asks of a front, in which order, and what
    //! it answers, whatever the front.

    use std::collections::VecDeque;
    use std::sync::Arc;

    use arc_swap::ArcSwap;
    use http::header::{HeaderMap, HeaderName, HeaderValue};

    use super::*;
    use crate::http::head::OwnedHead;
    use crate::pipeline::{Leases, Prefix};
    use crate::upstream::Failure;
    use tollgate_limit::store::{AnyClock, AnyStore};

    const CONFIG: &str = r#"
[[routes]]
name = "shaped"
path_prefix = "/shaped"
upstream = "http://127.0.0.1:9"

[[routes.limits]]
name = "paced"
algorithm = "leaky_bucket"
limit = 1
period = "1s"
burst = 5
subject = "global"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "http://127.0.0.1:9"

[[routes.limits]]
name = "once"
algorithm = "fixed_window"
limit = 1
period = "1h"
subject = "header:x-key"
"#;

    fn shared() -> Shared {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, CONFIG).unwrap();
        let loaded = crate::runtime::load::load_and_check(&path).unwrap();
        let store = Arc::new(AnyStore::build(&loaded.config.store, AnyClock::System, 1));
        let snap = Snapshot::build(loaded, 1, store, None).unwrap();
        Shared {
            serving: crate::runtime::state::Serving::new(1),
            access_log: crate::access_log::AccessLog::new(&snap.config.log),
            runtime: None,
            snapshot: ArcSwap::from_pointee(snap),
            unmatched: crate::metrics::RouteMetrics::new(&Arc::from("unmatched")),
            metrics: None,
            config_path: None,
            tls: None,
            clock: AnyClock::System,
        }
    }

    /// What the scripted front was asked, and what it ended in.
    #[derive(Debug, PartialEq)]
    enum Done {
        Streamed(u16),
        /// Status, whether the connection must close.
        Answered(u16, bool),
        Left,
    }

    /// A front whose attempts answer as scripted.
    #[derive(Default)]
    struct Scripted {
        refuse: bool,
        leaves: bool,
        attempts: VecDeque<Result<u16, Failed<ProxyError>>>,
        prepared: bool,
        sent: usize,
    }

    impl BodyPrefix for Scripted {
        async fn read(&mut self, _: u64, _: u64) -> Result<Prefix<'_>, ProxyError> {
            Ok(Prefix {
                bytes: &[],
                whole: false,
            })
        }
    }

    struct Head(u16, HeaderMap);

    impl ReplyHead for Head {
        type Extras = HeaderMap;
        fn status(&self) -> StatusCode {
            StatusCode::from_u16(self.0).unwrap()
        }
        fn switch(&mut self, _: &mut Option<Leases>) -> Result<(), String> {
            match self.0 {
                101 => Err("no upgrade".into()),
                _ => Ok(()),
            }
        }
        fn map(&mut self) -> &mut HeaderMap {
            &mut self.1
        }
        fn charged(&mut self) {}
        fn extras(&mut self) -> &mut HeaderMap {
            &mut self.1
        }
        fn request_bytes(&self) -> u64 {
            0
        }
        fn respond(&mut self, trail: &Trail<'_>, request_id: &HeaderValue) {
            crate::pipeline::respond(trail, request_id, false, &mut self.1);
        }
        fn values<'s>(&'s self, name: &HeaderName) -> impl Iterator<Item = &'s str> + 's {
            self.1.get_all(name).iter().filter_map(|v| v.to_str().ok())
        }
        fn known_length(&self) -> Option<u64> {
            Some(0)
        }
        fn remove(&mut self, name: &HeaderName) {
            self.1.remove(name);
        }
    }

    impl Codec for Scripted {
        type Head = OwnedHead;
        type Response<'s> = u16;
        type Reply<'s> = Head;
        type Done = Done;

        fn refused(&self) -> Option<ProxyError> {
            self.refuse.then_some(ProxyError::BadFraming("refused"))
        }
        fn accept_encoding(&self) -> impl Iterator<Item = &str> {
            std::iter::empty()
        }
        fn worker(&self) -> usize {
            0
        }
        fn prepare(&mut self, _: OwnedHead, _: &Route, _: Edits) {
            self.prepared = true;
        }
        fn bodyless(&self) -> bool {
            true
        }
        async fn send<'s>(
            &mut self,
            _: &'s Route,
            _: &'s Group,
            _: To,
        ) -> Result<u16, Failed<ProxyError>> {
            assert!(self.prepared, "sent before it was prepared");
            self.sent += 1;
            self.attempts.pop_front().unwrap_or(Ok(200))
        }
        fn status(response: &u16) -> StatusCode {
            StatusCode::from_u16(*response).unwrap()
        }
        fn left(&mut self) -> Option<Done> {
            self.leaves.then_some(Done::Left)
        }
        fn reply(&mut self, status: u16, _: Option<InFlight>, _: &Route) -> Head {
            Head(status, HeaderMap::new())
        }
        async fn stream(&mut self, reply: &mut Head, _: &mut Relay, _: &Route) -> Done {
            Done::Streamed(reply.0)
        }
        async fn answer(&mut self, answer: Rendered, close: bool) -> Done {
            Done::Answered(answer.status.as_u16(), close)
        }
    }

    async fn request(shared: &Shared, codec: &mut Scripted, key: &str) -> Done {
        let snap = shared.snapshot.load_full();
        let ctx = WorkerCtx::new(tollgate_limit::worker::WorkerId::new(0));
        let ip = HeaderValue::from_static("127.0.0.1");
        let peer = Peer {
            ip: [127, 0, 0, 1].into(),
            ip_value: &ip,
            tls: false,
            client_cert: None,
        };
        let mut head = OwnedHead {
            path: "/api/x".into(),
            ..OwnedHead::default()
        };
        head.headers
            .insert("host", HeaderValue::from_static("example.com"));
        head.headers
            .insert("x-key", HeaderValue::from_str(key).unwrap());
        let ground = Ground {
            shared,
            snap: &snap,
            ctx: &ctx,
        };
        run(codec, head, ground, &peer, None, Instant::now()).await
    }

    /// On the in-process store admission builds no future: admitted and refused requests are
    /// decided by `admit_now`; only what must wait (here a leaky bucket's delay) waits.
    #[tokio::test]
    async fn admission_in_process_awaits_nothing() {
        let shared = shared();
        let snap = shared.snapshot.load_full();
        let ctx = WorkerCtx::new(tollgate_limit::worker::WorkerId::new(0));
        let ip = HeaderValue::from_static("127.0.0.1");
        let peer = Peer {
            ip: [127, 0, 0, 1].into(),
            ip_value: &ip,
            tls: false,
            client_cert: None,
        };
        let id = HeaderValue::from_static("id");
        let head = |path: &str| {
            let mut head = OwnedHead {
                path: path.into(),
                ..OwnedHead::default()
            };
            head.headers
                .insert("host", HeaderValue::from_static("example.com"));
            head.headers.insert("x-key", HeaderValue::from_static("k"));
            head
        };
        let step = |path: &str| {
            let mut trail = Trail::default();
            match admit_now(&snap, &ctx, &head(path), &peer, &id, &mut trail, None) {
                Step::Done(Ok(_)) => "admitted",
                Step::Done(Err(a)) if a.error.status() == StatusCode::TOO_MANY_REQUESTS => "429",
                Step::Done(Err(_)) => "answered",
                Step::Wait(w) => match *w {
                    crate::pipeline::admit::Waiting::Later { .. } => "later",
                    crate::pipeline::admit::Waiting::Store { .. } => "store",
                    crate::pipeline::admit::Waiting::Usage(..) => "usage",
                },
            }
        };
        assert_eq!(step("/api/x"), "admitted");
        assert_eq!(step("/api/x"), "429");
        assert_eq!(step("/nowhere"), "answered");
        // The bucket's first request leaves at once; the next is delayed: it waits.
        assert_eq!(step("/shaped"), "admitted");
        assert_eq!(step("/shaped"), "later");
    }

    #[tokio::test]
    async fn every_end_of_a_request_is_the_drivers_whatever_the_front() {
        let shared = shared();
        // Admitted, sent once, the response streamed.
        let mut c = Scripted::default();
        assert_eq!(request(&shared, &mut c, "a").await, Done::Streamed(200));
        assert_eq!(c.sent, 1);
        // Refused by the limit (one per hour per key): answered 429, never prepared nor sent.
        let mut c = Scripted::default();
        assert_eq!(
            request(&shared, &mut c, "a").await,
            Done::Answered(429, false)
        );
        assert!(!c.prepared);
        assert_eq!(c.sent, 0);
        // Refused by the front before the pipeline: 400, nothing charged (the key's first
        // request still passes).
        let mut c = Scripted {
            refuse: true,
            ..Scripted::default()
        };
        assert_eq!(
            request(&shared, &mut c, "b").await,
            Done::Answered(400, false)
        );
        assert_eq!(c.sent, 0);
        // The upstream failed: 502 (a route's own URL is a group of one: one attempt).
        let mut c = Scripted::default();
        c.attempts.push_back(Err(Failed::Upstream {
            failure: Failure::Connect,
            unsent: true,
        }));
        assert_eq!(
            request(&shared, &mut c, "b").await,
            Done::Answered(502, false)
        );
        assert_eq!(c.sent, 1);
        // A `101` the front cannot switch: 502, and the connection closes.
        let mut c = Scripted::default();
        c.attempts.push_back(Ok(101));
        assert_eq!(
            request(&shared, &mut c, "c").await,
            Done::Answered(502, true)
        );
        // The client left during the attempts: the front says what its connection does, or
        // (a front that answers every request) it is answered 502.
        for (leaves, done) in [(true, Done::Left), (false, Done::Answered(502, false))] {
            let mut c = Scripted {
                leaves,
                ..Scripted::default()
            };
            c.attempts.push_back(Err(Failed::Client(None)));
            let key = if leaves { "d" } else { "e" };
            assert_eq!(request(&shared, &mut c, key).await, done);
        }
        // The client's own fault (its body): its answer, the server not blamed.
        let mut c = Scripted::default();
        c.attempts
            .push_back(Err(Failed::Client(Some(ProxyError::BodyTimeout))));
        assert_eq!(
            request(&shared, &mut c, "f").await,
            Done::Answered(408, false)
        );
    }
}
