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
use super::evaluate::{self, after_limits, before_limits, preflight_answer, Counting, Judge, Then};
use super::input::{self, Input};
use super::passed::Passed;
use super::record::Trail;
use super::settle::WorkerCtx;
use crate::fronting::cors;
use crate::fronting::Vars;
use crate::head::RequestHead;
use crate::routing::Route;
use crate::state::Snapshot;
use crate::subject::{client_of, Client, Facts};
use crate::traces::TraceTrail;

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

/// Runs the request's phases up to the upstream. `trail` records what was found on the way,
/// whatever the outcome. `body` is read before the limits on a route whose limits look into
/// it ([`super::body`]); the front sends what was read upstream first. `routed`: the input and
/// route [`serve`] found for this request (`pre`).
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
    let route = found.route;
    let counted_path = route.counted_path(&trail.path);
    let facts = Facts {
        client,
        derived,
        host: trail.host.as_deref(),
        path: &counted_path,
        route: Some(route),
        consumer: trail.consumer.as_deref(),
        claims: found.verified.as_deref().map(|v| &v.claims),
        body: None,
        peer_trusted: crate::subject::is_trusted(peer.ip.to_canonical(), &server.trusted_proxies),
        peer_cert: peer.client_cert,
    };
    // `facts` borrows the trail's host and path; the limits phase records into a trail of its
    // own, merged back below (the trace, whose store span it records, goes along).
    let mut limits_trail = Trail {
        trace: trail.trace.take(),
        ..Trail::default()
    };
    let mut judge = Judge::Deciding {
        snap,
        ctx,
        trail: &mut limits_trail,
    };
    let gate = evaluate::limits(&mut judge, &found, head, facts, body).await;
    trail.limit = limits_trail.limit;
    trail.decision = limits_trail.decision;
    trail.subject = limits_trail.subject;
    trail.trace = limits_trail.trace.take();
    let passed = gate?;
    let consumers = found.consumers;
    match after_limits(&found) {
        Then::Forward => {}
        Then::Preflight(c) => {
            let mut answer = preflight_answer(c, head);
            passed.write_headers(route, &mut answer.headers);
            return Err(answer);
        }
        Then::UnknownConsumer(cc) => {
            return Err(ProxyError::UnknownConsumer(cc.source.to_string()).into())
        }
        Then::Redirect(r) => {
            let location = evaluate::redirect_location(r, &found, head, trail)?;
            let mut answer = Answer::from(ProxyError::Redirect {
                status: r.status,
                location,
            });
            passed.write_headers(route, &mut answer.headers);
            return Err(answer);
        }
        Then::Usage(cc) => {
            return Err(
                super::usage::answer(snap, cc, trail.consumer.as_deref(), client)
                    .await
                    .into(),
            )
        }
    }
    let verified = found.verified;

    // The upstream head: same method, normalised path (or the route's rewrite of it), query
    // unchanged (but for a key stripped from it); the headers edited as below, after the front
    // removed the hop-by-hop ones.
    let upstream_path = route
        .forwarded_path(&trail.path, server.path_params)
        .map_err(|_| ProxyError::BadRewrite)?;
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
            host: input.raw_host.clone(),
        },
    };
    if route.preserve_host {
        if let Some(h) = &input.raw_host {
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
    Ok(Admitted {
        route,
        passed,
        edits,
        client,
    })
}
