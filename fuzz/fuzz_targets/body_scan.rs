//! The response-body scanners of `cost_from` (`body_cost::json`, `body_cost::sse`), which read
//! every byte an upstream sends on a token-limited route.
//!
//! Input: one byte seeding how the body is cut into reads, then the body.
//!
//! Properties:
//! - no body panics them;
//! - how the bytes arrive does not matter: cut into reads of varied sizes, the body gives the
//!   same results as fed whole (JSON and event stream alike);
//! - the event-stream scan's prefilter (events that cannot carry a path are not scanned) gives
//!   the same results as scanning every event;
//! - the JSON scan agrees with serde_json: on every body serde_json parses (and that nests at
//!   most `JSON_MAX_DEPTH` deep), each path's result is what a lookup in the parsed value gives
//!   (missing; the integer when it is one of at most 2^53; else malformed), the last of a
//!   repeated key counting, as serde_json keeps it.
#![no_main]

#[path = "../common/cut.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tollgate::fuzzing::{JsonFound, JsonScan, SseScan, JSON_MAX_DEPTH};

const PATHS: [&[&str]; 4] = [&["usage", "total_tokens"], &["a"], &["a", "b"], &["usage"]];

fn paths() -> Vec<Vec<Box<str>>> {
    PATHS
        .iter()
        .map(|p| p.iter().map(|k| Box::from(*k)).collect())
        .collect()
}

fn json(reads: &[&[u8]]) -> Vec<JsonFound> {
    let owned = paths();
    let refs: Vec<&[Box<str>]> = owned.iter().map(|p| p.as_slice()).collect();
    let mut s = JsonScan::new(&refs);
    for r in reads {
        s.feed(r);
    }
    s.finish();
    s.results()
}

fn sse(reads: &[&[u8]], filtered: bool) -> Vec<JsonFound> {
    let owned = paths();
    let refs: Vec<&[Box<str>]> = owned.iter().map(|p| p.as_slice()).collect();
    let mut s = if filtered {
        SseScan::new(&refs)
    } else {
        SseScan::unfiltered(&refs)
    };
    for r in reads {
        s.feed(r);
    }
    s.results()
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn lookup(v: &Value, path: &[&str]) -> JsonFound {
    let mut at = v;
    for k in path {
        match at.as_object().and_then(|o| o.get(*k)) {
            Some(next) => at = next,
            None => return JsonFound::Missing,
        }
    }
    match at.as_u64() {
        Some(n) if n <= 1 << 53 => JsonFound::Value(n),
        _ => JsonFound::Malformed,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let whole = json(&[body]);
    let reads = common::cut(body, seed, 64);
    assert_eq!(json(&reads), whole, "the same JSON results however the body is cut");
    let stream = sse(&reads, true);
    assert_eq!(stream, sse(&[body], true), "the same event-stream results however it is cut");
    assert_eq!(stream, sse(&[body], false), "skipping events that cannot carry a path changes nothing");
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if depth(&v) <= JSON_MAX_DEPTH {
            let want: Vec<JsonFound> = PATHS.iter().map(|p| lookup(&v, p)).collect();
            assert_eq!(whole, want, "agrees with serde_json");
        } else {
            assert!(whole.iter().all(|f| *f == JsonFound::Malformed));
        }
    }
});
