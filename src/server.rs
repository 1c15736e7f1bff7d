//! The proxy listener: accepts connections (plain or TLS), serves HTTP/1.1 and HTTP/2 on each
//! with hyper's auto builder, closes idle connections and drains gracefully.
//!
//! HTTP/2 concurrent streams and header-list size are bounded explicitly (CONTINUATION and rapid
//! reset floods), and a header block above `max_header_bytes` gets hyper's 431.
//!
//! Each connection runs in one task that owns what hyper does not do (or not the way we need):
//! - the timers. `header_read_timeout` runs from the first byte of a request head, empty lines
//!   before its request line included (and from the connection's start until its first request), so slowloris connections are closed;
//!   `idle_timeout` closes a connection with no request in flight and no byte either way.
//!   hyper's own HTTP/1 header timer starts as soon as a keep-alive connection goes idle, which
//!   would cap keep-alive at `header_read_timeout`; it is kept only as a backstop, at
//!   `idle_timeout + header_read_timeout`;
//! - the drain: on stop it asks hyper to finish the requests in flight and close (an HTTP/1
//!   response then carries `Connection: close`, an HTTP/2 connection gets GOAWAY);
//! - `ConnIo`, which records activity and follows HTTP/1 request framing on the raw bytes:
//!   that is how the timers know where a head starts, and how a request carrying both
//!   `Content-Length` and `Transfer-Encoding` is found — hyper quietly drops the former, so the
//!   handler could not otherwise see (and refuse) the combination.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::{ServerConfig, MAX_TIMEOUT};
use crate::gateway::Shared;
use crate::proxy::{handle, ConnInfo};

/// How long a connection told to close (idle) may take to do so before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// How long a connection closed on a request it did not read in full (413, 408, 400) keeps
/// reading and discarding, so the client can still read the answer. Closing a socket with
/// unread input resets the connection, and a reset can destroy the response in flight.
const LINGER: Duration = Duration::from_secs(2);

