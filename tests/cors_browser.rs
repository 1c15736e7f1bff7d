//! CORS in a real browser (issue 27): headless Chromium loads a page from one origin (a tiny
//! server of the test) whose script `fetch`es the API through the gateway on another origin
//! (another port) until it is limited, and reads the 429's `Retry-After` and `RateLimit` from
//! JavaScript. The request carries a custom header, so the browser sends a preflight first: the
//! gateway's answer to it is tested by the browser too. The page posts what it read back to its
//! own server; the test waits for that (never for a timer in the page).
//!
//! Needs Debian's `chromium` (`scripts/test` installs it). Without it the test fails, saying so.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;

on_every_store!(a_browser_reads_the_429s_retry_after_and_ratelimit);

/// The Chromium binary: `$CHROMIUM`, else `chromium` or `chromium-browser` on `PATH`.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "chromium is not installed: this test runs CORS in a real browser. Run `scripts/test`, \
         which installs it (or `apt-get install -y chromium`), or point $CHROMIUM at a binary."
    );
}

/// The page: fetches `api` with a custom header (so a preflight first) until a 429 or 10
/// requests, then posts what JavaScript could read to `/result` on its own origin.
fn page_html(api: &str) -> String {
    format!(
        r#"<!doctype html><html><body><pre id="out">running</pre><script>
(async () => {{
  const statuses = [];
  let ok = null, limited = null;
  for (let i = 0; i < 10; i++) {{
    const r = await fetch("{api}", {{ headers: {{ "X-Api-Key": "k" }} }});
    statuses.push(r.status);
    const seen = {{
      status: r.status,
      retryAfter: r.headers.get("Retry-After"),
      rateLimit: r.headers.get("RateLimit"),
      rateLimitPolicy: r.headers.get("RateLimit-Policy"),
      requestId: r.headers.get("X-Request-Id"),
      notExposed: r.headers.get("X-Upstream"),
      body: await r.text(),
    }};
    if (r.status === 429) {{ limited = seen; break; }}
    ok = seen;
  }}
  return {{ statuses, ok, limited }};
}})()
  .catch((e) => ({{ error: String(e) }}))
  .then((result) => {{
    const text = JSON.stringify(result);
    document.getElementById("out").textContent = text;
    return fetch("/result", {{ method: "POST", body: text }});
  }});
</script></body></html>"#
    )
}

/// The page's server on 127.0.0.1:0: serves what is in `html` (filled once the gateway's
/// address is known), and what the page posts to `/result` comes out of the receiver.
struct PageServer {
    addr: std::net::SocketAddr,
    html: Arc<Mutex<String>>,
    results: tokio::sync::mpsc::Receiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn page_server() -> PageServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, results) = tokio::sync::mpsc::channel(4);
    let html = Arc::new(Mutex::new(String::new()));
    let slot = html.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (html, tx) = (slot.clone(), tx.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (html, tx) = (html.clone(), tx.clone());
                    async move {
                        let mut res = hyper::Response::new(Full::new(Bytes::new()));
                        match (req.method().as_str(), req.uri().path()) {
                            ("GET", "/") => {
                                let page = html.lock().unwrap().clone();
                                *res.body_mut() = Full::new(Bytes::from(page));
                                res.headers_mut()
                                    .insert("content-type", "text/html".parse().unwrap());
                            }
                            ("POST", "/result") => {
                                let body = req.into_body().collect().await?.to_bytes();
                                let _ = tx.send(String::from_utf8_lossy(&body).into_owned()).await;
                            }
                            _ => *res.status_mut() = hyper::StatusCode::NOT_FOUND,
                        }
                        Ok::<_, hyper::Error>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    PageServer {
        addr,
        html,
        results,
        task,
    }
}

/// A headless Chromium on `url`, killed on drop.
struct Browser {
    child: std::process::Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn browse(url: &str) -> Browser {
    let profile = tempfile::tempdir().unwrap();
    let child = Command::new(chromium())
        .args([
            "--headless",
            // Tests run as root in containers, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start chromium");
    Browser {
        child,
        _profile: profile,
    }
}

async fn a_browser_reads_the_429s_retry_after_and_ratelimit(kind: Kind) {
    let browser_bin = chromium();
    let up = upstream().await;
    let env = store_env(kind);
    let mut page = page_server().await;
    let origin = format!("http://{}", page.addr);
    let routes = route(
        "api",
        "/api",
        &up.url(),
        &format!(
            "[routes.cors]\nallow_origins = [\"{origin}\"]\nallow_headers = [\"X-Api-Key\"]\nmax_age = \"10m\""
        ),
    ) + &support::limit(
        "name = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\nsubject = \"ip\"",
    );
    let gw = gateway(&config(&env.store, &routes));
    wait_ready(&gw).await;
    // Another origin: the same host, another port.
    *page.html.lock().unwrap() = page_html(&gw.url("/api/data"));
    let _browser = browse(&format!("{origin}/"));
    let got = tokio::time::timeout(Duration::from_secs(90), page.results.recv())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} never posted its result within 90 s (gateway log:\n{})",
                browser_bin.display(),
                gw.logs()
            )
        })
        .expect("the page server stopped");
    let v: serde_json::Value = serde_json::from_str(&got).expect("the page posts JSON");
    assert!(v.get("error").is_none(), "the page failed: {got}");
    assert_eq!(
        v["statuses"],
        serde_json::json!([200, 200, 200, 429]),
        "{got}"
    );
    let ok = &v["ok"];
    assert!(
        ok["rateLimit"].as_str().is_some_and(|s| s.contains("r=0")),
        "{got}"
    );
    assert!(
        ok["requestId"].as_str().is_some_and(|s| !s.is_empty()),
        "{got}"
    );
    assert!(
        ok["notExposed"].is_null(),
        "a header not exposed stays hidden: {got}"
    );
    let limited = &v["limited"];
    let retry: u64 = limited["retryAfter"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After not readable from JavaScript: {got}"));
    assert!((1..=3600).contains(&retry), "{got}");
    assert!(
        limited["rateLimit"]
            .as_str()
            .is_some_and(|s| s.contains("\"per-ip\"") && s.contains("r=0")),
        "RateLimit not readable from JavaScript: {got}"
    );
    assert!(
        limited["rateLimitPolicy"]
            .as_str()
            .is_some_and(|s| s.contains("q=3")),
        "{got}"
    );
    assert!(
        limited["body"]
            .as_str()
            .is_some_and(|s| s.contains("quota-exceeded")),
        "{got}"
    );
    // Three requests reached the upstream; the preflight(s) never did.
    assert_eq!(up.hits(), 3);
    assert!(up.seen().iter().all(|s| s.method == "GET"));
}
