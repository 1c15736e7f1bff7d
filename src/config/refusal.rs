//! `refusal = { status, body, content_type }` on a limit or a route: the shape of the answer a
//! limit's refusal gets — its status (429, or 503 for clients that only back off on that), and
//! a body of the operator's own (a template) in place of the problem+json one.
//!
//! Only the body changes: the RateLimit fields and `Retry-After` are written whatever the body,
//! and a gRPC client keeps its gRPC status (`RESOURCE_EXHAUSTED`, no body). The body is a
//! template with the header rules' variables plus `$retry_after`, `$limit`, `$remaining`,
//! parsed once at load; it may span lines (a page), while `content_type`, a header, may not.

use http::header::HeaderValue;
use http::StatusCode;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{invalid, ConfigError};
use crate::fronting::{Allowed, Template};

/// `refusal` as written.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRefusal {
    /// The refusal's status: `429` or `503` (integer; default: `429`).
    #[serde(default)]
    #[schemars(schema_with = "super::schema::refusal_status")]
    status: Option<u16>,
    /// The body, in place of the problem+json one: a template with `$client_ip`, `$request_id`,
    /// `$consumer`, `$route`, `$jwt.CLAIM`, `$retry_after`, `$limit`, `$remaining` (`$$` for a
    /// `$`); may span lines (string; default: the problem+json body).
    #[serde(default)]
    body: Option<String>,
    /// The body's `Content-Type`; only with `body` (string; default:
    /// `"text/plain; charset=utf-8"`).
    #[serde(default)]
    content_type: Option<String>,
}

/// A refusal's shape, validated.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// 429 or 503.
    pub status: StatusCode,
    /// The body's template and its text as written (`None`: problem+json).
    pub body: Option<(Template, String)>,
    /// The body's `Content-Type` (unused without a body).
    pub content_type: HeaderValue,
}

impl PartialEq for Refusal {
    fn eq(&self, other: &Refusal) -> bool {
        self.status == other.status
            && self.body.as_ref().map(|b| &b.1) == other.body.as_ref().map(|b| &b.1)
            && self.content_type == other.content_type
    }
}

impl Eq for Refusal {}

impl Refusal {
    /// Whether the body is the gateway's problem+json (no `body` set).
    pub fn is_problem(&self) -> bool {
        self.body.is_none()
    }
}

/// The statuses a refusal takes (the loader's and the schema's one list).
pub(super) const STATUSES: [StatusCode; 2] = [
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::SERVICE_UNAVAILABLE,
];

