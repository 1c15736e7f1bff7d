//! Who a limit counts: its `subject` (one kind, or a list of parts counted as one combination),
//! the address prefixes it counts addresses by (`ipv4_prefix`, `ipv6_prefix`) and whom it
//! exempts (`exempt`). Parsed while deserialising, so a bad value is reported with its line.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The most parts a compound subject may have.
pub const MAX_PARTS: usize = 8;

/// Who a limit counts: one kind of subject, or a list of parts (`["header:x-tenant", "ip"]`)
/// counted as one combination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectSpec {
    /// The client address (its network, under the limit's prefixes).
    Ip,
    /// One count for the whole route.
    Global,
    Header(http::HeaderName),
    Query(String),
    /// The request method.
    Method,
    /// The normalised path.
    Path,
    /// The request's host (normalised: lower case, no port).
    Host,
    /// A capture of the route's `path_template` (`path:id` of `/users/{id}`).
    PathCapture(Box<str>),
    /// The `n`-th label of the request's host from the left (`host:1` of `acme.api.example.com`
    /// is `acme`), 1 to 16.
    HostLabel(u8),
    /// The label a route's `{name}.example.com` host captures (`host:tenant`).
    HostCapture(Box<str>),
    /// The value of one cookie.
    Cookie(String),
    /// The consumer's name (routes with `consumers = true`).
    Consumer,
    /// A claim of the request's verified token (`jwt:sub`, `jwt:org.id`): its path.
    Jwt(Box<[Box<str>]>),
    /// A string of the request's JSON body (`json:model`, `json:a.b`): its path of object keys.
    Json(Box<[Box<str>]>),
    /// A fact of the verified client certificate (`tls:fingerprint`, …).
    Tls(super::TlsPart),
    /// Several parts, one count per combination of their values (never nested, no `global`).
    Compound(Box<[SubjectSpec]>),
}

impl SubjectSpec {
    /// Parses one kind (`ip`, `header:NAME`, …).
    pub fn parse_one(s: &str) -> Result<SubjectSpec, String> {
        let bad = || {
            format!(
                "invalid subject {s:?}; expected ip, global, header:NAME, query:NAME, method, \
                 path, path:CAPTURE, host, host:N, host:CAPTURE, cookie:NAME, consumer, jwt:CLAIM, json:PATH or tls:fingerprint|subject_cn|san_dns|san_uri (or a list of them)"
            )
        };
        match s {
            "ip" => Ok(SubjectSpec::Ip),
            "global" => Ok(SubjectSpec::Global),
            "method" => Ok(SubjectSpec::Method),
            "path" => Ok(SubjectSpec::Path),
            "host" => Ok(SubjectSpec::Host),
            "consumer" => Ok(SubjectSpec::Consumer),
            other => {
                if let Some(name) = other.strip_prefix("path:") {
                    if super::route_match::capture_name_ok(name) {
                        Ok(SubjectSpec::PathCapture(name.into()))
                    } else {
                        Err(format!("invalid subject {s:?}; expected path:NAME, a capture of the route's path_template (/users/{{id}}: path:id)"))
                    }
                } else if let Some(name) = other.strip_prefix("host:") {
                    match name.parse::<u8>() {
                        Ok(n) if (1..=16).contains(&n) && name == n.to_string() => Ok(SubjectSpec::HostLabel(n)),
                        Ok(_) => Err(format!("invalid subject {s:?}; host:N counts the host's labels from the left, 1 to 16")),
                        Err(_) if super::route_match::capture_name_ok(name) => Ok(SubjectSpec::HostCapture(name.into())),
                        Err(_) => Err(format!("invalid subject {s:?}; expected host:N (a label of the host, 1 = leftmost) or host:NAME (the route's {{NAME}}.example.com)")),
                    }
                } else if let Some(name) = other.strip_prefix("header:") {
                    http::HeaderName::from_bytes(name.trim().as_bytes())
                        .map(SubjectSpec::Header)
                        .map_err(|_| bad())
                } else if let Some(name) = other.strip_prefix("query:") {
                    if name.is_empty() {
                        Err(bad())
                    } else {
                        Ok(SubjectSpec::Query(name.to_owned()))
                    }
                } else if let Some(part) = other.strip_prefix("tls:") {
                    super::TlsPart::parse(part)
                        .map(SubjectSpec::Tls)
                        .ok_or_else(bad)
                } else if let Some(path) = other.strip_prefix("jwt:") {
                    let parts: Vec<Box<str>> = path.split('.').map(Box::from).collect();
                    if path.is_empty() || parts.len() > 8 || parts.iter().any(|p| p.is_empty()) {
                        Err(format!(
                            "invalid subject {s:?}; expected jwt:CLAIM (a dotted path for nested claims, at most 8 deep)"
                        ))
                    } else {
                        Ok(SubjectSpec::Jwt(parts.into_boxed_slice()))
                    }
                } else if let Some(path) = other.strip_prefix("json:") {
                    super::cost_from::json_path(path)
                        .map(SubjectSpec::Json)
                        .ok_or_else(|| {
                            format!(
                                "invalid subject {s:?}; expected json:PATH (a dotted path of up to 16 object keys into the request's JSON body, e.g. json:model)"
                            )
                        })
                } else if let Some(name) = other.strip_prefix("cookie:") {
                    // A cookie name is an RFC 6265 token.
                    if name.is_empty()
                        || !name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
                    {
                        Err(bad())
                    } else {
                        Ok(SubjectSpec::Cookie(name.to_owned()))
                    }
                } else {
                    Err(bad())
                }
            }
        }
    }

