//! Tollgate's limiting core: the rate-limiting algorithms, the batch rule, the clock and the
//! stores, with no HTTP and no config file.
//!
//! A caller describes each limit once as a [`Limit`] (its key, its [`Policy`]), and each request
//! as one [`Check`] per limit (the limit, the hashed subject, an [`Op`]); a [`store::Store`]
//! decides a request's checks all-or-nothing and returns one [`Decision`] each. The gateway
//! (`tollgate`) is one such caller; anything else that must decide limits the way it does (a
//! rate-limit service) uses this crate alone. See `README.md` beside this crate for the
//! algorithm trait ([`Algo`]) and how to add an algorithm; `examples/decide.rs` decides through
//! the [`Store`](store::Store) trait on a [`ManualClock`](store::ManualClock).
//!
//! Time is injected: the in-process store decides at a time it is given, so a limit's whole
//! life can be played in a test without sleeping.
//!
//! ```
//! use std::sync::Arc;
//! use tollgate_limit::store::MemoryStore;
//! use tollgate_limit::{Algorithm, Check, Limit, Op, Policy, SubjectDigest};
//!
//! const SECOND: u64 = 1_000_000;
//! // 2 requests per second, in fixed windows.
//! let limit = Arc::new(Limit::new("api", "per-key", Policy {
//!     algorithm: Algorithm::FixedWindow,
//!     limit: 2,
//!     period: SECOND,
//!     burst: 0,
//!     cost: 1,
//!     calendar: None,
//! }));
//! let check = [Check { limit: &limit, subject: SubjectDigest::of(b'h', b"key-1"), op: Op::Decide }];
//! let store = MemoryStore::new(1_000);
//! let t0 = 1_700_000_000 * SECOND;
//! assert!(store.decide_now(&check, t0)[0].allowed);
//! assert!(store.decide_now(&check, t0)[0].allowed);
//! let denied = store.decide_now(&check, t0)[0];
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_after, SECOND); // the window's end
//! // The next window, a second later: admitted again.
//! assert!(store.decide_now(&check, t0 + SECOND)[0].allowed);
//! ```
#![forbid(unsafe_code)]

pub mod adjust;
pub mod algorithm;
pub mod batch;
pub mod calendar;
pub mod charge;
mod check;
#[doc(hidden)]
pub mod fuzzing;
pub mod lease;
pub mod log_throttle;
pub mod metrics;
pub mod refund;
pub mod store;
pub mod worker;

pub use self::algorithm::concurrency;
pub use self::algorithm::{
    admit, age_denial, avail, evaluate, expires_at, usage, Algo, Algorithm, Concurrency, Decision,
    DecisionKind, FixedWindow, Gcra, LeakyBucket, Micros, Policy, SlidingLog, SlidingWindow, State,
    TokenBucket, USAGE_FULL,
};
pub use self::check::{AsLimit, Check, LeaseSettings, Limit, Op, SubjectDigest};
