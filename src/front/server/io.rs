//! The client connection's IO: records activity for the timers, follows HTTP/1 request framing
//! on the raw bytes (see [`super::h1_scan`]), and lingers on close when asked to.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};

use super::conn_state::ConnState;
use super::h1_scan::Scan;

/// How long a connection closed on a request it did not read in full (413, 408, 400) keeps
/// reading and discarding, so the client can still read the answer. Closing a socket with
/// unread input resets the connection, and a reset can destroy the response in flight.
const LINGER: Duration = Duration::from_secs(2);

/// The client connection's IO: records activity, follows HTTP/1 request framing, and lingers
/// on close when asked to.
pub(super) struct ConnIo<T: AsyncRead + Unpin + Send + 'static> {
    /// `None` only once dropped.
    inner: Option<T>,
    state: Arc<ConnState>,
    scan: Option<Scan>,
    /// The scanner's head count and whether it was inside a head, after the last read.
    seen_heads: u64,
    in_head: bool,
}

impl<T: AsyncRead + Unpin + Send + 'static> ConnIo<T> {
    /// `scan`: the largest request head to follow (`None`: HTTP/2, nothing to follow).
    pub(super) fn new(inner: T, state: Arc<ConnState>, scan: Option<usize>) -> ConnIo<T> {
        state.touch();
        ConnIo {
            inner: Some(inner),
            state,
            scan: scan.map(Scan::new),
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
