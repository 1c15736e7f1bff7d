//! What the server hands each request to. The server knows connections, timers and drains; what
//! a request means (routing, limits, the upstream) is the handler's, built once per worker so
//! that what it owns (an upstream connection pool) never crosses threads.

use std::future::Future;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;

use super::ConnInfo;

/// A boxed error, as hyper takes body errors.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request service of one worker: cloned into each connection, called for each request.
pub trait Handler: Clone + Send + Sync + 'static {
    /// The response body.
    type Body: hyper::body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static;

    /// Answers one request (on a clone: the future owns what it uses). Cancellation-safe: hyper
    /// drops the future when the client goes away.
    fn call(
        self,
        conn: ConnInfo,
        req: Request<Incoming>,
    ) -> impl Future<Output = Response<Self::Body>> + Send + 'static;

    /// Waits (at most `max`) for what the worker's requests left running to finish (the
    /// settle tasks of their last responses): run by a draining worker before its runtime ends.
    fn settled(&self, max: std::time::Duration) -> impl Future<Output = ()> + Send {
        let _ = max;
        std::future::ready(())
    }
}
