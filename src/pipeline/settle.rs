//! The settle phase: what a request owes its limits once the upstream has answered: the post-response charges of
//! `count_status` / `cost_header` limits, and the concurrency slots it holds.
//!
//! - **Charges** ([`charge_after`]): computed from the upstream's response head (status, cost
//!   header), then applied by `Store::settle` in a task of their own on the worker's runtime; the
//!   response head waits for that task (one store round trip, bounded by `[store] timeout`; in
//!   process no wait at all), so a client that asks again at once is judged on its charged
//!   budget. A client that goes away meanwhile does not cancel the charge (the task is not the
//!   request's), and a store error is logged and never fails the response.
//! - **Abandoned exchanges** ([`Abandoned`]): a guard armed when the request is sent upstream
//!   and disarmed when the upstream's head (or its failure) is known. A client that leaves in
//!   between drops the request's future and with it the guard, whose `Drop` charges each limit
//!   its `cost`, as for a response without a cost header: the upstream may have done the work,
//!   so leaving early never makes it free.
//! - **Slots** ([`Leases`]): a guard taken when the request is admitted, held by the response
//!   body (or the WebSocket tunnel) and released by its `Drop` — on every path: body sent,
//!   client gone, upstream error or timeout, tunnel closed, drain. `Drop` cannot wait, so the
//!   release is spawned on the current runtime (in process it is immediate). A release the
//!   store refuses (Redis down or partitioned) is retried in the background once the store is
//!   up again (at most [`MAX_RETRYING`] at once per worker, each until its `period` has passed: by then the
//!   Redis lease has freed itself), and `tollgate_ratelimit_in_flight` counts a slot until its
//!   release has succeeded. A release that cannot run at all (no runtime left at exit) is lost:
//!   the lease then frees itself after the limit's `period`.
//!
//! Each worker counts its settle tasks and retried releases in its own [`WorkerCtx`], handed
//! down to what spawns them; a draining worker waits for its own ([`WorkerCtx::settled`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use http::{HeaderMap, StatusCode};
use smallvec::SmallVec;

use crate::limiter::charge::{clamp, parse_cost};
use crate::limiter::{Check, CompiledLimit, Decision, Op, SubjectDigest};
use tollgate_limit::log_throttle::Throttles;
use tollgate_limit::store::{AnyStore, Store};
use tollgate_limit::worker::WorkerId;

/// One thing owed to one limit: the limit, the subject, and the charge or release.
pub type Owed = (Arc<CompiledLimit>, SubjectDigest, Op);

type OwedList = SmallVec<[Owed; 2]>;

/// A lease id unique to this request among every gateway sharing the store: a per-process
/// random start (the standard library's random hash keys) plus a counter; never 0 (0 means "no
/// lease" to the script).
pub fn new_lease() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        AtomicU64::new(h.finish())
    });
    loop {
        let id = next.fetch_add(1, Ordering::Relaxed);
        if id != 0 {
            return id;
        }
    }
}

/// The store's view of what is owed.
fn checks_of(owed: &[Owed]) -> SmallVec<[Check<'_>; 2]> {
    owed.iter()
        .map(|(l, s, op)| Check {
            limit: l,
            subject: *s,
            op: *op,
        })
        .collect()
}

/// What a settle is for: what its success counts, and whether a failure is retried.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// Post-response charges (`decision="charged_after"` on success; a failure is logged).
    Charge,
    /// Concurrency releases (`tollgate_ratelimit_in_flight` goes down on success; a failure is
    /// retried, see the module comment).
    Release,
}

impl Settle {
    fn done(self, owed: &[Owed]) {
        for (l, _, _) in owed {
            match self {
                Settle::Charge => l.response_metrics.charged_after().increment(1),
                Settle::Release => l.response_metrics.in_flight().decrement(1.0),
            }
        }
    }
}

