//! The PROXY protocol (HAProxy's, v1 text and v2 binary) on an accepted TCP connection, before
//! TLS and before any HTTP front sees a byte: the address the header carries becomes the
//! connection's peer, so subjects, `X-Forwarded-For`, the access log and `ip_hash` see the
//! client behind a TCP load balancer (an AWS NLB, HAProxy in TCP mode).
//!
//! A connection from `proxy_protocol_from` must start with a header of an accepted version,
//! within `proxy_protocol_timeout`; one from any other peer that starts with one is a spoofing
//! attempt. Either failure closes the connection without a response (a header cannot be
//! answered in HTTP) and is counted in `tollgate_proxy_protocol_errors_total{reason}`. Another
//! peer's connection without a header is served with its TCP peer, as Envoy's listener filter
//! allows. The bytes are read exactly (peeked, then consumed up to the header's end), so what
//! follows the header is left on the socket for the front; the codec is the `ppp` crate's.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::config::{ProxyProtocolConfig, ProxyProtocolMode};

/// The v2 signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The v1 prefix.
const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// The longest v1 header (the specification's 107 bytes, CRLF included).
const V1_MAX: usize = 107;
/// The longest v2 address block and TLVs accepted (addresses are at most 216 bytes; TLVs such as
/// an AWS VPC endpoint id or a TLS summary fit easily).
const V2_MAX_LEN: usize = 2048;
/// How long to wait between looks at a connection whose first bytes are still a prefix of a
/// header (rare: a segment cut inside the first 12 bytes).
const PARTIAL_WAIT: Duration = Duration::from_millis(5);

/// Why a connection was closed: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A header from a peer outside `proxy_protocol_from`.
    Untrusted,
    /// A peer in `proxy_protocol_from` sent no header (or closed before one).
    Missing,
    /// A header that does not parse, is too long, or is of a version not accepted.
    Malformed,
    /// No complete header within `proxy_protocol_timeout`.
    Timeout,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Untrusted => "untrusted",
            Refused::Missing => "missing",
            Refused::Malformed => "malformed",
            Refused::Timeout => "timeout",
        }
    }

    /// Every reason (for registering the series at 0).
    pub const ALL: [Refused; 4] = [
        Refused::Untrusted,
        Refused::Missing,
        Refused::Malformed,
        Refused::Timeout,
    ];
}

/// The connection's peer after its PROXY header: the address the header carries, or `peer`
/// (another peer without a header, a `LOCAL` or `UNKNOWN` header: a load balancer's own health
/// check).
pub async fn accept(
    stream: &mut TcpStream,
    peer: SocketAddr,
    cfg: &ProxyProtocolConfig,
) -> Result<SocketAddr, Refused> {
    let ip = peer.ip().to_canonical();
    if !cfg.from.iter().any(|n| n.contains(&ip)) {
        return match tokio::time::timeout(cfg.timeout, starts_with_header(stream)).await {
            Ok(true) => Err(Refused::Untrusted),
            // No header (or nothing yet: the front's own timers take over).
            _ => Ok(peer),
        };
    }
    match tokio::time::timeout(cfg.timeout, read_header(stream, cfg.mode, peer)).await {
        Ok(r) => r,
        Err(_) => Err(Refused::Timeout),
    }
}

/// Whether the first bytes are a PROXY header's (either version), without consuming them.
async fn starts_with_header(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 12];
    loop {
        let n = match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let seen = &buf[..n];
        let v1 = V1_PREFIX.starts_with(&seen[..n.min(6)]);
        let v2 = V2_SIGNATURE.starts_with(seen);
        if (v1 && n >= 6) || (v2 && n >= 12) {
            return true;
        }
        if !v1 && !v2 {
            return false;
        }
        // Still a prefix of one: wait for more (peek would return the same bytes at once).
        tokio::time::sleep(PARTIAL_WAIT).await;
    }
}

