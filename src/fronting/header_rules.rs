//! Header rules: `[routes.request_headers]` and `[routes.response_headers]`, each with `remove`,
//! `set` and `add`, values written as [`Template`]s.
//!
//! Parsed while the config is deserialised, so `tollgate check` names the line of a bad rule.
//! A rule may not touch what the gateway asserts itself (the `X-Forwarded-*` headers,
//! `X-Consumer`, the request id, the rate-limit headers, `Retry-After`) nor the message's
//! framing (`Content-Length`, `Transfer-Encoding`, `Connection`, …): those are refused at load,
//! so a rule applied after the gateway's own headers can never undo them. The request id
//! header's configured name is checked once `[server]` is known ([`super::check_route`]).
//!
//! Order within a side: `remove`, then `set` (replaces every value), then `add` (appends one).
//! A `set` whose value comes out empty (`$consumer` of an unknown caller) removes the header;
//! an `add` that does adds nothing (nginx does not send a header set to an empty value either).

use std::collections::BTreeMap;

use http::header::{HeaderName, HeaderValue};

use super::HeaderEdit;
use serde::Deserialize;

use super::template::{Allowed, Template, Vars};

/// Headers that frame a message or belong to one connection: never a rule's.
const FRAMING: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "http2-settings",
];

/// What the gateway asserts on the request it sends upstream.
const REQUEST_ASSERTED: &[&str] = &[
    "host",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-consumer",
    "x-request-id",
];

/// What the gateway asserts on the response it sends the client.
pub(super) const RESPONSE_ASSERTED: &[&str] = &[
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "x-request-id",
];

/// Which side of the exchange a rule set edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

impl Side {
    fn key(self) -> &'static str {
        match self {
            Side::Request => "request_headers",
            Side::Response => "response_headers",
        }
    }
}

/// One side's rules, compiled.
#[derive(Debug, Clone, Default)]
pub struct HeaderRules {
    pub remove: Vec<HeaderName>,
    pub set: Vec<(HeaderName, Template)>,
    pub add: Vec<(HeaderName, Template)>,
}

/// `[routes.request_headers]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawRequestRules")]
pub struct RequestRules(pub HeaderRules);

