//! A streaming call on an HTTP/2 stream of the `[rls]` listener (the quota service's
//! `StreamRateLimitQuotas`, served by tonic's streaming plumbing): the request's stream read as
//! an [`http_body::Body`] and the answer's body written to the stream, as hyper's HTTP/2 server
//! does — what is read is given back to flow control as it is handed on, and the next chunk of
//! the answer is taken only when the last has been given send capacity, so a client that never
//! reads holds the server to its window and one chunk.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{Reason, RecvStream, SendStream};
use http_body::{Body, Frame};

/// A request's body, read off its HTTP/2 stream.
pub struct RecvBody(pub RecvStream);

impl Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let stream = &mut self.0;
        match ready!(stream.poll_data(cx)) {
            Some(Ok(data)) => {
                let _ = stream.flow_control().release_capacity(data.len());
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => match ready!(stream.poll_trailers(cx)) {
                Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                Ok(None) => Poll::Ready(None),
                Err(e) => Poll::Ready(Some(Err(e))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// Writes `body` to `send` until it ends (its trailers, or an empty DATA frame that ends the
/// stream), the client resets the stream, or the body fails (the stream is reset).
pub async fn pipe<B>(mut body: B, mut send: SendStream<Bytes>)
where
    B: Body<Data = Bytes> + Unpin,
{
    loop {
        // The next frame, unless the client reset the stream meanwhile.
        let frame = poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            Pin::new(&mut body).poll_frame(cx).map(Some)
        })
        .await;
        let frame = match frame {
            None => return,
            Some(None) => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
            Some(Some(Err(_))) => {
                send.send_reset(Reason::INTERNAL_ERROR);
                return;
            }
            Some(Some(Ok(frame))) => frame,
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.reserve_capacity(0);
                    let _ = send.send_trailers(trailers);
                    return;
                }
                continue;
            }
        };
        let end = body.is_end_stream();
        if !data.is_empty() {
            // A minimal claim on the window (hyper's, #4003): h2 raises it to what is buffered.
            send.reserve_capacity(1);
            let granted = poll_fn(|cx| {
                while send.capacity() == 0 {
                    if send.poll_reset(cx).is_ready() {
                        return Poll::Ready(false);
                    }
                    match ready!(send.poll_capacity(cx)) {
                        Some(Ok(0)) => {}
                        Some(Ok(_)) => break,
                        Some(Err(_)) | None => return Poll::Ready(false),
                    }
                }
                Poll::Ready(true)
            })
            .await;
            if !granted {
                return;
            }
        }
        if send.send_data(data, end).is_err() || end {
            return;
        }
    }
}
