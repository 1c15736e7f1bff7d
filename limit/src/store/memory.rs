//! The in-process store: state in sharded hash maps, decided under the shards' locks.
//!
//! A request's limits may live in several shards; they are locked in ascending shard order (no
//! deadlock) for the few microseconds the pure algorithms take, so a request's limits are decided
//! and charged atomically. No lock is held across an `.await`.
//!
//! Bounded memory: every entry knows when it stops mattering ([`expires_at`]); a periodic sweep
//! drops expired entries, and the store never holds more than `max_subjects` entries. When a new
//! (limit, subject) pair arrives at that cap, one entry is evicted, chosen by what losing it grants
//! (see [`usage`]): first entries that decide exactly as a fresh one would (expired windows, full
//! buckets), then those using the least of their limit. An entry that would deny its next request
//! is evicted only when no entry anywhere has capacity to spare, so a flood of new keys on one
//! route cannot reset a denied subject on any route. Evictions are counted in
//! `tollgate_store_evictions_total`.
//!
//! Choosing a victim scans the shard once and keeps its lowest-usage eighth as a queue of
//! candidates (re-checked when used), so a flood of new keys costs a few evaluations per request,
//! not a scan of the shard each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use metrics::{Counter, Gauge};
use smallvec::SmallVec;

use super::{AnyClock, Clock, StoreError};
use crate::adjust::{apply as apply_adjust, Adjust};
use crate::charge::force;
use crate::lease::{lease_policy, with_granted};
use crate::refund::refund;
use crate::worker::WorkerId;
use crate::{
    admit, evaluate, expires_at, usage, AsLimit, Check, Decision, Micros, Policy, State, USAGE_FULL,
};
use crate::{batch, concurrency, Op};

const SHARDS: usize = 64;

type Key = (u64, [u8; 16]);

#[derive(Debug)]
struct Entry {
    state: State,
    policy: Policy,
    expires: Micros,
}

