//! The demo client (`tollgate demo client`, src/demo/client.rs) as an example:
//! `cargo run --example client -- http://127.0.0.1:8080/api/hello 5` sends 5 requests (default
//! 12) and prints each status with the rate-limit headers.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| tollgate::demo::client::DEFAULT_URL.to_owned());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(12);
    tollgate::demo::client::run(&url, n, &mut std::io::stdout()).await?;
    Ok(())
}
