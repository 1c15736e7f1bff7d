//! Tollgate's limiting core: the rate-limiting algorithms, the batch rule, the clock and the
//! stores, with no HTTP and no config file.
//!
//! A caller describes each limit once as a [`Limit`] (its key, its [`Policy`]), and each request
//! as one [`Check`] per limit (the limit, the hashed subject, an [`Op`]); a [`store::Store`]
//! decides a request's checks all-or-nothing and returns one [`Decision`] each. The gateway
//! (`tollgate`) is one such caller; anything else that must decide limits the way it does (a
//! rate-limit service) uses this crate alone. See `README.md` beside this crate for the
//! algorithm trait and how to add an algorithm.
#![forbid(unsafe_code)]

pub mod adjust;
mod algorithm;
pub mod batch;
pub mod calendar;
pub mod charge;
mod check;
pub mod concurrency;
#[doc(hidden)]
pub mod fuzzing;
pub mod lease;
pub mod log_throttle;
pub mod metrics;
pub mod refund;
pub mod store;
pub mod worker;

pub use self::algorithm::{
    admit, age_denial, evaluate, expires_at, usage, Algorithm, Decision, Micros, Policy, State,
    USAGE_FULL,
};
pub use self::check::{AsLimit, Check, LeaseSettings, Limit, Op, SubjectDigest};