#[derive(Debug, Default)]
struct Shard {
    /// Keyed by the limit and the subject's digest, hashed with a per-map random seed
    /// (foldhash: a few times cheaper than SipHash on these 24 bytes, still seeded).
    map: HashMap<Key, Entry, foldhash::fast::RandomState>,
    /// Eviction candidates with capacity to spare, highest usage first (so `pop` gives the
    /// lowest). Stale by design: each is re-checked before it is evicted.
    victims: Vec<Key>,
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore {
    clock: AnyClock,
    shards: Box<[Mutex<Shard>]>,
    cap: usize,
    len: AtomicUsize,
    subjects: Gauge,
    evicted_expired: Counter,
    evicted_capacity: Counter,
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a shard half-updated (each entry is replaced
    // whole), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn shard_of(key: &Key) -> usize {
    (key.1[0] as usize ^ (key.0 as usize)) % SHARDS
}

impl Shard {
    /// Removes the entry that grants least when lost, if one has capacity to spare (or any
    /// entry, with `any`). Returns whether it had expired.
    fn evict(&mut self, now: Micros, any: bool) -> Option<bool> {
        loop {
            if self.victims.is_empty() {
                self.find_victims(now);
            }
            let Some(k) = self.victims.pop() else {
                break;
            };
            let Some(e) = self.map.get(&k) else {
                continue;
            };
            if usage(&e.policy, &e.state, now) < USAGE_FULL {
                let expired = e.expires <= now;
                self.map.remove(&k);
                return Some(expired);
            }
        }
        if !any {
            return None;
        }
        // Every entry here would deny its next request: the one whose denial ends first goes.
        let k = self
            .map
            .iter()
            .min_by_key(|(_, e)| e.expires)
            .map(|(k, _)| *k)?;
        self.map.remove(&k).map(|e| e.expires <= now)
    }

    /// Refills `victims` with the lowest-usage eighth of the entries that have capacity left.
    fn find_victims(&mut self, now: Micros) {
        let mut scored: Vec<(u64, Key)> = self
            .map
            .iter()
            .map(|(k, e)| (usage(&e.policy, &e.state, now), *k))
            .filter(|(u, _)| *u < USAGE_FULL)
            .collect();
        let keep = (self.map.len() / 8).max(1);
        if scored.len() > keep {
            scored.select_nth_unstable(keep - 1);
            scored.truncate(keep);
        }
        scored.sort_unstable_by(|a, b| b.cmp(a));
        self.victims = scored.into_iter().map(|(_, k)| k).collect();
    }
}

impl MemoryStore {
    /// A store tracking at most `max_subjects` (limit, subject) pairs, on the system clock.
    pub fn new(max_subjects: u64) -> MemoryStore {
        MemoryStore::with_clock(max_subjects, AnyClock::System)
    }

    /// A store on `clock` (a manual one in tests).
    pub fn with_clock(max_subjects: u64, clock: AnyClock) -> MemoryStore {
        let subjects = metrics::gauge!(crate::metrics::STORE_SUBJECTS);
        subjects.set(0.0);
        MemoryStore {
            clock,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            cap: usize::try_from(max_subjects).unwrap_or(usize::MAX).max(1),
            len: AtomicUsize::new(0),
            subjects,
            evicted_expired: metrics::counter!(crate::metrics::STORE_EVICTIONS, "reason" => "expired"),
            evicted_capacity: metrics::counter!(crate::metrics::STORE_EVICTIONS, "reason" => "capacity"),
        }
    }

    /// Drops expired entries; returns how many (limit, subject) pairs remain.
    pub fn sweep(&self, now: Micros) -> usize {
        let mut left = 0;
        for s in self.shards.iter() {
            let mut shard = lock(s);
            let before = shard.map.len();
            shard.map.retain(|_, e| e.expires > now);
            let dropped = before - shard.map.len();
            self.evicted_expired.increment(dropped as u64);
            self.len.fetch_sub(dropped, Ordering::AcqRel);
            left += shard.map.len();
        }
        self.subjects.set(left as f64);
        left
    }

    /// How many (limit, subject) pairs are tracked.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes room for one new entry in `shards[home]` (locked by the caller, as are the shards
    /// in `held`). Returns false when nothing could be evicted: the entry is then not stored.
    fn make_room(&self, home: usize, shard: &mut Shard, held: &[usize], now: Micros) -> bool {
        if self.len.fetch_add(1, Ordering::AcqRel) < self.cap {
            return true;
        }
        // Full. Prefer an entry with capacity to spare, here or in any shard we can lock
        // without waiting (waiting while holding locks could deadlock).
        let mut evicted = shard.evict(now, false);
        if evicted.is_none() {
            for i in (1..SHARDS).map(|d| (home + d) % SHARDS) {
                if held.contains(&i) {
                    continue;
                }
                if let Ok(mut other) = self.shards[i].try_lock() {
                    evicted = other.evict(now, false);
                    if evicted.is_some() {
                        break;
                    }
                }
            }
        }
        if evicted.is_none() {
            evicted = shard.evict(now, true);
        }
        match evicted {
            Some(true) => self.evicted_expired.increment(1),
            Some(false) => self.evicted_capacity.increment(1),
            None => {
                self.len.fetch_sub(1, Ordering::AcqRel);
                return false;
            }
        }
        // One in, one out: `len` is unchanged.
        self.len.fetch_sub(1, Ordering::AcqRel);
        true
    }

    /// The store's time: its clock's, or the system's.
    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    /// Decides synchronously (the store never waits).
    pub fn decide_now<L: AsLimit>(&self, checks: &[Check<'_, L>], now: Micros) -> Vec<Decision> {
        // A request has a handful of limits: keep the bookkeeping on the stack.
        let keys: SmallVec<[Key; 4]> = checks.iter().map(|c| (c.limit.uid, c.subject.0)).collect();
        let mut order: SmallVec<[usize; 4]> = keys.iter().map(shard_of).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let slots: SmallVec<[usize; 4]> = keys
            .iter()
            .map(|key| {
                let s = shard_of(key);
                guards.iter().position(|(i, _)| *i == s).unwrap_or(0)
            })
            .collect();

        let decisions: Vec<Decision> = checks
            .iter()
            .zip(&keys)
            .zip(&slots)
            .map(|((c, k), &g)| {
                let state = guards[g].1.map.get(k).map(|e| &e.state);
                match c.op {
                    Op::Lease(n) => {
                        let q = lease_policy(&c.limit.policy, state, now, n);
                        with_granted(evaluate(&q, state, now), &q)
                    }
                    _ => evaluate(&c.decided_policy(), state, now),
                }
            })
            .collect();
        let part = |c: &Check<'_, L>, d: &Decision| batch::Part {
            allowed: d.allowed,
            shadow: c.limit.shadow,
            charged_on_admission: charged_when_admitted(c),
        };
        if batch::admitted(checks.iter().zip(&decisions).map(|(c, d)| part(c, d))) {
            let mut added = false;
            for (((c, k), &g), d) in checks.iter().zip(&keys).zip(&slots).zip(&decisions) {
                if !part(c, d).charged() {
                    continue; // a shadow limit that would have denied is not charged
                }
                let home = guards[g].0;
                let shard = &mut *guards[g].1;
                let policy = match c.op {
                    // The units granted are the request's cost.
                    Op::Lease(_) => Policy {
                        cost: d.delay,
                        ..c.limit.policy
                    },
                    _ => c.decided_policy(),
                };
                // The common case, a known subject: updated in place (one hash of the key).
                if let Some(e) = shard.map.get_mut(k) {
                    let old = std::mem::replace(&mut e.state, State::Gcra { tat: 0, credit: 0 });
                    e.state = admit(&policy, Some(old), now);
                    e.expires = expires_at(&policy, &e.state);
                    e.policy = c.limit.policy;
                    continue;
                }
                if !self.make_room(home, shard, &order, now) {
                    continue;
                }
                added = true;
                let state = admit(&policy, None, now);
                let expires = expires_at(&policy, &state);
                shard.map.insert(
                    *k,
                    Entry {
                        state,
                        policy: c.limit.policy,
                        expires,
                    },
                );
            }
            if added {
                self.subjects
                    .set(self.len.load(Ordering::Acquire).min(self.cap) as f64);
            }
        }
        decisions
    }
}

/// Whether `decide` charges an admitted check now: not a limit charged after the response, and
/// a concurrency limit only when it takes a slot.
fn charged_when_admitted<L: AsLimit>(c: &Check<'_, L>) -> bool {
    if c.limit.evaluated_only() {
        return false;
    }
    c.limit.policy.algorithm != crate::Algorithm::Concurrency || matches!(c.op, Op::Acquire(_))
}

impl MemoryStore {
    /// Applies post-response charges and slot releases (see [`super::Store::settle`]); each
    /// check on its own, under its shard's lock.
    pub fn settle_now<L: AsLimit>(&self, checks: &[Check<'_, L>], now: Micros) {
        for c in checks {
            let key = (c.limit.uid, c.subject.0);
            let home = shard_of(&key);
            let mut shard = lock(&self.shards[home]);
            let policy = c.limit.policy;
            let old = shard.map.remove(&key).map(|e| e.state);
            let existed = old.is_some();
            let new = match c.op {
                Op::Charge(units) => force(&policy, old, now, units),
                Op::Release(_) => concurrency::release(&policy, old),
                // In process a state has one life: no generation to check.
                Op::Return(units) | Op::LeaseReturn(units, _) => {
                    refund(&policy, old, now, now, units)
                }
                Op::Decide | Op::Acquire(_) | Op::Lease(_) | Op::Reserve(_) => old,
            };
            match new {
                Some(state) => {
                    if !existed && !self.make_room(home, &mut shard, &[home], now) {
                        continue;
                    }
                    let expires = expires_at(&policy, &state);
                    shard.map.insert(
                        key,
                        Entry {
                            state,
                            policy,
                            expires,
                        },
                    );
                }
                None if existed => {
                    self.len.fetch_sub(1, Ordering::AcqRel);
                }
                None => {}
            }
        }
    }

    /// Gives back what [`Self::decide_now`] charged at `charged_at` for `checks` (their
    /// `decisions` as it answered them): the local tier's half of a request another store
    /// refused (see [`crate::refund`]).
    pub fn refund_now<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        decisions: &[Decision],
        charged_at: Micros,
        now: Micros,
    ) {
        for (c, d) in checks.iter().zip(decisions) {
            if !d.allowed || !charged_when_admitted(c) {
                continue;
            }
            let key = (c.limit.uid, c.subject.0);
            let mut shard = lock(&self.shards[shard_of(&key)]);
            let Some(e) = shard.map.get_mut(&key) else {
                continue;
            };
            let policy = c.limit.policy;
            let old = std::mem::replace(&mut e.state, State::Gcra { tat: 0, credit: 0 });
            match refund(&policy, Some(old), charged_at, now, c.decided_policy().cost) {
                Some(state) => {
                    e.expires = expires_at(&policy, &state);
                    e.state = state;
                }
                None => {
                    shard.map.remove(&key);
                    self.len.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Applies support's correction under the entry's shard lock (see [`super::Store::adjust`]).
    pub fn adjust_now<L: AsLimit>(&self, check: &Check<'_, L>, adjust: Adjust, now: Micros) {
        let key = (check.limit.uid, check.subject.0);
        let home = shard_of(&key);
        let mut shard = lock(&self.shards[home]);
        let policy = check.limit.policy;
        let old = shard.map.remove(&key).map(|e| e.state);
        let existed = old.is_some();
        match apply_adjust(&policy, old, now, adjust) {
            Some(state) => {
                // A grant to a fresh subject is a new entry (its credit).
                if !existed && !self.make_room(home, &mut shard, &[home], now) {
                    return;
                }
                let expires = expires_at(&policy, &state);
                shard.map.insert(
                    key,
                    Entry {
                        state,
                        policy,
                        expires,
                    },
                );
            }
            None if existed => {
                self.len.fetch_sub(1, Ordering::AcqRel);
            }
            None => {}
        }
    }

    /// Evaluates without charging: what [`Self::decide_now`] would answer each limit at `now`.
    pub fn peek_now<L: AsLimit>(&self, checks: &[Check<'_, L>], now: Micros) -> Vec<Decision> {
        checks
            .iter()
            .map(|c| {
                let key = (c.limit.uid, c.subject.0);
                let shard = lock(&self.shards[shard_of(&key)]);
                evaluate(
                    &c.decided_policy(),
                    shard.map.get(&key).map(|e| &e.state),
                    now,
                )
            })
            .collect()
    }
}

impl super::Store for MemoryStore {
    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        _: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(self.decide_now(checks, self.now()))
    }

    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        _: WorkerId,
    ) -> Option<Result<Vec<Decision>, StoreError>> {
        Some(Ok(self.decide_now(checks, self.now())))
    }

    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        _: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(self.peek_now(checks, self.now()))
    }

    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        _: WorkerId,
    ) -> Result<(), StoreError> {
        self.settle_now(checks, self.now());
        Ok(())
    }

    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> Result<(), StoreError> {
        self.adjust_now(check, adjust, self.now());
        Ok(())
    }

    fn is_up(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Algorithm, Limit, Op, SubjectDigest};

    fn limit(algorithm: Algorithm) -> Arc<Limit> {
        let policy = Policy {
            algorithm,
            limit: 5,
            period: 60_000_000,
            burst: 5,
            cost: 1,
            calendar: None,
        };
        Arc::new(Limit::new("r", "l", policy))
    }

    #[test]
    fn a_key_cardinality_attack_stays_bounded() {
        let store = MemoryStore::new(1_000);
        let l = limit(Algorithm::Gcra);
        let now = 1_700_000_000_000_000;
        for i in 0..100_000u32 {
            let subject = SubjectDigest::of(b'h', format!("random-key-{i}").as_bytes());
            let d = store.decide_now(
                &[Check {
                    limit: &l,
                    subject,
                    op: Op::Decide,
                }],
                now + u64::from(i),
            );
            assert!(d[0].allowed);
        }
        assert_eq!(store.len(), 1_000, "the cap is exact");
        // Expired entries go on the next sweep.
        assert_eq!(store.sweep(now + 3_600_000_000), 0);
        assert!(store.is_empty());
    }

    #[test]
    fn a_flood_never_evicts_an_exhausted_subject_while_others_have_room() {
        let store = MemoryStore::new(100);
        let mut strict = limit(Algorithm::SlidingLog);
        Arc::make_mut(&mut strict).policy.limit = 1;
        Arc::make_mut(&mut strict).uid ^= 7;
        let roomy = limit(Algorithm::FixedWindow);
        let now = 1_700_000_000_000_000;
        let denied: Vec<SubjectDigest> = (0..20u8).map(|i| SubjectDigest::of(b'i', &[i])).collect();
        for s in &denied {
            let c = [Check {
                limit: &strict,
                subject: *s,
                op: Op::Decide,
            }];
            assert!(store.decide_now(&c, now)[0].allowed);
            assert!(!store.decide_now(&c, now)[0].allowed);
        }
        for i in 0..10_000u32 {
            let subject = SubjectDigest::of(b'h', format!("flood-{i}").as_bytes());
            let c = [Check {
                limit: &roomy,
                subject,
                op: Op::Decide,
            }];
            assert!(store.decide_now(&c, now + u64::from(i))[0].allowed);
        }
        assert_eq!(store.len(), 100);
        for s in &denied {
            let c = [Check {
                limit: &strict,
                subject: *s,
                op: Op::Decide,
            }];
            assert!(
                !store.decide_now(&c, now + 20_000)[0].allowed,
                "an exhausted subject was evicted"
            );
        }
    }

    #[test]
    fn fresh_entries_go_before_used_ones() {
        let store = MemoryStore::new(2);
        let l = limit(Algorithm::TokenBucket);
        let now = 1_000_000_000_000;
        let (a, b, c) = (
            SubjectDigest::of(b'h', b"a"),
            SubjectDigest::of(b'h', b"b"),
            SubjectDigest::of(b'h', b"c"),
        );
        let check = |s| {
            [Check {
                limit: &l,
                subject: s,
                op: Op::Decide,
            }]
        };
        // `a` uses 4 of 5 tokens; `b` uses 1, then refills completely.
        for _ in 0..4 {
            store.decide_now(&check(a), now);
        }
        store.decide_now(&check(b), now);
        let later = now + 20_000_000;
        store.decide_now(&check(c), later);
        // `b` (full again) was evicted, not `a`: after 20 s of refill `a` holds 1 + 5·20/60
        // tokens, so this request leaves 1 (an evicted `a` would have left 4).
        assert_eq!(store.len(), 2);
        assert_eq!(store.decide_now(&check(a), later)[0].remaining, 1);
    }

    #[test]
    fn decisions_are_all_or_nothing() {
        let store = MemoryStore::new(100);
        let a = limit(Algorithm::FixedWindow);
        let mut b_cfg = limit(Algorithm::FixedWindow);
        Arc::make_mut(&mut b_cfg).policy.limit = 1;
        Arc::make_mut(&mut b_cfg).uid ^= 1;
        let s = SubjectDigest::of(b'g', b"");
        let now = 1_000_000_000;
        let both = [
            Check {
                limit: &a,
                subject: s,
                op: Op::Decide,
            },
            Check {
                limit: &b_cfg,
                subject: s,
                op: Op::Decide,
            },
        ];
        let d = store.decide_now(&both, now);
        assert!(d[0].allowed && d[1].allowed);
        let d = store.decide_now(&both, now);
        assert!(d[0].allowed && !d[1].allowed);
        // The denied request was not charged to `a`: it still has 4 of 5 left.
        let d = store.decide_now(&both[..1], now);
        assert_eq!(d[0].remaining, 3);
    }
}
