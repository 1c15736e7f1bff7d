//! Tollgate: a reverse-proxy HTTP gateway with built-in, distributed rate limiting.
//!
//! The request path is route → subject → limits → forward: [`routing`] picks the route on the
//! normalised [`path`], [`subject`] works out who is calling, the [`limiter`] decides every limit
//! of the route at once through a [`store`], and a front ([`front`]) forwards or answers 429. [`gateway`]
//! ties it together behind an immutable, hot-swappable snapshot of the [`config`].
#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod admin_tokens;
pub mod body_cost;
pub mod cache;
pub mod compression;
pub mod config;
pub mod consumers;
pub mod demo;
pub mod fields;
pub mod front;
pub mod fronting;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod head;
pub mod health;
pub mod hex;
pub mod import;
pub mod json_fields;
pub mod jwt;
pub mod limiter;
pub mod load;
pub mod metrics;
pub mod pacing;
pub mod path;
pub mod pipeline;
pub mod quota;
pub mod reload;
pub mod request_id;
pub mod rls;
pub mod routing;
pub mod state;
pub mod subject;
#[cfg(feature = "test-clock")]
pub mod test_clock;
pub mod tls;
pub mod top;
pub mod traces;
pub mod upstream;
pub mod watch;
pub mod yaml_depth;

// The limiting core is its own crate (`limit/`); these paths stay the gateway's too.
pub use tollgate_limit::{calendar, log_throttle, store, worker};

pub use crate::config::Config;
pub use crate::gateway::{Gateway, GatewayError};
