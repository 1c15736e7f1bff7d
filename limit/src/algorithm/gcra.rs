//! `gcra`: the generic cell rate algorithm, a theoretical arrival time (TAT) moving T = P / L per
//! unit, admitting while it stays within the burst's tolerance; Lua: `gcra` in `algorithms.lua`.

use super::{
    tat_base, tat_expiry, tat_given_back, tat_parts, Algo, Algorithm, Decision, Micros, Policy,
    State,
};

/// `gcra`.
pub struct Gcra;

impl Algo for Gcra {
    const ALGORITHM: Algorithm = Algorithm::Gcra;
    const LEASES: bool = true;
    const GRANTS: bool = true;
    const CHARGES_AFTER: bool = true;

    /// Where a request at `now` counts from (see [`tat_base`]).
    type At = Micros;

    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At {
        tat_base(p, state, now)
    }

    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
        let t = p.interval();
        let tolerance = p.burst * t;
        let base = Self::at(p, state, now);
        let new_tat = base + p.cost * t;
        let allowed = new_tat <= now + tolerance;
        let tat_after = if allowed { new_tat } else { base };
        Decision {
            allowed,
            limit: p.quota(),
            remaining: (now + tolerance).saturating_sub(tat_after) / t,
            retry_after: if allowed {
                0
            } else {
                new_tat - now - tolerance
            },
            // A TAT before now is credit: it lapses a period after this request.
            reset_after: if tat_after < now {
                p.period
            } else {
                tat_after - now
            },
            delay: 0,
            kind: Default::default(),
        }
    }

    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State {
        let (tat, credit) = tat_parts(
            Self::at(p, state.as_ref(), now) + p.cost * p.interval(),
            now,
        );
        State::Gcra { tat, credit }
    }

    /// A TAT after now is clamped; granted credit (TAT = now) is spent by the charge first.
    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        match Self::charge(&Policy { cost: units, ..*p }, state, now) {
            State::Gcra { tat, credit } => State::Gcra {
                tat: tat.min(now.saturating_add(p.burst.saturating_mul(p.interval()))),
                credit,
            },
            other => other,
        }
    }

    fn avail(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
        let t = p.interval();
        let base = Self::at(p, state, now);
        now.saturating_add(p.burst.saturating_mul(t))
            .saturating_sub(base)
            / t
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
            State::Gcra { tat, credit } => {
                let (tat, credit) = tat_given_back(p, (tat, credit), now, units, most);
                State::Gcra { tat, credit }
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
        Some(State::Gcra { tat, credit })
    }

    fn expiry(p: &Policy, state: &State) -> Micros {
        match state {
            State::Gcra { tat, credit } => tat_expiry(p, (*tat, *credit)),
            _ => 0,
        }
    }

    /// Denied: reset_after = TAT − now (the TAT is in the future).
    fn age_denial(p: &Policy, d: &Decision, _: Micros, r: Micros) -> Option<Decision> {
        let t = p.interval();
        let tolerance = p.burst.checked_mul(t)?;
        let needed = r.checked_add(p.cost.checked_mul(t)?)?;
        (needed > tolerance).then(|| Decision {
            remaining: tolerance.saturating_sub(r) / t,
            retry_after: needed - tolerance,
            reset_after: r,
            ..*d
        })
    }
}
