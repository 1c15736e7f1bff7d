//! The fast front's upstream connections: opened to one server of a group (plain TCP or TLS,
//! within the group's `connect_timeout`), and kept idle between requests in a pool per server
//! per worker — LIFO (the warmest connection first), bounded, with an idle timeout. A request
//! checks one out and puts it back in its own task: no channel, no connection task, no
//! cross-task wake-up, and no hashing (the pool is found by the server's index).

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::connect::{ConnectError, ConnectSettings};

/// How long an idle connection is kept (hyper-util's pool in the hyper front: the same).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The most idle connections kept per server per worker.
pub const MAX_IDLE: usize = 256;

/// A connection to an upstream server.
pub enum UpStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Opens a connection to the server at `authority` with the group's settings.
pub async fn open(
    settings: &ConnectSettings,
    authority: &http::uri::Authority,
) -> Result<UpStream, ConnectError> {
    let host = authority.host();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = authority
        .port_u16()
        .unwrap_or(if settings.tls.is_some() { 443 } else { 80 });
    let timeout = settings.timeout;
    let tcp = match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Err(_) => {
            return Err(ConnectError::Tcp(
                format!("connect timed out after {timeout:?}").into(),
            ))
        }
        Ok(Err(e)) => return Err(ConnectError::Tcp(Box::new(e))),
        Ok(Ok(s)) => s,
    };
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(&tcp)
        .set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(Duration::from_secs(60)));
    let Some((config, name)) = &settings.tls else {
        return Ok(UpStream::Plain(tcp));
    };
    let name = match name {
        Some(n) => n.clone(),
        None => ServerName::try_from(host.to_owned())
            .map_err(|e| ConnectError::Tcp(format!("invalid TLS name: {e}").into()))?,
    };
    let tls = tokio_rustls::TlsConnector::from(config.clone());
    match tokio::time::timeout(timeout, tls.connect(name, tcp)).await {
        Err(_) => Err(ConnectError::TlsTimeout(timeout)),
        Ok(Err(e)) => Err(ConnectError::Tls(e)),
        Ok(Ok(s)) => Ok(UpStream::Tls(Box::new(s))),
    }
}

impl UpStream {
    /// Whether an idle connection is still usable: nothing to read (no close, no stray bytes).
    fn is_idle_alive(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        matches!(Pin::new(self).poll_read(&mut cx, &mut buf), Poll::Pending)
    }
}

impl AsyncRead for UpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpStream::Plain(s) => s.is_write_vectored(),
            UpStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The idle connections of one server on one worker. The lock is never contended (one worker
/// uses it); it is there because the group that holds the pool is shared by every worker.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<Vec<(UpStream, Instant)>>,
}

impl Pool {
    /// The most recently returned live connection, if any (expired and closed ones dropped).
    pub fn take(&self) -> Option<UpStream> {
        let mut idle = self.idle.lock().ok()?;
        while let Some((mut conn, since)) = idle.pop() {
            if since.elapsed() < IDLE_TIMEOUT && conn.is_idle_alive() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request (dropped when the pool is full).
    pub fn put(&self, conn: UpStream) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        if idle.len() >= MAX_IDLE {
            // The oldest goes: LIFO takes from the end.
            idle.remove(0);
        }
        idle.push((conn, Instant::now()));
    }
}
