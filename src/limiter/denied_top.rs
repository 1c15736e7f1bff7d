//! A space-saving sketch (Metwally et al., 2005) of denied subjects over a sliding window.
//!
//! Constant memory whatever the traffic: at most [`CAPACITY`] subjects, each with one counter per
//! [`BUCKET_SECS`]-second bucket of the last [`BUCKETS`]. A denial of a tracked subject adds one
//! to its current bucket; a new subject takes a free slot, or replaces the subject with the
//! fewest denials and inherits its count plus one (so counts are upper bounds, and any subject
//! denied more than total/`CAPACITY` times in the window is guaranteed to be listed). As time
//! passes the oldest bucket is cleared, and subjects left with no denials free their slot.
//!
//! Only the denied path records, under a mutex of its own limit held for one scan of 64 slots;
//! the memory (about 4 KB) is allocated at the limit's first denial, so the 10,000 limits of a
//! large config cost a pointer each until they deny. Subjects are kept as their digests (the
//! store's key hash) and, for address subjects, the address: never a raw API key.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::SubjectDigest;

/// Subjects tracked per limit.
pub const CAPACITY: usize = 64;
/// Buckets of the sliding window.
pub const BUCKETS: usize = 5;
/// Seconds per bucket.
pub const BUCKET_SECS: u64 = 60;
/// The window `/-/top` reports (`window_s`): the current bucket and the four before it.
pub const WINDOW_SECS: u64 = BUCKET_SECS * BUCKETS as u64;

/// What kind of subject was denied (and its address, for address subjects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// The client's network (an `ip` limit, or a `header:`/`query:` limit falling back to it),
    /// under the limit's prefixes (a whole address is a /32 or /128).
    Ip(ipnet::IpNet),
    Header,
    Query,
    Global,
    /// A subject of parts (or of a kind other than the four above): each part as shown, secret
    /// values hashed (see [`crate::subject::shown_parts`]).
    Parts(std::sync::Arc<[super::ShownPart]>),
}

impl Who {
    /// The `subject` field of `/-/top`.
    pub fn kind(&self) -> &'static str {
        match self {
            Who::Ip(_) => "ip",
            Who::Header => "header",
            Who::Query => "query",
            Who::Global => "global",
            Who::Parts(_) => "parts",
        }
    }
}

/// One subject of the top list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub subject: SubjectDigest,
    pub who: Who,
    /// Denials in the window (an upper bound: see the module comment).
    pub count: u64,
}

#[derive(Debug)]
struct Slot {
    subject: SubjectDigest,
    who: Who,
    counts: [u32; BUCKETS],
}

impl Slot {
    fn total(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }
}

#[derive(Debug)]
struct Sketch {
    slots: Vec<Slot>,
    /// The current bucket, counted in buckets since the process epoch.
    bucket: u64,
}

impl Sketch {
    /// Moves the window to `bucket`, clearing the buckets it leaves behind.
    fn advance(&mut self, bucket: u64) {
        if bucket <= self.bucket {
            return;
        }
        let steps = (bucket - self.bucket).min(BUCKETS as u64);
        for k in 1..=steps {
            let i = bucket_index(self.bucket.saturating_add(k));
            for s in &mut self.slots {
                s.counts[i] = 0;
            }
        }
        self.bucket = bucket;
        self.slots.retain(|s| s.total() > 0);
    }
}

fn bucket_index(bucket: u64) -> usize {
    // `BUCKETS` is small: the remainder fits any usize.
    usize::try_from(bucket % BUCKETS as u64).unwrap_or(0)
}

/// The sketch of one limit. Empty (a pointer) until the first denial.
#[derive(Debug, Default)]
pub struct DeniedTop {
    inner: Mutex<Option<Box<Sketch>>>,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Seconds since the process epoch (monotonic).
pub fn now_secs() -> u64 {
    epoch().elapsed().as_secs()
}

impl DeniedTop {
    /// Counts one denial of `subject`, now.
    pub fn record(&self, subject: SubjectDigest, who: Who) {
        self.record_at(subject, who, now_secs());
    }

