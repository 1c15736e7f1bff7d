//! Admission: one call runs a request's phases up to the upstream — input checks, the route,
//! the caller (client address, consumer and plan), the limits — and returns plain data: the
//! request *admitted* (its route, what passed the limits, the edits to its upstream head) or
//! the *answer* the gateway gives itself (an error, a CORS preflight's answer, a redirect).

use std::net::IpAddr;

use http::header::{HeaderValue, HOST};

use super::answer::{Answer, ProxyError};
use super::body::BodyPrefix;
use super::consumer::{rewrite_headers, upstream_query};
use super::edits::{Edits, Forwarded};
use super::evaluate::{
    self, after_limits, before_limits, preflight_answer, Counting, Found, Judge, Then,
};
use super::input::{self, Input};
use super::limits::{self, Deciding, Gate, Later, Phase, Prepared};
use super::passed::Passed;
use super::record::Trail;
use super::settle::WorkerCtx;
use crate::config::ConsumersConfig;
use crate::fronting::cors;
use crate::fronting::Vars;
use crate::http::head::RequestHead;
use crate::routing::Route;
use crate::runtime::state::Snapshot;
use crate::subject::{client_of, Client, Facts};
use crate::traces::TraceTrail;
use tollgate_limit::store::Store;

/// The connection a request came on, as the pipeline needs it.
pub struct Peer<'c> {
    /// The TCP peer's address.
    pub ip: IpAddr,
    /// The same, as a header value (for `X-Forwarded-For`).
    pub ip_value: &'c HeaderValue,
    /// Whether the connection is TLS (`X-Forwarded-Proto`).
    pub tls: bool,
    /// The verified client certificate's facts (mTLS).
    pub client_cert: Option<&'c crate::tls::peer::PeerCert>,
}

/// A request the gateway forwards.
pub struct Admitted<'s> {
    pub route: &'s Route,
    /// What passed the limits: decisions for the headers, charges owed after, slots held.
    pub passed: Passed<'s>,
    /// The upstream head's path and query and header edits.
    pub edits: Edits,
    /// The client address (behind trusted proxies), worked out once.
    pub client: IpAddr,
}

/// Who serves a request the fast HTTP/1 front has read.
pub enum Serve<'s, 'h> {
    /// The hyper front (with the connection, from this request on), and why (a `reason` of
    /// `crate::metrics::HTTP1_HANDOFFS`).
    Hyper(&'static str),
    /// The fast front, with the route already looked up when the snapshot has routes only
    /// hyper serves (`None`: not looked up): [`admit`] does not look it up again.
    Here(Option<Routed<'s, 'h>>),
}

/// A request's input checked and its route looked up, by [`serve`] for [`admit`].
pub struct Routed<'s, 'h> {
    input: Input<'h>,
    asked: Option<http::Method>,
    route: Option<&'s Route>,
}

/// Whether a request the fast HTTP/1 front has read should be served by the hyper front
/// instead — the one place that decides, per request: for a gRPC(-Web) request (its answers
/// in gRPC statuses and its trailers), and for a route whose needs the fast front does not
/// serve ([`Route::hyper_only`], worked out at load from [`Route::needs`] and
/// [`crate::routing::Needs::HTTP1`]: an HTTP/2 upstream group). A request
/// whose input is refused stays (the fast front answers it as hyper would). The route looked
/// up to decide is handed on to [`admit`].
pub fn serve<'s, 'h>(snap: &'s Snapshot, head: &'h impl RequestHead) -> Serve<'s, 'h> {
    if super::answer::Flavor::of(head) != super::answer::Flavor::Problem {
        return Serve::Hyper("grpc");
    }
    if !snap.hyper_routes {
        return Serve::Here(None);
    }
    match routed(snap, head) {
        Ok(r) if r.route.is_some_and(|r| r.hyper_only) => Serve::Hyper("route"),
        Ok(r) => Serve::Here(Some(r)),
        Err(_) => Serve::Here(None),
    }
}

/// The input phase and the route lookup.
fn routed<'s, 'h>(
    snap: &'s Snapshot,
    head: &'h impl RequestHead,
) -> Result<Routed<'s, 'h>, ProxyError> {
    let input = input::check(head, &snap.config.server)?;
    let asked = cors::preflight_method(head);
    let route = route_for(
        snap,
        head,
        asked.as_ref(),
        input.host.as_deref(),
        &input.path,
    );
    Ok(Routed {
        input,
        asked,
        route,
    })
}

/// The input phase and the route lookup, for an evaluation that does not admit
/// ([`super::explain`]): the input, whether the request is a CORS preflight, its route.
pub(super) fn input_and_route<'s, 'h>(
    snap: &'s Snapshot,
    head: &'h impl RequestHead,
) -> Result<(Input<'h>, bool, Option<&'s Route>), ProxyError> {
    let Routed {
        input,
        asked,
        route,
    } = routed(snap, head)?;
    Ok((input, asked.is_some(), route))
}

/// A request's route. A CORS preflight (`asked`: the method it asks about) is routed by that
/// method: the route that will take the request answers for it, whatever its `methods` (which
/// rarely list OPTIONS).
fn route_for<'s>(
    snap: &'s Snapshot,
    head: &impl RequestHead,
    asked: Option<&http::Method>,
    host: Option<&str>,
    path: &str,
) -> Option<&'s Route> {
    asked
        .and_then(|m| snap.routes.find(host, m, path, head))
        .filter(|r| r.fronting.cors.is_some())
        .or_else(|| snap.routes.find(host, head.method(), path, head))
}

