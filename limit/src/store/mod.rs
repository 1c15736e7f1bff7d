//! Where limit state lives: one async [`Store`] trait, an in-process and a Redis implementation.
//!
//! A store receives every limit of one request at once ([`Check`]s) and decides them all-or-nothing:
//! it evaluates each limit, and only when every enforcing limit admits the request does it charge
//! the request to all of them (shadow limits are charged when they themselves admit). Limit
//! definitions stay outside the store; a check carries its [`Policy`](crate::Policy) and the hashed subject.

mod breaker;
mod clock;
mod deny_cache;
mod guard;
mod leasing;
mod memory;
pub(crate) mod redis;
mod settings;
mod tiered;

pub use self::breaker::{Breaker, Permit, Transition, BREAKER_BACKOFF, BREAKER_THRESHOLD};
#[cfg(any(test, feature = "test-clock"))]
pub use self::clock::ManualClock;
pub use self::clock::{system_now, AnyClock, Clock, SystemClock};
pub use self::deny_cache::{Cached, DenyCache};
pub use self::guard::{Guarded, HEALTH_INTERVAL};
pub use self::leasing::Leasing;
pub use self::memory::MemoryStore;
pub use self::redis::{
    algorithm_code, cluster_slot, key as redis_key, RedisStore, MAX_BATCH, MAX_IN_FLIGHT,
};
pub use self::settings::{Backend, SentinelSettings, StoreSettings};
pub use self::tiered::Tiered;

use std::future::Future;
use std::sync::Arc;

use crate::adjust::Adjust;
use crate::worker::WorkerId;
use crate::{AsLimit, Check, Decision, Micros};

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind} error: {message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

/// The class of a store error; the `kind` label of `tollgate_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The server could not be reached (refused, reset, DNS).
    Connect,
    /// No answer within `[store] timeout`.
    Timeout,
    /// Redis answered with an error (script error, OOM, …).
    Server,
    /// The circuit breaker is open: the store was not asked.
    CircuitOpen,
    /// Anything else (a malformed reply).
    Other,
}

impl StoreErrorKind {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Connect => "connect",
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Server => "server",
            StoreErrorKind::CircuitOpen => "circuit_open",
            StoreErrorKind::Other => "other",
        }
    }
}

impl std::fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
        }
    }

    /// Whether trying again later may succeed (every kind but a malformed reply).
    pub fn is_transient(&self) -> bool {
        self.kind != StoreErrorKind::Other
    }
}

/// A place that decides limits.
pub trait Store: Send + Sync {
    /// Decides `checks` all-or-nothing; returns one decision per check, in order. The time is
    /// the store's [`Clock`], chosen when it was built.
    /// `worker` is who asks (the store keeps per-worker parts).
    fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Decides `checks` as [`Store::decide`] would, now, when that needs no round trip: the
    /// in-process store, the local tier, leases with the units in hand, a cached denial.
    /// `None` when the store must be asked: then nothing was charged or taken, and the caller
    /// calls [`Store::decide`] (so that a decision in process builds, moves and polls no
    /// future at all).
    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Option<Result<Vec<Decision>, StoreError>> {
        let _ = (checks, worker);
        None
    }

    /// Evaluates `checks` as [`Store::decide`] would, charging nothing: each limit's decision
    /// for a request arriving now (`/-/explain`).
    fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Applies what a request owes once it has been answered, each check on its own (not
    /// all-or-nothing, never denied): [`Op::Charge`](crate::Op::Charge) adds units to a
    /// limit charged after the response, clamped to a spent limit;
    /// [`Op::Release`](crate::Op::Release) gives a concurrency slot back.
    fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Applies support's correction ([`Adjust`]: reset or grant) to `check`'s limit for its
    /// subject, atomically with the requests deciding it (see [`crate::adjust`]); the
    /// caller has checked that the limit's algorithm takes it.
    fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Shares the ban (`ban_after`) of `check`'s subject, ending at `until` (µs on the store's
    /// clock), with every gateway on this store: their decisions of a limit with
    /// [`Limit::bans`](crate::Limit::bans) refuse the subject
    /// ([`DecisionKind::Banned`](crate::DecisionKind)) until then, charging nothing. In
    /// process there is no one to share it with: the gateway's own penalty box is the truth.
    fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (check, until);
        std::future::ready(Ok(()))
    }

    /// Lifts every ban of `limit` shared through the store (`POST /-/quota/reset`); how many
    /// subjects were banned.
    fn lift_bans<L: AsLimit>(
        &self,
        limit: &L,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let _ = limit;
        std::future::ready(Ok(0))
    }

    /// How many times `limit`'s bans were lifted fleet-wide: a gateway holding bans watches it
    /// and lifts its own when it changes.
    fn ban_lifts<L: AsLimit>(
        &self,
        limit: &L,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let _ = limit;
        std::future::ready(Ok(0))
    }

    /// Whether the store can currently decide (for `/readyz` and `tollgate_store_up`).
    fn is_up(&self) -> bool;

