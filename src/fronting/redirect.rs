//! Redirects the gateway answers itself: a redirect route (`redirect = { to, status }`, no
//! upstream) and the plain listener of `[server] http_redirect_listen`, which sends every
//! request to the same host and target on the TLS listener (`force-ssl-redirect`).

use http::header::HeaderValue;
use http::StatusCode;
use serde::Deserialize;

use super::template::{Allowed, Template, Vars};
use crate::http::head::RequestHead;

/// A redirect route's `redirect`, compiled.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawRedirect")]
pub struct Redirect {
    pub to: Template,
    pub status: StatusCode,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedirect {
    to: String,
    #[serde(default = "default_status")]
    status: u16,
}

fn default_status() -> u16 {
    308
}

impl TryFrom<RawRedirect> for Redirect {
    type Error = String;
    fn try_from(r: RawRedirect) -> Result<Redirect, String> {
        let status = match r.status {
            301 | 302 | 307 | 308 => StatusCode::from_u16(r.status).map_err(|e| e.to_string())?,
            s => {
                return Err(format!(
                    "redirect.status: {s} is not a redirect status; use 301, 302, 307 or 308"
                ))
            }
        };
        let t = &r.to;
        let anchored = [
            "https://",
            "http://",
            "$path",
            "${path}",
            "$request_uri",
            "${request_uri}",
        ]
        .iter()
        .any(|p| t.starts_with(p))
            || (t.starts_with('/') && !t.starts_with("//"));
        if !anchored {
            return Err(format!(
                "redirect.to: {t:?} must start with \"https://\", \"http://\", a single '/', $path or \
                 $request_uri (anything else is read relative to the request, or as another host)"
            ));
        }
        // `/$path` and `/$request_uri` put a second '/' before every path; a literal `/\\` or a
        // tab after the '/' is read by browsers as `//`: another host on every request.
        let literal = browser_cleaned(t.split('$').next().unwrap_or("").as_bytes());
        let doubled = ["$path", "${path}", "$request_uri", "${request_uri}"]
            .iter()
            .any(|v| t.strip_prefix('/').is_some_and(|rest| rest.starts_with(v)));
        if doubled || (literal.starts_with(b"/") && !browser_same_host(&literal)) {
            return Err(format!(
                "redirect.to: {t:?} gives a Location browsers read as another host (`//host`); \
                 $path and $request_uri start with their own '/'"
            ));
        }
        let to = Template::parse(t, Allowed::Redirect).map_err(|e| format!("redirect.to: {e}"))?;
        Ok(Redirect { to, status })
    }
}

/// Why a redirect route gives no `Location` for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoLocation {
    /// The template uses `$host` and the request named none.
    #[error("this redirect needs the request's host")]
    NeedsHost,
    /// What the template gave is something a browser would read as another host (or no URL).
    #[error("this redirect would send the client to another host")]
    AnotherHost,
}

impl Redirect {
    /// The `Location` for a request, checked as a browser will read it: never one that
    /// leads to another host than the template names (see [`browser_same_host`]).
    pub fn location(&self, vars: &Vars<'_>) -> Result<HeaderValue, NoLocation> {
        if vars.host.is_none() && self.to.uses(super::template::Var::Host) {
            return Err(NoLocation::NeedsHost);
        }
        let location = self.to.expand(vars).ok_or(NoLocation::AnotherHost)?;
        if browser_same_host(location.as_bytes()) {
            Ok(location)
        } else {
            Err(NoLocation::AnotherHost)
        }
    }
}

/// `location` as a browser's URL parser sees it (WHATWG URL): leading and trailing C0 controls
/// and spaces trimmed, every tab and line break removed.
fn browser_cleaned(location: &[u8]) -> Vec<u8> {
    let start = location
        .iter()
        .position(|&b| b > b' ')
        .unwrap_or(location.len());
    let end = location
        .iter()
        .rposition(|&b| b > b' ')
        .map_or(start, |i| i + 1);
    location[start..end.max(start)]
        .iter()
        .copied()
        .filter(|&b| !matches!(b, b'\t' | b'\n' | b'\r'))
        .collect()
}

/// Whether a browser reads `location` as the template meant: an absolute `http(s)://` URL
/// whose authority has no user-info (`https://a.example@evil.example`), or a path on the same
/// host — starting with one `/` not followed by another `/` or a `\` (which browsers read as
/// `/`). Anything else (`//evil.example`, `/\evil.example`, `/<TAB>/evil.example`, a relative
/// reference, another scheme) is refused.
pub fn browser_same_host(location: &[u8]) -> bool {
    let l = browser_cleaned(location);
    let lower = l.to_ascii_lowercase();
    let rest = lower
        .strip_prefix(b"https://")
        .or_else(|| lower.strip_prefix(b"http://"));
    if let Some(rest) = rest {
        let authority_end = rest
            .iter()
            .position(|b| matches!(b, b'/' | b'\\' | b'?' | b'#'))
            .unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        return !authority.is_empty() && !authority.contains(&b'@');
    }
    match l.as_slice() {
        [b'/', b'/' | b'\\', ..] => false,
        [b'/', ..] => true,
        _ => false,
    }
}

