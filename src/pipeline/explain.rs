//! The pipeline in evaluate-only mode (`/-/explain`): admission's own evaluation
//! ([`super::evaluate`]: the input checks, the route, a preflight, `max_body_size`, the access
//! lists, the token, the consumer, the limits, what follows them), run with a [`Reading`]
//! judge — the store's evaluate path ([`Store::peek`]) instead of its decision — and counting
//! nothing: no charge, no metric, no bad-token throttle, no token cache, no lease.

use std::net::IpAddr;

use super::answer::{Answer, ProxyError};
use super::body::Unread;
use super::consumer::Plan;
use super::evaluate::{self, after_limits, before_limits, Counting, Judge, Then};
use super::limits::{checks, refusal, Checks, Phase};
use super::record::Trail;
use crate::config::SubjectSpec;
use crate::head::RequestHead;
use crate::limiter::{Check, Decision, Op, Outcome, Verdict};
use crate::routing::Route;
use crate::state::Snapshot;
use crate::store::Store;
use crate::subject::{Client, Facts};
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
}

/// Explain's judge of the limits: each phase's checks evaluated by the store without charging,
/// combined as admission combines them ([`Outcome::judged`]), nothing counted.
pub struct Reading<'s> {
    snap: &'s Snapshot,
    /// Whether the question gave the client address.
    ip_given: bool,
    limits: Vec<(Check<'s>, Decision, &'static str)>,
    problem: Option<ExplainError>,
}

impl<'s> Reading<'s> {
    /// Evaluates the limits `phase` decides; `Err`: the answer admission would give.
    pub(super) async fn read(
        &mut self,
        route: &'s Route,
        plan: Option<Plan<'s>>,
        head: &(impl RequestHead + Sync),
        facts: &Facts<'_>,
        phase: Phase,
    ) -> Result<(), Answer> {
        let mut lease = 0;
        let Checks {
            mut checks, by_ip, ..
        } = checks(route, plan, head, facts, &mut lease, phase, false)?;
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
            if needs_ip && !self.ip_given {
                self.problem = Some(ExplainError::Incomplete(if c.limit.plan.is_some() {
                    "an unknown key counts by client address: pass ip=".to_owned()
                } else {
                    format!(
                        "limit {:?} counts this request by client address: pass ip=",
                        c.limit.name
                    )
                }));
                return Err(ProxyError::BadRequest("incomplete").into());
            }
            kinds.push(kind);
        }
        if checks.is_empty() {
            return Ok(());
        }
        let decisions = match self.snap.store.peek(&checks, WorkerId::NONE).await {
            Ok(d) => d,
            Err(e) => {
                self.problem = Some(ExplainError::Store(e.to_string()));
                return Err(ProxyError::StoreUnavailable.into());
            }
        };
        let refused = match Outcome::judged(&checks, &decisions).verdict {
            Verdict::Limited {
                limit,
                retry_after_secs,
            } => Some(refusal(route, &checks, &decisions, limit, retry_after_secs)),
            Verdict::Forward { .. } => None,
        };
        self.limits.extend(
            checks
                .into_iter()
                .zip(decisions)
                .zip(kinds)
                .map(|((c, d), k)| (c, d, k)),
        );
        match refused {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// Explains `head` from client address `ip` (as the gateway would derive it; `None`: not
/// given, an error when the answer depends on it).
pub async fn explain<'s>(
    snap: &'s Snapshot,
    head: &(impl RequestHead + Sync),
    ip: Option<IpAddr>,
) -> Result<Explained<'s>, ExplainError> {
    // Without `ip`, an address that cannot be anyone's: needed only when the answer depends
    // on it (an access list, a limit counting by address), which is then an error.
    let client = Client {
        ip: ip.unwrap_or(IpAddr::from([0, 0, 0, 0])),
        derived: ip.is_some(),
    };
    let mut trail = Trail::default();
    let mut reading = Reading {
        snap,
        ip_given: ip.is_some(),
        limits: Vec::new(),
        problem: None,
    };
    let answer = match evaluated(snap, head, client, &mut trail, &mut reading).await {
        Ok(None) => None,
        Ok(Some(e)) | Err(e) => Some(e),
    };
    if let Some(p) = reading.problem {
        return Err(p);
    }
    let route = trail.route;
    Ok(Explained {
        route,
        answer,
        consumer: route.filter(|r| r.consumers).map(|_| trail.consumer.clone()),
        limits: reading.limits,
        note: route.filter(|r| !r.json_paths.is_empty()).map(|_| {
            "the route's limits read the request's JSON body, which an explained request does not have: its json: parts are counted as missing, its reservations are the limits' cost"
        }),
        client: client.ip,
    })
}

/// Admission's evaluation, read: `Ok(None)` forwards, `Ok(Some)` is the gateway's own 2xx/3xx
/// answer, `Err` its refusal.
async fn evaluated<'s>(
    snap: &'s Snapshot,
    head: &(impl RequestHead + Sync),
    client: Client,
    trail: &mut Trail<'s>,
    reading: &mut Reading<'s>,
) -> Result<Option<ProxyError>, ProxyError> {
    let (input, asked, route) = super::admit::input_and_route(snap, head)?;
    trail.host = input.host;
    trail.path = input.path.into_owned();
    if route.is_some_and(|r| !r.access.is_open()) && !reading.ip_given {
        reading.problem = Some(ExplainError::Incomplete(
            "the route's allow/deny lists need the client address: pass ip=".to_owned(),
        ));
        return Ok(None);
    }
    let found = before_limits(snap, head, client, route, asked, trail, Counting::Nothing)
        .map_err(|a| a.error)?;
    let route = found.route;
    let counted_path = route.counted_path(&trail.path);
    let facts = Facts {
        client: client.ip,
        derived: client.derived,
        host: trail.host.as_deref(),
        path: &counted_path,
        consumer: trail.consumer.as_deref(),
        claims: found.verified.as_deref().map(|v| &v.claims),
        // No body: a question has none (its `json:` parts are missing, its reservations the
        // limits' `cost`).
        body: None,
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
