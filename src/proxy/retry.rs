//! A request to a server group: pick a server, send, and on failure try further servers
//! (nginx's `proxy_next_upstream error timeout`, up to the group's `retries`).
//!
//! A failure (connect error, TLS error, the upstream keeping the request waiting for the route's
//! `timeout` — to connect, to take its bytes, or to answer once it was sent — or the connection
//! failing before the response head) counts against the server's passive health; the time the
//! client takes to send its body is never the upstream's.
//! The request goes to another server only when it can be sent again unchanged:
//! - nothing of it reached the failed server (a connect or TLS failure): any request, its body
//!   handed back unread by the upstream client (see [`crate::request_body`]);
//! - or it is idempotent (GET, HEAD, OPTIONS, PUT, DELETE) and has no body.
//!
//! A body that was streamed, even in part, is never replayed. A response, whatever its status,
//! is the answer (no retry on 5xx). Limits were charged once, before this; retries never are.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::HOST;
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::{Body as _, Incoming};

use crate::pipeline::ProxyError;
use crate::request_body::{BodyFault, BodySlot, Prefix, RequestBody};
use crate::routing::Route;
use crate::traces::context::AttemptOutcome;
use crate::traces::TraceTrail;
use crate::upstream::{ConnectError, Group, InFlight, Pick, Tried};

/// The retry rule, one for both HTTP/1 fronts (this one and `http1::exchange`): whether a
/// request whose attempt failed may be sent again — to another server, or (the fast front) on
/// a new connection when a reused idle one closed under it. Only when nothing of it reached
/// the server (`unsent`), or it is idempotent (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`) and
/// has no body: a `POST` that was written is never written twice.
pub fn may_send_again(method: &Method, bodyless: bool, unsent: bool) -> bool {
    let idempotent = matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    );
    unsent || (idempotent && bodyless)
}

/// What a request needs to be sent again.
struct Head {
    method: Method,
    version: Version,
    headers: HeaderMap,
}

