//! Head writing. Upstream: the client's head forwarded as received — names in the client's
//! case and order — with only what the pipeline's [`Edits`] and the hop-by-hop rules change
//! (a set value takes the place of the client's first field of that name, a new one goes at
//! the end). Client: the upstream's status and fields, hop-by-hop ones removed, the gateway's
//! own (request id, rate-limit headers, framing, `Date`) added.

use std::cell::RefCell;
use std::time::SystemTime;

use http::header::{HeaderName, HeaderValue, HOST};
use smallvec::SmallVec;

use super::codec::ResponseBody;
use super::parse::{underscored, BodyKind, Head};
use crate::http::head::{header_str, RequestHead};
use crate::pipeline::edits::{is_hop_by_hop, stamp_attempt, UpstreamEdit, NEVER_NAMED};
use crate::pipeline::respond::{Fate, ResponseEdits};
use crate::pipeline::Edits;

/// The field names a message's `Connection` fields name (framing fields and `Host` aside:
/// see [`NEVER_NAMED`]).
fn connection_named<'a>(
    fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> SmallVec<[&'a [u8]; 2]> {
    let mut named = SmallVec::new();
    for (n, v) in fields {
        if n.eq_ignore_ascii_case(b"connection") {
            for t in v.split(|b| *b == b',') {
                let t = super::framing::trim(t);
                if !t.is_empty()
                    && !NEVER_NAMED
                        .iter()
                        .any(|f| t.eq_ignore_ascii_case(f.as_bytes()))
                {
                    named.push(t);
                }
            }
        }
    }
    named
}

/// One header the upstream head sets (or removes).
#[derive(Debug)]
struct Override {
    name: HeaderName,
    /// `None`: removed.
    value: Option<HeaderValue>,
    /// Written where the client's first field of that name was (else at the end).
    in_place: bool,
    /// A value added to the client's (a route's `add` rule): the client's fields of the name
    /// stay, this one is written at the end.
    added: bool,
}

/// What an admitted request's upstream head is: the path and query, and the header changes
/// in the order a `HeaderMap` would have made them (see the module comment).
#[derive(Debug)]
pub struct UpstreamHead {
    pub path_and_query: String,
    overrides: SmallVec<[Override; 6]>,
    preserve_host: bool,
}

impl UpstreamHead {
    /// The edits of `head`'s request, made by the one forwarding-header writer
    /// ([`Edits::write`]) on an overlay of the client's head.
    pub fn new(head: &Head, mut edits: Edits, preserve_host: bool) -> UpstreamHead {
        let mut u = UpstreamHead {
            path_and_query: std::mem::take(&mut edits.path_and_query),
            overrides: SmallVec::new(),
            preserve_host,
        };
        edits.write(&mut Overlay { u: &mut u, head });
        u
    }

    /// An upstream attempt's trace context, as on every front
    /// ([`crate::pipeline::edits::stamp_attempt`]).
    pub fn stamp(&mut self, head: &Head, stamp: (HeaderValue, Option<HeaderValue>)) {
        stamp_attempt(&mut Overlay { u: self, head }, stamp);
    }

    fn set(&mut self, name: HeaderName, value: Option<HeaderValue>) {
        match self
            .overrides
            .iter()
            .position(|o| o.name == name && !o.added)
        {
            Some(i) => {
                let removed = self.overrides[i].value.is_none();
                match value {
                    None => {
                        self.overrides[i].value = None;
                        self.overrides[i].in_place = false;
                    }
                    // Set after a remove: a new entry at the end, as `HeaderMap::insert` does.
                    Some(v) if removed => {
                        self.overrides.remove(i);
                        self.overrides.push(Override {
                            name,
                            value: Some(v),
                            in_place: false,
                            added: false,
                        });
                    }
                    Some(v) => self.overrides[i].value = Some(v),
                }
            }
            None => {
                let in_place = value.is_some();
                self.overrides.push(Override {
                    name,
                    value,
                    in_place,
                    added: false,
                })
            }
        }
    }

