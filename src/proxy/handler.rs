//! One request through the gateway: framing and input checks, path normalisation, routing,
//! limits, then the upstream call with its response streamed back (or, for an accepted protocol
//! upgrade, a tunnel).

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Either;
use hyper::body::Incoming;
use smallvec::SmallVec;

use super::body::{BodyFault, RequestBody};
use super::charge::{charge_after, new_lease, owed_after, Leases};
use super::error::ProxyError;
use super::headers::{
    append_forwarded_for, drop_underscored, strip_hop_by_hop, X_CONSUMER, X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
};
use super::{upgrade, ResBody, UpstreamBody, UpstreamClient};
use crate::access_log::{LimitDecision, Record};
use crate::config::{ConsumersConfig, KeySource, OnError, OnMissing, OnUnknown, SubjectSpec};
use crate::consumers::{identify, strip_query_param, Consumer, Identity};
use crate::limiter::{Check, CompiledLimit, Decision, Op, Outcome, SubjectDigest, Verdict};
use crate::log_throttle::Throttles;
use crate::routing::{Route, Target};
use crate::server::ConnInfo;
use crate::state::{Shared, Snapshot};
use crate::store::Store;
use crate::subject::{client_ip, ip_digest, subject_of};
use crate::top::Who;

/// What the handler learns about a request on its way through, for the metrics and the access
/// log. Filled by moving what the request path computes anyway; the few fields only the access
/// log needs (`client_ip` for routes without limits, the raw path of a refused request) are
/// computed only when the log is on.
#[derive(Default)]
struct Trail<'s> {
    route: Option<&'s Route>,
    host: Option<String>,
    path: String,
    client_ip: Option<IpAddr>,
    /// The server that answered (or failed) the last attempt, as `host:port`, and the time that
    /// attempt took to its response head or failure; `None` if no upstream was called.
    upstream: Option<(&'s Arc<str>, Duration)>,
    /// The limit that denied (or the shadow limit that would have).
    limit: Option<&'s CompiledLimit>,
    decision: Option<LimitDecision>,
    /// The consumer the request's key belongs to (routes with `consumers = true`).
    consumer: Option<&'s Consumer>,
}

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

/// Refuses framings that smuggle requests past one party or another: `Content-Length` with
/// `Transfer-Encoding`, a `Transfer-Encoding` other than a lone `chunked`, and conflicting
/// `Content-Length`s.
fn check_framing(req: &Parts) -> Result<(), ProxyError> {
    let h = &req.headers;
    let mut te = h.get_all(TRANSFER_ENCODING).iter();
    if let Some(first) = te.next() {
        if h.contains_key(CONTENT_LENGTH) {
            return Err(ProxyError::BadFraming(
                "a request may not carry both Content-Length and Transfer-Encoding",
            ));
        }
        if te.next().is_some()
            || !first
                .as_bytes()
                .trim_ascii()
                .eq_ignore_ascii_case(b"chunked")
        {
            return Err(ProxyError::BadFraming(
                "only Transfer-Encoding: chunked is accepted",
            ));
        }
    }
    let mut cl = h.get_all(CONTENT_LENGTH).iter();
    if let Some(first) = cl.next() {
        if cl.any(|v| v != first)
            || first
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .is_none()
        {
            return Err(ProxyError::BadFraming(
                "conflicting or malformed Content-Length",
            ));
        }
    }
    Ok(())
}

/// The request's host (without port and one trailing dot, lower-case) for routing, and the raw
/// value for `X-Forwarded-Host`. HTTP/1.1 requests need exactly one `Host`.
fn request_host(req: &Parts) -> Result<(Option<Cow<'_, str>>, Option<HeaderValue>), ProxyError> {
    let mut hosts = req.headers.get_all(HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadRequest("duplicate Host header"));
    }
    let raw: Option<HeaderValue> = match (header, req.uri.authority()) {
        (_, Some(a)) => HeaderValue::from_str(a.as_str()).ok(),
        (Some(h), None) => Some(h.clone()),
        (None, None) => {
            if req.version == Version::HTTP_11 {
                return Err(ProxyError::BadRequest("missing Host header"));
            }
            None
        }
    };
    let host = match &raw {
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| ProxyError::BadRequest("invalid Host header"))?;
            let h = crate::routing::route_host(s)
                .ok_or(ProxyError::BadRequest("invalid Host header"))?;
            Some(Cow::Owned(h))
        }
        None => None,
    };
    Ok((host, raw))
}

