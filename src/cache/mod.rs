//! The HTTP cache at the edge (RFC 9111, issue #54): a phase of the one request life cycle
//! (`pipeline::cycle`), for every front. [`control`] reads `Cache-Control`, [`freshness`] holds
//! RFC 9111's rules as pure functions of the messages and an injected time, [`key`] makes a
//! request's key, [`store`] is the bounded memory tier, [`disk`] the disk tier behind it (its
//! files' format: [`file`]), [`collapse`] the per-key lock of
//! concurrent misses, [`fill`] the copy of a body made while it streams, [`phase`] the lookup
//! and the response's fate, [`purge`] the admin's removals.

pub mod collapse;
pub mod control;
pub mod disk;
pub mod file;
pub mod fill;
pub mod freshness;
pub mod key;
pub mod phase;
pub mod purge;
pub mod store;

pub use fill::Fill;
pub use phase::{lookup, now, peek, Cache, Forward, Hit, Looked, Outcome, Peek, RouteCache};
