//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the gateway's own store.
//!
//! Each descriptor of a call is matched to its configured limit ([`super::matching`]), limits
//! another matched limit `replaces` are dropped, and the rest are decided together by the store
//! the gateway built (`[store]`: memory, Redis, Cluster, Sentinel, with its local tier, leases
//! and deny cache), all-or-nothing as a route's limits are: a call one descriptor refuses
//! charges none of them (envoyproxy/ratelimit charges each descriptor on its own, refused or
//! not). A descriptor's subject is its entries (keys and values), hashed like every subject.
//! A store that cannot decide answers `UNAVAILABLE`, so Envoy's `failure_mode_deny` decides.
//!
//! Everything a caller sends is bounded before anything is looked up: the message size (the
//! server's decoding limit), descriptors per call, entries per descriptor, bytes per entry;
//! each refusal is a gRPC `INVALID_ARGUMENT`, counted by reason.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::pb::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use super::pb::{Duration as PbDuration, HeaderValue, RateLimitResponse};
use tonic::Status;

use super::domains::{push_sf_string, Domains, Rule};
use super::message::{Call, Descriptor};
use super::metrics::{refused, Answer as Outcome, Answers, Refused};
use super::Source;
use crate::limiter::{effective_window, Decision, Limit, Op, SubjectDigest};
use tollgate_limit::store::Store;
use tollgate_limit::worker::WorkerId;
use tollgate_limit::Check;

/// The most descriptors one call may carry (Envoy sends one per matching rate-limit action).
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may have.
pub const MAX_ENTRIES: usize = 16;
/// The longest key or value of an entry, in bytes.
pub const MAX_ENTRY_BYTES: usize = 4096;
/// The largest request message (a call's descriptors are a few hundred bytes).
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;

/// The one method of the service.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The service, over the snapshot that serves (its domains and its store).
#[derive(Clone)]
pub struct RateLimiter {
    source: Arc<dyn Source>,
    answers: Arc<Answers>,
}

impl RateLimiter {
    /// The service over `source`; its counters are registered now (after the recorder is).
    pub fn new(source: Arc<dyn Source>) -> RateLimiter {
        RateLimiter {
            source,
            answers: Arc::new(Answers::register()),
        }
    }

    /// Decides one decoded call: now when the store can decide in process (no future built),
    /// else the future that asks it. Either answer is counted (`tollgate_rls_requests_total`)
    /// when it is made.
    pub fn answer(&self, call: Call) -> Answer {
        let Some((domains, store)) = self.source.domains() else {
            self.answers.count(Outcome::Unavailable);
            return Answer::Now(Err(Status::unavailable(
                "the rate limit service is not configured",
            )));
        };
        let rest = match should_rate_limit_here(&domains, &store, &call) {
            Here::Done(answer) => return Answer::Now(counted(&self.answers, answer)),
            Here::Ask => None,
            Here::Refund(decisions) => Some(decisions),
        };
        let answers = self.answers.clone();
        Answer::Later(Box::pin(async move {
            counted(
                &answers,
                should_rate_limit_after(&domains, &store, &call, rest).await,
            )
        }))
    }
}

/// A call's answer: made, or to be awaited (the store is asked).
pub enum Answer {
    Now(Result<RateLimitResponse, Status>),
    Later(Pin<Box<dyn Future<Output = Result<RateLimitResponse, Status>> + Send>>),
}

/// Counts an answer by its outcome.
fn counted(
    answers: &Answers,
    answer: Result<RateLimitResponse, Status>,
) -> Result<RateLimitResponse, Status> {
    answers.count(match &answer {
        Ok(a) if a.overall_code == Code::OverLimit as i32 => Outcome::OverLimit,
        Ok(_) => Outcome::Ok,
        Err(s) if s.code() == tonic::Code::InvalidArgument => Outcome::Invalid,
        Err(_) => Outcome::Unavailable,
    });
    answer
}

