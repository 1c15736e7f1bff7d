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

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::{Request, Response, Status};

use super::domains::{push_sf_string, Domains, Rule};
use super::metrics::{answered, refused, Answer, Refused};
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

/// The service, over the snapshot that serves (its domains and its store).
#[derive(Clone)]
pub struct RateLimiter {
    source: Arc<dyn Source>,
}

impl RateLimiter {
    pub fn new(source: Arc<dyn Source>) -> RateLimiter {
        RateLimiter { source }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Some((domains, store)) = self.source.domains() else {
            return Err(Status::unavailable(
                "the rate limit service is not configured",
            ));
        };
        let r = request.into_inner();
        let answer = should_rate_limit(&domains, &store, &r).await;
        answered(match &answer {
            Ok(a) if a.overall_code == Code::OverLimit as i32 => Answer::OverLimit,
            Ok(_) => Answer::Ok,
            Err(s) if s.code() == tonic::Code::InvalidArgument => Answer::Invalid,
            Err(_) => Answer::Unavailable,
        });
        answer.map(Response::new)
    }
}

fn invalid(r: Refused, message: &'static str) -> Status {
    refused(r);
    Status::invalid_argument(message)
}

/// The call's bounds (see the module's doc).
pub(super) fn check_bounds(r: &RateLimitRequest) -> Result<(), Status> {
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

/// A descriptor's subject: its entries, hashed (kind `d`; a NUL cannot occur in what Envoy
/// sends as key or value from headers, and lengths are mixed in all the same).
pub(super) fn subject_of(d: &RateLimitDescriptor) -> SubjectDigest {
    let mut bytes = Vec::with_capacity(
        d.entries
            .iter()
            .map(|e| e.key.len() + e.value.len() + 8)
            .sum(),
    );
    for e in &d.entries {
        for part in [&e.key, &e.value] {
            bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
    }
    SubjectDigest::of(b'd', &bytes)
}

/// What one descriptor asks of its limit: `hits_addend` (the descriptor's, else the call's, 0
/// or unset meaning 1) times the limit's `cost`. A descriptor's explicit 0 only checks. Above
/// the limit's capacity it can never be admitted: clamped there (the arithmetic stays exact).
fn op_of(limit: &Limit, r: &RateLimitRequest, d: &RateLimitDescriptor) -> Op {
    let hits = match d.hits_addend {
        Some(h) => h.value,
        None if r.hits_addend == 0 => 1,
        None => u64::from(r.hits_addend),
    };
    let p = &limit.policy;
    let units = hits
        .checked_mul(p.cost)
        .map_or(p.quota().saturating_add(1), |u| {
            u.min(p.quota().saturating_add(1))
        });
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
/// checks of those with a limit, and where each descriptor's check is.
pub(super) struct Planned<'a> {
    pub(super) rules: Vec<Option<&'a Arc<Rule>>>,
    pub(super) checks: Vec<Check<'a, Arc<Limit>>>,
    pub(super) at: Vec<Option<usize>>,
}

/// Matches `r`'s descriptors in `domain` (envoyproxy/ratelimit's rules, then `replaces`), the
/// one step `ShouldRateLimit` and `/-/explain` share (`count`: the service's metrics count it).
pub(super) fn plan<'a>(
    domain: &'a super::Domain,
    r: &RateLimitRequest,
    count: bool,
) -> Planned<'a> {
    let mut rules: Vec<Option<&Arc<Rule>>> = r
        .descriptors
        .iter()
        .map(|d| {
            if d.limit.is_some() && count {
                // Envoy's per-request override: not taken; the configured limit decides.
                refused(Refused::Overridden);
            }
            let rule = domain.find(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            if rule.is_none() && count {
                refused(Refused::NoMatch);
            }
            rule
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
    let mut at: Vec<Option<usize>> = Vec::with_capacity(rules.len());
    for (d, rule) in r.descriptors.iter().zip(&rules) {
        match rule.and_then(|rule| rule.limit.as_ref()) {
            Some(limit) => {
                at.push(Some(checks.len()));
                let subject = subject_of(d);
                checks.push(Check {
                    limit,
                    subject,
                    op: op_of(limit, r, d),
                });
            }
            None => at.push(None),
        }
    }
    Planned { rules, checks, at }
}

/// Decides a call: the reply, or the gRPC status of a call refused.
pub async fn should_rate_limit(
    domains: &Domains,
    store: &impl Store,
    r: &RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    check_bounds(r)?;
    let ok = DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    };
    let Some(domain) = domains.get(&r.domain) else {
        // As envoyproxy/ratelimit: a domain it has no limits for is under no limit.
        refused(Refused::UnknownDomain);
        return Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok; r.descriptors.len()],
            ..RateLimitResponse::default()
        });
    };
    let Planned { rules, checks, at } = plan(domain, r, true);
    let decisions: Vec<Decision> = if checks.is_empty() {
        Vec::new()
    } else {
        store
            .decide(&checks, WorkerId::NONE)
            .await
            .map_err(|e| Status::unavailable(format!("the store cannot decide: {e}")))?
    };
    let over = checks
        .iter()
        .zip(&decisions)
        .any(|(c, d)| !c.limit.shadow && !d.allowed);
    let mut statuses = Vec::with_capacity(r.descriptors.len());
    let mut field = String::new();
    let mut policy = String::new();
    for (rule, i) in rules.iter().zip(&at) {
        let (Some(rule), Some(i)) = (rule, i) else {
            if let Some(rule) = rule {
                rule.metrics.get().unlimited.increment(1);
            }
            statuses.push(ok.clone());
            continue;
        };
        let (Some(c), Some(d)) = (checks.get(*i), decisions.get(*i)) else {
            statuses.push(ok.clone());
            continue;
        };
        let shadow = c.limit.shadow;
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
        statuses.push(DescriptorStatus {
            code: if denied { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name: rule.name.as_deref().unwrap_or_default().to_owned(),
                requests_per_unit: rule.requests_per_unit,
                unit: rule.unit as i32,
            }),
            limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(pb_duration(if d.allowed {
                d.reset_after
            } else {
                d.retry_after
            })),
            quota: None,
        });
        if domains.ratelimit_headers && !shadow && !d.is_unasked() {
            append_fields(&mut field, &mut policy, rule, c, d);
        }
    }
    let mut headers = Vec::new();
    if !field.is_empty() {
        headers.push(header("ratelimit", field));
        headers.push(header("ratelimit-policy", policy));
        if over {
            let retry = checks
                .iter()
                .zip(&decisions)
                .filter(|(c, d)| !c.limit.shadow && !d.allowed)
                .map(|(_, d)| d.retry_after)
                .max()
                .unwrap_or(0);
            headers.push(header("retry-after", secs_ceil(retry).max(1).to_string()));
        }
    }
    Ok(RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    })
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// One item of the draft-11 `RateLimit` and `RateLimit-Policy` fields, with the descriptor's
/// subject as the partition key `pk`.
fn append_fields(
    field: &mut String,
    policy: &mut String,
    rule: &Rule,
    c: &Check<'_, Arc<Limit>>,
    d: &Decision,
) {
    if !field.is_empty() {
        field.push_str(", ");
        policy.push_str(", ");
    }
    let mut n = itoa::Buffer::new();
    push_sf_string(field, rule.label());
    field.push_str(";r=");
    field.push_str(n.format(d.remaining));
    field.push_str(";t=");
    field.push_str(n.format(secs_ceil(effective_window(&c.limit.policy, d))));
    field.push_str(";pk=");
    c.subject.write_sf_bytes(field);
    policy.push_str(&rule.policy_item);
    policy.push_str(";pk=");
    c.subject.write_sf_bytes(policy);
}
