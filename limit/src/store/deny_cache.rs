//! A local cache of denials, so a client hammering a closed limit costs no Redis round trip.
//!
//! A denied request changes no state, and a limit that denies is charged by nobody (every request
//! that includes it is denied), so a denying limit changes only with time until it would admit
//! again. For fixed windows, GCRA and the leaky bucket a denial pins the state down, so the cache
//! answers for each denying limit exactly what the store would decide at that moment
//! ([`age_denial`]): `remaining` grows back, `reset` and `Retry-After` count down. A denial by a
//! token bucket or sliding window/log (whose state a decision does not reveal) is always asked of
//! the store. Limits of the set that admitted are reported as the store last answered them (other
//! subjects' requests may have charged them since; the verdict does not depend on them).
//!
//! A request with a reservation read from its body (`Op::Reserve`) is never answered from the
//! cache nor remembered in it: what it needs left is its own.
//!
//! A request with a leased limit (`sync = "lease"`) keeps its denial at most that limit's
//! `lease_ttl`: unused units given back can reopen it before its retry time.
//!
//! Clocks: the store decided at some instant between sending and receiving. Entries end at
//! `sent + retry` (never after the real denial ends); answers age from `received` (so
//! `Retry-After` is never early, and `remaining` errs by at most the round trip, low).

use std::time::Duration;

use super::{AnyClock, Clock};
use crate::Micros;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use metrics::Counter;

use crate::adjust::Adjust;
use crate::worker::WorkerId;
use crate::{age_denial, AsLimit, Check, Decision, Op};

const SHARDS: usize = 16;
/// The longest a denial is answered from the cache: a quota reset or grant on the admin API of
/// another gateway (which cannot clear this one's cache) takes effect here within it. One store
/// round trip a second per denied subject and worker is nothing; a monthly quota's denial
/// cached until the month's end would make a support reset useless.
pub const MAX_CACHED: Duration = Duration::from_secs(1);
/// Entries per shard before new denials are no longer cached (after expired ones are swept).
const CAP_PER_SHARD: usize = 8192;

/// The identity of a request's set of checks: first limit and subject exactly, the rest hashed.
type Key = (u64, [u8; 16], u64);

struct Entry {
    /// Times on the cache's clock ([`Clock::monotonic`]).
    until: Micros,
    received: Micros,
    decisions: Vec<Decision>,
}

/// The cache.
pub struct DenyCache {
    shards: Box<[Mutex<HashMap<Key, Entry, foldhash::fast::RandomState>>]>,
    /// Entries over every shard, kept under the shards' locks: while it is 0 (no client is
    /// being refused: the common case) a lookup computes no key and takes no lock.
    entries: AtomicUsize,
    hits: Counter,
}

/// `None` (never cached) for a set with a reservation read from the body (`Op::Reserve`): a
/// denial of one amount says nothing of a smaller one.
fn key<L: AsLimit>(checks: &[Check<'_, L>]) -> Option<Key> {
    if checks.iter().any(|c| matches!(c.op, Op::Reserve(_))) {
        return None;
    }
    let first = checks.first()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    checks.len().hash(&mut h);
    for c in &checks[1..] {
        c.limit.uid.hash(&mut h);
        c.subject.0.hash(&mut h);
    }
    Some((first.limit.uid, first.subject.0, h.finish()))
}

fn shard(k: &Key) -> usize {
    usize::from(k.1[0]) % SHARDS
}

impl Default for DenyCache {
    fn default() -> Self {
        DenyCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            entries: AtomicUsize::new(0),
            hits: metrics::counter!(crate::metrics::DENY_CACHE_HITS),
        }
    }
}

