//! Value templates: a header value or a redirect target written with a few `$variables`
//! (`"$client_ip"`, `"https://$host$request_uri"`), parsed once at load and expanded per request.
//!
//! Parsed, not interpreted: the text is split once into literal pieces and variables, each
//! literal checked to be a valid header value (no CR, LF, NUL or other control character can
//! come from the config), and each variable's value cleaned of control characters when it is
//! expanded (a variable's value comes from a request or a consumers file). So no template can
//! write a line break into a head, whatever the request. A template without variables is one
//! `HeaderValue` built at load: expanding it costs a reference count.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::header::HeaderValue;

/// A variable a template may use. Which ones a template accepts depends on where it is
/// ([`Allowed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// The client address (behind trusted proxies).
    ClientIp,
    /// The request's id.
    RequestId,
    /// The consumer's name (routes with `consumers = true`); empty when unknown.
    Consumer,
    /// The route's name.
    Route,
    /// The request's host, without port, lower case.
    Host,
    /// The normalised path.
    Path,
    /// The normalised path and the query as received (`?` and the query when there is one).
    RequestUri,
    /// A refusal's seconds until retrying may succeed (its `Retry-After`).
    RetryAfter,
    /// A refusal's limit: the quota of the limit that refused.
    Limit,
    /// A refusal's units left of that limit.
    Remaining,
}

impl Var {
    fn name(self) -> &'static str {
        match self {
            Var::ClientIp => "client_ip",
            Var::RequestId => "request_id",
            Var::Consumer => "consumer",
            Var::Route => "route",
            Var::Host => "host",
            Var::Path => "path",
            Var::RequestUri => "request_uri",
            Var::RetryAfter => "retry_after",
            Var::Limit => "limit",
            Var::Remaining => "remaining",
        }
    }

    const ALL: [Var; 10] = [
        Var::ClientIp,
        Var::RequestId,
        Var::Consumer,
        Var::Route,
        Var::Host,
        Var::Path,
        Var::RequestUri,
        Var::RetryAfter,
        Var::Limit,
        Var::Remaining,
    ];
}

/// Which variables a template may use.
#[derive(Debug, Clone, Copy)]
pub enum Allowed {
    /// Header rules: `$client_ip`, `$request_id`, `$consumer`, `$route`.
    HeaderRule,
    /// A redirect route's `to`: `$host`, `$path`, `$request_uri`.
    Redirect,
    /// A refusal's `body` (`[routes.refusal]`): the header rules' variables and `$jwt.CLAIM`,
    /// plus `$retry_after`, `$limit`, `$remaining`. A body, not a header value: its text may hold
    /// line breaks and any UTF-8 ([`Template::parse_text`]).
    Refusal,
}

impl Allowed {
    fn vars(self) -> &'static [Var] {
        match self {
            Allowed::HeaderRule => &[Var::ClientIp, Var::RequestId, Var::Consumer, Var::Route],
            Allowed::Redirect => &[Var::Host, Var::Path, Var::RequestUri],
            Allowed::Refusal => &[
                Var::ClientIp,
                Var::RequestId,
                Var::Consumer,
                Var::Route,
                Var::RetryAfter,
                Var::Limit,
                Var::Remaining,
            ],
        }
    }

    fn list(self) -> String {
        let mut s = String::new();
        for (i, v) in self.vars().iter().enumerate() {
            let _ = write!(s, "{}${}", if i > 0 { ", " } else { "" }, v.name());
        }
        s
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(Var),
    /// `$jwt.CLAIM` (header rules): a claim of the request's verified token, by its dotted
    /// path (`$jwt.sub`, `${jwt.org.id}`); empty without a token or when the claim is not a
    /// string or a number.
    Claim(Box<[Box<str>]>),
    /// `${path.NAME}` / `${host.NAME}` (header rules): a capture of the request's route (its
    /// `path_template`'s `{NAME}`, its host's `{NAME}.…`); empty when the route has none.
    Capture {
        host: bool,
        name: Box<str>,
    },
}

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    parts: Vec<Part>,
    /// The value, when the template has no variables.
    fixed: Option<HeaderValue>,
}

