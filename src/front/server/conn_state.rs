//! What a connection's task, its IO and the requests on it share: activity and timers
//! ([`ConnState`]), one request's place on the connection ([`RequestGuard`]), and what the request
//! handler is told of the connection ([`ConnInfo`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;

/// What the request handler knows of the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    /// The peer's IP address as a header value, built once per connection (`X-Forwarded-For`).
    pub peer_ip: HeaderValue,
    pub tls: bool,
    /// The verified client certificate's facts (mTLS), worked out once at the handshake.
    pub client_cert: Option<Arc<crate::tls::peer::PeerCert>>,
    /// Activity, in-flight count and framing findings of the connection.
    pub state: Arc<ConnState>,
}

/// How an expired connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// Ask hyper to close (an HTTP/2 client gets GOAWAY).
    Graceful,
    /// Drop the connection.
    Now,
}

/// The connection timeouts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    pub(super) idle: Duration,
    pub(super) header: Duration,
}

/// What the connection task, its IO and the requests on it share.
#[derive(Debug)]
pub struct ConnState {
    pub(super) epoch: Instant,
    /// Milliseconds after `epoch` of the last byte read or written.
    pub(super) last_active_ms: AtomicU64,
    /// 1 + milliseconds after `epoch` when the HTTP/1 request head being read began; 0: none.
    pub(super) head_since_ms: AtomicU64,
    /// Set once the connection switched protocols: its bytes are no longer HTTP.
    pub(super) upgraded: AtomicBool,
    pub(super) in_flight: AtomicUsize,
    pub(super) requests: AtomicU64,
    /// 1 + the index of the first HTTP/1 request head that carried both `Content-Length` and
    /// `Transfer-Encoding`; 0 while there is none.
    pub(super) conflicting: AtomicU64,
    pub(super) linger: AtomicBool,
    /// The bytes request bodies not yet decided hold on this connection
    /// ([`crate::front::pending::PendingBodies`]).
    pub pending_bodies: AtomicUsize,
}

impl ConnState {
    pub(super) fn new() -> Arc<ConnState> {
        Arc::new(ConnState {
            epoch: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(0),
            upgraded: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            conflicting: AtomicU64::new(0),
            linger: AtomicBool::new(false),
            pending_bodies: AtomicUsize::new(0),
        })
    }

    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    pub(super) fn touch(&self) {
        self.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    pub(super) fn head_started(&self) {
        self.head_since_ms
            .store(self.now_ms() + 1, Ordering::Relaxed);
    }

    pub(super) fn head_done(&self) {
        self.head_since_ms.store(0, Ordering::Relaxed);
    }

    /// Marks the connection as switched to another protocol (after a `101`).
    pub fn set_upgraded(&self) {
        self.upgraded.store(true, Ordering::Release);
    }

    /// When a byte last went either way on this connection.
    pub fn last_active(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed))
    }

    /// Counts a request that hyper handed to the service; the guard ends it when dropped.
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        let index = self.requests.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            state: self.clone(),
            index,
        }
    }

    /// Asks for a lingering close: the connection ends after a response to a request whose body
    /// was not read in full.
    pub fn linger_on_close(&self) {
        self.linger.store(true, Ordering::Release);
    }

    /// When the connection is due to be closed if nothing changes, and how; `None` while a
    /// request is in flight. Idle (no byte either way for `idle`): a graceful close. Slow (no
    /// first request within `header` of the start, or a request head begun more than `header`
    /// ago and not complete): dropped at once, as there is no request to finish.
    pub(super) fn deadline(&self, t: Timeouts) -> Option<(Instant, Close)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle = self.last_active() + t.idle;
        let mut slow: Option<Instant> = None;
        if self.requests.load(Ordering::Acquire) == 0 {
            slow = Some(self.epoch + t.header);
        }
        if let Some(since) = self.head_since_ms.load(Ordering::Relaxed).checked_sub(1) {
            let due = self.epoch + Duration::from_millis(since) + t.header;
            slow = Some(slow.map_or(due, |s| s.min(due)));
        }
        Some(match slow {
            Some(s) if s <= idle => (s, Close::Now),
            _ => (idle, Close::Graceful),
        })
    }

    /// When to look at the connection again.
    pub(super) fn next_check(&self, t: Timeouts) -> Instant {
        self.deadline(t)
            .map_or_else(|| Instant::now() + t.idle.min(t.header), |(due, _)| due)
    }

    /// Whether (and how) the connection should be closed now.
    pub(super) fn expired(&self, t: Timeouts) -> Option<Close> {
        self.deadline(t)
            .and_then(|(due, how)| (Instant::now() >= due).then_some(how))
    }
}

/// One request on a connection, from hyper handing it over until the response head is returned.
#[derive(Debug)]
pub struct RequestGuard {
    state: Arc<ConnState>,
    index: u64,
}

impl RequestGuard {
    /// Whether the request head carried both `Content-Length` and `Transfer-Encoding` (hyper
    /// keeps only the latter, so only the raw bytes tell).
    pub fn conflicting_framing(&self) -> bool {
        self.state.conflicting.load(Ordering::Acquire) == self.index + 1
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.state.touch();
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