/// What the phases before the limits found, carried to the limits and past them.
pub struct Begun<'s> {
    found: Found<'s>,
    client: IpAddr,
    derived: bool,
    /// The host as received (`X-Forwarded-Host`, `preserve_host`).
    raw_host: Option<HeaderValue>,
}

impl<'s> Begun<'s> {
    /// The request's facts for its subjects (`counted`: the route's counted path of the
    /// trail's).
    fn facts<'a>(
        &'a self,
        trail: &'a Trail<'s>,
        counted: &'a str,
        peer: &Peer<'a>,
        server: &crate::config::ServerConfig,
    ) -> Facts<'a> {
        Facts {
            client: self.client,
            derived: self.derived,
            host: trail.host.as_deref(),
            path: counted,
            route: Some(self.found.route),
            consumer: trail.consumer.as_deref(),
            claims: self.found.verified.as_deref().map(|v| &v.claims),
            body: None,
            peer_trusted: crate::subject::is_trusted(
                peer.ip.to_canonical(),
                &server.trusted_proxies,
            ),
            peer_cert: peer.client_cert,
        }
    }
}

/// The phases before the limits: the trace, the client address, the input and route, a
/// route's client certificate, the access lists, the token, the consumer and plan.
#[allow(clippy::result_large_err)]
fn begin<'s, 'h, H: RequestHead + Sync>(
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    head: &'h H,
    peer: &Peer<'_>,
    trail: &mut Trail<'s>,
    pre: Option<Routed<'s, 'h>>,
) -> Result<Begun<'s>, Answer> {
    let server = &snap.config.server;
    if let Some(t) = &snap.traces {
        // First: a request refused on its input is traced too, in its client's trace.
        trail.trace = Some(Box::new(TraceTrail::begin(t, head)));
    }
    let Client {
        ip: client,
        derived,
    } = client_of(
        peer.ip,
        head,
        &server.trusted_proxies,
        server.real_ip_header.as_ref(),
        server.forwarded_header,
    );
    trail.client_ip = Some(client);
    if snap.config.log.access.is_on() {
        // Until the path is normalised: what a request refused before that asked for.
        trail.path = head.path().to_owned();
    }
    let Routed {
        input,
        asked,
        route,
    } = match pre {
        Some(r) => r,
        None => routed(snap, head)?,
    };
    trail.host = input.host;
    trail.path = input.path.into_owned();
    // A route demanding a client certificate, before anything is looked at or charged (as the
    // handshake of a `"required"` listener would, but as an answer: the connection may go on
    // to other routes). A question to explain is not a connection: not checked there.
    if let Some(r) = route.filter(|r| r.client_cert_required && peer.client_cert.is_none()) {
        trail.route = Some(r);
        return Err(ProxyError::ClientCertRequired.into());
    }
    let found = before_limits(
        snap,
        head,
        Client {
            ip: client,
            derived,
        },
        peer.client_cert,
        route,
        asked.is_some(),
        trail,
        Counting::Admission(ctx.worker()),
    )?;
    Ok(Begun {
        found,
        client,
        derived,
        raw_host: input.raw_host,
    })
}