    /// Counts one denial of `subject` at `secs` (seconds on a monotonic clock).
    pub fn record_at(&self, subject: SubjectDigest, who: Who, secs: u64) {
        let bucket = secs / BUCKET_SECS;
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let sketch = guard.get_or_insert_with(|| {
            Box::new(Sketch {
                slots: Vec::with_capacity(CAPACITY),
                bucket,
            })
        });
        sketch.advance(bucket);
        let cur = bucket_index(sketch.bucket);
        if let Some(s) = sketch.slots.iter_mut().find(|s| s.subject == subject) {
            s.counts[cur] = s.counts[cur].saturating_add(1);
            return;
        }
        if sketch.slots.len() < CAPACITY {
            let mut counts = [0; BUCKETS];
            counts[cur] = 1;
            sketch.slots.push(Slot {
                subject,
                who,
                counts,
            });
            return;
        }
        // Full: the newcomer replaces the least-denied subject and inherits its count.
        let Some(min) = sketch.slots.iter_mut().min_by_key(|s| s.total()) else {
            return;
        };
        let inherited = u32::try_from(min.total()).unwrap_or(u32::MAX);
        let mut counts = [0; BUCKETS];
        counts[cur] = inherited.saturating_add(1);
        *min = Slot {
            subject,
            who,
            counts,
        };
    }

    /// The subjects denied in the window, most denied first.
    pub fn top(&self) -> Vec<Denied> {
        self.top_at(now_secs())
    }

    /// [`Self::top`] at `secs`.
    pub fn top_at(&self, secs: u64) -> Vec<Denied> {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sketch) = guard.as_mut() else {
            return Vec::new();
        };
        sketch.advance(secs / BUCKET_SECS);
        let mut out: Vec<Denied> = sketch
            .slots
            .iter()
            .map(|s| Denied {
                subject: s.subject,
                who: s.who.clone(),
                count: s.total(),
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(a.subject.0.cmp(&b.subject.0)));
        out
    }

    /// Subjects tracked now (at most [`CAPACITY`]).
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |s| s.slots.len())
    }

    /// Whether no subject is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn key(i: u32) -> SubjectDigest {
        SubjectDigest::of(b'h', format!("key-{i}").as_bytes())
    }

    #[test]
    fn counts_and_orders_denials() {
        let t = DeniedTop::default();
        assert!(t.top_at(0).is_empty());
        for (i, n) in [(1, 3), (2, 7), (3, 5)] {
            for _ in 0..n {
                t.record_at(key(i), Who::Header, 10);
            }
        }
        let top = t.top_at(10);
        let got: Vec<(SubjectDigest, u64)> = top.iter().map(|d| (d.subject, d.count)).collect();
        assert_eq!(got, vec![(key(2), 7), (key(3), 5), (key(1), 3)]);
    }

    #[test]
    fn stays_bounded_and_keeps_the_heavy_hitters_among_100_000_subjects() {
        let t = DeniedTop::default();
        let heavy: Vec<SubjectDigest> = (0..3u8)
            .map(|i| SubjectDigest::of(b'i', &[10, 0, 0, i]))
            .collect();
        for i in 0..100_000u32 {
            t.record_at(key(i), Who::Header, 5);
            if i % 20 == 0 {
                for h in &heavy {
                    t.record_at(*h, Who::Ip(IpAddr::from([10, 0, 0, 1]).into()), 5);
                }
            }
        }
        assert_eq!(t.len(), CAPACITY, "never more than {CAPACITY} subjects");
        let top = t.top_at(5);
        assert_eq!(top.len(), CAPACITY);
        let first: Vec<SubjectDigest> = top[..3].iter().map(|d| d.subject).collect();
        for h in &heavy {
            assert!(first.contains(h), "a heavy hitter is in the top three");
        }
        // Counts are upper bounds, never below the true count (5,000 each).
        assert!(top[..3].iter().all(|d| d.count >= 5_000));
    }

    #[test]
    fn the_window_slides() {
        let t = DeniedTop::default();
        t.record_at(key(1), Who::Header, 0);
        t.record_at(key(1), Who::Header, BUCKET_SECS * 2);
        t.record_at(key(2), Who::Header, BUCKET_SECS * 2);
        assert_eq!(t.top_at(BUCKET_SECS * 4)[0].count, 2);
        // The first denial's bucket leaves the window.
        let top = t.top_at(WINDOW_SECS);
        assert_eq!(top.iter().map(|d| d.count).collect::<Vec<_>>(), [1, 1]);
        // Long after: nothing left, and the slots are freed.
        assert!(t.top_at(WINDOW_SECS * 10).is_empty());
        assert!(t.is_empty());
    }
}
