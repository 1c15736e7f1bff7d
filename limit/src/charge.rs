//! The charge made after the response (`count_status`, `cost_header`): check before, charge
//! after.
//!
//! A limit charged after the response is only *evaluated* when the request arrives (a spent
//! limit still answers 429 and the upstream is not called); the charge comes when the upstream's
//! response head is known. By then the response is the client's: a charge never turns it into a
//! 429, so it always adds — but never beyond a full limit: the amount is clamped to the limit's
//! quota and the state to "spent" (a window's count to L, a bucket's level to 0, a GCRA TAT to
//! now + B·T). A spent limit then denies until it would have recovered from being exactly spent.
//!
//! The overshoot bound: N requests admitted while R ≥ C units remained, each charged at most
//! Q = the quota, charge at most N·Q in total, so the limit's units consumed exceed L by less than
//! N × min(charge, Q). The same pure function serves the in-process store and, line for line,
//! the algorithms' `force` in `src/store/scripts/algorithms.lua` (decide.lua's settle mode).

use crate::{Algorithm, Micros, Policy, State};

/// The state after charging `units` regardless of what is left, clamped to a spent limit: each
/// algorithm's [`force`](crate::Algo::force).
pub fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> Option<State> {
    let units = units.min(p.quota());
    if units == 0 {
        return state;
    }
    Some(crate::algorithm::force(p, state, now, units))
}

/// The units a response charges: `cost` unless the header holds a usable number (see
/// [`parse_cost`]), clamped to the quota. `Err` carries the unclamped value when it was clamped.
pub fn clamp(p: &Policy, reported: Option<u64>) -> Result<u64, u64> {
    let units = reported.unwrap_or(p.cost);
    if units > p.quota() {
        Err(units)
    } else {
        Ok(units)
    }
}

/// The integer in a cost header's value: ASCII digits, optional surrounding whitespace; a value
/// past `u64::MAX` reads as `u64::MAX` (it is clamped anyway). `None` for anything else (empty,
/// a sign, a fraction, a list): the request is then charged `cost`.
pub fn parse_cost(value: &[u8]) -> Option<u64> {
    let v = value.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .try_fold(0u64, |n, d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            })
            .unwrap_or(u64::MAX),
    )
}

/// Whether `algorithm` can be charged after the response (config refuses the others).
pub fn chargeable(algorithm: Algorithm) -> bool {
    algorithm.charges_after()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluate;

    const S: u64 = 1_000_000;

    fn policy(algorithm: Algorithm) -> Policy {
        Policy {
            algorithm,
            limit: 1000,
            period: 3600 * S,
            burst: if matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra) {
                1000
            } else {
                0
            },
            cost: 1,
            calendar: None,
        }
    }

    #[test]
    fn hostile_cost_values() {
        assert_eq!(parse_cost(b"400"), Some(400));
        assert_eq!(parse_cost(b" 12 "), Some(12));
        assert_eq!(parse_cost(b"99999999999999999999999"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"-5",
            b"+5",
            b"1.5",
            b"1e3",
            b"12, 13",
            b"abc",
            b"0x10",
        ] {
            assert_eq!(parse_cost(bad), None, "{bad:?}");
        }
        let p = policy(Algorithm::TokenBucket);
        assert_eq!(clamp(&p, Some(400)), Ok(400));
        assert_eq!(clamp(&p, None), Ok(1));
        assert_eq!(clamp(&p, Some(u64::MAX)), Err(u64::MAX));
    }

    #[test]
    fn a_charge_adds_and_stops_at_spent() {
        let now = 1_700_000_000 * S;
        for a in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ] {
            let p = policy(a);
            let mut s = None;
            for units in [400, 300, 300] {
                assert!(evaluate(&p, s.as_ref(), now).allowed, "{a:?}");
                s = force(&p, s, now, units);
            }
            let d = evaluate(&p, s.as_ref(), now);
            assert!(!d.allowed, "{a:?}: 1000 of 1000 spent");
            // Charging more of a spent limit changes nothing: it is clamped to spent.
            let again = force(&p, s.clone(), now, 5000);
            assert_eq!(evaluate(&p, again.as_ref(), now), d, "{a:?}");
            assert_eq!(
                force(&p, s.clone(), now, 0),
                s,
                "{a:?}: zero charges nothing"
            );
        }
    }
}