/// Applies `owed` through the store, off the request: in process at once (no runtime needed),
/// else in a task on the current runtime. Returns the task, if one was spawned; it ends after
/// the first attempt (a release's retries go on in a task of their own).
pub(super) fn settle_detached(
    store: &Arc<AnyStore>,
    ctx: &WorkerCtx,
    owed: OwedList,
    what: Settle,
) -> Option<tokio::task::JoinHandle<()>> {
    if owed.is_empty() {
        return None;
    }
    if let AnyStore::Memory(m) = &**store {
        let checks = checks_of(&owed);
        m.settle_now(&checks, m.now());
        what.done(&owed);
        return None;
    }
    let store2 = store.clone();
    let ctx = ctx.clone();
    let pending = ctx.pending();
    let task = async move {
        let _pending = pending;
        let result = store2.settle(&checks_of(&owed), ctx.worker()).await;
        match result {
            Ok(()) => what.done(&owed),
            Err(e) => {
                static FAILED: Throttles<1> = Throttles::new();
                if let Some(suppressed) = FAILED.allow(0) {
                    let route = owed.first().map(|(l, _, _)| l.route.clone());
                    let charge = what == Settle::Charge;
                    tracing::warn!(route = route.as_deref(), error = %e, charge, suppressed, "cannot settle a request's limits after its response");
                }
                if what == Settle::Release {
                    retry_release(store2, &ctx, owed);
                }
            }
        }
    };
    // No runtime (a guard dropped as the process exits): lost; the Redis lease expires.
    tokio::runtime::Handle::try_current()
        .ok()
        .map(|rt| rt.spawn(task))
}

/// The most failed releases one worker retries at once; past it a failed release is given up
/// at once (its lease frees itself after `period`).
pub const MAX_RETRYING: usize = 100_000;

/// A proxy worker as the pipeline sees it, handed down explicitly: who it is (the store keeps
/// per-worker parts) and its settle tasks and retried releases (cloned into each: one
/// reference count).
#[derive(Clone, Default)]
pub struct WorkerCtx(Arc<Counts>);

#[derive(Default)]
struct Counts {
    worker: WorkerId,
    /// Settle tasks not finished yet.
    pending: AtomicUsize,
    /// Failed releases being retried now.
    retrying: AtomicUsize,
    /// The places of the compressed responses this worker streams now.
    encoders: crate::compression::Slots,
}

impl WorkerCtx {
    /// Worker `worker`'s context (`WorkerId::NONE` off the workers).
    pub fn new(worker: WorkerId) -> WorkerCtx {
        WorkerCtx(Arc::new(Counts {
            worker,
            ..Counts::default()
        }))
    }

    /// Which worker this is.
    pub fn worker(&self) -> WorkerId {
        self.0.worker
    }

    /// This worker's encoder places (see [`crate::compression::Slots`]).
    pub fn encoders(&self) -> &crate::compression::Slots {
        &self.0.encoders
    }

    fn pending(&self) -> Pending {
        self.0.pending.fetch_add(1, Ordering::AcqRel);
        Pending(self.clone())
    }

