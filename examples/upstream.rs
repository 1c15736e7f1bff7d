//! The demo upstream (`tollgate demo upstream`, src/demo/upstream.rs) as an example, for the
//! benchmarks and the container image that build it alone:
//! `cargo run --release --example upstream [--listen ADDR]` (127.0.0.1:3000 by default).

use std::net::SocketAddr;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = match args.iter().position(|a| a == "--listen") {
        Some(i) => match args.get(i + 1).and_then(|a| a.parse().ok()) {
            Some(addr) => addr,
            None => {
                eprintln!("usage: upstream [--listen ADDR]");
                std::process::exit(2)
            }
        },
        None => tollgate::demo::upstream::DEFAULT_LISTEN,
    };
    tollgate::demo::upstream::serve(listen).await
}
