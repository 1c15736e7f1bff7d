//! What the life cycle does with an upstream exchange that did not give an answer to relay:
//! the one place an upstream failure ([`crate::upstream::Failure`], typed on the upstream
//! side) becomes the gateway's answer (502 or 504, problem+json), for every front.

use super::answer::ProxyError;
use crate::metrics::RouteHandles;
use crate::upstream::{Failure, Stop};

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
