//! Why an upstream attempt (or a request's attempts together) failed, as a typed error of the
//! upstream side: no answer in it. The gateway's answer to each (a 502 or 504 problem+json) is
//! made in one place, `pipeline::drive`; the planner ([`super::attempts`]) counts each kind in
//! the route's metrics and names it in the trace.

use std::time::Duration;

/// An upstream failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The connection could not be opened (refused, unreachable, the connect timeout).
    #[error("cannot connect to the upstream")]
    Connect,
    /// The TLS handshake with an `https://` upstream failed (rustls's reason).
    #[error("TLS with the upstream failed: {0}")]
    Tls(String),
    /// The upstream kept the request waiting longer than the route's `timeout` (to connect, to
    /// take a piece of the request, or to send its response head once the request was sent).
    #[error("the upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed or closed before a response head, or the head was not one to
    /// relay (invalid, too large, an unasked-for `101`).
    #[error("the upstream failed: {0}")]
    Protocol(String),
    /// Every server of the group not yet tried is out by active health checks.
    #[error("no live upstream")]
    NoLive,
}

impl From<&super::ConnectError> for Failure {
    /// A connection that could not be opened: a TLS failure with rustls's reason (e.g.
    /// "invalid peer certificate: UnknownIssuer", without the layers around it), else a
    /// connect failure.
    fn from(e: &super::ConnectError) -> Failure {
        use super::ConnectError;
        if !e.is_tls() {
            return Failure::Connect;
        }
        Failure::Tls(match e {
            ConnectError::Tls(io) => match io.get_ref() {
                Some(inner) => inner.to_string(),
                None => io.to_string(),
            },
            other => other.to_string(),
        })
    }
}

impl Failure {
    /// The kind's name in the trace's attempt outcome (and the `kind` label of
    /// `tollgate_upstream_errors_total`, but for `NoLive`, which is no attempt).
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Connect | Failure::NoLive => "connect",
            Failure::Tls(_) => "tls",
            Failure::Timeout(_) => "timeout",
            Failure::Protocol(_) => "other",
        }
    }

    /// Counts the failure of one attempt in the route's upstream error counters.
    pub fn count(&self, metrics: &crate::metrics::RouteHandles) {
        match self {
            Failure::Connect => metrics.upstream_connect_errors.increment(1),
            Failure::Tls(_) => metrics.upstream_tls_errors.increment(1),
            Failure::Timeout(_) => metrics.upstream_timeouts.increment(1),
            Failure::Protocol(_) => metrics.upstream_other_errors.increment(1),
            Failure::NoLive => {}
        }
    }
}
