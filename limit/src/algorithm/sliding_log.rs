//! `sliding_log`: every admitted request's (time, cost) for a period, exact; Lua: `sl` in
//! `algorithms.lua`.

use std::collections::VecDeque;

use super::{Algo, Algorithm, Decision, Micros, Policy, State};

/// `sliding_log`.
pub struct SlidingLog;

impl Algo for SlidingLog {
    const ALGORITHM: Algorithm = Algorithm::SlidingLog;
    const LEASES: bool = false;
    /// A log's entries are the requests' times, which a grant would have to invent.
    const GRANTS: bool = false;
    const CHARGES_AFTER: bool = true;

    /// The cost admitted in the period up to `now`.
    type At = u64;

    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At {
        match state {
            Some(State::SlidingLog { entries }) => log_sum(entries, now, p.period),
            _ => 0,
        }
    }

    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
        let (l, per, c) = (p.limit, p.period, p.cost);
        let empty = VecDeque::new();
        let entries = match state {
            Some(State::SlidingLog { entries }) => entries,
            _ => &empty,
        };
        let sum = Self::at(p, state, now);
        let allowed = sum + c <= l;
        let live = entries
            .iter()
            .filter(|(ts, _)| ts.saturating_add(per) > now);
        let retry_after = if allowed {
            0
        } else {
            let mut freed = 0;
            let mut at = per;
            for (ts, cost) in live.clone() {
                freed += cost;
                if sum - freed + c <= l {
                    at = ts + per - now;
                    break;
                }
            }
            at
        };
        let newest = if allowed {
            Some(now)
        } else {
            live.map(|(ts, _)| *ts).next_back()
        };
        Decision {
            allowed,
            limit: p.quota(),
            remaining: l.saturating_sub(sum + if allowed { c } else { 0 }),
            retry_after,
            reset_after: newest.map_or(0, |ts| ts + per - now),
            delay: 0,
            kind: Default::default(),
        }
    }

    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State {
        let mut entries = match state {
            Some(State::SlidingLog { entries }) => entries,
            _ => VecDeque::new(),
        };
        while entries
            .front()
            .is_some_and(|(ts, _)| ts.saturating_add(p.period) <= now)
        {
            entries.pop_front();
        }
        entries.push_back((now, p.cost));
        State::SlidingLog { entries }
    }

    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
        match Self::charge(&Policy { cost: units, ..*p }, state, now) {
            State::SlidingLog { mut entries } => {
                let sum: u64 = entries.iter().map(|(_, c)| *c).sum();
                let excess = sum.saturating_sub(p.limit);
                if let Some(last) = entries.back_mut() {
                    last.1 = last.1.saturating_sub(excess);
                    if last.1 == 0 {
                        entries.pop_back();
                    }
                }
                State::SlidingLog { entries }
            }
            other => other,
        }
    }

    fn give_back(
        _: &Policy,
        state: State,
        charged_at: Micros,
        _: Micros,
        units: u64,
        _: u64,
    ) -> Option<State> {
        Some(match state {
            State::SlidingLog { mut entries } => {
                if let Some(i) = entries
                    .iter()
                    .rposition(|&(ts, c)| ts == charged_at && c == units)
                {
                    entries.remove(i);
                }
                State::SlidingLog { entries }
            }
            other => other,
        })
    }

    fn expiry(p: &Policy, state: &State) -> Micros {
        match state {
            State::SlidingLog { entries } => entries.back().map_or(0, |(ts, _)| ts + p.period),
            _ => 0,
        }
    }
}

fn log_sum(entries: &VecDeque<(Micros, u64)>, now: Micros, period: Micros) -> u64 {
    entries
        .iter()
        .filter(|(ts, _)| ts.saturating_add(period) > now)
        .map(|(_, c)| *c)
        .sum()
}
