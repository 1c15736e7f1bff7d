//! Who is calling: the client address (behind trusted proxies) and each limit's subject.
//!
//! `X-Forwarded-For` (or, with `forwarded_header = "forwarded"`, RFC 7239 `Forwarded` — one
//! family per listener, the other never read) is believed only when the TCP peer is a trusted
//! proxy, and then walked from the right, skipping trusted proxies, as nginx's
//! `real_ip_recursive` does: the first untrusted address is the client. Without trusted proxies
//! the headers are ignored, so a spoofed header never buys a fresh bucket. A hop the walk
//! reaches that is not an address, or an oversized header, leaves the client *underived*: counted
//! as the proxy, but inside no allow list or exemption (fail closed).
//!
//! [`client`]: the client address; [`consumer`]: the consumer a request was found to be;
//! [`fields`]: one header, cookie or query value as an upstream reads it; [`resolve`]: a limit's
//! subject as a digest; [`shown`]: a subject as `/-/top` and the access log show it.

mod client;
mod consumer;
pub(crate) mod fields;
mod resolve;
mod shown;
#[cfg(test)]
mod tests;

pub use client::*;
pub use consumer::*;
pub use fields::*;
pub use resolve::*;
pub use shown::*;
