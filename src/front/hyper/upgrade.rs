//! Protocol upgrades (`Upgrade: websocket`) through the proxy.
//!
//! WebSocket is the only protocol Tollgate tunnels. Any other upgrade is removed and the request
//! forwarded as a plain one: a tunnel carries no more HTTP the gateway can route or limit, so an
//! `h2c` upgrade granted by the upstream would let every later HTTP/2 request on the connection
//! skip routing and limits.
//!
//! `Connection` and `Upgrade` are hop-by-hop, so the header rewriting strips them; for a WebSocket
//! request they are put back toward the upstream, and kept on its `101` answer. Only when the
//! upstream really answers `101 Switching Protocols` are the two connections joined into a byte
//! tunnel: an upstream that refuses leaves an ordinary HTTP exchange, and no client bytes reach
//! it outside HTTP framing. The tunnel closes when either side does, or when no byte has gone
//! either way for `[server] idle_timeout`.

use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, CONNECTION, UPGRADE};
use http::request::Parts;
use http::Version;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use crate::front::server::ConnState;

/// The `Upgrade` value of an HTTP/1.1 request that asks for a WebSocket (`Connection: upgrade`
/// and one `Upgrade: websocket` header); `None` for any other request, including other upgrades.
pub fn requested(parts: &Parts) -> Option<HeaderValue> {
    if parts.version != Version::HTTP_11 {
        return None;
    }
    let asks = parts
        .headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !asks {
        return None;
    }
    let mut values = parts.headers.get_all(UPGRADE).iter();
    match (values.next(), values.next()) {
        (Some(v), None) if v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"websocket") => {
            Some(v.clone())
        }
        _ => None,
    }
}

/// Puts `Connection: upgrade` and `Upgrade: <proto>` back after hop-by-hop stripping.
pub fn restore_headers(headers: &mut HeaderMap, proto: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, proto);
}

/// Joins the client and upstream connections once both have switched protocols.
pub fn tunnel(
    client: OnUpgrade,
    upstream: OnUpgrade,
    conn: Arc<ConnState>,
    idle: Duration,
    route: Arc<str>,
    leases: Option<crate::pipeline::Leases>,
) {
    // Validation bounds it; capped again so `last_active() + idle` cannot overflow an `Instant`.
    let idle = idle.min(crate::config::MAX_TIMEOUT);
    tokio::spawn(async move {
        // Concurrency slots live as long as the tunnel (or this task, if the upgrade fails).
        let _leases = leases;
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(route = &*route, error = %e, "upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
        tokio::pin!(copy);
        // Every tunnelled byte passes the client connection's IO, which records activity.
        loop {
            tokio::select! {
                res = &mut copy => {
                    match res {
                        Ok((up, down)) => tracing::debug!(route = &*route, client_to_upstream = up, upstream_to_client = down, "tunnel closed"),
                        Err(e) => tracing::debug!(route = &*route, error = %e, "tunnel ended with an error"),
                    }
                    return;
                }
                _ = tokio::time::sleep_until(conn.last_active() + idle) => {
                    if conn.last_active() + idle <= tokio::time::Instant::now() {
                        tracing::debug!(route = &*route, "closing idle tunnel");
                        return;
                    }
                }
            }
        }
    });
}
