//! The proxy listener: accepts connections (plain or TLS) on `[server] workers` thread-per-core
//! workers ([`workers`]), serves HTTP/1.1 and HTTP/2 on each with hyper's auto builder, closes
//! idle connections and drains gracefully. What a request means is the [`Handler`]'s, handed in
//! by the caller: the server never names the proxy.
//!
//! HTTP/2 concurrent streams and header-list size are bounded explicitly (CONTINUATION and rapid
//! reset floods), and a header block above `max_header_bytes` gets hyper's 431.
//!
//! Each connection runs in one task that owns what hyper does not do (or not the way we need):
//! - the timers. `header_read_timeout` runs from the first byte of a request head, empty lines
//!   before its request line included (and from the connection's start until its first request), so slowloris connections are closed;
//!   `idle_timeout` closes a connection with no request in flight and no byte either way.
//!   hyper's own HTTP/1 header timer starts as soon as a keep-alive connection goes idle, which
//!   would cap keep-alive at `header_read_timeout`; it is kept only as a backstop, at
//!   `idle_timeout + header_read_timeout`;
//! - the drain: on stop it asks hyper to finish the requests in flight and close (an HTTP/1
//!   response then carries `Connection: close`, an HTTP/2 connection gets GOAWAY);
//! - `ConnIo`, which records activity and follows HTTP/1 request framing on the raw bytes:
//!   that is how the timers know where a head starts, and how a request carrying both
//!   `Content-Length` and `Transfer-Encoding` is found — hyper quietly drops the former, so the
//!   handler could not otherwise see (and refuse) the combination.

mod conn_state;
mod connection;
pub(crate) mod h1_scan;
mod io;
mod listener;
pub mod proxy_protocol;
mod service;
mod workers;

pub use self::conn_state::{ConnInfo, ConnState, RequestGuard};
pub use self::connection::builder;
pub use self::service::{BoxError, Handler};
pub use self::workers::{bind, serve, Listeners};
