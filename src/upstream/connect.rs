//! Connections to a group's servers: the pooled keep-alive client of one group on one worker,
//! plain TCP or TLS, with the group's `connect_timeout` over TCP connect and TLS handshake.
//!
//! A group with `protocol = "h2"` or `"h2c"` gets an HTTP/2-only client: one multiplexed
//! connection per server per worker, `h2` agreed by ALPN over TLS (a server that does not agree
//! fails the attempt as a TLS error), `h2c` by prior knowledge over TCP.
//!
//! The TLS connector is ours rather than a crate's for one reason: a failed attempt must say
//! whether TCP or TLS failed (`tollgate_upstream_errors_total{kind="tls"}`, and a 502 detail
//! that names the certificate problem), which [`ConnectError`] carries through hyper's error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::config::upstream::Protocol;

/// A boxed error, as hyper takes connector errors.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body as a group's pooled client sends it: whatever body the front streams, boxed
/// (the hyper front's, `crate::front::hyper::body::RequestBody`, with its error boxed).
pub type SentBody = http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, BoxError>;

/// Why a connection to a server could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect: {0}")]
    Tcp(BoxError),
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("TLS handshake timed out after {0:?}")]
    TlsTimeout(Duration),
    /// `protocol = "h2"`, and the server did not pick `h2` by ALPN.
    #[error("the server did not agree to HTTP/2 (ALPN h2)")]
    NoH2,
}

impl ConnectError {
    /// The `ConnectError` inside one of hyper's client errors, if the connector failed.
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ConnectError> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = cur {
            if let Some(c) = err.downcast_ref::<ConnectError>() {
                return Some(c);
            }
            cur = err.source();
        }
        None
    }

    /// A TLS failure (handshake error or timeout), rather than a TCP one.
    pub fn is_tls(&self) -> bool {
        matches!(
            self,
            ConnectError::Tls(_) | ConnectError::TlsTimeout(_) | ConnectError::NoH2
        )
    }
}

/// The TCP connector every client starts from: `TCP_NODELAY`, keep-alive probes, and
/// `timeout` on the TCP connect.
pub fn tcp_connector(timeout: Duration) -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    c.set_connect_timeout(Some(timeout));
    c.set_keepalive(Some(Duration::from_secs(60)));
    c
}

/// Connects over TCP, then TLS with a fixed configuration and (optionally) a fixed server name.
#[derive(Clone)]
pub struct TlsConnector {
    tcp: HttpConnector,
    tls: tokio_rustls::TlsConnector,
    /// `tls.server_name`: SNI and the certificate's name for every server; `None`: each
    /// server's own host.
    name: Option<ServerName<'static>>,
    handshake_timeout: Duration,
    /// The group speaks HTTP/2: the server must pick `h2` by ALPN.
    h2: bool,
}

impl TlsConnector {
    pub fn new(
        config: Arc<rustls::ClientConfig>,
        name: Option<ServerName<'static>>,
        timeout: Duration,
        h2: bool,
    ) -> TlsConnector {
        let mut tcp = tcp_connector(timeout);
        tcp.enforce_http(false);
        TlsConnector {
            tcp,
            tls: tokio_rustls::TlsConnector::from(config),
            name,
            handshake_timeout: timeout,
            h2,
        }
    }
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("name", &self.name)
            .field("h2", &self.h2)
            .finish_non_exhaustive()
    }
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TlsStream;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsStream, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        tower_service::Service::<Uri>::poll_ready(&mut self.tcp, cx)
            .map_err(|e| ConnectError::Tcp(Box::new(e)))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let name = match &self.name {
            Some(n) => Ok(n.clone()),
            None => dst
                .host()
                .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
                .ok_or_else(|| ConnectError::Tcp("the server URL has no host".into()))
                .and_then(|h| {
                    ServerName::try_from(h)
                        .map_err(|e| ConnectError::Tcp(format!("invalid TLS name: {e}").into()))
                }),
        };
        let tcp = tower_service::Service::<Uri>::call(&mut self.tcp, dst);
        let tls = self.tls.clone();
        let timeout = self.handshake_timeout;
        let want_h2 = self.h2;
        Box::pin(async move {
            let name = name?;
            let tcp = tcp.await.map_err(|e| ConnectError::Tcp(Box::new(e)))?;
            let stream = tcp.into_inner();
            match tokio::time::timeout(timeout, tls.connect(name, stream)).await {
                Err(_) => Err(ConnectError::TlsTimeout(timeout)),
                // A server that knows ALPN but not `h2` refuses the handshake.
                Ok(Err(e)) if want_h2 && refused_alpn(&e) => Err(ConnectError::NoH2),
                Ok(Err(e)) => Err(ConnectError::Tls(e)),
                Ok(Ok(s)) => {
                    let h2 = s.get_ref().1.alpn_protocol() == Some(b"h2");
                    if want_h2 && !h2 {
                        return Err(ConnectError::NoH2);
                    }
                    Ok(TlsStream(TokioIo::new(s), h2))
                }
            }
        })
    }
}

