//! The HTTP/3 front (`[server.http3]`, issue #53): QUIC by quinn, HTTP/3 by hyperium's h3, and
//! each request a third codec of the one life cycle ([`crate::pipeline::cycle`]) — the limits,
//! retries, answers and records are the life cycle's, as on the other two fronts. The listener
//! and what it decides before a request (address validation, early data, the handshake) are
//! [`endpoint`]'s; the codec is [`codec`]'s; the request body as a stream, [`body`]'s.

pub mod body;
mod codec;
pub mod endpoint;

pub use self::endpoint::{bind, spawn, Bound, H3Error, UNDER_LOAD_HANDSHAKES};
