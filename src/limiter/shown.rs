//! A subject's parts as `/-/top`, the access log and usage show them: plain data, kept by the
//! top list and the seen keys here, made from a request by `crate::subject::shown_parts` and
//! `counted_parts` (which know the request and which values are secrets).

/// How `/-/top` and the access log show one part of a denied subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownPart {
    /// The part as configured (`header:x-tenant`, `ip`).
    pub part: Box<str>,
    pub value: Shown,
}

/// A part's value as shown: plain for what is no secret (a network, the method, host, path, a
/// consumer's name), the first 8 hex digits of its hash for what may be (header, query, cookie
/// values), or the client's network in the place of a missing part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    Plain(Box<str>),
    Key(Box<str>),
    MissingIp(Box<str>),
}

impl ShownPart {
    /// As a JSON object: `{"part": .., "value"|"key"|"ip": ..}`.
    pub fn json(&self) -> serde_json::Value {
        let (k, v) = match &self.value {
            Shown::Plain(v) => ("value", v),
            Shown::Key(v) => ("key", v),
            Shown::MissingIp(v) => ("ip", v),
        };
        serde_json::json!({ "part": &*self.part, k: &**v })
    }
}
