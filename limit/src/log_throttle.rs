//! Rate-limited warnings: a failure that repeats on every request (a store outage, a dead
//! upstream) is logged at most once a second per kind, with the number of lines left out.
//!
//! Lock-free and allocation-free, so it can sit on the request path: one atomic load when the
//! line is suppressed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// At most one line per this many milliseconds, per kind.
const EVERY_MS: u64 = 1_000;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One kind of repeated warning.
#[derive(Debug, Default)]
pub struct Throttle {
    /// 1 + the millisecond (since the process epoch) of the last line logged; 0: never.
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    pub const fn new() -> Throttle {
        Throttle {
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be logged now, `n` lines having been left out since the last
    /// one; `None` (and the line counted as left out) otherwise.
    pub fn allow(&self) -> Option<u64> {
        let now = now_ms().saturating_add(1);
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < EVERY_MS {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match self
            .last
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => Some(self.suppressed.swap(0, Ordering::AcqRel)),
            Err(_) => {
                // Another thread logged this very moment.
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A fixed set of throttles, one per kind index.
#[derive(Debug)]
pub struct Throttles<const N: usize>([Throttle; N]);

impl<const N: usize> Throttles<N> {
    pub const fn new() -> Self {
        Throttles([const { Throttle::new() }; N])
    }

    /// [`Throttle::allow`] for kind `i` (indices past the end share the last throttle).
    pub fn allow(&self, i: usize) -> Option<u64> {
        self.0.get(i).or(self.0.last())?.allow()
    }
}

impl<const N: usize> Default for Throttles<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_with_the_count_left_out() {
        let t = Throttle::new();
        assert_eq!(t.allow(), Some(0));
        for _ in 0..99 {
            assert_eq!(t.allow(), None);
        }
        std::thread::sleep(std::time::Duration::from_millis(1_050));
        assert_eq!(t.allow(), Some(99));
        assert_eq!(t.allow(), None);
    }

    #[test]
    fn kinds_are_throttled_apart() {
        let t: Throttles<2> = Throttles::new();
        assert_eq!(t.allow(0), Some(0));
        assert_eq!(t.allow(1), Some(0));
        assert_eq!(t.allow(0), None);
        assert_eq!(t.allow(7), None, "past the end: the last kind's throttle");
    }
}
