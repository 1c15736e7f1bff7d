//! The algorithms as pure functions of (policy, state, now, cost): one file each, behind one
//! trait ([`Algo`]) whose methods are the fields of the algorithm's table in
//! `store/scripts/algorithms.lua`, one to one.
//!
//! Each decision has two steps so that several limits can be decided all-or-nothing:
//! [`evaluate`] looks at the state and says what would happen, changing nothing; [`admit`] charges
//! the request's cost and is called only when every enforcing limit of the request admitted it. A
//! denied request therefore never changes state. Time is passed in (microseconds since the Unix
//! epoch), never read here, so the same functions serve the in-process store, the tests with
//! injected time, and — line for line — each algorithm's table in `limit/src/store/scripts/algorithms.lua` for Redis.
//!
//! All arithmetic is on integers that stay below 2^53 (the config checks `limit·period`, and a
//! grant's credit is bounded to keep it so: [`credit_max`]), so Lua's doubles
//! compute exactly the same numbers as Rust's integers.
//!
//! A state can hold more than a fresh one after support granted units beyond the quota
//! ([`crate::adjust`]): a window's count below 0, tokens above the burst, a GCRA or leaky-bucket
//! credit. Each lapses on its own (the window's end; a period without a request), so idle time
//! never adds to it.

use std::collections::VecDeque;

use crate::calendar::CalendarWindow;

pub mod concurrency;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use self::concurrency::Concurrency;
pub use self::fixed_window::FixedWindow;
pub use self::gcra::Gcra;
pub use self::leaky_bucket::LeakyBucket;
pub use self::sliding_log::SlidingLog;
pub use self::sliding_window::SlidingWindow;
pub use self::token_bucket::TokenBucket;

/// A limit's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    Gcra,
    LeakyBucket,
    /// Requests in flight at once, not a rate (see [`crate::concurrency`]).
    Concurrency,
}

impl Algorithm {
    /// The algorithm's name (the gateway's config spells it so).
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

/// What an algorithm is: one implementation per algorithm, each in its own file, each method
/// the Rust side of a field of the algorithm's table in `store/scripts/algorithms.lua` (the
/// Lua name in brackets). Pure functions of the policy, the state and an injected time; a
/// missing state (`None`) is a fresh limit. The stores never call these directly: they call the
/// functions below ([`evaluate`], [`admit`], …), which pick the implementation by
/// [`Policy::algorithm`] ([`dispatch!`]).
///
/// What an algorithm can do besides deciding is said by its constants; the config refuses a
/// limit that asks for what its algorithm cannot do, and the methods of an algorithm that
/// cannot keep their defaults.
pub trait Algo {
    /// The algorithm this implements.
    const ALGORITHM: Algorithm;
    /// Whether a limit of it can lease units (`sync = "lease"`): [`avail`](Algo::avail) says
    /// how many; the units come back through [`give_back`](Algo::give_back) [`avail`,
    /// `give_back`].
    const LEASES: bool;
    /// Whether support can grant it units ([`grant`](Algo::grant)) [`grant`].
    const GRANTS: bool;
    /// Whether it can be charged after the response ([`force`](Algo::force)) [`force`].
    const CHARGES_AFTER: bool;

    /// What the state says at `now`, the view every other method decides on (a window's count
    /// in the current window, a bucket's level, a TAT's base).
    type At;

    /// The state at `now` [`at`].
    fn at(p: &Policy, state: Option<&State>, now: Micros) -> Self::At;

    /// What the limit would decide for one request costing `p.cost` at `now`; changes nothing
    /// [`decide`].
    fn decide(p: &Policy, state: Option<&State>, now: Micros) -> Decision;

    /// How many of `k` requests costing `p.cost`, all at `now`, the limit admits one after
    /// another [`capacity`]: the run rule of `runs.lua`, which the Redis store applies to a
    /// batch's requests for one key. In process each request is decided on its own, so this
    /// is the reference the two are held to.
    fn capacity(p: &Policy, state: Option<&State>, now: Micros, k: u64) -> u64 {
        let mut s = state.cloned();
        let mut n = 0;
        while n < k && Self::decide(p, s.as_ref(), now).allowed {
            s = Some(Self::charge(p, s, now));
            n += 1;
        }
        n
    }

