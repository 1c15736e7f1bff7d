//! The upstream edits: what an admitted request's head becomes on its way upstream, as plain
//! data a front applies to whatever head it forwards (after removing its own hop-by-hop
//! headers): the path and query sent, the few removes and sets a route or consumer asks for,
//! in order, then the headers every forwarded request gets (request id, `X-Forwarded-*`).

use http::header::{HeaderMap, HeaderName, HeaderValue};

pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// The consumer a request's key belongs to, sent upstream on routes with `consumers = true`;
/// removed from what the client sent on every route (issue #34 item 8).
pub static X_CONSUMER: HeaderName = HeaderName::from_static("x-consumer");

/// Hop-by-hop fields (RFC 9110 §7.6.1), removed by both fronts from what they forward, whether
/// `Connection` names them or not (lower case). One list, so the fronts cannot drift.
pub const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    // Connection-specific (RFC 9113 §3.2.1): it belongs to an `h2c` upgrade, never forwarded.
    "http2-settings",
];

/// Whether `name` (any case) is in [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| h.len() == name.len() && name.eq_ignore_ascii_case(h.as_bytes()))
}

/// Fields a `Connection` token never removes: the message's framing and its `Host` (RFC 9110
/// §7.6.1 lets a sender name only hop-by-hop fields; a client that names `Content-Length` would
/// otherwise have its body read upstream as a second request). Lower case.
pub const NEVER_NAMED: [&str; 3] = ["content-length", "transfer-encoding", "host"];

/// One change to the upstream head's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Remove every value of the header.
    Remove(HeaderName),
    /// Set the header to this one value.
    Set(HeaderName, HeaderValue),
    /// Add this value to the header's (a route's `[routes.request_headers] add`).
    Append(HeaderName, HeaderValue),
}

/// What the upstream head is: the path and query to send, and the header edits.
#[derive(Debug, Default)]
pub struct Edits {
    /// The upstream request's path and query (the route's prefix rewritten, a query key
    /// stripped).
    pub path_and_query: String,
    /// The edits a route (`preserve_host`, `[routes.request_headers]`) or a consumer
    /// (`X-Consumer`, `strip_key`) asks for, in order; most requests have none (and no
    /// allocation). A route's header rules come last and never name a header of
    /// [`Edits::forwarded`] (refused at load), so they apply after the gateway's own.
    pub headers: Vec<Edit>,
    /// The headers every forwarded request gets, set after those.
    pub forwarded: Forwarded,
}

/// The headers set on every forwarded request, after [`Edits::headers`]: the request id, the
/// client address appended to `X-Forwarded-For`, `X-Forwarded-Proto` and, when the request
/// named a host, `X-Forwarded-Host`.
#[derive(Debug, Default)]
pub struct Forwarded {
    /// The request id header's name and the request's id.
    pub request_id: Option<(HeaderName, HeaderValue)>,
    /// The TCP peer's address, appended to `X-Forwarded-For`.
    pub client: Option<HeaderValue>,
    /// Whether the client's connection was TLS.
    pub https: bool,
    /// The host the request named, as received.
    pub host: Option<HeaderValue>,
    /// The client certificate's identity (`X-Forwarded-Client-Cert`); the client's own header
    /// of that name is removed either way.
    pub client_cert: Option<HeaderValue>,
}

impl Edits {
    pub(crate) fn remove(&mut self, name: &HeaderName) {
        self.headers.push(Edit::Remove(name.clone()));
    }

    pub(crate) fn set(&mut self, name: &HeaderName, value: HeaderValue) {
        self.headers.push(Edit::Set(name.clone(), value));
    }

    pub(crate) fn append(&mut self, name: &HeaderName, value: HeaderValue) {
        self.headers.push(Edit::Append(name.clone(), value));
    }

    /// A route's `[routes.request_headers]` for this request, after the edits already listed.
    pub(crate) fn push_rules(
        &mut self,
        rules: &crate::fronting::HeaderRules,
        vars: &crate::fronting::Vars<'_>,
    ) {
        rules.each(vars, |name, value, add| match (value, add) {
            (None, _) => self.remove(name),
            (Some(v), false) => self.set(name, v),
            (Some(v), true) => self.append(name, v),
        });
    }

    /// Applies the header edits to `headers`: [`Edits::headers`] in order, then
    /// [`Edits::forwarded`]. Consumes them (their values move into the head).
    pub fn apply(self, headers: &mut HeaderMap) {
        self.write(headers);
    }

    /// The one forwarding-header writer of every front: what the gateway asserts
    /// (`X-Consumer`) removed from the client's, [`Edits::headers`] in order, then
    /// [`Edits::forwarded`] (the request id, the client appended to `X-Forwarded-For`,
    /// `X-Forwarded-Proto`, `X-Forwarded-Host`), onto whatever head a front forwards
    /// ([`UpstreamEdit`]). Consumes the edits (their values move into the head).
    pub fn write(self, head: &mut impl UpstreamEdit) {
        // What the gateway asserts is never the client's (a consumer route sets it below).
        head.remove(X_CONSUMER.clone());
        for e in self.headers {
            match e {
                Edit::Remove(name) => head.remove(name),
                Edit::Set(name, value) => head.set(name, value),
                Edit::Append(name, value) => head.append(name, value),
            }
        }
        let f = self.forwarded;
        if let Some((name, id)) = f.request_id {
            head.set(name, id);
        }
        if let Some(client) = &f.client {
            if let Some(v) = forwarded_for(head, client) {
                head.set(crate::subject::X_FORWARDED_FOR.clone(), v);
            }
        }
        head.set(
            X_FORWARDED_PROTO.clone(),
            HeaderValue::from_static(if f.https { "https" } else { "http" }),
        );
        match f.host {
            Some(h) => head.set(X_FORWARDED_HOST.clone(), h),
            // Without a host of the request's, none of the client's either.
            None => head.remove(X_FORWARDED_HOST.clone()),
        }
        // The client certificate's identity, or none: never the client's own.
        let xfcc = crate::tls::peer::X_FORWARDED_CLIENT_CERT.clone();
        match f.client_cert {
            Some(v) => head.set(xfcc, v),
            None => head.remove(xfcc),
        }
    }
}