    /// Writes the upstream head of `head` into `out` (cleared first), with `host` as `Host`
    /// unless the route preserves the client's.
    pub fn write(&self, head: &Head, host: &HeaderValue, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(head.method().as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.path_and_query.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let named = connection_named(head.fields());
        // Which overrides were written in place (at most 64 of them are tracked; more are
        // appended, which only changes their position).
        let mut written: u64 = 0;
        let host_override = (!self.preserve_host).then_some(host);
        let mut host_written = false;
        // The framing written is the gateway's own parse of the body it sends: the client's
        // (one, validated) `Content-Length` field carries the parsed length.
        let length = match head.body {
            BodyKind::Length(n) => Some(n),
            BodyKind::Chunked => None,
        };
        let mut len_buf = itoa::Buffer::new();
        let mut length_written = false;
        for (name, value) in head.fields() {
            if underscored(name)
                || is_hop_by_hop(name)
                || named.iter().any(|n| n.eq_ignore_ascii_case(name))
            {
                continue;
            }
            if name.eq_ignore_ascii_case(b"content-length") {
                if let (Some(n), false) = (length, length_written) {
                    length_written = true;
                    field(out, name, len_buf.format(n).as_bytes());
                }
                continue;
            }
            if let Some(h) = host_override.filter(|_| name.eq_ignore_ascii_case(b"host")) {
                if !host_written {
                    host_written = true;
                    field(out, name, h.as_bytes());
                }
                continue;
            }
            let found = self.overrides.iter().enumerate().find(|(_, o)| {
                let n = o.name.as_str().as_bytes();
                !o.added && n.len() == name.len() && n.eq_ignore_ascii_case(name)
            });
            match found {
                // An empty value as hyper's client writes it: `Name:` (no trailing space).
                None if value.is_empty() => {
                    out.extend_from_slice(name);
                    out.extend_from_slice(b":\r\n");
                }
                None => field(out, name, value),
                Some((i, o)) => {
                    let bit = 1u64.checked_shl(i as u32).unwrap_or(0);
                    if let (true, Some(v), 0) = (o.in_place, &o.value, written & bit) {
                        if bit != 0 {
                            written |= bit;
                            field(out, name, v.as_bytes());
                        }
                    }
                }
            }
        }
        for (i, o) in self.overrides.iter().enumerate() {
            let bit = 1u64.checked_shl(i as u32).unwrap_or(0);
            if let (Some(v), 0) = (&o.value, written & bit) {
                field(out, spelling(head.fields(), o.name.as_str()), v.as_bytes());
            }
        }
        if let (Some(h), false) = (host_override, host_written) {
            field(out, spelling(head.fields(), HOST.as_str()), h.as_bytes());
        }
        match length {
            Some(n) if n > 0 && !length_written => {
                field(out, b"Content-Length", len_buf.format(n).as_bytes());
            }
            _ => {}
        }
        if head.body == BodyKind::Chunked {
            field(
                out,
                spelling(head.fields(), "transfer-encoding"),
                b"chunked",
            );
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// The fast front's upstream head as the forwarding-header writer edits it: the overrides
/// over the client's head, which gives the values forwarded as received.
struct Overlay<'a> {
    u: &'a mut UpstreamHead,
    head: &'a Head,
}

impl UpstreamEdit for Overlay<'_> {
    fn remove(&mut self, name: HeaderName) {
        self.u.set(name, None);
    }

    fn set(&mut self, name: HeaderName, value: HeaderValue) {
        self.u.set(name, Some(value));
    }

    fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.u.overrides.push(Override {
            name,
            value: Some(value),
            in_place: false,
            added: true,
        });
    }

    fn each_value(&self, name: &HeaderName, mut each: impl FnMut(&str)) {
        // A client's field its `Connection` names is hop-by-hop: not forwarded.
        let hop = connection_named(self.head.fields())
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name.as_str().as_bytes()));
        if hop {
            return;
        }
        for v in self.head.header_values(name).filter_map(header_str) {
            each(v);
        }
    }
}

/// How the message spelled field `name` first (lower case: `name` itself when it has none).
/// A field the gateway adds takes the spelling the message had for that name, as hyper's
/// writer does with `preserve_header_case`, so both fronts write the same bytes.
fn spelling<'a: 'c, 'b: 'c, 'c>(
    mut fields: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    name: &'b str,
) -> &'c [u8] {
    fields
        .find(|(n, _)| n.len() == name.len() && n.eq_ignore_ascii_case(name.as_bytes()))
        .map_or(name.as_bytes(), |(n, _)| n)
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The `Date` value of this second (formatted once a second per thread).
fn date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(c.1.as_bytes());
    });
}