/// Whether a handshake failed on the server's `no_application_protocol` alert.
fn refused_alpn(e: &std::io::Error) -> bool {
    matches!(
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::AlertReceived(
            rustls::AlertDescription::NoApplicationProtocol
        ))
    )
}

/// An established TLS connection, as hyper reads and writes it, and whether ALPN picked `h2`.
pub struct TlsStream(TokioIo<tokio_rustls::client::TlsStream<TcpStream>>, bool);

impl Connection for TlsStream {
    fn connected(&self) -> Connected {
        if self.1 {
            Connected::new().negotiated_h2()
        } else {
            Connected::new()
        }
    }
}

impl Read for TlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl Write for TlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}

/// How to reach a group's servers: the connect timeout, TLS for `https://` groups, and the
/// HTTP version spoken.
#[derive(Clone)]
pub struct ConnectSettings {
    pub timeout: Duration,
    pub tls: Option<(Arc<rustls::ClientConfig>, Option<ServerName<'static>>)>,
    pub protocol: Protocol,
}

/// A pooled keep-alive client to a group's servers.
pub enum GroupClient<B> {
    Plain(Client<HttpConnector, B>),
    Tls(Client<TlsConnector, B>),
}

/// The largest header list (a response head, or its trailers) an HTTP/2 upstream may send:
/// well above what is passed on ([`crate::front::hyper::MAX_TRAILER_BYTES`]), so that trailers over
/// that bound arrive whole and are refused, where the HTTP/2 library would drop what is over
/// its own limit without a word (hyper's default is 16 KiB).
pub const UPSTREAM_HEADER_LIST_BYTES: u32 = 1 << 20;

/// What the hyper front reads ahead of an HTTP/1.1 upstream connection at most: a response
/// head must fit (a larger one is a 502, like nginx's "upstream sent too big header"), and a
/// body is read no further ahead while its client does not take it. Bounded so that a client
/// that reads slowly on many HTTP/2 streams holds 32 KiB per upstream connection, not hyper's
/// 400 KiB.
pub const UPSTREAM_READ_BUFFER: usize = 32 << 10;

impl<B> GroupClient<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// A client with the worker pool's settings (90 s idle, up to 256 idle per server).
    pub fn new(s: &ConnectSettings) -> GroupClient<B> {
        let mut b = Client::builder(hyper_util::rt::TokioExecutor::new());
        b.pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .http1_preserve_header_case(true)
            .http1_max_buf_size(UPSTREAM_READ_BUFFER)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .timer(hyper_util::rt::TokioTimer::new());
        let h2 = s.protocol.is_h2();
        if h2 {
            // One multiplexed connection per server; pings find a dead one between requests
            // (a gRPC stream may be quiet for long).
            b.http2_only(true)
                .http2_max_header_list_size(UPSTREAM_HEADER_LIST_BYTES)
                .http2_keep_alive_interval(Duration::from_secs(30))
                .http2_keep_alive_timeout(Duration::from_secs(20))
                .http2_keep_alive_while_idle(true);
        }
        match &s.tls {
            None => GroupClient::Plain(b.build(tcp_connector(s.timeout))),
            Some((config, name)) => GroupClient::Tls(b.build(TlsConnector::new(
                config.clone(),
                name.clone(),
                s.timeout,
                h2,
            ))),
        }
    }

    /// Sends one request on a pooled or new connection.
    pub fn request(&self, req: http::Request<B>) -> hyper_util::client::legacy::ResponseFuture {
        match self {
            GroupClient::Plain(c) => c.request(req),
            GroupClient::Tls(c) => c.request(req),
        }
    }
}
