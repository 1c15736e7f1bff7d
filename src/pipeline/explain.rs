//! The pipeline in evaluate-only mode (`/-/explain`): admission's own evaluation
//! ([`super::evaluate`]: the input checks, the route, a preflight, `max_body_size`, the access
//! lists, the token, the consumer, the limits, what follows them), run with a [`Reading`]
//! judge — the store's evaluate path ([`tollgate_limit::store::Store::peek`]) instead of its decision — and counting
//! nothing: no charge, no metric, no bad-token throttle, no token cache, no lease.

use std::net::IpAddr;

use super::answer::ProxyError;
use super::body::Unread;
use super::evaluate::{self, after_limits, before_limits, Counting, Judge, Then};
pub use super::limits::{ExplainError, Reading};
use super::record::Trail;
use crate::http::head::RequestHead;
use crate::limiter::{Check, Decision};
use crate::routing::Route;
use crate::runtime::state::Snapshot;
use crate::subject::{Client, Facts};
use crate::tls::peer::PeerCert;

/// What the gateway would do with the request.
pub struct Explained<'s> {
    /// The route that takes it (`None`: no route, or refused before routing).
    pub route: Option<&'s Route>,
    /// What the gateway answers itself (a refusal, a preflight's 204, a redirect, a usage
    /// route's 200); `None`: the request is forwarded upstream.
    pub answer: Option<ProxyError>,
    /// The consumer (routes with `consumers = true`): `Some(None)` for no known key.
    pub consumer: Option<Option<crate::consumers::ConsumerRef<'s>>>,
    /// Each limit evaluated, its evaluation, and what its subject is (`ip`, `header`, `query`,
    /// `global`, `consumer`, `parts`). Empty when the request is refused before its limits.
    pub limits: Vec<(Check<'s>, Decision, &'static str)>,
    /// What a question cannot show: the request's JSON body.
    pub note: Option<&'static str>,
    /// The client address the subjects were derived from.
    pub client: IpAddr,
    /// The routes tried for the request, in order, up to the one that took it, each with the
    /// matcher that refused it (`None`: it took the request); at most [`CANDIDATES`].
    pub candidates: Vec<(std::sync::Arc<str>, Option<String>)>,
    /// What the cache would make of it (a forwarded request on a caching route).
    pub cache: Option<crate::cache::Peek>,
}

/// The most routes `explain` lists as tried.
pub const CANDIDATES: usize = 8;

/// Explains `head` from client address `ip` (as the gateway would derive it; `None`: not
/// given, an error when the answer depends on it), on a connection with the client
/// certificate `cert` (known by its fingerprint: the consumer it names, `tls:fingerprint`),
/// over TLS or not (`tls`: the cache key's scheme), at `now` (seconds: a stored response's
/// age).
pub async fn explain<'s>(
    snap: &'s Snapshot,
    head: &(impl RequestHead + Sync),
    ip: Option<IpAddr>,
    cert: Option<&PeerCert>,
    tls: bool,
    now: u64,
) -> Result<Explained<'s>, ExplainError> {
    // Without `ip`, an address that cannot be anyone's: needed only when the answer depends
    // on it (an access list, a limit counting by address), which is then an error.
    let client = Client {
        ip: ip.unwrap_or(IpAddr::from([0, 0, 0, 0])),
        derived: ip.is_some(),
    };
    let mut trail = Trail::default();
    let mut reading = Reading::new(snap, ip.is_some());
    let answer = match evaluated(snap, head, client, cert, &mut trail, &mut reading).await {
        Ok(None) => None,
        Ok(Some(e)) | Err(e) => Some(e),
    };
    let limits = reading.finish()?;
    let route = trail.route;
    let candidates = snap
        .routes
        .candidates(
            trail.host.as_deref(),
            head.method(),
            &trail.path,
            head,
            CANDIDATES,
        )
        .into_iter()
        .map(|c| (std::sync::Arc::clone(&c.route.name), c.refused))
        .collect();
    let cache = match (route.and_then(|r| r.cache.as_deref()), &snap.cache) {
        (Some(rc), Some(cache)) if answer.is_none() => {
            Some(crate::cache::peek(cache, rc, head, tls, &trail, client.ip, now).await)
        }
        _ => None,
    };
    Ok(Explained {
        cache,
        route,
        answer,
        consumer: route.filter(|r| r.consumers).map(|_| trail.consumer.clone()),
        limits,
        note: route.filter(|r| !r.json_paths.is_empty()).map(|_| {
            "the route's limits read the request's JSON body, which an explained request does not have: its json: parts are counted as missing, its reservations are the limits' cost"
        }),
        client: client.ip,
        candidates,
    })
}

/// Admission's evaluation, read: `Ok(None)` forwards, `Ok(Some)` is the gateway's own 2xx/3xx
/// answer, `Err` its refusal.
async fn evaluated<'s>(
    snap: &'s Snapshot,
    head: &(impl RequestHead + Sync),
    client: Client,
    cert: Option<&PeerCert>,
    trail: &mut Trail<'s>,
    reading: &mut Reading<'s>,
) -> Result<Option<ProxyError>, ProxyError> {
    let (input, asked, route) = super::admit::input_and_route(snap, head)?;
    trail.host = input.host;
    trail.path = input.path.into_owned();
    if route.is_some_and(|r| !r.access.is_open()) && !reading.ip_given() {
        reading.unanswerable(ExplainError::Incomplete(
            "the route's allow/deny lists need the client address: pass ip=".to_owned(),
        ));
        return Ok(None);
    }
    let found = before_limits(
        snap,
        head,
        client,
        cert,
        route,
        asked,
        trail,
        Counting::Nothing,
    )
    .map_err(|a| a.error)?;
    let route = found.route;
    let counted_path = route.counted_path(&trail.path);
    let facts = Facts {
        client: client.ip,
        derived: client.derived,
        host: trail.host.as_deref(),
        path: &counted_path,
        route: Some(route),
        consumer: trail.consumer.as_deref(),
        claims: found.verified.as_deref().map(|v| &v.claims),
        // No body: a question has none (its `json:` parts are missing, its reservations the
        // limits' `cost`).
        body: None,
        // A question names the headers it would send as from a trusted proxy: explain says
        // what such a request gets (`limit_from = "header:…"` included).
        peer_trusted: true,
        // A question's certificate is its fingerprint alone (`cert_sha256=`): its other `tls:`
        // parts are missing.
        peer_cert: cert,
    };
    let mut judge = Judge::Reading(reading);
    evaluate::limits(&mut judge, &found, head, facts, &mut Unread)
        .await
        .map_err(|a| a.error)?;
    match after_limits(&found) {
        Then::Preflight(_) => Ok(Some(ProxyError::Preflight)),
        Then::UnknownConsumer(cc) => Err(ProxyError::UnknownConsumer(cc.source.to_string())),
        Then::Redirect(r) => Ok(Some(ProxyError::Redirect {
            status: r.status,
            location: evaluate::redirect_location(r, &found, head, trail)?,
        })),
        Then::Usage(_) => Ok(Some(ProxyError::Usage(String::new()))),
        Then::Forward => {
            route
                .forwarded_path(&trail.path, snap.config.server.path_params)
                .map_err(|_| ProxyError::BadRewrite)?;
            Ok(None)
        }
    }
}
