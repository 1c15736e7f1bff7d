//! Fronting a real API: what a route does around its limits — header rules, CORS, path
//! rewrites and redirects. Each concept is parsed while the config is deserialised (so
//! `tollgate check` names the line of a bad value) into the form the request path uses, and is
//! applied by the request pipeline ([`crate::pipeline`]): request rules and rewrites as upstream
//! edits, response rules and CORS by [`crate::pipeline::respond`], preflights and redirects as
//! the gateway's own answers. No front needs code of its own for them.

pub mod cors;
pub mod header_rules;
pub mod redirect;
pub mod rewrite;
pub mod template;

pub use self::cors::Cors;
pub use self::header_rules::{HeaderRules, RequestRules, ResponseRules};
pub use self::redirect::Redirect;
pub use self::rewrite::Rewrite;
pub use self::template::{Allowed, Refused, Template, Vars};

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// A response head as the response phase edits it, whatever a front keeps it as: a
/// `HeaderMap` (the hyper front, the gateway's own answers) or the fast front's overlay on the
/// upstream's head as received (`crate::pipeline::respond::ResponseEdits`). The operations and
/// their meaning are `HeaderMap`'s.
pub trait HeaderEdit {
    /// Removes every value of `name`.
    fn remove(&mut self, name: &HeaderName);
    /// Sets `name` to this one value.
    fn insert(&mut self, name: &HeaderName, value: HeaderValue);
    /// Adds a value to `name`'s.
    fn append(&mut self, name: &HeaderName, value: HeaderValue);
}

impl HeaderEdit for HeaderMap {
    fn remove(&mut self, name: &HeaderName) {
        HeaderMap::remove(self, name);
    }
    fn insert(&mut self, name: &HeaderName, value: HeaderValue) {
        HeaderMap::insert(self, name.clone(), value);
    }
    fn append(&mut self, name: &HeaderName, value: HeaderValue) {
        HeaderMap::append(self, name.clone(), value);
    }
}

/// What a route does around its limits (all optional; a route with none pays nothing).
#[derive(Debug, Clone, Default)]
pub struct Fronting {
    pub request_headers: Option<Box<HeaderRules>>,
    pub response_headers: Option<Box<ResponseRules>>,
    pub cors: Option<Box<Cors>>,
    pub rewrite: Option<Box<Rewrite>>,
}

impl Fronting {
    /// Whether a response of the route needs [`crate::pipeline::respond`] at all.
    pub fn touches_responses(&self) -> bool {
        self.response_headers.is_some() || self.cors.is_some()
    }
}

/// The checks of a route's fronting that need more than the route's own keys: the request id
/// header's configured name (asserted by the gateway on both sides), CORS headers that header
/// rules would fight with, and the CORS defaults that depend on the route and `[server]`.
/// Returns the key at fault and why.
pub fn check_route(
    f: &mut Fronting,
    methods: Option<&[http::Method]>,
    request_id: &HeaderName,
) -> Result<(), (&'static str, String)> {
    if f.request_headers
        .as_ref()
        .is_some_and(|r| r.touches(request_id))
    {
        return Err((
            "request_headers",
            format!("{request_id:?} is the request id header ([server] request_id_header), asserted by the gateway"),
        ));
    }
    if let Some(r) = &f.response_headers {
        if r.rules.touches(request_id) {
            return Err((
                "response_headers",
                format!("{request_id:?} is the request id header ([server] request_id_header), asserted by the gateway"),
            ));
        }
        if f.cors.is_some() {
            if let Some(n) = r
                .rules
                .names()
                .find(|n| n.as_str().starts_with("access-control-"))
            {
                return Err((
                    "response_headers",
                    format!("{n:?} is written by the route's [routes.cors]; set CORS there"),
                ));
            }
        }
    }
    if let Some(c) = &mut f.cors {
        c.finish(methods, request_id);
    }
    Ok(())
}
