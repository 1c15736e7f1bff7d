//! The parts of a request's life cycle past admission that every front shares: the one place
//! an upstream failure ([`crate::upstream::Failure`], typed on the upstream side) becomes the
//! gateway's answer (502 or 504, problem+json), and the one way a gateway's own answer is made
//! ready to write ([`answer`]: the failure log, the rendering, the route's response phase, the
//! exchange's record, the request id).

use http::header::{HeaderMap, HeaderName};
use http::StatusCode;

use super::answer::{Answer, Flavor, ProxyError};
use super::record::{Exchange, Trail};
use crate::access_log::Record;
use crate::metrics::RouteHandles;
use crate::state::Shared;
use crate::upstream::{Failure, Stop};

/// A gateway's own answer, ready for a front to write.
pub struct Rendered {
    /// The status on the wire (200 for a gRPC client's answer; the exchange was recorded with
    /// the status the answer means).
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    /// The connection must close after it (a framing or body error).
    pub closes: bool,
    /// The access-log record (when the log is on), sent once the body is written.
    pub record: Option<Box<Record>>,
}

/// Makes `answer` ready to write, for every front: a server error logged (one throttle),
/// rendered in the client's `flavor`, the route's CORS and response header rules applied (on
/// the gateway's own answers too), the exchange recorded with the status the answer means, and
/// the request id set in `id_header`.
pub fn answer(
    shared: &Shared,
    logging: bool,
    answer: Answer,
    flavor: Flavor,
    trail: Trail<'_>,
    mut exchange: Exchange<'_>,
    id_header: &HeaderName,
) -> Rendered {
    let e = &answer.error;
    answer.log_failed(trail.route.map(|r| &*r.name), exchange.request_id);
    let closes = e.closes_connection();
    exchange.status = e.status();
    let request_id = exchange.request_id.clone();
    let (status, mut headers, body) = answer.parts_for(&request_id, flavor);
    super::respond(&trail, &request_id, true, &mut headers);
    let record = trail.finish(shared, logging, exchange);
    headers.insert(id_header, request_id);
    Rendered {
        status,
        headers,
        body,
        closes,
        record,
    }
}

impl From<Failure> for ProxyError {
    fn from(f: Failure) -> ProxyError {
        match f {
            Failure::Connect => ProxyError::UpstreamConnect,
            Failure::Tls(detail) => ProxyError::UpstreamTls(detail),
            Failure::Timeout(after) => ProxyError::UpstreamTimeout(after),
            Failure::Protocol(detail) => ProxyError::Upstream(detail),
            Failure::NoLive => ProxyError::NoLiveUpstream,
        }
    }
}

/// The answer to attempts that ended without a response: the upstream's failure, or the
/// client's (`None`: the client left, nothing to answer).
pub fn stopped(stop: Stop<ProxyError>) -> Option<ProxyError> {
    match stop {
        Stop::Upstream(f) => Some(f.into()),
        Stop::Client(e) => e,
    }
}

/// A response head that is no answer to relay (a status over 599, a `101` without an upgrade
/// to switch to): counted among the route's other upstream errors, answered 502.
pub fn unrelayable(metrics: &RouteHandles, detail: String) -> ProxyError {
    let f = Failure::Protocol(detail);
    f.count(metrics);
    f.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use std::time::Duration;

    #[test]
    fn upstream_failures_are_502_or_504_with_todays_details() {
        let cases = [
            (Failure::Connect, 502, "cannot connect to the upstream"),
            (
                Failure::Tls("invalid peer certificate: UnknownIssuer".into()),
                502,
                "TLS with the upstream failed: invalid peer certificate: UnknownIssuer",
            ),
            (
                Failure::Timeout(Duration::from_millis(300)),
                504,
                "the upstream did not answer within 300ms",
            ),
            (
                Failure::Protocol("connection closed before message completed".into()),
                502,
                "the upstream failed: connection closed before message completed",
            ),
            (Failure::NoLive, 502, "no live upstream"),
        ];
        for (f, status, detail) in cases {
            assert_eq!(f.to_string(), detail);
            let e = ProxyError::from(f);
            assert_eq!(e.status(), StatusCode::from_u16(status).unwrap());
            assert_eq!(e.to_string(), detail);
        }
        assert!(stopped(Stop::Client(None)).is_none());
    }
}
