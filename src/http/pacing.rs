//! `limit_rate` and `limit_rate_after` (#38 §2): the speed at which one response's body is
//! written to its client, as nginx's directives of the same names.
//!
//! Per response, as nginx's: each response has its own [`Pacer`], created when its body starts
//! and dropped with it. A per-subject rate shared across connections would need a store round
//! trip (or a shared lock) per write, and would let one of a client's downloads starve its
//! others; a client that opens more connections to go faster is what `limit_from`, the request
//! limits and `unit = "bytes"` quotas are for.
//!
//! The rule is a pure function of the pacer's state and the time it is given (no clock read
//! here): the first `after` bytes go at once; past them, a byte may go once its place in a
//! stream at `rate` bytes per second has come ("virtual time", as GCRA keeps it), with at most
//! one second of unused time kept as credit (a client that stalled then reads at full speed for
//! at most one second's worth of bytes, not for as long as it stalled). A grant is at most the
//! bytes asked for and at least one quantum (a tenth of a second at the rate, 1 byte to
//! [`MAX_QUANTUM`]) when any is due, so a slow rate is written in a few pieces a second rather
//! than a byte at a time. The fronts sleep on tokio's timer until [`Grant::Wait`]'s time, and
//! read the upstream only once what they hold is written: the upstream is read no faster than
//! the client is written.

use std::num::NonZeroU64;
use std::time::Duration;

/// The largest piece granted at once (the fronts write at most their buffer's bytes anyway).
pub const MAX_QUANTUM: u64 = 64 * 1024;

/// The credit a response may keep of time it did not use (a client that stalled).
const CREDIT: Duration = Duration::from_secs(1);

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A response's speed limit: `rate` bytes a second once `after` bytes are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// `limit_rate`: bytes per second.
    pub rate: NonZeroU64,
    /// `limit_rate_after`: body bytes sent at full speed first.
    pub after: u64,
}

/// What a response may write now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// This many bytes (at least 1, at most what was asked), counted as sent.
    Now(usize),
    /// Nothing before this time (the pacer's time: since its start).
    Wait(Duration),
}

/// One response's pacing state.
#[derive(Debug, Clone)]
pub struct Pacer {
    pace: Pace,
    /// Bytes still to go at full speed (`after` minus what was sent).
    free: u64,
    /// The time the next paced byte is due at (since the start), in nanoseconds.
    due: u64,
    /// The piece granted when any is due.
    quantum: u64,
}

impl Pacer {
    /// A pacer whose time starts now (time 0).
    pub fn new(pace: Pace) -> Pacer {
        let quantum = (pace.rate.get() / 10).clamp(1, MAX_QUANTUM);
        Pacer {
            pace,
            free: pace.after,
            due: 0,
            quantum,
        }
    }

    /// How many of `want` bytes may be written at `now` (the time since the pacer's start),
    /// or when to ask again. A grant counts its bytes as sent. `want = 0` is granted 0.
    pub fn take(&mut self, now: Duration, want: usize) -> Grant {
        let want64 = u64::try_from(want).unwrap_or(u64::MAX);
        if want64 == 0 {
            return Grant::Now(0);
        }
        if self.free > 0 {
            let n = want64.min(self.free);
            self.free -= n;
            return Grant::Now(usize::try_from(n).unwrap_or(want));
        }
        let now_ns = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        let credit_ns = u64::try_from(CREDIT.as_nanos()).unwrap_or(u64::MAX);
        // Time unused beyond the credit is lost.
        let due = self.due.max(now_ns.saturating_sub(credit_ns));
        if due > now_ns {
            self.due = due;
            return Grant::Wait(Duration::from_nanos(due));
        }
        let rate = u128::from(self.pace.rate.get());
        // The bytes whose time has come (the credit included), at least one quantum.
        let owed = u128::from(now_ns - due) * rate / NANOS_PER_SEC;
        let owed = u64::try_from(owed).unwrap_or(u64::MAX);
        let n = want64.min(owed.max(self.quantum));
        // Their time: n / rate seconds, rounded up (never faster than the rate).
        let cost = (u128::from(n) * NANOS_PER_SEC).div_ceil(rate);
        self.due = due.saturating_add(u64::try_from(cost).unwrap_or(u64::MAX));
        Grant::Now(usize::try_from(n).unwrap_or(want))
    }
}

/// A [`Pacer`] on tokio's clock, for the fronts: its time starts when it is made (the body's
/// start).
#[derive(Debug)]
pub struct Paced {
    pacer: Pacer,
    start: tokio::time::Instant,
}

impl Paced {
    /// Pacing at `pace` from now.
    pub fn new(pace: Pace) -> Paced {
        Paced {
            pacer: Pacer::new(pace),
            start: tokio::time::Instant::now(),
        }
    }

    /// [`Pacer::take`] now: the bytes granted, or the instant to ask again (`None`: past what
    /// the clock can say, never in practice — the caller waits for ever).
    pub fn take(&mut self, want: usize) -> Result<usize, Option<tokio::time::Instant>> {
        match self.pacer.take(self.start.elapsed(), want) {
            Grant::Now(n) => Ok(n),
            Grant::Wait(at) => Err(self.start.checked_add(at)),
        }
    }

    /// Waits until some of `want` bytes may go: how many (at least 1 when `want` is not 0).
    /// Cancellation-safe: dropped mid-sleep, nothing was granted.
    pub async fn grant(&mut self, want: usize) -> usize {
        loop {
            match self.take(want) {
                Ok(n) => return n,
                Err(Some(at)) => tokio::time::sleep_until(at).await,
                Err(None) => std::future::pending::<()>().await,
            }
        }
    }
}

