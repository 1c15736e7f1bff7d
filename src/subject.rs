//! Who is calling: the client address (behind trusted proxies) and each limit's subject.
//!
//! `X-Forwarded-For` and `Forwarded` are believed only when the TCP peer is a trusted proxy, and
//! then walked from the right, skipping trusted proxies, as nginx's `real_ip_recursive` does: the
//! first untrusted address is the client. Without trusted proxies the headers are ignored, so a
//! spoofed header never buys a fresh bucket. Anything malformed or oversized falls back to the peer.

use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderName, FORWARDED};
use ipnet::IpNet;
use percent_encoding::percent_decode_str;

use crate::config::SubjectSpec;
use crate::head::{header_str, RequestHead};
use crate::limiter::SubjectDigest;

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// More forwarded hops than this, or more bytes, and the headers are not believed.
const MAX_HOPS: usize = 64;
const MAX_HEADER_BYTES: usize = 8 * 1024;

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
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

/// The hops of `X-Forwarded-For` (or, without it, of `Forwarded`'s `for=`), left to right;
/// `None` when a hop is malformed or the headers are too large.
fn forwarded_hops(head: &impl RequestHead) -> Option<Vec<IpAddr>> {
    let mut hops = Vec::new();
    let mut bytes = 0;
    if head.header_value(&X_FORWARDED_FOR).is_some() {
        for v in head.header_values(&X_FORWARDED_FOR) {
            bytes += v.len();
            if bytes > MAX_HEADER_BYTES {
                return None;
            }
            for part in header_str(v)?.split(',') {
                hops.push(parse_hop(part)?);
                if hops.len() > MAX_HOPS {
                    return None;
                }
            }
        }
        return Some(hops);
    }
    for v in head.header_values(&FORWARDED) {
        bytes += v.len();
        if bytes > MAX_HEADER_BYTES {
            return None;
        }
        for element in header_str(v)?.split(',') {
            let for_value = element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then_some(v)
            });
            if let Some(v) = for_value {
                hops.push(parse_hop(v)?);
                if hops.len() > MAX_HOPS {
                    return None;
                }
            }
        }
    }
    Some(hops)
}

/// The client address of a request from `peer`.
pub fn client_ip(peer: IpAddr, head: &impl RequestHead, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if trusted.is_empty() || !is_trusted(peer, trusted) {
        return peer;
    }
    let Some(hops) = forwarded_hops(head) else {
        return peer;
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        client = *hop;
        if !is_trusted(*hop, trusted) {
            break;
        }
    }
    client
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
pub fn subject_of(
    spec: &SubjectSpec,
    head: &impl RequestHead,
    client: IpAddr,
) -> Result<Option<SubjectDigest>, RepeatedSubject> {
    Ok(match spec {
        SubjectSpec::Ip => Some(ip_digest(client)),
        SubjectSpec::Global => Some(SubjectDigest::of(b'g', b"")),
        SubjectSpec::Header(name) => one_header(head, name)?.map(|v| SubjectDigest::of(b'h', v)),
        SubjectSpec::Query(name) => {
            one_query_param(head.query(), name)?.map(|v| SubjectDigest::of(b'q', &v))
        }
    })
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
        assert_eq!(client_ip(ip(PEER), &h, &trusted), ip("2001:db8::1"));
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
}
