//! An upstream that answers like an OpenAI-compatible chat API, for trying token limits
//! (`cost_from`) and for the tests: `POST` anything with a JSON body such as
//! `{"model": "m", "messages": [{"role": "user", "content": "three words here"}],
//! "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}`.
//!
//! - `usage.prompt_tokens` is the number of words in the messages' contents,
//!   `completion_tokens` is `max_tokens` (default 16, at most 4096), `total_tokens` their sum;
//! - without `stream`: one JSON body (`chat.completion`) ending with `usage`;
//! - with `stream`: a `text/event-stream` of `chat.completion.chunk` events, one per token,
//!   then, with `stream_options.include_usage`, one event with empty `choices` and `usage`,
//!   then `data: [DONE]`;
//! - request headers for tests: `x-event-delay-ms: N` waits N ms between events;
//!   `x-usage-trailer: NAME` sends the total in a trailer `NAME` (chunked HTTP/1.1 with
//!   `TE: trailers`, and HTTP/2);
//! - a body that is not such JSON gets a 400 JSON error, like the real APIs.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame};
use hyper::header::HeaderName;
use hyper::{HeaderMap, Request, Response, StatusCode};

/// A response body: one piece, or frames sent from a task.
pub enum ChatBody {
    Full(Full<Bytes>),
    Stream(tokio::sync::mpsc::Receiver<Frame<Bytes>>),
}

impl Body for ChatBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ChatBody::Full(f) => Pin::new(f).poll_frame(cx),
            ChatBody::Stream(rx) => rx.poll_recv(cx).map(|f| f.map(Ok)),
        }
    }
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<ChatBody> {
    let mut res = Response::new(ChatBody::Full(Full::new(Bytes::from(v.to_string()))));
    *res.status_mut() = status;
    res.headers_mut().insert(
        "content-type",
        "application/json".parse().expect("a valid value"),
    );
    res
}

/// Answers one request.
pub async fn chat<B>(req: Request<B>) -> Result<Response<ChatBody>, Infallible>
where
    B: Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"error": {"message": "the body could not be read"}}),
            ))
        }
    };
    let Ok(ask) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": {"message": "the body is not JSON"}}),
        ));
    };
    let model = ask["model"].as_str().unwrap_or("demo").to_owned();
    let prompt: u64 = ask["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["content"].as_str())
                .map(|c| c.split_whitespace().count() as u64)
                .sum()
        })
        .unwrap_or(0);
    let completion = ask["max_tokens"].as_u64().unwrap_or(16).min(4096);
    let usage = serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    let delay = header_u64(&parts.headers, "x-event-delay-ms").map(Duration::from_millis);
    let trailer = parts
        .headers
        .get("x-usage-trailer")
        .and_then(|v| HeaderName::from_bytes(v.as_bytes()).ok());
    if ask["stream"].as_bool() != Some(true) {
        let content = "tok ".repeat(usize::try_from(completion).unwrap_or(0));
        let v = serde_json::json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
            "usage": usage,
        });
        if trailer.is_none() {
            return Ok(json_response(StatusCode::OK, &v));
        }
        let frames = vec![Frame::data(Bytes::from(v.to_string()))];
        return Ok(streamed(
            frames,
            trailer,
            prompt + completion,
            None,
            "application/json",
        ));
    }
    let include_usage = ask["stream_options"]["include_usage"].as_bool() == Some(true);
    let mut frames = Vec::new();
    for _ in 0..completion {
        let chunk = serde_json::json!({
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {"content": "tok "}}],
        });
        frames.push(Frame::data(Bytes::from(format!("data: {chunk}\n\n"))));
    }
    if include_usage {
        let last = serde_json::json!({
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [],
            "usage": usage,
        });
        frames.push(Frame::data(Bytes::from(format!("data: {last}\n\n"))));
    }
    frames.push(Frame::data(Bytes::from_static(b"data: [DONE]\n\n")));
    Ok(streamed(
        frames,
        trailer,
        prompt + completion,
        delay,
        "text/event-stream",
    ))
}

fn header_u64(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.parse().ok()
}

/// Sends `frames` from a task (with `delay` between them), then the trailer when asked.
fn streamed(
    frames: Vec<Frame<Bytes>>,
    trailer: Option<HeaderName>,
    total: u64,
    delay: Option<Duration>,
    content_type: &'static str,
) -> Response<ChatBody> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let declared = trailer.clone();
    tokio::spawn(async move {
        for f in frames {
            if tx.send(f).await.is_err() {
                return; // the gateway went away
            }
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
        }
        if let Some(name) = trailer {
            let mut t = HeaderMap::new();
            t.insert(name, total.into());
            let _ = tx.send(Frame::trailers(t)).await;
        }
    });
    let mut res = Response::new(ChatBody::Stream(rx));
    res.headers_mut()
        .insert("content-type", content_type.parse().expect("a valid value"));
    if let Some(name) = declared {
        // HTTP/1.1 sends only the trailer fields the head declared.
        res.headers_mut().insert(
            hyper::header::TRAILER,
            hyper::header::HeaderValue::from_str(name.as_str())
                .expect("a header name is a valid value"),
        );
    }
    res
}
