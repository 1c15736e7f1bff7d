//! A small load client for Tollgate's rate limit service (`[rls]`, bench/rls.sh), sending
//! Envoy's own call shape: CONNECTIONS HTTP/2 connections, IN_FLIGHT `ShouldRateLimit` calls in
//! flight on each (a call sent as soon as one is answered), for SECONDS; every call carries
//! DESCRIPTORS descriptors `user=<one of KEYS keys>` of domain `bench`.
//!
//!     cargo run --release --example rls_load -- 127.0.0.1:8081 8 10 1 10000 [IN_FLIGHT]
//!
//! The call is the one Envoy 1.40's ratelimit filter makes (its `envoy_grpc` client, read from
//! its debug log): `:authority` the cluster's name, `te: trailers`, `grpc-timeout` from the
//! filter's timeout, `content-type: application/grpc`, `x-envoy-internal`, `x-forwarded-for`,
//! `x-envoy-expected-rq-timeout-ms`; HEADERS then one DATA frame that ends the stream. Envoy
//! holds one connection per worker and multiplexes its calls on it (IN_FLIGHT > 1); 1 (the
//! default) is the shape whose every call pays its own reads and writes.
//!
//! Prints one line: `RLSLOAD calls=N descriptors=D seconds=S over_limit=O errors=E`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;

#[derive(Default)]
struct Counts {
    calls: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
}

fn call_head() -> http::Request<()> {
    http::Request::post("http://rls/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .header("te", "trailers")
        .header("grpc-timeout", "1000m")
        .header("content-type", "application/grpc")
        .header("x-envoy-internal", "true")
        .header("x-forwarded-for", "192.0.2.2")
        .header("x-envoy-expected-rq-timeout-ms", "1000")
        .body(())
        .expect("a request head")
}

/// One call: `Some(over the limit)`, `None` when it failed.
async fn call(h2: h2::client::SendRequest<Bytes>, message: Bytes) -> Option<bool> {
    let mut h2 = h2.ready().await.ok()?;
    let (answer, mut body) = h2.send_request(call_head(), false).ok()?;
    body.send_data(message, true).ok()?;
    let answer = answer.await.ok()?;
    if answer.headers().contains_key("grpc-status") {
        return None; // trailers-only: a failed call
    }
    let mut answer = answer.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.data().await {
        let chunk = chunk.ok()?;
        let _ = answer.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let trailers = answer.trailers().await.ok()??;
    if trailers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"0") || bytes.len() < 5 {
        return None;
    }
    let reply = RateLimitResponse::decode(&bytes[5..]).ok()?;
    Some(reply.overall_code == 2)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_owned());
    let addr = arg(1, "127.0.0.1:8081");
    let connections: usize = arg(2, "8").parse().expect("CONNECTIONS");
    let seconds: u64 = arg(3, "10").parse().expect("SECONDS");
    let per_call: usize = arg(4, "1").parse().expect("DESCRIPTORS");
    let keys: u64 = arg(5, "10000").parse().expect("KEYS");
    let in_flight: usize = arg(6, "1").parse().expect("IN_FLIGHT");
    let counts = Arc::new(Counts::default());
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connects");
        let _ = tcp.set_nodelay(true);
        let (h2, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 20)
            .handshake::<_, Bytes>(tcp)
            .await
            .expect("an HTTP/2 connection");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        for f in 0..in_flight {
            let (h2, counts) = (h2.clone(), counts.clone());
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ ((c * in_flight + f) as u64 + 1);
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let descriptors = (0..per_call)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            RateLimitDescriptor {
                                entries: vec![Entry {
                                    key: "user".into(),
                                    value: format!("k{}", x % keys.max(1)),
                                }],
                                ..RateLimitDescriptor::default()
                            }
                        })
                        .collect();
                    let r = RateLimitRequest {
                        domain: "bench".into(),
                        descriptors,
                        hits_addend: 0,
                    };
                    let mut framed = vec![0u8];
                    framed.extend_from_slice(&(r.encoded_len() as u32).to_be_bytes());
                    r.encode(&mut framed).expect("encodes");
                    match call(h2.clone(), framed.into()).await {
                        Some(over) => {
                            counts.calls.fetch_add(1, Ordering::Relaxed);
                            if over {
                                counts.over.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => {
                            counts.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let n = counts.calls.load(Ordering::Relaxed);
    println!(
        "RLSLOAD calls={n} descriptors={} seconds={secs:.3} over_limit={} errors={}",
        n * per_call as u64,
        counts.over.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed)
    );
}
