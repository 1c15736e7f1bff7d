//! The pipeline in evaluate-only mode (`/-/explain`): the same route, caller, consumer and
//! limits phases as [`super::admit`], with the store's evaluate path ([`Store::peek`]) instead
//! of its decision, charging nothing.

use std::net::IpAddr;

use super::answer::ProxyError;
use super::consumer::{identify_caller, Caller};
use super::limits::{checks, Checks};
use super::record::Trail;
use crate::config::{OnMissing, SubjectSpec};
use crate::head::RequestHead;
use crate::limiter::{Check, Decision, Op};
use crate::routing::Route;
use crate::state::Snapshot;
use crate::store::Store;
use crate::worker::WorkerId;

/// Why a question cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The question lacks what the answer needs (the client address).
    #[error("{0}")]
    Incomplete(String),
    #[error("the store cannot answer: {0}")]
    Store(String),
}

/// What the gateway would do with the request.
pub enum Explained<'s> {
    /// No route takes it (or its path is refused first).
    NoRoute { reason: String },
    /// The route's phases refuse it before its limits (400, 401).
    Refused { route: &'s Route, reason: String },
    /// Its limits, evaluated.
    Limits(Evaluated<'s>),
}

/// A route's limits evaluated for the request.
pub struct Evaluated<'s> {
    pub route: &'s Route,
    /// The consumer (routes with `consumers = true`): `Some(None)` for no known key.
    pub consumer: Option<Option<crate::consumers::ConsumerRef<'s>>>,
    /// Why the request would still be refused after its limits (an unknown key).
    pub reason: Option<String>,
    /// Each check, its evaluation, and what its subject is (`ip`, `header`, `query`,
    /// `global`, `consumer`).
    pub limits: Vec<(Check<'s>, Decision, &'static str)>,
    /// The client address the subjects were derived from.
    pub client: IpAddr,
}

