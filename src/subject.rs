//! Who is calling: the client address (behind trusted proxies) and each limit's subject.
//!
//! `X-Forwarded-For` (or, with `forwarded_header = "forwarded"`, RFC 7239 `Forwarded` — one
//! family per listener, the other never read) is believed only when the TCP peer is a trusted
//! proxy, and then walked from the right, skipping trusted proxies, as nginx's
//! `real_ip_recursive` does: the first untrusted address is the client. Without trusted proxies
//! the headers are ignored, so a spoofed header never buys a fresh bucket. A hop the walk
//! reaches that is not an address, or an oversized header, leaves the client *underived*: counted
//! as the proxy, but inside no allow list or exemption (fail closed).

use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderName, COOKIE, FORWARDED};
use ipnet::IpNet;
use percent_encoding::percent_decode_str;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::config::{ForwardedHeader, OnMissing, Prefixes, SubjectSpec};
use crate::consumers::Consumer;
use crate::head::{header_str, RequestHead};
use crate::limiter::SubjectDigest;

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// More forwarded hops than this, or more bytes, and the headers are not believed.
const MAX_HOPS: usize = 64;
const MAX_HEADER_BYTES: usize = 8 * 1024;

pub fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|n| n.contains(&ip))
}

/// Parses one forwarded hop: `192.0.2.1`, `2001:db8::1`, `192.0.2.1:8080`, `[2001:db8::1]:80`,
/// optionally quoted (RFC 7239 `for=` values).
fn parse_hop(s: &str) -> Option<IpAddr> {
    let s = s.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip().to_canonical());
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// What a trusted proxy's forwarded header says of the hops before it.
enum Hops<'h> {
    /// The header is absent: the request is the proxy's own.
    Absent,
    /// Too many hops or bytes, or no hop at all: nothing can be derived.
    Bad,
    /// The hops as written, left to right (each parsed only when the walk reaches it).
    List(SmallVec<[&'h str; 4]>),
}

/// The hops of the one header family the listener believes: `X-Forwarded-For`'s entries, or
/// `Forwarded`'s `for=` values (RFC 7239; an element without `for=` names no hop).
fn forwarded_hops(head: &impl RequestHead, family: ForwardedHeader) -> Hops<'_> {
    let name = match family {
        ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
        ForwardedHeader::Forwarded => &FORWARDED,
    };
    let mut hops = SmallVec::new();
    let mut bytes = 0usize;
    let mut any = false;
    for v in head.header_values(name) {
        any = true;
        bytes = bytes.saturating_add(v.len());
        if bytes > MAX_HEADER_BYTES {
            return Hops::Bad;
        }
        let Some(v) = header_str(v) else {
            return Hops::Bad;
        };
        for element in v.split(',') {
            let hop = match family {
                ForwardedHeader::XForwardedFor => Some(element),
                ForwardedHeader::Forwarded => element.split(';').find_map(|pair| {
                    let (k, v) = pair.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("for").then_some(v)
                }),
            };
            if let Some(hop) = hop {
                hops.push(hop);
                if hops.len() > MAX_HOPS {
                    return Hops::Bad;
                }
            }
        }
    }
    match (any, hops.is_empty()) {
        (false, _) => Hops::Absent,
        (true, true) => Hops::Bad,
        (true, false) => Hops::List(hops),
    }
}

/// The client address of a request, and whether it was derived: `false` when a trusted proxy
/// sent a forwarded header the address cannot be read from (a junk or `unknown` hop, more
/// than 64 hops or 8 KiB), in which case `ip` is the proxy's and the client matches no
/// `allow` list or exemption (fail closed, issue #34 item 15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    pub ip: IpAddr,
    pub derived: bool,
}

/// The client address of a request from `peer` (`X-Forwarded-For` believed from `trusted`).
pub fn client_ip(peer: IpAddr, head: &impl RequestHead, trusted: &[IpNet]) -> IpAddr {
    client_ip_with(peer, head, trusted, None)
}

/// [`client_of`] with `X-Forwarded-For`, the address alone.
pub fn client_ip_with(
    peer: IpAddr,
    head: &impl RequestHead,
    trusted: &[IpNet],
    real_ip_header: Option<&HeaderName>,
) -> IpAddr {
    client_of(
        peer,
        head,
        trusted,
        real_ip_header,
        ForwardedHeader::XForwardedFor,
    )
    .ip
}

/// The client of a request from `peer`. From a peer outside `trusted`, the peer. From a trusted
/// one: with `[server] real_ip_header`, that header's one address (`CF-Connecting-IP`); without
/// it (absent, sent twice, not an address), the hops of the listener's one header `family`
/// walked from the right, skipping trusted proxies — the first untrusted one is the client. A
/// hop the walk reaches that is not an address makes the client underived.
pub fn client_of(
    peer: IpAddr,
    head: &impl RequestHead,
    trusted: &[IpNet],
    real_ip_header: Option<&HeaderName>,
    family: ForwardedHeader,
) -> Client {
    let peer = peer.to_canonical();
    let derived = |ip| Client { ip, derived: true };
    if trusted.is_empty() || !is_trusted(peer, trusted) {
        return derived(peer);
    }
    if let Some(name) = real_ip_header {
        let mut values = head.header_values(name);
        if let (Some(v), None) = (values.next(), values.next()) {
            if let Some(ip) = header_str(v).filter(|v| v.len() <= 64).and_then(parse_hop) {
                return derived(ip);
            }
        }
    }
    let hops = match forwarded_hops(head, family) {
        Hops::Absent => return derived(peer),
        Hops::Bad => {
            return Client {
                ip: peer,
                derived: false,
            }
        }
        Hops::List(hops) => hops,
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = parse_hop(hop) else {
            return Client {
                ip: peer,
                derived: false,
            };
        };
        client = ip;
        if !is_trusted(ip, trusted) {
            break;
        }
    }
    derived(client)
}

