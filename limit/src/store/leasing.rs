//! Leases (`sync = "lease"`): the layer that spends a shared limit's units locally.
//!
//! A lease is units of one (limit, subject) charged in the store in one atomic step
//! ([`Op::Lease`]) and then spent by this worker's requests without a round trip. The fleet can
//! never admit more than the limit: every unit spent was charged first.
//!
//! - **Per worker**: each proxy worker has its own book of leases (no lock another worker
//!   takes), so at most `workers × lease_max` units of a (limit, subject) sit unspent in a
//!   gateway.
//! - **Size**: a lease asks for the request's cost while its subject is cold, and doubles (up to
//!   `lease_max`) each time the subject asks again within `lease_ttl` of its previous lease. The
//!   units a worker holds plus those it is asking for never exceed `lease_max` (beyond what each
//!   asking request needs itself).
//! - **Validity**: a lease is spent, and given back, only while the state it was charged into
//!   still holds it — before the grant's `reset_after` (the window's end, a full bucket, the
//!   GCRA TAT), less the store's `timeout` (so a return lands before then): spending a unit
//!   later would admit it on top of a fresh budget. Unused units go back ([`Op::Return`]) at
//!   the latest `lease_ttl` after the lease's last use; units no longer valid expire.
//! - **All-or-nothing**: a request's lease limits served locally are taken first; the rest of
//!   its limits (exact ones, leases to renew) go to the store in one call; when the store
//!   refuses, the local units go back into the lease (also when the request is dropped). A lease
//!   denied by the store while a concurrent grant filled the book is served from the book.
//! - A store *error* keeps the local units spent (as the local tier does: with `on_error =
//!   "allow"` the request goes on, and the leases keep admitting through an outage until they
//!   run out or expire).
//! - **Time**: a lease's ages (`lease_ttl`, its validity) are kept on the store's clock
//!   ([`Clock::monotonic`]): the process's monotonic clock in production, the injected time in
//!   tests, so a test moves leases past their `lease_ttl` as it moves the limits' windows. The
//!   sweep itself still ticks every [`SWEEP`] of wall time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use super::{AnyClock, Clock, Store, StoreError, StoreErrorKind};
use crate::lease::granted;
use crate::worker::WorkerId;
use crate::{AsLimit, Check, Decision, Limit, Micros, Op, SubjectDigest};

/// How often leases past their `lease_ttl` are collected and returned.
const SWEEP: Duration = Duration::from_millis(5);

type Key = (u64, [u8; 16]);

/// Unused units to give back: the limit, the subject, the units and their generation.
type Returned = (Arc<Limit>, SubjectDigest, u64, u64);

/// One worker's lease of one (limit, subject).
struct Lease {
    /// The limit (a twin: the return outlives the request that asked).
    limit: Arc<Limit>,
    subject: SubjectDigest,
    /// Units left.
    units: u64,
    /// The grant's decision (remaining after it, reset_after) and when it was asked.
    /// Times are on the store's clock ([`Clock::monotonic`]).
    base: Decision,
    asked: Micros,
    /// Spent and returned only before this.
    valid_until: Micros,
    /// The generation of the state the units were charged to (the grant's; 0 in process): they
    /// go back into that generation only.
    generation: u64,
    /// Returned at this (the last use + `lease_ttl`).
    expires: Micros,
}

/// A (limit, subject)'s place in a worker's book.
#[derive(Default)]
struct Slot {
    lease: Option<Lease>,
    /// The next lease's size, and when the last one was asked.
    size: u64,
    last_ask: Option<Micros>,
    /// Units beyond their own needs that requests are asking for right now.
    asking: u64,
}

#[derive(Default)]
struct Book {
    slots: HashMap<Key, Slot, foldhash::fast::RandomState>,
}

struct Inner<R> {
    remote: R,
    books: Box<[Mutex<Book>]>,
    /// Units to give back, collected by requests and the sweep; sent by the sweep.
    returns: Mutex<Vec<Returned>>,
    /// Leases held (the sweep skips its work at 0).
    live: AtomicUsize,
    /// The store's timeout (µs): a return must land before the grant's state moves on.
    margin: Micros,
    /// Where the leases' times come from (the store's clock).
    clock: AnyClock,
}

fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A store whose `sync = "lease"` limits are spent from per-worker leases.
pub struct Leasing<R>(Arc<Inner<R>>);

fn lock(m: &Mutex<Book>) -> MutexGuard<'_, Book> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key<L: AsLimit>(c: &Check<'_, L>) -> Key {
    (c.limit.uid, c.subject.0)
}

