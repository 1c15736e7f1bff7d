//! gRPC through the gateway: a real gRPC server (tonic's server plumbing over hyper's HTTP/2)
//! behind an `[[upstreams]]` group with `protocol = "h2c"` or `"h2"`, and a real gRPC client
//! (tonic's `Grpc` over a `Channel`). Messages are hand-written prost structs: no `protoc`.
//!
//! Also raw HTTP/2 exchanges (hyper's client and server) for what a gRPC library hides:
//! trailers in both directions, a request body cut short, a stream reset mid-body.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tonic::codegen::BoxFuture;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// The one message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(uint32, tag = "2")]
    count: u32,
}

/// `test.Echo/Unary`: echoes `text`, and says whether it saw a `traceparent`.
#[derive(Clone)]
struct Unary;

impl tonic::server::UnaryService<Msg> for Unary {
    type Response = Msg;
    type Future = BoxFuture<tonic::Response<Msg>, Status>;
    fn call(&mut self, req: tonic::Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let m = req.into_inner();
            Ok(tonic::Response::new(Msg {
                text: format!("echo: {}", m.text),
                count: m.count,
            }))
        })
    }
}

type MsgStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Msg, Status>> + Send>>;

/// `test.Echo/Stream`: `count` messages, then an OK status whose trailers carry `x-trailer`.
#[derive(Clone)]
struct Streaming;

impl tonic::server::ServerStreamingService<Msg> for Streaming {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<tonic::Response<MsgStream>, Status>;
    fn call(&mut self, req: tonic::Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let n = req.into_inner().count;
            let mut items: Vec<Result<Msg, Status>> = (0..n)
                .map(|i| {
                    Ok(Msg {
                        text: format!("item {i}"),
                        count: i,
                    })
                })
                .collect();
            // tonic writes a final status's metadata into the trailers.
            let mut md = tonic::metadata::MetadataMap::new();
            md.insert("x-trailer", "done".parse().unwrap());
            items.push(Err(Status::with_metadata(Code::Ok, "", md)));
            let s: MsgStream = Box::pin(futures_util::stream::iter(items));
            Ok(tonic::Response::new(s))
        })
    }
}

/// `test.Echo/BigTrailers`: no message, then an OK status whose trailers carry `x-big`, `count`
/// bytes long.
#[derive(Clone)]
struct BigTrailers;

impl tonic::server::ServerStreamingService<Msg> for BigTrailers {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<tonic::Response<MsgStream>, Status>;
    fn call(&mut self, req: tonic::Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let n = req.into_inner().count as usize;
            let mut md = tonic::metadata::MetadataMap::new();
            md.insert("x-big", "x".repeat(n).parse().unwrap());
            let items: Vec<Result<Msg, Status>> =
                vec![Err(Status::with_metadata(Code::Ok, "", md))];
            let s: MsgStream = Box::pin(futures_util::stream::iter(items));
            Ok(tonic::Response::new(s))
        })
    }
}

/// A gRPC server on 127.0.0.1:0 speaking h2c (or h2 over TLS with `tls`); counts calls.
struct GrpcServer {
    addr: SocketAddr,
    calls: Arc<AtomicUsize>,
    /// The headers of every request seen.
    seen: Arc<std::sync::Mutex<Vec<HeaderMap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn grpc_route(req: Request<Incoming>) -> Response<tonic::body::Body> {
    let codec = ProstCodec::<Msg, Msg>::default();
    let mut grpc = tonic::server::Grpc::new(codec);
    match req.uri().path() {
        "/test.Echo/Unary" => grpc.unary(Unary, req).await,
        "/test.Echo/Stream" => grpc.server_streaming(Streaming, req).await,
        "/test.Echo/BigTrailers" => grpc.server_streaming(BigTrailers, req).await,
        _ => Status::unimplemented("no such method").into_http(),
    }
}

async fn grpc_server(tls: Option<Arc<rustls::ServerConfig>>) -> GrpcServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, s) = (calls.clone(), seen.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (c, s, tls) = (c.clone(), s.clone(), tls.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    c.fetch_add(1, Ordering::SeqCst);
                    s.lock().unwrap().push(req.headers().clone());
                    async move { Ok::<_, Infallible>(grpc_route(req).await) }
                });
                let b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                match tls {
                    None => {
                        let _ = b.serve_connection(TokioIo::new(stream), svc).await;
                    }
                    Some(cfg) => {
                        let Ok(tls) = tokio_rustls::TlsAcceptor::from(cfg).accept(stream).await
                        else {
                            return;
                        };
                        let _ = b.serve_connection(TokioIo::new(tls), svc).await;
                    }
                }
            });
        }
    });
    GrpcServer {
        addr,
        calls,
        seen,
        task,
    }
}