/// The digest of an address subject.
pub fn ip_digest(ip: IpAddr) -> SubjectDigest {
    match ip {
        IpAddr::V4(v4) => SubjectDigest::of(b'i', &v4.octets()),
        IpAddr::V6(v6) => SubjectDigest::of(b'i', &v6.octets()),
    }
}

/// Whether `pair` (`k=v` or `k`) is parameter `name` as some upstream would read it: names
/// percent-decoded and compared in any ASCII case (many frameworks ignore case).
fn names_param(pair: &str, name: &str) -> bool {
    let k = pair.split_once('=').map_or(pair, |(k, _)| k);
    percent_decode_str(k)
        .decode_utf8()
        .is_ok_and(|decoded| decoded.eq_ignore_ascii_case(name))
}

/// The parameters of `query`, split on `&` and on `;` (which some upstreams also read as a
/// separator, RFC 1866 §8.2.1): a key behind either is seen.
pub(crate) fn query_pairs(query: &str) -> impl Iterator<Item = &str> {
    query.split(['&', ';'])
}

/// The values of query parameter `name` in `query`, in every spelling an upstream might read as
/// it: after `&` or `;`, the name percent-decoded and in any ASCII case.
pub(crate) fn query_params<'q>(
    query: &'q str,
    name: &'q str,
) -> impl Iterator<Item = &'q str> + 'q {
    query_pairs(query)
        .filter(move |pair| names_param(pair, name))
        .map(|pair| pair.split_once('=').map_or("", |(_, v)| v))
}

/// `query` without parameter `name` in any of the spellings [`query_params`] reads, the other
/// parameters and their separators kept as written; `None` when nothing is left.
pub fn strip_query_param(query: &str, name: &str) -> Option<String> {
    let mut out = String::with_capacity(query.len());
    let mut start = 0;
    for end in query
        .match_indices(['&', ';'])
        .map(|(i, _)| i)
        .chain(std::iter::once(query.len()))
    {
        let pair = query.get(start..end).unwrap_or("");
        if !pair.is_empty() && !names_param(pair, name) {
            if !out.is_empty() {
                // The separator before this pair as the client wrote it (`&` if it was first).
                let sep = query.get(start.saturating_sub(1)..start).unwrap_or("&");
                out.push_str(if sep == ";" { ";" } else { "&" });
            }
            out.push_str(pair);
        }
        start = end + 1;
    }
    (!out.is_empty()).then_some(out)
}

/// A request that carries the header or query parameter a limit counts by more than once.
///
/// Such a request is refused rather than charged to one of its values: the upstream may read
/// another one, which would give it the use of a key whose budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedSubject;

/// A limit's subject for one request: `Some(digest)`, `None` when the request does not carry
/// the header or query parameter the limit counts by, and an error when it carries it twice.
/// (The single kinds of before compound subjects; [`resolve`] handles every kind.)
pub fn subject_of(
    spec: &SubjectSpec,
    head: &impl RequestHead,
    client: IpAddr,
) -> Result<Option<SubjectDigest>, RepeatedSubject> {
    let facts = Facts {
        client,
        derived: true,
        host: None,
        path: head.path(),
        consumer: None,
        claims: None,
        body: None,
        peer_trusted: false,
        peer_cert: None,
    };
    match resolve(
        spec,
        OnMissing::Reject,
        Prefixes { v4: 32, v6: 128 },
        head,
        &facts,
    ) {
        Ok(r) => Ok(Some(r.digest)),
        Err(SubjectError::Repeated(_)) => Err(RepeatedSubject),
        Err(SubjectError::Missing(_) | SubjectError::MissingInBody(_)) => Ok(None),
    }
}

/// What the pipeline knows of a request's caller when its limits are checked, worked out once.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The client address (behind trusted proxies).
    pub client: IpAddr,
    /// Whether `client` was derived (see [`Client`]): an underived one is in no exemption.
    pub derived: bool,
    /// The host, normalised (lower case, no port).
    pub host: Option<&'a str>,
    /// The normalised path.
    pub path: &'a str,
    /// The consumer (routes with `consumers = true`).
    pub consumer: Option<&'a Consumer>,
    /// The claims of the request's verified token (routes with `jwt`).
    pub claims: Option<&'a serde_json::Value>,
    /// What the request's JSON body holds at the route's `json:` paths (routes that read it;
    /// `None`: not read, every `json:` part missing).
    pub body: Option<&'a crate::json_fields::Fields<'a>>,
    /// Whether the connection's peer is in `[server] trusted_proxies`: only then does a
    /// `limit_from = "header:…"` read its header.
    pub peer_trusted: bool,
    /// The connection's verified client certificate (`tls:…` parts).
    pub peer_cert: Option<&'a crate::tls::peer::PeerCert>,
}

/// The value of the claim at `path` (`["org", "id"]`) as bytes: a string as it is, a number as
/// written in JSON; `None` when it is missing, empty, or of another type (an object, a list, a
/// boolean, null), which is then a missing part.
pub fn claim_bytes<'c>(
    claims: &'c serde_json::Value,
    path: &[Box<str>],
) -> Option<std::borrow::Cow<'c, [u8]>> {
    let mut v = claims;
    for key in path {
        v = v.as_object()?.get(&**key)?;
    }
    match v {
        serde_json::Value::String(s) if !s.is_empty() => {
            Some(std::borrow::Cow::Borrowed(s.as_bytes()))
        }
        serde_json::Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string().into_bytes())),
        _ => None,
    }
}

