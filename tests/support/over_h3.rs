//! The front-sensitive tests over HTTP/3 (`TOLLGATE_TEST_CLIENT=h3`, issue #53): each gateway
//! the harness starts gets `[server.tls]` with a test certificate and `[server.http3] enabled`,
//! and an adapter of its own that accepts plain HTTP/1.1 (and h2c) on `127.0.0.1:0` and sends
//! every request it gets over HTTP/3 to the gateway's QUIC listener (quinn + h3, trusting the
//! test certificate), so that `gw.url(path)` and the tests' own HTTP clients are unchanged.
//!
//! What the adapter keeps of a request: method, target, fields (less the HTTP/1 connection's
//! own: `Connection` and the fields it names, `Keep-Alive`, `Transfer-Encoding`, `Upgrade`,
//! `Expect`, a `TE` other than `trailers`; `Host` becomes `:authority`), the body streamed as it
//! comes and its trailers. Of a response: status, fields, the body streamed and its trailers.
//! The client's address: each HTTP/1 connection gets a QUIC connection of its own, from a UDP
//! socket on the address the HTTP/1 connection came from (a test binding 127.0.0.2 is seen by
//! the gateway as 127.0.0.2). What the adapter cannot say as HTTP/1 it says by failing: a
//! stream reset before the response head closes the client's connection without an answer (the
//! adapter never answers a status of its own), a reset after it cuts the body short.
//!
//! Tests that cannot apply over HTTP/3 (raw bytes to the TCP listener, HTTP/1's own behaviour)
//! skip themselves with [`skip_on_h3`], which prints why.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use http_body_util::BodyExt as _;
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::{mpsc, oneshot};

/// An error as the adapter passes it on (its text).
#[derive(Debug)]
struct AdapterError(String);

impl std::fmt::Display for AdapterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AdapterError {}

fn err(e: impl std::fmt::Display) -> AdapterError {
    AdapterError(e.to_string())
}

/// Whether the tests' requests go over HTTP/3 (`TOLLGATE_TEST_CLIENT=h3`).
pub fn enabled() -> bool {
    std::env::var("TOLLGATE_TEST_CLIENT").is_ok_and(|v| v == "h3")
}

/// In HTTP/3 mode, prints that the test is skipped and why, and returns `true` (the test then
/// returns); otherwise `false`.
pub fn skip_on_h3(reason: &str) -> bool {
    if enabled() {
        println!("skipped over HTTP/3 (TOLLGATE_TEST_CLIENT=h3): {reason}");
        eprintln!("skipped over HTTP/3 (TOLLGATE_TEST_CLIENT=h3): {reason}");
        true
    } else {
        false
    }
}

/// The test certificate (for `localhost` and `127.0.0.1`), made once per test process:
/// (certificate PEM, key PEM, certificate DER).
fn test_cert() -> &'static (String, String, Vec<u8>) {
    static CERT: OnceLock<(String, String, Vec<u8>)> = OnceLock::new();
    CERT.get_or_init(|| {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("a test certificate");
        (
            ck.cert.pem(),
            ck.signing_key.serialize_pem(),
            ck.cert.der().to_vec(),
        )
    })
}

/// `config` made to serve HTTP/3 (its certificate written into `dir`), or `None` when it is
/// not to be changed: not in HTTP/3 mode, or the config has a TLS listener or an HTTP/3 one of
/// its own (such a test talks TLS to the gateway itself).
pub fn adapt(config: &str, dir: &Path) -> Option<String> {
    if !enabled() || config.contains("[server.tls]") || config.contains("[server.http3]") {
        return None;
    }
    let (cert_pem, key_pem, _) = test_cert();
    let cert = dir.join("h3-test-cert.pem");
    let key = dir.join("h3-test-key.pem");
    std::fs::write(&cert, cert_pem).expect("write the test certificate");
    std::fs::write(&key, key_pem).expect("write the test key");
    Some(format!(
        "{config}\n\n[server.tls]\ncert = {:?}\nkey = {:?}\n\n[server.http3]\nenabled = true\n",
        cert.display().to_string(),
        key.display().to_string()
    ))
}

/// A gateway's adapter: HTTP/1.1 (and h2c) in, HTTP/3 out. Stopped when dropped.
pub struct Adapter {
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Adapter {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Starts an adapter to the gateway's QUIC listener at `quic` (on its own runtime, so that it
/// serves whatever the test's runtime is doing).
pub fn start(quic: SocketAddr) -> Adapter {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("h3-adapter")
        .enable_all()
        .build()
        .expect("the adapter's runtime");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the adapter");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("the adapter's address");
    let client = client_config(&test_cert().2);
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("the adapter listener");
        let endpoints: Arc<Mutex<HashMap<IpAddr, quinn::Endpoint>>> = Arc::default();
        let handshakes = Arc::new(tokio::sync::Semaphore::new(8));
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                continue;
            };
            let endpoint = {
                let mut map = endpoints.lock().unwrap();
                match map.get(&peer.ip()) {
                    Some(e) => e.clone(),
                    None => {
                        let mut e = match quinn::Endpoint::client(SocketAddr::new(peer.ip(), 0)) {
                            Ok(e) => e,
                            Err(e) => {
                                eprintln!("h3 adapter: cannot bind UDP on {}: {e}", peer.ip());
                                continue;
                            }
                        };
                        e.set_default_client_config(client.clone());
                        map.insert(peer.ip(), e.clone());
                        e
                    }
                }
            };
            tokio::spawn(serve_connection(
                tcp,
                endpoint,
                quic,
                addr,
                handshakes.clone(),
            ));
        }
    });
    Adapter {
        addr,
        runtime: Some(runtime),
    }
}

