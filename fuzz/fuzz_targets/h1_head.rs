//! The fast HTTP/1 front's head parser (`http1::parse`), against hyper's: arbitrary bytes as
//! a client's first request.
//!
//! Properties:
//! - no input panics it;
//! - a head the fast front serves itself (`Complete`) is one hyper serves too, with the same
//!   method, target, fields (names, values, order) and body framing (`Content-Length` or
//!   chunked) — unless `Head::parse` refuses its target, which the connection then hands to
//!   hyper as read;
//! - a stream the fast front finds incomplete (`Partial`) is one hyper serves no request from.
//!
//! Heads the fast front hands to hyper (`Fallback`) are served by hyper itself: no property.
#![no_main]

#[path = "../common/hyper_server.rs"]
mod hyper_server;

use libfuzzer_sys::fuzz_target;
use tollgate::fuzzing::{h1_head_scan, H1BodyKind, H1Head, H1Parsed, RequestHead};

/// Fields grouped by lower-case name in order of first appearance, as a `HeaderMap` holds them.
fn grouped(fields: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<String> = Vec::new();
    for (n, _) in &fields {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names
        .iter()
        .flat_map(|n| fields.iter().filter(move |(m, _)| m == n).cloned())
        .collect()
}

fuzz_target!(|data: &[u8]| {
    match h1_head_scan(data) {
        H1Parsed::Complete(layout) => {
            // A target http's URI parser refuses goes to hyper as read: no property.
            let n = layout.len;
            let Some(head) = H1Head::parse(bytes::Bytes::copy_from_slice(&data[..n]), layout)
            else {
                return;
            };
            let served =
                hyper_server::serve(data).expect("hyper serves what the fast front serves");
            assert_eq!(served.method, head.method().as_str());
            let target = match head.query() {
                Some(q) => format!("{}?{q}", head.path()),
                None => head.path().to_owned(),
            };
            assert_eq!(served.target, target);
            let fields = grouped(
                head.fields()
                    .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.to_vec()))
                    .collect(),
            );
            assert_eq!(served.fields, fields);
            match head.body {
                H1BodyKind::Length(len) => assert_eq!(served.length, Some(len)),
                H1BodyKind::Chunked => assert_eq!(served.length, None),
            }
        }
        H1Parsed::Partial => {
            assert!(
                hyper_server::serve(data).is_none(),
                "hyper served a request from a head the fast front finds incomplete"
            );
        }
        H1Parsed::Fallback(_) => {}
    }
});
