//! A local cache of denials, so a client hammering a closed limit costs no Redis round trip.
//!
//! Exact, not approximate: a denied request changes no state, and admitted requests only push a
//! limit's next opening later, so a set of limits that denied a request at `t` with retry-after
//! `r` denies every identical request before `t + r`. The cache keeps that verdict until then —
//! measured from when the request was *sent* to Redis, which is no later than Redis's own clock
//! read, so the entry never outlives the real denial. Only denials by enforcing limits are cached.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use metrics::Counter;

use crate::limiter::{Check, Decision};

const SHARDS: usize = 16;
/// Entries per shard before new denials are no longer cached (after expired ones are swept).
const CAP_PER_SHARD: usize = 8192;

/// The identity of a request's set of checks: first limit and subject exactly, the rest hashed.
type Key = (u64, [u8; 16], u64);

struct Entry {
    until: Instant,
    sent: Instant,
    decisions: Vec<Decision>,
}

/// The cache.
pub struct DenyCache {
    shards: Box<[Mutex<HashMap<Key, Entry>>]>,
    hits: Counter,
}

fn key(checks: &[Check<'_>]) -> Option<Key> {
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
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hits: metrics::counter!(crate::metrics::DENY_CACHE_HITS),
        }
    }
}

impl DenyCache {
    /// The cached denial for these checks, with times brought up to now.
    pub fn lookup(&self, checks: &[Check<'_>]) -> Option<Vec<Decision>> {
        let k = key(checks)?;
        let now = Instant::now();
        let mut map = self.shards[shard(&k)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let entry = map.get(&k)?;
        if now >= entry.until {
            map.remove(&k);
            return None;
        }
        let elapsed = u64::try_from(now.duration_since(entry.sent).as_micros()).unwrap_or(u64::MAX);
        self.hits.increment(1);
        Some(
            entry
                .decisions
                .iter()
                .map(|d| Decision {
                    retry_after: if d.allowed {
                        0
                    } else {
                        d.retry_after.saturating_sub(elapsed).max(1)
                    },
                    reset_after: d.reset_after.saturating_sub(elapsed),
                    delay: 0,
                    ..*d
                })
                .collect(),
        )
    }

    /// Remembers a denial by an enforcing limit; `sent` is when the request went to the store.
    pub fn remember(&self, checks: &[Check<'_>], decisions: &[Decision], sent: Instant) {
        let wait = checks
            .iter()
            .zip(decisions)
            .filter(|(c, d)| !c.limit.shadow && !d.allowed)
            .map(|(_, d)| d.retry_after)
            .max();
        let (Some(wait), Some(k)) = (wait, key(checks)) else {
            return;
        };
        let until = sent + Duration::from_micros(wait);
        let mut map = self.shards[shard(&k)]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if map.len() >= CAP_PER_SHARD {
            let now = Instant::now();
            map.retain(|_, e| e.until > now);
            if map.len() >= CAP_PER_SHARD {
                return;
            }
        }
        map.insert(
            k,
            Entry {
                until,
                sent,
                decisions: decisions.to_vec(),
            },
        );
    }
}
