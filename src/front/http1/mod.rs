//! The purpose-built HTTP/1 front, in the shape of hyper's `proto/h1`:
//!
//! - [`framing`]: the one framing model (head end, `Content-Length` / `Transfer-Encoding`,
//!   chunked framing), shared with the hyper front's framing scanner (`server::h1_scan`);
//! - [`parse`]: the request head parsed in place (`httparse`), read by the pipeline through
//!   [`crate::http::head::RequestHead`];
//! - [`write`]: the upstream head (the client's bytes, names in the client's case and order,
//!   with only the pipeline's edits spliced in) and the response head;
//! - [`codec`]: body codecs (`Content-Length`, chunked, close-delimited);
//! - [`conn`]: the connection loop (keep-alive, pipelining in order, timers, drain), each
//!   request run by the one life cycle ([`crate::pipeline::cycle::run`]);
//! - [`deadline`]: the connection's one timer, re-armed lazily for each deadline in turn;
//! - [`exchange`]: the front's codec of the life cycle: one request's upstream exchange, in the
//!   request's own task, with the worker's pool of idle upstream connections
//!   (`upstream::pool`), and the response streamed back;
//! - [`roundtrip`]: the request and response paths run on bytes in memory, for the
//!   round-trip oracle (fuzz target `h1_round_trip`, `tests/round_trip.rs`);
//! - `prefix`: the request body's start read before the limits (routes whose limits read the
//!   JSON body), left in the connection's buffer for the upstream;
//! - [`rewind`]: how a connection it does not serve (upgrades, `Expect`, HTTP/1.0, anything
//!   malformed or exotic) goes to hyper with the bytes already read, so those get exactly the
//!   hyper front's answers.
//!
//! Selected with `[server] http1 = "fast"`; HTTP/2 (ALPN `h2`, h2c prior knowledge) always
//! goes to hyper.

pub mod codec;
pub mod conn;
pub mod deadline;
pub mod exchange;
pub mod framing;
pub mod parse;
mod prefix;
pub mod rewind;
#[doc(hidden)]
pub mod roundtrip;
pub mod session;
pub mod write;

pub use self::conn::{serve, Client, Handoff, Limits};

pub use self::rewind::Rewind;
pub use self::session::Front;
