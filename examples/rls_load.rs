//! A small load client for Tollgate's rate limit service (`[rls]`, bench/rls.sh): STREAMS
//! gRPC connections, each with one `ShouldRateLimit` call in flight at a time, for SECONDS;
//! every call carries DESCRIPTORS descriptors `user=<one of KEYS keys>` of domain `bench`.
//!
//!     cargo run --release --example rls_load -- 127.0.0.1:8081 8 10 1 10000
//!
//! Prints one line: `RLSLOAD calls=N descriptors=D seconds=S over_limit=O errors=E`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_owned());
    let addr = arg(1, "127.0.0.1:8081");
    let streams: usize = arg(2, "8").parse().expect("STREAMS");
    let seconds: u64 = arg(3, "10").parse().expect("SECONDS");
    let per_call: usize = arg(4, "1").parse().expect("DESCRIPTORS");
    let keys: u64 = arg(5, "10000").parse().expect("KEYS");
    let (calls, over, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for s in 0..streams {
        let (addr, calls, over, errors) =
            (addr.clone(), calls.clone(), over.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connects");
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (s as u64 + 1);
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
                let r = c
                    .should_rate_limit(RateLimitRequest {
                        domain: "bench".into(),
                        descriptors,
                        hits_addend: 0,
                    })
                    .await;
                match r {
                    Ok(r) => {
                        calls.fetch_add(1, Ordering::Relaxed);
                        if r.into_inner().overall_code == 2 {
                            over.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let n = calls.load(Ordering::Relaxed);
    println!(
        "RLSLOAD calls={n} descriptors={} seconds={secs:.3} over_limit={} errors={}",
        n * per_call as u64,
        over.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
}
