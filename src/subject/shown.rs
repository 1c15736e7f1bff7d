//! How `/-/top`, the access log and usage show a subject's parts: plain where the value is no
//! secret, a hash prefix where it may be, the client's network for a missing part.

use crate::config::{Prefixes, SubjectSpec};
use crate::http::head::RequestHead;
use crate::limiter::{Shown, ShownPart, SubjectDigest};

use super::resolve::{kind_byte, part_value, Facts};

/// The most bytes of a plain part (a path) shown.
const MAX_SHOWN: usize = 200;

/// A value that is no secret, shown as it is up to [`MAX_SHOWN`] bytes (bounded: /-/top keeps
/// 64 of these per limit).
fn plain(v: &[u8]) -> Shown {
    let mut t = String::from_utf8_lossy(&v[..v.len().min(MAX_SHOWN)]).into_owned();
    if v.len() > MAX_SHOWN {
        t.push('…');
    }
    Shown::Plain(t.into_boxed_str())
}

/// A value that may be a secret, shown as the first 8 hex digits of its part's digest.
fn hashed(part: &SubjectSpec, v: &[u8]) -> Shown {
    Shown::Key(
        SubjectDigest::of(kind_byte(part), v)
            .short_hex()
            .into_boxed_str(),
    )
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
                SubjectSpec::Method
                | SubjectSpec::Path
                | SubjectSpec::Host
                | SubjectSpec::PathCapture(_)
                | SubjectSpec::HostLabel(_)
                | SubjectSpec::HostCapture(_) => match part_value(part, head, facts, prefixes) {
                    Ok(Some(v)) => plain(&v),
                    _ => Shown::MissingIp(net()),
                },
                _ => match part_value(part, head, facts, prefixes) {
                    Ok(Some(v)) => hashed(part, &v),
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
                ) => hashed(part, &v),
                (_, Ok(Some(v))) => plain(&v),
                _ => Shown::MissingIp(net()),
            };
            ShownPart {
                part: part.to_string().into_boxed_str(),
                value,
            }
        })
        .collect()
}
