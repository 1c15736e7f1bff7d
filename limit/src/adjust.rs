//! Support's corrections to one limit's state for one subject: reset and grant, pure functions
//! of (policy, state, now) like the algorithms, applied by the in-process store under its shard
//! lock and by each algorithm's `grant` in `src/store/scripts/algorithms.lua` (run by quota.lua), line for line, in one atomic Redis step.
//!
//! **Reset** forgets the state: the limit is fresh for the subject. **Grant** gives the subject
//! `units` more in the current window: a request of cost 1 is admitted `units` more times now
//! than it would have been, whatever the subject used — one that spent its whole quota gets
//! `units` more, one that used nothing gets its quota plus `units`. Beyond a fresh limit the
//! grant is *credit*, which the state holds (see [`State`]) and which lapses on its own, so idle
//! time never adds to it:
//!
//! - fixed window, calendar window: the current window's count goes down by `units`, below 0 if
//!   need be; the credit lapses with the window (the next one starts at 0). A count of an
//!   earlier window no longer counts: the grant starts the current window at `-units`;
//! - sliding window: likewise the current window's count (`curr`); when the window ends, a count
//!   below 0 weighs as 0 in the next (the credit lapses with its window, like a fixed window's);
//! - token bucket: `units` tokens are added, above the burst if need be; refill only reaches the
//!   burst and never cuts tokens above it; those lapse (the bucket is full again) once a whole
//!   period passes without a request;
//! - GCRA, leaky bucket: the TAT moves back by `units × T` (T = period / limit); the part before
//!   now is kept as a credit relative to now (a request counts from max(TAT, now) − credit), so
//!   `units` more requests are admitted at once (the leaky bucket forwards them without delay),
//!   and it lapses a period after it was last written (the grant, or a request spending it);
//! - sliding log and concurrency: refused ([`Refused`]): a log's entries are timestamps that a
//!   grant would have to invent, and a concurrency limit counts requests in flight (a reset
//!   would let more in than its limit while they run; they free their slots when they end).
//!
//! **Bounds.** A grant is 1 to the quota units (checked by the admin API), and the credit a
//! subject holds at most [`credit_max`] units beyond a fresh limit — the quota (so `remaining`
//! is never above twice the quota), less only for a limit whose (max(limit, burst) + credit) ×
//! period would reach 2^53 µs, where Lua's doubles would stop being exact. A grant beyond the
//! bound fills the credit to it. The headers and `/-/usage` show the real `remaining`, above the
//! quota while there is credit.

use crate::{evaluate, Algorithm, Micros, Policy, State};

/// What support asks of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjust {
    Reset,
    /// This many more units now (≥ 1), beyond the quota if need be.
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
        (a, Adjust::Grant(_)) if !a.grants() => Err(Refused::SlidingLogGrant),
        _ => Ok(()),
    }
}

pub use crate::algorithm::credit_max;

/// The state after `adjust` at `now` (`None`: fresh). Call after [`check`] admitted it. A grant
/// of `units` admits exactly `units` more requests of cost 1 now than the state did, up to the
/// credit bound ([`credit_max`] units beyond a fresh limit).
pub fn apply(p: &Policy, state: Option<State>, now: Micros, adjust: Adjust) -> Option<State> {
    let units = match adjust {
        Adjust::Reset => return None,
        Adjust::Grant(u) => u,
    };
    // Each algorithm's `grant` (unchanged where `check` refuses it).
    crate::algorithm::grant(p, state, now, units)
}

