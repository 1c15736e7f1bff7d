//! The layer in front of a remote store: the circuit [`Breaker`], a health check, the store's
//! error counters and `tollgate_store_up`.
//!
//! - Every decision asks the breaker first: while the circuit is open it fails at once with a
//!   `circuit_open` error (handled by `on_error`) without touching the store.
//! - A health check PINGs the store every [`HEALTH_INTERVAL`], busy or idle, so
//!   `tollgate_store_up` and `/readyz` tell the same from the start, and an idle gateway notices
//!   an outage and a recovery without traffic (a successful PING closes the circuit too).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::breaker::{Breaker, Transition};
use super::{Store, StoreError, StoreErrorKind};
use crate::adjust::Adjust;
use crate::metrics::StoreMetrics;
use crate::worker::WorkerId;
use crate::{AsLimit, Check, Decision};

/// How often the health check PINGs the store.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// A store behind a breaker and a health check.
pub struct Guarded<S> {
    inner: S,
    breaker: Breaker,
    backend: &'static str,
    metrics: StoreMetrics,
    /// What `tollgate_store_up` last said (the gauge is written only when this changes).
    up: AtomicBool,
}

impl<S: Store + 'static> Guarded<S> {
    /// Wraps `inner` and starts its health check (on the current runtime) for as long as the
    /// returned store exists.
    pub fn new(inner: S, backend: &'static str) -> Arc<Guarded<S>> {
        let g = Arc::new(Guarded {
            inner,
            breaker: Breaker::default(),
            backend,
            metrics: StoreMetrics::new(backend),
            up: AtomicBool::new(false),
        });
        g.metrics.set_up(false);
        tokio::spawn(health_check(Arc::downgrade(&g)));
        g
    }
}

impl<S: Store> Guarded<S> {
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn on_success(&self) {
        if self.breaker.success() == Transition::Closed {
            tracing::info!(backend = self.backend, "store recovered; circuit closed");
        }
        self.refresh_up();
    }

    fn on_failure(&self) {
        if let Transition::Opened { failures } = self.breaker.failure() {
            tracing::warn!(
                backend = self.backend,
                failures,
                "store failing; circuit open"
            );
        }
        self.refresh_up();
    }

    /// Brings `tollgate_store_up` in line with [`Store::is_up`] (what `/readyz` reports).
    fn refresh_up(&self) {
        let up = Store::is_up(self);
        if self.up.load(Ordering::Acquire) != up && self.up.swap(up, Ordering::AcqRel) != up {
            self.metrics.set_up(up);
        }
    }

    async fn health(&self) {
        match self.inner.ping().await {
            Ok(()) => self.on_success(),
            Err(e) => {
                tracing::debug!(backend = self.backend, error = %e, "store health check failed");
                self.on_failure();
            }
        }
    }
}

impl<S: Store> Store for Guarded<S> {
    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        // Held across the store call: dropping this future (a client gone) frees a probe slot.
        let Some(_permit) = self.breaker.admit() else {
            self.metrics.error(StoreErrorKind::CircuitOpen.as_str());
            return Err(StoreError::new(
                StoreErrorKind::CircuitOpen,
                "circuit open after repeated store failures",
            ));
        };
        let result = self.inner.decide(checks, worker).await;
        match &result {
            Ok(_) => self.on_success(),
            Err(e) => {
                self.metrics.error(e.kind.as_str());
                self.on_failure();
            }
        }
        result
    }

    /// Not through the breaker: an operator asking sees the store's own answer or error.
    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        self.inner.peek(checks, worker).await
    }

    /// Not through the breaker: a settle that fails is logged and lost (a Redis lease then
    /// expires), and it must not take a probe slot from a request.
    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), StoreError> {
        let result = self.inner.settle(checks, worker).await;
        if let Err(e) = &result {
            self.metrics.error(e.kind.as_str());
        }
        result
    }

    /// Not through the breaker: an operator's correction gets the store's own answer.
    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> Result<(), StoreError> {
        let result = self.inner.adjust(check, adjust).await;
        if let Err(e) = &result {
            self.metrics.error(e.kind.as_str());
        }
        result
    }

    async fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: crate::Micros,
    ) -> Result<(), StoreError> {
        let result = self.inner.ban(check, until).await;
        if let Err(e) = &result {
            self.metrics.error(e.kind.as_str());
        }
        result
    }

    async fn lift_bans<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        let result = self.inner.lift_bans(limit).await;
        if let Err(e) = &result {
            self.metrics.error(e.kind.as_str());
        }
        result
    }

    async fn ban_lifts<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        let result = self.inner.ban_lifts(limit).await;
        if let Err(e) = &result {
            self.metrics.error(e.kind.as_str());
        }
        result
    }

    /// Connected, and the last decision or health check succeeded.
    fn is_up(&self) -> bool {
        self.inner.is_up() && self.breaker.is_closed()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
}

/// PINGs the store every [`HEALTH_INTERVAL`] for as long as it exists.
async fn health_check<S: Store>(store: Weak<Guarded<S>>) {
    let mut tick = tokio::time::interval(HEALTH_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else {
            return;
        };
        store.health().await;
    }
}
