//! `[[routes.limits]]`: one limit's algorithm, size and subject, with defaults resolved and the
//! rules that keep its arithmetic exact.

use std::num::NonZeroU64;
use std::time::Duration;

use super::raw::RawLimit;
use super::response::{validate_after, ChargeAfter};
use super::subject::{Exempt, Prefixes, SubjectSpec};
use super::values::{Algorithm, Mode, OnMissing};
use super::{bounded, invalid, is_label_safe, ConfigError};
use tollgate_limit::calendar::{CalendarWindow, MAX_OFFSET_MIN};

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
    /// `fixed_window` only: windows aligned to calendar days, weeks or months (UTC, or
    /// `utc_offset`; months from `anchor_day`); `period` is then the longest such window (for
    /// the exactness checks).
    pub calendar: Option<CalendarWindow>,
    /// Charged after the response (`count_status` / `cost_header`); `None`: charged when admitted.
    pub after: Option<ChargeAfter>,
    /// Where its state lives in a fleet (`store`).
    pub fleet: super::fleet::Fleet,
    /// The networks addresses are counted by (`[server]`'s unless the limit overrides them).
    pub prefixes: Prefixes,
    /// Whom the limit does not apply to.
    pub exempt: Exempt,
    /// The shape of its refusals (`refusal`; `None`: the route's).
    pub refusal: Option<std::sync::Arc<super::Refusal>>,
    /// `limit_from` and `limit_max`: the limit read per request from the caller's identity.
    pub limit_from: Option<LimitFrom>,
    /// `ban_after` refusals within `period` ban the subject for `ban_for`.
    pub ban: Option<Ban>,
}

/// A limit's penalty box (`ban_after`, `ban_for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    pub after: u32,
    pub ban_for: Duration,
}

/// `limit_from = "jwt:CLAIM" | "header:NAME"` with its ceiling `limit_max`: a caller's own limit,
/// the configured `limit` when the value is absent or not a positive integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitFrom {
    pub source: LimitSource,
    /// No caller's limit exceeds it (a larger value is clamped to it).
    pub max: u64,
}

/// Where a caller's limit is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// A claim of the request's verified token (by its dotted path).
    Jwt(Box<[Box<str>]>),
    /// A request header, read only from a peer in `[server] trusted_proxies`.
    Header(http::HeaderName),
}

impl LimitFrom {
    /// A value as a caller's limit: a positive integer of at most 19 digits (a JSON number
    /// that is one, or a string of ASCII digits), clamped to `max`; `None` (the default) for
    /// anything else (`-1`, `0`, `1e309`, `0x10`, `10.5`, an array, 20 digits).
    pub fn value_of_json(&self, v: &serde_json::Value) -> Option<u64> {
        match v {
            serde_json::Value::Number(n) => n.as_u64(),
            serde_json::Value::String(s) => digits(s.as_bytes()),
            _ => None,
        }
        .filter(|&n| n > 0)
        .map(|n| n.min(self.max))
    }

    /// A header value as a caller's limit (see [`LimitFrom::value_of_json`]).
    pub fn value_of_bytes(&self, v: &[u8]) -> Option<u64> {
        digits(v.trim_ascii())
            .filter(|&n| n > 0)
            .map(|n| n.min(self.max))
    }
}

