//! The circuit breaker in front of a remote store.
//!
//! After [`BREAKER_THRESHOLD`] failures in a row the circuit opens: decisions skip the store (a
//! `circuit_open` error, handled by `on_error`) for [`BREAKER_BACKOFF`]; then exactly one decision
//! probes, and its success closes the circuit. A health check's success closes it too, so an idle
//! gateway recovers without traffic.
//!
//! Cancellation-safe by construction: the probe slot is held by a [`Permit`] and released by its
//! `Drop`, so a probe whose client vanished mid-decision (HTTP/1 disconnect, HTTP/2 reset) frees
//! the slot and the next decision probes instead — the breaker can never stay open for good.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Failures in a row that open the circuit.
pub const BREAKER_THRESHOLD: u32 = 3;
/// How long an open circuit skips the store before a probe.
pub const BREAKER_BACKOFF: Duration = Duration::from_millis(500);

/// The breaker's state, shared by every decision of one store.
#[derive(Debug)]
pub struct Breaker {
    failures: AtomicU32,
    /// Microseconds since `epoch` until which the circuit is open (0: closed).
    open_until: AtomicU64,
    probing: AtomicBool,
    epoch: Instant,
}

/// What happened to the circuit after an outcome was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    Opened { failures: u32 },
    Closed,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }
}

impl Breaker {
    fn micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A permit to ask the store, or `None` while the circuit is open (or another decision is
    /// probing). Hold the permit across the store call and report through it.
    pub fn admit(&self) -> Option<Permit<'_>> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Permit {
                breaker: self,
                probe: false,
            });
        }
        if self.micros() < until {
            return None;
        }
        // Half-open: exactly one decision probes; its permit's Drop frees the slot.
        if self.probing.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Permit {
            breaker: self,
            probe: true,
        })
    }

    /// Records a success (a decision or a health check): closes the circuit.
    pub fn success(&self) -> Transition {
        // Read before writing: on the hot path every decision succeeds, and a load keeps the
        // cache line shared between workers where a store would bounce it.
        if self.failures.load(Ordering::Acquire) != 0 {
            self.failures.store(0, Ordering::Release);
        }
        if self.open_until.load(Ordering::Acquire) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
        {
            Transition::Closed
        } else {
            Transition::None
        }
    }

    /// Records a failure: opens the circuit at the threshold (again for a new back-off when it
    /// was already open, e.g. after a failed probe).
    pub fn failure(&self) -> Transition {
        let n = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if n < BREAKER_THRESHOLD {
            return Transition::None;
        }
        let backoff = u64::try_from(BREAKER_BACKOFF.as_micros()).unwrap_or(0);
        let until = self.micros().saturating_add(backoff).max(1);
        if self.open_until.swap(until, Ordering::AcqRel) == 0 {
            Transition::Opened { failures: n }
        } else {
            Transition::None
        }
    }

    /// Whether the last outcome was a success (no failure since).
    pub fn is_closed(&self) -> bool {
        self.failures.load(Ordering::Acquire) == 0
    }
}

/// Leave to ask the store once. Dropping it (with or without reporting) frees a probe slot.
#[derive(Debug)]
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
}

impl Permit<'_> {
    /// Whether this decision is the one probing a half-open circuit.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(b: &Breaker) {
        for _ in 0..BREAKER_THRESHOLD {
            let p = b.admit();
            assert!(p.is_some());
            b.failure();
        }
        assert!(
            b.admit().is_none(),
            "open after {BREAKER_THRESHOLD} failures"
        );
    }

    #[test]
    fn a_cancelled_probe_frees_the_slot() {
        let b = Breaker::default();
        open(&b);
        std::thread::sleep(BREAKER_BACKOFF + Duration::from_millis(20));
        let probe = b.admit().expect("half-open: one probe");
        assert!(probe.is_probe());
        assert!(b.admit().is_none(), "only one probe at a time");
        // The probe's client vanished: its future (and permit) is dropped without an outcome.
        drop(probe);
        let next = b.admit().expect("the next decision probes instead");
        assert!(next.is_probe());
        drop(next);
        assert_eq!(b.success(), Transition::Closed);
        let p = b.admit().expect("closed");
        assert!(!p.is_probe());
    }

    #[test]
    fn a_failed_probe_reopens_for_a_new_backoff() {
        let b = Breaker::default();
        open(&b);
        std::thread::sleep(BREAKER_BACKOFF + Duration::from_millis(20));
        let probe = b.admit().expect("probe");
        b.failure();
        drop(probe);
        assert!(
            b.admit().is_none(),
            "a failed probe opens the circuit again"
        );
        assert!(!b.is_closed());
    }

    #[test]
    fn a_health_check_closes_an_open_circuit() {
        let b = Breaker::default();
        open(&b);
        assert_eq!(b.success(), Transition::Closed);
        assert!(b.is_closed());
        assert!(b.admit().is_some());
    }
}
