//! The PROXY protocol through the real binary (issue #25 item 3): a load balancer's header names
//! the client for limits, `X-Forwarded-For` and the access log; a missing, malformed, slow or
//! spoofed header closes the connection without a response and is counted. The test's own
//! connections come from 127.0.0.1 (the trusted balancer) or 127.0.0.2 (anyone else).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

on_every_store!(the_header_names_the_client_for_limits);

/// A connection to `to` from `from` (an address of 127.0.0.0/8).
async fn connect(from: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// Sends `prefix` then a GET of `path` on one connection; the status, or `None` when the
/// gateway closed the connection without answering.
async fn send(from: &str, gw: &Gateway, prefix: &[u8], path: &str) -> Option<u16> {
    let mut s = connect(from, gw.proxy).await;
    let mut req = prefix.to_vec();
    req.extend_from_slice(
        format!("GET {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    // The gateway may close before reading everything: a failed write is a closed connection.
    if s.write_all(&req).await.is_err() {
        return None;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
}

fn v1(ip: &str) -> Vec<u8> {
    format!("PROXY TCP4 {ip} 10.0.0.1 40000 443\r\n").into_bytes()
}

fn v2(src: &str) -> Vec<u8> {
    let src: SocketAddr = src.parse().unwrap();
    // The destination in the source's family (a mixed pair is no address block at all).
    let dst: SocketAddr = if src.is_ipv4() {
        "10.0.0.1:443".parse().unwrap()
    } else {
        "[2001:db8::1]:443".parse().unwrap()
    };
    ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Proxy,
        ppp::v2::Protocol::Stream,
        (src, dst),
    )
    .build()
    .unwrap()
}

fn errors(m: &str, reason: &str) -> Option<f64> {
    metric(
        m,
        &format!("tollgate_proxy_protocol_errors_total{{reason=\"{reason}\"}}"),
    )
}

async fn the_header_names_the_client_for_limits(kind: Kind) {
    let up = upstream().await;
    let env = store_env(kind);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"");
    let cfg = config(&env.store, &routes)
        .replacen(
            "[server]\n",
            "[server]\nproxy_protocol = \"any\"\nproxy_protocol_from = [\"127.0.0.1/32\"]\n",
            1,
        )
        .replacen(
            "[store]\n",
            &format!("[log]\naccess = \"{}\"\n\n[store]\n", log.display()),
            1,
        );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    assert_eq!(
        send("127.0.0.1", &gw, &v1("203.0.113.7"), "/api/x").await,
        Some(200),
        "{kind:?}"
    );
    assert_eq!(
        send("127.0.0.1", &gw, &v2("203.0.113.7:1234"), "/api/x").await,
        Some(429)
    );
    assert_eq!(
        send("127.0.0.1", &gw, &v2("[2001:db8::9]:1234"), "/api/x").await,
        Some(200)
    );
    assert_eq!(
        send("127.0.0.1", &gw, &v1("203.0.113.8"), "/api/x").await,
        Some(200)
    );
    // The upstream hears of the client, not of the balancer.
    let seen = up.seen();
    assert_eq!(seen[0].headers["x-forwarded-for"], "203.0.113.7");
    assert_eq!(seen[1].headers["x-forwarded-for"], "2001:db8::9");
    // So does the access log.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut text = String::new();
    while Instant::now() < deadline {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(text.contains("\"client_ip\":\"203.0.113.7\""), "{text}");
    assert!(!text.contains("\"client_ip\":\"127.0.0.1\""), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_or_spoofed_headers_close_the_connection() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nproxy_protocol = \"v1\"\nproxy_protocol_from = [\"127.0.0.1/32\"]\nproxy_protocol_timeout = \"300ms\"\n",
        1,
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    let m = gw.metrics().await;
    for reason in ["untrusted", "missing", "malformed", "timeout"] {
        assert_eq!(errors(&m, reason), Some(0.0), "{reason}: {m}");
    }
    // From the balancer: no header, a malformed one, one of another version.
    assert_eq!(send("127.0.0.1", &gw, b"", "/api/x").await, None);
    assert_eq!(
        send("127.0.0.1", &gw, b"PROXY TCP4 1.2.3\r\n", "/api/x").await,
        None
    );
    let long = format!("PROXY TCP4 {}\r\n", "9".repeat(300));
    assert_eq!(
        send("127.0.0.1", &gw, long.as_bytes(), "/api/x").await,
        None
    );
    assert_eq!(
        send("127.0.0.1", &gw, &v2("203.0.113.7:1"), "/api/x").await,
        None
    );
    // Half a header, then nothing: closed after the timeout.
    let mut s = connect("127.0.0.1", gw.proxy).await;
    s.write_all(b"PROXY TCP4 203.0.1").await.unwrap();
    let mut buf = Vec::new();
    let t0 = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .expect("the gateway closed the connection")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    // From anyone else: a header is a spoofing attempt; none is served with the TCP peer.
    assert_eq!(
        send("127.0.0.2", &gw, &v1("203.0.113.7"), "/api/x").await,
        None
    );
    assert_eq!(send("127.0.0.2", &gw, b"", "/api/x").await, Some(200));
    assert_eq!(
        up.seen().last().unwrap().headers["x-forwarded-for"],
        "127.0.0.2"
    );
    assert_eq!(up.hits(), 1, "a refused connection reached the upstream");
    let m = gw.metrics().await;
    assert_eq!(errors(&m, "missing"), Some(1.0), "{m}");
    assert_eq!(errors(&m, "malformed"), Some(3.0), "{m}");
    assert_eq!(errors(&m, "timeout"), Some(1.0), "{m}");
    assert_eq!(errors(&m, "untrusted"), Some(1.0), "{m}");
}

/// The header comes before TLS: the handshake follows it on the same connection, and the
/// request inside TLS is counted by the header's address.
#[tokio::test(flavor = "multi_thread")]
async fn the_header_comes_before_tls() {
    use std::sync::Arc;
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let routes = route("api", "/api", &up.url(), "")
        + &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1h\"\nsubject = \"ip\"");
    // `[server.tls]` after `[server]`'s own keys (the listen address among them).
    let cfg = config("backend = \"memory\"", &routes)
        .replacen(
            "[server]\n",
            "[server]\nproxy_protocol = \"any\"\nproxy_protocol_from = [\"127.0.0.1/32\"]\n",
            1,
        )
        .replacen(
            "[admin]\n",
            &format!(
                "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[admin]\n",
                cert_path.display(),
                key_path.display()
            ),
            1,
        );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let get = |client: &'static str| {
        let connector = connector.clone();
        let addr = gw.proxy;
        async move {
            let mut tcp = connect("127.0.0.1", addr).await;
            tcp.write_all(&v1(client)).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut s = connector.connect(name, tcp).await.unwrap();
            s.write_all(b"GET /api/x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out)
                .get(9..12)
                .unwrap_or("")
                .to_owned()
        }
    };
    assert_eq!(get("203.0.113.7").await, "200");
    assert_eq!(get("203.0.113.7").await, "429");
    assert_eq!(get("203.0.113.8").await, "200");
    assert_eq!(up.seen()[1].headers["x-forwarded-for"], "203.0.113.8");
}

/// Issue #34 item 14: a v2 header for a UDP (datagram) connection, or with a TLV that runs past
/// the header, is malformed: the connection is closed unanswered and counted, never served as
/// the TCP client it names.
#[tokio::test(flavor = "multi_thread")]
async fn v2_for_udp_or_with_malformed_tlvs_is_refused_and_counted() {
    let up = upstream().await;
    let routes = route("api", "/api", &up.url(), "");
    let cfg = config("backend = \"memory\"", &routes).replacen(
        "[server]\n",
        "[server]\nproxy_protocol = \"v2\"\nproxy_protocol_from = [\"127.0.0.1/32\"]\n",
        1,
    );
    let gw = gateway(&cfg);
    wait_ready(&gw).await;
    let src: SocketAddr = "203.0.113.7:1".parse().unwrap();
    let dst: SocketAddr = "10.0.0.1:443".parse().unwrap();
    let udp = ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Proxy,
        ppp::v2::Protocol::Datagram,
        (src, dst),
    )
    .build()
    .unwrap();
    assert_eq!(send("127.0.0.1", &gw, &udp, "/api/x").await, None);
    // A TLV announcing 5 bytes that carries 1.
    let mut bad_tlv = v2("203.0.113.7:1");
    bad_tlv.extend_from_slice(&[0x04, 0x00, 0x05, b'a']);
    let len = u16::from_be_bytes([bad_tlv[14], bad_tlv[15]]) + 4;
    bad_tlv[14..16].copy_from_slice(&len.to_be_bytes());
    assert_eq!(send("127.0.0.1", &gw, &bad_tlv, "/api/x").await, None);
    assert_eq!(up.hits(), 0, "a refused header reached the upstream");
    let m = gw.metrics().await;
    assert_eq!(errors(&m, "malformed"), Some(2.0), "{m}");
    // A well-formed one is served.
    assert_eq!(
        send("127.0.0.1", &gw, &v2("203.0.113.7:1"), "/api/x").await,
        Some(200)
    );
}
