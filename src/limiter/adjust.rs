//! Support's corrections to one limit's state for one subject: reset and grant, pure functions
//! of (policy, state, now) like the algorithms, applied by the in-process store under its shard
//! lock and by `src/store/scripts/quota.lua`, line for line, in one atomic Redis step.
//!
//! **Reset** forgets the state: the limit is fresh for the subject. **Grant** gives back
//! `units` of what the subject used in the current window, never more than it used (a limit is
//! never more than fresh, so the `remaining` of the headers never exceeds the quota):
//!
//! - fixed window, calendar window: the current window's count goes down by `units` (not below
//!   0); a count of an earlier window is not touched (it no longer counts);
//! - sliding window: the current window's count, then the previous window's;
//! - token bucket: `units` tokens are added, up to the burst;
//! - GCRA, leaky bucket: the TAT moves back by `units × T` (T = period / limit), not before now;
//! - sliding log and concurrency: refused ([`Refused`]): a log's entries are timestamps that a
//!   grant would have to invent, and a concurrency limit counts requests in flight (a reset
//!   would let more in than its limit while they run; they free their slots when they end).

use super::algorithm::{admit, evaluate};
use super::{Micros, Policy, State};
use crate::config::Algorithm;

/// What support asks of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjust {
    Reset,
    /// Give back this many units (≥ 1).
    Grant(u64),
}

impl Adjust {
    /// The `action` label of `tollgate_quota_admin_total`.
    pub fn action(self) -> &'static str {
        match self {
            Adjust::Reset => "reset",
            Adjust::Grant(_) => "grant",
        }
    }
}

/// Why a limit cannot be adjusted so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a concurrency limit counts requests in flight: they free their slots when they end; there is nothing to reset or grant")]
    Concurrency,
    #[error("a sliding_log limit cannot be granted units (its entries are the requests' times); reset it instead")]
    SlidingLogGrant,
}

/// Whether `adjust` can be applied to a limit of `algorithm`.
pub fn check(algorithm: Algorithm, adjust: Adjust) -> Result<(), Refused> {
    match (algorithm, adjust) {
        (Algorithm::Concurrency, _) => Err(Refused::Concurrency),
        (Algorithm::SlidingLog, Adjust::Grant(_)) => Err(Refused::SlidingLogGrant),
        _ => Ok(()),
    }
}

/// The most credit, in units, a subject can hold beyond a fresh limit: the quota, and less
/// where (max(L, B) + credit) × P would reach 2^53 (× 1 for a fixed window, whose numbers are
/// counts) — the bound under which the Lua scripts' doubles compute exactly what Rust does. At
/// least 1 for every valid limit (the config keeps (max(L, B) + C) × P below 2^53).
pub fn credit_max(p: &Policy) -> u64 {
    const EXACT: u64 = (1 << 53) - 1;
    let (scale, top) = match p.algorithm {
        Algorithm::FixedWindow => (1, p.limit),
        _ => (p.period.max(1), p.limit.max(p.burst)),
    };
    (EXACT / scale).saturating_sub(top).min(p.quota())
}

/// The state after `adjust` at `now` (`None`: fresh). Call after [`check`] admitted it.
pub fn apply(p: &Policy, state: Option<State>, now: Micros, adjust: Adjust) -> Option<State> {
    let units = match adjust {
        Adjust::Reset => return None,
        Adjust::Grant(u) => u,
    };
    let state = state?;
    match (p.algorithm, state) {
        (Algorithm::FixedWindow, State::FixedWindow { window, count }) => {
            let (w, _) = p.fixed_window(now);
            Some(State::FixedWindow {
                window,
                count: if window == w {
                    count
                        .saturating_sub(i64::try_from(units).unwrap_or(i64::MAX))
                        .max(0)
                } else {
                    count
                },
            })
        }
        (Algorithm::SlidingWindow, State::SlidingWindow { window, curr, prev }) => {
            let w = now / p.period;
            let (curr, prev) = if window == w {
                (u64::try_from(curr).unwrap_or(0), prev)
            } else if window.saturating_add(1) == w {
                (0, u64::try_from(curr).unwrap_or(0))
            } else {
                (0, 0)
            };
            let take = units.min(curr);
            let rest = (units - take).min(prev);
            Some(State::SlidingWindow {
                window: w,
                curr: i64::try_from(curr - take).unwrap_or(0),
                prev: prev - rest,
            })
        }
        (Algorithm::TokenBucket, s @ State::TokenBucket { .. }) => {
            // The level now, as a zero-cost admission computes it (refilled, capped).
            let level = match admit(&Policy { cost: 0, ..*p }, Some(s), now) {
                State::TokenBucket { level, .. } => level,
                _ => 0,
            };
            let full = p.burst.saturating_mul(p.period);
            Some(State::TokenBucket {
                level: level
                    .saturating_add(units.saturating_mul(p.period))
                    .min(full),
                last: now,
            })
        }
        (Algorithm::Gcra, State::Gcra { tat, .. })
        | (Algorithm::LeakyBucket, State::LeakyBucket { tat, .. }) => {
            let t = (p.period / p.limit.max(1)).max(1);
            let tat = tat.saturating_sub(units.saturating_mul(t));
            (tat > now).then_some(match p.algorithm {
                Algorithm::Gcra => State::Gcra { tat, credit: 0 },
                _ => State::LeakyBucket { tat, credit: 0 },
            })
        }
        // A state of another algorithm (a reload changed it) is no count of this one.
        (_, s) => Some(s),
    }
}