/// What a request gives the variables. Fields a template cannot use may be left empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct Vars<'a> {
    pub client_ip: Option<IpAddr>,
    pub request_id: Option<&'a HeaderValue>,
    pub consumer: Option<&'a str>,
    pub route: &'a str,
    pub host: Option<&'a str>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The claims of the request's verified bearer token (routes with `jwt`).
    pub claims: Option<&'a serde_json::Value>,
    /// A refusal's `$retry_after`, `$limit` and `$remaining`.
    pub refused: Option<Refused>,
    /// The request's route, for `${path.NAME}` and `${host.NAME}` (read with `host` and `path`).
    pub captured: Option<&'a crate::routing::Route>,
}

/// What a refusal's template tells of the limit that refused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub retry_after: u64,
    pub limit: u64,
    pub remaining: u64,
}

/// Whether byte `b` may stand in a header value written by the gateway: visible ASCII, space,
/// tab (RFC 9110 field-vchar without obs-text: a config is text, and a request's value is
/// cleaned to the same).
fn is_value_byte(b: u8) -> bool {
    b == b'\t' || (0x20..0x7f).contains(&b)
}

impl Template {
    /// Parses `text`: `$name` or `${name}` for a variable of `allowed`, `$$` for a `$`.
    pub fn parse(text: &str, allowed: Allowed) -> Result<Template, String> {
        if matches!(allowed, Allowed::Refusal) {
            return Err(format!("{text:?}: a refusal's body is not a header value"));
        }
        if let Some(b) = text.bytes().find(|&b| !is_value_byte(b)) {
            return Err(match b {
                b'\r' | b'\n' => format!("{text:?} contains a line break (CR or LF); a header value cannot"),
                0..=0x1f | 0x7f => format!("{text:?} contains a control character; a header value cannot"),
                _ => format!("{text:?} contains a non-ASCII character; write it percent-encoded or leave it out"),
            });
        }
        if text.trim_matches([' ', '\t']) != text {
            return Err(format!(
                "{text:?} starts or ends with whitespace, which HTTP strips from a header value"
            ));
        }
        let parts = Template::parts(text, allowed)?;
        let fixed = match parts.as_slice() {
            [] => Some(HeaderValue::from_static("")),
            [Part::Lit(l)] => Some(
                HeaderValue::from_str(l)
                    .map_err(|_| format!("{text:?} is not a valid header value"))?,
            ),
            _ => None,
        };
        Ok(Template { parts, fixed })
    }

    /// Parses the text of a body (a refusal's `body`): any UTF-8 but NUL, line breaks included;
    /// variables as [`Template::parse`]. Expanded with [`Template::expand_text`].
    pub fn parse_text(text: &str, allowed: Allowed) -> Result<Template, String> {
        if text.contains('\0') {
            return Err(format!("{text:?} contains a NUL character"));
        }
        Ok(Template {
            parts: Template::parts(text, allowed)?,
            fixed: None,
        })
    }

    /// `text` split into literals and variables of `allowed`.
    fn parts(text: &str, allowed: Allowed) -> Result<Vec<Part>, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            lit.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            if let Some(r) = rest.strip_prefix('$') {
                lit.push('$');
                rest = r;
                continue;
            }
            let (name, after) = if let Some(r) = rest.strip_prefix('{') {
                let end = r
                    .find('}')
                    .ok_or_else(|| format!("{text:?}: `${{` without its `}}`"))?;
                (&r[..end], &r[end + 1..])
            } else if rest.starts_with("jwt.") {
                // `$jwt.a.b`: the claim's dotted path runs on over dots.
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                    .unwrap_or(rest.len());
                (
                    rest[..end].trim_end_matches('.'),
                    &rest[rest[..end].trim_end_matches('.').len()..],
                )
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            if let Some((kind, cap)) = name
                .split_once('.')
                .filter(|(k, _)| *k == "path" || *k == "host")
            {
                if !matches!(allowed, Allowed::HeaderRule)
                    || !crate::config::route_match::capture_name_ok(cap)
                {
                    return Err(format!(
                        "{text:?}: `${{path.NAME}}` and `${{host.NAME}}` name a capture of the route (its path_template's {{NAME}}, its host's {{NAME}}.…), in header rules only"
                    ));
                }
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                parts.push(Part::Capture {
                    host: kind == "host",
                    name: cap.into(),
                });
                rest = after;
                continue;
            }
            if name.starts_with("jwt.") || name == "jwt" {
                let path: Vec<Box<str>> = name.split('.').skip(1).map(Box::from).collect();
                if !matches!(allowed, Allowed::HeaderRule | Allowed::Refusal)
                    || path.is_empty()
                    || path.iter().any(|k| k.is_empty())
                {
                    return Err(format!(
                        "{text:?}: `$jwt.CLAIM` names a claim of the request's verified token (`$jwt.sub`, `${{jwt.org.id}}`), in header rules only"
                    ));
                }
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                parts.push(Part::Claim(path.into()));
                rest = after;
                continue;
            }
            let var = Var::ALL
                .iter()
                .copied()
                .find(|v| v.name() == name)
                .filter(|v| allowed.vars().contains(v))
                .ok_or_else(|| {
                    format!(
                        "{text:?}: unknown variable `${name}`; here you may use {} (and `$$` for a `$`)",
                        allowed.list()
                    )
                })?;
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            parts.push(Part::Var(var));
            rest = after;
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(parts)
    }

