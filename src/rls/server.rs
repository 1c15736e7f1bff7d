//! The `[rls] listen` gRPC listener: HTTP/2 (prior knowledge, as Envoy's gRPC client speaks)
//! served on the `h2` crate, each call handed to its service by its path. `ShouldRateLimit` is
//! answered by the connection's own task, without a framework ([`super::unary`]): its message
//! read where it arrived, decided at once when the store decides in process
//! ([`RateLimiter::answer`]), the answer's frames queued and written with the next flush — no
//! task, no boxed body, no future per call; a call whose message is not all there yet, or whose
//! store must be asked, gets a task of its own. The quota service's `StreamRateLimitQuotas`
//! runs in a task per stream through tonic's streaming plumbing ([`super::streaming`]).
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections, [`MAX_STREAMS`] calls in flight per
//! connection (and as many calls reset by the client before they are read: Envoy's filter
//! timeout), a message of at most [`MAX_MESSAGE_BYTES`], 16 KiB of headers; HTTP/2 flow
//! control bounds what a client that never reads its replies can make the server hold. Timed
//! as the proxy listener is ([`Timers`]): a connection that starts no call within `[server]
//! header_read_timeout` (silent, or half an HTTP/2 preface) is closed, and one with no call in
//! flight for `idle_timeout` is closed with a GOAWAY; a keep-alive PING every 30 s that is not
//! answered within 20 s closes a connection whose peer is gone.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use h2::server::{Connection, SendResponse};
use h2::RecvStream;
use prost::Message;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

use super::message::Call;
use super::metrics::undecoded;
use super::rlqs::QuotaService;
use super::rlqs_budget::ConnectionBudget;
use super::service::{Answer, RateLimiter, SHOULD_RATE_LIMIT};
use super::streaming::{pipe, RecvBody};
use super::unary::{self, Reader};
use super::{Source, Timers};

/// Connections served at once; more are closed as they come.
pub const MAX_CONNECTIONS: usize = 4096;
/// Calls in flight on one connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
pub const MAX_STREAMS: u32 = 1024;
/// The largest request message (a call's descriptors are a few hundred bytes).
pub use super::service::MAX_MESSAGE_BYTES;
/// The largest header list a call may send (`SETTINGS_MAX_HEADER_LIST_SIZE`).
const MAX_HEADER_LIST: u32 = 16 << 10;
/// HTTP/2 receive windows (hyper's defaults, as before): a stream's and the connection's.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 1 << 20;
/// What one stream may have queued to send beyond the client's window (hyper's default).
const MAX_SEND_BUFFER: usize = 400 << 10;

/// How long a connection told to close (idle) may take to do so before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// A keep-alive PING this often, and the connection closed if one is not answered in time.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

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
        let served = Served {
            rls: rls.clone(),
            rlqs: rlqs.clone(),
            // The quota service's bounds of this connection (streams, buckets, unread replies).
            quota_budget: ConnectionBudget::new(),
            activity: Arc::new(Activity::new()),
        };
        let timers = source.timers();
        tokio::spawn(async move {
            let _slot = slot;
            served.connection(stream, timers).await;
        });
    }
}

/// What one connection serves, and its calls' activity.
struct Served {
    rls: RateLimiter,
    rlqs: QuotaService,
    quota_budget: ConnectionBudget,
    activity: Arc<Activity>,
}