/// Sends the request to `group` (already rewritten for upstream: headers, version), retrying as
/// the module comment says. `client` is the client's IP (for `ip_hash`). `upstream` is set, on
/// every attempt, to the server tried (`host:port`) and the time to its response head or
/// failure: after the call, the server that answered or failed last (for the access log).
#[allow(clippy::too_many_arguments)]
pub async fn send<'g>(
    group: &'g Group,
    worker: usize,
    route: &Route,
    parts: Parts,
    (body, prefix): (Incoming, Option<Prefix>),
    path_and_query: String,
    fault: &BodyFault,
    body_read_timeout: Duration,
    client: IpAddr,
    upstream: &mut Option<(&'g Arc<str>, Duration)>,
    mut trace: Option<&mut TraceTrail<'_>>,
) -> Result<(Response<Incoming>, Option<InFlight>), ProxyError> {
    let bodyless = body.is_end_stream() && prefix.is_none();
    let attempts = 1 + (group.retries as usize).min(group.servers.len().saturating_sub(1));
    let key = if group.hashes_ip() {
        crate::upstream::balance::hash_ip(client)
    } else {
        0
    };
    let mut head = Head {
        method: parts.method,
        version: parts.version,
        headers: parts.headers,
    };
    let mut body = Some(
        RequestBody::new(body, route.max_body_size, body_read_timeout, fault.clone())
            .with_prefix(prefix),
    );
    let mut tried = Tried::default();
    let mut last: Option<ProxyError> = None;
    for attempt in 0..attempts {
        let a = match group.pick(worker, key, &tried) {
            Pick::Server(a) => a,
            Pick::NoLive => return Err(last.unwrap_or(ProxyError::NoLiveUpstream)),
        };
        tried.add(a.index);
        if attempt > 0 {
            group.count_retry();
        }
        let server = a.server();
        let more = attempt + 1 < attempts;
        // The head for this attempt; a copy stays for the next one.
        let mut headers = if more {
            head.headers.clone()
        } else {
            std::mem::take(&mut head.headers)
        };
        if !route.preserve_host {
            headers.insert(HOST, server.host.clone());
        }
        if let Some(t) = trace.as_deref_mut() {
            t.stamp_attempt(&server.addr, &mut headers);
        }
        let uri = Uri::builder()
            .scheme(server.scheme.clone())
            .authority(server.authority.clone())
            .path_and_query(path_and_query.as_str())
            .build()
            .map_err(|_| ProxyError::BadRequest("the request target cannot be forwarded"))?;
        let slot: Option<BodySlot> = more.then(|| Arc::new(Mutex::new(None)));
        let mut req_body = body.take().unwrap_or_else(RequestBody::empty);
        if let Some(s) = &slot {
            req_body = req_body.give_back_into(s.clone());
        }
        let mut req = Request::new(req_body);
        *req.method_mut() = head.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = head.version;
        *req.headers_mut() = headers;

        let in_flight = group.in_flight(a.index);
        let t0 = Instant::now();
        // The route's `timeout` runs while the attempt waits on the upstream, not while the
        // client sends its body (see `crate::request_body`).
        fault.begin_attempt();
        let result = tokio::select! {
            r = Box::pin(group.client(worker).request(req)) => Ok(r),
            () = fault.upstream_timeout(route.timeout) => Err(()),
        };
        *upstream = Some((&server.addr, t0.elapsed()));
        let metrics = server.state.metrics();
        // (error, whether nothing reached the server)
        let (error, unsent) = match result {
            Ok(Ok(response)) => {
                if let Some(t) = trace.as_deref_mut() {
                    t.end_attempt(AttemptOutcome::Status(response.status().as_u16()));
                }
                super::attempt::record_response(route, t0, response.status());
                if let Some(m) = metrics {
                    m.response(response.status());
                }
                a.succeeded();
                return Ok((response, in_flight));
            }
            Err(_) => {
                route.metrics.upstream_timeouts.increment(1);
                (ProxyError::UpstreamTimeout(route.timeout), false)
            }
            Ok(Err(e)) => {
                if let Some(e) = super::attempt::client_body_error(fault, route) {
                    if let Some(t) = trace.as_deref_mut() {
                        t.end_attempt(AttemptOutcome::of_error(&e));
                    }
                    return Err(e);
                }
                match ConnectError::find(&e) {
                    Some(c) if c.is_tls() => {
                        route.metrics.upstream_tls_errors.increment(1);
                        (ProxyError::UpstreamTls(tls_detail(c)), true)
                    }
                    Some(_) => {
                        route.metrics.upstream_connect_errors.increment(1);
                        (ProxyError::UpstreamConnect, true)
                    }
                    None if e.is_connect() => {
                        route.metrics.upstream_connect_errors.increment(1);
                        (ProxyError::UpstreamConnect, true)
                    }
                    None => {
                        route.metrics.upstream_other_errors.increment(1);
                        (ProxyError::Upstream(super::attempt::error_chain(&e)), false)
                    }
                }
            }
        };
        drop(in_flight);
        if let Some(t) = trace.as_deref_mut() {
            t.end_attempt(AttemptOutcome::of_error(&error));
        }
        if let Some(m) = metrics {
            m.error();
        }
        tracing::debug!(upstream = &*group.name, server = %server.authority, error = %error, "attempt failed");
        a.failed();
        if !more || !may_send_again(&head.method, bodyless, unsent) {
            return Err(error);
        }
        // The body for the next attempt: none if there never was one; else the client's
        // stream, if the failed attempt gave it back unread.
        if !bodyless {
            match slot.and_then(|s| s.lock().ok().and_then(|mut g| g.take())) {
                Some((inner, prefix)) => {
                    body = Some(
                        RequestBody::new(
                            inner,
                            route.max_body_size,
                            body_read_timeout,
                            fault.clone(),
                        )
                        .with_prefix(prefix),
                    )
                }
                None => return Err(error),
            }
        }
        last = Some(error);
    }
    Err(last.unwrap_or(ProxyError::NoLiveUpstream))
}

/// The 502 detail of a TLS failure: rustls's reason (e.g. "invalid peer certificate:
/// UnknownIssuer"), without the layers around it.
fn tls_detail(e: &ConnectError) -> String {
    match e {
        ConnectError::Tls(io) => match io.get_ref() {
            Some(inner) => inner.to_string(),
            None => io.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unsent_or_idempotent_bodyless_requests_go_again() {
        assert!(may_send_again(&Method::GET, true, false));
        assert!(may_send_again(&Method::DELETE, true, false));
        assert!(!may_send_again(&Method::GET, false, false));
        assert!(!may_send_again(&Method::POST, true, false));
        assert!(!may_send_again(&Method::PATCH, true, false));
        assert!(may_send_again(&Method::POST, false, true));
    }
}
