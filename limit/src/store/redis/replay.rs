//! Decisions of a batch sent as runs (the decide script's mode `r`), replayed here.
//!
//! The script decided each run of identical requests at once and charged the keys; its reply is
//! Redis's `now` and every key's state *before* the batch. From those the gateway decides the
//! batch again, request by request, in order, all-or-nothing, with the pure algorithms of the
//! in-process store ([`crate::evaluate`] and [`crate::admit`]): the same
//! arithmetic the script's per-request loop runs (the differential test holds them to it), so
//! every request gets the decision it would have got in mode `c`, while Redis does one step per
//! run instead of one decision per request and limit.

use super::resp::ProtocolError;
use crate::Algorithm;
use crate::{admit, batch, evaluate, Decision, Policy, State};

/// One limit of a request in a batch sent as runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayLimit {
    /// Its key's index in the call's KEYS (0-based).
    pub key: u32,
    pub policy: Policy,
    pub shadow: bool,
    /// Charged after the response: evaluated, never charged here.
    pub after: bool,
}

/// A key's value as the runs reply carries it (its state's string, `None` for a missing key),
/// appended to `out` as 4 integers (present, s1, s2, s3), as state.lua reads it: the packed form
/// (a tag byte 1, then 1 to 3 little-endian doubles) or the decimal one of earlier versions
/// (`a`, `a:b`, `a:b:c`); a value neither is read as no state, as the script reads it.
pub fn raw_state(value: Option<&[u8]>, out: &mut Vec<i64>) -> Result<(), ProtocolError> {
    let mut nums = [0i64; 3];
    let count = match value {
        None => 0,
        Some([1, packed @ ..]) => {
            if packed.is_empty() || packed.len() % 8 != 0 || packed.len() > 24 {
                return Err(ProtocolError("a key's state of an unknown size"));
            }
            for (n, bytes) in nums.iter_mut().zip(packed.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(bytes);
                let x = f64::from_le_bytes(b);
                // Whole numbers below 2^53 (every state's), as Lua hands them to Redis.
                if x.fract() != 0.0 || x.abs() > 9_007_199_254_740_992.0 {
                    return Err(ProtocolError("a key's state that is not whole numbers"));
                }
                *n = x as i64;
            }
            packed.len() / 8
        }
        Some(text) => {
            let mut k = 0;
            for part in text.split(|&b| b == b':') {
                let n = std::str::from_utf8(part)
                    .ok()
                    .filter(|p| {
                        p.bytes()
                            .enumerate()
                            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
                    })
                    .and_then(|p| p.parse::<i64>().ok());
                match (n, nums.get_mut(k)) {
                    (Some(n), Some(slot)) => *slot = n,
                    _ => {
                        (k, nums) = (0, [0; 3]);
                        break;
                    }
                }
                k += 1;
            }
            k
        }
    };
    out.extend_from_slice(&[i64::from(count > 0), nums[0], nums[1], nums[2]]);
    Ok(())
}

/// A key's state as the script reports it (present, s1, s2, s3), read as `algorithm`'s state;
/// `Err` when a number is out of range.
fn state(algorithm: Algorithm, raw: &[i64]) -> Result<Option<State>, ()> {
    let [present, a, b, c] = raw else {
        return Err(());
    };
    let n = |v: i64| u64::try_from(v).map_err(drop);
    if *present == 0 {
        return Ok(None);
    }
    if *present != 1 {
        return Err(());
    }
    Ok(Some(match algorithm {
        Algorithm::FixedWindow => State::FixedWindow {
            window: n(*a)?,
            // Below 0 after a grant beyond the quota (credit).
            count: *b,
        },
        Algorithm::SlidingWindow => State::SlidingWindow {
            window: n(*a)?,
            curr: *b,
            prev: n(*c)?,
        },
        Algorithm::TokenBucket => State::TokenBucket {
            level: n(*a)?,
            last: n(*b)?,
        },
        Algorithm::Gcra => State::Gcra {
            tat: n(*a)?,
            credit: n(*b)?,
        },
        Algorithm::LeakyBucket => State::LeakyBucket {
            tat: n(*a)?,
            credit: n(*b)?,
        },
        Algorithm::SlidingLog | Algorithm::Concurrency => return Err(()),
    }))
}

