//! The fast front's round trip run on bytes in memory, for the round-trip oracle (the
//! `h1_round_trip` fuzz target and `tests/round_trip.rs`, README "Fuzzing"): the same head
//! parser, head writers and body codecs the connection runs, driven over a byte stream cut into
//! reads as a socket delivers it, with the same framing steps as `exchange` (`send_request`,
//! `read_response`, `stream_response`). The oracle parses what comes out with its own framing
//! code and holds it to what was decided here. Not used by the gateway.

use bytes::{Buf as _, BytesMut};
use http::header::{HeaderName, HeaderValue};

use super::codec::{chunk_head, ChunkedDecoder, ResponseBody};
use super::exchange::parse_response;
use super::parse::{scan, BodyKind, Head, Parsed};
use super::write::{response_head, ResponseExtras, UpstreamHead};
use crate::http::head::RequestHead as _;
use crate::pipeline::{Edits, Forwarded};

/// The address the oracle's requests come from (appended to `X-Forwarded-For`).
pub const CLIENT: &str = "192.0.2.1";

/// A request the fast front served and forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub method: String,
    /// The target as received (the oracle forwards it unchanged).
    pub target: String,
    /// The body as the gateway decoded it.
    pub body: Vec<u8>,
    /// The body ended (else the client's stream ended or broke inside it: the gateway aborts
    /// the upstream request and closes both connections).
    pub complete: bool,
}

/// What the request path wrote upstream for a client's byte stream.
#[derive(Debug, Default)]
pub struct RequestTrip {
    pub decided: Vec<Decided>,
    /// Every byte written to the one upstream connection, the requests in order.
    pub upstream: Vec<u8>,
}

/// A stream of reads: the next one appended to `buf`, `false` when there is none.
struct Reads<'a, 'r> {
    reads: &'r [&'a [u8]],
    at: usize,
}

impl Reads<'_, '_> {
    fn more(&mut self, buf: &mut BytesMut) -> bool {
        match self.reads.get(self.at) {
            Some(r) => {
                buf.extend_from_slice(r);
                self.at += 1;
                true
            }
            None => false,
        }
    }
}

/// Runs the client's `reads` through the fast front's request path: each head it serves
/// itself is written upstream with the gateway's forwarding edits (`X-Forwarded-For` from
/// [`CLIENT`], `X-Forwarded-Proto`; the target and `Host` unchanged, as `preserve_host` sends
/// them), and its body re-framed as `exchange` sends it. Stops where the fast front would stop
/// forwarding on this connection: a head it hands to hyper, a body that ends or breaks early.
pub fn requests(reads: &[&[u8]]) -> RequestTrip {
    let mut trip = RequestTrip::default();
    let mut src = Reads { reads, at: 0 };
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    loop {
        let layout = loop {
            match scan(&buf) {
                Parsed::Complete(l) => break l,
                Parsed::Partial if src.more(&mut buf) => {}
                _ => return trip,
            }
        };
        let bytes = buf.split_to(layout.len).freeze();
        let Some(head) = Head::parse(bytes, layout) else {
            return trip;
        };
        let target = match head.query() {
            Some(q) => format!("{}?{q}", head.path()),
            None => head.path().to_owned(),
        };
        let edits = Edits {
            path_and_query: target.clone(),
            headers: Vec::new(),
            forwarded: Forwarded {
                request_id: None,
                client: Some(HeaderValue::from_static(CLIENT)),
                https: false,
                host: None,
                client_cert: None,
            },
        };
        let uh = UpstreamHead::new(&head, edits, true);
        uh.write(
            &head,
            &HeaderValue::from_static("upstream.example"),
            &mut out,
        );
        trip.upstream.extend_from_slice(&out);
        let mut decided = Decided {
            method: head.method().as_str().to_owned(),
            target,
            body: Vec::new(),
            complete: false,
        };
        match head.body {
            BodyKind::Length(n) => {
                let mut left = n;
                while left > 0 {
                    if buf.is_empty() && !src.more(&mut buf) {
                        trip.decided.push(decided);
                        return trip;
                    }
                    let piece = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    trip.upstream.extend_from_slice(&buf[..piece]);
                    decided.body.extend_from_slice(&buf[..piece]);
                    buf.advance(piece);
                    left -= piece as u64;
                }
            }
            BodyKind::Chunked => {
                let mut decoder = ChunkedDecoder::default();
                loop {
                    let Ok(r) = decoder.decode(&buf) else {
                        trip.decided.push(decided);
                        return trip;
                    };
                    let (from, to) = r.data;
                    if to > from {
                        let mut ch = [0u8; 20];
                        trip.upstream
                            .extend_from_slice(chunk_head(to - from, &mut ch));
                        trip.upstream.extend_from_slice(&buf[from..to]);
                        trip.upstream.extend_from_slice(b"\r\n");
                        decided.body.extend_from_slice(&buf[from..to]);
                    }
                    buf.advance(r.consumed);
                    if decoder.is_done() {
                        trip.upstream.extend_from_slice(b"0\r\n\r\n");
                        break;
                    }
                    if (r.consumed == 0 || buf.is_empty()) && !src.more(&mut buf) {
                        trip.decided.push(decided);
                        return trip;
                    }
                }
            }
        }
        decided.complete = true;
        trip.decided.push(decided);
    }
}