/// `s` as a whole number when it is 1–19 ASCII digits.
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
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
    let limit = l.limit;
    // A byte budget of nothing: decided by the gateway without the store (`CompiledLimit::
    // zero_budget`), so none of the store's numbers rules apply, and nothing that needs a count.
    let zero = limit == 0;
    if zero {
        let refused = if l.unit != super::response::Unit::Bytes {
            Some((
                "limit",
                "must be positive (0 only with unit = \"bytes\": a budget of no byte)",
            ))
        } else if l.burst.is_some() {
            Some(("burst", "a byte limit of 0 has no burst; leave it out"))
        } else if l.mode == Mode::Shadow {
            Some((
                "mode",
                "a shadow byte limit of 0 would only log every request; give it a budget",
            ))
        } else if l.limit_from.is_some() {
            Some((
                "limit_from",
                "not with limit = 0 (the default a caller's value falls back to must be a budget)",
            ))
        } else if l.ban_after.is_some() {
            Some((
                "ban_after",
                "a byte limit of 0 refuses every request already; there is no one to ban",
            ))
        } else {
            None
        };
        if let Some((key, why)) = refused {
            return Err(invalid(lat(key), why));
        }
    }
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
    let calendar = calendar_window(&lat, &l)?;
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
    if !zero {
        check_numbers(l.algorithm, limit, burst, cost, period_us)
            .map_err(|(f, m)| invalid(lat(f), m))?;
    }
    let after = validate_after(
        at,
        l.algorithm,
        l.count_status.as_deref(),
        l.cost_header.as_deref(),
        l.strip_cost_header,
        l.cost_from.as_ref(),
        (l.reserve.as_ref(), l.reserve_max),
    )?;
    let after = super::response::validate_bytes(at, l.algorithm, l.unit, l.bytes, after)?;
    let capacity = match l.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => burst,
        Algorithm::LeakyBucket => burst.saturating_add(1),
        _ => limit,
    };
    if let Some(r) = after.as_ref().and_then(|a| a.reserve.as_ref()) {
        check_reserve(r, cost, capacity).map_err(|(f, m)| invalid(lat(f), m))?;
    }
    if l.on_missing == OnMissing::Reject && !subject.can_be_missing() {
        return Err(invalid(
            lat("on_missing"),
            "only applies to subjects a request may lack (header:, query:, cookie:, host, consumer, jwt:, json:, tls:)",
        ));
    }
    let fleet = super::fleet::validate_fleet(
        at,
        super::fleet::RawFleet {
            store: l.store,
            sync: l.sync,
            lease_ttl: l.lease_ttl,
            lease_max: l.lease_max,
        },
        l.algorithm,
        capacity,
        cost,
        after.is_some(),
    )?;
    if l.exempt.as_ref().is_some_and(Vec::is_empty) {
        return Err(invalid(
            lat("exempt"),
            "must list at least one entry (or be left out)",
        ));
    }
    let limit_from = limit_from(&lat, &l, limit, burst, cost, period_us, after.is_some())?;
    let ban = match (l.ban_after, l.ban_for) {
        (None, None) => None,
        (Some(_), None) => return Err(invalid(lat("ban_for"), "is required with `ban_after`")),
        (None, Some(_)) => return Err(invalid(lat("ban_after"), "is required with `ban_for`")),
        (Some(n), Some(d)) => {
            if l.mode == Mode::Shadow {
                return Err(invalid(
                    lat("ban_after"),
                    "a shadow limit refuses nobody, so bans nobody",
                ));
            }
            if d.0 < Duration::from_secs(1) {
                return Err(invalid(lat("ban_for"), "must be at least 1s"));
            }
            bounded(lat("ban_for"), d, MAX_PERIOD, "1year (365.25 days)", false)?;
            Some(Ban {
                after: n.get(),
                ban_for: d.0,
            })
        }
    };
    let refusal = match l.refusal {
        Some(r) => Some(std::sync::Arc::new(super::refusal::validate_refusal(
            &lat("refusal"),
            r,
        )?)),
        None => None,
    };
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
        calendar,
        after,
        fleet,
        prefixes,
        exempt: Exempt::from_entries(l.exempt.unwrap_or_default()),
        refusal,
        limit_from,
        ban,
    })
}

/// `limit_from` and `limit_max`: the ceiling at least the configured limit, exact as a limit
/// itself (every value up to it is), and not with what fixes a limit's numbers elsewhere (a
/// lease's size, a reservation).
fn limit_from(
    lat: &dyn Fn(&str) -> String,
    l: &RawLimit,
    limit: u64,
    burst: u64,
    cost: u64,
    period_us: u128,
    after: bool,
) -> Result<Option<LimitFrom>, ConfigError> {
    let Some(from) = &l.limit_from else {
        if l.limit_max.is_some() {
            return Err(invalid(lat("limit_max"), "only applies with `limit_from`"));
        }
        return Ok(None);
    };
    let source = if let Some(name) = from.strip_prefix("header:") {
        LimitSource::Header(
            http::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| invalid(lat("limit_from"), format!("{from:?}: not a header name")))?,
        )
    } else if let Some(path) = from.strip_prefix("jwt:") {
        match SubjectSpec::parse_one(from) {
            Ok(SubjectSpec::Jwt(p)) if !path.is_empty() => LimitSource::Jwt(p),
            _ => {
                return Err(invalid(
                    lat("limit_from"),
                    format!("{from:?}: expected jwt:CLAIM (a dotted path, at most 8 deep)"),
                ))
            }
        }
    } else {
        return Err(invalid(
            lat("limit_from"),
            format!("{from:?}: expected \"jwt:CLAIM\" or \"header:NAME\""),
        ));
    };
    let Some(max) = l.limit_max else {
        return Err(invalid(
            lat("limit_max"),
            "is required with `limit_from`: the most any caller may be given",
        ));
    };
    let max = max.get();
    if max < limit {
        return Err(invalid(
            lat("limit_max"),
            format!("{max} is below the configured limit ({limit}), the default"),
        ));
    }
    if l.sync == super::fleet::Sync::Lease {
        return Err(invalid(
            lat("limit_from"),
            "not with sync = \"lease\" (a lease's size is fixed by the limit)",
        ));
    }
    if after && l.reserve.is_some() {
        return Err(invalid(
            lat("limit_from"),
            "not with `reserve` (a reservation is fixed by the limit)",
        ));
    }
    // Every caller's numbers are checked as the ceiling's: a burst that follows the limit
    // follows it up to `limit_max`.
    let top_burst = if burst == limit { max } else { burst };
    let top_burst = match l.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => top_burst,
        _ => burst,
    };
    check_numbers(l.algorithm, max, top_burst, cost, period_us)
        .map_err(|(_, m)| invalid(lat("limit_max"), m))?;
    Ok(Some(LimitFrom { source, max }))
}

