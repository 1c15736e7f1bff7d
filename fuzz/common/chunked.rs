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