    /// A body template's text for the variables of a request (see [`Template::parse_text`]);
    /// control characters in a variable's value are left out, as in a header value.
    pub fn expand_text(&self, vars: &Vars<'_>) -> String {
        let mut out: Vec<u8> = Vec::with_capacity(256);
        self.expand_into(vars, &mut out);
        // Literals are UTF-8 and variables' values ASCII: always valid.
        String::from_utf8(out).unwrap_or_default()
    }

    /// Whether the template uses `$jwt.CLAIM`.
    pub fn uses_claims(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Claim(_)))
    }

    /// Whether the template uses `var`.
    pub fn uses(&self, var: Var) -> bool {
        self.parts.contains(&Part::Var(var))
    }

    /// [`Template::expand_text`], appended to `out`.
    pub fn expand_into(&self, vars: &Vars<'_>, out: &mut Vec<u8>) {
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.extend_from_slice(l.as_bytes()),
                Part::Var(v) => push_var(out, *v, vars),
                Part::Claim(path) => push_claim(out, path, vars.claims),
                Part::Capture { host, name } => push_capture(out, *host, name, vars),
            }
        }
    }

    /// The template's text for the variables of a request, as a header value. Control
    /// characters in a variable's value are left out (see the module comment).
    pub fn expand(&self, vars: &Vars<'_>) -> Option<HeaderValue> {
        if let Some(v) = &self.fixed {
            return Some(v.clone());
        }
        let mut out: Vec<u8> = Vec::with_capacity(64);
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.extend_from_slice(l.as_bytes()),
                Part::Var(v) => push_var(&mut out, *v, vars),
                Part::Claim(path) => push_claim(&mut out, path, vars.claims),
                Part::Capture { host, name } => push_capture(&mut out, *host, name, vars),
            }
        }
        HeaderValue::from_maybe_shared(bytes::Bytes::from(out)).ok()
    }
}

/// Appends the claim at `path` of `claims` when it is a string or a number, keeping only bytes
/// a header value may carry.
fn push_capture(out: &mut Vec<u8>, host: bool, name: &str, vars: &Vars<'_>) {
    let which = if host {
        crate::routing::Capture::Host(name)
    } else {
        crate::routing::Capture::Path(name)
    };
    if let Some(v) = vars
        .captured
        .and_then(|r| r.capture(which, vars.host, vars.path))
    {
        out.extend(v.bytes().filter(|&b| is_value_byte(b)));
    }
}

/// The captures a template names: `(true, NAME)` for `${host.NAME}`, `(false, NAME)` for
/// `${path.NAME}`.
impl Template {
    pub fn captures(&self) -> impl Iterator<Item = (bool, &str)> {
        self.parts.iter().filter_map(|p| match p {
            Part::Capture { host, name } => Some((*host, &**name)),
            _ => None,
        })
    }
}

fn push_claim(out: &mut Vec<u8>, path: &[Box<str>], claims: Option<&serde_json::Value>) {
    let mut at = claims;
    for k in path {
        at = at.and_then(|v| v.get(&**k));
    }
    match at {
        Some(serde_json::Value::String(s)) => {
            out.extend(s.bytes().filter(|&b| is_value_byte(b)));
        }
        Some(serde_json::Value::Number(n)) => out.extend_from_slice(n.to_string().as_bytes()),
        _ => {}
    }
}

