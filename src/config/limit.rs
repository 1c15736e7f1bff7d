//! `[[routes.limits]]`: one limit's algorithm, size and subject, with defaults resolved and the
//! rules that keep its arithmetic exact.

use std::num::NonZeroU64;
use std::time::Duration;

use super::raw::RawLimit;
use super::response::{validate_after, ChargeAfter};
use super::subject::{Exempt, Prefixes, SubjectSpec};
use super::values::{Algorithm, Mode, OnMissing};
use super::{bounded, invalid, is_label_safe, ConfigError};
use crate::calendar::Calendar;

/// One `[[routes.limits]]` entry, with defaults resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitConfig {
    pub name: String,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period: Duration,
    pub subject: SubjectSpec,
    /// Resolved: token_bucket/gcra default to `limit`, leaky_bucket to 0, windows ignore it.
    pub burst: u64,
    pub cost: u64,
    pub mode: Mode,
    pub on_missing: OnMissing,
    /// `fixed_window` only: windows aligned to UTC calendar days, weeks or months; `period` is
    /// then the longest such window (for the exactness checks).
    pub calendar: Option<Calendar>,
    /// Charged after the response (`count_status` / `cost_header`); `None`: charged when admitted.
    pub after: Option<ChargeAfter>,
    /// The networks addresses are counted by (`[server]`'s unless the limit overrides them).
    pub prefixes: Prefixes,
    /// Whom the limit does not apply to.
    pub exempt: Exempt,
}

/// The largest integer both Rust and Redis's Lua (IEEE doubles) compute with exactly.
const EXACT_MAX: u128 = 1 << 53;

/// The longest limit `period`: one year (humantime's `1y`, 365.25 days).
pub const MAX_PERIOD: Duration = Duration::from_secs(31_557_600);

/// Validates one limit of a route; `at` is its path in the file (`routes[1].limits[0]`), used
/// in errors.
pub(super) fn validate_limit(
    at: &str,
    l: RawLimit,
    prefixes: Prefixes,
) -> Result<LimitConfig, ConfigError> {
    if l.scope.is_some() {
        return Err(invalid(
            format!("{at}.scope"),
            "only applies to [[plans.limits]]",
        ));
    }
    let Some(subject) = l.subject.clone() else {
        return Err(invalid(format!("{at}.subject"), "is required"));
    };
    validate_limit_of(at, l, subject, prefixes)
}

