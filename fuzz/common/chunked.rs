//! The chunked-decoder oracle (`h1_chunked`), shared by the fuzz target and
//! `tests/round_trip.rs` (its seed corpus in the normal test suite): the fast HTTP/1 front's
//! chunked decoder (`http1::codec`) against hyper's, on arbitrary bytes as a chunked request
//! body.
//!
//! Input: one byte seeding how the body is cut into reads, then the body's bytes.
//!
//! Properties:
//! - no input panics it;
//! - what it decodes does not depend on how the bytes arrive (whole or in reads of varied
//!   sizes): the same data, the same end or error;
//! - where hyper reads the body to its end, the decoder does too, with the same data; where
//!   the decoder refuses the framing, hyper fails the body too; and where hyper fails the body
//!   (a malformed trailer section included, #50 item 13), the decoder never reads it to an end.
//!   One divergence is deliberate: a trailer section that httparse ends early (a line ended by
//!   a bare LF, then an empty line) and that goes on to the CRLF hyper waits for is refused by
//!   the decoder; hyper ignores what follows httparse's end, which nginx would read as the
//!   next request.
#![allow(dead_code)]

#[path = "cut.rs"]
mod common;
#[path = "hyper_server.rs"]
mod hyper_server;

use tollgate::fuzzing::ChunkedDecoder;

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The body ended: its data.
    Done(Vec<u8>),
    /// The framing is malformed.
    Refused,
    /// The input ended first.
    Incomplete,
}

pub fn decode<'a>(reads: impl Iterator<Item = &'a [u8]>) -> Outcome {
    let mut d = ChunkedDecoder::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut data = Vec::new();
    for read in reads {
        buf.extend_from_slice(read);
        loop {
            match d.decode(&buf) {
                Err(_) => return Outcome::Refused,
                Ok(r) => {
                    data.extend_from_slice(&buf[r.data.0..r.data.1]);
                    buf.drain(..r.consumed);
                    if d.is_done() {
                        return Outcome::Done(data);
                    }
                    if r.consumed == 0 || buf.is_empty() {
                        break;
                    }
                }
            }
        }
    }
    Outcome::Incomplete
}

/// An input of the fuzz target (see the module comment).
pub fn check(data: &[u8]) {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let whole = decode(std::iter::once(body));
    let varied = decode(common::cut(body, seed, 16).into_iter());
    assert_eq!(whole, varied, "whole vs reads of varied sizes");
    let mut request = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    request.extend_from_slice(body);
    let served = hyper_server::serve(&request).expect("hyper serves the head");
    match (&served.body, &whole) {
        (Some(Ok(h)), Outcome::Done(ours)) => {
            assert_eq!(h, ours, "hyper and the decoder read different data")
        }
        (Some(Ok(_)), Outcome::Refused) if ends_early(body) => {}
        (Some(Ok(_)), other) => panic!("hyper read the body to its end, the decoder: {other:?}"),
        (Some(Err(())), Outcome::Done(_)) => {
            panic!("hyper failed the body, the decoder read it to its end")
        }
        (_, Outcome::Refused) => assert!(
            matches!(served.body, Some(Err(()))),
            "the decoder refused framing hyper did not: {:?}",
            served.body
        ),
        (Some(Err(())) | None, _) => {}
    }
}

/// Whether the trailer section of a chunked body hyper read to its end (as hyper delimits it:
/// CRLF-ended lines up to an empty one) is ended earlier by httparse.
fn ends_early(body: &[u8]) -> bool {
    let crlf = |from: usize| -> Option<usize> {
        body.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    let mut at = 0;
    // The chunks, leniently (hyper read them): size, extensions, data.
    loop {
        let Some(end) = crlf(at) else { return false };
        let digits: Vec<u8> = body[at..end]
            .iter()
            .copied()
            .take_while(u8::is_ascii_hexdigit)
            .collect();
        let Ok(size) = usize::from_str_radix(std::str::from_utf8(&digits).unwrap_or("x"), 16)
        else {
            return false;
        };
        at = end + 2;
        if size == 0 {
            break;
        }
        at = match at.checked_add(size).and_then(|a| a.checked_add(2)) {
            Some(a) => a,
            None => return false,
        };
    }
    // The section: lines to the first empty one.
    let start = at;
    loop {
        let Some(end) = crlf(at) else { return false };
        let empty = end == at;
        at = end + 2;
        if empty {
            break;
        }
    }
    let section = &body[start..at];
    let mut fields = [httparse::EMPTY_HEADER; 128];
    matches!(
        httparse::parse_headers(section, &mut fields),
        Ok(httparse::Status::Complete((read, _))) if read < section.len()
    )
}
