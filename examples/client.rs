//! A small client that shows Tollgate's rate-limit headers and a 429 with `Retry-After`.
//!
//! `cargo run --example client -- http://127.0.0.1:8080/api/hello 5` sends 5 requests (default
//! 12) and prints each status with the rate-limit headers; on a 429 it prints the problem+json
//! body and waits `Retry-After` seconds before the next request.

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080/api/hello".to_owned());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(12);
    let client = reqwest::Client::builder().no_proxy().build()?;
    for i in 1..=n {
        let res = client
            .get(&url)
            .header("x-api-key", "demo-key")
            .send()
            .await?;
        let status = res.status();
        let h = |name: &str| {
            res.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        println!(
            "#{i:<3} {status}  limit={} remaining={} reset={}  RateLimit: {}  RateLimit-Policy: {}",
            h("x-ratelimit-limit"),
            h("x-ratelimit-remaining"),
            h("x-ratelimit-reset"),
            h("ratelimit"),
            h("ratelimit-policy"),
        );
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let retry: u64 = h("retry-after").parse().unwrap_or(1);
            println!("     Retry-After: {retry}s  body: {}", res.text().await?);
            tokio::time::sleep(Duration::from_secs(retry)).await;
        }
    }
    Ok(())
}