/// Writes a limit's refusal into `out` (cleared first): its body first, then its head — the
/// status line, the RateLimit fields (`rate`), `content-type`, `retry-after`, the request id
/// (`id`: its field and value), `connection: close` when `close`, `content-length`, `date` —
/// the bytes [`response_head`] writes for the same answer rendered through a `HeaderMap`
/// ([`crate::pipeline::drive::Refusal::rendered`]), without one. Returns where the head
/// starts: the body is `out[..at]`, the head `out[at..]`.
pub fn refusal(
    out: &mut Vec<u8>,
    error: &crate::pipeline::ProxyError,
    rate: Option<&crate::limiter::RateFields>,
    id: (&HeaderName, &HeaderValue),
    close: bool,
) -> usize {
    out.clear();
    error.write_refusal_body(id.1, out);
    let at = out.len();
    let mut n = itoa::Buffer::new();
    let status = error.status();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(n.format(status.as_u16()).as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(rate) = rate {
        rate.write_lines(out);
    }
    field(out, b"content-type", error.refusal_content_type());
    if let crate::pipeline::ProxyError::Limited { retry_after, .. } = error {
        field(out, b"retry-after", n.format(*retry_after).as_bytes());
    }
    field(out, id.0.as_str().as_bytes(), id.1.as_bytes());
    if close {
        field(out, b"connection", b"close");
    }
    field(out, b"content-length", n.format(at).as_bytes());
    out.extend_from_slice(b"date: ");
    date(out);
    out.extend_from_slice(b"\r\n\r\n");
    at
}

/// What the client's response head says besides the upstream's fields.
pub struct ResponseExtras<'a, E> {
    /// The gateway's headers (rate-limit headers, the request id), name and value in order
    /// (from [`crate::http::fields::Fields::iter`] or a `HeaderMap`): they replace the upstream's of the same name.
    pub headers: E,
    /// The upstream fields dropped (cost headers a limit strips), lower case.
    pub stripped: &'a [HeaderName],
    /// How the body is sent to the client.
    pub framing: ResponseBody,
    /// The connection closes after this response.
    pub close: bool,
    /// The response phase's changes to the upstream's fields (a route with header rules or
    /// CORS; `None` on the plain path). What it adds after them is in `headers` already.
    pub edits: Option<&'a ResponseEdits>,
}