/// Validates one limit counting `subject` (a route limit's own, or a placeholder for a plan
/// limit, whose subject is the consumer).
pub(super) fn validate_limit_of(
    at: &str,
    l: RawLimit,
    subject: SubjectSpec,
    server_prefixes: Prefixes,
) -> Result<LimitConfig, ConfigError> {
    let lat = |field: &str| format!("{at}.{field}");
    if !is_label_safe(&l.name) {
        return Err(invalid(
            lat("name"),
            format!("{:?}: use 1-64 letters, digits, '-', '_' or '.'", l.name),
        ));
    }
    let limit = l.limit.get();
    let period = match (l.period, l.calendar) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                lat("calendar"),
                "set either `period` or `calendar`, not both",
            ))
        }
        (None, None) => return Err(invalid(lat("period"), "is required (or `calendar`)")),
        (None, Some(c)) => {
            if l.algorithm != Algorithm::FixedWindow {
                return Err(invalid(
                    lat("calendar"),
                    "only applies to fixed_window limits",
                ));
            }
            super::HumanDuration(Duration::from_micros(c.max_len()))
        }
        (Some(p), None) => p,
    };
    let period_us = period.0.as_micros();
    if period.0 < Duration::from_millis(1) {
        return Err(invalid(lat("period"), "must be at least 1ms"));
    }
    bounded(
        lat("period"),
        period,
        MAX_PERIOD,
        "1year (365.25 days)",
        false,
    )?;
    if period_us % 1000 != 0 {
        return Err(invalid(
            lat("period"),
            "must be a whole number of milliseconds",
        ));
    }
    let burst = match l.algorithm {
        Algorithm::FixedWindow
        | Algorithm::SlidingWindow
        | Algorithm::SlidingLog
        | Algorithm::Concurrency => {
            if l.burst.is_some() {
                return Err(invalid(
                    lat("burst"),
                    format!("{} has no burst; leave it out", l.algorithm.as_str()),
                ));
            }
            0
        }
        Algorithm::TokenBucket | Algorithm::Gcra => match l.burst {
            Some(0) => return Err(invalid(lat("burst"), "must be positive")),
            Some(b) => b,
            None => limit,
        },
        Algorithm::LeakyBucket => l.burst.unwrap_or(0),
    };
    let cost = l.cost.map_or(1, NonZeroU64::get);
    let capacity = match l.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => burst,
        Algorithm::LeakyBucket => burst.saturating_add(1),
        _ => limit,
    };
    if cost > capacity {
        return Err(invalid(
            lat("cost"),
            format!("cost {cost} can never be admitted (the bucket holds {capacity})"),
        ));
    }
    if matches!(l.algorithm, Algorithm::Gcra | Algorithm::LeakyBucket)
        && period_us / u128::from(limit) == 0
    {
        return Err(invalid(lat("limit"), "period / limit must be at least 1µs"));
    }
    if matches!(l.algorithm, Algorithm::SlidingLog) && limit > 100_000 {
        return Err(invalid(
            lat("limit"),
            "sliding_log keeps one entry per request; use at most 100000 (or sliding_window)",
        ));
    }
    // A fixed window multiplies no count by the period (its numbers are a count and times), so
    // a quota of 100,000 a month is exact, and neither does a concurrency limit (a count of
    // leases); the other algorithms scale counts by P.
    let scale = if matches!(l.algorithm, Algorithm::FixedWindow | Algorithm::Concurrency) {
        1
    } else {
        period_us.max(1)
    };
    if l.algorithm == Algorithm::Concurrency {
        if cost != 1 {
            return Err(invalid(
                lat("cost"),
                "a concurrency limit counts requests; leave cost out",
            ));
        }
        if limit > 100_000 {
            return Err(invalid(
                lat("limit"),
                "a concurrency limit keeps one lease per request in flight; use at most 100000",
            ));
        }
    }
    let after = validate_after(
        at,
        l.algorithm,
        l.count_status.as_deref(),
        l.cost_header.as_deref(),
        l.strip_cost_header,
    )?;
    if u128::from(limit.max(burst).saturating_add(cost))
        .checked_mul(scale)
        .is_none_or(|n| n >= EXACT_MAX)
    {
        // Name the key that made the product too large.
        let field = if burst > limit { "burst" } else { "limit" };
        return Err(invalid(
            lat(field),
            format!("{field} × period is too large to compute exactly (keep it under 2^53 µs)"),
        ));
    }
    if l.on_missing == OnMissing::Reject && !subject.can_be_missing() {
        return Err(invalid(
            lat("on_missing"),
            "only applies to subjects a request may lack (header:, query:, cookie:, host, consumer)",
        ));
    }
    if l.exempt.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid(
            lat("exempt"),
            "must list at least one entry (or be left out)",
        ));
    }
    let prefixes = Prefixes {
        v4: l.ipv4_prefix.map_or(server_prefixes.v4, |p| p.0),
        v6: l.ipv6_prefix.map_or(server_prefixes.v6, |p| p.0),
    };
    Ok(LimitConfig {
        name: l.name,
        algorithm: l.algorithm,
        limit,
        period: period.0,
        subject,
        burst,
        cost,
        mode: l.mode,
        on_missing: l.on_missing,
        calendar: l.calendar,
        after,
        prefixes,
        exempt: Exempt::from_entries(l.exempt.unwrap_or_default()),
    })
}
