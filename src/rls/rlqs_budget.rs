//! What the quota service (RLQS) may hold, per connection and per process: quota streams,
//! buckets (each a few hundred bytes of state) and replies not yet taken by the client. A
//! stream bounds its own buckets ([`MAX_BUCKETS`](super::rlqs::MAX_BUCKETS)); one connection
//! may open many streams and a process serves many connections, so each of the three is also
//! counted in two pools — the connection's and the process's — and refused when either is full,
//! the refusal counted by reason (`tollgate_rlqs_refused_total`). What is taken is a
//! [`Charge`], given back when it is dropped (a bucket's lives in the bucket, a reply's in the
//! queue with it), so nothing a cancelled or failed stream held stays counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::metrics::rlqs::Refused;

/// Quota streams one connection may open (Envoy opens one per filter configuration).
pub const CONNECTION_STREAMS: usize = 64;
/// Quota streams the process serves at once.
pub const PROCESS_STREAMS: usize = 16_384;
/// Buckets one connection's streams keep between them.
pub const CONNECTION_BUCKETS: usize = 4_096;
/// Buckets the process keeps (≈ 600 bytes each: ≈ 80 MB at most).
pub const PROCESS_BUCKETS: usize = 131_072;
/// Bytes of replies a connection's streams have not had taken by the client (queued, or the
/// last one handed to HTTP/2).
pub const CONNECTION_REPLY_BYTES: usize = 2 << 20;
/// The same for the process.
pub const PROCESS_REPLY_BYTES: usize = 64 << 20;

/// What a charge counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    Streams,
    Buckets,
    ReplyBytes,
}

/// The most of each a pool holds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub streams: usize,
    pub buckets: usize,
    pub reply_bytes: usize,
}

impl Bounds {
    pub const CONNECTION: Bounds = Bounds {
        streams: CONNECTION_STREAMS,
        buckets: CONNECTION_BUCKETS,
        reply_bytes: CONNECTION_REPLY_BYTES,
    };
    pub const PROCESS: Bounds = Bounds {
        streams: PROCESS_STREAMS,
        buckets: PROCESS_BUCKETS,
        reply_bytes: PROCESS_REPLY_BYTES,
    };

    fn of(&self, what: What) -> usize {
        match what {
            What::Streams => self.streams,
            What::Buckets => self.buckets,
            What::ReplyBytes => self.reply_bytes,
        }
    }
}

/// One pool: a connection's or the process's counts, under its bounds.
#[derive(Debug)]
pub struct Pool {
    bounds: Bounds,
    streams: AtomicUsize,
    buckets: AtomicUsize,
    reply_bytes: AtomicUsize,
}

impl Pool {
    pub fn new(bounds: Bounds) -> Arc<Pool> {
        Arc::new(Pool {
            bounds,
            streams: AtomicUsize::new(0),
            buckets: AtomicUsize::new(0),
            reply_bytes: AtomicUsize::new(0),
        })
    }

    fn count(&self, what: What) -> &AtomicUsize {
        match what {
            What::Streams => &self.streams,
            What::Buckets => &self.buckets,
            What::ReplyBytes => &self.reply_bytes,
        }
    }

    /// Adds `n` if the sum stays within the bound.
    fn try_add(&self, what: What, n: usize) -> bool {
        let bound = self.bounds.of(what);
        self.count(what)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                c.checked_add(n).filter(|v| *v <= bound)
            })
            .is_ok()
    }

    fn sub(&self, what: What, n: usize) {
        let _ = self
            .count(what)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(n))
            });
    }

    /// What the pool holds now.
    pub fn held(&self, what: What) -> usize {
        self.count(what).load(Ordering::Acquire)
    }
}

/// A connection's pool, put in each call's extensions by the listener.
#[derive(Debug, Clone)]
pub struct ConnectionBudget(pub Arc<Pool>);

impl ConnectionBudget {
    pub fn new() -> ConnectionBudget {
        ConnectionBudget(Pool::new(Bounds::CONNECTION))
    }
}

