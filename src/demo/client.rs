//! The demo client: shows Tollgate's rate-limit headers and a 429 with `Retry-After`.
//!
//! `tollgate demo client http://127.0.0.1:8080/api/hello 5` sends 5 requests (default 12) with
//! `X-Api-Key: demo-key` and prints each status with the rate-limit headers; on a 429 it prints
//! the problem+json body and waits `Retry-After` seconds (at most a minute) before the next.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The URL the quick start sends to.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080/api/hello";

/// The most a 429's body is read for printing.
const MAX_BODY: usize = 64 * 1024;
/// The longest wait a `Retry-After` may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Why the demo client stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("not an http:// URL: {0}")]
    Url(String),
    #[error("GET {url} failed: {source}")]
    Request {
        url: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("GET {url}: the body could not be read: {source}")]
    Body { url: String, source: hyper::Error },
    #[error("cannot build the request: {0}")]
    Build(#[from] http::Error),
    #[error("cannot write: {0}")]
    Write(#[from] std::io::Error),
}

fn field(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned()
}

/// Sends `n` GETs to `url` one after the other, writing a line per answer to `out`.
pub async fn run(url: &str, n: usize, out: &mut impl Write) -> Result<(), ClientError> {
    let uri: Uri = url.parse().map_err(|_| ClientError::Url(url.to_owned()))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(ClientError::Url(url.to_owned()));
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    for i in 1..=n {
        let req = Request::get(uri.clone())
            .header("x-api-key", "demo-key")
            .body(Empty::new())?;
        let res = client
            .request(req)
            .await
            .map_err(|source| ClientError::Request {
                url: url.to_owned(),
                source,
            })?;
        let status = res.status();
        let h = |name: &str| field(res.headers(), name);
        writeln!(
            out,
            "#{i:<3} {status}  limit={} remaining={} reset={}  RateLimit: {}  RateLimit-Policy: {}",
            h("x-ratelimit-limit"),
            h("x-ratelimit-remaining"),
            h("x-ratelimit-reset"),
            h("ratelimit"),
            h("ratelimit-policy"),
        )?;
        out.flush()?;
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry: u64 = h("retry-after").parse().unwrap_or(1);
            let body = http_body_util::Limited::new(res.into_body(), MAX_BODY);
            let body = match body.collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(e) => match e.downcast::<hyper::Error>() {
                    Ok(source) => {
                        return Err(ClientError::Body {
                            url: url.to_owned(),
                            source: *source,
                        })
                    }
                    Err(_) => "(longer than 64 KiB)".to_owned(),
                },
            };
            writeln!(out, "     Retry-After: {retry}s  body: {body}")?;
            out.flush()?;
            if i < n {
                tokio::time::sleep(Duration::from_secs(retry).min(MAX_WAIT)).await;
            }
        } else {
            // Read the rest so the connection is reused.
            let _ = res.into_body().collect().await;
        }
    }
    Ok(())
}