    /// A list of parts: at least one, at most [`MAX_PARTS`], no `global`, no repeats. One part
    /// is that kind alone.
    pub fn compound(parts: Vec<SubjectSpec>) -> Result<SubjectSpec, String> {
        if parts.is_empty() {
            return Err("a subject list needs at least one part".to_owned());
        }
        if parts.len() > MAX_PARTS {
            return Err(format!("a subject list has at most {MAX_PARTS} parts"));
        }
        for (i, p) in parts.iter().enumerate() {
            if *p == SubjectSpec::Global {
                return Err(
                    "`global` cannot be a part of a subject list (it is the same for every request)"
                        .to_owned(),
                );
            }
            if parts[..i].contains(p) {
                return Err(format!("the subject list names {p} twice"));
            }
        }
        let mut parts = parts;
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            SubjectSpec::Compound(parts.into_boxed_slice())
        })
    }

    /// The parts: a compound subject's, or this kind alone.
    pub fn parts(&self) -> &[SubjectSpec] {
        match self {
            SubjectSpec::Compound(p) => p,
            one => std::slice::from_ref(one),
        }
    }

    /// Whether a request may lack this part (or, for a list, one of them): `on_missing` applies.
    pub fn can_be_missing(&self) -> bool {
        self.parts().iter().any(|p| {
            matches!(
                p,
                SubjectSpec::Header(_)
                    | SubjectSpec::Query(_)
                    | SubjectSpec::Cookie(_)
                    | SubjectSpec::Consumer
                    | SubjectSpec::Host
                    | SubjectSpec::PathCapture(_)
                    | SubjectSpec::HostLabel(_)
                    | SubjectSpec::HostCapture(_)
                    | SubjectSpec::Jwt(_)
                    | SubjectSpec::Json(_)
                    | SubjectSpec::Tls(_)
            )
        })
    }

    /// The paths of the parts read from the request's JSON body (`json:PATH`).
    pub fn json_paths(&self) -> impl Iterator<Item = &[Box<str>]> {
        self.parts().iter().filter_map(|p| match p {
            SubjectSpec::Json(path) => Some(&**path),
            _ => None,
        })
    }

    /// Whether a part is a token's claim.
    pub fn needs_claims(&self) -> bool {
        self.parts()
            .iter()
            .any(|p| matches!(p, SubjectSpec::Jwt(_)))
    }

    /// Whether a part is read from the client certificate (`tls:…`).
    pub fn needs_client_cert(&self) -> bool {
        self.parts()
            .iter()
            .any(|p| matches!(p, SubjectSpec::Tls(_)))
    }

    /// The route captures the parts name: `(true, name)` for a path capture, `(false, name)`
    /// for a host capture.
    pub fn captures(&self) -> impl Iterator<Item = (bool, &str)> {
        self.parts().iter().filter_map(|p| match p {
            SubjectSpec::PathCapture(n) => Some((true, &**n)),
            SubjectSpec::HostCapture(n) => Some((false, &**n)),
            _ => None,
        })
    }

    /// Whether a part is the consumer.
    pub fn needs_consumer(&self) -> bool {
        self.parts().contains(&SubjectSpec::Consumer)
    }

    /// Whether this is a list of parts.
    pub fn is_compound(&self) -> bool {
        matches!(self, SubjectSpec::Compound(_))
    }
}

impl TryFrom<String> for SubjectSpec {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        SubjectSpec::parse_one(&s)
    }
}

