//! What request bodies not yet decided hold, on both fronts: on a route whose limits read the
//! request body ([`crate::pipeline::body`]), its start is read before the limits decide, and
//! held meanwhile — by the hyper front in its body reader (`super::hyper::body::PeekBody`), by
//! the fast front in the connection's buffer (`super::http1`'s body prefix). What they hold
//! together is bounded per connection (`[server] max_pending_body_bytes_per_connection`) and
//! per worker (`max_pending_body_bytes_per_worker`), counted here, once for both fronts: a body
//! that would take more is refused at once — 429 for the connection's share (the client's own
//! doing), 503 for the worker's (the gateway's overload) — rather than held whatever many
//! streams or connections a client opens.
//!
//! The first body a connection holds may always take its route's `max_json_bytes`, so a route
//! with a large one still serves one request at a time; likewise the only body a worker holds.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::pipeline::{PendingScope, ProxyError};

/// The bounds (`[server] max_pending_body_bytes_per_connection` and `…_per_worker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingBounds {
    pub per_connection: usize,
    pub per_worker: usize,
}

impl PendingBounds {
    /// The defaults: 4 MiB per connection, 64 MiB per worker.
    pub const DEFAULT: PendingBounds = PendingBounds {
        per_connection: 4 << 20,
        per_worker: 64 << 20,
    };
}

/// The counts of what bodies not yet decided hold — the connection's and the worker's — and
/// their bounds.
#[derive(Clone, Copy)]
pub struct PendingBodies<'a> {
    pub connection: &'a AtomicUsize,
    pub worker: &'a AtomicUsize,
    pub bounds: PendingBounds,
}

/// What one body not yet decided holds of [`PendingBodies`]; given back when dropped or
/// [`Held::release`]d (the request decided, refused or gone).
pub struct Held<'a> {
    pending: PendingBodies<'a>,
    n: usize,
}

impl<'a> Held<'a> {
    /// Nothing held yet.
    pub fn new(pending: PendingBodies<'a>) -> Held<'a> {
        Held { pending, n: 0 }
    }

    /// The bytes held.
    pub fn held(&self) -> usize {
        self.n
    }

    /// Takes `n` more bytes, or says which bound refuses (nothing more is then counted).
    pub fn take(&mut self, n: usize) -> Result<(), ProxyError> {
        let p = &self.pending;
        let conn = p.connection.fetch_add(n, Ordering::AcqRel);
        // The first body on the connection is bounded by its route's `max_json_bytes` only.
        if conn != self.n && conn.saturating_add(n) > p.bounds.per_connection {
            p.connection.fetch_sub(n, Ordering::AcqRel);
            return Err(ProxyError::PendingBodies(PendingScope::Connection));
        }
        let worker = p.worker.fetch_add(n, Ordering::AcqRel);
        if worker != self.n && worker.saturating_add(n) > p.bounds.per_worker {
            p.worker.fetch_sub(n, Ordering::AcqRel);
            p.connection.fetch_sub(n, Ordering::AcqRel);
            return Err(ProxyError::PendingBodies(PendingScope::Worker));
        }
        self.n = self.n.saturating_add(n);
        Ok(())
    }

    /// Holds `total` bytes in all: takes what is missing (a body held where it lies, counted by
    /// what it has grown to).
    pub fn hold(&mut self, total: usize) -> Result<(), ProxyError> {
        match total.checked_sub(self.n) {
            Some(more) if more > 0 => self.take(more),
            _ => Ok(()),
        }
    }

    /// Gives back everything held (the request is decided).
    pub fn release(&mut self) {
        if self.n > 0 {
            self.pending.connection.fetch_sub(self.n, Ordering::AcqRel);
            self.pending.worker.fetch_sub(self.n, Ordering::AcqRel);
            self.n = 0;
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(h: &mut Held<'_>, n: usize) -> Result<(), u16> {
        h.take(n).map_err(|e| e.status().as_u16())
    }

    const BOUNDS: PendingBounds = PendingBounds::DEFAULT;

    #[test]
    fn pending_bodies_are_bounded_per_connection_and_worker_and_given_back() {
        let (conn, other_conn, worker) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let pending = PendingBodies {
            connection: &conn,
            worker: &worker,
            bounds: BOUNDS,
        };
        // The first body of a connection may go past the connection's share.
        let mut first = Held::new(pending);
        taken(&mut first, BOUNDS.per_connection + 10).unwrap();
        // A second one on the same connection may not take a byte more.
        let mut second = Held::new(pending);
        assert_eq!(taken(&mut second, 1), Err(429));
        assert_eq!(conn.load(Ordering::SeqCst), BOUNDS.per_connection + 10);
        drop(first);
        assert_eq!(conn.load(Ordering::SeqCst), 0);
        assert_eq!(worker.load(Ordering::SeqCst), 0);
        // The worker's bound, across connections: 503, nothing left counted by the refusal.
        worker.store(BOUNDS.per_worker, Ordering::SeqCst);
        let mut elsewhere = Held::new(PendingBodies {
            connection: &other_conn,
            worker: &worker,
            bounds: BOUNDS,
        });
        assert_eq!(taken(&mut elsewhere, 1), Err(503));
        assert_eq!(other_conn.load(Ordering::SeqCst), 0);
        assert_eq!(worker.load(Ordering::SeqCst), BOUNDS.per_worker);
    }

    #[test]
    fn a_body_held_where_it_lies_is_counted_by_what_it_grew_to() {
        let (conn, worker) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let bounds = PendingBounds {
            per_connection: 100,
            per_worker: 150,
        };
        let pending = PendingBodies {
            connection: &conn,
            worker: &worker,
            bounds,
        };
        let mut a = Held::new(pending);
        a.hold(60).unwrap();
        a.hold(40).unwrap();
        a.hold(100).unwrap();
        assert_eq!((a.held(), worker.load(Ordering::SeqCst)), (100, 100));
        let other = AtomicUsize::new(0);
        let mut b = Held::new(PendingBodies {
            connection: &other,
            ..pending
        });
        b.hold(50).unwrap();
        assert_eq!(b.hold(51).map_err(|e| e.status().as_u16()), Err(503));
        assert_eq!(b.held(), 50);
        a.release();
        assert_eq!(
            (conn.load(Ordering::SeqCst), worker.load(Ordering::SeqCst)),
            (0, 50)
        );
        b.hold(140).unwrap();
        drop(b);
        assert_eq!(worker.load(Ordering::SeqCst), 0);
    }
}