async fn read_header(
    stream: &mut TcpStream,
    mode: ProxyProtocolMode,
    peer: SocketAddr,
) -> Result<SocketAddr, Refused> {
    // Six bytes tell the versions apart (no header of either is shorter than 15).
    let mut head = [0u8; 6];
    stream
        .read_exact(&mut head)
        .await
        .map_err(|_| Refused::Missing)?;
    if &head == V1_PREFIX {
        if mode == ProxyProtocolMode::V2 {
            return Err(Refused::Malformed);
        }
        return read_v1(stream, peer).await;
    }
    if head == V2_SIGNATURE[..6] {
        if mode == ProxyProtocolMode::V1 {
            return Err(Refused::Malformed);
        }
        return read_v2(stream, head, peer).await;
    }
    Err(Refused::Missing)
}

/// The rest of a v1 header: up to its CRLF, never past it.
async fn read_v1(stream: &mut TcpStream, peer: SocketAddr) -> Result<SocketAddr, Refused> {
    let mut line = Vec::with_capacity(V1_MAX);
    line.extend_from_slice(V1_PREFIX);
    let mut buf = [0u8; V1_MAX];
    loop {
        let room = V1_MAX - line.len();
        if room == 0 {
            return Err(Refused::Malformed);
        }
        let n = stream
            .peek(&mut buf[..room])
            .await
            .map_err(|_| Refused::Malformed)?;
        if n == 0 {
            return Err(Refused::Malformed);
        }
        let take = match buf[..n].iter().position(|&b| b == b'\n') {
            Some(i) => i + 1,
            None => n,
        };
        let mut chunk = vec![0u8; take];
        stream
            .read_exact(&mut chunk)
            .await
            .map_err(|_| Refused::Malformed)?;
        line.extend_from_slice(&chunk);
        if line.ends_with(b"\n") {
            break;
        }
    }
    let header = ppp::v1::Header::try_from(line.as_slice()).map_err(|_| Refused::Malformed)?;
    if header.header.len() != line.len() {
        // A bare LF, or bytes after the CRLF the parser did not take.
        return Err(Refused::Malformed);
    }
    Ok(match header.addresses {
        ppp::v1::Addresses::Tcp4(a) => SocketAddr::from((a.source_address, a.source_port)),
        ppp::v1::Addresses::Tcp6(a) => SocketAddr::from((a.source_address, a.source_port)),
        ppp::v1::Addresses::Unknown => peer,
    })
}