impl<'de> Deserialize<'de> for SubjectSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SubjectSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a subject (\"ip\", \"header:NAME\", …) or a list of them")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<SubjectSpec, E> {
                SubjectSpec::parse_one(s).map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SubjectSpec, A::Error> {
                let mut parts = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    if parts.len() >= MAX_PARTS {
                        return Err(de::Error::custom(format!(
                            "a subject list has at most {MAX_PARTS} parts"
                        )));
                    }
                    parts.push(SubjectSpec::parse_one(&s).map_err(de::Error::custom)?);
                }
                SubjectSpec::compound(parts).map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl fmt::Display for SubjectSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectSpec::Ip => f.write_str("ip"),
            SubjectSpec::Global => f.write_str("global"),
            SubjectSpec::Header(h) => write!(f, "header:{h}"),
            SubjectSpec::Query(q) => write!(f, "query:{q}"),
            SubjectSpec::Method => f.write_str("method"),
            SubjectSpec::Path => f.write_str("path"),
            SubjectSpec::Host => f.write_str("host"),
            SubjectSpec::PathCapture(n) => write!(f, "path:{n}"),
            SubjectSpec::HostLabel(n) => write!(f, "host:{n}"),
            SubjectSpec::HostCapture(n) => write!(f, "host:{n}"),
            SubjectSpec::Cookie(c) => write!(f, "cookie:{c}"),
            SubjectSpec::Consumer => f.write_str("consumer"),
            SubjectSpec::Jwt(path) => write!(f, "jwt:{}", path.join(".")),
            SubjectSpec::Json(path) => write!(f, "json:{}", path.join(".")),
            SubjectSpec::Tls(part) => write!(f, "tls:{}", part.as_str()),
            SubjectSpec::Compound(parts) => {
                f.write_str("[")?;
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{p}")?;
                }
                f.write_str("]")
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// An IPv4 prefix length (0–32), as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct Ipv4Prefix(pub u8);

impl TryFrom<i64> for Ipv4Prefix {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, String> {
        u8::try_from(n)
            .ok()
            .filter(|n| *n <= 32)
            .map(Ipv4Prefix)
            .ok_or_else(|| format!("invalid IPv4 prefix length {n}; expected 0 to 32"))
    }
}

/// An IPv6 prefix length (0–128), as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct Ipv6Prefix(pub u8);

impl TryFrom<i64> for Ipv6Prefix {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, String> {
        u8::try_from(n)
            .ok()
            .filter(|n| *n <= 128)
            .map(Ipv6Prefix)
            .ok_or_else(|| format!("invalid IPv6 prefix length {n}; expected 0 to 128"))
    }
}

/// The networks addresses are counted by: an IPv4 client by its `/v4`, an IPv6 one by its
/// `/v6` (an IPv4-mapped IPv6 address is IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefixes {
    pub v4: u8,
    pub v6: u8,
}

/// `[server] ipv4_prefix`'s default: each IPv4 address is its own subject.
pub const DEFAULT_IPV4_PREFIX: u8 = 32;
/// `[server] ipv6_prefix`'s default: a /64, what one host (or one customer's LAN) is given.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes {
            v4: DEFAULT_IPV4_PREFIX,
            v6: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl Prefixes {
    /// The network `ip` is counted in.
    pub fn network(&self, ip: IpAddr) -> IpNet {
        let ip = ip.to_canonical();
        let len = match ip {
            IpAddr::V4(_) => self.v4,
            IpAddr::V6(_) => self.v6,
        };
        // The lengths are validated (0–32, 0–128), so this never falls back.
        IpNet::new(ip, len).map_or_else(|_| IpNet::from(ip), |n| n.trunc())
    }
}

/// `[server] real_ip_header`: a header a trusted proxy names the client in (`CF-Connecting-IP`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RealIpHeader(pub http::HeaderName);

impl TryFrom<String> for RealIpHeader {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let name = super::values::readable_header_name(&s)?;
        if matches!(name.as_str(), "x-forwarded-for" | "forwarded") {
            return Err(format!(
                "{s:?} is read anyway under trusted_proxies; real_ip_header names another header"
            ));
        }
        Ok(RealIpHeader(name))
    }
}

/// `[server] forwarded_header`: the one header family a trusted proxy names the client in
/// (issue #34 item 17). The other family never decides the address: a client can add either.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For` (nginx's, HAProxy's, every cloud balancer's).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded`'s `for=`.
    Forwarded,
}

impl TryFrom<String> for ForwardedHeader {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("x-forwarded-for") {
            Ok(ForwardedHeader::XForwardedFor)
        } else if s.eq_ignore_ascii_case("forwarded") {
            Ok(ForwardedHeader::Forwarded)
        } else {
            Err(format!(
                "forwarded_header {s:?}: expected \"X-Forwarded-For\" or \"Forwarded\""
            ))
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// One `exempt` entry as written: a CIDR or address, or `consumer:NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ExemptEntry {
    Net(IpNet),
    Consumer(String),
}

impl TryFrom<String> for ExemptEntry {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if let Some(name) = s.trim().strip_prefix("consumer:") {
            if name.is_empty() {
                return Err(format!(
                    "invalid exemption {s:?}: consumer:NAME needs a name"
                ));
            }
            return Ok(ExemptEntry::Consumer(name.to_owned()));
        }
        super::values::Cidr::try_from(s.clone())
            .map(|c| ExemptEntry::Net(c.0))
            .map_err(|_| {
                format!(
                    "invalid exemption {s:?}; expected a CIDR (\"10.0.0.0/8\"), an address or consumer:NAME"
                )
            })
    }
}

