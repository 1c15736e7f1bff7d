//! hyper's HTTP/1 server over an in-memory connection: what it makes of a client's bytes (the
//! reference the fast front's parser and chunked decoder are compared with).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};

use hyper::body::Body as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt as _;

/// The first request hyper served: method, target, fields (name, value; grouped by name as a
/// `HeaderMap` holds them), its body's exact length (`None`: chunked), and the body read (or
/// `Err` when hyper failed to read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub method: String,
    pub target: String,
    pub fields: Vec<(String, Vec<u8>)>,
    pub length: Option<u64>,
    pub body: Result<Vec<u8>, ()>,
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

/// Feeds `bytes` (then the end of input) to hyper's server; the first request it served, if
/// any.
pub fn serve(bytes: &[u8]) -> Option<Served> {
    runtime().block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let _ = client.write_all(bytes).await;
        let _ = client.shutdown().await;
        let seen: Arc<Mutex<Option<Served>>> = Arc::default();
        let seen2 = seen.clone();
        let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let seen = seen2.clone();
            async move {
                let (parts, mut body) = req.into_parts();
                let length = body.size_hint().exact();
                let mut data = Vec::new();
                let mut ok = true;
                while let Some(frame) =
                    std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
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
                let mut slot = seen.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(Served {
                        method: parts.method.to_string(),
                        target: parts.uri.to_string(),
                        fields: parts
                            .headers
                            .iter()
                            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                            .collect(),
                        length,
                        body: if ok { Ok(data) } else { Err(()) },
                    });
                }
                Ok::<_, Infallible>(hyper::Response::new(String::new()))
            }
        });
        let conn =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), svc);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
        drop(client);
        seen.lock().unwrap().take()
    })
}
