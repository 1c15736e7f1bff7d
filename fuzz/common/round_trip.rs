//! The round-trip oracle of the fast HTTP/1 front (README "Fuzzing", `h1_round_trip`), shared
//! by the fuzz target and `tests/round_trip.rs`: what the front writes is parsed by an
//! independent strict parser — `httparse` for the head lines, with framing, chunked decoding
//! and hop-by-hop rules written here, never the gateway's — and held to what the front decided.
//!
//! An input is `[mode, seed, stream…]`: mode bit 0 picks the response side (else the request
//! side), bit 1 a `HEAD` request (response side); `seed` cuts the stream into reads.
//!
//! Request side: the client's stream (several requests) goes through the request path; the
//! upstream stream parses to exactly the requests decided — same method, target, end-to-end
//! fields (order, case, values) and body, in order, nothing more — each also what this parser
//! reads from the client; `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host` and
//! `X-Consumer` are the gateway's (the last two: none, as the driver names no host and no
//! consumer — a client's is never forwarded, #34 item 8). The same
//! whether the stream comes whole or cut into reads.
//!
//! Response side: the upstream's stream goes through the response path; the client gets the
//! same status, reason, end-to-end fields and body as this parser reads from the upstream, one
//! whole message and nothing more — or a 502 with the connection not reused. A connection is
//! reused only when this parser ends the message exactly where the gateway stopped reading.
#![allow(dead_code)]

use tollgate::fuzzing::{
    h1_round_trip_requests, h1_round_trip_response, H1Decided, H1ResponseTrip, H1_ROUND_TRIP_CLIENT,
};

/// `stream` cut into reads of 1 to `max` bytes (xorshift seeded by `seed`).
fn cut(stream: &[u8], seed: u8, max: u32) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut reads = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = usize::try_from(state % max.max(1) + 1)
            .unwrap_or(1)
            .min(rest.len());
        let (read, tail) = rest.split_at(n);
        reads.push(read);
        rest = tail;
    }
    reads
}

/// One message as this parser reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// Method (requests) or status and reason (responses).
    pub line: (String, String),
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
    /// The message's length in the stream (1xx heads before it included).
    pub len: usize,
    /// The framing is by close (responses).
    pub close_delimited: bool,
    /// `Connection: close`, or HTTP/1.0 without keep-alive.
    pub close: bool,
}

/// How a stream parses: the whole messages, then whether anything follows them.
#[derive(Debug, Default)]
pub struct Parsed {
    pub msgs: Vec<Msg>,
    /// Bytes after the whole messages: a message cut off, or bytes this parser refuses.
    pub rest: usize,
    /// What follows is refused (not merely incomplete).
    pub refused: bool,
}

const HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
];

fn lower(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_lowercase()
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|b| *b != b' ' && *b != b'\t')
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|b| *b != b' ' && *b != b'\t')
        .map_or(s, |p| p + 1);
    &v[s..e.max(s)]
}

/// RFC 9110 §8.6: `1*DIGIT`, leading zeros included (hyper and nginx read them too); the value
/// must fit in a u64.
fn decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let significant = match v.iter().position(|c| *c != b'0') {
        Some(p) => &v[p..],
        None => &v[v.len() - 1..],
    };
    std::str::from_utf8(significant).ok()?.parse().ok()
}

enum Framing {
    None,
    Length(u64),
    Chunked,
    Close,
    Invalid,
}

/// RFC 9112 §6.3, written here: `Transfer-Encoding` ending in `chunked` (with no
/// `Content-Length`), else one decimal `Content-Length` (a list of one value repeated is that
/// value), else none (requests) or until close (responses).
fn framing(fields: &[(Vec<u8>, Vec<u8>)], request: bool) -> Framing {
    let mut te: Option<bool> = None;
    let mut cl: Option<u64> = None;
    let mut cl_seen = false;
    let mut cl_bad = false;
    for (n, v) in fields {
        match lower(n).as_str() {
            "transfer-encoding" => {
                let last = v.rsplit(|b| *b == b',').next().map(trim).unwrap_or(b"");
                te = Some(last.eq_ignore_ascii_case(b"chunked"));
            }
            "content-length" => {
                cl_seen = true;
                for part in v.split(|b| *b == b',') {
                    match (decimal(trim(part)), cl) {
                        (Some(n), None) => cl = Some(n),
                        (Some(n), Some(p)) if n == p => {}
                        // Decided below: a `Transfer-Encoding` overrides it (§6.3 rule 3).
                        _ => cl_bad = true,
                    }
                }
            }
            _ => {}
        }
    }
    match (te, cl_seen) {
        (Some(_), true) if request => Framing::Invalid,
        (Some(true), _) => Framing::Chunked,
        (Some(false), _) if request => Framing::Invalid,
        (Some(false), _) => Framing::Close,
        (None, true) if cl_bad => Framing::Invalid,
        (None, true) => cl.map_or(Framing::Invalid, Framing::Length),
        (None, false) if request => Framing::None,
        (None, false) => Framing::Close,
    }
}