    /// The state after an admitted request's cost is charged; call only after
    /// [`decide`](Algo::decide) admitted [`charge`].
    fn charge(p: &Policy, state: Option<State>, now: Micros) -> State;

    /// The state after a charge of `units` (≥ 1, at most the quota) after the response,
    /// whatever is left, clamped to a spent limit (see [`crate::charge`]) [`force`].
    fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State;

    /// The units the limit could admit at once at `now`; 0 for an algorithm that does not
    /// lease (see [`crate::lease`]) [`avail`].
    fn avail(_: &Policy, _: Option<&State>, _: Micros) -> u64 {
        0
    }

    /// The state after `units` charged at `charged_at` are given back at `now` (a refund, a
    /// lease's unused units), never holding more than `most` units of credit (see
    /// [`crate::refund`]); `None` when nothing is left [`give_back`].
    fn give_back(
        p: &Policy,
        state: State,
        charged_at: Micros,
        now: Micros,
        units: u64,
        most: u64,
    ) -> Option<State>;

    /// The state after support grants `units` now, beyond the quota as credit up to `most`
    /// units (see [`crate::adjust`]); unchanged for an algorithm that does not grant [`grant`].
    fn grant(_: &Policy, state: Option<State>, _: Micros, _: u64, _: u64) -> Option<State> {
        state
    }

    /// When the state is no longer needed: from then on it decides exactly as no state would
    /// [`expiry`].
    fn expiry(p: &Policy, state: &State) -> Micros;

    /// A denial `elapsed` µs later, `r` µs before its reset, exactly as [`decide`](Algo::decide)
    /// would say then, for an algorithm whose decision pins its state down; `None` otherwise
    /// (ask the store). Rust only: the deny cache's (see [`age_denial`]).
    fn age_denial(_: &Policy, _: &Decision, _: Micros, _: Micros) -> Option<Decision> {
        None
    }
}

/// Runs `$body` with `$A` the [`Algo`] of `$alg`: the one place an [`Algorithm`] meets its
/// implementation.
macro_rules! dispatch {
    ($alg:expr, $A:ident => $body:expr) => {
        match $alg {
            Algorithm::FixedWindow => {
                type $A = $crate::algorithm::FixedWindow;
                $body
            }
            Algorithm::SlidingWindow => {
                type $A = $crate::algorithm::SlidingWindow;
                $body
            }
            Algorithm::SlidingLog => {
                type $A = $crate::algorithm::SlidingLog;
                $body
            }
            Algorithm::TokenBucket => {
                type $A = $crate::algorithm::TokenBucket;
                $body
            }
            Algorithm::Gcra => {
                type $A = $crate::algorithm::Gcra;
                $body
            }
            Algorithm::LeakyBucket => {
                type $A = $crate::algorithm::LeakyBucket;
                $body
            }
            Algorithm::Concurrency => {
                type $A = $crate::algorithm::Concurrency;
                $body
            }
        }
    };
}

impl Algorithm {
    /// [`Algo::LEASES`] of this algorithm.
    pub fn leases(self) -> bool {
        dispatch!(self, A => A::LEASES)
    }

    /// [`Algo::GRANTS`] of this algorithm.
    pub fn grants(self) -> bool {
        dispatch!(self, A => A::GRANTS)
    }

    /// [`Algo::CHARGES_AFTER`] of this algorithm.
    pub fn charges_after(self) -> bool {
        dispatch!(self, A => A::CHARGES_AFTER)
    }
}

/// Microseconds since the Unix epoch (or a duration in microseconds).
pub type Micros = u64;

/// A limit's parameters, in the units the algorithms compute with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub algorithm: Algorithm,
    /// L: units per period.
    pub limit: u64,
    /// P in microseconds (a whole number of milliseconds, ≥ 1ms).
    pub period: Micros,
    /// B: bucket capacity (token bucket, GCRA) or queue length (leaky bucket); 0 for windows.
    pub burst: u64,
    /// C: units charged per request.
    pub cost: u64,
    /// Fixed windows only: aligned to calendar days, weeks or months instead of `period`.
    pub calendar: Option<CalendarWindow>,
}

