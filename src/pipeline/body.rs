//! The request body's JSON fields, for routes whose limits read them (`json:` subject parts,
//! `reserve = "json:…"`: [`Route::json_paths`]). The front reads the body's first bytes — at
//! most the route's `max_json_bytes` and one more frame — before the limits are decided, and
//! later sends them upstream followed by the rest of the body, unchanged.
//!
//! A body that ends within `max_json_bytes` is looked up ([`crate::body_cost::json_fields`]); a larger one,
//! or one that is not JSON, has none of the fields (its `json:` parts are missing, its
//! reservations the limits' `cost`), and is still forwarded whole. A body that cannot be read
//! is the client's fault, answered as when it is streamed: 408 (no data for
//! `body_read_timeout`), 400 (malformed or cut), 413 (above `max_body_size`).

use std::future::Future;

use super::answer::ProxyError;
use crate::body_cost::json_fields::{self, Fields};
use crate::routing::Route;

/// What a front read of the request body before the limits.
pub struct Prefix<'a> {
    /// The body's first bytes, as received.
    pub bytes: &'a [u8],
    /// Whether they are the whole body.
    pub whole: bool,
}

/// A request body a front can read the start of before the limits.
pub trait BodyPrefix: Send {
    /// Reads the body until it has ended or more than `max` bytes of it have arrived (so
    /// holding at most `max` bytes and one frame more), keeping what it read for the upstream.
    /// `Err`: the answer to a body that cannot be read: 408 (no data for `body_read_timeout`),
    /// 400 (malformed, cut), 413 (more than `max_body_size`, the route's).
    fn read(
        &mut self,
        max: u64,
        max_body_size: u64,
    ) -> impl Future<Output = Result<Prefix<'_>, ProxyError>> + Send;
}

/// A body that is not read before the limits: its fields are all missing. What `/-/explain`
/// has (no body), and the fast HTTP/1 front, which hands the routes that read bodies to hyper.
pub struct Unread;

impl BodyPrefix for Unread {
    async fn read(&mut self, _: u64, _: u64) -> Result<Prefix<'_>, ProxyError> {
        Ok(Prefix {
            bytes: &[],
            whole: false,
        })
    }
}

/// A body held elsewhere (a front's, read in its place).
impl<B: BodyPrefix> BodyPrefix for &mut B {
    fn read(
        &mut self,
        max: u64,
        max_body_size: u64,
    ) -> impl Future<Output = Result<Prefix<'_>, ProxyError>> + Send {
        (**self).read(max, max_body_size)
    }
}

/// A body that may be gone (handed on already): read as [`Unread`] then.
impl<B: BodyPrefix> BodyPrefix for Option<B> {
    async fn read(&mut self, max: u64, max_body_size: u64) -> Result<Prefix<'_>, ProxyError> {
        match self {
            Some(b) => b.read(max, max_body_size).await,
            None => Ok(Prefix {
                bytes: &[],
                whole: false,
            }),
        }
    }
}

/// The fields `route`'s limits read from the request body; `None` for a route that reads none.
pub async fn fields<'r>(
    route: &'r Route,
    body: &mut impl BodyPrefix,
) -> Result<Option<Fields<'r>>, ProxyError> {
    if route.json_paths.is_empty() {
        return Ok(None);
    }
    let max = route.max_json_bytes;
    let prefix = body.read(max, route.max_body_size).await?;
    let within = u64::try_from(prefix.bytes.len()).is_ok_and(|n| n <= max);
    Ok(Some(if prefix.whole && within {
        json_fields::extract(&route.json_paths, prefix.bytes)
    } else {
        Fields::missing(&route.json_paths)
    }))
}
