//! bench/h3load.rs — a closed-loop HTTP/3 load client for the HTTP/3 rows of BENCHMARKS.md
//! (Debian's h2load has no HTTP/3). It is built on the same QUIC stack as the gateway (quinn,
//! h3), which the issue allows for a load client; the tests' client is aioquic.
//!
//!   cargo run --release --example h3load -- URL CONNECTIONS STREAMS SECONDS [CA.pem]
//!
//! CONNECTIONS QUIC connections to URL (`https://127.0.0.1:PORT/PATH`, the certificate's name
//! taken as `localhost`), each with STREAMS requests in flight at once (a GET each, its body read
//! to the end, the next sent as one ends), for SECONDS. Without CA.pem the server's certificate
//! is not checked (a benchmark on loopback). Prints one line:
//!   H3LOAD requests=N seconds=S rps=R non2xx=N errors=N

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf as _;
use rustls::pki_types::pem::PemObject as _;

#[derive(Debug)]
struct AnyCert;

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn client_config(ca: Option<&str>) -> Result<quinn::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let mut tls = match ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| format!("{path}: {e}"))?;
                roots.add(cert).map_err(|e| e.to_string())?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert))
            .with_no_client_auth(),
    };
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    non2xx: AtomicU64,
    errors: AtomicU64,
}

async fn one_connection(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    uri: http::Uri,
    streams: usize,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) -> Result<(), String> {
    let conn = endpoint
        .connect(addr, "localhost")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .map_err(|e| e.to_string())?;
    let drive = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let (mut send, uri, stop, counts) =
            (send.clone(), uri.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = http::Request::get(uri.clone()).body(()).unwrap_or_default();
                let done: Result<u16, h3::error::StreamError> = async {
                    let mut s = send.send_request(req).await?;
                    s.finish().await?;
                    let res = s.recv_response().await?;
                    while let Some(mut chunk) = s.recv_data().await? {
                        chunk.advance(chunk.remaining());
                    }
                    Ok(res.status().as_u16())
                }
                .await;
                match done {
                    Ok(status) => {
                        counts.requests.fetch_add(1, Ordering::Relaxed);
                        if !(200..300).contains(&status) {
                            counts.non2xx.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    drive.abort();
    Ok(())
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err("usage: h3load URL CONNECTIONS STREAMS SECONDS [CA.pem]".to_owned());
    }
    let uri: http::Uri = args[0].parse().map_err(|e| format!("URL: {e}"))?;
    let connections: usize = args[1].parse().map_err(|e| format!("CONNECTIONS: {e}"))?;
    let streams: usize = args[2].parse().map_err(|e| format!("STREAMS: {e}"))?;
    let seconds: u64 = args[3].parse().map_err(|e| format!("SECONDS: {e}"))?;
    let addr: SocketAddr = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or("URL: no host and port")?
        .parse()
        .map_err(|e| format!("URL: {e} (an IP address and a port)"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().map_err(|_| "bind")?)
            .map_err(|e| e.to_string())?;
        endpoint.set_default_client_config(client_config(args.get(4).map(String::as_str))?);
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let started = Instant::now();
        let mut conns = Vec::new();
        for _ in 0..connections {
            conns.push(tokio::spawn(one_connection(
                endpoint.clone(),
                addr,
                uri.clone(),
                streams,
                stop.clone(),
                counts.clone(),
            )));
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let took = started.elapsed().as_secs_f64();
        for c in conns {
            if let Ok(Err(e)) = c.await {
                eprintln!("h3load: a connection failed: {e}");
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        let requests = counts.requests.load(Ordering::Relaxed);
        println!(
            "H3LOAD requests={requests} seconds={took:.2} rps={:.0} non2xx={} errors={}",
            requests as f64 / took,
            counts.non2xx.load(Ordering::Relaxed),
            counts.errors.load(Ordering::Relaxed)
        );
        endpoint.wait_idle().await;
        Ok(())
    })
}
