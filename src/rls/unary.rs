//! A unary gRPC call on an HTTP/2 stream of the `[rls]` listener, without a framework: its one
//! request message read off the stream (the gRPC frame: a flag byte, a 4-byte length, the
//! message), its answer written as a head, one DATA frame and the `grpc-status: 0` trailers, or
//! as a trailers-only status. What tonic's unary server does, for the one fixed shape of
//! `ShouldRateLimit`: the statuses a call that cannot be read gets are tonic's own (so the
//! counted reasons stay: `OUT_OF_RANGE` too large, `INTERNAL` not a message, `UNIMPLEMENTED` a
//! compression it does not speak).
//!
//! Bounded: a message of at most `max` bytes (refused from its length prefix, before its bytes
//! arrive); messages after the first are read and dropped (each bounded), as tonic reads a
//! unary call's stream to its end; what is read is given back to HTTP/2 flow control as it is
//! consumed.

use std::sync::LazyLock;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use prost::Message;
use tonic::Status;

/// `content-type: application/grpc`, the head of every answer.
static OK_HEAD: LazyLock<HeaderMap> = LazyLock::new(|| {
    let mut h = HeaderMap::with_capacity(1);
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h
});

/// `grpc-status: 0`, the trailers of an answered call.
static OK_TRAILERS: LazyLock<HeaderMap> = LazyLock::new(|| {
    let mut h = HeaderMap::with_capacity(1);
    h.insert("grpc-status", HeaderValue::from_static("0"));
    h
});

/// The gRPC frame's header: the compressed flag and the length.
const PREFIX: usize = 5;

/// Reads a unary call's request message.
pub struct Reader {
    max: usize,
    /// Bytes read and not yet parsed (a prefix, or a message, split over DATA frames).
    buf: BytesMut,
    /// Bytes of a later message still to drop.
    skip: usize,
    /// The first message.
    message: Option<Bytes>,
}

impl Reader {
    pub fn new(max: usize) -> Reader {
        Reader {
            max,
            buf: BytesMut::new(),
            skip: 0,
            message: None,
        }
    }

    /// Reads what `body` has; at its end the first message (its bytes, without the frame's
    /// prefix), or the status of a call that cannot be read.
    pub fn poll(
        &mut self,
        body: &mut h2::RecvStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bytes, Status>> {
        loop {
            match ready!(body.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    if let Err(status) = self.push(chunk) {
                        return Poll::Ready(Err(status));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Err(Status::from_error(Box::new(e)))),
                None => return Poll::Ready(self.finish()),
            }
        }
    }

    /// Parses a chunk of the stream.
    fn push(&mut self, mut chunk: Bytes) -> Result<(), Status> {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(chunk.len());
                self.skip -= n;
                chunk.advance(n);
            }
            if chunk.is_empty() {
                return Ok(());
            }
            if self.buf.is_empty() {
                // The common case: the chunk starts a frame, and usually holds it whole (taken
                // without a copy).
                if let Some(len) = self.length(&chunk)? {
                    if chunk.len() >= PREFIX + len {
                        let message = chunk.slice(PREFIX..PREFIX + len);
                        chunk.advance(PREFIX + len);
                        self.message.get_or_insert(message);
                        continue;
                    }
                    if self.message.is_some() {
                        // A later message: dropped as it comes.
                        self.skip = PREFIX + len - chunk.len();
                        return Ok(());
                    }
                }
                self.buf.reserve(chunk.len().min(PREFIX + self.max));
                self.buf.put(chunk);
                return Ok(());
            }
            // A frame split over DATA frames: gathered (at most the prefix and `max`).
            let Some(len) = self.length(&self.buf)? else {
                let n = (PREFIX - self.buf.len()).min(chunk.len());
                self.buf.put(chunk.split_to(n));
                continue;
            };
            let want = PREFIX + len - self.buf.len();
            if self.message.is_some() {
                // A later message: its prefix is all that was kept.
                self.buf.clear();
                self.skip = want;
                continue;
            }
            let n = want.min(chunk.len());
            self.buf.put(chunk.split_to(n));
            if self.buf.len() == PREFIX + len {
                let mut frame = std::mem::take(&mut self.buf).freeze();
                frame.advance(PREFIX);
                self.message = Some(frame);
            }
        }
    }

    /// The length of the frame `bytes` starts (`None`: not all of its prefix yet), refused as
    /// tonic refuses it: a compressed message (no `grpc-encoding` is taken) or a flag that is
    /// none, and a message over `max`.
    fn length(&self, bytes: &[u8]) -> Result<Option<usize>, Status> {
        let (Some(&flag), Some(len)) = (bytes.first(), bytes.get(1..PREFIX)) else {
            return Ok(None);
        };
        match flag {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ))
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1)"
                )))
            }
        }
        let mut b = [0u8; 4];
        b.copy_from_slice(len);
        let len = u32::from_be_bytes(b) as usize;
        if len > self.max {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max
            )));
        }
        Ok(Some(len))
    }

    /// The stream ended: its first message, unless it ended inside a frame or had none.
    fn finish(&mut self) -> Result<Bytes, Status> {
        if !self.buf.is_empty() || self.skip > 0 {
            return Err(Status::internal("Unexpected EOF decoding stream."));
        }
        self.message
            .take()
            .ok_or_else(|| Status::internal("Missing request message."))
    }
}

