//! The reverse proxy's hyper front: requests parsed by hyper go through the request pipeline
//! ([`crate::pipeline`]); this module applies its edits, talks to upstreams (a route's URL or
//! a group with retries), streams bodies both ways, tunnels upgrades and renders answers.

pub(crate) mod attempt;
pub mod body;
mod handler;
mod headers;
pub mod https_redirect;
mod response;
mod upgrade;

pub use self::body::{BodyError, BodyFault, BodySlot, BoxError, ClientBody, RequestBody};
pub use self::handler::handle;
pub(crate) use self::handler::{accepts_trailers, join_cookie_crumbs};
pub(crate) use self::headers::one_content_length;
pub use self::headers::{drop_underscored, strip_hop_by_hop};
pub use self::response::{ResponseBodyError, UpstreamBody, MAX_TRAILER_BYTES};
pub use crate::pipeline::{append_forwarded_for, ProxyError};

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use crate::access_log::{AccessLog, HasAccessLog, Logged};
use crate::front::server::{ConnInfo, Handler};
use crate::pipeline::WorkerCtx;
use crate::runtime::state::Shared;

/// The proxy as the server's request [`Handler`]: one per worker, each with its own upstream
/// connection pool (built on the worker's thread, used only there). Cloned per request: one
/// reference count that no other worker touches.
#[derive(Clone)]
pub struct Proxy(Arc<Worker>);

/// What one worker's proxy owns.
pub struct Worker {
    shared: Arc<Shared>,
    client: UpstreamClient,
    /// This worker's index: its pool slot in each upstream group.
    index: usize,
    /// This worker's settle tasks (waited for when it drains).
    ctx: WorkerCtx,
    /// The same worker as the fast HTTP/1 front sees it (with the bytes request bodies not yet
    /// decided hold on this worker, on either front).
    front: crate::front::http1::Front,
}

impl HasAccessLog for Worker {
    fn access_log(&self) -> &AccessLog {
        &self.shared.access_log
    }
}

impl Proxy {
    /// Worker `index`'s proxy: call on the worker's runtime.
    pub fn new(shared: Arc<Shared>, index: usize) -> Proxy {
        let ctx = WorkerCtx::new(tollgate_limit::worker::WorkerId::new(index));
        Proxy(Arc::new(Worker {
            front: crate::front::http1::Front {
                shared: shared.clone(),
                worker: index,
                ctx: ctx.clone(),
                pending_bodies: std::sync::atomic::AtomicUsize::new(0),
            },
            shared,
            client: upstream_client(),
            index,
            ctx,
        }))
    }
}

impl Handler for Proxy {
    type Body = ProxyBody;

    async fn call(self, conn: ConnInfo, req: http::Request<Incoming>) -> http::Response<ProxyBody> {
        // Boxed: the request's future is a few KB, and hyper moves the service future into its
        // slot; one allocation is cheaper than copying it (measured: memmove was 4 % of CPU).
        let tls = conn.tls;
        let (res, record) = Box::pin(handle(
            &self.0.shared,
            &self.0.client,
            self.0.index,
            &self.0.ctx,
            &self.0.front.pending_bodies,
            conn,
            req,
        ))
        .await;
        // HTTP/3 advertised on the TLS listener (`[server.http3]`).
        let mut res = res;
        if tls {
            if let Some(v) = self.0.shared.tls.as_ref().and_then(|t| t.alt_svc()) {
                res.headers_mut()
                    .entry(http::header::ALT_SVC)
                    .or_insert_with(|| v.clone());
            }
        }
        match record {
            None => res.map(Either::Left),
            // The worker's own `Arc` (this clone) goes with the body: sending the record costs
            // no reference count another worker touches.
            Some(r) => res.map(|b| Either::Right(Logged::new(b, r, self.0))),
        }
    }

    async fn serve_http1<T>(
        &self,
        io: T,
        client: crate::front::http1::Client,
        limits: crate::front::http1::Limits,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<crate::front::http1::Handoff<T>>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        crate::front::http1::serve(&self.0.front, io, &client, limits, stop).await
    }

    fn settled(&self, max: std::time::Duration) -> impl std::future::Future<Output = ()> + Send {
        let ctx = self.0.ctx.clone();
        async move { ctx.settled(max).await }
    }
}

/// A response body: streamed from the upstream, or written by the gateway.
pub type ResBody = Either<UpstreamBody, Full<Bytes>>;

/// A response body as sent: as is, or counted and logged when the access log is on.
pub type ProxyBody = Either<ResBody, Logged<ResBody, Worker>>;

/// The pooled keep-alive client to upstreams (for a front whose client bodies are `B`).
pub type UpstreamClient<B = Incoming> = Client<HttpConnector, RequestBody<B>>;

/// Builds the upstream client: keep-alive pool, `TCP_NODELAY`, connect timeout.
pub fn upstream_client<B: ClientBody>() -> UpstreamClient<B> {
    let connector =
        crate::upstream::connect::tcp_connector(crate::config::upstream::DEFAULT_CONNECT_TIMEOUT);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        // Header names in the client's (and the upstream's) case, as the fast front and nginx.
        .http1_preserve_header_case(true)
        .http1_max_buf_size(crate::upstream::connect::UPSTREAM_READ_BUFFER)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}
