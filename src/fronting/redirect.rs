//! Redirects the gateway answers itself: a redirect route (`redirect = { to, status }`, no
//! upstream) and the plain listener of `[server] http_redirect_listen`, which sends every
//! request to the same host and target on the TLS listener (`force-ssl-redirect`).

use http::header::HeaderValue;
use http::StatusCode;
use serde::Deserialize;

use super::template::{Allowed, Template, Vars};
use crate::head::RequestHead;

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
        let to = Template::parse(t, Allowed::Redirect).map_err(|e| format!("redirect.to: {e}"))?;
        Ok(Redirect { to, status })
    }
}

impl Redirect {
    /// The `Location` for a request: `None` when the template needs the host and the request
    /// named none.
    pub fn location(&self, vars: &Vars<'_>) -> Option<HeaderValue> {
        if vars.host.is_none() && self.to.uses(super::template::Var::Host) {
            return None;
        }
        self.to.expand(vars)
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
    let raw = crate::head::header_str(raw)?;
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
    use crate::head::OwnedHead;

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
