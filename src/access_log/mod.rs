//! The access log: one JSON line per request, written by a writer thread.
//!
//! The request path only fills a [`Record`] (moved values and reference counts, no formatting)
//! and, when the response body ends, hands it to a bounded channel without waiting
//! ([`AccessLog::send`]). The writer thread formats and writes lines in batches. When the channel
//! is full — a slow disk, a pipe nobody reads — lines are dropped and counted in
//! `tollgate_access_log_dropped_total`: a slow sink never slows requests. With `access = "off"`
//! the request path builds no record at all.

mod body;
mod record;
mod writer;

pub use self::body::{HasAccessLog, Logged};
pub use self::record::{write_rfc3339, LimitDecision, Record};
pub use self::writer::{AccessLog, CAPACITY};