/// Whether `c` is decided through a lease.
fn leased<L: AsLimit>(c: &Check<'_, L>) -> bool {
    c.limit.lease.is_some() && c.op == Op::Decide
}

impl Lease {
    fn usable(&self, now: Micros, cost: u64) -> bool {
        now < self.valid_until && now < self.expires && self.units >= cost
    }

    /// What a request served from this lease is told.
    fn decision(&self, now: Micros) -> Decision {
        let elapsed = now.saturating_sub(self.asked);
        Decision {
            allowed: true,
            limit: self.base.limit,
            remaining: self.base.remaining.saturating_add(self.units),
            retry_after: 0,
            reset_after: self.base.reset_after.saturating_sub(elapsed),
            delay: 0,
            kind: Default::default(),
        }
    }
}

impl<R: Store + 'static> Leasing<R> {
    /// `remote` with a book per worker (`workers` + one off the workers); `timeout` is the
    /// store's, `clock` the one leases age on (the store's). Starts the sweep on the current
    /// runtime for as long as the store exists.
    pub fn new(remote: R, workers: usize, timeout: Duration, clock: AnyClock) -> Leasing<R> {
        let inner = Arc::new(Inner {
            remote,
            books: (0..=workers.max(1)).map(|_| Mutex::default()).collect(),
            returns: Mutex::default(),
            live: AtomicUsize::new(0),
            margin: micros(timeout),
            clock,
        });
        tokio::spawn(sweep(Arc::downgrade(&inner)));
        Leasing(inner)
    }
}

impl<R> Leasing<R> {
    /// The wrapped store.
    pub fn inner(&self) -> &R {
        &self.0.remote
    }
}

impl<R> Inner<R> {
    fn book(&self, worker: WorkerId) -> MutexGuard<'_, Book> {
        lock(&self.books[worker.slot(self.books.len())])
    }

    /// Gives `lease`'s units back if it is still valid, else counts them expired.
    fn retire(&self, lease: Lease, now: Micros) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        if lease.units == 0 {
            return;
        }
        let Some((_, m)) = &lease.limit.lease else {
            return;
        };
        if now < lease.valid_until {
            m.returned.increment(lease.units);
            self.returns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((
                    lease.limit.clone(),
                    lease.subject,
                    lease.units,
                    lease.generation,
                ));
        } else {
            m.expired.increment(lease.units);
        }
    }

    /// Drops `lease`'s units unspent and not given back: the state they were charged to is
    /// gone (a reset, or a grant from a newer generation).
    fn revoke(&self, lease: Lease) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        if let Some((_, m)) = &lease.limit.lease {
            m.revoked.increment(lease.units);
        }
    }
}

impl<R> Inner<R> {
    /// Revokes every worker's lease of `k` (see [`Leasing::adjust`]).
    fn revoke_all(&self, k: Key) {
        for b in self.books.iter() {
            let old = lock(b).slots.get_mut(&k).and_then(|s| s.lease.take());
            if let Some(l) = old {
                self.revoke(l);
            }
        }
    }
}

/// What a request took from its worker's book, and asks of the store: put back (units into
/// their leases, asks out of `asking`) when dropped armed.
struct Taking<'a, R> {
    inner: &'a Inner<R>,
    worker: WorkerId,
    /// (key, units) taken from leases.
    taken: SmallVec<[(Key, u64); 2]>,
    /// (key, extra units) being asked for.
    asking: SmallVec<[(Key, u64); 2]>,
    armed: bool,
}

impl<R> Drop for Taking<'_, R> {
    fn drop(&mut self) {
        let mut book = self.inner.book(self.worker);
        for (k, extra) in &self.asking {
            if let Some(s) = book.slots.get_mut(k) {
                s.asking = s.asking.saturating_sub(*extra);
            }
        }
        if self.armed {
            for (k, units) in &self.taken {
                if let Some(l) = book.slots.get_mut(k).and_then(|s| s.lease.as_mut()) {
                    l.units = l.units.saturating_add(*units);
                }
            }
        }
    }
}

