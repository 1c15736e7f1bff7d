//! hyper's HTTP/1 server over an in-memory connection: what it makes of a client's bytes (the
//! reference the fast front's parser and chunked decoder are compared with).
//!
//! The connection reads the input and then waits forever (no end of input: hyper's default
//! treats an end of input as the client leaving, which would cancel the request); it is polled
//! until it stops making progress, so what hyper does with the bytes is all done by then, with
//! no timer involved.

use std::convert::Infallible;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use hyper::body::Body as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The first request hyper served: method, target, fields (name, value; grouped by name as a
/// `HeaderMap` holds them), its body's exact length (`None`: chunked), and the body as read:
/// `Some(Ok)` to its end, `Some(Err)` when hyper failed it, `None` while it waits for more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub method: String,
    pub target: String,
    pub fields: Vec<(String, Vec<u8>)>,
    pub length: Option<u64>,
    pub body: Option<Result<Vec<u8>, ()>>,
}

/// The client's bytes, then nothing; what hyper writes is discarded.
struct MemIo {
    input: Vec<u8>,
    at: usize,
}

impl AsyncRead for MemIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let rest = &self.input[self.at..];
        if rest.is_empty() {
            return Poll::Pending;
        }
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MemIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for the reference server")
    })
}

/// Feeds `bytes` to hyper's server; the first request it served, if any.
pub fn serve(bytes: &[u8]) -> Option<Served> {
    runtime().block_on(async {
        let seen: Arc<Mutex<Option<Served>>> = Arc::default();
        let seen2 = seen.clone();
        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let seen = seen2.clone();
            async move {
                let (parts, mut body) = req.into_parts();
                let first = {
                    let mut slot = seen.lock().unwrap();
                    let first = slot.is_none();
                    if first {
                        *slot = Some(Served {
                            method: parts.method.to_string(),
                            target: parts.uri.to_string(),
                            fields: parts
                                .headers
                                .iter()
                                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                                .collect(),
                            length: body.size_hint().exact(),
                            body: None,
                        });
                    }
                    first
                };
                let mut data = Vec::new();
                let mut ok = true;
                while let Some(frame) =
                    std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                {
                    match frame {
                        Ok(f) => {
                            if let Some(d) = f.data_ref() {
                                data.extend_from_slice(d);
                            }
                        }
                        Err(_) => {
                            ok = false;
                            break;
                        }
                    }
                }
                if first {
                    if let Some(s) = seen.lock().unwrap().as_mut() {
                        s.body = Some(if ok { Ok(data) } else { Err(()) });
                    }
                }
                Ok::<_, Infallible>(hyper::Response::new(String::new()))
            }
        });
        let io = MemIo {
            input: bytes.to_vec(),
            at: 0,
        };
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .serve_connection(TokioIo::new(io), svc);
        let mut conn = std::pin::pin!(conn);
        // Polled until it ends or stops making progress (everything here is ready at once).
        for _ in 0..64 {
            let polled = std::future::poll_fn(|cx| Poll::Ready(conn.as_mut().poll(cx))).await;
            if polled.is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let served = seen.lock().unwrap().take();
        served
    })
}