/// The connection builder for the current server settings.
pub fn builder(cfg: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // A backstop only: the connection task enforces both timeouts precisely (see above).
        // Capped: hyper adds it to an `Instant`, which panics on overflow.
        .header_read_timeout(
            cfg.header_read_timeout
                .saturating_add(cfg.idle_timeout)
                .min(MAX_TIMEOUT.saturating_mul(2)),
        )
        .max_buf_size(cfg.max_header_bytes.max(8192))
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(cfg.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(cfg.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

/// Accepts until `stop` turns true, then waits for in-flight requests (up to the grace period).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    // Every connection task holds a clone of `live`; the drain is over when all are dropped.
    let (live, mut drained) = mpsc::channel::<()>(1);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let snap = shared.snapshot.load();
        let settings = Settings::of(&snap.config.server);
        drop(snap);
        let conn = Connection {
            shared: shared.clone(),
            peer,
            settings,
            stop: stop.clone(),
            _live: live.clone(),
        };
        tokio::spawn(conn.run(stream));
    }
    // Stop accepting at once: new connections are refused from here on.
    drop(listener);
    drop(live);
    let grace = shared.snapshot.load().config.server.grace_period;
    tokio::select! {
        _ = drained.recv() => tracing::info!("all connections drained"),
        _ = tokio::time::sleep(grace) => tracing::warn!(grace_period = ?grace, "grace period over; closing remaining connections"),
    }
}

/// The server settings a connection is started with (a reload applies to new connections).
struct Settings {
    builder: auto::Builder<TokioExecutor>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_head: usize,
}

impl Settings {
    fn of(cfg: &ServerConfig) -> Settings {
        Settings {
            builder: builder(cfg),
            // Validation bounds both; capped again so deadlines cannot overflow an `Instant`.
            header_read_timeout: cfg.header_read_timeout.min(MAX_TIMEOUT),
            idle_timeout: cfg.idle_timeout.min(MAX_TIMEOUT),
            max_head: cfg.max_header_bytes.max(8192),
        }
    }
}

/// One accepted connection, before and during serving.
struct Connection {
    shared: Arc<Shared>,
    peer: std::net::SocketAddr,
    settings: Settings,
    stop: watch::Receiver<bool>,
    /// Dropped when the connection is done: what the drain waits for.
    _live: mpsc::Sender<()>,
}

impl Connection {
    async fn run(self, stream: TcpStream) {
        let Some(tls) = &self.shared.tls else {
            let state = ConnState::new();
            let io = ConnIo::new(stream, state.clone(), Some(self.settings.max_head));
            return self.serve(io, state, false).await;
        };
        let acceptor = tls.acceptor();
        let peer = self.peer;
        // The handshake runs in this connection's task, so a slow one never holds up accepting.
        let stream = match tokio::time::timeout(
            self.settings.header_read_timeout,
            acceptor.accept(stream),
        )
        .await
        {
            Ok(Ok(s)) => s,
            // A connection closed before completing a handshake (a TCP health check, a client
            // giving up) is not counted; one that sent something that is not TLS is.
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                tracing::debug!(error = %e, %peer, "connection closed during the TLS handshake");
                return;
            }
            Ok(Err(e)) => {
                metrics::counter!(crate::metrics::TLS_HANDSHAKE_ERRORS).increment(1);
                tracing::debug!(error = %e, %peer, "TLS handshake failed");
                return;
            }
            Err(_) => {
                metrics::counter!(crate::metrics::TLS_HANDSHAKE_ERRORS).increment(1);
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        let state = ConnState::new();
        let scan = (!h2).then_some(self.settings.max_head);
        let io = ConnIo::new(stream, state.clone(), scan);
        self.serve(io, state, true).await;
    }

    async fn serve<T>(mut self, io: ConnIo<T>, state: Arc<ConnState>, tls: bool)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let info = ConnInfo {
            peer: self.peer,
            tls,
            state: state.clone(),
        };
        let shared = self.shared.clone();
        let svc = service_fn(move |req| handle(shared.clone(), info.clone(), req));
        let conn = self
            .settings
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), svc);
        tokio::pin!(conn);
        let peer = self.peer;
        let limits = Timeouts {
            idle: self.settings.idle_timeout,
            header: self.settings.header_read_timeout,
        };
        // `Some` once the connection was told to close because it idled: a hard deadline.
        let mut closing: Option<Instant> = None;
        let mut draining = *self.stop.borrow_and_update();
        if draining {
            conn.as_mut().graceful_shutdown();
        }
        loop {
            let wake = match closing {
                Some(deadline) => deadline,
                None => state.next_check(limits),
            };
            tokio::select! {
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    return;
                }
                _ = self.stop.changed(), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = tokio::time::sleep_until(wake) => {
                    if closing.is_some() {
                        tracing::debug!(%peer, "idle connection did not close in time; dropping it");
                        return;
                    }
                    match state.expired(limits) {
                        None => {}
                        Some(Close::Now) => {
                            tracing::debug!(%peer, "no complete request head in time; closing");
                            return;
                        }
                        Some(Close::Graceful) => {
                            tracing::debug!(%peer, "closing idle connection");
                            closing = Some(Instant::now() + CLOSE_GRACE);
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
        }
    }
}

/// How an expired connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// Ask hyper to close (an HTTP/2 client gets GOAWAY).
    Graceful,
    /// Drop the connection.
    Now,
}

/// The connection timeouts.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    idle: Duration,
    header: Duration,
}

/// What the connection task, its IO and the requests on it share.
#[derive(Debug)]
pub struct ConnState {
    epoch: Instant,
    /// Milliseconds after `epoch` of the last byte read or written.
    last_active_ms: AtomicU64,
    /// 1 + milliseconds after `epoch` when the HTTP/1 request head being read began; 0: none.
    head_since_ms: AtomicU64,
    /// Set once the connection switched protocols: its bytes are no longer HTTP.
    upgraded: AtomicBool,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    /// 1 + the index of the first HTTP/1 request head that carried both `Content-Length` and
    /// `Transfer-Encoding`; 0 while there is none.
    conflicting: AtomicU64,
    linger: AtomicBool,
}

