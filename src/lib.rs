//! Tollgate: a reverse-proxy HTTP gateway with built-in, distributed rate limiting.
//!
//! The request path is route → subject → limits → forward: [`routing`] picks the route on the
//! normalised [`http::path`], [`subject`] works out who is calling, the [`limiter`] decides every limit
//! of the route at once through a [`store`], and a front ([`front`]) forwards or answers 429. [`runtime`]
//! ties it together behind an immutable, hot-swappable snapshot of the [`config`].
#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod body_cost;
pub mod cache;
pub mod compression;
pub mod config;
pub mod consumers;
pub mod demo;
pub mod front;
pub mod fronting;
#[doc(hidden)]
pub mod fuzzing;
pub mod hex;
pub mod http;
pub mod import;
pub mod jwt;
pub mod limiter;
pub mod metrics;
pub mod pipeline;
pub mod quota;
pub mod rls;
pub mod routing;
pub mod runtime;
pub mod subject;
pub mod tls;
pub mod top;
pub mod traces;
pub mod upstream;

// The limiting core is its own crate (`limit/`); these paths stay the gateway's too.
pub use tollgate_limit::{calendar, log_throttle, store, worker};

pub use crate::config::Config;
pub use crate::runtime::gateway::{Gateway, GatewayError};