impl Policy {
    /// A fixed window's `(id, end)` at `now`: the window's index since the epoch and its end,
    /// or for a calendar window its start and end (both in µs).
    pub fn fixed_window(&self, now: Micros) -> (u64, Micros) {
        match self.calendar {
            Some(c) => c.window(now),
            None => {
                let w = now / self.period;
                (w, (w + 1) * self.period)
            }
        }
    }

    /// GCRA / leaky bucket emission interval T = P / L (whole microseconds, ≥ 1 by validation).
    pub(crate) fn interval(&self) -> u64 {
        (self.period / self.limit).max(1)
    }

    /// The quota advertised in headers: what `remaining` counts down from.
    pub fn quota(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => self.burst,
            Algorithm::LeakyBucket => self.burst + 1,
            _ => self.limit,
        }
    }
}

/// Where a [`Decision`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecisionKind {
    /// The store evaluated the limit.
    #[default]
    Decided,
    /// The store read a ban of the subject (`ban_after`, shared by another gateway) and
    /// refused without evaluating or charging: `retry_after` is the time left of the ban.
    Banned,
    /// Not asked ([`Decision::unasked`]): it neither admits nor denies.
    Unasked,
}

/// What one limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// Whether this limit admits the request.
    pub allowed: bool,
    /// The quota `remaining` counts down from ([`Policy::quota`]).
    pub limit: u64,
    /// Units left after this request (if admitted) or now (if denied).
    pub remaining: u64,
    /// Denied: how long until the same request would be admitted. 0 when admitted.
    pub retry_after: Micros,
    /// How long until the limit is back to its initial state (fixed window: the window's end).
    pub reset_after: Micros,
    /// Leaky bucket: how long the admitted request waits before it is forwarded.
    pub delay: Micros,
    /// Evaluated, or refused by a ban read from the store.
    pub kind: DecisionKind,
}

impl Decision {
    /// The decision of a limit the store did not ask, because a limit decided before it (kept
    /// in process, `store = "local"`) refused the request: it neither admits nor denies, and
    /// the rate-limit headers leave it out. Marked by its kind, not by its numbers: a limit of
    /// 0 is a real answer (a byte budget of nothing).
    pub fn unasked() -> Decision {
        Decision {
            allowed: true,
            kind: DecisionKind::Unasked,
            ..Decision::default()
        }
    }

    /// Whether the store refused this because the subject is banned ([`DecisionKind::Banned`]).
    pub fn is_banned(&self) -> bool {
        self.kind == DecisionKind::Banned
    }

    /// Whether this is [`Decision::unasked`].
    pub fn is_unasked(&self) -> bool {
        self.kind == DecisionKind::Unasked
    }
}

/// A limit's state for one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// `count`: the cost admitted in `window`; below 0 after a grant beyond the quota (credit
    /// that lapses with the window).
    FixedWindow { window: u64, count: i64 },
    /// `curr` may be below 0 after a grant, like a fixed window's count; the credit lapses with
    /// its window (a window that ended in credit weighs as an unused one: `prev` ≥ 0).
    SlidingWindow { window: u64, curr: i64, prev: u64 },
    /// Admitted (timestamp, cost), oldest first; the costs sum to at most L.
    SlidingLog { entries: VecDeque<(Micros, u64)> },
    /// `level` is tokens × P (so refilling at L per P adds `elapsed × L`, exactly). Above B·P
    /// only after a grant: no refill adds to those tokens, and they lapse (the bucket is full)
    /// once a whole period passes without a request (`last` + P).
    TokenBucket { level: u64, last: Micros },
    /// Theoretical arrival time. `credit` (µs, 0 but after a grant beyond the burst): a request
    /// counts from max(TAT, now) − credit; while it is above 0, `tat` is when it was written,
    /// and it lapses a period later.
    Gcra { tat: Micros, credit: Micros },
    /// Time at which the queue has drained; `credit` as GCRA's (slots before now go at once).
    LeakyBucket { tat: Micros, credit: Micros },
    /// Requests of the subject in flight (see [`super::concurrency`]).
    Concurrency { in_flight: u64 },
}

pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    if b == 0 {
        0
    } else {
        a.div_ceil(b)
    }
}

/// A config number (below 2^53 by validation) as a signed count.
pub(crate) fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A signed count as units, 0 below 0.
pub(crate) fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// GCRA / leaky bucket: where a request at `now` counts from — max(TAT, now), less the granted
/// credit while it lives (until a period after it was written).
pub(crate) fn tat_base(p: &Policy, state: Option<&State>, now: Micros) -> Micros {
    match state {
        Some(State::Gcra { tat, credit }) | Some(State::LeakyBucket { tat, credit }) => {
            let base = (*tat).max(now);
            if *credit > 0 && now < tat.saturating_add(p.period) {
                base.saturating_sub(*credit)
            } else {
                base
            }
        }
        _ => now,
    }
}

/// GCRA / leaky bucket: the (TAT, credit) of a TAT moved to `to` at `now`. A time before now is
/// kept as credit, relative to now, so idle time adds nothing to it.
pub(crate) fn tat_parts(to: Micros, now: Micros) -> (Micros, Micros) {
    if to >= now {
        (to, 0)
    } else {
        (now, now - to)
    }
}

/// GCRA / leaky bucket: the (TAT, credit) with `units` given back — the TAT moved back by
/// `units × T` (not before now) while it is ahead of now, else the credit (unchanged when
/// there is neither).
fn tat_given_back(
    p: &Policy,
    (tat, credit): (Micros, Micros),
    now: Micros,
    units: u64,
    most: u64,
) -> (Micros, Micros) {
    if tat > now {
        let back = tat.saturating_sub(units.saturating_mul(p.interval()));
        (back.max(now), credit)
    } else if credit > 0 {
        (tat, credit_back(p, credit, units, most))
    } else {
        (tat, credit)
    }
}

/// GCRA / leaky bucket: when a (TAT, credit) state may be forgotten — a period after the TAT
/// while it holds a credit, else at the TAT.
fn tat_expiry(p: &Policy, (tat, credit): (Micros, Micros)) -> Micros {
    if credit > 0 {
        tat.saturating_add(p.period)
    } else {
        tat
    }
}

/// GCRA / leaky bucket: a credit with `units` given back, at most `most` units' worth.
fn credit_back(p: &Policy, credit: Micros, units: u64, most: u64) -> Micros {
    let t = p.interval();
    credit
        .saturating_add(units.saturating_mul(t))
        .min(most.saturating_mul(t))
}

/// GCRA / leaky bucket: the (TAT, credit) after a grant of `units`: the TAT moves back by
/// `units × T`, at most `most` units before now.
fn granted_tat(
    p: &Policy,
    state: Option<&State>,
    now: Micros,
    units: u64,
    most: u64,
) -> (Micros, Micros) {
    let t = p.interval();
    let floor = now.saturating_sub(most.saturating_mul(t));
    let to = tat_base(p, state, now)
        .saturating_sub(units.saturating_mul(t))
        .max(floor);
    tat_parts(to, now)
}

/// What the limit would decide for a request at `now`; changes nothing ([`Algo::decide`]).
pub fn evaluate(p: &Policy, state: Option<&State>, now: Micros) -> Decision {
    dispatch!(p.algorithm, A => A::decide(p, state, now))
}

/// Charges an admitted request's cost: the state after it ([`Algo::charge`]). Call only after
/// [`evaluate`] admitted.
pub fn admit(p: &Policy, state: Option<State>, now: Micros) -> State {
    dispatch!(p.algorithm, A => A::charge(p, state, now))
}

/// A denial `elapsed` µs later, exactly as [`evaluate`] would decide then, for the algorithms
/// whose state a denial pins down: a denied limit changes only with time (nothing is charged to
/// it while it denies), and for fixed windows, GCRA and the leaky bucket its decision says all
/// there is to know of its state. `None` when the limit would no longer deny, or when the
/// algorithm's state cannot be known from its decision (token bucket, sliding window and log:
/// ask the store).
pub fn age_denial(p: &Policy, d: &Decision, elapsed: Micros) -> Option<Decision> {
    if d.allowed || elapsed >= d.reset_after {
        return None;
    }
    let r = d.reset_after - elapsed;
    dispatch!(p.algorithm, A => A::age_denial(p, d, elapsed, r))
}

