//! The response body of a logged request: counts the body bytes sent and hands the record to
//! the access log when the body is done.
//!
//! The record is sent from `Drop`, which runs whether the body ended, the client went away
//! mid-body or the connection was closed: every response that reached hyper is logged once.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{AccessLog, Record};

/// Whatever owns the access log a [`Logged`] body reports to (a proxy worker). The body holds it
/// by `Arc` so that sending costs no reference count another worker touches.
pub trait HasAccessLog: Send + Sync + 'static {
    fn access_log(&self) -> &AccessLog;
}

/// A body that logs its request when dropped.
pub struct Logged<B, O: HasAccessLog> {
    inner: B,
    record: Option<Box<Record>>,
    owner: Arc<O>,
}

impl<B, O: HasAccessLog> Logged<B, O> {
    pub fn new(inner: B, record: Box<Record>, owner: Arc<O>) -> Self {
        Logged {
            inner,
            record: Some(record),
            owner,
        }
    }
}

impl<B, O: HasAccessLog> Drop for Logged<B, O> {
    fn drop(&mut self) {
        if let Some(mut r) = self.record.take() {
            r.duration = r.started.elapsed();
            self.owner.access_log().send(r);
        }
    }
}

impl<B, O> Body for Logged<B, O>
where
    B: Body<Data = Bytes> + Unpin,
    O: HasAccessLog,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some(data), Some(r)) = (frame.data_ref(), this.record.as_mut()) {
                r.bytes_sent = r
                    .bytes_sent
                    .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
