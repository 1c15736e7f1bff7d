//! The `[rls] listen` gRPC listener: HTTP/2 (prior knowledge, as Envoy's gRPC client speaks)
//! served by hyper, each call handed to its service by its path (`ShouldRateLimit`, and the quota
//! service's `StreamRateLimitQuotas`, each decoding its messages with strings as bytes). Bounded: at most
//! [`MAX_CONNECTIONS`] connections, [`MAX_STREAMS`] calls in flight per connection (and as many
//! calls reset by the client before they are read: Envoy's filter timeout), a message
//! of at most [`MAX_MESSAGE_BYTES`], 16 KiB of headers; HTTP/2 flow control bounds what a
//! client that never reads its replies can make the server hold. Timed as the proxy listener
//! is ([`Timers`]): a connection that starts no call within `[server] header_read_timeout`
//! (silent, or half an HTTP/2 preface) is closed, and one with no call in flight for
//! `idle_timeout` is closed with a GOAWAY.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use super::rlqs::QuotaService;
use super::rlqs_budget::ConnectionBudget;
use super::service::RateLimiter;
use super::{Source, Timers};

/// Connections served at once; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 4096;
/// Calls in flight on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_STREAMS: u32 = 1024;
/// The largest request message (a call's descriptors are a few hundred bytes).
pub use super::service::MAX_MESSAGE_BYTES;

/// How long a connection told to close (idle) may take to do so before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

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
    let rls = RateLimiter::new(source.clone());
    let rlqs = QuotaService::new(source.clone());
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
        let timers = source.timers();
        // The quota service's bounds of this connection (streams, buckets, unread replies).
        let quota_budget = ConnectionBudget::new();
        tokio::spawn(async move {
            let _slot = slot;
            let activity = Arc::new(Activity::new());
            let calls = activity.clone();
            let service =
                hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
                    let rls = rls.clone();
                    let rlqs = rlqs.clone();
                    let call = calls.begin();
                    let quota_budget = quota_budget.clone();
                    async move {
                        let answer = if req.uri().path().starts_with(RLS_PATH) {
                            Ok(rls.serve(req).await)
                        } else if req.uri().path().starts_with(RLQS_PATH) {
                            req.extensions_mut().insert(quota_budget);
                            Ok(rlqs.serve(req, MAX_MESSAGE_BYTES).await)
                        } else {
                            Ok::<_, Infallible>(
                                tonic::Status::unimplemented("no such service on the rls listener")
                                    .into_http(),
                            )
                        };
                        // In flight until its answer's body ends (an RLQS stream: its life).
                        answer.map(|a| a.map(|body| Guarded { body, _call: call }))
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
            tokio::pin!(conn);
            // `Some` once told to close because it idled: a hard deadline.
            let mut closing: Option<Instant> = None;
            loop {
                let wake = closing.unwrap_or_else(|| activity.next_check(timers));
                tokio::select! {
                    res = conn.as_mut() => {
                        if let Err(e) = res {
                            tracing::debug!(error = %e, "rls: connection ended");
                        }
                        return;
                    }
                    _ = tokio::time::sleep_until(wake) => {
                        if closing.is_some() {
                            tracing::debug!("rls: idle connection did not close in time; dropping it");
                            return;
                        }
                        match activity.expired(timers) {
                            Some(Expired::FirstCall) => {
                                tracing::debug!("rls: no call within header_read_timeout; closing");
                                return;
                            }
                            Some(Expired::Idle) => {
                                tracing::debug!("rls: closing idle connection");
                                conn.as_mut().graceful_shutdown();
                                closing = Some(Instant::now() + CLOSE_GRACE);
                            }
                            None => {}
                        }
                    }
                }
            }
        });
    }
}

/// What a connection's timers read (the proxy listener's, [`Timers`]): whether a call has
/// started, the calls in flight (a call is in flight until its answer's body ends) and when the
/// last one ended.
struct Activity {
    start: Instant,
    started: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds from `start` to the end of the last call.
    last_end_ms: AtomicU64,
}

/// Which timer ran out.
enum Expired {
    /// No call within `first_call`: closed at once (a silent connection, half a preface).
    FirstCall,
    /// No call in flight for `idle`: closed gracefully.
    Idle,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            started: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_end_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> CallGuard {
        self.started.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        CallGuard(self.clone())
    }

    fn last_end(&self) -> Instant {
        self.start + Duration::from_millis(self.last_end_ms.load(Ordering::Acquire))
    }

    /// When a timer may next run out.
    fn next_check(&self, t: Timers) -> Instant {
        if !self.started.load(Ordering::Acquire) {
            self.start + t.first_call
        } else if self.in_flight.load(Ordering::Acquire) > 0 {
            Instant::now() + t.idle
        } else {
            self.last_end() + t.idle
        }
    }

    fn expired(&self, t: Timers) -> Option<Expired> {
        let now = Instant::now();
        if !self.started.load(Ordering::Acquire) {
            return (now >= self.start + t.first_call).then_some(Expired::FirstCall);
        }
        (self.in_flight.load(Ordering::Acquire) == 0 && now >= self.last_end() + t.idle)
            .then_some(Expired::Idle)
    }
}

/// One call in flight.
struct CallGuard(Arc<Activity>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.store(ms, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its call in flight until it ends (or is dropped).
struct Guarded<B> {
    body: B,
    _call: CallGuard,
}

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
