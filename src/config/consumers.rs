//! `[consumers]` and `[[plans]]`: who the callers of an API product are and what each plan allows.
//!
//! The config file names where the key is read and the consumers file; the consumers themselves
//! (name, plan, SHA-256 of the key) live in that separate file, loaded by `crate::runtime::load`
//! into a `crate::consumers::ConsumerTable` at start-up and on every reload (and by
//! `tollgate check`), so thousands of customers never clutter `gateway.toml`. A plan's limits take the same keys as a
//! route's, minus `subject` (the subject is the consumer), plus `scope`.

use std::path::{Path, PathBuf};

use super::limit::{check_numbers, check_reserve, validate_limit_of, LimitConfig};
use super::raw::{RawConsumers, RawPlan};
use super::subject::SubjectSpec;
use super::values::{Algorithm, Scope};
use super::{invalid, is_label_safe, ConfigError};

/// Where a request's API key is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Header(http::HeaderName),
    /// A query parameter (percent-decoded).
    Query(String),
    /// No API key: consumers come from verified tokens only (`jwt_claim`).
    TokenOnly,
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Header(h) => write!(f, "header {h}"),
            KeySource::Query(q) => write!(f, "query parameter {q}"),
            KeySource::TokenOnly => f.write_str("bearer token"),
        }
    }
}

/// What happens to a request without a known key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknown {
    /// 401 (after the route's own limits are charged).
    Reject,
    /// The limits of the plan at this index of [`Config::plans`](super::Config::plans), counted
    /// per client address.
    Plan(usize),
}

/// `[consumers]`, validated (its file is loaded by `crate::runtime::load`).
#[derive(Debug, Clone)]
pub struct ConsumersConfig {
    pub source: KeySource,
    /// The consumers file, resolved against the config file's directory.
    pub file: PathBuf,
    pub on_unknown: OnUnknown,
    /// Remove the key from the request before forwarding it.
    pub strip_key: bool,
    /// The claim of a verified token that names the consumer (`jwt_claim`, a dotted path).
    pub jwt_claim: Option<Box<[Box<str>]>>,
    /// The claim that names the consumer's plan (`plan_claim`); without it, the consumers
    /// file's plan.
    pub plan_claim: Option<Box<[Box<str>]>>,
}

/// A claim's dotted path (`sub`, `org.id`).
fn claim_path(field: &str, s: &str) -> Result<Box<[Box<str>]>, ConfigError> {
    let parts: Vec<Box<str>> = s.split('.').map(Box::from).collect();
    if s.is_empty() || parts.len() > 8 || parts.iter().any(|p| p.is_empty()) {
        return Err(invalid(
            field,
            format!("{s:?} is not a claim name (a dotted path for nested claims, at most 8 deep)"),
        ));
    }
    Ok(parts.into_boxed_slice())
}

/// One `[[plans]]` entry.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    pub name: String,
    pub limits: Vec<PlanLimit>,
    /// `limit_rate` (with `limit_rate_after`) for this plan's consumers: `None`: the route's;
    /// `Some(None)`: no limit (`limit_rate = 0`), whatever the route's.
    pub limit_rate: Option<Option<crate::http::pacing::Pace>>,
}

/// One `[[plans.limits]]` entry (its `subject` is the consumer; `limit.subject` is `global`, a
/// placeholder).
#[derive(Debug, Clone)]
pub struct PlanLimit {
    pub limit: LimitConfig,
    pub scope: Scope,
}

impl PlanLimit {
    /// This limit with `limit = n` for one consumer (`limits = { name = n }` in the consumers
    /// file), checked as a plan's limit is. A token bucket's or GCRA's `burst` that equals its
    /// `limit` (the default) follows the override: such a bucket holds what it refills in a
    /// period, for this consumer too. `Err` says what is wrong (the caller names file and line).
    pub fn overridden(&self, n: i64) -> Result<LimitConfig, String> {
        let l = &self.limit;
        let n = u64::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("limit {:?}: {n} is not a positive whole number", l.name))?;
        let burst = match l.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra if l.burst == l.limit => n,
            _ => l.burst,
        };
        let period_us = l.period.as_micros();
        check_numbers(l.algorithm, n, burst, l.cost, period_us)
            .map_err(|(field, m)| format!("limit {:?} = {n}: {field}: {m}", l.name))?;
        if let Some(r) = l.after.as_ref().and_then(|a| a.reserve.as_ref()) {
            let capacity = match l.algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra => burst,
                _ => n,
            };
            check_reserve(r, l.cost, capacity)
                .map_err(|(field, m)| format!("limit {:?} = {n}: {field}: {m}", l.name))?;
        }
        Ok(LimitConfig {
            limit: n,
            burst,
            ..l.clone()
        })
    }
}

