//! The admin listener's accept loop and request routing: `GET /metrics` (Prometheus text),
//! `GET /healthz` (the process is up), `GET /readyz` (every proxy worker accepts and the store can
//! decide), `POST /-/reload` (ask the reload thread for a reload and answer its outcome),
//! `GET /-/top`, `GET /-/explain`, and support's quota endpoints `GET /-/usage`,
//! `POST /-/quota/reset` and `POST /-/quota/grant` ([`super::quota`]), and `POST /-/cache/purge`
//! ([`crate::cache::purge`]). A `test-clock` build (tests
//! only) adds `POST /-/test/clock` (`crate::runtime::test_clock`).
//!
//! With `[admin] token_file`, every endpoint that changes state, and unless `protect_reads =
//! false` every one that reveals consumers' state, needs `Authorization: Bearer TOKEN`
//! ([`Protection`]); `/metrics`, `/healthz` and `/readyz` stay open (probes and scrapers carry
//! no token).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::runtime::reload::Reloader;
use crate::runtime::state::Shared;
use tollgate_limit::store::Store;

/// The largest admin request body (a quota correction is a few dozen bytes).
const MAX_BODY: usize = 16 * 1024;

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// What an admin path needs of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protection {
    /// `/metrics`, `/healthz`, `/readyz`, and paths that do not exist (404 for everyone).
    Open,
    /// Reads consumers' state (`/-/explain`, `/-/top`, `/-/usage`): a token unless
    /// `protect_reads = false`.
    Read,
    /// Changes state (`/-/reload`, `/-/quota/…`): always a token when a token file is set.
    Write,
}

fn protection(path: &str) -> Protection {
    match path {
        "/-/reload" | "/-/cache/purge" => Protection::Write,
        p if p.starts_with("/-/quota/") => Protection::Write,
        #[cfg(feature = "test-clock")]
        crate::runtime::test_clock::PATH => Protection::Write,
        "/-/explain" | "/-/top" | "/-/usage" => Protection::Read,
        _ => Protection::Open,
    }
}

/// The 401 of a protected endpoint asked without a known token (counted).
fn unauthorized() -> Response<Full<Bytes>> {
    metrics::counter!(crate::metrics::ADMIN_UNAUTHORIZED).increment(1);
    let mut r = reply(
        StatusCode::UNAUTHORIZED,
        "application/json",
        r#"{"error":"this admin endpoint needs Authorization: Bearer TOKEN with a token of [admin] token_file"}"#,
    );
    r.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
    );
    r
}

async fn route(
    shared: Arc<Shared>,
    reloader: Reloader,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const JSON: &str = "application/json";
    let needs = protection(req.uri().path());
    if needs != Protection::Open {
        let snap = shared.snapshot.load();
        if let Some(tokens) = &snap.admin_tokens {
            let checked = needs == Protection::Write || snap.config.admin.protect_reads;
            let auth = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            if checked && !tokens.admits(auth) {
                return Ok(unauthorized());
            }
        }
    }
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => match &shared.metrics {
            Some(h) => {
                let mut text = h.render();
                // The upstream series follow the configuration that serves.
                crate::upstream::write_metrics(&shared.snapshot.load().groups, &mut text);
                reply(StatusCode::OK, "text/plain; version=0.0.4", text)
            }
            None => reply(
                StatusCode::NOT_FOUND,
                JSON,
                r#"{"error":"metrics are not enabled"}"#,
            ),
        },
        (&Method::GET, "/healthz") => reply(StatusCode::OK, JSON, r#"{"status":"ok"}"#),
        (&Method::GET, "/readyz") => {
            let store = Arc::clone(&shared.snapshot.load().store);
            let backend = store.backend();
            let up = store.is_up();
            let serving = shared.serving.all();
            let status = match (serving, up) {
                (true, true) => "ready",
                (false, _) => "not_serving",
                (true, false) => "degraded",
            };
            let code = if serving && up {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            reply(
                code,
                JSON,
                format!(
                    r#"{{"status":"{status}","serving":{serving},"store":"{backend}","store_up":{up}}}"#
                ),
            )
        }
        (&Method::POST, "/-/reload") => match reloader.request().await {
            Ok(outcome) => match &outcome.result {
                Ok(warnings) => reply(
                    StatusCode::OK,
                    JSON,
                    serde_json::json!({"status": "reloaded", "generation": outcome.generation, "warnings": warnings})
                        .to_string(),
                ),
                Err(e) => reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    JSON,
                    serde_json::json!({"status": "rejected", "generation": outcome.generation, "error": e.to_string()})
                        .to_string(),
                ),
            },
            Err(_) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                JSON,
                r#"{"status":"the reload thread is gone"}"#,
            ),
        },
        (&Method::GET, "/-/top") => {
            let (code, body) = super::top(&shared.snapshot.load(), req.uri().query());
            reply(code, JSON, body)
        }
        (&Method::POST, "/-/quota/reset" | "/-/quota/grant") => {
            let action = if req.uri().path() == "/-/quota/reset" {
                super::Action::Reset
            } else {
                super::Action::Grant
            };
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return Ok(reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        JSON,
                        r#"{"error":"the body is too large or could not be read"}"#,
                    ))
                }
            };
            let snap = shared.snapshot.load_full();
            let (code, body) = super::adjust(&snap, action, &body).await;
            reply(code, JSON, body)
        }
        (&Method::POST, "/-/cache/purge") => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return Ok(reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        JSON,
                        r#"{"error":"the body is too large or could not be read"}"#,
                    ))
                }
            };
            let snap = shared.snapshot.load_full();
            if let Some(cache) = &snap.cache {
                cache.loaded().await;
            }
            let (code, body) = crate::cache::purge::purge(snap.cache.as_deref(), &body);
            reply(code, JSON, body)
        }
        (&Method::GET, "/-/usage") => {
            let snap = shared.snapshot.load_full();
            let (code, body) = super::usage_of(&snap, req.uri().query()).await;
            reply(code, JSON, body)
        }
        (&Method::GET, "/-/explain") => {
            let (code, body) = super::explain(&shared, req.uri().query()).await;
            reply(code, JSON, body)
        }
        #[cfg(feature = "test-clock")]
        (&Method::POST, crate::runtime::test_clock::PATH) => {
            let (code, body) = crate::runtime::test_clock::handle(&shared.clock, req.uri().query());
            reply(code, JSON, body)
        }
        _ => reply(StatusCode::NOT_FOUND, JSON, r#"{"error":"not found"}"#),
    })
}

/// Serves the admin endpoints until the task is aborted. The gateway does that once the proxy
/// has drained, so `/readyz` answers 503 and `/metrics` can be scraped during a drain.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, reloader: Reloader) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(a) => a,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        let reloader = reloader.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| route(shared.clone(), reloader.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