/// Units available to a request at `now` (for tests and the admin API's answer).
pub fn available(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
    let d = evaluate(p, state, now);
    if d.allowed {
        d.remaining.saturating_add(p.cost).min(d.limit)
    } else {
        d.remaining
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::Calendar;

    const S: u64 = 1_000_000;

    fn policy(algorithm: Algorithm, limit: u64, period: u64, burst: u64) -> Policy {
        Policy {
            algorithm,
            limit,
            period,
            burst,
            cost: 1,
            calendar: None,
        }
    }

    fn spend(p: &Policy, mut s: Option<State>, now: Micros, n: u64) -> Option<State> {
        for _ in 0..n {
            assert!(evaluate(p, s.as_ref(), now).allowed, "{p:?}");
            s = Some(admit(p, s, now));
        }
        s
    }

    #[test]
    fn a_grant_gives_back_what_was_used_and_never_more() {
        let now = 1_700_000_000 * S + 123;
        let month = Policy {
            calendar: Some(Calendar::Month.into()),
            ..policy(Algorithm::FixedWindow, 10, 0, 0)
        };
        for p in [
            policy(Algorithm::FixedWindow, 10, 3600 * S, 0),
            month,
            policy(Algorithm::SlidingWindow, 10, 3600 * S, 0),
            policy(Algorithm::TokenBucket, 10, 3600 * S, 10),
            policy(Algorithm::Gcra, 10, 3600 * S, 10),
        ] {
            let used = spend(&p, None, now, 7);
            let before = available(&p, used.as_ref(), now);
            assert!((3..=4).contains(&before), "{p:?}: {before}");
            let granted = apply(&p, used.clone(), now, Adjust::Grant(5));
            assert_eq!(available(&p, granted.as_ref(), now), before + 5, "{p:?}");
            // More than was used: the limit is fresh, never more.
            let all = apply(&p, used.clone(), now, Adjust::Grant(1000));
            assert_eq!(
                available(&p, all.as_ref(), now),
                available(&p, None, now),
                "{p:?}"
            );
            assert_eq!(apply(&p, used, now, Adjust::Reset), None);
            // Nothing used: nothing to give back.
            assert_eq!(apply(&p, None, now, Adjust::Grant(3)), None);
        }
    }

    #[test]
    fn a_fixed_window_grant_touches_only_the_current_window() {
        let p = policy(Algorithm::FixedWindow, 10, 60 * S, 0);
        let t0 = 6_000 * S;
        let used = spend(&p, None, t0, 10);
        let later = apply(&p, used.clone(), t0 + 60 * S, Adjust::Grant(4));
        assert_eq!(later, used, "an earlier window no longer counts");
        assert_eq!(available(&p, later.as_ref(), t0 + 60 * S), 10);
    }

    #[test]
    fn a_sliding_window_grant_takes_the_current_count_then_the_previous() {
        let p = policy(Algorithm::SlidingWindow, 10, 60 * S, 0);
        let t0 = 6_000 * S;
        let s = spend(&p, None, t0, 6);
        let s = spend(&p, s, t0 + 60 * S, 2);
        let g = apply(&p, s, t0 + 60 * S, Adjust::Grant(5));
        assert_eq!(
            g,
            Some(State::SlidingWindow {
                window: t0 / (60 * S) + 1,
                curr: 0,
                prev: 3
            })
        );
    }

    #[test]
    fn concurrency_and_sliding_log_grants_are_refused() {
        assert_eq!(
            check(Algorithm::Concurrency, Adjust::Reset),
            Err(Refused::Concurrency)
        );
        assert_eq!(
            check(Algorithm::SlidingLog, Adjust::Grant(1)),
            Err(Refused::SlidingLogGrant)
        );
        assert_eq!(check(Algorithm::SlidingLog, Adjust::Reset), Ok(()));
        assert_eq!(check(Algorithm::Gcra, Adjust::Grant(1)), Ok(()));
    }
}