/// What the response path did with an upstream's byte stream.
#[derive(Debug)]
pub enum ResponseTrip {
    /// The client got a 502 (no head, a head refused, a switch of protocols with no upgrade);
    /// the upstream connection is closed.
    BadGateway,
    /// The client got `client`: the upstream's answer, whole; `reuse`: its connection goes
    /// back to the pool (the message ended at its framed end with no byte left over);
    /// `consumed`: the upstream bytes that made up the answer (1xx heads included).
    Relayed {
        client: Vec<u8>,
        reuse: bool,
        consumed: usize,
    },
    /// The answer was cut off (the upstream closed, or broke its framing, mid-body): the
    /// client's connection is closed after what was sent, the upstream's too.
    CutOff { client: Vec<u8> },
}

/// Runs the upstream's `reads` through the fast front's response path for a request with
/// `method` `HEAD` or not (`head_request`): the head parsed (1xx heads skipped), written for the
/// client with no gateway fields besides `Date`, and the body streamed as `exchange` streams it.
pub fn response(reads: &[&[u8]], head_request: bool) -> ResponseTrip {
    let total: usize = reads.iter().map(|r| r.len()).sum();
    let mut src = Reads { reads, at: 0 };
    let mut ubuf = BytesMut::new();
    let rh = loop {
        if !ubuf.is_empty() {
            match parse_response(&mut ubuf, head_request) {
                Ok(Some(h)) if (100..200).contains(&h.status) && h.status != 101 => continue,
                Ok(Some(h)) => break h,
                Ok(None) if ubuf.len() > 64 * 1024 => return ResponseTrip::BadGateway,
                Ok(None) => {}
                Err(_) => return ResponseTrip::BadGateway,
            }
        }
        if !src.more(&mut ubuf) {
            return ResponseTrip::BadGateway;
        }
    };
    if rh.status == 101 {
        return ResponseTrip::BadGateway;
    }
    let mut client = Vec::new();
    let none: [(HeaderName, Vec<u8>); 0] = [];
    response_head(
        &mut client,
        rh.status,
        Some(rh.slice(rh.reason)),
        rh.fields(),
        &ResponseExtras {
            headers: none.iter().map(|(n, v)| (n, v.as_slice())),
            stripped: &[],
            framing: rh.framing,
            close: false,
            edits: None,
        },
    );
    let unread = |ubuf: &BytesMut, src: &Reads<'_, '_>| {
        ubuf.len()
            + src.reads[src.at.min(src.reads.len())..]
                .iter()
                .map(|r| r.len())
                .sum::<usize>()
    };
    let clean = match rh.framing {
        ResponseBody::None | ResponseBody::Length(0) => true,
        ResponseBody::Length(n) => {
            let mut left = n;
            loop {
                if ubuf.is_empty() && !src.more(&mut ubuf) {
                    return ResponseTrip::CutOff { client };
                }
                let piece = ubuf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                client.extend_from_slice(&ubuf[..piece]);
                ubuf.advance(piece);
                left -= piece as u64;
                if left == 0 {
                    break true;
                }
            }
        }
        ResponseBody::Chunked | ResponseBody::Close => {
            let chunked = rh.framing == ResponseBody::Chunked;
            let mut decoder = ChunkedDecoder::default();
            loop {
                let (data, consumed, ended) = if chunked {
                    match decoder.decode(&ubuf) {
                        Ok(r) => (r.data, r.consumed, decoder.is_done()),
                        Err(_) => return ResponseTrip::CutOff { client },
                    }
                } else {
                    ((0, ubuf.len()), ubuf.len(), false)
                };
                let (from, to) = data;
                if to > from {
                    let mut ch = [0u8; 20];
                    client.extend_from_slice(chunk_head(to - from, &mut ch));
                    client.extend_from_slice(&ubuf[from..to]);
                    client.extend_from_slice(b"\r\n");
                }
                ubuf.advance(consumed);
                let eof = if ended {
                    true
                } else if consumed == 0 || ubuf.is_empty() {
                    if src.more(&mut ubuf) {
                        false
                    } else if !chunked {
                        true
                    } else {
                        return ResponseTrip::CutOff { client };
                    }
                } else {
                    false
                };
                if eof {
                    client.extend_from_slice(b"0\r\n\r\n");
                    break chunked;
                }
            }
        }
    };
    let left = unread(&ubuf, &src);
    ResponseTrip::Relayed {
        client,
        reuse: clean && rh.keep_alive && ubuf.is_empty(),
        consumed: total - left,
    }
}
