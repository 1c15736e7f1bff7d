//! Giving units back: the inverse of [`admit`](super::admit) where an algorithm's state allows
//! it, used when a request charged in one place is refused in another (the local tier: a limit
//! kept in process charged, then a Redis limit of the same request refused it).
//!
//! A refund takes back exactly what one charge of `units` at `charged_at` added, and nothing
//! when that charge is no longer in the state:
//! - fixed window: from the count, while the state is still the charge's window;
//! - sliding window: from `curr` in the charge's window, from `prev` in the next one;
//! - sliding log: the entry the charge added (same timestamp and cost);
//! - token bucket: the tokens, up to a full bucket; GCRA and the leaky bucket: `units · T` from
//!   the TAT (a TAT that falls below `now` is the same as an empty state);
//! - a state holding granted credit ([`super::adjust`]) gets the units back into it: a window's
//!   count below 0, tokens above the burst, a GCRA or leaky-bucket credit — never beyond the
//!   credit bound ([`credit_max`]). A charge that took a GCRA credit and moved the TAT past now
//!   gets only the TAT part back (its state no longer says it used credit);
//! - concurrency: the slot ([`crate::concurrency::release`]).
//!
//! Requests charged after the one refunded keep their charges: a refund is a subtraction, not a
//! restore of an earlier state, so concurrent requests never lose each other's units. It is exact
//! while the charge is still whole in the state. When time absorbed part of it in between (a
//! token bucket that refilled to full, a GCRA or leaky-bucket TAT that fell behind `now` before a
//! later charge), the refund can give back up to its units more than the state still held: a
//! bounded excess of one request's cost per refund, only for a subject that went idle within the
//! refund's round trip. A TAT is never moved below the refund's `now`.

use crate::{Micros, Policy, State};

/// The state after giving back `units` charged at `charged_at`; `None` when nothing is left.
/// Each algorithm's [`give_back`](crate::Algo::give_back), within
/// [`credit_max`](crate::adjust::credit_max).
pub fn refund(
    p: &Policy,
    state: Option<State>,
    charged_at: Micros,
    now: Micros,
    units: u64,
) -> Option<State> {
    if units == 0 {
        return state;
    }
    crate::algorithm::give_back(p, state?, charged_at, now, units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{admit, evaluate, Algorithm};

    const S: u64 = 1_000_000;

    fn policy(algorithm: Algorithm, cost: u64) -> Policy {
        Policy {
            algorithm,
            limit: 5,
            period: S,
            burst: match algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra => 5,
                Algorithm::LeakyBucket => 2,
                _ => 0,
            },
            cost,
            calendar: None,
        }
    }

    /// Charge a, then b at the same instant (as a request's local charge is refunded while
    /// others are charged), refund a: decisions are as if only b had been charged.
    #[test]
    fn a_refund_undoes_one_charge_and_keeps_the_others() {
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
            Algorithm::Concurrency,
        ] {
            for cost in [1, 2] {
                let p = policy(
                    alg,
                    if alg == Algorithm::Concurrency {
                        1
                    } else {
                        cost
                    },
                );
                let t0 = 100 * S + 300_000;
                let t1 = t0;
                // Only b.
                let only_b = Some(admit(&p, None, t1));
                // a then b, a refunded.
                let a = admit(&p, None, t0);
                let both = admit(&p, Some(a), t1);
                let back = refund(&p, Some(both), t0, t1, p.cost);
                let later = t1 + 10;
                assert_eq!(
                    evaluate(&p, back.as_ref(), later),
                    evaluate(&p, only_b.as_ref(), later),
                    "{alg:?} cost {cost}"
                );
            }
        }
    }

    /// A charge that spent granted credit is refunded into the credit, exactly.
    #[test]
    fn a_refund_gives_granted_credit_back() {
        use crate::adjust::{apply, Adjust};
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
        ] {
            let p = policy(alg, 1);
            let t0 = 100 * S + 300_000;
            let credit = apply(&p, None, t0, Adjust::Grant(3));
            let charged = admit(&p, credit.clone(), t0);
            let back = refund(&p, Some(charged), t0, t0, 1);
            assert_eq!(
                evaluate(&p, back.as_ref(), t0 + 10),
                evaluate(&p, credit.as_ref(), t0 + 10),
                "{alg:?}"
            );
            assert_eq!(back, credit, "{alg:?}");
        }
    }

    #[test]
    fn a_charge_of_a_past_window_is_not_refunded() {
        let p = policy(Algorithm::FixedWindow, 1);
        let old = admit(&p, None, 10 * S);
        let now = admit(&p, Some(old), 11 * S);
        assert_eq!(
            refund(&p, Some(now.clone()), 10 * S, 11 * S, 1),
            Some(now),
            "the new window keeps its count"
        );
        assert_eq!(refund(&p, None, 10 * S, 11 * S, 1), None);
    }
}