/// The status of a call whose `grpc-encoding` is not `identity` (none is taken), as tonic
/// answers it.
pub fn encoding(headers: &HeaderMap) -> Result<(), Status> {
    match headers.get("grpc-encoding") {
        None => Ok(()),
        Some(v) if v.as_bytes() == b"identity" => Ok(()),
        Some(v) => Err(Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(v.as_bytes())
        ))),
    }
}

/// Answers a call: `message` in one DATA frame between the head and `grpc-status: 0`, or the
/// status alone (trailers-only). A client that reset the call gets nothing.
pub fn send<M: Message>(respond: &mut h2::server::SendResponse<Bytes>, answer: Result<M, Status>) {
    match answer {
        Ok(message) => {
            let len = message.encoded_len();
            let mut framed = Vec::with_capacity(PREFIX + len);
            framed.push(0);
            // A reply is bounded by the call's (64 descriptors): far below 4 GiB.
            framed.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
            if message.encode(&mut framed).is_err() {
                return send_status(respond, Status::internal("the reply cannot be encoded"));
            }
            let mut head = http::Response::new(());
            *head.headers_mut() = OK_HEAD.clone();
            let Ok(mut stream) = respond.send_response(head, false) else {
                return;
            };
            if stream.send_data(Bytes::from(framed), false).is_ok() {
                let _ = stream.send_trailers(OK_TRAILERS.clone());
            }
        }
        Err(status) => send_status(respond, status),
    }
}

/// A trailers-only answer: the status in the head, which ends the stream.
pub fn send_status(respond: &mut h2::server::SendResponse<Bytes>, status: Status) {
    let _ = respond.send_response(status.into_http::<()>(), true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(message: &[u8]) -> Vec<u8> {
        let mut f = vec![0];
        f.extend_from_slice(&(message.len() as u32).to_be_bytes());
        f.extend_from_slice(message);
        f
    }

    /// Feeds `bytes` cut at `cuts` and ends the stream.
    fn read(bytes: &[u8], cuts: &[usize], max: usize) -> Result<Bytes, Status> {
        let mut r = Reader::new(max);
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
            r.push(Bytes::copy_from_slice(&bytes[at..c]))?;
            at = c;
        }
        r.finish()
    }

    #[test]
    fn a_message_reads_whole_or_cut_anywhere() {
        let f = frame(b"hello world");
        assert_eq!(read(&f, &[], 64).unwrap(), &b"hello world"[..]);
        for cut in 0..=f.len() {
            assert_eq!(
                read(&f, &[cut], 64).unwrap(),
                &b"hello world"[..],
                "cut {cut}"
            );
        }
        for a in 0..=f.len() {
            for b in a..=f.len() {
                assert_eq!(read(&f, &[a, b], 64).unwrap(), &b"hello world"[..]);
            }
        }
        assert_eq!(read(&frame(b""), &[], 64).unwrap(), &b""[..]);
    }

    #[test]
    fn later_messages_are_read_and_dropped() {
        let mut f = frame(b"first");
        f.extend_from_slice(&frame(b"second, longer"));
        f.extend_from_slice(&frame(b"3"));
        for cut in 0..=f.len() {
            assert_eq!(read(&f, &[cut], 64).unwrap(), &b"first"[..], "cut {cut}");
        }
        for a in 0..=f.len() {
            for b in a..=f.len() {
                assert_eq!(read(&f, &[a, b], 64).unwrap(), &b"first"[..]);
            }
        }
    }

    #[test]
    fn what_tonic_refuses_is_refused_with_its_code() {
        let code = |r: Result<Bytes, Status>| r.unwrap_err().code();
        // Too large, from the prefix alone.
        assert_eq!(
            code(read(&[0, 0, 0, 1, 0], &[], 255)),
            tonic::Code::OutOfRange
        );
        let mut later = frame(b"ok");
        later.extend_from_slice(&[0, 0, 0, 1, 0]);
        assert_eq!(code(read(&later, &[], 255)), tonic::Code::OutOfRange);
        // Compressed, or a flag that is none.
        assert_eq!(code(read(&[1, 0, 0, 0, 0], &[], 64)), tonic::Code::Internal);
        assert_eq!(code(read(&[7, 0, 0, 0, 0], &[], 64)), tonic::Code::Internal);
        // No message; a stream that ends inside one.
        assert_eq!(code(read(&[], &[], 64)), tonic::Code::Internal);
        assert_eq!(code(read(&[0, 0, 0], &[], 64)), tonic::Code::Internal);
        assert_eq!(
            code(read(&[0, 0, 0, 0, 3, 1], &[], 64)),
            tonic::Code::Internal
        );
        let mut cut_later = frame(b"ok");
        cut_later.extend_from_slice(&[0, 0, 0, 0, 3, 1]);
        assert_eq!(code(read(&cut_later, &[], 64)), tonic::Code::Internal);
        // At the bound is taken.
        assert_eq!(read(&frame(&[9; 255]), &[3], 255).unwrap().len(), 255);
    }

    #[test]
    fn only_identity_encoding_is_taken() {
        let mut h = HeaderMap::new();
        assert!(encoding(&h).is_ok());
        h.insert("grpc-encoding", HeaderValue::from_static("identity"));
        assert!(encoding(&h).is_ok());
        h.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(encoding(&h).unwrap_err().code(), tonic::Code::Unimplemented);
    }
}
