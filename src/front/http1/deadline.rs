//! One timer per connection for the deadlines it meets in turn (the wait for a head; the
//! route's upstream timeout on each write of the request and on the response head; the
//! response body's `idle_timeout` on each read from the upstream and write to the client),
//! re-armed lazily.
//!
//! A fresh `tokio::time::timeout` per request inserts a timer into the runtime's wheel and
//! removes it again, and an insertion earlier than the wheel's next wake-up wakes the driver
//! through its eventfd: a `write` system call and an extra turn of the event loop, measured at
//! about one every two requests (`perf record -e syscalls:sys_enter_write`, see
//! BENCHMARKS.md). Here a connection keeps one timer registered: a new deadline later than the
//! armed one (the usual case: each request's deadline is later than the last one's) only
//! updates a number, and when the timer fires early it is re-armed once for the deadline then
//! in force. A deadline earlier than the armed one re-arms the timer at once.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

/// How far ahead an idle timer is parked (it is re-armed before it matters).
const PARKED: Duration = Duration::from_secs(24 * 3600);

/// A connection's timer.
pub struct Deadline {
    timer: Pin<Box<Sleep>>,
}

/// The deadline passed before the work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl Default for Deadline {
    fn default() -> Self {
        Deadline {
            timer: Box::pin(sleep_until(Instant::now() + PARKED)),
        }
    }
}

impl Deadline {
    /// Resolves once `at` has passed, never before. Cancel-safe: dropped, it leaves the timer
    /// armed for whichever deadline comes next.
    pub async fn until(&mut self, at: Instant) {
        loop {
            if self.timer.deadline() > at {
                self.timer.as_mut().reset(at);
            }
            (&mut self.timer).await;
            if Instant::now() >= at {
                return;
            }
            self.timer.as_mut().reset(at);
        }
    }

    /// `work`, unless `after` passes first.
    pub async fn timeout<F: Future>(
        &mut self,
        after: Duration,
        work: F,
    ) -> Result<F::Output, Elapsed> {
        let at = Instant::now()
            .checked_add(after)
            .unwrap_or_else(|| Instant::now() + PARKED);
        tokio::select! {
            biased;
            out = work => Ok(out),
            () = self.until(at) => Err(Elapsed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    // On the wall clock (the crate's tokio has no `test-util`), in tens of milliseconds: a
    // deadline is never early; the upper bounds are loose.
    #[tokio::test]
    async fn fires_at_each_deadline_whatever_was_armed_before() {
        let mut d = Deadline::default();
        let t0 = Instant::now();
        // Earlier than the parked timer: re-armed at once.
        d.until(t0 + 40 * MS).await;
        assert!(Instant::now() >= t0 + 40 * MS);
        // Work that ends first leaves the timer armed (here for 10 s from now).
        let r = d.timeout(Duration::from_secs(10), async { 7 }).await;
        assert_eq!(r, Ok(7));
        // An earlier deadline than the armed one fires on time.
        let t1 = Instant::now();
        let slow = d
            .timeout(60 * MS, tokio::time::sleep(Duration::from_secs(10)))
            .await;
        assert_eq!(slow, Err(Elapsed));
        let waited = Instant::now() - t1;
        assert!(
            waited >= 60 * MS && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        // The armed deadline has passed: a later one re-arms it, and waits for it.
        let t2 = Instant::now();
        d.until(t2 + 50 * MS).await;
        let waited = Instant::now() - t2;
        assert!(
            waited >= 50 * MS && waited < Duration::from_secs(5),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn a_later_deadline_than_the_armed_one_waits_for_itself() {
        let mut d = Deadline::default();
        let t0 = Instant::now();
        d.until(t0 + 20 * MS).await;
        // Armed for 20 ms (passed); the next deadline is later: the timer fires early, is
        // re-armed, and the wait ends at the deadline, not before.
        let r = d
            .timeout(80 * MS, tokio::time::sleep(Duration::from_secs(10)))
            .await;
        assert_eq!(r, Err(Elapsed));
        assert!(Instant::now() >= t0 + 100 * MS);
    }
}
