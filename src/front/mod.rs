//! The fronts: what speaks HTTP to clients, each a codec ([`crate::pipeline::cycle::Codec`]) of
//! the one request life cycle ([`crate::pipeline::cycle::run`]: admission, the upstream planner
//! of [`crate::upstream`], the response phases, the record), holding only what is protocol —
//! framing, buffers, timers.
//!
//! - [`server`]: the listener — workers, accept, PROXY protocol, TLS, the framing scanner — and
//!   which front a connection goes to;
//! - [`http1`]: the purpose-built HTTP/1 front (the default for HTTP/1.1);
//! - [`hyper`]: hyper's HTTP/1 and HTTP/2 front (HTTP/2, gRPC, upgrades, what the fast front
//!   hands over), and its request body ([`hyper::body`]);
//! - [`h3`]: the HTTP/3 front (QUIC by quinn, HTTP/3 by h3) on its own UDP listener;
//! - [`pending`]: what request bodies not yet decided hold, bounded per connection and per
//!   worker, counted alike for both fronts.
//!
//! What each front serves of a route is declared with the route's needs
//! ([`crate::routing::Needs::HTTP1`], [`crate::routing::Needs::ALL`]); which front serves a
//! request is decided per request, in one place ([`crate::pipeline::serve`]).

pub mod h3;
pub mod http1;
pub mod hyper;
pub mod pending;
pub mod server;
