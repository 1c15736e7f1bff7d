//! The request pipeline: what a request *means*, over a read-only view of its head
//! ([`crate::head::RequestHead`]), knowing no HTTP library. One file per phase:
//!
//! - [`input`]: framing, target length, `Host` and the normalised path;
//! - [`consumer`]: the consumer and its plan (routes with `consumers = true`);
//! - [`limits`]: every limit's subject (the caller) and the store's decision on them all;
//!   [`passed`]: what a request that passed carries on and owes;
//! - [`edits`]: what the upstream head becomes (path and query, header removes and sets);
//! - [`settle`]: what is owed after the response (post-response charges, an abandoned
//!   exchange's charge, concurrency releases);
//! - [`record`]: the exchange's metrics and access-log record;
//! - [`answer`]: what the gateway answers itself (status, headers, problem+json).
//!
//! [`admit`] runs the phases up to the upstream and returns *admitted* (route, decisions,
//! leases, the client address, the edits) or an *answer*; [`explain`] runs them evaluate-only
//! for `/-/explain`. A front (the hyper one in [`crate::proxy`]) parses, applies the edits,
//! talks to the upstream, streams, and renders answers; it calls [`settle`] at the response
//! head and [`record`] once the status is known.

pub mod admit;
pub mod answer;
pub mod consumer;
pub mod edits;
pub mod explain;
pub mod input;
pub mod limits;
pub mod passed;
pub mod record;
pub mod settle;

pub use self::admit::{admit, Admitted, Peer};
pub use self::answer::{Answer, Flavor, ProxyError, QUOTA_EXCEEDED, QUOTA_EXCEEDED_TITLE};
pub use self::edits::{append_forwarded_for, Edit, Edits, Forwarded};
pub use self::explain::{explain, Evaluated, ExplainError, Explained};
pub use self::passed::Passed;
pub use self::record::{Exchange, Trail};
pub use self::settle::{Leases, WorkerCtx};
