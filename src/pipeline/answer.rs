//! The answer: what the gateway says itself instead of forwarding, as plain data any front
//! renders. The one place that maps what went wrong to a status code, its headers and an
//! `application/problem+json` body (RFC 9457) — or, to a gRPC client (a request whose
//! `content-type` is `application/grpc…`), to a gRPC "trailers-only" answer: HTTP 200 with
//! `grpc-status` and `grpc-message` in the head and no body, which every gRPC client reads as
//! the call's status (a problem+json 429 would reach it as an opaque `UNKNOWN` or `INTERNAL`).

use http::header::{
    HeaderMap, HeaderValue, CONNECTION, CONTENT_TYPE, LOCATION, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::StatusCode;

/// The problem type of a 429 (draft-ietf-httpapi-ratelimit-headers, "Problem Types").
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// Its registered title.
pub const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

/// The start of every 429 problem+json body, up to its status.
const LIMITED_HEAD: &[u8] = concat!(
    r#"{"type":""#,
    "https://iana.org/assignments/http-problem-types#quota-exceeded",
    r#"","title":""#,
    "Request cannot be satisfied as assigned quota has been exceeded",
    r#"","status":"#
)
.as_bytes();

/// Why the gateway answers a request itself.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches this request")]
    NoRoute,
    #[error("{0}")]
    BadRequest(&'static str),
    /// A framing problem after which the connection cannot be trusted (smuggling attempts).
    #[error("{0}")]
    BadFraming(&'static str),
    #[error("the request URI is longer than {0} bytes")]
    UriTooLong(usize),
    #[error("the request body is larger than {0} bytes")]
    BodyTooLarge(u64),
    #[error("the client sent no request body data for too long")]
    BodyTimeout,
    /// The client's request body could not be read (malformed chunked framing, cut off).
    #[error("the request body is malformed or incomplete")]
    BadBody,
    #[error("this route needs the {0} of the caller")]
    MissingSubject(String),
    /// A `json:` subject part with `on_missing = "reject"`: the request's JSON body has no
    /// string there (or is not JSON, or is larger than the route's `max_json_bytes`).
    #[error("this route needs a string at {0} of the request's JSON body (of at most {1} bytes)")]
    MissingInBody(String, u64),
    /// The header or query parameter a limit counts by appears more than once.
    #[error("{0} appears more than once; send one value")]
    RepeatedSubject(String),
    /// A route with `consumers = true` and `on_unknown = "reject"`: no known key.
    #[error("this route needs a known API key in the {0}")]
    UnknownConsumer(String),
    #[error("rate limit \"{limit}\" of route \"{route}\" exceeded; retry in {retry_after} s")]
    Limited {
        route: std::sync::Arc<str>,
        limit: std::sync::Arc<str>,
        retry_after: u64,
        /// Every enforcing limit that denied (`violated-policies`), `limit` among them (two
        /// held without the heap).
        violated: smallvec::SmallVec<[std::sync::Arc<str>; 2]>,
        /// The refusal's own shape (`refusal` on the limit or the route); `None`: 429
        /// problem+json. Boxed: the plain refusal does not grow.
        shape: Option<Box<Shaped>>,
    },
    #[error("the rate-limit store is unavailable")]
    StoreUnavailable,
    /// The bearer token is missing (a `required` route) or was refused.
    #[error("{}", .0.description())]
    Token(crate::jwt::Rejection),
    /// The route's `allow` / `deny` lists refuse the client address.
    #[error("this client may not use this route")]
    AccessDenied,
    /// The route demands a client certificate (`client_cert = "required"`) and the connection
    /// has none.
    #[error("this route requires a client certificate")]
    ClientCertRequired,
    #[error("cannot connect to the upstream")]
    UpstreamConnect,
    /// The TLS handshake with an `https://` upstream failed (a bad certificate, most often).
    #[error("TLS with the upstream failed: {0}")]
    UpstreamTls(String),
    /// Every server of the route's group is out by active health checks.
    #[error("no live upstream")]
    NoLiveUpstream,
    #[error("the upstream did not answer within {0:?}")]
    UpstreamTimeout(std::time::Duration),
    #[error("the upstream failed: {0}")]
    Upstream(String),
    /// A CORS preflight of a route with `[routes.cors]`: answered by the gateway (204, the
    /// CORS headers in the answer's headers), never forwarded.
    #[error("CORS preflight")]
    Preflight,
    /// A redirect route, or `[server] http_redirect_listen`.
    #[error("redirected to {location:?}")]
    Redirect {
        status: StatusCode,
        location: HeaderValue,
    },
    /// A route's `rewrite` gave a path that is not a normalised path (`..`, `//`, an escape).
    #[error("the rewritten path is not a valid path")]
    BadRewrite,
    /// A request body not yet decided would hold more than the connection's or the worker's
    /// share of bodies held (see [`crate::front::hyper::body`]).
    #[error("{}", .0.detail())]
    PendingBodies(PendingScope),
    /// Not a failure: the answer of a `usage = true` route, 200 with this JSON body (see
    /// [`super::usage`]). Here so that every front renders it as any other answer.
    #[error("usage")]
    Usage(String),
    /// A request with `Cache-Control: only-if-cached` that nothing stored may answer
    /// (RFC 9111 §5.2.1.7): 504.
    #[error("only-if-cached: no stored response may answer this request")]
    NotCached,
    /// A request that is not idempotent sent in TLS early data (HTTP/3's 0-RTT), which can be
    /// replayed: never served nor charged; the client sends it again after the handshake
    /// (RFC 8470).
    #[error("the request was sent in early data and is not idempotent; send it again after the handshake")]
    TooEarly,
}

/// A refusal with its own shape, and what its body's template may use of the request (taken
/// only when the template uses it).
#[derive(Debug, Clone)]
pub struct Shaped {
    pub refusal: std::sync::Arc<crate::config::Refusal>,
    pub refused: crate::fronting::Refused,
    pub route: std::sync::Arc<str>,
    pub client_ip: Option<std::net::IpAddr>,
    pub consumer: Option<Box<str>>,
    pub claims: Option<serde_json::Value>,
}

impl Shaped {
    /// The body: the refusal's template expanded (the problem+json body when it has none is
    /// written by [`ProxyError::problem`]).
    fn body(&self, request_id: &HeaderValue) -> String {
        let mut out = Vec::new();
        self.write_body(request_id, &mut out);
        // Literals are UTF-8 and variables' values ASCII: always valid.
        String::from_utf8(out).unwrap_or_default()
    }

    /// [`Shaped::body`], appended to `out`.
    fn write_body(&self, request_id: &HeaderValue, out: &mut Vec<u8>) {
        let Some((template, _)) = &self.refusal.body else {
            return;
        };
        template.expand_into(
            &crate::fronting::Vars {
                client_ip: self.client_ip,
                request_id: Some(request_id),
                consumer: self.consumer.as_deref(),
                route: &self.route,
                claims: self.claims.as_ref(),
                refused: Some(self.refused),
                ..crate::fronting::Vars::default()
            },
            out,
        )
    }
}

/// Whose bound on request bodies held before their limits refused one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingScope {
    /// The connection's: the client has too many bodies unfinished on it (429).
    Connection,
    /// The worker's: every client's together (503).
    Worker,
}

impl PendingScope {
    fn detail(self) -> &'static str {
        match self {
            PendingScope::Connection => "too many request bodies are still being received on this connection; finish them or retry",
            PendingScope::Worker => "the gateway holds too many request bodies still being received; retry",
        }
    }
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::BadRequest(_)
            | ProxyError::BadFraming(_)
            | ProxyError::RepeatedSubject(_)
            | ProxyError::MissingInBody(..)
            | ProxyError::BadRewrite
            | ProxyError::BadBody => StatusCode::BAD_REQUEST,
            ProxyError::Preflight => StatusCode::NO_CONTENT,
            ProxyError::Redirect { status, .. } => *status,
            ProxyError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ProxyError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Token(crate::jwt::Rejection::Throttled) => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::MissingSubject(_)
            | ProxyError::UnknownConsumer(_)
            | ProxyError::Token(_) => StatusCode::UNAUTHORIZED,
            ProxyError::Limited { shape: Some(s), .. } => s.refusal.status,
            ProxyError::Limited { .. } | ProxyError::PendingBodies(PendingScope::Connection) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ProxyError::StoreUnavailable | ProxyError::PendingBodies(PendingScope::Worker) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::AccessDenied | ProxyError::ClientCertRequired => StatusCode::FORBIDDEN,
            ProxyError::UpstreamConnect
            | ProxyError::UpstreamTls(_)
            | ProxyError::NoLiveUpstream
            | ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) | ProxyError::NotCached => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Usage(_) => StatusCode::OK,
            ProxyError::TooEarly => StatusCode::TOO_EARLY,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ProxyError::NoRoute => "Not Found",
            ProxyError::BadRequest(_)
            | ProxyError::BadFraming(_)
            | ProxyError::RepeatedSubject(_)
            | ProxyError::MissingInBody(..)
            | ProxyError::BadRewrite
            | ProxyError::BadBody => "Bad Request",
            ProxyError::Preflight => "No Content",
            ProxyError::Redirect { .. } => "Redirect",
            ProxyError::UriTooLong(_) => "URI Too Long",
            ProxyError::BodyTooLarge(_) => "Content Too Large",
            ProxyError::BodyTimeout => "Request Timeout",
            ProxyError::Token(crate::jwt::Rejection::Throttled) => "Too Many Requests",
            ProxyError::MissingSubject(_)
            | ProxyError::UnknownConsumer(_)
            | ProxyError::Token(_) => "Unauthorized",
            ProxyError::Limited { .. } | ProxyError::PendingBodies(PendingScope::Connection) => {
                "Too Many Requests"
            }
            ProxyError::StoreUnavailable | ProxyError::PendingBodies(PendingScope::Worker) => {
                "Service Unavailable"
            }
            ProxyError::AccessDenied | ProxyError::ClientCertRequired => "Forbidden",
            ProxyError::UpstreamConnect
            | ProxyError::UpstreamTls(_)
            | ProxyError::NoLiveUpstream
            | ProxyError::Upstream(_) => "Bad Gateway",
            ProxyError::UpstreamTimeout(_) | ProxyError::NotCached => "Gateway Timeout",
            ProxyError::Usage(_) => "OK",
            ProxyError::TooEarly => "Too Early",
        }
    }

    /// Whether the connection must be closed after the response.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            ProxyError::BadFraming(_)
                | ProxyError::BodyTooLarge(_)
                | ProxyError::BodyTimeout
                | ProxyError::BadBody
        )
    }

    /// Whether the answer is not an error (a preflight, a redirect): no problem+json body.
    pub fn is_plain(&self) -> bool {
        matches!(self, ProxyError::Preflight | ProxyError::Redirect { .. })
    }

    /// The problem+json body, with the request's id as `request_id` (empty for
    /// [`ProxyError::is_plain`] answers).
    pub fn problem(&self, request_id: &HeaderValue) -> String {
        let status = self.status();
        match self {
            ProxyError::Preflight | ProxyError::Redirect { .. } => String::new(),
            // The hot error: written directly (route and limit names are validated to need no
            // JSON escaping), without building a JSON value.
            ProxyError::Limited {
                shape: Some(shape), ..
            } if !shape.refusal.is_problem() => shape.body(request_id),
            ProxyError::Limited { .. } => {
                let mut out = Vec::with_capacity(400);
                self.write_refusal_body(request_id, &mut out);
                // Names and literals are UTF-8, the request id visible ASCII.
                String::from_utf8(out).unwrap_or_default()
            }
            ProxyError::Usage(body) => body.clone(),
            _ => serde_json::json!({
                "type": "about:blank",
                "title": self.title(),
                "status": status.as_u16(),
                "detail": self.to_string(),
                "request_id": request_id.to_str().unwrap_or_default(),
            })
            .to_string(),
        }
    }

    /// The body of a limit's refusal ([`ProxyError::Limited`]: its shape's template expanded,
    /// else the 429 problem+json), appended to `out` — what [`ProxyError::problem`] returns,
    /// written without an allocation of its own. Nothing for any other answer.
    pub fn write_refusal_body(&self, request_id: &HeaderValue, out: &mut Vec<u8>) {
        let ProxyError::Limited {
            route,
            limit,
            retry_after,
            violated,
            shape,
        } = self
        else {
            return;
        };
        if let Some(shape) = shape.as_deref().filter(|s| !s.refusal.is_problem()) {
            shape.write_body(request_id, out);
            return;
        }
        // The hot error: written directly (route and limit names are validated to need no
        // JSON escaping), in pieces, without building a JSON value or formatting.
        let mut n = itoa::Buffer::new();
        let (route, limit) = (route.as_bytes(), limit.as_bytes());
        out.extend_from_slice(LIMITED_HEAD);
        out.extend_from_slice(n.format(self.status().as_u16()).as_bytes());
        out.extend_from_slice(br#","detail":"rate limit \""#);
        out.extend_from_slice(limit);
        out.extend_from_slice(br#"\" of route \""#);
        out.extend_from_slice(route);
        out.extend_from_slice(br#"\" exceeded; retry in "#);
        let retry = n.format(*retry_after).as_bytes();
        out.extend_from_slice(retry);
        out.extend_from_slice(br#" s","violated-policies":["#);
        for (i, v) in violated.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(v.as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(br#"],"route":""#);
        out.extend_from_slice(route);
        out.extend_from_slice(br#"","limit":""#);
        out.extend_from_slice(limit);
        out.extend_from_slice(br#"","retry_after":"#);
        out.extend_from_slice(n.format(*retry_after).as_bytes());
        out.extend_from_slice(br#","request_id":"#);
        crate::http::request_id::write_json_bytes(out, request_id);
        out.push(b'}');
    }

    /// The `Content-Type` of a limit's refusal: its shape's, or problem+json.
    pub fn refusal_content_type(&self) -> &[u8] {
        match self {
            ProxyError::Limited { shape: Some(s), .. } if !s.refusal.is_problem() => {
                s.refusal.content_type.as_bytes()
            }
            _ => b"application/problem+json",
        }
    }

    /// The headers of the answer: its content type, `Retry-After` of a 429, `WWW-Authenticate`
    /// of a 401 for a key, `Connection: close` when the connection cannot be trusted.
    pub fn write_headers(&self, h: &mut HeaderMap) {
        if let ProxyError::Redirect { location, .. } = self {
            h.insert(LOCATION, location.clone());
        }
        if let ProxyError::Usage(_) = self {
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            // Usage changes with every request: no cache may answer for the gateway.
            h.insert(
                http::header::CACHE_CONTROL,
                HeaderValue::from_static("no-store"),
            );
            return;
        }
        if self.is_plain() {
            return;
        }
        h.insert(
            CONTENT_TYPE,
            match self {
                ProxyError::Limited { shape: Some(s), .. } if !s.refusal.is_problem() => {
                    s.refusal.content_type.clone()
                }
                _ => HeaderValue::from_static("application/problem+json"),
            },
        );
        if let ProxyError::Limited { retry_after, .. } = self {
            h.insert(RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        if let ProxyError::PendingBodies(_) = self {
            h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let ProxyError::Token(crate::jwt::Rejection::Throttled) = self {
            // The address's failures are counted per second.
            h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        } else if let ProxyError::Token(r) = self {
            // RFC 6750 §3: a plain challenge when no token was sent, `invalid_token` otherwise.
            let challenge = if *r == crate::jwt::Rejection::Missing {
                HeaderValue::from_static("Bearer realm=\"tollgate\"")
            } else {
                HeaderValue::from_str(&format!(
                    "Bearer realm=\"tollgate\", error=\"invalid_token\", error_description=\"{}\"",
                    r.description()
                ))
                .unwrap_or_else(|_| HeaderValue::from_static("Bearer error=\"invalid_token\""))
            };
            h.insert(WWW_AUTHENTICATE, challenge);
        }
        if let ProxyError::UnknownConsumer(_) = self {
            h.insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Key realm=\"tollgate\""),
            );
        }
        if self.closes_connection() {
            h.insert(CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

/// How an answer is written: problem+json, or gRPC status headers for a gRPC client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    #[default]
    Problem,
    /// `application/grpc` (and `+proto`, `+json`, … subtypes).
    Grpc,
    /// `application/grpc-web` (and `+proto`, …).
    GrpcWeb,
    /// `application/grpc-web-text`.
    GrpcWebText,
}

impl Flavor {
    /// The flavour a request's `content-type` asks for (case-insensitive, parameters ignored).
    pub fn of_content_type(value: Option<&[u8]>) -> Flavor {
        let Some(v) = value else {
            return Flavor::Problem;
        };
        let base = v
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        let sub = |prefix: &[u8]| -> bool {
            base.len() >= prefix.len()
                && base[..prefix.len()].eq_ignore_ascii_case(prefix)
                && matches!(base.get(prefix.len()), None | Some(b'+'))
        };
        if sub(b"application/grpc-web-text") {
            Flavor::GrpcWebText
        } else if sub(b"application/grpc-web") {
            Flavor::GrpcWeb
        } else if sub(b"application/grpc") {
            Flavor::Grpc
        } else {
            Flavor::Problem
        }
    }

    /// The flavour of a request, by its head.
    pub fn of(head: &impl crate::http::head::RequestHead) -> Flavor {
        Flavor::of_content_type(head.header_value(&CONTENT_TYPE))
    }

    fn content_type(self) -> &'static str {
        match self {
            Flavor::Problem => "application/problem+json",
            Flavor::Grpc => "application/grpc",
            Flavor::GrpcWeb => "application/grpc-web",
            Flavor::GrpcWebText => "application/grpc-web-text",
        }
    }
}

/// `grpc-status` of `grpc-status: 8`.
pub static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
/// `grpc-message` (percent-encoded, as gRPC's HTTP/2 protocol says).
pub static GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// The gRPC status code of an answer with HTTP `status`: gRPC's own HTTP-to-gRPC mapping
/// (`doc/http-grpc-status-mapping.md`: 400 → INTERNAL, 401 → UNAUTHENTICATED, 403 →
/// PERMISSION_DENIED, 404 → UNIMPLEMENTED, 502/503/504 → UNAVAILABLE, else UNKNOWN), except that
/// a refusal by a rate limit (429) and a message too large (413) are RESOURCE_EXHAUSTED — what
/// a gRPC server itself says for both — and a body that stopped coming (408) is
/// DEADLINE_EXCEEDED.
pub fn grpc_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 | 414 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        408 => 4,
        413 | 429 => 8,
        502..=504 => 14,
        _ => 2,
    }
}

/// What `grpc-message` may carry unescaped: printable ASCII but `%` (gRPC's percent-encoding).
const GRPC_MESSAGE_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// What the gateway answers itself: why (the status, problem and headers follow from it), and
/// headers to add (the rate-limit headers of a 429).
#[derive(Debug)]
pub struct Answer {
    pub error: ProxyError,
    pub headers: HeaderMap,
    /// A limit's refusal: its RateLimit fields (a route with `rate_limit_headers`), as plain
    /// data — written before `headers`, and straight into the head by a front that writes
    /// refusals itself ([`super::cycle::Codec::refuse`]).
    pub rate: Option<crate::limiter::RateFields>,
}

impl From<ProxyError> for Answer {
    fn from(error: ProxyError) -> Answer {
        Answer {
            error,
            headers: HeaderMap::new(),
            rate: None,
        }
    }
}

impl Answer {
    /// Logs the answer when it is a failure (5xx): the one "request failed" line of both
    /// fronts, one line a second per status at most (a dead upstream fails every request), so
    /// the rate does not depend on which front served the requests.
    pub fn log_failed(&self, route: Option<&str>, request_id: &HeaderValue) {
        let e = &self.error;
        let status = e.status();
        if !status.is_server_error() {
            return;
        }
        static FAILED: tollgate_limit::log_throttle::Throttles<6> =
            tollgate_limit::log_throttle::Throttles::new();
        if let Some(suppressed) = FAILED.allow(usize::from(status.as_u16().saturating_sub(500))) {
            tracing::warn!(
                route,
                status = status.as_u16(),
                error = %e,
                request_id = request_id.to_str().unwrap_or(""),
                suppressed,
                "request failed"
            );
        }
    }

    /// The answer of `[server] http_redirect_listen`: a 308 to the same host and target on the
    /// TLS listener's `tls_port`; 400 when the request names no valid host.
    pub fn https_redirect(head: &impl crate::http::head::RequestHead, tls_port: u16) -> Answer {
        match crate::fronting::redirect::https_location(head, tls_port) {
            Some(location) => Answer::from(ProxyError::Redirect {
                status: StatusCode::PERMANENT_REDIRECT,
                location,
            }),
            None => Answer::from(ProxyError::BadRequest(
                "a request to the HTTPS redirect needs a valid Host header",
            )),
        }
    }

    /// The status, headers and problem+json body to send.
    pub fn parts(self, request_id: &HeaderValue) -> (StatusCode, HeaderMap, String) {
        let Answer {
            error,
            mut headers,
            rate,
        } = self;
        if let Some(rate) = rate {
            rate.write(&mut headers);
        }
        error.write_headers(&mut headers);
        (error.status(), headers, error.problem(request_id))
    }

    /// The status, headers and body to send to a client that asked in `flavor`: problem+json
    /// as [`Answer::parts`], or a gRPC trailers-only answer (200, `grpc-status`,
    /// `grpc-message`, the answer's other headers — the rate-limit headers, `Retry-After` —
    /// and an empty body). The status the answer *means* (for metrics and the access log) is
    /// still `self.error.status()`.
    pub fn parts_for(
        self,
        request_id: &HeaderValue,
        flavor: Flavor,
    ) -> (StatusCode, HeaderMap, String) {
        if flavor == Flavor::Problem {
            return self.parts(request_id);
        }
        let Answer {
            error,
            mut headers,
            rate,
        } = self;
        if let Some(rate) = rate {
            rate.write(&mut headers);
        }
        error.write_headers(&mut headers);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(flavor.content_type()),
        );
        // A limit's refusal stays RESOURCE_EXHAUSTED whatever status its `refusal` gives the
        // HTTP clients: the gRPC status is what a gRPC client acts on.
        let code = match &error {
            ProxyError::Limited { .. } => grpc_code(StatusCode::TOO_MANY_REQUESTS),
            e => grpc_code(e.status()),
        };
        headers.insert(GRPC_STATUS.clone(), HeaderValue::from(u16::from(code)));
        let message =
            percent_encoding::utf8_percent_encode(&error.to_string(), GRPC_MESSAGE_ESCAPED)
                .to_string();
        if let Ok(v) = HeaderValue::from_str(&message) {
            headers.insert(GRPC_MESSAGE.clone(), v);
        }
        (StatusCode::OK, headers, String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_flavour_is_read_from_the_content_type() {
        let of = |v: &str| Flavor::of_content_type(Some(v.as_bytes()));
        assert_eq!(of("application/grpc"), Flavor::Grpc);
        assert_eq!(of("Application/GRPC+proto"), Flavor::Grpc);
        assert_eq!(of("application/grpc; charset=utf-8"), Flavor::Grpc);
        assert_eq!(of("application/grpc-web+proto"), Flavor::GrpcWeb);
        assert_eq!(of("application/grpc-web-text"), Flavor::GrpcWebText);
        assert_eq!(of("application/grpcx"), Flavor::Problem);
        assert_eq!(of("application/json"), Flavor::Problem);
        assert_eq!(of(""), Flavor::Problem);
        assert_eq!(Flavor::of_content_type(None), Flavor::Problem);
    }

    #[test]
    fn a_refusal_to_a_grpc_client_is_a_grpc_status() {
        let e = ProxyError::Limited {
            route: "api".into(),
            limit: "per-ip".into(),
            retry_after: 3,
            violated: smallvec::smallvec!["per-ip".into()],
            shape: None,
        };
        let mut extra = HeaderMap::new();
        extra.insert("ratelimit", HeaderValue::from_static("\"per-ip\";r=0;t=3"));
        let answer = Answer {
            error: e,
            headers: extra,
            rate: None,
        };
        let (status, h, body) = answer.parts_for(&HeaderValue::from_static("id"), Flavor::Grpc);
        assert_eq!(status, 200);
        assert!(body.is_empty());
        assert_eq!(h[&GRPC_STATUS], "8");
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h[RETRY_AFTER], "3");
        assert_eq!(h["ratelimit"], "\"per-ip\";r=0;t=3");
        assert_eq!(
            h[&GRPC_MESSAGE],
            "rate limit \"per-ip\" of route \"api\" exceeded; retry in 3 s"
        );
        for (e, code) in [
            (ProxyError::MissingSubject("header x-key".into()), "16"),
            (ProxyError::StoreUnavailable, "14"),
            (ProxyError::BadBody, "13"),
            (ProxyError::NoRoute, "12"),
            (
                ProxyError::UpstreamTimeout(std::time::Duration::from_secs(1)),
                "14",
            ),
        ] {
            let (_, h, _) =
                Answer::from(e).parts_for(&HeaderValue::from_static("id"), Flavor::GrpcWeb);
            assert_eq!(h[&GRPC_STATUS], code);
            assert_eq!(h[CONTENT_TYPE], "application/grpc-web");
        }
        assert_eq!(grpc_code(StatusCode::FORBIDDEN), 7);
        // Non-ASCII and `%` are percent-encoded.
        let (_, h, _) = Answer::from(ProxyError::Upstream("caf\u{e9} 100%".into()))
            .parts_for(&HeaderValue::from_static("id"), Flavor::Grpc);
        assert_eq!(h[&GRPC_MESSAGE], "the upstream failed: caf%C3%A9 100%25");
    }

    #[test]
    fn the_429_body_is_the_same_json_as_the_generic_path_would_write() {
        let e = ProxyError::Limited {
            route: "api".into(),
            limit: "per-ip".into(),
            retry_after: 7,
            violated: smallvec::smallvec!["per-ip".into(), "daily".into()],
            shape: None,
        };
        let (status, headers, body) =
            Answer::from(e.clone()).parts(&HeaderValue::from_static("req-\"1"));
        assert_eq!(status, 429);
        assert_eq!(headers[RETRY_AFTER], "7");
        let got: serde_json::Value = serde_json::from_str(&body).unwrap();
        let want = serde_json::json!({
            "type": QUOTA_EXCEEDED,
            "title": QUOTA_EXCEEDED_TITLE,
            "status": 429,
            "detail": e.to_string(),
            "violated-policies": ["per-ip", "daily"],
            "route": "api",
            "limit": "per-ip",
            "retry_after": 7,
            "request_id": "req-\"1",
        });
        assert_eq!(got, want);
        let generic = ProxyError::NoRoute.problem(&HeaderValue::from_static("abc"));
        let got: serde_json::Value = serde_json::from_str(&generic).unwrap();
        assert_eq!(got["request_id"], "abc");
        assert_eq!(got["status"], 404);
    }
}
