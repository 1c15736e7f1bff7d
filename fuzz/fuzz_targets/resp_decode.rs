//! The RESP decoder (`store::redis::resp`), which reads every reply from Redis.
//!
//! Input: one byte seeding how the stream is cut into reads, then the bytes Redis sends.
//!
//! Properties:
//! - no reply panics it;
//! - a parsed reply takes at least one byte and no more than there are; an array reply appends
//!   exactly the integers it counts to the caller's buffer (its integers, and 4 for each bulk
//!   string: a key's state, as a Redis lane parses the decide script's runs reply), and an
//!   incomplete or refused reply appends none;
//! - how the bytes arrive does not matter: parsed as they come (one byte at a time for a short
//!   stream, and in reads of varied sizes, the way the connection reads them), the stream gives
//!   the same replies, and ends the same way (waiting for more, or refused), as parsed whole;
//! - a command written with `Command` reads back as the arguments it was given.
#![no_main]

#[path = "../common/cut.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use tollgate::fuzzing::{resp_parse_states, RespCommand, RespReply};

#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Waiting for more bytes.
    More,
    /// Refused (the connection is then dropped).
    Refused,
}

/// Replies (with the integers of each) parsed from the stream as it arrives in `reads`.
fn replies<'a>(reads: impl Iterator<Item = &'a [u8]>) -> (Vec<(RespReply, Vec<i64>)>, End) {
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut ints = Vec::new();
    for read in reads {
        buf.extend_from_slice(read);
        loop {
            ints.clear();
            match resp_parse_states(&buf, &mut ints) {
                Ok(Some((reply, used))) => {
                    assert!(used > 0 && used <= buf.len(), "{used} of {}", buf.len());
                    match reply {
                        RespReply::Ints(n) => assert_eq!(n, ints.len()),
                        _ => assert!(ints.is_empty()),
                    }
                    out.push((reply, ints.clone()));
                    buf.drain(..used);
                }
                Ok(None) => {
                    assert!(ints.is_empty());
                    break;
                }
                Err(_) => {
                    assert!(ints.is_empty());
                    return (out, End::Refused);
                }
            }
        }
    }
    (out, End::More)
}

/// `stream` cut into reads of 1 to 64 bytes (see `common/cut.rs`).
fn cut(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    common::cut(stream, seed, 64)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let whole = replies(std::iter::once(stream));
    // One byte at a time re-reads a line's start at every byte: kept to short streams, so that
    // the fuzzer's speed is not spent on a few long lines (reads of varied sizes cover those).
    if stream.len() <= 512 {
        assert_eq!(
            whole,
            replies(stream.chunks(1)),
            "whole vs one byte at a time"
        );
    }
    assert_eq!(
        whole,
        replies(cut(stream, seed).into_iter()),
        "whole vs reads of varied sizes"
    );

    // The stream's bytes, split at the seed byte, as a command's arguments.
    let args: Vec<&[u8]> = stream.split(|&b| b == seed).collect();
    let mut command = RespCommand::default();
    for a in &args {
        command.arg(a);
    }
    assert_eq!(command.args(), args.len());
    assert_eq!(command.iter().collect::<Vec<_>>(), args);
});
