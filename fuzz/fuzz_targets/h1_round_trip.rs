//! The fast HTTP/1 front's round trip (`http1::roundtrip`), against an independent strict
//! parser (`fuzz/common/round_trip.rs`: `httparse` for head lines, framing and hop-by-hop rules
//! of its own). An input is `[mode, seed, stream…]`: mode bit 0 the response side, bit 1 a
//! `HEAD` request; `seed` cuts the stream into reads.
//!
//! Properties (see `round_trip.rs`): no input panics it; what goes upstream parses to exactly
//! the requests decided (method, target, end-to-end fields, body; in order; nothing more),
//! whole or in reads; what reaches the client parses to the upstream's status, reason, fields
//! and body, or the answer is a 502 with the upstream connection not reused; a connection is
//! reused only when the message ended where the independent parser ends it.
#![no_main]

#[path = "../common/round_trip.rs"]
mod round_trip;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    round_trip::check(data);
});