/// Why a request has no subject for a limit: a part it must carry is missing (under
/// `on_missing = "reject"`; a `json:` part apart: 400 rather than 401, the body is malformed
/// for the route rather than its caller unknown), or a part is sent twice. Each names the part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectError {
    Missing(String),
    MissingInBody(String),
    Repeated(String),
}

/// A limit's subject for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub digest: SubjectDigest,
    /// Whether the subject is the client address alone (an `ip` subject, or a missing single
    /// part counted by address).
    pub by_ip: bool,
}

/// The digest of the network `ip` is counted in under `prefixes`. A whole IPv4 address has the
/// digest it always had (so keys survive an upgrade); a network adds its length.
pub fn ip_digest_in(ip: IpAddr, prefixes: Prefixes) -> SubjectDigest {
    let net = prefixes.network(ip);
    let slot = memo_slot(net);
    IP_MEMO.with(|memo| {
        let cell = &memo[slot];
        if let Some((n, d)) = cell.get() {
            if n == net {
                return d;
            }
        }
        let d = hash_network(net);
        cell.set(Some((net, d)));
        d
    })
}

/// How many networks' digests each thread remembers (direct-mapped: a network has one slot).
const MEMO_SLOTS: usize = 64;

thread_local! {
    /// The digests this thread computed last, one per slot: the requests of a keep-alive
    /// connection come from one address, and a SHA-256 per request is most of a subject's cost.
    /// A digest is a pure function of the network, so a remembered one is exact.
    static IP_MEMO: [Cell<Option<(IpNet, SubjectDigest)>>; MEMO_SLOTS] =
        const { [const { Cell::new(None) }; MEMO_SLOTS] };
}

/// The memo slot of a network: its address bits mixed (Fibonacci hashing), its top six bits.
fn memo_slot(net: IpNet) -> usize {
    let bits: u64 = match net.addr() {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let v = u128::from(v6);
            (v as u64) ^ ((v >> 64) as u64)
        }
    };
    let mixed = (bits ^ u64::from(net.prefix_len())).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 58) as usize % MEMO_SLOTS
}

fn hash_network(net: IpNet) -> SubjectDigest {
    match net.addr() {
        IpAddr::V4(v4) if net.prefix_len() == 32 => SubjectDigest::of(b'i', &v4.octets()),
        IpAddr::V6(v6) if net.prefix_len() == 128 => SubjectDigest::of(b'i', &v6.octets()),
        _ => {
            let mut b: SmallVec<[u8; 17]> = SmallVec::new();
            push_ip(&mut b, net.addr());
            b.push(net.prefix_len());
            SubjectDigest::of(b'i', &b)
        }
    }
}

fn push_ip(out: &mut SmallVec<[u8; 17]>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
    }
}

/// The kind byte a part is hashed under (single subjects keep the bytes they always had).
fn kind_byte(part: &SubjectSpec) -> u8 {
    match part {
        SubjectSpec::Ip => b'i',
        SubjectSpec::Global => b'g',
        SubjectSpec::Header(_) => b'h',
        SubjectSpec::Query(_) => b'q',
        SubjectSpec::Method => b'M',
        SubjectSpec::Path => b'p',
        SubjectSpec::Host => b'o',
        SubjectSpec::Cookie(_) => b'k',
        SubjectSpec::Consumer => b'u',
        SubjectSpec::Jwt(_) => b'j',
        SubjectSpec::Json(_) => b'b',
        SubjectSpec::Tls(_) => b't',
        SubjectSpec::Compound(_) => b'+',
    }
}

/// One part's value in a request: `None` when the request lacks it.
fn part_value<'h>(
    part: &'h SubjectSpec,
    head: &'h impl RequestHead,
    facts: &Facts<'h>,
    prefixes: Prefixes,
) -> Result<Option<std::borrow::Cow<'h, [u8]>>, SubjectError> {
    use std::borrow::Cow;
    let repeated = || SubjectError::Repeated(part.to_string());
    Ok(match part {
        SubjectSpec::Ip => {
            let net = prefixes.network(facts.client);
            let mut b: SmallVec<[u8; 17]> = SmallVec::new();
            push_ip(&mut b, net.addr());
            b.push(net.prefix_len());
            Some(Cow::Owned(b.to_vec()))
        }
        SubjectSpec::Global => Some(Cow::Borrowed(b"")),
        SubjectSpec::Header(name) => one_header(head, name)
            .map_err(|_| repeated())?
            .map(Cow::Borrowed),
        SubjectSpec::Query(name) => one_query_value(head.query(), name).map_err(|_| repeated())?,
        SubjectSpec::Method => Some(Cow::Borrowed(head.method().as_str().as_bytes())),
        SubjectSpec::Path => Some(Cow::Borrowed(facts.path.as_bytes())),
        SubjectSpec::Host => facts.host.map(|h| Cow::Borrowed(h.as_bytes())),
        SubjectSpec::Cookie(name) => one_cookie(head, name)
            .map_err(|_| repeated())?
            .map(Cow::Borrowed),
        SubjectSpec::Consumer => facts.consumer.map(|c| Cow::Owned(c.subject.0.to_vec())),
        SubjectSpec::Jwt(path) => facts.claims.and_then(|c| claim_bytes(c, path)),
        // A string only (a number, a boolean, an object is no model name): see `json_fields`.
        SubjectSpec::Json(path) => facts
            .body
            .and_then(|b| b.text(path))
            .map(|t| Cow::Borrowed(t.as_bytes())),
        SubjectSpec::Tls(p) => crate::tls::subject::part(*p, facts.peer_cert).map(Cow::Borrowed),
        SubjectSpec::Compound(_) => None,
    })
}