/// `[routes.response_headers]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawResponseRules")]
pub struct ResponseRules {
    pub rules: HeaderRules,
    /// Whether the rules apply to the gateway's own answers too (429, 401, 404, 5xx…).
    pub own_answers: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequestRules {
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    add: BTreeMap<String, String>,
    #[serde(default)]
    remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResponseRules {
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    add: BTreeMap<String, String>,
    #[serde(default)]
    remove: Vec<String>,
    #[serde(default = "yes")]
    own_answers: bool,
}

fn yes() -> bool {
    true
}

impl TryFrom<RawRequestRules> for RequestRules {
    type Error = String;
    fn try_from(r: RawRequestRules) -> Result<Self, String> {
        HeaderRules::compile(Side::Request, r.set, r.add, r.remove).map(RequestRules)
    }
}

impl TryFrom<RawResponseRules> for ResponseRules {
    type Error = String;
    fn try_from(r: RawResponseRules) -> Result<Self, String> {
        Ok(ResponseRules {
            rules: HeaderRules::compile(Side::Response, r.set, r.add, r.remove)?,
            own_answers: r.own_answers,
        })
    }
}

fn name_of(side: Side, list: &str, raw: &str) -> Result<HeaderName, String> {
    let at = format!("{}.{list}", side.key());
    let name = HeaderName::from_bytes(raw.trim().as_bytes())
        .map_err(|_| format!("{at}: {raw:?} is not a header name"))?;
    if name.as_str().contains('_') {
        return Err(format!(
            "{at}: {raw:?}: header names with '_' are dropped by the gateway; use '-'"
        ));
    }
    let n = name.as_str();
    if FRAMING.contains(&n) {
        return Err(format!(
            "{at}: {raw:?} frames the message or belongs to one connection; the gateway alone writes it"
        ));
    }
    let asserted = match side {
        Side::Request => REQUEST_ASSERTED,
        Side::Response => RESPONSE_ASSERTED,
    };
    if asserted.contains(&n) {
        let hint = if n == "host" {
            " (use the route's `preserve_host`)"
        } else {
            ""
        };
        return Err(format!(
            "{at}: {raw:?} is asserted by the gateway; a header rule may not set or remove it{hint}"
        ));
    }
    Ok(name)
}

impl HeaderRules {
    fn compile(
        side: Side,
        set: BTreeMap<String, String>,
        add: BTreeMap<String, String>,
        remove: Vec<String>,
    ) -> Result<HeaderRules, String> {
        let key = side.key();
        let mut out = HeaderRules::default();
        for r in &remove {
            let n = name_of(side, "remove", r)?;
            if !out.remove.contains(&n) {
                out.remove.push(n);
            }
        }
        for (list, map, into) in [("set", set, &mut out.set), ("add", add, &mut out.add)] {
            for (k, v) in map {
                let n = name_of(side, list, &k)?;
                if out.remove.contains(&n) {
                    return Err(format!(
                        "{key}.{list}: {k:?} is also in `remove`; keep one of the two"
                    ));
                }
                if into.iter().any(|(m, _)| *m == n) {
                    return Err(format!(
                        "{key}.{list}: {k:?} is written twice (header names ignore case)"
                    ));
                }
                let t = Template::parse(&v, Allowed::HeaderRule)
                    .map_err(|e| format!("{key}.{list}.{k:?}: {e}"))?;
                into.push((n, t));
            }
        }
        Ok(out)
    }

    /// Whether a header `name` is removed or set by these rules.
    pub fn touches(&self, name: &HeaderName) -> bool {
        self.remove.contains(name)
            || self.set.iter().any(|(n, _)| n == name)
            || self.add.iter().any(|(n, _)| n == name)
    }

    /// Every header named by the rules.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> {
        self.remove
            .iter()
            .chain(self.set.iter().map(|(n, _)| n))
            .chain(self.add.iter().map(|(n, _)| n))
    }

    /// The rules for a request, in order, as plain edits: `(name, None)` removes, `(name,
    /// Some(value), false)` sets, `(name, Some(value), true)` adds (the pipeline turns them into
    /// upstream edits, see `crate::pipeline::Edits::push_rules`).
    pub fn each(&self, vars: &Vars<'_>, mut f: impl FnMut(&HeaderName, Option<HeaderValue>, bool)) {
        for n in &self.remove {
            f(n, None, false);
        }
        for (n, t) in &self.set {
            f(n, t.expand(vars).filter(|v| !v.is_empty()), false);
        }
        for (n, t) in &self.add {
            if let Some(v) = t.expand(vars).filter(|v| !v.is_empty()) {
                f(n, Some(v), true);
            }
        }
    }

    /// Applies the rules to a response's headers.
    /// Whether a rule's value uses `$jwt.CLAIM` (the request's token is then kept for it).
    pub fn uses_claims(&self) -> bool {
        self.set
            .iter()
            .chain(&self.add)
            .any(|(_, t)| t.uses_claims())
    }

    pub fn apply(&self, vars: &Vars<'_>, headers: &mut impl HeaderEdit) {
        for n in &self.remove {
            headers.remove(n);
        }
        for (n, t) in &self.set {
            match t.expand(vars).filter(|v| !v.is_empty()) {
                Some(v) => headers.insert(n, v),
                None => headers.remove(n),
            }
        }
        for (n, t) in &self.add {
            if let Some(v) = t.expand(vars).filter(|v| !v.is_empty()) {
                headers.append(n, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderMap;

    fn req(toml: &str) -> Result<RequestRules, String> {
        toml::from_str::<RequestRules>(toml).map_err(|e| e.to_string())
    }

    fn res(toml: &str) -> Result<ResponseRules, String> {
        toml::from_str::<ResponseRules>(toml).map_err(|e| e.to_string())
    }

    #[test]
    fn asserted_and_framing_headers_are_refused() {
        for h in [
            "X-Forwarded-For",
            "x-consumer",
            "X-Request-Id",
            "Host",
            "Content-Length",
        ] {
            let e = req(&format!("set = {{ \"{h}\" = \"x\" }}")).unwrap_err();
            assert!(e.contains("gateway"), "{h}: {e}");
        }
        for h in [
            "RateLimit",
            "Retry-After",
            "X-RateLimit-Remaining",
            "Transfer-Encoding",
        ] {
            let e = res(&format!("remove = [\"{h}\"]")).unwrap_err();
            assert!(e.contains("gateway"), "{h}: {e}");
        }
        // What the gateway asserts upstream is free on the response, and the other way round.
        assert!(res("set = { \"X-Consumer\" = \"x\" }").is_ok());
        assert!(req("set = { \"Retry-After\" = \"1\" }").is_ok());
    }

    #[test]
    fn values_are_checked() {
        let e = req("set = { \"X-Env\" = \"a\\r\\nX-Evil: 1\" }").unwrap_err();
        assert!(e.contains("line break"), "{e}");
        let e = req("add = { \"X-Env\" = \"$jwt\" }").unwrap_err();
        assert!(e.contains("$jwt.sub"), "{e}");
        assert!(req("add = { \"X-Env\" = \"$jwt.sub\" }").is_ok_and(|r| r.0.uses_claims()));
        let e = req("set = { \"X_Env\" = \"a\" }").unwrap_err();
        assert!(e.contains("'_'"), "{e}");
        let e = req("set = { \"X-A\" = \"a\" }\nremove = [\"x-a\"]").unwrap_err();
        assert!(e.contains("remove"), "{e}");
        let e = req("sett = {}").unwrap_err();
        assert!(e.contains("sett"), "{e}");
        let r = res("own_answers = false\nremove = [\"Server\"]").unwrap();
        assert!(!r.own_answers);
    }

    #[test]
    fn response_rules_apply_in_order() {
        let r = res("remove = [\"Server\"]\nset = { \"X-Route\" = \"$route\", \"X-C\" = \"$consumer\" }\nadd = { \"Vary\" = \"Accept\" }").unwrap();
        let mut h = HeaderMap::new();
        h.insert("server", "upstream".parse().unwrap());
        h.insert("x-c", "stale".parse().unwrap());
        h.insert("vary", "Origin".parse().unwrap());
        let v = Vars {
            route: "api",
            ..Vars::default()
        };
        r.rules.apply(&v, &mut h);
        assert!(!h.contains_key("server"));
        assert_eq!(h["x-route"], "api");
        assert!(!h.contains_key("x-c"), "an empty value removes");
        assert_eq!(h.get_all("vary").iter().count(), 2);
    }
}