impl<R: Store> Store for Leasing<R> {
    /// Every check decided through a lease with the units in hand (none asked for), or what
    /// the store behind decides here when no check is leased; else `None`, nothing taken.
    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Option<Result<Vec<Decision>, StoreError>> {
        if !checks.iter().any(leased) {
            return self.0.remote.decide_here(checks, worker);
        }
        let inner = &*self.0;
        let now = inner.clock.monotonic();
        let mut out = vec![Decision::unasked(); checks.len()];
        let mut taken: SmallVec<[(Key, u64); 4]> = SmallVec::new();
        let mut book = inner.book(worker);
        for (i, c) in checks.iter().enumerate() {
            let usable = match (&c.limit.lease, leased(c)) {
                (Some((cfg, _)), true) => {
                    let cost = c.limit.policy.cost;
                    book.slots
                        .get_mut(&key(c))
                        .and_then(|s| s.lease.as_mut())
                        .filter(|l| l.usable(now, cost))
                        .map(|l| {
                            l.units -= cost;
                            l.expires = now.saturating_add(micros(cfg.ttl));
                            out[i] = l.decision(now);
                            cost
                        })
                }
                _ => None,
            };
            match usable {
                Some(cost) => taken.push((key(c), cost)),
                None => {
                    // The store must be asked: what was taken goes back, as it was.
                    for (k, units) in &taken {
                        if let Some(l) = book.slots.get_mut(k).and_then(|s| s.lease.as_mut()) {
                            l.units = l.units.saturating_add(*units);
                        }
                    }
                    return None;
                }
            }
        }
        drop(book);
        for c in checks {
            if let Some((_, m)) = &c.limit.lease {
                m.used.increment(c.limit.policy.cost);
            }
        }
        Some(Ok(out))
    }

    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        if !checks.iter().any(leased) {
            return self.0.remote.decide(checks, worker).await;
        }
        let inner = &*self.0;
        let now = inner.clock.monotonic();
        let mut out = vec![Decision::unasked(); checks.len()];
        let mut remote_idx: SmallVec<[usize; 4]> = SmallVec::new();
        let mut remote_checks: SmallVec<[Check<'_, L>; 4]> = SmallVec::new();
        let mut taking = Taking {
            inner,
            worker,
            taken: SmallVec::new(),
            asking: SmallVec::new(),
            armed: true,
        };
        {
            let mut book = inner.book(worker);
            for (i, c) in checks.iter().enumerate() {
                let Some((cfg, _)) = &c.limit.lease else {
                    remote_idx.push(i);
                    remote_checks.push(*c);
                    continue;
                };
                if !leased(c) {
                    remote_idx.push(i);
                    remote_checks.push(*c);
                    continue;
                }
                let cost = c.limit.policy.cost;
                let slot = book.slots.entry(key(c)).or_default();
                if let Some(l) = slot.lease.as_mut().filter(|l| l.usable(now, cost)) {
                    l.units -= cost;
                    l.expires = now.saturating_add(micros(cfg.ttl));
                    out[i] = l.decision(now);
                    taking.taken.push((key(c), cost));
                    continue;
                }
                // No usable lease: what is left of one goes back, and a new one is asked.
                if let Some(old) = slot.lease.take() {
                    inner.retire(old, now);
                }
                let hot = slot
                    .last_ask
                    .is_some_and(|t| now < t.saturating_add(micros(cfg.ttl)));
                slot.size = if hot {
                    slot.size.saturating_mul(2).clamp(cost, cfg.max)
                } else {
                    cost
                };
                slot.last_ask = Some(now);
                let room = cfg.max.saturating_sub(slot.asking).saturating_sub(cost);
                let extra = slot.size.saturating_sub(cost).min(room);
                let extra = extra - extra % cost.max(1); // whole requests
                slot.asking += extra;
                taking.asking.push((key(c), extra));
                remote_idx.push(i);
                remote_checks.push(Check {
                    op: Op::Lease(cost + extra),
                    ..*c
                });
            }
        }
        if remote_checks.is_empty() {
            taking.armed = false;
            for c in checks.iter().filter(|c| leased(c)) {
                if let Some((_, m)) = &c.limit.lease {
                    m.used.increment(c.limit.policy.cost);
                }
            }
            return Ok(out);
        }
        let asked = inner.clock.monotonic();
        let answer = match inner.remote.decide(&remote_checks, worker).await {
            Ok(d) if d.len() == remote_checks.len() => d,
            Ok(_) => {
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    "the store answered a different number of limits",
                ))
            }
            Err(e) => {
                taking.armed = false; // spent: see the module comment
                return Err(e);
            }
        };
        let mut grants: SmallVec<[(usize, u64, u64); 2]> = SmallVec::new();
        for ((&i, c), d) in remote_idx.iter().zip(&remote_checks).zip(&answer) {
            if let Op::Lease(_) = c.op {
                if let Some((_, m)) = &c.limit.lease {
                    m.requests.increment(1);
                }
                let (units, generation, d) = granted(d);
                out[i] = d;
                if units > 0 {
                    grants.push((i, units, generation));
                }
            } else {
                out[i] = *d;
            }
        }
        let now = inner.clock.monotonic();
        let mut book = inner.book(worker);
        // A lease the store refused may be served by a grant that a concurrent request
        // installed meanwhile (nothing was charged for a refused request).
        let mut refused_locally_served: SmallVec<[(usize, Key, u64); 2]> = SmallVec::new();
        for (&i, c) in remote_idx.iter().zip(&remote_checks) {
            if matches!(c.op, Op::Lease(_)) && !out[i].allowed {
                let cost = c.limit.policy.cost;
                if let Some(l) = book
                    .slots
                    .get_mut(&key(c))
                    .and_then(|s| s.lease.as_mut())
                    .filter(|l| l.usable(now, cost))
                {
                    l.units -= cost;
                    out[i] = l.decision(now);
                    refused_locally_served.push((i, key(c), cost));
                }
            }
        }
        let admitted = checks
            .iter()
            .zip(&out)
            .all(|(c, d)| d.allowed || c.limit.shadow);
        if !admitted {
            // Put back what was taken just now (the guard puts back the rest).
            for (_, k, units) in &refused_locally_served {
                if let Some(l) = book.slots.get_mut(k).and_then(|s| s.lease.as_mut()) {
                    l.units += units;
                }
            }
            drop(book);
            return Ok(out);
        }
        taking.taken.clear();
        taking.armed = false;
        for c in checks.iter().filter(|c| leased(c)) {
            if let Some((_, m)) = &c.limit.lease {
                m.used.increment(c.limit.policy.cost);
            }
        }
        // Install the grants: this request spent its cost of each; the rest is the lease.
        for (i, units, generation) in grants {
            let c = &checks[i];
            let Some((cfg, _)) = &c.limit.lease else {
                continue;
            };
            let cost = c.limit.policy.cost;
            let d = out[i];
            let valid_until = asked.saturating_add(d.reset_after.saturating_sub(inner.margin));
            let rest = units.saturating_sub(cost);
            // Told as a request served from the lease is: Redis's remaining plus the rest.
            out[i].remaining = d.remaining.saturating_add(rest);
            let slot = book.slots.entry(key(c)).or_default();
            match slot.lease.as_mut() {
                // A live lease of the same state (a concurrent grant): merged, valid while both
                // are.
                Some(l) if now < l.valid_until && l.generation == generation => {
                    l.units += rest;
                    l.valid_until = l.valid_until.min(valid_until);
                    l.expires = now.saturating_add(micros(cfg.ttl));
                }
                _ => {
                    match slot.lease.take() {
                        // Units of a state that is gone (reset or lost): never spent, never
                        // given back into this one.
                        Some(old) if old.generation != generation && now < old.valid_until => {
                            inner.revoke(old);
                        }
                        Some(old) => inner.retire(old, now),
                        None => {}
                    }
                    inner.live.fetch_add(1, Ordering::AcqRel);
                    slot.lease = Some(Lease {
                        limit: Arc::new(Limit::clone(c.limit)),
                        subject: c.subject,
                        units: rest,
                        base: d,
                        asked,
                        valid_until,
                        generation,
                        expires: now.saturating_add(micros(cfg.ttl)),
                    });
                }
            }
        }
        drop(book);
        Ok(out)
    }

    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        self.0.remote.peek(checks, worker).await
    }

    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), StoreError> {
        self.0.remote.settle(checks, worker).await
    }

    /// Support's correction goes to the shared state. A reset revokes this gateway's leases
    /// of the (limit, subject): their units are of the state it deleted, never spent on top of
    /// the fresh limit nor given back into it (the script refuses units of another generation:
    /// another gateway's leases are revoked at its next grant, and spend at most what they
    /// hold meanwhile). A grant leaves leases as they are.
    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: crate::adjust::Adjust,
    ) -> Result<(), StoreError> {
        let inner = &*self.0;
        if adjust == crate::adjust::Adjust::Reset && check.limit.lease.is_some() {
            // Revoked before the reset as well as after: a request of this gateway racing it
            // spends no old unit on the fresh state.
            inner.revoke_all(key(check));
            inner.remote.adjust(check, adjust).await?;
            inner.revoke_all(key(check));
            return Ok(());
        }
        inner.remote.adjust(check, adjust).await
    }

    fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: crate::Micros,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.0.remote.ban(check, until)
    }

    fn lift_bans<L: AsLimit>(
        &self,
        limit: &L,
    ) -> impl std::future::Future<Output = Result<u64, StoreError>> + Send {
        self.0.remote.lift_bans(limit)
    }

    fn ban_lifts<L: AsLimit>(
        &self,
        limit: &L,
    ) -> impl std::future::Future<Output = Result<u64, StoreError>> + Send {
        self.0.remote.ban_lifts(limit)
    }

    fn is_up(&self) -> bool {
        self.0.remote.is_up()
    }

    fn ping(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.0.remote.ping()
    }
}

