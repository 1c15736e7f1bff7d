//! `tollgate health`: ask a running gateway's admin listener for `GET /healthz`.
//!
//! The container image's HEALTHCHECK runs this instead of curl, so the check follows the admin
//! port of the config it is given and the image needs no HTTP client of its own. One HTTP/1.1
//! request on one connection, with a deadline over the whole exchange.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

/// Why the gateway is not healthy, as far as the probe can tell.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("cannot connect to the admin listener at {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("GET http://{addr}/healthz failed: {source}")]
    Http {
        addr: SocketAddr,
        source: hyper::Error,
    },
    #[error("GET http://{addr}/healthz got no answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("GET http://{addr}/healthz answered {status}")]
    Status {
        addr: SocketAddr,
        status: StatusCode,
    },
}

/// Where to reach an admin listener bound to `listen`: the unspecified address (0.0.0.0, ::) is
/// not a destination, so it becomes loopback of the same family.
pub fn probe_addr(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// `GET /healthz` on the admin listener bound to `listen`; `Ok` on a 200 within `timeout`.
pub async fn check(listen: SocketAddr, timeout: Duration) -> Result<(), HealthError> {
    let addr = probe_addr(listen);
    match tokio::time::timeout(timeout, get_healthz(addr)).await {
        Ok(result) => result,
        Err(_) => Err(HealthError::Timeout { addr, timeout }),
    }
}

async fn get_healthz(addr: SocketAddr) -> Result<(), HealthError> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| HealthError::Connect { addr, source })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|source| HealthError::Http { addr, source })?;
    let conn = tokio::spawn(conn);
    let req = Request::get("/healthz")
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("a GET with a static path and a socket address as Host is a valid request");
    let res = sender
        .send_request(req)
        .await
        .map_err(|source| HealthError::Http { addr, source });
    conn.abort();
    let status = res?.status();
    if status == StatusCode::OK {
        Ok(())
    } else {
        Err(HealthError::Status { addr, status })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_are_probed_on_loopback() {
        let p = |s: &str| probe_addr(s.parse().unwrap());
        assert_eq!(p("0.0.0.0:9191"), "127.0.0.1:9191".parse().unwrap());
        assert_eq!(p("[::]:9191"), "[::1]:9191".parse().unwrap());
        assert_eq!(p("10.1.2.3:9090"), "10.1.2.3:9090".parse().unwrap());
    }
}