fn client_config(ca_der: &[u8]) -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca_der.to_vec()))
        .expect("the test certificate as a root");
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    // A test may leave a connection unused for longer than the idle timeout; a gateway that
    // was killed is noticed within seconds (a request waiting on it then fails).
    transport
        .keep_alive_interval(Some(std::time::Duration::from_secs(2)))
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(std::time::Duration::from_secs(10)).expect("10 s"),
        ));
    config.transport_config(Arc::new(transport));
    config
}

/// The HTTP/3 connection of one HTTP/1 connection, opened at its first request (and again if
/// the gateway closed it: a drain, an idle timeout).
struct H3Conn {
    /// Handshakes at once (the adapter's, to one gateway): a test opening hundreds of
    /// connections at once has them queue here rather than time out on the gateway's one
    /// QUIC thread (a debug build).
    handshakes: Arc<tokio::sync::Semaphore>,
    endpoint: quinn::Endpoint,
    quic: SocketAddr,
    open: tokio::sync::Mutex<Option<Open>>,
}

struct Open {
    conn: quinn::Connection,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl H3Conn {
    async fn sender(
        &self,
    ) -> Result<h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>, AdapterError> {
        let mut open = self.open.lock().await;
        if let Some(o) = open.as_ref() {
            if o.conn.close_reason().is_none() && !o.driver.is_finished() {
                return Ok(o.send.clone());
            }
        }
        let _turn = self.handshakes.acquire().await.map_err(err)?;
        let conn = self
            .endpoint
            .connect(self.quic, "localhost")
            .map_err(err)?
            .await
            .map_err(err)?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
            .await
            .map_err(err)?;
        let driver = tokio::spawn(async move {
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        let send2 = send.clone();
        *open = Some(Open { conn, send, driver });
        Ok(send2)
    }

    fn close(&self) {
        if let Ok(mut open) = self.open.try_lock() {
            if let Some(o) = open.take() {
                o.conn.close(quinn::VarInt::from_u32(0), b"");
                o.driver.abort();
            }
        }
    }
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    endpoint: quinn::Endpoint,
    quic: SocketAddr,
    me: SocketAddr,
    handshakes: Arc<tokio::sync::Semaphore>,
) {
    let _ = tcp.set_nodelay(true);
    let h3 = Arc::new(H3Conn {
        handshakes,
        endpoint,
        quic,
        open: tokio::sync::Mutex::new(None),
    });
    let h3_in = h3.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let h3 = h3_in.clone();
        async move { forward(req, h3, me).await }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tcp), svc)
        .await;
    h3.close();
}

/// The HTTP/1 connection's own fields, not sent on (RFC 9114 §4.2).
fn connection_fields(headers: &mut http::HeaderMap) {
    let named: Vec<http::HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| http::HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "expect",
    ] {
        headers.remove(n);
    }
    let te_trailers = headers
        .get_all(http::header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    headers.remove(http::header::TE);
    if te_trailers {
        headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    }
}

/// A response body fed by the task reading the HTTP/3 stream.
struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, AdapterError>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = AdapterError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, AdapterError>>> {
        self.0.poll_recv(cx)
    }
}

type SendHalf = h3::client::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvHalf = h3::client::RequestStream<h3_quinn::RecvStream, Bytes>;

/// The request stream's sending half, reset when dropped before [`Sending::done`] (the HTTP/1
/// client's body broke, or the exchange ended before it was sent): the gateway sees the HTTP/3
/// client give up, not a request that ended.
struct Sending(Option<SendHalf>);

impl Sending {
    fn get(&mut self) -> &mut SendHalf {
        self.0.as_mut().expect("the sending half")
    }
    fn done(&mut self) {
        self.0 = None;
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some(s) = self.0.as_mut() {
            s.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
        }
    }
}

/// The receiving half. Dropped before the response ended (the HTTP/1 client went away), it
/// tells the gateway to stop sending (quinn's `RecvStream` does, when dropped unread; h3-quinn's
/// `stop_sending` cannot be called while a read is in flight: it panics).
struct Receiving(RecvHalf);

impl Receiving {
    fn get(&mut self) -> &mut RecvHalf {
        &mut self.0
    }
}