fn invalid(r: Refused, message: &'static str) -> Status {
    refused(r);
    Status::invalid_argument(message)
}

/// The call's bounds (see the module's doc).
pub(super) fn check_bounds(r: &Call) -> Result<(), Status> {
    if r.domain.is_empty() {
        return Err(invalid(
            Refused::EmptyDomain,
            "rate limit domain must not be empty",
        ));
    }
    if r.descriptors.is_empty() {
        return Err(invalid(
            Refused::NoDescriptors,
            "rate limit descriptor list must not be empty",
        ));
    }
    if r.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(
            Refused::TooManyDescriptors,
            "more than 64 descriptors in one call",
        ));
    }
    for d in &r.descriptors {
        if d.entries.is_empty() {
            return Err(invalid(
                Refused::EmptyDescriptor,
                "a descriptor has no entries",
            ));
        }
        if d.entries.len() > MAX_ENTRIES {
            return Err(invalid(
                Refused::TooManyEntries,
                "a descriptor has more than 16 entries",
            ));
        }
        if d.entries
            .iter()
            .any(|e| e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES)
        {
            return Err(invalid(
                Refused::EntryTooLong,
                "a descriptor entry is longer than 4096 bytes",
            ));
        }
    }
    Ok(())
}

/// A descriptor's subject: its entries' bytes, hashed (kind `d`; each key and value preceded
/// by its length, so no two descriptors share one). An entry a `share_threshold` wildcard
/// matched (`shared`: entry index, pattern) counts by the pattern instead of its value.
pub(super) fn subject_of(d: &Descriptor, shared: &[(usize, &str)]) -> SubjectDigest {
    let mut bytes = Vec::with_capacity(
        d.entries
            .iter()
            .map(|e| e.key.len() + e.value.len() + 8)
            .sum(),
    );
    for (i, e) in d.entries.iter().enumerate() {
        let value = shared
            .iter()
            .find(|(at, _)| *at == i)
            .map_or(e.value.as_slice(), |(_, p)| p.as_bytes());
        for part in [e.key.as_slice(), value] {
            bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
            bytes.extend_from_slice(part);
        }
    }
    SubjectDigest::of(b'd', &bytes)
}

/// The hits one descriptor asks: `hits_addend` (the descriptor's, else the call's, 0 or unset
/// meaning 1). A descriptor's explicit 0 only checks.
pub(super) fn hits_of(r: &Call, d: &Descriptor) -> u64 {
    match d.hits_addend {
        Some(h) => h.value,
        None if r.hits_addend == 0 => 1,
        None => u64::from(r.hits_addend),
    }
}

/// What a check of `units` (the hits times the limit's `cost`, summed over the call's copies of
/// one descriptor) asks of its limit. Above the limit's capacity it can never be admitted:
/// clamped there (the arithmetic stays exact), and refused by every algorithm.
fn op_for(limit: &Limit, units: u64) -> Op {
    let p = &limit.policy;
    let units = units.min(p.quota().saturating_add(1));
    if units == p.cost {
        Op::Decide
    } else {
        Op::Reserve(units)
    }
}

/// Whole seconds, rounded up.
fn secs_ceil(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

fn pb_duration(us: u64) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from((us % 1_000_000) * 1000).unwrap_or(0),
    }
}

/// A call's descriptors matched to their rules (`None`: under no limit, or replaced), the
/// checks of those with a limit, and where each descriptor's check is. The copies of one
/// descriptor in a call (one limit, one subject) share one check: their units are summed and
/// decided once, all or nothing, and each reports what remains after all of them.
pub(super) struct Planned<'a> {
    pub(super) rules: Vec<Option<&'a Arc<Rule>>>,
    /// Each matched descriptor's subject (a `share_threshold` entry counted by its pattern).
    pub(super) subjects: Vec<SubjectDigest>,
    pub(super) checks: Vec<Check<'a, Arc<Limit>>>,
    /// The units each check asks (before clamping): what a refund gives back.
    pub(super) units: Vec<u64>,
    pub(super) at: Vec<Option<usize>>,
    /// A descriptor of a `requests_per_unit: 0` limit (not in shadow mode) asks for hits: the
    /// call is refused, and its checks only read their limits (none is charged).
    pub(super) blocked: bool,
}

