//! Where limit state lives: one async [`Store`] trait, an in-process and a Redis implementation.
//!
//! A store receives every limit of one request at once ([`Check`]s) and decides them all-or-nothing:
//! it evaluates each limit, and only when every enforcing limit admits the request does it charge
//! the request to all of them (shadow limits are charged when they themselves admit). Limit
//! definitions stay outside the store; a check carries its [`Policy`](crate::limiter::Policy) and the hashed subject.

mod breaker;
mod deny_cache;
mod memory;
mod redis;

pub use self::breaker::{Breaker, Permit, Transition, BREAKER_BACKOFF, BREAKER_THRESHOLD};
pub use self::deny_cache::DenyCache;
pub use self::memory::MemoryStore;
pub use self::redis::{RedisStore, HEALTH_INTERVAL};

use std::future::Future;
use std::sync::Arc;

use crate::limiter::{Check, Decision, Micros};

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
    /// Decides `checks` all-or-nothing; returns one decision per check, in order.
    ///
    /// `at` overrides the store's clock (tests); `None` uses the store's own time: the system
    /// clock in process, Redis `TIME` in Redis.
    fn decide(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Evaluates `checks` as [`Store::decide`] would, charging nothing: each limit's decision
    /// for a request arriving now (`/-/explain`).
    fn peek(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Whether the store can currently decide (for `/readyz` and `tollgate_store_up`).
    fn is_up(&self) -> bool;
}

/// The configured store (static dispatch over the implementations).
pub enum AnyStore {
    Memory(MemoryStore),
    Redis(Arc<RedisStore>),
}

impl AnyStore {
    /// The `backend` metric label.
    pub fn backend(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "memory",
            AnyStore::Redis(r) => r.backend(),
        }
    }
}

impl Store for AnyStore {
    async fn decide(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(m) => m.decide(checks, at).await,
            AnyStore::Redis(r) => r.decide(checks, at).await,
        }
    }

    async fn peek(
        &self,
        checks: &[Check<'_>],
        at: Option<Micros>,
    ) -> Result<Vec<Decision>, StoreError> {
        match self {
            AnyStore::Memory(m) => m.peek(checks, at).await,
            AnyStore::Redis(r) => r.peek(checks, at).await,
        }
    }

    fn is_up(&self) -> bool {
        match self {
            AnyStore::Memory(m) => m.is_up(),
            AnyStore::Redis(r) => r.is_up(),
        }
    }
}

/// The current time in microseconds since the Unix epoch.
pub fn system_now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
