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

    /// Serves an HTTP/1 connection with a front of the handler's own (`[server] http1 =
    /// "fast"`) until it ends (`None`), or hands it back with the bytes read so far for hyper
    /// to serve from there on (`Some`). The default hands every connection to hyper at once.
    fn serve_http1<'a, T>(
        &'a self,
        io: T,
        client: crate::front::http1::Client,
        limits: crate::front::http1::Limits,
        stop: &'a mut tokio::sync::watch::Receiver<bool>,
    ) -> impl Future<Output = Option<crate::front::http1::Handoff<T>>> + Send + 'a
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let _ = (client, limits, stop);
        std::future::ready(Some(crate::front::http1::Handoff {
            io,
            read: Bytes::new(),
        }))
    }

    /// Waits (at most `max`) for what the worker's requests left running to finish (the
    /// settle tasks of their last responses): run by a draining worker before its runtime ends.
    fn settled(&self, max: std::time::Duration) -> impl Future<Output = ()> + Send {
        let _ = max;
        std::future::ready(())
    }
}