/// Writes the client's response head, in the order hyper's server writes it (so both fronts
/// send the same bytes): the status line, the upstream's fields (hop-by-hop, stripped and
/// replaced ones removed), the gateway's, `Connection: close`, the framing header the body
/// needs, `Date`.
pub fn response_head<'f>(
    out: &mut Vec<u8>,
    status: u16,
    reason: Option<&[u8]>,
    fields: impl Iterator<Item = (&'f [u8], &'f [u8])> + Clone,
    x: &ResponseExtras<'_, impl Iterator<Item = (&'f HeaderName, &'f [u8])> + Clone>,
) {
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut code = itoa::Buffer::new();
    out.extend_from_slice(code.format(status).as_bytes());
    out.push(b' ');
    match reason {
        // The upstream's, as received (empty included, as hyper relays it).
        Some(reason) => out.extend_from_slice(reason),
        None => {
            let canonical = http::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason());
            out.extend_from_slice(canonical.unwrap_or("<none>").as_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
    let named = connection_named(fields.clone());
    let fields_again = fields.clone();
    let unknown_length = matches!(x.framing, ResponseBody::Chunked | ResponseBody::Close);
    // Statuses that have no body carry no framing fields (RFC 9110 §8.6, RFC 9112 §6.1; hyper
    // removes them from 304 too).
    let bodiless = (100..200).contains(&status) || status == 204 || status == 304;
    let mut len_buf = itoa::Buffer::new();
    let (mut has_date, mut has_len, mut has_close) = (false, false, false);
    // Which of the response phase's entries were written in place (64 tracked; a name past
    // those is written at each of its fields, which only repeats it).
    let mut edits_written: u64 = 0;
    for (name, value) in fields {
        let same = |n: &str| n.len() == name.len() && name.eq_ignore_ascii_case(n.as_bytes());
        if is_hop_by_hop(name)
            || named.iter().any(|n| n.eq_ignore_ascii_case(name))
            || x.stripped.iter().any(|n| same(n.as_str()))
            || x.headers.clone().any(|(n, _)| same(n.as_str()))
        {
            continue;
        }
        if same("content-length") {
            if unknown_length || bodiless || has_len {
                continue;
            }
            has_len = true;
            // One field, one value: a repeated `Content-Length` (or `5, 5`) is sent once.
            if let ResponseBody::Length(n) = x.framing {
                field(out, name, len_buf.format(n).as_bytes());
                continue;
            }
        }
        if let Some(e) = x.edits {
            match e.fate(name) {
                Fate::Kept => {}
                Fate::Dropped => continue,
                Fate::Here {
                    index,
                    keep,
                    values,
                } => {
                    let bit = 1u64.checked_shl(index as u32).unwrap_or(0);
                    if edits_written & bit != 0 {
                        continue;
                    }
                    edits_written |= bit;
                    has_date |= same("date");
                    if keep {
                        for (n, v) in fields_again
                            .clone()
                            .filter(|(n, _)| n.len() == name.len() && n.eq_ignore_ascii_case(name))
                        {
                            field(out, n, v);
                        }
                    }
                    for v in values {
                        field(out, name, v.as_bytes());
                    }
                    continue;
                }
            }
        }
        has_date |= same("date");
        field(out, name, value);
    }
    let sp = |name: &'static str| spelling(fields_again.clone(), name);
    for (name, value) in x.headers.clone() {
        has_len |= name == http::header::CONTENT_LENGTH;
        has_date |= name == http::header::DATE;
        has_close |= name == http::header::CONNECTION;
        field(out, spelling(fields_again.clone(), name.as_str()), value);
    }
    if x.close && !has_close {
        field(out, sp("connection"), b"close");
    }
    match x.framing {
        _ if bodiless => {}
        ResponseBody::Chunked | ResponseBody::Close => {
            field(out, sp("transfer-encoding"), b"chunked");
        }
        ResponseBody::Length(n) if !has_len => {
            field(
                out,
                sp("content-length"),
                itoa::Buffer::new().format(n).as_bytes(),
            );
        }
        _ => {}
    }
    if !has_date {
        out.extend_from_slice(sp("date"));
        out.extend_from_slice(b": ");
        date(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::http1::parse::{scan, Parsed};
    use crate::pipeline::{Edit, Forwarded};
    use bytes::Bytes;

    fn head(s: &str) -> Head {
        let Parsed::Complete(l) = scan(s.as_bytes()) else {
            panic!("{s:?}")
        };
        Head::parse(Bytes::copy_from_slice(&s.as_bytes()[..l.len]), l).unwrap()
    }

    #[test]
    fn forwards_the_clients_head_with_the_edits_spliced_in() {
        let h = head("POST /v1/x?k=1 HTTP/1.1\r\nHost: gw.example\r\nX-Api-Key: k\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX_Bad: 1\r\nX-Forwarded-For: 10.0.0.1\r\nContent-Length: 2\r\nX-Consumer: forged\r\n\r\n");
        let mut edits = Edits {
            path_and_query: "/x?k=1".into(),
            headers: vec![
                Edit::Remove(crate::pipeline::edits::X_CONSUMER.clone()),
                Edit::Set(
                    crate::pipeline::edits::X_CONSUMER.clone(),
                    HeaderValue::from_static("acme"),
                ),
            ],
            forwarded: Forwarded {
                request_id: Some((
                    HeaderName::from_static("x-request-id"),
                    HeaderValue::from_static("id1"),
                )),
                client: Some(HeaderValue::from_static("127.0.0.1")),
                https: false,
                host: Some(HeaderValue::from_static("gw.example")),
                client_cert: None,
            },
        };
        edits
            .headers
            .push(Edit::Remove(HeaderName::from_static("x-api-key")));
        let u = UpstreamHead::new(&h, edits, false);
        let mut out = Vec::new();
        u.write(&h, &HeaderValue::from_static("up:8080"), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /x?k=1 HTTP/1.1\r\nHost: up:8080\r\nX-Forwarded-For: 10.0.0.1, 127.0.0.1\r\nContent-Length: 2\r\nX-Consumer: acme\r\nx-request-id: id1\r\nx-forwarded-proto: http\r\nx-forwarded-host: gw.example\r\n\r\n"
        );
    }

    /// #34 item 1: `Connection` never removes the framing (or `Host`); the length written is
    /// the gateway's own parse.
    #[test]
    fn connection_cannot_name_the_framing_away() {
        let h = head("POST /x HTTP/1.1\r\nHost: gw\r\nConnection: Content-Length, Host, X-Hop\r\nX-Hop: 1\r\nContent-Length: 05\r\n\r\n");
        let edits = Edits {
            path_and_query: "/x".into(),
            headers: vec![],
            forwarded: Forwarded::default(),
        };
        let u = UpstreamHead::new(&h, edits, true);
        let mut out = Vec::new();
        u.write(&h, &HeaderValue::from_static("up:8080"), &mut out);
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains("\r\nContent-Length: 5\r\n"), "{out}");
        assert!(out.contains("\r\nHost: gw\r\n"), "{out}");
        assert!(!out.contains("X-Hop"), "{out}");
    }

    /// #52 item 3: a refusal written straight into the connection's buffer is, byte for byte,
    /// what the generic path writes for it (its `HeaderMap` rendering through
    /// [`response_head`], as `write_answer` does), for every refusal shape: the default 429
    /// problem+json, a route's `refusal` (503, problem+json), a limit's (its own body and
    /// content type), with and without the RateLimit fields, keep-alive or closing.
    #[test]
    fn a_refusal_written_directly_is_the_generic_answer_byte_for_byte() {
        use crate::limiter::RateFields;
        use crate::pipeline::drive::Refusal;
        use crate::pipeline::ProxyError;
        use std::sync::Arc;

        let config = |extra: &str| {
            crate::config::Config::parse(
                &format!("[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"http://127.0.0.1:3000\"\n{extra}"),
                std::path::Path::new("."),
            )
            .unwrap()
        };
        let route_shape = config("refusal = { status = 503 }\n").routes[0]
            .refusal
            .clone()
            .unwrap();
        let limit_shape = config(
            "refusal = { status = 429, content_type = \"text/html\", body = \"\"\"\n<p>$client_ip ($route, $$$limit):\nretry in $retry_after s, $remaining left. id=$request_id</p>\"\"\" }\n",
        )
        .routes[0]
            .refusal
            .clone()
            .unwrap();
        let shaped = |refusal: &Arc<crate::config::Refusal>| {
            Some(Box::new(crate::pipeline::answer::Shaped {
                refusal: refusal.clone(),
                refused: crate::fronting::Refused {
                    retry_after: 7,
                    limit: 2,
                    remaining: 0,
                },
                route: "api".into(),
                client_ip: Some("10.0.0.1".parse().unwrap()),
                consumer: None,
                claims: None,
            }))
        };
        let limited = |shape, violated: &[&str]| ProxyError::Limited {
            route: "api".into(),
            limit: "per-ip".into(),
            retry_after: 7,
            violated: violated.iter().map(|&v| Arc::from(v)).collect(),
            shape,
        };
        let pk = tollgate_limit::SubjectDigest::of(b'i', b"10.0.0.1");
        let rates = [
            None,
            Some(RateFields::of_parts(
                (2, 0, 7),
                &[("per-ip", "\"per-ip\";q=2;w=3600", 0, 7, Some(pk))],
            )),
            Some(RateFields::of_parts(
                (2, 0, 7),
                &[
                    ("per-ip", "\"per-ip\";q=2;w=3600", 0, 7, Some(pk)),
                    ("global", "\"global\";q=100;w=1", 41, 1, None),
                ],
            )),
        ];
        let errors = [
            limited(None, &["per-ip"]),
            limited(None, &["per-ip", "global"]),
            limited(shaped(&route_shape), &["per-ip"]),
            limited(shaped(&limit_shape), &["per-ip"]),
        ];
        let id_header = HeaderName::from_static("x-request-id");
        let mut cases = 0;
        for error in &errors {
            for rate in &rates {
                for id in ["0192f0c4-1c2b-7d3e-8f40-0123456789ab", "client\"id\\1"] {
                    for close in [false, true] {
                        let id = HeaderValue::from_str(id).unwrap();
                        // The generic path: the answer's `HeaderMap`, written as `write_answer`
                        // writes it.
                        let rendered = Refusal {
                            error: error.clone(),
                            rate: rate.clone(),
                            request_id: &id,
                            id_header: &id_header,
                            record: None,
                        }
                        .rendered();
                        let listed: Vec<(&HeaderName, &[u8])> = rendered
                            .headers
                            .iter()
                            .map(|(n, v)| (n, v.as_bytes()))
                            .collect();
                        let mut want = Vec::new();
                        response_head(
                            &mut want,
                            rendered.status.as_u16(),
                            None,
                            std::iter::empty(),
                            &ResponseExtras {
                                headers: listed.iter().copied(),
                                stripped: &[],
                                framing: ResponseBody::Length(rendered.body.len() as u64),
                                close,
                                edits: None,
                            },
                        );
                        let mut got = Vec::new();
                        let at = refusal(&mut got, error, rate.as_ref(), (&id_header, &id), close);
                        let (body, head) = got.split_at(at);
                        // `Date` is this second's on both: compared apart from the rest.
                        let undated = |h: &[u8]| {
                            let h = String::from_utf8(h.to_vec()).unwrap();
                            let at = h.find("date: ").expect("a date field");
                            (h[..at].to_owned(), h[at..].len())
                        };
                        assert_eq!(undated(head), undated(&want), "{error:?} {rate:?}");
                        assert_eq!(body, &rendered.body[..], "{error:?}");
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 48);
        // What the body says, once: the problem+json the generic path has always written.
        let mut got = Vec::new();
        let id = HeaderValue::from_static("r1");
        let at = refusal(
            &mut got,
            &errors[1],
            rates[2].as_ref(),
            (&id_header, &id),
            false,
        );
        let head = String::from_utf8(got[at..].to_vec()).unwrap();
        assert!(
            head.starts_with("HTTP/1.1 429 Too Many Requests\r\nx-ratelimit-limit: 2\r\nx-ratelimit-remaining: 0\r\nx-ratelimit-reset: 7\r\nratelimit: \"per-ip\";r=0;t=7;pk=:"),
            "{head}"
        );
        assert!(
            head.contains(", \"global\";r=41;t=1\r\nratelimit-policy: \"per-ip\";q=2;w=3600;pk=:"),
            "{head}"
        );
        assert!(
            head.contains("\r\ncontent-type: application/problem+json\r\nretry-after: 7\r\nx-request-id: r1\r\ncontent-length: "),
            "{head}"
        );
        let body: serde_json::Value = serde_json::from_slice(&got[..at]).unwrap();
        assert_eq!(
            body["violated-policies"],
            serde_json::json!(["per-ip", "global"])
        );
        assert_eq!(body["request_id"], "r1");
        assert_eq!(body["retry_after"], 7);
    }

    #[test]
    fn response_head_replaces_and_drops() {
        let fields: Vec<(&[u8], &[u8])> = vec![
            (b"Content-Length", b"2"),
            (b"Connection", b"x-up-hop"),
            (b"X-Up-Hop", b"1"),
            (b"Keep-Alive", b"timeout=5"),
            (b"X-Cost", b"3"),
            (b"x-request-id", b"upstream"),
            (b"Date", b"Mon, 01 Jan 2024 00:00:00 GMT"),
        ];
        let mut extra = crate::http::fields::Fields::default();
        crate::http::fields::FieldSink::set(
            &mut extra,
            &HeaderName::from_static("x-request-id"),
            b"id1",
        );
        let mut out = Vec::new();
        response_head(
            &mut out,
            200,
            None,
            fields.iter().copied(),
            &ResponseExtras {
                headers: extra.iter(),
                stripped: &[HeaderName::from_static("x-cost")],
                framing: ResponseBody::Length(2),
                close: true,
                edits: None,
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nx-request-id: id1\r\nConnection: close\r\n\r\n"
        );
    }
}
