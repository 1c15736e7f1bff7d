//! The HTTP/1 framing scanner (`server::h1_scan`), which follows a client's raw bytes to find
//! where each request head starts and which heads carry both `Content-Length` and
//! `Transfer-Encoding`.
//!
//! Input: one byte seeding how the stream is cut into reads, then the bytes a client sends.
//!
//! Properties:
//! - no input panics it, whatever the head limit;
//! - what it finds does not depend on how the bytes arrive: fed whole, one byte at a time, or in
//!   reads of varied sizes, it reports the same conflicting head, counts the same heads, ends in
//!   the same state (following or stopped) and agrees on whether a head is being read. (A head
//!   longer than the limit is where hyper answers 431 and closes; the limit is set above the
//!   input so that this case does not differ by design.)
#![no_main]

#[path = "../common/cut.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use tollgate::fuzzing::H1Scan;

#[derive(Debug, PartialEq, Eq)]
struct Seen {
    found: Vec<u64>,
    heads: u64,
    done: bool,
    in_head: bool,
}

fn run<'a>(max_head: usize, reads: impl Iterator<Item = &'a [u8]>) -> Seen {
    let mut scan = H1Scan::new(max_head);
    let found = reads.filter_map(|r| scan.feed(r)).collect();
    Seen {
        found,
        heads: scan.heads(),
        done: scan.is_done(),
        in_head: scan.in_head(),
    }
}

/// `stream` cut into reads of 1 to 16 bytes (see `common/cut.rs`).
fn cut(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    common::cut(stream, seed, 16)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let max_head = stream.len() + 1;
    let whole = run(max_head, std::iter::once(stream));
    let bytes = run(max_head, stream.chunks(1));
    assert_eq!(whole, bytes, "whole vs one byte at a time");
    let varied = run(max_head, cut(stream, seed).into_iter());
    assert_eq!(whole, varied, "whole vs reads of varied sizes");
    assert!(whole.found.len() <= 1, "stops after a conflicting head");
    // A small head limit: only that it does not panic, and that a head it finds is one counted.
    let small = run(usize::from(seed % 64), cut(stream, seed).into_iter());
    assert!(small.found.iter().all(|&i| i < small.heads));
});
