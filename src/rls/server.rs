//! The `[rls] listen` gRPC listener: HTTP/2 (prior knowledge, as Envoy's gRPC client speaks)
//! served by hyper, each call handed to tonic's generated service by its path. Bounded: at most
//! [`MAX_CONNECTIONS`] connections, [`MAX_STREAMS`] calls in flight per connection (and as many
//! calls reset by the client before they are read: Envoy's filter timeout), a message
//! of at most [`MAX_MESSAGE_BYTES`], 16 KiB of headers; HTTP/2 flow control bounds what a
//! client that never reads its replies can make the server hold.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower_service::Service as _;

use super::rlqs::QuotaService;
use super::rlqs_budget::ConnectionBudget;
use super::service::RateLimiter;
use super::Source;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// Connections served at once; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 4096;
/// Calls in flight on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_STREAMS: u32 = 1024;
/// The largest request message (a call's descriptors are a few hundred bytes).
pub const MAX_MESSAGE_BYTES: usize = 256 << 10;

const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/";
const RLQS_PATH: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/";

/// Serves the listener until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn Source>,
    mut stop: watch::Receiver<bool>,
) {
    super::metrics::register();
    super::metrics::rlqs::register();
    let rls = RateLimitServiceServer::new(RateLimiter::new(source.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let rlqs = RateLimitQuotaServiceServer::new(QuotaService::new(source))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "rls: accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("rls: too many connections; closing one");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let rls = rls.clone();
        let rlqs = rlqs.clone();
        // The quota service's bounds of this connection (streams, buckets, unread replies).
        let quota_budget = ConnectionBudget::new();
        tokio::spawn(async move {
            let _slot = slot;
            let service =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    let mut rls = rls.clone();
                    let mut rlqs = rlqs.clone();
                    let quota_budget = quota_budget.clone();
                    async move {
                        if req.uri().path().starts_with(RLS_PATH) {
                            rls.call(req).await
                        } else if req.uri().path().starts_with(RLQS_PATH) {
                            req.extensions_mut().insert(quota_budget);
                            rlqs.call(req).await
                        } else {
                            Ok::<_, Infallible>(
                                tonic::Status::unimplemented("no such service on the rls listener")
                                    .into_http(),
                            )
                        }
                    }
                });
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .max_concurrent_streams(MAX_STREAMS)
                // Envoy resets every call its filter's timeout outlives (20 ms by default): under
                // load, many before they are accepted. h2's default (20 such at once) would close
                // the connection and fail every call on it; as many as calls in flight keeps the
                // rapid-reset guard (CVE-2023-44487) bounded by what a connection may hold anyway.
                .max_pending_accept_reset_streams(MAX_STREAMS as usize)
                .max_header_list_size(16 << 10)
                .keep_alive_interval(Some(Duration::from_secs(30)))
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "rls: connection ended");
            }
        });
    }
}