/// Where `[server] http_redirect_listen` sends a request: `https://` + its host (without the
/// port it came to) + `:port` of the TLS listener unless 443 + its target as received. `None`
/// when the request names no valid host.
pub fn https_location(head: &impl RequestHead, tls_port: u16) -> Option<HeaderValue> {
    let raw = match head.authority() {
        Some(a) => a.as_bytes(),
        None => head.header_value(&http::header::HOST)?,
    };
    let raw = crate::http::head::header_str(raw)?;
    let authority: http::uri::Authority = raw.parse().ok()?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return None;
    }
    let mut out = String::with_capacity(raw.len() + head.target_len() + 16);
    out.push_str("https://");
    out.push_str(&authority.host().to_ascii_lowercase());
    if tls_port != 443 {
        out.push(':');
        out.push_str(itoa::Buffer::new().format(tls_port));
    }
    let path = head.path();
    if path.starts_with('/') {
        out.push_str(path);
    } else {
        // `OPTIONS *` and the like: the root.
        out.push('/');
    }
    if let Some(q) = head.query() {
        out.push('?');
        out.push_str(q);
    }
    HeaderValue::from_str(&out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::OwnedHead;

    #[test]
    fn statuses_and_targets_are_checked() {
        let r: Result<Redirect, _> =
            toml::from_str("to = \"https://$host$request_uri\"\nstatus = 301");
        assert_eq!(r.unwrap().status, 301);
        for (toml, want) in [
            ("to = \"/x\"\nstatus = 200", "redirect status"),
            ("to = \"//evil.example/x\"", "single '/'"),
            ("to = \"$host/x\"", "must start"),
            ("to = \"/x$client_ip\"", "unknown variable"),
        ] {
            let e = toml::from_str::<Redirect>(toml).unwrap_err().to_string();
            assert!(e.contains(want), "{toml}: {e}");
        }
    }

    /// Issue #34 item 12: the Location produced is checked, not the template: nothing a
    /// browser reads as another host (`//host`, `/\\host`, `/<TAB>/host`: browsers drop tabs
    /// and line breaks and read `\\` as `/`) is ever produced.
    #[test]
    fn no_location_points_at_another_host() {
        let r: Redirect = toml::from_str("to = \"$path\"").unwrap();
        for path in [
            "//evil.example/x",
            "/\\evil.example/x",
            "/\t/evil.example/x",
            "\t//evil.example",
        ] {
            let v = Vars {
                path,
                ..Vars::default()
            };
            let got = r.location(&v).into_iter().next();
            assert!(got.is_none(), "{path:?} gave {got:?}");
        }
        let v = Vars {
            path: "/a/b",
            ..Vars::default()
        };
        assert_eq!(r.location(&v).into_iter().next().unwrap(), "/a/b");
        // Templates that could only ever produce such a Location are refused at load.
        for to in ["/$path", "/${request_uri}", "/\\\\evil", "/\t/evil"] {
            let toml = format!("to = \"{to}\"");
            assert!(toml::from_str::<Redirect>(&toml).is_err(), "{toml}");
        }
        let r: Redirect = toml::from_str("to = \"https://$host$request_uri\"").unwrap();
        let v = Vars {
            host: Some("api.example"),
            path: "/x",
            ..Vars::default()
        };
        assert_eq!(
            r.location(&v).into_iter().next().unwrap(),
            "https://api.example/x"
        );
    }

    #[test]
    fn https_location_keeps_host_and_target() {
        let mut h = OwnedHead {
            path: "/a/b".into(),
            query: Some("x=1".into()),
            ..OwnedHead::default()
        };
        h.headers
            .insert("host", HeaderValue::from_static("Api.Example.com:80"));
        assert_eq!(
            https_location(&h, 443).unwrap(),
            "https://api.example.com/a/b?x=1"
        );
        assert_eq!(
            https_location(&h, 8443).unwrap(),
            "https://api.example.com:8443/a/b?x=1"
        );
        h.headers.insert("host", HeaderValue::from_static("u@evil"));
        assert!(https_location(&h, 443).is_none());
        h.headers.remove("host");
        assert!(https_location(&h, 443).is_none());
    }
}
