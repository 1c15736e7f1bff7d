//! The client address: `X-Forwarded-For` or RFC 7239 `Forwarded`, believed only from a trusted
//! proxy and walked from the right (the module above says how), and an address's digest.

use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderName, FORWARDED};
use ipnet::IpNet;
use smallvec::SmallVec;

use crate::config::ForwardedHeader;
use crate::http::head::{header_str, RequestHead};
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
