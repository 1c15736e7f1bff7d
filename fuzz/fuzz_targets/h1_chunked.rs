//! The fast HTTP/1 front's chunked decoder (`http1::codec`), against hyper's: arbitrary bytes
//! as a chunked request body. The properties are in `fuzz/common/chunked.rs` (shared with
//! `tests/round_trip.rs`, which runs this target's seeds in the normal test suite).
#![no_main]

#[path = "../common/chunked.rs"]
mod chunked;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    chunked::check(data);
});
