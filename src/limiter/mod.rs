//! The limiting engine: compiled limits, the checks a request makes, and their joint outcome.
//!
//! `algorithm` holds the semantics (pure functions of state, time, policy and cost); `outcome`
//! turns one decision per limit into what the gateway does (forward, delay, 429) and the headers
//! it sends. The stores in `crate::store` apply the algorithms to state.

pub mod adjust;
mod algorithm;
pub mod batch;
pub mod charge;
mod compiled;
pub mod concurrency;
pub mod denied_top;
pub mod lease;
mod outcome;
pub mod refund;
mod response_metrics;
pub mod seen_keys;

pub use self::algorithm::{
    admit, age_denial, evaluate, expires_at, usage, Decision, Micros, Policy, State, USAGE_FULL,
};
pub use self::compiled::{Check, CompiledLimit, Op, SubjectDigest};
pub use self::outcome::{Outcome, Verdict};
pub use self::response_metrics::{CostOutcome, ResponseMetrics};