impl Served {
    async fn connection(self, tcp: TcpStream, timers: Timers) {
        let first_call = self.activity.start + timers.first_call;
        let handshake = h2::server::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_concurrent_streams(MAX_STREAMS)
            // Envoy resets every call its filter's timeout outlives (20 ms by default): under
            // load, many before they are accepted. h2's default (20 such at once) would close
            // the connection and fail every call on it; as many as calls in flight keeps the
            // rapid-reset guard (CVE-2023-44487) bounded by what a connection may hold anyway.
            .max_pending_accept_reset_streams(MAX_STREAMS as usize)
            .max_local_error_reset_streams(Some(MAX_STREAMS as usize))
            .max_header_list_size(MAX_HEADER_LIST)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .handshake::<_, Bytes>(tcp);
        let mut conn: Connection<TcpStream, Bytes> = tokio::select! {
            c = handshake => match c {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "rls: no HTTP/2 connection");
                    return;
                }
            },
            _ = tokio::time::sleep_until(first_call) => {
                tracing::debug!("rls: no call within header_read_timeout; closing");
                return;
            }
        };
        let mut keep_alive = KeepAlive::new(conn.ping_pong());
        // `Some` once told to close because it idled: a hard deadline.
        let mut closing: Option<Instant> = None;
        let wake = |closing: Option<Instant>, keep_alive: &KeepAlive| {
            closing
                .unwrap_or_else(|| self.activity.next_check(timers))
                .min(keep_alive.next())
        };
        // One timer, armed again only when it runs out: a call arms nothing.
        let timer = tokio::time::sleep_until(wake(closing, &keep_alive));
        tokio::pin!(timer);
        loop {
            tokio::select! {
                biased;
                accepted = poll_fn(|cx| conn.poll_accept(cx)) => match accepted {
                    Some(Ok((req, respond))) => self.dispatch(req, respond),
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "rls: connection ended");
                        return;
                    }
                    None => return,
                },
                pong = keep_alive.pong() => if !pong {
                    return;
                },
                () = &mut timer => {
                    let now = Instant::now();
                    if closing.is_some_and(|c| now >= c) {
                        tracing::debug!("rls: idle connection did not close in time; dropping it");
                        return;
                    }
                    if !keep_alive.tick(now) {
                        tracing::debug!("rls: keep-alive PING not answered in time; closing");
                        return;
                    }
                    if closing.is_none() {
                        match self.activity.expired(timers) {
                            Some(Expired::FirstCall) => {
                                tracing::debug!("rls: no call within header_read_timeout; closing");
                                return;
                            }
                            Some(Expired::Idle) => {
                                tracing::debug!("rls: closing idle connection");
                                conn.graceful_shutdown();
                                closing = Some(now + CLOSE_GRACE);
                            }
                            None => {}
                        }
                    }
                    timer.as_mut().reset(wake(closing, &keep_alive));
                }
            }
        }
    }

    /// Hands a call to its service by its path.
    fn dispatch(&self, req: http::Request<RecvStream>, mut respond: SendResponse<Bytes>) {
        let call = self.activity.begin();
        let path = req.uri().path();
        if path == SHOULD_RATE_LIMIT {
            let (head, mut body) = req.into_parts();
            if let Err(status) = unary::encoding(&head.headers) {
                undecoded(status.code());
                return unary::send_status(&mut respond, status);
            }
            let mut reader = Reader::new(MAX_MESSAGE_BYTES);
            // The message usually came with the call's head: read here, without a waker.
            let mut cx = Context::from_waker(Waker::noop());
            match reader.poll(&mut body, &mut cx) {
                Poll::Ready(read) => match decode(&self.rls, read) {
                    Answer::Now(answer) => unary::send(&mut respond, answer),
                    Answer::Later(answer) => {
                        tokio::spawn(async move {
                            unary::send(&mut respond, answer.await);
                            drop(call);
                        });
                    }
                },
                Poll::Pending => {
                    let rls = self.rls.clone();
                    tokio::spawn(async move {
                        let read = poll_fn(|cx| reader.poll(&mut body, cx)).await;
                        let answer = match decode(&rls, read) {
                            Answer::Now(answer) => answer,
                            Answer::Later(answer) => answer.await,
                        };
                        unary::send(&mut respond, answer);
                        drop(call);
                    });
                }
            }
        } else if path.starts_with(RLS_PATH) {
            undecoded(tonic::Code::Unimplemented);
            unary::send_status(
                &mut respond,
                tonic::Status::unimplemented("no such method of the rate limit service"),
            );
        } else if path.starts_with(RLQS_PATH) {
            let rlqs = self.rlqs.clone();
            let budget = self.quota_budget.clone();
            tokio::spawn(async move {
                let (head, body) = req.into_parts();
                let mut req = http::Request::from_parts(head, RecvBody(body));
                req.extensions_mut().insert(budget);
                let (head, body) = rlqs.serve(req, MAX_MESSAGE_BYTES).await.into_parts();
                let end = http_body::Body::is_end_stream(&body);
                if let Ok(send) = respond.send_response(http::Response::from_parts(head, ()), end) {
                    if !end {
                        pipe(body, send).await;
                    }
                }
                // In flight until its answer's body ends: the stream's life.
                drop(call);
            });
        } else {
            unary::send_status(
                &mut respond,
                tonic::Status::unimplemented("no such service on the rls listener"),
            );
        }
    }
}

/// A call's message decoded and handed to the service; one that cannot be read or decoded is
/// answered with its status and counted by reason (see [`super::metrics::undecoded`]).
fn decode(rls: &RateLimiter, read: Result<Bytes, tonic::Status>) -> Answer {
    let decoded = read.and_then(|message| {
        Call::decode(message).map_err(|e| tonic::Status::internal(e.to_string()))
    });
    match decoded {
        Ok(call) => rls.answer(call),
        Err(status) => {
            undecoded(status.code());
            Answer::Now(Err(status))
        }
    }
}

/// The connection's keep-alive: a PING every [`KEEP_ALIVE_INTERVAL`], answered within
/// [`KEEP_ALIVE_TIMEOUT`].
struct KeepAlive {
    ping: Option<h2::PingPong>,
    /// When the next PING is due, or (one in flight) when it must be answered by.
    at: Instant,
    in_flight: bool,
}

impl KeepAlive {
    fn new(ping: Option<h2::PingPong>) -> KeepAlive {
        KeepAlive {
            ping,
            at: Instant::now() + KEEP_ALIVE_INTERVAL,
            in_flight: false,
        }
    }

    fn next(&self) -> Instant {
        self.at
    }

    /// The timer ran out (at `now`): a PING is sent when due; `false` when the one in flight
    /// was not answered in time.
    fn tick(&mut self, now: Instant) -> bool {
        if now < self.at {
            return true;
        }
        if self.in_flight {
            return false;
        }
        match self.ping.as_mut().map(|p| p.send_ping(h2::Ping::opaque())) {
            Some(Ok(())) => {
                self.in_flight = true;
                self.at = now + KEEP_ALIVE_TIMEOUT;
            }
            // No PING to send (the connection is ending): nothing to wait for.
            _ => self.at = now + KEEP_ALIVE_INTERVAL,
        }
        true
    }

    /// The answer to the PING in flight (pending while none is): `false` if the connection
    /// failed meanwhile.
    async fn pong(&mut self) -> bool {
        let answered = poll_fn(|cx: &mut Context<'_>| match self.ping.as_mut() {
            Some(p) if self.in_flight => p.poll_pong(cx).map(|r| r.is_ok()),
            _ => Poll::Pending,
        })
        .await;
        self.in_flight = false;
        self.at = Instant::now() + KEEP_ALIVE_INTERVAL;
        answered
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