/// Validates `refusal` at `at` (`routes[0].limits[1].refusal`).
pub(super) fn validate_refusal(at: &str, r: RawRefusal) -> Result<Refusal, ConfigError> {
    let status = match r.status {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some(s) if STATUSES.iter().any(|t| t.as_u16() == s) => {
            StatusCode::from_u16(s).unwrap_or(StatusCode::TOO_MANY_REQUESTS)
        }
        Some(s) => {
            return Err(invalid(
                format!("{at}.status"),
                format!("{s}: a refusal is 429 (too many requests) or 503 (unavailable)"),
            ))
        }
    };
    let body = match r.body {
        Some(text) => Some((
            Template::parse_text(&text, Allowed::Refusal)
                .map_err(|m| invalid(format!("{at}.body"), m))?,
            text,
        )),
        None => None,
    };
    let content_type = match (&r.content_type, &body) {
        (Some(_), None) => {
            return Err(invalid(
                format!("{at}.content_type"),
                "only applies with `body` (the default body is problem+json)",
            ))
        }
        (Some(ct), Some(_)) => {
            // A header, written as is: no template, nothing that could end the line.
            Some(ct)
                .filter(|ct| {
                    !ct.trim().is_empty()
                        && ct.bytes().all(|b| b == b'\t' || ((0x20..0x7f).contains(&b) && b != b'$'))
                })
                .and_then(|ct| HeaderValue::from_str(ct.trim()).ok())
                .ok_or_else(|| {
                    invalid(
                        format!("{at}.content_type"),
                        format!(
                            "{ct:?} is not a media type a header can carry (no line breaks, control characters, non-ASCII or `$`)"
                        ),
                    )
                })?
        }
        (None, _) => HeaderValue::from_static("text/plain; charset=utf-8"),
    };
    Ok(Refusal {
        status,
        body,
        content_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(status: Option<u16>, body: Option<&str>, ct: Option<&str>) -> RawRefusal {
        RawRefusal {
            status,
            body: body.map(str::to_owned),
            content_type: ct.map(str::to_owned),
        }
    }

    #[test]
    fn status_is_429_or_503() {
        let r = validate_refusal("r", raw(None, None, None)).unwrap();
        assert_eq!(r.status, 429);
        assert!(r.is_problem());
        let r = validate_refusal("r", raw(Some(503), None, None)).unwrap();
        assert_eq!(r.status, 503);
        let e = validate_refusal("routes[0].refusal", raw(Some(500), None, None)).unwrap_err();
        assert!(e.to_string().contains("routes[0].refusal.status"), "{e}");
    }

    #[test]
    fn a_content_type_that_would_break_the_head_is_refused() {
        for bad in [
            "text/plain\r\nX-Evil: 1",
            "text/html\n",
            "",
            "a$route",
            "caf\u{e9}",
        ] {
            let e = validate_refusal("r", raw(None, Some("x"), Some(bad))).unwrap_err();
            assert!(e.to_string().contains("r.content_type"), "{bad:?}: {e}");
        }
        let e = validate_refusal("r", raw(None, None, Some("text/html"))).unwrap_err();
        assert!(e.to_string().contains("only applies with `body`"), "{e}");
        let r = validate_refusal("r", raw(None, Some("<p>\n</p>"), Some("text/html"))).unwrap();
        assert_eq!(r.content_type, "text/html");
    }

    #[test]
    fn the_body_is_a_template_that_may_span_lines() {
        let r = validate_refusal(
            "r",
            raw(
                None,
                Some("Slow down, $client_ip:\nretry in $retry_after s ($remaining/$limit)"),
                None,
            ),
        )
        .unwrap();
        let (t, _) = r.body.unwrap();
        let vars = crate::fronting::Vars {
            client_ip: Some("10.0.0.1".parse().unwrap()),
            refused: Some(crate::fronting::Refused {
                retry_after: 7,
                limit: 10,
                remaining: 0,
            }),
            ..Default::default()
        };
        assert_eq!(
            t.expand_text(&vars),
            "Slow down, 10.0.0.1:\nretry in 7 s (0/10)"
        );
        assert_eq!(r.content_type, "text/plain; charset=utf-8");
        let e = validate_refusal("r", raw(None, Some("$host"), None)).unwrap_err();
        assert!(e.to_string().contains("r.body"), "{e}");
    }

    #[test]
    fn the_config_names_the_key_and_the_limit_wins_over_the_route() {
        let base = "[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n";
        let lim = "[[routes.limits]]\nname = \"l\"\nalgorithm = \"fixed_window\"\nlimit = 1\nperiod = \"1s\"\nsubject = \"ip\"\n";
        let parse = |t: &str| crate::config::Config::parse(t, std::path::Path::new("."));
        let c = parse(&format!(
            "{base}refusal = {{ status = 503 }}\n{lim}refusal = {{ body = \"no\" }}\n"
        ))
        .unwrap();
        assert_eq!(c.routes[0].refusal.as_ref().unwrap().status, 503);
        assert_eq!(c.routes[0].limits[0].refusal.as_ref().unwrap().status, 429);
        let e = parse(&format!("{base}{lim}refusal = {{ status = 418 }}\n")).unwrap_err();
        assert!(
            e.to_string().contains("routes[0].limits[0].refusal.status"),
            "{e}"
        );
        let e = parse(&format!(
            "{base}refusal = {{ body = \"x\", content_type = \"text/plain\\r\\nSet-Cookie: a=b\" }}\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("routes[0].refusal.content_type"),
            "{e}"
        );
        let e = parse(&format!("{base}refusal = {{ code = 503 }}\n")).unwrap_err();
        assert!(e.to_string().contains("code"), "{e}");
    }
}