impl ConnState {
    fn new() -> Arc<ConnState> {
        Arc::new(ConnState {
            epoch: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(0),
            upgraded: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            conflicting: AtomicU64::new(0),
            linger: AtomicBool::new(false),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    fn touch(&self) {
        self.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn head_started(&self) {
        self.head_since_ms
            .store(self.now_ms() + 1, Ordering::Relaxed);
    }

    fn head_done(&self) {
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
    fn deadline(&self, t: Timeouts) -> Option<(Instant, Close)> {
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
    fn next_check(&self, t: Timeouts) -> Instant {
        self.deadline(t)
            .map_or_else(|| Instant::now() + t.idle.min(t.header), |(due, _)| due)
    }

    /// Whether (and how) the connection should be closed now.
    fn expired(&self, t: Timeouts) -> Option<Close> {
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

/// The client connection's IO: records activity, follows HTTP/1 request framing, and lingers
/// on close when asked to.
struct ConnIo<T: AsyncRead + Unpin + Send + 'static> {
    /// `None` only once dropped.
    inner: Option<T>,
    state: Arc<ConnState>,
    scan: Option<h1::Scan>,
    /// The scanner's head count and whether it was inside a head, after the last read.
    seen_heads: u64,
    in_head: bool,
}

impl<T: AsyncRead + Unpin + Send + 'static> ConnIo<T> {
    /// `scan`: the largest request head to follow (`None`: HTTP/2, nothing to follow).
    fn new(inner: T, state: Arc<ConnState>, scan: Option<usize>) -> ConnIo<T> {
        state.touch();
        ConnIo {
            inner: Some(inner),
            state,
            scan: scan.map(h1::Scan::new),
            seen_heads: 0,
            in_head: false,
        }
    }

    /// Runs the scanner over newly read bytes and updates the head timer and framing finding.
    fn follow(&mut self, new: &[u8]) {
        let Some(scan) = &mut self.scan else { return };
        if self.state.upgraded.load(Ordering::Acquire) {
            self.scan = None;
            self.state.head_done();
            return;
        }
        if let Some(index) = scan.feed(new) {
            let _ = self.state.conflicting.compare_exchange(
                0,
                index + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        let in_head = scan.in_head();
        if in_head && (!self.in_head || scan.heads() != self.seen_heads) {
            self.state.head_started();
        } else if !in_head && self.in_head {
            self.state.head_done();
        }
        self.in_head = in_head;
        self.seen_heads = scan.heads();
        if scan.is_done() {
            self.scan = None;
        }
    }

    fn inner(&mut self) -> io::Result<&mut T> {
        self.inner
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl<T: AsyncRead + Unpin + Send + 'static> Drop for ConnIo<T> {
    fn drop(&mut self) {
        if !self.state.linger.load(Ordering::Acquire) {
            return;
        }
        let (Some(mut io), Ok(rt)) = (self.inner.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        rt.spawn(async move {
            let mut sink = vec![0u8; 16 * 1024];
            let _ = tokio::time::timeout(LINGER, async {
                while let Ok(n) = io.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        });
    }
}

impl<T: AsyncRead + Unpin + Send + 'static> AsyncRead for ConnIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(this.inner()?).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = res {
            let new = &buf.filled()[before..];
            if !new.is_empty() {
                this.state.touch();
                this.follow(new);
            }
        }
        res
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for ConnIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(this.inner()?).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res {
            if n > 0 {
                this.state.touch();
            }
        }
        res
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(this.inner()?).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = res {
            if n > 0 {
                this.state.touch();
            }
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().inner()?).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().inner()?).poll_shutdown(cx)
    }
}

mod h1 {
    //! Follows HTTP/1 request framing over the bytes read from a client, the way hyper's parser
    //! and chunked decoder do, to find the request heads that carry both `Content-Length` and
    //! `Transfer-Encoding` (hyper serves those as chunked and drops `Content-Length`).
    //!
    //! It only needs to agree with hyper on where each request head starts (which also tells the
    //! connection task when a head is being read). Whenever it meets something it does not
    //! model it stops following ("opaque"), and that is only ever where the connection serves no
    //! further HTTP/1 request, since a request it did not see would skip the check:
    //! - an input hyper rejects (an oversized or malformed head, a malformed chunk): hyper closes
    //!   the connection;
    //! - a head with both `Content-Length` and `Transfer-Encoding`: the handler answers 400 and
    //!   closes;
    //! - `CONNECT`: the handler refuses it and closes (the connection never becomes a tunnel);
    //! - the HTTP/2 preface: the connection is HTTP/2 from then on, or hyper rejects it.
    //!
    //! After an `Upgrade` request it keeps following: if the connection does switch, the
    //! connection state says so and the scanner is dropped.

    /// The framing scanner of one connection.
    pub(super) struct Scan {
        state: State,
        head: Vec<u8>,
        /// Empty lines came before the next request line: the wait for a head has begun.
        blank: bool,
        max_head: usize,
        heads: u64,
    }

    enum State {
        Head,
        Fixed(u64),
        Chunked(Chunk),
        Opaque,
    }

    /// hyper's `ChunkedState`, with the chunk size carried along.
    #[derive(Clone, Copy)]
    enum Chunk {
        Start,
        Size(u64),
        Lws(u64),
        Ext(u64),
        SizeLf(u64),
        Data(u64),
        DataCr,
        DataLf,
        EndCr,
        EndLf,
        Trailer,
        TrailerLf,
    }

    /// What a request head means for the bytes after it.
    enum Head {
        /// A body of this framing follows, then the next head.
        Body { chunked: bool, length: u64 },
        /// Stop following (see the module docs).
        Opaque,
    }

    impl Scan {
        pub(super) fn new(max_head: usize) -> Scan {
            Scan {
                state: State::Head,
                head: Vec::new(),
                blank: false,
                max_head,
                heads: 0,
            }
        }

        /// Whether the scanner stopped following for good.
        pub(super) fn is_done(&self) -> bool {
            matches!(self.state, State::Opaque)
        }

        /// Whether part of a request head has been read, but not all of it. Empty lines before a
        /// request line count: they belong to the wait for a head (else a client could hold an
        /// idle connection open with a `CRLF` now and then).
        pub(super) fn in_head(&self) -> bool {
            matches!(self.state, State::Head) && (self.blank || !self.head.is_empty())
        }

        /// Request heads seen so far.
        pub(super) fn heads(&self) -> u64 {
            self.heads
        }

        /// Feeds bytes as read; returns the index (0-based, counting request heads on this
        /// connection) of a head with both `Content-Length` and `Transfer-Encoding`.
        pub(super) fn feed(&mut self, mut input: &[u8]) -> Option<u64> {
            let mut found = None;
            while !input.is_empty() {
                match &mut self.state {
                    State::Opaque => break,
                    State::Head => {
                        if self.head.is_empty() {
                            // Empty lines before a request line are skipped (RFC 9112 §2.2).
                            let n = input
                                .iter()
                                .take_while(|b| matches!(b, b'\r' | b'\n'))
                                .count();
                            input = &input[n..];
                            self.blank |= n > 0;
                            if input.is_empty() {
                                break;
                            }
                        }
                        let before = self.head.len();
                        let from = before.saturating_sub(2);
                        self.head.extend_from_slice(input);
                        let Some(end) = head_end(&self.head, from) else {
                            if self.head.len() > self.max_head {
                                self.state = State::Opaque;
                                self.head = Vec::new();
                            }
                            break;
                        };
                        input = &input[end - before..];
                        self.head.truncate(end);
                        let index = self.heads;
                        self.heads += 1;
                        let (head, conflicting) = classify(&self.head);
                        self.head.clear();
                        self.blank = false;
                        if conflicting {
                            found = Some(index);
                        }
                        self.state = match head {
                            Head::Opaque => State::Opaque,
                            Head::Body { chunked: true, .. } => State::Chunked(Chunk::Start),
                            Head::Body { length: 0, .. } => State::Head,
                            Head::Body { length, .. } => State::Fixed(length),
                        };
                    }
                    State::Fixed(left) => {
                        let n = input
                            .len()
                            .min(usize::try_from(*left).unwrap_or(usize::MAX));
                        *left -= n as u64;
                        input = &input[n..];
                        if *left == 0 {
                            self.state = State::Head;
                        }
                    }
                    State::Chunked(chunk) => {
                        if let Chunk::Data(left) = chunk {
                            let n = input
                                .len()
                                .min(usize::try_from(*left).unwrap_or(usize::MAX));
                            *left -= n as u64;
                            input = &input[n..];
                            if *left == 0 {
                                *chunk = Chunk::DataCr;
                            }
                            continue;
                        }
                        let b = input[0];
                        input = &input[1..];
                        self.state = match step(*chunk, b) {
                            Some(None) => State::Head,
                            Some(Some(next)) => State::Chunked(next),
                            None => State::Opaque,
                        };
                    }
                }
            }
            found
        }
    }

    /// The end (exclusive) of a head in `buf`: after the first empty line, searching from `from`.
    fn head_end(buf: &[u8], from: usize) -> Option<usize> {
        let mut i = from;
        while i < buf.len() {
            if buf[i] == b'\n' {
                match (buf.get(i + 1), buf.get(i + 2)) {
                    (Some(b'\n'), _) => return Some(i + 2),
                    (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
                    _ => {}
                }
            }
            i += 1;
        }
        None
    }

    fn hex(b: u8) -> Option<u64> {
        match b {
            b'0'..=b'9' => Some(u64::from(b - b'0')),
            b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
            b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
            _ => None,
        }
    }

    /// One byte of chunked framing (not chunk data): `Some(Some(next))`, `Some(None)` at the end
    /// of the body, `None` where hyper's decoder fails.
    fn step(state: Chunk, b: u8) -> Option<Option<Chunk>> {
        let digit = |size: u64| -> Option<Option<Chunk>> {
            let size = size.checked_mul(16)?.checked_add(hex(b)?)?;
            Some(Some(Chunk::Size(size)))
        };
        match state {
            Chunk::Start => digit(0),
            Chunk::Size(size) => match b {
                b'\t' | b' ' => Some(Some(Chunk::Lws(size))),
                b';' => Some(Some(Chunk::Ext(size))),
                b'\r' => Some(Some(Chunk::SizeLf(size))),
                _ => digit(size),
            },
            Chunk::Lws(size) => match b {
                b'\t' | b' ' => Some(Some(Chunk::Lws(size))),
                b';' => Some(Some(Chunk::Ext(size))),
                b'\r' => Some(Some(Chunk::SizeLf(size))),
                _ => None,
            },
            Chunk::Ext(size) => match b {
                b'\r' => Some(Some(Chunk::SizeLf(size))),
                b'\n' => None,
                _ => Some(Some(Chunk::Ext(size))),
            },
            Chunk::SizeLf(size) => match (b, size) {
                (b'\n', 0) => Some(Some(Chunk::EndCr)),
                (b'\n', n) => Some(Some(Chunk::Data(n))),
                _ => None,
            },
            Chunk::Data(_) => None,
            Chunk::DataCr => (b == b'\r').then_some(Some(Chunk::DataLf)),
            Chunk::DataLf => (b == b'\n').then_some(Some(Chunk::Start)),
            Chunk::EndCr => Some(Some(if b == b'\r' {
                Chunk::EndLf
            } else {
                Chunk::Trailer
            })),
            Chunk::EndLf => (b == b'\n').then_some(None),
            Chunk::Trailer => Some(Some(if b == b'\r' {
                Chunk::TrailerLf
            } else {
                Chunk::Trailer
            })),
            Chunk::TrailerLf => (b == b'\n').then_some(Some(Chunk::EndCr)),
        }
    }

    fn trim(v: &[u8]) -> &[u8] {
        let start = v
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t'))
            .unwrap_or(v.len());
        let end = v
            .iter()
            .rposition(|b| !matches!(b, b' ' | b'\t'))
            .map_or(start, |p| p + 1);
        &v[start..end.max(start)]
    }

    fn digits(v: &[u8]) -> Option<u64> {
        if v.is_empty() {
            return None;
        }
        v.iter().try_fold(0u64, |acc, b| {
            if b.is_ascii_digit() {
                acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
            } else {
                None
            }
        })
    }

    /// What a complete head means, as hyper reads it; and whether it carries both
    /// `Content-Length` and `Transfer-Encoding`.
    fn classify(head: &[u8]) -> (Head, bool) {
        let mut lines = head
            .split(|b| *b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let Some(request_line) = lines.next() else {
            return (Head::Opaque, false);
        };
        let mut parts = request_line.split(|b| *b == b' ');
        let method = parts.next().unwrap_or_default();
        let version = parts.next_back().unwrap_or_default();
        let http10 = match version {
            b"HTTP/1.1" => false,
            b"HTTP/1.0" => true,
            _ => return (Head::Opaque, false),
        };
        let opaque = method == b"CONNECT";
        let (mut te, mut te_chunked, mut has_cl) = (false, false, false);
        let mut length: Option<u64> = None;
        for line in lines {
            if line.is_empty() {
                continue;
            }
            if matches!(line.first(), Some(b' ' | b'\t')) {
                return (Head::Opaque, false);
            }
            let Some(colon) = line.iter().position(|b| *b == b':') else {
                return (Head::Opaque, false);
            };
            let name = &line[..colon];
            if name.is_empty() || name.iter().any(|b| matches!(b, b' ' | b'\t')) {
                return (Head::Opaque, false);
            }
            let value = trim(&line[colon + 1..]);
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                if http10 {
                    return (Head::Opaque, false);
                }
                te = true;
                te_chunked = value
                    .rsplit(|b| *b == b',')
                    .next()
                    .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"content-length") {
                has_cl = true;
                if te {
                    continue;
                }
                let Some(n) = digits(value) else {
                    return (Head::Opaque, false);
                };
                if length.is_some_and(|prev| prev != n) {
                    return (Head::Opaque, false);
                }
                length = Some(n);
            }
        }
        if te && !te_chunked {
            return (Head::Opaque, false);
        }
        let conflicting = te && has_cl;
        if opaque || conflicting {
            // hyper serves nothing after a request with both headers (it closes the connection).
            return (Head::Opaque, conflicting);
        }
        (
            Head::Body {
                chunked: te,
                length: length.unwrap_or(0),
            },
            false,
        )
    }

    #[cfg(test)]
    mod tests {
        use super::Scan;

        fn feed_all(parts: &[&[u8]]) -> (Vec<u64>, bool) {
            let mut s = Scan::new(8192);
            let found = parts.iter().filter_map(|p| s.feed(p)).collect();
            (found, s.is_done())
        }

        #[test]
        fn finds_cl_te_in_the_first_head() {
            let req = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
            assert_eq!(feed_all(&[req]), (vec![0], true));
        }

        #[test]
        fn follows_fixed_and_chunked_bodies_to_a_later_head() {
            let stream: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
                GET /b HTTP/1.1\r\nHost: x\r\n\r\n\
                POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n\
                POST /d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n";
            assert_eq!(feed_all(&[stream]), (vec![3], true));
            // The same bytes one at a time.
            let mut s = Scan::new(8192);
            let found: Vec<u64> = stream.chunks(1).filter_map(|b| s.feed(b)).collect();
            assert_eq!(found, vec![3]);
        }

        #[test]
        fn body_bytes_that_look_like_a_head_are_not_one() {
            let body = b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
            let head = format!(
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let (found, done) = feed_all(&[head.as_bytes(), body, b"GET / HTTP/1.1\r\n\r\n"]);
            assert!(found.is_empty());
            assert!(!done);
        }

        #[test]
        fn knows_when_a_head_is_being_read() {
            let mut s = Scan::new(8192);
            assert!(!s.in_head());
            s.feed(b"\r\n");
            assert!(s.in_head(), "empty lines before a head begin it");
            s.feed(b"GET / HTTP/1.1\r\nHo");
            assert!(s.in_head());
            s.feed(b"st: x\r\nContent-Length: 3\r\n\r\nab");
            assert!(!s.in_head() && s.heads() == 1);
            s.feed(b"cGET /next HTTP/1.1\r\n");
            assert!(s.in_head() && s.heads() == 1);
            s.feed(b"\r\nGET /third");
            assert!(s.in_head() && s.heads() == 2);
            s.feed(b" HTTP/1.1\r\n\r\n");
            assert!(!s.in_head() && s.heads() == 3);
            s.feed(b"\r\n\r\n");
            assert!(s.in_head() && s.heads() == 3);
        }

        #[test]
        fn keeps_following_after_an_upgrade_request() {
            let (found, done) = feed_all(&[
                b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
                b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            ]);
            assert_eq!((found, done), (vec![1], true));
        }

        #[test]
        fn stops_following_what_it_does_not_model() {
            for req in [
                &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
                b"CONNECT h:1 HTTP/1.1\r\n\r\n",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            ] {
                let (found, done) = feed_all(&[req]);
                assert!(found.is_empty() && done, "{}", String::from_utf8_lossy(req));
            }
        }
    }
}
