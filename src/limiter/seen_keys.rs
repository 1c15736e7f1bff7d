//! The keys a plan's limit with parts counts for each consumer (`subject = ["json:model"]`:
//! one count per consumer and model), so that usage can list them and a reset can reach them.
//!
//! A compound subject is counted under a hash of its parts' values: the store's keys cannot be
//! read back into a consumer and a model, so the gateway remembers, per limit and consumer, the
//! combinations it has counted, with the parts as `/-/top` shows them. Bounded: the
//! [`PER_CONSUMER`] most recently counted combinations of each consumer, and [`TOTAL`]
//! combinations per limit (past it, new ones are not remembered: support can still name them).
//! Kept in this process (a gateway lists what it has counted since it started); carried over a
//! reload by the limit's scope and name, and shared by every route's copy of a limit.
//! Recording takes one sharded lock and allocates only for a combination not yet remembered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::{ShownPart, SubjectDigest};

/// Combinations remembered per consumer and limit: the most recently counted.
pub const PER_CONSUMER: usize = 32;
/// Combinations remembered per limit, all consumers together.
pub const TOTAL: usize = 65_536;
const SHARDS: usize = 16;

/// One remembered combination: its key's subject and its parts as shown.
#[derive(Debug, Clone)]
pub struct SeenKey {
    pub subject: SubjectDigest,
    pub parts: Arc<[ShownPart]>,
    /// The recording's order (the oldest goes first when a consumer has too many).
    tick: u64,
}

type Shard = HashMap<[u8; 16], Vec<SeenKey>, foldhash::fast::RandomState>;

/// The combinations a limit counted, per consumer (see the module comment).
/// Every limit has one (a plan's limit shares it across routes), most never record: the
/// shards are allocated at the first recording, so 10,000 routes do not hold 10,000 empty
/// tables (see BENCHMARKS.md, idle RSS).
#[derive(Debug, Default)]
pub struct SeenKeys {
    shards: OnceLock<Box<[Mutex<Shard>]>>,
    total: AtomicUsize,
    tick: AtomicU64,
}

impl SeenKeys {
    fn shard(&self, consumer: &SubjectDigest) -> MutexGuard<'_, Shard> {
        let shards = self
            .shards
            .get_or_init(|| (0..SHARDS).map(|_| Mutex::default()).collect());
        let i = usize::from(consumer.0[0]) % SHARDS;
        shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `subject` was counted for `consumer`; `parts` is called only for a
    /// combination not yet remembered.
    pub fn record(
        &self,
        consumer: SubjectDigest,
        subject: SubjectDigest,
        parts: impl FnOnce() -> Vec<ShownPart>,
    ) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(&consumer);
        if let Some(keys) = shard.get_mut(&consumer.0) {
            if let Some(k) = keys.iter_mut().find(|k| k.subject == subject) {
                k.tick = tick;
                return;
            }
            let key = SeenKey {
                subject,
                parts: parts().into(),
                tick,
            };
            if keys.len() >= PER_CONSUMER {
                if let Some(oldest) = keys.iter_mut().min_by_key(|k| k.tick) {
                    *oldest = key;
                }
                return;
            }
            if self.total.load(Ordering::Relaxed) >= TOTAL {
                return;
            }
            self.total.fetch_add(1, Ordering::Relaxed);
            keys.push(key);
            return;
        }
        if self.total.load(Ordering::Relaxed) >= TOTAL {
            return;
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        shard.insert(
            consumer.0,
            vec![SeenKey {
                subject,
                parts: parts().into(),
                tick,
            }],
        );
    }

    /// The combinations remembered for `consumer`, most recently counted first.
    pub fn of(&self, consumer: &SubjectDigest) -> Vec<SeenKey> {
        if self.shards.get().is_none() {
            return Vec::new();
        }
        let mut keys = self
            .shard(consumer)
            .get(&consumer.0)
            .cloned()
            .unwrap_or_default();
        keys.sort_by_key(|k| std::cmp::Reverse(k.tick));
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Shown;

    fn part(v: &str) -> Vec<ShownPart> {
        vec![ShownPart {
            part: "json:model".into(),
            value: Shown::Plain(v.into()),
        }]
    }

    #[test]
    fn a_consumer_keeps_its_most_recent_combinations() {
        let seen = SeenKeys::default();
        let c = SubjectDigest([1; 16]);
        for i in 0..(PER_CONSUMER as u8 + 5) {
            seen.record(c, SubjectDigest([i; 16]), || part(&i.to_string()));
        }
        // The first one counted again: it is the most recent.
        seen.record(c, SubjectDigest([5; 16]), || unreachable!("remembered"));
        let keys = seen.of(&c);
        assert_eq!(keys.len(), PER_CONSUMER);
        assert_eq!(keys[0].subject, SubjectDigest([5; 16]));
        assert!(keys.iter().all(|k| k.subject.0[0] >= 5));
        assert!(seen.of(&SubjectDigest([2; 16])).is_empty());
    }
}
