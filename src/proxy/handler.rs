//! One request through the gateway: framing and input checks, path normalisation, routing,
//! limits, then the upstream call with its response streamed back (or, for an accepted protocol
//! upgrade, a tunnel).

use std::borrow::Cow;
use std::time::{Duration, Instant};

use http::header::{HeaderValue, CONTENT_LENGTH, HOST};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Either;
use hyper::body::Incoming;

use super::attempt::send_direct;
use super::charge::{charge_after, owed_after, Abandoned};
use super::consumer::{identify_caller, rewrite_headers, upstream_query, Caller};
use super::error::ProxyError;
use super::headers::{
    append_forwarded_for, drop_underscored, strip_hop_by_hop, X_FORWARDED_HOST, X_FORWARDED_PROTO,
};
use super::input::{check_framing, normalized_path, request_host};
use super::limits::{self, Gate, Passed};
use super::trail::Trail;
use super::{upgrade, ResBody, UpstreamBody, UpstreamClient};
use crate::access_log::Record;
use crate::log_throttle::Throttles;
use crate::request_body::{BodyFault, RequestBody};
use crate::routing::Target;
use crate::server::ConnInfo;
use crate::state::{Shared, Snapshot};
use crate::subject::client_ip;

/// Answers one request on the proxy listener, with this worker's upstream client. Returns the
/// response and, when the access log is on, the request's record (sent when its body ends).
pub async fn handle(
    shared: &Shared,
    client: &UpstreamClient,
    worker: usize,
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
    let mut trail = Trail::default();
    let result = if request.conflicting_framing() {
        if logging {
            trail.path = req.uri().path().to_owned();
        }
        Err(ProxyError::BadFraming(
            "a request may not carry both Content-Length and Transfer-Encoding",
        ))
    } else if method == Method::CONNECT && req.version() <= Version::HTTP_11 {
        // The connection's framing scanner stops following at a CONNECT (what follows a granted
        // one is not HTTP), so the connection must not serve another request after it.
        Err(ProxyError::BadFraming("CONNECT is not supported"))
    } else {
        forward(client, worker, &snap, &conn, req, &request_id, &mut trail).await
    };
    let matched = trail.route;
    let mut response = match result {
        Ok(r) => r,
        Err(e) => {
            let status = e.status();
            if status.is_server_error() {
                // One line a second per status at most: a dead upstream fails every request.
                static FAILED: Throttles<6> = Throttles::new();
                if let Some(suppressed) = FAILED.allow(usize::from(status.as_u16() - 500)) {
                    tracing::warn!(route = matched.map(|r| &*r.name), status = status.as_u16(), error = %e, request_id = request_id.to_str().unwrap_or(""), suppressed, "request failed");
                }
            }
            if e.closes_connection() {
                conn.state.linger_on_close();
            }
            e.to_response(&request_id)
        }
    };
    let status = response.status();
    let metrics = matched.map_or(&shared.unmatched, |r| &r.metrics);
    metrics.response(status);
    metrics
        .request_duration
        .record(started.elapsed().as_secs_f64());
    tracing::debug!(
        route = matched.map_or(crate::metrics::UNMATCHED_ROUTE, |r| &*r.name),
        method = %method,
        status = status.as_u16(),
        peer = %conn.peer,
        elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    let record = logging.then(|| {
        Box::new(Record {
            started,
            duration: Duration::ZERO,
            request_id: request_id.clone(),
            client_ip: trail
                .client_ip
                .unwrap_or_else(|| conn.peer.ip().to_canonical()),
            method,
            host: trail.host,
            path: trail.path,
            status: status.as_u16(),
            bytes_sent: 0,
            upstream: trail.upstream.map(|(a, d)| (a.clone(), d)),
            route: matched.map(|r| r.name.clone()),
            limit: trail.limit.map(|l| l.name.clone()),
            decision: trail.decision,
            consumer: trail.consumer.map(|c| c.name.clone()),
        })
    });
    response.headers_mut().insert(id_header, request_id);
    (response, record)
}

#[allow(clippy::too_many_arguments)]
async fn forward<'s>(
    client: &UpstreamClient,
    worker: usize,
    snap: &'s Snapshot,
    conn: &ConnInfo,
    req: Request<Incoming>,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
) -> Result<Response<ResBody>, ProxyError> {
    let server = &snap.config.server;
    let (mut parts, body) = req.into_parts();
    if snap.config.log.access.is_on() {
        trail.client_ip = Some(client_ip(
            conn.peer.ip(),
            &parts.headers,
            &server.trusted_proxies,
        ));
        // Until the path is normalised: what a request refused before that asked for.
        trail.path = parts.uri.path().to_owned();
    }
    if parts.version <= Version::HTTP_11 {
        check_framing(&parts)?;
    }
    let uri_len = parts.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if uri_len > server.max_uri_bytes {
        return Err(ProxyError::UriTooLong(server.max_uri_bytes));
    }
    let (host, raw_host) = request_host(&parts)?;
    trail.host = host.map(Cow::into_owned);
    let path = normalized_path(parts.uri.path(), server.path_params)?;
    trail.path = path.into_owned();
    let route = snap
        .routes
        .find(trail.host.as_deref(), &parts.method, &trail.path)
        .ok_or(ProxyError::NoRoute)?;
    trail.route = Some(route);

    if let Some(len) = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        if len > route.max_body_size {
            return Err(ProxyError::BodyTooLarge(route.max_body_size));
        }
    }
    drop_underscored(&mut parts.headers);

    // Consumers: who is calling, and so which plan's limits apply (routes with `consumers`).
    let consumers = snap.config.consumers.as_ref().filter(|_| route.consumers);
    let caller = match consumers {
        Some(cc) => identify_caller(cc, &snap.consumers, route, &parts, trail)?,
        None => Caller::default(),
    };
    let Passed {
        applied,
        limited,
        unmetered,
        mut leases,
    } = match limits::check(snap, route, caller.plan, &parts, conn, request_id, trail).await? {
        Gate::Pass(p) => p,
        Gate::Limited(res) => return Ok(res),
    };

    // An unknown key is refused only now: its request was charged to the route's own limits
    // (per address, say) first, so guessing keys is throttled like any other traffic.
    if let (true, Some(cc)) = (caller.reject_unknown, consumers) {
        return Err(ProxyError::UnknownConsumer(cc.source.to_string()));
    }

    // The upstream request: same method, normalised path, query unchanged (but for a key
    // stripped from it).
    let upstream_path = route.upstream_path(&trail.path);
    let query = upstream_query(consumers, parts.uri.query());
    let pq = match query {
        Some(q) => format!("{upstream_path}?{q}"),
        None => upstream_path,
    };
    // An upgrade request keeps its `Upgrade`; the client side's switch is taken from the request.
    let upgrade_proto = upgrade::requested(&parts);
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(proto) = &upgrade_proto {
        upgrade::restore_headers(&mut parts.headers, proto.clone());
    }
    if route.preserve_host {
        if let Some(h) = &raw_host {
            parts.headers.insert(HOST, h.clone());
        }
    }
    if let Some(cc) = consumers {
        rewrite_headers(cc, trail.consumer, &mut parts.headers);
    }
    parts
        .headers
        .insert(&server.request_id_header, request_id.clone());
    append_forwarded_for(&mut parts.headers, &conn.peer_ip);
    parts.headers.insert(
        X_FORWARDED_PROTO.clone(),
        HeaderValue::from_static(if conn.tls { "https" } else { "http" }),
    );
    if let Some(h) = raw_host {
        parts.headers.insert(X_FORWARDED_HOST.clone(), h);
    }
    parts.version = Version::HTTP_11;
    let fault = BodyFault::default();
    // Limits charged after the response: the checks they are charged under.
    let decided = match (&limited, &unmetered) {
        (Some((c, d, _)), _) => Some((c.as_slice(), Some(d.as_slice()))),
        (None, Some(c)) => Some((c.as_slice(), None)),
        (None, None) => None,
    }
    .filter(|_| applied.iter().any(|l| l.after.is_some()));
    // From here the upstream may do the work: a client that leaves before its head is charged.
    let abandoned = decided.and_then(|(c, d)| Abandoned::arm(&snap.store, &applied, c, d));
    let sent = match &route.target {
        Target::Url { url, host, addr } => {
            parts.uri = Uri::builder()
                .scheme(url.scheme.clone())
                .authority(url.authority.clone())
                .path_and_query(pq)
                .build()
                .map_err(|_| ProxyError::BadRequest("the request target cannot be forwarded"))?;
            if !route.preserve_host {
                parts.headers.insert(HOST, host.clone());
            }
            let body = RequestBody::new(
                body,
                route.max_body_size,
                server.body_read_timeout,
                fault.clone(),
            );
            let upstream_req = Request::from_parts(parts, body);
            let t0 = Instant::now();
            let sent = send_direct(client, route, upstream_req, &fault).await;
            trail.upstream = Some((addr, t0.elapsed()));
            sent.map(|r| (r, None))
        }
        Target::Group(group) => {
            let ip = if group.hashes_ip() {
                client_ip(conn.peer.ip(), &parts.headers, &server.trusted_proxies)
            } else {
                conn.peer.ip()
            };
            // Boxed: a group's retry loop is a large future, and would otherwise be part of
            // every request's future (see `Proxy::call`), routes with a plain URL included.
            Box::pin(super::retry::send(
                group,
                worker,
                route,
                parts,
                body,
                pq,
                &fault,
                server.body_read_timeout,
                ip,
                &mut trail.upstream,
            ))
            .await
        }
    };
    // The upstream's head arrived, or the exchange failed (never charged): the client's
    // leaving is no longer what ends it.
    if let Some(a) = abandoned {
        a.disarm();
    }
    let (response, in_flight) = sent?;
    let (mut rparts, rbody) = response.into_parts();
    // An intermediary answers in its own version (RFC 9110 §2.5): an HTTP/1.0 upstream must not
    // turn the client's answer into an HTTP/1.0 one, which would also end its keep-alive. (hyper
    // still answers an HTTP/1.0 client in HTTP/1.0.)
    rparts.version = Version::HTTP_11;
    let upstream_upgrade = rparts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let switched_to = rparts.headers.get(http::header::UPGRADE).cloned();
    strip_hop_by_hop(&mut rparts.headers);
    // Limits charged after the response: what this answer costs (check before, charge after).
    if let Some((checks, decisions)) = decided {
        let owed = owed_after(
            &applied,
            checks,
            decisions,
            rparts.status,
            &mut rparts.headers,
        );
        charge_after(&snap.store, owed).await;
    }
    if rparts.status == StatusCode::SWITCHING_PROTOCOLS {
        match (upgrade_proto, client_upgrade, upstream_upgrade, switched_to) {
            (Some(_), Some(client), Some(upstream), Some(proto)) => {
                conn.state.set_upgraded();
                upgrade::restore_headers(&mut rparts.headers, proto);
                upgrade::tunnel(
                    client,
                    upstream,
                    conn.state.clone(),
                    server.idle_timeout,
                    route.name.clone(),
                    leases.take(),
                );
            }
            _ => {
                route.metrics.upstream_other_errors.increment(1);
                return Err(ProxyError::Upstream(
                    "switched protocols without an upgrade to switch to".to_owned(),
                ));
            }
        }
    }
    if let (Some((checks, decisions, outcome)), true) = (&limited, route.rate_limit_headers) {
        outcome.write_headers(&mut rparts.headers, checks, decisions);
    }
    Ok(Response::from_parts(
        rparts,
        Either::Left(UpstreamBody::new(rbody, in_flight).holding(leases)),
    ))
}