/// A limit's subject for a request: each part's value as the request gives it, hashed together
/// (one count per combination). A missing part counts the client address in its place
/// (`on_missing = "ip"`) or refuses the request (`"reject"`); a part sent twice refuses it.
pub fn resolve<'a>(
    spec: &'a SubjectSpec,
    on_missing: OnMissing,
    prefixes: Prefixes,
    head: &'a impl RequestHead,
    facts: &Facts<'a>,
) -> Result<Resolved, SubjectError> {
    let fallback = |part: &SubjectSpec| match on_missing {
        OnMissing::Reject if matches!(part, SubjectSpec::Json(_)) => {
            Err(SubjectError::MissingInBody(part.to_string()))
        }
        OnMissing::Reject => Err(SubjectError::Missing(part.to_string())),
        OnMissing::Ip => Ok(ip_digest_in(facts.client, prefixes)),
    };
    match spec {
        SubjectSpec::Ip => Ok(Resolved {
            digest: ip_digest_in(facts.client, prefixes),
            by_ip: true,
        }),
        // One subject for every request: its digest is hashed once per process.
        SubjectSpec::Global => {
            static GLOBAL: std::sync::OnceLock<SubjectDigest> = std::sync::OnceLock::new();
            Ok(Resolved {
                digest: *GLOBAL.get_or_init(|| SubjectDigest::of(kind_byte(spec), b"")),
                by_ip: false,
            })
        }
        SubjectSpec::Consumer => match facts.consumer {
            // The consumer's own digest: what its plan's limits count by too.
            Some(c) => Ok(Resolved {
                digest: c.subject,
                by_ip: false,
            }),
            None => fallback(spec).map(|digest| Resolved {
                digest,
                by_ip: true,
            }),
        },
        SubjectSpec::Compound(parts) => {
            let mut h = Sha256::new();
            h.update([b'+']);
            for part in parts.iter() {
                match part_value(part, head, facts, prefixes)? {
                    Some(v) => {
                        h.update([kind_byte(part)]);
                        h.update(u32::try_from(v.len()).unwrap_or(u32::MAX).to_be_bytes());
                        h.update(&v);
                    }
                    None => {
                        let d = fallback(part)?;
                        // The address in the missing part's place, marked as such.
                        h.update([b'm', kind_byte(part)]);
                        h.update(d.0);
                    }
                }
            }
            let full = h.finalize();
            let mut out = [0u8; 16];
            out.copy_from_slice(&full[..16]);
            Ok(Resolved {
                digest: SubjectDigest(out),
                by_ip: false,
            })
        }
        one => match part_value(one, head, facts, prefixes)? {
            Some(v) => Ok(Resolved {
                digest: SubjectDigest::of(kind_byte(one), &v),
                by_ip: false,
            }),
            None => fallback(one).map(|digest| Resolved {
                digest,
                by_ip: true,
            }),
        },
    }
}

/// The most bytes of a plain part (a path) shown.
const MAX_SHOWN: usize = 200;

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

/// The parts of a request's subject as shown (only called for a denied or logged request).
pub fn shown_parts<'a>(
    spec: &'a SubjectSpec,
    prefixes: Prefixes,
    head: &'a impl RequestHead,
    facts: &Facts<'a>,
) -> Vec<ShownPart> {
    spec.parts()
        .iter()
        .map(|part| {
            let net = || prefixes.network(facts.client).to_string().into_boxed_str();
            let value = match part {
                SubjectSpec::Ip => Shown::Plain(net()),
                SubjectSpec::Consumer => match facts.consumer {
                    Some(c) => Shown::Plain(c.name.clone()),
                    None => Shown::MissingIp(net()),
                },
                SubjectSpec::Method | SubjectSpec::Path | SubjectSpec::Host => {
                    match part_value(part, head, facts, prefixes) {
                        Ok(Some(v)) => {
                            // Bounded: /-/top keeps 64 of these per limit.
                            let mut t =
                                String::from_utf8_lossy(&v[..v.len().min(MAX_SHOWN)]).into_owned();
                            if v.len() > MAX_SHOWN {
                                t.push('…');
                            }
                            Shown::Plain(t.into_boxed_str())
                        }
                        _ => Shown::MissingIp(net()),
                    }
                }
                _ => match part_value(part, head, facts, prefixes) {
                    Ok(Some(v)) => Shown::Key(
                        SubjectDigest::of(kind_byte(part), &v)
                            .short_hex()
                            .into_boxed_str(),
                    ),
                    _ => Shown::MissingIp(net()),
                },
            };
            ShownPart {
                part: part.to_string().into_boxed_str(),
                value,
            }
        })
        .collect()
}

/// The one non-empty value of cookie `name` in the request's `Cookie` headers (HTTP/2 may split
/// them); `None` when it is missing or empty, an error when it is sent more than once.
pub fn one_cookie<'h>(
    head: &'h impl RequestHead,
    name: &str,
) -> Result<Option<&'h [u8]>, RepeatedSubject> {
    let mut found: Option<&'h [u8]> = None;
    for v in head.header_values(&COOKIE) {
        for pair in v.split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            let (k, val) = match pair.iter().position(|&b| b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => continue,
            };
            if k.trim_ascii() == name.as_bytes() {
                if found.is_some() {
                    return Err(RepeatedSubject);
                }
                let val = val.trim_ascii();
                let val = val
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(val);
                found = Some(val);
            }
        }
    }
    Ok(found.filter(|v| !v.is_empty()))
}

/// The one non-empty value of header `name`; `None` when it is missing or empty, an error when
/// it is sent more than once (the upstream might read the other one).
pub fn one_header<'h>(
    head: &'h impl RequestHead,
    name: &'h HeaderName,
) -> Result<Option<&'h [u8]>, RepeatedSubject> {
    let mut values = head.header_values(name);
    let first = values.next();
    if values.next().is_some() {
        return Err(RepeatedSubject);
    }
    Ok(first.filter(|v| !v.is_empty()))
}

