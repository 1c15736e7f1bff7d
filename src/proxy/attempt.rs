//! One attempt to an upstream and how its result is reported: the route's own `http://` URL sent
//! with the worker's pool, a failure blamed on the client's body when it was the body's fault,
//! and the response head recorded in the route's metrics. The retry loop of a group
//! ([`super::retry`]) reports its attempts the same way.

use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::UpstreamClient;
use crate::pipeline::ProxyError;
use crate::request_body::{BodyFault, RequestBody};
use crate::routing::Route;

/// One attempt to a route's own `http://` URL with the worker's shared pool: no retries.
pub(super) async fn send_direct(
    client: &UpstreamClient,
    route: &Route,
    upstream_req: Request<RequestBody>,
    fault: &BodyFault,
) -> Result<Response<Incoming>, ProxyError> {
    let t0 = Instant::now();
    // The route's `timeout` runs while the attempt waits on the upstream, not while the client
    // sends its body (see `crate::request_body`).
    fault.begin_attempt();
    // Boxed for the same reason as the request's own future (see `Proxy::call`).
    let result = tokio::select! {
        r = Box::pin(client.request(upstream_req)) => Ok(r),
        () = fault.upstream_timeout(route.timeout) => Err(()),
    };
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