/// Every [`SWEEP`]: retires the leases past their `lease_ttl` (and forgets idle slots), then
/// gives back what was collected, in one settle.
async fn sweep<R: Store>(inner: Weak<Inner<R>>) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = inner.clock.monotonic();
        if inner.live.load(Ordering::Acquire) > 0 {
            for b in inner.books.iter() {
                let mut book = lock(b);
                let mut gone = Vec::new();
                book.slots.retain(|_, s| {
                    if s.lease.as_ref().is_some_and(|l| now >= l.expires) {
                        gone.extend(s.lease.take());
                    }
                    // An idle slot (cold again) is forgotten.
                    s.lease.is_some()
                        || s.asking > 0
                        || s.last_ask
                            .is_some_and(|t| now < t.saturating_add(10_000_000))
                });
                drop(book);
                for l in gone {
                    inner.retire(l, now);
                }
            }
        }
        let returns = std::mem::take(&mut *inner.returns.lock().unwrap_or_else(|e| e.into_inner()));
        if returns.is_empty() {
            continue;
        }
        let checks: Vec<Check<'_>> = returns
            .iter()
            .map(|(l, s, units, generation)| Check {
                limit: l,
                subject: *s,
                op: Op::LeaseReturn(*units, *generation),
            })
            .collect();
        if let Err(e) = inner.remote.settle(&checks, WorkerId::NONE).await {
            tracing::debug!(error = %e, "leased units could not be given back; they expire");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::LeaseMetrics;
    use crate::store::{ManualClock, MemoryStore};
    use crate::{Algorithm, LeaseSettings, Policy};

    /// A request a lease in hand admits is decided here (no future); without units in hand
    /// `None`, nothing taken, and the store is asked.
    #[tokio::test]
    async fn a_lease_in_hand_decides_here_and_nothing_is_taken_otherwise() {
        let clock = AnyClock::Manual(ManualClock::new(1_700_000_000_000_000));
        let remote = MemoryStore::with_clock(100, clock.clone());
        let leasing = Leasing::new(remote, 1, Duration::from_millis(100), clock);
        let policy = Policy {
            algorithm: Algorithm::FixedWindow,
            limit: 100,
            period: Duration::from_secs(3600).as_micros() as u64,
            burst: 0,
            cost: 1,
            calendar: None,
        };
        let settings = LeaseSettings {
            ttl: Duration::from_secs(10),
            max: 8,
        };
        let limit = Arc::new(Limit {
            lease: Some((settings, LeaseMetrics::new("r", "q"))),
            ..Limit::new("r", "q", policy)
        });
        let checks = [Check {
            limit: &limit,
            subject: SubjectDigest::of(b'g', b""),
            op: Op::Decide,
        }];
        let w = WorkerId::new(0);
        assert!(leasing.decide_here(&checks, w).is_none(), "no lease yet");
        // The first ask takes the request's own unit; the next, hot, one more for later.
        assert!(leasing.decide(&checks, w).await.unwrap()[0].allowed);
        assert!(leasing.decide(&checks, w).await.unwrap()[0].allowed);
        let d = leasing.decide_here(&checks, w).expect("a unit in hand");
        assert!(d.unwrap()[0].allowed);
        assert!(
            leasing.decide_here(&checks, w).is_none(),
            "the lease is spent"
        );
        assert!(leasing.decide_here(&checks, w).is_none());
        // Three units charged in the store (two requests and the one leased ahead): 96 remain
        // after a fourth.
        let remote = &leasing.0.remote;
        assert_eq!(
            remote.peek_now(
                &[Check {
                    op: Op::Decide,
                    ..checks[0]
                }],
                remote.now()
            )[0]
            .remaining,
            96
        );
    }
}
