//! The limits step: every limit of the route (and of the consumer's plan) decided together by
//! the store, as one batch; a 429 when one refuses, or what the rest of the request carries
//! (the decisions for the rate-limit headers, what is charged after the response, the
//! concurrency slots held).

use std::sync::Arc;

use http::header::HeaderValue;
use http::request::Parts;
use http::Response;
use smallvec::SmallVec;

use super::charge::{new_lease, Leases};
use super::consumer::Plan;
use super::error::ProxyError;
use super::trail::Trail;
use super::ResBody;
use crate::access_log::LimitDecision;
use crate::config::{OnError, OnMissing, SubjectSpec};
use crate::limiter::{Check, CompiledLimit, Decision, Op, Outcome, Verdict};
use crate::log_throttle::Throttles;
use crate::routing::Route;
use crate::server::ConnInfo;
use crate::state::Snapshot;
use crate::store::{Store, StoreErrorKind};
use crate::subject::{client_ip, ip_digest, subject_of};
use crate::top::Who;

/// What a request that passed its limits carries on.
#[derive(Default)]
pub(super) struct Passed<'s> {
    /// The limits applied, in the order of the checks: the route's, then the plan's.
    pub(super) applied: SmallVec<[&'s Arc<CompiledLimit>; 4]>,
    /// The checks and the store's decisions.
    pub(super) limited: Option<(SmallVec<[Check<'s>; 4]>, Vec<Decision>, Outcome)>,
    /// Checks of a request the store failed open on (still charged after the response).
    pub(super) unmetered: Option<SmallVec<[Check<'s>; 4]>>,
    /// Concurrency slots the request holds (released when dropped, on every path).
    pub(super) leases: Option<Leases>,
}

/// The limits' verdict on a request. Not boxed: it is moved once, out of [`check`]'s future, and
/// a box would cost an allocation on every request.
#[allow(clippy::large_enum_variant)]
pub(super) enum Gate<'s> {
    Pass(Passed<'s>),
    /// A limit refused: the 429 to answer.
    Limited(Response<ResBody>),
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

/// Decides `route`'s limits and `plan`'s for the request (its head in `parts`).
pub(super) async fn check<'s>(
    snap: &'s Snapshot,
    route: &'s Route,
    plan: Option<Plan<'s>>,
    parts: &Parts,
    conn: &ConnInfo,
    request_id: &HeaderValue,
    trail: &mut Trail<'s>,
) -> Result<Gate<'s>, ProxyError> {
    let server = &snap.config.server;
    // The limits applied, in the order of the checks: the route's, then the plan's.
    let applied: SmallVec<[&'s Arc<CompiledLimit>; 4]> = route
        .limits
        .iter()
        .chain(plan.into_iter().flat_map(|(l, _)| l.iter()))
        .collect();
    if applied.is_empty() {
        return Ok(Gate::Pass(Passed::default()));
    }
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
            let leases = match outcome.verdict {
                Verdict::Limited {
                    limit,
                    retry_after_secs,
                } => {
                    if let Some(c) = checks.get(limit) {
                        let counted_by_ip = by_ip & 1u64.checked_shl(limit as u32).unwrap_or(0);
                        let who = match &c.limit.subject {
                            _ if c.limit.plan.is_some() => match trail.consumer {
                                Some(_) => Who::Header,
                                None => Who::Ip(client),
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
                    return Ok(Gate::Limited(res));
                }
                Verdict::Forward { delay } => {
                    // Held from here: released when dropped, a client gone during the delay
                    // included.
                    let leases = Leases::taken(&snap.store, &applied, &checks, &decisions);
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
                    leases
                }
            };
            Ok(Gate::Pass(Passed {
                applied,
                limited: Some((checks, decisions, outcome)),
                unmetered: None,
                leases,
            }))
        }
        Err(e) => {
            // One line a second per kind at most: an outage fails every request.
            static STORE_FAILED: Throttles<5> = Throttles::new();
            if let Some(suppressed) = STORE_FAILED.allow(e.kind as usize) {
                tracing::warn!(route = &*route.name, error = %e, suppressed, "rate-limit store failed");
            }
            // The call may have taken its concurrency slots all the same (the script ran and its
            // answer was lost: a timeout, a connection cut after the send). Give them back like
            // any release (retried once the store answers; nothing to free is harmless), or they
            // stay taken for the limit's whole `period`. An open circuit asked nothing.
            if e.kind != StoreErrorKind::CircuitOpen {
                drop(Leases::unknown(&snap.store, &applied, &checks));
            }
            match snap.config.store.on_error {
                OnError::Allow => {
                    trail.decision = Some(LimitDecision::FailOpen);
                    checks
                        .iter()
                        .for_each(|c| c.limit.metrics.fail_open.increment(1));
                    Ok(Gate::Pass(Passed {
                        applied,
                        limited: None,
                        unmetered: Some(checks),
                        leases: None,
                    }))
                }
                OnError::Deny => {
                    trail.decision = Some(LimitDecision::FailClosed);
                    checks
                        .iter()
                        .for_each(|c| c.limit.metrics.fail_closed.increment(1));
                    Err(ProxyError::StoreUnavailable)
                }
            }
        }
    }
}