/// Whom a limit does not apply to: client addresses in these networks, these consumers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exempt {
    pub nets: Vec<IpNet>,
    pub consumers: Vec<Box<str>>,
}

impl Exempt {
    pub fn from_entries(entries: Vec<ExemptEntry>) -> Exempt {
        let mut e = Exempt::default();
        for x in entries {
            match x {
                ExemptEntry::Net(n) => e.nets.push(n),
                ExemptEntry::Consumer(c) => e.consumers.push(c.into_boxed_str()),
            }
        }
        e
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.consumers.is_empty()
    }

    /// Whether a request from `client` (by `consumer`) is exempt. A client whose address could
    /// not be derived (`derived == false`: its `ip` is the proxy's) is in no network (fail
    /// closed, issue #34 item 15).
    pub fn covers(&self, client: IpAddr, derived: bool, consumer: Option<&str>) -> bool {
        (derived && !self.nets.is_empty() && self.nets.iter().any(|n| n.contains(&client)))
            || consumer.is_some_and(|c| self.consumers.iter().any(|x| &**x == c))
    }
}

/// A route's access lists: a client in `deny` is refused; with `allow`, so is one outside it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    pub allow: Option<Vec<IpNet>>,
    pub deny: Vec<IpNet>,
}

impl AccessList {
    /// Whether a request from `client` may use the route.
    pub fn admits(&self, client: IpAddr) -> bool {
        self.admits_client(client, true)
    }

    /// Whether a request from `client` may use the route, when its address was `derived` or
    /// not: an address that could not be derived (its `ip` is then the trusted proxy's) is
    /// inside no `allow` list (fail closed, issue #34 item 15); `deny` still sees the proxy.
    pub fn admits_client(&self, client: IpAddr, derived: bool) -> bool {
        if self.deny.iter().any(|n| n.contains(&client)) {
            return false;
        }
        self.allow
            .as_ref()
            .is_none_or(|a| derived && a.iter().any(|n| n.contains(&client)))
    }

    pub fn is_open(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_mask_and_map_ipv4() {
        let p = Prefixes::default();
        assert_eq!(p.network(ip("1.2.3.4")).to_string(), "1.2.3.4/32");
        assert_eq!(
            p.network(ip("2001:db8:1:2:3:4:5:6")).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(p.network(ip("::ffff:1.2.3.4")).to_string(), "1.2.3.4/32");
        let p = Prefixes { v4: 24, v6: 128 };
        assert_eq!(p.network(ip("1.2.3.4")).to_string(), "1.2.3.0/24");
        assert_eq!(p.network(ip("2001:db8::7")).to_string(), "2001:db8::7/128");
    }

    #[test]
    fn compound_rules() {
        let p = |s: &str| SubjectSpec::parse_one(s).unwrap();
        assert_eq!(SubjectSpec::compound(vec![p("ip")]), Ok(SubjectSpec::Ip));
        assert!(SubjectSpec::compound(vec![]).is_err());
        assert!(SubjectSpec::compound(vec![p("ip"), p("global")]).is_err());
        assert!(SubjectSpec::compound(vec![p("ip"), p("ip")]).is_err());
        let c = SubjectSpec::compound(vec![p("header:X-Tenant"), p("ip")]).unwrap();
        assert_eq!(c.to_string(), "[header:x-tenant, ip]");
        assert!(c.can_be_missing());
        assert!(!SubjectSpec::compound(vec![p("method"), p("ip")])
            .unwrap()
            .can_be_missing());
        assert!(SubjectSpec::parse_one("cookie:a b").is_err());
        let j = SubjectSpec::compound(vec![p("consumer"), p("json:model")]).unwrap();
        assert_eq!(j.to_string(), "[consumer, json:model]");
        assert!(j.can_be_missing());
        assert_eq!(
            p("json:a.b").json_paths().collect::<Vec<_>>(),
            vec![&[Box::from("a"), Box::from("b")][..]]
        );
        for bad in ["json:", "json:a..b", "json:.a"] {
            assert!(SubjectSpec::parse_one(bad).is_err(), "{bad}");
        }
        assert_eq!(p("cookie:sid"), SubjectSpec::Cookie("sid".into()));
    }

    #[test]
    fn access_lists() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        let a = AccessList {
            allow: Some(vec![n("10.0.0.0/8")]),
            deny: vec![n("10.9.0.0/16")],
        };
        assert!(a.admits(ip("10.1.1.1")));
        assert!(!a.admits(ip("10.9.1.1")));
        assert!(!a.admits(ip("192.0.2.1")));
        assert!(AccessList::default().admits(ip("192.0.2.1")));
    }
}
