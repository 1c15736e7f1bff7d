//! The time a store decides at, chosen when the store is built.
//!
//! [`Clock`] is what a store asks of time: [`Clock::injected`], the decision time when someone
//! other than the store sets it, and [`Clock::monotonic`], a forward-only time for what the
//! gateway measures itself (the deny cache's ages). Two implementations:
//!
//! - [`SystemClock`], production: the in-process store reads the system clock, the Redis store
//!   lets the script read Redis `TIME` (so gateways with skewed clocks agree), and the deny cache
//!   ages on the process's monotonic clock.
//! - `ManualClock`, tests: a time moved by hand. Every decision — batched, coalesced, cached or
//!   not, in process or in a Redis script (the time is passed as an argument) — runs at the time
//!   the test set, and the deny cache in front of a Redis store ages on it too, so the
//!   production layering runs under injected time. It exists only in the crate's own unit tests
//!   and with the `test-clock` cargo feature (on for `cargo test` through the crate's
//!   dev-dependency on itself; never for a production build).
//!
//! Stores hold an [`AnyClock`], the closed set of the two, rather than a generic parameter or an
//! `Arc<dyn Clock>`: the gateway picks its clock at start-up (a `test-clock` binary runs on the
//! system clock unless a test asks for a manual one, see `tollgate::runtime::test_clock`), a generic would
//! spread through every store type and the snapshot, and a `dyn` call would be an indirect call
//! per decision. Without the feature `AnyClock` has the single variant `System`: it is zero
//! sized and each `match` folds to the system clock's code, so a production build pays exactly
//! what a hard-coded `SystemTime::now()` would (no allocation, no dispatch, no branch).

#[cfg(any(test, feature = "test-clock"))]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(any(test, feature = "test-clock"))]
use std::sync::Arc;

use crate::Micros;

/// Where a store's decisions take their time from.
pub trait Clock: Send + Sync {
    /// The injected decision time (µs since the Unix epoch), or `None` for the store's own
    /// (the system clock in process, Redis `TIME` in a script).
    fn injected(&self) -> Option<Micros>;

    /// A time that only moves forward, for what the gateway measures itself (the deny cache's
    /// ages): µs on the process's monotonic clock, or the injected time. Its origin is
    /// arbitrary: compare its values with each other only.
    fn monotonic(&self) -> Micros;

    /// The decision time of an in-process store: the injected time or the system clock.
    fn now(&self) -> Micros {
        self.injected().unwrap_or_else(system_now)
    }
}

/// Production time: the system clock, Redis `TIME`, the process's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn injected(&self) -> Option<Micros> {
        None
    }

    fn monotonic(&self) -> Micros {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let start = START.get_or_init(std::time::Instant::now);
        u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to; clones share one time (tests and the `test-clock`
/// feature only).
#[cfg(any(test, feature = "test-clock"))]
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

#[cfg(any(test, feature = "test-clock"))]
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

#[cfg(any(test, feature = "test-clock"))]
impl Clock for ManualClock {
    fn injected(&self) -> Option<Micros> {
        Some(ManualClock::now(self))
    }

    fn monotonic(&self) -> Micros {
        ManualClock::now(self)
    }
}

/// The clock a store is built on: [`SystemClock`] in production; a `ManualClock` too in tests
/// and with the `test-clock` feature (see the module doc for why an enum and not a generic).
#[derive(Debug, Clone, Default)]
pub enum AnyClock {
    #[default]
    System,
    #[cfg(any(test, feature = "test-clock"))]
    Manual(ManualClock),
}

impl Clock for AnyClock {
    #[inline]
    fn injected(&self) -> Option<Micros> {
        match self {
            AnyClock::System => SystemClock.injected(),
            #[cfg(any(test, feature = "test-clock"))]
            AnyClock::Manual(m) => Clock::injected(m),
        }
    }

    #[inline]
    fn monotonic(&self) -> Micros {
        match self {
            AnyClock::System => SystemClock.monotonic(),
            #[cfg(any(test, feature = "test-clock"))]
            AnyClock::Manual(m) => Clock::monotonic(m),
        }
    }
}

// A production build's clock is nothing at all: stores carry no clock data and every
// decision's `match` has one arm.
#[cfg(not(any(test, feature = "test-clock")))]
const _: () = assert!(std::mem::size_of::<AnyClock>() == 0);

#[cfg(any(test, feature = "test-clock"))]
impl From<ManualClock> for AnyClock {
    fn from(m: ManualClock) -> AnyClock {
        AnyClock::Manual(m)
    }
}

/// The current time in microseconds since the Unix epoch.
pub fn system_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