    /// Asks the store whether it answers (the health check); in process: always.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}

impl<S: Store> Store for Arc<S> {
    fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        (**self).decide(checks, worker)
    }

    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Option<Result<Vec<Decision>, StoreError>> {
        (**self).decide_here(checks, worker)
    }

    fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        (**self).peek(checks, worker)
    }

    fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).settle(checks, worker)
    }

    fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).adjust(check, adjust)
    }

    fn ban<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        until: Micros,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).ban(check, until)
    }

    fn lift_bans<L: AsLimit>(
        &self,
        limit: &L,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).lift_bans(limit)
    }

    fn ban_lifts<L: AsLimit>(
        &self,
        limit: &L,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).ban_lifts(limit)
    }

    fn is_up(&self) -> bool {
        (**self).is_up()
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).ping()
    }
}

/// The Redis store as the gateway runs it: the local tier (`store = "local"` limits), the
/// leases (`sync = "lease"`), then the deny cache, then breaker and health check.
pub type RemoteStore = Tiered<Leasing<Cached<Arc<Guarded<RedisStore>>>>>;

/// The configured store (static dispatch over the implementations).
pub enum AnyStore {
    Memory(MemoryStore),
    Redis(Box<RemoteStore>),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnyStore").field(&self.backend()).finish()
    }
}

impl AnyStore {
    /// Builds the store `cfg` names, on `clock`, with per-worker parts for `workers` workers.
    /// Call within a tokio runtime (a Redis store starts its tasks on it).
    pub fn build(cfg: impl Into<StoreSettings>, clock: AnyClock, workers: usize) -> AnyStore {
        let cfg: StoreSettings = cfg.into();
        let cfg = &cfg;
        match cfg.backend {
            Backend::Memory => AnyStore::Memory(MemoryStore::with_clock(cfg.max_subjects, clock)),
            Backend::Redis | Backend::RedisCluster | Backend::RedisSentinel => {
                let redis = RedisStore::new(cfg, clock.clone(), workers);
                let guarded = Guarded::new(redis, cfg.backend.as_str());
                // The deny cache ages its entries on the store's clock (injected in tests).
                let cached = Cached::new(guarded, cfg.deny_cache, workers, clock.clone());
                let local = MemoryStore::with_clock(cfg.max_subjects, clock.clone());
                // Leases age on it too (`lease_ttl`, their validity).
                let leasing = Leasing::new(cached, workers, cfg.timeout, clock);
                AnyStore::Redis(Box::new(Tiered::new(local, leasing)))
            }
        }
    }

    /// The in-process store: the whole store for `memory`, the local tier for Redis.
    pub fn local(&self) -> &MemoryStore {
        match self {
            AnyStore::Memory(m) => m,
            AnyStore::Redis(r) => r.local(),
        }
    }

    /// The `backend` metric label.
    pub fn backend(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "memory",
            AnyStore::Redis(r) => r.remote().inner().inner().inner().backend(),
        }
    }
}

impl Store for AnyStore {
    async fn decide<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(m) => m.decide(checks, worker).await,
            // Boxed: the Redis decision's future is about 3 KB, and unboxed it would be part of
            // every request's future on every store, copied whenever that future moves (the
            // in-process store's is 32 bytes). One allocation beside a network round trip.
            AnyStore::Redis(r) => Box::pin(r.decide(checks, worker)).await,
        }
    }

    fn decide_here<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Option<Result<Vec<Decision>, StoreError>> {
        match self {
            AnyStore::Memory(m) => m.decide_here(checks, worker),
            AnyStore::Redis(r) => r.decide_here(checks, worker),
        }
    }

    async fn peek<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(m) => m.peek(checks, worker).await,
            AnyStore::Redis(r) => r.peek(checks, worker).await,
        }
    }

    async fn settle<L: AsLimit>(
        &self,
        checks: &[Check<'_, L>],
        worker: WorkerId,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.settle(checks, worker).await,
            AnyStore::Redis(r) => r.settle(checks, worker).await,
        }
    }

    async fn adjust<L: AsLimit>(
        &self,
        check: &Check<'_, L>,
        adjust: Adjust,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.adjust(check, adjust).await,
            AnyStore::Redis(r) => r.adjust(check, adjust).await,
        }
    }

    async fn ban<L: AsLimit>(&self, check: &Check<'_, L>, until: Micros) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.ban(check, until).await,
            AnyStore::Redis(r) => r.ban(check, until).await,
        }
    }

    async fn lift_bans<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        match self {
            AnyStore::Memory(m) => m.lift_bans(limit).await,
            AnyStore::Redis(r) => r.lift_bans(limit).await,
        }
    }

    async fn ban_lifts<L: AsLimit>(&self, limit: &L) -> Result<u64, StoreError> {
        match self {
            AnyStore::Memory(m) => m.ban_lifts(limit).await,
            AnyStore::Redis(r) => r.ban_lifts(limit).await,
        }
    }

    fn is_up(&self) -> bool {
        match self {
            AnyStore::Memory(m) => m.is_up(),
            AnyStore::Redis(r) => r.is_up(),
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.ping().await,
        }
    }
}
