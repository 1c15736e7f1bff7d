//! The reverse proxy: the per-request path (route → subject → limits → forward) and what it
//! needs: error responses, header rewriting, the streamed request body, protocol upgrades.

mod body;
mod error;
mod handler;
mod headers;
mod upgrade;

pub use self::body::{BodyError, BodyFault, RequestBody};
pub use self::error::ProxyError;
pub use self::handler::{handle, ConnInfo};
pub use self::headers::{append_forwarded_for, drop_underscored, strip_hop_by_hop};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

/// A response body: streamed from the upstream, or written by the gateway.
pub type ResBody = Either<Incoming, Full<Bytes>>;

/// The pooled keep-alive client to upstreams.
pub type UpstreamClient = Client<HttpConnector, RequestBody>;

/// Builds the upstream client: keep-alive pool, `TCP_NODELAY`, connect timeout.
pub fn upstream_client() -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
    connector.set_keepalive(Some(std::time::Duration::from_secs(60)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}