/// [`usage`] of a state that would deny the next request.
pub const USAGE_FULL: u64 = 1_000_000;

/// How much of the limit `state` uses at `now`, in millionths of its quota: 0 when it decides
/// exactly as no state would (a fresh or expired entry), [`USAGE_FULL`] when it would deny the
/// next request. What the in-process store evicts by: losing a low-usage entry grants little.
pub fn usage(p: &Policy, state: &State, now: Micros) -> u64 {
    // Slots in use are counts no store may forget (their releases would find nothing).
    if matches!(state, State::Concurrency { in_flight } if *in_flight > 0) {
        return USAGE_FULL;
    }
    let d = evaluate(p, Some(state), now);
    if !d.allowed {
        return USAGE_FULL;
    }
    let fresh = evaluate(p, None, now);
    // Granted credit: losing it would take units support gave; kept as long as any entry with
    // room to spare can go instead.
    if d.remaining > fresh.remaining {
        return USAGE_FULL - 1;
    }
    let used = u128::from(fresh.remaining.saturating_sub(d.remaining));
    let quota = u128::from(p.quota().max(1));
    let ppm = used * u128::from(USAGE_FULL) / quota;
    u64::try_from(ppm).map_or(USAGE_FULL - 1, |u| u.min(USAGE_FULL - 1))
}

/// When `state` is no longer needed: from then on it decides exactly as no state would
/// ([`Algo::expiry`]).
pub fn expires_at(p: &Policy, state: &State) -> Micros {
    dispatch!(p.algorithm, A => A::expiry(p, state))
}

/// The units the limit could admit at once at `now` ([`Algo::avail`]).
pub fn avail(p: &Policy, state: Option<&State>, now: Micros) -> u64 {
    dispatch!(p.algorithm, A => A::avail(p, state, now))
}

/// [`Algo::force`] of `p`'s algorithm.
pub(crate) fn force(p: &Policy, state: Option<State>, now: Micros, units: u64) -> State {
    dispatch!(p.algorithm, A => A::force(p, state, now, units))
}

/// [`Algo::give_back`] of `p`'s algorithm, within [`credit_max`].
pub(crate) fn give_back(
    p: &Policy,
    state: State,
    charged_at: Micros,
    now: Micros,
    units: u64,
) -> Option<State> {
    let most = credit_max(p);
    dispatch!(p.algorithm, A => A::give_back(p, state, charged_at, now, units, most))
}

/// [`Algo::grant`] of `p`'s algorithm, within [`credit_max`].
pub(crate) fn grant(p: &Policy, state: Option<State>, now: Micros, units: u64) -> Option<State> {
    let most = credit_max(p);
    dispatch!(p.algorithm, A => A::grant(p, state, now, units, most))
}