/// The rules on a limit's numbers (limit, burst, cost, period in µs) that keep it admissible and
/// its arithmetic exact; `Err` names the key. Shared by `[[routes.limits]]`, `[[plans.limits]]`,
/// a consumer's override of a plan's limit (`PlanLimit::overridden`) and the `[rls]` service's
/// descriptors (`crate::rls`).
pub fn check_numbers(
    algorithm: Algorithm,
    limit: u64,
    burst: u64,
    cost: u64,
    period_us: u128,
) -> Result<(), (&'static str, String)> {
    let capacity = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => burst,
        Algorithm::LeakyBucket => burst.saturating_add(1),
        _ => limit,
    };
    if cost > capacity {
        return Err((
            "cost",
            format!("cost {cost} can never be admitted (the bucket holds {capacity})"),
        ));
    }
    if matches!(algorithm, Algorithm::Gcra | Algorithm::LeakyBucket)
        && period_us / u128::from(limit.max(1)) == 0
    {
        return Err(("limit", "period / limit must be at least 1µs".into()));
    }
    if matches!(algorithm, Algorithm::SlidingLog) && limit > 100_000 {
        return Err((
            "limit",
            "sliding_log keeps one entry per request; use at most 100000 (or sliding_window)"
                .into(),
        ));
    }
    // A fixed window multiplies no count by the period (its numbers are a count and times), so
    // a quota of 100,000 a month is exact, and neither does a concurrency limit (a count of
    // leases); the other algorithms scale counts by P.
    let scale = if matches!(algorithm, Algorithm::FixedWindow | Algorithm::Concurrency) {
        1
    } else {
        period_us.max(1)
    };
    if algorithm == Algorithm::Concurrency {
        if cost != 1 {
            return Err((
                "cost",
                "a concurrency limit counts requests; leave cost out".into(),
            ));
        }
        if limit > 100_000 {
            return Err((
                "limit",
                "a concurrency limit keeps one lease per request in flight; use at most 100000"
                    .into(),
            ));
        }
    }
    if u128::from(limit.max(burst).saturating_add(cost))
        .checked_mul(scale)
        .is_none_or(|n| n >= EXACT_MAX)
    {
        // Name the key that made the product too large.
        let field = if burst > limit { "burst" } else { "limit" };
        return Err((
            field,
            format!("{field} × period is too large to compute exactly (keep it under 2^53 µs)"),
        ));
    }
    Ok(())
}

/// A reservation's bounds: it must fit the limit's capacity, and a reservation read from the
/// body (at least `cost`, at most `reserve_max`) must have room for the `cost` it falls back to.
/// Shared with a consumer's override of a plan's limit (`PlanLimit::overridden`).
pub(super) fn check_reserve(
    r: &super::response::Reserve,
    cost: u64,
    capacity: u64,
) -> Result<(), (&'static str, String)> {
    use super::response::Reserve;
    match r {
        Reserve::Units(n) if *n > capacity => Err((
            "reserve",
            format!("a reserve of {n} can never be admitted (the limit holds {capacity})"),
        )),
        Reserve::Json { max, .. } if *max > capacity => Err((
            "reserve_max",
            format!("a reservation of {max} can never be admitted (the limit holds {capacity})"),
        )),
        Reserve::Json { max, .. } if *max < cost => Err((
            "reserve_max",
            format!("{max} is below the limit's cost ({cost}), what a request without the field reserves"),
        )),
        _ => Ok(()),
    }
}