/// Matches `r`'s descriptors in `domain` (envoyproxy/ratelimit's rules, then `replaces`), the
/// one step `ShouldRateLimit` and `/-/explain` share (`count`: the service's metrics count it).
pub(super) fn plan<'a>(domain: &'a super::Domain, r: &Call, count: bool) -> Planned<'a> {
    let mut subjects = Vec::with_capacity(r.descriptors.len());
    let mut rules: Vec<Option<&Arc<Rule>>> = r
        .descriptors
        .iter()
        .map(|d| {
            if d.limit.is_some() && count {
                // Envoy's per-request override: not taken; the configured limit decides.
                refused(Refused::Overridden);
            }
            let found = domain.find(d.pairs());
            if found.is_none() && count {
                refused(Refused::NoMatch);
            }
            let shared = found.as_ref().map_or(&[][..], |f| f.shared.as_slice());
            subjects.push(subject_of(d, shared));
            found.map(|f| f.rule)
        })
        .collect();
    // `replaces`: a matched limit drops the matched limits it names.
    let replaced: Vec<&str> = rules
        .iter()
        .flatten()
        .flat_map(|rule| rule.replaces.iter().map(|n| &**n))
        .collect();
    if !replaced.is_empty() {
        for slot in &mut rules {
            if slot.is_some_and(|rule| rule.name.as_deref().is_some_and(|n| replaced.contains(&n)))
            {
                *slot = None;
            }
        }
    }
    let mut checks: Vec<Check<'_, Arc<Limit>>> = Vec::with_capacity(rules.len());
    let mut units: Vec<u64> = Vec::with_capacity(rules.len());
    let mut at: Vec<Option<usize>> = Vec::with_capacity(rules.len());
    let mut blocked = false;
    // `quota_mode` descriptors that refuse every hit (`requests_per_unit: 0`), and all of them:
    // when every one does, the call is refused before anything is asked.
    let (mut quota_blocked, mut quota_all) = (0usize, 0usize);
    for ((d, rule), subject) in r.descriptors.iter().zip(&rules).zip(&subjects) {
        let Some(rule) = rule else {
            at.push(None);
            continue;
        };
        let hits = hits_of(r, d);
        if rule.quota && (rule.limit.is_some() || rule.blocks) {
            quota_all += 1;
        }
        if rule.blocks && !rule.shadow && hits > 0 {
            if rule.quota {
                quota_blocked += 1;
            } else {
                blocked = true;
            }
        }
        let Some(limit) = rule.limit.as_ref() else {
            at.push(None);
            continue;
        };
        let subject = *subject;
        let asked = hits.saturating_mul(limit.policy.cost);
        // At most 64 descriptors: a linear search.
        match checks
            .iter()
            .position(|c| Arc::ptr_eq(c.limit, limit) && c.subject == subject)
        {
            Some(i) => {
                if let Some(u) = units.get_mut(i) {
                    *u = u.saturating_add(asked);
                }
                at.push(Some(i));
            }
            None => {
                at.push(Some(checks.len()));
                units.push(asked);
                checks.push(Check {
                    limit,
                    subject,
                    op: Op::Decide,
                });
            }
        }
    }
    if quota_blocked > 0 && quota_blocked == quota_all {
        blocked = true;
    }
    for (c, u) in checks.iter_mut().zip(&units) {
        c.op = op_for(c.limit, if blocked { 0 } else { *u });
    }
    Planned {
        rules,
        subjects,
        checks,
        units,
        at,
        blocked,
    }
}

