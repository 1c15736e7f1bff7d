//! One value of a request field a subject counts by — a header, a cookie, a query parameter —
//! read as an upstream would read it, and a query without a parameter.

use http::header::{HeaderName, COOKIE};
use percent_encoding::percent_decode_str;

use crate::http::head::RequestHead;

/// A request that carries the header or query parameter a limit counts by more than once.
///
/// Such a request is refused rather than charged to one of its values: the upstream may read
/// another one, which would give it the use of a key whose budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedSubject;

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
    Ok(Some(decode_query_value(raw)))
}

/// A query value as written, percent-decoded with `+` as a space (as forms encode it).
pub(crate) fn decode_query_value(raw: &str) -> std::borrow::Cow<'_, [u8]> {
    if !raw.contains('+') {
        return percent_decode_str(raw).into();
    }
    let spaced = raw.replace('+', " ");
    std::borrow::Cow::Owned(percent_decode_str(&spaced).collect())
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
