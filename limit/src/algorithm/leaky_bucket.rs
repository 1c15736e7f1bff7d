//! `leaky_bucket`: a queue drained at L per period, B places long; an admitted request waits
//! for its slot (`delay`); Lua: `lb` in `algorithms.lua`.

use super::{
    tat_base, tat_expiry, tat_given_back, tat_parts, Algo, Algorithm, Decision, Micros, Policy,
    State,
};

/// `leaky_bucket`.
pub struct LeakyBucket;

impl Algo for LeakyBucket {
    const ALGORITHM: Algorithm = Algorithm::LeakyBucket;
    const LEASES: bool = false;
    const GRANTS: bool = true;
    /// A request it admitted is already waiting for its slot.
    const CHARGES_AFTER: bool = false;

    /// The next free slot (see [`tat_base`]); one before now (granted credit) goes at once.
    type At = Micros;

    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At {
        tat_base(p, state, now)
    }

    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
        let t = p.interval();
        let max_wait = p.burst * t;
        // A slot before now (granted credit) goes at once.
        let slot = Self::at(p, state, now);
        let delay = slot.saturating_sub(now);
        // A cost above the queue's places (B + 1: B waiting, one going) never fits, however
        // empty the queue (a request's own amount, `Op::Reserve`; the config refuses such a
        // `cost`); refused as by every algorithm, its retry as if the queue could take it once
        // empty, its excess in emission intervals later.
        let excess = p.cost.saturating_sub(p.quota());
        let allowed = excess == 0 && delay <= max_wait;
        let tat_after = if allowed { slot + p.cost * t } else { slot };
        Decision {
            allowed,
            limit: p.quota(),
            remaining: if tat_after <= now + max_wait {
                (now + max_wait - tat_after) / t + 1
            } else {
                0
            },
            retry_after: if allowed {
                0
            } else if excess > 0 {
                delay.saturating_add(excess.saturating_mul(t))
            } else {
                delay - max_wait
            },
            reset_after: if tat_after < now {
                p.period
            } else {
                tat_after - now
            },
            delay: if allowed { delay } else { 0 },
            kind: Default::default(),
        }
    }

    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State {
        let (tat, credit) = tat_parts(
            Self::at(p, state.as_ref(), now) + p.cost * p.interval(),
            now,
        );
        State::LeakyBucket { tat, credit }
    }

    /// Refused by the config ([`CHARGES_AFTER`](Algo::CHARGES_AFTER)); a plain charge.
    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        Self::charge(&Policy { cost: units, ..*p }, state, now)
    }

    fn give_back(
        p: &Policy,
        state: State,
        _: Micros,
        now: Micros,
        units: u64,
        most: u64,
    ) -> Option<State> {
        Some(match state {
            State::LeakyBucket { tat, credit } => {
                let (tat, credit) = tat_given_back(p, (tat, credit), now, units, most);
                State::LeakyBucket { tat, credit }
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
        let (tat, credit) = super::granted_tat(p, state.as_ref(), now, units, most);
        Some(State::LeakyBucket { tat, credit })
    }

    fn expiry(p: &Policy, state: &State) -> Micros {
        match state {
            State::LeakyBucket { tat, credit } => tat_expiry(p, (*tat, *credit)),
            _ => 0,
        }
    }

    /// Denied: reset_after = slot − now = the delay, longer than the queue allows.
    fn age_denial(p: &Policy, d: &Decision, _: Micros, r: Micros) -> Option<Decision> {
        let max_wait = p.burst.checked_mul(p.interval())?;
        (r > max_wait).then(|| Decision {
            remaining: 0,
            retry_after: r - max_wait,
            reset_after: r,
            delay: 0,
            ..*d
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 50 §3: a cost above the queue's places (B + 1) was admitted into an empty queue.
    #[test]
    fn a_cost_above_the_queues_places_is_refused() {
        let p = |cost| Policy {
            algorithm: Algorithm::LeakyBucket,
            limit: 6,
            period: 60_000_000,
            burst: 5,
            cost,
            calendar: None,
        };
        let now = 1_000_000_000;
        for cost in [7, 1000, u64::from(u32::MAX)] {
            let d = LeakyBucket::decide(&p(cost), None, now);
            assert!(!d.allowed, "cost {cost} against 6 places: {d:?}");
            assert!(d.retry_after > 0, "{d:?}");
            assert_eq!(LeakyBucket::capacity(&p(cost), None, now, 1), 0);
        }
        let d = LeakyBucket::decide(&p(6), None, now);
        assert!(d.allowed, "{d:?}");
        let full = LeakyBucket::charge(&p(6), None, now);
        assert!(!LeakyBucket::decide(&p(1), Some(&full), now).allowed);
    }
}
