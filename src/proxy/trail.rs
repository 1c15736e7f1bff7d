//! What the handler learns about a request on its way through, for the metrics and the access log.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::access_log::LimitDecision;
use crate::consumers::Consumer;
use crate::limiter::CompiledLimit;
use crate::routing::Route;

/// What the handler learns about a request on its way through, for the metrics and the access
/// log. Filled by moving what the request path computes anyway; the few fields only the access
/// log needs (`client_ip` for routes without limits, the raw path of a refused request) are
/// computed only when the log is on.
#[derive(Default)]
pub(super) struct Trail<'s> {
    pub(super) route: Option<&'s Route>,
    pub(super) host: Option<String>,
    pub(super) path: String,
    pub(super) client_ip: Option<IpAddr>,
    /// The server that answered (or failed) the last attempt, as `host:port`, and the time that
    /// attempt took to its response head or failure; `None` if no upstream was called.
    pub(super) upstream: Option<(&'s Arc<str>, Duration)>,
    /// The limit that denied (or the shadow limit that would have).
    pub(super) limit: Option<&'s CompiledLimit>,
    pub(super) decision: Option<LimitDecision>,
    /// The consumer the request's key belongs to (routes with `consumers = true`).
    pub(super) consumer: Option<&'s Consumer>,
}
