//! `token_bucket`: a level refilled continuously at L per period, up to the burst; Lua: `tb` in
//! `algorithms.lua`.

use super::{div_ceil, Algo, Algorithm, Decision, Micros, Policy, State};

/// `token_bucket`.
pub struct TokenBucket;

impl Algo for TokenBucket {
    const ALGORITHM: Algorithm = Algorithm::TokenBucket;
    const LEASES: bool = true;
    const GRANTS: bool = true;
    const CHARGES_AFTER: bool = true;

    /// The level at `now`, in tokens × P.
    type At = u64;

    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At {
        let full = p.burst * p.period;
        match state {
            // Granted tokens above the burst: refill stops at the burst and never cuts them;
            // they lapse once a whole period passes without a request.
            Some(State::TokenBucket { level, last }) if *level > full => {
                if now.saturating_sub(*last) < p.period {
                    *level
                } else {
                    full
                }
            }
            Some(State::TokenBucket { level, last }) => {
                let refill = u128::from(now.saturating_sub(*last)) * u128::from(p.limit);
                let level = u128::from(*level) + refill;
                u64::try_from(level.min(u128::from(full))).unwrap_or(full)
            }
            _ => full,
        }
    }

    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
        let (l, per, c) = (p.limit, p.period, p.cost);
        let level = Self::at(p, state, now);
        let full = p.burst * per;
        let need = c * per;
        let allowed = level >= need;
        let after = if allowed { level - need } else { level };
        Decision {
            allowed,
            limit: p.quota(),
            remaining: after / per,
            retry_after: if allowed {
                0
            } else {
                div_ceil(need - level, l)
            },
            // Granted tokens above the burst lapse a period after this request.
            reset_after: if after > full {
                per
            } else {
                div_ceil(full - after, l)
            },
            delay: 0,
            kind: Default::default(),
        }
    }

    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State {
        let level = Self::at(p, state.as_ref(), now);
        State::TokenBucket {
            level: level.saturating_sub(p.cost * p.period),
            last: now,
        }
    }

    /// The charge already stops at an empty bucket.
    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        Self::charge(&Policy { cost: units, ..*p }, state, now)
    }

    fn avail(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
        Self::at(p, state, now) / p.period.max(1)
    }

    fn give_back(
        p: &Policy,
        state: State,
        _: Micros,
        _: Micros,
        units: u64,
        most: u64,
    ) -> Option<State> {
        Some(match state {
            State::TokenBucket { level, last } => {
                let full = p.burst.saturating_mul(p.period);
                // Up to a full bucket, or up to the credit bound for a bucket holding granted
                // tokens.
                let cap = if level > full {
                    p.burst.saturating_add(most).saturating_mul(p.period)
                } else {
                    full
                };
                State::TokenBucket {
                    level: level
                        .saturating_add(units.saturating_mul(p.period))
                        .min(cap),
                    last,
                }
            }
            other => other,
        })
    }

    fn grant(
        p: &Policy,
        state: Option<State>,
        now: Micros,
        units: u64,
        most: u64,
    ) -> Option<State> {
        // The level now (refilled up to the burst, or granted tokens as they are).
        let level = Self::at(p, state.as_ref(), now);
        let top = p.burst.saturating_add(most).saturating_mul(p.period);
        Some(State::TokenBucket {
            level: level
                .saturating_add(units.saturating_mul(p.period))
                .min(top),
            last: now,
        })
    }

    fn expiry(p: &Policy, state: &State) -> Micros {
        match state {
            State::TokenBucket { level, last } if *level > p.burst * p.period => last + p.period,
            State::TokenBucket { level, last } => {
                last + div_ceil((p.burst * p.period).saturating_sub(*level), p.limit)
            }
            _ => 0,
        }
    }
}
