//! The health of one server, shared by every worker through atomics (no lock): passive health
//! (nginx's `max_fails` failures within `fail_timeout` take the server out for `fail_timeout`,
//! then one trial request decides) and the verdict of active checks.
//!
//! Times are milliseconds since the process's first use of [`now_ms`]; 0 means "never". A
//! healthy server costs a request one relaxed load and no clock read. Two workers failing the
//! same server at the same moment may both count or both start a window: the counts are
//! approximate by a request or so, as nginx's are between its workers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Milliseconds since the process's base instant, at least 1 (0 means "never").
pub fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// A duration in milliseconds, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a request may go to a server, by passive health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passive {
    /// Not out.
    Live,
    /// Out, and its `fail_timeout` has passed: one request may try it.
    TrialDue,
    /// Out (or its trial is under way).
    Out,
}

/// One server's health.
#[derive(Debug, Default)]
pub struct ServerHealth {
    /// Failures in the current window.
    fails: AtomicU32,
    /// When the current failure window started (0: no window).
    window_start: AtomicU64,
    /// Out by passive health until then (0: not out).
    down_until: AtomicU64,
    /// A trial request is under way.
    trial: AtomicBool,
    /// Out by active health checks.
    active_down: AtomicBool,
}

impl ServerHealth {
    /// Out by active checks.
    pub fn active_down(&self) -> bool {
        self.active_down.load(Ordering::Relaxed)
    }

    /// Whether the server counts as up (the `tollgate_upstream_server_up` value).
    pub fn is_up(&self) -> bool {
        !self.active_down() && self.down_until.load(Ordering::Relaxed) == 0
    }

    /// The passive state; `now` is read only when the server is out.
    pub fn passive(&self, now: impl FnOnce() -> u64) -> Passive {
        let until = self.down_until.load(Ordering::Relaxed);
        if until == 0 {
            Passive::Live
        } else if now() >= until && !self.trial.load(Ordering::Relaxed) {
            Passive::TrialDue
        } else {
            Passive::Out
        }
    }

    /// Claims the one trial request of a server whose `fail_timeout` has passed.
    pub fn claim_trial(&self) -> bool {
        self.trial
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends a trial without an outcome (the request was cancelled or failed for the client's
    /// reasons): the next request may try again.
    pub fn release_trial(&self) {
        self.trial.store(false, Ordering::Release);
    }

    /// A failure (connect, TLS, timeout, error before the response head). Returns whether the
    /// server just went out. `trial`: this request was the server's trial.
    pub fn failure(&self, max_fails: u32, fail_timeout: u64, now: u64, trial: bool) -> bool {
        if max_fails == 0 {
            return false;
        }
        let until = now.saturating_add(fail_timeout);
        if trial {
            self.down_until.store(until, Ordering::Relaxed);
            self.release_trial();
            return false;
        }
        let start = self.window_start.load(Ordering::Relaxed);
        let fails = if start == 0 || now.saturating_sub(start) > fail_timeout {
            self.window_start.store(now, Ordering::Relaxed);
            self.fails.store(1, Ordering::Relaxed);
            1
        } else {
            self.fails.fetch_add(1, Ordering::Relaxed).saturating_add(1)
        };
        fails >= max_fails
            && self
                .down_until
                .compare_exchange(0, until, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// A response head came back. Returns whether the server was out and is now back.
    pub fn success(&self, trial: bool) -> bool {
        if trial {
            self.release_trial();
        }
        if self.down_until.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.fails.store(0, Ordering::Relaxed);
        self.window_start.store(0, Ordering::Relaxed);
        self.down_until.swap(0, Ordering::Relaxed) != 0
    }

    /// Sets the active checks' verdict; returns whether it changed.
    pub fn set_active_down(&self, down: bool) -> bool {
        self.active_down.swap(down, Ordering::Relaxed) != down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_fails_within_fail_timeout_take_a_server_out_until_a_trial_succeeds() {
        let h = ServerHealth::default();
        assert!(!h.failure(2, 1000, 10, false));
        assert_eq!(h.passive(|| 10), Passive::Live);
        // The window has passed: this failure starts a new one.
        assert!(!h.failure(2, 1000, 2000, false));
        assert!(
            h.failure(2, 1000, 2500, false),
            "second failure within the window"
        );
        assert!(!h.is_up());
        assert_eq!(h.passive(|| 3000), Passive::Out);
        assert_eq!(h.passive(|| 3500), Passive::TrialDue);
        assert!(h.claim_trial());
        assert!(!h.claim_trial(), "one trial at a time");
        assert_eq!(h.passive(|| 3500), Passive::Out);
        // The trial fails: out for another fail_timeout.
        assert!(!h.failure(2, 1000, 3600, true));
        assert_eq!(h.passive(|| 4000), Passive::Out);
        assert_eq!(h.passive(|| 4600), Passive::TrialDue);
        assert!(h.claim_trial());
        assert!(h.success(true));
        assert!(h.is_up());
        assert_eq!(h.passive(|| 4700), Passive::Live);
    }

    #[test]
    fn max_fails_zero_never_takes_a_server_out() {
        let h = ServerHealth::default();
        for t in 1..10 {
            assert!(!h.failure(0, 1000, t, false));
        }
        assert!(h.is_up());
    }

    #[test]
    fn a_cancelled_trial_lets_the_next_request_try() {
        let h = ServerHealth::default();
        assert!(h.failure(1, 100, 10, false));
        assert!(h.claim_trial());
        h.release_trial();
        assert_eq!(h.passive(|| 200), Passive::TrialDue);
    }
}