/// `req` sent over HTTP/3 on `h3`; `me` is the adapter's own address: a `Host` naming it is
/// sent as the gateway's address (the one the test means, e.g. in `X-Forwarded-Host`).
async fn forward(
    req: hyper::Request<Incoming>,
    h3: Arc<H3Conn>,
    me: SocketAddr,
) -> Result<hyper::Response<ChannelBody>, AdapterError> {
    let (mut parts, body) = req.into_parts();
    let gateway = h3.quic.to_string();
    let authority = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok())
        .or_else(|| parts.uri.authority().cloned())
        .map(|a| match a.as_str() == me.to_string() {
            true => gateway.parse().unwrap_or(a),
            false => a,
        })
        .unwrap_or_else(|| http::uri::Authority::from_static("localhost"));
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let uri = http::Uri::builder()
        .scheme("https")
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(err)?;
    connection_fields(&mut parts.headers);
    parts.headers.remove(http::header::HOST);
    let mut head = http::Request::new(());
    *head.method_mut() = parts.method;
    *head.uri_mut() = uri;
    *head.headers_mut() = parts.headers;
    let mut sender = match h3.sender().await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("h3 adapter: cannot connect to the gateway's QUIC listener: {e}");
            return Err(e);
        }
    };
    let stream = sender.send_request(head).await.map_err(|e| {
        eprintln!("h3 adapter: the request was not sent: {e}");
        err(e)
    })?;
    let (head_tx, head_rx) = oneshot::channel();
    tokio::spawn(exchange(stream, body, head_tx));
    match head_rx.await {
        Ok(Ok(res)) => Ok(res),
        Ok(Err(e)) => {
            eprintln!("h3 adapter: no response head: {e}");
            Err(e)
        }
        Err(_) => Err(err("the exchange ended without a response")),
    }
}

/// One request stream: the request body sent as it comes, the response head handed back on
/// `head_tx`, then the response body streamed into its channel.
async fn exchange(
    stream: h3::client::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    mut body: Incoming,
    mut head_tx: oneshot::Sender<Result<hyper::Response<ChannelBody>, AdapterError>>,
) {
    let (send, recv) = stream.split();
    let (mut send, mut recv) = (Sending(Some(send)), Receiving(recv));
    // No body: the stream ends at once, right behind the head (as a browser's GET).
    let empty = hyper::body::Body::is_end_stream(&body);
    if empty && send.get().finish().await.is_ok() {
        send.done();
    }
    // The request body, beside the response (an answer may come before the body ends).
    let sending = async move {
        if empty {
            return;
        }
        loop {
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if !data.is_empty() && send.get().send_data(data).await.is_err() {
                            return;
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            if send.get().send_trailers(t).await.is_err() {
                                return;
                            }
                        }
                        break;
                    }
                },
                // The client's body broke: the stream is reset (`send` dropped).
                Some(Err(_)) => return,
                None => break,
            }
        }
        if send.get().finish().await.is_ok() {
            send.done();
        }
    };
    let receiving = async move {
        let head = loop {
            let got = tokio::select! {
                r = recv.get().recv_response() => r,
                _ = head_tx.closed() => return,
            };
            match got {
                Ok(h) if h.status().is_informational() => continue,
                Ok(h) => break h,
                Err(e) => {
                    let _ = head_tx.send(Err(err(e)));
                    return;
                }
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let (parts, ()) = head.into_parts();
        let mut res = hyper::Response::new(ChannelBody(rx));
        *res.status_mut() = parts.status;
        *res.headers_mut() = parts.headers;
        if head_tx.send(Ok(res)).is_err() {
            return;
        }
        loop {
            let frame = tokio::select! {
                d = recv.get().recv_data() => match d {
                    Ok(Some(mut chunk)) => Ok(Frame::data(chunk.copy_to_bytes(chunk.remaining()))),
                    Ok(None) => break,
                    Err(e) => Err(err(e)),
                },
                _ = tx.closed() => return,
            };
            let failed = frame.is_err();
            if tx.send(frame).await.is_err() || failed {
                return;
            }
        }
        let trailers = tokio::select! {
            t = recv.get().recv_trailers() => t,
            _ = tx.closed() => return,
        };
        match trailers {
            Ok(Some(t)) => {
                let _ = tx.send(Ok(Frame::trailers(t))).await;
            }
            Ok(None) => {}
            Err(e) => {
                let _ = tx.send(Err(err(e))).await;
            }
        }
    };
    let mut sending = std::pin::pin!(sending);
    let mut receiving = std::pin::pin!(receiving);
    tokio::select! {
        // The response ended (or the client went away): a request body still being sent is
        // not wanted any more.
        () = &mut receiving => {}
        () = &mut sending => receiving.await,
    }
}

/// The scheme the gateway sees a test's request come in with: `https` over HTTP/3 (QUIC is
/// TLS), `http` otherwise (what it writes in `X-Forwarded-Proto`, say).
pub fn scheme() -> &'static str {
    if enabled() {
        "https"
    } else {
        "http"
    }
}
