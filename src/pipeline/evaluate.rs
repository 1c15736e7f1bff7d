//! One evaluation of a request, written once: the phases admission decides on, in its order —
//! the route (a CORS preflight by the method it asks about), a preflight answered uncharged,
//! `max_body_size`, the access lists, the token, the consumer and plan, the limits (on a route
//! whose limits read the body, those that do not first, then an unknown key, then the body and
//! the limits that read it), and what follows them (a charged preflight, an unknown key, a
//! redirect, a usage route, the upstream path).
//!
//! [`super::admit`] runs it deciding: the store charges, refusals are counted, concurrency
//! slots are held. [`super::explain`] runs it reading: the store's evaluate path, nothing
//! counted, nothing held. The two differ only in their [`Judge`] and their [`Counting`], so
//! `/-/explain` cannot explain a refusal the gateway would not give.

use std::sync::Arc;

use http::header::HeaderValue;

use super::answer::{Answer, ProxyError};
use super::body::BodyPrefix;
use super::consumer::{identify_caller, upstream_query, Caller, Plan};

use super::input;
use super::limits::{Gate, Phase, Reading};
use super::passed::Passed;
use super::record::Trail;
use super::settle::WorkerCtx;
use crate::config::ConsumersConfig;
use crate::fronting::cors::{self, Cors};
use crate::fronting::redirect::{NoLocation, Redirect};
use crate::fronting::Vars;
use crate::http::head::RequestHead;
use crate::jwt::Verified;
use crate::routing::{Route, Target};
use crate::runtime::state::Snapshot;
use crate::subject::{Client, Facts};
use crate::tls::peer::PeerCert;
use tollgate_limit::worker::WorkerId;

/// Whether an evaluation counts what admission counts: the route's access denials, a refused
/// token's reason (`tollgate_jwt_rejected_total`) and the bad-token throttle of its client on
/// its worker, the token cache. Explain counts nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Admission, on this worker.
    Admission(WorkerId),
    /// Evaluate-only (`/-/explain`).
    Nothing,
}

/// What the phases before the limits found.
pub struct Found<'s> {
    pub route: &'s Route,
    /// The route's CORS policy when the request is a preflight it answers.
    pub preflight: Option<&'s Cors>,
    /// The request's verified token (routes with `jwt`).
    pub verified: Option<Arc<Verified>>,
    /// The consumer's plan, or an unknown key to refuse.
    pub caller: Caller<'s>,
    /// `[consumers]`, on a route with `consumers = true`.
    pub consumers: Option<&'s ConsumersConfig>,
}

/// The route's phases before its limits: `route` is the request's (`None`: a 404), `asked`
/// whether it is a CORS preflight. Records the route, the origin and the consumer in `trail`.
/// The answer is not boxed: a box would cost an allocation on every refusal. `cert` is the
/// connection's verified client certificate (a consumer may be recognised by it).
#[allow(clippy::result_large_err, clippy::too_many_arguments)]
pub fn before_limits<'s>(
    snap: &'s Snapshot,
    head: &impl RequestHead,
    client: Client,
    cert: Option<&PeerCert>,
    route: Option<&'s Route>,
    asked: bool,
    trail: &mut Trail<'s>,
    counting: Counting,
) -> Result<Found<'s>, Answer> {
    let route = route.ok_or(ProxyError::NoRoute)?;
    trail.route = Some(route);
    let cors = route.fronting.cors.as_deref();
    if cors.is_some() {
        trail.origin = cors::origin_of(head);
    }
    let preflight = cors.filter(|_| asked);
    if let Some(c) = preflight.filter(|c| !c.charge_preflight) {
        return Err(preflight_answer(c, head));
    }
    if input::content_length(head).is_some_and(|len| len > route.max_body_size) {
        return Err(ProxyError::BodyTooLarge(route.max_body_size).into());
    }
    // The route's access lists, before anything is charged (and before the token: a denied
    // address learns nothing of what the route wants).
    if !route.access.admits_client(client.ip, client.derived) {
        if counting != Counting::Nothing {
            route.metrics.access_denied.increment(1);
        }
        return Err(ProxyError::AccessDenied.into());
    }
    // The bearer token (routes with `jwt`): verified before anything is charged.
    let verified = super::jwt::verify(
        snap.config.jwt.as_ref(),
        snap.jwt.as_deref(),
        route,
        head,
        client.ip,
        match counting {
            Counting::Admission(worker) => Some(worker),
            Counting::Nothing => None,
        },
    )?;
    if route
        .fronting
        .response_headers
        .as_ref()
        .is_some_and(|r| r.rules.uses_claims())
        || route
            .cache
            .as_ref()
            .is_some_and(|c| c.config.needs_claims())
    {
        trail.token = verified.clone();
    }
    // Consumers: who is calling, and so which plan's limits apply (routes with `consumers`).
    let consumers = snap.config.consumers.as_ref().filter(|_| route.consumers);
    let caller = match consumers {
        Some(cc) => identify_caller(
            cc,
            &snap.consumers,
            &snap.config.plans,
            route,
            head,
            cert,
            verified.as_deref().map(|v| &v.claims),
            trail,
        )?,
        None => Caller::default(),
    };
    Ok(Found {
        route,
        preflight,
        verified,
        caller,
        consumers,
    })
}

