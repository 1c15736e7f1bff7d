//! What the services read on each call, and from whom: the snapshot that serves now (a reload
//! swaps it), given by the gateway's state, which implements [`Source`].

use std::sync::Arc;

use super::Domains;
use tollgate_limit::store::{AnyClock, AnyStore};

/// The services' view of the gateway: `[rls]`'s domains with the store that decides them, and
/// the clock every store is built on.
pub trait Source: Send + Sync + 'static {
    /// The domains of the snapshot that serves and its store; `None` while `[rls]` is off.
    fn domains(&self) -> Option<(Arc<Domains>, Arc<AnyStore>)>;
    /// The gateway's clock (the system clock; a manual one in a `test-clock` build).
    fn clock(&self) -> &AnyClock;
}