    /// Waits (at most `max`) until none of this worker's settle tasks is left: a draining
    /// worker runs this before its runtime ends, so the releases and charges of its last
    /// requests are not lost. Retried releases are not waited for: a drain does not wait for
    /// an outage to end.
    pub async fn settled(&self, max: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + max;
        while self.0.pending.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
}

/// Retries a failed release in a task of its own: waits (backing off to a second) until the
/// store is up, then settles again, until it succeeds or the longest `period` of its limits
/// has passed. Not counted as pending: a drain does not wait for an outage to end.
fn retry_release(store: Arc<AnyStore>, ctx: &WorkerCtx, owed: OwedList) {
    let retrying = &ctx.0.retrying;
    let give_up = |owed: &OwedList| {
        // Expired (or never retried): the lease frees itself, so the slot is no longer held.
        Settle::Release.done(owed);
    };
    if retrying.fetch_add(1, Ordering::AcqRel) >= MAX_RETRYING {
        retrying.fetch_sub(1, Ordering::AcqRel);
        give_up(&owed);
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        retrying.fetch_sub(1, Ordering::AcqRel);
        give_up(&owed);
        return;
    };
    let period = owed
        .iter()
        .map(|(l, _, _)| l.policy.period)
        .max()
        .unwrap_or_default();
    let ctx = ctx.clone();
    rt.spawn(async move {
        // Micros; bounded by the config (a day at most), checked anyway.
        let deadline = tokio::time::Instant::now()
            .checked_add(std::time::Duration::from_micros(period))
            .unwrap_or_else(tokio::time::Instant::now);
        let mut wait = std::time::Duration::from_millis(50);
        let released = loop {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_secs(1));
            if tokio::time::Instant::now() >= deadline {
                break false;
            }
            if store.is_up() && store.settle(&checks_of(&owed), ctx.worker()).await.is_ok() {
                break true;
            }
        };
        ctx.0.retrying.fetch_sub(1, Ordering::AcqRel);
        if released {
            tracing::info!("a concurrency release that failed was retried and made");
            Settle::Release.done(&owed);
        } else {
            give_up(&owed);
        }
    });
}

