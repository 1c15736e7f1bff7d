//! `sliding_window`: the current window's count plus the previous one's, weighted by what is
//! left of it; Lua: `sw` in `algorithms.lua`.

use super::{signed, unsigned, Algo, Algorithm, Decision, Micros, Policy, State};

/// `sliding_window`.
pub struct SlidingWindow;

impl Algo for SlidingWindow {
    const ALGORITHM: Algorithm = Algorithm::SlidingWindow;
    const LEASES: bool = false;
    const GRANTS: bool = true;
    const CHARGES_AFTER: bool = true;

    /// The window at `now`, and its (curr, prev) counts.
    type At = (u64, i64, u64);

    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At {
        let w = now / p.period.max(1);
        let (curr, prev) = sliding_counts(state, w);
        (w, curr, prev)
    }

    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
        let per = p.period;
        let (w, curr, prev) = Self::at(p, state, now);
        let elapsed = now - w * per;
        // Signed: `curr` is below 0 after a grant. Every product stays below 2^53.
        let (l, c, pp, prev, el) = (
            signed(p.limit),
            signed(p.cost),
            signed(per),
            signed(prev),
            signed(elapsed),
        );
        // estimate·P = prev·(P − elapsed) + curr·P; admit if (estimate + C)·P ≤ L·P.
        let weighted = prev * (pp - el) + curr * pp;
        let allowed = weighted + c * pp <= l * pp;
        let used = weighted + if allowed { c * pp } else { 0 };
        let remaining = unsigned(l * pp - used) / per;
        let retry_after = if allowed {
            0
        } else if curr + c <= l {
            // Wait in this window until prev's weight has fallen far enough.
            let needed = pp - (l - curr - c) * pp / prev.max(1);
            unsigned(needed - el).max(1)
        } else {
            // Wait for the next window, where this window's count becomes `prev` (curr > 0).
            let next = if curr > 0 {
                unsigned(pp - (l - c) * pp / curr)
            } else {
                0
            };
            per - elapsed + next
        };
        let curr_after = curr + if allowed { c } else { 0 };
        // Granted credit (curr < 0) lapses at the window's end, as a `prev` would stop
        // counting.
        let reset_after = if curr_after > 0 {
            2 * per - elapsed
        } else if prev > 0 || curr_after < 0 {
            per - elapsed
        } else {
            0
        };
        Decision {
            allowed,
            limit: p.quota(),
            remaining,
            retry_after,
            reset_after,
            delay: 0,
            kind: Default::default(),
        }
    }

    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State {
        let (w, curr, prev) = Self::at(p, state.as_ref(), now);
        State::SlidingWindow {
            window: w,
            curr: curr + signed(p.cost),
            prev,
        }
    }

    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        match Self::charge(&Policy { cost: units, ..*p }, state, now) {
            State::SlidingWindow { window, curr, prev } => State::SlidingWindow {
                window,
                curr: curr.min(signed(p.limit)),
                prev,
            },
            other => other,
        }
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
            State::SlidingWindow { window, curr, prev } => {
                let w = charged_at / p.period;
                if window == w {
                    State::SlidingWindow {
                        window,
                        curr: curr.saturating_sub(signed(units)).max(-signed(most)),
                        prev,
                    }
                } else if window == w.saturating_add(1) {
                    State::SlidingWindow {
                        window,
                        curr,
                        prev: prev.saturating_sub(units),
                    }
                } else {
                    State::SlidingWindow { window, curr, prev }
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
        let (w, curr, prev) = Self::at(p, state.as_ref(), now);
        Some(State::SlidingWindow {
            window: w,
            curr: curr.saturating_sub(signed(units)).max(-signed(most)),
            prev,
        })
    }

    fn expiry(p: &Policy, state: &State) -> Micros {
        match state {
            State::SlidingWindow { window, .. } => (window + 2) * p.period,
            _ => 0,
        }
    }
}

/// The (curr, prev) counts of a sliding window as seen from window `w`. A window that ended in
/// granted credit (curr < 0) weighs as an unused one in the next: the credit lapsed with it.
fn sliding_counts(state: Option<&State>, w: u64) -> (i64, u64) {
    match state {
        Some(State::SlidingWindow { window, curr, prev }) if *window == w => (*curr, *prev),
        Some(State::SlidingWindow { window, curr, .. }) if window.saturating_add(1) == w => {
            (0, unsigned(*curr))
        }
        _ => (0, 0),
    }
}