/// A chunked body at the start of `b`: `Ok(Some((data, length)))`, `Ok(None)` while
/// incomplete, `Err` when malformed.
fn chunked(b: &[u8]) -> Result<Option<(Vec<u8>, usize)>, ()> {
    let mut at = 0;
    let mut data = Vec::new();
    let line = |from: usize| -> Option<usize> {
        b.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    loop {
        let Some(end) = line(at) else {
            return if b.len() - at > 4096 {
                Err(())
            } else {
                Ok(None)
            };
        };
        let size_part = b[at..end].split(|c| *c == b';').next().unwrap_or(b"");
        let size_part = trim(size_part);
        // RFC 9112 §7.1: `1*HEXDIG`, leading zeros included (nginx and hyper read them too);
        // the value must fit.
        let significant = match size_part.iter().position(|c| *c != b'0') {
            Some(p) => &size_part[p..],
            None => &size_part[size_part.len().saturating_sub(1)..],
        };
        if size_part.is_empty()
            || significant.len() > 15
            || !size_part.iter().all(u8::is_ascii_hexdigit)
        {
            return Err(());
        }
        let size = usize::from_str_radix(std::str::from_utf8(significant).map_err(|_| ())?, 16)
            .map_err(|_| ())?;
        at = end + 2;
        if size == 0 {
            // Trailer fields, then an empty line; a line that is no field line is refused
            // (#50 item 13: a request line pipelined where the final CRLF belongs is one).
            loop {
                let Some(end) = line(at) else {
                    return Ok(None);
                };
                let empty = end == at;
                if !empty && !field_lines(&b[at..end]) {
                    return Err(());
                }
                at = end + 2;
                if empty {
                    return Ok(Some((data, at)));
                }
            }
        }
        if b.len() < at + size + 2 {
            return Ok(None);
        }
        data.extend_from_slice(&b[at..at + size]);
        if &b[at + size..at + size + 2] != b"\r\n" {
            return Err(());
        }
        at += size + 2;
    }
}

/// A token character (RFC 9110 §5.6.2).
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Trailer field lines between two CRLFs (RFC 9112 §5, §7.1.2): each a token, a colon right
/// after it, and a value of visible characters, spaces and tabs (obs-text allowed). No obs-fold
/// (a line that starts with a space has an empty name), no NUL or other control. A lone LF
/// also ends a line (RFC 9112 §2.2), and an empty one ends the fields.
fn field_lines(lines: &[u8]) -> bool {
    for l in lines.split(|b| *b == b'\n') {
        if l.is_empty() {
            return true;
        }
        let Some(colon) = l.iter().position(|b| *b == b':') else {
            return false;
        };
        let (name, value) = (&l[..colon], &l[colon + 1..]);
        if name.is_empty()
            || !name.iter().all(|b| tchar(*b))
            || !value
                .iter()
                .all(|b| *b == b'\t' || (*b >= 0x20 && *b != 0x7f))
        {
            return false;
        }
    }
    true
}

/// The body at the start of `b` under `f`: `Some(Ok((body, len)))`, `Some(Err(()))` refused,
/// `None` incomplete. A close-delimited body is all of `b`.
fn body(f: &Framing, b: &[u8]) -> Option<Result<(Vec<u8>, usize), ()>> {
    match f {
        Framing::None => Some(Ok((Vec::new(), 0))),
        Framing::Length(n) => {
            let n = usize::try_from(*n).ok()?;
            (b.len() >= n).then(|| Ok((b[..n].to_vec(), n)))
        }
        Framing::Chunked => match chunked(b) {
            Ok(Some(x)) => Some(Ok(x)),
            Ok(None) => None,
            Err(()) => Some(Err(())),
        },
        Framing::Close => Some(Ok((b.to_vec(), b.len()))),
        Framing::Invalid => Some(Err(())),
    }
}

fn closes(fields: &[(Vec<u8>, Vec<u8>)], version: u8) -> bool {
    let mut close = version == 0;
    for (n, v) in fields {
        if n.eq_ignore_ascii_case(b"connection") {
            for t in v.split(|b| *b == b',') {
                let t = trim(t);
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && version == 0 {
                    close = false;
                }
            }
        }
    }
    close
}

/// The fields a client's head may have: the front's own bound (`MAX_HEADERS`).
pub const CLIENT_FIELDS: usize = 100;
/// The fields a forwarded head may have: a client's, plus the few the gateway asserts
/// (`X-Forwarded-*`, `Forwarded`, `X-Request-Id`, `X-Forwarded-Client-Cert`). A request of
/// exactly `CLIENT_FIELDS` fields is accepted and forwarded with more than that; whether an
/// upstream takes so many is the upstream's bound, not a framing question.
pub const UPSTREAM_FIELDS: usize = CLIENT_FIELDS + 16;

/// The requests in `s`, as this parser reads them, with at most `max_fields` fields a head.
pub fn parse_requests(s: &[u8], max_fields: usize) -> Parsed {
    let mut p = Parsed::default();
    let mut at = 0;
    while at < s.len() {
        let mut array = [httparse::EMPTY_HEADER; UPSTREAM_FIELDS];
        let headers = &mut array[..max_fields.min(UPSTREAM_FIELDS)];
        let mut req = httparse::Request::new(headers);
        let n = match req.parse(&s[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => break,
            Err(_) => {
                p.refused = true;
                break;
            }
        };
        let fields: Vec<(Vec<u8>, Vec<u8>)> = req
            .headers
            .iter()
            .map(|h| (h.name.as_bytes().to_vec(), h.value.to_vec()))
            .collect();
        let f = framing(&fields, true);
        match body(&f, &s[at + n..]) {
            None => break,
            Some(Err(())) => {
                p.refused = true;
                break;
            }
            Some(Ok((b, len))) => {
                p.msgs.push(Msg {
                    line: (
                        req.method.unwrap_or_default().to_owned(),
                        req.path.unwrap_or_default().to_owned(),
                    ),
                    close: closes(&fields, req.version.unwrap_or(1)),
                    fields,
                    body: b,
                    len: n + len,
                    close_delimited: false,
                });
                at += n + len;
            }
        }
    }
    p.rest = s.len() - at;
    p
}

/// The one response at the start of `s` (1xx heads skipped), for a `HEAD` request or not.
/// The most fields this parser reads in a response head. The gateway reads at most 100 of an
/// upstream's (as hyper's client) and adds its own (`Date` when the upstream sent none, the
/// rate-limit fields, the request id): the client's answer to a head of 100 may hold more, and
/// is no less an answer.
const MAX_RESPONSE_FIELDS: usize = 128;

pub fn parse_response(s: &[u8], head_request: bool) -> Option<Result<Msg, ()>> {
    let mut at = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_FIELDS];
        let mut res = httparse::Response::new(&mut headers);
        let n = match res.parse(&s[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return None,
            Err(_) => return Some(Err(())),
        };
        let status = res.code.unwrap_or(0);
        if !(100..=599).contains(&status) {
            return Some(Err(()));
        }
        if (100..200).contains(&status) && status != 101 {
            at += n;
            continue;
        }
        let fields: Vec<(Vec<u8>, Vec<u8>)> = res
            .headers
            .iter()
            .map(|h| (h.name.as_bytes().to_vec(), h.value.to_vec()))
            .collect();
        let bodiless = head_request || status < 200 || status == 204 || status == 304;
        let f = if bodiless {
            Framing::None
        } else {
            framing(&fields, false)
        };
        let close_delimited = matches!(f, Framing::Close);
        return match body(&f, &s[at + n..])? {
            Err(()) => Some(Err(())),
            Ok((b, len)) => Some(Ok(Msg {
                line: (
                    status.to_string(),
                    res.reason.unwrap_or_default().to_owned(),
                ),
                close: closes(&fields, res.version.unwrap_or(1)),
                fields,
                body: b,
                len: at + n + len,
                close_delimited,
            })),
        };
    }
}

/// The fields a `Connection` field names (lower case), framing fields and `Host` aside.
fn named(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<String> {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
        .flat_map(|(_, v)| v.split(|b| *b == b','))
        .map(|t| lower(trim(t)))
        .filter(|t| {
            !t.is_empty() && !["content-length", "transfer-encoding", "host"].contains(&t.as_str())
        })
        .collect()
}

/// The end-to-end fields of a message: hop-by-hop ones (and those its `Connection` names)
/// removed, and `skip`.
fn end_to_end(fields: &[(Vec<u8>, Vec<u8>)], skip: &[&str]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let named = named(fields);
    fields
        .iter()
        .filter(|(n, _)| {
            let l = lower(n);
            !HOP.contains(&l.as_str()) && !named.contains(&l) && !skip.contains(&l.as_str())
        })
        .cloned()
        .collect()
}

fn values<'f>(fields: &'f [(Vec<u8>, Vec<u8>)], name: &str) -> Vec<&'f [u8]> {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| v.as_slice())
        .collect()
}