/// The call's verdict from its checks' decisions, by envoyproxy/ratelimit's rule: refused when
/// a descriptor not in quota mode refuses (shadow ones never do), or when the call has
/// `quota_mode` descriptors and every one of them is over its limit. A quota-mode descriptor
/// over its limit alone is reported `OVER_LIMIT` and refuses nothing.
pub(super) struct Verdict {
    /// The call is refused.
    pub(super) over: bool,
    /// It is refused because every quota-mode descriptor is over (and nothing else refused):
    /// the store admitted its batch, so what it charged is given back.
    pub(super) by_quota: bool,
}

pub(super) fn verdict(r: &Call, p: &Planned<'_>, decisions: &[Decision]) -> Verdict {
    let denied = |i: Option<usize>| {
        i.and_then(|i| decisions.get(i))
            .is_some_and(|d: &Decision| !d.allowed)
    };
    let mut enforced = p.blocked;
    let (mut quota_all, mut quota_over) = (0usize, 0usize);
    for ((d, rule), i) in r.descriptors.iter().zip(&p.rules).zip(&p.at) {
        let Some(rule) = rule else { continue };
        // A shadow descriptor is never over; in quota mode it still counts among the call's
        // quota descriptors (as envoyproxy/ratelimit answers it `OK`).
        let over = !rule.shadow
            && if rule.blocks {
                hits_of(r, d) > 0
            } else {
                denied(*i)
            };
        if rule.quota {
            if rule.blocks || i.is_some() {
                quota_all += 1;
                quota_over += usize::from(over);
            }
        } else if over {
            enforced = true;
        }
    }
    let by_quota = !enforced && quota_all > 0 && quota_over == quota_all;
    Verdict {
        over: enforced || by_quota,
        by_quota,
    }
}

/// What [`should_rate_limit_here`] could do without awaiting.
pub enum Here {
    /// Decided (or refused): the answer.
    Done(Result<RateLimitResponse, Status>),
    /// The store must be asked (a round trip): nothing was charged; [`should_rate_limit_after`]
    /// with no decisions decides the call.
    Ask,
    /// Decided in process, but refused by its quota-mode descriptors: what the store charged is
    /// given back first ([`should_rate_limit_after`] with these decisions).
    Refund(Vec<Decision>),
}

/// Decides a call: the reply, or the gRPC status of a call refused.
pub async fn should_rate_limit(
    domains: &Domains,
    store: &impl Store,
    r: &Call,
) -> Result<RateLimitResponse, Status> {
    match should_rate_limit_here(domains, store, r) {
        Here::Done(answer) => answer,
        Here::Ask => should_rate_limit_after(domains, store, r, None).await,
        Here::Refund(decisions) => {
            should_rate_limit_after(domains, store, r, Some(decisions)).await
        }
    }
}

/// Decides a call now when the store can ([`Store::decide_here`]: the in-process store, the
/// local tier, leases with units in hand, a cached denial): no future is built or polled. What
/// it counts (the metrics of refused calls and unmatched descriptors) is counted once, here.
pub fn should_rate_limit_here(domains: &Domains, store: &impl Store, r: &Call) -> Here {
    if let Err(status) = check_bounds(r) {
        return Here::Done(Err(status));
    }
    // A domain that is not UTF-8 is none of the configured ones.
    let Some(domain) = std::str::from_utf8(&r.domain)
        .ok()
        .and_then(|d| domains.get(d))
    else {
        // As envoyproxy/ratelimit: a domain it has no limits for is under no limit.
        refused(Refused::UnknownDomain);
        return Here::Done(Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok_status(); r.descriptors.len()],
            ..RateLimitResponse::default()
        }));
    };
    let planned = plan(domain, r, true);
    let decisions: Vec<Decision> = if planned.checks.is_empty() {
        Vec::new()
    } else {
        match store.decide_here(&planned.checks, WorkerId::NONE) {
            None => return Here::Ask,
            Some(Err(e)) => return Here::Done(Err(store_failed(&e))),
            Some(Ok(d)) => d,
        }
    };
    let verdict = verdict(r, &planned, &decisions);
    if verdict.by_quota && !refunds(&planned, &decisions).is_empty() {
        return Here::Refund(decisions);
    }
    Here::Done(Ok(reply(domains, r, planned, &decisions, verdict)))
}

