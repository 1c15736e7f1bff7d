//! What the services read on each call, and from whom: the snapshot that serves now (a reload
//! swaps it), given by the gateway's state, which implements [`Source`].

use std::sync::Arc;
use std::time::Duration;

use super::Domains;
use tollgate_limit::store::{AnyClock, AnyStore};

/// The services' view of the gateway: `[rls]`'s domains with the store that decides them, and
/// the clock every store is built on.
pub trait Source: Send + Sync + 'static {
    /// The domains of the snapshot that serves and its store; `None` while `[rls]` is off.
    fn domains(&self) -> Option<(Arc<Domains>, Arc<AnyStore>)>;
    /// The gateway's clock (the system clock; a manual one in a `test-clock` build).
    fn clock(&self) -> &AnyClock;
    /// The listener's connection timers, read for each new connection (by default the
    /// defaults of `[server] header_read_timeout` and `idle_timeout`).
    fn timers(&self) -> Timers {
        Timers::default()
    }
}

/// The `[rls]` listener's connection timers, the proxy listener's (`[server]`): a connection
/// must start its first call within `first_call` (`header_read_timeout`: a silent connection,
/// or one that sends half of the HTTP/2 preface, is closed), and one with no call in flight
/// for `idle` (`idle_timeout`) is closed with a GOAWAY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    pub first_call: Duration,
    pub idle: Duration,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers {
            first_call: Duration::from_secs(10),
            idle: Duration::from_secs(60),
        }
    }
}
