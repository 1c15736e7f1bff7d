//! The in-process store: state in sharded hash maps, decided under the shards' locks.
//!
//! A request's limits may live in several shards; they are locked in ascending shard order (no
//! deadlock) for the few microseconds the pure algorithms take, so a request's limits are decided
//! and charged atomically. No lock is held across an `.await`.
//!
//! Bounded memory: every entry knows when it stops mattering ([`expires_at`]); a periodic sweep
//! drops expired entries, and a shard at its share of `max_subjects` first drops expired entries
//! and then the entry closest to expiry, counted in `tollgate_store_evictions_total`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use metrics::Counter;
use smallvec::SmallVec;

use super::{system_now, StoreError};
use crate::limiter::{admit, evaluate, expires_at, Check, Decision, Micros, State};

const SHARDS: usize = 64;

type Key = (u64, [u8; 16]);

#[derive(Debug)]
struct Entry {
    state: State,
    expires: Micros,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Key, Entry>,
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    cap_per_shard: usize,
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

impl MemoryStore {
    /// A store tracking at most about `max_subjects` (limit, subject) pairs.
    pub fn new(max_subjects: u64) -> MemoryStore {
        let cap = usize::try_from(max_subjects).unwrap_or(usize::MAX);
        metrics::gauge!(crate::metrics::STORE_SUBJECTS).set(0.0);
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            cap_per_shard: cap.div_ceil(SHARDS).max(1),
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
            self.evicted_expired
                .increment((before - shard.map.len()) as u64);
            left += shard.map.len();
        }
        metrics::gauge!(crate::metrics::STORE_SUBJECTS).set(left as f64);
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

    fn make_room(&self, shard: &mut Shard, now: Micros) {
        if shard.map.len() < self.cap_per_shard {
            return;
        }
        let before = shard.map.len();
        shard.map.retain(|_, e| e.expires > now);
        self.evicted_expired
            .increment((before - shard.map.len()) as u64);
        while shard.map.len() >= self.cap_per_shard {
            let victim = shard
                .map
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| *k);
            match victim {
                Some(k) => {
                    shard.map.remove(&k);
                    self.evicted_capacity.increment(1);
                }
                None => break,
            }
        }
    }

    /// Decides synchronously (the store never waits).
    pub fn decide_now(&self, checks: &[Check<'_>], now: Micros) -> Vec<Decision> {
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
                evaluate(&c.limit.policy, state, now)
            })
            .collect();
        let admitted = checks
            .iter()
            .zip(&decisions)
            .all(|(c, d)| d.allowed || c.limit.shadow);
        if admitted {
            for (((c, k), &g), d) in checks.iter().zip(&keys).zip(&slots).zip(&decisions) {
                if !d.allowed {
                    continue; // a shadow limit that would have denied is not charged
                }
                let shard = &mut *guards[g].1;
                let old = shard.map.remove(k).map(|e| e.state);
                if old.is_none() {
                    self.make_room(shard, now);
                }
                let state = admit(&c.limit.policy, old, now);
                let expires = expires_at(&c.limit.policy, &state);
                shard.map.insert(*k, Entry { state, expires });
            }
        }
        decisions
    }
}

impl super::Store for MemoryStore {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(self.decide_now(checks, at.unwrap_or_else(system_now)))
    }

    fn is_up(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{Algorithm, LimitConfig, Mode, OnMissing, SubjectSpec};
    use crate::limiter::{CompiledLimit, SubjectDigest};

    fn limit(algorithm: Algorithm) -> CompiledLimit {
        let cfg = LimitConfig {
            name: "l".into(),
            algorithm,
            limit: 5,
            period: std::time::Duration::from_secs(60),
            subject: SubjectSpec::Header(http::HeaderName::from_static("x-api-key")),
            burst: 5,
            cost: 1,
            mode: Mode::Enforce,
            on_missing: OnMissing::Ip,
        };
        CompiledLimit::compile(&Arc::from("r"), &cfg, "t")
    }

    #[test]
    fn a_key_cardinality_attack_stays_bounded() {
        let store = MemoryStore::new(1_000);
        let l = limit(Algorithm::Gcra);
        let now = 1_700_000_000_000_000;
        for i in 0..100_000u32 {
            let subject = SubjectDigest::of(b'h', format!("random-key-{i}").as_bytes());
            let d = store.decide_now(&[Check { limit: &l, subject }], now + u64::from(i));
            assert!(d[0].allowed);
        }
        let n = store.len();
        assert!(
            n <= 1_000 + SHARDS,
            "{n} subjects tracked with a cap of 1000"
        );
        assert!(n >= 900, "the cap evicted far more than needed: {n}");
        // Expired entries go on the next sweep.
        assert_eq!(store.sweep(now + 3_600_000_000), 0);
        assert!(store.is_empty());
    }

    #[test]
    fn decisions_are_all_or_nothing() {
        let store = MemoryStore::new(100);
        let a = limit(Algorithm::FixedWindow);
        let mut b_cfg = limit(Algorithm::FixedWindow);
        b_cfg.policy.limit = 1;
        b_cfg.uid ^= 1;
        let s = SubjectDigest::of(b'g', b"");
        let now = 1_000_000_000;
        let both = [
            Check {
                limit: &a,
                subject: s,
            },
            Check {
                limit: &b_cfg,
                subject: s,
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
