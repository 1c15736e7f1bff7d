//! The request pipeline: what a request *means*, over a read-only view of its head
//! ([`crate::http::head::RequestHead`]), knowing no HTTP library. One file per phase:
//!
//! - [`input`]: framing, target length, `Host` and the normalised path;
//! - [`jwt`]: the bearer token verified and its claims (routes with `jwt`);
//! - [`consumer`]: the consumer and its plan (routes with `consumers = true`);
//! - [`body`]: the request body's JSON fields, read before the limits on routes whose limits
//!   look into it (`json:` subject parts, `reserve = "json:…"`);
//! - [`limits`]: every limit's subject (the caller) and the store's decision on them all;
//!   [`passed`]: what a request that passed carries on and owes;
//! - [`edits`]: what the upstream head becomes (path and query, header removes, sets and adds,
//!   a route's `[routes.request_headers]` last);
//! - [`settle`]: what is owed after the response (post-response charges, an abandoned
//!   exchange's charge, concurrency releases); [`body_charge`]: the charge of limits whose cost
//!   is read from the response body or trailers (`cost_from`), made when the body ends;
//! - [`record`]: the exchange's metrics and access-log record;
//! - [`answer`]: what the gateway answers itself (status, headers, problem+json; a CORS
//!   preflight, a redirect);
//! - [`respond`]: what a route does to every response's head (CORS, response header rules).
//! - [`usage`]: the answer of a `usage = true` route (the caller's usage, charging nothing);
//! - [`drive`]: an upstream failure (typed in [`crate::upstream::Failure`]) as the answer, a
//!   gateway's own answer made ready, and [`drive::relay`], the one sequence from the upstream's
//!   response head to the response a front streams (over each front's [`drive::ReplyHead`]).
//!
//! [`evaluate`] is the one evaluation of a request, in admission's order; [`admit`] runs it
//! deciding and returns *admitted* (route, decisions, leases, the client address, the edits)
//! or an *answer*; [`explain`] runs it evaluate-only for `/-/explain`.
//!
//! [`cycle`] is the one request life cycle: [`cycle::run`] takes every request, on every front,
//! from its head to its end — the request id, [`admit()`], the upstream planner's attempts
//! ([`crate::upstream::attempts`]), [`drive::relay`] or [`drive::answer`] — over the
//! [`cycle::Codec`] a front implements, which holds only what is protocol (reading the body,
//! sending once, writing a response head and body or an answer, the connection's next step).

pub mod admit;
pub mod answer;
pub mod body;
pub mod body_charge;
pub mod consumer;
pub mod cycle;
pub mod drive;
pub mod edits;
pub mod evaluate;
pub mod explain;
pub mod input;
pub mod jwt;
pub mod limits;
pub mod passed;
pub mod record;
pub mod respond;
pub mod settle;
pub mod usage;

pub use self::admit::{admit, serve, Admitted, Peer, Routed, Serve};
pub use self::answer::{
    Answer, Flavor, PendingScope, ProxyError, GRPC_MESSAGE, GRPC_STATUS, QUOTA_EXCEEDED,
    QUOTA_EXCEEDED_TITLE,
};
pub use self::body::{BodyPrefix, Prefix, Unread};
pub use self::body_charge::BodyCharge;
pub use self::edits::{append_forwarded_for, Edit, Edits, Forwarded};
pub use self::explain::{explain, ExplainError, Explained};
pub use self::passed::Passed;
pub use self::record::{Exchange, Trail};
pub use self::respond::respond;
pub use self::settle::{Leases, WorkerCtx};
