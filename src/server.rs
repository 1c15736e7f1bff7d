//! The proxy listener: accepts connections (plain or TLS), serves HTTP/1.1 and HTTP/2 on each
//! with hyper's auto builder, and drains gracefully.
//!
//! hyper's timer is installed so `header_read_timeout` works (slowloris connections are closed),
//! HTTP/2 concurrent streams and header-list size are bounded explicitly (CONTINUATION and rapid
//! reset floods), and a header block above `max_header_bytes` gets hyper's 431.

use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::gateway::Shared;
use crate::proxy::{handle, ConnInfo};

/// The connection builder for the current server settings.
pub fn builder(cfg: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_read_timeout)
        .max_buf_size(cfg.max_header_bytes.max(8192))
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(cfg.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(cfg.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

/// Accepts until `stop` turns true, then waits for in-flight requests (up to the grace period).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let grace = shared.snapshot.load().config.server.grace_period;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let snap = shared.snapshot.load();
        let builder = builder(&snap.config.server);
        let handshake_timeout = snap.config.server.header_read_timeout;
        drop(snap);
        let shared2 = shared.clone();
        match &shared.tls {
            None => {
                let info = ConnInfo { peer, tls: false };
                let svc = service_fn(move |req| handle(shared2.clone(), info, req));
                let conn = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .into_owned();
                let watched = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = watched.await {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                let info = ConnInfo { peer, tls: true };
                let (tls_tx, tls_rx) = tokio::sync::oneshot::channel();
                // The handshake runs in its own task so a slow one never holds up the accept loop.
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = tls_tx.send(s);
                        }
                        Ok(Err(e)) => {
                            metrics::counter!(crate::metrics::TLS_HANDSHAKE_ERRORS).increment(1);
                            tracing::debug!(error = %e, %peer, "TLS handshake failed");
                        }
                        Err(_) => {
                            metrics::counter!(crate::metrics::TLS_HANDSHAKE_ERRORS).increment(1);
                            tracing::debug!(%peer, "TLS handshake timed out");
                        }
                    }
                });
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let Ok(stream) = tls_rx.await else { return };
                    let svc = service_fn(move |req| handle(shared2.clone(), info, req));
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .into_owned();
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections drained"),
        _ = tokio::time::sleep(grace) => tracing::warn!(grace_period = ?grace, "grace period over; closing remaining connections"),
    }
}