/// A head being made for upstream, as the forwarding-header writer ([`Edits::write`]) and an
/// attempt's trace stamp ([`stamp_attempt`]) change it: a `HeaderMap` (the hyper front), or the
/// fast front's overlay on the client's head (`http1::write::UpstreamHead`).
pub trait UpstreamEdit {
    /// Removes every value of `name`.
    fn remove(&mut self, name: HeaderName);
    /// Sets `name` to this one value (in place of the first one, else at the end).
    fn set(&mut self, name: HeaderName, value: HeaderValue);
    /// Adds a value to `name`'s.
    fn append(&mut self, name: HeaderName, value: HeaderValue);
    /// Calls `each` with the values of `name` the head forwards as received (valid text only;
    /// a field the client's `Connection` names is not forwarded), in order.
    fn each_value(&self, name: &HeaderName, each: impl FnMut(&str));
}

impl UpstreamEdit for HeaderMap {
    fn remove(&mut self, name: HeaderName) {
        HeaderMap::remove(self, name);
    }

    fn set(&mut self, name: HeaderName, value: HeaderValue) {
        self.insert(name, value);
    }

    fn append(&mut self, name: HeaderName, value: HeaderValue) {
        HeaderMap::append(self, name, value);
    }

    fn each_value(&self, name: &HeaderName, mut each: impl FnMut(&str)) {
        for v in self.get_all(name).iter().filter_map(|v| v.to_str().ok()) {
            each(v);
        }
    }
}

/// An upstream attempt's trace context (`traceparent`, and `tracestate` or none), replacing
/// the client's and the attempt before's.
pub fn stamp_attempt(
    head: &mut impl UpstreamEdit,
    (parent, state): (HeaderValue, Option<HeaderValue>),
) {
    head.set(crate::traces::TRACEPARENT.clone(), parent);
    match state {
        Some(s) => head.set(crate::traces::TRACESTATE.clone(), s),
        None => head.remove(crate::traces::TRACESTATE.clone()),
    }
}

/// `X-Forwarded-For` with `client` appended to what `head` forwards of it (as nginx's
/// `$proxy_add_x_forwarded_for`). Without an incoming one, no allocation: the value is the
/// connection's. `None`: the joined value is not a header value (cannot happen with text).
fn forwarded_for(head: &impl UpstreamEdit, client: &HeaderValue) -> Option<HeaderValue> {
    let mut value = String::new();
    head.each_value(&crate::subject::X_FORWARDED_FOR, |v| {
        value.push_str(v);
        value.push_str(", ");
    });
    if value.is_empty() {
        return Some(client.clone());
    }
    value.push_str(client.to_str().unwrap_or_default());
    HeaderValue::from_str(&value).ok()
}

/// Appends `client` (the peer's address as a header value) to `X-Forwarded-For` (as nginx's
/// `$proxy_add_x_forwarded_for` does), as [`Edits::write`] does.
pub fn append_forwarded_for(headers: &mut HeaderMap, client: &HeaderValue) {
    if let Some(v) = forwarded_for(headers, client) {
        headers.insert(crate::subject::X_FORWARDED_FOR.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xff_appends() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &HeaderValue::from_static("1.2.3.4"));
        assert_eq!(h["x-forwarded-for"], "1.2.3.4");
        append_forwarded_for(&mut h, &HeaderValue::from_static("::1"));
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, ::1");
    }

    #[test]
    fn edits_apply_in_order() {
        let mut h = HeaderMap::new();
        h.insert(&X_CONSUMER, HeaderValue::from_static("forged"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        let mut e = Edits::default();
        e.remove(&X_CONSUMER);
        e.set(&X_CONSUMER, HeaderValue::from_static("acme"));
        e.remove(&HeaderName::from_static("x-api-key"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        e.forwarded.client = Some(HeaderValue::from_static("10.0.0.2"));
        e.apply(&mut h);
        assert_eq!(h[&X_CONSUMER], "acme");
        assert!(!h.contains_key("x-api-key"));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn route_rules_become_edits_after_the_others() {
        let rules: crate::fronting::RequestRules = toml::from_str(
            "remove = [\"Cookie\"]\nset = { \"X-Route\" = \"$route\", \"X-Who\" = \"$consumer\" }\nadd = { \"X-Tag\" = \"gw\" }",
        )
        .unwrap();
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_static("s=1"));
        h.insert("x-who", HeaderValue::from_static("forged"));
        h.insert("x-tag", HeaderValue::from_static("client"));
        let mut e = Edits::default();
        e.set(&X_CONSUMER, HeaderValue::from_static("acme"));
        let vars = crate::fronting::Vars {
            route: "api",
            ..Default::default()
        };
        e.push_rules(&rules.0, &vars);
        assert!(matches!(e.headers.first(), Some(Edit::Set(n, _)) if *n == X_CONSUMER));
        assert!(matches!(e.headers.last(), Some(Edit::Append(..))));
        e.apply(&mut h);
        assert!(!h.contains_key("cookie"));
        assert_eq!(h["x-route"], "api");
        assert!(!h.contains_key("x-who"), "no consumer: removed");
        let tags: Vec<_> = h.get_all("x-tag").iter().collect();
        assert_eq!(tags, ["client", "gw"]);
    }
}