/// A gateway with one h2c group `grpc` in front of `server`, route `/test.Echo/` with `extra`.
fn grpc_gateway(server: SocketAddr, extra: &str) -> Gateway {
    grpc_gateway_on("backend = \"memory\"", server, extra)
}

/// The same with `store` as the `[store]` body.
fn grpc_gateway_on(store: &str, server: SocketAddr, extra: &str) -> Gateway {
    let upstream = format!(
        "[[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\nservers = [\"http://{server}\"]\n\n"
    );
    gateway(&config(
        store,
        &format!("{upstream}{}", route("grpc", "/test.Echo/", "grpc", extra)),
    ))
}

async fn grpc_client(gw: &Gateway) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gw.proxy))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

async fn unary(
    c: &mut tonic::client::Grpc<tonic::transport::Channel>,
    text: &str,
) -> Result<tonic::Response<Msg>, Status> {
    c.ready().await.unwrap();
    c.unary(
        tonic::Request::new(Msg {
            text: text.into(),
            count: 7,
        }),
        http::uri::PathAndQuery::from_static("/test.Echo/Unary"),
        ProstCodec::<Msg, Msg>::default(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unary_call_passes_through_an_h2c_group() {
    let server = grpc_server(None).await;
    let gw = grpc_gateway(server.addr, "");
    let mut c = grpc_client(&gw).await;
    let res = unary(&mut c, "hello").await.expect("the call passes");
    assert_eq!(res.get_ref().text, "echo: hello");
    assert_eq!(res.get_ref().count, 7);
    assert!(
        res.metadata().get("x-request-id").is_some(),
        "the gateway's own headers reach a gRPC client"
    );
    assert_eq!(server.calls.load(Ordering::SeqCst), 1);
    let seen = server.seen.lock().unwrap()[0].clone();
    assert_eq!(seen["content-type"], "application/grpc");
    assert_eq!(
        seen["te"], "trailers",
        "TE: trailers is kept for an HTTP/2 upstream"
    );
    assert!(seen.contains_key("x-forwarded-for"));
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"grpc\",status=\"200\"}"),
        Some(1.0)
    );
}

// The refusal comes from the store's decision: on every store.
on_every_store!(a_limited_call_gets_resource_exhausted_with_the_rate_limit_headers);

async fn a_limited_call_gets_resource_exhausted_with_the_rate_limit_headers(kind: Kind) {
    let env = store_env(kind);
    let server = grpc_server(None).await;
    let gw = grpc_gateway_on(
        &env.store,
        server.addr,
        &limit("name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nperiod = \"1m\"\nsubject = \"ip\""),
    );
    wait_ready(&gw).await;
    let mut c = grpc_client(&gw).await;
    for i in 0..2 {
        unary(&mut c, &format!("call {i}"))
            .await
            .expect("within the limit");
    }
    let status = unary(&mut c, "one too many").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("rate limit \"per-ip\" of route \"grpc\" exceeded"),
        "{:?}",
        status.message()
    );
    let md = status.metadata();
    assert!(md.get("retry-after").is_some(), "{md:?}");
    assert!(
        md.get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("per-ip")),
        "{md:?}"
    );
    assert!(md.get("ratelimit-policy").is_some(), "{md:?}");
    assert_eq!(
        server.calls.load(Ordering::SeqCst),
        2,
        "refused calls never reach the server"
    );
    // Counted as what it means (a 429), though sent as HTTP 200.
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"grpc\",status=\"429\"}"),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn other_refusals_get_their_grpc_status() {
    let server = grpc_server(None).await;
    // A limit on a header the client does not send, with on_missing = "reject": 401.
    let gw = grpc_gateway(
        server.addr,
        &limit("name = \"per-key\"\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"1m\"\nsubject = \"header:x-api-key\"\non_missing = \"reject\""),
    );
    let mut c = grpc_client(&gw).await;
    let status = unary(&mut c, "no key").await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // No route: 404 → UNIMPLEMENTED.
    c.ready().await.unwrap();
    let status = c
        .unary(
            tonic::Request::new(Msg::default()),
            http::uri::PathAndQuery::from_static("/other.Service/Call"),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert_eq!(server.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_calls_messages_and_trailers_arrive() {
    let server = grpc_server(None).await;
    let gw = grpc_gateway(server.addr, "");
    let mut c = grpc_client(&gw).await;
    c.ready().await.unwrap();
    let res = c
        .server_streaming(
            tonic::Request::new(Msg {
                text: String::new(),
                count: 3,
            }),
            http::uri::PathAndQuery::from_static("/test.Echo/Stream"),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .expect("the call starts");
    let mut stream = res.into_inner();
    let mut got = Vec::new();
    while let Some(m) = stream.message().await.expect("no error status") {
        got.push(m.text);
    }
    assert_eq!(got, ["item 0", "item 1", "item 2"]);
    let trailers = stream.trailers().await.unwrap().expect("trailers arrive");
    assert_eq!(trailers.get("x-trailer").unwrap(), "done");
}

/// A raw HTTP/2 connection to the gateway (prior knowledge), as hyper's client.
async fn h2_to(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<
    http_body_util::combinators::BoxBody<Bytes, std::io::Error>,
> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// A gRPC frame: the compression flag, the length, the message.
fn grpc_frame(m: &Msg) -> Bytes {
    let body = prost::Message::encode_to_vec(m);
    let mut b = BytesMut::new();
    b.put_u8(0);
    b.put_u32(u32::try_from(body.len()).unwrap());
    b.put_slice(&body);
    b.freeze()
}

fn grpc_request(
    addr: SocketAddr,
    frames: Vec<Result<Frame<Bytes>, std::io::Error>>,
) -> Request<http_body_util::combinators::BoxBody<Bytes, std::io::Error>> {
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/test.Echo/Unary"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap()
}

/// The gRPC status of a response: from its head (trailers-only) or its trailers.
async fn grpc_status_of(res: Response<Incoming>) -> (String, String) {
    let (parts, body) = res.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the response ends")
        .expect("the response body is read");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let pick = |name: &str| {
        parts
            .headers
            .get(name)
            .or_else(|| trailers.get(name))
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    (pick("grpc-status"), pick("grpc-message"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grpc_request_whose_body_is_cut_gets_a_clear_status() {
    let server = grpc_server(None).await;
    let gw = grpc_gateway(server.addr, "");
    let mut send = h2_to(gw.proxy).await;

    // 1. The message's length prefix promises more than the stream carries, then the stream
    //    ends: the server says so with a status, passed through as is.
    let whole = grpc_frame(&Msg {
        text: "x".repeat(100),
        count: 1,
    });
    let cut = whole.slice(..20);
    let req = grpc_request(gw.proxy, vec![Ok(Frame::data(cut))]);
    let res = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("an answer, not a hang")
        .expect("a response");
    assert_eq!(res.status(), 200);
    let (status, message) = grpc_status_of(res).await;
    assert!(
        !status.is_empty() && status != "0",
        "a cut message is an error status, got {status:?} {message:?}"
    );

    // 2. The client resets the stream mid-body: the upstream call is abandoned (hyper drops a
    //    reset stream's request, so no status is sent or counted) and the gateway goes on.
    let frames = vec![
        Ok(Frame::data(whole.slice(..10))),
        Err(std::io::Error::other("client gives up")),
    ];
    let req = grpc_request(gw.proxy, frames);
    let r = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("no hang");
    if let Ok(res) = r {
        // If the head came first, the stream still ends (with an error or a status).
        let _ = tokio::time::timeout(Duration::from_secs(10), res.into_body().collect())
            .await
            .expect("the body ends");
    }
    let mut c = grpc_client(&gw).await;
    let ok = unary(&mut c, "after")
        .await
        .expect("the gateway still serves");
    assert_eq!(ok.get_ref().text, "echo: after");
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_requests_total{route=\"grpc\",status=\"200\"}"),
        Some(2.0),
        "the cut call's status and the call after: {m}"
    );
    assert!(!gw.logs().contains("panicked"), "{}", gw.logs());
}

/// A raw HTTP/2 upstream: reads the request to its end (trailers included), answers a body
/// with two data frames and trailers echoing what it got: `x-got-trailer` and the body length.
async fn trailer_server(
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let collected = req.into_body().collect().await;
                    let (len, got) = match collected {
                        Ok(c) => {
                            let got = c
                                .trailers()
                                .and_then(|t| t.get("x-client-trailer"))
                                .cloned()
                                .unwrap_or(HeaderValue::from_static("none"));
                            (c.to_bytes().len(), got)
                        }
                        Err(_) => (0, HeaderValue::from_static("error")),
                    };
                    let mut trailers = HeaderMap::new();
                    trailers.insert("x-got-trailer", got);
                    trailers.insert("x-body-len", HeaderValue::from(len));
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                        Ok(Frame::data(Bytes::from_static(b"part 1;"))),
                        Ok(Frame::data(Bytes::from_static(b"part 2"))),
                        Ok(Frame::trailers(trailers)),
                    ];
                    Ok::<_, Infallible>(Response::new(StreamBody::new(futures_util::stream::iter(
                        frames,
                    ))))
                });
                let b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                match tls {
                    None => {
                        let _ = b.serve_connection(TokioIo::new(stream), svc).await;
                    }
                    Some(cfg) => {
                        let Ok(tls) = tokio_rustls::TlsAcceptor::from(cfg).accept(stream).await
                        else {
                            return;
                        };
                        let _ = b.serve_connection(TokioIo::new(tls), svc).await;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// Sends a body with trailers through the gateway and checks the trailers of both ways.
async fn trailers_round_trip(gw: &Gateway) {
    let mut send = h2_to(gw.proxy).await;
    let mut t = HeaderMap::new();
    t.insert("x-client-trailer", HeaderValue::from_static("from-client"));
    let frames = vec![
        Ok(Frame::data(Bytes::from_static(b"hello"))),
        Ok(Frame::trailers(t)),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{}/t/x", gw.proxy))
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("no hang")
        .expect("a response");
    assert_eq!(res.status(), 200, "{}", gw.logs());
    let collected = res.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("response trailers arrive");
    assert_eq!(collected.to_bytes(), "part 1;part 2");
    assert_eq!(
        trailers["x-got-trailer"], "from-client",
        "request trailers arrive"
    );
    assert_eq!(trailers["x-body-len"], "5");
}

#[tokio::test(flavor = "multi_thread")]
async fn trailers_pass_both_ways_with_an_h2c_group() {
    let (addr, task) = trailer_server(None).await;
    let gw = gateway(&config(
        "backend = \"memory\"",
        &format!(
            "[[upstreams]]\nname = \"t\"\nprotocol = \"h2c\"\nservers = [\"http://{addr}\"]\n\n{}",
            route("t", "/t/", "t", "")
        ),
    ));
    trailers_round_trip(&gw).await;
    task.abort();
}

/// A self-signed certificate for 127.0.0.1, and a server config offering `alpn`.
fn tls_server(alpn: &[&[u8]]) -> (Arc<rustls::ServerConfig>, tempfile::NamedTempFile) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let pem = cert.cert.pem();
    let der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![der], key)
    .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let mut ca = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut ca, pem.as_bytes()).unwrap();
    (Arc::new(cfg), ca)
}

fn h2_tls_gateway(addr: SocketAddr, ca: &std::path::Path) -> Gateway {
    gateway(&config(
        "backend = \"memory\"",
        &format!(
            "[[upstreams]]\nname = \"t\"\nprotocol = \"h2\"\nservers = [\"https://{addr}\"]\n\n[upstreams.tls]\nca = \"{}\"\n\n{}",
            ca.display(),
            route("t", "/t/", "t", "")
        ),
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn h2_over_tls_is_agreed_by_alpn_and_carries_trailers() {
    let (cfg, ca) = tls_server(&[b"h2"]);
    let (addr, task) = trailer_server(Some(cfg)).await;
    let gw = h2_tls_gateway(addr, ca.path());
    trailers_round_trip(&gw).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_h2_group_whose_server_does_not_agree_to_h2_fails_as_a_tls_error() {
    // The server offers only http/1.1 by ALPN.
    let (cfg, ca) = tls_server(&[b"http/1.1"]);
    let (addr, task) = trailer_server(Some(cfg)).await;
    let gw = h2_tls_gateway(addr, ca.path());
    let res = client().get(gw.url("/t/x")).send().await.unwrap();
    assert_eq!(res.status(), 502);
    let body = res.text().await.unwrap();
    assert!(body.contains("did not agree to HTTP/2"), "{body}");
    let m = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &m,
            "tollgate_upstream_errors_total",
            &["route=\"t\"", "kind=\"tls\""]
        ),
        1.0,
        "{m}"
    );
    task.abort();
}

#[test]
fn check_refuses_a_protocol_that_does_not_fit_the_scheme() {
    let dir = tempfile::tempdir().unwrap();
    for (scheme, protocol, hint) in [
        ("http", "h2", "needs https://"),
        ("https", "h2c", "needs http://"),
    ] {
        let path = dir.path().join("gateway.toml");
        std::fs::write(
            &path,
            format!("[[upstreams]]\nname = \"g\"\nprotocol = \"{protocol}\"\nservers = [\"{scheme}://127.0.0.1:1\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"g\"\n"),
        )
        .unwrap();
        let out = std::process::Command::new(tollgate_bin())
            .arg("--config")
            .arg(&path)
            .arg("check")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("upstreams[0].protocol") && err.contains(hint),
            "{err}"
        );
    }
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        "[[upstreams]]\nname = \"g\"\nprotocol = \"h3\"\nservers = [\"http://127.0.0.1:1\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new(tollgate_bin())
        .arg("--config")
        .arg(&path)
        .arg("check")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("line 3") && err.contains("h2c"), "{err}");
}

/// #34 item 4: an upstream's trailers pass up to the documented bound (64 KiB, counted as HTTP/2
/// counts a header list), larger ones than hyper's 16 KiB default included; beyond it the call
/// ends with `grpc-status` 13 (INTERNAL) and is counted in
/// `tollgate_upstream_trailers_too_large_total` — never an OK without the server's trailers.
#[tokio::test(flavor = "multi_thread")]
async fn large_trailers_pass_up_to_the_bound_and_fail_the_call_beyond_it() {
    let server = grpc_server(None).await;
    let gw = grpc_gateway(server.addr, "");
    // The client takes large header lists itself (tonic's default is hyper's 16 KiB).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gw.proxy))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .http2_max_header_list_size(4 << 20)
        .connect()
        .await
        .unwrap();
    let mut c = tonic::client::Grpc::new(channel);
    let call = |c: &mut tonic::client::Grpc<tonic::transport::Channel>, n: u32| {
        let mut c = c.clone();
        async move {
            c.ready().await.unwrap();
            let res = c
                .server_streaming(
                    tonic::Request::new(Msg {
                        text: String::new(),
                        count: n,
                    }),
                    http::uri::PathAndQuery::from_static("/test.Echo/BigTrailers"),
                    ProstCodec::<Msg, Msg>::default(),
                )
                .await
                .expect("the call starts");
            let mut stream = res.into_inner();
            match stream.message().await {
                Ok(None) => Ok(stream.trailers().await.unwrap().expect("trailers arrive")),
                Ok(Some(m)) => panic!("no message was sent: {m:?}"),
                Err(status) => Err(status),
            }
        }
    };
    // 40 KB of trailers: over hyper's default, within the bound: passed whole.
    let trailers = call(&mut c, 40_000).await.expect("an OK status");
    assert_eq!(
        trailers.get("x-big").map(|v| v.as_encoded_bytes().len()),
        Some(40_000),
        "the trailers arrive whole"
    );
    // 100 KB: over the bound: the call fails, and it is counted.
    let status = call(&mut c, 100_000).await.expect_err("not an OK");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(status.message().contains("trailers"), "{status:?}");
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_upstream_trailers_too_large_total{route=\"grpc\"}"
        ),
        Some(1.0),
        "{m}"
    );
}