fn show(b: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(b))
}

/// The request side: see the module comment.
pub fn check_requests(stream: &[u8], seed: u8) {
    let whole = h1_round_trip_requests(&[stream]);
    let reads = cut(stream, seed, 64);
    let pieces = h1_round_trip_requests(&reads);
    assert_eq!(
        whole.decided, pieces.decided,
        "decided differently in reads"
    );
    // Chunk sizes upstream follow the reads; what they carry does not.
    check_trip(stream, &whole.decided, &whole.upstream);
    check_trip(stream, &pieces.decided, &pieces.upstream);
}

fn check_trip(stream: &[u8], decided: &[H1Decided], upstream: &[u8]) {
    struct Whole<'a> {
        upstream: &'a [u8],
    }
    let whole = Whole { upstream };
    let done = decided.iter().filter(|d| d.complete).count();
    // Only the last request may be cut off.
    assert!(decided.iter().rev().skip(1).all(|d| d.complete));
    let client = parse_requests(stream, CLIENT_FIELDS);
    let up = parse_requests(whole.upstream, UPSTREAM_FIELDS);
    assert_eq!(
        up.msgs.len(),
        done,
        "the upstream reads other requests than decided: {} from {}",
        show(whole.upstream),
        show(stream)
    );
    // Nothing more: what follows the whole requests is the cut-off one, still incomplete.
    if decided.last().is_some_and(|d| !d.complete) {
        assert!(
            up.rest > 0 && !up.refused || decided.last().is_some_and(|d| d.body.is_empty()),
            "a cut-off request reads as whole or refused upstream: {}",
            show(whole.upstream)
        );
    } else {
        assert_eq!(
            up.rest,
            0,
            "bytes after the requests: {}",
            show(whole.upstream)
        );
    }
    for (i, (d, u)) in decided.iter().zip(&up.msgs).enumerate() {
        let c = client.msgs.get(i).unwrap_or_else(|| {
            panic!(
                "request {i} forwarded, but not one this parser reads: {}",
                show(stream)
            )
        });
        assert_eq!(
            (&u.line.0, &u.line.1),
            (&d.method, &d.target),
            "request {i}"
        );
        // A fragment is never sent (RFC 9110 §4.2.5): the target goes without it.
        let sent = c.line.1.split('#').next().unwrap_or_default();
        assert_eq!(
            (c.line.0.as_str(), sent),
            (d.method.as_str(), d.target.as_str()),
            "request {i}"
        );
        assert_eq!(u.body, d.body, "request {i}'s body upstream");
        assert_eq!(c.body, d.body, "request {i}'s body as sent");
        let mine = [
            "content-length",
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "x-consumer",
        ];
        // Names with `_` are never forwarded (README "Headers").
        let mut want = end_to_end(&c.fields, &mine);
        want.retain(|(n, _)| !n.contains(&b'_'));
        let got: Vec<_> = u
            .fields
            .iter()
            .filter(|(n, _)| {
                let l = lower(n);
                !mine.contains(&l.as_str()) && l != "transfer-encoding"
            })
            .cloned()
            .collect();
        assert_eq!(
            got,
            want,
            "request {i}'s end-to-end fields: upstream {} from {}",
            show(whole.upstream),
            show(stream)
        );
        // The gateway's own: one X-Forwarded-For (the client's, unless its Connection names
        // it, then the peer), one X-Forwarded-Proto.
        let hop_xff = named(&c.fields).iter().any(|n| n == "x-forwarded-for");
        let mut xff: Vec<u8> = Vec::new();
        if !hop_xff {
            for v in values(&c.fields, "x-forwarded-for") {
                if std::str::from_utf8(v)
                    .is_ok_and(|s| s.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)))
                {
                    xff.extend_from_slice(v);
                    xff.extend_from_slice(b", ");
                }
            }
        }
        xff.extend_from_slice(H1_ROUND_TRIP_CLIENT.as_bytes());
        assert_eq!(
            values(&u.fields, "x-forwarded-for"),
            vec![xff.as_slice()],
            "request {i}"
        );
        assert_eq!(
            values(&u.fields, "x-forwarded-proto"),
            vec![&b"http"[..]],
            "request {i}"
        );
        // What the gateway asserts is never the client's (#34 item 8): the driver names no
        // host and no consumer, so neither goes upstream, whatever the client sent.
        for asserted in ["x-forwarded-host", "x-consumer"] {
            assert!(
                values(&u.fields, asserted).is_empty(),
                "request {i}: a client's {asserted} went upstream: {}",
                show(whole.upstream)
            );
        }
        if !d.body.is_empty() {
            assert!(
                !values(&u.fields, "content-length").is_empty()
                    || !values(&u.fields, "transfer-encoding").is_empty(),
                "request {i}'s body went upstream without framing"
            );
        }
    }
}