/// The limits phase records into a trail of its own (the request's facts borrow the host and
/// path of the request's): merged back here, the trace along.
fn limits_trail<'s>(trail: &mut Trail<'s>) -> Trail<'s> {
    Trail {
        trace: trail.trace.take(),
        ..Trail::default()
    }
}

fn merge<'s>(trail: &mut Trail<'s>, limits: Trail<'s>) {
    trail.limit = limits.limit;
    trail.decision = limits.decision;
    trail.subject = limits.subject;
    trail.trace = limits.trace;
}

/// Runs the request's phases up to the upstream. `trail` records what was found on the way,
/// whatever the outcome. `body` is read before the limits on a route whose limits look into
/// it ([`super::body`]); the front sends what was read upstream first. `routed`: the input and
/// route [`serve`] found for this request (`pre`). (A snapshot without such a route admits
/// with [`admit_now`], awaiting nothing when it can.)
#[allow(clippy::too_many_arguments)]
pub async fn admit<'s, 'h, H: RequestHead + Sync>(
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    head: &'h H,
    body: &mut impl BodyPrefix,
    peer: &Peer<'_>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
    pre: Option<Routed<'s, 'h>>,
) -> Result<Admitted<'s>, Answer> {
    let begun = begin(snap, ctx, head, peer, trail, pre)?;
    let mut limits = limits_trail(trail);
    let gate = {
        let counted = begun.found.route.counted_path(&trail.path);
        let facts = begun.facts(trail, &counted, peer, &snap.config.server);
        let mut judge = Judge::Deciding {
            snap,
            ctx,
            trail: &mut limits,
        };
        evaluate::limits(&mut judge, &begun.found, head, facts, body).await
    };
    merge(trail, limits);
    let passed = gate?;
    match forward(snap, begun, head, peer, request_id, trail, passed) {
        Forward::Done(r) => r,
        Forward::Usage(cc, client) => {
            Err(
                super::usage::answer(snap, cc, trail.consumer.as_deref(), client)
                    .await
                    .into(),
            )
        }
    }
}