/// What a check asks of the store: a concurrency limit takes a slot under the request's lease
/// (one lease id per request, made at its first concurrency limit); the others are decided.
fn op_of(l: &CompiledLimit, lease: &mut u64) -> Op {
    if l.policy.algorithm == crate::config::Algorithm::Concurrency {
        if *lease == 0 {
            *lease = new_lease();
        }
        Op::Acquire(*lease)
    } else {
        Op::Decide
    }
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
    let path = crate::path::normalize(parts.uri.path()).map_err(|e| match e {
        crate::path::PathError::NotAbsolute => {
            ProxyError::BadRequest("the request target must be an absolute path")
        }
        crate::path::PathError::BadEscape => {
            ProxyError::BadRequest("malformed percent-encoding in the path")
        }
        crate::path::PathError::AmbiguousEscape => {
            ProxyError::BadRequest("encoded '/', '\\' or NUL in the path is not accepted")
        }
        crate::path::PathError::Backslash => {
            ProxyError::BadRequest("'\\' in the path is not accepted")
        }
        crate::path::PathError::AboveRoot => {
            ProxyError::BadRequest("the path climbs above the root")
        }
    })?;
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
    let mut identity = Identity::Unknown;
    // The plan's limits and the subject they count: the consumer, or (an unknown key under
    // `on_unknown = "<plan>"`) the client address.
    let mut plan: Option<(&'s [Arc<CompiledLimit>], Option<SubjectDigest>)> = None;
    let mut reject_unknown = false;
    if let Some(cc) = consumers {
        identity = identify(&cc.source, &cc.table, &parts.headers, parts.uri.query())
            .map_err(|_| ProxyError::RepeatedSubject(cc.source.to_string()))?;
        match identity {
            Identity::Known(c) => {
                trail.consumer = Some(c);
                plan = route
                    .plan_limits
                    .get(c.plan)
                    .map(|l| (l.as_slice(), Some(c.subject)));
            }
            Identity::Unknown => match cc.on_unknown {
                OnUnknown::Reject => reject_unknown = true,
                OnUnknown::Plan(p) => {
                    plan = route.plan_limits.get(p).map(|l| (l.as_slice(), None));
                }
            },
        }
    }

    // Limits: every limit of the route (and of the consumer's plan), decided together by the
    // store.
    let mut limited: Option<(SmallVec<[Check<'s>; 4]>, Vec<Decision>, Outcome)> = None;
    // Checks of a request the store failed open on (still charged after the response).
    let mut unmetered: Option<SmallVec<[Check<'s>; 4]>> = None;
    // Concurrency slots the request holds (released when dropped, on every path).
    let mut leases: Option<Leases> = None;
    // The limits applied, in the order of the checks: the route's, then the plan's.
    let applied: SmallVec<[&'s Arc<CompiledLimit>; 4]> = route
        .limits
        .iter()
        .chain(plan.into_iter().flat_map(|(l, _)| l.iter()))
        .collect();
    if !applied.is_empty() {
        let client = match trail.client_ip {
            Some(ip) => ip,
            None => {
                let ip = client_ip(conn.peer.ip(), &parts.headers, &server.trusted_proxies);
                trail.client_ip = Some(ip);
                ip
            }
        };
        let mut checks: SmallVec<[Check<'s>; 4]> = SmallVec::new();
        // Bit i: limit i counts a header or query subject by the client address because the
        // request lacks it (for `/-/top`; limits past the 64th are shown by key).
        let mut by_ip: u64 = 0;
        let mut lease = 0;
        for (i, l) in route.limits.iter().enumerate() {
            let subject = subject_of(&l.subject, &parts.headers, parts.uri.query(), client)
                .map_err(|_| ProxyError::RepeatedSubject(l.subject.to_string()))?;
            let subject = match subject {
                Some(s) => s,
                None if l.on_missing == OnMissing::Reject => {
                    return Err(ProxyError::MissingSubject(l.subject.to_string()));
                }
                None => {
                    by_ip |= 1u64.checked_shl(i as u32).unwrap_or(0);
                    ip_digest(client)
                }
            };
            checks.push(Check {
                limit: l,
                subject,
                op: op_of(l, &mut lease),
            });
        }
        if let Some((limits, subject)) = plan {
            let subject = subject.unwrap_or_else(|| ip_digest(client));
            for l in limits {
                checks.push(Check {
                    limit: l,
                    subject,
                    op: op_of(l, &mut lease),
                });
            }
        }
        match snap.store.decide(&checks).await {
            Ok(decisions) => {
                let outcome = Outcome::of(&checks, &decisions);
                match outcome.verdict {
                    Verdict::Limited {
                        limit,
                        retry_after_secs,
                    } => {
                        if let Some(c) = checks.get(limit) {
                            let counted_by_ip = by_ip & 1u64.checked_shl(limit as u32).unwrap_or(0);
                            let who = match &c.limit.subject {
                                _ if c.limit.plan.is_some() => match identity {
                                    Identity::Known(_) => Who::Header,
                                    Identity::Unknown => Who::Ip(client),
                                },
                                SubjectSpec::Global => Who::Global,
                                SubjectSpec::Ip => Who::Ip(client),
                                _ if counted_by_ip != 0 => Who::Ip(client),
                                SubjectSpec::Query(_) => Who::Query,
                                SubjectSpec::Header(_) => Who::Header,
                            };
                            c.limit.top.record(c.subject, who);
                            trail.limit = Some(c.limit);
                        }
                        trail.decision = Some(LimitDecision::Limited);
                        let mut res = ProxyError::Limited {
                            route: route.name.clone(),
                            limit: checks
                                .get(limit)
                                .map_or_else(|| Arc::from(""), |c| c.limit.name.clone()),
                            retry_after: retry_after_secs,
                            violated: checks
                                .iter()
                                .zip(&decisions)
                                .filter(|(c, d)| !c.limit.shadow && !d.allowed)
                                .map(|(c, _)| c.limit.name.clone())
                                .collect(),
                        }
                        .to_response(request_id);
                        if route.rate_limit_headers {
                            outcome.write_headers(res.headers_mut(), &checks, &decisions);
                        }
                        return Ok(res);
                    }
                    Verdict::Forward { delay } => {
                        leases = Leases::taken(&snap.store, &applied, &checks, &decisions);
                        let shadow = checks
                            .iter()
                            .zip(&decisions)
                            .find(|(c, d)| c.limit.shadow && !d.allowed);
                        trail.decision = Some(if !delay.is_zero() {
                            LimitDecision::Delayed
                        } else if let Some((c, _)) = shadow {
                            trail.limit = Some(c.limit);
                            LimitDecision::Shadow
                        } else {
                            LimitDecision::Allowed
                        });
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                    }
                }
                limited = Some((checks, decisions, outcome));
            }
            Err(e) => {
                // One line a second per kind at most: an outage fails every request.
                static STORE_FAILED: Throttles<5> = Throttles::new();
                if let Some(suppressed) = STORE_FAILED.allow(e.kind as usize) {
                    tracing::warn!(route = &*route.name, error = %e, suppressed, "rate-limit store failed");
                }
                match snap.config.store.on_error {
                    OnError::Allow => {
                        trail.decision = Some(LimitDecision::FailOpen);
                        checks
                            .iter()
                            .for_each(|c| c.limit.metrics.fail_open.increment(1));
                        unmetered = Some(checks);
                    }
                    OnError::Deny => {
                        trail.decision = Some(LimitDecision::FailClosed);
                        checks
                            .iter()
                            .for_each(|c| c.limit.metrics.fail_closed.increment(1));
                        return Err(ProxyError::StoreUnavailable);
                    }
                }
            }
        }
    }

    // An unknown key is refused only now: its request was charged to the route's own limits
    // (per address, say) first, so guessing keys is throttled like any other traffic.
    if let (true, Some(cc)) = (reject_unknown, consumers) {
        return Err(ProxyError::UnknownConsumer(cc.source.to_string()));
    }

    // The upstream request: same method, normalised path, query unchanged (but for a key
    // stripped from it).
    let upstream_path = route.upstream_path(&trail.path);
    let query = match (consumers, parts.uri.query()) {
        (
            Some(ConsumersConfig {
                source: KeySource::Query(name),
                strip_key: true,
                ..
            }),
            Some(q),
        ) => strip_query_param(q, name).map(Cow::Owned),
        (_, q) => q.map(Cow::Borrowed),
    };
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
        // Only the gateway says who the consumer is.
        parts.headers.remove(&X_CONSUMER);
        if let Some(c) = trail.consumer {
            if let Ok(v) = HeaderValue::from_str(&c.name) {
                parts.headers.insert(X_CONSUMER.clone(), v);
            }
        }
        if let (true, KeySource::Header(h)) = (cc.strip_key, &cc.source) {
            parts.headers.remove(h);
        }
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
    let (response, in_flight) = match &route.target {
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
            (sent?, None)
        }
        Target::Group(group) => {
            let ip = if group.hashes_ip() {
                client_ip(conn.peer.ip(), &parts.headers, &server.trusted_proxies)
            } else {
                conn.peer.ip()
            };
            super::retry::send(
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
            )
            .await?
        }
    };
    let (mut rparts, rbody) = response.into_parts();
    // An intermediary answers in its own version (RFC 9110 §2.5): an HTTP/1.0 upstream must not
    // turn the client's answer into an HTTP/1.0 one, which would also end its keep-alive. (hyper
    // still answers an HTTP/1.0 client in HTTP/1.0.)
    rparts.version = Version::HTTP_11;
    let upstream_upgrade = rparts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let switched_to = rparts.headers.get(http::header::UPGRADE).cloned();
    strip_hop_by_hop(&mut rparts.headers);
    // Limits charged after the response: what this answer costs (check before, charge after).
    let decided = match (&limited, &unmetered) {
        (Some((c, d, _)), _) => Some((c.as_slice(), Some(d.as_slice()))),
        (None, Some(c)) => Some((c.as_slice(), None)),
        (None, None) => None,
    };
    if let Some((checks, decisions)) = decided.filter(|_| applied.iter().any(|l| l.after.is_some()))
    {
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

/// One attempt to a route's own `http://` URL with the worker's shared pool: no retries.
async fn send_direct(
    client: &UpstreamClient,
    route: &Route,
    upstream_req: Request<RequestBody>,
    fault: &BodyFault,
) -> Result<Response<Incoming>, ProxyError> {
    let t0 = Instant::now();
    // Boxed for the same reason as the request's own future (see `Proxy::call`).
    let result = tokio::time::timeout(route.timeout, Box::pin(client.request(upstream_req))).await;
    let response = match result {
        Err(_) => {
            route.metrics.upstream_timeouts.increment(1);
            return Err(ProxyError::UpstreamTimeout(route.timeout));
        }
        Ok(Err(e)) => {
            if let Some(e) = client_body_error(fault, route) {
                return Err(e);
            }
            if e.is_connect() {
                route.metrics.upstream_connect_errors.increment(1);
                return Err(ProxyError::UpstreamConnect);
            }
            route.metrics.upstream_other_errors.increment(1);
            return Err(ProxyError::Upstream(error_chain(&e)));
        }
        Ok(Ok(r)) => r,
    };
    record_response(route, t0, response.status());
    Ok(response)
}

/// When the upstream call failed because of the client's body (too large, too slow, malformed),
/// the client's error; the upstream is not to blame.
pub(super) fn client_body_error(fault: &BodyFault, route: &Route) -> Option<ProxyError> {
    if fault.too_large() {
        Some(ProxyError::BodyTooLarge(route.max_body_size))
    } else if fault.timed_out() {
        Some(ProxyError::BodyTimeout)
    } else if fault.client_failed() {
        Some(ProxyError::BadBody)
    } else {
        None
    }
}

/// Records a response head received from the upstream. Latency of responses received only:
/// connect failures and timeouts would drag the quantiles toward zero (or the timeout); they are
/// counted as upstream errors.
pub(super) fn record_response(route: &Route, t0: Instant, status: StatusCode) {
    route
        .metrics
        .upstream_duration
        .record(t0.elapsed().as_secs_f64());
    route.metrics.upstream_response(status);
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