/// Units available to a request at `now` (for tests and the admin API's answer).
pub fn available(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
    let d = evaluate(p, state, now);
    if d.allowed {
        d.remaining.saturating_add(p.cost)
    } else {
        d.remaining
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::Calendar;
    use crate::{admit, expires_at};

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

    /// One limit of each algorithm that takes a grant: quota 10 an hour (the leaky bucket's
    /// quota is its burst + 1).
    fn grantable() -> Vec<Policy> {
        vec![
            policy(Algorithm::FixedWindow, 10, 3600 * S, 0),
            Policy {
                calendar: Some(Calendar::Month.into()),
                ..policy(Algorithm::FixedWindow, 10, 31 * 86_400 * S, 0)
            },
            policy(Algorithm::SlidingWindow, 10, 3600 * S, 0),
            policy(Algorithm::TokenBucket, 10, 3600 * S, 10),
            policy(Algorithm::Gcra, 10, 3600 * S, 10),
            policy(Algorithm::LeakyBucket, 10, 3600 * S, 9),
        ]
    }

    fn spend(p: &Policy, mut s: Option<State>, now: Micros, n: u64) -> Option<State> {
        for _ in 0..n {
            assert!(evaluate(p, s.as_ref(), now).allowed, "{p:?}");
            s = Some(admit(p, s, now));
        }
        s
    }

    /// How many requests are admitted at `now`, one after another, and the state after them.
    fn admitted(p: &Policy, mut s: Option<State>, now: Micros) -> (u64, Option<State>) {
        let mut n = 0;
        while evaluate(p, s.as_ref(), now).allowed {
            s = Some(admit(p, s, now));
            n += 1;
            assert!(n <= 100, "{p:?}: no end");
        }
        (n, s)
    }

    fn grant(p: &Policy, s: Option<State>, now: Micros, units: u64) -> Option<State> {
        apply(p, s, now, Adjust::Grant(units))
    }

    #[test]
    fn after_the_whole_quota_a_grant_of_n_admits_exactly_n_more() {
        let now = 1_700_000_000 * S + 123;
        for p in grantable() {
            let (spent, s) = admitted(&p, None, now);
            assert_eq!(spent, p.quota(), "{p:?}");
            for n in [1, 3, p.quota()] {
                let g = grant(&p, s.clone(), now, n);
                // What the headers and usage say is what is admitted.
                assert_eq!(available(&p, g.as_ref(), now), n, "{p:?}");
                assert_eq!(admitted(&p, g, now).0, n, "{p:?}: grant of {n}");
            }
        }
    }

    #[test]
    fn a_grant_goes_beyond_the_quota_whatever_was_used() {
        let now = 1_700_000_000 * S + 123;
        for p in grantable() {
            let q = p.quota();
            for used in [0, 4, q] {
                let s = spend(&p, None, now, used);
                let g = grant(&p, s, now, 3);
                assert_eq!(available(&p, g.as_ref(), now), q - used + 3, "{p:?}");
                assert_eq!(admitted(&p, g, now).0, q - used + 3, "{p:?} used {used}");
            }
            // Two grants add up, to the bound: at most the quota beyond a fresh limit.
            let g = grant(&p, None, now, 4);
            let g = grant(&p, g, now, 4);
            assert_eq!(available(&p, g.as_ref(), now), q + 8, "{p:?}");
            let g = grant(&p, g, now, q);
            assert_eq!(available(&p, g.as_ref(), now), 2 * q, "{p:?}: the bound");
            assert_eq!(admitted(&p, g, now).0, 2 * q, "{p:?}");
            assert_eq!(
                apply(
                    &p,
                    Some(State::Gcra { tat: 1, credit: 1 }),
                    now,
                    Adjust::Reset
                ),
                None
            );
        }
    }

    #[test]
    fn the_credit_lapses_as_documented() {
        let t0 = 1_700_000_000 * S + 123;
        let hour = 3600 * S;
        for p in grantable() {
            let q = p.quota();
            let g = grant(&p, None, t0, 5);
            let end = match p.algorithm {
                // The window's end: the next window starts afresh.
                Algorithm::FixedWindow | Algorithm::SlidingWindow => p.fixed_window(t0).1,
                // A period after the grant (no request since).
                _ => t0 + hour,
            };
            assert_eq!(
                available(&p, g.as_ref(), end - 1),
                q + 5,
                "{p:?}: still held"
            );
            assert_eq!(available(&p, g.as_ref(), end), q, "{p:?}: lapsed");
            assert_eq!(
                evaluate(&p, g.as_ref(), end),
                evaluate(&p, None, end),
                "{p:?}: lapsed is fresh"
            );
            // The state expires then (a sliding window's keeps its count a window longer).
            let s = g.expect("a grant leaves state");
            let exp = expires_at(&p, &s);
            match p.algorithm {
                Algorithm::SlidingWindow => assert_eq!(exp, end + hour, "{p:?}"),
                _ => assert_eq!(exp, end, "{p:?}"),
            }
        }
        // A bucket or GCRA credit spent on lasts a period from the last request.
        for p in [
            policy(Algorithm::TokenBucket, 10, hour, 10),
            policy(Algorithm::Gcra, 10, hour, 10),
            policy(Algorithm::LeakyBucket, 10, hour, 9),
        ] {
            let g = grant(&p, None, t0, 5);
            let later = t0 + hour / 2;
            let s = spend(&p, g, later, 1);
            assert_eq!(available(&p, s.as_ref(), later + hour - 1), 14, "{p:?}");
            assert_eq!(available(&p, s.as_ref(), later + hour), 10, "{p:?}");
        }
        // A sliding window that ended in credit weighs as an unused one in the next.
        let p = policy(Algorithm::SlidingWindow, 10, hour, 0);
        let g = grant(&p, spend(&p, None, t0, 2), t0, 5);
        let next = p.fixed_window(t0).1 + hour / 4;
        assert_eq!(available(&p, g.as_ref(), next), 10);
    }

    #[test]
    fn idle_time_adds_nothing_to_the_credit() {
        let t0 = 1_700_000_000 * S;
        let hour = 3600 * S;
        for p in grantable() {
            let q = p.quota();
            // Spent, then granted: nothing refills beyond what the algorithm refills anyway,
            // and a fresh subject's credit stays what was granted.
            let g = grant(&p, None, t0, 3);
            for dt in [1, S, 600 * S, hour / 2, hour - 1] {
                let now = t0 + dt;
                let windowed = matches!(
                    p.algorithm,
                    Algorithm::FixedWindow | Algorithm::SlidingWindow
                );
                if windowed && now >= p.fixed_window(t0).1 {
                    continue; // lapsed (the test above)
                }
                let a = available(&p, g.as_ref(), now);
                assert!(a <= q + 3, "{p:?} after {dt}: {a}");
                assert!(a <= 2 * q, "{p:?}");
            }
            // However long idle, never above twice the quota.
            let full = grant(&p, None, t0, q);
            for dt in [0, 1, hour - 1, hour, 40 * 86_400 * S] {
                assert!(available(&p, full.as_ref(), t0 + dt) <= 2 * q, "{p:?}");
            }
        }
    }

    #[test]
    fn a_grant_counts_in_the_current_window_only() {
        let p = policy(Algorithm::FixedWindow, 10, 60 * S, 0);
        let t0 = 6_000 * S;
        let used = spend(&p, None, t0, 10);
        let later = grant(&p, used, t0 + 60 * S, 4);
        assert_eq!(
            later,
            Some(State::FixedWindow {
                window: 101,
                count: -4
            }),
            "an earlier window no longer counts"
        );
        assert_eq!(available(&p, later.as_ref(), t0 + 60 * S), 14);
    }

    #[test]
    fn a_sliding_window_grant_takes_the_current_count() {
        let p = policy(Algorithm::SlidingWindow, 10, 60 * S, 0);
        let t0 = 6_000 * S;
        let s = spend(&p, None, t0, 6);
        let s = spend(&p, s, t0 + 60 * S, 2);
        let before = available(&p, s.as_ref(), t0 + 60 * S);
        let g = grant(&p, s, t0 + 60 * S, 5);
        assert_eq!(
            g,
            Some(State::SlidingWindow {
                window: t0 / (60 * S) + 1,
                curr: -3,
                prev: 6
            })
        );
        assert_eq!(available(&p, g.as_ref(), t0 + 60 * S), before + 5);
    }

    #[test]
    fn the_credit_keeps_every_number_exact() {
        for p in grantable() {
            assert_eq!(credit_max(&p), p.quota(), "{p:?}");
        }
        // A year-long sliding window of 200: L·P is within a factor 2 of 2^53.
        let year = 365 * 86_400 * S;
        let p = policy(Algorithm::SlidingWindow, 200, year, 0);
        let m = credit_max(&p);
        assert_eq!(m, 85, "the README's example");
        assert!((200 + m) * year < 1 << 53);
        assert!((200 + m + 1) * year >= 1 << 53);
        let g = grant(&p, None, 1_700_000_000 * S, 200);
        assert_eq!(available(&p, g.as_ref(), 1_700_000_000 * S), 200 + m);
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
