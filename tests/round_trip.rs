//! The fast HTTP/1 front's round-trip oracle (`fuzz/common/round_trip.rs`, the `h1_round_trip`
//! fuzz target) over its seed corpus, in the normal test suite: every case of #34 items 1, 3, 6
//! and 14 is a seed. What the front writes upstream parses, with an independent parser, to
//! exactly the requests it decided on; what it writes to the client parses to the upstream's
//! status, fields and body, or it answered 502 and did not reuse the connection.

#[path = "../fuzz/common/round_trip.rs"]
mod round_trip;

#[path = "../fuzz/common/chunked.rs"]
mod chunked;

use tollgate::fuzzing::{h1_round_trip_requests, h1_round_trip_response, H1ResponseTrip};

fn corpus() -> Vec<(String, Vec<u8>)> {
    seeds_of("h1_round_trip")
}

/// The committed seed corpus of fuzz target `target`, by file name.
fn seeds_of(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = format!("{}/fuzz/corpus/{target}", env!("CARGO_MANIFEST_DIR"));
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("the seed corpus")
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    seeds.sort();
    seeds
}

#[test]
fn every_seed_keeps_the_round_trip() {
    let seeds = corpus();
    assert!(seeds.len() >= 40, "{} seeds", seeds.len());
    for (name, data) in seeds {
        // Every cut of the stream, not only the seed's own.
        for seed in 0..=255u8 {
            let mut d = data.clone();
            d[1] = seed;
            if let Err(e) = std::panic::catch_unwind(|| round_trip::check(&d)) {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{name} (cut by seed {seed}): {why}");
            }
        }
    }
}

/// The chunked decoder's differential oracle against hyper (`h1_chunked`) over its seed corpus,
/// each seed cut every way: among them each malformed trailer of #50 item 13 (a space before the
/// colon, obs-fold, an empty name, a NUL, no colon, a request line where the final CRLF
/// belongs), which hyper refuses and the decoder must not read to an end.
#[test]
fn every_chunked_seed_agrees_with_hyper() {
    let seeds = seeds_of("h1_chunked");
    assert!(
        seeds.iter().any(|(n, _)| n.contains("trailer-no-colon")),
        "{} seeds",
        seeds.len()
    );
    for (name, data) in seeds {
        for seed in 0..=255u8 {
            let mut d = data.clone();
            if let Some(first) = d.first_mut() {
                *first = seed;
            }
            if let Err(e) = std::panic::catch_unwind(|| chunked::check(&d)) {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{name} (cut by seed {seed}): {why}");
            }
        }
    }
}

/// #34 item 1: the body of a request whose `Connection` names `Content-Length` reaches the
/// upstream as that request's body, never as a request of its own.
#[test]
fn a_body_never_reads_as_a_request_upstream() {
    let smuggled = b"GET /secret HTTP/1.1\r\nHost: up\r\n\r\n";
    let mut req = format!(
        "POST /a HTTP/1.1\r\nHost: gw\r\nConnection: Content-Length\r\nContent-Length: {}\r\n\r\n",
        smuggled.len()
    )
    .into_bytes();
    req.extend_from_slice(smuggled);
    let trip = h1_round_trip_requests(&[&req]);
    assert_eq!(trip.decided.len(), 1);
    let up = round_trip::parse_requests(&trip.upstream, round_trip::UPSTREAM_FIELDS);
    assert_eq!(
        up.msgs.len(),
        1,
        "{}",
        String::from_utf8_lossy(&trip.upstream)
    );
    assert_eq!(up.msgs[0].body, smuggled);
}

/// #34 items 6 and 14: a status outside 100-599 is a 502; a 204 carries no `Content-Length`;
/// `Content-Length: 2, 2` reaches the client as `2`; an empty reason stays empty.
#[test]
fn odd_response_heads() {
    for bad in [
        &b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n"[..],
        b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n",
    ] {
        assert!(matches!(
            h1_round_trip_response(&[bad], false),
            H1ResponseTrip::BadGateway
        ));
    }
    let client = |s: &[u8]| match h1_round_trip_response(&[s], false) {
        H1ResponseTrip::Relayed { client, .. } => String::from_utf8(client).unwrap(),
        other => panic!("{other:?}"),
    };
    let c = client(b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n");
    assert!(!c.to_ascii_lowercase().contains("content-length"), "{c}");
    let c = client(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok");
    assert!(c.contains("\r\nContent-Length: 2\r\n"), "{c}");
    let c = client(b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok");
    assert!(c.starts_with("HTTP/1.1 200 \r\n"), "{c}");
}