/// `calendar` with its `anchor_day` and `utc_offset`: each only with the unit it applies to.
fn calendar_window(
    lat: &dyn Fn(&str) -> String,
    l: &RawLimit,
) -> Result<Option<CalendarWindow>, ConfigError> {
    use tollgate_limit::calendar::Calendar;
    let Some(unit) = l.calendar else {
        for (key, set) in [
            ("anchor_day", l.anchor_day.is_some()),
            ("utc_offset", l.utc_offset.is_some()),
        ] {
            if set {
                return Err(invalid(lat(key), "only applies with `calendar`"));
            }
        }
        return Ok(None);
    };
    let mut w = CalendarWindow::from(unit);
    if let Some(a) = l.anchor_day {
        if unit != Calendar::Month {
            return Err(invalid(
                lat("anchor_day"),
                "only applies with calendar = \"month\" (a day or week window has `utc_offset`)",
            ));
        }
        w.anchor_day = anchor_day(a).map_err(|m| invalid(lat("anchor_day"), m))?;
    }
    if let Some(o) = &l.utc_offset {
        if unit == Calendar::Month {
            return Err(invalid(
                lat("utc_offset"),
                "only applies with calendar = \"day\" or \"week\" (a month window has `anchor_day`)",
            ));
        }
        w.utc_offset_min = utc_offset(o).map_err(|m| invalid(lat("utc_offset"), m))?;
    }
    Ok(Some(w))
}

/// The first billing day (the loader's and the schema's bound).
pub const MIN_ANCHOR_DAY: u8 = 1;
/// The last billing day every month has.
pub const MAX_ANCHOR_DAY: u8 = 28;

/// A billing day: 1–28 (every month has it).
pub fn anchor_day(n: i64) -> Result<u8, String> {
    u8::try_from(n)
        .ok()
        .filter(|d| (MIN_ANCHOR_DAY..=MAX_ANCHOR_DAY).contains(d))
        .ok_or_else(|| {
            format!("{n}: use a day from 1 to 28 (every month has it; for the month's end use 1, the next month's first day)")
        })
}

/// `"+HH:MM"` / `"-HH:MM"` (or `"Z"`), within ±14:00, as minutes east of UTC.
pub fn utc_offset(s: &str) -> Result<i16, String> {
    let bad = || {
        format!(
            "{s:?}: expected an offset from UTC such as \"-05:00\" or \"+09:30\" (within ±14:00)"
        )
    };
    if s == "Z" {
        return Ok(0);
    }
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 || !h.bytes().chain(m.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (h, m): (i16, i16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    let min = h * 60 + m;
    if m >= 60 || min > MAX_OFFSET_MIN {
        return Err(bad());
    }
    Ok(sign * min)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(limit: &str, server: &str) -> Result<Config, String> {
        Config::parse(
            &format!("[server]\n{server}\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n[[routes.limits]]\nname = \"l\"\nalgorithm = \"fixed_window\"\nperiod = \"1s\"\nsubject = \"ip\"\n{limit}\n"),
            std::path::Path::new("."),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn limit_from_needs_a_ceiling_and_a_trusted_header() {
        let c = parse(
            "limit = 2\nlimit_from = \"header:x-tier\"\nlimit_max = 10",
            "trusted_proxies = [\"10.0.0.0/8\"]",
        )
        .unwrap();
        let f = c.routes[0].limits[0].limit_from.as_ref().unwrap();
        assert_eq!(f.max, 10);
        for (v, want) in [
            (serde_json::json!(4), Some(4)),
            (serde_json::json!("7"), Some(7)),
            (serde_json::json!(11), Some(10)),
            (serde_json::json!(-1), None),
            (serde_json::json!(0), None),
            (serde_json::json!(2.5), None),
            (serde_json::json!("0x10"), None),
            (serde_json::json!("12345678901234567890"), None),
            (serde_json::json!([4]), None),
        ] {
            assert_eq!(f.value_of_json(&v), want, "{v}");
        }
        assert_eq!(f.value_of_bytes(b" 9 "), Some(9));
        assert_eq!(f.value_of_bytes(b"+9"), None);
        for (limit, server, key) in [
            ("limit = 2\nlimit_from = \"header:x\"", "", "limit_max"),
            ("limit = 2\nlimit_max = 5", "", "limit_max"),
            (
                "limit = 6\nlimit_from = \"jwt:x\"\nlimit_max = 5",
                "",
                "limit_max",
            ),
            (
                "limit = 2\nlimit_from = \"cookie:x\"\nlimit_max = 5",
                "",
                "limit_from",
            ),
            (
                "limit = 2\nlimit_from = \"header:x-tier\"\nlimit_max = 5",
                "",
                "limit_from",
            ),
        ] {
            let e = parse(limit, server).unwrap_err();
            assert!(
                e.contains(&format!("routes[0].limits[0].{key}")),
                "{limit}: {e}"
            );
        }
        assert!(parse(
            "limit = 2\nlimit_from = \"header:x-tier\"\nlimit_max = 5",
            "trusted_proxies = [\"10.0.0.0/8\"]"
        )
        .is_ok());
    }
}
