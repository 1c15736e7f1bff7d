//! `tollgate top`: `/-/top` of a running gateway as a table that refreshes, like `top(1)`.
//!
//! One HTTP/1.1 `GET` per refresh on a fresh connection (the admin listener is local and the
//! rate is one every few seconds), rendered as the limits' denied subjects, most denied first.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// Why `/-/top` could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("cannot connect to the admin listener at {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("GET http://{addr}{path} failed: {source}")]
    Http {
        addr: SocketAddr,
        path: String,
        source: hyper::Error,
    },
    #[error("GET http://{addr}{path} got no answer within {timeout:?}")]
    Timeout {
        addr: SocketAddr,
        path: String,
        timeout: Duration,
    },
    #[error("GET http://{addr}{path} answered {status}: {body}")]
    Status {
        addr: SocketAddr,
        path: String,
        status: StatusCode,
        body: String,
    },
    #[error("the admin listener's answer is not the JSON of /-/top: {0}")]
    Json(String),
    #[error("cannot write to the terminal: {0}")]
    Output(std::io::Error),
}

/// `GET path` on the admin listener at `addr`; the body of a 200.
pub async fn fetch(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, TopError> {
    let get = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| TopError::Connect { addr, source })?;
        let http = |source| TopError::Http {
            addr,
            path: path.to_owned(),
            source,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        let conn = tokio::spawn(conn);
        let mut req = Request::get(path).header(http::header::HOST, addr.to_string());
        // An admin listener with `[admin] token_file` needs a token for `/-/top`.
        if let Some(t) = std::env::var("TOLLGATE_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
        {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| TopError::Json(format!("bad request path {path:?}: {e}")))?;
        let res = sender.send_request(req).await.map_err(http)?;
        let status = res.status();
        let body = res.into_body().collect().await.map_err(http)?.to_bytes();
        conn.abort();
        let body = String::from_utf8_lossy(&body).into_owned();
        if status != StatusCode::OK {
            return Err(TopError::Status {
                addr,
                path: path.to_owned(),
                status,
                body,
            });
        }
        Ok(body)
    };
    match tokio::time::timeout(timeout, get).await {
        Ok(r) => r,
        Err(_) => Err(TopError::Timeout {
            addr,
            path: path.to_owned(),
            timeout,
        }),
    }
}

/// The table for a `/-/top` answer (`{"limits": [...]}`): one row per denied subject.
pub fn render(json: &str) -> Result<String, TopError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| TopError::Json(e.to_string()))?;
    let limits = v["limits"]
        .as_array()
        .ok_or_else(|| TopError::Json("no \"limits\" array".into()))?;
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut window = 0;
    for l in limits {
        window = window.max(l["window_s"].as_u64().unwrap_or(0));
        for t in l["top"].as_array().into_iter().flatten() {
            let who = match t["subject"].as_str() {
                Some("ip") => t["ip"].as_str().unwrap_or("?").to_owned(),
                Some("consumer") => t["consumer"].as_str().unwrap_or("?").to_owned(),
                Some("global") => "(everyone)".to_owned(),
                Some("parts") => t["parts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let v = ["value", "key", "ip"]
                            .iter()
                            .find_map(|k| p[*k].as_str())
                            .unwrap_or("?");
                        format!("{}={v}", p["part"].as_str().unwrap_or("?"))
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => format!("key {}", t["key"].as_str().unwrap_or("?")),
            };
            rows.push([
                l["route"].as_str().unwrap_or("?").to_owned(),
                l["limit"].as_str().unwrap_or("?").to_owned(),
                t["subject"].as_str().unwrap_or("?").to_owned(),
                who,
                t["denied"].as_u64().unwrap_or(0).to_string(),
            ]);
        }
    }
    // Most denied first across limits (each limit's list is already sorted).
    rows.sort_by(|a, b| {
        let n = |r: &[String; 5]| r[4].parse::<u64>().unwrap_or(0);
        n(b).cmp(&n(a))
    });
    let mut out = String::new();
    let _ = writeln!(
        out,
        "denied requests over the last {window} s, by limit and subject"
    );
    if rows.is_empty() {
        out.push_str("\nno denials\n");
        return Ok(out);
    }
    let head = ["ROUTE", "LIMIT", "SUBJECT", "WHO", "DENIED"];
    let mut widths = head.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    out.push('\n');
    let mut line = |cells: [&str; 5]| {
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i == 4 {
                let _ = write!(out, "{c:>w$}");
            } else {
                let _ = write!(out, "{c:<w$}  ");
            }
        }
        out.push('\n');
    };
    line(head);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4]]);
    }
    Ok(out)
}

/// Shows `/-/top` of the gateway at `admin` (only `route`'s limits if given): once, or every
/// `interval` until interrupted, clearing the screen between refreshes. A failed refresh is
/// shown and retried; with `once` it is the error.
pub async fn run(
    admin: SocketAddr,
    route: Option<&str>,
    once: bool,
    interval: Duration,
) -> Result<(), TopError> {
    let path = match route {
        Some(r) => format!(
            "/-/top?route={}",
            percent_encoding::utf8_percent_encode(r, percent_encoding::NON_ALPHANUMERIC)
        ),
        None => "/-/top".to_owned(),
    };
    let timeout = Duration::from_secs(2);
    loop {
        let shown = match fetch(admin, &path, timeout).await {
            Ok(body) => render(&body),
            Err(e) => Err(e),
        };
        if once {
            let table = shown?;
            print!("{table}");
            return std::io::stdout().flush().map_err(TopError::Output);
        }
        let text = match shown {
            Ok(t) => t,
            Err(e) => format!("{e}\n"),
        };
        let stamp = tollgate_limit::store::system_now() / 1_000_000;
        let mut clock = String::new();
        crate::access_log::write_rfc3339(
            &mut clock,
            std::time::UNIX_EPOCH + Duration::from_secs(stamp),
        );
        let mut out = std::io::stdout().lock();
        // Clear the screen and home the cursor, as top(1) does.
        write!(
            out,
            "\x1b[2J\x1b[Htollgate top — {admin} — {clock} (every {}s, Ctrl-C to quit)\n{text}",
            interval.as_secs()
        )
        .and_then(|()| out.flush())
        .map_err(TopError::Output)?;
        drop(out);
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_denied_subjects_most_denied_first() {
        let json = r#"{"limits":[
            {"route":"api","limit":"per-ip","window_s":300,"top":[
                {"subject":"ip","ip":"10.0.0.1","denied":5}]},
            {"route":"api","limit":"per-key","window_s":300,"top":[
                {"subject":"header","key":"0a1b2c3d","denied":9}]},
            {"route":"web","limit":"quiet","window_s":300,"top":[]}]}"#;
        let t = render(json).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("300 s"));
        assert!(lines[2].starts_with("ROUTE"));
        assert!(
            lines[3].contains("per-key")
                && lines[3].contains("key 0a1b2c3d")
                && lines[3].ends_with('9')
        );
        assert!(lines[4].contains("10.0.0.1") && lines[4].ends_with('5'));
        assert_eq!(lines.len(), 5);
        assert!(render(r#"{"limits":[]}"#).unwrap().contains("no denials"));
        assert!(render("nope").is_err());
    }
}
