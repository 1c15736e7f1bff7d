//! One accepted connection: the TLS handshake (in the connection's own task, so a slow one never
//! holds up accepting), then hyper's HTTP/1.1 + HTTP/2 serving under the connection's timers and
//! the drain.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::conn_state::{Close, ConnInfo, ConnState, Timeouts};
use super::io::ConnIo;
use super::Handler;
use crate::config::{ServerConfig, MAX_TIMEOUT};
use crate::runtime::state::Shared;

/// How long a connection told to close (idle) may take to do so before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

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
        // Header names forwarded in the client's case (see `http1_preserve_header_case` of the
        // upstream clients), as the fast front does.
        .preserve_header_case(true)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(cfg.h2_max_concurrent_streams)
        // What is buffered for a connection is bounded whatever windows the client grants (see
        // `H2_SEND_BUFFER`): a stream is given no more send capacity than its share, and what
        // the client sends is bounded by the windows the gateway grants.
        .max_send_buf_size(h2_send_buf_size(cfg.h2_max_concurrent_streams))
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .adaptive_window(false)
        .max_header_list_size(u32::try_from(cfg.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

/// The response data one HTTP/2 connection may hold for its client (queued for streams the
/// client does not read), shared by its streams: with a large window granted and nothing read,
/// each stream would otherwise queue hyper's 400 KiB (100 MiB for 256 streams).
pub const H2_SEND_BUFFER: usize = 8 << 20;
/// What one stream may queue at least (a connection allowed many streams gets less each).
const H2_MIN_STREAM_SEND_BUFFER: usize = 16 << 10;
/// What one stream may queue at most: hyper's default (enough to keep a fast link busy).
const H2_MAX_STREAM_SEND_BUFFER: usize = 400 << 10;
/// The window the gateway grants each stream of a client's request body: 256 KiB.
pub const H2_STREAM_WINDOW: u32 = 256 << 10;
/// The window the gateway grants a connection's request bodies together: 1 MiB.
pub const H2_CONNECTION_WINDOW: u32 = 1 << 20;

/// Each stream's share of [`H2_SEND_BUFFER`] with `streams` concurrent streams.
fn h2_send_buf_size(streams: u32) -> usize {
    let streams = usize::try_from(streams.max(1)).unwrap_or(usize::MAX);
    (H2_SEND_BUFFER / streams).clamp(H2_MIN_STREAM_SEND_BUFFER, H2_MAX_STREAM_SEND_BUFFER)
}

/// The peer's IP address as a header value (`X-Forwarded-For`), built once per connection.
fn peer_ip(peer: std::net::SocketAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.ip().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// The server settings a connection is started with (a reload applies to new connections).
pub(super) struct Settings {
    builder: auto::Builder<TokioExecutor>,
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_head: usize,
    proxy_protocol: Option<crate::config::ProxyProtocolConfig>,
    /// HTTP/1 connections go to the handler's own front first (`http1 = "fast"`).
    fast: bool,
}

impl Settings {
    pub(super) fn of(cfg: &ServerConfig) -> Settings {
        Settings {
            builder: builder(cfg),
            // Validation bounds both; capped again so deadlines cannot overflow an `Instant`.
            header_read_timeout: cfg.header_read_timeout.min(MAX_TIMEOUT),
            idle_timeout: cfg.idle_timeout.min(MAX_TIMEOUT),
            max_head: cfg.max_header_bytes.max(8192),
            proxy_protocol: cfg.proxy_protocol.clone(),
            fast: cfg.http1 == crate::config::Http1Front::Fast,
        }
    }
}

/// One accepted connection, before and during serving.
pub(super) struct Connection<H: Handler> {
    pub(super) shared: Arc<Shared>,
    pub(super) handler: H,
    pub(super) peer: std::net::SocketAddr,
    pub(super) settings: Arc<Settings>,
    pub(super) stop: watch::Receiver<bool>,
    /// Dropped when the connection is done: what the drain waits for.
    pub(super) _live: mpsc::Sender<()>,
    /// The verified client certificate's facts (set after the handshake).
    pub(super) client_cert: Option<Arc<crate::tls::peer::PeerCert>>,
}

impl<H: Handler> Connection<H> {
    pub(super) async fn run(mut self, mut stream: TcpStream) {
        // The PROXY header first, before TLS and any front: its address is the peer from here.
        if let Some(pp) = &self.settings.proxy_protocol {
            match super::proxy_protocol::accept(&mut stream, self.peer, pp).await {
                Ok(peer) => self.peer = peer,
                Err(reason) => {
                    metrics::counter!(crate::metrics::PROXY_PROTOCOL_ERRORS, "reason" => reason.as_str())
                        .increment(1);
                    tracing::debug!(peer = %self.peer, reason = reason.as_str(), "PROXY protocol header refused; closing");
                    return;
                }
            }
        }
        let Some(tls) = &self.shared.tls else {
            if self.settings.fast {
                return self.fast(stream, false).await;
            }
            let state = ConnState::new();
            let io = ConnIo::new(stream, state.clone(), Some(self.settings.max_head));
            return self.serve(io, state, false).await;
        };
        let acceptor = tls.acceptor();
        let peer = self.peer;
        // The handshake runs in this connection's task, so a slow one never holds up accepting.
        // The handshake, then (a resumed session) its client certificate verified again under
        // the current `client_auth`.
        let accepted = match tokio::time::timeout(
            self.settings.header_read_timeout,
            acceptor.accept(stream),
        )
        .await
        {
            Ok(Ok(s)) => s,
            // A connection closed before completing a handshake (a TCP health check, a client
            // giving up) is not counted; one that sent something that is not TLS is.
            Ok(Err(e)) => {
                match crate::tls::handshake::Failure::of(&e) {
                    Some(reason) => {
                        metrics::counter!(crate::metrics::TLS_HANDSHAKE_ERRORS, "reason" => reason.as_str())
                            .increment(1);
                        tracing::debug!(error = %e, %peer, reason = reason.as_str(), "TLS handshake failed");
                    }
                    None => {
                        tracing::debug!(error = %e, %peer, "connection closed during the TLS handshake")
                    }
                }
                return;
            }
            Err(_) => {
                let reason = crate::tls::handshake::Failure::Timeout.as_str();
                metrics::counter!(crate::metrics::TLS_HANDSHAKE_ERRORS, "reason" => reason)
                    .increment(1);
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let stream = accepted.stream;
        let alpn = stream.get_ref().1.alpn_protocol();
        // The ACME server validating TLS-ALPN-01: the handshake was the answer (RFC 8737 §3).
        if alpn == Some(crate::tls::acme::state::ACME_TLS_ALPN) {
            return;
        }
        let h2 = alpn == Some(b"h2");
        // A verified client certificate (mTLS): its identity, worked out once per connection.
        self.client_cert = accepted.client_cert;
        if !h2 && self.settings.fast {
            return self.fast(stream, true).await;
        }
        let state = ConnState::new();
        let scan = (!h2).then_some(self.settings.max_head);
        let io = ConnIo::new(stream, state.clone(), scan);
        self.serve(io, state, true).await;
    }

    /// Serves the connection with the handler's HTTP/1 front; what it hands back (with the
    /// bytes it read) is served by hyper, under a fresh connection state.
    async fn fast<T>(mut self, io: T, tls: bool)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let client = crate::front::http1::Client {
            peer: self.peer,
            peer_ip: peer_ip(self.peer),
            tls,
            client_cert: self.client_cert.clone(),
            alt_svc: if tls {
                self.shared.tls.as_ref().and_then(|t| t.alt_svc()).cloned()
            } else {
                None
            },
        };
        let limits = crate::front::http1::Limits {
            idle: self.settings.idle_timeout,
            header: self.settings.header_read_timeout,
            max_head: self.settings.max_head,
        };
        let handler = self.handler.clone();
        let Some(handoff) = handler
            .serve_http1(io, client, limits, &mut self.stop)
            .await
        else {
            return;
        };
        let state = ConnState::new();
        let io = crate::front::http1::Rewind::new(handoff.read, handoff.io);
        let io = ConnIo::new(io, state.clone(), Some(self.settings.max_head));
        self.serve(io, state, tls).await
    }

    async fn serve<T>(mut self, io: ConnIo<T>, state: Arc<ConnState>, tls: bool)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let info = ConnInfo {
            peer: self.peer,
            peer_ip: peer_ip(self.peer),
            tls,
            client_cert: self.client_cert.clone(),
            state: state.clone(),
        };
        let handler = self.handler.clone();
        let svc = service_fn(move |req| {
            let answer = handler.clone().call(info.clone(), req);
            async move { Ok::<_, Infallible>(answer.await) }
        });
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