/// Admission decided without awaiting anything ([`admit_now`]), or what it waits for.
#[allow(clippy::large_enum_variant)]
pub enum Step<'s> {
    Done(Result<Admitted<'s>, Answer>),
    /// Finished by [`admit_waiting`].
    Wait(Box<Waiting<'s>>),
}

/// Where admission waits: for the store (a round trip), for what the store's decision left
/// to do (bans to share, a delay), for a usage answer.
#[allow(clippy::large_enum_variant)]
pub enum Waiting<'s> {
    Store {
        begun: Begun<'s>,
        limits: Trail<'s>,
        deciding: Deciding<'s>,
    },
    Later {
        begun: Begun<'s>,
        limits: Trail<'s>,
        gate: Gate<'s>,
        later: Later<'s>,
    },
    Usage(&'s ConsumersConfig, IpAddr),
}

/// [`admit`] without a future, for a snapshot whose limits never read a request body: every
/// phase runs here, and the store decides here when it can ([`Store::decide_here`]: the
/// in-process store, the local tier, a lease with units in hand, a cached denial). Only a
/// round trip, a ban to share, a delay or a usage answer makes it wait ([`Step::Wait`]).
#[allow(clippy::too_many_arguments)]
pub fn admit_now<'s, 'h, H: RequestHead + Sync>(
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    head: &'h H,
    peer: &Peer<'_>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
    pre: Option<Routed<'s, 'h>>,
) -> Step<'s> {
    let begun = match begin(snap, ctx, head, peer, trail, pre) {
        Ok(b) => b,
        Err(a) => return Step::Done(Err(a)),
    };
    let route = begun.found.route;
    let mut limits = limits_trail(trail);
    // The limits' facts borrow `begun` and the trail: what they decide is taken out first.
    #[allow(clippy::large_enum_variant)]
    enum Decided<'s> {
        Concluded(Result<(Gate<'s>, Later<'s>), ProxyError>),
        Ask(Deciding<'s>),
    }
    let decided = {
        let counted = route.counted_path(&trail.path);
        let facts = begun.facts(trail, &counted, peer, &snap.config.server);
        let plan = begun.found.caller.plan;
        match limits::prepare(snap, route, plan, head, &facts, &mut limits, Phase::All) {
            Err(e) => Decided::Concluded(Err(e)),
            Ok(Prepared::Gate(g)) => Decided::Concluded(Ok((g, Later::default()))),
            Ok(Prepared::Decide(deciding)) => {
                match snap.store.decide_here(&deciding.checks, ctx.worker()) {
                    Some(decided) => Decided::Concluded(limits::conclude(
                        snap,
                        ctx,
                        route,
                        head,
                        &facts,
                        &mut limits,
                        deciding,
                        decided,
                    )),
                    None => Decided::Ask(deciding),
                }
            }
        }
    };
    let gate = match decided {
        Decided::Ask(deciding) => {
            return Step::Wait(Box::new(Waiting::Store {
                begun,
                limits,
                deciding,
            }))
        }
        Decided::Concluded(Ok((gate, later))) if !later.is_empty() => {
            return Step::Wait(Box::new(Waiting::Later {
                begun,
                limits,
                gate,
                later,
            }))
        }
        Decided::Concluded(c) => c.map(|(gate, _)| gate),
    };
    merge(trail, limits);
    let passed = match passed(gate) {
        Ok(p) => p,
        Err(a) => return Step::Done(Err(a)),
    };
    match forward(snap, begun, head, peer, request_id, trail, passed) {
        Forward::Done(r) => Step::Done(r),
        Forward::Usage(cc, client) => Step::Wait(Box::new(Waiting::Usage(cc, client))),
    }
}

/// A gate as admission's result.
#[allow(clippy::result_large_err)]
fn passed(gate: Result<Gate<'_>, ProxyError>) -> Result<Passed<'_>, Answer> {
    match gate {
        Ok(Gate::Pass(p)) => Ok(p),
        Ok(Gate::Limited(answer)) => Err(answer),
        Err(e) => Err(e.into()),
    }
}

/// Finishes an admission [`admit_now`] could not: the same phases, from where it stopped.
#[allow(clippy::too_many_arguments)]
pub async fn admit_waiting<'s, H: RequestHead + Sync>(
    waiting: Box<Waiting<'s>>,
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    head: &H,
    peer: &Peer<'_>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
) -> Result<Admitted<'s>, Answer> {
    let (begun, limits, gate) = match *waiting {
        Waiting::Usage(cc, client) => {
            return Err(
                super::usage::answer(snap, cc, trail.consumer.as_deref(), client)
                    .await
                    .into(),
            )
        }
        Waiting::Later {
            begun,
            limits,
            gate,
            later,
        } => {
            later.run(snap, begun.found.route).await;
            (begun, limits, Ok(gate))
        }
        Waiting::Store {
            begun,
            mut limits,
            deciding,
        } => {
            let decided = snap.store.decide(&deciding.checks, ctx.worker()).await;
            let route = begun.found.route;
            let concluded = {
                let counted = route.counted_path(&trail.path);
                let facts = begun.facts(trail, &counted, peer, &snap.config.server);
                limits::conclude(
                    snap,
                    ctx,
                    route,
                    head,
                    &facts,
                    &mut limits,
                    deciding,
                    decided,
                )
            };
            let gate = match concluded {
                Ok((gate, later)) => {
                    if !later.is_empty() {
                        later.run(snap, route).await;
                    }
                    Ok(gate)
                }
                Err(e) => Err(e),
            };
            (begun, limits, gate)
        }
    };
    merge(trail, limits);
    let passed = passed(gate)?;
    match forward(snap, begun, head, peer, request_id, trail, passed) {
        Forward::Done(r) => r,
        Forward::Usage(cc, client) => {
            Err(
                super::usage::answer(snap, cc, trail.consumer.as_deref(), client)
                    .await
                    .into(),
            )
        }
    }
}