/// The one non-empty value of query parameter `name` as a `query:` part counts it: decoded as
/// upstreams read a query (`application/x-www-form-urlencoded`: `+` is a space, as `%20` is;
/// `%2B` a plus), so one value in two spellings is one subject (issue #34 item 21).
pub fn one_query_value<'q>(
    query: Option<&'q str>,
    name: &'q str,
) -> Result<Option<std::borrow::Cow<'q, [u8]>>, RepeatedSubject> {
    let Some(raw) = one_raw_query_param(query, name)? else {
        return Ok(None);
    };
    if !raw.contains('+') {
        return Ok(Some(percent_decode_str(raw).into()));
    }
    let spaced = raw.replace('+', " ");
    Ok(Some(std::borrow::Cow::Owned(
        percent_decode_str(&spaced).collect(),
    )))
}

/// The one non-empty value of query parameter `name` as written.
fn one_raw_query_param<'q>(
    query: Option<&'q str>,
    name: &'q str,
) -> Result<Option<&'q str>, RepeatedSubject> {
    let mut values = query.into_iter().flat_map(|q| query_params(q, name));
    let first = values.next();
    if values.next().is_some() {
        return Err(RepeatedSubject);
    }
    Ok(first.filter(|v| !v.is_empty()))
}

/// The one non-empty value of query parameter `name`, percent-decoded; `None` when it is
/// missing or empty, an error when it is sent more than once.
pub fn one_query_param<'q>(
    query: Option<&'q str>,
    name: &'q str,
) -> Result<Option<std::borrow::Cow<'q, [u8]>>, RepeatedSubject> {
    let mut values = query.into_iter().flat_map(|q| query_params(q, name));
    let first = values.next();
    if values.next().is_some() {
        return Err(RepeatedSubject);
    }
    Ok(first
        .filter(|v| !v.is_empty())
        .map(|v| percent_decode_str(v).into()))
}

/// The subject of a list of parts whose values are given (support naming a key: `model=m1`),
/// hashed exactly as [`resolve`] hashes a request's; `value` answers each part's bytes (a
/// `consumer` part: the consumer's digest), `None` when one has none.
pub fn parts_digest<'v>(
    spec: &SubjectSpec,
    mut value: impl FnMut(&SubjectSpec) -> Option<std::borrow::Cow<'v, [u8]>>,
) -> Option<SubjectDigest> {
    let SubjectSpec::Compound(parts) = spec else {
        return None;
    };
    let mut h = Sha256::new();
    h.update([b'+']);
    for part in parts.iter() {
        let v = value(part)?;
        h.update([kind_byte(part)]);
        h.update(u32::try_from(v.len()).ok()?.to_be_bytes());
        h.update(&v);
    }
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    Some(SubjectDigest(out))
}

