//! A demo upstream that answers like an OpenAI-compatible chat API (see `examples/llm/mod.rs`),
//! for trying token limits: `cargo run --example llm_upstream` listens on 127.0.0.1:3000
//! (`--listen ADDR` to change); `examples/configs/llm-tokens.toml` fronts it.

#[path = "llm/mod.rs"]
mod llm;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:3000".to_owned();
    while let Some(a) = args.next() {
        if a == "--listen" {
            listen = args.next().unwrap_or(listen);
        }
    }
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("llm upstream on {}", listener.local_addr()?);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                tokio::spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service_fn(llm::chat))
                        .await;
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
