//! `GET /-/explain`: what the gateway would do with a request, charging nothing.
//!
//! `?method=GET&path=/api/x&host=H&ip=1.2.3.4&header.X-Api-Key=K&query.key=K`: the route that
//! matches (or why none does), and for each of its limits the subject derived and the state in
//! the store, read with the store's evaluate path ([`tollgate_limit::store::Store::peek`]): the request
//! pipeline's own phases in evaluate-only mode ([`crate::pipeline::explain`]). `remaining` is what is
//! available now: a next request of cost C, if admitted, reports `remaining − C` in its headers.
//! `ip` is the client address as the gateway would derive it (after `trusted_proxies`);
//! `cert_sha256` the SHA-256 of a client certificate the request's connection would carry (as
//! the consumers file spells it): its consumer (`cert_sha256`) and `tls:fingerprint` parts.
//! On a caching route, a forwarded request's `cache` object says whether it would be a hit
//! ([`crate::cache::peek`]: read only, nothing promoted or fetched); `scheme=https|http` is the
//! key's scheme (default: `https` when the proxy listens with TLS).
//!
//! `?rls_domain=D&descriptor=k=v,k2=v2&descriptor=…&hits_addend=N` asks instead what the rate
//! limit service (`[rls]`) would answer a `ShouldRateLimit` call ([`crate::rls::explain`]): each
//! `descriptor` is one, its entries split on `,` and each on its first `=` (percent-encode a
//! literal `,` or `=` in a value).

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use serde_json::{json, Value};

use super::params;
use crate::http::head::OwnedHead;
use crate::pipeline::{explain as evaluate, ExplainError, ProxyError};
use crate::rls::explain::ExplainError as RlsExplainError;
use crate::rls::message::Call;
use crate::runtime::state::Shared;
use crate::tls::peer::PeerCert;

/// The request an operator asks about: its head (`query.NAME=VALUE` pairs as its query, values
/// still percent-encoded; `host` as its authority) and the client address.
struct Asked {
    head: OwnedHead,
    ip: Option<IpAddr>,
    /// The connection's client certificate, known by its fingerprint alone (`cert_sha256`).
    cert: Option<PeerCert>,
    /// `scheme=https|http` (the cache key's); `None`: `https` when the proxy listens with TLS.
    tls: Option<bool>,
}

fn parse(query: Option<&str>) -> Result<Asked, String> {
    let mut a = Asked {
        head: OwnedHead {
            method: Method::GET,
            version: Version::HTTP_11,
            path: String::new(),
            query: None,
            authority: None,
            headers: HeaderMap::new(),
        },
        ip: None,
        cert: None,
        tls: None,
    };
    let mut q = String::new();
    let mut path = None;
    for p in params(query)? {
        let text =
            || String::from_utf8(p.value.clone()).map_err(|_| format!("{} is not UTF-8", p.name));
        match p.name.as_str() {
            "method" => {
                a.head.method = Method::from_bytes(&p.value)
                    .map_err(|_| format!("invalid method {:?}", text().unwrap_or_default()))?
            }
            "path" => path = Some(text()?),
            "scheme" => {
                a.tls = Some(match text()?.as_str() {
                    "https" => true,
                    "http" => false,
                    other => return Err(format!("invalid scheme {other:?}: http or https")),
                })
            }
            "host" => {
                let h = text()?;
                if crate::routing::route_host(&h).is_none() || h.contains('@') {
                    return Err(format!("invalid host {h:?}"));
                }
                // As a request sends it (routed without its port, keyed with it, as the
                // cache's key is).
                a.head.authority = Some(h);
            }
            "ip" => {
                let ip = text()?;
                a.ip = Some(
                    ip.parse::<IpAddr>()
                        .map_err(|_| format!("invalid ip {ip:?}"))?
                        .to_canonical(),
                );
            }
            "cert_sha256" => {
                let f = text()?;
                let sha256 = crate::consumers::parse_fingerprint(&f).ok_or_else(|| {
                    format!("invalid cert_sha256 {f:?}: 64 hex digits or 32 pairs separated by ':'")
                })?;
                a.cert = Some(PeerCert {
                    fingerprint: crate::hex::encode(&sha256).into_boxed_str(),
                    sha256,
                    subject_cn: None,
                    san_dns: Vec::new(),
                    san_uri: Vec::new(),
                    xfcc: None,
                });
            }
            name => {
                if let Some(h) = name.strip_prefix("header.") {
                    let n = HeaderName::from_bytes(h.as_bytes())
                        .map_err(|_| format!("invalid header name {h:?}"))?;
                    let v = HeaderValue::from_bytes(&p.value)
                        .map_err(|_| format!("invalid value for header {h}"))?;
                    a.head.headers.append(n, v);
                } else if let Some(qname) = name.strip_prefix("query.") {
                    if !q.is_empty() {
                        q.push('&');
                    }
                    q.push_str(qname);
                    q.push('=');
                    q.push_str(p.raw_value);
                } else {
                    return Err(format!(
                        "unknown parameter {name:?}; expected method, path, host, scheme, ip, cert_sha256, header.NAME, query.NAME"
                    ));
                }
            }
        }
    }
    a.head.path = path.ok_or("path is required (e.g. path=/api/x)")?;
    if a.head.authority.is_none() {
        // No host: asked as a request without one (HTTP/1.0), which routes see as any host's.
        a.head.version = Version::HTTP_10;
    }
    a.head.query = (!q.is_empty()).then_some(q);
    Ok(a)
}