pub(super) fn validate_plans(
    raw: Vec<RawPlan>,
    prefixes: super::subject::Prefixes,
) -> Result<Vec<PlanConfig>, ConfigError> {
    let mut plans: Vec<PlanConfig> = Vec::with_capacity(raw.len());
    for (i, p) in raw.into_iter().enumerate() {
        let at = format!("plans[{i}]");
        if !is_label_safe(&p.name) {
            return Err(invalid(
                format!("{at}.name"),
                format!("{:?}: use 1-64 letters, digits, '-', '_' or '.'", p.name),
            ));
        }
        if plans.iter().any(|o| o.name == p.name) {
            return Err(invalid(
                format!("{at}.name"),
                format!("duplicate plan name {:?}", p.name),
            ));
        }
        let mut limits: Vec<PlanLimit> = Vec::with_capacity(p.limits.len());
        for (j, l) in p.limits.into_iter().enumerate() {
            let lat = format!("{at}.limits[{j}]");
            // A plan's limit counts per consumer; a `subject` adds parts to that (one count per
            // consumer and combination: `subject = ["path"]` is per consumer and path).
            let subject = match l.subject.clone() {
                None => SubjectSpec::Global,
                Some(s) => {
                    let mut parts = vec![SubjectSpec::Consumer];
                    for p in s.parts() {
                        if *p == SubjectSpec::Global {
                            return Err(invalid(
                                format!("{lat}.subject"),
                                "a plan's limit counts per consumer; `global` cannot be added",
                            ));
                        }
                        if *p != SubjectSpec::Consumer {
                            parts.push(p.clone());
                        }
                    }
                    SubjectSpec::compound(parts)
                        .map_err(|m| invalid(format!("{lat}.subject"), m))?
                }
            };
            if l.ban_after.is_some() || l.ban_for.is_some() {
                return Err(invalid(
                    format!("{lat}.ban_after"),
                    "applies to [[routes.limits]] only, for now",
                ));
            }
            if l.limit_from.is_some() {
                return Err(invalid(
                    format!("{lat}.limit_from"),
                    "applies to [[routes.limits]] only (a consumer's own limit is its `limits` override)",
                ));
            }
            let scope = l.scope.unwrap_or_default();
            let limit = validate_limit_of(&lat, l, subject, prefixes)?;
            if limits.iter().any(|o| o.limit.name == limit.name) {
                return Err(invalid(
                    format!("{lat}.name"),
                    format!("duplicate limit name {:?} in plan {:?}", limit.name, p.name),
                ));
            }
            limits.push(PlanLimit { limit, scope });
        }
        let limit_rate =
            super::limit_rate::validate_limit_rate(&at, p.limit_rate, p.limit_rate_after)?;
        plans.push(PlanConfig {
            name: p.name,
            limits,
            limit_rate,
        });
    }
    Ok(plans)
}

pub(super) fn validate_consumers(
    raw: RawConsumers,
    plans: &[PlanConfig],
    base_dir: &Path,
) -> Result<ConsumersConfig, ConfigError> {
    let jwt_claim = raw
        .jwt_claim
        .as_deref()
        .map(|c| claim_path("consumers.jwt_claim", c))
        .transpose()?;
    let plan_claim = raw
        .plan_claim
        .as_deref()
        .map(|c| claim_path("consumers.plan_claim", c))
        .transpose()?;
    if plan_claim.is_some() && jwt_claim.is_none() {
        return Err(invalid(
            "consumers.plan_claim",
            "needs `jwt_claim` (the claim that names the consumer)",
        ));
    }
    let source = match (raw.header, raw.query) {
        (None, None) if jwt_claim.is_some() => KeySource::TokenOnly,
        (Some(h), None) => KeySource::Header(
            http::HeaderName::from_bytes(h.trim().as_bytes())
                .map_err(|_| invalid("consumers.header", format!("{h:?} is not a header name")))?,
        ),
        (None, Some(q)) if !q.is_empty() => KeySource::Query(q),
        (None, Some(_)) => return Err(invalid("consumers.query", "must not be empty")),
        _ => {
            return Err(invalid(
                "consumers",
                "set exactly one of `header` and `query` (where the API key is read), or `jwt_claim` alone",
            ))
        }
    };
    let on_unknown = match raw.on_unknown.as_str() {
        "reject" => OnUnknown::Reject,
        name => match plans.iter().position(|p| p.name == name) {
            Some(i) => OnUnknown::Plan(i),
            None => {
                return Err(invalid(
                    "consumers.on_unknown",
                    format!("expected \"reject\" or the name of a [[plans]] entry, got {name:?}"),
                ))
            }
        },
    };
    if raw.file.as_os_str().is_empty() {
        return Err(invalid("consumers.file", "must not be empty"));
    }
    Ok(ConsumersConfig {
        source,
        file: base_dir.join(raw.file),
        on_unknown,
        strip_key: raw.strip_key,
        jwt_claim,
        plan_claim,
    })
}
