//! A limit's subject resolved for one request: the parts' values, hashed into a digest (with a
//! per-thread memo of address networks), and the facts they are read from.

use std::cell::Cell;
use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use crate::config::{OnMissing, Prefixes, SubjectSpec};
use crate::http::head::RequestHead;
use crate::limiter::SubjectDigest;

use super::consumer::Consumer;
use super::fields::{one_cookie, one_header, one_query_value, RepeatedSubject};

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
        route: None,
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
    /// The request's route (`path:NAME` and `host:NAME` parts read its captures).
    pub route: Option<&'a crate::routing::Route>,
    /// The consumer (routes with `consumers = true`).
    pub consumer: Option<&'a Consumer>,
    /// The claims of the request's verified token (routes with `jwt`).
    pub claims: Option<&'a serde_json::Value>,
    /// What the request's JSON body holds at the route's `json:` paths (routes that read it;
    /// `None`: not read, every `json:` part missing).
    pub body: Option<&'a crate::body_cost::json_fields::Fields<'a>>,
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

pub(super) fn hash_network(net: IpNet) -> SubjectDigest {
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
pub(super) fn kind_byte(part: &SubjectSpec) -> u8 {
    match part {
        SubjectSpec::Ip => b'i',
        SubjectSpec::Global => b'g',
        SubjectSpec::Header(_) => b'h',
        SubjectSpec::Query(_) => b'q',
        SubjectSpec::Method => b'M',
        SubjectSpec::Path => b'p',
        SubjectSpec::Host => b'o',
        SubjectSpec::PathCapture(_) => b'P',
        SubjectSpec::HostLabel(_) => b'L',
        SubjectSpec::HostCapture(_) => b'O',
        SubjectSpec::Cookie(_) => b'k',
        SubjectSpec::Consumer => b'u',
        SubjectSpec::Jwt(_) => b'j',
        SubjectSpec::Json(_) => b'b',
        SubjectSpec::Tls(_) => b't',
        SubjectSpec::Compound(_) => b'+',
    }
}

/// One part's value in a request: `None` when the request lacks it.
pub(super) fn part_value<'h>(
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
        SubjectSpec::PathCapture(name) => facts
            .route
            .and_then(|r| r.capture(crate::routing::Capture::Path(name), facts.host, facts.path))
            .filter(|v| !v.is_empty())
            .map(|v| Cow::Borrowed(v.as_bytes())),
        SubjectSpec::HostLabel(n) => facts
            .host
            .and_then(|h| crate::routing::host_label(h, usize::from(*n)))
            .map(|v| Cow::Borrowed(v.as_bytes())),
        SubjectSpec::HostCapture(name) => facts
            .route
            .and_then(|r| r.capture(crate::routing::Capture::Host(name), facts.host, facts.path))
            .map(|v| Cow::Borrowed(v.as_bytes())),
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