/// The most credit, in units, a subject can hold beyond a fresh limit: the quota, and less
/// where (max(L, B) + credit) × P would reach 2^53 (× 1 for a fixed window, whose numbers are
/// counts) — the bound under which the Lua scripts' doubles compute exactly what Rust does. At
/// least 1 for every valid limit (the config keeps (max(L, B) + C) × P below 2^53).
pub fn credit_max(p: &Policy) -> u64 {
    const EXACT: u64 = (1 << 53) - 1;
    let (scale, top) = match p.algorithm {
        Algorithm::FixedWindow => (1, p.limit),
        _ => (p.period.max(1), p.limit.max(p.burst)),
    };
    (EXACT / scale).saturating_sub(top).min(p.quota())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    const MS: u64 = 1_000;

    fn policy(algorithm: Algorithm, limit: u64, period: u64, burst: u64, cost: u64) -> Policy {
        Policy {
            algorithm,
            limit,
            period,
            burst,
            cost,
            calendar: None,
        }
    }

    #[test]
    fn an_aged_denial_is_what_evaluate_says_then() {
        for p in [
            policy(Algorithm::Gcra, 60, 60 * S, 10, 3),
            policy(Algorithm::Gcra, 7, 3 * S, 4, 1),
            policy(Algorithm::LeakyBucket, 5, S, 3, 1),
            policy(Algorithm::FixedWindow, 4, 10 * S, 0, 2),
        ] {
            let mut run = Run::new(p);
            let t0 = 1_000 * S + 123;
            let mut d = run.at(t0);
            while d.allowed {
                d = run.at(t0);
            }
            let mut checked = 0;
            let step = usize::try_from(d.retry_after / 25).unwrap().max(1);
            for e in (0..2 * d.reset_after).step_by(step) {
                let truth = evaluate(&p, run.state.as_ref(), t0 + e);
                match age_denial(&p, &d, e) {
                    Some(aged) => {
                        assert_eq!(aged, truth, "{p:?} after {e}");
                        checked += 1;
                    }
                    None => assert!(
                        truth.allowed || e == 0 || d.retry_after <= e,
                        "{p:?}: no answer at {e} though still denied"
                    ),
                }
            }
            assert!(checked > 10, "{p:?}");
        }
        let tb = policy(Algorithm::TokenBucket, 5, S, 5, 1);
        let denied = Decision {
            allowed: false,
            reset_after: S,
            retry_after: 1,
            ..Decision::default()
        };
        assert_eq!(
            age_denial(&tb, &denied, 0),
            None,
            "not known without the state"
        );
    }

    /// Drives one limit through requests at the given times; returns each decision.
    struct Run {
        p: Policy,
        state: Option<State>,
    }

    impl Run {
        fn new(p: Policy) -> Run {
            Run { p, state: None }
        }
        fn at(&mut self, now: u64) -> Decision {
            let d = evaluate(&self.p, self.state.as_ref(), now);
            if d.allowed {
                self.state = Some(admit(&self.p, self.state.take(), now));
            }
            d
        }
        fn allowed_at(&mut self, now: u64, n: usize) -> usize {
            (0..n).filter(|_| self.at(now).allowed).count()
        }
    }

    /// `capacity` (the run rule) admits exactly as many as deciding one request after another.
    #[test]
    fn capacity_is_one_request_after_another() {
        fn check<A: Algo>(p: &Policy) {
            assert_eq!(A::ALGORITHM, p.algorithm);
            let mut run = Run::new(*p);
            let t0 = 77 * S + 123;
            for (step, k) in [3u64, 10, 1, 7].into_iter().enumerate() {
                let now = t0 + step as u64 * 90 * MS;
                let state = run.state.clone();
                let expected = (0..k).filter(|_| run.at(now).allowed).count() as u64;
                assert_eq!(
                    A::capacity(p, state.as_ref(), now, k),
                    expected,
                    "{p:?} {step}"
                );
            }
        }
        check::<FixedWindow>(&policy(Algorithm::FixedWindow, 5, S, 0, 1));
        check::<SlidingWindow>(&policy(Algorithm::SlidingWindow, 5, S, 0, 2));
        check::<SlidingLog>(&policy(Algorithm::SlidingLog, 5, S, 0, 1));
        check::<TokenBucket>(&policy(Algorithm::TokenBucket, 5, S, 4, 1));
        check::<Gcra>(&policy(Algorithm::Gcra, 5, S, 4, 1));
        check::<LeakyBucket>(&policy(Algorithm::LeakyBucket, 5, S, 3, 1));
        check::<Concurrency>(&policy(Algorithm::Concurrency, 4, S, 0, 1));
    }

    /// What each algorithm can do, as the config and the admin API have always said.
    #[test]
    fn what_each_algorithm_can_do() {
        let leases: Vec<_> = ALL.iter().filter(|a| a.leases()).collect();
        assert_eq!(
            leases,
            [
                &Algorithm::FixedWindow,
                &Algorithm::TokenBucket,
                &Algorithm::Gcra
            ]
        );
        let no_grant: Vec<_> = ALL.iter().filter(|a| !a.grants()).collect();
        assert_eq!(no_grant, [&Algorithm::SlidingLog, &Algorithm::Concurrency]);
        let not_after: Vec<_> = ALL.iter().filter(|a| !a.charges_after()).collect();
        assert_eq!(
            not_after,
            [&Algorithm::LeakyBucket, &Algorithm::Concurrency]
        );
    }

    const ALL: [Algorithm; 7] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::Concurrency,
    ];

    #[test]
    fn fixed_window_counts_per_aligned_window() {
        let mut r = Run::new(policy(Algorithm::FixedWindow, 5, S, 0, 1));
        let t0 = 1_700_000_000 * S + 300 * MS;
        let rem: Vec<u64> = (0..5).map(|_| r.at(t0).remaining).collect();
        assert_eq!(rem, vec![4, 3, 2, 1, 0]);
        let d = r.at(t0);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, 700 * MS);
        assert_eq!(d.reset_after, 700 * MS);
        // Last microsecond of the window: still closed. First of the next: open.
        assert!(!r.at(t0 + 700 * MS - 1).allowed);
        assert!(r.at(t0 + 700 * MS).allowed);
    }

    #[test]
    fn fixed_window_sub_second_period() {
        let mut r = Run::new(policy(Algorithm::FixedWindow, 2, 100 * MS, 0, 1));
        let t0 = 50 * S;
        assert_eq!(r.allowed_at(t0, 5), 2);
        assert_eq!(r.allowed_at(t0 + 99 * MS, 5), 0);
        assert_eq!(r.allowed_at(t0 + 100 * MS, 5), 2);
        assert_eq!(r.allowed_at(t0 + 250 * MS, 5), 2);
    }

    #[test]
    fn denied_requests_change_nothing() {
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
        ] {
            let burst = match alg {
                Algorithm::TokenBucket | Algorithm::Gcra => 3,
                Algorithm::LeakyBucket => 2,
                _ => 0,
            };
            let mut r = Run::new(policy(alg, 3, S, burst, 1));
            let t0 = 10 * S;
            while r.at(t0).allowed {}
            let before = r.state.clone();
            let first = r.at(t0 + 1);
            for k in 0..100 {
                let d = r.at(t0 + 1 + k);
                assert!(!d.allowed, "{alg:?}");
            }
            assert_eq!(r.state, before, "{alg:?}: a denied request changed state");
            // The retry time did not move either: retrying exactly then succeeds.
            let again = t0 + 1 + first.retry_after;
            assert!(r.at(again).allowed, "{alg:?}: not admitted at retry_after");
        }
    }

    #[test]
    fn retry_after_is_exact() {
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ] {
            for cost in [1, 2] {
                let burst = if matches!(alg, Algorithm::TokenBucket | Algorithm::Gcra) {
                    4
                } else {
                    0
                };
                let mut r = Run::new(policy(alg, 4, 400 * MS, burst, cost));
                let mut now = 77 * S + 123 * MS;
                for _ in 0..30 {
                    let d = r.at(now);
                    if !d.allowed {
                        assert!(d.retry_after > 0, "{alg:?}");
                        let probe = evaluate(&r.p, r.state.as_ref(), now + d.retry_after - 1);
                        assert!(
                            !probe.allowed,
                            "{alg:?} cost {cost}: admitted before retry_after"
                        );
                        now += d.retry_after;
                        assert!(
                            r.at(now).allowed,
                            "{alg:?} cost {cost}: not admitted at retry_after"
                        );
                    }
                    now += 37 * MS;
                }
            }
        }
    }

    #[test]
    fn cost_is_charged() {
        let mut r = Run::new(policy(Algorithm::FixedWindow, 10, S, 0, 3));
        let rem: Vec<u64> = (0..4).map(|_| r.at(5 * S).remaining).collect();
        assert_eq!(rem, vec![7, 4, 1, 1]);
        let mut r = Run::new(policy(Algorithm::TokenBucket, 10, S, 10, 4));
        assert_eq!(r.allowed_at(5 * S, 5), 2);
        // 0.2s refills 2 tokens: 2 + 2 = 4 → one more.
        assert_eq!(r.allowed_at(5 * S + 200 * MS, 5), 1);
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let mut r = Run::new(policy(Algorithm::SlidingWindow, 10, S, 0, 1));
        assert_eq!(r.allowed_at(100 * S + 500 * MS, 20), 10);
        // 25% into the next window: estimate = 10·0.75 = 7.5 → 2 more (7.5 + 2 = 9.5, +3 = 10.5).
        assert_eq!(r.allowed_at(101 * S + 250 * MS, 20), 2);
        // 2 windows later everything has slid out.
        assert_eq!(r.allowed_at(103 * S, 20), 10);
    }

    #[test]
    fn sliding_log_is_exact_and_bounded() {
        let mut r = Run::new(policy(Algorithm::SlidingLog, 3, S, 0, 1));
        assert!(r.at(10 * S).allowed);
        assert!(r.at(10 * S + 400 * MS).allowed);
        assert!(r.at(10 * S + 800 * MS).allowed);
        let d = r.at(10 * S + 900 * MS);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, 100 * MS);
        // (now − P, now]: the entry at exactly now − P has left.
        assert!(r.at(11 * S).allowed);
        assert!(!r.at(11 * S).allowed);
        for k in 0..1000 {
            r.at(12 * S + k * 10 * MS);
            if let Some(State::SlidingLog { entries }) = &r.state {
                assert!(entries.len() <= 3);
            }
        }
    }

    #[test]
    fn token_bucket_refills_continuously() {
        let mut r = Run::new(policy(Algorithm::TokenBucket, 10, S, 5, 1));
        assert_eq!(r.allowed_at(S, 10), 5);
        let d = r.at(S);
        assert_eq!(d.retry_after, 100 * MS);
        assert_eq!(r.allowed_at(S + 100 * MS, 10), 1);
        assert_eq!(r.allowed_at(S + 400 * MS, 10), 3);
        assert_eq!(r.allowed_at(100 * S, 10), 5, "capped at burst");
    }

    #[test]
    fn gcra_matches_redis_cell_fields() {
        // 10 per second, burst 5: T = 100ms, tolerance 500ms.
        let mut r = Run::new(policy(Algorithm::Gcra, 10, S, 5, 1));
        let t0 = 1000 * S;
        let d = r.at(t0);
        assert_eq!(
            (
                d.allowed,
                d.limit,
                d.remaining,
                d.retry_after,
                d.reset_after
            ),
            (true, 5, 4, 0, 100 * MS)
        );
        assert_eq!(r.allowed_at(t0, 10), 4);
        let d = r.at(t0);
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after, d.reset_after),
            (false, 0, 100 * MS, 500 * MS)
        );
        assert!(r.at(t0 + 100 * MS).allowed);
        assert!(!r.at(t0 + 100 * MS).allowed);
    }

    #[test]
    fn leaky_bucket_queues_then_rejects() {
        // The example: L=5/s, B=3, 6 simultaneous requests.
        let mut r = Run::new(policy(Algorithm::LeakyBucket, 5, S, 3, 1));
        let t0 = 42 * S;
        let got: Vec<(bool, u64)> = (0..6)
            .map(|_| r.at(t0))
            .map(|d| (d.allowed, d.delay))
            .collect();
        assert_eq!(
            got,
            vec![
                (true, 0),
                (true, 200 * MS),
                (true, 400 * MS),
                (true, 600 * MS),
                (false, 0),
                (false, 0)
            ]
        );
        // Once the queue has drained one slot, a request is admitted with the queue's delay.
        let d = r.at(t0 + 200 * MS);
        assert_eq!((d.allowed, d.delay), (true, 600 * MS));
    }

    #[test]
    fn expiry_means_equivalent_to_empty() {
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
        ] {
            let p = policy(
                alg,
                3,
                250 * MS,
                if alg == Algorithm::LeakyBucket {
                    1
                } else if matches!(alg, Algorithm::TokenBucket | Algorithm::Gcra) {
                    3
                } else {
                    0
                },
                1,
            );
            let mut r = Run::new(p);
            let t0 = 9 * S + 10 * MS;
            r.allowed_at(t0, 2);
            let state = r.state.clone().unwrap();
            let exp = expires_at(&p, &state);
            assert!(exp > t0, "{alg:?}");
            assert_eq!(
                evaluate(&p, Some(&state), exp),
                evaluate(&p, None, exp),
                "{alg:?}"
            );
        }
    }
}
