//! The limits phase: every limit of the route (and of the consumer's plan) decided together by
//! the store, as one batch; a 429 answer when one refuses, or what the rest of the request
//! carries (the decisions for the rate-limit headers, what is charged after the response, the
//! concurrency slots held).

use std::sync::Arc;

use http::header::HeaderMap;
use smallvec::SmallVec;

use super::answer::{Answer, ProxyError, Shaped};
use super::consumer::Plan;
use super::passed::Passed;
use super::record::Trail;
use super::settle::{new_lease, Leases, WorkerCtx};
use crate::access_log::LimitDecision;
use crate::config::{LimitSource, OnError, Reserve, SubjectSpec};
use crate::http::head::RequestHead;
use crate::limiter::{zero_budget, Check, CompiledLimit, Decision, Op, Outcome, Verdict};
use crate::routing::Route;
use crate::runtime::state::Snapshot;
use crate::subject::{counted_parts, ip_digest_in, resolve, shown_parts, Facts, SubjectError};
use crate::top::Who;
use tollgate_limit::log_throttle::Throttles;
use tollgate_limit::store::{Store, StoreErrorKind};
use tollgate_limit::worker::WorkerId;

/// A request's checks, one per limit applied, in order.
pub struct Checks<'s> {
    /// The limits applied: the route's, then the plan's.
    pub applied: SmallVec<[&'s Arc<CompiledLimit>; 4]>,
    pub checks: SmallVec<[Check<'s>; 4]>,
    /// Per check: whether its subject is the client address (an `ip` subject, a missing header
    /// or query subject counted by address, an unknown key's plan).
    pub by_ip: SmallVec<[bool; 4]>,
    /// The limits the request is exempt from (not checked).
    pub exempt: SmallVec<[&'s Arc<CompiledLimit>; 2]>,
}

/// The limits' verdict on a request. Not boxed: it is moved once, out of [`check`]'s future, and
/// a box would cost an allocation on every request.
#[allow(clippy::large_enum_variant)]
pub enum Gate<'s> {
    Pass(Passed<'s>),
    /// A limit refused: the 429 to answer.
    Limited(Answer),
}

/// Which of a request's limits a call decides. On a route whose limits read the request body,
/// those that do not ([`Phase::Head`]) are decided before the body is read, so that a request
/// they refuse is never waited for and every request is counted by them, its body finished or
/// not; those that do ([`Phase::Body`]) once it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    All,
    Head,
    Body,
}

impl Phase {
    fn includes(self, l: &CompiledLimit) -> bool {
        match self {
            Phase::All => true,
            Phase::Head => !reads_body(l),
            Phase::Body => reads_body(l),
        }
    }
}

/// Whether a limit needs the request body to be decided: a `json:` subject part, or a
/// reservation read from the body.
fn reads_body(l: &CompiledLimit) -> bool {
    l.subject.json_paths().next().is_some() || matches!(l.reserve(), Some(Reserve::Json { .. }))
}

/// What a check asks of the store: a concurrency limit takes a slot under the request's lease
/// (one lease id per request, made at its first concurrency limit); a limit that reserves what
/// the body asks (`reserve = "json:…"`) takes that many units; the others are decided.
fn op_of(l: &CompiledLimit, lease: &mut u64, facts: &Facts<'_>) -> Op {
    if l.policy.algorithm == crate::config::Algorithm::Concurrency {
        if *lease == 0 {
            *lease = new_lease();
        }
        Op::Acquire(*lease)
    } else if let Some(r @ Reserve::Json { path, .. }) = l.reserve() {
        Op::Reserve(r.units(facts.body.and_then(|b| b.int(path)), l.policy.cost))
    } else {
        Op::Decide
    }
}

/// The checks of `route`'s limits and `plan`'s that `phase` decides, for a request with
/// `facts`: each limit's subject as the request gives it. A request without a subject a limit
/// must have is refused (401), one that gives it twice too (400). A limit whose `exempt` covers
/// the request is skipped (listed in [`Checks::exempt`]). `remember`: a plan's combinations
/// are remembered for usage and resets (admission; explain remembers nothing).
pub fn checks<'s>(
    route: &'s Route,
    plan: Option<Plan<'s>>,
    head: &impl RequestHead,
    facts: &Facts<'_>,
    lease: &mut u64,
    phase: Phase,
    remember: bool,
) -> Result<Checks<'s>, ProxyError> {
    let mut applied: SmallVec<[&'s Arc<CompiledLimit>; 4]> = SmallVec::new();
    let mut checks: SmallVec<[Check<'s>; 4]> = SmallVec::new();
    let mut by_ip: SmallVec<[bool; 4]> = SmallVec::new();
    let mut exempt: SmallVec<[&'s Arc<CompiledLimit>; 2]> = SmallVec::new();
    let consumer = facts.consumer.map(|c| &*c.name);
    let is_exempt = |l: &CompiledLimit| {
        !l.exempt.is_empty() && l.exempt.covers(facts.client, facts.derived, consumer)
    };
    let subject_error = |e: SubjectError| match e {
        SubjectError::Missing(part) => ProxyError::MissingSubject(part),
        SubjectError::MissingInBody(part) => ProxyError::MissingInBody(part, route.max_json_bytes),
        SubjectError::Repeated(part) => ProxyError::RepeatedSubject(part),
    };
    for l in route.limits.iter().filter(|l| phase.includes(l)) {
        if is_exempt(l) {
            exempt.push(l);
            continue;
        }
        let l = l.for_caller(caller_limit(l, head, facts));
        if l.zero_budget() && !zero_budget::may_count(l, head) {
            // A byte budget of nothing has nothing to refuse in this exchange.
            continue;
        }
        let r =
            resolve(&l.subject, l.on_missing, l.prefixes, head, facts).map_err(subject_error)?;
        applied.push(l);
        checks.push(Check {
            limit: l,
            subject: r.digest,
            op: op_of(l, lease, facts),
        });
        by_ip.push(r.by_ip);
    }
    if let Some((limits, subject)) = plan {
        for l in limits.iter().filter(|l| phase.includes(l)) {
            if is_exempt(l) {
                exempt.push(l);
                continue;
            }
            if l.zero_budget() && !zero_budget::may_count(l, head) {
                continue;
            }
            // A plan's limit counts per consumer (`global` is the placeholder); with parts added
            // (`subject = ["path"]`), per consumer and combination.
            let (digest, ip) = if l.subject == SubjectSpec::Global {
                match subject {
                    Some(s) => (s, false),
                    None => (ip_digest_in(facts.client, l.prefixes), true),
                }
            } else {
                let r = resolve(&l.subject, l.on_missing, l.prefixes, head, facts)
                    .map_err(subject_error)?;
                // Remembered so that usage lists the key and a reset reaches it.
                if let (true, Some(c), SubjectSpec::Compound(_)) =
                    (remember, facts.consumer, &l.subject)
                {
                    l.seen.record(c.subject, r.digest, || {
                        counted_parts(&l.subject, l.prefixes, head, facts)
                    });
                }
                (r.digest, false)
            };
            applied.push(l);
            checks.push(Check {
                limit: l,
                subject: digest,
                op: op_of(l, lease, facts),
            });
            by_ip.push(ip);
        }
    }
    Ok(Checks {
        applied,
        checks,
        by_ip,
        exempt,
    })
}

/// A limit's `limit_from` value for this request (`None`: the configured limit): the claim of
/// the verified token, or the header's one value from a trusted proxy (from anyone else it is
/// ignored: a client never sets its own limit).
fn caller_limit(l: &CompiledLimit, head: &impl RequestHead, facts: &Facts<'_>) -> Option<u64> {
    let c = l.callers.as_deref()?;
    match &c.from.source {
        LimitSource::Jwt(path) => {
            let mut v = facts.claims?;
            for k in path.iter() {
                v = v.get(&**k)?;
            }
            c.from.value_of_json(v)
        }
        LimitSource::Header(name) => {
            if !facts.peer_trusted {
                return None;
            }
            let mut values = head.header_values(name);
            match (values.next(), values.next()) {
                (Some(v), None) => c.from.value_of_bytes(v),
                _ => None,
            }
        }
    }
}

/// How `/-/top` shows the subject `c` counted (only called for a denial).
pub fn who_of(
    c: &Check<'_>,
    counted_by_ip: bool,
    head: &impl RequestHead,
    facts: &Facts<'_>,
) -> Who {
    let l = c.limit;
    let net = || l.prefixes.network(facts.client);
    if l.plan.is_some() && l.subject == SubjectSpec::Global {
        return match facts.consumer {
            Some(_) if !counted_by_ip => Who::Header,
            _ => Who::Ip(net()),
        };
    }
    match &l.subject {
        SubjectSpec::Global => Who::Global,
        SubjectSpec::Ip => Who::Ip(net()),
        SubjectSpec::Header(_) | SubjectSpec::Query(_) if counted_by_ip => Who::Ip(net()),
        SubjectSpec::Query(_) => Who::Query,
        SubjectSpec::Header(_) => Who::Header,
        other => Who::Parts(shown_parts(other, l.prefixes, head, facts).into()),
    }
}

/// The 429 of a request whose `limit`-th check refused it (or the status and body of the
/// refusing limit's `refusal`, else the route's).
pub fn refusal(
    route: &Route,
    checks: &[Check<'_>],
    decisions: &[Decision],
    limit: usize,
    retry_after: u64,
    facts: &Facts<'_>,
) -> ProxyError {
    let shape = checks
        .get(limit)
        .and_then(|c| c.limit.refusal.as_ref())
        .or(route.refusal.as_ref())
        .map(|r| {
            let uses =
                |v: crate::fronting::template::Var| r.body.as_ref().is_some_and(|(t, _)| t.uses(v));
            let d = decisions.get(limit);
            Box::new(Shaped {
                refusal: r.clone(),
                refused: crate::fronting::Refused {
                    retry_after,
                    limit: d.map_or(0, |d| d.limit),
                    remaining: d.map_or(0, |d| d.remaining),
                },
                route: route.name.clone(),
                client_ip: Some(facts.client),
                consumer: facts
                    .consumer
                    .filter(|_| uses(crate::fronting::template::Var::Consumer))
                    .map(|c| c.name.clone()),
                claims: facts
                    .claims
                    .filter(|_| r.body.as_ref().is_some_and(|(t, _)| t.uses_claims()))
                    .cloned(),
            })
        });
    ProxyError::Limited {
        shape,
        route: route.name.clone(),
        limit: checks
            .get(limit)
            .map_or_else(|| Arc::from(""), |c| c.limit.name.clone()),
        retry_after,
        violated: checks
            .iter()
            .zip(decisions)
            .filter(|(c, d)| !c.limit.shadow && !d.allowed)
            .map(|(c, _)| c.limit.name.clone())
            .collect(),
    }
}

/// The refusal of a request one of whose subjects is banned at `now` (`ban_after`), decided
/// without the store: that limit denies until the ban's end, the others are left unasked.
fn banned<'s>(
    route: &'s Route,
    checks: &[Check<'s>],
    by_ip: &[bool],
    head: &impl RequestHead,
    facts: &Facts<'_>,
    trail: &mut Trail<'s>,
    now: crate::limiter::Micros,
) -> Option<Answer> {
    // Refused until the later of the ban's end and the limit's own refusal that started it.
    let (i, c, until) = checks.iter().enumerate().find_map(|(i, c)| {
        let (_, bans) = c.limit.ban.as_ref()?;
        bans.refusing(&c.subject, now)
            .map(|(_, retry)| (i, c, retry))
    })?;
    let wait = until.saturating_sub(now);
    let denied = Decision {
        allowed: false,
        limit: c.limit.policy.quota(),
        remaining: 0,
        retry_after: wait,
        reset_after: wait,
        delay: 0,
        kind: Default::default(),
    };
    Some(refused_here(
        route, checks, by_ip, head, facts, trail, i, denied,
    ))
}

/// The answer of a request the `i`-th check refused with `denied`, decided without the store:
/// the other checks are left unasked (nothing charged), the refusal recorded as the store's are.
#[allow(clippy::too_many_arguments)]
fn refused_here<'s>(
    route: &'s Route,
    checks: &[Check<'s>],
    by_ip: &[bool],
    head: &impl RequestHead,
    facts: &Facts<'_>,
    trail: &mut Trail<'s>,
    i: usize,
    denied: Decision,
) -> Answer {
    let mut decisions: Vec<Decision> = checks.iter().map(|_| Decision::unasked()).collect();
    if let Some(d) = decisions.get_mut(i) {
        *d = denied;
    }
    let outcome = Outcome::of(checks, &decisions);
    if let Some(c) = checks.get(i) {
        let who = who_of(c, by_ip.get(i).copied().unwrap_or(false), head, facts);
        if let Who::Parts(parts) = &who {
            trail.subject = Some(parts.clone());
        }
        c.limit.top.record(c.subject, who);
        trail.limit = Some(c.limit);
    }
    trail.decision = Some(LimitDecision::Limited);
    let error = refusal(
        route,
        checks,
        &decisions,
        i,
        denied.retry_after.div_ceil(1_000_000),
        facts,
    );
    Answer {
        error,
        headers: HeaderMap::new(),
        rate: route
            .rate_limit_headers
            .then(|| outcome.rate_fields(checks, &decisions))
            .flatten(),
    }
}

/// Why a question cannot be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The question lacks what the answer needs (the client address).
    #[error("{0}")]
    Incomplete(String),
    #[error("the store cannot answer: {0}")]
    Store(String),
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
    /// A reading for a question that gave the client address or not (`ip_given`).
    pub fn new(snap: &'s Snapshot, ip_given: bool) -> Reading<'s> {
        Reading {
            snap,
            ip_given,
            limits: Vec::new(),
            problem: None,
        }
    }

    pub fn ip_given(&self) -> bool {
        self.ip_given
    }

    /// Records why the question cannot be answered.
    pub fn unanswerable(&mut self, e: ExplainError) {
        self.problem = Some(e);
    }

    /// The limits evaluated, each with its evaluation and subject kind, or why the question
    /// could not be answered.
    #[allow(clippy::type_complexity)]
    pub fn finish(self) -> Result<Vec<(Check<'s>, Decision, &'static str)>, ExplainError> {
        match self.problem {
            Some(p) => Err(p),
            None => Ok(self.limits),
        }
    }

    /// Evaluates the limits `phase` decides; `Err`: the answer admission would give.
    pub async fn read(
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
        let decisions = match zero_budget::peek(&self.snap.store, &checks, WorkerId::NONE).await {
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
            } => Some(refusal(
                route,
                &checks,
                &decisions,
                limit,
                retry_after_secs,
                facts,
            )),
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

/// What [`prepare`] found: the verdict already (nothing to ask the store: no limit, every one
/// exempt, a banned subject, a byte budget of nothing), or the checks to decide.
#[allow(clippy::large_enum_variant)]
pub enum Prepared<'s> {
    Gate(Gate<'s>),
    Decide(Deciding<'s>),
}

/// A request's checks, ready for the store's decision ([`conclude`] takes it with it).
pub struct Deciding<'s> {
    pub applied: SmallVec<[&'s Arc<CompiledLimit>; 4]>,
    pub checks: SmallVec<[Check<'s>; 4]>,
    by_ip: SmallVec<[bool; 4]>,
    /// Whether a limit bans, and the time its penalty box was read at.
    banning: bool,
    now: crate::limiter::Micros,
    /// When the store was asked (a traced request).
    asked: Option<std::time::Instant>,
}

/// What is left to do once the store has decided, before the request goes on or is refused:
/// the bans this refusal starts, shared with the fleet, and a delay (`Verdict::Forward`'s).
/// Empty for nearly every request: then nothing is awaited.
#[derive(Default)]
pub struct Later<'s> {
    bans: SmallVec<[(Check<'s>, crate::limiter::Micros); 1]>,
    delay: std::time::Duration,
}

impl Later<'_> {
    pub fn is_empty(&self) -> bool {
        self.bans.is_empty() && self.delay.is_zero()
    }

    /// Shares the bans, then waits out the delay (a client gone during it releases what it
    /// holds: the leases are already the request's).
    pub async fn run(self, snap: &Snapshot, route: &Route) {
        for (c, until) in self.bans {
            // A store that fails it leaves the ban to this gateway alone. Boxed: a rare call,
            // kept out of every request's future.
            if let Err(e) = Box::pin(snap.store.ban(&c, until)).await {
                tracing::warn!(route = &*route.name, limit = &*c.limit.name, error = %e, "the ban could not be shared through the store");
            }
            if let Some((_, bans)) = &c.limit.ban {
                bans.watch(&snap.store, c.limit);
            }
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
    }
}

/// Decides `route`'s limits and `plan`'s for a request from `client` (those `phase` decides).
#[allow(clippy::too_many_arguments)]
pub async fn check<'s>(
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    route: &'s Route,
    plan: Option<Plan<'s>>,
    head: &impl RequestHead,
    facts: &Facts<'_>,
    trail: &mut Trail<'s>,
    phase: Phase,
) -> Result<Gate<'s>, ProxyError> {
    let deciding = match prepare(snap, route, plan, head, facts, trail, phase)? {
        Prepared::Gate(g) => return Ok(g),
        Prepared::Decide(d) => d,
    };
    let decided = match snap.store.decide_here(&deciding.checks, ctx.worker()) {
        Some(d) => d,
        None => snap.store.decide(&deciding.checks, ctx.worker()).await,
    };
    let (gate, later) = conclude(snap, ctx, route, head, facts, trail, deciding, decided)?;
    if !later.is_empty() {
        later.run(snap, route).await;
    }
    Ok(gate)
}

/// The checks of `route`'s limits and `plan`'s (those `phase` decides), and what is decided
/// before the store is asked.
pub fn prepare<'s>(
    snap: &'s Snapshot,
    route: &'s Route,
    plan: Option<Plan<'s>>,
    head: &impl RequestHead,
    facts: &Facts<'_>,
    trail: &mut Trail<'s>,
    phase: Phase,
) -> Result<Prepared<'s>, ProxyError> {
    if route.limits.is_empty() && plan.is_none_or(|(l, _)| l.is_empty()) {
        return Ok(Prepared::Gate(Gate::Pass(Passed::default())));
    }
    let mut lease = 0;
    let Checks {
        applied,
        checks,
        by_ip,
        exempt,
    } = checks(route, plan, head, facts, &mut lease, phase, true)?;
    for l in &exempt {
        l.metrics.exempt.increment(1);
    }
    if checks.is_empty() {
        // Exempt from every limit (of this phase): nothing to ask the store.
        if phase == Phase::All || !exempt.is_empty() {
            trail.decision = Some(LimitDecision::Exempt);
        }
        return Ok(Prepared::Gate(Gate::Pass(Passed::default())));
    }
    // The penalty box: a banned subject is refused from this gateway's memory, the store not
    // asked.
    let banning = checks.iter().any(|c| c.limit.ban.is_some());
    let now = if banning { snap.store.local().now() } else { 0 };
    if banning {
        if let Some(answer) = banned(route, &checks, &by_ip, head, facts, trail, now) {
            return Ok(Prepared::Gate(Gate::Limited(answer)));
        }
    }
    // A byte budget of nothing refuses what it checks, the store not asked.
    if let Some(i) = checks.iter().position(|c| c.limit.zero_budget()) {
        let denied = zero_budget::decision(checks[i].limit);
        let answer = refused_here(route, &checks, &by_ip, head, facts, trail, i, denied);
        return Ok(Prepared::Gate(Gate::Limited(answer)));
    }
    Ok(Prepared::Decide(Deciding {
        applied,
        checks,
        by_ip,
        banning,
        now,
        asked: trail.trace.is_some().then(std::time::Instant::now),
    }))
}

/// The verdict on the store's decision (`decided`) of `deciding`'s checks, and what is left
/// to do before it stands ([`Later`]).
#[allow(clippy::too_many_arguments)]
pub fn conclude<'s>(
    snap: &'s Snapshot,
    ctx: &WorkerCtx,
    route: &'s Route,
    head: &impl RequestHead,
    facts: &Facts<'_>,
    trail: &mut Trail<'s>,
    deciding: Deciding<'s>,
    decided: Result<Vec<Decision>, tollgate_limit::store::StoreError>,
) -> Result<(Gate<'s>, Later<'s>), ProxyError> {
    let Deciding {
        applied,
        checks,
        by_ip,
        banning,
        now,
        asked,
    } = deciding;
    if let (Some(t), Some(t0)) = (trail.trace.as_deref_mut(), asked) {
        t.store_decided(t0, decided.is_ok());
    }
    let mut later = Later::default();
    match decided {
        Ok(decisions) => {
            let outcome = Outcome::of(&checks, &decisions);
            let leases = match outcome.verdict {
                Verdict::Limited {
                    limit,
                    retry_after_secs,
                } => {
                    if let Some(c) = checks.get(limit) {
                        let counted_by_ip = by_ip.get(limit).copied().unwrap_or(false);
                        let who = who_of(c, counted_by_ip, head, facts);
                        if let Who::Parts(parts) = &who {
                            trail.subject = Some(parts.clone());
                        }
                        c.limit.top.record(c.subject, who);
                        trail.limit = Some(c.limit);
                    }
                    trail.decision = Some(LimitDecision::Limited);
                    let mut retry_after_secs = retry_after_secs;
                    if banning {
                        // This refusal may be the one that starts a ban: then the client
                        // retries when the ban ends.
                        for (c, d) in checks.iter().zip(&decisions) {
                            let Some((rule, bans)) = &c.limit.ban else {
                                continue;
                            };
                            if c.limit.shadow || d.allowed || d.is_unasked() {
                                continue;
                            }
                            if d.is_banned() {
                                // Banned by another gateway (read from the store): held here
                                // until its end, the store not asked again.
                                if bans.hold(&c.subject, now, now.saturating_add(d.retry_after)) {
                                    bans.watch(&snap.store, c.limit);
                                }
                                continue;
                            }
                            let refused_until = now.saturating_add(d.retry_after);
                            if let Some(until) = bans.refused(&c.subject, now, *rule, refused_until)
                            {
                                c.limit.metrics.bans.increment(1);
                                retry_after_secs = retry_after_secs
                                    .max(until.saturating_sub(now).div_ceil(1_000_000));
                                // Shared with the fleet (one call, on the refusal that starts
                                // the ban), before the refusal is answered.
                                later.bans.push((*c, until));
                            }
                        }
                    }
                    let error = refusal(route, &checks, &decisions, limit, retry_after_secs, facts);
                    // The RateLimit fields as plain data: a front writes them into its head.
                    let rate = route
                        .rate_limit_headers
                        .then(|| outcome.rate_fields(&checks, &decisions))
                        .flatten();
                    return Ok((
                        Gate::Limited(Answer {
                            error,
                            headers: HeaderMap::new(),
                            rate,
                        }),
                        later,
                    ));
                }
                Verdict::Forward { delay } => {
                    // Held from here: released when dropped, a client gone during the delay
                    // included.
                    let leases = Leases::taken(&snap.store, ctx, &applied, &checks, &decisions);
                    let shadow = checks
                        .iter()
                        .zip(&decisions)
                        .find(|(c, d)| c.limit.shadow && !d.allowed);
                    trail.decision = Some(if !delay.is_zero() {
                        LimitDecision::Delayed
                    } else if let Some((c, _)) = shadow {
                        trail.limit = Some(c.limit);
                        if snap.config.log.access.is_on()
                            && !matches!(
                                c.limit.subject,
                                SubjectSpec::Ip
                                    | SubjectSpec::Global
                                    | SubjectSpec::Header(_)
                                    | SubjectSpec::Query(_)
                            )
                        {
                            trail.subject = Some(
                                shown_parts(&c.limit.subject, c.limit.prefixes, head, facts).into(),
                            );
                        }
                        LimitDecision::Shadow
                    } else {
                        LimitDecision::Allowed
                    });
                    later.delay = delay;
                    leases
                }
            };
            Ok((
                Gate::Pass(Passed {
                    applied,
                    checks,
                    decided: Some((decisions, outcome)),
                    leases,
                }),
                later,
            ))
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
                drop(Leases::unknown(&snap.store, ctx, &applied, &checks));
            }
            match snap.config.store.on_error {
                OnError::Allow => {
                    trail.decision = Some(LimitDecision::FailOpen);
                    checks
                        .iter()
                        .for_each(|c| c.limit.metrics.fail_open.increment(1));
                    Ok((
                        Gate::Pass(Passed {
                            applied,
                            checks,
                            decided: None,
                            leases: None,
                        }),
                        later,
                    ))
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
