//! The front of `[server] http_redirect_listen`: a plain HTTP/1.1 listener that answers every
//! request with a 308 to the same host and target on the TLS listener (ingress-nginx's
//! `force-ssl-redirect`). What the answer is comes from the pipeline
//! ([`Answer::https_redirect`]); this module only accepts, parses and renders. Nothing is
//! routed, limited or forwarded here: there is nothing to protect but the redirect itself,
//! which costs no store call. With `[server.tls.acme]` and `challenge = "http-01"`, it also
//! answers `/.well-known/acme-challenge/<token>` (one prefix compare per request).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::pipeline::Answer;
use crate::runtime::state::Shared;

/// Where an ACME server fetches an HTTP-01 token.
const ACME_CHALLENGE: &str = "/.well-known/acme-challenge/";

async fn answer(
    shared: Arc<Shared>,
    tls_port: u16,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let snap = shared.snapshot.load();
    let id_header = &snap.config.server.request_id_header;
    let request_id = crate::http::request_id::of(req.headers(), id_header, Instant::now());
    let (parts, _body) = req.into_parts();
    // ACME HTTP-01 (RFC 8555 §8.3): the token's key authorization, before anything else.
    if let Some(token) = parts.uri.path().strip_prefix(ACME_CHALLENGE) {
        if let Some(acme) = shared.tls.as_ref().and_then(|t| t.acme()) {
            let (status, body) = match acme.http_token(token) {
                Some(key_auth) => (
                    http::StatusCode::OK,
                    Bytes::from(key_auth.as_bytes().to_vec()),
                ),
                None => (http::StatusCode::NOT_FOUND, Bytes::new()),
            };
            let mut res = Response::new(Full::new(body));
            *res.status_mut() = status;
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/octet-stream"),
            );
            res.headers_mut().insert(id_header, request_id);
            return Ok(res);
        }
    }
    // Two `Host` fields name no one host (RFC 9112 §3.2): 400, as on the proxy listener, and
    // never a redirect to either of them.
    let answer = if parts
        .headers
        .get_all(http::header::HOST)
        .iter()
        .nth(1)
        .is_some()
    {
        Answer::from(crate::pipeline::ProxyError::BadRequest(
            "duplicate Host header",
        ))
    } else {
        Answer::https_redirect(&parts, tls_port)
    };
    let (status, mut headers, body) = answer.parts(&request_id);
    headers.insert(id_header, request_id);
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    Ok(res)
}

/// Serves the redirect listener until the task is aborted (after the proxy has drained).
/// `tls_port` is the TLS listener's port (the bound one, when it was asked for port 0).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, tls_port: u16) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let timeout = shared.snapshot.load().config.server.header_read_timeout;
            let svc = service_fn(move |req| answer(shared.clone(), tls_port, req));
            // The head timer also closes a keep-alive connection idle for as long.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
