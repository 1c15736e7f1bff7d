//! Leases (`sync = "lease"`): how many units a limit can grant at once, the same arithmetic in
//! the in-process store and in `src/store/scripts/algorithms.lua` (each algorithm's `avail` and `give_back`).
//!
//! A lease request ([`Op::Lease`](super::Op::Lease)) asks for up to N units, at least the
//! limit's cost: it is decided as one request whose cost is what it gets, `min(N, available)`
//! rounded down to a whole number of costs,
//! and denied (charging nothing) when fewer than `cost` units are available. Only the fixed
//! window, the token bucket and GCRA lease (config refuses the others): their units can be spent
//! later and given back exactly while the grant's state still holds them.

use crate::{Decision, Micros, Policy, State};

/// The units the limit could admit at once at `now` (0 for the algorithms that do not lease):
/// each algorithm's [`avail`](crate::Algo::avail).
pub fn grantable(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
    crate::avail(p, state, now)
}

/// The policy a lease of up to `n` units is decided with: its cost is what it gets, a whole
/// number of requests' costs (at least one, so a lease that cannot have that is denied as a
/// request would be).
pub fn lease_policy(p: &Policy, state: Option<&State>, now: Micros, n: u64) -> Policy {
    let k = grantable(p, state, now);
    let c = p.cost.max(1);
    let cost = if k >= c {
        let g = k.min(n);
        (g - g % c).max(c)
    } else {
        c
    };
    Policy { cost, ..*p }
}

/// A lease's decision: `delay` carries the units granted (0 when denied); the store's callers
/// read it back with [`granted`].
pub fn with_granted(mut d: Decision, q: &Policy) -> Decision {
    d.delay = if d.allowed { q.cost } else { 0 };
    d
}

/// The units a lease decision granted, the generation of the state they were charged to (a
/// granted lease's `retry_after` on Redis: see `decide.lua`; 0 in process), and the decision as
/// a request sees it.
pub fn granted(d: &Decision) -> (u64, u64, Decision) {
    let generation = if d.allowed { d.retry_after } else { 0 };
    let retry_after = if d.allowed { 0 } else { d.retry_after };
    (
        d.delay,
        generation,
        Decision {
            delay: 0,
            retry_after,
            ..*d
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{admit, evaluate, Algorithm};

    const S: u64 = 1_000_000;

    /// A lease of everything grantable is admitted, one unit more is not.
    #[test]
    fn grantable_is_what_evaluate_admits() {
        for (alg, burst) in [
            (Algorithm::FixedWindow, 0),
            (Algorithm::TokenBucket, 7),
            (Algorithm::Gcra, 7),
        ] {
            let p = Policy {
                algorithm: alg,
                limit: 10,
                period: S,
                burst,
                cost: 1,
                calendar: None,
            };
            let mut state = None;
            let mut now = 50 * S + 123;
            for step in 0..12 {
                let k = grantable(&p, state.as_ref(), now);
                if k > 0 {
                    let q = Policy { cost: k, ..p };
                    assert!(evaluate(&q, state.as_ref(), now).allowed, "{alg:?} {step}");
                }
                let q = Policy { cost: k + 1, ..p };
                assert!(!evaluate(&q, state.as_ref(), now).allowed, "{alg:?} {step}");
                let l = lease_policy(&p, state.as_ref(), now, 3);
                if evaluate(&l, state.as_ref(), now).allowed {
                    state = Some(admit(&l, state, now));
                }
                now += 37_000;
            }
        }
    }
}