impl Default for ConnectionBudget {
    fn default() -> ConnectionBudget {
        ConnectionBudget::new()
    }
}

/// A stream's two pools: its connection's and the process's.
#[derive(Debug, Clone)]
pub struct Budget {
    connection: Arc<Pool>,
    process: Arc<Pool>,
}

impl Default for Budget {
    /// Pools of its own (a stream asked directly, in tests).
    fn default() -> Budget {
        Budget::new(Pool::new(Bounds::CONNECTION), Pool::new(Bounds::PROCESS))
    }
}

impl Budget {
    pub fn new(connection: Arc<Pool>, process: Arc<Pool>) -> Budget {
        Budget {
            connection,
            process,
        }
    }

    /// Takes `n` of `what` from both pools, or says which is full.
    pub fn take(&self, what: What, n: usize) -> Result<Charge, Refused> {
        if !self.connection.try_add(what, n) {
            return Err(match what {
                What::Streams => Refused::ConnectionStreams,
                What::Buckets => Refused::ConnectionBuckets,
                What::ReplyBytes => Refused::UnreadReplies,
            });
        }
        if !self.process.try_add(what, n) {
            self.connection.sub(what, n);
            return Err(match what {
                What::Streams => Refused::ProcessStreams,
                What::Buckets => Refused::ProcessBuckets,
                What::ReplyBytes => Refused::UnreadReplies,
            });
        }
        Ok(Charge {
            budget: self.clone(),
            what,
            n,
        })
    }
}

/// `n` of `what` held in both pools until dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Budget,
    what: What,
    n: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.connection.sub(self.what, self.n);
        self.budget.process.sub(self.what, self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pool_bounds_what_it_holds_and_a_dropped_charge_gives_it_back() {
        let small = Bounds {
            streams: 2,
            buckets: 3,
            reply_bytes: 100,
        };
        let process = Pool::new(Bounds {
            streams: 3,
            buckets: 4,
            reply_bytes: 150,
        });
        let a = Budget::new(Pool::new(small), process.clone());
        let b = Budget::new(Pool::new(small), process.clone());
        // The connection's bound first.
        let s1 = a.take(What::Streams, 1).unwrap();
        let s2 = a.take(What::Streams, 1).unwrap();
        assert_eq!(
            a.take(What::Streams, 1).unwrap_err(),
            Refused::ConnectionStreams
        );
        // Then the process's: another connection has room of its own, the process not.
        let s3 = b.take(What::Streams, 1).unwrap();
        assert_eq!(
            b.take(What::Streams, 1).unwrap_err(),
            Refused::ProcessStreams
        );
        // A refusal by the process leaves the connection's count as it was.
        assert_eq!(process.held(What::Streams), 3);
        drop(s1);
        assert_eq!(process.held(What::Streams), 2);
        let _s4 = b.take(What::Streams, 1).unwrap();
        drop((s2, s3));
        let buckets: Vec<_> = (0..3).map(|_| a.take(What::Buckets, 1).unwrap()).collect();
        assert_eq!(
            a.take(What::Buckets, 1).unwrap_err(),
            Refused::ConnectionBuckets
        );
        let _one = b.take(What::Buckets, 1).unwrap();
        assert_eq!(
            b.take(What::Buckets, 1).unwrap_err(),
            Refused::ProcessBuckets
        );
        drop(buckets);
        assert_eq!(process.held(What::Buckets), 1);
        // Bytes: a take that would pass a bound is refused whole; sums never wrap.
        assert_eq!(
            a.take(What::ReplyBytes, 101).unwrap_err(),
            Refused::UnreadReplies
        );
        let r = a.take(What::ReplyBytes, 100).unwrap();
        assert_eq!(
            b.take(What::ReplyBytes, 51).unwrap_err(),
            Refused::UnreadReplies
        );
        assert_eq!(
            b.take(What::ReplyBytes, usize::MAX).unwrap_err(),
            Refused::UnreadReplies
        );
        drop(r);
        assert_eq!(process.held(What::ReplyBytes), 0);
    }
}
