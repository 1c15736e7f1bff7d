//! `algorithm = "concurrency"`: at most L requests of one subject in flight at once.
//!
//! Not a rate: a slot is taken when a request is admitted (with the route's other limits,
//! all-or-nothing) and given back when the request ends, whatever way it ends — the proxy holds
//! it in a guard whose `Drop` releases it (the gateway's `pipeline::settle`). In process the state is a
//! count per subject. On Redis a slot is a lease: a member of a sorted set scored by its expiry
//! (now + `period`), purged by the same script, so slots of a gateway that died are freed after
//! `period` (`src/store/scripts/leases.lua`).
//!
//! A denial says `Retry-After: 1`: nothing in the state says when a slot frees up.

use super::{Algo, Algorithm, Decision, Micros, Policy, State};

/// What a denied concurrency limit tells the client to wait: one second.
pub const RETRY_AFTER: Micros = 1_000_000;

fn in_flight(state: Option<&State>) -> u64 {
    match state {
        Some(State::Concurrency { in_flight }) => *in_flight,
        _ => 0,
    }
}

/// Whether one more request (of cost C, 1 by validation) fits; changes nothing.
pub fn evaluate(p: &Policy, state: Option<&State>) -> Decision {
    let n = in_flight(state);
    let allowed = n.saturating_add(p.cost) <= p.limit;
    Decision {
        allowed,
        limit: p.limit,
        remaining: p
            .limit
            .saturating_sub(n.saturating_add(if allowed { p.cost } else { 0 })),
        retry_after: if allowed { 0 } else { RETRY_AFTER },
        reset_after: 0,
        delay: 0,
        kind: Default::default(),
    }
}

/// Takes a slot (call after [`evaluate`] admitted).
pub fn acquire(p: &Policy, state: Option<State>) -> State {
    State::Concurrency {
        in_flight: in_flight(state.as_ref()).saturating_add(p.cost),
    }
}

/// Gives a slot back; `None` when no request is left in flight (the entry can go).
pub fn release(p: &Policy, state: Option<State>) -> Option<State> {
    let n = in_flight(state.as_ref()).saturating_sub(p.cost);
    (n > 0).then_some(State::Concurrency { in_flight: n })
}

/// In process an entry with requests in flight never expires (its guards release it); an empty
/// one is not kept.
pub fn expires_at(in_flight: u64) -> Micros {
    if in_flight > 0 {
        Micros::MAX
    } else {
        0
    }
}

/// `concurrency`.
pub struct Concurrency;

impl Algo for Concurrency {
    const ALGORITHM: Algorithm = Algorithm::Concurrency;
    const LEASES: bool = false;
    /// It counts requests in flight: they free their slots when they end.
    const GRANTS: bool = false;
    const CHARGES_AFTER: bool = false;

    /// Requests in flight.
    type At = u64;

    fn at(_: &Policy, state: Option<&State>, _: Micros) -> Self::At {
        in_flight(state)
    }

    fn decide(p: &Policy, state: Option<&State>, _: Micros) -> Decision {
        evaluate(p, state)
    }

    fn charge(p: &Policy, state: Option<State>, _: Micros) -> State {
        acquire(p, state)
    }

    /// Refused by the config ([`CHARGES_AFTER`](Algo::CHARGES_AFTER)); slots taken.
    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        Self::charge(&Policy { cost: units, ..*p }, state, now)
    }

    /// A slot given back.
    fn give_back(
        p: &Policy,
        state: State,
        _: Micros,
        _: Micros,
        units: u64,
        _: u64,
    ) -> Option<State> {
        match state {
            s @ State::Concurrency { .. } => release(&Policy { cost: units, ..*p }, Some(s)),
            other => Some(other),
        }
    }

    fn expiry(_: &Policy, state: &State) -> Micros {
        match state {
            State::Concurrency { in_flight } => expires_at(*in_flight),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    #[test]
    fn slots_are_taken_and_given_back() {
        let p = Policy {
            algorithm: Algorithm::Concurrency,
            limit: 2,
            period: 60_000_000,
            burst: 0,
            cost: 1,
            calendar: None,
        };
        let mut s = None;
        for left in [1, 0] {
            let d = evaluate(&p, s.as_ref());
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
            s = Some(acquire(&p, s));
        }
        let d = evaluate(&p, s.as_ref());
        assert!(!d.allowed);
        assert_eq!(d.retry_after, RETRY_AFTER);
        s = release(&p, s);
        assert!(evaluate(&p, s.as_ref()).allowed);
        s = release(&p, s);
        assert_eq!(s, None, "an idle subject keeps no state");
        assert_eq!(
            release(&p, None),
            None,
            "a late release cannot go below zero"
        );
    }
}