/// The parts of a plan limit's subject as a request gave them, the consumer left out (usage
/// lists them per consumer): plain where the value names a thing rather than being a secret
/// (`json:`, `jwt:`, method, host, path, a network), the first 8 hex digits of its hash for a
/// header, query parameter or cookie, the client's network for a missing part.
pub fn counted_parts<'a>(
    spec: &'a SubjectSpec,
    prefixes: Prefixes,
    head: &'a impl RequestHead,
    facts: &Facts<'a>,
) -> Vec<ShownPart> {
    spec.parts()
        .iter()
        .filter(|p| **p != SubjectSpec::Consumer)
        .map(|part| {
            let net = || prefixes.network(facts.client).to_string().into_boxed_str();
            let value = match (part, part_value(part, head, facts, prefixes)) {
                (SubjectSpec::Ip, _) => Shown::Plain(net()),
                (
                    SubjectSpec::Header(_) | SubjectSpec::Query(_) | SubjectSpec::Cookie(_),
                    Ok(Some(v)),
                ) => Shown::Key(
                    SubjectDigest::of(kind_byte(part), &v)
                        .short_hex()
                        .into_boxed_str(),
                ),
                (_, Ok(Some(v))) => {
                    let mut t = String::from_utf8_lossy(&v[..v.len().min(MAX_SHOWN)]).into_owned();
                    if v.len() > MAX_SHOWN {
                        t.push('…');
                    }
                    Shown::Plain(t.into_boxed_str())
                }
                _ => Shown::MissingIp(net()),
            };
            ShownPart {
                part: part.to_string().into_boxed_str(),
                value,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::head::OwnedHead;

    fn headers(pairs: &[(&str, &str)]) -> OwnedHead {
        let mut h = OwnedHead::default();
        for (k, v) in pairs {
            h.headers.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn with_query(h: &OwnedHead, query: &str) -> OwnedHead {
        OwnedHead {
            query: Some(query.to_owned()),
            ..h.clone()
        }
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    const PEER: &str = "10.0.0.5";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_per_thread_memo_of_address_digests_is_exact() {
        // Many more networks than slots, in both families and several prefixes, asked twice in
        // an order that makes slots collide: each answer is the network's own digest.
        let p = Prefixes { v4: 32, v6: 64 };
        let nets: Vec<IpAddr> = (0..300u32)
            .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i * 7)))
            .chain((0..300u128).map(|i| {
                IpAddr::from(std::net::Ipv6Addr::from(
                    (0x2001_0db8u128 << 96) + (i << 64) + i,
                ))
            }))
            .collect();
        for round in 0..2 {
            for (k, &a) in nets.iter().enumerate() {
                let want = hash_network(p.network(a));
                assert_eq!(ip_digest_in(a, p), want, "round {round}, address {k}");
                assert_eq!(ip_digest_in(a, p), want, "asked again");
            }
        }
        let whole = Prefixes { v4: 32, v6: 128 };
        let a = ip("2001:db8::1");
        assert_ne!(ip_digest_in(a, p), ip_digest_in(a, whole));
    }

    #[test]
    fn untrusted_peer_ignores_forwarded_headers() {
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(client_ip(ip(PEER), &h, &[]), ip(PEER));
        assert_eq!(
            client_ip(ip(PEER), &h, &nets(&["192.168.0.0/16"])),
            ip(PEER)
        );
    }

    #[test]
    fn trusted_peer_walks_from_the_right() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.1.1.1")]);
        assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("1.2.3.4"));
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("1.2.3.4"));
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("10.9.9.9"));
    }

    #[test]
    fn forwarded_rfc7239() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https",
        )]);
        let of = |h: &OwnedHead| client_of(ip(PEER), h, &trusted, None, ForwardedHeader::Forwarded);
        assert_eq!(
            of(&h),
            Client {
                ip: ip("2001:db8::1"),
                derived: true
            }
        );
        // Issue #34 item 17: under `Forwarded`, a client's X-Forwarded-For decides nothing.
        let h = headers(&[("forwarded", "for=6.6.6.6"), ("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(of(&h).ip, ip("6.6.6.6"));
        // Issue #34 item 15: `unknown`, an obfuscated name or no `for=` at all: not derived.
        for bad in ["for=unknown", "for=_hidden", "proto=https"] {
            let h = headers(&[("forwarded", bad)]);
            assert_eq!(
                of(&h),
                Client {
                    ip: ip(PEER),
                    derived: false
                },
                "{bad}"
            );
        }
    }

    /// Issue #34 item 15: what cannot be derived is marked so (the proxy's address, which then
    /// matches no allow list or exemption); a junk hop left of the client is never reached.
    #[test]
    fn underivable_clients_are_marked() {
        let trusted = nets(&["10.0.0.0/8"]);
        let of = |v: &str| {
            client_of(
                ip(PEER),
                &headers(&[("x-forwarded-for", v)]),
                &trusted,
                None,
                ForwardedHeader::XForwardedFor,
            )
        };
        let many = vec!["1.2.3.4"; 65].join(",");
        for bad in ["junk", "010.1.1.1", "1.2.3.4, junk", "", many.as_str()] {
            assert_eq!(
                of(bad),
                Client {
                    ip: ip(PEER),
                    derived: false
                },
                "{bad:?}"
            );
        }
        assert_eq!(
            of("junk, 1.2.3.4"),
            Client {
                ip: ip("1.2.3.4"),
                derived: true
            }
        );
        assert_eq!(
            client_of(
                ip(PEER),
                &headers(&[]),
                &trusted,
                None,
                ForwardedHeader::XForwardedFor
            ),
            Client {
                ip: ip(PEER),
                derived: true
            },
            "the proxy's own request"
        );
    }

    #[test]
    fn malformed_or_huge_falls_back_to_peer() {
        let trusted = nets(&["10.0.0.0/8"]);
        for bad in ["1.2.3.4, garbage", "", "unknown", "999.1.1.1"] {
            let h = headers(&[("x-forwarded-for", bad)]);
            assert_eq!(client_ip(ip(PEER), &h, &trusted), ip(PEER), "{bad:?}");
        }
        let huge = vec!["1.2.3.4"; 5000].join(",");
        let h = headers(&[("x-forwarded-for", &huge)]);
        assert_eq!(client_ip(ip(PEER), &h, &trusted), ip(PEER));
    }

    #[test]
    fn subjects() {
        let h = headers(&[("x-api-key", "k1")]);
        let c = ip("1.2.3.4");
        let a = subject_of(
            &SubjectSpec::Header(HeaderName::from_static("x-api-key")),
            &h,
            c,
        );
        assert_eq!(a, Ok(Some(SubjectDigest::of(b'h', b"k1"))));
        assert_eq!(
            subject_of(
                &SubjectSpec::Header(HeaderName::from_static("x-other")),
                &h,
                c
            ),
            Ok(None)
        );
        assert_eq!(
            subject_of(
                &SubjectSpec::Query("key".into()),
                &with_query(&h, "a=1&key=k%31"),
                c
            ),
            Ok(Some(SubjectDigest::of(b'q', b"k1")))
        );
        assert_eq!(
            subject_of(
                &SubjectSpec::Query("key".into()),
                &with_query(&h, "keyx=1"),
                c
            ),
            Ok(None)
        );
        assert_ne!(ip_digest(ip("1.2.3.4")), ip_digest(ip("1.2.3.5")));
    }

    #[test]
    fn repeated_subjects_are_refused() {
        let c = ip("1.2.3.4");
        let key = SubjectSpec::Header(HeaderName::from_static("x-api-key"));
        let h = headers(&[("x-api-key", "z"), ("x-api-key", "a")]);
        assert_eq!(subject_of(&key, &h, c), Err(RepeatedSubject));
        let h = headers(&[("x-api-key", "z"), ("x-api-key", "z")]);
        assert_eq!(subject_of(&key, &h, c), Err(RepeatedSubject));
        // One comma-separated value is one value.
        let h = headers(&[("x-api-key", "z, a")]);
        assert!(matches!(subject_of(&key, &h, c), Ok(Some(_))));
        let q = SubjectSpec::Query("key".into());
        let none = OwnedHead::default();
        for query in [
            "key=z&key=a",
            "key=z&k%65y=a",
            "key&key=a",
            "key=z&x=1&key=",
        ] {
            assert_eq!(
                subject_of(&q, &with_query(&none, query), c),
                Err(RepeatedSubject),
                "{query}"
            );
        }
        assert!(matches!(
            subject_of(&q, &with_query(&none, "key=z&keys=a"), c),
            Ok(Some(_))
        ));
    }

    fn facts(client: &str) -> Facts<'static> {
        Facts {
            client: ip(client),
            derived: true,
            host: Some("api.example"),
            path: "/v1/x",
            consumer: None,
            claims: None,
            body: None,
            peer_trusted: false,
            peer_cert: None,
        }
    }

    #[test]
    fn the_global_subject_keeps_its_digest() {
        // Hashed once per process now; the same digest as ever (it names Redis keys).
        let h = headers(&[]);
        for _ in 0..2 {
            let r = resolve(
                &SubjectSpec::Global,
                OnMissing::Ip,
                Prefixes::default(),
                &h,
                &facts(PEER),
            )
            .unwrap();
            assert_eq!(r.digest, SubjectDigest::of(b'g', b""));
            assert!(!r.by_ip);
        }
    }

    #[test]
    fn prefixes_count_networks_and_keep_whole_ipv4_keys() {
        let p = Prefixes::default();
        assert_eq!(ip_digest_in(ip("1.2.3.4"), p), ip_digest(ip("1.2.3.4")));
        assert_eq!(
            ip_digest_in(ip("::ffff:1.2.3.4"), p),
            ip_digest(ip("1.2.3.4"))
        );
        assert_eq!(
            ip_digest_in(ip("2001:db8:0:1::1"), p),
            ip_digest_in(ip("2001:db8:0:1:ffff::9"), p)
        );
        assert_ne!(
            ip_digest_in(ip("2001:db8:0:1::1"), p),
            ip_digest_in(ip("2001:db8:0:2::1"), p)
        );
        let whole = Prefixes { v4: 32, v6: 128 };
        assert_ne!(
            ip_digest_in(ip("2001:db8:0:1::1"), whole),
            ip_digest_in(ip("2001:db8:0:1::2"), whole)
        );
        assert_eq!(
            ip_digest_in(ip("2001:db8::1"), whole),
            ip_digest(ip("2001:db8::1"))
        );
    }

    #[test]
    fn named_parts_hash_as_a_request_does() {
        let spec = SubjectSpec::compound(vec![
            SubjectSpec::Header(HeaderName::from_static("x-tenant")),
            SubjectSpec::Path,
        ])
        .unwrap();
        let h = headers(&[("x-tenant", "a")]);
        let r = resolve(
            &spec,
            OnMissing::Reject,
            Prefixes::default(),
            &h,
            &facts("1.2.3.4"),
        );
        let named = parts_digest(&spec, |p| match p {
            SubjectSpec::Header(_) => Some(std::borrow::Cow::Borrowed(&b"a"[..])),
            SubjectSpec::Path => Some(std::borrow::Cow::Borrowed(&b"/v1/x"[..])),
            _ => None,
        });
        assert_eq!(named, Some(r.unwrap().digest));
        assert_eq!(parts_digest(&spec, |_| None), None);
        let shown = counted_parts(&spec, Prefixes::default(), &h, &facts("1.2.3.4"));
        assert_eq!(
            shown[1].json(),
            serde_json::json!({"part": "path", "value": "/v1/x"})
        );
        assert!(matches!(shown[0].value, Shown::Key(_)));
    }

    #[test]
    fn compound_subjects_count_each_combination() {
        let spec = SubjectSpec::compound(vec![
            SubjectSpec::Header(HeaderName::from_static("x-tenant")),
            SubjectSpec::Ip,
        ])
        .unwrap();
        let p = Prefixes::default();
        let at = |tenant: Option<&str>, client: &str, on_missing| {
            let h = match tenant {
                Some(t) => headers(&[("x-tenant", t)]),
                None => OwnedHead::default(),
            };
            resolve(&spec, on_missing, p, &h, &facts(client))
        };
        let a = at(Some("a"), "1.2.3.4", OnMissing::Ip).unwrap();
        assert!(!a.by_ip);
        assert_eq!(at(Some("a"), "1.2.3.4", OnMissing::Ip).unwrap(), a);
        assert_ne!(at(Some("b"), "1.2.3.4", OnMissing::Ip).unwrap(), a);
        assert_ne!(at(Some("a"), "1.2.3.5", OnMissing::Ip).unwrap(), a);
        // Missing: the address in its place (not a tenant's bucket), or 401.
        let m = at(None, "1.2.3.4", OnMissing::Ip).unwrap();
        assert_ne!(m, a);
        assert_ne!(m.digest, ip_digest(ip("1.2.3.4")));
        assert_eq!(
            at(None, "1.2.3.4", OnMissing::Reject),
            Err(SubjectError::Missing("header:x-tenant".into()))
        );
        // A part's bytes cannot slide into the next part.
        let two = SubjectSpec::compound(vec![
            SubjectSpec::Header(HeaderName::from_static("a")),
            SubjectSpec::Header(HeaderName::from_static("b")),
        ])
        .unwrap();
        let d = |a: &str, b: &str| {
            resolve(
                &two,
                OnMissing::Reject,
                p,
                &headers(&[("a", a), ("b", b)]),
                &facts("1.1.1.1"),
            )
            .unwrap()
        };
        assert_ne!(d("ab", "c"), d("a", "bc"));
        // Repeated parts are refused.
        let h = headers(&[("x-tenant", "a"), ("x-tenant", "b")]);
        assert_eq!(
            resolve(&spec, OnMissing::Ip, p, &h, &facts("1.1.1.1")),
            Err(SubjectError::Repeated("header:x-tenant".into()))
        );
    }

    #[test]
    fn json_parts_are_strings_of_the_body() {
        let spec = SubjectSpec::compound(vec![
            SubjectSpec::Header(HeaderName::from_static("x-key")),
            SubjectSpec::parse_one("json:model").unwrap(),
        ])
        .unwrap();
        let paths: Vec<Box<[Box<str>]>> = vec![vec![Box::from("model")].into()];
        let h = headers(&[("x-key", "k")]);
        let p = Prefixes::default();
        let at = |doc: Option<&str>, on_missing| {
            let fields = doc.map(|d| crate::json_fields::extract(&paths, d.as_bytes()));
            let f = Facts {
                body: fields.as_ref(),
                ..facts("1.2.3.4")
            };
            resolve(&spec, on_missing, p, &h, &f)
        };
        let a = at(Some(r#"{"model":"a"}"#), OnMissing::Ip).unwrap();
        assert_eq!(
            at(Some(r#"{"model":"a","x":1}"#), OnMissing::Ip).unwrap(),
            a
        );
        assert_ne!(at(Some(r#"{"model":"b"}"#), OnMissing::Ip).unwrap(), a);
        // Not a string, empty, absent, not JSON, not read: missing, counted by address or 400.
        let missing = at(None, OnMissing::Ip).unwrap();
        for doc in [
            r#"{"model":7}"#,
            r#"{"model":""}"#,
            "{}",
            "nope",
            r#"{"model":["a"]}"#,
        ] {
            assert_eq!(at(Some(doc), OnMissing::Ip).unwrap(), missing, "{doc}");
            assert_eq!(
                at(Some(doc), OnMissing::Reject),
                Err(SubjectError::MissingInBody("json:model".into())),
                "{doc}"
            );
        }
        assert_ne!(missing, a);
        // Shown hashed, never as written.
        let fields = crate::json_fields::extract(&paths, br#"{"model":"secret-model"}"#);
        let f = Facts {
            body: Some(&fields),
            ..facts("1.2.3.4")
        };
        let shown = shown_parts(&spec, p, &h, &f);
        assert!(matches!(shown[1].value, Shown::Key(_)), "{shown:?}");
        assert!(!shown[1].json().to_string().contains("secret"));
    }

    #[test]
    fn cookies_and_shown_parts() {
        let h = headers(&[("cookie", "a=1; sid=\"s3cret\""), ("cookie", "b=2")]);
        assert_eq!(one_cookie(&h, "sid"), Ok(Some(&b"s3cret"[..])));
        assert_eq!(one_cookie(&h, "zz"), Ok(None));
        let h2 = headers(&[("cookie", "sid=1"), ("cookie", "sid=2")]);
        assert_eq!(one_cookie(&h2, "sid"), Err(RepeatedSubject));
        let spec = SubjectSpec::compound(vec![
            SubjectSpec::Cookie("sid".into()),
            SubjectSpec::Method,
            SubjectSpec::Host,
            SubjectSpec::Ip,
        ])
        .unwrap();
        let shown = shown_parts(&spec, Prefixes { v4: 24, v6: 64 }, &h, &facts("1.2.3.4"));
        let json: Vec<String> = shown.iter().map(|p| p.json().to_string()).collect();
        assert!(!json.concat().contains("s3cret"), "{json:?}");
        assert_eq!(json[1], r#"{"part":"method","value":"GET"}"#);
        assert_eq!(json[2], r#"{"part":"host","value":"api.example"}"#);
        assert_eq!(json[3], r#"{"part":"ip","value":"1.2.3.0/24"}"#);
    }

    /// Issue #34 item 17: by default `X-Forwarded-For` alone decides; a `Forwarded` header (which
    /// a client can add as easily) never does.
    #[test]
    fn forwarded_is_not_believed_by_default() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[("forwarded", "for=6.6.6.6")]);
        assert_ne!(client_ip(ip(PEER), &h, &trusted), ip("6.6.6.6"));
    }

    /// Issue #34 item 21: a `query:` part is read as upstreams read a query value: `+` is a
    /// space, as `%20` is.
    #[test]
    fn query_parts_read_plus_as_space() {
        let q = SubjectSpec::Query("model".into());
        let none = OwnedHead::default();
        let c = ip("1.2.3.4");
        let plus = subject_of(&q, &with_query(&none, "model=big+one"), c);
        let pct = subject_of(&q, &with_query(&none, "model=big%20one"), c);
        assert_eq!(plus, pct);
        assert_eq!(plus, Ok(Some(SubjectDigest::of(b'q', b"big one"))));
        // An encoded `+` stays a plus.
        assert_eq!(
            subject_of(&q, &with_query(&none, "model=a%2Bb"), c),
            Ok(Some(SubjectDigest::of(b'q', b"a+b")))
        );
    }

    #[test]
    fn real_ip_header_only_from_trusted_peers() {
        let name = HeaderName::from_static("cf-connecting-ip");
        let trusted = nets(&["10.0.0.0/8"]);
        let h = headers(&[
            ("cf-connecting-ip", "203.0.113.9"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(
            client_ip_with(ip(PEER), &h, &trusted, Some(&name)),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_ip_with(ip("192.0.2.1"), &h, &trusted, Some(&name)),
            ip("192.0.2.1")
        );
        assert_eq!(client_ip_with(ip(PEER), &h, &trusted, None), ip("1.2.3.4"));
        // Garbage or two values: the usual walk.
        let h = headers(&[("cf-connecting-ip", "nope"), ("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(
            client_ip_with(ip(PEER), &h, &trusted, Some(&name)),
            ip("1.2.3.4")
        );
        let h = headers(&[
            ("cf-connecting-ip", "5.5.5.5"),
            ("cf-connecting-ip", "6.6.6.6"),
        ]);
        assert_eq!(
            client_ip_with(ip(PEER), &h, &trusted, Some(&name)),
            ip(PEER)
        );
    }
}