/// Who decides a request's limits: admission (the store's decision, charged, slots held,
/// counted in the limits' metrics) or explain (the store's evaluate path, nothing counted).
pub enum Judge<'a, 's> {
    /// Admission; what the limits found is recorded in `trail`.
    Deciding {
        snap: &'s Snapshot,
        ctx: &'a WorkerCtx,
        trail: &'a mut Trail<'s>,
    },
    /// `/-/explain`.
    Reading(&'a mut Reading<'s>),
}

impl<'s> Judge<'_, 's> {
    /// Decides the limits of `route` and `plan` that `phase` decides; `Err`: the answer (a 429,
    /// a 401 or 400 for a missing or repeated subject, a 503).
    async fn limits(
        &mut self,
        route: &'s Route,
        plan: Option<Plan<'s>>,
        head: &(impl RequestHead + Sync),
        facts: &Facts<'_>,
        phase: Phase,
    ) -> Result<Passed<'s>, Answer> {
        match self {
            Judge::Deciding { snap, ctx, trail } => {
                match super::limits::check(snap, ctx, route, plan, head, facts, trail, phase)
                    .await?
                {
                    Gate::Pass(p) => Ok(p),
                    Gate::Limited(answer) => Err(answer),
                }
            }
            // Boxed: admission's future does not grow by explain's (nor allocates: this arm
            // never runs there).
            Judge::Reading(r) => Box::pin(r.read(route, plan, head, facts, phase))
                .await
                .map(|()| Passed::default()),
        }
    }
}

/// The limits phase: on a route whose limits read the request body, the limits that do not
/// are decided first (every request counted by them, its body finished or not), and an unknown
/// key refused, before the body is waited for; then the body's fields and the limits that read
/// them. Elsewhere, one batch.
pub async fn limits<'s>(
    judge: &mut Judge<'_, 's>,
    found: &Found<'s>,
    head: &(impl RequestHead + Sync),
    facts: Facts<'_>,
    body: &mut impl BodyPrefix,
) -> Result<Passed<'s>, Answer> {
    let route = found.route;
    let plan = found.caller.plan;
    if route.json_paths.is_empty() {
        return judge.limits(route, plan, head, &facts, Phase::All).await;
    }
    let before = judge.limits(route, plan, head, &facts, Phase::Head).await?;
    if let (true, None, Some(cc)) = (
        found.caller.reject_unknown,
        found.preflight,
        found.consumers,
    ) {
        return Err(ProxyError::UnknownConsumer(cc.source.to_string()).into());
    }
    // Last before the limits that read it: a request refused on its head is never waited for.
    let fields = super::body::fields(route, body).await?;
    let facts = Facts {
        body: fields.as_ref(),
        ..facts
    };
    // `before`'s slots are released as it is dropped.
    let then = judge.limits(route, plan, head, &facts, Phase::Body).await?;
    Ok(before.merge(then))
}

/// What the gateway does with a request its limits passed.
pub enum Then<'s> {
    /// Answers a charged CORS preflight (`charge_preflight`): it never carries a key (browsers
    /// send none), so it is not refused as an unknown consumer.
    Preflight(&'s Cors),
    /// Refuses an unknown key, only now: its request was charged to the route's own limits
    /// (per address, say) first, so guessing keys is throttled like any other traffic.
    UnknownConsumer(&'s ConsumersConfig),
    /// Answers with a redirect.
    Redirect(&'s Redirect),
    /// Answers a usage route (after its own limits, which throttle the polling).
    Usage(&'s ConsumersConfig),
    /// Forwards it upstream.
    Forward,
}

/// What follows a request's limits.
pub fn after_limits<'s>(found: &Found<'s>) -> Then<'s> {
    if let Some(c) = found.preflight {
        return Then::Preflight(c);
    }
    if let (true, Some(cc)) = (found.caller.reject_unknown, found.consumers) {
        return Then::UnknownConsumer(cc);
    }
    if let Target::Redirect(r) = &found.route.target {
        return Then::Redirect(r);
    }
    match (found.route.usage, found.consumers) {
        (true, Some(cc)) => Then::Usage(cc),
        _ => Then::Forward,
    }
}

/// A redirect's `Location`: the query as it would go upstream (a key the route strips,
/// `strip_key`, is not handed on to wherever the redirect points).
pub fn redirect_location(
    r: &Redirect,
    found: &Found<'_>,
    head: &impl RequestHead,
    trail: &Trail<'_>,
) -> Result<HeaderValue, ProxyError> {
    let query = upstream_query(found.consumers, head.query());
    let vars = Vars {
        host: trail.host.as_deref(),
        path: &trail.path,
        query: query.as_deref(),
        route: &found.route.name,
        ..Vars::default()
    };
    r.location(&vars).map_err(|e| match e {
        NoLocation::NeedsHost => ProxyError::BadRequest("this redirect needs the request's host"),
        NoLocation::AnotherHost => {
            ProxyError::BadRequest("this redirect would send the client to another host")
        }
    })
}

/// The gateway's answer to a CORS preflight: 204 with what the route allows (the origin's own
/// headers are added with every answer's, by [`super::respond`]).
pub fn preflight_answer(c: &Cors, head: &impl RequestHead) -> Answer {
    let mut answer = Answer::from(ProxyError::Preflight);
    c.write_preflight(head, &mut answer.headers);
    answer
}