/// Appends `var`'s value, keeping only bytes a header value may carry.
fn push_var(out: &mut Vec<u8>, var: Var, vars: &Vars<'_>) {
    let clean =
        |out: &mut Vec<u8>, s: &[u8]| out.extend(s.iter().copied().filter(|&b| is_value_byte(b)));
    match var {
        Var::ClientIp => {
            if let Some(ip) = vars.client_ip {
                let mut s = String::with_capacity(40);
                let _ = write!(s, "{}", ip.to_canonical());
                out.extend_from_slice(s.as_bytes());
            }
        }
        Var::RequestId => {
            if let Some(id) = vars.request_id {
                clean(out, id.as_bytes());
            }
        }
        Var::Consumer => clean(out, vars.consumer.unwrap_or("").as_bytes()),
        Var::Route => clean(out, vars.route.as_bytes()),
        Var::Host => clean(out, vars.host.unwrap_or("").as_bytes()),
        Var::Path => clean(out, vars.path.as_bytes()),
        Var::RetryAfter | Var::Limit | Var::Remaining => {
            if let Some(r) = vars.refused {
                let n = match var {
                    Var::RetryAfter => r.retry_after,
                    Var::Limit => r.limit,
                    _ => r.remaining,
                };
                out.extend_from_slice(n.to_string().as_bytes());
            }
        }
        Var::RequestUri => {
            clean(out, vars.path.as_bytes());
            if let Some(q) = vars.query {
                out.push(b'?');
                clean(out, q.as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_variables() {
        let t = Template::parse("id=$request_id; route=${route}$$", Allowed::HeaderRule).unwrap();
        let id = HeaderValue::from_static("abc");
        let v = Vars {
            request_id: Some(&id),
            route: "api",
            ..Vars::default()
        };
        assert_eq!(t.expand(&v).unwrap(), "id=abc; route=api$");
        let fixed = Template::parse("prod", Allowed::HeaderRule).unwrap();
        assert_eq!(fixed.expand(&Vars::default()).unwrap(), "prod");
    }

    #[test]
    fn line_breaks_and_unknown_variables_are_refused() {
        for bad in ["a\r\nb", "a\nb", "a\0", "\u{7f}", " x", "é"] {
            assert!(
                Template::parse(bad, Allowed::HeaderRule).is_err(),
                "{bad:?}"
            );
        }
        let t = Template::parse("org=$jwt.org.id;sub=${jwt.sub}.", Allowed::HeaderRule).unwrap();
        let claims = serde_json::json!({"sub": "u\r\n1", "org": {"id": 42}});
        let vars = Vars {
            claims: Some(&claims),
            ..Vars::default()
        };
        assert_eq!(t.expand(&vars).unwrap(), "org=42;sub=u1.");
        assert_eq!(t.expand(&Vars::default()).unwrap(), "org=;sub=.");
        for bad in ["$jwt", "${jwt.}", "${jwt..a}"] {
            let e = Template::parse(bad, Allowed::HeaderRule).unwrap_err();
            assert!(e.contains("jwt"), "{bad}: {e}");
        }
        let e = Template::parse("https://x/$jwt.sub", Allowed::Redirect).unwrap_err();
        assert!(e.contains("header rules only"), "{e}");
        let e = Template::parse("$host", Allowed::HeaderRule).unwrap_err();
        assert!(e.contains("$client_ip"), "{e}");
        assert!(Template::parse("${route", Allowed::HeaderRule).is_err());
        assert!(Template::parse("https://$host$request_uri", Allowed::Redirect).is_ok());
    }

    #[test]
    fn variable_values_cannot_inject_a_line() {
        let t = Template::parse("c=$consumer", Allowed::HeaderRule).unwrap();
        let v = Vars {
            consumer: Some("evil\r\nX-Injected: 1"),
            ..Vars::default()
        };
        assert_eq!(t.expand(&v).unwrap(), "c=evilX-Injected: 1");
        let t = Template::parse("$request_uri", Allowed::Redirect).unwrap();
        let v = Vars {
            path: "/a",
            query: Some("x=1\n"),
            ..Vars::default()
        };
        assert_eq!(t.expand(&v).unwrap(), "/a?x=1");
    }
}