/// The decisions of every limit of the batch, in order, from the script's reply `ints` (`now`,
/// then 4 integers per key: [`raw_state`]'s); `jobs` gives each request's number of limits, `limits` them all in
/// order. `None` when the reply does not fit the batch.
pub fn replay(
    ints: &[i64],
    keys: usize,
    limits: &[ReplayLimit],
    jobs: impl Iterator<Item = usize>,
) -> Option<Vec<Decision>> {
    let (&now, states) = ints.split_first()?;
    let now = u64::try_from(now).ok()?;
    if Some(states.len()) != keys.checked_mul(4) {
        return None;
    }
    // Each key read once, at its first use, as the state of the limit that uses it.
    let mut state_of: Vec<Option<Option<State>>> = vec![None; keys];
    let mut decisions = Vec::with_capacity(limits.len());
    let mut rest = limits;
    for n in jobs {
        let (request, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        let start = decisions.len();
        for l in request {
            let k = usize::try_from(l.key).ok()?;
            let slot = state_of.get_mut(k)?;
            if slot.is_none() {
                let raw = states.get(k * 4..k * 4 + 4)?;
                *slot = Some(state(l.policy.algorithm, raw).ok()?);
            }
            let s = slot.as_ref().and_then(Option::as_ref);
            decisions.push(evaluate(&l.policy, s, now));
        }
        let made = &decisions[start..];
        let part = |l: &ReplayLimit, d: &Decision| batch::Part {
            allowed: d.allowed,
            shadow: l.shadow,
            charged_on_admission: !l.after,
        };
        if batch::admitted(request.iter().zip(made).map(|(l, d)| part(l, d))) {
            for (l, d) in request.iter().zip(made) {
                if part(l, d).charged() {
                    let slot = state_of.get_mut(usize::try_from(l.key).ok()?)?;
                    let old = slot.take().flatten();
                    *slot = Some(Some(admit(&l.policy, old, now)));
                }
            }
        }
    }
    rest.is_empty().then_some(decisions)
}

#[cfg(test)]
mod tests {
    /// A key's value read as state.lua reads it: packed (1 to 3 doubles), decimal (1 to 3
    /// integers, the form of earlier versions), missing; anything else is no state (the script's
    /// readers find none either) or, packed, refused.
    #[test]
    fn raw_states_read_as_the_script_reads_them() {
        let packed = |xs: &[f64]| {
            let mut v = vec![1u8];
            for x in xs {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v
        };
        let read = |v: Option<&[u8]>| {
            let mut out = Vec::new();
            raw_state(v, &mut out).map(|()| out)
        };
        assert_eq!(read(None), Ok(vec![0, 0, 0, 0]));
        assert_eq!(read(Some(&packed(&[7.0]))), Ok(vec![1, 7, 0, 0]));
        assert_eq!(read(Some(&packed(&[7.0, -3.0]))), Ok(vec![1, 7, -3, 0]));
        assert_eq!(
            read(Some(&packed(&[9.0e15, 4.0, 2.0]))),
            Ok(vec![1, 9_000_000_000_000_000, 4, 2])
        );
        assert_eq!(read(Some(b"1700")), Ok(vec![1, 1700, 0, 0]));
        assert_eq!(read(Some(b"12:-4")), Ok(vec![1, 12, -4, 0]));
        assert_eq!(read(Some(b"12:4:9")), Ok(vec![1, 12, 4, 9]));
        for none in [&b"x"[..], b"1:2:3:4", b"", b"1::2", b"+5", b"-"] {
            assert_eq!(read(Some(none)), Ok(vec![0, 0, 0, 0]), "{none:?}");
        }
        assert!(read(Some(&[1])).is_err());
        assert!(read(Some(&packed(&[1.0, 2.0, 3.0, 4.0]))).is_err());
        assert!(read(Some(&packed(&[1.5]))).is_err());
        assert!(read(Some(&packed(&[f64::NAN]))).is_err());
        assert!(read(Some(&[1, 0, 0, 0])).is_err());
    }

    use super::*;

    fn gcra(limit: u64, burst: u64) -> Policy {
        Policy {
            algorithm: Algorithm::Gcra,
            limit,
            period: 1_000_000,
            burst,
            cost: 1,
            calendar: None,
        }
    }

    fn l(key: u32, policy: Policy, shadow: bool) -> ReplayLimit {
        ReplayLimit {
            key,
            policy,
            shadow,
            after: false,
        }
    }

    #[test]
    fn a_run_is_decided_request_by_request_all_or_nothing() {
        let now = 5_000_000i64;
        // Key 0: empty (burst 2); key 1: a tight fixed window with 1 left.
        let fw = Policy {
            algorithm: Algorithm::FixedWindow,
            limit: 3,
            period: 1_000_000,
            burst: 0,
            cost: 1,
            calendar: None,
        };
        let ints = [now, 0, 0, 0, 0, 1, 5, 2, 0];
        let limits = [l(0, gcra(10, 2), false), l(1, fw, false)];
        let all: Vec<ReplayLimit> = limits.iter().cycle().take(6).copied().collect();
        let d = replay(&ints, 2, &all, [2, 2, 2].into_iter()).unwrap();
        assert_eq!(d.len(), 6);
        // The first request takes the window's last unit; the others are refused by it, and
        // GCRA (admitting) is charged only once.
        assert!(d[0].allowed && d[1].allowed);
        assert!(d[2].allowed && !d[3].allowed);
        assert_eq!(
            d[2].remaining, 0,
            "GCRA charged once: burst 2 − 2 after this one"
        );
        assert!(d[4].allowed && !d[5].allowed);
        assert_eq!(d[4], d[2]);
    }

    #[test]
    fn a_shadow_limit_is_charged_only_when_it_admits() {
        let ints = [1_000i64, 0, 0, 0, 0, 0, 0, 0, 0];
        let limits = [l(0, gcra(10, 1), true), l(1, gcra(10, 3), false)];
        let all: Vec<ReplayLimit> = limits.iter().cycle().take(6).copied().collect();
        let d = replay(&ints, 2, &all, [2, 2, 2].into_iter()).unwrap();
        let shadow: Vec<bool> = d.iter().step_by(2).map(|d| d.allowed).collect();
        let real: Vec<bool> = d.iter().skip(1).step_by(2).map(|d| d.allowed).collect();
        assert_eq!(shadow, [true, false, false]);
        assert_eq!(real, [true, true, true]);
    }

    #[test]
    fn replies_that_do_not_fit_the_batch_are_refused() {
        let limits = [l(0, gcra(10, 2), false)];
        let one = [1];
        assert!(replay(&[1, 0, 0, 0, 0], 1, &limits, one.into_iter()).is_some());
        assert!(replay(&[1, 0, 0, 0], 1, &limits, one.into_iter()).is_none());
        assert!(replay(&[-1, 0, 0, 0, 0], 1, &limits, one.into_iter()).is_none());
        assert!(replay(&[1, 1, -5, 0, 0], 1, &limits, one.into_iter()).is_none());
        assert!(replay(&[1, 2, 0, 0, 0], 1, &limits, one.into_iter()).is_none());
        assert!(replay(&[1, 0, 0, 0, 0], 1, &limits, [2].into_iter()).is_none());
        assert!(replay(&[1, 0, 0, 0, 0], 1, &limits, [0].into_iter()).is_none());
        let far = [l(3, gcra(10, 2), false)];
        assert!(replay(&[1, 0, 0, 0, 0], 1, &far, one.into_iter()).is_none());
    }
}