/// The rest of a v2 header: its fixed part, then exactly the length it announces.
async fn read_v2(
    stream: &mut TcpStream,
    head: [u8; 6],
    peer: SocketAddr,
) -> Result<SocketAddr, Refused> {
    let mut fixed = [0u8; 16];
    fixed[..6].copy_from_slice(&head);
    stream
        .read_exact(&mut fixed[6..])
        .await
        .map_err(|_| Refused::Malformed)?;
    if &fixed[..12] != V2_SIGNATURE {
        return Err(Refused::Malformed);
    }
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if len > V2_MAX_LEN {
        return Err(Refused::Malformed);
    }
    let mut whole = Vec::with_capacity(16 + len);
    whole.extend_from_slice(&fixed);
    whole.resize(16 + len, 0);
    stream
        .read_exact(&mut whole[16..])
        .await
        .map_err(|_| Refused::Malformed)?;
    let header = ppp::v2::Header::try_from(whole.as_slice()).map_err(|_| Refused::Malformed)?;
    // TLVs are parsed lazily by the codec: one that does not parse (a length past the end)
    // makes the whole header malformed (issue #34 item 14).
    if header.tlvs().any(|t| t.is_err()) {
        return Err(Refused::Malformed);
    }
    if header.command == ppp::v2::Command::Local {
        return Ok(peer);
    }
    // A PROXY header for a datagram (UDP) or unspecified transport names no TCP client: it is
    // not this connection's (issue #34 item 14).
    if header.protocol != ppp::v2::Protocol::Stream
        && !matches!(header.addresses, ppp::v2::Addresses::Unspecified)
    {
        return Err(Refused::Malformed);
    }
    Ok(match header.addresses {
        ppp::v2::Addresses::IPv4(a) => SocketAddr::from((a.source_address, a.source_port)),
        ppp::v2::Addresses::IPv6(a) => SocketAddr::from((a.source_address, a.source_port)),
        ppp::v2::Addresses::Unspecified | ppp::v2::Addresses::Unix(_) => peer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reasons_are_the_metrics_labels() {
        let labels: Vec<&str> = Refused::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, crate::metrics::PROXY_PROTOCOL_REASONS);
    }
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    fn cfg(mode: ProxyProtocolMode, from: &str) -> ProxyProtocolConfig {
        ProxyProtocolConfig {
            mode,
            from: vec![from.parse().unwrap()],
            timeout: Duration::from_millis(300),
        }
    }

    /// Sends `bytes` (in `parts` pieces) to a fresh connection and runs `accept` on it; the
    /// result and what is left to read.
    async fn run(
        c: &ProxyProtocolConfig,
        bytes: &[u8],
        cut: Option<usize>,
    ) -> (Result<SocketAddr, Refused>, Vec<u8>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let bytes = bytes.to_vec();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            match cut {
                Some(at) => {
                    s.write_all(&bytes[..at]).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    s.write_all(&bytes[at..]).await.unwrap();
                }
                None => s.write_all(&bytes).await.unwrap(),
            }
            s.shutdown().await.unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
        });
        let (mut s, peer) = l.accept().await.unwrap();
        let r = accept(&mut s, peer, c).await;
        let mut rest = Vec::new();
        if r.is_ok() {
            let _ = s.read_to_end(&mut rest).await;
        }
        client.abort();
        (r, rest)
    }

    fn v2(src: SocketAddr, local: bool) -> Vec<u8> {
        let dst: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let cmd = if local {
            ppp::v2::Command::Local
        } else {
            ppp::v2::Command::Proxy
        };
        ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | cmd,
            ppp::v2::Protocol::Stream,
            (src, dst),
        )
        .build()
        .unwrap()
    }

    #[tokio::test]
    async fn headers_from_trusted_peers_name_the_client() {
        let any = cfg(ProxyProtocolMode::Any, "127.0.0.0/8");
        let (r, rest) = run(
            &any,
            b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 443\r\nGET / HTTP/1.1\r\n",
            None,
        )
        .await;
        assert_eq!(r, Ok("203.0.113.7:5555".parse().unwrap()));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        // Cut inside the header.
        let (r, rest) = run(
            &any,
            b"PROXY TCP6 2001:db8::7 2001:db8::1 5555 443\r\nX",
            Some(9),
        )
        .await;
        assert_eq!(r, Ok("[2001:db8::7]:5555".parse().unwrap()));
        assert_eq!(rest, b"X");
        let mut b = v2("198.51.100.9:4000".parse().unwrap(), false);
        b.extend_from_slice(b"GET");
        let (r, rest) = run(&any, &b, Some(3)).await;
        assert_eq!(r, Ok("198.51.100.9:4000".parse().unwrap()));
        assert_eq!(rest, b"GET");
        // LOCAL and UNKNOWN: the balancer itself.
        let (r, _) = run(&any, &v2("198.51.100.9:4000".parse().unwrap(), true), None).await;
        assert_eq!(r.unwrap().ip().to_string(), "127.0.0.1");
        let (r, _) = run(&any, b"PROXY UNKNOWN\r\n", None).await;
        assert_eq!(r.unwrap().ip().to_string(), "127.0.0.1");
    }

    #[tokio::test]
    async fn bad_headers_are_refused() {
        let any = cfg(ProxyProtocolMode::Any, "127.0.0.0/8");
        assert_eq!(
            run(&any, b"GET / HTTP/1.1\r\n\r\n", None).await.0,
            Err(Refused::Missing)
        );
        assert_eq!(run(&any, b"", None).await.0, Err(Refused::Missing));
        assert_eq!(
            run(&any, b"PROXY TCP4 nonsense\r\n", None).await.0,
            Err(Refused::Malformed)
        );
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(200));
        assert_eq!(
            run(&any, long.as_bytes(), None).await.0,
            Err(Refused::Malformed)
        );
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(run(&any, &huge, None).await.0, Err(Refused::Malformed));
        // Too slow: the client sends half a header and stops.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"PROXY TCP4 1.2.3.4").await.unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
        let (mut s, peer) = l.accept().await.unwrap();
        assert_eq!(accept(&mut s, peer, &any).await, Err(Refused::Timeout));
        client.abort();
        // A version not accepted.
        let v1_only = cfg(ProxyProtocolMode::V1, "127.0.0.0/8");
        let b = v2("198.51.100.9:4000".parse().unwrap(), false);
        assert_eq!(run(&v1_only, &b, None).await.0, Err(Refused::Malformed));
        let v2_only = cfg(ProxyProtocolMode::V2, "127.0.0.0/8");
        assert_eq!(
            run(&v2_only, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", None)
                .await
                .0,
            Err(Refused::Malformed)
        );
    }

    /// Issue #34 item 14: a v2 header for a datagram (UDP) connection, or with TLVs that do
    /// not parse, is refused as malformed, never taken as TCP.
    #[tokio::test]
    async fn v2_udp_or_malformed_tlvs_are_refused() {
        let any = cfg(ProxyProtocolMode::Any, "127.0.0.0/8");
        let src: SocketAddr = "198.51.100.9:4000".parse().unwrap();
        let dst: SocketAddr = "10.0.0.1:443".parse().unwrap();
        let udp = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Datagram,
            (src, dst),
        )
        .build()
        .unwrap();
        assert_eq!(run(&any, &udp, None).await.0, Err(Refused::Malformed));
        // A TLV that announces 5 bytes and carries 1.
        let mut bad = v2(src, false);
        bad.extend_from_slice(&[0x04, 0x00, 0x05, b'a']);
        let len = u16::from_be_bytes([bad[14], bad[15]]) + 4;
        bad[14..16].copy_from_slice(&len.to_be_bytes());
        assert_eq!(run(&any, &bad, None).await.0, Err(Refused::Malformed));
        // A well-formed TLV is fine.
        let mut good = v2(src, false);
        good.extend_from_slice(&[0x04, 0x00, 0x01, b'a']);
        let len = u16::from_be_bytes([good[14], good[15]]) + 4;
        good[14..16].copy_from_slice(&len.to_be_bytes());
        assert_eq!(run(&any, &good, None).await.0, Ok(src));
    }

    #[tokio::test]
    async fn other_peers_are_served_as_they_are_unless_they_spoof() {
        let elsewhere = cfg(ProxyProtocolMode::Any, "10.0.0.0/8");
        let (r, rest) = run(&elsewhere, b"GET / HTTP/1.1\r\n", None).await;
        assert_eq!(r.unwrap().ip().to_string(), "127.0.0.1");
        assert_eq!(rest, b"GET / HTTP/1.1\r\n", "nothing consumed");
        // POST and PROPFIND share a prefix with PROXY.
        let (r, _) = run(&elsewhere, b"PROPFIND / HTTP/1.1\r\n", Some(2)).await;
        assert!(r.is_ok());
        assert_eq!(
            run(&elsewhere, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", Some(3))
                .await
                .0,
            Err(Refused::Untrusted)
        );
        let b = v2("198.51.100.9:4000".parse().unwrap(), false);
        assert_eq!(
            run(&elsewhere, &b, Some(5)).await.0,
            Err(Refused::Untrusted)
        );
    }
}