/// How many of `want` bytes may go now, waiting for them when `paced` (a response without
/// `limit_rate` pays this one branch).
pub async fn allow(paced: &mut Option<Paced>, want: usize) -> usize {
    match paced {
        None => want,
        Some(p) => p.grant(want).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(rate: u64, after: u64) -> Pace {
        Pace {
            rate: NonZeroU64::new(rate).unwrap(),
            after,
        }
    }

    /// Sends `total` bytes in writes of at most `piece`, sleeping as told: the time it took.
    fn run(p: Pace, total: u64, piece: usize) -> Duration {
        let mut pacer = Pacer::new(p);
        let mut now = Duration::ZERO;
        let mut left = total;
        let mut steps = 0u64;
        while left > 0 {
            steps += 1;
            assert!(steps < 10_000_000, "no progress");
            let want = usize::try_from(left.min(piece as u64)).unwrap();
            match pacer.take(now, want) {
                Grant::Now(n) => {
                    assert!(n >= 1 && n <= want, "grant {n} of {want}");
                    left -= n as u64;
                }
                Grant::Wait(at) => {
                    assert!(at > now, "a wait in the past: {at:?} at {now:?}");
                    now = at;
                }
            }
        }
        now
    }

    #[test]
    fn a_body_past_after_takes_its_bytes_over_the_rate() {
        // 256 KiB at 64 KiB/s after 64 KiB: 3 s, less the first quantum's tenth of a second.
        let t = run(pace(64 * 1024, 64 * 1024), 256 * 1024, 16 * 1024);
        assert!(
            t >= Duration::from_millis(2_850) && t <= Duration::from_secs(3),
            "{t:?}"
        );
        // Without `after`: 4 s.
        let t = run(pace(64 * 1024, 0), 256 * 1024, 16 * 1024);
        assert!(t >= Duration::from_millis(3_850) && t <= Duration::from_secs(4));
    }

    #[test]
    fn the_after_bytes_go_at_once_and_a_straddling_write_is_split() {
        let mut p = Pacer::new(pace(1000, 150));
        assert_eq!(p.take(Duration::ZERO, 100), Grant::Now(100));
        // 50 free bytes left: granted alone, the rest paced.
        assert_eq!(p.take(Duration::ZERO, 100), Grant::Now(50));
        // A quantum (100 bytes: a tenth of a second) at once, then a wait of its time.
        assert_eq!(p.take(Duration::ZERO, 500), Grant::Now(100));
        assert_eq!(
            p.take(Duration::ZERO, 500),
            Grant::Wait(Duration::from_millis(100))
        );
        assert_eq!(p.take(Duration::from_millis(100), 500), Grant::Now(100));
        assert_eq!(p.take(Duration::ZERO, 0), Grant::Now(0));
    }

    #[test]
    fn a_stalled_client_keeps_one_second_of_credit_not_more() {
        let mut p = Pacer::new(pace(1000, 0));
        assert_eq!(p.take(Duration::ZERO, 100), Grant::Now(100));
        // Ten seconds later: one second's bytes (1000) at once, not ten seconds' (10000).
        assert_eq!(p.take(Duration::from_secs(10), 100_000), Grant::Now(1000));
        // The credit spent: one quantum (a tenth of a second), then nothing until its time.
        assert_eq!(p.take(Duration::from_secs(10), 100_000), Grant::Now(100));
        assert_eq!(
            p.take(Duration::from_secs(10), 100_000),
            Grant::Wait(Duration::from_millis(10_100))
        );
    }

    #[test]
    fn the_long_run_rate_holds_with_small_and_odd_pieces() {
        // 1 byte a second: one byte each second, never faster.
        let t = run(pace(1, 0), 5, 1000);
        assert_eq!(t, Duration::from_secs(4));
        // 3 bytes/s in writes of 7: 30 bytes in 10 s (less the first byte's third).
        let t = run(pace(3, 0), 30, 7);
        assert!(
            t >= Duration::from_millis(9_600) && t <= Duration::from_secs(10),
            "{t:?}"
        );
        // 1000003 B/s with 4096-byte pieces: 1 s for a second's bytes, to within a quantum.
        let t = run(pace(1_000_003, 0), 1_000_003, 4096);
        assert!(
            t >= Duration::from_millis(890) && t <= Duration::from_secs(1),
            "{t:?}"
        );
    }

    #[test]
    fn large_values_never_overflow() {
        let mut p = Pacer::new(pace(u64::MAX, u64::MAX));
        assert_eq!(p.take(Duration::ZERO, usize::MAX), Grant::Now(usize::MAX));
        let mut p = Pacer::new(pace(u64::MAX, 0));
        // A quantum is at most MAX_QUANTUM; the time it takes rounds up to 1 ns.
        assert_eq!(
            p.take(Duration::ZERO, usize::MAX),
            Grant::Now(MAX_QUANTUM as usize)
        );
        assert_eq!(
            p.take(Duration::ZERO, usize::MAX),
            Grant::Wait(Duration::from_nanos(1))
        );
        assert!(matches!(p.take(Duration::MAX, usize::MAX), Grant::Now(n) if n >= 1));
        let mut p = Pacer::new(pace(1, 0));
        // A time far past the start: the credit is one second's bytes at most.
        assert_eq!(p.take(Duration::MAX, usize::MAX), Grant::Now(1));
        let mut p = Pacer::new(pace(1, 0));
        assert_eq!(p.take(Duration::ZERO, usize::MAX), Grant::Now(1));
        assert_eq!(
            p.take(Duration::ZERO, 1),
            Grant::Wait(Duration::from_secs(1))
        );
    }
}