fn error(status: StatusCode, message: impl Into<String>) -> (StatusCode, String) {
    (status, json!({ "error": message.into() }).to_string())
}

/// A `ShouldRateLimit` call asked as `rls_domain`, `descriptor` and `hits_addend` parameters.
fn parse_rls(query: Option<&str>) -> Result<Option<Call>, String> {
    let ps = params(query)?;
    if !ps.iter().any(|p| p.name == "rls_domain") {
        return Ok(None);
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| format!("{s:?} is not UTF-8"))
    };
    let (mut domain, mut descriptors, mut hits) = (String::new(), Vec::new(), 0u32);
    for p in &ps {
        match p.name.as_str() {
            "rls_domain" => domain = decode(p.raw_value)?,
            "descriptor" => {
                let mut entries = Vec::new();
                for e in p.raw_value.split(',') {
                    let (k, v) = e
                        .split_once('=')
                        .ok_or_else(|| format!("descriptor entry {e:?} is not key=value"))?;
                    entries.push((decode(k)?, decode(v)?));
                }
                descriptors.push(entries);
            }
            "hits_addend" => {
                hits = decode(p.raw_value)?
                    .parse()
                    .map_err(|_| "hits_addend is not a number".to_owned())?
            }
            name => {
                return Err(format!(
                    "unknown parameter {name:?}; expected rls_domain, descriptor, hits_addend"
                ))
            }
        }
    }
    Ok(Some(crate::rls::explain::request(
        &domain,
        descriptors,
        hits,
    )))
}

