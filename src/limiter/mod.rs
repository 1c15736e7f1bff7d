//! The limiting engine as the gateway runs it: limits compiled from the config, the checks a
//! request makes, and their joint outcome.
//!
//! The algorithms, the batch rule and the stores are the `tollgate_limit` crate (`limit/`, no
//! HTTP, no config file), re-exported here under the paths the gateway has always used. What
//! stays is the gateway's: [`CompiledLimit`] (a limit compiled from `[[routes.limits]]`, which
//! dereferences to the crate's [`Limit`]), `outcome` (one decision per limit → forward, delay,
//! 429, and the headers), the response-based charges' metrics, `/-/top` and the seen keys (with
//! the subject parts they show, [`ShownPart`]).

pub mod bans;
mod compiled;
mod convert;
pub mod denied_top;
mod outcome;
mod response_metrics;
pub mod seen_keys;
mod shown;
pub mod zero_budget;

pub use tollgate_limit::{adjust, batch, charge, concurrency, lease, refund};
pub use tollgate_limit::{
    admit, age_denial, evaluate, expires_at, usage, Algorithm, AsLimit, Decision, LeaseSettings,
    Limit, Micros, Op, Policy, State, SubjectDigest, USAGE_FULL,
};

pub use self::compiled::{Check, CompiledLimit};
pub use self::outcome::{effective_window, Outcome, RateFields, Verdict};
pub use self::response_metrics::{CostOutcome, ResponseMetrics};
pub use self::shown::{Shown, ShownPart};
