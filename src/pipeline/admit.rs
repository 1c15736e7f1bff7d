//! Admission: one call runs a request's phases up to the upstream — input checks, the route,
//! the caller (client address, consumer and plan), the limits — and returns plain data: the
//! request *admitted* (its route, what passed the limits, the edits to its upstream head) or
//! the *answer* the gateway gives itself.

use std::net::IpAddr;

use http::header::{HeaderValue, HOST};

use super::answer::{Answer, ProxyError};
use super::consumer::{identify_caller, rewrite_headers, upstream_query, Caller};
use super::edits::{Edits, Forwarded};
use super::input;
use super::limits::{self, Gate};
use super::passed::Passed;
use super::record::Trail;
use super::settle::WorkerCtx;
use crate::head::RequestHead;
use crate::routing::Route;
use crate::state::Snapshot;
use crate::subject::client_ip;
use crate::traces::TraceTrail;

/// The connection a request came on, as the pipeline needs it.
pub struct Peer<'c> {
    /// The TCP peer's address.
    pub ip: IpAddr,
    /// The same, as a header value (for `X-Forwarded-For`).
    pub ip_value: &'c HeaderValue,
    /// Whether the connection is TLS (`X-Forwarded-Proto`).
    pub tls: bool,
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

/// Runs the request's phases up to the upstream. `trail` records what was found on the way,
/// whatever the outcome.
pub async fn admit<'s>(
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    head: &impl RequestHead,
    peer: &Peer<'_>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
) -> Result<Admitted<'s>, Answer> {
    let server = &snap.config.server;
    if let Some(t) = &snap.traces {
        // First: a request refused on its input is traced too, in its client's trace.
        trail.trace = Some(Box::new(TraceTrail::begin(t, head)));
    }
    let client = client_ip(peer.ip, head, &server.trusted_proxies);
    trail.client_ip = Some(client);
    if snap.config.log.access.is_on() {
        // Until the path is normalised: what a request refused before that asked for.
        trail.path = head.path().to_owned();
    }
    let input = input::check(head, server)?;
    trail.host = input.host;
    trail.path = input.path.into_owned();
    let route = snap
        .routes
        .find(trail.host.as_deref(), head.method(), &trail.path)
        .ok_or(ProxyError::NoRoute)?;
    trail.route = Some(route);
    if input::content_length(head).is_some_and(|len| len > route.max_body_size) {
        return Err(ProxyError::BodyTooLarge(route.max_body_size).into());
    }

    // Consumers: who is calling, and so which plan's limits apply (routes with `consumers`).
    let consumers = snap.config.consumers.as_ref().filter(|_| route.consumers);
    let caller = match consumers {
        Some(cc) => identify_caller(cc, &snap.consumers, route, head, trail)?,
        None => Caller::default(),
    };
    let passed = match limits::check(snap, ctx, route, caller.plan, head, client, trail).await? {
        Gate::Pass(p) => p,
        Gate::Limited(answer) => return Err(answer),
    };
    // An unknown key is refused only now: its request was charged to the route's own limits
    // (per address, say) first, so guessing keys is throttled like any other traffic.
    if let (true, Some(cc)) = (caller.reject_unknown, consumers) {
        return Err(ProxyError::UnknownConsumer(cc.source.to_string()).into());
    }

    // The upstream head: same method, normalised path, query unchanged (but for a key stripped
    // from it); the headers edited as below, after the front removed the hop-by-hop ones.
    let upstream_path = route.upstream_path(&trail.path);
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
            host: input.raw_host.clone(),
        },
    };
    if route.preserve_host {
        if let Some(h) = &input.raw_host {
            edits.set(&HOST, h.clone());
        }
    }
    if let Some(cc) = consumers {
        rewrite_headers(cc, trail.consumer, &mut edits);
    }
    Ok(Admitted {
        route,
        passed,
        edits,
        client,
    })
}