/// Explains `head` from client address `ip` (as the gateway would derive it).
pub async fn explain<'s>(
    snap: &'s Snapshot,
    head: &impl RequestHead,
    ip: Option<IpAddr>,
) -> Result<Explained<'s>, ExplainError> {
    let params = snap.config.server.path_params;
    let path = match crate::path::normalize_with(head.path(), params) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            return Ok(Explained::NoRoute {
                reason: format!("the path {:?} is refused with 400 ({e:?})", head.path()),
            })
        }
    };
    let host = head.authority().and_then(crate::routing::route_host);
    let Some(route) = snap.routes.find(host.as_deref(), head.method(), &path) else {
        return Ok(Explained::NoRoute {
            reason: format!(
                "no route matches {} {}{path} (the gateway answers 404)",
                head.method(),
                host.as_deref().unwrap_or("(any host)"),
            ),
        });
    };
    let refused = |reason: String| Ok(Explained::Refused { route, reason });
    // The token, verified as the gateway would (uncounted: nothing is refused here).
    let mut verified = None;
    if let (Some(mode), Some(cfg), Some(v)) = (route.jwt, &snap.config.jwt, &snap.jwt) {
        match super::jwt::token_of(cfg, head) {
            Ok(None) if mode == crate::config::JwtMode::Optional => {}
            Ok(None) => return refused("no bearer token: the gateway answers 401".to_owned()),
            Err(r) => return refused(format!("the gateway answers 401: {}", r.description())),
            // Off the workers' slots: an explained token is never throttled by a client's flood
            // (nor counted for one, but under the unspecified address).
            Ok(Some(t)) => match v.verify(&t, IpAddr::from([0, 0, 0, 0]), WorkerId::NONE) {
                Ok(c) => verified = Some(c),
                Err(r) => return refused(format!("the gateway answers 401: {}", r.description())),
            },
        }
    }
    let mut trail = Trail::default();
    let consumers = snap.config.consumers.as_ref().filter(|_| route.consumers);
    let caller = match consumers {
        Some(cc) => match identify_caller(
            cc,
            &snap.consumers,
            &snap.config.plans,
            route,
            head,
            verified.as_deref().map(|v| &v.claims),
            &mut trail,
        ) {
            Ok(c) => c,
            Err(_) => {
                return refused(format!(
                    "the {} appears more than once: the gateway answers 400",
                    cc.source
                ))
            }
        },
        None => Caller::default(),
    };
    let reason = match (caller.reject_unknown, consumers) {
        (true, Some(cc)) => Some(format!(
            "no known key in the {}: the gateway charges the route's limits, then answers 401",
            cc.source
        )),
        _ if !route.json_paths.is_empty() => Some(
            "the route's limits read the request's JSON body, which an explained request does not have: its json: parts are counted as missing, its reservations are the limits' cost".to_owned(),
        ),
        _ => None,
    };
    // Without `ip`, an address that cannot be anyone's: needed only when a check counts by
    // address, which is then an error.
    let client = ip.unwrap_or(IpAddr::from([0, 0, 0, 0]));
    if !route.access.admits(client) && ip.is_some() {
        return refused(format!(
            "the route's allow/deny lists refuse {client}: the gateway answers 403"
        ));
    }
    let counted_path = route.counted_path(&path);
    let facts = crate::subject::Facts {
        client,
        derived: true,
        host: host.as_deref(),
        path: &counted_path,
        consumer: trail.consumer.as_deref(),
        claims: verified.as_deref().map(|v| &v.claims),
        // No body: a question has none (its `json:` parts are missing, its reservations the
        // limits' `cost`).
        body: None,
    };
    let mut lease = 0;
    let Checks {
        mut checks, by_ip, ..
    } = match checks(route, caller.plan, head, &facts, &mut lease) {
        Ok(c) => c,
        Err(ProxyError::RepeatedSubject(s)) => {
            return refused(format!(
                "{s} appears more than once: the gateway answers 400"
            ))
        }
        Err(ProxyError::MissingSubject(s)) => {
            let limit = route
                .limits
                .iter()
                .find(|l| {
                    l.on_missing == OnMissing::Reject
                        && l.subject.parts().iter().any(|p| p.to_string() == s)
                })
                .map_or("", |l| &*l.name);
            return refused(format!(
                "the request has no {s} (limit {limit:?}): the gateway answers 401"
            ));
        }
        Err(ProxyError::MissingInBody(s, _)) => {
            return refused(format!(
                "{s} is read from the request's JSON body, which an explained request does not have: the gateway answers 400 to a request without it"
            ))
        }
        Err(e) => return refused(format!("the gateway answers {}: {e}", e.status().as_u16())),
    };
    let mut kinds = Vec::with_capacity(checks.len());
    for (c, &ip_counted) in checks.iter_mut().zip(&by_ip) {
        // Evaluated, never taken: a concurrency limit is asked like any other.
        c.op = Op::Decide;
        let kind = match (&c.limit.subject, ip_counted) {
            _ if c.limit.plan.is_some() && !ip_counted => "consumer",
            (_, true) => "ip",
            (SubjectSpec::Header(_), false) => "header",
            (SubjectSpec::Query(_), false) => "query",
            (SubjectSpec::Global, false) => "global",
            _ => "parts",
        };
        let needs_ip = ip_counted || c.limit.subject.parts().contains(&SubjectSpec::Ip);
        if needs_ip && ip.is_none() {
            return Err(ExplainError::Incomplete(if c.limit.plan.is_some() {
                "an unknown key counts by client address: pass ip=".to_owned()
            } else {
                format!(
                    "limit {:?} counts this request by client address: pass ip=",
                    c.limit.name
                )
            }));
        }
        kinds.push(kind);
    }
    let decisions = snap
        .store
        .peek(&checks, WorkerId::NONE)
        .await
        .map_err(|e| ExplainError::Store(e.to_string()))?;
    Ok(Explained::Limits(Evaluated {
        route,
        consumer: if route.consumers {
            Some(trail.consumer.clone())
        } else {
            None
        },
        reason,
        limits: checks
            .into_iter()
            .zip(decisions)
            .zip(kinds)
            .map(|((c, d), k)| (c, d, k))
            .collect(),
        client,
    }))
}