/// The rest of a call [`should_rate_limit_here`] could not finish: decided by the store
/// (`decided` `None`), or given back what its quota-mode refusal charged (`decided`: the
/// decisions made). Its descriptors were matched and counted already: not counted again.
pub async fn should_rate_limit_after(
    domains: &Domains,
    store: &impl Store,
    r: &Call,
    decided: Option<Vec<Decision>>,
) -> Result<RateLimitResponse, Status> {
    let Some(domain) = std::str::from_utf8(&r.domain)
        .ok()
        .and_then(|d| domains.get(d))
    else {
        // Only a call of a known domain is handed on (and a reload between the two steps
        // answers as a domain unknown there).
        return Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok_status(); r.descriptors.len()],
            ..RateLimitResponse::default()
        });
    };
    let planned = plan(domain, r, false);
    let decisions: Vec<Decision> = match decided {
        Some(d) => d,
        None if planned.checks.is_empty() => Vec::new(),
        None => store
            .decide(&planned.checks, WorkerId::NONE)
            .await
            .map_err(|e| store_failed(&e))?,
    };
    let verdict = verdict(r, &planned, &decisions);
    if verdict.by_quota {
        // Every quota-mode descriptor is over: the call is refused, but the store admitted its
        // batch (quota-mode limits never deny it) and charged what admitted. Given back, so a
        // refused call charges nothing, as every other refused call.
        let refunds = refunds(&planned, &decisions);
        if !refunds.is_empty() {
            store
                .settle(&refunds, WorkerId::NONE)
                .await
                .map_err(|e| store_failed(&e))?;
        }
    }
    Ok(reply(domains, r, planned, &decisions, verdict))
}

fn store_failed(e: &tollgate_limit::store::StoreError) -> Status {
    Status::unavailable(format!("the store cannot decide: {e}"))
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// What a call refused by its quota-mode descriptors gives back: each admitted check's units.
fn refunds<'a>(planned: &Planned<'a>, decisions: &[Decision]) -> Vec<Check<'a, Arc<Limit>>> {
    planned
        .checks
        .iter()
        .zip(decisions)
        .zip(&planned.units)
        .filter(|((c, d), _)| d.allowed && !d.is_unasked() && !c.limit.evaluated_only())
        .map(|((c, _), u)| Check {
            limit: c.limit,
            subject: c.subject,
            op: Op::Return((*u).min(c.limit.policy.quota())),
        })
        .collect()
}

