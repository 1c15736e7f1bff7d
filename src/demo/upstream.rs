//! The demo upstream: answers every request with a JSON echo of what it got.
//!
//! `tollgate demo upstream` (listens on 127.0.0.1:3000; `--listen ADDR` to change).
//! `GET /slow?ms=N` answers after N milliseconds (at most a minute); `GET /status/N` answers
//! with status N. Exits on SIGTERM or Ctrl-C: in a container it is PID 1, which the kernel sends
//! no signal it does not handle itself, so without a handler `docker compose down` would wait
//! and kill it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// Where the demo upstream listens unless told otherwise (`gateway.toml` forwards there).
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 3000);

/// The longest `/slow?ms=N` waits.
const MAX_SLOW: Duration = Duration::from_secs(60);

async fn echo(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let mut status = StatusCode::OK;
    if parts.uri.path() == "/slow" {
        let ms = parts
            .uri
            .query()
            .and_then(|q| q.strip_prefix("ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(ms).min(MAX_SLOW)).await;
    }
    if let Some(code) = parts.uri.path().strip_prefix("/status/") {
        status = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
    }
    // Count the body as it streams rather than collecting it.
    let mut body = body;
    let mut body_len = 0usize;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => body_len = body_len.saturating_add(f.data_ref().map_or(0, |d| d.len())),
            Err(_) => break,
        }
    }
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned().into(),
            )
        })
        .collect();
    let json = serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "headers": headers,
        "body_len": body_len,
    });
    let mut res = Response::new(Full::new(Bytes::from(json.to_string())));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(res)
}

/// Serves the echo on `listen` until SIGTERM or Ctrl-C; prints `upstream listening on
/// http://ADDR` (the bound address: `--listen 127.0.0.1:0` picks a free port) once it accepts.
pub async fn serve(listen: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    // The handlers first: whoever reads "listening" may send SIGTERM at once, and a signal that
    // came before them would be ignored (as PID 1) or kill the process with another status.
    let shutdown = shutdown_signal()?;
    tokio::pin!(shutdown);
    println!("upstream listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors, or a connection reset before it was accepted: the next.
                Err(_) => continue,
            },
            () = &mut shutdown => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service_fn(echo))
                .await;
        });
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT). Both handlers are installed before this returns, so
/// a signal that arrives before the first poll is not lost.
#[cfg(unix)]
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Resolves on Ctrl-C.
#[cfg(not(unix))]
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