/// One settle task, counted as pending until it ends or is dropped.
struct Pending(WorkerCtx);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0 .0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The limits charged after the response, with their checks: every limit with `after` but a
/// shadow limit that would have denied (as on admission, it is not charged).
fn charged_after<'a, 'c>(
    limits: &'a [&'a Arc<CompiledLimit>],
    checks: &'a [Check<'c>],
    decisions: Option<&'a [Decision]>,
) -> impl Iterator<Item = (&'a Arc<CompiledLimit>, &'a Check<'c>)> + 'a {
    limits
        .iter()
        .zip(checks)
        .enumerate()
        .filter(|(_, (l, _))| l.after.is_some())
        .filter(move |(i, _)| decisions.and_then(|d| d.get(*i)).is_none_or(|d| d.allowed))
        .map(|(_, (l, c))| (*l, c))
}

/// What a request sent upstream owes if it is abandoned before the upstream's head: each limit
/// charged after the response, its `cost`. Charged when dropped armed (see the module comment).
pub struct Abandoned {
    store: Arc<AnyStore>,
    ctx: WorkerCtx,
    owed: OwedList,
}

impl Abandoned {
    /// Armed for `limits` (the route's and plan's, with their checks and decisions); `None`
    /// when none of them is charged after the response.
    pub fn arm(
        store: &Arc<AnyStore>,
        ctx: &WorkerCtx,
        limits: &[&Arc<CompiledLimit>],
        checks: &[Check<'_>],
        decisions: Option<&[Decision]>,
    ) -> Option<Abandoned> {
        let owed: OwedList = charged_after(limits, checks, decisions)
            // A reservation stands as the charge of an exchange without an answer; a byte
            // limit owes what was sent, and nothing reached the client before the head.
            .filter(|(l, c)| {
                l.policy.cost > 0
                    && c.reserved().is_none()
                    && l.after.as_ref().is_none_or(|a| a.bytes.is_none())
            })
            .map(|(l, c)| {
                let units = clamp(&l.policy, None).unwrap_or_else(|_| l.policy.quota());
                (Arc::clone(l), c.subject, Op::Charge(units))
            })
            .collect();
        (!owed.is_empty()).then(|| Abandoned {
            store: store.clone(),
            ctx: ctx.clone(),
            owed,
        })
    }

    /// The upstream answered (or failed, which is never charged): nothing owed for leaving.
    pub fn disarm(mut self) {
        self.owed.clear();
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.owed.is_empty() {
            return;
        }
        // Counted as `charged_after` once applied, like any post-response charge. Not awaited:
        // the request is gone; the task (or the in-process settle) outlives it.
        settle_detached(
            &self.store,
            &self.ctx,
            std::mem::take(&mut self.owed),
            Settle::Charge,
        );
    }
}

/// One limit charged when the body ends (by `body_charge`): the limit, its subject, the units
/// owed when the body does not say, and the units the request reserved (settled to the cost).
pub type Deferred = (Arc<CompiledLimit>, SubjectDigest, u64, Option<u64>);

/// The post-response charges a forwarded request owes, from the upstream's response head;
/// strips the cost headers that ask for it. `decisions` is `None` when the store failed open.
/// Limits with `cost_from` are owed when the body ends: returned apart, with the units owed
/// when the body does not say.
pub fn owed_after(
    limits: &[&Arc<CompiledLimit>],
    checks: &[Check<'_>],
    decisions: Option<&[Decision]>,
    status: StatusCode,
    headers: &mut HeaderMap,
) -> (SmallVec<[Owed; 2]>, SmallVec<[Deferred; 2]>) {
    let mut owed = SmallVec::new();
    let mut deferred = SmallVec::new();
    let strip: SmallVec<[&http::HeaderName; 1]> = limits
        .iter()
        .filter_map(|l| l.after.as_ref())
        .filter(|a| a.strip_cost_header)
        .filter_map(|a| a.cost_header.as_ref())
        .collect();
    for (l, c) in charged_after(limits, checks, decisions) {
        let Some(after) = &l.after else { continue };
        if after
            .statuses
            .is_some_and(|set| !set.contains(status.as_u16()))
        {
            // Not a response this limit counts: nothing owed, and a reservation goes back.
            if let Some(op) = c.reserved().and_then(|r| settle_reserved(r, 0)) {
                owed.push((Arc::clone(l), c.subject, op));
            }
            continue;
        }
        let reported = after.cost_header.as_ref().and_then(|name| {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) => parse_cost(v.as_bytes()),
                _ => None, // missing, or several: the upstream did not say one number
            }
        });
        let units = match clamp(&l.policy, reported) {
            Ok(u) => u,
            Err(asked) => {
                static CLAMPED: Throttles<1> = Throttles::new();
                if let Some(suppressed) = CLAMPED.allow(0) {
                    tracing::warn!(
                        route = &*l.route,
                        limit = &*l.name,
                        reported = asked,
                        charged = l.policy.quota(),
                        suppressed,
                        "cost header above the limit's capacity; clamped"
                    );
                }
                l.policy.quota()
            }
        };
        if !after.cost_from.is_empty() || after.bytes.is_some() {
            deferred.push((Arc::clone(l), c.subject, units, c.reserved()));
        } else if let Some(r) = c.reserved() {
            if let Some(op) = settle_reserved(r, units) {
                owed.push((Arc::clone(l), c.subject, op));
            }
        } else if units > 0 {
            owed.push((Arc::clone(l), c.subject, Op::Charge(units)));
        }
    }
    for name in strip {
        headers.remove(name);
    }
    (owed, deferred)
}

/// What settles a reservation of `reserved` units to a real cost of `real`: the difference
/// charged (clamped to a spent limit, like any charge) or given back; `None` when they match.
pub fn settle_reserved(reserved: u64, real: u64) -> Option<Op> {
    match real.cmp(&reserved) {
        std::cmp::Ordering::Greater => Some(Op::Charge(real - reserved)),
        std::cmp::Ordering::Less => Some(Op::Return(reserved - real)),
        std::cmp::Ordering::Equal => None,
    }
}

/// Applies the post-response charges: in process at once, else the charge task, for the
/// response to wait for (see the module comment; dropping that wait, a client gone, leaves
/// the task running).
pub fn charge_after(
    store: &Arc<AnyStore>,
    ctx: &WorkerCtx,
    owed: SmallVec<[Owed; 2]>,
) -> Option<tokio::task::JoinHandle<()>> {
    settle_detached(store, ctx, owed, Settle::Charge)
}

/// The concurrency slots a request holds; released by [`Leases::release`] or when dropped.
///
/// Boxed: only a request under a concurrency limit holds slots, and an `Option<Leases>` is
/// moved with every request's limits and response (one pointer instead of 136 bytes).
pub struct Leases(Box<Held>);

struct Held {
    store: Arc<AnyStore>,
    ctx: WorkerCtx,
    held: OwedList,
    /// The release under way (a task: dropping this does not cancel it).
    releasing: Option<tokio::task::JoinHandle<()>>,
}

impl Leases {
    /// The slots taken by an admitted request: its concurrency checks (under `Op::Acquire`) that
    /// admitted it.
    pub fn taken(
        store: &Arc<AnyStore>,
        ctx: &WorkerCtx,
        limits: &[&Arc<CompiledLimit>],
        checks: &[Check<'_>],
        decisions: &[Decision],
    ) -> Option<Leases> {
        Leases::of(store, ctx, limits, checks, |i| {
            decisions.get(i).is_some_and(|d| d.allowed)
        })
    }

    /// The slots a request may hold after a store call that failed: every concurrency check
    /// of the call (under `Op::Acquire`), since the store may have taken them before its
    /// answer was lost. Counted in `tollgate_ratelimit_in_flight` until released, like any.
    pub fn unknown(
        store: &Arc<AnyStore>,
        ctx: &WorkerCtx,
        limits: &[&Arc<CompiledLimit>],
        checks: &[Check<'_>],
    ) -> Option<Leases> {
        Leases::of(store, ctx, limits, checks, |_| true)
    }

    /// The slots of the concurrency checks (under `Op::Acquire`) whose index `held` keeps,
    /// counted in `tollgate_ratelimit_in_flight` from now until released.
    fn of(
        store: &Arc<AnyStore>,
        ctx: &WorkerCtx,
        limits: &[&Arc<CompiledLimit>],
        checks: &[Check<'_>],
        held: impl Fn(usize) -> bool,
    ) -> Option<Leases> {
        let held: OwedList = limits
            .iter()
            .zip(checks)
            .enumerate()
            .filter_map(|(i, (l, c))| match c.op {
                Op::Acquire(lease) if held(i) => {
                    l.response_metrics.in_flight().increment(1.0);
                    Some((Arc::clone(l), c.subject, Op::Release(lease)))
                }
                _ => None,
            })
            .collect();
        (!held.is_empty()).then(|| {
            Leases(Box::new(Held {
                store: store.clone(),
                ctx: ctx.clone(),
                held,
                releasing: None,
            }))
        })
    }

    /// The slots of both (taken in two phases of one request), held and released together.
    pub fn merge(a: Option<Leases>, b: Option<Leases>) -> Option<Leases> {
        match (a, b) {
            (Some(mut a), Some(mut b)) => {
                a.0.held.extend(std::mem::take(&mut b.0.held));
                Some(a)
            }
            (a, b) => a.or(b),
        }
    }

    /// Starts releasing the slots now (the body's end is near); see [`Leases::poll_released`].
    /// `tollgate_ratelimit_in_flight` goes down once the store has released them.
    pub fn release(&mut self) {
        let held = std::mem::take(&mut self.0.held);
        self.0.releasing = settle_detached(&self.0.store, &self.0.ctx, held, Settle::Release);
    }

    /// Ready once the release started by [`Leases::release`] is done (or failed: logged, and
    /// retried in the background).
    pub fn poll_released(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        match self.0.releasing.as_mut() {
            None => std::task::Poll::Ready(()),
            Some(task) => {
                let _ = std::task::ready!(std::future::Future::poll(std::pin::Pin::new(task), cx));
                self.0.releasing = None;
                std::task::Poll::Ready(())
            }
        }
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        if self.0.held.is_empty() {
            return; // released already (or under way: its task goes on)
        }
        // Not awaited: `Drop` cannot wait; the task outlives the request.
        self.release();
    }
}