/// `/-/explain` of a `ShouldRateLimit` call.
async fn explain_rls(shared: &Shared, call: &Call) -> (StatusCode, String) {
    let snap = shared.snapshot.load_full();
    let Some(domains) = snap.rls.as_deref() else {
        return error(
            StatusCode::BAD_REQUEST,
            "the rate limit service ([rls]) is not configured",
        );
    };
    match crate::rls::explain::explain(domains, &*snap.store, call).await {
        Ok(v) => (StatusCode::OK, v.to_string()),
        Err(e @ RlsExplainError::Invalid(_)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ RlsExplainError::Store(_)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// The status and JSON body of `GET /-/explain?query`.
pub async fn explain(shared: &Shared, query: Option<&str>) -> (StatusCode, String) {
    match parse_rls(query) {
        Ok(Some(call)) => return explain_rls(shared, &call).await,
        Ok(None) => {}
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    }
    let asked = match parse(query) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let snap = shared.snapshot.load_full();
    let tls = asked.tls.unwrap_or(snap.config.server.tls.is_some());
    let now = crate::cache::now(&shared.clock);
    let evaluated =
        match evaluate(&snap, &asked.head, asked.ip, asked.cert.as_ref(), tls, now).await {
            Ok(e) => e,
            Err(e @ ExplainError::Incomplete(_)) => {
                return error(StatusCode::BAD_REQUEST, e.to_string())
            }
            Err(e @ ExplainError::Store(_)) => {
                return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        };
    let client = evaluated.client;
    let limits: Vec<Value> = evaluated
        .limits
        .iter()
        .map(|(c, d, kind)| {
            let l = c.limit;
            // The decision is for a request of cost C: an admitted one reports what is left
            // after it, so what is available now is C more.
            let remaining = if d.allowed {
                d.remaining.saturating_add(l.policy.cost)
            } else {
                d.remaining
            };
            let reset = if d.allowed {
                d.reset_after
            } else {
                d.retry_after
            };
            let mut v = json!({
                "name": &*l.name,
                "algorithm": l.policy.algorithm.as_str(),
                "mode": if l.shadow { "shadow" } else { "enforce" },
                "subject": kind,
                "key": c.subject.short_hex(),
                "limit": d.limit,
                "remaining": remaining,
                "reset_s": reset.div_ceil(1_000_000),
                "would_admit": d.allowed,
            });
            if *kind == "ip" {
                // The network counted (a whole address as itself).
                let net = l.prefixes.network(client);
                v["ip"] = json!(if net.prefix_len() == net.max_prefix_len() {
                    net.addr().to_string()
                } else {
                    net.to_string()
                });
            }
            if let Some(p) = &l.plan {
                v["plan"] = json!(&**p);
            }
            v
        })
        .collect();
    let mut body = json!({
        "route": evaluated.route.map(|r| &*r.name),
        "limits": limits,
        // What the gateway answers itself; null: it forwards the request upstream.
        "status": evaluated.answer.as_ref().map(|a| a.status().as_u16()),
        // The routes tried, in order, up to the one that took the request: which matcher
        // refused each.
        "candidates": evaluated
            .candidates
            .iter()
            .map(|(name, refused)| json!({ "route": &**name, "refused_by": refused }))
            .collect::<Vec<_>>(),
    });
    if let Some(route) = evaluated.route.filter(|_| evaluated.answer.is_none()) {
        // What the cache would do (reading only): a forwarded request on a caching route.
        body["cache"] = match &evaluated.cache {
            None if route.cache.is_none() => json!({ "enabled": false }),
            None => Value::Null,
            Some(p) => {
                let mut c = json!({
                    "enabled": true,
                    "key": p.key,
                    "status": p.status,
                });
                if let (Some(age), Some(ttl), Some(tier)) = (p.age, p.ttl, p.tier) {
                    c["age"] = json!(age);
                    c["ttl"] = json!(i64::try_from(ttl).unwrap_or(i64::MIN));
                    c["tier"] = json!(tier);
                    c["revalidate"] = json!(p.revalidate);
                }
                c
            }
        };
    }
    if let Some(ProxyError::Limited { limit, .. }) = &evaluated.answer {
        body["limit"] = json!(&**limit);
    }
    if let Some(consumer) = evaluated.consumer {
        body["consumer"] = consumer.map_or(Value::Null, |c| json!(&*c.name));
    }
    let reason = match &evaluated.answer {
        None => None,
        Some(ProxyError::NoRoute) => Some(format!(
            "no route matches {} {}{} (the gateway answers 404)",
            asked.head.method,
            asked.head.authority.as_deref().unwrap_or("(any host)"),
            asked.head.path,
        )),
        Some(a) => Some(format!("the gateway answers {}: {a}", a.status().as_u16())),
    };
    let reason = match (reason, evaluated.note) {
        (Some(r), Some(n)) => Some(format!("{r}; {n}")),
        (r, n) => r.or(n.map(str::to_owned)),
    };
    if let Some(r) = reason {
        body["reason"] = json!(r);
    }
    (StatusCode::OK, body.to_string())
}
