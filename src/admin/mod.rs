//! The admin listener: `GET /metrics`, `GET /healthz`, `GET /readyz`, `POST /-/reload`, and the
//! operator's questions `GET /-/top` (who is being throttled) and `GET /-/explain` (what would
//! happen to a request, charging nothing); support's `GET /-/usage`, `POST /-/quota/reset` and
//! `POST /-/quota/grant`; all behind the tokens of `[admin] token_file` ([`tokens`]: the snapshot
//! holds them, below the listener); and `tollgate health`, the listener's client ([`health`]).
//!
//! Kept apart from the proxy listener so it can bind to loopback or an internal interface.

mod explain;
pub mod health;
mod params;
mod quota;
mod server;
pub mod tokens;
mod top;

pub use self::explain::explain;
pub use self::params::{params, Param};
pub use self::quota::{adjust, usage_of, Action};
pub use self::server::serve;
pub use self::tokens::{AdminTokens, TokenFileError};
pub use self::top::top;