/// What follows a request's limits.
#[allow(clippy::large_enum_variant)]
enum Forward<'s> {
    Done(Result<Admitted<'s>, Answer>),
    /// A usage route's answer (awaited: it reads the store).
    Usage(&'s ConsumersConfig, IpAddr),
}

/// What follows the limits that passed: a charged preflight, an unknown key, a redirect, a
/// usage route, or the request admitted with its upstream head's edits.
fn forward<'s>(
    snap: &'s Snapshot,
    begun: Begun<'s>,
    head: &impl RequestHead,
    peer: &Peer<'_>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
    passed: Passed<'s>,
) -> Forward<'s> {
    let server = &snap.config.server;
    let Begun {
        found,
        client,
        raw_host,
        ..
    } = begun;
    let route = found.route;
    let consumers = found.consumers;
    match after_limits(&found) {
        Then::Forward => {}
        Then::Preflight(c) => {
            let mut answer = preflight_answer(c, head);
            passed.write_headers(route, &mut answer.headers);
            return Forward::Done(Err(answer));
        }
        Then::UnknownConsumer(cc) => {
            return Forward::Done(Err(
                ProxyError::UnknownConsumer(cc.source.to_string()).into()
            ))
        }
        Then::Redirect(r) => {
            let location = match evaluate::redirect_location(r, &found, head, trail) {
                Ok(l) => l,
                Err(e) => return Forward::Done(Err(e.into())),
            };
            let mut answer = Answer::from(ProxyError::Redirect {
                status: r.status,
                location,
            });
            passed.write_headers(route, &mut answer.headers);
            return Forward::Done(Err(answer));
        }
        Then::Usage(cc) => return Forward::Usage(cc, client),
    }
    let verified = found.verified;

    // The upstream head: same method, normalised path (or the route's rewrite of it), query
    // unchanged (but for a key stripped from it); the headers edited as below, after the front
    // removed the hop-by-hop ones.
    let upstream_path = match route.forwarded_path(&trail.path, server.path_params) {
        Ok(p) => p,
        Err(_) => return Forward::Done(Err(ProxyError::BadRewrite.into())),
    };
    let path_and_query = match upstream_query(consumers, head.query()) {
        Some(q) => format!("{upstream_path}?{q}"),
        None => upstream_path,
    };
    let mut edits = Edits {
        path_and_query,
        headers: Vec::new(),
        forwarded: Forwarded {
            request_id: Some((server.request_id_header.clone(), request_id.clone())),
            client: Some(peer.ip_value.clone()),
            https: peer.tls,
            client_cert: peer.client_cert.and_then(|c| c.xfcc.clone()),
            host: raw_host.clone(),
        },
    };
    if route.preserve_host {
        if let Some(h) = &raw_host {
            edits.set(&HOST, h.clone());
        }
    }
    if let Some(cc) = consumers {
        rewrite_headers(cc, trail.consumer.as_deref(), &mut edits);
    }
    let (json, trailer) = passed.reads_body();
    if json {
        // The cost is read from the body as it passes: it must come unencoded.
        edits.remove(&http::header::ACCEPT_ENCODING);
    }
    if trailer {
        // An HTTP/1.1 upstream sends trailers only to a client that says it takes them.
        edits.set(&http::header::TE, HeaderValue::from_static("trailers"));
    }
    // The route's own rules last: they never name what the gateway asserts (refused at load).
    if let Some(rules) = &route.fronting.request_headers {
        let vars = Vars {
            client_ip: Some(client),
            request_id: Some(request_id),
            consumer: trail.consumer.as_deref().map(|c| &*c.name),
            route: &route.name,
            claims: verified.as_deref().map(|v| &v.claims),
            host: trail.host.as_deref(),
            path: &trail.path,
            captured: Some(route),
            ..Vars::default()
        };
        edits.push_rules(rules, &vars);
    }
    Forward::Done(Ok(Admitted {
        route,
        passed,
        edits,
        client,
    }))
}