/// The reply to a decided call: each descriptor's status and, with `ratelimit_headers`, the
/// draft-11 fields.
fn reply(
    domains: &Domains,
    r: &Call,
    planned: Planned<'_>,
    decisions: &[Decision],
    verdict: Verdict,
) -> RateLimitResponse {
    let Verdict { over, by_quota } = verdict;
    let ok = ok_status();
    let Planned {
        rules,
        subjects,
        checks,
        units,
        at,
        blocked: _,
    } = planned;
    let mut statuses = Vec::with_capacity(r.descriptors.len());
    let mut field = String::new();
    let mut policy = String::new();
    let mut retry = 0;
    // The checks whose RateLimit item is written (a repeated descriptor's once).
    let mut written = vec![false; checks.len()];
    for (((d, rule), i), subject) in r.descriptors.iter().zip(&rules).zip(&at).zip(&subjects) {
        let Some(rule) = rule else {
            statuses.push(ok.clone());
            continue;
        };
        let subject = *subject;
        let current_limit = Some(RateLimit {
            name: rule.name.as_deref().unwrap_or_default().to_owned(),
            requests_per_unit: rule.requests_per_unit,
            unit: rule.unit as i32,
        });
        if rule.blocks {
            // `requests_per_unit: 0`: every hit is refused; a check of 0 hits passes.
            let hit = hits_of(r, d) > 0;
            let denied = hit && !rule.shadow;
            if hit {
                if rule.shadow {
                    rule.metrics.get().shadow.increment(1);
                } else {
                    rule.metrics.get().over_limit.increment(1);
                    rule.top.record(subject, crate::top::Who::Global);
                }
            }
            let period = u64::try_from(rule.period.as_micros()).unwrap_or(u64::MAX);
            statuses.push(DescriptorStatus {
                code: if denied { Code::OverLimit } else { Code::Ok } as i32,
                current_limit,
                limit_remaining: 0,
                duration_until_reset: Some(pb_duration(period)),
            });
            if domains.ratelimit_headers && !rule.shadow {
                if denied && (!rule.quota || by_quota) {
                    retry = retry.max(period);
                }
                append_item(&mut field, &mut policy, rule, subject, 0, secs_ceil(period));
            }
            continue;
        }
        let Some(i) = *i else {
            // `unlimited`: OK, with the most a reply can say remains (as envoyproxy/ratelimit).
            rule.metrics.get().unlimited.increment(1);
            statuses.push(DescriptorStatus {
                limit_remaining: u32::MAX,
                ..ok.clone()
            });
            continue;
        };
        let (Some(c), Some(d)) = (checks.get(i), decisions.get(i)) else {
            statuses.push(ok.clone());
            continue;
        };
        let shadow = rule.shadow;
        if !d.allowed {
            if shadow {
                rule.metrics.get().shadow.increment(1);
            } else {
                rule.metrics.get().over_limit.increment(1);
                rule.top.record(c.subject, crate::top::Who::Global);
            }
        } else if !over {
            rule.metrics.get().ok.increment(1);
        }
        let denied = !d.allowed && !shadow;
        if denied && (!rule.quota || by_quota) {
            retry = retry.max(d.retry_after);
        }
        // Given back (above): what remains is what it charged more.
        let remaining = match units.get(i) {
            Some(u) if by_quota && d.allowed && !d.is_unasked() => {
                d.remaining.saturating_add(*u).min(c.limit.policy.quota())
            }
            _ => d.remaining,
        };
        statuses.push(DescriptorStatus {
            code: if denied { Code::OverLimit } else { Code::Ok } as i32,
            current_limit,
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(pb_duration(if d.allowed {
                d.reset_after
            } else {
                d.retry_after
            })),
        });
        let first = written
            .get_mut(i)
            .is_some_and(|w| !std::mem::replace(w, true));
        if domains.ratelimit_headers && !shadow && !d.is_unasked() && first {
            append_item(
                &mut field,
                &mut policy,
                rule,
                c.subject,
                remaining,
                secs_ceil(effective_window(&c.limit.policy, d)),
            );
        }
    }
    let mut headers = Vec::new();
    if !field.is_empty() {
        headers.push(header("ratelimit", field));
        headers.push(header("ratelimit-policy", policy));
        if over {
            headers.push(header("retry-after", secs_ceil(retry).max(1).to_string()));
        }
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
    }
}

/// One item of the draft-11 `RateLimit` and `RateLimit-Policy` fields, with the descriptor's
/// subject as the partition key `pk`: `remaining` units left, `t` seconds until it resets.
fn append_item(
    field: &mut String,
    policy: &mut String,
    rule: &Rule,
    subject: SubjectDigest,
    remaining: u64,
    t: u64,
) {
    if !field.is_empty() {
        field.push_str(", ");
        policy.push_str(", ");
    }
    let mut n = itoa::Buffer::new();
    push_sf_string(field, rule.label());
    field.push_str(";r=");
    field.push_str(n.format(remaining));
    field.push_str(";t=");
    field.push_str(n.format(t));
    field.push_str(";pk=");
    subject.write_sf_bytes(field);
    policy.push_str(&rule.policy_item);
    policy.push_str(";pk=");
    subject.write_sf_bytes(policy);
}
