//! `fixed_window`: a count per aligned window (a multiple of the period since the epoch, or a
//! calendar day, week or month); Lua: `fw` and `cw` in `algorithms.lua`.

use super::{signed, unsigned, Algo, Algorithm, Decision, Micros, Policy, State};

/// `fixed_window`.
pub struct FixedWindow;

impl Algo for FixedWindow {
    const ALGORITHM: Algorithm = Algorithm::FixedWindow;
    const LEASES: bool = true;
    const GRANTS: bool = true;
    const CHARGES_AFTER: bool = true;

    /// The window at `now`, its end, and the count admitted in it.
    type At = (u64, Micros, i64);

    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At {
        let (w, end) = p.fixed_window(now);
        let count = match state {
            Some(State::FixedWindow { window, count }) if *window == w => *count,
            _ => 0,
        };
        (w, end, count)
    }

    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
        let (_, end, count) = Self::at(p, state, now);
        let reset_after = end - now;
        let (l, c) = (signed(p.limit), signed(p.cost));
        let allowed = count + c <= l;
        Decision {
            allowed,
            limit: p.quota(),
            remaining: unsigned(l - count - if allowed { c } else { 0 }),
            retry_after: if allowed { 0 } else { reset_after },
            reset_after,
            delay: 0,
            kind: Default::default(),
        }
    }

    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State {
        let (w, _, count) = Self::at(p, state.as_ref(), now);
        State::FixedWindow {
            window: w,
            count: count + signed(p.cost),
        }
    }

    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        match Self::charge(&Policy { cost: units, ..*p }, state, now) {
            State::FixedWindow { window, count } => State::FixedWindow {
                window,
                count: count.min(signed(p.limit)),
            },
            other => other,
        }
    }

    fn avail(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
        let (_, _, count) = Self::at(p, state, now);
        unsigned(signed(p.limit) - count)
    }

    fn give_back(
        p: &Policy,
        state: State,
        charged_at: Micros,
        _: Micros,
        units: u64,
        most: u64,
    ) -> Option<State> {
        Some(match state {
            State::FixedWindow { window, count } => {
                let (w, _) = p.fixed_window(charged_at);
                State::FixedWindow {
                    window,
                    count: if window == w {
                        count.saturating_sub(signed(units)).max(-signed(most))
                    } else {
                        count
                    },
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
        // An earlier window no longer counts.
        let (w, _, count) = Self::at(p, state.as_ref(), now);
        Some(State::FixedWindow {
            window: w,
            count: count.saturating_sub(signed(units)).max(-signed(most)),
        })
    }

    fn expiry(p: &Policy, state: &State) -> Micros {
        match state {
            State::FixedWindow { window, .. } => match p.calendar {
                // A calendar window's id is its start.
                Some(c) => c.window(*window).1,
                None => (window + 1) * p.period,
            },
            _ => 0,
        }
    }

    fn age_denial(_: &Policy, d: &Decision, elapsed: Micros, r: Micros) -> Option<Decision> {
        Some(Decision {
            retry_after: d.retry_after.checked_sub(elapsed).filter(|&w| w > 0)?,
            reset_after: r,
            ..*d
        })
    }
}