/// The response side: see the module comment.
pub fn check_response(stream: &[u8], seed: u8, head_request: bool) {
    let reads = cut(stream, seed, 64);
    for trip in [
        h1_round_trip_response(&[stream], head_request),
        h1_round_trip_response(&reads, head_request),
    ] {
        let H1ResponseTrip::Relayed {
            client,
            reuse,
            consumed,
        } = trip
        else {
            // A 502 (the upstream connection closed), or an answer cut off: no reuse.
            continue;
        };
        let up = match parse_response(stream, head_request) {
            Some(Ok(m)) => m,
            other => panic!(
                "relayed a response this parser reads as {other:?}: {}",
                show(stream)
            ),
        };
        let got = match parse_response(&client, head_request) {
            Some(Ok(m)) => m,
            other => panic!("the client's answer reads as {other:?}: {}", show(&client)),
        };
        assert_eq!(
            got.len,
            client.len(),
            "bytes after the answer: {}",
            show(&client)
        );
        assert_eq!(got.line, up.line, "status or reason: {}", show(&client));
        assert_eq!(
            got.body,
            up.body,
            "body: {} from {}",
            show(&client),
            show(stream)
        );
        let skip = ["content-length", "date"];
        let want = end_to_end(&up.fields, &skip);
        let mine: Vec<_> = end_to_end(&got.fields, &skip);
        assert_eq!(
            mine,
            want,
            "fields: {} from {}",
            show(&client),
            show(stream)
        );
        let status: u16 = up.line.0.parse().unwrap_or(0);
        if status < 200 || status == 204 || status == 304 {
            assert!(
                values(&got.fields, "content-length").is_empty()
                    && values(&got.fields, "transfer-encoding").is_empty(),
                "framing fields on a {status}: {}",
                show(&client)
            );
        }
        assert!(
            values(&got.fields, "content-length").len() <= 1,
            "{}",
            show(&client)
        );
        if reuse {
            assert!(
                !up.close_delimited && !up.close && up.len == consumed,
                "reused a connection whose message ends elsewhere ({} of {consumed}): {}",
                up.len,
                show(stream)
            );
        }
    }
}

/// An input of the fuzz target (see the module comment).
pub fn check(data: &[u8]) {
    let [mode, seed, stream @ ..] = data else {
        return;
    };
    if mode & 1 == 0 {
        check_requests(stream, *seed);
    } else {
        check_response(stream, *seed, mode & 2 != 0);
    }
}
