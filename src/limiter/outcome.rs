//! From one decision per limit to what the gateway does, the metrics it counts and the headers it
//! sends.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use http::header::HeaderName;

use super::Algorithm;
use super::{Check, Decision, Micros, Policy};
use crate::http::fields::FieldSink;

/// What happens to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it, after `delay` (leaky bucket queueing; zero otherwise).
    Forward { delay: Duration },
    /// Answer 429: `limit` is the index of the enforcing limit that denied with the longest wait.
    Limited { limit: usize, retry_after_secs: u64 },
}

/// The joint result of a request's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// The enforcing limit whose numbers go in `X-RateLimit-*` (fewest remaining), if any.
    pub headline: Option<usize>,
}

/// Whole seconds, rounded up.
fn secs_ceil(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

impl Outcome {
    /// Combines the decisions (one per check, in order) and counts them in the limit metrics:
    /// each limit records at most one decision per request — `limited` for an enforcing limit
    /// that denied, `shadow` for a shadow limit that would have, and `allowed` / `delayed` for
    /// every limit of a request that was admitted.
    pub fn of(checks: &[Check<'_>], decisions: &[Decision]) -> Outcome {
        let outcome = Outcome::judged(checks, decisions);
        let denied = matches!(outcome.verdict, Verdict::Limited { .. });
        for (c, d) in checks.iter().zip(decisions) {
            let m = &c.limit.metrics;
            if c.limit.shadow {
                if d.allowed {
                    if !denied {
                        m.allowed.increment(1);
                    }
                } else {
                    m.shadow.increment(1);
                }
            } else if denied {
                if !d.allowed {
                    m.limited.increment(1);
                }
            } else if d.delay > 0 {
                m.delayed.increment(1);
            } else {
                m.allowed.increment(1);
            }
        }
        outcome
    }

    /// Combines the decisions as [`Outcome::of`] does, counting nothing (`/-/explain`).
    pub fn judged(checks: &[Check<'_>], decisions: &[Decision]) -> Outcome {
        let mut denier: Option<(usize, u64)> = None;
        let mut delay = 0u64;
        let mut headline: Option<(usize, bool, u64)> = None;
        for (i, (c, d)) in checks.iter().zip(decisions).enumerate() {
            if c.limit.shadow || d.is_unasked() {
                continue;
            }
            if !d.allowed && denier.is_none_or(|(_, r)| d.retry_after > r) {
                denier = Some((i, d.retry_after));
            }
            delay = delay.max(d.delay);
            // Denied limits first, then the fewest remaining.
            let better = match headline {
                None => true,
                Some((_, allowed, remaining)) => {
                    (!d.allowed, std::cmp::Reverse(d.remaining))
                        > (!allowed, std::cmp::Reverse(remaining))
                }
            };
            if better {
                headline = Some((i, d.allowed, d.remaining));
            }
        }
        let verdict = match denier {
            Some((limit, retry)) => Verdict::Limited {
                limit,
                retry_after_secs: secs_ceil(retry).max(1),
            },
            None => Verdict::Forward {
                delay: Duration::from_micros(delay),
            },
        };
        Outcome {
            verdict,
            headline: headline.map(|(i, _, _)| i),
        }
    }

    /// Adds `X-RateLimit-*` for the headline limit and the IETF `RateLimit` /
    /// `RateLimit-Policy` fields (draft-ietf-httpapi-ratelimit-headers-11) for every enforcing
    /// limit, each with its partition key `pk` unless its subject is `global`.
    pub fn write_headers(
        &self,
        headers: &mut impl FieldSink,
        checks: &[Check<'_>],
        decisions: &[Decision],
    ) {
        let Some(h) = self.headline else { return };
        let Some(d) = decisions.get(h) else {
            return;
        };
        headers.set_number(&X_RATELIMIT_LIMIT, d.limit);
        headers.set_number(&X_RATELIMIT_REMAINING, d.remaining);
        headers.set_number(&X_RATELIMIT_RESET, headline_reset(d));
        let mut field = Vec::with_capacity(80 * checks.len());
        let mut policy = Vec::with_capacity(80 * checks.len());
        // A denied request is charged nothing: a limit that would have admitted it still has
        // the request's cost, which its decision counted as spent.
        let denied = matches!(self.verdict, Verdict::Limited { .. });
        for (c, d) in checks.iter().zip(decisions) {
            if c.limit.shadow || d.is_unasked() {
                continue;
            }
            let item = RateItem::of(c, d, denied);
            item.write_field(!field.is_empty(), &c.limit.name, &mut field);
            item.write_policy(!policy.is_empty(), &c.limit.policy_item, &mut policy);
        }
        headers.set(&RATELIMIT, &field);
        headers.set(&RATELIMIT_POLICY, &policy);
    }

    /// What [`Outcome::write_headers`] writes, as owned plain data with no heap (for up to two
    /// limits): the RateLimit fields of a refusal, carried to the front that writes them
    /// ([`RateFields::write`] into any sink, [`RateFields::write_lines`] straight into an
    /// HTTP/1 head). `None`: no field is written.
    pub fn rate_fields(&self, checks: &[Check<'_>], decisions: &[Decision]) -> Option<RateFields> {
        let h = self.headline?;
        let d = decisions.get(h)?;
        let denied = matches!(self.verdict, Verdict::Limited { .. });
        Some(RateFields {
            limit: d.limit,
            remaining: d.remaining,
            reset: headline_reset(d),
            items: checks
                .iter()
                .zip(decisions)
                .filter(|(c, d)| !c.limit.shadow && !d.is_unasked())
                .map(|(c, d)| {
                    (
                        c.limit.name.clone(),
                        c.limit.policy_item.clone(),
                        RateItem::of(c, d, denied),
                    )
                })
                .collect(),
        })
    }
}

/// `X-RateLimit-Reset` of the headline limit: until it refills (admitted) or admits (denied).
fn headline_reset(d: &Decision) -> u64 {
    secs_ceil(if d.allowed {
        d.reset_after
    } else {
        d.retry_after
    })
}

/// One enforcing limit's numbers in the `RateLimit` field (and its partition key).
#[derive(Debug, Clone, Copy)]
struct RateItem {
    remaining: u64,
    t: u64,
    pk: Option<tollgate_limit::SubjectDigest>,
}

impl RateItem {
    fn of(c: &Check<'_>, d: &Decision, denied: bool) -> RateItem {
        RateItem {
            remaining: if denied && d.allowed {
                d.remaining.saturating_add(c.decided_policy().cost)
            } else {
                d.remaining
            },
            t: secs_ceil(effective_window(&c.limit.policy, d)),
            pk: c.limit.partitioned.then_some(c.subject),
        }
    }

    /// `"name";r=R;t=T[;pk=…]`, after `, ` when not the first.
    fn write_field(&self, more: bool, name: &str, out: &mut Vec<u8>) {
        // Pieces pushed, numbers with `itoa`: no formatting machinery per response.
        let mut n = itoa::Buffer::new();
        if more {
            out.extend_from_slice(b", ");
        }
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\";r=");
        out.extend_from_slice(n.format(self.remaining).as_bytes());
        out.extend_from_slice(b";t=");
        out.extend_from_slice(n.format(self.t).as_bytes());
        if let Some(pk) = &self.pk {
            out.extend_from_slice(b";pk=");
            out.extend_from_slice(&pk.sf_bytes());
        }
    }

    /// The limit's `RateLimit-Policy` item `[;pk=…]`, after `, ` when not the first.
    fn write_policy(&self, more: bool, item: &str, out: &mut Vec<u8>) {
        if more {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(item.as_bytes());
        if let Some(pk) = &self.pk {
            out.extend_from_slice(b";pk=");
            out.extend_from_slice(&pk.sf_bytes());
        }
    }
}

/// A limit's item: its name and `RateLimit-Policy` item (shared with the compiled limit), its
/// numbers.
type Named = (Arc<str>, Arc<str>, RateItem);

/// The RateLimit fields of a refusal as plain data ([`Outcome::rate_fields`]): the headline
/// limit's numbers and each enforcing limit's item (its name and policy item shared with the
/// compiled limit, no copy).
#[derive(Debug, Clone)]
pub struct RateFields {
    limit: u64,
    remaining: u64,
    reset: u64,
    items: SmallVec<[Named; 2]>,
}

impl RateFields {
    /// Fields of the headline `(limit, remaining, reset)` and `items` (name, policy item,
    /// remaining, `t`, partition key), for tests.
    #[cfg(test)]
    pub fn of_parts(
        headline: (u64, u64, u64),
        items: &[(&str, &str, u64, u64, Option<tollgate_limit::SubjectDigest>)],
    ) -> RateFields {
        RateFields {
            limit: headline.0,
            remaining: headline.1,
            reset: headline.2,
            items: items
                .iter()
                .map(|&(name, policy, remaining, t, pk)| {
                    (name.into(), policy.into(), RateItem { remaining, t, pk })
                })
                .collect(),
        }
    }

    /// Whether `name` is one of the fields written.
    pub fn writes(name: &HeaderName) -> bool {
        [
            &X_RATELIMIT_LIMIT,
            &X_RATELIMIT_REMAINING,
            &X_RATELIMIT_RESET,
            &RATELIMIT,
            &RATELIMIT_POLICY,
        ]
        .contains(&name)
    }

    /// Writes the fields as [`Outcome::write_headers`] does.
    pub fn write(&self, headers: &mut impl FieldSink) {
        headers.set_number(&X_RATELIMIT_LIMIT, self.limit);
        headers.set_number(&X_RATELIMIT_REMAINING, self.remaining);
        headers.set_number(&X_RATELIMIT_RESET, self.reset);
        let mut v = Vec::with_capacity(80 * self.items.len());
        self.field(&mut v);
        headers.set(&RATELIMIT, &v);
        v.clear();
        self.policy(&mut v);
        headers.set(&RATELIMIT_POLICY, &v);
    }

    /// The same fields as HTTP/1 header lines (`name: value\r\n`, names in lower case, in
    /// [`RateFields::write`]'s order), appended to `out`: no allocation but `out`'s.
    pub fn write_lines(&self, out: &mut Vec<u8>) {
        let mut n = itoa::Buffer::new();
        for (name, v) in [
            (&X_RATELIMIT_LIMIT, self.limit),
            (&X_RATELIMIT_REMAINING, self.remaining),
            (&X_RATELIMIT_RESET, self.reset),
        ] {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(n.format(v).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"ratelimit: ");
        self.field(out);
        out.extend_from_slice(b"\r\nratelimit-policy: ");
        self.policy(out);
        out.extend_from_slice(b"\r\n");
    }

    fn field(&self, out: &mut Vec<u8>) {
        for (i, (name, _, item)) in self.items.iter().enumerate() {
            item.write_field(i > 0, name, out);
        }
    }

    fn policy(&self, out: &mut Vec<u8>) {
        for (i, (_, policy, item)) in self.items.iter().enumerate() {
            item.write_policy(i > 0, policy, out);
        }
    }
}

/// `t` of the `RateLimit` field in draft -11: the effective window, the time within which the
/// client can use no more than the `r` it is told (µs). Denied: until a request is admitted
/// again. Admitted: until `remaining` next grows — the window's end for fixed windows, the next
/// emission for GCRA, the leaky bucket and the token bucket (computed from the decision). The
/// sliding algorithms free units as old ones leave, which their decision does not reveal; they
/// report the time until everything used is free again (`reset_after`). A bucket or GCRA holding
/// granted credit (`remaining` at its burst or above) gains nothing until the credit lapses:
/// `reset_after`, when it does.
pub fn effective_window(p: &Policy, d: &Decision) -> Micros {
    if !d.allowed {
        return d.retry_after;
    }
    let r = d.remaining;
    let credit = match p.algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => r >= p.burst,
        Algorithm::LeakyBucket => r > p.burst,
        _ => false,
    };
    if credit {
        return d.reset_after.max(1);
    }
    match p.algorithm {
        Algorithm::Gcra | Algorithm::LeakyBucket => {
            let t = (p.period / p.limit.max(1)).max(1);
            let tolerance = p.burst.saturating_mul(t);
            let step = if p.algorithm == Algorithm::Gcra {
                r.saturating_add(1)
            } else {
                r
            };
            d.reset_after
                .saturating_add(step.saturating_mul(t))
                .saturating_sub(tolerance)
                .max(1)
        }
        Algorithm::TokenBucket => {
            // The level after this request is within L of B·P − reset·L; the next whole token
            // arrives when the level reaches (r + 1)·P, refilling at L per µs.
            let (l, per) = (u128::from(p.limit.max(1)), u128::from(p.period));
            let after = (u128::from(p.burst) * per).saturating_sub(u128::from(d.reset_after) * l);
            let need = (u128::from(r) + 1) * per;
            let t = need.saturating_sub(after).div_ceil(l);
            u64::try_from(t).unwrap_or(u64::MAX).max(1)
        }
        // A concurrency slot frees when a request ends, which no decision can foretell.
        Algorithm::FixedWindow
        | Algorithm::SlidingWindow
        | Algorithm::SlidingLog
        | Algorithm::Concurrency => d.reset_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{admit, evaluate, State};

    const S: u64 = 1_000_000;

    /// Units a request could use at `now`: what an admitted request reports plus its cost.
    fn available(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
        let d = evaluate(p, state, now);
        if d.allowed {
            d.remaining + p.cost
        } else {
            d.remaining
        }
    }

    /// Granted credit grows back never: `t` is when it lapses (a period after the request).
    #[test]
    fn the_effective_window_of_granted_credit_is_its_lapse() {
        use crate::limiter::adjust::{apply, Adjust};
        for (algorithm, burst) in [
            (Algorithm::TokenBucket, 5),
            (Algorithm::Gcra, 5),
            (Algorithm::LeakyBucket, 4),
        ] {
            let p = Policy {
                algorithm,
                limit: 10,
                period: 60 * S,
                burst,
                cost: 1,
                calendar: None,
            };
            let now = 1_000 * S + 7;
            let s = apply(&p, None, now, Adjust::Grant(3));
            let d = evaluate(&p, s.as_ref(), now);
            assert!(
                d.allowed && d.remaining > p.quota() - 1,
                "{algorithm:?}: {d:?}"
            );
            assert_eq!(effective_window(&p, &d), 60 * S, "{algorithm:?}");
        }
    }

    /// -11's `t`: within it the client can use no more than `r`; at its end, more.
    #[test]
    fn the_effective_window_ends_when_remaining_grows() {
        for (algorithm, limit, period, burst) in [
            (Algorithm::Gcra, 10, S, 5),
            (Algorithm::Gcra, 7, 3 * S, 4),
            (Algorithm::LeakyBucket, 5, S, 3),
            (Algorithm::TokenBucket, 10, S, 5),
            (Algorithm::TokenBucket, 3, 7 * S, 2),
            (Algorithm::FixedWindow, 4, 10 * S, 0),
        ] {
            let p = Policy {
                algorithm,
                limit,
                period,
                burst,
                cost: 1,
                calendar: None,
            };
            let mut state: Option<State> = None;
            let mut now = 1_000 * S + 7;
            for step in 0..p.quota().min(4) {
                let d = evaluate(&p, state.as_ref(), now);
                assert!(d.allowed, "{algorithm:?} step {step}");
                state = Some(admit(&p, state, now));
                let t = effective_window(&p, &d);
                let s = state.as_ref();
                assert_eq!(
                    available(&p, s, now + t - 1),
                    d.remaining,
                    "{algorithm:?} step {step}: more than r before t = {t}"
                );
                assert!(
                    available(&p, s, now + t) > d.remaining,
                    "{algorithm:?} step {step}: no more than r at t = {t}"
                );
                now += 13_000;
            }
        }
    }
}