impl DenyCache {
    /// The cached denial for these checks, as the store would decide it now.
    pub fn lookup<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        now: Micros,
    ) -> Option<Vec<Decision>> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let k = key(checks)?;
        let mut map = self.shards[shard(&k)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let entry = map.get(&k)?;
        let elapsed = now.saturating_sub(entry.received);
        let aged: Option<Vec<Decision>> = (now < entry.until)
            .then(|| {
                checks
                    .iter()
                    .zip(&entry.decisions)
                    .map(|(c, d)| {
                        if d.allowed {
                            Some(Decision {
                                reset_after: d.reset_after.saturating_sub(elapsed),
                                delay: 0,
                                ..*d
                            })
                        } else {
                            age_denial(&c.limit.policy, d, elapsed)
                        }
                    })
                    .collect()
            })
            .flatten();
        match aged {
            Some(decisions) if decisions.len() == checks.len() => {
                self.hits.increment(1);
                Some(decisions)
            }
            _ => {
                if map.remove(&k).is_some() {
                    self.entries.fetch_sub(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Forgets every cached denial.
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut map = s.lock().unwrap_or_else(|e| e.into_inner());
            self.entries.fetch_sub(map.len(), Ordering::Relaxed);
            map.clear();
        }
    }

    /// Remembers a denial by an enforcing limit when every denying limit can be aged exactly.
    /// `sent` and `received` bracket the store's decision.
    pub fn remember<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        decisions: &[Decision],
        sent: Micros,
        received: Micros,
    ) {
        let pairs = || checks.iter().zip(decisions);
        let cacheable = checks.len() == decisions.len()
            && pairs().any(|(c, d)| !c.limit.shadow && !d.allowed)
            && pairs()
                .filter(|(_, d)| !d.allowed)
                .all(|(c, d)| age_denial(&c.limit.policy, d, 0).is_some());
        // A leased limit can reopen before its retry time (another worker's unused units come
        // back within its `lease_ttl`): such a denial is kept at most that long.
        let lease_ttl = checks
            .iter()
            .filter_map(|c| c.limit.lease.as_ref())
            .map(|(cfg, _)| u64::try_from(cfg.ttl.as_micros()).unwrap_or(u64::MAX))
            .min();
        let wait = decisions
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after)
            .min()
            .map(|w| lease_ttl.map_or(w, |t| w.min(t)));
        let (true, Some(wait), Some(k)) = (cacheable, wait, key(checks)) else {
            return;
        };
        // At most MAX_CACHED: another gateway's quota reset or grant is seen after that.
        let max_cached = u64::try_from(MAX_CACHED.as_micros()).unwrap_or(u64::MAX);
        let wait = wait.min(max_cached);
        let Some(until) = sent.checked_add(wait) else {
            return;
        };
        let mut map = self.shards[shard(&k)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if map.len() >= CAP_PER_SHARD {
            let before = map.len();
            map.retain(|_, e| e.until > received);
            self.entries
                .fetch_sub(before - map.len(), Ordering::Relaxed);
            if map.len() >= CAP_PER_SHARD {
                return;
            }
        }
        let replaced = map.insert(
            k,
            Entry {
                until,
                received,
                decisions: decisions.to_vec(),
            },
        );
        if replaced.is_none() {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The deny cache as a layer around a store: one cache per proxy worker (and one for the rest),
/// so a worker answers a cached denial from its own memory, with no lock another worker takes.
/// A worker learns a denial by its own round trip: each worker asks the store once.
pub struct Cached<S> {
    inner: S,
    caches: Option<Box<[DenyCache]>>,
    clock: AnyClock,
}

impl<S: super::Store> Cached<S> {
    /// Wraps `inner`; `enabled: false` passes every decision through. `workers` caches, plus one.
    /// Entries age on `clock` (the store's: a manual clock in tests moves them too).
    pub fn new(inner: S, enabled: bool, workers: usize, clock: AnyClock) -> Cached<S> {
        Cached {
            inner,
            caches: enabled.then(|| (0..=workers.max(1)).map(|_| DenyCache::default()).collect()),
            clock,
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn cache(&self, worker: WorkerId) -> Option<&DenyCache> {
        let caches = self.caches.as_deref()?;
        caches.get(worker.slot(caches.len()))
    }
}

impl<S: super::Store> super::Store for Cached<S> {
    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, super::StoreError> {
        let Some(cache) = self.cache(worker) else {
            return self.inner.decide(checks, worker).await;
        };
        if let Some(hit) = cache.lookup(checks, self.clock.monotonic()) {
            return Ok(hit);
        }
        let sent = self.clock.monotonic();
        let result = self.inner.decide(checks, worker).await;
        if let Ok(decisions) = &result {
            if decisions.iter().any(|d| !d.allowed) {
                cache.remember(checks, decisions, sent, self.clock.monotonic());
            }
        }
        result
    }

    /// A cached denial, or what the store behind decides here (a remote store: nothing).
    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Option<Result<Vec<Decision>, super::StoreError>> {
        if let Some(hit) = self
            .cache(worker)
            .and_then(|cache| cache.lookup(checks, self.clock.monotonic()))
        {
            return Some(Ok(hit));
        }
        self.inner.decide_here(checks, worker)
    }

    /// Always asks the store (a cached denial is what the store would say, but an operator
    /// asking wants the store's own view).
    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, super::StoreError> {
        self.inner.peek(checks, worker).await
    }

    /// Never answered from the cache. A charge only adds, so a cached denial stays true (the
    /// limit is at least as spent); a concurrency denial is never cached (`age_denial`).
    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), super::StoreError> {
        self.inner.settle(checks, worker).await
    }

    /// Forgets this gateway's cached denials first (any may be of the limit corrected: a reset
    /// or a grant makes them untrue), then asks the store. Another gateway's cache holds its
    /// denials for at most [`MAX_CACHED`].
    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> Result<(), super::StoreError> {
        for c in self.caches.iter().flat_map(|c| c.iter()) {
            c.clear();
        }
        let result = self.inner.adjust(check, adjust).await;
        // A request that raced the correction may have cached a denial from before it.
        for c in self.caches.iter().flat_map(|c| c.iter()) {
            c.clear();
        }
        result
    }

    async fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: crate::Micros,
    ) -> Result<(), super::StoreError> {
        self.inner.ban(check, until).await
    }

    async fn lift_bans<L: AsLimit>(&self, limit: &L) -> Result<u64, super::StoreError> {
        let result = self.inner.lift_bans(limit).await;
        // A banned subject's cached refusal lasts until the ban's end: lifted with it.
        for c in self.caches.iter().flat_map(|c| c.iter()) {
            c.clear();
        }
        result
    }

    async fn ban_lifts<L: AsLimit>(&self, limit: &L) -> Result<u64, super::StoreError> {
        self.inner.ban_lifts(limit).await
    }

    fn is_up(&self) -> bool {
        self.inner.is_up()
    }

    async fn ping(&self) -> Result<(), super::StoreError> {
        self.inner.ping().await
    }
}
