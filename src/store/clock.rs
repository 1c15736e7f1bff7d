//! The time a store decides at, chosen when the store is built.
//!
//! In production the in-process store reads the system clock and the Redis store lets the script
//! read Redis `TIME` (so gateways with skewed clocks agree). Tests build stores on a
//! [`ManualClock`] instead and move it by hand: every decision — batched, coalesced, cached or
//! not — then runs at the time the test set, on every store alike.
//! The deny cache ages its entries on the same clock ([`Clock::monotonic`]), so the production
//! layering runs under injected time too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::limiter::Micros;

/// Where a store's decisions take their time from.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The store's own time: the system clock in process, Redis `TIME` in Redis.
    #[default]
    Store,
    /// Time set by hand (tests).
    Manual(ManualClock),
}

impl Clock {
    /// The injected time, or `None` for the store's own.
    pub fn injected(&self) -> Option<Micros> {
        match self {
            Clock::Store => None,
            Clock::Manual(m) => Some(m.now()),
        }
    }

    /// A time that only moves forward, for what the gateway measures itself (the deny cache's
    /// ages): µs on the process's monotonic clock, or the injected time. Its origin is
    /// arbitrary: compare its values with each other only.
    pub fn monotonic(&self) -> Micros {
        match self {
            Clock::Store => {
                static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
                let start = START.get_or_init(std::time::Instant::now);
                u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
            }
            Clock::Manual(m) => m.now(),
        }
    }
}

/// A clock that moves only when told to; clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `now` (microseconds since the Unix epoch).
    pub fn new(now: Micros) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(now)))
    }

    pub fn now(&self) -> Micros {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::Release);
    }

    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::AcqRel);
    }
}

/// The current time in microseconds since the Unix epoch.
pub fn system_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
